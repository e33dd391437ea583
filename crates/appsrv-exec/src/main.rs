//! `appsrv-exec`: a prefork server for a command.
//!
//! ```text
//! appsrv-exec [OPTIONS] -- COMMAND [ARGS...]
//! appsrv-exec -l 127.0.0.1:7010 -- ./echo.sh
//! appsrv-exec -l 127.0.0.1:7011 --mode persistent --codec lines -- ./upper-persistent.py
//! ```
//!
//! Every option of an appsrv server's `run` is there (listeners, the pool, timeouts,
//! access rules, TLS, confinement, logs, the subcommands `start`, `stop`, `status`,
//! `reload`..., the variables `APPSRV_EXEC_*`), and the options below. `--help` lists them.
//!
//! # Connection mode (`--mode connection`, the default)
//!
//! For each connection, the worker that accepted it starts COMMAND, as inetd's `nowait`
//! services and tcpserver do, and relays: what the client sends goes to the command's
//! standard input, what the command writes on its standard output goes to the client. The
//! worker keeps the connection (the command gets pipes, never the socket), so appsrv's
//! limits hold: TLS is terminated by the worker (the command sees plain text), writes to
//! the client keep `--write-timeout` and `--min-send-rate`, the access log counts the bytes,
//! and:
//!
//! - `--read-timeout` (60 s) is an idle limit: the connection ends when neither the client
//!   nor the command sent a byte for that long;
//! - `--command-timeout SECS` (none by default: the idle limit and the client's leaving
//!   end a command that hangs) ends a command that runs longer, however busy;
//! - `--max-output BYTES` (no limit by default) closes the connection once the command has
//!   written that many bytes, with a log line.
//!
//! When the client closes its side, the command's standard input is closed (once it has
//! read what came before). When the command closes its standard output or exits, what it
//! wrote is sent and the connection ends. Then its whole process group is ended: TERM and
//! 200 ms if it still runs, KILL to the group, and the reap of everything in it (the worker
//! is a child subreaper), so that nothing a command started in the background outlives its
//! connection. Its standard error goes to the server's log, one line per line, as a
//! warning naming the worker (in the log line's prefix) and the client.
//!
//! The command's environment is the server's, with the UCSPI-TCP variables tcpserver sets:
//! `PROTO` (`TCP`, or `UNIX` on a Unix-domain listener), `TCPLOCALIP`, `TCPLOCALPORT`,
//! `TCPREMOTEIP`, `TCPREMOTEPORT` (the client a PROXY header names, with `--proxy-protocol`).
//!
//! # Persistent mode (`--mode persistent`)
//!
//! Each worker starts COMMAND once, when it starts, and keeps it, as PHP-FPM keeps its
//! workers warm: a command that loads a runtime or a framework pays for it once, not per
//! request. The worker decodes requests with `--codec`: `lines` (a line, its `\n` or
//! `\r\n` removed; the answer is sent followed by `\n` unless it ends with one),
//! `netstring` (`LEN:BYTES,`) or `length` (a 4-byte big-endian length, then the bytes).
//! Requests are at most `--max-request` bytes (1 MiB). Each is handed to the command, and
//! its answer sent in the same codec.
//!
//! ## The frame protocol
//!
//! Between the worker and the command, on the command's standard input and output:
//!
//! ```text
//! worker → command:  LEN "\n" BYTES       the request: its length in decimal ASCII,
//!                                         a newline, then exactly LEN bytes
//! command → worker:  LEN "\n" BYTES       the answer, the same way
//! ```
//!
//! LEN is one or more ASCII digits (`0` to `9`, no sign, no spaces, at most 20 digits);
//! BYTES are any bytes, newlines included, and nothing ends them but their count. One
//! answer per request, in order, and nothing else on standard output (diagnostics go to
//! standard error, which is logged). A command reads a line, parses the number, reads
//! that many bytes, and writes its answer the same way, flushing it:
//!
//! ```text
//! while read -r len; do
//!     body=$(head -c "$len")
//!     out=$(printf '%s' "$body" | tr a-z A-Z)
//!     printf '%s\n%s' "${#out}" "$out"
//! done
//! ```
//!
//! What fails one request fails only that request's connection, never another client's:
//! the command exits (or closes its output) before answering; no answer within
//! `--request-timeout` (appsrv's option, 60 s by default: the worker measures it itself
//! and answers a little before the master would kill the worker, a quarter of the limit
//! and at most a second earlier); an answer that is malformed, or longer than
//! `--max-output` (1 MiB by default in this mode), or followed by more bytes. That request
//! gets the codec's error reply (`-ERR reason` for lines, `ERR reason` framed for the
//! others), its connection is closed, the command and its process group are ended, and
//! the next request starts a new command. A command found to have exited or to have
//! written unasked between requests is replaced before the next request is written to it.
//! `--max-requests` recycles workers as in any appsrv server, their commands with them.
//!
//! # Both modes
//!
//! The command runs as the worker's user (`--user`; `nobody` when the master runs as
//! root), in a session and process group of its own, with default signal dispositions, an
//! empty signal mask, no descriptor but 0, 1 and 2, the parent-death signal KILL (should
//! its worker be killed), and the limits `--rlimit-cpu SECS` (`RLIMIT_CPU`: SIGXCPU, then
//! KILL a second later) and `--rlimit-nproc N` (`RLIMIT_NPROC`, which counts every process
//! of the user, the workers included, and does not bind root). appsrv's own worker limits,
//! `--rlimit-as`, `--rlimit-nofile` and `--rlimit-core`, are the worker's and so the
//! command's too (limits are inherited). COMMAND is looked up in `PATH` when it has no
//! `/`, and checked at start (`run`, `start` and `check` refuse a command that does not
//! exist or is not executable); a relative path is made absolute there. The command runs
//! in `--chdir DIR`, by default the directory `appsrv-exec` was started in (also under
//! `start`, whose daemon itself changes to `/`), so that `-- ./app.sh data.txt` finds
//! both files. `run`, `start` and `check` refuse a `--chdir` the workers' user cannot
//! enter; when the default one is such a directory (root's home, where the workers run as
//! `nobody`), the command runs in `/`, and they say so.
//!
//! Limits: a command that leaves its process group (`setsid`) escapes the kill at the
//! end; if a worker is killed (past `--grace-period`, or by the master's
//! `--request-timeout` in connection mode), its command gets KILL through the parent-death
//! signal but what that command started in the background does not.

mod command;
mod persistent;
mod relay;

use std::ffi::OsString;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::Duration;

use appsrv::clap;
use appsrv::codec::{LengthPrefixed, Lines, Netstring};

/// How COMMAND serves clients.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A command per connection, relayed to the client (inetd's nowait, tcpserver).
    Connection,
    /// A command per worker, kept, one framed request at a time (PHP-FPM's warm workers).
    Persistent,
}

/// The client's protocol in persistent mode.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum CodecKind {
    /// A request per line.
    Lines,
    /// Netstrings: `LEN:BYTES,`.
    Netstring,
    /// A 4-byte big-endian length, then the bytes.
    Length,
}

// appsrv-exec's own options (no doc comment: clap would make it the subcommands' about).
#[derive(clap::Args, Debug)]
struct Opts {
    /// connection: a command per connection, relayed (inetd's nowait); persistent: a
    /// command per worker, kept, one framed request at a time
    #[arg(long, value_enum, default_value = "connection")]
    mode: Mode,
    /// Persistent mode: the clients' protocol
    #[arg(long, value_enum, default_value = "lines")]
    codec: CodecKind,
    /// Persistent mode: the largest request, in bytes
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    max_request: usize,
    /// Connection mode: end a command (and close its connection) after it ran this long
    /// (0: no limit) [default: 0]
    #[arg(long, value_name = "SECS", default_value = "0", hide_default_value = true)]
    command_timeout: f64,
    /// The command's CPU time limit in seconds (RLIMIT_CPU) [default: inherited]
    #[arg(long, value_name = "SECS")]
    rlimit_cpu: Option<u64>,
    /// The command's limit on its user's processes (RLIMIT_NPROC; counts the workers too)
    /// [default: inherited]
    #[arg(long, value_name = "N")]
    rlimit_nproc: Option<u64>,
    /// The most bytes of output: connection mode, per connection (then it is closed;
    /// default no limit); persistent mode, per answer (default 1 MiB)
    #[arg(long, value_name = "BYTES")]
    max_output: Option<u64>,
    /// The command's working directory [default: the directory appsrv-exec is started in,
    /// also for a daemon (`start`), which itself runs in /; / if the workers' user cannot
    /// enter it]
    #[arg(long, value_name = "DIR")]
    chdir: Option<PathBuf>,
    /// The command and its arguments, after `--`
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// The default `--max-output` of persistent mode: an answer is held whole in memory.
const PERSISTENT_MAX_OUTPUT: usize = 1 << 20;

fn main() {
    serve().unwrap_or_else(|e| e.exit());
}

fn serve() -> appsrv::Result<()> {
    let mut server = appsrv::server!("appsrv-exec")
        .about("Serves a command: one per connection with its input and output relayed to the client, or one per worker answering framed requests");
    let opts: Opts = server.args();
    let serving = matches!(server.subcommand(), Some("run" | "start" | "check"));
    let config = |msg: String| appsrv::Error::Config(msg);
    // The command's directory, absolute: the daemon `start` becomes changes to `/`, and
    // the command must find what it names relatively where the operator started it (issue
    // 41). Checked for the workers' user, as the command will use it.
    // A directory given with --chdir that the workers cannot enter is refused; the default
    // one (where appsrv-exec was started: root's home, a private directory) is replaced by
    // `/`, with a line that says so, so that a command given by its absolute path still
    // starts as it did before the default existed.
    let dir = match (serving, &opts.chdir) {
        (true, Some(d)) => {
            let dir = std::path::absolute(d)
                .map_err(|e| config(format!("the command's working directory: {e}")))?;
            command::check_dir(&dir, server.worker_identity()?.as_ref()).map_err(config)?;
            dir
        }
        (true, None) => {
            let dir = std::env::current_dir()
                .map_err(|e| config(format!("the command's working directory: {e}")))?;
            match command::check_dir(&dir, server.worker_identity()?.as_ref()) {
                Ok(()) => dir,
                Err(why) => {
                    eprintln!("appsrv-exec: note: {why}; the command runs in / instead");
                    PathBuf::from("/")
                }
            }
        }
        (false, _) => PathBuf::from("/"),
    };
    let spec = match opts.command.split_first() {
        Some((program, args)) => command::Spec {
            program: if serving {
                command::resolve(&PathBuf::from(program)).map_err(config)?
            } else {
                PathBuf::from(program)
            },
            args: args.to_vec(),
            dir,
            rlimit_cpu: opts.rlimit_cpu,
            rlimit_nproc: opts.rlimit_nproc,
        },
        None if serving => {
            return Err(config(
                "no command: give it after the options and `--` (appsrv-exec -l 127.0.0.1:7010 -- ./echo.sh)"
                    .into(),
            ));
        }
        None => command::Spec {
            program: PathBuf::new(),
            args: Vec::new(),
            dir,
            rlimit_cpu: None,
            rlimit_nproc: None,
        },
    };
    if !opts.command_timeout.is_finite() || opts.command_timeout < 0.0 {
        return Err(config(format!(
            "--command-timeout {}: expected seconds, 0 or more",
            opts.command_timeout
        )));
    }
    // Under --sandbox the commands run in the workers' sandbox: its profile must let them
    // start (see command::sandbox_profile).
    let server = server.sandbox(command::sandbox_profile(&spec.program));
    match opts.mode {
        Mode::Connection => {
            let limits = relay::Limits {
                command_timeout: (opts.command_timeout > 0.0)
                    .then(|| Duration::from_secs_f64(opts.command_timeout)),
                max_output: opts.max_output,
            };
            server.run(move || {
                command::become_subreaper()?;
                Ok(relay::Relay {
                    spec: spec.clone(),
                    limits: limits.clone(),
                })
            })
        }
        Mode::Persistent => {
            // A request waits for the command, which an event loop must not do.
            if serving && server.io_model() == Some(appsrv::Io::Event) {
                return Err(config(
                    "--mode persistent: a request waits for the command, which blocks the worker: use --io blocking (the default) or --io hybrid, not --io event".into(),
                ));
            }
            let limits = persistent::Limits {
                request_timeout: server.request_timeout(true),
                max_output: opts
                    .max_output
                    .map_or(PERSISTENT_MAX_OUTPUT, |m| m.min(usize::MAX as u64) as usize),
            };
            let max_request = opts.max_request;
            let factory = move || -> Result<persistent::Worker, appsrv::BoxError> {
                command::become_subreaper()?;
                let mut worker = persistent::Worker::new(spec.clone(), limits.clone());
                worker
                    .ensure_started()
                    .map_err(|e| format!("cannot start {}: {e}", spec.program.display()))?;
                Ok(worker)
            };
            let handler = |worker| (worker, max_request);
            match opts.codec {
                CodecKind::Lines => server.run_requests(move || {
                    let (worker, max_request) = handler(factory()?);
                    Ok(persistent::Persistent::<Lines> {
                        worker,
                        max_request,
                        codec: PhantomData,
                    })
                }),
                CodecKind::Netstring => server.run_requests(move || {
                    let (worker, max_request) = handler(factory()?);
                    Ok(persistent::Persistent::<Netstring> {
                        worker,
                        max_request,
                        codec: PhantomData,
                    })
                }),
                CodecKind::Length => server.run_requests(move || {
                    let (worker, max_request) = handler(factory()?);
                    Ok(persistent::Persistent::<LengthPrefixed> {
                        worker,
                        max_request,
                        codec: PhantomData,
                    })
                }),
            }
        }
    }
}

//! The clap definitions of the standard command line: the serving options (`serve_args`,
//! grouped by topic), the subcommands, the environment variables, and parsing.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{BoolishValueParser, PossibleValuesParser, TypedValueParser};
use clap::{Arg, ArgAction, ArgMatches, Command};
use tracing::Level;

use super::config::*;
use super::{Io, LogFormat, PoolKind};
use crate::net::listener::ListenAddr;

/// The variables of the environment that [`parse`] found with the program's prefix but
/// naming no option (see [`unknown_env`]).
static UNKNOWN_ENV: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// The variables set with the program's prefix (`HTTP_HELLO_WORKRS`) that name no option of
/// any subcommand, as the command line was parsed: clap reads only the variables it knows,
/// so a misspelt one would be ignored without a word. `run`, `start` and `check` warn of
/// them.
pub(crate) fn unknown_env_vars() -> &'static [String] {
    UNKNOWN_ENV.get().map_or(&[], Vec::as_slice)
}

/// The names in `vars` that start with `PREFIX_` and are no option's variable in `cmd` or
/// its subcommands, sorted.
fn unknown_env(cmd: &Command, prefix: &str, vars: impl Iterator<Item = (OsString, OsString)>) -> Vec<String> {
    fn known(cmd: &Command, into: &mut std::collections::HashSet<OsString>) {
        into.extend(
            cmd.get_arguments()
                .filter_map(|a| a.get_env().map(ToOwned::to_owned)),
        );
        for sub in cmd.get_subcommands() {
            known(sub, into);
        }
    }
    let mut names = std::collections::HashSet::new();
    known(cmd, &mut names);
    let start = format!("{prefix}_");
    let mut unknown: Vec<String> = vars
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with(&start) && !names.contains(std::ffi::OsStr::new(k)))
        .collect();
    unknown.sort();
    unknown
}

/// The prefix of the environment variables: `http-hello` → `HTTP_HELLO`.
pub(crate) fn env_prefix(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Puts the subcommand first, so that options may come before it or after it
/// (`hello -u nobody check` is `hello check -u nobody`), and spells nginx's and Apache's
/// "test the configuration", `-t`, as the `check` subcommand wherever it stands among the
/// options. Without a subcommand, the command line is `run`'s: the top-level command
/// carries `run`'s options (see [`command`]).
///
/// Why here and not in clap: the top-level command carries `run`'s options and conflicts
/// with its subcommands (`args_conflicts_with_subcommands`), so that `hello -l ADDR` runs;
/// clap then reads `hello -u nobody check` as `run` with a stray `check`. The words are
/// walked as clap would walk them (an option's value is skipped, `--` ends the options):
/// the first word that is not an option or a value is the subcommand, if it names one.
pub(crate) fn with_default_subcommand(cmd: &Command, args: Vec<OsString>) -> Vec<OsString> {
    let mut args = args;
    // Whether the option `word` (`--long`, `--long=V`, `-x`, `-xV`, `-abc`) takes the next
    // word as its value.
    let takes_next = |word: &str| -> bool {
        let arg = if let Some(long) = word.strip_prefix("--") {
            if long.contains('=') {
                return false;
            }
            cmd.get_arguments().find(|a| a.get_long() == Some(long))
        } else {
            // A cluster of short flags: only its last letter may take a value, and only if
            // nothing follows it in the same word (`-w4` has its value).
            let letters: Vec<char> = word[1..].chars().collect();
            let takes = |c: char| {
                cmd.get_arguments()
                    .find(|a| a.get_short() == Some(c))
                    .is_some_and(|a| a.get_action().takes_values())
            };
            match letters.iter().position(|c| takes(*c)) {
                Some(i) => return i + 1 == letters.len(),
                None => None,
            }
        };
        arg.is_some_and(|a| a.get_action().takes_values())
    };
    let mut i = 1;
    let mut check_flag = None;
    while i < args.len() {
        let Some(word) = args[i].to_str() else { break };
        if word == "--" {
            break;
        }
        if word == "-t" {
            check_flag = Some(i);
            i += 1;
            continue;
        }
        if word.starts_with('-') && word.len() > 1 {
            i += if takes_next(word) { 2 } else { 1 };
            continue;
        }
        // The first plain word: the subcommand, if it names one (`-t` beside it is then
        // left for clap to refuse, as any option the subcommand does not take).
        if cmd.find_subcommand(word).is_some() {
            let sub = args.remove(i);
            args.insert(1, sub);
            return args;
        }
        break;
    }
    if let Some(t) = check_flag {
        args.remove(t);
        args.insert(1, "check".into());
    }
    args
}

fn secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(0.0..=31_536_000.0).contains(&v) {
        return Err(format!("{s} is out of range (0 to one year)"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{}", s as u64)
    } else {
        format!("{s}")
    }
}

fn env_opt(prefix: &str, id: &'static str) -> Arg {
    Arg::new(id).long(id).env(env_name(prefix, id))
}

fn pid_file_arg(prefix: &str) -> Arg {
    env_opt(prefix, "pid-file")
        .value_name("PATH")
        .value_parser(clap::value_parser!(PathBuf))
        .help("Pid file, locked while the master runs (default with start: /run/NAME.pid as root, $XDG_RUNTIME_DIR/NAME.pid otherwise; none for a foreground run)")
}

fn grace_arg(prefix: &str, d: &Defaults) -> Arg {
    env_opt(prefix, "grace-period")
        .value_name("SECS")
        .value_parser(secs)
        .default_value(fmt_secs(d.grace_period))
        .help("On stop, how long connections in progress may take to finish before their workers are killed")
}

fn drain_arg(prefix: &str, d: &Defaults) -> Arg {
    env_opt(prefix, "drain-delay")
        .value_name("SECS")
        .value_parser(secs)
        .default_value(fmt_secs(d.drain_delay))
        .help("On stop, how long /readyz answers 503 while the listeners stay open and the workers serve, so that load balancers polling it stop sending, before the graceful stop (0: none; reloads never drain)")
}

fn control_arg(prefix: &str) -> Arg {
    env_opt(prefix, "control")
        .value_name("PATH")
        .value_parser(clap::value_parser!(PathBuf))
        .help("The control socket (status, metrics, workers, stop): opened when this is given or when the server has a pid file (start, --pid-file), then beside it: /run/NAME/ctl.sock for the default pid file as root, $XDG_RUNTIME_DIR/NAME.sock otherwise, PATH.sock for --pid-file PATH.pid")
}

/// An optional number: absent means "leave it as it is".
fn optional_count(prefix: &str, id: &'static str, help: &'static str) -> Arg {
    env_opt(prefix, id)
        .value_name("N")
        .value_parser(clap::value_parser!(u64))
        .help(help)
}

/// An optional path, with its default from code if any.
fn path_arg(prefix: &str, id: &'static str, default: Option<&PathBuf>, help: &'static str) -> Arg {
    let arg = env_opt(prefix, id)
        .value_name("PATH")
        .value_parser(clap::value_parser!(PathBuf))
        .help(help);
    match default {
        Some(p) => arg.default_value(p.as_os_str().to_owned()),
        None => arg,
    }
}

fn count(prefix: &str, id: &'static str, default: usize, help: &'static str) -> Arg {
    env_opt(prefix, id)
        .value_name("N")
        .value_parser(clap::value_parser!(u64))
        .default_value(default.to_string())
        .help(help)
}

/// How a subcommand that talks to a running server names it (issue 34): its pid file or
/// its control socket, each found from the other.
fn target_args(prefix: &str) -> [Arg; 2] {
    [
        env_opt(prefix, "pid-file")
            .value_name("PATH")
            .value_parser(clap::value_parser!(PathBuf))
            .help("The server's pid file, as it was started with (default: start's, /run/NAME.pid as root, $XDG_RUNTIME_DIR/NAME.pid otherwise); its control socket is found beside it"),
        env_opt(prefix, "control")
            .value_name("PATH")
            .value_parser(clap::value_parser!(PathBuf))
            .help("The server's control socket, if it was given one with --control (default: the one beside the pid file: /run/NAME/ctl.sock for the default pid file as root, $XDG_RUNTIME_DIR/NAME.sock otherwise, PATH.sock beside any other PATH.pid)"),
    ]
}

/// The control subcommands: `status`, `health`, `metrics`, `reload`, `upgrade`, `workers`;
/// each names its server as `stop` does.
pub(crate) fn control_commands(prefix: &str) -> Vec<Command> {
    let commands = vec![
        Command::new("status")
            .about("Print the running server's status")
            .long_about("Print the server's status (uptime, totals, one row per worker, the scoreboard line), through the control socket; exit 3 if it is not running")
            .arg(Arg::new("json").long("json").action(ArgAction::SetTrue).help("As JSON")),
        Command::new("health")
            .about("Say whether the running server takes traffic (what /readyz answers)")
            .long_about("Say whether the running server takes traffic, as /readyz does, through the control socket: prints `ready` (exit 0) or `not ready: WHY` (exit 1: starting, stopping, draining for --drain-delay, no live worker); exit 3 if it is not running"),
        Command::new("metrics")
            .about("Print the running server's metrics (Prometheus text or OpenMetrics)")
            .long_about("Print the server's metrics, through the control socket, in the Prometheus text format 0.0.4 or in OpenMetrics 1.0; exit 3 if it is not running")
            .arg(
                env_opt(prefix, "format")
                    .value_name("FORMAT")
                    .value_parser(["prometheus", "openmetrics"])
                    .default_value("prometheus")
                    .help("The exposition format: prometheus (text 0.0.4) or openmetrics (OpenMetrics 1.0, ending with # EOF)"),
            ),
        Command::new("reload")
            .about("Reload: re-read the configuration and replace the workers, dropping nothing")
            .long_about("Re-read the configuration (the application's reload hook) and replace the workers by a new generation, without dropping connections; waits until the new generation serves alone (exit 0), or reports why not (non-zero; the old workers keep serving)")
            .arg(
                Arg::new("timeout")
                    .long("timeout")
                    .value_name("SECS")
                    .value_parser(secs)
                    .default_value("60")
                    .help("How long to wait for the old workers to finish"),
            ),
        Command::new("upgrade")
            .about("Upgrade: replace the running master by the binary now on disk, dropping nothing")
            .long_about("Start the binary now on disk as a new master with the same sockets; once it is ready the old master drains and exits. Waits and reports: exit 0 when the new master serves, non-zero with the reason otherwise (the old master keeps serving)")
            .arg(
                Arg::new("timeout")
                    .long("timeout")
                    .value_name("SECS")
                    .value_parser(secs)
                    .default_value("60")
                    .help("How long to wait for the new master"),
            ),
        Command::new("workers")
            .about("Grow (+N) or shrink (-N) the running server's pool")
            .long_about("Grow (+N) or shrink (-N) the pool: the static size, or min-spare and max-workers of a dynamic pool (as TTIN/TTOU do, one at a time)")
            .arg(
                Arg::new("delta")
                    .value_name("+N|-N")
                    .required(true)
                    .allow_negative_numbers(true)
                    .value_parser(clap::value_parser!(i32).range(-1024..=1024)),
            ),
    ];
    commands
        .into_iter()
        .map(|c| c.args(target_args(prefix)))
        .collect()
}

/// The `run` subcommand with the standard options, defaults from `d`, and environment
/// variables prefixed with `prefix`.
pub(crate) fn run_command(prefix: &str, d: &Defaults) -> Command {
    run_args(Command::new("run"), prefix, d)
        .about("Run the server in the foreground (the default subcommand)")
}

/// `run`'s options: the serving options and `--daemon`.
fn run_args(cmd: Command, prefix: &str, d: &Defaults) -> Command {
    serve_args(cmd, prefix, d).arg(
        env_opt(prefix, "daemon")
            .short('d')
            .action(ArgAction::SetTrue)
            .help_heading(FILES)
            .help("Detach and run as a daemon, as `start` does"),
    )
}

/// The `start` subcommand: `run --daemon`.
pub(crate) fn start_command(prefix: &str, d: &Defaults) -> Command {
    serve_args(Command::new("start"), prefix, d)
        .about("Start the server as a daemon (run --daemon)")
        .long_about("Start the server as a daemon; returns once it is ready, with exit status 0 and one line saying its pid, addresses, pid file, log file and control socket, or non-zero with the reason")
}

/// The `stop` subcommand.
pub(crate) fn stop_command(prefix: &str, _d: &Defaults) -> Command {
    Command::new("stop")
        .about("Stop the daemon and wait until it is gone")
        .long_about("Stop the server named by its pid file (or its control socket) and wait until it is gone (exit 0, also when it was not running). It first asks the server, through its control socket, for the connections and requests in progress and its grace period, says them, and waits that long plus 10 s")
        .args(target_args(prefix))
        .arg(
            Arg::new("now")
                .long("now")
                .action(ArgAction::SetTrue)
                .help("Stop at once: connections in progress are cut (a second stop signal)"),
        )
        .arg(
            Arg::new("timeout")
                .long("timeout")
                .value_name("SECS")
                .value_parser(secs)
                .help("How long to wait for the server to exit (default: its grace period and drain delay, asked from it, plus 10 s)"),
        )
        .arg(
            env_opt(prefix, "grace-period")
                .value_name("SECS")
                .value_parser(secs)
                .help("The server's grace period, if it cannot be asked (no control socket): stop then waits for it, the drain delay and 10 s (default: the program's)"),
        )
        .arg(
            env_opt(prefix, "drain-delay")
                .value_name("SECS")
                .value_parser(secs)
                .help("The server's drain delay, if it cannot be asked (default: the program's)"),
        )
}

/// The heading of the options about the daemon's files and logs.
const FILES: &str = "Logs and files";

/// The serving options of `run`, `start` and `check`, grouped under one heading per topic
/// in `--help`, in this order: listeners, workers and pool, timeouts, access, TLS,
/// confinement, logs and files (the program's own options come first, under "Options").
fn serve_args(cmd: Command, prefix: &str, d: &Defaults) -> Command {
    let timeout_default = |t: Option<Duration>| t.map_or_else(|| "0".to_owned(), fmt_secs);

    let mut listen = env_opt(prefix, "listen")
        .short('l')
        .value_name("ADDR")
        .action(ArgAction::Append)
        .value_delimiter(',')
        .value_parser(|s: &str| s.parse::<ListenAddr>().map_err(|e| e.to_string()))
        .help("Listen on ADDR: HOST:PORT, [IPV6]:PORT or unix:PATH (streams), udp://HOST:PORT or unixgram:PATH (datagrams), with options after '?' (unix:/run/x.sock?mode=0660, HOST:PORT?tls, HOST:PORT?proxy); repeatable, or comma-separated. Port 0 picks a free port");
    // Not `required` when the code sets no default: under socket activation the sockets
    // come from systemd. Without either, `run` stops with a message naming --listen.
    if !d.listen.is_empty() {
        listen = listen.default_values(d.listen.clone());
    }

    cmd
        .next_help_heading("Listeners")
        .arg(listen)
        .arg(
            env_opt(prefix, "backlog")
                .value_name("N")
                .value_parser(clap::value_parser!(u32).range(1..))
                .default_value(d.backlog.to_string())
                .help("Listen backlog of each listener, clamped to net.core.somaxconn"),
        )
        .arg(
            env_opt(prefix, "metrics-listen")
                .value_name("ADDR")
                .help("Serve over HTTP on ADDR (host:port, e.g. 127.0.0.1:9100), from the master: /metrics for Prometheus, /healthz (the master is alive), /readyz (ready to take traffic: 503 while starting, draining or stopping) and /status (a status page for people; /status?json is status --json)"),
        )
        .arg(
            env_opt(prefix, "status-request-detail")
                .action(ArgAction::SetTrue)
                .help("Show the first 64 bytes of each request in progress, as they arrived (headers, cookies, query strings, passwords included), to whoever reads /status, /status?json and status, and in the slow-request and request-timeout log lines; without it they show only the codec's summary (HTTP: the method and the path without the query; RESP: the command name; other codecs, datagrams and handle_client connections: nothing). See docs/SECURITY.md"),
        )
        .next_help_heading("Workers and pool")
        .arg(
            env_opt(prefix, "workers")
                .short('w')
                .value_name("N")
                .value_parser(clap::value_parser!(u32).range(1..=crate::scoreboard::MAX_WORKERS as i64))
                .default_value(d.workers.unwrap_or_else(default_workers).to_string())
                .help("Number of worker processes (default: the number of CPUs, at least 2)"),
        )
        .arg(
            env_opt(prefix, "pool")
                .value_name("POLICY")
                .value_parser(clap::value_parser!(PoolKind))
                .default_value(match d.pool {
                    PoolKind::Static => "static",
                    PoolKind::Dynamic => "dynamic",
                    PoolKind::Ondemand => "ondemand",
                })
                .help("Pool policy: static (--workers), dynamic (--start-workers, --min-spare, --max-spare, --max-workers) or ondemand (--max-workers, --worker-idle-timeout). TTIN/TTOU and `workers +N|-N` change the static size, or min-spare and max-workers"),
        )
        .arg(count(prefix, "start-workers", DEFAULT_START, "Dynamic pool: workers at start"))
        .arg(count(prefix, "min-spare", DEFAULT_MIN_SPARE, "Dynamic pool: below this many idle workers, start more (1, 2, 4 … 32 per round of 50 ms while the shortage lasts)"))
        .arg(count(prefix, "max-spare", DEFAULT_MAX_SPARE, "Dynamic pool: above this many idle workers, retire one per second"))
        .arg(count(prefix, "max-workers", DEFAULT_MAX_WORKERS, "Dynamic and ondemand pools: at most this many workers"))
        .arg(
            env_opt(prefix, "worker-idle-timeout")
                .value_name("SECS")
                .value_parser(secs)
                .default_value(fmt_secs(DEFAULT_WORKER_IDLE))
                .help("Ondemand pool: a worker idle this long leaves"),
        )
        .arg(
            env_opt(prefix, "io")
                .value_name("MODEL")
                .value_parser(clap::value_parser!(Io))
                .default_value(d.io.name())
                .help("Request-level servers: blocking (one connection at a time per worker; the handler may block), event (one epoll loop per worker over up to --worker-connections connections, the handler called inline: it must not block) or hybrid (event loops in --fronts processes hold every connection until it has a whole request, then hand it to an idle blocking worker: the handler may block, and idle or slow clients hold no worker). Async handlers (run_async_requests, run_async): async, their only model and their default (a tokio runtime per worker, each connection a future; event is accepted as its alias). handle_client servers are blocking only (see --max-conns-per-ip). Event and async modes have a static pool of --workers"),
        )
        .arg(count(prefix, "fronts", DEFAULT_FRONTS, "Hybrid mode: front processes, each an event loop over up to --worker-connections connections, that accept, admit and read requests for the workers"))
        .arg(count(prefix, "worker-connections", d.worker_connections, "Event mode: connections per worker at most; a worker stops accepting at this many and resumes below it. The soft RLIMIT_NOFILE is raised to what this needs (up to the hard limit)"))
        .arg(count(prefix, "max-inflight", 0, "Async handlers (run_async_requests, run_async): requests (client level: connections) in the handler at once per worker at most; beyond it the worker reads no new request until some finish, and stops accepting at --worker-connections (0: no limit but --worker-connections)"))
        .arg(count(prefix, "max-requests", 0, "Recycle a worker after this many requests (request-level handlers; 0: never)"))
        .arg(count(prefix, "max-connections", 0, "Recycle a worker after this many connections (0: never)"))
        .arg(count(prefix, "max-jitter", 0, "Add 0 to N (drawn for each worker) to --max-requests and --max-connections, so that workers do not all restart together"))
        .arg(count(prefix, "max-worker-memory", 0, "Recycle a worker whose memory (PSS, MiB, sampled every second) exceeds this; one over twice the limit while it finishes is killed (0: never)"))
        .arg(
            env_opt(prefix, "max-worker-age")
                .value_name("SECS")
                .value_parser(secs)
                .default_value("0")
                .help("Recycle a worker after this long (0: never)"),
        )
        .arg(
            env_opt(prefix, "exec-workers")
                .action(ArgAction::SetTrue)
                .default_value(if d.exec_workers { "true" } else { "false" })
                .help("Each worker is forked, then executes this program again (the binary the master started from, by descriptor): a fresh address-space layout per worker, against brute-forcing a layout across respawns. Costs a few milliseconds per worker start"),
        )
        .next_help_heading("Timeouts")
        .arg(
            env_opt(prefix, "read-timeout")
                .value_name("SECS")
                .value_parser(secs)
                .default_value(timeout_default(d.read_timeout))
                .help("Timeout of each read from a client (0: none); an expired timeout is a TimedOut error in the handler"),
        )
        .arg(
            env_opt(prefix, "write-timeout")
                .value_name("SECS")
                .value_parser(secs)
                .default_value(timeout_default(d.write_timeout))
                .help("Timeout of each write to a client (0: none)"),
        )
        .arg(
            env_opt(prefix, "keepalive-timeout")
                .value_name("SECS")
                .value_parser(secs)
                .default_value(timeout_default(d.keepalive_timeout))
                .help("Request-level servers: how long a connection may stay idle between requests (0: no limit)"),
        )
        .arg(
            env_opt(prefix, "keepalive-requests")
                .value_name("N")
                .value_parser(clap::value_parser!(u32).range(1..))
                .default_value(d.keepalive_requests.to_string())
                .help("Request-level servers: requests per connection, for protocols that can announce a close (HTTP); the last response closes it"),
        )
        .arg(
            env_opt(prefix, "header-timeout")
                .value_name("SECS")
                .value_parser(secs)
                .default_value(timeout_default(d.header_timeout))
                .help("Request-level servers: a request that arrives in pieces must be complete within SECS of its first bytes, plus one second per --min-rate bytes received, up to --header-timeout-max (a slowloris defence, as Apache's mod_reqtimeout; 0: off)"),
        )
        .arg(
            env_opt(prefix, "header-timeout-max")
                .value_name("SECS")
                .value_parser(secs)
                .default_value(timeout_default(d.header_timeout_max))
                .help("Request-level servers: the longest a request may take to arrive from its first bytes, however they are spread: the --min-rate credit stops here (as mod_reqtimeout's header=20-40; 0: no bound)"),
        )
        .arg(count(prefix, "max-buffered-bytes", d.max_buffered_bytes, "Event loops (--io event, hybrid fronts) and async workers: bytes of unfinished requests one process holds in memory; at the budget it stops reading from the connections that hold the most (TCP pushes back on their clients) and answers new requests that need more with the codec's refusal (HTTP 503, Retry-After) (0: no budget)"))
        .arg(count(prefix, "min-rate", d.min_rate, "Request-level servers: bytes per second that earn a slow request one more second (see --header-timeout)"))
        .arg(count(prefix, "min-send-rate", d.min_send_rate, "While a worker waits to write a response, the client must acknowledge at least N bytes per second, over each 10 s window; a slower reader is cut off and the worker serves on (0: no limit)"))
        .arg(
            env_opt(prefix, "request-timeout")
                .value_name("SECS")
                .value_parser(secs)
                .help("Kill a worker whose handler runs longer than this on one request (handle_client: on one connection), with a log line naming the client and the request; async handlers: cancel the call and answer with the codec's error reply (HTTP 504; the client level: close the connection), and kill a worker only when one poll blocks its thread this long [default: 60 for request-level handlers, off for handle_client; 0: off]"),
        )
        .arg(
            env_opt(prefix, "slow-request")
                .value_name("SECS")
                .value_parser(secs)
                .default_value(fmt_secs(d.slow_request.unwrap_or_default()))
                .help("Event mode: log a handler call that holds the loop longer than this (once per episode, with the client, the request and the connections it held up), and count it (0: off)"),
        )
        .arg(grace_arg(prefix, d))
        .arg(drain_arg(prefix, d))
        .arg(
            env_opt(prefix, "start-timeout")
                .value_name("SECS")
                .value_parser(secs)
                .default_value(fmt_secs(DEFAULT_START_TIMEOUT))
                .help("With start: how long to wait for the server to be ready before giving up"),
        )
        .next_help_heading("Access")
        .arg(cidrs(prefix, "allow", &d.allow, "Serve only clients in CIDR (10.0.0.0/8, ::1): repeatable; any allow makes the default deny; per listener too, as ADDR?allow=CIDR"))
        .arg(cidrs(prefix, "deny", &d.deny, "Close at once connections from CIDR (deny wins over allow): repeatable; per listener too, as ADDR?deny=CIDR"))
        .arg(
            env_opt(prefix, "proxy-protocol")
                .action(ArgAction::SetTrue)
                .default_value(if d.proxy_protocol { "true" } else { "false" })
                .help("Connections start with a PROXY protocol (v1 or v2) header from a load balancer: the client's address is the one it names (per listener too, as ADDR?proxy)"),
        )
        .arg(
            cidrs(prefix, "proxy-from", &d.proxy_from, "Accept PROXY headers only from these balancers; others are closed [default: 127.0.0.0/8 and ::1]"),
        )
        .arg(count(prefix, "max-conns-per-ip", d.max_conns_per_ip, "At most N connections from one client address at once, across all workers; more are refused with the codec's error (HTTP 503), or closed by a handle_client server [0: no limit]"))
        .arg(
            env_opt(prefix, "penalty-max")
                .value_name("SECS")
                .value_parser(secs)
                .default_value(fmt_secs(DEFAULT_PENALTY_MAX))
                .help("Failed authentication (a handler's Conn::penalize or Client::penalize): the n-th failure in a row refuses the client's address (an IPv4 address, an IPv6 /64) for 2^(n-1) s, at most SECS, across all workers: its new connections are closed at once, before any byte is read; forgotten after SECS without a failure once its refusal ends. Behind a proxy without a PROXY header every client shares the proxy's address: use ?proxy, or 0 [0: off]"),
        )
        .arg(count(prefix, "max-answers-per-ip", d.max_answers_per_ip, "Datagram listeners: answer at most N datagrams per second from one source network (an IPv4 /24 and an IPv6 /56 by default: --answers-ipv4-prefix, --answers-ipv6-prefix), across all workers; the others are dropped, but one in --answers-slip is answered by the handler's slip (DNS: a truncated answer, so a real client retries over TCP), as DNS response rate limiting does against reflection attacks [0: no limit]"))
        .arg(count(prefix, "answers-slip", 2, "With --max-answers-per-ip: one in N rate-limited datagrams gets the handler's slip answer instead of none [0: never]"))
        .arg(
            env_opt(prefix, "answers-ipv4-prefix")
                .value_name("BITS")
                .value_parser(clap::value_parser!(u8).range(1..=32))
                .default_value(crate::scoreboard::AnswerPrefixes::DEFAULT.v4.to_string())
                .help("With --max-answers-per-ip: IPv4 sources in one network of this prefix length share one budget, as BIND's and NSD's response rate limiting group them (32: each address alone)"),
        )
        .arg(
            env_opt(prefix, "answers-ipv6-prefix")
                .value_name("BITS")
                .value_parser(clap::value_parser!(u8).range(1..=128))
                .default_value(crate::scoreboard::AnswerPrefixes::DEFAULT.v6.to_string())
                .help("With --max-answers-per-ip: IPv6 sources in one network of this prefix length share one budget (56, as BIND and NSD: a site is usually given a /56 or a /48, a host at least a /64)"),
        )
        .arg(
            env_opt(prefix, "max-datagram-size")
                .value_name("BYTES")
                .value_parser(clap::value_parser!(u64).range(1..=65_535))
                .default_value("65507")
                .help("Datagram listeners: the largest datagram accepted; a longer one is dropped and counted (65507: the largest UDP payload)"),
        )
        .next_help_heading("TLS")
        .arg(path_arg(prefix, "tls-cert", d.tls_cert.as_ref(), "TLS listeners (ADDR?tls): the certificate chain, PEM, leaf first; read by the master before it drops privileges, re-read on reload; per listener too, as ADDR?cert=PATH"))
        .arg(path_arg(prefix, "tls-key", d.tls_key.as_ref(), "TLS listeners: the private key (PEM: PKCS#8, PKCS#1 or SEC1) matching --tls-cert; per listener too, as ADDR?key=PATH"))
        .arg(path_arg(prefix, "tls-client-ca", d.tls_client_ca.as_ref(), "TLS listeners: require a client certificate signed by one of these CAs (PEM); the handler sees its subject (Client::tls) [default: no client certificate]; per listener too, as ADDR?client-ca=PATH"))
        .arg(
            env_opt(prefix, "tls-alpn")
                .value_name("PROTOCOLS")
                .action(ArgAction::Append)
                .value_delimiter(',')
                .default_values(d.tls_alpn.clone())
                .help("TLS listeners: ALPN protocols offered, by preference (http/1.1,my-proto); a client that offers only others is refused [default: no ALPN]"),
        )
        .arg(
            env_opt(prefix, "tls-handshake-timeout")
                .value_name("SECS")
                .value_parser(secs)
                .default_value(fmt_secs(d.tls_handshake_timeout))
                .help("TLS listeners: a client must complete its handshake within SECS (0: no limit)"),
        )
        .arg(
            env_opt(prefix, "tls-ticket-lifetime")
                .value_name("SECS")
                .value_parser(clap::value_parser!(u32).range(2..=i64::from(crate::net::tls::MAX_TICKET_LIFETIME)))
                .default_value(d.tls_ticket_lifetime.as_secs().to_string())
                .help("TLS listeners: the longest a session ticket lets a client resume (2 to 604800, 7 days). Every worker changes the ticket key at the same moments, every half of it, and accepts the current and the previous key: a ticket resumes on any worker for between half and all of SECS"),
        )
        .next_help_heading("Confinement")
        .arg(
            env_opt(prefix, "user")
                .short('u')
                .value_name("USER")
                .help("Run workers as USER, with USER's groups (the master must start as root). Started as root without --user, workers run as nobody"),
        )
        .arg(
            env_opt(prefix, "group")
                .short('g')
                .value_name("GROUP")
                .help("Run workers with GROUP as their only group (default: USER's primary and supplementary groups)"),
        )
        .arg(
            env_opt(prefix, "allow-root-workers")
                .action(ArgAction::SetTrue)
                // The builder's default (Server::allow_root_workers) must reach the flag.
                .default_value(if d.allow_root_workers { "true" } else { "false" })
                .help("Let workers keep root privileges when the master runs as root and no --user is given"),
        )
        .arg(path_arg(prefix, "chroot", d.chroot.as_ref(), "Workers chroot to DIR before dropping privileges (the master must be root; users, groups, certificates and log files are resolved and opened before). Paths the handler opens, --sandbox-read/--sandbox-write included, are then inside DIR [default: none]"))
        .arg(optional_count(prefix, "rlimit-nofile", "Workers' limit on open descriptors (RLIMIT_NOFILE, soft and hard) [default: inherited]"))
        .arg(optional_count(prefix, "rlimit-core", "Workers' core file size limit in MiB (RLIMIT_CORE; 0: no core dumps) [default: inherited]"))
        .arg(optional_count(prefix, "rlimit-as", "Workers' address space limit in MiB (RLIMIT_AS): an allocation beyond it fails [default: inherited]"))
        .arg(
            env_opt(prefix, "umask")
                .value_name("MODE")
                .value_parser(|s: &str| {
                    u32::from_str_radix(s, 8)
                        .ok()
                        .filter(|m| *m <= 0o777)
                        .ok_or_else(|| format!("{s:?}: expected octal permissions such as 027"))
                })
                .help("Workers' umask, octal (027) [default: inherited]"),
        )
        .arg(
            env_opt(prefix, "no-new-privs")
                .action(ArgAction::SetTrue)
                .default_value(if d.no_new_privs { "true" } else { "false" })
                .help("Set PR_SET_NO_NEW_PRIVS in workers: nothing they execute can gain privileges (setuid programs, file capabilities) [implied by --sandbox]"),
        )
        .arg(
            env_opt(prefix, "sandbox")
                .action(ArgAction::SetTrue)
                .default_value(if d.sandbox { "true" } else { "false" })
                .help("Confine workers with Landlock (files: only --sandbox-read/--sandbox-write and the program's own allowances) and a seccomp allow-list of system calls (no new sockets, no exec, no fork); see docs/SECURITY.md"),
        )
        .arg(
            env_opt(prefix, "sandbox-read")
                .value_name("PATH")
                .action(ArgAction::Append)
                .value_parser(clap::value_parser!(PathBuf))
                .help("With --sandbox: workers may read beneath PATH (repeatable)"),
        )
        .arg(
            env_opt(prefix, "sandbox-write")
                .value_name("PATH")
                .action(ArgAction::Append)
                .value_parser(clap::value_parser!(PathBuf))
                .help("With --sandbox: workers may read and write beneath PATH (repeatable)"),
        )
        .next_help_heading(FILES)
        .arg(pid_file_arg(prefix))
        .arg(
            env_opt(prefix, "log-file")
                .value_name("PATH")
                .value_parser(clap::value_parser!(PathBuf))
                .help("Write log lines to PATH (also in the foreground); USR1 reopens it (default with start: /var/log/NAME.log as root, $XDG_STATE_HOME/NAME.log otherwise; stderr for a foreground run)"),
        )
        .arg(
            env_opt(prefix, "log-level")
                .value_name("LEVEL")
                .value_parser(PossibleValuesParser::new(["error", "warn", "info", "debug", "trace"]).map(|s| s.parse::<Level>().expect("listed levels parse")))
                .default_value(d.log_level.as_str().to_ascii_lowercase())
                .help("Log level"),
        )
        .arg(
            env_opt(prefix, "log-format")
                .value_name("FORMAT")
                .value_parser(clap::value_parser!(LogFormat))
                .help("Log line format: text (TIME LEVEL NAME[PID] ROLE: MESSAGE), journal (a <N> syslog priority, no timestamp: journald adds its own) or json (one object per line: time, level, pid, role, worker, message, fields) [default: journal when stderr is systemd's journal (JOURNAL_STREAM) and there is no --log-file, text otherwise]"),
        )
        .arg(
            env_opt(prefix, "access-log")
                .value_name("PATH")
                .value_parser(clap::value_parser!(PathBuf))
                .help("Write one line per request (per connection for handle_client, per datagram for datagram listeners) to PATH: time, client, outcome, duration, bytes, request line; buffered by each worker; reopened on USR1 [default: off]"),
        )
        .arg(
            env_opt(prefix, "access-log-sample")
                .value_name("N")
                .value_parser(clap::value_parser!(u64).range(1..))
                .default_value("1")
                .help("Datagram listeners: write one access-log line per N datagrams (each worker counts its own)"),
        )
        .arg(control_arg(prefix))
        .next_help_heading(None)
}

/// The whole command line. The top-level command is `run` (it carries `run`'s options, so
/// that `NAME -l ADDR` runs the server and `NAME --help` shows the subcommands and then
/// `run`'s options, grouped by topic); `app` merges the program's own options into `run`,
/// `start` and `check`. `version` is the application's (`Server::version`); `-V` prints it
/// beside appsrv's.
pub(crate) fn command(
    name: &str,
    about: Option<&str>,
    version: Option<&str>,
    d: &Defaults,
    app: impl Fn(Command) -> Command,
) -> Command {
    let prefix = env_prefix(name);
    let version = match version {
        Some(v) => format!("{v} (appsrv {})", env!("CARGO_PKG_VERSION")),
        None => format!("(appsrv {})", env!("CARGO_PKG_VERSION")),
    };
    let mut cmd = app(run_args(Command::new(name.to_owned()), &prefix, d))
        .version(version)
        .propagate_version(true)
        .args_conflicts_with_subcommands(true)
        .subcommand(app(run_command(&prefix, d)))
        .subcommand(app(start_command(&prefix, d)))
        .subcommand(stop_command(&prefix, d))
        .subcommand(app(serve_args(Command::new("check"), &prefix, d).about(
            "Check the configuration without serving (also -t)",
        ).long_about(
            "Validate the command line, users, pool and the application's configuration without serving (also -t); exit 0 when valid",
        )))
        .subcommands(control_commands(&prefix))
        .subcommand(
            Command::new("completions")
                .about("Print a shell completion script (bash, zsh, fish, elvish, powershell)")
                .long_about("Print a completion script for SHELL on stdout: `NAME completions bash > /etc/bash_completion.d/NAME`, `NAME completions zsh > ~/.zfunc/_NAME`, `NAME completions fish > ~/.config/fish/completions/NAME.fish`")
                .arg(
                    Arg::new("shell")
                        .value_name("SHELL")
                        .required(true)
                        .value_parser(clap::value_parser!(clap_complete::Shell)),
                ),
        )
        .subcommand(
            Command::new("man")
                .about("Print the manual page (roff), or write one per subcommand")
                .long_about("Print the manual page in roff on stdout (`NAME man | man -l -`), or with --dir write NAME.1 and one NAME-SUBCOMMAND.1 per subcommand into DIR")
                .arg(
                    Arg::new("dir")
                        .long("dir")
                        .value_name("DIR")
                        .value_parser(clap::value_parser!(PathBuf))
                        .help("Write the pages into DIR instead"),
                ),
        )
        .after_long_help(
            "Every option can also be set in the environment as shown ([env: ...]); flags take 1/0, \
             true/false, yes/no or on/off there. Signals: TERM, INT or QUIT stop gracefully (a \
             second one, a second later, stops at once); HUP reloads; USR1 reopens the log files; \
             USR2 upgrades.",
        );
    if let Some(about) = about {
        cmd = cmd.about(about.to_owned());
    }
    // `-h` shows the first options and points to the rest (the program's own options are
    // not in the standard set: they always show).
    let standard: std::collections::HashSet<String> = run_args(Command::new("standard"), &prefix, d)
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    let short = |c: Command| {
        c.mut_args(|a| {
            let id = a.get_id().as_str();
            match standard.contains(id) && !SHORT_HELP.contains(&id) {
                true => a.hide_short_help(true),
                false => a,
            }
        })
    };
    cmd = short(cmd)
        .mut_subcommands(|sub| match sub.get_name() {
            "run" | "start" | "check" => short(sub),
            _ => sub,
        })
        .after_help(format!(
            "`-h` shows the first options; `--help` lists them all, grouped (listeners, workers and pool, timeouts, access, TLS, confinement, logs and files), with their defaults and environment variables. `{name} help SUBCOMMAND` shows one subcommand."
        ));
    finish(cmd, &prefix)
}

/// The serving options `-h` shows (`--help` shows them all, grouped by topic): what a
/// first run needs, so that `-h` fits a screen (issue 34). The program's own options are
/// always shown.
const SHORT_HELP: &[&str] = &["listen", "metrics-listen", "workers", "io", "user", "daemon"];

/// What every option of every subcommand gets, the program's own included: an environment
/// variable (`PREFIX_LONG_NAME`) when it has none, flags that
/// read 1/0, yes/no, on/off from the environment (and reject anything else), and values
/// that may look like negative numbers (`--grace-period -1` is then an out-of-range
/// value, not an unknown argument).
fn finish(cmd: Command, prefix: &str) -> Command {
    let prefix = prefix.to_owned();
    cmd.mut_args(|a| standard_arg(a, &prefix))
        .mut_subcommands(|sub| match sub.get_name() {
            // Tools for packaging, not the server's options: `HELLO_DIR` set for some other
            // purpose must not send `hello man`'s page to a directory.
            "completions" | "man" => sub,
            _ => finish(sub, &prefix),
        })
}

fn standard_arg(mut a: Arg, prefix: &str) -> Arg {
    if a.is_positional() {
        return a;
    }
    if a.get_env().is_none() {
        if let Some(var) = a.get_long().map(|long| env_name(prefix, long)) {
            a = a.env(var);
        }
    }
    match a.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse => a.value_parser(BoolishValueParser::new()),
        action if action.takes_values() => a.allow_negative_numbers(true),
        _ => a,
    }
}

/// The environment variable of the option `--long`: `HELLO_GRACE_PERIOD`.
fn env_name(prefix: &str, long: &str) -> String {
    format!("{prefix}_{}", long.to_ascii_uppercase().replace('-', "_"))
}

/// Parses `args` with `cmd` as [`parse`] does, but prints nothing and never exits: for
/// what the server asks of its command line before [`Server::args`](crate::Server::args)
/// or `run` has parsed it (issue 41).
pub(crate) fn try_parse(mut cmd: Command, args: Vec<OsString>) -> Result<ArgMatches, clap::Error> {
    let args = with_default_subcommand(&cmd, args);
    cmd.try_get_matches_from_mut(args)
}

/// Parses `args` with `cmd`: prints help, the version, completions or the manual page and
/// exits when asked for them, and exits with status 2 and a message on a bad command line.
/// A bad value that came from the environment is reported against its variable (clap
/// names the flag only).
pub(crate) fn parse(mut cmd: Command, args: Vec<OsString>) -> ArgMatches {
    let _ = UNKNOWN_ENV.set(unknown_env(
        &cmd,
        &env_prefix(cmd.get_name()),
        std::env::vars_os(),
    ));
    let args = with_default_subcommand(&cmd, args);
    let matches = match cmd.try_get_matches_from_mut(args.clone()) {
        Ok(m) => m,
        Err(e) => from_environment(&cmd, &args, &e)
            .map_or(e, |e| e.format(&mut cmd))
            .exit(),
    };
    match matches.subcommand() {
        Some(("completions", m)) => {
            let shell = *m.get_one::<clap_complete::Shell>("shell").expect("required");
            let name = cmd.get_name().to_owned();
            // Generated in memory: clap_complete panics when its writer fails (a closed
            // pipe), and a command that cannot print has nothing better to do than exit.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, name, &mut script);
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            std::process::exit(0)
        }
        Some(("man", m)) => {
            let written = match m.get_one::<PathBuf>("dir") {
                Some(dir) => clap_mangen::generate_to(cmd, dir),
                None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout()),
            };
            match written {
                Ok(()) => std::process::exit(0),
                // A closed pipe (`| head`) is not a failure.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
                Err(e) => {
                    // Not console's errln!: the command line sits below process/.
                    let _ = std::io::Write::write_fmt(
                        &mut std::io::stderr().lock(),
                        format_args!("error: writing the manual page: {e}\n"),
                    );
                    std::process::exit(1)
                }
            }
        }
        _ => matches,
    }
}

/// The error for a bad value that came from the environment, naming the variable: the
/// option was not on the command line, and its variable is set to a value that holds the
/// bad one.
fn from_environment(cmd: &Command, args: &[OsString], e: &clap::Error) -> Option<clap::Error> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(e.kind(), ErrorKind::ValueValidation | ErrorKind::InvalidValue) {
        return None;
    }
    let text = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    let shown = text(ContextKind::InvalidArg)?;
    let value = text(ContextKind::InvalidValue)?;
    let long = shown.strip_prefix("--")?.split([' ', '=']).next()?.to_owned();
    let arg = std::iter::once(cmd)
        .chain(cmd.get_subcommands())
        .flat_map(Command::get_arguments)
        .find(|a| a.get_long() == Some(long.as_str()))?;
    let var = arg.get_env()?;
    let set = std::env::var_os(var)?;
    let on_command_line = args.iter().skip(1).filter_map(|a| a.to_str()).any(|a| {
        a == format!("--{long}")
            || a.starts_with(&format!("--{long}="))
            || arg.get_short().is_some_and(|c| a.starts_with(&format!("-{c}")))
    });
    if on_command_line || !set.to_string_lossy().contains(value.as_str()) {
        return None;
    }
    let why = match (e.kind(), std::error::Error::source(e)) {
        (ErrorKind::ValueValidation, Some(source)) => source.to_string(),
        _ => match e.get(ContextKind::ValidValue) {
            Some(ContextValue::Strings(v)) => format!("expected one of {}", v.join(", ")),
            _ => "not a valid value".to_owned(),
        },
    };
    Some(clap::Error::raw(
        e.kind(),
        format!(
            "invalid value '{value}' in the environment variable {} (for '{shown}'): {why}",
            var.to_string_lossy()
        ),
    ))
}

/// A repeatable CIDR option; `defaults` (set in code) apply unless the environment or the
/// command line gives any value.
fn cidrs(prefix: &str, id: &'static str, defaults: &[String], help: &'static str) -> Arg {
    env_opt(prefix, id)
        .value_name("CIDR")
        .action(ArgAction::Append)
        .value_delimiter(',')
        .value_parser(|s: &str| s.parse::<crate::net::proxy::Cidr>().map_err(|e| e.to_string()))
        .default_values(defaults.to_vec())
        .help(help)
}

#[cfg(test)]
mod tests {

    /// Issue 22: a misspelt `NAME_OPTION` variable is named, not silently ignored; the
    /// options' variables (of every subcommand) and other programs' are not.
    #[test]
    fn issue_22_unknown_variables_with_the_prefix_are_found() {
        let cmd = command("http-hello", None, None, &Defaults::default(), |c| c);
        let vars = [
            "HTTP_HELLO_WORKERS",
            "HTTP_HELLO_WORKRS",
            "HTTP_HELLO_DRAIN_DELAY",
            "HTTP_HELLO_FORMAT",
            "HTTP_HELLO_",
            "HTTP_HELLOX",
            "OTHER_WORKERS",
        ]
        .map(|k| (OsString::from(k), OsString::from("1")));
        assert_eq!(
            unknown_env(&cmd, "HTTP_HELLO", vars.into_iter()),
            ["HTTP_HELLO_", "HTTP_HELLO_WORKRS"]
        );
    }

    use super::*;

    fn parse(defaults: &Defaults, args: &[&str]) -> Result<Config, clap::Error> {
        let cmd = command("hello", None, None, defaults, |c| c);
        let argv = with_default_subcommand(&cmd, args.iter().map(OsString::from).collect());
        let m = cmd.try_get_matches_from(argv)?;
        Ok(config(m.subcommand_matches("run").unwrap_or(&m)))
    }

    #[test]
    fn run_is_the_default_subcommand() {
        let d = Defaults {
            listen: vec!["127.0.0.1:7000".into()],
            ..Defaults::default()
        };
        let c = parse(&d, &["hello"]).unwrap();
        assert_eq!(c.listeners.listen[0].as_str(), "127.0.0.1:7000");
        assert_eq!(c.listeners.backlog, 511);
        assert_eq!(c.timeouts.grace_period, Duration::from_secs(30));
        assert!(c.pool.workers >= 2);
        let c = parse(
            &d,
            &["hello", "run", "-w", "3", "-l", "unix:/tmp/a", "-l", "[::1]:0"],
        )
        .unwrap();
        assert_eq!(c.pool.workers, 3);
        assert_eq!(c.listeners.listen.len(), 2);
        let c = parse(
            &d,
            &["hello", "-l", "127.0.0.1:1,127.0.0.1:2", "--read-timeout", "0"],
        )
        .unwrap();
        assert_eq!(c.listeners.listen.len(), 2);
        assert_eq!(c.timeouts.read_timeout, None);
        assert!(!c.files.daemon);
        assert!(parse(&d, &["hello", "-d"]).unwrap().files.daemon);
    }

    /// Issue 34: options may come before the subcommand (`hello -u nobody check`), and
    /// `-t` is `check` wherever it stands among the options.
    #[test]
    fn issue_34_options_before_the_subcommand() {
        let cmd = command("hello", None, None, &Defaults::default(), |c| c);
        let order = |args: &[&str]| -> Vec<String> {
            with_default_subcommand(&cmd, args.iter().map(OsString::from).collect())
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect()
        };
        assert_eq!(
            order(&["hello", "-u", "nobody", "check"]),
            ["hello", "check", "-u", "nobody"]
        );
        assert_eq!(
            order(&["hello", "--user=nobody", "-w4", "-l", "check", "start"]),
            ["hello", "start", "--user=nobody", "-w4", "-l", "check"],
            "an option's value that spells a subcommand is a value"
        );
        assert_eq!(
            order(&["hello", "-u", "nobody", "-t"]),
            ["hello", "check", "-u", "nobody"]
        );
        assert_eq!(order(&["hello", "-t", "-w", "2"]), ["hello", "check", "-w", "2"]);
        assert_eq!(
            order(&["hello", "--control", "/x", "status"]),
            ["hello", "status", "--control", "/x"]
        );
        assert_eq!(
            order(&["hello", "-l", "127.0.0.1:0"]),
            ["hello", "-l", "127.0.0.1:0"]
        );
        assert_eq!(order(&["hello", "--", "check"]), ["hello", "--", "check"]);
        // And clap takes the result: `check` with run's options.
        let m = cmd
            .clone()
            .try_get_matches_from(order(&["hello", "-u", "nobody", "-w", "3", "check"]))
            .unwrap();
        let (sub, m) = m.subcommand().unwrap();
        assert_eq!(sub, "check");
        assert_eq!(config(m).pool.workers, 3);
        assert_eq!(config(m).confine.user.as_deref(), Some("nobody"));
    }

    #[test]
    fn code_defaults_show_in_help() {
        let d = Defaults {
            listen: vec!["127.0.0.1:7000".into()],
            workers: Some(5),
            ..Defaults::default()
        };
        let help = command("hello", None, None, &d, |c| c)
            .render_long_help()
            .to_string();
        for needle in [
            "[default: 127.0.0.1:7000]",
            "[default: 5]",
            "[env: HELLO_WORKERS=]",
            "[env: HELLO_LISTEN=]",
            "[default: 511]",
            "[default: 30]",
        ] {
            assert!(help.contains(needle), "missing {needle} in\n{help}");
        }
    }

    #[test]
    fn flags_set_in_code_are_defaults() {
        // Regression: Server::allow_root_workers(true) had no effect on the flag.
        let d = Defaults {
            allow_root_workers: true,
            no_new_privs: true,
            sandbox: true,
            ..Defaults::default()
        };
        let c = parse(&d, &["hello", "-l", "127.0.0.1:0"]).unwrap();
        assert!(c.confine.allow_root_workers && c.confine.no_new_privs && c.confine.sandbox);
        let c = parse(&Defaults::default(), &["hello", "-l", "127.0.0.1:0"]).unwrap();
        assert!(!c.confine.allow_root_workers && !c.confine.no_new_privs && !c.confine.sandbox);
    }

    #[test]
    fn bad_values_are_rejected_with_the_flag_named() {
        let d = Defaults::default();
        let e = parse(&d, &["hello", "-l", "nonsense"]).unwrap_err().to_string();
        assert!(e.contains("--listen") && e.contains("nonsense"), "{e}");
        let e = parse(&d, &["hello", "-l", "127.0.0.1:0", "-w", "0"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--workers"), "{e}");
        // Without a code default, --listen may be absent at parse time (socket activation);
        // `run` then refuses (tests/core.rs).
        assert!(parse(&d, &["hello"]).unwrap().listeners.listen.is_empty());
    }

    /// Issue #8: the access and slow-client settings have builder defaults too, which the
    /// command line replaces (a flag's values replace the code's list, not add to it).
    #[test]
    fn access_settings_from_code_and_the_command_line() {
        let d = Defaults {
            listen: vec!["127.0.0.1:7000".into()],
            allow: vec!["10.0.0.0/8".into(), "::1".into()],
            deny: vec!["10.9.0.0/16".into()],
            proxy_protocol: true,
            proxy_from: vec!["192.0.2.1".into()],
            max_conns_per_ip: 8,
            header_timeout: Some(Duration::from_secs(5)),
            min_rate: 100,
            ..Defaults::default()
        };
        let c = parse(&d, &["hello"]).unwrap();
        assert_eq!(c.access.allow.len(), 2);
        assert_eq!(c.access.deny.len(), 1);
        assert!(c.access.proxy_protocol);
        assert_eq!(c.access.proxy_from, vec!["192.0.2.1".parse().unwrap()]);
        assert_eq!(c.access.max_conns_per_ip, 8);
        assert_eq!(c.timeouts.header_timeout, Some(Duration::from_secs(5)));
        assert_eq!(c.timeouts.min_rate, 100);
        let c = parse(
            &d,
            &[
                "hello",
                "--allow",
                "192.168.0.0/16",
                "--header-timeout",
                "0",
                "--max-conns-per-ip",
                "0",
            ],
        )
        .unwrap();
        assert_eq!(c.access.allow, vec!["192.168.0.0/16".parse().unwrap()]);
        assert_eq!(c.timeouts.header_timeout, None);
        assert_eq!(c.access.max_conns_per_ip, 0);
        // The library's own defaults.
        let c = parse(&Defaults::default(), &["hello"]).unwrap();
        assert!(c.access.allow.is_empty() && c.access.deny.is_empty() && !c.access.proxy_protocol);
        assert_eq!(c.access.proxy_from.len(), 2, "127.0.0.0/8 and ::1");
        assert_eq!(c.timeouts.header_timeout, Some(DEFAULT_HEADER_TIMEOUT));
        assert_eq!(c.timeouts.min_rate, 500);
        // Issue 31: penalties for failed authentication are on, up to 600 s; 0 turns them off.
        assert_eq!(c.access.penalty_max, Some(Duration::from_secs(600)));
        let off = parse(&Defaults::default(), &["hello", "--penalty-max", "0"]).unwrap();
        assert_eq!(off.access.penalty_max, None);
        let short = parse(&Defaults::default(), &["hello", "--penalty-max", "2.5"]).unwrap();
        assert_eq!(short.access.penalty_max, Some(Duration::from_millis(2500)));
        // A bad value set in code is a clear error at start, naming the option.
        let bad = Defaults {
            deny: vec!["10.0.0.1/8".into()],
            ..Defaults::default()
        };
        let e = parse(&bad, &["hello"]).unwrap_err().to_string();
        assert!(e.contains("--deny"), "{e}");
    }

    /// Issue #17: every option of every subcommand has its environment variable (options
    /// added later too: they get one from `finish`), and every option of `run` is under a
    /// topic of `--help`.
    #[test]
    fn every_option_has_a_variable_and_a_topic() {
        let cmd = command("hello", None, None, &Defaults::default(), |c| c);
        let subs = cmd
            .get_subcommands()
            .filter(|s| !["completions", "man"].contains(&s.get_name()));
        for sub in std::iter::once(&cmd).chain(subs) {
            for a in sub.get_arguments().filter(|a| !a.is_positional()) {
                let long = a.get_long().expect("options have a long name");
                assert_eq!(
                    a.get_env().and_then(|e| e.to_str()),
                    Some(env_name("HELLO", long).as_str()),
                    "{} --{long}",
                    sub.get_name()
                );
            }
        }
        for a in cmd.get_arguments() {
            assert!(a.get_help_heading().is_some(), "--{} has no topic", a.get_id());
        }
        assert_eq!(
            cmd.get_arguments()
                .find(|a| a.get_id() == "daemon")
                .and_then(|a| a.get_env()),
            Some(std::ffi::OsStr::new("HELLO_DAEMON"))
        );
    }

    #[test]
    fn env_prefix_follows_the_program_name() {
        assert_eq!(env_prefix("hello"), "HELLO");
        assert_eq!(env_prefix("http-hello"), "HTTP_HELLO");
        assert_eq!(env_prefix("http_hello"), "HTTP_HELLO");
    }
}

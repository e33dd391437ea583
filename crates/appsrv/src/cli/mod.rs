//! The standard command line that every appsrv program gets.
//!
//! ```text
//! PROG [run] [OPTIONS]      run in the foreground (the default subcommand)
//! PROG start [OPTIONS]      run as a daemon (≡ run --daemon); returns once ready
//! PROG stop [--now]         stop the daemon named by the pid file, and wait
//! PROG check [OPTIONS]      check the configuration without serving (also -t)
//! PROG reload | upgrade     replace the workers, or the master's binary, dropping nothing
//! PROG status [--json]      the master's status, through the control socket
//! PROG metrics              Prometheus text, through the control socket
//! PROG workers +N|-N        grow or shrink the pool, through the control socket
//! PROG completions SHELL    a completion script for bash, zsh, fish, elvish, powershell
//! PROG man [--dir DIR]      the manual page(s), in roff
//! PROG help [SUBCOMMAND]    help; also PROG --help, PROG SUBCOMMAND --help
//! PROG -V, --version        the program's version and appsrv's
//! ```
//!
//! `PROG --help` lists the subcommands, then `run`'s options grouped by topic (listeners,
//! workers and pool, timeouts, access, TLS, confinement, logs and files) with each one's
//! default and environment variable; `-h` is the one-line-per-option form.
//!
//! Every option of every subcommand (but `completions` and `man`, tools for packaging), the
//! program's own included, can also come from the environment, as `PROG_OPTION` with the program's name upper-cased and dashes turned
//! into underscores (`HELLO_LISTEN`, `HELLO_WORKERS`, `HELLO_DAEMON=1`); flags take `1`/`0`,
//! `true`/`false`, `yes`/`no` or `on`/`off` there. Precedence: code (the
//! [`Server`](crate::Server) builder) < environment < flags. A bad value from the
//! environment is reported against its variable:
//!
//! ```text
//! $ HELLO_WORKERS=abc hello
//! error: invalid value 'abc' in the environment variable HELLO_WORKERS (for '--workers <N>'): invalid digit found in string
//! ```
//!
//! The files, by role (issue 43): `mod.rs` the option values' types (`Io`, `PoolKind`,
//! `LogFormat`); `args.rs` the clap table (`serve_args` and the subcommands), the
//! environment variables and parsing; `config.rs` the defaults set in code (`Defaults`)
//! and the resolved `Config`, grouped as `--help` groups the options; `check.rs` what a
//! server of each kind accepts (`Accepts`: its options, its I/O model, the checks of
//! `--io` against its handler and the rest of the configuration).

mod args;
mod check;
mod config;

pub(crate) use args::{command, parse, try_parse, unknown_env_vars};
pub(crate) use check::{Accepts, only_accepted};
pub(crate) use config::{Config, DEFAULT_REQUEST_TIMEOUT, Defaults, config};

/// How a server's workers do their I/O (`--io`, [`Server::io`](crate::Server::io)):
/// blocking, event or hybrid for a synchronous request-level handler, async for an async
/// handler; the others (whole connections, datagrams only) have one model each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
#[non_exhaustive]
pub enum Io {
    /// One connection at a time per worker, with blocking reads and writes: the handler
    /// may block (a database call, a command) without delaying anyone else. The default.
    #[default]
    Blocking,
    /// One epoll loop per worker over all its connections (up to
    /// `--worker-connections`), calling the handler inline for each complete request: a
    /// worker per CPU serves thousands of connections, but a handler call that blocks
    /// stalls every connection of its worker (see `--slow-request`). Request-level
    /// handlers only.
    Event,
    /// Event loops in front processes (`--fronts`) accept every connection, admit it and
    /// read it until the codec has a whole request; only then is the connection, with
    /// the bytes read, handed to an idle blocking worker, whose handler may block. After
    /// the response the worker keeps the connection while its next request comes within
    /// 100 ms, then hands it back to the loop. Idle and slow clients cost memory in the
    /// loop, not workers. Request-level handlers without per-connection state
    /// (`type Session = ()`) only; TLS listeners are served by the workers directly, as
    /// in blocking mode (see docs/ARCHITECTURE.md, "Hybrid mode").
    Hybrid,
    /// Async handlers (`Server::run_async_requests`, `Server::run_async`), whose default
    /// and only model it is: each worker runs a tokio runtime on which every connection is
    /// a future, up to `--worker-connections`, so a handler that awaits holds no process.
    /// `event` is accepted for them as its alias; other handlers are refused with it.
    Async,
}

impl Io {
    /// The name `--io` takes.
    pub fn name(self) -> &'static str {
        match self {
            Io::Blocking => "blocking",
            Io::Event => "event",
            Io::Hybrid => "hybrid",
            Io::Async => "async",
        }
    }
}

/// The pool policies of `--pool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PoolKind {
    /// Always `--workers` workers.
    Static,
    /// Between `--min-spare` and `--max-spare` idle workers, at most `--max-workers`.
    Dynamic,
    /// No worker until a client comes; idle workers leave after `--worker-idle-timeout`.
    Ondemand,
}

/// The log line formats of `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// `TIME LEVEL NAME[PID] ROLE: MESSAGE FIELDS`.
    Text,
    /// `<N>NAME[PID] ROLE: MESSAGE FIELDS`: a syslog priority, no timestamp (journald's).
    Journal,
    /// One JSON object per line: time, level, pid, role, worker, message, fields.
    Json,
}

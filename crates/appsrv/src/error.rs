//! The error type of appsrv's public API.
//!
//! Every variant names the resource that failed (an address, a user, a worker) so that the
//! message a user reads on the terminal is enough to act on, without a backtrace.

use std::fmt;
use std::io;

/// The error type for a handler factory: anything that can be turned into a boxed error,
/// so `?` works on `io::Error`, parse errors and the user's own error types alike.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A specialised `Result` for appsrv's public API.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a server could not start, or stopped with an error.
///
/// The `Display` text is meant for people (it names the failing resource and the cause);
/// its exact wording is not part of the stable API. `Debug` prints the same text, so that
/// `fn main() -> appsrv::Result<()>` reports a readable line rather than a struct dump.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A listen address could not be parsed.
    #[error("invalid listen address {addr:?}: {reason}")]
    ListenAddr {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A listening socket could not be created, bound or put into the listening state.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address that failed.
        addr: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// A user or group could not be resolved, or privileges could not be changed.
    #[error("{what}: {reason}")]
    Privilege {
        /// The user, group or operation concerned.
        what: String,
        /// What went wrong.
        reason: String,
    },
    /// The configuration is inconsistent (for example `--group` without `--user`).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A worker failed while the server was starting (its factory returned an error,
    /// it could not drop privileges, or it died before it was ready).
    #[error("worker {pid} failed to start: {reason}")]
    WorkerStart {
        /// The worker's process id.
        pid: i32,
        /// Why it failed, as the worker reported it.
        reason: String,
    },
    /// Another master holds the pid file.
    #[error("{} (pid file {})", if *pid > 0 { format!("already running as pid {pid}") } else { "already starting".to_owned() }, pid_file.display())]
    AlreadyRunning {
        /// The running master's pid (0 if the file was still empty).
        pid: i32,
        /// The pid file.
        pid_file: std::path::PathBuf,
    },
    /// The pid file could not be created, locked or written.
    #[error("pid file {}: {source}", path.display())]
    PidFile {
        /// The pid file.
        path: std::path::PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// The log file could not be opened.
    #[error("log file {}: {source}", path.display())]
    LogFile {
        /// The log file.
        path: std::path::PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// A TLS certificate, key or CA file is unreadable, malformed, expired, or does not
    /// match its counterpart.
    #[error("TLS: {}: {reason}", path.display())]
    Tls {
        /// The file concerned.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The master would have forked while other threads exist (see `docs/ARCHITECTURE.md`).
    #[error("refusing to fork: the process has {threads} threads, the master must have exactly one")]
    Threads {
        /// How many threads were found.
        threads: usize,
    },
    /// A system call the master depends on failed.
    #[error("{op}: {source}")]
    Sys {
        /// The operation that failed.
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Error {
    /// Prints the error on stderr as every other message of the command line is printed
    /// (`error: cannot listen on 127.0.0.1:80: Permission denied`) and exits the process
    /// with status 1, as [`clap::Error::exit`] does for a bad command line:
    /// `server.run(factory).unwrap_or_else(|e| e.exit())`. (A `main` that returns
    /// `appsrv::Result<()>` works too, but Rust's runtime prints `Error: ` instead.)
    pub fn exit(&self) -> ! {
        let _ = std::io::Write::flush(&mut std::io::stdout());
        // Not eprintln!, which panics when stderr is gone (a closed pipe): the exit
        // status says it all then.
        let _ = std::io::Write::write_fmt(&mut std::io::stderr().lock(), format_args!("error: {self}\n"));
        std::process::exit(1)
    }

    pub(crate) fn sys(op: &'static str, source: impl Into<io::Error>) -> Self {
        Error::Sys {
            op,
            source: source.into(),
        }
    }
}

/// The text of a panic's payload (a `&str` or a `String`; anything else is named so).
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}

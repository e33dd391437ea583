//! Log lines: one line per event, with the program name, the pid and the role.
//!
//! ```text
//! 2026-11-30T07:24:17.123456Z  INFO hello[4242] master: listening on 127.0.0.1:7000
//! 2026-11-30T07:24:17.130011Z  WARN hello[4250] worker 1: connection from 127.0.0.1:5555 ended: ...
//! ```
//!
//! Lines go to stderr (the daemon mode points stderr at the log file). Each line is
//! formatted in memory and written with a single `write(2)` on an unbuffered descriptor,
//! so nothing is left in a buffer at fork time and lines of different processes sharing
//! the descriptor never interleave. The subscriber starts no thread; it is installed once in
//! the master and inherited by workers, which only update the pid and role.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::unistd::Gid;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::error::Error;

const MASTER: u32 = u32::MAX;

static NAME: OnceLock<String> = OnceLock::new();
static PID: AtomicU32 = AtomicU32::new(0);
static ROLE: AtomicU32 = AtomicU32::new(MASTER);

/// Installs the global subscriber for `name` at `level`. Later calls (a second `Server` in
/// the same process, as tests do) keep the first subscriber.
pub(crate) fn init(name: &str, level: Level) {
    let _ = NAME.set(name.to_owned());
    set_master();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(LineFormat)
        .finish();
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// Marks this process as the master in its log lines.
pub(crate) fn set_master() {
    PID.store(std::process::id(), Ordering::Relaxed);
    ROLE.store(MASTER, Ordering::Relaxed);
}

/// Marks this process as worker `id` in its log lines; called right after fork.
pub(crate) fn set_worker(id: u32) {
    PID.store(std::process::id(), Ordering::Relaxed);
    ROLE.store(id, Ordering::Relaxed);
}

struct Role(u32);

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            MASTER => f.write_str("master"),
            id => write!(f, "worker {id}"),
        }
    }
}

struct LineFormat;

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        SystemTime.format_time(&mut w)?;
        let level = *event.metadata().level();
        let name = NAME.get().map_or("appsrv", String::as_str);
        write!(
            w,
            " {:>5} {}[{}] {}: ",
            level_str(level),
            name,
            PID.load(Ordering::Relaxed),
            Role(ROLE.load(Ordering::Relaxed))
        )?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

fn level_str(level: Level) -> &'static str {
    match level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "TRACE",
    }
}

/// Opens (creating it if needed) the log file for appending. When workers run as another
/// user, the file's group becomes theirs and gets write permission, so that workers can
/// reopen it after a rotation (nginx gives the file to the worker user; this gives less).
pub(crate) fn open_log(path: &Path, worker_gid: Option<Gid>) -> Result<File, Error> {
    let err = |source: io::Error| Error::LogFile {
        path: path.to_owned(),
        source,
    };
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(err)?;
    if let Some(gid) = worker_gid {
        nix::unistd::fchown(&file, None, Some(gid)).map_err(|e| err(e.into()))?;
        let mode = file.metadata().map_err(err)?.permissions().mode() & 0o7777;
        if mode & 0o020 == 0 {
            file.set_permissions(std::fs::Permissions::from_mode(mode | 0o020))
                .map_err(err)?;
        }
    }
    Ok(file)
}

/// Points stderr (where log lines go) at `file`.
pub(crate) fn redirect_stderr(file: &File) -> io::Result<()> {
    nix::unistd::dup2_stderr(file).map_err(io::Error::from)
}

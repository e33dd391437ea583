//! Log lines: one line per event, with the program name, the pid and the role, in one of
//! three formats (`--log-format`).
//!
//! `text` (the default):
//!
//! ```text
//! 2026-11-30T07:24:17.123456Z  INFO hello[4242] master: listening on 127.0.0.1:7000
//! 2026-11-30T07:24:17.130011Z  WARN hello[4250] worker 1: connection from 127.0.0.1:5555 ended: ...
//! ```
//!
//! `journal` (the default when stderr is systemd's journal stream: `JOURNAL_STREAM` names
//! stderr's device and inode, as systemd.exec(5) describes): each line starts with its
//! syslog priority as sd-daemon(3) defines the prefix (`<3>` error, `<4>` warn, `<6>`
//! info, `<7>` debug and trace), and has no timestamp (journald adds its own):
//!
//! ```text
//! <6>hello[4242] master: listening on 127.0.0.1:7000
//! ```
//!
//! `json`: one JSON object per line, for log shippers; `worker` only in a worker's lines,
//! `fields` always (the event's structured fields, maybe none):
//!
//! ```text
//! {"time":"2026-11-30T07:24:17.123456Z","level":"INFO","pid":4242,"role":"master","message":"ready","fields":{"pool":"static","workers":4}}
//! {"time":"2026-11-30T07:24:17.130011Z","level":"WARN","pid":4250,"role":"worker","worker":1,"message":"connection from ...","fields":{}}
//! ```
//!
//! Lines go to stderr (the daemon mode points stderr at the log file). Each line is
//! formatted in memory and written with a single `write(2)` on an unbuffered descriptor,
//! so nothing is left in a buffer at fork time and lines of different processes sharing
//! the descriptor never interleave. The subscriber starts no thread; it is installed once in
//! the master and inherited by workers, which only update the pid and role.
//!
//! The log files (`--log-file`, `--access-log`) are the master's: created mode 0640, owned
//! by the master's user, writable by nobody else (see [`open_log`]). Workers never open
//! them; after USR1 the master hands them the reopened files (`process/reopen.rs`).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::error::Error;

const MASTER: u32 = u32::MAX;
/// Marks the role of a worker's privileged helper (`worker N helper`).
const HELPER: u32 = 1 << 31;
/// Marks the role of a hybrid front (`front N`).
const FRONT: u32 = 1 << 30;

static NAME: OnceLock<String> = OnceLock::new();
static PID: AtomicU32 = AtomicU32::new(0);
static ROLE: AtomicU32 = AtomicU32::new(MASTER);

/// The shape of a log line (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Timestamp, level, `name[pid] role: message fields`.
    Text,
    /// `<N>` syslog priority, then `name[pid] role: message fields`; no timestamp.
    Journal,
    /// One JSON object per line.
    Json,
}

impl Format {
    /// The format when none is asked for: `journal` when the lines go to stderr
    /// (`to_stderr`: no log file) and stderr is systemd's journal stream, `text` otherwise.
    pub(crate) fn detect(to_stderr: bool) -> Format {
        let stream = std::env::var("JOURNAL_STREAM").ok();
        match stream.as_deref().and_then(parse_journal_stream) {
            Some(id) if to_stderr && stderr_id() == Some(id) => Format::Journal,
            _ => Format::Text,
        }
    }
}

/// `JOURNAL_STREAM`'s `DEVICE:INODE` (both decimal, as systemd.exec(5) sets it).
fn parse_journal_stream(value: &str) -> Option<(u64, u64)> {
    let (dev, ino) = value.split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

/// Stderr's device and inode: systemd sets `JOURNAL_STREAM` for the stream it connected,
/// and a program whose stderr was redirected since (to a file, by a shell) still inherits
/// the variable, so the two are compared (sd_journal_stream_fd(3)).
fn stderr_id() -> Option<(u64, u64)> {
    let st = nix::sys::stat::fstat(std::io::stderr()).ok()?;
    Some((st.st_dev as u64, st.st_ino as u64))
}

/// Installs the global subscriber for `name` at `level`, writing lines in `format`. Later
/// calls (a second `Server` in the same process, as tests do) keep the first subscriber.
pub(crate) fn init(name: &str, level: Level, format: Format) {
    let _ = NAME.set(name.to_owned());
    set_master();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(LineFormat(format))
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

/// Marks this process as the privileged helper of worker `id`; called right after its fork.
pub(crate) fn set_helper(id: u32) {
    PID.store(std::process::id(), Ordering::Relaxed);
    ROLE.store(id | HELPER, Ordering::Relaxed);
}

/// Marks this process as hybrid front `id` (`--io hybrid`); called right after fork.
pub(crate) fn set_front(id: u32) {
    PID.store(std::process::id(), Ordering::Relaxed);
    ROLE.store(id | FRONT, Ordering::Relaxed);
}

struct Role(u32);

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            MASTER => f.write_str("master"),
            id if id & HELPER != 0 => write!(f, "worker {} helper", id & !HELPER),
            id if id & FRONT != 0 => write!(f, "front {}", id & !FRONT),
            id => write!(f, "worker {id}"),
        }
    }
}

struct LineFormat(Format);

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let level = *event.metadata().level();
        let name = NAME.get().map_or("appsrv", String::as_str);
        let pid = PID.load(Ordering::Relaxed);
        let role = ROLE.load(Ordering::Relaxed);
        match self.0 {
            Format::Text => {
                SystemTime.format_time(&mut w)?;
                write!(w, " {:>5} {name}[{pid}] {}: ", level_str(level), Role(role))?;
            }
            Format::Journal => write!(w, "<{}>{name}[{pid}] {}: ", priority(level), Role(role))?,
            Format::Json => return json_line(&mut w, level, pid, role, event),
        }
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// The syslog priority of `level`, as sd-daemon(3)'s `SD_ERR` … `SD_DEBUG`.
fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// One event as one JSON object on one line.
fn json_line(w: &mut Writer<'_>, level: Level, pid: u32, role: u32, event: &Event<'_>) -> fmt::Result {
    let mut time = String::new();
    SystemTime.format_time(&mut Writer::new(&mut time))?;
    let mut fields = JsonFields::default();
    event.record(&mut fields);
    // Written key by key, in the documented order (a `serde_json::Map` sorts its keys);
    // serde_json escapes each value, newlines included, so the object stays on one line.
    let json = |v: &serde_json::Value| serde_json::to_string(v).map_err(|_| fmt::Error);
    write!(
        w,
        "{{\"time\":{},\"level\":\"{}\",\"pid\":{pid},",
        json(&time.into())?,
        level_str(level)
    )?;
    match role {
        MASTER => write!(w, "\"role\":\"master\",")?,
        id if id & HELPER != 0 => write!(w, "\"role\":\"helper\",\"worker\":{},", id & !HELPER)?,
        id => write!(w, "\"role\":\"worker\",\"worker\":{id},")?,
    }
    writeln!(
        w,
        "\"message\":{},\"fields\":{}}}",
        json(&fields.message.unwrap_or_default().into())?,
        json(&serde_json::Value::Object(fields.fields))?
    )
}

/// An event's `message` and its other fields, as JSON values.
#[derive(Default)]
struct JsonFields {
    message: Option<String>,
    fields: serde_json::Map<String, serde_json::Value>,
}

impl JsonFields {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        self.fields.insert(field.name().to_owned(), value);
    }
}

impl Visit for JsonFields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        match field.name() {
            "message" => self.message = Some(text),
            _ => self.put(field, text.into()),
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = Some(value.to_owned()),
            _ => self.put(field, value.into()),
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
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

/// Opens (creating it if needed) a log file of the master's (`--log-file`, `--access-log`)
/// for appending: created with mode 0640 and the master's user and group, and kept
/// writable by nobody but that user. An existing regular file loses any write permission
/// of its group and of others (an older appsrv, or a `logrotate` `create 0660` line, gave
/// the workers' group write access); one that belongs to another user is refused, as that
/// user could write into it. Other kinds of files (`/dev/null`, a pipe) are opened as they
/// are. Workers never open these files: the master hands them its descriptors.
pub(crate) fn open_log(path: &Path) -> Result<File, Error> {
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
    let meta = file.metadata().map_err(err)?;
    if !meta.file_type().is_file() {
        return Ok(file);
    }
    let me = nix::unistd::Uid::effective().as_raw();
    if meta.uid() != me {
        return Err(err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the file belongs to uid {}, not to this server's uid {me}, so that user can write \
                 into it; give it to uid {me} (chown) or remove it",
                meta.uid()
            ),
        )));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(mode & !0o022))
            .map_err(err)?;
    }
    Ok(file)
}

/// Points stderr (where log lines go) at `file`.
pub(crate) fn redirect_stderr(file: impl std::os::fd::AsFd) -> io::Result<()> {
    nix::unistd::dup2_stderr(file).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_priorities_are_sd_daemons() {
        assert_eq!(priority(Level::ERROR), 3);
        assert_eq!(priority(Level::WARN), 4);
        assert_eq!(priority(Level::INFO), 6);
        assert_eq!(priority(Level::DEBUG), 7);
        assert_eq!(priority(Level::TRACE), 7);
    }

    #[test]
    fn journal_stream_is_device_colon_inode() {
        assert_eq!(parse_journal_stream("8:12345"), Some((8, 12345)));
        assert_eq!(parse_journal_stream("8"), None);
        assert_eq!(parse_journal_stream("a:1"), None);
        assert_eq!(parse_journal_stream(""), None);
    }

    #[test]
    fn a_log_file_is_created_0640_and_loses_group_write() {
        let dir = std::env::temp_dir().join(format!("appsrv-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.log");
        let _ = std::fs::remove_file(&path);
        drop(open_log(&path).unwrap());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        // 0640 less the umask (the tests' umask is not changed: it is the process's).
        assert_eq!(mode(&path) & !0o640, 0, "{:o}", mode(&path));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        drop(open_log(&path).unwrap());
        assert_eq!(mode(&path), 0o644, "group and others lose write access");
        drop(open_log(Path::new("/dev/null")).unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

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
//! {"time":"2026-11-30T07:24:17.123456Z","level":"INFO","pid":4242,"role":"master","message":"ready","fields":{"io":"blocking","pool":"static","workers":4}}
//! {"time":"2026-11-30T07:24:17.130011Z","level":"WARN","pid":4250,"role":"worker","worker":1,"message":"connection from ...","fields":{}}
//! ```
//!
//! Lines go to stderr (the daemon mode points stderr at the log file). Each line is
//! formatted in memory and written with a single `write(2)` on an unbuffered descriptor,
//! so nothing is left in a buffer at fork time and lines of different processes sharing
//! the descriptor never interleave. The subscriber starts no thread; it is installed once in
//! the master and inherited by workers, which only update the pid and role.
//!
//! **A line that cannot be written is dropped, never fatal** (issue 31). A full disk, a
//! stderr pipe whose reader went away (`EPIPE`: a journald restart, a closed terminal) or
//! `EIO` used to end the process: tracing-subscriber reports a failed write with
//! `eprintln!`, which panics when stderr itself is what failed, and the master died of
//! its first log line. Now the writer ([`LineWriter`]) never reports a failure to the
//! subscriber: it counts the line in [`LostLines`] (per process role and per log, in the
//! scoreboard once the master has made it: `appsrv_log_lines_dropped_total`), tries one
//! warning line a minute at most (which gets through if the disk has room for a short line
//! again, and costs nothing if not), and after the first line that is written again, writes
//! one line that says how many were lost since when. The access log
//! (`worker/access.rs`) keeps the same account for its own lines, and its warnings go to
//! this log. Nothing in the crate prints with `print!`/`eprint!` (whose failure panics):
//! `tests/logs.rs` greps for them.
//!
//! The log files (`--log-file`, `--access-log`) are the master's: created mode 0640, owned
//! by the master's user, writable by nobody else (see [`open_log`]). Workers never open
//! them; after USR1 the master hands them the reopened files (`process/reopen.rs`).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
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
    let _ = FORMAT.set(format);
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(LineWriter)
        .with_ansi(false)
        // The writer never fails (it counts what it drops), so this is only a second guard:
        // tracing-subscriber reports a failed write with `eprintln!`, which panics when
        // stderr is what failed.
        .log_internal_errors(false)
        .event_format(LineFormat(format))
        .finish();
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The format [`init`] installed (for the lines [`LineWriter`] writes itself).
static FORMAT: OnceLock<Format> = OnceLock::new();

/// A log of the server's, for the count of lines lost ([`count_dropped_in`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Log {
    /// The error log (stderr, `--log-file`).
    Error = 0,
    /// The access log (`--access-log`).
    Access = 1,
}

/// Log lines dropped, by process role (master, worker, front, helper: [`DROP_ROLES`]) and
/// by log ([`Log`]); lives in the scoreboard so that the master can report every process's.
pub(crate) type DropTable = [[AtomicU64; 2]; 4];

/// The role names of [`DropTable`]'s rows, in order (the metric's `role` label).
pub(crate) const DROP_ROLES: [&str; 4] = ["master", "worker", "front", "helper"];

/// The table lines are counted in before [`count_dropped_in`] (a line lost during start-up,
/// before the master has made the scoreboard), and in a process that never calls it.
static LOCAL_DROPS: DropTable = [const { [const { AtomicU64::new(0) }; 2] }; 4];
/// The table of [`count_dropped_in`], once named.
static DROPS: OnceLock<&'static DropTable> = OnceLock::new();

/// Counts the lines this process (and every process it forks afterwards) drops in `table`,
/// shared memory of the master's; what was counted before is carried over. Once per
/// process (the master at start, a re-executed worker when it maps the scoreboard): a
/// different table later is refused, and said.
pub(crate) fn count_dropped_in(table: &'static DropTable) {
    match DROPS.set(table) {
        Ok(()) => {
            for (row, old_row) in table.iter().zip(&LOCAL_DROPS) {
                for (n, old_n) in row.iter().zip(old_row) {
                    n.fetch_add(old_n.swap(0, Ordering::Relaxed), Ordering::Relaxed);
                }
            }
        }
        Err(_) if std::ptr::eq(drops(), table) => {}
        Err(_) => tracing::error!("a second table of dropped log lines; this process counts in its first"),
    }
}

fn drops() -> &'static DropTable {
    DROPS.get().copied().unwrap_or(&LOCAL_DROPS)
}

/// Counts `n` lines of `log` dropped by this process, in its role's row.
pub(crate) fn count_dropped(log: Log, n: u64) {
    let row = Kind::of(ROLE.load(Ordering::Relaxed)).row();
    drops()[row][log as usize].fetch_add(n, Ordering::Relaxed);
}

/// The lines of one log that could not be written: the episode's count, when it began, and
/// when a warning was last tried, so that a log that fails for an hour costs one warning a
/// minute, and the first line written again says what was lost. One per log per process.
#[derive(Debug)]
pub(crate) struct LostLines {
    log: Log,
    /// Lines lost since the last line written.
    pending: AtomicU64,
    /// The first error of the episode (its errno; 0: none known).
    errno: AtomicI32,
    /// When the episode began (seconds since the epoch; 0: no episode).
    since: AtomicU64,
    /// When a warning was last tried (monotonic seconds, plus one: 0 is never).
    warned: AtomicU64,
}

/// How often a log that keeps failing is warned about.
pub(crate) const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl LostLines {
    /// An empty account for `log`.
    pub(crate) const fn new(log: Log) -> Self {
        LostLines {
            log,
            pending: AtomicU64::new(0),
            errno: AtomicI32::new(0),
            since: AtomicU64::new(0),
            warned: AtomicU64::new(0),
        }
    }

    /// Counts `lines` lines lost to `err`. Returns whether a warning is due (the first of
    /// an episode, then one per [`WARN_EVERY`] at most): the caller writes it where it can.
    pub(crate) fn lost(&self, lines: u64, err: &io::Error) -> bool {
        count_dropped(self.log, lines);
        self.pending.fetch_add(lines, Ordering::Relaxed);
        let _ = self
            .since
            .compare_exchange(0, unix_now(), Ordering::Relaxed, Ordering::Relaxed);
        let _ = self.errno.compare_exchange(
            0,
            err.raw_os_error().unwrap_or(0),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        let now = monotonic_secs() + 1;
        let last = self.warned.load(Ordering::Relaxed);
        (last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_secs())
            && self
                .warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Lines lost so far in this episode.
    pub(crate) fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    /// After a line was written: ends the episode, if there was one, and returns the line
    /// that reports it (`N log lines were dropped since TIME: ERROR`).
    pub(crate) fn recovered(&self) -> Option<String> {
        let n = self.pending.swap(0, Ordering::Relaxed);
        if n == 0 {
            return None;
        }
        let since = self.since.swap(0, Ordering::Relaxed);
        let errno = self.errno.swap(0, Ordering::Relaxed);
        self.warned.store(0, Ordering::Relaxed);
        Some(format!(
            "{} writable again: {n} line(s) could not be written since {} ({}) and were dropped",
            self.name(),
            format_utc(since),
            describe(errno)
        ))
    }

    /// The warning while lines are lost.
    pub(crate) fn warning(&self, err: &io::Error) -> String {
        format!(
            "{}: {err}; dropping lines until it can be written again ({} so far; the \
             count is appsrv_log_lines_dropped_total)",
            self.name(),
            self.pending()
        )
    }

    fn name(&self) -> &'static str {
        match self.log {
            Log::Error => "log",
            Log::Access => "access log",
        }
    }
}

fn describe(errno: i32) -> String {
    match errno {
        0 => "error unknown".to_owned(),
        e => io::Error::from_raw_os_error(e).to_string(),
    }
}

fn monotonic_secs() -> u64 {
    crate::sys::monotonic_ns() / 1_000_000_000
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `2026-11-30T08:30:00Z` (UTC, to the second) from seconds since the epoch.
pub(crate) fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// The error log's account of lines lost.
static ERROR_LOG: LostLines = LostLines::new(Log::Error);

/// Writes each formatted line to stderr with one `write(2)` (the loop only continues a
/// short write) and never reports a failure to the subscriber: a line that cannot be
/// written is counted and dropped (see the module's header).
#[derive(Debug, Clone, Copy)]
struct LineWriter;

impl<'a> MakeWriter<'a> for LineWriter {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter
    }
}

impl io::Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        write_line(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes one line of the error log, or counts it lost.
fn write_line(line: &[u8]) {
    // std's stderr is unbuffered: `write_all` is one write(2) unless it comes back short
    // or interrupted.
    match io::stderr().write_all(line) {
        Ok(()) => {
            if let Some(report) = ERROR_LOG.recovered() {
                let _ = io::stderr().write_all(own_line(Level::WARN, &report).as_bytes());
            }
        }
        Err(e) => {
            if ERROR_LOG.lost(1, &e) {
                let warning = own_line(Level::WARN, &ERROR_LOG.warning(&e));
                let _ = io::stderr().write_all(warning.as_bytes());
            }
        }
    }
}

/// A line of the log's own (a warning about the log), in the installed format, with no
/// fields: the subscriber cannot be asked for it from inside its writer.
fn own_line(level: Level, message: &str) -> String {
    let mut line = String::new();
    let mut w = Writer::new(&mut line);
    let pid = PID.load(Ordering::Relaxed);
    let role = ROLE.load(Ordering::Relaxed);
    let _ = match FORMAT.get().copied().unwrap_or(Format::Text) {
        Format::Json => json_head(&mut w, level, pid, role).and_then(|()| {
            let msg = serde_json::to_string(message).map_err(|_| fmt::Error)?;
            writeln!(w, "\"message\":{msg},\"fields\":{{}}}}")
        }),
        format => prefix(&mut w, format, level, pid, role).and_then(|()| writeln!(w, "{message}")),
    };
    line
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

/// A process's role as [`ROLE`] holds it: the master, or a worker, front or helper with its
/// worker number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Master,
    Worker(u32),
    Front(u32),
    Helper(u32),
}

impl Kind {
    fn of(role: u32) -> Kind {
        match role {
            MASTER => Kind::Master,
            id if id & HELPER != 0 => Kind::Helper(id & !HELPER),
            id if id & FRONT != 0 => Kind::Front(id & !FRONT),
            id => Kind::Worker(id),
        }
    }

    /// Its row of [`DropTable`] (and [`DROP_ROLES`]' name).
    fn row(self) -> usize {
        match self {
            Kind::Master => 0,
            Kind::Worker(_) => 1,
            Kind::Front(_) => 2,
            Kind::Helper(_) => 3,
        }
    }

    /// The worker number, for all but the master.
    fn worker(self) -> Option<u32> {
        match self {
            Kind::Master => None,
            Kind::Worker(id) | Kind::Front(id) | Kind::Helper(id) => Some(id),
        }
    }
}

struct Role(u32);

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Kind::of(self.0) {
            Kind::Master => f.write_str("master"),
            Kind::Helper(id) => write!(f, "worker {id} helper"),
            Kind::Front(id) => write!(f, "front {id}"),
            Kind::Worker(id) => write!(f, "worker {id}"),
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
        let pid = PID.load(Ordering::Relaxed);
        let role = ROLE.load(Ordering::Relaxed);
        if self.0 == Format::Json {
            return json_line(&mut w, level, pid, role, event);
        }
        prefix(&mut w, self.0, level, pid, role)?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// A text or journal line's start, up to the message.
fn prefix(w: &mut Writer<'_>, format: Format, level: Level, pid: u32, role: u32) -> fmt::Result {
    let name = NAME.get().map_or("appsrv", String::as_str);
    match format {
        Format::Journal => write!(w, "<{}>{name}[{pid}] {}: ", priority(level), Role(role)),
        Format::Text | Format::Json => {
            SystemTime.format_time(w)?;
            write!(w, " {:>5} {name}[{pid}] {}: ", level_str(level), Role(role))
        }
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
    let mut fields = JsonFields::default();
    event.record(&mut fields);
    let json = |v: &serde_json::Value| serde_json::to_string(v).map_err(|_| fmt::Error);
    json_head(w, level, pid, role)?;
    writeln!(
        w,
        "\"message\":{},\"fields\":{}}}",
        json(&fields.message.unwrap_or_default().into())?,
        json(&serde_json::Value::Object(fields.fields))?
    )
}

/// A JSON line's keys before the message: time, level, pid, role and worker.
fn json_head(w: &mut Writer<'_>, level: Level, pid: u32, role: u32) -> fmt::Result {
    let mut time = String::new();
    SystemTime.format_time(&mut Writer::new(&mut time))?;
    // Written key by key, in the documented order (a `serde_json::Map` sorts its keys);
    // serde_json escapes each value, newlines included, so the object stays on one line.
    let time = serde_json::to_string(&time).map_err(|_| fmt::Error)?;
    write!(
        w,
        "{{\"time\":{time},\"level\":\"{}\",\"pid\":{pid},",
        level_str(level)
    )?;
    let kind = Kind::of(role);
    write!(w, "\"role\":\"{}\",", DROP_ROLES[kind.row()])?;
    match kind.worker() {
        Some(id) => write!(w, "\"worker\":{id},"),
        None => Ok(()),
    }
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

    /// Issue 31: an episode of lost lines warns once, then not again within a minute, and
    /// the first line written afterwards reports the count and the error.
    #[test]
    fn issue_31_lost_lines_warn_once_a_minute_and_report_when_writable_again() {
        let lost = LostLines::new(Log::Access);
        let err = io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(lost.lost(2, &err), "the first loss warns");
        assert!(!lost.lost(1, &err), "not again within a minute");
        assert!(lost.warning(&err).contains("(3 so far"), "{}", lost.warning(&err));
        let report = lost.recovered().expect("a report");
        assert!(report.contains("3 line(s)"), "{report}");
        assert!(report.contains("No space left on device"), "{report}");
        assert_eq!(lost.recovered(), None, "once");
        assert!(lost.lost(1, &err), "a new episode warns again");
    }

    #[test]
    fn own_lines_have_the_format_of_the_others() {
        let line = own_line(Level::WARN, "log writable again");
        assert!(line.ends_with("log writable again\n"), "{line}");
        assert!(line.contains(" WARN "), "{line}");
    }

    #[test]
    fn formats_utc_times() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_796_026_200), "2026-11-30T08:10:00Z");
    }

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

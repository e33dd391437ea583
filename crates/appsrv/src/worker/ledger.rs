//! The accounting and logging every driver shares.
//!
//! Each I/O model (the blocking loop, the event loop, a hybrid front, a hybrid worker, the
//! datagram side) is a driver of its own, but what a request, a connection's end, a
//! rejection or a panic leaves in the scoreboard and in the logs must not depend on which
//! one served it. What was written once per driver lives here, once, so that no driver
//! names another:
//!
//! - the [`Ledger`]: request accounting (the request's first bytes, its count on the slot,
//!   its access-log line with its outcome), the line of a request or a connection that
//!   ended unanswered, the recycling limit read from one count ([`Recycle`]), the
//!   master's replacement asked once, the access log's reopening, and panic containment's
//!   log line and exit status ([`Ledger::panicked`]);
//! - the one rejection path's accounting: the kind's scoreboard counter and its log line
//!   once per episode ([`Rejections`]); the close is the driver's own (its sockets differ);
//! - how a connection's end by an error is logged ([`log_connection_error`]);
//! - how long a driver pauses accepting when the process or the system is out of
//!   descriptors or memory ([`RESOURCE_BACKOFF`]), and that episode's log lines
//!   ([`Trouble`]);
//! - one log line a minute for a trouble that repeats ([`OncePerMinute`]);
//! - panic containment: the panic hook ([`record_panic`]) keeps the message and location
//!   for whoever catches the panic ([`contain`], [`panic_message`]), which logs one line
//!   with its context.
//!
//! What stays with each driver is what its mechanics differ in: how the slot's request
//! clock runs (per request in the blocking loop, where the master's `--request-timeout`
//! watches it; per turn and per handler call in the event loop), and how an unanswered
//! request's outcome is known (from the I/O result, or from the step).

use std::any::Any;
use std::cell::RefCell;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::conn::step::Head;
use crate::net::listener::Addr;
use crate::scoreboard::{HEAD_BYTES, Slot};
use crate::sys::exit;

use super::Recycle;
use super::access::{AccessLog, Outcome};
use super::admission::{Kind, Rejection};

/// The worker's accounts, one per process whatever its driver: what every request and
/// connection leaves in the scoreboard and the access log, the recycling limit, and the
/// rejections. Each driver calls it at the same points of a connection's life (a
/// connection admitted, a request begun and answered, a connection ended with a request
/// unanswered), so that the accounts are the same in every I/O model.
pub(crate) struct Ledger<'a> {
    slot: &'a Slot,
    access: Option<AccessLog>,
    recycle: Recycle,
    /// Connections admitted and requests answered by this worker: the one count its
    /// recycling limit reads (the slot's counts are for the status, and a hybrid front's
    /// or a datagram's differ in what they count).
    connections: u64,
    requests: u64,
    /// The first bytes of the request in progress, as they came (for the access log's
    /// line, the request's first line).
    head: [u8; HEAD_BYTES],
    head_len: usize,
    /// What is published of them (the slot, the slow-call line): the codec's summary, or
    /// the bytes themselves with `--status-request-detail` (issue 41).
    shown: [u8; HEAD_BYTES],
    shown_len: usize,
    rejections: Rejections,
    /// Asks the master for a replacement (the recycling limit is reached); once.
    retire: Box<dyn FnMut() + 'a>,
    retire_sent: bool,
    /// Takes the files the master reopened after a USR1 (the log file goes over stderr),
    /// returns the new access log if any.
    reopen_log: Box<dyn FnMut() -> Option<std::fs::File> + 'a>,
}

impl fmt::Debug for Ledger<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("recycle", &self.recycle)
            .field("connections", &self.connections)
            .field("requests", &self.requests)
            .field("access_log", &self.access.is_some())
            .finish_non_exhaustive()
    }
}

impl<'a> Ledger<'a> {
    /// The accounts of the worker whose slot is `slot`.
    pub(crate) fn new(
        slot: &'a Slot,
        access: Option<AccessLog>,
        recycle: Recycle,
        retire: Box<dyn FnMut() + 'a>,
        reopen_log: Box<dyn FnMut() -> Option<std::fs::File> + 'a>,
    ) -> Self {
        Ledger {
            slot,
            access,
            recycle,
            connections: 0,
            requests: 0,
            head: [0; HEAD_BYTES],
            head_len: 0,
            shown: [0; HEAD_BYTES],
            shown_len: 0,
            rejections: Rejections::default(),
            retire,
            retire_sent: false,
            reopen_log,
        }
    }

    /// The worker's scoreboard slot.
    pub(crate) fn slot(&self) -> &'a Slot {
        self.slot
    }

    /// Whether there is an access log (a driver formats nothing for it otherwise).
    pub(crate) fn logs_access(&self) -> bool {
        self.access.is_some()
    }

    /// A connection admitted (or handed over by a front), toward `--max-connections`:
    /// returns how many so far. A rejected connection is not counted: a flood of refused
    /// clients must not recycle the pool. (The handler's [`Conn::id`](crate::Conn::id) is
    /// numbered by the request level, or by the event loop, among connections accepted.)
    pub(crate) fn connection(&mut self) -> u64 {
        self.connections += 1;
        self.connections
    }

    /// A request begins, or more of its first bytes arrived: `head` is its first bytes and
    /// what is published of them.
    pub(crate) fn request_head(&mut self, head: Head<'_>) {
        if self.access.is_some() {
            let n = head.raw.len().min(HEAD_BYTES);
            self.head[..n].copy_from_slice(&head.raw[..n]);
            self.head_len = n;
        }
        let n = head.shown.len().min(HEAD_BYTES);
        self.shown[..n].copy_from_slice(&head.shown[..n]);
        self.shown_len = n;
    }

    /// The first bytes of the request whose line is written next, for the access log only:
    /// a driver that serves many connections (an event loop, a hybrid front) gives them
    /// again before the line of a request left unanswered, since another connection's
    /// request may have begun since (issue 42). What is published is left as it is.
    pub(crate) fn access_head(&mut self, raw: &[u8]) {
        if self.access.is_some() {
            let n = raw.len().min(HEAD_BYTES);
            self.head[..n].copy_from_slice(&raw[..n]);
            self.head_len = n;
        }
    }

    /// What is published of the request in progress (the slot, the slow-call line): its
    /// codec's summary, or its first bytes with `--status-request-detail`.
    pub(crate) fn shown(&self) -> &[u8] {
        &self.shown[..self.shown_len]
    }

    /// The request in progress was answered in `took`, `bytes` being (request, response)
    /// length and `ok` whether the handler succeeded: counted on the slot (the count and
    /// the duration histogram) and toward the recycling limit, and its access-log line
    /// (`ok`, or `error` for the codec's error reply).
    pub(crate) fn request_end(
        &mut self,
        peer: &(impl fmt::Display + ?Sized),
        took: Duration,
        bytes: (u64, u64),
        ok: bool,
    ) {
        self.requests += 1;
        self.slot.count_request(took.as_micros() as u64);
        if !ok {
            self.slot.error();
        }
        if let Some(log) = self.access.as_mut() {
            let outcome = if ok { Outcome::Ok } else { Outcome::Error };
            log.line(peer, outcome, took, bytes, &self.head[..self.head_len]);
        }
    }

    /// Requests the datagram side answered (they count toward `--max-requests`; their
    /// lines are the side's own, sampled).
    pub(crate) fn datagrams_answered(&mut self, n: u64) {
        self.requests += n;
    }

    /// A request that was begun but not answered when its connection ended (the client
    /// left, a timeout, the codec's refusal): its line with `outcome`, not counted.
    pub(crate) fn request_unanswered(
        &mut self,
        peer: &(impl fmt::Display + ?Sized),
        outcome: Outcome,
        took: Duration,
        bytes: (u64, u64),
    ) {
        if let Some(log) = self.access.as_mut() {
            log.line(peer, outcome, took, bytes, &self.head[..self.head_len]);
        }
    }

    /// The request step refused the input with the codec's error reply (bad input, too
    /// slow, shed, past `--request-timeout`): an error on the slot (issue 41). Counted
    /// here, where every driver's step reports it, not where the connection's end is
    /// logged, which the event and async drivers do only with an access log.
    pub(crate) fn refused(&mut self) {
        self.slot.error();
    }

    /// A connection of the client level (`handle_client`), which is its own unit: its
    /// line when it ended, after `took`, with `outcome`.
    pub(crate) fn connection_end(
        &mut self,
        peer: &(impl fmt::Display + ?Sized),
        outcome: Outcome,
        took: Duration,
        bytes: (u64, u64),
    ) {
        count_error(self.slot, outcome);
        if let Some(log) = self.access.as_mut() {
            log.line(peer, outcome, took, bytes, b"");
        }
    }

    /// The access log, for the datagram side's sampled lines.
    pub(crate) fn access(&mut self) -> Option<&mut AccessLog> {
        self.access.as_mut()
    }

    /// Writes the buffered access-log lines (before the worker may wait, and at its end).
    pub(crate) fn flush(&mut self) {
        if let Some(log) = self.access.as_mut() {
            log.flush();
        }
    }

    /// After a USR1: the files the master reopened are put in place (the log file goes
    /// over stderr; the access log replaces this worker's copy).
    pub(crate) fn reopen(&mut self) {
        if let (Some(file), Some(log)) = ((self.reopen_log)(), self.access.as_mut()) {
            log.replace(file);
        }
    }

    /// Requests answered so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests
    }

    /// Whether the request about to be answered is the last the recycling limit allows
    /// (`--max-requests`): a codec that can announce a close ends the connection after it.
    pub(crate) fn retiring(&self) -> bool {
        self.recycle.max_requests > 0 && self.requests + 1 >= self.recycle.max_requests
    }

    /// Whether a recycling limit (`--max-requests`, `--max-connections`) is reached.
    pub(crate) fn limit_reached(&self) -> bool {
        (self.recycle.max_connections > 0 && self.connections >= self.recycle.max_connections)
            || (self.recycle.max_requests > 0 && self.requests >= self.recycle.max_requests)
    }

    /// At a limit, asks the master for a replacement, once: the master starts one first,
    /// then tells this worker to stop, so the pool's capacity never dips; meanwhile this
    /// worker goes on serving.
    pub(crate) fn check_recycle(&mut self) {
        if !self.retire_sent && self.limit_reached() {
            tracing::info!("reached its recycling limit; asking the master for a replacement");
            (self.retire)();
            self.retire_sent = true;
        }
    }

    /// The one rejection path's accounting (see [`Rejections`]). Returns the reason the
    /// codec's refusal gives before the close, for a client over the cap (its protocol
    /// says why it must come back later); `None`: the driver closes at once, before any
    /// handler code.
    pub(crate) fn reject(&mut self, why: Rejection, peer: &Addr) -> Option<&'static str> {
        let refusal =
            matches!(why, Rejection::OverCap { .. }).then_some("too many connections from your address");
        self.rejections.note(why, peer, self.slot);
        refusal
    }

    /// The user's code panicked (caught by [`contain`]): one error line, `what` saying
    /// where and `then` what follows, the access log's lines written, and the status the
    /// worker exits with (its handler's state cannot be trusted; the master replaces it).
    pub(crate) fn panicked(&mut self, what: fmt::Arguments<'_>, panic: &Panicked, then: &str) -> i32 {
        tracing::error!("{what}: {}; {then}", panic.0);
        self.flush();
        exit::PANIC
    }
}

/// A panic caught by [`contain`]: its message, with its location when the hook saw it.
#[derive(Debug)]
pub(crate) struct Panicked(pub(crate) String);

/// Counts a client-level connection (`handle_client`) among the slot's errors (`status`'s
/// errors per second, issue 41) when it ended in one: a failure (`error`) or a timeout; a
/// client that left is no error of the server's.
fn count_error(slot: &Slot, outcome: Outcome) {
    if matches!(outcome, Outcome::Error | Outcome::Timeout) {
        slot.error();
    }
}

/// Runs a call of the user's code with its panic contained: the panic's message (and
/// location) instead, for [`Ledger::panicked`] or a start failure's reason.
pub(crate) fn contain<T>(call: impl FnOnce() -> T) -> Result<T, Panicked> {
    panic::catch_unwind(AssertUnwindSafe(call)).map_err(|p| Panicked(panic_message(&*p)))
}

/// A trouble that repeats (a receive error, a slow handler call, an answer the kernel
/// refused) is logged once a minute, with how many times it happened in between.
#[derive(Debug, Default)]
pub(crate) struct OncePerMinute {
    logged: Option<Instant>,
    unlogged: u64,
}

impl OncePerMinute {
    /// The trouble happened at `now`: `Some(n)` when it is to be logged (`n` times since
    /// the last line, not logged), `None` when it was logged less than a minute ago.
    pub(crate) fn due(&mut self, now: Instant) -> Option<u64> {
        if self
            .logged
            .is_some_and(|t| now.saturating_duration_since(t) < EPISODE)
        {
            self.unlogged += 1;
            return None;
        }
        self.logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// How long to pause accepting when the process or system is out of descriptors or memory.
/// One value for every driver: a persistent error costs a few wake-ups per second, not a
/// busy loop, and a stop is not delayed by more than this.
pub(crate) const RESOURCE_BACKOFF: Duration = Duration::from_millis(100);

/// How long an episode lasts without its event: the same event for the same address logs
/// again only after this long without it.
const EPISODE: Duration = Duration::from_secs(60);

/// The one rejection path's accounting: the kind's scoreboard counter and its log line
/// once per episode. The close is the driver's (for a client over the cap, after the
/// codec's refusal). Rejected connections have no access-log line.
#[derive(Debug, Default)]
pub(crate) struct Rejections {
    episodes: [Episodes; Kind::COUNT],
    /// Log lines written, for the tests: an episode's single line.
    #[cfg(test)]
    lines: u64,
}

impl Rejections {
    /// The kind's scoreboard counter and its log line, once per episode (the close is the
    /// driver's: for a client over the cap, after the codec's refusal).
    pub(crate) fn note(&mut self, why: Rejection, peer: &Addr, slot: &Slot) {
        self.note_at(why, peer, slot, Instant::now());
    }

    fn note_at(&mut self, why: Rejection, peer: &Addr, slot: &Slot, now: Instant) {
        let ip = peer.ip().unwrap_or(Ipv4Addr::UNSPECIFIED.into());
        let new = self.episodes[why.kind() as usize].note(ip, now);
        #[cfg(test)]
        {
            self.lines += u64::from(new);
        }
        match &why {
            Rejection::Denied(ip) => {
                slot.denied();
                if new {
                    tracing::info!("denied connections from {ip} (--allow/--deny)");
                }
            }
            Rejection::BadProxy(reason) => {
                if new {
                    tracing::warn!("closing a connection from {peer}: {reason}");
                }
            }
            // A plain-text client, a scanner, an expired client certificate.
            Rejection::Tls(reason) => {
                slot.tls_failed();
                if new {
                    tracing::warn!("TLS handshake with {peer} failed: {reason}");
                }
            }
            Rejection::OverCap { ip, cap } => {
                slot.refused();
                if new {
                    tracing::warn!(
                        "refusing connections from {ip}: more than {cap} at once (--max-conns-per-ip)"
                    );
                }
            }
            // Counted in the penalty table (shared by every worker), not in the slot.
            Rejection::Penalized { ip, left, failures } => {
                if let Some(table) = crate::penalty::installed() {
                    table.count_refused();
                }
                if new {
                    tracing::warn!(
                        "refusing connections from {ip} for {}s: {failures} failed authentication(s) \
                         in a row (penalties double from 1 s up to --penalty-max)",
                        left.as_secs_f64().ceil()
                    );
                }
            }
        }
    }
}

/// Logs a kind of event once per episode: again only after a minute without it.
#[derive(Debug, Default)]
struct Episodes {
    last: Option<(IpAddr, Instant)>,
}

impl Episodes {
    /// Whether this event for `ip` at `now` starts a new episode (and should be logged).
    fn note(&mut self, ip: IpAddr, now: Instant) -> bool {
        let new = !matches!(self.last, Some((last, t)) if last == ip && now.duration_since(t) < EPISODE);
        self.last = Some((ip, now));
        new
    }
}

/// An episode of errors taking connections (out of descriptors or memory): its first
/// error is logged with the pause, the next success logs its end, and nothing in between,
/// whichever driver accepts.
#[derive(Debug, Default)]
pub(crate) struct Trouble {
    errno: Option<Errno>,
    /// Log lines written, for the tests: an episode's two lines.
    #[cfg(test)]
    lines: u64,
}

impl Trouble {
    /// An error while `doing` something: logged if it starts an episode. The caller pauses
    /// for [`RESOURCE_BACKOFF`] (its own way: a blocking driver sleeps, the event loop
    /// sets a timer).
    pub(crate) fn began(&mut self, errno: Errno, doing: &str) {
        if self.errno.is_none() {
            tracing::error!(
                "{doing}: {} ({errno}); pausing {} ms between attempts until it clears",
                errno.desc(),
                RESOURCE_BACKOFF.as_millis()
            );
            #[cfg(test)]
            {
                self.lines += 1;
            }
        }
        self.errno = Some(errno);
    }

    /// A connection was taken: the episode, if any, ends with a line.
    pub(crate) fn cleared(&mut self) {
        if let Some(e) = self.errno.take() {
            tracing::info!("accepting again after {}", e.desc());
            #[cfg(test)]
            {
                self.lines += 1;
            }
        }
    }
}

/// How a connection's end by an error is logged (the same in every driver): a timeout at
/// info, a client that left at debug, anything else as a warning.
pub(crate) fn log_connection_error(peer: &Addr, e: &io::Error) {
    match e.kind() {
        io::ErrorKind::TimedOut => tracing::info!("connection from {peer}: {e}"),
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::UnexpectedEof => tracing::debug!("connection from {peer} ended early: {e}"),
        _ => tracing::warn!("connection from {peer} ended with an error: {e}"),
    }
}

thread_local! {
    /// The message and location of the last panic, taken by whoever catches it: the
    /// default hook would print a multi-line report to stderr; appsrv logs one line with
    /// the context (the peer) at the place the panic is caught instead.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The worker's panic hook (installed before the user's code first runs): keeps the
/// message and location for [`panic_message`].
pub(crate) fn record_panic(info: &panic::PanicHookInfo<'_>) {
    let msg = crate::error::panic_text(info.payload());
    let text = match info.location() {
        Some(l) => format!("{msg} at {}:{}", l.file(), l.line()),
        None => msg,
    };
    LAST_PANIC.with(|p| *p.borrow_mut() = Some(text));
}

/// The panic's message with its location when the hook saw it.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    LAST_PANIC
        .with(|p| p.borrow_mut().take())
        .unwrap_or_else(|| crate::error::panic_text(payload))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::scoreboard::Board;

    fn inet(s: &str) -> Addr {
        Addr::Inet(s.parse().unwrap())
    }

    /// A rejection episode is one log line however many connections it refuses: the same
    /// address again within the minute is counted but not logged; another address, another
    /// kind or the same one after a quiet minute starts a new episode.
    #[test]
    fn issue_32_a_rejection_episode_logs_one_line() {
        let board = Board::new().unwrap();
        let slot = board.slot(1).unwrap();
        let mut rejections = Rejections::default();
        let peer = inet("192.0.2.7:4000");
        let t = Instant::now();
        let denied = || Rejection::Denied("192.0.2.7".parse().unwrap());
        for i in 0..5 {
            rejections.note_at(denied(), &peer, slot, t + Duration::from_secs(i));
        }
        assert_eq!(rejections.lines, 1, "one episode, one line");
        // Another kind has its own episodes.
        let tls = Rejection::Tls("not TLS".into());
        rejections.note_at(tls, &peer, slot, t + Duration::from_secs(5));
        assert_eq!(rejections.lines, 2);
        // Another address starts a new episode of the kind.
        rejections.note_at(
            denied(),
            &inet("198.51.100.1:1"),
            slot,
            t + Duration::from_secs(6),
        );
        assert_eq!(rejections.lines, 3);
        // Back to the first: a new episode (the last one was another address's).
        rejections.note_at(denied(), &peer, slot, t + Duration::from_secs(7));
        assert_eq!(rejections.lines, 4);
        // Within the minute, nothing; after a quiet minute, a line again.
        rejections.note_at(denied(), &peer, slot, t + Duration::from_secs(66));
        assert_eq!(rejections.lines, 4);
        rejections.note_at(denied(), &peer, slot, t + Duration::from_secs(127));
        assert_eq!(rejections.lines, 5);
    }

    /// An accept error episode is two lines however long it lasts: its start (the first
    /// error, whatever errors follow) and its end (the next connection taken).
    #[test]
    fn issue_32_an_accept_error_episode_logs_its_start_and_end() {
        let mut trouble = Trouble::default();
        trouble.cleared();
        assert_eq!(trouble.lines, 0, "no episode, no line");
        for _ in 0..10 {
            trouble.began(Errno::EMFILE, "accepting connections");
        }
        trouble.began(Errno::ENFILE, "accepting connections");
        assert_eq!(trouble.lines, 1);
        trouble.cleared();
        trouble.cleared();
        assert_eq!(trouble.lines, 2);
        trouble.began(Errno::ENOMEM, "accepting connections");
        assert_eq!(trouble.lines, 3, "a new episode");
    }

    /// The hook's message, location included, goes to whoever catches the panic, once.
    /// The panic hook is the process's: the tests that swap it take turns (the test
    /// runner's threads would otherwise see each other's hook, or the default one).
    static HOOK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn issue_32_a_caught_panic_carries_its_location_once() {
        let _turn = HOOK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let previous = panic::take_hook();
        panic::set_hook(Box::new(record_panic));
        let caught = panic::catch_unwind(|| panic!("boom")).unwrap_err();
        panic::set_hook(previous);
        let first = panic_message(&*caught);
        assert!(first.starts_with("boom at "), "{first}");
        assert!(first.contains("ledger.rs:"), "{first}");
        // Taken: a second catch without a hook falls back to the payload.
        assert_eq!(panic_message(&*caught), "boom");
    }

    /// A ledger over slot 1 of a fresh board, writing its access log to a file of its own;
    /// `retired` counts the master's replacement asked for.
    pub(crate) fn ledger_with_log(
        name: &str,
        recycle: Recycle,
        retired: &'static std::sync::atomic::AtomicU32,
    ) -> (Ledger<'static>, std::path::PathBuf) {
        let board: &'static Board = Box::leak(Box::new(Board::new().unwrap()));
        let slot = board.slot(1).unwrap();
        let path = std::env::temp_dir().join(format!("appsrv-ledger-{name}-{}", std::process::id()));
        let log = AccessLog::new(std::fs::File::create(&path).unwrap());
        let retire = Box::new(move || {
            retired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        (
            Ledger::new(slot, Some(log), recycle, retire, Box::new(|| None)),
            path,
        )
    }

    /// Each way a request or a connection ends leaves one access-log line with its outcome,
    /// whichever driver reports it; only answered requests count (on the slot, and toward
    /// the recycling limit).
    #[test]
    fn issue_32_each_outcome_leaves_its_line_and_only_answers_count() {
        static RETIRED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let (mut ledger, path) = ledger_with_log("outcomes", Recycle::default(), &RETIRED);
        let peer = inet("192.0.2.7:4000");
        let ms = Duration::from_millis(1);
        ledger.request_head(Head::same(b"GET /a HTTP/1.1\r\nHost: x\r\n"));
        ledger.request_end(&peer, ms, (30, 100), true);
        ledger.request_head(Head::same(b"BAD"));
        ledger.request_end(&peer, ms, (3, 20), false);
        ledger.request_head(Head::same(b"SLOW"));
        ledger.request_unanswered(&peer, Outcome::Timeout, ms, (4, 0));
        ledger.request_head(Head::same(b"HALF"));
        ledger.request_unanswered(&peer, Outcome::Closed, ms, (4, 0));
        ledger.connection_end(&peer, Outcome::Ok, ms, (5, 5));
        ledger.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        for (line, want) in lines.iter().zip([
            " 192.0.2.7:4000 ok 1000us in=30 out=100 \"GET /a HTTP/1.1\"",
            " 192.0.2.7:4000 error 1000us in=3 out=20 \"BAD\"",
            " 192.0.2.7:4000 timeout 1000us in=4 out=0 \"SLOW\"",
            " 192.0.2.7:4000 closed 1000us in=4 out=0 \"HALF\"",
            " 192.0.2.7:4000 ok 1000us in=5 out=5 \"\"",
        ]) {
            assert!(line.ends_with(want), "{line:?} should end with {want:?}");
        }
        assert_eq!(ledger.requests(), 2, "answered requests only");
        assert_eq!(ledger.slot().served().1, 2, "the slot counts the same");
    }

    /// Issue 41: the requests that ended in an error are counted on the slot (what
    /// `status` turns into errors per second): a handler's failure, the step's refusal of
    /// the input (counted once: not again when the connection's end is logged), a
    /// client-level connection that failed or timed out; not a client that left, nor an
    /// answered request.
    #[test]
    fn issue_41_requests_ending_in_an_error_are_counted_on_the_slot() {
        static RETIRED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let (mut ledger, path) = ledger_with_log("errors", Recycle::default(), &RETIRED);
        let _ = std::fs::remove_file(&path);
        let peer = inet("192.0.2.7:4000");
        let ms = Duration::from_millis(1);
        ledger.request_end(&peer, ms, (30, 100), true);
        ledger.request_unanswered(&peer, Outcome::Closed, ms, (4, 0));
        ledger.connection_end(&peer, Outcome::Ok, ms, (5, 5));
        assert_eq!(ledger.slot().errors(), 0, "no error yet");
        ledger.request_end(&peer, ms, (3, 20), false);
        ledger.refused();
        ledger.request_unanswered(&peer, Outcome::Error, ms, (4, 0));
        ledger.connection_end(&peer, Outcome::Error, ms, (5, 0));
        ledger.connection_end(&peer, Outcome::Timeout, ms, (5, 0));
        assert_eq!(ledger.slot().errors(), 4);
        let _ = std::fs::remove_file(&path);
    }

    /// The recycling limit is read from the ledger's one count: reached by requests
    /// (the last one announced by `retiring` first), or by connections; the master is
    /// asked for a replacement once, however often the driver checks.
    #[test]
    fn issue_32_the_recycling_limit_is_reached_by_requests_or_connections() {
        static BY_REQUESTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        static BY_CONNECTIONS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let peer = inet("192.0.2.7:4000");
        let recycle = Recycle {
            max_requests: 3,
            max_connections: 0,
        };
        let (mut ledger, path) = ledger_with_log("requests", recycle, &BY_REQUESTS);
        let _ = std::fs::remove_file(&path);
        for _ in 0..2 {
            assert!(!ledger.retiring());
            ledger.request_end(&peer, Duration::ZERO, (1, 1), true);
            ledger.check_recycle();
        }
        assert!(ledger.retiring(), "the third request is the last");
        assert!(!ledger.limit_reached());
        // A request left unanswered does not count.
        ledger.request_unanswered(&peer, Outcome::Closed, Duration::ZERO, (1, 0));
        ledger.check_recycle();
        assert_eq!(BY_REQUESTS.load(std::sync::atomic::Ordering::Relaxed), 0);
        ledger.request_end(&peer, Duration::ZERO, (1, 1), true);
        for _ in 0..3 {
            ledger.check_recycle();
        }
        assert!(ledger.limit_reached());
        assert_eq!(
            BY_REQUESTS.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "asked once"
        );

        let recycle = Recycle {
            max_requests: 0,
            max_connections: 2,
        };
        let (mut ledger, path) = ledger_with_log("connections", recycle, &BY_CONNECTIONS);
        let _ = std::fs::remove_file(&path);
        assert_eq!(ledger.connection(), 1, "the handler's Conn::id");
        ledger.request_end(&peer, Duration::ZERO, (1, 1), true);
        ledger.check_recycle();
        assert!(!ledger.limit_reached() && !ledger.retiring());
        assert_eq!(ledger.connection(), 2);
        ledger.check_recycle();
        ledger.check_recycle();
        assert!(ledger.limit_reached());
        assert_eq!(
            BY_CONNECTIONS.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "asked once"
        );
    }

    /// A trouble that repeats is logged once a minute, with the count of the ones between.
    #[test]
    fn issue_32_a_repeated_trouble_is_logged_once_a_minute_with_its_count() {
        let mut once = OncePerMinute::default();
        let t = Instant::now();
        assert_eq!(once.due(t), Some(0), "the first is logged");
        for i in 1..=4 {
            assert_eq!(once.due(t + Duration::from_secs(i)), None);
        }
        assert_eq!(
            once.due(t + Duration::from_secs(61)),
            Some(4),
            "with the 4 unlogged"
        );
        assert_eq!(once.due(t + Duration::from_secs(62)), None);
    }

    /// A panic in the user's code is contained: its message and location for the line,
    /// and the worker's exit status for a panic.
    #[test]
    fn issue_32_a_contained_panic_ends_the_worker_with_the_panic_status() {
        static RETIRED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let (mut ledger, path) = ledger_with_log("panic", Recycle::default(), &RETIRED);
        let _ = std::fs::remove_file(&path);
        let _turn = HOOK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let previous = panic::take_hook();
        panic::set_hook(Box::new(record_panic));
        let caught = contain(|| -> u32 { panic!("handler bug") });
        panic::set_hook(previous);
        let p = caught.unwrap_err();
        assert!(p.0.starts_with("handler bug at "), "{}", p.0);
        assert_eq!(contain(|| 7).unwrap(), 7);
        let code = ledger.panicked(format_args!("handler panicked while serving x"), &p, "exits");
        assert_eq!(code, exit::PANIC);
    }
}

//! The accounting and logging every driver shares.
//!
//! Each I/O model (the blocking loop, the event loop, a hybrid front, the datagram side)
//! is a driver of its own, but what a connection's end, a rejection or a panic leaves in
//! the scoreboard and in the log must not depend on which one served it. What was written
//! once per driver lives here, once, so that no driver names another:
//!
//! - the one rejection path's accounting: the kind's scoreboard counter and its log line
//!   once per episode ([`Rejections`]); the close is the driver's own (its sockets differ);
//! - how a connection's end by an error is logged ([`log_connection_error`]);
//! - how long a driver pauses accepting when the process or the system is out of
//!   descriptors or memory ([`RESOURCE_BACKOFF`]), and that episode's log lines
//!   ([`Trouble`]);
//! - panic containment's message: the panic hook ([`record_panic`]) keeps the message and
//!   location for whoever catches the panic ([`panic_message`]), which logs one line with
//!   its context.

use std::any::Any;
use std::cell::RefCell;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::panic;
use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::net::listener::Addr;
use crate::scoreboard::Slot;

use super::admission::{Kind, Rejection};

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
mod tests {
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
    #[test]
    fn issue_32_a_caught_panic_carries_its_location_once() {
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
}

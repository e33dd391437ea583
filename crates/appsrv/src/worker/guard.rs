//! The blocking driver's side of a connection at the request level: the keep-alive guard
//! that gives up an idle keep-alive connection when clients wait and no worker is idle,
//! and the slot's request clock (which the master's `--request-timeout` watches). The
//! request's accounts (its count, its access-log line, the recycling limit) are the
//! ledger's, as in every driver.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};
use socket2::Socket;

use crate::codec::ProtocolError;
use crate::net::listener::Listener;
use crate::scoreboard::{Board, State};
use crate::sys;

use super::ledger::Ledger;
use super::life::{Life, Ns};
use super::serve::{Boundary, Context, Head};
use crate::net::listener::Addr;

/// The client named in place of one that is not kept: without an access log, nothing
/// names it.
pub(crate) static UNLOGGED: Addr = Addr::Unix(None);

/// The worker's side of a connection in the blocking driver: the keep-alive guard, the
/// slot's request clock, and the ledger.
pub(crate) struct Guard<'a> {
    pub(crate) id: u32,
    pub(crate) listeners: &'a [Listener],
    pub(crate) board: &'a Board,
    pub(crate) keepalive_timeout: Option<Duration>,
    pub(crate) ledger: Ledger<'a>,
    /// Whether the slot's request clock runs (the master's `--request-timeout` watches
    /// it): a request, or a `handle_client` connection, is in progress.
    pub(crate) clock: bool,
    /// The life of the connection in progress (`life.rs`): its request clock (on the
    /// slot's clock, which the master's request timeout reads anyway) and close, as in
    /// every driver.
    pub(crate) life: Option<Life<Ns>>,
    /// The client of the connection in progress, for its access-log lines (only with an
    /// access log: the ledger names it in those lines only).
    pub(crate) peer: Option<Addr>,
    /// Why the request step refused the request in progress with the codec's error reply
    /// (its access-log line's outcome, issue 42); taken at the connection's end.
    pub(crate) refusal: Option<ProtocolError>,
    /// Hybrid mode: the connection was handed to this worker by a front, and goes back to
    /// one when it stays quiet (`None`: a connection the worker accepted itself, TLS).
    pub(crate) hold: Option<Hold>,
    /// The bytes (received, sent) of the connection in progress already on the slot
    /// ([`Context::moved`]); the rest go there when it ends.
    pub(crate) tallied: (u64, u64),
}

/// A connection this worker holds for others: in hybrid mode, a front handed it over and
/// takes it back when it stays quiet. The guard keeps the data; the policy is the hybrid
/// driver's (`hybrid.rs`), which sets it, so that the guard names no driver.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold {
    /// The worker's request count when it took the connection.
    pub(crate) since: u64,
    /// When it took it.
    pub(crate) at: Instant,
    /// How long the rest of a request begun on it may take to arrive before the
    /// connection goes back with what came ([`Context::partial_wait`]).
    pub(crate) partial: Duration,
    /// What to do at a boundary between two of its requests.
    pub(crate) boundary: fn(&mut Guard<'_>, Hold) -> Boundary,
}

impl Guard<'_> {
    /// What of the connection's `traffic` so far the slot does not count yet, which it
    /// counts from now on.
    pub(crate) fn untallied(&mut self, traffic: (u64, u64)) -> (u64, u64) {
        let (r, s) = self.tallied;
        self.tallied = traffic;
        (traffic.0.saturating_sub(r), traffic.1.saturating_sub(s))
    }

    /// Whether a connection waits in some listener's queue right now (a zero-timeout
    /// `poll`): the last word before a response announces the close or a connection is
    /// given up, since the board's flag may lag the queue by up to one of the master's
    /// looks.
    fn listeners_queued(&self) -> bool {
        crate::sys::any_readable(self.listeners)
    }
}

impl Context for Guard<'_> {
    /// The master's flag on the board (`master/queue.rs`): one atomic load while it is
    /// down, the usual case. While it is up, a zero-timeout `poll` of the listeners
    /// confirms it: the flag lags the queue by up to one of the master's looks, and a
    /// connection told to close for a client that has been served already is one lost for
    /// nothing (the first request of a new connection, while the flag of the last queue
    /// is still up).
    fn saturated(&mut self) -> bool {
        self.board.clients_queued() && self.listeners_queued()
    }

    /// A connection a front handed over goes back, with the beginning of a request that
    /// does not come whole within the hold's `partial` wait, while fronts take connections back (at
    /// a stop none does: the worker keeps it, as in blocking mode).
    fn partial_wait(&mut self) -> Option<Duration> {
        let hold = self.hold?;
        self.board.fronts_receiving().then_some(hold.partial)
    }

    fn retiring(&mut self) -> bool {
        self.ledger.retiring()
    }

    fn state(&mut self, state: State) {
        self.board.set_state(self.id, state);
    }

    fn request_start(&mut self, head: Head<'_>) {
        let now = self.ledger.slot().request_start(head.shown);
        self.clock = true;
        if let Some(life) = self.life.as_mut() {
            life.request_start(&mut self.ledger, head, Ns(now));
        }
    }

    fn request_head(&mut self, head: Head<'_>) {
        self.ledger.slot().store_head(head.shown);
        if let Some(life) = self.life.as_mut() {
            life.request_head(&mut self.ledger, head);
        }
    }

    fn refused(&mut self, why: &ProtocolError) {
        self.ledger.refused();
        self.refusal = Some(why.clone());
    }

    fn moved(&mut self, traffic: (u64, u64)) {
        let (received, sent) = self.untallied(traffic);
        self.ledger.slot().add_bytes(received, sent);
    }

    fn request_end(&mut self, bytes: (u64, u64), ok: bool) {
        if !std::mem::take(&mut self.clock) {
            return;
        }
        let now = crate::scoreboard::now_ns();
        self.ledger.slot().request_stop(now);
        if let Some(life) = self.life.as_mut() {
            let peer = self.peer.as_ref().unwrap_or(&UNLOGGED);
            life.request_end(&mut self.ledger, peer, Ns(now), bytes, ok);
        }
    }

    /// While the master's flag is down (clients are not queued, or some worker is idle),
    /// the connection keeps this worker: one store (the slot shows the worker at a
    /// keep-alive boundary) and one load, then the loop's blocking read. The master,
    /// which watches the listen queue, raises the flag when clients queue while no worker
    /// is idle and wakes the workers waiting at a boundary with [`sys::GUARD_SIGNAL`]: the
    /// read returns `EINTR` and the loop asks again.
    ///
    /// With the flag up, the connection gets `grace` (never more than the keep-alive
    /// timeout) to send its next request, which a pipelining or benchmarking client does
    /// within microseconds; still quiet then, and clients still queued with no worker idle
    /// (a `poll` of the listeners: the flag may lag the queue), it is given up, so that
    /// the queued client is served instead of waiting for the keep-alive timeout. System
    /// calls only while the flag is up: a `poll` of the connection per request, and one of
    /// the listeners when the grace runs out.
    fn at_boundary(&mut self, conn: &Socket, grace: Duration) -> Boundary {
        if let Some(hold) = self.hold {
            // With no front to take it (all are stopping: the server stops), the
            // connection stays here, as in blocking mode.
            if self.board.fronts_receiving() {
                return (hold.boundary)(self, hold);
            }
        }
        // The mark comes before the flag is read: a worker the master finds unmarked has
        // not looked yet. (A wake-up that lands between the look and the read is lost:
        // the master wakes the marked workers again at each look while clients wait.)
        self.ledger.slot().keepalive_wait();
        if !self.board.clients_queued() {
            return Boundary::Wait;
        }
        let grace = self.keepalive_timeout.map_or(grace, |t| grace.min(t));
        let until = Instant::now() + grace;
        let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match nix::poll::poll(&mut fds, sys::poll_timeout(left)) {
                Ok(0) => break,
                Ok(_) => return Boundary::Wait, // the next request (or the client's close)
                // A stop: the loop checks for it. The master's next wake-up, USR1, a HUP
                // sent to the process group: the grace goes on.
                Err(Errno::EINTR) if sys::stop_requested() => return Boundary::Wait,
                Err(Errno::EINTR) => {}
                Err(_) => return Boundary::Wait,
            }
        }
        if self.board.idle() == 0 && self.listeners_queued() {
            Boundary::GiveUp
        } else {
            Boundary::Wait
        }
    }
}

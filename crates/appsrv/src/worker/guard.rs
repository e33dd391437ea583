//! The worker's side of a connection at the request level: its scoreboard slot, its
//! request clock and access-log line, the recycling limit, and the keep-alive guard that
//! gives up an idle keep-alive connection when clients wait and no worker is idle.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};
use socket2::Socket;

use crate::net::listener::Listener;
use crate::scoreboard::{Board, Slot, State};
use crate::sys;

use super::Recycle;
use super::access::{AccessLog, Outcome};
use super::serve::{Boundary, Context};

/// The worker's side of a connection: the keep-alive guard, and the scoreboard slot.
pub(crate) struct Guard<'a> {
    pub(crate) id: u32,
    pub(crate) listeners: &'a [Listener],
    pub(crate) board: &'a Board,
    pub(crate) slot: &'a Slot,
    pub(crate) keepalive_timeout: Option<Duration>,
    pub(crate) recycle: Recycle,
    /// The start of the request in progress (monotonic ns), if any.
    pub(crate) request: Option<u64>,
    /// Requests served by this worker.
    pub(crate) requests: u64,
    /// The access log, when one is configured.
    pub(crate) access: Option<AccessLog>,
    /// The client of the connection in progress, formatted once (for the access log).
    pub(crate) peer: Option<String>,
    /// The first bytes of the request in progress (for the access log).
    pub(crate) head: Vec<u8>,
    /// Hybrid mode: the connection was handed to this worker by a front, and goes back to
    /// one when it stays quiet (`None`: a connection the worker accepted itself, TLS).
    pub(crate) hold: Option<Hold>,
}

/// How long a hybrid worker keeps a connection after a response, for its next request,
/// before it hands it back to a front.
pub(crate) const HOLD_LINGER: Duration = Duration::from_millis(100);
/// Requests a hybrid worker answers on one connection, at most, while other complete
/// requests wait for a worker, before it hands it back (to the back of the queue).
pub(crate) const HOLD_REQUESTS: u64 = 100;
/// How long a hybrid worker keeps one connection, at most, while other complete requests
/// wait for a worker: [`HOLD_REQUESTS`] of a handler that blocks 5 ms would hold it for
/// half a second, and every waiting client behind it.
pub(crate) const HOLD_TIME: Duration = Duration::from_millis(5);
/// How long a hybrid worker waits for the next request of a connection it keeps while
/// other complete requests wait. A client that talks fast (a benchmark, a pooled proxy
/// connection) sends it within microseconds of the response; one that does not goes back
/// to a front, and the worker takes a waiting request.
pub(crate) const HOLD_NEXT: Duration = Duration::from_millis(2);

/// How long a hybrid worker waits, at most, for the rest of a request it began to read on
/// a connection a front handed it (a request pipelined behind the one handed off, or sent
/// during the hold), before it hands the connection back with what came; the front
/// gathers the rest and hands the whole request off again. A client that talks fast (a
/// pipelining one, a request in two segments) sends the rest within microseconds; a slow
/// one costs the worker this long per request answered, never its own pace.
pub(crate) const HOLD_PARTIAL: Duration = Duration::from_millis(10);

/// A connection a front handed to this worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold {
    /// The worker's request count when it took the connection.
    pub(crate) since: u64,
    /// When it took it.
    pub(crate) at: Instant,
}

impl Guard<'_> {
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
    /// does not come whole within [`HOLD_PARTIAL`], while fronts take connections back (at
    /// a stop none does: the worker keeps it, as in blocking mode).
    fn partial_wait(&mut self) -> Option<Duration> {
        (self.hold.is_some() && self.board.fronts_receiving()).then_some(HOLD_PARTIAL)
    }

    fn retiring(&mut self) -> bool {
        self.recycle.max_requests > 0 && self.requests + 1 >= self.recycle.max_requests
    }

    fn state(&mut self, state: State) {
        self.board.set_state(self.id, state);
    }

    fn request_start(&mut self, head: &[u8]) {
        self.request = Some(self.slot.request_start(head));
        self.keep_head(head);
    }

    fn request_head(&mut self, head: &[u8]) {
        self.slot.store_head(head);
        self.keep_head(head);
    }

    fn request_end(&mut self, bytes: (u64, u64), ok: bool) {
        if let Some(started) = self.request.take() {
            self.slot.request_end(started, true);
            self.requests += 1;
            if let (Some(log), Some(peer)) = (self.access.as_mut(), self.peer.as_ref()) {
                let took =
                    std::time::Duration::from_nanos(crate::scoreboard::now_ns().saturating_sub(started));
                let outcome = if ok { Outcome::Ok } else { Outcome::Error };
                log.line(peer, outcome, took, bytes, &self.head);
            }
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
                return self.hybrid_boundary(hold);
            }
        }
        // The mark comes before the flag is read: a worker the master finds unmarked has
        // not looked yet. (A wake-up that lands between the look and the read is lost:
        // the master wakes the marked workers again at each look while clients wait.)
        self.slot.keepalive_wait();
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

impl Guard<'_> {
    /// Hybrid mode, between two requests of a connection a front handed over: keep it
    /// while its next request comes within [`HOLD_LINGER`] (the driver's read waits that
    /// long: no system call here), then hand it back. While other complete requests wait
    /// and no worker is idle, the worker keeps the connection only while its next request
    /// comes within [`HOLD_NEXT`], for at most [`HOLD_REQUESTS`] requests and
    /// [`HOLD_TIME`], then takes the waiting ones. Handing back a connection whose next
    /// request was a few microseconds away (a zero-timeout look for it) cost two hand-offs
    /// per request: 34,000 requests/s instead of 47,000 at c = 32 … 256 on 8 workers
    /// (BENCHMARKS.md, "Hybrid mode"). A stop hands the connection back at once: the
    /// fronts of the next generation take it (a reload loses no connection).
    ///
    /// A request handed off while every worker lingers does not wait for a linger to end:
    /// the front wakes one lingering worker ([`Board::wake_lingering`], the mark set here)
    /// with a signal, which interrupts its read; the worker asks again and hands its quiet
    /// connection back. Watching the channel beside the connection instead would cost a
    /// `poll` per request kept. At `--max-requests` the connection goes back too.
    fn hybrid_boundary(&mut self, hold: Hold) -> Boundary {
        if sys::stop_requested() {
            return Boundary::HandBack;
        }
        if self.limit_reached() {
            // --max-requests: back to the front, so that the worker retires now and the
            // connection goes on with another (a client that never pauses would keep it).
            return Boundary::HandBack;
        }
        // The mark comes before the look at the requests waiting (and a fence between,
        // paired with the front's): a front that hands off a request sees the mark and
        // wakes this worker out of its linger, or this sees the request.
        self.slot.keepalive_wait();
        self.slot.linger_wait();
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if !(self.board.requests_waiting() && self.board.idle() == 0) {
            return Boundary::Linger(self.keepalive_timeout.map_or(HOLD_LINGER, |t| t.min(HOLD_LINGER)));
        }
        if self.requests.saturating_sub(hold.since) >= HOLD_REQUESTS || hold.at.elapsed() >= HOLD_TIME {
            return Boundary::HandBack;
        }
        // A short wait, for a client that talks fast: no front wakes the worker out of
        // it (the next request is the one it waits for).
        self.slot.linger_end();
        Boundary::Linger(HOLD_NEXT)
    }

    /// Keeps the request's first bytes for its access-log line (only with a log).
    fn keep_head(&mut self, head: &[u8]) {
        if self.access.is_some() {
            self.head.clear();
            self.head.extend_from_slice(head);
        }
    }

    pub(crate) fn limit_reached(&self) -> bool {
        let (connections, requests) = self.slot.served();
        (self.recycle.max_connections > 0 && connections >= self.recycle.max_connections)
            || (self.recycle.max_requests > 0 && requests >= self.recycle.max_requests)
    }
}

//! The worker's side of a connection at the request level: its scoreboard slot, its
//! request clock and access-log line, the recycling limit, and the keep-alive guard that
//! gives up an idle keep-alive connection when clients wait and no worker is idle.

use std::os::fd::AsFd;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};
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
}

impl Guard<'_> {
    /// Whether a connection waits in some listener's queue (a zero-timeout `poll`).
    fn clients_queued(&self) -> bool {
        let mut fds: Vec<PollFd<'_>> = self
            .listeners
            .iter()
            .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN))
            .collect();
        matches!(nix::poll::poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
    }
}

impl Context for Guard<'_> {
    /// One atomic load while some worker is idle; a zero-timeout `poll` of the listeners
    /// only when none is.
    fn saturated(&mut self) -> bool {
        self.board.idle() == 0 && self.clients_queued()
    }

    fn retiring(&mut self) -> bool {
        self.recycle.max_requests > 0 && self.requests + 1 >= self.recycle.max_requests
    }

    fn state(&mut self, state: State) {
        self.board.set_state(self.id, state);
    }

    fn request_start(&mut self, head: &[u8]) {
        self.request = Some(self.slot.request_start(head));
        if self.access.is_some() {
            self.head.clear();
            self.head.extend_from_slice(head);
        }
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

    /// While some worker is idle (one atomic load), the connection keeps this worker.
    /// When none is, the worker waits on the connection *and* the listeners. If clients
    /// are queued, the connection gets `grace` more to send its next request (a
    /// pipelining or benchmarking client sends it within microseconds); a connection still
    /// idle then is given up, so that the queued client is served instead of waiting for
    /// the keep-alive timeout. This costs a `poll` or two per request only while the pool
    /// is saturated.
    fn at_boundary(&mut self, conn: &Socket, grace: Duration) -> Boundary {
        if self.board.idle() > 0 {
            return Boundary::Wait;
        }
        let mut fds: Vec<PollFd<'_>> = std::iter::once(PollFd::new(conn.as_fd(), PollFlags::POLLIN))
            .chain(
                self.listeners
                    .iter()
                    .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN)),
            )
            .collect();
        loop {
            match nix::poll::poll(&mut fds, poll_timeout(self.keepalive_timeout)) {
                Ok(0) => return Boundary::GiveUp, // idle for the whole keep-alive timeout
                Ok(_) if fds[0].revents().is_some_and(|r| !r.is_empty()) => return Boundary::Wait,
                Ok(_) => break,
                // A stop: the loop checks for it. Another signal (USR1, a HUP sent to the
                // process group): wait again, keeping the guard.
                Err(_) if sys::stop_requested() => return Boundary::Wait,
                Err(_) => {}
            }
        }
        // Clients are queued and this connection is quiet: a short grace, then give up.
        let mut conn_only = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut conn_only, poll_timeout(Some(grace))) {
            Ok(0) => Boundary::GiveUp,
            _ => Boundary::Wait,
        }
    }
}

fn poll_timeout(t: Option<Duration>) -> PollTimeout {
    t.map_or(PollTimeout::NONE, |t| {
        PollTimeout::try_from(t.as_millis().min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX)
    })
}

impl Guard<'_> {
    pub(crate) fn limit_reached(&self) -> bool {
        let (connections, requests) = self.slot.served();
        (self.recycle.max_connections > 0 && connections >= self.recycle.max_connections)
            || (self.recycle.max_requests > 0 && requests >= self.recycle.max_requests)
    }
}

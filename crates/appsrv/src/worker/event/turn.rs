//! The turn: the loop proper. The wait (`epoll_pwait`, the signals let in only there), the
//! events it returns, the ready list, the timers, the stop, and the end of a turn.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::sys::signal::SigSet;

use crate::conn::step::Wait;
use crate::handler::RequestHandler;
use crate::scoreboard::State;
use crate::sys::{self, exit};

use super::super::reactor::{Kind, Ready, Slab, Timers, Token};
use super::connection::{Connection, Pending};
use super::{Completion, Loop};

/// Events taken from the kernel per `epoll_wait`.
const EVENTS: usize = 512;

/// How often a loop that never sleeps looks for pending signals (a stop is seen within
/// this, under any load).
pub(super) const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// The loop's reactor: its epoll instance and signal mask, the connections by token (see
/// reactor.rs), their timers, the ready list, and the turn's clock.
pub(super) struct Reactor<'a, H: RequestHandler> {
    pub(super) epoll: Epoll,
    pub(super) mask: SigSet,
    /// The connections, by token (see reactor.rs).
    pub(super) conns: Slab<Connection<'a, H>>,
    pub(super) timers: Timers,
    pub(super) ready: Ready,
    /// The turn's clock.
    pub(super) now: Instant,
    /// When a busy loop next looks for pending signals.
    pub(super) signals_due: Instant,
}

impl<H: RequestHandler> Reactor<'_, H> {
    /// A reactor over `epoll` (the listeners registered), with the flag signals blocked
    /// outside the wait (`mask`: the mask the wait lets them in with).
    pub(super) fn new(epoll: Epoll, mask: SigSet) -> Self {
        Reactor {
            epoll,
            mask,
            conns: Slab::new(),
            timers: Timers::new(),
            ready: Ready::new(),
            now: Instant::now(),
            signals_due: Instant::now() + SIGNAL_CHECK,
        }
    }
}

/// Serves connections with `handler` until a stop; returns the worker's exit status.
pub(super) fn serve<'a, H: RequestHandler, C: Completion<'a>>(
    mut lp: Loop<'a, H, C>,
    handler: &mut H,
) -> i32 {
    lp.memory.refusal = super::super::budget::refusal_words(handler.codec());
    let mut events = vec![EpollEvent::empty(); EVENTS];
    loop {
        lp.ledger.flush();
        lp.publish();
        if lp.stopping && lp.reactor.conns.is_empty() && C::drained(&mut lp) {
            tracing::debug!("no connection left");
            if let Some(source) = lp.source.as_mut() {
                source.exit();
            }
            return exit::OK;
        }
        let timeout = lp.wait_timeout();
        lp.cfg.slot.turn_end();
        let n = match sys::epoll_wait_signals(&lp.reactor.epoll, &mut events, timeout, &lp.reactor.mask) {
            Ok(n) => n,
            Err(Errno::EINTR) => 0,
            Err(e) => {
                tracing::error!("epoll_wait: {e}; stopping");
                return exit::OK;
            }
        };
        lp.turn(&events[..n], handler);
    }
}

impl<'a, H: RequestHandler, C: Completion<'a>> Loop<'a, H, C> {
    /// One turn's work after the wait: the flags, the events, the ready list, the timers.
    fn turn(&mut self, events: &[EpollEvent], handler: &mut H) {
        self.reactor.now = Instant::now();
        self.cfg.slot.turn_begin(crate::scoreboard::now_ns());
        // A loop whose waits always find events ready (or that never waits, its ready
        // list never empty) is never interrupted by a signal: look for a pending stop or
        // reopen now and then (see `sys::let_in_pending_signals`).
        if self.reactor.now >= self.reactor.signals_due {
            self.reactor.signals_due = self.reactor.now + SIGNAL_CHECK;
            sys::let_in_pending_signals(&self.reactor.mask);
        }
        if sys::stop_requested() && !self.stopping {
            self.begin_stop();
        }
        // Before admission counts anyone (a front: the clients the workers have taken).
        self.completion.turn_begins();
        if sys::take_reopen_request() {
            self.ledger.reopen();
        }
        // The ready list as it stands: connections queued during this turn wait for the
        // next one.
        let mut ready = self.reactor.ready.snapshot();
        for ev in events {
            let token = Token::from_data(ev.data());
            match token.kind() {
                Kind::Connection => self.event(token, ev.events(), handler),
                Kind::Channel => C::channel_event(self, ev.events(), handler),
                Kind::Datagram(index) => self.source_ready(index),
                Kind::Listener(_) if ev.events().contains(EpollFlags::EPOLLHUP) => {
                    // The master shut the listeners down: a stop.
                    if !self.stopping {
                        self.begin_stop();
                    }
                }
                Kind::Listener(index) => self.accept(index, handler),
            }
        }
        while let Some(token) = self.reactor.ready.next(&mut ready) {
            if let Some(c) = self.reactor.conns.get_mut(token) {
                Ready::done(&mut c.queued);
                self.run(token, handler);
            }
        }
        self.expire(handler);
        self.resume_paused();
        self.trim();
        self.resume_accepting();
        self.ledger.check_recycle();
    }

    /// The wait's timeout: none when connections are ready, else until the earliest timer.
    fn wait_timeout(&mut self) -> Option<Duration> {
        if !self.reactor.ready.is_empty() {
            return Some(Duration::ZERO);
        }
        let next = self
            .reactor
            .timers
            .earliest()
            .into_iter()
            .chain(self.accepting.resume_at)
            .chain(self.memory.trim_at)
            .min()?;
        Some(next.saturating_duration_since(Instant::now()))
    }

    /// The source registered with token index `index` (a datagram listener) is readable:
    /// it reads and answers what it holds, unless the loop is stopping.
    fn source_ready(&mut self, index: usize) {
        if self.stopping {
            return;
        }
        if let Some(source) = self.source.as_mut() {
            source.ready(index, &mut self.ledger);
        }
    }

    /// A stop (or a retirement's stop, a reload, an upgrade): accept no more; idle
    /// keep-alive connections of protocols that can announce a close are drained (their
    /// next request, if it comes within the drain wait, is answered as the last).
    pub(super) fn begin_stop(&mut self) {
        self.stopping = true;
        crate::conn::id::set_stopping();
        self.cfg.board.set_state(self.cfg.id, State::Finishing);
        self.completion.on_stop();
        self.pause_accepting();
        // Datagrams: what the sockets hold now is read and answered once more, then the
        // sockets are no longer watched (the next generation, or nobody at a stop, reads
        // what comes later: see datagram.rs).
        if let Some(source) = self.source.as_mut() {
            source.stop(&self.reactor.epoll, &mut self.ledger);
        }
        for (token, c) in self.reactor.conns.iter_mut() {
            if matches!(c.pending, Pending::Read { wait: Wait::Idle }) {
                c.pending = Pending::Advance;
                self.reactor.ready.push(&mut c.queued, token);
            }
        }
        tracing::debug!("stopping: {} connections to finish", self.reactor.conns.len());
    }

    /// An edge on connection `token`.
    fn event(&mut self, token: Token, events: EpollFlags, handler: &mut H) {
        let Some(c) = self.reactor.conns.get_mut(token) else {
            return;
        };
        if events.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP) {
            c.readable = true;
        }
        if events.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP) {
            c.writable = true;
        }
        if events.intersects(EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP) {
            c.closed_by_peer = true;
        }
        if c.queued.is_set() {
            // It runs from the ready list anyway.
            return;
        }
        self.run(token, handler);
    }

    /// Fires the timers that are due.
    fn expire(&mut self, handler: &mut H) {
        let now = self.reactor.now;
        while let Some((t, token)) = self.reactor.timers.pop_due(now) {
            let Some(c) = self.reactor.conns.get_mut(token) else {
                continue;
            };
            if self.reactor.timers.expired(&mut c.timer, token, t, now) {
                self.timed_out(token, handler);
            }
        }
    }
}

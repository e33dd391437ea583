//! A connection's record and its place in the loop: in (accepted, or handed back to a
//! front), a pass run as far as it goes without waiting (its buffers lent, its counts and
//! registration after), its deadline, and out (closed with its access-log line, or
//! forgotten once handed off).

use std::io;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::sys::epoll::EpollFlags;
use socket2::Socket;

use crate::codec::FileBody;
use crate::conn::buffers::Buffers;
use crate::conn::send_watch::{SEND_CHECK, SendWatch};
use crate::conn::step::{Next, Requests, Wait};
use crate::conn::transport::Transport;
use crate::handler::RequestHandler;
use crate::net::listener::Addr;
use crate::sys;

use super::super::admission::{Admission, EventSeat};
use super::super::driver::rules;
use super::super::ledger::{Panicked, contain};
use super::super::life::{Counted, Ended, Life, Unit};
use super::super::reactor::{self, Queued, Timer, Token};
use super::{Completion, Loop};

/// What a connection waits for, for the counts on the scoreboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Reading,
    Writing,
    Idle,
}

/// What a connection does once its output is sent.
#[derive(Debug)]
pub(super) enum Then {
    /// Read: the step's wait, with its timeout.
    Read { wait: Wait, timeout: Option<Duration> },
    /// Run the step again (its pass limit was reached), on the next turn.
    Yield,
    /// A hybrid front: hand the connection to a worker.
    HandOff,
    /// Close (lingering or not).
    Close { linger: Option<Duration> },
}

/// Where a connection is.
pub(super) enum Pending {
    /// Admission (PROXY header, rules, TLS handshake, cap).
    Admit,
    /// Send the output, then `Then`.
    Output(Then),
    /// Sending a file: from `offset`, `left` bytes.
    File { body: FileBody, offset: u64, left: u64 },
    /// Waiting for input (what the step asked).
    Read { wait: Wait },
    /// Run the step without new input: its pass limit was reached, or a stop arrived while
    /// the connection was idle (the step decides whether to drain it).
    Advance,
    /// The wait's deadline passed: the step decides (an idle connection closes, a request
    /// too slow is refused, a header tick reads on).
    TimedOut,
    /// Shut for writing; reading and discarding until the client's close or the deadline.
    Linger { discarded: usize },
    /// Done: close it.
    Done,
}

/// One connection.
pub(crate) struct Connection<'a, H: RequestHandler> {
    pub(super) transport: Transport,
    pub(super) peer: Addr,
    /// Its number among this worker's connections ([`Conn::id`](crate::Conn::id)).
    pub(super) id: u64,
    /// The listener that accepted it.
    pub(super) listener: u32,
    /// In the epoll set: a connection is registered the first time it must wait (one whose
    /// request came with it and is answered, or handed off, at once never is).
    pub(super) registered: bool,
    pub(super) admission: Option<Box<Admission<'a, EventSeat>>>,
    pub(super) step: Requests<H::Codec>,
    pub(super) session: H::Session,
    pub(super) pending: Pending,
    /// Private buffers (a partial request, unsent output); `None` while empty.
    pub(super) bufs: Option<Box<Buffers>>,
    /// What the last edge and the last I/O said.
    pub(super) readable: bool,
    pub(super) writable: bool,
    pub(super) closed_by_peer: bool,
    pub(super) queued: Queued,
    /// Stopped reading at the budget of buffered bytes (in `Memory::paused`).
    pub(super) paused: bool,
    /// Its one deadline (the wait's), and its entry in the loop's timers.
    pub(super) timer: Timer,
    pub(super) class: Class,
    /// Its life in the worker's accounts (`life.rs`): the request clock, the close, the
    /// per-address count.
    pub(super) life: Life,
    /// The I/O error that ended the connection, if one did (the access log's outcome).
    pub(super) failed: Option<io::ErrorKind>,
    pub(super) received: u64,
    pub(super) sent: u64,
    /// How much of `received` and `sent` the loop has tallied for the scoreboard
    /// ([`Loop::tally`]).
    pub(super) tallied: (u64, u64),
    /// `--min-send-rate`, while its output waits for the client; and what had been sent at
    /// the last check.
    pub(super) watch: Option<Box<SendWatch>>,
    pub(super) sent_at_check: u64,
}

impl<H: RequestHandler> Connection<'_, H> {
    /// The client's IP as counted for the per-address cap (after admission, or by the
    /// admission still in progress), taken: nobody counts it any more.
    pub(super) fn take_counted(&mut self) -> Option<IpAddr> {
        (self.life.take_counted().map(Counted::into_ip))
            .or_else(|| self.admission.as_ref().and_then(|a| a.seat().counted))
    }
}

/// What a connection's private buffers hold for a request (none: nothing).
pub(super) fn held(bufs: Option<&Buffers>) -> usize {
    bufs.map_or(0, Buffers::input_capacity)
}

/// What a pass of a connection ended with.
pub(super) enum Pass {
    /// Waiting (for an edge or its deadline).
    Wait,
    /// To be run again next turn.
    Ready,
    /// Closed.
    Closed,
    /// A hybrid front: to be handed to a worker, with what its buffers hold.
    HandOff,
}

/// A connection a worker handed back (hybrid mode): how far it got, and the beginning of
/// a request that came with it, if any.
pub(crate) struct Back<'b> {
    pub(super) served: u32,
    pub(super) interim_sent: bool,
    pub(super) bytes: &'b [u8],
}

impl<'a, H: RequestHandler, C: Completion<'a>> Loop<'a, H, C> {
    /// A connection into the loop: a new one (`returned` is `None`: admitted first), or
    /// one a worker handed back.
    pub(super) fn insert(
        &mut self,
        socket: Socket,
        peer: Addr,
        listener: usize,
        handler: &mut H,
        returned: Option<Back<'_>>,
    ) {
        if returned.is_none() {
            self.accepting.accepted += 1;
            self.cfg.slot.accepted();
        }
        let mut step = Requests::new(handler.codec(), self.cfg.step_limits.clone());
        if let Some(back) = &returned {
            step.resume(back.served, back.interim_sent);
        }
        let mut c = Connection {
            transport: Transport::new(socket),
            peer: peer.clone(),
            id: self.accepting.accepted,
            listener: listener as u32,
            registered: false,
            admission: None,
            step,
            session: H::Session::default(),
            pending: Pending::Admit,
            bufs: None,
            // Its request usually came with it: read at once (an empty socket costs one
            // `EAGAIN`; waiting for the edge would cost a turn every time). One handed back
            // is usually quiet: its registration reports input already there.
            readable: returned.is_none(),
            writable: true,
            closed_by_peer: false,
            queued: Queued::default(),
            paused: false,
            timer: Timer::default(),
            class: Class::Reading,
            life: Life::new(Unit::Requests),
            failed: None,
            received: 0,
            sent: 0,
            tallied: (0, 0),
            watch: None,
            sent_at_check: 0,
        };
        self.start(&mut c, peer, listener, returned);
        self.count(Class::Reading);
        let token = self.reactor.conns.insert(c);
        // Before its first request is handled, in this turn: a handler call that blocks
        // the loop is reported with every connection it holds up.
        self.publish();
        self.run(token, handler);
    }

    /// Where a connection coming in starts: with the beginning of a request handed back,
    /// waiting for its first request (admitted, or handed back), or in admission.
    fn start(&mut self, c: &mut Connection<'a, H>, peer: Addr, listener: usize, returned: Option<Back<'_>>) {
        let cfg = &self.cfg;
        let rules = rules(cfg.listeners, cfg.tls, &cfg.limits, cfg.max_per_ip, listener);
        if let (Some(_), Some(peers), Some(ip)) = (&returned, cfg.peers, peer.ip()) {
            // Back from a worker: counted here again for the per-address cap.
            if peers.add(cfg.id, ip) {
                c.life.count(Counted::new(peers, cfg.id, ip));
            }
        }
        if let Some(bytes) = returned.as_ref().map(|b| b.bytes).filter(|b| !b.is_empty()) {
            // The beginning of a request: decoded first, then read on.
            let mut bufs = Buffers::none();
            bufs.extend_input(bytes);
            // Counted against the budget of buffered bytes, as `close` will uncount it.
            self.memory.buffered += bufs.input_capacity();
            c.bufs = Some(Box::new(bufs));
            c.pending = Pending::Advance;
        } else if returned.is_some() || rules.open_to(&peer) {
            if returned.is_none() {
                c.life.serve(&mut self.ledger, &peer);
            }
            c.pending = Pending::Read { wait: Wait::Idle };
            let first = c.step.first_read();
            if let Next::Read { timeout, .. } = first {
                c.timer.deadline = timeout.map(|t| self.reactor.now + t);
            }
        } else {
            let now = self.reactor.now;
            c.admission = Some(Box::new(Admission::start(
                rules,
                peer,
                EventSeat {
                    id: cfg.id,
                    peers: cfg.peers,
                    counted: None,
                    workers: C::workers_table(cfg.board),
                },
                &mut || now,
            )));
        }
    }

    /// Runs a connection as far as it goes without waiting.
    pub(super) fn run(&mut self, token: Token, handler: &mut H) {
        let Some(mut c) = self.reactor.conns.take(token) else {
            return;
        };
        let mut private = c.bufs.take();
        let using_shared = private.is_none();
        self.memory.buffered -= held(private.as_deref()) + c.step.kept_capacity();
        self.memory.pass_shared = using_shared;
        self.memory.pass_token = token;
        // Lent out of the loop for the pass, which also borrows the loop.
        let mut shared = std::mem::replace(&mut self.memory.shared, Buffers::none());
        let outcome = {
            let bufs: &mut Buffers = match private.as_deref_mut() {
                Some(b) => b,
                None => &mut shared,
            };
            match contain(|| self.drive(&mut c, bufs, handler)) {
                Ok(pass) => pass,
                Err(panic) => self.panicked(&mut c, &panic),
            }
        };
        self.memory.shared = shared;
        self.tally(&mut c);
        if matches!(outcome, Pass::Closed | Pass::HandOff) {
            // Counted again for the moment, as a connection in the slab is: `close` and
            // `forget` uncount what a connection holds (its buffers are dropped with it).
            self.memory.buffered += c.step.kept_capacity();
        }
        match outcome {
            Pass::Closed => self.closed_in_pass(token, c, private.as_deref()),
            Pass::HandOff => C::hand_off(self, token, c, private.as_deref()),
            Pass::Wait | Pass::Ready => self.after_pass(token, c, private, using_shared, outcome),
        }
    }

    /// The handler panicked while serving `c`: its request's line, by the one rule (a
    /// panic is an `error`), before the lines are written out, then the worker exits.
    fn panicked(&mut self, c: &mut Connection<'a, H>, panic: &Panicked) -> ! {
        let others = self.reactor.conns.len();
        let bytes = (c.received, c.sent);
        c.life
            .closing(&mut self.ledger, &c.peer, Ended::Panicked, bytes, Instant::now);
        sys::exit_now(self.ledger.panicked(
            format_args!("handler panicked while serving {}", c.peer),
            panic,
            &format!(
                "connection closed, this worker exits and is replaced (closing its {others} other connections)"
            ),
        ))
    }

    /// A pass ended with the connection closed: the line of its unanswered request names
    /// that request, then it closes.
    fn closed_in_pass(&mut self, token: Token, c: Connection<'a, H>, private: Option<&Buffers>) {
        if c.life.in_request() && self.ledger.logs_access() {
            // The line of its unanswered request names that request (its bytes as they
            // came), whatever began on other connections since.
            let bufs = private.unwrap_or(&self.memory.shared);
            self.ledger.access_head(c.step.as_read(bufs));
        }
        self.memory.shared.discard_input();
        self.memory.shared.output().clear();
        self.close(token, c);
    }

    /// After a pass that waits or is ready again: private buffers only for what is left,
    /// its class counted, registered the first time it waits, its deadline armed.
    fn after_pass(
        &mut self,
        token: Token,
        mut c: Connection<'a, H>,
        private: Option<Box<Buffers>>,
        using_shared: bool,
        outcome: Pass,
    ) {
        // Private buffers only for what is left; empty ones are given back.
        if using_shared {
            if !self.memory.shared.is_empty() {
                c.bufs = Some(Box::new(self.memory.shared.take_leftover()));
            }
        } else if let Some(b) = private {
            if !b.is_empty() {
                c.bufs = Some(b);
            }
        }
        self.memory.buffered += held(c.bufs.as_deref()) + c.step.kept_capacity();
        let new_class = match c.pending {
            Pending::Read { wait: Wait::Idle } if c.step.served() > 0 => Class::Idle,
            Pending::Read { .. } | Pending::Admit => Class::Reading,
            _ => Class::Writing,
        };
        if new_class != c.class {
            self.uncount(c.class);
            self.count(new_class);
            c.class = new_class;
        }
        if !c.registered {
            // Edge-triggered: what is ready now (more input, room for output) is reported
            // by the next wait.
            let flags =
                EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET;
            if let Err(e) = reactor::watch(&self.reactor.epoll, c.transport.socket().as_fd(), flags, token) {
                tracing::warn!("watching a connection from {}: {e}; closing it", c.peer);
                self.close(token, c);
                return;
            }
            c.registered = true;
        }
        self.reactor.timers.arm(&mut c.timer, token);
        if let Pass::Ready = outcome {
            self.reactor.ready.push(&mut c.queued, token);
        }
        self.reactor.conns.put_back(token, c);
    }

    /// A connection's deadline passed.
    pub(super) fn timed_out(&mut self, token: Token, handler: &mut H) {
        let Some(c) = self.reactor.conns.get_mut(token) else {
            return;
        };
        match c.pending {
            Pending::Read { .. } => {
                c.pending = Pending::TimedOut;
                self.run(token, handler);
            }
            Pending::Admit => {
                if let Some(a) = c.admission.as_mut() {
                    a.deadline_passed(self.reactor.now);
                }
                self.run(token, handler);
            }
            Pending::Output(_) | Pending::File { .. } => self.write_timed_out(token),
            // On the ready list: its run sets the deadline of what it waits for next (a
            // client that pipelines without pause is not cut by an old keep-alive one).
            Pending::Advance | Pending::TimedOut => {}
            Pending::Linger { .. } | Pending::Done => {
                let c = self.reactor.conns.take(token).expect("present");
                self.close(token, c);
            }
        }
    }

    /// The deadline of a connection whose output waits for the client: `--min-send-rate`'s
    /// check (armed again when the client keeps up), or the write timeout.
    fn write_timed_out(&mut self, token: Token) {
        let Some(c) = self.reactor.conns.get_mut(token) else {
            return;
        };
        let verdict = match c.watch.as_mut() {
            // `--min-send-rate`: checked every second while the output waits.
            Some(watch) => {
                let progressed = c.sent > c.sent_at_check;
                c.sent_at_check = c.sent;
                watch.waited(c.transport.socket(), progressed)
            }
            None => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "timed out writing its response (--write-timeout)",
            )),
        };
        match verdict {
            Ok(()) => {
                // Disarmed as it expired: armed for the next check.
                c.timer.deadline = Some(self.reactor.now + SEND_CHECK);
                self.reactor.timers.arm(&mut c.timer, token);
            }
            Err(e) => {
                tracing::info!("connection from {}: {e}", c.peer);
                // Cut off at once: the kernel must not go on trickling the rest.
                let mut c = self.reactor.conns.take(token).expect("present");
                c.failed = Some(e.kind());
                let _ = c.transport.socket().set_linger(Some(Duration::ZERO));
                self.close(token, c);
            }
        }
    }

    /// Closes a connection: out of the epoll set (closing the socket does it), its counts
    /// and its place freed.
    pub(super) fn close(&mut self, token: Token, mut c: Connection<'a, H>) {
        if c.life.in_request() {
            // A request left unanswered when the connection ended.
            self.cfg.slot.handler_done();
            self.unanswered_line(&mut c);
        }
        self.forget(token, c);
    }

    /// The access-log line of a request left unanswered when connection `c` ended, by
    /// the one close (`life.rs`): refused with the codec's error reply, cut at a deadline,
    /// or lost (the client left, an error). A hybrid front's requests too: one it refuses,
    /// times out or loses gets its line here.
    fn unanswered_line(&mut self, c: &mut Connection<'a, H>) {
        if let (true, Some(bufs)) = (self.ledger.logs_access(), c.bufs.as_deref()) {
            // Closed outside its pass (a deadline): its bytes are in its buffers.
            self.ledger.access_head(c.step.as_read(bufs));
        }
        let ended = Ended::of(c.step.rejected().map(|(why, _)| why), c.failed);
        let bytes = (c.received, c.sent);
        c.life
            .closing(&mut self.ledger, &c.peer, ended, bytes, Instant::now);
    }

    /// Connection `token` leaves the loop (closed, or handed to a worker by a hybrid front,
    /// which counts it for the per-address cap from then on): its counts and its place are
    /// freed, its socket closed here.
    pub(super) fn forget(&mut self, token: Token, mut c: Connection<'a, H>) {
        self.memory.buffered -= held(c.bufs.as_deref()) + c.step.kept_capacity();
        self.uncount(c.class);
        self.tally(&mut c);
        if let (Some(ip), Some(peers)) = (c.take_counted(), self.cfg.peers) {
            peers.remove(self.cfg.id, ip);
        }
        drop(c);
        self.reactor.conns.release(token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::serve::tests::Hello;

    /// What an idle keep-alive connection costs the loop besides its socket: its record
    /// (no buffer). Held to a bound, so that 10,000 idle clients stay within a few MiB.
    #[test]
    fn an_idle_connection_costs_its_record_only() {
        let size = std::mem::size_of::<Connection<'static, Hello>>();
        assert!(size <= 768, "{size} bytes per connection");
    }
}

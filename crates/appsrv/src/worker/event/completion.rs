//! What a complete request becomes: the loop's parameter. An event worker answers it
//! inline ([`Inline`]: the handler's call, timed against `--slow-request`); a hybrid front
//! hands the connection to a worker ([`HandOff`]: the front's hand-off state, `front.rs`,
//! and what the loop does for it: the channel's edges, connections handed back, the
//! stop's last look at the channel).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use nix::sys::epoll::EpollFlags;
use socket2::Socket;

use crate::conn::buffers::Buffers;
use crate::conn::context::{Conn as HandlerConn, ConnInfo};
use crate::conn::step::Gathered;
use crate::handler::RequestHandler;
use crate::net::listener::Addr;
use crate::net::tls::ForWorker;
use crate::peer_counts::PeerCounts;
use crate::scoreboard::{Board, State};

use super::super::front::Front;
use super::super::ledger::{Ledger, OncePerMinute};
use super::super::life::Life;
use super::super::reactor::{self, Token};
use super::super::serve::{Bound, Context, Head};
use super::connection::{Back, Connection};
use super::{CHANNEL_IN, Loop};

/// What a completion is made from, once the worker's slot says it is an event loop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    /// The worker's number (its slot's index).
    pub(crate) id: u32,
    /// The scoreboard.
    pub(crate) board: &'static Board,
    /// The event workers' connections by client address (`--max-conns-per-ip`).
    pub(crate) peers: Option<&'static PeerCounts>,
    /// `--slow-request`.
    pub(crate) slow_request: Option<Duration>,
}

/// The loop's state a step's call uses, lent for the call.
pub(crate) struct At<'t, 'l> {
    pub(super) ledger: &'t mut Ledger<'l>,
    pub(super) stopping: bool,
    /// The turn's clock.
    pub(super) now: Instant,
    /// The connections open (for the slow-call line).
    pub(super) open: usize,
}

/// What a complete request becomes, and what else that asks of the loop. The hooks that
/// need the loop take it whole (`lp`): only the completion knows what it adds to a turn.
pub(crate) trait Completion<'a>: Sized {
    /// One call of the step on what `c`'s buffers hold (`bufs`).
    fn advance<H: RequestHandler>(
        &mut self,
        at: At<'_, 'a>,
        c: &mut Connection<'a, H>,
        bufs: &mut Buffers,
        handler: &mut H,
    ) -> Gathered;

    /// A turn begins, before admission counts anyone.
    fn turn_begins(&mut self) {}

    /// A stop begins.
    fn on_stop(&mut self) {}

    /// What it holds of requests that left their connections (counted against
    /// `--max-buffered-bytes`).
    fn memory(&self) -> usize {
        0
    }

    /// Complete requests it holds whose connections left the loop (counted against
    /// `--worker-connections`).
    fn held(&self) -> usize {
        0
    }

    /// Whether listener `i` is left to the workers (not accepted on by this loop).
    fn leaves_to_workers(_tls: &ForWorker, _i: usize) -> bool {
        false
    }

    /// The table of the workers' clients admission counts in too (a front's), if any.
    fn workers_table(_board: &'static Board) -> Option<&'static Board> {
        None
    }

    /// An edge on the hand-off channel (registered only for a front).
    fn channel_event<H: RequestHandler>(_lp: &mut Loop<'a, H, Self>, _events: EpollFlags, _handler: &mut H) {}

    /// A pass ended with [`Gathered::Whole`]: the connection leaves the loop with what its
    /// buffers hold (`private`, or the loop's shared ones).
    fn hand_off<H: RequestHandler>(
        lp: &mut Loop<'a, H, Self>,
        token: Token,
        c: Connection<'a, H>,
        private: Option<&Buffers>,
    );

    /// Stopping with no connection left: whether the loop may end (a front forwards what
    /// came back late, and ends once it holds nothing).
    fn drained<H: RequestHandler>(_lp: &mut Loop<'a, H, Self>) -> bool {
        true
    }
}

/// An event worker's completion: the handler answers the request inline.
pub(crate) struct Inline {
    slow: Slow,
}

impl Inline {
    /// Handler calls longer than `start.slow_request` are logged and counted.
    pub(crate) fn new(start: Start) -> Self {
        Inline {
            slow: Slow {
                limit: start.slow_request,
                episode: OncePerMinute::default(),
            },
        }
    }
}

impl<'a> Completion<'a> for Inline {
    fn advance<H: RequestHandler>(
        &mut self,
        at: At<'_, 'a>,
        c: &mut Connection<'a, H>,
        bufs: &mut Buffers,
        handler: &mut H,
    ) -> Gathered {
        let mut ctx = Turn {
            ledger: at.ledger,
            stopping: at.stopping,
            peer: &c.peer,
            life: &mut c.life,
            now: at.now,
            slow: &mut self.slow,
            handler_started: None,
            handler_ended: None,
            last_end: None,
            open: at.open,
        };
        let info = ConnInfo {
            peer: &c.peer,
            tls: c.transport.tls(),
            id: c.id,
            socket: c.transport.socket(),
        };
        let mut bound = Bound {
            handler,
            conn: HandlerConn::new(info, &mut c.session),
        };
        let now = at.now;
        Gathered::Step(c.step.advance(bufs, &mut bound, &mut ctx, &c.peer, &mut || now))
    }

    fn hand_off<H: RequestHandler>(
        _: &mut Loop<'a, H, Self>,
        _: Token,
        _: Connection<'a, H>,
        _: Option<&Buffers>,
    ) {
        unreachable!("an event worker's step answers every request; only a front's gathers whole ones")
    }
}

/// The worker's side of a connection's step, for one pass.
struct Turn<'t, 'l> {
    ledger: &'t mut Ledger<'l>,
    stopping: bool,
    peer: &'t Addr,
    life: &'t mut Life,
    /// The turn's clock.
    now: Instant,
    slow: &'t mut Slow,
    /// The clock at the start and at the end of the handler call (the request's duration
    /// ends at the second).
    handler_started: Option<Instant>,
    handler_ended: Option<Instant>,
    /// The end of the pass's last handler call: the next call of the same pass (pipelined
    /// requests) starts its timing there rather than at a clock read of its own, which
    /// counts the decoding between the two (microseconds) against a limit in tenths of a
    /// second, and saves one clock read per pipelined request (about 8 % of a worker's
    /// samples under `redis-benchmark -P 16`, issue 34).
    last_end: Option<Instant>,
    open: usize,
}

/// Slow handler calls: the limit, and the episode being logged.
struct Slow {
    limit: Option<Duration>,
    episode: OncePerMinute,
}

impl Context for Turn<'_, '_> {
    fn retiring(&mut self) -> bool {
        self.ledger.retiring()
    }

    fn stopping(&mut self) -> bool {
        self.stopping
    }

    fn state(&mut self, state: State) {
        match state {
            State::Handling => {
                self.ledger.slot().handler_call(self.peer, self.ledger.shown());
                self.handler_started = Some(self.last_end.unwrap_or_else(Instant::now));
            }
            State::Writing => {
                if let Some(started) = self.handler_started.take() {
                    let ended = Instant::now();
                    self.handler_ended = Some(ended);
                    self.last_end = Some(ended);
                    let took = ended.saturating_duration_since(started);
                    if self.slow.limit.is_some_and(|l| took > l) {
                        self.slow_call(took, ended);
                    }
                }
            }
            _ => {}
        }
    }

    fn request_start(&mut self, head: Head<'_>) {
        self.life.request_start(self.ledger, head, self.now);
    }

    fn request_head(&mut self, head: Head<'_>) {
        self.life.request_head(self.ledger, head);
    }

    fn refused(&mut self, _: &crate::codec::ProtocolError) {
        self.ledger.refused();
    }

    fn request_end(&mut self, bytes: (u64, u64), ok: bool) {
        if !self.life.in_request() {
            return;
        }
        let ended = self.handler_ended.take().unwrap_or_else(Instant::now);
        self.ledger.slot().handler_done();
        self.life.request_end(self.ledger, self.peer, ended, bytes, ok);
    }
}

impl Turn<'_, '_> {
    fn slow_call(&mut self, took: Duration, now: Instant) {
        self.ledger.slot().slow_call();
        let Some(more) = self.slow.episode.due(now) else {
            return;
        };
        tracing::warn!(
            "a handler call for {} took {} ms (--slow-request {} ms), request {:?}: it held up this worker's {} other connections{}; a handler that blocks belongs in --io blocking",
            self.peer,
            took.as_millis(),
            self.slow.limit.unwrap_or_default().as_millis(),
            String::from_utf8_lossy(self.ledger.shown()),
            self.open.saturating_sub(1),
            if more > 0 {
                format!(" ({more} more slow calls in the last minute)")
            } else {
                String::new()
            }
        );
    }
}

/// A hybrid front's completion: a whole request goes to a worker with its connection.
pub(crate) struct HandOff<'a> {
    front: Front<'a>,
}

impl<'a> HandOff<'a> {
    /// The front over its end of the hand-off channel, `channel`; it takes connections
    /// handed back from now on.
    pub(crate) fn new(channel: std::os::fd::BorrowedFd<'a>, start: Start) -> Self {
        HandOff {
            front: Front::new(channel, start.id, start.board, start.peers),
        }
    }
}

impl<'a> Completion<'a> for HandOff<'a> {
    /// In a front, the step only gathers the request ([`Gathered::Whole`]: hand it off).
    fn advance<H: RequestHandler>(
        &mut self,
        at: At<'_, 'a>,
        c: &mut Connection<'a, H>,
        bufs: &mut Buffers,
        _: &mut H,
    ) -> Gathered {
        let mut gather = Gather {
            ledger: at.ledger,
            stopping: at.stopping,
            life: &mut c.life,
            now: at.now,
        };
        let now = at.now;
        c.step
            .complete(bufs, self.front.scratch(), &mut gather, &c.peer, &mut || now)
    }

    fn turn_begins(&mut self) {
        // The clients the workers have taken.
        self.front.settle();
    }

    fn on_stop(&mut self) {
        // Connections handed back go to the fronts that stay (a reload's next
        // generation), or stay with their workers (a stop).
        self.front.stop_receiving();
    }

    fn memory(&self) -> usize {
        self.front.memory()
    }

    fn held(&self) -> usize {
        self.front.held()
    }

    fn leaves_to_workers(tls: &ForWorker, i: usize) -> bool {
        tls.acceptor(i).is_some()
    }

    fn workers_table(board: &'static Board) -> Option<&'static Board> {
        Some(board)
    }

    /// An edge on a hybrid front's hand-off channel: room for the requests it holds,
    /// connections handed back.
    fn channel_event<H: RequestHandler>(lp: &mut Loop<'a, H, Self>, events: EpollFlags, handler: &mut H) {
        let receiving = !lp.stopping;
        // Taken back after the edge is handled: a connection that comes back with the
        // beginning of a request is driven at once (the front's path: gather, then hand
        // off), which needs the loop, and the front, in their place.
        let mut back = Vec::new();
        lp.completion
            .front
            .on_edge(events, receiving, &mut |socket, meta, bytes| {
                back.push((socket, meta, bytes.to_vec()));
            });
        for (socket, meta, bytes) in back {
            take_back(lp, socket, meta, &bytes, handler);
        }
        watch_channel(lp);
    }

    /// A hybrid front hands connection `token` to a worker, with what its buffers hold
    /// (`private`, or the loop's shared ones), as it was read.
    fn hand_off<H: RequestHandler>(
        lp: &mut Loop<'a, H, Self>,
        token: Token,
        mut c: Connection<'a, H>,
        private: Option<&Buffers>,
    ) {
        // Out of this loop's epoll set first: a registration follows the open file, which
        // the worker shares from now on, not this process's descriptor.
        if c.registered {
            let _ = lp.reactor.epoll.delete(c.transport.socket());
        }
        let meta = crate::net::handoff::Meta {
            served: c.step.served(),
            peer: match &c.peer {
                Addr::Inet(a) => Some(*a),
                Addr::Unix(_) => None,
            },
            listener: c.listener,
            // A whole request: no interim reply is due to it.
            interim_sent: false,
        };
        // Its client stays counted for the per-address cap until a worker has it.
        let counted: Option<IpAddr> = c.take_counted();
        let bytes = c.step.as_read(private.unwrap_or(&lp.memory.shared));
        lp.completion
            .front
            .hand_off(c.transport.socket(), meta, bytes, counted);
        watch_channel(lp);
        lp.memory.shared.discard_input();
        lp.memory.shared.output().clear();
        lp.forget(token, c);
    }

    fn drained<H: RequestHandler>(lp: &mut Loop<'a, H, Self>) -> bool {
        // Connections a worker handed back just as this front stopped taking them:
        // to the workers, rather than lost with this process.
        lp.completion.front.forward_late();
        watch_channel(lp);
        lp.completion.front.idle()
    }
}

/// A front watches the channel for room only while it holds requests for want of it.
fn watch_channel<'a, H: RequestHandler>(lp: &mut Loop<'a, H, HandOff<'a>>) {
    let front = &mut lp.completion.front;
    let Some(wants) = front.room_watch_changed() else {
        return;
    };
    let flags = if wants {
        CHANNEL_IN | EpollFlags::EPOLLOUT
    } else {
        CHANNEL_IN
    };
    if let Err(e) = reactor::rewatch(&lp.reactor.epoll, front.channel(), flags, Token::CHANNEL) {
        tracing::error!("watching the hand-off channel: {e}");
    }
}

/// A connection a worker handed back: into the loop as an idle keep-alive connection
/// (already admitted), read at once (its next request may be there), or with the
/// beginning of a request the worker read (`bytes`), which it gathers on from.
fn take_back<'a, H: RequestHandler>(
    lp: &mut Loop<'a, H, HandOff<'a>>,
    socket: Socket,
    meta: crate::net::handoff::Meta,
    bytes: &[u8],
    handler: &mut H,
) {
    let peer = match meta.peer {
        Some(a) => Addr::Inet(a),
        None => socket
            .peer_addr()
            .map_or(Addr::Unix(None), |a| Addr::from_sockaddr(&a)),
    };
    let listener = meta.listener as usize;
    let back = Back {
        served: meta.served,
        interim_sent: meta.interim_sent,
        bytes,
    };
    lp.insert(socket, peer, listener, handler, Some(back));
}

/// head, so that one the front refuses, times out or loses gets its access-log line when
/// the connection closes, as in every model (issue 42); one handed off is answered, counted
/// and logged by the worker that takes it.
struct Gather<'t, 'l> {
    ledger: &'t mut Ledger<'l>,
    stopping: bool,
    life: &'t mut Life,
    now: Instant,
}

impl Context for Gather<'_, '_> {
    fn stopping(&mut self) -> bool {
        self.stopping
    }
    fn request_start(&mut self, head: Head<'_>) {
        self.life.request_start(self.ledger, head, self.now);
    }
    fn request_head(&mut self, head: Head<'_>) {
        self.life.request_head(self.ledger, head);
    }
    fn refused(&mut self, _: &crate::codec::ProtocolError) {
        self.ledger.refused();
    }
}

//! The event loop (`--io event`): one epoll instance per worker, made after the fork, over
//! the worker's listeners and all its connections; the user's `RequestHandler` is called
//! inline for each complete request, through the same I/O-free steps as the blocking loop
//! (admission, `conn/step.rs`). What does not know about connections (the tokens epoll
//! carries, the slab that names connections by them, the timers, the ready list) is the
//! reactor underneath, `worker/reactor.rs`.
//!
//! What happens to a complete request is the loop's parameter, a [`Completion`]: an event
//! worker answers it inline ([`Inline`]: the handler's call), a hybrid front hands the
//! connection to a worker ([`HandOff`], over `front.rs`'s channel). Datagrams are a
//! source registered on the reactor (`worker/datagram.rs`), called on their readiness.
//!
//! The loop's files, by role (each `impl Loop` block lives with the state it keeps):
//! - `mod.rs`: the driver ([`Event`]), the epoll instance made before `Ready`, the loop's
//!   configuration and the loop itself ([`Loop`]: a sub-struct per role);
//! - `turn.rs`: the turn (the wait, the signals, the events, the ready list, the timers,
//!   the stop, the end of a turn), over its [`Reactor`];
//! - `accepting.rs`: accepting, its limits, its back-off and its requeue;
//! - `connection.rs`: a connection's record and its place in the loop (in, a pass, its
//!   deadline, out);
//! - `drive.rs`: a connection's pass: admission's I/O, reading, the step, writing and
//!   `sendfile`, the lingering close;
//! - `memory.rs`: the budget of buffered bytes as this loop keeps it (pausing, resuming,
//!   giving memory back) and the worker-wide buffers;
//! - `publish.rs`: the counts and the bytes published on the scoreboard;
//! - `completion.rs`: what a complete request becomes ([`Inline`], [`HandOff`]).
//!
//! What each turn does, and why (see also docs/ARCHITECTURE.md, "The event loop"):
//! - **Accepting without a thundering herd.** The master's listeners are shared by every
//!   worker. Each worker registers them level-triggered with `EPOLLEXCLUSIVE`: a new
//!   connection wakes one waiting worker (or a few), not all. Linux wakes the waiters in
//!   the order they registered, so the first worker would take nearly every connection of
//!   a lightly loaded server; a worker re-registers its listeners (delete and add: an
//!   exclusive registration cannot be modified) every [`REQUEUE_EVERY`](super::accept::REQUEUE_EVERY) accepts, which puts
//!   it at the back of the queue. One accept per listener per turn, as nginx does by
//!   default (the listener is level-triggered: a connection left in the queue is
//!   reported again by the next wait, which does not block), so that a connection costs
//!   no `accept` that finds the queue empty (measured: 8.7 system calls per connection
//!   with up to 16 accepts per turn, 6.5 with one). A new connection is read at once: its
//!   request has usually arrived with it, which saves a turn (one `epoll_wait`).
//! - **Limits.** At `--worker-connections` open connections the worker takes its listeners
//!   out of its epoll set and puts them back below 7/8 of it; out of descriptors or memory
//!   (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) it pauses accepting for
//!   [`RESOURCE_BACKOFF`](super::ledger::RESOURCE_BACKOFF) instead of spinning on a listener that stays readable.
//! - **Connections are registered once**, edge-triggered for input, output and the peer's
//!   close (`EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET`), as nginx does: no `epoll_ctl` per
//!   request. The loop remembers what the last edge said (readable, writable) and what the
//!   last read or write found (a short read drained the socket).
//! - **One read, one write.** A connection's bytes are read into a worker-wide buffer, every
//!   complete request in it is decoded and answered (the step, up to its `PASS_LIMIT`),
//!   and the responses go out in one write. A connection keeps buffers of its own only
//!   while it holds a partial request or output the socket did not take (their size is
//!   what they hold), and gives them back once empty: an idle keep-alive connection costs
//!   its socket and a small record, no buffer.
//! - **Output cap.** While a connection's output is not all sent, the loop reads nothing
//!   more from it: a client that does not read its responses stops being served (and its
//!   memory stops growing at one pass of responses) until it does, or its write timeout
//!   ends it. Nobody else waits for it.
//! - **Fairness.** A connection gets one pass per turn: a pass that hit the step's request
//!   limit, or a read that filled the buffer (more may be waiting in the socket, and no
//!   new edge will say so), puts the connection on the ready list for the next turn, and
//!   the next `epoll_wait` does not wait.
//! - **Timers without system calls.** Each connection has one deadline (its wait's: the
//!   keep-alive timeout, the request's read timeout or header tick, the drain, the TLS
//!   handshake or PROXY header, the write timeout, the lingering close) and at most one
//!   live entry in a heap ordered by deadline. A request that moves a deadline later
//!   changes a field; the heap entry, when it comes due, finds the later deadline and is
//!   pushed again. `epoll_wait`'s timeout is the earliest entry: no `timerfd` (which the
//!   default sandbox profile does not allow), no system call per request.
//! - **Signals.** The stop and reopen signals are blocked while the loop works and let in
//!   only during `epoll_pwait`, so that one arriving just before the wait is not missed.
//!   A wait that finds events ready lets none in (the kernel restores the blocked mask
//!   unless the wait was interrupted), so a loop that is never idle looks for pending
//!   ones every [`SIGNAL_CHECK`](turn::SIGNAL_CHECK) (one `sigpending`).
//! - **Head-of-line guard.** Every handler call is timed; one longer than `--slow-request`
//!   is logged once per episode (with the client, the request and how many connections
//!   it held up) and counted. The slot shows each turn's start: the master kills a worker
//!   it held up) and counted. The slot shows each turn's start: the master kills a worker

mod accepting;
mod completion;
mod connection;
mod drive;
mod memory;
mod publish;
mod turn;

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollFlags};
use nix::sys::signal::SigSet;

use crate::conn::step::Limits;
use crate::handler::RequestHandler;
use crate::net::listener::Listener;
use crate::net::tls::ForWorker;
use crate::peer_counts::PeerCounts;
use crate::scoreboard::{Board, Slot, State};
use crate::sys;

use super::ConnLimits;
use super::Setup;
use super::driver::{Driver, Extras, Serves, Shared, accepts_on};
use super::ledger::Ledger;
use super::reactor::{self, Token};
use super::serve::RequestLevel;

pub(crate) use completion::{Completion, HandOff, Inline, Start};

use accepting::Accepting;
use memory::Memory;
use publish::Publishing;
use turn::Reactor;

/// Descriptors a worker needs besides its connections (listeners, logs, epoll, the
/// master's channel, files the handler opens).
pub(crate) const SPARE_FDS: u64 = 64;

/// What a front watches the channel for: connections handed back.
const CHANNEL_IN: EpollFlags = EpollFlags::EPOLLIN.union(EpollFlags::EPOLLET);

/// The event driver (`--io event`, datagram listeners; a hybrid front is this driver with
/// its hand-off channel and the [`HandOff`] completion, `hybrid.rs`): its epoll instance,
/// made before `Ready`, and its own settings.
pub(crate) struct Event<'a> {
    prepared: Prepared,
    /// `--worker-connections`.
    max_connections: usize,
    /// `--slow-request`.
    slow_request: Option<Duration>,
    /// The event workers' connections by client address (`--max-conns-per-ip`).
    peers: Option<&'static PeerCounts>,
    /// The datagram side, when the server has a datagram handler (`Server::datagrams`): a
    /// source registered on the reactor.
    datagrams: Option<super::datagram::Datagrams<'a>>,
}

impl std::fmt::Debug for Event<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

impl<'a> Event<'a> {
    /// The driver for the listeners this process accepts on; `channel`: a hybrid front's
    /// end of the hand-off channel, watched too.
    pub(crate) fn new(
        setup: &Setup<'a>,
        slot: &'static Slot,
        extras: Extras<'a>,
        channel: Option<BorrowedFd<'a>>,
    ) -> Result<Self, String> {
        let serves = |i| accepts_on(setup, i);
        let prepared = prepare(setup.listeners, &serves, channel)?;
        let datagrams = match extras.datagrams {
            Some(h) => {
                let side = super::datagram::Side::new(h, setup.drivers.datagram, setup.id, slot, setup.board);
                Some(super::datagram::Datagrams::watch(
                    side,
                    setup.listeners,
                    &serves,
                    &prepared.epoll,
                )?)
            }
            None => None,
        };
        Ok(Event {
            prepared,
            max_connections: setup.drivers.worker_connections,
            slow_request: setup.drivers.slow_request,
            peers: setup.peers,
            datagrams,
        })
    }

    /// Serves the request level's connections with `shared` until a stop, a complete
    /// request going to the completion `make` returns (made once the worker's slot says it
    /// is an event loop).
    pub(crate) fn serve_with<C, M, H>(self, shared: Shared<'a>, level: &mut RequestLevel<H>, make: M) -> i32
    where
        C: Completion<'a>,
        M: FnOnce(Start) -> C,
        H: RequestHandler,
    {
        let (handler, limits) = level.parts();
        turn::serve(Loop::new(self, shared, limits, make), handler)
    }
}

impl<'a> Driver<'a> for Event<'a> {
    fn prepare(setup: &Setup<'a>, slot: &'static Slot, extras: Extras<'a>) -> Result<Self, String> {
        Event::new(setup, slot, extras, None)
    }
}

impl<'a, H: RequestHandler> Serves<'a, RequestLevel<H>> for Event<'a> {
    fn serve(self, shared: Shared<'a>, level: &mut RequestLevel<H>) -> i32 {
        self.serve_with(shared, level, Inline::new)
    }
}

/// The epoll instance and the listeners' registrations, made before the worker says it is
/// ready (a failure is a start failure).
#[derive(Debug)]
pub(crate) struct Prepared {
    epoll: Epoll,
    mask: SigSet,
}

/// Creates the worker's epoll instance (after the fork: never inherited) with the stream
/// listeners `serves` names (the datagram side registers its own), and blocks the flag
/// signals outside the wait. A hybrid front's hand-off channel (`front`) is registered
/// too, edge-triggered: connections handed back (in), room for the hand-offs it holds
/// (out).
pub(crate) fn prepare(
    listeners: &[Listener],
    serves: &dyn Fn(usize) -> bool,
    front: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<Prepared, String> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| format!("epoll_create: {e}"))?;
    let streams = |i: &usize| serves(*i) && !listeners[*i].is_datagram();
    for (i, l) in listeners.iter().enumerate().filter(|(i, _)| streams(i)) {
        register_listener(&epoll, l, i).map_err(|e| format!("watching {}: {e}", l.label()))?;
    }
    if let Some(fd) = front {
        // Out only while the front holds requests for want of room (`Front::wants_room`):
        // every hand-off a worker takes would otherwise wake the front.
        reactor::watch(&epoll, fd, CHANNEL_IN, Token::CHANNEL)
            .map_err(|e| format!("watching the hand-off channel: {e}"))?;
    }
    let mask = sys::block_flag_signals().map_err(|e| format!("blocking the stop signals: {e}"))?;
    Ok(Prepared { epoll, mask })
}

/// Registers stream listener `i` for accepting, level-triggered and exclusive (one waiting
/// worker woken per arrival).
fn register_listener(epoll: &Epoll, l: &Listener, i: usize) -> nix::Result<()> {
    let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE;
    reactor::watch(epoll, l.socket().as_fd(), flags, Token::listener(i))
}

/// What the loop serves with and never changes.
struct Config<'a> {
    id: u32,
    slot: &'a Slot,
    board: &'static Board,
    listeners: &'a [Listener],
    tls: &'a ForWorker,
    limits: ConnLimits,
    step_limits: Limits,
    /// `--max-conns-per-ip`, and the tables it is counted in.
    max_per_ip: Option<usize>,
    peers: Option<&'static PeerCounts>,
    /// `--worker-connections`.
    max_connections: usize,
}

/// The event loop: a sub-struct per role, each in its role's file.
pub(crate) struct Loop<'a, H: RequestHandler, C: Completion<'a>> {
    cfg: Config<'a>,
    /// The epoll instance, the connections, the timers, the ready list, the turn's clock.
    reactor: Reactor<'a, H>,
    accepting: Accepting,
    /// The budget of buffered bytes and the worker-wide buffers.
    memory: Memory,
    /// The counts and bytes on the scoreboard.
    publishing: Publishing,
    /// The accounts (requests, rejections, the recycling limit, the access log).
    ledger: Ledger<'a>,
    /// A stop began: no more accepting; the connections finish.
    stopping: bool,
    /// What a complete request becomes.
    completion: C,
    /// A source registered on the reactor beside the connections (the datagram side).
    source: Option<Box<dyn reactor::Source<Ledger<'a>> + 'a>>,
}

impl<'a, H: RequestHandler, C: Completion<'a>> Loop<'a, H, C> {
    fn new(
        driver: Event<'a>,
        shared: Shared<'a>,
        step_limits: Limits,
        make: impl FnOnce(Start) -> C,
    ) -> Self {
        let Event {
            prepared,
            max_connections,
            slow_request,
            peers,
            datagrams,
        } = driver;
        let Shared {
            id,
            board,
            slot,
            listeners,
            tls,
            limits,
            max_per_ip,
            ledger,
        } = shared;
        slot.set_event();
        let completion = make(Start {
            id,
            board,
            peers,
            slow_request,
        });
        board.set_state(id, State::Reading);
        Loop {
            cfg: Config {
                id,
                slot,
                board,
                listeners,
                tls,
                limits,
                step_limits,
                max_per_ip,
                peers,
                max_connections: max_connections.max(1),
            },
            reactor: Reactor::new(prepared.epoll, prepared.mask),
            accepting: Accepting::new(),
            memory: Memory::new(),
            publishing: Publishing::default(),
            ledger,
            stopping: false,
            completion,
            source: datagrams.map(|d| Box::new(d) as Box<dyn reactor::Source<Ledger<'a>> + 'a>),
        }
    }
}

//! The event loop (`--io event`): one epoll instance per worker, made after the fork, over
//! the worker's listeners and all its connections; the user's `RequestHandler` is called
//! inline for each complete request, through the same I/O-free steps as the blocking loop
//! (admission, `conn/step.rs`). What does not know about connections (the tokens epoll
//! carries, the slab that names connections by them, the timers, the ready list) is the
//! reactor underneath, `worker/reactor.rs`.
//!
//! What each turn does, and why (see also docs/ARCHITECTURE.md, "The event loop"):
//! - **Accepting without a thundering herd.** The master's listeners are shared by every
//!   worker. Each worker registers them level-triggered with `EPOLLEXCLUSIVE`: a new
//!   connection wakes one waiting worker (or a few), not all. Linux wakes the waiters in
//!   the order they registered, so the first worker would take nearly every connection of
//!   a lightly loaded server; a worker re-registers its listeners (delete and add: an
//!   exclusive registration cannot be modified) every [`REQUEUE_EVERY`] accepts, which puts
//!   it at the back of the queue. One accept per listener per turn, as nginx does by
//!   default (the listener is level-triggered: a connection left in the queue is
//!   reported again by the next wait, which does not block), so that a connection costs
//!   no `accept` that finds the queue empty (measured: 8.7 system calls per connection
//!   with up to 16 accepts per turn, 6.5 with one). A new connection is read at once: its
//!   request has usually arrived with it, which saves a turn (one `epoll_wait`).
//! - **Limits.** At `--worker-connections` open connections the worker takes its listeners
//!   out of its epoll set and puts them back below 7/8 of it; out of descriptors or memory
//!   (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) it pauses accepting for
//!   [`RESOURCE_BACKOFF`] instead of spinning on a listener that stays readable.
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
//!   ones every [`SIGNAL_CHECK`] (one `sigpending`).
//! - **Head-of-line guard.** Every handler call is timed; one longer than `--slow-request`
//!   is logged once per episode (with the client, the request and how many connections
//!   it held up) and counted. The slot shows each turn's start: the master kills a worker
//!   whose turn lasts longer than `--request-timeout` (a handler that blocked).

use std::io::Read;
use std::io::{self, IoSlice};
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::signal::SigSet;
use socket2::Socket;

use crate::codec::FileBody;
use crate::conn::buffers::{BUFFER_SIZE, Buffers};
use crate::conn::context::{Conn as HandlerConn, ConnInfo};
use crate::conn::send_watch::{SEND_CHECK, SendWatch};
use crate::conn::step::{self, Gathered, Next, Requests, Wait};
use crate::conn::transport::Transport;
use crate::handler::RequestHandler;
use crate::net::listener::{Addr, Listener};
use crate::net::tls::ForWorker;
use crate::peer_counts::PeerCounts;
use crate::scoreboard::{Board, ConnCounts, Slot, State};
use crate::sys::{self, exit};

use super::ConnLimits;
use super::Setup;
use super::accept::REQUEUE_EVERY;
use super::access::{End, Outcome};
use super::admission::{self, Admission, EventSeat};
use super::budget::{OVER_BUDGET_READ, SHED_BELOW, TRIM_ABOVE};
use super::driver::{Driver, Extras, Shared, accepts_on, rules};
use super::ledger::{Ledger, OncePerMinute, RESOURCE_BACKOFF, Trouble, contain, log_connection_error};
use super::reactor::{self, Kind, Queued, Ready, Slab, Timer, Timers, Token};
use super::serve::{Bound, Boundary, Connections, Context, Head, Limits, RequestDriver};

/// Events taken from the kernel per `epoll_wait`.
const EVENTS: usize = 512;
/// Reads of one connection per pass at most, when each fills the buffer (a client that
/// sends without pause must not keep the loop to itself).
const READS_PER_PASS: usize = 4;

/// How often a loop that never sleeps looks for pending signals (a stop is seen within
/// this, under any load).
const SIGNAL_CHECK: Duration = Duration::from_millis(50);
/// Descriptors a worker needs besides its connections (listeners, logs, epoll, the
/// master's channel, files the handler opens).
pub(crate) const SPARE_FDS: u64 = 64;

/// What a front watches the channel for: connections handed back.
const CHANNEL_IN: EpollFlags = EpollFlags::EPOLLIN.union(EpollFlags::EPOLLET);

/// The event driver (`--io event`, datagram listeners; a hybrid front is this driver with
/// its hand-off channel, `front.rs`): its epoll instance, made before `Ready`, and its own
/// settings.
pub(crate) struct Event<'a> {
    prepared: Prepared,
    /// `--worker-connections`.
    max_connections: usize,
    /// `--slow-request`.
    slow_request: Option<Duration>,
    /// The event workers' connections by client address (`--max-conns-per-ip`).
    peers: Option<&'static PeerCounts>,
    /// The datagram side, when the server has a datagram handler (`Server::datagrams`).
    datagrams: Option<super::datagram::Side<'a>>,
    /// Hybrid mode: this loop is a front, which hands complete requests to the workers
    /// over the channel whose end this is.
    front: Option<BorrowedFd<'a>>,
}

impl std::fmt::Debug for Event<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("max_connections", &self.max_connections)
            .field("front", &self.front.is_some())
            .finish_non_exhaustive()
    }
}

impl<'a> Event<'a> {
    /// The driver for the listeners this process accepts on; `front`: a hybrid front's end
    /// of the hand-off channel.
    pub(crate) fn new(
        setup: &Setup<'a>,
        slot: &'static Slot,
        extras: Extras<'a>,
        front: Option<BorrowedFd<'a>>,
    ) -> Result<Self, String> {
        let prepared = prepare(setup.listeners, &|i| accepts_on(setup, i), front)?;
        let datagrams = extras
            .datagrams
            .map(|h| super::datagram::Side::new(h, setup.datagram, setup.id, slot, setup.board));
        Ok(Event {
            prepared,
            max_connections: setup.worker_connections,
            slow_request: setup.slow_request,
            peers: setup.peers,
            datagrams,
            front,
        })
    }
}

impl<'a> Driver<'a> for Event<'a> {
    fn prepare(setup: &Setup<'a>, slot: &'static Slot, extras: Extras<'a>) -> Result<Self, String> {
        Event::new(setup, slot, extras, None)
    }

    fn serve<C: Connections>(self, shared: Shared<'a>, level: &mut C) -> i32 {
        level
            .drive_requests(Run { driver: self, shared })
            .unwrap_or_else(|| {
                tracing::error!("handle_client servers are blocking only (--io blocking)");
                exit::START_FAILED
            })
    }
}

/// The event loop as the request level's [`RequestDriver`]: the level hands it the user's
/// handler and the step's limits.
struct Run<'a> {
    driver: Event<'a>,
    shared: Shared<'a>,
}

impl RequestDriver for Run<'_> {
    fn drive<H: RequestHandler>(self, handler: &mut H, limits: Limits) -> i32 {
        serve(self.driver, self.shared, handler, limits)
    }
}

/// The epoll instance and the listeners' registrations, made before the worker says it is
/// ready (a failure is a start failure).
#[derive(Debug)]
pub(crate) struct Prepared {
    epoll: Epoll,
    mask: SigSet,
}

/// Creates the worker's epoll instance (after the fork: never inherited) with the
/// listeners `serves` names, and blocks the flag signals outside the wait. A hybrid
/// front's hand-off channel (`front`) is registered too, edge-triggered: connections handed
/// back (in), room for the hand-offs it holds (out).
pub(crate) fn prepare(
    listeners: &[Listener],
    serves: &dyn Fn(usize) -> bool,
    front: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<Prepared, String> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| format!("epoll_create: {e}"))?;
    for (i, l) in listeners.iter().enumerate().filter(|(i, _)| serves(*i)) {
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

/// Registers listener `i`: a stream listener for accepting, a datagram listener for
/// reading; both level-triggered and exclusive (one waiting worker woken per arrival).
fn register_listener(epoll: &Epoll, l: &Listener, i: usize) -> nix::Result<()> {
    let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE;
    let token = if l.is_datagram() {
        Token::datagram(i)
    } else {
        Token::listener(i)
    };
    reactor::watch(epoll, l.socket().as_fd(), flags, token)
}

/// What a connection waits for, for the counts on the scoreboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Reading,
    Writing,
    Idle,
}

/// What a connection does once its output is sent.
#[derive(Debug)]
enum Then {
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
enum Pending {
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
struct Connection<'a, H: RequestHandler> {
    transport: Transport,
    peer: Addr,
    /// Its number among this worker's connections ([`Conn::id`](crate::Conn::id)).
    id: u64,
    /// The listener that accepted it.
    listener: u32,
    /// In the epoll set: a connection is registered the first time it must wait (one whose
    /// request came with it and is answered, or handed off, at once never is).
    registered: bool,
    admission: Option<Box<Admission<'a, EventSeat>>>,
    step: Requests<H::Codec>,
    session: H::Session,
    pending: Pending,
    /// Private buffers (a partial request, unsent output); `None` while empty.
    bufs: Option<Box<Buffers>>,
    /// What the last edge and the last I/O said.
    readable: bool,
    writable: bool,
    closed_by_peer: bool,
    queued: Queued,
    /// Stopped reading at the budget of buffered bytes (in `Loop::paused`).
    paused: bool,
    /// Its one deadline (the wait's), and its entry in the loop's timers.
    timer: Timer,
    class: Class,
    /// The request in progress: the turn its first bytes came in.
    request: Option<Instant>,
    /// The I/O error that ended the connection, if one did (the access log's outcome).
    failed: Option<io::ErrorKind>,
    received: u64,
    sent: u64,
    /// How much of `received` and `sent` the loop has tallied for the scoreboard
    /// ([`Loop::tally`]).
    tallied: (u64, u64),
    /// The client's IP, counted for the per-address cap.
    counted_ip: Option<IpAddr>,
    /// `--min-send-rate`, while its output waits for the client; and what had been sent at
    /// the last check.
    watch: Option<Box<SendWatch>>,
    sent_at_check: u64,
}

impl<H: RequestHandler> Connection<'_, H> {
    /// The client's IP as counted for the per-address cap (after admission, or by the
    /// admission still in progress), taken: nobody counts it any more.
    fn take_counted(&mut self) -> Option<IpAddr> {
        self.counted_ip
            .take()
            .or_else(|| self.admission.as_ref().and_then(|a| a.seat().counted))
    }
}

/// The worker's side of a connection's step, for one pass.
struct Turn<'t, 'l> {
    ledger: &'t mut Ledger<'l>,
    stopping: bool,
    peer: &'t Addr,
    request: &'t mut Option<Instant>,
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
    fn at_boundary(&mut self, _: &Socket, _: Duration) -> Boundary {
        // Only a blocking driver waits at a boundary.
        Boundary::Wait
    }

    fn saturated(&mut self) -> bool {
        false
    }

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
        *self.request = Some(self.now);
        self.ledger.request_head(head);
    }

    fn request_head(&mut self, head: Head<'_>) {
        self.ledger.request_head(head);
    }

    fn refused(&mut self, _: &crate::codec::ProtocolError) {
        self.ledger.refused();
    }

    fn request_end(&mut self, bytes: (u64, u64), ok: bool) {
        let Some(started) = self.request.take() else {
            return;
        };
        let ended = self.handler_ended.take().unwrap_or_else(Instant::now);
        let took = ended.saturating_duration_since(started);
        self.ledger.slot().handler_done();
        self.ledger.request_end(self.peer, took, bytes, ok);
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

/// What a pass of a connection ended with.
enum Pass {
    /// Waiting (for an edge or its deadline).
    Wait,
    /// To be run again next turn.
    Ready,
    /// Closed.
    Closed,
    /// A hybrid front: to be handed to a worker, with what its buffers hold.
    HandOff,
}

/// The event loop.
struct Loop<'a, H: RequestHandler> {
    id: u32,
    slot: &'a Slot,
    listeners: &'a [Listener],
    epoll: Epoll,
    mask: SigSet,
    tls: &'a ForWorker,
    limits: ConnLimits,
    step_limits: Limits,
    max_per_ip: Option<usize>,
    max_connections: usize,
    /// The connections, by token (see reactor.rs).
    conns: Slab<Connection<'a, H>>,
    counts: ConnCounts,
    published: ConnCounts,
    /// Bytes read from and written to clients since the last [`publish`](Loop::publish):
    /// the slot's counters move once a turn, as the bytes do (issue 42: they moved when a
    /// connection closed, so keep-alive traffic showed 0).
    moved: (u64, u64),
    timers: Timers,
    ready: Ready,
    shared: Buffers,
    scratch: Vec<u8>,
    now: Instant,
    stopping: bool,
    accepting: bool,
    resume_at: Option<Instant>,
    since_requeue: u32,
    accept_trouble: Trouble,
    /// Connections accepted so far (each one's number, [`Conn::id`](crate::Conn::id)).
    accepted: u64,
    slow: Slow,
    /// The accounts (requests, rejections, the recycling limit, the access log).
    ledger: Ledger<'a>,
    peers: Option<&'static PeerCounts>,
    board: &'static Board,
    datagrams: Option<super::datagram::Side<'a>>,
    /// When a busy loop next looks for pending signals.
    signals_due: Instant,
    /// A hybrid front's side (`None` in an event worker).
    front: Option<super::front::Front<'a>>,
    /// Bytes held in connections' private read buffers (partial requests), against
    /// `limits.max_buffered`.
    buffered: usize,
    /// Connections that stopped reading at the budget (tokens), resumed when it has room.
    paused: Vec<Token>,
    /// Whether the connection being driven reads into the worker-wide buffers.
    pass_shared: bool,
    /// The token of the connection being driven.
    pass_token: Token,
    /// The budget's episode, for one log line per episode.
    budget_episode: Option<Instant>,
    /// How the codec refuses a request at the budget, for that line
    /// ([`refusal_words`](super::budget::refusal_words)).
    refusal: String,
    /// The most `buffered` held since memory was last given back (see [`Loop::trim`]).
    buffered_peak: usize,
    /// When memory was last given back.
    trimmed_at: Instant,
    /// When a trim held back by the once-a-second limit is due (see [`Loop::trim`]).
    trim_at: Option<Instant>,
}

/// Serves connections with `handler` until a stop; returns the worker's exit status.
fn serve<H: RequestHandler>(
    driver: Event<'_>,
    shared: Shared<'_>,
    handler: &mut H,
    step_limits: Limits,
) -> i32 {
    let mut lp = Loop::<H>::new(driver, shared, step_limits);
    lp.refusal = super::budget::refusal_words(handler.codec());
    let mut events = vec![EpollEvent::empty(); EVENTS];
    loop {
        lp.ledger.flush();
        lp.publish();
        if lp.stopping && lp.conns.is_empty() {
            if let Some(front) = lp.front.as_mut() {
                // Connections a worker handed back just as this front stopped taking them:
                // to the workers, rather than lost with this process.
                front.forward_late();
            }
            lp.watch_channel();
        }
        if lp.stopping && lp.conns.is_empty() && lp.front.as_ref().is_none_or(|f| f.idle()) {
            tracing::debug!("no connection left");
            if let Some(d) = lp.datagrams.as_mut() {
                if let Err(p) = contain(|| d.on_worker_exit()) {
                    tracing::error!("the datagram handler's on_worker_exit panicked: {}", p.0);
                }
            }
            return exit::OK;
        }
        let timeout = lp.wait_timeout();
        lp.slot.turn_end();
        let n = match sys::epoll_wait_signals(&lp.epoll, &mut events, timeout, &lp.mask) {
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

impl<'a, H: RequestHandler> Loop<'a, H> {
    fn new(driver: Event<'a>, shared: Shared<'a>, step_limits: Limits) -> Self {
        let Event {
            prepared,
            max_connections,
            slow_request,
            peers,
            datagrams,
            front,
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
        let front = front.map(|fd| super::front::Front::new(fd, id, board, peers));
        board.set_state(id, State::Reading);
        Loop {
            id,
            slot,
            listeners,
            epoll: prepared.epoll,
            mask: prepared.mask,
            tls,
            limits,
            step_limits,
            max_per_ip,
            max_connections: max_connections.max(1),
            conns: Slab::new(),
            counts: ConnCounts::default(),
            published: ConnCounts::default(),
            moved: (0, 0),
            timers: Timers::new(),
            ready: Ready::new(),
            shared: Buffers::new(),
            scratch: vec![0; 4096],
            now: Instant::now(),
            stopping: false,
            accepting: true,
            resume_at: None,
            since_requeue: 0,
            accept_trouble: Trouble::default(),
            accepted: 0,
            slow: Slow {
                limit: slow_request,
                episode: OncePerMinute::default(),
            },
            ledger,
            peers,
            board,
            datagrams,
            signals_due: Instant::now() + SIGNAL_CHECK,
            front,
            buffered: 0,
            paused: Vec::new(),
            pass_shared: false,
            pass_token: Token::default(),
            budget_episode: None,
            refusal: String::new(),
            buffered_peak: 0,
            trimmed_at: Instant::now(),
            trim_at: None,
        }
    }

    /// One turn's work after the wait: the flags, the events, the ready list, the timers.
    fn turn(&mut self, events: &[EpollEvent], handler: &mut H) {
        self.now = Instant::now();
        self.slot.turn_begin(crate::scoreboard::now_ns());
        // A loop whose waits always find events ready (or that never waits, its ready
        // list never empty) is never interrupted by a signal: look for a pending stop or
        // reopen now and then (see `sys::let_in_pending_signals`).
        if self.now >= self.signals_due {
            self.signals_due = self.now + SIGNAL_CHECK;
            sys::let_in_pending_signals(&self.mask);
        }
        if sys::stop_requested() && !self.stopping {
            self.begin_stop();
        }
        if let Some(front) = self.front.as_mut() {
            // Before admission counts anyone: the clients the workers have taken.
            front.settle();
        }
        if sys::take_reopen_request() {
            self.ledger.reopen();
        }
        // The ready list as it stands: connections queued during this turn wait for the
        // next one.
        let mut ready = self.ready.snapshot();
        for ev in events {
            let token = Token::from_data(ev.data());
            match token.kind() {
                Kind::Connection => self.event(token, ev.events(), handler),
                Kind::Channel => self.channel_event(ev.events(), handler),
                Kind::Datagram(index) => self.datagrams_readable(index),
                Kind::Listener(_) if ev.events().contains(EpollFlags::EPOLLHUP) => {
                    // The master shut the listeners down: a stop.
                    if !self.stopping {
                        self.begin_stop();
                    }
                }
                Kind::Listener(index) => self.accept(index, handler),
            }
        }
        while let Some(token) = self.ready.next(&mut ready) {
            if let Some(c) = self.conns.get_mut(token) {
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
}

impl<'a, H: RequestHandler> Loop<'a, H> {
    /// Whether the connections' buffers hold the budget of `--max-buffered-bytes`.
    fn over_budget(&self) -> bool {
        self.limits.max_buffered > 0 && self.held_total() >= self.limits.max_buffered
    }

    /// What the budget counts: the connections' buffers, and in a front the requests
    /// handed off but not yet in a worker (held for room in the channel, or spooled in
    /// it): those leave the connection, not the front's memory, while the workers are all
    /// busy.
    fn held_total(&self) -> usize {
        self.buffered + self.front.as_ref().map_or(0, super::front::Front::memory)
    }

    /// Connections paused at the budget read again once it has room (an eighth of it, so
    /// that they do not pause again at their first read).
    fn resume_paused(&mut self) {
        if self.paused.is_empty() {
            return;
        }
        let room = self.limits.max_buffered / 8;
        if self.held_total().saturating_add(room) > self.limits.max_buffered {
            return;
        }
        if let Some(since) = self.budget_episode.take() {
            tracing::info!(
                "buffered request bytes under --max-buffered-bytes {} again after {:.1?}: {} paused connection(s) read again",
                self.limits.max_buffered,
                self.now.saturating_duration_since(since),
                self.paused.len()
            );
        }
        for token in std::mem::take(&mut self.paused) {
            if let Some(c) = self.conns.get_mut(token) {
                c.paused = false;
                self.ready.push(&mut c.queued, token);
            }
        }
    }

    /// Gives memory back to the system once the buffers of a flood are freed: when what
    /// the connections' buffers hold has fallen to a quarter of a peak of at least
    /// [`TRIM_ABOVE`], at most once a second (`sys::release_free_memory`). A trim held
    /// back by that second is due later ([`Loop::trim_at`], a wake-up of the wait): the
    /// clients of a flood may all be gone by then, and an idle loop has no turn that
    /// would make it (issue 41).
    fn trim(&mut self) {
        self.buffered_peak = self.buffered_peak.max(self.buffered);
        self.trim_at = None;
        if self.buffered_peak >= TRIM_ABOVE && self.buffered <= self.buffered_peak / 4 {
            let due = self.trimmed_at + Duration::from_secs(1);
            if self.now >= due {
                sys::release_free_memory();
                self.trimmed_at = self.now;
                self.buffered_peak = self.buffered;
            } else {
                self.trim_at = Some(due);
            }
        }
    }

    /// The first time in an episode that the budget stops a read: one line.
    fn budget_reached(&mut self) {
        if self.budget_episode.is_none() {
            self.budget_episode = Some(self.now);
            tracing::warn!(
                "buffered request bytes reached --max-buffered-bytes {} ({} connections open): pausing the connections that hold the most, refusing new large requests with {}",
                self.limits.max_buffered,
                self.conns.len(),
                self.refusal
            );
        }
    }

    /// The wait's timeout: none when connections are ready, else until the earliest timer.
    fn wait_timeout(&mut self) -> Option<Duration> {
        if !self.ready.is_empty() {
            return Some(Duration::ZERO);
        }
        let next = self
            .timers
            .earliest()
            .into_iter()
            .chain(self.resume_at)
            .chain(self.trim_at)
            .min()?;
        Some(next.saturating_duration_since(Instant::now()))
    }

    /// Reads and answers what datagram listener `index` holds.
    fn datagrams_readable(&mut self, index: usize) {
        if self.stopping {
            return;
        }
        let Some(side) = self.datagrams.as_mut() else {
            return;
        };
        side.readable(&self.listeners[index], &mut self.ledger);
    }

    /// Publishes the counts on the scoreboard when they changed, and the bytes moved since
    /// the last turn (a few stores per turn).
    fn publish(&mut self) {
        if let Some(d) = self.datagrams.as_mut() {
            d.publish();
        }
        if self.moved != (0, 0) {
            self.slot.add_bytes(self.moved.0, self.moved.1);
            self.moved = (0, 0);
        }
        self.counts.open = self.conns.len() as u32;
        if self.counts != self.published {
            self.slot.publish_counts(self.counts);
            self.published = self.counts;
        }
    }

    /// A stop (or a retirement's stop, a reload, an upgrade): accept no more; idle
    /// keep-alive connections of protocols that can announce a close are drained (their
    /// next request, if it comes within the drain wait, is answered as the last).
    fn begin_stop(&mut self) {
        self.stopping = true;
        crate::conn::id::set_stopping();
        self.board.set_state(self.id, State::Finishing);
        if self.front.is_some() {
            // Connections handed back go to the fronts that stay (a reload's next
            // generation), or stay with their workers (a stop).
            self.board.set_receiving(self.id, false);
        }
        self.pause_accepting();
        // Datagrams: what the sockets hold now is read and answered once more, then the
        // sockets are no longer watched (the next generation, or nobody at a stop, reads
        // what comes later: see datagram.rs).
        if let Some(side) = self.datagrams.as_mut() {
            for l in self.listeners.iter().filter(|l| l.is_datagram()) {
                side.drain(l, &mut self.ledger);
                let _ = self.epoll.delete(l.socket().as_fd());
            }
        }
        for (token, c) in self.conns.iter_mut() {
            if matches!(c.pending, Pending::Read { wait: Wait::Idle }) {
                c.pending = Pending::Advance;
                self.ready.push(&mut c.queued, token);
            }
        }
        tracing::debug!("stopping: {} connections to finish", self.conns.len());
    }

    /// Takes the listeners out of the epoll set (an exclusive registration cannot be
    /// modified), shown on the slot.
    fn pause_accepting(&mut self) {
        if self.accepting {
            self.unregister_listeners();
            self.accepting = false;
            self.slot.set_accepts_paused(true);
        }
    }

    /// The stream listeners only: datagram listeners stay registered until the stop
    /// (`--worker-connections` limits connections, not datagrams).
    fn unregister_listeners(&self) {
        for (_, l) in self.stream_listeners() {
            let _ = self.epoll.delete(l.socket().as_fd());
        }
    }

    /// The stream listeners this loop accepts on: all of them, but a hybrid front leaves
    /// the TLS ones to the workers.
    fn stream_listeners(&self) -> impl Iterator<Item = (usize, &'a Listener)> + '_ {
        let tls = self.tls;
        let front = self.front.is_some();
        self.listeners
            .iter()
            .enumerate()
            .filter(move |(i, l)| !(l.is_datagram() || front && tls.acceptor(*i).is_some()))
    }

    fn register_listeners(&self) {
        for (i, l) in self.stream_listeners() {
            if let Err(e) = register_listener(&self.epoll, l, i) {
                tracing::error!("watching {} again: {e}", l.local_addr());
            }
        }
    }

    /// What counts against `--worker-connections`: the open connections, and those a
    /// front holds with a whole request for want of room in the channel (workers
    /// saturated: the listen queue pushes back on new clients then).
    fn load(&self) -> usize {
        self.conns.len() + self.front.as_ref().map_or(0, super::front::Front::held)
    }

    /// Puts the listeners back when below the limit again and not paused for resources.
    fn resume_accepting(&mut self) {
        if self.accepting || self.stopping {
            return;
        }
        if self.resume_at.is_some_and(|t| self.now < t) {
            return;
        }
        self.resume_at = None;
        if self.load() > self.max_connections - self.max_connections / 8 {
            return;
        }
        self.register_listeners();
        self.accepting = true;
        self.since_requeue = 0;
        self.slot.set_accepts_paused(false);
    }

    /// Accepts a connection from listener `index` (one per turn: see the module's notes).
    fn accept(&mut self, index: usize, handler: &mut H) {
        if !self.accepting {
            return;
        }
        if self.load() >= self.max_connections {
            tracing::debug!(
                "{} connections open (--worker-connections): not accepting until some close",
                self.load()
            );
            self.pause_accepting();
            return;
        }
        let listener = &self.listeners[index];
        match listener
            .socket()
            .accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
        {
            Ok((socket, peer)) => {
                self.accept_trouble.cleared();
                self.add(socket, Addr::from_sockaddr(&peer), index, handler);
                self.since_requeue += 1;
            }
            Err(e) => match Errno::from_raw(e.raw_os_error().unwrap_or(0)) {
                Errno::EAGAIN | Errno::EINTR => {}
                e if super::accept::connection_error(e) => {}
                Errno::EINVAL => {
                    if !self.stopping {
                        self.begin_stop();
                    }
                }
                other => {
                    self.accept_trouble.began(other, "accepting connections");
                    self.pause_accepting();
                    self.resume_at = Some(self.now + RESOURCE_BACKOFF);
                }
            },
        }
        if self.since_requeue >= REQUEUE_EVERY && self.accepting {
            // To the back of the listeners' queues of waiters: the next connection wakes
            // another worker first.
            self.since_requeue = 0;
            self.unregister_listeners();
            self.register_listeners();
        }
    }

    /// An edge on a hybrid front's hand-off channel: room for the requests it holds,
    /// connections handed back.
    fn channel_event(&mut self, events: EpollFlags, handler: &mut H) {
        let Some(mut front) = self.front.take() else {
            return;
        };
        let receiving = !self.stopping;
        // Taken back once the front is in its place again: a connection that comes back
        // with the beginning of a request is driven at once, and must run the front's
        // path (gather, then hand off), not an event worker's handler path, which is what
        // the loop runs while `self.front` is out.
        let mut back = Vec::new();
        front.on_edge(events, receiving, &mut |socket, meta, bytes| {
            back.push((socket, meta, bytes.to_vec()));
        });
        self.front = Some(front);
        for (socket, meta, bytes) in back {
            self.take_back(socket, meta, &bytes, handler);
        }
        self.watch_channel();
    }

    /// A front watches the channel for room only while it holds requests for want of it.
    fn watch_channel(&mut self) {
        let Some(front) = self.front.as_mut() else { return };
        let Some(wants) = front.room_watch_changed() else {
            return;
        };
        let flags = if wants {
            CHANNEL_IN | EpollFlags::EPOLLOUT
        } else {
            CHANNEL_IN
        };
        if let Err(e) = reactor::rewatch(&self.epoll, front.channel(), flags, Token::CHANNEL) {
            tracing::error!("watching the hand-off channel: {e}");
        }
    }

    /// A connection a worker handed back: into the loop as an idle keep-alive connection
    /// (already admitted), read at once (its next request may be there), or with the
    /// beginning of a request the worker read (`bytes`), which it gathers on from.
    fn take_back(&mut self, socket: Socket, meta: crate::net::handoff::Meta, bytes: &[u8], handler: &mut H) {
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
        self.insert(socket, peer, listener, handler, Some(back));
    }

    /// A new connection: registered once, then admitted and served.
    fn add(&mut self, socket: Socket, peer: Addr, listener: usize, handler: &mut H) {
        self.insert(socket, peer, listener, handler, None);
    }

    /// A connection into the loop: a new one (`returned` is `None`: admitted first), or
    /// one a worker handed back.
    fn insert(
        &mut self,
        socket: Socket,
        peer: Addr,
        listener: usize,
        handler: &mut H,
        returned: Option<Back<'_>>,
    ) {
        if returned.is_none() {
            self.accepted += 1;
            self.slot.accepted();
        }
        let rules = rules(self.listeners, self.tls, &self.limits, self.max_per_ip, listener);
        let mut step = Requests::new(handler.codec(), self.step_limits.clone());
        if let Some(back) = &returned {
            step.resume(back.served, back.interim_sent);
        }
        let mut c = Connection {
            transport: Transport::new(socket),
            peer: peer.clone(),
            id: self.accepted,
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
            request: None,
            failed: None,
            received: 0,
            sent: 0,
            tallied: (0, 0),
            counted_ip: None,
            watch: None,
            sent_at_check: 0,
        };
        if let (Some(_), Some(peers), Some(ip)) = (&returned, self.peers, peer.ip()) {
            // Back from a worker: counted here again for the per-address cap.
            if peers.add(self.id, ip) {
                c.counted_ip = Some(ip);
            }
        }
        if let Some(bytes) = returned.as_ref().map(|b| b.bytes).filter(|b| !b.is_empty()) {
            // The beginning of a request: decoded first, then read on.
            let mut bufs = Buffers::none();
            bufs.extend_input(bytes);
            // Counted against the budget of buffered bytes, as `close` will uncount it.
            self.buffered += bufs.input_capacity();
            c.bufs = Some(Box::new(bufs));
            c.pending = Pending::Advance;
        } else if returned.is_some() || rules.open_to(&peer) {
            if returned.is_none() {
                self.ledger.connection();
            }
            c.pending = Pending::Read { wait: Wait::Idle };
            let first = c.step.first_read();
            if let Next::Read { timeout, .. } = first {
                c.timer.deadline = timeout.map(|t| self.now + t);
            }
        } else {
            let now = self.now;
            c.admission = Some(Box::new(Admission::start(
                rules,
                peer,
                EventSeat {
                    id: self.id,
                    peers: self.peers,
                    counted: None,
                    workers: self.front.is_some().then_some(self.board),
                },
                &mut || now,
            )));
        }
        self.counts.reading += 1;
        let token = self.conns.insert(c);
        // Before its first request is handled, in this turn: a handler call that blocks
        // the loop is reported with every connection it holds up.
        self.publish();
        self.run(token, handler);
    }

    /// An edge on connection `token`.
    fn event(&mut self, token: Token, events: EpollFlags, handler: &mut H) {
        let Some(c) = self.conns.get_mut(token) else {
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
        let now = self.now;
        while let Some((t, token)) = self.timers.pop_due(now) {
            let Some(c) = self.conns.get_mut(token) else {
                continue;
            };
            if self.timers.expired(&mut c.timer, token, t, now) {
                self.timed_out(token, handler);
            }
        }
    }

    /// Runs a connection as far as it goes without waiting.
    fn run(&mut self, token: Token, handler: &mut H) {
        let Some(mut c) = self.conns.take(token) else {
            return;
        };
        let mut private = c.bufs.take();
        let using_shared = private.is_none();
        self.buffered -= held(private.as_deref()) + c.step.kept_capacity();
        self.pass_shared = using_shared;
        self.pass_token = token;
        // Lent out of the loop for the pass, which also borrows the loop.
        let mut shared = std::mem::replace(&mut self.shared, Buffers::none());
        let outcome = {
            let bufs: &mut Buffers = match private.as_deref_mut() {
                Some(b) => b,
                None => &mut shared,
            };
            match contain(|| self.drive(&mut c, bufs, handler)) {
                Ok(pass) => pass,
                Err(panic) => {
                    let others = self.conns.len();
                    if let Some(started) = c.request.take() {
                        // Its line, by the one rule (a panic is an `error`), before the
                        // lines are written out.
                        let outcome = Outcome::of(End::Panicked);
                        let bytes = (c.received, c.sent);
                        self.ledger
                            .request_unanswered(&c.peer, outcome, started.elapsed(), bytes);
                    }
                    sys::exit_now(self.ledger.panicked(
                        format_args!("handler panicked while serving {}", c.peer),
                        &panic,
                        &format!(
                            "connection closed, this worker exits and is replaced (closing its {others} other connections)"
                        ),
                    ))
                }
            }
        };
        self.shared = shared;
        self.tally(&mut c);
        if matches!(outcome, Pass::Closed | Pass::HandOff) {
            // Counted again for the moment, as a connection in the slab is: `close` and
            // `forget` uncount what a connection holds (its buffers are dropped with it).
            self.buffered += c.step.kept_capacity();
        }
        if let Pass::Closed = outcome {
            if c.request.is_some() && self.ledger.logs_access() {
                // The line of its unanswered request names that request (its bytes as they
                // came), whatever began on other connections since.
                let bufs = private.as_deref().unwrap_or(&self.shared);
                self.ledger.access_head(c.step.as_read(bufs));
            }
            self.shared.discard_input();
            self.shared.output().clear();
            self.close(token, c);
            return;
        }
        if let Pass::HandOff = outcome {
            self.hand_off(token, c, private.as_deref());
            return;
        }
        // Private buffers only for what is left; empty ones are given back.
        if using_shared {
            if !self.shared.is_empty() {
                c.bufs = Some(Box::new(self.shared.take_leftover()));
            }
        } else if let Some(b) = private {
            if !b.is_empty() {
                c.bufs = Some(b);
            }
        }
        self.buffered += held(c.bufs.as_deref()) + c.step.kept_capacity();
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
            if let Err(e) = reactor::watch(&self.epoll, c.transport.socket().as_fd(), flags, token) {
                tracing::warn!("watching a connection from {}: {e}; closing it", c.peer);
                self.close(token, c);
                return;
            }
            c.registered = true;
        }
        self.timers.arm(&mut c.timer, token);
        if let Pass::Ready = outcome {
            self.ready.push(&mut c.queued, token);
        }
        self.conns.put_back(token, c);
    }

    fn count(&mut self, class: Class) {
        match class {
            Class::Reading => self.counts.reading += 1,
            Class::Writing => self.counts.writing += 1,
            Class::Idle => self.counts.idle_keepalive += 1,
        }
    }

    fn uncount(&mut self, class: Class) {
        let n = match class {
            Class::Reading => &mut self.counts.reading,
            Class::Writing => &mut self.counts.writing,
            Class::Idle => &mut self.counts.idle_keepalive,
        };
        *n = n.saturating_sub(1);
    }

    /// A connection's deadline passed.
    fn timed_out(&mut self, token: Token, handler: &mut H) {
        let Some(c) = self.conns.get_mut(token) else {
            return;
        };
        match c.pending {
            Pending::Read { .. } => {
                c.pending = Pending::TimedOut;
                self.run(token, handler);
            }
            Pending::Admit => {
                if let Some(a) = c.admission.as_mut() {
                    a.deadline_passed(self.now);
                }
                self.run(token, handler);
            }
            Pending::Output(_) | Pending::File { .. } => {
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
                        c.timer.deadline = Some(self.now + SEND_CHECK);
                        self.timers.arm(&mut c.timer, token);
                    }
                    Err(e) => {
                        tracing::info!("connection from {}: {e}", c.peer);
                        // Cut off at once: the kernel must not go on trickling the rest.
                        let mut c = self.conns.take(token).expect("present");
                        c.failed = Some(e.kind());
                        let _ = c.transport.socket().set_linger(Some(Duration::ZERO));
                        self.close(token, c);
                    }
                }
            }
            // On the ready list: its run sets the deadline of what it waits for next (a
            // client that pipelines without pause is not cut by an old keep-alive one).
            Pending::Advance | Pending::TimedOut => {}
            Pending::Linger { .. } | Pending::Done => {
                let c = self.conns.take(token).expect("present");
                self.close(token, c);
            }
        }
    }

    /// Closes a connection: out of the epoll set (closing the socket does it), its counts
    /// and its place freed.
    fn close(&mut self, token: Token, mut c: Connection<'a, H>) {
        if let Some(started) = c.request.take() {
            // A request left unanswered when the connection ended.
            self.slot.handler_done();
            if self.ledger.logs_access() {
                if let Some(bufs) = c.bufs.as_deref() {
                    // Closed outside its pass (a deadline): its bytes are in its buffers.
                    self.ledger.access_head(c.step.as_read(bufs));
                }
                // By the one rule (issue 42): refused with the codec's error reply, cut
                // at a deadline, or lost (the client left, an error). A hybrid front's
                // requests too: one it refuses, times out or loses gets its line here.
                let outcome = Outcome::of(match (c.step.rejected(), c.failed) {
                    (Some((why, _)), _) => End::Refused(why),
                    (None, Some(kind)) => End::Failed(kind),
                    (None, None) => End::Dropped,
                });
                let bytes = (c.received, c.sent);
                self.ledger
                    .request_unanswered(&c.peer, outcome, started.elapsed(), bytes);
            }
        }
        self.forget(token, c);
    }

    /// A hybrid front hands connection `token` to a worker, with what its buffers hold
    /// (`private`, or the loop's shared ones), as it was read.
    fn hand_off(&mut self, token: Token, mut c: Connection<'a, H>, private: Option<&Buffers>) {
        // Out of this loop's epoll set first: a registration follows the open file, which
        // the worker shares from now on, not this process's descriptor.
        if c.registered {
            let _ = self.epoll.delete(c.transport.socket().as_fd());
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
        let counted = c.take_counted();
        let bytes = c.step.as_read(private.unwrap_or(&self.shared));
        let front = self.front.as_mut().expect("only a front hands off");
        front.hand_off(c.transport.socket(), meta, bytes, counted);
        self.watch_channel();
        self.shared.discard_input();
        self.shared.output().clear();
        self.forget(token, c);
    }

    /// Connection `token` leaves the loop (closed, or handed to a worker by a hybrid front,
    /// which counts it for the per-address cap from then on): its counts and its place are
    /// freed, its socket closed here.
    fn forget(&mut self, token: Token, mut c: Connection<'a, H>) {
        self.buffered -= held(c.bufs.as_deref()) + c.step.kept_capacity();
        self.uncount(c.class);
        self.tally(&mut c);
        self.uncount_peer(&mut c);
        drop(c);
        self.conns.release(token);
    }

    /// Adds what connection `c` read and wrote since its last tally to the bytes the next
    /// [`publish`](Loop::publish) counts: after each pass, and when it leaves.
    fn tally(&mut self, c: &mut Connection<'a, H>) {
        self.moved.0 += c.received - c.tallied.0;
        self.moved.1 += c.sent - c.tallied.1;
        c.tallied = (c.received, c.sent);
    }

    fn uncount_peer(&mut self, c: &mut Connection<'a, H>) {
        if let (Some(ip), Some(peers)) = (c.take_counted(), self.peers) {
            peers.remove(self.id, ip);
        }
    }

    /// The connection's pass: as far as it goes without waiting.
    fn drive(&mut self, c: &mut Connection<'a, H>, bufs: &mut Buffers, handler: &mut H) -> Pass {
        let mut reads = 0;
        loop {
            let waits = match std::mem::replace(&mut c.pending, Pending::Done) {
                Pending::Admit => self.admit(c, bufs, handler),
                Pending::Output(then) => match self.flush(c, bufs) {
                    Ok(true) => self.output_sent(c, then),
                    Ok(false) => {
                        c.pending = Pending::Output(then);
                        self.write_deadline(c);
                        Some(Pass::Wait)
                    }
                    Err(e) => {
                        log_connection_error(&c.peer, &e);
                        c.failed = Some(e.kind());
                        Some(Pass::Closed)
                    }
                },
                Pending::File { body, offset, left } => match self.send_file(c, bufs, body, offset, left) {
                    Ok(None) => {
                        let next = self.advance(c, bufs, handler);
                        self.follow(c, next);
                        None
                    }
                    Ok(Some(pending)) => {
                        c.pending = pending;
                        self.write_deadline(c);
                        Some(Pass::Wait)
                    }
                    Err(e) => {
                        log_connection_error(&c.peer, &e);
                        c.failed = Some(e.kind());
                        Some(Pass::Closed)
                    }
                },
                Pending::Advance => {
                    let next = self.advance(c, bufs, handler);
                    self.follow(c, next);
                    None
                }
                Pending::TimedOut => {
                    let mut quiet = Quiet {
                        stopping: self.stopping,
                        slot: self.slot,
                    };
                    let next = c.step.timed_out(bufs, &mut quiet, &c.peer, self.now);
                    self.follow(c, Gathered::Step(next));
                    None
                }
                Pending::Read { wait } => self.read(c, bufs, handler, wait, &mut reads),
                Pending::Linger { discarded } => {
                    c.pending = Pending::Linger { discarded };
                    Some(if self.discard(c) { Pass::Closed } else { Pass::Wait })
                }
                Pending::Done => Some(Pass::Closed),
            };
            if let Some(pass) = waits {
                return pass;
            }
        }
    }

    /// The output went out: what the step asked for next (`None`: go on now).
    fn output_sent(&mut self, c: &mut Connection<'a, H>, then: Then) -> Option<Pass> {
        // The client took the response: the next one starts afresh.
        c.watch = None;
        c.step.output_sent(&mut Quiet {
            stopping: self.stopping,
            slot: self.slot,
        });
        match then {
            Then::Read { wait, timeout } => {
                c.timer.deadline = timeout.map(|t| self.now + t);
                c.pending = Pending::Read { wait };
                None
            }
            Then::Yield => {
                c.pending = Pending::Advance;
                Some(Pass::Ready)
            }
            Then::HandOff => Some(Pass::HandOff),
            Then::Close { linger } => {
                c.transport.close_notify();
                if c.transport.records_pending() && c.writable {
                    let _ = c.transport.write_records();
                }
                match linger {
                    Some(d) if c.transport.shutdown(std::net::Shutdown::Write).is_ok() => {
                        c.timer.deadline = Some(self.now + d);
                        c.pending = Pending::Linger { discarded: 0 };
                        if d.is_zero() {
                            // Only what has arrived: never wait.
                            self.discard(c);
                            return Some(Pass::Closed);
                        }
                        None
                    }
                    _ => Some(Pass::Closed),
                }
            }
        }
    }

    /// Waiting for input: one read when the socket may have some, then the step on what
    /// came (`None`: go on now).
    fn read(
        &mut self,
        c: &mut Connection<'a, H>,
        bufs: &mut Buffers,
        handler: &mut H,
        wait: Wait,
        reads: &mut usize,
    ) -> Option<Pass> {
        if !c.readable && !c.closed_by_peer && !c.transport.input_pending() {
            c.pending = Pending::Read { wait };
            return Some(Pass::Wait);
        }
        if *reads == READS_PER_PASS {
            c.pending = Pending::Read { wait };
            return Some(Pass::Ready);
        }
        *reads += 1;
        let mut max = c.step.max_request_size();
        // At the budget of buffered bytes, a buffer does not grow: a connection with
        // nothing buffered reads a request head's worth into the worker-wide buffer, one
        // that has private buffers reads into the room they have.
        let over = self.over_budget();
        let (pending, capacity) = (bufs.unconsumed().len(), bufs.input_capacity());
        let mut take = usize::MAX;
        if over {
            if self.pass_shared {
                take = OVER_BUDGET_READ.saturating_sub(pending);
            } else {
                max = max.min(capacity);
            }
        }
        let room = bufs.room(max);
        let room = if room.len() > take {
            &mut room[..take]
        } else {
            room
        };
        let room_len = room.len();
        if over && room_len == 0 && pending < c.step.max_request_size() {
            return self.out_of_budget(c, bufs, wait, capacity);
        }
        match c.transport.read(room) {
            Ok(0) if room_len > 0 => {
                let next = c.step.peer_closed(bufs);
                if let Next::Fail(e) = &next {
                    tracing::debug!("connection from {} ended early: {e}", c.peer);
                    c.failed = Some(e.kind());
                    return Some(Pass::Closed);
                }
                self.follow(c, Gathered::Step(next));
                None
            }
            Ok(n) => {
                bufs.filled(n);
                c.received += n as u64;
                if n < room_len && !c.transport.is_tls() {
                    // A short read drained the socket: the next edge says when more comes.
                    c.readable = false;
                }
                let now = self.now;
                c.step.received(&mut || now);
                let next = self.advance(c, bufs, handler);
                self.follow(c, next);
                None
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                c.readable = false;
                c.pending = Pending::Read { wait };
                Some(Pass::Wait)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                c.pending = Pending::Read { wait };
                None
            }
            Err(e) => {
                log_connection_error(&c.peer, &e);
                c.failed = Some(e.kind());
                Some(Pass::Closed)
            }
        }
    }

    /// A request needs more memory than the budget of buffered bytes has (its buffer,
    /// `capacity` bytes, is full): refused if it is only starting (the codec's refusal,
    /// then a lingering close), else paused until the budget has room (what the client
    /// sends stays in the socket, and TCP pushes back on it). `None`: go on now.
    fn out_of_budget(
        &mut self,
        c: &mut Connection<'a, H>,
        bufs: &mut Buffers,
        wait: Wait,
        capacity: usize,
    ) -> Option<Pass> {
        self.budget_reached();
        if self.pass_shared || capacity <= SHED_BELOW {
            let mut quiet = Quiet {
                stopping: self.stopping,
                slot: self.slot,
            };
            let next = c.step.shed(bufs, &mut quiet, &c.peer, super::budget::REFUSAL);
            self.follow(c, Gathered::Step(next));
            return None;
        }
        if !c.paused {
            c.paused = true;
            self.paused.push(self.pass_token);
        }
        c.pending = Pending::Read { wait };
        Some(Pass::Wait)
    }

    /// Reads and drops what the client still sends, in a lingering close: true when done
    /// (its close, an error, or enough bytes).
    fn discard(&mut self, c: &mut Connection<'a, H>) -> bool {
        let Pending::Linger { discarded } = &mut c.pending else {
            return true;
        };
        loop {
            match c.transport.discard(&mut self.scratch, false) {
                Ok(0) => return true,
                Ok(n) => {
                    *discarded += n;
                    if *discarded >= step::LINGER_BYTES {
                        return true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.readable = false;
                    return false;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }

    /// Sets the write deadline of a connection whose output waits for the socket: the write
    /// timeout, or with `--min-send-rate` a check every second (the watch keeps the write
    /// timeout then, as it does for the blocking loop).
    fn write_deadline(&self, c: &mut Connection<'a, H>) {
        if self.limits.min_send_rate > 0 {
            // The first wait of this output starts the checks; later waits keep their
            // cadence (the deadline is the next check).
            if c.watch.is_none() {
                c.watch = Some(Box::new(SendWatch::new(
                    self.limits.min_send_rate,
                    self.limits.write_timeout,
                )));
                c.sent_at_check = c.sent;
                c.timer.deadline = Some(self.now + SEND_CHECK);
            }
        } else {
            c.timer.deadline = self.limits.write_timeout.map(|t| self.now + t);
        }
    }

    /// Turns the step's answer into the connection's next move.
    fn follow(&mut self, c: &mut Connection<'a, H>, next: Gathered) {
        let next = match next {
            Gathered::Whole => {
                c.pending = Pending::Output(Then::HandOff);
                return;
            }
            Gathered::Step(next) => next,
        };
        c.pending = match next {
            Next::Read { wait, timeout, .. } => Pending::Output(Then::Read { wait, timeout }),
            Next::More => Pending::Output(Then::Yield),
            // Straight to the file, the head still in the output: a small file is copied
            // after it (one write for both), a large one follows it (MSG_MORE).
            Next::SendFile(body) => Pending::File {
                offset: body.range.start,
                left: body.range.end.saturating_sub(body.range.start),
                body,
            },
            Next::Close { linger } => Pending::Output(Then::Close { linger }),
            Next::Fail(e) => {
                log_connection_error(&c.peer, &e);
                c.failed = Some(e.kind());
                Pending::Output(Then::Close { linger: None })
            }
        };
    }

    /// One call of the step with the handler bound to the connection.
    /// In a front, the step only gathers the request ([`Gathered::Whole`]: hand it off).
    fn advance(&mut self, c: &mut Connection<'a, H>, bufs: &mut Buffers, handler: &mut H) -> Gathered {
        if let Some(front) = self.front.as_mut() {
            let mut gather = Gather {
                ledger: &mut self.ledger,
                stopping: self.stopping,
                request: &mut c.request,
                now: self.now,
            };
            let now = self.now;
            return c
                .step
                .complete(bufs, front.scratch(), &mut gather, &c.peer, &mut || now);
        }
        let mut ctx = Turn {
            ledger: &mut self.ledger,
            stopping: self.stopping,
            peer: &c.peer,
            request: &mut c.request,
            now: self.now,
            slow: &mut self.slow,
            handler_started: None,
            handler_ended: None,
            last_end: None,
            open: self.conns.len(),
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
        let now = self.now;
        Gathered::Step(c.step.advance(bufs, &mut bound, &mut ctx, &c.peer, &mut || now))
    }

    /// Writes the pending output (and TLS records): `Ok(true)` when all of it went out,
    /// `Ok(false)` when the socket is full (the next edge resumes it).
    fn flush(&mut self, c: &mut Connection<'a, H>, bufs: &mut Buffers) -> io::Result<bool> {
        Self::write_out(c, bufs, false)
    }

    /// [`flush`](Loop::flush); with `more`, a file's first bytes follow at once
    /// (`MSG_MORE`: the kernel packs the head with them).
    fn write_out(c: &mut Connection<'a, H>, bufs: &mut Buffers, more: bool) -> io::Result<bool> {
        loop {
            if c.transport.records_pending() {
                if !c.writable {
                    return Ok(false);
                }
                match c.transport.write_records() {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        c.writable = false;
                        return Ok(false);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            let out = bufs.pending_output();
            if out.is_empty() {
                return Ok(true);
            }
            if !c.writable {
                return Ok(false);
            }
            let wanted = out.len();
            let (n, r) = if more {
                c.transport.write_more(out)
            } else {
                c.transport.write(&[IoSlice::new(out)])
            };
            bufs.output_written(n);
            // The response's bytes (under TLS, the plaintext rustls took).
            c.sent += n as u64;
            match r {
                Ok(()) if n == 0 && !c.transport.records_pending() => {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                Ok(()) => {
                    if n < wanted && !c.transport.is_tls() {
                        c.writable = false;
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.writable = false;
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends a file range after the output: a range that fits in the output buffer is
    /// copied into it (one `pread`, one write with the head); a larger one is sent with
    /// `sendfile(2)` (copied through TLS), resumed on the next edge when the socket is
    /// full. `Ok(None)` when all of it went out.
    fn send_file(
        &mut self,
        c: &mut Connection<'a, H>,
        bufs: &mut Buffers,
        body: FileBody,
        mut offset: u64,
        mut left: u64,
    ) -> io::Result<Option<Pending>> {
        let small = usize::try_from(left).is_ok_and(|l| bufs.pending_output().len() + l <= BUFFER_SIZE);
        if small && offset == body.range.start {
            let out = bufs.output();
            let at = out.len();
            out.resize(at + left as usize, 0);
            if let Err(e) = body.file.read_exact_at(&mut out[at..], offset) {
                out.truncate(at);
                return Err(e);
            }
            return Ok(None);
        }
        loop {
            if !Self::write_out(c, bufs, left > 0)? {
                return Ok(Some(Pending::File { body, offset, left }));
            }
            if left == 0 {
                return Ok(None);
            }
            if c.transport.is_tls() {
                let chunk = left.min(BUFFER_SIZE as u64) as usize;
                let out = bufs.output();
                out.resize(chunk, 0);
                if let Err(e) = body.file.read_exact_at(out, offset) {
                    out.clear();
                    return Err(e);
                }
                offset += chunk as u64;
                left -= chunk as u64;
                continue;
            }
            if !c.writable {
                return Ok(Some(Pending::File { body, offset, left }));
            }
            let chunk = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
            let mut off = i64::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            match c.transport.send_file(&body.file, &mut off, chunk) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    offset += n as u64;
                    left -= n as u64;
                    c.sent += n as u64;
                    if n < chunk {
                        c.writable = false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.writable = false;
                    return Ok(Some(Pending::File { body, offset, left }));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Admission's reads and writes, until the machine decides (`None`) or must wait for
    /// the socket or its deadline (`Some(Pass::Wait)`).
    fn admission_io(&mut self, c: &mut Connection<'a, H>, bufs: &mut Buffers) -> Option<Pass> {
        let machine = c.admission.as_mut()?;
        loop {
            match machine.next() {
                admission::Next::Read { by } => {
                    c.timer.deadline = by;
                    if !c.readable && !c.closed_by_peer {
                        return Some(Pass::Wait);
                    }
                    let room = bufs.room(BUFFER_SIZE);
                    let room_len = room.len();
                    match c.transport.socket().read(room) {
                        Ok(0) => machine.closed(),
                        Ok(n) => {
                            bufs.filled(n);
                            c.received += n as u64;
                            if n < room_len {
                                c.readable = false;
                            }
                            let used = machine.received(bufs.unconsumed(), self.now);
                            bufs.consume(used);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            c.readable = false;
                            return Some(Pass::Wait);
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => machine.failed(&e),
                    }
                }
                admission::Next::Write { by } => {
                    c.timer.deadline = by;
                    if !c.writable {
                        return Some(Pass::Wait);
                    }
                    match c
                        .transport
                        .socket()
                        .send_with_flags(machine.pending(), libc::MSG_NOSIGNAL)
                    {
                        Ok(0) => machine.failed(&io::ErrorKind::WriteZero.into()),
                        Ok(n) => {
                            c.sent += n as u64;
                            machine.sent(n, self.now);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            c.writable = false;
                            return Some(Pass::Wait);
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => machine.failed(&e),
                    }
                }
                admission::Next::Serve | admission::Next::Close => break,
            }
        }
        None
    }

    /// Runs admission as far as it goes: `None` when the connection is admitted (its
    /// pending state set to serve), `Some` when it waits or closed.
    fn admit(&mut self, c: &mut Connection<'a, H>, bufs: &mut Buffers, handler: &mut H) -> Option<Pass> {
        if c.admission.is_none() {
            c.pending = Pending::Read { wait: Wait::Idle };
            return None;
        }
        if let Some(waits) = self.admission_io(c, bufs) {
            c.pending = Pending::Admit;
            return Some(waits);
        }
        let machine = c.admission.take().expect("present");
        let counted = machine.seat().counted;
        let verdict = machine.finish();
        if !verdict.unsent.is_empty() {
            let _ = c
                .transport
                .socket()
                .send_with_flags(&verdict.unsent, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
        }
        c.peer = verdict.peer;
        c.counted_ip = counted;
        if let Some(session) = verdict.tls {
            c.transport.set_tls(session);
        }
        if let Some(why) = verdict.rejected {
            if let Some(refusal) = self.ledger.reject(why, &c.peer) {
                c.step.refuse(bufs, refusal);
                bufs.discard_input();
                c.pending = Pending::Output(Then::Close {
                    linger: Some(Duration::ZERO),
                });
                return None;
            }
            return Some(Pass::Closed);
        }
        tracing::debug!("serving {}", c.peer);
        self.ledger.connection();
        if bufs.has_input() || c.transport.input_pending() {
            let next = self.advance(c, bufs, handler);
            self.follow(c, next);
        } else {
            let first = c.step.first_read();
            self.follow(c, Gathered::Step(first));
        }
        None
    }
}

/// A connection a worker handed back (hybrid mode): how far it got, and the beginning of
/// a request that came with it, if any.
struct Back<'b> {
    served: u32,
    interim_sent: bool,
    bytes: &'b [u8],
}

/// The step's context outside a handler call (the output went out, a deadline passed, a
/// front gathering a request): the refusals it reports count on the slot (issue 41).
struct Quiet<'s> {
    stopping: bool,
    slot: &'s Slot,
}

/// A hybrid front's side of the step while it gathers a request: the request's start and
/// head, so that one the front refuses, times out or loses gets its access-log line when
/// the connection closes, as in every model (issue 42); one handed off is answered, counted
/// and logged by the worker that takes it.
struct Gather<'t, 'l> {
    ledger: &'t mut Ledger<'l>,
    stopping: bool,
    request: &'t mut Option<Instant>,
    now: Instant,
}

impl Context for Gather<'_, '_> {
    fn at_boundary(&mut self, _: &Socket, _: Duration) -> Boundary {
        Boundary::Wait
    }
    fn saturated(&mut self) -> bool {
        false
    }
    fn stopping(&mut self) -> bool {
        self.stopping
    }
    fn request_start(&mut self, head: Head<'_>) {
        *self.request = Some(self.now);
        self.ledger.request_head(head);
    }
    fn request_head(&mut self, head: Head<'_>) {
        self.ledger.request_head(head);
    }
    fn refused(&mut self, _: &crate::codec::ProtocolError) {
        self.ledger.refused();
    }
}

/// What a connection's private buffers hold for a request (none: nothing).
fn held(bufs: Option<&Buffers>) -> usize {
    bufs.map_or(0, Buffers::input_capacity)
}

impl Context for Quiet<'_> {
    fn at_boundary(&mut self, _: &Socket, _: Duration) -> Boundary {
        Boundary::Wait
    }
    fn saturated(&mut self) -> bool {
        false
    }
    fn stopping(&mut self) -> bool {
        self.stopping
    }
    fn refused(&mut self, _: &crate::codec::ProtocolError) {
        self.slot.error();
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

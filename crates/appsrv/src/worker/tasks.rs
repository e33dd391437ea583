//! The async driver (issue 33): async handlers ([`AsyncRequestHandler`],
//! [`AsyncHandler`]) in event workers, each connection a future of a current-thread tokio
//! runtime that the worker builds after the fork.
//!
//! How the runtime and appsrv share the worker:
//! - **The runtime owns the waiting.** Its reactor (one epoll instance, made in
//!   [`Driver::prepare`], so a failure is a start failure) watches the listeners, the
//!   connections and the handlers' own sockets (a database, another service) alike; its
//!   timers serve the deadlines and `tokio::time`. appsrv's own loop (`event.rs`) cannot
//!   run beside it: a second epoll instance would need one of them to block in the other.
//!   The runtime is `current_thread`: no thread starts unless a handler asks for one
//!   (`spawn_blocking`), and the process stays a one-thread worker like the others.
//! - **appsrv keeps the connection's steps.** Each accepted connection is one future that
//!   runs the same I/O-free machines as the other drivers: admission (`admission.rs`:
//!   PROXY header, access rules, penalty, TLS, the per-address cap), then the request
//!   step (`conn/step.rs`, its handler call awaited: [`Requests::advance_async`]) or the
//!   client level's handler with an [`AsyncClient`]; and the same [`Ledger`] (counts, access
//!   log, recycling). The futures borrow the worker's set-up, so they are not spawned
//!   tasks (which must be `'static`) but live in one `FuturesUnordered`, polled when woken,
//!   inside the one future the runtime runs ([`Worker::run`]); a `LocalSet` around it lets
//!   handlers `spawn_local` tasks of their own.
//! - **Signals.** The stop and reopen signals' handlers write to an eventfd
//!   (`sys::set_worker_wake_fd`) that the run watches: the runtime's `epoll_wait` cannot
//!   let signals in as the event loop's `epoll_pwait` does.
//! - **In flight.** A connection's requests are answered one after the other (pipelined
//!   ones in order, as the step does everywhere); many connections are in flight at once.
//!   `--max-inflight` is a semaphore taken around each handler call: at the limit a
//!   connection with a whole request waits, reading nothing more, and at
//!   `--worker-connections` open connections the worker stops accepting.
//! - **Faults.** A call longer than `--request-timeout` is cancelled (its future dropped)
//!   and answered with the codec's error reply (HTTP 504); a client that closes its side
//!   while its request is handled cancels it; a panic is caught with the future
//!   (`catch_unwind`), logged with the client and the request, and closes that connection
//!   only: the worker goes on, since its other requests in flight would be lost with it
//!   and the handler, shared through `&self`, has no `&mut` state that the panic could
//!   leave half-written (what it keeps in a `Cell` is the handler's to keep consistent).
//!   Each poll of a connection's future is timed: one longer than `--slow-request` blocked
//!   the thread (a blocking call in a handler) and is logged with the client and the
//!   request; each run of the whole is a turn on the slot, so that the master still kills
//!   a worker whose thread is stuck past `--request-timeout`.
//! - **Stopping.** At a stop the worker stops accepting, idle keep-alive connections end at
//!   their boundary as in the event loop (HTTP's wait for a last request), requests in
//!   flight finish and are answered, and the worker exits when its last connection closes
//!   (or the master's grace period ends it). Client-level sessions run until they end;
//!   [`AsyncClient::stopped`] tells a handler to end its dialogue (SMTP's `421`).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io::{self, Read};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskCx, Poll};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use socket2::Socket;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, Semaphore, SemaphorePermit};

use crate::codec::{Codec, FileBody};
use crate::conn::async_client::AsyncClient;
use crate::conn::buffers::{BUFFER_SIZE, Buffers};
use crate::conn::context::{Conn, ConnInfo};
use crate::conn::send_watch::Pace;
use crate::conn::step::{self, Cut, HandleAsync, Next, Requests, Wait};
use crate::conn::transport::Transport;
use crate::handler::{AsyncHandler, AsyncRequestHandler};
use crate::net::listener::{Addr, Listener};
use crate::net::tls::ForWorker;
use crate::peer_counts::PeerCounts;
use crate::scoreboard::{Board, ConnCounts, HEAD_BYTES, Slot, State};
use crate::sys::{self, exit};

use super::access::{End, Outcome};
use super::admission::{self, Admission, EventSeat};
use super::budget::{self, Budget};
use super::driver::Serves;
use super::driver::{Driver, Extras, Shared, rules};
use super::ledger::{
    Ledger, OncePerMinute, RESOURCE_BACKOFF, Trouble, contain, log_connection_error, panic_message,
};
use super::serve::{AsyncClientLevel, AsyncRequestLevel, Boundary, Context, Head, Limits};
use super::{ConnLimits, Setup};

/// The async driver: the runtime and the wake-up descriptor, made before `Ready`, and its
/// own settings.
pub(crate) struct Tasks<'a> {
    runtime: tokio::runtime::Runtime,
    wake: EventFd,
    /// The stream listeners, in an epoll instance of the worker's own (see [`Accept`]).
    accepting: EpollFd,
    /// `--worker-connections`.
    max_connections: usize,
    /// `--max-inflight` (0: no limit).
    max_inflight: usize,
    /// `--request-timeout`: a handler call is cancelled past it.
    request_timeout: Option<Duration>,
    /// `--read-timeout` and `--write-timeout`, for the client level's reads and writes.
    io_timeouts: (Option<Duration>, Option<Duration>),
    /// `--slow-request`.
    slow_request: Option<Duration>,
    /// The event workers' connections by client address (`--max-conns-per-ip`).
    peers: Option<&'static PeerCounts>,
    _setup: std::marker::PhantomData<&'a ()>,
}

impl std::fmt::Debug for Tasks<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tasks")
            .field("max_connections", &self.max_connections)
            .field("max_inflight", &self.max_inflight)
            .finish_non_exhaustive()
    }
}

impl<'a> Driver<'a> for Tasks<'a> {
    fn prepare(setup: &Setup<'a>, _slot: &'static Slot, extras: Extras<'a>) -> Result<Self, String> {
        if extras.datagrams.is_some() {
            return Err("datagram listeners are not served by async handlers".into());
        }
        // Made here, after the fork and the privilege drop, in the worker: the master
        // never has a runtime (rule 1), and none is inherited (rule 9).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("making the async runtime: {e}"))?;
        let wake = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| format!("making the signals' eventfd: {e}"))?;
        let accepting = listeners_epoll(setup.listeners)?;
        sys::set_worker_wake_fd(wake.as_raw_fd());
        Ok(Tasks {
            runtime,
            wake,
            accepting,
            max_connections: setup.drivers.worker_connections.max(1),
            max_inflight: setup.drivers.tasks.max_inflight,
            request_timeout: setup.drivers.tasks.request_timeout,
            io_timeouts: (setup.drivers.tasks.read_timeout, setup.conn.write_timeout),
            slow_request: setup.drivers.slow_request,
            peers: setup.peers,
            _setup: std::marker::PhantomData,
        })
    }
}

impl<'a, H: AsyncRequestHandler> Serves<'a, AsyncRequestLevel<H>> for Tasks<'a> {
    fn serve(self, shared: Shared<'a>, level: &mut AsyncRequestLevel<H>) -> i32 {
        let (handler, limits) = level.parts();
        Run { driver: self, shared }.go(&RequestsOf { handler }, Some(limits))
    }
}

impl<'a, H: AsyncHandler> Serves<'a, AsyncClientLevel<H>> for Tasks<'a> {
    fn serve(self, shared: Shared<'a>, level: &mut AsyncClientLevel<H>) -> i32 {
        Run { driver: self, shared }.go(&ClientsOf { handler: &level.0 }, None)
    }
}

/// The most memory a connection's buffers keep between requests (more is given back).
const KEEP_BUFFERS: usize = 2048;

/// Accepts in a row after which the run lets the connections it took run.
const ACCEPT_BURST: u32 = 32;

/// How long the runtime runs after the handler's `on_worker_exit`, for the tasks it
/// ends to finish (a database connection's goodbye).
const EXIT_GRACE: Duration = Duration::from_millis(20);

/// The driver and the worker's context, handed to the level.
struct Run<'a> {
    driver: Tasks<'a>,
    shared: Shared<'a>,
}

impl<'a> Run<'a> {
    fn go<L: Level>(self, level: &L, step_limits: Option<Limits>) -> i32 {
        let Run { driver, shared } = self;
        let Tasks {
            runtime,
            wake,
            accepting,
            max_connections,
            max_inflight,
            request_timeout,
            io_timeouts,
            slow_request,
            peers,
            _setup,
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
        board.set_state(id, State::Reading);
        let worker = Worker {
            id,
            board,
            slot,
            listeners,
            tls,
            limits,
            max_per_ip,
            peers,
            step_limits: step_limits.unwrap_or_default(),
            ledger: RefCell::new(ledger),
            max_connections,
            permits: (max_inflight > 0).then(|| Semaphore::new(max_inflight.min(Semaphore::MAX_PERMITS))),
            request_timeout,
            io_timeouts,
            slow: RefCell::new(Slow {
                limit: slow_request,
                episode: OncePerMinute::default(),
            }),
            cuts: RefCell::new(Cuts::default()),
            stopping: Cell::new(false),
            stop: Notify::new(),
            open: Cell::new(0),
            idle: Cell::new(0),
            in_flight: Cell::new(0),
            writing: Cell::new(0),
            moved_in: Cell::new(0),
            moved_out: Cell::new(0),
            accepted: Cell::new(0),
            scratch: RefCell::new(vec![0; BUFFER_SIZE]),
            published: Cell::new((ConnCounts::default(), 0)),
            budget: RefCell::new(Budget::new(limits.max_buffered, level.refusal())),
            budget_room: Notify::new(),
            paused: Cell::new(0),
        };
        let local = tokio::task::LocalSet::new();
        let run = Turned {
            slot,
            worker: &worker,
            // Out of tokio's cooperative budget (128 operations per poll of a task): every
            // connection of the worker is in this one task, whose budget would make it
            // yield to the runtime (another `epoll_wait`) every 128 reads and writes under
            // load. It yields anyway when nothing is ready, and `FuturesUnordered` yields
            // once it has polled each of its futures, so the handlers' own tasks (a
            // database connection's) still run in between. Measured: the front page's 36 rows at
            // c = 500, 11,000 -> 13,200 requests/s, 82 -> 68 µs of CPU per request.
            // The `LocalSet`'s tasks (those the handlers `spawn_local`) are polled inside
            // this turn too, so the master's watch sees one of them that blocks the thread.
            inner: local.run_until(tokio::task::unconstrained(worker.run(
                level,
                std::os::fd::AsFd::as_fd(&wake),
                accepting,
            ))),
        };
        let served = contain(|| runtime.block_on(run));
        match served {
            Ok(code) => {
                // The handler's goodbye runs in the runtime, before it is dropped: what it
                // closes (a database connection) may have a task of its own to finish (the
                // protocol's goodbye), which is given a moment to run.
                let goodbye = async {
                    level.on_worker_exit();
                    for _ in 0..16 {
                        tokio::task::yield_now().await;
                    }
                    tokio::time::sleep(EXIT_GRACE).await;
                };
                if let Err(p) = contain(|| local.block_on(&runtime, goodbye)) {
                    tracing::error!("on_worker_exit panicked: {}", p.0);
                }
                worker.ledger.borrow_mut().flush();
                // The eventfd closes with the driver: the signals' handlers must not write
                // to whatever takes its number next.
                sys::set_worker_wake_fd(-1);
                code
            }
            Err(p) => {
                worker
                    .ledger
                    .borrow_mut()
                    .panicked(format_args!("the async worker panicked"), &p, "exiting")
            }
        }
    }
}

/// The level's part of a connection: what the request level and the client level do
/// with an admitted connection, and with one refused over the per-address cap.
trait Level {
    /// How its codec refuses a request at the budget of buffered bytes, for the log
    /// ([`budget::refusal_words`]).
    fn refusal(&self) -> String;

    /// Serves the admitted connection `io` of `peer` (number `id`), `bufs` holding what
    /// admission read past its needs.
    async fn serve(
        &self,
        w: &Worker<'_>,
        io: AsyncFd<Transport>,
        peer: &Addr,
        id: u64,
        bufs: Buffers,
        label: &Label,
    );

    /// Refuses the connection with the codec's reply for `why` (the request level), or
    /// closes it (the client level has no codec).
    async fn refuse(&self, w: &Worker<'_>, io: AsyncFd<Transport>, why: &'static str);

    /// The handler's `on_worker_exit`.
    fn on_worker_exit(&self);
}

/// The worker's state, shared by its connections' futures (one thread: cells).
struct Worker<'a> {
    id: u32,
    board: &'static Board,
    slot: &'static Slot,
    listeners: &'a [Listener],
    tls: &'a ForWorker,
    limits: ConnLimits,
    max_per_ip: Option<usize>,
    peers: Option<&'static PeerCounts>,
    step_limits: Limits,
    ledger: RefCell<Ledger<'a>>,
    max_connections: usize,
    /// `--max-inflight`'s permits (`None`: no limit).
    permits: Option<Semaphore>,
    request_timeout: Option<Duration>,
    io_timeouts: (Option<Duration>, Option<Duration>),
    slow: RefCell<Slow>,
    /// Calls cut by `--request-timeout`, for their log lines.
    cuts: RefCell<Cuts>,
    stopping: Cell<bool>,
    /// Wakes the connections that wait between requests when the worker stops.
    stop: Notify,
    /// Connections open, of which idle keep-alive ones, requests in flight and connections
    /// writing their output ([`Writing`]).
    open: Cell<usize>,
    idle: Cell<u32>,
    in_flight: Cell<u32>,
    writing: Cell<u32>,
    /// Bytes read from and written to clients since the slot's counters last moved: they
    /// move once per turn ([`Worker::publish`]), as the bytes do (issue 42: they moved when
    /// a connection closed, so keep-alive traffic showed 0).
    moved_in: Cell<u64>,
    moved_out: Cell<u64>,
    /// Connections accepted so far (each one's number, [`Conn::id`]).
    accepted: Cell<u64>,
    /// The worker-wide read buffer: a read lands here and what it got is copied into the
    /// connection's own buffers, of the size they need (no borrow across an `.await`).
    scratch: RefCell<Vec<u8>>,
    /// What the slot last showed (connections, requests in flight).
    published: Cell<(ConnCounts, u32)>,
    /// The budget of buffered bytes (`--max-buffered-bytes`), as the event loop keeps it.
    budget: RefCell<Budget>,
    /// Connections paused at the budget wait here for room.
    budget_room: Notify,
    /// How many are paused.
    paused: Cell<usize>,
}

/// Slow polls: the limit, and the episode being logged.
struct Slow {
    limit: Option<Duration>,
    episode: OncePerMinute,
}

/// A connection's name: its client, and what is published of its request in progress
/// (the codec's summary, or its first bytes with `--status-request-detail`: issue 41), for
/// the slow-poll and panic lines; with the request's first bytes as they came, for the
/// access log. The one copy of them: the ledger takes them at the request's end.
#[derive(Debug)]
struct Label {
    peer: RefCell<Addr>,
    shown: RefCell<Vec<u8>>,
    raw: RefCell<Vec<u8>>,
}

/// What the accept wait found.
enum Event {
    Signal,
    Accepted(io::Result<(Socket, Addr, usize)>),
    Closed,
    Resume,
    /// No call was cut for [`CUTS_QUIET`]: the episode of cuts is over.
    CutsQuiet,
}

/// How long without a call cut by `--request-timeout` ends an episode of cuts.
const CUTS_QUIET: Duration = Duration::from_secs(10);

/// Handler calls cut by `--request-timeout`, logged once per episode (issue 41: one line
/// per cut request, 8,646 lines in 10 s): the first cut of an episode is logged with its
/// client; the others are counted, and told in a line a minute at most while the episode
/// lasts (as the slow-poll lines, [`OncePerMinute`]); the episode ends after
/// [`CUTS_QUIET`] without a cut, or with the worker, in a line that says how many were
/// cut.
#[derive(Debug, Default)]
struct Cuts {
    /// When the episode began and when its last cut came; `None` between episodes.
    episode: Option<(Instant, Instant)>,
    /// The episode's cuts.
    total: u64,
    /// The lines after the first, one a minute at most.
    lines: OncePerMinute,
}

impl Cuts {
    /// A call was cut at `now`: `Some(n)` when this one is to be logged (`n` cut since
    /// the last line and not logged).
    fn cut(&mut self, now: Instant) -> Option<u64> {
        self.total += 1;
        match &mut self.episode {
            Some((_, last)) => *last = now,
            None => {
                self.episode = Some((now, now));
                // A new episode's first cut is always told.
                self.lines = OncePerMinute::default();
            }
        }
        self.lines.due(now)
    }

    /// When the episode ends if no call is cut before.
    fn quiet_at(&self) -> Option<Instant> {
        self.episode.map(|(_, last)| last + CUTS_QUIET)
    }

    /// Ends the episode, if there is one: its line.
    fn end(&mut self, limit: Option<Duration>) {
        let Some((since, last)) = self.episode.take() else {
            return;
        };
        let total = std::mem::take(&mut self.total);
        tracing::warn!(
            "{total} handler call(s) cut by --request-timeout ({} s) in {:.1?}, logged once per episode: the episode is over",
            limit.unwrap_or_default().as_secs_f64(),
            last.saturating_duration_since(since)
        );
    }
}

impl<'a> Worker<'a> {
    /// Accepts and serves until a stop and the last connection's end; returns the exit
    /// status.
    async fn run<L: Level>(&self, level: &L, wake: BorrowedFd<'_>, accepting: EpollFd) -> i32 {
        // SAFETY: `wake` borrows the driver's eventfd, open for the whole run (the borrow
        // outlives the `AsyncFd`), and always returns the same descriptor.
        let wake = match unsafe { AsyncFd::register_with_interest(wake, Interest::READABLE) }
            .map_err(io::Error::from)
        {
            Ok(fd) => fd,
            Err(e) => {
                tracing::error!("watching the signals' eventfd: {e}; stopping");
                return exit::OK;
            }
        };
        let listeners = match Accept::new(accepting, self.listeners) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("watching the listeners: {e}; stopping");
                return exit::OK;
            }
        };
        let mut conns = FuturesUnordered::new();
        let mut trouble = Trouble::default();
        let mut resume_at: Option<tokio::time::Instant> = None;
        let mut burst: u32 = 0;
        // A stop that came before the wake-up descriptor was set.
        if sys::stop_requested() {
            self.begin_stop();
        }
        loop {
            if self.stopping.get() && conns.is_empty() {
                tracing::debug!("no connection left");
                self.cuts.borrow_mut().end(self.request_timeout);
                return exit::OK;
            }
            let quiet_at = self.cuts.borrow().quiet_at().map(tokio::time::Instant::from);
            let accepting =
                !self.stopping.get() && resume_at.is_none() && self.open.get() < self.max_connections;
            self.slot.set_accepts_paused(!accepting);
            let event = tokio::select! {
                biased;
                r = wake.readable() => {
                    if let Ok(mut guard) = r {
                        // The counter read (it is non-blocking), then the readiness
                        // cleared: the next signal's write is a new edge.
                        let mut counter = [0u8; 8];
                        let _ = nix::unistd::read(guard.get_inner(), &mut counter);
                        guard.clear_ready();
                    }
                    Event::Signal
                }
                Some(()) = conns.next(), if !conns.is_empty() => Event::Closed,
                r = listeners.accept(), if accepting => Event::Accepted(r),
                () = sleep_until(resume_at), if resume_at.is_some() => Event::Resume,
                () = sleep_until(quiet_at), if quiet_at.is_some() => Event::CutsQuiet,
            };
            match event {
                Event::Signal => {
                    if sys::take_reopen_request() {
                        self.ledger.borrow_mut().reopen();
                    }
                    if sys::stop_requested() && !self.stopping.get() {
                        self.begin_stop();
                    }
                }
                Event::Closed => self.open.set(self.open.get() - 1),
                Event::Accepted(Ok((socket, peer, index))) => {
                    trouble.cleared();
                    burst += 1;
                    if burst % ACCEPT_BURST == 0 {
                        // A flood of connections: the ones accepted get their turn (the
                        // run is out of tokio's budget, which would otherwise yield).
                        tokio::task::yield_now().await;
                    }
                    self.open.set(self.open.get() + 1);
                    let label = Rc::new(Label {
                        peer: RefCell::new(peer.clone()),
                        shown: RefCell::new(Vec::new()),
                        raw: RefCell::new(Vec::new()),
                    });
                    conns.push(Watched {
                        worker: self,
                        label: label.clone(),
                        inner: self.connection(level, socket, peer, index, label),
                    });
                }
                Event::Accepted(Err(e)) => match Errno::from_raw(e.raw_os_error().unwrap_or(0)) {
                    Errno::EINTR => {}
                    errno if super::accept::connection_error(errno) => {}
                    Errno::EINVAL => {
                        // The master shut the listeners down: a stop.
                        if !self.stopping.get() {
                            self.begin_stop();
                        }
                    }
                    errno => {
                        trouble.began(errno, "accepting connections");
                        resume_at = Some(tokio::time::Instant::now() + RESOURCE_BACKOFF);
                    }
                },
                Event::Resume => resume_at = None,
                Event::CutsQuiet => {
                    // A call cut since the sleep began moved the end.
                    let mut cuts = self.cuts.borrow_mut();
                    if cuts.quiet_at().is_some_and(|at| at <= Instant::now()) {
                        cuts.end(self.request_timeout);
                    }
                }
            }
        }
    }

    /// The worker is asked to stop: no more accepting; idle connections are woken to end
    /// at their boundary.
    fn begin_stop(&self) {
        tracing::debug!(
            "stopping: {} connections, {} requests in flight",
            self.open.get(),
            self.in_flight.get()
        );
        self.stopping.set(true);
        // Shown as finishing, not accepting (`status`, the kill storm's count of serving
        // workers), as the event loop's stop does.
        self.board.set_state(self.id, State::Finishing);
        self.slot.set_accepts_paused(true);
        self.stop.notify_waiters();
        crate::conn::async_client::worker_stops();
    }

    /// The slot shows the connections and the requests in flight (when they changed), and
    /// the bytes moved since the last turn (once per turn, [`Turned`]).
    fn publish(&self) {
        let (moved_in, moved_out) = (self.moved_in.take(), self.moved_out.take());
        if (moved_in, moved_out) != (0, 0) {
            self.slot.add_bytes(moved_in, moved_out);
        }
        let idle = self.idle.get();
        let in_flight = self.in_flight.get();
        let writing = self.writing.get();
        let open = self.open.get() as u32;
        let counts = ConnCounts {
            open,
            reading: open
                .saturating_sub(idle)
                .saturating_sub(in_flight)
                .saturating_sub(writing),
            writing,
            idle_keepalive: idle,
        };
        if self.published.get() != (counts, in_flight) {
            self.slot.publish_counts(counts);
            self.slot.set_in_flight(in_flight);
            self.published.set((counts, in_flight));
        }
    }

    /// One connection, from accept to close.
    async fn connection<L: Level>(
        &self,
        level: &L,
        socket: Socket,
        peer: Addr,
        listener: usize,
        label: Rc<Label>,
    ) {
        let id = self.accepted.get() + 1;
        self.accepted.set(id);
        self.slot.accepted();
        let transport = Transport::new(socket);
        // SAFETY: the transport owns the connection's socket, which it closes only when
        // dropped, with the `AsyncFd` that owns it; its descriptor never changes.
        let registered =
            unsafe { AsyncFd::register_with_interest(transport, Interest::READABLE | Interest::WRITABLE) };
        let io = match registered.map_err(io::Error::from) {
            Ok(io) => io,
            Err(e) => {
                tracing::warn!("cannot watch the connection from {peer}: {e}; closing it");
                return;
            }
        };
        let mut io = io;
        let (peer, counted, bufs) = match self.admit(&mut io, peer, listener).await {
            Admitted::Serve { peer, counted, bufs } => (peer, counted, bufs),
            Admitted::Refuse { counted, why } => {
                level.refuse(self, io, why).await;
                self.uncount(counted);
                return;
            }
            Admitted::Closed { counted } => {
                self.uncount(counted);
                return;
            }
        };
        *label.peer.borrow_mut() = peer.clone();
        self.ledger.borrow_mut().connection();
        level.serve(self, io, &peer, id, bufs, &label).await;
        self.uncount(counted);
    }

    /// A connection's buffers went from `was` to `now` bytes: counted against the budget.
    /// When they shrink, the paused connections read again if the budget has room, and the
    /// memory of a flood is given back once its buffers are freed.
    fn buffers_moved(&self, was: usize, now: usize) {
        if was == now {
            return;
        }
        let mut budget = self.budget.borrow_mut();
        budget.moved(was, now);
        if now < was {
            if self.paused.get() > 0 && budget.has_room() {
                budget.resumed(Instant::now(), self.paused.get());
                self.budget_room.notify_waiters();
            }
            if budget.freed(Instant::now) {
                sys::release_free_memory();
            }
        }
    }

    /// Waits until the budget of buffered bytes has room for the paused connections.
    async fn room(&self) {
        struct Paused<'w>(&'w Cell<usize>);
        impl Drop for Paused<'_> {
            fn drop(&mut self) {
                self.0.set(self.0.get() - 1);
            }
        }
        self.paused.set(self.paused.get() + 1);
        let _paused = Paused(&self.paused);
        loop {
            let notified = self.budget_room.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the look, so that room made after it still wakes this.
            notified.as_mut().enable();
            if self.budget.borrow().has_room() {
                return;
            }
            notified.await;
        }
    }

    fn uncount(&self, counted: Option<IpAddr>) {
        if let (Some(ip), Some(peers)) = (counted, self.peers) {
            peers.remove(self.id, ip);
        }
    }

    /// Admission (`admission.rs`), its reads and writes awaited, each by its phase's
    /// deadline.
    async fn admit(&self, io: &mut AsyncFd<Transport>, peer: Addr, listener: usize) -> Admitted {
        let rules = rules(self.listeners, self.tls, &self.limits, self.max_per_ip, listener);
        if rules.open_to(&peer) {
            return Admitted::Serve {
                peer,
                counted: None,
                bufs: Buffers::none(),
            };
        }
        let seat = EventSeat {
            id: self.id,
            peers: self.peers,
            counted: None,
            workers: None,
        };
        let mut machine = Admission::start(rules, peer, seat, &mut Instant::now);
        let mut bufs = Buffers::none();
        loop {
            match machine.next() {
                admission::Next::Read { by } => {
                    let room = bufs.room(BUFFER_SIZE);
                    match within(by, read_raw(io, room)).await {
                        None => machine.deadline_passed(Instant::now()),
                        Some(Ok(0)) => machine.closed(),
                        Some(Ok(n)) => {
                            bufs.filled(n);
                            let used = machine.received(bufs.unconsumed(), Instant::now());
                            bufs.consume(used);
                        }
                        Some(Err(e)) => machine.failed(&e),
                    }
                }
                admission::Next::Write { by } => match within(by, send_raw(io, machine.pending())).await {
                    None => machine.deadline_passed(Instant::now()),
                    Some(Ok(0)) => machine.failed(&io::ErrorKind::WriteZero.into()),
                    Some(Ok(n)) => machine.sent(n, Instant::now()),
                    Some(Err(e)) => machine.failed(&e),
                },
                admission::Next::Serve | admission::Next::Close => break,
            }
        }
        let counted = machine.seat().counted;
        let verdict = machine.finish();
        if !verdict.unsent.is_empty() {
            let _ = io
                .get_ref()
                .socket()
                .send_with_flags(&verdict.unsent, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
        }
        if let Some(session) = verdict.tls {
            io.get_mut().set_tls(session);
        }
        if let Some(why) = verdict.rejected {
            return match self.ledger.borrow_mut().reject(why, &verdict.peer) {
                Some(why) => Admitted::Refuse { counted, why },
                None => Admitted::Closed { counted },
            };
        }
        tracing::debug!("serving {}", verdict.peer);
        Admitted::Serve {
            peer: verdict.peer,
            counted,
            bufs,
        }
    }

    /// A `--max-inflight` permit, awaited (none without a limit), and the count of
    /// requests in flight, which drops with the returned guard.
    async fn in_flight(&self) -> InFlight<'_, 'a> {
        let permit = match self.permits.as_ref() {
            Some(s) => s.acquire().await.ok(),
            None => None,
        };
        self.in_flight.set(self.in_flight.get() + 1);
        InFlight {
            worker: self,
            _permit: permit,
        }
    }
}

/// A connection of the request level waiting to send its output (a response, a file) to
/// its client, counted among the worker's connections writing until dropped (issue 42: a
/// slow reader showed as reading).
struct Writing<'w, 'a> {
    worker: &'w Worker<'a>,
}

impl<'w, 'a> Writing<'w, 'a> {
    fn new(worker: &'w Worker<'a>) -> Self {
        worker.writing.set(worker.writing.get() + 1);
        Writing { worker }
    }
}

impl Drop for Writing<'_, '_> {
    fn drop(&mut self) {
        self.worker.writing.set(self.worker.writing.get() - 1);
    }
}

/// A request (or a client-level session) in flight, counted until dropped.
struct InFlight<'w, 'a> {
    worker: &'w Worker<'a>,
    _permit: Option<SemaphorePermit<'w>>,
}

impl Drop for InFlight<'_, '_> {
    fn drop(&mut self) {
        self.worker.in_flight.set(self.worker.in_flight.get() - 1);
    }
}

/// What admission decided.
enum Admitted {
    /// Serve the connection: its client (from a PROXY header, if any), its address as
    /// counted for the per-address cap, and the bytes read past admission's needs.
    Serve {
        peer: Addr,
        counted: Option<IpAddr>,
        bufs: Buffers,
    },
    /// Over the per-address cap: the codec's refusal, then a close.
    Refuse {
        counted: Option<IpAddr>,
        why: &'static str,
    },
    /// Closed (logged and counted by the ledger).
    Closed { counted: Option<IpAddr> },
}

/// The one future the runtime runs, timed as the slot's turns: the master's
/// `--request-timeout` watch kills a worker whose thread is stuck in one poll, as it
/// does an event loop whose turn does not end. The access log's lines go out after each
/// run, before the runtime waits.
struct Turned<'w, 'a, F> {
    slot: &'static Slot,
    worker: &'w Worker<'a>,
    inner: F,
}

impl<F: Future> Future for Turned<'_, '_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is structurally pinned: it is never moved out of `self`, which
        // is pinned, and `Turned` has no `Drop` of its own.
        let this = unsafe { self.get_unchecked_mut() };
        this.slot.turn_begin(crate::scoreboard::now_ns());
        // SAFETY: as above.
        let inner = unsafe { Pin::new_unchecked(&mut this.inner) };
        let r = inner.poll(cx);
        // The slot's counts once per turn, as the event loop publishes them, not at each
        // change (a request changes them four times).
        this.worker.publish();
        this.worker.ledger.borrow_mut().flush();
        this.slot.turn_end();
        r
    }
}

/// A connection's future, each poll timed against `--slow-request`.
struct Watched<'w, 'a, F> {
    worker: &'w Worker<'a>,
    label: Rc<Label>,
    inner: F,
}

impl<F: Future> Future for Watched<'_, '_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is structurally pinned (never moved out of the pinned `self`;
        // `Watched` has no `Drop` of its own).
        let this = unsafe { self.get_unchecked_mut() };
        let limit = this.worker.slow.borrow().limit;
        let Some(limit) = limit else {
            // SAFETY: as above.
            return unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx);
        };
        let started = Instant::now();
        // SAFETY: as above.
        let r = unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx);
        let ended = Instant::now();
        let took = ended.saturating_duration_since(started);
        if took > limit {
            this.worker.slow_poll(&this.label, took, ended);
        }
        r
    }
}

impl Worker<'_> {
    /// A handler call (`what`: "a request", "the connection" of a client-level handler)
    /// from `peer` was cut by `--request-timeout`: logged once per episode ([`Cuts`]).
    fn cut_by_timeout(&self, peer: &Addr, what: &str) {
        let Some(more) = self.cuts.borrow_mut().cut(Instant::now()) else {
            return;
        };
        tracing::warn!(
            "{what} from {peer} ran longer than --request-timeout ({} s): its future is cancelled and {}{}",
            self.request_timeout.unwrap_or_default().as_secs_f64(),
            if what == "a request" {
                "the client answered with the codec's error reply"
            } else {
                "the connection closed"
            },
            if more > 0 {
                format!(" ({more} more cut in the last minute)")
            } else {
                " (the others of this episode are counted, and told when it ends)".to_owned()
            }
        );
    }

    /// A poll that held the thread longer than `--slow-request`: counted, and logged once
    /// per episode.
    fn slow_poll(&self, label: &Label, took: Duration, now: Instant) {
        self.slot.slow_call();
        let mut slow = self.slow.borrow_mut();
        let Some(more) = slow.episode.due(now) else {
            return;
        };
        tracing::warn!(
            "a poll of the future serving {} took {} ms (--slow-request {} ms), request {:?}: it held up this worker's {} other connections; a handler must not block the thread (use an async client, or tokio::task::spawn_blocking){}",
            label.peer.borrow(),
            took.as_millis(),
            slow.limit.unwrap_or_default().as_millis(),
            String::from_utf8_lossy(&label.shown.borrow()),
            self.open.get().saturating_sub(1),
            if more > 0 {
                format!(" ({more} more slow polls in the last minute)")
            } else {
                String::new()
            }
        );
    }
}

/// Waits until `at` (never when `None`).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `f` by the deadline `by` (`None`: no deadline of its own); `None` when it passed.
async fn within<T>(by: Option<Instant>, f: impl Future<Output = T>) -> Option<T> {
    match by {
        Some(by) => tokio::time::timeout_at(by.into(), f).await.ok(),
        None => Some(f.await),
    }
}

/// An epoll instance's descriptor, for the runtime to watch.
struct EpollFd(Epoll);

impl AsRawFd for EpollFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.0.as_raw_fd()
    }
}

/// The worker's stream listeners, for `accept`.
///
/// They are registered level-triggered with `EPOLLEXCLUSIVE` in an epoll instance of the
/// worker's own, which the runtime watches as one descriptor (tokio's reactor has no
/// exclusive registration): a new connection wakes one waiting worker (or a few), not
/// all of them, as in the event loop. Linux wakes the exclusive waiters in the order they
/// registered, so a worker puts itself at the back of the queue (delete and add) every
/// [`REQUEUE_EVERY`](super::accept::REQUEUE_EVERY) accepts, as the event loop does, and the
/// connections spread over the workers.
fn listeners_epoll(listeners: &[Listener]) -> Result<EpollFd, String> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
        .map_err(|e| format!("making the listeners' epoll instance: {e}"))?;
    for (i, l) in listeners.iter().enumerate().filter(|(_, l)| !l.is_datagram()) {
        watch_listener(&epoll, l, i).map_err(|e| format!("watching {}: {e}", l.label()))?;
    }
    Ok(EpollFd(epoll))
}

fn watch_listener(epoll: &Epoll, l: &Listener, i: usize) -> nix::Result<()> {
    let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE;
    epoll.add(l.socket(), EpollEvent::new(flags, i as u64))
}

/// The listeners' epoll instance, watched by the runtime.
struct Accept<'l> {
    epoll: AsyncFd<EpollFd>,
    listeners: &'l [Listener],
    since_requeue: Cell<u32>,
}

impl<'l> Accept<'l> {
    fn new(epoll: EpollFd, listeners: &'l [Listener]) -> io::Result<Self> {
        // SAFETY: the `AsyncFd` owns the epoll instance, which it closes only when it is
        // dropped; its descriptor never changes.
        let epoll = unsafe { AsyncFd::register_with_interest(epoll, Interest::READABLE) }?;
        Ok(Accept {
            epoll,
            listeners,
            since_requeue: Cell::new(0),
        })
    }

    /// Accepts one connection on one of the listeners (the first ready).
    async fn accept(&self) -> io::Result<(Socket, Addr, usize)> {
        std::future::poll_fn(|cx| {
            loop {
                let mut guard = match self.epoll.poll_read_ready(cx) {
                    Poll::Ready(Ok(g)) => g,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                };
                let mut events = [EpollEvent::empty(); 8];
                let n = match self.epoll.get_ref().0.wait(&mut events, EpollTimeout::ZERO) {
                    Ok(n) => n,
                    Err(Errno::EINTR) => continue,
                    Err(e) => return Poll::Ready(Err(e.into())),
                };
                if n == 0 {
                    // Nothing left: the next connection is a new edge.
                    guard.clear_ready();
                    continue;
                }
                for ev in &events[..n] {
                    let index = ev.data() as usize;
                    let Some(l) = self.listeners.get(index) else {
                        continue;
                    };
                    match accept4(&std::os::fd::AsFd::as_fd(l.socket())) {
                        Ok((socket, peer)) => {
                            self.accepted();
                            return Poll::Ready(Ok((socket, peer, index)));
                        }
                        // Another worker took it.
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
            }
        })
        .await
    }

    /// One accept more: every [`REQUEUE_EVERY`](super::accept::REQUEUE_EVERY), the worker
    /// goes to the back of the listeners' queues of waiters.
    fn accepted(&self) {
        let n = self.since_requeue.get() + 1;
        if n < super::accept::REQUEUE_EVERY {
            self.since_requeue.set(n);
            return;
        }
        self.since_requeue.set(0);
        let epoll = &self.epoll.get_ref().0;
        for (i, l) in self
            .listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_datagram())
        {
            let _ = epoll.delete(l.socket());
            if let Err(e) = watch_listener(epoll, l, i) {
                tracing::error!("watching {} again: {e}", l.label());
            }
        }
    }
}

/// `accept4` on a listener, the new socket non-blocking and close-on-exec.
fn accept4(fd: &BorrowedFd<'_>) -> io::Result<(Socket, Addr)> {
    let flags = nix::sys::socket::SockFlag::SOCK_NONBLOCK | nix::sys::socket::SockFlag::SOCK_CLOEXEC;
    let raw = nix::sys::socket::accept4(fd.as_raw_fd(), flags).map_err(io::Error::from)?;
    // SAFETY: `accept4` just returned this descriptor, which nothing else owns.
    let socket = unsafe { <Socket as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let peer = socket
        .peer_addr()
        .map_or(Addr::Unix(None), |a| Addr::from_sockaddr(&a));
    Ok((socket, peer))
}

/// Reads raw bytes (admission: before TLS) into `buf`.
async fn read_raw(io: &mut AsyncFd<Transport>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let mut guard = io.readable_mut().await?;
        match guard.try_io(|t| t.get_ref().socket().read(buf)) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(r) => return r,
            Err(_would_block) => {}
        }
    }
}

/// Sends raw bytes (admission: TLS handshake records).
async fn send_raw(io: &mut AsyncFd<Transport>, data: &[u8]) -> io::Result<usize> {
    loop {
        let mut guard = io.writable_mut().await?;
        match guard.try_io(|t| t.get_ref().socket().send_with_flags(data, libc::MSG_NOSIGNAL)) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(r) => return r,
            Err(_would_block) => {}
        }
    }
}

/// Reads plaintext into `bufs` (at most `room` bytes, less at the budget of buffered bytes:
/// `None` when it leaves none): what the TLS layer holds first, else the socket's, once it
/// is readable. `unread`: the socket may hold bytes whose readiness was taken already (by
/// [`gone`]), so it is read before waiting. The budget is asked at the read, when the
/// bytes are there, so that connections waiting to be readable meanwhile are not counted
/// as room.
///
/// The read lands in the worker-wide scratch buffer, borrowed for the system call and the
/// copy only, never across an `.await`, and what it got is copied into the connection's
/// own buffers, of the size they need: a connection that waits holds no read buffer
/// (10,000 waiting connections with a 16 KiB buffer each would be 160 MiB).
async fn read_some(
    io: &mut AsyncFd<Transport>,
    bufs: &mut Buffers,
    room: usize,
    w: &Worker<'_>,
    unread: &Cell<bool>,
) -> io::Result<Option<usize>> {
    let room = room.min(BUFFER_SIZE);
    // The bytes read and the room they had, or `None` at the budget.
    let mut into_bufs = |t: &mut Transport| -> io::Result<Option<(usize, usize)>> {
        let Some(room) = w.budget.borrow().read_room(bufs, room) else {
            return Ok(None);
        };
        let mut scratch = w.scratch.borrow_mut();
        let n = t.read(&mut scratch[..room])?;
        bufs.extend_input(&scratch[..n]);
        Ok(Some((n, room)))
    };
    if io.get_mut().input_pending() || unread.take() {
        match into_bufs(io.get_mut()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
            Ok(None) => {
                // Still to be read once the budget has room.
                unread.set(true);
                return Ok(None);
            }
            Ok(Some((n, room))) => {
                // The socket may hold more than one read takes, and its readiness is
                // spent: the next read looks again, until a short read on a plain socket
                // says it is drained (review of issue 33: a large body pipelined behind
                // a request in flight waited for the read timeout).
                if n == room || io.get_ref().is_tls() {
                    unread.set(true);
                }
                return Ok(Some(n));
            }
            Err(e) => return Err(e),
        }
    }
    loop {
        let mut guard = io.readable_mut().await?;
        match guard.try_io(|t| into_bufs(t.get_mut())) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => {
                if e.kind() == io::ErrorKind::InvalidData {
                    // A TLS protocol error: the alert rustls prepared, best effort.
                    let _ = guard.get_inner_mut().write_records();
                }
                return Err(e);
            }
            // At the budget: the readiness stays, for the read once there is room.
            Ok(Ok(None)) => return Ok(None),
            Ok(Ok(Some((n, room)))) => {
                // A short read on a plain socket drained it: the next bytes will be a new
                // edge, so the readiness is cleared now rather than found stale by the next
                // read (one `recv` that fails with EAGAIN per request, otherwise). Not under
                // TLS, where a read may leave bytes in the socket.
                if n < room && !guard.get_inner().is_tls() {
                    // Readable only: a close that came with the bytes stays seen.
                    guard.clear_ready_matching(tokio::io::Ready::READABLE);
                }
                return Ok(Some(n));
            }
            Err(_would_block) => {}
        }
    }
}

/// `$op` (a write's future on `$io`, made again after each check), its waits judged by
/// `$pace` (`--write-timeout`, or `--min-send-rate`'s watch): its result, or `TimedOut`.
macro_rules! paced {
    ($pace:expr, $io:expr, $op:expr) => {
        loop {
            let done = match $pace.limit() {
                Some(t) => tokio::time::timeout(t, $op).await.ok(),
                None => Some($op.await),
            };
            match done {
                Some(r) => {
                    if r.is_ok() {
                        $pace.progressed();
                    }
                    break r;
                }
                None => {
                    if let Err(e) = $pace.expired($io.get_ref().socket()) {
                        break Err(e);
                    }
                }
            }
        }
    };
}

/// Writes `bufs`' output (and the TLS records it makes) to the client, each wait bounded
/// by `pace` (`--write-timeout`, or `--min-send-rate`); returns the bytes written, each
/// write's also added to the worker's bytes out (which the slot shows while a long write
/// goes on). While it waits for the client, the connection counts as writing in `w`.
async fn write_out(
    w: &Worker<'_>,
    io: &mut AsyncFd<Transport>,
    bufs: &mut Buffers,
    pace: &mut Pace,
) -> io::Result<u64> {
    let moved = &w.moved_out;
    let mut sent = 0;
    // The usual case first: the socket takes the whole output at once, and no timer (a
    // clock read, and the timer's entry if it was polled) is made for the write.
    if !bufs.pending_output().is_empty() && !io.get_ref().is_tls() {
        let data = bufs.pending_output();
        match io.get_mut().write(&[io::IoSlice::new(data)]) {
            (n, _) if n > 0 => {
                bufs.output_written(n);
                sent += n as u64;
                moved.set(moved.get() + n as u64);
            }
            (_, Err(e))
                if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted =>
            {
                return Err(e);
            }
            _ => {}
        }
    }
    let _writing =
        (!bufs.pending_output().is_empty() || io.get_ref().records_pending()).then(|| Writing::new(w));
    while !bufs.pending_output().is_empty() {
        let n = paced!(pace, io, write_some(io, bufs.pending_output()))?;
        bufs.output_written(n);
        sent += n as u64;
        moved.set(moved.get() + n as u64);
    }
    while io.get_ref().records_pending() {
        paced!(pace, io, write_records(io))?;
    }
    pace.done();
    Ok(sent)
}

/// `f`, failing with `TimedOut` past `timeout`.
async fn bounded<T>(timeout: Option<Duration>, f: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    match timeout {
        Some(t) => tokio::time::timeout(t, f).await.unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client took nothing for {} s (--write-timeout)",
                    t.as_secs_f64()
                ),
            ))
        }),
        None => f.await,
    }
}

/// One write of plaintext: the bytes taken.
async fn write_some(io: &mut AsyncFd<Transport>, data: &[u8]) -> io::Result<usize> {
    loop {
        // Under TLS, the records of earlier writes go first: with its buffer of records
        // full, rustls takes no plaintext (review of issue 33: a large response to a slow
        // client failed with "write zero" when the socket took part of the records).
        if io.get_ref().records_pending() {
            write_records(io).await?;
            continue;
        }
        let mut guard = io.writable_mut().await?;
        match guard.try_io(|t| {
            let t = t.get_mut();
            let (taken, r) = t.write(&[io::IoSlice::new(data)]);
            match r {
                // Taken bytes are gone (under TLS, records may wait): reported.
                _ if taken > 0 => Ok(taken),
                Err(e) => Err(e),
                // Nothing taken, records waiting: they go out first (the loop's top).
                Ok(()) if t.records_pending() => Ok(0),
                Ok(()) => Err(io::ErrorKind::WriteZero.into()),
            }
        }) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(Ok(0)) => {}
            Ok(r) => return r,
            Err(_would_block) => {}
        }
    }
}

/// Writes pending TLS records once the socket takes them.
async fn write_records(io: &mut AsyncFd<Transport>) -> io::Result<usize> {
    loop {
        let mut guard = io.writable_mut().await?;
        match guard.try_io(|t| t.get_mut().write_records()) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(r) => return r,
            Err(_would_block) => {}
        }
    }
}

/// Sends `body`'s range: `sendfile(2)` on a plain connection, copied through the TLS
/// layer otherwise, each wait bounded by `pace`; the connection counts as writing in `w`
/// meanwhile, and each write's bytes are added to its bytes out at once (see
/// [`write_out`]).
async fn send_file(
    w: &Worker<'_>,
    io: &mut AsyncFd<Transport>,
    body: &FileBody,
    pace: &mut Pace,
) -> io::Result<u64> {
    let _writing = Writing::new(w);
    let moved = &w.moved_out;
    let mut offset = body.range.start as i64;
    let end = body.range.end as i64;
    let mut sent = 0;
    if !io.get_ref().is_tls() {
        while offset < end {
            let len = (end - offset).min(1 << 30) as usize;
            let n = paced!(pace, io, async {
                loop {
                    let mut guard = io.writable_mut().await?;
                    match guard.try_io(|t| t.get_mut().send_file(&body.file, &mut offset, len)) {
                        Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                        Ok(r) => return r,
                        Err(_would_block) => {}
                    }
                }
            })?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file ended before its range",
                ));
            }
            sent += n as u64;
            moved.set(moved.get() + n as u64);
        }
        return Ok(sent);
    }
    let mut chunk = vec![0; BUFFER_SIZE];
    while offset < end {
        let want = ((end - offset) as usize).min(chunk.len());
        let n = std::os::unix::fs::FileExt::read_at(&body.file, &mut chunk[..want], offset as u64)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file ended before its range",
            ));
        }
        let mut at = 0;
        while at < n {
            let wrote = paced!(pace, io, write_some(io, &chunk[at..n]))?;
            at += wrote;
            moved.set(moved.get() + wrote as u64);
        }
        offset += n as i64;
        sent += n as u64;
    }
    while io.get_ref().records_pending() {
        paced!(pace, io, write_records(io))?;
    }
    pace.done();
    Ok(sent)
}

/// A close after which the client may still send (an error reply, a last response with
/// requests pipelined behind it): shut for writing, then read and discard for at most
/// `wait` (and [`step::LINGER_BYTES`]), so that the close does not reset what the client
/// has not read yet.
async fn linger(io: &mut AsyncFd<Transport>, wait: Duration) {
    io.get_mut().close_notify();
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while io.get_ref().records_pending() {
            if write_records(io).await.is_err() {
                break;
            }
        }
    })
    .await;
    if io.get_ref().shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    // On the heap: an array here would sit in every connection's future, lingering or not.
    let mut scratch = vec![0u8; 4096];
    let mut discarded = 0;
    let _ = tokio::time::timeout(wait, async {
        while discarded < step::LINGER_BYTES {
            match io.get_ref().discard(&mut scratch, false) {
                Ok(0) => break,
                Ok(n) => discarded += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if wait.is_zero() {
                        break;
                    }
                    let Ok(mut guard) = io.readable().await else { break };
                    guard.clear_ready();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    })
    .await;
}

/// Completes when the client closes its side (or resets) while its request is handled.
/// Bytes it sends meanwhile (a pipelined request) are left in the socket, `unread` set,
/// for the next read.
async fn gone(io: &AsyncFd<Transport>, unread: &Cell<bool>) {
    loop {
        let Ok(mut guard) = io.ready(Interest::READABLE).await else {
            return;
        };
        let ready = guard.ready();
        if ready.is_read_closed() || ready.is_error() {
            return;
        }
        // Data, not the end: the next read takes it; this waits for the next edge.
        unread.set(true);
        guard.clear_ready_matching(tokio::io::Ready::READABLE);
    }
}

/// The request level's side: the user's handler and the connection it answers.
struct RequestsOf<'h, H> {
    handler: &'h H,
}

impl<H: AsyncRequestHandler> Level for RequestsOf<'_, H> {
    fn refusal(&self) -> String {
        budget::refusal_words(self.handler.codec())
    }

    async fn serve(
        &self,
        w: &Worker<'_>,
        mut io: AsyncFd<Transport>,
        peer: &Addr,
        id: u64,
        mut bufs: Buffers,
        label: &Label,
    ) {
        let mut step = Requests::new(self.handler.codec(), w.step_limits.clone());
        let mut session = H::Session::default();
        let unread = Cell::new(false);
        let mut ctx = TaskContext {
            w,
            peer,
            label,
            request: None,
            received: 0,
            sent: 0,
            idle: false,
        };
        // `--write-timeout`, or `--min-send-rate`'s watch, for every write of the output.
        let mut pace = Pace::new(w.limits.min_send_rate, w.limits.write_timeout);
        let mut now = Instant::now;
        let mut next = if bufs.has_input() || io.get_mut().input_pending() {
            Next::More
        } else {
            step.first_read()
        };
        // One place for each kind of wait (the output's write, the read, the step's call):
        // each `.await` site keeps its future in the connection's, and sites of the same
        // call are not always laid over each other, so the loop has one of each. The rare
        // ones (a file, a lingering close) are boxed: a connection pays for them only
        // while it sends a file or lingers.
        // The connection's buffers as the budget of buffered bytes counts them, and whether
        // the budget paused its reads.
        let held = Held {
            w,
            bytes: Cell::new(0),
        };
        let mut paused = false;
        let end: Option<io::Error> = loop {
            held.set(bufs.held());
            if let Next::Fail(e) = next {
                break Some(e);
            }
            // Every other move sends the output first.
            match write_out(w, &mut io, &mut bufs, &mut pace).await {
                Ok(n) => ctx.sent += n,
                Err(e) => {
                    cut_for_deadline(&io, &e);
                    break Some(e);
                }
            }
            step.output_sent(&mut ctx);
            let then = match next {
                Next::Read {
                    wait,
                    timeout,
                    guarded,
                    grace,
                } => {
                    if !bufs.has_input() && bufs.held() > KEEP_BUFFERS {
                        // Between reads a connection keeps small buffers only (the size of
                        // its last request and response, reused by the next: no allocation
                        // per request); a large request's or response's are given back.
                        bufs = Buffers::none();
                        held.set(0);
                    }
                    ctx.set_idle(wait == Wait::Idle);
                    let max = step.max_request_size();
                    let got = read_input(&mut io, &mut bufs, max, timeout, &unread, w, (wait, paused)).await;
                    ctx.set_idle(false);
                    let again = Next::Read {
                        wait,
                        timeout,
                        guarded,
                        grace,
                    };
                    match got {
                        Input::Bytes(n) => {
                            ctx.received += n as u64;
                            w.moved_in.set(w.moved_in.get() + n as u64);
                            step.received(&mut now);
                            Then::Advance
                        }
                        Input::Eof => Then::Next(step.peer_closed(&bufs)),
                        Input::TimedOut => {
                            Then::Next(step.timed_out(&mut bufs, &mut ctx, peer, Instant::now()))
                        }
                        // The worker stops: the boundary again, where an idle HTTP
                        // connection drains.
                        Input::Stop => Then::Advance,
                        Input::Failed(e) => Then::Next(Next::Fail(e)),
                        // At the budget of buffered bytes: a request that is only starting
                        // is refused (the codec's refusal, HTTP 503 with `Retry-After`),
                        // one well into its body waits for room, as in the event loop.
                        Input::OverBudget => {
                            w.budget.borrow_mut().stopped(Instant::now(), w.open.get());
                            if Budget::refuses(bufs.input_capacity()) {
                                Then::Next(step.shed(&mut bufs, &mut ctx, peer, budget::REFUSAL))
                            } else {
                                paused = true;
                                Then::Next(again)
                            }
                        }
                        Input::Room => {
                            paused = false;
                            Then::Next(again)
                        }
                    }
                }
                Next::More => Then::Advance,
                Next::SendFile(body) => match Box::pin(send_file(w, &mut io, &body, &mut pace)).await {
                    Ok(n) => {
                        ctx.sent += n;
                        Then::Advance
                    }
                    Err(e) => {
                        cut_for_deadline(&io, &e);
                        break Some(e);
                    }
                },
                Next::Close { linger: wait } => {
                    match wait {
                        Some(wait) => Box::pin(linger(&mut io, wait)).await,
                        // TLS says its end (`close_notify`), best effort, as the event
                        // loop does: a client must not see a truncated stream.
                        None if io.get_ref().is_tls() => {
                            io.get_mut().close_notify();
                            let flush = async {
                                while io.get_ref().records_pending() {
                                    write_records(&mut io).await?;
                                }
                                Ok(())
                            };
                            let _ = Box::pin(bounded(Some(Duration::from_secs(1)), flush)).await;
                        }
                        None => {}
                    }
                    break None;
                }
                Next::Fail(_) => unreachable!("handled above"),
            };
            next = match then {
                Then::Advance => {
                    self.advance(&mut step, &mut bufs, &mut ctx, &io, &mut session, id, &unread)
                        .await
                }
                Then::Next(next) => next,
            };
        };
        drop(held);
        if let Some(e) = &end {
            log_connection_error(peer, e);
        }
        ctx.set_idle(false);
        // Its bytes are on the slot already, counted as they moved.
        ctx.closed(step.rejected().map(|(e, _)| e), end.as_ref().map(io::Error::kind));
    }

    fn on_worker_exit(&self) {
        self.handler.on_worker_exit();
    }

    async fn refuse(&self, w: &Worker<'_>, mut io: AsyncFd<Transport>, why: &'static str) {
        let mut step = Requests::new(self.handler.codec(), Limits::default());
        let mut bufs = Buffers::none();
        step.refuse(&mut bufs, why);
        if write_out(
            w,
            &mut io,
            &mut bufs,
            &mut Pace::Timeout(Some(Duration::from_secs(1))),
        )
        .await
        .is_ok()
        {
            // No waiting: a refused client may be one of many.
            linger(&mut io, Duration::ZERO).await;
        }
    }
}

impl<H: AsyncRequestHandler> RequestsOf<'_, H> {
    /// One call of the step, the handler bound to the connection for it.
    #[allow(clippy::too_many_arguments)]
    async fn advance(
        &self,
        step: &mut Requests<H::Codec>,
        bufs: &mut Buffers,
        ctx: &mut TaskContext<'_, '_>,
        io: &AsyncFd<Transport>,
        session: &mut H::Session,
        id: u64,
        unread: &Cell<bool>,
    ) -> Next {
        let peer = ctx.peer;
        let mut bound = Bound {
            handler: self.handler,
            info: ConnInfo {
                peer,
                tls: io.get_ref().tls(),
                id,
                socket: io.get_ref().socket(),
            },
            session,
            w: ctx.w,
            io,
            unread,
            label: ctx.label,
        };
        step.advance_async(bufs, &mut bound, ctx, peer, &mut Instant::now)
            .await
    }
}

/// What comes after a move of the request loop.
enum Then {
    /// The step's next call.
    Advance,
    /// What the step said already.
    Next(Next),
}

/// What a read found.
enum Input {
    Bytes(usize),
    Eof,
    TimedOut,
    /// The worker stops while the connection waits between requests.
    Stop,
    Failed(io::Error),
    /// The budget of buffered bytes leaves no room for the read.
    OverBudget,
    /// A connection paused at the budget may read again.
    Room,
}

/// A connection cut for a deadline (`--write-timeout`, `--request-timeout`: `e` is
/// `TimedOut`) is reset if the kernel still holds output for it (`SO_LINGER` 0, as the
/// blocking and event drivers cut a slow reader). Closed plainly, its socket would stay in
/// FIN-WAIT-1 trickling the rest to the slow reader, holding the send queue's memory
/// (100 readers of a 16 MiB response cut so: 267 MiB, 45 s later) after the connection
/// has left `--max-conns-per-ip`'s count (issue 42).
fn cut_for_deadline(io: &AsyncFd<Transport>, e: &io::Error) {
    use std::os::fd::AsFd;
    if e.kind() != io::ErrorKind::TimedOut {
        return;
    }
    let socket = io.get_ref().socket();
    if sys::unsent_bytes(socket.as_fd()).is_ok_and(|n| n > 0) {
        let _ = socket.set_linger(Some(Duration::ZERO));
    }
}

/// Ends when the client has closed its side (or the socket fails), whatever it sent before:
/// for a connection that does not read (paused at the budget).
async fn hung_up(io: &AsyncFd<Transport>) {
    loop {
        let Ok(mut guard) = io.ready(Interest::READABLE).await else {
            return;
        };
        if guard.ready().is_read_closed() {
            return;
        }
        // Bytes, not a close: wait for the next edge.
        guard.clear_ready_matching(tokio::io::Ready::READABLE);
    }
}

/// A connection's share of the worker's budget of buffered bytes, given back when the
/// connection ends (its future dropped, at any `.await`).
struct Held<'w, 'a> {
    w: &'w Worker<'a>,
    bytes: Cell<usize>,
}

impl Held<'_, '_> {
    fn set(&self, bytes: usize) {
        self.w.buffers_moved(self.bytes.replace(bytes), bytes);
    }
}

impl Drop for Held<'_, '_> {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// Reads what comes next into `bufs` (through the worker-wide scratch buffer), by the
/// wait's `timeout`; a wait between requests also ends at a stop. A connection `paused` at
/// the budget of buffered bytes waits for room instead.
async fn read_input(
    io: &mut AsyncFd<Transport>,
    bufs: &mut Buffers,
    max: usize,
    timeout: Option<Duration>,
    unread: &Cell<bool>,
    w: &Worker<'_>,
    (wait, paused): (Wait, bool),
) -> Input {
    let room = max.saturating_sub(bufs.unconsumed().len()).clamp(1, BUFFER_SIZE);
    let stoppable = wait == Wait::Idle && !w.stopping.get();
    let read = async {
        if !paused {
            return match read_some(io, bufs, room, w, unread).await {
                Ok(None) => Input::OverBudget,
                Ok(Some(0)) => Input::Eof,
                Ok(Some(n)) => Input::Bytes(n),
                Err(e) => Input::Failed(e),
            };
        }
        // Paused: what the client sent stays in the socket; the readiness is spent here,
        // so the read after the pause looks before it waits.
        unread.set(true);
        tokio::select! {
            () = w.room() => Input::Room,
            // A client that leaves is seen at once, as the event loop sees it: its
            // connection does not hold its buffers until its deadline.
            () = hung_up(io) => Input::Eof,
        }
    };
    let stop = async {
        if stoppable {
            w.stop.notified().await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let timed = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        input = read => input,
        () = stop => Input::Stop,
        () = timed => Input::TimedOut,
    }
}

/// The user's handler bound to one connection for the step, raced with what may cut its
/// call.
struct Bound<'h, 'c, 'w, 'a, H: AsyncRequestHandler> {
    handler: &'h H,
    info: ConnInfo<'c>,
    session: &'c mut H::Session,
    w: &'w Worker<'a>,
    io: &'c AsyncFd<Transport>,
    unread: &'c Cell<bool>,
    label: &'w Label,
}

impl<H: AsyncRequestHandler> HandleAsync<H::Codec> for Bound<'_, '_, '_, '_, H> {
    async fn handle<'r>(
        &'r mut self,
        req: &<H::Codec as Codec>::Request<'r>,
        res: &mut <H::Codec as Codec>::Response<'r>,
    ) -> (Result<io::Result<()>, Cut>, bool) {
        let mut conn = Conn::new(self.info, &mut *self.session);
        let limit = self.w.request_timeout;
        let (w, handler) = (self.w, self.handler);
        let outcome = {
            // The `--max-inflight` permit is waited for inside the call, so that the wait
            // too is bounded by the request timeout and ended by the client's close.
            let call = async {
                let _flight = w.in_flight().await;
                AssertUnwindSafe(handler.handle_request(&mut conn, req, res))
                    .catch_unwind()
                    .await
            };
            let mut call = std::pin::pin!(call);
            // A call that completes at its first poll (no `.await` that waits: the usual
            // request) needs neither a timer nor a watch on the client: both are armed only
            // for a call that waits (a timer costs its insertion into the runtime's wheel and
            // its removal, a watch a readiness registration).
            let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            let outcome = match first {
                Poll::Ready(r) => Some(r),
                Poll::Pending => None,
            };
            match outcome {
                Some(r) => Ok(r),
                None => {
                    let timeout = async {
                        match limit {
                            Some(t) => tokio::time::sleep(t).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        biased;
                        r = &mut call => Ok(r),
                        () = timeout => {
                            w.cut_by_timeout(&self.label.peer.borrow(), "a request");
                            Err(Cut::TimedOut(limit.unwrap_or_default()))
                        }
                        () = gone(self.io, self.unread) => Err(Cut::Gone),
                    }
                }
            }
        };
        let label = self.label;
        let handled = match outcome {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(p)) => {
                tracing::error!(
                    "the handler panicked on a request from {} ({:?}): {}; closing that connection, the worker goes on",
                    label.peer.borrow(),
                    String::from_utf8_lossy(&label.shown.borrow()),
                    panic_message(&*p)
                );
                Err(Cut::Panicked)
            }
            Err(cut) => Err(cut),
        };
        (handled, conn.take_penalized())
    }
}

/// The worker's side of a connection's step.
struct TaskContext<'w, 'a> {
    w: &'w Worker<'a>,
    peer: &'w Addr,
    label: &'w Label,
    /// The request in progress: when its first bytes came.
    request: Option<Instant>,
    received: u64,
    sent: u64,
    /// Counted among the idle keep-alive connections.
    idle: bool,
}

impl TaskContext<'_, '_> {
    fn set_idle(&mut self, idle: bool) {
        if idle != self.idle {
            self.idle = idle;
            let n = self.w.idle.get();
            self.w.idle.set(if idle { n + 1 } else { n - 1 });
        }
    }

    fn store_head(&mut self, head: Head<'_>) {
        let keep = |to: &RefCell<Vec<u8>>, bytes: &[u8]| {
            let mut to = to.borrow_mut();
            to.clear();
            to.extend_from_slice(&bytes[..bytes.len().min(HEAD_BYTES)]);
        };
        keep(&self.label.shown, head.shown);
        if self.w.ledger.borrow().logs_access() {
            keep(&self.label.raw, head.raw);
        }
    }

    /// The request's head, for the ledger.
    fn head(label: &Label) -> (std::cell::Ref<'_, Vec<u8>>, std::cell::Ref<'_, Vec<u8>>) {
        (label.raw.borrow(), label.shown.borrow())
    }

    /// The connection ended: a request left unanswered gets its line, as the other
    /// drivers record it.
    fn closed(&mut self, rejected: Option<&crate::codec::ProtocolError>, failed: Option<io::ErrorKind>) {
        let Some(started) = self.request.take() else {
            return;
        };
        let mut ledger = self.w.ledger.borrow_mut();
        if ledger.logs_access() {
            // By the one rule (issue 42).
            let outcome = Outcome::of(match (rejected, failed) {
                (Some(why), _) => End::Refused(why),
                (None, Some(kind)) => End::Failed(kind),
                (None, None) => End::Dropped,
            });
            let (raw, shown) = Self::head(self.label);
            ledger.request_head(Head {
                raw: &raw,
                shown: &shown,
            });
            ledger.request_unanswered(self.peer, outcome, started.elapsed(), (self.received, self.sent));
        }
    }
}

impl Context for TaskContext<'_, '_> {
    fn at_boundary(&mut self, _: &Socket, _: Duration) -> Boundary {
        Boundary::Wait
    }

    fn saturated(&mut self) -> bool {
        false
    }

    fn retiring(&mut self) -> bool {
        self.w.ledger.borrow().retiring()
    }

    fn stopping(&mut self) -> bool {
        self.w.stopping.get()
    }

    fn request_start(&mut self, head: Head<'_>) {
        self.request = Some(Instant::now());
        self.store_head(head);
    }

    fn request_head(&mut self, head: Head<'_>) {
        self.store_head(head);
    }

    fn refused(&mut self, _: &crate::codec::ProtocolError) {
        self.w.ledger.borrow_mut().refused();
    }

    fn request_end(&mut self, bytes: (u64, u64), ok: bool) {
        let Some(started) = self.request.take() else {
            return;
        };
        let mut ledger = self.w.ledger.borrow_mut();
        let (raw, shown) = Self::head(self.label);
        ledger.request_head(Head {
            raw: &raw,
            shown: &shown,
        });
        ledger.request_end(self.peer, started.elapsed(), bytes, ok);
        ledger.check_recycle();
    }
}

/// The client level's side: the user's handler, which owns each connection.
struct ClientsOf<'h, H> {
    handler: &'h H,
}

impl<H: AsyncHandler> Level for ClientsOf<'_, H> {
    fn refusal(&self) -> String {
        // A connection of the client level is read by its handler: the budget never
        // refuses it.
        String::new()
    }

    async fn serve(
        &self,
        w: &Worker<'_>,
        io: AsyncFd<Transport>,
        peer: &Addr,
        id: u64,
        bufs: Buffers,
        _label: &Label,
    ) {
        let started = Instant::now();
        let (read_timeout, write_timeout) = w.io_timeouts;
        let mut client = AsyncClient::new(
            io,
            peer.clone(),
            id,
            read_timeout,
            write_timeout,
            w.limits.min_send_rate,
        );
        client.prepend(bufs.unconsumed());
        // The `--max-inflight` permit (a session counts as one request in flight) is
        // waited for under the request timeout too.
        let call = async {
            let _flight = w.in_flight().await;
            AssertUnwindSafe(self.handler.handle_client(&mut client))
                .catch_unwind()
                .await
        };
        let outcome = match w.request_timeout {
            Some(t) => tokio::time::timeout(t, call).await.ok(),
            None => Some(call.await),
        };
        let mut close_gently = false;
        // By the one rule (issue 42), as the blocking loop records a `handle_client`
        // connection.
        let outcome = Outcome::of(match outcome {
            Some(Ok(Ok(()))) => {
                let _ = bounded(Some(Duration::from_secs(1)), async {
                    use tokio::io::AsyncWriteExt;
                    client.flush().await
                })
                .await;
                close_gently = true;
                End::Answered { ok: true }
            }
            Some(Ok(Err(e))) => {
                log_connection_error(peer, &e);
                End::Failed(e.kind())
            }
            Some(Err(p)) => {
                tracing::error!(
                    "the handler panicked on the connection from {peer}: {}; closing it, the worker goes on",
                    panic_message(&*p)
                );
                End::Panicked
            }
            None => {
                w.cut_by_timeout(peer, "the connection");
                End::Cut
            }
        });
        if matches!(outcome, Outcome::Timeout) {
            // A write past its deadline, or the request timeout: what the kernel still
            // holds for the client is dropped with the socket.
            cut_for_deadline(client.io(), &io::Error::from(io::ErrorKind::TimedOut));
        }
        let bytes = (client.received, client.sent);
        w.slot.add_bytes(bytes.0, bytes.1);
        w.ledger
            .borrow_mut()
            .connection_end(peer, outcome, started.elapsed(), bytes);
        w.ledger.borrow_mut().check_recycle();
        if close_gently {
            // The handler is done: its last reply goes out with the close, which lingers
            // (what the client still sends is read and dropped until its own close, 2 s
            // at most), so that unread input does not make the kernel reset the
            // connection under that reply.
            let mut io = client.into_io();
            Box::pin(linger(&mut io, step::LINGER)).await;
        }
    }

    fn on_worker_exit(&self) {
        self.handler.on_worker_exit();
    }

    async fn refuse(&self, _w: &Worker<'_>, _io: AsyncFd<Transport>, _why: &'static str) {
        // No codec to say why: closed at once.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 41: calls cut by `--request-timeout` are told once per episode: the first,
    /// then a line a minute at most with the count since, and the episode ends after
    /// [`CUTS_QUIET`] without a cut; the next cut starts a new one, told at once.
    #[test]
    fn issue_41_cuts_are_told_once_per_episode() {
        let mut cuts = Cuts::default();
        let t = Instant::now();
        assert_eq!(cuts.cut(t), Some(0), "the first of an episode is told");
        for i in 1..1000 {
            assert_eq!(cuts.cut(t + Duration::from_millis(i)), None);
        }
        assert_eq!(cuts.quiet_at(), Some(t + Duration::from_millis(999) + CUTS_QUIET));
        assert_eq!(
            cuts.cut(t + Duration::from_secs(61)),
            Some(999),
            "a line a minute"
        );
        assert_eq!(cuts.total, 1001);
        cuts.end(Some(Duration::from_secs(1)));
        assert_eq!((cuts.quiet_at(), cuts.total), (None, 0));
        assert_eq!(cuts.cut(t + Duration::from_secs(62)), Some(0), "a new episode");
    }
}

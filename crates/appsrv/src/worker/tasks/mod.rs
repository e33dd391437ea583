//! The async driver (issue 33): async handlers ([`AsyncRequestHandler`],
//! [`AsyncHandler`]) in event workers, each connection a future of a current-thread tokio
//! runtime that the worker builds after the fork.
//!
//! How the runtime and appsrv share the worker:
//! - **The runtime owns the waiting.** Its reactor (one epoll instance, made in
//!   [`Driver::prepare`], so a failure is a start failure) watches the listeners, the
//!   connections and the handlers' own sockets (a database, another service) alike; its
//!   timers serve the deadlines and `tokio::time`. appsrv's own loop (`event/`) cannot
//!   run beside it: a second epoll instance would need one of them to block in the other.
//!   The runtime is `current_thread`: no thread starts unless a handler asks for one
//!   (`spawn_blocking`), and the process stays a one-thread worker like the others.
//! - **appsrv keeps the connection's steps.** Each accepted connection is one future that
//!   runs the same I/O-free machines as the other drivers: admission (`admission.rs`:
//!   PROXY header, access rules, penalty, TLS, the per-address cap), then the request
//!   step (`conn/step.rs`, its handler call awaited: [`Requests::advance_async`](crate::conn::step::Requests::advance_async)) or the
//!   client level's handler with an [`AsyncClient`](crate::AsyncClient); and the same [`Ledger`](crate::worker::ledger::Ledger) (counts, access
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
//!   [`AsyncClient::stopped`](crate::AsyncClient::stopped) tells a handler to end its dialogue (SMTP's `421`).
//!
//! The files, by role (each uses only those before it in this list, and `mod.rs` them all):
//! - `worker.rs`: the worker's state its connections share ([`Worker`]: the counts the
//!   slot shows, the budget of buffered bytes, `--max-inflight`, the cut and slow-poll
//!   episodes) and the driver's [`Settings`];
//! - `accept.rs`: the listeners' epoll instance (`EPOLLEXCLUSIVE`) and accepting from it;
//! - `turn.rs`: the poll wrappers, the whole run as the slot's turn and each connection's
//!   poll timed against `--slow-request`;
//! - `bytes.rs`: the request level's reads and writes as the worker counts them, over the
//!   readiness rules of `conn/async_transport.rs` (which `AsyncClient` follows too);
//! - `run.rs`: the accept loop, and a connection's future from accept to close (admission
//!   awaited, then its [`Level`]'s part);
//! - `requests.rs` and `clients.rs`: the request level (the step's loop, the handler call
//!   raced with the request timeout and the client's close) and the client level;
//! - `mod.rs`: the driver ([`Tasks`]: the runtime, the signals' eventfd, the listeners'
//!   epoll made before `Ready`) and the run of the levels on the runtime.

use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::handler::{AsyncHandler, AsyncRequestHandler};
use crate::scoreboard::{Slot, State};
use crate::sys::{self, EpollFd};

use self::accept::listeners_epoll;
use self::clients::ClientsOf;
use self::requests::RequestsOf;
use self::run::Level;
use self::turn::Turned;
use self::worker::{Settings, Worker};
use crate::worker::Setup;
use crate::worker::driver::Serves;
use crate::worker::driver::{Driver, Extras, Shared};
use crate::worker::ledger::contain;
use crate::worker::serve::{AsyncClientLevel, AsyncRequestLevel, Limits};

mod accept;
mod bytes;
mod clients;
mod requests;
mod run;
mod turn;
mod worker;

/// The async driver: the runtime and the wake-up descriptor, made before `Ready`, and its
/// own settings.
pub(crate) struct Tasks<'a> {
    runtime: tokio::runtime::Runtime,
    wake: EventFd,
    /// The stream listeners, in an epoll instance of the worker's own (see [`Accept`](accept::Accept)).
    accepting: EpollFd,
    /// The async driver's own settings.
    settings: Settings,
    _setup: std::marker::PhantomData<&'a ()>,
}

impl std::fmt::Debug for Tasks<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tasks")
            .field("settings", &self.settings)
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
            settings: Settings {
                max_connections: setup.drivers.worker_connections.max(1),
                max_inflight: setup.drivers.tasks.max_inflight,
                request_timeout: setup.drivers.tasks.request_timeout,
                io_timeouts: (setup.drivers.tasks.read_timeout, setup.conn.write_timeout),
                slow_request: setup.drivers.slow_request,
                peers: setup.peers,
            },
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

/// How long the runtime runs after the handler's `on_worker_exit`, for the tasks it
/// ends to finish (a database connection's goodbye).
const EXIT_GRACE: Duration = Duration::from_millis(20);

/// The driver and the worker's context, handed to the level.
struct Run<'a> {
    driver: Tasks<'a>,
    shared: Shared<'a>,
}

impl Run<'_> {
    /// Runs the worker with `level` (the request level's step limits, if it is that level)
    /// until it exits; returns its exit status.
    fn go<L: Level>(self, level: &L, step_limits: Option<Limits>) -> i32 {
        let Run { driver, shared } = self;
        let Tasks {
            runtime,
            wake,
            accepting,
            settings,
            _setup,
        } = driver;
        let slot = shared.slot;
        slot.set_event();
        shared.board.set_state(shared.id, State::Reading);
        let worker = Worker::new(
            shared,
            &settings,
            step_limits.unwrap_or_default(),
            level.refusal(),
        );
        let local = tokio::task::LocalSet::new();
        let run = Turned::new(
            slot,
            &worker,
            // Out of tokio's cooperative budget (128 operations per poll of a task): every
            // connection of the worker is in this one task, whose budget would make it
            // yield to the runtime (another `epoll_wait`) every 128 reads and writes under
            // load. It yields anyway when nothing is ready, and `FuturesUnordered` yields
            // once it has polled each of its futures, so the handlers' own tasks (a
            // database connection's) still run in between. Measured: the front page's 36 rows at
            // c = 500, 11,000 -> 13,200 requests/s, 82 -> 68 µs of CPU per request.
            // The `LocalSet`'s tasks (those the handlers `spawn_local`) are polled inside
            // this turn too, so the master's watch sees one of them that blocks the thread.
            local.run_until(tokio::task::unconstrained(worker.run(
                level,
                std::os::fd::AsFd::as_fd(&wake),
                accepting,
            ))),
        );
        let served = contain(|| runtime.block_on(run));
        match served {
            Ok(code) => {
                goodbye(level, &runtime, &local);
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

/// The handler's goodbye (`on_worker_exit`), run in the runtime before it is dropped: what
/// it closes (a database connection) may have a task of its own to finish (the protocol's
/// goodbye), which is given a moment to run.
fn goodbye<L: Level>(level: &L, runtime: &tokio::runtime::Runtime, local: &tokio::task::LocalSet) {
    let goodbye = async {
        level.on_worker_exit();
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(EXIT_GRACE).await;
    };
    if let Err(p) = contain(|| local.block_on(runtime, goodbye)) {
        tracing::error!("on_worker_exit panicked: {}", p.0);
    }
}

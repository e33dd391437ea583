//! The life of a worker process, from fork to exit.
//!
//! In order, right after fork (see `docs/ARCHITECTURE.md`):
//! 1. the log lines say `worker N` and the worker's pid;
//! 2. the master's signal handlers are replaced by the worker's ([`sys::install_worker_signals`]);
//! 3. descriptors that only the master needs are closed; with `Server::privileged`, the
//!    worker forks its privileged helper now, still root (`privileged/helper.rs`), and
//!    waits until it is ready;
//! 4. the umask, resource limits and chroot are applied (they need root);
//! 5. privileges are dropped (groups, gid, uid) and checked;
//! 6. the parent-death signal is set (after the drop, which clears it) and the parent checked;
//! 7. no-new-privs, then the sandbox (Landlock, then seccomp), when asked for;
//! 8. the `on_worker_start` hook, then the factory (and, with datagram listeners, the
//!    datagram handler's factory), run; a failure is reported to the master with its
//!    reason and the worker exits;
//! 9. its copy of the access log (the one reopened on USR1 if the master left it in the
//!    worker's log channel, `process/reopen.rs`), its scoreboard slot and its driver, chosen
//!    by the handler's level ([`ServedBy`], `pairing.rs`) and prepared with what it needs
//!    from the system (an acceptor, an epoll instance, a runtime: `driver.rs`), so that a
//!    failure there is a start failure;
//! 10. the worker tells the master it is ready and its driver serves connections until
//!     asked to stop: one at a time (`blocking.rs`), all at once from an event loop
//!     (`event/`), as a hybrid front or worker (`hybrid.rs`), or a future per connection
//!     (`tasks/`); each connection's life in the accounts is `life.rs`'s, the same in
//!     every driver.
//!
//! The worker never returns into the master's code: every path ends in `_exit`.

mod accept;
pub(crate) mod access;
pub(crate) mod admission;
pub(crate) mod blocking;
pub(crate) mod budget;
pub(crate) mod datagram;
mod driver;
pub(crate) mod event;
pub(crate) mod front;
mod guard;
mod hybrid;
pub(crate) mod ledger;
mod life;
#[cfg(test)]
mod one;
mod pairing;
mod reactor;
pub(crate) mod serve;
pub(crate) mod tasks;

use std::os::fd::{AsFd, RawFd};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::time::Duration;

use crate::scoreboard::Board;

use ledger::{panic_message, record_panic};

use nix::unistd::Pid;

use crate::confine::privilege::Plan;
use crate::error::BoxError;
use crate::handler::WorkerInfo;
use crate::net::listener::Listener;
use crate::process::notify::{Channel, Message};
use crate::sys::{self, exit};

/// A worker's recycling limits, drawn by the master for this worker (jitter included);
/// 0 means no limit. Defined here, not by a connection loop, so that the master depends on
/// the worker's interface only, whatever loop serves.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Recycle {
    pub(crate) max_requests: u64,
    pub(crate) max_connections: u64,
}

/// What a child of the master is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A worker: it runs the handler.
    Worker,
    /// A hybrid front (`--io hybrid`): an event loop that accepts, admits and reads
    /// connections until they have a whole request, and hands them to the workers. It
    /// makes a handler with the factory too, for its codec, and never calls it otherwise.
    Front,
}

/// What the master hands a worker at fork.
#[derive(Debug)]
pub(crate) struct Setup<'a> {
    pub(crate) id: u32,
    pub(crate) master: Pid,
    pub(crate) listeners: &'a [Listener],
    pub(crate) plan: &'a Plan,
    pub(crate) channel: &'a Channel,
    /// Descriptors of the master's own that the worker closes.
    pub(crate) master_fds: &'a [RawFd],
    /// The log file (for the log line after USR1, when the master hands the worker the
    /// reopened one: the worker never opens it).
    pub(crate) log_path: Option<&'a Path>,
    /// The shared board (idle workers).
    pub(crate) board: &'static Board,
    /// This worker's recycling limits.
    pub(crate) recycle: Recycle,
    /// The access log's path and the file the master opened at start, when there is one.
    pub(crate) access_log: Option<(&'a Path, &'a std::fs::File)>,
    /// At most this many connections from one client address at once.
    pub(crate) max_per_ip: Option<usize>,
    /// Event mode with a per-address cap: the connections per client address of every
    /// worker (this one counts its own in its table).
    pub(crate) peers: Option<&'static crate::peer_counts::PeerCounts>,
    /// Chroot, resource limits, umask, no-new-privs, sandbox.
    pub(crate) confinement: &'a crate::confine::privilege::Confinement,
    /// The TLS listeners' configurations, and the handshake's time limit.
    pub(crate) tls: crate::net::tls::ForWorker,
    /// Deadlines of each connection outside the request loop.
    pub(crate) conn: ConnLimits,
    /// The I/O model (`--io`).
    pub(crate) io: Model,
    /// A worker or a hybrid front.
    pub(crate) role: Role,
    /// Hybrid mode: the hand-off channel (each side closes the end it does not use).
    pub(crate) handoff: Option<&'a crate::net::handoff::Channel>,
    /// Each driver's own settings, which the master carries without reading them.
    pub(crate) drivers: Drivers,
}

/// Each driver's own settings (issue 43), made from the command line by `dispatch` and
/// carried by the master to every worker as they are: the master reads none of them, so
/// that a driver's setting is a field here and a line in `dispatch`, not a field of the
/// master's (nginx's modules own their configuration the same way).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drivers {
    /// The blocking drivers: the idle timeout between requests, for the keep-alive guard
    /// (`--keepalive-timeout`).
    pub(crate) keepalive_timeout: Option<Duration>,
    /// The event loop and the async driver: `--worker-connections`.
    pub(crate) worker_connections: usize,
    /// The event loop and the async driver: `--slow-request`.
    pub(crate) slow_request: Option<Duration>,
    /// The datagram side of an event loop.
    pub(crate) datagram: datagram::Settings,
    /// The async driver's limits.
    pub(crate) tasks: AsyncLimits,
}

/// The limits only the async driver enforces in the worker (issue 33).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AsyncLimits {
    /// `--max-inflight`: handler calls at once (0: no limit).
    pub(crate) max_inflight: usize,
    /// `--request-timeout`: a handler call is cancelled past it (the master's watch is
    /// then for a thread stuck in one poll).
    pub(crate) request_timeout: Option<Duration>,
    /// `--read-timeout`, for the client level's reads.
    pub(crate) read_timeout: Option<Duration>,
}

/// The I/O model a worker runs (`--io`). The master maps the command line's `cli::Io` to
/// it: the worker layer sits below the command line and does not name its types (issue
/// 32's layering test found `crate::Io` here, which it used to skip as a re-export).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Model {
    /// One connection at a time, blocking I/O (`--io blocking`).
    Blocking,
    /// One epoll loop over all the worker's connections (`--io event`).
    Event,
    /// Fronts hand whole requests to blocking workers (`--io hybrid`).
    Hybrid,
    /// A future per connection on a runtime in each worker (`--io async`): the model of
    /// async handlers, and theirs only.
    Async,
}

/// Per-connection limits that the worker enforces outside the request loop.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ConnLimits {
    /// A PROXY protocol header must be complete within this of the connection's accept
    /// (`--header-timeout`; `None`: each read is bounded by the read timeout only).
    pub(crate) header_timeout: Option<std::time::Duration>,
    /// The slowest acceptable reading of a response, in bytes per second
    /// (`--min-send-rate`; 0: no limit).
    pub(crate) min_send_rate: u64,
    /// The write timeout the handler sees (`--write-timeout`), kept by the send watch
    /// when `min_send_rate` is on (the socket's own timeout is then one second).
    pub(crate) write_timeout: Option<std::time::Duration>,
    /// Event loops (event workers, hybrid fronts): the budget of request bytes held in
    /// connections' buffers (`--max-buffered-bytes`; 0: no budget).
    pub(crate) max_buffered: usize,
}

/// The type of a start hook.
pub(crate) type StartHook = Box<dyn FnMut(&WorkerInfo)>;

/// Runs a worker to its end. Called in the child right after fork.
///
/// The steps of the module's list, in order, each a function of its own so that this one
/// reads as the list does: every step before `Ready` returns its failure as a reason,
/// which becomes a start failure here (`fail_start`); the chosen loop then serves until
/// it is asked to stop, and its exit code is the process's.
pub(crate) fn run<C, F>(
    setup: Setup<'_>,
    start_hook: &mut Option<StartHook>,
    helper: &mut Option<Box<dyn crate::privileged::Spawn>>,
    datagrams: &mut Option<datagram::Factory>,
    factory: &mut F,
) -> !
where
    C: ServedBy,
    F: FnMut() -> Result<C, BoxError>,
{
    crate::process::log::set_worker(setup.id);
    crate::conn::id::set_worker(setup.id, setup.board.slot(setup.id).map_or(0, |s| s.generation()));
    let pid = std::process::id();
    let fail = |reason: String| -> ! { fail_start(setup.channel, pid, reason) };
    if let Err(e) = sys::install_worker_signals() {
        fail(format!("installing signal handlers: {e}"));
    }
    let handoff = leave_the_master(&setup);
    if let Err(reason) = confine(&setup, helper, pid) {
        fail(reason);
    }
    panic::set_hook(Box::new(record_panic));
    let has_datagram_listeners = setup.listeners.iter().any(Listener::is_datagram);
    let (mut handler, datagram_handler) = match make_handlers(
        &setup,
        pid,
        start_hook,
        factory,
        datagrams,
        has_datagram_listeners,
    ) {
        Ok(made) => made,
        Err(reason) => fail(reason),
    };
    let access = match open_access_log(&setup) {
        Ok(access) => access,
        Err(reason) => fail(reason),
    };
    let extras = driver::Extras {
        handoff,
        datagrams: datagram_handler,
    };
    let code = handler.start(Start {
        setup: &setup,
        pid,
        access,
        extras,
        datagram_listeners: has_datagram_listeners,
    });
    if code == exit::OK {
        if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| handler.on_worker_exit())) {
            tracing::error!("on_worker_exit panicked: {}", panic_message(&p));
        }
        tracing::debug!("stopped");
    }
    sys::exit_now(code)
}

/// Ends a worker that could not start: the reason goes to the log and to the master (which
/// backs off on start failures rather than forking again at once), and the exit code says
/// so too, for a master that missed the message.
fn fail_start(channel: &Channel, pid: u32, reason: String) -> ! {
    tracing::error!("cannot start: {reason}");
    let _ = channel.send(pid, &Message::StartFailed(reason));
    sys::exit_now(exit::START_FAILED)
}

/// Step 3's first half: closes what only the master needs and, for a hybrid front, names
/// the process and its log lines. Returns this side's end of the hybrid hand-off channel,
/// borrowed from the master's `Channel` for the worker's life (`run` never returns), so
/// that the worker cannot close or reuse it by mistake.
fn leave_the_master<'a>(setup: &Setup<'a>) -> Option<std::os::fd::BorrowedFd<'a>> {
    let (handoff, other_end) = match (setup.handoff, setup.role) {
        (Some(ch), Role::Front) => (Some(ch.fronts()), Some(ch.not_for_fronts())),
        (Some(ch), Role::Worker) => (Some(ch.workers()), Some(ch.not_for_workers())),
        (None, _) => (None, None),
    };
    let master_fds: Vec<RawFd> = setup.master_fds.iter().copied().chain(other_end).collect();
    // SAFETY: these are the master's descriptors (signal pipe, notification read end, the
    // hand-off channel's end this side does not use); their owners live in the master's
    // part of this copied address space, which the worker never returns to.
    unsafe { sys::close_inherited(&master_fds) };
    if setup.role == Role::Front {
        crate::process::log::set_front(setup.id);
        let program = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
        sys::set_process_name(&format!("front:{}", program.trim_end()));
    }
    handoff
}

/// Steps 3 (the helper) to 7: everything that needs root comes before the drop, and the
/// order matters. The privileged helper is forked first, still root and before the chroot,
/// the limits and the drop: it confines itself (privileged/helper.rs). The parent-death
/// signal is set after the drop, which clears it. An orphaned worker (its master died
/// before this point) exits at once, without a start failure: there is nobody to tell.
fn confine(
    setup: &Setup<'_>,
    helper: &mut Option<Box<dyn crate::privileged::Spawn>>,
    pid: u32,
) -> Result<(), String> {
    if let Some(helper) = helper.as_mut().filter(|_| setup.role == Role::Worker) {
        let (uid, gid) = match setup.plan {
            Plan::Drop(c) => (c.uid.as_raw(), c.gid.as_raw()),
            Plan::Keep => (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw()),
        };
        let helper_setup = crate::privileged::HelperSetup {
            worker: setup.id,
            worker_pid: pid,
            uid,
            gid,
            sandbox: setup.confinement.helper_sandbox.as_ref(),
        };
        helper.spawn(&helper_setup)?;
    }
    setup.confinement.before_drop()?;
    if let Plan::Drop(creds) = setup.plan {
        crate::confine::privilege::drop_to(creds)
            .map_err(|reason| format!("dropping privileges to user {:?}: {reason}", creds.user))?;
    }
    match sys::die_with_parent(setup.master) {
        Ok(true) => {}
        Ok(false) => sys::exit_now(exit::ORPHANED),
        Err(e) => return Err(format!("setting the parent-death signal: {e}")),
    }
    // The logs are never opened by path in a worker (the master hands it the reopened
    // files): the sandbox gives it no access to their directories.
    if let Some(warning) = setup.confinement.after_drop()? {
        tracing::warn!("{warning}");
    }
    Ok(())
}

/// Step 8: the user's code runs for the first time, confined: the start hook, then the
/// handler factory and, when there are datagram listeners, the datagram handler's factory.
/// A panic in any of them is contained and becomes a start failure with its message, like
/// an error: the master must learn why the worker did not start, not see it crash.
#[allow(clippy::type_complexity)]
fn make_handlers<C, F>(
    setup: &Setup<'_>,
    pid: u32,
    start_hook: &mut Option<StartHook>,
    factory: &mut F,
    datagrams: &mut Option<datagram::Factory>,
    has_datagram_listeners: bool,
) -> Result<(C, Option<Box<dyn crate::handler::DatagramHandler>>), String>
where
    F: FnMut() -> Result<C, BoxError>,
{
    let info = WorkerInfo { id: setup.id, pid };
    if let Some(hook) = start_hook.as_mut() {
        if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| hook(&info))) {
            return Err(format!(
                "the on_worker_start hook panicked: {}",
                panic_message(&p)
            ));
        }
    }
    let handler = match panic::catch_unwind(AssertUnwindSafe(factory)) {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => return Err(format!("the handler factory failed: {e}")),
        Err(p) => return Err(format!("the handler factory panicked: {}", panic_message(&p))),
    };
    let datagram_handler = match datagrams.as_mut() {
        Some(make) if has_datagram_listeners => match panic::catch_unwind(AssertUnwindSafe(make)) {
            Ok(Ok(h)) => Some(h),
            Ok(Err(e)) => return Err(format!("the datagram handler factory failed: {e}")),
            Err(p) => return Err(format!("the datagram handler factory panicked: {}", panic_message(&p))),
        },
        None if has_datagram_listeners => {
            return Err(
                "this server has datagram listeners (udp://, unixgram:) but no datagram handler (Server::datagrams)"
                    .into(),
            )
        }
        _ => None,
    };
    Ok((handler, datagram_handler))
}

/// Step 9's first part: this worker's own copy of the access log. Everything the loop
/// needs from the system comes before `Ready`, so that a failure is a start failure, with
/// its reason. The files the master reopened on a USR1 before this worker was forked, if
/// any, replace the one opened at start.
fn open_access_log(setup: &Setup<'_>) -> Result<Option<access::AccessLog>, String> {
    let mut access = match setup.access_log.map(|(_, f)| f.try_clone()) {
        Some(Ok(file)) => Some(access::AccessLog::new(file)),
        Some(Err(e)) => return Err(format!("opening the access log: {e}")),
        None => None,
    };
    if let (Some(log), Some(file)) = (access.as_mut(), take_logs(None)) {
        log.replace(file);
    }
    Ok(access)
}

/// A handler level (`serve.rs`) and the drivers that serve it (issue 43): each level
/// starts the driver its set-up chooses, among those that implement
/// [`Serves`](driver::Serves) for it (`pairing.rs`), so that a pair that does not exist
/// (an async handler in the blocking loop) cannot be written, and no driver has a case
/// for a level it cannot serve.
pub(crate) trait ServedBy: Sized {
    /// Steps 9 and 10: serves with the driver chosen for this level from `start`'s
    /// set-up, until a stop; returns the worker's exit status.
    fn start(&mut self, start: Start<'_>) -> i32;

    /// The handler's `on_worker_exit`, after a clean stop (an async level's driver calls
    /// it itself, in its runtime, where what it closes may have a task to finish).
    fn on_worker_exit(&mut self);
}

/// What a level needs to start its driver: the set-up and what the worker made before.
pub(crate) struct Start<'a> {
    setup: &'a Setup<'a>,
    pid: u32,
    access: Option<access::AccessLog>,
    extras: driver::Extras<'a>,
    datagram_listeners: bool,
}

impl<'a> Start<'a> {
    /// The I/O model (`--io`).
    pub(crate) fn model(&self) -> Model {
        self.setup.io
    }

    /// A worker or a hybrid front.
    pub(crate) fn role(&self) -> Role {
        self.setup.role
    }

    /// Whether the server has datagram listeners (served from an event loop).
    pub(crate) fn datagram_listeners(&self) -> bool {
        self.datagram_listeners
    }

    /// Starts driver `D` over `level` (see [`start`]).
    pub(crate) fn run<D: driver::Serves<'a, L>, L>(self, level: &mut L) -> i32 {
        start::<D, L>(self.setup, self.pid, level, self.access, self.extras)
    }

    /// The set-up asks for a pair the configuration check refuses before start (it is
    /// reported here too, as a start failure with `reason`, should a check be missing).
    pub(crate) fn refused(self, reason: &str) -> i32 {
        fail_start(self.setup.channel, self.pid, reason.to_owned())
    }
}

/// Steps 9 and 10 with driver `D`: its slot and what it needs from the system are set up
/// before `Ready` (a failure there is a start failure), then it serves until asked to
/// stop; returns its exit code.
fn start<'a, D: driver::Serves<'a, C>, C>(
    setup: &'a Setup<'a>,
    pid: u32,
    level: &mut C,
    access: Option<access::AccessLog>,
    extras: driver::Extras<'a>,
) -> i32 {
    let Some(slot) = setup.board.slot(setup.id) else {
        fail_start(setup.channel, pid, format!("no scoreboard slot {}", setup.id))
    };
    let driver = match D::prepare(setup, slot, extras) {
        Ok(d) => d,
        Err(reason) => fail_start(setup.channel, pid, reason),
    };
    ready(setup.channel, pid);
    let (log_path, channel) = (setup.log_path, setup.channel);
    let reopen_log = Box::new(move || take_logs(Some(log_path)));
    let retire = Box::new(move || {
        let _ = channel.send(pid, &Message::Retire);
    });
    let shared = driver::Shared {
        id: setup.id,
        board: setup.board,
        slot,
        listeners: setup.listeners,
        tls: &setup.tls,
        limits: setup.conn,
        max_per_ip: setup.max_per_ip,
        ledger: ledger::Ledger::new(slot, access, setup.recycle, retire, reopen_log),
    };
    driver.serve(shared, level)
}

/// Tells the master that the worker is ready.
fn ready(channel: &Channel, pid: u32) {
    if channel.send(pid, &Message::Ready).is_err() {
        // The master is gone or broken; the parent-death signal will follow.
        sys::exit_now(exit::ORPHANED);
    }
    tracing::debug!("ready");
}

/// Takes the log files the master reopened and left in this worker's log channel
/// (`process/reopen.rs`): the new log file goes over stderr at once; the new access log is
/// returned, for the loop to put in place of its own. `logged`: the log file's path, to say
/// so in the log (after a USR1; nothing is said at start).
fn take_logs(logged: Option<Option<&Path>>) -> Option<std::fs::File> {
    let files = crate::process::reopen::receive();
    if let Some(fd) = files.log {
        // The worker's privileged helper, if any, logs to the same file.
        crate::privileged::forward_log(fd.as_fd());
        match crate::process::log::redirect_stderr(&fd) {
            Ok(()) => {
                if let Some(path) = logged {
                    let path = path.map_or_else(String::new, |p| format!(" {}", p.display()));
                    tracing::info!("reopened the log file{path} (handed over by the master)");
                }
            }
            Err(e) => {
                tracing::error!("cannot switch to the reopened log file: {e}; still logging to the old one")
            }
        }
    }
    files.access.map(std::fs::File::from)
}

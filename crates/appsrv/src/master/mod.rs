//! The master process: a single-threaded supervisor that never runs handler code.
//!
//! It owns the listeners (bound before it forks), forks the workers, replaces those that
//! die, and stops the pool on TERM, INT or QUIT. It sleeps in one `poll(2)` (`wait`) on:
//!
//! - the signal socket pair (`signals.rs`: written by the signal handlers, so that no
//!   signal is handled in signal context and none is lost between a check and the poll);
//! - the workers' notification pipe (`Ready`, `StartFailed`, `Retire`);
//! - the wake-up eventfd, which a worker writes when the pool runs short of idle workers;
//! - the control socket and its connections (not in a master started by an upgrade until
//!   it serves), and the `/metrics` listener and its connections (`control.rs`);
//! - during a binary upgrade, the new master's readiness pipe (`upgrade.rs`);
//! - with an on-demand pool that has no idle worker and may grow, the listening sockets;
//!
//! with a timeout at the next deadline: the next replacement (back-off, pacing), the next
//! pool round, the slow-client watch, a periodic look at the workers (`TICK`: timeouts,
//! recycling by age or memory), the history's next sample (once a second: the rates now
//! and the status page's charts, `control/history.rs`), the end of the grace period, a control or metrics
//! connection's, the upgrade's. Child exits are collected with `waitpid(WNOHANG)` after a
//! SIGCHLD.
//!
//! The parts of the master have files of their own: `startup.rs` (from the command line to
//! the loop), `signals.rs`, `control.rs` (the control dispatch and the status snapshot),
//! `upgrade.rs` (the binary upgrade driver), `pool.rs` (the pool policy, pacing and
//! back-off) and `holds.rs` (the slow-client watch); the loop, spawning, reaping,
//! recycling and reload are here.

mod control;
pub(crate) mod holds;
pub(crate) mod pool;
pub(crate) mod queue;
mod signals;
pub(crate) mod startup;
mod upgrade;

use control::Counters;
use signals::Signals;
use upgrade::Upgrade;
pub(crate) use upgrade::UpgradeSettings;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{self, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::control::{Control, MetricsListener};
use crate::error::Error;
use crate::net::listener::Listener;
use crate::peer_counts::PeerCounts;
use crate::process::notify::{Channel, Message};
use crate::scoreboard::{self, Board, State};
use crate::sys::{self, exit};
use crate::worker::{Recycle, Role};
use pool::{Backoff, Jitter, Pacer, Policy, SpawnRate, Verdict};

/// What a round of the master's loop left: whether the loop goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stepped {
    /// The master has more to do.
    Going,
    /// The phase `Stopping` saw its last worker leave: the master returns.
    Stopped,
}

/// The master's phases, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Forking the first workers, waiting for each to report ready.
    Starting,
    /// Serving; dead workers are replaced, the pool follows its policy.
    Running,
    /// A stop asked with a drain delay (`--drain-delay`): out of the rotation (`/readyz`
    /// answers 503) while the listeners stay open and the pool serves, and is kept, as
    /// when running, until `until`; then the stop `signal` asked for begins.
    Draining {
        until: Instant,
        signal: Signal,
        /// When the stop was asked, to tell a deliberate second signal from a duplicate.
        since: Instant,
    },
    /// Listeners shut, workers finishing their connections until the deadline.
    Stopping {
        deadline: Instant,
        killed: bool,
        /// When the stop began, to tell a deliberate second signal from a duplicate.
        since: Instant,
    },
}

impl Phase {
    /// A graceful stop that begins now, with `grace` for the connections in progress.
    fn stopping(grace: Duration) -> Phase {
        let now = Instant::now();
        Phase::Stopping {
            deadline: now + grace,
            killed: false,
            since: now,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Running => "running",
            // A balancer or a script sees the stop from its first moment.
            Phase::Draining { .. } | Phase::Stopping { .. } => "stopping",
        }
    }
}

use crate::process::daemon::REPEAT_WINDOW;

/// How often the master looks at its workers when it has periodic duties (a dynamic pool,
/// timeouts, recycling by age or memory).
const TICK: Duration = Duration::from_millis(250);
/// How often worker memory is sampled (reading smaps costs).
const MEMORY_INTERVAL: Duration = Duration::from_secs(1);
/// After SIGABRT, how long a stuck worker has to dump core before SIGKILL.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// Why a worker is asked to leave while the pool goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leave {
    /// Recycled (request, connection, memory or age limit): replaced first, then stopped.
    Recycle(&'static str),
    /// Surplus idle worker of a dynamic or on-demand pool, or a shrunk pool: not replaced.
    Surplus,
}

#[derive(Debug)]
struct Worker {
    id: u32,
    /// The generation it belongs to (a reload starts the next one).
    generation: u32,
    spawned: Instant,
    ready: bool,
    /// A start failure the worker reported before it exited.
    failure: Option<String>,
    /// Asked to leave (or about to be).
    leaving: Option<Leave>,
    /// SIGTERM sent.
    stop_sent: bool,
    /// When SIGTERM was sent to a worker asked to leave while the pool goes on: after the
    /// grace period it is killed, as on a stop.
    stop_at: Option<Instant>,
    /// Killed by the master for exceeding the request timeout, and when.
    timed_out: Option<Instant>,
    /// Killed by the master for using over twice `--max-worker-memory` while leaving.
    memory_killed: bool,
    /// The master's end of the worker's log channel (`process/reopen.rs`).
    logs: Option<OwnedFd>,
    /// A hybrid front (`--io hybrid`), not a worker: not counted in the pool.
    front: bool,
}

impl Worker {
    /// A worker just forked into slot `id`.
    fn new(id: u32, generation: u32) -> Worker {
        Worker {
            id,
            generation,
            spawned: Instant::now(),
            ready: false,
            failure: None,
            leaving: None,
            stop_sent: false,
            stop_at: None,
            timed_out: None,
            memory_killed: false,
            logs: None,
            front: false,
        }
    }

    /// Whether the worker counts towards the pool's size: not on its way out.
    fn active(&self) -> bool {
        self.leaving.is_none() && self.timed_out.is_none()
    }
}

/// Recycling and timeout settings.
#[derive(Debug, Clone, Default)]
pub(crate) struct Limits {
    /// Per-worker request and connection limits before jitter.
    pub(crate) recycle: Recycle,
    /// Added to each limit: a number from 0 to this, drawn for each worker.
    pub(crate) jitter: u64,
    /// Recycle a worker above this PSS, in kB (0: never).
    pub(crate) max_memory_kib: u64,
    pub(crate) max_age: Option<Duration>,
    /// Kill a worker whose current request (or connection) runs longer.
    pub(crate) request_timeout: Option<Duration>,
}

/// Settings the master needs.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) name: String,
    pub(crate) policy: Policy,
    /// The shared board; the master clears the slot of a worker that died.
    pub(crate) board: &'static Board,
    pub(crate) grace_period: Duration,
    /// On stop, how long to stay out of the rotation (`/readyz` 503) before the stop.
    pub(crate) drain_delay: Duration,
    /// The log file to reopen on USR1 (the master's stderr; the workers get the new one
    /// through their log channels).
    pub(crate) log_file: Option<PathBuf>,
    /// The access log, reopened on USR1 and handed to the workers, which write it.
    pub(crate) access_log: Option<PathBuf>,
    /// Other descriptors of the master's that workers must close (pid file, readiness pipe).
    pub(crate) master_fds: Vec<RawFd>,
    pub(crate) limits: Limits,
    pub(crate) control: Option<Control>,
    pub(crate) metrics: Option<MetricsListener>,
    /// Re-reads the application's configuration on reload, in the master, before the new
    /// generation is forked.
    pub(crate) on_reload: Option<ReloadHook>,
    /// How to start a new master (binary upgrade).
    pub(crate) upgrade: UpgradeSettings,
    /// The sockets were inherited from an upgrading master (whose files they are until
    /// this master serves).
    pub(crate) adopted: bool,
    /// The listening sockets are shared with another process for good (systemd socket
    /// activation): never shut them down, never remove their files.
    pub(crate) shared_listeners: bool,
    /// The listeners' TLS material, re-read on reload (shared with the code that forks
    /// workers, which hands the current material to each new worker).
    pub(crate) tls: std::rc::Rc<crate::net::tls::Store>,
    /// The workers' I/O model (`--io`), for the ready line.
    pub(crate) io: &'static str,
    /// Watch the listen queue for the keep-alive guard (`queue.rs`): blocking workers
    /// only; an event worker holds thousands of connections, so no keep-alive client
    /// starves another, and its loop is never woken by SIGURG.
    pub(crate) watch_queue: bool,
}

/// The application's reload hook.
pub(crate) struct ReloadHook(pub(crate) Box<dyn FnMut() -> Result<(), crate::error::BoxError>>);

impl std::fmt::Debug for ReloadHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReloadHook")
    }
}

/// The master's state.
#[derive(Debug)]
pub(crate) struct Master<'a> {
    settings: Settings,
    listeners: &'a [Listener],
    channel: &'a Channel,
    signals: Signals,
    /// Written by workers when the pool runs short of idle workers.
    wake: nix::sys::eventfd::EventFd,
    workers: BTreeMap<Pid, Worker>,
    phase: Phase,
    backoff: Backoff,
    /// Paces replacements (at most 4 per 50 ms).
    pacer: Pacer,
    /// Slow or idle clients holding the pool (the operator's warning).
    holds: crate::master::holds::HoldWatch,
    /// The listen queue, watched for the keep-alive guard (its flag on the board).
    queue: queue::QueueWatch,
    rate: SpawnRate,
    started: Instant,
    next_round: Option<Instant>,
    last_retire: Instant,
    last_memory_check: Instant,
    max_reached: bool,
    /// What `status` and `metrics` count.
    counters: Counters,
    /// The counters' samples of the last minutes (issue 41): the rates now and the status
    /// page's charts. Kept in this master's memory only (about 30 KiB): a new master, after
    /// an upgrade, starts with none.
    history: crate::control::history::History,
    /// When the next sample is due (once a second).
    next_sample: Instant,
    /// Draws each worker's share of `--max-jitter`.
    jitter: Jitter,
    /// The current generation of workers: 0 at start, one more with each reload.
    generation: u32,
    /// A reload whose old generation has not left yet (systemd hears READY=1 after it):
    /// who asked for the last one ("by SIGHUP", "through the control socket (…)").
    reload_pending: Option<String>,
    /// The binary upgrade driver.
    upgrade: Upgrade,
    /// The first workers were ready (the master has served).
    serving: bool,
    /// Replacements owed for workers marked to be recycled (not yet forked): the target
    /// of a dynamic or on-demand pool includes them, so a recycled worker is replaced
    /// before it is stopped, and only once.
    owed: usize,
    /// The event workers' connections per client address (`--io event` with
    /// `--max-conns-per-ip`): the master clears a dead worker's table.
    peer_counts: Option<&'static PeerCounts>,
    /// The access log as last reopened on USR1 (none before the first): a worker forked
    /// since finds it in its log channel (it is given the one opened at start otherwise).
    access_reopened: Option<std::fs::File>,
    /// Hybrid mode: the fronts wanted, and the hand-off channel (whose emptiness tells
    /// the requests waiting for a worker).
    fronts: usize,
    handoff: Option<&'a crate::net::handoff::Channel>,
    /// A stop in hybrid mode: the workers are told once the fronts have left (they serve
    /// what the fronts hand them until then).
    workers_wait_for_fronts: bool,
}

/// Spawns worker `id` in the child side of a fork; never returns.
///
/// (`Infallible` stands for `!`, which cannot yet be written in a closure's type: a
/// function of this type can only end the process.)
pub(crate) type Entry<'e> = dyn FnMut(u32, crate::worker::Role, Recycle, &[RawFd]) -> Infallible + 'e;

impl<'a> Master<'a> {
    pub(crate) fn new(
        settings: Settings,
        listeners: &'a [Listener],
        channel: &'a Channel,
        signals: Signals,
    ) -> Result<Self, Error> {
        use nix::sys::eventfd::{EfdFlags, EventFd};
        let wake = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| Error::sys("creating the wake-up eventfd", e))?;
        sys::set_wake_fd(wake.as_fd().as_raw_fd());
        settings.board.set_min_spare(settings.policy.wake_below() as u32);
        let upgrade = Upgrade::new(
            settings.control.as_ref().map(Control::listener),
            settings.metrics.as_ref().map(MetricsListener::listener),
        )?;
        let now = Instant::now();
        Ok(Master {
            settings,
            listeners,
            channel,
            signals,
            wake,
            workers: BTreeMap::new(),
            phase: Phase::Starting,
            backoff: Backoff::default(),
            pacer: Pacer::default(),
            holds: crate::master::holds::HoldWatch::default(),
            queue: queue::QueueWatch::default(),
            rate: SpawnRate::default(),
            started: now,
            next_round: None,
            last_retire: now,
            last_memory_check: now,
            max_reached: false,
            counters: Counters::default(),
            history: Default::default(),
            next_sample: now,
            generation: 0,
            reload_pending: None,
            upgrade,
            serving: false,
            owed: 0,
            peer_counts: None,
            access_reopened: None,
            fronts: 0,
            handoff: None,
            workers_wait_for_fronts: false,
            jitter: Jitter::new((u64::from(std::process::id()) << 32) ^ scoreboard::now_ns()),
        })
    }

    /// Gives the master the per-address tables its event workers count their connections
    /// in (made before the first fork, [`PeerCounts::new`]): it clears a dead worker's
    /// table, and closes the tables' memfd in the workers it forks (they have the mapping).
    pub(crate) fn with_peer_counts(mut self, peers: Option<&'static PeerCounts>) -> Self {
        self.peer_counts = peers;
        self
    }

    /// Hybrid mode: `n` front processes, on the hand-off channel `channel`.
    pub(crate) fn with_fronts(mut self, fronts: Option<(usize, &'a crate::net::handoff::Channel)>) -> Self {
        if let Some((n, channel)) = fronts {
            self.fronts = n;
            self.handoff = Some(channel);
        }
        self
    }

    /// Runs the pool until it stops. Returns an error when the first workers cannot
    /// start; the pool is stopped before it returns.
    /// `on_ready` is called once, when the first workers have all reported ready.
    pub(crate) fn run(mut self, entry: &mut Entry<'_>, on_ready: &mut dyn FnMut()) -> Result<(), Error> {
        let result = self.run_loop(entry, on_ready);
        if result.is_err() {
            // From here on every exit is expected: no start-up error, no replacement.
            // A pending upgrade is abandoned with this master (which removes the socket
            // files on its way out): nothing of the new binary stays.
            self.upgrade.abandon();
            let now = Instant::now();
            self.phase = Phase::Stopping {
                deadline: now,
                killed: true,
                since: now,
            };
            self.kill_all(Signal::SIGKILL);
            while !self.workers.is_empty() {
                if self.reap_blocking().is_err() {
                    break;
                }
            }
        }
        // After a hand-over the files are the new master's: leave them. A master started
        // by an upgrade that never served leaves them too: they are still the old
        // master's, which goes on serving.
        if !self.upgrade.handed_over()
            && !self.settings.shared_listeners
            && (self.serving || !self.settings.adopted)
        {
            for l in self.listeners {
                l.remove_file();
            }
            if let Some(c) = &self.settings.control {
                c.remove_file();
            }
        }
        result
    }

    /// The master's loop: the initial pool, then one round per wake-up. A round takes what
    /// woke it (`take_wakeups`), acts on the signals that came (`on_signals`), the workers'
    /// messages, their exits, an upgrade's progress and the control requests, then does
    /// what its phase asks (`phase_step`). Returns when the phase `Stopping` sees its last
    /// worker gone.
    fn run_loop(&mut self, entry: &mut Entry<'_>, on_ready: &mut dyn FnMut()) -> Result<(), Error> {
        // At start-up a failed fork is fatal: better a clear error now than a server that
        // limps along with part of its pool.
        for _ in 0..self.settings.policy.initial() {
            self.spawn(entry, Role::Worker)?;
        }
        for _ in 0..self.fronts {
            self.spawn(entry, Role::Front)?;
        }
        loop {
            self.wait();
            self.take_wakeups();
            self.on_signals();
            for (pid, msg) in self.channel.receive() {
                self.on_message(Pid::from_raw(pid as i32), msg);
            }
            if self.signals.child.swap(false, Ordering::SeqCst) {
                self.reap()?;
            }
            self.check_upgrade();
            self.sample_history(Instant::now());
            self.service_control();
            if self.phase_step(entry, on_ready)? == Stepped::Stopped {
                return Ok(());
            }
        }
    }

    /// The first step of a round: empties what woke the master (the signal pipe, the
    /// wake-up eventfd and the board's wake flag), so that the next `poll` sleeps until
    /// something new, and lets the clock-driven state catch up: the TLS ticket keys' period
    /// may have ended (the master moves its copy on, so that it keeps no older secret and
    /// forks workers at the current period), and the listen queue watch looks at the queues.
    fn take_wakeups(&mut self) {
        self.settings.tls.advance_ticket_keys(Instant::now());
        self.signals.drain();
        let mut buf = [0u8; 8];
        let _ = nix::unistd::read(&self.wake, &mut buf);
        self.settings.board.clear_wake();
        let workers = self.workers.iter().map(|(pid, w)| (*pid, w.id));
        let running = self.phase == Phase::Running && self.settings.watch_queue;
        let board = self.settings.board;
        self.queue
            .on_wake(board, self.listeners, workers, running, Instant::now());
    }

    /// Acts on the signals the handlers flagged since the last round, each once however
    /// many times it came (the handler only sets a flag), in a fixed order: a stop first,
    /// then the log reopen, reload, upgrade and pool resizing.
    fn on_signals(&mut self) {
        if let Some(sig) = self.signals.take_stop() {
            self.on_stop_signal(sig);
        }
        if self.signals.reopen.swap(false, Ordering::SeqCst) {
            self.reopen_log();
        }
        // Both log their outcome, with who asked.
        if self.signals.reload.swap(false, Ordering::SeqCst) {
            let _ = self.reload("by SIGHUP");
        }
        if self.signals.upgrade.swap(false, Ordering::SeqCst) {
            let _ = self.start_upgrade("by SIGUSR2");
        }
        if self.signals.grow.swap(false, Ordering::SeqCst) {
            let d = self.resize(1);
            tracing::info!("SIGTTIN received: {d}");
        }
        if self.signals.shrink.swap(false, Ordering::SeqCst) {
            let d = self.resize(-1);
            tracing::info!("SIGTTOU received: {d}");
        }
        for (sig, flag) in &self.signals.other {
            if flag.swap(false, Ordering::SeqCst) {
                tracing::info!(
                    "{} received: this signal has no action in this version; ignored",
                    sig.as_str()
                );
            }
        }
    }

    /// The last step of a round: what the phase asks for, one function per phase.
    fn phase_step(&mut self, entry: &mut Entry<'_>, on_ready: &mut dyn FnMut()) -> Result<Stepped, Error> {
        match self.phase {
            Phase::Starting => self.starting_step(entry, on_ready)?,
            Phase::Running => self.running_step(entry)?,
            Phase::Draining { until, signal, .. } => {
                // Serving as when running (a worker that dies is replaced: the
                // instance is still taking the connections its balancer sends until
                // it notices), until the delay is over.
                self.check_workers();
                self.maintain(entry)?;
                if Instant::now() >= until {
                    self.begin_stop(&format!("{}: drain delay over", signal.as_str()));
                }
            }
            Phase::Stopping {
                deadline,
                killed,
                since,
            } => return Ok(self.stopping_step(deadline, killed, since)),
        }
        Ok(Stepped::Going)
    }

    /// Starting: the pool fills; once the initial workers and the fronts are all ready, the
    /// master is `Running`, says so (log, systemd, `on_ready`), and only then: systemd
    /// hears the new MAINPID before the old master (after an upgrade) learns it may leave.
    fn starting_step(&mut self, entry: &mut Entry<'_>, on_ready: &mut dyn FnMut()) -> Result<(), Error> {
        // A worker that was ready and died meanwhile (a handler panic on the
        // very first connection) is replaced here too.
        self.maintain(entry)?;
        let initial = self.settings.policy.initial();
        let ready = |front: bool| {
            self.workers
                .values()
                .filter(|w| w.ready && w.front == front)
                .count()
        };
        if ready(false) >= initial && ready(true) >= self.fronts {
            self.phase = Phase::Running;
            tracing::info!(
                workers = initial,
                io = %self.settings.io,
                pool = %self.settings.policy.name(),
                "ready"
            );
            self.serving = true;
            crate::process::systemd::ready(&format!("serving with {initial} workers"));
            on_ready();
        }
        Ok(())
    }

    /// Running: the workers' limits and the holds are checked, the pool kept at its size,
    /// and a reload is declared done once no worker of an older generation is left.
    fn running_step(&mut self, entry: &mut Entry<'_>) -> Result<(), Error> {
        self.check_workers();
        self.check_holds();
        self.maintain(entry)?;
        if self.reload_pending.is_some() && !self.workers.values().any(|w| w.generation < self.generation) {
            let asked = self.reload_pending.take().unwrap_or_default();
            tracing::info!(
                "reload done: generation {} serves (asked {asked})",
                self.generation
            );
            crate::process::systemd::ready(&format!("serving (generation {})", self.generation));
        }
        Ok(())
    }

    /// Stopping: waits for the workers to leave, in hybrid mode the fronts first (then the
    /// workers are told to serve what the fronts left them and stop), and kills whoever is
    /// still serving when the grace period is over. `Stopped` once no worker is left.
    fn stopping_step(&mut self, deadline: Instant, killed: bool, since: Instant) -> Stepped {
        if self.workers.is_empty() {
            if let Some(n) = self.handoff.map(|ch| ch.close_left()).filter(|n| *n > 0) {
                tracing::warn!(
                    "{n} connection(s) left in the hand-off channel with no worker to serve them: closed unanswered"
                );
            }
            tracing::info!("stopped");
            return Stepped::Stopped;
        }
        if self.workers_wait_for_fronts && !self.workers.values().any(|w| w.front) {
            // The fronts are gone: the workers serve what is left in the
            // channel (with what was handed back as the fronts stopped), then
            // their connections, then leave.
            self.workers_wait_for_fronts = false;
            if let Some(ch) = self.handoff {
                let n = ch.bounce_to_workers();
                if n > 0 {
                    tracing::debug!("{n} connection(s) handed back as the fronts stopped: to the workers");
                }
            }
            self.kill_all(Signal::SIGTERM);
            if let Some(ch) = self.handoff {
                ch.shut_for_workers();
            }
        }
        if !killed && Instant::now() >= deadline {
            tracing::warn!(
                "grace period of {:?} over: killing {} worker(s) still serving",
                self.settings.grace_period,
                self.workers.len()
            );
            self.kill_all(Signal::SIGKILL);
            self.phase = Phase::Stopping {
                deadline,
                killed: true,
                since,
            };
        }
        Stepped::Going
    }

    /// Whether the master has work to do on a clock (not only on events).
    fn has_periodic_duties(&self) -> bool {
        !matches!(self.settings.policy, Policy::Static(_))
            || self.workers.values().any(|w| w.stop_at.is_some())
            || self.settings.limits.request_timeout.is_some()
            || self.settings.limits.max_age.is_some()
            || self.settings.limits.max_memory_kib > 0
            || self.workers.values().any(|w| w.timed_out.is_some())
    }

    /// Sleeps until a signal, a message, a wake-up, a control request, or the next deadline.
    fn wait(&mut self) {
        let now = Instant::now();
        let timeout = self.poll_timeout(now);
        let watch_listeners = self.watches_listeners(now);
        let mut fds = vec![
            PollFd::new(self.signals.wake.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.channel.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.wake.as_fd(), PollFlags::POLLIN),
        ];
        if let Some(c) = &self.settings.control {
            if self.serving || !self.settings.adopted {
                fds.extend(c.poll_fds());
            }
        }
        if let Some(fd) = self.upgrade.poll_fd() {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        if let Some(m) = &self.settings.metrics {
            fds.extend(m.poll_fds());
        }
        fds.extend(self.queue.poll_fds(self.listeners));
        // The on-demand pool's own watch of the listeners, unless the queue watch has them
        // in the set already.
        if watch_listeners && !self.queue.watching() {
            fds.extend(
                self.worker_listeners()
                    .into_iter()
                    .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN)),
            );
        }
        match nix::poll::poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                // poll on valid descriptors cannot fail short of memory exhaustion; do not
                // spin if it does.
                tracing::error!("poll failed: {}", e.desc());
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// How long the master may sleep: until the earliest of its deadlines (the phase's,
    /// a spawn's back-off and pacing, the pool's next round, the holds' next look, the
    /// periodic checks' tick, the control connections', the queue watch's, an upgrade's,
    /// the TLS ticket keys' next period, the metrics connections', the history's next
    /// sample), at most a minute,
    /// rounded up so that it never wakes a moment early and sleeps again for nothing.
    fn poll_timeout(&mut self, now: Instant) -> PollTimeout {
        let mut deadlines: Vec<Instant> = Vec::new();
        match self.phase {
            Phase::Stopping {
                deadline,
                killed: false,
                ..
            } => deadlines.push(deadline),
            Phase::Stopping { .. } => {}
            Phase::Starting | Phase::Running | Phase::Draining { .. } => {
                if let Phase::Draining { until, .. } = self.phase {
                    deadlines.push(until);
                }
                // A spawn waits for both the back-off and the pacing: wake at the later of
                // the two, and only for a time still to come (a past one would make every
                // poll return at once: a busy loop).
                if self.active() < self.target() {
                    let spawn_at = [
                        self.backoff.not_before(self.serving_workers()),
                        self.pacer.not_before(),
                    ]
                    .into_iter()
                    .flatten()
                    .max();
                    deadlines.extend(spawn_at.filter(|t| *t > now));
                }
                deadlines.extend(self.next_round);
                if self.phase == Phase::Running {
                    deadlines.push(self.holds.next().unwrap_or(now));
                }
                if self.has_periodic_duties() {
                    deadlines.push(now + TICK);
                }
            }
        }
        deadlines.extend(self.settings.control.as_ref().and_then(Control::next_deadline));
        // The history's next sample (issue 41): a wake-up a second, in every phase.
        deadlines.push(self.next_sample);
        let running = self.phase == Phase::Running && self.settings.watch_queue;
        deadlines.extend(self.queue.before_poll(running));
        deadlines.extend(self.upgrade.deadline());
        deadlines.extend(self.settings.tls.next_ticket_key_change(now));
        deadlines.extend(
            self.settings
                .metrics
                .as_ref()
                .and_then(MetricsListener::next_deadline),
        );
        match deadlines.into_iter().min() {
            None => PollTimeout::NONE,
            Some(t) => {
                let ms = t.saturating_duration_since(now).as_millis().saturating_add(1);
                PollTimeout::try_from(ms.min(60_000) as i32).unwrap_or(PollTimeout::NONE)
            }
        }
    }

    /// Whether this round's poll watches the listeners for the pool's own sake: an
    /// on-demand pool with no idle worker watches them itself, between rounds (a listener
    /// stays readable until a worker accepts: watching it right after a spawn would spin).
    /// Not while a worker is starting either: it will take the waiting connection. (In
    /// hybrid mode the fronts accept on all but the TLS listeners; a front that hands off
    /// a request while no worker is idle wakes the master through the eventfd.)
    fn watches_listeners(&self, now: Instant) -> bool {
        matches!(self.settings.policy, Policy::Ondemand { .. })
            && self.phase == Phase::Running
            && self.settings.board.idle() == 0
            && self.starting() == 0
            && self.backoff.may_spawn(now, self.serving_workers())
            && self.active() < self.settings.policy.max()
            && self.next_round.is_none_or(|t| t <= now)
    }

    fn on_stop_signal(&mut self, sig: Signal) {
        match self.phase {
            Phase::Stopping { since, .. } | Phase::Draining { since, .. }
                if since.elapsed() < REPEAT_WINDOW =>
            {
                tracing::debug!(
                    "{} received again within {REPEAT_WINDOW:?}: same stop request",
                    sig.as_str()
                );
            }
            Phase::Draining { .. } => {
                self.begin_stop(&format!(
                    "{} received again: the drain delay is cut short",
                    sig.as_str()
                ));
            }
            Phase::Stopping { since, .. } => {
                tracing::warn!("{} received again: stopping now", sig.as_str());
                self.kill_all(Signal::SIGKILL);
                self.phase = Phase::Stopping {
                    deadline: Instant::now(),
                    killed: true,
                    since,
                };
            }
            Phase::Starting | Phase::Running => {
                // The listening sockets are shared with the new master: abandon the
                // upgrade before shutting them. Its whole group: it is not reached by a
                // signal sent to this master's group (a terminal's Ctrl-C).
                if let Some(child) = self.upgrade.abandon() {
                    tracing::warn!(
                        "{} received during an upgrade: the new master (pid {child}) is stopped",
                        sig.as_str()
                    );
                }
                crate::process::systemd::stopping();
                let delay = self.settings.drain_delay;
                if self.phase == Phase::Running && !delay.is_zero() {
                    // Balancers polling /readyz see 503 from now on and stop sending; the
                    // connections they still open meanwhile are served.
                    tracing::info!(
                        "{} received: out of the rotation (/readyz answers 503) for the drain delay of {delay:?}, then stopping",
                        sig.as_str()
                    );
                    let now = Instant::now();
                    self.phase = Phase::Draining {
                        until: now + delay,
                        signal: sig,
                        since: now,
                    };
                } else {
                    self.begin_stop(&format!("{} received", sig.as_str()));
                }
            }
        }
    }

    /// The graceful stop: the listeners shut, the children told, `--grace-period` for the
    /// connections in progress. `why` begins the log line ("SIGTERM received").
    fn begin_stop(&mut self, why: &str) {
        tracing::info!(
            "{why}: stopping; connections in progress may finish within {:?}",
            self.settings.grace_period
        );
        // Shut the listeners for every process at once: new connections are refused from
        // now on, idle workers wake up and exit.
        // (Not sockets systemd holds too: they must outlive this service.)
        if !self.settings.shared_listeners {
            for l in self.listeners {
                l.shutdown();
            }
        }
        self.stop_children();
        self.phase = Phase::stopping(self.settings.grace_period);
    }

    /// Tells every child to stop: in hybrid mode the fronts first (they hand off what
    /// they hold and close their idle connections), the workers once the fronts are gone
    /// (see the `Stopping` phase), so that no request handed off is left in the channel.
    fn stop_children(&mut self) {
        if self.fronts == 0 {
            self.kill_all(Signal::SIGTERM);
            return;
        }
        for (pid, _) in self.workers.iter().filter(|(_, w)| w.front) {
            let _ = signal::kill(*pid, Signal::SIGTERM);
        }
        self.workers_wait_for_fronts = true;
    }

    fn on_message(&mut self, pid: Pid, msg: Message) {
        let Some(w) = self.workers.get_mut(&pid) else {
            return;
        };
        match msg {
            Message::Ready => {
                w.ready = true;
                if self.backoff.reset() {
                    tracing::info!(
                        "worker {} (pid {pid}) is ready: workers are starting normally again",
                        w.id
                    );
                }
                // A replacement is ready: one worker waiting to be recycled may go now.
                self.release_one_retiring();
            }
            Message::StartFailed(reason) => w.failure = Some(reason),
            Message::Retire => {
                if w.leaving.is_none() {
                    w.leaving = Some(Leave::Recycle("limit"));
                    self.owed += 1;
                    tracing::info!(
                        "worker {} (pid {pid}) reached its recycling limit; replacing it",
                        w.id
                    );
                }
            }
        }
    }

    /// Sends SIGTERM to every worker waiting to be recycled once the pool has enough ready
    /// workers without them (their replacements): the pool's capacity never dips.
    fn release_one_retiring(&mut self) {
        let fronts_ready = self
            .workers
            .values()
            .filter(|w| w.front && w.active() && w.ready)
            .count();
        let fronts_spare = fronts_ready >= self.fronts;
        let spare = self.ready_active() >= self.target().min(self.settings.policy.max());
        for (pid, w) in self.workers.iter_mut().filter(|(_, w)| {
            matches!(w.leaving, Some(Leave::Recycle(_)))
                && !w.stop_sent
                && if w.front { fronts_spare } else { spare }
        }) {
            w.stop_sent = true;
            w.stop_at = Some(Instant::now());
            let _ = signal::kill(*pid, Signal::SIGTERM);
        }
    }

    /// Reload, asked `from` ("by SIGHUP", "through the control socket (pid 1234, uid 0)"):
    /// runs the application's hook, then starts a new generation of workers; the old ones
    /// finish their connections and leave as the new ones become ready. If the hook fails,
    /// nothing changes and the error is returned. Every outcome is logged with who asked
    /// (its end, `reload done`, by the loop once the old generation has left).
    fn reload(&mut self, from: &str) -> Result<u32, String> {
        let result = self.try_reload(from);
        if let Err(e) = &result {
            tracing::error!("reload asked {from} failed: {e}; the current workers keep serving");
        }
        result
    }

    fn try_reload(&mut self, from: &str) -> Result<u32, String> {
        if self.phase != Phase::Running {
            return Err(format!("the server is {}", self.phase.name()));
        }
        // TLS files are re-read first, and the new material applied only if the hook
        // succeeds too: a failed reload changes nothing.
        let tls = match self.settings.tls.any() {
            true => Some(self.settings.tls.reread().map_err(|e| e.to_string())?),
            false => None,
        };
        if let Some(ReloadHook(hook)) = self.settings.on_reload.as_mut() {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook)) {
                Ok(result) => result.map_err(|e| format!("the reload hook failed: {e}"))?,
                Err(_) => return Err("the reload hook panicked".into()),
            }
        }
        if let Some(fresh) = tls {
            self.settings.tls.apply(fresh);
        }
        self.generation += 1;
        let generation = self.generation;
        for w in self
            .workers
            .values_mut()
            .filter(|w| w.leaving.is_none() && w.timed_out.is_none())
        {
            w.leaving = Some(Leave::Recycle("reload"));
            // Fronts are replaced by their own count (`maintain`).
            self.owed += usize::from(!w.front);
        }
        tracing::info!("reload asked {from}: starting generation {generation}");
        crate::process::systemd::reloading();
        self.reload_pending = Some(from.to_owned());
        Ok(generation)
    }

    /// Collects every exited worker.
    fn reap(&mut self) -> Result<(), Error> {
        loop {
            // While an upgrade is pending, the next exited child is looked at before it is
            // reaped: if it is the new master, its process group is killed while its zombie
            // still holds the group's id (what a wrapper script started goes with it).
            let next = match self.upgrade.pending() {
                None => None,
                Some(u) => match nix::sys::wait::waitid(
                    nix::sys::wait::Id::All,
                    WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
                ) {
                    Ok(status) => {
                        // No pid: no child has exited.
                        let Some(pid) = status.pid() else { return Ok(()) };
                        if pid == u.child {
                            u.kill_group();
                        }
                        Some(pid)
                    }
                    Err(Errno::ECHILD) => return Ok(()),
                    Err(Errno::EINTR) => continue,
                    Err(e) => return Err(Error::sys("waitid", e)),
                },
            };
            match nix::sys::wait::waitpid(next, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return Ok(()),
                Ok(status) => self.on_exit(status)?,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(Error::sys("waitpid", e)),
            }
        }
    }

    fn reap_blocking(&mut self) -> Result<(), Error> {
        match nix::sys::wait::waitpid(None, None) {
            Ok(status) => self.on_exit(status),
            Err(Errno::EINTR) => Ok(()),
            Err(e) => {
                self.workers.clear();
                Err(Error::sys("waitpid", e))
            }
        }
    }

    fn on_exit(&mut self, status: WaitStatus) -> Result<(), Error> {
        let Some((pid, reason, signaled)) = describe_exit(status) else {
            return Ok(());
        };
        // Late messages (a failure reason written just before exit) are read first.
        for (p, msg) in self.channel.receive() {
            self.on_message(Pid::from_raw(p as i32), msg);
        }
        if self.upgrade.on_exit(pid, &reason) {
            return Ok(());
        }
        let Some(worker) = self.workers.remove(&pid) else {
            return Ok(());
        };
        // What the worker was doing, from its slot, before the slot is freed.
        let view = self.settings.board.read(worker.id);
        let serving = view.as_ref().and_then(|v| match (&v.peer, v.current) {
            (Some(peer), Some(t)) if v.state != State::Idle => {
                Some(format!(" while serving {peer} for {}", fmt_duration(t)))
            }
            _ => None,
        });
        // A front's requests are hand-offs, its bytes the workers' too: not in the totals,
        // but for the input it refused (its errors).
        match view.as_ref() {
            Some(v) if worker.front => self.counters.retired.errors += v.errors,
            Some(v) => self.counters.retired.add(v),
            None => {}
        }
        // A worker killed between taking a connection and counting it leaves the
        // hand-off counts one apart: an empty channel says they are even.
        if self.handoff.is_some_and(|ch| !worker.front && ch.empty()) {
            self.settings.board.handoffs_settled();
        }
        self.settings.board.release(worker.id);
        // Its connections are gone with it: they no longer count against their clients'
        // cap (before the id is given to a new worker).
        if let Some(peers) = self.peer_counts {
            peers.clear(worker.id);
        }
        let serving = serving.unwrap_or_default();
        // Only a worker that ended on its own before it was ready is a start failure: one
        // killed from outside (an operator, the OOM killer, a kill storm) proves nothing
        // about start-up and is replaced at once.
        let on_its_own = match status {
            WaitStatus::Signaled(_, sig, _) => pool::is_crash_signal(sig),
            _ => true,
        };
        let id = worker.id;
        match fate(
            self.phase,
            &worker,
            pool::is_start_failure(worker.ready, on_its_own),
        ) {
            Fate::NoStart => {
                let reason = worker.failure.unwrap_or(reason);
                tracing::error!("worker {id} (pid {pid}) failed to start: {reason}; stopping");
                return Err(Error::WorkerStart {
                    pid: pid.as_raw(),
                    reason,
                });
            }
            Fate::Stopping => tracing::debug!("worker {id} (pid {pid}) {reason}"),
            Fate::TimedOut => {
                self.counters.restart("timeout");
                tracing::info!("worker {id} (pid {pid}) {reason}; starting a replacement");
            }
            Fate::Recycled => {
                self.counters.restart("recycled");
                tracing::info!("worker {id} (pid {pid}) recycled");
            }
            Fate::Retired => tracing::info!("worker {id} (pid {pid}) retired (surplus)"),
            Fate::Died => {
                let reason = with_failure(reason, worker.failure.as_deref());
                self.counters.restart(if signaled { "signal" } else { "exit" });
                tracing::warn!(
                    "worker {id} (pid {pid}) {reason}{serving}; {}: starting a replacement",
                    if worker.ready {
                        "it was serving"
                    } else {
                        "killed from outside while starting, not a start failure"
                    }
                );
            }
            Fate::StartFailed => {
                let reason = with_failure(reason, worker.failure.as_deref());
                self.on_start_failure(id, pid, &reason, signaled);
            }
        }
        Ok(())
    }

    /// A worker failed to start while the pool runs: each death counts once, by its cause,
    /// or as "backoff" when it is one of a run of start failures (then replaced only after
    /// a delay).
    fn on_start_failure(&mut self, id: u32, pid: Pid, reason: &str, signaled: bool) {
        let verdict = self.backoff.record(Instant::now());
        self.counters.restart(match verdict {
            Verdict::Replace if signaled => "signal",
            Verdict::Replace => "exit",
            Verdict::BackOffStarted { .. } | Verdict::BackOff { .. } => "backoff",
        });
        match verdict {
            Verdict::Replace => {
                tracing::warn!("worker {id} (pid {pid}) {reason} before it was ready; starting a replacement")
            }
            Verdict::BackOffStarted { delay, in_a_row } => {
                tracing::error!(
                    "worker {id} (pid {pid}) {reason} before it was ready; workers keep failing to start \
                     ({in_a_row} in a row): restarting them one at a time with exponential back-off, \
                     next in {delay:?} (at most {:?} while no worker serves)",
                    pool::EMPTY_POOL_DELAY
                )
            }
            Verdict::BackOff { delay, in_a_row } => {
                tracing::debug!("worker {id} (pid {pid}) {reason}; {in_a_row} in a row, next in {delay:?}")
            }
        }
    }

    /// The pool's workers (not the hybrid fronts).
    fn pool(&self) -> impl DoubleEndedIterator<Item = (&Pid, &Worker)> {
        self.workers.iter().filter(|(_, w)| !w.front)
    }

    /// Workers that count towards the pool's size.
    fn active(&self) -> usize {
        self.pool().filter(|(_, w)| w.active()).count()
    }

    /// Whether some worker is ready to serve (an empty pool retries sooner).
    fn serving_workers(&self) -> bool {
        self.pool().any(|(_, w)| w.ready && w.timed_out.is_none())
    }

    fn ready_active(&self) -> usize {
        self.pool().filter(|(_, w)| w.active() && w.ready).count()
    }

    /// How many workers the pool wants now.
    fn target(&self) -> usize {
        self.settings.policy.target(self.active(), self.owed)
    }

    /// Keeps the pool at its target size and runs the dynamic policies' rounds.
    fn maintain(&mut self, entry: &mut Entry<'_>) -> Result<(), Error> {
        let now = Instant::now();
        // Replace what is missing (dead, timed out, being recycled), paced.
        let mut missing = self.target().saturating_sub(self.active());
        while missing > 0 && self.backoff.may_spawn(now, self.serving_workers()) {
            if self.backoff.active() && self.starting() > 0 {
                break; // one at a time while failures are counted: wait for its outcome
            }
            if !self.pacer.may_spawn(now) {
                if self.pacer.hold_back() {
                    tracing::info!(
                        "{missing} worker(s) to replace: pacing replacements at {} per {:?}",
                        pool::PACING_BURST,
                        pool::PACING_WINDOW
                    );
                }
                break;
            }
            if !self.try_spawn(entry, now, Role::Worker)? {
                break;
            }
            self.pacer.spawned(now);
            self.owed = self.owed.saturating_sub(1);
            missing -= 1;
            if self.backoff.active() {
                break; // one at a time while failures are being counted
            }
        }
        if missing == 0 {
            self.pacer.caught_up();
        }
        // Hybrid fronts: as many as asked for, replaced as workers are (a front that keeps
        // failing to start counts in the same back-off).
        let fronts = self.workers.values().filter(|w| w.front && w.active()).count();
        for _ in fronts..self.fronts {
            if !self.backoff.may_spawn(now, self.serving_workers())
                || !self.try_spawn(entry, now, Role::Front)?
            {
                break;
            }
        }
        if self.phase == Phase::Running {
            self.pool_round(entry, now)?;
            self.shrink_static();
        }
        Ok(())
    }

    /// Spawns one worker; a failed fork while running backs off instead of ending the
    /// server. Returns whether a worker was started.
    fn try_spawn(&mut self, entry: &mut Entry<'_>, now: Instant, role: Role) -> Result<bool, Error> {
        match self.spawn(entry, role) {
            Ok(()) => Ok(true),
            Err(e) if self.phase == Phase::Running => {
                // Out of processes or memory: keep serving with the workers we have and
                // retry with the crash-loop back-off rather than give up the server.
                let delay = self.backoff.spawn_failed(now);
                tracing::error!("cannot start a worker: {e}; retrying in {delay:?}");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// One round of a dynamic or on-demand pool: grow with a doubling rate while idle
    /// workers are short, retire a surplus one per second, report "max workers reached".
    fn pool_round(&mut self, entry: &mut Entry<'_>, now: Instant) -> Result<(), Error> {
        if matches!(self.settings.policy, Policy::Static(_)) || self.next_round.is_some_and(|t| now < t) {
            return Ok(());
        }
        self.next_round = None;
        if !self.backoff.may_spawn(now, self.serving_workers()) {
            // Workers keep failing to start: the crash-loop back-off paces the rounds too.
            self.next_round = self.backoff.not_before(self.serving_workers());
            return Ok(());
        }
        let idle = self.settings.board.idle() as usize;
        let starting = self.starting();
        let active = self.active();
        let max = self.settings.policy.max();
        let short = match &self.settings.policy {
            Policy::Dynamic { min_spare, .. } => idle + starting < *min_spare,
            Policy::Ondemand { .. } => idle + starting == 0 && self.clients_queued(),
            Policy::Static(_) => false,
        };
        if short && active < max {
            // The rate doubles each round of a shortage (1, 2, 4 … 32), but a round never
            // starts more than the shortage needs: the missing spares plus the connections
            // already waiting in the accept queue (when the queue can be read: TCP). That
            // grows as fast as Apache's doubling without overshooting by the last round.
            let (min_spare, _) = self.settings.policy.spares();
            let need = match self.queue_length() {
                Some(queued) => {
                    (min_spare.max(1) - (idle + starting).min(min_spare.max(1))) + queued as usize
                }
                None => usize::MAX,
            };
            let n = self.rate.next().min(max - active).min(need.max(1));
            tracing::debug!("{idle} idle worker(s), {starting} starting: starting {n} more");
            for _ in 0..n {
                if !self.try_spawn(entry, now, Role::Worker)? {
                    break;
                }
            }
            self.next_round = Some(now + pool::ROUND);
            return Ok(());
        }
        if short {
            let queued = self.queue_length();
            if !self.max_reached && queued.is_some_and(|q| q > 0) {
                self.max_reached = true;
                self.counters.max_reached += 1;
                tracing::warn!(
                    "max workers reached ({max}): {} connection(s) waiting in the listen queue",
                    queued.unwrap_or(0)
                );
            }
            self.next_round = Some(now + pool::ROUND);
            return Ok(());
        }
        self.rate.reset();
        if self.max_reached && (active < max || !self.clients_queued()) {
            self.max_reached = false;
        }
        // Retire surplus idle workers.
        let surplus = match &self.settings.policy {
            Policy::Dynamic { max_spare, .. } => usize::from(
                idle > *max_spare && now.duration_since(self.last_retire) >= pool::RETIRE_INTERVAL,
            ),
            Policy::Ondemand { idle_timeout, .. } => self
                .pool()
                .map(|(_, w)| w)
                .filter(|w| w.active())
                .filter(|w| {
                    self.settings.board.read(w.id).is_some_and(|v| {
                        v.state == State::Idle && v.idle_for.unwrap_or(v.age) >= *idle_timeout
                    })
                })
                .count(),
            Policy::Static(_) => 0,
        };
        for _ in 0..surplus {
            if !self.retire_idle_worker() {
                break;
            }
            self.last_retire = now;
        }
        Ok(())
    }

    /// A pool made smaller (TTOU, `workers -N`): retire the workers above its size (a
    /// static pool) or its maximum (the others), idle ones first.
    fn shrink_static(&mut self) {
        let limit = match self.settings.policy {
            Policy::Static(n) => n,
            _ => self.settings.policy.max(),
        };
        while self.active() > limit {
            if !self.retire_idle_worker() && !self.retire_any_worker() {
                break;
            }
        }
    }

    /// Workers forked and not yet waiting for connections (their slot says so: a worker
    /// reports ready a moment before it is idle, and must not look like a missing one).
    fn starting(&self) -> usize {
        let board = self.settings.board;
        self.pool()
            .map(|(_, w)| w)
            .filter(|w| w.active())
            .filter(|w| !w.ready || board.read(w.id).is_some_and(|v| v.state == State::Starting))
            .count()
    }

    /// Asks the idle worker that has been idle longest to leave; false if none is idle.
    fn retire_idle_worker(&mut self) -> bool {
        let board = self.settings.board;
        let pick = self
            .pool()
            .filter(|(_, w)| w.active() && w.ready)
            .filter_map(|(pid, w)| {
                let v = board.read(w.id)?;
                (v.state == State::Idle).then_some((*pid, v.idle_for.unwrap_or(v.age)))
            })
            .max_by_key(|(_, idle)| *idle)
            .map(|(pid, _)| pid);
        match pick {
            Some(pid) => {
                self.stop_worker(pid, Leave::Surplus);
                true
            }
            None => false,
        }
    }

    fn retire_any_worker(&mut self) -> bool {
        let pick = self
            .pool()
            .filter(|(_, w)| w.active())
            .map(|(pid, _)| *pid)
            .next_back();
        match pick {
            Some(pid) => {
                self.stop_worker(pid, Leave::Surplus);
                true
            }
            None => false,
        }
    }

    fn stop_worker(&mut self, pid: Pid, why: Leave) {
        if let Some(w) = self.workers.get_mut(&pid) {
            w.leaving = Some(why);
            w.stop_sent = true;
            w.stop_at = Some(Instant::now());
            let _ = signal::kill(pid, Signal::SIGTERM);
        }
    }

    /// Request timeouts, recycling by age and memory, and the kill that follows an abort.
    ///
    /// Each worker is looked at once (`WorkerCheck::look_at`, which also kills one that
    /// outstayed its grace period), then the verdicts are acted on: the timed-out requests'
    /// workers are aborted, the ones over a limit recycled.
    fn check_workers(&mut self) {
        let now = Instant::now();
        let limits = self.settings.limits.clone();
        let check_memory =
            limits.max_memory_kib > 0 && now.duration_since(self.last_memory_check) >= MEMORY_INTERVAL;
        if check_memory {
            self.last_memory_check = now;
        }
        let check = WorkerCheck {
            now,
            board: self.settings.board,
            limits: &limits,
            grace: self.settings.grace_period,
            check_memory,
        };
        let mut recycle = Vec::new();
        let mut expired = Vec::new();
        for (pid, w) in &mut self.workers {
            match check.look_at(*pid, w) {
                Look::Fine => {}
                Look::Expired(elapsed, v) => expired.push((*pid, w.id, elapsed, *v)),
                Look::Recycle(why) => recycle.push((*pid, why)),
            }
        }
        self.abort_expired(expired, limits.request_timeout.unwrap_or_default(), now);
        for (pid, why) in recycle {
            if let Some(w) = self.workers.get_mut(&pid) {
                tracing::info!(
                    "worker {} (pid {pid}) reached its {why} limit; replacing it",
                    w.id
                );
                w.leaving = Some(Leave::Recycle(why));
                self.owed += 1;
            }
        }
        self.release_one_retiring();
    }

    /// The workers whose request outlived `--request-timeout`: each is aborted (a core
    /// dump shows where the handler was, when core dumps are enabled) or killed, with one
    /// error line naming the request, and given `ABORT_GRACE` before the kill that follows.
    fn abort_expired(
        &mut self,
        expired: Vec<(Pid, u32, Duration, scoreboard::SlotView)>,
        limit: Duration,
        now: Instant,
    ) {
        let abort = sys::core_dumps_enabled();
        for (pid, id, elapsed, v) in expired {
            tracing::error!("{}", timeout_message(id, pid, limit, elapsed, &v, abort));
            let _ = signal::kill(pid, if abort { Signal::SIGABRT } else { Signal::SIGKILL });
            if let Some(w) = self.workers.get_mut(&pid) {
                w.timed_out = Some(now);
            }
        }
    }

    /// Once a second: whether slow or idle clients from a few addresses hold the pool; one
    /// warning per episode (see `holds.rs`).
    fn check_holds(&mut self) {
        let now = Instant::now();
        if !self.holds.due(now) {
            return;
        }
        let board = self.settings.board;
        let views: Vec<(u32, scoreboard::SlotView)> = self
            .workers
            .values()
            .filter(|w| w.ready && w.active())
            .filter_map(|w| board.read(w.id).map(|v| (w.id, v)))
            .collect();
        match self.holds.observe(now, views.iter().map(|(id, v)| (*id, v))) {
            Some(Some(held)) => tracing::warn!(
                "{held}; they keep those workers from other clients until their timeouts \
                 (--header-timeout, --keepalive-timeout, --read-timeout): consider \
                 --max-conns-per-ip with a value well below the {} workers",
                held.workers
            ),
            Some(None) => tracing::info!("slow or idle clients no longer hold the pool"),
            None => {}
        }
    }

    /// Whether a connection waits in some listener's queue (a zero-timeout `poll`).
    fn clients_queued(&self) -> bool {
        match self.handoff {
            Some(ch) => {
                self.settings.board.waiting(ch.empty()) > 0
                    || crate::sys::any_readable(&self.worker_listeners())
            }
            None => crate::sys::any_readable(self.listeners),
        }
    }

    /// The listeners the workers accept on themselves: all of them, but in hybrid mode only
    /// the TLS ones (the fronts take the others).
    fn worker_listeners(&self) -> Vec<&'a Listener> {
        let listeners: &'a [Listener] = self.listeners;
        listeners
            .iter()
            .enumerate()
            .filter(|(i, _)| self.handoff.is_none() || self.settings.tls.is_tls(*i))
            .map(|(_, l)| l)
            .collect()
    }

    /// Connections waiting in the TCP listeners' accept queues (None without TCP listeners);
    /// in hybrid mode, the complete requests waiting for a worker: the pool sizes itself
    /// by those, not by open connections (the fronts hold those).
    fn queue_length(&self) -> Option<u32> {
        if let Some(ch) = self.handoff {
            // Plus the TLS listeners' queues: their connections go to the workers directly.
            let tls: u32 = self
                .worker_listeners()
                .iter()
                .filter_map(|l| sys::listen_queue(l.as_fd()))
                .map(|(q, _)| q)
                .sum();
            let waiting = u32::try_from(self.settings.board.waiting(ch.empty())).unwrap_or(u32::MAX);
            return Some(waiting.saturating_add(tls));
        }
        self.listeners
            .iter()
            .filter_map(|l| sys::listen_queue(l.as_fd()))
            .map(|(q, _)| q)
            .reduce(|a, b| a + b)
    }

    fn spawn(&mut self, entry: &mut Entry<'_>, role: Role) -> Result<(), Error> {
        let Some(id) =
            (1..=scoreboard::MAX_WORKERS as u32).find(|id| !self.workers.values().any(|w| w.id == *id))
        else {
            return Err(Error::Config(format!(
                "more than {} workers",
                scoreboard::MAX_WORKERS
            )));
        };
        // Fronts hand requests over, they serve none: no request or connection limit.
        let recycle = match role {
            Role::Worker => self.draw_limits(),
            Role::Front => Recycle::default(),
        };
        let (logs, child_logs) =
            crate::process::reopen::pair().map_err(|e| Error::sys("creating a worker's log channel", e))?;
        if let Some(access) = &self.access_reopened {
            // Waits in the channel for the worker, which takes it before it is ready.
            if let Err(e) = crate::process::reopen::send(logs.as_fd(), None, Some(access.as_fd())) {
                tracing::warn!(
                    "worker {id} cannot be handed the reopened access log: {e}; it writes to the one \
                     opened at start"
                );
            }
        }
        let master_fds: Vec<RawFd> = self
            .signals
            .fds()
            .iter()
            .copied()
            // Not the wake-up eventfd: workers write to it.
            .chain(self.channel.read_fd())
            // The scoreboard's memfd: a forked worker has the mapping already (and a
            // re-executed one gets the descriptor through its handoff instead).
            .chain(crate::scoreboard::Board::memfd())
            .chain(self.peer_counts.map(PeerCounts::memfd))
            .chain(crate::penalty::memfd())
            .chain(self.settings.master_fds.iter().copied())
            .chain(self.settings.control.iter().flat_map(Control::raw_fds))
            .chain(self.settings.metrics.iter().flat_map(MetricsListener::raw_fds))
            .chain(self.upgrade.fds())
            // The master's ends of every log channel, this worker's too.
            .chain(
                self.workers
                    .values()
                    .filter_map(|w| w.logs.as_ref().map(AsRawFd::as_raw_fd)),
            )
            .chain(Some(logs.as_raw_fd()))
            .collect();
        let _ = io::stdout().flush();
        self.settings.board.claim(id, self.generation);
        // The child keeps its end of the log channel; the master's copy closes with the
        // closure, once `fork_child` returns in the master.
        let child = move || {
            crate::process::reopen::set_worker_end(child_logs);
            entry(id, role, recycle, &master_fds)
        };
        // SAFETY: the master is single-threaded for its whole life (it starts no thread and
        // uses no crate that does; `sys::fork` checks); the log writer is unbuffered and
        // stdout was flushed above; the child runs `entry`, which ends in `_exit`.
        let pid = match unsafe { sys::fork_child(child) } {
            Ok(pid) => pid,
            Err(e) => {
                self.settings.board.release(id);
                return Err(e);
            }
        };
        self.settings.board.set_pid(id, pid.as_raw() as u32);
        tracing::debug!(
            "started {} {id} (pid {pid})",
            if role == Role::Front { "front" } else { "worker" }
        );
        self.workers.insert(
            pid,
            Worker {
                logs: Some(logs),
                front: role == Role::Front,
                ..Worker::new(id, self.generation)
            },
        );
        Ok(())
    }

    /// This worker's limits: the configured ones plus a jitter from 0 to `--max-jitter`,
    /// so that workers started together do not all retire together.
    fn draw_limits(&mut self) -> Recycle {
        let base = self.settings.limits.recycle;
        let jitter = self.settings.limits.jitter;
        Recycle {
            max_requests: self.jitter.draw(base.max_requests, jitter),
            max_connections: self.jitter.draw(base.max_connections, jitter),
        }
    }

    /// USR1: reopens the log file and the access log (after logrotate moved them away),
    /// then hands the new files to each worker through its log channel and signals it
    /// (`process/reopen.rs`): the files stay writable by the master's user alone. A file
    /// that cannot be reopened is kept as it was, by the master and the workers.
    fn reopen_log(&mut self) {
        use crate::process::log::{open_log, redirect_stderr};
        let access = self
            .settings
            .access_log
            .as_ref()
            .and_then(|path| match open_log(path) {
                Ok(f) => {
                    tracing::info!("SIGUSR1 received: reopened the access log {}", path.display());
                    Some(f)
                }
                Err(e) => {
                    tracing::error!(
                        "SIGUSR1 received: cannot reopen the access log: {e}; still writing to the old one"
                    );
                    None
                }
            });
        let log = match &self.settings.log_file {
            None => {
                tracing::info!("SIGUSR1 received: no log file to reopen (logging to stderr)");
                false
            }
            Some(path) => match open_log(path)
                .and_then(|f| redirect_stderr(&f).map_err(|e| Error::sys("redirecting stderr", e)))
            {
                Ok(()) => {
                    tracing::info!("SIGUSR1 received: reopened the log file {}", path.display());
                    true
                }
                Err(e) => {
                    tracing::error!(
                        "SIGUSR1 received: cannot reopen the log file: {e}; still logging to the old one"
                    );
                    false
                }
            },
        };
        if let Some(f) = access {
            self.access_reopened = Some(f);
        }
        if !log && self.access_reopened.is_none() {
            return;
        }
        let stderr = io::stderr();
        let log_fd = log.then(|| stderr.as_fd());
        // Every access log reopen is handed over, also when only the log file was reopened
        // this time (the same file again: harmless), so that a worker that missed one
        // catches up.
        let access_fd = self.access_reopened.as_ref().map(AsFd::as_fd);
        for (pid, w) in &self.workers {
            let Some(channel) = &w.logs else { continue };
            match crate::process::reopen::send(channel.as_fd(), log_fd, access_fd) {
                Ok(()) => {
                    let _ = signal::kill(*pid, Signal::SIGUSR1);
                }
                Err(e) => tracing::warn!(
                    "worker {} (pid {pid}) cannot be handed the reopened log files: {e}; it keeps \
                     writing to the old ones",
                    w.id
                ),
            }
        }
    }

    fn kill_all(&self, sig: Signal) {
        for pid in self.workers.keys() {
            let _ = signal::kill(*pid, sig);
        }
    }
}

/// What `check_workers` found about one worker.
#[derive(Debug)]
enum Look {
    /// Nothing to do (or it was dealt with already: a kill).
    Fine,
    /// Its request has run this long, over `--request-timeout`; the slot as read (boxed:
    /// a slot's view is large, and this is the rare verdict).
    Expired(Duration, Box<scoreboard::SlotView>),
    /// It reached this limit (`age`, `memory`): to be replaced.
    Recycle(&'static str),
}

/// What `check_workers` looks at each worker with, read once per round.
struct WorkerCheck<'a> {
    now: Instant,
    board: &'static scoreboard::Board,
    limits: &'a Limits,
    grace: Duration,
    /// The memory is read this round (once per `MEMORY_INTERVAL`: reading it costs).
    check_memory: bool,
}

impl WorkerCheck<'_> {
    /// One worker's verdict, in order of urgency. A worker asked to leave a grace period
    /// ago, or one replaced for its memory that grew past twice the limit meanwhile, is
    /// killed here, at once; one killed after an abort waits `ABORT_GRACE`, then is killed.
    fn look_at(&self, pid: Pid, w: &mut Worker) -> Look {
        let (now, limits) = (self.now, self.limits);
        if w.stop_at.is_some_and(|t| now.duration_since(t) >= self.grace) {
            // Asked to leave a grace period ago and still there (a connection that
            // never ends): as on a stop, the grace period bounds it.
            tracing::warn!(
                "worker {} (pid {pid}) still serving {:?} after being asked to leave; killing it, \
                 cutting {}",
                w.id,
                self.grace,
                serving(self.board, w.id)
            );
            let _ = signal::kill(pid, Signal::SIGKILL);
            w.stop_at = None;
            return Look::Fine;
        }
        // --max-worker-memory is a hard limit: a worker replaced for its memory finishes
        // its connections within the grace period only while it stays below twice the
        // limit, checked on every tick (a connection whose protocol cannot announce a
        // close could otherwise grow it by gigabytes meanwhile: issue 14).
        if matches!(w.leaving, Some(Leave::Recycle("memory"))) && !w.memory_killed {
            if let Some(kib) = pss_kib(pid).filter(|kib| *kib > 2 * limits.max_memory_kib) {
                tracing::warn!(
                    "worker {} (pid {pid}) uses {} MiB, over twice --max-worker-memory {} MiB, \
                     while it finishes: killing it, cutting {}",
                    w.id,
                    kib / 1024,
                    limits.max_memory_kib / 1024,
                    serving(self.board, w.id)
                );
                let _ = signal::kill(pid, Signal::SIGKILL);
                w.stop_at = None;
                w.memory_killed = true;
                return Look::Fine;
            }
        }
        if let Some(since) = w.timed_out {
            if now.duration_since(since) >= ABORT_GRACE {
                let _ = signal::kill(pid, Signal::SIGKILL);
            }
            return Look::Fine;
        }
        if let (Some(limit), Some(v)) = (limits.request_timeout, self.board.read(w.id)) {
            if let Some(elapsed) = over_request_timeout(&v, limit) {
                return Look::Expired(elapsed, Box::new(v));
            }
        }
        // Fronts run no handler code: not recycled by age or memory.
        if w.leaving.is_some() || !w.ready || w.front {
            return Look::Fine;
        }
        if limits
            .max_age
            .is_some_and(|age| now.duration_since(w.spawned) >= age)
        {
            Look::Recycle("age")
        } else if self.check_memory && pss_kib(pid).is_some_and(|kib| kib > limits.max_memory_kib) {
            Look::Recycle("memory")
        } else {
            Look::Fine
        }
    }
}

/// What a kill of worker `id` cuts, for its log line: an event loop's open connections
/// (its slot names no single peer: the line said "cutting no connection" while it cut
/// thousands, issue 31), or a blocking worker's one.
fn serving(board: &scoreboard::Board, id: u32) -> String {
    match board.read(id) {
        Some(v) => match (v.event.map(|ev| ev.counts.open), v.peer) {
            (Some(0), _) | (None, None) => "no connection".to_owned(),
            (Some(1) | None, Some(p)) => format!("the connection from {p}"),
            (Some(n), Some(p)) => format!("its {n} open connections (the last served from {p})"),
            (Some(n), None) => format!("its {n} open connections"),
        },
        None => "no connection".to_owned(),
    }
}

/// PSS of a process in kB, from `/proc/PID/smaps_rollup`.
fn pss_kib(pid: Pid) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How long the current request (a blocking worker) or loop turn (an event worker: see
/// `Slot::turn_begin`; none while it waits in `epoll_wait`) of the worker whose slot is `v`
/// has run, if over `limit`. An event worker's clock is its turn's whatever state its
/// slot shows between handler calls; a blocking worker's only while it serves a client.
fn over_request_timeout(v: &scoreboard::SlotView, limit: Duration) -> Option<Duration> {
    let elapsed = v.current.filter(|t| *t > limit)?;
    (v.state != State::Starting && (v.event.is_some() || v.state != State::Idle)).then_some(elapsed)
}

/// The request timeout's log line for worker `id` (`pid`), whose slot `v` shows its
/// current request (a blocking worker) or its loop's current turn (an event worker) running
/// for `elapsed`, over `limit`.
fn timeout_message(
    id: u32,
    pid: Pid,
    limit: Duration,
    elapsed: Duration,
    v: &scoreboard::SlotView,
    abort: bool,
) -> String {
    let peer = v
        .peer
        .as_ref()
        .map(|p| p.to_string())
        .unwrap_or_else(|| "no client".into());
    let head = String::from_utf8_lossy(&v.head);
    let how = if abort { " (SIGABRT, for a core dump)" } else { "" };
    match &v.event {
        // The loop is stuck (a handler call that blocks, a loop in user code): every
        // connection of the worker goes with it, which the operator must be told.
        Some(e) => format!(
            "worker {id} (pid {pid}) exceeded the request timeout of {}: its event loop has not \
             turned for {} (the last handler call was for {peer}, request {head:?}); killing it{how} \
             drops {} connection{}",
            fmt_duration(limit),
            fmt_duration(elapsed),
            e.counts.open,
            if e.counts.open == 1 { "" } else { "s" }
        ),
        None => format!(
            "worker {id} (pid {pid}) exceeded the request timeout of {}: serving {peer} for {}, \
             request {head:?}; killing it{how}",
            fmt_duration(limit),
            fmt_duration(elapsed),
        ),
    }
}

/// `1.5s`, `250ms`, `2m05s`.
fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
    }
}

/// The exited process, how it ended ("exited with status 1", "was killed by signal
/// SIGKILL"), and whether by a signal; none for a status that is no exit.
fn describe_exit(status: WaitStatus) -> Option<(Pid, String, bool)> {
    match status {
        WaitStatus::Exited(pid, code) => Some((pid, exit_reason(code), false)),
        WaitStatus::Signaled(pid, sig, core) => Some((
            pid,
            format!(
                "was killed by signal {}{}",
                sig.as_str(),
                if core { " (core dumped)" } else { "" }
            ),
            true,
        )),
        _ => None,
    }
}

/// What a worker's exit means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// One of the first workers failed to start: the server does not start.
    NoStart,
    /// The pool is stopping: every exit is expected.
    Stopping,
    /// Killed by the master for exceeding the request timeout: replaced.
    TimedOut,
    /// Recycled as asked (its replacement is started or ready).
    Recycled,
    /// A surplus worker that left as asked: not replaced.
    Retired,
    /// Died while serving, or killed from outside while starting: replaced at once.
    Died,
    /// Failed to start while the pool runs: replaced, within the crash-loop back-off.
    StartFailed,
}

/// What the exit of worker `w` in `phase` means; `start_failure`: it ended on its own
/// before it was ready (`pool::is_start_failure`).
fn fate(phase: Phase, w: &Worker, start_failure: bool) -> Fate {
    match phase {
        Phase::Starting if start_failure => Fate::NoStart,
        Phase::Stopping { .. } => Fate::Stopping,
        Phase::Starting | Phase::Running | Phase::Draining { .. } => {
            if w.timed_out.is_some() {
                return Fate::TimedOut;
            }
            match w.leaving {
                Some(Leave::Recycle(_)) if w.stop_sent => Fate::Recycled,
                Some(Leave::Surplus) if w.stop_sent => Fate::Retired,
                _ if start_failure => Fate::StartFailed,
                _ => Fate::Died,
            }
        }
    }
}

/// How a worker ended, with the start failure it reported first, if any.
fn with_failure(reason: String, failure: Option<&str>) -> String {
    match failure {
        Some(f) => format!("{reason}: {f}"),
        None => reason,
    }
}

fn exit_reason(code: i32) -> String {
    match code {
        exit::OK => "exited".into(),
        exit::PANIC => format!("exited with status {code} after a panic"),
        exit::START_FAILED => format!("exited with status {code}: it could not start"),
        exit::ORPHANED => format!("exited with status {code}: its master was gone"),
        _ => format!("exited with status {code}"),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn issue_16_a_stuck_event_loop_is_killed_and_the_log_says_how_many_connections_go() {
        use crate::net::listener::Addr;
        use crate::scoreboard::ConnCounts;
        let board = Board::new().unwrap();
        let limit = Duration::from_secs(30);
        board.claim(2, 0);
        board.set_pid(2, 4242);
        let s = board.slot(2).unwrap();
        s.set_event();
        board.set_state(2, State::Idle);
        s.publish_counts(ConnCounts {
            open: 812,
            reading: 3,
            writing: 1,
            idle_keepalive: 807,
        });
        s.handler_call(
            &Addr::Inet("192.0.2.5:6000".parse().unwrap()),
            b"GET /block HTTP/1.1\r\n",
        );
        // Waiting in epoll_wait: never over the limit.
        s.turn_end();
        assert_eq!(over_request_timeout(&board.read(2).unwrap(), limit), None);
        // A turn that began 40 s ago and has not ended, whatever the slot's state.
        s.turn_begin(scoreboard::now_ns() - 40_000_000_000);
        let v = board.read(2).unwrap();
        let elapsed = over_request_timeout(&v, limit).expect("a loop stuck past the limit");
        assert!(elapsed >= Duration::from_secs(40));
        let line = timeout_message(2, Pid::from_raw(4242), limit, Duration::from_secs(40), &v, false);
        assert_eq!(
            line,
            "worker 2 (pid 4242) exceeded the request timeout of 30.0s: its event loop has not turned \
             for 40.0s (the last handler call was for 192.0.2.5:6000, request \"GET /block HTTP/1.1\\r\\n\"); \
             killing it drops 812 connections"
        );
        // A blocking worker's line is as it was, and an idle one is not timed.
        board.claim(3, 0);
        board.set_pid(3, 4343);
        let b = board.slot(3).unwrap();
        b.connection(&Addr::Inet("192.0.2.6:7000".parse().unwrap()));
        board.set_state(3, State::Handling);
        b.request_start(b"GET /slow");
        let mut v = board.read(3).unwrap();
        v.current = Some(Duration::from_secs(31));
        assert_eq!(over_request_timeout(&v, limit), Some(Duration::from_secs(31)));
        assert_eq!(
            timeout_message(3, Pid::from_raw(4343), limit, Duration::from_secs(31), &v, true),
            "worker 3 (pid 4343) exceeded the request timeout of 30.0s: serving 192.0.2.6:7000 for 31.0s, \
             request \"GET /slow\"; killing it (SIGABRT, for a core dump)"
        );
        v.state = State::Idle;
        assert_eq!(over_request_timeout(&v, limit), None);
    }

    fn worker() -> Worker {
        Worker {
            ready: true,
            ..Worker::new(1, 0)
        }
    }

    /// A master that began to stop, its grace period over.
    pub(in crate::master) fn stopping() -> Phase {
        Phase::stopping(Duration::ZERO)
    }

    #[test]
    fn an_exit_is_expected_or_replaced_by_what_the_worker_was_doing() {
        let w = worker();
        assert_eq!(fate(Phase::Running, &w, false), Fate::Died);
        assert_eq!(fate(Phase::Running, &w, true), Fate::StartFailed);
        assert_eq!(fate(Phase::Starting, &w, true), Fate::NoStart);
        assert_eq!(
            fate(Phase::Starting, &w, false),
            Fate::Died,
            "a first worker that was ready, or killed from outside, is replaced"
        );
        assert_eq!(fate(stopping(), &w, true), Fate::Stopping);
        let timed_out = Worker {
            timed_out: Some(Instant::now()),
            leaving: Some(Leave::Recycle("memory")),
            stop_sent: true,
            ..worker()
        };
        assert_eq!(fate(Phase::Running, &timed_out, false), Fate::TimedOut);
        let recycled = Worker {
            leaving: Some(Leave::Recycle("age")),
            stop_sent: true,
            ..worker()
        };
        assert_eq!(fate(Phase::Running, &recycled, false), Fate::Recycled);
        let surplus = Worker {
            leaving: Some(Leave::Surplus),
            stop_sent: true,
            ..worker()
        };
        assert_eq!(fate(Phase::Running, &surplus, false), Fate::Retired);
        // Marked to leave but not yet told: it died on its own, and is replaced as such.
        let marked = Worker {
            leaving: Some(Leave::Recycle("reload")),
            ..worker()
        };
        assert_eq!(fate(Phase::Running, &marked, false), Fate::Died);
    }

    #[test]
    fn exits_are_described_for_the_log() {
        let pid = Pid::from_raw(42);
        assert_eq!(
            describe_exit(WaitStatus::Exited(pid, exit::PANIC)),
            Some((
                pid,
                format!("exited with status {} after a panic", exit::PANIC),
                false
            ))
        );
        assert_eq!(
            describe_exit(WaitStatus::Signaled(pid, Signal::SIGSEGV, true)),
            Some((pid, "was killed by signal SIGSEGV (core dumped)".into(), true))
        );
        assert_eq!(
            describe_exit(WaitStatus::Signaled(pid, Signal::SIGKILL, false)),
            Some((pid, "was killed by signal SIGKILL".into(), true))
        );
        assert_eq!(describe_exit(WaitStatus::StillAlive), None);
        assert_eq!(exit_reason(exit::OK), "exited");
        assert_eq!(
            exit_reason(exit::START_FAILED),
            format!("exited with status {}: it could not start", exit::START_FAILED)
        );
        assert_eq!(
            exit_reason(exit::ORPHANED),
            format!("exited with status {}: its master was gone", exit::ORPHANED)
        );
        assert_eq!(exit_reason(7), "exited with status 7");
        assert_eq!(
            with_failure("exited with status 3".into(), Some("the factory failed: no db")),
            "exited with status 3: the factory failed: no db"
        );
        assert_eq!(with_failure("exited".into(), None), "exited");
    }

    #[test]
    fn durations_are_short_in_log_lines() {
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(fmt_duration(Duration::from_secs(125)), "2m05s");
    }
}

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
//! The master's files are its roles; the [`Master`] struct, its settings and its table of
//! workers are here, and each role is an `impl Master` block of its own file:
//!
//! - `startup.rs`: from the resolved command line to the loop (`rehearse.rs`: what `check`
//!   opens and releases; `setup.rs`: what each worker is started with; `exec.rs`: a
//!   re-executed worker, `--exec-workers`);
//! - `run.rs`: the loop, its `poll` and timeout, the signals, the phases' steps, the stop;
//! - `reap.rs`: the workers' messages and exits, and what each exit means;
//! - `maintain.rs`: the pool kept at its size, its rounds carried out, recycling, reload;
//! - `pool.rs`: the pool policy and its decisions (the target, the rounds: grow, retire,
//!   "max workers reached"), pacing and the crash-loop back-off, with no process in sight;
//! - `spawn.rs`: forking a worker, and the reopened log files handed to each;
//! - `watch.rs`: timeouts and recycling by age and memory; `holds.rs`: the slow-client
//!   watch; `queue.rs`: the listen queue watched for the keep-alive guard;
//! - `signals.rs`, `control.rs` (the control dispatch and the status snapshot) and
//!   `upgrade.rs` (the binary upgrade driver).

mod control;
mod exec;
pub(crate) mod holds;
mod maintain;
mod open;
pub(crate) mod pool;
pub(crate) mod queue;
mod reap;
pub(crate) mod rehearse;
mod run;
mod setup;
mod signals;
mod spawn;
pub(crate) mod startup;
mod upgrade;
mod watch;

use control::Counters;
use signals::Signals;
use upgrade::Upgrade;
pub(crate) use upgrade::UpgradeSettings;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::control::{Control, MetricsListener};
use crate::error::Error;
use crate::net::listener::Listener;
use crate::peer_counts::PeerCounts;
use crate::process::notify::Channel;
use crate::scoreboard::{self, Board, State};
use crate::sys::{self, exit};
use crate::worker::Recycle;
use pool::{Backoff, Jitter, Pacer, Policy, Rounds, Seen};

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
    /// The rounds of a dynamic or on-demand pool (`pool.rs` decides them).
    rounds: Rounds,
    started: Instant,
    last_memory_check: Instant,
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
    /// Hybrid mode's fronts.
    hybrid: Hybrid<'a>,
}

/// Hybrid mode, as the master keeps it (the defaults: not hybrid mode).
#[derive(Debug, Default)]
struct Hybrid<'a> {
    /// The fronts wanted.
    fronts: usize,
    /// The hand-off channel (whose emptiness tells the requests waiting for a worker).
    handoff: Option<&'a crate::net::handoff::Channel>,
    /// A stop: the workers are told once the fronts have left (they serve what the fronts
    /// hand them until then).
    workers_wait: bool,
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
            rounds: Rounds::new(now),
            started: now,
            last_memory_check: now,
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
            hybrid: Hybrid::default(),
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
            self.hybrid.fronts = n;
            self.hybrid.handoff = Some(channel);
        }
        self
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

    /// Workers of the pool that count towards its size and are ready.
    fn ready_active(&self) -> usize {
        self.pool().filter(|(_, w)| w.active() && w.ready).count()
    }

    /// How many workers the pool wants now.
    fn target(&self) -> usize {
        self.settings.policy.target(self.active(), self.owed)
    }

    /// What the pool's decisions count (`pool.rs`): the idle, starting and active workers.
    fn seen(&self) -> Seen {
        Seen {
            idle: self.settings.board.idle() as usize,
            starting: self.starting(),
            active: self.active(),
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

    /// Sends `sig` to every child: workers and fronts.
    fn kill_all(&self, sig: Signal) {
        for pid in self.workers.keys() {
            let _ = signal::kill(*pid, sig);
        }
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

/// How a process that exited with `code` ended, for the log ("exited with status 3: it
/// could not start").
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

    /// A master that began to stop, its grace period over.
    pub(in crate::master) fn stopping() -> Phase {
        Phase::stopping(Duration::ZERO)
    }

    #[test]
    fn durations_are_short_in_log_lines() {
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(fmt_duration(Duration::from_secs(125)), "2m05s");
    }
}

//! The master process: a single-threaded supervisor that never runs handler code.
//!
//! It owns the listeners (bound before it forks), forks the workers, replaces those that
//! die, and stops the pool on TERM, INT or QUIT. It sleeps in `poll(2)` on two pipes:
//! the signal pipe (written by signal handlers, so that no signal is handled in signal
//! context and none is lost between a check and the poll) and the workers' notification
//! pipe. Child exits are collected with `waitpid(WNOHANG)` after a SIGCHLD.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{self, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::{Gid, Pid};

use crate::error::Error;
use crate::listener::Listener;
use crate::notify::{Channel, Message};
use crate::pool::{self, Backoff, Policy, Verdict};
use crate::scoreboard::Board;
use crate::sys::{self, exit};

/// The signals the master listens to.
#[derive(Debug)]
pub(crate) struct Signals {
    wake: UnixStream,
    /// Every descriptor of the wake pipe (the read end and the write ends held by the
    /// signal handlers), for workers to close.
    wake_fds: Vec<RawFd>,
    term: Arc<AtomicBool>,
    int: Arc<AtomicBool>,
    quit: Arc<AtomicBool>,
    child: Arc<AtomicBool>,
    reopen: Arc<AtomicBool>,
    other: Vec<(Signal, Arc<AtomicBool>)>,
}

impl Signals {
    /// Installs the master's handlers. Each sets a flag, then writes a byte to the wake
    /// pipe (signal-hook runs the actions in registration order).
    pub(crate) fn install() -> io::Result<Self> {
        let (wake, wake_write) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wake_write.set_nonblocking(true)?;
        let wake_write: OwnedFd = wake_write.into();
        let mut wake_fds = vec![wake.as_raw_fd()];
        let mut flag = |sig: Signal| -> io::Result<Arc<AtomicBool>> {
            let f = Arc::new(AtomicBool::new(false));
            signal_hook::flag::register(sig as i32, Arc::clone(&f))?;
            let write_end = wake_write.try_clone()?;
            wake_fds.push(write_end.as_raw_fd());
            signal_hook::low_level::pipe::register(sig as i32, write_end)?;
            Ok(f)
        };
        let term = flag(Signal::SIGTERM)?;
        let int = flag(Signal::SIGINT)?;
        let quit = flag(Signal::SIGQUIT)?;
        let child = flag(Signal::SIGCHLD)?;
        let reopen = flag(Signal::SIGUSR1)?;
        let other = [
            Signal::SIGHUP,
            Signal::SIGUSR2,
            Signal::SIGTTIN,
            Signal::SIGTTOU,
            Signal::SIGWINCH,
        ]
        .into_iter()
        .map(|s| flag(s).map(|f| (s, f)))
        .collect::<io::Result<_>>()?;
        Ok(Signals {
            wake,
            wake_fds,
            term,
            int,
            quit,
            child,
            reopen,
            other,
        })
    }

    /// Descriptors a worker must close after fork.
    fn fds(&self) -> &[RawFd] {
        &self.wake_fds
    }

    fn drain(&mut self) {
        let mut buf = [0u8; 64];
        while matches!(self.wake.read(&mut buf), Ok(n) if n > 0) {}
    }

    /// The first stop signal pending, if any.
    fn take_stop(&self) -> Option<Signal> {
        [
            (Signal::SIGTERM, &self.term),
            (Signal::SIGINT, &self.int),
            (Signal::SIGQUIT, &self.quit),
        ]
        .into_iter()
        .fold(None, |found, (sig, flag)| {
            let raised = flag.swap(false, Ordering::SeqCst);
            found.or(raised.then_some(sig))
        })
    }
}

/// The master's phases, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Forking the first workers, waiting for each to report ready.
    Starting,
    /// Serving; dead workers are replaced.
    Running,
    /// Listeners shut, workers finishing their connections until the deadline.
    Stopping {
        deadline: Instant,
        killed: bool,
        /// When the stop began, to tell a deliberate second signal from a duplicate.
        since: Instant,
    },
}

/// A stop signal that arrives within this time of the first counts as the same request: a
/// signal sent to a pid and to its process group at once (as `timeout(1)` does, or a
/// supervisor and a terminal together) reaches the master twice.
pub(crate) const REPEAT_WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Worker {
    id: u32,
    spawned: Instant,
    ready: bool,
    /// A start failure the worker reported before it exited.
    failure: Option<String>,
}

/// Settings the master needs.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) policy: Policy,
    /// The shared board; the master clears the slot of a worker that died.
    pub(crate) board: &'static Board,
    pub(crate) grace_period: Duration,
    /// The log file to reopen on USR1, and the group to give the new file to (the
    /// workers', so that they can reopen it too).
    pub(crate) log_file: Option<(PathBuf, Option<Gid>)>,
    /// Other descriptors of the master's that workers must close (pid file, readiness pipe).
    pub(crate) master_fds: Vec<RawFd>,
}

/// The master's state.
#[derive(Debug)]
pub(crate) struct Master<'a> {
    settings: Settings,
    listeners: &'a [Listener],
    channel: &'a Channel,
    signals: Signals,
    workers: BTreeMap<Pid, Worker>,
    phase: Phase,
    backoff: Backoff,
}

/// Spawns worker `id` in the child side of a fork; never returns.
///
/// (`Infallible` stands for `!`, which cannot yet be written in a closure's type: a
/// function of this type can only end the process.)
pub(crate) type Entry<'e> = dyn FnMut(u32, &[RawFd]) -> Infallible + 'e;

impl<'a> Master<'a> {
    pub(crate) fn new(
        settings: Settings,
        listeners: &'a [Listener],
        channel: &'a Channel,
        signals: Signals,
    ) -> Self {
        Master {
            settings,
            listeners,
            channel,
            signals,
            workers: BTreeMap::new(),
            phase: Phase::Starting,
            backoff: Backoff::default(),
        }
    }

    /// Runs the pool until it stops. Returns an error when the first workers cannot
    /// start; the pool is stopped before it returns.
    /// `on_ready` is called once, when the first workers have all reported ready.
    pub(crate) fn run(mut self, entry: &mut Entry<'_>, on_ready: &mut dyn FnMut()) -> Result<(), Error> {
        let result = self.run_loop(entry, on_ready);
        if result.is_err() {
            // From here on every exit is expected: no start-up error, no replacement.
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
        for l in self.listeners {
            l.remove_file();
        }
        result
    }

    fn run_loop(&mut self, entry: &mut Entry<'_>, on_ready: &mut dyn FnMut()) -> Result<(), Error> {
        // At start-up a failed fork is fatal: better a clear error now than a server that
        // limps along with part of its pool.
        for _ in 0..self.settings.policy.target() {
            self.spawn(entry)?;
        }
        loop {
            self.wait();
            self.signals.drain();
            if let Some(sig) = self.signals.take_stop() {
                self.on_stop_signal(sig);
            }
            if self.signals.reopen.swap(false, Ordering::SeqCst) {
                self.reopen_log();
            }
            for (sig, flag) in &self.signals.other {
                if flag.swap(false, Ordering::SeqCst) {
                    tracing::info!(
                        "{} received: this signal has no action in this version; ignored",
                        sig.as_str()
                    );
                }
            }
            for (pid, msg) in self.channel.receive() {
                self.on_message(Pid::from_raw(pid as i32), msg);
            }
            if self.signals.child.swap(false, Ordering::SeqCst) {
                self.reap()?;
            }
            match self.phase {
                Phase::Starting => {
                    // A worker that was ready and died meanwhile (a handler panic on the
                    // very first connection) is replaced here too.
                    self.maintain(entry)?;
                    let target = self.settings.policy.target();
                    if self.workers.values().filter(|w| w.ready).count() >= target {
                        self.phase = Phase::Running;
                        tracing::info!(workers = target, "ready");
                        on_ready();
                    }
                }
                Phase::Running => self.maintain(entry)?,
                Phase::Stopping {
                    deadline,
                    killed,
                    since,
                } => {
                    if self.workers.is_empty() {
                        tracing::info!("stopped");
                        return Ok(());
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
                }
            }
        }
    }

    /// Sleeps until a signal, a message, or the next deadline.
    fn wait(&mut self) {
        let now = Instant::now();
        let deadline = match self.phase {
            Phase::Stopping {
                deadline,
                killed: false,
                ..
            } => Some(deadline),
            Phase::Stopping { .. } => None,
            Phase::Starting | Phase::Running => {
                let spawn_at = (self.workers.len() < self.settings.policy.target())
                    .then(|| self.backoff.not_before())
                    .flatten();
                // While failures are counted, wake when a ready worker has survived its
                // start, to reset the back-off. Only future times: a past one would make
                // every poll return at once.
                let survivor_check = self
                    .backoff
                    .active()
                    .then(|| {
                        self.workers
                            .values()
                            .filter(|w| w.ready && self.backoff.counts_as_survivor(w.spawned))
                            .map(|w| w.spawned + pool::EARLY_DEATH)
                            .filter(|t| *t > now)
                            .min()
                    })
                    .flatten();
                [spawn_at, survivor_check].into_iter().flatten().min()
            }
        };
        let timeout = match deadline {
            None => PollTimeout::NONE,
            Some(t) => {
                let ms = t.saturating_duration_since(now).as_millis().saturating_add(1);
                PollTimeout::try_from(ms.min(60_000) as i32).unwrap_or(PollTimeout::NONE)
            }
        };
        let mut fds = [
            PollFd::new(self.signals.wake.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.channel.as_fd(), PollFlags::POLLIN),
        ];
        match nix::poll::poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                // poll on two valid pipes cannot fail short of memory exhaustion; do not
                // spin if it does.
                tracing::error!("poll failed: {}", e.desc());
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    fn on_stop_signal(&mut self, sig: Signal) {
        match self.phase {
            Phase::Stopping { since, .. } if since.elapsed() < REPEAT_WINDOW => {
                tracing::debug!(
                    "{} received again within {REPEAT_WINDOW:?}: same stop request",
                    sig.as_str()
                );
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
                tracing::info!(
                    "{} received: stopping; connections in progress may finish within {:?}",
                    sig.as_str(),
                    self.settings.grace_period
                );
                // Shut the listeners for every process at once: new connections are
                // refused from now on, idle workers wake up and exit.
                for l in self.listeners {
                    l.shutdown();
                }
                self.kill_all(Signal::SIGTERM);
                let now = Instant::now();
                self.phase = Phase::Stopping {
                    deadline: now + self.settings.grace_period,
                    killed: false,
                    since: now,
                };
            }
        }
    }

    fn on_message(&mut self, pid: Pid, msg: Message) {
        let Some(w) = self.workers.get_mut(&pid) else {
            return;
        };
        match msg {
            Message::Ready => w.ready = true,
            Message::StartFailed(reason) => w.failure = Some(reason),
        }
    }

    /// Collects every exited worker.
    fn reap(&mut self) -> Result<(), Error> {
        loop {
            match nix::sys::wait::waitpid(None, Some(WaitPidFlag::WNOHANG)) {
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
        let (pid, reason) = match status {
            WaitStatus::Exited(pid, code) => (pid, exit_reason(code)),
            WaitStatus::Signaled(pid, sig, core) => (
                pid,
                format!(
                    "was killed by signal {}{}",
                    sig.as_str(),
                    if core { " (core dumped)" } else { "" }
                ),
            ),
            _ => return Ok(()),
        };
        // Late messages (a failure reason written just before exit) are read first.
        for (p, msg) in self.channel.receive() {
            self.on_message(Pid::from_raw(p as i32), msg);
        }
        let Some(worker) = self.workers.remove(&pid) else {
            return Ok(());
        };
        // A worker killed while waiting in accept must not count as idle any more.
        self.settings.board.set_busy(worker.id);
        let lived = worker.spawned.elapsed();
        match self.phase {
            Phase::Starting if !worker.ready => {
                let reason = worker.failure.unwrap_or(reason);
                tracing::error!(
                    "worker {} (pid {pid}) failed to start: {reason}; stopping",
                    worker.id
                );
                return Err(Error::WorkerStart {
                    pid: pid.as_raw(),
                    reason,
                });
            }
            Phase::Stopping { .. } => {
                tracing::debug!("worker {} (pid {pid}) {reason}", worker.id);
            }
            Phase::Starting | Phase::Running => {
                let reason = match worker.failure {
                    Some(f) => format!("{reason}: {f}"),
                    None => reason,
                };
                let early = lived < pool::EARLY_DEATH || !worker.ready;
                match self.backoff.record(early, Instant::now()) {
                    Verdict::Replace => {
                        tracing::warn!(
                            "worker {} (pid {pid}) {reason}; starting a replacement",
                            worker.id
                        )
                    }
                    Verdict::BackOffStarted { delay, in_a_row } => tracing::error!(
                        "worker {} (pid {pid}) {reason}; workers keep dying right after start \
                         ({in_a_row} in a row): restarting them with exponential back-off, next in {delay:?}",
                        worker.id
                    ),
                    Verdict::BackOff { delay, in_a_row } => tracing::debug!(
                        "worker {} (pid {pid}) {reason}; {in_a_row} in a row, next in {delay:?}",
                        worker.id
                    ),
                }
            }
        }
        Ok(())
    }

    /// Keeps the pool at its target size.
    fn maintain(&mut self, entry: &mut Entry<'_>) -> Result<(), Error> {
        let now = Instant::now();
        if self.backoff.active()
            && self.workers.values().any(|w| {
                w.ready
                    && self.backoff.counts_as_survivor(w.spawned)
                    && now.duration_since(w.spawned) >= pool::EARLY_DEATH
            })
            && self.backoff.reset()
        {
            tracing::info!("workers are starting normally again");
        }
        while self.workers.len() < self.settings.policy.target() && self.backoff.may_spawn(now) {
            if let Err(e) = self.spawn(entry) {
                // Out of processes or memory: keep serving with the workers we have and
                // retry with the crash-loop back-off rather than give up the server.
                let delay = self.backoff.spawn_failed(now);
                tracing::error!("cannot start a worker: {e}; retrying in {delay:?}");
                break;
            }
            if self.backoff.active() {
                break; // one at a time while failures are being counted
            }
        }
        Ok(())
    }

    fn spawn(&mut self, entry: &mut Entry<'_>) -> Result<(), Error> {
        let id = (1..)
            .find(|id| !self.workers.values().any(|w| w.id == *id))
            .unwrap_or(0);
        let master_fds: Vec<RawFd> = self
            .signals
            .fds()
            .iter()
            .copied()
            .chain([self.channel.read_fd()])
            .chain(self.settings.master_fds.iter().copied())
            .collect();
        let _ = io::stdout().flush();
        // SAFETY: the master is single-threaded for its whole life (it starts no thread and
        // uses no crate that does; `sys::fork` checks); the log writer is unbuffered and
        // stdout was flushed above; the child runs `entry`, which ends in `_exit`.
        let pid = unsafe { sys::fork_child(|| entry(id, &master_fds)) }?;
        tracing::debug!("started worker {id} (pid {pid})");
        self.workers.insert(
            pid,
            Worker {
                id,
                spawned: Instant::now(),
                ready: false,
                failure: None,
            },
        );
        Ok(())
    }

    /// USR1: reopens the log file (after logrotate moved it away), then asks the workers
    /// to do the same; they reopen it by path between connections.
    fn reopen_log(&mut self) {
        let Some((path, gid)) = &self.settings.log_file else {
            tracing::info!("SIGUSR1 received: no log file to reopen (logging to stderr)");
            return;
        };
        match crate::daemon::open_log(path, *gid)
            .and_then(|f| crate::daemon::redirect_stderr(&f).map_err(|e| Error::sys("redirecting stderr", e)))
        {
            Ok(()) => {
                tracing::info!("SIGUSR1 received: reopened the log file {}", path.display());
                self.kill_all(Signal::SIGUSR1);
            }
            Err(e) => tracing::error!(
                "SIGUSR1 received: cannot reopen the log file: {e}; still logging to the old one"
            ),
        }
    }

    fn kill_all(&self, sig: Signal) {
        for pid in self.workers.keys() {
            let _ = signal::kill(*pid, sig);
        }
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

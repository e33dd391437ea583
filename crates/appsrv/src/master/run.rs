//! The master's loop: the initial pool, then one round per wake-up (`run_loop`): what woke
//! it, the signals, the phase's step (`Starting`, `Running`, `Draining`, `Stopping`); the
//! one `poll(2)` it sleeps in (`wait`) and its timeout at the next deadline; a stop asked
//! by a signal, with its drain delay and its grace period.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use super::{Entry, Master, Phase, REPEAT_WINDOW, Stepped, TICK};
use crate::control::{Control, MetricsListener};
use crate::error::Error;
use crate::worker::Role;

impl<'a> Master<'a> {
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
    pub(super) fn run_loop(
        &mut self,
        entry: &mut Entry<'_>,
        on_ready: &mut dyn FnMut(),
    ) -> Result<(), Error> {
        // At start-up a failed fork is fatal: better a clear error now than a server that
        // limps along with part of its pool.
        for _ in 0..self.settings.policy.initial() {
            self.spawn(entry, Role::Worker)?;
        }
        for _ in 0..self.hybrid.fronts {
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
    pub(super) fn take_wakeups(&mut self) {
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
    pub(super) fn on_signals(&mut self) {
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
    pub(super) fn phase_step(
        &mut self,
        entry: &mut Entry<'_>,
        on_ready: &mut dyn FnMut(),
    ) -> Result<Stepped, Error> {
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
    pub(super) fn starting_step(
        &mut self,
        entry: &mut Entry<'_>,
        on_ready: &mut dyn FnMut(),
    ) -> Result<(), Error> {
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
        if ready(false) >= initial && ready(true) >= self.hybrid.fronts {
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
    pub(super) fn running_step(&mut self, entry: &mut Entry<'_>) -> Result<(), Error> {
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
    pub(super) fn stopping_step(&mut self, deadline: Instant, killed: bool, since: Instant) -> Stepped {
        if self.workers.is_empty() {
            if let Some(n) = self.hybrid.handoff.map(|ch| ch.close_left()).filter(|n| *n > 0) {
                tracing::warn!(
                    "{n} connection(s) left in the hand-off channel with no worker to serve them: closed unanswered"
                );
            }
            tracing::info!("stopped");
            return Stepped::Stopped;
        }
        if self.hybrid.workers_wait && !self.workers.values().any(|w| w.front) {
            // The fronts are gone: the workers serve what is left in the
            // channel (with what was handed back as the fronts stopped), then
            // their connections, then leave.
            self.hybrid.workers_wait = false;
            if let Some(ch) = self.hybrid.handoff {
                let n = ch.bounce_to_workers();
                if n > 0 {
                    tracing::debug!("{n} connection(s) handed back as the fronts stopped: to the workers");
                }
            }
            self.kill_all(Signal::SIGTERM);
            if let Some(ch) = self.hybrid.handoff {
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
    pub(super) fn has_periodic_duties(&self) -> bool {
        self.settings.policy.has_rounds()
            || self.workers.values().any(|w| w.stop_at.is_some())
            || self.settings.limits.request_timeout.is_some()
            || self.settings.limits.max_age.is_some()
            || self.settings.limits.max_memory_kib > 0
            || self.workers.values().any(|w| w.timed_out.is_some())
    }

    /// Sleeps until a signal, a message, a wake-up, a control request, or the next deadline.
    pub(super) fn wait(&mut self) {
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
    pub(super) fn poll_timeout(&mut self, now: Instant) -> PollTimeout {
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
                deadlines.extend(self.rounds.next());
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
    pub(super) fn watches_listeners(&self, now: Instant) -> bool {
        self.phase == Phase::Running
            && self.backoff.may_spawn(now, self.serving_workers())
            && self.rounds.due(now)
            && self.settings.policy.watches_listeners(|| self.seen())
    }

    /// A stop signal (TERM, INT, QUIT): begins the stop, with the drain delay when running;
    /// the same signal again within `REPEAT_WINDOW` is a duplicate, later it cuts the drain
    /// delay short or kills what is left.
    pub(super) fn on_stop_signal(&mut self, sig: Signal) {
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
    pub(super) fn begin_stop(&mut self, why: &str) {
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
    pub(super) fn stop_children(&mut self) {
        if self.hybrid.fronts == 0 {
            self.kill_all(Signal::SIGTERM);
            return;
        }
        for (pid, _) in self.workers.iter().filter(|(_, w)| w.front) {
            let _ = signal::kill(*pid, Signal::SIGTERM);
        }
        self.hybrid.workers_wait = true;
    }
}

//! Keeping the pool: replacing what is missing (paced, within the crash-loop back-off),
//! the hybrid fronts, the rounds of a dynamic or on-demand pool (decided in `pool.rs`,
//! carried out here), a shrunk pool's surplus, recycling (one worker waiting to be recycled
//! released per replacement ready) and reload (a new generation).

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use super::pool::{self, Probe, Round};
use super::{Entry, Leave, Master, Phase, ReloadHook};
use crate::error::Error;
use crate::net::listener::Listener;
use crate::scoreboard::State;
use crate::sys;
use crate::worker::Role;

impl<'a> Master<'a> {
    /// Sends SIGTERM to every worker waiting to be recycled once the pool has enough ready
    /// workers without them (their replacements): the pool's capacity never dips.
    pub(super) fn release_one_retiring(&mut self) {
        let fronts_ready = self
            .workers
            .values()
            .filter(|w| w.front && w.active() && w.ready)
            .count();
        let fronts_spare = fronts_ready >= self.hybrid.fronts;
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
    pub(super) fn reload(&mut self, from: &str) -> Result<u32, String> {
        let result = self.try_reload(from);
        if let Err(e) = &result {
            tracing::error!("reload asked {from} failed: {e}; the current workers keep serving");
        }
        result
    }

    /// The reload itself (see `reload`), refused unless running.
    pub(super) fn try_reload(&mut self, from: &str) -> Result<u32, String> {
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

    /// Keeps the pool at its target size and runs the dynamic policies' rounds.
    pub(super) fn maintain(&mut self, entry: &mut Entry<'_>) -> Result<(), Error> {
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
        for _ in fronts..self.hybrid.fronts {
            if !self.backoff.may_spawn(now, self.serving_workers())
                || !self.try_spawn(entry, now, Role::Front)?
            {
                break;
            }
        }
        if self.phase == Phase::Running {
            self.pool_round(entry, now)?;
            self.shrink();
        }
        Ok(())
    }

    /// Spawns one worker; a failed fork while running backs off instead of ending the
    /// server. Returns whether a worker was started.
    pub(super) fn try_spawn(
        &mut self,
        entry: &mut Entry<'_>,
        now: Instant,
        role: Role,
    ) -> Result<bool, Error> {
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

    /// One round of a dynamic or on-demand pool: `pool.rs` decides (`Rounds::decide`: grow
    /// with a doubling rate while idle workers are short, retire a surplus one, report "max
    /// workers reached"), the master forks, retires, logs and counts.
    pub(super) fn pool_round(&mut self, entry: &mut Entry<'_>, now: Instant) -> Result<(), Error> {
        if !self.rounds.begin(&self.settings.policy, now) {
            return Ok(());
        }
        if !self.backoff.may_spawn(now, self.serving_workers()) {
            // Workers keep failing to start: the crash-loop back-off paces the rounds too.
            self.rounds
                .wait_until(self.backoff.not_before(self.serving_workers()));
            return Ok(());
        }
        let seen = self.seen();
        // Decided on a copy, written back: the decision looks at the master (`Probe`).
        let mut rounds = self.rounds;
        let round = rounds.decide(&self.settings.policy, now, seen, self);
        self.rounds = rounds;
        match round {
            Round::Grow(n) => {
                let (idle, starting) = (seen.idle, seen.starting);
                tracing::debug!("{idle} idle worker(s), {starting} starting: starting {n} more");
                for _ in 0..n {
                    if !self.try_spawn(entry, now, Role::Worker)? {
                        break;
                    }
                }
            }
            Round::Full { warn: Some(queued) } => {
                self.counters.max_reached += 1;
                tracing::warn!(
                    "max workers reached ({}): {queued} connection(s) waiting in the listen queue",
                    self.settings.policy.max()
                );
            }
            Round::Full { warn: None } => {}
            Round::Retire(surplus) => {
                for _ in 0..surplus {
                    if !self.retire_idle_worker() {
                        break;
                    }
                    self.rounds.retired(now);
                }
            }
        }
        Ok(())
    }

    /// A pool made smaller (TTOU, `workers -N`): retire the workers above its maximum (a
    /// static pool's size), idle ones first.
    pub(super) fn shrink(&mut self) {
        while self.active() > self.settings.policy.max() {
            if !self.retire_idle_worker() && !self.retire_any_worker() {
                break;
            }
        }
    }

    /// Asks the idle worker that has been idle longest to leave; false if none is idle.
    pub(super) fn retire_idle_worker(&mut self) -> bool {
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

    /// Asks the active worker of the pool with the highest pid (usually the newest) to
    /// leave, busy or not; false if none.
    pub(super) fn retire_any_worker(&mut self) -> bool {
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

    /// Asks worker `pid` to leave (`why`): SIGTERM now, SIGKILL after the grace period.
    pub(super) fn stop_worker(&mut self, pid: Pid, why: Leave) {
        if let Some(w) = self.workers.get_mut(&pid) {
            w.leaving = Some(why);
            w.stop_sent = true;
            w.stop_at = Some(Instant::now());
            let _ = signal::kill(pid, Signal::SIGTERM);
        }
    }

    /// The listeners the workers accept on themselves: all of them, but in hybrid mode only
    /// the TLS ones (the fronts take the others).
    pub(super) fn worker_listeners(&self) -> Vec<&'a Listener> {
        let listeners: &'a [Listener] = self.listeners;
        listeners
            .iter()
            .enumerate()
            .filter(|(i, _)| self.hybrid.handoff.is_none() || self.settings.tls.is_tls(*i))
            .map(|(_, l)| l)
            .collect()
    }
}

/// What a pool round looks at beyond the counts (`pool::Probe`): the listeners' queues, the
/// hand-off channel, the idle workers' slots.
impl Probe for Master<'_> {
    /// Whether a connection waits in some listener's queue (a zero-timeout `poll`).
    fn clients_queued(&self) -> bool {
        match self.hybrid.handoff {
            Some(ch) => {
                self.settings.board.waiting(ch.empty()) > 0
                    || crate::sys::any_readable(&self.worker_listeners())
            }
            None => crate::sys::any_readable(self.listeners),
        }
    }

    /// Connections waiting in the TCP listeners' accept queues (None without TCP listeners);
    /// in hybrid mode, the complete requests waiting for a worker: the pool sizes itself
    /// by those, not by open connections (the fronts hold those).
    fn queue_length(&self) -> Option<u32> {
        if let Some(ch) = self.hybrid.handoff {
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

    fn idle_times(&self) -> Vec<Duration> {
        self.pool()
            .map(|(_, w)| w)
            .filter(|w| w.active())
            .filter_map(|w| self.settings.board.read(w.id))
            .filter(|v| v.state == State::Idle)
            .map(|v| v.idle_for.unwrap_or(v.age))
            .collect()
    }
}

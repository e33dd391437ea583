//! What the workers tell the master: their messages (`Ready`, `StartFailed`, `Retire`) and
//! their exits, collected after a SIGCHLD (`reap`) and judged by what the worker was doing
//! (`fate`): expected, replaced, a start failure within the crash-loop back-off, or the
//! end of a start that failed.

use std::time::Instant;

use nix::errno::Errno;
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::pool::{self, Verdict};
use super::{Leave, Master, Phase, Worker, exit_reason, fmt_duration};
use crate::error::Error;
use crate::process::notify::Message;
use crate::scoreboard::State;

impl<'a> Master<'a> {
    /// A worker's message on the notification pipe: ready, a start failure's reason, or a
    /// recycling limit reached.
    pub(super) fn on_message(&mut self, pid: Pid, msg: Message) {
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

    /// Collects every exited worker.
    pub(super) fn reap(&mut self) -> Result<(), Error> {
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

    /// Waits for the next child to exit (the end of a failed start, every worker killed).
    pub(super) fn reap_blocking(&mut self) -> Result<(), Error> {
        match nix::sys::wait::waitpid(None, None) {
            Ok(status) => self.on_exit(status),
            Err(Errno::EINTR) => Ok(()),
            Err(e) => {
                self.workers.clear();
                Err(Error::sys("waitpid", e))
            }
        }
    }

    /// A child's exit: its counters kept, its slot and tables freed, and what it means
    /// (`fate`) logged, counted and acted on; an error when the first workers cannot start.
    pub(super) fn on_exit(&mut self, status: WaitStatus) -> Result<(), Error> {
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
        if self.hybrid.handoff.is_some_and(|ch| !worker.front && ch.empty()) {
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
    pub(super) fn on_start_failure(&mut self, id: u32, pid: Pid, reason: &str, signaled: bool) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::Worker;
    use crate::master::tests::stopping;
    use crate::sys::exit;
    use nix::sys::signal::Signal;

    fn worker() -> Worker {
        Worker {
            ready: true,
            ..Worker::new(1, 0)
        }
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
}

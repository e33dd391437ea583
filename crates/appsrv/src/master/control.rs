//! The master's side of the control socket and the metrics listener: which requests it
//! answers from its state alone and which it acts on (`dispatch`, free of I/O), the
//! status snapshot, and the pool's resizing (also TTIN and TTOU).

use std::collections::BTreeMap;
use std::os::fd::AsFd;

use super::{Master, Phase};
use crate::control::history;
use crate::control::status::{ListenerStatus, PoolStatus, Status, Totals};
use crate::control::{Peer, Reply, Request, render_json, render_metrics, render_text};
use crate::scoreboard;
use crate::sys;

/// The reasons of worker restarts, in the order `status` and `metrics` show them.
const RESTART_REASONS: [&str; 5] = ["exit", "signal", "timeout", "recycled", "backoff"];

/// What `status` and `metrics` count, kept by the master as workers come and go.
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// Worker restarts by reason (one of [`RESTART_REASONS`]).
    restarts: BTreeMap<&'static str, u64>,
    /// Counters of workers that are gone (so that totals do not drop when a worker exits).
    pub(super) retired: Totals,
    /// How many times the pool reached its maximum while clients waited.
    pub(super) max_reached: u64,
}

impl Counters {
    /// A worker was replaced for `reason`.
    pub(super) fn restart(&mut self, reason: &'static str) {
        debug_assert!(RESTART_REASONS.contains(&reason), "{reason}");
        *self.restarts.entry(reason).or_default() += 1;
    }

    /// Every reason with its count, zeros included.
    fn restarts(&self) -> Vec<(&'static str, u64)> {
        RESTART_REASONS
            .into_iter()
            .map(|r| (r, self.restarts.get(r).copied().unwrap_or(0)))
            .collect()
    }
}

/// What the control requests read of the master's state.
#[derive(Debug, Clone, Copy)]
pub(super) struct View<'v> {
    pub(super) phase: Phase,
    /// This master's pid.
    pub(super) pid: i32,
    /// The current generation of workers.
    pub(super) generation: u32,
    /// The oldest generation that still has workers (none: no worker).
    pub(super) oldest: Option<u32>,
    /// The first workers were ready (this master has served).
    pub(super) serving: bool,
    /// The new master of the pending upgrade.
    pub(super) upgrading: Option<i32>,
    /// The last upgrade that failed: the new master's pid and why.
    pub(super) upgrade_failed: Option<(i32, &'v str)>,
    /// The sockets were handed to a new master.
    pub(super) handed_over: bool,
}

impl View<'_> {
    /// The phase `status` shows: the master's own, or what it is busy with.
    pub(super) fn phase_name(&self) -> &'static str {
        if self.handed_over {
            "draining"
        } else if self.upgrading.is_some() {
            "upgrading"
        } else if self.phase == Phase::Running && self.oldest.is_some_and(|g| g < self.generation) {
            "reloading"
        } else {
            self.phase.name()
        }
    }
}

/// A rendering of the status snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rendering {
    Text,
    Json,
    Metrics,
}

/// What the master does for a request that its state alone does not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// Render a status snapshot.
    Render(Rendering),
    /// Reload (the reply names the new generation).
    Reload,
    /// Start a binary upgrade (the reply names the new master's pid).
    Upgrade,
    /// Grow or shrink the pool.
    Resize(i32),
}

/// The answer to a request, or what to do for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Dispatch {
    Reply(Reply),
    Act(Action),
}

/// Answers `req` from `view`, or says what the master must do for it.
pub(super) fn dispatch(req: Request, view: &View<'_>) -> Dispatch {
    let reply = |r: Reply| Dispatch::Reply(r);
    match req {
        Request::Status { json: false } => Dispatch::Act(Action::Render(Rendering::Text)),
        Request::Status { json: true } => Dispatch::Act(Action::Render(Rendering::Json)),
        Request::Metrics => Dispatch::Act(Action::Render(Rendering::Metrics)),
        Request::Reload => Dispatch::Act(Action::Reload),
        Request::ReloadStatus(g) if g > view.generation => reply(Err(format!("no generation {g} yet"))),
        // Old workers leave only once their replacements are ready: when none is left,
        // the new generation serves alone.
        Request::ReloadStatus(g) => reply(Ok(if view.oldest.is_some_and(|o| o < g) {
            "pending\n".into()
        } else {
            "done\n".into()
        })),
        Request::Upgrade => Dispatch::Act(Action::Upgrade),
        Request::UpgradeStatus(pid) if pid == view.pid => {
            reply(Ok(if view.serving { "done\n" } else { "pending\n" }.into()))
        }
        Request::UpgradeStatus(pid) => reply(match (view.upgrading, view.upgrade_failed) {
            (Some(child), _) if child == pid => Ok("pending\n".into()),
            (_, Some((p, why))) if p == pid => Err(why.to_owned()),
            _ => Err(format!("no upgrade to pid {pid}")),
        }),
        Request::Workers(_) if view.phase != Phase::Running => {
            reply(Err(format!("the server is {}", view.phase.name())))
        }
        Request::Workers(delta) => Dispatch::Act(Action::Resize(delta)),
    }
}

/// Who asked, for the log: "through the control socket (pid 1234, uid 0)".
fn asked_through(peer: Option<Peer>) -> String {
    match peer {
        Some(p) => format!("through the control socket (pid {}, uid {})", p.pid, p.uid),
        None => "through the control socket (credentials unknown)".to_owned(),
    }
}

impl Master<'_> {
    /// TTIN/TTOU and `workers +N|-N`.
    pub(super) fn resize(&mut self, delta: i32) -> String {
        let d = self.settings.policy.adjust(delta, scoreboard::MAX_WORKERS);
        self.settings
            .board
            .set_min_spare(self.settings.policy.wake_below() as u32);
        self.rounds.resized();
        d
    }

    /// Answers the control socket and the metrics listener.
    pub(super) fn service_control(&mut self) {
        // A master started by an upgrade leaves the shared control socket to the old one
        // until it serves: requests meanwhile reach the master that is in charge.
        if self.settings.adopted && !self.serving {
            return;
        }
        if let Some(mut control) = self.settings.control.take() {
            control.service_peers(&mut |req, peer| self.answer(req, peer));
            self.settings.control = Some(control);
        }
        if let Some(mut metrics) = self.settings.metrics.take() {
            metrics.service(&mut || self.status());
            self.settings.metrics = Some(metrics);
        }
    }

    /// What the control requests read of the master's state.
    fn view(&self) -> View<'_> {
        View {
            phase: self.phase,
            pid: std::process::id() as i32,
            generation: self.generation,
            oldest: self.workers.values().map(|w| w.generation).min(),
            serving: self.serving,
            upgrading: self.upgrade.pending_pid(),
            upgrade_failed: self.upgrade.failed(),
            handed_over: self.upgrade.handed_over(),
        }
    }

    fn answer(&mut self, req: Request, peer: Option<Peer>) -> Reply {
        let action = match dispatch(req, &self.view()) {
            Dispatch::Reply(reply) => return reply,
            Dispatch::Act(action) => action,
        };
        match action {
            Action::Render(Rendering::Text) => Ok(render_text(&self.status())),
            Action::Render(Rendering::Json) => Ok(render_json(&self.status())),
            Action::Render(Rendering::Metrics) => Ok(render_metrics(&self.status())),
            Action::Reload => self
                .reload(&asked_through(peer))
                .map(|g| format!("reloading: generation {g}\n")),
            Action::Upgrade => self
                .start_upgrade(&asked_through(peer))
                .map(|pid| format!("upgrading: new master pid {pid}\n")),
            Action::Resize(delta) => {
                let d = self.resize(delta);
                tracing::info!("workers {delta:+} (control socket): {d}");
                Ok(format!("{d}\n"))
            }
        }
    }

    /// A snapshot for `status` and `metrics`, with the rates now and the charts' points
    /// from the history (issue 41).
    fn status(&self) -> Status {
        let mut s = self.snapshot();
        let at = self.started.elapsed();
        s.rates = self.history.rates(at, s.totals().counts());
        s.history = self.history.points().copied().collect();
        s
    }

    /// Records a sample of the counters in the history when one is due (once a second,
    /// [`history::SAMPLE_EVERY`]): called in every round of the loop, whose `poll` wakes
    /// for `next_sample` at the latest.
    pub(super) fn sample_history(&mut self, now: std::time::Instant) {
        if now < self.next_sample {
            return;
        }
        let s = self.snapshot();
        self.history.record(
            now.saturating_duration_since(self.started),
            s.totals().counts(),
            s.gauges(),
        );
        // The next one a period after this one was due; after a stall (a slow fork, a
        // reload hook), a period from now rather than a burst of samples.
        self.next_sample += history::SAMPLE_EVERY;
        if self.next_sample <= now {
            self.next_sample = now + history::SAMPLE_EVERY;
        }
    }

    /// The snapshot of the master's state, without the history.
    fn snapshot(&self) -> Status {
        let board = self.settings.board;
        let of = |front: bool| -> Vec<_> {
            self.workers
                .values()
                .filter(|w| w.front == front)
                .filter_map(|w| board.read(w.id).map(|v| (w.id, v)))
                .collect()
        };
        let workers = of(false);
        let hybrid = self.hybrid.handoff.map(|ch| crate::control::status::Hybrid {
            fronts: of(true),
            requests_waiting: board.waiting(ch.empty()),
            handed_off: board.handoffs_sent(),
        });
        let slots = self
            .settings
            .policy
            .max()
            .max(self.workers.values().map(|w| w.id as usize).max().unwrap_or(0));
        let scoreboard = (1..=slots as u32)
            .map(|id| board.read(id).map_or('.', |v| v.state.letter()))
            .collect();
        let (min_spare, max_spare) = self.settings.policy.spares();
        Status {
            name: self.settings.name.clone(),
            master_pid: std::process::id(),
            phase: self.view().phase_name(),
            uptime: self.started.elapsed(),
            grace_period: self.settings.grace_period,
            drain_delay: self.settings.drain_delay,
            io: self.settings.io,
            pool: PoolStatus {
                policy: self.settings.policy.name(),
                target: self.target(),
                min_spare,
                max_spare,
                max: self.settings.policy.max(),
            },
            listeners: self
                .listeners
                .iter()
                .map(|l| {
                    let q = sys::listen_queue(l.as_fd());
                    ListenerStatus {
                        addr: l.label(),
                        queued: q.map(|(n, _)| n),
                        backlog: q.map(|(_, b)| b),
                        datagram: l.is_datagram(),
                    }
                })
                .collect(),
            workers,
            scoreboard,
            retired: self.counters.retired.clone(),
            max_workers_reached: self.counters.max_reached,
            slow_clients: self.holds.episode().cloned(),
            penalties: crate::penalty::installed().map_or_else(Default::default, |t| {
                let s = t.stats();
                crate::control::status::PenaltyCounts {
                    charged: s.charged,
                    refused: s.refused,
                    unrecorded: s.unrecorded,
                    addresses: s.addresses,
                }
            }),
            restarts: self.counters.restarts(),
            hybrid,
            log_dropped: board.log_dropped().each_ref().map(|row| {
                row.each_ref()
                    .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
            }),
            rates: Default::default(),
            history: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A running master of generation 1 whose workers are all of generation 1.
    fn running() -> View<'static> {
        View {
            phase: Phase::Running,
            pid: 100,
            generation: 1,
            oldest: Some(1),
            serving: true,
            upgrading: None,
            upgrade_failed: None,
            handed_over: false,
        }
    }

    use crate::master::tests::stopping;

    fn reply(r: Result<&str, &str>) -> Dispatch {
        Dispatch::Reply(r.map(str::to_owned).map_err(str::to_owned))
    }

    #[test]
    fn status_metrics_reload_and_upgrade_are_left_to_the_master() {
        let v = running();
        let act = |req| dispatch(req, &v);
        assert_eq!(
            act(Request::Status { json: false }),
            Dispatch::Act(Action::Render(Rendering::Text))
        );
        assert_eq!(
            act(Request::Status { json: true }),
            Dispatch::Act(Action::Render(Rendering::Json))
        );
        assert_eq!(
            act(Request::Metrics),
            Dispatch::Act(Action::Render(Rendering::Metrics))
        );
        // Their phase checks are the master's (SIGHUP and SIGUSR2 share them).
        let starting = View {
            phase: Phase::Starting,
            ..running()
        };
        assert_eq!(
            dispatch(Request::Reload, &starting),
            Dispatch::Act(Action::Reload)
        );
        assert_eq!(
            dispatch(Request::Upgrade, &starting),
            Dispatch::Act(Action::Upgrade)
        );
    }

    #[test]
    fn a_reload_is_done_once_no_older_worker_is_left() {
        let v = View {
            generation: 2,
            oldest: Some(1),
            ..running()
        };
        assert_eq!(dispatch(Request::ReloadStatus(2), &v), reply(Ok("pending\n")));
        assert_eq!(dispatch(Request::ReloadStatus(1), &v), reply(Ok("done\n")));
        assert_eq!(
            dispatch(Request::ReloadStatus(3), &v),
            reply(Err("no generation 3 yet"))
        );
        let v = View { oldest: Some(2), ..v };
        assert_eq!(dispatch(Request::ReloadStatus(2), &v), reply(Ok("done\n")));
        let v = View { oldest: None, ..v };
        assert_eq!(dispatch(Request::ReloadStatus(2), &v), reply(Ok("done\n")));
    }

    #[test]
    fn upgrade_status_is_answered_by_both_masters() {
        // Asked of the new master itself: done once it serves.
        let new = View {
            serving: false,
            ..running()
        };
        assert_eq!(
            dispatch(Request::UpgradeStatus(100), &new),
            reply(Ok("pending\n"))
        );
        assert_eq!(
            dispatch(Request::UpgradeStatus(100), &running()),
            reply(Ok("done\n"))
        );
        // Asked of the old master.
        let old = View {
            upgrading: Some(200),
            upgrade_failed: Some((150, "the new master was not ready in time")),
            ..running()
        };
        assert_eq!(
            dispatch(Request::UpgradeStatus(200), &old),
            reply(Ok("pending\n"))
        );
        assert_eq!(
            dispatch(Request::UpgradeStatus(150), &old),
            reply(Err("the new master was not ready in time"))
        );
        assert_eq!(
            dispatch(Request::UpgradeStatus(300), &old),
            reply(Err("no upgrade to pid 300"))
        );
    }

    #[test]
    fn the_pool_is_resized_only_while_running() {
        assert_eq!(
            dispatch(Request::Workers(-2), &running()),
            Dispatch::Act(Action::Resize(-2))
        );
        for (phase, name) in [(Phase::Starting, "starting"), (stopping(), "stopping")] {
            let v = View { phase, ..running() };
            assert_eq!(
                dispatch(Request::Workers(1), &v),
                reply(Err(&format!("the server is {name}")))
            );
        }
    }

    #[test]
    fn restarts_are_counted_by_reason_all_reasons_shown() {
        let mut c = Counters::default();
        c.restart("recycled");
        c.restart("recycled");
        c.restart("backoff");
        assert_eq!(
            c.restarts(),
            [
                ("exit", 0),
                ("signal", 0),
                ("timeout", 0),
                ("recycled", 2),
                ("backoff", 1)
            ]
        );
    }

    #[test]
    fn the_status_phase_says_what_the_master_is_busy_with() {
        assert_eq!(running().phase_name(), "running");
        let reloading = View {
            generation: 2,
            ..running()
        };
        assert_eq!(reloading.phase_name(), "reloading");
        let upgrading = View {
            upgrading: Some(200),
            ..reloading
        };
        assert_eq!(upgrading.phase_name(), "upgrading");
        let draining = View {
            handed_over: true,
            phase: stopping(),
            ..running()
        };
        assert_eq!(draining.phase_name(), "draining");
        let stopping = View {
            phase: stopping(),
            ..reloading
        };
        assert_eq!(stopping.phase_name(), "stopping", "a stop is no reload");
        let starting = View {
            phase: Phase::Starting,
            oldest: None,
            ..running()
        };
        assert_eq!(starting.phase_name(), "starting");
    }
}

//! How many workers the master keeps, and how fast it replaces workers that keep dying.
//!
//! The pool policy is kept apart from the master's loop so that other policies (a dynamic
//! pool that follows the load) can be added without touching process management.

use std::time::{Duration, Instant};

/// A worker that dies within this time of being started counts as "dying right after
/// start" for the crash-loop back-off.
pub(crate) const EARLY_DEATH: Duration = Duration::from_secs(1);

/// First delay once workers die right after start twice in a row; it doubles with each
/// further early death, up to [`MAX_DELAY`].
const FIRST_DELAY: Duration = Duration::from_millis(100);
const MAX_DELAY: Duration = Duration::from_secs(10);

/// The pool policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Policy {
    /// Always `n` workers.
    Static(usize),
}

impl Policy {
    /// How many workers the master should have running now.
    pub(crate) fn target(&self) -> usize {
        match self {
            Policy::Static(n) => *n,
        }
    }
}

/// Crash-loop back-off: the first early death is replaced at once (a one-off crash should
/// not cost capacity), every further one in a row doubles the delay before the next spawn,
/// so a handler that cannot start never turns the master into a fork storm.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    consecutive: u32,
    not_before: Option<Instant>,
    announced: bool,
    /// When the current run of failures began: only a worker started after it proves
    /// that workers start normally again (one that was running before proves nothing).
    since: Option<Instant>,
}

/// What the master should log about a worker's death.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Replace it now.
    Replace,
    /// Back-off started: log one clear error line.
    BackOffStarted { delay: Duration, in_a_row: u32 },
    /// Back-off continues (already announced): log at debug level.
    BackOff { delay: Duration, in_a_row: u32 },
}

impl Backoff {
    /// Records a worker's death; `early` when it died within [`EARLY_DEATH`] of its start.
    pub(crate) fn record(&mut self, early: bool, now: Instant) -> Verdict {
        if !early {
            self.reset();
            return Verdict::Replace;
        }
        self.consecutive += 1;
        self.since.get_or_insert(now);
        if self.consecutive < 2 {
            return Verdict::Replace;
        }
        let shift = (self.consecutive - 2).min(16);
        let delay = FIRST_DELAY.saturating_mul(1 << shift).min(MAX_DELAY);
        self.not_before = Some(now + delay);
        let in_a_row = self.consecutive;
        if std::mem::replace(&mut self.announced, true) {
            Verdict::BackOff { delay, in_a_row }
        } else {
            Verdict::BackOffStarted { delay, in_a_row }
        }
    }

    /// Records a failed fork: unlike a death, the next attempt always waits.
    pub(crate) fn spawn_failed(&mut self, now: Instant) -> Duration {
        self.consecutive = self.consecutive.max(1);
        match self.record(true, now) {
            Verdict::BackOffStarted { delay, .. } | Verdict::BackOff { delay, .. } => delay,
            Verdict::Replace => FIRST_DELAY, // not reached: two failures in a row back off
        }
    }

    /// Forgets past failures: a worker survived its start.
    pub(crate) fn reset(&mut self) -> bool {
        let was = self.consecutive > 0;
        *self = Backoff::default();
        was
    }

    /// Whether failures are being counted (the master then watches for a survivor).
    pub(crate) fn active(&self) -> bool {
        self.consecutive > 0
    }

    /// Whether a worker started at `spawned` can prove recovery: it was started after the
    /// current run of failures began.
    pub(crate) fn counts_as_survivor(&self, spawned: Instant) -> bool {
        self.since.is_some_and(|t| spawned >= t)
    }

    /// When the next spawn may happen, if it must wait.
    pub(crate) fn not_before(&self) -> Option<Instant> {
        self.not_before
    }

    /// Whether a spawn is allowed at `now`.
    pub(crate) fn may_spawn(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|t| now >= t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_and_resets() {
        let now = Instant::now();
        let mut b = Backoff::default();
        assert_eq!(b.record(true, now), Verdict::Replace);
        assert!(b.may_spawn(now));
        assert_eq!(
            b.record(true, now),
            Verdict::BackOffStarted {
                delay: Duration::from_millis(100),
                in_a_row: 2
            }
        );
        assert!(!b.may_spawn(now));
        assert_eq!(
            b.record(true, now),
            Verdict::BackOff {
                delay: Duration::from_millis(200),
                in_a_row: 3
            }
        );
        for _ in 0..20 {
            b.record(true, now);
        }
        assert_eq!(b.not_before(), Some(now + MAX_DELAY));
        assert_eq!(b.record(false, now), Verdict::Replace);
        assert!(b.may_spawn(now) && !b.active());
    }
}

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

/// How often the master looks at a dynamic or on-demand pool while it grows: rounds much
/// shorter than the one second of Apache prefork and PHP-FPM, so that a pool reaches 128
/// workers in well under a second instead of about eight.
pub(crate) const ROUND: Duration = Duration::from_millis(50);
/// How often it retires a surplus idle worker (one per interval), as Apache does.
pub(crate) const RETIRE_INTERVAL: Duration = Duration::from_secs(1);
/// The largest number of workers started in one round.
pub(crate) const MAX_SPAWN_RATE: usize = 32;

/// The pool policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Policy {
    /// Always `n` workers.
    Static(usize),
    /// Between `min_spare` and `max_spare` idle workers, `start` at first, at most `max`.
    Dynamic {
        start: usize,
        min_spare: usize,
        max_spare: usize,
        max: usize,
    },
    /// No worker until a connection waits; a worker idle for `idle_timeout` leaves.
    Ondemand { max: usize, idle_timeout: Duration },
}

impl Policy {
    /// The name shown in status: static, dynamic or ondemand.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Policy::Static(_) => "static",
            Policy::Dynamic { .. } => "dynamic",
            Policy::Ondemand { .. } => "ondemand",
        }
    }

    /// Workers to start with; the server is ready when they all are.
    pub(crate) fn initial(&self) -> usize {
        match self {
            Policy::Static(n) => *n,
            Policy::Dynamic { start, .. } => *start,
            Policy::Ondemand { .. } => 0,
        }
    }

    /// The most workers the pool may have.
    pub(crate) fn max(&self) -> usize {
        match self {
            Policy::Static(n) => *n,
            Policy::Dynamic { max, .. } | Policy::Ondemand { max, .. } => *max,
        }
    }

    /// The idle count below which a worker taking a connection wakes the master.
    pub(crate) fn wake_below(&self) -> usize {
        match self {
            Policy::Static(_) => 0,
            Policy::Dynamic { min_spare, .. } => *min_spare,
            Policy::Ondemand { .. } => 1,
        }
    }

    /// Grows (`delta` > 0) or shrinks the pool: the static size, or `min_spare` and `max`
    /// of a dynamic pool, or `max` of an on-demand pool; bounded to 1..=`limit` workers.
    /// Returns a description of the new sizes.
    pub(crate) fn adjust(&mut self, delta: i32, limit: usize) -> String {
        let apply = |v: usize| -> usize { (v as i64 + i64::from(delta)).clamp(1, limit as i64) as usize };
        match self {
            Policy::Static(n) => {
                *n = apply(*n);
                format!("static pool of {n} workers")
            }
            Policy::Dynamic {
                min_spare,
                max_spare,
                max,
                ..
            } => {
                *max = apply(*max);
                *min_spare = apply(*min_spare).min(*max);
                *max_spare = (*max_spare).max(*min_spare).min(*max);
                format!("dynamic pool: min spare {min_spare}, max spare {max_spare}, max {max}")
            }
            Policy::Ondemand { max, .. } => {
                *max = apply(*max);
                format!("ondemand pool: max {max}")
            }
        }
    }

    /// `(min_spare, max_spare)`, where they apply.
    pub(crate) fn spares(&self) -> (usize, usize) {
        match self {
            Policy::Dynamic {
                min_spare, max_spare, ..
            } => (*min_spare, *max_spare),
            Policy::Static(_) | Policy::Ondemand { .. } => (0, 0),
        }
    }
}

/// The spawn rate of a growing pool: 1, 2, 4 … up to [`MAX_SPAWN_RATE`] workers per round
/// while a shortage lasts, back to 1 when it ends.
#[derive(Debug)]
pub(crate) struct SpawnRate(usize);

impl Default for SpawnRate {
    fn default() -> Self {
        SpawnRate(1)
    }
}

impl SpawnRate {
    /// Workers to start this round of a shortage; the next round may start twice as many.
    pub(crate) fn next(&mut self) -> usize {
        let n = self.0;
        self.0 = (self.0 * 2).min(MAX_SPAWN_RATE);
        n
    }

    /// The shortage is over.
    pub(crate) fn reset(&mut self) {
        self.0 = 1;
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
    fn the_spawn_rate_doubles_up_to_32() {
        let mut r = SpawnRate::default();
        let rounds: Vec<usize> = (0..8).map(|_| r.next()).collect();
        assert_eq!(rounds, [1, 2, 4, 8, 16, 32, 32, 32]);
        assert_eq!(rounds[..7].iter().sum::<usize>(), 95);
        r.reset();
        assert_eq!(r.next(), 1);
    }

    #[test]
    fn adjusting_a_pool_stays_in_bounds() {
        let mut p = Policy::Static(2);
        p.adjust(3, 1024);
        assert_eq!(p, Policy::Static(5));
        p.adjust(-10, 1024);
        assert_eq!(p, Policy::Static(1), "never below one worker");
        let mut d = Policy::Dynamic {
            start: 2,
            min_spare: 2,
            max_spare: 4,
            max: 8,
        };
        d.adjust(-1, 1024);
        assert_eq!(
            d,
            Policy::Dynamic {
                start: 2,
                min_spare: 1,
                max_spare: 4,
                max: 7
            }
        );
    }

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

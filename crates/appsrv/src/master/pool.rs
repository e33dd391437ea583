//! How many workers the master keeps, and how fast it replaces workers that keep dying.
//!
//! The pool policy is kept apart from the master's loop so that other policies (a dynamic
//! pool that follows the load) can be added without touching process management: every
//! decision that depends on the policy is made here, from counts and times ([`Seen`], a
//! [`Probe`] of the listeners and the board), and returned for the master to carry out
//! ([`Rounds::decide`]'s [`Round`], [`Policy::target`], [`Policy::watches_listeners`]);
//! the master forks and signals, and matches no policy itself.

use std::time::{Duration, Instant};

/// First delay once workers fail to start twice in a row; it doubles with each further
/// start failure, up to [`MAX_DELAY`] (or [`EMPTY_POOL_DELAY`] while no worker serves).
const FIRST_DELAY: Duration = Duration::from_millis(100);
const MAX_DELAY: Duration = Duration::from_secs(10);
/// The longest back-off delay while the pool has no ready worker: an empty pool serves
/// nobody, so the master tries again at least this often (a database that comes back is
/// served within a second), one worker at a time.
pub(crate) const EMPTY_POOL_DELAY: Duration = Duration::from_secs(1);

/// Replacements started within one [`PACING_WINDOW`], at most: a wave of deaths (a kill
/// storm, the OOM killer) is replaced at up to 80 workers a second, never as a fork storm.
pub(crate) const PACING_BURST: usize = 4;
/// The window of [`PACING_BURST`].
pub(crate) const PACING_WINDOW: Duration = Duration::from_millis(50);

/// How a worker's death counts for the crash-loop back-off.
///
/// Only a worker that ended *on its own before it was ready* proves that workers cannot
/// start: it exited (a factory error, a failed privilege drop) or crashed (SEGV, ABRT, BUS,
/// ILL, FPE, SYS, TRAP). A worker killed from outside (KILL, TERM, INT, HUP...: an
/// operator, the OOM killer, a kill storm), ready or not, proves nothing about start-up,
/// and neither does a ready worker's death, whatever killed it: both are replaced at once,
/// within the pacing.
pub(crate) fn is_start_failure(ready: bool, crash_or_exit: bool) -> bool {
    !ready && crash_or_exit
}

/// Whether `sig` is one a process raises on itself by crashing (a fault or an abort), as
/// opposed to one sent from outside.
pub(crate) fn is_crash_signal(sig: nix::sys::signal::Signal) -> bool {
    use nix::sys::signal::Signal::*;
    matches!(
        sig,
        SIGSEGV | SIGABRT | SIGBUS | SIGILL | SIGFPE | SIGSYS | SIGTRAP
    )
}

/// Paces replacements: at most [`PACING_BURST`] per [`PACING_WINDOW`].
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    /// The start of the current window and the spawns made in it.
    window: Option<(Instant, usize)>,
    /// Replacements are being held back (logged once per episode).
    held_back: bool,
}

impl Pacer {
    /// Whether a replacement may start at `now`.
    pub(crate) fn may_spawn(&self, now: Instant) -> bool {
        match self.window {
            Some((start, n)) => now.duration_since(start) >= PACING_WINDOW || n < PACING_BURST,
            None => true,
        }
    }

    /// A replacement started at `now`.
    pub(crate) fn spawned(&mut self, now: Instant) {
        self.window = match self.window {
            Some((start, n)) if now.duration_since(start) < PACING_WINDOW => Some((start, n + 1)),
            _ => Some((now, 1)),
        };
    }

    /// A replacement is held back by the pacing: returns true at the first of an episode
    /// (to log it once).
    pub(crate) fn hold_back(&mut self) -> bool {
        !std::mem::replace(&mut self.held_back, true)
    }

    /// Nothing is left to replace: the episode of held-back replacements is over.
    pub(crate) fn caught_up(&mut self) {
        self.held_back = false;
    }

    /// When the next replacement may start, if the current window is full.
    pub(crate) fn not_before(&self) -> Option<Instant> {
        match self.window {
            Some((start, n)) if n >= PACING_BURST => Some(start + PACING_WINDOW),
            _ => None,
        }
    }
}

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

    /// How many workers the pool wants now, with `active` workers counting towards its
    /// size and `owed` replacements of workers waiting to be recycled.
    pub(crate) fn target(&self, active: usize, owed: usize) -> usize {
        match self {
            Policy::Static(n) => *n,
            // Dynamic and on-demand pools grow in rounds; between rounds they keep what
            // they have, counting the workers waiting to be recycled (not yet told to
            // stop): those are replaced first, then stopped, so capacity never dips.
            Policy::Dynamic { start, max, .. } => (active + owed).max(*start).min(*max),
            Policy::Ondemand { max, .. } => (active + owed).min(*max),
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

    /// Whether the pool is sized in rounds (dynamic, on-demand), which the master runs on a
    /// clock; a static pool has none.
    pub(crate) fn has_rounds(&self) -> bool {
        !matches!(self, Policy::Static(_))
    }

    /// Whether the master watches the listeners itself, to start a worker for the first
    /// client that waits: an on-demand pool with no worker idle or starting, and room to
    /// grow. `seen` is counted only for an on-demand pool.
    pub(crate) fn watches_listeners(&self, seen: impl FnOnce() -> Seen) -> bool {
        matches!(self, Policy::Ondemand { .. }) && {
            let seen = seen();
            seen.idle == 0 && seen.starting == 0 && seen.active < self.max()
        }
    }

    /// Whether idle workers are short: fewer idle or starting than `min_spare` (dynamic),
    /// none while a client waits (on-demand: `queued` is asked only then); never in a
    /// static pool.
    fn short(&self, idle: usize, starting: usize, queued: impl FnOnce() -> bool) -> bool {
        match self {
            Policy::Dynamic { min_spare, .. } => idle + starting < *min_spare,
            Policy::Ondemand { .. } => idle + starting == 0 && queued(),
            Policy::Static(_) => false,
        }
    }

    /// How many surplus idle workers to retire: for a dynamic pool one, while more than
    /// `max_spare` are idle, once `since_retire` (since the last) reaches
    /// [`RETIRE_INTERVAL`]; for an on-demand pool every worker idle for its idle timeout
    /// (`probe`'s idle times are read only then); for a static pool none.
    fn surplus(&self, idle: usize, since_retire: Duration, probe: &dyn Probe) -> usize {
        match self {
            Policy::Dynamic { max_spare, .. } => {
                usize::from(idle > *max_spare && since_retire >= RETIRE_INTERVAL)
            }
            Policy::Ondemand { idle_timeout, .. } => probe
                .idle_times()
                .into_iter()
                .filter(|t| *t >= *idle_timeout)
                .count(),
            Policy::Static(_) => 0,
        }
    }
}

/// What the master counts of its pool when a decision needs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Workers waiting for a connection (the board's count).
    pub(crate) idle: usize,
    /// Workers forked and not yet waiting for connections.
    pub(crate) starting: usize,
    /// Workers that count towards the pool's size (not on their way out).
    pub(crate) active: usize,
}

/// What a round's decision may look at beyond the counts, each only when the decision
/// needs it: each is a system call (a `poll` of the listeners, a read of their queues) or
/// a read of every slot.
pub(crate) trait Probe {
    /// Whether a connection waits in some listener's queue (in hybrid mode, also a
    /// request waiting for a worker).
    fn clients_queued(&self) -> bool;
    /// The connections waiting in the listeners' accept queues (in hybrid mode, the
    /// requests waiting for a worker), if they can be read (TCP).
    fn queue_length(&self) -> Option<u32>;
    /// How long each idle worker of the pool (not on its way out) has been idle.
    fn idle_times(&self) -> Vec<Duration>;
}

/// What one round of a dynamic or on-demand pool decided, for the master to carry out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Round {
    /// Idle workers are short: start this many.
    Grow(usize),
    /// Idle workers are short and the pool is at its maximum. `warn`: the connections
    /// waiting, at the first round of the episode that sees some (to say "max workers
    /// reached" once, and count it).
    Full { warn: Option<u32> },
    /// No shortage: retire up to this many surplus idle workers (0: none).
    Retire(usize),
}

/// The rounds of a dynamic or on-demand pool: when the next one is due, how fast the pool
/// grows, when it last retired a worker, whether "max workers reached" was said; and what
/// each round decides ([`Rounds::decide`]), which the master carries out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rounds {
    /// The spawn rate of a shortage (1, 2, 4 ... per round).
    rate: SpawnRate,
    /// When the next round is due; none: at the next look.
    next: Option<Instant>,
    /// When a surplus worker was last retired (a dynamic pool retires one per
    /// [`RETIRE_INTERVAL`]).
    last_retire: Instant,
    /// "max workers reached" was said for the current shortage.
    max_reached: bool,
}

impl Rounds {
    /// The rounds of a pool that starts at `now`.
    pub(crate) fn new(now: Instant) -> Rounds {
        Rounds {
            rate: SpawnRate::default(),
            next: None,
            last_retire: now,
            max_reached: false,
        }
    }

    /// When the next round is due, if it must wait.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.next
    }

    /// Whether no round waits past `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.next.is_none_or(|t| t <= now)
    }

    /// Whether `policy` has a round at `now`: a dynamic or on-demand pool whose round is
    /// due. The round begins: its next one is at the next look unless it says otherwise.
    pub(crate) fn begin(&mut self, policy: &Policy, now: Instant) -> bool {
        if !policy.has_rounds() || !self.due(now) {
            return false;
        }
        self.next = None;
        true
    }

    /// The next round waits until `t` (the crash-loop back-off), or none.
    pub(crate) fn wait_until(&mut self, t: Option<Instant>) {
        self.next = t;
    }

    /// The pool was resized: the next round is at the next look.
    pub(crate) fn resized(&mut self) {
        self.next = None;
    }

    /// A surplus worker was retired at `now`.
    pub(crate) fn retired(&mut self, now: Instant) {
        self.last_retire = now;
    }

    /// What the round at `now` of a pool under `policy` does, with `seen` counted: grow
    /// with a doubling rate while idle workers are short, say once that the maximum is
    /// reached while clients wait, retire surplus idle workers otherwise.
    pub(crate) fn decide(&mut self, policy: &Policy, now: Instant, seen: Seen, probe: &dyn Probe) -> Round {
        let Seen {
            idle,
            starting,
            active,
        } = seen;
        let max = policy.max();
        let short = policy.short(idle, starting, || probe.clients_queued());
        if short && active < max {
            // The rate doubles each round of a shortage (1, 2, 4 … 32), but a round never
            // starts more than the shortage needs: the missing spares plus the connections
            // already waiting in the accept queue (when the queue can be read: TCP). That
            // grows as fast as Apache's doubling without overshooting by the last round.
            let (min_spare, _) = policy.spares();
            let need = match probe.queue_length() {
                Some(queued) => {
                    (min_spare.max(1) - (idle + starting).min(min_spare.max(1))) + queued as usize
                }
                None => usize::MAX,
            };
            let n = self.rate.next().min(max - active).min(need.max(1));
            self.next = Some(now + ROUND);
            return Round::Grow(n);
        }
        if short {
            let warn = match probe.queue_length() {
                Some(queued) if queued > 0 && !self.max_reached => {
                    self.max_reached = true;
                    Some(queued)
                }
                _ => None,
            };
            self.next = Some(now + ROUND);
            return Round::Full { warn };
        }
        self.rate.reset();
        if self.max_reached && (active < max || !probe.clients_queued()) {
            self.max_reached = false;
        }
        Round::Retire(policy.surplus(idle, now.duration_since(self.last_retire), probe))
    }
}

/// The spawn rate of a growing pool: 1, 2, 4 … up to [`MAX_SPAWN_RATE`] workers per round
/// while a shortage lasts, back to 1 when it ends.
#[derive(Debug, Clone, Copy)]
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

/// Draws each worker's share of `--max-jitter`, so that workers started together do not
/// all retire together: a xorshift64, enough to spread restarts, no crate needed.
#[derive(Debug)]
pub(crate) struct Jitter(u64);

impl Jitter {
    /// A generator seeded with `seed` (any value: the state is made non-zero).
    pub(crate) fn new(seed: u64) -> Self {
        Jitter(seed | 1)
    }

    /// `limit` plus a number from 0 to `jitter`; a limit of 0 (none) stays 0.
    pub(crate) fn draw(&mut self, limit: u64, jitter: u64) -> u64 {
        if limit == 0 || jitter == 0 {
            return limit;
        }
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        limit + self.0 % (jitter + 1)
    }
}

/// Crash-loop back-off: the first start failure is replaced at once (a one-off failure
/// should not cost capacity), every further one in a row doubles the delay before the next
/// spawn, so a handler that cannot start never turns the master into a fork storm. The
/// first worker that becomes ready ends it.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    consecutive: u32,
    /// The delay of the last failure, and when it happened.
    last: Option<(Instant, Duration)>,
    announced: bool,
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
    /// Records a worker's start failure (see [`is_start_failure`]).
    pub(crate) fn record(&mut self, now: Instant) -> Verdict {
        self.consecutive += 1;
        if self.consecutive < 2 {
            return Verdict::Replace;
        }
        let shift = (self.consecutive - 2).min(16);
        let delay = FIRST_DELAY.saturating_mul(1 << shift).min(MAX_DELAY);
        self.last = Some((now, delay));
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
        match self.record(now) {
            Verdict::BackOffStarted { delay, .. } | Verdict::BackOff { delay, .. } => delay,
            Verdict::Replace => FIRST_DELAY, // not reached: two failures in a row back off
        }
    }

    /// Forgets past failures: a worker became ready. Returns whether failures were counted.
    pub(crate) fn reset(&mut self) -> bool {
        let was = self.consecutive > 0;
        *self = Backoff::default();
        was
    }

    /// Whether failures are being counted.
    pub(crate) fn active(&self) -> bool {
        self.consecutive > 0
    }

    /// When the next spawn may happen, if it must wait; `serving` says whether some worker
    /// is ready (an empty pool waits [`EMPTY_POOL_DELAY`] at most).
    pub(crate) fn not_before(&self, serving: bool) -> Option<Instant> {
        self.last.map(|(at, delay)| {
            at + if serving {
                delay
            } else {
                delay.min(EMPTY_POOL_DELAY)
            }
        })
    }

    /// Whether a spawn is allowed at `now`.
    pub(crate) fn may_spawn(&self, now: Instant, serving: bool) -> bool {
        self.not_before(serving).is_none_or(|t| now >= t)
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
        assert_eq!(b.record(now), Verdict::Replace);
        assert!(b.may_spawn(now, true));
        assert_eq!(
            b.record(now),
            Verdict::BackOffStarted {
                delay: Duration::from_millis(100),
                in_a_row: 2
            }
        );
        assert!(!b.may_spawn(now, true));
        assert_eq!(
            b.record(now),
            Verdict::BackOff {
                delay: Duration::from_millis(200),
                in_a_row: 3
            }
        );
        for _ in 0..20 {
            b.record(now);
        }
        assert_eq!(b.not_before(true), Some(now + MAX_DELAY));
        assert!(b.reset());
        assert!(b.may_spawn(now, true) && !b.active());
    }

    /// Issue 14: while no worker is ready, the back-off never waits more than a second.
    #[test]
    fn an_empty_pool_is_retried_at_least_every_second() {
        let now = Instant::now();
        let mut b = Backoff::default();
        for _ in 0..20 {
            b.record(now);
        }
        assert_eq!(b.not_before(false), Some(now + EMPTY_POOL_DELAY));
        assert!(b.may_spawn(now + EMPTY_POOL_DELAY, false));
        assert!(!b.may_spawn(now + EMPTY_POOL_DELAY, true));
    }

    /// Issue 14: only a worker that ended on its own before it was ready counts.
    #[test]
    fn only_start_failures_count() {
        use nix::sys::signal::Signal;
        assert!(is_start_failure(false, true));
        assert!(!is_start_failure(true, true), "a ready worker's crash");
        assert!(
            !is_start_failure(false, false),
            "killed from outside while starting"
        );
        assert!(is_crash_signal(Signal::SIGSEGV) && is_crash_signal(Signal::SIGABRT));
        assert!(!is_crash_signal(Signal::SIGKILL) && !is_crash_signal(Signal::SIGTERM));
    }

    #[test]
    fn replacements_are_paced() {
        let t0 = Instant::now();
        let mut p = Pacer::default();
        for _ in 0..PACING_BURST {
            assert!(p.may_spawn(t0));
            p.spawned(t0);
        }
        assert!(!p.may_spawn(t0), "a fifth spawn in the same window waits");
        assert_eq!(p.not_before(), Some(t0 + PACING_WINDOW));
        let t1 = t0 + PACING_WINDOW;
        assert!(p.may_spawn(t1));
        p.spawned(t1);
        assert_eq!(p.not_before(), None);
    }

    #[test]
    fn a_held_back_episode_is_told_once() {
        let mut p = Pacer::default();
        assert!(p.hold_back(), "the first replacement held back is logged");
        assert!(!p.hold_back(), "not the next ones");
        p.caught_up();
        assert!(p.hold_back(), "a new episode is logged again");
    }

    #[test]
    fn the_target_counts_replacements_owed_within_the_policy() {
        assert_eq!(Policy::Static(4).target(1, 3), 4, "a static pool is its size");
        let d = Policy::Dynamic {
            start: 2,
            min_spare: 1,
            max_spare: 4,
            max: 8,
        };
        assert_eq!(d.target(0, 0), 2, "at least the start size");
        assert_eq!(d.target(5, 0), 5, "keeps what it has between rounds");
        assert_eq!(
            d.target(5, 2),
            7,
            "recycled workers are replaced before they stop"
        );
        assert_eq!(d.target(7, 3), 8, "never above the maximum");
        let o = Policy::Ondemand {
            max: 3,
            idle_timeout: Duration::from_secs(10),
        };
        assert_eq!(o.target(0, 0), 0, "no worker until a client comes");
        assert_eq!(o.target(1, 1), 2);
        assert_eq!(o.target(3, 1), 3);
    }

    #[test]
    fn jitter_adds_at_most_its_bound_and_keeps_no_limit() {
        let mut j = Jitter::new(0);
        let drawn: Vec<u64> = (0..1000).map(|_| j.draw(100, 10)).collect();
        assert!(drawn.iter().all(|n| (100..=110).contains(n)), "{drawn:?}");
        assert!(drawn.iter().any(|n| *n != drawn[0]), "the limits are spread");
        assert_eq!(j.draw(0, 10), 0, "0 is no limit, and stays so");
        assert_eq!(j.draw(100, 0), 100, "no jitter");
    }

    /// What a round may look at, as a test sets it, counting what it was asked.
    #[derive(Default)]
    struct Looks {
        queued: bool,
        queue: Option<u32>,
        idle: Vec<Duration>,
        asked: std::cell::Cell<usize>,
    }

    impl Probe for Looks {
        fn clients_queued(&self) -> bool {
            self.asked.set(self.asked.get() + 1);
            self.queued
        }
        fn queue_length(&self) -> Option<u32> {
            self.asked.set(self.asked.get() + 1);
            self.queue
        }
        fn idle_times(&self) -> Vec<Duration> {
            self.asked.set(self.asked.get() + 1);
            self.idle.clone()
        }
    }

    fn seen(idle: usize, starting: usize, active: usize) -> Seen {
        Seen {
            idle,
            starting,
            active,
        }
    }

    fn dynamic() -> Policy {
        Policy::Dynamic {
            start: 2,
            min_spare: 2,
            max_spare: 4,
            max: 10,
        }
    }

    #[test]
    fn issue_43_a_static_pool_has_no_rounds_and_never_watches_the_listeners() {
        let now = Instant::now();
        let p = Policy::Static(4);
        let mut r = Rounds::new(now);
        assert!(!p.has_rounds());
        assert!(!r.begin(&p, now));
        assert!(!p.watches_listeners(|| unreachable!("a static pool counts nothing")));
        assert!(dynamic().has_rounds() && r.begin(&dynamic(), now));
    }

    #[test]
    fn issue_43_a_short_dynamic_pool_grows_by_a_doubling_rate_within_its_need_and_max() {
        let t0 = Instant::now();
        let p = dynamic();
        let mut r = Rounds::new(t0);
        let queue = Looks {
            queue: Some(40),
            ..Looks::default()
        };
        // No idle worker: the rate doubles, each round bounded by the need (2 spares + 40).
        let grown: Vec<Round> = (0..4).map(|_| r.decide(&p, t0, seen(0, 0, 2), &queue)).collect();
        assert_eq!(grown, [1, 2, 4, 8].map(Round::Grow));
        assert_eq!(r.next(), Some(t0 + ROUND), "the next round waits");
        assert!(!r.begin(&p, t0) && r.begin(&p, t0 + ROUND));
        // Never above the maximum (10 - 7 = 3), nor the need (2 - 1 spares + 0 queued).
        assert_eq!(r.decide(&p, t0, seen(0, 0, 7), &queue), Round::Grow(3));
        let nothing_queued = Looks {
            queue: Some(0),
            ..Looks::default()
        };
        assert_eq!(r.decide(&p, t0, seen(1, 0, 7), &nothing_queued), Round::Grow(1));
        // The shortage over, the rate starts again at one.
        assert_eq!(r.decide(&p, t0, seen(2, 0, 7), &queue), Round::Retire(0));
        assert_eq!(r.decide(&p, t0, seen(0, 1, 7), &queue), Round::Grow(1));
        // Workers starting count as spares: no shortage, and nothing asked of the listeners.
        let looks = Looks::default();
        assert_eq!(r.decide(&p, t0, seen(1, 1, 7), &looks), Round::Retire(0));
        assert_eq!(looks.asked.get(), 0, "no system call for a pool with its spares");
    }

    #[test]
    fn issue_43_max_workers_reached_is_said_once_per_episode_of_waiting_clients() {
        let t0 = Instant::now();
        let p = dynamic();
        let mut r = Rounds::new(t0);
        let waiting = Looks {
            queue: Some(5),
            queued: true,
            ..Looks::default()
        };
        let full = seen(0, 0, 10);
        assert_eq!(r.decide(&p, t0, full, &waiting), Round::Full { warn: Some(5) });
        assert_eq!(r.decide(&p, t0, full, &waiting), Round::Full { warn: None });
        // Clients still queued at the maximum: the episode goes on, though spares are back.
        assert_eq!(r.decide(&p, t0, seen(2, 0, 10), &waiting), Round::Retire(0));
        assert_eq!(r.decide(&p, t0, full, &waiting), Round::Full { warn: None });
        // The queue emptied: a new episode is told again.
        let empty = Looks::default();
        assert_eq!(r.decide(&p, t0, seen(2, 0, 10), &empty), Round::Retire(0));
        assert_eq!(r.decide(&p, t0, full, &waiting), Round::Full { warn: Some(5) });
        // No client waiting (or a queue that cannot be read): nothing to say.
        let mut r = Rounds::new(t0);
        assert_eq!(r.decide(&p, t0, full, &empty), Round::Full { warn: None });
    }

    #[test]
    fn issue_43_a_dynamic_pool_retires_one_surplus_worker_a_second() {
        let t0 = Instant::now();
        let p = dynamic();
        let mut r = Rounds::new(t0);
        let looks = Looks::default();
        assert_eq!(
            r.decide(&p, t0, seen(6, 0, 8), &looks),
            Round::Retire(0),
            "not within a second of the start"
        );
        let t1 = t0 + RETIRE_INTERVAL;
        assert_eq!(r.decide(&p, t1, seen(6, 0, 8), &looks), Round::Retire(1));
        assert_eq!(
            r.decide(&p, t1, seen(4, 0, 8), &looks),
            Round::Retire(0),
            "max_spare idle is no surplus"
        );
        r.retired(t1);
        assert_eq!(r.decide(&p, t1, seen(6, 0, 8), &looks), Round::Retire(0));
        assert_eq!(
            r.decide(&p, t1 + RETIRE_INTERVAL, seen(6, 0, 8), &looks),
            Round::Retire(1)
        );
        assert_eq!(looks.asked.get(), 0, "a dynamic pool reads no slot to retire");
    }

    #[test]
    fn issue_43_an_ondemand_pool_starts_for_a_waiting_client_and_retires_idle_workers() {
        let t0 = Instant::now();
        let p = Policy::Ondemand {
            max: 3,
            idle_timeout: Duration::from_secs(10),
        };
        // The master watches the listeners while no worker is idle or starting.
        assert!(p.watches_listeners(|| seen(0, 0, 0)));
        assert!(
            !p.watches_listeners(|| seen(0, 1, 1)),
            "a starting worker takes the client"
        );
        assert!(!p.watches_listeners(|| seen(1, 0, 1)));
        assert!(!p.watches_listeners(|| seen(0, 0, 3)), "no room to grow");
        let mut r = Rounds::new(t0);
        let idle = Looks {
            idle: vec![
                Duration::from_secs(3),
                Duration::from_secs(10),
                Duration::from_secs(60),
            ],
            ..Looks::default()
        };
        assert_eq!(
            r.decide(&p, t0, seen(0, 0, 0), &idle),
            Round::Retire(2),
            "no client: none started"
        );
        let waiting = Looks {
            queued: true,
            queue: None,
            ..Looks::default()
        };
        assert_eq!(r.decide(&p, t0, seen(0, 0, 0), &waiting), Round::Grow(1));
        assert_eq!(r.decide(&p, t0, seen(0, 0, 1), &waiting), Round::Grow(2));
        assert_eq!(
            r.decide(&p, t0, seen(0, 0, 2), &waiting),
            Round::Grow(1),
            "the room left"
        );
        // An idle worker: no shortage, and the listeners are not polled for it.
        let looks = Looks::default();
        assert_eq!(r.decide(&p, t0, seen(1, 0, 3), &looks), Round::Retire(0));
        assert_eq!(looks.asked.get(), 1, "only the idle times are read");
    }
}

//! What the server did lately (issue 41): the master's samples of its counters, from
//! which `status` gives the rates now (requests, errors and bytes per second over the last
//! 10 s and the last minute) and the status page draws the last 15 minutes.
//!
//! The master is single-threaded: it records a sample once a second in its loop (a
//! deadline of its `poll`, [`SAMPLE_EVERY`]), from the same snapshot `status` renders. Two
//! rings, both bounded:
//!
//! - the counters of the last [`COUNT_SAMPLES`] seconds (requests, errors, bytes, the
//!   duration histogram: totals over live and retired workers), for the rate windows;
//! - one [`Point`] per [`POINT_EVERY`] (5 s) for the charts, [`POINTS`] of them (15
//!   minutes): requests and errors per second over its interval, the latency quantiles of
//!   the requests answered in it (from the duration histogram's buckets), the connections
//!   open and the workers by state at its end.
//!
//! About 30 KiB in all, whatever the traffic. The history is the master's memory: a new
//! master (a binary upgrade) starts with none, and so does a restart.
//!
//! The totals only grow: a worker that exits leaves its counters to the master's retired
//! totals (`master/reap.rs`, at the reap, before its slot is given to a replacement), so a
//! worker's restart does not take them back. Should a snapshot ever show less than the
//! last sample (a slot read while it changes hands), the sample keeps the last value
//! ([`Counts::at_least`]): a rate is never negative, and what came back is not counted
//! twice.

use std::collections::VecDeque;
use std::time::Duration;

use crate::scoreboard::{DURATION_BUCKETS_US, State};

/// How often the master samples its counters.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The rate windows: the last 10 s ("now") and the last minute.
pub(crate) const WINDOWS: [Duration; 2] = [Duration::from_secs(10), Duration::from_secs(60)];

/// Counter samples kept: one more than the longest window in seconds, so that a sample
/// at least that old is at hand.
const COUNT_SAMPLES: usize = 62;

/// A chart point every this many samples (5 s).
pub(crate) const POINT_EVERY: u32 = 5;

/// Chart points kept: 15 minutes at 5 s.
pub(crate) const POINTS: usize = 180;

/// The time the charts span.
pub(crate) const SPAN: Duration = Duration::from_secs(POINTS as u64 * POINT_EVERY as u64);

/// The worker states the charts count, in order (a dead slot is no worker).
pub(crate) const STATES: [State; 7] = [
    State::Idle,
    State::Reading,
    State::Handling,
    State::Writing,
    State::Closing,
    State::Starting,
    State::Finishing,
];

/// The latency quantiles the charts draw.
pub(crate) const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// The counters a sample keeps: totals over live and retired workers (`Totals::counts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) requests: u64,
    pub(crate) errors: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) durations: [u64; DURATION_BUCKETS_US.len() + 1],
}

impl Counts {
    /// Each counter at least as high as in `floor` (the last sample): counters only grow.
    fn at_least(mut self, floor: &Counts) -> Counts {
        self.requests = self.requests.max(floor.requests);
        self.errors = self.errors.max(floor.errors);
        self.bytes_in = self.bytes_in.max(floor.bytes_in);
        self.bytes_out = self.bytes_out.max(floor.bytes_out);
        for (n, f) in self.durations.iter_mut().zip(floor.durations) {
            *n = (*n).max(f);
        }
        self
    }
}

/// What a sample reads of the moment: the connections open and the workers by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Gauges {
    /// Connections open: those of the event workers, one per busy blocking worker, those
    /// the hybrid fronts hold (`Status::gauges`).
    pub(crate) connections: u64,
    /// Live workers (not fronts) by state, in the order of [`STATES`].
    pub(crate) workers: [u32; STATES.len()],
}

/// The rates over one window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Rate {
    /// The window asked for (10 s, 60 s).
    pub(crate) window: Duration,
    /// The time the rates are measured over: the window, or less while the master is
    /// younger than it (zero before its first sample).
    pub(crate) over: Duration,
    pub(crate) requests: f64,
    pub(crate) errors: f64,
    pub(crate) bytes_in: f64,
    pub(crate) bytes_out: f64,
}

/// One chart point: an interval of [`POINT_EVERY`] samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Point {
    /// Its end, since the master started.
    pub(crate) at: Duration,
    pub(crate) requests_per_second: f64,
    pub(crate) errors_per_second: f64,
    /// The quantiles of [`QUANTILES`] of the requests answered in the interval, in
    /// seconds; none without requests.
    pub(crate) latency: Option<[f64; QUANTILES.len()]>,
    pub(crate) gauges: Gauges,
}

/// The master's history of its counters: the two bounded rings.
#[derive(Debug, Clone, Default)]
pub(crate) struct History {
    /// (time since the master started, counters), oldest first, at most
    /// [`COUNT_SAMPLES`].
    counts: VecDeque<(Duration, Counts)>,
    /// Chart points, oldest first, at most [`POINTS`].
    points: VecDeque<Point>,
    /// The sample the next point starts from, and how many samples since.
    point_start: Option<(Duration, Counts)>,
    since_point: u32,
}

impl History {
    /// Records the sample taken `at` (since the master started): `counts` (kept at least
    /// as high as the last sample's) and `gauges`; every [`POINT_EVERY`] samples, a chart
    /// point.
    pub(crate) fn record(&mut self, at: Duration, counts: Counts, gauges: Gauges) {
        let counts = match self.counts.back() {
            Some((_, last)) => counts.at_least(last),
            None => counts,
        };
        if self.counts.len() == COUNT_SAMPLES {
            self.counts.pop_front();
        }
        self.counts.push_back((at, counts));
        let Some((start, from)) = self.point_start else {
            self.point_start = Some((at, counts));
            return;
        };
        self.since_point += 1;
        if self.since_point < POINT_EVERY {
            return;
        }
        let secs = at.saturating_sub(start).as_secs_f64();
        let per_second = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let mut durations = counts.durations;
        for (d, f) in durations.iter_mut().zip(from.durations) {
            *d -= f;
        }
        if self.points.len() == POINTS {
            self.points.pop_front();
        }
        self.points.push_back(Point {
            at,
            requests_per_second: per_second(counts.requests - from.requests),
            errors_per_second: per_second(counts.errors - from.errors),
            latency: quantiles(&durations),
            gauges,
        });
        self.point_start = Some((at, counts));
        self.since_point = 0;
    }

    /// The rates over each of [`WINDOWS`] up to `at`, when the counters are `now`: the
    /// growth since the newest sample at least the window old (the oldest one while the
    /// history is shorter), over the time between.
    pub(crate) fn rates(&self, at: Duration, now: Counts) -> [Rate; WINDOWS.len()] {
        WINDOWS.map(|window| {
            let base = self
                .counts
                .iter()
                .rev()
                .find(|(t, _)| at.saturating_sub(*t) >= window)
                .or(self.counts.front());
            let Some((t, from)) = base else {
                return Rate {
                    window,
                    ..Rate::default()
                };
            };
            let now = now.at_least(self.counts.back().map_or(from, |(_, c)| c));
            let over = at.saturating_sub(*t);
            let secs = over.as_secs_f64();
            let per_second = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
            Rate {
                window,
                over,
                requests: per_second(now.requests - from.requests),
                errors: per_second(now.errors - from.errors),
                bytes_in: per_second(now.bytes_in - from.bytes_in),
                bytes_out: per_second(now.bytes_out - from.bytes_out),
            }
        })
    }

    /// The chart points, oldest first.
    pub(crate) fn points(&self) -> impl ExactSizeIterator<Item = &Point> {
        self.points.iter()
    }
}

/// The quantiles of [`QUANTILES`], in seconds, of a duration histogram (per bucket, not
/// cumulative, the last bucket unbounded), as Prometheus's `histogram_quantile` estimates
/// them: linearly within the bucket the quantile falls in, from the bucket's lower bound
/// (0 for the first). A quantile in the unbounded bucket is the highest bound (5 s): the
/// charts cannot tell more. None for an empty histogram.
pub(crate) fn quantiles(durations: &[u64; DURATION_BUCKETS_US.len() + 1]) -> Option<[f64; QUANTILES.len()]> {
    let total: u64 = durations.iter().sum();
    if total == 0 {
        return None;
    }
    Some(QUANTILES.map(|q| {
        let rank = q * total as f64;
        let mut below = 0u64;
        for (i, &n) in durations.iter().enumerate() {
            if n > 0 && (below + n) as f64 >= rank {
                let Some(&upper) = DURATION_BUCKETS_US.get(i) else {
                    break;
                };
                let lower = if i == 0 { 0 } else { DURATION_BUCKETS_US[i - 1] };
                let within = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
                return (lower as f64 + (upper - lower) as f64 * within) / 1e6;
            }
            below += n;
        }
        DURATION_BUCKETS_US[DURATION_BUCKETS_US.len() - 1] as f64 / 1e6
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn counts(requests: u64, errors: u64, bytes_in: u64, bytes_out: u64) -> Counts {
        Counts {
            requests,
            errors,
            bytes_in,
            bytes_out,
            ..Counts::default()
        }
    }

    /// A history of one sample a second for `n` seconds, the counters growing by
    /// `per_second` (requests), a tenth of it (errors) and 100 and 1000 times it (bytes).
    fn steady(n: u64, per_second: u64) -> History {
        let mut h = History::default();
        for s in 0..=n {
            let r = s * per_second;
            h.record(secs(s), counts(r, r / 10, r * 100, r * 1000), Gauges::default());
        }
        h
    }

    #[test]
    fn issue_41_rates_are_counter_deltas_over_10_s_and_a_minute() {
        let h = steady(120, 50);
        let now = counts(120 * 50, 600, 600_000, 6_000_000);
        let [ten, minute] = h.rates(secs(120), now);
        assert_eq!((ten.window, ten.over), (secs(10), secs(10)));
        assert_eq!((minute.window, minute.over), (secs(60), secs(60)));
        for r in [ten, minute] {
            assert_eq!(r.requests, 50.0, "{r:?}");
            assert_eq!(r.errors, 5.0, "{r:?}");
            assert_eq!(r.bytes_in, 5000.0, "{r:?}");
            assert_eq!(r.bytes_out, 50_000.0, "{r:?}");
        }
        // A burst in the last 10 s shows in the short window, diluted in the minute's.
        let mut h = steady(120, 0);
        for s in 121..=130 {
            h.record(secs(s), counts((s - 120) * 100, 0, 0, 0), Gauges::default());
        }
        let [ten, minute] = h.rates(secs(130), counts(1000, 0, 0, 0));
        assert_eq!(ten.requests, 100.0);
        assert!((minute.requests - 1000.0 / 60.0).abs() < 1e-9, "{minute:?}");
        // Then nothing for 10 s: the short window falls to zero, the minute remembers.
        for s in 131..=140 {
            h.record(secs(s), counts(1000, 0, 0, 0), Gauges::default());
        }
        let [ten, minute] = h.rates(secs(140), counts(1000, 0, 0, 0));
        assert_eq!(ten.requests, 0.0);
        assert!(minute.requests > 0.0);
    }

    /// Between samples the window ends now: the snapshot's counters, over the time since
    /// the newest sample at least the window old (10 to 11 s at one sample a second).
    #[test]
    fn issue_41_a_window_ends_at_the_snapshot_not_at_the_last_sample() {
        let h = steady(30, 10);
        let at = Duration::from_millis(30_500);
        let [ten, _] = h.rates(at, counts(305, 30, 30_500, 305_000));
        assert_eq!(ten.over, Duration::from_millis(10_500));
        assert!((ten.requests - 105.0 / 10.5).abs() < 1e-9, "{ten:?}");
    }

    /// A master younger than a window measures over what it has, and says so; before its
    /// first sample, over nothing (zero rates, not a division by zero).
    #[test]
    fn issue_41_a_young_master_measures_over_its_life() {
        let empty = History::default();
        let [ten, minute] = empty.rates(secs(0), counts(5, 0, 0, 0));
        assert_eq!((ten.over, ten.requests), (Duration::ZERO, 0.0));
        assert_eq!((minute.window, minute.requests), (secs(60), 0.0));
        let h = steady(4, 10);
        let [ten, minute] = h.rates(secs(4), counts(40, 4, 4000, 40_000));
        assert_eq!((ten.over, minute.over), (secs(4), secs(4)));
        assert_eq!(ten.requests, 10.0);
    }

    /// Issue 41: a worker's restart does not take its counts back (the master keeps them
    /// in its retired totals); should a snapshot still show less than the last sample, the
    /// rates never go negative, and the counts that come back are not counted twice.
    #[test]
    fn issue_41_a_counter_that_drops_gives_no_negative_rate() {
        let mut h = History::default();
        for s in 0..=20 {
            h.record(secs(s), counts(s * 10, s, s * 100, s * 100), Gauges::default());
        }
        // A snapshot without a worker's 150 requests (its slot read while it changed
        // hands): the rates stay at zero or above.
        for s in 21..=25 {
            h.record(secs(s), counts(50, 0, 0, 0), Gauges::default());
            let [ten, minute] = h.rates(secs(s), counts(50, 0, 0, 0));
            for r in [ten, minute] {
                assert!(r.requests >= 0.0 && r.errors >= 0.0, "{r:?}");
                assert!(r.bytes_in >= 0.0 && r.bytes_out >= 0.0, "{r:?}");
            }
        }
        // The counts come back (the retired totals have them): no spike, the flat rate.
        for s in 26..=40 {
            h.record(
                secs(s),
                counts(200 + (s - 25) * 10, 20, 2000, 2000),
                Gauges::default(),
            );
        }
        let [ten, _] = h.rates(secs(40), counts(350, 20, 2000, 2000));
        assert_eq!(ten.requests, 10.0, "{ten:?}");
        for p in h.points() {
            assert!(
                p.requests_per_second >= 0.0 && p.requests_per_second <= 10.0,
                "no negative rate and no spike: {p:?}"
            );
        }
    }

    /// A point every 5 samples, 180 at most (15 minutes), the oldest dropped first; each
    /// with its interval's rates, quantiles and the gauges at its end.
    #[test]
    fn issue_41_points_cover_15_minutes_at_5_s() {
        let mut h = History::default();
        let g = Gauges {
            connections: 3,
            workers: [1, 0, 2, 0, 0, 0, 0],
        };
        for s in 0..=2000u64 {
            let mut c = counts(s * 4, 0, 0, 0);
            c.durations[3] = s * 4; // each answered in (2.5 ms, 5 ms]
            h.record(secs(s), c, g);
        }
        assert_eq!(h.points().len(), POINTS);
        assert_eq!(SPAN, Duration::from_secs(900));
        let pts: Vec<_> = h.points().collect();
        assert_eq!(pts.last().unwrap().at, secs(2000));
        assert_eq!(pts[0].at, secs(2000 - 5 * 179));
        for p in &pts {
            assert_eq!(p.requests_per_second, 4.0);
            assert_eq!(p.gauges, g);
            let [p50, p90, p99] = p.latency.unwrap();
            assert!(0.0025 < p50 && p50 < p90 && p90 < p99 && p99 <= 0.005, "{p:?}");
        }
        // Memory: bounded whatever the traffic and the time.
        assert!(h.counts.len() <= COUNT_SAMPLES);
    }

    #[test]
    fn issue_41_quantiles_from_the_duration_buckets() {
        let mut d = [0u64; DURATION_BUCKETS_US.len() + 1];
        assert_eq!(quantiles(&d), None, "no request, no latency");
        // 100 requests: 90 in (0, 0.5 ms], 9 in (0.5 ms, 1 ms], 1 beyond 5 s.
        d[0] = 90;
        d[1] = 9;
        d[12] = 1;
        let [p50, p90, p99] = quantiles(&d).unwrap();
        assert!((p50 - 0.5 * 50.0 / 90.0 / 1000.0).abs() < 1e-12, "{p50}");
        assert!((p90 - 0.0005).abs() < 1e-12, "{p90}");
        assert!((p99 - 0.001).abs() < 1e-12, "{p99}");
        // The unbounded bucket's quantile is the highest bound.
        let mut d = [0u64; DURATION_BUCKETS_US.len() + 1];
        d[12] = 5;
        assert_eq!(quantiles(&d), Some([5.0, 5.0, 5.0]));
    }
}

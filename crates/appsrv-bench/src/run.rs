//! Starts the connection threads, shows progress, ends a `-d` run, merges the counters.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};

use crate::stats::Stats;
use crate::worker::{Limit, Plan, Shared, run_connection};

/// Each connection thread's stack: the loop needs little (its buffers are on the heap).
const STACK_SIZE: usize = 256 * 1024;

/// The outcome of a run.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) stats: Stats,
    /// From the end of the warm-up to the last response (at most the `-d` duration).
    pub(crate) duration: Duration,
}

/// Runs `plan`; `progress` prints a line on stderr every second of a run longer than 2 s.
pub(crate) fn run(plan: &Plan, progress: bool) -> anyhow::Result<Outcome> {
    // A -n run uses no more connections than requests, and spreads the requests evenly.
    let active = match plan.limit {
        Limit::Requests(n) => (plan.connections as u64).min(n) as usize,
        Limit::Duration(_) => plan.connections,
    };
    let quota = |i: usize| match plan.limit {
        Limit::Requests(n) => n / active as u64 + u64::from((i as u64) < n % active as u64),
        Limit::Duration(_) => 0,
    };
    let shared = Shared::new(active);
    let (tx, rx) = mpsc::channel::<Stats>();
    thread::scope(|scope| {
        let mut handles = Vec::with_capacity(active);
        for i in 0..active {
            let tx = tx.clone();
            let shared = &shared;
            let quota = quota(i);
            let spawned = thread::Builder::new()
                .name(format!("conn-{i}"))
                .stack_size(STACK_SIZE)
                .spawn_scoped(scope, move || {
                    let stats = run_connection(plan, shared, i, active, quota);
                    let _ = tx.send(stats);
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    shared.open_gate(None);
                    return Err(anyhow!("cannot start thread {} of {active}: {e}", i + 1));
                }
            }
        }
        drop(tx);
        let start = Instant::now();
        shared.open_gate(Some(start));
        let stats = monitor(plan, &shared, &rx, start, active, progress);
        for h in handles {
            if h.join().is_err() {
                bail!("a connection thread panicked");
            }
        }
        let measure_start = start + plan.warmup;
        let mut end = stats.end.unwrap_or(measure_start);
        if let Limit::Duration(d) = plan.limit {
            end = end.min(measure_start + d);
        }
        Ok(Outcome {
            duration: end.saturating_duration_since(measure_start),
            stats,
        })
    })
}

/// Waits for the threads' counters; meanwhile prints progress and ends a `-d` run.
fn monitor(
    plan: &Plan,
    shared: &Shared,
    rx: &mpsc::Receiver<Stats>,
    start: Instant,
    active: usize,
    progress: bool,
) -> Stats {
    const TICK: Duration = Duration::from_secs(1);
    let measure_start = start + plan.warmup;
    let deadline = match plan.limit {
        Limit::Duration(d) => Some(measure_start + d),
        Limit::Requests(_) => None,
    };
    // A -d run is known to be long from the start; a -n run once it has lasted 2 s.
    let known_long = deadline.is_some_and(|d| d - start > 2 * TICK);
    let mut total = Stats::new();
    let mut received = 0;
    let mut cut = false;
    let mut next_tick = start + TICK;
    let (mut last_tick, mut last_done) = (start, 0u64);
    while received < active {
        let mut wake = next_tick;
        if let Some(d) = deadline.filter(|_| !cut) {
            wake = wake.min(d);
        }
        match rx.recv_timeout(wake.saturating_duration_since(Instant::now())) {
            Ok(stats) => {
                total.merge(&stats);
                received += 1;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break, // a thread panicked
        }
        let now = Instant::now();
        if !cut && deadline.is_some_and(|d| now >= d) {
            shared.cut();
            cut = true;
        }
        if now >= next_tick {
            let elapsed = now - start;
            if progress && (known_long || elapsed >= 2 * TICK) {
                let done: u64 = shared.live.iter().map(|l| l.done.load(Ordering::Relaxed)).sum();
                let rate = (done - last_done) as f64 / (now - last_tick).as_secs_f64();
                let line = if now < measure_start {
                    format!(
                        "appsrv-bench: {:.0}s: warm-up, {rate:.0} req/s",
                        elapsed.as_secs_f64()
                    )
                } else {
                    let counted: u64 = shared
                        .live
                        .iter()
                        .map(|l| l.counted.load(Ordering::Relaxed))
                        .sum();
                    let errors: u64 = shared.live.iter().map(|l| l.errors.load(Ordering::Relaxed)).sum();
                    format!(
                        "appsrv-bench: {:.0}s: {counted} requests, {rate:.0} req/s, {errors} errors",
                        elapsed.as_secs_f64()
                    )
                };
                let _ = writeln!(std::io::stderr(), "{line}");
                (last_tick, last_done) = (now, done);
            }
            while next_tick <= now {
                next_tick += TICK;
            }
        }
    }
    total
}

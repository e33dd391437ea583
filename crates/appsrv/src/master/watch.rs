//! The master's periodic look at its workers: a request past `--request-timeout` (the
//! worker aborted, then killed), recycling by age and memory, a worker asked to leave that
//! outstays its grace period; and the slow-client watch (`holds.rs`).

use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use super::{ABORT_GRACE, Leave, Limits, MEMORY_INTERVAL, Master, Worker, fmt_duration};
use crate::scoreboard::{self, State};
use crate::sys;

impl<'a> Master<'a> {
    /// Request timeouts, recycling by age and memory, and the kill that follows an abort.
    ///
    /// Each worker is looked at once (`WorkerCheck::look_at`, which also kills one that
    /// outstayed its grace period), then the verdicts are acted on: the timed-out requests'
    /// workers are aborted, the ones over a limit recycled.
    pub(super) fn check_workers(&mut self) {
        let now = Instant::now();
        let limits = self.settings.limits.clone();
        let check_memory =
            limits.max_memory_kib > 0 && now.duration_since(self.last_memory_check) >= MEMORY_INTERVAL;
        if check_memory {
            self.last_memory_check = now;
        }
        let check = WorkerCheck {
            now,
            board: self.settings.board,
            limits: &limits,
            grace: self.settings.grace_period,
            check_memory,
        };
        let mut recycle = Vec::new();
        let mut expired = Vec::new();
        for (pid, w) in &mut self.workers {
            match check.look_at(*pid, w) {
                Look::Fine => {}
                Look::Expired(elapsed, v) => expired.push((*pid, w.id, elapsed, *v)),
                Look::Recycle(why) => recycle.push((*pid, why)),
            }
        }
        self.abort_expired(expired, limits.request_timeout.unwrap_or_default(), now);
        for (pid, why) in recycle {
            if let Some(w) = self.workers.get_mut(&pid) {
                tracing::info!(
                    "worker {} (pid {pid}) reached its {why} limit; replacing it",
                    w.id
                );
                w.leaving = Some(Leave::Recycle(why));
                self.owed += 1;
            }
        }
        self.release_one_retiring();
    }

    /// The workers whose request outlived `--request-timeout`: each is aborted (a core
    /// dump shows where the handler was, when core dumps are enabled) or killed, with one
    /// error line naming the request, and given `ABORT_GRACE` before the kill that follows.
    pub(super) fn abort_expired(
        &mut self,
        expired: Vec<(Pid, u32, Duration, scoreboard::SlotView)>,
        limit: Duration,
        now: Instant,
    ) {
        let abort = sys::core_dumps_enabled();
        for (pid, id, elapsed, v) in expired {
            tracing::error!("{}", timeout_message(id, pid, limit, elapsed, &v, abort));
            let _ = signal::kill(pid, if abort { Signal::SIGABRT } else { Signal::SIGKILL });
            if let Some(w) = self.workers.get_mut(&pid) {
                w.timed_out = Some(now);
            }
        }
    }

    /// Once a second: whether slow or idle clients from a few addresses hold the pool; one
    /// warning per episode (see `holds.rs`).
    pub(super) fn check_holds(&mut self) {
        let now = Instant::now();
        if !self.holds.due(now) {
            return;
        }
        let board = self.settings.board;
        let views: Vec<(u32, scoreboard::SlotView)> = self
            .workers
            .values()
            .filter(|w| w.ready && w.active())
            .filter_map(|w| board.read(w.id).map(|v| (w.id, v)))
            .collect();
        match self.holds.observe(now, views.iter().map(|(id, v)| (*id, v))) {
            Some(Some(held)) => tracing::warn!(
                "{held}; they keep those workers from other clients until their timeouts \
                 (--header-timeout, --keepalive-timeout, --read-timeout): consider \
                 --max-conns-per-ip with a value well below the {} workers",
                held.workers
            ),
            Some(None) => tracing::info!("slow or idle clients no longer hold the pool"),
            None => {}
        }
    }
}

/// What `check_workers` found about one worker.
#[derive(Debug)]
enum Look {
    /// Nothing to do (or it was dealt with already: a kill).
    Fine,
    /// Its request has run this long, over `--request-timeout`; the slot as read (boxed:
    /// a slot's view is large, and this is the rare verdict).
    Expired(Duration, Box<scoreboard::SlotView>),
    /// It reached this limit (`age`, `memory`): to be replaced.
    Recycle(&'static str),
}

/// What `check_workers` looks at each worker with, read once per round.
struct WorkerCheck<'a> {
    now: Instant,
    board: &'static scoreboard::Board,
    limits: &'a Limits,
    grace: Duration,
    /// The memory is read this round (once per `MEMORY_INTERVAL`: reading it costs).
    check_memory: bool,
}

impl WorkerCheck<'_> {
    /// One worker's verdict, in order of urgency. A worker asked to leave a grace period
    /// ago, or one replaced for its memory that grew past twice the limit meanwhile, is
    /// killed here, at once; one killed after an abort waits `ABORT_GRACE`, then is killed.
    fn look_at(&self, pid: Pid, w: &mut Worker) -> Look {
        let (now, limits) = (self.now, self.limits);
        if w.stop_at.is_some_and(|t| now.duration_since(t) >= self.grace) {
            // Asked to leave a grace period ago and still there (a connection that
            // never ends): as on a stop, the grace period bounds it.
            tracing::warn!(
                "worker {} (pid {pid}) still serving {:?} after being asked to leave; killing it, \
                 cutting {}",
                w.id,
                self.grace,
                serving(self.board, w.id)
            );
            let _ = signal::kill(pid, Signal::SIGKILL);
            w.stop_at = None;
            return Look::Fine;
        }
        // --max-worker-memory is a hard limit: a worker replaced for its memory finishes
        // its connections within the grace period only while it stays below twice the
        // limit, checked on every tick (a connection whose protocol cannot announce a
        // close could otherwise grow it by gigabytes meanwhile: issue 14).
        if matches!(w.leaving, Some(Leave::Recycle("memory"))) && !w.memory_killed {
            if let Some(kib) = pss_kib(pid).filter(|kib| *kib > 2 * limits.max_memory_kib) {
                tracing::warn!(
                    "worker {} (pid {pid}) uses {} MiB, over twice --max-worker-memory {} MiB, \
                     while it finishes: killing it, cutting {}",
                    w.id,
                    kib / 1024,
                    limits.max_memory_kib / 1024,
                    serving(self.board, w.id)
                );
                let _ = signal::kill(pid, Signal::SIGKILL);
                w.stop_at = None;
                w.memory_killed = true;
                return Look::Fine;
            }
        }
        if let Some(since) = w.timed_out {
            if now.duration_since(since) >= ABORT_GRACE {
                let _ = signal::kill(pid, Signal::SIGKILL);
            }
            return Look::Fine;
        }
        if let (Some(limit), Some(v)) = (limits.request_timeout, self.board.read(w.id)) {
            if let Some(elapsed) = over_request_timeout(&v, limit) {
                return Look::Expired(elapsed, Box::new(v));
            }
        }
        // Fronts run no handler code: not recycled by age or memory.
        if w.leaving.is_some() || !w.ready || w.front {
            return Look::Fine;
        }
        if limits
            .max_age
            .is_some_and(|age| now.duration_since(w.spawned) >= age)
        {
            Look::Recycle("age")
        } else if self.check_memory && pss_kib(pid).is_some_and(|kib| kib > limits.max_memory_kib) {
            Look::Recycle("memory")
        } else {
            Look::Fine
        }
    }
}

/// What a kill of worker `id` cuts, for its log line: an event loop's open connections
/// (its slot names no single peer: the line said "cutting no connection" while it cut
/// thousands, issue 31), or a blocking worker's one.
fn serving(board: &scoreboard::Board, id: u32) -> String {
    match board.read(id) {
        Some(v) => match (v.event.map(|ev| ev.counts.open), v.peer) {
            (Some(0), _) | (None, None) => "no connection".to_owned(),
            (Some(1) | None, Some(p)) => format!("the connection from {p}"),
            (Some(n), Some(p)) => format!("its {n} open connections (the last served from {p})"),
            (Some(n), None) => format!("its {n} open connections"),
        },
        None => "no connection".to_owned(),
    }
}

/// PSS of a process in kB, from `/proc/PID/smaps_rollup`.
fn pss_kib(pid: Pid) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How long the current request (a blocking worker) or loop turn (an event worker: see
/// `Slot::turn_begin`; none while it waits in `epoll_wait`) of the worker whose slot is `v`
/// has run, if over `limit`. An event worker's clock is its turn's whatever state its
/// slot shows between handler calls; a blocking worker's only while it serves a client.
fn over_request_timeout(v: &scoreboard::SlotView, limit: Duration) -> Option<Duration> {
    let elapsed = v.current.filter(|t| *t > limit)?;
    (v.state != State::Starting && (v.event.is_some() || v.state != State::Idle)).then_some(elapsed)
}

/// The request timeout's log line for worker `id` (`pid`), whose slot `v` shows its
/// current request (a blocking worker) or its loop's current turn (an event worker) running
/// for `elapsed`, over `limit`.
fn timeout_message(
    id: u32,
    pid: Pid,
    limit: Duration,
    elapsed: Duration,
    v: &scoreboard::SlotView,
    abort: bool,
) -> String {
    let peer = v
        .peer
        .as_ref()
        .map(|p| p.to_string())
        .unwrap_or_else(|| "no client".into());
    let head = String::from_utf8_lossy(&v.head);
    let how = if abort { " (SIGABRT, for a core dump)" } else { "" };
    match &v.event {
        // The loop is stuck (a handler call that blocks, a loop in user code): every
        // connection of the worker goes with it, which the operator must be told.
        Some(e) => format!(
            "worker {id} (pid {pid}) exceeded the request timeout of {}: its event loop has not \
             turned for {} (the last handler call was for {peer}, request {head:?}); killing it{how} \
             drops {} connection{}",
            fmt_duration(limit),
            fmt_duration(elapsed),
            e.counts.open,
            if e.counts.open == 1 { "" } else { "s" }
        ),
        None => format!(
            "worker {id} (pid {pid}) exceeded the request timeout of {}: serving {peer} for {}, \
             request {head:?}; killing it{how}",
            fmt_duration(limit),
            fmt_duration(elapsed),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scoreboard::Board;

    #[test]
    fn issue_16_a_stuck_event_loop_is_killed_and_the_log_says_how_many_connections_go() {
        use crate::net::listener::Addr;
        use crate::scoreboard::ConnCounts;
        let board = Board::new().unwrap();
        let limit = Duration::from_secs(30);
        board.claim(2, 0);
        board.set_pid(2, 4242);
        let s = board.slot(2).unwrap();
        s.set_event();
        board.set_state(2, State::Idle);
        s.publish_counts(ConnCounts {
            open: 812,
            reading: 3,
            writing: 1,
            idle_keepalive: 807,
        });
        s.handler_call(
            &Addr::Inet("192.0.2.5:6000".parse().unwrap()),
            b"GET /block HTTP/1.1\r\n",
        );
        // Waiting in epoll_wait: never over the limit.
        s.turn_end();
        assert_eq!(over_request_timeout(&board.read(2).unwrap(), limit), None);
        // A turn that began 40 s ago and has not ended, whatever the slot's state.
        s.turn_begin(scoreboard::now_ns() - 40_000_000_000);
        let v = board.read(2).unwrap();
        let elapsed = over_request_timeout(&v, limit).expect("a loop stuck past the limit");
        assert!(elapsed >= Duration::from_secs(40));
        let line = timeout_message(2, Pid::from_raw(4242), limit, Duration::from_secs(40), &v, false);
        assert_eq!(
            line,
            "worker 2 (pid 4242) exceeded the request timeout of 30.0s: its event loop has not turned \
             for 40.0s (the last handler call was for 192.0.2.5:6000, request \"GET /block HTTP/1.1\\r\\n\"); \
             killing it drops 812 connections"
        );
        // A blocking worker's line is as it was, and an idle one is not timed.
        board.claim(3, 0);
        board.set_pid(3, 4343);
        let b = board.slot(3).unwrap();
        b.connection(&Addr::Inet("192.0.2.6:7000".parse().unwrap()));
        board.set_state(3, State::Handling);
        b.request_start(b"GET /slow");
        let mut v = board.read(3).unwrap();
        v.current = Some(Duration::from_secs(31));
        assert_eq!(over_request_timeout(&v, limit), Some(Duration::from_secs(31)));
        assert_eq!(
            timeout_message(3, Pid::from_raw(4343), limit, Duration::from_secs(31), &v, true),
            "worker 3 (pid 4343) exceeded the request timeout of 30.0s: serving 192.0.2.6:7000 for 31.0s, \
             request \"GET /slow\"; killing it (SIGABRT, for a core dump)"
        );
        v.state = State::Idle;
        assert_eq!(over_request_timeout(&v, limit), None);
    }
}

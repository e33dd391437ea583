//! What the master reports about itself and its workers: one snapshot type, rendered as
//! a table (`status`), JSON (`status --json`) and Prometheus/OpenMetrics text (`metrics`),
//! and the readiness `/readyz` reports.

use std::time::Duration;

use std::net::IpAddr;

use crate::control::history::{Counts, Gauges, Point, Rate, STATES, WINDOWS};
use crate::scoreboard::{DURATION_BUCKETS_US, SlotView, State};

/// How long a worker must have been reading without serving anything to count as held.
pub(crate) const HELD_FOR: Duration = Duration::from_secs(10);

/// A snapshot of the master's state, built on request by the master.
#[derive(Debug, Clone)]
pub(crate) struct Status {
    /// The server's name.
    pub(crate) name: String,
    pub(crate) master_pid: u32,
    /// The master's phase: starting, running, reloading, upgrading, draining (its sockets
    /// handed to a new master) or stopping.
    pub(crate) phase: &'static str,
    pub(crate) uptime: Duration,
    /// `--grace-period` and `--drain-delay`: how long a stop may take (what `stop` waits
    /// for, issue 34).
    pub(crate) grace_period: Duration,
    pub(crate) drain_delay: Duration,
    /// The workers' I/O model (`--io`): blocking, event, hybrid or async.
    pub(crate) io: &'static str,
    pub(crate) pool: PoolStatus,
    pub(crate) listeners: Vec<ListenerStatus>,
    /// Live workers: (slot id, slot).
    pub(crate) workers: Vec<(u32, SlotView)>,
    /// The letter of every slot up to the pool's maximum, as in Apache's mod_status
    /// (`_` idle, `R` reading, `H` handling, `W` writing, `C` closing, `S` starting,
    /// `F` finishing, `.` free).
    pub(crate) scoreboard: String,
    /// Counts of workers that are gone (so that totals do not drop when a worker exits).
    pub(crate) retired: Totals,
    /// How many times the pool reached its maximum while clients waited.
    pub(crate) max_workers_reached: u64,
    /// Worker restarts by reason: exit, signal, timeout, recycled, backoff.
    pub(crate) restarts: Vec<(&'static str, u64)>,
    /// Slow or idle clients from a few addresses holding the pool, while they do.
    pub(crate) slow_clients: Option<Held>,
    /// Failed authentication's penalties (all zero with `--penalty-max 0`).
    pub(crate) penalties: PenaltyCounts,
    /// Hybrid mode (`--io hybrid`): the fronts and the requests waiting for a worker.
    pub(crate) hybrid: Option<Hybrid>,
    /// Log lines that could not be written (a full disk, a closed stderr), by process role
    /// (master, worker, front, helper) and log (error, access), since the master started.
    pub(crate) log_dropped: [[u64; 2]; 4],
    /// Requests, errors and bytes per second over the last 10 s and the last minute
    /// (issue 41), from the master's history (`history.rs`).
    pub(crate) rates: [Rate; WINDOWS.len()],
    /// The master's chart points of the last 15 minutes, oldest first (issue 41): empty
    /// for a master younger than 5 s, and after a binary upgrade (a new master keeps none
    /// of the old one's history).
    pub(crate) history: Vec<Point>,
}

/// Whether a worker is serving a client (its peer, clock and request head are current).
pub(crate) fn busy(w: &SlotView) -> bool {
    match w.state {
        State::Reading | State::Handling | State::Writing | State::Closing => true,
        // Retiring with a connection still open, or without one.
        State::Finishing => w.current.is_some(),
        State::Dead | State::Starting | State::Idle => false,
    }
}

impl Status {
    /// What the history samples of the moment (issue 41): the connections open (the
    /// event workers', one per busy blocking worker, those the hybrid fronts hold) and the
    /// live workers (not fronts) by state.
    pub(crate) fn gauges(&self) -> Gauges {
        let mut workers = [0; STATES.len()];
        let mut connections = 0;
        for (_, w) in &self.workers {
            if let Some(i) = STATES.iter().position(|s| *s == w.state) {
                workers[i] += 1;
            }
            connections += match w.event {
                Some(e) => u64::from(e.counts.open),
                None => u64::from(busy(w)),
            };
        }
        if let Some(h) = &self.hybrid {
            connections += h.held().0;
        }
        Gauges { connections, workers }
    }

    /// Log lines dropped by every process, per log: (error log, access log).
    pub(crate) fn log_dropped_totals(&self) -> (u64, u64) {
        self.log_dropped
            .iter()
            .fold((0, 0), |(e, a), row| (e + row[0], a + row[1]))
    }
}

/// The penalty table's counters (`penalty.rs`): kept by the table itself, shared by every
/// worker, so they cover workers that are gone and only grow while the master lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PenaltyCounts {
    /// Failed authentications handlers charged (`Conn::penalize`).
    pub(crate) charged: u64,
    /// Connections refused at admission for a penalized address.
    pub(crate) refused: u64,
    /// Failures the full table could not record (it fails open).
    pub(crate) unrecorded: u64,
    /// Addresses refused now (a gauge).
    pub(crate) addresses: u64,
}

/// Hybrid mode's side of the status.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hybrid {
    /// Live fronts: (slot id, slot); a front's `requests` are its hand-offs.
    pub(crate) fronts: Vec<(u32, SlotView)>,
    /// Complete requests waiting for a worker (in the channel, and held by fronts while
    /// it is full): what the pool sizes itself by.
    pub(crate) requests_waiting: u64,
    /// Connections handed to the workers since the start, by every front (a counter on
    /// the board: it does not drop when a front leaves).
    pub(crate) handed_off: u64,
}

impl Hybrid {
    /// Connections the fronts hold now, and how many of those are idle keep-alive ones.
    pub(crate) fn held(&self) -> (u64, u64) {
        self.fronts
            .iter()
            .filter_map(|(_, f)| f.event)
            .fold((0, 0), |(open, idle), e| {
                (
                    open + u64::from(e.counts.open),
                    idle + u64::from(e.counts.idle_keepalive),
                )
            })
    }
}

/// The pool's policy and sizes (serialized as `status --json`'s `pool`).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct PoolStatus {
    /// static, dynamic or ondemand.
    pub(crate) policy: &'static str,
    /// Workers wanted now (static: the size; dynamic: start/min/max drive it).
    pub(crate) target: usize,
    pub(crate) min_spare: usize,
    pub(crate) max_spare: usize,
    pub(crate) max: usize,
}

/// One listener.
#[derive(Debug, Clone)]
pub(crate) struct ListenerStatus {
    pub(crate) addr: String,
    /// Connections waiting in the accept queue (TCP only, from TCP_INFO).
    pub(crate) queued: Option<u32>,
    /// The queue's capacity (TCP only).
    pub(crate) backlog: Option<u32>,
    /// A datagram listener (`udp://`, `unixgram:`).
    pub(crate) datagram: bool,
}

/// Counters summed over workers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Totals {
    pub(crate) connections: u64,
    pub(crate) requests: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) durations: [u64; DURATION_BUCKETS_US.len() + 1],
    pub(crate) duration_sum: Duration,
    /// Connections closed by the access rules, and refused by the per-address cap.
    pub(crate) denied: u64,
    pub(crate) refused: u64,
    /// Connections whose TLS handshake failed.
    pub(crate) tls_failed: u64,
    /// Requests that ended in an error: the handler failed, the codec refused the input,
    /// or the request timed out (issue 41).
    pub(crate) errors: u64,
    /// Handler calls slower than `--slow-request` (event workers; blocking ones count
    /// none).
    pub(crate) slow_calls: u64,
    /// Datagrams received, answered and dropped (datagram listeners).
    pub(crate) datagrams: crate::scoreboard::DatagramCounts,
}

impl Totals {
    /// The counters the history samples (issue 41).
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            requests: self.requests,
            errors: self.errors,
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            durations: self.durations,
        }
    }

    /// Adds a worker's counters.
    pub(crate) fn add(&mut self, w: &SlotView) {
        self.connections += w.connections;
        self.requests += w.requests;
        self.bytes_in += w.bytes_in;
        self.bytes_out += w.bytes_out;
        for (t, d) in self.durations.iter_mut().zip(w.durations) {
            *t += d;
        }
        self.duration_sum += w.duration_sum;
        self.denied += w.denied;
        self.refused += w.refused;
        self.tls_failed += w.tls_failed;
        self.errors += w.errors;
        self.slow_calls += w.slow_calls;
        self.datagrams.add(&w.datagrams);
    }
}

/// The live event workers' connections (`--io event`), summed: gauges, so workers that
/// are gone do not count (serialized as `status --json`'s `event`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct EventTotals {
    /// Live event workers.
    pub(crate) workers: usize,
    /// Connections open, and by what each waits for.
    pub(crate) open: u64,
    pub(crate) reading: u64,
    /// Connections in a handler call, at most one per worker: an async worker with
    /// requests in flight counts one here, and all of them in `requests_in_flight`.
    pub(crate) handling: u64,
    /// Requests in flight (async workers: any number each, a client-level session
    /// counting one; the event loop: 0 or 1, as `handling`).
    pub(crate) requests_in_flight: u64,
    pub(crate) writing: u64,
    pub(crate) idle_keepalive: u64,
    /// Event workers that stopped accepting (at `--worker-connections`, or out of
    /// descriptors).
    pub(crate) accepts_paused: usize,
}

impl Status {
    /// Totals over live and retired workers. Of the hybrid fronts only their errors (the
    /// input they refused): their requests are hand-offs, their bytes the workers' too.
    pub(crate) fn totals(&self) -> Totals {
        let mut t = self.retired.clone();
        for (_, w) in &self.workers {
            t.add(w);
        }
        for (_, f) in self.hybrid.iter().flat_map(|h| &h.fronts) {
            t.errors += f.errors;
        }
        t
    }

    /// The live event workers' connection counts, summed (all zero without event workers).
    pub(crate) fn event_totals(&self) -> EventTotals {
        let mut t = EventTotals::default();
        for e in self.workers.iter().filter_map(|(_, w)| w.event) {
            t.workers += 1;
            t.open += u64::from(e.counts.open);
            t.reading += u64::from(e.counts.reading);
            // The requests in flight: for an async worker, any number of them; the
            // states then add up to the open connections (a sync loop has 0 or 1).
            t.handling += u64::from(e.in_flight);
            t.requests_in_flight += u64::from(e.in_flight);
            t.writing += u64::from(e.counts.writing);
            t.idle_keepalive += u64::from(e.counts.idle_keepalive);
            t.accepts_paused += usize::from(e.accepts_paused);
        }
        t
    }

    /// Whether the server is ready to take traffic (`/readyz`), or why not: the master
    /// has started (its first workers were ready), is neither stopping nor draining (its
    /// sockets handed to a new master), and has at least one live worker that accepts
    /// (idle or serving; not starting, not finishing). An `ondemand` pool counts as ready
    /// without workers: its master starts one when a connection waits.
    ///
    /// The one place readiness is decided; issue 22 refines it.
    pub(crate) fn readiness(&self) -> Result<(), String> {
        match self.phase {
            "running" | "reloading" | "upgrading" => {}
            "starting" => return Err("starting: the first workers are not ready yet".into()),
            "stopping" => return Err("stopping".into()),
            "draining" => return Err("draining: a new master took over the sockets".into()),
            other => return Err(format!("phase {other}")),
        }
        let live = self
            .workers
            .iter()
            .filter(|(_, w)| {
                matches!(
                    w.state,
                    State::Idle | State::Reading | State::Handling | State::Writing | State::Closing
                )
            })
            .count();
        if let Some(h) = &self.hybrid {
            if !h
                .fronts
                .iter()
                .any(|(_, f)| f.state != State::Starting && f.state != State::Finishing)
            {
                return Err("no live front (--io hybrid)".into());
            }
        }
        if live == 0 && self.pool.policy != "ondemand" {
            let starting = self
                .workers
                .iter()
                .filter(|(_, w)| w.state == State::Starting)
                .count();
            return Err(format!("no live worker ({starting} starting)"));
        }
        Ok(())
    }
}

/// The pool held by a few addresses' slow clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    /// Ready workers.
    pub(crate) workers: usize,
    /// Workers held reading for `HELD_FOR` or longer.
    pub(crate) held: usize,
    /// The addresses holding the most of them (at most `FEW_ADDRESSES`), with their
    /// counts, most first.
    pub(crate) addresses: Vec<(IpAddr, usize)>,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} workers held for {}s or more by slow or idle clients: ",
            self.held,
            self.workers,
            HELD_FOR.as_secs()
        )?;
        for (i, (ip, n)) in self.addresses.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{ip} ({n})")?;
        }
        Ok(())
    }
}

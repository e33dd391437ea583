//! The three renderings of a [`Status`]: a table for people, JSON for programs, and the
//! Prometheus text exposition format for monitoring. Pure functions of the snapshot.
//!
//! Each rendering is written section by section, one small function per section, in the
//! order of its output: [`render_text`] calls `text_*`, [`render_metrics`] calls
//! `metrics_*` (one per topic of metric families), and [`render_json`] serializes the
//! serde types of `mod json`, which mirror the document field for field.

use std::fmt::Write as _;
use std::time::Duration;

use crate::control::status::{Status, Totals};
use crate::scoreboard::{DURATION_BUCKETS_US, EventView, SlotView, State};

/// The version of the JSON document ([`render_json`]'s `version` field).
pub(crate) const JSON_VERSION: u32 = 1;

/// Whether a worker is serving a client (defined beside the snapshot, whose connection
/// count uses it too).
pub(super) use crate::control::status::busy;

/// A request's first bytes, printable: ASCII graphic characters and spaces stay, `\`,
/// CR, LF and TAB become `\\`, `\r`, `\n`, `\t`, every other byte `\xNN`. The result is
/// safe to print on a terminal and in a log.
pub(crate) fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'\r' => out.push_str("\\r"),
            b'\n' => out.push_str("\\n"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out
}

/// A duration for people: `850ms`, `12.3s`, `4m07s`, `2h05m`, `3d04h`.
pub(crate) fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s < 1 {
        format!("{}ms", d.as_millis())
    } else if s < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    } else {
        format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600)
    }
}

/// Microseconds as seconds, exactly, without trailing zeros: 2500 → `0.0025`, 5000000 → `5`.
pub(super) fn micros_as_secs(us: u128) -> String {
    let (whole, frac) = (us / 1_000_000, us % 1_000_000);
    if frac == 0 {
        return whole.to_string();
    }
    let digits = format!("{frac:06}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

fn secs(d: Duration) -> String {
    micros_as_secs(d.as_micros())
}

pub(super) fn requests_per_second(requests: u64, uptime: Duration) -> f64 {
    let s = uptime.as_secs_f64();
    if s > 0.0 { requests as f64 / s } else { 0.0 }
}

/// Workers sorted by slot id.
pub(super) fn workers_by_id(status: &Status) -> Vec<&(u32, SlotView)> {
    let mut w: Vec<_> = status.workers.iter().collect();
    w.sort_by_key(|(id, _)| *id);
    w
}

/// The legend of the scoreboard line.
const LEGEND: [&str; 2] = [
    "\"_\" idle, \"S\" starting, \"R\" reading, \"H\" handling, \"W\" writing,",
    "\"C\" closing, \"F\" finishing, \".\" free slot",
];

/// Scoreboard letters per line of the table.
const SCOREBOARD_WIDTH: usize = 64;

/// Renders `status` as a table, in the manner of Apache's mod_status: the server, its
/// pool, totals, listeners, restarts, the scoreboard line, then one row per worker (the
/// client, the time and the request's summary for busy ones). With event workers
/// (`--io event`), a `Connections:` line sums their connections by state, and a second
/// table gives each one's counts, its requests in flight, whether it accepts, and how long
/// ago its loop last began a turn; the rows of blocking workers are the same in both. In
/// hybrid mode (`--io hybrid`), a `Hybrid:` line and a table of the fronts.
pub(crate) fn render_text(status: &Status) -> String {
    let totals = status.totals();
    let mut out = String::new();
    let o = &mut out;
    text_header(o, status);
    text_totals(o, status, &totals);
    text_connections(o, status);
    text_request_times(o, &totals);
    text_listeners(o, status);
    text_restarts_and_warnings(o, status);
    text_scoreboard(o, status);
    text_workers(o, status);
    text_event_loops(o, status);
    text_fronts(o, status);
    out
}

/// The server, its phase, whether it is ready, its uptime and its pool.
fn text_header(o: &mut String, status: &Status) {
    let _ = writeln!(
        o,
        "Server:        {} (master pid {})",
        status.name, status.master_pid
    );
    let _ = writeln!(o, "Phase:         {}", status.phase);
    let _ = match status.readiness() {
        Ok(()) => writeln!(o, "Ready:         yes"),
        Err(why) => writeln!(o, "Ready:         no ({why})"),
    };
    let _ = writeln!(o, "Uptime:        {}", human(status.uptime));
    let p = &status.pool;
    let _ = writeln!(
        o,
        "Pool:          {}, target {} workers, min spare {}, max spare {}, max {}",
        p.policy, p.target, p.min_spare, p.max_spare, p.max
    );
}

/// The totals over live and retired workers; their datagrams when there are datagram
/// listeners (or there were datagrams).
fn text_totals(o: &mut String, status: &Status, totals: &Totals) {
    let _ = writeln!(
        o,
        "Totals:        {} connections, {} requests, {} bytes in, {} bytes out, {:.2} requests/s",
        totals.connections,
        totals.requests,
        totals.bytes_in,
        totals.bytes_out,
        requests_per_second(totals.requests, status.uptime)
    );
    for (i, r) in status.rates.iter().enumerate() {
        let label = if i == 0 { "Rates:" } else { "" };
        let _ = writeln!(o, "{label:<15}{}", rate_summary(r));
    }
    let d = &totals.datagrams;
    if d.received > 0 || status.listeners.iter().any(|l| l.datagram) {
        let _ = writeln!(o, "Datagrams:     {}", datagram_summary(d));
    }
}

/// One rate window in one line (issue 41): `last 10s: 12.50 requests/s, 0.10 errors/s,
/// 1500 bytes/s in, 6000 bytes/s out`, `last 1m: ...`; a window longer than the master's
/// life says what it covers (`last 4.2s (since the start)`).
pub(super) fn rate_summary(r: &crate::control::history::Rate) -> String {
    let last = match r.window.as_secs() {
        s if s >= 60 && s % 60 == 0 => format!("last {}m", s / 60),
        s => format!("last {s}s"),
    };
    if r.over.is_zero() {
        return format!("{last}: no sample yet");
    }
    let window = if r.over >= r.window {
        last
    } else {
        format!("last {} (since the start)", human(r.over))
    };
    format!(
        "{window}: {:.2} requests/s, {:.2} errors/s, {:.0} bytes/s in, {:.0} bytes/s out",
        r.requests, r.errors, r.bytes_in, r.bytes_out
    )
}

/// The datagram counters in one sentence, as `status` and the status page say them.
pub(super) fn datagram_summary(d: &crate::scoreboard::DatagramCounts) -> String {
    format!(
        "{} received, {} answered, {} bytes in, {} bytes out; dropped: {} denied, {} too large, {} rate-limited, {} handler errors, {} refused sends",
        d.received,
        d.sent,
        d.bytes_in,
        d.bytes_out,
        d.denied,
        d.too_large,
        d.rate_limited,
        d.errors,
        d.send_failed
    )
}

/// The connections open now: those the hybrid fronts hold, those of the event workers
/// (with a request in flight: the sum of their requests in flight, which an async worker
/// has any number of, and the event loop 0 or 1).
fn text_connections(o: &mut String, status: &Status) {
    if let Some(h) = &status.hybrid {
        let _ = writeln!(o, "Hybrid:        {}", hybrid_summary(h));
    }
    let ev = status.event_totals();
    if ev.workers > 0 {
        let _ = writeln!(o, "Connections:   {}", connections_summary(&ev));
    }
}

/// The hybrid fronts in one sentence, as `status` and the status page say them.
pub(super) fn hybrid_summary(h: &crate::control::status::Hybrid) -> String {
    let (held, idle) = h.held();
    format!(
        "{} fronts hold {held} connections ({idle} idle keep-alive); {} requests waiting for a worker; {} handed off",
        h.fronts.len(),
        h.requests_waiting,
        h.handed_off
    )
}

/// The event workers' connections in one sentence, as `status` and the status page say
/// them.
pub(super) fn connections_summary(ev: &crate::control::status::EventTotals) -> String {
    format!(
        "{} open in {} event workers: {} reading, {} in flight, {} writing, {} idle keep-alive; accepts paused in {}",
        ev.open,
        ev.workers,
        ev.reading,
        ev.requests_in_flight,
        ev.writing,
        ev.idle_keepalive,
        ev.accepts_paused
    )
}

/// Slow handler calls, and the mean request time, when there are any.
fn text_request_times(o: &mut String, totals: &Totals) {
    if totals.slow_calls > 0 {
        let _ = writeln!(
            o,
            "Slow requests: {} handler calls over --slow-request",
            totals.slow_calls
        );
    }
    if totals.requests > 0 {
        let mean = totals.duration_sum / u32::try_from(totals.requests).unwrap_or(u32::MAX);
        let _ = writeln!(o, "Request time:  {} mean", human(mean));
    }
}

/// One line per listener, with its accept queue and backlog where the kernel tells them.
fn text_listeners(o: &mut String, status: &Status) {
    if status.listeners.is_empty() {
        let _ = writeln!(o, "Listeners:     none");
    }
    for (i, l) in status.listeners.iter().enumerate() {
        let label = if i == 0 { "Listeners:" } else { "" };
        let queue = match (l.queued, l.backlog) {
            (Some(q), Some(b)) => format!("  queue {q} of backlog {b}"),
            (Some(q), None) => format!("  queue {q}"),
            (None, Some(b)) => format!("  backlog {b}"),
            (None, None) => String::new(),
        };
        let _ = writeln!(o, "{label:<15}{}{queue}", escape_bytes(l.addr.as_bytes()));
    }
}

/// Restarts by reason, the times the pool was full, and the warnings: log lines dropped,
/// the pool held by slow clients.
fn text_restarts_and_warnings(o: &mut String, status: &Status) {
    let restarts = if status.restarts.is_empty() {
        "none".to_owned()
    } else {
        status
            .restarts
            .iter()
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(o, "Restarts:      {restarts}");
    let _ = writeln!(o, "Max workers reached: {} times", status.max_workers_reached);
    match status.log_dropped_totals() {
        (0, 0) => {}
        (error, access) => {
            let _ = writeln!(
                o,
                "Warning:       log lines dropped (could not be written): {error} error log, {access} access log"
            );
        }
    }
    if let Some(held) = &status.slow_clients {
        let _ = writeln!(o, "Warning:       {held}; consider --max-conns-per-ip");
    }
}

/// The scoreboard line (wrapped at [`SCOREBOARD_WIDTH`] letters) and its legend, between
/// blank lines.
fn text_scoreboard(o: &mut String, status: &Status) {
    let _ = writeln!(o);
    let letters: Vec<char> = status.scoreboard.chars().collect();
    if letters.is_empty() {
        let _ = writeln!(o, "Scoreboard:");
    }
    for (i, chunk) in letters.chunks(SCOREBOARD_WIDTH).enumerate() {
        let label = if i == 0 { "Scoreboard:" } else { "" };
        let _ = writeln!(o, "{label:<15}{}", chunk.iter().collect::<String>());
    }
    let _ = writeln!(o, "Key:           {}", LEGEND[0]);
    let _ = writeln!(o, "               {}", LEGEND[1]);
    let _ = writeln!(o);
}

/// A table's header row.
fn header_row(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// How long ago an event loop last began a turn: `2ms ago`, or `never`.
fn last_turn(e: &EventView) -> String {
    e.last_turn
        .map_or_else(|| "never".to_owned(), |t| format!("{} ago", human(t)))
}

/// The table of live workers, by id: their counters, and, while one serves a client, the
/// client, the time and the request's summary.
fn text_workers(o: &mut String, status: &Status) {
    let mut rows = vec![header_row(&[
        "ID", "PID", "GEN", "STATE", "CONNS", "REQS", "IN", "OUT", "AGE", "CLIENT", "TIME", "REQUEST",
    ])];
    for (id, w) in workers_by_id(status) {
        let serving = busy(w);
        let client = w.peer.as_ref().filter(|_| serving).map(ToString::to_string);
        let time = w.current.filter(|_| serving).map(human);
        let head = (serving && !w.head.is_empty()).then(|| escape_bytes(&w.head));
        rows.push(vec![
            id.to_string(),
            w.pid.to_string(),
            w.generation.to_string(),
            w.state.name().to_owned(),
            w.connections.to_string(),
            w.requests.to_string(),
            w.bytes_in.to_string(),
            w.bytes_out.to_string(),
            human(w.age),
            client.unwrap_or_else(|| "-".into()),
            time.unwrap_or_else(|| "-".into()),
            head.unwrap_or_else(|| "-".into()),
        ]);
    }
    // Numbers right-aligned, words left-aligned; the last column unpadded.
    table(
        o,
        &rows,
        &[
            true, true, true, false, true, true, true, true, true, false, true, false,
        ],
    );
}

/// The table of event workers' loops (none without event workers), after a blank line:
/// their connections by state, their requests in flight (`IN-FLIGHT`: an async worker's
/// any number, the event loop's 0 or 1), whether they accept, their last turn.
fn text_event_loops(o: &mut String, status: &Status) {
    let loops: Vec<_> = workers_by_id(status)
        .into_iter()
        .filter_map(|(id, w)| w.event.map(|e| (id, e)))
        .collect();
    if loops.is_empty() {
        return;
    }
    let _ = writeln!(o);
    let mut rows = vec![header_row(&[
        "ID",
        "OPEN",
        "READING",
        "IN-FLIGHT",
        "WRITING",
        "IDLE-KA",
        "ACCEPTS",
        "LAST TURN",
    ])];
    for (id, e) in loops {
        rows.push(vec![
            id.to_string(),
            e.counts.open.to_string(),
            e.counts.reading.to_string(),
            e.in_flight.to_string(),
            e.counts.writing.to_string(),
            e.counts.idle_keepalive.to_string(),
            if e.accepts_paused { "paused" } else { "open" }.to_owned(),
            last_turn(&e),
        ]);
    }
    table(o, &rows, &[true, true, true, true, true, true, false, false]);
}

/// The table of hybrid mode's fronts (none without fronts), after a blank line: their
/// hand-offs and the connections they hold.
fn text_fronts(o: &mut String, status: &Status) {
    let Some(h) = status.hybrid.as_ref().filter(|h| !h.fronts.is_empty()) else {
        return;
    };
    let _ = writeln!(o);
    let mut rows = vec![header_row(&[
        "FRONT",
        "PID",
        "GEN",
        "STATE",
        "CONNS",
        "HANDED",
        "OPEN",
        "READING",
        "IDLE-KA",
        "LAST TURN",
    ])];
    for (id, f) in &h.fronts {
        let e = f.event.unwrap_or_default();
        rows.push(vec![
            id.to_string(),
            f.pid.to_string(),
            f.generation.to_string(),
            f.state.name().to_owned(),
            f.connections.to_string(),
            f.requests.to_string(),
            e.counts.open.to_string(),
            e.counts.reading.to_string(),
            e.counts.idle_keepalive.to_string(),
            last_turn(&e),
        ]);
    }
    table(
        o,
        &rows,
        &[true, true, true, false, true, true, true, true, true, false],
    );
}

/// Writes `rows` (the first one the header) as columns two spaces apart: right-aligned
/// where `right` says so, left-aligned elsewhere, the last column unpadded.
fn table(o: &mut String, rows: &[Vec<String>], right: &[bool]) {
    let widths: Vec<usize> = (0..right.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            if c + 1 == row.len() {
                line.push_str(cell);
            } else if right[c] {
                let _ = write!(line, "{cell:>w$}", w = widths[c]);
            } else {
                let _ = write!(line, "{cell:<w$}", w = widths[c]);
            }
        }
        let _ = writeln!(o, "{}", line.trim_end());
    }
}

/// An `f64` as the JSON status writes it (finite by construction; a non-finite one
/// becomes `null`): at most six decimals, without trailing zeros (`0.113557`, `1.5`, `5`).
fn json_f64(v: f64) -> String {
    if v.is_finite() {
        let s = format!("{v:.6}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s.is_empty() || s == "-" {
            "0".into()
        } else {
            s.to_owned()
        }
    } else {
        "null".into()
    }
}

/// Renders `status` as one JSON object (on one line, with a final newline), version 1:
///
/// ```text
/// {
///   "version": 1,                  this document's version
///   "name": "hello",               the server's name
///   "master_pid": 4242,
///   "phase": "running",            starting, running, reloading, upgrading,
///                                  draining (handed over) or stopping
///   "ready": true,                 what /readyz answers (200 when true)
///   "not_ready": null,             why not, when not ("stopping", "no live worker …")
///   "uptime_seconds": 3600.5,
///   "grace_period_seconds": 30,    --grace-period: what a stop gives the connections
///   "drain_delay_seconds": 0,      --drain-delay: before it, /readyz answers 503
///   "io": "blocking",              the workers' I/O model (--io): blocking, event, hybrid, async
///   "pool": {"policy": "static", "target": 4, "min_spare": 0, "max_spare": 0, "max": 4},
///   "totals": {                    over live and retired workers
///     "connections": 10, "requests": 25, "bytes_in": 1200, "bytes_out": 4000,
///     "denied": 0, "refused": 0,                by --allow/--deny, by --max-conns-per-ip
///     "tls_handshake_failures": 0,              TLS listeners: handshakes that failed
///     "slow_requests": 0,                       handler calls over --slow-request (event
///                                               workers; blocking ones count none)
///     "errors": 0,                              requests that ended in an error: the
///                                               handler failed, the input was refused,
///                                               the request timed out (issue 41)
///     "requests_per_second": 0.01,              since the master started
///     "request_duration_seconds_sum": 0.25,
///     "request_duration_buckets": [{"le": 0.0005, "count": 3}, ..., {"le": null, "count": 0}]
///                                  per bucket (not cumulative); le null is +Inf
///     "datagrams": {"received": 0, "sent": 0, "bytes_in": 0, "bytes_out": 0,
///                   "denied": 0, "too_large": 0, "rate_limited": 0, "errors": 0,
///                   "send_failed": 0}        datagram listeners (udp://, unixgram:)
///   },
///   "rates": {                     now (issue 41): from the master's samples, one a second
///     "last_10s": {"window_seconds": 10,
///                  "over_seconds": 10.4,        what the rates cover: 10 to 11 s, less
///                                               while the master is younger than 10 s
///                  "requests_per_second": 12.5, "errors_per_second": 0,
///                  "bytes_in_per_second": 1500, "bytes_out_per_second": 6000},
///     "last_60s": {...}            the same over the last minute
///   },
///   "event": null,                 without event workers (--io event); with them, their
///                                  connections now, summed over the live ones:
///                                  {"workers": 2, "open": 1200, "reading": 10,
///                                   "handling": 1,           (at most 1 per worker)
///                                   "requests_in_flight": 1, (their requests in flight)
///                                   "writing": 3, "idle_keepalive": 1186,
///                                   "accepts_paused": 0}    (workers that stopped accepting)
///   "hybrid": null,                unless --io hybrid; then
///                                  {"requests_waiting": 0,   complete requests waiting for
///                                                            a worker (the pool sizes by it)
///                                   "handed_off": 1500,      connections handed to workers
///                                   "held": 300, "idle_keepalive": 280,
///                                                            connections the fronts hold
///                                   "fronts": [{"id": 3, "pid": 4252, "generation": 0,
///                                     "state": "reading", "connections": 20,
///                                     "handed_off": 1500, "open": 300, "reading": 20,
///                                     "idle_keepalive": 280, "last_turn_seconds": 0.001}]}
///   "listeners": [{"addr": "127.0.0.1:7000", "kind": "stream", "queued": 0, "backlog": 511}],
///                                  queued and backlog are null for Unix and datagram
///                                  sockets; kind is "stream" or "datagram" (udp://HOST:PORT,
///                                  unixgram:PATH)
///   "restarts": {"exit": 0, "signal": 1, "timeout": 0, "recycled": 0, "backoff": 0},
///   "max_workers_reached": 0,
///   "log_lines_dropped": {"error": 0, "access": 0},
///                                  lines that could not be written (a full disk, a
///                                  closed stderr), by every process
///   "slow_clients": null,          or, while 75 % of the workers are held 10 s or more
///                                  reading by clients of at most 3 addresses:
///                                  {"workers": 4, "held": 3, "addresses":
///                                   [{"address": "192.0.2.7", "workers": 2}, ...]}
///   "scoreboard": "__RH....",      one letter per slot, as in the table's legend
///   "workers": [{                  live workers, by id
///     "id": 1, "pid": 4250, "generation": 0, "state": "handling",
///     "connections": 3, "requests": 7, "bytes_in": 300, "bytes_out": 900,
///     "age_seconds": 12.5,         since the worker was forked
///     "idle_seconds": 0.2,         since its last request or connection ended, or null
///     "client": "127.0.0.1:50000", the client served now, or null
///     "request_seconds": 0.05,     how long the current request (for handle_client, the
///                                  connection) has been running, or null
///     "request": "GET /",          what its codec says of it (issue 41: "GET /path",
///                                  a RESP command name; with --status-request-detail
///                                  its first 64 bytes), escaped as in the table (bytes
///                                  outside printable ASCII as \xNN), or null
///     "slow_requests": 0,          handler calls over --slow-request
///     "event": null                a blocking worker; an event worker's loop:
///                                  {"open": 600, "reading": 5, "handling": 1,
///                                   "requests_in_flight": 1, "writing": 1,
///                                   "idle_keepalive": 593, "accepts_paused": false,
///                                   "last_turn_seconds": 0.002}
///                                  (since its loop last began a turn, null if it never did);
///                                  requests_in_flight: an async worker's (run_async,
///                                  run_async_requests) any number, a client-level session
///                                  counting one; the event loop's 0 or 1; handling is 1
///                                  while any is
///   }]
/// }
/// ```
///
/// Numbers of seconds are exact to the microsecond, written without trailing zeros
/// (`75`, `1.5`, `0.000001`, never `75.0` or `1e-6`); `requests_per_second` has at most
/// six decimals. Strings escape `"`, `\`, the control characters and DEL (`\u007f`), and
/// nothing else.
pub(crate) fn render_json(status: &Status) -> String {
    let mut out = to_json(&json::Document::new(status));
    out.push('\n');
    out
}

/// `value` as compact JSON, with the status document's numbers and escapes
/// ([`StatusFormatter`]).
fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    let mut out = Vec::with_capacity(4096);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, StatusFormatter);
    // The document's types serialize infallibly (no map has a key that is not a string),
    // and a Vec takes every write.
    value
        .serialize(&mut ser)
        .expect("the JSON status serializes into memory");
    // serde_json writes valid UTF-8 (strings come from `&str`; the formatter writes ASCII).
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// serde_json's compact output with the status document's own conventions, which it
/// had when it was written by hand and which its readers may have come to rely on:
/// numbers as [`json_f64`] writes them (seconds come from microseconds, so six decimals
/// give back their exact decimal: `0.0025`, `75`, not `75.0`; a rate keeps six
/// decimals), backspace and form feed as `\u0008` and `\u000c` rather than `\b` and
/// `\f`, and DEL escaped as `\u007f`, so that a name or a path printed by `status --json`
/// cannot carry a raw DEL to a terminal.
struct StatusFormatter;

impl serde_json::ser::Formatter for StatusFormatter {
    fn write_f64<W: ?Sized + std::io::Write>(&mut self, w: &mut W, v: f64) -> std::io::Result<()> {
        w.write_all(json_f64(v).as_bytes())
    }

    fn write_char_escape<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        escape: serde_json::ser::CharEscape,
    ) -> std::io::Result<()> {
        use serde_json::ser::{CharEscape, CompactFormatter};
        match escape {
            CharEscape::Backspace => w.write_all(b"\\u0008"),
            CharEscape::FormFeed => w.write_all(b"\\u000c"),
            other => CompactFormatter.write_char_escape(w, other),
        }
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        // serde_json leaves DEL unescaped; the fragments between its escapes may hold one.
        let mut parts = fragment.split('\u{7f}');
        if let Some(first) = parts.next() {
            w.write_all(first.as_bytes())?;
        }
        for part in parts {
            w.write_all(b"\\u007f")?;
            w.write_all(part.as_bytes())?;
        }
        Ok(())
    }
}

/// The JSON status document ([`render_json`]) as serde types: one per object of the
/// document, their fields named and ordered as its keys (serde writes a struct's fields in
/// the order they are declared), `None` for its `null`s. They borrow from the [`Status`]
/// they are made from.
mod json {
    use std::net::IpAddr;
    use std::time::Duration;

    use serde::{Serialize, Serializer};

    use super::{busy, escape_bytes, requests_per_second, workers_by_id};
    use crate::control::status::{self, EventTotals, Status, Totals};
    use crate::scoreboard::{DURATION_BUCKETS_US, DatagramCounts, EventView, SlotView};

    /// A number of seconds, held as the microseconds it is exact to.
    ///
    /// Serialized as an `f64`, which `StatusFormatter` writes with six decimals: a double
    /// is within half a unit in the last place of the microseconds' decimal, less than
    /// half a microsecond below 2^33 seconds (272 years), so the six decimals are that
    /// decimal (`issue_32_seconds_are_written_exactly` checks it).
    #[derive(Clone, Copy)]
    pub(super) struct Secs(pub(super) u128);

    impl From<Duration> for Secs {
        fn from(d: Duration) -> Secs {
            Secs(d.as_micros())
        }
    }

    impl Serialize for Secs {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_f64(self.0 as f64 / 1e6)
        }
    }

    /// The whole document.
    #[derive(Serialize)]
    pub(super) struct Document<'a> {
        version: u32,
        name: &'a str,
        master_pid: u32,
        phase: &'a str,
        ready: bool,
        not_ready: Option<String>,
        uptime_seconds: Secs,
        grace_period_seconds: Secs,
        drain_delay_seconds: Secs,
        io: &'a str,
        pool: &'a status::PoolStatus,
        totals: TotalsDoc,
        rates: Rates,
        event: Option<EventTotals>,
        hybrid: Option<Hybrid>,
        listeners: Vec<Listener<'a>>,
        /// Restarts by reason: an object whose keys are in the snapshot's order.
        #[serde(serialize_with = "in_order")]
        restarts: &'a [(&'static str, u64)],
        max_workers_reached: u64,
        log_lines_dropped: LogLinesDropped,
        slow_clients: Option<SlowClients>,
        scoreboard: &'a str,
        workers: Vec<Worker>,
    }

    impl<'a> Document<'a> {
        pub(super) fn new(status: &'a Status) -> Document<'a> {
            let ready = status.readiness();
            let (error, access) = status.log_dropped_totals();
            let ev = status.event_totals();
            Document {
                version: super::JSON_VERSION,
                name: &status.name,
                master_pid: status.master_pid,
                phase: status.phase,
                ready: ready.is_ok(),
                not_ready: ready.err(),
                uptime_seconds: status.uptime.into(),
                grace_period_seconds: status.grace_period.into(),
                drain_delay_seconds: status.drain_delay.into(),
                io: status.io,
                pool: &status.pool,
                totals: TotalsDoc::new(&status.totals(), status.uptime),
                rates: Rates {
                    last_10s: RateDoc::new(&status.rates[0]),
                    last_60s: RateDoc::new(&status.rates[1]),
                },
                event: (ev.workers > 0).then_some(ev),
                hybrid: status.hybrid.as_ref().map(Hybrid::new),
                listeners: status.listeners.iter().map(Listener::new).collect(),
                restarts: &status.restarts,
                max_workers_reached: status.max_workers_reached,
                log_lines_dropped: LogLinesDropped { error, access },
                slow_clients: status.slow_clients.as_ref().map(SlowClients::new),
                scoreboard: &status.scoreboard,
                workers: workers_by_id(status)
                    .into_iter()
                    .map(|(id, w)| Worker::new(*id, w))
                    .collect(),
            }
        }
    }

    /// `(key, value)` pairs as an object, in their order.
    fn in_order<S: Serializer>(pairs: &&[(&'static str, u64)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
    }

    /// `totals`.
    #[derive(Serialize)]
    struct TotalsDoc {
        connections: u64,
        requests: u64,
        bytes_in: u64,
        bytes_out: u64,
        denied: u64,
        refused: u64,
        tls_handshake_failures: u64,
        slow_requests: u64,
        errors: u64,
        requests_per_second: f64,
        request_duration_seconds_sum: Secs,
        request_duration_buckets: Vec<Bucket>,
        datagrams: DatagramCounts,
    }

    impl TotalsDoc {
        fn new(t: &Totals, uptime: Duration) -> TotalsDoc {
            TotalsDoc {
                connections: t.connections,
                requests: t.requests,
                bytes_in: t.bytes_in,
                bytes_out: t.bytes_out,
                denied: t.denied,
                refused: t.refused,
                tls_handshake_failures: t.tls_failed,
                slow_requests: t.slow_calls,
                errors: t.errors,
                requests_per_second: requests_per_second(t.requests, uptime),
                request_duration_seconds_sum: t.duration_sum.into(),
                // One more count than bounds: the last bucket is +Inf, `le` null.
                request_duration_buckets: t
                    .durations
                    .iter()
                    .enumerate()
                    .map(|(i, &count)| Bucket {
                        le: DURATION_BUCKETS_US.get(i).map(|&le| Secs(u128::from(le))),
                        count,
                    })
                    .collect(),
                datagrams: t.datagrams,
            }
        }
    }

    /// `rates`: the two windows (issue 41).
    #[derive(Serialize)]
    struct Rates {
        last_10s: RateDoc,
        last_60s: RateDoc,
    }

    /// One window's rates.
    #[derive(Serialize)]
    struct RateDoc {
        window_seconds: Secs,
        over_seconds: Secs,
        requests_per_second: f64,
        errors_per_second: f64,
        bytes_in_per_second: f64,
        bytes_out_per_second: f64,
    }

    impl RateDoc {
        fn new(r: &crate::control::history::Rate) -> RateDoc {
            RateDoc {
                window_seconds: r.window.into(),
                over_seconds: r.over.into(),
                requests_per_second: r.requests,
                errors_per_second: r.errors,
                bytes_in_per_second: r.bytes_in,
                bytes_out_per_second: r.bytes_out,
            }
        }
    }

    /// A bucket of the request-duration histogram, not cumulative.
    #[derive(Serialize)]
    struct Bucket {
        le: Option<Secs>,
        count: u64,
    }

    #[derive(Serialize)]
    struct Hybrid {
        requests_waiting: u64,
        handed_off: u64,
        held: u64,
        idle_keepalive: u64,
        fronts: Vec<Front>,
    }

    impl Hybrid {
        fn new(h: &status::Hybrid) -> Hybrid {
            let (held, idle_keepalive) = h.held();
            Hybrid {
                requests_waiting: h.requests_waiting,
                handed_off: h.handed_off,
                held,
                idle_keepalive,
                fronts: h.fronts.iter().map(|(id, f)| Front::new(*id, f)).collect(),
            }
        }
    }

    /// A front, whose slot's `requests` are its hand-offs; zeros before its loop runs.
    #[derive(Serialize)]
    struct Front {
        id: u32,
        pid: u32,
        generation: u32,
        state: &'static str,
        connections: u64,
        handed_off: u64,
        open: u32,
        reading: u32,
        idle_keepalive: u32,
        last_turn_seconds: Option<Secs>,
    }

    impl Front {
        fn new(id: u32, f: &SlotView) -> Front {
            let e = f.event.unwrap_or_default();
            Front {
                id,
                pid: f.pid,
                generation: f.generation,
                state: f.state.name(),
                connections: f.connections,
                handed_off: f.requests,
                open: e.counts.open,
                reading: e.counts.reading,
                idle_keepalive: e.counts.idle_keepalive,
                last_turn_seconds: e.last_turn.map(Secs::from),
            }
        }
    }

    #[derive(Serialize)]
    struct Listener<'a> {
        addr: &'a str,
        kind: &'static str,
        queued: Option<u32>,
        backlog: Option<u32>,
    }

    impl<'a> Listener<'a> {
        fn new(l: &'a status::ListenerStatus) -> Listener<'a> {
            Listener {
                addr: &l.addr,
                kind: if l.datagram { "datagram" } else { "stream" },
                queued: l.queued,
                backlog: l.backlog,
            }
        }
    }

    #[derive(Serialize)]
    struct LogLinesDropped {
        error: u64,
        access: u64,
    }

    #[derive(Serialize)]
    struct SlowClients {
        workers: usize,
        held: usize,
        addresses: Vec<HeldBy>,
    }

    impl SlowClients {
        fn new(h: &status::Held) -> SlowClients {
            SlowClients {
                workers: h.workers,
                held: h.held,
                addresses: h
                    .addresses
                    .iter()
                    .map(|&(address, workers)| HeldBy { address, workers })
                    .collect(),
            }
        }
    }

    /// An address holding workers (serde writes an `IpAddr` as its text in JSON).
    #[derive(Serialize)]
    struct HeldBy {
        address: IpAddr,
        workers: usize,
    }

    /// A live worker; what it serves only while it serves, its idle time only while not.
    #[derive(Serialize)]
    struct Worker {
        id: u32,
        pid: u32,
        generation: u32,
        state: &'static str,
        connections: u64,
        requests: u64,
        bytes_in: u64,
        bytes_out: u64,
        age_seconds: Secs,
        idle_seconds: Option<Secs>,
        client: Option<String>,
        request_seconds: Option<Secs>,
        request: Option<String>,
        slow_requests: u64,
        event: Option<Loop>,
    }

    impl Worker {
        fn new(id: u32, w: &SlotView) -> Worker {
            let serving = busy(w);
            Worker {
                id,
                pid: w.pid,
                generation: w.generation,
                state: w.state.name(),
                connections: w.connections,
                requests: w.requests,
                bytes_in: w.bytes_in,
                bytes_out: w.bytes_out,
                age_seconds: w.age.into(),
                idle_seconds: w.idle_for.filter(|_| !serving).map(Secs::from),
                client: w.peer.as_ref().filter(|_| serving).map(ToString::to_string),
                request_seconds: w.current.filter(|_| serving).map(Secs::from),
                request: (serving && !w.head.is_empty()).then(|| escape_bytes(&w.head)),
                slow_requests: w.slow_calls,
                event: w.event.as_ref().map(Loop::new),
            }
        }
    }

    /// A worker's `event`: its event loop (null for a blocking worker).
    #[derive(Serialize)]
    struct Loop {
        open: u32,
        reading: u32,
        handling: u8,
        requests_in_flight: u32,
        writing: u32,
        idle_keepalive: u32,
        accepts_paused: bool,
        last_turn_seconds: Option<Secs>,
    }

    impl Loop {
        fn new(e: &EventView) -> Loop {
            Loop {
                open: e.counts.open,
                reading: e.counts.reading,
                handling: u8::from(e.handling),
                requests_in_flight: e.in_flight,
                writing: e.counts.writing,
                idle_keepalive: e.counts.idle_keepalive,
                accepts_paused: e.accepts_paused,
                last_turn_seconds: e.last_turn.map(Secs::from),
            }
        }
    }
}

/// A label value in the exposition format: `\`, `"` and newlines escaped.
pub(crate) fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The exposition format, one metric family at a time.
struct Exposition(String);

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        // HELP text escapes `\` and newlines (ours have neither).
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            let labels: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            let _ = write!(self.0, "{{{}}}", labels.join(","));
        }
        let _ = writeln!(self.0, " {value}");
    }

    fn single(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A family whose samples differ by the value of one label: `(label value, value)`.
    fn by_label<L: AsRef<str>, V: std::fmt::Display>(
        &mut self,
        (name, kind, help): (&str, &str, &str),
        label: &str,
        samples: impl IntoIterator<Item = (L, V)>,
    ) {
        self.family(name, kind, help);
        for (l, v) in samples {
            self.sample(name, &[(label, l.as_ref())], v);
        }
    }
}

/// Renders `status` in the Prometheus text exposition format 0.0.4 ([`to_openmetrics`]
/// re-frames it as OpenMetrics 1.0). Metrics, all prefixed `appsrv_`:
///
/// | name | type | labels |
/// | --- | --- | --- |
/// | `appsrv_connections_total` | counter | |
/// | `appsrv_requests_total` | counter | |
/// | `appsrv_bytes_received_total` | counter | |
/// | `appsrv_bytes_sent_total` | counter | |
/// | `appsrv_datagrams_received_total` | counter | |
/// | `appsrv_datagrams_sent_total` | counter | |
/// | `appsrv_datagram_bytes_received_total` | counter | |
/// | `appsrv_datagram_bytes_sent_total` | counter | |
/// | `appsrv_datagrams_dropped_total` | counter | `reason`: denied, too_large, error, send |
/// | `appsrv_datagrams_rate_limited_total` | counter | |
/// | `appsrv_workers` | gauge | `state`: every state but dead, zeros included |
/// | `appsrv_workers_target` | gauge | |
/// | `appsrv_workers_max` | gauge | |
/// | `appsrv_listen_queue` | gauge | `listener` (TCP listeners only) |
/// | `appsrv_listen_backlog` | gauge | `listener` (TCP listeners only) |
/// | `appsrv_connections_denied_total` | counter | |
/// | `appsrv_connections_refused_total` | counter | |
/// | `appsrv_penalized_refused_total` | counter | |
/// | `appsrv_penalized_addresses` | gauge | |
/// | `appsrv_penalties_total` | counter | |
/// | `appsrv_penalties_unrecorded_total` | counter | |
/// | `appsrv_tls_handshake_failures_total` | counter | |
/// | `appsrv_slow_requests_total` | counter | |
/// | `appsrv_open_connections` | gauge | `state`: reading, handling, writing, idle_keepalive |
/// | `appsrv_open_connections_all` | gauge | |
/// | `appsrv_requests_in_flight` | gauge | `worker`: each event worker's slot id (event workers only) |
/// | `appsrv_accepts_paused` | gauge | |
/// | `appsrv_requests_waiting` | gauge | hybrid mode: complete requests waiting for a worker |
/// | `appsrv_handoffs_total` | counter | hybrid mode: by every front since the start |
/// | `appsrv_fronts` | gauge | hybrid mode |
/// | `appsrv_front_connections` | gauge | hybrid mode: connections the fronts hold |
/// | `appsrv_max_workers_reached_total` | counter | |
/// | `appsrv_log_lines_dropped_total` | counter | `log`: error, access; `role`: master, worker, front, helper |
/// | `appsrv_worker_restarts_total` | counter | `reason` |
/// | `appsrv_request_duration_seconds` | histogram | `le` |
/// | `appsrv_uptime_seconds` | gauge | |
///
/// The counters cover workers that have exited too, so they only grow while the master
/// lives.
///
/// The connection gauges describe event workers (`--io event`), summed over the live ones
/// (zeros without any: a blocking worker's connection is its state in `appsrv_workers`).
/// `appsrv_open_connections` splits them by what each waits for; their total is its own
/// gauge, `appsrv_open_connections_all`, rather than a `state="all"` sample, so that a
/// `sum()` over the states stays meaningful (and a connection the loop has not classified
/// yet, such as one accepted during the turn, still counts in the total).
/// `appsrv_requests_in_flight` is per event worker, labelled with its slot id (the `ID`
/// of `status`, the `id` of `status --json`; bounded by the pool's maximum, reused when a
/// worker is replaced), and the family is there only with event workers: an async
/// worker's requests in flight (any number, a client-level session counting one), the
/// event loop's 0 or 1. (`appsrv_open_connections{state="handling"}` counts at most one
/// per worker.) `appsrv_accepts_paused` is how many event workers stopped accepting (at
/// `--worker-connections`, or out of descriptors). `appsrv_slow_requests_total` counts
/// handler calls over `--slow-request` in every worker (blocking workers count none).
///
/// The families are written a topic at a time, one `metrics_*` function per topic.
pub(crate) fn render_metrics(status: &Status) -> String {
    let t = status.totals();
    let mut e = Exposition(String::new());
    metrics_traffic(&mut e, &t);
    metrics_datagrams(&mut e, &t);
    metrics_pool(&mut e, status);
    metrics_listeners(&mut e, status);
    metrics_admission(&mut e, status, &t);
    metrics_event_loops(&mut e, status, &t);
    metrics_hybrid(&mut e, status);
    metrics_logs_and_restarts(&mut e, status);
    metrics_request_durations(&mut e, &t);
    e.single(
        "appsrv_uptime_seconds",
        "gauge",
        "Time since the master started.",
        secs(status.uptime),
    );
    e.0
}

/// Connections, requests and bytes of stream listeners.
fn metrics_traffic(e: &mut Exposition, t: &Totals) {
    e.single(
        "appsrv_connections_total",
        "counter",
        "Connections accepted by the workers.",
        t.connections,
    );
    e.single(
        "appsrv_requests_total",
        "counter",
        "Requests served (request-level handlers).",
        t.requests,
    );
    e.single(
        "appsrv_bytes_received_total",
        "counter",
        "Bytes read from clients.",
        t.bytes_in,
    );
    e.single(
        "appsrv_bytes_sent_total",
        "counter",
        "Bytes written to clients.",
        t.bytes_out,
    );
}

/// Datagrams received, answered and dropped (datagram listeners).
fn metrics_datagrams(e: &mut Exposition, t: &Totals) {
    let d = &t.datagrams;
    e.single(
        "appsrv_datagrams_received_total",
        "counter",
        "Datagrams received on datagram listeners (udp://, unixgram:).",
        d.received,
    );
    e.single(
        "appsrv_datagrams_sent_total",
        "counter",
        "Answers sent on datagram listeners.",
        d.sent,
    );
    e.single(
        "appsrv_datagram_bytes_received_total",
        "counter",
        "Bytes of the datagrams received.",
        d.bytes_in,
    );
    e.single(
        "appsrv_datagram_bytes_sent_total",
        "counter",
        "Bytes of the answers sent.",
        d.bytes_out,
    );
    e.by_label(
        (
            "appsrv_datagrams_dropped_total",
            "counter",
            "Datagrams not answered, by reason: denied (--allow/--deny), too_large (--max-datagram-size), error (the handler failed), send (the kernel refused the answer).",
        ),
        "reason",
        [
            ("denied", d.denied),
            ("too_large", d.too_large),
            ("error", d.errors),
            ("send", d.send_failed),
        ],
    );
    e.single(
        "appsrv_datagrams_rate_limited_total",
        "counter",
        "Datagrams over --max-answers-per-ip: dropped, or answered by the handler's slip (one in --answers-slip).",
        d.rate_limited,
    );
}

/// Live workers by state (every state but dead, zeros included), and the pool's sizes.
fn metrics_pool(e: &mut Exposition, status: &Status) {
    e.by_label(
        ("appsrv_workers", "gauge", "Live workers by state."),
        "state",
        State::ALL.into_iter().filter(|s| *s != State::Dead).map(|state| {
            let n = status.workers.iter().filter(|(_, w)| w.state == state).count();
            (state.name(), n)
        }),
    );
    e.single(
        "appsrv_workers_target",
        "gauge",
        "Workers the pool wants now.",
        status.pool.target,
    );
    e.single(
        "appsrv_workers_max",
        "gauge",
        "The most workers the pool may have.",
        status.pool.max,
    );
}

/// The accept queue and backlog of TCP listeners (the families only when there is one).
fn metrics_listeners(e: &mut Exposition, status: &Status) {
    let queues: Vec<_> = status
        .listeners
        .iter()
        .filter_map(|l| l.queued.map(|q| (&l.addr, q)))
        .collect();
    if !queues.is_empty() {
        e.by_label(
            (
                "appsrv_listen_queue",
                "gauge",
                "Connections waiting in a TCP listener's accept queue.",
            ),
            "listener",
            queues,
        );
    }
    let backlogs: Vec<_> = status
        .listeners
        .iter()
        .filter_map(|l| l.backlog.map(|b| (&l.addr, b)))
        .collect();
    if !backlogs.is_empty() {
        e.by_label(
            (
                "appsrv_listen_backlog",
                "gauge",
                "The capacity of a TCP listener's accept queue.",
            ),
            "listener",
            backlogs,
        );
    }
}

/// Connections turned away: by the access rules, the per-address cap, penalties for
/// failed authentication, failed TLS handshakes.
fn metrics_admission(e: &mut Exposition, status: &Status, t: &Totals) {
    e.single(
        "appsrv_connections_denied_total",
        "counter",
        "Connections closed by the access rules (--allow, --deny).",
        t.denied,
    );
    e.single(
        "appsrv_connections_refused_total",
        "counter",
        "Connections refused by the per-address cap (--max-conns-per-ip).",
        t.refused,
    );
    let p = status.penalties;
    e.single(
        "appsrv_penalized_refused_total",
        "counter",
        "Connections closed at once because their address is penalized for failed authentication (Conn::penalize, --penalty-max).",
        p.refused,
    );
    e.single(
        "appsrv_penalized_addresses",
        "gauge",
        "Addresses refused now for failed authentication.",
        p.addresses,
    );
    e.single(
        "appsrv_penalties_total",
        "counter",
        "Failed authentications charged by handlers (Conn::penalize, Client::penalize).",
        p.charged,
    );
    e.single(
        "appsrv_penalties_unrecorded_total",
        "counter",
        "Failed authentications the full penalty table could not record: those addresses were not refused (it fails open).",
        p.unrecorded,
    );
    e.single(
        "appsrv_tls_handshake_failures_total",
        "counter",
        "Connections closed because their TLS handshake failed (plain-text clients, timeouts, refused client certificates).",
        t.tls_failed,
    );
}

/// Slow handler calls, and the event workers' connections, requests in flight (the family
/// only with event workers) and paused accepts (zeros without event workers).
fn metrics_event_loops(e: &mut Exposition, status: &Status, t: &Totals) {
    e.single(
        "appsrv_slow_requests_total",
        "counter",
        "Handler calls that held an event loop longer than --slow-request.",
        t.slow_calls,
    );
    let ev = status.event_totals();
    e.by_label(
        (
            "appsrv_open_connections",
            "gauge",
            "Connections open in event workers, by what each waits for.",
        ),
        "state",
        [
            ("reading", ev.reading),
            ("handling", ev.handling),
            ("writing", ev.writing),
            ("idle_keepalive", ev.idle_keepalive),
        ],
    );
    e.single(
        "appsrv_open_connections_all",
        "gauge",
        "Connections open in event workers, in all states.",
        ev.open,
    );
    if ev.workers > 0 {
        e.by_label(
            (
                "appsrv_requests_in_flight",
                "gauge",
                "Requests in flight in each event worker, by slot id (async handlers: any number, a client-level session counting one; the event loop: 0 or 1).",
            ),
            "worker",
            workers_by_id(status)
                .into_iter()
                .filter_map(|(id, w)| w.event.map(|e| (id.to_string(), e.in_flight))),
        );
    }
    e.single(
        "appsrv_accepts_paused",
        "gauge",
        "Event workers that stopped accepting (at --worker-connections, or out of descriptors).",
        ev.accepts_paused,
    );
}

/// Hybrid mode's requests waiting, hand-offs and fronts (zeros in the other modes).
fn metrics_hybrid(e: &mut Exposition, status: &Status) {
    let hybrid = status.hybrid.clone().unwrap_or_default();
    e.single(
        "appsrv_requests_waiting",
        "gauge",
        "Hybrid mode: complete requests waiting for a worker.",
        hybrid.requests_waiting,
    );
    e.single(
        "appsrv_handoffs_total",
        "counter",
        "Hybrid mode: connections the fronts handed to workers.",
        hybrid.handed_off,
    );
    e.single(
        "appsrv_fronts",
        "gauge",
        "Hybrid mode: live front processes.",
        hybrid.fronts.len(),
    );
    e.single(
        "appsrv_front_connections",
        "gauge",
        "Hybrid mode: connections the fronts hold (not yet with a whole request, or idle between requests).",
        hybrid.held().0,
    );
}

/// Log lines dropped by log and process role, the times the pool was full, and worker
/// restarts by reason (the family only once a worker was replaced).
fn metrics_logs_and_restarts(e: &mut Exposition, status: &Status) {
    e.family(
        "appsrv_log_lines_dropped_total",
        "counter",
        "Log lines that could not be written (a full disk, a closed stderr) and were dropped, by log and process role.",
    );
    for (row, role) in status.log_dropped.iter().zip(crate::process::log::DROP_ROLES) {
        for (n, log) in row.iter().zip(["error", "access"]) {
            e.sample(
                "appsrv_log_lines_dropped_total",
                &[("log", log), ("role", role)],
                n,
            );
        }
    }
    e.single(
        "appsrv_max_workers_reached_total",
        "counter",
        "Times the pool was at its maximum while clients waited.",
        status.max_workers_reached,
    );
    if !status.restarts.is_empty() {
        e.by_label(
            (
                "appsrv_worker_restarts_total",
                "counter",
                "Workers replaced, by reason.",
            ),
            "reason",
            status.restarts.iter().copied(),
        );
    }
}

/// The request-duration histogram: cumulative buckets, their sum and count.
fn metrics_request_durations(e: &mut Exposition, t: &Totals) {
    let name = "appsrv_request_duration_seconds";
    e.family(
        name,
        "histogram",
        "Time from the start of a request to its response (request-level handlers).",
    );
    let bucket = format!("{name}_bucket");
    let mut cumulative = 0u64;
    for (le, n) in DURATION_BUCKETS_US.iter().zip(t.durations) {
        cumulative += n;
        e.sample(&bucket, &[("le", &micros_as_secs(u128::from(*le)))], cumulative);
    }
    cumulative += t.durations[DURATION_BUCKETS_US.len()];
    e.sample(&bucket, &[("le", "+Inf")], cumulative);
    e.sample(&format!("{name}_sum"), &[], secs(t.duration_sum));
    e.sample(&format!("{name}_count"), &[], cumulative);
}

/// The two formats of the metrics exposition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetricsFormat {
    /// The Prometheus text exposition format 0.0.4 ([`render_metrics`]), the default.
    Prometheus,
    /// OpenMetrics 1.0 text ([`to_openmetrics`]).
    OpenMetrics,
}

impl MetricsFormat {
    /// The value of `metrics --format`.
    pub(crate) fn from_name(name: &str) -> Option<MetricsFormat> {
        match name {
            "prometheus" => Some(MetricsFormat::Prometheus),
            "openmetrics" => Some(MetricsFormat::OpenMetrics),
            _ => None,
        }
    }

    /// The `Content-Type` of a response in this format.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            MetricsFormat::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            MetricsFormat::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// [`render_metrics`] in this format.
    pub(crate) fn render(self, status: &Status) -> String {
        let text = render_metrics(status);
        match self {
            MetricsFormat::Prometheus => text,
            MetricsFormat::OpenMetrics => to_openmetrics(&text),
        }
    }
}

/// The units a family name may end with, which OpenMetrics declares in a `# UNIT` line.
const UNITS: [&str; 2] = ["seconds", "bytes"];

/// Re-frames the text exposition format 0.0.4, as [`render_metrics`] writes it, as
/// OpenMetrics 1.0: a counter's family is named without its samples' `_total`; a family
/// whose name ends in a unit gets a `# UNIT` line; metadata come in the order TYPE, UNIT,
/// HELP, with HELP escaped as OpenMetrics wants (`\"` too); histogram bounds (`le`) are
/// canonical numbers (`5.0`, not `5`); `untyped` is `unknown`; other comments and blank
/// lines go (OpenMetrics has none); `# EOF` ends the text. Samples are otherwise the same
/// bytes.
///
/// The OpenMetrics text is made from the 0.0.4 text rather than by a second writer so
/// that the two can never disagree on a sample, and so that `metrics --format
/// openmetrics` works against any server: the control socket's `metrics` request keeps
/// answering 0.0.4 and the client re-frames it.
pub(crate) fn to_openmetrics(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8 + 8);
    // The HELP line waiting for its family's TYPE line.
    let mut help: Option<(&str, &str)> = None;
    // The current family: its 0.0.4 name, its OpenMetrics name and its type.
    let mut family: Option<(&str, &str, &str)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, h)) = help.take() {
                // A HELP without a TYPE: an unknown family.
                let _ = writeln!(out, "# HELP {name} {}", openmetrics_help(h));
            }
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let kind = if kind == "untyped" { "unknown" } else { kind };
            let om = match kind {
                "counter" => name.strip_suffix("_total").unwrap_or(name),
                _ => name,
            };
            let _ = writeln!(out, "# TYPE {om} {kind}");
            if let Some(unit) = UNITS
                .iter()
                .find(|u| om.strip_suffix(*u).is_some_and(|head| head.ends_with('_')))
            {
                let _ = writeln!(out, "# UNIT {om} {unit}");
            }
            match help.take() {
                Some((h_name, h)) if h_name == name => {
                    let _ = writeln!(out, "# HELP {om} {}", openmetrics_help(h));
                }
                Some((h_name, h)) => {
                    let _ = writeln!(out, "# HELP {h_name} {}", openmetrics_help(h));
                }
                None => {}
            }
            family = Some((name, om, kind));
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((name, h)) = help.take() {
            let _ = writeln!(out, "# HELP {name} {}", openmetrics_help(h));
        }
        let split = line.find(['{', ' ']).unwrap_or(line.len());
        let (sample, rest) = line.split_at(split);
        match family {
            // A counter's sample is `_total` in OpenMetrics, whatever 0.0.4 called it.
            Some((name, om, "counter")) if sample == name && name == om => {
                let _ = writeln!(out, "{sample}_total{rest}");
            }
            Some((_, om, "histogram")) if sample.strip_suffix("_bucket") == Some(om) => {
                out.push_str(sample);
                out.push_str(&canonical_le(rest));
                out.push('\n');
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if let Some((name, h)) = help {
        let _ = writeln!(out, "# HELP {name} {}", openmetrics_help(h));
    }
    out.push_str("# EOF\n");
    out
}

/// A 0.0.4 HELP text (`\\` and `\n` escaped) escaped for OpenMetrics (`\\`, `\n` and `\"`).
fn openmetrics_help(help: &str) -> String {
    let mut out = String::with_capacity(help.len());
    let mut chars = help.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\\') => out.push_str("\\\\"),
                Some('n') => out.push_str("\\n"),
                // In 0.0.4 any other backslash is itself.
                Some(other) => {
                    out.push_str("\\\\");
                    if other == '"' {
                        out.push('\\');
                    }
                    out.push(other);
                }
                None => out.push_str("\\\\"),
            },
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

/// The labels and value of a histogram bucket (`{le="5"} 42`) with the `le` value as an
/// OpenMetrics canonical number (`{le="5.0"} 42`).
fn canonical_le(rest: &str) -> String {
    let start = ["{le=\"", ",le=\""]
        .iter()
        .find_map(|p| rest.find(p).map(|i| i + p.len()));
    let Some(start) = start else {
        return rest.to_owned();
    };
    let Some(len) = rest[start..].find('"') else {
        return rest.to_owned();
    };
    let value = &rest[start..start + len];
    match value.parse::<f64>() {
        Ok(v) => format!(
            "{}{}{}",
            &rest[..start],
            canonical_number(v),
            &rest[start + len..]
        ),
        // +Inf parses; anything else is left for the scraper to refuse.
        Err(_) => rest.to_owned(),
    }
}

/// A number as OpenMetrics' canonical numbers (those of Go's `strconv.FormatFloat(v, 'g',
/// -1, 64)`, with `.0` on integers): `0.0005`, `5.0`, `100000.0`, `1e+06`, `1e-05`, `+Inf`.
fn canonical_number(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return "0.0".into();
    }
    // The shortest digits that read back as `v`, and the decimal exponent.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        let plain = v.to_string();
        if plain.contains('.') {
            plain
        } else {
            format!("{plain}.0")
        }
    } else {
        format!("{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::control::status::{ListenerStatus, PoolStatus, Totals};
    use crate::net::listener::Addr;

    pub(crate) fn slot(pid: u32, state: State) -> SlotView {
        SlotView {
            pid,
            generation: 0,
            state,
            connections: 0,
            requests: 0,
            bytes_in: 0,
            bytes_out: 0,
            age: Duration::from_secs(75),
            current: None,
            idle_for: Some(Duration::from_millis(1500)),
            peer: None,
            head: Vec::new(),
            durations: [0; DURATION_BUCKETS_US.len() + 1],
            duration_sum: Duration::ZERO,
            denied: 0,
            refused: 0,
            tls_failed: 0,
            errors: 0,
            event: None,
            slow_calls: 0,
            datagrams: Default::default(),
        }
    }

    /// The two workers of [`sample_status`]: an idle one with its last client, and a busy
    /// one serving a request with bytes to escape.
    fn sample_workers() -> (SlotView, SlotView) {
        let mut idle = slot(4101, State::Idle);
        idle.connections = 5;
        idle.requests = 20;
        idle.bytes_in = 1000;
        idle.bytes_out = 2000;
        idle.denied = 3;
        idle.refused = 4;
        idle.tls_failed = 6;
        idle.errors = 2;
        idle.durations[0] = 15;
        idle.durations[3] = 5;
        idle.duration_sum = Duration::from_micros(15 * 300 + 5 * 4000);
        // An idle worker keeps its last client in its slot: not shown.
        idle.peer = Some(Addr::Inet("192.0.2.1:1111".parse().unwrap()));
        let mut busy = slot(4102, State::Handling);
        busy.generation = 1;
        busy.connections = 2;
        busy.requests = 3;
        busy.bytes_in = 300;
        busy.bytes_out = 600;
        busy.datagrams = crate::scoreboard::DatagramCounts {
            received: 100,
            sent: 90,
            bytes_in: 4000,
            bytes_out: 9000,
            denied: 2,
            too_large: 1,
            rate_limited: 5,
            errors: 1,
            send_failed: 1,
        };
        busy.durations[12] = 3; // +Inf
        busy.duration_sum = Duration::from_secs(18);
        busy.current = Some(Duration::from_millis(2250));
        busy.idle_for = None;
        busy.peer = Some(Addr::Inet("[2001:db8::7]:40000".parse().unwrap()));
        busy.head = b"GET /slow?\"q\" HTTP/1.1\r\n\x00\xff\\".to_vec();
        (idle, busy)
    }

    /// The rates of [`sample_status`]: over the last 10 s, and over the 45 s the
    /// history holds of the last minute.
    pub(crate) fn sample_rates() -> [crate::control::history::Rate; 2] {
        use crate::control::history::Rate;
        [
            Rate {
                window: Duration::from_secs(10),
                over: Duration::from_millis(10_400),
                requests: 12.5,
                errors: 0.25,
                bytes_in: 1500.0,
                bytes_out: 6000.0,
            },
            Rate {
                window: Duration::from_secs(60),
                over: Duration::from_secs(45),
                requests: 8.125,
                errors: 0.0,
                bytes_in: 975.0,
                bytes_out: 3900.0,
            },
        ]
    }

    /// The history of [`sample_status`]: a minute of points, a latency where there were
    /// requests.
    pub(crate) fn sample_history() -> Vec<crate::control::history::Point> {
        use crate::control::history::{Gauges, Point};
        (0..12u32)
            .map(|i| Point {
                at: Duration::from_secs(3665 + 5 * u64::from(i)),
                requests_per_second: f64::from(i),
                errors_per_second: if i == 6 { 1.0 } else { 0.0 },
                latency: (i > 0).then_some([0.001, 0.004, 0.02]),
                gauges: Gauges {
                    connections: u64::from(i % 3),
                    workers: [2 - i % 2, 0, i % 2, 0, 0, 0, 0],
                },
            })
            .collect()
    }

    /// A status with two live workers (one idle, one handling a request with binary bytes
    /// in its head), retired counters, a TCP and a Unix listener.
    pub(crate) fn sample_status() -> Status {
        let (idle, busy) = sample_workers();
        let mut retired = Totals {
            connections: 100,
            requests: 400,
            bytes_in: 10_000,
            bytes_out: 50_000,
            ..Totals::default()
        };
        retired.durations[1] = 400;
        retired.duration_sum = Duration::from_millis(300);
        Status {
            name: "unit".into(),
            master_pid: 4100,
            phase: "running",
            uptime: Duration::from_secs(3725),
            grace_period: Duration::from_secs(30),
            drain_delay: Duration::from_millis(2500),
            io: "blocking",
            pool: PoolStatus {
                policy: "static",
                target: 2,
                min_spare: 0,
                max_spare: 0,
                max: 4,
            },
            listeners: vec![
                ListenerStatus {
                    addr: "127.0.0.1:7000".into(),
                    queued: Some(3),
                    backlog: Some(511),
                    datagram: false,
                },
                ListenerStatus {
                    addr: "unix:/tmp/a \"b\"\\.sock".into(),
                    queued: None,
                    backlog: None,
                    datagram: false,
                },
                ListenerStatus {
                    addr: "udp://127.0.0.1:5353".into(),
                    queued: None,
                    backlog: None,
                    datagram: true,
                },
            ],
            workers: vec![(2, busy), (1, idle)],
            scoreboard: "_H..".into(),
            retired,
            max_workers_reached: 7,
            slow_clients: Some(crate::control::status::Held {
                workers: 4,
                held: 3,
                addresses: vec![("192.0.2.7".parse().unwrap(), 3)],
            }),
            penalties: crate::control::status::PenaltyCounts {
                charged: 12,
                refused: 40,
                unrecorded: 1,
                addresses: 2,
            },
            restarts: vec![
                ("exit", 1),
                ("signal", 2),
                ("timeout", 0),
                ("recycled", 4),
                ("backoff", 0),
            ],
            hybrid: None,
            log_dropped: [[0, 1], [2, 3], [0, 0], [0, 0]],
            rates: sample_rates(),
            history: sample_history(),
        }
    }

    #[test]
    fn escapes_make_request_bytes_printable() {
        assert_eq!(escape_bytes(b"GET / HTTP/1.1\r\n"), "GET / HTTP/1.1\\r\\n");
        assert_eq!(
            escape_bytes(b"a\\b\t\x00\x1b[2J\xc3\xa9"),
            "a\\\\b\\t\\x00\\x1b[2J\\xc3\\xa9"
        );
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(to_json("a\"\\\n\u{1}é"), "\"a\\\"\\\\\\n\\u0001é\"");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(human(Duration::from_secs(247)), "4m07s");
        assert_eq!(human(Duration::from_secs(3725)), "1h02m");
        assert_eq!(human(Duration::from_secs(3 * 86_400 + 4 * 3600 + 5)), "3d04h");
        assert_eq!(micros_as_secs(500), "0.0005");
        assert_eq!(micros_as_secs(2_500), "0.0025");
        assert_eq!(micros_as_secs(5_000_000), "5");
        assert_eq!(micros_as_secs(1_250_000), "1.25");
        assert_eq!(micros_as_secs(0), "0");
    }

    #[test]
    fn the_table_shows_the_key_figures() {
        let text = render_text(&sample_status());
        for needle in [
            "unit (master pid 4100)",
            "Phase:         running",
            "Uptime:        1h02m",
            "static, target 2 workers, min spare 0, max spare 0, max 4",
            // Totals include the retired workers.
            "107 connections, 423 requests, 11300 bytes in, 52600 bytes out, 0.11 requests/s",
            "127.0.0.1:7000  queue 3 of backlog 511",
            "exit 1, signal 2, timeout 0, recycled 4, backoff 0",
            "Max workers reached: 7 times",
            "Scoreboard:    _H..",
            "\"_\" idle",
            "\".\" free slot",
            "[2001:db8::7]:40000",
            "2.2s",
            "GET /slow?\"q\" HTTP/1.1\\r\\n\\x00\\xff\\\\",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert!(
            !text.contains("192.0.2.1"),
            "an idle worker's last client is not shown:\n{text}"
        );
        let rows: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("ID")).collect();
        assert_eq!(rows.len(), 3, "a header and one row per worker:\n{text}");
        assert!(
            rows[1].trim_start().starts_with("1 ") && rows[1].contains("4101") && rows[1].contains("idle")
        );
        assert!(
            rows[2].trim_start().starts_with("2 ")
                && rows[2].contains("4102")
                && rows[2].contains("handling")
        );
        // The columns line up: every row starts the PID column at the same place.
        let pid_end = rows[0].find("PID").unwrap() + 3;
        assert_eq!(&rows[1][pid_end - 4..pid_end], "4101");
    }

    #[test]
    fn a_long_scoreboard_wraps() {
        let mut s = sample_status();
        s.scoreboard = "_".repeat(100);
        let text = render_text(&s);
        assert!(text.contains(&format!(
            "Scoreboard:    {}\n               {}\n",
            "_".repeat(64),
            "_".repeat(36)
        )));
    }

    #[test]
    fn json_parses_and_holds_everything() {
        let json = render_json(&sample_status());
        assert!(json.ends_with("}\n") && json.lines().count() == 1);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
        assert_eq!(v["version"], 1);
        assert_eq!(v["name"], "unit");
        assert_eq!(v["master_pid"], 4100);
        assert_eq!(v["phase"], "running");
        assert_eq!(v["uptime_seconds"], 3725);
        assert_eq!(v["grace_period_seconds"], 30);
        assert_eq!(v["drain_delay_seconds"], 2.5);
        assert_eq!(v["pool"]["policy"], "static");
        assert_eq!(v["pool"]["target"], 2);
        assert_eq!(v["pool"]["max"], 4);
        assert_eq!(v["totals"]["connections"], 107);
        assert_eq!(v["totals"]["requests"], 423);
        assert_eq!(v["totals"]["bytes_in"], 11300);
        assert_eq!(v["totals"]["datagrams"]["received"], 100);
        assert_eq!(v["totals"]["datagrams"]["rate_limited"], 5);
        assert_eq!(v["listeners"][2]["addr"], "udp://127.0.0.1:5353");
        assert_eq!(v["listeners"][2]["kind"], "datagram");
        assert_eq!(v["listeners"][0]["kind"], "stream");
        assert_eq!(v["totals"]["bytes_out"], 52600);
        assert_eq!(v["totals"]["denied"], 3);
        assert_eq!(v["totals"]["refused"], 4);
        assert_eq!(v["totals"]["tls_handshake_failures"], 6);
        let buckets = v["totals"]["request_duration_buckets"].as_array().unwrap();
        assert_eq!(buckets.len(), DURATION_BUCKETS_US.len() + 1);
        assert_eq!(buckets[0]["le"], 0.0005);
        assert_eq!(buckets[0]["count"], 15);
        assert_eq!(buckets[1]["count"], 400);
        assert!(buckets[12]["le"].is_null());
        assert_eq!(buckets[12]["count"], 3);
        assert_eq!(v["listeners"][0]["addr"], "127.0.0.1:7000");
        assert_eq!(v["listeners"][0]["queued"], 3);
        assert_eq!(v["listeners"][0]["backlog"], 511);
        assert_eq!(v["listeners"][1]["addr"], "unix:/tmp/a \"b\"\\.sock");
        assert!(v["listeners"][1]["queued"].is_null());
        assert_eq!(v["restarts"]["recycled"], 4);
        assert_eq!(v["max_workers_reached"], 7);
        assert_eq!(v["scoreboard"], "_H..");
        let w = v["workers"].as_array().unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!((w[0]["id"].as_u64(), w[0]["pid"].as_u64()), (Some(1), Some(4101)));
        assert_eq!(w[0]["state"], "idle");
        assert!(w[0]["client"].is_null() && w[0]["request"].is_null() && w[0]["request_seconds"].is_null());
        assert_eq!(w[0]["idle_seconds"], 1.5);
        assert_eq!(w[0]["age_seconds"], 75);
        assert_eq!(w[1]["state"], "handling");
        assert_eq!(w[1]["generation"], 1);
        assert_eq!(w[1]["client"], "[2001:db8::7]:40000");
        assert_eq!(w[1]["request_seconds"], 2.25);
        assert_eq!(w[1]["request"], "GET /slow?\"q\" HTTP/1.1\\r\\n\\x00\\xff\\\\");
        assert_eq!(w[1]["bytes_out"], 600);
    }

    /// A sample: name, labels, value.
    pub(crate) type Sample = (String, Vec<(String, String)>, f64);

    fn valid_name(n: &str) -> bool {
        let mut chars = n.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    /// Reads `name="value",...}` (after the `{`) strictly; returns the labels and what
    /// follows the `}`.
    fn parse_labels<'a>(mut rest: &'a str, line: &str) -> (Vec<(String, String)>, &'a str) {
        let mut labels = Vec::new();
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                return (labels, after);
            }
            let eq = rest.find('=').unwrap_or_else(|| panic!("no = in {line}"));
            let name = &rest[..eq];
            assert!(valid_name(name), "label name {name:?} in {line}");
            let quoted = rest[eq + 1..]
                .strip_prefix('"')
                .unwrap_or_else(|| panic!("unquoted value in {line}"));
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let close = loop {
                let (i, c) = chars.next().unwrap_or_else(|| panic!("unclosed value in {line}"));
                match c {
                    '\\' => match chars.next().map(|(_, c)| c) {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        other => panic!("bad escape {other:?} in {line}"),
                    },
                    '"' => break i,
                    c => value.push(c),
                }
            };
            labels.push((name.to_owned(), value));
            rest = &quoted[close + 1..];
            if let Some(after) = rest.strip_prefix(',') {
                rest = after;
            } else {
                assert!(rest.starts_with('}'), "after a label value in {line}");
            }
        }
    }

    /// A strict reading of the text format 0.0.4, beyond what `prometheus-parse` checks:
    /// each family's HELP and TYPE come once, before its samples, which are contiguous;
    /// names and label names are valid; label values are properly escaped; values parse.
    /// Returns (name, labels, value) of every sample.
    pub(crate) fn strict_parse(text: &str) -> Vec<Sample> {
        assert!(text.ends_with('\n'), "the exposition ends with a newline");
        let mut typed: Vec<String> = Vec::new();
        let mut helped: Vec<String> = Vec::new();
        let mut current: Option<(String, String)> = None; // (family, type)
        let mut done: Vec<String> = Vec::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap();
                assert!(valid_name(name) && !helped.contains(&name.to_owned()), "{line}");
                helped.push(name.to_owned());
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(valid_name(name), "{line}");
                assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind));
                assert!(!typed.contains(&name.to_owned()), "one TYPE per family: {line}");
                assert!(
                    helped.last().map(String::as_str) == Some(name),
                    "HELP before TYPE: {line}"
                );
                if let Some((f, _)) = current.take() {
                    done.push(f);
                }
                typed.push(name.to_owned());
                current = Some((name.to_owned(), kind.to_owned()));
                continue;
            }
            assert!(
                !line.starts_with('#') && !line.is_empty(),
                "unexpected line {line:?}"
            );
            let (name, rest) = match line.find(['{', ' ']) {
                Some(i) => line.split_at(i),
                None => panic!("no value: {line}"),
            };
            assert!(valid_name(name), "{line}");
            let (family, kind) = current.clone().expect("a sample after its TYPE");
            let ok = if kind == "histogram" {
                [
                    format!("{family}_bucket"),
                    format!("{family}_sum"),
                    format!("{family}_count"),
                ]
                .contains(&name.to_owned())
            } else {
                name == family
            };
            assert!(ok, "sample {name} outside its family {family}");
            assert!(!done.contains(&family));
            let (labels, rest) = match rest.strip_prefix('{') {
                Some(l) => parse_labels(l, line),
                None => (Vec::new(), rest),
            };
            let value = rest.strip_prefix(' ').expect("one space before the value");
            let v: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                "NaN" => f64::NAN,
                v => v.parse().unwrap_or_else(|_| panic!("value {v:?} in {line}")),
            };
            samples.push((name.to_owned(), labels, v));
        }
        samples
    }

    #[test]
    fn metrics_parse_back() {
        let text = render_metrics(&sample_status());
        let strict = strict_parse(&text);
        let get = |name: &str, label: Option<(&str, &str)>| {
            strict
                .iter()
                .find(|(n, l, _)| {
                    n == name && label.is_none_or(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
                })
                .unwrap_or_else(|| panic!("no {name} {label:?} in\n{text}"))
                .2
        };
        assert_eq!(get("appsrv_connections_total", None), 107.0);
        assert_eq!(get("appsrv_requests_total", None), 423.0);
        assert_eq!(get("appsrv_bytes_received_total", None), 11300.0);
        assert_eq!(get("appsrv_bytes_sent_total", None), 52600.0);
        assert_eq!(get("appsrv_datagrams_received_total", None), 100.0);
        assert_eq!(get("appsrv_datagrams_sent_total", None), 90.0);
        assert_eq!(get("appsrv_datagram_bytes_received_total", None), 4000.0);
        assert_eq!(get("appsrv_datagram_bytes_sent_total", None), 9000.0);
        assert_eq!(
            get("appsrv_datagrams_dropped_total", Some(("reason", "denied"))),
            2.0
        );
        assert_eq!(
            get("appsrv_datagrams_dropped_total", Some(("reason", "too_large"))),
            1.0
        );
        assert_eq!(get("appsrv_datagrams_rate_limited_total", None), 5.0);
        assert_eq!(get("appsrv_workers", Some(("state", "idle"))), 1.0);
        assert_eq!(get("appsrv_workers", Some(("state", "handling"))), 1.0);
        assert_eq!(get("appsrv_workers", Some(("state", "writing"))), 0.0);
        assert!(!text.contains("state=\"dead\""));
        assert_eq!(strict.iter().filter(|(n, _, _)| n == "appsrv_workers").count(), 7);
        assert_eq!(get("appsrv_workers_target", None), 2.0);
        assert_eq!(
            get("appsrv_listen_queue", Some(("listener", "127.0.0.1:7000"))),
            3.0
        );
        assert_eq!(
            get("appsrv_listen_backlog", Some(("listener", "127.0.0.1:7000"))),
            511.0
        );
        assert!(!text.contains("listener=\"unix:"), "TCP listeners only");
        assert_eq!(get("appsrv_max_workers_reached_total", None), 7.0);
        assert_eq!(get("appsrv_tls_handshake_failures_total", None), 6.0);
        assert_eq!(get("appsrv_penalized_refused_total", None), 40.0);
        assert_eq!(get("appsrv_penalized_addresses", None), 2.0);
        assert_eq!(get("appsrv_penalties_total", None), 12.0);
        assert_eq!(get("appsrv_penalties_unrecorded_total", None), 1.0);
        assert_eq!(
            get("appsrv_worker_restarts_total", Some(("reason", "recycled"))),
            4.0
        );
        assert_eq!(get("appsrv_uptime_seconds", None), 3725.0);
        let buckets: Vec<(String, f64)> = strict
            .iter()
            .filter(|(n, _, _)| n == "appsrv_request_duration_seconds_bucket")
            .map(|(_, l, v)| (l[0].1.clone(), *v))
            .collect();
        assert_eq!(buckets.len(), DURATION_BUCKETS_US.len() + 1);
        assert_eq!(buckets[0], ("0.0005".into(), 15.0));
        assert_eq!(buckets[1], ("0.001".into(), 415.0), "cumulative");
        assert_eq!(buckets[11], ("5".into(), 420.0));
        assert_eq!(buckets[12], ("+Inf".into(), 423.0));
        assert_eq!(get("appsrv_request_duration_seconds_count", None), 423.0);
        assert!((get("appsrv_request_duration_seconds_sum", None) - 18.3245).abs() < 1e-9);

        // And a third-party parser reads it.
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
        let find = |name: &str| scrape.samples.iter().find(|s| s.metric == name).unwrap();
        assert_eq!(
            find("appsrv_connections_total").value,
            prometheus_parse::Value::Counter(107.0)
        );
        assert_eq!(
            find("appsrv_workers_target").value,
            prometheus_parse::Value::Gauge(2.0)
        );
        match &find("appsrv_request_duration_seconds").value {
            prometheus_parse::Value::Histogram(h) => {
                assert_eq!(h.len(), DURATION_BUCKETS_US.len() + 1);
                assert_eq!(h.last().unwrap().less_than, f64::INFINITY);
                assert_eq!(h.last().unwrap().count, 423.0);
            }
            other => panic!("not a histogram: {other:?}"),
        }
        let idle = scrape
            .samples
            .iter()
            .find(|s| s.metric == "appsrv_workers" && s.labels.get("state") == Some("idle"))
            .unwrap();
        assert_eq!(idle.value, prometheus_parse::Value::Gauge(1.0));
        assert!(scrape.docs.contains_key("appsrv_requests_total"));
    }

    /// A strict reading of OpenMetrics 1.0 text: metadata TYPE, UNIT, HELP in that order,
    /// at most once each and before the family's samples; a unit is the name's suffix;
    /// sample names are the family's with its type's suffixes (counters `_total`,
    /// histograms `_bucket`, `_sum`, `_count`), histogram bounds canonical; no other
    /// comment, no blank line; `# EOF` last, once. Returns the families: (name, type,
    /// unit, samples).
    fn strict_openmetrics(text: &str) -> Vec<(String, String, Option<String>, Vec<String>)> {
        let body = text.strip_suffix("# EOF\n").expect("ends with # EOF");
        assert!(!body.contains("# EOF"), "one EOF");
        let mut families: Vec<(String, String, Option<String>, Vec<String>)> = Vec::new();
        let mut seen_help = false;
        for line in body.lines() {
            assert!(!line.is_empty(), "no blank line");
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    valid_name(name) && !families.iter().any(|f| f.0 == name),
                    "{line}"
                );
                assert!(
                    [
                        "counter",
                        "gauge",
                        "histogram",
                        "gaugehistogram",
                        "summary",
                        "info",
                        "stateset",
                        "unknown"
                    ]
                    .contains(&kind),
                    "{line}"
                );
                families.push((name.to_owned(), kind.to_owned(), None, Vec::new()));
                seen_help = false;
                continue;
            }
            let f = families.last_mut().expect("TYPE first");
            if let Some(rest) = line.strip_prefix("# UNIT ") {
                let (name, unit) = rest.split_once(' ').unwrap();
                assert!(
                    name == f.0 && f.2.is_none() && !seen_help && f.3.is_empty(),
                    "{line}"
                );
                assert!(
                    f.0.ends_with(&format!("_{unit}")),
                    "the unit is the name's suffix: {line}"
                );
                f.2 = Some(unit.to_owned());
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                assert!(name == f.0 && !seen_help && f.3.is_empty(), "{line}");
                // Only \\, \n and \" escapes, and no bare quote.
                let mut chars = help.chars();
                while let Some(c) = chars.next() {
                    assert_ne!(c, '"', "a bare quote in {line}");
                    if c == '\\' {
                        assert!(matches!(chars.next(), Some('\\' | 'n' | '"')), "{line}");
                    }
                }
                seen_help = true;
                continue;
            }
            assert!(!line.starts_with('#'), "no other comment: {line}");
            let name = &line[..line.find(['{', ' ']).unwrap()];
            let suffixes: &[&str] = match f.1.as_str() {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                _ => &[""],
            };
            assert!(
                suffixes.iter().any(|s| name.strip_suffix(s) == Some(&f.0)),
                "sample {name} of the {} {}",
                f.1,
                f.0
            );
            if name.ends_with("_bucket") {
                let le = line.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
                assert!(
                    le == "+Inf" || le.contains('.') || le.contains('e'),
                    "canonical le: {line}"
                );
            }
            f.3.push(line.to_owned());
        }
        families
    }

    #[test]
    fn issue_17_openmetrics_reframes_the_exposition() {
        let prom = render_metrics(&event_status());
        assert!(
            !prom.contains("# EOF") && !prom.contains("# UNIT"),
            "0.0.4 has neither"
        );
        let om = to_openmetrics(&prom);
        let families = strict_openmetrics(&om);
        let family = |name: &str| {
            families
                .iter()
                .find(|f| f.0 == name)
                .unwrap_or_else(|| panic!("no family {name} in\n{om}"))
        };
        // Counters: the family without _total, its samples with it.
        let c = family("appsrv_connections");
        assert_eq!(
            (c.1.as_str(), c.3.clone()),
            ("counter", vec!["appsrv_connections_total 107".to_owned()])
        );
        assert!(om.contains("# TYPE appsrv_connections counter\n# HELP appsrv_connections Connections accepted by the workers.\n"));
        let r = family("appsrv_worker_restarts");
        assert_eq!(r.3.len(), 5);
        assert!(
            r.3[3].starts_with("appsrv_worker_restarts_total{reason=\"recycled\"} 4"),
            "{:?}",
            r.3
        );
        // Units.
        assert_eq!(family("appsrv_uptime_seconds").2.as_deref(), Some("seconds"));
        let h = family("appsrv_request_duration_seconds");
        assert_eq!((h.1.as_str(), h.2.as_deref()), ("histogram", Some("seconds")));
        assert!(om.contains(
            "# TYPE appsrv_request_duration_seconds histogram\n# UNIT appsrv_request_duration_seconds seconds\n# HELP "
        ));
        let units: Vec<&str> = families
            .iter()
            .filter(|f| f.2.is_some())
            .map(|f| f.0.as_str())
            .collect();
        assert_eq!(
            units,
            ["appsrv_request_duration_seconds", "appsrv_uptime_seconds"]
        );
        // Canonical bounds; otherwise the samples are the same bytes.
        assert!(h.3.contains(&"appsrv_request_duration_seconds_bucket{le=\"0.0005\"} 15".to_owned()));
        assert!(h.3.contains(&"appsrv_request_duration_seconds_bucket{le=\"5.0\"} 420".to_owned()));
        assert!(h.3.contains(&"appsrv_request_duration_seconds_bucket{le=\"1.0\"} 420".to_owned()));
        let prom_samples: Vec<String> = prom
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                l.replace("{le=\"5\"}", "{le=\"5.0\"}")
                    .replace("{le=\"1\"}", "{le=\"1.0\"}")
            })
            .collect();
        let om_samples: Vec<String> = families.iter().flat_map(|f| f.3.clone()).collect();
        assert_eq!(prom_samples, om_samples);
        // Every family of the 0.0.4 text is there, with its help.
        assert_eq!(
            families.len(),
            prom.lines().filter(|l| l.starts_with("# TYPE ")).count()
        );
        assert_eq!(om.matches("# HELP ").count(), families.len());
    }

    #[test]
    fn issue_17_openmetrics_escapes_help_and_frames_any_family() {
        let text = "# HELP a_total Says \"hi\" \\\\ back\\nslash \\x.\n# TYPE a_total counter\na_total 1\n\
                    # HELP b A bare one.\n# TYPE b counter\nb{x=\"1\"} 2\n\
                    # HELP c_bytes Sizes.\n# TYPE c_bytes gauge\nc_bytes 3\n\
                    # A comment.\n\n# TYPE d untyped\nd 4\n# HELP e_nounit_seconds_x Last.\n";
        let om = to_openmetrics(text);
        assert_eq!(
            om,
            "# TYPE a counter\n# HELP a Says \\\"hi\\\" \\\\ back\\nslash \\\\x.\na_total 1\n\
             # TYPE b counter\n# HELP b A bare one.\nb_total{x=\"1\"} 2\n\
             # TYPE c_bytes gauge\n# UNIT c_bytes bytes\n# HELP c_bytes Sizes.\nc_bytes 3\n\
             # TYPE d unknown\nd 4\n# HELP e_nounit_seconds_x Last.\n# EOF\n"
        );
        assert_eq!(to_openmetrics(""), "# EOF\n");
    }

    #[test]
    fn canonical_numbers_are_those_of_openmetrics() {
        for (v, want) in [
            (0.0005, "0.0005"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.0025, "0.0025"),
            (1.0, "1.0"),
            (5.0, "5.0"),
            (1.7, "1.7"),
            (100_000.0, "100000.0"),
            (1e6, "1e+06"),
            (1.1e23, "1.1e+23"),
            (0.0, "0.0"),
            (f64::INFINITY, "+Inf"),
        ] {
            assert_eq!(canonical_number(v), want, "{v}");
        }
        // Every bound of the duration histogram as Python's prometheus_client writes it.
        let bounds: Vec<String> = DURATION_BUCKETS_US
            .iter()
            .map(|us| canonical_number(*us as f64 / 1e6))
            .collect();
        assert_eq!(
            bounds,
            [
                "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0",
                "5.0"
            ]
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = sample_status();
        s.listeners[0].addr = "odd\"host\\name\n:1".into();
        let text = render_metrics(&s);
        assert!(
            text.contains(r#"appsrv_listen_queue{listener="odd\"host\\name\n:1"} 3"#),
            "{text}"
        );
        let strict = strict_parse(&text);
        assert!(
            strict
                .iter()
                .any(|(n, l, _)| n == "appsrv_listen_queue" && l[0].1 == "odd\"host\\name\n:1")
        );
    }

    /// `sample_status` with two event workers beside the blocking ones: worker 3 with
    /// connections in every state and a handler call running, worker 4 paused, its loop
    /// never turned; and slow calls in a live and a retired worker.
    fn event_status() -> Status {
        use crate::scoreboard::{ConnCounts, EventView};
        let mut s = sample_status();
        s.io = "event";
        let mut busy = slot(4103, State::Handling);
        busy.event = Some(EventView {
            counts: ConnCounts {
                open: 1200,
                reading: 10,
                writing: 3,
                idle_keepalive: 1186,
            },
            handling: true,
            in_flight: 1,
            accepts_paused: false,
            last_turn: Some(Duration::from_millis(2)),
        });
        busy.slow_calls = 5;
        busy.current = Some(Duration::from_millis(2));
        busy.peer = Some(Addr::Inet("198.51.100.9:5555".parse().unwrap()));
        busy.head = b"GET /event HTTP/1.1\r\n".to_vec();
        let mut full = slot(4104, State::Reading);
        full.event = Some(EventView {
            counts: ConnCounts {
                open: 10000,
                reading: 7,
                writing: 0,
                idle_keepalive: 9993,
            },
            handling: false,
            in_flight: 0,
            accepts_paused: true,
            last_turn: None,
        });
        s.workers.push((4, full));
        s.workers.push((3, busy));
        s.retired.slow_calls = 2;
        s
    }

    #[test]
    fn issue_16_status_shows_each_event_workers_connections_and_the_totals() {
        let text = render_text(&event_status());
        assert!(
            text.contains(
                "Connections:   11200 open in 2 event workers: 17 reading, 1 in flight, 3 writing, \
                 11179 idle keep-alive; accepts paused in 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("Slow requests: 7 handler calls over --slow-request\n"),
            "{text}"
        );
        let header = text
            .lines()
            .find(|l| l.starts_with("ID") && l.contains("OPEN"))
            .unwrap_or_else(|| panic!("no event-loop table in\n{text}"));
        let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            words(header),
            [
                "ID",
                "OPEN",
                "READING",
                "IN-FLIGHT",
                "WRITING",
                "IDLE-KA",
                "ACCEPTS",
                "LAST",
                "TURN"
            ]
        );
        let rows: Vec<Vec<String>> = text
            .lines()
            .skip_while(|l| *l != header)
            .skip(1)
            .map(words)
            .collect();
        assert_eq!(
            rows,
            [
                words("3 1200 10 1 3 1186 open 2ms ago"),
                words("4 10000 7 0 0 9993 paused never"),
            ],
            "one row per event worker, by id:\n{text}"
        );
        // The blocking workers' rows are those of a status without event workers, and
        // each event worker has its row in the main table too.
        let main: Vec<&str> = text
            .lines()
            .skip_while(|l| !(l.starts_with("ID") && l.contains("PID")))
            .take_while(|l| !l.is_empty())
            .collect();
        assert_eq!(main.len(), 5, "{text}");
        let plain = render_text(&sample_status());
        let plain_main: Vec<&str> = plain
            .lines()
            .skip_while(|l| !(l.starts_with("ID") && l.contains("PID")))
            .collect();
        assert_eq!(plain_main.len(), 3);
        for (a, b) in main[1..3].iter().zip(&plain_main[1..]) {
            assert_eq!(
                a.split_whitespace().collect::<Vec<_>>(),
                b.split_whitespace().collect::<Vec<_>>()
            );
        }
        assert!(
            !plain.contains("Connections:") && !plain.contains("OPEN") && !plain.contains("Slow requests")
        );
    }

    #[test]
    fn issue_16_status_json_has_the_event_workers_counts() {
        let json = render_json(&event_status());
        let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
        assert_eq!(v["totals"]["slow_requests"], 7);
        let e = &v["event"];
        assert_eq!(
            (e["workers"].as_u64(), e["open"].as_u64(), e["reading"].as_u64()),
            (Some(2), Some(11200), Some(17))
        );
        assert_eq!(
            (
                e["handling"].as_u64(),
                e["writing"].as_u64(),
                e["idle_keepalive"].as_u64()
            ),
            (Some(1), Some(3), Some(11179))
        );
        assert_eq!(e["accepts_paused"], 1);
        let w = v["workers"].as_array().unwrap();
        assert_eq!(w.len(), 4);
        assert!(
            w[0]["event"].is_null() && w[1]["event"].is_null(),
            "blocking workers"
        );
        assert_eq!(w[2]["id"], 3);
        assert_eq!(w[2]["slow_requests"], 5);
        let e3 = &w[2]["event"];
        assert_eq!(
            (
                e3["open"].as_u64(),
                e3["reading"].as_u64(),
                e3["handling"].as_u64()
            ),
            (Some(1200), Some(10), Some(1))
        );
        assert_eq!(
            (e3["writing"].as_u64(), e3["idle_keepalive"].as_u64()),
            (Some(3), Some(1186))
        );
        assert_eq!(e3["accepts_paused"], false);
        assert_eq!(e3["last_turn_seconds"], 0.002);
        let e4 = &w[3]["event"];
        assert_eq!(e4["accepts_paused"], true);
        assert!(e4["last_turn_seconds"].is_null());
        let plain: serde_json::Value = serde_json::from_str(&render_json(&sample_status())).unwrap();
        assert!(plain["event"].is_null());
        assert_eq!(plain["totals"]["slow_requests"], 0);
    }

    #[test]
    fn issue_16_metrics_export_open_connections_paused_accepts_and_slow_requests() {
        let text = render_metrics(&event_status());
        let strict = strict_parse(&text);
        let get = |name: &str, state: Option<&str>| -> Vec<f64> {
            strict
                .iter()
                .filter(|(n, l, _)| {
                    n == name && state.is_none_or(|st| l.iter().any(|(k, v)| k == "state" && v == st))
                })
                .map(|(_, _, v)| *v)
                .collect()
        };
        assert_eq!(get("appsrv_open_connections", Some("reading")), [17.0]);
        assert_eq!(get("appsrv_open_connections", Some("handling")), [1.0]);
        assert_eq!(get("appsrv_open_connections", Some("writing")), [3.0]);
        assert_eq!(get("appsrv_open_connections", Some("idle_keepalive")), [11179.0]);
        assert_eq!(
            get("appsrv_open_connections", None).len(),
            4,
            "no total among the states"
        );
        assert_eq!(get("appsrv_open_connections_all", None), [11200.0]);
        assert_eq!(get("appsrv_accepts_paused", None), [1.0]);
        assert_eq!(
            get("appsrv_slow_requests_total", None),
            [7.0],
            "live and retired workers"
        );
        assert_eq!(
            get("appsrv_connections_total", None),
            [107.0],
            "the counter is unchanged"
        );
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
        let kind = |name: &str| {
            scrape
                .samples
                .iter()
                .find(|s| s.metric == name)
                .unwrap()
                .value
                .clone()
        };
        assert_eq!(
            kind("appsrv_slow_requests_total"),
            prometheus_parse::Value::Counter(7.0)
        );
        assert_eq!(kind("appsrv_accepts_paused"), prometheus_parse::Value::Gauge(1.0));
        assert_eq!(
            kind("appsrv_open_connections_all"),
            prometheus_parse::Value::Gauge(11200.0)
        );
        // Without event workers, the gauges are there, at zero.
        let plain = strict_parse(&render_metrics(&sample_status()));
        for (name, n) in [
            ("appsrv_open_connections", 4),
            ("appsrv_open_connections_all", 1),
            ("appsrv_accepts_paused", 1),
            ("appsrv_slow_requests_total", 1),
        ] {
            let found: Vec<f64> = plain
                .iter()
                .filter(|(m, _, _)| m == name)
                .map(|(_, _, v)| *v)
                .collect();
            assert_eq!(found, vec![0.0; n], "{name}");
        }
    }

    /// `event_status` with a third event worker, 5, running async handlers: 37 requests
    /// in flight on its 50 connections (3 reading, 10 idle keep-alive; an async worker
    /// writes as it goes, so none writing), its slot in the reading state, as the async
    /// driver leaves it.
    fn async_status() -> Status {
        use crate::scoreboard::{ConnCounts, EventView};
        let mut s = event_status();
        let mut tasks = slot(4107, State::Reading);
        tasks.idle_for = None;
        tasks.event = Some(EventView {
            counts: ConnCounts {
                open: 50,
                reading: 3,
                writing: 0,
                idle_keepalive: 10,
            },
            handling: true,
            in_flight: 37,
            accepts_paused: false,
            last_turn: Some(Duration::from_micros(300)),
        });
        s.workers.push((5, tasks));
        s
    }

    /// Requests in flight per event worker (issue 33): the text's `Connections:` line and
    /// `IN-FLIGHT` column, `requests_in_flight` in the JSON (each worker's and the sum),
    /// and the `appsrv_requests_in_flight{worker}` gauge; blocking workers have none.
    #[test]
    fn issue_33_requests_in_flight_per_worker_in_every_output() {
        let s = async_status();
        let text = render_text(&s);
        assert!(
            text.contains(
                "Connections:   11250 open in 3 event workers: 20 reading, 38 in flight, 3 writing, \
                 11189 idle keep-alive; accepts paused in 1\n"
            ),
            "{text}"
        );
        let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        let loops: Vec<Vec<String>> = text
            .lines()
            .skip_while(|l| !(l.starts_with("ID") && l.contains("IN-FLIGHT")))
            .map(words)
            .collect();
        assert_eq!(
            loops,
            [
                words("ID OPEN READING IN-FLIGHT WRITING IDLE-KA ACCEPTS LAST TURN"),
                words("3 1200 10 1 3 1186 open 2ms ago"),
                words("4 10000 7 0 0 9993 paused never"),
                words("5 50 3 37 0 10 open 0ms ago"),
            ],
            "{text}"
        );
        // The column lines up: 37 ends where IN-FLIGHT does.
        let mut table = text.lines().skip_while(|l| !l.contains("IN-FLIGHT"));
        let header = table.next().unwrap();
        let row = table.find(|l| l.trim_start().starts_with("5 ")).unwrap();
        let end = header.find("IN-FLIGHT").unwrap() + "IN-FLIGHT".len();
        assert_eq!(&row[end - 2..end], "37", "{text}");

        let json = render_json(&s);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
        assert_eq!(v["event"]["requests_in_flight"], 38, "the sum: {json}");
        assert_eq!(
            v["event"]["handling"], 38,
            "connections in the handler: the states add up to the open ones"
        );
        assert_eq!(v["event"]["workers"], 3);
        let w = v["workers"].as_array().unwrap();
        let in_flight: Vec<(u64, serde_json::Value)> = w
            .iter()
            .map(|w| {
                (
                    w["id"].as_u64().unwrap(),
                    w["event"]["requests_in_flight"].clone(),
                )
            })
            .collect();
        assert_eq!(
            in_flight,
            [
                (1, serde_json::Value::Null),
                (2, serde_json::Value::Null),
                (3, 1.into()),
                (4, 0.into()),
                (5, 37.into()),
            ]
        );
        assert!(
            json.contains(
                r#""event":{"open":50,"reading":3,"handling":1,"requests_in_flight":37,"writing":0,"idle_keepalive":10,"accepts_paused":false,"last_turn_seconds":0.0003}"#
            ),
            "{json}"
        );

        let metrics = render_metrics(&s);
        assert!(
            metrics.contains(
                "# HELP appsrv_requests_in_flight Requests in flight in each event worker, by slot id \
                 (async handlers: any number, a client-level session counting one; the event loop: 0 or 1).\n\
                 # TYPE appsrv_requests_in_flight gauge\n\
                 appsrv_requests_in_flight{worker=\"3\"} 1\n\
                 appsrv_requests_in_flight{worker=\"4\"} 0\n\
                 appsrv_requests_in_flight{worker=\"5\"} 37\n"
            ),
            "{metrics}"
        );
        let strict = strict_parse(&metrics);
        let samples: Vec<(String, f64)> = strict
            .iter()
            .filter(|(n, _, _)| n == "appsrv_requests_in_flight")
            .map(|(_, l, v)| {
                assert_eq!(l.len(), 1);
                assert_eq!(l[0].0, "worker");
                (l[0].1.clone(), *v)
            })
            .collect();
        assert_eq!(
            samples,
            [("3".into(), 1.0), ("4".into(), 0.0), ("5".into(), 37.0)]
        );
        let scrape = prometheus_parse::Scrape::parse(metrics.lines().map(|l| Ok(l.to_owned()))).unwrap();
        let five = scrape
            .samples
            .iter()
            .find(|x| x.metric == "appsrv_requests_in_flight" && x.labels.get("worker") == Some("5"))
            .unwrap();
        assert_eq!(five.value, prometheus_parse::Value::Gauge(37.0));
        // OpenMetrics: the same samples, a gauge.
        let om = to_openmetrics(&metrics);
        let family = strict_openmetrics(&om)
            .into_iter()
            .find(|f| f.0 == "appsrv_requests_in_flight")
            .unwrap();
        assert_eq!((family.1.as_str(), family.3.len()), ("gauge", 3));
        assert!(om.contains("appsrv_requests_in_flight{worker=\"5\"} 37\n"));

        // Without event workers: no JSON field, no family, no text.
        let plain = sample_status();
        assert!(!render_metrics(&plain).contains("appsrv_requests_in_flight"));
        assert!(!render_json(&plain).contains("requests_in_flight"));
        assert!(!render_text(&plain).contains("in flight") && !render_text(&plain).contains("IN-FLIGHT"));
    }

    /// `sample_status` without workers, listeners, restarts or time.
    /// Issue 41: `status` and `status --json` give the rates now beside the totals: over
    /// the last 10 s and the last minute (or what the master's life covers of it), and the
    /// errors' total.
    #[test]
    fn issue_41_status_text_and_json_have_the_rates_now() {
        let s = sample_status();
        let text = render_text(&s);
        assert!(
            text.contains(
                "\nRates:         last 10s: 12.50 requests/s, 0.25 errors/s, 1500 bytes/s in, 6000 bytes/s out\n\
                 \x20              last 45.0s (since the start): 8.12 requests/s, 0.00 errors/s, 975 bytes/s in, 3900 bytes/s out\n"
            ),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(&render_json(&s)).unwrap();
        assert_eq!(v["totals"]["errors"], 2);
        let ten = &v["rates"]["last_10s"];
        assert_eq!(ten["window_seconds"], 10);
        assert_eq!(ten["over_seconds"], 10.4);
        assert_eq!(ten["requests_per_second"], 12.5);
        assert_eq!(ten["errors_per_second"], 0.25);
        assert_eq!(ten["bytes_in_per_second"], 1500);
        assert_eq!(ten["bytes_out_per_second"], 6000);
        let minute = &v["rates"]["last_60s"];
        assert_eq!(
            (minute["window_seconds"].clone(), minute["over_seconds"].clone()),
            (60.into(), 45.into())
        );
        assert_eq!(minute["requests_per_second"], 8.125);
        // A master before its first sample says so.
        let mut young = sample_status();
        young.rates[0].over = Duration::ZERO;
        young.rates[1] = crate::control::history::Rate {
            window: Duration::from_secs(60),
            over: Duration::from_secs(60),
            ..Default::default()
        };
        let text = render_text(&young);
        assert!(
            text.contains("Rates:         last 10s: no sample yet\n"),
            "{text}"
        );
        assert!(text.contains("               last 1m: 0.00 requests/s"), "{text}");
    }

    fn empty_status() -> Status {
        let mut s = sample_status();
        s.workers.clear();
        s.listeners.clear();
        s.restarts.clear();
        s.scoreboard.clear();
        s.retired = Totals::default();
        s.uptime = Duration::ZERO;
        s.rates = crate::control::history::WINDOWS.map(|window| crate::control::history::Rate {
            window,
            ..Default::default()
        });
        s.history.clear();
        s
    }

    #[test]
    fn an_empty_status_renders() {
        let s = empty_status();
        let text = render_text(&s);
        assert!(
            text.contains("0.00 requests/s") && text.contains("Restarts:      none"),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(&render_json(&s)).unwrap();
        assert_eq!(v["workers"].as_array().unwrap().len(), 0);
        assert_eq!(v["totals"]["requests_per_second"], 0);
        let samples = strict_parse(&render_metrics(&s));
        assert!(
            samples
                .iter()
                .any(|(n, _, v)| n == "appsrv_request_duration_seconds_count" && *v == 0.0)
        );
        assert!(!samples.iter().any(|(n, _, _)| n.starts_with("appsrv_listen_")));
    }

    /// `sample_status` in hybrid mode: a front serving with its loop's counts, and one
    /// starting, whose slot has no loop yet.
    fn hybrid_status() -> Status {
        use crate::scoreboard::{ConnCounts, EventView};
        let mut s = sample_status();
        s.io = "hybrid";
        let mut front = slot(4105, State::Reading);
        front.connections = 20;
        front.requests = 1500;
        front.event = Some(EventView {
            counts: ConnCounts {
                open: 300,
                reading: 20,
                writing: 0,
                idle_keepalive: 280,
            },
            handling: false,
            in_flight: 0,
            accepts_paused: false,
            last_turn: Some(Duration::from_micros(1)),
        });
        let mut starting = slot(4106, State::Starting);
        starting.generation = 2;
        s.hybrid = Some(crate::control::status::Hybrid {
            fronts: vec![(3, front), (5, starting)],
            requests_waiting: 2,
            handed_off: 1500,
        });
        s
    }

    /// `event_status` with the strings and numbers that are easiest to get wrong: a name
    /// and paths with quotes, backslashes, control characters (DEL, backspace, form feed)
    /// and non-ASCII; a reason it is not ready; a Unix client; durations of a microsecond
    /// and of ten years; a rate with many digits.
    fn odd_status() -> Status {
        let mut s = event_status();
        s.name = "odd \"name\"\\\u{7f}\u{8}\u{c}\u{1}\t\u{e9}\n".into();
        s.phase = "starting";
        s.uptime = Duration::from_secs(10 * 365 * 86_400) + Duration::from_micros(123_457);
        s.listeners[1].addr = "unix:/tmp/\u{7f}\u{8}\u{e9}\n\"x\"".into();
        s.slow_clients = None;
        s.restarts.clear();
        for (id, w) in &mut s.workers {
            match id {
                1 => w.idle_for = Some(Duration::from_micros(1)),
                2 => {
                    w.current = Some(Duration::from_micros(7));
                    w.peer = Some(Addr::Unix(Some("/run/\u{e9} \"c\"\n".into())));
                }
                3 => w.event.as_mut().unwrap().last_turn = Some(Duration::from_micros(10)),
                _ => {}
            }
        }
        s.retired.requests += 1_000_003;
        s
    }

    /// The largest number of microseconds `json::Secs` writes exactly: 2^33 seconds.
    const EXACT_MICROS: u128 = (1 << 33) * 1_000_000;

    /// A number of seconds in the JSON status is the exact decimal of its microseconds,
    /// as it was when the document was written by hand: never `75.0`, `1e-6`, or a
    /// neighbouring microsecond.
    #[test]
    fn issue_32_seconds_are_written_exactly() {
        for us in [
            0,
            1,
            7,
            10,
            2_500,
            999_999,
            1_000_000,
            75_000_000,
            EXACT_MICROS - 1,
        ] {
            assert_eq!(to_json(&json::Secs(us)), micros_as_secs(us), "{us} us");
        }
    }

    proptest::proptest! {
        #[test]
        fn issue_32_any_seconds_are_written_exactly(us in 0..EXACT_MICROS) {
            proptest::prop_assert_eq!(to_json(&json::Secs(us)), micros_as_secs(us));
        }
    }

    /// The three renderings of each test status, as they were written before the
    /// renderers were split into a function per section and the JSON into serde types
    /// (issue 32): the rewrite changed no byte. A deliberate change to an output updates
    /// its file under `tests/data/render/`.
    #[test]
    fn issue_32_the_renderings_are_those_of_the_golden_files() {
        let cases: [(&str, Status, [&str; 3]); 5] = [
            (
                "sample",
                sample_status(),
                [
                    include_str!("../../tests/data/render/sample.txt"),
                    include_str!("../../tests/data/render/sample.json"),
                    include_str!("../../tests/data/render/sample.prom"),
                ],
            ),
            (
                "event",
                event_status(),
                [
                    include_str!("../../tests/data/render/event.txt"),
                    include_str!("../../tests/data/render/event.json"),
                    include_str!("../../tests/data/render/event.prom"),
                ],
            ),
            (
                "hybrid",
                hybrid_status(),
                [
                    include_str!("../../tests/data/render/hybrid.txt"),
                    include_str!("../../tests/data/render/hybrid.json"),
                    include_str!("../../tests/data/render/hybrid.prom"),
                ],
            ),
            (
                "odd",
                odd_status(),
                [
                    include_str!("../../tests/data/render/odd.txt"),
                    include_str!("../../tests/data/render/odd.json"),
                    include_str!("../../tests/data/render/odd.prom"),
                ],
            ),
            (
                "empty",
                empty_status(),
                [
                    include_str!("../../tests/data/render/empty.txt"),
                    include_str!("../../tests/data/render/empty.json"),
                    include_str!("../../tests/data/render/empty.prom"),
                ],
            ),
        ];
        for (name, status, [text, json, metrics]) in cases {
            for (ext, got, want) in [
                ("txt", render_text(&status), text),
                ("json", render_json(&status), json),
                ("prom", render_metrics(&status), metrics),
            ] {
                if got != want {
                    // The first difference, with some context (the JSON is one long line).
                    let at = got
                        .bytes()
                        .zip(want.bytes())
                        .position(|(g, w)| g != w)
                        .unwrap_or(got.len().min(want.len()));
                    let line = got.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
                    let around = |s: &str| {
                        let (mut start, mut end) = (at.saturating_sub(60), (at + 60).min(s.len()));
                        while !s.is_char_boundary(start) {
                            start -= 1;
                        }
                        while !s.is_char_boundary(end) {
                            end += 1;
                        }
                        s[start..end].to_owned()
                    };
                    panic!(
                        "{name}.{ext} differs at byte {at} (line {line}):\n got: {:?}\nwant: {:?}\n\nwhole output:\n{got}",
                        around(&got),
                        around(want)
                    );
                }
            }
        }
    }
}

//! The JSON status document ([`render_json`]): the serde types of `mod document`, which
//! mirror the document field for field, written by serde_json with the document's own
//! conventions for numbers and escapes ([`StatusFormatter`]).

use crate::control::status::Status;

/// The version of the JSON document ([`render_json`]'s `version` field).
pub(crate) const JSON_VERSION: u32 = 1;

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
    let mut out = to_json(&document::Document::new(status));
    out.push('\n');
    out
}

/// `value` as compact JSON, with the status document's numbers and escapes
/// ([`StatusFormatter`]).
pub(super) fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
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
mod document {
    use std::net::IpAddr;
    use std::time::Duration;

    use serde::{Serialize, Serializer};

    use super::super::{busy, escape_bytes, requests_per_second, workers_by_id};
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

#[cfg(test)]
mod tests {
    use super::super::micros_as_secs;
    use super::*;
    use crate::control::render::tests::*;
    use crate::scoreboard::DURATION_BUCKETS_US;

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

    /// The largest number of microseconds `document::Secs` writes exactly: 2^33 seconds.
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
            assert_eq!(to_json(&document::Secs(us)), micros_as_secs(us), "{us} us");
        }
    }

    proptest::proptest! {
        #[test]
        fn issue_32_any_seconds_are_written_exactly(us in 0..EXACT_MICROS) {
            proptest::prop_assert_eq!(to_json(&document::Secs(us)), micros_as_secs(us));
        }
    }

    /// Requests in flight per event worker (issue 33) in the JSON: `requests_in_flight`, each
    /// worker's and the sum.
    #[test]
    fn issue_33_requests_in_flight_per_worker_in_the_json() {
        let s = async_status();
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
    }
    #[test]
    fn strings_are_escaped_for_json() {
        assert_eq!(to_json("a\"\\\n\u{1}é"), "\"a\\\"\\\\\\n\\u0001é\"");
    }
}

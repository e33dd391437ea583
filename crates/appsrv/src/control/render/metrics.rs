//! The Prometheus text exposition format 0.0.4 ([`render_metrics`]): one `metrics_*`
//! function per topic of metric families, written through [`Exposition`]; and
//! [`MetricsFormat`], which picks it or its OpenMetrics re-framing
//! ([`to_openmetrics`](super::to_openmetrics)).

use std::fmt::Write as _;

use super::openmetrics::to_openmetrics;
use super::{micros_as_secs, secs, workers_by_id};
use crate::control::status::{Status, Totals};
use crate::scoreboard::{DURATION_BUCKETS_US, State};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::render::tests::*;

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

    /// Requests in flight per event worker (issue 33) in the metrics: the
    /// `appsrv_requests_in_flight{worker}` gauge, in both formats.
    #[test]
    fn issue_33_requests_in_flight_per_worker_in_the_metrics() {
        let s = async_status();
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
    }
    #[test]
    fn a_label_value_with_quotes_backslashes_and_newlines_is_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}

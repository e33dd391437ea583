//! The test statuses every rendering's tests use (and the status page's and the HTTP
//! listener's), strict parsers of the exposition formats, and the tests of every output
//! at once.

use std::time::Duration;

use super::*;
use crate::control::status::{ListenerStatus, PoolStatus, Status, Totals};
use crate::net::listener::Addr;
use crate::scoreboard::{DURATION_BUCKETS_US, SlotView, State};

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

/// A strict reading of OpenMetrics 1.0 text: metadata TYPE, UNIT, HELP in that order,
/// at most once each and before the family's samples; a unit is the name's suffix;
/// sample names are the family's with its type's suffixes (counters `_total`,
/// histograms `_bucket`, `_sum`, `_count`), histogram bounds canonical; no other
/// comment, no blank line; `# EOF` last, once. Returns the families: (name, type,
/// unit, samples).
pub(super) fn strict_openmetrics(text: &str) -> Vec<(String, String, Option<String>, Vec<String>)> {
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

/// `sample_status` with two event workers beside the blocking ones: worker 3 with
/// connections in every state and a handler call running, worker 4 paused, its loop
/// never turned; and slow calls in a live and a retired worker.
pub(super) fn event_status() -> Status {
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

/// `event_status` with a third event worker, 5, running async handlers: 37 requests
/// in flight on its 50 connections (3 reading, 10 idle keep-alive; an async worker
/// writes as it goes, so none writing), its slot in the reading state, as the async
/// driver leaves it.
pub(super) fn async_status() -> Status {
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

/// Requests in flight per event worker (issue 33): blocking workers have none, so without
/// event workers no output has them (their presence with event workers: each output's
/// `issue_33_requests_in_flight_per_worker_in_*` test).
#[test]
fn issue_33_no_requests_in_flight_without_event_workers() {
    // Without event workers: no JSON field, no family, no text.
    let plain = sample_status();
    assert!(!render_metrics(&plain).contains("appsrv_requests_in_flight"));
    assert!(!render_json(&plain).contains("requests_in_flight"));
    assert!(!render_text(&plain).contains("in flight") && !render_text(&plain).contains("IN-FLIGHT"));
}

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

/// `sample_status` without workers, listeners, restarts or time.
pub(super) fn empty_status() -> Status {
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
pub(super) fn hybrid_status() -> Status {
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
pub(super) fn odd_status() -> Status {
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
                include_str!("../../../tests/data/render/sample.txt"),
                include_str!("../../../tests/data/render/sample.json"),
                include_str!("../../../tests/data/render/sample.prom"),
            ],
        ),
        (
            "event",
            event_status(),
            [
                include_str!("../../../tests/data/render/event.txt"),
                include_str!("../../../tests/data/render/event.json"),
                include_str!("../../../tests/data/render/event.prom"),
            ],
        ),
        (
            "hybrid",
            hybrid_status(),
            [
                include_str!("../../../tests/data/render/hybrid.txt"),
                include_str!("../../../tests/data/render/hybrid.json"),
                include_str!("../../../tests/data/render/hybrid.prom"),
            ],
        ),
        (
            "odd",
            odd_status(),
            [
                include_str!("../../../tests/data/render/odd.txt"),
                include_str!("../../../tests/data/render/odd.json"),
                include_str!("../../../tests/data/render/odd.prom"),
            ],
        ),
        (
            "empty",
            empty_status(),
            [
                include_str!("../../../tests/data/render/empty.txt"),
                include_str!("../../../tests/data/render/empty.json"),
                include_str!("../../../tests/data/render/empty.prom"),
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

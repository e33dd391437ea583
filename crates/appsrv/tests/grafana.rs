//! Issue 34: the Grafana dashboard in contrib/grafana/appsrv.json asks only for metrics
//! the server exports. Every metric name in every panel's query (and in the template
//! variables' queries) must be among the samples a running server's `/metrics` answers;
//! with promtool (Debian package `prometheus`), every query must also parse as PromQL.

mod util;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;
use util::*;

fn dashboard() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/grafana/appsrv.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every query of the dashboard: (where, PromQL expression), from each panel's targets
/// (rows' nested panels included) and the template variables.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?");
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("panel {title:?}: a target without expr: {t}"));
                out.push((format!("panel {title:?} ({})", t["refId"]), expr.to_owned()));
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for v in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        let q = &v["query"];
        let query = q["query"].as_str().or(q.as_str()).unwrap_or("");
        // label_values(METRIC{...}, label): the metric is a series selector.
        if let Some(inner) = query
            .strip_prefix("label_values(")
            .and_then(|r| r.rsplit_once(','))
            .map(|(selector, _)| selector)
        {
            out.push((format!("variable {}", v["name"]), inner.to_owned()));
        }
    }
    out
}

/// PromQL's aggregation operators and keywords: never metric names, even when no `(`
/// follows at once (`sum by (le) (...)`).
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
];

/// The metric names a PromQL expression names: the identifiers that are neither a
/// function (followed by `(`), a keyword, a label (inside `{}` or the list after `by`,
/// `without`, `on`, `ignoring`, `group_left`, `group_right`), a string, a number, a
/// duration (inside `[]`, or after `offset`) nor a Grafana variable (`$job`,
/// `${job}`, `$__rate_interval`).
fn metric_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut out = Vec::new();
    let mut i = 0;
    // Skips from an opening bracket to its closing one, strings included.
    let skip_group = |mut i: usize, open: u8, close: u8| -> usize {
        let mut depth = 0;
        while i < b.len() {
            match b[i] {
                q @ (b'"' | b'\'' | b'`') => {
                    i += 1;
                    while i < b.len() && b[i] != q {
                        i += if b[i] == b'\\' { 2 } else { 1 };
                    }
                }
                c if c == open => depth += 1,
                c if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        panic!("unbalanced {} in {expr:?}", open as char);
    };
    let next_non_space = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        j
    };
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' | b'\'' | b'`' => {
                i += 1;
                while i < b.len() && b[i] != c {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'{' => i = skip_group(i, b'{', b'}'),
            b'[' => i = skip_group(i, b'[', b']'),
            b'$' => {
                i += 1;
                if b.get(i) == Some(&b'{') {
                    i = skip_group(i, b'{', b'}');
                } else {
                    while i < b.len() && ident(b[i]) {
                        i += 1;
                    }
                }
            }
            b'0'..=b'9' | b'.' => {
                // A number (0.99, 1e3, 0x1f) or a duration (5m).
                while i < b.len() && (ident(b[i]) || b[i] == b'.') {
                    i += 1;
                }
            }
            c if ident(c) => {
                let start = i;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                let next = next_non_space(i);
                let lower = word.to_ascii_lowercase();
                if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&lower.as_str())
                {
                    // A list of labels may follow.
                    if b.get(next) == Some(&b'(') {
                        i = skip_group(next, b'(', b')');
                    }
                } else if lower == "offset" {
                    // A duration follows.
                    i = next;
                    while i < b.len() && (ident(b[i]) || b[i] == b'-') {
                        i += 1;
                    }
                } else if KEYWORDS.contains(&lower.as_str()) || b.get(next) == Some(&b'(') {
                    // An operator or a function.
                } else {
                    out.push(word.to_owned());
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// The names of the samples in a text exposition (not the families: a histogram's
/// samples are `_bucket`, `_sum` and `_count`, which is what queries name).
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
        .collect()
}

/// The metric names the dashboard's queries name that are not in `exported`, with where.
fn missing(dashboard: &Value, exported: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for (place, expr) in queries(dashboard) {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "{place}: no metric in {expr:?}");
        for name in names {
            if !exported.contains(&name) {
                out.push(format!("{place}: {name} (in {expr})"));
            }
        }
    }
    out
}

/// `/metrics` of a server with event workers (which export
/// `appsrv_requests_in_flight`; every other family is there in every I/O model), after a
/// request so that nothing is empty.
fn scrape() -> String {
    let server = Server::start(
        "http_hello",
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "2",
            "--io",
            "event",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let hello = get_once(server.tcp_addr(), "/", PATIENCE);
    assert!(hello.ends_with("Hello, World!"), "{hello}");
    let mut s = TcpStream::connect(server.metrics_addr()).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    body.to_owned()
}

#[test]
fn issue_34_metric_names_are_read_from_promql() {
    let names = |e: &str| metric_names(e);
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (le) (rate(appsrv_request_duration_seconds_bucket{job=~"$job", le!="x{y}"}[$__rate_interval])))"#
        ),
        ["appsrv_request_duration_seconds_bucket"]
    );
    assert_eq!(
        names("sum(rate(a_total[5m])) / sum without (instance) (b) + on (job) group_left (x) c offset 1h"),
        ["a_total", "b", "c"]
    );
    assert_eq!(
        names(r#"max(appsrv_workers{state="idle"}) by (instance) > bool 0.5"#),
        ["appsrv_workers"]
    );
    assert_eq!(names("vector(1) + time() - 2e3"), Vec::<String>::new());
    assert_eq!(
        names("appsrv_uptime_seconds{job=~\"${job}\"}"),
        ["appsrv_uptime_seconds"]
    );
}

/// Every metric the dashboard's queries name is exported by a running server; a query
/// naming a metric that does not exist fails the check (shown on a copy of the
/// dashboard).
#[test]
fn issue_34_the_grafana_dashboard_names_only_exported_metrics() {
    let dashboard = dashboard();
    assert!(
        dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"
            && dashboard["__inputs"][0]["pluginId"] == "prometheus",
        "the dashboard's datasource is the DS_PROMETHEUS input"
    );
    let all = queries(&dashboard);
    assert!(all.len() >= 10, "{all:?}");
    // Every panel that queries uses the input's datasource.
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "{p}");
        }
    }
    let exported = exported(&scrape());
    assert!(exported.contains("appsrv_requests_total"), "{exported:?}");
    let gone = missing(&dashboard, &exported);
    assert!(
        gone.is_empty(),
        "the dashboard names metrics the server does not export:\n{}\nexported: {exported:?}",
        gone.join("\n")
    );
    // The check can fail: a panel asking for a metric that does not exist.
    let mut wrong = dashboard.clone();
    let panel = wrong["panels"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["targets"].is_array())
        .unwrap();
    panel["targets"][0]["expr"] = Value::from("sum(rate(appsrv_requests_served_total[5m]))");
    let gone = missing(&wrong, &exported);
    assert!(
        gone.len() == 1 && gone[0].contains("appsrv_requests_served_total"),
        "{gone:?}"
    );
}

/// With promtool, every query parses as PromQL (the Grafana variables replaced by values
/// of their kind): each is checked as a recording rule.
fn issue_34_the_grafana_queries_parse_as_promql() {
    let dir = TestDir::new("grafana", "promtool");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, expr)) in queries(&dashboard()).iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "1m")
            .replace("${job}", ".*")
            .replace("$job", ".*")
            .replace("${instance}", ".*")
            .replace("$instance", ".*");
        // A YAML single-quoted scalar: quotes doubled.
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: '{}'\n",
            expr.replace('\'', "''")
        ));
    }
    let path = dir.path("rules.yml");
    std::fs::write(&path, &rules).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules", &path])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check rules: {:?}\n{}{}\non:\n{rules}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![test(
        "issue_34_the_grafana_queries_parse_as_promql",
        &[Need::Program("promtool", "prometheus")],
        issue_34_the_grafana_queries_parse_as_promql,
    )]
}

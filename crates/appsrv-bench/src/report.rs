//! The report: text like ab's and wrk's, or one JSON object (`--json`).

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::framing::Framing;
use crate::run::Outcome;
use crate::stats::ErrorKind;
use crate::worker::Plan;

/// The latency figures reported, as (JSON key, text label, quantile); `None` is the mean.
const LATENCY: [(&str, &str, Option<f64>); 7] = [
    ("min", "min", Some(0.0)),
    ("mean", "mean", None),
    ("p50", "p50", Some(0.5)),
    ("p90", "p90", Some(0.9)),
    ("p99", "p99", Some(0.99)),
    ("p99_9", "p99.9", Some(0.999)),
    ("max", "max", Some(1.0)),
];

fn per_second(n: u64, outcome: &Outcome) -> f64 {
    let secs = outcome.duration.as_secs_f64();
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

/// Latency figures in microseconds, in the order of [`LATENCY`]; `None` without requests.
fn latency(outcome: &Outcome) -> Option<[f64; 7]> {
    let h = &outcome.stats.latency;
    if h.is_empty() {
        return None;
    }
    Some(LATENCY.map(|(_, _, q)| match q {
        None => h.mean(),
        Some(0.0) => h.min() as f64,
        Some(1.0) => h.max() as f64,
        Some(q) => h.value_at_quantile(q) as f64,
    }))
}

/// The `--json` object (its fields are listed in the README and in `--help`).
pub(crate) fn json(addr: &str, plan: &Plan, outcome: &Outcome) -> Value {
    let s = &outcome.stats;
    let errors: serde_json::Map<String, Value> = ErrorKind::ALL
        .iter()
        .map(|&k| (k.key().to_string(), json!(s.error_count(k))))
        .collect();
    let lat = latency(outcome);
    let mut latency_us = serde_json::Map::new();
    for (i, (key, _, q)) in LATENCY.iter().enumerate() {
        let v = match (lat, q) {
            (None, _) => Value::Null,
            (Some(l), None) => json!(l[i]),
            (Some(l), Some(_)) => json!(l[i] as u64),
        };
        latency_us.insert(key.to_string(), v);
    }
    latency_us.insert(
        "stdev".to_string(),
        if lat.is_some() {
            json!(s.latency.stdev())
        } else {
            Value::Null
        },
    );
    json!({
        "target": addr,
        "connections": plan.connections,
        "keep_alive": !plan.reconnect,
        "pipeline": plan.pipeline,
        "rate": plan.rate,
        "warmup_s": plan.warmup.as_secs_f64(),
        "duration_s": outcome.duration.as_secs_f64(),
        "requests": s.completed,
        "requests_per_s": per_second(s.completed, outcome),
        "bytes_read": s.bytes,
        "bytes_read_per_s": per_second(s.bytes, outcome),
        "errors": errors,
        "errors_total": s.total_errors(),
        "unfinished": s.unfinished,
        "non_2xx_3xx": s.non_2xx_3xx,
        "connects": s.connects,
        "warmup_requests": s.warmup_completed,
        "silent_connections": s.silent_connections,
        "latency_us": latency_us,
    })
}

/// A duration given in microseconds, with a unit that keeps it short.
fn human_us(us: f64) -> String {
    if us < 1_000.0 {
        if us.fract() == 0.0 {
            format!("{us:.0}us")
        } else {
            format!("{us:.1}us")
        }
    } else if us < 1_000_000.0 {
        format!("{:.2}ms", us / 1_000.0)
    } else {
        format!("{:.2}s", us / 1_000_000.0)
    }
}

fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} {}", UNITS[0])
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

/// The text report.
pub(crate) fn text(addr: &str, plan: &Plan, outcome: &Outcome) -> String {
    let s = &outcome.stats;
    let mut out = String::new();
    let mode = if plan.reconnect {
        "a new connection per request"
    } else {
        "keep-alive"
    };
    let rate = match plan.rate {
        Some(r) => format!("{r} requests/s"),
        None => "as fast as possible".to_string(),
    };
    let _ = writeln!(
        out,
        "Target:        {addr} ({}, {mode}, pipeline {}, {rate})",
        plural(plan.connections as u64, "connection"),
        plan.pipeline
    );
    let _ = writeln!(out, "Requests:      {} completed", s.completed);
    let warmup = if plan.warmup.is_zero() {
        String::new()
    } else {
        format!(
            ", after {:.3} s of warm-up ({} not counted)",
            plan.warmup.as_secs_f64(),
            plural(s.warmup_completed, "request")
        )
    };
    let _ = writeln!(
        out,
        "Duration:      {:.3} s{warmup}",
        outcome.duration.as_secs_f64()
    );
    let _ = writeln!(out, "Requests/s:    {:.2}", per_second(s.completed, outcome));
    let _ = writeln!(
        out,
        "Transfer:      {} bytes read, {}/s",
        s.bytes,
        human_bytes(per_second(s.bytes, outcome))
    );
    let kinds: Vec<String> = ErrorKind::ALL
        .iter()
        .map(|&k| format!("{} {}", k.label(), s.error_count(k)))
        .collect();
    let _ = writeln!(out, "Errors:        {} ({})", s.total_errors(), kinds.join(", "));
    if s.unfinished > 0 {
        let _ = writeln!(
            out,
            "Unfinished:    {} (in progress when the run ended)",
            s.unfinished
        );
    }
    if matches!(plan.framing, Framing::Http) {
        let _ = writeln!(out, "Non-2xx/3xx:   {}", s.non_2xx_3xx);
    }
    match latency(outcome) {
        None => {
            let _ = writeln!(out, "Latency:       no request completed");
        }
        Some(lat) => {
            let mut labels = String::new();
            let mut values = String::new();
            for (i, (_, label, _)) in LATENCY.iter().enumerate() {
                let _ = write!(labels, "{label:>10}");
                let _ = write!(values, "{:>10}", human_us(lat[i]));
            }
            let _ = writeln!(out, "Latency:     {labels}");
            let _ = writeln!(out, "             {values}");
        }
    }
    if s.silent_connections > 0 && s.completed + s.warmup_completed > 0 {
        let _ = writeln!(
            out,
            "Warning:       {} of {} got no complete response (does the server serve fewer \
             connections at once than -c?)",
            s.silent_connections,
            plural(plan.connections as u64, "connection"),
        );
    }
    out
}

fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

#[cfg(test)]
mod tests {
    use super::{human_bytes, human_us};

    #[test]
    fn human_units() {
        assert_eq!(human_us(12.0), "12us");
        assert_eq!(human_us(38.25), "38.2us");
        assert_eq!(human_us(1_500.0), "1.50ms");
        assert_eq!(human_us(2_500_000.0), "2.50s");
        assert_eq!(human_bytes(500.0), "500 B");
        assert_eq!(human_bytes(2048.0), "2.00 KiB");
        assert_eq!(human_bytes(3.5 * 1024.0 * 1024.0), "3.50 MiB");
    }
}

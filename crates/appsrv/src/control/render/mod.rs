//! The three renderings of a [`Status`]: a table for people, JSON for programs, and the
//! Prometheus text exposition format for monitoring (with its OpenMetrics re-framing).
//! Pure functions of the snapshot, one file per output format:
//!
//! | File | Owns |
//! |---|---|
//! | `text.rs` | [`render_text`], which calls `text_*`, one small function per section, in the order of its output |
//! | `json.rs` | [`render_json`], which serializes the serde types of its `mod document` (they mirror the document field for field) with the document's own number and escape conventions |
//! | `metrics.rs` | [`render_metrics`], which calls `metrics_*` (one per topic of metric families), and [`MetricsFormat`] |
//! | `openmetrics.rs` | [`to_openmetrics`]: the exposition re-framed as OpenMetrics 1.0 |
//! | `tests.rs` | the test statuses and the strict parsers of the outputs, which the files' tests and the status page's share, and the tests of every output at once |
//!
//! This file holds what the renderings and the status page (`page.rs`) share: escapes,
//! durations, workers by id, and the one-sentence summaries of rates, datagrams, hybrid
//! fronts and event workers' connections. `metrics.rs` uses `openmetrics.rs`; the others
//! use only this file.

use std::fmt::Write as _;
use std::time::Duration;

use crate::control::status::Status;
use crate::scoreboard::SlotView;

mod json;
mod metrics;
mod openmetrics;
#[cfg(test)]
pub(crate) mod tests;
mod text;

pub(crate) use json::render_json;
pub(crate) use metrics::{MetricsFormat, render_metrics};
pub(crate) use openmetrics::to_openmetrics;
pub(crate) use text::render_text;

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

//! The status page (`GET /status` on `--metrics-listen`): the [`Status`] snapshot as one
//! HTML document, in the manner of Apache's mod_status `server-status` page. A pure
//! function of the snapshot, as the other renderings (`render/`) are.
//!
//! The page stands alone: inline CSS, no script, no external asset (its responses forbid
//! them: `Content-Security-Policy: default-src 'none'`), and it refreshes itself with a
//! `<meta http-equiv="refresh">` every `refresh` seconds (none for 0). Every string that
//! comes from outside the master's own code (the server's name, a client's address, a
//! request's first bytes, a listener's address, the reason for not being ready) is
//! escaped for HTML ([`escape_html`]); a request's bytes are first made printable as the
//! status table does ([`escape_bytes`]).
//!
//! Sections, in order: the server (phase, readiness and why not, I/O model, generation,
//! uptime, pool), warnings, traffic now (requests, errors and bytes per second over the
//! last 10 s and the last minute beside the totals), the charts of the last 15 minutes
//! (inline SVG drawn by `chart.rs` from the master's history, issue 41), counters,
//! request durations, listeners, the scoreboard line and its key, the workers (each busy
//! one's client, time and request), the event loops, the hybrid fronts.

use std::fmt::Write as _;

use super::chart::{self, Chart, Series};
use super::render::{busy, escape_bytes, human, micros_as_secs, requests_per_second, workers_by_id};
use crate::control::history::{self, Rate, STATES};
use crate::control::status::{Status, Totals};
use crate::scoreboard::{DURATION_BUCKETS_US, SlotView, State};

/// The page's refresh period when `?refresh=N` does not set one, in seconds.
pub(crate) const DEFAULT_REFRESH: u32 = 5;

/// The longest refresh period `?refresh=N` accepts (a day), in seconds.
pub(crate) const MAX_REFRESH: u32 = 86_400;

/// Scoreboard letters per line of the page.
const SCOREBOARD_WIDTH: usize = 64;

/// The page's style: small, readable, printable; state colours keyed by the state's name.
const STYLE: &str = "\
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:1.5em;color:#1d1d1f;background:#fff}\
h1{font-size:1.5em;margin:0 0 .3em}h1 small{font-weight:normal;color:#666;font-size:.6em}\
h2{font-size:1.1em;margin:1.6em 0 .4em;border-bottom:1px solid #ddd;padding-bottom:.2em}\
table{border-collapse:collapse;margin:.2em 0}\
th,td{padding:.15em .7em .15em 0;text-align:left;vertical-align:top}\
table.grid th,table.grid td{padding:.2em .6em;border-bottom:1px solid #eee}\
table.grid thead th{background:#f4f4f6;border-bottom:1px solid #ccc;white-space:nowrap}\
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}\
.kv th{font-weight:600;white-space:nowrap;color:#444}\
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.92em}\
td.req{word-break:break-all;max-width:48em}\
pre.board{background:#f7f7f9;border:1px solid #e3e3e8;padding:.5em .8em;margin:.3em 0;font-size:1.1em;letter-spacing:.2em;line-height:1.5;overflow-x:auto}\
.ready{font-weight:600;padding:.1em .5em;border-radius:.3em}\
.ready.yes{background:#e3f6e5;color:#17601f}.ready.no{background:#fde7e7;color:#8a1414}\
.warn{background:#fff4d6;border:1px solid #f0d27a;padding:.4em .7em;margin:.5em 0}\
.key span{display:inline-block;margin-right:1.2em}\
tr.busy td{background:#fbf7e6}\
.st{font-weight:600;white-space:nowrap}.st-idle{color:#17601f}.st-reading{color:#0b5cad}.st-handling{color:#8a4b00}\
.st-writing{color:#6b2fa3}.st-closing{color:#555}.st-starting{color:#555}.st-finishing{color:#8a1414}\
.muted{color:#777}\
footer{margin-top:2em;color:#666;font-size:.9em}\
.charts{display:flex;flex-wrap:wrap;gap:.8em 1.5em;margin:.4em 0}svg.chart{max-width:100%;height:auto}\
@media (prefers-color-scheme:dark){body{background:#16161a;color:#e6e6e6}\
table.grid thead th{background:#24242a}table.grid td{border-color:#2c2c33}\
pre.board{background:#1f1f24;border-color:#33333b}tr.busy td{background:#2b2715}\
.kv th{color:#bbb}.warn{background:#3a3215;border-color:#6b5a1c}}";

/// `text` escaped for HTML text and attribute values (double- or single-quoted): `&`,
/// `<`, `>`, `"` and `'` become character references; everything else stays. The charts'
/// inline SVG needs the same five, so both use one function.
pub(crate) use super::chart::escape as escape_html;

/// Bytes from a client (a request's first bytes, an address) for the page: printable
/// ASCII as the status table writes them ([`escape_bytes`]), then escaped for HTML.
fn escape_client_bytes(bytes: &[u8]) -> String {
    escape_html(&escape_bytes(bytes))
}

/// The workers' I/O model (`--io`), as the master runs them.
pub(crate) fn io_model(status: &Status) -> &'static str {
    status.io
}

/// The generations of the live workers and fronts, oldest first, without repeats (two
/// during a reload, until the old workers are gone).
fn generations(status: &Status) -> Vec<u32> {
    let fronts = status.hybrid.iter().flat_map(|h| h.fronts.iter());
    let mut g: Vec<u32> = status
        .workers
        .iter()
        .chain(fronts)
        .map(|(_, w)| w.generation)
        .collect();
    g.sort_unstable();
    g.dedup();
    g
}

/// Renders `status` as the status page, refreshing itself every `refresh` seconds (not at
/// all for 0).
pub(crate) fn render_html(status: &Status, refresh: u32) -> String {
    let totals = status.totals();
    let mut out = String::with_capacity(8192 + 512 * status.workers.len());
    let o = &mut out;
    let name = escape_html(&status.name);
    o.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    o.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    if refresh > 0 {
        let _ = writeln!(o, "<meta http-equiv=\"refresh\" content=\"{refresh}\">");
    }
    let _ = writeln!(o, "<title>{name} status</title>");
    let _ = writeln!(o, "<style>{STYLE}</style>\n</head>\n<body>");
    let _ = writeln!(
        o,
        "<h1>{name} <small>master pid {}</small></h1>",
        status.master_pid
    );
    page_server(o, status);
    page_warnings(o, status);
    page_rates(o, status, &totals);
    page_charts(o, status);
    page_counters(o, status, &totals);
    page_durations(o, &totals);
    page_listeners(o, status);
    page_scoreboard(o, status);
    page_workers(o, status);
    page_event_loops(o, status);
    page_fronts(o, status);
    page_footer(o, refresh);
    o.push_str("</body>\n</html>\n");
    out
}

/// A `<tr>` of a key-value table: `key` and `value` are HTML already.
fn kv(o: &mut String, id: &str, key: &str, value: &str) {
    let _ = writeln!(o, "<tr id=\"{id}\"><th>{key}</th><td>{value}</td></tr>");
}

/// The server: phase, readiness (and why not), I/O model, generation, uptime, pool.
fn page_server(o: &mut String, status: &Status) {
    o.push_str("<table class=\"kv\">\n");
    kv(o, "phase", "Phase", &escape_html(status.phase));
    let ready = match status.readiness() {
        Ok(()) => "<span class=\"ready yes\">ready</span>".to_owned(),
        Err(why) => format!("<span class=\"ready no\">not ready</span> {}", escape_html(&why)),
    };
    kv(o, "ready", "Readiness", &ready);
    kv(o, "io", "I/O model", io_model(status));
    let generation = match generations(status).as_slice() {
        [] => "<span class=\"muted\">none (no live worker)</span>".to_owned(),
        [g] => g.to_string(),
        [old @ .., new] => format!(
            "{new} (workers of {} still running)",
            old.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        ),
    };
    kv(o, "generation", "Generation", &generation);
    let secs = status.uptime.as_secs();
    let uptime = if secs >= 60 {
        format!("{} <span class=\"muted\">({secs} s)</span>", human(status.uptime))
    } else {
        human(status.uptime)
    };
    kv(o, "uptime", "Uptime", &uptime);
    let p = &status.pool;
    let pool = match p.policy {
        "dynamic" => format!(
            "dynamic: {} workers wanted now, min spare {}, max spare {}, max {}",
            p.target, p.min_spare, p.max_spare, p.max
        ),
        "ondemand" => format!("ondemand: {} workers wanted now, max {}", p.target, p.max),
        policy => format!("{}: {} workers, max {}", escape_html(policy), p.target, p.max),
    };
    let live = status.workers.len();
    kv(o, "pool", "Pool", &format!("{pool}; {live} live"));
    o.push_str("</table>\n");
}

/// The warnings the table prints: log lines dropped, the pool held by slow clients.
fn page_warnings(o: &mut String, status: &Status) {
    let (error, access) = status.log_dropped_totals();
    if (error, access) != (0, 0) {
        let _ = writeln!(
            o,
            "<p class=\"warn\">Log lines dropped (could not be written): {error} error log, \
             {access} access log.</p>"
        );
    }
    if let Some(held) = &status.slow_clients {
        let _ = writeln!(
            o,
            "<p class=\"warn\" id=\"slow-clients\">{}; consider <code>--max-conns-per-ip</code>.</p>",
            escape_html(&held.to_string())
        );
    }
}

/// A rate's window for a column's head: `last 10 s`, or the time it covers while the
/// master is younger than the window (`last 4.2 s, since the start`).
fn window_head(r: &Rate) -> String {
    if r.over >= r.window {
        match r.window.as_secs() {
            60 => "last minute".to_owned(),
            s => format!("last {s} s"),
        }
    } else {
        format!("last {}, since the start", human(r.over))
    }
}

/// Traffic now (issue 41): requests, errors and bytes, each with its total, its rate over
/// the last 10 s and the last minute, and its mean since the start.
fn page_rates(o: &mut String, status: &Status, t: &Totals) {
    o.push_str("<h2>Traffic</h2>\n<table class=\"grid\" id=\"rates\">\n<thead><tr><th></th><th class=\"n\">Total</th>");
    for r in &status.rates {
        let _ = write!(
            o,
            "<th class=\"n\">per second, {}</th>",
            escape_html(&window_head(r))
        );
    }
    o.push_str("<th class=\"n\">per second, mean since the start</th></tr></thead>\n<tbody>\n");
    // Requests and errors to the hundredth, bytes to the unit.
    type Row = (&'static str, &'static str, u64, usize, fn(&Rate) -> f64);
    let rows: [Row; 4] = [
        ("rate-requests", "Requests", t.requests, 2, |r| r.requests),
        ("rate-errors", "Errors", t.errors, 2, |r| r.errors),
        ("rate-bytes-in", "Bytes received", t.bytes_in, 0, |r| r.bytes_in),
        ("rate-bytes-out", "Bytes sent", t.bytes_out, 0, |r| r.bytes_out),
    ];
    for (id, name, total, decimals, of) in rows {
        let _ = write!(o, "<tr id=\"{id}\"><th>{name}</th><td class=\"n\">{total}</td>");
        for r in &status.rates {
            let _ = write!(o, "<td class=\"n\">{:.decimals$}</td>", of(r));
        }
        let _ = writeln!(
            o,
            "<td class=\"n\">{:.decimals$}</td></tr>",
            requests_per_second(total, status.uptime)
        );
    }
    o.push_str(
        "</tbody>\n</table>\n<p class=\"muted\">Errors: requests that ended in an error (the handler \
         failed, the input was refused, or the request timed out).</p>\n",
    );
}

/// The charts of the last 15 minutes (issue 41), from the master's history: requests and
/// errors per second, the latency quantiles, the connections open, the workers by state.
fn page_charts(o: &mut String, status: &Status) {
    let span = history::SPAN.as_secs_f64();
    let _ = writeln!(
        o,
        "<h2>Last {} minutes</h2>\n<p class=\"muted\">A point every {} s, kept by the master in \
         memory: the history starts again with the master (a restart, a binary upgrade).</p>\n\
         <div class=\"charts\" id=\"charts\">",
        history::SPAN.as_secs() / 60,
        history::POINT_EVERY * history::SAMPLE_EVERY.as_secs() as u32
    );
    let age = |at: std::time::Duration| status.uptime.saturating_sub(at).as_secs_f64();
    let series = |f: &dyn Fn(&history::Point) -> Option<f64>| -> Vec<(f64, Option<f64>)> {
        status.history.iter().map(|p| (age(p.at), f(p))).collect()
    };
    let empty = "no samples yet: a point every 5 s from the master's start";
    let requests = Chart {
        id: "chart-requests",
        title: "Requests per second",
        unit: "requests/s",
        span,
        empty,
        series: vec![
            Series {
                name: "requests",
                colour: "#1f77b4",
                points: series(&|p| Some(p.requests_per_second)),
            },
            Series {
                name: "errors",
                colour: "#d62728",
                points: series(&|p| Some(p.errors_per_second)),
            },
        ],
    };
    let quantile = |i: usize| series(&move |p: &history::Point| p.latency.map(|l| l[i] * 1000.0));
    let latency = Chart {
        id: "chart-latency",
        title: "Request latency",
        unit: "ms",
        span,
        empty,
        series: vec![
            Series {
                name: "p50",
                colour: "#2ca02c",
                points: quantile(0),
            },
            Series {
                name: "p90",
                colour: "#ff7f0e",
                points: quantile(1),
            },
            Series {
                name: "p99",
                colour: "#d62728",
                points: quantile(2),
            },
        ],
    };
    let connections = Chart {
        id: "chart-connections",
        title: "Connections open",
        unit: "connections",
        span,
        empty,
        series: vec![Series {
            name: "open",
            colour: "#9467bd",
            points: series(&|p| Some(p.gauges.connections as f64)),
        }],
    };
    // Each state some worker was in, idle always: seven lines would hide each other.
    let colours = [
        "#17601f", "#0b5cad", "#8a4b00", "#6b2fa3", "#555555", "#999999", "#8a1414",
    ];
    let workers = Chart {
        id: "chart-workers",
        title: "Workers by state",
        unit: "workers",
        span,
        empty,
        series: STATES
            .iter()
            .enumerate()
            .filter(|(i, _)| *i == 0 || status.history.iter().any(|p| p.gauges.workers[*i] > 0))
            .map(|(i, state)| Series {
                name: state.name(),
                colour: colours[i],
                points: series(&|p| Some(f64::from(p.gauges.workers[i]))),
            })
            .collect(),
    };
    for c in [requests, latency, connections, workers] {
        o.push_str(&chart::render(&c));
    }
    o.push_str("</div>\n");
}

/// The counters: traffic, admission, restarts, logs; datagrams, event connections and
/// hybrid mode's figures where they apply.
fn page_counters(o: &mut String, status: &Status, t: &Totals) {
    o.push_str("<h2>Counters</h2>\n<table class=\"kv\">\n");
    let row = |o: &mut String, id: &str, key: &str, value: String| kv(o, id, key, &value);
    row(
        o,
        "connections",
        "Connections accepted",
        t.connections.to_string(),
    );
    row(o, "requests", "Requests", t.requests.to_string());
    row(
        o,
        "rate",
        "Requests per second",
        format!(
            "{:.2} <span class=\"muted\">(mean since the start)</span>",
            requests_per_second(t.requests, status.uptime)
        ),
    );
    if t.requests > 0 {
        let mean = t.duration_sum / u32::try_from(t.requests).unwrap_or(u32::MAX);
        row(o, "mean", "Mean request time", human(mean));
    }
    row(o, "bytes-in", "Bytes received", t.bytes_in.to_string());
    row(o, "bytes-out", "Bytes sent", t.bytes_out.to_string());
    row(
        o,
        "denied",
        "Connections denied / refused",
        format!(
            "{} by <code>--allow</code>/<code>--deny</code>, {} by <code>--max-conns-per-ip</code>",
            t.denied, t.refused
        ),
    );
    row(o, "tls-failed", "TLS handshakes failed", t.tls_failed.to_string());
    row(
        o,
        "slow",
        "Slow requests",
        format!("{} handler calls over <code>--slow-request</code>", t.slow_calls),
    );
    row(
        o,
        "max-reached",
        "Max workers reached",
        format!("{} times", status.max_workers_reached),
    );
    let restarts = if status.restarts.is_empty() {
        "none".to_owned()
    } else {
        status
            .restarts
            .iter()
            .map(|(reason, n)| format!("{} {n}", escape_html(reason)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    row(o, "restarts", "Worker restarts", restarts);
    let p = &status.penalties;
    row(
        o,
        "penalties",
        "Penalties",
        format!(
            "{} charged, {} connections refused, {} addresses refused now, {} unrecorded",
            p.charged, p.refused, p.addresses, p.unrecorded
        ),
    );
    let (error, access) = status.log_dropped_totals();
    row(
        o,
        "log-dropped",
        "Log lines dropped",
        format!("{error} error log, {access} access log"),
    );
    let d = &t.datagrams;
    if d.received > 0 || status.listeners.iter().any(|l| l.datagram) {
        row(o, "datagrams", "Datagrams", super::render::datagram_summary(d));
    }
    let ev = status.event_totals();
    if ev.workers > 0 {
        row(
            o,
            "open-connections",
            "Open connections",
            super::render::connections_summary(&ev),
        );
    }
    if let Some(h) = &status.hybrid {
        row(o, "hybrid", "Hybrid fronts", super::render::hybrid_summary(h));
    }
    o.push_str("</table>\n");
}

/// The request-duration histogram, per bucket (not cumulative), when there were requests.
fn page_durations(o: &mut String, t: &Totals) {
    if t.durations.iter().all(|&n| n == 0) {
        return;
    }
    o.push_str("<h2>Request durations</h2>\n<table class=\"grid\" id=\"durations\">\n<thead><tr>");
    for le in DURATION_BUCKETS_US {
        let _ = write!(
            o,
            "<th class=\"n\">&le; {} s</th>",
            micros_as_secs(u128::from(le))
        );
    }
    o.push_str("<th class=\"n\">more</th></tr></thead>\n<tbody><tr>");
    for n in t.durations {
        let _ = write!(o, "<td class=\"n\">{n}</td>");
    }
    o.push_str("</tr></tbody>\n</table>\n");
}

/// The listeners, with their accept queue and backlog where the kernel tells them.
fn page_listeners(o: &mut String, status: &Status) {
    o.push_str("<h2>Listeners</h2>\n");
    if status.listeners.is_empty() {
        o.push_str("<p class=\"muted\">none</p>\n");
        return;
    }
    o.push_str(
        "<table class=\"grid\" id=\"listeners\">\n<thead><tr><th>Address</th><th>Kind</th>\
         <th class=\"n\">Queued</th><th class=\"n\">Backlog</th></tr></thead>\n<tbody>\n",
    );
    let opt = |v: Option<u32>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    for l in &status.listeners {
        let _ = writeln!(
            o,
            "<tr><td class=\"mono\">{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            escape_client_bytes(l.addr.as_bytes()),
            if l.datagram { "datagram" } else { "stream" },
            opt(l.queued),
            opt(l.backlog)
        );
    }
    o.push_str("</tbody>\n</table>\n");
}

/// The scoreboard line (one letter per slot up to the pool's maximum), wrapped, and its key.
fn page_scoreboard(o: &mut String, status: &Status) {
    o.push_str("<h2>Scoreboard</h2>\n<pre class=\"board\" id=\"scoreboard\">");
    let letters: Vec<char> = status.scoreboard.chars().collect();
    for (i, chunk) in letters.chunks(SCOREBOARD_WIDTH).enumerate() {
        if i > 0 {
            o.push('\n');
        }
        o.push_str(&escape_html(&chunk.iter().collect::<String>()));
    }
    o.push_str("</pre>\n<p class=\"key\">Key: ");
    for state in State::ALL.iter().filter(|s| **s != State::Dead) {
        let _ = write!(
            o,
            "<span><code>{}</code> <span class=\"st st-{1}\">{1}</span></span>",
            state.letter(),
            state.name()
        );
    }
    o.push_str("<span><code>.</code> free slot</span></p>\n");
}

/// A worker's state as the status table names it, with its scoreboard letter.
fn state_cell(state: State) -> String {
    format!(
        "<td class=\"st st-{0}\"><code>{1}</code> {0}</td>",
        state.name(),
        escape_html(&state.letter().to_string())
    )
}

/// The workers, by id: their counters and, while one serves a client, the client, how
/// long the request (or connection) has run, and the request's first bytes.
fn page_workers(o: &mut String, status: &Status) {
    let _ = writeln!(o, "<h2>Workers ({})</h2>", status.workers.len());
    if status.workers.is_empty() {
        o.push_str("<p class=\"muted\">no live worker</p>\n");
        return;
    }
    o.push_str(
        "<table class=\"grid\" id=\"workers\">\n<thead><tr><th class=\"n\">ID</th>\
         <th class=\"n\">PID</th><th class=\"n\">Gen</th><th>State</th>\
         <th class=\"n\">Conns</th><th class=\"n\">Reqs</th><th class=\"n\">Bytes in</th>\
         <th class=\"n\">Bytes out</th><th class=\"n\">Age</th><th>Client</th>\
         <th class=\"n\">Time</th><th>Request</th></tr></thead>\n<tbody>\n",
    );
    for (id, w) in workers_by_id(status) {
        worker_row(o, *id, w);
    }
    o.push_str("</tbody>\n</table>\n");
}

fn worker_row(o: &mut String, id: u32, w: &SlotView) {
    let serving = busy(w);
    let dash = || "<span class=\"muted\">-</span>".to_owned();
    let client = w
        .peer
        .as_ref()
        .filter(|_| serving)
        .map_or_else(dash, |p| escape_client_bytes(p.to_string().as_bytes()));
    let time = w.current.filter(|_| serving).map_or_else(dash, human);
    let request = if serving && !w.head.is_empty() {
        escape_client_bytes(&w.head)
    } else {
        dash()
    };
    let _ = writeln!(
        o,
        "<tr id=\"worker-{id}\"{}><td class=\"n\">{id}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td>{}<td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"mono client\">{client}</td><td class=\"n\">{time}</td>\
         <td class=\"mono req\">{request}</td></tr>",
        if serving { " class=\"busy\"" } else { "" },
        w.pid,
        w.generation,
        state_cell(w.state),
        w.connections,
        w.requests,
        w.bytes_in,
        w.bytes_out,
        human(w.age),
    );
}

/// How long ago an event loop last began a turn: `2ms ago`, or `never`.
fn last_turn(t: Option<std::time::Duration>) -> String {
    t.map_or_else(|| "never".to_owned(), |t| format!("{} ago", human(t)))
}

/// The event workers' loops (none without event workers): their connections by state,
/// their requests in flight, whether they accept, their last turn.
fn page_event_loops(o: &mut String, status: &Status) {
    let loops: Vec<_> = workers_by_id(status)
        .into_iter()
        .filter_map(|(id, w)| w.event.map(|e| (id, e)))
        .collect();
    if loops.is_empty() {
        return;
    }
    o.push_str(
        "<h2>Event loops</h2>\n<table class=\"grid\" id=\"event-loops\">\n<thead><tr>\
         <th class=\"n\">ID</th><th class=\"n\">Open</th><th class=\"n\">Reading</th>\
         <th class=\"n\">In flight</th><th class=\"n\">Writing</th><th class=\"n\">Idle keep-alive</th>\
         <th>Accepts</th><th>Last turn</th></tr></thead>\n<tbody>\n",
    );
    for (id, e) in loops {
        let _ = writeln!(
            o,
            "<tr><td class=\"n\">{id}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
            e.counts.open,
            e.counts.reading,
            e.in_flight,
            e.counts.writing,
            e.counts.idle_keepalive,
            if e.accepts_paused { "paused" } else { "open" },
            last_turn(e.last_turn)
        );
    }
    o.push_str("</tbody>\n</table>\n");
}

/// Hybrid mode's fronts (none without fronts): their hand-offs and connections.
fn page_fronts(o: &mut String, status: &Status) {
    let Some(h) = status.hybrid.as_ref().filter(|h| !h.fronts.is_empty()) else {
        return;
    };
    o.push_str(
        "<h2>Fronts</h2>\n<table class=\"grid\" id=\"fronts\">\n<thead><tr><th class=\"n\">Front</th>\
         <th class=\"n\">PID</th><th class=\"n\">Gen</th><th>State</th><th class=\"n\">Conns</th>\
         <th class=\"n\">Handed off</th><th class=\"n\">Open</th><th class=\"n\">Reading</th>\
         <th class=\"n\">Idle keep-alive</th><th>Last turn</th></tr></thead>\n<tbody>\n",
    );
    for (id, f) in &h.fronts {
        let e = f.event.unwrap_or_default();
        let _ = writeln!(
            o,
            "<tr><td class=\"n\">{id}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>{}\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            f.pid,
            f.generation,
            state_cell(f.state),
            f.connections,
            f.requests,
            e.counts.open,
            e.counts.reading,
            e.counts.idle_keepalive,
            last_turn(e.last_turn)
        );
    }
    o.push_str("</tbody>\n</table>\n");
}

/// How the page refreshes, and where the same figures are for programs.
fn page_footer(o: &mut String, refresh: u32) {
    o.push_str("<footer>");
    if refresh > 0 {
        let _ = write!(
            o,
            "This page refreshes every {refresh} s (<code>?refresh=N</code> sets the period, \
             <code>?refresh=0</code> stops it)."
        );
    } else {
        o.push_str("This page does not refresh (<code>?refresh=N</code> refreshes it every N s).");
    }
    o.push_str(
        " The same as JSON: <a href=\"/status?json\">/status?json</a> (as <code>status --json</code>); \
         for Prometheus: <a href=\"/metrics\">/metrics</a>; health: <a href=\"/healthz\">/healthz</a>, \
         <a href=\"/readyz\">/readyz</a>.</footer>\n",
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::control::render::tests::{sample_status, slot};
    use crate::net::listener::Addr;
    use crate::scoreboard::EventView;

    #[test]
    fn issue_34_escape_html_escapes_the_five_characters() {
        assert_eq!(
            escape_html("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(escape_html("plain é"), "plain é");
        // A request's bytes: printable first, then HTML.
        assert_eq!(
            escape_client_bytes(b"GET /<b> HTTP/1.1\r\n\x00\xff"),
            "GET /&lt;b&gt; HTTP/1.1\\r\\n\\x00\\xff"
        );
    }

    /// Every string from outside the master is escaped: the name, a client, a request, a
    /// listener's address, the reason for not being ready.
    #[test]
    fn issue_34_the_page_escapes_what_clients_send() {
        let mut s = sample_status();
        s.name = "evil<i>name".into();
        s.listeners[1].addr = "unix:/tmp/<x>&.sock".into();
        let busy = &mut s.workers.iter_mut().find(|(id, _)| *id == 2).unwrap().1;
        busy.head = b"GET /<script>alert(1)</script>?a=\"b\"&c='d' HTTP/1.1\r\n".to_vec();
        busy.peer = Some(Addr::Unix(Some("/tmp/<peer>.sock".into())));
        let html = render_html(&s, 5);
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<i>") && !html.contains("<x>") && !html.contains("<peer>"));
        assert!(html.contains("<title>evil&lt;i&gt;name status</title>"), "{html}");
        assert!(
            html.contains(
                "GET /&lt;script&gt;alert(1)&lt;/script&gt;?a=&quot;b&quot;&amp;c=&#39;d&#39; HTTP/1.1\\r\\n"
            ),
            "{html}"
        );
        assert!(html.contains("unix:/tmp/&lt;peer&gt;.sock"), "{html}");
        assert!(html.contains("unix:/tmp/&lt;x&gt;&amp;.sock"), "{html}");
        // No script at all, no external asset.
        assert!(!html.contains("<script") && !html.contains("src=") && !html.contains("<link"));
    }

    #[test]
    fn issue_34_a_busy_slot_shows_its_client_time_and_request() {
        let html = render_html(&sample_status(), 5);
        let row = html
            .lines()
            .find(|l| l.starts_with("<tr id=\"worker-2\""))
            .unwrap_or_else(|| panic!("no row for worker 2:\n{html}"));
        assert!(row.contains("class=\"busy\""), "{row}");
        assert!(
            row.contains("4102") && row.contains("<code>H</code> handling"),
            "{row}"
        );
        assert!(row.contains("[2001:db8::7]:40000"), "{row}");
        assert!(row.contains(">2.2s<"), "{row}");
        assert!(
            row.contains("GET /slow?&quot;q&quot; HTTP/1.1\\r\\n\\x00\\xff\\\\"),
            "{row}"
        );
        // The idle worker's last client is not shown, nor is it busy.
        let idle = html
            .lines()
            .find(|l| l.starts_with("<tr id=\"worker-1\""))
            .unwrap();
        assert!(
            !idle.contains("busy") && idle.contains("<code>_</code> idle"),
            "{idle}"
        );
        assert!(!html.contains("192.0.2.1:1111"), "{html}");
        // The rest of the page: server, counters, listeners, scoreboard, refresh.
        for needle in [
            "<meta http-equiv=\"refresh\" content=\"5\">",
            "<h1>unit <small>master pid 4100</small></h1>",
            "<span class=\"ready yes\">ready</span>",
            "<tr id=\"io\"><th>I/O model</th><td>blocking</td></tr>",
            "<tr id=\"generation\"><th>Generation</th><td>1 (workers of 0 still running)</td></tr>",
            "1h02m",
            "static: 2 workers, max 4; 2 live",
            "<tr id=\"connections\"><th>Connections accepted</th><td>107</td></tr>",
            "<tr id=\"requests\"><th>Requests</th><td>423</td></tr>",
            "exit 1, signal 2, timeout 0, recycled 4, backoff 0",
            "7 times",
            "127.0.0.1:7000",
            ">511<",
            "udp://127.0.0.1:5353",
            "100 received, 90 answered",
            "12 charged, 40 connections refused, 2 addresses refused now, 1 unrecorded",
            "3 of 4 workers held for 10s or more by slow or idle clients: 192.0.2.7 (3)",
            "<pre class=\"board\" id=\"scoreboard\">_H..</pre>",
            "<code>R</code> <span class=\"st st-reading\">reading</span>",
            "<a href=\"/status?json\">",
        ] {
            assert!(html.contains(needle), "missing {needle:?} in\n{html}");
        }
        assert!(html.starts_with("<!DOCTYPE html>\n") && html.ends_with("</html>\n"));
    }

    /// Issue 41: the page gives the rates now beside the totals, and the last 15 minutes
    /// in four charts drawn as inline SVG with their titles; it says that the history
    /// starts again with the master; still no script.
    #[test]
    fn issue_41_the_page_has_the_rates_now_and_the_charts() {
        let html = render_html(&sample_status(), 5);
        let rates = html
            .split("<table class=\"grid\" id=\"rates\">")
            .nth(1)
            .and_then(|t| t.split("</table>").next())
            .unwrap_or_else(|| panic!("no rates table in\n{html}"));
        for needle in [
            "<th class=\"n\">per second, last 10 s</th>",
            "<th class=\"n\">per second, last 45.0s, since the start</th>",
            "<tr id=\"rate-requests\"><th>Requests</th><td class=\"n\">423</td><td class=\"n\">12.50</td><td class=\"n\">8.12</td><td class=\"n\">0.11</td></tr>",
            "<tr id=\"rate-errors\"><th>Errors</th><td class=\"n\">2</td><td class=\"n\">0.25</td>",
            "<tr id=\"rate-bytes-in\"><th>Bytes received</th><td class=\"n\">11300</td><td class=\"n\">1500</td><td class=\"n\">975</td><td class=\"n\">3</td></tr>",
            "<tr id=\"rate-bytes-out\"><th>Bytes sent</th><td class=\"n\">52600</td><td class=\"n\">6000</td>",
        ] {
            assert!(rates.contains(needle), "missing {needle:?} in\n{rates}");
        }
        assert!(html.contains("<h2>Last 15 minutes</h2>"), "{html}");
        assert!(
            html.contains("the history starts again with the master"),
            "{html}"
        );
        for (id, title) in [
            ("chart-requests", "Requests per second"),
            ("chart-latency", "Request latency"),
            ("chart-connections", "Connections open"),
            ("chart-workers", "Workers by state"),
        ] {
            let svg = html
                .split(&format!("<svg class=\"chart\" id=\"{id}\""))
                .nth(1)
                .and_then(|t| t.split("</svg>").next())
                .unwrap_or_else(|| panic!("no chart {id} in\n{html}"));
            assert!(
                svg.contains(&format!("<title id=\"{id}-title\">{title}</title>")),
                "{svg}"
            );
            assert!(svg.contains("<polyline"), "{id} draws its points: {svg}");
        }
        // The sample's last point: 11 requests/s, an error a second at the 7th, latencies
        // of 1, 4 and 20 ms, the workers idle and handling (only the states that occur).
        assert!(
            html.contains("requests latest 11, lowest 0, highest 11"),
            "{html}"
        );
        assert!(html.contains("errors latest 0, lowest 0, highest 1"), "{html}");
        assert!(html.contains("p99 latest 20, lowest 20, highest 20"), "{html}");
        assert!(
            html.contains("idle latest 1, lowest 1, highest 2; handling latest 1"),
            "{html}"
        );
        assert!(!html.contains("reading latest"), "{html}");
        assert!(!html.contains("<script"), "{html}");
        // A master with no point yet: the charts say so.
        let mut young = sample_status();
        young.history.clear();
        let html = render_html(&young, 5);
        assert_eq!(html.matches("<svg class=\"chart\"").count(), 4);
        assert!(
            html.contains(">no samples yet: a point every 5 s from the master&#39;s start</text>"),
            "{html}"
        );
    }

    /// Issue 41: what the history samples of a snapshot: the connections open (here a
    /// blocking worker busy with a client: one) and the workers by state.
    #[test]
    fn issue_41_gauges_count_connections_and_workers_by_state() {
        let mut s = sample_status();
        let g = s.gauges();
        assert_eq!(g.workers, [1, 0, 1, 0, 0, 0, 0]);
        assert_eq!(g.connections, 1);
        // Event workers count their connections; hybrid fronts what they hold.
        let mut ev = slot(4200, State::Reading);
        ev.event = Some(EventView {
            counts: crate::scoreboard::ConnCounts {
                open: 40,
                ..Default::default()
            },
            ..EventView::default()
        });
        s.workers.push((3, ev));
        assert_eq!(s.gauges().connections, 41);
        assert_eq!(s.gauges().workers, [1, 1, 1, 0, 0, 0, 0]);
    }

    #[test]
    fn issue_34_a_server_not_ready_says_why() {
        let mut s = sample_status();
        s.phase = "stopping";
        let html = render_html(&s, 5);
        assert!(
            html.contains("<span class=\"ready no\">not ready</span> stopping"),
            "{html}"
        );
        let mut s = sample_status();
        for (_, w) in &mut s.workers {
            w.state = State::Starting;
        }
        let html = render_html(&s, 5);
        assert!(
            html.contains("<span class=\"ready no\">not ready</span> no live worker (2 starting)"),
            "{html}"
        );
        // No workers at all: no generation to tell.
        s.workers.clear();
        let html = render_html(&s, 5);
        assert!(html.contains("no live worker</p>"), "{html}");
    }

    #[test]
    fn issue_34_the_refresh_period_and_the_io_model() {
        let mut s = sample_status();
        assert!(render_html(&s, 30).contains("<meta http-equiv=\"refresh\" content=\"30\">"));
        let still = render_html(&s, 0);
        assert!(!still.contains("http-equiv"), "{still}");
        assert!(still.contains("does not refresh"));
        // An event worker: the I/O model, the loops' table, the open connections.
        let mut ev = slot(4200, State::Reading);
        ev.event = Some(EventView {
            in_flight: 3,
            last_turn: Some(Duration::from_millis(4)),
            ..EventView::default()
        });
        s.workers.push((3, ev));
        s.io = "event";
        let html = render_html(&s, 5);
        assert!(html.contains("<td>event</td>"), "{html}");
        assert!(html.contains("id=\"event-loops\""), "{html}");
        assert!(html.contains("4ms ago"), "{html}");
        s.io = "hybrid";
        s.hybrid = Some(crate::control::status::Hybrid::default());
        assert!(render_html(&s, 5).contains("<td>hybrid</td>"));
    }
}

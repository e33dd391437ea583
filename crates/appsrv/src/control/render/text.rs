//! The status table ([`render_text`]), in the manner of Apache's mod_status: one small
//! function per section, `text_*`, in the order of its output.

use std::fmt::Write as _;

use super::{
    busy, connections_summary, datagram_summary, escape_bytes, human, hybrid_summary, rate_summary,
    requests_per_second, workers_by_id,
};
use crate::control::status::{Status, Totals};
use crate::scoreboard::EventView;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::render::tests::*;

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

    /// Requests in flight per event worker (issue 33) in the table: the `Connections:` line
    /// and the `IN-FLIGHT` column of each event worker.
    #[test]
    fn issue_33_requests_in_flight_per_worker_in_the_table() {
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
    }
}

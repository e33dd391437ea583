//! Issue 34: the status page (`GET /status` on `--metrics-listen`) as a browser shows it,
//! and `/status?json`, through a real server.
//!
//! The browser is headless Chromium (Debian package `chromium`), which renders the page
//! and prints the resulting DOM (`--dump-dom`). Without it the test is reported ignored,
//! with the reason (it runs from tests/conditional.rs, issue 41); with `CI` set (.ci/run,
//! which installs it) it fails instead.

mod util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use util::*;

/// Starts `http_hello` (blocking workers, whose slots show the client and the request
/// they serve) with `workers` workers, the control socket in `dir` and the metrics
/// listener on a free port.
fn start(dir: &TestDir, workers: usize) -> Server {
    let w = workers.to_string();
    let sock = dir.path("ctl.sock");
    let server = Server::start(
        "http_hello",
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            &w,
            "--io",
            "blocking",
            "--control",
            &sock,
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    server.wait_for_workers(workers);
    server
}

/// `http_hello status --json` through the control socket in `dir`, parsed.
fn status_json(dir: &TestDir) -> serde_json::Value {
    let out = Command::new(example("http_hello"))
        .args(["status", "--json", "--control", &dir.path("ctl.sock")])
        .stdin(Stdio::null())
        .output()
        .expect("run http_hello status");
    assert!(out.status.success(), "status --json: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Sends `request` to `addr` and reads the whole response: (head, body).
fn http(addr: &str, request: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {out:?}"));
    (head.to_owned(), body.to_owned())
}

/// A headless Chromium run, confined to a private directory (its profile, and its
/// configuration, where the crash handler it starts in a session of its own keeps its
/// database). Dropping it kills every process it started: its process group, and any
/// process whose command line names the directory; then waits until none is left.
struct Chromium {
    dir: TestDir,
    pgid: Option<i32>,
}

impl Chromium {
    fn new(tag: &str) -> Chromium {
        Chromium {
            dir: TestDir::new("chromium", tag),
            pgid: None,
        }
    }

    /// Loads `url` and returns the DOM once the page is rendered (`--dump-dom`); fails
    /// after [`PATIENCE`].
    fn dump_dom(&mut self, url: &str) -> String {
        let mut cmd = Command::new("chromium");
        cmd.args([
            "--headless",
            // As root, Chromium's sandbox refuses to start.
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-sync",
            "--disable-crash-reporter",
            "--disable-dev-shm-usage",
        ])
        // One argument: `--user-data-dir PATH` would make PATH a second page to load.
        .arg(format!("--user-data-dir={}", self.dir.path("profile")))
        .args(["--dump-dom", url])
        .env("HOME", &self.dir.0)
        .env("XDG_CONFIG_HOME", self.dir.path("config"))
        .env("XDG_CACHE_HOME", self.dir.path("cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
        let mut child = cmd.spawn().expect("start chromium");
        self.pgid = Some(child.id() as i32);
        // Read both pipes in threads, so that a chatty browser never blocks on a full pipe.
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for chromium") {
                break status;
            }
            if Instant::now() >= deadline {
                self.kill();
                let _ = child.wait();
                panic!(
                    "chromium did not finish within {PATIENCE:?}; stderr:\n{}",
                    err.join().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20)); // polling a condition, not synchronising
        };
        // Its helpers may keep the pipes open a moment after it exits: stop them first.
        self.kill();
        let (dom, stderr) = (out.join().unwrap(), err.join().unwrap());
        assert!(
            status.success() && !dom.is_empty(),
            "chromium: {status:?}; stderr:\n{stderr}"
        );
        dom
    }

    /// Kills what the run left and waits until none of it is alive.
    fn kill(&self) {
        let mut left = Vec::new();
        let done = wait_until(|| {
            if let Some(pgid) = self.pgid {
                // SAFETY: kill(2) on the process group made for this run.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
            }
            left = processes_naming(&self.dir.0);
            for pid in &left {
                // SAFETY: kill(2) on a process started by this run (it names our directory).
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            let group = self.pgid.is_some_and(group_alive);
            (!group && left.is_empty()).then_some(())
        });
        assert!(done.is_some(), "chromium processes left behind: {left:?}");
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Kill without asserting again: a second panic would abort the test binary.
            if let Some(pgid) = self.pgid {
                // SAFETY: as in `kill`.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
            }
            for pid in processes_naming(&self.dir.0) {
                // SAFETY: as in `kill`.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        } else {
            self.kill();
        }
    }
}

/// The element of `dom` that starts with `start` (an opening tag, e.g. `<tr id="io"`) up
/// to the first `end` after it (`</tr>`).
fn element<'a>(dom: &'a str, start: &str, end: &str) -> &'a str {
    let from = dom
        .find(start)
        .unwrap_or_else(|| panic!("no {start:?} in the page:\n{dom}"));
    let len = dom[from..]
        .find(end)
        .unwrap_or_else(|| panic!("no {end:?} after {start:?}:\n{dom}"));
    &dom[from..from + len + end.len()]
}

/// Issue 34: a browser renders the status page while a request runs: the busy worker with
/// that request's path and its client, the I/O model and the readiness appear in the DOM.
fn issue_34_a_browser_shows_the_busy_worker_on_the_status_page() {
    let dir = TestDir::new("status-page", "browser");
    let server = start(&dir, 2);
    let metrics = server.metrics_addr();
    // A slow request, on a connection we hold: the worker sleeps in the handler, 10 s
    // (http_hello's most) for each of three requests sent at once, which it serves one
    // after the other: 30 s busy with our client and that request, however slowly the
    // browser starts.
    let mut client = TcpStream::connect(server.tcp_addr()).unwrap();
    client
        .write_all(
            b"GET /sleep?ms=10000 HTTP/1.1\r\nHost: test\r\n\r\n"
                .repeat(3)
                .as_slice(),
        )
        .unwrap();
    let me = client.local_addr().unwrap().to_string();
    // Wait for the master to see it (not a sleep): the slot busy with our client.
    let mut last = serde_json::Value::Null;
    let busy = wait_until(|| {
        last = status_json(&dir);
        last["workers"]
            .as_array()?
            .iter()
            .find(|w| w["client"] == me.as_str() && w["state"] == "handling")
            .cloned()
    })
    .unwrap_or_else(|| panic!("the worker never showed our request; last status: {last}"));
    let id = busy["id"].as_u64().unwrap();
    let pid = busy["pid"].as_u64().unwrap();

    let mut browser = Chromium::new("busy");
    let dom = browser.dump_dom(&format!("http://{metrics}/status?refresh=60"));
    drop(browser);

    let row = element(&dom, &format!("<tr id=\"worker-{id}\""), "</tr>");
    assert!(row.contains("class=\"busy\""), "{row}");
    assert!(row.contains(&format!(">{pid}<")), "{row}");
    assert!(row.contains("handling"), "{row}");
    assert!(row.contains(&me), "the client {me} is not in {row}");
    // The request's summary: its method and path, not its query (issue 41).
    assert!(row.contains(">GET /sleep<"), "{row}");
    let io = element(&dom, "<tr id=\"io\"", "</tr>");
    assert!(io.contains("<td>blocking</td>"), "{io}");
    let ready = element(&dom, "<tr id=\"ready\"", "</tr>");
    assert!(ready.contains("ready yes"), "{ready}");
    assert!(
        dom.contains("<meta http-equiv=\"refresh\" content=\"60\">"),
        "{dom}"
    );
    // The other worker is idle, without a client.
    let other = 3 - id;
    let idle = element(&dom, &format!("<tr id=\"worker-{other}\""), "</tr>");
    assert!(!idle.contains("busy") && idle.contains("idle"), "{idle}");
    // Issue 41: the rates now beside the totals, and the four charts of the last 15
    // minutes, inline SVG elements in the DOM with their titles (drawn by the server: the
    // page runs no script).
    let rates = element(&dom, "<table class=\"grid\" id=\"rates\"", "</table>");
    assert!(
        rates.contains("per second, last ") && rates.contains("<tr id=\"rate-errors\"><th>Errors</th>"),
        "{rates}"
    );
    for (id, title) in [
        ("chart-requests", "Requests per second"),
        ("chart-latency", "Request latency"),
        ("chart-connections", "Connections open"),
        ("chart-workers", "Workers by state"),
    ] {
        let svg = element(&dom, &format!("<svg class=\"chart\" id=\"{id}\""), "</svg>");
        assert!(
            svg.contains(&format!("<title id=\"{id}-title\">{title}</title>")),
            "{svg}"
        );
        assert!(
            svg.contains(&format!("<desc id=\"{id}-desc\">over the last 15 min")),
            "{svg}"
        );
        assert!(
            svg.contains(">now</text>") && svg.contains(">last 15 min</text>"),
            "{svg}"
        );
    }
    // The page loaded nothing else and ran nothing: no script element in the DOM.
    assert!(!dom.contains("<script"), "{dom}");
    drop(client);
}

/// The description of chart `id` on `page` (its text alternative: each series' latest,
/// lowest and highest value).
fn chart_desc<'a>(page: &'a str, id: &str) -> &'a str {
    let svg = element(page, &format!("<svg class=\"chart\" id=\"{id}\""), "</svg>");
    element(svg, &format!("<desc id=\"{id}-desc\">"), "</desc>")
}

/// Series `name`'s `which` value (`latest`, `highest`) in a chart's description, as drawn.
fn chart_value(desc: &str, name: &str, which: &str) -> Option<f64> {
    let from = desc.find(&format!("{name} latest "))?;
    let rest = &desc[from..];
    let at = rest.find(&format!("{which} "))? + which.len() + 1;
    let v = rest[at..].split([',', ';', '<']).next()?;
    let (n, scale) = match v.strip_suffix('k') {
        Some(n) => (n, 1e3),
        None => (
            v.strip_suffix('M').map_or(v, |n| n),
            if v.ends_with('M') { 1e6 } else { 1.0 },
        ),
    };
    n.parse::<f64>().ok().map(|n| n * scale)
}

/// The most requests [`under_bounded_load`] sends.
const LOAD_CAP: u64 = 1_000_000;

/// Runs `during` while one client loads `addr` with `GET /` on a keep-alive connection,
/// until `during` returns (or panics) or [`LOAD_CAP`] requests were answered: bounded in
/// count as in time. `during` is given the count so far. Returns the count and the
/// failures (none is retried).
fn under_bounded_load(
    addr: std::net::SocketAddr,
    during: impl FnOnce(&dyn Fn() -> u64),
) -> (u64, Vec<String>) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    /// Sets its flag when dropped, also by a panic's unwinding.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let (stop, done) = (AtomicBool::new(false), AtomicU64::new(0));
    let failures = std::thread::scope(|s| {
        let client = s.spawn(|| {
            let (mut conn, mut failures) = (None, Vec::new());
            while !stop.load(Ordering::Relaxed) && done.load(Ordering::Relaxed) < LOAD_CAP {
                match http_get(addr, &mut conn) {
                    Ok(()) => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures.push(e),
                }
            }
            failures
        });
        {
            let _stop = Stop(&stop);
            during(&|| done.load(Ordering::Relaxed));
        }
        client.join().unwrap()
    });
    (done.load(Ordering::Relaxed), failures)
}

/// Issue 41: under load (one keep-alive client, for as long as the checks take, at most
/// [`PATIENCE`], and at most [`LOAD_CAP`] requests), `status --json`, `status` and the page give a non-zero request rate over
/// the last 10 s, and the page's charts draw the traffic: requests per second, the latency
/// quantiles, the connections open and the workers by state. The history is the master's,
/// fed by every worker's slot: the same in every I/O model.
fn issue_41_the_rates_now_and_the_charts_show_the_load(name: &str, io: Option<Io>) {
    let dir = TestDir::new(
        "status-page",
        &format!("load-{name}-{}", io.map_or("async", Io::name)),
    );
    let sock = dir.path("ctl.sock");
    let mut args = vec![
        "-l",
        "127.0.0.1:0",
        "-w",
        "2",
        "--control",
        &sock,
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    if let Some(io) = io {
        args = io.args(&args);
    }
    let server = Server::start(name, &args);
    server.wait_for_workers(2);
    let metrics = server.metrics_addr();
    let status_json = || {
        let out = Command::new(example(name))
            .args(["status", "--json", "--control", &sock])
            .stdin(Stdio::null())
            .output()
            .expect("run status --json");
        assert!(out.status.success(), "status --json: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        serde_json::from_str::<serde_json::Value>(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    };
    // A request the codec refuses: an error (the connection closed after the codec's
    // error reply), counted in every I/O model.
    let mut bad = TcpStream::connect(server.tcp_addr()).unwrap();
    bad.set_read_timeout(Some(PATIENCE)).unwrap();
    bad.write_all(b"NOT HTTP AT ALL\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    let _ = bad.read_to_end(&mut reply);
    drop(bad);
    let (answered, failures) = under_bounded_load(server.tcp_addr(), |done| {
        // Polled over HTTP (cheaper than a process per look) until a chart point with
        // requests in it is drawn: the first comes 5 s after the master started.
        let mut last = String::new();
        let page = wait_until(|| {
            let (_, page) = http(&metrics, "GET /status?refresh=0 HTTP/1.1\r\nHost: x\r\n\r\n");
            let drawn = chart_value(chart_desc(&page, "chart-requests"), "requests", "highest")
                .is_some_and(|v| v > 0.0);
            last = page;
            drawn.then(|| last.clone())
        })
        .unwrap_or_else(|| panic!("no request drawn in {PATIENCE:?} ({} answered):\n{last}", done()));
        let desc = chart_desc(&page, "chart-latency");
        assert!(chart_value(desc, "p50", "highest").is_some(), "{desc}");
        assert!(chart_value(desc, "p99", "highest").is_some(), "{desc}");
        let desc = chart_desc(&page, "chart-connections");
        assert!(
            chart_value(desc, "open", "highest").is_some_and(|v| v >= 1.0),
            "{desc}"
        );
        let desc = chart_desc(&page, "chart-workers");
        assert!(desc.contains("idle latest"), "{desc}");
        // The rates now, on the page, in status --json and in status, while the load goes on.
        let row = element(&page, "<tr id=\"rate-requests\"", "</tr>");
        let ten: f64 = row
            .split("<td class=\"n\">")
            .nth(2)
            .and_then(|c| c.split('<').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no rate in {row}"));
        assert!(ten > 0.0, "{row}");
        let doc = status_json();
        let rate = &doc["rates"]["last_10s"];
        assert!(
            rate["requests_per_second"].as_f64().is_some_and(|r| r > 0.0),
            "{doc}"
        );
        assert!(rate["over_seconds"].as_f64().is_some_and(|s| s >= 5.0), "{doc}");
        assert!(
            doc["rates"]["last_60s"]["requests_per_second"]
                .as_f64()
                .is_some_and(|r| r > 0.0),
            "{doc}"
        );
        assert_eq!(doc["totals"]["errors"], 1, "the refused request: {doc}");
        assert!(
            doc["rates"]["last_60s"]["errors_per_second"]
                .as_f64()
                .is_some_and(|r| r > 0.0),
            "{doc}"
        );
        let out = Command::new(example(name))
            .args(["status", "--control", &sock])
            .stdin(Stdio::null())
            .output()
            .expect("run status");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.starts_with("Rates:"))
            .unwrap_or_else(|| panic!("no rates in\n{text}"));
        assert!(!line.contains(": 0.00 requests/s"), "{line}");
    });
    assert!(failures.is_empty(), "{failures:?}");
    assert!(answered > 0);
}

fn issue_41_rates_and_charts_under_load(io: Io) {
    issue_41_the_rates_now_and_the_charts_show_the_load(io.example("http_hello"), Some(io));
}

both_io!(issue_41_rates_and_charts_under_load);

/// The status document with the figures that change by themselves between two snapshots
/// (times, and the rates: the mean since the start, and those of the windows that slide)
/// set to null.
fn without_clocks(mut v: serde_json::Value) -> serde_json::Value {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map.iter_mut() {
                    // Rates move by themselves too: a window slides (issue 41).
                    if k.ends_with("_seconds") || k.ends_with("_per_second") {
                        *v = serde_json::Value::Null;
                    } else {
                        walk(v);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

/// Issue 34: `/status?json` is the `status --json` document (the same keys and values,
/// but for the clocks that move between the two snapshots); HEAD works as for the other
/// routes, and an unknown path's 404 names /status.
#[test]
fn issue_34_status_json_over_http_is_the_status_document() {
    let dir = TestDir::new("status-page", "json");
    let server = start(&dir, 2);
    let metrics = server.metrics_addr();
    // Some traffic, so that the counters are not all zero.
    let (_, body) = http(
        &server.tcp_addr().to_string(),
        "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(body, "Hello, World!");
    let settled = wait_until(|| {
        let s = status_json(&dir);
        (s["totals"]["requests"] == 1
            && s["workers"]
                .as_array()
                .is_some_and(|w| w.iter().all(|w| w["state"] == "idle")))
        .then_some(s)
    })
    .expect("the request counted and the workers idle");
    let (head, body) = http(&metrics, "GET /status?json HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("\r\nContent-Type: application/json\r\n"), "{head}");
    assert!(body.ends_with("}\n") && body.lines().count() == 1, "{body}");
    let over_http: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let after = status_json(&dir);
    assert_eq!(without_clocks(over_http.clone()), without_clocks(after));
    assert_eq!(without_clocks(over_http), without_clocks(settled));

    // HEAD: the same head, no body.
    let mut s = TcpStream::connect(&metrics).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(b"HEAD /status HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut head = String::new();
    s.read_to_string(&mut head).unwrap();
    assert!(
        head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
        "{head}"
    );
    assert!(
        head.contains("Content-Type: text/html; charset=utf-8\r\n"),
        "{head}"
    );
    // The page itself, and the 404 that names it.
    let (head, page) = http(&metrics, "GET /status HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        page.starts_with("<!DOCTYPE html>") && page.contains("http_hello"),
        "{page}"
    );
    let (head, body) = http(&metrics, "GET /server-status HTTP/1.1\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 404 "), "{head}");
    assert!(body.contains("/status"), "{body}");
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![test(
        "issue_34_a_browser_shows_the_busy_worker_on_the_status_page",
        &[Need::Program("chromium", "chromium")],
        issue_34_a_browser_shows_the_busy_worker_on_the_status_page,
    )]
}

//! The control socket and the metrics listener, through the testbed server as a real
//! process: `status`, `status --json`, `metrics`, `workers +N|-N`, the peer-credential
//! check, and `--metrics-listen`.

mod util;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use util::*;

/// A private directory for one test's control socket, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str, mode: u32) -> Dir {
        let d = std::env::temp_dir().join(format!("appsrv-status-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
        Dir(d)
    }

    fn sock(&self) -> String {
        self.0.join("ctl.sock").to_string_lossy().into_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the testbed with `workers` workers, a TCP listener and the control socket.
fn start(dir: &Dir, workers: usize, extra: &[&str]) -> Server {
    let w = workers.to_string();
    let sock = dir.sock();
    let mut args = vec!["-l", "127.0.0.1:0", "-w", &w, "--control", &sock];
    args.extend_from_slice(extra);
    let server = Server::start("testbed", &args);
    server.wait_for_workers(workers);
    server
}

/// Runs `testbed ARGS --control SOCK` and returns its output.
fn ctl(dir: &Dir, args: &[&str]) -> Output {
    Command::new(example("testbed"))
        .args(args)
        .args(["--control", &dir.sock()])
        .stdin(Stdio::null())
        .output()
        .expect("run testbed")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The stdout of a command that must succeed.
fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{:?}; stdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[derive(Debug, Deserialize)]
struct StatusDoc {
    version: u32,
    name: String,
    master_pid: i32,
    phase: String,
    pool: Pool,
    totals: Totals,
    listeners: Vec<ListenerDoc>,
    scoreboard: String,
    workers: Vec<Worker>,
}

#[derive(Debug, Deserialize)]
struct Pool {
    policy: String,
    target: usize,
}

#[derive(Debug, Deserialize)]
struct Totals {
    connections: u64,
}

#[derive(Debug, Deserialize)]
struct ListenerDoc {
    addr: String,
    backlog: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct Worker {
    id: u32,
    pid: i32,
    state: String,
    client: Option<String>,
    request_seconds: Option<f64>,
}

fn status_json(dir: &Dir) -> StatusDoc {
    let out = ok(ctl(dir, &["status", "--json"]));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Polls `status --json` until `f` accepts it.
fn wait_for_status(dir: &Dir, what: &str, mut f: impl FnMut(&StatusDoc) -> bool) -> StatusDoc {
    let mut last = None;
    let found = wait_until(|| {
        let s = status_json(dir);
        let done = f(&s);
        last = Some(format!("{s:#?}"));
        done.then_some(s)
    });
    found.unwrap_or_else(|| panic!("never {what}; last status:\n{}", last.unwrap_or_default()))
}

fn metric(text: &str, name: &str) -> f64 {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parses");
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == name)
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    match sample.value {
        prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
        ref other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn status_lists_the_workers_the_master_has() {
    let dir = Dir::new("table", 0o700);
    let server = start(&dir, 2, &[]);
    let mode = std::fs::symlink_metadata(dir.sock())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the control socket is private");
    let pids = server.worker_pids();
    let table = ok(ctl(&dir, &["status"]));
    assert!(
        table.contains(&format!("testbed (master pid {})", server.pid())),
        "{table}"
    );
    assert!(table.contains("Phase:         running"), "{table}");
    assert!(table.contains(&server.tcp_addr().to_string()), "{table}");
    assert!(table.contains("Scoreboard:"), "{table}");
    for pid in &pids {
        let row = table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(&pid.to_string()))
            .unwrap_or_else(|| panic!("no row for worker {pid}:\n{table}"));
        assert!(row.split_whitespace().count() >= 9, "{row}");
    }
}

#[test]
fn status_json_matches_the_processes() {
    let dir = Dir::new("json", 0o700);
    let server = start(&dir, 2, &[]);
    let pids = server.worker_pids();
    let s = wait_for_status(&dir, "all idle", |s| s.workers.iter().all(|w| w.state == "idle"));
    assert_eq!(s.version, 1);
    assert_eq!(s.name, "testbed");
    assert_eq!(s.master_pid, server.pid());
    assert_eq!(s.phase, "running");
    assert_eq!((s.pool.policy.as_str(), s.pool.target), ("static", 2));
    let listed: HashSet<i32> = s.workers.iter().map(|w| w.pid).collect();
    assert_eq!(
        listed, pids,
        "the workers in the status are the master's children"
    );
    let ids: HashSet<u32> = s.workers.iter().map(|w| w.id).collect();
    assert_eq!(ids, HashSet::from([1, 2]));
    assert!(s.scoreboard.starts_with("__"), "{}", s.scoreboard);
    assert_eq!(s.listeners[0].addr, server.tcp_addr().to_string());
    assert!(s.listeners[0].backlog.is_some_and(|b| b > 0));
}

#[test]
fn a_worker_with_a_silent_client_shows_busy_with_its_address() {
    let dir = Dir::new("busy", 0o700);
    let server = start(&dir, 2, &[]);
    // The testbed greets, then waits for a line that never comes.
    let mut c = LineClient::tcp(server.tcp_addr());
    let pid = c.testbed_pid();
    let me = c.get_mut().local_addr().unwrap().to_string();
    // The worker writes its state into the shared scoreboard; the master reads it.
    let s = wait_for_status(&dir, "the worker busy with our client", |s| {
        s.workers
            .iter()
            .any(|w| w.pid == pid && w.client.as_deref() == Some(me.as_str()))
    });
    let w = s.workers.iter().find(|w| w.pid == pid).unwrap();
    assert!(["reading", "handling"].contains(&w.state.as_str()), "{w:?}");
    assert!(w.request_seconds.is_some(), "{w:?}");
    assert!(s.totals.connections >= 1, "{s:?}");
    let others: Vec<_> = s.workers.iter().filter(|w| w.pid != pid).collect();
    assert!(others.iter().all(|w| w.client.is_none()), "{others:?}");
    let table = ok(ctl(&dir, &["status"]));
    let row = table
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&pid.to_string()))
        .unwrap();
    assert!(
        row.contains(&me) && (row.contains("handling") || row.contains("reading")),
        "{row}"
    );
    drop(c);
    wait_for_status(&dir, "the worker idle again", |s| {
        s.workers
            .iter()
            .any(|w| w.pid == pid && w.state == "idle" && w.client.is_none())
    });
}

#[test]
fn the_master_answers_while_every_worker_is_busy() {
    let dir = Dir::new("allbusy", 0o700);
    let server = start(&dir, 2, &[]);
    let mut clients: Vec<_> = (0..2).map(|_| LineClient::tcp(server.tcp_addr())).collect();
    for c in &mut clients {
        c.testbed_pid();
        c.send("sleep 10");
    }
    // A control client that connects and sends nothing does not hold the master either.
    let silent = UnixStream::connect(dir.sock()).unwrap();
    let started = Instant::now();
    let s = wait_for_status(&dir, "both workers handling", |s| {
        s.workers.len() == 2 && s.workers.iter().all(|w| w.state == "handling")
    });
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "status took {:?}",
        started.elapsed()
    );
    assert!(s.workers.iter().all(|w| w.client.is_some()));
    drop(silent);
}

#[test]
fn metrics_parse_and_count_connections() {
    let dir = Dir::new("metrics", 0o700);
    let server = start(&dir, 2, &[]);
    let before = ok(ctl(&dir, &["metrics"]));
    assert!(
        before.contains("# TYPE appsrv_request_duration_seconds histogram"),
        "{before}"
    );
    let c0 = metric(&before, "appsrv_connections_total");
    assert_eq!(metric(&before, "appsrv_workers_target"), 2.0);
    let mut c = LineClient::tcp(server.tcp_addr());
    c.testbed_pid();
    assert_eq!(c.ask("hello"), "hello");
    drop(c);
    // Connections count when they start, bytes when they end: wait for both.
    let grown = wait_until(|| {
        let m = ok(ctl(&dir, &["metrics"]));
        (metric(&m, "appsrv_connections_total") > c0 && metric(&m, "appsrv_bytes_sent_total") >= 6.0)
            .then_some(m)
    });
    let m = grown.expect("appsrv_connections_total never grew");
    assert!(metric(&m, "appsrv_bytes_received_total") >= 6.0, "{m}");
    assert!(metric(&m, "appsrv_bytes_sent_total") >= 6.0, "{m}");
}

#[test]
fn workers_grows_and_shrinks_a_static_pool() {
    let dir = Dir::new("resize", 0o700);
    let server = start(&dir, 2, &[]);
    let out = ok(ctl(&dir, &["workers", "+1"]));
    assert!(!out.trim().is_empty(), "the reply says what changed");
    server.wait_for_workers(3);
    wait_for_status(&dir, "3 workers, target 3", |s| {
        s.workers.len() == 3 && s.pool.target == 3
    });
    ok(ctl(&dir, &["workers", "-1"]));
    server.wait_for_workers(2);
    wait_for_status(&dir, "2 workers, target 2", |s| {
        s.workers.len() == 2 && s.pool.target == 2
    });
}

fn another_uid_is_refused() {
    let dir = Dir::new("uid", 0o755);
    let server = start(&dir, 2, &[]);
    // Let anyone reach the socket file: only the peer-credential check stands in the way.
    std::fs::set_permissions(dir.sock(), std::fs::Permissions::from_mode(0o666)).unwrap();
    // A copy of the client that uid 65534 can run wherever the build directory is.
    let exe = dir.0.join("testbed");
    // Copied by `cp`, so that no descriptor open for writing can leak from this process
    // into a child another test thread forks (exec would then fail with ETXTBSY).
    assert!(
        Command::new("cp")
            .arg(example("testbed"))
            .arg(&exe)
            .status()
            .unwrap()
            .success()
    );
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&exe)
        .args(["status", "--control", &dir.sock()])
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("permission denied"),
        "{}",
        text(&out.stderr)
    );
    let line = server.wait_for_log("refused a connection from uid 65534");
    assert!(line.contains("WARN") && line.contains(&dir.sock()), "{line}");
    // Root still gets in.
    ok(ctl(&dir, &["status"]));
}

/// Sends `request` to `addr` and reads the whole response.
fn http(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The head and body of a `GET path` with these extra header lines.
fn get(addr: &str, path: &str, headers: &str) -> (String, String) {
    let r = http(addr, &format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n"));
    let (head, body) = r
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {r:?}"));
    (head.to_owned(), body.to_owned())
}

/// What Prometheus (2.x) sends in `Accept`.
const PROMETHEUS_ACCEPT: &str =
    "Accept: application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1\r\n";

#[test]
fn metrics_are_served_over_http() {
    let dir = Dir::new("http", 0o700);
    let server = start(&dir, 2, &["--metrics-listen", "127.0.0.1:0"]);
    let addr = server.metrics_addr();
    let get = |request: &str| http(&addr, request);
    let r = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let (head, body) = r.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    assert!(head.contains("Connection: close"), "{head}");
    assert_eq!(metric(body, "appsrv_workers_target"), 2.0);
    assert!(get("GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
    assert!(get("DELETE /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
}

#[test]
fn status_without_a_server_exits_3() {
    let dir = Dir::new("none", 0o700);
    let out = ctl(&dir, &["status"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!(
            "testbed: not running: no control socket at {} (the path given with --control)",
            dir.sock()
        )),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn the_socket_is_removed_on_stop() {
    let dir = Dir::new("stop", 0o700);
    let mut server = start(&dir, 2, &[]);
    assert!(Path::new(&dir.sock()).exists());
    server.signal(libc::SIGTERM);
    assert!(server.wait_exit().success());
    assert!(
        !Path::new(&dir.sock()).exists(),
        "the control socket file is removed"
    );
    assert_eq!(ctl(&dir, &["status"]).status.code(), Some(3));
}

/// Issue #8: what the access rules and the per-address cap turn away shows in the
/// metrics, so an operator can tell a deny list or a cap at work from a quiet server.
#[test]
fn metrics_count_denied_and_refused_connections() {
    let dir = Dir::new("denied", 0o700);
    let server = start(&dir, 2, &["--deny", "127.0.0.2", "--max-conns-per-ip", "1"]);
    let m = ok(ctl(&dir, &["metrics"]));
    assert_eq!(metric(&m, "appsrv_connections_denied_total"), 0.0, "{m}");
    assert_eq!(metric(&m, "appsrv_connections_refused_total"), 0.0, "{m}");

    read_all_from("127.0.0.2", server.tcp_addr());
    // One connection from 127.0.0.1 is served and held; a second one is over the cap.
    let mut held = LineClient::tcp(server.tcp_addr());
    held.testbed_pid();
    read_all_from("127.0.0.1", server.tcp_addr());
    let m = wait_until(|| {
        let m = ok(ctl(&dir, &["metrics"]));
        (metric(&m, "appsrv_connections_denied_total") >= 1.0
            && metric(&m, "appsrv_connections_refused_total") >= 1.0)
            .then_some(m)
    });
    let m = m.expect("the denied and refused counters never grew");
    assert_eq!(metric(&m, "appsrv_connections_denied_total"), 1.0, "{m}");
    assert_eq!(metric(&m, "appsrv_connections_refused_total"), 1.0, "{m}");
    assert_eq!(held.ask("still here"), "still here");
}

/// Issue 17: the 0.0.4 text unless the scraper asks for OpenMetrics, which ends with
/// `# EOF`; health on the same listener.
#[test]
fn issue_17_metrics_negotiate_openmetrics_and_health_is_served() {
    let dir = Dir::new("negotiate", 0o700);
    let server = start(&dir, 2, &["--metrics-listen", "127.0.0.1:0"]);
    let addr = server.metrics_addr();
    for headers in ["", "Accept: */*\r\n"] {
        let (head, body) = get(&addr, "/metrics", headers);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{head}"
        );
        assert!(!body.contains("# EOF"), "{body}");
        assert_eq!(metric(&body, "appsrv_workers_target"), 2.0);
    }
    for headers in ["Accept: application/openmetrics-text\r\n", PROMETHEUS_ACCEPT] {
        let (head, body) = get(&addr, "/metrics", headers);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"),
            "{head}"
        );
        assert!(body.ends_with("\n# EOF\n"), "{body}");
        assert!(body.contains("# TYPE appsrv_connections counter\n"), "{body}");
        assert!(
            body.contains("\n# UNIT appsrv_uptime_seconds seconds\n"),
            "{body}"
        );
    }
    let (head, body) = get(&addr, "/healthz", "");
    assert!(
        head.starts_with("HTTP/1.1 200 OK\r\n") && body == "ok\n",
        "{head}\n{body}"
    );
    // The workers are up: ready (polled, in case the phase lags a moment).
    let ready = wait_until(|| {
        let (head, body) = get(&addr, "/readyz", "");
        head.starts_with("HTTP/1.1 200 OK\r\n").then_some(body)
    });
    assert_eq!(ready.as_deref(), Some("ready\n"));
    let r = http(&addr, "HEAD /readyz HTTP/1.1\r\n\r\n");
    assert!(
        r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"),
        "{r}"
    );
}

/// Issue 17: `metrics --format openmetrics` (and its variable) re-frames the reply;
/// the default is the 0.0.4 text, without `# EOF`.
#[test]
fn issue_17_the_metrics_subcommand_has_a_format() {
    let dir = Dir::new("format", 0o700);
    let _server = start(&dir, 2, &[]);
    let prom = ok(ctl(&dir, &["metrics"]));
    assert!(!prom.contains("# EOF") && prom.contains("# TYPE appsrv_connections_total counter\n"));
    assert_eq!(
        ok(ctl(&dir, &["metrics", "--format", "prometheus"]))
            .lines()
            .count(),
        prom.lines().count()
    );
    let om = ok(ctl(&dir, &["metrics", "--format", "openmetrics"]));
    assert!(
        om.ends_with("\n# EOF\n") && om.contains("# TYPE appsrv_connections counter\n"),
        "{om}"
    );
    let from_env = Command::new(example("testbed"))
        .args(["metrics", "--control", &dir.sock()])
        .env("TESTBED_FORMAT", "openmetrics")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(ok(from_env).ends_with("\n# EOF\n"));
    let bad = ctl(&dir, &["metrics", "--format", "json"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    assert!(text(&bad.stderr).contains("openmetrics"), "{}", text(&bad.stderr));
}

/// Runs `cmd` with `input` on its stdin; returns its status, stdout and stderr.
fn pipe(mut cmd: Command, input: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the checker");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// Issue 17: Prometheus's own checker (`promtool check metrics`: parse and lint, names
/// and help included) finds no problem in the 0.0.4 text, from the subcommand and from
/// `/metrics`.
fn issue_17_promtool_accepts_the_text_format() {
    let dir = Dir::new("promtool", 0o700);
    let server = start(&dir, 2, &["--metrics-listen", "127.0.0.1:0"]);
    // Some traffic, so that the counters are not all zero.
    let mut c = LineClient::tcp(server.tcp_addr());
    c.testbed_pid();
    assert_eq!(c.ask("hello"), "hello");
    drop(c);
    let (_, scraped) = get(&server.metrics_addr(), "/metrics", "");
    for text in [ok(ctl(&dir, &["metrics"])), scraped] {
        let mut cmd = Command::new("promtool");
        cmd.args(["check", "metrics"]);
        let out = pipe(cmd, &text);
        assert!(
            out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
            "promtool check metrics: {:?}\n{}{}\non:\n{text}",
            out.status,
            self::text(&out.stdout),
            self::text(&out.stderr)
        );
    }
}

/// The Python that has `prometheus_client` (Debian's python3-prometheus-client installs
/// it for /usr/bin/python3, which another python3 on the PATH may not see).
fn python_with_prometheus_client() -> Option<&'static str> {
    ["python3", "/usr/bin/python3"].into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import prometheus_client.openmetrics.parser"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Issue 17: an OpenMetrics parser (prometheus_client's, strict: it requires `# EOF`,
/// the counters' `_total`, units that suffix the name, canonical bounds) reads what
/// `/metrics` answers Prometheus's `Accept`, and `metrics --format openmetrics`.
fn issue_17_an_openmetrics_parser_reads_the_openmetrics_text() {
    let python = python_with_prometheus_client();
    let dir = Dir::new("openmetrics", 0o700);
    let server = start(&dir, 2, &["--metrics-listen", "127.0.0.1:0"]);
    let (head, scraped) = get(&server.metrics_addr(), "/metrics", PROMETHEUS_ACCEPT);
    assert!(head.contains("application/openmetrics-text"), "{head}");
    // One line per family: name, type, unit, samples; then "ok".
    let script = "import sys\n\
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\n\
        for f in parse(sys.stdin.read()):\n    print(f.name, f.type, f.unit or '-', len(f.samples))\n\
        print('ok')\n";
    for text in [scraped, ok(ctl(&dir, &["metrics", "--format", "openmetrics"]))] {
        let mut cmd = Command::new(python.unwrap());
        cmd.args(["-c", script]);
        let out = pipe(cmd, &text);
        let stdout = self::text(&out.stdout);
        assert!(
            out.status.success() && stdout.ends_with("ok\n"),
            "the OpenMetrics parser: {:?}\n{stdout}{}\non:\n{text}",
            out.status,
            self::text(&out.stderr)
        );
        for family in [
            "appsrv_connections counter - 1",
            "appsrv_uptime_seconds gauge seconds 1",
            "appsrv_request_duration_seconds histogram seconds 15",
            "appsrv_worker_restarts counter - 5",
        ] {
            assert!(stdout.lines().any(|l| l == family), "no {family:?} in\n{stdout}");
        }
    }
}

/// What `ctl(dir, ["health"])` said: its exit code and its output line.
fn health(dir: &Dir) -> (Option<i32>, String) {
    let out = ctl(dir, &["health"]);
    (out.status.code(), text(&out.stdout).trim().to_owned())
}

/// Issue 22: with `--drain-delay`, a stop first takes the server out of the rotation:
/// `/readyz` answers 503, `health` exits 1 and `status --json` says `ready: false`, while
/// the listener still accepts and serves new connections (a balancer that has not polled
/// yet loses nothing); after the delay the graceful stop runs and the server exits, and
/// `health` then exits 3. Before the stop, `health` says ready (exit 0).
#[test]
fn issue_22_a_stop_with_a_drain_delay_leaves_the_rotation_before_it_closes() {
    let dir = Dir::new("drain", 0o700);
    let mut server = start(
        &dir,
        2,
        &["--metrics-listen", "127.0.0.1:0", "--drain-delay", "10"],
    );
    let metrics = server.metrics_addr();
    let addr = server.tcp_addr();
    let ready = wait_until(|| {
        let (head, _) = get(&metrics, "/readyz", "");
        head.starts_with("HTTP/1.1 200 OK\r\n").then_some(())
    });
    assert!(ready.is_some(), "never ready");
    assert_eq!(health(&dir), (Some(0), "testbed: ready".to_owned()));
    let v: serde_json::Value = serde_json::from_str(&ok(ctl(&dir, &["status", "--json"]))).unwrap();
    assert_eq!(
        (&v["ready"], &v["not_ready"]),
        (&serde_json::json!(true), &serde_json::Value::Null)
    );

    server.signal(libc::SIGTERM);
    let body = wait_until(|| {
        let (head, body) = get(&metrics, "/readyz", "");
        head.starts_with("HTTP/1.1 503").then_some(body)
    })
    .expect("/readyz never turned 503 after the stop signal");
    assert!(body.contains("stopping"), "{body}");
    // Out of the rotation, still serving: a new connection is accepted and answered.
    let mut c = LineClient::tcp(addr);
    assert!(c.line().starts_with("pid "), "a connection during the drain");
    assert_eq!(c.ask("hello"), "hello");
    drop(c);
    let (code, said) = health(&dir);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.starts_with("testbed: not ready: stopping"), "{said}");
    let v: serde_json::Value = serde_json::from_str(&ok(ctl(&dir, &["status", "--json"]))).unwrap();
    assert_eq!(
        (&v["phase"], &v["ready"]),
        (&serde_json::json!("stopping"), &serde_json::json!(false))
    );

    server.wait_for_log("SIGTERM: drain delay over: stopping");
    assert!(server.wait_exit().success(), "{}", server.log_text());
    assert_eq!(health(&dir).0, Some(3), "not running after the stop");
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![
        test("another_uid_is_refused", &[Need::Root], another_uid_is_refused),
        test(
            "issue_17_promtool_accepts_the_text_format",
            &[Need::Program("promtool", "prometheus")],
            issue_17_promtool_accepts_the_text_format,
        ),
        test(
            "issue_17_an_openmetrics_parser_reads_the_openmetrics_text",
            &[Need::PythonModule(
                "prometheus_client.openmetrics.parser",
                "python3-prometheus-client",
            )],
            issue_17_an_openmetrics_parser_reads_the_openmetrics_text,
        ),
    ]
}

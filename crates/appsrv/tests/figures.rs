//! Issue 42: the status figures of event and async workers tell the truth. Bytes are
//! counted as they move (not when a connection closes: 0 after 57,755 requests on
//! keep-alive connections), and a worker's row says what its connections are doing (not
//! `reading` with 250 requests in flight), the same in `status`, `status --json` and
//! `/metrics`. Through `http_hello --io event` and the `asyncbed` test server as real
//! processes.

mod util;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;

use serde_json::Value;
use util::*;

/// The worker models under test: blocking workers, the event loop and the async driver.
#[derive(Clone, Copy, Debug)]
enum Model {
    Blocking,
    Event,
    Async,
}

impl Model {
    fn name(self) -> &'static str {
        match self {
            Model::Blocking => "blocking",
            Model::Event => "event",
            Model::Async => "async",
        }
    }

    /// The example that serves HTTP in this model.
    fn example(self) -> &'static str {
        match self {
            Model::Blocking | Model::Event => "http_hello",
            Model::Async => "asyncbed",
        }
    }
}

/// A private directory for one server's control socket and files, removed on drop.
struct Dir(TestDir);

impl Dir {
    fn new(model: Model, tag: &str) -> Dir {
        Dir(TestDir::new("figures", &format!("{tag}-{}", model.name())))
    }

    fn sock(&self) -> String {
        self.0.path("ctl.sock")
    }
}

/// Starts the model's HTTP example with one worker, its control socket in `dir`, and
/// `extra` arguments.
fn start(model: Model, dir: &Dir, extra: &[&str]) -> Server {
    let sock = dir.sock();
    let mut args = vec![
        "-l",
        "127.0.0.1:0",
        "-w",
        "1",
        "--control",
        &sock,
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    match model {
        Model::Blocking => args.extend(["--io", "blocking"]),
        Model::Event => args.extend(["--io", "event"]),
        Model::Async => {}
    }
    args.extend_from_slice(extra);
    let server = Server::start(model.example(), &args);
    server.wait_for_workers(1);
    server
}

/// Runs `EXAMPLE ARGS --control SOCK` and returns its stdout, asserting success.
fn ctl(model: Model, dir: &Dir, args: &[&str]) -> String {
    let out = Command::new(example(model.example()))
        .args(args)
        .args(["--control", &dir.sock()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn status_json(model: Model, dir: &Dir) -> Value {
    let out = ctl(model, dir, &["status", "--json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Polls `status --json` until `f` accepts it (within [`PATIENCE`]).
fn wait_for_status(model: Model, dir: &Dir, what: &str, mut f: impl FnMut(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    wait_until(|| {
        let s = status_json(model, dir);
        let done = f(&s);
        last = s;
        done.then(|| last.clone())
    })
    .unwrap_or_else(|| panic!("never {what}; last status:\n{last:#}"))
}

/// The one worker's object in a status document.
fn worker(s: &Value) -> &Value {
    let workers = s["workers"].as_array().expect("workers");
    assert_eq!(workers.len(), 1, "one worker: {s:#}");
    &workers[0]
}

/// Reads one response (Content-Length framed) and returns how many bytes it took.
fn read_response(c: &mut BufReader<TcpStream>) -> u64 {
    let mut total = 0;
    let mut status = String::new();
    total += c.read_line(&mut status).expect("a status line") as u64;
    assert!(status.starts_with("HTTP/1.1 200"), "an answer, got {status:?}");
    let mut len = 0;
    loop {
        let mut h = String::new();
        total += c.read_line(&mut h).unwrap() as u64;
        if h == "\r\n" {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length: ") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    c.read_exact(&mut body).unwrap();
    total + len as u64
}

fn keepalive_bytes_count_as_they_move(model: Model) {
    // A blocking worker serves one connection at a time.
    let connections = if let Model::Blocking = model { 1 } else { 4 };
    const REQUESTS: usize = 50;
    let dir = Dir::new(model, "bytes");
    // Connections kept open however long the checks take on a loaded machine.
    let server = start(model, &dir, &["--keepalive-timeout", "300"]);
    let addr = server.tcp_addr();
    let request = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    let mut conns: Vec<_> = (0..connections)
        .map(|_| {
            let s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            BufReader::new(s)
        })
        .collect();
    let (mut sent, mut received) = (0u64, 0u64);
    for _ in 0..REQUESTS {
        for c in &mut conns {
            c.get_mut().write_all(request).unwrap();
            sent += request.len() as u64;
            received += read_response(c);
        }
    }
    // Every connection still open: the worker's figures already hold what moved, to the
    // byte (what the clients sent is what the worker read, and the other way round).
    let s = wait_for_status(model, &dir, "the bytes of the open connections", |s| {
        let w = worker(s);
        assert_eq!(open(w), connections as u64, "still open: {s:#}");
        w["bytes_in"] == sent && w["bytes_out"] == received
    });
    assert_eq!(s["totals"]["bytes_in"], sent, "{s:#}");
    assert_eq!(s["totals"]["bytes_out"], received, "{s:#}");
    // The metrics say the same.
    let metrics = ctl(model, &dir, &["metrics"]);
    for (name, n) in [
        ("appsrv_bytes_received_total", sent),
        ("appsrv_bytes_sent_total", received),
    ] {
        assert!(
            metrics.lines().any(|l| l == format!("{name} {n}")),
            "{name} {n} in\n{metrics}"
        );
    }
    // And the page's row.
    let row = page_row(&server);
    let cells = format!("<td class=\"n\">{sent}</td><td class=\"n\">{received}</td>");
    assert!(row.contains(&cells), "{cells} in\n{row}");
    // Counted once: closing the connections adds nothing.
    drop(conns);
    wait_for_status(model, &dir, "the connections closed", |s| open(worker(s)) == 0);
    let s = status_json(model, &dir);
    assert_eq!(
        (&worker(&s)["bytes_in"], &worker(&s)["bytes_out"]),
        (&Value::from(sent), &Value::from(received)),
        "{s:#}"
    );
}

/// The connections a worker has open: an event or async worker's count; a blocking
/// worker's one while it is not idle.
fn open(w: &Value) -> u64 {
    match w["event"]["open"].as_u64() {
        Some(n) => n,
        None => u64::from(w["state"] != "idle"),
    }
}

/// A keep-alive connection on a blocking worker: bytes in and out show while it is open
/// (counted at each request boundary).
#[test]
fn issue_42_keepalive_bytes_count_as_they_move_blocking() {
    keepalive_bytes_count_as_they_move(Model::Blocking);
}

/// Keep-alive connections on an event worker: bytes in and out show while they are open.
#[test]
fn issue_42_keepalive_bytes_count_as_they_move_event() {
    keepalive_bytes_count_as_they_move(Model::Event);
}

/// Keep-alive connections on an async worker: bytes in and out show while they are open.
#[test]
fn issue_42_keepalive_bytes_count_as_they_move_async() {
    keepalive_bytes_count_as_they_move(Model::Async);
}

/// The worker's line of the text status (`ID PID GEN STATE ...`): its state.
fn text_state(text: &str, pid: u64) -> Option<String> {
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 4 && f[0] == "1" && f[1] == pid.to_string()).then(|| f[3].to_owned())
    })
}

/// The one worker's row on the status page (`/status` of the metrics listener).
fn page_row(server: &Server) -> String {
    let page = get_once(server.metrics_addr().as_str(), "/status", PATIENCE);
    page.lines()
        .find(|l| l.starts_with("<tr id=\"worker-1\""))
        .unwrap_or_else(|| panic!("no row of worker 1 in\n{page}"))
        .to_owned()
}

/// The one worker's state as `status`, the scoreboard letter, the page and `/metrics` say
/// it, asserting that they agree with `status --json`'s.
fn states_agree(model: Model, dir: &Dir, server: &Server, json: &Value, name: &str, letter: char) {
    let w = worker(json);
    assert_eq!(w["state"], name, "{json:#}");
    assert_eq!(
        json["scoreboard"].as_str().and_then(|s| s.chars().next()),
        Some(letter),
        "{json:#}"
    );
    let text = ctl(model, dir, &["status"]);
    let pid = w["pid"].as_u64().unwrap();
    // The text and the metrics are read after the document: the same state if it held.
    assert_eq!(text_state(&text, pid).as_deref(), Some(name), "{text}");
    let metrics = ctl(model, dir, &["metrics"]);
    let line = format!("appsrv_workers{{state=\"{name}\"}} 1");
    assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    let row = page_row(server);
    let cell = format!("<td class=\"st st-{name}\"><code>{letter}</code> {name}</td>");
    assert!(row.contains(&cell), "{cell} in\n{row}");
}

/// Issue 42: many requests in flight on an async worker (handlers awaiting a timer) show
/// as in the handler, not as reading: the worker's state is `handling` (`H`) in every
/// output, with its counts.
#[test]
fn issue_42_requests_in_flight_show_as_handling_async() {
    const CLIENTS: usize = 40;
    let model = Model::Async;
    let dir = Dir::new(model, "inflight");
    let server = start(model, &dir, &[]);
    let addr = server.tcp_addr();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(PATIENCE)).unwrap();
                s.write_all(b"GET /sleep?ms=6000 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                    .unwrap();
                let mut answer = String::new();
                let _ = s.read_to_string(&mut answer);
                answer
            })
        })
        .collect();
    let s = wait_for_status(model, &dir, "every request in flight", |s| {
        worker(s)["event"]["requests_in_flight"] == CLIENTS as u64
    });
    let e = &worker(&s)["event"];
    assert_eq!(e["open"], CLIENTS as u64, "{s:#}");
    assert_eq!(e["reading"], 0, "none of them is reading: {s:#}");
    states_agree(model, &dir, &server, &s, "handling", 'H');
    for c in clients {
        let answer = c.join().unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}

/// A client that asked for a large response and reads nothing, with a small receive
/// buffer: the server's writes soon wait for it.
fn slow_reader(addr: SocketAddr, path: &str) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.connect(&addr.into()).unwrap();
    let mut s = TcpStream::from(s);
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
        .unwrap();
    s
}

/// A file of `len` bytes in a directory of its own, for `http_hello --static-dir`.
struct Site(TestDir);

impl Site {
    fn new(tag: &str, len: usize) -> Site {
        let d = TestDir::new("figures-site", tag);
        std::fs::write(d.path("big.bin"), vec![b'x'; len]).unwrap();
        Site(d)
    }
}

/// Issue 42: a slow reader of a large response shows as writing: the worker's state is
/// `writing` (`W`) in every output, and its loop counts one connection writing.
fn slow_reader_shows_as_writing(model: Model) {
    let dir = Dir::new(model, "writing");
    let site = Site::new(&format!("writing-{}", model.name()), 16 << 20);
    let root = site.0.0.to_string_lossy().into_owned();
    let (server, path) = match model {
        // Not cut by --min-send-rate while the checks run on a loaded machine.
        Model::Blocking | Model::Event => (
            start(model, &dir, &["--static-dir", &root, "--min-send-rate", "0"]),
            "/static/big.bin",
        ),
        Model::Async => (start(model, &dir, &[]), "/big?kb=16384"),
    };
    let reader = slow_reader(server.tcp_addr(), path);
    let s = wait_for_status(model, &dir, "the slow reader writing", |s| {
        worker(s)["event"]["writing"] == 1
    });
    let e = &worker(&s)["event"];
    assert_eq!(
        (&e["open"], &e["reading"]),
        (&Value::from(1), &Value::from(0)),
        "{s:#}"
    );
    states_agree(model, &dir, &server, &s, "writing", 'W');
    drop(reader);
    drop(server);
}

#[test]
fn issue_42_a_slow_reader_shows_as_writing_event() {
    slow_reader_shows_as_writing(Model::Event);
}

#[test]
fn issue_42_a_slow_reader_shows_as_writing_async() {
    slow_reader_shows_as_writing(Model::Async);
}

/// A worker of either model with nothing open is idle (`_`), as before.
#[test]
fn issue_42_an_idle_worker_shows_idle() {
    for model in [Model::Event, Model::Async] {
        let dir = Dir::new(model, "idle");
        let server = start(model, &dir, &[]);
        let s = wait_for_status(model, &dir, "the worker idle", |s| worker(s)["state"] == "idle");
        states_agree(model, &dir, &server, &s, "idle", '_');
    }
}

//! Hybrid mode (`--io hybrid`): front processes run the event loop (accepting, admission,
//! reading until the codec has a whole request) and hand each complete request, with the
//! bytes already read, to an idle blocking worker, which hands the connection back when it
//! stays quiet. What a user of that mode relies on:
//!
//! - slowloris and idle floods cost no worker; keep-alive connections more numerous than
//!   workers are all served, none closed;
//! - a hand-off carries what the front read (a pipelined second request, a head that came
//!   in pieces); TLS listeners are served too (by the workers directly);
//! - a worker killed while it holds a handed-off connection loses only that request; the
//!   request timeout kills a stuck worker; recycling by request count loses nothing;
//! - the dynamic pool grows by requests waiting for a worker, not by open connections;
//! - privilege drop and the sandbox apply to fronts and workers; configurations hybrid mode
//!   cannot serve are refused before start (also by `start`, which leaves nothing behind);
//! - `status --json` and `metrics` show the fronts and the hand-offs;
//! - a request is handed off whole, however large (a body gathered by the front): slow
//!   bodies hold no worker, a large body reaches the worker byte for byte with one
//!   `100 Continue`, and a request a worker began to read goes back to the front rather
//!   than keep the worker waiting (issue 31).
//!
//! Regression tests for issue 21 ("Hybrid mode"). The request-level tests of the other
//! files run in hybrid mode too (`both_io!` in tests/util); reload and upgrade under load
//! are there (tests/reload.rs, tests/upgrade.rs).

mod util;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use util::*;

// ---------------------------------------------------------------------------------------
// Servers, the control socket, clients
// ---------------------------------------------------------------------------------------

/// Starts `example_name --io hybrid` on a loopback port of its choosing, with `args`.
fn hybrid(example_name: &str, args: &[&str]) -> Server {
    let mut all = vec!["-l", "127.0.0.1:0"];
    all.extend_from_slice(args);
    Server::start_io(example_name, Io::Hybrid, &all)
}

/// A server's control socket (`--control PATH`), and the subcommands that read it.
struct Control {
    example: &'static str,
    path: String,
}

impl Control {
    fn new(example: &'static str, tag: &str) -> Control {
        Control {
            example,
            path: socket_path(&format!("hybrid-{tag}")),
        }
    }

    /// `--control PATH`, to add to the server's arguments.
    fn args(&self) -> [&str; 2] {
        ["--control", &self.path]
    }

    /// The stdout of `EXAMPLE SUBCOMMAND... --control PATH`, which must succeed.
    fn run(&self, sub: &[&str]) -> String {
        let out = Command::new(example(self.example))
            .args(sub)
            .args(self.args())
            .output()
            .expect("run the control subcommand");
        assert!(
            out.status.success(),
            "{sub:?}: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn status(&self) -> Value {
        let text = self.run(&["status", "--json"]);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    /// Polls `status --json` until `f` accepts it (the fronts and workers publish their
    /// counts once per turn: what a test did shows a moment later).
    fn wait_for(&self, what: &str, mut f: impl FnMut(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        wait_until(|| {
            last = self.status();
            f(&last).then(|| last.clone())
        })
        .unwrap_or_else(|| panic!("never {what}; last status:\n{last:#}"))
    }

    fn metrics(&self) -> String {
        self.run(&["metrics"])
    }
}

/// A number of the status document (`v[a][b]`...), or panics naming it.
fn num(v: &Value, path: &[&str]) -> u64 {
    let mut at = v;
    for key in path {
        at = &at[key];
    }
    at.as_u64()
        .unwrap_or_else(|| panic!("no number at {path:?} in {v:#}"))
}

/// The workers of a status document.
fn status_workers(s: &Value) -> &[Value] {
    s["workers"].as_array().map_or(&[], Vec::as_slice)
}

/// The fronts of a status document (`hybrid.fronts`).
fn status_fronts(s: &Value) -> &[Value] {
    s["hybrid"]["fronts"].as_array().map_or(&[], Vec::as_slice)
}

/// The value of the sample `name` (without labels) in a metrics exposition.
fn metric(text: &str, name: &str) -> f64 {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parses");
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == name)
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    match sample.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        ref other => panic!("{name}: {other:?}"),
    }
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";
const HELLO: &[u8] = b"Hello, World!";

/// A keep-alive connection, its reads bounded by `timeout`.
fn open_with(addr: SocketAddr, timeout: Duration) -> BufReader<TcpStream> {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(timeout)).unwrap();
    BufReader::new(s)
}

fn open(addr: SocketAddr) -> BufReader<TcpStream> {
    open_with(addr, PATIENCE)
}

/// Reads one HTTP response from `c`: its status line and body.
fn read_response(c: &mut BufReader<TcpStream>) -> Result<(String, Vec<u8>), String> {
    let mut status = String::new();
    match c.read_line(&mut status) {
        Ok(0) => return Err("closed without a response".into()),
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return Err(format!("no answer within the read timeout ({e})"));
        }
        Err(e) => return Err(format!("status line: {e}")),
    }
    let mut len = 0;
    loop {
        let mut h = String::new();
        c.read_line(&mut h).map_err(|e| format!("header: {e}"))?;
        if h == "\r\n" {
            break;
        }
        if h.is_empty() {
            return Err("closed in the head".into());
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().map_err(|e| format!("content-length: {e}"))?;
        }
    }
    let mut body = vec![0; len];
    c.read_exact(&mut body).map_err(|e| format!("body: {e}"))?;
    Ok((status.trim_end().to_owned(), body))
}

/// Reads one response that must be a 200 with `body`.
fn expect_200(c: &mut BufReader<TcpStream>, body: &[u8]) -> Result<(), String> {
    let (status, got) = read_response(c)?;
    if !status.starts_with("HTTP/1.1 200") || got != body {
        return Err(format!(
            "{status:?} with body {:?} (expected {:?})",
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(body)
        ));
    }
    Ok(())
}

/// `GET /` on `c`, answered `Hello, World!`.
fn hello(c: &mut BufReader<TcpStream>) -> Result<(), String> {
    c.get_mut().write_all(GET).map_err(|e| format!("send: {e}"))?;
    expect_200(c, HELLO)
}

/// `GET /` on a new connection that the request closes, reading with a timeout of
/// `bound`: how long it took to be answered `Hello, World!`, or what went wrong.
fn try_hello_once(addr: SocketAddr, bound: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let mut c = open_with(addr, bound);
    c.get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    expect_200(&mut c, HELLO)?;
    Ok(started.elapsed())
}

/// [`try_hello_once`]; panics unless it is answered within `bound`.
fn hello_once(addr: SocketAddr, bound: Duration) -> Duration {
    let took = try_hello_once(addr, bound).unwrap_or_else(|e| panic!("a new client: {e}"));
    assert!(took < bound, "a new client took {took:?} (bound {bound:?})");
    took
}

/// Everything the server sends on `c` until it closes it (a reset counts as a close), or
/// the error that ended the read (a timeout: it was not closed).
fn try_rest(c: &mut BufReader<TcpStream>) -> Result<String, String> {
    let mut out = Vec::new();
    match c.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => return Err(format!("not closed ({e}); read so far: {out:?}")),
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn rest(c: &mut BufReader<TcpStream>) -> String {
    try_rest(c).unwrap_or_else(|e| panic!("the connection: {e}"))
}

/// `PING` on a Redis-protocol connection, answered `+PONG`.
fn ping(c: &mut BufReader<TcpStream>) -> Result<(), String> {
    c.get_mut()
        .write_all(b"PING\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut line = String::new();
    match c.read_line(&mut line) {
        Ok(0) => Err("closed by the server".into()),
        Ok(_) if line == "+PONG\r\n" => Ok(()),
        Ok(_) => Err(format!("reply {line:?}")),
        Err(e) => Err(format!("read: {e}")),
    }
}

// ---------------------------------------------------------------------------------------
// 1–2. Floods and keep-alive clients beyond the worker count
// ---------------------------------------------------------------------------------------

/// Issue 21: 300 slowloris connections (half a request head, then nothing) from 127.0.0.2
/// and 300 idle keep-alive connections (one request answered, then nothing) from 127.0.0.3
/// are all held by the front; two blocking workers serve a normal client's 50 requests
/// from 127.0.0.1 (new connections and keep-alive), each within a generous bound, and are
/// not held meanwhile. In blocking mode the first two connections to arrive take the two
/// workers and the normal client waits for the header timeout.
#[test]
fn issue_21_slowloris_and_idle_floods_cost_no_worker() {
    const N: usize = 300;
    // The test's 600 sockets and the normal client's, and some margin.
    if !raise_nofile(2 * N as u64 + 200) {
        return;
    }
    let ctl = Control::new("http_hello", "flood");
    let mut args = vec![
        "-w",
        "2",
        "--backlog",
        "4096",
        // Long enough that nothing the flood holds times out during the test.
        "--header-timeout",
        "300",
        "--keepalive-timeout",
        "300",
    ];
    args.extend(ctl.args());
    let server = hybrid("http_hello", &args);
    let addr = server.tcp_addr();
    let workers = server.wait_for_workers(2);

    // The normal client: 50 requests, on new connections and on one kept alive, each
    // answered within the bound.
    let bound = Duration::from_secs(10);
    let mut worst = Duration::ZERO;
    let mut normal = |new: usize, kept: usize| {
        for _ in 0..new {
            worst = worst.max(hello_once(addr, bound));
        }
        let mut keep = open_with(addr, bound);
        for i in 0..kept {
            let started = Instant::now();
            hello(&mut keep).unwrap_or_else(|e| panic!("keep-alive request {i}: {e}"));
            worst = worst.max(started.elapsed());
        }
    };

    let slowloris: Vec<TcpStream> = (0..N)
        .map(|_| {
            let mut s = connect_from("127.0.0.2", addr);
            s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ").unwrap();
            s
        })
        .collect();
    // Served beside the slowloris connections (blocking workers would be held by them).
    normal(10, 10);

    // The idle flood sends its requests all at once, then reads every answer. A generous
    // read timeout: each worker may hold each of these connections up to 100 ms after its
    // answer (the hold, waiting for a next request that never comes), so 300 of them on
    // two workers can take 15 s.
    let setup = Instant::now();
    let mut idle: Vec<BufReader<TcpStream>> = (0..N)
        .map(|_| {
            let s = connect_from("127.0.0.3", addr);
            s.set_read_timeout(Some(4 * PATIENCE)).unwrap();
            BufReader::new(s)
        })
        .collect();
    for c in &mut idle {
        c.get_mut().write_all(GET).unwrap();
    }
    for (i, c) in idle.iter_mut().enumerate() {
        expect_200(c, HELLO).unwrap_or_else(|e| panic!("idle connection {i}: {e}"));
    }
    eprintln!(
        "the idle flood's {N} requests were answered in {:?}",
        setup.elapsed()
    );
    // And beside both floods.
    normal(20, 10);
    eprintln!("worst latency of the normal client beside the floods: {worst:?}");

    // The fronts hold the 600 connections; the two workers are idle, not held by them.
    let s = ctl.wait_for("the fronts holding the floods, both workers idle", |s| {
        num(s, &["hybrid", "held"]) >= 2 * N as u64
            && status_workers(s).len() == 2
            && status_workers(s).iter().all(|w| w["state"] == "idle")
    });
    let held = num(&s, &["hybrid", "held"]);
    assert!(
        held <= 2 * N as u64 + 2,
        "about {} connections held: {s:#}",
        2 * N
    );
    let reading: u64 = status_fronts(&s).iter().map(|f| num(f, &["reading"])).sum();
    assert!(
        reading >= N as u64,
        "the slowloris connections are reading: {s:#}"
    );
    assert!(
        num(&s, &["hybrid", "idle_keepalive"]) >= N as u64,
        "the idle ones are idle keep-alive: {s:#}"
    );
    assert_eq!(server.worker_pids(), workers, "the same two workers throughout");

    // Held, not cut: every flood connection is still open.
    for (i, s) in slowloris
        .iter()
        .chain(idle.iter().map(BufReader::get_ref))
        .enumerate()
    {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        match (&*s).read(&mut b) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("flood connection {i} was not held open: {other:?}"),
        }
    }
}

/// Issue 21: 40 Redis-protocol keep-alive connections on two workers, each sending PING 20
/// times, round-robin (every request on a different connection from the one before, so
/// each connection is idle between its requests while the others are served): every reply
/// is `+PONG` and the server closes none. Blocking workers give idle connections up to
/// serve the others (a Redis client takes that for a failure). No request waits for a
/// worker's 100 ms linger on a quiet connection to end: the front wakes a lingering
/// worker.
#[test]
fn issue_21_keepalive_connections_more_numerous_than_workers_are_all_served() {
    const CONNECTIONS: usize = 40;
    const ROUNDS: usize = 20;
    let server = hybrid("ping", &["-w", "2", "--keepalive-timeout", "300"]);
    let addr = server.tcp_addr();
    let workers = server.wait_for_workers(2);
    let mut conns: Vec<BufReader<TcpStream>> = (0..CONNECTIONS).map(|_| open(addr)).collect();
    let started = Instant::now();
    for round in 0..ROUNDS {
        for (i, c) in conns.iter_mut().enumerate() {
            ping(c).unwrap_or_else(|e| panic!("round {round}, connection {i}: {e}"));
        }
    }
    let took = started.elapsed();
    eprintln!(
        "{} PINGs round-robin over {CONNECTIONS} connections in {took:?}",
        CONNECTIONS * ROUNDS
    );
    assert_eq!(server.worker_pids(), workers, "two workers served them all");
    // Each PING comes on a connection that has been quiet while the others were served:
    // its request is not paced by the workers' 100 ms linger on the connections before it
    // (a front wakes a lingering worker), which took 40 s here (800 x 50 ms on average).
    assert!(
        took < Duration::from_secs(20),
        "{took:?}: requests waited for lingers to end"
    );
}

/// Issue 21: a worker keeps a connection after a response only while its next request
/// comes; while other complete requests wait for a worker, a quiet connection goes back to
/// the front within 2 ms, so waiting requests are not paced by the 100 ms hold. 200 keep-alive
/// clients that each send one request at once, on two workers, are all answered within
/// 5 s (blocking mode, whose responses announce the close when clients queue, takes about
/// 0.5 s; a worker that waits out the 100 ms hold after each of them takes 10 s).
#[test]
fn issue_21_a_quiet_connection_goes_back_at_once_while_requests_wait() {
    const N: usize = 200;
    if !raise_nofile(N as u64 + 100) {
        return;
    }
    let server = hybrid(
        "http_hello",
        &["-w", "2", "--backlog", "1024", "--keepalive-timeout", "60"],
    );
    let addr = server.tcp_addr();
    server.wait_for_workers(2);
    let mut conns: Vec<BufReader<TcpStream>> = (0..N).map(|_| open_with(addr, 4 * PATIENCE)).collect();
    let started = Instant::now();
    for c in &mut conns {
        c.get_mut().write_all(GET).unwrap();
    }
    for (i, c) in conns.iter_mut().enumerate() {
        expect_200(c, HELLO).unwrap_or_else(|e| panic!("connection {i}: {e}"));
    }
    let took = started.elapsed();
    eprintln!("{N} one-request keep-alive clients on two workers answered in {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "{N} requests took {took:?}: the workers waited on quiet connections"
    );
}

/// Issue 21: while a request waits for a worker, the worker keeps a connection whose client
/// never pauses for at most 100 requests (or 5 ms), then hands it back and takes the
/// waiting one: with one worker, a client that sends request after request, each the
/// moment its answer comes, does not keep a second client from being answered. (The second
/// client's request goes in once the first has been answered once, so that the worker holds
/// the first connection by then.) Without the bound, the second waits until the first
/// stops, here after 20,000 requests.
#[test]
fn issue_21_a_client_that_never_pauses_does_not_keep_the_only_worker() {
    const LIMIT: usize = 20_000;
    let server = hybrid(
        "http_hello",
        &[
            "-w",
            "1",
            "--keepalive-timeout",
            "60",
            "--keepalive-requests",
            "100000",
        ],
    );
    let addr = server.tcp_addr();
    server.wait_for_workers(1);
    let answered = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (first, behind) = std::thread::scope(|s| {
        let fast = s.spawn(|| {
            let mut c = open(addr);
            let mut n = 0;
            while n < LIMIT && !stop.load(Ordering::SeqCst) {
                hello(&mut c).unwrap_or_else(|e| panic!("the fast client, request {n}: {e}"));
                n += 1;
                answered.store(n, Ordering::SeqCst);
            }
            n
        });
        // Synchronisation, not a delay: the fast client's first answer has come.
        while answered.load(Ordering::SeqCst) == 0 && !fast.is_finished() {
            std::thread::yield_now();
        }
        let mut c = open(addr);
        let result = hello(&mut c);
        let behind = answered.load(Ordering::SeqCst);
        stop.store(true, Ordering::SeqCst);
        result.unwrap_or_else(|e| panic!("the second client: {e}"));
        (fast.join().unwrap(), behind)
    });
    eprintln!("the second client was answered after {behind} of the fast client's {first} requests");
    assert!(
        behind < LIMIT,
        "the second client waited until the fast one stopped ({behind} requests)"
    );
}

// ---------------------------------------------------------------------------------------
// 3–4. What a hand-off carries: bytes already read, TLS
// ---------------------------------------------------------------------------------------

/// Issue 21: two requests pipelined in one write reach the worker with the hand-off (the
/// front read both) and are answered in order on the same connection; a head that arrives
/// in two writes is held by the front (no worker is taken meanwhile) and answered once
/// whole.
#[test]
fn issue_21_a_hand_off_carries_the_bytes_already_read() {
    let ctl = Control::new("http_hello", "bytes");
    let mut args = vec!["-w", "2"];
    args.extend(ctl.args());
    let server = hybrid("http_hello", &args);
    let addr = server.tcp_addr();

    // Pipelined: different paths, so the order shows.
    let mut c = open(addr);
    c.get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\nGET /sleep?ms=0 HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    expect_200(&mut c, HELLO).unwrap_or_else(|e| panic!("first pipelined request: {e}"));
    expect_200(&mut c, b"slept\n").unwrap_or_else(|e| panic!("second pipelined request: {e}"));
    hello(&mut c).unwrap_or_else(|e| panic!("the same connection afterwards: {e}"));
    drop(c);

    // In two writes: the front holds the first part (its connection shows reading, both
    // workers idle), then the rest completes the request.
    let mut c = open(addr);
    c.get_mut().write_all(b"GET / HTTP/1.1\r\nHo").unwrap();
    ctl.wait_for("the front reading the partial request, the workers idle", |s| {
        status_fronts(s).iter().map(|f| num(f, &["reading"])).sum::<u64>() == 1
            && status_workers(s).iter().all(|w| w["state"] == "idle")
    });
    c.get_mut().write_all(b"st: t\r\n\r\n").unwrap();
    expect_200(&mut c, HELLO).unwrap_or_else(|e| panic!("the request sent in two writes: {e}"));
    hello(&mut c).unwrap_or_else(|e| panic!("the same connection afterwards: {e}"));
}

/// A test CA and the server certificate it issues (valid for localhost), in a directory
/// removed at the end.
struct Pki {
    dir: PathBuf,
    ca: rustls::pki_types::CertificateDer<'static>,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let dir = std::env::temp_dir().join(format!("appsrv-hybrid-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "appsrv test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "localhost");
        let key = KeyPair::generate().unwrap();
        let cert = params
            .signed_by(&key, &Issuer::from_params(&ca_params, &ca_key))
            .unwrap();
        std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
        Pki {
            dir,
            ca: ca.der().clone(),
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(ring_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to `addr`, its handshake done.
fn tls_connect(addr: SocketAddr, config: &Arc<rustls::ClientConfig>) -> BufReader<Tls> {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(PATIENCE)).unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn
            .complete_io(&mut tls.sock)
            .unwrap_or_else(|e| panic!("TLS handshake with {addr}: {e}"));
    }
    BufReader::new(tls)
}

/// `GET /` over TLS, answered `Hello, World!`.
fn tls_hello(tls: &mut BufReader<Tls>) -> Result<(), String> {
    tls.get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut status = String::new();
    tls.read_line(&mut status).map_err(|e| format!("status: {e}"))?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!("status {status:?}"));
    }
    let mut len = 0;
    loop {
        let mut h = String::new();
        tls.read_line(&mut h).map_err(|e| format!("header: {e}"))?;
        if h == "\r\n" {
            break;
        }
        if h.is_empty() {
            return Err("closed in the head".into());
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    tls.read_exact(&mut body).map_err(|e| format!("body: {e}"))?;
    if body != HELLO {
        return Err(format!("body {:?}", String::from_utf8_lossy(&body)));
    }
    Ok(())
}

/// `http_hello --io hybrid -w 2` with its plain listener first and a TLS one (a test
/// certificate named `name`), a control socket, and a keep-alive timeout of 60 s.
fn hybrid_with_tls(name: &str) -> (Pki, Control, Server) {
    let pki = Pki::new(name);
    let ctl = Control::new("http_hello", name);
    let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
    let mut args = vec![
        "-l",
        "127.0.0.1:0?tls",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "-w",
        "2",
        "--keepalive-timeout",
        "60",
    ];
    args.extend(ctl.args());
    let server = hybrid("http_hello", &args);
    (pki, ctl, server)
}

/// Issue 21: a hybrid server with a plain listener and a TLS one serves keep-alive
/// requests on both, at once. The plain connection goes through the front (counted as
/// handed off); the TLS one is accepted and served by a worker directly, as in blocking
/// mode: rustls state cannot cross processes, and this implementation chose to serve TLS
/// listeners without a hand-off (docs/ARCHITECTURE.md, "Hybrid mode"), so an idle TLS
/// connection does hold a worker (`--max-conns-per-ip` is the defence there).
#[test]
fn issue_21_tls_and_plain_listeners_both_serve_in_hybrid_mode() {
    let (pki, ctl, server) = hybrid_with_tls("tls");
    let listening = server.listening();
    assert_eq!(listening.len(), 2, "{listening:?}");
    // The plain listener is the first -l; the TLS one logs its address with the option.
    let plain: SocketAddr = listening[0].parse().expect("the plain listener first");
    let tls_addr: SocketAddr = listening[1]
        .trim_end_matches("?tls")
        .split_whitespace()
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("a TLS address in {listening:?}"));
    assert_ne!(plain, tls_addr);

    let mut c = open(plain);
    let mut tls = tls_connect(tls_addr, &pki.client_config());
    for i in 0..5 {
        hello(&mut c).unwrap_or_else(|e| panic!("plain keep-alive request {i}: {e}"));
        tls_hello(&mut tls).unwrap_or_else(|e| panic!("TLS keep-alive request {i}: {e}"));
    }
    ctl.wait_for("the plain connection handed off, then back in the front", |s| {
        num(s, &["hybrid", "handed_off"]) >= 1 && num(s, &["hybrid", "idle_keepalive"]) == 1
    });
    // Both again, the plain connection now back from the front's keeping.
    hello(&mut c).unwrap_or_else(|e| panic!("plain, after the hand-back: {e}"));
    tls_hello(&mut tls).unwrap_or_else(|e| panic!("TLS, at the end: {e}"));
}

/// Issue 21 (review): on a stop the fronts drain first: a keep-alive client idle in a
/// front whose next request comes during the drain wait gets it answered by a worker. With
/// a TLS listener, which hybrid workers watch beside the channel, the master's shutdown of
/// the listeners woke every idle worker, which left at once: the fronts then handed the
/// drained request to nobody, and the client saw its connection closed without a response.
#[test]
fn issue_21_a_stop_with_a_tls_listener_answers_what_the_fronts_drain() {
    let (_pki, ctl, server) = hybrid_with_tls("stop-tls");
    let plain: SocketAddr = server.listening()[0].parse().expect("the plain listener first");
    let mut c = open(plain);
    hello(&mut c).unwrap_or_else(|e| panic!("before the stop: {e}"));
    ctl.wait_for("the connection idle in the front", |s| {
        num(s, &["hybrid", "idle_keepalive"]) == 1
    });
    server.signal(libc::SIGTERM);
    server.wait_for_log("SIGTERM received: stopping");
    // Within the drain wait (1 s): answered, as the connection's last.
    let sent = Instant::now();
    c.get_mut().write_all(GET).unwrap();
    let answered = read_response(&mut c);
    assert!(
        matches!(&answered, Ok((status, body)) if status.starts_with("HTTP/1.1 200") && body == HELLO),
        "the request sent {:?} into the stop: {answered:?}\n{}",
        sent.elapsed(),
        server.log_text()
    );
}

/// Issue 31: a stop serves the requests waiting in the hand-off channel. Under 16 keep-alive
/// clients against 2 workers, about 14 complete requests wait there at any moment. Told to
/// stop once the fronts had left, a worker left after the connection it held, and the
/// channel's connections were closed unanswered when the master exited (14 of 14 lost, as
/// at an upgrade: tests/upgrade.rs). A client may find its next connection refused or reset
/// (a stop shuts the listeners), but a request on a connection the server had taken is
/// answered.
#[test]
fn issue_31_a_stop_answers_the_requests_waiting_in_the_channel() {
    let mut server = hybrid("http_hello", &["-w", "2"]);
    let addr = server.tcp_addr();
    let mut stopped = None;
    let (done, failures) = under_keepalive_load(addr, 16, |answered| {
        let at = answered();
        assert!(
            wait_until(|| (answered() > at + 200).then_some(())).is_some(),
            "no request answered; log:\n{}",
            server.log_text()
        );
        server.signal(libc::SIGTERM);
        stopped = Some(server.wait_exit());
    });
    assert!(
        stopped.is_some_and(|s| s.success()),
        "{stopped:?}\n{}",
        server.log_text()
    );
    let lost: Vec<_> = failures
        .iter()
        .filter(|f| f.contains("reused connection"))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {done} requests on connections the server had taken went unanswered: {lost:?}\n{}",
        lost.len(),
        server.log_text()
    );
    assert!(
        !server.log_text().contains("left in the hand-off channel"),
        "{}",
        server.log_text()
    );
}

// ---------------------------------------------------------------------------------------
// 5, 8, 9. Workers that die, are killed or recycled
// ---------------------------------------------------------------------------------------

/// The pid of the worker serving `client` (status: its `client`, or a request that
/// starts with `request`), if any.
fn worker_serving(s: &Value, client: &str, request: &str) -> Option<i32> {
    status_workers(s)
        .iter()
        .find(|w| {
            w["client"].as_str() == Some(client)
                || w["request"].as_str().is_some_and(|r| r.starts_with(request))
        })
        .and_then(|w| w["pid"].as_i64())
        .map(|p| p as i32)
}

/// Issue 21: a worker SIGKILLed while it holds a handed-off connection (a `/sleep`
/// request) loses only that request: its client's connection ends without a response (the
/// front kept no copy that would leave it hanging), a keep-alive client served before the
/// kill is served after it on the same connection, clients loading the server throughout
/// see no failure, and the master replaces the worker.
#[test]
fn issue_21_a_worker_killed_while_holding_a_connection_loses_only_that_request() {
    let ctl = Control::new("http_hello", "kill");
    let mut args = vec!["-w", "2", "--keepalive-timeout", "60"];
    args.extend(ctl.args());
    let server = hybrid("http_hello", &args);
    let addr = server.tcp_addr();
    server.wait_for_workers(2);

    let mut b = open(addr);
    for i in 0..3 {
        hello(&mut b).unwrap_or_else(|e| panic!("B before the kill, request {i}: {e}"));
    }
    let mut a = open(addr);
    let a_addr = a.get_ref().local_addr().unwrap().to_string();
    a.get_mut()
        .write_all(b"GET /sleep?ms=10000 HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    // B at rest in the front (its worker held it 100 ms, then handed it back), so that
    // only the front has it when a worker dies.
    let s = ctl.wait_for("a worker serving A, B idle in the front", |s| {
        worker_serving(s, &a_addr, "GET /sleep").is_some() && num(s, &["hybrid", "idle_keepalive"]) == 1
    });
    let victim = worker_serving(&s, &a_addr, "GET /sleep").unwrap();
    assert!(
        server.worker_pids().contains(&victim),
        "{victim} is a worker: {s:#}"
    );

    // Nothing in `during` may panic: the load's clients stop only when it returns. What it
    // sees is checked afterwards.
    let mut a_answer = Ok(String::new());
    let mut replaced = None;
    let mut b_after = Vec::new();
    let (done, failures) = under_http_load(addr, || {
        // SAFETY: kill(2) on a worker of the server this test started.
        if unsafe { libc::kill(victim, libc::SIGKILL) } != 0 {
            a_answer = Err(format!("kill {victim}: {}", std::io::Error::last_os_error()));
            return;
        }
        a_answer = try_rest(&mut a);
        replaced = wait_until(|| {
            let w = server.worker_pids();
            (w.len() == 2 && !w.contains(&victim)).then_some(())
        });
        b_after = (0..3).map(|_| hello(&mut b)).collect();
    });
    assert_eq!(
        a_answer.as_deref(),
        Ok(""),
        "A's connection ends without a response"
    );
    assert!(replaced.is_some(), "not replaced; log:\n{}", server.log_text());
    for (i, r) in b_after.iter().enumerate() {
        assert!(r.is_ok(), "B after the kill, request {i}: {r:?}");
    }
    assert!(failures.is_empty(), "failed requests out of {done}: {failures:?}");
    assert!(done > 0, "the load was served");
    assert_eq!(server.front_pids().len(), 1, "the front lives on");
}

/// Issue 21: recycling by request count in hybrid mode: 1,000 PINGs over four keep-alive
/// connections (one thread each, so the workers hold connections while others wait) to
/// two workers with `--max-requests 50` are all answered, none of the connections is
/// closed (a Redis client cannot be told to reconnect: a retiring worker hands its
/// connection back to the front, and a new worker takes it), and the log shows workers
/// recycled. (A worker checks its limit when a connection leaves it, so it may serve past
/// 50 on a connection it holds: up to 100 requests while others wait.)
#[test]
fn issue_21_recycling_by_request_count_loses_no_request() {
    const CLIENTS: usize = 4;
    const EACH: usize = 250;
    let server = hybrid(
        "ping",
        &["-w", "2", "--max-requests", "50", "--keepalive-timeout", "60"],
    );
    let addr = server.tcp_addr();
    let failures: Vec<String> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..CLIENTS)
            .map(|i| {
                s.spawn(move || {
                    let mut c = open(addr);
                    for n in 0..EACH {
                        if let Err(e) = ping(&mut c) {
                            return Some(format!("client {i}, PING {n}: {e}"));
                        }
                    }
                    None
                })
            })
            .collect();
        threads.into_iter().filter_map(|t| t.join().unwrap()).collect()
    });
    assert!(
        failures.is_empty(),
        "failed: {failures:?}; log:\n{}",
        server.log_text()
    );
    server.wait_for_log("reached its recycling limit; asking the master for a replacement");
    // 1,000 requests, 50 per worker: many recyclings, each after its replacement is ready.
    server.wait_for_nth_log(") recycled", 2);
    server.wait_for_workers(2);
}

/// Issue 21: `--request-timeout` in hybrid mode: the worker whose handler runs past it (a
/// `/sleep` longer than the timeout, on a handed-off connection) is killed with a log line
/// naming it and the client, its connection ends without a response, the master replaces
/// it, and the next client is served.
#[test]
fn issue_21_a_stuck_handler_is_killed_after_the_request_timeout() {
    let server = hybrid("http_hello", &["-w", "2", "--request-timeout", "1"]);
    let addr = server.tcp_addr();
    let before = server.wait_for_workers(2);
    let mut stuck = open(addr);
    let me = stuck.get_ref().local_addr().unwrap();
    stuck
        .get_mut()
        .write_all(b"GET /sleep?ms=5000 HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let line = server.wait_for_log("exceeded the request timeout of 1.0s");
    let pid: i32 = line
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("names the worker's pid: {line}"));
    assert!(before.contains(&pid), "one of the workers: {line}");
    assert!(line.contains(&me.to_string()), "names the client {me}: {line}");
    assert_eq!(
        rest(&mut stuck),
        "",
        "the stuck connection ends without a response"
    );
    let replaced = wait_until(|| {
        let w = server.worker_pids();
        (w.len() == 2 && !w.contains(&pid)).then_some(())
    });
    assert!(replaced.is_some(), "not replaced; log:\n{}", server.log_text());
    hello_once(addr, PATIENCE);
    let mut c = open(addr);
    hello(&mut c).unwrap_or_else(|e| panic!("a keep-alive client after the kill: {e}"));
}

// ---------------------------------------------------------------------------------------
// 6. Configurations hybrid mode cannot serve
// ---------------------------------------------------------------------------------------

/// A directory for the `start` attempts' pid file, control socket and log; dropping it
/// kills every process whose command line names it (a daemon left behind), whatever
/// happened.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("appsrv-hybrid-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }

    /// Live processes whose command line names this directory.
    fn processes(&self) -> Vec<i32> {
        processes_naming(&self.0)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for pid in self.processes() {
            // SAFETY: kill(2) on processes this test started (their command line names
            // its private directory).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `example_name` with `args` to its end, with no variable of its prefix inherited
/// from the test's environment.
fn run(example_name: &str, args: &[&str]) -> Output {
    let prefix = format!("{}_", example_name.to_ascii_uppercase());
    let mut cmd = Command::new(example(example_name));
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with(&prefix) {
            cmd.env_remove(var);
        }
    }
    cmd.args(args).output().expect("run the example")
}

/// Issue 21: `--io hybrid` with a `handle_client` server (hello: the message points to
/// `--max-conns-per-ip`), with a handler that keeps per-connection state (kv: its
/// `Session`), and together with `--exec-workers` is a configuration error: in the
/// foreground and with `start`, which fails on the terminal before detaching and leaves
/// no pid file and no process behind.
#[test]
fn issue_21_configurations_hybrid_mode_cannot_serve_are_refused_before_start() {
    let cases: [(&str, &[&str], &str); 3] = [
        ("hello", &[], "--max-conns-per-ip"),
        ("kv", &[], "Session"),
        ("http_hello", &["--exec-workers"], "--exec-workers"),
    ];
    for (name, extra, says) in cases {
        let mut args = vec!["-l", "127.0.0.1:0", "--io", "hybrid"];
        args.extend_from_slice(extra);

        let out = run(name, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} {args:?} ran: {err}");
        assert!(
            err.contains("error: invalid configuration: --io hybrid") && err.contains(says),
            "{name} {args:?}: a clear message naming {says:?}: {err}"
        );
        assert!(!err.contains("ready"), "{name}: refused before start: {err}");

        let dir = Scratch::new(&format!("refused-{name}"));
        let (pid_file, sock, log) = (dir.path("pid"), dir.path("ctl.sock"), dir.path("log"));
        let mut start = vec![
            "start",
            "--pid-file",
            &pid_file,
            "--control",
            &sock,
            "--log-file",
            &log,
        ];
        start.extend_from_slice(&args);
        let out = run(name, &start);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} start {args:?} succeeded: {err}");
        assert!(
            err.contains("--io hybrid") && err.contains(says),
            "{name} start: the message on the terminal: {err}"
        );
        assert!(!Path::new(&pid_file).exists(), "{name} start: no pid file");
        assert!(
            wait_until(|| dir.processes().is_empty().then_some(())).is_some(),
            "{name} start left {:?} running",
            dir.processes()
        );
    }
}

// ---------------------------------------------------------------------------------------
// 7. The dynamic pool
// ---------------------------------------------------------------------------------------

/// Issue 21: a dynamic pool in hybrid mode sizes itself by the requests waiting for a
/// worker, not by open connections: 200 idle keep-alive connections (each answered once)
/// leave it at (or bring it back to) its start size, 2, where a blocking pool would keep
/// a worker per connection; then 16 concurrent `/sleep?ms=300` requests make it grow.
#[test]
fn issue_21_the_dynamic_pool_grows_by_requests_waiting_not_by_connections() {
    const IDLE: usize = 200;
    if !raise_nofile(IDLE as u64 + 200) {
        return;
    }
    let ctl = Control::new("http_hello", "pool");
    let mut args = vec![
        "--pool",
        "dynamic",
        "--start-workers",
        "2",
        "--min-spare",
        "1",
        "--max-spare",
        "2",
        "--max-workers",
        "8",
        "--keepalive-timeout",
        "300",
        "--backlog",
        "1024",
    ];
    args.extend(ctl.args());
    let server = hybrid("http_hello", &args);
    let addr = server.tcp_addr();
    server.wait_for_workers(2);

    let mut idle: Vec<BufReader<TcpStream>> = (0..IDLE).map(|_| open_with(addr, 4 * PATIENCE)).collect();
    for (i, c) in idle.iter_mut().enumerate() {
        hello(c).unwrap_or_else(|e| panic!("idle connection {i}: {e}"));
    }
    // While the requests came, they waited for a worker, and the pool may have grown for
    // them; with all 200 answered and idle in the front, it is back at 2 (a surplus idle
    // worker retires each second) and stays there: idle connections hold no worker.
    ctl.wait_for("200 idle connections in the front, 2 workers", |s| {
        num(s, &["hybrid", "idle_keepalive"]) >= IDLE as u64 && status_workers(s).len() == 2
    });
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(2) {
        let n = server.worker_pids().len();
        assert!(
            n <= 2,
            "{n} workers for {IDLE} idle connections; log:\n{}",
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(20)); // sampling a count, not synchronising
    }

    // 16 concurrent slow requests, repeated until the pool has grown (or the deadline).
    let grown = AtomicBool::new(false);
    let answered = AtomicUsize::new(0);
    let deadline = Instant::now() + 2 * PATIENCE;
    let most = std::thread::scope(|s| {
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let (grown, answered) = (&grown, &answered);
                s.spawn(move || {
                    let mut c = open_with(addr, 4 * PATIENCE);
                    while !grown.load(Ordering::Relaxed) && Instant::now() < deadline {
                        c.get_mut()
                            .write_all(b"GET /sleep?ms=300 HTTP/1.1\r\nHost: t\r\n\r\n")
                            .unwrap();
                        expect_200(&mut c, b"slept\n").unwrap_or_else(|e| panic!("slow client {i}: {e}"));
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let mut most = 0;
        while Instant::now() < deadline && most <= 2 {
            most = most.max(server.worker_pids().len());
            std::thread::sleep(Duration::from_millis(20)); // sampling a count
        }
        grown.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        most
    });
    assert!(
        most > 2,
        "the pool never grew for 16 waiting requests ({} answered); log:\n{}",
        answered.load(Ordering::Relaxed),
        server.log_text()
    );
    // The idle connections were kept throughout.
    for (i, c) in idle.iter_mut().take(5).enumerate() {
        hello(c).unwrap_or_else(|e| panic!("idle connection {i} afterwards: {e}"));
    }
}

// ---------------------------------------------------------------------------------------
// 10. Privilege drop and the sandbox
// ---------------------------------------------------------------------------------------

/// `nobody`'s uid.
fn nobody_uid() -> u32 {
    let name = std::ffi::CString::new("nobody").unwrap();
    // SAFETY: getpwnam with a valid C string; the result is read before any other call.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(!pw.is_null(), "no user nobody");
    // SAFETY: pw is non-null and points to libc's static passwd entry.
    unsafe { (*pw).pw_uid }
}

/// A field of `/proc/PID/status` (`Seccomp`, `NoNewPrivs`).
fn status_field(pid: i32, field: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_owned()
}

/// Issue 21: with `--user nobody --sandbox`, fronts and workers both run as nobody under
/// the seccomp filter (the master stays root), and the server serves, on new and
/// keep-alive connections. Needs root; reported ignored otherwise (tests/conditional.rs).
fn issue_21_fronts_and_workers_drop_privileges_and_are_sandboxed() {
    let uid = nobody_uid();
    let server = hybrid(
        "http_hello",
        &["-w", "2", "--fronts", "2", "--user", "nobody", "--sandbox"],
    );
    let addr = server.tcp_addr();
    let workers = server.wait_for_workers(2);
    let fronts = wait_until(|| {
        let f = server.front_pids();
        (f.len() == 2).then_some(f)
    })
    .unwrap_or_else(|| panic!("two fronts; log:\n{}", server.log_text()));
    for _ in 0..5 {
        hello_once(addr, PATIENCE);
    }
    let mut c = open(addr);
    for i in 0..5 {
        hello(&mut c).unwrap_or_else(|e| panic!("keep-alive request {i}: {e}"));
    }
    for (what, pids) in [("front", &fronts), ("worker", &workers)] {
        for &pid in pids {
            assert_eq!(
                proc_ids(pid, "Uid:")[..3],
                [uid; 3],
                "{what} {pid} runs as nobody"
            );
            assert_eq!(status_field(pid, "Seccomp"), "2", "{what} {pid} is sandboxed");
            assert_eq!(status_field(pid, "NoNewPrivs"), "1", "{what} {pid}");
        }
    }
    assert_eq!(
        proc_ids(server.pid(), "Uid:")[..3],
        [0; 3],
        "the master stays root"
    );
    assert_eq!(server.worker_pids(), workers, "no worker died serving");
    assert_eq!(server.front_pids(), fronts, "no front died serving");
}

// ---------------------------------------------------------------------------------------
// 11. Status and metrics
// ---------------------------------------------------------------------------------------

/// Issue 21: after requests on new connections, `status --json` counts them as handed off
/// and lists the fronts (`--fronts 2`) with the pids of the master's front processes, the
/// workers list holds only the workers, and `metrics` exports the hand-offs, the requests
/// waiting, the fronts and the connections they hold.
#[test]
fn issue_21_status_and_metrics_show_the_fronts_and_the_hand_offs() {
    const NEW: u64 = 10;
    let ctl = Control::new("http_hello", "status");
    let mut args = vec!["-w", "2", "--fronts", "2", "--keepalive-timeout", "60"];
    args.extend(ctl.args());
    let server = hybrid("http_hello", &args);
    let addr = server.tcp_addr();
    let worker_pids = server.wait_for_workers(2);
    let front_pids = wait_until(|| {
        let f = server.front_pids();
        (f.len() == 2).then_some(f)
    })
    .unwrap_or_else(|| panic!("two fronts; log:\n{}", server.log_text()));

    for _ in 0..NEW {
        hello_once(addr, PATIENCE);
    }
    // One idle keep-alive connection, for the front's count of what it holds.
    let mut idle = open(addr);
    hello(&mut idle).unwrap();

    let s = ctl.wait_for("the hand-offs counted, the idle connection in a front", |s| {
        num(s, &["hybrid", "handed_off"]) > NEW && num(s, &["hybrid", "idle_keepalive"]) == 1
    });
    let h = &s["hybrid"];
    assert_eq!(num(h, &["requests_waiting"]), 0, "{s:#}");
    assert!(num(h, &["held"]) >= 1, "{s:#}");
    let listed: HashSet<i32> = status_fronts(&s)
        .iter()
        .map(|f| num(f, &["pid"]) as i32)
        .collect();
    assert_eq!(listed, front_pids, "the fronts listed are the master's: {s:#}");
    let per_front: u64 = status_fronts(&s).iter().map(|f| num(f, &["handed_off"])).sum();
    assert_eq!(per_front, num(h, &["handed_off"]), "the fronts' sum: {s:#}");
    for f in status_fronts(&s) {
        for key in [
            "id",
            "generation",
            "connections",
            "open",
            "reading",
            "idle_keepalive",
        ] {
            num(f, &[key]);
        }
        assert!(f["state"].is_string(), "{f:#}");
    }
    let listed: HashSet<i32> = status_workers(&s)
        .iter()
        .map(|w| num(w, &["pid"]) as i32)
        .collect();
    assert_eq!(listed, worker_pids, "the workers list has no front: {s:#}");

    let text = ctl.metrics();
    assert!(metric(&text, "appsrv_handoffs_total") > NEW as f64, "{text}");
    assert_eq!(metric(&text, "appsrv_requests_waiting"), 0.0, "{text}");
    assert_eq!(metric(&text, "appsrv_fronts"), 2.0, "{text}");
    assert!(metric(&text, "appsrv_front_connections") >= 1.0, "{text}");

    let table = ctl.run(&["status"]);
    for pid in &front_pids {
        assert!(
            table.contains(&pid.to_string()),
            "the text status lists front {pid}:\n{table}"
        );
    }
    drop(idle);
}

// ---------------------------------------------------------------------------------------
// Issue 31: no worker waits on a client
// ---------------------------------------------------------------------------------------

/// Reads the interim reply `100 Continue` (its status line and the empty line after it).
fn expect_continue(c: &mut BufReader<TcpStream>) -> Result<(), String> {
    let mut line = String::new();
    c.read_line(&mut line)
        .map_err(|e| format!("interim reply: {e}"))?;
    if line != "HTTP/1.1 100 Continue\r\n" {
        return Err(format!("{line:?} instead of the interim reply"));
    }
    line.clear();
    c.read_line(&mut line)
        .map_err(|e| format!("interim reply: {e}"))?;
    if line != "\r\n" {
        return Err(format!("{line:?} after the interim reply"));
    }
    Ok(())
}

/// Reads one response that must be a 200 with `body` (large: a difference is reported by
/// its length and first offset, not printed).
fn expect_echo(c: &mut BufReader<TcpStream>, body: &[u8]) -> Result<(), String> {
    let (status, got) = read_response(c)?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!("{status:?} with {} bytes", got.len()));
    }
    if got != body {
        let at = got.iter().zip(body).position(|(a, b)| a != b);
        return Err(format!(
            "{} bytes, expected {}, first difference at {at:?}",
            got.len(),
            body.len()
        ));
    }
    Ok(())
}

/// A body of `len` bytes whose content shows a shift or a loss.
fn patterned(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// Issue 31: 300 slow bodies from 300 addresses (`Content-Length: 200000`, 70,000 bytes,
/// past what a hand-off message holds, then a byte a second) are held by the front, which
/// gathers each body; the four workers stay free, and a normal client's 20 requests are
/// all answered, each within a second. Before, the front handed each such request off
/// once 64 KiB had come and the workers read the rest: the first four took all four
/// workers, which waited on the trickles (until `--request-timeout`), and every other
/// request waited behind them.
#[test]
fn issue_31_slow_bodies_from_many_addresses_hold_no_worker() {
    const N: usize = 300;
    const PROBES: usize = 20;
    if !raise_nofile(N as u64 + 200) {
        return;
    }
    let ctl = Control::new("http_hello", "slowbodies");
    let mut args = vec!["-w", "4", "--backlog", "1024"];
    args.extend(ctl.args());
    let server = hybrid("http_hello", &args);
    let addr = server.tcp_addr();
    let workers = server.wait_for_workers(4);

    let head = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 200000\r\n\r\n";
    let part = patterned(70_000);
    let slow: Vec<TcpStream> = (0..N)
        .map(|i| {
            let from = format!("127.31.{}.{}", i / 250, 1 + i % 250);
            let mut s = connect_from(&from, addr);
            s.write_all(head).unwrap();
            s.write_all(&part).unwrap();
            s
        })
        .collect();
    let stop = AtomicBool::new(false);
    let probes: Vec<Result<Duration, String>> = std::thread::scope(|scope| {
        // The trickle: a byte a second on each slow body, for as long as the probes last.
        scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                for mut s in &slow {
                    let _ = s.write_all(b"x");
                }
                // Pacing the attack, not waiting for the server.
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        let probes = (0..PROBES)
            .map(|_| {
                // Spread over about five seconds of the trickle (pacing).
                std::thread::sleep(Duration::from_millis(250));
                try_hello_once(addr, Duration::from_secs(1))
            })
            .collect();
        stop.store(true, Ordering::SeqCst);
        probes
    });
    let failed: Vec<_> = probes.iter().filter_map(|p| p.as_ref().err()).collect();
    let worst = probes.iter().filter_map(|p| p.as_ref().ok()).max();
    eprintln!(
        "{} of {PROBES} probes answered beside {N} slow bodies, the slowest in {worst:?}",
        PROBES - failed.len()
    );
    assert!(failed.is_empty(), "probes not answered within 1 s: {failed:?}");
    assert!(worst.is_some_and(|w| *w < Duration::from_secs(1)), "{worst:?}");
    // The fronts hold the slow bodies, every worker is idle.
    ctl.wait_for("the fronts reading the slow bodies, the workers idle", |s| {
        status_fronts(s).iter().map(|f| num(f, &["reading"])).sum::<u64>() >= N as u64
            && status_workers(s).len() == 4
            && status_workers(s).iter().all(|w| w["state"] == "idle")
    });
    assert_eq!(server.worker_pids(), workers, "the same four workers throughout");
    drop(slow);
}

/// Issue 31: a large body is gathered by the front and reaches the worker whole, byte for
/// byte: 200 KB with `Content-Length` behind `Expect: 100-continue` (one interim reply:
/// the worker sent a second one when the front handed the request off at 64 KiB), and
/// 200 KB chunked, each answered by `POST /echo` with the body as sent and followed by a
/// pipelined request on the same connection.
#[test]
fn issue_31_a_large_body_reaches_the_worker_whole() {
    let server = hybrid("http_hello", &["-w", "2"]);
    let addr = server.tcp_addr();
    server.wait_for_workers(2);
    let body = patterned(200_000);

    let mut c = open(addr);
    c.get_mut()
        .write_all(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 200000\r\n\r\n",
        )
        .unwrap();
    expect_continue(&mut c).unwrap();
    c.get_mut().write_all(&body).unwrap();
    c.get_mut().write_all(GET).unwrap();
    expect_echo(&mut c, &body).unwrap_or_else(|e| panic!("the echo: {e}"));
    expect_200(&mut c, HELLO).unwrap_or_else(|e| panic!("the request behind it: {e}"));

    // Chunked, on the same connection (handed back meanwhile), in several writes.
    let mut chunked = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for piece in body.chunks(7_000) {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    chunked.extend_from_slice(GET);
    for piece in chunked.chunks(50_000) {
        c.get_mut().write_all(piece).unwrap();
    }
    expect_echo(&mut c, &body).unwrap_or_else(|e| panic!("the chunked echo: {e}"));
    expect_200(&mut c, HELLO).unwrap_or_else(|e| panic!("the request behind it: {e}"));
}

/// Issue 31: a worker that finds the beginning of a request behind the one it answered
/// (pipelined in the same write, here a head with `Expect: 100-continue` and no body yet)
/// does not wait on the client for the rest: it hands the connection back with those
/// bytes at once, so the only worker serves other clients meanwhile; the front gathers
/// the body, and the request is answered whole, without a second interim reply. Before,
/// the worker waited for the body (up to the header timeout) and the other clients with
/// it.
#[test]
fn issue_31_a_partial_request_behind_a_whole_one_goes_back_to_the_front() {
    let server = hybrid("http_hello", &["-w", "1", "--keepalive-timeout", "60"]);
    let addr = server.tcp_addr();
    server.wait_for_workers(1);
    let body = patterned(100_000);
    let mut c = open(addr);
    c.get_mut()
        .write_all(
            b"GET / HTTP/1.1\r\nHost: t\r\n\r\n\
              POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n",
        )
        .unwrap();
    expect_200(&mut c, HELLO).unwrap_or_else(|e| panic!("the first request: {e}"));
    expect_continue(&mut c).unwrap();
    // The only worker is free for others while the body has not come.
    for i in 0..5 {
        let took = try_hello_once(addr, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("another client's request {i}: {e}"));
        eprintln!("another client answered in {took:?}");
    }
    c.get_mut().write_all(&body[..1000]).unwrap();
    c.get_mut().write_all(&body[1000..]).unwrap();
    c.get_mut().write_all(GET).unwrap();
    expect_echo(&mut c, &body).unwrap_or_else(|e| panic!("the echo (one interim reply only): {e}"));
    expect_200(&mut c, HELLO).unwrap_or_else(|e| panic!("the request behind it: {e}"));
}

/// rustls's *ring* provider, as the server uses it; its deprecation in rustls 0.23.48 (no
/// post-quantum key exchange) is allowed, as in the library (`net/tls.rs`, issue 41).
#[allow(deprecated)]
fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![test(
        "issue_21_fronts_and_workers_drop_privileges_and_are_sandboxed",
        &[Need::Root],
        issue_21_fronts_and_workers_drop_privileges_and_are_sandboxed,
    )]
}

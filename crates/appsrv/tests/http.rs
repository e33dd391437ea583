//! The HTTP codec driven through real processes: the `http_hello` example on ephemeral
//! loopback ports, spoken to with raw sockets so that every byte on the wire is checked.

mod util;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};

use appsrv::codec::{Codec, Decoded, Http, Respond};
use util::*;

/// Counts the allocations of the current thread, for
/// `the_get_path_allocates_nothing_in_steady_state`.
struct CountingAlloc;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a const-initialised
// thread-local Cell, which neither allocates nor has a destructor.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's guarantees are passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// A directory of test files, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("appsrv-http-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("static")).unwrap();
        TempDir(dir)
    }

    /// The directory given to `--static-dir`.
    fn static_dir(&self) -> PathBuf {
        self.0.join("static")
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.static_dir().join(name), bytes).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `len` pseudo-random bytes (xorshift), different for each seed.
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn http_hello(io: Io, workers: usize, static_dir: Option<&Path>) -> Server {
    let w = workers.to_string();
    let mut args = vec!["-l", "127.0.0.1:0", "-w", w.as_str()];
    let dir;
    if let Some(d) = static_dir {
        dir = d.to_str().unwrap().to_owned();
        args.extend(["--static-dir", dir.as_str()]);
    }
    Server::start_io("http_hello", io, &args)
}

#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP connection.
struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        Conn {
            reader: BufReader::new(s),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.reader.get_mut().write_all(bytes).unwrap();
    }

    /// Reads one response; `head` for the response to a HEAD request (no body).
    fn read_response(&mut self, head: bool) -> Response {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("status line");
        assert!(
            line.starts_with("HTTP/1.1 ") && line.ends_with("\r\n"),
            "status line {line:?}"
        );
        let status = line[9..12].parse().unwrap();
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).expect("header line");
            assert!(line.ends_with("\r\n"), "header line {line:?}");
            if line == "\r\n" {
                break;
            }
            let (n, v) = line.trim_end().split_once(": ").expect("a header");
            headers.push((n.to_owned(), v.to_owned()));
        }
        let mut response = Response {
            status,
            headers,
            body: Vec::new(),
        };
        if !head {
            let len: usize = response
                .header("content-length")
                .expect("Content-Length")
                .parse()
                .unwrap();
            response.body = vec![0; len];
            self.reader.read_exact(&mut response.body).expect("body");
        }
        response
    }

    fn response(&mut self) -> Response {
        self.read_response(false)
    }

    /// Sends a request and reads its response.
    fn get(&mut self, target: &str) -> Response {
        self.send(format!("GET {target} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes());
        self.response()
    }

    /// Whether the server closed the connection (no more bytes, end of file).
    fn closed_by_server(&mut self) -> bool {
        let mut rest = Vec::new();
        match self.reader.read_to_end(&mut rest) {
            Ok(_) => rest.is_empty(),
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

fn assert_hello(r: &Response) {
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"Hello, World!");
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.header("content-length"), Some("13"));
    assert!(r.header("date").is_some_and(|d| d.ends_with(" GMT")), "{r:?}");
}

both_io!(keep_alive_serves_several_requests_on_one_connection);
fn keep_alive_serves_several_requests_on_one_connection(io: Io) {
    let server = http_hello(io, 2, None);
    let mut c = Conn::open(server.tcp_addr());
    for _ in 0..5 {
        let r = c.get("/");
        assert_hello(&r);
        assert_eq!(
            r.header("connection"),
            None,
            "HTTP/1.1 keeps the connection by default"
        );
    }
    assert_eq!(c.get("/nowhere").status, 404);
    assert_hello(&c.get("/?query=1"));
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option)"): pipelined_requests_are_answered_in_order);
fn pipelined_requests_are_answered_in_order(io: Io) {
    let dir = TempDir::new("pipeline");
    dir.write("a.txt", b"alpha");
    dir.write("b.json", b"{\"b\":1}");
    let server = http_hello(io, 2, Some(&dir.static_dir()));
    let mut c = Conn::open(server.tcp_addr());
    c.send(
        b"GET /static/a.txt HTTP/1.1\r\nHost: t\r\n\r\n\
          GET /static/missing HTTP/1.1\r\nHost: t\r\n\r\n\
          HEAD / HTTP/1.1\r\nHost: t\r\n\r\n\
          POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc\
          GET /static/b.json HTTP/1.1\r\nHost: t\r\n\r\n\
          GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    );
    let a = c.response();
    assert_eq!((a.status, a.text().as_str()), (200, "alpha"));
    assert_eq!(a.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(c.response().status, 404);
    let head = c.read_response(true);
    assert_eq!((head.status, head.header("content-length")), (200, Some("13")));
    assert_eq!(c.response().status, 405);
    let b = c.response();
    assert_eq!((b.status, b.text().as_str()), (200, "{\"b\":1}"));
    assert_eq!(b.header("content-type"), Some("application/json"));
    let last = c.response();
    assert_hello(&last);
    assert_eq!(last.header("connection"), Some("close"));
    assert!(c.closed_by_server());
}

both_io!(connection_close_is_honoured);
fn connection_close_is_honoured(io: Io) {
    let server = http_hello(io, 2, None);
    let mut c = Conn::open(server.tcp_addr());
    assert_hello(&c.get("/"));
    c.send(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let r = c.response();
    assert_hello(&r);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_by_server(), "the server closes after the response");
}

both_io!(http_1_0_closes_unless_keep_alive_is_asked_for);
fn http_1_0_closes_unless_keep_alive_is_asked_for(io: Io) {
    let server = http_hello(io, 2, None);
    let mut c = Conn::open(server.tcp_addr());
    c.send(b"GET / HTTP/1.0\r\n\r\n");
    let r = c.response();
    assert_hello(&r);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_by_server());

    let mut c = Conn::open(server.tcp_addr());
    for _ in 0..3 {
        c.send(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
        let r = c.response();
        assert_hello(&r);
        assert_eq!(r.header("connection"), Some("keep-alive"));
    }
    c.send(b"GET / HTTP/1.0\r\n\r\n");
    assert_hello(&c.response());
    assert!(c.closed_by_server());
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option)"): head_sends_the_headers_without_the_body);
fn head_sends_the_headers_without_the_body(io: Io) {
    let dir = TempDir::new("head");
    dir.write("page.html", &[b'x'; 5000]);
    let server = http_hello(io, 2, Some(&dir.static_dir()));
    let mut c = Conn::open(server.tcp_addr());
    c.send(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n");
    let r = c.read_response(true);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("13"));
    assert_eq!(r.header("content-type"), Some("text/plain"));
    c.send(b"HEAD /static/page.html HTTP/1.1\r\nHost: t\r\n\r\n");
    let r = c.read_response(true);
    assert_eq!(r.header("content-length"), Some("5000"));
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    // No body bytes came after the heads: the next response starts right away.
    assert_hello(&c.get("/"));
    let page = c.get("/static/page.html");
    assert_eq!(page.body.len(), 5000);
}

both_io!(a_malformed_request_gets_400_and_the_worker_goes_on);
fn a_malformed_request_gets_400_and_the_worker_goes_on(io: Io) {
    let server = http_hello(io, 1, None);
    let workers = server.wait_for_workers(1);
    let mut c = Conn::open(server.tcp_addr());
    assert_hello(&c.get("/"));
    c.send(b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n");
    let r = c.response();
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert!(c.closed_by_server());

    let mut next = Conn::open(server.tcp_addr());
    assert_hello(&next.get("/"));
    assert_eq!(server.worker_pids(), workers, "served by the same single worker");
}

both_io!(issue_14_bare_lf_gets_400_and_the_worker_goes_on);
/// Issue 14: one rule for line ends, CRLF only. A bare LF in the head (as httparse alone
/// would accept) or in a chunked body's lines gets 400 and a close, as a front proxy that
/// requires CRLF would see it; the worker goes on serving.
fn issue_14_bare_lf_gets_400_and_the_worker_goes_on(io: Io) {
    let server = http_hello(io, 1, None);
    let workers = server.wait_for_workers(1);
    for request in [
        &b"GET / HTTP/1.1\nHost: t\n\n"[..],
        b"GET / HTTP/1.1\r\nHost: t\nX-Smuggled: 1\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n1\nx\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nT: 1\n\r\n",
    ] {
        let mut c = Conn::open(server.tcp_addr());
        c.send(request);
        let r = c.response();
        let shown = String::from_utf8_lossy(request);
        assert_eq!(r.status, 400, "{shown:?}: {r:?}");
        assert_eq!(r.header("connection"), Some("close"), "{shown:?}");
        assert!(r.text().contains("CRLF"), "{shown:?}: {}", r.text());
        assert!(c.closed_by_server(), "{shown:?}");
    }
    // After a good request on the same connection too.
    let mut c = Conn::open(server.tcp_addr());
    assert_hello(&c.get("/"));
    c.send(b"GET / HTTP/1.1\nHost: t\n\n");
    assert_eq!(c.response().status, 400);
    assert!(c.closed_by_server());
    assert_hello(&Conn::open(server.tcp_addr()).get("/"));
    assert_eq!(server.worker_pids(), workers, "served by the same single worker");
}

both_io!(issue_31_a_missing_or_repeated_host_gets_400_and_the_worker_goes_on);
/// Issue 31: RFC 9112 §3.2. An HTTP/1.1 request without `Host`, or any request with two,
/// gets 400 and a close, also after a good request on the same connection; the single
/// worker serves the next client. HTTP/1.0 without `Host` is still served.
fn issue_31_a_missing_or_repeated_host_gets_400_and_the_worker_goes_on(io: Io) {
    let server = http_hello(io, 1, None);
    let workers = server.wait_for_workers(1);
    for (request, why) in [
        (&b"GET / HTTP/1.1\r\n\r\n"[..], "no Host header"),
        (
            b"GET / HTTP/1.1\r\nConnection: keep-alive\r\n\r\n",
            "no Host header",
        ),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
            "no Host header",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "more than one Host",
        ),
        (
            b"GET / HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n",
            "more than one Host",
        ),
    ] {
        let shown = String::from_utf8_lossy(request);
        let mut c = Conn::open(server.tcp_addr());
        c.send(request);
        let r = c.response();
        assert_eq!(r.status, 400, "{shown:?}: {r:?}");
        assert_eq!(r.header("connection"), Some("close"), "{shown:?}");
        assert!(r.text().contains(why), "{shown:?}: {}", r.text());
        assert!(c.closed_by_server(), "{shown:?}");
        assert_hello(&Conn::open(server.tcp_addr()).get("/"));
    }
    // After a good request on a keep-alive connection.
    let mut c = Conn::open(server.tcp_addr());
    assert_hello(&c.get("/"));
    c.send(b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(c.response().status, 400);
    assert!(c.closed_by_server());
    // HTTP/1.0 may leave Host out.
    let mut c = Conn::open(server.tcp_addr());
    c.send(b"GET / HTTP/1.0\r\n\r\n");
    assert_hello(&c.response());
    assert_eq!(server.worker_pids(), workers, "served by the same single worker");
}

both_io!(oversize_and_unsupported_requests_are_refused);
fn oversize_and_unsupported_requests_are_refused(io: Io) {
    let server = http_hello(io, 1, None);
    let workers = server.wait_for_workers(1);
    let cases: [(&[u8], u16); 4] = [
        // 413 from the Content-Length alone: the body is never sent.
        (
            b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10000000\r\n\r\n",
            413,
        ),
        (b"GET / HTTP/2.0\r\nHost: t\r\n\r\n", 505),
        (
            b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
            501,
        ),
        (
            &[
                b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: ".as_slice(),
                &[b'a'; 10_000],
            ]
            .concat(),
            431,
        ),
    ];
    for (request, status) in cases {
        let mut c = Conn::open(server.tcp_addr());
        c.send(request);
        let r = c.response();
        assert_eq!(r.status, status, "{r:?}");
        assert_eq!(r.header("connection"), Some("close"));
        assert!(c.closed_by_server());
    }
    assert_hello(&Conn::open(server.tcp_addr()).get("/"));
    assert_eq!(server.worker_pids(), workers);
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option)"): large_files_arrive_intact);
fn large_files_arrive_intact(io: Io) {
    let dir = TempDir::new("large");
    let big = random_bytes(1_000_000, 1);
    let medium = random_bytes(100_000, 2);
    dir.write("big.bin", &big);
    dir.write("medium.png", &medium);
    let server = http_hello(io, 2, Some(&dir.static_dir()));
    let mut c = Conn::open(server.tcp_addr());
    let r = c.get("/static/big.bin");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert!(r.body == big, "the 1 MB file differs");
    let r = c.get("/static/medium.png");
    assert_eq!(r.header("content-type"), Some("image/png"));
    assert!(r.body == medium, "the 100 KB file differs");
    // Pipelined, on the same connection.
    c.send(
        b"GET /static/medium.png HTTP/1.1\r\nHost: t\r\n\r\nGET /static/big.bin HTTP/1.1\r\nHost: t\r\n\r\n\
          GET / HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert!(c.response().body == medium);
    assert!(c.response().body == big);
    assert_hello(&c.response());
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option)"): missing_files_and_escapes_get_404_or_400);
fn missing_files_and_escapes_get_404_or_400(io: Io) {
    let dir = TempDir::new("escape");
    dir.write("inside.txt", b"inside");
    std::fs::create_dir(dir.static_dir().join("sub")).unwrap();
    dir.write("sub/nested.css", b"p{}");
    std::fs::write(dir.0.join("secret.txt"), b"secret").unwrap();
    std::os::unix::fs::symlink(dir.0.join("secret.txt"), dir.static_dir().join("leak.txt")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.static_dir().join("passwd")).unwrap();
    std::os::unix::fs::symlink("inside.txt", dir.static_dir().join("alias.txt")).unwrap();
    let server = http_hello(io, 2, Some(&dir.static_dir()));
    let mut c = Conn::open(server.tcp_addr());

    let ok = c.get("/static/sub/nested.css");
    assert_eq!((ok.status, ok.text().as_str()), (200, "p{}"));
    assert_eq!(ok.header("content-type"), Some("text/css"));
    assert_eq!(
        c.get("/static/alias.txt").text(),
        "inside",
        "a link inside the directory is served"
    );
    assert_eq!(c.get("/static/in%73ide.txt").text(), "inside", "percent-decoding");

    for target in [
        "/static/missing.txt",
        "/static/",
        "/static/sub",
        "/static/leak.txt",
        "/static/passwd",
        "/static/../Cargo.toml",
        "/static/%2e%2e/x",
        "/static/%2e%2e/secret.txt",
        "/static/..%2fsecret.txt",
        "/static/sub/../../secret.txt",
        "/static//etc/passwd",
        "/static/%2fetc/passwd",
        "/static/inside.txt%00",
        "/static/%zz",
        "/static/./inside.txt",
        "/etc/passwd",
    ] {
        let r = c.get(target);
        assert!(matches!(r.status, 400 | 404), "{target}: {r:?}");
        assert!(
            !r.text().contains("secret") && !r.text().contains("root:") && !r.text().contains("[package]"),
            "{target}: {r:?}"
        );
    }
    assert_hello(&c.get("/"));
}

both_io!(other_methods_get_405_and_their_bodies_are_skipped);
fn other_methods_get_405_and_their_bodies_are_skipped(io: Io) {
    let server = http_hello(io, 2, None);
    let mut c = Conn::open(server.tcp_addr());
    c.send(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello");
    let r = c.response();
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    c.send(b"PUT /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    assert_eq!(c.response().status, 405);
    c.send(b"DELETE / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(c.response().status, 405);
    assert_hello(&c.get("/"));
}

both_io!(expect_100_continue_gets_an_interim_response);
fn expect_100_continue_gets_an_interim_response(io: Io) {
    let server = http_hello(io, 2, None);
    let mut c = Conn::open(server.tcp_addr());
    c.send(b"POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    let mut interim = [0; 25];
    c.reader.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.send(b"hello");
    assert_eq!(c.response().status, 405);
    assert_hello(&c.get("/"));
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option)"): a_missing_static_dir_stops_the_server_with_a_clear_error);
fn a_missing_static_dir_stops_the_server_with_a_clear_error(io: Io) {
    let missing = std::env::temp_dir().join(format!("appsrv-http-{}-no-such-dir", std::process::id()));
    let mut server = Server::spawn(
        "http_hello",
        &io.args(&["-l", "127.0.0.1:0", "--static-dir", missing.to_str().unwrap()]),
        &[],
    );
    let status = server.wait_exit();
    assert!(!status.success(), "{status:?}");
    let line = server.wait_for_log("--static-dir");
    assert!(line.contains("No such file or directory"), "{line}");
}

both_io!(a_request_that_stalls_gets_408);
fn a_request_that_stalls_gets_408(io: Io) {
    let server = Server::start_io(
        "http_hello",
        io,
        &["-l", "127.0.0.1:0", "-w", "1", "--read-timeout", "0.3"],
    );
    let mut c = Conn::open(server.tcp_addr());
    assert_hello(&c.get("/"));
    c.send(b"GET / HTTP/1.1\r\nHost: t\r\n");
    let r = c.response();
    assert_eq!(r.status, 408, "{r:?}");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_by_server());
}

/// Starts `http_hello` in blocking mode (the keep-alive guard these tests check is the
/// blocking worker's: an event worker holds every connection at once) with `workers`
/// workers, `extra` arguments and a control socket in `dir`, and waits until every worker is idle (the scoreboard says so): a test of the
/// keep-alive guard must not begin with a client queued behind a worker still starting.
fn http_hello_settled(dir: &TempDir, workers: usize, extra: &[&str]) -> Server {
    let sock = dir.0.join("control");
    let sock = sock.to_str().unwrap();
    let w = workers.to_string();
    let mut args = vec!["-l", "127.0.0.1:0", "-w", &w, "--control", sock];
    args.extend_from_slice(extra);
    let server = Server::start_io("http_hello", Io::Blocking, &args);
    let all_idle = format!("Scoreboard:    {}", "_".repeat(workers));
    let settled = wait_until(|| {
        let out = std::process::Command::new(example("http_hello"))
            .args(["status", "--control", sock])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l == all_idle)
            .then_some(())
    });
    assert!(settled.is_some(), "the workers never were all idle");
    server
}

#[test]
fn issue_15_a_queued_client_is_served_while_every_worker_holds_an_idle_keepalive_connection() {
    // Two workers, each holding a keep-alive connection that has gone quiet: a third client
    // is served long before the keep-alive timeout, because the master, watching the listen
    // queue while no worker is idle, wakes the workers waiting between requests and they
    // give their idle connections up.
    let dir = TempDir::new("queued");
    let server = http_hello_settled(&dir, 2, &["--keepalive-timeout", "60"]);
    let mut idle = [Conn::open(server.tcp_addr()), Conn::open(server.tcp_addr())];
    for c in &mut idle {
        let r = c.get("/");
        assert_hello(&r);
        assert_eq!(r.header("connection"), None, "kept alive: {r:?}");
    }
    // Both workers asleep, which after their responses means blocked in the read of the
    // next request: the queued client must wake them (not find them on their way there).
    let workers = server.worker_pids();
    let asleep = wait_until(|| {
        workers
            .iter()
            .all(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('S')))
            })
            .then_some(())
    });
    assert!(asleep.is_some(), "the workers never waited for a request");
    let started = std::time::Instant::now();
    let mut queued = Conn::open(server.tcp_addr());
    let r = queued.get("/");
    assert_hello(&r);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "served after {:?}, not at the keep-alive timeout (60 s)",
        started.elapsed()
    );
}

#[test]
fn issue_15_a_busy_keepalive_client_is_told_to_close_when_clients_wait() {
    // One worker, kept busy by a client that sends its next request as soon as it has the
    // response (a benchmark, a proxy's pooled connection): while another client waits in
    // the listen queue, a response announces the close, so the busy client reconnects
    // cleanly (no request lost in flight) and the waiting client is served.
    let dir = TempDir::new("busy");
    let server = http_hello_settled(
        &dir,
        1,
        // Not the per-connection limit's close: the queue's.
        &["--keepalive-timeout", "60", "--keepalive-requests", "1000000000"],
    );
    let mut busy = Conn::open(server.tcp_addr());
    assert_hello(&busy.get("/"));
    let mut waiting = Conn::open(server.tcp_addr());
    waiting.send(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut served = 0;
    loop {
        let r = busy.get("/");
        assert_hello(&r);
        served += 1;
        if r.header("connection") == Some("close") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{served} keep-alive responses and no Connection: close while a client waits"
        );
    }
    assert!(busy.closed_by_server(), "closed after the announcement");
    assert_hello(&waiting.response());
}

/// The codec driven as the request loop drives it: decoding, responding (status, a
/// header, a body) and finishing allocate nothing once the buffers have grown.
#[test]
fn the_get_path_allocates_nothing_in_steady_state() {
    let mut codec = Http::new();
    let input =
        b"GET /hello?x=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: test\r\nAccept: */*\r\n\r\n".to_vec();
    let mut out = Vec::with_capacity(16 * 1024);
    let mut buf = input.clone();
    let mut serve_one = |codec: &mut Http, out: &mut Vec<u8>| {
        let Ok(Decoded::Request { request, len }) = codec.decode(&mut buf) else {
            panic!("a complete request")
        };
        assert_eq!(len, input.len());
        let mut res = codec.respond(&request, out, false);
        res.status(200)
            .content_type("text/plain")
            .header("X-Path", request.path());
        res.write_all(b"Hello, World!").unwrap();
        let outcome = res.finish();
        assert!(!outcome.close);
    };
    let before = ALLOCATIONS.with(Cell::get);
    serve_one(&mut codec, &mut out); // warm up: the date, the buffers
    drop(std::hint::black_box(Box::new(1u64)));
    assert!(ALLOCATIONS.with(Cell::get) > before, "the counter counts");
    for _ in 0..100 {
        out.clear();
        let before = ALLOCATIONS.with(Cell::get);
        serve_one(&mut codec, &mut out);
        assert_eq!(
            ALLOCATIONS.with(Cell::get),
            before,
            "allocations while serving a GET"
        );
    }
    assert!(out.ends_with(b"\r\n\r\nHello, World!"));
}

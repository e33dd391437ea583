//! Overall deadlines on the slow paths of a connection: a response read too slowly
//! (`--min-send-rate`), and the operator's warning when slow clients hold the pool.
//!
//! Regression tests for issue 14 ("Reliability under faults") and issue 31 ("Faults that
//! still take a server down"): a client with a small receive window is measured by what
//! it acknowledges, below the minimum rate (cut) and above it (not cut, also past the
//! write timeout).

mod util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use util::*;

/// A static directory holding `big.bin`, removed on drop.
struct Site(PathBuf);

impl Site {
    fn new(tag: &str, len: usize) -> Site {
        let dir = std::env::temp_dir().join(format!("appsrv-deadlines-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("big.bin"), vec![b'x'; len]).unwrap();
        Site(dir)
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `http_hello` in `io` with one worker serving a new [`Site`] (tagged `tag` and the model)
/// whose `big.bin` has `len` bytes, and `extra` arguments. The site comes first: bound as
/// `let (_site, server)`, the server is dropped (killed) before its directory is removed.
fn big_file_server(io: Io, tag: &str, len: usize, extra: &[&str]) -> (Site, Server) {
    let site = Site::new(&format!("{tag}-{}", io.name()), len);
    let mut args = vec!["-l", "127.0.0.1:0", "-w", "1", "--static-dir", site.arg()];
    args.extend_from_slice(extra);
    let server = Server::start_io("http_hello", io, &args);
    (site, server)
}

/// A client that has asked for the big file on a new connection, reading nothing yet.
///
/// `rcvbuf`: its `SO_RCVBUF`, set before it connects so that it never advertises more: the
/// server's writes soon wait for it. With 4 KiB and loopback's segments, the kernel sends
/// it none larger than half its window (2 KiB), so its window reopens, and what it
/// acknowledges moves, in steps of about that much.
///
/// `mss`: its segment size. A network's (1448 bytes), not loopback's 64 KiB, opens its
/// window in small steps as it reads, as it would across a network (on loopback's, the
/// send watch must wait up to a minute to see any progress: see
/// `client::MAX_SEND_WINDOW`).
fn download(addr: SocketAddr, rcvbuf: Option<usize>, mss: Option<u32>) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    if let Some(size) = rcvbuf {
        s.set_recv_buffer_size(size).unwrap();
    }
    if let Some(mss) = mss {
        s.set_tcp_mss(mss).unwrap();
    }
    s.connect(&addr.into()).unwrap();
    let mut s = TcpStream::from(s);
    s.write_all(b"GET /static/big.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    s
}

/// A client with a small receive buffer and a network's segments (see [`download`]).
fn slow_download(addr: SocketAddr) -> TcpStream {
    download(addr, Some(4096), Some(1448))
}

/// `GET /` on a new connection: the status line, within [`PATIENCE`].
fn hello(addr: SocketAddr) -> String {
    get_once(addr, "/", PATIENCE)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option), and --min-send-rate on async connections is issue 42's part C"): issue_14_a_reader_below_min_send_rate_is_cut_off_and_the_worker_serves_on);
/// Issue 14: a client that reads a large response slowly held its worker without limit
/// (each stalled write was bounded, the response was not). Below `--min-send-rate` it is
/// cut off by the worker, which serves the next client.
/// In event mode the worker serves other clients while it holds the slow reader.
fn issue_14_a_reader_below_min_send_rate_is_cut_off_and_the_worker_serves_on(io: Io) {
    let (_site, server) = big_file_server(io, "cut", 32 << 20, &[]);
    let addr = server.tcp_addr();
    let _reader = slow_download(addr); // reads nothing
    let started = Instant::now();
    // Blocking: the only worker is held; this client waits in the listen queue until the
    // cut (about 10 s), where the write timeout alone (60 s) would have outlasted PATIENCE.
    // Event: the only worker answers it at once, beside the stalled download.
    assert_eq!(hello(addr), "HTTP/1.1 200 OK");
    if io == Io::Event {
        assert!(
            !server.log_text().contains("--min-send-rate"),
            "served before the slow reader's cut, not after it: {}",
            server.log_text()
        );
    }
    let line = server.wait_for_log("below --min-send-rate 500 bytes/s: cut off");
    let waited = started.elapsed();
    assert!(line.contains("worker 1"), "{line}");
    assert!(
        waited >= Duration::from_secs(5),
        "cut after {waited:?}: too early"
    );
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option), and --min-send-rate on async connections is issue 42's part C"): a_healthy_slow_download_is_not_cut);
/// A long download at a healthy rate is never cut, however long it waits on the client.
fn a_healthy_slow_download_is_not_cut(io: Io) {
    let (_site, server) = big_file_server(io, "healthy", 8 << 20, &[]);
    let mut reader = slow_download(server.tcp_addr());
    reader.set_read_timeout(Some(PATIENCE)).unwrap();
    // About 40 kB/s, 80 times the minimum, for well over one 10 s window.
    let started = Instant::now();
    let mut got = 0;
    let mut buf = [0u8; 4096];
    while started.elapsed() < Duration::from_secs(14) {
        let n = reader.read(&mut buf).expect("the download goes on");
        assert!(n > 0, "cut after {got} bytes and {:?}", started.elapsed());
        got += n;
        // Pacing the reader, not synchronisation: a slow client is what is being tested.
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(got > 100_000, "{got} bytes");
    assert!(
        !server.log_text().contains("--min-send-rate"),
        "{}",
        server.log_text()
    );
}

/// A client with a small receive window and loopback's segments (see [`download`]).
fn small_window_download(addr: SocketAddr) -> TcpStream {
    download(addr, Some(4096), None)
}

/// How a paced download ended.
#[derive(Debug)]
struct Paced {
    /// Bytes read (head included).
    got: u64,
    /// When the server cut the connection (a reset, or the end of the stream before the
    /// body's end), after the start; `None` if it was still open at the limit.
    cut: Option<Duration>,
}

/// Reads up to `chunk` bytes every `pause` from `s`, until the server cuts the connection
/// or `limit` has passed. The pause paces a slow client (what is being tested), it does not
/// wait for the server.
fn read_paced(mut s: TcpStream, chunk: usize, pause: Duration, limit: Duration) -> Paced {
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let started = Instant::now();
    let mut got = 0;
    let mut buf = vec![0u8; chunk];
    while started.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading the download after {got} bytes: {e}"),
        }
        std::thread::sleep(pause);
    }
    let elapsed = started.elapsed();
    Paced {
        got,
        cut: (elapsed < limit).then_some(elapsed),
    }
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option), and --min-send-rate on async connections is issue 42's part C"): issue_31_a_small_window_reader_below_min_send_rate_is_cut_off);
/// Issue 31: a client with a 4 KiB receive window that read a static file (sent with
/// `sendfile(2)`) below `--min-send-rate` was never cut in the blocking and hybrid models:
/// each blocking `sendfile` that made progress stayed in the kernel for two send timeouts
/// (it sends again after each partial send, and each send waits a full second), and the
/// watch took that two-second absence for a handler that had stopped writing, starting its
/// window afresh each time the client took a few bytes. Here the client takes 1 KB/s, a
/// quarter of the minimum (raised to 4,000 bytes/s so that the test is short; the issue's
/// 128 bytes/s under the default 500 is the same case): it is cut after about one window,
/// and the worker serves the next client.
fn issue_31_a_small_window_reader_below_min_send_rate_is_cut_off(io: Io) {
    let (_site, server) = big_file_server(io, "window-cut", 16 << 20, &["--min-send-rate", "4000"]);
    let addr = server.tcp_addr();
    let download = small_window_download(addr);
    let started = Instant::now();
    let reader = std::thread::spawn(move || {
        read_paced(
            download,
            256,
            Duration::from_millis(250),
            Duration::from_secs(120),
        )
    });
    // The window is 10 s once writes wait (after the first 4 MB or so fill the send
    // buffer); a minute is generous on a loaded machine and far short of the 16 MB at the
    // client's pace (over four hours).
    let cut = "below --min-send-rate 4000 bytes/s: cut off";
    let limit = Duration::from_secs(60).saturating_sub(started.elapsed());
    let seen = wait_until_for(limit, || server.log_text().contains(cut).then_some(()));
    assert!(
        seen.is_some(),
        "the slow reader is still served after {:?}; log:\n{}",
        started.elapsed(),
        server.log_text()
    );
    let line = server.wait_for_log(cut);
    assert!(line.contains("worker 1"), "{line}");
    // The client sees the reset once it has read what its kernel had taken already.
    let paced = reader.join().unwrap();
    assert!(paced.cut.is_some(), "never cut: {paced:?}");
    assert!(paced.got < 1 << 20, "{paced:?}");
    assert_eq!(hello(addr), "HTTP/1.1 200 OK");
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option), and --min-send-rate on async connections is issue 42's part C"): issue_31_a_small_window_reader_above_min_send_rate_is_not_cut);
/// Issue 31: the same small window at a rate above the default minimum (about 700 bytes/s
/// against 500) is not cut, over more than two windows. Its progress shows in bursts of 4
/// to 6 KiB every 9 s or so (it reopens its whole window at once), so a 10 s window saw one
/// burst in some windows, 4 KiB against the 5,000 bytes owed, and the event loop cut it
/// (and with the sendfile fix, the blocking one too): the window now spans two of the
/// steps seen, and one step is credited.
fn issue_31_a_small_window_reader_above_min_send_rate_is_not_cut(io: Io) {
    let (_site, server) = big_file_server(io, "window-healthy", 16 << 20, &[]);
    let download = small_window_download(server.tcp_addr());
    let paced = read_paced(download, 350, Duration::from_millis(500), Duration::from_secs(40));
    assert!(paced.cut.is_none(), "cut: {paced:?}; log:\n{}", server.log_text());
    assert!(paced.got > 20_000, "{paced:?}");
    assert!(
        !server.log_text().contains("--min-send-rate"),
        "{}",
        server.log_text()
    );
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option), and --min-send-rate on async connections is issue 42's part C"): issue_31_a_reader_above_min_send_rate_outlasts_the_write_timeout);
/// Issue 31: the event loop cut a client taking a large response at 16 kB/s (32 times the
/// minimum) when the write timeout expired: it counted only bytes written as progress, and
/// the kernel lets more be written (and signals `EPOLLOUT`) only when a third of the 4 MiB
/// send buffer is free, which takes that client minutes. What the client acknowledges
/// counts now. That client's acknowledgements come in jumps of 64 to 96 kB every 4 to 6 s
/// (its window reopens in large pieces): the write timeout is 15 s here, well above that,
/// to keep the test short (60 s by default).
fn issue_31_a_reader_above_min_send_rate_outlasts_the_write_timeout(io: Io) {
    let (_site, server) = big_file_server(io, "write-timeout", 16 << 20, &["--write-timeout", "15"]);
    let paced = read_paced(
        download(server.tcp_addr(), None, None),
        4096,
        Duration::from_millis(250),
        Duration::from_secs(35),
    );
    assert!(paced.cut.is_none(), "cut: {paced:?}; log:\n{}", server.log_text());
    assert!(paced.got > 300_000, "{paced:?}");
    assert!(!server.log_text().contains("timed out"), "{}", server.log_text());
}

/// `status --json` through the control socket `ctl`, parsed.
fn status_json(example_name: &str, ctl: &str) -> serde_json::Value {
    let out = std::process::Command::new(example(example_name))
        .args(["status", "--json", "--control", ctl])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Issue 14: slow or idle clients from a few addresses can hold every worker for as long
/// as the timeouts allow, and nothing told the operator. The master now warns, once per
/// episode, naming the addresses, and `status` shows it. Blocking mode (the default of
/// both examples used, named explicitly for http_hello): an event worker is not held by
/// a slow client.
fn slow_clients_are_reported(example_name: &str, first_bytes: &[u8], extra: &[&str]) {
    let ctl = socket_path(&format!("ctl-holds-{example_name}"));
    let mut args = vec!["-l", "127.0.0.1:0", "-w", "2", "--control", &ctl];
    args.extend_from_slice(extra);
    let server = Server::start(example_name, &args);
    let addr = server.tcp_addr();
    let held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = connect_from("127.0.0.2", addr);
            s.write_all(first_bytes).unwrap();
            s
        })
        .collect();
    let line = server.wait_for_log("held for 10s or more by slow or idle clients");
    assert!(line.contains("2 of 2 workers"), "{line}");
    assert!(line.contains("127.0.0.2 (2)"), "{line}");
    assert!(line.contains("--max-conns-per-ip"), "{line}");
    let status = status_json(example_name, &ctl);
    let slow = &status["slow_clients"];
    assert_eq!(slow["held"], 2, "{status}");
    assert_eq!(slow["addresses"][0]["address"], "127.0.0.2", "{status}");
    assert_eq!(slow["addresses"][0]["workers"], 2, "{status}");
    drop(held);
    server.wait_for_log("slow or idle clients no longer hold the pool");
    assert!(status_json(example_name, &ctl)["slow_clients"].is_null());
    assert_eq!(
        server.log_text().matches("by slow or idle clients").count(),
        1,
        "one warning per episode"
    );
}

#[test]
fn issue_14_a_slowloris_from_one_address_is_reported() {
    slow_clients_are_reported(
        "http_hello",
        b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ",
        &Io::Blocking.args(&[]),
    );
}

#[test]
fn issue_14_idle_connections_to_a_handle_client_server_are_reported() {
    slow_clients_are_reported("echo", b"", &[]);
}

/// The server's sockets on local port `port` in FIN-WAIT-1 (closed by the server with
/// output the kernel still trickles to the client), with their send queues, and how many
/// are still established.
fn server_sockets(port: u16) -> (Vec<u64>, usize) {
    let mut fin_wait = Vec::new();
    let mut established = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f[1]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port != Some(port) {
                continue;
            }
            let tx_queue = f[4]
                .split(':')
                .next()
                .and_then(|q| u64::from_str_radix(q, 16).ok());
            match f[3] {
                "01" => established += 1,
                "04" => fin_wait.push(tx_queue.unwrap_or(0)),
                _ => {}
            }
        }
    }
    (fin_wait, established)
}

/// Issue 42: three readers that take nothing of a 16 MiB response (`path` on `server`) are
/// cut at `--write-timeout`; each is reset, so that the kernel keeps nothing for them (the
/// async driver closed such a connection with a FIN: its socket stayed in FIN-WAIT-1
/// holding the send queue, 267 MiB for 100 such readers 45 s later, after the connection
/// had left `--max-conns-per-ip`'s count).
fn cut_readers_are_reset(server: &Server, path: &str) {
    let addr = server.tcp_addr();
    let readers: Vec<TcpStream> = (0..3)
        .map(|_| {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.set_recv_buffer_size(4096).unwrap();
            s.connect(&addr.into()).unwrap();
            let mut s = TcpStream::from(s);
            write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
            s
        })
        .collect();
    // The server's ends, established while it writes, then cut.
    let left = wait_until_for(Duration::from_secs(30), || {
        let (fin_wait, established) = server_sockets(addr.port());
        (established == 0).then_some(fin_wait)
    });
    let fin_wait = left.expect("the server still holds the readers after 30 s");
    assert!(
        fin_wait.is_empty(),
        "sockets left trickling to cut readers (send queues {fin_wait:?}):\n{}",
        server.log_text()
    );
    assert_eq!(hello(addr), "HTTP/1.1 200 OK", "the worker serves on");
    drop(readers);
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option): the async model's test is issue_42_a_reader_cut_at_the_write_timeout_is_reset_async, on asyncbed"): issue_42_a_reader_cut_at_the_write_timeout_is_reset);
fn issue_42_a_reader_cut_at_the_write_timeout_is_reset(io: Io) {
    let (_site, server) = big_file_server(
        io,
        "reset",
        16 << 20,
        &["--write-timeout", "1", "--min-send-rate", "0"],
    );
    cut_readers_are_reset(&server, "/static/big.bin");
}

/// Issue 42: the same in the async model (`asyncbed`'s `/big`, a response in the
/// connection's buffer rather than a file).
#[test]
fn issue_42_a_reader_cut_at_the_write_timeout_is_reset_async() {
    let server = Server::start(
        "asyncbed",
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "1",
            "--write-timeout",
            "1",
            "--min-send-rate",
            "0",
        ],
    );
    cut_readers_are_reset(&server, "/big?kb=16384");
}

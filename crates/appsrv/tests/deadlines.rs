//! Overall deadlines on the slow paths of a connection: a response read too slowly
//! (`--min-send-rate`), and the operator's warning when slow clients hold the pool.
//!
//! Regression tests for issue 14 ("Reliability under faults").

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

/// A client with a small receive buffer (so the server's writes soon wait for it) that
/// has asked for the big file. Its segments are a network's (an MSS of 1448 bytes), not
/// loopback's 64 KiB, so that its window opens in small steps as it reads, as it would
/// across a network (on loopback's, the send watch must wait up to a minute to see any
/// progress: see `client::MAX_SEND_WINDOW`).
fn slow_download(addr: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.set_tcp_mss(1448).unwrap();
    s.connect(&addr.into()).unwrap();
    let mut s = TcpStream::from(s);
    s.write_all(b"GET /static/big.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    s
}

/// `GET /` on a new connection: the status line, within [`PATIENCE`].
fn hello(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines().next().unwrap_or_default().to_owned()
}

both_io!(issue_14_a_reader_below_min_send_rate_is_cut_off_and_the_worker_serves_on);
/// Issue 14: a client that reads a large response slowly held its worker without limit
/// (each stalled write was bounded, the response was not). Below `--min-send-rate` it is
/// cut off by the worker, which serves the next client.
/// In event mode the worker serves other clients while it holds the slow reader.
fn issue_14_a_reader_below_min_send_rate_is_cut_off_and_the_worker_serves_on(io: Io) {
    let site = Site::new(&format!("cut-{}", io.name()), 32 << 20);
    let server = Server::start_io(
        "http_hello",
        io,
        &["-l", "127.0.0.1:0", "-w", "1", "--static-dir", site.arg()],
    );
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

both_io!(a_healthy_slow_download_is_not_cut);
/// A long download at a healthy rate is never cut, however long it waits on the client.
fn a_healthy_slow_download_is_not_cut(io: Io) {
    let site = Site::new(&format!("healthy-{}", io.name()), 8 << 20);
    let server = Server::start_io(
        "http_hello",
        io,
        &["-l", "127.0.0.1:0", "-w", "1", "--static-dir", site.arg()],
    );
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

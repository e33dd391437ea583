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
/// has asked for the big file.
fn slow_download(addr: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
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

/// Issue 14: a client that reads a large response slowly held its worker without limit
/// (each stalled write was bounded, the response was not). Below `--min-send-rate` it is
/// cut off by the worker, which serves the next client.
#[test]
fn issue_14_a_reader_below_min_send_rate_is_cut_off_and_the_worker_serves_on() {
    let site = Site::new("cut", 32 << 20);
    let server = Server::start(
        "http_hello",
        &["-l", "127.0.0.1:0", "-w", "1", "--static-dir", site.arg()],
    );
    let addr = server.tcp_addr();
    let _reader = slow_download(addr); // reads nothing
    let started = Instant::now();
    // The only worker is held; this client waits in the listen queue until the cut (about
    // 10 s), where the write timeout alone (60 s) would have outlasted PATIENCE.
    assert_eq!(hello(addr), "HTTP/1.1 200 OK");
    let waited = started.elapsed();
    let line = server.wait_for_log("below --min-send-rate 500 bytes/s: cut off");
    assert!(line.contains("worker 1"), "{line}");
    assert!(
        waited >= Duration::from_secs(5),
        "cut after {waited:?}: too early"
    );
}

/// A long download at a healthy rate is never cut, however long it waits on the client.
#[test]
fn a_healthy_slow_download_is_not_cut() {
    let site = Site::new("healthy", 8 << 20);
    let server = Server::start(
        "http_hello",
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

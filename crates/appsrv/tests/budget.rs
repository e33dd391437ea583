//! The memory a worker gives to requests that have not finished arriving: the event loop's
//! budget of buffered bytes (`--max-buffered-bytes`) and the longest a request may take to
//! arrive (`--header-timeout-max`).
//!
//! Regression tests for issue 31 ("Faults that still take a server down"): 3,000
//! connections that each sent 990 KB of a 1 MB body, then nothing, took an event worker
//! from 6 MiB to 3 GiB; and a byte every 5 s after such a start kept each connection for
//! half an hour, since the early bytes had earned their whole `--min-rate` credit.

mod util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use util::*;

/// A process's resident memory in KiB (`VmRSS`).
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `clients` connections to `addr` that each send `head` and then what their socket's
/// buffers take at once of `sent` bytes of its body, without waiting: a paused
/// connection's bytes wait there, and the client does not wait for them.
fn flood(addr: SocketAddr, clients: usize, head: &[u8], sent: usize) -> Vec<TcpStream> {
    let body = vec![b'a'; sent];
    (0..clients)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(head).unwrap();
            s.set_nonblocking(true).unwrap();
            let mut rest = &body[..];
            while let Ok(n @ 1..) = s.write(rest) {
                rest = &rest[n..];
            }
            s
        })
        .collect()
}

/// Answers to `GET /` from a new client, within `bound`.
fn served(addr: SocketAddr, bound: Duration) {
    let started = Instant::now();
    let out = get_once(addr, "/", bound);
    assert!(
        out.starts_with("HTTP/1.1 200 "),
        "a normal client after {:?}: {out:?}",
        started.elapsed()
    );
}

/// Issue 31: 3,000 connections each send the head of a 1 MB upload and 100 KB of its
/// body, then nothing (300 MB in all; 375 MiB of buffers as they double, against the 3 GiB
/// of the issue's trial with 990 KB each). One event worker with the default budget of
/// 64 MiB holds at most its budget plus a request head's worth per connection: it stops
/// reading from the connections that hold the most and refuses the new ones with 503 and
/// `Retry-After`, a normal client is served meanwhile, and the episode is logged once.
#[test]
fn issue_31_an_event_worker_holds_unfinished_bodies_within_its_budget() {
    holds_unfinished_bodies_within_its_budget(|| {
        Server::start_io("http_hello", Io::Event, &["-l", "127.0.0.1:0", "-w", "1"])
    });
}

/// Issue 42: the same flood against an async worker (`async_hello`), which held every byte
/// (2,381 MiB for 2,500 connections of 990 KB each), whatever `--max-buffered-bytes` said.
#[test]
fn issue_42_an_async_worker_holds_unfinished_bodies_within_its_budget() {
    holds_unfinished_bodies_within_its_budget(|| {
        Server::start("async_hello", &["-l", "127.0.0.1:0", "-w", "1"])
    });
}

/// The flood of issue 31 against the one worker of the server `start` starts (after the
/// descriptor limit is raised), an HTTP server with the default budget.
fn holds_unfinished_bodies_within_its_budget(start: impl FnOnce() -> Server) {
    const CLIENTS: usize = 3000;
    const SENT: usize = 100_000;
    const BUDGET: u64 = 64 << 20;
    if !raise_nofile(CLIENTS as u64 + 500) {
        return;
    }
    let server = start();
    let addr = server.tcp_addr();
    let worker = *server.wait_for_workers(1).iter().next().unwrap();
    served(addr, Duration::from_secs(10));
    let before = rss_kib(worker);
    let mut clients = flood(
        addr,
        CLIENTS,
        b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n",
        SENT,
    );
    server.wait_for_log("reached --max-buffered-bytes");
    served(addr, Duration::from_secs(10));
    // What the worker read is in its buffers by now: a normal request was answered after
    // the flood's bytes were all sent (or left waiting in the sockets).
    let grown = rss_kib(worker).saturating_sub(before);
    // The budget, a request head's worth (4 KiB) per connection, the worker-wide buffer
    // (up to the codec's 1 MiB request), and 8 MiB for the allocator's slack and the
    // connections' records.
    let bound = BUDGET / 1024 + CLIENTS as u64 * 4 + 1024 + 8192;
    assert!(
        grown <= bound,
        "the worker grew by {grown} KiB holding unfinished bodies (bound {bound} KiB)"
    );
    // The refused ones got the codec's refusal, with a time to come back.
    let mut refused = 0;
    for s in &mut clients {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        if let Ok(n) = s.read(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]);
            if text.starts_with("HTTP/1.1 503 ") {
                assert!(text.contains("\r\nRetry-After: 1\r\n"), "{text}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "no connection was refused with 503");
    let lines = server.log_text().matches("reached --max-buffered-bytes").count();
    assert_eq!(lines, 1, "one line for the episode:\n{}", server.log_text());
    // Issue 41: and none per refused connection (a flood logged thousands).
    let per_connection = server
        .log_text()
        .matches("holds too many unfinished requests")
        .count();
    assert_eq!(
        per_connection, 0,
        "{refused} refused, {per_connection} lines for them"
    );
    drop(clients);
    drop(server);
}

/// Issue 31: a request that arrives a byte at a time after a large first part is cut at
/// `--header-timeout-max`, however much `--min-rate` credit its first bytes earned, in
/// every I/O model; the read timeout alone (each byte comes well within it) never would.
fn issue_31_a_trickled_body_is_cut_at_the_header_timeout_max(io: Io) {
    let server = Server::start_io(
        "http_hello",
        io,
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "1",
            "--header-timeout",
            "1",
            "--header-timeout-max",
            "3",
            "--min-rate",
            "1",
            "--read-timeout",
            "30",
        ],
    );
    let mut s = TcpStream::connect(server.tcp_addr()).unwrap();
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    // 20,000 bytes earn 20,000 s at --min-rate 1.
    s.write_all(&[b'a'; 20_000]).unwrap();
    let started = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut answer = Vec::new();
    while started.elapsed() < Duration::from_secs(20) {
        if s.write_all(b"a").is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let took = started.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "after {took:?}: {answer:?}");
    assert!(
        took < Duration::from_secs(15),
        "cut after {took:?}, not at about 3 s"
    );
    drop(server);
}

both_io!(issue_31_a_trickled_body_is_cut_at_the_header_timeout_max);

/// Issue 31: 1,000 connections that each send a 40 KB request head are refused (431), and
/// once they are gone the worker gives the memory back: their buffers, freed, stayed in
/// glibc's free lists (below its mmap threshold) and the worker kept 18 MiB it no longer
/// used. It trims them once what its connections buffer falls from such a peak.
#[test]
fn issue_31_memory_of_a_flood_of_large_heads_is_given_back() {
    const CLIENTS: usize = 1000;
    let server = Server::start_io("http_hello", Io::Event, &["-l", "127.0.0.1:0", "-w", "1"]);
    let addr = server.tcp_addr();
    let worker = *server.wait_for_workers(1).iter().next().unwrap();
    served(addr, Duration::from_secs(10));
    let before = rss_kib(worker);
    let mut head = b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: ".to_vec();
    head.resize(head.len() + 40_000, b'a');
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&head).unwrap();
        clients.push(s);
    }
    let mut peak = 0;
    for s in &mut clients {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"HTTP/1.1 431", "a head over the limit");
        peak = peak.max(rss_kib(worker));
    }
    drop(clients);
    // The trim follows the loop's next turns; a request is a turn.
    let settled = wait_until(|| {
        served(addr, Duration::from_secs(10));
        let now = rss_kib(worker);
        (now <= before + 8 * 1024).then_some(now)
    });
    assert!(
        settled.is_some(),
        "the worker kept {} KiB more than before the flood (peak {} KiB more)",
        rss_kib(worker).saturating_sub(before),
        peak.saturating_sub(before)
    );
    drop(server);
}

/// Issue 41: the line that says an event worker reached its budget of buffered bytes names
/// the refusal in the codec's own words: `kv` speaks RESP, and its line said "(HTTP 503)".
/// 40 connections each start a `SET` of a 1 MB value and send 200 KB of it against a
/// budget of 2 MiB; the line quotes RESP's `-ERR refused: …`, never HTTP, and the
/// connections refused got that reply.
#[test]
fn issue_41_the_budget_line_speaks_the_codecs_protocol() {
    const CLIENTS: usize = 40;
    const SENT: usize = 200_000;
    let server = Server::start_io(
        "kv",
        Io::Event,
        &["-l", "127.0.0.1:0", "-w", "1", "--max-buffered-bytes", "2097152"],
    );
    let addr = server.tcp_addr();
    let mut clients = flood(addr, CLIENTS, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1000000\r\n", SENT);
    let line = server.wait_for_log("reached --max-buffered-bytes");
    assert!(
        line.contains("refusing new large requests with \"-ERR refused: the server holds too many unfinished requests; try again later\""),
        "{line}"
    );
    assert!(!line.contains("HTTP"), "{line}");
    // The refused ones got that reply (the ones paused get nothing).
    let reply = wait_until(|| {
        clients.iter_mut().find_map(|s| {
            let mut buf = [0u8; 512];
            match s.read(&mut buf) {
                Ok(n @ 1..) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
                _ => None,
            }
        })
    });
    let reply = reply.expect("no connection was refused");
    assert!(reply.starts_with("-ERR refused: "), "{reply:?}");
    drop(clients);
    drop(server);
}

/// Issue 41: after a flood of unfinished bodies closes, an event worker's resident memory
/// is back within 16 MiB of its figure before the flood within 10 s of the clients
/// leaving (the trial saw 137 to 139 MiB kept 4 s after). 300 connections each start a
/// `SET` of a 1 MB value on `kv` and send 300 KB of it (90 MB against the default budget of
/// 64 MiB: some paused, some refused), then close at once.
#[test]
fn issue_41_worker_memory_is_given_back_after_a_body_flood_closes() {
    const CLIENTS: usize = 300;
    const SENT: usize = 300_000;
    let server = Server::start_io("kv", Io::Event, &["-l", "127.0.0.1:0", "-w", "1"]);
    let addr = server.tcp_addr();
    let worker = *server.wait_for_workers(1).iter().next().unwrap();
    let before = rss_kib(worker);
    let clients = flood(addr, CLIENTS, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1000000\r\n", SENT);
    // The flood is in the worker's buffers: its budget is reached.
    server.wait_for_log("reached --max-buffered-bytes");
    let peak = wait_until(|| {
        let now = rss_kib(worker);
        (now >= before + 32 * 1024).then_some(now)
    })
    .unwrap_or_else(|| panic!("the flood did not grow the worker ({} KiB)", rss_kib(worker)));
    drop(clients);
    let left = Instant::now();
    let settled = wait_until_for(Duration::from_secs(10), || {
        let now = rss_kib(worker);
        (now <= before + 16 * 1024).then_some(now)
    });
    assert!(
        settled.is_some(),
        "{} s after the clients left the worker holds {} KiB more than before the flood \
         ({before} KiB; peak {peak} KiB)",
        left.elapsed().as_secs(),
        rss_kib(worker).saturating_sub(before)
    );
    drop(server);
}

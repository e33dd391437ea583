//! Issue 19: what happens to a datagram worker when its handler misbehaves, and to the
//! datagrams queued when the server stops. Drives the testbed's datagram mode
//! (`testbed --datagrams`: `pid`, `sleep SECS`, `panic`, anything else echoed).

mod util;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use util::Server;

fn client() -> UdpSocket {
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c
}

fn ask(c: &UdpSocket, to: SocketAddr, what: &str) -> String {
    c.send_to(what.as_bytes(), to).unwrap();
    let mut buf = [0; 2048];
    let (n, from) = c
        .recv_from(&mut buf)
        .unwrap_or_else(|e| panic!("no answer to {what:?}: {e}"));
    assert_eq!(from, to, "the answer comes from the address asked");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn worker_pid(c: &UdpSocket, to: SocketAddr) -> i32 {
    let answer = ask(c, to, "pid");
    answer
        .strip_prefix("pid ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("not a pid answer: {answer:?}"))
}

/// The pid of a worker other than `before` that answers, once one does.
fn replacement(server: &Server, addr: SocketAddr, before: i32) -> i32 {
    util::wait_until(|| {
        let c = client();
        c.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        c.send_to(b"pid", addr).ok()?;
        let mut buf = [0; 64];
        let (n, _) = c.recv_from(&mut buf).ok()?;
        let pid: i32 = String::from_utf8_lossy(&buf[..n])
            .strip_prefix("pid ")?
            .parse()
            .ok()?;
        (pid != before).then_some(pid)
    })
    .unwrap_or_else(|| panic!("no replacement worker answered; log:\n{}", server.log_text()))
}

#[test]
fn issue_19_a_panicking_datagram_handler_is_logged_and_its_worker_replaced() {
    let server = Server::start("testbed", &["--datagrams", "-l", "udp://127.0.0.1:0", "-w", "1"]);
    let addr = server.udp_addr();
    let c = client();
    let before = worker_pid(&c, addr);
    c.send_to(b"panic", addr).unwrap();
    let line = server.wait_for_log("datagram handler panicked");
    let local = c.local_addr().unwrap();
    assert!(
        line.contains(&local.to_string()),
        "the line names the sender {local}: {line}"
    );
    server.wait_for_log(&format!("pid {before}"));
    assert_ne!(replacement(&server, addr, before), before, "a new worker answers");
}

#[test]
fn issue_19_a_datagram_handler_that_blocks_past_the_request_timeout_is_killed() {
    let server = Server::start(
        "testbed",
        &[
            "--datagrams",
            "-l",
            "udp://127.0.0.1:0",
            "-w",
            "1",
            "--request-timeout",
            "1",
        ],
    );
    let addr = server.udp_addr();
    let c = client();
    let before = worker_pid(&c, addr);
    c.send_to(b"sleep 30", addr).unwrap();
    let line = server.wait_for_log("exceeded the request timeout");
    let local = c.local_addr().unwrap();
    assert!(
        line.contains(&local.to_string()),
        "the line names the sender {local}: {line}"
    );
    assert!(
        line.contains("sleep 30"),
        "and the datagram's first bytes: {line}"
    );
    let after = replacement(&server, addr, before);
    assert!(
        !util::alive(before),
        "the stuck worker {before} was killed (now {after} answers)"
    );
}

#[test]
fn issue_19_a_stop_answers_the_datagrams_already_received() {
    let mut server = Server::start("testbed", &["--datagrams", "-l", "udp://127.0.0.1:0", "-w", "1"]);
    let addr = server.udp_addr();
    let c = client();
    worker_pid(&c, addr);
    // The worker is busy for a while; meanwhile datagrams queue in the socket, then the
    // stop comes. Every one of them is answered before the worker exits.
    c.send_to(b"sleep 0.5", addr).unwrap();
    for i in 0..20 {
        c.send_to(format!("q{i}").as_bytes(), addr).unwrap();
    }
    server.signal(libc::SIGTERM);
    let mut answers = Vec::new();
    let mut buf = [0; 64];
    while answers.len() < 21 {
        match c.recv_from(&mut buf) {
            Ok((n, _)) => answers.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) => panic!(
                "{} of 21 answered before {e}; log:\n{}",
                answers.len(),
                server.log_text()
            ),
        }
    }
    assert_eq!(answers[0], "slept");
    for i in 0..20 {
        assert!(answers.contains(&format!("q{i}")), "q{i} answered: {answers:?}");
    }
    let status = server.wait_exit();
    assert!(status.success(), "clean stop: {status:?}");
}

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

/// The log line names the client socket `c` as the datagram's sender.
fn assert_names_sender(line: &str, c: &UdpSocket) {
    let local = c.local_addr().unwrap();
    assert!(
        line.contains(&local.to_string()),
        "the line names the sender {local}: {line}"
    );
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
    assert_names_sender(&line, &c);
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
    assert_names_sender(&line, &c);
    assert!(
        !line.contains("sleep 30"),
        "not the datagram's bytes, which may hold anything (issue 41; --status-request-detail shows them): {line}"
    );
    let after = replacement(&server, addr, before);
    // The master may fork the replacement before the killed worker is gone: wait for it.
    assert!(
        util::wait_until(|| (!util::alive(before)).then_some(())).is_some(),
        "the stuck worker {before} was killed (now {after} answers)"
    );
}

#[test]
fn issue_19_a_stop_answers_the_datagrams_already_received() {
    const QUEUED: usize = 200;
    let dir = std::env::temp_dir().join(format!("appsrv-dgstop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ctl = dir.join("ctl.sock").display().to_string();
    let mut server = Server::start(
        "testbed",
        &[
            "--datagrams",
            "-l",
            "udp://127.0.0.1:0",
            "-w",
            "1",
            "--control",
            &ctl,
        ],
    );
    let addr = server.udp_addr();
    let c = client();
    worker_pid(&c, addr);
    // The worker is held in a handler call on a datagram of its own batch; meanwhile 200
    // datagrams queue in the socket, more than one turn of the loop reads (4 batches of
    // 32) and fewer than a default socket buffer holds (about 256 small ones); then the
    // stop comes. Every one of them is answered before the worker exits.
    c.send_to(b"sleep 1", addr).unwrap();
    let handling = util::wait_until(|| {
        let out = std::process::Command::new(util::example("testbed"))
            .args(["status", "--json", "--control", &ctl])
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (v["event"]["handling"].as_u64() == Some(1)).then_some(())
    });
    assert!(
        handling.is_some(),
        "the worker never showed a handler call; log:\n{}",
        server.log_text()
    );
    for i in 0..QUEUED {
        c.send_to(format!("q{i}").as_bytes(), addr).unwrap();
    }
    server.signal(libc::SIGTERM);
    let mut answers = Vec::new();
    let mut buf = [0; 64];
    while answers.len() < QUEUED + 1 {
        match c.recv_from(&mut buf) {
            Ok((n, _)) => answers.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) => panic!(
                "{} of {} answered before {e}; log:\n{}",
                answers.len(),
                QUEUED + 1,
                server.log_text()
            ),
        }
    }
    assert_eq!(answers[0], "slept");
    for i in 0..QUEUED {
        assert!(answers.contains(&format!("q{i}")), "q{i} answered: {answers:?}");
    }
    let status = server.wait_exit();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "clean stop: {status:?}");
}

#[test]
fn issue_19_a_worker_under_a_steady_flood_still_sees_its_stop() {
    // Each datagram holds the worker 1 ms and the flood sends far faster: the socket is
    // never empty, so the loop's waits always find it ready, and a stop signal is never
    // delivered by an interrupted wait. The worker must still stop at once (well within the
    // grace period, which would otherwise end it: 60 s, longer than the test waits).
    let mut server = Server::start(
        "testbed",
        &[
            "--datagrams",
            "-l",
            "udp://127.0.0.1:0",
            "-w",
            "1",
            "--grace-period",
            "60",
        ],
    );
    let addr = server.udp_addr();
    worker_pid(&client(), addr);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if s.send_to(b"sleep 0.001", addr).is_ok() {
                    sent += 1;
                }
            }
            sent
        })
    };
    // The flood is on once the worker has a queue: its answers to the flood lag behind.
    let c = client();
    c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut buf = [0; 64];
    assert!(
        util::wait_until(|| {
            c.send_to(b"pid", addr).ok()?;
            c.recv_from(&mut buf).is_err().then_some(())
        })
        .is_some(),
        "the flood never queued"
    );
    let asked = std::time::Instant::now();
    server.signal(libc::SIGTERM);
    let status = server.wait_exit();
    let took = asked.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = flood.join().unwrap();
    assert!(status.success(), "clean stop: {status:?}");
    assert!(
        took < Duration::from_secs(20),
        "stopped in {took:?} under a flood of {sent} datagrams"
    );
    assert!(
        !server.log_text().contains("killing"),
        "no worker killed:\n{}",
        server.log_text()
    );
}

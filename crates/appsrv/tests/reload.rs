//! Reload: a new generation of workers without dropping a request, a failing reload that
//! leaves the current workers serving, and `check`.
//!
//! Regression tests for issue #6 ("Zero-downtime reload"), the parts done so far.

mod util;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use util::*;

fn ctl_path(tag: &str) -> String {
    socket_path(&format!("ctl-{tag}"))
}

fn run(example_name: &str, args: &[&str]) -> std::process::Output {
    Command::new(example(example_name)).args(args).output().unwrap()
}

/// One HTTP/1.1 GET on `conn` (opening one if needed); a keep-alive connection the server
/// closed before answering is retried once on a new connection, as HTTP clients do.
fn get(addr: SocketAddr, conn: &mut Option<BufReader<TcpStream>>) -> Result<(), String> {
    for attempt in 0..2 {
        let reused = conn.is_some();
        let c = match conn {
            Some(c) => c,
            None => {
                let s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
                s.set_read_timeout(Some(PATIENCE)).unwrap();
                conn.insert(BufReader::new(s))
            }
        };
        let sent = c.get_mut().write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
        let mut status = String::new();
        let read = sent.and_then(|()| c.read_line(&mut status));
        match read {
            Ok(n) if n > 0 => {
                let mut close = false;
                let mut len = 0;
                loop {
                    let mut h = String::new();
                    c.read_line(&mut h).map_err(|e| format!("header: {e}"))?;
                    if h == "\r\n" {
                        break;
                    }
                    let l = h.to_ascii_lowercase();
                    if let Some(v) = l.strip_prefix("content-length: ") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    close |= l.starts_with("connection: close");
                }
                let mut body = vec![0; len];
                c.read_exact(&mut body).map_err(|e| format!("body: {e}"))?;
                if !status.starts_with("HTTP/1.1 200") || body != b"Hello, World!" {
                    return Err(format!("bad response {status:?}"));
                }
                if close {
                    *conn = None;
                }
                return Ok(());
            }
            // Closed before any byte of the answer, on a connection used before: retry.
            _ if reused && attempt == 0 => *conn = None,
            Ok(_) => return Err("closed without a response".into()),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    Err("no answer after a retry".into())
}

#[test]
fn reload_three_times_under_load_without_a_failed_request() {
    let ctl = ctl_path("load");
    let server = Server::start("http_hello", &["-l", "127.0.0.1:0", "-w", "3", "--control", &ctl]);
    let addr = server.tcp_addr();
    let before: HashSet<i32> = server.worker_pids();
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let failures = std::thread::scope(|s| {
        let clients: Vec<_> = (0..2)
            .map(|i| {
                let (stop, done) = (&stop, &done);
                s.spawn(move || {
                    let mut errors = Vec::new();
                    let mut conn = None;
                    while !stop.load(Ordering::Relaxed) {
                        // Client 0 keeps its connection alive, client 1 reconnects each time.
                        if i == 1 {
                            conn = None;
                        }
                        match get(addr, &mut conn) {
                            Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                            Err(e) => {
                                errors.push(e);
                                0
                            }
                        };
                    }
                    errors
                })
            })
            .collect();
        for _ in 0..3 {
            let out = run("http_hello", &["reload", "--control", &ctl]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        stop.store(true, Ordering::Relaxed);
        clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    assert!(done.load(Ordering::Relaxed) > 0);
    let after = server.worker_pids();
    assert_eq!(after.len(), 3);
    assert!(
        after.is_disjoint(&before),
        "a new generation serves: {before:?} → {after:?}"
    );
    assert_eq!(server.log_text().matches("starting generation").count(), 3);
}

#[test]
fn a_failed_reload_keeps_the_current_workers_serving() {
    let ctl = ctl_path("fail");
    let server = Server::start(
        "testbed",
        &["-l", "127.0.0.1:0", "-w", "2", "--control", &ctl, "--fail-reload"],
    );
    let before = server.worker_pids();
    let out = run("testbed", &["reload", "--control", &ctl]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("policy file unreadable (testbed --fail-reload)"),
        "{err}"
    );
    assert_eq!(server.worker_pids(), before, "the same workers");
    let mut c = LineClient::tcp(server.tcp_addr());
    assert!(before.contains(&c.testbed_pid()));
    // HUP goes the same way, and says so in the log.
    server.signal(libc::SIGHUP);
    server.wait_for_log("SIGHUP received: reload failed");
    assert_eq!(server.worker_pids(), before);
}

#[test]
fn hup_starts_a_new_generation() {
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "2"]);
    let before = server.worker_pids();
    server.signal(libc::SIGHUP);
    server.wait_for_log("reload requested by SIGHUP: starting generation 1");
    let replaced = wait_until(|| {
        let now = server.worker_pids();
        (now.len() == 2 && now.is_disjoint(&before)).then_some(())
    });
    assert!(replaced.is_some(), "log:\n{}", server.log_text());
}

#[test]
fn check_validates_without_serving() {
    let out = run("testbed", &["check", "-l", "127.0.0.1:1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("testbed: configuration OK"));
    let out = run("testbed", &["-t", "-l", "127.0.0.1:1", "--fail-check"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("policy file unreadable (testbed --fail-check)"));
    let out = run(
        "testbed",
        &["check", "-l", "127.0.0.1:1", "--user", "no-such-user-appsrv"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such user"));
    let out = run(
        "testbed",
        &[
            "check",
            "-l",
            "127.0.0.1:1",
            "--pool",
            "dynamic",
            "--min-spare",
            "9",
            "--max-spare",
            "2",
        ],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--min-spare 9 is above --max-spare 2"));
}

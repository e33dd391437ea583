//! idle-clients against scripted servers: it has every connection answered once, holds
//! them until its stdin closes, counts what failed and what the server closed, and checks
//! that one more client is served.

mod support;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use support::{Conn, PATIENCE, Server, for_each_message, read_message};

const GET: &str = r"GET / HTTP/1.1\r\nHost: x\r\n\r\n";

/// A running idle-clients, killed when dropped (a failed test leaves nothing behind).
struct Clients {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Clients {
    fn start(args: &[&str]) -> Clients {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idle-clients"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start idle-clients");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Clients {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line starting with `prefix` and returns it.
    fn line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                }
                Err(_) => panic!("no line {prefix:?} from idle-clients; it said {:?}", self.seen),
            }
        }
    }

    /// Closes stdin (the release), waits for the exit and returns its code.
    fn release(&mut self) -> Option<i32> {
        drop(self.stdin.take());
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for idle-clients") {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "idle-clients still running after the release"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP server answering every request `200` with a 13-byte body, keeping the
/// connection; counts the requests.
fn http_server(status: &'static str) -> (Server, Arc<AtomicUsize>) {
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    let server = Server::tcp(move |conn: &mut dyn Conn| {
        for_each_message(conn, b"\r\n\r\n", |_, conn| {
            counter.fetch_add(1, Ordering::SeqCst);
            write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Length: 13\r\n\r\nHello, World!"
            )
        })
    });
    (server, requests)
}

#[test]
fn holds_every_answered_connection_until_stdin_closes_then_serves_a_new_client() {
    let (server, requests) = http_server("200 OK");
    let addr = server.addr().to_string();
    let mut c = Clients::start(&[
        "--connect",
        &addr,
        "-n",
        "40",
        "--request",
        GET,
        "--http",
        "--threads",
        "3",
    ]);
    let answered = c.line("answered ");
    assert!(answered.starts_with("answered 40 failed 0 "), "{answered}");
    assert_eq!(c.line("holding "), "holding 40");
    // Held: all 40 connections are open at the server and none was asked twice.
    assert_eq!(server.accepts(), 40);
    assert_eq!(requests.load(Ordering::SeqCst), 40);
    assert_eq!(c.release(), Some(0));
    assert_eq!(
        c.line("still open "),
        "still open 40 of 40 (closed by the server 0, unexpected data on 0)"
    );
    assert!(c.line("new client: ").starts_with("new client: answered in "));
    assert_eq!(server.stop(), 41, "the new client is one more connection");
}

#[test]
fn counts_non_2xx_responses_as_failed_and_reports_an_unserved_new_client() {
    let (server, _) = http_server("503 Service Unavailable");
    let addr = server.addr().to_string();
    let mut c = Clients::start(&["--connect", &addr, "-n", "5", "--request", GET, "--http"]);
    let answered = c.line("answered ");
    assert!(answered.starts_with("answered 0 failed 5 ("), "{answered}");
    assert!(answered.contains("non-2xx 5"), "{answered}");
    assert_eq!(c.line("holding "), "holding 0");
    assert_eq!(c.release(), Some(1), "the new client got a 503: exit status 1");
    assert!(c.line("new client: ").starts_with("new client: failed "));
}

#[test]
fn counts_the_connections_the_server_closed_while_they_were_held() {
    // A line server that answers each of 6 connections once and closes it (a listener of
    // the test's own: the count is taken after the close, which on loopback has delivered
    // the FIN by the time it returns), then serves the new client on a 7th and keeps it.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let closed = Arc::new(AtomicUsize::new(0));
    let counter = closed.clone();
    let server = thread::spawn(move || -> io::Result<()> {
        for i in 0..7 {
            let (mut s, _) = listener.accept()?;
            s.set_read_timeout(Some(PATIENCE))?;
            read_message(&mut s, b"\n")?;
            s.write_all(b"+PONG\r\n")?;
            if i == 6 {
                // The new client: wait for its RST (idle-clients aborts it) or the end.
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
            } else {
                drop(s);
                counter.fetch_add(1, Ordering::SeqCst);
            }
        }
        Ok(())
    });
    let mut c = Clients::start(&[
        "--connect",
        &addr,
        "-n",
        "6",
        "--request",
        r"PING\r\n",
        "--until",
        r"\n",
    ]);
    assert_eq!(c.line("holding "), "holding 6");
    let deadline = Instant::now() + PATIENCE;
    while closed.load(Ordering::SeqCst) < 6 {
        assert!(
            Instant::now() < deadline,
            "the server did not close its connections"
        );
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(c.release(), Some(0));
    assert_eq!(
        c.line("still open "),
        "still open 0 of 6 (closed by the server 6, unexpected data on 0)"
    );
    assert!(c.line("new client: ").starts_with("new client: answered in "));
    server.join().expect("server thread").expect("server I/O");
}

#[test]
fn refuses_a_run_without_a_framing() {
    let out = Command::new(env!("CARGO_BIN_EXE_idle-clients"))
        .args(["--connect", "127.0.0.1:1", "-n", "1", "--request", "x"])
        .stdin(Stdio::null())
        .output()
        .expect("run idle-clients");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--until") || err.contains("--http"), "{err}");
}

//! Client access rules and the per-address connection cap.
//!
//! Regression tests for issue #8 ("Client access rules, slow-client defences"), the parts
//! done so far.

mod util;

use std::io::{Read, Write};
use std::net::TcpStream;

use util::*;

/// Sends a GET and returns the status code of the answer (0 if the connection closed).
fn status(s: &mut TcpStream) -> u16 {
    if s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").is_err() {
        return 0;
    }
    let mut head = [0u8; 12];
    match s.read_exact(&mut head) {
        Ok(()) => std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap(),
        Err(_) => 0,
    }
}

both_io!(the_per_address_cap_holds_across_workers_under_a_storm);
fn the_per_address_cap_holds_across_workers_under_a_storm(io: Io) {
    let server = Server::start_io(
        "http_hello",
        io,
        &["-l", "127.0.0.1:0", "-w", "8", "--max-conns-per-ip", "3"],
    );
    let addr = server.tcp_addr();
    // Eight connections at once from 127.0.0.1, each held open after its answer.
    let mut conns: Vec<TcpStream> = std::thread::scope(|s| {
        let t: Vec<_> = (0..8)
            .map(|_| s.spawn(|| connect_from("127.0.0.1", addr)))
            .collect();
        t.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let codes: Vec<u16> = conns.iter_mut().map(status).collect();
    let served = codes.iter().filter(|c| **c == 200).count();
    let refused = codes.iter().filter(|c| **c == 503).count();
    assert!(served <= 3, "never more than the cap at once: {codes:?}");
    assert!(served >= 1, "{codes:?}");
    assert_eq!(
        served + refused,
        8,
        "every other connection gets the codec's 503: {codes:?}"
    );
    server.wait_for_log("refusing connections from 127.0.0.1: more than 3 at once");
    // Another address is not affected.
    let mut other = connect_from("127.0.0.2", addr);
    assert_eq!(status(&mut other), 200);
}

both_io!(a_request_trickling_in_is_cut_off_with_408);
fn a_request_trickling_in_is_cut_off_with_408(io: Io) {
    let server = Server::start_io(
        "http_hello",
        io,
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "2",
            "--header-timeout",
            "1",
            "--min-rate",
            "0",
        ],
    );
    let mut s = connect_from("127.0.0.1", server.tcp_addr());
    s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    // One header byte every 200 ms: the stimulus of a slow client.
    let started = std::time::Instant::now();
    let mut answer = String::new();
    for b in b"X-Slow: yes".iter().cycle() {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        if started.elapsed() > std::time::Duration::from_secs(1) {
            let _ = s.read_to_string(&mut answer);
            break;
        }
    }
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    server.wait_for_log("timed out waiting for the rest of the request; closing the connection");
}

both_io!(slowloris_from_one_address_does_not_starve_other_clients);
fn slowloris_from_one_address_does_not_starve_other_clients(io: Io) {
    // Blocking: a dynamic pool grows to serve; event: two static workers hold them all;
    // hybrid: the front holds them, two workers serve the normal client.
    let pool: &[&str] = match io {
        Io::Blocking => &["--pool", "dynamic", "--max-workers", "32"],
        Io::Event | Io::Hybrid | Io::Async => &["-w", "2"],
    };
    let mut args = vec!["-l", "127.0.0.1:0", "--max-conns-per-ip", "8"];
    args.extend_from_slice(pool);
    let server = Server::start_io("http_hello", io, &args);
    let addr = server.tcp_addr();
    // 200 connections from 127.0.0.2 that send the start of a request, then nothing.
    let attackers: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut s = connect_from("127.0.0.2", addr);
            let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ");
            s
        })
        .collect();
    // Meanwhile a normal client from 127.0.0.1: every request answered, promptly.
    let mut worst = std::time::Duration::ZERO;
    for _ in 0..50 {
        let t = std::time::Instant::now();
        let mut c = connect_from("127.0.0.1", addr);
        assert_eq!(status(&mut c), 200);
        worst = worst.max(t.elapsed());
    }
    eprintln!("worst latency of the normal client under attack: {worst:?}");
    assert!(worst < std::time::Duration::from_secs(5), "{worst:?}");
    assert!(server.worker_pids().len() <= 32);
    drop(attackers);
}

/// The hello example's greeting to a client connecting from `from`, or None if the server
/// closed the connection without one.
fn greeting(server: &Server, from: &str) -> Option<String> {
    let out = read_all_from(from, server.tcp_addr());
    (!out.is_empty()).then_some(out)
}

/// The testbed's first line to a client connecting from `from` (`pid N`), or None if the
/// server closed the connection without one.
fn first_line(addr: std::net::SocketAddr, from: &str) -> Option<String> {
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(connect_from(from, addr)), &mut line);
    (!line.is_empty()).then_some(line)
}

/// Issue 31, at the client level: `Client::penalize` ends the connection's input (a line the
/// client sent after it is not read), and the address's next connections are closed at once,
/// by either worker, without the greeting, while another address is served; with
/// `--penalty-max 0` nothing is charged and the address is served.
#[test]
fn issue_31_a_client_level_penalty_ends_the_input_and_refuses_the_address() {
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "2"]);
    let addr = server.tcp_addr();
    let mut s = connect_from("127.0.0.1", addr);
    s.write_all(b"penalize\nnot read\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out:?}");
    assert!(lines[0].starts_with("pid "), "{out:?}");
    assert_eq!(lines[1], "penalized 1000", "the first failure: 1 s");
    // Refused for that second, on both workers (a margin: each refusal is one connection).
    for _ in 0..4 {
        assert_eq!(first_line(addr, "127.0.0.1"), None, "{}", server.log_text());
    }
    assert!(first_line(addr, "127.0.0.2").is_some_and(|g| g.starts_with("pid ")));
    server.wait_for_log("refusing connections from 127.0.0.1 for 1s: 1 failed authentication(s)");
    // Then served again.
    let served = wait_until(|| first_line(addr, "127.0.0.1"));
    assert!(served.is_some_and(|g| g.starts_with("pid ")));

    // Re-executed workers (`--exec-workers`) map the master's table from its memfd: a
    // charge in one is seen by the other's admission.
    let exec = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "2", "--exec-workers"]);
    let mut s = connect_from("127.0.0.1", exec.tcp_addr());
    s.write_all(b"penalize\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.ends_with("penalized 1000\n"), "{out:?}");
    for _ in 0..4 {
        assert_eq!(
            first_line(exec.tcp_addr(), "127.0.0.1"),
            None,
            "{}",
            exec.log_text()
        );
    }

    let off = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "2", "--penalty-max", "0"]);
    let mut s = connect_from("127.0.0.1", off.tcp_addr());
    s.write_all(b"penalize\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.ends_with("penalized none\n"), "{out:?}");
    assert!(
        first_line(off.tcp_addr(), "127.0.0.1").is_some(),
        "no penalty with --penalty-max 0"
    );
}

#[test]
fn allow_and_deny_rules_with_deny_winning() {
    let cases: [(&[&str], bool, bool); 4] = [
        (&["--deny", "127.0.0.2"], true, false),
        (&["--allow", "127.0.0.1"], true, false), // any allow makes the default deny
        (&["--allow", "127.0.0.0/8", "--deny", "127.0.0.2/32"], true, false), // deny wins
        (&["--allow", "127.0.0.0/8"], true, true),
    ];
    for (rules, one, two) in cases {
        let mut args = vec!["-l", "127.0.0.1:0", "-w", "2"];
        args.extend_from_slice(rules);
        let server = Server::start("hello", &args);
        assert_eq!(
            greeting(&server, "127.0.0.1").is_some(),
            one,
            "127.0.0.1 with {rules:?}"
        );
        assert_eq!(
            greeting(&server, "127.0.0.2").is_some(),
            two,
            "127.0.0.2 with {rules:?}"
        );
    }
    // Per listener, as an address option.
    let server = Server::start("hello", &["-l", "127.0.0.1:0?deny=127.0.0.2", "-w", "2"]);
    assert!(greeting(&server, "127.0.0.1").is_some());
    assert!(greeting(&server, "127.0.0.2").is_none());
    server.wait_for_log("denied connections from 127.0.0.2");
}

fn rules_apply_to_ipv6_clients() {
    for (rule, served) in [("--deny", false), ("--allow", true)] {
        let server = Server::start("hello", &["-l", "[::1]:0", "-w", "2", rule, "::1"]);
        let mut s = TcpStream::connect(server.tcp_addr()).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert_eq!(!out.is_empty(), served, "{rule} ::1: {out:?}");
    }
}

/// A PROXY protocol v2 header naming `client` (TCP over IPv4).
fn proxy_v2(client: std::net::SocketAddrV4, to: std::net::SocketAddrV4) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x21, 0x11, 0, 12]);
    h.extend_from_slice(&client.ip().octets());
    h.extend_from_slice(&to.ip().octets());
    h.extend_from_slice(&client.port().to_be_bytes());
    h.extend_from_slice(&to.port().to_be_bytes());
    h
}

#[test]
fn a_proxy_v2_header_in_single_bytes_gives_the_real_client() {
    let server = Server::start("hello", &["-l", "127.0.0.1:0?proxy", "-w", "2"]);
    let mut s = connect_from("127.0.0.1", server.tcp_addr());
    s.set_nodelay(true).unwrap();
    for b in proxy_v2(
        "192.0.2.7:4321".parse().unwrap(),
        "127.0.0.1:7000".parse().unwrap(),
    ) {
        s.write_all(&[b]).unwrap();
    }
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert_eq!(out, "Hello, Client! You are 192.0.2.7:4321\n");
    // Version 1, and the access rules see the real client.
    let server = Server::start(
        "hello",
        &[
            "-l",
            "127.0.0.1:0",
            "--proxy-protocol",
            "--deny",
            "198.51.100.0/24",
        ],
    );
    let mut s = connect_from("127.0.0.1", server.tcp_addr());
    s.write_all(b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 7000\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert_eq!(out, "Hello, Client! You are 203.0.113.9:5555\n");
    let mut s = connect_from("127.0.0.1", server.tcp_addr());
    s.write_all(b"PROXY TCP4 198.51.100.1 127.0.0.1 5555 7000\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert_eq!(out, "", "the real client is denied");
}

#[test]
fn untrusted_or_malformed_proxy_headers_are_refused() {
    let server = Server::start(
        "hello",
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "1",
            "--proxy-protocol",
            "--proxy-from",
            "10.0.0.0/8",
        ],
    );
    let mut s = connect_from("127.0.0.1", server.tcp_addr());
    s.write_all(b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 7000\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert_eq!(out, "");
    server.wait_for_log("127.0.0.1 is not a trusted PROXY protocol source");
    drop(server);
    let server = Server::start("hello", &["-l", "127.0.0.1:0", "-w", "1", "--proxy-protocol"]);
    let mut s = connect_from("127.0.0.1", server.tcp_addr());
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert_eq!(out, "", "no header: closed");
    // The single worker goes on with the next client.
    let mut s = connect_from("127.0.0.1", server.tcp_addr());
    s.write_all(b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 7000\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.contains("203.0.113.9:5555"), "{out}");
}

/// Issue 14: each read of a PROXY header was bounded, the header as a whole was not: one
/// trickled a byte at a time held a worker indefinitely. It must now be complete within
/// `--header-timeout` of the accept.
#[test]
fn issue_14_a_trickled_proxy_header_is_cut_at_the_header_timeout() {
    let server = Server::start(
        "hello",
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "1",
            "--proxy-protocol",
            "--header-timeout",
            "1",
        ],
    );
    let mut s = connect_from("127.0.0.1", server.tcp_addr());
    // One byte every 200 ms, far more often than any read timeout: only an overall
    // deadline ends it. The header would take about 9 s to arrive in full.
    let header = b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 7000\r\n";
    let (cut, held) = trickle(&mut s, header, std::time::Duration::from_millis(200));
    assert!(
        cut,
        "the whole header went through in {held:?}: no overall deadline"
    );
    assert!(held < std::time::Duration::from_secs(6), "held for {held:?}");
    server.wait_for_log("its PROXY header was not complete within 1s (--header-timeout)");
    // The single worker goes on with the next client.
    let mut s = connect_from("127.0.0.1", server.tcp_addr());
    s.write_all(header).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.contains("203.0.113.9:5555"), "{out}");
}

/// A GET from `from` on a new connection: its status code, 0 if closed without an answer.
fn status_from(from: &str, to: std::net::SocketAddr) -> u16 {
    status(&mut connect_from(from, to))
}

both_io!(request_level_allow_and_deny_rules_with_deny_winning);
/// The allow and deny rules (globally and per listener) on a request-level server, in each
/// I/O model: a denied client is closed before any request is read.
fn request_level_allow_and_deny_rules_with_deny_winning(io: Io) {
    let server = Server::start_io(
        "http_hello",
        io,
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "2",
            "--allow",
            "127.0.0.0/8",
            "--deny",
            "127.0.0.2/32",
        ],
    );
    let addr = server.tcp_addr();
    assert_eq!(status_from("127.0.0.1", addr), 200);
    assert_eq!(status_from("127.0.0.2", addr), 0, "deny wins over allow");
    assert_eq!(status_from("127.0.0.3", addr), 200);
    server.wait_for_log("denied connections from 127.0.0.2");
    let server = Server::start_io("http_hello", io, &["-l", "127.0.0.1:0?deny=127.0.0.2", "-w", "2"]);
    let addr = server.tcp_addr();
    assert_eq!(status_from("127.0.0.1", addr), 200);
    assert_eq!(status_from("127.0.0.2", addr), 0, "the listener's rule");
}

/// A temporary directory for an access log, removed on drop.
struct LogDir(std::path::PathBuf);

impl LogDir {
    fn new(tag: &str) -> LogDir {
        let dir = std::env::temp_dir().join(format!("appsrv-access-rules-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        LogDir(dir)
    }

    fn log(&self) -> String {
        self.0.join("access.log").to_string_lossy().into_owned()
    }

    /// Waits for an access-log line containing `needle`.
    fn wait_for_line(&self, needle: &str) -> String {
        let found = wait_until(|| {
            let text = std::fs::read_to_string(self.log()).unwrap_or_default();
            text.lines().find(|l| l.contains(needle)).map(str::to_owned)
        });
        found.unwrap_or_else(|| {
            panic!(
                "no access-log line with {needle:?}:\n{}",
                std::fs::read_to_string(self.log()).unwrap_or_default()
            )
        })
    }
}

impl Drop for LogDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

both_io!(request_level_proxy_headers_give_the_real_client);
/// The PROXY protocol on a request-level server, in each I/O model: a v2 header sent a
/// byte at a time names the real client (the access log shows it), the access rules see
/// the real client of a v1 header, and a connection without a header is closed while the
/// single worker serves on.
fn request_level_proxy_headers_give_the_real_client(io: Io) {
    let dir = LogDir::new(&format!("proxy-{}", io.name()));
    let log = dir.log();
    let server = Server::start_io(
        "http_hello",
        io,
        &[
            "-l",
            "127.0.0.1:0?proxy",
            "-w",
            "1",
            "--deny",
            "198.51.100.0/24",
            "--access-log",
            &log,
        ],
    );
    let addr = server.tcp_addr();
    let mut s = connect_from("127.0.0.1", addr);
    s.set_nodelay(true).unwrap();
    for b in proxy_v2(
        "192.0.2.7:4321".parse().unwrap(),
        "127.0.0.1:7000".parse().unwrap(),
    ) {
        s.write_all(&[b]).unwrap();
    }
    assert_eq!(status(&mut s), 200);
    drop(s); // a blocking worker writes its access-log lines when the connection ends
    dir.wait_for_line(" 192.0.2.7:4321 ");

    let mut s = connect_from("127.0.0.1", addr);
    s.write_all(b"PROXY TCP4 198.51.100.1 127.0.0.1 5555 7000\r\n")
        .unwrap();
    assert_eq!(status(&mut s), 0, "the real client is denied");

    let mut s = connect_from("127.0.0.1", addr);
    assert_eq!(status(&mut s), 0, "no header: closed");

    let mut s = connect_from("127.0.0.1", addr);
    s.write_all(b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 7000\r\n")
        .unwrap();
    assert_eq!(status(&mut s), 200, "the single worker serves on");
    drop(s);
    dir.wait_for_line(" 203.0.113.9:5555 ");
}

both_io!(request_level_trickled_proxy_header_is_cut_at_the_header_timeout);
/// Issue 14's overall PROXY header deadline on a request-level server, in each I/O model.
fn request_level_trickled_proxy_header_is_cut_at_the_header_timeout(io: Io) {
    let server = Server::start_io(
        "http_hello",
        io,
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "1",
            "--proxy-protocol",
            "--header-timeout",
            "1",
        ],
    );
    let mut s = connect_from("127.0.0.1", server.tcp_addr());
    let header = b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 7000\r\n";
    let (cut, held) = trickle(&mut s, header, std::time::Duration::from_millis(200));
    assert!(
        cut,
        "the whole header went through in {held:?}: no overall deadline"
    );
    assert!(held < std::time::Duration::from_secs(6), "held for {held:?}");
    server.wait_for_log("its PROXY header was not complete within 1s (--header-timeout)");
    let mut s = connect_from("127.0.0.1", server.tcp_addr());
    s.write_all(header).unwrap();
    assert_eq!(status(&mut s), 200, "the single worker serves on");
}

both_io!(issue_41_a_proxy_v2_header_for_a_datagram_flow_is_refused);
/// Issue 41: a PROXY v2 header for a datagram flow (`DGRAM`, UDP) on a stream listener was
/// accepted and its source reported as the TCP client. It is refused as any bad header
/// is: the connection closed without an answer, a log line naming the reason, and the
/// single worker serves the next client, in each I/O model.
fn issue_41_a_proxy_v2_header_for_a_datagram_flow_is_refused(io: Io) {
    let server = Server::start_io("http_hello", io, &["-l", "127.0.0.1:0?proxy", "-w", "1"]);
    let addr = server.tcp_addr();
    let mut header = proxy_v2(
        "192.0.2.7:4321".parse().unwrap(),
        "127.0.0.1:7000".parse().unwrap(),
    );
    header[13] = 0x12; // AF_INET, DGRAM
    let mut s = connect_from("127.0.0.1", addr);
    s.write_all(&header).unwrap();
    assert_eq!(status(&mut s), 0, "a DGRAM header: closed");
    server.wait_for_log("DGRAM (a datagram flow) on a stream connection");

    let mut s = connect_from("127.0.0.1", addr);
    header[13] = 0x11; // AF_INET, STREAM
    s.write_all(&header).unwrap();
    assert_eq!(status(&mut s), 200, "the single worker serves on");
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![test(
        "rules_apply_to_ipv6_clients",
        &[Need::Ipv6Loopback],
        rules_apply_to_ipv6_clients,
    )]
}

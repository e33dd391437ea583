//! The request level: codecs driven by the framework's loop, through the `ping` (a codec of
//! its own, a subset of RESP) and `kv` (the built-in `Resp` codec) examples as real
//! processes.
//!
//! Regression tests for issue #4 ("Request handlers, protocol codecs").

mod util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use util::*;

fn ping(io: Io, args: &[&str]) -> Server {
    let mut all = vec!["-l", "127.0.0.1:0"];
    all.extend_from_slice(args);
    Server::start_io("ping", io, &all)
}

fn kv(io: Io, args: &[&str]) -> Server {
    let mut all = vec!["-l", "127.0.0.1:0"];
    all.extend_from_slice(args);
    Server::start_io("kv", io, &all)
}

fn connect(server: &Server) -> TcpStream {
    let s = TcpStream::connect(server.tcp_addr()).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s
}

/// Reads exactly `n` bytes.
fn read_n(s: &mut TcpStream, n: usize) -> String {
    let mut buf = vec![0; n];
    s.read_exact(&mut buf).unwrap();
    String::from_utf8(buf).unwrap()
}

fn read_to_end(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

both_io!(not_async("ping and kv have no async counterpart"): pipelined_requests_are_answered_in_order);
fn pipelined_requests_are_answered_in_order(io: Io) {
    let server = ping(io, &["-w", "2"]);
    let mut s = connect(&server);
    // Inline and RESP array forms, several in one write, the last one split.
    s.write_all(b"PING\r\n*1\r\n$4\r\nPING\r\nECHO x\r\n*1\r\n$4\r\nPI")
        .unwrap();
    s.write_all(b"NG\r\nQUIT\r\n").unwrap();
    let all = read_to_end(&mut s);
    assert_eq!(
        all, "+PONG\r\n+PONG\r\n-ERR unknown command\r\n+PONG\r\n+OK\r\n",
        "QUIT closes after +OK"
    );
}

both_io!(not_async("ping and kv have no async counterpart"): a_malformed_request_gets_an_error_and_the_worker_serves_the_next_client);
fn a_malformed_request_gets_an_error_and_the_worker_serves_the_next_client(io: Io) {
    let server = ping(io, &["-w", "1"]);
    let mut bad = connect(&server);
    bad.write_all(b"*1\r\n%4\r\nPING\r\n").unwrap();
    let reply = read_to_end(&mut bad);
    assert!(
        reply.starts_with("-ERR Protocol error: malformed request"),
        "{reply:?}"
    );
    server.wait_for_log("bad request from 127.0.0.1:");
    let mut next = connect(&server);
    next.write_all(b"PING\r\n").unwrap();
    assert_eq!(
        read_n(&mut next, 7),
        "+PONG\r\n",
        "the single worker survived and serves"
    );
    assert_eq!(server.worker_pids().len(), 1);
    assert!(!server.log_text().contains("exited"), "no worker was replaced");
}

both_io!(blocking_event: an_oversized_line_is_refused_with_the_codec_error);
fn an_oversized_line_is_refused_with_the_codec_error(io: Io) {
    let server = kv(io, &["-w", "1"]);
    let mut s = connect(&server);
    let long = vec![b'x'; 70 * 1024];
    let _ = s.write_all(&long); // the server may close before reading it all
    let reply = read_to_end(&mut s);
    assert_eq!(
        reply, "-ERR Protocol error: inline request too large (limit 65536 bytes)\r\n",
        "an inline command is limited to 64 KiB, as in Redis"
    );
}

both_io!(not_async("ping and kv have no async counterpart"): idle_connections_end_after_the_keepalive_timeout);
fn idle_connections_end_after_the_keepalive_timeout(io: Io) {
    let server = ping(io, &["-w", "2", "--keepalive-timeout", "0.3"]);
    let mut s = connect(&server);
    s.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut s, 7), "+PONG\r\n");
    let started = Instant::now();
    assert_eq!(read_to_end(&mut s), "", "closed without a reply");
    assert!(started.elapsed() < PATIENCE);
}

both_io!(not_async("ping and kv have no async counterpart"): a_request_that_stops_half_way_times_out_with_the_codec_error);
fn a_request_that_stops_half_way_times_out_with_the_codec_error(io: Io) {
    let server = ping(
        io,
        &["-w", "2", "--keepalive-timeout", "30", "--read-timeout", "0.3"],
    );
    let mut s = connect(&server);
    s.write_all(b"*1\r\n$4\r\nPI").unwrap();
    let reply = read_to_end(&mut s);
    assert!(
        reply.contains("timed out waiting for the rest of the request"),
        "{reply:?}"
    );
}

both_io!(not_async("ping and kv have no async counterpart"): an_idle_keepalive_connection_does_not_starve_waiting_clients);
fn an_idle_keepalive_connection_does_not_starve_waiting_clients(io: Io) {
    // One worker; a client that keeps its connection open but idle must not keep a second
    // client waiting for the keep-alive timeout. A blocking worker gives the idle
    // connection up to serve the second; an event worker holds both.
    let server = ping(io, &["-w", "1", "--keepalive-timeout", "60"]);
    let mut idle = connect(&server);
    idle.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut idle, 7), "+PONG\r\n");
    let started = Instant::now();
    let mut waiting = connect(&server);
    waiting.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut waiting, 7), "+PONG\r\n");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "served long before the keep-alive timeout"
    );
    match io {
        Io::Blocking => assert_eq!(read_to_end(&mut idle), "", "the idle connection was given up"),
        // Hybrid: the idle connection went back to the front, which keeps it.
        Io::Event | Io::Hybrid | Io::Async => {
            idle.write_all(b"PING\r\n").unwrap();
            assert_eq!(read_n(&mut idle, 7), "+PONG\r\n", "the idle connection is kept");
        }
    }
}

both_io!(not_async("ping and kv have no async counterpart"): a_new_connection_is_not_given_up_before_its_first_request);
fn a_new_connection_is_not_given_up_before_its_first_request(io: Io) {
    // One worker, held by a client that is slow to send its first request while another
    // client waits: the guard gives up idle keep-alive connections, never one that has not
    // had its first request answered (found under load, where clients are slow to send).
    let server = ping(io, &["-w", "1", "--keepalive-timeout", "30"]);
    let mut slow = connect(&server);
    let mut waiting = connect(&server); // queued behind `slow` (accepted first, FIFO)
    waiting.write_all(b"PING\r\n").unwrap();
    // The stimulus, not synchronisation: a client slower than the 1 s grace.
    std::thread::sleep(Duration::from_millis(1500));
    slow.write_all(b"PING\r\n").unwrap();
    assert_eq!(
        read_n(&mut slow, 7),
        "+PONG\r\n",
        "the slow client's first request is answered"
    );
    // Now `slow` is an idle keep-alive connection: given up, so `waiting` is served.
    assert_eq!(read_n(&mut waiting, 7), "+PONG\r\n");
}

both_io!(not_async("ping and kv have no async counterpart"): stop_keeps_connections_of_protocols_that_cannot_announce_a_close);
fn stop_keeps_connections_of_protocols_that_cannot_announce_a_close(io: Io) {
    // A Redis client takes a closed connection for a failure: on stop, its connection is
    // served until the client leaves (within the grace period), then the master exits.
    let mut server = ping(io, &["-w", "2", "--keepalive-timeout", "60"]);
    let mut s = connect(&server);
    s.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut s, 7), "+PONG\r\n");
    server.signal(libc::SIGTERM);
    server.wait_for_log("SIGTERM received");
    s.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut s, 7), "+PONG\r\n", "still served while stopping");
    s.write_all(b"QUIT\r\n").unwrap();
    assert_eq!(read_to_end(&mut s), "+OK\r\n");
    assert!(server.wait_exit().success());
    assert!(
        !server.log_text().contains("grace period"),
        "no need to wait for the grace period"
    );
}

both_io!(blocking_event: kv_keeps_state_per_worker);
fn kv_keeps_state_per_worker(io: Io) {
    let server = kv(io, &["-w", "1"]);
    let mut a = LineClient::tcp(server.tcp_addr());
    assert_eq!(a.redis("SET colour blue"), "OK");
    assert_eq!(a.redis("GET colour"), "\"blue\"");
    drop(a);
    let mut b = LineClient::tcp(server.tcp_addr());
    assert_eq!(b.redis("GET colour"), "\"blue\"", "one worker, one map");
    assert_eq!(b.redis("DEL colour"), "(integer) 1");
    assert_eq!(b.redis("GET colour"), "(nil)");
    assert_eq!(b.redis("QUIT"), "OK");
    assert_eq!(b.rest().unwrap(), "");
}

both_io!(blocking_event: issue_15_a_session_lasts_one_connection);
/// Issue 15: a request handler's session lives as long as its connection. The database
/// `SELECT` chose is the connection's (a new connection starts in 0 again, on the same
/// worker), while the map is the worker's (the value is there when database 1 is chosen
/// again).
fn issue_15_a_session_lasts_one_connection(io: Io) {
    let server = kv(io, &["-w", "1"]);
    let mut a = LineClient::tcp(server.tcp_addr());
    assert_eq!(a.redis("SELECT 1"), "OK");
    assert_eq!(a.redis("SET colour blue"), "OK");
    assert_eq!(a.redis("GET colour"), "\"blue\"");
    assert_eq!(a.redis("SELECT 99"), "(error) ERR DB index is out of range");
    assert_eq!(
        a.redis("GET colour"),
        "\"blue\"",
        "a refused SELECT keeps the database"
    );
    assert_eq!(a.redis("QUIT"), "OK");
    drop(a);
    let mut b = LineClient::tcp(server.tcp_addr());
    assert_eq!(
        b.redis("GET colour"),
        "(nil)",
        "a new connection starts in database 0"
    );
    assert_eq!(b.redis("SELECT 1"), "OK");
    assert_eq!(b.redis("GET colour"), "\"blue\"", "one worker, one map");
}

fn ping_answers_redis_benchmark_without_errors(io: Io) {
    let server = ping(io, &["-w", "4"]);
    let port = server.tcp_addr().port().to_string();
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "ping_inline,ping_mbulk",
            "-n",
            "4000",
            "-c",
            "4",
            "-q",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("Error"), "{stderr}");
    assert!(
        stdout.contains("PING_INLINE:") && stdout.contains("PING_MBULK:"),
        "{stdout}"
    );
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::Need;
    util::needs::each_io(
        "ping_answers_redis_benchmark_without_errors",
        &[Need::Program("redis-benchmark", "redis-tools")],
        ping_answers_redis_benchmark_without_errors,
    )
}

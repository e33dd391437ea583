//! Issue 42, one connection API: what `Client`, `AsyncClient` and `Conn` offer alike.
//! `--min-send-rate` holds on async connections (the request level's output and the
//! client level's writes), `AsyncClient::penalize` charges the address as
//! `Client::penalize` does, and a connection's id names its worker.

mod util;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use util::*;

/// A client with a small receive window and a network's segments (as `deadlines.rs`'
/// `slow_download`: the server's writes soon wait for it, and what it acknowledges moves in
/// small steps), that has sent `request` and reads nothing yet.
fn slow_reader(addr: SocketAddr, request: &[u8]) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.set_tcp_mss(1448).unwrap();
    s.connect(&addr.into()).unwrap();
    let mut s = TcpStream::from(s);
    s.write_all(request).unwrap();
    s
}

/// `GET /` on a new connection: the status line.
fn hello(addr: SocketAddr) -> String {
    get_once(addr, "/", PATIENCE)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A reader that takes nothing of a 32 MiB answer to `request` is cut below the default
/// `--min-send-rate` (500 bytes/s) after a window of about 10 s, long before the write
/// timeout (60 s by default, whose own cut says `--write-timeout`), while the only worker
/// serves `also` beside it.
fn a_reader_below_the_rate_is_cut(server: &Server, request: &[u8], also: impl FnOnce()) {
    let started = Instant::now();
    let _reader = slow_reader(server.tcp_addr(), request);
    also();
    let line = server.wait_for_log("below --min-send-rate 500 bytes/s: cut off");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(5),
        "cut after {waited:?}: too early: {line}"
    );
    assert!(
        !server.log_text().contains("--write-timeout"),
        "cut by the write timeout, not the rate:\n{}",
        server.log_text()
    );
    assert_eq!(
        hello(server.tcp_addr()),
        "HTTP/1.1 200 OK",
        "the worker serves on"
    );
}

/// Issue 42: the async driver's writes ignored `--min-send-rate`: a reader that took
/// nothing of a large response held its connection (and the response's buffer) until the
/// write timeout. Now it is cut as in blocking and event mode (`deadlines.rs`, issue 14).
#[test]
fn issue_42_async_min_send_rate_cuts_a_slow_reader_of_a_response() {
    let server = Server::start("asyncbed", &["-l", "127.0.0.1:0", "-w", "1"]);
    let addr = server.tcp_addr();
    a_reader_below_the_rate_is_cut(&server, b"GET /big?kb=32768 HTTP/1.1\r\nHost: t\r\n\r\n", || {
        assert_eq!(hello(addr), "HTTP/1.1 200 OK", "served beside the slow reader");
    });
}

/// Issue 42: the same for a client-level handler's writes (`AsyncClient`'s `poll_write`).
#[test]
fn issue_42_async_min_send_rate_cuts_a_slow_reader_of_a_client_level_handler() {
    let server = Server::start("asyncbed", &["-l", "127.0.0.1:0", "-w", "1", "--client"]);
    let addr = server.tcp_addr();
    let started = Instant::now();
    let _reader = slow_reader(addr, b"big 32768\n");
    // Served beside it.
    let mut other = LineClient::tcp(addr);
    assert!(other.line().starts_with("pid "));
    assert_eq!(other.ask("hello"), "hello");
    let line = server.wait_for_log("below --min-send-rate 500 bytes/s: cut off");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(5),
        "cut after {waited:?}: too early: {line}"
    );
    assert_eq!(other.ask("still"), "still", "the worker serves on");
}

/// Issue 42: a download at a healthy rate from an async worker is never cut, however long
/// its writes wait on the client (about 40 kB/s, 80 times the minimum, for over a window).
#[test]
fn issue_42_async_a_healthy_slow_download_is_not_cut() {
    let server = Server::start("asyncbed", &["-l", "127.0.0.1:0", "-w", "1"]);
    let mut reader = slow_reader(server.tcp_addr(), b"GET /big?kb=8192 HTTP/1.1\r\nHost: t\r\n\r\n");
    reader.set_read_timeout(Some(PATIENCE)).unwrap();
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

/// The first line the server sends a client connecting from `from`, or None if it closed
/// the connection without one.
fn first_line(addr: SocketAddr, from: &str) -> Option<String> {
    let mut line = String::new();
    let _ = BufReader::new(connect_from(from, addr)).read_line(&mut line);
    (!line.is_empty()).then_some(line)
}

/// Issue 42: `AsyncClient` had no `penalize`, so an async SMTP or IMAP server could not
/// charge a failed login. Now it charges the address as `Client::penalize` does (issue 31's
/// test in `access.rs`): the session's reads end, and the address's next connections are
/// refused by either worker, while another address is served.
#[test]
fn issue_42_async_client_penalize_charges_the_address() {
    let server = Server::start("asyncbed", &["-l", "127.0.0.1:0", "-w", "2", "--client"]);
    let addr = server.tcp_addr();
    let mut s = connect_from("127.0.0.1", addr);
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(b"penalize\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out)
        .expect("the session ends after the penalty");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out:?}");
    assert!(lines[0].starts_with("pid "), "{out:?}");
    assert_eq!(lines[1], "penalized 1000", "the first failure: 1 s");
    for _ in 0..4 {
        assert_eq!(first_line(addr, "127.0.0.1"), None, "{}", server.log_text());
    }
    assert!(first_line(addr, "127.0.0.2").is_some_and(|g| g.starts_with("pid ")));
    server.wait_for_log("refusing connections from 127.0.0.1 for 1s: 1 failed authentication(s)");
    let served = wait_until(|| first_line(addr, "127.0.0.1"));
    assert!(served.is_some_and(|g| g.starts_with("pid ")));
}

/// An id as the servers write it (`wSLOT.gGEN.pPID.cN`): its parts.
fn parse_id(id: &str) -> (u32, u32, i32, u64) {
    let parts: Vec<&str> = id.trim().split('.').collect();
    assert_eq!(parts.len(), 4, "{id:?}");
    let num = |i: usize, prefix: &str| -> u64 {
        parts[i]
            .strip_prefix(prefix)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{id:?}: part {i} is not {prefix}N"))
    };
    (
        num(0, "w") as u32,
        num(1, "g") as u32,
        num(2, "p") as i32,
        num(3, "c"),
    )
}

/// New connections to a 2-worker `server`, each asking its id with `ask`, until both
/// workers answered (kernel balancing decides which): the ids seen, by worker slot.
fn ids_of_two_workers(server: &Server, mut ask: impl FnMut() -> String) -> HashMap<u32, Vec<String>> {
    let workers = server.wait_for_workers(2);
    let mut seen: HashMap<u32, Vec<String>> = HashMap::new();
    let both = wait_until(|| {
        let id = ask();
        let (slot, generation, pid, _) = parse_id(&id);
        assert!(slot == 1 || slot == 2, "{id}: a slot of a 2-worker pool");
        assert_eq!(generation, 0, "{id}: no reload yet");
        assert!(workers.contains(&pid), "{id}: the pid of a worker ({workers:?})");
        seen.entry(slot).or_default().push(id);
        (seen.len() == 2).then_some(())
    });
    assert!(both.is_some(), "only one worker answered: {seen:?}");
    let all: Vec<&String> = seen.values().flatten().collect();
    let distinct: std::collections::HashSet<&&String> = all.iter().collect();
    assert_eq!(distinct.len(), all.len(), "an id given twice: {all:?}");
    // The same slot means the same worker (and pid) here.
    for (slot, ids) in &seen {
        let pids: std::collections::HashSet<i32> = ids.iter().map(|i| parse_id(i).2).collect();
        assert_eq!(pids.len(), 1, "slot {slot}: {ids:?}");
    }
    seen
}

/// Issue 42: `id()` was "the connection's number in this worker process" (1, 2, ... in
/// every worker), so nothing could name a connection across the pool; `Client` had none.
/// Now ids of two workers differ, and show the worker's slot, generation and pid: the
/// blocking client level (`Client::id`), the async client level (`AsyncClient::id`) and
/// the async request level (`Conn::id`).
#[test]
fn issue_42_ids_from_two_workers_differ_and_show_the_worker() {
    let blocking = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "2"]);
    ids_of_two_workers(&blocking, || {
        let mut c = LineClient::tcp(blocking.tcp_addr());
        let _pid = c.line();
        c.ask("id").strip_prefix("id ").expect("id ID").to_owned()
    });
    let clients = Server::start("asyncbed", &["-l", "127.0.0.1:0", "-w", "2", "--client"]);
    ids_of_two_workers(&clients, || {
        let mut c = LineClient::tcp(clients.tcp_addr());
        let _pid = c.line();
        c.ask("id").strip_prefix("id ").expect("id ID").to_owned()
    });
    let requests = Server::start("asyncbed", &["-l", "127.0.0.1:0", "-w", "2"]);
    let seen = ids_of_two_workers(&requests, || {
        let answer = get_once(requests.tcp_addr(), "/id", PATIENCE);
        answer.lines().last().unwrap_or_default().to_owned()
    });
    // A worker's connections are numbered from 1 in each: the numbers alone collide,
    // the ids do not.
    assert!(seen.values().all(|ids| ids.iter().any(|i| parse_id(i).3 >= 1)));
}

/// Issue 42: `Client` had no `stopping()`; it says false while the worker serves.
#[test]
fn issue_42_client_stopping_is_false_while_serving() {
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "1"]);
    let mut c = LineClient::tcp(server.tcp_addr());
    assert!(c.line().starts_with("pid "));
    assert_eq!(c.ask("stopping"), "stopping false");
}

/// Issue 42: `AsyncClient` had no `privileged`, and a server with a helper could not run
/// an async handler. Now the call is awaited (`Helper::call_async`): while the helper works
/// for one connection (3 s), the worker's only thread serves another at once, and the
/// answer then comes from the helper's process, not the worker's.
fn issue_42_async_privileged_call_is_awaited_without_blocking_the_worker() {
    let server = Server::start(
        "asyncbed",
        &["-l", "127.0.0.1:0", "-w", "1", "--client", "--helper"],
    );
    let addr = server.tcp_addr();
    let mut calling = LineClient::tcp(addr);
    let worker = calling.line();
    let worker: u32 = worker.strip_prefix("pid ").expect("pid PID").parse().unwrap();
    let asked = Instant::now();
    calling.send("helper 3000");
    let mut other = LineClient::tcp(addr);
    assert!(other.line().starts_with("pid "));
    assert_eq!(other.ask("meanwhile"), "meanwhile");
    let served_in = asked.elapsed();
    assert!(
        served_in < Duration::from_millis(3000),
        "the other connection waited {served_in:?}: the call blocked the worker"
    );
    let answer = calling.line();
    assert!(
        asked.elapsed() >= Duration::from_millis(3000),
        "{answer}: before the helper slept"
    );
    let helper: u32 = answer
        .strip_prefix("helper pid ")
        .unwrap_or_else(|| panic!("{answer:?}\n{}", server.log_text()))
        .parse()
        .unwrap();
    assert_ne!(helper, worker, "answered by the helper's process");
    // Calls take turns and each gets its own answer.
    assert!(calling.ask("helper 0").starts_with("helper pid "));
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![test(
        "issue_42_async_privileged_call_is_awaited_without_blocking_the_worker",
        &[Need::Root],
        issue_42_async_privileged_call_is_awaited_without_blocking_the_worker,
    )]
}

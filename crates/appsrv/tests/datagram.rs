//! Datagram listeners (issue 19, the framework side), through the `udp_echo` example as a
//! real process: answers over UDP and Unix datagram sockets from the address asked, what
//! applies to each datagram (allow/deny, the size limit, the per-source answer rate, the
//! access log's sampling), recycling, reload and upgrade under load, socket activation,
//! and the configuration errors of a listener the server cannot serve.
//!
//! The clients here send from loopback addresses of their own choosing (127.0.0.2 plays a
//! second host: all of 127/8 is local) and read the answers with `recv_from`, so that a
//! test sees where an answer came from, as a real client checks it.

mod util;

use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use util::*;

/// How long a client under load waits for each answer before it counts the datagram as
/// lost (no retry), as a DNS resolver gives up on a server.
const LOAD_TIMEOUT: Duration = Duration::from_secs(2);

/// How many clients load the server in the reload and upgrade tests.
const LOAD_CLIENTS: usize = 8;

/// A private directory for one test's control socket, pid file, access log and Unix
/// sockets, removed on drop. Mode 0755: the workers run as `nobody` when the tests run as
/// root, and must reach a client's Unix socket in it to answer.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("appsrv-dgram-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        Dir(d)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }

    fn ctl(&self) -> String {
        self.path("ctl.sock")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs the binary at `path` with `args` (a control command: it exits by itself).
fn run(path: &Path, args: &[&str]) -> Output {
    Command::new(path)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run a control command")
}

/// `udp_echo ARGS --control CTL`.
fn ctl(ctl: &str, args: &[&str]) -> Output {
    let mut all = args.to_vec();
    all.extend(["--control", ctl]);
    run(&example("udp_echo"), &all)
}

/// The stdout of a command that must succeed.
fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{:?}; stdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `status --json` through control socket `sock`.
fn status(sock: &str) -> Value {
    let out = ok(ctl(sock, &["status", "--json"]));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Counter `name` of the status's `totals.datagrams`.
fn datagrams(status: &Value, name: &str) -> u64 {
    status["totals"]["datagrams"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no totals.datagrams.{name} in {status:#}"))
}

/// Polls `status --json` until `f` accepts it (the workers publish their counters at the
/// end of each turn of their loop, after the answers are sent).
fn wait_for_status(sock: &str, what: &str, mut f: impl FnMut(&Value) -> bool) -> Value {
    let mut last = None;
    let found = wait_until(|| {
        let s = status(sock);
        let done = f(&s);
        last = Some(format!("{s:#}"));
        done.then_some(s)
    });
    found.unwrap_or_else(|| panic!("never {what}; last status:\n{}", last.unwrap_or_default()))
}

/// The value of the sample `series` (name and labels, as written) in a metrics text.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

/// A UDP client bound at `ip` (port 0), reading with a timeout of [`PATIENCE`].
fn client(ip: &str) -> UdpSocket {
    let c = UdpSocket::bind((ip, 0)).unwrap_or_else(|e| panic!("bind a client at {ip}: {e}"));
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    c
}

/// Sends `payload` to `to` from `c` and returns the next datagram `c` receives (as text:
/// the tests send text) and its source.
fn ask(c: &UdpSocket, to: SocketAddr, payload: &str) -> (String, SocketAddr) {
    c.send_to(payload.as_bytes(), to).unwrap();
    receive(c)
}

/// The next datagram `c` receives (within [`PATIENCE`]), as text, and its source.
fn receive(c: &UdpSocket) -> (String, SocketAddr) {
    let mut buf = vec![0; 65536];
    let (n, from) = c
        .recv_from(&mut buf)
        .unwrap_or_else(|e| panic!("no answer on {}: {e}", c.local_addr().unwrap()));
    (text(&buf[..n]), from)
}

/// The datagrams already queued on `c`, without waiting. Loopback delivery is
/// synchronous: an answer the server sent is queued here once its `sendmmsg` returned.
fn queued(c: &UdpSocket) -> Vec<String> {
    c.set_nonblocking(true).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0; 65536];
    loop {
        match c.recv(&mut buf) {
            Ok(n) => out.push(text(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("recv: {e}"),
        }
    }
    c.set_nonblocking(false).unwrap();
    out
}

/// Sends `payload` to `to` once and waits up to `timeout` for its echo from `to`
/// (skipping a late echo of an earlier datagram).
fn ask_within(c: &UdpSocket, to: SocketAddr, payload: &[u8], timeout: Duration) -> Result<(), String> {
    c.send_to(payload, to).map_err(|e| format!("send: {e}"))?;
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0; 2048];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no answer within {timeout:?}"));
        }
        c.set_read_timeout(Some(left)).unwrap();
        match c.recv_from(&mut buf) {
            Ok((n, from)) if from == to && &buf[..n] == payload => return Ok(()),
            Ok(_) => {} // a late answer to an earlier datagram
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(format!("recv: {e}")),
        }
    }
}

/// Sets a flag when dropped: stops a load thread also when the test fails under it.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs `during` while [`LOAD_CLIENTS`] clients send datagrams to `to`, each one at a
/// time, waiting [`LOAD_TIMEOUT`] for its answer, never retrying; returns how many were
/// answered and the lost ones. Several clients, so that the socket often holds datagrams
/// when a worker stops: a stopping worker that dropped what it had read would lose some.
fn under_udp_load(to: SocketAddr, during: impl FnOnce()) -> (u64, Vec<String>) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let clients: Vec<_> = (0..LOAD_CLIENTS)
            .map(|k| {
                let stop = &stop;
                s.spawn(move || {
                    let c = client("127.0.0.1");
                    let (mut answered, mut lost) = (0, Vec::new());
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        match ask_within(
                            &c,
                            to,
                            format!("client {k} datagram {n}").as_bytes(),
                            LOAD_TIMEOUT,
                        ) {
                            Ok(()) => answered += 1,
                            Err(e) => lost.push(format!("client {k} datagram {n}: {e}")),
                        }
                    }
                    (answered, lost)
                })
            })
            .collect();
        let stopper = StopOnDrop(&stop);
        during();
        drop(stopper);
        clients
            .into_iter()
            .map(|c| c.join().unwrap())
            .fold((0, Vec::new()), |(a, mut l), (ca, cl)| {
                l.extend(cl);
                (a + ca, l)
            })
    })
}

/// Starts `udp_echo` with `args` and waits for its `workers` workers.
fn echo(workers: usize, args: &[&str]) -> Server {
    let w = workers.to_string();
    let mut all = vec!["-w", w.as_str()];
    all.extend_from_slice(args);
    let server = Server::start("udp_echo", &all);
    server.wait_for_workers(workers);
    server
}

#[test]
fn issue_19_udp_echo_answers_over_udp_and_unixgram_from_the_listeners_address() {
    let dir = Dir::new("answers");
    let unix_path = dir.path("echo.dgram");
    let unix_listener = format!("unixgram:{unix_path}");
    // IPv6 only if this machine has ::1 (a container may have no IPv6 at all).
    let v6 = UdpSocket::bind("[::1]:0").is_ok();
    let mut args = vec!["-l", "udp://127.0.0.1:0", "-l", unix_listener.as_str()];
    if v6 {
        args.extend(["-l", "udp://[::1]:0"]);
    } else {
        eprintln!("note: no ::1 on this machine; the IPv6 part of this test is skipped");
    }
    let server = echo(2, &args);
    assert!(
        server.listening().contains(&unix_listener),
        "{:?}",
        server.listening()
    );

    let v4 = server.udp_addrs().into_iter().find(SocketAddr::is_ipv4).unwrap();
    let c = client("127.0.0.1");
    assert_eq!(ask(&c, v4, "hello over IPv4"), ("hello over IPv4".to_owned(), v4));

    if v6 {
        let addr = server.udp_addrs().into_iter().find(SocketAddr::is_ipv6).unwrap();
        let c = client("::1");
        assert_eq!(
            ask(&c, addr, "hello over IPv6"),
            ("hello over IPv6".to_owned(), addr)
        );
    }

    // A Unix datagram client must bind a path of its own to be answered. The workers run
    // as nobody under a root test run: the client's socket must be writable by them, as
    // a real client's must be by the server's user.
    let client_path = dir.path("client.dgram");
    let u = UnixDatagram::bind(&client_path).unwrap();
    std::fs::set_permissions(&client_path, std::fs::Permissions::from_mode(0o666)).unwrap();
    u.set_read_timeout(Some(PATIENCE)).unwrap();
    u.send_to(b"hello over unixgram", &unix_path).unwrap();
    let mut buf = [0; 64];
    let (n, from) = u.recv_from(&mut buf).expect("an answer over unixgram");
    assert_eq!(&buf[..n], b"hello over unixgram");
    assert_eq!(
        from.as_pathname(),
        Some(Path::new(&unix_path)),
        "from the listener's path"
    );
}

/// Without `IP_PKTINFO` on a wildcard socket the answer leaves from the route's preferred
/// source (127.0.0.1 here), and a client that asked 127.0.0.2 drops it.
#[test]
fn issue_19_descriptors_sent_over_unixgram_are_not_kept_by_the_worker() {
    // A Unix datagram sender may attach descriptors (SCM_RIGHTS): the worker takes no
    // control messages on such a socket, so the kernel closes them; had it taken them, 20
    // datagrams would leave up to 200 descriptors open in the worker.
    use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};
    use std::os::fd::AsRawFd;
    let dir = Dir::new("scm-rights");
    let unix_path = dir.path("echo.dgram");
    let server = echo(1, &["-l", &format!("unixgram:{unix_path}")]);
    let worker = *server.wait_for_workers(1).iter().next().unwrap();
    let client_path = dir.path("client.dgram");
    let u = UnixDatagram::bind(&client_path).unwrap();
    std::fs::set_permissions(&client_path, std::fs::Permissions::from_mode(0o666)).unwrap();
    u.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0; 64];
    u.send_to(b"warm", &unix_path).unwrap();
    u.recv_from(&mut buf).expect("an answer");
    let before = util::open_fds(worker).len();
    let files: Vec<std::fs::File> = (0..10)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    let fds: Vec<i32> = files.iter().map(AsRawFd::as_raw_fd).collect();
    let to = UnixAddr::new(unix_path.as_str()).unwrap();
    for _ in 0..20 {
        let iov = [std::io::IoSlice::new(b"with descriptors")];
        sendmsg(
            u.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            Some(&to),
        )
        .unwrap();
        let (n, _) = u.recv_from(&mut buf).expect("an answer");
        assert_eq!(&buf[..n], b"with descriptors");
    }
    let after = util::open_fds(worker).len();
    assert_eq!(
        after, before,
        "the worker's descriptors: {before} before, {after} after"
    );
}

#[test]
fn issue_19_a_wildcard_listener_answers_from_the_address_asked() {
    let server = echo(1, &["-l", "udp://0.0.0.0:0"]);
    let port = server.udp_addr().port();
    let c = client("127.0.0.1");
    for asked in ["127.0.0.2", "127.0.0.1"] {
        let to: SocketAddr = format!("{asked}:{port}").parse().unwrap();
        let (answer, from) = ask(&c, to, asked);
        assert_eq!(answer, asked);
        assert_eq!(from, to, "the answer comes from the address asked");
    }
}

/// Sends five datagrams from 127.0.0.1 (denied) to the only worker's socket, then one from
/// 127.0.0.2 (allowed): once that one is answered, the five before it on the same socket
/// were handled, and any answer to them would be queued at their client already.
#[test]
fn issue_19_datagrams_are_served_under_the_sandbox() {
    // Landlock and the default seccomp profile: recvmmsg, sendmmsg and the packet-info
    // control messages are allowed; a worker that was refused one would be killed.
    let server = echo(2, &["-l", "udp://0.0.0.0:0", "--sandbox"]);
    let port = server.udp_addr().port();
    let c = client("127.0.0.1");
    let workers = server.wait_for_workers(2);
    for i in 0..20 {
        let to: SocketAddr = format!("127.0.0.2:{port}").parse().unwrap();
        let (answer, from) = ask(&c, to, &format!("q{i}"));
        assert_eq!(answer, format!("q{i}"));
        assert_eq!(from, to);
    }
    assert_eq!(
        server.worker_pids(),
        workers,
        "no worker was killed by the sandbox"
    );
}

fn five_denied_then_one_allowed(server: &Server, ctl: &str) {
    let addr = server.udp_addr();
    let denied = client("127.0.0.1");
    let allowed = client("127.0.0.2");
    for i in 0..5 {
        denied.send_to(format!("denied {i}").as_bytes(), addr).unwrap();
    }
    assert_eq!(ask(&allowed, addr, "allowed"), ("allowed".to_owned(), addr));
    assert_eq!(
        queued(&denied),
        Vec::<String>::new(),
        "a denied source is never answered"
    );
    let s = wait_for_status(ctl, "5 denied", |s| datagrams(s, "denied") == 5);
    assert_eq!(datagrams(&s, "received"), 6, "{s:#}");
    assert_eq!(datagrams(&s, "sent"), 1, "{s:#}");
    let metrics = ok(self::ctl(ctl, &["metrics"]));
    assert_eq!(
        sample(&metrics, "appsrv_datagrams_dropped_total{reason=\"denied\"}"),
        5.0
    );
}

#[test]
fn issue_19_denied_datagrams_are_dropped_unanswered_and_counted() {
    let dir = Dir::new("deny");
    let ctl = dir.ctl();
    // --deny for every listener.
    let server = echo(
        1,
        &[
            "-l",
            "udp://127.0.0.1:0",
            "--deny",
            "127.0.0.1/32",
            "--control",
            &ctl,
        ],
    );
    five_denied_then_one_allowed(&server, &ctl);
    drop(server);
    // deny= on the listener.
    let ctl = dir.path("ctl-listener.sock");
    let server = echo(
        1,
        &["-l", "udp://127.0.0.1:0?deny=127.0.0.1/32", "--control", &ctl],
    );
    five_denied_then_one_allowed(&server, &ctl);
}

#[test]
fn issue_19_a_datagram_over_max_datagram_size_is_dropped_and_the_worker_survives() {
    let dir = Dir::new("size");
    let ctl = dir.ctl();
    let server = echo(
        1,
        &[
            "-l",
            "udp://127.0.0.1:0",
            "--max-datagram-size",
            "100",
            "--control",
            &ctl,
        ],
    );
    let worker = server.worker_pids();
    let addr = server.udp_addr();
    let c = client("127.0.0.1");
    let (long, short, limit) = ("x".repeat(200), "y".repeat(50), "z".repeat(100));
    c.send_to(long.as_bytes(), addr).unwrap();
    // The same socket and worker, in order: the answer to the long one would come first.
    assert_eq!(ask(&c, addr, &short).0, short);
    assert_eq!(ask(&c, addr, &limit).0, limit, "the limit itself is accepted");
    assert_eq!(queued(&c), Vec::<String>::new());
    let s = wait_for_status(&ctl, "1 too large", |s| datagrams(s, "too_large") == 1);
    assert_eq!(datagrams(&s, "sent"), 2, "{s:#}");
    assert_eq!(server.worker_pids(), worker, "the same worker answered");
    let metrics = ok(self::ctl(&ctl, &["metrics"]));
    assert_eq!(
        sample(&metrics, "appsrv_datagrams_dropped_total{reason=\"too_large\"}"),
        1.0
    );
}

#[test]
fn issue_19_the_answer_rate_limit_holds_a_flood_while_another_source_is_answered() {
    const LIMIT: u64 = 20;
    // Below what the server's socket queues (256 small datagrams at the default
    // rmem_default of 208 KiB, measured on the development machine), so that the kernel drops none even if both workers are
    // descheduled for the whole flood: every datagram reaches the server's rate limit.
    const FLOOD: u64 = 200;
    const OTHER: u64 = 10;
    let dir = Dir::new("rate");
    let ctl = dir.ctl();
    let server = echo(
        2,
        &[
            "-l",
            "udp://127.0.0.1:0",
            "--max-answers-per-ip",
            "20",
            "--control",
            &ctl,
        ],
    );
    let addr = server.udp_addr();
    let flood = client("127.0.0.1");
    // Another /24: the limit counts a source's /24 by default (issue 31).
    let other = client("127.0.1.2");
    let started = Instant::now();
    let other_answers = std::thread::scope(|s| {
        let other = s.spawn(|| {
            for i in 0..OTHER {
                other.send_to(format!("other {i}").as_bytes(), addr).unwrap();
            }
            (0..OTHER).map(|_| receive(&other)).collect::<Vec<_>>()
        });
        for i in 0..FLOOD {
            flood.send_to(format!("flood {i}").as_bytes(), addr).unwrap();
        }
        other.join().unwrap()
    });
    assert!(
        other_answers.iter().all(|(_, from)| *from == addr),
        "{other_answers:?}"
    );
    // Every datagram handled: the answers are in their clients' queues.
    let s = wait_for_status(&ctl, "every datagram received", |s| {
        datagrams(s, "received") == FLOOD + OTHER
    });
    let span = started.elapsed();
    let answered = queued(&flood).len() as u64;
    // The limit counts answers per second of the server's clock: the datagrams were
    // handled within `span`, which overlaps at most whole_seconds + 2 of its seconds.
    let bound = LIMIT * (span.as_secs() + 2);
    eprintln!("{answered} of {FLOOD} flood datagrams answered within {span:?} (bound {bound})");
    assert!(
        (1..=bound).contains(&answered),
        "{answered} of {FLOOD} flood datagrams answered within {span:?}; at most {bound} allowed"
    );
    assert_eq!(datagrams(&s, "rate_limited"), FLOOD - answered, "{s:#}");
    assert_eq!(datagrams(&s, "sent"), answered + OTHER, "{s:#}");
}

/// Sends one datagram from each of `sources` (each a client at its own address), then
/// `others` datagrams from `other`, one at a time, each answered; waits until the server
/// has received them all and returns the sources' answers, the time since the first
/// datagram, and the final status.
fn one_datagram_from_each(
    ctl: &str,
    addr: SocketAddr,
    sources: &[UdpSocket],
    other: &UdpSocket,
    others: u64,
) -> (u64, Duration, Value) {
    let started = Instant::now();
    for (i, c) in sources.iter().enumerate() {
        c.send_to(format!("source {i}").as_bytes(), addr).unwrap();
    }
    for i in 0..others {
        let q = format!("other {i}");
        assert_eq!(ask(other, addr, &q), (q, addr), "the other /24 is answered");
    }
    let all = sources.len() as u64 + others;
    let s = wait_for_status(ctl, "every datagram received", |s| {
        datagrams(s, "received") == all
    });
    let span = started.elapsed();
    let answered = sources.iter().map(|c| queued(c).len() as u64).sum();
    (answered, span, s)
}

/// Issue 31: the answer rate counts a source's network, an IPv4 /24 by default, as BIND
/// and NSD do: one datagram from each of 200 addresses of 127.0.0.0/24 gets the answers of
/// one source (before, each address had a budget of its own and all 200 were answered: a
/// reflection through a whole /24 multiplied the limit by its 254 hosts), while a client
/// in 127.0.1.0/24 gets its own. With `--answers-ipv4-prefix 32` (here from its
/// environment variable) each address is alone again, and the same 200 are all answered.
#[test]
fn issue_31_the_addresses_of_one_24_share_one_answer_budget() {
    const LIMIT: u64 = 20;
    // 127.0.0.2 to 127.0.0.201: below what the server's socket queues (see the test
    // above), so that every datagram reaches the rate limit.
    const SOURCES: u64 = 200;
    const OTHER: u64 = 10;
    let dir = Dir::new("prefix");
    let (ctl, ctl2) = (dir.ctl(), dir.path("ctl2.sock"));
    let args = |ctl: &str| {
        [
            "-w",
            "2",
            "-l",
            "udp://127.0.0.1:0",
            "--max-answers-per-ip",
            "20",
            "--answers-slip",
            "0",
            "--control",
            ctl,
        ]
        .map(str::to_owned)
    };
    let sources: Vec<UdpSocket> = (2..2 + SOURCES)
        .map(|i| client(&format!("127.0.0.{i}")))
        .collect();
    let other = client("127.0.1.2");

    let server = Server::start("udp_echo", &args(&ctl).each_ref().map(String::as_str));
    server.wait_for_workers(2);
    let addr = server.udp_addr();
    let (answered, span, s) = one_datagram_from_each(&ctl, addr, &sources, &other, OTHER);
    // The limit counts answers per second of the server's clock: the datagrams were
    // handled within `span`, which overlaps at most whole_seconds + 2 of its seconds.
    let bound = LIMIT * (span.as_secs() + 2);
    eprintln!("{answered} of {SOURCES} sources in one /24 answered within {span:?} (bound {bound})");
    assert!(
        (1..=bound).contains(&answered),
        "{answered} of {SOURCES} sources of one /24 answered within {span:?}; at most {bound} allowed"
    );
    assert_eq!(datagrams(&s, "rate_limited"), SOURCES - answered, "{s:#}");
    assert_eq!(datagrams(&s, "sent"), answered + OTHER, "{s:#}");
    drop(server);

    // Each address alone: none of them goes over.
    let server = Server::start_with_env(
        "udp_echo",
        &args(&ctl2).each_ref().map(String::as_str),
        &[("UDP_ECHO_ANSWERS_IPV4_PREFIX", "32")],
    );
    server.wait_for_workers(2);
    let addr = server.udp_addr();
    let (answered, _, s) = one_datagram_from_each(&ctl2, addr, &sources, &other, OTHER);
    assert_eq!(answered, SOURCES, "{s:#}");
    assert_eq!(datagrams(&s, "rate_limited"), 0, "{s:#}");
}

/// Issue 31: the prefix lengths are checked before anything starts (IPv4 1 to 32, IPv6 1
/// to 128), from the command line and from the environment.
#[test]
fn issue_31_a_bad_answer_prefix_is_a_configuration_error() {
    for (args, env, named) in [
        (&["--answers-ipv4-prefix", "0"][..], None, "--answers-ipv4-prefix"),
        (
            &["--answers-ipv4-prefix", "33"][..],
            None,
            "--answers-ipv4-prefix",
        ),
        (&["--answers-ipv6-prefix", "0"][..], None, "--answers-ipv6-prefix"),
        (
            &["--answers-ipv6-prefix", "129"][..],
            None,
            "--answers-ipv6-prefix",
        ),
        (
            &["--answers-ipv4-prefix", "/24"][..],
            None,
            "--answers-ipv4-prefix",
        ),
        (
            &[][..],
            Some(("UDP_ECHO_ANSWERS_IPV6_PREFIX", "200")),
            "UDP_ECHO_ANSWERS_IPV6_PREFIX",
        ),
    ] {
        let mut all = vec!["-l", "udp://127.0.0.1:0"];
        all.extend_from_slice(args);
        let mut server = Server::spawn("udp_echo", &all, env.as_slice());
        let status = server.wait_exit();
        server.wait_for_log_end();
        let log = server.log_text();
        assert_eq!(status.code(), Some(2), "{args:?} {env:?}: {log}");
        assert!(
            log.contains("invalid value") && log.contains(named),
            "{args:?} {env:?}: {log}"
        );
        assert!(!log.contains("ready"), "{args:?} {env:?} started: {log}");
    }
    // The bounds themselves are accepted.
    let out = run(
        &example("udp_echo"),
        &[
            "check",
            "-l",
            "udp://127.0.0.1:0",
            "--answers-ipv4-prefix",
            "32",
            "--answers-ipv6-prefix",
            "128",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn issue_19_access_log_sampling_writes_one_line_per_n_datagrams() {
    let dir = Dir::new("access");
    let log = dir.path("access.log");
    // One worker: each worker counts its own datagrams for the sampling.
    let mut server = echo(
        1,
        &[
            "-l",
            "udp://127.0.0.1:0",
            "--access-log",
            &log,
            "--access-log-sample",
            "10",
        ],
    );
    let addr = server.udp_addr();
    let c = client("127.0.0.1");
    for i in 0..50 {
        let q = format!("datagram {i}");
        assert_eq!(ask(&c, addr, &q).0, q);
    }
    // The lines are buffered by the worker and written when it stops.
    server.signal(libc::SIGTERM);
    assert!(server.wait_exit().success(), "{}", server.log_text());
    let written = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = written.lines().collect();
    assert_eq!(lines.len(), 5, "{written}");
    let me = c.local_addr().unwrap().to_string();
    for l in lines {
        assert!(l.contains(&format!(" {me} ok ")), "{l}");
    }
}

/// The sampling counts the datagrams that can have a line: a dropped one (denied, too
/// large) has none, and counting it would skew the sample (here, to every answered one).
#[test]
fn issue_19_access_log_sampling_counts_only_the_datagrams_it_logs() {
    let dir = Dir::new("access-denied");
    let log = dir.path("access.log");
    let mut server = echo(
        1,
        &[
            "-l",
            "udp://127.0.0.1:0",
            "--deny",
            "127.0.0.1/32",
            "--access-log",
            &log,
            "--access-log-sample",
            "2",
        ],
    );
    let addr = server.udp_addr();
    let denied = client("127.0.0.1");
    let allowed = client("127.0.0.2");
    for i in 0..20 {
        denied.send_to(format!("denied {i}").as_bytes(), addr).unwrap();
        let q = format!("allowed {i}");
        assert_eq!(ask(&allowed, addr, &q).0, q);
    }
    server.signal(libc::SIGTERM);
    assert!(server.wait_exit().success(), "{}", server.log_text());
    let written = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        written.lines().count(),
        10,
        "one line per 2 answered datagrams:\n{written}"
    );
}

#[test]
fn issue_19_reloads_under_load_lose_no_datagram() {
    let dir = Dir::new("reload");
    let ctl = dir.ctl();
    let server = echo(2, &["-l", "udp://127.0.0.1:0", "--control", &ctl]);
    let addr = server.udp_addr();
    let before = server.worker_pids();
    let (answered, lost) = under_udp_load(addr, || {
        for n in 1..=3 {
            ok(self::ctl(&ctl, &["reload"]));
            server.wait_for_log(&format!("reload done: generation {n} serves"));
        }
    });
    eprintln!("{answered} answered during 3 reloads");
    assert!(lost.is_empty(), "lost out of {answered} answered: {lost:?}");
    assert!(answered >= 20, "only {answered} answered");
    let after = server.worker_pids();
    assert!(
        after.is_disjoint(&before),
        "a new generation serves: {before:?} → {after:?}"
    );
    // The counters of the workers that left are kept.
    let s = wait_for_status(&ctl, "every answer counted", |s| datagrams(s, "sent") >= answered);
    assert_eq!(datagrams(&s, "sent"), answered, "{s:#}");
    assert_eq!(datagrams(&s, "received"), answered, "{s:#}");
}

/// A copy of `udp_echo` in a directory of its own, with its control socket and pid file:
/// after an upgrade, the new master runs in a process group of its own (which the
/// [`Server`] guard does not kill), so dropping this kills whatever runs from the copy.
struct Deploy {
    dir: Dir,
}

impl Deploy {
    fn new(tag: &str) -> Deploy {
        let dir = Dir::new(tag);
        // Copied by a `cp` process, not by this one: a file this process held open for
        // writing could leak into a child another test thread forks (ETXTBSY at exec).
        let cp = Command::new("cp")
            .arg(example("udp_echo"))
            .arg(dir.path("server"))
            .status()
            .unwrap();
        assert!(cp.success());
        Deploy { dir }
    }

    fn bin(&self) -> PathBuf {
        PathBuf::from(self.dir.path("server"))
    }

    fn pid(&self) -> i32 {
        let p = std::fs::read_to_string(self.dir.path("pid")).unwrap();
        p.trim().parse().unwrap_or_else(|_| panic!("pid file {p:?}"))
    }

    fn processes(&self) -> Vec<i32> {
        let bin = self.bin();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                alive(*pid) && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == bin)
            })
            .collect()
    }
}

impl Drop for Deploy {
    fn drop(&mut self) {
        for pid in self.processes() {
            // SAFETY: kill(2) on processes running this test's copy of the binary.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

#[test]
fn issue_19_an_upgrade_hands_the_udp_socket_over_losing_no_datagram() {
    let d = Deploy::new("upgrade");
    let (ctl, pid_file) = (d.dir.ctl(), d.dir.path("pid"));
    let server = Server::start_path(
        &d.bin(),
        &[
            "-l",
            "udp://127.0.0.1:0",
            "-w",
            "2",
            "--control",
            &ctl,
            "--pid-file",
            &pid_file,
        ],
    );
    let old_workers = server.wait_for_workers(2);
    let old_master = server.pid();
    assert_eq!(d.pid(), old_master);
    let addr = server.udp_addr();
    let (answered, lost) = under_udp_load(addr, || {
        ok(run(&d.bin(), &["upgrade", "--control", &ctl]));
        // Keep the load on while the old master and its workers leave.
        assert!(
            wait_until(|| (!alive(old_master) && !old_workers.iter().any(|p| alive(*p))).then_some(()))
                .is_some(),
            "the old master and workers never left; log:\n{}",
            server.log_text()
        );
    });
    eprintln!("{answered} answered during the upgrade");
    assert!(lost.is_empty(), "lost out of {answered} answered: {lost:?}");
    assert!(answered > 0);
    let new_master = d.pid();
    assert_ne!(new_master, old_master, "the pid file names a new master");
    // Only the new master's workers hold the socket now.
    let c = client("127.0.0.1");
    assert_eq!(
        ask(&c, addr, "after the upgrade"),
        ("after the upgrade".to_owned(), addr)
    );
    let s = status(&ctl);
    assert_eq!(s["master_pid"].as_i64(), Some(i64::from(new_master)), "{s:#}");
}

#[test]
fn issue_19_max_requests_recycles_a_worker_by_its_datagrams() {
    let dir = Dir::new("recycle");
    let ctl = dir.ctl();
    let server = echo(
        1,
        &[
            "-l",
            "udp://127.0.0.1:0",
            "--max-requests",
            "10",
            "--control",
            &ctl,
        ],
    );
    let addr = server.udp_addr();
    let c = client("127.0.0.1");
    let mut seen = vec![server.wait_for_workers(1)];
    for round in 0..3 {
        for i in 0..10 {
            let q = format!("round {round} datagram {i}");
            assert_eq!(ask(&c, addr, &q), (q.clone(), addr));
        }
        // Ten datagrams answered: the worker asks for its replacement and leaves.
        let last = seen.last().unwrap().clone();
        let next = wait_until(|| {
            let w = server.worker_pids();
            (w.len() == 1 && w.is_disjoint(&last)).then_some(w)
        })
        .unwrap_or_else(|| panic!("worker {last:?} never replaced; log:\n{}", server.log_text()));
        seen.push(next);
    }
    assert_eq!(ask(&c, addr, "still answered").0, "still answered");
    // The counters of the workers that left are kept.
    let s = wait_for_status(&ctl, "31 answers counted", |s| datagrams(s, "sent") >= 31);
    assert_eq!(datagrams(&s, "sent"), 31, "{s:#}");
    assert_eq!(datagrams(&s, "received"), 31, "{s:#}");
}

#[test]
fn issue_19_socket_activation_adopts_a_udp_socket() {
    use std::os::fd::AsRawFd;
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    // The -l is ignored when sockets are passed (LISTEN_FDS).
    let mut server = spawn_socket_activated(
        "udp_echo",
        &["-l", "udp://127.0.0.1:1", "-w", "1"],
        &[],
        socket.as_raw_fd(),
    );
    server.wait_for_ready();
    assert_eq!(server.udp_addrs(), vec![addr], "{}", server.log_text());
    let c = client("127.0.0.1");
    assert_eq!(ask(&c, addr, "activated"), ("activated".to_owned(), addr));
    // Stopped, the server leaves the socket usable for the next start: what comes now
    // waits in it.
    server.signal(libc::SIGTERM);
    assert!(server.wait_exit().success(), "{}", server.log_text());
    c.send_to(b"for the next start", addr).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0; 64];
    let (n, _) = socket.recv_from(&mut buf).expect("the socket still receives");
    assert_eq!(&buf[..n], b"for the next start");
}

/// Runs `example_name ARGS` (which must not start) and returns its exit status and log.
fn refused(example_name: &str, args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut server = Server::spawn(example_name, args, &[]);
    let status = server.wait_exit();
    server.wait_for_log_end();
    (status, server.log_text())
}

#[test]
fn issue_19_a_listener_the_server_cannot_serve_is_a_configuration_error() {
    for (example_name, args, message) in [
        ("hello", &["-l", "udp://127.0.0.1:0"][..], "no datagram handler"),
        ("udp_echo", &["-l", "127.0.0.1:0"][..], "serves datagrams only"),
        (
            "udp_echo",
            &["-l", "udp://127.0.0.1:0?backlog=5"][..],
            "stream listeners only",
        ),
        (
            "udp_echo",
            &["check", "-l", "127.0.0.1:0"][..],
            "serves datagrams only",
        ),
    ] {
        let (status, log) = refused(example_name, args);
        assert!(!status.success(), "{example_name} {args:?}: {status:?}\n{log}");
        assert!(log.contains(message), "{example_name} {args:?}: {log}");
        assert!(!log.contains("ready"), "{example_name} {args:?} started: {log}");
        if args[0] == "check" {
            assert_eq!(status.code(), Some(1), "{log}");
        }
    }
}

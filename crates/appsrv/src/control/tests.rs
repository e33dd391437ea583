use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use super::conn::{DEADLINE, MAX_CONNECTIONS};
use super::render::tests::sample_status;
use super::*;

/// A fresh directory path (not created) for one test.
fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("appsrv-ctl-unit-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn my_uid() -> u32 {
    nix::unistd::Uid::effective().as_raw()
}

/// An answer that records the requests it gets.
fn answer_into(log: &mut Vec<Request>) -> impl FnMut(Request) -> Reply + '_ {
    move |r| {
        log.push(r.clone());
        match r {
            Request::Status { json: false } => Ok(render_text(&sample_status())),
            Request::Status { json: true } => Ok(render_json(&sample_status())),
            Request::Metrics => Ok(render_metrics(&sample_status())),
            Request::Workers(n) if n > 0 => Ok(format!("workers: target {}\n", 2 + n)),
            Request::Workers(_) => Err("the pool cannot shrink below 1 worker".into()),
            Request::Reload => Ok("reloading: generation 1\n".into()),
            Request::ReloadStatus(_) | Request::UpgradeStatus(_) => Ok("done\n".into()),
            Request::Upgrade => Ok("upgrading: new master pid 1\n".into()),
        }
    }
}

/// Connects a non-blocking client and sends `request`.
fn client(path: &Path, request: &[u8]) -> UnixStream {
    let c = UnixStream::connect(path).unwrap();
    c.set_nonblocking(true).unwrap();
    (&c).write_all(request).unwrap();
    c
}

/// Calls `service` and reads the client until its end of file, on this thread; returns
/// what the client read.
/// The client is closed on return.
fn run(ctl: &mut Control, mut c: UnixStream, answer: &mut dyn FnMut(Request) -> Reply) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        assert!(
            Instant::now() < deadline,
            "no end of file; read {:?}",
            String::from_utf8_lossy(&out)
        );
        ctl.service(answer);
        match c.read(&mut chunk) {
            Ok(0) => return String::from_utf8(out).unwrap(),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("client read: {e}"),
        }
    }
}

#[test]
fn request_lines_parse() {
    let ok = |s: &str| Request::parse(s.as_bytes()).unwrap_or_else(|e| panic!("{s:?}: {e}"));
    assert_eq!(ok("status"), Request::Status { json: false });
    assert_eq!(ok("status\r"), Request::Status { json: false });
    assert_eq!(ok("  status   json "), Request::Status { json: true });
    assert_eq!(ok("metrics"), Request::Metrics);
    assert_eq!(ok("workers +1"), Request::Workers(1));
    assert_eq!(ok("workers -3"), Request::Workers(-3));
    assert_eq!(ok("workers +1024"), Request::Workers(1024));
    for bad in [
        "",
        "   ",
        "STATUS",
        "status xml",
        "status json extra",
        "metrics now",
        "workers",
        "workers 1",
        "workers +",
        "workers --1",
        "workers +-1",
        "workers +1025",
        "workers -99999999999",
        "workers +1 +2",
        "stop",
        "status\x00",
        "st\u{e9}tus",
    ] {
        assert!(Request::parse(bad.as_bytes()).is_err(), "{bad:?} must not parse");
    }
    assert!(Request::parse(b"\xff\xfe").is_err());
    let e = Request::parse(b"reboot").unwrap_err();
    assert!(e.contains("unknown request \"reboot\""), "{e}");
    for r in [
        Request::Status { json: false },
        Request::Status { json: true },
        Request::Metrics,
        Request::Workers(2),
        Request::Workers(-1),
        Request::Workers(0),
    ] {
        assert_eq!(Request::parse(r.line().as_bytes()), Ok(r.clone()), "{}", r.line());
    }
}

#[test]
fn lines_are_framed_and_bounded() {
    let mut seen = Vec::new();
    let mut answer = answer_into(&mut seen);
    assert_eq!(decide_line(b"", false, &mut answer), Decision::Wait);
    assert_eq!(decide_line(b"stat", false, &mut answer), Decision::Wait);
    assert_eq!(decide_line(b"", true, &mut answer), Decision::Close);
    // End of file ends a line without its newline.
    let Decision::Reply(r) = decide_line(b"metrics", true, &mut answer) else {
        panic!()
    };
    assert!(r.starts_with(b"OK\n# HELP "));
    let Decision::Reply(r) = decide_line(b"workers -1\nignored", false, &mut answer) else {
        panic!()
    };
    assert_eq!(r, b"ERR the pool cannot shrink below 1 worker\n");
    let Decision::Reply(r) = decide_line(&[b'x'; MAX_REQUEST], false, &mut answer) else {
        panic!()
    };
    assert_eq!(
        r,
        format!("ERR request too long (at most {MAX_REQUEST} bytes)\n").as_bytes()
    );
    // A newline past the limit does not help.
    let mut long = vec![b' '; MAX_REQUEST + 10];
    long.extend_from_slice(b"status\n");
    let Decision::Reply(r) = decide_line(&long, false, &mut answer) else {
        panic!()
    };
    assert!(r.starts_with(b"ERR request too long"));
    // The longest line accepted.
    let mut max = vec![b' '; MAX_REQUEST - 7];
    max.extend_from_slice(b"status\n");
    let Decision::Reply(r) = decide_line(&max, false, &mut answer) else {
        panic!()
    };
    assert!(r.starts_with(b"OK\n"));
    drop(answer);
    assert_eq!(
        seen,
        [
            Request::Metrics,
            Request::Workers(-1),
            Request::Status { json: false }
        ]
    );
    // An error message stays on one line.
    assert_eq!(encode(Err("a\nb".into())), b"ERR a b\n");
}

#[test]
fn a_control_socket_serves_requests_on_one_thread() {
    let d = dir("serve");
    let path = d.join("sub").join("ctl.sock");
    let mut ctl = Control::bind(&path, my_uid()).unwrap();
    let meta = std::fs::metadata(d.join("sub")).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o700,
        "a missing directory is made private"
    );
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(ctl.path, path);
    assert_eq!(ctl.poll_fds().len(), 1);
    assert_eq!(ctl.next_deadline(), None);

    let mut seen = Vec::new();
    let mut answer = answer_into(&mut seen);
    let c = client(&path, b"status\n");
    let text = run(&mut ctl, c, &mut answer);
    assert!(
        text.starts_with("OK\nServer:        unit (master pid 4100)\n"),
        "{text}"
    );

    let c = client(&path, b"status json\r\n");
    let json = run(&mut ctl, c, &mut answer);
    let v: serde_json::Value = serde_json::from_str(json.strip_prefix("OK\n").unwrap()).unwrap();
    assert_eq!(v["master_pid"], 4100);

    let c = client(&path, b"workers +2\n");
    assert_eq!(run(&mut ctl, c, &mut answer), "OK\nworkers: target 4\n");
    let c = client(&path, b"frobnicate\n");
    let r = run(&mut ctl, c, &mut answer);
    assert!(r.starts_with("ERR unknown request \"frobnicate\""), "{r}");

    // A request in pieces, and a client that shuts its side after a line with no newline.
    let c = client(&path, b"metr");
    ctl.service(&mut answer);
    std::thread::sleep(Duration::from_millis(20));
    (&c).write_all(b"ics").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let r = run(&mut ctl, c, &mut answer);
    assert!(r.starts_with("OK\n# HELP appsrv_connections_total"), "{r}");
    ctl.service(&mut answer);
    drop(answer);
    assert_eq!(
        seen,
        [
            Request::Status { json: false },
            Request::Status { json: true },
            Request::Workers(2),
            Request::Metrics
        ]
    );
    assert_eq!(ctl.acceptor.connections(), 0, "finished connections are closed");

    ctl.remove_file();
    assert!(!path.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_slow_client_is_dropped_at_the_deadline_without_blocking() {
    let d = dir("slow");
    let path = d.join("ctl.sock");
    let mut ctl = Control::bind(&path, my_uid()).unwrap();
    let mut answer = |_| -> Reply { panic!("no request was sent") };
    let started = Instant::now();
    let mut silent = UnixStream::connect(&path).unwrap();
    silent.set_nonblocking(true).unwrap();
    let mut partial = client(&path, b"stat");
    let mut longest = Duration::ZERO;
    let mut fds_seen = 0;
    let mut closed = (false, false);
    while !(closed.0 && closed.1) {
        assert!(
            started.elapsed() < DEADLINE + Duration::from_secs(5),
            "not dropped"
        );
        let t = Instant::now();
        ctl.service(&mut answer);
        longest = longest.max(t.elapsed());
        fds_seen = fds_seen.max(ctl.poll_fds().len());
        if let Some(next) = ctl.next_deadline() {
            assert!(next <= started + DEADLINE + Duration::from_millis(100));
        }
        for (c, done) in [(&mut silent, &mut closed.0), (&mut partial, &mut closed.1)] {
            match c.read(&mut [0u8; 16]) {
                Ok(0) => *done = true,
                Ok(n) => panic!("{n} unexpected bytes"),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => *done = true,
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = started.elapsed();
    assert!(
        took >= DEADLINE - Duration::from_millis(50),
        "closed after {took:?}"
    );
    assert!(longest < Duration::from_millis(200), "service() took {longest:?}");
    assert_eq!(fds_seen, 3, "the listener and both connections are polled");
    assert_eq!(ctl.next_deadline(), None);
    assert_eq!(ctl.raw_fds().len(), 1);
    ctl.remove_file();
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_oversized_request_is_refused() {
    let d = dir("big");
    let path = d.join("ctl.sock");
    let mut ctl = Control::bind(&path, my_uid()).unwrap();
    let mut answer = |_| -> Reply { panic!("must not be answered") };
    let c = client(&path, &[b'a'; 3000]);
    let r = run(&mut ctl, c, &mut answer);
    assert_eq!(r, format!("ERR request too long (at most {MAX_REQUEST} bytes)\n"));
    ctl.remove_file();
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn connections_beyond_the_limit_are_turned_away() {
    let d = dir("many");
    let path = d.join("ctl.sock");
    let mut ctl = Control::bind(&path, my_uid()).unwrap();
    let mut answer = |_| -> Reply { Ok(String::new()) };
    let held: Vec<UnixStream> = (0..MAX_CONNECTIONS)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    ctl.service(&mut answer);
    assert_eq!(ctl.acceptor.connections(), MAX_CONNECTIONS);
    assert_eq!(ctl.raw_fds().len(), MAX_CONNECTIONS + 1);
    let mut extra = UnixStream::connect(&path).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    ctl.service(&mut answer);
    let mut r = String::new();
    extra.read_to_string(&mut r).unwrap();
    assert_eq!(r, "ERR busy: too many control connections\n");
    assert_eq!(ctl.acceptor.connections(), MAX_CONNECTIONS);
    drop(held);
    ctl.service(&mut answer);
    assert_eq!(ctl.acceptor.connections(), 0, "clients that left are closed");
    ctl.remove_file();
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_peer_of_another_uid_is_refused() {
    let d = dir("refuse");
    let path = d.join("ctl.sock");
    let mut ctl = Control::bind(&path, my_uid()).unwrap();
    // Pretend that this test runs as a stranger: trust two other uids only.
    ctl.allowed = [my_uid().wrapping_add(1), my_uid().wrapping_add(2)];
    let mut answer = |_| -> Reply { panic!("a refused peer is not answered") };
    for i in 0..3 {
        let c = client(&path, b"workers -1\n");
        let r = run(&mut ctl, c, &mut answer);
        assert_eq!(r, "ERR permission denied\n");
        let refusals = ctl.refusals.as_ref().unwrap();
        assert_eq!((refusals.uid, refusals.count), (my_uid(), i + 1), "one episode");
    }
    assert_eq!(ctl.acceptor.connections(), 0);
    ctl.remove_file();
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_stale_socket_is_replaced_and_a_live_one_is_an_error() {
    let d = dir("stale");
    std::fs::create_dir_all(&d).unwrap();
    let path = d.join("ctl.sock");
    drop(UnixListener::bind(&path).unwrap()); // leaves a socket file nobody listens on
    let ctl = Control::bind(&path, my_uid()).unwrap();
    let e = Control::bind(&path, my_uid()).unwrap_err().to_string();
    assert!(
        e.contains(&path.display().to_string()) && e.contains("another process is accepting connections"),
        "{e}"
    );
    // The failed bind left the live server's socket alone.
    UnixStream::connect(&path).unwrap();
    ctl.remove_file();
    std::fs::write(&path, "not a socket").unwrap();
    let e = Control::bind(&path, my_uid()).unwrap_err().to_string();
    assert!(e.contains("not a socket"), "{e}");
    assert!(path.exists(), "a file that is not a socket is left alone");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn remove_file_spares_a_successor_socket() {
    let d = dir("successor");
    let path = d.join("ctl.sock");
    let old = Control::bind(&path, my_uid()).unwrap();
    std::fs::remove_file(&path).unwrap(); // as a new master would after finding ours stale
    let new = Control::bind(&path, my_uid()).unwrap();
    old.remove_file();
    assert!(path.exists(), "the successor's socket is not removed");
    new.remove_file();
    assert!(!path.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_unsafe_directory_is_refused() {
    let d = dir("unsafe");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = Control::bind(&d.join("ctl.sock"), my_uid())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("writable by every user") && e.contains(&d.display().to_string()),
        "{e}"
    );
    // Sticky, as /tmp: others cannot remove or rename our socket.
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    Control::bind(&d.join("ctl.sock"), my_uid())
        .unwrap()
        .remove_file();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A directory of another user (uid 0 is always trusted; an unused uid is not).
    if my_uid() == 0 {
        nix::unistd::chown(&d, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let e = Control::bind(&d.join("ctl.sock"), 0).unwrap_err().to_string();
        assert!(e.contains("belongs to uid 65534"), "{e}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_default_path_follows_the_user() {
    let p = default_path("hello");
    if my_uid() == 0 {
        assert_eq!(p, Some(PathBuf::from("/run/hello/ctl.sock")));
    } else if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        assert_eq!(p, Some(Path::new(&dir).join("hello.sock")));
    } else {
        assert_eq!(p, None);
    }
}

/// A fake server at `path` that answers the first connection with `reply`.
fn fake_server(path: &Path, reply: &'static [u8]) -> std::thread::JoinHandle<String> {
    let l = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut line = [0u8; 64];
        let n = s.read(&mut line).unwrap();
        s.write_all(reply).unwrap();
        String::from_utf8_lossy(&line[..n]).into_owned()
    })
}

#[test]
fn the_client_maps_replies_to_exit_statuses() {
    let d = dir("client");
    std::fs::create_dir_all(&d).unwrap();
    let path = d.join("ctl.sock");
    assert_eq!(client_command("unit", &path, Request::Metrics), 3, "no socket");
    drop(UnixListener::bind(&path).unwrap());
    assert_eq!(
        exchange(&path, &Request::Metrics),
        Outcome::NotRunning { stale: true },
        "connection refused"
    );
    std::fs::remove_file(&path).unwrap();

    for (reply, expected) in [
        (&b"OK\nbody\n"[..], Outcome::Ok(b"body\n".to_vec())),
        (
            b"ERR permission denied\n",
            Outcome::Err("permission denied".into()),
        ),
        (b"ERR no such thing\n", Outcome::Err("no such thing".into())),
    ] {
        let server = fake_server(&path, reply);
        assert_eq!(exchange(&path, &Request::Workers(-2)), expected);
        assert_eq!(server.join().unwrap(), "workers -2\n");
        std::fs::remove_file(&path).unwrap();
    }
    for (reply, status) in [
        (&b"OK\n"[..], 0),
        (b"ERR permission denied\n", 4),
        (b"ERR nope\n", 1),
        (b"", 1),
        (b"HTTP/1.1 200 OK\r\n", 1),
    ] {
        let server = fake_server(&path, reply);
        assert_eq!(
            client_command("unit", &path, Request::Status { json: true }),
            status,
            "{reply:?}"
        );
        assert_eq!(server.join().unwrap(), "status json\n");
        std::fs::remove_file(&path).unwrap();
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_client_talks_to_a_real_control_socket() {
    let d = dir("real");
    let path = d.join("ctl.sock");
    let mut ctl = Control::bind(&path, my_uid()).unwrap();
    let p = path.clone();
    let handle = std::thread::spawn(move || exchange(&p, &Request::Workers(1)));
    let mut seen = Vec::new();
    let mut answer = answer_into(&mut seen);
    while !handle.is_finished() {
        let mut fds = ctl.poll_fds();
        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(20u8));
        drop(fds);
        ctl.service(&mut answer);
    }
    assert_eq!(
        handle.join().unwrap(),
        Outcome::Ok(b"workers: target 3\n".to_vec())
    );
    ctl.remove_file();
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_client_gives_up_on_a_server_that_never_accepts() {
    let d = dir("stuck");
    std::fs::create_dir_all(&d).unwrap();
    let path = d.join("ctl.sock");
    let stuck = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
    stuck.bind(&SockAddr::unix(&path).unwrap()).unwrap();
    stuck.listen(0).unwrap();
    // Fill the backlog with connections nobody accepts.
    let mut queued = Vec::new();
    loop {
        let s = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        match s.connect(&SockAddr::unix(&path).unwrap()) {
            Ok(()) => queued.push(s),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
        assert!(queued.len() < 100, "the backlog never filled");
    }
    let started = Instant::now();
    match exchange(&path, &Request::Metrics) {
        Outcome::Failed(msg) => assert!(msg.contains("no answer within 5s"), "{msg}"),
        other => panic!("{other:?}"),
    }
    let waited = started.elapsed();
    assert!(
        waited >= CLIENT_TIMEOUT - Duration::from_millis(100),
        "gave up after {waited:?}"
    );
    assert_eq!(client_command("unit", &path, Request::Metrics), 1);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_large_reply_is_written_in_pieces_and_a_vanished_client_is_dropped() {
    let d = dir("large");
    let path = d.join("ctl.sock");
    let mut ctl = Control::bind(&path, my_uid()).unwrap();
    let body: String = (0..200_000).map(|i| format!("line {i}\n")).collect();
    let mut answer = |_| -> Reply { Ok(body.clone()) };
    let c = client(&path, b"metrics\n");
    ctl.service(&mut answer);
    assert!(
        ctl.poll_fds()
            .iter()
            .any(|p| p.events().contains(nix::poll::PollFlags::POLLOUT)),
        "a reply larger than the socket buffer waits for POLLOUT"
    );
    let r = run(&mut ctl, c, &mut answer);
    assert_eq!(r.len(), 3 + body.len());
    assert!(r.starts_with("OK\nline 0\n") && r.ends_with("line 199999\n"));
    // A client that leaves without reading: the master gets EPIPE, not SIGPIPE.
    let c = client(&path, b"metrics\n");
    ctl.service(&mut answer);
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(5);
    while ctl.acceptor.connections() > 0 {
        assert!(Instant::now() < deadline, "never dropped");
        ctl.service(&mut answer);
        std::thread::sleep(Duration::from_millis(5));
    }
    ctl.remove_file();
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_request_comes_with_the_credentials_of_who_sent_it() {
    let d = dir("peer");
    let path = d.join("ctl.sock");
    let mut ctl = Control::bind(&path, my_uid()).unwrap();
    let mut peers = Vec::new();
    let c = client(&path, b"status\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    while peers.is_empty() {
        assert!(Instant::now() < deadline, "no request answered");
        ctl.service_peers(&mut |_, peer| {
            peers.push(peer);
            Ok(String::new())
        });
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(c);
    assert_eq!(
        peers,
        [Some(super::Peer {
            pid: std::process::id() as i32,
            uid: my_uid()
        })]
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Issue 34: `stop` reads the server's grace period, drain delay and what is in progress
/// from its status document (sample_status: worker 2 handles a request, worker 1 idles).
#[test]
fn issue_34_stop_facts_come_from_the_status_document() {
    let doc: serde_json::Value = serde_json::from_str(&render_json(&sample_status())).unwrap();
    let facts = stop_facts_from_json(&doc).unwrap();
    assert_eq!(
        facts,
        StopFacts {
            pid: 4100,
            grace_period: Duration::from_secs(30),
            drain_delay: Duration::from_millis(2500),
            connections: 1,
            requests: 1,
        }
    );
    // A document without the grace period (an older server) gives none.
    let mut old = doc.clone();
    old.as_object_mut().unwrap().remove("grace_period_seconds");
    assert_eq!(stop_facts_from_json(&old), None);
}

/// Issue 34: a pid file of its own gives an instance a control socket of its own.
#[test]
fn issue_34_the_control_socket_is_found_from_the_pid_file() {
    assert_eq!(
        path_for_pid_file("hello", Path::new("/srv/b/hello.pid")),
        Path::new("/srv/b/hello.sock")
    );
    assert_eq!(
        path_for_pid_file("hello", Path::new("/run/hello-b.pid")),
        Path::new("/run/hello-b.sock")
    );
    if let Some(default_pid) = crate::process::daemon::default_pid_file("hello") {
        assert_eq!(
            Some(path_for_pid_file("hello", &default_pid)),
            default_path("hello")
        );
    }
}

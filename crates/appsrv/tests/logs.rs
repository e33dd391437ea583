//! Logs: the three line formats (`--log-format text|journal|json`, journal by default on
//! systemd's journal stream), the log files' permissions (the master's alone) and their
//! rotation (USR1 reopens them for the master and every worker, forked or re-executed),
//! and the reload lines that say who asked.
//!
//! Regression tests for issue #17 ("What an operator and a crate user meet first"), its
//! logging part; issue 20 (an access line for a request that arrives in pieces); and
//! issue 31 ("Faults that still take a server down"): a full log disk or a closed stderr
//! pipe drops and counts lines instead of ending the server, and nothing in the library
//! prints with a macro that panics.

mod util;

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use util::*;

/// A directory for one test's log files, removed at the end; readable by everyone, so that
/// the workers (nobody, as root) could reach the files if their permissions let them.
struct LogDir(PathBuf);

impl LogDir {
    fn new(tag: &str) -> LogDir {
        let dir = std::env::temp_dir().join(format!("appsrv-logs-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        LogDir(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }

    fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    /// Waits until the file `name` has a line containing `needle`; returns that line.
    fn wait_for_line(&self, name: &str, needle: &str) -> String {
        wait_until(|| {
            self.text(name)
                .lines()
                .find(|l| l.contains(needle))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no line with {needle:?} in {name}:\n{}", self.text(name)))
    }

    /// Waits until the file `name` has `n` lines containing `needle`.
    fn wait_for_lines(&self, name: &str, needle: &str, n: usize) {
        let found = wait_until(|| (self.text(name).matches(needle).count() >= n).then_some(()));
        assert!(
            found.is_some(),
            "no {n}× {needle:?} in {name}:\n{}",
            self.text(name)
        );
    }
}

impl Drop for LogDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Workers as nobody when the tests run as root (CI), as the server's own user otherwise.
fn user_args() -> Vec<&'static str> {
    if is_root() {
        vec!["--user", "nobody"]
    } else {
        vec![]
    }
}

// ---------------------------------------------------------------- formats

/// `name[pid] role: ` after the prefix, the role `master` or `worker N`.
fn after_program(rest: &str) -> bool {
    let Some(rest) = rest.strip_prefix("testbed[") else {
        return false;
    };
    let Some((pid, rest)) = rest.split_once("] ") else {
        return false;
    };
    if pid.parse::<u32>().is_err() {
        return false;
    }
    rest.starts_with("master: ")
        || rest
            .strip_prefix("worker ")
            .and_then(|r| r.split_once(": "))
            .is_some_and(|(id, _)| id.parse::<u32>().is_ok())
}

#[test]
fn issue_17_journal_lines_carry_a_priority_and_no_timestamp() {
    let server = Server::start(
        "testbed",
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "2",
            "--log-format",
            "journal",
            "--log-level",
            "debug",
        ],
    );
    let mut c = LineClient::tcp(server.tcp_addr());
    c.testbed_pid();
    c.send("panic"); // an error line from the worker, a warning from the master
    server.wait_for_log("handler panicked while serving");
    server.wait_for_log("starting a replacement");
    let log = server.log_text();
    for line in log.lines() {
        let (prio, rest) = line
            .strip_prefix('<')
            .and_then(|l| l.split_once('>'))
            .unwrap_or_else(|| panic!("no <N> prefix: {line:?}"));
        assert!(["3", "4", "6", "7"].contains(&prio), "priority {prio}: {line:?}");
        assert!(after_program(rest), "no timestamp, then name[pid] role: {line:?}");
    }
    let prio_of = |needle: &str| {
        let line = log.lines().find(|l| l.contains(needle)).unwrap();
        line[1..2].to_owned()
    };
    assert_eq!(prio_of("master: ready"), "6", "info");
    assert_eq!(prio_of("handler panicked while serving"), "3", "error");
    assert_eq!(prio_of("starting a replacement"), "4", "warn");
    assert_eq!(prio_of("] worker 1: ready"), "7", "debug");
}

#[test]
fn issue_17_json_lines_are_one_object_each_with_the_keys() {
    let server = Server::spawn(
        "testbed",
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "2",
            "--log-format",
            "json",
            "--log-level",
            "debug",
        ],
        &[],
    );
    server.wait_for_log("\"role\":\"master\",\"message\":\"ready\"");
    let log = server.log_text();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    let mut roles = std::collections::BTreeSet::new();
    for v in &lines {
        let o = v.as_object().unwrap_or_else(|| panic!("not an object: {v}"));
        for key in ["time", "level", "pid", "role", "message", "fields"] {
            assert!(o.contains_key(key), "no {key}: {v}");
        }
        let time = o["time"].as_str().unwrap();
        // RFC 3339 in UTC: 2026-11-30T07:24:17.123456Z.
        assert!(
            time.len() >= 20 && time.as_bytes()[10] == b'T' && time.ends_with('Z'),
            "time {time:?}"
        );
        assert!(["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&o["level"].as_str().unwrap()));
        assert!(o["pid"].as_u64().is_some_and(|p| p > 0), "{v}");
        assert!(o["fields"].is_object(), "{v}");
        match o["role"].as_str().unwrap() {
            "master" => assert!(!o.contains_key("worker"), "{v}"),
            "worker" => assert!(o["worker"].as_u64().is_some_and(|id| id >= 1), "{v}"),
            other => panic!("role {other:?}"),
        }
        roles.insert(o["role"].as_str().unwrap().to_owned());
    }
    assert_eq!(roles.len(), 2, "lines of both roles:\n{log}");
    // The master's `ready` line carries its fields as an object, typed.
    let ready = lines
        .iter()
        .find(|v| v["role"] == "master" && v["message"] == "ready")
        .unwrap_or_else(|| panic!("no ready line:\n{log}"));
    assert_eq!(ready["level"], "INFO");
    assert_eq!(ready["pid"], server.pid());
    assert_eq!(ready["fields"]["workers"], 2);
    assert_eq!(ready["fields"]["pool"], "static");
    assert_eq!(
        ready["fields"]["io"], "blocking",
        "issue 34: the ready line names the I/O model"
    );
}

/// The testbed with `args`, its stderr a pipe and `JOURNAL_STREAM` set to that pipe's
/// device and inode, as systemd sets it for a service whose output goes to the journal.
fn under_journal(args: &[&str]) -> Server {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2) exec \"$0\" \"$@\"")
        .arg(example("testbed"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    let server = Server::from_command(cmd);
    server.wait_for_ready();
    server
}

#[test]
fn issue_17_journal_is_the_default_on_the_journal_stream() {
    let server = under_journal(&["-l", "127.0.0.1:0", "-w", "1"]);
    let ready = server.wait_for_log("master: ready");
    assert!(ready.starts_with("<6>testbed["), "{ready}");
    // Asked for explicitly, text wins.
    let server = under_journal(&["-l", "127.0.0.1:0", "-w", "1", "--log-format", "text"]);
    let ready = server.wait_for_log("master: ready");
    assert!(ready.as_bytes()[0].is_ascii_digit(), "a timestamp first: {ready}");
    // A JOURNAL_STREAM that names another file (stderr was redirected since): text.
    let server = Server::start_with_env(
        "testbed",
        &["-l", "127.0.0.1:0", "-w", "1"],
        &[("JOURNAL_STREAM", "1:1")],
    );
    let ready = server.wait_for_log("master: ready");
    assert!(ready.as_bytes()[0].is_ascii_digit(), "a timestamp first: {ready}");
    // And the variable, like every option's: TESTBED_LOG_FORMAT.
    let server = Server::start_with_env(
        "testbed",
        &["-l", "127.0.0.1:0", "-w", "1"],
        &[("TESTBED_LOG_FORMAT", "journal")],
    );
    assert!(server.wait_for_log("master: ready").starts_with("<6>"));
}

// ---------------------------------------------------------------- files

/// The uid, gid and permission bits of `path`.
fn owner_and_mode(path: &str) -> (u32, u32, u32) {
    let m = std::fs::metadata(path).unwrap();
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

/// What the master's log files must be: its own user and group, no write for anyone else.
fn assert_masters_alone(path: &str) {
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (u, g, mode) = owner_and_mode(path);
    assert_eq!((u, g), (uid, gid), "{path}: the master's user and group");
    assert_eq!(mode & 0o022, 0, "{path}: mode {mode:o}, writable by others");
    assert_eq!(mode & !0o640, 0, "{path}: mode {mode:o}, above 0640");
}

#[test]
fn issue_17_log_files_are_writable_by_the_master_alone() {
    let dir = LogDir::new("modes");
    let (log, access) = (dir.path("error.log"), dir.path("access.log"));
    let mut args = vec![
        "-l",
        "127.0.0.1:0",
        "-w",
        "1",
        "--log-file",
        &log,
        "--access-log",
        &access,
    ];
    args.extend(user_args());
    let server = Server::spawn("testbed", &args, &[]);
    dir.wait_for_line("error.log", "master: ready");
    for path in [&log, &access] {
        assert_masters_alone(path);
    }
    if is_root() {
        // The worker (nobody) cannot write into them, even where the directory lets it in.
        let mut c = LineClient::tcp(server_addr(&dir));
        c.testbed_pid();
        for path in [&log, &access] {
            assert_eq!(c.ask(&format!("write {path}")), "write error PermissionDenied");
        }
    }
    drop(server);
}

/// The address of the `listening on` line in the log file `error.log` of `dir`.
fn server_addr(dir: &LogDir) -> std::net::SocketAddr {
    let line = dir.wait_for_line("error.log", "listening on ");
    line.rsplit_once("listening on ")
        .unwrap()
        .1
        .trim()
        .parse()
        .unwrap()
}

/// USR1 after the files were moved away: the master and every worker log into the new
/// log file, the access lines go to the new access log, and a worker forked after the
/// rotation writes the new ones too; the new files are the master's alone again.
fn usr1_reopens_the_logs_for_every_worker(tag: &str, extra: &[&str]) {
    let dir = LogDir::new(tag);
    let (log, access) = (dir.path("error.log"), dir.path("access.log"));
    let mut args = vec![
        "-l",
        "127.0.0.1:0",
        "-w",
        "2",
        "--log-file",
        &log,
        "--access-log",
        &access,
    ];
    args.extend(user_args());
    args.extend(extra);
    let server = Server::spawn("testbed", &args, &[]);
    dir.wait_for_line("error.log", "master: ready");
    let addr = server_addr(&dir);
    std::fs::rename(&log, dir.path("error.log.1")).unwrap();
    std::fs::rename(&access, dir.path("access.log.1")).unwrap();
    server.signal(libc::SIGUSR1);
    dir.wait_for_line("error.log", "master: SIGUSR1 received: reopened the log file");
    dir.wait_for_line("error.log", "] worker 1: reopened the log file");
    dir.wait_for_line("error.log", "] worker 2: reopened the log file");
    for path in [&log, &access] {
        assert_masters_alone(path);
    }
    // Both workers serve a connection after the rotation (two held at once: one each),
    // and write its access line to the new file.
    let mut a = LineClient::tcp(addr);
    let mut b = LineClient::tcp(addr);
    let pids = [a.testbed_pid(), b.testbed_pid()];
    assert_ne!(pids[0], pids[1]);
    let ports: Vec<u16> = [&mut a, &mut b]
        .into_iter()
        .map(|c| c.get_mut().local_addr().unwrap().port())
        .collect();
    drop((a, b));
    for port in &ports {
        dir.wait_for_line("access.log", &format!("127.0.0.1:{port} ok"));
    }
    // A worker's own log line: a handler panic, logged by the worker into the new file.
    let mut c = LineClient::tcp(addr);
    let victim = c.testbed_pid();
    c.send("panic");
    let line = dir.wait_for_line("error.log", "handler panicked while serving");
    assert!(line.contains(&format!("testbed[{victim}] worker ")), "{line}");
    // Its replacement, forked after the rotation, writes to the new files as well.
    dir.wait_for_line("error.log", &format!("(pid {victim}) exited with status 70"));
    let fresh = wait_until(|| {
        let now = server.worker_pids();
        (now.len() == 2 && !now.contains(&victim)).then_some(now)
    })
    .expect("the panicked worker replaced");
    let newcomer = *fresh.iter().find(|p| !pids.contains(p)).unwrap();
    // Two connections held at once: one is the newcomer's.
    let mut held = [LineClient::tcp(addr), LineClient::tcp(addr)];
    let got = [held[0].testbed_pid(), held[1].testbed_pid()];
    let i = got
        .iter()
        .position(|p| *p == newcomer)
        .unwrap_or_else(|| panic!("{got:?}, the newcomer {newcomer}"));
    let port = held[i].get_mut().local_addr().unwrap().port();
    drop(held);
    dir.wait_for_line("access.log", &format!("127.0.0.1:{port} ok"));
    let ports = [ports[0], ports[1], port];
    let old_log = dir.text("error.log.1");
    let old_access = dir.text("access.log.1");
    assert!(
        !old_log.contains("panicked"),
        "nothing new in the rotated log:\n{old_log}"
    );
    for port in &ports {
        assert!(!old_access.contains(&format!(":{port} ")), "{old_access}");
    }
    // A second rotation goes the same way (the channel is used again).
    std::fs::rename(&log, dir.path("error.log.2")).unwrap();
    server.signal(libc::SIGUSR1);
    dir.wait_for_lines("error.log", "reopened the log file", 3);
    drop(server);
}

#[test]
fn issue_17_usr1_reopens_the_logs_of_forked_workers() {
    usr1_reopens_the_logs_for_every_worker("forked", &[]);
}

#[test]
fn issue_17_usr1_reopens_the_logs_of_re_executed_workers() {
    usr1_reopens_the_logs_for_every_worker("exec", &["--exec-workers"]);
}

both_io!(issue_17_usr1_reopens_the_access_log_of_request_level_workers);
/// The request-level loops (blocking and event) take the reopened access log too.
fn issue_17_usr1_reopens_the_access_log_of_request_level_workers(io: Io) {
    let dir = LogDir::new(&format!("access-{}", io.name()));
    let access = dir.path("access.log");
    let mut args = vec!["-l", "127.0.0.1:0", "-w", "1", "--access-log", &access];
    args.extend(user_args());
    let server = Server::start_io("http_hello", io, &args);
    let addr = server.tcp_addr();
    let get = |path: &str| {
        let out = get_once(addr, path, PATIENCE);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    };
    get("/?before");
    dir.wait_for_line("access.log", "GET /?before");
    std::fs::rename(&access, dir.path("access.log.1")).unwrap();
    server.signal(libc::SIGUSR1);
    server.wait_for_log("master: SIGUSR1 received: reopened the access log");
    // The worker takes the new file at its next turn: a request after the signal goes
    // there (the loop takes the message before it serves anything after the signal).
    let found = wait_until(|| {
        get("/?after");
        dir.text("access.log").contains("GET /?after").then_some(())
    });
    assert!(
        found.is_some(),
        "no line in the new access log:\n{}",
        dir.text("access.log")
    );
    assert_masters_alone(&access);
}

// ---------------------------------------------------------------- reload lines

/// Runs `testbed reload --control CTL` to its end: its pid (which the master's log line
/// names) and its output.
fn reload_through(ctl: &str) -> (u32, std::process::Output) {
    let client = Command::new(example("testbed"))
        .args(["reload", "--control", ctl])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = client.id();
    (pid, client.wait_with_output().unwrap())
}

#[test]
fn issue_17_reload_outcomes_say_who_asked() {
    let ctl = socket_path("logs-reload");
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "1", "--control", &ctl]);
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    server.signal(libc::SIGHUP);
    server.wait_for_log("master: reload asked by SIGHUP: starting generation 1");
    server.wait_for_log("master: reload done: generation 1 serves (asked by SIGHUP)");
    let (pid, out) = reload_through(&ctl);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let who = format!("through the control socket (pid {pid}, uid {uid})");
    server.wait_for_log(&format!("master: reload asked {who}: starting generation 2"));
    server.wait_for_log(&format!("master: reload done: generation 2 serves (asked {who})"));
}

#[test]
fn issue_17_a_failed_reload_is_logged_whoever_asked() {
    let ctl = socket_path("logs-fail");
    let server = Server::start(
        "testbed",
        &["-l", "127.0.0.1:0", "-w", "1", "--control", &ctl, "--fail-reload"],
    );
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let (pid, out) = reload_through(&ctl);
    assert!(!out.status.success());
    let line = server.wait_for_log(&format!(
        "master: reload asked through the control socket (pid {pid}, uid {uid}) failed: "
    ));
    assert!(
        line.contains("policy file unreadable (testbed --fail-reload); the current workers keep serving"),
        "{line}"
    );
    server.signal(libc::SIGHUP);
    let line = server.wait_for_log("master: reload asked by SIGHUP failed: ");
    assert!(line.contains("policy file unreadable"), "{line}");
    assert!(line.contains(" ERROR "), "at error level: {line}");
}

both_io!(issue_20_a_request_that_arrives_in_pieces_is_logged_whole);
/// The access log's request line is the request's, not the first piece read of it: a
/// request written in pieces was logged as `"GET "` (seen in CI, where the issue 17 test's
/// `write!` went out in three segments).
fn issue_20_a_request_that_arrives_in_pieces_is_logged_whole(io: Io) {
    use std::io::{Read, Write};
    let dir = LogDir::new(&format!("pieces-{}", io.name()));
    let access = dir.path("access.log");
    let mut args = vec!["-l", "127.0.0.1:0", "-w", "1", "--access-log", &access];
    args.extend(user_args());
    let server = Server::start_io("http_hello", io, &args);
    let mut s = std::net::TcpStream::connect(server.tcp_addr()).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    // The first piece, then the rest once the worker has read it: the server's end of
    // the connection has nothing queued, and the worker sleeps in its next read.
    s.write_all(b"GET /?in-").unwrap();
    s.flush().unwrap();
    let pid = *server.worker_pids().iter().next().unwrap();
    wait_until(|| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The server's end of this connection: its remote port is ours (IPv4 loopback).
        let queued = std::fs::read_to_string("/proc/net/tcp").ok()?;
        let port = format!("{:04X}", s.local_addr().unwrap().port());
        let line = queued
            .lines()
            .find(|l| l.split_whitespace().nth(2).is_some_and(|r| r.ends_with(&port)))?;
        let rx = line.split_whitespace().nth(4)?.split(':').nth(1)?;
        (stat.contains(") S ") && u64::from_str_radix(rx, 16).ok()? == 0).then_some(())
    })
    .expect("the worker read the first piece");
    s.write_all(b"pieces HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let line = dir.wait_for_line("access.log", "GET /");
    assert!(line.contains("\"GET /?in-pieces HTTP/1.1"), "{line}");
}

// ---------------------------------------------------------------- one outcome rule

/// The access log's outcome rule (issue 42; docs/ARCHITECTURE.md, "The access log"), for
/// the four requests of the issue, in this order: a whole `GET`, a head that never ends,
/// a malformed request, a client that resets the connection in the middle of its head.
const FOUR_OUTCOMES: [&str; 4] = ["ok", "timeout", "error", "closed"];

/// Sends the four requests of issue 42 to `http_hello` (`async_hello` in the async model)
/// with `--header-timeout 2`, one after the other, and returns the outcome column of each
/// one's access-log line, found by its request line.
fn outcomes_of_the_four_requests(io: Io) -> Vec<String> {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    let dir = LogDir::new(&format!("outcomes-{}", io.name()));
    let access = dir.path("access.log");
    let mut args = vec![
        "-l",
        "127.0.0.1:0",
        "-w",
        "1",
        "--access-log",
        &access,
        "--header-timeout",
        "2",
    ];
    args.extend(user_args());
    let server = Server::start_io("http_hello", io, &args);
    let addr = server.tcp_addr();
    let open = || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        s
    };
    let answer = |mut s: TcpStream, request: &[u8]| {
        s.write_all(request).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    let out = answer(
        open(),
        b"GET /?scenario=whole HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let out = answer(open(), b"GET /?scenario=slow HTTP/1.1\r\nHost: x\r\n");
    assert!(out.starts_with("HTTP/1.1 408"), "the head that never ends: {out}");
    let out = answer(open(), b"GET /?scenario=bad HTTP/1.1\r\nBad Header: x\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 400"), "the malformed request: {out}");
    // The beginning of a head, read by the server (its end of the connection has nothing
    // queued), then a reset (SO_LINGER 0).
    let s = open();
    (&s).write_all(b"GET /?scenario=reset HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let port = format!("{:04X}", s.local_addr().unwrap().port());
    wait_until(|| {
        let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
        let line = table
            .lines()
            .find(|l| l.split_whitespace().nth(2).is_some_and(|r| r.ends_with(&port)))?;
        let rx = line.split_whitespace().nth(4)?.split(':').nth(1)?;
        (u64::from_str_radix(rx, 16).ok()? == 0).then_some(())
    })
    .expect("the server read the beginning of the head");
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(s);
    ["whole", "slow", "bad", "reset"]
        .iter()
        .map(|scenario| {
            let line = dir.wait_for_line("access.log", &format!("scenario={scenario} "));
            line.split_whitespace().nth(2).unwrap_or_default().to_string()
        })
        .collect()
}

#[test]
/// Issue 42: the same four events gave `ok error error closed` in blocking mode, `ok
/// timeout error closed` in event and async mode, and `ok` alone in hybrid mode (a front
/// wrote no line for what it refused, timed out or lost). One rule now, in every model.
fn issue_42_the_access_log_says_the_same_in_every_model() {
    let models = [Io::Blocking, Io::Event, Io::Hybrid, Io::Async];
    let table: Vec<(Io, Vec<String>)> = models
        .iter()
        .map(|io| (*io, outcomes_of_the_four_requests(*io)))
        .collect();
    for (io, outcomes) in &table {
        assert_eq!(
            outcomes,
            &FOUR_OUTCOMES,
            "{} mode's outcomes, against the rule (all: {table:?})",
            io.name()
        );
    }
}

both_io!(issue_42_a_refused_timed_out_or_lost_request_has_its_access_line);
/// Issue 42: each model, on its own (so that a failure names it), writes the rule's line
/// for a request it refuses, times out or loses, hybrid fronts included.
fn issue_42_a_refused_timed_out_or_lost_request_has_its_access_line(io: Io) {
    assert_eq!(
        outcomes_of_the_four_requests(io),
        FOUR_OUTCOMES,
        "{} mode",
        io.name()
    );
}

both_io!(issue_42_an_unanswered_requests_line_names_that_request);
/// Issue 42: the line of a request left unanswered (here timed out) names that request,
/// not the last one its worker (an event loop, a hybrid front, an async worker) began
/// meanwhile on another connection.
fn issue_42_an_unanswered_requests_line_names_that_request(io: Io) {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    let dir = LogDir::new(&format!("own-line-{}", io.name()));
    let access = dir.path("access.log");
    // Blocking: a second worker for the second client.
    let workers = if io == Io::Blocking { "2" } else { "1" };
    let mut args = vec![
        "-l",
        "127.0.0.1:0",
        "-w",
        workers,
        "--access-log",
        &access,
        "--header-timeout",
        "2",
    ];
    args.extend(user_args());
    let server = Server::start_io("http_hello", io, &args);
    let addr = server.tcp_addr();
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.set_read_timeout(Some(PATIENCE)).unwrap();
    slow.write_all(b"GET /?scenario=slow HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let port = format!("{:04X}", slow.local_addr().unwrap().port());
    wait_until(|| {
        let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
        let line = table
            .lines()
            .find(|l| l.split_whitespace().nth(2).is_some_and(|r| r.ends_with(&port)))?;
        let rx = line.split_whitespace().nth(4)?.split(':').nth(1)?;
        (u64::from_str_radix(rx, 16).ok()? == 0).then_some(())
    })
    .expect("the server read the beginning of the head");
    // Another client's request, begun and answered while the first one waits.
    let out = http_text(&addr, "/?scenario=other");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let mut out = String::new();
    let _ = slow.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    let line = dir.wait_for_line("access.log", " timeout ");
    assert!(line.contains("\"GET /?scenario=slow HTTP/1.1\""), "{line}");
}

/// Issue 42: a `handle_client` connection that the peer resets is `closed`, one whose
/// handler panics is `error`, in both models that serve `handle_client` (blocking and
/// async): the blocking loop said `closed` for the panic, the async driver `error` for
/// the reset.
#[test]
fn issue_42_a_handle_client_connection_ends_alike_in_blocking_and_async() {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpStream;
    for (example, extra) in [("testbed", &[][..]), ("asyncbed", &["--client"][..])] {
        let dir = LogDir::new(&format!("client-level-{example}"));
        let access = dir.path("access.log");
        let mut args = vec!["-l", "127.0.0.1:0", "-w", "1", "--access-log", &access];
        args.extend(extra);
        args.extend(user_args());
        let server = Server::start(example, &args);
        let greeted = || {
            let s = TcpStream::connect(server.tcp_addr()).unwrap();
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            let mut pid = String::new();
            BufReader::new(&s).read_line(&mut pid).unwrap();
            assert!(pid.starts_with("pid "), "{example}: {pid:?}");
            s
        };
        // The handler waits in its read: the reset ends it.
        let reset = greeted();
        let reset_port = reset.local_addr().unwrap().port();
        socket2::SockRef::from(&reset)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(reset);
        let mut panics = greeted();
        let panic_port = panics.local_addr().unwrap().port();
        panics.write_all(b"panic\n").unwrap();
        let outcome = |port: u16| {
            let line = dir.wait_for_line("access.log", &format!(" 127.0.0.1:{port} "));
            line.split_whitespace().nth(2).unwrap_or_default().to_string()
        };
        assert_eq!(
            outcome(reset_port),
            "closed",
            "{example}: the client reset the connection"
        );
        assert_eq!(outcome(panic_port), "error", "{example}: the handler panicked");
        drop(panics);
    }
}

/// [`get_once`] with a read timeout of 20 s: the whole response as text.
fn http_text<A: std::net::ToSocketAddrs + ?Sized>(addr: &A, path: &str) -> String {
    get_once(addr, path, Duration::from_secs(20))
}

/// The value of the metric sample `name{labels}` (labels as the server renders them).
fn metric_value(metrics_addr: &str, sample: &str) -> u64 {
    let text = http_text(metrics_addr, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {sample} in:\n{text}"))
}

/// A tmpfs of 64 KiB mounted on a [`LogDir`] for one test, unmounted when dropped (then
/// the `LogDir` removes the directory).
struct TinyDisk(LogDir);

impl TinyDisk {
    fn mount(tag: &str) -> TinyDisk {
        let dir = LogDir::new(&format!("tiny-{tag}"));
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs"])
            .arg(&dir.0)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a tmpfs on {}", dir.0.display());
        TinyDisk(dir)
    }

    /// Fills what is left of the disk with a file of its own, then the last page of each
    /// log file (a tmpfs counts whole pages: a file's last page takes lines until it is
    /// full) with filler lines.
    fn fill(&self, logs: &[&str]) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.path("filler")).unwrap();
        let block = [0u8; 1024];
        while f.write_all(&block).is_ok() {}
        for log in logs {
            let mut f = std::fs::OpenOptions::new().append(true).open(log).unwrap();
            while f.write_all(b"filler\n").is_ok() {}
        }
    }

    fn free(&self) {
        std::fs::remove_file(self.0.path("filler")).unwrap();
    }
}

impl Drop for TinyDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0.0).status();
    }
}

/// Issue 31: a full log disk ended the whole server. Every line written after the disk
/// filled failed, and tracing-subscriber's report of the failure (`eprintln!` to the same
/// full stderr) panicked: the workers exited 70 and the master 101, with nothing left to
/// recover when space came back. Now the lines are dropped and counted, the server goes on
/// serving and reloading, and when the disk has room again a line says what was lost.
fn issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on(io: Io) {
    let disk = TinyDisk::mount(io.name());
    let dir = &disk.0;
    let (log, access) = (dir.path("error.log"), dir.path("access.log"));
    let mut args = vec![
        "-l",
        "127.0.0.1:0",
        "-w",
        "2",
        "--log-file",
        &log,
        "--access-log",
        &access,
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    args.extend(user_args());
    let server = Server::spawn("http_hello", &io.args(&args), &[]);
    // The lines go to the log file: the addresses are read there.
    dir.wait_for_line("error.log", "master: ready");
    let addr = server_addr(dir);
    let metrics = dir.wait_for_line("error.log", "serving metrics on http://");
    let metrics = metrics
        .split("http://")
        .nth(1)
        .unwrap()
        .trim_end_matches("/metrics")
        .to_owned();
    disk.fill(&[&log, &access]);
    // Every request's access line, and every line of a reload (the master's, the new
    // workers'), meets a full disk.
    for _ in 0..50 {
        assert!(http_text(&addr, "/").starts_with("HTTP/1.1 200 "));
    }
    server.signal(libc::SIGHUP);
    let dropped = |log: &str, role: &str| {
        metric_value(
            &metrics,
            &format!("appsrv_log_lines_dropped_total{{log=\"{log}\",role=\"{role}\"}}"),
        )
    };
    let counted =
        wait_until(|| (dropped("access", "worker") >= 1 && dropped("error", "master") >= 1).then_some(()));
    assert!(
        counted.is_some(),
        "access lines dropped by workers: {}, error lines by the master: {}",
        dropped("access", "worker"),
        dropped("error", "master")
    );
    for _ in 0..20 {
        assert!(
            http_text(&addr, "/").starts_with("HTTP/1.1 200 "),
            "served after a reload on a full disk"
        );
    }
    assert!(alive(server.pid()), "the master lives");
    disk.free();
    // Room again: the next lines are written, and the first says what was lost.
    let seen = wait_until(|| {
        let _ = http_text(&addr, "/");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("writable again").then_some(())
    });
    assert!(
        seen.is_some(),
        "no 'writable again' line:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(
        std::fs::read_to_string(&access).unwrap().contains(" ok "),
        "access lines again"
    );
    drop(server);
}

fn issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on_blocking() {
    issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on(Io::Blocking);
}

fn issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on_event() {
    issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on(Io::Event);
}

fn issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on_hybrid() {
    issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on(Io::Hybrid);
}

/// Issue 31: stderr a pipe whose reader has gone (journald restarted, the terminal
/// closed): the next log line ended the master (`failed printing to stderr`). Now the
/// master reloads, serves and answers its metrics with the lines counted as dropped.
#[test]
fn issue_31_a_closed_stderr_pipe_does_not_end_the_server() {
    let mut args = vec!["-l", "127.0.0.1:0", "-w", "2", "--metrics-listen", "127.0.0.1:0"];
    args.extend(user_args());
    let server = Server::spawn_hanging_up("http_hello", &args, "master: ready");
    server.wait_for_ready();
    let addr = server.tcp_addr().to_string();
    let metrics = server.metrics_addr();
    let sample = "appsrv_log_lines_dropped_total{log=\"error\",role=\"master\"}";
    // The reader thread closes its end right after the ready line; a reload's lines then
    // meet EPIPE. Reload until one has (the first may race the close), at most every
    // 500 ms by the clock: a reload takes time, and a signal on every poll is a storm.
    let mut last_hup: Option<Instant> = None;
    let dropped = wait_until(|| {
        if last_hup.is_none_or(|t| t.elapsed() >= Duration::from_millis(500)) {
            server.signal(libc::SIGHUP);
            last_hup = Some(Instant::now());
        }
        let n = metric_value(&metrics, sample);
        (n > 0).then_some(n)
    });
    assert!(dropped.is_some(), "no error line counted as dropped");
    for _ in 0..20 {
        assert!(http_text(&addr, "/").starts_with("HTTP/1.1 200 "));
    }
    assert!(alive(server.pid()), "the master lives");
    drop(server);
}

/// Issue 31: nothing in the library prints with `print!`, `println!`, `eprint!`,
/// `eprintln!` or `dbg!`, which panic when their write fails (tracing-subscriber's own
/// `eprintln!` is turned off: `process/log.rs`); client commands use `process/console.rs`.
#[test]
fn issue_31_nothing_in_the_library_prints_with_a_macro_that_panics() {
    fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    let code = line.trim_start();
                    if code.starts_with("//") {
                        continue;
                    }
                    let code = code.split(" //").next().unwrap_or(code);
                    for m in ["print!(", "println!(", "eprint!(", "eprintln!(", "dbg!("] {
                        let hit = code.match_indices(m).any(|(i, _)| {
                            i == 0
                                || !code.as_bytes()[i - 1].is_ascii_alphanumeric()
                                    && code.as_bytes()[i - 1] != b'_'
                        });
                        if hit {
                            found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                        }
                    }
                }
            }
        }
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    walk(&src, &mut found);
    assert!(
        found.is_empty(),
        "printing macros in the library:\n{}",
        found.join("\n")
    );
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![
        test(
            "issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on_blocking",
            &[Need::Root],
            issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on_blocking,
        ),
        test(
            "issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on_event",
            &[Need::Root],
            issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on_event,
        ),
        test(
            "issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on_hybrid",
            &[Need::Root],
            issue_31_a_full_log_disk_drops_lines_and_the_server_goes_on_hybrid,
        ),
    ]
}

#[test]
/// Issue 43 (found while writing the one-connection driver): a `handle_client` handler that
/// writes its last bytes and returns without flushing them (the `hello` example greets and
/// returns) was logged `out=0` in blocking mode: the connection was accounted before the
/// client's buffer went out. Its line counts every byte the client got.
fn issue_43_a_handle_client_line_counts_the_bytes_its_handler_left_buffered() {
    use std::io::Read;
    use std::net::TcpStream;
    let dir = LogDir::new("client-out");
    let access = dir.path("access.log");
    let mut args = vec!["-l", "127.0.0.1:0", "-w", "1", "--access-log", &access];
    args.extend(user_args());
    let server = Server::start("hello", &args);
    let mut client = TcpStream::connect(server.tcp_addr()).unwrap();
    client.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut greeting = Vec::new();
    client.read_to_end(&mut greeting).unwrap();
    assert!(
        greeting.starts_with(b"Hello"),
        "{:?}",
        String::from_utf8_lossy(&greeting)
    );
    let line = dir.wait_for_line("access.log", " ok ");
    assert!(
        line.contains(&format!(" in=0 out={} ", greeting.len())),
        "the line counts the {} bytes sent: {line}",
        greeting.len()
    );
}

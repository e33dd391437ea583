//! The core process model, driven through real processes: the `hello` example and the
//! `testbed` server (tests/support/testbed.rs), on ephemeral loopback ports.
//!
//! Regression tests for issue #2 ("appsrv core").

mod util;

use std::collections::HashSet;
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};

use util::*;

fn testbed(workers: usize, extra: &[&str]) -> Server {
    let w = workers.to_string();
    let mut args = vec!["-l", "127.0.0.1:0", "-w", w.as_str()];
    args.extend_from_slice(extra);
    Server::start("testbed", &args)
}

#[test]
fn hello_greets_with_the_client_address() {
    let server = Server::start("hello", &["-l", "127.0.0.1:0", "-w", "2"]);
    let mut client = LineClient::tcp(server.tcp_addr());
    let me = client.get_mut().local_addr().unwrap();
    assert_eq!(client.line(), format!("Hello, Client! You are {me}"));
    assert_eq!(
        client.rest().unwrap(),
        "",
        "the connection closes after the greeting"
    );
}

/// Issue 14: the `echo` example limits its lines to 64 KiB, `\n` included. A client that
/// sends more without a newline (before, the worker kept all of it: one grew to 526 MB)
/// gets an error line and is disconnected; the same worker goes on serving.
#[test]
fn issue_14_echo_limits_its_lines() {
    use std::io::{BufRead, BufReader, Read, Write};
    let server = Server::start("echo", &["-l", "127.0.0.1:0", "-w", "1"]);
    let addr = server.tcp_addr();
    let worker = server.wait_for_workers(1);
    let mut c = LineClient::tcp(addr);
    let longest = "x".repeat(64 * 1024 - 1);
    assert!(c.ask(&longest) == longest, "a line at the limit is echoed whole");
    drop(c);
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    // Written by another thread: the server stops reading, so the write may block until
    // the connection is closed (then it fails, which is expected).
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&vec![b'y'; 1 << 20]);
    });
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).expect("an error line");
    assert_eq!(line, "error: line too long (limit 65536 bytes)\n");
    let mut rest = Vec::new();
    match r.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "nothing after the error: {} bytes", rest.len()),
        // Closed with the rest of the line unread: the kernel resets the connection.
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
    writer.join().unwrap();
    let mut c = LineClient::tcp(addr);
    assert_eq!(c.ask("still serving"), "still serving");
    assert_eq!(server.worker_pids(), worker, "the same worker serves");
}

#[test]
fn concurrent_slow_clients_are_served_by_distinct_workers() {
    let server = testbed(4, &[]);
    let mut clients: Vec<_> = (0..4).map(|_| LineClient::tcp(server.tcp_addr())).collect();
    let pids: HashSet<i32> = clients.iter_mut().map(|c| c.testbed_pid()).collect();
    assert_eq!(pids.len(), 4, "each connection holds its own worker");
    assert_eq!(pids, server.worker_pids(), "and those are the master's workers");
    for c in &mut clients {
        assert_eq!(c.ask("still there?"), "still there?");
    }
}

#[test]
fn a_worker_killed_mid_connection_is_replaced() {
    let server = testbed(2, &[]);
    let mut victim = LineClient::tcp(server.tcp_addr());
    let pid = victim.testbed_pid();
    // SAFETY: kill(2) on a worker of our server.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let line = server.wait_for_log(&format!("(pid {pid}) was killed by signal SIGKILL"));
    assert!(line.contains("starting a replacement"), "{line}");
    assert!(matches!(victim.rest(), Ok(s) if s.is_empty()) || victim.rest().is_err());
    let workers = server.wait_for_workers(2);
    assert!(!workers.contains(&pid));
    let mut a = LineClient::tcp(server.tcp_addr());
    let mut b = LineClient::tcp(server.tcp_addr());
    let served: HashSet<i32> = [a.testbed_pid(), b.testbed_pid()].into();
    assert_eq!(
        served, workers,
        "new clients are served by the pool, replacement included"
    );
}

#[test]
fn killing_the_master_leaves_no_worker() {
    let server = testbed(3, &[]);
    let workers = server.wait_for_workers(3);
    server.signal(libc::SIGKILL);
    let gone = wait_until(|| workers.iter().all(|p| !alive(*p)).then_some(()));
    assert!(gone.is_some(), "workers outlived their master: {workers:?}");
}

#[test]
fn a_handler_panic_only_ends_its_own_connection() {
    let server = testbed(2, &[]);
    let mut doomed = LineClient::tcp(server.tcp_addr());
    let mut bystander = LineClient::tcp(server.tcp_addr());
    let doomed_pid = doomed.testbed_pid();
    let _ = bystander.testbed_pid();
    let doomed_addr = doomed.get_mut().local_addr().unwrap();

    doomed.send("panic");
    assert!(
        doomed.rest().map_or(true, |s| s.is_empty()),
        "the panicking connection is closed"
    );
    let line = server.wait_for_log("handler panicked while serving");
    assert!(line.contains(&doomed_addr.to_string()), "names the peer: {line}");
    assert!(
        line.contains("testbed: panic requested by the client"),
        "names the panic: {line}"
    );
    assert_eq!(bystander.ask("unaffected"), "unaffected");
    server.wait_for_log(&format!("(pid {doomed_pid}) exited with status 70 after a panic"));
    let workers = server.wait_for_workers(2);
    assert!(!workers.contains(&doomed_pid), "the worker was replaced");
}

#[test]
fn a_failing_factory_stops_the_server_with_its_error() {
    let mut server = Server::spawn(
        "testbed",
        &["-l", "127.0.0.1:0", "-w", "2", "--fail-factory"],
        &[],
    );
    let status = server.wait_exit();
    assert!(!status.success(), "{status:?}");
    server.wait_for_log_end();
    let log = server.log_text();
    assert!(
        log.contains("\nerror: worker") && log.contains("database unavailable (testbed --fail-factory)"),
        "the error reaches the terminal:\n{log}"
    );
    assert_eq!(
        log.matches("; stopping").count(),
        1,
        "one error, not one per worker:\n{log}"
    );
    assert!(!group_alive(server.pid()), "nothing is left running");
}

#[test]
fn read_timeouts_apply_to_tcp_and_unix_connections() {
    let path = socket_path("timeouts");
    let unix = format!("unix:{path}");
    let server = Server::start(
        "testbed",
        &[
            "-l",
            "127.0.0.1:0",
            "-l",
            &unix,
            "-w",
            "2",
            "--read-timeout",
            "0.5",
        ],
    );
    let mut t = LineClient::tcp(server.tcp_addr());
    let mut u = LineClient::unix(&path);
    t.testbed_pid();
    u.testbed_pid();
    // Both stay silent: the server must time them out (TCP connections inherit the
    // listener's timeout, Unix ones get it set on accept), not wait for ever.
    assert_eq!(t.rest().unwrap(), "", "idle TCP client closed");
    assert_eq!(u.rest().unwrap(), "", "idle Unix client closed");
    server.wait_for_nth_log("timed out waiting for the peer", 2);
}

#[test]
fn a_read_that_timed_out_does_not_replay_old_input() {
    let server = testbed(2, &["--read-timeout", "0.3"]);
    let mut c = LineClient::tcp(server.tcp_addr());
    c.testbed_pid();
    assert_eq!(c.ask("tolerate-timeouts"), "ok");
    assert_eq!(c.ask("first"), "first");
    assert_eq!(c.line(), "timeout", "the handler saw the timeout");
    assert_eq!(
        c.ask("second"),
        "second",
        "and then new input, not \"first\" again"
    );
}

#[test]
fn a_server_with_several_listeners_stops_cleanly() {
    let path = socket_path("multi-stop");
    let mut server = Server::start(
        "testbed",
        &["-l", "127.0.0.1:0", "-l", &format!("unix:{path}"), "-w", "2"],
    );
    let workers = server.worker_pids();
    server.signal(libc::SIGTERM);
    assert!(server.wait_exit().success());
    assert!(wait_until(|| workers.iter().all(|p| !alive(*p)).then_some(())).is_some());
}

#[test]
fn term_lets_a_dialogue_finish_and_refuses_new_connections() {
    let mut server = testbed(2, &[]);
    let addr = server.tcp_addr();
    let mut client = LineClient::tcp(addr);
    client.testbed_pid();
    server.signal(libc::SIGTERM);
    server.wait_for_log("SIGTERM received");
    let refused = wait_until(|| match TcpStream::connect(addr) {
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Some(()),
        _ => None,
    });
    assert!(refused.is_some(), "new connections are refused while stopping");
    for i in 0..5 {
        let msg = format!("line {i}");
        assert_eq!(client.ask(&msg), msg, "the connected client is still served");
    }
    assert!(
        server.worker_pids().len() == 1,
        "the idle worker has exited, the busy one not"
    );
    drop(client);
    let status = server.wait_exit();
    assert!(status.success(), "clean stop exits 0: {status:?}");
    assert!(server.log_text().contains("stopped"));
}

#[test]
fn the_grace_period_bounds_a_stop() {
    let mut server = testbed(2, &["--grace-period", "1"]);
    let mut client = LineClient::tcp(server.tcp_addr());
    client.testbed_pid();
    server.signal(libc::SIGQUIT);
    server.wait_for_log("grace period of 1s over: killing 1 worker(s)");
    assert!(server.wait_exit().success());
    assert!(
        client.rest().map_or(true, |s| s.is_empty()),
        "the lingering connection is closed"
    );
}

#[test]
fn a_second_stop_signal_stops_at_once() {
    let mut server = testbed(2, &[]);
    let mut client = LineClient::tcp(server.tcp_addr());
    client.testbed_pid();
    server.signal(libc::SIGINT);
    server.wait_for_log("SIGINT received: stopping");
    // A repeat within a second counts as the same request; keep asking until one counts.
    let stopped = wait_until(|| {
        server.signal(libc::SIGINT);
        std::thread::sleep(std::time::Duration::from_millis(200));
        server
            .log_text()
            .contains("received again: stopping now")
            .then_some(())
    });
    assert!(stopped.is_some(), "log:\n{}", server.log_text());
    assert!(server.wait_exit().success());
}

#[test]
fn binding_an_address_in_use_fails_clearly() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut server = Server::spawn("testbed", &["-l", &addr, "-w", "2"], &[]);
    let status = server.wait_exit();
    assert!(!status.success());
    server.wait_for_log_end();
    let log = server.log_text();
    assert!(
        log.contains(&format!("cannot listen on {addr}")) && log.contains("Address already in use"),
        "names the address and the cause:\n{log}"
    );
    assert!(!group_alive(server.pid()), "no process is left behind");
}

#[test]
fn tcp_and_unix_listeners_are_both_served() {
    let path = socket_path("both");
    let unix = format!("unix:{path}?mode=0600");
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-l", &unix, "-w", "2"]);
    assert_eq!(server.listening().len(), 2);
    let mut t = LineClient::tcp(server.tcp_addr());
    let mut u = LineClient::unix(&path);
    t.testbed_pid();
    u.testbed_pid();
    assert_eq!(u.ask("over unix"), "over unix");
    assert_eq!(t.ask("over tcp"), "over tcp");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn the_unix_socket_file_is_removed_on_a_clean_stop() {
    let path = socket_path("cleanup");
    let mut server = Server::start("testbed", &["-l", &format!("unix:{path}"), "-w", "2"]);
    assert!(std::path::Path::new(&path).exists());
    server.signal(libc::SIGTERM);
    assert!(server.wait_exit().success());
    assert!(!std::path::Path::new(&path).exists());
}

fn an_ipv6_listener_on_loopback_is_served() {
    let server = Server::start("testbed", &["-l", "[::1]:0", "-w", "2"]);
    let addr = server.tcp_addr();
    assert!(addr.is_ipv6());
    let mut c = LineClient::tcp(addr);
    c.testbed_pid();
    assert_eq!(c.ask("v6"), "v6");
}

#[test]
fn environment_overrides_code_and_flags_override_environment() {
    let env = [("HELLO_LISTEN", "127.0.0.1:0"), ("HELLO_WORKERS", "3")];
    let server = Server::start_with_env("hello", &[], &env);
    assert!(
        server.tcp_addr().port() != 7000,
        "the environment replaced the code default"
    );
    server.wait_for_workers(3);
    drop(server);
    let server = Server::start_with_env("hello", &["--workers", "2"], &env);
    server.wait_for_workers(2);
}

#[test]
fn crash_looping_workers_back_off_and_recover() {
    let marker = std::env::temp_dir().join(format!("appsrv-crash-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let server = testbed(2, &["--crash-if-exists", marker.to_str().unwrap()]);
    std::fs::write(&marker, b"").unwrap();
    let victim = *server.worker_pids().iter().next().unwrap();
    // SAFETY: kill(2) on a worker of our server.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let line = server.wait_for_log("workers keep failing to start");
    assert!(line.contains("exponential back-off"), "{line}");
    assert!(line.contains("exited with status 3"), "names the cause: {line}");
    std::fs::remove_file(&marker).unwrap();
    server.wait_for_log("workers are starting normally again");
    server.wait_for_workers(2);
    let log = server.log_text();
    let errors = log.matches("workers keep failing to start").count();
    assert_eq!(errors, 1, "one clear error line per episode, not one per death");
    // The back-off must hold even though the other worker, started before the failures,
    // stays alive the whole time (it proves nothing about new workers).
    let deaths = log.matches("exited with status 3").count();
    assert!(
        deaths <= 12,
        "{deaths} failed starts: the back-off did not slow them down"
    );
}

#[test]
fn every_descriptor_is_close_on_exec_and_workers_hold_only_theirs() {
    let path = socket_path("fds");
    let server = Server::start(
        "testbed",
        &["-l", "127.0.0.1:0", "-l", &format!("unix:{path}"), "-w", "2"],
    );
    let fds = |pid: i32| -> Vec<(u32, u64)> {
        std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let fd: u32 = e.file_name().to_str()?.parse().ok()?;
                let info = std::fs::read_to_string(e.path()).ok()?;
                let flags = info.lines().find_map(|l| l.strip_prefix("flags:"))?.trim();
                Some((fd, u64::from_str_radix(flags, 8).ok()?))
            })
            .collect()
    };
    const O_CLOEXEC: u64 = 0o2000000;
    for pid in std::iter::once(server.pid()).chain(server.worker_pids()) {
        for (fd, flags) in fds(pid) {
            if fd > 2 {
                assert!(
                    flags & O_CLOEXEC != 0,
                    "fd {fd} of pid {pid} is not close-on-exec"
                );
            }
        }
    }
    for pid in server.worker_pids() {
        // stdio, two listeners, the notification pipe, the master's wake-up eventfd, the
        // epoll instance, its own end of its log channel (not the master's ends of any
        // worker's); not the scoreboard's memfd (the mapping is enough, and a worker
        // holding it could try to resize it). A worker makes its epoll instance just after
        // it reports ready: wait for it rather than race it.
        let expected = 3 + 2 + 1 + 1 + 1 + 1;
        let settled = wait_until(|| (fds(pid).len() >= expected).then_some(()));
        assert!(
            settled.is_some() && fds(pid).len() == expected,
            "worker {pid} holds unexpected descriptors: {:?}",
            fds(pid)
        );
    }
}

#[test]
fn no_listen_address_is_a_clear_error() {
    let mut server = Server::spawn("testbed", &["-w", "2"], &[]);
    assert!(!server.wait_exit().success());
    server.wait_for_log_end();
    assert!(
        server
            .log_text()
            .contains("no listen address: give -l/--listen ADDR"),
        "{}",
        server.log_text()
    );
}

/// The fork rules: commands a worker spawns get default dispositions, so a worker does not
/// keep the ignored signals its master inherited (from `nohup`, or a shell's `trap ''`).
#[test]
fn workers_do_not_keep_signals_the_master_inherited_ignored() {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args(["-c", "trap '' XFSZ PROF; exec \"$0\" \"$@\""])
        .arg(example("testbed"))
        .args(["-l", "127.0.0.1:0", "-w", "1"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0);
    let server = Server::from_command(cmd);
    server.wait_for_ready();
    let ignored = |pid: i32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let mask = status.lines().find_map(|l| l.strip_prefix("SigIgn:")).unwrap();
        u64::from_str_radix(mask.trim(), 16).unwrap()
    };
    let bit = |sig: i32| 1u64 << (sig - 1);
    let inherited = bit(libc::SIGXFSZ) | bit(libc::SIGPROF);
    assert_eq!(ignored(server.pid()) & inherited, inherited, "the test's set-up");
    let worker = *server.wait_for_workers(1).iter().next().unwrap();
    let mask = ignored(worker);
    assert_eq!(mask & inherited, 0, "worker SigIgn {mask:x}");
    assert_ne!(
        mask & bit(libc::SIGPIPE),
        0,
        "SIGPIPE stays ignored in the worker"
    );
}

/// The descriptors issue 14's adversarial run found in workers, as a careless launcher
/// leaves them: `/dev/null` at 10, a pipe's write end at 251 (the sources are kept high, so
/// that neither number is taken by this process's own copy).
struct Strays {
    null: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
    read: std::fs::File,
}

impl Strays {
    fn new() -> Strays {
        use std::os::fd::AsFd;
        let null = std::fs::File::open("/dev/null").unwrap();
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        nix::fcntl::fcntl(
            &read,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
        Strays {
            null: high_dup(null.as_fd()),
            write: high_dup(write.as_fd()),
            read: read.into(),
        }
    }

    /// What `/proc/PID/fd/N` reads for a descriptor of the pipe.
    fn pipe_link(&self) -> std::path::PathBuf {
        use std::os::unix::fs::MetadataExt;
        format!("pipe:[{}]", self.read.metadata().unwrap().ino()).into()
    }

    /// Starts the testbed with `args`, inheriting the strays at 10 and 251, and waits for it
    /// to be ready. This process's write end of the pipe is closed then: only the server
    /// can still hold one.
    fn start(self, args: &[&str]) -> (Server, std::fs::File) {
        use std::os::fd::AsFd;
        let mut cmd = std::process::Command::new(example("testbed"));
        cmd.args(args);
        let server = Server::spawn_inheriting(cmd, &[(self.null.as_fd(), 10), (self.write.as_fd(), 251)]);
        drop(self.write);
        server.wait_for_ready();
        (server, self.read)
    }
}

/// What each descriptor of `pid` names (`/proc/PID/fd/N`'s link).
fn fd_links(pid: i32) -> Vec<(i32, std::path::PathBuf)> {
    open_fds(pid)
        .into_iter()
        .filter_map(|fd| Some((fd, std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?)))
        .collect()
}

/// daemon(7): a descriptor the launcher left open does not stay open in the master and in
/// every worker (forked or re-executed), where it would, say, keep a pipe the launcher
/// waits on from ever reaching end of file.
#[test]
fn issue_14_descriptors_inherited_from_the_launcher_are_closed() {
    use std::io::Read;
    for extra in [&[][..], &["--exec-workers"][..]] {
        // At debug: the line that says so is a debug line (issue 34).
        let mut args = vec!["-l", "127.0.0.1:0", "-w", "2", "--log-level", "debug"];
        args.extend_from_slice(extra);
        let strays = Strays::new();
        let pipe = strays.pipe_link();
        let (server, mut read) = strays.start(&args);
        let workers = server.wait_for_workers(2);
        LineClient::tcp(server.tcp_addr()).testbed_pid();
        // By what they are, not by number: the master reuses the numbers it freed.
        for pid in std::iter::once(server.pid()).chain(workers) {
            let held = fd_links(pid);
            assert!(
                !held
                    .iter()
                    .any(|(fd, l)| *fd > 2 && (*l == pipe || l.as_os_str() == "/dev/null")),
                "{extra:?}: pid {pid} (master {}) holds a stray: {held:?}",
                server.pid()
            );
        }
        let eof = wait_until(|| matches!(read.read(&mut [0u8; 16]), Ok(0)).then_some(()));
        assert!(
            eof.is_some(),
            "{extra:?}: the launcher's pipe never reached end of file"
        );
        assert!(
            server
                .log_text()
                .contains("closed 2 descriptor(s) inherited from the process that started this one"),
            "{}",
            server.log_text()
        );
    }
}

/// `Server::keep_fd`: a descriptor the application names stays open, in the master and in
/// its workers; the others are closed all the same.
#[test]
fn issue_14_keep_fd_keeps_the_descriptor_it_names() {
    let strays = Strays::new();
    let pipe = strays.pipe_link();
    let (server, _read) = strays.start(&["-l", "127.0.0.1:0", "-w", "2", "--keep-fd", "10"]);
    for pid in std::iter::once(server.pid()).chain(server.wait_for_workers(2)) {
        let held = fd_links(pid);
        assert_eq!(
            held.iter().find(|(fd, _)| *fd == 10).map(|(_, l)| l.as_os_str()),
            Some("/dev/null".as_ref()),
            "pid {pid} (master {}): fd 10 kept: {held:?}",
            server.pid()
        );
        assert!(
            !held.iter().any(|(_, l)| *l == pipe),
            "pid {pid}: the pipe closed: {held:?}"
        );
    }
}

#[test]
fn keep_fd_refuses_a_negative_number() {
    let mut server = Server::spawn("testbed", &["-l", "127.0.0.1:0", "--keep-fd=-1"], &[]);
    assert!(!server.wait_exit().success());
    server.wait_for_log_end();
    assert!(
        server.log_text().contains("keep_fd(-1): not a descriptor number"),
        "{}",
        server.log_text()
    );
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![test(
        "an_ipv6_listener_on_loopback_is_served",
        &[Need::Ipv6Loopback],
        an_ipv6_listener_on_loopback_is_served,
    )]
}

//! Confinement of workers: `--sandbox` (Landlock and seccomp), `--chroot`, resource
//! limits, umask and no-new-privs, each checked from inside a worker (the testbed's probes)
//! and from `/proc`, with the master left unconfined.
//!
//! Regression tests for issue #10 ("The XML-RPC run-as example, chroot, and sandboxed
//! workers"), the confinement part.

mod util;

use std::path::PathBuf;
use std::process::Command;

use util::*;

/// A scratch directory, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("appsrv-confine-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // The workers run as nobody when the tests run as root.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        Dir(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A field of `/proc/PID/status` (`Seccomp`, `NoNewPrivs`, `Umask`).
fn status_field(pid: i32, field: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_owned()
}

fn only_worker(server: &Server) -> i32 {
    let workers = server.wait_for_workers(1);
    *workers.iter().next().unwrap()
}

#[test]
fn a_sandboxed_worker_opens_only_its_paths_and_makes_only_allowed_calls() {
    let dir = Dir::new("sandbox");
    let allowed = dir.0.join("allowed");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::set_permissions(&allowed, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::write(allowed.join("in.txt"), "inside").unwrap();
    std::fs::write(dir.0.join("out.txt"), "outside").unwrap();
    let allowed = allowed.to_string_lossy().into_owned();
    let server = Server::start(
        "testbed",
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "1",
            "--sandbox",
            "--sandbox-write",
            &allowed,
        ],
    );
    let worker = only_worker(&server);
    let mut c = LineClient::tcp(server.tcp_addr());
    assert_eq!(c.testbed_pid(), worker);

    assert_eq!(
        status_field(worker, "Seccomp"),
        "2",
        "the worker runs under a filter"
    );
    assert_eq!(status_field(worker, "NoNewPrivs"), "1");
    assert_eq!(
        status_field(server.pid(), "Seccomp"),
        "0",
        "the master is unconfined"
    );
    assert_eq!(status_field(server.pid(), "NoNewPrivs"), "0");

    // System calls: threads yes; new sockets, exec (fork) and setuid no.
    assert_eq!(c.ask("thread"), "thread ok 42");
    assert_eq!(c.ask("socket"), format!("socket error {}", libc::EPERM));
    assert!(
        c.ask("exec").starts_with("exec error"),
        "a sandboxed worker cannot run commands"
    );
    assert_eq!(c.ask("root"), "root error");

    // Files: only beneath --sandbox-write (and --sandbox-read), when the kernel has Landlock.
    if server.log_text().contains("does not support Landlock") {
        eprintln!("skipping the file checks: this kernel has no Landlock");
    } else {
        assert_eq!(c.ask(&format!("open {allowed}/in.txt")), "open ok 6 bytes");
        assert_eq!(c.ask(&format!("write {allowed}/new.txt")), "write ok");
        assert_eq!(
            c.ask(&format!("open {}", dir.path("out.txt"))),
            "open error PermissionDenied"
        );
        assert_eq!(c.ask("open /etc/hostname"), "open error PermissionDenied");
        assert_eq!(
            c.ask(&format!("write {}", dir.path("new.txt"))),
            "write error PermissionDenied"
        );
    }
    // Refused calls are errors, not crashes: the same worker goes on serving.
    assert_eq!(c.ask("still there?"), "still there?");
    assert_eq!(server.worker_pids(), [worker].into_iter().collect());
}

#[test]
fn without_the_sandbox_the_same_probes_succeed() {
    // The control experiment: the probes above fail because of the sandbox, not the test.
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "1"]);
    let worker = only_worker(&server);
    let mut c = LineClient::tcp(server.tcp_addr());
    c.testbed_pid();
    assert_eq!(status_field(worker, "Seccomp"), "0");
    assert_eq!(c.ask("socket"), "socket ok");
    assert_eq!(c.ask("exec"), "exec ok exit status: 0");
    assert!(c.ask("open /etc/hostname").starts_with("open ok"));
}

fn chroot_confines_the_workers_file_access() {
    let dir = Dir::new("chroot");
    std::fs::write(dir.0.join("inside.txt"), "in the jail").unwrap();
    let root = dir.0.to_string_lossy().into_owned();
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "1", "--chroot", &root]);
    let worker = only_worker(&server);
    let mut c = LineClient::tcp(server.tcp_addr());
    c.testbed_pid();
    assert_eq!(c.ask("open /inside.txt"), "open ok 11 bytes");
    assert_eq!(c.ask("open /etc/hostname"), "open error NotFound");
    assert_eq!(std::fs::read_link(format!("/proc/{worker}/root")).unwrap(), dir.0);
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/root", server.pid())).unwrap(),
        PathBuf::from("/"),
        "the master is not chrooted"
    );
}

#[test]
fn resource_limits_umask_and_no_new_privs_apply_to_workers_only() {
    let server = Server::start(
        "testbed",
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "1",
            "--rlimit-nofile",
            "200",
            "--rlimit-core",
            "0",
            "--rlimit-as",
            "4096",
            "--umask",
            "027",
            "--no-new-privs",
        ],
    );
    let worker = only_worker(&server);
    let limits = std::fs::read_to_string(format!("/proc/{worker}/limits")).unwrap();
    let limit = |name: &str| -> Vec<String> {
        let line = limits.lines().find(|l| l.starts_with(name)).unwrap();
        line[name.len()..]
            .split_whitespace()
            .take(2)
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(limit("Max open files"), ["200", "200"]);
    assert_eq!(limit("Max core file size"), ["0", "0"]);
    assert_eq!(limit("Max address space"), ["4294967296", "4294967296"]);
    assert_eq!(status_field(worker, "Umask"), "0027");
    assert_eq!(status_field(worker, "NoNewPrivs"), "1");
    assert_eq!(
        status_field(worker, "Seccomp"),
        "0",
        "no sandbox without --sandbox"
    );
    assert_eq!(
        status_field(server.pid(), "NoNewPrivs"),
        "0",
        "the master keeps its own"
    );
    let mut c = LineClient::tcp(server.tcp_addr());
    c.testbed_pid();
    assert_eq!(c.ask("hello"), "hello", "the worker serves");
}

#[test]
fn bad_confinement_settings_stop_the_server_with_a_message() {
    let run = |args: &[&str]| {
        let out = Command::new(example("testbed")).args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = run(&["check", "-l", "127.0.0.1:0", "--chroot", "/nonexistent-appsrv"]);
    assert!(
        !ok && err.contains("--chroot /nonexistent-appsrv: not a directory"),
        "{err}"
    );
    let (ok, err) = run(&["run", "-l", "127.0.0.1:0", "--chroot", "/nonexistent-appsrv"]);
    assert!(
        !ok && err.contains("not a directory") && !err.contains(" ready"),
        "{err}"
    );
    let (ok, err) = run(&[
        "run",
        "-l",
        "127.0.0.1:0",
        "-w",
        "1",
        "--sandbox",
        "--sandbox-read",
        "/nonexistent-appsrv",
    ]);
    assert!(!ok, "{err}");
    assert!(err.contains("sandbox path /nonexistent-appsrv"), "{err}");
    let (ok, err) = run(&["run", "-l", "127.0.0.1:0", "--umask", "999"]);
    assert!(!ok && err.contains("expected octal permissions"), "{err}");
}

/// Regression (review of issue #10): the kernel resumes a sleep interrupted by SIGSTOP and
/// SIGCONT with restart_syscall, which the sandbox refused, so the handler failed.
#[test]
fn a_sandboxed_worker_stopped_and_continued_mid_sleep_carries_on() {
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "1", "--sandbox"]);
    let worker = only_worker(&server);
    let mut c = LineClient::tcp(server.tcp_addr());
    c.testbed_pid();
    c.send("sleep 2");
    // Wait until the worker is in the sleep (the first field of /proc/PID/syscall).
    let sleeping = wait_until(|| {
        let s = std::fs::read_to_string(format!("/proc/{worker}/syscall")).ok()?;
        let nr: i64 = s.split_whitespace().next()?.parse().ok()?;
        (nr == libc::SYS_clock_nanosleep || nr == libc::SYS_nanosleep).then_some(())
    });
    assert!(sleeping.is_some(), "the worker never slept");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(worker, libc::SIGSTOP);
        libc::kill(worker, libc::SIGCONT);
    }
    assert_eq!(c.line(), "slept");
    assert_eq!(server.worker_pids(), [worker].into_iter().collect());
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![test(
        "chroot_confines_the_workers_file_access",
        &[Need::Root],
        chroot_confines_the_workers_file_access,
    )]
}

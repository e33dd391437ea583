//! `--exec-workers`: each worker executes the program again after the fork, so it gets an
//! address-space layout of its own; the program is the one the master started from, even
//! when the file on disk has been replaced since.
//!
//! Regression tests for issue #10 ("The XML-RPC run-as example, chroot, and sandboxed
//! workers"), the exec-workers part.

mod util;

use std::collections::HashSet;
use std::process::Command;

use util::*;

/// Where the program's first mapping (its ELF header) starts: the binary's load address.
fn load_address(pid: i32) -> String {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.split('-').next().unwrap().to_owned()
}

fn aslr_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/randomize_va_space").is_ok_and(|v| v.trim() != "0")
}

#[test]
fn exec_workers_each_get_their_own_address_layout() {
    if !aslr_enabled() {
        eprintln!("skipping: address-space layout randomization is off on this machine");
        return;
    }
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "3", "--exec-workers"]);
    let workers = server.wait_for_workers(3);
    let master = load_address(server.pid());
    let bases: HashSet<String> = workers.iter().map(|w| load_address(*w)).collect();
    assert_eq!(bases.len(), 3, "three workers, three layouts: {bases:?}");
    assert!(!bases.contains(&master), "no worker shares the master's layout");
    // They are workers like any other: each serves, and runs the same program.
    let mut c = LineClient::tcp(server.tcp_addr());
    assert!(workers.contains(&c.testbed_pid()));
    assert_eq!(c.ask("hello"), "hello");
    for w in &workers {
        assert_eq!(
            std::fs::read_link(format!("/proc/{w}/exe")).unwrap(),
            std::fs::read_link(format!("/proc/{}/exe", server.pid())).unwrap()
        );
    }

    // The control experiment: forked workers share the master's layout.
    let forked = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "2"]);
    let master = load_address(forked.pid());
    for w in forked.wait_for_workers(2) {
        assert_eq!(load_address(w), master, "a forked worker is a copy of the master");
    }
}

#[test]
fn a_worker_started_after_the_binary_was_replaced_runs_the_original_program() {
    let dir = std::env::temp_dir().join(format!("appsrv-exec-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("server");
    // cp, not std::fs::copy: a file this (multi-threaded) test process has open for
    // writing can leak into a child another test forks, and exec would fail with ETXTBSY.
    let copy = |from: &std::path::Path| {
        assert!(
            Command::new("cp")
                .arg(from)
                .arg(&path)
                .status()
                .unwrap()
                .success()
        );
    };
    copy(&example("testbed"));
    let mut server = Server::start_path(&path, &["-l", "127.0.0.1:0", "-w", "1", "--exec-workers"]);
    let first = *server.wait_for_workers(1).iter().next().unwrap();

    // Another program at the same path (the echo example sends no greeting).
    std::fs::remove_file(&path).unwrap();
    copy(&example("echo"));
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(first, libc::SIGKILL) };
    let second = wait_until(|| {
        let now = server.worker_pids();
        (now.len() == 1 && !now.contains(&first)).then(|| *now.iter().next().unwrap())
    })
    .expect("a replacement worker");
    let mut c = LineClient::tcp(server.tcp_addr());
    assert_eq!(
        c.testbed_pid(),
        second,
        "the replacement runs testbed, not the new file"
    );
    let exe = std::fs::read_link(format!("/proc/{second}/exe")).unwrap();
    assert!(exe.to_string_lossy().ends_with("(deleted)"), "{}", exe.display());
    drop(c); // a testbed connection lasts until the client leaves
    server.signal(libc::SIGTERM);
    assert!(server.wait_exit().success());
    let _ = std::fs::remove_dir_all(&dir);
}

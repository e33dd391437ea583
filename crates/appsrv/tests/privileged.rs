//! The privileged helper (issue 18), through the testbed with `--helper`: the worker that
//! reads the network runs as nobody without capabilities; its helper keeps root with only
//! the capability it names, holds nothing of the worker's, hands descriptors over, and a
//! helper that dies costs one call, not the service.

mod util;

use util::needs::{Need, test};
use util::*;

/// Every test here needs root: run by a harness of its own, which reports them ignored,
/// with the reason, elsewhere (issue 41).
fn main() -> std::process::ExitCode {
    const ROOT: &[Need] = &[Need::Root];
    util::needs::main(vec![
        test(
            "issue_18_the_worker_is_unprivileged_and_its_helper_narrow",
            ROOT,
            issue_18_the_worker_is_unprivileged_and_its_helper_narrow,
        ),
        test(
            "issue_18_a_descriptor_the_helper_opens_reaches_the_worker",
            ROOT,
            issue_18_a_descriptor_the_helper_opens_reaches_the_worker,
        ),
        test(
            "issue_18_a_killed_helper_fails_one_call_and_the_worker_is_replaced",
            ROOT,
            issue_18_a_killed_helper_fails_one_call_and_the_worker_is_replaced,
        ),
        test(
            "issue_18_a_slow_helper_is_a_timeout_and_a_late_answer_is_dropped",
            ROOT,
            issue_18_a_slow_helper_is_a_timeout_and_a_late_answer_is_dropped,
        ),
        test(
            "issue_18_a_helper_that_cannot_start_stops_the_server_with_its_reason",
            ROOT,
            issue_18_a_helper_that_cannot_start_stops_the_server_with_its_reason,
        ),
        test(
            "issue_18_the_helper_logs_to_the_reopened_file",
            ROOT,
            issue_18_the_helper_logs_to_the_reopened_file,
        ),
        test(
            "issue_18_a_helper_that_dies_while_its_worker_is_idle_is_replaced_at_once",
            ROOT,
            issue_18_a_helper_that_dies_while_its_worker_is_idle_is_replaced_at_once,
        ),
    ])
}

fn status_field(pid: i32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

fn helper_pid(c: &mut LineClient<std::net::TcpStream>) -> i32 {
    let answer = c.ask("helper pid");
    answer
        .strip_prefix("helper pid ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{answer}"))
}

fn issue_18_the_worker_is_unprivileged_and_its_helper_narrow() {
    // Forked workers, sandboxed ones, and re-executed ones (whose helper is forked by the
    // re-executed worker).
    for (sandbox, exec) in [(false, false), (true, false), (false, true)] {
        let mut args = vec!["-l", "127.0.0.1:0", "-w", "1", "--helper"];
        if sandbox {
            args.push("--sandbox");
        }
        if exec {
            args.push("--exec-workers");
        }
        let server = Server::start("testbed", &args);
        let mut c = LineClient::tcp(server.tcp_addr());
        let worker = c.testbed_pid();
        // The worker: nobody, no capability at all.
        assert_eq!(
            status_field(worker, "Uid:").split_whitespace().next(),
            Some("65534")
        );
        assert_eq!(
            status_field(worker, "Gid:").split_whitespace().next(),
            Some("65534")
        );
        assert_eq!(status_field(worker, "CapEff:"), "0000000000000000");
        assert_eq!(status_field(worker, "CapPrm:"), "0000000000000000");
        if sandbox {
            assert_eq!(status_field(worker, "NoNewPrivs:"), "1");
            assert_eq!(status_field(worker, "Seccomp:"), "2");
        }
        // Its helper: root, CAP_DAC_OVERRIDE (bit 1) only, even in the bounding set; stdio
        // and its channel only: no listener, no client socket.
        let helper = helper_pid(&mut c);
        assert!(
            children_of(worker).contains(&helper),
            "the helper is the worker's child"
        );
        assert_eq!(
            c.ask("helper whoami"),
            "helper uid=0 gid=0 capeff=0000000000000002 capbnd=0000000000000002 fds=4"
        );
        if sandbox {
            // Its own profile (Server::privileged_sandbox), which its commands inherit.
            assert_eq!(status_field(helper, "NoNewPrivs:"), "1");
            assert_eq!(status_field(helper, "Seccomp:"), "2");
        }
        assert_eq!(status_field(helper, "CapInh:"), "0000000000000000");
        assert_eq!(status_field(helper, "CapAmb:"), "0000000000000000");
        let mut fds: Vec<i32> = open_fds(helper).into_iter().collect();
        fds.sort_unstable();
        assert_eq!(
            fds.len(),
            4,
            "helper {helper} holds only stdio and its channel: {fds:?}"
        );
        assert_eq!(fds[..3], [0, 1, 2]);
        let channel = std::fs::read_link(format!("/proc/{helper}/fd/{}", fds[3])).unwrap();
        assert!(channel.to_string_lossy().starts_with("socket:"), "{channel:?}");
        assert!(children_of(helper).is_empty());
        // The worker, with the `root` probe, cannot regain root.
        assert_eq!(c.ask("root"), "root error");
    }
}

fn issue_18_a_descriptor_the_helper_opens_reaches_the_worker() {
    let dir = std::env::temp_dir().join(format!("appsrv-priv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, b"0123456789").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "1", "--helper"]);
    let mut c = LineClient::tcp(server.tcp_addr());
    c.testbed_pid();
    let path = secret.display().to_string();
    assert_eq!(
        c.ask(&format!("open {path}")),
        "open error PermissionDenied",
        "the worker itself cannot"
    );
    assert_eq!(c.ask(&format!("helper open {path}")), "helper opened 10 bytes");
    assert_eq!(c.ask("helper open /nonexistent"), "helper error NotFound");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

fn issue_18_a_killed_helper_fails_one_call_and_the_worker_is_replaced() {
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "1", "--helper"]);
    let mut c = LineClient::tcp(server.tcp_addr());
    let worker = c.testbed_pid();
    let helper = helper_pid(&mut c);
    // SAFETY: kill(2) on the helper this test's server started.
    unsafe { libc::kill(helper, libc::SIGKILL) };
    assert_eq!(c.ask("helper pid"), "helper error the privileged helper is gone");
    drop(c);
    server.wait_for_log("the privileged helper is gone: this worker stops after its connection");
    // The master replaces the worker, which has a helper of its own.
    let replaced = wait_until(|| {
        let mut c = LineClient::tcp(server.tcp_addr());
        let pid = c.testbed_pid();
        (pid != worker).then(|| helper_pid(&mut c))
    });
    let new_helper = replaced.expect("a new worker with a new helper");
    assert_ne!(new_helper, helper);
}

fn issue_18_a_slow_helper_is_a_timeout_and_a_late_answer_is_dropped() {
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "1", "--helper"]);
    let mut c = LineClient::tcp(server.tcp_addr());
    c.testbed_pid();
    // The testbed's calls wait 5 s.
    assert_eq!(c.ask("helper sleep 6"), "helper error timeout 5s");
    // The next call gets its own answer, not the late "slept".
    let pid = c.ask("helper pid");
    assert!(pid.starts_with("helper pid "), "{pid}");
}

fn issue_18_a_helper_that_cannot_start_stops_the_server_with_its_reason() {
    let mut server = Server::spawn(
        "testbed",
        &["-l", "127.0.0.1:0", "-w", "1", "--helper", "--helper-fail"],
        &[],
    );
    let status = server.wait_exit();
    assert!(!status.success());
    server.wait_for_log_end();
    let log = server.log_text();
    assert!(
        log.contains("the privileged helper failed to start: the helper factory failed: no policy (testbed --helper-fail)"),
        "{log}"
    );
    assert!(
        log.contains("worker 1 helper: cannot start"),
        "the helper's own line: {log}"
    );
}

/// Issue #18 with issue 17's rotation: after USR1 the worker hands the reopened log file
/// to its helper, whose lines go to the new file too.
fn issue_18_the_helper_logs_to_the_reopened_file() {
    let dir = std::env::temp_dir().join(format!("appsrv-priv-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    let log_arg = log.display().to_string();
    // Its log lines go to the file, not to the test's pipe: readiness is read there.
    let server = Server::spawn(
        "testbed",
        &["-l", "127.0.0.1:0", "-w", "1", "--helper", "--log-file", &log_arg],
        &[],
    );
    let ready = wait_until(|| {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|t| t.contains("master: ready"))
    });
    assert!(ready.is_some(), "the server never said ready in {log_arg}");
    std::fs::rename(&log, dir.join("log.1")).unwrap();
    server.signal(libc::SIGUSR1);
    let said = wait_until(|| {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|t| t.contains("worker 1 helper: reopened the log file (handed over by its worker)"))
    });
    let _ = std::fs::remove_dir_all(&dir);
    assert!(said.is_some(), "the helper's line in the new log file");
}

/// Issue #18 (review): a helper that dies while its worker waits for connections retires
/// the worker at once, with no client's call failing: the master replaces both.
fn issue_18_a_helper_that_dies_while_its_worker_is_idle_is_replaced_at_once() {
    let server = Server::start("testbed", &["-l", "127.0.0.1:0", "-w", "1", "--helper"]);
    let (worker, helper) = {
        let mut c = LineClient::tcp(server.tcp_addr());
        let worker = c.testbed_pid();
        (worker, helper_pid(&mut c))
    };
    // The connection is closed: the worker is back in its accept loop.
    server.wait_for_workers(1);
    // SAFETY: kill(2) on the helper this test's server started.
    unsafe { libc::kill(helper, libc::SIGKILL) };
    server.wait_for_log("the privileged helper is gone: this worker stops, to be replaced with a new helper");
    let replaced = wait_until(|| {
        let now = server.worker_pids();
        (!now.contains(&worker) && now.len() == 1).then_some(now)
    });
    assert!(replaced.is_some(), "worker {worker} was not replaced");
    // The new worker's helper answers the first call.
    let mut c = LineClient::tcp(server.tcp_addr());
    assert_ne!(c.testbed_pid(), worker);
    assert_ne!(helper_pid(&mut c), helper);
}

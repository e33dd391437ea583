//! The HAProxy recipe (contrib/haproxy/haproxy.cfg): two http_hello instances behind
//! Debian's HAProxy with PROXY v2 and readiness checks on `/readyz`. Under `wrk` through
//! the balancer (a client that does not retry), each instance is reloaded in turn, then one
//! is stopped with a drain delay: no request fails. Reported ignored, with the reason,
//! when haproxy or wrk is not installed, and a failure then when `CI` is set (.ci/run
//! installs both): a harness of its own (issue 41).
//!
//! Regression tests for issue #8 ("the HAProxy recipe") and issue 22 (health, readiness
//! and draining behind a balancer).

mod util;

use std::net::TcpListener;
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};

use util::needs::{Need, test};
use util::*;

fn main() -> std::process::ExitCode {
    util::needs::main(vec![test(
        "issue_22_behind_haproxy_a_rolling_reload_and_a_drained_stop_fail_no_request",
        &[Need::Program("haproxy", "haproxy"), Need::Program("wrk", "wrk")],
        issue_22_behind_haproxy_a_rolling_reload_and_a_drained_stop_fail_no_request,
    )])
}

/// One instance: PROXY on its listener, health on its own metrics address, a drain delay
/// longer than the recipe's check interval (500 ms, down after one failure).
fn instance(ctl: &str) -> (Server, String) {
    let server = Server::start(
        "http_hello",
        &[
            "-l",
            "127.0.0.1:0?proxy",
            "-w",
            "2",
            "--control",
            ctl,
            "--metrics-listen",
            "127.0.0.1:0",
            "--drain-delay",
            "2",
        ],
    );
    let metrics = server.metrics_addr();
    (server, metrics)
}

/// `http_hello ARGS --control CTL`, which must succeed.
fn ctl(args: &[&str], ctl: &str) -> String {
    let out = Command::new(example("http_hello"))
        .args(args)
        .args(["--control", ctl])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The requests an instance has answered, from `status --json`.
fn requests(ctl_path: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(&ctl(&["status", "--json"], ctl_path)).unwrap();
    v["totals"]["requests"].as_u64().unwrap_or(0)
}

/// wrk's figures: requests completed, and the failures it counts (socket errors and
/// non-2xx/3xx responses), from its report.
fn wrk_figures(report: &str) -> (u64, u64) {
    let completed = report
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no request count in wrk's report:\n{report}"));
    let mut failed = 0;
    for line in report.lines().map(str::trim) {
        if let Some(errors) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 1, write 0, timeout 0"
            failed += errors
                .split(',')
                .filter_map(|e| e.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        }
        if let Some(n) = line.strip_prefix("Non-2xx or 3xx responses:") {
            failed += n.trim().parse::<u64>().unwrap_or(u64::MAX);
        }
    }
    (completed, failed)
}

fn issue_22_behind_haproxy_a_rolling_reload_and_a_drained_stop_fail_no_request() {
    let dir = std::env::temp_dir().join(format!("appsrv-haproxy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let (ctl_one, ctl_two) = (path("one.ctl"), path("two.ctl"));
    let (one, metrics_one) = instance(&ctl_one);
    let (mut two, metrics_two) = instance(&ctl_two);
    // The balancer's front: a listener bound here on a port of the kernel's choosing,
    // handed to HAProxy as descriptor 3 (`bind fd@3`).
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let front_addr = front.local_addr().unwrap();
    let port = |a: &str| a.rsplit(':').next().unwrap().to_owned();
    // The recipe's configuration, with the instances' addresses.
    let recipe = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../contrib/haproxy/haproxy.cfg"
    ))
    .unwrap();
    let cfg = recipe
        .replace("bind 127.0.0.1:8000", "bind fd@3")
        .replace("127.0.0.1:7101", &one.tcp_addr().to_string())
        .replace("127.0.0.1:7102", &two.tcp_addr().to_string())
        .replace("port 9101", &format!("port {}", port(&metrics_one)))
        .replace("port 9102", &format!("port {}", port(&metrics_two)));
    let directives: Vec<&str> = cfg.lines().filter(|l| !l.trim_start().starts_with('#')).collect();
    assert!(
        directives
            .iter()
            .all(|l| !["8000", "7101", "7102", "9101", "9102"]
                .iter()
                .any(|p| l.contains(p))),
        "the recipe's addresses changed: {directives:#?}"
    );
    std::fs::write(path("haproxy.cfg"), cfg).unwrap();
    let mut cmd = Command::new("haproxy");
    cmd.args(["-db", "-f", &path("haproxy.cfg")]);
    // From a high number, so that the source is not among the targets.
    let front_fd = high_dup(front.as_fd());
    drop(front);
    let _haproxy = Server::spawn_inheriting(cmd, &[(front_fd.as_fd(), 3)]);
    drop(front_fd);
    // Up when both instances take requests through it (each passed its checks).
    let url = format!("http://{front_addr}/");
    let served_by_both = wait_until(|| {
        let r = http_get(front_addr, &mut None);
        (r.is_ok() && requests(&ctl_one) > 0 && requests(&ctl_two) > 0).then_some(())
    });
    assert!(served_by_both.is_some(), "haproxy never sent to both instances");

    // wrk for long enough to cover both reloads and the drained stop (each bounded by
    // the waits below); it must still be running when they are done.
    let wrk: Child = Command::new("wrk")
        // A response slower than wrk's default 2 s timeout (a loaded CI machine) is
        // latency, not a lost request: 10 s.
        .args(["-t1", "-c8", "-d20s", "--timeout", "10s", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut wrk = KillOnDrop(Some(wrk));
    let busy = |ctl: &str| {
        let at = requests(ctl);
        assert!(
            wait_until(|| (requests(ctl) > at + 200).then_some(())).is_some(),
            "the instance at {ctl} took no load"
        );
    };
    busy(&ctl_one);
    busy(&ctl_two);
    // A reload of each instance in turn: neither leaves the rotation.
    ctl(&["reload"], &ctl_one);
    busy(&ctl_one);
    ctl(&["reload"], &ctl_two);
    busy(&ctl_two);
    // A stop with a drain delay: /readyz 503, HAProxy takes it out, then it closes.
    two.signal(libc::SIGTERM);
    two.wait_for_log("SIGTERM: drain delay over: stopping");
    assert!(two.wait_exit().success(), "{}", two.log_text());
    busy(&ctl_one);
    let child = wrk.0.as_mut().unwrap();
    assert!(
        child.try_wait().unwrap().is_none(),
        "wrk ended before the reloads and the stop were done: the run proves nothing"
    );
    let out = wrk.0.take().unwrap().wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let (completed, failed) = wrk_figures(&report);
    eprintln!("wrk through haproxy: {completed} requests, {failed} failed\n{report}");
    assert!(out.status.success(), "{report}");
    assert_eq!(failed, 0, "failed requests at the balancer:\n{report}");
    assert!(completed > 1000, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child killed when dropped (a test that fails half way leaves no wrk behind).
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

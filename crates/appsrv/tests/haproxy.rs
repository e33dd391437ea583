//! The HAProxy recipe (contrib/haproxy/haproxy.cfg): two http_hello instances behind
//! HAProxy with PROXY v2 and health checks; one reloaded and one stopped under load
//! without a failed request at the balancer. Skipped when haproxy is not installed
//! (.ci/run installs it).
//!
//! Regression test for issue #8 ("the HAProxy recipe").

mod util;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use util::*;

/// HAProxy in the foreground, killed when dropped.
struct Haproxy(Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One request through the balancer's Unix socket; Err on anything but a 200 with the
/// greeting.
fn through(lb: &str) -> Result<(), String> {
    let mut s = UnixStream::connect(lb).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| format!("read: {e}"))?;
    if out.starts_with("HTTP/1.1 200") && out.ends_with("Hello, World!") {
        Ok(())
    } else {
        Err(format!("bad answer {:?}", out.lines().next()))
    }
}

#[test]
fn two_instances_behind_haproxy_reload_and_stop_without_failures() {
    if Command::new("haproxy").arg("-v").output().is_err() {
        eprintln!("skipped: haproxy is not installed (.ci/run installs it)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("appsrv-haproxy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let (ctl_one, ctl_two) = (path("one.ctl"), path("two.ctl"));
    let one = Server::start(
        "http_hello",
        &["-l", "127.0.0.1:0?proxy", "-w", "2", "--control", &ctl_one],
    );
    let mut two = Server::start(
        "http_hello",
        &["-l", "127.0.0.1:0?proxy", "-w", "2", "--control", &ctl_two],
    );
    let lb = path("lb.sock");
    // The recipe's configuration, with a Unix-socket frontend and the instances' ports.
    let recipe = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../contrib/haproxy/haproxy.cfg"
    ))
    .unwrap();
    let cfg = recipe
        .replace("bind 127.0.0.1:8000", &format!("bind unix@{lb}"))
        .replace("127.0.0.1:7101", &one.tcp_addr().to_string())
        .replace("127.0.0.1:7102", &two.tcp_addr().to_string());
    std::fs::write(path("haproxy.cfg"), cfg).unwrap();
    let _haproxy = Haproxy(
        Command::new("haproxy")
            .args(["-db", "-f", &path("haproxy.cfg")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    // Up when requests go through (both instances pass their health checks soon after).
    assert!(
        wait_until(|| through(&lb).ok()).is_some(),
        "haproxy never answered"
    );
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let failures: Vec<String> = std::thread::scope(|s| {
        let load: Vec<_> = (0..2)
            .map(|_| {
                let (stop, done, lb) = (&stop, &done, &lb);
                s.spawn(move || {
                    let mut errors = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        match through(lb) {
                            Ok(()) => {
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => errors.push(e),
                        }
                    }
                    errors
                })
            })
            .collect();
        let count = || done.load(Ordering::Relaxed);
        let at = count();
        assert!(wait_until(|| (count() > at + 200).then_some(())).is_some());
        let out = Command::new(example("http_hello"))
            .args(["reload", "--control", &ctl_one])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let at = count();
        assert!(wait_until(|| (count() > at + 200).then_some(())).is_some());
        two.signal(libc::SIGTERM);
        assert!(two.wait_exit().success());
        let at = count();
        assert!(
            wait_until(|| (count() > at + 200).then_some(())).is_some(),
            "one instance serves alone"
        );
        stop.store(true, Ordering::Relaxed);
        load.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    eprintln!(
        "requests through haproxy: {}, failed: {}",
        done.load(Ordering::Relaxed),
        failures.len()
    );
    assert!(failures.is_empty(), "failed at the balancer: {failures:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

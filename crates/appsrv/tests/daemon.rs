//! Daemon mode: `start` / `stop`, the locked pid file, readiness, the log file and its
//! rotation, through the testbed server as a real daemon.
//!
//! Regression tests for issue #3 ("Daemon mode").

mod util;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use util::*;

/// A directory for one daemon's socket, pid file and log; dropping it kills every process
/// whose command line names the directory (the daemon and its workers), whatever happened.
struct Daemon {
    dir: PathBuf,
}

impl Daemon {
    fn new(tag: &str) -> Daemon {
        let dir = std::env::temp_dir().join(format!("appsrv-daemon-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Workers run as nobody when the tests run as root: let them reach the log file.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        Daemon { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    fn sock(&self) -> String {
        self.path("sock")
    }
    fn pid_file(&self) -> String {
        self.path("pid")
    }
    fn log(&self) -> String {
        self.path("log")
    }

    /// Runs `testbed SUBCOMMAND` with this daemon's files, and waits for it to exit.
    fn cmd(&self, sub: &str, extra: &[&str]) -> Output {
        // Its own control socket, named to every subcommand (each takes both).
        let mut args = vec![
            sub.to_owned(),
            "--pid-file".into(),
            self.pid_file(),
            "--control".into(),
            self.path("ctl.sock"),
        ];
        if sub == "start" {
            args.extend([
                "-l".into(),
                format!("unix:{}", self.sock()),
                "-w".into(),
                "2".into(),
            ]);
            args.extend([
                "--log-file".into(),
                self.log(),
                "--log-level".into(),
                "debug".into(),
            ]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Command::new(example("testbed"))
            .args(&args)
            .output()
            .expect("run testbed")
    }

    fn start(&self) -> i32 {
        let out = self.cmd("start", &[]);
        assert!(
            out.status.success(),
            "start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.pid()
    }

    fn pid(&self) -> i32 {
        std::fs::read_to_string(self.pid_file())
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// Waits until the log file has `n` lines containing `needle`.
    fn wait_for_log(&self, needle: &str, n: usize) {
        let found = wait_until(|| (self.log_text().matches(needle).count() >= n).then_some(()));
        assert!(
            found.is_some(),
            "no {n}× {needle:?} in the log file:\n{}",
            self.log_text()
        );
    }

    /// Processes whose command line names this directory.
    fn processes(&self) -> Vec<i32> {
        processes_naming(&self.dir)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        for pid in self.processes() {
            // SAFETY: kill(2) on processes this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn start_serves_and_stop_waits_and_cleans_up() {
    let d = Daemon::new("cycle");
    let out = d.cmd("start", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // `start` returned, so the server is ready: no waiting needed before connecting.
    let pid = d.pid();
    assert!(alive(pid));
    let mut c = LineClient::unix(&d.sock());
    assert_eq!(children_of(pid).len(), 2);
    c.testbed_pid();
    assert_eq!(c.ask("daemonized"), "daemonized");
    drop(c);

    let log = d.log_text();
    assert!(
        log.contains(&format!("testbed[{pid}] master: listening on unix:{}", d.sock())),
        "{log}"
    );
    assert!(log.contains(" ready"), "{log}");
    // A worker's lines are its own: written as it goes, maybe after the master's ready
    // line on a busy machine.
    d.wait_for_log("] worker 1: ", 1);
    d.wait_for_log("] worker 2: ", 1);

    let out = d.cmd("stop", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("stopped (pid {pid})")));
    assert!(!Path::new(&d.pid_file()).exists(), "the pid file is removed");
    assert!(!Path::new(&d.sock()).exists(), "the socket file is removed");
    assert!(!alive(pid));
    assert!(d.processes().is_empty());

    let out = d.cmd("stop", &[]);
    assert!(out.status.success(), "stopping a stopped server succeeds");
    assert!(text(&out.stdout).contains("not running"));
}

/// Issue #17: `start` says what it took, in one line: pid, addresses, files.
#[test]
fn issue_17_start_prints_one_line_with_what_it_took() {
    let d = Daemon::new("line");
    let out = d.cmd("start", &["-l", "127.0.0.1:0"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert_eq!(said.lines().count(), 1, "{said}");
    let pid = d.pid();
    let log = d.log_text();
    let tcp = log
        .lines()
        .find_map(|l| l.split("listening on ").nth(1).filter(|a| a.starts_with("127.")))
        .expect("the TCP listener's log line");
    assert_eq!(
        said.trim_end(),
        format!(
            "testbed: started, pid {pid}, listening on unix:{}, {tcp}; pid file {}, log file {}, control socket {}",
            d.sock(),
            d.pid_file(),
            d.log(),
            d.path("ctl.sock")
        )
    );
}

/// Issue #17: `--daemon` has its variable like every option, and it detaches as `-d` does.
#[test]
fn issue_17_the_daemon_variable_detaches_as_the_flag_does() {
    let d = Daemon::new("envd");
    let out = Command::new(example("testbed"))
        .args(["-l", &format!("unix:{}", d.sock()), "-w", "1"])
        .args(["--pid-file", &d.pid_file(), "--log-file", &d.log()])
        .args(["--control", &d.path("ctl.sock")])
        .env("TESTBED_DAEMON", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("testbed: started, pid "),
        "{}",
        text(&out.stdout)
    );
    let pid = d.pid();
    assert!(alive(pid), "the daemon runs on after the command returned");
    let mut c = LineClient::unix(&d.sock());
    c.testbed_pid();
    drop(c);
    let out = d.cmd("stop", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Issue #17: a start that fails removes the pid file it created, whether it failed before
/// detaching (a listener that cannot be bound) or after (a worker that cannot start, said
/// by the waiting parent in the common error style).
#[test]
fn issue_17_a_failed_start_leaves_no_pid_file() {
    let d = Daemon::new("failed");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = d.cmd("start", &["-l", &addr]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("error: cannot listen on {addr}")), "{err}");
    assert!(
        !Path::new(&d.pid_file()).exists(),
        "no pid file after a failed bind"
    );

    let out = d.cmd("start", &["--fail-factory"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    // Log lines may come first: the daemon logs to the terminal until it detaches.
    let said = err
        .lines()
        .find(|l| !l.contains("Z  INFO ") && !l.contains("Z DEBUG "));
    assert!(
        said.is_some_and(|l| l.starts_with("error: worker ") && l.contains("failed to start")),
        "{err}"
    );
    assert!(
        !Path::new(&d.pid_file()).exists(),
        "no pid file after a failed worker start"
    );
    assert!(wait_until(|| d.processes().is_empty().then_some(())).is_some());
}

#[test]
fn a_second_start_refuses_and_names_the_running_pid() {
    let d = Daemon::new("second");
    let pid = d.start();
    let out = d.cmd("start", &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("already running as pid {pid}")), "{err}");
    assert_eq!(d.pid(), pid, "the running server's pid file is untouched");
    assert!(alive(pid));
}

#[test]
fn a_stale_pid_file_is_taken_over() {
    let d = Daemon::new("stale");
    let old = d.start();
    // SAFETY: kill(2) on the daemon this test started.
    unsafe { libc::kill(old, libc::SIGKILL) };
    assert!(wait_until(|| d.processes().is_empty().then_some(())).is_some());
    assert!(
        Path::new(&d.pid_file()).exists(),
        "a killed master leaves its pid file"
    );
    let out = d.cmd("stop", &[]);
    assert!(
        out.status.success() && text(&out.stdout).contains("stale pid file"),
        "{}",
        text(&out.stdout)
    );
    let new = d.start();
    assert_ne!(new, old);
    LineClient::unix(&d.sock()).testbed_pid();
}

#[test]
fn start_with_a_failing_factory_reports_the_error_and_leaves_nothing() {
    let d = Daemon::new("factory");
    let out = d.cmd("start", &["--fail-factory"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("database unavailable (testbed --fail-factory)"),
        "on the terminal: {err}"
    );
    assert!(
        wait_until(|| d.processes().is_empty().then_some(())).is_some(),
        "nothing left running"
    );
    assert!(!Path::new(&d.pid_file()).exists());
}

#[test]
fn start_reports_a_bind_error_on_the_terminal() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let d = Daemon::new("bind");
    let out = d.cmd("start", &["-l", &addr]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    assert!(d.processes().is_empty());
}

#[test]
fn usr1_reopens_the_log_file_in_master_and_workers() {
    let d = Daemon::new("rotate");
    let pid = d.start();
    if is_root() {
        for w in children_of(pid) {
            assert_eq!(proc_ids(w, "Uid:")[0], 65534, "workers run as nobody");
        }
    }
    let rotated = d.path("log.1");
    std::fs::rename(d.log(), &rotated).unwrap();
    // SAFETY: kill(2) on the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGUSR1) };
    d.wait_for_log("master: SIGUSR1 received: reopened the log file", 1);
    d.wait_for_log("reopened the log file", 3); // the master's line and one per worker
    let log = d.log_text();
    assert!(
        log.contains("] worker 1: reopened") && log.contains("] worker 2: reopened"),
        "{log}"
    );
    // New connections are logged (at debug level) by workers into the new file.
    let mut c = LineClient::unix(&d.sock());
    c.testbed_pid();
    d.wait_for_log("serving unix:", 1);
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(
        !old.contains("serving unix:"),
        "nothing new goes to the rotated file"
    );
}

#[test]
fn stop_now_does_not_wait_for_connections() {
    let d = Daemon::new("now");
    let pid = d.start();
    let mut busy = LineClient::unix(&d.sock());
    busy.testbed_pid();
    let out = d.cmd("stop", &["--now"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!alive(pid));
    assert!(
        busy.rest().map_or(true, |s| s.is_empty()),
        "the busy connection was cut"
    );
}

/// `testbed ARGS` in the daemon's directory, waited for.
fn testbed(args: &[&str]) -> Output {
    Command::new(example("testbed"))
        .args(args)
        .output()
        .expect("run testbed")
}

/// Issue 34: two instances with pid files of their own and no --control start side by
/// side (each one's control socket is beside its pid file), and each subcommand finds its
/// server from either the pid file or the control socket.
#[test]
fn issue_34_two_instances_with_their_own_pid_files_start_side_by_side() {
    let d = Daemon::new("pair");
    let (a_pid, b_pid) = (d.path("a.pid"), d.path("b.pid"));
    for (pid_file, sock, log) in [(&a_pid, "a", "a.log"), (&b_pid, "b", "b.log")] {
        let out = testbed(&[
            "start",
            "--pid-file",
            pid_file,
            "-l",
            &format!("unix:{}", d.path(&format!("{sock}.listen"))),
            "-w",
            "1",
            "--log-file",
            &d.path(log),
        ]);
        assert!(out.status.success(), "{sock}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains(&format!("control socket {}", d.path(&format!("{sock}.sock")))),
            "{}",
            text(&out.stdout)
        );
    }
    let pid_of = |f: &str| std::fs::read_to_string(f).unwrap().trim().to_owned();
    // status by pid file, and by control socket: each its own server.
    let out = testbed(&["status", "--json", "--pid-file", &a_pid]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("\"master_pid\":{}", pid_of(&a_pid))));
    // Options before the subcommand, too.
    let out = testbed(&["--control", &d.path("b.sock"), "status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("\"master_pid\":{}", pid_of(&b_pid))));
    // stop by control socket alone: the pid is asked from the server.
    let b = pid_of(&b_pid).parse().unwrap();
    let out = testbed(&["stop", "--control", &d.path("b.sock")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("stopped (pid {b})")),
        "{}",
        text(&out.stdout)
    );
    assert!(!alive(b));
    let a = pid_of(&a_pid).parse().unwrap();
    assert!(alive(a), "the other instance is untouched");
    let out = testbed(&["stop", "--pid-file", &a_pid]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!alive(a));
}

/// Issue 34: a control socket taken by another instance is refused with a message that
/// names --control (and --pid-file), before the second one detaches.
#[test]
fn issue_34_a_control_socket_collision_names_control() {
    let d = Daemon::new("collide");
    d.start();
    let out = testbed(&[
        "start",
        "--pid-file",
        &d.path("other.pid"),
        "--control",
        &d.path("ctl.sock"),
        "-l",
        &format!("unix:{}", d.path("other.listen")),
        "-w",
        "1",
        "--log-file",
        &d.path("other.log"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("another server has this control socket") && err.contains("--control PATH"),
        "{err}"
    );
    assert!(
        !Path::new(&d.path("other.pid")).exists(),
        "no pid file left behind"
    );
    assert!(
        !Path::new(&d.path("other.listen")).exists(),
        "no socket left behind"
    );
}

/// Issue 34: `stop` says what it waits for (the connections in progress, the server's own
/// grace period), waits by the server's grace period rather than its own default, and on
/// a timeout names the next step.
#[test]
fn issue_34_stop_says_what_it_waits_for_and_what_to_do_next() {
    let d = Daemon::new("waits");
    let out = d.cmd("start", &["--grace-period", "45", "--drain-delay", "0"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid = d.pid();
    // A client-level connection in progress: the worker holds it until it ends.
    let mut busy = LineClient::unix(&d.sock());
    busy.testbed_pid();
    let out = d.cmd("stop", &["--timeout", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!("stopping pid {pid}: 1 connection(s) open"))
            && said.contains("grace period of 45 s")
            && said.contains("waiting up to 1 s (--timeout)"),
        "{said}"
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("stop --now") && err.contains("stop --timeout SECS"),
        "{err}"
    );
    assert!(alive(pid), "still in its grace period");
    // Without --timeout: the server's grace period and 10 s; --now cuts the connection.
    let out = d.cmd("stop", &["--now"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!("stopping pid {pid} now")) && said.contains("waiting up to 55 s"),
        "{said}"
    );
    assert!(!alive(pid));
}

/// Issue 34: a user's `start` with the defaults: the log file's default directory
/// (`$HOME/.local/state`) is created when missing; when it cannot be, the start fails with
/// a message naming it and --log-file, and leaves no socket in `$XDG_RUNTIME_DIR`.
fn issue_34_a_users_default_log_directory_is_made_and_a_failed_start_leaves_no_socket() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::new("user-defaults");
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let (runtime, home) = (d.dir.join("run"), d.dir.join("home"));
    for dir in [&runtime, &home] {
        std::fs::create_dir(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        nix::unistd::chown(dir, Some(nobody.uid), Some(nobody.gid)).unwrap();
    }
    // Issue 41: a copy of the binary that nobody can execute, since the checkout may be
    // where nobody cannot enter (a clone in /root or in a `mktemp -d`: exit 126).
    // Copied by `cp`, as status.rs does: no descriptor of this process open for writing
    // may leak into a child another test thread forks (exec would fail with ETXTBSY).
    let binary = d.dir.join("testbed");
    let cp = Command::new("cp").arg(example("testbed")).arg(&binary).status();
    assert!(cp.unwrap().success(), "cp testbed");
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    // As nobody, with its own groups (runuser), in a controlled environment (env).
    let as_nobody = |home: &Path, args: &[String]| {
        Command::new("runuser")
            .args(["-u", "nobody", "--", "env", "-u", "XDG_STATE_HOME"])
            .arg(format!("HOME={}", home.display()))
            .arg(format!("XDG_RUNTIME_DIR={}", runtime.display()))
            .arg(&binary)
            .args(args)
            .output()
            .unwrap()
    };
    let listen = format!("unix:{}", runtime.join("listen").display());
    let start = |home: &Path| {
        as_nobody(
            home,
            &[
                "start".into(),
                "-l".into(),
                listen.clone(),
                "-w".into(),
                "1".into(),
            ],
        )
    };
    // HOME names nowhere that can be made: a clear failure, and nothing left behind.
    let out = start(Path::new("/nonexistent-appsrv-home"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains("/nonexistent-appsrv-home/.local/state") && err.contains("--log-file"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&runtime)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left behind in XDG_RUNTIME_DIR: {left:?}");
    // A fresh HOME: the directory is made, and the server starts and stops.
    let out = start(&home);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(home.join(".local/state/testbed.log").exists());
    let stop = as_nobody(&home, &["stop".into()]);
    assert!(stop.status.success(), "{}", text(&stop.stderr));
    assert!(text(&stop.stdout).contains("stopped"), "{}", text(&stop.stdout));
}

/// Runs `testbed ARGS` with `dir`'s own "default" locations: `XDG_RUNTIME_DIR` (start's
/// default pid file and control socket) and `HOME` (its default log file) in `dir`, so
/// that what a plain `start` takes is this test's alone. As root, start's defaults are
/// `/run/testbed.pid`, shared by every test: the command then runs as `nobody`, whose
/// defaults are the variables', as a user's are.
fn testbed_with_defaults(d: &Daemon, args: &[&str]) -> Output {
    use std::os::unix::process::CommandExt;
    let (runtime, home) = (d.dir.join("run"), d.dir.join("home"));
    // As root it runs as nobody: from a copy it can reach (the checkout may be where nobody
    // cannot enter).
    let program = match is_root() {
        true => reachable_copy(&example("testbed")).into(),
        false => example("testbed"),
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("HOME", &home)
        .env_remove("XDG_STATE_HOME");
    for var in std::env::vars_os().map(|(v, _)| v) {
        if var.to_string_lossy().starts_with("TESTBED_") {
            cmd.env_remove(var);
        }
    }
    if is_root() {
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        for dir in [&runtime, &home] {
            if !dir.exists() {
                std::fs::create_dir(dir).unwrap();
                nix::unistd::chown(dir, Some(nobody.uid), Some(nobody.gid)).unwrap();
            }
        }
        cmd.uid(nobody.uid.as_raw()).gid(nobody.gid.as_raw());
    } else {
        for dir in [&runtime, &home] {
            let _ = std::fs::create_dir(dir);
        }
    }
    cmd.output().expect("run testbed")
}

/// Issue 41: `check` while a daemon started with a plain `start` runs failed with
/// `cannot listen on ...: Address already in use`: it looked for no pid file or control
/// socket where `start` puts them by default. It finds the running instance there, says
/// so, and says what it holds instead of refusing it.
#[test]
fn issue_41_check_beside_a_plain_start_finds_and_reports_it() {
    let d = Daemon::new("i41-defaults");
    // In the runtime directory, which is the daemon's user's.
    let listen = format!("unix:{}", d.path("run/listen.sock"));
    let serving = ["-l", listen.as_str(), "-w", "1"];
    let start = testbed_with_defaults(&d, &[&["start"][..], &serving].concat());
    assert!(start.status.success(), "{}", text(&start.stderr));
    let pid: i32 = std::fs::read_to_string(d.dir.join("run/testbed.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for check in [&["check"][..], &["-t"][..]] {
        let out = testbed_with_defaults(&d, &[check, &serving].concat());
        let said = text(&out.stdout);
        assert!(out.status.success(), "{check:?}: {}{said}", text(&out.stderr));
        assert!(
            said.contains(&format!("testbed runs as pid {pid}"))
                && said.contains(&format!("{listen}: held by the running testbed (pid {pid})"))
                && said.contains("start's default): held by the running testbed")
                && said.contains("configuration OK"),
            "{check:?}: {said}"
        );
    }
    // Its socket still serves, and a plain `stop` stops it.
    let mut c = LineClient::unix(&d.path("run/listen.sock"));
    assert!(c.testbed_pid() > 0);
    drop(c);
    let stop = testbed_with_defaults(&d, &["stop"]);
    assert!(stop.status.success(), "{}", text(&stop.stderr));
    assert!(
        text(&stop.stdout).contains(&format!("stopped (pid {pid})")),
        "{}",
        text(&stop.stdout)
    );
}

/// Issue 41: every path a daemon uses is resolved where `start` runs, before the daemon
/// changes to `/`: a relative `--sandbox-write ./data` named `/data` in the workers, and a
/// sandbox path that does not exist passed `check` and stopped every worker instead.
#[test]
fn issue_41_relative_sandbox_paths_are_resolved_where_start_runs() {
    let d = Daemon::new("i41-sandbox");
    std::fs::create_dir(d.dir.join("data")).unwrap();
    let in_dir = |args: &[&str]| {
        Command::new(example("testbed"))
            .args(args)
            .current_dir(&d.dir)
            .output()
            .expect("run testbed")
    };
    let out = in_dir(&[
        "check",
        "-l",
        "127.0.0.1:0",
        "--sandbox",
        "--sandbox-write",
        "./nope",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("sandbox path {}", d.path("nope"))), "{err}");
    let listen = format!("unix:{}", d.sock());
    let (pid_file, log) = (d.pid_file(), d.log());
    let out = in_dir(&[
        "start",
        "-l",
        &listen,
        "-w",
        "1",
        "--pid-file",
        &pid_file,
        "--log-file",
        &log,
        "--sandbox",
        "--sandbox-write",
        "./data",
    ]);
    assert!(out.status.success(), "{}{}", text(&out.stderr), d.log_text());
    let mut c = LineClient::unix(&d.sock());
    assert!(c.testbed_pid() > 0, "{}", d.log_text());
    drop(c);
    let out = d.cmd("stop", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![test(
        "issue_34_a_users_default_log_directory_is_made_and_a_failed_start_leaves_no_socket",
        &[Need::Root],
        issue_34_a_users_default_log_directory_is_made_and_a_failed_start_leaves_no_socket,
    )]
}

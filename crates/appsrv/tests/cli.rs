//! What an operator meets first on the command line: help, version, completions, the man
//! page, environment variables, and one error style, through the real example binaries.
//!
//! Regression tests for issue #17 ("help, version, messages"). The daemon's start line
//! and a failed start's pid file are in tests/daemon.rs.

mod util;

use std::net::TcpListener;
use std::process::{Command, Output};

use util::*;

/// Runs an example with `args` and the environment variables `env` (and no variable of
/// its prefix inherited from the test's environment), to its end.
fn run(example_name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let prefix = example_name.to_ascii_uppercase();
    let mut cmd = Command::new(example(example_name));
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with(&format!("{prefix}_")) {
            cmd.env_remove(var);
        }
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run the example")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const SUBCOMMANDS: &[&str] = &[
    "run",
    "start",
    "stop",
    "check",
    "status",
    "metrics",
    "reload",
    "upgrade",
    "workers",
    "completions",
    "man",
    "help",
];

/// The topics of `run`'s options, in the order `--help` shows them.
const HEADINGS: &[&str] = &[
    "Listeners:",
    "Workers and pool:",
    "Timeouts:",
    "Access:",
    "TLS:",
    "Confinement:",
    "Logs and files:",
];

#[test]
fn issue_17_help_lists_the_subcommands_then_the_options_by_topic() {
    for flag in ["--help", "-h"] {
        let out = run("hello", &[flag], &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let help = text(&out.stdout);
        let commands = help.find("Commands:").expect("a Commands section");
        for sub in SUBCOMMANDS {
            // One line each: the name, then its description on the same line.
            let line = help[commands..]
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{sub} ")))
                .unwrap_or_else(|| panic!("{sub} missing from `hello {flag}`:\n{help}"));
            assert!(
                line.trim().len() > sub.len() + 5,
                "{sub} has no description: {line:?}"
            );
        }
        if flag == "-h" {
            // Issue 34: `-h` fits a screen, and says where the rest is.
            assert!(
                help.lines().count() <= 50,
                "`hello -h` is {} lines:\n{help}",
                help.lines().count()
            );
            for option in ["--listen", "--workers", "--user", "--daemon"] {
                assert!(help.contains(option), "{option} missing from `hello -h`");
            }
            assert!(help.contains("`--help` lists them all"), "{help}");
            assert!(!help.contains("--grace-period"), "{help}");
            continue;
        }
        let mut last = commands;
        for heading in HEADINGS {
            let at = help
                .find(&format!("\n{heading}\n"))
                .unwrap_or_else(|| panic!("no {heading} in `hello {flag}`:\n{help}"));
            assert!(at > last, "{heading} out of order in:\n{help}");
            last = at;
        }
        for option in [
            "--listen",
            "--workers",
            "--grace-period",
            "--allow",
            "--tls-cert",
            "--user",
            "--pid-file",
            "--daemon",
        ] {
            assert!(help.contains(option), "{option} missing from `hello {flag}`");
        }
    }
}

#[test]
fn issue_17_each_subcommand_has_its_help_both_ways() {
    for sub in ["start", "stop", "status", "reload", "completions"] {
        let by_help = run("hello", &["help", sub], &[]);
        let by_flag = run("hello", &[sub, "--help"], &[]);
        for out in [&by_help, &by_flag] {
            assert!(out.status.success(), "{sub}: {}", text(&out.stderr));
            let help = text(&out.stdout);
            assert!(help.contains(&format!("Usage: hello {sub}")), "{sub}:\n{help}");
        }
        assert_eq!(text(&by_help.stdout), text(&by_flag.stdout));
    }
}

#[test]
fn issue_17_version_names_the_program_and_appsrv() {
    let v = env!("CARGO_PKG_VERSION");
    for args in [&["--version"][..], &["-V"]] {
        let out = run("hello", args, &[]);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        // `appsrv::server!` gives the example its crate's version (the examples are
        // appsrv's own, so both are appsrv's here).
        assert_eq!(
            text(&out.stdout).trim(),
            format!("hello {v} (appsrv {v})"),
            "{args:?}"
        );
    }
}

#[test]
fn issue_17_completions_and_the_man_page_come_from_the_same_definitions() {
    for shell in ["bash", "zsh", "fish"] {
        let out = run("hello", &["completions", shell], &[]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        for word in ["start", "reload", "grace-period", "tls-cert"] {
            assert!(script.contains(word), "{shell} completion without {word}");
        }
    }
    // The bash script is valid bash.
    let bash = run("hello", &["completions", "bash"], &[]).stdout;
    let script = std::env::temp_dir().join(format!("appsrv-cli-{}.bash", std::process::id()));
    std::fs::write(&script, bash).unwrap();
    let checked = Command::new("bash").arg("-n").arg(&script).output().unwrap();
    let _ = std::fs::remove_file(&script);
    assert!(checked.status.success(), "bash -n: {}", text(&checked.stderr));

    let out = run("hello", &["completions", "tcsh"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).starts_with("error: invalid value 'tcsh'"),
        "{}",
        text(&out.stderr)
    );

    let man = run("hello", &["man"], &[]);
    assert!(man.status.success(), "{}", text(&man.stderr));
    let page = text(&man.stdout);
    assert!(page.contains(".TH hello 1"), "{page}");
    assert!(page.contains("grace\\-period"), "the options are in the page");
    let dir = std::env::temp_dir().join(format!("appsrv-cli-man-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = run("hello", &["man", "--dir", dir.to_str().unwrap()], &[]);
    let written = (dir.join("hello.1").exists(), dir.join("hello-start.1").exists());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        written,
        (true, true),
        "one page for the program, one per subcommand"
    );
}

#[test]
fn issue_17_a_bad_value_from_the_environment_names_the_variable() {
    let out = run("hello", &[], &[("HELLO_WORKERS", "abc")]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.starts_with(
            "error: invalid value 'abc' in the environment variable HELLO_WORKERS (for '--workers <N>')"
        ),
        "{err}"
    );
    // A flag: the variable accepts 1/0, yes/no, on/off, and names itself otherwise.
    let out = run("hello", &[], &[("HELLO_DAEMON", "maybe")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("HELLO_DAEMON"),
        "{}",
        text(&out.stderr)
    );
    // The same bad value on the command line is the flag's, even with the variable set.
    let out = run("hello", &["-w", "abc"], &[("HELLO_WORKERS", "abc")]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: invalid value 'abc' for '--workers <N>'"),
        "{err}"
    );
    assert!(!err.contains("HELLO_WORKERS"), "{err}");
    // The program's own options get variables too (http_hello's --static-dir).
    let out = run(
        "http_hello",
        &["check"],
        &[("HTTP_HELLO_STATIC_DIR", "/nonexistent/dir")],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("/nonexistent/dir"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn issue_17_a_negative_number_is_an_out_of_range_value() {
    let out = run("hello", &["--grace-period", "-1"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: invalid value '-1' for '--grace-period <SECS>'"),
        "{err}"
    );
    assert!(err.contains("out of range"), "{err}");
    let out = run("hello", &["--workers", "-3"], &[]);
    assert!(text(&out.stderr).starts_with("error: invalid value '-3' for '--workers <N>'"));
}

#[test]
fn issue_17_every_error_on_the_terminal_has_one_style() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let cases: Vec<(&str, Vec<&str>)> = vec![
        // The command line (clap).
        ("hello", vec!["--no-such-flag"]),
        // A configuration error found before start.
        ("hello", vec!["-l", "127.0.0.1:0", "--io", "event"]),
        // A resource that fails at start.
        ("hello", vec!["-l", &taken]),
        // (An error after `start` detached, reported by the waiting parent: tests/daemon.rs.)
        // `check`.
        ("hello", vec!["check", "--pid-file", "/nonexistent-dir/x.pid"]),
        // An example's own validation (runas without its policy).
        ("runas", vec!["-l", "127.0.0.1:0"]),
        ("http_hello", vec!["--static-dir", "/nonexistent-dir"]),
    ];
    for (name, args) in cases {
        let out = run(name, &args, &[]);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{name} {args:?} succeeded");
        let first = err.lines().find(|l| !l.contains(" INFO ")).unwrap_or("");
        assert!(
            first.starts_with("error: ") && !first.starts_with("error: error"),
            "{name} {args:?}: {err}"
        );
    }
}

#[test]
fn issue_17_status_and_stop_say_what_they_looked_for() {
    let dir = std::env::temp_dir().join(format!("appsrv-cli-none-{}", std::process::id()));
    let sock = dir.join("ctl.sock");
    let pid = dir.join("x.pid");
    let out = run("hello", &["status", "--control", sock.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(3));
    // (Followed by a note while another test runs a hello master.)
    let said = text(&out.stdout);
    assert!(
        said.starts_with(&format!(
            "hello: not running: no control socket at {} (the path given with --control)",
            sock.display()
        )),
        "{said}"
    );
    // The default path explains when a server has a control socket.
    let out = run("hello", &["status"], &[]);
    if out.status.code() == Some(3) {
        let said = text(&out.stdout);
        assert!(
            said.contains("the default path") && said.contains("foreground"),
            "{said}"
        );
    }
    let out = run("hello", &["stop", "--pid-file", pid.to_str().unwrap()], &[]);
    assert!(out.status.success());
    let said = text(&out.stdout);
    assert!(
        said.starts_with(&format!(
            "hello: not running: no pid file at {} (the path given with --pid-file)",
            pid.display()
        )),
        "{said}"
    );
}

/// Issue #17: `status` against a server running in the foreground (no control socket)
/// says that it runs, and why it cannot be asked.
#[test]
fn issue_17_status_names_a_foreground_master_it_cannot_reach() {
    let server = Server::start("hello", &["-l", "127.0.0.1:0", "-w", "1"]);
    let dir = std::env::temp_dir().join(format!("appsrv-cli-fg-{}", std::process::id()));
    let sock = dir.join("ctl.sock");
    let out = run("hello", &["status", "--control", sock.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(3));
    let said = text(&out.stdout);
    assert!(
        said.starts_with("hello: not running: no control socket at "),
        "{said}"
    );
    let pids = said
        .split("; hello runs as pid ")
        .nth(1)
        .and_then(|rest| rest.split(" without ").next())
        .unwrap_or_else(|| panic!("no running master named: {said}"));
    assert!(
        pids.split(", ").any(|p| p == server.pid().to_string()),
        "the foreground master's pid {} is named: {said}",
        server.pid()
    );
    assert!(
        said.contains("a foreground run without --pid-file and --control"),
        "{said}"
    );
}

/// Issue 22: configured by the environment (a Kubernetes Deployment), a misspelt variable
/// is named on the terminal by `check` instead of being ignored without a word; the
/// configuration is still checked (and the variables that name options are not warned of).
#[test]
fn issue_22_check_warns_of_a_variable_that_names_no_option() {
    let out = run(
        "http_hello",
        &["check", "-l", "127.0.0.1:0"],
        &[("HTTP_HELLO_WORKRS", "3"), ("HTTP_HELLO_WORKERS", "2")],
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(
            "warning: HTTP_HELLO_WORKRS is set but names no option of http_hello: ignored (misspelt?)"
        ),
        "{err}"
    );
    assert!(!err.contains("HTTP_HELLO_WORKERS"), "{err}");
    assert!(text(&out.stdout).contains("configuration OK"));
}

/// Issue 34 (an item of it): `--help` names every kind of listen address and the health
/// endpoints of the metrics listener.
#[test]
fn issue_34_help_names_datagram_addresses_and_the_health_endpoints() {
    let out = run("http_hello", &["--help"], &[]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for needle in ["udp://", "unixgram:", "?tls", "/healthz", "/readyz"] {
        assert!(help.contains(needle), "--help does not name {needle}:\n{help}");
    }
}

/// The `error: ` line of a failed command's stderr (a foreground `run` logs before it).
fn error_line(out: &Output) -> String {
    text(&out.stderr)
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {}", text(&out.stderr)))
        .to_owned()
}

/// Issue 34: `check` means `start` will work: a port in use, a host name that does not
/// resolve, --metrics-listen on a --listen address fail `check` with `run`'s own message
/// (exit 1), where `check` used to say "configuration OK".
#[test]
fn issue_34_check_fails_where_run_would_with_runs_message() {
    let dir = TestDir::new("cli", "check-fails");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let in_use = format!("127.0.0.1:{port}");
    let control = dir.path("ctl.sock");
    // The metrics listener on the address of the (free) listener: run's error too.
    let free = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let cases: [&[&str]; 3] = [
        &["-l", &in_use],
        &["-l", "no-such-host.invalid:7000"],
        &["-l", &free, "--metrics-listen", &free],
    ];
    for args in cases {
        let mut check = vec!["check", "--control", &control];
        check.extend_from_slice(args);
        let out = run("hello", &check, &[]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "check {args:?}: {}",
            text(&out.stdout)
        );
        assert!(!text(&out.stdout).contains("configuration OK"));
        let mut serve = vec!["run", "--control", &control];
        serve.extend_from_slice(args);
        let ran = run("hello", &serve, &[]);
        assert_eq!(ran.status.code(), Some(1), "run {args:?}");
        assert_eq!(error_line(&out), error_line(&ran), "{args:?}");
    }
    assert!(error_line(&run("hello", &["check", "-l", &in_use], &[])).contains("Address already in use"));
    assert_eq!(
        std::fs::read_dir(&dir.0).unwrap().count(),
        0,
        "nothing left behind"
    );
    drop(taken);
}

/// Issue 34: `check` opens what `start` opens (the pid file, Unix listeners, the control
/// socket, the log files) and leaves nothing behind; a running server's own sockets are
/// not an error but said, and are not disturbed.
#[test]
fn issue_34_check_leaves_nothing_and_leaves_a_running_server_alone() {
    let dir = TestDir::new("cli", "check-opens");
    let args = |listen: &str, pid: &str| {
        vec![
            "-l".to_owned(),
            format!("unix:{}", dir.path(listen)),
            "--pid-file".into(),
            dir.path(pid),
            "--log-file".into(),
            dir.path("srv.log"),
            "--access-log".into(),
            dir.path("access.log"),
        ]
    };
    let mut check = vec!["check".to_owned()];
    check.extend(args("a.sock", "srv.pid"));
    let check: Vec<&str> = check.iter().map(String::as_str).collect();
    let out = run("testbed", &check, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("configuration OK"));
    assert_eq!(
        std::fs::read_dir(&dir.0).unwrap().count(),
        0,
        "check left files behind"
    );
    // A log file's directory that cannot be written: run's message.
    let out = run(
        "testbed",
        &["check", "-l", "127.0.0.1:0", "--log-file", "/proc/appsrv.log"],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        error_line(&out).contains("/proc/appsrv.log"),
        "{}",
        error_line(&out)
    );

    // The same configuration while its server runs (the socket beside the pid file).
    // (Its log on stderr, where the test reads it: the check's --log-file is not opened.)
    let listen = format!("unix:{}", dir.path("a.sock"));
    let pid_file = dir.path("srv.pid");
    let server = Server::start("testbed", &["-l", &listen, "--pid-file", &pid_file, "-w", "1"]);
    let out = run("testbed", &check, &[]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        said.contains(&format!(
            "unix:{}: held by the running testbed (pid {})",
            dir.path("a.sock"),
            server.pid()
        )) && said.contains("pid file")
            && said.contains("configuration OK"),
        "{said}"
    );
    // Its socket still serves.
    let mut c = LineClient::unix(&dir.path("a.sock"));
    assert!(c.testbed_pid() > 0);
    // Another program's socket at a listener's path is an error.
    let other = std::os::unix::net::UnixListener::bind(dir.path("b.sock")).unwrap();
    let mut check_b = vec!["check".to_owned()];
    check_b.extend(args("b.sock", "b.pid"));
    let check_b: Vec<&str> = check_b.iter().map(String::as_str).collect();
    let out = run("testbed", &check_b, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        error_line(&out).contains("another process is accepting connections"),
        "{}",
        error_line(&out)
    );
    drop(other);
}

/// Issue 34: options may come before the subcommand: `hello -u nobody check` is
/// `hello check -u nobody`.
#[test]
fn issue_34_options_before_the_subcommand_work() {
    let before = run("hello", &["-u", "nobody", "-l", "127.0.0.1:0", "check"], &[]);
    let after = run("hello", &["check", "-u", "nobody", "-l", "127.0.0.1:0"], &[]);
    assert_eq!(before.status.code(), after.status.code());
    assert_eq!(text(&before.stdout), text(&after.stdout));
    assert_eq!(text(&before.stderr), text(&after.stderr));
    if is_root() {
        assert!(before.status.success(), "{}", text(&before.stderr));
        assert!(text(&before.stdout).contains("configuration OK"));
    }
    // And -t wherever it stands among the options.
    let t = run("hello", &["-l", "127.0.0.1:0", "-t"], &[]);
    assert_eq!(t.status.code(), Some(0), "{}", text(&t.stderr));
    assert!(text(&t.stdout).contains("configuration OK"));
}

/// Issue 34: a program's help, man page and completions list only the options it takes:
/// `hello` (whole connections, streams) has no `--io`, `--fronts` or datagram options;
/// `http_hello` (requests; it parses its own options with `Server::args` before its kind is
/// known, so its help lists every option) has `--io`; `udp_echo` (datagrams only) has the datagram
/// options and no TLS. Options hidden so are still refused with a reason when given.
#[test]
fn issue_34_help_and_man_page_list_only_the_options_the_program_takes() {
    let help = |example_name: &str| text(&run(example_name, &["--help"], &[]).stdout);
    let man = |example_name: &str| text(&run(example_name, &["man"], &[]).stdout);
    let hello = help("hello");
    let hello_man = man("hello");
    for option in [
        "--io",
        "--fronts",
        "--max-answers-per-ip",
        "--max-inflight",
        "--keepalive-timeout",
    ] {
        assert!(
            !hello.contains(&format!("{option} ")),
            "hello --help lists {option}"
        );
        assert!(
            !hello_man.contains(&option.replace('-', "\\-")),
            "hello's man page lists {option}"
        );
    }
    assert!(hello.contains("--grace-period") && hello_man.contains("\\-\\-grace\\-period"));
    let http = help("http_hello");
    assert!(
        http.contains("--io <MODEL>") && http.contains("--keepalive-timeout"),
        "{http}"
    );
    let udp = help("udp_echo");
    assert!(
        udp.contains("--max-answers-per-ip") && !udp.contains("--tls-cert"),
        "{udp}"
    );
    // Still refused with a reason, not "unexpected argument".
    let out = run("hello", &["check", "-l", "127.0.0.1:0", "--io", "event"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("handle_client"),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 41: right after `stop` printed `stopped (pid N)`, `status` said `runs as pid N
/// without this control socket`: N had exited but its parent had not reaped it yet (a
/// zombie, state `Z`). Here the parent is this test, which reaps the master only after
/// asking: a zombie is not called running.
#[test]
fn issue_41_status_right_after_stop_does_not_call_a_zombie_running() {
    let dir = TestDir::new("cli", "zombie");
    let control = dir.path("ctl.sock");
    let mut server = Server::start(
        "testbed",
        &["-l", "127.0.0.1:0", "-w", "1", "--control", &control],
    );
    let pid = server.pid();
    let out = run("testbed", &["stop", "--control", &control], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("stopped (pid {pid})")),
        "{}",
        text(&out.stdout)
    );
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let state = state
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(state, "Z", "the master is a zombie until this test reaps it");
    let out = run("testbed", &["status", "--control", &control], &[]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(said.starts_with("testbed: not running"), "{said}");
    let named: Vec<&str> = said
        .split(" runs as pid ")
        .nth(1)
        .and_then(|rest| rest.split(" without ").next())
        .map(|pids| pids.split(", ").collect())
        .unwrap_or_default();
    assert!(
        !named.contains(&pid.to_string().as_str()),
        "the zombie {pid} is called running: {said}"
    );
    server.wait_exit();
}

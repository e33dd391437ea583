//! appsrv-exec, the real binary, serving commands: shell, Python and PHP, in connection and
//! persistent mode; the UCSPI environment, the workers' user, the command timeout and the
//! process group's end, a persistent command's garbage, TLS, reload under load, `check`.
//!
//! Regression tests for issue 35 ("appsrv-exec, a prefork server for a command").

#[path = "../../appsrv/tests/util/mod.rs"]
mod util;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use util::{PATIENCE, Server, TestDir, processes_naming, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_appsrv-exec");

/// A copy of the example `name` (a script users copy from the examples' directory) that the workers (nobody, as root) can run wherever the
/// checkout is (issue 41).
fn example(name: &str) -> String {
    let path = format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"));
    util::reachable_copy(std::path::Path::new(&path))
}

/// A server of `args` (listening on a free loopback port unless `args` says where), with
/// its control socket in `dir`. Dropping it kills it, also when the test fails.
fn start(dir: &TestDir, args: &[&str]) -> Server {
    let control = dir.path("ctl.sock");
    let mut all = vec!["--control", control.as_str()];
    if !args.contains(&"-l") {
        all.extend(["-l", "127.0.0.1:0"]);
    }
    all.extend(args);
    Server::start_path(std::path::Path::new(BIN), &all)
}

/// Writes an executable script `name` in `dir` (readable by the workers' user).
fn script(dir: &TestDir, name: &str, text: &str) -> String {
    let path = dir.path(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `dir/bin`, with `sleep` in it (a link to /bin/sleep, so that a sleep started from it
/// names the directory in its command line, for `processes_naming`).
fn commands_dir(dir: &TestDir) -> std::path::PathBuf {
    let bin = dir.0.join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("/bin/sleep", bin.join("sleep")).unwrap();
    bin
}

/// The live processes naming `bin` but the server's own (whose command line names it too,
/// after `--`): the commands and what they started, in sessions of their own.
fn commands_left(bin: &std::path::Path, server: &Server) -> Vec<i32> {
    let group = |pid: i32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split(' ').nth(2)?.parse::<i32>().ok()
    };
    processes_naming(bin)
        .into_iter()
        .filter(|pid| group(*pid) != Some(server.pid()))
        .collect()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s
}

/// Sends `input`, closes the sending side, and reads everything until the server closes.
fn exchange(addr: SocketAddr, input: &[u8]) -> String {
    let mut s = connect(addr);
    s.write_all(input).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A line client for the persistent mode's `lines` codec.
struct Lines {
    reader: BufReader<TcpStream>,
}

impl Lines {
    fn new(addr: SocketAddr) -> Lines {
        Lines {
            reader: BufReader::new(connect(addr)),
        }
    }

    fn ask(&mut self, line: &str) -> String {
        writeln!(self.reader.get_mut(), "{line}").unwrap();
        let mut answer = String::new();
        self.reader.read_line(&mut answer).unwrap();
        answer.trim_end().to_owned()
    }

    /// Whether the server closed the connection (end of file, or a reset).
    fn closed(&mut self) -> bool {
        let mut rest = String::new();
        !matches!(self.reader.read_line(&mut rest), Ok(n) if n > 0)
    }
}

#[test]
fn issue_35_cat_echoes_each_connection() {
    let dir = TestDir::new("exec", "cat");
    let server = start(&dir, &["-w", "2", "--", "cat"]);
    let addr = server.tcp_addr();
    for i in 0..3 {
        let input = format!("hello {i}\nsecond line\n");
        assert_eq!(exchange(addr, input.as_bytes()), input);
    }
    // More than a pipe holds (64 KiB), both ways at once: neither side blocks the other.
    let big: Vec<u8> = (0..1_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut s = connect(addr);
    let mut reader = s.try_clone().unwrap();
    let expected = big.len();
    let read = std::thread::spawn(move || {
        let mut got = Vec::new();
        reader.read_to_end(&mut got).unwrap();
        got
    });
    s.write_all(&big).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let got = read.join().unwrap();
    assert_eq!(got.len(), expected);
    assert!(got == big, "the same bytes in the same order");
}

#[test]
fn issue_35_the_ucspi_environment_and_no_other_descriptor() {
    let dir = TestDir::new("exec", "env");
    let unix = dir.path("s.sock");
    let unix_listen = format!("unix:{unix}");
    let server = start(
        &dir,
        &[
            "-l",
            "127.0.0.1:0",
            "-l",
            &unix_listen,
            "--",
            "/bin/sh",
            "-c",
            "env; echo fds $(ls /proc/self/fd | tr '\\n' ' '); grep -E '^Sig(Blk|Ign)' /proc/self/status",
        ],
    );
    let addr = server.tcp_addr();
    let mut s = connect(addr);
    let client_port = s.local_addr().unwrap().port();
    s.shutdown(Shutdown::Write).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let var = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in:\n{out}"))
            .to_owned()
    };
    assert_eq!(var("PROTO"), "TCP");
    assert_eq!(var("TCPLOCALIP"), "127.0.0.1");
    assert_eq!(var("TCPLOCALPORT"), addr.port().to_string());
    assert_eq!(var("TCPREMOTEIP"), "127.0.0.1");
    assert_eq!(var("TCPREMOTEPORT"), client_port.to_string());
    // `ls` sees 0, 1, 2 and the directory it reads (3), nothing inherited.
    let fds = out.lines().find_map(|l| l.strip_prefix("fds ")).unwrap();
    assert_eq!(fds.trim(), "0 1 2 3", "{out}");
    // Default dispositions (the worker ignores PIPE) and no signal blocked.
    assert!(out.contains("SigBlk:\t0000000000000000\n"), "{out}");
    assert!(out.contains("SigIgn:\t0000000000000000\n"), "{out}");

    let mut u = std::os::unix::net::UnixStream::connect(&unix).unwrap();
    u.set_read_timeout(Some(PATIENCE)).unwrap();
    u.shutdown(Shutdown::Write).unwrap();
    let mut out = String::new();
    u.read_to_string(&mut out).unwrap();
    assert!(out.lines().any(|l| l == "PROTO=UNIX"), "{out}");
    assert!(!out.contains("TCPREMOTEIP="), "{out}");
}

#[test]
fn issue_35_a_python_line_server_in_persistent_mode() {
    let dir = TestDir::new("exec", "python");
    let server = start(
        &dir,
        &[
            "-w",
            "1",
            "--mode",
            "persistent",
            "--codec",
            "lines",
            "--",
            &example("upper-persistent.py"),
        ],
    );
    let addr = server.tcp_addr();
    let mut c = Lines::new(addr);
    assert_eq!(c.ask("hello"), "HELLO");
    assert_eq!(c.ask("a longer line, with spaces"), "A LONGER LINE, WITH SPACES");
    assert_eq!(c.ask(""), "");
    drop(c);
    let mut c = Lines::new(addr);
    assert_eq!(c.ask("again"), "AGAIN");
}

/// Whether `php` is installed, for the part of the sandbox test that runs PHP (the PHP test
/// itself runs from tests/conditional.rs, ignored without php: issue 41); without it that
/// part is skipped with a note, except under `CI`, where .ci/run installs it (php-cli) and
/// its absence fails.
fn have_php() -> bool {
    let found = Command::new("php")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "php is missing: .ci/run installs it (php-cli)"
        );
        eprintln!("skipped: php is not installed (.ci/run installs php-cli)");
    }
    found
}

fn issue_35_php_in_both_modes() {
    let dir = TestDir::new("exec", "php");
    let server = start(&dir, &["-w", "2", "--", &example("hello.php")]);
    assert_eq!(
        exchange(server.tcp_addr(), b"hello\nab\n"),
        "hello 127.0.0.1\n5\n2\n"
    );
    drop(server);

    let server = start(
        &dir,
        &[
            "-w",
            "1",
            "--mode",
            "persistent",
            "--",
            &example("persistent.php"),
        ],
    );
    let addr = server.tcp_addr();
    // One warm process: its count goes on across connections.
    let mut c = Lines::new(addr);
    assert_eq!(c.ask("a"), "hello, a #1");
    assert_eq!(c.ask("b"), "hello, b #2");
    drop(c);
    let mut c = Lines::new(addr);
    assert_eq!(c.ask("c"), "hello, c #3");
}

fn issue_35_the_command_runs_as_the_workers_user() {
    let dir = TestDir::new("exec", "user");
    let server = start(&dir, &["--user", "nobody", "--", "/bin/sh", "-c", "id -u; id -g"]);
    let ids = exchange(server.tcp_addr(), b"");
    assert_eq!(ids, "65534\n65534\n", "nobody's uid and gid");
}

/// Under `--sandbox` the commands run (a shell script that runs other programs, PHP and
/// Python) and are confined with their worker: no write outside `--sandbox-write`, even
/// where the user could write.
#[test]
fn issue_35_sandboxed_commands_run_and_write_nowhere() {
    let dir = TestDir::new("exec", "sandbox");
    let writable = dir.0.join("open");
    std::fs::create_dir(&writable).unwrap();
    std::fs::set_permissions(&writable, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sh = script(
        &dir,
        "try.sh",
        &format!(
            "#!/bin/sh\nread -r line\necho \"$line\" | tr a-z A-Z\ntouch {0}/x 2>/dev/null && echo wrote || echo refused\n",
            writable.display()
        ),
    );
    let server = start(&dir, &["-w", "1", "--sandbox", "--", &sh]);
    let log = server.log_text();
    let answer = exchange(server.tcp_addr(), b"hello\n");
    if log.contains("Landlock") && log.contains("not") {
        eprintln!("skipped the write check: this kernel does not enforce Landlock:\n{log}");
        assert!(answer.starts_with("HELLO\n"), "{answer}");
        return;
    }
    assert_eq!(answer, "HELLO\nrefused\n");
    assert!(!writable.join("x").exists());
    drop(server);
    for (interpreter, code) in [
        (
            "/usr/bin/python3",
            "import sys, json; print(json.dumps(sys.stdin.readline().strip()))",
        ),
        ("php", "<?php echo json_encode(trim(fgets(STDIN))), \"\\n\";"),
    ] {
        if interpreter == "php" && !have_php() {
            continue;
        }
        let path = if interpreter == "php" {
            script(&dir, "try.php", &format!("#!/usr/bin/env php\n{code}\n"))
        } else {
            script(&dir, "try.py", &format!("#!{interpreter}\n{code}\n"))
        };
        let server = start(&dir, &["-w", "1", "--sandbox", "--", &path]);
        assert_eq!(
            exchange(server.tcp_addr(), b"hi\n"),
            "\"hi\"\n",
            "{interpreter}: {}",
            server.log_text()
        );
    }
}

#[test]
fn issue_35_a_command_that_never_exits_is_ended_with_its_group() {
    let dir = TestDir::new("exec", "never");
    // The command's processes are the only ones naming bin/ (the server names the
    // directory, for its control socket).
    let bin = commands_dir(&dir);
    let sleep = dir.path("bin/sleep");
    let never = script(
        &dir,
        "bin/never.sh",
        // TERM ignored, by the script and what it starts: only the KILL to the group ends
        // them.
        &format!(
            "#!/bin/sh\ntrap '' TERM HUP\n{sleep} 100000 &\necho started\nwhile :; do {sleep} 100001; done\n"
        ),
    );
    let server = start(&dir, &["--command-timeout", "1", "--", &never]);
    let mut s = connect(server.tcp_addr());
    let mut out = String::new();
    // The client keeps its side open: only the timeout ends it.
    s.read_to_string(&mut out).unwrap();
    assert_eq!(out, "started\n");
    server.wait_for_log("ran past --command-timeout 1 s");
    let left = wait_until(|| commands_left(&bin, &server).is_empty().then_some(()));
    assert!(left.is_some(), "left running: {:?}", commands_left(&bin, &server));
    // The worker serves on; this command too is ended at its timeout, its group with it.
    drop(s);
    let mut s = connect(server.tcp_addr());
    let mut line = String::new();
    BufReader::new(&mut s).read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    s.shutdown(Shutdown::Write).unwrap();
    let left = wait_until(|| commands_left(&bin, &server).is_empty().then_some(()));
    assert!(left.is_some(), "left running: {:?}", commands_left(&bin, &server));
}

#[test]
fn issue_35_what_a_command_leaves_in_the_background_is_ended() {
    let dir = TestDir::new("exec", "background");
    let bin = commands_dir(&dir);
    let sleep = dir.path("bin/sleep");
    let server = start(
        &dir,
        &[
            "--",
            "/bin/sh",
            "-c",
            &format!("{sleep} 1000 & {sleep} 1001 < /dev/null > /dev/null 2>&1 & echo hi"),
        ],
    );
    // The first sleep holds the output pipe open: the end is the command's exit.
    assert_eq!(exchange(server.tcp_addr(), b""), "hi\n");
    let left = wait_until(|| commands_left(&bin, &server).is_empty().then_some(()));
    assert!(left.is_some(), "left running: {:?}", commands_left(&bin, &server));
}

#[test]
fn issue_35_a_persistent_command_that_writes_garbage_costs_one_connection() {
    let dir = TestDir::new("exec", "garbage");
    let handler = script(
        &dir,
        "handler.py",
        "#!/usr/bin/python3\n\
         import os, sys\n\
         inp, out = sys.stdin.buffer, sys.stdout.buffer\n\
         while True:\n\
         \x20   header = inp.readline()\n\
         \x20   if not header: break\n\
         \x20   req = inp.read(int(header))\n\
         \x20   if req == b'garbage':\n\
         \x20       out.write(b'this is not a frame\\n'); out.flush(); continue\n\
         \x20   answer = b'pid %d' % os.getpid() if req == b'pid' else req\n\
         \x20   out.write(b'%d\\n%s' % (len(answer), answer)); out.flush()\n",
    );
    let server = start(&dir, &["-w", "2", "--mode", "persistent", "--", &handler]);
    let addr = server.tcp_addr();
    let mut a = Lines::new(addr);
    let pid_a = a.ask("pid");
    // B is served by the other worker: A holds its own.
    let mut b = Lines::new(addr);
    let pid_b = b.ask("pid");
    assert_ne!(pid_a, pid_b);
    let answer = b.ask("garbage");
    assert!(
        answer.starts_with("-ERR malformed answer from the command"),
        "{answer}"
    );
    assert!(b.closed(), "B's connection is closed after the error reply");
    server.wait_for_log("malformed answer from the command");
    // A is unaffected, and talks to the same command.
    assert_eq!(a.ask("pid"), pid_a);
    assert_eq!(a.ask("still here"), "still here");
    // B's worker started another command.
    let mut c = Lines::new(addr);
    let pid_c = c.ask("pid");
    assert!(pid_c.starts_with("pid "), "{pid_c}");
    assert_ne!(pid_c, pid_b, "the command was restarted");
    assert_ne!(pid_c, pid_a);
    assert_eq!(c.ask("ok"), "ok");
}

#[test]
fn issue_35_a_persistent_command_past_the_request_timeout_is_replaced() {
    let dir = TestDir::new("exec", "slow");
    let handler = script(
        &dir,
        "slow.py",
        "#!/usr/bin/python3\n\
         import os, sys, time\n\
         inp, out = sys.stdin.buffer, sys.stdout.buffer\n\
         while True:\n\
         \x20   header = inp.readline()\n\
         \x20   if not header: break\n\
         \x20   req = inp.read(int(header))\n\
         \x20   if req == b'slow': time.sleep(100)\n\
         \x20   answer = b'pid %d' % os.getpid()\n\
         \x20   out.write(b'%d\\n%s' % (len(answer), answer)); out.flush()\n",
    );
    let server = start(
        &dir,
        &[
            "-w",
            "1",
            "--request-timeout",
            "2",
            "--mode",
            "persistent",
            "--",
            &handler,
        ],
    );
    let workers = server.wait_for_workers(1);
    let addr = server.tcp_addr();
    let mut c = Lines::new(addr);
    let first = c.ask("pid");
    assert_eq!(
        c.ask("slow"),
        "-ERR no answer within the request timeout (2 s)",
        "the codec's error reply"
    );
    assert!(c.closed());
    let mut c = Lines::new(addr);
    let second = c.ask("pid");
    assert_ne!(first, second, "a new command");
    assert_eq!(
        server.worker_pids(),
        workers,
        "the worker answered, it was not killed"
    );
}

/// Writes a self-signed certificate for 127.0.0.1 into `dir`: (cert, key).
fn certificate(dir: &TestDir) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let cert = params.self_signed(&key).unwrap();
    let (c, k) = (dir.path("cert.pem"), dir.path("key.pem"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

#[test]
fn issue_35_the_worker_relays_plain_text_over_tls() {
    let dir = TestDir::new("exec", "tls");
    let (cert, key) = certificate(&dir);
    let server = start(
        &dir,
        &[
            "-l",
            "127.0.0.1:0?tls",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--",
            "/bin/sh",
            "-c",
            "read a; read b; echo \"got $a and $b over $PROTO\"; sleep 0.5; head -c 200000 | wc -c",
        ],
    );
    let addr = server.tcp_addr();
    let mut client = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &addr.to_string(),
            "-quiet",
            "-verify_quiet",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl");
    // Two lines in one TLS record, then many records that arrive while the command does
    // not read (its input pipe and the relay's 64 KiB fill up): the relay reads the client
    // in pieces smaller than what was decrypted, and must not wait on the socket for what
    // is buffered or decrypted already.
    let mut input = b"one\ntwo\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 200_000));
    let mut stdin = client.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
        stdin // kept open: s_client -quiet would not end at its end anyway
    });
    let mut out = String::new();
    let mut stdout = client.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let done = wait_until(|| client.try_wait().unwrap());
    if done.is_none() {
        let _ = client.kill();
        let _ = client.wait();
    }
    let out = reader.join().unwrap();
    drop(writer.join().unwrap());
    assert_eq!(out, "got one and two over TCP\n200000\n");
}

/// Four clients that do not retry, each a connection per request through `cat`, while
/// `operate` runs `times` times (each time once the load has served 20 more): how many were
/// answered, and how many failed (refused, reset or answered wrongly).
fn under_load(addr: SocketAddr, times: usize, mut operate: impl FnMut()) -> (u64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let input = format!("client {i} request {n}\n");
                    // No retry: a connection refused, reset or answered wrongly is a failure.
                    let answer = (|| -> std::io::Result<String> {
                        let mut s = TcpStream::connect(addr)?;
                        s.set_read_timeout(Some(PATIENCE))?;
                        s.write_all(input.as_bytes())?;
                        s.shutdown(Shutdown::Write)?;
                        let mut out = String::new();
                        s.read_to_string(&mut out)?;
                        Ok(out)
                    })();
                    match answer {
                        Ok(a) if a == input => ok.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    // The clients stop also when an operation's assertion fails.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stopper = StopOnDrop(stop.clone());
    let served_more = |ok: &AtomicU64| {
        let before = ok.load(Ordering::Relaxed);
        wait_until(|| (ok.load(Ordering::Relaxed) > before + 20).then_some(())).expect("load runs");
    };
    for _ in 0..times {
        served_more(&ok);
        operate();
    }
    served_more(&ok);
    drop(stopper);
    for c in clients {
        c.join().unwrap();
    }
    (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
}

#[test]
fn issue_35_reload_under_load_loses_no_connection() {
    let dir = TestDir::new("exec", "reload");
    let server = start(&dir, &["-w", "2", "--", "cat"]);
    let control = dir.path("ctl.sock");
    let (ok, failed) = under_load(server.tcp_addr(), 3, || {
        let status = Command::new(BIN)
            .args(["reload", "--control", &control])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "reload; log:\n{}", server.log_text());
    });
    assert_eq!(failed, 0, "{ok} served");
}

/// A binary upgrade (the new master takes the listeners over) under the same load: no
/// connection lost, and the new master serves.
#[test]
fn issue_35_an_upgrade_under_load_loses_no_connection() {
    let dir = TestDir::new("exec", "upgrade");
    // Whatever runs from this test's directory (the new master names it on its command
    // line) is killed at the end, also when the test fails.
    struct KillNaming<'a>(&'a std::path::Path);
    impl Drop for KillNaming<'_> {
        fn drop(&mut self) {
            for pid in processes_naming(self.0) {
                // SAFETY: kill(2) on processes this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    let _reap = KillNaming(&dir.0);
    let pid_file = dir.path("pid");
    let server = start(&dir, &["-w", "2", "--pid-file", &pid_file, "--", "cat"]);
    let control = dir.path("ctl.sock");
    let (ok, failed) = under_load(server.tcp_addr(), 1, || {
        let out = Command::new(BIN)
            .args(["upgrade", "--control", &control])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "upgrade: {}; log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            server.log_text()
        );
    });
    assert_eq!(failed, 0, "{ok} served");
    let new_master: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(new_master, server.pid(), "the new master published its pid");
    let out = Command::new(BIN)
        .args(["stop", "--pid-file", &pid_file])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn issue_35_check_refuses_a_command_that_cannot_run() {
    let dir = TestDir::new("exec", "check");
    let out = Command::new(BIN)
        .args(["check", "-l", "127.0.0.1:0", "--", "/nonexistent"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains("command /nonexistent: no such file"), "{err}");

    let plain = dir.path("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    let out = Command::new(BIN)
        .args(["check", "-l", "127.0.0.1:0", "--", &plain])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not executable"), "{err}");

    let out = Command::new(BIN)
        .args(["check", "-l", "127.0.0.1:0", "--", "sh", "-c", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Persistent mode waits for its command: an event loop is refused, with the way out.
    let out = Command::new(BIN)
        .args([
            "check",
            "-l",
            "127.0.0.1:0",
            "--mode",
            "persistent",
            "--io",
            "event",
            "--",
            "cat",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--io blocking"), "{err}");
}

#[test]
fn issue_35_max_output_closes_the_connection() {
    let dir = TestDir::new("exec", "max-output");
    let server = start(&dir, &["--max-output", "10", "--", "yes"]);
    let mut s = connect(server.tcp_addr());
    let mut out = Vec::new();
    // `yes` never ends: only the limit does, with exactly that many bytes sent.
    s.read_to_end(&mut out).unwrap();
    assert_eq!(out, b"y\ny\ny\ny\ny\n");
    server.wait_for_log("passed --max-output 10 bytes: closing the connection");
}

#[test]
fn issue_35_persistent_mode_speaks_netstrings_and_length_prefixes() {
    let dir = TestDir::new("exec", "codecs");
    let upper = example("upper-persistent.py");
    let server = start(
        &dir,
        &[
            "-w",
            "1",
            "--mode",
            "persistent",
            "--codec",
            "netstring",
            "--",
            &upper,
        ],
    );
    let mut s = connect(server.tcp_addr());
    s.write_all(b"5:hello,11:two\nlines\r\n,").unwrap();
    let expected = b"5:HELLO,11:TWO\nLINES\r\n,";
    let mut got = vec![0u8; expected.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, expected);
    drop(server);

    let server = start(
        &dir,
        &[
            "-w",
            "1",
            "--mode",
            "persistent",
            "--codec",
            "length",
            "--",
            &upper,
        ],
    );
    let mut s = connect(server.tcp_addr());
    s.write_all(b"\0\0\0\x05hello").unwrap();
    let mut got = [0u8; 9];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"\0\0\0\x05HELLO");
}

/// `appsrv-exec SUBCOMMAND ARGS` run in `dir` (as a user types `./script.sh` there), to its
/// end.
fn exec_in(dir: &TestDir, args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).current_dir(&dir.0).output().unwrap()
}

/// Kills, when dropped, every process whose command line names the test's directory: a
/// daemon started by a test and its workers, also when the test fails.
struct KillNaming<'a>(&'a TestDir);

impl Drop for KillNaming<'_> {
    fn drop(&mut self) {
        for pid in processes_naming(&self.0.0) {
            // SAFETY: kill(2) on processes this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The address a `start` line names: `... listening on 127.0.0.1:PORT; pid file ...`.
fn started_addr(stdout: &str) -> SocketAddr {
    let rest = stdout
        .split("listening on ")
        .nth(1)
        .unwrap_or_else(|| panic!("no address in {stdout:?}"));
    rest.split([';', ',', ' ']).next().unwrap().parse().unwrap()
}

/// Issue 41: `appsrv-exec start ... -- ./script.sh` printed `started`, then every
/// connection failed with `cannot start ./script.sh: No such file or directory` (the
/// daemon had changed to `/`), and in persistent mode `start` failed for a script that
/// exists. The command is resolved where `start` runs, and runs there (a file it names
/// relatively is found), in both modes.
#[test]
fn issue_41_a_relative_command_works_under_start_in_both_modes() {
    let dir = TestDir::new("exec", "relative");
    let _guard = KillNaming(&dir);
    std::fs::write(dir.path("greeting.txt"), "relative-ok\n").unwrap();
    script(&dir, "greet.sh", "#!/bin/sh\ncat greeting.txt\n");
    script(
        &dir,
        "upper.sh",
        "#!/bin/sh\nwhile read -r len; do\n  body=$(head -c \"$len\")\n  out=$(printf '%s' \"$body\" | tr a-z A-Z)\n  printf '%s\\n%s' \"${#out}\" \"$out\"\ndone\n",
    );
    for (mode, command) in [("connection", "./greet.sh"), ("persistent", "./upper.sh")] {
        let (pid_file, log) = (dir.path(&format!("{mode}.pid")), dir.path(&format!("{mode}.log")));
        let out = exec_in(
            &dir,
            &[
                "start",
                "-l",
                "127.0.0.1:0",
                "-w",
                "1",
                "--pid-file",
                &pid_file,
                "--log-file",
                &log,
                "--mode",
                mode,
                "--",
                command,
            ],
        );
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{mode}: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let addr = started_addr(&said);
        match mode {
            "connection" => assert_eq!(
                exchange(addr, b""),
                "relative-ok\n",
                "{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
            _ => assert_eq!(Lines::new(addr).ask("hello"), "HELLO"),
        }
        let out = exec_in(&dir, &["stop", "--pid-file", &pid_file]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Issue 41: a relative command that does not exist is refused by `check` and by `start`
/// (before it detaches), with its name, rather than at the first connection.
#[test]
fn issue_41_a_relative_command_that_does_not_exist_is_refused_at_check_and_start() {
    let dir = TestDir::new("exec", "relative-missing");
    let _guard = KillNaming(&dir);
    for sub in ["check", "start"] {
        let pid_file = dir.path("missing.pid");
        let out = exec_in(
            &dir,
            &[
                sub,
                "-l",
                "127.0.0.1:0",
                "--pid-file",
                &pid_file,
                "--",
                "./missing.sh",
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{sub}: {err}");
        assert!(err.contains("missing.sh: no such file"), "{sub}: {err}");
        assert!(!std::path::Path::new(&pid_file).exists(), "{sub} left a pid file");
    }
}

/// Issue 41: started where the workers' user cannot go (root's home, a private directory)
/// and without `--chdir`, the command runs in `/` as it did before the default existed, and
/// `check` says so; a `--chdir` the workers cannot enter is refused.
fn issue_41_a_start_directory_the_workers_cannot_enter_gives_root_with_a_note() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TestDir::new("exec", "private-start");
    let private = dir.0.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let private = private.to_string_lossy().into_owned();
    let out = Command::new(BIN)
        .args(["check", "-l", "127.0.0.1:0", "--", "/bin/cat"])
        .current_dir(&private)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("cannot be entered by the workers' user nobody"),
        "{err}"
    );
    assert!(err.contains("the command runs in / instead"), "{err}");
    let out = exec_in(
        &dir,
        &[
            "check",
            "-l",
            "127.0.0.1:0",
            "--chdir",
            &private,
            "--",
            "/bin/cat",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot be entered by the workers' user nobody"),
        "{err}"
    );
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![
        test(
            "issue_35_php_in_both_modes",
            &[Need::Program("php", "php-cli")],
            issue_35_php_in_both_modes,
        ),
        test(
            "issue_35_the_command_runs_as_the_workers_user",
            &[Need::Root],
            issue_35_the_command_runs_as_the_workers_user,
        ),
        test(
            "issue_41_a_start_directory_the_workers_cannot_enter_gives_root_with_a_note",
            &[Need::Root],
            issue_41_a_start_directory_the_workers_cannot_enter_gives_root_with_a_note,
        ),
    ]
}

//! The `kv` example speaks RESP2 with the built-in `Resp` codec: real Redis clients
//! (`redis-cli`, `redis-benchmark`) against it, protocol errors, pipelining.
//!
//! Regression tests for issue 34 ("Real clients for kv"). The Redis tools come from the
//! redis-tools package (`.ci/run` installs it); without them, the tests that need them are
//! reported ignored, with the reason (they run from tests/conditional.rs, issue 41).

mod util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};

use util::*;

/// A test's private directory, for the control socket.
struct Dir(TestDir);

impl Dir {
    fn new(tag: &str) -> Dir {
        Dir(TestDir::new("kv", tag))
    }
}

/// Starts kv on a port of its own, with its control socket in `dir`, in `io`, with `args`.
fn kv(dir: &Dir, io: Io, args: &[&str]) -> Server {
    let sock = dir.0.path("ctl.sock");
    let mut all = vec!["-l", "127.0.0.1:0", "--control", &sock];
    all.extend_from_slice(args);
    Server::start_io("kv", io, &all)
}

/// Runs `redis-cli` against `server`, one connection, with the commands of `script` (one a
/// line) on its standard input; returns what it printed, in its formatted (`--no-raw`)
/// output.
fn redis_cli(server: &Server, script: &str) -> String {
    let port = server.tcp_addr().port().to_string();
    let mut child = Command::new("redis-cli")
        .args(["--no-raw", "-h", "127.0.0.1", "-p", &port])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "redis-cli failed: {}\nlog:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log_text()
    );
    String::from_utf8(out.stdout).unwrap()
}

fn connect(server: &Server) -> TcpStream {
    let s = TcpStream::connect(server.tcp_addr()).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s
}

fn read_to_end(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// redis-cli's session: each command and error with Redis's reply, the database chosen
/// by SELECT kept for the connection, the map kept by the (single) worker.
fn issue_34_redis_cli_gets_redis_replies(io: Io) {
    let dir = Dir::new(&format!("cli-{}", io.name()));
    let server = kv(&dir, io, &["-w", "1"]);
    let script = "\
        PING\n\
        PING \"hello world\"\n\
        SET colour blue\n\
        GET colour\n\
        GET missing\n\
        INCR visits\n\
        incr visits\n\
        INCR colour\n\
        EXISTS colour visits colour missing\n\
        SELECT 1\n\
        GET colour\n\
        SELECT 16\n\
        SELECT one\n\
        GET colour\n\
        SELECT 0\n\
        DEL colour missing visits\n\
        EXISTS colour\n\
        GET\n\
        SET k\n\
        SET k v EX 10\n\
        FOO a \"b c\"\n\
        CONFIG GET save\n\
        CONFIG GET nothing\n";
    let expected = "\
        PONG\n\
        \"hello world\"\n\
        OK\n\
        \"blue\"\n\
        (nil)\n\
        (integer) 1\n\
        (integer) 2\n\
        (error) ERR value is not an integer or out of range\n\
        (integer) 3\n\
        OK\n\
        (nil)\n\
        (error) ERR DB index is out of range\n\
        (error) ERR value is not an integer or out of range\n\
        (nil)\n\
        OK\n\
        (integer) 2\n\
        (integer) 0\n\
        (error) ERR wrong number of arguments for 'get' command\n\
        (error) ERR wrong number of arguments for 'set' command\n\
        (error) ERR syntax error\n\
        (error) ERR unknown command 'FOO', with args beginning with: 'a' 'b c' \n\
        1) \"save\"\n\
        2) \"\"\n\
        (empty array)\n";
    assert_eq!(redis_cli(&server, script), expected);
    // A second connection: the same worker's map, database 0 again.
    assert_eq!(
        redis_cli(&server, "GET visits\nSET visits 9\nINCR visits\n"),
        "(nil)\nOK\n(integer) 10\n"
    );
    let port = server.tcp_addr().port().to_string();
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port, "get", "visits"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "10\n",
        "a command on the command line"
    );
}

/// Runs `redis-benchmark` against `server` with `extra` arguments; checks that it ran every
/// test and printed no error.
fn benchmark(server: &Server, extra: &[&str]) -> Output {
    let port = server.tcp_addr().port().to_string();
    let mut args = vec![
        "-h",
        "127.0.0.1",
        "-p",
        &port,
        "-t",
        "set,get,incr,ping",
        "-n",
        "2000",
        "-q",
    ];
    args.extend_from_slice(extra);
    let out = Command::new("redis-benchmark").args(&args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stdout}\n{stderr}");
    // Progress lines end in \r; the results in \n.
    for test in ["PING_INLINE", "PING_MBULK", "SET", "GET", "INCR"] {
        assert!(
            stdout
                .split(['\r', '\n'])
                .any(|l| l.starts_with(&format!("{test}: ")) && l.contains("requests per second")),
            "{args:?}: no result for {test}: {stdout}"
        );
    }
    let noise = |l: &str| {
        let l = l.to_ascii_lowercase();
        l.contains("error") || l.contains("warning")
    };
    assert!(
        !stdout.split(['\r', '\n']).any(noise) && !stderr.lines().any(noise),
        "{args:?}: error lines:\n{stdout}\n{stderr}"
    );
    out
}

/// redis-benchmark's set, get, incr and ping tests (50 clients), one command at a time
/// and 16 at a time (`-P 16`), with no error line: its start-up `CONFIG GET save` and
/// `CONFIG GET appendonly` get answers, the replies are what it expects.
fn issue_34_redis_benchmark_runs_cleanly() {
    let dir = Dir::new("benchmark");
    let server = kv(&dir, Io::Event, &["-w", "2"]);
    benchmark(&server, &[]);
    benchmark(&server, &["-P", "16"]);
    assert!(
        !server.log_text().contains("bad request"),
        "{}",
        server.log_text()
    );
}

#[test]
/// A protocol error gets Redis's error reply and its connection is closed; another client
/// of the same (event) worker, connected all along, is served on.
fn issue_34_a_protocol_error_closes_only_its_connection() {
    let dir = Dir::new("protocol-error");
    let server = kv(&dir, Io::Event, &["-w", "1"]);
    let mut good = LineClient::tcp(server.tcp_addr());
    assert_eq!(good.redis("SET k v"), "OK");
    for (bad_input, reply) in [
        (
            &b"*1\r\n$abc\r\n"[..],
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\nPING\r\n",
            "-ERR Protocol error: expected '$', got 'P'\r\n",
        ),
        (b"*x\r\n", "-ERR Protocol error: invalid multibulk length\r\n"),
        (
            b"SET \"k v\r\n",
            "-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
    ] {
        let mut bad = connect(&server);
        bad.write_all(bad_input).unwrap();
        assert_eq!(read_to_end(&mut bad), reply, "then closed");
        assert_eq!(good.redis("GET k"), "\"v\"", "the other client is served on");
    }
    server.wait_for_log("bad request from 127.0.0.1:");
    assert_eq!(server.worker_pids().len(), 1);
    assert!(!server.log_text().contains("exited"), "no worker was replaced");
}

both_io!(blocking_event: issue_34_pipelined_commands_are_answered_in_order);
/// Commands in one write (arrays and inline commands mixed), the last one split across two
/// writes; then a thousand INCRs in one write.
fn issue_34_pipelined_commands_are_answered_in_order(io: Io) {
    let dir = Dir::new(&format!("pipelined-{}", io.name()));
    let server = kv(&dir, io, &["-w", "1"]);
    let mut s = connect(&server);
    s.write_all(
        b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\nINCR a\r\n*2\r\n$3\r\nGET\r\n$1\r\na\r\n\
          EXISTS a b\r\n\r\n*2\r\n$3\r\nDEL\r\n$1",
    )
    .unwrap();
    s.write_all(b"\r\na\r\nQUIT\r\n").unwrap();
    assert_eq!(
        read_to_end(&mut s),
        "+OK\r\n:2\r\n$1\r\n2\r\n:1\r\n:1\r\n+OK\r\n",
        "in order (the blank line gets no reply), closed after QUIT"
    );

    let mut s = connect(&server);
    let incrs = "*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n".repeat(1000);
    s.write_all(format!("{incrs}QUIT\r\n").as_bytes()).unwrap();
    let expected: String = (1..=1000).map(|n| format!(":{n}\r\n")).collect();
    assert_eq!(read_to_end(&mut s), format!("{expected}+OK\r\n"));
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::each_io_of;
    use util::needs::{Need, test};
    let mut all = each_io_of(
        "issue_34_redis_cli_gets_redis_replies",
        &[Need::Program("redis-cli", "redis-tools")],
        &[Io::Blocking, Io::Event],
        issue_34_redis_cli_gets_redis_replies,
    );
    all.push(test(
        "issue_34_redis_benchmark_runs_cleanly",
        &[Need::Program("redis-benchmark", "redis-tools")],
        issue_34_redis_benchmark_runs_cleanly,
    ));
    all
}

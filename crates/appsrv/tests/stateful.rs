//! The `stateful` example: a line server whose connections each keep their own state, in
//! at most 40 lines as the crate's documentation shows it (issue 41, "a stateful line
//! server in at most 40 lines").

mod util;

use std::io::Write;
use std::process::Command;

use util::*;

/// Starts the example on a port of its own, with its control socket in `dir`.
fn stateful(dir: &TestDir, io: Io) -> Server {
    let sock = dir.path("ctl.sock");
    Server::start_io("stateful", io, &["-l", "127.0.0.1:0", "--control", &sock])
}

/// Each connection has its own variables and count; a line that is not UTF-8 ends only its
/// connection, with a log line naming the client; the worker serves on.
fn issue_41_each_connection_keeps_its_own_state(io: Io) {
    let dir = TestDir::new("stateful", io.name());
    let server = stateful(&dir, io);
    let mut a = LineClient::tcp(server.tcp_addr());
    let mut b = LineClient::tcp(server.tcp_addr());
    assert_eq!(a.ask("SET color blue"), "OK");
    assert_eq!(a.ask("GET color"), "blue");
    assert_eq!(b.ask("GET color"), "(nil)", "b does not see a's variables");
    assert_eq!(b.ask("SET color red"), "OK");
    assert_eq!(a.ask("GET color"), "blue", "nor a b's");
    assert_eq!(a.ask("COUNT"), "4");
    assert_eq!(b.ask("COUNT"), "3");
    assert_eq!(a.ask("GET"), "-ERR unknown command or wrong number of arguments");
    assert_eq!(a.ask("COUNT"), "6", "a refused command is counted too");

    a.get_mut().write_all(b"GET \xff\n").unwrap();
    assert_eq!(
        a.rest().unwrap(),
        "",
        "a line that is not UTF-8 closes the connection"
    );
    let line = server.wait_for_log("not UTF-8");
    assert!(
        line.contains("127.0.0.1:"),
        "the log line names the client: {line}"
    );
    assert_eq!(b.ask("COUNT"), "4", "the other connection goes on");
    let mut c = LineClient::tcp(server.tcp_addr());
    assert_eq!(c.ask("GET color"), "(nil)", "a new connection starts empty");
}

util::both_io!(blocking_event: issue_41_each_connection_keeps_its_own_state);

/// Hybrid fronts hand a connection's requests to any worker: a session cannot follow, so
/// `--io hybrid` is refused before start, with the reason.
#[test]
fn issue_41_hybrid_is_refused_with_the_reason() {
    let out = Command::new(example("stateful"))
        .args(["run", "-l", "127.0.0.1:0", "--io", "hybrid"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("keeps state per connection"), "{err}");
}

/// The code of a Rust source, as the line counts of issue 41 count it: no blank line, no
/// comment line.
fn code_lines(source: &str) -> Vec<&str> {
    source
        .lines()
        .filter(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with("//")
        })
        .collect()
}

/// The example is the crate documentation's request-level example, line for line, and it
/// stays within 40 lines of code, `main` included.
#[test]
fn issue_41_the_documented_stateful_server_is_at_most_40_lines() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let example = std::fs::read_to_string(format!("{root}/appsrv-examples/examples/stateful.rs")).unwrap();
    let lib = std::fs::read_to_string(format!("{root}/appsrv/src/lib.rs")).unwrap();
    // The doc's first block after the request-level heading.
    let heading = lib
        .find("//! # The request level")
        .expect("the request-level section");
    let section = &lib[heading..];
    let block: String = section
        .lines()
        .map(|l| l.strip_prefix("//!").map(|l| l.strip_prefix(' ').unwrap_or(l)))
        .map_while(|l| l)
        .skip_while(|l| *l != "```no_run")
        .skip(1)
        .take_while(|l| *l != "```")
        .map(|l| format!("{l}\n"))
        .collect();
    let example_code = code_lines(&example);
    assert_eq!(
        code_lines(&block),
        example_code,
        "lib.rs shows the stateful example as it is"
    );
    assert!(
        example_code.len() <= 40,
        "{} lines of code:\n{}",
        example_code.len(),
        example_code.join("\n")
    );
    assert!(example_code.iter().any(|l| l.contains("fn main()")));
}

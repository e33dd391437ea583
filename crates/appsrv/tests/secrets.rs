//! Issue 41: nothing secret on any page or line. What a worker publishes about a request
//! in progress (the status page and its JSON on `--metrics-listen`, the `status`
//! subcommand, the slow-request and request-timeout log lines) is the summary its codec
//! gives (HTTP: the method and the path without the query; RESP: the command name; a
//! `handle_client` connection: nothing), never the request's bytes, unless the operator
//! asks for them with `--status-request-detail`.
//!
//! Each test runs a real example (or test server) with credentials in an `Authorization`
//! header, a query string, a cookie, a RESP `AUTH` (multibulk and inline) and an SMTP
//! `AUTH PLAIN` line, looks at every page and line while the requests are in progress and
//! after the request timeout, and finds none of the secrets, and the summary where it
//! belongs.

mod util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};

use util::*;

/// Every secret the clients send. (`AHVzZXIAU0VDUkVUU01UUA==` is `\0user\0SECRETSMTP`.)
const SECRETS: &[&str] = &[
    "SECRETTOKEN",
    "SECRETPW",
    "SECRETCOOKIE",
    "SECRETRESP",
    "SECRETINLINE",
    "SECRETSMTP",
    "AHVzZXIAU0VDUkVUU01UUA",
];

/// A request with a secret in its query, an `Authorization` header and a cookie, all
/// within the first 64 bytes a worker used to publish.
fn secret_get(path: &str, ms: u64) -> String {
    format!(
        "GET {path}?ms={ms}&pw=SECRETPW HTTP/1.1\r\nAuthorization: Bearer SECRETTOKEN\r\n\
         Cookie: s=SECRETCOOKIE\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
}

/// Panics if `text` (what `what` showed) holds any of the secrets.
fn assert_no_secret(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{what} shows the secret {s}:\n{text}");
    }
}

/// A server with a control socket (in its own directory) and `--metrics-listen`.
struct Watched {
    server: Server,
    example: &'static str,
    dir: TestDir,
    metrics: String,
}

impl Watched {
    fn start(example: &'static str, tag: &str, args: &[&str]) -> Watched {
        let dir = TestDir::new("secrets", tag);
        let sock = dir.path("ctl.sock");
        let mut all = vec![
            "-l",
            "127.0.0.1:0",
            "--control",
            &sock,
            "--metrics-listen",
            "127.0.0.1:0",
        ];
        all.extend_from_slice(args);
        let server = Server::start(example, &all);
        let metrics = server.metrics_addr();
        Watched {
            server,
            example,
            dir,
            metrics,
        }
    }

    /// `EXAMPLE ARGS --control SOCK`'s stdout, which must succeed.
    fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new(example(self.example))
            .args(args)
            .args(["--control", &self.dir.path("ctl.sock")])
            .stdin(Stdio::null())
            .output()
            .expect("run the status subcommand");
        assert!(
            out.status.success(),
            "{args:?}: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The body of `GET path` on the metrics listener.
    fn page(&self, path: &str) -> String {
        let mut s = TcpStream::connect(&self.metrics).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{out:?}"));
        assert!(head.starts_with("HTTP/1.1 200 "), "{path}: {head}");
        body.to_owned()
    }

    /// Every place a request in progress is shown: (where, what it shows).
    fn views(&self) -> Vec<(&'static str, String)> {
        vec![
            ("/status", self.page("/status")),
            ("/status?json", self.page("/status?json")),
            ("status", self.ctl(&["status"])),
            ("status --json", self.ctl(&["status", "--json"])),
        ]
    }

    /// The workers' `request` fields in `status --json`.
    fn requests(&self) -> Vec<String> {
        let doc: serde_json::Value = serde_json::from_str(&self.ctl(&["status", "--json"])).unwrap();
        doc["workers"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|w| w["request"].as_str().map(str::to_owned))
            .collect()
    }

    /// Polls every view until each shows `summary` (a request in progress), finding no
    /// secret in any of them at any time.
    fn wait_and_check(&self, summary: &str) {
        let mut last = Vec::new();
        let shown = wait_until(|| {
            last = self.views();
            for (what, text) in &last {
                assert_no_secret(what, text);
            }
            last.iter().all(|(_, text)| text.contains(summary)).then_some(())
        });
        assert!(
            shown.is_some(),
            "{summary:?} never shown everywhere; last views: {last:#?}"
        );
    }

    /// The end: no log line shows a secret.
    fn check_log(&self) {
        assert_no_secret("the log", &self.server.log_text());
    }
}

/// Sends `request` and reads the reply to its end (the server closes).
fn exchange(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Sends `bytes` and keeps the connection open.
fn hold(addr: SocketAddr, bytes: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(bytes.as_bytes()).unwrap();
    s
}

/// HTTP in the synchronous models (`http_hello`): a slow call, then a call held past the
/// request timeout.
fn issue_41_no_secret_on_any_page_or_line(io: Io) {
    let w = Watched::start(
        "http_hello",
        &format!("http-{}", io.name()),
        &io.args(&["-w", "1", "--slow-request", "0.1", "--request-timeout", "8"]),
    );
    let addr = w.server.tcp_addr();
    // A handler call over --slow-request: logged by an event loop, with the summary.
    let r = exchange(addr, &secret_get("/sleep", 300));
    assert!(r.ends_with("slept\n"), "{r}");
    if io == Io::Event {
        let line = w.server.wait_for_log("--slow-request");
        assert!(line.contains("request \"GET /sleep\""), "{line}");
    }
    // A call in progress: on every page, then in the request timeout's line.
    let held = hold(addr, &secret_get("/sleep", 10_000));
    w.wait_and_check("GET /sleep");
    let line = w.server.wait_for_log("exceeded the request timeout");
    assert!(line.contains("request \"GET /sleep\""), "{line}");
    drop(held);
    w.check_log();
}

both_io!(not_async("an async worker's row does not show the call in flight on every page (issue 42's part B, figures); the async model's test is issue_41_no_secret_on_any_page_or_line_async, on asyncbed"): issue_41_no_secret_on_any_page_or_line);

/// RESP (`kv`): an `AUTH` in progress (its password not arrived whole), as an array and as
/// an inline command, then past the request timeout. Blocking workers show it (`AUTH`);
/// an event loop publishes a request only while its handler runs.
fn issue_41_no_secret_on_any_page_or_line_resp(io: Io) {
    let w = Watched::start(
        "kv",
        &format!("resp-{}", io.name()),
        &io.args(&["-w", "2", "--request-timeout", "8"]),
    );
    let addr = w.server.tcp_addr();
    // Answered (AUTH is not a kv command), on a connection that then leaves.
    let mut c = LineClient::tcp(addr);
    assert!(c.redis("AUTH default SECRETRESP").contains("ERR"));
    drop(c);
    let array = hold(addr, "*3\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$10\r\nSECRETRESP");
    let inline = hold(addr, "auth default SECRETINLINE");
    if io == Io::Blocking {
        w.wait_and_check("AUTH");
        let line = w.server.wait_for_log("exceeded the request timeout");
        assert!(line.contains("request \"AUTH\""), "{line}");
    } else {
        for (what, text) in w.views() {
            assert_no_secret(what, &text);
        }
    }
    drop((array, inline));
    w.check_log();
}

both_io!(blocking_event: issue_41_no_secret_on_any_page_or_line_resp);

/// The async model (the test server `asyncbed`, HTTP): a poll that blocks the thread
/// (`--slow-request`'s line), and a call cancelled by the request timeout.
#[test]
fn issue_41_no_secret_on_any_page_or_line_async() {
    let w = Watched::start(
        "asyncbed",
        "async",
        &["-w", "1", "--slow-request", "0.1", "--request-timeout", "5"],
    );
    let addr = w.server.tcp_addr();
    let r = exchange(addr, &secret_get("/spin", 300));
    assert!(r.ends_with("spun\n"), "{r}");
    let line = w.server.wait_for_log("--slow-request");
    assert!(line.contains("request \"GET /spin\""), "{line}");
    let held = hold(addr, &secret_get("/hold", 10_000));
    wait_until(|| {
        let doc = w.ctl(&["status", "--json"]);
        doc.contains("\"requests_in_flight\":1").then_some(())
    })
    .expect("the held call in flight");
    for (what, text) in w.views() {
        assert_no_secret(what, &text);
    }
    w.server.wait_for_log("ran longer than --request-timeout");
    drop(held);
    w.check_log();
}

/// SMTP (`smtp_sink`, a `handle_client` server): an `AUTH PLAIN` line in a session that
/// stays open.
#[test]
fn issue_41_no_secret_on_any_page_or_line_smtp() {
    let maildir = TestDir::new("secrets", "maildir");
    // Writable by the workers, which run as nobody when the tests run as root.
    std::fs::set_permissions(&maildir.0, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let w = Watched::start(
        "smtp_sink",
        "smtp",
        &[
            "-w",
            "1",
            "--hostname",
            "mx.test",
            "--maildir",
            &maildir.path("mail"),
        ],
    );
    let mut c = LineClient::tcp(w.server.tcp_addr());
    assert!(c.line().starts_with("220 "));
    c.send("EHLO client.test\r");
    while c.line().starts_with("250-") {}
    c.send("AUTH PLAIN AHVzZXIAU0VDUkVUU01UUA==\r");
    let reply = c.line();
    assert!(reply.starts_with('5'), "{reply}");
    // A second one, left unfinished.
    c.get_mut()
        .write_all(b"AUTH PLAIN AHVzZXIAU0VDUkVUU01UUA==")
        .unwrap();
    wait_until(|| {
        let doc = w.ctl(&["status", "--json"]);
        doc.contains("\"requests_in_flight\":1").then_some(())
    })
    .expect("the session in flight");
    for (what, text) in w.views() {
        assert_no_secret(what, &text);
    }
    drop(c);
    w.check_log();
}

/// With `--status-request-detail`, the operator sees a request's first bytes as before
/// (the query's secret among them), as docs/SECURITY.md says.
#[test]
fn issue_41_status_request_detail_shows_the_first_bytes() {
    let w = Watched::start(
        "http_hello",
        "detail",
        &["-w", "1", "--io", "blocking", "--status-request-detail"],
    );
    let held = hold(w.server.tcp_addr(), &secret_get("/sleep", 10_000));
    let mut last = Vec::new();
    wait_until(|| {
        last = w.requests();
        last.iter()
            .any(|r| r.starts_with("GET /sleep?ms=10000&pw=SECRETPW HTTP/1.1"))
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the first bytes never shown; last: {last:?}"));
    assert!(w.page("/status").contains("pw=SECRETPW"));
    drop(held);
}

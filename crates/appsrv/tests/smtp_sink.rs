//! The `smtp_sink` example (issue 33): an SMTP receiver written as an async client-level
//! handler (`AsyncHandler`, `Server::run_async`) in event workers, storing each message in
//! a maildir.
//!
//! Driven by Python's smtplib (python3 runs small inline scripts that print JSON), by
//! swaks when it is installed, and by raw sockets for what a library client does not send
//! (over-long lines, pipelined groups, a session left idle). Each test starts its own
//! server on `127.0.0.1:0` with its maildir in a fresh temporary directory; as root the
//! workers run as `nobody`, so that directory is made world-writable (the start failure
//! when the workers cannot write is a test of its own).

mod util;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use util::*;

/// The host name the servers of these tests are given (`--hostname`).
const HOST: &str = "mx.test";

/// A directory for one test, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory; `open` makes it writable by anyone (the workers run as `nobody`
    /// when the tests run as root).
    fn new(tag: &str, open: bool) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("appsrv-smtp-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if open {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running sink and its maildir. Fields drop in order: the server first.
struct Sink {
    server: Server,
    maildir: PathBuf,
    _dir: TempDir,
}

impl Sink {
    /// Starts `smtp_sink` on `127.0.0.1:0` with a fresh maildir, `--hostname mx.test` and
    /// `extra`.
    fn start(tag: &str, extra: &[&str]) -> Sink {
        let dir = TempDir::new(tag, true);
        let maildir = dir.0.join("mail");
        let mut args = vec![
            "-l",
            "127.0.0.1:0",
            "--hostname",
            HOST,
            "--maildir",
            maildir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let server = Server::start("smtp_sink", &args);
        Sink {
            server,
            maildir,
            _dir: dir,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.server.tcp_addr()
    }

    /// The file names in `DIR/sub`, sorted.
    fn files(&self, sub: &str) -> Vec<String> {
        files_in(&self.maildir.join(sub))
    }

    /// The content of the message file `name` in `new/`.
    fn message(&self, name: &str) -> String {
        let path = self.maildir.join("new").join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Runs `script` after the smtplib prelude (see [`python`]) against this server.
    fn python(&self, script: &str, args: &[&str]) -> Value {
        python(self.addr(), script, args)
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// What every Python script starts with: `HOST`, `PORT` (the server's, from the first
/// argument), `ARGS` (the others), `out(value)` to print the result as JSON, and
/// `reply((code, msg))` to make smtplib's replies JSON (`[code, "text"]`).
const PRELUDE: &str = r#"
import json, smtplib, socket, sys
socket.setdefaulttimeout(120)
HOST, PORT = "127.0.0.1", int(sys.argv[1])
ARGS = sys.argv[2:]
def out(value):
    print(json.dumps(value))
def reply(r):
    code, msg = r
    return [code, msg.decode("utf-8", "replace") if isinstance(msg, bytes) else msg]
"#;

/// Runs the Python `script` (after [`PRELUDE`]) with `addr`'s port and `args`, and returns
/// the JSON it printed.
fn python(addr: SocketAddr, script: &str, args: &[&str]) -> Value {
    let program = format!("{PRELUDE}\n{script}");
    let out = Command::new("python3")
        .arg("-c")
        .arg(&program)
        .arg(addr.port().to_string())
        .args(args)
        .output()
        .expect("python3 (the tests drive the sink with its smtplib)");
    assert!(
        out.status.success(),
        "python failed ({}):\n{}\nscript:\n{script}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "python printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `[code, text]` from [`PRELUDE`]'s `reply`, as a pair.
fn code_text(v: &Value) -> (u64, String) {
    let code = v[0].as_u64().unwrap_or_else(|| panic!("not a reply: {v}"));
    (code, v[1].as_str().unwrap_or_default().to_owned())
}

/// An SMTP client on a raw socket: the bytes sent are the test's.
struct Raw {
    r: BufReader<TcpStream>,
}

impl Raw {
    /// Connects and reads the greeting, which must be a `220`.
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut raw = Raw { r: BufReader::new(s) };
        let greeting = raw.reply();
        assert_eq!(greeting, format!("220 {HOST} ESMTP appsrv smtp_sink"));
        raw
    }

    fn send(&mut self, bytes: &[u8]) {
        self.r.get_mut().write_all(bytes).unwrap();
    }

    /// One reply, its lines joined by `\n` without their CRLF. Panics at the end of the
    /// connection.
    fn reply(&mut self) -> String {
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            self.r.read_line(&mut line).expect("read a reply");
            assert!(
                line.ends_with("\r\n"),
                "a reply line ends with CRLF: {line:?} after {lines:?}"
            );
            let line = line.trim_end_matches("\r\n").to_owned();
            let last = line.as_bytes().get(3) != Some(&b'-');
            lines.push(line);
            if last {
                return lines.join("\n");
            }
        }
    }

    /// Sends the command `line` (CRLF added) and returns the reply.
    fn ask(&mut self, line: &str) -> String {
        self.send(format!("{line}\r\n").as_bytes());
        self.reply()
    }

    /// Whether the server closed the connection (nothing more comes).
    fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        match self.r.read_to_end(&mut rest) {
            Ok(_) => rest.is_empty(),
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// Asserts that `reply` starts with `code` (and a space or a dash).
#[track_caller]
fn assert_code(reply: &str, code: u32) {
    let c = code.to_string();
    assert!(
        reply.starts_with(&format!("{c} ")) || reply.starts_with(&format!("{c}-")),
        "expected {code}, got {reply:?}"
    );
}

/// Issue 33: a message sent with smtplib is answered `250 OK queued as NAME` and stored as
/// `new/NAME` (nothing left in `tmp/`): the envelope lines and a `Received:` header, then
/// the message with LF line ends, every line that starts with a dot as it was written
/// (smtplib doubles the dot, the sink removes it), and one log line.
#[test]
fn issue_33_delivers_a_message_to_maildir_new_with_dot_lines_intact() {
    let sink = Sink::start("deliver", &[]);
    let got = sink.python(
        r#"
s = smtplib.SMTP(HOST, PORT)
s.ehlo("client.test")
assert s.mail("a@example.org")[0] == 250
assert s.rcpt("b@example.org")[0] == 250
assert s.rcpt("c@example.org")[0] == 250
body = "Subject: dots\r\n\r\nhello\r\n.starts with a dot\r\n..two dots\r\n.\r\nlast\r\n"
out(reply(s.data(body)))
s.quit()
"#,
        &[],
    );
    let (code, text) = code_text(&got);
    assert_eq!(code, 250, "{text}");
    let name = text.strip_prefix("OK queued as ").expect("`OK queued as NAME`");
    assert_eq!(sink.files("new"), [name.to_owned()]);
    assert!(sink.files("tmp").is_empty(), "{:?}", sink.files("tmp"));
    assert!(name.ends_with(&format!(".{HOST}")), "{name}");

    let file = sink.message(name);
    assert!(file.starts_with("Return-Path: <a@example.org>\nX-Envelope-To: <b@example.org>\nX-Envelope-To: <c@example.org>\nReceived: from client.test (127.0.0.1:"), "{file}");
    assert!(
        file.contains(&format!("by {HOST} (appsrv smtp_sink) with ESMTP id {name};\n\t")),
        "{file}"
    );
    assert!(
        file.ends_with("\nSubject: dots\n\nhello\n.starts with a dot\n..two dots\n.\nlast\n"),
        "the message, dot lines as written:\n{file}"
    );
    let line = sink.server.wait_for_log(&format!("stored {name}"));
    assert!(line.contains("from <a@example.org> to 2 recipients"), "{line}");
}

/// Issue 33: the greeting names the host; EHLO answers `SIZE` with `--max-message-size`,
/// `8BITMIME`, `PIPELINING` and `HELP`, nothing else; HELO is a one-line `250`.
#[test]
fn issue_33_ehlo_advertises_size_8bitmime_pipelining_and_help() {
    let sink = Sink::start("ehlo", &["--max-message-size", "123456"]);
    let got = sink.python(
        r#"
s = smtplib.SMTP()
greeting = reply(s.connect(HOST, PORT))
ehlo = reply(s.ehlo("client.test"))
features = s.esmtp_features
helo = reply(s.helo("client.test"))
s.quit()
out({"greeting": greeting, "ehlo": ehlo, "features": features, "helo": helo})
"#,
        &[],
    );
    assert_eq!(
        got["greeting"],
        serde_json::json!([220, format!("{HOST} ESMTP appsrv smtp_sink")])
    );
    assert_eq!(got["ehlo"][0], 250);
    assert!(
        got["ehlo"][1]
            .as_str()
            .unwrap()
            .starts_with(&format!("{HOST} Hello client.test")),
        "{got}"
    );
    assert_eq!(
        got["features"],
        serde_json::json!({"size": "123456", "8bitmime": "", "pipelining": "", "help": ""})
    );
    assert_eq!(
        got["helo"],
        serde_json::json!([250, format!("{HOST} Hello client.test")])
    );
}

/// Issue 33: RSET ends the transaction: after it, RCPT and DATA are out of sequence and a
/// new MAIL is not a nested one; nothing is stored.
#[test]
fn issue_33_rset_ends_the_transaction() {
    let sink = Sink::start("rset", &[]);
    let got = sink.python(
        r#"
s = smtplib.SMTP(HOST, PORT)
s.ehlo()
r = [reply(s.mail("a@example.org")), reply(s.rcpt("b@example.org")), reply(s.rset()),
     reply(s.rcpt("b@example.org")), reply(s.docmd("DATA")), reply(s.mail("a@example.org"))]
s.quit()
out(r)
"#,
        &[],
    );
    let codes: Vec<u64> = got.as_array().unwrap().iter().map(|r| code_text(r).0).collect();
    assert_eq!(codes, [250, 250, 250, 503, 503, 250], "{got}");
    assert!(sink.files("new").is_empty());
}

/// Issue 33: commands out of order get `503`: MAIL before HELO/EHLO, RCPT before MAIL,
/// DATA before MAIL and before RCPT, a second MAIL.
#[test]
fn issue_33_commands_out_of_sequence_get_503() {
    let sink = Sink::start("sequence", &[]);
    let got = sink.python(
        r#"
s = smtplib.SMTP(HOST, PORT)
r = {}
r["mail before ehlo"] = reply(s.docmd("MAIL FROM:<a@example.org>"))
s.ehlo()
r["rcpt before mail"] = reply(s.docmd("RCPT TO:<b@example.org>"))
r["data before mail"] = reply(s.docmd("DATA"))
r["mail"] = reply(s.docmd("MAIL FROM:<a@example.org>"))
r["nested mail"] = reply(s.docmd("MAIL FROM:<a@example.org>"))
r["data before rcpt"] = reply(s.docmd("DATA"))
r["rcpt"] = reply(s.docmd("RCPT TO:<b@example.org>"))
s.quit()
out(r)
"#,
        &[],
    );
    for (what, code) in [
        ("mail before ehlo", 503),
        ("rcpt before mail", 503),
        ("data before mail", 503),
        ("mail", 250),
        ("nested mail", 503),
        ("data before rcpt", 503),
        ("rcpt", 250),
    ] {
        assert_eq!(code_text(&got[what]).0, code, "{what}: {got}");
    }
}

/// Issue 33: bad arguments get `501`, unknown parameters `555`, unknown commands `500`,
/// known but unimplemented ones `502`; VRFY `252`, HELP `214`, NOOP `250`, and the
/// session goes on after each.
#[test]
fn issue_33_bad_arguments_get_501_unknown_commands_500() {
    let sink = Sink::start("syntax", &[]);
    let got = sink.python(
        r#"
s = smtplib.SMTP(HOST, PORT)
cmds = ["EHLO", "EHLO client.test", "MAIL FROM:a@example.org", "MAIL TO:<a@example.org>",
        "MAIL FROM:<a@example.org> SIZE=ten", "MAIL FROM:<a@example.org> BODY=BINARYMIME",
        "MAIL FROM:<a@example.org> X-FOO=1", "MAIL FROM:<> BODY=8BITMIME SIZE=10",
        "RCPT TO:<>", "RCPT TO:b@example.org", "RCPT TO:<b@example.org> NOTIFY=NEVER", "DATA now",
        "RSET all", "VRFY", "VRFY someone", "HELP", "NOOP", "EXPN list", "STARTTLS", "XYZZY", "",
        "mail from:<a@example.org>", "rcpt to:<@relay.test:b@example.org>"]
out([[c, reply(s.docmd(c))] for c in cmds])
s.quit()
"#,
        &[],
    );
    let expected = [
        501, 250, 501, 501, 501, 501, 555, 250, 501, 501, 555, 501, 501, 501, 252, 214, 250, 502, 502, 500,
        500, 503, 250,
    ];
    let got = got.as_array().unwrap();
    assert_eq!(got.len(), expected.len());
    for (pair, code) in got.iter().zip(expected) {
        assert_eq!(code_text(&pair[1]).0, code, "{}: {}", pair[0], pair[1]);
    }
}

/// Issue 33: a command line is at most 512 octets with its CRLF: one of 512 is answered,
/// one of 513 and one of 100 KB get `500 Line too long`, and the session goes on.
#[test]
fn issue_33_too_long_command_line_gets_500_and_the_session_goes_on() {
    let sink = Sink::start("long-command", &[]);
    let mut c = Raw::connect(sink.addr());
    assert_code(&c.ask("EHLO client.test"), 250);
    let noop = |len: usize| format!("NOOP {}", "x".repeat(len - "NOOP \r\n".len()));
    assert_code(&c.ask(&noop(512)), 250);
    let r = c.ask(&noop(513));
    assert_code(&r, 500);
    assert!(r.to_ascii_lowercase().contains("line too long"), "{r}");
    let r = c.ask(&noop(100_000));
    assert!(
        r.starts_with("500 ") && r.to_ascii_lowercase().contains("line too long"),
        "{r}"
    );
    assert_code(&c.ask("NOOP"), 250);
    assert_code(&c.ask("MAIL FROM:<a@example.org>"), 250);
}

/// Issue 33: a text line of a message is at most 1000 octets with its CRLF: a message with
/// a line of 1001 is refused after its final dot with `500 Line too long`, and the next
/// message on the same session, with a line of exactly 1000, is stored.
#[test]
fn issue_33_too_long_text_line_refuses_the_message_and_the_session_goes_on() {
    let sink = Sink::start("long-text", &[]);
    let got = sink.python(
        r#"
s = smtplib.SMTP(HOST, PORT)
s.ehlo()
def send(line_len):
    s.mail("a@example.org"); s.rcpt("b@example.org")
    return reply(s.data("Subject: long\r\n\r\n" + "y" * (line_len - 2) + "\r\nend\r\n"))
out([send(1001), send(1000)])
s.quit()
"#,
        &[],
    );
    let (code, text) = code_text(&got[0]);
    assert_eq!(code, 500, "{text}");
    assert!(text.to_ascii_lowercase().contains("line too long"), "{text}");
    let (code, text) = code_text(&got[1]);
    assert_eq!(code, 250, "{text}");
    let files = sink.files("new");
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(
        sink.message(&files[0])
            .ends_with(&format!("\n{}\nend\n", "y".repeat(998)))
    );
    assert!(sink.files("tmp").is_empty());
}

/// Issue 33: with `--max-message-size 1000`, a MAIL that declares `SIZE=1001` gets `552`,
/// a message of 1001 octets (dot-stuffing removed, CRLFs counted) sent without a declared
/// size gets `552` after its final dot and leaves no file, and one of exactly 1000 on the
/// same session is stored.
#[test]
fn issue_33_oversized_message_gets_552_and_leaves_no_file() {
    let sink = Sink::start("size", &["--max-message-size", "1000"]);
    let got = sink.python(
        r#"
s = smtplib.SMTP(HOST, PORT)
s.ehlo()
r = {"declared": reply(s.mail("a@example.org", ["SIZE=1001"]))}
def send(size):
    # Two lines, the first starting with a dot (stuffed on the wire, not counted twice).
    first = "." + "a" * (size // 2 - 3)
    second = "b" * (size - len(first) - 4)
    s.mail("a@example.org"); s.rcpt("b@example.org")
    return reply(s.data(first + "\r\n" + second + "\r\n"))
r["over"] = send(1001)
r["at"] = send(1000)
r["declared at"] = reply(s.mail("a@example.org", ["SIZE=1000"]))
s.quit()
out(r)
"#,
        &[],
    );
    assert_eq!(code_text(&got["declared"]).0, 552, "{got}");
    assert_eq!(code_text(&got["over"]).0, 552, "{got}");
    assert_eq!(code_text(&got["at"]).0, 250, "{got}");
    assert_eq!(code_text(&got["declared at"]).0, 250, "{got}");
    assert_eq!(sink.files("new").len(), 1, "{:?}", sink.files("new"));
    assert!(sink.files("tmp").is_empty(), "{:?}", sink.files("tmp"));
}

/// Issue 33: the 101st recipient of a message gets `452`; the message goes to the 100
/// accepted, each named in an `X-Envelope-To:` line.
#[test]
fn issue_33_recipients_beyond_100_get_452() {
    let sink = Sink::start("recipients", &[]);
    let got = sink.python(
        r#"
s = smtplib.SMTP(HOST, PORT)
s.ehlo()
s.mail("a@example.org")
codes = [s.rcpt(f"r{i}@example.org")[0] for i in range(101)]
data = reply(s.data("Subject: many\r\n\r\nhi\r\n"))
s.quit()
out({"codes": codes, "data": data})
"#,
        &[],
    );
    let codes: Vec<u64> = got["codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert!(codes[..100].iter().all(|c| *c == 250), "{codes:?}");
    assert_eq!(codes[100], 452);
    assert_eq!(code_text(&got["data"]).0, 250, "{got}");
    let files = sink.files("new");
    assert_eq!(files.len(), 1);
    let file = sink.message(&files[0]);
    assert_eq!(file.matches("X-Envelope-To: ").count(), 100, "{file}");
    assert!(!file.contains("<r100@example.org>"));
}

/// Issue 33: the sink advertises PIPELINING and keeps its word: a group sent in one write
/// (MAIL, two RCPTs, DATA; then the message, RSET, NOOP and QUIT) is answered in order.
#[test]
fn issue_33_pipelined_commands_are_answered_in_order() {
    let sink = Sink::start("pipelining", &[]);
    let mut c = Raw::connect(sink.addr());
    assert_code(&c.ask("EHLO client.test"), 250);
    c.send(b"MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.org>\r\nRCPT TO:<c@example.org>\r\nDATA\r\n");
    for code in [250, 250, 250, 354] {
        assert_code(&c.reply(), code);
    }
    c.send(b"Subject: piped\r\n\r\n..dot\r\n.\r\nRSET\r\nNOOP\r\nQUIT\r\n");
    let queued = c.reply();
    let name = queued
        .strip_prefix("250 OK queued as ")
        .unwrap_or_else(|| panic!("{queued}"));
    assert_code(&c.reply(), 250);
    assert_code(&c.reply(), 250);
    assert_eq!(
        c.reply(),
        format!("221 {HOST} Service closing transmission channel")
    );
    assert!(c.closed());
    assert!(sink.message(name).ends_with("\nSubject: piped\n\n.dot\n"));
}

/// Issue 33: 200 smtplib sessions open at once (a barrier after each has its greeting),
/// then each delivers one message: 200 files, each message once, nothing in `tmp/`, 200
/// log lines. Two event workers hold them all; a blocking pool would need 200 processes.
#[test]
fn issue_33_200_concurrent_sessions_store_200_messages() {
    const N: usize = 200;
    assert!(raise_nofile(4 * N as u64), "descriptors for {N} sessions");
    let sink = Sink::start("concurrent", &["-w", "2"]);
    let started = Instant::now();
    let errors = sink.python(
        r#"
import threading
n = int(ARGS[0])
barrier = threading.Barrier(n, timeout=120)
errors = []
def deliver(i):
    try:
        with smtplib.SMTP(HOST, PORT) as s:
            barrier.wait()
            s.sendmail(f"s{i}@example.org", [f"r{i}@example.org"],
                       f"Subject: message {i}\r\nX-Marker: {i}\r\n\r\nbody {i}\r\n.{i}\r\n")
    except Exception as e:
        errors.append(f"{i}: {e!r}")
threads = [threading.Thread(target=deliver, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
out(errors)
"#,
        &[&N.to_string()],
    );
    assert_eq!(errors, serde_json::json!([]), "every session delivers");
    let files = sink.files("new");
    assert_eq!(files.len(), N, "exactly {N} files");
    assert!(sink.files("tmp").is_empty());
    let markers: BTreeSet<usize> = files
        .iter()
        .map(|f| {
            let m = sink.message(f);
            let marker = m
                .lines()
                .find_map(|l| l.strip_prefix("X-Marker: "))
                .unwrap_or_else(|| panic!("{f}: no marker:\n{m}"));
            assert!(m.ends_with(&format!("\nbody {marker}\n.{marker}\n")), "{m}");
            marker.parse().unwrap()
        })
        .collect();
    assert_eq!(markers, (0..N).collect::<BTreeSet<_>>(), "each message once");
    sink.server.wait_for_nth_log(": stored ", N);
    eprintln!("{N} sessions delivered in {:?}", started.elapsed());
}

/// Issue 33: QUIT is answered `221 HOST Service closing transmission channel` and the
/// server closes the connection.
#[test]
fn issue_33_quit_gets_221_and_the_connection_closes() {
    let sink = Sink::start("quit", &[]);
    let got = sink.python("s = smtplib.SMTP(HOST, PORT)\nout(reply(s.quit()))", &[]);
    assert_eq!(
        got,
        serde_json::json!([221, format!("{HOST} Service closing transmission channel")])
    );
    let mut c = Raw::connect(sink.addr());
    assert_eq!(
        c.ask("QUIT"),
        format!("221 {HOST} Service closing transmission channel")
    );
    assert!(c.closed(), "closed after 221");
}

/// Issue 33: swaks, a common SMTP test tool, delivers a message, pipelining its envelope
/// (`--pipeline`, which it refuses when the server does not advertise PIPELINING). Not
/// installed, the test is reported ignored with the reason (tests/conditional.rs, issue
/// 41); under CI (`CI` set), which installs it, a missing swaks fails the test.
fn issue_33_swaks_when_installed_delivers_a_message() {
    let sink = Sink::start("swaks", &[]);
    let out = Command::new("swaks")
        .args([
            "--server",
            &sink.addr().to_string(),
            "--timeout",
            "60",
            "--pipeline",
        ])
        .args(["--from", "a@example.org", "--to", "b@example.org"])
        .args([
            "--header",
            "Subject: from swaks",
            "--body",
            "hello from swaks\n.dot line",
        ])
        .output()
        .unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "swaks failed:\n{transcript}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(transcript.contains("250 OK queued as "), "{transcript}");
    let files = sink.files("new");
    assert_eq!(files.len(), 1, "{files:?}");
    let file = sink.message(&files[0]);
    assert!(
        file.contains("\nSubject: from swaks\n") && file.contains("\n.dot line\n"),
        "{file}"
    );
}

/// Issue 33: a stop (TERM to the master) answers a session that waits for its next command
/// `421 HOST Service shutting down` and closes it; the master then exits 0.
#[test]
fn issue_33_stop_while_a_session_idles_gets_421() {
    let mut sink = Sink::start("stop-idle", &[]);
    let mut c = Raw::connect(sink.addr());
    assert_code(&c.ask("EHLO client.test"), 250);
    assert_code(&c.ask("MAIL FROM:<a@example.org>"), 250);
    sink.server.signal(libc::SIGTERM);
    assert_eq!(c.reply(), format!("421 {HOST} Service shutting down"));
    assert!(c.closed(), "closed after 421");
    let status = sink.server.wait_exit();
    assert!(status.success(), "{status:?}; log:\n{}", sink.server.log_text());
    assert!(sink.files("new").is_empty());
}

/// Issue 33: a stop while a session is in DATA lets it finish: the message is stored and
/// answered `250`, and the session's next command gets `421`. (One worker; a second,
/// idle session's `421` shows that the worker has noticed the stop before the message's
/// end is sent.)
#[test]
fn issue_33_stop_during_data_stores_the_message_then_answers_421() {
    let mut sink = Sink::start("stop-data", &["-w", "1"]);
    let mut c = Raw::connect(sink.addr());
    let mut idle = Raw::connect(sink.addr());
    for line in [
        "EHLO client.test",
        "MAIL FROM:<a@example.org>",
        "RCPT TO:<b@example.org>",
    ] {
        assert_code(&c.ask(line), 250);
    }
    assert_code(&c.ask("DATA"), 354);
    c.send(b"Subject: in flight\r\n\r\nfirst part\r\n");
    sink.server.signal(libc::SIGTERM);
    assert_eq!(idle.reply(), format!("421 {HOST} Service shutting down"));
    c.send(b"second part\r\n.\r\n");
    let queued = c.reply();
    let name = queued
        .strip_prefix("250 OK queued as ")
        .unwrap_or_else(|| panic!("{queued}"));
    assert!(
        sink.message(name)
            .ends_with("\nSubject: in flight\n\nfirst part\nsecond part\n")
    );
    assert_eq!(c.ask("NOOP"), format!("421 {HOST} Service shutting down"));
    assert!(c.closed());
    let status = sink.server.wait_exit();
    assert!(status.success(), "{status:?}; log:\n{}", sink.server.log_text());
}

/// Issue 33: a client silent for `--read-timeout` gets `421 ... Timeout ...` and is
/// disconnected: the session's half-second stop checks do not restart the timeout.
#[test]
fn issue_33_idle_client_is_cut_by_the_read_timeout_with_421() {
    let sink = Sink::start("timeout", &["--read-timeout", "2"]);
    let mut c = Raw::connect(sink.addr());
    // From before the command: the server times its silence from after the command.
    let started = Instant::now();
    assert_code(&c.ask("EHLO client.test"), 250);
    let r = c.reply();
    let took = started.elapsed();
    assert!(
        r.starts_with(&format!("421 {HOST} ")) && r.contains("Timeout"),
        "{r}"
    );
    assert!(c.closed(), "closed after 421");
    assert!(
        took >= Duration::from_secs(2),
        "cut after {took:?}, before the 2 s timeout"
    );
    assert!(
        took < Duration::from_secs(20),
        "cut after {took:?}: the stop checks restarted the timeout?"
    );
}

/// Issue 33: a maildir the workers cannot create stops the start, with the reason and the
/// workers' user named (as root: the workers run as `nobody`, and the directory's parent
/// belongs to root, mode 0755).
fn issue_33_maildir_the_workers_cannot_write_stops_the_start() {
    let dir = TempDir::new("unwritable", false);
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let maildir = dir.0.join("mail");
    let mut server = Server::spawn(
        "smtp_sink",
        &[
            "-l",
            "127.0.0.1:0",
            "-w",
            "2",
            "--maildir",
            maildir.to_str().unwrap(),
        ],
        &[],
    );
    let status = server.wait_exit();
    assert!(!status.success(), "{status:?}");
    server.wait_for_log_end();
    let log = server.log_text();
    assert!(
        log.contains("cannot create")
            && log.contains("Permission denied")
            && log.contains("the workers run as nobody"),
        "the reason reaches the terminal:\n{log}"
    );
    assert!(!group_alive(server.pid()), "nothing is left running");
}

/// Issue 33: `check` refuses a `--maildir` that is a file (`Server::on_check`).
#[test]
fn issue_33_check_refuses_a_maildir_that_is_a_file() {
    let dir = TempDir::new("check", false);
    let file = dir.0.join("file");
    std::fs::write(&file, "").unwrap();
    let out = Command::new(example("smtp_sink"))
        .args(["check", "-l", "127.0.0.1:0", "--maildir", file.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("is not a directory"), "{err}");
    let ok = Command::new(example("smtp_sink"))
        .args([
            "check",
            "-l",
            "127.0.0.1:0",
            "--maildir",
            dir.0.join("new/mail").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
}

/// Issue 33: after 20 refused commands the session is closed with `421 HOST Too many
/// errors`, so that a client speaking another protocol (an HTTP request sent to the wrong
/// port) does not hold its connection.
#[test]
fn issue_33_twenty_refused_commands_end_the_session_with_421() {
    let sink = Sink::start("errors", &[]);
    let mut c = Raw::connect(sink.addr());
    for _ in 0..19 {
        assert_code(&c.ask("GET / HTTP/1.1"), 500);
    }
    assert_code(&c.ask("NOOP"), 250);
    assert_code(&c.ask("GET / HTTP/1.1"), 500);
    assert_eq!(
        c.reply(),
        format!("421 {HOST} Too many errors, closing transmission channel")
    );
    assert!(c.closed());
}

/// Issue 41: a message ends only at `<CRLF>.<CRLF>`. SMTP smuggling hides a second
/// message after a bare line end (`\n.\n`, `\n.\r\n`, `\r\n.\n`) that a lenient server
/// takes for the end of the first: the sink answers such a message, and one with a bare
/// CR, `521 HOST Error: bare <LF> received` (`<CR>`), closes the session and stores
/// nothing, neither the message nor the one smuggled after it.
#[test]
fn issue_41_smuggled_message_after_a_bare_line_end_is_never_stored() {
    let sink = Sink::start("smuggling", &[]);
    let smuggled = "MAIL FROM:<evil@x.test>\r\nRCPT TO:<victim@y.test>\r\nDATA\r\n\
                    Subject: smuggled\r\n\r\nevil\r\n.\r\nQUIT\r\n";
    for (end, bare) in [
        ("\n.\n", "<LF>"),
        ("\n.\r\n", "<LF>"),
        ("\r\n.\n", "<LF>"),
        ("\r\n.\r", "<CR>"),
        ("\rmore\r\n.\r\n", "<CR>"),
    ] {
        let mut c = Raw::connect(sink.addr());
        assert_code(&c.ask("EHLO client.test"), 250);
        assert_code(&c.ask("MAIL FROM:<a@example.org>"), 250);
        assert_code(&c.ask("RCPT TO:<b@example.org>"), 250);
        assert_code(&c.ask("DATA"), 354);
        c.send(format!("Subject: one\r\n\r\nbody{end}{smuggled}").as_bytes());
        let mut replies = Vec::new();
        // Every reply until the server closes; the client closes its side after the
        // first, so that the server's lingering close ends at once.
        loop {
            let mut line = String::new();
            match c.r.read_line(&mut line) {
                Ok(0) => break,
                Ok(_) => replies.push(line),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("{end:?}: {e} after {replies:?}"),
            }
            let _ = c.r.get_ref().shutdown(std::net::Shutdown::Write);
        }
        assert_eq!(
            replies,
            [format!("521 {HOST} Error: bare {bare} received\r\n")],
            "the message ended by {end:?}"
        );
        assert!(sink.files("new").is_empty(), "{end:?}: {:?}", sink.files("new"));
    }
    // Nothing left in tmp/ either (the drafts go with their sessions).
    let deadline = Instant::now() + PATIENCE;
    while !sink.files("tmp").is_empty() {
        assert!(Instant::now() < deadline, "{:?}", sink.files("tmp"));
        std::thread::sleep(Duration::from_millis(20));
    }
    // The sink still takes mail.
    let got = sink.python(
        r#"
s = smtplib.SMTP(HOST, PORT)
out(reply(s.sendmail("a@example.org", ["b@example.org"], "Subject: fine\r\n\r\nok\r\n") or (250, "sent")))
"#,
        &[],
    );
    assert_eq!(code_text(&got).0, 250, "{got}");
    assert_eq!(sink.files("new").len(), 1);
}

/// Issue 41: an `EHLO` or `HELO` name with a control character (NUL, ESC) is refused with
/// `501`, and no control byte of the client's reaches the stored `Received:` header.
#[test]
fn issue_41_ehlo_name_with_control_bytes_is_refused_and_never_stored() {
    let sink = Sink::start("helo-control", &[]);
    let mut c = Raw::connect(sink.addr());
    for name in ["nul\0.test", "esc\x1b[31m.test", "del\x7f.test", "bell\x07"] {
        for verb in ["EHLO", "HELO"] {
            let reply = c.ask(&format!("{verb} {name}"));
            assert_code(&reply, 501);
            assert!(!reply.contains(|ch: char| ch.is_control()), "{reply:?}");
        }
    }
    // Without a HELO or EHLO accepted, a transaction cannot start.
    assert_code(&c.ask("MAIL FROM:<a@example.org>"), 503);
    assert_code(&c.ask("EHLO client.test"), 250);
    assert_code(&c.ask("MAIL FROM:<a@example.org>"), 250);
    assert_code(&c.ask("RCPT TO:<b@example.org>"), 250);
    assert_code(&c.ask("DATA"), 354);
    let queued = c.ask("Subject: clean\r\n\r\nhi\r\n.");
    let name = queued
        .strip_prefix("250 OK queued as ")
        .unwrap_or_else(|| panic!("{queued}"));
    let file = sink.message(name);
    assert!(file.contains("Received: from client.test ("), "{file}");
    assert!(
        !file.contains(|ch: char| ch.is_control() && ch != '\n' && ch != '\t'),
        "{file:?}"
    );
}

/// Issue 41: every `4xx` and `5xx` reply counts towards the limit of 20 errors, as with
/// Postfix's `smtpd_hard_error_limit`, the `452 Too many recipients` included once a client
/// goes on 100 recipients beyond the limit of 100 (`smtpd_recipient_overshoot_limit`): a
/// client that sent 10,000 recipients in one session got 9,900 `452`s and kept its
/// connection. Here 5 commands refused with `500`, then recipients: 100 taken, 100 refused
/// without counting, then the 15th counted `452` is followed by `421` and the close.
#[test]
fn issue_41_every_4xx_and_5xx_reply_counts_towards_the_error_limit() {
    let sink = Sink::start("error-limit", &[]);
    let mut c = Raw::connect(sink.addr());
    for _ in 0..5 {
        assert_code(&c.ask("GET / HTTP/1.1"), 500);
    }
    assert_code(&c.ask("EHLO client.test"), 250);
    assert_code(&c.ask("MAIL FROM:<a@example.org>"), 250);
    for i in 0..100 {
        assert_code(&c.ask(&format!("RCPT TO:<r{i}@example.org>")), 250);
    }
    for i in 100..214 {
        let reply = c.ask(&format!("RCPT TO:<r{i}@example.org>"));
        assert_eq!(reply, "452 Too many recipients", "recipient {i}");
    }
    assert_eq!(c.ask("RCPT TO:<r214@example.org>"), "452 Too many recipients");
    assert_eq!(
        c.reply(),
        format!("421 {HOST} Too many errors, closing transmission channel")
    );
    assert!(c.closed());
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![
        test(
            "issue_33_swaks_when_installed_delivers_a_message",
            &[Need::Program("swaks", "swaks")],
            issue_33_swaks_when_installed_delivers_a_message,
        ),
        test(
            "issue_33_maildir_the_workers_cannot_write_stops_the_start",
            &[Need::Root],
            issue_33_maildir_the_workers_cannot_write_stops_the_start,
        ),
    ]
}

//! A mail sink: a small SMTP receiver (RFC 5321) that stores every message it accepts as
//! one file in a maildir and delivers nothing, written as an async client-level handler
//! (`AsyncHandler`, `Server::run_async`, issue 33): thousands of SMTP sessions per event
//! worker, each a future of the worker's tokio runtime.
//!
//! Run it:
//!
//! ```text
//! cargo run --release --example smtp_sink                            # 127.0.0.1:2525, ./smtp-sink-mail
//! cargo run --release --example smtp_sink -- --maildir /tmp/sink --max-message-size 1048576
//! ```
//!
//! Then send it mail, from another terminal:
//!
//! ```text
//! $ swaks --server 127.0.0.1:2525 --to someone@example.org
//! $ python3 -c 'import smtplib; smtplib.SMTP("127.0.0.1", 2525).sendmail("a@example.org", ["b@example.org"], "Subject: hi\r\n\r\nhello\r\n")'
//! $ ls smtp-sink-mail/new/
//! 1717408800.M123456P4242Q1.myhost
//! ```
//!
//! The dialogue: the greeting `220 HOST ESMTP appsrv smtp_sink`; `EHLO` (answered with
//! `SIZE <--max-message-size>`, `8BITMIME`, `PIPELINING` and `HELP`) or `HELO` (a name
//! with a control character, NUL or ESC for instance, gets `501`: it would be written
//! into the stored `Received:` header); `MAIL
//! FROM:<path>` with the optional parameters `SIZE=` (a declared size over the limit gets
//! `552`) and `BODY=7BIT|8BITMIME` (others `555`); `RCPT TO:<path>` (at most 100
//! recipients, `452` beyond); `DATA` (`354`, then lines until a lone `.`, dot-stuffing
//! removed; see below for line ends); `RSET`, `NOOP`, `VRFY` (`252`), `HELP` (`214`), `QUIT` (`221`). `EXPN`,
//! `STARTTLS`, `AUTH`, `BDAT`, `ETRN`, `TURN`, `SEND`, `SOML` and `SAML` get `502` (not
//! implemented), other commands `500`; a command out of order (`MAIL` before `HELO` or
//! `EHLO`, `RCPT` before `MAIL`, `DATA` before `RCPT`, a second `MAIL`) gets `503`; bad
//! arguments get `501`. No enhanced status codes (EHLO does not announce them). After 20
//! errors the session is closed with `421 HOST Too many errors` (as Postfix's
//! `smtpd_hard_error_limit`: every `4xx` and `5xx` reply counts, except the `452`s of the
//! first 100 recipients beyond the limit in a transaction, as Postfix's
//! `smtpd_recipient_overshoot_limit`).
//!
//! Line ends: a message ends only at `<CRLF>.<CRLF>` (RFC 5321 §4.1.1.4), and a bare LF
//! or a bare CR (one not part of a CRLF) in a message is refused: the sink answers `521
//! HOST Error: bare <LF> received` (or `<CR>`), stores nothing of that message and closes
//! the session, as Postfix's first `smtpd_forbid_bare_newline = yes` did (Postfix 3.9's
//! default, `normalize`, takes such lines as if they ended with CRLF, and also ends data
//! only at `<CRLF>.<CRLF>`). Refused rather than normalized: the bytes after a `\n.\n`
//! are where SMTP smuggling hides a second message, a sink for tests is better strict
//! than lenient, and closing the session keeps every byte after the bare line end from
//! being read as a command. Command lines may end with a bare LF (for `nc` users).
//!
//! Limits: a command line is at most 512 octets and a text line of a message at most 1000,
//! CRLF included (RFC 5321 §4.5.3.1.4 and 4.5.3.1.6). A longer command line is read to its
//! end, answered `500 Line too long`, and the session goes on; a longer text line is
//! discarded with the rest of the message, which is answered `500 Line too long` after its
//! final `.`. A message larger than `--max-message-size` (default 10 MiB: its lines as
//! sent, dot-stuffing removed, CRLF included) is read to its end, discarded, and answered
//! `552`. The limits are those of the sender's bytes: a client that sends without end
//! costs the worker its reading, never its memory.
//!
//! Pipelining (RFC 2920) is real: commands are read from a buffer, so a client may send a
//! group (`MAIL`, `RCPT`s, `DATA`) in one packet, and the replies to a group go out
//! together, when the server has read all that the client sent.
//!
//! Storage: each accepted message is written to `DIR/tmp/NAME`, then renamed to
//! `DIR/new/NAME` (a maildir: `DIR/cur` is created too, for mail readers), and the client
//! gets `250 OK queued as NAME`. NAME is `SECONDS.MMICROSECONDSPpidQn.HOST`, unique to the
//! worker (pid) and the message (n). The file holds a `Return-Path:` line, an
//! `X-Envelope-To:` line per recipient and a `Received:` header, then the message as
//! received, dot-stuffing removed, each line ended with LF (the maildir convention). Files
//! are not fsynced: a sink for tests and development, not a mail queue. A session that
//! ends before the final `.` leaves nothing behind. One log line per message stored.
//!
//! `DIR` and its `tmp`, `new` and `cur` are created by the workers, after they drop their
//! privileges: started as root, the workers run as `nobody` (or `--user USER`), which must
//! be allowed to write there, or the start fails with that reason. Give the directory to
//! that user, or choose `--user`, or (for a test) `--allow-root-workers`. The file writes
//! are ordinary blocking writes on the worker's thread (to the page cache: microseconds).
//!
//! Stopping: a stop (TERM, `stop`, a reload or an upgrade) answers each session waiting
//! for a command `421 HOST Service shutting down` and closes it; a session in the middle
//! of `DATA` receives its message, stores it, answers it, and gets the `421` at its next
//! command. The check is made every half second (see [`STOP_CHECK`]). After a `421`, what
//! the client still sends is read and discarded until it closes, for 2 s at most, so that
//! the reply is not lost to a reset (see [`LINGER`]). A client silent for
//! `--read-timeout` (60 s by default; RFC 5321 suggests 5 minutes) gets `421 HOST Timeout
//! exceeded, closing transmission channel`, best effort, and is disconnected.
//!
//! What to observe: every session is a future of its worker's runtime, so two workers
//! (`-w`, default one per CPU) hold hundreds of concurrent sessions (tests/smtp_sink.rs
//! opens 200 smtplib sessions at once, then delivers a message on each); `status` (with
//! `--control`) shows the open connections per worker. `reload` answers the sessions of
//! the old workers `421` as a stop does, while the new workers take new ones. With `-l
//! '127.0.0.1:4650?tls' --tls-cert cert.pem --tls-key key.pem` the same sink speaks SMTP
//! over implicit TLS (as on port 465: `smtplib.SMTP_SSL`, `swaks --tlsc`; there is no
//! STARTTLS).

use std::cell::Cell;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use appsrv::AsyncClient;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The longest command line, CRLF included (RFC 5321 §4.5.3.1.4).
const COMMAND_LINE_MAX: usize = 512;
/// The longest text line of a message, CRLF included (RFC 5321 §4.5.3.1.6).
const TEXT_LINE_MAX: usize = 1000;
/// Recipients per message (RFC 5321 §4.5.3.1.8 asks a server to take at least 100).
const MAX_RECIPIENTS: usize = 100;
/// Errors (`4xx` and `5xx` replies) after which a session is closed with `421`, as
/// Postfix's `smtpd_hard_error_limit`.
const MAX_ERRORS: u32 = 20;
/// Recipients refused with `452` (over [`MAX_RECIPIENTS`]) in a transaction that do not
/// count as errors: a client with a long list sends the rest in another transaction
/// (Postfix's `smtpd_recipient_overshoot_limit`).
const RECIPIENT_OVERSHOOT: usize = 100;
/// How long the last reply (`421`) of a session cut by a timeout may take to go out.
const FAREWELL: Duration = Duration::from_secs(5);
/// After a `421` to a client that may still be sending (pipelined commands), how long and
/// how much of its input is read and discarded before the connection is closed: a socket
/// closed with unread input sends a reset, which can destroy the reply before the client
/// reads it. The client's own close ends the wait at once.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 256 * 1024;

#[derive(clap::Args, Debug)]
struct Args {
    /// Store each accepted message as one file in the maildir DIR (DIR/new); DIR, DIR/tmp,
    /// DIR/new and DIR/cur are created by the workers if missing
    #[arg(long, value_name = "DIR", default_value = "./smtp-sink-mail")]
    maildir: PathBuf,

    /// Refuse a message larger than BYTES with 552 (announced as EHLO's SIZE)
    #[arg(long, value_name = "BYTES", default_value_t = 10 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_message_size: u64,

    /// The server's name in the greeting, the replies and the Received header [default:
    /// the system's host name]
    #[arg(long, value_name = "NAME")]
    hostname: Option<String>,
}

/// What every worker's handler knows, made in the master.
#[derive(Clone, Debug)]
struct Config {
    maildir: PathBuf,
    max_size: u64,
    host: String,
    /// `host` as it may appear in a file name.
    host_in_names: String,
}

/// The handler: one per worker, shared by its sessions.
struct Sink {
    config: Config,
    pid: u32,
    /// Messages this worker has started to write (for unique file names).
    drafts: Cell<u64>,
}

impl appsrv::AsyncHandler for Sink {
    async fn handle_client(&self, client: &mut AsyncClient) -> io::Result<()> {
        let peer = client.peer_addr().to_string();
        let mut session = Session {
            sink: self,
            peer,
            wire: Wire::new(client),
            helo: None,
            from: None,
            rcpts: Vec::new(),
            overshoot: 0,
            errors: 0,
        };
        session.run().await
    }
}

/// The connection: the client's input, read by lines of a bounded length, and the replies
/// not sent yet.
struct Wire<'c> {
    io: BufReader<&'c mut AsyncClient>,
    /// Replies written, sent before the next wait for the client.
    out: Vec<u8>,
    /// The line read, its end of line included; or its beginning, while it is read.
    line: Vec<u8>,
    /// Whether `line` holds a whole line, to be cleared before the next.
    complete: bool,
    /// The line read is longer than its limit: the rest of it is skipped.
    overflow: bool,
    /// The first bare line end in the line read, its skipped part included: `"<LF>"` (an
    /// LF not preceded by CR) or `"<CR>"` (a CR not followed by LF).
    bare: Option<&'static str>,
    /// The last byte of the line read so far was a CR.
    after_cr: bool,
}

/// What [`Wire::read_line`] found.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    /// A line, in `Wire::line`.
    Line,
    /// A line over the limit, read to its end and dropped.
    TooLong,
    /// The end of the connection (a last line without its end is dropped).
    Eof,
}

impl<'c> Wire<'c> {
    fn new(client: &'c mut AsyncClient) -> Self {
        Wire {
            io: BufReader::new(client),
            out: Vec::with_capacity(256),
            line: Vec::with_capacity(128),
            complete: false,
            overflow: false,
            bare: None,
            after_cr: false,
        }
    }

    fn client(&self) -> &AsyncClient {
        self.io.get_ref()
    }

    /// Queues one reply line (without its CRLF).
    fn reply(&mut self, line: &str) {
        self.out.extend_from_slice(line.as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }

    /// Sends the replies queued. Cancel-safe: what went out is removed as it goes.
    async fn send(&mut self) -> io::Result<()> {
        while !self.out.is_empty() {
            let n = self.io.get_mut().write(&self.out).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.out.drain(..n);
        }
        // TLS records the writes left, if any.
        self.io.get_mut().flush().await
    }

    /// Sends the replies queued, then reads and discards what the client sends until it
    /// closes the connection, for at most [`LINGER`] and [`LINGER_BYTES`].
    async fn send_and_linger(&mut self) -> io::Result<()> {
        self.send().await?;
        let mut left = LINGER_BYTES;
        let drain = async {
            while left > 0 {
                let n = match self.io.fill_buf().await {
                    Ok(buf) if !buf.is_empty() => buf.len().min(left),
                    _ => return,
                };
                self.io.consume(n);
                left -= n;
            }
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
        Ok(())
    }

    /// Reads the next line, of at most `limit` bytes with its end of line, into
    /// `self.line`. The replies queued are sent before it waits for the client, not
    /// before: the replies to a pipelined group go out together.
    ///
    /// Cancel-safe: what was read is kept in `self`, and the next call goes on with it.
    async fn read_line(&mut self, limit: usize) -> io::Result<Got> {
        if std::mem::take(&mut self.complete) {
            self.line.clear();
            self.bare = None;
            self.after_cr = false;
        }
        loop {
            if self.io.buffer().is_empty() && !self.out.is_empty() {
                self.send().await?;
            }
            let buf = self.io.fill_buf().await?;
            if buf.is_empty() {
                return Ok(Got::Eof);
            }
            let (take, end) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            for &b in &buf[..take] {
                // A CR must be followed by LF, and an LF preceded by CR.
                if self.bare.is_none() && self.after_cr != (b == b'\n') {
                    self.bare = Some(if self.after_cr { "<CR>" } else { "<LF>" });
                }
                self.after_cr = b == b'\r';
            }
            if !self.overflow {
                if self.line.len() + take > limit {
                    self.overflow = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(&buf[..take]);
                }
            }
            self.io.consume(take);
            if end {
                self.complete = true;
                return Ok(if std::mem::take(&mut self.overflow) {
                    Got::TooLong
                } else {
                    Got::Line
                });
            }
        }
    }

    /// The line read, without its end of line (CRLF, or a bare LF).
    fn text(&self) -> &[u8] {
        let l = self.line.strip_suffix(b"\n").unwrap_or(&self.line);
        l.strip_suffix(b"\r").unwrap_or(l)
    }
}

/// Whether the session goes on after a command.
enum Flow {
    Continue,
    Close,
}

/// One SMTP session.
struct Session<'c> {
    sink: &'c Sink,
    peer: String,
    wire: Wire<'c>,
    /// The name given by `HELO` or `EHLO`, and whether it was `EHLO`.
    helo: Option<(String, bool)>,
    /// The transaction: its reverse path (`MAIL`), then its recipients (`RCPT`).
    from: Option<String>,
    rcpts: Vec<String>,
    /// The transaction's recipients refused for being too many.
    overshoot: usize,
    /// The `4xx` and `5xx` replies of the session (see [`MAX_ERRORS`]).
    errors: u32,
}

impl Session<'_> {
    fn host(&self) -> &str {
        &self.sink.config.host
    }

    async fn run(&mut self) -> io::Result<()> {
        let greeting = format!("220 {} ESMTP appsrv smtp_sink", self.host());
        self.wire.reply(&greeting);
        match self.converse().await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                tracing::info!("{}: {e}", self.peer);
                let bye = format!(
                    "421 {} Timeout exceeded, closing transmission channel",
                    self.host()
                );
                self.wire.reply(&bye);
                // Best effort: the client may not be reading either.
                let _ = tokio::time::timeout(FAREWELL, self.wire.send()).await;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The commands, until `QUIT`, the end of the connection or a stop.
    async fn converse(&mut self) -> io::Result<()> {
        loop {
            let got = match self.next_command().await? {
                Some(got) => got,
                None => {
                    let bye = format!("421 {} Service shutting down", self.host());
                    self.wire.reply(&bye);
                    return self.wire.send_and_linger().await;
                }
            };
            let flow = match got {
                Got::Eof => return Ok(()),
                Got::TooLong => self.refuse("500 Line too long"),
                Got::Line => self.command().await?,
            };
            if let Flow::Close = flow {
                return self.wire.send().await;
            }
            if self.errors >= MAX_ERRORS {
                let bye = format!(
                    "421 {} Too many errors, closing transmission channel",
                    self.host()
                );
                self.wire.reply(&bye);
                return self.wire.send_and_linger().await;
            }
        }
    }

    /// Waits for the next command line; `None` if the worker stops first.
    async fn next_command(&mut self) -> io::Result<Option<Got>> {
        // The stop's future does not borrow the client, which the read needs (the read
        // is cancel-safe: what it read stays in `self.wire`).
        let stopped = self.wire.client().stopped();
        tokio::select! {
            biased;
            () = stopped => Ok(None),
            got = self.wire.read_line(COMMAND_LINE_MAX) => got.map(Some),
        }
    }

    /// Queues a refusal (a `4xx` or `5xx` reply), counted towards [`MAX_ERRORS`]. Every
    /// such reply goes through here but those that end the session (`421`, `521`) and the
    /// first [`RECIPIENT_OVERSHOOT`] excess recipients' `452`.
    fn refuse(&mut self, reply: &str) -> Flow {
        self.errors += 1;
        self.wire.reply(reply);
        Flow::Continue
    }

    fn ok(&mut self) -> Flow {
        self.wire.reply("250 OK");
        Flow::Continue
    }

    /// Answers the command line in `self.wire`.
    async fn command(&mut self) -> io::Result<Flow> {
        let line = String::from_utf8_lossy(self.wire.text()).into_owned();
        let (verb, arg) = match line.split_once(' ') {
            Some((v, a)) => (v, a.trim()),
            None => (line.as_str(), ""),
        };
        let flow = match verb.to_ascii_uppercase().as_str() {
            "EHLO" | "HELO" if arg.is_empty() || arg.contains(char::is_whitespace) => {
                self.refuse(&format!("501 Syntax: {} hostname", verb.to_ascii_uppercase()))
            }
            // The name goes into the stored `Received:` header and the reply: no byte of
            // the client's may end a header line there or reach a terminal that reads it.
            "EHLO" | "HELO" if arg.contains(char::is_control) => {
                self.refuse("501 Invalid hostname: control characters are not allowed")
            }
            "EHLO" => {
                self.reset();
                self.helo = Some((arg.to_owned(), true));
                let host = self.host().to_owned();
                let size = self.sink.config.max_size;
                self.wire.reply(&format!("250-{host} Hello {arg}"));
                self.wire.reply(&format!("250-SIZE {size}"));
                self.wire.reply("250-8BITMIME");
                self.wire.reply("250-PIPELINING");
                self.wire.reply("250 HELP");
                Flow::Continue
            }
            "HELO" => {
                self.reset();
                self.helo = Some((arg.to_owned(), false));
                let reply = format!("250 {} Hello {arg}", self.host());
                self.wire.reply(&reply);
                Flow::Continue
            }
            "MAIL" => self.mail(arg),
            "RCPT" => self.rcpt(arg),
            "DATA" if !arg.is_empty() => self.refuse("501 Syntax: DATA takes no argument"),
            "DATA" if self.from.is_none() => self.refuse("503 Bad sequence of commands: MAIL first"),
            "DATA" if self.rcpts.is_empty() => self.refuse("503 Bad sequence of commands: RCPT first"),
            "DATA" => return self.data().await,
            "RSET" if !arg.is_empty() => self.refuse("501 Syntax: RSET takes no argument"),
            "RSET" => {
                self.reset();
                self.ok()
            }
            "NOOP" => self.ok(),
            "QUIT" => {
                let bye = format!("221 {} Service closing transmission channel", self.host());
                self.wire.reply(&bye);
                Flow::Close
            }
            "VRFY" if arg.is_empty() => self.refuse("501 Syntax: VRFY address"),
            "VRFY" => {
                self.wire
                    .reply("252 Cannot VRFY user, but will accept message and attempt delivery");
                Flow::Continue
            }
            "HELP" => {
                self.wire
                    .reply("214-appsrv smtp_sink: a mail sink; messages are stored, never delivered");
                self.wire
                    .reply("214 Commands: HELO EHLO MAIL RCPT DATA RSET NOOP VRFY HELP QUIT");
                Flow::Continue
            }
            "EXPN" | "STARTTLS" | "AUTH" | "BDAT" | "ETRN" | "TURN" | "SEND" | "SOML" | "SAML" => {
                self.refuse("502 Command not implemented")
            }
            _ => self.refuse("500 Syntax error, command unrecognized"),
        };
        Ok(flow)
    }

    /// Ends the transaction (`RSET`, `HELO`, `EHLO`, after `DATA`).
    fn reset(&mut self) {
        self.from = None;
        self.rcpts.clear();
        self.overshoot = 0;
    }

    fn mail(&mut self, arg: &str) -> Flow {
        let Some((_, esmtp)) = self.helo else {
            return self.refuse("503 Bad sequence of commands: HELO or EHLO first");
        };
        if self.from.is_some() {
            return self.refuse("503 Bad sequence of commands: nested MAIL command");
        }
        let Some((path, params)) = strip_keyword(arg, "FROM:").and_then(parse_path) else {
            return self.refuse("501 Syntax: MAIL FROM:<address>");
        };
        for param in params.split_ascii_whitespace() {
            if !esmtp {
                return self.refuse("555 MAIL FROM parameters not recognized or not implemented");
            }
            let (key, value) = param.split_once('=').unwrap_or((param, ""));
            match key.to_ascii_uppercase().as_str() {
                "SIZE" => match value.parse::<u64>() {
                    Ok(n) if value.bytes().all(|b| b.is_ascii_digit()) => {
                        if n > self.sink.config.max_size {
                            return self.refuse("552 Message size exceeds fixed maximum message size");
                        }
                    }
                    _ => return self.refuse("501 Syntax: SIZE=<number of octets>"),
                },
                "BODY" if value.eq_ignore_ascii_case("7BIT") || value.eq_ignore_ascii_case("8BITMIME") => {}
                "BODY" => return self.refuse("501 Syntax: BODY=7BIT or BODY=8BITMIME"),
                _ => return self.refuse("555 MAIL FROM parameters not recognized or not implemented"),
            }
        }
        self.from = Some(path);
        self.ok()
    }

    fn rcpt(&mut self, arg: &str) -> Flow {
        if self.from.is_none() {
            return self.refuse("503 Bad sequence of commands: MAIL first");
        }
        let Some((path, params)) = strip_keyword(arg, "TO:").and_then(parse_path) else {
            return self.refuse("501 Syntax: RCPT TO:<address>");
        };
        if path.is_empty() {
            return self.refuse("501 Syntax: RCPT TO:<address>");
        }
        if !params.is_empty() {
            return self.refuse("555 RCPT TO parameters not recognized or not implemented");
        }
        if self.rcpts.len() >= MAX_RECIPIENTS {
            // A temporary refusal: the client sends the rest in another transaction. Only
            // a client that goes on far beyond the limit is making errors.
            self.overshoot += 1;
            if self.overshoot > RECIPIENT_OVERSHOOT {
                return self.refuse("452 Too many recipients");
            }
            self.wire.reply("452 Too many recipients");
            return Flow::Continue;
        }
        self.rcpts.push(path);
        self.ok()
    }

    /// `DATA`: receives the message and stores it.
    async fn data(&mut self) -> io::Result<Flow> {
        self.wire.reply("354 Start mail input; end with <CRLF>.<CRLF>");
        let n = self.sink.drafts.get() + 1;
        self.sink.drafts.set(n);
        let name = self.file_name(n);
        let mut draft = Draft::create(&self.sink.config.maildir, &name);
        if let Ok(d) = &mut draft {
            let head = self.trace_headers(&name);
            if let Err(e) = d.write(head.as_bytes()) {
                draft = Err(e);
            }
        }
        let max = self.sink.config.max_size;
        let (mut size, mut oversize, mut too_long) = (0u64, false, false);
        loop {
            let got = self.wire.read_line(TEXT_LINE_MAX).await?;
            if let (Got::Line | Got::TooLong, Some(what)) = (&got, self.wire.bare) {
                // Data ends only at <CRLF>.<CRLF>: a bare LF or CR is how a message is
                // smuggled past a server that reads its end differently (`\n.\n`). The
                // message is refused and the session dropped, so that nothing after it is
                // read as commands. The draft goes with the session.
                tracing::info!("{}: bare {what} in a message: refused, disconnecting", self.peer);
                self.errors += 1;
                let bye = format!("521 {} Error: bare {what} received", self.host());
                self.wire.reply(&bye);
                self.wire.send_and_linger().await?;
                return Ok(Flow::Close);
            }
            match got {
                // The draft goes with the session.
                Got::Eof => return Ok(Flow::Close),
                Got::TooLong => too_long = true,
                Got::Line => {
                    let text = self.wire.text();
                    if text == b"." {
                        break;
                    }
                    // Transparency (RFC 5321 §4.5.2): a leading dot was doubled.
                    let text = text.strip_prefix(b".").unwrap_or(text);
                    size += text.len() as u64 + 2;
                    oversize |= size > max;
                    if !oversize && !too_long {
                        if let Ok(d) = &mut draft {
                            if let Err(e) = d.write_line(text) {
                                draft = Err(e);
                            }
                        }
                    }
                }
            }
        }
        let from = self.from.take().unwrap_or_default();
        let rcpts = std::mem::take(&mut self.rcpts);
        let flow = if oversize {
            self.refuse("552 Message size exceeds fixed maximum message size")
        } else if too_long {
            self.refuse("500 Line too long")
        } else {
            match draft.and_then(Draft::commit) {
                Ok(()) => {
                    tracing::info!(
                        "{}: stored {name}: {size} bytes from <{from}> to {} recipient{}",
                        self.peer,
                        rcpts.len(),
                        if rcpts.len() == 1 { "" } else { "s" }
                    );
                    self.wire.reply(&format!("250 OK queued as {name}"));
                    Flow::Continue
                }
                Err(e) => {
                    tracing::warn!(
                        "{}: cannot store a message in {}: {e}",
                        self.peer,
                        self.sink.config.maildir.display()
                    );
                    self.refuse("451 Requested action aborted: local error in processing")
                }
            }
        };
        Ok(flow)
    }

    /// `SECONDS.MMICROSECONDSPpidQn.HOST`, as maildir names go.
    fn file_name(&self, n: u64) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        format!(
            "{}.M{}P{}Q{n}.{}",
            now.as_secs(),
            now.subsec_micros(),
            self.sink.pid,
            self.sink.config.host_in_names
        )
    }

    /// The lines the file starts with: the envelope and a `Received:` header.
    fn trace_headers(&self, id: &str) -> String {
        let mut head = format!("Return-Path: <{}>\n", self.from.as_deref().unwrap_or(""));
        for rcpt in &self.rcpts {
            head.push_str(&format!("X-Envelope-To: <{rcpt}>\n"));
        }
        let (helo, esmtp) = self.helo.clone().unwrap_or_default();
        let with = if esmtp { "ESMTP" } else { "SMTP" };
        head.push_str(&format!(
            "Received: from {helo} ({})\n\tby {} (appsrv smtp_sink) with {with} id {id}",
            self.peer,
            self.host()
        ));
        if let [rcpt] = self.rcpts.as_slice() {
            head.push_str(&format!("\n\tfor <{rcpt}>"));
        }
        head.push_str(&format!(";\n\t{}\n", rfc5322_date(SystemTime::now())));
        head
    }
}

/// `arg` after `keyword` (ASCII case ignored), then optional spaces.
fn strip_keyword<'a>(arg: &'a str, keyword: &str) -> Option<&'a str> {
    let head = arg.get(..keyword.len())?;
    head.eq_ignore_ascii_case(keyword)
        .then(|| arg[keyword.len()..].trim_start())
}

/// `<path> PARAMS`: the address in the angle brackets (a source route `@a,@b:` dropped,
/// RFC 5321 §4.1.1.3) and the parameters after it.
fn parse_path(s: &str) -> Option<(String, &str)> {
    let rest = s.strip_prefix('<')?;
    let end = rest.find('>')?;
    let (path, params) = (&rest[..end], &rest[end + 1..]);
    if !(params.is_empty() || params.starts_with(' ')) {
        return None;
    }
    let path = match path.strip_prefix('@') {
        Some(routed) => &routed[routed.find(':')? + 1..],
        None => path,
    };
    if path
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == '<')
    {
        return None;
    }
    Some((path.to_owned(), params.trim()))
}

/// A message being written in `tmp/`: removed unless committed (a refused message, a
/// session that ends in the middle, a write that fails).
struct Draft {
    tmp: PathBuf,
    new: PathBuf,
    file: Option<BufWriter<File>>,
}

impl Draft {
    fn create(maildir: &Path, name: &str) -> io::Result<Draft> {
        let tmp = maildir.join("tmp").join(name);
        let file = File::options().write(true).create_new(true).open(&tmp)?;
        Ok(Draft {
            tmp,
            new: maildir.join("new").join(name),
            file: Some(BufWriter::with_capacity(64 * 1024, file)),
        })
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.file {
            Some(f) => f.write_all(bytes),
            None => Err(io::Error::other("the file is closed")),
        }
    }

    fn write_line(&mut self, text: &[u8]) -> io::Result<()> {
        self.write(text)?;
        self.write(b"\n")
    }

    /// Closes the file and moves it to `new/`.
    fn commit(mut self) -> io::Result<()> {
        if let Some(f) = self.file.take() {
            f.into_inner().map_err(io::IntoInnerError::into_error)?;
        }
        fs::rename(&self.tmp, &self.new)?;
        // Nothing left to remove.
        self.tmp = PathBuf::new();
        Ok(())
    }
}

impl Drop for Draft {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            drop(self.file.take());
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// `Tue, 03 Jun 2025 10:00:00 +0000` (RFC 5322 §3.3), in UTC.
fn rfc5322_date(t: SystemTime) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm), for days >= 0.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} +0000",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Makes the maildir's directories, in a worker (as the workers' user), and checks that
/// they can be written.
fn prepare_maildir(dir: &Path) -> io::Result<()> {
    use nix::unistd::{AccessFlags, access};
    for sub in ["tmp", "new", "cur"] {
        let path = dir.join(sub);
        fs::create_dir_all(&path).map_err(|e| annotate(&path, "cannot create", e))?;
    }
    for sub in ["tmp", "new"] {
        let path = dir.join(sub);
        access(&path, AccessFlags::W_OK | AccessFlags::X_OK)
            .map_err(|e| annotate(&path, "cannot write", io::Error::from(e)))?;
    }
    Ok(())
}

fn annotate(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// The `check` subcommand's look at `--maildir`, in the master: a directory, or a path
/// whose nearest existing parent is one (the workers create the rest).
fn check_maildir(dir: &Path) -> Result<(), String> {
    for path in dir.ancestors() {
        match fs::metadata(path) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) => {
                return Err(format!(
                    "--maildir {}: {} is not a directory",
                    dir.display(),
                    path.display()
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("--maildir {}: {}: {e}", dir.display(), path.display())),
        }
    }
    Ok(())
}

/// The system's host name (Linux).
fn system_hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

fn main() {
    serve().unwrap_or_else(|e| e.exit());
}

fn serve() -> appsrv::Result<()> {
    let mut server = appsrv::server!("smtp_sink")
        .about("A mail sink: receives SMTP and stores each message in a maildir")
        .listen("127.0.0.1:2525");
    let args: Args = server.args();
    // The workers' user, to name in a start failure.
    let workers = server.worker_identity()?.map(|w| w.user);
    let host = args.hostname.unwrap_or_else(system_hostname);
    if host.is_empty() || host.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(appsrv::Error::Config(format!(
            "--hostname {host:?}: not a host name"
        )));
    }
    // Absolute: a daemon works in `/`.
    let maildir = std::path::absolute(&args.maildir)
        .map_err(|e| appsrv::Error::Config(format!("--maildir {}: {e}", args.maildir.display())))?;
    let config = Config {
        host_in_names: host
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect(),
        host,
        maildir: maildir.clone(),
        max_size: args.max_message_size,
    };
    server
        .on_check(move || check_maildir(&maildir).map_err(Into::into))
        .run_async(move || {
            // Here, after the privilege drop: what the workers can write is what counts.
            prepare_maildir(&config.maildir).map_err(|e| match &workers {
                Some(user) => format!(
                    "--maildir {e}: the workers run as {user}: give the directory to {user}, or \
                     choose another --user or --maildir"
                ),
                None => format!("--maildir {e}"),
            })?;
            Ok(Sink {
                config: config.clone(),
                pid: std::process::id(),
                drafts: Cell::new(0),
            })
        })
}

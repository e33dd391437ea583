//! The access log: one line per request (request-level handlers) or per connection
//! (`handle_client`), off by default (`--access-log PATH`).
//!
//! ```text
//! 2026-11-30T08:30:00Z 127.0.0.1:50312 ok 182us in=78 out=146 "GET / HTTP/1.1"
//! ```
//!
//! Fields: time (UTC, to the second), client, outcome (`ok`, `error`, `timeout`, `closed`),
//! duration, bytes received and sent, and the request's first line (escaped, at most 64
//! bytes; empty for `handle_client`).
//!
//! Lines are buffered in the worker and written with one `write(2)` when the buffer
//! passes 32 KiB, or when the worker is about to wait for a new connection (so a quiet
//! server's lines are not held back), or when it stops. A worker killed by a signal loses
//! what it had buffered. The file is opened by the master (O_APPEND: lines of different
//! workers never interleave), and reopened by the master on USR1, like the error log: the
//! worker gets the new file through its log channel (`process/reopen.rs`).

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::codec::ProtocolError;
use crate::process::log::{Log, LostLines, format_utc};

const FLUSH_AT: usize = 32 * 1024;

/// How a request or connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    Error,
    Timeout,
    Closed,
    /// A datagram over `--max-answers-per-ip`, dropped.
    Limited,
    /// A datagram over `--max-answers-per-ip`, answered by the handler's `slip`.
    Slipped,
}

/// How a request, or a `handle_client` connection, ended, as every driver sees it: the
/// input of [`Outcome::of`], the access log's one outcome rule (issue 42).
#[derive(Debug, Clone, Copy)]
pub(crate) enum End<'e> {
    /// The handler returned: `ok` whether it succeeded (a request-level handler's `Err` is
    /// answered with the codec's error reply or the close).
    Answered {
        /// The handler returned `Ok`.
        ok: bool,
    },
    /// The request step refused the input with the codec's error reply (malformed, too
    /// large, too slow, shed for memory, an async handler past `--request-timeout`).
    Refused(&'e ProtocolError),
    /// An I/O error ended it: the client's reset or close, a socket timeout, or another
    /// error (for `handle_client`, whatever error the handler returned).
    Failed(io::ErrorKind),
    /// The connection ended without an error while a request was unanswered (the client
    /// closed between two reads, the server gave it up).
    Dropped,
    /// The user's code panicked.
    Panicked,
    /// The worker's clock cut the call (`--request-timeout` in the async model).
    Cut,
}

impl Outcome {
    /// The access log's one rule (issue 42), the same in every I/O model, at the request
    /// level and the client level alike:
    ///
    /// - `ok`: the handler returned `Ok` (a whole request answered; a `handle_client`
    ///   connection whose handler returned `Ok`);
    /// - `error`: the handler returned an error, or panicked; the input was refused with
    ///   the codec's error reply (malformed, too large, shed for memory: HTTP 400, 413,
    ///   503); a `handle_client` handler's error that is neither the client leaving nor a
    ///   timeout;
    /// - `timeout`: a deadline passed: the head or body too slow (`--header-timeout`,
    ///   `--read-timeout`: HTTP 408), a write cut at `--write-timeout` or
    ///   `--min-send-rate`, a call cut at `--request-timeout`;
    /// - `closed`: the client left: it reset the connection or closed it in the middle of
    ///   a request (or, for `handle_client`, while its handler read or wrote).
    pub(crate) fn of(end: End<'_>) -> Outcome {
        match end {
            End::Answered { ok: true } => Outcome::Ok,
            End::Answered { ok: false } | End::Panicked => Outcome::Error,
            End::Refused(ProtocolError::Timeout | ProtocolError::HandlerTimeout { .. }) => Outcome::Timeout,
            End::Refused(_) => Outcome::Error,
            End::Cut => Outcome::Timeout,
            End::Dropped => Outcome::Closed,
            End::Failed(kind) => match kind {
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Outcome::Timeout,
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
                | io::ErrorKind::NotConnected => Outcome::Closed,
                _ => Outcome::Error,
            },
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
            Outcome::Closed => "closed",
            Outcome::Limited => "limited",
            Outcome::Slipped => "slipped",
        }
    }
}

/// A worker's access log.
#[derive(Debug)]
pub(crate) struct AccessLog {
    file: File,
    buf: String,
    /// The formatted time of `second`, reused within the second.
    second: u64,
    stamp: String,
    /// Lines that could not be written (a full disk): counted, warned about once a minute
    /// in the error log, and reported when the log takes lines again.
    lost: LostLines,
    /// A failed write left the file in the middle of a line.
    mid_line: bool,
}

impl AccessLog {
    pub(crate) fn new(file: File) -> Self {
        AccessLog {
            file,
            buf: String::with_capacity(FLUSH_AT + 512),
            second: 0,
            stamp: String::new(),
            lost: LostLines::new(Log::Access),
            mid_line: false,
        }
    }

    /// Appends one line. `peer` is the client's address, formatted into the buffer (no
    /// allocation per line).
    pub(crate) fn line(
        &mut self,
        peer: &(impl std::fmt::Display + ?Sized),
        outcome: Outcome,
        took: Duration,
        bytes: (u64, u64),
        head: &[u8],
    ) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if now != self.second || self.stamp.is_empty() {
            self.second = now;
            self.stamp = format_utc(now);
        }
        let first_line = head
            .split(|b| *b == b'\r' || *b == b'\n')
            .next()
            .unwrap_or_default();
        let _ = writeln!(
            self.buf,
            "{} {peer} {} {}us in={} out={} \"{}\"",
            self.stamp,
            outcome.as_str(),
            took.as_micros(),
            bytes.0,
            bytes.1,
            first_line.escape_ascii()
        );
        if self.buf.len() >= FLUSH_AT {
            self.flush();
        }
    }

    /// Writes the buffered lines. Lines that cannot be written (a full disk, an I/O error)
    /// are dropped and counted, never retried: a worker must not hold an unbounded backlog,
    /// and the error log says what was lost (see `process/log.rs`).
    pub(crate) fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        if self.mid_line {
            // A short write cut the last batch in the middle of a line: end it, so that
            // the next line starts a line of its own.
            self.buf.insert(0, '\n');
        }
        let mut rest = self.buf.as_bytes();
        let failed = loop {
            match self.file.write(rest) {
                Ok(n) if n == rest.len() => break None,
                Ok(0) => break Some(std::io::Error::from(std::io::ErrorKind::WriteZero)),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Some(e),
            }
        };
        let written = self.buf.len() - rest.len();
        self.mid_line = failed.is_some() && written > 0 && self.buf.as_bytes()[written - 1] != b'\n';
        match failed {
            None => {
                if let Some(report) = self.lost.recovered() {
                    tracing::warn!("{report}");
                }
            }
            Some(e) => {
                // A line cut by a short write counts as lost with the ones after it.
                let lines = rest.iter().filter(|b| **b == b'\n').count() as u64;
                if self.lost.lost(lines.max(1), &e) {
                    tracing::warn!("{}", self.lost.warning(&e));
                }
            }
        }
        self.buf.clear();
    }

    /// Writes to `file` from now on (the master reopened the log on USR1), after writing
    /// what is buffered to the old one.
    pub(crate) fn replace(&mut self, file: File) {
        self.flush();
        self.file = file;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 31: a log that cannot be written (here `/dev/full`, which answers ENOSPC)
    /// costs its lines, counted, and nothing else; the next file takes lines again.
    #[test]
    fn issue_31_lines_that_cannot_be_written_are_dropped_and_counted() {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let mut log = AccessLog::new(full);
        for _ in 0..3 {
            log.line("127.0.0.1:5555", Outcome::Ok, Duration::ZERO, (1, 1), b"PING");
        }
        log.flush();
        assert_eq!(log.lost.pending(), 3, "three lines lost");
        assert!(log.buf.is_empty(), "nothing kept for later");
        let path = std::env::temp_dir().join(format!("appsrv-access-full-{}", std::process::id()));
        log.replace(File::create(&path).unwrap());
        log.line("127.0.0.1:5555", Outcome::Ok, Duration::ZERO, (1, 1), b"PING");
        log.flush();
        assert_eq!(log.lost.pending(), 0, "the episode ended");
        assert!(std::fs::read_to_string(&path).unwrap().contains("\"PING\""));
        let _ = std::fs::remove_file(&path);
    }

    /// Issue 42: the one outcome rule, as docs/ARCHITECTURE.md's table gives it.
    #[test]
    fn issue_42_one_outcome_for_each_way_a_request_ends() {
        let slow = ProtocolError::Timeout;
        let late = ProtocolError::HandlerTimeout {
            limit: Duration::from_secs(1),
        };
        let bad = ProtocolError::Malformed("bad request line".into());
        let shed = ProtocolError::Refused("busy".into());
        let cases = [
            (End::Answered { ok: true }, Outcome::Ok),
            (End::Answered { ok: false }, Outcome::Error),
            (End::Panicked, Outcome::Error),
            (End::Refused(&bad), Outcome::Error),
            (End::Refused(&shed), Outcome::Error),
            (End::Refused(&slow), Outcome::Timeout),
            (End::Refused(&late), Outcome::Timeout),
            (End::Cut, Outcome::Timeout),
            (End::Failed(io::ErrorKind::TimedOut), Outcome::Timeout),
            (End::Failed(io::ErrorKind::WouldBlock), Outcome::Timeout),
            (End::Failed(io::ErrorKind::ConnectionReset), Outcome::Closed),
            (End::Failed(io::ErrorKind::BrokenPipe), Outcome::Closed),
            (End::Failed(io::ErrorKind::UnexpectedEof), Outcome::Closed),
            (End::Dropped, Outcome::Closed),
            (End::Failed(io::ErrorKind::InvalidData), Outcome::Error),
        ];
        for (end, outcome) in cases {
            assert_eq!(Outcome::of(end), outcome, "{end:?}");
        }
    }

    #[test]
    fn lines_are_buffered_then_written() {
        let path = std::env::temp_dir().join(format!("appsrv-access-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        let mut log = AccessLog::new(file);
        log.line(
            "127.0.0.1:5555",
            Outcome::Ok,
            Duration::from_micros(182),
            (78, 146),
            b"GET / HTTP/1.1\r\nHost: x\r\n",
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "", "buffered");
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.ends_with(" 127.0.0.1:5555 ok 182us in=78 out=146 \"GET / HTTP/1.1\"\n"),
            "{text}"
        );
        let _ = std::fs::remove_file(&path);
    }
}

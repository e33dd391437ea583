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
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

impl Outcome {
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
}

impl AccessLog {
    pub(crate) fn new(file: File) -> Self {
        AccessLog {
            file,
            buf: String::with_capacity(FLUSH_AT + 512),
            second: 0,
            stamp: String::new(),
        }
    }

    /// Appends one line.
    /// `peer` is the client's address, formatted once per connection by the caller.
    pub(crate) fn line(
        &mut self,
        peer: &str,
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

    /// Writes the buffered lines.
    pub(crate) fn flush(&mut self) {
        if !self.buf.is_empty() {
            if let Err(e) = self.file.write_all(self.buf.as_bytes()) {
                tracing::warn!("access log: {e}; {} bytes of lines lost", self.buf.len());
            }
            self.buf.clear();
        }
    }

    /// Writes to `file` from now on (the master reopened the log on USR1), after writing
    /// what is buffered to the old one.
    pub(crate) fn replace(&mut self, file: File) {
        self.flush();
        self.file = file;
    }
}

/// `2026-11-30T08:30:00Z` from seconds since the epoch (civil-from-days, proleptic
/// Gregorian calendar).
fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_times() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_796_026_200), "2026-11-30T08:10:00Z");
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

//! [`HttpResponse`]: the response a handler builds, written out with its head (status
//! line, `Content-Length`, `Date`, `Connection`) by [`Respond::finish`]; the reason
//! phrases, and the `Date` header's value, formatted once a second.

use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::ops::Range;
use std::time::{SystemTime, UNIX_EPOCH};

use super::decode::trim;
use super::scratch;
use crate::codec::{FileBody, Outcome, Respond};

/// A response being built; [`finish`](Respond::finish) (called by the framework after the
/// handler) writes it to the output buffer.
///
/// Status 200 unless [`status`](HttpResponse::status) says otherwise; no `Content-Type`
/// unless set. The body is what the handler writes (`Write`), followed by the file given
/// to [`send_file`](HttpResponse::send_file), if any; `Content-Length` is computed. For a
/// `HEAD` request the same head is sent without the body.
pub struct HttpResponse<'a> {
    pub(super) out: &'a mut Vec<u8>,
    pub(super) head: &'a mut Vec<u8>,
    pub(super) body: &'a mut Vec<u8>,
    pub(super) date: &'a mut HttpDate,
    pub(super) status: u16,
    /// A `HEAD` request: the body is counted, not kept.
    pub(super) head_only: bool,
    /// Body bytes written for a `HEAD` request.
    pub(super) discarded: u64,
    /// The request's minor version.
    pub(super) version: u8,
    pub(super) close: bool,
    pub(super) file: Option<FileBody>,
}

impl fmt::Debug for HttpResponse<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpResponse")
            .field("status", &self.status)
            .field("headers", &String::from_utf8_lossy(self.head))
            .field("body_len", &(self.body.len() as u64 + self.discarded))
            .field("close", &self.close)
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl HttpResponse<'_> {
    /// Sets the status code (100 to 999; others become 500). The reason phrase comes from
    /// a table of the standard codes (empty for others).
    pub fn status(&mut self, code: u16) -> &mut Self {
        self.status = if (100..=999).contains(&code) { code } else { 500 };
        self
    }

    /// The status code so far.
    pub fn status_code(&self) -> u16 {
        self.status
    }

    /// Adds a header. `Content-Length`, `Transfer-Encoding` and `Date` are the codec's and
    /// are ignored here; `Connection: close` closes the connection after the response
    /// (other `Connection` values are ignored). A name or value containing CR, LF or NUL
    /// (or a name that is empty or has a colon or space) is refused with a warning in the
    /// log, so that the response cannot be split.
    pub fn header(&mut self, name: &str, value: impl AsRef<[u8]>) -> &mut Self {
        let value = value.as_ref();
        let bad_name = name.is_empty() || name.bytes().any(|b| b <= b' ' || b == b':' || b >= 0x7f);
        if bad_name || value.iter().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
            tracing::warn!("invalid HTTP response header {name:?} ignored");
            return self;
        }
        let n = name.as_bytes();
        if n.eq_ignore_ascii_case(b"content-length")
            || n.eq_ignore_ascii_case(b"transfer-encoding")
            || n.eq_ignore_ascii_case(b"date")
        {
            return self;
        }
        if n.eq_ignore_ascii_case(b"connection") {
            if value
                .split(|b| *b == b',')
                .any(|t| trim(t).eq_ignore_ascii_case(b"close"))
            {
                self.close = true;
            }
            return self;
        }
        self.head.reserve(name.len() + value.len() + 4);
        self.head.extend_from_slice(n);
        self.head.extend_from_slice(b": ");
        self.head.extend_from_slice(value);
        self.head.extend_from_slice(b"\r\n");
        self
    }

    /// Sets `Content-Type`.
    pub fn content_type(&mut self, value: &str) -> &mut Self {
        self.header("Content-Type", value)
    }

    /// Closes the connection after this response (with `Connection: close`).
    pub fn close(&mut self) -> &mut Self {
        self.close = true;
        self
    }

    /// Whether the connection will be closed after this response.
    pub fn will_close(&self) -> bool {
        self.close
    }

    /// Sends `range` of `file` as the body (after any bytes written), with `sendfile(2)`
    /// when it is large; `Content-Length` counts it. For a `HEAD` request the file is not
    /// sent. A second call replaces the first file.
    pub fn send_file(&mut self, file: File, range: Range<u64>) -> &mut Self {
        let range = range.start..range.end.max(range.start);
        self.file = Some(FileBody { file, range });
        self
    }

    fn body_len(&self) -> u64 {
        let file = self.file.as_ref().map_or(0, |f| f.range.end - f.range.start);
        self.body.len() as u64 + self.discarded + file
    }
}

impl Write for HttpResponse<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.head_only {
            self.discarded += buf.len() as u64;
        } else {
            self.body.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.write(buf).map(drop)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Respond for HttpResponse<'_> {
    fn close_after(&mut self) {
        self.close = true;
    }

    fn finish(self) -> Outcome {
        let status = self.status;
        // 1xx, 204 and 304 have no body, and 1xx and 204 no Content-Length.
        let bodiless = status < 200 || status == 204 || status == 304;
        let len = self.body_len();
        let out = self.out;
        out.reserve(128 + self.head.len() + if self.head_only { 0 } else { self.body.len() });
        write_status_line(out, status);
        out.extend_from_slice(self.head);
        if !bodiless {
            out.extend_from_slice(b"Content-Length: ");
            write_decimal(out, len);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"Date: ");
        out.extend_from_slice(&self.date.now());
        if self.close {
            out.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
        } else if self.version == 0 {
            out.extend_from_slice(b"\r\nConnection: keep-alive\r\n\r\n");
        } else {
            out.extend_from_slice(b"\r\n\r\n");
        }
        let mut file = self.file;
        if self.head_only || bodiless {
            file = None;
        } else {
            out.extend_from_slice(self.body);
        }
        // Given back for the next response (a large one is freed instead).
        scratch::give(std::mem::take(self.head), std::mem::take(self.body));
        Outcome {
            close: self.close,
            file,
        }
    }
}

pub(super) fn write_status_line(out: &mut Vec<u8>, status: u16) {
    out.extend_from_slice(b"HTTP/1.1 ");
    write_decimal(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\n");
}

pub(super) fn write_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The reason phrase of a status code (empty for codes not in the table).
pub(super) fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// The `Date` header's value, formatted once a second for the whole worker (every codec,
/// so every connection, shares it: a new connection's first response does not format the
/// date again).
#[derive(Debug, Clone, Copy)]
pub(super) struct HttpDate;

thread_local! {
    /// The second last formatted, and its text.
    static DATE: std::cell::Cell<(u64, [u8; 29])> =
        const { std::cell::Cell::new((u64::MAX, *b"Thu, 01 Jan 1970 00:00:00 GMT")) };
}

impl HttpDate {
    /// The current time as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`): one clock read
    /// (no system call with the vDSO), a formatting once a second.
    pub(super) fn now(&mut self) -> [u8; 29] {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        DATE.with(|date| {
            let (cached, text) = date.get();
            if cached == secs {
                return text;
            }
            let text = format_date(secs);
            date.set((secs, text));
            text
        })
    }
}

/// Formats `secs` since the epoch as an IMF-fixdate.
fn format_date(secs: u64) -> [u8; 29] {
    const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
    ];
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (hour, min, sec) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let year = year.min(9999);

    let mut t = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    let two = |t: &mut [u8; 29], at: usize, v: u64| {
        t[at] = b'0' + (v / 10 % 10) as u8;
        t[at + 1] = b'0' + (v % 10) as u8;
    };
    t[..3].copy_from_slice(DAYS[(days % 7) as usize]);
    two(&mut t, 5, day);
    t[8..11].copy_from_slice(MONTHS[(month - 1) as usize]);
    two(&mut t, 12, year / 100);
    two(&mut t, 14, year % 100);
    two(&mut t, 17, hour);
    two(&mut t, 20, min);
    two(&mut t, 23, sec);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(&format_date(784_111_777), b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(&format_date(951_782_400), b"Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(&format_date(4_107_542_399), b"Sun, 28 Feb 2100 23:59:59 GMT");
        assert_eq!(&format_date(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        let mut d = HttpDate;
        let a = d.now();
        assert_ne!(&a, b"Thu, 01 Jan 1970 00:00:00 GMT");
    }
}

//! Reading a request: its head (parsed by httparse into offsets, then the fields that
//! frame the message, `Host`, and line ends checked), the framing of its body
//! (`Content-Length`, or chunks followed across reads and de-chunked in place), and the
//! `100 Continue` for a client that waits for it.

use std::borrow::Cow;

use super::{CONTINUE, Http, MAX_CHUNK_LINE, MAX_HEADERS, UNSUPPORTED_VERSION};
use crate::codec::{Decoded, ProtocolError, find};

impl Http {
    /// A head httparse did not parse: `incomplete` (`None`) waits for more unless the
    /// head is already over `max_header_bytes`; an error is this codec's answer to it (an
    /// `HTTP/2` request line so far waits for the rest of the line, to tell it apart).
    fn unparsed(&self, buf: &[u8], error: Option<httparse::Error>) -> Result<Option<Head>, ProtocolError> {
        let too_large = ProtocolError::HeaderTooLarge {
            limit: self.max_header_bytes,
        };
        match error {
            None if buf.len() >= self.max_header_bytes => Err(too_large),
            None => Ok(None),
            Some(httparse::Error::TooManyHeaders) => Err(too_large),
            Some(httparse::Error::Version) => match http_version(buf) {
                Version::Other => Err(ProtocolError::Unsupported(Cow::Borrowed(UNSUPPORTED_VERSION))),
                // `HTTP/2` so far: wait for the rest of the line.
                Version::Partial if buf.len() < self.max_header_bytes => Ok(None),
                _ => Err(malformed("invalid HTTP version")),
            },
            Some(e) => Err(malformed(parse_error(e))),
        }
    }

    /// Parses the request head at the front of `buf`: `None` while it is incomplete.
    pub(super) fn parse_head(&self, buf: &[u8]) -> Result<Option<Head>, ProtocolError> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers[..self.max_headers]);
        let head_len = match req.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return self.unparsed(buf, None),
            Err(e) => return self.unparsed(buf, Some(e)),
        };
        if head_len > self.max_header_bytes {
            return Err(ProtocolError::HeaderTooLarge {
                limit: self.max_header_bytes,
            });
        }
        let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
            return Err(malformed("incomplete request line"));
        };
        let mut head = Head {
            len: head_len,
            method: Span::of(buf, method.as_bytes()),
            target: Span::of(buf, target.as_bytes()),
            version,
            headers: [HeaderSpan::EMPTY; MAX_HEADERS],
            count: 0,
            content_length: None,
            chunked: false,
            close: false,
            keep_alive: false,
            expect_continue: false,
        };
        let mut seen = Seen::default();
        // Whether the line before each field (the request line, the previous field) ends
        // in CRLF: see `head_lines_end_in_crlf`.
        let mut crlf = true;
        for (i, h) in req.headers.iter().enumerate() {
            let name = Span::of(buf, h.name.as_bytes());
            crlf &= ends_in_crlf(&buf[..name.start as usize]);
            head.headers[i] = HeaderSpan {
                name,
                value: Span::of(buf, h.value),
            };
            head.count = i + 1;
            head.read_field(h.name.as_bytes(), h.value, &mut seen, &buf[..head_len])?;
        }
        // httparse accepts a bare LF as a line end: this codec does not (module docs).
        if !head_lines_end_in_crlf(&buf[..head_len], head.method.start as usize, crlf) {
            return Err(malformed(BARE_LF));
        }
        head.check_framing(seen.hosts)?;
        Ok(Some(head))
    }

    /// Follows the chunks of a body starting at `start`, without changing the buffer:
    /// `Some((body length, end of the trailers))` once the whole body has arrived.
    ///
    /// Progress is kept in `self.pending`, so the chunks already seen are not read again
    /// when more bytes arrive.
    pub(super) fn scan_chunks(
        &mut self,
        buf: &[u8],
        start: usize,
    ) -> Result<Option<(usize, usize)>, ProtocolError> {
        let mut scan = match self.pending.scan {
            Some(s) if s.start == start && s.pos <= buf.len() => s,
            _ => ChunkScan {
                start,
                pos: start,
                body: 0,
            },
        };
        let result = loop {
            let Some((line, size)) = chunk_size_line(&buf[scan.pos..])? else {
                break None;
            };
            let data = scan.pos + line;
            if size == 0 {
                match trailers_end(&buf[data..])? {
                    Some(n) => break Some((scan.body, data + n)),
                    None if buf.len() - data > self.max_header_bytes => {
                        return Err(ProtocolError::HeaderTooLarge {
                            limit: self.max_header_bytes,
                        });
                    }
                    None => break None,
                }
            }
            let size = match usize::try_from(size) {
                Ok(s) if s <= self.max_body - scan.body => s,
                _ => {
                    return Err(ProtocolError::TooLarge {
                        what: "body",
                        limit: self.max_body,
                    });
                }
            };
            let end = data + size + 2;
            if buf.len() < end {
                // Catch a missing CRLF as soon as its place has arrived.
                if buf.len() > data + size && buf[data + size] != b'\r' {
                    return Err(malformed("chunk data not followed by CRLF"));
                }
                break None;
            }
            if &buf[end - 2..end] != b"\r\n" {
                return Err(malformed("chunk data not followed by CRLF"));
            }
            scan.pos = end;
            scan.body += size;
        };
        self.pending.scan = Some(scan);
        Ok(result)
    }

    /// The answer when the head is complete and the body is not: `100 Continue` the first
    /// time, if the client asked for it.
    pub(super) fn body_incomplete<R>(&mut self, head: &Head) -> Decoded<R> {
        if head.expect_continue && !self.pending.continue_sent {
            self.pending.continue_sent = true;
            return Decoded::Incomplete {
                interim: Some(CONTINUE),
            };
        }
        Decoded::incomplete()
    }
}

/// Per-request decoding progress.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Pending {
    /// `100 Continue` was sent for the request at the front of the buffer.
    continue_sent: bool,
    /// How far the chunks of its body were followed.
    scan: Option<ChunkScan>,
}

#[derive(Debug, Clone, Copy)]
struct ChunkScan {
    /// Where the body starts (the length of the head).
    start: usize,
    /// The next chunk-size line.
    pos: usize,
    /// Data bytes in the chunks before `pos`.
    body: usize,
}

/// A byte range of the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    start: u32,
    end: u32,
}

impl Span {
    const EMPTY: Span = Span { start: 0, end: 0 };

    /// The position of `part` (a slice of `buf`) in `buf`.
    fn of(buf: &[u8], part: &[u8]) -> Span {
        let start = (part.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
        debug_assert!(start + part.len() <= buf.len());
        // Heads are at most 16 MiB (`max_header_bytes`), so offsets in them fit in u32.
        Span {
            start: start as u32,
            end: (start + part.len()) as u32,
        }
    }

    pub(super) fn get(self, buf: &[u8]) -> &[u8] {
        &buf[self.start as usize..self.end as usize]
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct HeaderSpan {
    pub(super) name: Span,
    pub(super) value: Span,
}

impl HeaderSpan {
    const EMPTY: HeaderSpan = HeaderSpan {
        name: Span::EMPTY,
        value: Span::EMPTY,
    };
}

/// A parsed request head, as offsets into the buffer.
pub(super) struct Head {
    pub(super) len: usize,
    pub(super) method: Span,
    pub(super) target: Span,
    pub(super) version: u8,
    pub(super) headers: [HeaderSpan; MAX_HEADERS],
    pub(super) count: usize,
    pub(super) content_length: Option<u64>,
    pub(super) chunked: bool,
    /// `Connection: close` was given.
    pub(super) close: bool,
    /// `Connection: keep-alive` was given.
    pub(super) keep_alive: bool,
    pub(super) expect_continue: bool,
}

/// What [`Head::read_field`] counts across a head's fields, for the checks that need all
/// of them.
#[derive(Default)]
struct Seen {
    /// `Host` fields: RFC 9112 §3.2 wants exactly one in HTTP/1.1, at most one in
    /// HTTP/1.0 (checked by [`Head::check_framing`]).
    hosts: u32,
    /// A `Transfer-Encoding` field came (a second one is refused).
    transfer_encoding: bool,
}

impl Head {
    /// One header field's meaning for the framing and the connection: `Content-Length`,
    /// `Transfer-Encoding`, `Connection`, `Expect`, and the `Host` count. `head`: the
    /// whole head's bytes, quoted by an unsupported-request error.
    #[inline]
    fn read_field(
        &mut self,
        name: &[u8],
        value: &[u8],
        seen: &mut Seen,
        head: &[u8],
    ) -> Result<(), ProtocolError> {
        if name.eq_ignore_ascii_case(b"host") {
            seen.hosts += 1;
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_content_length(value)?;
            if self.content_length.is_some_and(|m| m != n) {
                return Err(malformed("conflicting Content-Length headers"));
            }
            self.content_length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if seen.transfer_encoding {
                return Err(unsupported(head, "several Transfer-Encoding headers"));
            }
            seen.transfer_encoding = true;
            if !trim(value).eq_ignore_ascii_case(b"chunked") {
                return Err(unsupported(head, "Transfer-Encoding other than chunked"));
            }
            self.chunked = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|b| *b == b',').map(trim) {
                if token.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    self.keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"expect") && trim(value).eq_ignore_ascii_case(b"100-continue") {
            self.expect_continue = true;
        }
        Ok(())
    }

    /// The checks that need every field: the `Host` count, and a body framed one way only
    /// (and not chunked in HTTP/1.0, which has no chunks). `Expect: 100-continue` is
    /// HTTP/1.1's: an HTTP/1.0 request's is ignored.
    fn check_framing(&mut self, hosts: u32) -> Result<(), ProtocolError> {
        // RFC 9112 §3.2: a server MUST answer 400 to an HTTP/1.1 request without a Host and
        // to any request with more than one. Two Hosts are a known ambiguity between a proxy
        // and the server behind it (the proxy routes by one, the handler reads the other);
        // an HTTP/1.0 request may have none (its clients predate the field).
        if hosts > 1 {
            return Err(malformed(SEVERAL_HOSTS));
        }
        if hosts == 0 && self.version == 1 {
            return Err(malformed(NO_HOST));
        }
        if self.chunked && self.content_length.is_some() {
            return Err(malformed("both Content-Length and Transfer-Encoding"));
        }
        if self.chunked && self.version == 0 {
            return Err(malformed("Transfer-Encoding in an HTTP/1.0 request"));
        }
        if self.version == 0 {
            self.expect_continue = false;
        }
        Ok(())
    }
}

pub(super) fn malformed(why: &'static str) -> ProtocolError {
    ProtocolError::Malformed(Cow::Borrowed(why))
}

/// The reason of the 400 answering an HTTP/1.1 request without a `Host` field.
pub(super) const NO_HOST: &str = "no Host header (HTTP/1.1 requires one)";

/// The reason of the 400 answering a request with more than one `Host` field.
pub(super) const SEVERAL_HOSTS: &str = "more than one Host header";

/// The reason of the 400 answering a bare LF in the head or the trailers.
const BARE_LF: &str = "bare LF line end (lines end in CRLF)";

/// Whether every line of `head`, a head that httparse accepted, ends in CRLF (httparse
/// also takes a bare LF). `method` is where the request line begins (after any empty
/// lines); `fields` whether the two bytes before each header field's name are CRLF.
///
/// Not a scan of every byte: in a head httparse accepted, a line feed can only end a
/// line, and the lines are where httparse found them. Each header field begins right after
/// the line before it (the request line, or the previous field), so the two bytes before
/// each field's name are that line's end (checked in the loop over the fields, which
/// computes where each name is anyway); the head's last four bytes are the end of its last
/// line and the empty line; empty lines before the request line are all there is before
/// the method. Two compares per field instead of a pass over every byte of the head: on
/// the benchmark's heads (`benches/codecs.rs`), counted with callgrind, this adds about 40
/// instructions to a whole `decode` of wrk's one-field request (1427 before) and 140 to a
/// ten-field browser request (3911 before), where a vectorised pass added 100 and 330.
/// [`has_bare_lf`], the plain definition, checks the result in debug builds (every head
/// the tests decode).
fn head_lines_end_in_crlf(head: &[u8], method: usize, fields: bool) -> bool {
    let ok = fields
        && (method == 0 || head[..method].chunks(2).all(|pair| pair == b"\r\n"))
        && matches!(head, [.., b'\r', b'\n', b'\r', b'\n']);
    debug_assert_eq!(ok, !has_bare_lf(head), "{:?}", String::from_utf8_lossy(head));
    ok
}

/// Whether `b` ends in CRLF. A slice pattern: a length check and two byte compares.
#[inline]
fn ends_in_crlf(b: &[u8]) -> bool {
    matches!(b, [.., b'\r', b'\n'])
}

/// The refusal of what the codec does not implement (501), found in the header loop:
/// a 400 instead if the head also has a bare LF, which the check after the loop would have
/// refused (the rule has no exception).
fn unsupported(head: &[u8], what: &'static str) -> ProtocolError {
    if has_bare_lf(head) {
        malformed(BARE_LF)
    } else {
        ProtocolError::Unsupported(Cow::Borrowed(what))
    }
}

/// Whether `b` holds a line feed that does not follow a carriage return.
pub(super) fn has_bare_lf(b: &[u8]) -> bool {
    b.iter()
        .enumerate()
        .any(|(i, c)| *c == b'\n' && (i == 0 || b[i - 1] != b'\r'))
}

fn parse_error(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line end",
        httparse::Error::Status => "invalid status",
        httparse::Error::Token => "invalid method or request target",
        httparse::Error::TooManyHeaders => "too many headers",
        httparse::Error::Version => "invalid HTTP version",
    }
}

/// What follows the request target on the first line of `buf`, once httparse refused it.
#[derive(Debug, PartialEq, Eq)]
enum Version {
    /// `HTTP/x.y`, a version other than 1.0 and 1.1: 505, not 400.
    Other,
    /// The beginning of such a version, the line is not over.
    Partial,
    /// Not a version.
    Bad,
}

fn http_version(buf: &[u8]) -> Version {
    let (line, complete) = match find(buf, b"\n") {
        Some(nl) => (&buf[..nl], true),
        None => (buf, false),
    };
    let line = match line.strip_suffix(b"\r") {
        Some(line) => line,
        // A bare LF ends the line: a 400 whatever the version (module docs).
        None if complete => return Version::Bad,
        None => line,
    };
    let version = line.rsplit(|b| *b == b' ').next().unwrap_or(b"");
    let pattern = b"HTTP/0.0";
    let fits = version.len() <= pattern.len()
        && version.iter().zip(pattern).all(|(b, p)| match p {
            b'0' => b.is_ascii_digit(),
            _ => b == p,
        });
    match (fits, complete, version.len() == pattern.len()) {
        (true, true, true) => Version::Other,
        (true, false, _) => Version::Partial,
        _ => Version::Bad,
    }
}

pub(super) fn trim(s: &[u8]) -> &[u8] {
    s.trim_ascii()
}

fn parse_content_length(value: &[u8]) -> Result<u64, ProtocolError> {
    let value = trim(value);
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return Err(malformed("invalid Content-Length"));
    }
    Ok(value.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// Parses the chunk-size line at the front of `b`: `Some((line length, chunk size))`, or
/// `None` while the line is incomplete. Extensions (`;name=value`) are skipped.
fn chunk_size_line(b: &[u8]) -> Result<Option<(usize, u64)>, ProtocolError> {
    let mut size: u64 = 0;
    let mut digits = 0;
    while let Some(d) = b.get(digits).and_then(|c| (*c as char).to_digit(16)) {
        digits += 1;
        if digits > 15 {
            return Err(malformed("chunk size too long"));
        }
        size = size << 4 | u64::from(d);
    }
    if digits == b.len() {
        return Ok(None);
    }
    if digits == 0 {
        return Err(malformed("invalid chunk size"));
    }
    let rest = &b[digits..];
    let Some(nl) = find(rest, b"\n") else {
        if rest.len() > MAX_CHUNK_LINE {
            return Err(malformed("chunk extension too long"));
        }
        // A CR must be the last byte so far (the line end is coming).
        if rest[..rest.len().saturating_sub(1)].contains(&b'\r') {
            return Err(malformed("invalid chunk-size line"));
        }
        return Ok(None);
    };
    let Some(ext) = rest[..nl].strip_suffix(b"\r") else {
        return Err(malformed("chunk-size line not ended by CRLF"));
    };
    if ext.len() > MAX_CHUNK_LINE {
        return Err(malformed("chunk extension too long"));
    }
    let after_space = ext.trim_ascii_start();
    let valid = ext.is_empty()
        || (after_space.first() == Some(&b';') && !ext.iter().any(|c| *c == b'\r' || *c == 0))
        // whitespace after the size, then nothing
        || after_space.is_empty() && ext.iter().all(|c| *c == b' ' || *c == b'\t');
    if !valid {
        return Err(malformed("invalid chunk-size line"));
    }
    Ok(Some((digits + nl + 1, size)))
}

/// The length of the trailer section at the front of `b` (trailer lines and the empty
/// line that ends them), or `None` while it is incomplete. Each line must end in CRLF.
fn trailers_end(b: &[u8]) -> Result<Option<usize>, ProtocolError> {
    let mut pos = 0;
    loop {
        let Some(nl) = find(&b[pos..], b"\n").map(|n| pos + n) else {
            return Ok(None);
        };
        let Some(line) = b[pos..nl].strip_suffix(b"\r") else {
            return Err(malformed(BARE_LF));
        };
        pos = nl + 1;
        if line.is_empty() {
            return Ok(Some(pos));
        }
    }
}

/// Rewrites the chunked body at `buf[start..]` (already checked by `scan_chunks`) as its
/// data alone, in place; returns the data length.
pub(super) fn dechunk(buf: &mut [u8], start: usize) -> Result<usize, ProtocolError> {
    let mut src = start;
    let mut dst = start;
    loop {
        let Some((line, size)) = chunk_size_line(&buf[src..])? else {
            return Err(malformed("chunked body changed while decoding"));
        };
        if size == 0 {
            return Ok(dst - start);
        }
        let data = src + line;
        let size = size as usize; // checked against max_body by scan_chunks
        buf.copy_within(data..data + size, dst);
        dst += size;
        src = data + size + 2;
    }
}

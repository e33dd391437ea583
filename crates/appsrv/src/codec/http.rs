//! HTTP/1.1 (and 1.0) on [`httparse`]: enough to serve an API, XML-RPC or static files, and
//! to be measured with `ab` and `wrk`. No routing: the handler looks at the request and
//! writes the response.
//!
//! What the codec does for the handler:
//! - framing of request bodies: `Content-Length` and `Transfer-Encoding: chunked` (de-chunked
//!   in place in the read buffer, so [`HttpRequest::body`] is always one slice; chunk
//!   extensions and trailers are ignored);
//! - keep-alive: HTTP/1.1 keeps the connection open unless the client says
//!   `Connection: close`; HTTP/1.0 closes it unless the client says
//!   `Connection: keep-alive`; the framework's `last` flag closes it too;
//! - `Expect: 100-continue`: `100 Continue` is sent once, when the head of the request has
//!   arrived and its body has not;
//! - `HEAD`: the handler writes the same response as for `GET`; the codec sends the head
//!   only (with the `Content-Length` of the body it would have sent);
//! - the response head: status line, `Content-Length`, `Date` (formatted once a second),
//!   `Connection: close` / `keep-alive` when needed;
//! - limits (head size, header count, body size) and error replies (400, 408, 413, 431,
//!   501, 505), each closing the connection;
//! - `Host`: exactly one in an HTTP/1.1 request, at most one in HTTP/1.0, as RFC 9112 §3.2
//!   requires (400 otherwise).
//!
//! # Line ends: CRLF only
//!
//! Every line of a request ends in CRLF: the request line (and the empty lines a client
//! may send before it), each header field, the empty line that ends the head, each
//! chunk-size line, the CRLF after each chunk's data, each trailer field and the empty line
//! that ends the trailers. A bare LF anywhere in them is answered `400 Bad Request` and the
//! connection is closed. RFC 9112 §2.2 lets a recipient accept a bare LF; appsrv does not,
//! because a server behind a proxy must agree with that proxy on where each message ends,
//! and a difference in line-end rules between two parsers is a known request-smuggling
//! vector (for chunk-size lines, "funky chunks"). A proxy that accepts bare LF and forwards
//! it as it is gets a 400 here, never a second interpretation of the same bytes.
//!
//! ```no_run
//! use std::io::{self, Write};
//! use appsrv::codec::{Http, HttpRequest, HttpResponse};
//!
//! struct Hello;
//!
//! impl appsrv::RequestHandler for Hello {
//!     type Codec = Http;
//!     type Session = ();
//!
//!     fn codec(&self) -> Http {
//!         Http::new()
//!     }
//!
//!     fn handle_request(&mut self, _conn: &mut appsrv::Conn<'_>, req: &HttpRequest<'_>, res: &mut HttpResponse<'_>) -> io::Result<()> {
//!         if req.path() != "/" {
//!             res.status(404);
//!         }
//!         res.content_type("text/plain");
//!         res.write_all(b"Hello, World!")
//!     }
//! }
//!
//! fn main() -> appsrv::Result<()> {
//!     appsrv::Server::new("hello").listen("127.0.0.1:8080").run_requests(|| Ok(Hello))
//! }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::ops::Range;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{Codec, Decoded, FileBody, Outcome, ProtocolError, Respond, Summary, find};

/// The most headers a request may have, and the size of the fixed array that holds them.
const MAX_HEADERS: usize = 64;

/// The interim response to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The message of the [`ProtocolError::Unsupported`] that [`Http::encode_error`] answers
/// with `505 HTTP Version Not Supported` (any other is `501 Not Implemented`).
const UNSUPPORTED_VERSION: &str = "HTTP version (only HTTP/1.0 and HTTP/1.1 are served)";

/// Longest chunk-size line (size and extensions) accepted.
const MAX_CHUNK_LINE: usize = 4096;

/// The HTTP/1.x codec.
///
/// Defaults: request heads up to 8 KiB, at most 64 headers, bodies up to 1 MiB; change
/// them with [`max_header_bytes`](Http::max_header_bytes),
/// [`max_headers`](Http::max_headers) and [`max_body`](Http::max_body). The largest
/// request ([`Codec::max_request_size`]) is the head limit plus the body limit.
///
/// Decoding allocates nothing: the headers are located by offsets in a fixed array inside
/// [`HttpRequest`], which borrows the read buffer. Responses are built in buffers the codec
/// keeps from one request to the next, and gives back to the worker when it is dropped
/// (at the connection's close), for the next connection's codec: a connection per request
/// allocates nothing either.
///
/// An HTTP/1.1 request must have exactly one `Host` header, and an HTTP/1.0 request at
/// most one (RFC 9112 §3.2): one without, or with two, is answered `400 Bad Request` and the
/// connection is closed, as soon as its head has arrived. The codec does not check the
/// header's value: [`HttpRequest::header`] gives it to the handler as it came.
pub struct Http {
    max_header_bytes: usize,
    max_headers: usize,
    max_body: usize,
    /// Progress on the request at the front of the buffer, kept between calls to `decode`.
    pending: Pending,
    /// Header lines set by the handler, reused.
    head: Vec<u8>,
    /// The body written by the handler, reused.
    body: Vec<u8>,
    date: HttpDate,
}

impl fmt::Debug for Http {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http")
            .field("max_header_bytes", &self.max_header_bytes)
            .field("max_headers", &self.max_headers)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

impl Clone for Http {
    /// The same limits, with buffers of its own (for another connection).
    fn clone(&self) -> Self {
        Http {
            max_header_bytes: self.max_header_bytes,
            max_headers: self.max_headers,
            max_body: self.max_body,
            pending: Pending::default(),
            head: Vec::new(),
            body: Vec::new(),
            date: HttpDate,
        }
    }
}

impl Drop for Http {
    fn drop(&mut self) {
        if self.head.capacity() > 0 {
            scratch::give(std::mem::take(&mut self.head), std::mem::take(&mut self.body));
        }
    }
}

/// The first capacity of a codec's response head and body buffers.
const HEAD_CAPACITY: usize = 256;
const BODY_CAPACITY: usize = 1024;

mod scratch {
    //! The response buffers, lent to a codec for one response and given back when it is
    //! finished: a worker builds one response at a time, whether it serves one
    //! connection (blocking) or thousands (an event loop), so the same two buffers go
    //! round instead of two allocations and two frees per response, and an idle
    //! connection's codec holds none (10,000 idle keep-alive clients would otherwise pin
    //! 1.3 KB each). One spare pair per thread (a worker is one), no lock; a response
    //! made while the pair is lent out (not the case in appsrv's loops) allocates its own.
    use std::cell::Cell;

    /// The largest buffer kept (a response that grew a buffer larger does not pin that
    /// memory).
    const LARGEST: usize = 256 * 1024;

    thread_local! {
        static SPARE: Cell<(Vec<u8>, Vec<u8>)> = const { Cell::new((Vec::new(), Vec::new())) };
    }

    /// A head buffer and a body buffer: the spare ones, or new ones.
    pub(super) fn take(head: usize, body: usize) -> (Vec<u8>, Vec<u8>) {
        let (h, b) = SPARE.with(Cell::take);
        (
            if h.capacity() >= head {
                h
            } else {
                Vec::with_capacity(head)
            },
            if b.capacity() >= body {
                b
            } else {
                Vec::with_capacity(body)
            },
        )
    }

    /// Keeps the pair for the next response (emptied), unless it is large. A pair kept
    /// already is freed instead.
    pub(super) fn give(mut head: Vec<u8>, mut body: Vec<u8>) {
        if head.capacity() > LARGEST || body.capacity() > LARGEST {
            return;
        }
        head.clear();
        body.clear();
        // A thread that is ending has no spare any more: the buffers are just freed.
        let _ = SPARE.try_with(|spare| spare.set((head, body)));
    }
}

impl Default for Http {
    /// Heads up to 8 KiB with at most 64 headers, bodies up to 1 MiB.
    fn default() -> Self {
        Http {
            max_header_bytes: 8 * 1024,
            max_headers: MAX_HEADERS,
            max_body: 1024 * 1024,
            pending: Pending::default(),
            // Lent for each response (see `scratch`).
            head: Vec::new(),
            body: Vec::new(),
            date: HttpDate,
        }
    }
}

impl Http {
    /// The codec with its default limits.
    pub fn new() -> Self {
        Http::default()
    }

    /// The largest request head (request line and headers, with their line ends), in
    /// bytes; a larger one is answered `431 Request Header Fields Too Large`. Default 8 KiB;
    /// at least 64 bytes, at most 16 MiB.
    pub fn max_header_bytes(mut self, bytes: usize) -> Self {
        self.max_header_bytes = bytes.clamp(64, 16 << 20);
        self
    }

    /// The most headers a request may have (default and maximum 64, at least 1); more are
    /// answered `431 Request Header Fields Too Large`.
    pub fn max_headers(mut self, n: usize) -> Self {
        self.max_headers = n.clamp(1, MAX_HEADERS);
        self
    }

    /// The largest request body, in bytes (after de-chunking); a larger one is answered
    /// `413 Content Too Large`, as soon as its `Content-Length` (or the size of a chunk)
    /// says so, before the body arrives. Default 1 MiB.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

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
    fn parse_head(&self, buf: &[u8]) -> Result<Option<Head>, ProtocolError> {
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
    fn scan_chunks(&mut self, buf: &[u8], start: usize) -> Result<Option<(usize, usize)>, ProtocolError> {
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
    fn body_incomplete<R>(&mut self, head: &Head) -> Decoded<R> {
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
struct Pending {
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
struct Span {
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

    fn get(self, buf: &[u8]) -> &[u8] {
        &buf[self.start as usize..self.end as usize]
    }
}

#[derive(Debug, Clone, Copy)]
struct HeaderSpan {
    name: Span,
    value: Span,
}

impl HeaderSpan {
    const EMPTY: HeaderSpan = HeaderSpan {
        name: Span::EMPTY,
        value: Span::EMPTY,
    };
}

/// A parsed request head, as offsets into the buffer.
struct Head {
    len: usize,
    method: Span,
    target: Span,
    version: u8,
    headers: [HeaderSpan; MAX_HEADERS],
    count: usize,
    content_length: Option<u64>,
    chunked: bool,
    /// `Connection: close` was given.
    close: bool,
    /// `Connection: keep-alive` was given.
    keep_alive: bool,
    expect_continue: bool,
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

fn malformed(why: &'static str) -> ProtocolError {
    ProtocolError::Malformed(Cow::Borrowed(why))
}

/// The reason of the 400 answering an HTTP/1.1 request without a `Host` field.
const NO_HOST: &str = "no Host header (HTTP/1.1 requires one)";

/// The reason of the 400 answering a request with more than one `Host` field.
const SEVERAL_HOSTS: &str = "more than one Host header";

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
fn has_bare_lf(b: &[u8]) -> bool {
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

fn trim(s: &[u8]) -> &[u8] {
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
fn dechunk(buf: &mut [u8], start: usize) -> Result<usize, ProtocolError> {
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

impl Codec for Http {
    type Request<'a> = HttpRequest<'a>;
    type Response<'a> = HttpResponse<'a>;

    fn max_request_size(&self) -> usize {
        self.max_header_bytes.saturating_add(self.max_body)
    }

    fn decode<'a>(&mut self, buf: &'a mut [u8]) -> Result<Decoded<HttpRequest<'a>>, ProtocolError> {
        let Some(head) = self.parse_head(buf)? else {
            return Ok(Decoded::incomplete());
        };
        let (body_len, len) = if head.chunked {
            match self.scan_chunks(buf, head.len)? {
                Some((body_len, end)) => {
                    let n = dechunk(buf, head.len)?;
                    debug_assert_eq!(n, body_len);
                    (n, end)
                }
                None => return Ok(self.body_incomplete(&head)),
            }
        } else {
            let n = head.content_length.unwrap_or(0);
            let n = match usize::try_from(n) {
                Ok(n) if n <= self.max_body => n,
                _ => {
                    return Err(ProtocolError::TooLarge {
                        what: "body",
                        limit: self.max_body,
                    });
                }
            };
            if buf.len() - head.len < n {
                return Ok(self.body_incomplete(&head));
            }
            (n, head.len + n)
        };
        self.pending = Pending::default();
        let buf: &'a [u8] = buf;
        let (Ok(method), Ok(target)) = (
            std::str::from_utf8(head.method.get(buf)),
            std::str::from_utf8(head.target.get(buf)),
        ) else {
            return Err(malformed("request line is not UTF-8"));
        };
        let keep_alive = if head.version == 0 {
            head.keep_alive && !head.close
        } else {
            !head.close
        };
        Ok(Decoded::Request {
            request: HttpRequest {
                buf,
                method,
                target,
                version: head.version,
                headers: head.headers,
                count: head.count,
                body: &buf[head.len..head.len + body_len],
                content_length: head.content_length,
                chunked: head.chunked,
                keep_alive,
                expect_continue: head.expect_continue,
            },
            len,
        })
    }

    fn respond<'a>(
        &'a mut self,
        req: &HttpRequest<'_>,
        out: &'a mut Vec<u8>,
        last: bool,
    ) -> HttpResponse<'a> {
        if self.head.capacity() == 0 {
            (self.head, self.body) = scratch::take(HEAD_CAPACITY, BODY_CAPACITY);
        }
        self.head.clear();
        self.body.clear();
        HttpResponse {
            out,
            head: &mut self.head,
            body: &mut self.body,
            date: &mut self.date,
            status: 200,
            head_only: req.is_head(),
            discarded: 0,
            version: req.version,
            close: last || !req.keep_alive,
            file: None,
        }
    }

    fn encode_error(&mut self, err: &ProtocolError, out: &mut Vec<u8>) {
        self.pending = Pending::default();
        let status = match err {
            ProtocolError::Malformed(_) => 400,
            ProtocolError::Timeout => 408,
            ProtocolError::TooLarge { .. } => 413,
            ProtocolError::HeaderTooLarge { .. } => 431,
            ProtocolError::Unsupported(what) if what == UNSUPPORTED_VERSION => 505,
            ProtocolError::Unsupported(_) => 501,
            ProtocolError::Refused(_) => 503,
            ProtocolError::HandlerTimeout { .. } => 504,
            // A variant added later: the generic server error.
            #[allow(unreachable_patterns)]
            _ => 500,
        };
        self.body.clear();
        // Writing to a Vec cannot fail.
        let _ = writeln!(self.body, "{} {}: {err}", status, reason(status));
        write_status_line(out, status);
        out.extend_from_slice(b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: ");
        write_decimal(out, self.body.len() as u64);
        out.extend_from_slice(b"\r\nDate: ");
        out.extend_from_slice(&self.date.now());
        if status == 503 {
            // A refusal is for now (too many connections from the address, the server's
            // budget for unfinished requests spent): a client may try again in a second.
            out.extend_from_slice(b"\r\nRetry-After: 1");
        }
        out.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
        out.extend_from_slice(&self.body);
        self.body.clear();
    }

    /// HTTP says `Connection: close` on the last response of a connection.
    fn announces_close(&self) -> bool {
        true
    }

    /// The method and the path, without the query or the fragment: `GET /orders` for
    /// `GET /orders?token=… HTTP/1.1`; no header field, cookie or query is ever published
    /// (issue 41). Of an absolute target (`http://user:pw@host/path`), the path only; `*`
    /// as it is; nothing for any other target (`CONNECT`'s `host:port`, bytes that are not
    /// HTTP), nor until the space after the method has arrived.
    fn summarize(&self, head: &[u8], summary: &mut Summary) {
        summarize_request_line(head, summary);
    }
}

/// A request's method and path, from its first bytes `head` (which may stop anywhere):
/// the method once the space after it arrived, then the path as far as it came, up to
/// its `?` or `#`. The empty lines a client may send before the request line are skipped.
/// An absolute target (`http://host/path`, sent to proxies) gives its path only (its
/// authority may hold a user and a password), `*` stays; any other target (`CONNECT`'s
/// `host:port`, bytes that are not HTTP) gives nothing at all: what a client that does not
/// speak HTTP sent may be anything.
fn summarize_request_line(head: &[u8], summary: &mut Summary) {
    let start = head
        .iter()
        .position(|b| !matches!(b, b'\r' | b'\n'))
        .unwrap_or(head.len());
    let line = &head[start..];
    let Some(space) = line.iter().position(|b| *b == b' ') else {
        return;
    };
    let method = &line[..space];
    if method.is_empty() || !method.iter().all(|b| is_tchar(*b)) {
        return;
    }
    let rest = &line[space + 1..];
    // The target ends at the space before the version (or at a control byte, which no
    // target holds); it may not have arrived whole.
    let end = rest
        .iter()
        .position(|b| *b == b' ' || b.is_ascii_control())
        .unwrap_or(rest.len());
    let (target, whole) = (&rest[..end], end < rest.len());
    let path = match target.first() {
        Some(b'/') => target,
        Some(b'*') if target.len() == 1 => target,
        _ => match absolute_path(target, whole) {
            Some(path) => path,
            None => return,
        },
    };
    let path = &path[..path
        .iter()
        .position(|b| matches!(b, b'?' | b'#'))
        .unwrap_or(path.len())];
    summary
        .push(method)
        .push(b" ")
        .push(if path.is_empty() { b"/" } else { path });
}

/// The path (with what follows it) of an absolute target `scheme://authority/path`, once
/// the authority's end arrived (`whole`: the target did); `None` for any other target.
fn absolute_path(target: &[u8], whole: bool) -> Option<&[u8]> {
    let colon = target.iter().position(|b| *b == b':')?;
    let scheme = &target[..colon];
    let valid = scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    let rest = target[colon + 1..].strip_prefix(b"//").filter(|_| valid)?;
    match rest.iter().position(|b| matches!(b, b'/' | b'?' | b'#')) {
        Some(end) => Some(&rest[end..]),
        None => whole.then_some(&[][..]),
    }
}

/// A byte of a token (RFC 9110 §5.6.2), which a method is.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A request, borrowing the connection's read buffer.
///
/// The body is one slice even when it came chunked (the codec de-chunks it in place).
pub struct HttpRequest<'a> {
    buf: &'a [u8],
    method: &'a str,
    target: &'a str,
    version: u8,
    headers: [HeaderSpan; MAX_HEADERS],
    count: usize,
    body: &'a [u8],
    content_length: Option<u64>,
    chunked: bool,
    keep_alive: bool,
    expect_continue: bool,
}

impl<'a> HttpRequest<'a> {
    /// The method (`GET`, `POST`...), case-sensitive as HTTP says.
    pub fn method(&self) -> &'a str {
        self.method
    }

    /// Whether the method is `HEAD` (the response's body is not sent).
    pub fn is_head(&self) -> bool {
        self.method == "HEAD"
    }

    /// The request target as received (`/path?query`, `*`, or an absolute URI), not
    /// percent-decoded.
    pub fn target(&self) -> &'a str {
        self.target
    }

    /// The request target without its query (`/path` of `/path?query`), not
    /// percent-decoded.
    pub fn path(&self) -> &'a str {
        match self.target.split_once('?') {
            Some((path, _)) => path,
            None => self.target,
        }
    }

    /// The query of the request target (after `?`), if any, not percent-decoded.
    pub fn query(&self) -> Option<&'a str> {
        self.target.split_once('?').map(|(_, q)| q)
    }

    /// The minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// The value of the first header called `name` (compared without regard to case),
    /// without surrounding whitespace.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        let buf = self.buf;
        self.headers[..self.count]
            .iter()
            .find(|h| h.name.get(buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(|h| h.value.get(buf))
    }

    /// The value of the first header called `name`, if it is UTF-8.
    pub fn header_str(&self, name: &str) -> Option<&'a str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Every header in the order received, names as sent.
    pub fn headers(&self) -> impl ExactSizeIterator<Item = (&'a str, &'a [u8])> + '_ {
        let buf = self.buf;
        self.headers[..self.count].iter().map(move |h| {
            // Names are tokens (ASCII), checked by the parser.
            (
                std::str::from_utf8(h.name.get(buf)).unwrap_or(""),
                h.value.get(buf),
            )
        })
    }

    /// The body (de-chunked), empty if there is none.
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// The `Content-Length` the client sent, if any.
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    /// Whether the body came with `Transfer-Encoding: chunked`.
    pub fn is_chunked(&self) -> bool {
        self.chunked
    }

    /// Whether the client wants the connection kept open after the response (HTTP/1.1
    /// without `Connection: close`, or HTTP/1.0 with `Connection: keep-alive`).
    pub fn keep_alive(&self) -> bool {
        self.keep_alive
    }

    /// Whether the client sent `Expect: 100-continue` (the codec answered it already).
    pub fn expects_continue(&self) -> bool {
        self.expect_continue
    }
}

impl fmt::Debug for HttpRequest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Headers<'r, 'a>(&'r HttpRequest<'a>);
        impl fmt::Debug for Headers<'_, '_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list()
                    .entries(self.0.headers().map(|(n, v)| (n, String::from_utf8_lossy(v))))
                    .finish()
            }
        }
        f.debug_struct("HttpRequest")
            .field("method", &self.method)
            .field("target", &self.target)
            .field("version", &self.version)
            .field("headers", &Headers(self))
            .field("body_len", &self.body.len())
            .field("keep_alive", &self.keep_alive)
            .finish()
    }
}

/// A response being built; [`finish`](Respond::finish) (called by the framework after the
/// handler) writes it to the output buffer.
///
/// Status 200 unless [`status`](HttpResponse::status) says otherwise; no `Content-Type`
/// unless set. The body is what the handler writes (`Write`), followed by the file given
/// to [`send_file`](HttpResponse::send_file), if any; `Content-Length` is computed. For a
/// `HEAD` request the same head is sent without the body.
pub struct HttpResponse<'a> {
    out: &'a mut Vec<u8>,
    head: &'a mut Vec<u8>,
    body: &'a mut Vec<u8>,
    date: &'a mut HttpDate,
    status: u16,
    /// A `HEAD` request: the body is counted, not kept.
    head_only: bool,
    /// Body bytes written for a `HEAD` request.
    discarded: u64,
    /// The request's minor version.
    version: u8,
    close: bool,
    file: Option<FileBody>,
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

fn write_status_line(out: &mut Vec<u8>, status: u16) {
    out.extend_from_slice(b"HTTP/1.1 ");
    write_decimal(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn write_decimal(out: &mut Vec<u8>, mut n: u64) {
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
fn reason(status: u16) -> &'static str {
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

/// The `Date` header's value, formatted again only when the second changes.
/// The `Date` header's value, formatted once a second for the whole worker (every codec,
/// so every connection, shares it: a new connection's first response does not format the
/// date again).
#[derive(Debug, Clone, Copy)]
struct HttpDate;

thread_local! {
    /// The second last formatted, and its text.
    static DATE: std::cell::Cell<(u64, [u8; 29])> =
        const { std::cell::Cell::new((u64::MAX, *b"Thu, 01 Jan 1970 00:00:00 GMT")) };
}

impl HttpDate {
    /// The current time as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`): one clock read
    /// (no system call with the vDSO), a formatting once a second.
    fn now(&mut self) -> [u8; 29] {
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
    use super::super::testing::decode_all;
    use super::*;
    use proptest::prelude::*;

    /// The parts of a request, owned.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Parts {
        method: String,
        target: String,
        version: u8,
        headers: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
        keep_alive: bool,
    }

    fn parts(r: &HttpRequest<'_>) -> Parts {
        Parts {
            method: r.method().to_owned(),
            target: r.target().to_owned(),
            version: r.version(),
            headers: r.headers().map(|(n, v)| (n.to_owned(), v.to_vec())).collect(),
            body: r.body().to_vec(),
            keep_alive: r.keep_alive(),
        }
    }

    fn decode(input: &[u8], chunk: usize) -> Result<Vec<Parts>, ProtocolError> {
        decode_all(&mut Http::new(), input, chunk, parts)
    }

    fn decode_one(input: &[u8]) -> Result<Parts, ProtocolError> {
        let mut all = decode(input, input.len())?;
        assert_eq!(
            all.len(),
            1,
            "one request in {:?}",
            String::from_utf8_lossy(input)
        );
        Ok(all.remove(0))
    }

    /// Decodes a single complete request and makes the response to it with `handle`.
    fn respond_to(
        input: &[u8],
        last: bool,
        handle: impl FnOnce(&HttpRequest<'_>, &mut HttpResponse<'_>),
    ) -> (String, Outcome) {
        let mut codec = Http::new();
        let mut buf = input.to_vec();
        let mut out = Vec::new();
        let Decoded::Request { request, len } = codec.decode(&mut buf).unwrap() else {
            panic!("incomplete request");
        };
        assert_eq!(len, input.len());
        let mut res = codec.respond(&request, &mut out, last);
        handle(&request, &mut res);
        let outcome = res.finish();
        (String::from_utf8(out).unwrap(), outcome)
    }

    fn error_reply(err: &ProtocolError) -> String {
        let mut out = Vec::new();
        Http::new().encode_error(err, &mut out);
        String::from_utf8(out).unwrap()
    }

    /// The status code `Http` answers `input` with when it is refused.
    fn refusal(codec: &mut Http, input: &[u8]) -> u16 {
        let err = decode_all(codec, input, input.len(), |_| ()).expect_err("refused");
        let mut out = Vec::new();
        codec.encode_error(&err, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("\r\nConnection: close\r\n"), "{text}");
        text[9..12].parse().unwrap()
    }

    fn header_of<'t>(response: &'t str, name: &str) -> Option<&'t str> {
        let head = response.split("\r\n\r\n").next().unwrap();
        head.lines()
            .skip(1)
            .filter_map(|l| l.split_once(": "))
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    const THREE: &[u8] = b"GET /a?x=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n\
        POST /rpc HTTP/1.1\r\nHost: h\r\nContent-Type: text/xml\r\nContent-Length: 11\r\n\r\nhello world\
        POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";

    fn three_expected() -> Vec<Parts> {
        let h = |n: &str, v: &str| (n.to_owned(), v.as_bytes().to_vec());
        vec![
            Parts {
                method: "GET".into(),
                target: "/a?x=1".into(),
                version: 1,
                headers: vec![h("Host", "example.com"), h("Accept", "*/*")],
                body: vec![],
                keep_alive: true,
            },
            Parts {
                method: "POST".into(),
                target: "/rpc".into(),
                version: 1,
                headers: vec![
                    h("Host", "h"),
                    h("Content-Type", "text/xml"),
                    h("Content-Length", "11"),
                ],
                body: b"hello world".to_vec(),
                keep_alive: true,
            },
            Parts {
                method: "POST".into(),
                target: "/up".into(),
                version: 1,
                headers: vec![h("Host", "h"), h("Transfer-Encoding", "chunked")],
                body: b"hello world".to_vec(),
                keep_alive: true,
            },
        ]
    }

    #[test]
    fn requests_split_at_every_byte_boundary() {
        for chunk in 1..=THREE.len() {
            assert_eq!(decode(THREE, chunk).unwrap(), three_expected(), "chunk {chunk}");
        }
    }

    #[test]
    fn several_requests_in_one_buffer() {
        let mut input = THREE.to_vec();
        input.extend_from_slice(THREE);
        let mut expected = three_expected();
        expected.extend(three_expected());
        assert_eq!(decode(&input, input.len()).unwrap(), expected);
    }

    #[test]
    fn request_accessors() {
        let mut codec = Http::new();
        let mut buf =
            b"GET /p/q?a=b&c HTTP/1.1\r\nHost: h\r\nX-One:  1 \r\nx-one: 2\r\nEmpty:\r\n\r\n".to_vec();
        let Decoded::Request { request: r, .. } = codec.decode(&mut buf).unwrap() else {
            panic!()
        };
        assert_eq!(r.path(), "/p/q");
        assert_eq!(r.query(), Some("a=b&c"));
        assert_eq!(r.target(), "/p/q?a=b&c");
        assert_eq!(r.header("X-ONE"), Some(&b"1"[..]), "first of the name, trimmed");
        assert_eq!(r.header_str("x-one"), Some("1"));
        assert_eq!(r.header("empty"), Some(&b""[..]));
        assert_eq!(r.header("missing"), None);
        assert_eq!(r.headers().len(), 4);
        assert!(!r.is_head() && !r.is_chunked() && r.content_length().is_none());
        assert!(format!("{r:?}").contains("/p/q"));
    }

    #[test]
    fn empty_lines_before_a_request_are_skipped() {
        let p = decode(b"\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 1).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].target, "/");
    }

    #[test]
    fn chunked_bodies_split_at_every_byte() {
        let input: &[u8] = b"PUT /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n\
            1\r\na\r\n0010 ; name=\"v\"\r\n0123456789abcdef\r\nA\r\n0123456789\r\n000\r\nT: 1\r\nU: 2\r\n\r\n\
            GET /next HTTP/1.1\r\nHost: h\r\n\r\n";
        for chunk in 1..=input.len() {
            let p = decode(input, chunk).unwrap();
            assert_eq!(p.len(), 2, "chunk {chunk}");
            assert_eq!(p[0].body, b"a0123456789abcdef0123456789", "chunk {chunk}");
            assert_eq!(p[1].target, "/next", "the next request is intact (chunk {chunk})");
        }
    }

    #[test]
    fn chunked_body_is_dechunked_in_place() {
        let mut codec = Http::new();
        let mut buf =
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nrest"
                .to_vec();
        let start = buf.as_ptr() as usize;
        let Decoded::Request { request, len } = codec.decode(&mut buf).unwrap() else {
            panic!()
        };
        assert_eq!(request.body(), b"abcde");
        assert!(
            (request.body().as_ptr() as usize) >= start && (request.body().as_ptr() as usize) < start + len
        );
        assert!(request.is_chunked());
        assert_eq!(&buf[len..], b"rest");
    }

    #[test]
    fn bad_chunk_syntax_is_400() {
        let head = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
        for body in [
            "x\r\n",                  // not hex
            "\r\n",                   // no size
            "3\r\nabcX\r\n0\r\n\r\n", // no CRLF after the data
            "3\r\nabc\nX",            // LF alone after the data
            "3\nabc\r\n",             // LF alone after the size
            "3 4\r\nabc\r\n",         // junk after the size
            "1234567890abcdef0\r\n",  // too many digits
            "3;a\rb\r\nabc\r\n",      // CR inside an extension
        ] {
            let input = format!("{head}{body}");
            let e = decode(input.as_bytes(), 1).expect_err(body);
            assert!(matches!(e, ProtocolError::Malformed(_)), "{body:?}: {e:?}");
            assert_eq!(refusal(&mut Http::new(), input.as_bytes()), 400, "{body:?}");
        }
    }

    /// Issue 14: one rule for line ends. A bare LF is refused with 400 in every line of a
    /// request: the start line, a header field, the end of the head, a chunk-size line,
    /// after a chunk's data, a trailer field and the end of the trailers.
    #[test]
    fn bare_lf_is_refused_everywhere_with_400() {
        let chunked = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
        let cases = [
            ("the start line", "GET / HTTP/1.1\nHost: h\r\n\r\n".to_owned()),
            (
                "an empty line before it",
                "\nGET / HTTP/1.1\r\nHost: h\r\n\r\n".to_owned(),
            ),
            (
                "a header field",
                "GET / HTTP/1.1\r\nHost: h\nAccept: */*\r\n\r\n".to_owned(),
            ),
            (
                "the end of the head",
                "GET / HTTP/1.1\r\nHost: h\r\n\n".to_owned(),
            ),
            (
                "a bare-LF head throughout",
                "GET / HTTP/1.1\nHost: h\n\n".to_owned(),
            ),
            ("a chunk-size line", format!("{chunked}3\nabc\r\n0\r\n\r\n")),
            (
                "the last chunk-size line",
                format!("{chunked}3\r\nabc\r\n0\n\r\n"),
            ),
            ("after chunk data", format!("{chunked}3\r\nabc\n0\r\n\r\n")),
            ("a trailer field", format!("{chunked}3\r\nabc\r\n0\r\nT: 1\n\r\n")),
            (
                "the end of the trailers",
                format!("{chunked}3\r\nabc\r\n0\r\nT: 1\r\n\n"),
            ),
            ("the end of no trailers", format!("{chunked}3\r\nabc\r\n0\r\n\n")),
        ];
        for (place, input) in &cases {
            for chunk in [1, input.len()] {
                let e = decode(input.as_bytes(), chunk).expect_err(place);
                assert!(
                    matches!(&e, ProtocolError::Malformed(why) if why.contains("CRLF")),
                    "{place}: {e:?}"
                );
            }
            assert_eq!(refusal(&mut Http::new(), input.as_bytes()), 400, "{place}");
            // The same request with CRLF line ends is served.
            let fixed = input.replace("\r\n", "\n").replace('\n', "\r\n");
            assert_eq!(
                decode(fixed.as_bytes(), 1).map(|p| p.len()),
                Ok(1),
                "{place}: {fixed:?}"
            );
        }
        // A head with another fault too (a 501 alone) is refused for its bare LF: 400.
        let gzip = "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nHost: h\r\n\r\n";
        assert_eq!(refusal(&mut Http::new(), gzip.as_bytes()), 501);
        let both = gzip.replacen("gzip\r\n", "gzip\n", 1);
        assert_eq!(refusal(&mut Http::new(), both.as_bytes()), 400);
        assert_eq!(refusal(&mut Http::new(), b"GET / HTTP/2.0\r\n\r\n"), 505);
        assert_eq!(refusal(&mut Http::new(), b"GET / HTTP/2.0\n\r\n"), 400);
    }

    /// The head check looks only where httparse found the lines: each line end of a
    /// head, made a bare LF in turn, is refused (and `has_bare_lf`, the plain definition,
    /// agrees in debug builds: `head_lines_end_in_crlf` asserts it on every head).
    #[test]
    fn a_bare_lf_at_any_line_end_of_the_head_is_refused() {
        let head = "\r\n\r\nPOST /a?b HTTP/1.1\r\nHost: h\r\nEmpty:\r\nSpaces:   \r\n\
                    Accept: */*\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(decode(head.as_bytes(), 1).map(|p| p.len()), Ok(1));
        let ends: Vec<usize> = head.match_indices("\r\n").map(|(i, _)| i).collect();
        assert_eq!(ends.len(), 9);
        for cr in ends {
            let mut input = head.as_bytes().to_vec();
            input.remove(cr);
            let shown = String::from_utf8_lossy(&input).into_owned();
            for chunk in [1, input.len()] {
                match decode(&input, chunk) {
                    Err(ProtocolError::Malformed(why)) => assert!(why.contains("CRLF"), "{shown:?}: {why}"),
                    other => panic!("{shown:?}: {other:?}"),
                }
            }
        }
        for (b, bare) in [
            (&b""[..], false),
            (b"\n", true),
            (b"\r\n", false),
            (b"a\r\nb\n\r\n", true),
            (b"\n\r", true),
        ] {
            assert_eq!(has_bare_lf(b), bare, "{:?}", String::from_utf8_lossy(b));
        }
    }

    #[test]
    fn chunked_body_too_large_is_413_before_the_data() {
        let mut codec = Http::new().max_body(10);
        let input = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n8\r\n";
        let e = decode_all(&mut codec, input, 1, |_| ()).unwrap_err();
        assert_eq!(
            e,
            ProtocolError::TooLarge {
                what: "body",
                limit: 10
            }
        );
        assert_eq!(refusal(&mut Http::new().max_body(10), input), 413);
    }

    #[test]
    fn expect_100_continue_is_answered_once() {
        let mut codec = Http::new();
        let request =
            b"POST /rpc HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello";
        let head_len = request.len() - 5;
        let mut interims = 0;
        for n in 0..request.len() {
            let mut buf = request[..n].to_vec();
            match codec.decode(&mut buf).unwrap() {
                Decoded::Incomplete { interim: Some(bytes) } => {
                    assert_eq!(bytes, b"HTTP/1.1 100 Continue\r\n\r\n");
                    assert_eq!(n, head_len, "sent as soon as the head is complete");
                    interims += 1;
                }
                Decoded::Incomplete { interim: None } => {}
                Decoded::Request { .. } => panic!("complete at {n}"),
            }
        }
        assert_eq!(interims, 1);
        let mut buf = request.to_vec();
        let Decoded::Request { request: r, .. } = codec.decode(&mut buf).unwrap() else {
            panic!()
        };
        assert!(r.expects_continue());
        assert_eq!(r.body(), b"hello");
        // The next request on the connection gets its own 100 Continue.
        let mut buf = request[..head_len].to_vec();
        assert!(matches!(
            codec.decode(&mut buf).unwrap(),
            Decoded::Incomplete { interim: Some(_) }
        ));
        // So does the first request of the next connection (which has a codec of its own).
        let mut codec = Http::new();
        assert!(matches!(
            codec.decode(&mut buf).unwrap(),
            Decoded::Incomplete { interim: Some(_) }
        ));
    }

    #[test]
    fn no_100_continue_when_the_body_is_there_or_for_http_1_0() {
        let mut codec = Http::new();
        let mut buf =
            b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi".to_vec();
        assert!(matches!(codec.decode(&mut buf).unwrap(), Decoded::Request { .. }));
        let mut buf =
            b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n".to_vec();
        assert!(matches!(codec.decode(&mut buf).unwrap(), Decoded::Request { .. }));
        let mut buf = b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n".to_vec();
        assert!(matches!(
            codec.decode(&mut buf).unwrap(),
            Decoded::Incomplete { interim: None }
        ));
        // Chunked bodies get it too.
        let mut codec = Http::new();
        let mut buf =
            b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec();
        assert!(matches!(
            codec.decode(&mut buf).unwrap(),
            Decoded::Incomplete { interim: Some(_) }
        ));
    }

    #[test]
    fn keep_alive_decisions() {
        let cases: &[(&str, bool, bool, Option<&str>)] = &[
            // request, last, closes, Connection header in the response
            ("GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, false, None),
            (
                "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
                false,
                true,
                Some("close"),
            ),
            (
                "GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, CLOSE\r\n\r\n",
                false,
                true,
                Some("close"),
            ),
            ("GET / HTTP/1.1\r\nHost: h\r\n\r\n", true, true, Some("close")),
            ("GET / HTTP/1.0\r\n\r\n", false, true, Some("close")),
            (
                "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
                false,
                false,
                Some("keep-alive"),
            ),
            (
                "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                true,
                true,
                Some("close"),
            ),
        ];
        for (req, last, closes, header) in cases {
            let (text, outcome) = respond_to(req.as_bytes(), *last, |_, res| {
                res.write_all(b"hi").unwrap();
            });
            assert_eq!(outcome.close, *closes, "{req:?} last={last}");
            assert_eq!(
                header_of(&text, "connection"),
                *header,
                "{req:?} last={last}: {text}"
            );
            assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
            assert!(text.ends_with("\r\n\r\nhi"), "{text}");
        }
        // The handler can close too.
        let (text, outcome) = respond_to(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
            res.header("Connection", "close");
        });
        assert!(outcome.close);
        assert_eq!(header_of(&text, "connection"), Some("close"));
    }

    #[test]
    fn response_head() {
        let (text, outcome) = respond_to(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
            res.write_all(b"Hello, ").unwrap();
            res.status(404).content_type("text/plain").header("X-A", "b");
            res.write_all(b"World!").unwrap();
        });
        assert!(outcome.file.is_none() && !outcome.close);
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert_eq!(body, "Hello, World!");
        let mut lines = head.lines();
        assert_eq!(lines.next(), Some("HTTP/1.1 404 Not Found"));
        assert_eq!(header_of(&text, "content-type"), Some("text/plain"));
        assert_eq!(header_of(&text, "x-a"), Some("b"));
        assert_eq!(header_of(&text, "content-length"), Some("13"));
        let date = header_of(&text, "date").unwrap();
        assert_eq!(date.len(), 29);
        assert!(date.ends_with(" GMT"), "{date}");

        // Defaults: 200, no Content-Type, an empty body with Content-Length 0.
        let (text, _) = respond_to(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, _| {});
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"));
        assert_eq!(header_of(&text, "content-type"), None);
        assert_eq!(header_of(&text, "content-length"), Some("0"));

        // The codec's headers are its own; header injection is refused.
        let (text, _) = respond_to(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
            res.header("Content-Length", "99")
                .header("X-Evil", "a\r\nSet-Cookie: x")
                .header("Bad Name", "v")
                .status(204);
        });
        assert!(text.starts_with("HTTP/1.1 204 No Content\r\n"), "{text}");
        assert_eq!(
            header_of(&text, "content-length"),
            None,
            "no Content-Length with 204: {text}"
        );
        assert!(!text.contains("Evil") && !text.contains("Bad"), "{text}");

        let (text, _) = respond_to(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
            res.status(299);
        });
        assert!(text.starts_with("HTTP/1.1 299 \r\n"), "{text}");
    }

    #[test]
    fn head_requests_get_the_head_only() {
        let (text, outcome) = respond_to(b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n", false, |req, res| {
            assert!(req.is_head());
            res.content_type("text/plain")
                .write_all(b"Hello, World!")
                .unwrap();
        });
        assert_eq!(header_of(&text, "content-length"), Some("13"));
        assert!(text.ends_with("\r\n\r\n"), "no body: {text}");
        assert!(!outcome.close);

        let file = File::open("Cargo.toml").unwrap();
        let (text, outcome) = respond_to(b"HEAD /f HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
            res.send_file(file, 10..110);
        });
        assert_eq!(header_of(&text, "content-length"), Some("100"));
        assert!(text.ends_with("\r\n\r\n"));
        assert!(outcome.file.is_none(), "no file for HEAD");
    }

    #[test]
    fn send_file_sets_the_length_and_the_outcome() {
        let file = File::open("Cargo.toml").unwrap();
        let (text, outcome) = respond_to(b"GET /f HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
            res.write_all(b"ab").unwrap();
            res.send_file(file, 10..110);
        });
        assert_eq!(header_of(&text, "content-length"), Some("102"));
        assert!(text.ends_with("\r\n\r\nab"));
        let body = outcome.file.expect("a file");
        assert_eq!(body.range, 10..110);
    }

    #[test]
    fn pipelined_responses_share_the_output_buffer() {
        let mut codec = Http::new();
        let mut input =
            b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\nHEAD /2 HTTP/1.1\r\nHost: h\r\n\r\nGET /3 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
                .to_vec();
        let mut out = Vec::new();
        let mut at = 0;
        let mut closes = Vec::new();
        while at < input.len() {
            let Decoded::Request { request, len } = codec.decode(&mut input[at..]).unwrap() else {
                panic!()
            };
            let mut res = codec.respond(&request, &mut out, false);
            res.write_all(request.target().as_bytes()).unwrap();
            closes.push(res.finish().close);
            at += len;
        }
        assert_eq!(closes, [false, false, true]);
        let text = String::from_utf8(out).unwrap();
        let responses: Vec<&str> = text.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
        assert_eq!(responses.len(), 3, "{text}");
        assert!(responses[0].ends_with("\r\n\r\n/1"));
        assert!(responses[1].ends_with("\r\n\r\n"), "HEAD: no body");
        assert!(responses[2].ends_with("Connection: close\r\n\r\n/3"));
    }

    #[test]
    fn error_replies() {
        for (err, status) in [
            (ProtocolError::Malformed("x".into()), "400 Bad Request"),
            (ProtocolError::Timeout, "408 Request Timeout"),
            (
                ProtocolError::TooLarge {
                    what: "body",
                    limit: 1,
                },
                "413 Content Too Large",
            ),
            (
                ProtocolError::HeaderTooLarge { limit: 1 },
                "431 Request Header Fields Too Large",
            ),
            (ProtocolError::Unsupported("gzip".into()), "501 Not Implemented"),
            (
                ProtocolError::Unsupported(UNSUPPORTED_VERSION.into()),
                "505 HTTP Version Not Supported",
            ),
        ] {
            let text = error_reply(&err);
            assert!(text.starts_with(&format!("HTTP/1.1 {status}\r\n")), "{text}");
            assert_eq!(header_of(&text, "connection"), Some("close"));
            assert_eq!(
                header_of(&text, "content-type"),
                Some("text/plain; charset=utf-8")
            );
            let body = text.split_once("\r\n\r\n").unwrap().1;
            assert!(body.starts_with(status) && body.ends_with('\n'), "{body:?}");
            assert_eq!(
                header_of(&text, "content-length"),
                Some(body.len().to_string().as_str())
            );
        }
    }

    #[test]
    fn malformed_requests_are_400() {
        for input in [
            &b"GET / HTTP/1.1\r\nHost: h\r\nBad Header: x\r\n\r\n"[..],
            b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
            b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET / HTTP/1.1\r\n folded: x\r\nHost: h\r\n\r\n",
            b"GET / XTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1x\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(
                refusal(&mut Http::new(), input),
                400,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        // A repeated identical Content-Length is fine.
        let p = decode_one(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab")
            .unwrap();
        assert_eq!(p.body, b"ab");
    }

    /// Issue 31: RFC 9112 §3.2. An HTTP/1.1 request without `Host`, and any request with
    /// two, is a 400 (and the codec's error reply closes the connection); HTTP/1.0 may
    /// leave it out.
    #[test]
    fn issue_31_a_missing_or_repeated_host_is_400() {
        let refused = |input: &[u8], why: &str| {
            let shown = String::from_utf8_lossy(input).into_owned();
            for chunk in [1, input.len()] {
                match decode(input, chunk) {
                    Err(ProtocolError::Malformed(w)) => assert_eq!(w, why, "{shown:?}"),
                    other => panic!("{shown:?} in pieces of {chunk}: {other:?}"),
                }
            }
            assert_eq!(refusal(&mut Http::new(), input), 400, "{shown:?}");
        };
        refused(b"GET / HTTP/1.1\r\n\r\n", NO_HOST);
        refused(b"GET / HTTP/1.1\r\nAccept: */*\r\nX-Host: h\r\n\r\n", NO_HOST);
        // The absolute form names the host, but the field is required all the same.
        refused(b"GET http://example.com/ HTTP/1.1\r\n\r\n", NO_HOST);
        refused(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", SEVERAL_HOSTS);
        refused(
            b"GET / HTTP/1.1\r\nhost: a\r\nX: 1\r\nHOST: a\r\n\r\n",
            SEVERAL_HOSTS,
        );
        refused(b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", SEVERAL_HOSTS);
        // Refused once the head is there, before any of the body is waited for.
        refused(b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n", NO_HOST);
        // In a pipeline: the requests before it are served, then the 400.
        let mut codec = Http::new();
        let two = b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\nGET /2 HTTP/1.1\r\n\r\n";
        let mut served = Vec::new();
        let e = decode_all(&mut codec, two, two.len(), |r| served.push(r.target().to_owned()))
            .expect_err("the second has no Host");
        assert_eq!((served, e), (vec!["/1".to_owned()], malformed(NO_HOST)));
        let mut out = Vec::new();
        codec.encode_error(&malformed(NO_HOST), &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.ends_with(
                "\r\n\r\n400 Bad Request: malformed request: no Host header (HTTP/1.1 requires one)\n"
            ),
            "the reason, for a person reading it: {text}"
        );

        // Served: one Host (an empty one too, RFC 9112 §3.2's "no authority"), in any case;
        // HTTP/1.0 without one.
        for input in [
            &b"GET / HTTP/1.1\r\nHost: example.com:8080\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nhOsT: h\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost:\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
            b"GET / HTTP/1.0\r\nHost: h\r\n\r\n",
        ] {
            let p =
                decode_one(input).unwrap_or_else(|e| panic!("{:?}: {e:?}", String::from_utf8_lossy(input)));
            assert_eq!(p.target, "/");
        }
    }

    #[test]
    fn oversize_requests_are_refused_early() {
        // A head larger than the limit, before it ends.
        let mut codec = Http::new().max_header_bytes(100);
        let mut input = b"GET / HTTP/1.1\r\nHost: h\r\nX-Long: ".to_vec();
        input.extend_from_slice(&[b'a'; 200]);
        assert_eq!(refusal(&mut codec, &input), 431);
        let e = decode_all(&mut Http::new().max_header_bytes(100), &input, 7, |_| ()).unwrap_err();
        assert_eq!(e, ProtocolError::HeaderTooLarge { limit: 100 });
        // A complete head larger than the limit.
        input.extend_from_slice(b"\r\n\r\n");
        assert_eq!(refusal(&mut codec, &input), 431);
        // Too many headers.
        let mut many = b"GET / HTTP/1.1\r\nHost: h\r\n".to_vec();
        for i in 0..65 {
            many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(refusal(&mut Http::new(), &many), 431);
        assert_eq!(
            refusal(
                &mut Http::new().max_headers(3),
                b"GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n"
            ),
            431
        );
        assert_eq!(
            decode(b"GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", 1)
                .unwrap()
                .len(),
            1
        );
        // A body larger than the limit, from its Content-Length alone.
        let input = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1048577\r\n\r\n";
        assert_eq!(refusal(&mut Http::new(), input), 413);
        let input = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\n";
        assert!(matches!(refusal(&mut Http::new(), input), 400 | 413));
        assert_eq!(Http::new().max_request_size(), 8 * 1024 + 1024 * 1024);
        assert_eq!(
            Http::new().max_header_bytes(1000).max_body(10).max_request_size(),
            1010
        );
    }

    #[test]
    fn unsupported_versions_and_codings() {
        assert_eq!(refusal(&mut Http::new(), b"GET / HTTP/2.0\r\n\r\n"), 505);
        assert_eq!(refusal(&mut Http::new(), b"GET / HTTP/1.2\r\n\r\n"), 505);
        assert_eq!(
            refusal(
                &mut Http::new(),
                b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
            ),
            501
        );
        assert_eq!(
            refusal(
                &mut Http::new(),
                b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n"
            ),
            501
        );
        let e = decode(b"GET / HTTP/3.0\r\n", 1).unwrap_err();
        assert!(matches!(e, ProtocolError::Unsupported(_)), "{e:?}");
    }

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

    /// Encodes a request: with `Content-Length`, or chunked with chunks of the given sizes.
    fn encode(p: &Parts, chunks: Option<&[usize]>) -> Vec<u8> {
        let mut r = format!("{} {} HTTP/1.{}\r\n", p.method, p.target, p.version).into_bytes();
        for (n, v) in &p.headers {
            r.extend_from_slice(n.as_bytes());
            r.extend_from_slice(b": ");
            r.extend_from_slice(v);
            r.extend_from_slice(b"\r\n");
        }
        match chunks {
            None => {
                r.extend_from_slice(b"\r\n");
                r.extend_from_slice(&p.body);
            }
            Some(sizes) => {
                r.extend_from_slice(b"\r\n");
                let mut rest = &p.body[..];
                let mut sizes = sizes.iter().cycle();
                while !rest.is_empty() {
                    let n = (*sizes.next().unwrap()).clamp(1, rest.len());
                    r.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                    r.extend_from_slice(&rest[..n]);
                    r.extend_from_slice(b"\r\n");
                    rest = &rest[n..];
                }
                r.extend_from_slice(b"0\r\n\r\n");
            }
        }
        r
    }

    fn arb_parts() -> impl Strategy<Value = Parts> {
        (
            "[A-Z]{1,10}",
            "/[a-zA-Z0-9._~%!$&'()*+,;=:@/?-]{0,40}",
            0u8..=1,
            prop::collection::vec(("x-[a-z0-9-]{1,12}", "[!-~]([ -~]{0,30}[!-~])?"), 0..10),
            prop::collection::vec(any::<u8>(), 0..600),
        )
            .prop_map(|(method, target, version, headers, body)| Parts {
                method,
                target,
                version,
                // The one Host an HTTP/1.1 request must have (HTTP/1.0 may have it too).
                headers: std::iter::once(("Host".to_owned(), b"h".to_vec()))
                    .chain(headers.into_iter().map(|(n, v)| (n, v.into_bytes())))
                    .collect(),
                body,
                keep_alive: version == 1,
            })
    }

    proptest! {
        #[test]
        fn encoded_requests_decode_to_their_parts(
            p in arb_parts(),
            chunked in any::<bool>(),
            sizes in prop::collection::vec(1usize..100, 1..5),
            cut in 1usize..200,
        ) {
            let mut p = p;
            let mut expected = p.clone();
            let chunked = chunked && p.version == 1;
            if chunked {
                p.headers.push(("Transfer-Encoding".into(), b"chunked".to_vec()));
            } else {
                p.headers.push(("Content-Length".into(), p.body.len().to_string().into_bytes()));
            }
            expected.headers = p.headers.clone();
            let bytes = encode(&p, chunked.then_some(&sizes[..]));
            let mut twice = bytes.clone();
            twice.extend_from_slice(&bytes);
            let got = decode(&twice, cut).unwrap();
            prop_assert_eq!(got, vec![expected.clone(), expected]);
        }
    }

    /// What `summarize` gives for `head`.
    fn summary(head: &[u8]) -> Vec<u8> {
        let mut s = Summary::new();
        Http::new().summarize(head, &mut s);
        s.as_bytes().to_vec()
    }

    /// Issue 41: the method and the path, never the query, a header or a cookie.
    #[test]
    fn issue_41_the_summary_is_the_method_and_the_path_without_the_query() {
        let head = b"GET /sleep?ms=300&pw=SECRETPW HTTP/1.1\r\nAuthorization: Bearer SECRETTOKEN\r\nCookie: s=SECRETCOOKIE\r\n\r\n";
        assert_eq!(summary(&head[..64]), b"GET /sleep");
        assert_eq!(summary(b"POST /orders#top HTTP/1.1\r\n"), b"POST /orders");
        assert_eq!(
            summary(b"\r\nGET / HTTP/1.1\r\n"),
            b"GET /",
            "empty lines before it skipped"
        );
        assert_eq!(summary(b"OPTIONS * HTTP/1.1\r\n"), b"OPTIONS *");
        // An absolute target: its path, not its authority (which may hold a password).
        assert_eq!(
            summary(b"GET http://user:SECRETPW@example.org/a/b?q=1 HTTP/1.1\r\n"),
            b"GET /a/b"
        );
        assert_eq!(summary(b"GET http://example.org HTTP/1.1\r\n"), b"GET /");
        assert_eq!(
            summary(b"GET http://user:SECRETPW@exam"),
            b"",
            "its authority's end not arrived"
        );
        // Not HTTP, or no path: nothing.
        for head in [
            &b"CONNECT example.org:443 HTTP/1.1\r\n"[..],
            b"AUTH SECRETPW\r\n",
            b"SECRETPW",
            b"G\x00T / HTTP/1.1",
            b" / HTTP/1.1",
        ] {
            assert_eq!(summary(head), b"", "{:?}", head.escape_ascii().to_string());
        }
    }

    /// Issue 41: a request line split across reads shows what arrived of it, the query
    /// never, whatever the split.
    #[test]
    fn issue_41_a_request_line_in_pieces_is_summarized_as_it_comes() {
        let line = b"GET /sleep?pw=SECRETPW HTTP/1.1\r\nHost: x\r\n\r\n";
        for cut in 0..=line.len() {
            let s = summary(&line[..cut]);
            let expected: &[u8] = match cut {
                0..=4 => b"",
                5..=10 => &line[..cut],
                _ => b"GET /sleep",
            };
            assert_eq!(s, expected, "cut at {cut}");
        }
    }

    /// Issue 41: a path that is not UTF-8 is kept as bytes (the status escapes them, a log
    /// line shows them lossily), and one longer than the summary's room is truncated.
    #[test]
    fn issue_41_a_non_utf8_or_long_path_in_the_summary() {
        let s = summary(b"GET /caf\xe9/\xff?x HTTP/1.1\r\n");
        assert_eq!(s, b"GET /caf\xe9/\xff");
        assert_eq!(s.escape_ascii().to_string(), "GET /caf\\xe9/\\xff");
        assert_eq!(String::from_utf8_lossy(&s), "GET /caf\u{fffd}/\u{fffd}");
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(100));
        let s = summary(long.as_bytes());
        assert_eq!(s.len(), Summary::CAPACITY);
        assert_eq!(s, &long.as_bytes()[..Summary::CAPACITY]);
    }
}

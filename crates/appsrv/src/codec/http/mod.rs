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

//!
//! # Files
//!
//! | File | Owns |
//! |---|---|
//! | `mod.rs` | [`Http`]: its limits, its response buffers (`scratch`), the [`Codec`] implementation that ties the parts together |
//! | `decode.rs` | reading a request: the head (httparse, the fields that frame the message, `Host`, bare LFs), the body's framing (`Content-Length`, chunks followed across reads and de-chunked in place), `100 Continue` |
//! | `request.rs` | [`HttpRequest`], the handler's view of a decoded request, and the request line's summary for the status (`summarize`) |
//! | `response.rs` | [`HttpResponse`]: the response the handler builds, its head and body written out, the status line and reasons, the `Date` header |
//! | `tests.rs` | the codec's tests through its [`Codec`] interface |
//!
//! `mod.rs` uses the three others; `request.rs` uses `decode.rs` (the header spans it
//! keeps), `response.rs` uses it too (`trim`, to read a `Connection` header the handler
//! set); `decode.rs` uses no sibling.

mod decode;
mod request;
mod response;
#[cfg(test)]
mod tests;

use std::fmt;
use std::io::Write;

pub use request::HttpRequest;
pub use response::HttpResponse;

use super::{Codec, Decoded, ProtocolError, Summary};
use decode::{Pending, dechunk, malformed};
use request::summarize_request_line;
use response::{HttpDate, reason, write_decimal, write_status_line};

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

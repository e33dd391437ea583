//! Protocol codecs: the framing of requests and responses, apart from how bytes arrive.
//!
//! A [`Codec`] turns the bytes at the front of a buffer into a request and builds the
//! response into an output buffer. It never reads or writes a socket: the framework's
//! connection loop does (read → decode → handle → encode → write), which keeps the same
//! codec usable by the blocking loop of today and by an event loop that reads without
//! blocking and calls the handler only for complete requests.
//!
//! Built-in codecs: [`Lines`], [`LengthPrefixed`], [`Netstring`], [`Resp`] (RESP2, the Redis
//! protocol) and [`Http`]. A codec of your own fits in a few lines; see `examples/ping.rs`
//! (a hand-written subset of the Redis protocol).
//!
//! # The request loop
//!
//! For each connection the loop (the request step, `conn/step.rs`, driven by the worker):
//! 1. decodes every complete request already in the read buffer, calls
//!    [`RequestHandler::handle_request`](crate::RequestHandler::handle_request) for each
//!    and appends each response to the output buffer, in order (pipelining);
//! 2. writes the responses of that batch with one `write(2)` when it needs more bytes;
//! 3. reads once more (one `read(2)`) and starts again.
//!
//! Bad input ([`ProtocolError`]) gets the codec's error reply ([`Codec::encode_error`]),
//! then the connection is closed; the worker goes on with the next client.

mod http;
mod length;
mod lines;
mod netstring;
mod resp;

pub use http::{Http, HttpRequest, HttpResponse};
pub use length::{LengthPrefixed, LengthResponse, Prefix};
pub use lines::{Line, Lines, LinesResponse};
pub use netstring::{Netstring, NetstringResponse};
pub use resp::{Resp, RespArgs, RespRequest, RespResponse};

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::ops::Range;

/// What [`Codec::decode`] found at the front of the buffer.
#[derive(Debug)]
#[non_exhaustive]
pub enum Decoded<R> {
    /// A complete request, which took the first `len` bytes of the buffer.
    Request {
        /// The request.
        request: R,
        /// How many bytes of the buffer it took.
        len: usize,
    },
    /// No complete request yet; `interim` bytes, if any, are sent to the peer before the
    /// loop waits for more (HTTP's `100 Continue`).
    Incomplete {
        /// A reply to send before waiting.
        interim: Option<&'static [u8]>,
    },
}

impl<R> Decoded<R> {
    /// More bytes are needed, nothing to send meanwhile.
    pub const fn incomplete() -> Self {
        Decoded::Incomplete { interim: None }
    }
}

/// Why a request could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The request (a line, a frame, a body) is larger than the codec's limit.
    TooLarge {
        /// What was too large ("line", "frame", "body").
        what: &'static str,
        /// The limit in bytes.
        limit: usize,
    },
    /// The request head (HTTP headers) is larger than the limit.
    HeaderTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The bytes do not follow the protocol.
    Malformed(Cow<'static, str>),
    /// The client stopped sending in the middle of a request (read timeout).
    Timeout,
    /// A valid request the codec does not support.
    Unsupported(Cow<'static, str>),
    /// The server refuses the client before reading a request (too many connections from
    /// its address); HTTP answers 503.
    Refused(Cow<'static, str>),
    /// The handler did not answer within `--request-timeout` (an async handler, whose
    /// call is cancelled); HTTP answers 504.
    HandlerTimeout {
        /// The limit.
        limit: std::time::Duration,
    },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::TooLarge { what, limit } => write!(f, "{what} too large (limit {limit} bytes)"),
            ProtocolError::HeaderTooLarge { limit } => {
                write!(f, "request header too large (limit {limit} bytes)")
            }
            ProtocolError::Malformed(why) => write!(f, "malformed request: {why}"),
            ProtocolError::Timeout => f.write_str("timed out waiting for the rest of the request"),
            ProtocolError::Unsupported(what) => write!(f, "unsupported: {what}"),
            ProtocolError::Refused(why) => write!(f, "refused: {why}"),
            ProtocolError::HandlerTimeout { limit } => {
                write!(
                    f,
                    "no answer within the request timeout ({} s)",
                    limit.as_secs_f64()
                )
            }
        }
    }
}

impl std::error::Error for ProtocolError {}

/// What the connection does after a response.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Outcome {
    /// Close the connection after this response.
    pub close: bool,
    /// A file to send after the bytes in the output buffer (with `sendfile(2)`).
    pub file: Option<FileBody>,
}

/// A byte range of a file to send as (the rest of) a response.
#[derive(Debug)]
pub struct FileBody {
    /// The open file.
    pub file: File,
    /// The byte range to send.
    pub range: Range<u64>,
}

/// Completes a response.
pub trait Respond {
    /// Finishes the response in the output buffer (a length prefix, HTTP headers) and says
    /// what the connection does next.
    fn finish(self) -> Outcome;

    /// The connection ends after this response after all: the server began to stop while
    /// the handler ran. A codec that [announces a close](Codec::announces_close) says so in
    /// this response (HTTP's `Connection: close`), as it would have had `last` been true
    /// when the response began. Called before [`finish`](Respond::finish); does nothing by
    /// default.
    fn close_after(&mut self) {}
}

/// What a worker publishes about a request in progress, as its codec's
/// [`summarize`](Codec::summarize) gives it: on the status page and its JSON
/// (`--metrics-listen`), in the `status` subcommand's table, and in the slow-request and
/// request-timeout log lines. Anyone who can reach those may read it, so it must never
/// hold what a client keeps secret (credentials, cookies, a query string, a message).
///
/// At most [`Summary::CAPACITY`] bytes: what is pushed beyond them is dropped. A summary
/// may hold any bytes: the status shows a byte that is not printable ASCII as `\xNN`, a
/// log line as UTF-8 with invalid sequences replaced; a short, printable one
/// (`GET /orders`, `AUTH`) reads best.
///
/// ```
/// use std::fmt::Write as _;
/// let mut s = appsrv::codec::Summary::new();
/// write!(s, "op {}", 7).unwrap();
/// s.push(b" (batch)");
/// assert_eq!(s.as_bytes(), b"op 7 (batch)");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Summary {
    bytes: [u8; Summary::CAPACITY],
    len: usize,
}

impl Summary {
    /// The most bytes a summary holds: 64, the room a worker's scoreboard slot has for it.
    pub const CAPACITY: usize = 64;

    /// An empty summary (what is published when the codec gives none).
    pub const fn new() -> Self {
        Summary {
            bytes: [0; Summary::CAPACITY],
            len: 0,
        }
    }

    /// Appends `bytes`, as many as there is room for (the rest is dropped).
    pub fn push(&mut self, bytes: &[u8]) -> &mut Self {
        let n = bytes.len().min(Summary::CAPACITY - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
        self
    }

    /// The bytes pushed so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Whether nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Empties it.
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl Default for Summary {
    fn default() -> Self {
        Summary::new()
    }
}

impl fmt::Debug for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Summary(\"{}\")", self.as_bytes().escape_ascii())
    }
}

/// Appends the text, truncated as [`push`](Summary::push) truncates (a character may be
/// cut in two); never fails.
impl fmt::Write for Summary {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

/// A protocol's framing.
///
/// One codec value serves one connection: [`RequestHandler::codec`](crate::RequestHandler::codec)
/// makes a new one for each connection, so a codec may keep per-connection state (how far
/// it got in a request that arrives in pieces, buffers it reuses between requests) in
/// itself, and is dropped when the connection closes.
pub trait Codec {
    /// A decoded request, borrowing from the connection's read buffer.
    type Request<'a>;
    /// A response being built into the output buffer.
    type Response<'a>: Respond
    where
        Self: 'a;

    /// The largest request the codec accepts, in bytes: the read buffer grows up to this
    /// (so a limit of gigabytes means a read buffer that large for such a request) and an
    /// incomplete request that reaches it is [`ProtocolError::TooLarge`].
    fn max_request_size(&self) -> usize;

    /// Decodes the request at the front of `buf`. The buffer is mutable so that a codec
    /// can rewrite a frame in place (HTTP de-chunks request bodies).
    fn decode<'a>(&mut self, buf: &'a mut [u8]) -> Result<Decoded<Self::Request<'a>>, ProtocolError>;

    /// Starts the response to `req` at the end of `out`. `last` is true when the
    /// connection will be closed after it: the server is stopping, or, for codecs that
    /// [announce a close](Codec::announces_close), the per-connection request limit was
    /// reached or clients are queued while no worker is idle. HTTP then says
    /// `Connection: close`.
    fn respond<'a>(
        &'a mut self,
        req: &Self::Request<'_>,
        out: &'a mut Vec<u8>,
        last: bool,
    ) -> Self::Response<'a>;

    /// Appends the protocol's error reply for `err` to `out`; the connection is closed
    /// after it.
    fn encode_error(&mut self, err: &ProtocolError, out: &mut Vec<u8>);

    /// Whether the protocol can tell the client that the connection ends after a response
    /// (HTTP's `Connection: close`). Default: `false`.
    ///
    /// The per-connection request limit (`--keepalive-requests`) applies only to codecs
    /// that can: to a client of a protocol that cannot, a close looks like a failure (a
    /// Redis client does not reconnect), so its connections last until the client leaves,
    /// a timeout, or a stop.
    fn announces_close(&self) -> bool {
        false
    }

    /// What a worker may publish about the request that begins with `head` while it is in
    /// progress: pushed into `summary` (empty when called), which the status page, its
    /// JSON, the `status` subcommand and the slow-request and request-timeout log lines
    /// show to whoever can read them. Default: nothing, so that a codec of your own
    /// publishes nothing about its requests unless it says what is safe to show.
    ///
    /// `head` is the request's first bytes as they arrived, at most
    /// [`Summary::CAPACITY`]: the request may be incomplete (it is called again when more
    /// of its first bytes arrive), may not be valid, and may hold secrets. Give only what
    /// names the kind of request (a method and a path, a command name), never its
    /// credentials, query, cookies or payload. The built-in codecs: [`Http`] gives the
    /// method and the path without the query (`GET /orders`), [`Resp`] the command name
    /// (`GET`, `AUTH`); [`Lines`], [`Netstring`] and [`LengthPrefixed`] give nothing.
    ///
    /// With `--status-request-detail`, the operator's choice, the worker publishes the
    /// first bytes themselves instead, as they arrived (docs/SECURITY.md).
    ///
    /// ```
    /// use appsrv::codec::Summary;
    ///
    /// // A protocol whose requests start with a one-byte opcode: its name is safe to show,
    /// // what follows it may not be. (`examples/ping.rs` has one in a whole codec.)
    /// fn summarize(head: &[u8], summary: &mut Summary) {
    ///     let name: &[u8] = match head.first() {
    ///         Some(1) => b"READ",
    ///         Some(2) => b"WRITE",
    ///         _ => return,
    ///     };
    ///     summary.push(name);
    /// }
    /// let mut s = Summary::new();
    /// summarize(&[2, 0xff, 0xff], &mut s);
    /// assert_eq!(s.as_bytes(), b"WRITE");
    /// ```
    fn summarize(&self, head: &[u8], summary: &mut Summary) {
        let _ = (head, summary);
    }
}

/// Finds `needle` in `haystack` (a short delimiter).
pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.len() == 1 {
        return haystack.iter().position(|b| *b == needle[0]);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers shared by the codecs' unit tests.
    use super::*;

    /// Decodes every complete request in `input`, and
    /// returns each request mapped through `f`, or the first error. The input is fed
    /// `chunk` bytes at a time, as reads would deliver it.
    pub(crate) fn decode_all<C: Codec, T>(
        codec: &mut C,
        input: &[u8],
        chunk: usize,
        mut f: impl FnMut(&C::Request<'_>) -> T,
    ) -> Result<Vec<T>, ProtocolError> {
        let mut buf: Vec<u8> = Vec::new();
        let mut out = Vec::new();
        let mut fed = 0;
        loop {
            loop {
                let len = match codec.decode(&mut buf)? {
                    Decoded::Request { request, len } => {
                        out.push(f(&request));
                        len
                    }
                    Decoded::Incomplete { .. } => break,
                };
                buf.drain(..len);
            }
            if fed == input.len() {
                return Ok(out);
            }
            let next = (fed + chunk.max(1)).min(input.len());
            buf.extend_from_slice(&input[fed..next]);
            fed = next;
        }
    }
}

//! RESP2, the Redis serialization protocol: what `redis-cli`, `redis-benchmark` and every
//! Redis client library speak.

use std::borrow::Cow;
use std::ops::Range;

use super::{Codec, Decoded, Outcome, ProtocolError, Respond, Summary, find as find_in};

/// The decimal digits of `u64::MAX`: room for any length or integer.
const MAX_DIGITS: usize = 20;

/// Writes `n` in decimal at the end of `buf`; returns the digits.
fn decimal(mut n: u64, buf: &mut [u8; MAX_DIGITS]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// Appends `<kind><n>\r\n` (an array or bulk string header).
fn push_header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    out.extend_from_slice(decimal(n as u64, &mut [0; MAX_DIGITS]));
    out.extend_from_slice(b"\r\n");
}

/// Appends `<kind><text>\r\n`, with any CR or LF of `text` replaced by a space (as Redis
/// does for error messages): a simple string or an error is one line.
fn push_line(out: &mut Vec<u8>, kind: u8, text: &[u8]) {
    out.push(kind);
    let at = out.len();
    out.extend_from_slice(text);
    for b in &mut out[at..] {
        if *b == b'\r' || *b == b'\n' {
            *b = b' ';
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// Whitespace for Redis's inline commands (C's `isspace`).
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// What ends an unquoted argument of an inline command.
fn ends_arg(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0)
}

/// What is skipped before an argument of an inline command.
fn skipped(b: u8) -> bool {
    is_space(b) || b == 0
}

/// A byte as a protocol error shows it: itself if printable, else `\xNN`.
fn show(b: u8) -> String {
    if b.is_ascii_graphic() || b == b' ' {
        char::from(b).to_string()
    } else {
        format!("\\x{b:02x}")
    }
}

/// Why a length could not be read.
enum BadLen {
    /// Not a decimal number followed by CRLF.
    Invalid,
    /// Above the limit.
    TooLarge,
}

/// Reads the decimal length at `buf[at..]`, up to and including its CRLF: no sign, no
/// leading zero, at most `max`. `Ok(None)` if its end has not arrived; else the length and
/// the offset after the CRLF. A length above `max` is refused as soon as its digits say so.
fn read_len(buf: &[u8], first: usize, max: usize) -> Result<Option<(usize, usize)>, BadLen> {
    let mut n: usize = 0;
    let mut at = first;
    loop {
        let Some(&b) = buf.get(at) else {
            return Ok(None);
        };
        match b {
            b'0'..=b'9' => {
                if at > first && buf[first] == b'0' {
                    return Err(BadLen::Invalid);
                }
                n = n
                    .checked_mul(10)
                    .and_then(|n| n.checked_add(usize::from(b - b'0')))
                    .ok_or(BadLen::TooLarge)?;
                if n > max {
                    return Err(BadLen::TooLarge);
                }
                at += 1;
            }
            b'\r' if at > first => {
                return match buf.get(at + 1) {
                    None => Ok(None),
                    Some(b'\n') => Ok(Some((n, at + 2))),
                    Some(_) => Err(BadLen::Invalid),
                };
            }
            _ => return Err(BadLen::Invalid),
        }
    }
}

/// The elements of a validated array: each `$<len>\r\n<data>\r\n`. Returns the first
/// element's data and the rest.
fn next_bulk(elements: &[u8]) -> (&[u8], &[u8]) {
    let mut at = 1;
    let mut len = 0;
    while elements[at] != b'\r' {
        len = len * 10 + usize::from(elements[at] - b'0');
        at += 1;
    }
    let data = at + 2;
    (&elements[data..data + len], &elements[data + len + 2..])
}

/// The first argument of an unquoted inline line, and the rest (`None` if none is left).
fn next_word(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let start = line.iter().position(|b| !skipped(*b))?;
    let line = &line[start..];
    let end = line.iter().position(|b| ends_arg(*b)).unwrap_or(line.len());
    Some((&line[..end], &line[end..]))
}

/// Splits an inline line with quotes as Redis's `sdssplitargs` does, unescaping each
/// argument in place (an argument never grows: quotes are dropped, an escape shrinks).
/// Returns each argument's range in `line`.
fn split_quoted(line: &mut [u8]) -> Result<Vec<Range<usize>>, ProtocolError> {
    let unbalanced = || ProtocolError::Malformed("unbalanced quotes in request".into());
    let n = line.len();
    let at = |line: &[u8], i: usize| line.get(i).copied();
    let mut args = Vec::new();
    let (mut r, mut w) = (0, 0);
    loop {
        while r < n && skipped(line[r]) {
            r += 1;
        }
        if r == n {
            return Ok(args);
        }
        let start = w;
        let (mut dq, mut sq) = (false, false);
        loop {
            let Some(c) = at(line, r) else {
                if dq || sq {
                    return Err(unbalanced());
                }
                break;
            };
            if dq {
                match (c, at(line, r + 1)) {
                    (b'\\', Some(b'x'))
                        if at(line, r + 2).is_some_and(|h| h.is_ascii_hexdigit())
                            && at(line, r + 3).is_some_and(|h| h.is_ascii_hexdigit()) =>
                    {
                        let hex = |h: u8| (h as char).to_digit(16).unwrap_or(0) as u8;
                        line[w] = hex(line[r + 2]) * 16 + hex(line[r + 3]);
                        w += 1;
                        r += 4;
                    }
                    (b'\\', Some(e)) => {
                        line[w] = match e {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        };
                        w += 1;
                        r += 2;
                    }
                    (b'"', next) => {
                        if next.is_some_and(|b| !is_space(b)) {
                            return Err(unbalanced());
                        }
                        r += 1;
                        break;
                    }
                    _ => {
                        line[w] = c;
                        w += 1;
                        r += 1;
                    }
                }
            } else if sq {
                match (c, at(line, r + 1)) {
                    (b'\\', Some(b'\'')) => {
                        line[w] = b'\'';
                        w += 1;
                        r += 2;
                    }
                    (b'\'', next) => {
                        if next.is_some_and(|b| !is_space(b)) {
                            return Err(unbalanced());
                        }
                        r += 1;
                        break;
                    }
                    _ => {
                        line[w] = c;
                        w += 1;
                        r += 1;
                    }
                }
            } else if ends_arg(c) {
                break;
            } else {
                match c {
                    b'"' => dq = true,
                    b'\'' => sq = true,
                    _ => {
                        line[w] = c;
                        w += 1;
                    }
                }
                r += 1;
            }
        }
        args.push(start..w);
    }
}

/// How far the decoding of an array that arrives in pieces got (kept in the codec between
/// reads, so that each read costs only what it brings).
#[derive(Debug, Clone, Copy)]
struct Progress {
    /// Where the array's `*` is.
    start: usize,
    /// Where its first element is.
    body: usize,
    /// How many elements it has.
    argc: usize,
    /// Where the next element (not yet complete) is.
    at: usize,
    /// How many elements are complete.
    done: usize,
}

/// What is at the front of the buffer.
enum Found {
    Incomplete,
    /// An empty request ending at this offset: skipped.
    Skip(usize),
    Array {
        elements: Range<usize>,
        argc: usize,
    },
    Inline {
        line: Range<usize>,
        argc: usize,
        end: usize,
    },
    Quoted {
        line: Range<usize>,
        args: Vec<Range<usize>>,
        end: usize,
    },
}

/// [RESP2](https://redis.io/docs/latest/develop/reference/protocol-spec/), the Redis
/// protocol: each request is a command, handed to the handler as a [`RespRequest`] that
/// borrows its arguments from the read buffer; the handler writes its reply (or several,
/// for a command that has several) with [`RespResponse`].
///
/// # Requests
///
/// Requests come in the two forms a Redis server accepts:
/// - **arrays of bulk strings** (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`), what client libraries
///   send: binary-safe, every line ending in CRLF;
/// - **inline commands** (`GET k\r\n`), for a human at `telnet` or `nc`: one line ending in
///   LF or CRLF, arguments separated by whitespace. Quoted arguments are understood as
///   Redis understands them (`sdssplitargs`): `"..."` with the escapes `\n`, `\r`, `\t`,
///   `\b`, `\a`, `\xHH` and `\<any>`, `'...'` with `\'`; a closing quote must be followed by
///   whitespace or the end of the line, and an unbalanced quote is a protocol error.
///
/// As in Redis, an empty request (a blank inline line, `*0\r\n`, `*-1\r\n`) gets no reply:
/// the codec skips it, and its bytes are taken with the next request.
///
/// Replies ([`RespResponse`]): simple strings, errors, integers, bulk strings (and the null
/// bulk string), arrays (nested, and the null array).
///
/// # Limits
///
/// Modelled on Redis's, but sized for a framework whose read buffer grows to the largest
/// request (Redis lets a client's query buffer grow to 1 GiB). Each has a builder method:
///
/// | limit | default | Redis | when exceeded |
/// |-------|---------|-------|---------------|
/// | [`max_bulk_len`](Resp::max_bulk_len): one argument | 1 MiB | `proto-max-bulk-len`, 512 MiB | `bulk string too large`, as soon as the `$` line says so |
/// | [`max_args`](Resp::max_args): arguments of one command | 1 048 576 | 1024 × 1024 (Redis 6; 7 allows `INT_MAX`) | `invalid multibulk length`, as soon as the `*` line says so |
/// | [`max_inline`](Resp::max_inline): an inline command, its line end included | 64 KiB | 64 KiB (`PROTO_INLINE_MAX_SIZE`) | `inline request too large`, before the line end arrives |
/// | [`max_request`](Resp::max_request): a whole command | 4 MiB | `client-query-buffer-limit`, 1 GiB | `request too large`, as soon as a `$` line says its data would end beyond it |
/// | [`max_depth`](Resp::max_depth): arrays nested in a reply the handler builds | 16 | none (hiredis before 1.0 read 7 levels) | the reply is replaced with an error and the connection closed (see [`RespResponse`]) |
///
/// # Protocol errors
///
/// Bad input is refused as soon as it is seen ([`ProtocolError::Malformed`] or
/// [`ProtocolError::TooLarge`]) and gets Redis's reply, `-ERR Protocol error: <why>`
/// (for example `-ERR Protocol error: invalid bulk length`, `-ERR Protocol error: expected
/// '$', got 'x'`, `-ERR Protocol error: unbalanced quotes in request`); the connection is
/// then closed. Other errors (a timeout, a refused client) are `-ERR <reason>`. Stricter
/// than Redis in one respect: the CRLF after a bulk string's data is checked (Redis skips
/// two bytes), so that a wrong length is an error, not a stream read out of step.
///
/// RESP cannot tell a client that the connection is about to close, so
/// [`announces_close`](Codec::announces_close) is false (a Redis client takes a close for
/// a failure).
///
/// ```
/// use appsrv::codec::{Codec, Decoded, Resp, Respond};
///
/// let mut codec = Resp::new().max_bulk_len(64 * 1024);
/// let mut buf = b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\nPING\r\n".to_vec();
/// let Ok(Decoded::Request { request, len }) = codec.decode(&mut buf) else { panic!() };
/// assert_eq!(len, 22);
/// assert_eq!(request.command(), b"GET");
/// assert_eq!(request.args().collect::<Vec<_>>(), [&b"GET"[..], b"key"]);
///
/// let mut out = Vec::new();
/// let mut res = codec.respond(&request, &mut out, false);
/// res.array(2);
/// res.bulk("value");
/// res.null();
/// assert!(!res.finish().close);
/// assert_eq!(out, b"*2\r\n$5\r\nvalue\r\n$-1\r\n");
/// ```
///
/// A handler:
///
/// ```no_run
/// use std::io;
/// use appsrv::Conn;
/// use appsrv::codec::{Resp, RespRequest, RespResponse};
///
/// struct Pong;
///
/// impl appsrv::RequestHandler for Pong {
///     type Codec = Resp;
///     type Session = ();
///
///     fn handle_request(
///         &mut self,
///         _conn: &mut Conn<'_>,
///         req: &RespRequest<'_>,
///         res: &mut RespResponse<'_>,
///     ) -> io::Result<()> {
///         if req.command().eq_ignore_ascii_case(b"PING") && req.len() == 1 {
///             res.simple("PONG");
///         } else {
///             res.error("ERR unknown command");
///         }
///         Ok(())
///     }
/// }
///
/// fn main() -> appsrv::Result<()> {
///     appsrv::Server::new("pong").listen("127.0.0.1:6379").run_requests(|| Ok(Pong))
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Resp {
    max_bulk: usize,
    max_args: usize,
    max_inline: usize,
    max_request: usize,
    max_depth: usize,
    /// The array being decoded, if it arrived in pieces.
    progress: Option<Progress>,
    /// The elements still to come in each array open in the reply being built, innermost
    /// last (kept between replies for its allocation).
    open: Vec<usize>,
}

impl Default for Resp {
    /// The default limits (see [`Resp`]).
    fn default() -> Self {
        Resp::new()
    }
}

impl Resp {
    /// The default maximum length of one bulk string in a request: 1 MiB.
    pub const DEFAULT_MAX_BULK_LEN: usize = 1024 * 1024;
    /// The default maximum number of arguments of a command: 1024 × 1024.
    pub const DEFAULT_MAX_ARGS: usize = 1024 * 1024;
    /// The default maximum length of an inline command, its line end included: 64 KiB.
    pub const DEFAULT_MAX_INLINE: usize = 64 * 1024;
    /// The default maximum length of a whole request: 4 MiB.
    pub const DEFAULT_MAX_REQUEST: usize = 4 * 1024 * 1024;
    /// The default maximum nesting of arrays in a reply: 16.
    pub const DEFAULT_MAX_DEPTH: usize = 16;

    /// A codec with the default limits.
    pub fn new() -> Self {
        Resp {
            max_bulk: Self::DEFAULT_MAX_BULK_LEN,
            max_args: Self::DEFAULT_MAX_ARGS,
            max_inline: Self::DEFAULT_MAX_INLINE,
            max_request: Self::DEFAULT_MAX_REQUEST,
            max_depth: Self::DEFAULT_MAX_DEPTH,
            progress: None,
            open: Vec::new(),
        }
    }

    /// Bulk strings (arguments) of requests up to `max` bytes (default 1 MiB; Redis's
    /// `proto-max-bulk-len`).
    pub fn max_bulk_len(mut self, max: usize) -> Self {
        self.max_bulk = max;
        self
    }

    /// Commands of up to `max` arguments (default 1024 × 1024).
    pub fn max_args(mut self, max: usize) -> Self {
        self.max_args = max;
        self
    }

    /// Inline commands up to `max` bytes, line end included (default 64 KiB).
    pub fn max_inline(mut self, max: usize) -> Self {
        self.max_inline = max;
        self
    }

    /// Requests up to `max` bytes in all (default 4 MiB): the most the read buffer holds.
    /// It also bounds the other limits: an inline command or a bulk string longer than
    /// this is refused whatever they say.
    pub fn max_request(mut self, max: usize) -> Self {
        self.max_request = max;
        self
    }

    /// Replies with arrays nested up to `max` deep (default 16; an array in an array is 2).
    pub fn max_depth(mut self, max: usize) -> Self {
        self.max_depth = max;
        self
    }

    fn request_too_large(&self) -> ProtocolError {
        ProtocolError::TooLarge {
            what: "request",
            limit: self.max_request,
        }
    }

    /// Finds the request at the front of `buf` (unescaping a quoted inline command in
    /// place).
    fn find(&mut self, buf: &mut [u8]) -> Result<Found, ProtocolError> {
        if let Some(p) = self.progress.take() {
            // The same array, with more bytes after it.
            if p.at <= buf.len() && buf.get(p.start) == Some(&b'*') {
                return self.elements(buf, p);
            }
        }
        let mut start = 0;
        loop {
            let found = match buf.get(start) {
                None => return Ok(Found::Incomplete),
                Some(b'*') => self.array(buf, start)?,
                Some(_) => self.inline(buf, start)?,
            };
            match found {
                Found::Skip(end) => start = end,
                found => return Ok(found),
            }
        }
    }

    /// The array at `start`: its header, then its elements.
    fn array(&mut self, buf: &[u8], start: usize) -> Result<Found, ProtocolError> {
        let invalid = || ProtocolError::Malformed("invalid multibulk length".into());
        if buf.get(start + 1) == Some(&b'-') {
            // The null array, which Redis takes for an empty request.
            let rest = &buf[start..];
            let null = b"*-1\r\n";
            return if rest.len() < null.len() && null.starts_with(rest) {
                Ok(Found::Incomplete)
            } else if rest.starts_with(null) {
                Ok(Found::Skip(start + null.len()))
            } else {
                Err(invalid())
            };
        }
        let (argc, body) = match read_len(buf, start + 1, self.max_args) {
            Ok(Some(head)) => head,
            Ok(None) => return Ok(Found::Incomplete),
            Err(_) => return Err(invalid()),
        };
        if body > self.max_request {
            return Err(self.request_too_large());
        }
        if argc == 0 {
            return Ok(Found::Skip(body));
        }
        let p = Progress {
            start,
            body,
            argc,
            at: body,
            done: 0,
        };
        self.elements(buf, p)
    }

    /// The elements of the array of `p`, from `p.at` on.
    fn elements(&mut self, buf: &[u8], mut p: Progress) -> Result<Found, ProtocolError> {
        while p.done < p.argc {
            let Some(&b) = buf.get(p.at) else {
                self.progress = Some(p);
                return Ok(Found::Incomplete);
            };
            if b != b'$' {
                return Err(ProtocolError::Malformed(
                    format!("expected '$', got '{}'", show(b)).into(),
                ));
            }
            let (len, data) = match read_len(buf, p.at + 1, self.max_bulk) {
                Ok(Some(head)) => head,
                Ok(None) => {
                    self.progress = Some(p);
                    return Ok(Found::Incomplete);
                }
                Err(BadLen::Invalid) => return Err(ProtocolError::Malformed("invalid bulk length".into())),
                Err(BadLen::TooLarge) => {
                    return Err(ProtocolError::TooLarge {
                        what: "bulk string",
                        limit: self.max_bulk,
                    });
                }
            };
            let end = match data.checked_add(len).and_then(|e| e.checked_add(2)) {
                Some(end) if end <= self.max_request => end,
                _ => return Err(self.request_too_large()),
            };
            if buf.len() < end {
                self.progress = Some(p);
                return Ok(Found::Incomplete);
            }
            if &buf[end - 2..end] != b"\r\n" {
                return Err(ProtocolError::Malformed(
                    "bulk string not followed by CRLF".into(),
                ));
            }
            p.at = end;
            p.done += 1;
        }
        Ok(Found::Array {
            elements: p.body..p.at,
            argc: p.argc,
        })
    }

    /// The inline command at `start`.
    fn inline(&self, buf: &mut [u8], start: usize) -> Result<Found, ProtocolError> {
        let too_large = ProtocolError::TooLarge {
            what: "inline request",
            limit: self.max_inline,
        };
        let rest = &buf[start..];
        // The line end is looked for within the limit only: bytes beyond it (pipelined
        // requests, or a flood with no line end) are not scanned again at each read.
        let window = &rest[..rest.len().min(self.max_inline)];
        let Some(nl) = window.iter().position(|b| *b == b'\n') else {
            if rest.len() >= self.max_inline {
                return Err(too_large);
            }
            if start + rest.len() >= self.max_request {
                return Err(self.request_too_large());
            }
            return Ok(Found::Incomplete);
        };
        if nl + 1 > self.max_inline {
            return Err(too_large);
        }
        let end = start + nl + 1;
        if end > self.max_request {
            return Err(self.request_too_large());
        }
        let line_end = if nl > 0 && rest[nl - 1] == b'\r' {
            start + nl - 1
        } else {
            start + nl
        };
        let line = start..line_end;
        if buf[line.clone()].iter().any(|b| *b == b'"' || *b == b'\'') {
            let args = split_quoted(&mut buf[line.clone()])?;
            return Ok(if args.is_empty() {
                Found::Skip(end)
            } else {
                Found::Quoted { line, args, end }
            });
        }
        let mut argc = 0;
        let mut words = &buf[line.clone()];
        while let Some((_, rest)) = next_word(words) {
            argc += 1;
            words = rest;
        }
        Ok(if argc == 0 {
            Found::Skip(end)
        } else {
            Found::Inline { line, argc, end }
        })
    }
}

/// A command: its arguments, the first of which is its name, borrowed from the read
/// buffer (nothing is copied or allocated, except for an inline command with quotes).
///
/// A decoded request always has at least one argument: empty requests get no reply, as in
/// Redis, and the codec skips them.
#[derive(Debug, Clone)]
pub struct RespRequest<'a> {
    argc: usize,
    repr: Repr<'a>,
}

#[derive(Debug, Clone)]
enum Repr<'a> {
    /// The elements of an array, validated: each `$<len>\r\n<data>\r\n`.
    Array(&'a [u8]),
    /// An inline command without quotes: words separated by whitespace.
    Inline(&'a [u8]),
    /// An inline command with quotes, unescaped in place: each argument's range in it.
    Quoted(&'a [u8], Vec<Range<usize>>),
}

impl<'a> RespRequest<'a> {
    /// The number of arguments, the command's name included.
    pub fn len(&self) -> usize {
        self.argc
    }

    /// Whether there are no arguments (never, for a decoded request).
    pub fn is_empty(&self) -> bool {
        self.argc == 0
    }

    /// The arguments in order, the command's name first.
    pub fn args(&self) -> RespArgs<'_, 'a> {
        let state = match &self.repr {
            Repr::Array(elements) => ArgsState::Array(elements),
            Repr::Inline(line) => ArgsState::Inline(line),
            Repr::Quoted(line, args) => ArgsState::Quoted(line, args.iter()),
        };
        RespArgs {
            state,
            left: self.argc,
        }
    }

    /// Argument `i` (0 is the command's name), if there is one.
    pub fn arg(&self, i: usize) -> Option<&'a [u8]> {
        self.args().nth(i)
    }

    /// The command's name as sent (compare it with `eq_ignore_ascii_case`: Redis's command
    /// names are case-insensitive).
    pub fn command(&self) -> &'a [u8] {
        self.arg(0).unwrap_or_default()
    }

    /// Whether it came as an inline command rather than an array.
    pub fn is_inline(&self) -> bool {
        !matches!(self.repr, Repr::Array(_))
    }
}

/// The arguments of a [`RespRequest`], from [`RespRequest::args`].
#[derive(Debug, Clone)]
pub struct RespArgs<'r, 'a> {
    state: ArgsState<'r, 'a>,
    left: usize,
}

#[derive(Debug, Clone)]
enum ArgsState<'r, 'a> {
    Array(&'a [u8]),
    Inline(&'a [u8]),
    Quoted(&'a [u8], std::slice::Iter<'r, Range<usize>>),
}

impl<'a> Iterator for RespArgs<'_, 'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        match &mut self.state {
            ArgsState::Array(rest) => {
                let (arg, after) = next_bulk(rest);
                *rest = after;
                Some(arg)
            }
            ArgsState::Inline(rest) => {
                let (arg, after) = next_word(rest)?;
                *rest = after;
                Some(arg)
            }
            ArgsState::Quoted(line, ranges) => ranges.next().map(|r| &line[r.clone()]),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for RespArgs<'_, '_> {}

/// The reply to one command, written into the output buffer as it is built.
///
/// Each method appends one RESP value: [`simple`](RespResponse::simple) (`+OK`),
/// [`error`](RespResponse::error) (`-ERR ...`), [`integer`](RespResponse::integer),
/// [`bulk`](RespResponse::bulk), [`null`](RespResponse::null) (the null bulk string,
/// `$-1`), [`array`](RespResponse::array) (a header; the next `len` values are its
/// elements, arrays included) and [`null_array`](RespResponse::null_array) (`*-1`).
/// A command's reply is usually one value; writing none sends nothing, writing several
/// sends several (as Redis does for `SUBSCRIBE a b`).
///
/// # A reply that is not well-formed
///
/// The response counts the elements still owed to each array it opened. If
/// [`finish`](Respond::finish) finds an array short of elements, or if arrays were nested
/// deeper than [`Resp::max_depth`], the reply built so far is discarded and replaced with
/// `-ERR incomplete reply (...)` or `-ERR reply too deeply nested (...)`, the handler's
/// mistake is logged and the connection is closed: a client would otherwise read the next
/// replies as the missing elements, and every later answer would be out of step.
#[derive(Debug)]
pub struct RespResponse<'a> {
    out: &'a mut Vec<u8>,
    /// Where the reply starts in `out`.
    start: usize,
    /// The elements owed to each open array, innermost last.
    open: &'a mut Vec<usize>,
    max_depth: usize,
    /// The deepest nesting reached.
    deepest: usize,
    close: bool,
}

impl RespResponse<'_> {
    /// One value written: it counts towards the innermost open array, which may complete
    /// it and so count towards the one around it.
    fn element(&mut self) {
        while let Some(owed) = self.open.last_mut() {
            *owed -= 1;
            if *owed > 0 {
                return;
            }
            self.open.pop();
        }
    }

    /// Closes the connection after this reply (`QUIT`).
    pub fn close(&mut self) {
        self.close = true;
    }

    /// A simple string, `+<text>\r\n` (`OK`, `PONG`). A CR or LF in `text` becomes a space.
    pub fn simple(&mut self, text: impl AsRef<[u8]>) {
        push_line(self.out, b'+', text.as_ref());
        self.element();
    }

    /// An error, `-<message>\r\n`. The message starts with its code, as Redis's do:
    /// `ERR unknown command`, `WRONGTYPE ...`. A CR or LF in it becomes a space.
    pub fn error(&mut self, message: impl AsRef<[u8]>) {
        push_line(self.out, b'-', message.as_ref());
        self.element();
    }

    /// An integer, `:<n>\r\n`.
    pub fn integer(&mut self, n: i64) {
        self.out.push(b':');
        if n < 0 {
            self.out.push(b'-');
        }
        self.out
            .extend_from_slice(decimal(n.unsigned_abs(), &mut [0; MAX_DIGITS]));
        self.out.extend_from_slice(b"\r\n");
        self.element();
    }

    /// A bulk string, `$<len>\r\n<bytes>\r\n`: any bytes.
    pub fn bulk(&mut self, bytes: impl AsRef<[u8]>) {
        let bytes = bytes.as_ref();
        push_header(self.out, b'$', bytes.len());
        self.out.extend_from_slice(bytes);
        self.out.extend_from_slice(b"\r\n");
        self.element();
    }

    /// The null bulk string, `$-1\r\n` (`GET` of a missing key).
    pub fn null(&mut self) {
        self.out.extend_from_slice(b"$-1\r\n");
        self.element();
    }

    /// The header of an array of `len` elements, `*<len>\r\n`: the next `len` values
    /// written are its elements (an empty array is complete at once).
    pub fn array(&mut self, len: usize) {
        push_header(self.out, b'*', len);
        if len == 0 {
            self.element();
        } else {
            self.open.push(len);
            self.deepest = self.deepest.max(self.open.len());
        }
    }

    /// The null array, `*-1\r\n`.
    pub fn null_array(&mut self) {
        self.out.extend_from_slice(b"*-1\r\n");
        self.element();
    }

    /// The number of arrays open (waiting for elements).
    pub fn depth(&self) -> usize {
        self.open.len()
    }

    /// Replaces the reply with an error saying why it was not sent.
    fn refuse(self, why: String) -> Outcome {
        tracing::error!(
            "the handler's reply is not well-formed ({why}); sending an error instead and closing the connection"
        );
        self.out.truncate(self.start);
        push_line(self.out, b'-', format!("ERR {why}").as_bytes());
        self.open.clear();
        Outcome {
            close: true,
            file: None,
        }
    }
}

impl Respond for RespResponse<'_> {
    fn finish(self) -> Outcome {
        if self.deepest > self.max_depth {
            let why = format!("reply too deeply nested (limit {} arrays)", self.max_depth);
            return self.refuse(why);
        }
        if let Some(owed) = self.open.last() {
            let why = format!(
                "incomplete reply (an array lacks {owed} element{})",
                if *owed == 1 { "" } else { "s" }
            );
            return self.refuse(why);
        }
        Outcome {
            close: self.close,
            file: None,
        }
    }
}

impl Codec for Resp {
    type Request<'a> = RespRequest<'a>;
    type Response<'a> = RespResponse<'a>;

    /// [`max_request`](Resp::max_request).
    fn max_request_size(&self) -> usize {
        self.max_request
    }

    fn decode<'a>(&mut self, buf: &'a mut [u8]) -> Result<Decoded<RespRequest<'a>>, ProtocolError> {
        let found = self.find(buf)?;
        let buf: &'a [u8] = buf;
        let (request, len) = match found {
            Found::Incomplete => return Ok(Decoded::incomplete()),
            Found::Skip(_) => unreachable!("find skips empty requests"),
            Found::Array { elements, argc } => {
                let len = elements.end;
                (
                    RespRequest {
                        argc,
                        repr: Repr::Array(&buf[elements]),
                    },
                    len,
                )
            }
            Found::Inline { line, argc, end } => (
                RespRequest {
                    argc,
                    repr: Repr::Inline(&buf[line]),
                },
                end,
            ),
            Found::Quoted { line, args, end } => (
                RespRequest {
                    argc: args.len(),
                    repr: Repr::Quoted(&buf[line], args),
                },
                end,
            ),
        };
        Ok(Decoded::Request { request, len })
    }

    fn respond<'a>(
        &'a mut self,
        _req: &RespRequest<'_>,
        out: &'a mut Vec<u8>,
        _last: bool,
    ) -> RespResponse<'a> {
        self.open.clear();
        RespResponse {
            start: out.len(),
            out,
            open: &mut self.open,
            max_depth: self.max_depth,
            deepest: 0,
            close: false,
        }
    }

    fn encode_error(&mut self, err: &ProtocolError, out: &mut Vec<u8>) {
        let text: Cow<'_, str> = match err {
            ProtocolError::Malformed(why) => format!("ERR Protocol error: {why}").into(),
            ProtocolError::TooLarge { .. }
            | ProtocolError::HeaderTooLarge { .. }
            | ProtocolError::Unsupported(_) => format!("ERR Protocol error: {err}").into(),
            ProtocolError::Timeout | ProtocolError::Refused(_) | ProtocolError::HandlerTimeout { .. } => {
                format!("ERR {err}").into()
            }
        };
        push_line(out, b'-', text.as_bytes());
    }

    /// The command name, in capitals (`AUTH`, `GET`), once it has arrived whole: an
    /// array's first bulk string, or an inline command's first (unquoted) word; never an
    /// argument (issue 41). Nothing for a name with a byte that is not printable ASCII.
    fn summarize(&self, head: &[u8], summary: &mut Summary) {
        if let Some(name) = command_name(head) {
            for b in name {
                summary.push(&[b.to_ascii_uppercase()]);
            }
        }
    }
}

/// The command name of the request that begins with `head` (which may stop anywhere), once
/// it arrived whole: an array's first bulk string, an inline command's first word (an
/// unquoted one). The blank lines before it are skipped, as decoding skips them. `None`
/// for anything else (a name not arrived whole, a quoted one, one with a byte that is not
/// printable ASCII): a client that does not speak RESP may have sent anything.
fn command_name(head: &[u8]) -> Option<&[u8]> {
    let start = head.iter().position(|b| !skipped(*b))?;
    let head = &head[start..];
    let name = if let Some(array) = head.strip_prefix(b"*") {
        let bulk = array.get(find_in(array, b"\r\n")? + 2..)?.strip_prefix(b"$")?;
        let digits = find_in(bulk, b"\r\n")?;
        let len: usize = std::str::from_utf8(&bulk[..digits]).ok()?.parse().ok()?;
        bulk.get(digits + 2..)?.get(..len)?
    } else {
        &head[..head.iter().position(|b| ends_arg(*b))?]
    };
    let printable = name.iter().all(u8::is_ascii_graphic) && !matches!(name.first(), Some(b'"' | b'\''));
    (!name.is_empty() && printable).then_some(name)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::testing::decode_all;
    use super::*;

    type Command = Vec<Vec<u8>>;

    fn commands(codec: &Resp, input: &[u8], chunk: usize) -> Result<Vec<Command>, ProtocolError> {
        decode_all(&mut codec.clone(), input, chunk, |r| {
            assert_eq!(r.args().len(), r.len());
            r.args().map(<[u8]>::to_vec).collect()
        })
    }

    fn cmds(input: &[u8]) -> Result<Vec<Command>, ProtocolError> {
        commands(&Resp::default(), input, input.len())
    }

    fn strs(args: &[&str]) -> Command {
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    /// A command as a client library sends it.
    fn array(args: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// An argument of an inline command, double-quoted with `\xHH` escapes.
    fn quoted(arg: &[u8]) -> Vec<u8> {
        let mut out = vec![b'"'];
        for &b in arg {
            if b.is_ascii_alphanumeric() || b == b' ' {
                out.push(b);
            } else {
                out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
            }
        }
        out.push(b'"');
        out
    }

    fn malformed(why: &str) -> ProtocolError {
        ProtocolError::Malformed(why.to_owned().into())
    }

    #[test]
    fn arrays_and_inline_commands_split_at_every_byte_boundary() {
        let input = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\n\r\nSET  a\t1\r\n*1\r\n$0\r\n\r\n*3\r\n$3\r\nSET\r\n$2\r\n\r\n\r\n$0\r\n\r\n";
        let expected = vec![
            strs(&["GET", "k"]),
            strs(&["PING"]),
            strs(&["SET", "a", "1"]),
            strs(&[""]),
            strs(&["SET", "\r\n", ""]),
        ];
        for chunk in 1..=input.len() {
            assert_eq!(
                commands(&Resp::default(), input, chunk).unwrap(),
                expected,
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn empty_requests_are_skipped_with_the_next_one() {
        let mut codec = Resp::default();
        for input in [
            &b"\r\n"[..],
            b"\n  \t\n",
            b"*0\r\n",
            b"*-1\r\n",
            b"*-1\r\n\r\n*0\r\nPI",
        ] {
            assert!(
                matches!(codec.decode(&mut input.to_vec()), Ok(Decoded::Incomplete { .. })),
                "{input:?}"
            );
        }
        let mut buf = b"\r\n*0\r\n*-1\r\nPING\r\nX".to_vec();
        match codec.decode(&mut buf) {
            Ok(Decoded::Request { request, len }) => {
                assert_eq!((request.command(), request.len(), len), (&b"PING"[..], 1, 17));
                assert!(request.is_inline());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_borrow_their_arguments() {
        let mut codec = Resp::default();
        let mut buf = b"*3\r\n$3\r\nDEL\r\n$1\r\na\r\n$2\r\nbc\r\n".to_vec();
        let whole = buf.len();
        let Ok(Decoded::Request { request, len }) = codec.decode(&mut buf) else {
            panic!()
        };
        assert_eq!(len, whole);
        assert!(!request.is_inline() && !request.is_empty());
        assert_eq!(request.len(), 3);
        assert_eq!(request.command(), b"DEL");
        assert_eq!(request.arg(2), Some(&b"bc"[..]));
        assert_eq!(request.arg(3), None);
        let mut args = request.args();
        args.next();
        assert_eq!(args.len(), 2);
        assert_eq!(args.collect::<Vec<_>>(), [&b"a"[..], b"bc"]);
    }

    #[test]
    fn inline_quotes_are_unescaped_as_redis_does() {
        assert_eq!(
            cmds(b"SET \"a b\" 'c d'\r\n").unwrap(),
            vec![strs(&["SET", "a b", "c d"])]
        );
        assert_eq!(
            cmds(b"SET k \"\\x41\\n\\r\\t\\b\\a\\\\\\\"\\q\"\n").unwrap(),
            vec![vec![
                b"SET".to_vec(),
                b"k".to_vec(),
                b"A\n\r\t\x08\x07\\\"q".to_vec()
            ]]
        );
        assert_eq!(
            cmds(b"ECHO 'it\\'s' \"\" ''\n").unwrap(),
            vec![strs(&["ECHO", "it's", "", ""])]
        );
        // A quote may open inside a word; \x with no two hex digits is an x.
        assert_eq!(
            cmds(b"a\"b c\"d\n").unwrap_err(),
            malformed("unbalanced quotes in request")
        );
        assert_eq!(cmds(b"a\"b c\" d\n").unwrap(), vec![strs(&["ab c", "d"])]);
        assert_eq!(cmds(b"\"\\xg1\"\n").unwrap(), vec![strs(&["xg1"])]);
        for bad in [
            &b"SET \"a\n"[..],
            b"SET 'a\n",
            b"SET \"a\"b\n",
            b"SET 'a'b\n",
            b"\"\\\"\n",
        ] {
            assert_eq!(
                cmds(bad).unwrap_err(),
                malformed("unbalanced quotes in request"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn malformed_arrays_are_refused_as_soon_as_seen() {
        let cases: [(&[u8], &str); 14] = [
            (b"*x", "invalid multibulk length"),
            (b"*\r\n", "invalid multibulk length"),
            (b"*01\r\n", "invalid multibulk length"),
            (b"*-2\r\n", "invalid multibulk length"),
            (b"*+1\r\n", "invalid multibulk length"),
            (b"*1\rx", "invalid multibulk length"),
            (b"*1\r\n%4\r\n", "expected '$', got '%'"),
            (b"*1\r\n\x01", "expected '$', got '\\x01'"),
            (b"*1\r\n$abc\r\n", "invalid bulk length"),
            (b"*1\r\n$-1\r\n", "invalid bulk length"),
            (b"*1\r\n$\r\n", "invalid bulk length"),
            (b"*1\r\n$01\r\nx\r\n", "invalid bulk length"),
            (b"*1\r\n$1\r\nxy\r\n", "bulk string not followed by CRLF"),
            (b"*2\r\n$1\r\nx\r\nPING\r\n", "expected '$', got 'P'"),
        ];
        for (input, why) in cases {
            for chunk in [1, input.len()] {
                assert_eq!(
                    commands(&Resp::default(), input, chunk).unwrap_err(),
                    malformed(why),
                    "{input:?}"
                );
            }
        }
    }

    #[test]
    fn limits_are_enforced_as_soon_as_a_length_says_so() {
        let codec = Resp::new()
            .max_bulk_len(4)
            .max_args(3)
            .max_inline(16)
            .max_request(64)
            .max_depth(2);
        assert_eq!(codec.max_request_size(), 64);
        let ok = [
            &b"*3\r\n$4\r\nabcd\r\n$0\r\n\r\n$1\r\nx\r\n"[..],
            b"0123456789abcd\r\n",
        ];
        for input in ok {
            assert!(commands(&codec, input, 1).is_ok(), "{input:?}");
        }
        let bulk = ProtocolError::TooLarge {
            what: "bulk string",
            limit: 4,
        };
        assert_eq!(commands(&codec, b"*1\r\n$5", 1).unwrap_err(), bulk);
        assert_eq!(
            commands(&codec, b"*1\r\n$99999999999999999999999", 1).unwrap_err(),
            bulk
        );
        assert_eq!(
            commands(&codec, b"*4\r\n", 1).unwrap_err(),
            malformed("invalid multibulk length")
        );
        assert_eq!(
            commands(&codec, b"*1000000000000000000000000", 1).unwrap_err(),
            malformed("invalid multibulk length")
        );
        let inline = ProtocolError::TooLarge {
            what: "inline request",
            limit: 16,
        };
        assert_eq!(
            commands(&codec, &[b'x'; 16], 1).unwrap_err(),
            inline,
            "before the LF"
        );
        assert_eq!(commands(&codec, b"0123456789abcde\r\n", 100).unwrap_err(), inline);
        let request = ProtocolError::TooLarge {
            what: "request",
            limit: 64,
        };
        let big = Resp::new().max_request(20);
        assert_eq!(
            commands(&big, b"*2\r\n$3\r\nGET\r\n$4\r\n", 1).unwrap_err(),
            request_of(20)
        );
        assert!(
            commands(&big, b"*2\r\n$3\r\nGET\r\n$1\r\nx\r\n", 1).is_ok(),
            "20 bytes fit"
        );
        assert_eq!(commands(&big, &[b'x'; 20], 1).unwrap_err(), request_of(20));
        assert_eq!(request.to_string(), "request too large (limit 64 bytes)");

        let d = Resp::default();
        assert_eq!(
            (d.max_bulk, d.max_args, d.max_inline, d.max_request, d.max_depth),
            (1 << 20, 1 << 20, 64 << 10, 4 << 20, 16)
        );
        assert_eq!(d.max_request_size(), 4 << 20);
        // The 64 KiB inline limit, as Redis's.
        let mut line = vec![b'x'; 64 * 1024 - 2];
        line.extend_from_slice(b"\r\n");
        assert_eq!(cmds(&line).unwrap().len(), 1);
        line.insert(0, b'y');
        assert_eq!(
            cmds(&line).unwrap_err(),
            ProtocolError::TooLarge {
                what: "inline request",
                limit: 64 * 1024
            }
        );
    }

    fn request_of(limit: usize) -> ProtocolError {
        ProtocolError::TooLarge {
            what: "request",
            limit,
        }
    }

    #[test]
    fn a_request_split_anywhere_resumes_where_it_stopped() {
        // The codec remembers the elements it has checked; a different buffer (shorter than
        // where it got) is decoded afresh.
        let mut codec = Resp::default();
        let whole = array(&[b"SET".to_vec(), b"k".to_vec(), vec![b'v'; 1000]]);
        let mut buf = whole[..20].to_vec();
        assert!(matches!(codec.decode(&mut buf), Ok(Decoded::Incomplete { .. })));
        assert!(codec.progress.is_some());
        let mut other = b"PING\r\n".to_vec();
        match codec.decode(&mut other) {
            Ok(Decoded::Request { request, .. }) => assert_eq!(request.command(), b"PING"),
            other => panic!("{other:?}"),
        }
        let mut buf = whole.clone();
        match codec.decode(&mut buf) {
            Ok(Decoded::Request { request, len }) => {
                assert_eq!(len, whole.len());
                assert_eq!(request.arg(2).map(<[u8]>::len), Some(1000));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_are_redis_protocol_errors() {
        let mut codec = Resp::default();
        let reply = |codec: &mut Resp, e: ProtocolError| {
            let mut out = Vec::new();
            codec.encode_error(&e, &mut out);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            reply(&mut codec, malformed("invalid bulk length")),
            "-ERR Protocol error: invalid bulk length\r\n"
        );
        assert_eq!(
            reply(&mut codec, malformed("expected '$', got '\r'")),
            "-ERR Protocol error: expected '$', got ' '\r\n"
        );
        assert_eq!(
            reply(&mut codec, request_of(8)),
            "-ERR Protocol error: request too large (limit 8 bytes)\r\n"
        );
        assert_eq!(
            reply(&mut codec, ProtocolError::Timeout),
            "-ERR timed out waiting for the rest of the request\r\n"
        );
    }

    #[test]
    fn replies_are_encoded_in_resp2() {
        let mut codec = Resp::default();
        let mut buf = b"PING\r\n".to_vec();
        let Ok(Decoded::Request { request, .. }) = codec.decode(&mut buf) else {
            panic!()
        };
        let mut out = b"earlier".to_vec();
        let mut res = codec.respond(&request, &mut out, false);
        res.simple("OK");
        res.error("ERR bad\r\nthing");
        res.integer(0);
        res.integer(-42);
        res.integer(i64::MIN);
        res.bulk(b"a\r\nb");
        res.bulk("");
        res.null();
        res.array(3);
        assert_eq!(res.depth(), 1);
        res.integer(1);
        res.array(0);
        res.array(1);
        assert_eq!(res.depth(), 2);
        res.null_array();
        assert_eq!(res.depth(), 0);
        res.close();
        assert!(res.finish().close);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "earlier+OK\r\n-ERR bad  thing\r\n:0\r\n:-42\r\n:-9223372036854775808\r\n$4\r\na\r\nb\r\n\
             $0\r\n\r\n$-1\r\n*3\r\n:1\r\n*0\r\n*1\r\n*-1\r\n"
        );
    }

    #[test]
    fn a_reply_short_of_elements_or_too_deep_becomes_an_error_and_closes() {
        let mut codec = Resp::new().max_depth(2);
        let mut buf = b"PING\r\n".to_vec();
        let Ok(Decoded::Request { request, .. }) = codec.decode(&mut buf) else {
            panic!()
        };
        let mut out = b"+PONG\r\n".to_vec();
        let mut res = codec.respond(&request, &mut out, false);
        res.array(2);
        res.array(3);
        res.bulk("x");
        assert!(res.finish().close);
        assert_eq!(
            out,
            b"+PONG\r\n-ERR incomplete reply (an array lacks 2 elements)\r\n"
        );

        let mut out = Vec::new();
        let mut res = codec.respond(&request, &mut out, false);
        res.array(1);
        res.array(1);
        res.array(1);
        res.integer(1);
        assert_eq!(res.depth(), 0);
        assert!(res.finish().close);
        assert_eq!(out, b"-ERR reply too deeply nested (limit 2 arrays)\r\n");

        // The next reply starts afresh.
        let mut out = Vec::new();
        let mut res = codec.respond(&request, &mut out, false);
        res.array(1);
        res.array(1);
        res.integer(7);
        assert!(!res.finish().close);
        assert_eq!(out, b"*1\r\n*1\r\n:7\r\n");
    }

    /// A RESP value, for the round trips of replies.
    #[derive(Debug, Clone, PartialEq)]
    enum Value {
        Simple(String),
        Error(String),
        Integer(i64),
        Bulk(Vec<u8>),
        Null,
        Array(Vec<Value>),
        NullArray,
    }

    fn value() -> impl Strategy<Value = Value> {
        let text = "[ -~]{0,20}";
        let leaf = prop_oneof![
            text.prop_map(Value::Simple),
            text.prop_map(Value::Error),
            any::<i64>().prop_map(Value::Integer),
            prop::collection::vec(any::<u8>(), 0..40).prop_map(Value::Bulk),
            Just(Value::Null),
            Just(Value::NullArray),
        ];
        leaf.prop_recursive(4, 40, 6, |inner| {
            prop::collection::vec(inner, 0..6).prop_map(Value::Array)
        })
    }

    fn write(res: &mut RespResponse<'_>, v: &Value) {
        match v {
            Value::Simple(s) => res.simple(s),
            Value::Error(s) => res.error(s),
            Value::Integer(n) => res.integer(*n),
            Value::Bulk(b) => res.bulk(b),
            Value::Null => res.null(),
            Value::NullArray => res.null_array(),
            Value::Array(items) => {
                res.array(items.len());
                for item in items {
                    write(res, item);
                }
            }
        }
    }

    /// Reads one reply at the front of `wire` (a client's parser, for the tests).
    fn read(wire: &mut &[u8]) -> Value {
        let nl = wire.windows(2).position(|w| w == b"\r\n").unwrap();
        let (kind, line) = (wire[0], std::str::from_utf8(&wire[1..nl]).unwrap().to_owned());
        *wire = &wire[nl + 2..];
        match kind {
            b'+' => Value::Simple(line),
            b'-' => Value::Error(line),
            b':' => Value::Integer(line.parse().unwrap()),
            b'$' if line == "-1" => Value::Null,
            b'$' => {
                let len: usize = line.parse().unwrap();
                let data = wire[..len].to_vec();
                assert_eq!(&wire[len..len + 2], b"\r\n");
                *wire = &wire[len + 2..];
                Value::Bulk(data)
            }
            b'*' if line == "-1" => Value::NullArray,
            b'*' => Value::Array((0..line.parse().unwrap()).map(|_| read(wire)).collect()),
            other => panic!("not a reply: {other}"),
        }
    }

    fn depth(v: &Value) -> usize {
        match v {
            Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    proptest! {
        #[test]
        fn arrays_decode_to_what_was_sent(
            cmds in prop::collection::vec(
                prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6), 0..6),
            chunk in 1usize..64,
        ) {
            let wire: Vec<u8> = cmds.iter().flat_map(|c| array(c)).collect();
            prop_assert_eq!(commands(&Resp::default(), &wire, chunk)?, cmds);
        }

        #[test]
        fn inline_commands_decode_to_what_was_sent(
            cmds in prop::collection::vec(
                prop::collection::vec(prop::collection::vec(any::<u8>(), 0..12), 1..5), 0..5),
            plain in prop::collection::vec(prop::collection::vec("[a-zA-Z0-9:_]{1,8}", 1..5), 0..5),
            chunk in 1usize..32,
        ) {
            let mut wire = Vec::new();
            let mut expected = Vec::new();
            for (c, p) in cmds.iter().zip(&plain) {
                for a in c {
                    wire.extend_from_slice(&quoted(a));
                    wire.push(b' ');
                }
                wire.extend_from_slice(b"\r\n");
                expected.push(c.clone());
                wire.extend_from_slice(p.join("  ").as_bytes());
                wire.push(b'\n');
                expected.push(p.iter().map(|w| w.as_bytes().to_vec()).collect());
            }
            prop_assert_eq!(commands(&Resp::default(), &wire, chunk)?, expected);
        }

        #[test]
        fn replies_read_back_as_written(values in prop::collection::vec(value(), 0..4)) {
            let mut codec = Resp::new().max_depth(8);
            let mut buf = b"PING\r\n".to_vec();
            let Ok(Decoded::Request { request, .. }) = codec.decode(&mut buf) else { panic!() };
            let mut out = Vec::new();
            let mut res = codec.respond(&request, &mut out, false);
            for v in &values {
                write(&mut res, v);
            }
            prop_assert_eq!(res.depth(), 0);
            prop_assert!(!res.finish().close);
            prop_assert!(values.iter().all(|v| depth(v) <= 5));
            let mut wire = &out[..];
            let read_back: Vec<Value> = values.iter().map(|_| read(&mut wire)).collect();
            prop_assert!(wire.is_empty());
            prop_assert_eq!(read_back, values);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_split_as_whole(
            input in prop::collection::vec(any::<u8>(), 0..300),
            chunk in 1usize..16,
            small in any::<bool>(),
        ) {
            let codec = if small {
                Resp::new().max_bulk_len(8).max_args(4).max_inline(24).max_request(64)
            } else {
                Resp::default()
            };
            let whole = commands(&codec, &input, input.len().max(1));
            let split = commands(&codec, &input, chunk);
            prop_assert_eq!(&whole, &split);
        }

        #[test]
        fn resp_like_bytes_never_panic_and_split_as_whole(
            input in prop::collection::vec(
                prop::sample::select(b"*$-0123\r\n\r\nab \"'\\x".to_vec()), 0..300),
            chunk in 1usize..16,
        ) {
            let codec = Resp::new().max_bulk_len(20).max_args(5).max_inline(40).max_request(100);
            let whole = commands(&codec, &input, input.len().max(1));
            let split = commands(&codec, &input, chunk);
            prop_assert_eq!(&whole, &split);
            if let Ok(cmds) = whole {
                prop_assert!(cmds.iter().all(|c| !c.is_empty() && c.len() <= 40));
            }
        }
    }

    /// What `summarize` gives for `head`.
    fn summary(head: &[u8]) -> Vec<u8> {
        let mut s = Summary::new();
        Resp::new().summarize(head, &mut s);
        s.as_bytes().to_vec()
    }

    /// Issue 41: the command name, never an argument, however the request came.
    #[test]
    fn issue_41_the_summary_is_the_command_name() {
        let array = b"*3\r\n$4\r\nauth\r\n$7\r\ndefault\r\n$10\r\nSECRETRESP\r\n";
        for cut in 0..=array.len() {
            let expected: &[u8] = if cut < 12 { b"" } else { b"AUTH" };
            assert_eq!(summary(&array[..cut]), expected, "cut at {cut}");
        }
        let inline = b"auth default SECRETINLINE\r\n";
        for cut in 0..=inline.len() {
            let expected: &[u8] = if cut < 5 { b"" } else { b"AUTH" };
            assert_eq!(summary(&inline[..cut]), expected, "cut at {cut}");
        }
        assert_eq!(summary(b"\r\n\r\nPING\r\n"), b"PING", "blank lines skipped");
        assert_eq!(summary(b"*1\r\n$8\r\nJSON.GET\r\n"), b"JSON.GET");
        for head in [
            &b"\"auth\" SECRETINLINE\r\n"[..],
            b"*2\r\n$3\r\nA\x00B\r\n",
            b"*0\r\n",
            b"*1\r\n$x\r\n",
        ] {
            assert_eq!(summary(head), b"", "{:?}", head.escape_ascii().to_string());
        }
    }
}

//! [`HttpRequest`], the handler's view of a decoded request, and the summary of a request
//! line that the status publishes (`Codec::summarize`).

use std::fmt;

use super::MAX_HEADERS;
use super::decode::HeaderSpan;
use crate::codec::Summary;

/// A request's method and path, from its first bytes `head` (which may stop anywhere):
/// the method once the space after it arrived, then the path as far as it came, up to
/// its `?` or `#`. The empty lines a client may send before the request line are skipped.
/// An absolute target (`http://host/path`, sent to proxies) gives its path only (its
/// authority may hold a user and a password), `*` stays; any other target (`CONNECT`'s
/// `host:port`, bytes that are not HTTP) gives nothing at all: what a client that does not
/// speak HTTP sent may be anything.
pub(super) fn summarize_request_line(head: &[u8], summary: &mut Summary) {
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
    pub(super) buf: &'a [u8],
    pub(super) method: &'a str,
    pub(super) target: &'a str,
    pub(super) version: u8,
    pub(super) headers: [HeaderSpan; MAX_HEADERS],
    pub(super) count: usize,
    pub(super) body: &'a [u8],
    pub(super) content_length: Option<u64>,
    pub(super) chunked: bool,
    pub(super) keep_alive: bool,
    pub(super) expect_continue: bool,
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

#[cfg(test)]
mod tests {
    use super::super::Http;
    use super::*;
    use crate::codec::Codec;

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

//! `--metrics-listen`: a minimal HTTP/1.1 server in the master, one request per
//! connection (`Connection: close`), with the same non-blocking deadlines and bounds as
//! the control socket. It serves `GET` and `HEAD` of:
//!
//! - `/metrics`: the Prometheus text exposition format 0.0.4, or OpenMetrics 1.0 when the
//!   `Accept` header prefers it ([`negotiate`]);
//! - `/healthz`: 200 `ok` whenever the master answers (its loop turns);
//! - `/readyz`: 200 `ready` while the server takes traffic, 503 with the reason otherwise
//!   ([`Status::readiness`]);
//! - `/status`: the status page, HTML that refreshes itself every `?refresh=N` seconds
//!   (default [`DEFAULT_REFRESH`](super::page::DEFAULT_REFRESH), 0 for never;
//!   `page.rs`); `/status?json`: the `status --json` document ([`render_json`]).

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::time::Instant;

use nix::poll::PollFd;
use socket2::{Domain, Protocol, Socket, Type};

use super::conn::{Acceptor, Decision};
use super::page::{self, DEFAULT_REFRESH, MAX_REFRESH};
use super::render::{MetricsFormat, render_json};
use crate::control::status::Status;
use crate::error::Error;

/// The largest request head accepted (request line and headers).
pub(crate) const MAX_HEAD: usize = 4096;

const BACKLOG: i32 = 64;

/// An HTTP response that closes the connection.
fn response(status: &str, extra_headers: &str, content_type: &str, body: &[u8], head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra_headers}\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

fn plain(status: &str, extra_headers: &str, text: &str) -> Vec<u8> {
    response(
        status,
        extra_headers,
        "text/plain; charset=utf-8",
        text.as_bytes(),
        false,
    )
}

/// What the metrics listener makes of the bytes received so far.
fn decide_http(input: &[u8], eof: bool, status: &mut dyn FnMut() -> Status) -> Decision {
    let head = &input[..input.len().min(MAX_HEAD)];
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) if input.len() >= MAX_HEAD => {
            return Decision::Reply(plain(
                "431 Request Header Fields Too Large",
                "",
                &format!("request head over {MAX_HEAD} bytes\n"),
            ));
        }
        Ok(httparse::Status::Partial) if eof && !input.is_empty() => {
            return Decision::Reply(plain("400 Bad Request", "", "incomplete request\n"));
        }
        Ok(httparse::Status::Partial) if eof => return Decision::Close,
        Ok(httparse::Status::Partial) => return Decision::Wait,
        Err(httparse::Error::TooManyHeaders) => {
            return Decision::Reply(plain(
                "431 Request Header Fields Too Large",
                "",
                "too many headers\n",
            ));
        }
        Err(e) => return Decision::Reply(plain("400 Bad Request", "", &format!("{e}\n"))),
    }
    let method = req.method.unwrap_or("");
    let target = req.path.unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if !["/metrics", "/healthz", "/readyz", "/status"].contains(&path) {
        return Decision::Reply(plain(
            "404 Not Found",
            "",
            "not found: metrics are at /metrics, health at /healthz and /readyz, \
             the status page at /status (as JSON: /status?json)\n",
        ));
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => {
            return Decision::Reply(plain(
                "405 Method Not Allowed",
                "Allow: GET, HEAD\r\n",
                "method not allowed: use GET\n",
            ));
        }
    };
    let text = |status: &str, body: &str| {
        response(
            status,
            "",
            "text/plain; charset=utf-8",
            body.as_bytes(),
            head_only,
        )
    };
    match path {
        // The master answering is the health: no snapshot needed.
        "/healthz" => Decision::Reply(text("200 OK", "ok\n")),
        "/readyz" => Decision::Reply(match status().readiness() {
            Ok(()) => text("200 OK", "ready\n"),
            Err(why) => text("503 Service Unavailable", &format!("not ready: {why}\n")),
        }),
        "/status" => status_page(query, status, head_only),
        _ => {
            let accept: Vec<&[u8]> = req
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("accept"))
                .map(|h| h.value)
                .collect();
            let Some(format) = negotiate(&accept) else {
                return Decision::Reply(response(
                    "406 Not Acceptable",
                    "Vary: Accept\r\n",
                    "text/plain; charset=utf-8",
                    format!(
                        "not acceptable: metrics are offered as {} and {}\n",
                        MetricsFormat::Prometheus.content_type(),
                        MetricsFormat::OpenMetrics.content_type()
                    )
                    .as_bytes(),
                    head_only,
                ));
            };
            let body = format.render(&status());
            Decision::Reply(response(
                "200 OK",
                "Vary: Accept\r\n",
                format.content_type(),
                body.as_bytes(),
                head_only,
            ))
        }
    }
}

/// Headers of the status page and its JSON: nothing but the page's inline style may load
/// or run, no other site may frame it, and no browser may guess another type.
const PAGE_HEADERS: &str = "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'; \
     frame-ancestors 'none'; base-uri 'none'; form-action 'none'\r\n\
     X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n";

/// `/status`: the page, or with `json` in the query the `status --json` document. The
/// query's `refresh=N` sets the page's refresh period (0 to [`MAX_REFRESH`] seconds; 0:
/// none); another key is ignored, a bad `refresh` is a 400.
fn status_page(query: &str, status: &mut dyn FnMut() -> Status, head_only: bool) -> Decision {
    let mut json = false;
    let mut refresh = DEFAULT_REFRESH;
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        match key {
            "json" => json = true,
            "refresh" => match value.parse::<u32>() {
                Ok(n) if n <= MAX_REFRESH => refresh = n,
                _ => {
                    return Decision::Reply(response(
                        "400 Bad Request",
                        "",
                        "text/plain; charset=utf-8",
                        format!(
                            "bad refresh: expected /status?refresh=N, N seconds from 0 (no refresh) to {MAX_REFRESH}\n"
                        )
                        .as_bytes(),
                        head_only,
                    ));
                }
            },
            _ => {}
        }
    }
    let (content_type, body) = if json {
        ("application/json", render_json(&status()))
    } else {
        ("text/html; charset=utf-8", page::render_html(&status(), refresh))
    };
    Decision::Reply(response(
        "200 OK",
        PAGE_HEADERS,
        content_type,
        body.as_bytes(),
        head_only,
    ))
}

/// The formats `/metrics` offers, the default first: (type, subtype, version).
const OFFERS: [(MetricsFormat, &str, &str, &str); 2] = [
    (MetricsFormat::Prometheus, "text", "plain", "0.0.4"),
    (
        MetricsFormat::OpenMetrics,
        "application",
        "openmetrics-text",
        "1.0.0",
    ),
];

/// One media range of an `Accept` header.
#[derive(Debug)]
struct Range<'a> {
    kind: &'a str,
    subtype: &'a str,
    version: Option<&'a str>,
    /// The q-value in thousandths (0 to 1000).
    q: u16,
}

/// A q-value (`0`, `0.5`, `1.000`: at most three decimals, from 0 to 1) in thousandths.
fn parse_q(v: &str) -> Option<u16> {
    let (whole, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac: u16 = format!("{frac:0<3}").parse().ok()?;
    match whole {
        "0" => Some(frac),
        "1" if frac == 0 => Some(1000),
        _ => None,
    }
}

/// Reads one media range (`type/subtype;param=value;q=0.5`); `None` for a malformed one.
fn parse_range(text: &str) -> Option<Range<'_>> {
    let mut parts = text.split(';').map(str::trim);
    let (kind, subtype) = parts.next()?.split_once('/')?;
    let (kind, subtype) = (kind.trim(), subtype.trim());
    if kind.is_empty() || subtype.is_empty() || (kind == "*" && subtype != "*") {
        return None;
    }
    let mut range = Range {
        kind,
        subtype,
        version: None,
        q: 1000,
    };
    for param in parts.filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=')?;
        let value = value.trim().trim_matches('"');
        match key.trim() {
            k if k.eq_ignore_ascii_case("q") => range.q = parse_q(value)?,
            k if k.eq_ignore_ascii_case("version") => range.version = Some(value),
            // Other parameters (charset, escaping) do not change what we send.
            _ => {}
        }
    }
    Some(range)
}

/// The format `/metrics` answers for these `Accept` header values (RFC 9110 §12.5.1):
/// each format takes the q-value of the most specific range that matches it (a range
/// with a `version` matches only that version: `text/plain;version=0.0.4` or
/// `application/openmetrics-text;version=1.0.0`, or no version; then `type/*`, then
/// `*/*`), and the format with the highest q-value wins; on a tie, the one matched by the
/// more specific range, then by the range listed first, then the default, 0.0.4. No
/// header, or one without a well-formed range, is 0.0.4. `None` when every format has q
/// 0 (a 406).
///
/// Prometheus asks, for example, `application/openmetrics-text;version=1.0.0;q=0.5,
/// text/plain;version=0.0.4;q=0.4,*/*;q=0.1`: OpenMetrics. `curl` sends `*/*`: 0.0.4.
pub(crate) fn negotiate(accept: &[&[u8]]) -> Option<MetricsFormat> {
    // A header that is not text is no preference (RFC 9110 lets a server disregard
    // Accept), as is a malformed range.
    let ranges: Vec<Range<'_>> = accept
        .iter()
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .filter_map(parse_range)
        .collect();
    if ranges.is_empty() {
        return Some(MetricsFormat::Prometheus);
    }
    // For each format: (q, specificity, the matching range's position from the end).
    let mut best: Option<(MetricsFormat, (u16, u8, usize))> = None;
    for (format, kind, subtype, version) in OFFERS {
        let matching = ranges
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let same_type = r.kind.eq_ignore_ascii_case(kind);
                let specificity = if same_type && r.subtype.eq_ignore_ascii_case(subtype) {
                    match r.version {
                        Some(v) if v == version => 3,
                        Some(_) => return None,
                        None => 2,
                    }
                } else if same_type && r.subtype == "*" {
                    1
                } else if r.kind == "*" {
                    0
                } else {
                    return None;
                };
                Some((r.q, specificity, ranges.len() - i))
            })
            // The most specific range decides; among equals, the first listed.
            .max_by_key(|&(_, specificity, from_end)| (specificity, from_end));
        if let Some(rank) = matching.filter(|(q, _, _)| *q > 0) {
            if best.is_none_or(|(_, b)| rank > b) {
                best = Some((format, rank));
            }
        }
    }
    best.map(|(format, _)| format)
}

/// The optional HTTP listener serving `/metrics` (`--metrics-listen`), owned by the master.
#[derive(Debug)]
pub(crate) struct MetricsListener {
    acceptor: Acceptor,
    local: SocketAddr,
}

impl MetricsListener {
    /// Binds `addr` (host:port; a host name binds its first address).
    pub(crate) fn bind(addr: &str) -> Result<MetricsListener, Error> {
        let err = |source: std::io::Error| Error::Bind {
            addr: format!("{addr} (--metrics-listen)"),
            source,
        };
        let sa = addr.to_socket_addrs().map_err(err)?.next().ok_or_else(|| {
            err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the host name has no address",
            ))
        })?;
        // socket2 creates sockets with SOCK_CLOEXEC.
        let socket = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP)).map_err(err)?;
        socket.set_reuse_address(true).map_err(err)?;
        if sa.is_ipv6() {
            socket.set_only_v6(true).map_err(err)?;
        }
        socket.bind(&sa.into()).map_err(err)?;
        socket.listen(BACKLOG).map_err(err)?;
        socket.set_nonblocking(true).map_err(err)?;
        let local = socket
            .local_addr()
            .map_err(err)?
            .as_socket()
            .ok_or_else(|| err(std::io::Error::other("bound socket has no inet address")))?;
        let busy = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        Ok(MetricsListener {
            acceptor: Acceptor::new(socket, MAX_HEAD, busy, format!("metrics listener {local}")),
            local,
        })
    }

    /// Takes over a metrics listener inherited from a previous master (binary upgrade).
    pub(crate) fn adopt(socket: Socket) -> Result<MetricsListener, Error> {
        let err = |source: std::io::Error| Error::Bind {
            addr: "inherited metrics listener".into(),
            source,
        };
        socket.set_nonblocking(true).map_err(err)?;
        let local = socket
            .local_addr()
            .map_err(err)?
            .as_socket()
            .ok_or_else(|| err(std::io::Error::other("not an inet socket")))?;
        let busy = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        Ok(MetricsListener {
            acceptor: Acceptor::new(socket, MAX_HEAD, busy, format!("metrics listener {local}")),
            local,
        })
    }

    /// The listening socket, for a new master on upgrade.
    pub(crate) fn listener(&self) -> &Socket {
        self.acceptor.listener()
    }

    /// The listener (POLLIN) and each connection (POLLIN or POLLOUT), for the master's
    /// `poll`.
    pub(crate) fn poll_fds(&self) -> Vec<PollFd<'_>> {
        self.acceptor.poll_fds()
    }

    /// Serves pending requests; `status` builds a snapshot when `/metrics` is asked for.
    pub(crate) fn service(&mut self, status: &mut dyn FnMut() -> Status) {
        self.acceptor
            .service(&mut |_| Ok(()), &mut |input, eof| decide_http(input, eof, status));
    }

    /// The earliest time at which `service` has a connection to expire.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.acceptor.next_deadline()
    }

    /// The descriptors of the listener and its connections, for workers to close after
    /// fork (all are close-on-exec as well).
    pub(crate) fn raw_fds(&self) -> Vec<RawFd> {
        self.acceptor.raw_fds()
    }

    /// The bound address (with the real port when port 0 was asked).
    pub(crate) fn local_addr(&self) -> std::net::SocketAddr {
        self.local
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    use super::*;
    use crate::control::render::tests::sample_status;
    use crate::scoreboard::State;

    /// Runs `service` until the client thread `client` is done.
    fn serve_while<T: Send + 'static>(
        m: &mut MetricsListener,
        calls: &mut u32,
        client: impl FnOnce(SocketAddr) -> T + Send + 'static,
    ) -> T {
        let addr = m.local_addr();
        let handle = std::thread::spawn(move || client(addr));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !handle.is_finished() {
            assert!(Instant::now() < deadline, "client still running");
            let mut fds = m.poll_fds();
            let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(20u8));
            drop(fds);
            m.service(&mut || {
                *calls += 1;
                sample_status()
            });
        }
        handle.join().unwrap()
    }

    fn ask(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let mut m = MetricsListener::bind("127.0.0.1:0").unwrap();
        assert_ne!(m.local_addr().port(), 0);
        let mut calls = 0;
        let r = serve_while(&mut m, &mut calls, |a| {
            ask(a, b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n")
        });
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(
            r.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{r}"
        );
        assert!(r.contains("\r\nVary: Accept\r\n"), "{r}");
        assert!(r.contains("\r\nConnection: close\r\n"), "{r}");
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("Content-Length: {}\r\n", body.len())),
            "{head}"
        );
        assert!(body.contains("appsrv_connections_total 107\n"));
        assert!(!body.contains("# EOF"), "no EOF in 0.0.4");
        assert_eq!(calls, 1);

        let r = serve_while(&mut m, &mut calls, |a| ask(a, b"GET /other HTTP/1.1\r\n\r\n"));
        assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
        let r = serve_while(&mut m, &mut calls, |a| {
            ask(a, b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
        });
        assert!(
            r.starts_with("HTTP/1.1 405 ") && r.contains("Allow: GET, HEAD\r\n"),
            "{r}"
        );
        let r = serve_while(&mut m, &mut calls, |a| {
            ask(a, b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n")
        });
        assert!(r.starts_with("HTTP/1.1 200 ") && r.ends_with("\r\n\r\n"), "{r}");
        let r = serve_while(&mut m, &mut calls, |a| ask(a, b"\x16\x03\x01 not http\r\n\r\n"));
        assert!(r.starts_with("HTTP/1.1 400 "), "{r}");
        let mut big = b"GET /metrics HTTP/1.1\r\n".to_vec();
        while big.len() < 5000 {
            big.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        let r = serve_while(&mut m, &mut calls, move |a| ask(a, &big));
        assert!(r.starts_with("HTTP/1.1 431 "), "{r}");
        assert_eq!(calls, 2, "status() is built only for complete /metrics requests");
        let r = serve_while(&mut m, &mut calls, |a| {
            ask(a, b"GET /server-status HTTP/1.1\r\n\r\n")
        });
        assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
        assert!(
            r.contains("/metrics")
                && r.contains("/healthz")
                && r.contains("/readyz")
                && r.contains("/status"),
            "{r}"
        );
        assert_eq!(m.acceptor.connections(), 0);
    }

    #[test]
    fn issue_17_metrics_negotiate_openmetrics() {
        let mut m = MetricsListener::bind("127.0.0.1:0").unwrap();
        let mut calls = 0;
        // What Prometheus sends.
        let r = serve_while(&mut m, &mut calls, |a| {
            ask(
                a,
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0;q=0.5,\
                  text/plain;version=0.0.4;q=0.4,*/*;q=0.1\r\n\r\n",
            )
        });
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}\r\n", body.len())),
            "{head}"
        );
        assert!(body.ends_with("\n# EOF\n"), "{body}");
        assert!(body.contains("# TYPE appsrv_connections counter\n"), "{body}");
        assert!(body.contains("\nappsrv_connections_total 107\n"), "{body}");
        // Refusing both formats is a 406 that names them.
        let r = serve_while(&mut m, &mut calls, |a| {
            ask(a, b"GET /metrics HTTP/1.1\r\nAccept: application/json\r\n\r\n")
        });
        assert!(
            r.starts_with("HTTP/1.1 406 ") && r.contains("application/openmetrics-text"),
            "{r}"
        );
        assert_eq!(calls, 1, "no snapshot for a 406");
    }

    #[test]
    fn issue_17_healthz_and_readyz() {
        let mut m = MetricsListener::bind("127.0.0.1:0").unwrap();
        let mut calls = 0;
        let r = serve_while(&mut m, &mut calls, |a| ask(a, b"GET /healthz HTTP/1.1\r\n\r\n"));
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\nok\n"),
            "{r}"
        );
        assert_eq!(calls, 0, "health needs no snapshot");
        let r = serve_while(&mut m, &mut calls, |a| ask(a, b"HEAD /healthz HTTP/1.1\r\n\r\n"));
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        // sample_status is running with an idle worker.
        let r = serve_while(&mut m, &mut calls, |a| ask(a, b"GET /readyz HTTP/1.1\r\n\r\n"));
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\nready\n"),
            "{r}"
        );
        let r = serve_while(&mut m, &mut calls, |a| ask(a, b"HEAD /readyz HTTP/1.1\r\n\r\n"));
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        assert_eq!(calls, 2);
        let r = serve_while(&mut m, &mut calls, |a| ask(a, b"POST /readyz HTTP/1.1\r\n\r\n"));
        assert!(r.starts_with("HTTP/1.1 405 "), "{r}");
    }

    #[test]
    fn issue_17_readyz_says_why_not() {
        let status = |phase: &'static str, states: &[State], policy: &'static str| {
            let mut s = sample_status();
            s.phase = phase;
            s.pool.policy = policy;
            for ((_, w), st) in s.workers.iter_mut().zip(states) {
                w.state = *st;
            }
            s.workers.truncate(states.len());
            s
        };
        let reply = |s: Status| {
            let input = b"GET /readyz HTTP/1.1\r\n\r\n";
            match decide_http(input, false, &mut || s.clone()) {
                Decision::Reply(r) => String::from_utf8(r).unwrap(),
                other => panic!("{other:?}"),
            }
        };
        for (s, want) in [
            (status("running", &[State::Idle], "static"), "200 OK"),
            (
                status("reloading", &[State::Handling, State::Starting], "static"),
                "200 OK",
            ),
            (status("upgrading", &[State::Writing], "dynamic"), "200 OK"),
            (status("running", &[], "ondemand"), "200 OK"),
        ] {
            let r = reply(s);
            assert!(r.starts_with(&format!("HTTP/1.1 {want}\r\n")), "{r}");
        }
        for (s, why) in [
            (
                status("starting", &[State::Idle], "static"),
                "not ready: starting",
            ),
            (
                status("stopping", &[State::Idle], "static"),
                "not ready: stopping",
            ),
            (
                status("draining", &[State::Idle], "static"),
                "not ready: draining",
            ),
            (
                status("running", &[State::Starting, State::Finishing], "static"),
                "not ready: no live worker (1 starting)",
            ),
            (
                status("running", &[], "dynamic"),
                "not ready: no live worker (0 starting)",
            ),
        ] {
            let r = reply(s);
            assert!(r.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{r}");
            assert!(
                r.contains("\r\nContent-Type: text/plain; charset=utf-8\r\n"),
                "{r}"
            );
            assert!(r.split("\r\n\r\n").nth(1).unwrap().starts_with(why), "{r}");
        }
    }

    #[test]
    fn issue_17_negotiation_follows_q_values() {
        let n = |accept: &str| negotiate(&[accept.as_bytes()]);
        use MetricsFormat::{OpenMetrics as Om, Prometheus as Prom};
        for (accept, want) in [
            // Prometheus 2.x and 3.x, and the issue's example.
            (
                "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1",
                Some(Om),
            ),
            (
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                 text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                Some(Om),
            ),
            (
                "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,\
                 application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,\
                 text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
                Some(Om),
            ),
            // Only a version we do not write: the text format.
            (
                "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                Some(Prom),
            ),
            ("application/openmetrics-text", Some(Om)),
            ("Application/OpenMetrics-Text; Version=\"1.0.0\"", Some(Om)),
            ("text/plain;q=0.9, application/openmetrics-text", Some(Om)),
            ("application/openmetrics-text;q=0.3, text/plain", Some(Prom)),
            ("*/*", Some(Prom)),
            ("", Some(Prom)),
            (
                "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
                Some(Prom),
            ),
            // Equal q: the more specific range, then the first listed.
            ("application/openmetrics-text, */*", Some(Om)),
            ("application/openmetrics-text, text/plain", Some(Om)),
            ("text/plain, application/openmetrics-text", Some(Prom)),
            // A q of 0 refuses, also where a wildcard would accept.
            ("text/plain;q=0, */*", Some(Om)),
            ("application/openmetrics-text;q=0, */*;q=0.1", Some(Prom)),
            ("application/*", Some(Om)),
            ("application/json", None),
            ("text/plain;q=0, application/openmetrics-text;q=0", None),
            // Malformed ranges are ignored; none left is no preference.
            ("garbage, application/openmetrics-text;q=2", Some(Prom)),
            ("garbage, application/openmetrics-text;q=0.25", Some(Om)),
        ] {
            assert_eq!(n(accept), want, "{accept:?}");
        }
        assert_eq!(negotiate(&[]), Some(Prom), "no Accept header");
        // Two Accept headers are one list.
        assert_eq!(
            negotiate(&[b"text/plain;q=0.1", b"application/openmetrics-text;q=0.2"]),
            Some(Om)
        );
        assert_eq!(negotiate(&[b"\xff\xfe"]), Some(Prom));
        assert_eq!(parse_q("0.125"), Some(125));
        assert_eq!(parse_q("1.000"), Some(1000));
        assert_eq!(parse_q("1.5"), None);
        assert_eq!(parse_q("0.1234"), None);
    }

    /// Issue 34: `/status` is the HTML page (its refresh period from `?refresh=N`),
    /// `/status?json` the `status --json` document, both for GET and HEAD.
    #[test]
    fn issue_34_status_serves_the_page_and_the_json() {
        let reply = |request: &[u8]| match decide_http(request, false, &mut sample_status) {
            Decision::Reply(r) => String::from_utf8(r).unwrap(),
            other => panic!("{other:?}"),
        };
        let r = reply(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n");
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("\r\nContent-Type: text/html; charset=utf-8\r\n"),
            "{head}"
        );
        assert!(
            head.contains("\r\nContent-Security-Policy: default-src 'none';"),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}\r\n", body.len())),
            "{head}"
        );
        assert_eq!(body, page::render_html(&sample_status(), DEFAULT_REFRESH));
        assert!(body.contains(&format!("content=\"{DEFAULT_REFRESH}\"")), "{body}");

        let r = reply(b"GET /status?refresh=17 HTTP/1.1\r\n\r\n");
        assert!(r.contains("<meta http-equiv=\"refresh\" content=\"17\">"), "{r}");
        let r = reply(b"GET /status?refresh=0&other=1 HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 ") && !r.contains("http-equiv"), "{r}");
        for bad in ["x", "-1", "", "86401"] {
            let r = reply(format!("GET /status?refresh={bad} HTTP/1.1\r\n\r\n").as_bytes());
            assert!(
                r.starts_with("HTTP/1.1 400 ") && r.contains("refresh"),
                "{bad}: {r}"
            );
        }

        let r = reply(b"GET /status?json HTTP/1.1\r\n\r\n");
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("\r\nContent-Type: application/json\r\n"), "{head}");
        assert_eq!(body, render_json(&sample_status()));

        for request in [
            &b"HEAD /status HTTP/1.1\r\n\r\n"[..],
            b"HEAD /status?json HTTP/1.1\r\n\r\n",
        ] {
            let r = reply(request);
            assert!(
                r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"),
                "{r}"
            );
            assert!(!r.contains("Content-Length: 0\r\n"), "{r}");
        }
        let r = reply(b"POST /status HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 405 "), "{r}");
    }

    #[test]
    fn a_request_in_pieces_is_served() {
        let mut m = MetricsListener::bind("127.0.0.1:0").unwrap();
        let mut calls = 0;
        let r = serve_while(&mut m, &mut calls, |a| {
            let mut s = TcpStream::connect(a).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"GET /met").unwrap();
            std::thread::sleep(Duration::from_millis(100));
            s.write_all(b"rics HTTP/1.1\r\n").unwrap();
            std::thread::sleep(Duration::from_millis(100));
            s.write_all(b"\r\n").unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        });
        assert!(r.starts_with("HTTP/1.1 200 "), "{r}");
        assert_eq!(calls, 1);
    }

    #[test]
    fn a_taken_port_is_an_error_naming_it() {
        let m = MetricsListener::bind("127.0.0.1:0").unwrap();
        let addr = m.local_addr().to_string();
        let e = MetricsListener::bind(&addr).unwrap_err().to_string();
        assert!(e.contains(&addr) && e.contains("--metrics-listen"), "{e}");
        let e = MetricsListener::bind("no-port").unwrap_err().to_string();
        assert!(e.contains("no-port"), "{e}");
    }
}

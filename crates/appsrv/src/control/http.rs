//! `--metrics-listen`: a minimal HTTP/1.1 server in the master for Prometheus, serving
//! `GET /metrics` and nothing else, one request per connection (`Connection: close`),
//! with the same non-blocking deadlines and bounds as the control socket.

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::time::Instant;

use nix::poll::PollFd;
use socket2::{Domain, Protocol, Socket, Type};

use super::conn::{Acceptor, Decision};
use super::render::render_metrics;
use crate::control::status::Status;
use crate::error::Error;

/// The largest request head accepted (request line and headers).
pub(crate) const MAX_HEAD: usize = 4096;

/// The content type of the text exposition format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

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
    let path = req.path.unwrap_or("");
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if path != "/metrics" {
        return Decision::Reply(plain("404 Not Found", "", "not found: metrics are at /metrics\n"));
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
    let body = render_metrics(&status());
    Decision::Reply(response("200 OK", "", CONTENT_TYPE, body.as_bytes(), head_only))
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
            r.contains("\r\nContent-Type: text/plain; version=0.0.4\r\n"),
            "{r}"
        );
        assert!(r.contains("\r\nConnection: close\r\n"), "{r}");
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("Content-Length: {}\r\n", body.len())),
            "{head}"
        );
        assert!(body.contains("appsrv_connections_total 107\n"));
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
        assert_eq!(m.acceptor.connections(), 0);
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

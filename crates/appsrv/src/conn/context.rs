//! What a request handler knows about the connection a request came on: the client's
//! address, the TLS session, the connection's id, and the handler's own per-connection
//! state (its session).

use std::time::Duration;

use crate::net::listener::Addr;
use crate::net::tls::TlsSession;

/// The facts about a connection that do not change while it is served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnInfo<'a> {
    pub(crate) peer: &'a Addr,
    pub(crate) tls: Option<&'a TlsSession>,
    pub(crate) id: u64,
    /// The connection's socket, for its local address.
    pub(crate) socket: &'a socket2::Socket,
}

/// The connection a request came on, given to
/// [`RequestHandler::handle_request`](crate::RequestHandler::handle_request) with each of
/// its requests: the client's address, the TLS session, the connection's number, and the
/// handler's state for this connection, its [session](crate::RequestHandler::Session).
///
/// The handler value (`self`) is one per worker and sees every connection the worker
/// serves; the session is one per connection: made (with `Default`) when the connection is
/// accepted, passed to each of its requests, dropped when it closes. Keep there what
/// belongs to one client: a login, a selected database, an open transaction. The same
/// holds whichever way the worker waits for its clients.
///
/// `S` is the handler's session type; a handler without one declares `type Session = ();`
/// and names this type `Conn<'_>`.
///
/// ```no_run
/// use std::io;
/// use appsrv::Conn;
/// use appsrv::codec::{Line, Lines, LinesResponse};
///
/// /// Counts each connection's requests.
/// struct Counter;
///
/// impl appsrv::RequestHandler for Counter {
///     type Codec = Lines;
///     type Session = u64;
///
///     fn handle_request(
///         &mut self,
///         conn: &mut Conn<'_, u64>,
///         _line: &Line<'_>,
///         out: &mut LinesResponse<'_>,
///     ) -> io::Result<()> {
///         *conn.session() += 1;
///         let n = *conn.session();
///         out.push(format!("request {n} from {}\n", conn.peer_addr()).as_bytes());
///         Ok(())
///     }
/// }
///
/// fn main() -> appsrv::Result<()> {
///     appsrv::Server::new("counter").listen("127.0.0.1:7003").run_requests(|| Ok(Counter))
/// }
/// ```
#[derive(Debug)]
pub struct Conn<'a, S = ()> {
    info: ConnInfo<'a>,
    session: &'a mut S,
    /// The handler called [`penalize`](Conn::penalize) for this request.
    penalized: bool,
}

impl<'a, S> Conn<'a, S> {
    pub(crate) fn new(info: ConnInfo<'a>, session: &'a mut S) -> Self {
        Conn {
            info,
            session,
            penalized: false,
        }
    }

    /// Whether [`penalize`](Conn::penalize) was called since the last look (the request
    /// loop asks after each request, and closes the connection if so).
    pub(crate) fn take_penalized(&mut self) -> bool {
        std::mem::take(&mut self.penalized)
    }

    /// The client's address: IP and port for TCP (the one a PROXY header named, behind a
    /// balancer), the peer's path (usually none) for Unix sockets.
    pub fn peer_addr(&self) -> &Addr {
        self.info.peer
    }

    /// The TLS session of a connection accepted on a TLS listener (`ADDR?tls`): protocol,
    /// ALPN, the client's verified certificate. `None` on a plain listener.
    pub fn tls(&self) -> Option<&TlsSession> {
        self.info.tls
    }

    /// The connection's name across the pool: the worker's slot, generation and process
    /// id, and the connection's number in that worker (see [`ConnId`](crate::ConnId)), to
    /// name the connection in logs. In hybrid mode, the number is the serving worker's: a
    /// connection handed between processes gets a new one with each hand-over.
    pub fn id(&self) -> crate::ConnId {
        crate::ConnId::new(self.info.id)
    }

    /// The local address of this connection (the address the client connected to, which
    /// for a listener on `0.0.0.0` or `[::]` is a specific address). Fails only if the
    /// system cannot tell it (the connection is gone).
    pub fn local_addr(&self) -> std::io::Result<Addr> {
        Ok(Addr::from_sockaddr(&self.info.socket.local_addr()?))
    }

    /// Whether the worker was asked to stop (a stop, a reload, an upgrade, recycling) and
    /// is finishing its connections: a handler may cut a long operation short, or tell the
    /// client.
    pub fn stopping(&self) -> bool {
        crate::conn::id::worker_stopping()
    }

    /// The handler's state for this connection.
    pub fn session(&mut self) -> &mut S {
        self.session
    }

    /// The worker's privileged helper `P` ([`Server::privileged`](crate::Server::privileged)):
    /// `conn.privileged::<MyHelper>().call(&request)` in a blocking or hybrid worker;
    /// `.call_async(&request).await` in an [`AsyncRequestHandler`](crate::AsyncRequestHandler),
    /// which never blocks the worker's thread. See [`privileged`](crate::privileged).
    pub fn privileged<P: crate::privileged::Privileged>(&self) -> crate::privileged::Helper<P> {
        crate::privileged::helper()
    }

    /// Charges the client's address with a failed authentication (a wrong password, token
    /// or signature), so that brute force from it is slowed across every worker, as
    /// OpenSSH's `PerSourcePenalties` does; call it when your check fails, and answer the
    /// request as usual (a 401, a fault).
    ///
    /// - **This connection** ends after the response to this request (HTTP says
    ///   `Connection: close`; other protocols are closed after the response): the next
    ///   attempt needs a new connection, and goes through admission.
    /// - **The address** is refused for a while: the n-th failure in a row refuses it for
    ///   2^(n-1) seconds from now (1 s, 2 s, 4 s ...), at most `--penalty-max` (600 s by
    ///   default; `0` turns penalties off). While refused, each new connection from it is
    ///   closed at once by the worker that accepts it, before any byte is read or a TLS
    ///   handshake is made, with no reply; one line per episode in the log
    ///   (`refusing connections from IP for Ns: N failed authentication(s) in a row`), and
    ///   `appsrv_penalized_refused_total` counts them. Connections it has open already
    ///   are served (each of their failures is charged too).
    /// - The address is forgotten once no failure was charged for `--penalty-max` after
    ///   its refusal ended; a success does not reset it.
    ///
    /// The address is the client's IPv4 address, or its IPv6 `/64` (one host holds a
    /// whole `/64`); behind a balancer, the one its PROXY header names (`ADDR?proxy`).
    /// **Behind a proxy that sends no PROXY header**, every client has the proxy's
    /// address, and one client's failures would refuse them all: listen with `?proxy`, or
    /// turn penalties off (`--penalty-max 0`) and throttle at the proxy.
    ///
    /// Returns how long the address is now refused, for a `Retry-After` or a message; `None`
    /// when nothing was charged: penalties are off, the client has no address (a Unix
    /// socket), or the table of penalized addresses (65,536) is full, which fails open: see
    /// docs/ARCHITECTURE.md ("Failed authentication: penalties").
    ///
    /// ```no_run
    /// use std::io::{self, Write};
    /// use appsrv::Conn;
    /// use appsrv::codec::{Http, HttpRequest, HttpResponse};
    ///
    /// struct Api;
    ///
    /// impl appsrv::RequestHandler for Api {
    ///     type Codec = Http;
    ///     type Session = ();
    ///
    ///     fn handle_request(
    ///         &mut self,
    ///         conn: &mut Conn<'_>,
    ///         req: &HttpRequest<'_>,
    ///         res: &mut HttpResponse<'_>,
    ///     ) -> io::Result<()> {
    ///         if req.header_str("authorization") != Some("Bearer s3cret-t0ken-0123456789") {
    ///             res.status(401);
    ///             if let Some(wait) = conn.penalize() {
    ///                 res.header("Retry-After", wait.as_secs().max(1).to_string());
    ///             }
    ///             return res.write_all(b"unauthorised\n");
    ///         }
    ///         res.write_all(b"welcome\n")
    ///     }
    /// }
    ///
    /// fn main() -> appsrv::Result<()> {
    ///     appsrv::Server::new("api").listen("127.0.0.1:7004").run_requests(|| Ok(Api))
    /// }
    /// ```
    pub fn penalize(&mut self) -> Option<Duration> {
        self.penalized = true;
        crate::penalty::charge(self.info.peer.ip()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 42: `Conn` had no `local_addr` or `stopping`, and its `id` was a number that
    /// every worker repeated.
    #[test]
    fn issue_42_conn_gives_local_addr_id_and_stopping() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let bound = listener.local_addr().unwrap();
        let _client = std::net::TcpStream::connect(bound).unwrap();
        let (accepted, from) = listener.accept().unwrap();
        let socket = socket2::Socket::from(accepted);
        let peer = Addr::Inet(from);
        let mut session = ();
        let conn = Conn::new(
            ConnInfo {
                peer: &peer,
                tls: None,
                id: 7,
                socket: &socket,
            },
            &mut session,
        );
        assert_eq!(conn.local_addr().unwrap(), Addr::Inet(bound));
        assert_eq!(*conn.peer_addr(), peer);
        assert_eq!(conn.id().number(), 7);
        assert_eq!(conn.id().pid(), std::process::id());
        assert!(conn.id().to_string().ends_with(".c7"), "{}", conn.id());
        assert!(!conn.stopping());
    }
}

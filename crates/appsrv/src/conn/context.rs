//! What a request handler knows about the connection a request came on: the client's
//! address, the TLS session, a connection number, and the handler's own per-connection
//! state (its session).

use crate::net::listener::Addr;
use crate::net::tls::TlsSession;

/// The facts about a connection that do not change while it is served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnInfo<'a> {
    pub(crate) peer: &'a Addr,
    pub(crate) tls: Option<&'a TlsSession>,
    pub(crate) id: u64,
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
/// use appsrv::codec::{Lines, LinesResponse};
///
/// /// Counts each connection's requests.
/// struct Counter;
///
/// impl appsrv::RequestHandler for Counter {
///     type Codec = Lines;
///     type Session = u64;
///
///     fn codec(&self) -> Lines {
///         Lines::default()
///     }
///
///     fn handle_request(
///         &mut self,
///         conn: &mut Conn<'_, u64>,
///         _line: &&[u8],
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
}

impl<'a, S> Conn<'a, S> {
    pub(crate) fn new(info: ConnInfo<'a>, session: &'a mut S) -> Self {
        Conn { info, session }
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

    /// The connection's number in this worker process: 1 for its first connection, then
    /// 2, and so on. With [`WorkerInfo::pid`](crate::WorkerInfo) it names the connection
    /// in logs.
    pub fn id(&self) -> u64 {
        self.info.id
    }

    /// The handler's state for this connection.
    pub fn session(&mut self) -> &mut S {
        self.session
    }

    /// The worker's privileged helper `P` ([`Server::privileged`](crate::Server::privileged)):
    /// `conn.privileged::<MyHelper>().call(&request)`. See [`privileged`](crate::privileged).
    pub fn privileged<P: crate::privileged::Privileged>(&self) -> crate::privileged::Helper<P> {
        crate::privileged::helper()
    }
}

//! What a user implements.

use std::io;

use crate::codec::Codec;
use crate::conn::async_client::AsyncClient;
use crate::conn::client::Client;
use crate::conn::context::Conn;
use crate::conn::datagram::Datagram;

/// Serves connections, one at a time, inside a worker process.
///
/// One handler value exists per worker: the factory given to
/// [`Server::run`](crate::Server::run) creates it after the worker has forked and dropped
/// its privileges, so state that must not be shared between processes (a database
/// connection, a cache, a random number generator) belongs in the handler.
///
/// ```no_run
/// use std::io::{self, Write};
///
/// struct Hello;
///
/// impl appsrv::Handler for Hello {
///     fn handle_client(&mut self, client: &mut appsrv::Client) -> io::Result<()> {
///         let peer = client.peer_addr().clone();
///         writeln!(client, "Hello, Client! You are {peer}")
///     }
/// }
///
/// fn main() -> appsrv::Result<()> {
///     appsrv::Server::new("hello").listen("127.0.0.1:7000").run(|| Ok(Hello))
/// }
/// ```
pub trait Handler {
    /// Serves one connection, from accept to close.
    ///
    /// Buffered output is flushed and the connection closed when this returns. An error
    /// is logged with the peer's address (timeouts at info level, a peer that went away at
    /// debug level, others as warnings) and ends only this connection. A panic is caught: the
    /// connection is closed, the panic logged with the peer's address, and the worker
    /// exits and is replaced, so other clients never notice.
    fn handle_client(&mut self, client: &mut Client) -> io::Result<()>;

    /// Called once when the worker stops in an orderly way (a stop signal, after the
    /// last connection), before the process exits. Not called after a panic or when the
    /// worker is killed. Does nothing by default.
    fn on_worker_exit(&mut self) {}
}

/// Serves requests inside a worker process: the request level.
///
/// The framework reads, frames (with the handler's [`Codec`]), and writes; the handler
/// only turns each decoded request into a response. Keep-alive, pipelining (several
/// requests in one read, answered in order with their responses written together),
/// limits, timeouts and protocol errors are handled by the framework.
///
/// Three lifetimes of state:
/// - the handler value (`self`): one per worker process, made by the factory after fork,
///   shared by every connection the worker serves (a database connection, a cache);
/// - the [`Session`](RequestHandler::Session): one per connection, made with `Default`
///   when it is accepted and dropped when it closes (a login, a selected database, an
///   open transaction), reached through [`Conn::session`];
/// - the [`Codec`]: one per connection too ([`codec`](RequestHandler::codec) is called for
///   each; `Default::default()` unless the handler configures it), holding the framing's
///   own progress.
///
/// ```no_run
/// use std::io;
/// use appsrv::Conn;
/// use appsrv::codec::{Line, Lines, LinesResponse};
///
/// struct Upper;
///
/// impl appsrv::RequestHandler for Upper {
///     type Codec = Lines;
///     type Session = ();
///
///     fn handle_request(
///         &mut self,
///         _conn: &mut Conn<'_>,
///         line: &Line<'_>,
///         out: &mut LinesResponse<'_>,
///     ) -> io::Result<()> {
///         out.line(line.to_str()?.to_uppercase());
///         Ok(())
///     }
/// }
///
/// fn main() -> appsrv::Result<()> {
///     appsrv::Server::new("upper").listen("127.0.0.1:7002").run_requests(|| Ok(Upper))
/// }
/// ```
pub trait RequestHandler {
    /// The protocol's framing: one of [`codec`](crate::codec)'s (`Lines`, `Resp`,
    /// `Http`...) or your own.
    type Codec: Codec + Default;

    /// The handler's state for one connection: made with `Default` when the connection is
    /// accepted, given to each of its requests through [`Conn::session`], dropped when it
    /// closes. A handler without per-connection state says `type Session = ();`
    /// (associated type defaults are not stable Rust yet).
    type Session: Default;

    /// Makes the codec of a new connection: called once for each connection, before its
    /// first request. By default the codec's `Default` (for [`Lines`](crate::codec::Lines),
    /// lines up to 8 KiB); implement it to configure the codec, such as its limits:
    /// `Http::default().max_body(64 << 20)`.
    fn codec(&self) -> Self::Codec {
        Self::Codec::default()
    }

    /// Handles one request: writes the response into `res`. `conn` is the connection it
    /// came on (the client's address, TLS, the connection's session). An error ends the
    /// connection (logged with the peer's address); a panic ends the connection and the
    /// worker, which is replaced.
    ///
    /// A blocking call the handler makes itself (a read from a database socket, a
    /// `connect`) may return [`io::ErrorKind::Interrupted`]: the worker's signals (a stop,
    /// USR1, and the master's SIGURG that wakes a worker between keep-alive requests, which
    /// can land just as a request arrives) are caught without `SA_RESTART`. Retry on it, as
    /// `std`'s `read_exact` and `write_all` do.
    fn handle_request(
        &mut self,
        conn: &mut Conn<'_, Self::Session>,
        req: &<Self::Codec as Codec>::Request<'_>,
        res: &mut <Self::Codec as Codec>::Response<'_>,
    ) -> io::Result<()>;

    /// Called once when the worker stops in an orderly way. Does nothing by default.
    fn on_worker_exit(&mut self) {}
}

/// Serves requests with `async` code: the request level of [`RequestHandler`], in event
/// workers where many requests wait at once (issue 33).
///
/// Each worker runs a current-thread tokio runtime, made after the fork, and serves every
/// connection it accepts as a future of that runtime: a handler that awaits (a timer, a
/// database with `tokio-postgres`, another service with hyper's client) lets the worker
/// serve the others meanwhile, so two processes hold thousands of requests in flight.
/// The framework reads, frames (with the handler's [`Codec`]) and writes as for
/// [`RequestHandler`]: the same codecs, keep-alive, pipelining (a connection's requests
/// are answered one after the other, in order), limits and protocol errors.
///
/// State, by lifetime:
/// - the handler value: one per worker, made by the factory after fork, **shared** by
///   every request in flight in the worker, hence `&self`: keep mutable state in a
///   `Cell` or `RefCell` (the worker has one thread; never hold a `RefCell` borrow
///   across an `.await`) or in an `Rc`;
/// - the [`Session`](AsyncRequestHandler::Session): one per connection, as for
///   [`RequestHandler`], through [`Conn::session`];
/// - the [`Codec`]: one per connection.
///
/// Limits (see [`Server::run_async_requests`](crate::Server::run_async_requests)):
/// `--max-inflight` requests at once per worker; `--request-timeout` cancels a request's
/// future (it is dropped at its current `.await`) and answers with the codec's error
/// reply (HTTP `504`); a client that closes its connection cancels the future of its
/// request in flight. A future that blocks the thread (a blocking call, a long
/// computation) holds up every connection of its worker: each poll longer than
/// `--slow-request` is logged with the client and the request.
///
/// ```no_run
/// use std::io;
/// use std::time::Duration;
/// use appsrv::Conn;
/// use appsrv::codec::{Line, Lines, LinesResponse};
///
/// struct Later;
///
/// impl appsrv::AsyncRequestHandler for Later {
///     type Codec = Lines;
///     type Session = ();
///
///     async fn handle_request(
///         &self,
///         _conn: &mut Conn<'_>,
///         line: &Line<'_>,
///         out: &mut LinesResponse<'_>,
///     ) -> io::Result<()> {
///         tokio::time::sleep(Duration::from_millis(10)).await;
///         out.line(line.to_str()?.to_uppercase());
///         Ok(())
///     }
/// }
///
/// fn main() -> appsrv::Result<()> {
///     appsrv::Server::new("later").listen("127.0.0.1:7003").run_async_requests(|| Ok(Later))
/// }
/// ```
// The futures are polled on the worker's one thread: no `Send` bound is wanted, which is
// what the lint warns about.
#[allow(async_fn_in_trait)]
pub trait AsyncRequestHandler {
    /// The protocol's framing, as [`RequestHandler::Codec`].
    type Codec: Codec + Default;

    /// The handler's state for one connection, as [`RequestHandler::Session`].
    type Session: Default;

    /// Makes the codec of a new connection: called once for each connection. By default
    /// the codec's `Default`, as [`RequestHandler::codec`].
    fn codec(&self) -> Self::Codec {
        Self::Codec::default()
    }

    /// Handles one request: writes the response into `res`, awaiting what it needs.
    ///
    /// An error ends the connection (logged with the peer's address). A panic is caught:
    /// the connection is closed, the panic logged with the client and the request, and
    /// the worker goes on serving its other connections (the handler's state is shared
    /// and may be half-updated: keep it consistent at every `.await`, or fail with an
    /// error instead).
    ///
    /// (`'r` names the lifetime of the request's bytes, of its response and of the
    /// connection's context alike: an `async fn` in a trait needs its lifetimes tied to
    /// an argument's type. Implementations write the usual elided `'_`s.)
    async fn handle_request<'r>(
        &self,
        conn: &mut Conn<'r, Self::Session>,
        req: &<Self::Codec as Codec>::Request<'r>,
        res: &mut <Self::Codec as Codec>::Response<'r>,
    ) -> io::Result<()>;

    /// Called once when the worker stops in an orderly way, after its last request.
    /// Does nothing by default.
    fn on_worker_exit(&self) {}
}

/// Serves whole connections with `async` code: the client level of [`Handler`], for
/// conversational protocols (an SMTP- or FTP-like dialogue, a session that pushes
/// messages) in event workers, thousands of connections per process.
///
/// The connection is an [`AsyncClient`], a tokio [`AsyncRead`](tokio::io::AsyncRead) and
/// [`AsyncWrite`](tokio::io::AsyncWrite) stream (use `tokio::io::AsyncBufReadExt` and
/// `AsyncWriteExt` on it) with the client's address, its TLS session and the read and
/// write deadlines of [`Client`]. The handler value is one per worker and shared by
/// every connection in progress (`&self`), as for [`AsyncRequestHandler`].
///
/// ```no_run
/// use std::io;
/// use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
///
/// struct Echo;
///
/// impl appsrv::AsyncHandler for Echo {
///     async fn handle_client(&self, client: &mut appsrv::AsyncClient) -> io::Result<()> {
///         let mut lines = BufReader::new(client);
///         let mut line = String::new();
///         while lines.read_line(&mut line).await? > 0 {
///             lines.get_mut().write_all(line.as_bytes()).await?;
///             line.clear();
///         }
///         Ok(())
///     }
/// }
///
/// fn main() -> appsrv::Result<()> {
///     appsrv::Server::new("echo").listen("127.0.0.1:7004").run_async(|| Ok(Echo))
/// }
/// ```
#[allow(async_fn_in_trait)]
pub trait AsyncHandler {
    /// Serves one connection, from admission to close: the connection is closed (its
    /// output flushed) when the future completes. An error is logged with the client's
    /// address and ends only this connection; a panic is caught, logged, and ends only
    /// this connection.
    async fn handle_client(&self, client: &mut AsyncClient) -> io::Result<()>;

    /// Called once when the worker stops in an orderly way. Does nothing by default.
    fn on_worker_exit(&self) {}
}

/// Answers datagrams inside a worker process: the datagram level (`udp://` and `unixgram:`
/// listeners).
///
/// As for the other handlers, one value exists per worker, made by the factory given to
/// [`Server::datagrams`](crate::Server::datagrams) or
/// [`Server::run_datagrams`](crate::Server::run_datagrams) after the worker has forked and
/// dropped its privileges. The framework receives datagrams in batches (`recvmmsg`), calls
/// this handler for each one that passes the listener's rules, the size limit and the
/// per-source answer rate, and sends the answers of a batch together (`sendmmsg`), each from
/// the address its datagram was sent to.
///
/// The handler runs in the worker's event loop, beside the stream connections it may also
/// serve: it must not block. A call longer than `--request-timeout` gets the worker killed
/// and replaced, as for a stream request.
///
/// ```no_run
/// use std::io;
///
/// struct Echo;
///
/// impl appsrv::DatagramHandler for Echo {
///     fn handle_datagram(&mut self, datagram: &appsrv::Datagram<'_>, answer: &mut Vec<u8>) -> io::Result<()> {
///         answer.extend_from_slice(datagram.data());
///         Ok(())
///     }
/// }
///
/// fn main() -> appsrv::Result<()> {
///     appsrv::Server::new("echo").listen("udp://127.0.0.1:7007").run_datagrams(|| Ok(Echo))
/// }
/// ```
pub trait DatagramHandler {
    /// Handles one datagram: writes the answer, if any, into `answer`, which is empty on
    /// entry. Left empty, nothing is sent. An answer longer than a datagram can be (65,507
    /// bytes over UDP) is refused by the kernel, logged and counted as failed.
    ///
    /// An error is logged with the sender's address and counted as dropped; no answer is
    /// sent, and the worker goes on. A panic is caught, logged with the sender's address,
    /// and ends the worker, which is replaced (the datagrams of its batch not yet answered
    /// are lost, as on a network that drops them).
    fn handle_datagram(&mut self, datagram: &Datagram<'_>, answer: &mut Vec<u8>) -> io::Result<()>;

    /// Called instead of [`handle_datagram`](DatagramHandler::handle_datagram) for one in
    /// `--answers-slip` datagrams from a source over its `--max-answers-per-ip` rate (a
    /// source: its IPv4 /24 or IPv6 /56 by default; the others are dropped): a small answer that tells a genuine client to retry another
    /// way, which is worth nothing to an attacker who forges the source address to
    /// reflect answers at a victim. DNS answers such a query with the TC bit set and no
    /// records, so that a real resolver retries over TCP. Does nothing (no answer) by
    /// default.
    fn slip(&mut self, datagram: &Datagram<'_>, answer: &mut Vec<u8>) {
        let _ = (datagram, answer);
    }

    /// Called once when the worker stops in an orderly way. Does nothing by default.
    fn on_worker_exit(&mut self) {}
}

/// Facts about the worker process, given to the
/// [`on_worker_start`](crate::Server::on_worker_start) hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// The worker's slot number, from 1 to the pool size; a replacement reuses the slot
    /// of the worker it replaces.
    pub id: u32,
    /// The worker's process id.
    pub pid: u32,
}

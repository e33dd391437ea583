//! Serving one connection: the client level (the user's `handle_client`) and the request
//! level, where the blocking driver here runs the I/O-free request step
//! (`conn/step.rs`) over the connection's socket.
//!
//! Both are driven by the worker's connection loop through [`Connections`]; neither knows
//! how the connection was accepted.

use std::io;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::codec::Codec;
use crate::conn::client::Client;
use crate::conn::context::{Conn, ConnInfo};
use crate::conn::step::{self, Handle, Next, Requests, Wait};
use crate::handler::{AsyncRequestHandler, Handler, RequestHandler};

pub(crate) use crate::conn::step::{Boundary, Context, Head, Limits};

/// Hybrid mode: where a connection that travels between processes is in its requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Requests answered on it so far.
    pub(crate) served: u32,
    /// The interim reply of the request whose beginning travels with it went out.
    pub(crate) interim_sent: bool,
}

/// What a worker does with each connection.
pub(crate) trait Connections {
    /// Serves the connection until it closes, or, in hybrid mode, until the context says
    /// to hand it back to a front: then `Ok(Some(progress))`, how far it got (the buffer
    /// may hold the beginning of a request, which goes back with it). `resumed`: a
    /// connection handed over from another process, with its progress when it was
    /// received (`None` for a connection accepted here: its socket has the listener's
    /// timeouts; another process may have changed a handed-over one's).
    fn serve(
        &mut self,
        client: &mut Client,
        ctx: &mut dyn Context,
        resumed: Option<Progress>,
    ) -> io::Result<Option<Progress>>;
    fn on_worker_exit(&mut self);
    /// Whether requests are counted and timed one by one (not for `handle_client`).
    fn request_level(&self) -> bool;

    /// Refuses a connection before serving it: the codec's error reply when there is one
    /// (HTTP 503, `-ERR refused: …`), then a lingering close.
    fn refuse(&mut self, _client: &mut Client, _why: &'static str) {}
}

/// The request level, async (issue 33).
pub(crate) struct AsyncRequestLevel<H: AsyncRequestHandler> {
    handler: H,
    limits: Limits,
}

impl<H: AsyncRequestHandler> std::fmt::Debug for AsyncRequestLevel<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncRequestLevel")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl<H: AsyncRequestHandler> AsyncRequestLevel<H> {
    pub(crate) fn new(handler: H, limits: Limits) -> Self {
        AsyncRequestLevel { handler, limits }
    }

    /// The handler and the request step's limits, for the async driver.
    pub(crate) fn parts(&self) -> (&H, Limits) {
        (&self.handler, self.limits.clone())
    }
}

/// The client level, async (issue 33).
#[derive(Debug)]
pub(crate) struct AsyncClientLevel<H>(pub(crate) H);

/// The client level.
#[derive(Debug)]
pub(crate) struct ClientLevel<H>(pub(crate) H);

impl<H: Handler> Connections for ClientLevel<H> {
    fn serve(
        &mut self,
        client: &mut Client,
        _: &mut dyn Context,
        _: Option<Progress>,
    ) -> io::Result<Option<Progress>> {
        self.0.handle_client(client).map(|()| None)
    }

    fn on_worker_exit(&mut self) {
        self.0.on_worker_exit();
    }

    fn request_level(&self) -> bool {
        false
    }
}

/// The request level.
pub(crate) struct RequestLevel<H: RequestHandler> {
    handler: H,
    limits: Limits,
}

impl<H: RequestHandler> std::fmt::Debug for RequestLevel<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestLevel")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl<H: RequestHandler> RequestLevel<H> {
    pub(crate) fn new(handler: H, limits: Limits) -> Self {
        RequestLevel { handler, limits }
    }

    /// The handler and the request step's limits, for a driver that runs the step itself
    /// over many connections (the event loop, a hybrid front).
    pub(crate) fn parts(&mut self) -> (&mut H, Limits) {
        (&mut self.handler, self.limits.clone())
    }
}

impl<H: RequestHandler> Connections for RequestLevel<H> {
    fn serve(
        &mut self,
        client: &mut Client,
        ctx: &mut dyn Context,
        resumed: Option<Progress>,
    ) -> io::Result<Option<Progress>> {
        let number = client.number();
        let mut step = Requests::new(self.handler.codec(), self.limits.clone());
        if let Some(p) = resumed {
            step.resume(p.served, p.interim_sent);
        }
        let mut session = H::Session::default();
        drive(
            step,
            resumed.is_none(),
            &mut self.handler,
            &mut session,
            number,
            client,
            ctx,
        )
    }

    fn on_worker_exit(&mut self) {
        self.handler.on_worker_exit();
    }

    fn request_level(&self) -> bool {
        true
    }

    fn refuse(&mut self, client: &mut Client, why: &'static str) {
        let mut step = Requests::new(self.handler.codec(), self.limits.clone());
        step.refuse(client.parts().0, why);
        if client.flush_output().is_ok() {
            // No waiting: a refused client may be one of many slow ones (a slowloris);
            // what it sent already is drained so that the close does not reset the reply.
            client.linger(Duration::ZERO, step::LINGER_BYTES);
        }
    }
}

/// The user's handler bound to one connection, as the step calls it.
pub(crate) struct Bound<'h, 'c, H: RequestHandler> {
    pub(crate) handler: &'h mut H,
    pub(crate) conn: Conn<'c, H::Session>,
}

impl<H: RequestHandler> Handle<H::Codec> for Bound<'_, '_, H> {
    fn handle(
        &mut self,
        req: &<H::Codec as Codec>::Request<'_>,
        res: &mut <H::Codec as Codec>::Response<'_>,
    ) -> io::Result<()> {
        self.handler.handle_request(&mut self.conn, req, res)
    }

    fn ends_connection(&mut self) -> bool {
        self.conn.take_penalized()
    }
}

/// The blocking driver of the request step; returns when the connection should be closed
/// (after flushing): `Ok(None)`, or handed back to a front (hybrid mode):
/// `Ok(Some(progress))`, the buffer holding the beginning of a request if one came.
///
/// The syscall floor: a request that arrives in one read costs that `read` and one
/// `write` of its response (the responses of pipelined requests share the write); no
/// timer or poll call, no allocation (buffers are reused). The socket's timeout is the
/// keep-alive timeout, set once on the listener; it changes only when the timeout of the
/// step's wait does ([`Wait`]): a request split across reads switches it to the request's
/// timeout, the next boundary back, and a drain a signal interrupted to what is left of
/// it. Deadlines themselves are the step's, by the clock.
fn drive<H: RequestHandler>(
    step: Requests<H::Codec>,
    timeout_known: bool,
    handler: &mut H,
    session: &mut H::Session,
    id: u64,
    client: &mut Client,
    ctx: &mut dyn Context,
) -> io::Result<Option<Progress>> {
    let mut d = Drive {
        max: step.max_request_size(),
        // The socket's timeout is the listener's: the keep-alive timeout. It changes only
        // when the wait's timeout does: when the kind of wait changes (with equal read and
        // keep-alive timeouts, a split request costs no setsockopt at all), and for a drain
        // that a signal interrupted, to what is left of it.
        // A connection handed over by another process may have any timeout (a linger's):
        // the first read sets it.
        set: timeout_known.then(|| step.idle_timeout()),
        partial_until: None,
        step,
        handler,
        session,
        id,
        client,
        ctx,
    };
    // A connection handed over without a request (forwarded at a stop) goes to the
    // boundary at once, where the guard decides how it waits.
    let mut next = if d.client.parts().0.has_input() || !timeout_known {
        d.advance()
    } else {
        d.step.first_read()
    };
    loop {
        next = match next {
            Next::Read {
                wait,
                timeout,
                guarded,
                grace,
            } => match d.read(wait, timeout, guarded, grace)? {
                ControlFlow::Continue(next) => next,
                ControlFlow::Break(end) => return Ok(end),
            },
            Next::More => {
                d.client.flush_output()?;
                d.step.output_sent(d.ctx);
                d.advance()
            }
            Next::SendFile(body) => {
                d.client.send_file(&body.file, body.range)?;
                d.advance()
            }
            Next::Close { linger } => {
                // The last response goes out here, still shown as writing (and watched
                // by --min-send-rate), rather than when the connection is finished.
                d.client.flush_output()?;
                if let Some(wait) = linger {
                    d.client.linger(wait, step::LINGER_BYTES);
                }
                return Ok(None);
            }
            Next::Fail(e) => return Err(e),
        };
    }
}

/// One connection under [`drive`]: the step, what it calls, and the driver's own memory
/// between waits. Kept in one place so that each kind of wait is a method of its own (the
/// boundary, a hybrid worker's partial wait, the read) rather than one long loop body.
struct Drive<'a, H: RequestHandler> {
    step: Requests<H::Codec>,
    handler: &'a mut H,
    session: &'a mut H::Session,
    id: u64,
    client: &'a mut Client,
    ctx: &'a mut dyn Context,
    /// The codec's largest request, the most a read may buffer.
    max: usize,
    /// The read timeout the socket has (`None`: unknown, the first read sets it).
    set: Option<Option<Duration>>,
    /// Hybrid mode: until when the request begun after `served` answers, on a connection
    /// a front handed over, may take to arrive whole here (`Context::partial_wait`), then
    /// it goes back.
    partial_until: Option<(u32, Instant)>,
}

/// `Break(end)`: [`drive`] returns `Ok(end)`; `Continue(next)`: the step's next move.
type Flow = ControlFlow<Option<Progress>, Next>;

impl<H: RequestHandler> Drive<'_, H> {
    /// One call of the step on the connection's buffers.
    fn advance(&mut self) -> Next {
        advance(
            &mut self.step,
            self.handler,
            self.session,
            self.id,
            self.client,
            self.ctx,
        )
    }

    /// How far the connection got, for a hand-back to a front.
    fn back(&self) -> Progress {
        Progress {
            served: self.step.served(),
            interim_sent: self.step.interim_sent(),
        }
    }

    /// The step waits for input: the answers go out before anything that may wait (the
    /// guard, a read), then the boundary and a hybrid worker's partial wait may end the
    /// connection or send it back, and otherwise the socket is read.
    fn read(
        &mut self,
        wait: Wait,
        timeout: Option<Duration>,
        guarded: bool,
        grace: Duration,
    ) -> io::Result<Flow> {
        self.client.flush_output()?;
        self.step.output_sent(self.ctx);
        // The bytes moved so far on the worker's slot (the rest when the connection ends).
        self.ctx.moved(self.client.traffic());
        // Input already decrypted inside the TLS layer is a request arriving, though the
        // socket may have nothing more to read.
        let mut linger = None;
        if guarded && !self.client.input_pending() {
            match self.ctx.at_boundary(self.client.socket(), grace) {
                Boundary::Wait => {}
                Boundary::Linger(d) => linger = Some(d),
                Boundary::GiveUp => {
                    tracing::debug!(
                        "closing the idle keep-alive connection from {}: clients are waiting and no worker is idle",
                        self.client.peer_addr()
                    );
                    return Ok(ControlFlow::Break(None));
                }
                Boundary::HandBack => return Ok(ControlFlow::Break(Some(self.back()))),
            }
        }
        if wait == Wait::Request {
            match self.partial_wait() {
                ControlFlow::Continue(None) => {}
                ControlFlow::Continue(left) => linger = left,
                ControlFlow::Break(()) => return Ok(ControlFlow::Break(Some(self.back()))),
            }
        } else {
            self.partial_until = None;
        }
        if guarded && self.step.drains(self.ctx) {
            // The stop came while the guard waited: drain (the step says how).
            return Ok(ControlFlow::Continue(self.advance()));
        }
        self.read_socket(wait, timeout, linger)
    }

    /// A request begun on a connection that goes back to a front when quiet (a hybrid
    /// worker's): the rest may take a moment to come, not a client's time. Then the
    /// connection goes back with what came, and the front gathers the rest: a worker never
    /// waits on a client's slowness. `Continue(Some(left))`: read for at most `left`;
    /// `Continue(None)`: not such a connection; `Break`: the moment is over, hand back.
    fn partial_wait(&mut self) -> ControlFlow<(), Option<Duration>> {
        let Some(bound) = self.ctx.partial_wait() else {
            return ControlFlow::Continue(None);
        };
        let now = Instant::now();
        let served = self.step.served();
        if self.partial_until.is_none_or(|(s, _)| s != served) {
            // This request's first wait (one pipelined behind another starts its own).
            self.partial_until = Some((served, now + bound));
        }
        let left = self
            .partial_until
            .map_or(bound, |(_, until)| until.saturating_duration_since(now));
        if left < Duration::from_millis(1) {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(Some(left))
    }

    /// Reads the socket, its timeout set first if the wait's differs from the one it has,
    /// and tells the step what came: input, the peer's close, a signal, a timeout.
    fn read_socket(
        &mut self,
        wait: Wait,
        timeout: Option<Duration>,
        linger: Option<Duration>,
    ) -> io::Result<Flow> {
        // The Idle and Request waits keep one value for the whole connection; a drain's
        // shrinks (what is left of it, after a signal). A hybrid worker's linger is one
        // value too: a connection it keeps costs no `setsockopt` per request.
        let want = linger.map_or(timeout, Some);
        if self.set != Some(want) {
            self.client.set_read_timeout(want)?;
            self.set = Some(want);
        }
        // A wait between requests ends on a signal, so that a stop is seen.
        let next = match self.client.read_more(self.max, wait != Wait::Request) {
            Ok(0) => self.step.peer_closed(self.client.parts().0),
            Ok(_) => {
                self.step.received(&mut Instant::now);
                self.advance()
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => self.advance(),
            // Quiet for the linger, or the rest of a request did not come in time: back to
            // a front.
            Err(e) if e.kind() == io::ErrorKind::TimedOut && linger.is_some() => {
                return Ok(ControlFlow::Break(Some(self.back())));
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                let (bufs, peer, _) = self.client.parts();
                self.step.timed_out(bufs, self.ctx, peer, Instant::now())
            }
            Err(e) => return Err(e),
        };
        Ok(ControlFlow::Continue(next))
    }
}

/// One call of the step on the connection's buffers, with the handler bound to it.
fn advance<H: RequestHandler>(
    step: &mut Requests<H::Codec>,
    handler: &mut H,
    session: &mut H::Session,
    id: u64,
    client: &mut Client,
    ctx: &mut dyn Context,
) -> Next {
    let (bufs, peer, tls, socket) = client.parts_with_socket();
    let info = ConnInfo {
        peer,
        tls,
        id,
        socket,
    };
    let mut bound = Bound {
        handler,
        conn: Conn::new(info, session),
    };
    step.advance(bufs, &mut bound, ctx, peer, &mut Instant::now)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::codec::{Http, HttpRequest, HttpResponse, Lines, LinesResponse};
    use crate::conn::client::Buffers;
    use crate::net::listener::Addr;
    use socket2::Socket;

    /// A worker context that reports a saturated pool, or not.
    struct Fake {
        saturated: bool,
    }

    impl Context for Fake {
        fn saturated(&mut self) -> bool {
            self.saturated
        }
    }

    /// A handler answering `hi` over HTTP (the event loop's tests use it too).
    pub(crate) struct Hello;

    impl RequestHandler for Hello {
        type Codec = Http;
        type Session = ();
        fn handle_request(
            &mut self,
            _conn: &mut crate::Conn<'_>,
            _: &HttpRequest<'_>,
            res: &mut HttpResponse<'_>,
        ) -> io::Result<()> {
            res.write_all(b"hi")
        }
    }

    pub(crate) struct Echo;

    impl RequestHandler for Echo {
        type Codec = Lines;
        type Session = ();
        fn handle_request(
            &mut self,
            _conn: &mut crate::Conn<'_>,
            line: &crate::codec::Line<'_>,
            res: &mut LinesResponse<'_>,
        ) -> io::Result<()> {
            res.push(line);
            res.push(b"\n");
            Ok(())
        }
    }

    pub(crate) const LIMITS: Limits = Limits {
        keepalive_timeout: Some(Duration::from_secs(5)),
        read_timeout: Some(Duration::from_secs(5)),
        keepalive_requests: 1000,
        header_timeout: Some(Duration::from_secs(20)),
        header_timeout_max: Some(Duration::from_secs(60)),
        min_rate: 500,
        request_detail: false,
    };

    /// Serves `input` (then end of file) on one end of a socket pair; returns the output.
    fn serve<H: RequestHandler>(handler: H, input: &[u8], saturated: bool) -> String {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut client = Client::new(
            Socket::from(std::os::fd::OwnedFd::from(ours)),
            Addr::Unix(None),
            Buffers::new(),
        );
        let mut peer = theirs;
        peer.write_all(input).unwrap();
        peer.shutdown(std::net::Shutdown::Write).unwrap();
        let mut level = RequestLevel::new(handler, LIMITS.clone());
        level.serve(&mut client, &mut Fake { saturated }, None).unwrap();
        let _ = client.finish();
        let mut out = String::new();
        peer.read_to_string(&mut out).unwrap();
        out
    }

    const TWO_GETS: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n";

    #[test]
    fn http_keeps_connections_alive_while_workers_are_free() {
        let out = serve(Hello, TWO_GETS, false);
        assert_eq!(out.matches("200 OK").count(), 2, "{out}");
        assert!(!out.contains("Connection: close"), "{out}");
    }

    #[test]
    fn on_a_saturated_pool_http_announces_the_close() {
        // Clients are queued and no worker is idle: the response says so, and the loop
        // stops there, rather than dropping the connection after a keep-alive response.
        let out = serve(Hello, TWO_GETS, true);
        assert_eq!(
            out.matches("200 OK").count(),
            1,
            "the second request is not answered: {out}"
        );
        assert!(out.contains("Connection: close"), "{out}");
    }

    #[test]
    fn protocols_that_cannot_announce_a_close_keep_their_connection() {
        let out = serve(Echo, b"a\nb\n", true);
        assert_eq!(out, "a\nb\n");
    }

    /// Echoes lines ([`Echo`]), but a line `wrong` is a failed authentication
    /// (`Conn::penalize`).
    struct Gate;

    impl RequestHandler for Gate {
        type Codec = Lines;
        type Session = ();
        fn handle_request(
            &mut self,
            conn: &mut crate::Conn<'_>,
            line: &crate::codec::Line<'_>,
            res: &mut LinesResponse<'_>,
        ) -> io::Result<()> {
            if line.as_bytes() != b"wrong" {
                return Echo.handle_request(conn, line, res);
            }
            // No table in a unit test (and a Unix peer has no address): nothing is
            // charged, but the connection ends all the same.
            assert_eq!(conn.penalize(), None);
            res.push(b"-ERR denied\n");
            Ok(())
        }
    }

    /// Issue 31: after `penalize`, the response goes out and the connection ends, whatever
    /// the protocol (a Lines client, which cannot be told, included): requests pipelined
    /// after it are not answered; the next attempt needs a new connection, which admission
    /// sees. HTTP says `Connection: close`.
    #[test]
    fn issue_31_a_penalized_request_ends_its_connection() {
        let out = serve(Gate, b"a\nwrong\nb\nwrong\n", false);
        assert_eq!(out, "a\n-ERR denied\n");
        struct Deny;
        impl RequestHandler for Deny {
            type Codec = Http;
            type Session = ();
            fn handle_request(
                &mut self,
                conn: &mut crate::Conn<'_>,
                _: &HttpRequest<'_>,
                res: &mut HttpResponse<'_>,
            ) -> io::Result<()> {
                conn.penalize();
                res.status(401).write_all(b"no")
            }
        }
        let out = serve(Deny, TWO_GETS, false);
        assert_eq!(out.matches("401 ").count(), 1, "{out}");
        assert!(out.contains("Connection: close"), "{out}");
    }
}

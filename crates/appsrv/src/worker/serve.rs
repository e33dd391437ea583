//! Serving one connection: the client level (the user's `handle_client`) and the request
//! level (the framework's read → decode → handle → encode → write loop).
//!
//! Both are driven by the worker's connection loop through [`Connections`]; neither knows
//! how the connection was accepted.

use std::io;
use std::time::Duration;

use socket2::Socket;

use crate::codec::{Codec, Decoded, Outcome, ProtocolError, Respond};
use crate::conn::client::Client;
use crate::handler::{Handler, RequestHandler};
use crate::scoreboard::State;
use crate::sys;

/// What the request loop asks at a request boundary before it waits for the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Boundary {
    /// Wait for the next request.
    Wait,
    /// Close the connection: clients wait in the listen queue and no worker is idle, so
    /// an idle keep-alive connection must not hold this worker.
    GiveUp,
}

/// How long a keep-alive connection may stay quiet, while clients wait in the listen
/// queue and no worker is idle, before its worker gives it up: for protocols that can
/// announce a close (an HTTP client reconnects and retries as a matter of course)...
pub(crate) const IDLE_GRACE: Duration = Duration::from_millis(100);
/// ... and for those that cannot, whose clients may take a close for a failure: only a
/// connection that is really idle is given up.
pub(crate) const IDLE_GRACE_SILENT: Duration = Duration::from_secs(1);

/// Per-connection context from the worker.
pub(crate) trait Context {
    /// Called at a request boundary when the loop is about to wait on `conn`; `grace` is
    /// how long the connection may stay quiet while others wait.
    fn at_boundary(&mut self, conn: &Socket, grace: Duration) -> Boundary;

    /// Whether clients wait in the listen queue while no worker is idle: a codec that can
    /// announce a close then makes the current response the connection's last, so the
    /// client reconnects cleanly (rather than finding its keep-alive connection dropped
    /// with its next request in flight).
    fn saturated(&mut self) -> bool;

    /// Whether the worker has reached its request limit (`--max-requests`): a codec that
    /// can announce a close ends the connection after this response, so that a keep-alive
    /// client cannot keep a worker past its limit.
    fn retiring(&mut self) -> bool {
        false
    }

    /// The worker's scoreboard state changes (reading, handling, writing, closing).
    fn state(&mut self, _state: State) {}

    /// A request begins; `head` is its first bytes (for the status and the timeout's log).
    fn request_start(&mut self, _head: &[u8]) {}

    /// The request that began is answered: `bytes` is (request, response) length, `ok`
    /// whether the handler succeeded.
    fn request_end(&mut self, _bytes: (u64, u64), _ok: bool) {}
}

/// What a worker does with each connection.
pub(crate) trait Connections {
    fn serve(&mut self, client: &mut Client, ctx: &mut dyn Context) -> io::Result<()>;
    fn on_worker_exit(&mut self);
    /// Whether requests are counted and timed one by one (not for `handle_client`).
    fn request_level(&self) -> bool;

    /// Refuses a connection before serving it: the codec's error reply when there is one
    /// (HTTP 503, `-ERR refused: …`), then a lingering close.
    fn refuse(&mut self, _client: &mut Client, _why: &'static str) {}
}

/// The client level.
#[derive(Debug)]
pub(crate) struct ClientLevel<H>(pub(crate) H);

impl<H: Handler> Connections for ClientLevel<H> {
    fn serve(&mut self, client: &mut Client, _: &mut dyn Context) -> io::Result<()> {
        self.0.handle_client(client)
    }

    fn on_worker_exit(&mut self) {
        self.0.on_worker_exit();
    }

    fn request_level(&self) -> bool {
        false
    }
}

/// Limits of the request loop.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// How long an idle connection may wait for its next request (the socket's timeout
    /// between requests, inherited from the listener).
    pub(crate) keepalive_timeout: Option<Duration>,
    /// How long the rest of a request may take to arrive once its first bytes came.
    pub(crate) read_timeout: Option<Duration>,
    /// Requests per connection; the last response closes it.
    pub(crate) keepalive_requests: u32,
    /// Slow-client defence: a request that arrives in pieces must be complete within this
    /// time of its first bytes, extended by one second per `min_rate` bytes received.
    pub(crate) header_timeout: Option<Duration>,
    /// Bytes per second that earn a slow request one more second (0: no extension).
    pub(crate) min_rate: u64,
}

/// How long a keep-alive connection that is between requests when its worker is told to
/// stop (a stop, a reload, an upgrade, recycling) may take to send its next request, which
/// is then answered with the close announcement, at most (and never longer than the
/// keep-alive timeout). A client that talks to a server (a benchmark, a proxy's pooled
/// connection, a script) sends its next request within microseconds of the last response;
/// closing the connection at once instead, as most servers do, races with that request and
/// loses it (the client sees a reset). One that stays quiet this long is a client at rest,
/// for which a close is as good a time as any.
pub(crate) const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// How long the close of a connection that ends because its worker stops lingers for the
/// client's own close (reading and discarding what it still sends), at most.
const STOP_LINGER: Duration = Duration::from_millis(500);

impl Limits {
    /// How long a stopping worker waits for an idle keep-alive connection's next request.
    fn drain_wait(&self) -> Duration {
        self.keepalive_timeout.map_or(DRAIN_WAIT, |t| t.min(DRAIN_WAIT))
    }
}

/// The request level.
pub(crate) struct RequestLevel<H: RequestHandler> {
    handler: H,
    codec: H::Codec,
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
        let codec = handler.codec();
        RequestLevel {
            handler,
            codec,
            limits,
        }
    }
}

impl<H: RequestHandler> Connections for RequestLevel<H> {
    fn serve(&mut self, client: &mut Client, ctx: &mut dyn Context) -> io::Result<()> {
        self.codec.reset();
        serve_requests(&mut self.handler, &mut self.codec, &self.limits, client, ctx)
    }

    fn on_worker_exit(&mut self) {
        self.handler.on_worker_exit();
    }

    fn request_level(&self) -> bool {
        true
    }

    fn refuse(&mut self, client: &mut Client, why: &'static str) {
        self.codec.reset();
        self.codec
            .encode_error(&ProtocolError::Refused(why.into()), client.output());
        if client.flush_output().is_ok() {
            // No waiting: a refused client may be one of many slow ones (a slowloris);
            // what it sent already is drained so that the close does not reset the reply.
            client.linger(Duration::ZERO, LINGER_BYTES);
        }
    }
}

/// The request loop; returns when the connection should be closed (after flushing).
///
/// The syscall floor: a request that arrives in one read costs that `read` and one
/// `write` of its response (the responses of pipelined requests share the write); no
/// timer or poll call, no allocation (buffers are reused). The socket's timeout is the
/// keep-alive timeout, set once on the listener; only a request split across reads makes
/// the loop switch it to the read timeout, and back at the next boundary.
fn serve_requests<H: RequestHandler>(
    handler: &mut H,
    codec: &mut H::Codec,
    limits: &Limits,
    client: &mut Client,
    ctx: &mut dyn Context,
) -> io::Result<()> {
    let max = codec.max_request_size();
    let announces_close = codec.announces_close();
    let mut served: u32 = 0;
    let mut in_request = false;
    let mut mid_request_timeout = false;
    // When the request in progress showed its first bytes (for the slow-client defence).
    let mut request_began: Option<std::time::Instant> = None;
    // Until when a stopping worker waits for this idle connection's next request.
    let mut draining: Option<std::time::Instant> = None;
    // The slot shows this worker writing (a response was made, not yet flushed).
    let mut writing = false;
    loop {
        // Answer every complete request already received, in order.
        loop {
            if client.unconsumed_mut().is_empty() {
                break;
            }
            if !in_request {
                let input = client.unconsumed_mut();
                ctx.request_start(&input[..input.len().min(crate::scoreboard::HEAD_BYTES)]);
                in_request = true;
            }
            // Only a protocol that can tell its client ends a connection between requests:
            // to a client of one that cannot, a close looks like a failure, so its
            // connections last until the client leaves (or a timeout, or the grace period),
            // even while the worker stops or retires.
            let last = announces_close
                && (sys::stop_requested()
                    || served + 1 >= limits.keepalive_requests
                    || ctx.retiring()
                    || ctx.saturated());
            // Decode and handle inside this block, which owns the borrow of the buffers;
            // what the connection does next is decided after it.
            let step = {
                let (input, out) = client.split_buffers();
                match codec.decode(input) {
                    Ok(Decoded::Request { request, len }) => {
                        let mark = out.len();
                        let mut res = codec.respond(&request, out, last);
                        ctx.state(State::Handling);
                        let handled = handler.handle_request(&request, &mut res);
                        if announces_close && !last && sys::stop_requested() {
                            // The stop came while the handler ran: this response can still
                            // say that it is the last (its head is written by `finish`).
                            res.close_after();
                        }
                        // The response is written from here on (the slot still names its
                        // request), until the flush at the next boundary: a slow reader
                        // shows as one.
                        ctx.state(State::Writing);
                        let outcome = res.finish();
                        Step::Handled {
                            len,
                            mark,
                            handled,
                            outcome,
                        }
                    }
                    Ok(Decoded::Incomplete { interim }) => {
                        if let Some(bytes) = interim {
                            out.extend_from_slice(bytes);
                        }
                        Step::Incomplete
                    }
                    Err(e) => Step::Bad(e),
                }
            };
            let (len, mark, handled, outcome) = match step {
                Step::Handled {
                    len,
                    mark,
                    handled,
                    outcome,
                } => (len, mark, handled, outcome),
                Step::Incomplete => break,
                Step::Bad(e) => return protocol_error(codec, client, ctx, &e),
            };
            served += 1;
            request_began = None;
            let out_len = client.output().len().saturating_sub(mark) as u64
                + outcome
                    .file
                    .as_ref()
                    .map_or(0, |f| f.range.end.saturating_sub(f.range.start));
            ctx.request_end((len as u64, out_len), handled.is_ok());
            in_request = false;
            if let Err(e) = handled {
                client.output().truncate(mark);
                return Err(e);
            }
            client.consume_input(len);
            writing = true;
            if let Some(body) = outcome.file {
                client.send_file(&body.file, body.range)?;
            }
            if draining.is_some() {
                // Answered with the announcement: the client reconnects for the next one.
                client.flush_output()?;
                client.linger(STOP_LINGER, LINGER_BYTES);
                return Ok(());
            }
            if outcome.close || last {
                // The last response goes out here, still shown as writing (and watched by
                // --min-send-rate), rather than when the connection is finished.
                client.flush_output()?;
                // Requests the client pipelined after this one are not answered: close
                // lingering, so that their unread bytes do not make the kernel reset the
                // connection under the response just sent (the client retries them). No
                // cost when nothing is left unread, the usual case.
                if !client.unconsumed_mut().is_empty() {
                    client.linger(LINGER, LINGER_BYTES);
                }
                return Ok(());
            }
        }

        let pending = client.unconsumed_mut().len();
        let at_boundary = pending == 0;
        // At a boundary, send the answers before anything that may wait (the drain, the
        // guard); in the middle of a request, the read flushes them.
        if at_boundary && !client.output().is_empty() {
            client.flush_output()?;
        }
        if writing {
            ctx.state(State::Reading);
            writing = false;
        }
        if at_boundary {
            // Stopping: an HTTP-like connection ends between requests (a connection just
            // accepted gets its first request answered: the client sent it already).
            // Closing it now would race with the request the client may be sending: wait a
            // moment for it, answer it with the close announcement, and close lingering.
            if announces_close && served > 0 && sys::stop_requested() {
                let now = std::time::Instant::now();
                let until = *draining.get_or_insert_with(|| now + limits.drain_wait());
                // Under a millisecond left counts as none: the kernel reads a timeout under
                // a microsecond as no timeout at all.
                if until.saturating_duration_since(now) < Duration::from_millis(1) {
                    client.linger(Duration::ZERO, LINGER_BYTES);
                    return Ok(());
                }
                ctx.state(State::Finishing);
                client.set_read_timeout(Some(until - now))?;
                mid_request_timeout = true;
                match client.read_more(max, true) {
                    Ok(0) => return Ok(()), // the client closed first
                    Ok(_) => {
                        // A request is coming: the rest of it gets the read timeout (and
                        // the header timeout, when on), not what was left of the wait.
                        client.set_read_timeout(limits.read_timeout)?;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                        client.linger(Duration::ZERO, LINGER_BYTES);
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                }
            }
            request_began = None;
            if mid_request_timeout {
                client.set_read_timeout(limits.keepalive_timeout)?;
                mid_request_timeout = false;
            }
            // Only a keep-alive connection, one that was served already, can be given up:
            // a new connection whose first request has not arrived yet (a client that is
            // slow to send, a loaded machine) would see its request dropped.
            let grace = if announces_close {
                IDLE_GRACE
            } else {
                IDLE_GRACE_SILENT
            };
            // Input already decrypted inside the TLS layer is a request arriving, though
            // the socket may have nothing more to read.
            if served > 0
                && !client.input_pending()
                && ctx.at_boundary(client.socket(), grace) == Boundary::GiveUp
            {
                tracing::debug!(
                    "closing the idle keep-alive connection from {}: clients are waiting and no worker is idle",
                    client.peer_addr()
                );
                return Ok(());
            }
            if announces_close && served > 0 && sys::stop_requested() {
                continue; // the stop came while the guard waited: drain, as above
            }
        } else {
            if pending >= max {
                return protocol_error(
                    codec,
                    client,
                    ctx,
                    &ProtocolError::TooLarge {
                        what: "request",
                        limit: max,
                    },
                );
            }
            if let Some(limit) = limits.header_timeout {
                // Slow-client defence, as Apache's mod_reqtimeout: the request must be
                // complete within `limit` of its first bytes, plus one second per
                // `min_rate` bytes received. Checked only after a partial read (a request
                // that arrives in one read never gets here), with one setsockopt so that
                // the next read waits no longer than what is left.
                let began = *request_began.get_or_insert_with(std::time::Instant::now);
                let earned = match limits.min_rate {
                    0 => Duration::ZERO,
                    rate => Duration::from_secs_f64(pending as f64 / rate as f64),
                };
                let allowed = limit + earned;
                let elapsed = began.elapsed();
                if elapsed >= allowed {
                    // Details at debug level: protocol_error logs the one info line.
                    tracing::debug!(
                        "{} sent {pending} bytes of a request in {elapsed:?}: too slow (--header-timeout, --min-rate)",
                        client.peer_addr()
                    );
                    return protocol_error(codec, client, ctx, &ProtocolError::Timeout);
                }
                let left = allowed - elapsed;
                client.set_read_timeout(Some(limits.read_timeout.map_or(left, |t| t.min(left))))?;
                mid_request_timeout = true;
            } else if !mid_request_timeout && limits.read_timeout != limits.keepalive_timeout {
                client.set_read_timeout(limits.read_timeout)?;
                mid_request_timeout = true;
            }
        }
        match client.read_more(max, at_boundary) {
            Ok(0) if at_boundary => return Ok(()), // the client closed between requests
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the client closed the connection in the middle of a request",
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // An idle keep-alive connection timed out: close it quietly.
            Err(e) if e.kind() == io::ErrorKind::TimedOut && at_boundary => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                if let (Some(began), Some(_)) = (request_began, limits.header_timeout) {
                    tracing::debug!(
                        "{} sent {} bytes of a request in {:?}: too slow (--header-timeout, --min-rate)",
                        client.peer_addr(),
                        client.unconsumed_mut().len(),
                        began.elapsed()
                    );
                }
                return protocol_error(codec, client, ctx, &ProtocolError::Timeout);
            }
            Err(e) => return Err(e),
        }
    }
}

/// One turn of decoding.
enum Step {
    Handled {
        len: usize,
        mark: usize,
        handled: io::Result<()>,
        outcome: Outcome,
    },
    Incomplete,
    Bad(ProtocolError),
}

/// How long, at most, the loop keeps reading and discarding after an error reply.
const LINGER: Duration = Duration::from_secs(2);
/// How much it reads at most meanwhile.
const LINGER_BYTES: usize = 256 * 1024;

/// Sends the codec's error reply and ends the connection; the worker logs the event once.
///
/// The close lingers: the connection is shut for writing (the reply is followed by a FIN),
/// then what the client still sends is read and discarded for a moment. Closing a socket
/// with unread input makes the kernel send a reset, which can destroy the reply before the
/// client reads it (a 413 sent while the client is still uploading its body).
fn protocol_error<C: Codec>(
    codec: &mut C,
    client: &mut Client,
    ctx: &mut dyn Context,
    e: &ProtocolError,
) -> io::Result<()> {
    ctx.state(State::Closing);
    codec.encode_error(e, client.output());
    let flushed = client.flush_output();
    tracing::info!(
        "bad request from {}: {e}; closing the connection",
        client.peer_addr()
    );
    flushed?;
    client.linger(LINGER, LINGER_BYTES);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::codec::{Http, HttpRequest, HttpResponse, Lines, LinesResponse};
    use crate::conn::client::Buffers;
    use crate::net::listener::Addr;

    /// A worker context that reports a saturated pool, or not.
    struct Fake {
        saturated: bool,
    }

    impl Context for Fake {
        fn at_boundary(&mut self, _: &Socket, _: Duration) -> Boundary {
            Boundary::Wait
        }
        fn saturated(&mut self) -> bool {
            self.saturated
        }
    }

    struct Hello;

    impl RequestHandler for Hello {
        type Codec = Http;
        fn codec(&self) -> Http {
            Http::default()
        }
        fn handle_request(&mut self, _: &HttpRequest<'_>, res: &mut HttpResponse<'_>) -> io::Result<()> {
            res.write_all(b"hi")
        }
    }

    struct Echo;

    impl RequestHandler for Echo {
        type Codec = Lines;
        fn codec(&self) -> Lines {
            Lines::default()
        }
        fn handle_request(&mut self, line: &&[u8], res: &mut LinesResponse<'_>) -> io::Result<()> {
            res.push(line);
            res.push(b"\n");
            Ok(())
        }
    }

    const LIMITS: Limits = Limits {
        keepalive_timeout: Some(Duration::from_secs(5)),
        read_timeout: Some(Duration::from_secs(5)),
        keepalive_requests: 1000,
        header_timeout: Some(Duration::from_secs(20)),
        min_rate: 500,
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
        level.serve(&mut client, &mut Fake { saturated }).unwrap();
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
}

//! The request step: one connection's request level, free of I/O.
//!
//! Given the bytes received so far (in [`Buffers`]), [`Requests::advance`] decodes every
//! complete request (pipelining), calls the handler for each, encodes the responses into
//! the output buffer, and says what comes next ([`Next`]): read more (with the kind of wait
//! and its socket timeout), send a file, close (lingering or not), or fail. The driver does
//! the I/O and reports back what happened: bytes arrived ([`Requests::received`]), the
//! output went out ([`Requests::output_sent`]), the peer closed ([`Requests::peer_closed`]),
//! the wait's timeout expired ([`Requests::timed_out`]).
//!
//! Slow-client deadlines (`--header-timeout` with `--min-rate`, `--read-timeout`) are
//! computed from the clock given to each call, not by changing the socket's timeout before
//! each read: a driver sets its timeout only when the kind of wait changes ([`Wait`]), and
//! the step tells it, when that timeout expires, whether a deadline has really passed.
//!
//! The same step serves the blocking driver of today (`worker::serve`) and can serve an
//! event loop: nothing here blocks, reads a socket or reads the clock by itself.

use std::io;
use std::time::{Duration, Instant};

use socket2::Socket;

use super::buffers::Buffers;
use crate::codec::{Codec, Decoded, FileBody, ProtocolError, Summary};
use crate::net::listener::Addr;
use crate::scoreboard::{HEAD_BYTES, State};

/// What the request loop asks at a request boundary before it waits for the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Boundary {
    /// Wait for the next request.
    Wait,
    /// Close the connection: clients wait in the listen queue and no worker is idle, so
    /// an idle keep-alive connection must not hold this worker.
    GiveUp,
    /// Hybrid mode: give the connection back to a front's event loop, which holds it
    /// until its next request is whole (it stayed quiet after its last response, or the
    /// worker served enough of its requests while others wait).
    HandBack,
    /// Hybrid mode: wait for the next request at most this long (the socket's timeout for
    /// this read), then hand the connection back.
    Linger(Duration),
}

/// How long a keep-alive connection may stay quiet, while clients wait in the listen
/// queue and no worker is idle, before its worker gives it up: for protocols that can
/// announce a close (an HTTP client reconnects and retries as a matter of course)...
pub(crate) const IDLE_GRACE: Duration = Duration::from_millis(100);
/// ... and for those that cannot, whose clients may take a close for a failure: only a
/// connection that is really idle is given up.
pub(crate) const IDLE_GRACE_SILENT: Duration = Duration::from_secs(1);

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
pub(crate) const STOP_LINGER: Duration = Duration::from_millis(500);

/// How long, at most, a close after an error reply, or after a last response with
/// pipelined requests left unanswered, keeps reading and discarding.
pub(crate) const LINGER: Duration = Duration::from_secs(2);
/// How much such a close reads at most meanwhile.
pub(crate) const LINGER_BYTES: usize = 256 * 1024;

/// Requests answered in one call of [`Requests::advance`] at most: a client that pipelines
/// thousands of requests gets their responses sent in batches (the output buffer does not
/// grow with the batch), and an event loop serving many connections turns to the others
/// between two passes.
pub(crate) const PASS_LIMIT: u32 = 64;

/// A timeout that the kernel would read as "none" (under a microsecond) is not one: below
/// this, what is left of a wait counts as nothing.
const MIN_WAIT: Duration = Duration::from_millis(1);

/// A socket timeout may expire a little before the clock says the deadline is there (the
/// kernel's timer granularity): a deadline this close counts as passed.
const SLACK: Duration = Duration::from_millis(10);

/// The first bytes of a request in progress, as the step gives them to the worker (issue
/// 41): what arrived, for the access log's line (its first line, the operator's own file),
/// and what may be published (the status, the slow-request and request-timeout lines).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head<'a> {
    /// The request's first bytes as they arrived, at most [`HEAD_BYTES`].
    pub(crate) raw: &'a [u8],
    /// What the worker publishes about it: its codec's [`Summary`], or, with
    /// `--status-request-detail`, `raw` itself.
    pub(crate) shown: &'a [u8],
}

impl<'a> Head<'a> {
    /// Bytes that are both what arrived and what is shown (a test's, a datagram's).
    pub(crate) fn same(bytes: &'a [u8]) -> Self {
        Head {
            raw: bytes,
            shown: bytes,
        }
    }
}

// The summary fits in the slot's room for a request's first bytes.
const _: () = assert!(Summary::CAPACITY <= HEAD_BYTES);

/// The worker's side of the request level: what the step asks and tells it. Nothing here
/// may block, except [`at_boundary`](Context::at_boundary), which only a blocking driver
/// calls.
pub(crate) trait Context {
    /// Called by a blocking driver at a request boundary when it is about to wait on
    /// `conn`; `grace` is how long the connection may stay quiet while others wait. The
    /// default, for the drivers that never wait at a boundary (they wait for readiness):
    /// wait.
    fn at_boundary(&mut self, _conn: &Socket, _grace: Duration) -> Boundary {
        Boundary::Wait
    }

    /// Whether clients wait in the listen queue while no worker is idle: a codec that can
    /// announce a close then makes the current response the connection's last, so the
    /// client reconnects cleanly (rather than finding its keep-alive connection dropped
    /// with its next request in flight). The default: never (only the blocking driver's
    /// keep-alive guard watches the listen queue).
    fn saturated(&mut self) -> bool {
        false
    }

    /// Whether the worker has reached its request limit (`--max-requests`): a codec that
    /// can announce a close ends the connection after this response, so that a keep-alive
    /// client cannot keep a worker past its limit.
    fn retiring(&mut self) -> bool {
        false
    }

    /// Whether the worker was told to stop (a stop signal).
    fn stopping(&mut self) -> bool {
        crate::sys::stop_requested()
    }

    /// The worker's scoreboard state changes (reading, handling, writing, closing).
    fn state(&mut self, _state: State) {}

    /// A request begins; `head` is its first bytes and what may be published of them (for
    /// the status, the slow-request and timeout lines, and the access log).
    fn request_start(&mut self, _head: Head<'_>) {}

    /// More of the request begun with [`request_start`](Context::request_start) arrived
    /// (it came in pieces): `head` is its first bytes now, longer than before, for the
    /// status and the access log, which would otherwise show only the first piece.
    fn request_head(&mut self, _head: Head<'_>) {}

    /// The request that began is answered: `bytes` is (request, response) length, `ok`
    /// whether the handler succeeded.
    fn request_end(&mut self, _bytes: (u64, u64), _ok: bool) {}

    /// A blocking driver's connection has moved `traffic` (received, sent) so far: given
    /// at each request boundary, after the response went out, so that the worker's
    /// figures show a keep-alive connection's bytes while it lasts (issue 42); what
    /// follows is counted when the connection ends. The event loop and the async driver
    /// count their bytes themselves, as they move, and never give any.
    fn moved(&mut self, _traffic: (u64, u64)) {}

    /// The input was refused with the codec's error reply (bad input, too slow, too
    /// large, shed for memory, a handler past `--request-timeout`): one error for the
    /// status's errors per second (issue 41); `why` decides the access log's outcome for
    /// a driver that does not keep the step at the connection's end (issue 42).
    fn refused(&mut self, _why: &ProtocolError) {}

    /// Hybrid mode, for a blocking driver: how long the rest of a request begun on this
    /// connection may take to arrive, at most, before the connection goes back to a front
    /// with what came of it (a connection a front handed over, while fronts take
    /// connections back). `None` (the default): wait as the limits say.
    fn partial_wait(&mut self) -> Option<Duration> {
        None
    }
}

/// The handler, as the step calls it: the worker binds the user's handler to the
/// connection's context and session.
pub(crate) trait Handle<C: Codec> {
    /// Handles one request, writing the response into `res`.
    fn handle(&mut self, req: &C::Request<'_>, res: &mut C::Response<'_>) -> io::Result<()>;

    /// Whether the handler ended the connection after the response it just wrote (it
    /// charged a failed authentication: `Conn::penalize`). Asked once after each `handle`.
    fn ends_connection(&mut self) -> bool {
        false
    }
}

/// Why an async handler's call was cut before it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// It ran longer than `--request-timeout` (this long).
    TimedOut(Duration),
    /// The client closed the connection.
    Gone,
    /// The handler panicked (logged by the worker, which knows the request).
    Panicked,
}

/// An async handler, as the step awaits it: the worker binds the user's handler to the
/// connection and races it with what may cut it.
pub(crate) trait HandleAsync<C: Codec> {
    /// Handles one request: `Err` when the call was cut (its future dropped); with
    /// whether the handler penalized the client ([`Handle::ends_connection`]).
    ///
    /// `self` is borrowed for the request's lifetime `'r`: the handler's context (the
    /// connection's session) is lent to the call for as long as the request is.
    async fn handle<'r>(
        &'r mut self,
        req: &C::Request<'r>,
        res: &mut C::Response<'r>,
    ) -> (Result<io::Result<()>, Cut>, bool);
}

/// Limits of the request level.
#[derive(Debug, Clone, Default)]
pub(crate) struct Limits {
    /// How long an idle connection may wait for its next request (the socket's timeout
    /// between requests, inherited from the listener).
    pub(crate) keepalive_timeout: Option<Duration>,
    /// How long the rest of a request may take to arrive once its first bytes came, at
    /// most, between two reads that bring bytes.
    pub(crate) read_timeout: Option<Duration>,
    /// Requests per connection; the last response closes it.
    pub(crate) keepalive_requests: u32,
    /// Slow-client defence: a request that arrives in pieces must be complete within this
    /// time of its first bytes, extended by one second per `min_rate` bytes received.
    pub(crate) header_timeout: Option<Duration>,
    /// The extension stops here: however its bytes are spread, a request must be complete
    /// within this of its first bytes (`None`: no bound). Without it, a client that sent
    /// 990 KB of a body at once earned 1,980 s of credit and could then send a byte every
    /// few seconds, below the read timeout, for half an hour (issue 31).
    pub(crate) header_timeout_max: Option<Duration>,
    /// Bytes per second that earn a slow request one more second (0: no extension).
    pub(crate) min_rate: u64,
    /// Publish each request's first bytes rather than its codec's summary
    /// (`--status-request-detail`; default: off, issue 41).
    pub(crate) request_detail: bool,
}

impl Limits {
    /// How long a stopping worker waits for an idle keep-alive connection's next request.
    fn drain_wait(&self) -> Duration {
        self.keepalive_timeout.map_or(DRAIN_WAIT, |t| t.min(DRAIN_WAIT))
    }

    /// The socket timeout while a request is incomplete: the read timeout, or, under the
    /// header timeout, a tick short enough that its deadline is seen on time (a quarter
    /// of it, between 10 ms and a second), whatever bytes arrive meanwhile. The tick
    /// divides the read timeout evenly, so that a client that stops sending is refused
    /// when its read timeout ends, not at the next tick after it.
    fn request_wait(&self) -> Option<Duration> {
        match self.header_timeout {
            None => self.read_timeout,
            Some(limit) => {
                let tick = (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
                Some(match self.read_timeout {
                    None => tick,
                    Some(t) if t <= tick => t,
                    Some(t) => {
                        let ticks = t.as_nanos().div_ceil(tick.as_nanos()).max(1);
                        t / u32::try_from(ticks).unwrap_or(u32::MAX)
                    }
                })
            }
        }
    }
}

/// The kind of wait the step asks for: the driver changes the socket's timeout only when
/// this changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Between requests: the keep-alive timeout.
    Idle,
    /// In the middle of a request: the read timeout, or the header timeout's tick.
    Request,
    /// Between requests while the worker stops: what is left of the drain wait.
    Drain,
}

/// What the driver does next.
#[derive(Debug)]
pub(crate) enum Next {
    /// Send the output buffer (if not empty), then read. `timeout` is the socket timeout
    /// for this kind of wait (set it when the kind changes); `guarded` says that the
    /// connection is an idle keep-alive one that the pool-starvation guard may give up,
    /// after `grace`.
    Read {
        wait: Wait,
        timeout: Option<Duration>,
        guarded: bool,
        grace: Duration,
    },
    /// Send the output buffer, then this file range, then call [`Requests::advance`].
    SendFile(FileBody),
    /// The pass answered [`PASS_LIMIT`] requests and more are buffered: send the output
    /// buffer, then call [`Requests::advance`] again.
    More,
    /// Send the output buffer, then close: with `linger`, shut the connection for writing
    /// first and read and discard what the client still sends for at most that long
    /// (`Duration::ZERO`: only what has arrived), so that the close does not reset a
    /// response the client has not read yet.
    Close { linger: Option<Duration> },
    /// The handler failed: its partial response was dropped, the connection ends with
    /// this error (logged by the worker).
    Fail(io::Error),
}

/// What [`Requests::complete`] found, in a hybrid front: a whole request, or what the
/// step asks for until there is one. Its own type, so that [`Next`], which every driver
/// follows, has no variant that only a front can meet.
#[derive(Debug)]
pub(crate) enum Gathered {
    /// The buffer holds a whole request: send the output, if any (an interim reply), then
    /// hand the connection to a worker with the bytes it read ([`Requests::as_read`]).
    Whole,
    /// Not yet: what the step asks for (read on, or close after a protocol error).
    Step(Next),
}

/// One connection's request level: its codec and where it is between requests.
pub(crate) struct Requests<C: Codec> {
    codec: C,
    limits: Limits,
    max: usize,
    announces_close: bool,
    /// Requests answered.
    served: u32,
    /// The request in progress was announced to the context.
    in_request: bool,
    /// How many bytes of the request in progress its head was given with.
    head_len: usize,
    /// What the codec says of the request in progress (issue 41), reused.
    summary: Summary,
    /// When the request in progress showed its first bytes (header timeout).
    began: Option<Instant>,
    /// When bytes of the request in progress last arrived (read timeout).
    last_input: Option<Instant>,
    /// Until when a stopping worker waits for this idle connection's next request.
    draining: Option<Instant>,
    /// A response was made and not sent yet (the slot shows writing).
    writing: bool,
    /// The wait last asked for.
    wait: Wait,
    /// What follows the file being sent: the close of a last response.
    after_file: Option<Option<Duration>>,
    /// The protocol error that ended the connection, and where its reply begins in the
    /// output.
    rejected: Option<(ProtocolError, usize)>,
    /// The interim reply (`100 Continue`) of the request in progress went out, here or,
    /// in hybrid mode, in the process that had the connection before.
    interim_sent: bool,
    /// Hybrid mode, in a front: the bytes of a request that came in several reads, as
    /// they came (see [`complete`](Requests::complete)); empty otherwise.
    as_read: Vec<u8>,
}

impl<C: Codec> std::fmt::Debug for Requests<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requests")
            .field("served", &self.served)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

/// The outcome of one decoding turn.
enum Turn {
    Handled {
        len: usize,
        mark: usize,
        /// The response was made as the connection's last.
        last: bool,
        handled: io::Result<()>,
        outcome: crate::codec::Outcome,
    },
    Incomplete,
    Bad(ProtocolError),
    /// An async handler's call was cut (its request of `len` bytes, whose response began
    /// at `mark`).
    Cut {
        len: usize,
        mark: usize,
        cut: Cut,
    },
}

/// What the request's decoding claims, checked (the fuzz targets check it too): a request
/// takes at least one byte, no more than the buffer holds, nor than the codec's limit.
fn check_decoded(len: usize, held: usize, max: usize) {
    debug_assert!(len > 0, "a request of 0 bytes: the loop would spin");
    debug_assert!(len <= held, "decode claimed {len} bytes of a buffer of {held}");
    debug_assert!(len <= max, "a request of {len} bytes, above max_request_size()");
}

/// The response made: marked as the connection's last if the stop came while the handler
/// ran, or the handler penalized the client (`ends`), while it can still say so (its head
/// is written by `finish`); then finished. From here on it is written (the slot still
/// names its request) until the output is sent: a slow reader shows as one.
fn close_response<R: crate::codec::Respond>(
    mut res: R,
    announces_close: bool,
    last: bool,
    ends: bool,
    ctx: &mut dyn Context,
) -> crate::codec::Outcome {
    if announces_close && !last && (ctx.stopping() || ends) {
        res.close_after();
    }
    ctx.state(State::Writing);
    let mut outcome = res.finish();
    outcome.close |= ends;
    outcome
}

impl<C: Codec> Requests<C> {
    /// A new connection's request level.
    pub(crate) fn new(codec: C, limits: Limits) -> Self {
        let max = codec.max_request_size();
        let announces_close = codec.announces_close();
        Requests {
            codec,
            limits,
            max,
            announces_close,
            served: 0,
            in_request: false,
            head_len: 0,
            summary: Summary::new(),
            began: None,
            last_input: None,
            draining: None,
            writing: false,
            wait: Wait::Idle,
            after_file: None,
            rejected: None,
            interim_sent: false,
            as_read: Vec::new(),
        }
    }

    /// The most bytes the read buffer may hold (the codec's limit).
    pub(crate) fn max_request_size(&self) -> usize {
        self.max
    }

    /// Requests answered so far.
    pub(crate) fn served(&self) -> u32 {
        self.served
    }

    /// Hybrid mode: the connection comes from another process, which answered `served` of
    /// its requests (`--keepalive-requests` counts the connection's, not this process's)
    /// and, with `interim_sent`, sent the interim reply of the request whose beginning
    /// comes with the connection (this codec, which is new, would send it again).
    pub(crate) fn resume(&mut self, served: u32, interim_sent: bool) {
        self.served = served;
        self.interim_sent = interim_sent;
    }

    /// Whether the interim reply of the request in progress went out (for
    /// [`resume`](Requests::resume) in the process that takes the connection next).
    pub(crate) fn interim_sent(&self) -> bool {
        self.interim_sent
    }

    /// The socket timeout between requests (the keep-alive timeout), which an accepted
    /// connection has from its listener.
    pub(crate) fn idle_timeout(&self) -> Option<Duration> {
        self.limits.keepalive_timeout
    }

    /// The protocol error that ended the connection, if one did, and the offset in the
    /// output at which its reply begins.
    pub(crate) fn rejected(&self) -> Option<&(ProtocolError, usize)> {
        self.rejected.as_ref()
    }

    /// Bytes arrived (the driver put them in the buffers); `now` reads the clock, which
    /// only a request in progress needs (for its read timeout): a request that arrives in
    /// one read costs no clock read.
    pub(crate) fn received(&mut self, now: &mut dyn FnMut() -> Instant) {
        if self.wait == Wait::Request {
            self.last_input = Some(now());
        }
    }

    /// The output went out: a response that was being written is done.
    pub(crate) fn output_sent(&mut self, ctx: &mut dyn Context) {
        if self.writing {
            ctx.state(State::Reading);
            self.writing = false;
        }
    }

    /// Whether this idle connection is to be drained now (an HTTP-like connection of a
    /// stopping worker): the driver asks again after a guard's wait.
    pub(crate) fn drains(&self, ctx: &mut dyn Context) -> bool {
        self.announces_close && self.served > 0 && ctx.stopping()
    }

    /// What a connection just accepted does first when nothing has come with it yet:
    /// wait for its first request (with bytes already there, after a PROXY header, the
    /// driver calls [`advance`](Requests::advance) instead).
    pub(crate) fn first_read(&mut self) -> Next {
        self.read(Wait::Idle, self.limits.keepalive_timeout)
    }

    /// Answers every complete request in `bufs` and says what comes next.
    pub(crate) fn advance(
        &mut self,
        bufs: &mut Buffers,
        handler: &mut dyn Handle<C>,
        ctx: &mut dyn Context,
        peer: &Addr,
        now: &mut dyn FnMut() -> Instant,
    ) -> Next {
        if let Some(linger) = self.after_file.take() {
            return Next::Close { linger };
        }
        let mut answered = 0;
        while bufs.has_input() {
            if answered == PASS_LIMIT {
                return Next::More;
            }
            let turn = self.one(bufs, handler, ctx);
            match self.after_turn(bufs, ctx, peer, turn) {
                Some(Ok(())) => answered += 1,
                Some(Err(next)) => return next,
                None => break,
            }
        }
        self.after_pass(bufs, ctx, peer, now)
    }

    /// What a decoding turn leads to, in both kinds of call: `Some(Ok)`, a request was
    /// answered and the pass goes on; `Some(Err(next))`, the connection's next move;
    /// `None`, the request is not whole yet.
    fn after_turn(
        &mut self,
        bufs: &mut Buffers,
        ctx: &mut dyn Context,
        peer: &Addr,
        turn: Turn,
    ) -> Option<Result<(), Next>> {
        match turn {
            Turn::Handled {
                len,
                mark,
                last,
                handled,
                outcome,
            } => match self.answered(bufs, ctx, (len, mark, last), handled, outcome) {
                Some(next) => Some(Err(next)),
                None => Some(Ok(())),
            },
            Turn::Incomplete => None,
            Turn::Bad(e) => Some(Err(self.protocol_error(bufs, ctx, peer, &e))),
            // Only an async call is cut.
            Turn::Cut { len, mark, cut } => Some(Err(self.cut(bufs, ctx, peer, (len, mark), cut))),
        }
    }

    /// The end of a pass: at a boundary, or in the middle of a request.
    fn after_pass(
        &mut self,
        bufs: &mut Buffers,
        ctx: &mut dyn Context,
        peer: &Addr,
        now: &mut dyn FnMut() -> Instant,
    ) -> Next {
        if !bufs.has_input() {
            self.at_boundary(ctx, now)
        } else {
            self.partial(bufs, ctx, peer, now)
        }
    }

    /// Hybrid mode, in a front: whether the buffer holds a whole request, without handling
    /// it; then [`as_read`](Requests::as_read) gives its bytes as they came, for the worker,
    /// which decodes them anew (a codec may rewrite the buffer in place: HTTP de-chunks
    /// bodies). An interim reply (`100 Continue`) goes into the output. Otherwise the same
    /// waits, deadlines and refusals as [`advance`](Requests::advance): a request is
    /// gathered whole, however large, up to the codec's limit.
    ///
    /// A request's first read (all of it, usually) is decoded from a copy in `scratch`,
    /// and the buffer keeps the bytes as they came. A request that needs more reads is
    /// decoded in the buffer itself from its second read on, as in event mode, while its
    /// bytes as they came are kept beside it, each new read appended: decoding a fresh
    /// copy at each read would copy a body gathered in small reads once per read, a cost
    /// that grows with the square of its size (a megabyte in 1,448-byte reads, about 350
    /// MB of copying; ten megabytes, 35 GB). The codec sees its own rewriting from then
    /// on, as in event mode: a codec rewrites a request in place once it is whole (HTTP),
    /// and one that rewrote an incomplete request would find it rewritten, as it does in
    /// the other modes.
    pub(crate) fn complete(
        &mut self,
        bufs: &mut Buffers,
        scratch: &mut Vec<u8>,
        ctx: &mut dyn Context,
        peer: &Addr,
        now: &mut dyn FnMut() -> Instant,
    ) -> Gathered {
        if !bufs.has_input() {
            return Gathered::Step(self.at_boundary(ctx, now));
        }
        // The request's first bytes to the context, as the other drivers' step gives them:
        // a request the front refuses, times out or loses gets its access-log line there
        // (issue 42); one handed off gets it from the worker that answers it.
        self.note_head(bufs, ctx);
        // What the decoding found; the request itself (which borrows the buffer) is not
        // needed.
        let input: &mut [u8] = if self.as_read.is_empty() {
            scratch.clear();
            scratch.extend_from_slice(bufs.unconsumed());
            scratch
        } else {
            let input = bufs.unconsumed();
            // Nothing is consumed in a front, so the buffer holds what was kept and the
            // new bytes after it.
            debug_assert!(self.as_read.len() <= input.len());
            let kept = self.as_read.len().min(input.len());
            let new = &input[kept..];
            if self.as_read.capacity() - self.as_read.len() < new.len() {
                // Grown by a quarter rather than doubled: a slow body held beside its
                // buffer costs its size and a quarter more, not twice (each byte is still
                // copied a bounded number of times, five at most).
                self.as_read.reserve_exact(new.len().max(self.as_read.len() / 4));
            }
            self.as_read.extend_from_slice(new);
            bufs.split().0
        };
        let decoded = self.codec.decode(input).map(|d| match d {
            Decoded::Request { .. } => None,
            Decoded::Incomplete { interim } => Some(interim),
        });
        match decoded {
            Ok(None) => Gathered::Whole,
            Ok(Some(interim)) => {
                self.interim(interim, bufs.output());
                if self.as_read.is_empty() {
                    // From now on decoded in place: the bytes as they came, kept.
                    self.as_read.extend_from_slice(bufs.unconsumed());
                }
                Gathered::Step(self.partial(bufs, ctx, peer, now))
            }
            Err(e) => Gathered::Step(self.protocol_error(bufs, ctx, peer, &e)),
        }
    }

    /// Hybrid mode, in a front: the memory of the copy of a request's bytes as they came
    /// (kept while it arrives in several reads), which the event loop's budget of
    /// buffered bytes counts beside the connection's buffer.
    pub(crate) fn kept_capacity(&self) -> usize {
        self.as_read.capacity()
    }

    /// Hybrid mode, in a front, once [`complete`](Requests::complete) said
    /// [`Gathered::Whole`]: the bytes to hand off (the request and anything behind it), as
    /// they came.
    pub(crate) fn as_read<'b>(&'b self, bufs: &'b Buffers) -> &'b [u8] {
        if self.as_read.is_empty() {
            bufs.unconsumed()
        } else {
            &self.as_read
        }
    }

    /// Sends the codec's interim reply, unless the request in progress had it already
    /// (in hybrid mode, from the process that had the connection before).
    fn interim(&mut self, interim: Option<&'static [u8]>, out: &mut Vec<u8>) {
        if let Some(bytes) = interim {
            if !self.interim_sent {
                out.extend_from_slice(bytes);
            }
            self.interim_sent = true;
        }
    }

    /// Decodes the request at the front of the buffer, and handles it if complete.
    fn one(&mut self, bufs: &mut Buffers, handler: &mut dyn Handle<C>, ctx: &mut dyn Context) -> Turn {
        let last = self.open_request(bufs, ctx);
        let (input, out) = bufs.split();
        let held = input.len();
        match self.codec.decode(input) {
            Ok(Decoded::Request { request, len }) => {
                check_decoded(len, held, self.max);
                let mark = out.len();
                let mut res = self.codec.respond(&request, out, last);
                ctx.state(State::Handling);
                let handled = handler.handle(&request, &mut res);
                // The handler penalized the client: whatever the protocol, no more requests
                // on this connection (the next attempt must come through admission).
                let ends = handler.ends_connection();
                let outcome = close_response(res, self.announces_close, last, ends, ctx);
                Turn::Handled {
                    len,
                    mark,
                    last,
                    handled,
                    outcome,
                }
            }
            Ok(Decoded::Incomplete { interim }) => {
                self.interim(interim, out);
                Turn::Incomplete
            }
            Err(e) => Turn::Bad(e),
        }
    }

    /// Async handlers (issue 33): as [`advance`](Requests::advance), the handler awaited
    /// for each request. The same decoding, accounting, deadlines and refusals: only the
    /// call differs, and what may cut it (`--request-timeout`, the client's close).
    pub(crate) async fn advance_async<A: HandleAsync<C>>(
        &mut self,
        bufs: &mut Buffers,
        handler: &mut A,
        ctx: &mut dyn Context,
        peer: &Addr,
        now: &mut dyn FnMut() -> Instant,
    ) -> Next {
        if let Some(linger) = self.after_file.take() {
            return Next::Close { linger };
        }
        let mut answered = 0;
        while bufs.has_input() {
            if answered == PASS_LIMIT {
                return Next::More;
            }
            let turn = self.one_async(bufs, handler, ctx).await;
            match self.after_turn(bufs, ctx, peer, turn) {
                Some(Ok(())) => answered += 1,
                Some(Err(next)) => return next,
                None => break,
            }
        }
        self.after_pass(bufs, ctx, peer, now)
    }

    /// [`one`](Requests::one) with the handler awaited.
    ///
    /// The decoding's result is taken apart before the `.await`, in a statement of its
    /// own: a `match` on it around the call would keep it (a whole HTTP request, 1 KiB)
    /// in the future beside the request moved out of it, for every request in flight.
    async fn one_async<A: HandleAsync<C>>(
        &mut self,
        bufs: &mut Buffers,
        handler: &mut A,
        ctx: &mut dyn Context,
    ) -> Turn {
        let last = self.open_request(bufs, ctx);
        let (input, out) = bufs.split();
        let held = input.len();
        let (request, len) = match self.codec.decode(input) {
            Ok(Decoded::Request { request, len }) => (request, len),
            Ok(Decoded::Incomplete { interim }) => {
                self.interim(interim, out);
                return Turn::Incomplete;
            }
            Err(e) => return Turn::Bad(e),
        };
        check_decoded(len, held, self.max);
        let mark = out.len();
        let mut res = self.codec.respond(&request, out, last);
        ctx.state(State::Handling);
        let (handled, ends) = handler.handle(&request, &mut res).await;
        let handled = match handled {
            Ok(handled) => handled,
            Err(cut) => {
                drop(res);
                return Turn::Cut { len, mark, cut };
            }
        };
        let outcome = close_response(res, self.announces_close, last, ends, ctx);
        Turn::Handled {
            len,
            mark,
            last,
            handled,
            outcome,
        }
    }

    /// An async handler's call was cut: past `--request-timeout`, the codec's error reply
    /// (HTTP 504) and a lingering close; the client gone, a close. The response begun is
    /// dropped, the request consumed: the connection ends either way.
    fn cut(
        &mut self,
        bufs: &mut Buffers,
        ctx: &mut dyn Context,
        peer: &Addr,
        (len, mark): (usize, usize),
        cut: Cut,
    ) -> Next {
        bufs.output().truncate(mark);
        bufs.consume(len);
        match cut {
            Cut::TimedOut(limit) => {
                ctx.state(State::Closing);
                let e = ProtocolError::HandlerTimeout { limit };
                ctx.refused(&e);
                self.rejected = Some((e.clone(), bufs.output().len()));
                self.codec.encode_error(&e, bufs.output());
                // Logged by the worker, once per episode (issue 41).
                Next::Close { linger: Some(LINGER) }
            }
            Cut::Gone => {
                tracing::debug!(
                    "{peer} closed the connection while its request was handled: the request's future is cancelled"
                );
                Next::Close { linger: None }
            }
            Cut::Panicked => {
                // Logged by the worker, which knows the request; in the access log an
                // `error`, as a handler's failure is.
                ctx.request_end((len as u64, 0), false);
                ctx.state(State::Closing);
                Next::Close { linger: None }
            }
        }
    }

    /// What comes before a request is decoded, in both kinds of call: its first bytes to
    /// the context, and whether its response is to be the connection's last.
    fn open_request(&mut self, bufs: &Buffers, ctx: &mut dyn Context) -> bool {
        self.note_head(bufs, ctx);
        // Only a protocol that can tell its client ends a connection between requests:
        // to a client of one that cannot, a close looks like a failure, so its
        // connections last until the client leaves (or a timeout, or the grace period),
        // even while the worker stops or retires.
        self.announces_close
            && (ctx.stopping()
                || self.served + 1 >= self.limits.keepalive_requests
                || ctx.retiring()
                || ctx.saturated())
    }

    /// A request begins ([`Context::request_start`]), or more of its first bytes came
    /// ([`Context::request_head`]).
    fn note_head(&mut self, bufs: &Buffers, ctx: &mut dyn Context) {
        if !self.in_request {
            let input = bufs.unconsumed();
            self.head_len = input.len().min(HEAD_BYTES);
            ctx.request_start(self.head(&input[..self.head_len]));
            self.in_request = true;
        } else if self.head_len < HEAD_BYTES && bufs.unconsumed().len() > self.head_len {
            let input = bufs.unconsumed();
            self.head_len = input.len().min(HEAD_BYTES);
            ctx.request_head(self.head(&input[..self.head_len]));
        }
    }

    /// The request's first bytes `raw` and what is published of them: the codec's summary
    /// (issue 41: a request's bytes may hold credentials, and the status is for anyone who
    /// reaches the metrics listener), or the bytes themselves with `--status-request-detail`.
    /// The one place where what a worker publishes about a request is decided, for every
    /// I/O model.
    fn head<'a>(&'a mut self, raw: &'a [u8]) -> Head<'a> {
        if self.limits.request_detail {
            return Head::same(raw);
        }
        self.summary.clear();
        self.codec.summarize(raw, &mut self.summary);
        Head {
            raw,
            shown: self.summary.as_bytes(),
        }
    }

    /// A request was handled: accounts for it, and says whether the connection goes on
    /// (`None`) or what ends it.
    fn answered(
        &mut self,
        bufs: &mut Buffers,
        ctx: &mut dyn Context,
        (len, mark, last): (usize, usize, bool),
        handled: io::Result<()>,
        outcome: crate::codec::Outcome,
    ) -> Option<Next> {
        self.served += 1;
        self.began = None;
        self.interim_sent = false;
        let file_len = outcome
            .file
            .as_ref()
            .map_or(0, |f| f.range.end.saturating_sub(f.range.start));
        let out_len = bufs.output().len().saturating_sub(mark) as u64 + file_len;
        ctx.request_end((len as u64, out_len), handled.is_ok());
        self.in_request = false;
        if let Err(e) = handled {
            bufs.output().truncate(mark);
            return Some(Next::Fail(e));
        }
        bufs.consume(len);
        self.writing = true;
        let close = if self.draining.is_some() {
            // Answered with the announcement: the client reconnects for the next one.
            Some(Some(STOP_LINGER))
        } else if outcome.close || last {
            // Requests the client pipelined after this one are not answered: close
            // lingering, so that their unread bytes do not make the kernel reset the
            // connection under the response just sent (the client retries them). No
            // cost when nothing is left unread, the usual case.
            Some(bufs.has_input().then_some(LINGER))
        } else {
            None
        };
        match (outcome.file, close) {
            (Some(body), close) => {
                self.after_file = close;
                Some(Next::SendFile(body))
            }
            (None, Some(linger)) => Some(Next::Close { linger }),
            (None, None) => None,
        }
    }

    /// Between requests: drain a stopping worker's connection, or wait for the next one.
    fn at_boundary(&mut self, ctx: &mut dyn Context, now: &mut dyn FnMut() -> Instant) -> Next {
        self.began = None;
        self.last_input = None;
        // Stopping: an HTTP-like connection ends between requests (a connection just
        // accepted gets its first request answered: the client sent it already). Closing
        // it now would race with the request the client may be sending: wait a moment for
        // it, answer it with the close announcement, and close lingering.
        if self.drains(ctx) {
            let now = now();
            let until = *self
                .draining
                .get_or_insert_with(|| now + self.limits.drain_wait());
            let left = until.saturating_duration_since(now);
            if left < MIN_WAIT {
                return Next::Close {
                    linger: Some(Duration::ZERO),
                };
            }
            ctx.state(State::Finishing);
            return self.read(Wait::Drain, Some(left));
        }
        // Only a keep-alive connection, one that was served already, can be given up: a
        // new connection whose first request has not arrived yet (a client that is slow
        // to send, a loaded machine) would see its request dropped.
        let grace = if self.announces_close {
            IDLE_GRACE
        } else {
            IDLE_GRACE_SILENT
        };
        self.wait = Wait::Idle;
        Next::Read {
            wait: Wait::Idle,
            timeout: self.limits.keepalive_timeout,
            guarded: self.served > 0,
            grace,
        }
    }

    /// In the middle of a request: refuse one too large or too slow, else read on.
    fn partial(
        &mut self,
        bufs: &mut Buffers,
        ctx: &mut dyn Context,
        peer: &Addr,
        now: &mut dyn FnMut() -> Instant,
    ) -> Next {
        let pending = bufs.unconsumed().len();
        // The clock is read only here, for a request split across reads.
        let now = now();
        if self.wait != Wait::Request {
            // The request's first bytes (or the first since a boundary): the read timeout
            // counts from now.
            self.last_input = Some(now);
        }
        if pending >= self.max {
            let e = ProtocolError::TooLarge {
                what: "request",
                limit: self.max,
            };
            return self.protocol_error(bufs, ctx, peer, &e);
        }
        if self.limits.header_timeout.is_some() {
            self.began.get_or_insert(now);
            if self.too_slow(pending, now) {
                return self.slow_request(bufs, ctx, peer, now);
            }
        }
        // Kept while the kind of wait stays: the timeout depends on the limits only.
        self.read(Wait::Request, self.limits.request_wait())
    }

    /// Refuses a request too slow for the header timeout (the details at debug level: the
    /// protocol error logs the one info line).
    fn slow_request(&mut self, bufs: &mut Buffers, ctx: &mut dyn Context, peer: &Addr, now: Instant) -> Next {
        if let Some(began) = self.began {
            tracing::debug!(
                "{peer} sent {} bytes of a request in {:?}: too slow (--header-timeout, --min-rate)",
                bufs.unconsumed().len(),
                now.duration_since(began)
            );
        }
        self.protocol_error(bufs, ctx, peer, &ProtocolError::Timeout)
    }

    /// Whether a request of `pending` bytes so far is over the header timeout at `now`:
    /// like Apache's mod_reqtimeout, it must be complete within the limit of its first
    /// bytes, plus one second per `min_rate` bytes received, up to `header_timeout_max`
    /// (never below the limit itself).
    fn too_slow(&self, pending: usize, now: Instant) -> bool {
        let (Some(limit), Some(began)) = (self.limits.header_timeout, self.began) else {
            return false;
        };
        let earned = match self.limits.min_rate {
            0 => Duration::ZERO,
            rate => Duration::from_secs_f64(pending as f64 / rate as f64),
        };
        let allowed = match self.limits.header_timeout_max {
            Some(max) => (limit + earned).min(max.max(limit)),
            None => limit + earned,
        };
        now + SLACK >= began + allowed
    }

    fn read(&mut self, wait: Wait, timeout: Option<Duration>) -> Next {
        self.wait = wait;
        Next::Read {
            wait,
            timeout,
            guarded: false,
            grace: Duration::ZERO,
        }
    }

    /// The wait's socket timeout expired at `now`: close an idle connection, refuse a
    /// request whose deadline has passed, or wait on.
    pub(crate) fn timed_out(
        &mut self,
        bufs: &mut Buffers,
        ctx: &mut dyn Context,
        peer: &Addr,
        now: Instant,
    ) -> Next {
        match self.wait {
            // An idle keep-alive connection timed out: close it quietly.
            Wait::Idle => Next::Close { linger: None },
            Wait::Drain => Next::Close {
                linger: Some(Duration::ZERO),
            },
            Wait::Request => {
                let pending = bufs.unconsumed().len();
                let since = self.last_input.unwrap_or(now);
                let read_timeout_passed = self.limits.read_timeout.is_some_and(|t| now + SLACK >= since + t);
                // Without a header timeout, the socket's timeout is the read timeout.
                if self.limits.header_timeout.is_none() || read_timeout_passed {
                    return self.protocol_error(bufs, ctx, peer, &ProtocolError::Timeout);
                }
                if self.too_slow(pending, now) {
                    return self.slow_request(bufs, ctx, peer, now);
                }
                self.read(Wait::Request, self.limits.request_wait())
            }
        }
    }

    /// The peer closed its side (a read returned end of file).
    pub(crate) fn peer_closed(&mut self, bufs: &Buffers) -> Next {
        if !bufs.has_input() {
            // Between requests (or while draining): the client is done.
            Next::Close { linger: None }
        } else {
            Next::Fail(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the client closed the connection in the middle of a request",
            ))
        }
    }

    /// Bad input: the codec's error reply, then a lingering close; logged once, here.
    ///
    /// The close lingers: the connection is shut for writing (the reply is followed by a
    /// FIN), then what the client still sends is read and discarded for a moment. Closing
    /// a socket with unread input makes the kernel send a reset, which can destroy the
    /// reply before the client reads it (a 413 sent while the client is still uploading
    /// its body).
    fn protocol_error(
        &mut self,
        bufs: &mut Buffers,
        ctx: &mut dyn Context,
        peer: &Addr,
        e: &ProtocolError,
    ) -> Next {
        tracing::info!("bad request from {peer}: {e}; closing the connection");
        self.reply_and_close(bufs, ctx, e)
    }

    /// The codec's error reply for `e` and a lingering close, unlogged (the caller logs).
    fn reply_and_close(&mut self, bufs: &mut Buffers, ctx: &mut dyn Context, e: &ProtocolError) -> Next {
        ctx.state(State::Closing);
        ctx.refused(e);
        self.rejected = Some((e.clone(), bufs.output().len()));
        self.codec.encode_error(e, bufs.output());
        Next::Close { linger: Some(LINGER) }
    }

    /// Refuses the request in progress for want of memory (an event loop or an async worker
    /// at its budget of buffered bytes): the codec's refusal for `why` (HTTP 503 with
    /// `Retry-After`), then a lingering close, as for bad input; logged once per episode by
    /// the budget, not once per connection.
    pub(crate) fn shed(
        &mut self,
        bufs: &mut Buffers,
        ctx: &mut dyn Context,
        peer: &Addr,
        why: &'static str,
    ) -> Next {
        // At debug level: the budget's episode has its own line (worker/budget.rs), and a
        // flood would otherwise log one line per connection refused (2,800 in one trial of
        // issue 41). The access log still has each refused request.
        tracing::debug!("{peer} refused at the budget of buffered bytes; closing the connection");
        self.reply_and_close(bufs, ctx, &ProtocolError::Refused(why.into()))
    }

    /// Refuses the connection before any request: the codec's error reply for `why`
    /// (HTTP 503, `-ERR refused: …`) goes into the output buffer.
    pub(crate) fn refuse(&mut self, bufs: &mut Buffers, why: &'static str) {
        self.codec
            .encode_error(&ProtocolError::Refused(why.into()), bufs.output());
    }
}

#[cfg(test)]
mod tests {
    //! The request step with byte inputs and a clock given by the test: no socket, no
    //! waiting.
    use std::io::Write;

    use super::*;
    use crate::codec::{Http, HttpRequest, HttpResponse, Lines, LinesResponse};

    /// A worker context whose answers the test sets.
    #[derive(Default)]
    struct Fake {
        saturated: bool,
        stopping: bool,
        started: usize,
        ended: usize,
        /// Each head given (start or more), as (raw, shown).
        heads: Vec<(Vec<u8>, Vec<u8>)>,
    }

    impl Context for Fake {
        fn saturated(&mut self) -> bool {
            self.saturated
        }
        fn stopping(&mut self) -> bool {
            self.stopping
        }
        fn request_start(&mut self, head: Head<'_>) {
            self.started += 1;
            self.heads.push((head.raw.to_vec(), head.shown.to_vec()));
        }
        fn request_head(&mut self, head: Head<'_>) {
            self.heads.push((head.raw.to_vec(), head.shown.to_vec()));
        }
        fn request_end(&mut self, _: (u64, u64), _: bool) {
            self.ended += 1;
        }
    }

    /// Answers every HTTP request with "hi", or fails when the path is /fail.
    struct Hello;

    impl Handle<Http> for Hello {
        fn handle(&mut self, req: &HttpRequest<'_>, res: &mut HttpResponse<'_>) -> io::Result<()> {
            if req.path() == "/fail" {
                res.write_all(b"half a respon")?;
                return Err(io::Error::other("the handler failed"));
            }
            res.write_all(b"hi")
        }
    }

    /// Echoes each line.
    struct Echo;

    impl Handle<Lines> for Echo {
        fn handle(&mut self, line: &crate::codec::Line<'_>, res: &mut LinesResponse<'_>) -> io::Result<()> {
            res.push(line);
            res.push(b"\n");
            Ok(())
        }
    }

    const LIMITS: Limits = Limits {
        keepalive_timeout: Some(Duration::from_secs(5)),
        read_timeout: Some(Duration::from_secs(60)),
        keepalive_requests: 1000,
        header_timeout: Some(Duration::from_secs(20)),
        header_timeout_max: Some(Duration::from_secs(60)),
        min_rate: 500,
        request_detail: false,
    };

    const GET: &[u8] = b"GET /x HTTP/1.1\r\nHost: example\r\n\r\n";

    /// A connection's request level with its buffers and context.
    struct Conn<C: Codec> {
        step: Requests<C>,
        bufs: Buffers,
        ctx: Fake,
        peer: Addr,
        t0: Instant,
    }

    impl<C: Codec> Conn<C> {
        fn new(codec: C, limits: Limits) -> Self {
            let t0 = Instant::now();
            Conn {
                step: Requests::new(codec, limits),
                bufs: Buffers::new(),
                ctx: Fake::default(),
                peer: Addr::Unix(None),
                t0,
            }
        }

        /// `bytes` arrive `at` after the accept; the step answers what it can.
        fn feed(&mut self, bytes: &[u8], at: Duration, handler: &mut dyn Handle<C>) -> Next {
            let mut left = bytes;
            while !left.is_empty() {
                let room = self.bufs.room(usize::MAX);
                let n = room.len().min(left.len());
                room[..n].copy_from_slice(&left[..n]);
                self.bufs.filled(n);
                left = &left[n..];
            }
            let now = self.t0 + at;
            self.step.received(&mut || now);
            self.step
                .advance(&mut self.bufs, handler, &mut self.ctx, &self.peer, &mut || now)
        }

        /// The wait's socket timeout expired `at` after the accept.
        fn timeout(&mut self, at: Duration) -> Next {
            self.step
                .timed_out(&mut self.bufs, &mut self.ctx, &self.peer, self.t0 + at)
        }

        /// The output the driver would send now, taken.
        fn sent(&mut self) -> String {
            let out = String::from_utf8(std::mem::take(self.bufs.output())).unwrap();
            self.step.output_sent(&mut self.ctx);
            out
        }
    }

    fn is_idle_read(next: &Next) -> bool {
        matches!(next, Next::Read { wait: Wait::Idle, .. })
    }

    fn is_request_read(next: &Next) -> bool {
        matches!(
            next,
            Next::Read {
                wait: Wait::Request,
                ..
            }
        )
    }

    /// A response without its Date line (which may change between two runs).
    fn dateless(response: &str) -> String {
        response
            .lines()
            .filter(|l| !l.starts_with("Date:"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Hybrid mode, in a front: `bytes` arrive; the step says whether the request is whole.
    fn front_feed<C: Codec>(c: &mut Conn<C>, scratch: &mut Vec<u8>, bytes: &[u8]) -> Gathered {
        let mut left = bytes;
        while !left.is_empty() {
            let room = c.bufs.room(c.step.max_request_size());
            assert!(!room.is_empty(), "the buffer is full");
            let n = room.len().min(left.len());
            room[..n].copy_from_slice(&left[..n]);
            c.bufs.filled(n);
            left = &left[n..];
        }
        let now = c.t0;
        c.step.received(&mut || now);
        c.step
            .complete(&mut c.bufs, scratch, &mut c.ctx, &c.peer, &mut || now)
    }

    /// Answers each HTTP request with its body's length and a sum of its bytes.
    struct Sum;

    impl Handle<Http> for Sum {
        fn handle(&mut self, req: &HttpRequest<'_>, res: &mut HttpResponse<'_>) -> io::Result<()> {
            let sum: u64 = req.body().iter().map(|b| u64::from(*b)).sum();
            write!(res, "{} {sum}", req.body().len())
        }
    }

    /// Issue 31: a front gathers a request whole, whatever its size (a chunked body of
    /// 200 KB, arriving in 1,500-byte reads behind `Expect: 100-continue`), sends the
    /// interim reply once, and hands off the bytes as they came (the chunk framing
    /// included), although the codec de-chunked its buffer in place; the worker's step
    /// answers them, and the request pipelined behind.
    #[test]
    fn issue_31_a_front_gathers_a_large_body_and_hands_off_the_bytes_as_they_came() {
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut sent =
            b"POST /up HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec();
        for chunk in body.chunks(1000) {
            sent.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            sent.extend_from_slice(chunk);
            sent.extend_from_slice(b"\r\n");
        }
        sent.extend_from_slice(b"0\r\n\r\n");
        sent.extend_from_slice(GET);
        let mut front = Conn::new(Http::default(), LIMITS);
        let mut scratch = Vec::new();
        let pieces: Vec<&[u8]> = sent.chunks(1500).collect();
        let mut output = String::new();
        for (i, piece) in pieces.iter().enumerate() {
            let next = front_feed(&mut front, &mut scratch, piece);
            output.push_str(&front.sent());
            if i + 1 < pieces.len() {
                assert!(
                    matches!(&next, Gathered::Step(n) if is_request_read(n)),
                    "piece {i}: {next:?}"
                );
            } else {
                assert!(matches!(next, Gathered::Whole), "{next:?}");
            }
            // Another connection's request meanwhile: the scratch is the front's.
            scratch.clear();
            scratch.extend_from_slice(b"garbage");
        }
        assert_eq!(output, "HTTP/1.1 100 Continue\r\n\r\n", "the interim reply, once");
        let handed = front.step.as_read(&front.bufs).to_vec();
        assert!(handed == sent, "the bytes as they came");

        let mut worker = Conn::new(Http::default(), LIMITS);
        let next = worker.feed(&handed, Duration::ZERO, &mut Sum);
        assert!(is_idle_read(&next), "{next:?}");
        let out = worker.sent();
        let sum: u64 = body.iter().map(|b| u64::from(*b)).sum();
        assert!(out.contains(&format!("\r\n\r\n200000 {sum}")), "{out}");
        assert!(
            !out.contains("100 Continue"),
            "no interim reply to a whole request: {out}"
        );
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
    }

    /// Issue 31: a connection handed over with the beginning of a request whose interim
    /// reply went out already (a hybrid worker hands it back to a front) does not get it
    /// twice; the next request gets its own.
    #[test]
    fn issue_31_an_interim_reply_sent_before_a_hand_over_is_not_sent_again() {
        const HEAD: &[u8] =
            b"POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n";
        // In a front.
        let mut front = Conn::new(Http::default(), LIMITS);
        front.step.resume(4, true);
        let next = front_feed(&mut front, &mut Vec::new(), HEAD);
        assert!(
            matches!(&next, Gathered::Step(n) if is_request_read(n)),
            "{next:?}"
        );
        assert_eq!(front.sent(), "");
        // In a worker: not for this request, again for the next.
        let mut worker = Conn::new(Http::default(), LIMITS);
        worker.step.resume(4, true);
        let next = worker.feed(HEAD, Duration::ZERO, &mut Hello);
        assert!(is_request_read(&next), "{next:?}");
        assert_eq!(worker.sent(), "");
        worker.feed(b"abc", Duration::ZERO, &mut Hello);
        assert!(worker.sent().starts_with("HTTP/1.1 200 OK"));
        worker.feed(HEAD, Duration::ZERO, &mut Hello);
        assert_eq!(worker.sent(), "HTTP/1.1 100 Continue\r\n\r\n");
        assert!(worker.step.interim_sent(), "and travels with this one if it goes");
    }

    #[test]
    fn a_request_split_at_every_byte_boundary_gets_the_same_one_response() {
        let mut whole = Conn::new(Http::default(), LIMITS);
        let next = whole.feed(GET, Duration::ZERO, &mut Hello);
        assert!(is_idle_read(&next), "{next:?}");
        let expected = dateless(&whole.sent());
        assert!(expected.starts_with("HTTP/1.1 200 OK"), "{expected}");
        for split in 1..GET.len() {
            let mut c = Conn::new(Http::default(), LIMITS);
            let next = c.feed(&GET[..split], Duration::ZERO, &mut Hello);
            assert!(is_request_read(&next), "split at {split}: {next:?}");
            assert!(
                c.bufs.output().is_empty(),
                "nothing answered before the request is whole"
            );
            let next = c.feed(&GET[split..], Duration::from_millis(1), &mut Hello);
            assert!(is_idle_read(&next), "split at {split}: {next:?}");
            assert_eq!(dateless(&c.sent()), expected, "split at {split}");
            assert_eq!(c.step.served(), 1);
        }
    }

    #[test]
    fn a_request_that_arrives_a_byte_at_a_time_is_answered_once() {
        let mut c = Conn::new(Http::default(), LIMITS);
        for (i, b) in GET.iter().enumerate() {
            let next = c.feed(&[*b], Duration::from_millis(i as u64), &mut Hello);
            if i + 1 < GET.len() {
                assert!(is_request_read(&next), "byte {i}: {next:?}");
            } else {
                assert!(is_idle_read(&next), "{next:?}");
            }
        }
        assert_eq!(c.sent().matches("200 OK").count(), 1);
        assert_eq!((c.ctx.started, c.ctx.ended), (1, 1));
    }

    #[test]
    fn a_pipelined_batch_is_answered_in_order_with_one_output() {
        let mut c = Conn::new(Lines::default(), LIMITS);
        let next = c.feed(b"one\ntwo\nthree\nfo", Duration::ZERO, &mut Echo);
        assert!(is_request_read(&next), "the fourth is incomplete: {next:?}");
        assert_eq!(c.sent(), "one\ntwo\nthree\n");
        assert_eq!(c.step.served(), 3);
        let next = c.feed(b"ur\n", Duration::from_millis(1), &mut Echo);
        assert!(is_idle_read(&next), "{next:?}");
        assert_eq!(c.sent(), "four\n");
    }

    #[test]
    fn a_long_pipelined_batch_is_answered_a_pass_at_a_time() {
        let mut c = Conn::new(Lines::default(), LIMITS);
        let batch = "x\n".repeat(PASS_LIMIT as usize * 2 + 1);
        let next = c.feed(batch.as_bytes(), Duration::ZERO, &mut Echo);
        assert!(matches!(next, Next::More), "{next:?}");
        assert_eq!(c.sent().len(), PASS_LIMIT as usize * 2, "one pass's responses");
        let mut now = || c.t0;
        let next = c
            .step
            .advance(&mut c.bufs, &mut Echo, &mut c.ctx, &c.peer, &mut now);
        assert!(matches!(next, Next::More), "{next:?}");
        let next = c
            .step
            .advance(&mut c.bufs, &mut Echo, &mut c.ctx, &c.peer, &mut now);
        assert!(is_idle_read(&next), "{next:?}");
        assert_eq!(c.step.served(), PASS_LIMIT * 2 + 1);
    }

    #[test]
    fn a_slow_header_that_is_complete_within_the_deadline_is_served() {
        let limits = Limits {
            header_timeout: Some(Duration::from_secs(1)),
            header_timeout_max: None,
            min_rate: 0,
            ..LIMITS
        };
        let mut c = Conn::new(Http::default(), limits);
        let next = c.feed(&GET[..10], Duration::ZERO, &mut Hello);
        // The socket waits a tick (a quarter of the header timeout), whatever arrives.
        let Next::Read {
            wait: Wait::Request,
            timeout: Some(tick),
            ..
        } = next
        else {
            panic!("{next:?}")
        };
        assert_eq!(tick, Duration::from_millis(250));
        // The tick expires: not the deadline yet, the wait goes on (same kind: no new
        // socket timeout).
        assert!(is_request_read(&c.timeout(Duration::from_millis(500))));
        let next = c.feed(&GET[10..], Duration::from_millis(900), &mut Hello);
        assert!(is_idle_read(&next), "{next:?}");
        assert!(c.sent().starts_with("HTTP/1.1 200 OK"));
    }

    #[test]
    fn a_slow_header_past_the_deadline_gets_408_and_a_lingering_close() {
        let limits = Limits {
            header_timeout: Some(Duration::from_secs(1)),
            header_timeout_max: None,
            min_rate: 0,
            ..LIMITS
        };
        // Seen when the tick expires...
        let mut c = Conn::new(Http::default(), limits.clone());
        c.feed(&GET[..10], Duration::ZERO, &mut Hello);
        let next = c.timeout(Duration::from_millis(1000));
        assert!(matches!(next, Next::Close { linger: Some(LINGER) }), "{next:?}");
        assert!(c.sent().starts_with("HTTP/1.1 408"));
        // ... and when bytes keep coming, a byte at a time, too slowly.
        let mut c = Conn::new(Http::default(), limits);
        let mut at = Duration::ZERO;
        let mut last = None;
        for b in &GET[..20] {
            let next = c.feed(&[*b], at, &mut Hello);
            if !is_request_read(&next) {
                last = Some((at, next));
                break;
            }
            at += Duration::from_millis(100);
        }
        let (at, next) = last.expect("the trickle was stopped");
        assert!(
            at >= Duration::from_millis(990) && at <= Duration::from_millis(1100),
            "{at:?}"
        );
        assert!(matches!(next, Next::Close { linger: Some(LINGER) }), "{next:?}");
        assert!(c.sent().starts_with("HTTP/1.1 408"));
    }

    #[test]
    fn min_rate_earns_a_slow_request_more_time() {
        let limits = Limits {
            header_timeout: Some(Duration::from_secs(1)),
            header_timeout_max: None,
            min_rate: 10, // 20 bytes earn two more seconds
            ..LIMITS
        };
        let mut c = Conn::new(Http::default(), limits);
        c.feed(&GET[..20], Duration::ZERO, &mut Hello);
        assert!(is_request_read(&c.timeout(Duration::from_millis(2500))));
        let next = c.timeout(Duration::from_millis(3000));
        assert!(matches!(next, Next::Close { .. }), "{next:?}");
    }

    /// Issue 31: bytes sent early earned their whole credit at once (990 KB at 500 bytes/s:
    /// 1,980 s), after which a byte every few seconds kept the request alive for half an
    /// hour. The credit now stops at `--header-timeout-max`, however the bytes are spread.
    #[test]
    fn issue_31_the_min_rate_credit_stops_at_the_maximum() {
        let limits = Limits {
            header_timeout: Some(Duration::from_secs(1)),
            header_timeout_max: Some(Duration::from_secs(3)),
            read_timeout: Some(Duration::from_secs(2)),
            min_rate: 1, // 20 bytes earn 20 more seconds, but 3 s is the most
            ..LIMITS
        };
        let mut c = Conn::new(Http::default(), limits);
        c.feed(&GET[..20], Duration::ZERO, &mut Hello);
        // A byte every 1.5 s: under the read timeout, never enough to finish.
        c.feed(&GET[20..21], Duration::from_millis(1500), &mut Hello);
        assert!(is_request_read(&c.timeout(Duration::from_millis(2500))));
        c.feed(&GET[21..22], Duration::from_millis(2900), &mut Hello);
        let next = c.timeout(Duration::from_millis(3000));
        assert!(matches!(next, Next::Close { .. }), "{next:?}");
        assert!(c.sent().starts_with("HTTP/1.1 408"), "{}", c.sent());
    }

    #[test]
    fn the_read_timeout_counts_from_the_last_bytes() {
        let limits = Limits {
            read_timeout: Some(Duration::from_secs(2)),
            ..LIMITS
        };
        let mut c = Conn::new(Http::default(), limits);
        c.feed(&GET[..5], Duration::ZERO, &mut Hello);
        c.feed(&GET[5..10], Duration::from_millis(1500), &mut Hello);
        assert!(is_request_read(&c.timeout(Duration::from_millis(3000))));
        let next = c.timeout(Duration::from_millis(3500));
        assert!(matches!(next, Next::Close { .. }), "{next:?}");
        assert!(c.sent().starts_with("HTTP/1.1 408"));
        // Without a header timeout the socket's timeout is the read timeout itself.
        let limits = Limits {
            header_timeout: None,
            read_timeout: Some(Duration::from_secs(2)),
            ..LIMITS
        };
        let mut c = Conn::new(Http::default(), limits);
        let next = c.feed(&GET[..5], Duration::ZERO, &mut Hello);
        assert!(
            matches!(next, Next::Read { timeout: Some(t), .. } if t == Duration::from_secs(2)),
            "{next:?}"
        );
        assert!(matches!(c.timeout(Duration::from_secs(2)), Next::Close { .. }));
    }

    /// Review of issue 15: with a read timeout that is not a whole number of header ticks,
    /// a stalled request was refused at the next tick after its read timeout.
    #[test]
    fn a_read_timeout_between_two_ticks_ends_on_time() {
        let limits = Limits {
            read_timeout: Some(Duration::from_millis(1500)),
            ..LIMITS
        };
        let mut c = Conn::new(Http::default(), limits);
        let next = c.feed(&GET[..5], Duration::ZERO, &mut Hello);
        assert!(
            matches!(next, Next::Read { timeout: Some(t), .. } if t == Duration::from_millis(750)),
            "{next:?}"
        );
        assert!(is_request_read(&c.timeout(Duration::from_millis(750))));
        let next = c.timeout(Duration::from_millis(1500));
        assert!(matches!(next, Next::Close { .. }), "{next:?}");
    }

    #[test]
    fn an_idle_keep_alive_connection_that_times_out_closes_quietly() {
        let mut c = Conn::new(Http::default(), LIMITS);
        c.feed(GET, Duration::ZERO, &mut Hello);
        c.sent();
        let next = c.timeout(Duration::from_secs(5));
        assert!(matches!(next, Next::Close { linger: None }), "{next:?}");
        assert!(c.sent().is_empty(), "no error reply between requests");
    }

    #[test]
    fn the_keepalive_request_limit_announces_the_close_on_the_last_response() {
        let limits = Limits {
            keepalive_requests: 2,
            ..LIMITS
        };
        let mut c = Conn::new(Http::default(), limits);
        assert!(is_idle_read(&c.feed(GET, Duration::ZERO, &mut Hello)));
        assert!(!c.sent().contains("Connection: close"));
        let next = c.feed(GET, Duration::from_millis(1), &mut Hello);
        assert!(matches!(next, Next::Close { linger: None }), "{next:?}");
        assert!(c.sent().contains("Connection: close"));
    }

    #[test]
    fn requests_pipelined_after_the_last_response_are_not_answered_and_the_close_lingers() {
        let limits = Limits {
            keepalive_requests: 1,
            ..LIMITS
        };
        let mut c = Conn::new(Http::default(), limits);
        let two = [GET, GET].concat();
        let next = c.feed(&two, Duration::ZERO, &mut Hello);
        assert!(matches!(next, Next::Close { linger: Some(LINGER) }), "{next:?}");
        assert_eq!(c.sent().matches("200 OK").count(), 1);
    }

    #[test]
    fn on_a_saturated_pool_http_announces_the_close_and_lines_do_not() {
        let mut c = Conn::new(Http::default(), LIMITS);
        c.ctx.saturated = true;
        let next = c.feed(&[GET, GET].concat(), Duration::ZERO, &mut Hello);
        assert!(matches!(next, Next::Close { .. }), "{next:?}");
        let out = c.sent();
        assert_eq!(out.matches("200 OK").count(), 1, "{out}");
        assert!(out.contains("Connection: close"), "{out}");
        let mut c = Conn::new(Lines::default(), LIMITS);
        c.ctx.saturated = true;
        assert!(is_idle_read(&c.feed(b"a\nb\n", Duration::ZERO, &mut Echo)));
        assert_eq!(c.sent(), "a\nb\n");
    }

    #[test]
    fn a_stopping_worker_drains_an_idle_connection_then_closes() {
        let mut c = Conn::new(Http::default(), LIMITS);
        c.feed(GET, Duration::ZERO, &mut Hello);
        c.sent();
        c.ctx.stopping = true;
        let next = c.feed(b"", Duration::from_millis(10), &mut Hello);
        let Next::Read {
            wait: Wait::Drain,
            timeout: Some(left),
            ..
        } = next
        else {
            panic!("{next:?}")
        };
        assert!(left <= DRAIN_WAIT, "{left:?}");
        // A request within the drain wait is answered with the announcement.
        let next = c.feed(GET, Duration::from_millis(20), &mut Hello);
        assert!(
            matches!(
                next,
                Next::Close {
                    linger: Some(STOP_LINGER)
                }
            ),
            "{next:?}"
        );
        assert!(c.sent().contains("Connection: close"));
        // No request: the wait ends, the connection closes.
        let mut c = Conn::new(Http::default(), LIMITS);
        c.feed(GET, Duration::ZERO, &mut Hello);
        c.ctx.stopping = true;
        c.feed(b"", Duration::from_millis(10), &mut Hello);
        let next = c.timeout(Duration::from_millis(1010));
        assert!(
            matches!(
                next,
                Next::Close {
                    linger: Some(Duration::ZERO)
                }
            ),
            "{next:?}"
        );
    }

    #[test]
    fn a_request_too_large_gets_the_error_reply() {
        let mut c = Conn::new(Lines::new(16), LIMITS);
        let next = c.feed(b"this line never ends", Duration::ZERO, &mut Echo);
        assert!(matches!(next, Next::Close { linger: Some(LINGER) }), "{next:?}");
        assert!(c.sent().starts_with("-ERR"), "the codec's error reply");
    }

    #[test]
    fn malformed_input_gets_the_codecs_error_reply() {
        let mut c = Conn::new(Http::default(), LIMITS);
        let next = c.feed(b"GET / HTTP/1.1\nHost: x\n\n", Duration::ZERO, &mut Hello);
        assert!(matches!(next, Next::Close { linger: Some(LINGER) }), "{next:?}");
        assert!(c.sent().starts_with("HTTP/1.1 400"));
    }

    #[test]
    fn a_handler_error_drops_its_partial_response_and_ends_the_connection() {
        let mut c = Conn::new(Http::default(), LIMITS);
        let next = c.feed(
            b"GET /fail HTTP/1.1\r\nHost: x\r\n\r\n",
            Duration::ZERO,
            &mut Hello,
        );
        assert!(
            matches!(next, Next::Fail(ref e) if e.to_string() == "the handler failed"),
            "{next:?}"
        );
        assert!(c.sent().is_empty(), "half a response is never sent");
    }

    #[test]
    fn the_peer_closing_between_requests_is_an_end_and_in_the_middle_an_error() {
        let mut c = Conn::new(Http::default(), LIMITS);
        c.feed(GET, Duration::ZERO, &mut Hello);
        assert!(matches!(
            c.step.peer_closed(&c.bufs),
            Next::Close { linger: None }
        ));
        c.feed(&GET[..4], Duration::ZERO, &mut Hello);
        let next = c.step.peer_closed(&c.bufs);
        assert!(
            matches!(next, Next::Fail(ref e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "{next:?}"
        );
    }

    #[test]
    fn a_new_connection_waits_for_its_first_request_or_answers_what_came_with_it() {
        let mut c = Conn::new(Http::default(), LIMITS);
        let next = c.step.first_read();
        assert!(
            matches!(
                next,
                Next::Read {
                    wait: Wait::Idle,
                    guarded: false,
                    ..
                }
            ),
            "{next:?}"
        );
        // Bytes read with a PROXY header, before the level began.
        let mut c = Conn::new(Http::default(), LIMITS);
        let next = c.feed(GET, Duration::ZERO, &mut Hello);
        assert!(matches!(next, Next::Read { guarded: true, .. }), "{next:?}");
        assert!(c.sent().starts_with("HTTP/1.1 200 OK"));
    }

    #[test]
    fn only_a_served_connection_is_guarded() {
        let mut c = Conn::new(Http::default(), LIMITS);
        let next = c.feed(b"", Duration::ZERO, &mut Hello);
        assert!(matches!(next, Next::Read { guarded: false, .. }), "{next:?}");
        let next = c.feed(GET, Duration::ZERO, &mut Hello);
        assert!(
            matches!(next, Next::Read { guarded: true, grace, .. } if grace == IDLE_GRACE),
            "{next:?}"
        );
    }

    /// Issue 41: what the worker is given to publish about a request is its codec's
    /// summary, as the request comes in pieces, and the first bytes only with
    /// `--status-request-detail`; the access log's bytes are the request's as they came.
    #[test]
    fn issue_41_the_worker_publishes_the_codecs_summary_unless_asked_for_detail() {
        let request =
            b"GET /sleep?pw=SECRETPW HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer SECRETTOKEN\r\n\r\n";
        for detail in [false, true] {
            let limits = Limits {
                request_detail: detail,
                ..LIMITS
            };
            let mut c = Conn::new(Http::default(), limits);
            c.feed(&request[..8], Duration::ZERO, &mut Hello);
            c.feed(&request[8..20], Duration::from_millis(1), &mut Hello);
            c.feed(&request[20..], Duration::from_millis(2), &mut Hello);
            assert_eq!(c.ctx.ended, 1);
            let (raw, shown): (Vec<_>, Vec<_>) = c.ctx.heads.iter().cloned().unzip();
            assert_eq!(raw, [&request[..8], &request[..20], &request[..64]]);
            if detail {
                assert_eq!(shown, raw);
            } else {
                assert_eq!(shown, [&b"GET /sle"[..], b"GET /sleep", b"GET /sleep"]);
            }
        }
        // A codec that says nothing: nothing published.
        let mut c = Conn::new(Lines::default(), LIMITS);
        c.feed(b"AUTH PLAIN SECRET\n", Duration::ZERO, &mut Echo);
        assert_eq!(c.ctx.heads, [(b"AUTH PLAIN SECRET\n".to_vec(), Vec::new())]);
    }
}

//! The request level of the async driver ([`RequestsOf`]): the request step's loop over
//! one connection, its handler call raced with the request timeout and the client's
//! close ([`Bound`]), and the worker's side of the step ([`TaskContext`]).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::panic::AssertUnwindSafe;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio::io::unix::AsyncFd;

use crate::codec::Codec;
use crate::conn::buffers::{BUFFER_SIZE, Buffers};
use crate::conn::context::{Conn, ConnInfo};
use crate::conn::send_watch::Pace;
use crate::conn::step::{Cut, HandleAsync, Next, Requests, Wait};
use crate::conn::transport::Transport;
use crate::handler::AsyncRequestHandler;
use crate::net::listener::Addr;
use crate::scoreboard::HEAD_BYTES;

use super::bytes::{bounded, cut_for_deadline, read_some, send_file, write_out};
use super::run::Level;
use super::worker::{Label, Worker};
use crate::conn::async_transport::{gone, hung_up, linger, write_records};
use crate::worker::budget::{self, Budget};
use crate::worker::ledger::{log_connection_error, panic_message};
use crate::worker::life::{Ended, Life, Unit};
use crate::worker::serve::{Context, Head, Limits};

/// The most memory a connection's buffers keep between requests (more is given back).
pub(super) const KEEP_BUFFERS: usize = 2048;

/// The request level's side: the user's handler and the connection it answers.
pub(super) struct RequestsOf<'h, H> {
    pub(super) handler: &'h H,
}

impl<H: AsyncRequestHandler> Level for RequestsOf<'_, H> {
    fn refusal(&self) -> String {
        budget::refusal_words(self.handler.codec())
    }

    fn unit(&self) -> Unit {
        Unit::Requests
    }

    async fn serve(
        &self,
        w: &Worker<'_>,
        mut io: AsyncFd<Transport>,
        peer: &Addr,
        id: u64,
        mut bufs: Buffers,
        label: &Label,
        life: Life,
    ) {
        let mut step = Requests::new(self.handler.codec(), w.step_limits.clone());
        let mut session = H::Session::default();
        let mut ctx = TaskContext::new(w, peer, label, life);
        // `--write-timeout`, or `--min-send-rate`'s watch, for every write of the output.
        let mut pace = Pace::new(w.limits.min_send_rate, w.limits.write_timeout);
        let mut next = if bufs.has_input() || io.get_mut().input_pending() {
            Next::More
        } else {
            step.first_read()
        };
        // One place for each kind of wait (the output's write, the read, the step's call):
        // each `.await` site keeps its future in the connection's, and sites of the same
        // call are not always laid over each other, so the loop has one of each. The rare
        // ones (a file, a lingering close) are boxed: a connection pays for them only
        // while it sends a file or lingers.
        let mut side = ReadSide {
            held: Held {
                w,
                bytes: Cell::new(0),
            },
            paused: false,
            unread: Cell::new(false),
        };
        let end: Option<io::Error> = loop {
            side.held.set(bufs.held());
            if let Next::Fail(e) = next {
                break Some(e);
            }
            // Every other move sends the output first.
            match write_out(w, &mut io, &mut bufs, &mut pace).await {
                Ok(n) => ctx.sent += n,
                Err(e) => {
                    cut_for_deadline(&io, &e);
                    break Some(e);
                }
            }
            step.output_sent(&mut ctx);
            let then = match next {
                read @ Next::Read { wait, timeout, .. } => {
                    let got = read_next(
                        &mut io,
                        &mut bufs,
                        &mut step,
                        &mut ctx,
                        &mut side,
                        (wait, timeout),
                    )
                    .await;
                    took(got, &mut bufs, &mut step, &mut ctx, &mut side.paused, read)
                }
                Next::More => Then::Advance,
                Next::SendFile(body) => match Box::pin(send_file(w, &mut io, &body, &mut pace)).await {
                    Ok(n) => {
                        ctx.sent += n;
                        Then::Advance
                    }
                    Err(e) => {
                        cut_for_deadline(&io, &e);
                        break Some(e);
                    }
                },
                Next::Close { linger: wait } => {
                    close(&mut io, wait).await;
                    break None;
                }
                Next::Fail(_) => unreachable!("handled above"),
            };
            next = match then {
                Then::Advance => {
                    let unread = &side.unread;
                    self.advance(&mut step, &mut bufs, &mut ctx, &io, &mut session, id, unread)
                        .await
                }
                Then::Next(next) => next,
            };
        };
        drop(side);
        if let Some(e) = &end {
            log_connection_error(peer, e);
        }
        ctx.set_idle(false);
        // Its bytes are on the slot already, counted as they moved.
        ctx.closed(step.rejected().map(|(e, _)| e), end.as_ref().map(io::Error::kind));
    }

    fn on_worker_exit(&self) {
        self.handler.on_worker_exit();
    }

    async fn refuse(&self, w: &Worker<'_>, mut io: AsyncFd<Transport>, why: &'static str) {
        let mut step = Requests::new(self.handler.codec(), Limits::default());
        let mut bufs = Buffers::none();
        step.refuse(&mut bufs, why);
        if write_out(
            w,
            &mut io,
            &mut bufs,
            &mut Pace::Timeout(Some(Duration::from_secs(1))),
        )
        .await
        .is_ok()
        {
            // No waiting: a refused client may be one of many.
            linger(&mut io, Duration::ZERO).await;
        }
    }
}

impl<H: AsyncRequestHandler> RequestsOf<'_, H> {
    /// One call of the step, the handler bound to the connection for it.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn advance(
        &self,
        step: &mut Requests<H::Codec>,
        bufs: &mut Buffers,
        ctx: &mut TaskContext<'_, '_>,
        io: &AsyncFd<Transport>,
        session: &mut H::Session,
        id: u64,
        unread: &Cell<bool>,
    ) -> Next {
        let peer = ctx.peer;
        let mut bound = Bound {
            handler: self.handler,
            info: ConnInfo {
                peer,
                tls: io.get_ref().tls(),
                id,
                socket: io.get_ref().socket(),
            },
            session,
            w: ctx.w,
            io,
            unread,
            label: ctx.label,
        };
        step.advance_async(bufs, &mut bound, ctx, peer, &mut Instant::now)
            .await
    }
}

/// A request-level connection's read side between the step's moves.
struct ReadSide<'w, 'a> {
    /// Its buffers as the budget of buffered bytes counts them.
    held: Held<'w, 'a>,
    /// Whether the budget paused its reads.
    paused: bool,
    /// Its socket may hold bytes whose readiness was taken already (see [`read_some`]).
    unread: Cell<bool>,
}

/// The read the step asked for (its `wait` and `timeout`): between requests the
/// connection keeps small buffers only; its idle count while it waits; what came.
async fn read_next<C: Codec>(
    io: &mut AsyncFd<Transport>,
    bufs: &mut Buffers,
    step: &mut Requests<C>,
    ctx: &mut TaskContext<'_, '_>,
    side: &mut ReadSide<'_, '_>,
    (wait, timeout): (Wait, Option<Duration>),
) -> Input {
    if !bufs.has_input() && bufs.held() > KEEP_BUFFERS {
        // Between reads a connection keeps small buffers only (the size of
        // its last request and response, reused by the next: no allocation
        // per request); a large request's or response's are given back.
        *bufs = Buffers::none();
        side.held.set(0);
    }
    ctx.set_idle(wait == Wait::Idle);
    let max = step.max_request_size();
    let got = read_input(io, bufs, max, timeout, &side.unread, ctx.w, (wait, side.paused)).await;
    ctx.set_idle(false);
    got
}

/// What a read found, told to the step: what comes next. `again` is the read, for a
/// connection paused at the budget or resumed.
fn took<C: Codec>(
    got: Input,
    bufs: &mut Buffers,
    step: &mut Requests<C>,
    ctx: &mut TaskContext<'_, '_>,
    paused: &mut bool,
    again: Next,
) -> Then {
    let (w, peer) = (ctx.w, ctx.peer);
    match got {
        Input::Bytes(n) => {
            ctx.received += n as u64;
            w.moved_in.set(w.moved_in.get() + n as u64);
            step.received(&mut Instant::now);
            Then::Advance
        }
        Input::Eof => Then::Next(step.peer_closed(bufs)),
        Input::TimedOut => Then::Next(step.timed_out(bufs, ctx, peer, Instant::now())),
        // The worker stops: the boundary again, where an idle HTTP
        // connection drains.
        Input::Stop => Then::Advance,
        Input::Failed(e) => Then::Next(Next::Fail(e)),
        // At the budget of buffered bytes: a request that is only starting
        // is refused (the codec's refusal, HTTP 503 with `Retry-After`),
        // one well into its body waits for room, as in the event loop.
        Input::OverBudget => {
            w.budget.borrow_mut().stopped(Instant::now(), w.open.get());
            if Budget::refuses(bufs.input_capacity()) {
                Then::Next(step.shed(bufs, ctx, peer, budget::REFUSAL))
            } else {
                *paused = true;
                Then::Next(again)
            }
        }
        Input::Room => {
            *paused = false;
            Then::Next(again)
        }
    }
}

/// The close the step asked for: lingering (`wait`), or TLS's `close_notify` sent.
async fn close(io: &mut AsyncFd<Transport>, wait: Option<Duration>) {
    match wait {
        Some(wait) => Box::pin(linger(io, wait)).await,
        // TLS says its end (`close_notify`), best effort, as the event
        // loop does: a client must not see a truncated stream.
        None if io.get_ref().is_tls() => {
            io.get_mut().close_notify();
            let flush = async {
                while io.get_ref().records_pending() {
                    write_records(io).await?;
                }
                Ok(())
            };
            let _ = Box::pin(bounded(Some(Duration::from_secs(1)), flush)).await;
        }
        None => {}
    }
}

/// What comes after a move of the request loop.
pub(super) enum Then {
    /// The step's next call.
    Advance,
    /// What the step said already.
    Next(Next),
}

/// What a read found.
pub(super) enum Input {
    Bytes(usize),
    Eof,
    TimedOut,
    /// The worker stops while the connection waits between requests.
    Stop,
    Failed(io::Error),
    /// The budget of buffered bytes leaves no room for the read.
    OverBudget,
    /// A connection paused at the budget may read again.
    Room,
}

/// A connection's share of the worker's budget of buffered bytes, given back when the
/// connection ends (its future dropped, at any `.await`).
pub(super) struct Held<'w, 'a> {
    w: &'w Worker<'a>,
    bytes: Cell<usize>,
}

impl Held<'_, '_> {
    pub(super) fn set(&self, bytes: usize) {
        self.w.buffers_moved(self.bytes.replace(bytes), bytes);
    }
}

impl Drop for Held<'_, '_> {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// Reads what comes next into `bufs` (through the worker-wide scratch buffer), by the
/// wait's `timeout`; a wait between requests also ends at a stop. A connection `paused` at
/// the budget of buffered bytes waits for room instead.
pub(super) async fn read_input(
    io: &mut AsyncFd<Transport>,
    bufs: &mut Buffers,
    max: usize,
    timeout: Option<Duration>,
    unread: &Cell<bool>,
    w: &Worker<'_>,
    (wait, paused): (Wait, bool),
) -> Input {
    let room = max.saturating_sub(bufs.unconsumed().len()).clamp(1, BUFFER_SIZE);
    let stoppable = wait == Wait::Idle && !w.stopping.get();
    let read = async {
        if !paused {
            return match read_some(io, bufs, room, w, unread).await {
                Ok(None) => Input::OverBudget,
                Ok(Some(0)) => Input::Eof,
                Ok(Some(n)) => Input::Bytes(n),
                Err(e) => Input::Failed(e),
            };
        }
        // Paused: what the client sent stays in the socket; the readiness is spent here,
        // so the read after the pause looks before it waits.
        unread.set(true);
        tokio::select! {
            () = w.room() => Input::Room,
            // A client that leaves is seen at once, as the event loop sees it: its
            // connection does not hold its buffers until its deadline.
            () = hung_up(io) => Input::Eof,
        }
    };
    let stop = async {
        if stoppable {
            w.stop.notified().await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let timed = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        input = read => input,
        () = stop => Input::Stop,
        () = timed => Input::TimedOut,
    }
}

/// The user's handler bound to one connection for the step, raced with what may cut its
/// call.
pub(super) struct Bound<'h, 'c, 'w, 'a, H: AsyncRequestHandler> {
    pub(super) handler: &'h H,
    info: ConnInfo<'c>,
    session: &'c mut H::Session,
    w: &'w Worker<'a>,
    io: &'c AsyncFd<Transport>,
    unread: &'c Cell<bool>,
    label: &'w Label,
}

impl<H: AsyncRequestHandler> HandleAsync<H::Codec> for Bound<'_, '_, '_, '_, H> {
    async fn handle<'r>(
        &'r mut self,
        req: &<H::Codec as Codec>::Request<'r>,
        res: &mut <H::Codec as Codec>::Response<'r>,
    ) -> (Result<io::Result<()>, Cut>, bool) {
        let mut conn = Conn::new(self.info, &mut *self.session);
        let limit = self.w.request_timeout;
        let (w, handler) = (self.w, self.handler);
        let outcome = {
            // The `--max-inflight` permit is waited for inside the call, so that the wait
            // too is bounded by the request timeout and ended by the client's close.
            let call = async {
                let _flight = w.in_flight().await;
                AssertUnwindSafe(handler.handle_request(&mut conn, req, res))
                    .catch_unwind()
                    .await
            };
            let mut call = std::pin::pin!(call);
            // A call that completes at its first poll (no `.await` that waits: the usual
            // request) needs neither a timer nor a watch on the client: both are armed only
            // for a call that waits (a timer costs its insertion into the runtime's wheel and
            // its removal, a watch a readiness registration).
            let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            let outcome = match first {
                Poll::Ready(r) => Some(r),
                Poll::Pending => None,
            };
            match outcome {
                Some(r) => Ok(r),
                None => {
                    let timeout = async {
                        match limit {
                            Some(t) => tokio::time::sleep(t).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        biased;
                        r = &mut call => Ok(r),
                        () = timeout => {
                            w.cut_by_timeout(&self.label.peer.borrow(), "a request");
                            Err(Cut::TimedOut(limit.unwrap_or_default()))
                        }
                        () = gone(self.io, self.unread) => Err(Cut::Gone),
                    }
                }
            }
        };
        let label = self.label;
        let handled = match outcome {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(p)) => {
                tracing::error!(
                    "the handler panicked on a request from {} ({:?}): {}; closing that connection, the worker goes on",
                    label.peer.borrow(),
                    String::from_utf8_lossy(&label.shown.borrow()),
                    panic_message(&*p)
                );
                Err(Cut::Panicked)
            }
            Err(cut) => Err(cut),
        };
        (handled, conn.take_penalized())
    }
}

/// The worker's side of a connection's step.
pub(super) struct TaskContext<'w, 'a> {
    w: &'w Worker<'a>,
    peer: &'w Addr,
    label: &'w Label,
    /// Its life in the accounts (`life.rs`): the request clock, the close.
    life: Life,
    received: u64,
    sent: u64,
    /// Counted among the idle keep-alive connections.
    idle: bool,
}

impl<'w, 'a> TaskContext<'w, 'a> {
    /// The worker's side of the connection from `peer`, named by `label`: no request yet.
    fn new(w: &'w Worker<'a>, peer: &'w Addr, label: &'w Label, life: Life) -> Self {
        TaskContext {
            w,
            peer,
            label,
            life,
            received: 0,
            sent: 0,
            idle: false,
        }
    }

    pub(super) fn set_idle(&mut self, idle: bool) {
        if idle != self.idle {
            self.idle = idle;
            let n = self.w.idle.get();
            self.w.idle.set(if idle { n + 1 } else { n - 1 });
        }
    }

    pub(super) fn store_head(&mut self, head: Head<'_>) {
        let keep = |to: &RefCell<Vec<u8>>, bytes: &[u8]| {
            let mut to = to.borrow_mut();
            to.clear();
            to.extend_from_slice(&bytes[..bytes.len().min(HEAD_BYTES)]);
        };
        keep(&self.label.shown, head.shown);
        if self.w.ledger.borrow().logs_access() {
            keep(&self.label.raw, head.raw);
        }
    }

    /// The request's head, for the ledger.
    pub(super) fn head(label: &Label) -> (std::cell::Ref<'_, Vec<u8>>, std::cell::Ref<'_, Vec<u8>>) {
        (label.raw.borrow(), label.shown.borrow())
    }

    /// The connection ended: a request left unanswered gets its line, as the other
    /// drivers record it.
    pub(super) fn closed(
        &mut self,
        rejected: Option<&crate::codec::ProtocolError>,
        failed: Option<io::ErrorKind>,
    ) {
        if !self.life.in_request() {
            return;
        }
        let mut ledger = self.w.ledger.borrow_mut();
        if ledger.logs_access() {
            // Its line names its request, whatever began on other connections since.
            let (raw, shown) = Self::head(self.label);
            ledger.request_head(Head {
                raw: &raw,
                shown: &shown,
            });
        }
        let bytes = (self.received, self.sent);
        self.life.closing(
            &mut ledger,
            self.peer,
            Ended::of(rejected, failed),
            bytes,
            Instant::now,
        );
    }
}

impl Context for TaskContext<'_, '_> {
    fn retiring(&mut self) -> bool {
        self.w.ledger.borrow().retiring()
    }

    fn stopping(&mut self) -> bool {
        self.w.stopping.get()
    }

    fn request_start(&mut self, head: Head<'_>) {
        // Its head is the connection's own until the request's end (`request_end` gives it
        // to the ledger then): other connections' requests begin in between.
        self.life.request_begun(Instant::now());
        self.store_head(head);
    }

    fn request_head(&mut self, head: Head<'_>) {
        self.store_head(head);
    }

    fn refused(&mut self, _: &crate::codec::ProtocolError) {
        self.w.ledger.borrow_mut().refused();
    }

    fn request_end(&mut self, bytes: (u64, u64), ok: bool) {
        if !self.life.in_request() {
            return;
        }
        let mut ledger = self.w.ledger.borrow_mut();
        let (raw, shown) = Self::head(self.label);
        ledger.request_head(Head {
            raw: &raw,
            shown: &shown,
        });
        self.life
            .request_end(&mut ledger, self.peer, Instant::now(), bytes, ok);
        ledger.check_recycle();
    }
}

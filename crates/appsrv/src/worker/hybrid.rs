//! Hybrid mode's two drivers (`--io hybrid`).
//!
//! - [`FrontDriver`]: the event driver (`event/`) with the fronts' end of the hand-off
//!   channel and the [`HandOff`] completion, whose request step only gathers whole
//!   requests and hands them off (its hand-off state is `front.rs`).
//! - [`HybridWorker`]: the blocking loop (`blocking.rs`) over the TLS listeners, plus the
//!   connections the fronts hand over on the channel (`net/handoff.rs`), which go back to
//!   a front when they stay quiet. What only the hybrid worker needs lives here: taking a
//!   connection handed over, serving it, its hold between requests (the guard keeps the
//!   hold's data, [`Hold`]; its policy is [`boundary`] here) and handing it back.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use socket2::Socket;

use crate::conn::client::{Buffers, Client};
use crate::net::listener::{Addr, Listener};
use crate::scoreboard::{Board, Slot};
use crate::sys;

use super::Setup;
use super::blocking::{self, Blocking, HandOffs, Loop, Served, serve_admitted};
use super::driver::{Driver, Extras, Serves, Shared};
use super::event::{Event, HandOff};
use super::guard::{Guard, Hold};
use super::life::{Life, Ns, Unit};
use super::serve::RequestLevel;
use super::serve::{Boundary, Connections, Progress};
use crate::handler::RequestHandler;

/// A hybrid front's driver: the event driver with the fronts' end of the hand-off channel,
/// whose request step only tells when a request is whole, and then hands the connection
/// off instead of calling the handler.
#[derive(Debug)]
pub(crate) struct FrontDriver<'a> {
    event: Event<'a>,
    /// The fronts' end of the hand-off channel.
    channel: BorrowedFd<'a>,
}

impl<'a> Driver<'a> for FrontDriver<'a> {
    fn prepare(setup: &Setup<'a>, slot: &'static Slot, mut extras: Extras<'a>) -> Result<Self, String> {
        let channel = extras
            .handoff
            .take()
            .ok_or_else(|| "a hybrid front without its hand-off channel".to_string())?;
        let event = Event::new(setup, slot, extras, Some(channel))?;
        Ok(FrontDriver { event, channel })
    }
}

impl<'a, H: RequestHandler> Serves<'a, RequestLevel<H>> for FrontDriver<'a> {
    fn serve(self, shared: Shared<'a>, level: &mut RequestLevel<H>) -> i32 {
        let channel = self.channel;
        self.event
            .serve_with(shared, level, |start| HandOff::new(channel, start))
    }
}

/// The hybrid worker's driver: the blocking driver, and its end of the hand-off channel.
#[derive(Debug)]
pub(crate) struct HybridWorker<'a> {
    blocking: Blocking<'a>,
    channel: BorrowedFd<'a>,
}

impl<'a> Driver<'a> for HybridWorker<'a> {
    fn prepare(setup: &Setup<'a>, _: &'static Slot, extras: Extras<'a>) -> Result<Self, String> {
        let channel = extras
            .handoff
            .ok_or_else(|| "a hybrid worker without its hand-off channel".to_string())?;
        Ok(HybridWorker {
            blocking: Blocking::new(setup, Some(channel))?,
            channel,
        })
    }
}

impl<'a, C: Connections> Serves<'a, C> for HybridWorker<'a> {
    fn serve(self, shared: Shared<'a>, level: &mut C) -> i32 {
        let handoffs = HandOffs {
            channel: self.channel,
            take: handed_off::<C>,
        };
        blocking::serve(self.blocking, shared, level, Some(handoffs))
    }
}

/// How long a hybrid worker keeps a connection after a response, for its next request,
/// before it hands it back to a front.
const HOLD_LINGER: Duration = Duration::from_millis(100);
/// Requests a hybrid worker answers on one connection, at most, while other complete
/// requests wait for a worker, before it hands it back (to the back of the queue).
const HOLD_REQUESTS: u64 = 100;
/// How long a hybrid worker keeps one connection, at most, while other complete requests
/// wait for a worker: [`HOLD_REQUESTS`] of a handler that blocks 5 ms would hold it for
/// half a second, and every waiting client behind it.
const HOLD_TIME: Duration = Duration::from_millis(5);
/// How long a hybrid worker waits for the next request of a connection it keeps while
/// other complete requests wait. A client that talks fast (a benchmark, a pooled proxy
/// connection) sends it within microseconds of the response; one that does not goes back
/// to a front, and the worker takes a waiting request.
const HOLD_NEXT: Duration = Duration::from_millis(2);

/// How long a hybrid worker waits, at most, for the rest of a request it began to read on
/// a connection a front handed it (a request pipelined behind the one handed off, or sent
/// during the hold), before it hands the connection back with what came; the front
/// gathers the rest and hands the whole request off again. A client that talks fast (a
/// pipelining one, a request in two segments) sends the rest within microseconds; a slow
/// one costs the worker this long per request answered, never its own pace.
const HOLD_PARTIAL: Duration = Duration::from_millis(10);

/// Between two requests of a connection a front handed over: keep it
/// while its next request comes within [`HOLD_LINGER`] (the driver's read waits that
/// long: no system call here), then hand it back. While other complete requests wait
/// and no worker is idle, the worker keeps the connection only while its next request
/// comes within [`HOLD_NEXT`], for at most [`HOLD_REQUESTS`] requests and
/// [`HOLD_TIME`], then takes the waiting ones. Handing back a connection whose next
/// request was a few microseconds away (a zero-timeout look for it) cost two hand-offs
/// per request: 34,000 requests/s instead of 47,000 at c = 32 … 256 on 8 workers
/// (BENCHMARKS.md, "Hybrid mode"). A stop hands the connection back at once: the
/// fronts of the next generation take it (a reload loses no connection).
///
/// A request handed off while every worker lingers does not wait for a linger to end:
/// the front wakes one lingering worker ([`Board::wake_lingering`], the mark set here)
/// with a signal, which interrupts its read; the worker asks again and hands its quiet
/// connection back. Watching the channel beside the connection instead would cost a
/// `poll` per request kept. At `--max-requests` the connection goes back too.
fn boundary(guard: &mut Guard<'_>, hold: Hold) -> Boundary {
    if sys::stop_requested() {
        return Boundary::HandBack;
    }
    if guard.ledger.limit_reached() {
        // --max-requests: back to the front, so that the worker retires now and the
        // connection goes on with another (a client that never pauses would keep it).
        return Boundary::HandBack;
    }
    // The mark comes before the look at the requests waiting (and a fence between,
    // paired with the front's): a front that hands off a request sees the mark and
    // wakes this worker out of its linger, or this sees the request.
    guard.ledger.slot().keepalive_wait();
    guard.ledger.slot().linger_wait();
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    if !(guard.board.requests_waiting() && guard.board.idle() == 0) {
        return Boundary::Linger(
            guard
                .keepalive_timeout
                .map_or(HOLD_LINGER, |t| t.min(HOLD_LINGER)),
        );
    }
    if guard.ledger.requests().saturating_sub(hold.since) >= HOLD_REQUESTS || hold.at.elapsed() >= HOLD_TIME {
        return Boundary::HandBack;
    }
    // A short wait, for a client that talks fast: no front wakes the worker out of
    // it (the next request is the one it waits for).
    guard.ledger.slot().linger_end();
    Boundary::Linger(HOLD_NEXT)
}

/// A connection a front handed over, admitted there already, with the bytes the front
/// read; served to its end or until it goes back to a front. Returns the worker's exit
/// status if it stops now (a handler panic, a stop).
fn handed_off<C: Connections>(
    l: &mut Loop<'_, '_, C>,
    received: crate::net::handoff::Received,
    inbox: &crate::net::handoff::Inbox,
) -> Option<i32> {
    let (socket, meta, bytes) = received.split(inbox);
    // The request's bytes the front read count as this worker's, as if it had read them
    // (the front's own slot is not in the totals).
    l.slot.add_bytes(bytes.len() as u64, 0);
    let bufs = l.buffers.take().unwrap_or_else(Buffers::new);
    let client = handed_over(socket, &meta, &bytes, bufs, l.listeners);
    drop(bytes);
    l.slot.forget_peer();
    if let Some(c) = &client {
        // The slot names the client before the hand-off counts as taken: the front stops
        // counting it for --max-conns-per-ip only then.
        l.slot.connection(c.peer_addr());
    }
    l.board.handoff_taken();
    let mut client = client?;
    let unit = if l.level.request_level() {
        Unit::Requests
    } else {
        Unit::Connection
    };
    let mut life: Life<Ns> = Life::new(unit);
    life.serve(&mut l.guard.ledger, client.peer_addr());
    l.watch_sends(&mut client);
    if sys::take_reopen_request() {
        l.guard.ledger.reopen();
    }
    let channel = l
        .handoffs
        .as_ref()
        .expect("a hand-off comes from the channel")
        .channel;
    match serve_handed_over(client, life, &meta, channel, l.level, &mut l.guard, l.board) {
        Ok(bufs) => l.buffers = Some(bufs),
        Err(code) => return Some(code),
    }
    blocking::after_connection(&mut l.guard, true)
}

/// Hybrid mode: the client of a connection a front handed over, with the bytes it read
/// (`None`, logged, when the socket cannot be set up: the connection is closed).
fn handed_over(
    socket: Socket,
    meta: &crate::net::handoff::Meta,
    bytes: &[u8],
    mut bufs: Buffers,
    listeners: &[Listener],
) -> Option<Client> {
    let set_up = crate::sys::set_nonblocking(socket.as_fd(), false).and_then(|()| {
        match listeners.get(meta.listener as usize) {
            Some(l) => l.prepare(&socket),
            None => Ok(()),
        }
    });
    if let Err(e) = set_up {
        tracing::warn!("setting up a connection handed over: {e}; closing it");
        return None;
    }
    let peer = match meta.peer {
        Some(a) => Addr::Inet(a),
        None => socket
            .peer_addr()
            .map_or(Addr::Unix(None), |a| Addr::from_sockaddr(&a)),
    };
    bufs.extend_input(bytes);
    Some(Client::new(socket, peer, bufs))
}

/// Hybrid mode: serves a connection a front handed over until it closes or goes back to a
/// front (through `channel`), with the beginning of a request if one came that did not
/// arrive whole in time (`Context::partial_wait`); `Err` with the worker's exit status
/// when the handler panicked.
fn serve_handed_over<C: Connections>(
    mut client: Client,
    mut life: Life<Ns>,
    meta: &crate::net::handoff::Meta,
    channel: BorrowedFd<'_>,
    level: &mut C,
    guard: &mut Guard<'_>,
    board: &'static Board,
) -> Result<Buffers, i32> {
    guard.hold = Some(Hold {
        since: guard.ledger.requests(),
        at: Instant::now(),
        partial: HOLD_PARTIAL,
        boundary,
    });
    let mut progress = Progress {
        served: meta.served,
        interim_sent: meta.interim_sent,
    };
    loop {
        match serve_admitted(client, life, level, guard, board, Some(progress)) {
            Served::Closed(bufs) => return Ok(bufs),
            Served::Panicked(code) => return Err(code),
            // No front takes connections back any more (the server stops: the fronts
            // left first): keep it, as in blocking mode, until it drains.
            // (Served again as handed over: the driver sets the socket's timeout again.)
            Served::HandBack(back, p, kept) if !board.fronts_receiving() => {
                guard.hold = None;
                client = back;
                progress = p;
                life = kept;
            }
            Served::HandBack(back, p, kept) => {
                let meta = crate::net::handoff::Meta {
                    served: p.served,
                    interim_sent: p.interim_sent,
                    ..meta.clone()
                };
                let sent = crate::sys::set_nonblocking(back.socket().as_fd(), true).and_then(|()| {
                    crate::net::handoff::send(channel, back.socket().as_fd(), &meta, back.buffered())
                });
                match sent {
                    Ok(()) => return Ok(back.finish().1),
                    Err(e) => {
                        // The fronts do not take it now (the channel is full): keep it, as
                        // in blocking mode, for the rest of its life.
                        tracing::debug!(
                            "cannot hand the connection from {} back: {e}; keeping it",
                            back.peer_addr()
                        );
                        let _ = crate::sys::set_nonblocking(back.socket().as_fd(), false);
                        guard.hold = None;
                        client = back;
                        progress = p;
                        life = kept;
                    }
                }
            }
        }
    }
}

//! The datagram side of a worker's event loop: `udp://` and `unixgram:` listeners served by
//! the user's [`DatagramHandler`], from the same loop as the worker's stream connections
//! (`event/`), as a [`Source`](super::reactor::Source) registered on its reactor.
//!
//! What one readable datagram socket costs, and why (see also docs/ARCHITECTURE.md, "The
//! life of a datagram"):
//! - **One socket, every worker, no thundering herd.** The master binds each datagram
//!   address once; every worker registers that socket level-triggered with
//!   `EPOLLEXCLUSIVE`, as it does its stream listeners: a datagram wakes one waiting
//!   worker, and a busy worker leaves the next datagrams to the others. Not an
//!   `SO_REUSEPORT` group of one socket per worker: the kernel spreads a group by the
//!   sender's address and port, so a client that sends from one socket (a resolver,
//!   `dnsperf`) would load one worker only; and a datagram queued on a group member that
//!   closes (a worker replaced on reload) is lost, where the one shared socket keeps its
//!   queue for the next reader.
//! - **Batches.** A readable socket is read with `recvmmsg` into the worker's batch
//!   ([`sys::dgram::Batch`], [`BATCH`] slots), each datagram is passed to the handler, and
//!   the answers of the batch go out with one `sendmmsg`. A full batch is followed by
//!   another, up to [`BATCHES_PER_TURN`] per socket per turn; the socket is level-triggered,
//!   so what is left is reported again by the next `epoll_wait`, after the worker's
//!   connections had their turn.
//! - **What applies to each datagram, in order:** the size limit (`--max-datagram-size`: a
//!   longer one is dropped), the listener's allow/deny rules (a denied datagram is dropped,
//!   never answered: an answer would tell a scanner the port is open), the per-source
//!   answer rate (`--max-answers-per-ip`, a source being its network: an IPv4 /24 and an
//!   IPv6 /56 by default, `--answers-ipv4-prefix` and `--answers-ipv6-prefix`; with one in
//!   `--answers-slip` answered by the handler's [`slip`](DatagramHandler::slip)), then the
//!   handler. Every drop is counted
//!   (metrics, status).
//! - **Stop and reload.** A stopping worker reads what its sockets hold once more, answers
//!   it, and stops reading them: the master never shuts a datagram socket down (a socket
//!   shut for writing refuses answers), and datagrams queued later are read by the next
//!   generation of workers on a reload, or discarded with the socket at the end of a stop.
//! - **The request timeout** covers a handler call on a datagram as it does a stream
//!   request: the loop's turn is on the slot, and a turn longer than `--request-timeout`
//!   gets the worker killed.

use std::net::SocketAddr;
use std::os::fd::AsFd;

use nix::sys::epoll::{Epoll, EpollFlags};
use std::time::{Duration, Instant};

use crate::conn::datagram::Datagram;
use crate::error::BoxError;
use crate::handler::DatagramHandler;
use crate::net::listener::{Addr, Listener};
use crate::scoreboard::{Board, DatagramCounts, Slot};
use crate::sys;
use crate::sys::dgram::{Batch, Source};

use super::access::Outcome;
use super::ledger::{Ledger, OncePerMinute, Panicked, contain};
use super::reactor::{self, Token};

/// Slots of a worker's batch: datagrams taken by one `recvmmsg`.
pub(crate) const BATCH: usize = 32;
/// Batches read from one socket per turn of the loop at most.
const BATCHES_PER_TURN: usize = 4;
/// Turns' worth of batches a stopping worker reads from one socket at most: 2048
/// datagrams, more than a default socket buffer holds (about 256 small ones).
const STOP_DRAIN_TURNS: usize = 16;

/// The factory of a server's datagram handler, type-erased (`Server::datagrams`).
pub(crate) type Factory = Box<dyn FnMut() -> Result<Box<dyn DatagramHandler>, BoxError>>;

/// The stream handler of a datagram-only server (`Server::run_datagrams`): it has no stream
/// listener (the configuration check refuses one), so no connection ever reaches it.
#[derive(Debug)]
pub(crate) struct NoStreams;

impl crate::handler::RequestHandler for NoStreams {
    type Codec = crate::codec::Lines;
    type Session = ();
    fn handle_request(
        &mut self,
        _: &mut crate::conn::context::Conn<'_>,
        _: &crate::codec::Line<'_>,
        _: &mut crate::codec::LinesResponse<'_>,
    ) -> std::io::Result<()> {
        Err(std::io::Error::other("this server serves datagrams only"))
    }
}

/// The datagram settings of the command line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// `--max-datagram-size`.
    pub(crate) max_size: usize,
    /// `--max-answers-per-ip` (0: no limit).
    pub(crate) max_answers_per_ip: u32,
    /// `--answers-ipv4-prefix`, `--answers-ipv6-prefix`: the networks that limit counts.
    pub(crate) answer_prefixes: crate::scoreboard::AnswerPrefixes,
    /// `--answers-slip` (0: never slip).
    pub(crate) slip: u32,
    /// `--access-log-sample` (1: every datagram).
    pub(crate) access_sample: u32,
    /// `--status-request-detail`: the slot shows a datagram's first bytes while the
    /// handler runs (else nothing: a datagram has no codec to summarize it, issue 41).
    pub(crate) request_detail: bool,
}

/// What the event loop hands the datagram side once.
pub(crate) struct Side<'a> {
    handler: Box<dyn DatagramHandler>,
    settings: Settings,
    batch: Batch,
    id: u32,
    slot: &'a Slot,
    board: &'static Board,
    counts: DatagramCounts,
    published: DatagramCounts,
    /// Datagrams that reached the access log's stage (not dropped by the size limit or
    /// allow/deny, which have no line), for its sampling.
    seen: u64,
    /// Rate-limited datagrams, for the slip ratio.
    limited: u64,
    /// When the last refused send, and the last failed receive, were logged (one line per
    /// minute at most each).
    send_trouble: OncePerMinute,
    recv_trouble: OncePerMinute,
}

impl std::fmt::Debug for Side<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side")
            .field("settings", &self.settings)
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

impl<'a> Side<'a> {
    pub(crate) fn new(
        handler: Box<dyn DatagramHandler>,
        settings: Settings,
        id: u32,
        slot: &'a Slot,
        board: &'static Board,
    ) -> Self {
        Side {
            handler,
            settings,
            batch: Batch::new(BATCH, settings.max_size),
            id,
            slot,
            board,
            counts: DatagramCounts::default(),
            published: DatagramCounts::default(),
            seen: 0,
            limited: 0,
            send_trouble: OncePerMinute::default(),
            recv_trouble: OncePerMinute::default(),
        }
    }

    /// The same side with a batch of `capacity` slots instead of [`BATCH`] (the benchmark
    /// compares batches of 32 with one datagram per system call).
    pub(crate) fn with_batch(mut self, capacity: usize) -> Self {
        self.batch = Batch::new(capacity, self.settings.max_size);
        self
    }

    /// What it counted so far.
    pub(crate) fn counts(&self) -> DatagramCounts {
        self.counts
    }

    /// The handler's exit hook.
    pub(crate) fn on_worker_exit(&mut self) {
        self.handler.on_worker_exit();
    }

    /// Publishes the counters on the scoreboard when they changed.
    pub(crate) fn publish(&mut self) {
        if self.counts != self.published {
            self.slot.publish_datagrams(self.counts);
            self.published = self.counts;
        }
    }

    /// Reads and answers what `listener` holds (up to [`BATCHES_PER_TURN`] batches);
    /// returns how many datagrams were passed to the handler, which the ledger counts as
    /// requests (for recycling by requests).
    pub(crate) fn readable(&mut self, listener: &Listener, ledger: &mut Ledger<'_>) -> u64 {
        let mut handled = 0;
        for _ in 0..BATCHES_PER_TURN {
            let n = match self
                .batch
                .receive(listener.socket().as_fd(), listener.wants_destination())
            {
                Ok(n) => n,
                Err(e) => {
                    if self.recv_trouble.due(Instant::now()).is_some() {
                        tracing::warn!("receiving on {}: {e} (logged once a minute)", listener.label());
                    }
                    break;
                }
            };
            if n == 0 {
                break;
            }
            for i in 0..n {
                if self.one(listener, i, ledger) {
                    handled += 1;
                }
            }
            let sent = self.batch.send_answers(listener.socket().as_fd());
            self.counts.sent += sent.datagrams;
            self.counts.bytes_out += sent.bytes;
            if sent.failed > 0 {
                self.counts.send_failed += sent.failed;
                if self.send_trouble.due(Instant::now()).is_some() {
                    tracing::warn!(
                        "{}: {} answers refused by the kernel ({}); counted in appsrv_datagrams_dropped_total{{reason=\"send\"}} (logged once a minute)",
                        listener.label(),
                        sent.failed,
                        std::io::Error::from_raw_os_error(sent.error.unwrap_or(0))
                    );
                }
            }
            if n < self.batch.capacity() {
                break;
            }
        }
        ledger.datagrams_answered(handled);
        handled
    }

    /// At a stop: reads and answers what `listener` holds until a receive finds less than a
    /// full turn's worth, or at most [`STOP_DRAIN_TURNS`] turns (a flood that never pauses
    /// must not hold a stopping worker).
    pub(crate) fn drain(&mut self, listener: &Listener, ledger: &mut Ledger<'_>) -> u64 {
        let mut handled = 0;
        for _ in 0..STOP_DRAIN_TURNS {
            let before = self.counts.received;
            handled += self.readable(listener, ledger);
            if self.counts.received - before < (BATCHES_PER_TURN * self.batch.capacity()) as u64 {
                break;
            }
        }
        handled
    }

    /// Datagram `i` of the batch: checks, then the handler. Returns whether the handler
    /// (or its slip) was called.
    fn one(&mut self, listener: &Listener, i: usize, ledger: &mut Ledger<'_>) -> bool {
        let (received, answer) = self.batch.slot(i);
        let Some(peer) = checked_sender(&mut self.counts, self.settings.max_size, listener, &received) else {
            return false;
        };
        let local_wild;
        let local = match (received.destination, listener.local_addr()) {
            (Some(d), Addr::Inet(l)) => {
                local_wild = Addr::Inet(SocketAddr::new(d.ip(), l.port()));
                &local_wild
            }
            (_, l) => l,
        };
        let datagram = Datagram {
            data: received.data,
            peer: &peer,
            local,
            worker: self.id,
        };
        // One clock read serves the answer rate and the request timeout; the access log's
        // duration is only timed when there is a log.
        let now = crate::scoreboard::now_ns();
        let started = ledger.logs_access().then(Instant::now);
        let limit = self.settings.max_answers_per_ip;
        let over = limit > 0
            && peer.ip().is_some_and(|ip| {
                !self
                    .board
                    .answer_allowed(ip, self.settings.answer_prefixes, limit, now)
            });
        let handler = &mut self.handler;
        // On the slot while the handler runs: a call that outlasts --request-timeout is
        // logged by the master with the sender (and, with --status-request-detail, the
        // datagram's first bytes: a payload may hold anything, issue 41). The timeout
        // counts from this call, not from the turn's start: a turn may hold hundreds of
        // datagrams (a stop's drain, thousands), each well within the limit.
        self.slot.turn_begin(now);
        let shown = if self.settings.request_detail {
            &received.data[..received.data.len().min(crate::scoreboard::HEAD_BYTES)]
        } else {
            &[]
        };
        self.slot.handler_call(&peer, shown);
        let tally = Tally {
            counts: &mut self.counts,
            limited: &mut self.limited,
            slip: self.settings.slip,
        };
        let (outcome, called) = match call(handler.as_mut(), tally, over, &datagram, answer) {
            Ok(done) => done,
            Err(panic) => sys::exit_now(ledger.panicked(
                format_args!("datagram handler panicked on a datagram from {peer}"),
                &panic,
                "this worker exits and is replaced",
            )),
        };
        self.slot.handler_done();
        if !answer.is_empty() && matches!(peer, Addr::Unix(None)) {
            // An unbound Unix datagram sender has no address to answer to.
            answer.clear();
            self.counts.send_failed += 1;
            tracing::debug!("{}: an answer to an unbound sender dropped", listener.label());
        }
        // Counted here, not on arrival: a datagram dropped above has no line, and
        // counting it would skew the sample (with a sample of 2 and every other datagram
        // denied, every answered one would be logged, or none).
        self.seen += 1;
        if let Some(log) = ledger.access() {
            let sample = u64::from(self.settings.access_sample.max(1));
            if self.seen % sample == 0 {
                let took = started.map_or(Duration::ZERO, |t| t.elapsed());
                log.line(
                    &peer,
                    outcome,
                    took,
                    (received.data.len() as u64, answer.len() as u64),
                    b"",
                );
            }
        }
        called
    }
}

/// The datagram side as a source of the event loop's reactor: the side and the sockets it
/// registered.
pub(crate) struct Datagrams<'a> {
    side: Side<'a>,
    listeners: &'a [Listener],
}

impl std::fmt::Debug for Datagrams<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datagrams")
            .field("side", &self.side)
            .finish_non_exhaustive()
    }
}

impl<'a> Datagrams<'a> {
    /// Registers the datagram listeners among `listeners` that `serves` names in `epoll`,
    /// level-triggered and exclusive (one waiting worker woken per arrival), for `side`.
    pub(crate) fn watch(
        side: Side<'a>,
        listeners: &'a [Listener],
        serves: &dyn Fn(usize) -> bool,
        epoll: &Epoll,
    ) -> Result<Self, String> {
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE;
        for (i, l) in listeners.iter().enumerate() {
            if serves(i) && l.is_datagram() {
                reactor::watch(epoll, l.socket().as_fd(), flags, Token::datagram(i))
                    .map_err(|e| format!("watching {}: {e}", l.label()))?;
            }
        }
        Ok(Datagrams { side, listeners })
    }
}

impl<'a> reactor::Source<Ledger<'a>> for Datagrams<'a> {
    /// Reads and answers what datagram listener `index` holds.
    fn ready(&mut self, index: usize, ledger: &mut Ledger<'a>) {
        self.side.readable(&self.listeners[index], ledger);
    }

    fn publish(&mut self) {
        self.side.publish();
    }

    /// What the sockets hold now is read and answered once more, then the sockets are no
    /// longer watched (the next generation, or nobody at a stop, reads what comes later).
    fn stop(&mut self, epoll: &Epoll, ledger: &mut Ledger<'a>) {
        for l in self.listeners.iter().filter(|l| l.is_datagram()) {
            self.side.drain(l, ledger);
            let _ = epoll.delete(l.socket().as_fd());
        }
    }

    fn exit(&mut self) {
        if let Err(p) = contain(|| self.side.on_worker_exit()) {
            tracing::error!("the datagram handler's on_worker_exit panicked: {}", p.0);
        }
    }
}

/// The checks before the handler, counted: a datagram longer than `--max-datagram-size`
/// (`max_size`), or from a sender the listener's allow/deny policy refuses, is dropped
/// without an answer or an access-log line. Returns the sender's address when it passes.
fn checked_sender(
    counts: &mut DatagramCounts,
    max_size: usize,
    listener: &Listener,
    received: &crate::sys::dgram::Received<'_>,
) -> Option<Addr> {
    counts.received += 1;
    if !received.truncated {
        counts.bytes_in += received.data.len() as u64;
    }
    if received.truncated {
        counts.too_large += 1;
        tracing::debug!(
            "{}: a datagram longer than --max-datagram-size ({max_size} bytes) dropped",
            listener.label(),
        );
        return None;
    }
    let peer = match &received.source {
        Source::Inet(a) => Addr::Inet(*a),
        Source::Unix(p) => Addr::Unix(p.clone()),
    };
    if !listener.policy().permits(peer.ip()) {
        counts.denied += 1;
        return None;
    }
    Some(peer)
}

/// What [`call`] counts: the side's counters, its rate-limited datagrams (for the slip
/// ratio) and `--answers-slip`.
struct Tally<'a> {
    counts: &'a mut DatagramCounts,
    limited: &'a mut u64,
    slip: u32,
}

/// The handler's part of a datagram: its call, with a panic contained (`Err`, for the
/// ledger's line and the worker's exit); for a sender `over`
/// its answer rate, the handler's `slip` every `--answers-slip`th datagram and nothing
/// otherwise. An error clears the answer (nothing is sent). Returns the outcome for the
/// access log and whether the handler (or its slip) was called.
fn call(
    handler: &mut dyn DatagramHandler,
    tally: Tally<'_>,
    over: bool,
    datagram: &Datagram<'_>,
    answer: &mut Vec<u8>,
) -> Result<(Outcome, bool), Panicked> {
    let peer = datagram.peer;
    if over {
        tally.counts.rate_limited += 1;
        *tally.limited += 1;
        if tally.slip > 0 && *tally.limited % u64::from(tally.slip) == 0 {
            contain(|| handler.slip(datagram, answer))?;
            Ok((Outcome::Slipped, true))
        } else {
            Ok((Outcome::Limited, false))
        }
    } else {
        match contain(|| handler.handle_datagram(datagram, answer))? {
            Ok(()) => Ok((Outcome::Ok, true)),
            Err(e) => {
                answer.clear();
                tally.counts.errors += 1;
                tracing::debug!("datagram from {peer}: {e}; not answered");
                Ok((Outcome::Error, true))
            }
        }
    }
}

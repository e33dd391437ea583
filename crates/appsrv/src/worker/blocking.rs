//! The blocking connection loop: one connection at a time, from accept to close.
//!
//! Kept apart from the worker's set-up so that other loops (an event loop that multiplexes
//! many connections per process) can share everything else.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};
use socket2::Socket;

use crate::conn::client::{BUFFER_SIZE, Buffers, Client, SendWatch};
use crate::net::listener::{Addr, Listener};
use crate::net::tls::ForWorker;
use crate::scoreboard::{Board, Slot, State};
use crate::sys::{self, exit};

use super::accept::{Accepted, Acceptor};
use super::access::{AccessLog, Outcome};
use super::admission::{Admission, Next, Rejection, Rules, Seat};
use super::guard::Guard;
use super::ledger::{Rejections, log_connection_error, panic_message};
use super::serve::{Connections, Progress};
use super::{ConnLimits, Recycle};

/// What the blocking loop needs from the system before the worker may say it is ready:
/// its scoreboard slot and its way of waiting for connections (an epoll instance with
/// several listeners). Made before `Ready` is sent, so that a failure here is a start
/// failure (reported with its reason, counted by the back-off), not a ready worker's exit.
#[derive(Debug)]
pub(crate) struct Prepared<'a> {
    slot: &'a Slot,
    acceptor: Acceptor<'a>,
    /// Hybrid mode: the workers' end of the hand-off channel.
    handoff: Option<BorrowedFd<'a>>,
}

/// Prepares worker `id` to serve the `listeners` that `serves` names, and in hybrid mode
/// the connections handed over on the channel's end `handoff` (see [`Prepared`]).
pub(crate) fn prepare<'a>(
    id: u32,
    listeners: &'a [Listener],
    board: &'a Board,
    serves: &dyn Fn(usize) -> bool,
    handoff: Option<BorrowedFd<'a>>,
) -> Result<Prepared<'a>, String> {
    let slot = board.slot(id).ok_or_else(|| format!("no scoreboard slot {id}"))?;
    let acceptor = Acceptor::new(id, listeners, board, serves, handoff)
        .map_err(|e| format!("cannot wait for connections: {e}"))?;
    Ok(Prepared {
        slot,
        acceptor,
        handoff,
    })
}

/// Everything the blocking loop works with: the worker's whole context, passed once.
pub(crate) struct Worker<'a, C> {
    pub(crate) id: u32,
    pub(crate) prepared: Prepared<'a>,
    pub(crate) listeners: &'a [Listener],
    pub(crate) board: &'static Board,
    /// The idle timeout between requests, for the keep-alive guard.
    pub(crate) keepalive_timeout: Option<Duration>,
    pub(crate) recycle: Recycle,
    pub(crate) handler: &'a mut C,
    /// The access log.
    pub(crate) access: Option<AccessLog>,
    /// `--max-conns-per-ip`.
    pub(crate) max_per_ip: Option<usize>,
    pub(crate) tls: &'a ForWorker,
    pub(crate) limits: ConnLimits,
    /// Runs between connections after a USR1: takes the files the master reopened (the
    /// log file goes over stderr), returns the new access log if any.
    pub(crate) reopen_log: &'a mut dyn FnMut() -> Option<std::fs::File>,
    /// Asks the master for a replacement (the recycling limit is reached).
    pub(crate) retire: &'a mut dyn FnMut(),
}

/// Serves connections until a stop; returns the worker's exit status.
pub(crate) fn serve<C: Connections>(worker: Worker<'_, C>) -> i32 {
    let Worker {
        id,
        prepared,
        listeners,
        board,
        keepalive_timeout,
        recycle,
        handler,
        access,
        max_per_ip,
        tls,
        limits,
        reopen_log,
        retire,
    } = worker;
    let Prepared {
        slot,
        mut acceptor,
        handoff,
    } = prepared;
    let mut l = Loop {
        guard: Guard {
            id,
            listeners,
            board,
            slot,
            keepalive_timeout,
            recycle,
            request: None,
            requests: 0,
            access,
            peer: None,
            head: Vec::new(),
            hold: None,
        },
        handler,
        slot,
        board,
        listeners,
        tls,
        limits,
        max_per_ip,
        handoff,
        buffers: Some(Buffers::new()),
        rejections: Rejections::default(),
        retire_sent: false,
        retire,
        reopen_log,
    };
    loop {
        // Lines are written before the worker may wait: a quiet server holds none back.
        if let Some(log) = l.guard.access.as_mut() {
            log.flush();
        }
        let stop = match acceptor.accept() {
            Accepted::Connection(socket, peer, index) => l.accepted(socket, &peer, index),
            Accepted::HandedOff(received) => {
                let inbox = acceptor.inbox().expect("a hand-off comes from the channel");
                l.handed_off(received, inbox)
            }
            Accepted::Stop => return exit::OK,
            Accepted::Reopen => {
                l.reopen();
                None
            }
        };
        if let Some(code) = stop {
            return code;
        }
    }
}

/// The blocking loop's state between connections: what each connection is served with,
/// and what carries over from one to the next (the buffers, reused; the rejection
/// episodes; whether the master was asked for a replacement). One place, so that each kind
/// of connection (accepted here, handed over by a front) is a method of its own.
struct Loop<'a, C> {
    guard: Guard<'a>,
    handler: &'a mut C,
    slot: &'a Slot,
    board: &'static Board,
    listeners: &'a [Listener],
    tls: &'a ForWorker,
    limits: ConnLimits,
    max_per_ip: Option<usize>,
    /// Hybrid mode: the workers' end of the hand-off channel.
    handoff: Option<BorrowedFd<'a>>,
    /// The last connection's buffers, for the next one (`None` only while one is served).
    buffers: Option<Buffers>,
    rejections: Rejections,
    retire_sent: bool,
    retire: &'a mut dyn FnMut(),
    reopen_log: &'a mut dyn FnMut() -> Option<std::fs::File>,
}

impl<C: Connections> Loop<'_, C> {
    /// Puts the files the master reopened (after a USR1) in place: the log file goes over
    /// stderr, the access log replaces this worker's copy.
    fn reopen(&mut self) {
        if let (Some(file), Some(log)) = ((self.reopen_log)(), self.guard.access.as_mut()) {
            log.replace(file);
        }
    }

    /// A connection this worker accepted: admitted (or refused, with its rejection's reply
    /// and log line), then served to its end. Returns the worker's exit status if it stops
    /// now (a handler panic, a stop).
    fn accepted(&mut self, socket: Socket, peer: &socket2::SockAddr, index: usize) -> Option<i32> {
        self.slot.forget_peer();
        if sys::take_reopen_request() {
            self.reopen();
        }
        let peer = Addr::from_sockaddr(peer);
        let mut client = Client::new(socket, peer, self.buffers.take().unwrap_or_else(Buffers::new));
        if self.limits.min_send_rate > 0 {
            client.watch_sends(SendWatch::new(
                self.limits.min_send_rate,
                self.limits.write_timeout,
            ));
        }
        let rules = Rules {
            policy: self.listeners[index].policy(),
            tls: self.tls.acceptor(index),
            header_timeout: self.limits.header_timeout,
            handshake_timeout: self.tls.handshake_timeout,
            max_per_ip: self.max_per_ip,
            penalties: crate::penalty::installed(),
        };
        let seat = SlotSeat {
            slot: self.slot,
            board: self.board,
        };
        if let Err(rejection) = admit(&mut client, rules, seat) {
            reject(
                &mut self.rejections,
                rejection,
                &mut client,
                self.slot,
                self.handler,
            );
            let (_, bufs) = client.finish();
            self.buffers = Some(bufs);
            return None;
        }
        self.guard.hold = None;
        let bufs = match serve_admitted(client, self.handler, &mut self.guard, self.board, None) {
            Served::Closed(bufs) => bufs,
            Served::HandBack(client, _) => client.finish().1,
            Served::Panicked => return Some(exit::PANIC),
        };
        self.buffers = Some(bufs);
        after_connection(
            &mut self.guard,
            &mut self.retire_sent,
            self.retire,
            self.handoff.is_some(),
        )
    }

    /// Hybrid mode: a connection a front handed over, admitted there already, with the
    /// bytes the front read; served to its end or until it goes back to a front. Returns
    /// the worker's exit status if it stops now (a handler panic, a stop).
    fn handed_off(
        &mut self,
        received: crate::net::handoff::Received,
        inbox: &crate::net::handoff::Inbox,
    ) -> Option<i32> {
        let (socket, meta, bytes) = received.split(inbox);
        // The request's bytes the front read count as this worker's, as if it had read
        // them (the front's own slot is not in the totals).
        self.slot.add_bytes(bytes.len() as u64, 0);
        let bufs = self.buffers.take().unwrap_or_else(Buffers::new);
        let client = handed_over(socket, &meta, &bytes, bufs, self.listeners);
        drop(bytes);
        self.slot.forget_peer();
        if let Some(c) = &client {
            // The slot names the client before the hand-off counts as taken: the front
            // stops counting it for --max-conns-per-ip only then.
            self.slot.connection(&c.peer_addr());
        }
        self.board.handoff_taken();
        let mut client = client?;
        if self.limits.min_send_rate > 0 {
            client.watch_sends(SendWatch::new(
                self.limits.min_send_rate,
                self.limits.write_timeout,
            ));
        }
        if sys::take_reopen_request() {
            self.reopen();
        }
        let channel = self.handoff.expect("a hand-off comes from the channel");
        match serve_handed_over(client, &meta, channel, self.handler, &mut self.guard, self.board) {
            Some(bufs) => self.buffers = Some(bufs),
            None => return Some(exit::PANIC),
        }
        after_connection(
            &mut self.guard,
            &mut self.retire_sent,
            self.retire,
            self.handoff.is_some(),
        )
    }
}

/// After a connection: the worker's exit status if it stops now; the request for a
/// replacement when the recycling limit is reached.
///
/// `hybrid`: the worker takes connections from the hand-off channel. Told to stop, it
/// does not leave here but goes back to the acceptor, which decides: while no front takes
/// connections any more (a stop, or the old master after an upgrade's hand-over: the
/// fronts left first), the requests still waiting in the channel are served first, since
/// nobody else will (the channel is this master's, and closes with it); while fronts take
/// them (a reload, a recycled worker), the others serve them and the acceptor says stop at
/// once. Leaving here after the connection it held is what lost every request waiting in
/// the channel, whenever clients outnumbered the workers (issue 31: 14 of `wrk -c16`'s
/// connections against 2 workers, at each upgrade).
fn after_connection(
    guard: &mut Guard<'_>,
    retire_sent: &mut bool,
    retire: &mut dyn FnMut(),
    hybrid: bool,
) -> Option<i32> {
    if sys::stop_requested() {
        if hybrid {
            return None;
        }
        if let Some(log) = guard.access.as_mut() {
            log.flush();
        }
        return Some(exit::OK);
    }
    if !*retire_sent && guard.limit_reached() {
        // The master starts a replacement first, then asks this worker to stop: the
        // pool's capacity never dips. Meanwhile this worker goes on serving.
        tracing::info!("reached its recycling limit; asking the master for a replacement");
        retire();
        *retire_sent = true;
    }
    None
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
    let set_up = crate::net::handoff::set_nonblocking(socket.as_fd(), false).and_then(|()| {
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
/// arrive whole in time (`Context::partial_wait`); `None` when the handler panicked.
fn serve_handed_over<C: Connections>(
    mut client: Client,
    meta: &crate::net::handoff::Meta,
    channel: BorrowedFd<'_>,
    handler: &mut C,
    guard: &mut Guard<'_>,
    board: &'static Board,
) -> Option<Buffers> {
    guard.hold = Some(super::guard::Hold {
        since: guard.requests,
        at: std::time::Instant::now(),
    });
    let mut progress = Progress {
        served: meta.served,
        interim_sent: meta.interim_sent,
    };
    loop {
        match serve_admitted(client, handler, guard, board, Some(progress)) {
            Served::Closed(bufs) => return Some(bufs),
            Served::Panicked => return None,
            // No front takes connections back any more (the server stops: the fronts
            // left first): keep it, as in blocking mode, until it drains.
            // (Served again as handed over: the driver sets the socket's timeout again.)
            Served::HandBack(back, p) if !board.fronts_receiving() => {
                guard.hold = None;
                client = back;
                progress = p;
            }
            Served::HandBack(back, p) => {
                let meta = crate::net::handoff::Meta {
                    served: p.served,
                    interim_sent: p.interim_sent,
                    ..meta.clone()
                };
                let sent = crate::net::handoff::set_nonblocking(back.socket().as_fd(), true).and_then(|()| {
                    crate::net::handoff::send(channel, back.socket().as_fd(), &meta, back.buffered())
                });
                match sent {
                    Ok(()) => return Some(back.finish().1),
                    Err(e) => {
                        // The fronts do not take it now (the channel is full): keep it, as
                        // in blocking mode, for the rest of its life.
                        tracing::debug!(
                            "cannot hand the connection from {} back: {e}; keeping it",
                            back.peer_addr()
                        );
                        let _ = crate::net::handoff::set_nonblocking(back.socket().as_fd(), false);
                        guard.hold = None;
                        client = back;
                        progress = p;
                    }
                }
            }
        }
    }
}

/// How a connection's service ended.
enum Served {
    /// Closed; its buffers.
    Closed(Buffers),
    /// Hybrid mode: to be handed back to a front, with how far it got.
    HandBack(Client, Progress),
    /// The handler panicked: the connection is closed, the worker must exit.
    Panicked,
}

/// Serves an admitted connection, accounts for it, closes it and gives its buffers back
/// (or, in hybrid mode, returns it to be handed back); [`Served::Panicked`] when the
/// handler panicked (the connection is closed, and the worker must exit: the handler's
/// state may be broken). `resumed`: how far it got before (hybrid mode).
fn serve_admitted<C: Connections>(
    mut client: Client,
    handler: &mut C,
    guard: &mut Guard<'_>,
    board: &'static Board,
    resumed: Option<Progress>,
) -> Served {
    let (id, slot) = (guard.id, guard.slot);
    // The request-level loop times each request; for `handle_client` the connection is
    // the unit (its clock covers the whole connection).
    let connection_clock = (!handler.request_level()).then(|| {
        client.show_reads(board, id);
        board.set_state(id, State::Handling);
        slot.request_start(&[])
    });
    if guard.access.is_some() {
        guard.peer = Some(client.peer_addr().to_string());
    }
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| handler.serve(&mut client, guard, resumed)));
    let handed_back = matches!(outcome, Ok(Ok(Some(_))));
    account(guard, &mut client, connection_clock, &outcome, handed_back);
    let peer = client.peer_addr();
    match outcome {
        Ok(Ok(Some(p))) => Served::HandBack(client, p),
        Ok(result) => {
            let (flushed, bufs) = client.finish();
            if let Err(e) = result.map(|_| ()).and(flushed) {
                log_connection_error(&peer, &e);
            }
            Served::Closed(bufs)
        }
        Err(payload) => {
            tracing::error!(
                "handler panicked while serving {peer}: {}; connection closed, \
                 this worker exits and is replaced",
                panic_message(&payload)
            );
            // Close the connection now, then leave.
            drop(client);
            if let Some(log) = guard.access.as_mut() {
                log.flush();
            }
            Served::Panicked
        }
    }
}

/// The accounting of a served connection: its bytes on the scoreboard, and the clock
/// still running when it ended, closed and logged: the connection's own (`handle_client`),
/// or that of a request in progress (a bad request, a client that left or timed out half
/// way), so that the next connection does not inherit it (the request timeout would kill
/// an innocent worker). Requests answered in full were logged by the guard. A request
/// begun on a connection `handed_back` to a front (hybrid mode) goes with it: its clock
/// stops, uncounted and unlogged (the worker that answers it does both).
fn account<T>(
    guard: &mut Guard<'_>,
    client: &mut Client,
    connection_clock: Option<u64>,
    outcome: &std::thread::Result<io::Result<T>>,
    handed_back: bool,
) {
    let (received, sent) = client.take_traffic();
    guard.slot.add_bytes(received, sent);
    let open = match (connection_clock, guard.request.take()) {
        (Some(started), _) => Some((started, false)),
        (None, Some(started)) => Some((started, true)),
        (None, None) => None,
    };
    let Some((started, unanswered)) = open else {
        return;
    };
    guard.slot.request_end(started, false);
    if unanswered && handed_back {
        return;
    }
    if let (Some(log), Some(peer)) = (guard.access.as_mut(), guard.peer.as_deref()) {
        let took = Duration::from_nanos(crate::scoreboard::now_ns().saturating_sub(started));
        let head: &[u8] = if unanswered { &guard.head } else { b"" };
        log.line(peer, ended(outcome, unanswered), took, (received, sent), head);
    }
}

/// How a connection (`handle_client`) or a request left unanswered when its connection
/// ended (`unanswered`) is recorded in the access log: `timeout` when it timed out,
/// `closed` when the client left, an I/O error ended it or the handler panicked; otherwise
/// `ok` for a connection, and `error` for a request (the request loop answered it with the
/// codec's error reply).
fn ended<T>(outcome: &std::thread::Result<io::Result<T>>, unanswered: bool) -> Outcome {
    match outcome {
        Ok(Ok(_)) if unanswered => Outcome::Error,
        Ok(Ok(_)) => Outcome::Ok,
        Ok(Err(e)) if e.kind() == io::ErrorKind::TimedOut => Outcome::Timeout,
        Ok(Err(_)) | Err(_) => Outcome::Closed,
    }
}

/// The scoreboard, as admission sees it: this worker's slot, and the others'.
#[derive(Debug, Clone, Copy)]
struct SlotSeat<'a> {
    slot: &'a Slot,
    board: &'a Board,
}

impl Seat for SlotSeat<'_> {
    fn permitted(&mut self, peer: &Addr) {
        tracing::debug!("serving {peer}");
        self.slot.connection(peer);
    }

    fn connections_from(&self, ip: IpAddr) -> usize {
        self.board.connections_from(ip)
    }
}

/// Runs [`Admission`] on `client`'s socket and read buffer: Ok when the connection is to
/// be served, with the client's address (from its PROXY header) and TLS session in place.
///
/// Waits are bounded by the phase's deadline with `poll(2)`, from the clock: no socket
/// timeout is changed, so the connection's own (`--read-timeout`, `--write-timeout`)
/// apply afterwards as they were, and a header or handshake trickled a byte at a time is
/// cut at its deadline, not at the first read after it. A phase without a deadline is
/// bounded by the socket's own timeouts. A normal client's header costs one `poll` and one
/// `read`.
fn admit<S: Seat>(client: &mut Client, rules: Rules<'_>, mut seat: S) -> Result<(), Rejection> {
    if rules.open_to(client.parts().1) {
        // What the machine would do on such a listener, without building it.
        seat.permitted(client.parts().1);
        return Ok(());
    }
    // The clock is read only for a phase with a deadline (a PROXY header, a TLS handshake).
    let mut machine = Admission::start(rules, client.peer_addr(), seat, &mut Instant::now);
    loop {
        match machine.next() {
            Next::Read { by } => read(client, &mut machine, by),
            Next::Write { by } => write(client.socket(), &mut machine, by),
            Next::Serve | Next::Close => break,
        }
    }
    let verdict = machine.finish();
    if !verdict.unsent.is_empty() {
        // A TLS alert: best effort, without waiting.
        let _ = client
            .socket()
            .send_with_flags(&verdict.unsent, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
    }
    client.set_peer(verdict.peer);
    if let Some(session) = verdict.tls {
        client.set_tls(session);
    }
    verdict.rejected.map_or(Ok(()), Err)
}

/// One read for the machine, into the client's read buffer (where bytes after a PROXY
/// header stay for the handler).
fn read<S: Seat>(client: &mut Client, machine: &mut Admission<'_, S>, by: Option<Instant>) {
    if let Some(by) = by {
        if !wait(client.socket(), PollFlags::POLLIN, by) {
            machine.deadline_passed(Instant::now());
            return;
        }
    }
    match client.read_more(BUFFER_SIZE, false) {
        Ok(0) => machine.closed(),
        Ok(_) => {
            let n = machine.received(client.buffered(), Instant::now());
            client.consume_input(n);
        }
        Err(e) => machine.failed(&e),
    }
}

/// One write of the machine's pending bytes (TLS records), straight to the socket (they
/// are not the handler's output).
fn write<S: Seat>(socket: &Socket, machine: &mut Admission<'_, S>, by: Option<Instant>) {
    // With a deadline, the wait is ours (poll); without, the socket's send timeout.
    let flags = libc::MSG_NOSIGNAL | if by.is_some() { libc::MSG_DONTWAIT } else { 0 };
    match socket.send_with_flags(machine.pending(), flags) {
        Ok(0) => machine.failed(&io::ErrorKind::WriteZero.into()),
        Ok(n) => machine.sent(n, Instant::now()),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && by.is_some() => {
            if by.is_some_and(|by| !wait(socket, PollFlags::POLLOUT, by)) {
                machine.deadline_passed(Instant::now());
            }
        }
        Err(e) => machine.failed(&e),
    }
}

/// Waits until `socket` is ready for `events` (or in error) or `by` passes: false when
/// it passed. Signals do not end the wait (a stop does not interrupt a connection).
fn wait(socket: &Socket, events: PollFlags, by: Instant) -> bool {
    loop {
        let left = by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut fds = [PollFd::new(socket.as_fd(), events)];
        match nix::poll::poll(&mut fds, sys::poll_timeout(left)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => {}
            // Ready, or an error the read or write will report.
            Ok(_) | Err(_) => return true,
        }
    }
}

/// The one rejection path, as the blocking driver takes it: the ledger's accounting (the
/// kind's counter, its line once per episode), then the close (for a client over the cap,
/// after the codec's refusal).
fn reject<C: Connections>(
    rejections: &mut Rejections,
    why: Rejection,
    client: &mut Client,
    slot: &Slot,
    handler: &mut C,
) {
    let over_cap = matches!(why, Rejection::OverCap { .. });
    rejections.note(why, &client.peer_addr(), slot);
    if over_cap {
        handler.refuse(client, "too many connections from your address");
    } else {
        // Closed at once, before any handler code.
        let _ = client.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One rule set for the access log's outcome, for connections (`handle_client`) and
    /// for requests cut short alike.
    #[test]
    fn the_access_logs_outcome_follows_one_rule_set() {
        let timed_out = || -> std::thread::Result<io::Result<()>> {
            Ok(Err(io::Error::new(io::ErrorKind::TimedOut, "t")))
        };
        let reset = || -> std::thread::Result<io::Result<()>> {
            Ok(Err(io::Error::from(io::ErrorKind::ConnectionReset)))
        };
        let panicked = || -> std::thread::Result<io::Result<()>> { Err(Box::new("boom")) };
        for unanswered in [false, true] {
            assert_eq!(ended(&timed_out(), unanswered), Outcome::Timeout);
            assert_eq!(ended(&reset(), unanswered), Outcome::Closed);
            assert_eq!(ended(&panicked(), unanswered), Outcome::Closed);
        }
        assert_eq!(ended(&Ok(Ok(())), false), Outcome::Ok);
        // The request loop answered the request with the codec's error reply.
        assert_eq!(ended(&Ok(Ok(())), true), Outcome::Error);
        // Handed back to a front (hybrid mode): the connection's requests were answered.
        assert_eq!(ended(&Ok(Ok(Some(3u32))), false), Outcome::Ok);
    }

    /// A wait ends at its deadline, not before, when nothing comes.
    #[test]
    fn a_wait_for_the_client_ends_at_the_deadline() {
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let socket = Socket::from(std::os::fd::OwnedFd::from(ours));
        let by = Instant::now() + Duration::from_millis(50);
        assert!(!wait(&socket, PollFlags::POLLIN, by));
        assert!(Instant::now() >= by);
        assert!(wait(
            &socket,
            PollFlags::POLLOUT,
            Instant::now() + Duration::from_secs(30)
        ));
    }

    #[derive(Debug, Clone, Copy)]
    struct Nobody;

    impl Seat for Nobody {
        fn permitted(&mut self, _: &Addr) {}
        fn connections_from(&self, _: IpAddr) -> usize {
            1
        }
    }

    /// The driver's waits end at the phase's deadline, from the clock: a PROXY header that
    /// stops half way is cut at the header timeout, although the socket's own read
    /// timeout is far longer (and is left as it was, for the handler).
    #[test]
    fn admission_cuts_a_stalled_proxy_header_at_its_deadline() {
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let socket = Socket::from(std::os::fd::OwnedFd::from(ours));
        socket.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut client = Client::new(socket, Addr::Unix(None), Buffers::new());
        let policy = crate::net::listener::Policy {
            proxy: true,
            ..Default::default()
        };
        let rules = Rules {
            policy: &policy,
            tls: None,
            header_timeout: Some(Duration::from_millis(300)),
            handshake_timeout: None,
            max_per_ip: None,
            penalties: None,
        };
        std::io::Write::write_all(&mut theirs, b"PROXY TCP4 203.0.113.9 ").unwrap();
        let started = Instant::now();
        let why = admit(&mut client, rules, Nobody).unwrap_err();
        let took = started.elapsed();
        assert_eq!(
            why.to_string(),
            "its PROXY header was not complete within 300ms (--header-timeout)"
        );
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(
            took < Duration::from_secs(30),
            "the socket's timeout ended it: {took:?}"
        );
        assert_eq!(client.read_timeout().unwrap(), Some(Duration::from_secs(60)));

        // A whole header with the request behind it: admitted, the request kept.
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let socket = Socket::from(std::os::fd::OwnedFd::from(ours));
        let mut client = Client::new(socket, Addr::Unix(None), Buffers::new());
        std::io::Write::write_all(&mut theirs, b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 80\r\nGET /").unwrap();
        admit(&mut client, rules, Nobody).unwrap();
        assert_eq!(
            client.peer_addr(),
            Addr::Inet("203.0.113.9:5555".parse().unwrap())
        );
        assert_eq!(client.buffered(), b"GET /");
    }
}

//! The blocking driver (`--io blocking`): one connection at a time, from accept to close.
//!
//! A [`Driver`] like the others: the worker's set-up, the ledger and the request step are
//! shared; what is its own is the wait for a connection (the acceptor), admission with
//! `poll(2)` waits, and the keep-alive guard (`guard.rs`). The hybrid worker's driver
//! (`hybrid.rs`) is this loop plus the connections a front hands over.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};
use socket2::Socket;

use crate::codec::ProtocolError;
use crate::conn::client::{BUFFER_SIZE, Buffers, Client, SendWatch};
use crate::net::listener::{Addr, Listener};
use crate::net::tls::ForWorker;
use crate::scoreboard::{Board, Slot, State};
use crate::sys::{self, exit};

use super::ConnLimits;
use super::Setup;
use super::accept::{Accepted, Acceptor};
use super::admission::{Admission, Next, Rules, Seat, Verdict};
use super::driver::{Driver, Extras, Serves, Shared, accepts_on, rules};
use super::guard::{Guard, UNLOGGED};
use super::ledger::{Ledger, Panicked, contain, log_connection_error};
use super::life::{Ended, Life, Ns, Then, Unit};
use super::serve::{Connections, Progress};

/// The blocking driver (`--io blocking`): its acceptor (an epoll instance when it waits
/// on several listeners), made before `Ready`, and the keep-alive timeout its guard holds
/// connections to.
#[derive(Debug)]
pub(crate) struct Blocking<'a> {
    acceptor: Acceptor<'a>,
    keepalive_timeout: Option<Duration>,
}

impl<'a> Blocking<'a> {
    /// The driver for the listeners this process accepts on, and in hybrid mode the
    /// connections handed over on the channel's end `handoff` (the hybrid worker's).
    pub(crate) fn new(setup: &Setup<'a>, handoff: Option<BorrowedFd<'a>>) -> Result<Self, String> {
        let acceptor = Acceptor::new(
            setup.id,
            setup.listeners,
            setup.board,
            &|i| accepts_on(setup, i),
            handoff,
        )
        .map_err(|e| format!("cannot wait for connections: {e}"))?;
        Ok(Blocking {
            acceptor,
            keepalive_timeout: setup.drivers.keepalive_timeout,
        })
    }
}

impl<'a> Driver<'a> for Blocking<'a> {
    fn prepare(setup: &Setup<'a>, _: &'static Slot, _: Extras<'a>) -> Result<Self, String> {
        Blocking::new(setup, None)
    }
}

impl<'a, C: Connections> Serves<'a, C> for Blocking<'a> {
    fn serve(self, shared: Shared<'a>, level: &mut C) -> i32 {
        serve::<C>(self, shared, level, None)
    }
}

/// The connections a hybrid worker's acceptor also takes, from the hand-off channel: the
/// channel's end, and what is done with each (`hybrid.rs`), so that this loop names no
/// other driver.
pub(crate) struct HandOffs<'a, C> {
    pub(crate) channel: BorrowedFd<'a>,
    #[allow(clippy::type_complexity)]
    pub(crate) take:
        fn(&mut Loop<'a, '_, C>, crate::net::handoff::Received, &crate::net::handoff::Inbox) -> Option<i32>,
}

/// Serves connections until a stop; returns the worker's exit status. `handoffs`: the
/// hybrid worker's, whose connections the acceptor also takes (see [`HandOffs`]).
pub(crate) fn serve<'a, C: Connections>(
    driver: Blocking<'a>,
    shared: Shared<'a>,
    level: &mut C,
    handoffs: Option<HandOffs<'a, C>>,
) -> i32 {
    let Blocking {
        mut acceptor,
        keepalive_timeout,
    } = driver;
    let Shared {
        id,
        board,
        slot,
        listeners,
        tls,
        limits,
        max_per_ip,
        ledger,
    } = shared;
    let mut l = Loop {
        guard: Guard {
            id,
            listeners,
            board,
            keepalive_timeout,
            ledger,
            clock: false,
            life: None,
            peer: None,
            refusal: None,
            hold: None,
            tallied: (0, 0),
        },
        level,
        slot,
        board,
        listeners,
        tls,
        limits,
        max_per_ip,
        handoffs,
        buffers: Some(Buffers::new()),
    };
    loop {
        // Lines are written before the worker may wait: a quiet server holds none back.
        l.guard.ledger.flush();
        let stop = match acceptor.accept() {
            Accepted::Connection(socket, peer, index) => l.accepted(socket, &peer, index),
            Accepted::HandedOff(received) => {
                let inbox = acceptor.inbox().expect("a hand-off comes from the channel");
                let take = l.handoffs.as_ref().expect("an acceptor with a channel").take;
                take(&mut l, received, inbox)
            }
            Accepted::Stop => return exit::OK,
            Accepted::Reopen => {
                l.guard.ledger.reopen();
                None
            }
        };
        if let Some(code) = stop {
            return code;
        }
    }
}

/// The blocking loop's state between connections: what each connection is served with,
/// and what carries over from one to the next (the buffers, reused; the ledger). One
/// place, so that each kind of connection (accepted here, handed over by a front, in
/// `hybrid.rs`) is a function of its own.
pub(crate) struct Loop<'a, 'l, C> {
    pub(crate) guard: Guard<'a>,
    pub(crate) level: &'l mut C,
    pub(crate) slot: &'a Slot,
    pub(crate) board: &'static Board,
    pub(crate) listeners: &'a [Listener],
    tls: &'a ForWorker,
    pub(crate) limits: ConnLimits,
    max_per_ip: Option<usize>,
    /// Hybrid mode: the connections handed over.
    pub(crate) handoffs: Option<HandOffs<'a, C>>,
    /// The last connection's buffers, for the next one (`None` only while one is served).
    pub(crate) buffers: Option<Buffers>,
}

impl<C: Connections> Loop<'_, '_, C> {
    /// A connection this worker accepted: admitted (or refused, with its rejection's reply
    /// and log line), then served to its end. Returns the worker's exit status if it stops
    /// now (a handler panic, a stop).
    fn accepted(&mut self, socket: Socket, peer: &socket2::SockAddr, index: usize) -> Option<i32> {
        self.slot.forget_peer();
        if sys::take_reopen_request() {
            self.guard.ledger.reopen();
        }
        let peer = Addr::from_sockaddr(peer);
        let mut client = Client::new(socket, peer, self.buffers.take().unwrap_or_else(Buffers::new));
        self.watch_sends(&mut client);
        let rules = rules(self.listeners, self.tls, &self.limits, self.max_per_ip, index);
        let seat = SlotSeat {
            slot: self.slot,
            board: self.board,
        };
        let unit = unit(self.level);
        let life = match admit(&mut client, rules, seat, unit, &mut self.guard.ledger) {
            (life, Then::Serve) => life,
            (_, then) => {
                refuse(then, &mut client, self.level);
                let (_, bufs) = client.finish();
                self.buffers = Some(bufs);
                return None;
            }
        };
        self.guard.hold = None;
        let bufs = match serve_admitted(client, life, self.level, &mut self.guard, self.board, None) {
            Served::Closed(bufs) => bufs,
            Served::HandBack(client, ..) => client.finish().1,
            Served::Panicked(code) => return Some(code),
        };
        self.buffers = Some(bufs);
        after_connection(&mut self.guard, self.handoffs.is_some())
    }

    /// `--min-send-rate`: the client's sends are watched.
    pub(crate) fn watch_sends(&self, client: &mut Client) {
        if self.limits.min_send_rate > 0 {
            client.watch_sends(SendWatch::new(
                self.limits.min_send_rate,
                self.limits.write_timeout,
            ));
        }
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
pub(crate) fn after_connection(guard: &mut Guard<'_>, hybrid: bool) -> Option<i32> {
    if sys::stop_requested() {
        if hybrid {
            return None;
        }
        guard.ledger.flush();
        return Some(exit::OK);
    }
    guard.ledger.check_recycle();
    None
}

/// How a connection's service ended.
// The `Client` moves once per connection, by value: boxing it would allocate at each
// hybrid hand-back.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Served {
    /// Closed; its buffers.
    Closed(Buffers),
    /// Hybrid mode: to be handed back to a front, with how far it got, and its life (its
    /// request clock stopped: the front's next worker answers it).
    HandBack(Client, Progress, Life<Ns>),
    /// The handler panicked: the connection is closed, the worker must exit with this
    /// status.
    Panicked(i32),
}

/// Serves an admitted connection, accounts for it, closes it and gives its buffers back
/// (or, in hybrid mode, returns it to be handed back); [`Served::Panicked`] when the
/// handler panicked (the connection is closed, and the worker must exit: the handler's
/// state may be broken). `resumed`: how far it got before (hybrid mode).
pub(crate) fn serve_admitted<C: Connections>(
    mut client: Client,
    mut life: Life<Ns>,
    level: &mut C,
    guard: &mut Guard<'_>,
    board: &'static Board,
    resumed: Option<Progress>,
) -> Served {
    let (id, slot) = (guard.id, guard.ledger.slot());
    // The request-level loop times each request; for `handle_client` the connection is
    // the unit (its clock covers the whole connection).
    if !level.request_level() {
        client.show_reads(board, id);
        board.set_state(id, State::Handling);
        let now = slot.request_start(&[]);
        guard.clock = true;
        life.opened(Ns(now));
    }
    guard.life = Some(life);
    guard.peer = guard.ledger.logs_access().then(|| client.peer_addr().clone());
    let outcome = contain(|| level.serve(&mut client, guard, resumed));
    let handed_back = matches!(outcome, Ok(Ok(Some(_))));
    // What a handler that returned left in the client's buffer goes out before the
    // connection is accounted, so that its line counts it (issue 43: `hello` was logged
    // `out=0`); the request level's step has flushed its responses already.
    let flushed = match &outcome {
        Ok(Ok(None)) => io::Write::flush(&mut client),
        _ => Ok(()),
    };
    let life = account(guard, &mut client, &outcome, handed_back);
    let peer = client.peer_addr().clone();
    match (outcome, life) {
        (Ok(Ok(Some(p))), Some(life)) => Served::HandBack(client, p, life),
        // (A connection handed back always has its life: `account` returns it.)
        (Ok(result), _) => {
            let (finished, bufs) = client.finish();
            if let Err(e) = result.map(|_| ()).and(flushed).and(finished) {
                log_connection_error(&peer, &e);
            }
            Served::Closed(bufs)
        }
        (Err(panic), _) => {
            // Close the connection now, then leave.
            drop(client);
            Served::Panicked(guard.ledger.panicked(
                format_args!("handler panicked while serving {peer}"),
                &panic,
                "connection closed, this worker exits and is replaced",
            ))
        }
    }
}

/// The accounting of a served connection: its bytes on the scoreboard, the slot's clock
/// stopped if it still runs (a `handle_client` connection's, or that of a request in
/// progress: a bad request, a client that left or timed out half way), so that the next
/// connection does not inherit it (the request timeout would kill an innocent worker),
/// and its close by the one life (`life.rs`): the line of a request left unanswered or of
/// the connection. A request begun on a connection `handed_back` to a front (hybrid mode)
/// goes with it, uncounted and unlogged (the worker that answers it does both): its life
/// is returned, to be handed over or served on.
fn account<T>(
    guard: &mut Guard<'_>,
    client: &mut Client,
    outcome: &Result<io::Result<T>, Panicked>,
    handed_back: bool,
) -> Option<Life<Ns>> {
    let (received, sent) = client.take_traffic();
    // What the request boundaries have not counted yet (see `Context::moved`).
    let untallied = guard.untallied((received, sent));
    guard.tallied = (0, 0);
    let slot = guard.ledger.slot();
    slot.add_bytes(untallied.0, untallied.1);
    let refusal = guard.refusal.take();
    let stopped = std::mem::take(&mut guard.clock).then(|| {
        let now = crate::scoreboard::now_ns();
        slot.request_stop(now);
        now
    });
    let peer = guard.peer.take();
    let mut life = guard.life.take()?;
    if handed_back {
        life.hand_over();
        return Some(life);
    }
    life.close(
        &mut guard.ledger,
        peer.as_ref().unwrap_or(&UNLOGGED),
        ending(outcome, refusal.as_ref()),
        (received, sent),
        || Ns(stopped.unwrap_or_else(crate::scoreboard::now_ns)),
    );
    None
}

/// How the blocking loop knows a connection's end: the handler's or the step's I/O
/// result, the step's refusal (which wins: [`Ended::of`]), or a panic.
fn ending<'e, T>(outcome: &Result<io::Result<T>, Panicked>, refusal: Option<&'e ProtocolError>) -> Ended<'e> {
    match outcome {
        Ok(Ok(_)) => Ended::of(refusal, None),
        Ok(Err(e)) => Ended::of(refusal, Some(e.kind())),
        Err(_) => Ended::Panicked,
    }
}

/// What a connection's access-log lines are about at `level`.
fn unit<C: Connections>(level: &C) -> Unit {
    if level.request_level() {
        Unit::Requests
    } else {
        Unit::Connection
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
        self.slot.connection(peer);
    }

    fn connections_from(&self, ip: IpAddr) -> usize {
        self.board.connections_from(ip)
    }
}

/// Runs [`Admission`] on `client`'s socket and read buffer, and applies its verdict by the
/// one life ([`Life::admitted`]): the client's address (from its PROXY header) and TLS
/// session in place, and what to do with the connection.
///
/// Waits are bounded by the phase's deadline with `poll(2)`, from the clock: no socket
/// timeout is changed, so the connection's own (`--read-timeout`, `--write-timeout`)
/// apply afterwards as they were, and a header or handshake trickled a byte at a time is
/// cut at its deadline, not at the first read after it. A phase without a deadline is
/// bounded by the socket's own timeouts. A normal client's header costs one `poll` and one
/// `read`.
fn admit<S: Seat>(
    client: &mut Client,
    rules: Rules<'_>,
    seat: S,
    unit: Unit,
    ledger: &mut Ledger<'_>,
) -> (Life<Ns>, Then) {
    let mut life = Life::new(unit);
    match admission(client, rules, seat) {
        None => {
            life.serve(ledger, client.peer_addr());
            (life, Then::Serve)
        }
        Some(verdict) => {
            let (peer, then) = life.admitted(verdict, None, client, ledger);
            client.set_peer(peer);
            (life, then)
        }
    }
}

/// Admission's I/O: its machine run over `client`'s socket, `None` for a listener with
/// no rule to check (what the machine would do on it, without building it).
fn admission<S: Seat>(client: &mut Client, rules: Rules<'_>, mut seat: S) -> Option<Verdict> {
    if rules.open_to(client.parts().1) {
        seat.permitted(client.parts().1);
        return None;
    }
    // The clock is read only for a phase with a deadline (a PROXY header, a TLS handshake).
    let mut machine = Admission::start(rules, client.peer_addr().clone(), seat, &mut Instant::now);
    loop {
        match machine.next() {
            Next::Read { by } => read(client, &mut machine, by),
            Next::Write { by } => write(client.socket(), &mut machine, by),
            Next::Serve | Next::Close => break,
        }
    }
    Some(machine.finish())
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

/// A rejected connection's end, as the blocking driver takes it (the ledger accounted
/// for it already, in [`Life::admitted`]): the codec's refusal for a client over the cap,
/// else the close at once, before any handler code.
fn refuse<C: Connections>(then: Then, client: &mut Client, level: &mut C) {
    match then {
        Then::Refuse(refusal) => level.refuse(client, refusal),
        Then::Close | Then::Serve => {
            let _ = client.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The access log's one rule (issue 42), as the blocking loop applies it: a timeout
    /// (the socket's, or the step's refusal of a head too slow) is `timeout`, a client
    /// that reset the connection is `closed`, a panic and a malformed request are `error`,
    /// for connections (`handle_client`) and requests cut short alike. The rule itself is
    /// `Life::close`'s (issue 43); this is the blocking loop's reading of its results.
    #[test]
    fn issue_42_the_blocking_loop_keeps_the_one_outcome_rule() {
        use super::super::access::Outcome;
        use super::super::ledger::tests::ledger_with_log;
        use super::super::life::Unit;
        static RETIRED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let (mut ledger, path) = ledger_with_log("blocking-rule", super::super::Recycle::default(), &RETIRED);
        let mut rule = |outcome: Result<io::Result<Option<u32>>, Panicked>,
                        unanswered: bool,
                        why: Option<&ProtocolError>| {
            let peer = Addr::Inet("192.0.2.1:1".parse().unwrap());
            let unit = if unanswered {
                Unit::Requests
            } else {
                Unit::Connection
            };
            let mut life: Life = Life::new(unit);
            life.serve(&mut ledger, &peer);
            life.opened(Instant::now());
            life.request_start(&mut ledger, crate::conn::step::Head::same(b"R"), Instant::now());
            life.close(&mut ledger, &peer, ending(&outcome, why), (0, 0), Instant::now)
                .unwrap()
        };
        let timed_out = || Ok(Err(io::Error::new(io::ErrorKind::TimedOut, "t")));
        let reset = || Ok(Err(io::Error::from(io::ErrorKind::ConnectionReset)));
        let failed = || Ok(Err(io::Error::other("the handler's own")));
        let panicked = || Err(Panicked("boom".into()));
        for unanswered in [false, true] {
            assert_eq!(rule(timed_out(), unanswered, None), Outcome::Timeout);
            assert_eq!(rule(reset(), unanswered, None), Outcome::Closed);
            assert_eq!(rule(failed(), unanswered, None), Outcome::Error);
            assert_eq!(rule(panicked(), unanswered, None), Outcome::Error);
        }
        assert_eq!(rule(Ok(Ok(None)), false, None), Outcome::Ok);
        // The request loop answered the request with the codec's error reply.
        let slow = ProtocolError::Timeout;
        let bad = ProtocolError::Malformed("bad request line".into());
        assert_eq!(rule(Ok(Ok(None)), true, Some(&slow)), Outcome::Timeout);
        assert_eq!(rule(Ok(Ok(None)), true, Some(&bad)), Outcome::Error);
        // A refusal wins over the error sending it (the client gone).
        let gone = Ok(Err(io::Error::from(io::ErrorKind::BrokenPipe)));
        assert_eq!(rule(gone, true, Some(&slow)), Outcome::Timeout);
        let _ = std::fs::remove_file(&path);
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
        let why = admission(&mut client, rules, Nobody).unwrap().rejected.unwrap();
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
        let verdict = admission(&mut client, rules, Nobody).unwrap();
        assert!(verdict.rejected.is_none());
        assert_eq!(verdict.peer, Addr::Inet("203.0.113.9:5555".parse().unwrap()));
        assert_eq!(client.buffered(), b"GET /");
    }
}

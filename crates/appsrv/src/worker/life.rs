//! One life of a connection, the same in every driver (issue 43): the verdict of
//! admission applied, the request clock, and the close with the access log's outcome
//! rule and the per-address count given back.
//!
//! Redis has one admission (`acceptCommonHandler`) and one close (`freeClient`) for every
//! transport, nginx one close (`ngx_close_connection`) for every protocol. Here each
//! driver used to write these steps itself (the blocking loop, the event loop, the async
//! driver: three copies of the verdict's application, three request clocks, four copies
//! of the outcome's choice), and the copies drifted apart: a request cut by the read
//! timeout was logged `error` by one model and `timeout` by the others. A driver now keeps
//! only what is its own, how it waits; what a connection's life leaves in the accounts is
//! decided here, once, by a [`Life`] that the driver holds for each connection and that
//! reports to the worker's [`Ledger`].
//!
//! What is not here, on purpose: what each driver publishes on its scoreboard slot while
//! a request runs (the blocking loop's request clock, which the master's
//! `--request-timeout` watches; the event loop's handler call), since the master watches
//! each model differently.

use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use socket2::Socket;

use crate::codec::ProtocolError;
use crate::conn::client::Client;
use crate::conn::step::Head;
use crate::conn::transport::Transport;
use crate::net::listener::Addr;
use crate::net::tls::TlsSession;
use crate::peer_counts::PeerCounts;

use super::access::{End, Outcome};
use super::admission::Verdict;
use super::ledger::Ledger;

/// What a connection's transport offers admission's verdict: the socket for a last alert,
/// and a place for the TLS session. A [`Transport`] in the non-blocking drivers, a
/// [`Client`] (which owns one) in the blocking loop.
pub(crate) trait Admits {
    /// The connection's socket.
    fn socket(&self) -> &Socket;
    /// The TLS session, its handshake done.
    fn set_tls(&mut self, session: Box<TlsSession>);
}

impl Admits for Transport {
    fn socket(&self) -> &Socket {
        Transport::socket(self)
    }
    fn set_tls(&mut self, session: Box<TlsSession>) {
        Transport::set_tls(self, session);
    }
}

impl Admits for Client {
    fn socket(&self) -> &Socket {
        Client::socket(self)
    }
    fn set_tls(&mut self, session: Box<TlsSession>) {
        Client::set_tls(self, session);
    }
}

/// What the driver does with a connection once admission decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    /// Serve it.
    Serve,
    /// Refuse it with the codec's error reply carrying this reason (HTTP 503, `-ERR`),
    /// then close it.
    Refuse(&'static str),
    /// Close it at once, before any handler code.
    Close,
}

/// The unit a connection's access-log lines are about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// The request level: one line per request.
    Requests,
    /// The client level (`handle_client`): one line for the connection.
    Connection,
}

/// How a connection's driving ended, as its driver saw it: the input of the close.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ended<'e> {
    /// In order: the handler returned `Ok` (the client level), or the step closed (the
    /// request level: the client's close between requests, a stop, `Connection: close`).
    Clean,
    /// The step refused the request in progress with the codec's error reply.
    Refused(&'e ProtocolError),
    /// An I/O error ended it (the client's reset, a socket timeout), or the
    /// `handle_client` handler's error.
    Failed(io::ErrorKind),
    /// The user's code panicked.
    Panicked,
    /// The worker's clock cut the call (`--request-timeout` in the async model).
    Cut,
}

impl Ended<'_> {
    /// The step's refusal if there was one, else the I/O error if there was one, else a
    /// clean end: how the event loop and the async driver know a connection's end. A
    /// refusal wins: the request was refused, and an error sending the refusal (the client
    /// gone) does not change what happened to it.
    pub(crate) fn of<'e>(refused: Option<&'e ProtocolError>, failed: Option<io::ErrorKind>) -> Ended<'e> {
        match (refused, failed) {
            (Some(why), _) => Ended::Refused(why),
            (None, Some(kind)) => Ended::Failed(kind),
            (None, None) => Ended::Clean,
        }
    }
}

/// A client address counted in the pool-wide table of connections per address
/// (`--max-conns-per-ip` in the event and async models); given back when dropped, so that
/// no path out of a connection (a close, a hand-off, a panic unwinding) can keep it.
pub(crate) struct Counted {
    peers: &'static PeerCounts,
    worker: u32,
    ip: IpAddr,
}

impl Counted {
    /// `ip`, counted by worker `worker` in `peers` (the count is already taken).
    pub(crate) fn new(peers: &'static PeerCounts, worker: u32, ip: IpAddr) -> Self {
        Counted { peers, worker, ip }
    }
}

impl Counted {
    /// The address, its count handed to whoever takes it (who gives it back).
    pub(crate) fn into_ip(self) -> IpAddr {
        let ip = self.ip;
        std::mem::forget(self);
        ip
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.peers.remove(self.worker, self.ip);
    }
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counted")
            .field("ip", &self.ip)
            .finish_non_exhaustive()
    }
}

/// A reading of the monotonic clock, as a driver keeps it: the request clock takes its
/// times from the driver, which reads the clock anyway (the event loop once a turn, the
/// blocking loop for the scoreboard's request clock, which the master watches), so that
/// one life costs no clock read of its own.
pub(crate) trait Stamp: Copy + std::fmt::Debug {
    /// The time from `earlier` to this reading (zero if `earlier` is later).
    fn since(self, earlier: Self) -> Duration;
}

impl Stamp for Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// The scoreboard's clock: nanoseconds of `CLOCK_MONOTONIC` (`scoreboard::now_ns`), the
/// same in every process, which the blocking loop reads for the master's request clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ns(pub(crate) u64);

impl Stamp for Ns {
    fn since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// One connection's life in the worker's accounts (see the module's documentation). The
/// client's address is the driver's to keep (its step and its log lines need it while the
/// life is borrowed): the life is told it where it writes a line. Its times are the
/// driver's clock's ([`Stamp`]).
#[derive(Debug)]
pub(crate) struct Life<S: Stamp = Instant> {
    unit: Unit,
    /// The client level: when the connection began to be served.
    opened: Option<S>,
    /// The request level: when the request in progress began.
    request: Option<S>,
    /// The per-address count it holds, if any.
    counted: Option<Counted>,
}

impl<S: Stamp> Life<S> {
    /// A connection accepted (or taken over from another process), at `unit`'s level;
    /// admission comes next.
    pub(crate) fn new(unit: Unit) -> Self {
        Life {
            unit,
            opened: None,
            request: None,
            counted: None,
        }
    }

    /// A connection admitted without admission's machine (a listener with no rule to
    /// check), about to be served: counted toward `--max-connections`.
    pub(crate) fn serve(&mut self, ledger: &mut Ledger<'_>, peer: &Addr) {
        tracing::debug!("serving {peer}");
        ledger.connection();
    }

    /// Admission's verdict applied, the same in every driver: the last bytes it left (a
    /// TLS alert) sent without waiting, the TLS session put in place, and either the
    /// connection counted toward `--max-connections` and served, or its rejection
    /// accounted (the kind's counter and its line once per episode) and the connection
    /// refused with the codec's reply or closed at once. `counted`: the per-address count
    /// admission took, which the life gives back. Returns the client (the one the PROXY
    /// header names, or the connection's own peer) and what to do.
    pub(crate) fn admitted(
        &mut self,
        verdict: Verdict,
        counted: Option<Counted>,
        transport: &mut impl Admits,
        ledger: &mut Ledger<'_>,
    ) -> (Addr, Then) {
        if !verdict.unsent.is_empty() {
            // Best effort, without waiting.
            let _ = transport
                .socket()
                .send_with_flags(&verdict.unsent, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
        }
        if let Some(session) = verdict.tls {
            transport.set_tls(session);
        }
        self.counted = counted;
        let Some(why) = verdict.rejected else {
            self.serve(ledger, &verdict.peer);
            return (verdict.peer, Then::Serve);
        };
        let then = match ledger.reject(why, &verdict.peer) {
            Some(refusal) => Then::Refuse(refusal),
            None => Then::Close,
        };
        (verdict.peer, then)
    }

    /// The per-address count this connection holds from now on (one handed back to a
    /// hybrid front, counted there again).
    pub(crate) fn count(&mut self, counted: Counted) {
        self.counted = Some(counted);
    }

    /// The per-address count, taken: whoever takes it gives it back (a hybrid front keeps
    /// a connection's count until a worker has it).
    pub(crate) fn take_counted(&mut self) -> Option<Counted> {
        self.counted.take()
    }

    /// The client level: the connection's handler is called now, at `now` (its line's
    /// duration counts from there).
    pub(crate) fn opened(&mut self, now: S) {
        self.opened = Some(now);
    }

    /// Whether a request is in progress (begun, not answered).
    pub(crate) fn in_request(&self) -> bool {
        self.request.is_some()
    }

    /// A request begins at `now`, with its first bytes and what is published of them.
    pub(crate) fn request_start(&mut self, ledger: &mut Ledger<'_>, head: Head<'_>, now: S) {
        self.request_begun(now);
        ledger.request_head(head);
    }

    /// A request begins at `now`, its first bytes kept by the driver, which gives them to
    /// the ledger at its end (the async driver: its connections' requests interleave in
    /// one ledger).
    pub(crate) fn request_begun(&mut self, now: S) {
        self.request = Some(now);
    }

    /// More of the request's first bytes arrived.
    pub(crate) fn request_head(&mut self, ledger: &mut Ledger<'_>, head: Head<'_>) {
        ledger.request_head(head);
    }

    /// The request in progress was answered at `ended`: counted and logged by the ledger
    /// (`bytes`: request and response lengths; `ok`: the handler succeeded). Returns how
    /// long it took, `None` if no request was in progress.
    pub(crate) fn request_end(
        &mut self,
        ledger: &mut Ledger<'_>,
        peer: &Addr,
        ended: S,
        bytes: (u64, u64),
        ok: bool,
    ) -> Option<Duration> {
        let started = self.request.take()?;
        let took = ended.since(started);
        ledger.request_end(peer, took, bytes, ok);
        Some(took)
    }

    /// The connection goes to another process with its request in progress (a hybrid
    /// worker hands it back to a front, a front hands it to a worker): the request's
    /// clock stops, uncounted and unlogged here, since the process that answers it does
    /// both. (A hybrid worker that cannot hand it back serves it on with the same life.)
    pub(crate) fn hand_over(&mut self) {
        self.request = None;
    }

    /// The one close (issue 43): the access-log line of a request left unanswered, or of
    /// a client-level connection, by the one outcome rule ([`Outcome::of`]); the
    /// per-address count given back (when `self` drops). `bytes`: what the connection
    /// received and sent; `now` reads the clock, only when a line is written. Returns the
    /// outcome of the line written, if any.
    pub(crate) fn close(
        mut self,
        ledger: &mut Ledger<'_>,
        peer: &Addr,
        ended: Ended<'_>,
        bytes: (u64, u64),
        now: impl FnOnce() -> S,
    ) -> Option<Outcome> {
        self.closing(ledger, peer, ended, bytes, now)
    }

    /// As [`close`](Life::close), for a driver that closes a connection from its own
    /// record and drops the record (and the life's count with it) later.
    pub(crate) fn closing(
        &mut self,
        ledger: &mut Ledger<'_>,
        peer: &Addr,
        ended: Ended<'_>,
        bytes: (u64, u64),
        now: impl FnOnce() -> S,
    ) -> Option<Outcome> {
        let (started, end) = match self.unit {
            Unit::Connection => (
                self.opened.take()?,
                match ended {
                    Ended::Clean => End::Answered { ok: true },
                    Ended::Refused(why) => End::Refused(why),
                    Ended::Failed(kind) => End::Failed(kind),
                    Ended::Panicked => End::Panicked,
                    Ended::Cut => End::Cut,
                },
            ),
            Unit::Requests => {
                let started = self.request.take()?;
                if !ledger.logs_access() {
                    return None;
                }
                let end = match ended {
                    // The step closed with the request unanswered and without a refusal
                    // (the client closed between two reads, a stop): it was dropped.
                    Ended::Clean => End::Dropped,
                    Ended::Refused(why) => End::Refused(why),
                    Ended::Failed(kind) => End::Failed(kind),
                    Ended::Panicked => End::Panicked,
                    Ended::Cut => End::Cut,
                };
                (started, end)
            }
        };
        let outcome = Outcome::of(end);
        let took = now().since(started);
        match self.unit {
            Unit::Connection => ledger.connection_end(peer, outcome, took, bytes),
            Unit::Requests => ledger.request_unanswered(peer, outcome, took, bytes),
        }
        Some(outcome)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;
    use crate::worker::Recycle;
    use crate::worker::admission::Rejection;
    use crate::worker::ledger::tests::ledger_with_log;

    fn inet(s: &str) -> Addr {
        Addr::Inet(s.parse().unwrap())
    }

    /// A transport with nothing behind it but one end of a socket pair: what admission's
    /// verdict does to it is seen from the other end.
    struct Fake {
        socket: Socket,
        tls: bool,
    }

    impl Admits for Fake {
        fn socket(&self) -> &Socket {
            &self.socket
        }
        fn set_tls(&mut self, _: Box<TlsSession>) {
            self.tls = true;
        }
    }

    fn pair() -> (Fake, Socket) {
        let (a, b) = Socket::pair(socket2::Domain::UNIX, socket2::Type::STREAM, None).unwrap();
        b.set_nonblocking(true).unwrap();
        (
            Fake {
                socket: a,
                tls: false,
            },
            b,
        )
    }

    fn verdict(peer: &str, rejected: Option<Rejection>, unsent: &[u8]) -> Verdict {
        Verdict {
            peer: inet(peer),
            tls: None,
            rejected,
            unsent: unsent.to_vec(),
        }
    }

    fn lines(path: &std::path::Path, ledger: &mut Ledger<'_>) -> Vec<String> {
        ledger.flush();
        let text = std::fs::read_to_string(path).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    /// The verdict is applied the same way for every driver: a served connection counts
    /// toward `--max-connections` under the PROXY header's address; a client over the
    /// per-address cap is refused with the codec's reply; any other rejection is closed at
    /// once, uncounted; the bytes admission left (a TLS alert) go out either way.
    #[test]
    fn issue_43_the_verdict_is_applied_once_for_every_driver() {
        static RETIRED: AtomicU32 = AtomicU32::new(0);
        let (mut ledger, path) = ledger_with_log("life-verdict", Recycle::default(), &RETIRED);
        let (mut t, other) = pair();
        let (peer, then) = Life::<Instant>::new(Unit::Requests).admitted(
            verdict("192.0.2.1:1", None, b""),
            None,
            &mut t,
            &mut ledger,
        );
        assert_eq!(then, Then::Serve);
        assert_eq!(peer, inet("192.0.2.1:1"));
        let over = Rejection::OverCap {
            ip: "192.0.2.2".parse().unwrap(),
            cap: 1,
        };
        let (_, then) = Life::<Instant>::new(Unit::Requests).admitted(
            verdict("192.0.2.2:2", Some(over), b""),
            None,
            &mut t,
            &mut ledger,
        );
        assert_eq!(then, Then::Refuse("too many connections from your address"));
        let tls = Some(Rejection::Tls("bad".into()));
        let (_, then) = Life::<Instant>::new(Unit::Requests).admitted(
            verdict("192.0.2.3:3", tls, b"\x15alert"),
            None,
            &mut t,
            &mut ledger,
        );
        assert_eq!(then, Then::Close);
        let mut got = [0u8; 16];
        let n = io::Read::read(&mut &other, &mut got).unwrap();
        assert_eq!(&got[..n], b"\x15alert", "the alert went out, without waiting");
        // One connection counted: the served one (the recycling limit's count).
        assert_eq!(ledger.connection(), 2);
        assert!(
            lines(&path, &mut ledger).is_empty(),
            "no access-log line for an admission"
        );
        let _ = std::fs::remove_file(&path);
    }

    /// The request clock: a request answered is counted and logged `ok` with the time
    /// from its start to its end; the next request's clock starts afresh.
    #[test]
    fn issue_43_the_request_clock_counts_and_logs_an_answer() {
        static RETIRED: AtomicU32 = AtomicU32::new(0);
        let (mut ledger, path) = ledger_with_log("life-clock", Recycle::default(), &RETIRED);
        let peer = inet("192.0.2.4:4");
        let mut life: Life = Life::new(Unit::Requests);
        life.serve(&mut ledger, &peer);
        let t0 = Instant::now();
        life.request_start(&mut ledger, Head::same(b"GET /a"), t0);
        assert!(life.in_request());
        let took = life.request_end(&mut ledger, &peer, t0 + Duration::from_millis(3), (6, 10), true);
        assert_eq!(took, Some(Duration::from_millis(3)));
        assert!(!life.in_request());
        assert_eq!(
            life.request_end(&mut ledger, &peer, Instant::now(), (0, 0), true),
            None,
            "no request, no count"
        );
        assert_eq!(ledger.requests(), 1);
        let got = lines(&path, &mut ledger);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].ends_with(" 192.0.2.4:4 ok 3000us in=6 out=10 \"GET /a\""),
            "{got:?}"
        );
        let _ = std::fs::remove_file(&path);
    }

    /// The close holds the one outcome rule, at both levels: a request left unanswered
    /// is `timeout` when the step refused it for slowness (the 408), `error` for another
    /// refusal or a panic, `closed` when the client left; a `handle_client` connection is
    /// `ok` when its handler returned, `closed` when the client reset it, `error` when the
    /// handler panicked, `timeout` when the clock cut it. A closed connection with no
    /// request in progress leaves no line; one handed over leaves none either.
    #[test]
    fn issue_43_the_close_holds_the_one_outcome_rule() {
        static RETIRED: AtomicU32 = AtomicU32::new(0);
        let (mut ledger, path) = ledger_with_log("life-close", Recycle::default(), &RETIRED);
        let reset = io::ErrorKind::ConnectionReset;
        let requests: [(Ended<'_>, Option<Outcome>); 5] = [
            (Ended::Refused(&ProtocolError::Timeout), Some(Outcome::Timeout)),
            (
                Ended::Refused(&ProtocolError::TooLarge {
                    what: "line",
                    limit: 1,
                }),
                Some(Outcome::Error),
            ),
            (Ended::Failed(reset), Some(Outcome::Closed)),
            (Ended::Clean, Some(Outcome::Closed)),
            (Ended::Panicked, Some(Outcome::Error)),
        ];
        let peer = inet("192.0.2.5:5");
        for (ended, want) in requests {
            let mut life: Life = Life::new(Unit::Requests);
            life.request_start(&mut ledger, Head::same(b"REQ"), Instant::now());
            assert_eq!(
                life.close(&mut ledger, &peer, ended, (3, 0), Instant::now),
                want,
                "{ended:?}"
            );
        }
        let idle: Life = Life::new(Unit::Requests);
        assert_eq!(
            idle.close(&mut ledger, &peer, Ended::Failed(reset), (0, 0), Instant::now),
            None,
            "between requests"
        );
        let mut moved: Life = Life::new(Unit::Requests);
        moved.request_start(&mut ledger, Head::same(b"REQ"), Instant::now());
        moved.hand_over();
        assert_eq!(
            moved.close(&mut ledger, &peer, Ended::Clean, (3, 0), Instant::now),
            None,
            "handed over"
        );
        let clients: [(Ended<'_>, Outcome); 4] = [
            (Ended::Clean, Outcome::Ok),
            (Ended::Failed(reset), Outcome::Closed),
            (Ended::Panicked, Outcome::Error),
            (Ended::Cut, Outcome::Timeout),
        ];
        for (ended, want) in clients {
            let mut life: Life = Life::new(Unit::Connection);
            life.opened(Instant::now());
            assert_eq!(
                life.close(&mut ledger, &peer, ended, (1, 1), Instant::now),
                Some(want),
                "{ended:?}"
            );
        }
        let got = lines(&path, &mut ledger);
        assert_eq!(got.len(), 9, "{got:?}");
        assert_eq!(ledger.requests(), 0, "nothing answered at the request level");
        let _ = std::fs::remove_file(&path);
    }

    /// A refusal wins over the error that followed it (the client gone before the refusal
    /// reached it): the request was refused.
    #[test]
    fn issue_43_a_refusal_wins_over_the_error_after_it() {
        let why = ProtocolError::Timeout;
        assert!(matches!(
            Ended::of(Some(&why), Some(io::ErrorKind::BrokenPipe)),
            Ended::Refused(ProtocolError::Timeout)
        ));
        assert!(matches!(
            Ended::of(None, Some(io::ErrorKind::BrokenPipe)),
            Ended::Failed(_)
        ));
        assert!(matches!(Ended::of(None, None), Ended::Clean));
    }

    /// The per-address count a connection holds is given back when its life ends, on
    /// every path: a close, or a drop (a hand-off, a panic unwinding).
    #[test]
    fn issue_43_the_per_address_count_is_given_back_on_every_path() {
        static RETIRED: AtomicU32 = AtomicU32::new(0);
        let (mut ledger, path) = ledger_with_log("life-count", Recycle::default(), &RETIRED);
        let peers = PeerCounts::new(2, 16).unwrap();
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        let (mut t, _other) = pair();
        for close in [true, false] {
            assert!(peers.add(1, ip));
            let mut life: Life = Life::new(Unit::Requests);
            let (peer, then) = life.admitted(
                verdict("192.0.2.9:9", None, b""),
                Some(Counted::new(peers, 1, ip)),
                &mut t,
                &mut ledger,
            );
            assert_eq!(then, Then::Serve);
            assert_eq!(peers.total(ip), 1);
            if close {
                life.close(&mut ledger, &peer, Ended::Clean, (0, 0), Instant::now);
            } else {
                drop(life);
            }
            assert_eq!(peers.total(ip), 0, "given back (close: {close})");
        }
        let _ = std::fs::remove_file(&path);
    }
}

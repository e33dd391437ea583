//! Admission: what an accepted connection goes through before any handler code runs, as
//! one step machine that does no I/O.
//!
//! ```text
//!  accept ─▶ PROXY header ─▶ access rules ─▶ penalty ─▶ TLS handshake ─▶ per-address cap ─▶ serve
//!            (?proxy)        (--allow,       (failed     (?tls, within     (--max-conns-
//!            within          --deny)         authenti-   --tls-handshake-  per-ip)
//!            --header-                       cation,     timeout of its
//!            timeout of                      penalty.rs) start)
//!            the accept)
//!                │               │               │            │                  │
//!                ▼               ▼               ▼            ▼                  ▼
//!            bad PROXY        denied        penalized    TLS failure          over the cap ─▶ close
//! ```
//!
//! A phase that does not apply (no `proxy` option, no `tls`, no cap, no penalty table or an
//! address not penalized) is passed at once. The penalty comes before the TLS handshake and
//! any request byte, so that a refused address costs an `accept` and a `close`, not a
//! handshake; after the PROXY header and the rules, so that it is the real client's.
//! The machine is told what happens: bytes arrived ([`Admission::received`], which says
//! how many it took), bytes went out ([`Admission::sent`]), the client closed
//! ([`Admission::closed`]), an I/O error ([`Admission::failed`]), the clock passed the
//! deadline ([`Admission::deadline_passed`]). It says what it needs next
//! ([`Admission::next`]): bytes from the client, or to send [`Admission::pending`] (TLS
//! records), each by the deadline of the phase (`None`: no limit of its own, the socket's
//! timeouts apply), or that it is done: serve the connection, or close it
//! ([`Admission::finish`] tells why, as a [`Rejection`]).
//!
//! Nothing here touches a socket or the clock: the driver (`blocking.rs`) reads, writes,
//! waits and passes the time in, so the same machine can be driven by a blocking loop, an
//! event loop, a fuzzer or a unit test. What it needs from the scoreboard comes through
//! [`Seat`].

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::net::listener::{Addr, Policy};
use crate::net::proxy::{self, Parsed};
use crate::net::tls::{Acceptor, TlsSession};
use crate::peer_counts::PeerCounts;
use crate::penalty::Penalties;
use crate::scoreboard::Board;

/// What admission needs to know of the listener and of the worker's limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules<'a> {
    /// The listener's access rules and PROXY protocol settings.
    pub(crate) policy: &'a Policy,
    /// The listener's TLS configuration, on a TLS listener.
    pub(crate) tls: Option<&'a Acceptor>,
    /// `--header-timeout`: the PROXY header must be complete within this of the accept.
    pub(crate) header_timeout: Option<Duration>,
    /// `--tls-handshake-timeout`: the handshake must be done within this of its start.
    pub(crate) handshake_timeout: Option<Duration>,
    /// `--max-conns-per-ip`.
    pub(crate) max_per_ip: Option<usize>,
    /// The addresses penalized for failed authentication (`--penalty-max`; `None`: off).
    pub(crate) penalties: Option<&'a Penalties>,
}

impl Rules<'_> {
    /// Whether the machine would take no step: no PROXY header, no access rules, no TLS,
    /// no cap. Every client is then admitted as it is (but a penalized one: see
    /// [`open_to`](Rules::open_to)).
    fn open(&self) -> bool {
        !self.policy.proxy
            && self.policy.allow.is_empty()
            && self.policy.deny.is_empty()
            && self.tls.is_none()
            && self.max_per_ip.is_none()
    }

    /// Whether the machine would take no step for a client at `peer`: [`open`](Rules::open),
    /// and the address is not penalized. The driver then need not build the machine (a
    /// connection per request pays nothing for admission it does not use: while nothing
    /// was ever penalized, the penalty's look costs one load); for a penalized address it
    /// builds it, and the machine refuses at once.
    pub(crate) fn open_to(&self, peer: &Addr) -> bool {
        self.open()
            && self
                .penalties
                .zip(peer.ip())
                .is_none_or(|(table, ip)| table.refusal(ip).is_none())
    }
}

/// The worker's place on the scoreboard, as admission sees it.
pub(crate) trait Seat {
    /// The access rules let `peer` in: from now on the worker serves it (its slot names
    /// it, so that `status` shows it and the per-address cap counts it).
    fn permitted(&mut self, peer: &Addr);

    /// How many connections from `ip` are being served at once, this one included (it
    /// was [`permitted`](Seat::permitted) before).
    fn connections_from(&self, ip: IpAddr) -> usize;
}

/// The per-address cap's seat: this worker's table of connections by client address, and
/// the sum over every event worker's table (`peer_counts`), so that the cap counts
/// connections across the pool (event workers, async workers and hybrid fronts), and a killed worker's counts vanish with its table.
pub(crate) struct EventSeat {
    pub(crate) id: u32,
    pub(crate) peers: Option<&'static PeerCounts>,
    pub(crate) counted: Option<IpAddr>,
    /// A hybrid front: the connections its workers hold count too (their slots name them).
    pub(crate) workers: Option<&'static Board>,
}

impl Seat for EventSeat {
    fn permitted(&mut self, peer: &Addr) {
        let (Some(peers), Some(ip)) = (self.peers, peer.ip()) else {
            return;
        };
        if peers.add(self.id, ip) {
            self.counted = Some(ip);
        } else {
            // Cannot happen with tables twice --worker-connections in size: said, not hidden.
            tracing::warn!("no room to count the connection from {ip} for --max-conns-per-ip");
        }
    }

    fn connections_from(&self, ip: IpAddr) -> usize {
        self.peers.map_or(0, |p| p.total(ip)) + self.workers.map_or(0, |b| b.connections_from(ip))
    }
}

/// Why a connection is not admitted. Each kind has its own scoreboard counter (but a bad
/// PROXY header, which has none) and its own log line, written once per episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// The access rules (`--allow`, `--deny`) do not let the client in.
    Denied(IpAddr),
    /// The PROXY header is missing, malformed, late, cut short, or comes from a source
    /// that is not trusted (`--proxy-from`).
    BadProxy(String),
    /// The TLS handshake failed or took too long.
    Tls(String),
    /// More than `cap` connections from `ip` at once (`--max-conns-per-ip`): the client
    /// gets the codec's refusal (HTTP 503, `-ERR refused`), which only the driver can
    /// produce (the codec belongs to the handler), through the TLS session if any.
    OverCap {
        /// The client's address.
        ip: IpAddr,
        /// The cap.
        cap: usize,
    },
    /// `ip` is refused for `left` still, for `failures` failed authentications in a row
    /// (`Conn::penalize`, `penalty.rs`): closed at once, before a TLS handshake and without
    /// a reply.
    Penalized {
        /// The client's address.
        ip: IpAddr,
        /// How long the refusal still lasts.
        left: Duration,
        /// The failures in a row that earned it.
        failures: u32,
    },
}

/// The kinds of [`Rejection`], as an index (one log episode each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Denied = 0,
    BadProxy = 1,
    Tls = 2,
    OverCap = 3,
    Penalized = 4,
}

impl Kind {
    /// How many kinds there are.
    pub(crate) const COUNT: usize = 5;
}

impl Rejection {
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Rejection::Denied(_) => Kind::Denied,
            Rejection::BadProxy(_) => Kind::BadProxy,
            Rejection::Tls(_) => Kind::Tls,
            Rejection::OverCap { .. } => Kind::OverCap,
            Rejection::Penalized { .. } => Kind::Penalized,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Denied(ip) => write!(f, "{ip} is denied by the access rules (--allow/--deny)"),
            Rejection::BadProxy(why) | Rejection::Tls(why) => f.write_str(why),
            Rejection::OverCap { ip, cap } => {
                write!(
                    f,
                    "more than {cap} connections at once from {ip} (--max-conns-per-ip)"
                )
            }
            Rejection::Penalized { ip, left, failures } => write!(
                f,
                "{ip} is refused for {}s more after {failures} failed authentication(s) in a row \
                 (--penalty-max)",
                left.as_secs_f64().ceil()
            ),
        }
    }
}

/// What the machine needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Bytes from the client ([`Admission::received`]), or news of its close
    /// ([`Admission::closed`]), by `by`; past it, [`Admission::deadline_passed`].
    Read {
        /// The phase's deadline (`None`: none of its own).
        by: Option<Instant>,
    },
    /// [`Admission::pending`] to be sent ([`Admission::sent`]), by `by`.
    Write {
        /// The phase's deadline (`None`: none of its own).
        by: Option<Instant>,
    },
    /// Rejected: close the connection ([`Admission::finish`] says why).
    Close,
    /// Admitted: serve the connection ([`Admission::finish`] hands over the client's
    /// address and the TLS session).
    Serve,
}

/// Where the machine is.
#[derive(Debug)]
enum Phase {
    /// Reading the PROXY header (it needs the bytes from the first one).
    Proxy {
        deadline: Option<Instant>,
    },
    /// The TLS handshake; `established` once done (only session tickets may be left to
    /// send).
    Tls {
        session: Box<TlsSession>,
        deadline: Option<Instant>,
        established: bool,
    },
    Admitted {
        tls: Option<Box<TlsSession>>,
    },
    Rejected {
        why: Rejection,
        /// Kept for the codec's refusal of a client over the cap.
        tls: Option<Box<TlsSession>>,
    },
}

/// What admission hands the driver at the end.
#[derive(Debug)]
pub(crate) struct Verdict {
    /// The client: the one the PROXY header names, or the connection's own peer.
    pub(crate) peer: Addr,
    /// The TLS session, once its handshake is done.
    pub(crate) tls: Option<Box<TlsSession>>,
    /// Why the connection is to be closed; `None`: serve it.
    pub(crate) rejected: Option<Rejection>,
    /// Bytes still to send, best effort, before the close (a TLS alert).
    pub(crate) unsent: Vec<u8>,
}

/// One connection's admission (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Admission<'a, S: Seat> {
    rules: Rules<'a>,
    seat: S,
    peer: Addr,
    phase: Phase,
    /// Bytes to send (TLS records), from the front.
    out: Vec<u8>,
}

impl<'a, S: Seat> Admission<'a, S> {
    /// As [`start`](Admission::start), at `now`.
    #[cfg(test)]
    pub(crate) fn new(rules: Rules<'a>, peer: Addr, seat: S, now: Instant) -> Self {
        Self::start(rules, peer, seat, &mut || now)
    }

    /// The admission of a connection from `peer`, accepted at `now` (the clock, read only for a phase with a deadline). A phase that needs
    /// no bytes (the rules of a plain listener, the cap) is passed at once: [`next`]
    /// may be [`Next::Serve`] or [`Next::Close`] from the start.
    ///
    /// [`next`]: Admission::next
    pub(crate) fn start(rules: Rules<'a>, peer: Addr, seat: S, now: &mut dyn FnMut() -> Instant) -> Self {
        let mut admission = Admission {
            rules,
            seat,
            peer,
            phase: Phase::Admitted { tls: None },
            out: Vec::new(),
        };
        if !rules.policy.proxy {
            admission.after_header(now);
            return admission;
        }
        // Anyone could claim any address: only a trusted balancer may send the header.
        match admission.peer.ip() {
            Some(ip) if !rules.policy.proxy_from.iter().any(|c| c.contains(ip)) => {
                admission.reject(Rejection::BadProxy(format!(
                    "{ip} is not a trusted PROXY protocol source (--proxy-from)"
                )));
            }
            _ => {
                admission.phase = Phase::Proxy {
                    deadline: rules.header_timeout.map(|t| now() + t),
                };
            }
        }
        admission
    }

    /// The worker's seat, as the machine holds it.
    pub(crate) fn seat(&self) -> &S {
        &self.seat
    }

    /// What the machine needs next.
    pub(crate) fn next(&self) -> Next {
        match &self.phase {
            Phase::Proxy { deadline } => Next::Read { by: *deadline },
            Phase::Tls { deadline, .. } if !self.out.is_empty() => Next::Write { by: *deadline },
            Phase::Tls { deadline, .. } => Next::Read { by: *deadline },
            Phase::Admitted { .. } => Next::Serve,
            Phase::Rejected { .. } => Next::Close,
        }
    }

    /// The client as known so far: the connection's peer, then the one the PROXY header
    /// names.
    pub(crate) fn peer(&self) -> &Addr {
        &self.peer
    }

    /// Why the connection is rejected, once it is.
    pub(crate) fn rejection(&self) -> Option<&Rejection> {
        match &self.phase {
            Phase::Rejected { why, .. } => Some(why),
            _ => None,
        }
    }

    /// The bytes to send now (TLS records), for [`Next::Write`].
    pub(crate) fn pending(&self) -> &[u8] {
        &self.out
    }

    /// Bytes arrived at `now`: `bytes` are all those received and not yet consumed, in
    /// order. Returns how many the machine consumed; the others stay with the driver (the
    /// client's first bytes, after a PROXY header on a plain listener).
    ///
    /// A PROXY header is parsed afresh on the longer buffer each time, so nothing is
    /// consumed until it is complete. During a TLS handshake every byte is consumed (the
    /// records go to the TLS layer, which keeps any data that follows the handshake), so
    /// that no encrypted byte is left to be taken for clear text.
    pub(crate) fn received(&mut self, bytes: &[u8], now: Instant) -> usize {
        match &self.phase {
            Phase::Proxy { deadline } => {
                let deadline = *deadline;
                match proxy::parse(bytes) {
                    Ok(Parsed::Header { len, source }) => {
                        if let Some(source) = source {
                            self.peer = Addr::Inet(source);
                        }
                        self.after_header(&mut || now);
                        if matches!(self.phase, Phase::Tls { .. }) {
                            // What follows the header belongs to TLS.
                            return len + self.feed_tls(&bytes[len..], now);
                        }
                        len
                    }
                    Ok(Parsed::Incomplete) => {
                        debug_assert!(bytes.len() < proxy::MAX_LEN, "parse decides within MAX_LEN");
                        if deadline.is_some_and(|d| now >= d) {
                            self.header_too_slow();
                        }
                        0
                    }
                    Err(e) => {
                        self.reject(Rejection::BadProxy(e.to_string()));
                        0
                    }
                }
            }
            Phase::Tls { .. } => self.feed_tls(bytes, now),
            Phase::Admitted { .. } | Phase::Rejected { .. } => 0,
        }
    }

    /// `n` bytes of [`pending`](Admission::pending) went out, at `now`.
    pub(crate) fn sent(&mut self, n: usize, now: Instant) {
        let n = n.min(self.out.len());
        self.out.drain(..n);
        if let Phase::Tls { session, .. } = &mut self.phase {
            if self.out.is_empty() {
                collect_tls(&mut session.conn, &mut self.out);
            }
        }
        self.after_tls_progress(now);
    }

    /// The client closed its end (a read returned end of file).
    pub(crate) fn closed(&mut self) {
        match self.phase {
            Phase::Proxy { .. } => {
                self.reject(Rejection::BadProxy(
                    "closed before the end of its PROXY header".into(),
                ));
            }
            Phase::Tls { .. } => self.reject(Rejection::Tls(
                "the client closed the connection during the TLS handshake".into(),
            )),
            Phase::Admitted { .. } | Phase::Rejected { .. } => {}
        }
    }

    /// A read or write failed with `e` (a timeout of the socket's own, with no deadline of
    /// the phase, included).
    pub(crate) fn failed(&mut self, e: &io::Error) {
        let timed_out = matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock);
        match self.phase {
            Phase::Proxy { .. } => {
                self.reject(Rejection::BadProxy(format!("reading its PROXY header: {e}")));
            }
            Phase::Tls { .. } if timed_out => self.reject(Rejection::Tls(TLS_TOO_SLOW.into())),
            Phase::Tls { .. } => self.reject(Rejection::Tls(e.to_string())),
            Phase::Admitted { .. } | Phase::Rejected { .. } => {}
        }
    }

    /// The clock says `now`: if the phase's deadline has passed, the connection is
    /// rejected (nothing happens before it).
    pub(crate) fn deadline_passed(&mut self, now: Instant) {
        match &self.phase {
            Phase::Proxy { deadline: Some(d) } if now >= *d => self.header_too_slow(),
            Phase::Tls {
                deadline: Some(d), ..
            } if now >= *d => self.reject(Rejection::Tls(TLS_TOO_SLOW.into())),
            _ => {}
        }
    }

    /// The end of admission, after [`Next::Serve`] or [`Next::Close`].
    pub(crate) fn finish(self) -> Verdict {
        let (tls, rejected) = match self.phase {
            Phase::Admitted { tls } => (tls, None),
            Phase::Rejected { why, tls } => (tls, Some(why)),
            // Not done: the driver stopped early; the connection is not served.
            Phase::Proxy { .. } => (None, Some(Rejection::BadProxy("admission not finished".into()))),
            Phase::Tls { .. } => (None, Some(Rejection::Tls("admission not finished".into()))),
        };
        Verdict {
            peer: self.peer,
            tls,
            rejected,
            unsent: self.out,
        }
    }

    /// The PROXY header is read (or not expected): the access rules, the penalty, then TLS
    /// or the cap.
    fn after_header(&mut self, now: &mut dyn FnMut() -> Instant) {
        if !self.rules.policy.permits(self.peer.ip()) {
            if let Some(ip) = self.peer.ip() {
                self.reject(Rejection::Denied(ip));
                return;
            }
        }
        // Before the seat counts it: a refused address is never served, so the cap and
        // `status` never see it.
        if let Some((table, ip)) = self.rules.penalties.zip(self.peer.ip()) {
            if let Some(r) = table.refusal(ip) {
                self.reject(Rejection::Penalized {
                    ip,
                    left: r.left,
                    failures: r.failures,
                });
                return;
            }
        }
        self.seat.permitted(&self.peer);
        let Some(config) = self.rules.tls else {
            self.check_cap(None);
            return;
        };
        match TlsSession::new(config.clone()) {
            Ok(session) => {
                self.phase = Phase::Tls {
                    session: Box::new(session),
                    deadline: self.rules.handshake_timeout.map(|t| now() + t),
                    established: false,
                };
            }
            Err(e) => self.reject(Rejection::Tls(e.to_string())),
        }
    }

    /// Gives `bytes` to the TLS layer; returns how many it took (all, unless it failed).
    fn feed_tls(&mut self, mut bytes: &[u8], now: Instant) -> usize {
        let total = bytes.len();
        let Phase::Tls { session, .. } = &mut self.phase else {
            return 0;
        };
        // An empty slice would read as the end of the stream.
        while !bytes.is_empty() {
            let failure = match session.conn.read_tls(&mut bytes) {
                Ok(_) => match session.conn.process_new_packets() {
                    Ok(_) => None,
                    Err(e) => {
                        // The alert rustls prepared goes out (best effort) before the close.
                        let mut alert = Vec::new();
                        collect_tls(&mut session.conn, &mut alert);
                        Some((format!("TLS: {e}"), alert))
                    }
                },
                Err(e) => Some((format!("TLS: {e}"), Vec::new())),
            };
            if let Some((why, alert)) = failure {
                self.reject(Rejection::Tls(why));
                self.out = alert;
                return total;
            }
        }
        collect_tls(&mut session.conn, &mut self.out);
        self.after_tls_progress(now);
        total
    }

    /// After the TLS layer moved: once the handshake is done and its last records (session
    /// tickets) are out, the cap; past the deadline, a rejection.
    fn after_tls_progress(&mut self, now: Instant) {
        let Phase::Tls {
            session,
            deadline,
            established,
        } = &mut self.phase
        else {
            return;
        };
        if session.conn.is_handshaking() {
            if deadline.is_some_and(|d| now >= d) {
                self.reject(Rejection::Tls(TLS_TOO_SLOW.into()));
            }
            return;
        }
        if !*established {
            session.established();
            *established = true;
        }
        if !self.out.is_empty() {
            return;
        }
        let Phase::Tls { session, .. } = std::mem::replace(&mut self.phase, Phase::Admitted { tls: None })
        else {
            unreachable!("matched above");
        };
        self.check_cap(Some(session));
    }

    /// The per-address cap, the last phase: this connection is counted already.
    fn check_cap(&mut self, tls: Option<Box<TlsSession>>) {
        if let (Some(cap), Some(ip)) = (self.rules.max_per_ip, self.peer.ip()) {
            if self.seat.connections_from(ip) > cap {
                self.phase = Phase::Rejected {
                    why: Rejection::OverCap { ip, cap },
                    tls,
                };
                return;
            }
        }
        self.phase = Phase::Admitted { tls };
    }

    fn header_too_slow(&mut self) {
        let limit = self.rules.header_timeout.unwrap_or_default();
        self.reject(Rejection::BadProxy(format!(
            "its PROXY header was not complete within {limit:?} (--header-timeout)"
        )));
    }

    /// Ends admission with `why`. What was left to send goes (a handshake given up on
    /// needs no more records; a failed one's alert is set by the caller).
    fn reject(&mut self, why: Rejection) {
        self.out.clear();
        let tls = match std::mem::replace(&mut self.phase, Phase::Admitted { tls: None }) {
            Phase::Rejected { tls, .. } | Phase::Admitted { tls } => tls,
            Phase::Proxy { .. } | Phase::Tls { .. } => None,
        };
        self.phase = Phase::Rejected { why, tls };
    }
}

/// The error of a handshake that missed its deadline (tests grep it).
const TLS_TOO_SLOW: &str = "the TLS handshake took too long";

/// Appends every record the TLS layer has to send to `out` (a `Vec` never blocks).
fn collect_tls(conn: &mut rustls::ServerConnection, out: &mut Vec<u8>) {
    while conn.wants_write() {
        match conn.write_tls(out) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::proxy::Cidr;
    use std::cell::RefCell;
    use std::io::{Read, Write};
    use std::rc::Rc;
    use std::sync::Arc;

    /// A scoreboard of one worker: what admission told it, and how many connections it
    /// claims from each address (this one included once permitted).
    #[derive(Debug, Clone, Default)]
    struct FakeSeat {
        permitted: Rc<RefCell<Vec<Addr>>>,
        others: usize,
    }

    impl Seat for FakeSeat {
        fn permitted(&mut self, peer: &Addr) {
            self.permitted.borrow_mut().push(peer.clone());
        }
        fn connections_from(&self, _ip: IpAddr) -> usize {
            self.others + self.permitted.borrow().len()
        }
    }

    fn inet(s: &str) -> Addr {
        Addr::Inet(s.parse().unwrap())
    }

    fn proxy_policy(trusted: &str) -> Policy {
        Policy {
            proxy: true,
            proxy_from: vec![trusted.parse::<Cidr>().unwrap()],
            ..Policy::default()
        }
    }

    fn rules(policy: &Policy) -> Rules<'_> {
        Rules {
            policy,
            tls: None,
            header_timeout: Some(Duration::from_secs(20)),
            handshake_timeout: Some(Duration::from_secs(10)),
            max_per_ip: None,
            penalties: None,
        }
    }

    /// The driver skips the machine on an open listener: only where the machine would
    /// admit at once, having told the seat, with no read, write or deadline.
    #[test]
    fn only_a_listener_without_any_check_is_open_and_the_machine_admits_there_at_once() {
        let open = Policy::default();
        assert!(rules(&open).open());
        let seat = FakeSeat::default();
        let m = Admission::new(rules(&open), inet("192.0.2.7:1"), seat.clone(), Instant::now());
        assert_eq!(m.next(), Next::Serve);
        assert_eq!(*seat.permitted.borrow(), vec![inet("192.0.2.7:1")]);
        let proxy = Policy {
            proxy: true,
            ..Policy::default()
        };
        let allow = Policy {
            allow: vec!["10.0.0.0/8".parse().unwrap()],
            ..Policy::default()
        };
        let deny = Policy {
            deny: vec!["10.0.0.0/8".parse().unwrap()],
            ..Policy::default()
        };
        for policy in [&proxy, &allow, &deny] {
            assert!(!rules(policy).open(), "{policy:?}");
        }
        let capped = Rules {
            max_per_ip: Some(4),
            ..rules(&open)
        };
        assert!(!capped.open());
        let (config, _) = tls_configs();
        let with_tls = Rules {
            tls: Some(&config),
            ..rules(&open)
        };
        assert!(!with_tls.open());
    }

    /// Feeds `input` in the pieces `cuts` makes of it while the machine reads, keeping
    /// what it does not consume, as the driver does; returns the bytes left over (those
    /// not fed included).
    fn feed<S: Seat>(m: &mut Admission<'_, S>, input: &[u8], cuts: &[usize], now: Instant) -> Vec<u8> {
        let mut held = Vec::new();
        let mut from = 0;
        for &to in cuts.iter().chain(std::iter::once(&input.len())) {
            if !matches!(m.next(), Next::Read { .. }) {
                break;
            }
            held.extend_from_slice(&input[from..to]);
            from = to;
            let n = m.received(&held, now);
            assert!(n <= held.len());
            held.drain(..n);
        }
        held.extend_from_slice(&input[from..]);
        held
    }

    fn v1_header() -> &'static [u8] {
        b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 7000\r\n"
    }

    fn v2_header() -> Vec<u8> {
        let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        h.extend_from_slice(&[0x21, 0x11, 0, 12]);
        h.extend_from_slice(&[192, 0, 2, 7, 127, 0, 0, 1]);
        h.extend_from_slice(&4321u16.to_be_bytes());
        h.extend_from_slice(&7000u16.to_be_bytes());
        h
    }

    #[test]
    fn a_plain_listener_admits_at_once_and_consumes_nothing() {
        let policy = Policy::default();
        let seat = FakeSeat::default();
        let mut m = Admission::new(
            rules(&policy),
            inet("127.0.0.1:5000"),
            seat.clone(),
            Instant::now(),
        );
        assert_eq!(m.next(), Next::Serve);
        assert_eq!(m.received(b"GET / HTTP/1.1\r\n", Instant::now()), 0);
        let v = m.finish();
        assert!(v.rejected.is_none() && v.tls.is_none() && v.unsent.is_empty());
        assert_eq!(seat.permitted.borrow().as_slice(), &[inet("127.0.0.1:5000")]);
    }

    /// Both versions, split at every byte boundary (and in single bytes): the client is the
    /// one the header names, the bytes after it are left for the request loop, and the
    /// deadline is the header timeout from the accept.
    #[test]
    fn proxy_headers_split_anywhere_name_the_client() {
        let policy = proxy_policy("127.0.0.0/8");
        for (header, client) in [
            (v1_header().to_vec(), "203.0.113.9:5555"),
            (v2_header(), "192.0.2.7:4321"),
        ] {
            let mut input = header.clone();
            input.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            let singles: Vec<usize> = (1..input.len()).collect();
            let splits = (0..=input.len()).map(|i| vec![i]).chain(std::iter::once(singles));
            for cuts in splits {
                let t0 = Instant::now();
                let seat = FakeSeat::default();
                let mut m = Admission::new(rules(&policy), inet("127.0.0.1:40000"), seat.clone(), t0);
                assert_eq!(
                    m.next(),
                    Next::Read {
                        by: Some(t0 + Duration::from_secs(20))
                    }
                );
                let rest = feed(&mut m, &input, &cuts, t0);
                assert_eq!(m.next(), Next::Serve, "{cuts:?}");
                assert_eq!(rest, b"GET / HTTP/1.1\r\n\r\n", "{cuts:?}");
                assert_eq!(m.peer(), &inet(client));
                assert_eq!(seat.permitted.borrow().as_slice(), &[inet(client)]);
                assert!(m.finish().rejected.is_none());
            }
        }
    }

    #[test]
    fn a_proxy_header_from_an_untrusted_source_is_refused_before_any_read() {
        let policy = proxy_policy("10.0.0.0/8");
        let seat = FakeSeat::default();
        let m = Admission::new(
            rules(&policy),
            inet("127.0.0.1:40000"),
            seat.clone(),
            Instant::now(),
        );
        assert_eq!(m.next(), Next::Close);
        let v = m.finish();
        let why = v.rejected.unwrap();
        assert_eq!(why.kind(), Kind::BadProxy);
        assert_eq!(
            why.to_string(),
            "127.0.0.1 is not a trusted PROXY protocol source (--proxy-from)"
        );
        assert!(seat.permitted.borrow().is_empty(), "never counted as served");
    }

    #[test]
    fn a_malformed_or_missing_proxy_header_is_refused_at_the_first_wrong_byte() {
        let policy = proxy_policy("127.0.0.0/8");
        for (input, expected) in [
            (
                &b"PROXY TCP4 203.0.113.9 x"[..],
                "malformed PROXY protocol v1 header",
            ),
            (
                b"GET / HTTP/1.1\r\n",
                "does not start with a PROXY protocol header",
            ),
        ] {
            let mut m = Admission::new(
                rules(&policy),
                inet("127.0.0.1:1"),
                FakeSeat::default(),
                Instant::now(),
            );
            m.received(input, Instant::now());
            assert_eq!(m.next(), Next::Close);
            let why = m.rejection().unwrap().to_string();
            assert!(why.contains(expected), "{why}");
        }
        // Cut short by the client.
        let mut m = Admission::new(
            rules(&policy),
            inet("127.0.0.1:1"),
            FakeSeat::default(),
            Instant::now(),
        );
        m.received(b"PROXY TCP4 ", Instant::now());
        m.closed();
        assert_eq!(
            m.rejection(),
            Some(&Rejection::BadProxy(
                "closed before the end of its PROXY header".into()
            ))
        );
    }

    /// Issue 14's rule, from the clock: the header as a whole has the header timeout from
    /// the accept, however its bytes trickle in.
    #[test]
    fn a_proxy_header_incomplete_at_its_deadline_is_refused() {
        let policy = proxy_policy("127.0.0.0/8");
        let t0 = Instant::now();
        let mut r = rules(&policy);
        r.header_timeout = Some(Duration::from_secs(1));
        let mut m = Admission::new(r, inet("127.0.0.1:1"), FakeSeat::default(), t0);
        assert_eq!(m.received(b"PROXY TCP4 203", t0 + Duration::from_millis(500)), 0);
        m.deadline_passed(t0 + Duration::from_millis(999));
        assert_eq!(
            m.next(),
            Next::Read {
                by: Some(t0 + Duration::from_secs(1))
            }
        );
        m.deadline_passed(t0 + Duration::from_secs(1));
        assert_eq!(m.next(), Next::Close);
        assert_eq!(
            m.rejection().unwrap().to_string(),
            "its PROXY header was not complete within 1s (--header-timeout)"
        );
        // A byte that arrives late is no better than none (an event loop may see it first).
        let mut m = Admission::new(r, inet("127.0.0.1:1"), FakeSeat::default(), t0);
        m.received(b"PROXY TCP4 203.", t0 + Duration::from_secs(2));
        assert_eq!(m.rejection().map(Rejection::kind), Some(Kind::BadProxy));
    }

    #[test]
    fn a_denied_client_is_refused_by_its_own_or_its_proxied_address() {
        let mut policy = Policy {
            deny: vec!["203.0.113.0/24".parse().unwrap()],
            ..Policy::default()
        };
        let seat = FakeSeat::default();
        let m = Admission::new(
            rules(&policy),
            inet("203.0.113.9:1"),
            seat.clone(),
            Instant::now(),
        );
        assert_eq!(m.next(), Next::Close);
        assert_eq!(
            m.rejection(),
            Some(&Rejection::Denied("203.0.113.9".parse().unwrap()))
        );
        assert!(seat.permitted.borrow().is_empty());
        // Behind a balancer, the rules see the client the header names.
        policy.proxy = true;
        policy.proxy_from = vec!["127.0.0.0/8".parse().unwrap()];
        let mut m = Admission::new(rules(&policy), inet("127.0.0.1:1"), seat.clone(), Instant::now());
        assert_eq!(m.received(v1_header(), Instant::now()), v1_header().len());
        assert_eq!(m.rejection().map(Rejection::kind), Some(Kind::Denied));
        assert!(seat.permitted.borrow().is_empty());
    }

    #[test]
    fn a_client_over_the_cap_is_refused_after_it_is_counted() {
        let policy = Policy::default();
        let mut r = rules(&policy);
        r.max_per_ip = Some(3);
        // Two others from the same address, plus this one: within the cap.
        let seat = FakeSeat {
            others: 2,
            ..FakeSeat::default()
        };
        let m = Admission::new(r, inet("127.0.0.1:1"), seat, Instant::now());
        assert_eq!(m.next(), Next::Serve);
        let seat = FakeSeat {
            others: 3,
            ..FakeSeat::default()
        };
        let m = Admission::new(r, inet("127.0.0.1:1"), seat, Instant::now());
        assert_eq!(m.next(), Next::Close);
        assert_eq!(
            m.finish().rejected,
            Some(Rejection::OverCap {
                ip: "127.0.0.1".parse().unwrap(),
                cap: 3
            })
        );
        // A Unix-socket client has no address to count.
        let m = Admission::new(
            r,
            Addr::Unix(None),
            FakeSeat {
                others: 9,
                ..FakeSeat::default()
            },
            Instant::now(),
        );
        assert_eq!(m.next(), Next::Serve);
    }

    use crate::net::tls::testing::configs as tls_configs;

    fn tls_client(config: &Arc<rustls::ClientConfig>) -> rustls::ClientConnection {
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        rustls::ClientConnection::new(config.clone(), name).unwrap()
    }

    /// Runs a handshake between `client` and the machine in memory, `first` (a PROXY
    /// header, say) before the client's first flight; every byte the machine receives
    /// must be consumed. Returns how many round trips it took.
    fn handshake<S: Seat>(
        m: &mut Admission<'_, S>,
        client: &mut rustls::ClientConnection,
        first: &[u8],
    ) -> usize {
        let now = Instant::now();
        let mut to_server = first.to_vec();
        let mut trips = 0;
        loop {
            while client.wants_write() {
                client.write_tls(&mut to_server).unwrap();
            }
            match m.next() {
                Next::Read { .. } => {
                    assert!(!to_server.is_empty(), "both sides wait");
                    assert_eq!(
                        m.received(&to_server, now),
                        to_server.len(),
                        "every byte consumed"
                    );
                    to_server.clear();
                }
                Next::Write { .. } => {
                    let records = m.pending().to_vec();
                    // In two pieces: a short write is normal.
                    let half = records.len() / 2;
                    m.sent(half, now);
                    m.sent(records.len() - half, now);
                    let mut rd = &records[..];
                    while !rd.is_empty() {
                        client.read_tls(&mut rd).unwrap();
                        client.process_new_packets().unwrap();
                    }
                    trips += 1;
                }
                Next::Serve | Next::Close => return trips,
            }
            assert!(trips < 10, "no end to the handshake");
        }
    }

    #[test]
    fn a_tls_handshake_in_memory_admits_with_its_session_and_early_data() {
        let (server, client_config) = tls_configs();
        let policy = Policy::default();
        let mut r = rules(&policy);
        r.tls = Some(&server);
        let t0 = Instant::now();
        let mut m = Admission::new(r, inet("127.0.0.1:1"), FakeSeat::default(), t0);
        assert_eq!(
            m.next(),
            Next::Read {
                by: Some(t0 + Duration::from_secs(10))
            }
        );
        let mut client = tls_client(&client_config);
        // The client's first bytes after its Finished travel with it.
        client.writer().write_all(b"hello after the handshake").unwrap();
        handshake(&mut m, &mut client, b"");
        assert_eq!(m.next(), Next::Serve, "{:?}", m.rejection());
        assert!(!client.is_handshaking());
        let v = m.finish();
        let mut tls = v.tls.expect("the session");
        assert_eq!(tls.protocol_version(), Some("TLSv1.3"));
        assert_eq!(tls.server_name(), Some("localhost"));
        let mut got = [0u8; 64];
        let n = tls.conn.reader().read(&mut got).unwrap();
        assert_eq!(&got[..n], b"hello after the handshake");
    }

    #[test]
    fn a_proxy_header_then_a_tls_handshake_in_the_same_bytes() {
        let (server, client_config) = tls_configs();
        let policy = proxy_policy("127.0.0.0/8");
        let mut r = rules(&policy);
        r.tls = Some(&server);
        r.max_per_ip = Some(1);
        let seat = FakeSeat::default();
        let mut m = Admission::new(r, inet("127.0.0.1:40000"), seat.clone(), Instant::now());
        let mut client = tls_client(&client_config);
        handshake(&mut m, &mut client, v1_header());
        assert_eq!(m.next(), Next::Serve, "{:?}", m.rejection());
        assert_eq!(m.peer(), &inet("203.0.113.9:5555"));
        // Counted before the handshake (status shows it), under the header's address.
        assert_eq!(seat.permitted.borrow().as_slice(), &[inet("203.0.113.9:5555")]);
        assert!(m.finish().tls.is_some());
    }

    #[test]
    fn a_tls_client_over_the_cap_keeps_its_session_for_the_refusal() {
        let (server, client_config) = tls_configs();
        let policy = Policy::default();
        let mut r = rules(&policy);
        r.tls = Some(&server);
        r.max_per_ip = Some(1);
        let seat = FakeSeat {
            others: 1,
            ..FakeSeat::default()
        };
        let mut m = Admission::new(r, inet("127.0.0.1:1"), seat, Instant::now());
        handshake(&mut m, &mut tls_client(&client_config), b"");
        assert_eq!(m.next(), Next::Close);
        let v = m.finish();
        assert_eq!(v.rejected.map(|r| r.kind()), Some(Kind::OverCap));
        assert!(v.tls.is_some(), "the codec's refusal goes through TLS");
    }

    #[test]
    fn garbage_instead_of_a_client_hello_fails_the_handshake_with_an_alert() {
        let (server, _) = tls_configs();
        let policy = Policy::default();
        let mut r = rules(&policy);
        r.tls = Some(&server);
        let mut m = Admission::new(r, inet("127.0.0.1:1"), FakeSeat::default(), Instant::now());
        let input = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
        assert_eq!(m.received(input, Instant::now()), input.len());
        assert_eq!(m.next(), Next::Close);
        let v = m.finish();
        let why = v.rejected.unwrap();
        assert_eq!(why.kind(), Kind::Tls);
        assert!(why.to_string().starts_with("TLS: "), "{why}");
        assert!(v.tls.is_none());
        assert_eq!(v.unsent.first(), Some(&0x15), "an alert record: {:?}", v.unsent);
    }

    #[test]
    fn a_tls_handshake_that_misses_its_deadline_or_is_cut_short_fails() {
        let (server, client_config) = tls_configs();
        let policy = Policy::default();
        let mut r = rules(&policy);
        r.tls = Some(&server);
        r.handshake_timeout = Some(Duration::from_secs(1));
        let t0 = Instant::now();
        let mut hello = Vec::new();
        tls_client(&client_config).write_tls(&mut hello).unwrap();

        // Half a ClientHello, then the deadline.
        let mut m = Admission::new(r, inet("127.0.0.1:1"), FakeSeat::default(), t0);
        m.received(&hello[..hello.len() / 2], t0);
        m.deadline_passed(t0 + Duration::from_millis(999));
        assert!(matches!(m.next(), Next::Read { .. }));
        m.deadline_passed(t0 + Duration::from_secs(1));
        assert_eq!(m.rejection(), Some(&Rejection::Tls(TLS_TOO_SLOW.into())));

        // The rest of it, too late (each byte in time for its own read is not enough).
        let mut m = Admission::new(r, inet("127.0.0.1:1"), FakeSeat::default(), t0);
        m.received(&hello[..hello.len() / 2], t0);
        m.received(&hello[hello.len() / 2..], t0 + Duration::from_secs(2));
        assert_eq!(m.rejection(), Some(&Rejection::Tls(TLS_TOO_SLOW.into())));

        // Closed half way.
        let mut m = Admission::new(r, inet("127.0.0.1:1"), FakeSeat::default(), t0);
        m.received(&hello[..10], t0);
        m.closed();
        assert_eq!(
            m.rejection().unwrap().to_string(),
            "the client closed the connection during the TLS handshake"
        );
        // A socket timeout with no deadline of the phase's own.
        let mut m = Admission::new(r, inet("127.0.0.1:1"), FakeSeat::default(), t0);
        m.failed(&io::Error::from(io::ErrorKind::WouldBlock));
        assert_eq!(m.rejection(), Some(&Rejection::Tls(TLS_TOO_SLOW.into())));
    }

    /// Issue 31: a penalized address is refused at once, before a TLS handshake or a read,
    /// and never counted as served; the others are not held up, and the driver's fast path
    /// for a listener without checks builds the machine only for a penalized address.
    #[test]
    fn issue_31_a_penalized_address_is_refused_before_any_read_or_handshake() {
        let table = Penalties::for_tests(Duration::from_secs(60));
        let bad: IpAddr = "192.0.2.66".parse().unwrap();
        // Three failures: refused 4 s, a margin for a slow machine.
        for _ in 0..3 {
            table.charge_at(bad, crate::penalty::now_ms()).unwrap();
        }
        let (server, _) = tls_configs();
        let open = Policy::default();
        let mut r = rules(&open);
        r.penalties = Some(table);
        assert!(!r.open_to(&inet("192.0.2.66:1")), "the fast path stops for it");
        assert!(r.open_to(&inet("192.0.2.67:1")), "and for no one else");
        assert!(r.open_to(&Addr::Unix(None)), "a Unix client has no address");
        r.tls = Some(&server);
        let seat = FakeSeat::default();
        let m = Admission::new(r, inet("192.0.2.66:4000"), seat.clone(), Instant::now());
        assert_eq!(m.next(), Next::Close, "no handshake begins");
        let v = m.finish();
        assert!(v.unsent.is_empty() && v.tls.is_none());
        let why = v.rejected.unwrap();
        assert_eq!(why.kind(), Kind::Penalized);
        assert!(
            why.to_string()
                .starts_with("192.0.2.66 is refused for 4s more after 3 failed authentication(s)"),
            "{why}"
        );
        assert!(seat.permitted.borrow().is_empty(), "never counted as served");
        // Another address goes on to its handshake.
        let m = Admission::new(r, inet("192.0.2.67:4000"), FakeSeat::default(), Instant::now());
        assert!(matches!(m.next(), Next::Read { .. }));
        // Behind a balancer, the client the header names is the one refused.
        let mut policy = proxy_policy("127.0.0.0/8");
        let mut r = rules(&policy);
        r.penalties = Some(table);
        let mut m = Admission::new(r, inet("127.0.0.1:1"), FakeSeat::default(), Instant::now());
        let header = b"PROXY TCP4 192.0.2.66 127.0.0.1 5555 7000\r\nGET / HTTP/1.1\r\n";
        assert_eq!(m.received(header, Instant::now()), header.len() - 16);
        assert_eq!(m.rejection().map(Rejection::kind), Some(Kind::Penalized));
        policy.proxy = false;
        let r = Rules {
            penalties: Some(table),
            ..rules(&policy)
        };
        let m = Admission::new(r, inet("127.0.0.1:1"), FakeSeat::default(), Instant::now());
        assert_eq!(m.next(), Next::Serve, "the balancer itself is not penalized");
    }

    /// Each kind of rejection, and the peer the driver's log line names.
    #[test]
    fn each_rejection_kind_is_told_apart() {
        let kinds = [
            Rejection::Denied("192.0.2.1".parse().unwrap()),
            Rejection::BadProxy("x".into()),
            Rejection::Tls("y".into()),
            Rejection::OverCap {
                ip: "192.0.2.1".parse().unwrap(),
                cap: 1,
            },
            Rejection::Penalized {
                ip: "192.0.2.1".parse().unwrap(),
                left: Duration::from_millis(1500),
                failures: 1,
            },
        ];
        let indexes: Vec<usize> = kinds.iter().map(|k| k.kind() as usize).collect();
        assert_eq!(indexes, [0, 1, 2, 3, 4]);
        assert!(indexes.iter().all(|i| *i < Kind::COUNT));
    }
}

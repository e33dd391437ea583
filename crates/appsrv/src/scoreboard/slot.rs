//! A worker's slot: what the worker writes in its own (`impl Slot`, plain stores, no
//! system call) and what the master reads of it ([`Board::read`]: a [`SlotView`]), with
//! the counters a slot carries.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Board, DATAGRAM_COUNTERS, DURATION_BUCKETS_US, HEAD_BYTES, Slot, State, now_ns};
use crate::net::listener::Addr;

impl Slot {
    /// The generation of the worker in this slot (set by the master before its fork).
    pub(crate) fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    pub(super) fn reset(&self) {
        for a in [
            &self.connections,
            &self.requests,
            &self.bytes_in,
            &self.bytes_out,
            &self.started,
            &self.request_started,
            &self.last_activity,
            &self.duration_sum_us,
            &self.denied,
            &self.refused,
            &self.tls_failed,
            &self.errors,
        ] {
            a.store(0, Ordering::Relaxed);
        }
        for a in self.durations.iter().chain(&self.head).chain(&self.peer_ip) {
            a.store(0, Ordering::Relaxed);
        }
        self.head_len.store(0, Ordering::Relaxed);
        self.peer_family.store(0, Ordering::Relaxed);
        self.peer_port.store(0, Ordering::Relaxed);
        self.keepalive.store(false, Ordering::Relaxed);
        self.lingering.store(false, Ordering::Relaxed);
        self.event.store(false, Ordering::Relaxed);
        for a in [
            &self.open,
            &self.reading,
            &self.writing,
            &self.idle_keepalive,
            &self.handling,
        ] {
            a.store(0, Ordering::Relaxed);
        }
        self.accepts_paused.store(false, Ordering::Relaxed);
        self.last_turn.store(0, Ordering::Relaxed);
        self.slow_calls.store(0, Ordering::Relaxed);
        for a in &self.datagrams {
            a.store(0, Ordering::Relaxed);
        }
        self.front.store(false, Ordering::Relaxed);
        self.queued.store(0, Ordering::Relaxed);
    }

    /// The process is a hybrid front (set once, with [`set_event`](Slot::set_event)).
    pub(crate) fn set_front(&self) {
        self.front.store(true, Ordering::Release);
    }

    /// A front publishes how many complete requests it holds for want of room in the
    /// channel.
    pub(crate) fn publish_queued(&self, n: u32) {
        self.queued.store(n, Ordering::Relaxed);
    }

    /// A front handed a connection to the workers (counted as its requests).
    pub(crate) fn handed_off(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.last_activity.store(now_ns(), Ordering::Relaxed);
    }

    /// The worker is an event-loop worker (set once, before it says it is ready).
    pub(crate) fn set_event(&self) {
        self.event.store(true, Ordering::Release);
    }

    /// An event loop's turn begins at `now` (monotonic ns): the request timeout counts
    /// from here until [`turn_end`](Slot::turn_end). Two stores, no system call.
    pub(crate) fn turn_begin(&self, now: u64) {
        self.last_turn.store(now, Ordering::Relaxed);
        self.request_started.store(now.max(1), Ordering::Release);
    }

    /// The loop is about to wait in `epoll_wait`: not stuck, whatever the time.
    pub(crate) fn turn_end(&self) {
        self.request_started.store(0, Ordering::Release);
    }

    /// An event loop calls the handler for a request of `peer` of which `head` is published
    /// (for the status and the request timeout's log line).
    pub(crate) fn handler_call(&self, peer: &Addr, head: &[u8]) {
        self.store_head(head);
        self.store_peer(peer);
        self.handling.store(1, Ordering::Relaxed);
    }

    /// The handler call is over (the request is counted by the worker's ledger, with
    /// [`count_request`](Slot::count_request)).
    pub(crate) fn handler_done(&self) {
        self.handling.store(0, Ordering::Relaxed);
    }

    /// An async worker publishes its requests in flight (client-level sessions count one
    /// each).
    pub(crate) fn set_in_flight(&self, n: u32) {
        self.handling.store(n, Ordering::Relaxed);
    }

    /// A handler call slower than `--slow-request`.
    pub(crate) fn slow_call(&self) {
        self.slow_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// An event loop publishes its connection counts (once per turn).
    /// An event worker publishes its datagram counters (it alone writes them).
    pub(crate) fn publish_datagrams(&self, c: DatagramCounts) {
        for (a, v) in self.datagrams.iter().zip(c.to_array()) {
            a.store(v, Ordering::Relaxed);
        }
    }

    pub(crate) fn publish_counts(&self, c: ConnCounts) {
        self.open.store(c.open, Ordering::Relaxed);
        self.reading.store(c.reading, Ordering::Relaxed);
        self.writing.store(c.writing, Ordering::Relaxed);
        self.idle_keepalive.store(c.idle_keepalive, Ordering::Relaxed);
    }

    /// An event loop stops or resumes accepting.
    pub(crate) fn set_accepts_paused(&self, paused: bool) {
        self.accepts_paused.store(paused, Ordering::Relaxed);
    }

    /// An event loop accepted a connection (counted as the blocking loop counts them).
    pub(crate) fn accepted(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        self.last_activity.store(now_ns(), Ordering::Relaxed);
    }

    /// The guard: the worker is about to wait for the next request of a keep-alive
    /// connection. One store, no system call.
    pub(crate) fn keepalive_wait(&self) {
        self.keepalive.store(true, Ordering::Release);
    }

    /// Hybrid: the worker lingers on a connection a front handed over (a front may wake
    /// it: [`Board::wake_lingering`]). Cleared with the keep-alive mark.
    pub(crate) fn linger_wait(&self) {
        self.lingering.store(true, Ordering::Release);
    }

    /// Hybrid: the worker waits for the next request of a busy connection, and no front
    /// is to wake it for that short wait.
    pub(crate) fn linger_end(&self) {
        self.lingering.store(false, Ordering::Release);
    }

    /// The worker took a new connection: it is no longer at a keep-alive boundary (until
    /// the guard says so again). Before the slot shows it reading.
    pub(crate) fn new_connection(&self) {
        self.keepalive.store(false, Ordering::Release);
        self.lingering.store(false, Ordering::Release);
    }

    /// A connection was accepted whose client is not known yet (its PROXY header is still
    /// to be read): the slot must not go on naming the previous client, whom the
    /// per-address cap would count and `status` would show.
    pub(crate) fn forget_peer(&self) {
        self.peer_family.store(0, Ordering::Release);
    }

    /// A connection was accepted from `peer`.
    pub(crate) fn connection(&self, peer: &Addr) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        self.store_peer(peer);
        self.last_activity.store(now_ns(), Ordering::Relaxed);
    }

    fn store_peer(&self, peer: &Addr) {
        let (family, ip, port) = match peer {
            Addr::Inet(SocketAddr::V4(a)) => (4, a.ip().to_ipv6_mapped().to_bits(), a.port()),
            Addr::Inet(SocketAddr::V6(a)) => (6, a.ip().to_bits(), a.port()),
            Addr::Unix(_) => (1, 0, 0),
        };
        self.peer_ip[0].store((ip >> 64) as u64, Ordering::Relaxed);
        self.peer_ip[1].store(ip as u64, Ordering::Relaxed);
        self.peer_port.store(u32::from(port), Ordering::Relaxed);
        self.peer_family.store(family, Ordering::Release);
    }

    fn peer(&self) -> Option<Addr> {
        let ip = (u128::from(self.peer_ip[0].load(Ordering::Relaxed)) << 64)
            | u128::from(self.peer_ip[1].load(Ordering::Relaxed));
        let port = self.peer_port.load(Ordering::Relaxed) as u16;
        match self.peer_family.load(Ordering::Acquire) {
            4 => Ipv6Addr::from_bits(ip)
                .to_ipv4_mapped()
                .map(|v4| Addr::Inet(SocketAddr::new(IpAddr::V4(v4), port))),
            6 => Some(Addr::Inet(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from_bits(ip)),
                port,
            ))),
            1 => Some(Addr::Unix(None)),
            _ => None,
        }
    }

    /// A request (or, for `handle_client`, a connection) starts; `head` is what is published
    /// of it (its codec's summary, or its first bytes with `--status-request-detail`).
    pub(crate) fn request_start(&self, head: &[u8]) -> u64 {
        let now = now_ns();
        self.store_head(head);
        self.request_started.store(now, Ordering::Release);
        now
    }

    /// Shows `head` for the request in progress (also when more of a request that came in
    /// pieces arrived).
    pub(crate) fn store_head(&self, head: &[u8]) {
        let head = &head[..head.len().min(HEAD_BYTES)];
        for (i, word) in self.head.iter().enumerate() {
            let mut bytes = [0u8; 8];
            let from = (i * 8).min(head.len());
            let to = (i * 8 + 8).min(head.len());
            bytes[..to - from].copy_from_slice(&head[from..to]);
            word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
        self.head_len.store(head.len() as u8, Ordering::Relaxed);
    }

    /// The request that started at `started` (from [`request_start`](Slot::request_start))
    /// is done; `count` says whether it counts as a request (not for `handle_client`).
    pub(crate) fn request_end(&self, started: u64, count: bool) {
        let now = now_ns();
        self.request_stop(now);
        if count {
            self.count_request(now.saturating_sub(started) / 1_000);
        }
    }

    /// The request clock of [`request_start`](Slot::request_start) stops at `now` (from
    /// [`now_ns`]), uncounted: the ledger counts the requests answered.
    pub(crate) fn request_stop(&self, now: u64) {
        self.request_started.store(0, Ordering::Release);
        self.last_activity.store(now, Ordering::Relaxed);
    }

    /// One request answered in `us` microseconds: the count and the histogram.
    pub(crate) fn count_request(&self, us: u64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let bucket = DURATION_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(DURATION_BUCKETS_US.len());
        self.durations[bucket].fetch_add(1, Ordering::Relaxed);
        self.duration_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// A connection closed by the access rules.
    pub(crate) fn denied(&self) {
        self.denied.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection refused by the per-address cap.
    pub(crate) fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed because its TLS handshake failed.
    pub(crate) fn tls_failed(&self) {
        self.tls_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// A request (or a `handle_client` connection) ended in an error: the handler failed,
    /// the codec refused the input, or it timed out.
    pub(crate) fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes read from and written to clients.
    pub(crate) fn add_bytes(&self, read: u64, written: u64) {
        if read > 0 {
            self.bytes_in.fetch_add(read, Ordering::Relaxed);
        }
        if written > 0 {
            self.bytes_out.fetch_add(written, Ordering::Relaxed);
        }
    }

    /// Requests that ended in an error so far ([`Slot::error`]).
    #[cfg(test)]
    pub(crate) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Connections and requests served so far.
    pub(crate) fn served(&self) -> (u64, u64) {
        (
            self.connections.load(Ordering::Relaxed),
            self.requests.load(Ordering::Relaxed),
        )
    }
}

impl Board {
    /// Reads slot `id`.
    pub(crate) fn read(&self, id: u32) -> Option<SlotView> {
        let s = self.slot(id)?;
        let now = now_ns();
        let ago = |t: u64| (t != 0).then(|| Duration::from_nanos(now.saturating_sub(t)));
        let head_len = (s.head_len.load(Ordering::Acquire) as usize).min(HEAD_BYTES);
        let mut head = Vec::with_capacity(HEAD_BYTES);
        for word in &s.head {
            head.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        head.truncate(head_len);
        let mut state = State::from_u8(s.state.load(Ordering::Acquire));
        let counts = ConnCounts {
            open: s.open.load(Ordering::Relaxed),
            reading: s.reading.load(Ordering::Relaxed),
            writing: s.writing.load(Ordering::Relaxed),
            idle_keepalive: s.idle_keepalive.load(Ordering::Relaxed),
        };
        let in_flight = s.handling.load(Ordering::Relaxed);
        // An event (or async) worker's loop reads all the time: its stored state says only
        // that it serves; what it is doing is what its connections are doing (issue 42:
        // a worker showed `reading` with 250 requests in flight). Not a hybrid front,
        // whose state says more.
        if state == State::Reading && s.event.load(Ordering::Acquire) && !s.front.load(Ordering::Relaxed) {
            state = event_state(counts, in_flight);
        }
        Some(SlotView {
            pid: s.pid.load(Ordering::Acquire),
            generation: s.generation.load(Ordering::Acquire),
            state,
            connections: s.connections.load(Ordering::Relaxed),
            requests: s.requests.load(Ordering::Relaxed),
            bytes_in: s.bytes_in.load(Ordering::Relaxed),
            bytes_out: s.bytes_out.load(Ordering::Relaxed),
            age: ago(s.started.load(Ordering::Relaxed)).unwrap_or_default(),
            current: ago(s.request_started.load(Ordering::Acquire)),
            idle_for: ago(s.last_activity.load(Ordering::Relaxed)),
            peer: s.peer(),
            head,
            durations: std::array::from_fn(|i| s.durations[i].load(Ordering::Relaxed)),
            duration_sum: Duration::from_micros(s.duration_sum_us.load(Ordering::Relaxed)),
            denied: s.denied.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            tls_failed: s.tls_failed.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
            event: s.event.load(Ordering::Acquire).then(|| EventView {
                counts,
                handling: in_flight != 0,
                in_flight,
                accepts_paused: s.accepts_paused.load(Ordering::Relaxed),
                last_turn: ago(s.last_turn.load(Ordering::Relaxed)),
            }),
            slow_calls: s.slow_calls.load(Ordering::Relaxed),
            datagrams: DatagramCounts::from_array(std::array::from_fn(|i| {
                s.datagrams[i].load(Ordering::Relaxed)
            })),
        })
    }
}

/// What an event (or async) worker is doing, told by its connections (issue 42), for its
/// state in `status`, `status --json`, the page, the scoreboard line and `/metrics`: idle
/// with none open; else the state of most of them, of reading (a request's bytes or
/// admission), handling (requests in flight: handlers running or awaiting) and writing
/// (output not sent yet), a tie going to the later stage (handling, then writing); reading
/// when all it has are idle keep-alive connections, as a blocking worker waiting for a
/// connection's next request. The counts themselves are shown beside it (the event loops'
/// table, the worker's `event` object, `appsrv_open_connections`).
fn event_state(c: ConnCounts, in_flight: u32) -> State {
    if c.open == 0 {
        // Issue 34: such a worker showed reading while its key said "_" is idle.
        return State::Idle;
    }
    let ranked = [
        (in_flight, State::Handling),
        (c.writing, State::Writing),
        (c.reading, State::Reading),
    ];
    // `max_by_key` keeps the last of equals: the order above is reversed for it.
    ranked
        .into_iter()
        .rev()
        .filter(|(n, _)| *n > 0)
        .max_by_key(|(n, _)| *n)
        .map_or(State::Reading, |(_, state)| state)
}

/// A copy of one slot, read by the master.
#[derive(Debug, Clone)]
pub(crate) struct SlotView {
    pub(crate) pid: u32,
    pub(crate) generation: u32,
    pub(crate) state: State,
    pub(crate) connections: u64,
    pub(crate) requests: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    /// Since the worker was forked.
    pub(crate) age: Duration,
    /// How long the current request (or connection) has been running.
    pub(crate) current: Option<Duration>,
    /// Since the last connection or request ended.
    pub(crate) idle_for: Option<Duration>,
    pub(crate) peer: Option<Addr>,
    /// What is published of the current request (its summary, or its first bytes).
    pub(crate) head: Vec<u8>,
    pub(crate) durations: [u64; DURATION_BUCKETS_US.len() + 1],
    pub(crate) duration_sum: Duration,
    /// Connections closed by the access rules, and refused by the per-address cap.
    pub(crate) denied: u64,
    pub(crate) refused: u64,
    /// Connections whose TLS handshake failed.
    pub(crate) tls_failed: u64,
    /// Requests that ended in an error: the handler failed, the codec refused the input,
    /// or the request timed out.
    pub(crate) errors: u64,
    /// An event-loop worker: its connection counts, whether it stopped accepting, and
    /// how long ago its loop last began a turn.
    pub(crate) event: Option<EventView>,
    /// Handler calls slower than `--slow-request`.
    pub(crate) slow_calls: u64,
    /// Its datagram counters (all zero without datagram listeners).
    pub(crate) datagrams: DatagramCounts,
}

/// What an event worker's slot says of its loop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EventView {
    pub(crate) counts: ConnCounts,
    /// A handler call is running.
    pub(crate) handling: bool,
    /// Requests in flight (async workers: any number; the event loop: 0 or 1).
    pub(crate) in_flight: u32,
    pub(crate) accepts_paused: bool,
    /// Since the loop last began a turn.
    pub(crate) last_turn: Option<Duration>,
}

/// A worker's datagram counters since it started (serialized as `status --json`'s
/// `totals.datagrams`: the fields' names and order are the document's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct DatagramCounts {
    pub(crate) received: u64,
    pub(crate) sent: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    /// Dropped by the listener's rules (`allow`/`deny`).
    pub(crate) denied: u64,
    /// Dropped: longer than `--max-datagram-size`.
    pub(crate) too_large: u64,
    /// Over `--max-answers-per-ip`: dropped, or slipped.
    pub(crate) rate_limited: u64,
    /// The handler returned an error (no answer).
    pub(crate) errors: u64,
    /// Answers the kernel refused to send (or an unbound Unix sender, which has no address).
    pub(crate) send_failed: u64,
}

impl DatagramCounts {
    fn to_array(self) -> [u64; DATAGRAM_COUNTERS] {
        [
            self.received,
            self.sent,
            self.bytes_in,
            self.bytes_out,
            self.denied,
            self.too_large,
            self.rate_limited,
            self.errors,
            self.send_failed,
        ]
    }

    fn from_array(a: [u64; DATAGRAM_COUNTERS]) -> Self {
        DatagramCounts {
            received: a[0],
            sent: a[1],
            bytes_in: a[2],
            bytes_out: a[3],
            denied: a[4],
            too_large: a[5],
            rate_limited: a[6],
            errors: a[7],
            send_failed: a[8],
        }
    }

    /// Adds another worker's counters.
    pub(crate) fn add(&mut self, o: &DatagramCounts) {
        let mut a = self.to_array();
        for (x, y) in a.iter_mut().zip(o.to_array()) {
            *x += y;
        }
        *self = DatagramCounts::from_array(a);
    }
}

/// An event worker's connections, by what each is waiting for (published once per turn of
/// its loop).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ConnCounts {
    /// Open connections (admitted or not yet).
    pub(crate) open: u32,
    /// Waiting for (the rest of) a request, or in admission (PROXY header, TLS handshake).
    pub(crate) reading: u32,
    /// With output not sent yet (a response, a file), or closing.
    pub(crate) writing: u32,
    /// Idle keep-alive connections, between requests.
    pub(crate) idle_keepalive: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_reports_its_client_request_and_durations() {
        let b = Board::new().unwrap();
        b.claim(3, 2);
        b.set_pid(3, 42);
        let s = b.slot(3).unwrap();
        s.connection(&Addr::Inet("192.0.2.7:4321".parse().unwrap()));
        let t = s.request_start(
            b"GET /slow HTTP/1.1\r\nHost: example\r\n\r\n and more bytes than fit in the head area",
        );
        let v = b.read(3).unwrap();
        assert_eq!((v.pid, v.generation, v.connections), (42, 2, 1));
        assert_eq!(v.peer, Some(Addr::Inet("192.0.2.7:4321".parse().unwrap())));
        assert_eq!(v.head.len(), HEAD_BYTES);
        assert!(v.head.starts_with(b"GET /slow HTTP/1.1"));
        assert!(v.current.is_some());
        s.request_end(t, true);
        s.add_bytes(10, 20);
        let v = b.read(3).unwrap();
        assert_eq!((v.requests, v.bytes_in, v.bytes_out), (1, 10, 20));
        assert!(v.current.is_none());
        assert_eq!(v.durations.iter().sum::<u64>(), 1);
        s.connection(&Addr::Inet("[2001:db8::1]:80".parse().unwrap()));
        assert_eq!(
            b.read(3).unwrap().peer,
            Some(Addr::Inet("[2001:db8::1]:80".parse().unwrap()))
        );
    }

    /// Issue 42: an event (or async) worker's state is what most of its connections are
    /// doing, in every view of the slot; a hybrid front's stays its own.
    #[test]
    fn issue_42_an_event_workers_state_is_what_its_connections_do() {
        let counts = |open, reading, writing, idle_keepalive| ConnCounts {
            open,
            reading,
            writing,
            idle_keepalive,
        };
        assert_eq!(event_state(counts(0, 0, 0, 0), 0), State::Idle);
        assert_eq!(event_state(counts(250, 3, 7, 0), 240), State::Handling);
        assert_eq!(event_state(counts(250, 200, 7, 0), 43), State::Reading);
        assert_eq!(event_state(counts(10, 1, 9, 0), 0), State::Writing);
        assert_eq!(event_state(counts(600, 0, 0, 600), 0), State::Reading);
        // Ties go to the later stage.
        assert_eq!(event_state(counts(4, 2, 2, 0), 0), State::Writing);
        assert_eq!(event_state(counts(4, 1, 1, 1), 1), State::Handling);
        let b = Board::new().unwrap();
        b.claim(2, 0);
        b.set_state(2, State::Reading);
        let s = b.slot(2).unwrap();
        s.set_event();
        s.publish_counts(counts(250, 3, 7, 0));
        s.set_in_flight(240);
        let v = b.read(2).unwrap();
        assert_eq!(v.state, State::Handling);
        assert_eq!(v.event.map(|e| (e.in_flight, e.counts.writing)), Some((240, 7)));
        // A stopping worker says so, whatever its connections do.
        b.set_state(2, State::Finishing);
        assert_eq!(b.read(2).unwrap().state, State::Finishing);
        // A front's state is its own.
        b.set_state(2, State::Reading);
        s.set_front();
        assert_eq!(b.read(2).unwrap().state, State::Reading);
    }
}

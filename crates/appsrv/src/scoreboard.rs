//! The scoreboard: memory shared by the master and its workers, one slot per worker.
//!
//! Each worker writes only its own slot; the master reads all of them (for the status, the
//! request timeout, the pool's spare count, the log line naming a dead worker's client)
//! and resets the slot of a worker that died. Beside the slots, the board holds the idle
//! count and two flags: the workers' wake-up of the master, and the master's sighting of
//! clients queued while no worker is idle (for the keep-alive guard). Only `#[repr(C)]` atomics live here, in a
//! `MAP_SHARED` mapping of a memfd made before the first fork (see [`sys::map_shared`]): a private
//! mapping would give every worker its own copy. Nothing here is a lock: a reader may see a
//! slot in the middle of an update (a request's first bytes from the previous request,
//! say), which is fine for a status and for a diagnostic line.
//!
//! Each master maps its own board (a new master after an upgrade starts a new one).
//!
//! Updating a slot costs plain memory stores, no system call, so the request path keeps its
//! floor; timestamps come from `CLOCK_MONOTONIC` through the vDSO.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::net::listener::Addr;
use crate::sys::{self, SharedZeroed};

/// The memfd of the board made by this process (kept open for life: re-executed workers
/// inherit it), -1 before.
static BOARD_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// The largest pool (worker ids run from 1 to this).
pub(crate) const MAX_WORKERS: usize = 1024;

/// How many bytes a slot keeps of what is published about the current request (its
/// codec's summary, or with `--status-request-detail` its first bytes: issue 41).
pub(crate) const HEAD_BYTES: usize = 64;

/// Upper bounds of the request-duration histogram's buckets, in microseconds (the last
/// bucket, +Inf, is implicit).
pub(crate) const DURATION_BUCKETS_US: [u64; 12] = [
    500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 5_000_000,
];

/// What a worker is doing, as stored in its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum State {
    /// Free slot.
    Dead = 0,
    /// Forked, not yet ready (privilege drop, factory).
    Starting = 1,
    /// Waiting in `accept`.
    Idle = 2,
    /// Connected, waiting for (the rest of) a request.
    Reading = 3,
    /// Running the handler.
    Handling = 4,
    /// Writing a response.
    Writing = 5,
    /// Closing a connection (lingering after an error).
    Closing = 6,
    /// Asked to stop or retire: finishing its connection, accepting no more.
    Finishing = 7,
}

impl State {
    fn from_u8(v: u8) -> State {
        match v {
            1 => State::Starting,
            2 => State::Idle,
            3 => State::Reading,
            4 => State::Handling,
            5 => State::Writing,
            6 => State::Closing,
            7 => State::Finishing,
            _ => State::Dead,
        }
    }

    /// The name used in status and metrics.
    pub(crate) fn name(self) -> &'static str {
        match self {
            State::Dead => "dead",
            State::Starting => "starting",
            State::Idle => "idle",
            State::Reading => "reading",
            State::Handling => "handling",
            State::Writing => "writing",
            State::Closing => "closing",
            State::Finishing => "finishing",
        }
    }

    /// The one-letter code of the scoreboard line, in the spirit of Apache's mod_status.
    pub(crate) fn letter(self) -> char {
        match self {
            State::Dead => '.',
            State::Starting => 'S',
            State::Idle => '_',
            State::Reading => 'R',
            State::Handling => 'H',
            State::Writing => 'W',
            State::Closing => 'C',
            State::Finishing => 'F',
        }
    }

    /// Every state, in order.
    pub(crate) const ALL: [State; 8] = [
        State::Dead,
        State::Starting,
        State::Idle,
        State::Reading,
        State::Handling,
        State::Writing,
        State::Closing,
        State::Finishing,
    ];
}

/// One worker's slot.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Slot {
    pid: AtomicU32,
    generation: AtomicU32,
    state: AtomicU8,
    head_len: AtomicU8,
    /// 4 for IPv4, 6 for IPv6, 1 for a Unix peer, 0 for none.
    peer_family: AtomicU8,
    peer_port: AtomicU32,
    peer_ip: [AtomicU64; 2],
    connections: AtomicU64,
    requests: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    /// Monotonic nanoseconds.
    started: AtomicU64,
    /// Start of the current request (handle_request) or connection (handle_client);
    /// 0 when none is in progress.
    request_started: AtomicU64,
    last_activity: AtomicU64,
    head: [AtomicU64; HEAD_BYTES / 8],
    durations: [AtomicU64; DURATION_BUCKETS_US.len() + 1],
    duration_sum_us: AtomicU64,
    /// Connections closed by the access rules, and refused by the per-address cap.
    denied: AtomicU64,
    refused: AtomicU64,
    /// Connections closed because their TLS handshake failed.
    tls_failed: AtomicU64,
    /// Requests that ended in an error (issue 41): the handler failed, the codec refused
    /// the input, or the request timed out.
    errors: AtomicU64,
    /// The worker waits for the next request of a keep-alive connection (set by the
    /// keep-alive guard at each request boundary, cleared when the worker accepts a new
    /// connection): the master may wake it when clients queue (see `master/queue.rs`).
    keepalive: AtomicBool,
    /// An event-loop worker (`--io event`): the counts below describe its connections,
    /// and `request_started` is the start of the loop's current turn (0 while it waits in
    /// `epoll_wait`), so that the request timeout catches a loop that stopped turning.
    event: AtomicBool,
    /// Event worker: its connections, in total and by what each waits for.
    open: AtomicU32,
    reading: AtomicU32,
    writing: AtomicU32,
    idle_keepalive: AtomicU32,
    /// Event worker: handler calls running, its requests in flight (0 or 1 in the event
    /// loop; any number in an async worker).
    handling: AtomicU32,
    /// Event worker: it stopped accepting (at `--worker-connections`, or out of
    /// descriptors).
    accepts_paused: AtomicBool,
    /// Event worker: when its loop last began a turn (monotonic ns).
    last_turn: AtomicU64,
    /// Handler calls slower than `--slow-request`.
    slow_calls: AtomicU64,
    /// Event worker with datagram listeners: its datagram counters ([`DatagramCounts`], in
    /// its field order), published once per turn.
    datagrams: [AtomicU64; DATAGRAM_COUNTERS],
    /// A hybrid front (`--io hybrid`): an event loop that hands requests to the workers
    /// (its `requests` count hand-offs).
    front: AtomicBool,
    /// Front: the complete requests it holds because the hand-off channel was full.
    queued: AtomicU32,
    /// Front: it takes connections handed back (counted in the board's
    /// `fronts_receiving`, which the master corrects when a front dies).
    receiving: AtomicBool,
    /// Hybrid worker: it lingers on a connection handed over (not a TLS connection it
    /// accepted itself, which the keep-alive mark also names).
    lingering: AtomicBool,
}

/// The number of counters in [`DatagramCounts`].
const DATAGRAM_COUNTERS: usize = 9;

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

/// Sources (networks, see [`AnswerPrefixes`]) the answer-rate table
/// (`--max-answers-per-ip`) tracks at once.
const RATE_ENTRIES: usize = 8192;
/// Entries probed for a source before the table gives up on it.
const RATE_PROBES: usize = 8;

/// One source's answers in the current second: its key, and `second << 32 | count`.
#[derive(Debug)]
#[repr(C)]
struct RateEntry {
    key: AtomicU64,
    state: AtomicU64,
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

/// The shared table.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Board {
    /// How many workers wait in `accept` (kept beside the slots so that reading it costs
    /// one load, not a scan).
    idle: AtomicU32,
    /// Below this many idle workers, a worker taking a connection wakes the master.
    min_spare: AtomicU32,
    /// Set by the worker that wakes the master, cleared by the master: one wake-up per
    /// shortage, not one per connection.
    wake_pending: AtomicBool,
    /// When the master last saw clients waiting in a listen queue while no worker was idle
    /// (monotonic ns; 0: it has not, or they were served since). The keep-alive guard reads
    /// it at every request boundary, one load, instead of polling the listeners itself; the
    /// master refreshes it while the queue lasts, and a flag older than [`QUEUED_FRESH`]
    /// counts as down, so that a master that is late (or gone) cannot leave the workers
    /// giving up their connections for nothing.
    queued_seen: AtomicU64,
    slots: [Slot; MAX_WORKERS],
    /// Answers per source in the current second, shared by every worker, so that
    /// `--max-answers-per-ip` holds however the kernel spreads one source's datagrams
    /// over the workers (see [`Board::answer_allowed`]). Untouched pages cost nothing.
    answers: [RateEntry; RATE_ENTRIES],
    /// The answer-rate table's hash key, random, drawn by the master with the board.
    rate_seed: AtomicU64,
    /// Hybrid mode: connections sent into the hand-off channel by the fronts, and taken
    /// from it by the workers; the difference is the requests waiting for a worker in the
    /// channel (see [`Board::waiting`]).
    handoffs_sent: AtomicU64,
    handoffs_taken: AtomicU64,
    /// Hybrid mode: fronts that take connections handed back (not stopping).
    fronts_receiving: AtomicU32,
    /// Log lines dropped because they could not be written (a full disk, a closed stderr),
    /// by process role (master, worker, front, helper) and log (error, access): counted by
    /// every process in `process/log.rs`, read by the master for
    /// `appsrv_log_lines_dropped_total`.
    log_dropped: [[AtomicU64; 2]; 4],
}

/// How long the master's sighting of queued clients ([`Board::mark_queued`]) holds without
/// a refresh. The master looks again every 100 ms while the queue lasts (`master/queue.rs`):
/// this is ten of those, so a master that is merely busy (a fork, a reload hook) does not
/// let it lapse, while one that stopped looking does within a second.
pub(crate) const QUEUED_FRESH: Duration = Duration::from_secs(1);

// SAFETY: `Board` and `Slot` are `#[repr(C)]`, made only of atomics and arrays of atomics
// (valid when zero), and hold no pointers.
unsafe impl SharedZeroed for Board {}

/// How the answer-rate table (`--max-answers-per-ip`) groups sources: by the network of
/// this prefix length around each address (`--answers-ipv4-prefix`,
/// `--answers-ipv6-prefix`). An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, a dual-stack
/// socket's view of an IPv4 client) counts as its IPv4 address.
///
/// Why networks and not addresses: the limit is against reflection, where an attacker
/// forges the victim's address, and a victim network is attacked through many of its
/// addresses at once (a /24's 254 hosts, each with its own allowance, would get 254 times
/// the answers). BIND's and NSD's response rate limiting group sources the same way, by an
/// IPv4 /24 and an IPv6 /56 by default (the usual site allocation; one host has a /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AnswerPrefixes {
    /// The IPv4 prefix length, 1 to 32 (the command line checks it).
    pub(crate) v4: u8,
    /// The IPv6 prefix length, 1 to 128.
    pub(crate) v6: u8,
}

impl AnswerPrefixes {
    /// BIND's and NSD's defaults: an IPv4 /24, an IPv6 /56.
    pub(crate) const DEFAULT: AnswerPrefixes = AnswerPrefixes { v4: 24, v6: 56 };
}

/// The tag of IPv4 keys, in the high half: as an IPv6 /32 it is inside `ff00::/8`
/// (multicast), which is never a source address, so no IPv6 key of a /64 or shorter prefix
/// can equal an IPv4 key.
const V4_KEY_TAG: u64 = 0xFFFF_0000_0000_0000;

/// The answer-rate table's key of a source: its network under `prefixes`, never 0 (a free
/// entry). Exact for IPv4 and for IPv6 prefixes up to 64 bits (the network itself, so two
/// networks never share an entry). A longer IPv6 prefix does not fit the 64-bit key: the
/// bits past the 64th are folded in through a bijection keyed by `seed` (the table's
/// secret), so that the networks inside one /64 all get different keys, and a sender who
/// does not know the secret cannot pick two networks that share one.
fn rate_key(ip: std::net::IpAddr, prefixes: AnswerPrefixes, seed: u64) -> u64 {
    match ip.to_canonical() {
        std::net::IpAddr::V4(a) => {
            let bits = u32::from(prefixes.v4.clamp(1, 32));
            V4_KEY_TAG | u64::from(u32::from(a) & (u32::MAX << (32 - bits)))
        }
        std::net::IpAddr::V6(a) => {
            let bits = u32::from(prefixes.v6.clamp(1, 128));
            let net = u128::from(a) & (u128::MAX << (128 - bits));
            let (high, low) = ((net >> 64) as u64, net as u64);
            // `::/64` (the unspecified and loopback addresses' network) would be 0: it
            // shares 1 with `0:0:0:1::/64`, both reserved, neither a real network.
            let key = if bits <= 64 { high } else { high ^ fold(low, seed) };
            key.max(1)
        }
    }
}

/// A bijection of 64-bit values keyed by `seed`: an xor, a multiplication by an odd
/// constant, an xorshift, each invertible.
fn fold(x: u64, seed: u64) -> u64 {
    let x = (x ^ seed.rotate_left(29)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    x ^ (x >> 32)
}

/// Counts one answer in `e` if its second's count is below `limit`.
fn take_answer(e: &RateEntry, second: u32, limit: u32) -> bool {
    let mut cur = e.state.load(Ordering::Acquire);
    loop {
        let (s, n) = ((cur >> 32) as u32, cur as u32);
        let next = if s != second {
            u64::from(second) << 32 | 1
        } else if n < limit {
            cur + 1
        } else {
            return false;
        };
        match e
            .state
            .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

/// Monotonic time in nanoseconds, comparable between processes.
pub(crate) fn now_ns() -> u64 {
    crate::sys::monotonic_ns()
}

impl Board {
    /// Maps a new board; called once by the master before forking.
    pub(crate) fn new() -> std::io::Result<&'static Board> {
        let (board, fd) = sys::map_shared::<Board>()?;
        board.rate_seed.store(sys::random_u64(), Ordering::Relaxed);
        BOARD_FD.store(std::os::fd::IntoRawFd::into_raw_fd(fd), Ordering::SeqCst);
        Ok(board)
    }

    /// The table of log lines dropped, by role and log (`process::log::DropTable`).
    pub(crate) fn log_dropped(&self) -> &[[AtomicU64; 2]; 4] {
        &self.log_dropped
    }

    /// The memfd behind the board this process made, for a re-executed worker to map.
    pub(crate) fn memfd() -> Option<std::os::fd::RawFd> {
        Some(BOARD_FD.load(Ordering::SeqCst)).filter(|fd| *fd >= 0)
    }

    /// Maps the master's board in a re-executed worker.
    pub(crate) fn adopt(fd: std::os::fd::OwnedFd) -> std::io::Result<&'static Board> {
        sys::map_shared_fd::<Board>(fd)
    }

    /// Whether one more answer to `ip` fits within `limit` answers in the current second
    /// (monotonic `now_ns`), counting it if so. Fixed one-second windows per source network
    /// (`ip`'s network under `prefixes`: see [`AnswerPrefixes`]), in a table shared by the
    /// workers and updated with compare-and-swap only. A source is looked for in
    /// [`RATE_PROBES`] entries from its hash; an entry idle for over a second is taken
    /// over. When all of them hold sources answered within the last second (a flood from
    /// thousands of sources), the new source is not limited: a table that can only track
    /// so many sources must fail open rather than refuse everyone.
    pub(crate) fn answer_allowed(
        &self,
        ip: std::net::IpAddr,
        prefixes: AnswerPrefixes,
        limit: u32,
        now_ns: u64,
    ) -> bool {
        let seed = self.rate_seed.load(Ordering::Relaxed);
        let key = rate_key(ip, prefixes, seed);
        let second = (now_ns / 1_000_000_000) as u32 + 1;
        // Keyed by a secret drawn when the board was made, so that a sender cannot choose
        // addresses that land on a victim's entries.
        let mixed = (key ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let start = (mixed >> (64 - RATE_ENTRIES.trailing_zeros())) as usize;
        let entry = |probe: usize| &self.answers[(start + probe) % RATE_ENTRIES];
        // The source's own entry first, wherever it is among the probes: a free entry
        // before it must not give it a fresh count.
        if let Some(e) = (0..RATE_PROBES)
            .map(entry)
            .find(|e| e.key.load(Ordering::Acquire) == key)
        {
            return take_answer(e, second, limit);
        }
        for probe in 0..RATE_PROBES {
            let e = entry(probe);
            let k = e.key.load(Ordering::Acquire);
            let stale = (e.state.load(Ordering::Acquire) >> 32) as u32 + 1 < second;
            // A free or stale entry's second differs from this one, so take_answer starts
            // its count afresh (no reset here: a worker that took it at the same moment may
            // have counted in it already).
            if (k == 0 || stale)
                && e.key
                    .compare_exchange(k, key, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return take_answer(e, second, limit);
            }
            if e.key.load(Ordering::Acquire) == key {
                return take_answer(e, second, limit);
            }
        }
        true
    }

    pub(crate) fn slot(&self, id: u32) -> Option<&Slot> {
        self.slots.get((id as usize).checked_sub(1)?)
    }

    /// The master prepares slot `id` for a worker it is about to fork. Before the fork,
    /// not after: the worker writes its own state as soon as it runs, and a late reset by
    /// the master would overwrite it.
    pub(crate) fn claim(&self, id: u32, generation: u32) {
        if let Some(s) = self.slot(id) {
            s.reset();
            s.pid.store(0, Ordering::Release);
            s.generation.store(generation, Ordering::Release);
            s.started.store(now_ns(), Ordering::Release);
            s.state.store(State::Starting as u8, Ordering::Release);
        }
    }

    /// The master records the pid of the worker it forked into slot `id`.
    pub(crate) fn set_pid(&self, id: u32, pid: u32) {
        if let Some(s) = self.slot(id) {
            s.pid.store(pid, Ordering::Release);
        }
    }

    /// The master frees the slot of a worker that is gone, keeping the idle count (and the
    /// count of fronts taking connections back) right.
    pub(crate) fn release(&self, id: u32) {
        self.set_state(id, State::Dead);
        self.set_receiving(id, false);
        if let Some(s) = self.slot(id) {
            // A dead front holds nothing any more (its requests went with it).
            s.queued.store(0, Ordering::Relaxed);
            s.pid.store(0, Ordering::Release);
        }
    }

    /// Sets worker `id`'s state, keeping the idle count in step.
    pub(crate) fn set_state(&self, id: u32, state: State) {
        let Some(s) = self.slot(id) else { return };
        let old = s.state.swap(state as u8, Ordering::AcqRel);
        let was_idle = old == State::Idle as u8;
        let is_idle = state == State::Idle;
        if is_idle && !was_idle {
            self.idle.fetch_add(1, Ordering::AcqRel);
        } else if was_idle && !is_idle {
            let _ = self
                .idle
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
            // A worker leaving the idle set may leave too few spares: wake the master, once.
            if self.idle.load(Ordering::Acquire) < self.min_spare.load(Ordering::Acquire)
                && !self.wake_pending.swap(true, Ordering::AcqRel)
            {
                sys::wake_master();
            }
        }
    }

    /// How many workers are busy with a connection from `ip` (the per-address cap: a
    /// worker publishes its client in its slot, then counts; two workers racing may both
    /// see each other and both refuse, but the cap is never exceeded).
    pub(crate) fn connections_from(&self, ip: std::net::IpAddr) -> usize {
        let want = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().to_bits(),
            IpAddr::V6(v6) => v6.to_bits(),
        };
        self.slots
            .iter()
            .filter(|s| {
                let state = State::from_u8(s.state.load(Ordering::Acquire));
                !matches!(state, State::Dead | State::Idle | State::Starting)
                    && matches!(s.peer_family.load(Ordering::Acquire), 4 | 6)
                    && (u128::from(s.peer_ip[0].load(Ordering::Relaxed)) << 64
                        | u128::from(s.peer_ip[1].load(Ordering::Relaxed)))
                        == want
            })
            .count()
    }

    /// Hybrid: a front sent a connection into the hand-off channel; when no worker is idle,
    /// the master is woken (once per shortage) so that a dynamic pool grows at once.
    /// Returns the count of hand-offs sent, this one included.
    pub(crate) fn handoff_sent(&self) -> u64 {
        let sent = self.handoffs_sent.fetch_add(1, Ordering::AcqRel) + 1;
        if self.idle() == 0
            && self.min_spare.load(Ordering::Acquire) > 0
            && !self.wake_pending.swap(true, Ordering::AcqRel)
        {
            sys::wake_master();
        }
        sent
    }

    /// Hybrid: a worker took a connection from the channel (and named its client in its
    /// slot: see `Front::settle`).
    pub(crate) fn handoff_taken(&self) {
        self.handoffs_taken.fetch_add(1, Ordering::AcqRel);
    }

    /// Hybrid: the master's correction when the channel is empty after a worker died: a
    /// worker killed between taking a connection and counting it leaves the counts one
    /// apart for good, and workers would see a request waiting that is not there.
    pub(crate) fn handoffs_settled(&self) {
        let sent = self.handoffs_sent.load(Ordering::Acquire);
        self.handoffs_taken.fetch_max(sent, Ordering::AcqRel);
    }

    /// Hybrid: connections sent into the channel so far (by every front since the start).
    pub(crate) fn handoffs_sent(&self) -> u64 {
        self.handoffs_sent.load(Ordering::Acquire)
    }

    /// Hybrid: the connections taken from the channel so far.
    pub(crate) fn handoffs_taken(&self) -> u64 {
        self.handoffs_taken.load(Ordering::Acquire)
    }

    /// Hybrid: whether complete requests wait in the channel for a worker (two loads: the
    /// worker's question at each request boundary of a connection it keeps).
    pub(crate) fn requests_waiting(&self) -> bool {
        self.handoffs_taken.load(Ordering::Acquire) < self.handoffs_sent.load(Ordering::Acquire)
    }

    /// Hybrid: the complete requests waiting for a worker, in the channel and held by the
    /// fronts for want of room in it. `channel_empty` is the master's look at the channel
    /// itself: the counters can be one off for good when a worker is killed between taking
    /// a connection and counting it, and an empty channel holds nothing, whatever they say.
    pub(crate) fn waiting(&self, channel_empty: bool) -> u64 {
        let in_channel = if channel_empty {
            0
        } else {
            self.handoffs_sent
                .load(Ordering::Acquire)
                .saturating_sub(self.handoffs_taken.load(Ordering::Acquire))
        };
        in_channel
            + self
                .slots
                .iter()
                .filter(|s| s.front.load(Ordering::Relaxed))
                .map(|s| u64::from(s.queued.load(Ordering::Relaxed)))
                .sum::<u64>()
    }

    /// Hybrid: front `id` starts or stops taking connections handed back; the master stops
    /// it for a front that died (a flag per slot: counted once either way).
    pub(crate) fn set_receiving(&self, id: u32, on: bool) {
        let Some(s) = self.slot(id) else { return };
        if s.receiving.swap(on, Ordering::AcqRel) == on {
            return;
        }
        if on {
            self.fronts_receiving.fetch_add(1, Ordering::AcqRel);
        } else {
            let _ = self
                .fronts_receiving
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
        }
    }

    /// Hybrid: a request was handed off while no worker is idle: wakes one worker that
    /// lingers on a quiet connection (marked at a keep-alive boundary, in its read), with
    /// [`sys::GUARD_SIGNAL`], so that it hands that connection back and takes the request
    /// instead of finishing its linger. The scan starts at `*next` (so that successive
    /// wake-ups go to different workers) and moves it on; the woken worker's mark is
    /// cleared, so the next request wakes another. False when no worker lingers.
    pub(crate) fn wake_lingering(&self, next: &mut usize) -> bool {
        // Pairs with the fence after a worker's mark: either the worker sees the request
        // waiting, or this sees its mark.
        std::sync::atomic::fence(Ordering::SeqCst);
        let n = self.slots.len();
        for k in 0..n {
            let i = (*next + k) % n;
            let s = &self.slots[i];
            let pid = s.pid.load(Ordering::Acquire);
            if pid == 0 || !s.lingering.load(Ordering::Acquire) || !self.at_keepalive_boundary(i as u32 + 1) {
                continue;
            }
            if !s.lingering.swap(false, Ordering::AcqRel) {
                continue; // another front woke it first
            }
            *next = i + 1;
            return sys::wake_worker(nix::unistd::Pid::from_raw(pid as i32));
        }
        false
    }

    /// Hybrid: whether some front takes connections handed back.
    pub(crate) fn fronts_receiving(&self) -> bool {
        self.fronts_receiving.load(Ordering::Acquire) > 0
    }

    /// How many workers wait in `accept`.
    pub(crate) fn idle(&self) -> u32 {
        self.idle.load(Ordering::Acquire)
    }

    /// Sets the spare threshold below which workers wake the master (0: never).
    pub(crate) fn set_min_spare(&self, n: u32) {
        self.min_spare.store(n, Ordering::Release);
    }

    /// The master acknowledges a wake-up.
    pub(crate) fn clear_wake(&self) {
        self.wake_pending.store(false, Ordering::Release);
    }

    /// The master sees clients waiting in a listen queue while no worker is idle (or still
    /// sees them: the sighting is refreshed).
    pub(crate) fn mark_queued(&self) {
        self.queued_seen.store(now_ns().max(1), Ordering::Release);
    }

    /// The master sees the queue served.
    pub(crate) fn clear_queued(&self) {
        self.queued_seen.store(0, Ordering::Release);
    }

    /// Whether clients wait in a listen queue while no worker is idle, as the master last
    /// saw it (within [`QUEUED_FRESH`]). For the keep-alive guard at every request boundary:
    /// one load while the flag is down, the usual case; a second one and a clock read
    /// (`CLOCK_MONOTONIC`, through the vDSO) while it is up. No system call.
    pub(crate) fn clients_queued(&self) -> bool {
        let seen = self.queued_seen.load(Ordering::Acquire);
        seen != 0 && self.sighting_holds(seen, now_ns())
    }

    /// [`clients_queued`](Board::clients_queued) as of `now`.
    #[cfg(test)]
    fn queued_at(&self, now: u64) -> bool {
        self.sighting_holds(self.queued_seen.load(Ordering::Acquire), now)
    }

    /// Whether the master's sighting at `seen` (0: none) still says clients are queued at
    /// `now` while no worker is idle.
    fn sighting_holds(&self, seen: u64, now: u64) -> bool {
        seen != 0 && self.idle() == 0 && now.saturating_sub(seen) < QUEUED_FRESH.as_nanos() as u64
    }

    /// Whether worker `id` waits for the next request of a keep-alive connection: its slot
    /// is marked so by the guard, shows it reading, and names no request in progress (a
    /// request half received, or a connection whose first request has not come, is not
    /// given up by the guard: no wake-up for those).
    pub(crate) fn at_keepalive_boundary(&self, id: u32) -> bool {
        self.slot(id).is_some_and(|s| {
            s.keepalive.load(Ordering::Acquire)
                && s.state.load(Ordering::Acquire) == State::Reading as u8
                && s.request_started.load(Ordering::Acquire) == 0
        })
    }

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

impl Slot {
    /// The generation of the worker in this slot (set by the master before its fork).
    pub(crate) fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    fn reset(&self) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn issue_19_answer_rate_holds_per_source_and_second() {
        let b = Board::new().unwrap();
        // Each IPv4 address alone, an IPv6 /64 (issue 19's grouping, now flags).
        let each = AnswerPrefixes { v4: 32, v6: 64 };
        let (a, other) = (ip("192.0.2.1"), ip("192.0.2.2"));
        let t = 5_000_000_000;
        assert_eq!((0..10).filter(|_| b.answer_allowed(a, each, 3, t)).count(), 3);
        // Another source has its own allowance; the same one gets a new one next second.
        assert!(b.answer_allowed(other, each, 3, t));
        assert!(b.answer_allowed(a, each, 3, t + 1_000_000_000));
        // An IPv6 /64 is one source; IPv4-mapped is the IPv4 address.
        assert!(b.answer_allowed(ip("2001:db8::1"), each, 1, t));
        assert!(!b.answer_allowed(ip("2001:db8::2"), each, 1, t));
        assert!(b.answer_allowed(ip("2001:db8:0:1::1"), each, 1, t));
        assert!(!b.answer_allowed(ip("::ffff:192.0.2.1"), each, 1, t + 1_000_000_000));
    }

    /// Issue 31: the key is the source's network. With the defaults, an IPv4 /24 (an
    /// IPv4-mapped IPv6 address is its IPv4 address) and an IPv6 /56; any prefix length
    /// the command line takes gives one key per network and distinct keys to distinct
    /// networks, never 0 (a free entry).
    #[test]
    fn issue_31_the_rate_key_is_the_sources_network() {
        let seed = 0x0123_4567_89ab_cdef;
        let key = |s: &str, v4: u8, v6: u8| rate_key(ip(s), AnswerPrefixes { v4, v6 }, seed);
        let d = |s: &str| key(s, 24, 56);
        assert_eq!(AnswerPrefixes::DEFAULT, AnswerPrefixes { v4: 24, v6: 56 });
        // IPv4: a /24.
        assert_eq!(d("192.0.2.1"), d("192.0.2.254"));
        assert_eq!(d("192.0.2.1"), d("192.0.2.0"));
        assert_ne!(d("192.0.2.1"), d("192.0.3.1"));
        assert_ne!(d("192.0.2.1"), d("193.0.2.1"));
        assert_eq!(d("127.0.0.2"), d("127.0.0.200"));
        assert_ne!(d("127.0.0.2"), d("127.0.1.2"));
        // IPv4-mapped IPv6 is the IPv4 address, under the IPv4 prefix.
        assert_eq!(d("::ffff:192.0.2.77"), d("192.0.2.1"));
        assert_ne!(d("::ffff:192.0.3.1"), d("192.0.2.1"));
        assert_eq!(key("::ffff:10.1.2.3", 8, 128), key("10.200.0.1", 8, 128));
        // IPv6: a /56, the 8 bits after it included, the 64 after them not.
        assert_eq!(d("2001:db8:0:1::1"), d("2001:db8:0:ff:ffff::9"));
        assert_eq!(d("2001:db8::1"), d("2001:db8:0:1::1"));
        assert_ne!(d("2001:db8::1"), d("2001:db8:0:100::1"));
        assert_ne!(d("2001:db8::1"), d("2001:db9::1"));
        // IPv4-compatible (deprecated, not mapped) is IPv6, not its IPv4 address.
        assert_ne!(d("::c000:201"), d("192.0.2.1"));
        // Other lengths: each address alone, and longer IPv6 prefixes than the key's 64
        // bits (folded, still one key per network).
        assert_ne!(key("192.0.2.1", 32, 56), key("192.0.2.2", 32, 56));
        assert_eq!(key("192.0.2.1", 31, 56), key("192.0.2.0", 31, 56));
        assert_eq!(key("10.9.8.7", 1, 56), key("127.0.0.1", 1, 56));
        assert_ne!(key("10.9.8.7", 1, 56), key("128.0.0.1", 1, 56));
        assert_eq!(key("2001:db8::1", 1, 1), key("::1", 1, 1));
        assert_ne!(key("2001:db8::1", 1, 1), key("8000::1", 1, 1));
        assert_eq!(key("2001:db8::1:2", 120, 112), key("2001:db8::1:ff", 120, 112));
        assert_ne!(key("2001:db8::1:2", 120, 112), key("2001:db8::2:2", 120, 112));
        assert_ne!(key("2001:db8::1", 32, 128), key("2001:db8::2", 32, 128));
        let mut in_one_64: Vec<u64> = (0..4096u32)
            .map(|i| key(&format!("2001:db8::{:x}:{:x}", i >> 8, i & 0xff), 24, 128))
            .collect();
        in_one_64.sort_unstable();
        in_one_64.dedup();
        assert_eq!(in_one_64.len(), 4096, "a /128 each, inside one /64");
        // Never 0.
        for (s, v6) in [("::", 56), ("::1", 56), ("::", 128), ("::1", 64)] {
            assert_ne!(key(s, 24, v6), 0, "{s} /{v6}");
        }
    }

    /// Issue 31: the sources of one network share one budget, across its addresses.
    #[test]
    fn issue_31_a_networks_addresses_share_one_answer_budget() {
        let b = Board::new().unwrap();
        let d = AnswerPrefixes::DEFAULT;
        let t = 7_000_000_000;
        let answered = (2..=254)
            .filter(|i| b.answer_allowed(ip(&format!("198.51.100.{i}")), d, 10, t))
            .count();
        assert_eq!(answered, 10, "253 addresses of one /24, 10 answers in all");
        assert!(
            b.answer_allowed(ip("198.51.101.2"), d, 10, t),
            "the next /24 has its own"
        );
        assert!(
            !b.answer_allowed(ip("::ffff:198.51.100.9"), d, 10, t),
            "IPv4-mapped: the same /24"
        );
        let v6 = (0..100)
            .filter(|i| b.answer_allowed(ip(&format!("2001:db8:0:{i:x}::1")), d, 10, t))
            .count();
        assert_eq!(v6, 10, "100 /64s of one /56");
        assert!(
            b.answer_allowed(ip("2001:db8:0:100::1"), d, 10, t),
            "the next /56"
        );
        // A second later, a new budget.
        assert!(b.answer_allowed(ip("198.51.100.200"), d, 10, t + 1_000_000_000));
    }

    #[test]
    fn idle_count_follows_the_states() {
        let b = Board::new().unwrap();
        assert_eq!(b.idle(), 0);
        b.claim(1, 0);
        b.claim(7, 0);
        b.set_state(1, State::Idle);
        b.set_state(1, State::Idle);
        b.set_state(7, State::Idle);
        assert_eq!(b.idle(), 2, "a slot counts once");
        b.set_state(1, State::Reading);
        b.set_state(1, State::Handling);
        assert_eq!(b.idle(), 1);
        b.release(7);
        assert_eq!(b.idle(), 0, "a released idle worker no longer counts");
        b.set_state(0, State::Idle); // no such slot: ignored
        b.set_state(MAX_WORKERS as u32 + 1, State::Idle);
        assert_eq!(b.idle(), 0);
    }

    #[test]
    fn issue_15_the_queued_flag_holds_while_no_worker_is_idle_and_expires() {
        let b = Board::new().unwrap();
        b.claim(1, 0);
        b.claim(2, 0);
        assert!(!b.clients_queued(), "down on a new board");
        b.mark_queued();
        assert!(b.clients_queued());
        b.set_state(2, State::Idle);
        assert!(!b.clients_queued(), "an idle worker will take the queued client");
        b.set_state(2, State::Reading);
        assert!(b.clients_queued());
        let now = now_ns();
        let fresh = QUEUED_FRESH.as_nanos() as u64;
        assert!(b.queued_at(now + fresh / 2));
        assert!(
            !b.queued_at(now + fresh + 1),
            "a sighting the master did not refresh lapses by itself"
        );
        b.mark_queued();
        b.clear_queued();
        assert!(!b.clients_queued());
    }

    #[test]
    fn issue_15_only_a_worker_between_keepalive_requests_counts_as_at_a_boundary() {
        let b = Board::new().unwrap();
        b.claim(4, 0);
        let s = b.slot(4).unwrap();
        b.set_state(4, State::Idle);
        s.new_connection();
        b.set_state(4, State::Reading);
        assert!(
            !b.at_keepalive_boundary(4),
            "a new connection waits for its first request"
        );
        let t = s.request_start(b"GET / HTTP/1.1\r\n");
        b.set_state(4, State::Handling);
        s.request_end(t, true);
        b.set_state(4, State::Reading);
        s.keepalive_wait();
        assert!(b.at_keepalive_boundary(4));
        s.request_start(b"GET /half");
        assert!(!b.at_keepalive_boundary(4), "a request is half received");
        s.request_end(t, false);
        b.set_state(4, State::Closing);
        assert!(!b.at_keepalive_boundary(4));
        b.set_state(4, State::Idle);
        s.new_connection();
        b.set_state(4, State::Reading);
        assert!(!b.at_keepalive_boundary(4), "the next connection starts unmarked");
        assert!(!b.at_keepalive_boundary(0) && !b.at_keepalive_boundary(5));
    }

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

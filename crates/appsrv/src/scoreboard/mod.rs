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

//!
//! # Files
//!
//! | File | Owns |
//! |---|---|
//! | `mod.rs` | the shared layout (`Board`, `Slot`, the answer-rate table's entries: every `#[repr(C)]` type of the mapping, beside the one `unsafe impl` that vouches for them), the board's making and mapping, the master's side of a slot (claim, pid, release), the states and the idle count, the spare threshold's wake-up, the sighting of queued clients and the keep-alive boundary |
//! | `slot.rs` | what a worker writes in its own slot (`impl Slot`) and what the master reads of it (`Board::read`, `SlotView`, `EventView`), with the counters they carry (`ConnCounts`, `DatagramCounts`) |
//! | `hybrid.rs` | hybrid mode's counters on the board: hand-offs sent and taken, the requests waiting, the fronts taking connections back, the wake-up of a lingering worker |
//! | `answers.rs` | the per-source answer-rate table of datagram listeners (`--max-answers-per-ip`): `AnswerPrefixes`, the keys, `Board::answer_allowed` |
//!
//! The layout stays in `mod.rs`, so that the other files reach the fields of `Board` and
//! `Slot` as their module's children without the fields being opened any wider; they use
//! no sibling (`slot.rs`'s types are re-exported here).

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::sys::{self, SharedZeroed};

mod answers;
mod hybrid;
mod slot;

pub(crate) use answers::AnswerPrefixes;
pub(crate) use slot::{ConnCounts, DatagramCounts, EventView, SlotView};

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

/// Sources (networks, see [`AnswerPrefixes`]) the answer-rate table
/// (`--max-answers-per-ip`) tracks at once.
const RATE_ENTRIES: usize = 8192;

/// One source's answers in the current second: its key, and `second << 32 | count`.
#[derive(Debug)]
#[repr(C)]
struct RateEntry {
    key: AtomicU64,
    state: AtomicU64,
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

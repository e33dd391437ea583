//! Not part of appsrv's API: this module exists only for the Criterion benchmarks in
//! `crates/appsrv/benches/`, which are compiled as a separate crate and cannot reach the
//! crate-private scoreboard. It is hidden from the documentation and may change or
//! disappear at any time, in any release; do not use it.
//!
//! Each item is a thin wrapper: every method calls the crate's own function of the same
//! name and adds no behaviour.

use std::io;
use std::net::IpAddr;

use crate::net::listener::Addr;
use crate::scoreboard;

/// The largest pool: worker ids (slots) run from 1 to this.
pub const MAX_WORKERS: usize = scoreboard::MAX_WORKERS;

/// How many of a request's first bytes a slot keeps.
pub const HEAD_BYTES: usize = scoreboard::HEAD_BYTES;

/// Monotonic time in nanoseconds, as the scoreboard reads it (`scoreboard::now_ns`).
pub fn now_ns() -> u64 {
    scoreboard::now_ns()
}

/// A worker's state, as the crate's scoreboard stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Forked, not yet ready.
    Starting,
    /// Waiting in `accept`.
    Idle,
    /// Connected, waiting for a request.
    Reading,
    /// Running the handler.
    Handling,
    /// Writing a response.
    Writing,
    /// Closing a connection.
    Closing,
    /// Finishing its last connection.
    Finishing,
}

impl From<State> for scoreboard::State {
    fn from(s: State) -> Self {
        match s {
            State::Starting => scoreboard::State::Starting,
            State::Idle => scoreboard::State::Idle,
            State::Reading => scoreboard::State::Reading,
            State::Handling => scoreboard::State::Handling,
            State::Writing => scoreboard::State::Writing,
            State::Closing => scoreboard::State::Closing,
            State::Finishing => scoreboard::State::Finishing,
        }
    }
}

/// The scoreboard (shared memory, as the master maps it before forking).
#[derive(Debug, Clone, Copy)]
pub struct Board(&'static scoreboard::Board);

impl Board {
    /// Maps a new board (`Board::new`); the mapping lives as long as the process.
    pub fn new() -> io::Result<Board> {
        scoreboard::Board::new().map(Board)
    }

    /// Slot `id` (1 to [`MAX_WORKERS`]).
    pub fn slot(&self, id: u32) -> Option<Slot> {
        self.0.slot(id).map(Slot)
    }

    /// The master prepares slot `id` for a worker (`Board::claim`).
    pub fn claim(&self, id: u32, generation: u32) {
        self.0.claim(id, generation);
    }

    /// The master records a worker's pid (`Board::set_pid`).
    pub fn set_pid(&self, id: u32, pid: u32) {
        self.0.set_pid(id, pid);
    }

    /// The master frees slot `id` (`Board::release`).
    pub fn release(&self, id: u32) {
        self.0.release(id);
    }

    /// Sets worker `id`'s state (`Board::set_state`).
    pub fn set_state(&self, id: u32, state: State) {
        self.0.set_state(id, state.into());
    }

    /// Busy workers whose client is `ip` (`Board::connections_from`).
    pub fn connections_from(&self, ip: IpAddr) -> usize {
        self.0.connections_from(ip)
    }

    /// Idle workers (`Board::idle`).
    pub fn idle(&self) -> u32 {
        self.0.idle()
    }

    /// Reads slot `id` (`Board::read`).
    pub fn read(&self, id: u32) -> Option<SlotView> {
        self.0.read(id).map(SlotView)
    }
}

/// One worker's slot.
#[derive(Debug, Clone, Copy)]
pub struct Slot(&'static scoreboard::Slot);

impl Slot {
    /// A connection was accepted from `peer` (`Slot::connection`).
    pub fn connection(&self, peer: &Addr) {
        self.0.connection(peer);
    }

    /// A connection whose client is not known yet (`Slot::forget_peer`).
    pub fn forget_peer(&self) {
        self.0.forget_peer();
    }

    /// A request starts (`Slot::request_start`); returns its start time.
    pub fn request_start(&self, head: &[u8]) -> u64 {
        self.0.request_start(head)
    }

    /// The request started at `started` is done (`Slot::request_end`).
    pub fn request_end(&self, started: u64, count: bool) {
        self.0.request_end(started, count);
    }

    /// Bytes read and written (`Slot::add_bytes`).
    pub fn add_bytes(&self, read: u64, written: u64) {
        self.0.add_bytes(read, written);
    }

    /// Connections and requests served (`Slot::served`).
    pub fn served(&self) -> (u64, u64) {
        self.0.served()
    }
}

/// A copy of one slot, as the master reads it.
#[derive(Debug, Clone)]
pub struct SlotView(scoreboard::SlotView);

impl SlotView {
    /// The state's letter in the status line (`State::letter`).
    pub fn letter(&self) -> char {
        self.0.state.letter()
    }

    /// Requests served by the slot's worker.
    pub fn requests(&self) -> u64 {
        self.0.requests
    }
}

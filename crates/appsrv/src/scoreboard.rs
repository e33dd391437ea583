//! Memory shared by the master and its workers: which workers are idle.
//!
//! Each worker owns one slot and writes only its own; the master reads all and clears the
//! slot of a worker that died. Only `#[repr(C)]` atomics live here, in a `MAP_SHARED`
//! mapping made before the first fork (see [`sys::map_shared`]).

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use crate::sys::{self, SharedZeroed};

/// The largest pool (worker ids run from 1 to this).
pub(crate) const MAX_WORKERS: usize = 4096;

const BUSY: u8 = 0;
const IDLE: u8 = 1;

/// The shared table.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Board {
    /// How many workers wait in `accept` (kept beside the slots so that reading it costs
    /// one load, not a scan).
    idle: AtomicU32,
    slots: [AtomicU8; MAX_WORKERS],
}

// SAFETY: `Board` is `#[repr(C)]`, made only of atomics (valid when zero), and holds no
// pointers.
unsafe impl SharedZeroed for Board {}

impl Board {
    /// Maps a new board; called once by the master before forking.
    pub(crate) fn new() -> std::io::Result<&'static Board> {
        sys::map_shared::<Board>()
    }

    fn slot(&self, id: u32) -> Option<&AtomicU8> {
        self.slots.get((id as usize).checked_sub(1)?)
    }

    /// Worker `id` starts waiting for a connection.
    pub(crate) fn set_idle(&self, id: u32) {
        if let Some(s) = self.slot(id) {
            if s.swap(IDLE, Ordering::AcqRel) != IDLE {
                self.idle.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Worker `id` took a connection (or died: the master clears its slot).
    pub(crate) fn set_busy(&self, id: u32) {
        if let Some(s) = self.slot(id) {
            if s.swap(BUSY, Ordering::AcqRel) == IDLE {
                let _ = self
                    .idle
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
            }
        }
    }

    /// How many workers wait in `accept`.
    pub(crate) fn idle(&self) -> u32 {
        self.idle.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_count_follows_the_slots() {
        let b = Board::new().unwrap();
        assert_eq!(b.idle(), 0);
        b.set_idle(1);
        b.set_idle(1);
        b.set_idle(7);
        assert_eq!(b.idle(), 2, "a slot counts once");
        b.set_busy(1);
        b.set_busy(1);
        assert_eq!(b.idle(), 1);
        b.set_busy(7);
        b.set_busy(9);
        assert_eq!(b.idle(), 0);
        b.set_idle(0); // no such slot: ignored
        b.set_idle(MAX_WORKERS as u32 + 1);
        assert_eq!(b.idle(), 0);
    }
}

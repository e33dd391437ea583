//! Hybrid mode's counters on the board (`--io hybrid`): the fronts' hand-offs and the
//! workers' takes, the requests waiting for a worker, the fronts that take connections
//! back, and the wake-up of a worker lingering on a quiet connection.

use std::sync::atomic::Ordering;

use super::Board;
use crate::sys;

impl Board {
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
}

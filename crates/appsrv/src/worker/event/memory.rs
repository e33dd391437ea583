//! The budget of buffered bytes (`--max-buffered-bytes`) as the event loop keeps it: what
//! the connections' buffers hold, the connections paused at the budget and their resuming,
//! the episode's lines, giving memory back after a flood; and the worker-wide buffers a
//! connection with nothing of its own reads into. The rule itself (what a read may take
//! at the budget, refuse or pause) is `worker/budget.rs`'s constants, shared with the
//! async driver.

use std::time::{Duration, Instant};

use crate::conn::buffers::Buffers;
use crate::conn::step::{Gathered, Wait};
use crate::handler::RequestHandler;
use crate::sys;

use super::super::budget::{SHED_BELOW, TRIM_ABOVE};
use super::super::reactor::Token;
use super::connection::{Connection, Pass, Pending};
use super::drive::Quiet;
use super::{Completion, Loop};

/// The loop's memory: its budget's state, and the buffers every connection shares.
pub(super) struct Memory {
    /// The worker-wide buffers: a connection with no private buffers reads into them.
    pub(super) shared: Buffers,
    /// What a lingering close reads and drops into.
    pub(super) scratch: Vec<u8>,
    /// Bytes held in connections' private read buffers (partial requests), against
    /// `limits.max_buffered`.
    pub(super) buffered: usize,
    /// Connections that stopped reading at the budget (tokens), resumed when it has room.
    pub(super) paused: Vec<Token>,
    /// Whether the connection being driven reads into the worker-wide buffers.
    pub(super) pass_shared: bool,
    /// The token of the connection being driven.
    pub(super) pass_token: Token,
    /// The budget's episode, for one log line per episode.
    episode: Option<Instant>,
    /// How the codec refuses a request at the budget, for that line
    /// ([`refusal_words`](super::super::budget::refusal_words)).
    pub(super) refusal: String,
    /// The most `buffered` held since memory was last given back (see [`Loop::trim`]).
    peak: usize,
    /// When memory was last given back.
    trimmed_at: Instant,
    /// When a trim held back by the once-a-second limit is due (see [`Loop::trim`]).
    pub(super) trim_at: Option<Instant>,
}

impl Memory {
    /// Nothing buffered yet.
    pub(super) fn new() -> Self {
        Memory {
            shared: Buffers::new(),
            scratch: vec![0; 4096],
            buffered: 0,
            paused: Vec::new(),
            pass_shared: false,
            pass_token: Token::default(),
            episode: None,
            refusal: String::new(),
            peak: 0,
            trimmed_at: Instant::now(),
            trim_at: None,
        }
    }
}

impl<'a, H: RequestHandler, C: Completion<'a>> Loop<'a, H, C> {
    /// Whether the connections' buffers hold the budget of `--max-buffered-bytes`.
    pub(super) fn over_budget(&self) -> bool {
        self.cfg.limits.max_buffered > 0 && self.held_total() >= self.cfg.limits.max_buffered
    }

    /// What the budget counts: the connections' buffers, and in a front the requests
    /// handed off but not yet in a worker (held for room in the channel, or spooled in
    /// it): those leave the connection, not the front's memory, while the workers are all
    /// busy.
    fn held_total(&self) -> usize {
        self.memory.buffered + self.completion.memory()
    }

    /// Connections paused at the budget read again once it has room (an eighth of it, so
    /// that they do not pause again at their first read).
    pub(super) fn resume_paused(&mut self) {
        if self.memory.paused.is_empty() {
            return;
        }
        let max = self.cfg.limits.max_buffered;
        let room = max / 8;
        if self.held_total().saturating_add(room) > max {
            return;
        }
        if let Some(since) = self.memory.episode.take() {
            tracing::info!(
                "buffered request bytes under --max-buffered-bytes {} again after {:.1?}: {} paused connection(s) read again",
                max,
                self.reactor.now.saturating_duration_since(since),
                self.memory.paused.len()
            );
        }
        for token in std::mem::take(&mut self.memory.paused) {
            if let Some(c) = self.reactor.conns.get_mut(token) {
                c.paused = false;
                self.reactor.ready.push(&mut c.queued, token);
            }
        }
    }

    /// Gives memory back to the system once the buffers of a flood are freed: when what
    /// the connections' buffers hold has fallen to a quarter of a peak of at least
    /// [`TRIM_ABOVE`], at most once a second (`sys::release_free_memory`). A trim held
    /// back by that second is due later (`Memory::trim_at`, a wake-up of the wait): the
    /// clients of a flood may all be gone by then, and an idle loop has no turn that
    /// would make it (issue 41).
    pub(super) fn trim(&mut self) {
        let m = &mut self.memory;
        m.peak = m.peak.max(m.buffered);
        m.trim_at = None;
        if m.peak >= TRIM_ABOVE && m.buffered <= m.peak / 4 {
            let due = m.trimmed_at + Duration::from_secs(1);
            if self.reactor.now >= due {
                sys::release_free_memory();
                m.trimmed_at = self.reactor.now;
                m.peak = m.buffered;
            } else {
                m.trim_at = Some(due);
            }
        }
    }

    /// The first time in an episode that the budget stops a read: one line.
    fn budget_reached(&mut self) {
        if self.memory.episode.is_none() {
            self.memory.episode = Some(self.reactor.now);
            tracing::warn!(
                "buffered request bytes reached --max-buffered-bytes {} ({} connections open): pausing the connections that hold the most, refusing new large requests with {}",
                self.cfg.limits.max_buffered,
                self.reactor.conns.len(),
                self.memory.refusal
            );
        }
    }

    /// A request needs more memory than the budget of buffered bytes has (its buffer,
    /// `capacity` bytes, is full): refused if it is only starting (the codec's refusal,
    /// then a lingering close), else paused until the budget has room (what the client
    /// sends stays in the socket, and TCP pushes back on it). `None`: go on now.
    pub(super) fn out_of_budget(
        &mut self,
        c: &mut Connection<'a, H>,
        bufs: &mut Buffers,
        wait: Wait,
        capacity: usize,
    ) -> Option<Pass> {
        self.budget_reached();
        if self.memory.pass_shared || capacity <= SHED_BELOW {
            let mut quiet = Quiet {
                stopping: self.stopping,
                slot: self.cfg.slot,
            };
            let next = c
                .step
                .shed(bufs, &mut quiet, &c.peer, super::super::budget::REFUSAL);
            self.follow(c, Gathered::Step(next));
            return None;
        }
        if !c.paused {
            c.paused = true;
            self.memory.paused.push(self.memory.pass_token);
        }
        c.pending = Pending::Read { wait };
        Some(Pass::Wait)
    }
}

//! The budget of buffered bytes (`--max-buffered-bytes`): what a worker's connections may
//! hold of requests that have not finished arriving, shared by the drivers that hold many
//! connections at once (the event loop and the async driver).
//!
//! At the budget a buffer does not grow. A connection with nothing buffered still reads a
//! request head's worth ([`OVER_BUDGET_READ`]), so small requests are served whole; one
//! that needs more is refused if it is only starting (its buffer at most [`SHED_BELOW`]:
//! the codec's refusal, HTTP 503 with `Retry-After`), else paused: it stops reading (TCP
//! pushes back on its client) until the budget has room again, or its deadline cuts it.
//! The first stop of an episode is logged, and so is its end.

use std::time::{Duration, Instant};

use crate::conn::buffers::Buffers;

/// Over the budget, what a connection with nothing buffered may still read: a request head
/// of this size is still served whole, and the budget's overshoot is at most this much per
/// connection (a documented margin).
pub(crate) const OVER_BUDGET_READ: usize = 4 * 1024;

/// Over the budget, a connection whose buffer is at most this large and full is refused
/// (the codec's refusal: HTTP 503 with `Retry-After`) rather than given more memory: it is
/// starting a large request. A larger one is paused: it is well into its request, and
/// resumes when the budget has room (or its deadline cuts it).
pub(crate) const SHED_BELOW: usize = crate::conn::buffers::BUFFER_SIZE;

/// A peak of buffered bytes after which the worker gives freed memory back to the system
/// once the buffers are freed ([`Budget::freed`]).
pub(crate) const TRIM_ABOVE: usize = 4 << 20;

/// Why a request is refused at the budget: the reason in the codec's refusal.
pub(crate) const REFUSAL: &str = "the server holds too many unfinished requests; try again later";

/// How the codec refuses a request at the budget, for the log: the first line of its
/// refusal (`HTTP/1.1 503 Service Unavailable`, RESP's `-ERR refused: …`), its bytes
/// escaped, at most 100 of them; "a close" if it has none. Asked of a codec of its own, as
/// encoding an error resets a codec's state (issue 41: the line said "HTTP 503" on a RESP
/// server).
pub(crate) fn refusal_words<C: crate::codec::Codec>(mut codec: C) -> String {
    let mut out = Vec::new();
    codec.encode_error(&crate::codec::ProtocolError::Refused(REFUSAL.into()), &mut out);
    let line = out.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return "a close".to_owned();
    }
    let mut words = line[..line.len().min(100)].escape_ascii().to_string();
    if line.len() > 100 {
        words.push('…');
    }
    format!("\"{words}\"")
}

/// One worker's count of buffered bytes against `--max-buffered-bytes`.
#[derive(Debug)]
pub(crate) struct Budget {
    /// `--max-buffered-bytes` (0: no budget).
    max: usize,
    /// What the connections' buffers hold now.
    held: usize,
    /// The episode at the budget, for one log line at each end.
    episode: Option<Instant>,
    /// The highest `held` since the last trim.
    peak: usize,
    trimmed_at: Option<Instant>,
    /// How the codec refuses, for the episode's line ([`refusal_words`]).
    refusal: String,
}

impl Budget {
    /// A budget of `max` bytes (0: none) for connections whose codec refuses with
    /// `refusal` ([`refusal_words`]).
    pub(crate) fn new(max: usize, refusal: String) -> Self {
        Budget {
            max,
            held: 0,
            episode: None,
            peak: 0,
            trimmed_at: None,
            refusal,
        }
    }

    /// A connection's buffers went from `was` to `now` bytes.
    pub(crate) fn moved(&mut self, was: usize, now: usize) {
        self.held = (self.held + now).saturating_sub(was);
        self.peak = self.peak.max(self.held);
    }

    /// Whether the buffers hold the budget.
    pub(crate) fn over(&self) -> bool {
        self.max > 0 && self.held >= self.max
    }

    /// Whether connections paused at the budget may read again: an eighth of it is free,
    /// so that they do not pause again at their first read.
    pub(crate) fn has_room(&self) -> bool {
        self.max == 0 || self.held.saturating_add(self.max / 8) <= self.max
    }

    /// How many bytes a read may bring into `bufs` (at most `room`): all of `room` under
    /// the budget; over it, a request head's worth into empty buffers, else what their
    /// read buffer has free without growing. `None`: nothing, the request must wait or
    /// be refused ([`Budget::stopped`]).
    pub(crate) fn read_room(&self, bufs: &Buffers, room: usize) -> Option<usize> {
        if !self.over() {
            return Some(room);
        }
        let pending = bufs.unconsumed().len();
        let free = if pending == 0 {
            OVER_BUDGET_READ
        } else {
            bufs.input_capacity().saturating_sub(pending)
        };
        let take = free.min(room);
        (take > 0).then_some(take)
    }

    /// A read was stopped by the budget at `now`, `open` connections being open: logs the
    /// first of an episode.
    pub(crate) fn stopped(&mut self, now: Instant, open: usize) {
        if self.episode.is_none() {
            self.episode = Some(now);
            tracing::warn!(
                "buffered request bytes reached --max-buffered-bytes {} ({open} connections open): pausing the connections that hold the most, refusing new large requests with {}",
                self.max,
                self.refusal,
            );
        }
    }

    /// Whether a connection whose read buffer holds `capacity` bytes is refused, rather
    /// than paused, when the budget stops its read.
    pub(crate) fn refuses(capacity: usize) -> bool {
        capacity <= SHED_BELOW
    }

    /// The paused connections read again at `now` (`paused` of them): ends the episode,
    /// with its line.
    pub(crate) fn resumed(&mut self, now: Instant, paused: usize) {
        if let Some(since) = self.episode.take() {
            tracing::info!(
                "buffered request bytes under --max-buffered-bytes {} again after {:.1?}: {paused} paused connection(s) read again",
                self.max,
                now.saturating_duration_since(since),
            );
        }
    }

    /// Whether to give memory back to the system now: what the buffers hold has fallen to
    /// a quarter of a peak of at least [`TRIM_ABOVE`], and the last trim is a second old.
    /// Freed buffers otherwise stay in the allocator's free lists (below its mmap
    /// threshold) and the worker keeps memory it no longer uses.
    /// (`now` is read only then: a connection's end costs no clock read.)
    pub(crate) fn freed(&mut self, now: impl FnOnce() -> Instant) -> bool {
        if self.peak < TRIM_ABOVE || self.held > self.peak / 4 {
            return false;
        }
        let now = now();
        if self
            .trimmed_at
            .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1))
        {
            return false;
        }
        self.trimmed_at = Some(now);
        self.peak = self.held;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_the_budget_a_read_takes_its_room() {
        let b = Budget::new(1000, String::new());
        assert_eq!(b.read_room(&Buffers::none(), 16_384), Some(16_384));
        let none = Budget::new(0, String::new());
        assert!(!none.over() && none.has_room());
    }

    #[test]
    fn over_the_budget_empty_buffers_read_a_head_and_full_ones_nothing() {
        let mut b = Budget::new(1000, String::new());
        b.moved(0, 1000);
        assert!(b.over());
        assert_eq!(b.read_room(&Buffers::none(), 16_384), Some(OVER_BUDGET_READ));
        assert_eq!(b.read_room(&Buffers::none(), 100), Some(100));
        let mut full = Buffers::none();
        full.extend_input(b"partial request");
        assert_eq!(b.read_room(&full, 16_384), None, "a full buffer does not grow");
        assert!(Budget::refuses(full.input_capacity()));
        assert!(!Budget::refuses(SHED_BELOW + 1));
    }

    #[test]
    fn paused_connections_resume_when_an_eighth_is_free() {
        let mut b = Budget::new(800, String::new());
        b.moved(0, 800);
        assert!(!b.has_room());
        b.moved(800, 701);
        assert!(!b.has_room());
        b.moved(701, 700);
        assert!(b.has_room());
        assert!(!b.over());
    }

    #[test]
    fn memory_is_given_back_once_a_large_peak_falls_to_a_quarter_at_most_once_a_second() {
        let mut b = Budget::new(0, String::new());
        let t = Instant::now();
        b.moved(0, TRIM_ABOVE);
        assert!(!b.freed(|| t), "not while the peak is held");
        b.moved(TRIM_ABOVE, TRIM_ABOVE / 4);
        assert!(b.freed(|| t));
        b.moved(TRIM_ABOVE / 4, TRIM_ABOVE);
        b.moved(TRIM_ABOVE, 0);
        assert!(!b.freed(|| t + Duration::from_millis(500)), "once a second");
        assert!(b.freed(|| t + Duration::from_secs(1)));
        b.moved(0, 1000);
        b.moved(1000, 0);
        assert!(
            !b.freed(|| t + Duration::from_secs(5)),
            "a small peak is not worth a trim"
        );
    }

    /// Issue 41: the budget's log line names the codec's own refusal.
    #[test]
    fn issue_41_the_refusal_is_in_the_codecs_words() {
        use crate::codec::{Http, LengthPrefixed, Lines, Resp};
        assert_eq!(
            refusal_words(Http::default()),
            "\"HTTP/1.1 503 Service Unavailable\""
        );
        assert_eq!(refusal_words(Resp::new()), format!("\"-ERR refused: {REFUSAL}\""));
        assert_eq!(
            refusal_words(Lines::default()),
            format!("\"-ERR refused: {REFUSAL}\"")
        );
        let length = refusal_words(LengthPrefixed::default());
        assert!(length.starts_with("\"\\x00\\x00\\x00"), "{length}");
        assert!(length.contains("ERR refused: the server holds"), "{length}");
    }
}

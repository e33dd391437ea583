//! A connection's two buffers: what was received and not yet consumed, and the output
//! not yet sent. No I/O here: the transport fills and drains them, the request step
//! decodes from one and encodes into the other.

/// Size of each connection's read buffer and of its write buffer.
pub(crate) const BUFFER_SIZE: usize = 16 * 1024;

/// The smallest read buffer that [`Buffers::room`] grows to.
const MIN_GROWTH: usize = 2048;

/// A connection's read and write buffers.
///
/// The blocking driver lends one pair to each connection in turn (a worker serves one at a
/// time), so that serving a connection allocates nothing; an event loop gives each
/// connection its own.
#[derive(Debug)]
pub(crate) struct Buffers {
    /// The read buffer; bytes `start..end` are received and not yet consumed.
    pub(super) read: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// Output not yet sent.
    pub(super) write: Vec<u8>,
}

impl Buffers {
    pub(crate) fn new() -> Self {
        Buffers {
            read: vec![0; BUFFER_SIZE],
            start: 0,
            end: 0,
            write: Vec::with_capacity(BUFFER_SIZE),
        }
    }

    /// Buffers without memory: a placeholder while the real ones are lent out for a call
    /// that also borrows their owner.
    pub(crate) const fn none() -> Self {
        Buffers {
            read: Vec::new(),
            start: 0,
            end: 0,
            write: Vec::new(),
        }
    }

    /// The read buffer's size: the memory it holds for a request, whatever part of it is
    /// filled (the event loop's budget of buffered bytes counts this).
    pub(crate) fn input_capacity(&self) -> usize {
        self.read.len()
    }

    /// The memory both buffers hold (their capacities).
    pub(crate) fn held(&self) -> usize {
        self.read.capacity() + self.write.capacity()
    }

    /// Whether received bytes wait to be consumed.
    pub(crate) fn has_input(&self) -> bool {
        self.end > self.start
    }

    /// The received bytes not yet consumed.
    pub(crate) fn unconsumed(&self) -> &[u8] {
        &self.read[self.start..self.end]
    }

    /// Marks `n` received bytes as consumed.
    pub(crate) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
    }

    /// Forgets every received byte not yet consumed.
    pub(crate) fn discard_input(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// The unconsumed input and the output buffer, together.
    pub(crate) fn split(&mut self) -> (&mut [u8], &mut Vec<u8>) {
        (&mut self.read[self.start..self.end], &mut self.write)
    }

    /// The output buffer.
    pub(crate) fn output(&mut self) -> &mut Vec<u8> {
        &mut self.write
    }

    /// Room to receive more bytes after the unconsumed ones, which move to the front; the
    /// buffer grows (doubling) up to `max` bytes. Empty when it holds `max` bytes already.
    pub(crate) fn room(&mut self, max: usize) -> &mut [u8] {
        if self.start == self.end {
            // Everything was consumed (the usual case between requests): nothing to move.
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 {
            self.read.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.read.len() && self.read.len() < max {
            // An event loop's private buffers start at the size of what they keep; they
            // grow from a small size, so that many slow clients cost little memory each.
            let grown = (self.read.len() * 2).clamp(MIN_GROWTH.min(max), max);
            self.read.resize(grown, 0);
        }
        &mut self.read[self.end..]
    }

    /// Appends `bytes` to the input (hybrid mode: what a front read of the request).
    pub(crate) fn extend_input(&mut self, bytes: &[u8]) {
        let _ = self.room(0); // moves the unconsumed bytes to the front
        let end = self.end + bytes.len();
        if self.read.len() < end {
            self.read.resize(end, 0);
        }
        self.read[self.end..end].copy_from_slice(bytes);
        self.end = end;
    }

    /// `n` bytes were received into [`room`](Buffers::room).
    pub(crate) fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.read.len());
    }

    /// Whether nothing waits in either buffer.
    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end && self.write.is_empty()
    }

    /// For an event loop's worker-wide buffers: moves what is left in them (a partial
    /// request, output not sent yet) into new buffers of that size, which the connection
    /// keeps until they are empty again; these are left empty for the next connection.
    pub(crate) fn take_leftover(&mut self) -> Buffers {
        // Small output is copied (exactly its size: a slow reader costs what it has not
        // read); large output is moved, and the worker-wide buffer starts anew.
        let write = if self.write.len() <= BUFFER_SIZE {
            let copy = self.write.clone();
            self.write.clear();
            copy
        } else {
            std::mem::replace(&mut self.write, Vec::with_capacity(BUFFER_SIZE))
        };
        let kept = Buffers {
            read: self.read[self.start..self.end].to_vec(),
            start: 0,
            end: self.end - self.start,
            write,
        };
        self.start = 0;
        self.end = 0;
        if self.read.len() > 4 * BUFFER_SIZE {
            self.read = vec![0; BUFFER_SIZE];
        }
        kept
    }

    /// The output not sent yet, from its front (for a driver that writes it itself).
    pub(crate) fn pending_output(&self) -> &[u8] {
        &self.write
    }

    /// `n` bytes of the output were sent.
    pub(crate) fn output_written(&mut self, n: usize) {
        if n >= self.write.len() {
            self.write.clear();
        } else {
            self.write.drain(..n);
        }
    }

    /// Whole read buffer for one receive, emptied first (for `handle_client`'s buffered
    /// reads: if the receive fails, consumed bytes must not come back).
    pub(crate) fn refill_space(&mut self) -> &mut [u8] {
        self.start = 0;
        self.end = 0;
        &mut self.read
    }

    /// Ready for the next connection: empty, and back to the normal size if a large
    /// request made them grow, so that one large request does not pin its memory in the
    /// worker for good.
    pub(crate) fn reset(&mut self) {
        self.start = 0;
        self.end = 0;
        self.write.clear();
        if self.read.len() > 4 * BUFFER_SIZE {
            self.read = vec![0; BUFFER_SIZE];
        }
        if self.write.capacity() > 4 * BUFFER_SIZE {
            self.write = Vec::with_capacity(BUFFER_SIZE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_moves_unconsumed_bytes_to_the_front_and_grows_up_to_the_limit() {
        let mut b = Buffers::new();
        let n = b.room(usize::MAX).len();
        assert_eq!(n, BUFFER_SIZE);
        b.room(usize::MAX)[..5].copy_from_slice(b"hello");
        b.filled(5);
        b.consume(2);
        assert_eq!(b.unconsumed(), b"llo");
        let room = b.room(usize::MAX).len();
        assert_eq!(room, BUFFER_SIZE - 3, "the consumed bytes' room is reclaimed");
        assert_eq!(b.unconsumed(), b"llo");
        let fill = b.room(BUFFER_SIZE + 10).len();
        b.filled(fill);
        assert_eq!(
            b.room(BUFFER_SIZE + 10).len(),
            10,
            "grown to the limit, no further"
        );
        b.filled(10);
        assert!(b.room(BUFFER_SIZE + 10).is_empty());
        b.reset();
        assert!(b.unconsumed().is_empty());
    }
}

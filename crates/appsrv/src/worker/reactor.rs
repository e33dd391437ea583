//! The event loop's reactor, apart from the loop (the way Redis's `ae.c` stands apart
//! from `networking.c`): what an epoll registration carries ([`Token`]: a tag, an index
//! and a generation, encoded and decoded here only), the connection slab that owns the
//! generations ([`Slab`]), the timers ([`Timers`], with lazy cancellation through each
//! connection's [`Timer`]) and the ready list ([`Ready`], with its per-turn snapshot). None of it
//! knows what a connection is, and none of it makes a system call but the registration
//! helpers ([`watch`], [`rewatch`]); `worker/event/` drives them, and the other sources it
//! serves ([`Source`]: the datagram side) register with them.
//!
//! Nothing here allocates per event: the slab reuses its places, the heap and the queue
//! keep their capacity, a token is a `u64`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::os::fd::BorrowedFd;
use std::time::Instant;

use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};

/// A source of readiness the loop serves beside its connections and listeners (the
/// datagram side): it registers its own descriptors, with tokens of [`Kind::Datagram`],
/// and is called on their readiness with the loop's context `Cx` (its accounts).
pub(crate) trait Source<Cx> {
    /// What it registered with index `index` is readable.
    fn ready(&mut self, index: usize, cx: &mut Cx);
    /// Once a turn, before the wait: publish what it counted.
    fn publish(&mut self);
    /// A stop begins: a last read of what it holds, then out of `epoll`.
    fn stop(&mut self, epoll: &Epoll, cx: &mut Cx);
    /// The loop ends.
    fn exit(&mut self);
}

/// What an epoll registration carries: a connection's place in the [`Slab`] and its
/// generation, or a tagged listener, datagram listener or the hand-off channel.
///
/// The encoding, in one place: bit 63 set marks a non-connection (a listener, with its
/// index in the low bits); bit 62 with it a datagram listener; bit 61 with it the
/// hand-off channel. A connection has bit 63 clear, its generation in bits 32..62 (30
/// bits, so that the tags never collide) and its index in the low 32 bits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub(crate) struct Token(u64);

/// What a [`Token`] names.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// A connection in the slab (look it up with [`Slab::get_mut`]).
    Connection,
    /// A stream listener, by index.
    Listener(usize),
    /// A datagram listener, by index.
    Datagram(usize),
    /// The hybrid front's hand-off channel.
    Channel,
}

const LISTENER: u64 = 1 << 63;
const DATAGRAM: u64 = LISTENER | 1 << 62;
const CHANNEL: u64 = LISTENER | 1 << 61;
/// A generation's bits: 30, below the tags.
const GENERATION_MASK: u32 = 0x3fff_ffff;

impl Token {
    /// The hand-off channel's token.
    pub(crate) const CHANNEL: Token = Token(CHANNEL);

    /// The token of stream listener `index`.
    pub(crate) fn listener(index: usize) -> Token {
        Token(LISTENER | index as u64)
    }

    /// The token of datagram listener `index`.
    pub(crate) fn datagram(index: usize) -> Token {
        Token(DATAGRAM | index as u64)
    }

    /// The token of the connection at place `index` in its `generation` (30 bits: the
    /// slab keeps it so).
    fn connection(index: usize, generation: u32) -> Token {
        debug_assert!(generation <= GENERATION_MASK && index <= u32::MAX as usize);
        Token((u64::from(generation) << 32) | index as u64)
    }

    /// The token an event carries (`EpollEvent::data`).
    pub(crate) fn from_data(data: u64) -> Token {
        Token(data)
    }

    /// What epoll carries for it.
    pub(crate) fn data(self) -> u64 {
        self.0
    }

    /// What it names. The tests are ordered as they were in the loop: the connection bit
    /// first (the common case), then the channel, then a datagram listener.
    pub(crate) fn kind(self) -> Kind {
        if self.0 & LISTENER == 0 {
            Kind::Connection
        } else if self.0 == CHANNEL {
            Kind::Channel
        } else if self.0 & DATAGRAM == DATAGRAM {
            Kind::Datagram((self.0 & !DATAGRAM) as usize)
        } else {
            Kind::Listener((self.0 & !LISTENER) as usize)
        }
    }

    /// A connection's place in the slab.
    fn index(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }

    /// A connection's generation.
    fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// Registers `fd` with `epoll` for `flags`, carrying `token`.
pub(crate) fn watch(epoll: &Epoll, fd: BorrowedFd<'_>, flags: EpollFlags, token: Token) -> nix::Result<()> {
    epoll.add(fd, EpollEvent::new(flags, token.data()))
}

/// Changes the registration of `fd` to `flags`, carrying `token`.
pub(crate) fn rewatch(epoll: &Epoll, fd: BorrowedFd<'_>, flags: EpollFlags, token: Token) -> nix::Result<()> {
    let mut ev = EpollEvent::new(flags, token.data());
    epoll.modify(fd, &mut ev)
}

/// One place of the slab: its current generation (kept when empty, so that a token of
/// the connection that left it finds nothing) and what it holds.
struct Entry<T> {
    generation: u32,
    value: Option<T>,
}

/// The connections by place, each named by a [`Token`] that names it only: a place is
/// reused, but under a new generation, so a stale token (an old event, an old timer, an
/// old ready-list entry) finds nothing.
///
/// A place is in one of three states: free (on the free list), held (`get_mut` finds its
/// value), or lent ([`Slab::take`]n out for a pass that also borrows the loop; `get_mut`
/// finds nothing, the place stays reserved) until it is [`Slab::put_back`] or
/// [`Slab::release`]d.
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Vec<usize>,
    /// The last generation given (a token names one connection, never a later one in
    /// the same place); wraps within 30 bits.
    generation: u32,
}

impl<T> Slab<T> {
    /// An empty slab.
    pub(crate) fn new() -> Self {
        Slab {
            entries: Vec::new(),
            free: Vec::new(),
            generation: 0,
        }
    }

    /// Places `value` (in a freed place if there is one) under a new generation; its token.
    pub(crate) fn insert(&mut self, value: T) -> Token {
        self.generation = self.generation.wrapping_add(1) & GENERATION_MASK;
        let generation = self.generation;
        let index = match self.free.pop() {
            Some(i) => {
                let e = &mut self.entries[i];
                e.generation = generation;
                e.value = Some(value);
                i
            }
            None => {
                self.entries.push(Entry {
                    generation,
                    value: Some(value),
                });
                self.entries.len() - 1
            }
        };
        Token::connection(index, generation)
    }

    /// The value `token` names, if it is held (not lent, not since replaced).
    pub(crate) fn get_mut(&mut self, token: Token) -> Option<&mut T> {
        self.entries
            .get_mut(token.index())
            .filter(|e| e.generation == token.generation())?
            .value
            .as_mut()
    }

    /// Lends the value out (for a pass that borrows the owner too): its place stays
    /// reserved until [`Slab::put_back`] or [`Slab::release`].
    pub(crate) fn take(&mut self, token: Token) -> Option<T> {
        self.entries
            .get_mut(token.index())
            .filter(|e| e.generation == token.generation())?
            .value
            .take()
    }

    /// Puts a value lent by [`Slab::take`] back into its place.
    pub(crate) fn put_back(&mut self, token: Token, value: T) {
        let e = &mut self.entries[token.index()];
        debug_assert!(e.generation == token.generation() && e.value.is_none());
        e.value = Some(value);
    }

    /// Frees the place of a value lent by [`Slab::take`] (it is gone: closed, handed
    /// off); `token` finds nothing from now on.
    pub(crate) fn release(&mut self, token: Token) {
        let e = &mut self.entries[token.index()];
        debug_assert!(e.generation == token.generation() && e.value.is_none());
        e.value = None;
        self.free.push(token.index());
    }

    /// How many places are taken (held or lent): the connections open.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// Whether no place is taken.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values held, with their tokens.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (Token, &mut T)> {
        self.entries.iter_mut().enumerate().filter_map(|(i, e)| {
            let generation = e.generation;
            e.value.as_mut().map(|v| (Token::connection(i, generation), v))
        })
    }
}

/// A connection's timer (kept in the connection): its one deadline, which the loop sets
/// as it likes (`None`: no deadline, which also cancels), and the one heap entry of
/// [`Timers`] that counts. Entries that do not match it are stale (re-armed earlier
/// since, or fired) and are skipped when they come due, rather than searched for in the
/// heap.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Timer {
    /// When the connection's wait ends. Moving it later costs nothing (the entry, when
    /// it comes due, is pushed again for it); moving it earlier needs a [`Timers::arm`].
    pub(crate) deadline: Option<Instant>,
    armed: Option<Instant>,
}

/// The timers: a min-heap of (due, token), no `timerfd` (the wait's timeout is the
/// earliest entry). Cancelling is lazy: an entry whose token finds nothing (the
/// connection is gone), whose [`Timer`] is armed for another time or has no deadline any
/// more is skipped when it comes due.
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, Token)>>,
}

impl Timers {
    /// No timers.
    pub(crate) fn new() -> Self {
        Timers {
            heap: BinaryHeap::new(),
        }
    }

    /// Arms `timer` for its deadline unless it is armed for that or earlier already (an
    /// earlier entry, when it comes due, is pushed again for the deadline then).
    pub(crate) fn arm(&mut self, timer: &mut Timer, token: Token) {
        if let Some(d) = timer.deadline {
            if timer.armed.is_none_or(|a| a > d) {
                timer.armed = Some(d);
                self.heap.push(Reverse((d, token)));
            }
        }
    }

    /// The earliest entry's time (stale or not: a stale one costs one early wake-up).
    pub(crate) fn earliest(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    /// The earliest entry due at `now` or before, taken out, in order of time. The
    /// caller looks its token up (skipping it if it finds nothing) and asks
    /// [`Timers::expired`].
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(Instant, Token)> {
        let Reverse((t, token)) = *self.heap.peek()?;
        if t > now {
            return None;
        }
        self.heap.pop();
        Some((t, token))
    }

    /// Whether the entry `(at, token)` that came due at `now` ends `timer`'s wait (its
    /// deadline is then cleared). No when the entry is stale, when the timer has no
    /// deadline any more, or when the deadline was moved later (it is armed again for it).
    pub(crate) fn expired(&mut self, timer: &mut Timer, token: Token, at: Instant, now: Instant) -> bool {
        if timer.armed != Some(at) {
            return false; // a stale entry: a newer, earlier one was pushed
        }
        timer.armed = None;
        match timer.deadline {
            None => false,
            Some(d) if d > now => {
                self.arm(timer, token);
                false
            }
            Some(_) => {
                timer.deadline = None;
                true
            }
        }
    }
}

/// Whether a connection is on the [`Ready`] list (kept in the connection, so that it is
/// pushed once however many times it becomes ready).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Queued(bool);

impl Queued {
    /// Whether it is on the list.
    pub(crate) fn is_set(self) -> bool {
        self.0
    }
}

/// The connections that can go on without waiting for an edge (input left in their
/// buffers, a pass cut short for fairness, a resume, a drain). Each turn runs the list as
/// it stood when the turn began ([`Ready::snapshot`]): one queued during the turn runs in
/// the next, after the wait (which then does not block), so that no connection runs
/// twice in a turn while the others' events wait.
pub(crate) struct Ready {
    queue: VecDeque<Token>,
}

/// How many entries of the [`Ready`] list this turn runs.
pub(crate) struct Snapshot(usize);

impl Ready {
    /// An empty list.
    pub(crate) fn new() -> Self {
        Ready {
            queue: VecDeque::new(),
        }
    }

    /// Queues `token` unless `queued` says it is on the list already.
    pub(crate) fn push(&mut self, queued: &mut Queued, token: Token) {
        if !queued.0 {
            queued.0 = true;
            self.queue.push_back(token);
        }
    }

    /// Whether nothing is queued (the wait may block).
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The list as it stands at the beginning of a turn.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot(self.queue.len())
    }

    /// The next token of this turn's `snapshot`, or `None` when it is done. The caller
    /// looks it up and, if found, [`Ready::done`]s its `Queued` before running it.
    pub(crate) fn next(&mut self, snapshot: &mut Snapshot) -> Option<Token> {
        if snapshot.0 == 0 {
            return None;
        }
        snapshot.0 -= 1;
        self.queue.pop_front()
    }

    /// Off the list: it may be pushed again (during its run, for the next turn).
    pub(crate) fn done(queued: &mut Queued) {
        queued.0 = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A connection closed: taken out for its last pass, its place freed (as the loop
    /// does it).
    fn remove<T>(slab: &mut Slab<T>, token: Token) -> Option<T> {
        let value = slab.take(token)?;
        slab.release(token);
        Some(value)
    }

    #[test]
    fn tokens_round_trip_and_keep_their_tags_apart() {
        for i in [0, 1, 7, 1 << 20] {
            assert_eq!(Token::listener(i).kind(), Kind::Listener(i));
            assert_eq!(Token::datagram(i).kind(), Kind::Datagram(i));
            let t = Token::from_data(Token::listener(i).data());
            assert_eq!(t, Token::listener(i));
        }
        assert_eq!(Token::CHANNEL.kind(), Kind::Channel);
        // Every generation the slab gives, at any index, decodes as a connection with
        // both halves intact (the top generations set bit 61 too: still a connection).
        for (index, generation) in [(0, 1), (5, GENERATION_MASK), (u32::MAX as usize, 1 << 29)] {
            let t = Token::from_data(Token::connection(index, generation).data());
            assert_eq!(t.kind(), Kind::Connection);
            assert_eq!((t.index(), t.generation()), (index, generation));
        }
    }

    #[test]
    fn a_stale_token_finds_nothing_after_its_place_is_reused() {
        let mut slab = Slab::new();
        let a = slab.insert("a");
        assert_eq!(slab.get_mut(a), Some(&mut "a"));
        assert_eq!(remove(&mut slab, a), Some("a"));
        assert_eq!(slab.get_mut(a), None);
        let b = slab.insert("b");
        assert_eq!(b.index(), a.index(), "the place is reused");
        assert_ne!(a, b);
        assert_eq!(
            slab.get_mut(a),
            None,
            "the old token names the old connection only"
        );
        assert_eq!(slab.take(a), None);
        assert_eq!(slab.get_mut(b), Some(&mut "b"));
    }

    #[test]
    fn a_lent_value_keeps_its_place_until_put_back_or_released() {
        let mut slab = Slab::new();
        let a = slab.insert(1);
        let v = slab.take(a).expect("held");
        assert_eq!(slab.get_mut(a), None, "lent: not found while its pass runs");
        assert_eq!(slab.len(), 1, "a lent value is still open");
        let b = slab.insert(2);
        assert_ne!(a.index(), b.index(), "a lent place is not reused");
        slab.put_back(a, v);
        assert_eq!(slab.get_mut(a), Some(&mut 1));
        assert_eq!(
            slab.iter_mut().map(|(t, v)| (t, *v)).collect::<Vec<_>>(),
            vec![(a, 1), (b, 2)]
        );
        let _ = slab.take(a);
        slab.release(a);
        assert_eq!(slab.iter_mut().count(), 1);
        assert_eq!(slab.len(), 1);
        let c = slab.insert(3);
        assert_eq!(c.index(), a.index());
        assert_eq!(slab.get_mut(a), None);
    }

    #[test]
    fn the_generation_wraps_within_its_bits() {
        let mut slab = Slab::new();
        slab.generation = GENERATION_MASK;
        let t = slab.insert(());
        assert_eq!(t.kind(), Kind::Connection);
        assert_eq!(t.generation(), 0);
    }

    /// The loop's way: every due entry looked up, asked, and the expired ones collected.
    fn expire(timers: &mut Timers, slab: &mut Slab<Timer>, now: Instant) -> Vec<Token> {
        let mut fired = Vec::new();
        while let Some((at, token)) = timers.pop_due(now) {
            let Some(timer) = slab.get_mut(token) else {
                continue;
            };
            if timers.expired(timer, token, at, now) {
                fired.push(token);
            }
        }
        fired
    }

    #[test]
    fn timers_fire_in_order_and_skip_what_was_re_armed_cancelled_or_removed() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut slab = Slab::new();
        let mut timers = Timers::new();
        let mut add = |slab: &mut Slab<Timer>, ms| {
            let token = slab.insert(Timer {
                deadline: Some(at(ms)),
                armed: None,
            });
            timers.arm(slab.get_mut(token).unwrap(), token);
            token
        };
        let a = add(&mut slab, 30);
        let b = add(&mut slab, 10);
        let c = add(&mut slab, 20);
        let d = add(&mut slab, 25);
        let e = add(&mut slab, 15);
        // Earlier: armed again, the entry at 30 is stale from now on.
        slab.get_mut(a).unwrap().deadline = Some(at(5));
        timers.arm(slab.get_mut(a).unwrap(), a);
        // Later: only the field changes; the entry at 10 comes due and is pushed again.
        slab.get_mut(b).unwrap().deadline = Some(at(40));
        timers.arm(slab.get_mut(b).unwrap(), b);
        // Gone: its entry finds nothing.
        let _ = slab.take(c);
        slab.release(c);
        // Cancelled: no deadline.
        slab.get_mut(d).unwrap().deadline = None;
        assert_eq!(timers.earliest(), Some(at(5)));
        assert_eq!(timers.pop_due(at(4)), None, "nothing due yet");
        assert_eq!(expire(&mut timers, &mut slab, at(35)), vec![a, e]);
        assert_eq!(
            slab.get_mut(a).unwrap().deadline,
            None,
            "an expired deadline is cleared"
        );
        assert_eq!(timers.earliest(), Some(at(40)), "the moved deadline, armed again");
        assert_eq!(expire(&mut timers, &mut slab, at(40)), vec![b]);
        assert_eq!(timers.earliest(), None);
        // Expired, so disarmed: the next deadline is armed whatever its time.
        slab.get_mut(b).unwrap().deadline = Some(at(100));
        timers.arm(slab.get_mut(b).unwrap(), b);
        assert_eq!(timers.earliest(), Some(at(100)));
        // A stale entry is dropped, not pushed again: armed for 60, then for 50, which
        // expires; the next wait's deadline (70) arms anew, and the entry at 60 is stale.
        let f = slab.insert(Timer::default());
        for ms in [60, 50] {
            slab.get_mut(f).unwrap().deadline = Some(at(ms));
            timers.arm(slab.get_mut(f).unwrap(), f);
        }
        assert_eq!(expire(&mut timers, &mut slab, at(55)), vec![f]);
        slab.get_mut(f).unwrap().deadline = Some(at(70));
        timers.arm(slab.get_mut(f).unwrap(), f);
        assert_eq!(expire(&mut timers, &mut slab, at(65)), vec![]);
        assert_eq!(timers.heap.len(), 2, "b's entry at 100 and f's at 70, once");
        assert_eq!(expire(&mut timers, &mut slab, at(70)), vec![f]);
    }

    /// A connection queued again during its run goes to the next turn: each runs once
    /// per turn, in the order queued.
    #[test]
    fn the_ready_list_runs_each_connection_once_a_turn() {
        let mut slab = Slab::new();
        let mut ready = Ready::new();
        let a = slab.insert(Queued::default());
        let b = slab.insert(Queued::default());
        ready.push(slab.get_mut(a).unwrap(), a);
        ready.push(slab.get_mut(b).unwrap(), b);
        ready.push(slab.get_mut(a).unwrap(), a); // once while queued
        let turn = |ready: &mut Ready, slab: &mut Slab<Queued>| {
            let mut ran = Vec::new();
            let mut snapshot = ready.snapshot();
            while let Some(token) = ready.next(&mut snapshot) {
                let Some(q) = slab.get_mut(token) else { continue };
                Ready::done(q);
                ran.push(token);
                // Still has work: back on the list during its run.
                ready.push(slab.get_mut(token).unwrap(), token);
            }
            ran
        };
        assert_eq!(turn(&mut ready, &mut slab), vec![a, b]);
        assert!(!ready.is_empty(), "both queued for the next turn");
        // One closed meanwhile: its entry is skipped.
        remove(&mut slab, b);
        assert_eq!(turn(&mut ready, &mut slab), vec![a]);
        assert_eq!(turn(&mut ready, &mut slab), vec![a]);
    }
}

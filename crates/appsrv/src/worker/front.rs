//! A hybrid front's side of its event loop (`--io hybrid`): the hand-off channel, the
//! complete requests held while the channel is full, and the connections workers hand
//! back.
//!
//! The loop itself is the event loop of `event/` with its `HandOff` completion (accepting, admission, reading, every
//! deadline), whose request step, in a front, only tells whether a request is whole
//! ([`Requests::complete`](crate::conn::step::Requests::complete)); then the connection
//! leaves the loop for a worker (`net/handoff.rs`) with the whole request, however large
//! (a large one spooled), so that no worker waits on a client for its bytes. A worker
//! that began to read a request itself and did not get it whole at once hands the
//! connection back with those bytes, which the front gathers on from. See
//! docs/ARCHITECTURE.md, "Hybrid mode".

use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::epoll::EpollFlags;
use socket2::Socket;

use crate::net::handoff::{self, Inbox, Meta};
use crate::peer_counts::PeerCounts;
use crate::scoreboard::Board;

/// A complete request held while the channel is full.
#[derive(Debug)]
struct Held {
    meta: Meta,
    bytes: Vec<u8>,
    /// The client's address as counted for `--max-conns-per-ip`.
    counted: Option<IpAddr>,
    /// A copy of the connection's descriptor (the loop closes its own).
    socket: Socket,
}

/// A front's hand-off state.
#[derive(Debug)]
pub(crate) struct Front<'a> {
    id: u32,
    /// The fronts' end of the channel, the master's, which outlives the worker.
    channel: BorrowedFd<'a>,
    board: &'static Board,
    inbox: Inbox,
    held: VecDeque<Held>,
    /// Where complete requests are decoded (a copy: see `Requests::complete`).
    scratch: Vec<u8>,
    /// The channel said it is full; its next writable edge says there is room.
    full: bool,
    /// The loop watches the channel for room (it does only while `full`).
    watching_room: bool,
    /// `--max-conns-per-ip`: the tables the front counts its clients in, and the
    /// connections handed off that it still counts, with the count of hand-offs sent with
    /// theirs (see [`settle`](Front::settle)).
    peers: Option<&'static PeerCounts>,
    in_transit: VecDeque<(u64, IpAddr)>,
    /// Where the next scan for a lingering worker to wake starts.
    next_wake: usize,
    /// The bytes of the held requests (their copies), and of the spooled hand-offs sent
    /// and not yet taken by a worker (their memfds: shared memory no process maps, so
    /// that no RSS shows it), with the count of hand-offs sent with each. Both count
    /// against the loop's `--max-buffered-bytes`: a request handed off leaves the
    /// connection's buffers, not the front's memory, while the workers are all busy.
    held_bytes: usize,
    spooled: VecDeque<(u64, usize)>,
    spooled_bytes: usize,
}

impl<'a> Front<'a> {
    /// Front `id` on the channel's end `channel`; it takes connections handed back from
    /// now on.
    pub(crate) fn new(
        channel: BorrowedFd<'a>,
        id: u32,
        board: &'static Board,
        peers: Option<&'static PeerCounts>,
    ) -> Front<'a> {
        board.slot(id).map(crate::scoreboard::Slot::set_front);
        board.set_receiving(id, true);
        Front {
            id,
            channel,
            board,
            inbox: Inbox::default(),
            held: VecDeque::new(),
            scratch: Vec::new(),
            full: false,
            watching_room: false,
            peers,
            in_transit: VecDeque::new(),
            next_wake: 0,
            held_bytes: 0,
            spooled: VecDeque::new(),
            spooled_bytes: 0,
        }
    }

    /// A stop begins: connections handed back go to the fronts that stay (a reload's next
    /// generation), or stay with their workers (a stop).
    pub(crate) fn stop_receiving(&self) {
        self.board.set_receiving(self.id, false);
    }

    /// Stops counting the clients of connections the workers have taken. A connection in
    /// the channel is counted by the front that sent it until a worker names its client in
    /// its slot, so that `--max-conns-per-ip` holds while it is in transit: the channel
    /// gives connections out in order, and a worker counts one as taken only once its
    /// slot names the client, so a hand-off is in a worker's slot once the count of those
    /// taken reaches the count of those sent with it. (With several fronts sending at
    /// once, the order of the counts can differ from the channel's by the hand-offs in
    /// flight: the cap may then be passed by as many, for a moment.)
    pub(crate) fn settle(&mut self) {
        let taken = self.board.handoffs_taken();
        while let Some(&(seq, len)) = self.spooled.front() {
            if seq > taken {
                break;
            }
            self.spooled.pop_front();
            self.spooled_bytes -= len;
        }
        while let Some(&(seq, ip)) = self.in_transit.front() {
            if seq > taken {
                break;
            }
            self.in_transit.pop_front();
            if let Some(peers) = self.peers {
                peers.remove(self.id, ip);
            }
        }
    }

    /// A client counted until its connection is taken (see [`settle`](Front::settle)),
    /// and a spooled request's bytes counted until then too.
    fn in_transit(&mut self, seq: u64, counted: Option<IpAddr>, len: usize) {
        if let Some(ip) = counted {
            self.in_transit.push_back((seq, ip));
        }
        if len > handoff::INLINE_MAX {
            self.spooled.push_back((seq, len));
            self.spooled_bytes += len;
        }
    }

    /// The memory of requests handed off but not yet in a worker: held copies, and
    /// spooled hand-offs in the channel (see the fields).
    pub(crate) fn memory(&self) -> usize {
        self.held_bytes + self.spooled_bytes
    }

    /// The channel's end, for the loop's epoll set.
    pub(crate) fn channel(&self) -> BorrowedFd<'a> {
        self.channel
    }

    /// Whether the loop must now start (`Some(true)`) or stop (`Some(false)`) watching the
    /// channel for room: while requests are held for want of it.
    pub(crate) fn room_watch_changed(&mut self) -> Option<bool> {
        let wants = self.full;
        (wants != self.watching_room).then(|| {
            self.watching_room = wants;
            wants
        })
    }

    /// Where the step decodes a copy of the request.
    pub(crate) fn scratch(&mut self) -> &mut Vec<u8> {
        &mut self.scratch
    }

    /// Whether the front holds no request (it may stop).
    pub(crate) fn idle(&self) -> bool {
        self.held.is_empty()
    }

    /// How many complete requests it holds for want of room in the channel (they count
    /// against `--worker-connections`).
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// Hands `conn` to a worker, with what its buffer holds; `counted` is its client's
    /// address as counted for `--max-conns-per-ip`, which stays counted until a worker has
    /// it. When the channel is full the request is held, in order, with a copy of the
    /// descriptor, and sent on the channel's next writable edge (the loop watches for it:
    /// [`room_watch_changed`](Front::room_watch_changed)). The caller closes its copy.
    pub(crate) fn hand_off(&mut self, conn: &Socket, meta: Meta, bytes: &[u8], counted: Option<IpAddr>) {
        if !self.full && self.held.is_empty() {
            match handoff::send(self.channel(), conn.as_fd(), &meta, bytes) {
                Ok(()) => {
                    let seq = self.sent();
                    self.in_transit(seq, counted, bytes.len());
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.full = true,
                Err(e) => {
                    tracing::error!("handing a connection to the workers: {e}; closing it");
                    self.uncount(counted);
                    return;
                }
            }
        }
        match conn.try_clone() {
            Ok(socket) => {
                self.held_bytes += bytes.len();
                self.held.push_back(Held {
                    meta,
                    bytes: bytes.to_vec(),
                    counted,
                    socket,
                });
                self.publish();
            }
            Err(e) => {
                tracing::error!("keeping a connection for the workers: {e}; closing it");
                self.uncount(counted);
            }
        }
    }

    /// A client no longer counted: its connection is closed.
    fn uncount(&self, counted: Option<IpAddr>) {
        if let (Some(ip), Some(peers)) = (counted, self.peers) {
            peers.remove(self.id, ip);
        }
    }

    fn sent(&mut self) -> u64 {
        if let Some(slot) = self.board.slot(self.id) {
            slot.handed_off();
        }
        let seq = self.board.handoff_sent();
        if self.board.idle() == 0 {
            // Every worker is busy or lingers on a quiet connection: one that lingers
            // takes this request now rather than at the end of its linger.
            self.board.wake_lingering(&mut self.next_wake);
        }
        seq
    }

    fn publish(&self) {
        if let Some(slot) = self.board.slot(self.id) {
            slot.publish_queued(self.held.len() as u32);
        }
    }

    /// An edge on the channel: room for what is held (out); connections handed back (in),
    /// given to `take` one by one with the bytes that came with them (the beginning of a
    /// request, or none), unless the front is stopping (`receiving` false: the other
    /// fronts take them).
    pub(crate) fn on_edge(
        &mut self,
        events: EpollFlags,
        receiving: bool,
        take: &mut dyn FnMut(Socket, Meta, &[u8]),
    ) {
        if events.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR) {
            self.full = false;
            self.send_held();
        }
        if receiving && events.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLERR) {
            self.take_back(take);
        }
    }

    fn send_held(&mut self) {
        while let Some(h) = self.held.pop_front() {
            match handoff::send(self.channel(), h.socket.as_fd(), &h.meta, &h.bytes) {
                Ok(()) => {
                    self.held_bytes -= h.bytes.len();
                    let seq = self.sent();
                    self.in_transit(seq, h.counted, h.bytes.len());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.full = true;
                    self.held.push_front(h);
                    break;
                }
                Err(e) => {
                    self.held_bytes -= h.bytes.len();
                    tracing::error!("handing a connection to the workers: {e}; closing it");
                    self.uncount(h.counted);
                }
            }
        }
        self.publish();
    }

    /// A stopping front's last look at the channel: a connection a worker handed back as
    /// the front stopped taking them (it checked that some front takes them, then sent)
    /// goes to a worker again, with the beginning of a request if it came with one: the
    /// worker waits for its next request (or the rest of this one), and keeps it (a stop)
    /// or hands it to the next generation's fronts (a reload). Held if the channel is
    /// full, and sent on its next writable edge.
    pub(crate) fn forward_late(&mut self) {
        if self.board.fronts_receiving() {
            // A reload: the next generation's fronts take them.
            return;
        }
        let mut late = Vec::new();
        self.take_back(&mut |socket, meta, bytes| late.push((socket, meta, bytes.to_vec())));
        for (socket, meta, bytes) in late {
            tracing::debug!("a connection handed back as this front stopped: to a worker again");
            self.hand_off(&socket, meta, &bytes, None);
        }
    }

    /// Takes every connection waiting on the channel for a front (edge-triggered: until
    /// it is empty).
    fn take_back(&mut self, take: &mut dyn FnMut(Socket, Meta, &[u8])) {
        loop {
            match self.inbox.receive(self.channel, false) {
                Ok(Some(r)) => {
                    let (socket, meta, bytes) = r.split(&self.inbox);
                    take(socket, meta, &bytes);
                }
                Ok(None) => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => tracing::warn!("{e}; dropped"),
                Err(e) => {
                    tracing::error!("taking connections back from the workers: {e}");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;

    /// Issue 31's review: a request handed off leaves the connection's buffers but not the
    /// front's memory while the workers are busy: held for room in the channel (a copy),
    /// or spooled in it (a memfd). Both count in `memory` until a worker takes them, so
    /// that the loop's budget sees them.
    #[test]
    fn issue_31_requests_not_yet_in_a_worker_count_in_the_fronts_memory() {
        let board = Board::new().unwrap();
        let channel = handoff::Channel::new().unwrap();
        let mut front = Front::new(channel.fronts(), 1, board, None);
        let meta = Meta::default();
        let body = vec![b'a'; 100_000];
        let mut clients = Vec::new();
        // Until the channel is full and requests are held: every one counts.
        while front.held() < 3 {
            let (conn, client) = UnixStream::pair().unwrap();
            front.hand_off(
                &Socket::from(std::os::fd::OwnedFd::from(conn)),
                meta.clone(),
                &body,
                None,
            );
            clients.push(client);
            assert_eq!(
                front.memory(),
                clients.len() * body.len(),
                "after {} hand-offs",
                clients.len()
            );
        }
        let sent = (clients.len() - front.held()) as u64;
        // The workers take the spooled ones: they no longer count; the held ones do.
        for _ in 0..sent {
            board.handoff_taken();
        }
        front.settle();
        assert_eq!(front.memory(), front.held() * body.len());
    }
}

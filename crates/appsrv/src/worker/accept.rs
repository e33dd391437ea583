//! Accepting connections in a worker, without a thundering herd and without busy loops.
//!
//! - One listener: a blocking `accept4` on the shared socket. The kernel queues sleeping
//!   acceptors and wakes exactly one per connection.
//! - Several listeners: the master made them non-blocking; each worker has its own epoll
//!   instance with every listener registered `EPOLLEXCLUSIVE`, so a connection wakes one
//!   (or a few) workers, not all; a worker that loses the race gets `EAGAIN` and waits again.
//!
//! - Hybrid mode (`--io hybrid`): the worker takes the connections the fronts hand it from
//!   the hand-off channel (`net/handoff.rs`): a blocking `recvmsg` when it serves no
//!   listener itself, else the channel beside its listeners (TLS ones, which the workers
//!   serve directly) in its epoll set, `EPOLLEXCLUSIVE` too.
//!
//! Error handling follows accept(2): `EINTR` (a signal: check for a stop), `ECONNABORTED`,
//! `EPROTO` and the network errors Linux passes up from the new connection are retried;
//! `EMFILE`, `ENFILE`, `ENOBUFS` and `ENOMEM` back off for a moment and are logged once per
//! episode; `EINVAL` means the master shut the listeners down: the worker stops.

use std::io;
use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use socket2::{SockAddr, Socket};

use crate::net::listener::Listener;
use crate::scoreboard::{Board, State};
use crate::sys;

use super::ledger::{RESOURCE_BACKOFF, Trouble};

/// A worker that registers its listeners `EPOLLEXCLUSIVE` (the event loop, the async
/// driver) re-registers them after this many accepts, which puts it at the back of the
/// queue of waiters: Linux wakes exclusive waiters in the order they registered, and the
/// first worker would otherwise take nearly every connection of a lightly loaded server.
pub(crate) const REQUEUE_EVERY: u32 = 32;

/// The epoll key of the privileged helper's channel.
const HELPER: u64 = u64::MAX;
/// The epoll key of the hand-off channel (hybrid mode).
const HANDOFF: u64 = u64::MAX - 1;

/// The outcome of waiting for a connection.
#[derive(Debug)]
pub(crate) enum Accepted {
    /// A new connection and its peer.
    /// A new connection, its peer, and the index of the listener that accepted it.
    Connection(Socket, SockAddr, usize),
    /// Hybrid mode: a connection a front handed over (its bytes are in the acceptor's
    /// [`inbox`](Acceptor::inbox)).
    HandedOff(crate::net::handoff::Received),
    /// The worker was asked to stop, or the listeners were shut down.
    Stop,
    /// USR1 arrived: reopen the log file, then wait again.
    Reopen,
}

#[derive(Debug)]
pub(crate) struct Acceptor<'a> {
    id: u32,
    board: &'a Board,
    listeners: &'a [Listener],
    epoll: Option<Epoll>,
    /// An error episode is in progress (logged once, cleared by the next success).
    episode: Trouble,
    /// Hybrid mode: the workers' end of the hand-off channel, and the space its messages
    /// are received into.
    handoff: Option<(std::os::fd::BorrowedFd<'a>, crate::net::handoff::Inbox)>,
}

impl<'a> Acceptor<'a> {
    /// An acceptor over the `listeners` that `serves` names (by index), and in hybrid mode
    /// the hand-off channel's end `handoff`.
    pub(crate) fn new(
        id: u32,
        listeners: &'a [Listener],
        board: &'a Board,
        serves: &dyn Fn(usize) -> bool,
        handoff: Option<std::os::fd::BorrowedFd<'a>>,
    ) -> io::Result<Self> {
        // With a privileged helper, its channel is watched too, so that a helper that dies
        // while this worker waits retires the worker at once (the master replaces both),
        // not at the next client's call.
        let helper = crate::privileged::channel_fd();
        let served = (0..listeners.len()).filter(|i| serves(*i)).count();
        let waits_on = served + usize::from(handoff.is_some());
        let epoll = if waits_on > 1 || helper.is_some() {
            let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
            for (i, l) in listeners.iter().enumerate().filter(|(i, _)| serves(*i)) {
                let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE;
                ep.add(l.as_fd(), EpollEvent::new(flags, i as u64))?;
            }
            if let Some(fd) = handoff {
                let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE;
                ep.add(fd, EpollEvent::new(flags, HANDOFF))?;
            }
            if let Some(fd) = helper {
                // Hang-up only: a late answer to a call that timed out is for the next
                // call to drop, not a wake-up.
                ep.add(fd, EpollEvent::new(EpollFlags::EPOLLRDHUP, HELPER))?;
            }
            Some(ep)
        } else {
            None
        };
        Ok(Acceptor {
            id,
            board,
            listeners,
            epoll,
            episode: Trouble::default(),
            handoff: handoff.map(|fd| (fd, crate::net::handoff::Inbox::default())),
        })
    }

    /// The bytes that came with the last connection handed over.
    pub(crate) fn inbox(&self) -> Option<&crate::net::handoff::Inbox> {
        self.handoff.as_ref().map(|(_, inbox)| inbox)
    }

    /// Waits for the next connection, marked idle on the board meanwhile.
    pub(crate) fn accept(&mut self) -> Accepted {
        self.board.set_state(self.id, State::Idle);
        let accepted = self.wait();
        if let (Accepted::Connection(..) | Accepted::HandedOff(_), Some(slot)) =
            (&accepted, self.board.slot(self.id))
        {
            // Not at a keep-alive boundary (the guard marks it again after a response),
            // before the slot shows it reading: the master wakes no worker whose new
            // connection still waits for its first request.
            slot.new_connection();
        }
        let next = match accepted {
            Accepted::Connection(..) | Accepted::HandedOff(_) => State::Reading,
            Accepted::Stop => State::Finishing,
            Accepted::Reopen => State::Starting, // not idle while it reopens; set again on return
        };
        self.board.set_state(self.id, next);
        accepted
    }

    fn wait(&mut self) -> Accepted {
        loop {
            if sys::stop_requested() {
                // Once no front is left (a stop: the fronts go first), the requests still
                // in the channel are served before the worker leaves; at a reload the next
                // generation's workers take them.
                if self.handoff.is_some() && !self.board.fronts_receiving() {
                    if let Some(accepted @ Accepted::HandedOff(_)) = self.take_handoff(false) {
                        return accepted;
                    }
                }
                return Accepted::Stop;
            }
            if sys::take_reopen_request() {
                return Accepted::Reopen;
            }
            let index = match &self.epoll {
                None if self.handoff.is_some() => match self.take_handoff(true) {
                    Some(accepted) => return accepted,
                    None => continue,
                },
                None => 0,
                Some(ep) => {
                    let mut events = [EpollEvent::empty()];
                    match ep.wait(&mut events, EpollTimeout::NONE) {
                        Ok(0) => continue,
                        // A listener shut down by the master (stop) reports HUP; a
                        // non-blocking Unix listener would then answer EAGAIN forever.
                        Ok(_) if events[0].data() == HELPER => {
                            crate::privileged::helper_hung_up();
                            return Accepted::Stop;
                        }
                        Ok(_) if events[0].data() == HANDOFF => match self.take_handoff(false) {
                            Some(accepted) => return accepted,
                            None => continue,
                        },
                        Ok(_) if events[0].events().contains(EpollFlags::EPOLLHUP) => {
                            if self.listeners_shut(events[0].data() as usize) {
                                continue;
                            }
                            return Accepted::Stop;
                        }
                        Ok(_) => events[0].data() as usize,
                        Err(Errno::EINTR) => continue,
                        Err(e) => {
                            self.trouble(e, "waiting for connections");
                            continue;
                        }
                    }
                }
            };
            let listener = &self.listeners[index];
            match listener.socket().accept() {
                Ok((socket, peer)) => {
                    self.episode.cleared();
                    if let Err(e) = listener.prepare(&socket) {
                        tracing::warn!(
                            "setting up a connection on {}: {e}; closing it",
                            listener.local_addr()
                        );
                        continue;
                    }
                    return Accepted::Connection(socket, peer, index);
                }
                Err(e) => match AcceptError::of(&e) {
                    AcceptError::Retry | AcceptError::Next => {}
                    // shutdown(2) on the listener by the master: we are stopping.
                    AcceptError::Stop if self.listeners_shut(index) => {}
                    AcceptError::Stop => return Accepted::Stop,
                    AcceptError::BackOff(other) => self.trouble(other, "accepting connections"),
                },
            }
        }
    }

    /// Hybrid mode: the master shut listener `index` down (a stop): it is no longer
    /// watched, but the worker goes on taking what the fronts hand it, which they still do
    /// while they drain; it leaves on its own stop signal, which the master sends once the
    /// fronts are gone. False outside hybrid mode: a shut listener means stop.
    fn listeners_shut(&mut self, index: usize) -> bool {
        if self.handoff.is_none() {
            return false;
        }
        if let (Some(ep), Some(l)) = (&self.epoll, self.listeners.get(index)) {
            let _ = ep.delete(l.as_fd());
        }
        true
    }

    /// Takes a connection from the hand-off channel (`wait`: blocking until one comes or a
    /// signal); `None` to wait again (interrupted, another worker took it, a stray
    /// message).
    fn take_handoff(&mut self, wait: bool) -> Option<Accepted> {
        let (channel, inbox) = self.handoff.as_mut()?;
        match inbox.receive(*channel, wait) {
            // Counted as taken by the loop, once the slot names its client.
            Ok(Some(received)) => Some(Accepted::HandedOff(received)),
            // Every sender closed its end: only at the master's death.
            Ok(None) => Some(Accepted::Stop),
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) => None,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                tracing::warn!("{e}; dropped");
                None
            }
            Err(e) => {
                let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
                self.trouble(errno, "taking connections from the fronts");
                None
            }
        }
    }

    /// Logs an error once per episode and pauses, so that a persistent error (out of
    /// descriptors) costs a few wake-ups per second, not a busy loop.
    fn trouble(&mut self, errno: Errno, doing: &str) {
        self.episode.began(errno, doing);
        // A signal ends the pause early, so a stop is not delayed.
        let _ = nix::poll::poll(
            &mut [],
            nix::poll::PollTimeout::from(RESOURCE_BACKOFF.as_millis() as u16),
        );
    }
}

/// What an `accept` error means, the same for every driver (the blocking acceptor, the
/// event loop, the async driver): see the module's notes and accept(2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcceptError {
    /// `EINTR`: a signal interrupted it; look for a stop, then accept again.
    Retry,
    /// `EAGAIN` (another worker took the connection), or an error of the connection itself
    /// ([`connection_error`]): nothing is wrong with the listener; the next one is taken
    /// as if nothing happened.
    Next,
    /// `EINVAL`: the master shut the listeners down (a stop).
    Stop,
    /// Anything else (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`...): logged once per episode
    /// ([`Trouble`]), and accepting pauses for [`RESOURCE_BACKOFF`] rather than spinning on
    /// a listener that stays readable.
    BackOff(Errno),
}

impl AcceptError {
    /// The class of `errno`, an `accept` error.
    pub(crate) fn classify(errno: Errno) -> Self {
        match errno {
            Errno::EINTR => AcceptError::Retry,
            Errno::EAGAIN => AcceptError::Next,
            e if connection_error(e) => AcceptError::Next,
            Errno::EINVAL => AcceptError::Stop,
            other => AcceptError::BackOff(other),
        }
    }

    /// The class of an `accept` error as `std::io` reports it.
    pub(crate) fn of(e: &io::Error) -> Self {
        Self::classify(Errno::from_raw(e.raw_os_error().unwrap_or(0)))
    }
}

/// The `EPOLLEXCLUSIVE` requeue of a worker that registers its listeners exclusively (the
/// event loop; the async driver's accept loop): counts accepts, and says every
/// [`REQUEUE_EVERY`] that the listeners must be registered again (delete and add: an
/// exclusive registration cannot be modified), which puts the worker at the back of the
/// listeners' queues of waiters. It knows no epoll instance: the caller re-registers.
/// `Copy`, so that an async accept loop that accepts through `&self` can keep it in a
/// `Cell`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Requeue {
    /// Accepts since the last requeue (or since accepting resumed).
    since: u32,
}

impl Requeue {
    /// One connection accepted: true when the caller must requeue now (the count starts
    /// again).
    pub(crate) fn accepted(&mut self) -> bool {
        self.since += 1;
        if self.since < REQUEUE_EVERY {
            return false;
        }
        self.since = 0;
        true
    }

    /// The listeners were registered again for another reason (accepting resumed after a
    /// pause): the worker is at the back of the queues already, the count starts again.
    pub(crate) fn registered(&mut self) {
        self.since = 0;
    }
}

/// Whether an `accept` error belongs to the connection, not to the listener: it went away
/// before it was taken, or Linux passed up a network error of its own. The next one is
/// taken as if nothing happened.
pub(crate) fn connection_error(errno: Errno) -> bool {
    matches!(
        errno,
        Errno::ECONNABORTED
            | Errno::EPROTO
            | Errno::ENETDOWN
            | Errno::ENOPROTOOPT
            | Errno::EHOSTDOWN
            | Errno::ENONET
            | Errno::EHOSTUNREACH
            | Errno::EOPNOTSUPP
            | Errno::ENETUNREACH
            | Errno::ETIMEDOUT
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43: one classification of accept errors for every driver, as accept(2) and the
    /// module's notes say.
    #[test]
    fn issue_43_accept_errors_are_classified_once() {
        assert_eq!(AcceptError::classify(Errno::EINTR), AcceptError::Retry);
        assert_eq!(AcceptError::classify(Errno::EAGAIN), AcceptError::Next);
        for e in [
            Errno::ECONNABORTED,
            Errno::EPROTO,
            Errno::ENETUNREACH,
            Errno::ETIMEDOUT,
        ] {
            assert_eq!(AcceptError::classify(e), AcceptError::Next, "{e}");
        }
        assert_eq!(AcceptError::classify(Errno::EINVAL), AcceptError::Stop);
        for e in [Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM] {
            assert_eq!(AcceptError::classify(e), AcceptError::BackOff(e), "{e}");
        }
        let io = io::Error::from_raw_os_error(libc::EMFILE);
        assert_eq!(AcceptError::of(&io), AcceptError::BackOff(Errno::EMFILE));
        assert_eq!(
            AcceptError::of(&io::ErrorKind::WouldBlock.into()),
            AcceptError::BackOff(Errno::UnknownErrno),
            "an error without an errno is not taken for a connection's"
        );
    }

    /// Issue 43: the requeue says "now" once every `REQUEUE_EVERY` accepts, and a
    /// registration for another reason starts the count again.
    #[test]
    fn issue_43_the_requeue_comes_every_32_accepts() {
        let mut r = Requeue::default();
        let due: Vec<u32> = (1..=3 * REQUEUE_EVERY).filter(|_| r.accepted()).collect();
        assert_eq!(due.len(), 3);
        let mut r = Requeue::default();
        let nows: Vec<bool> = (0..REQUEUE_EVERY).map(|_| r.accepted()).collect();
        assert_eq!(nows.iter().filter(|n| **n).count(), 1);
        assert!(nows[REQUEUE_EVERY as usize - 1], "at the 32nd accept");
        let mut r = Requeue::default();
        for _ in 0..REQUEUE_EVERY - 1 {
            assert!(!r.accepted());
        }
        r.registered();
        assert!(!r.accepted(), "the count started again");
    }
}

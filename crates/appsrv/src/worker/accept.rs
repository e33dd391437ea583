//! Accepting connections in a worker, without a thundering herd and without busy loops.
//!
//! - One listener: a blocking `accept4` on the shared socket. The kernel queues sleeping
//!   acceptors and wakes exactly one per connection.
//! - Several listeners: the master made them non-blocking; each worker has its own epoll
//!   instance with every listener registered `EPOLLEXCLUSIVE`, so a connection wakes one
//!   (or a few) workers, not all; a worker that loses the race gets `EAGAIN` and waits again.
//!
//! Error handling follows accept(2): `EINTR` (a signal: check for a stop), `ECONNABORTED`,
//! `EPROTO` and the network errors Linux passes up from the new connection are retried;
//! `EMFILE`, `ENFILE`, `ENOBUFS` and `ENOMEM` back off for a moment and are logged once per
//! episode; `EINVAL` means the master shut the listeners down: the worker stops.

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use socket2::{SockAddr, Socket};

use crate::net::listener::Listener;
use crate::scoreboard::{Board, State};
use crate::sys;

/// The epoll key of the privileged helper's channel.
const HELPER: u64 = u64::MAX;

/// How long to pause accepting when the process or system is out of descriptors or memory.
const RESOURCE_BACKOFF: Duration = Duration::from_millis(100);

/// The outcome of waiting for a connection.
#[derive(Debug)]
pub(crate) enum Accepted {
    /// A new connection and its peer.
    /// A new connection, its peer, and the index of the listener that accepted it.
    Connection(Socket, SockAddr, usize),
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
    episode: Option<Errno>,
}

impl<'a> Acceptor<'a> {
    pub(crate) fn new(id: u32, listeners: &'a [Listener], board: &'a Board) -> io::Result<Self> {
        // With a privileged helper, its channel is watched too, so that a helper that dies
        // while this worker waits retires the worker at once (the master replaces both),
        // not at the next client's call.
        let helper = crate::privileged::channel_fd();
        let epoll = if listeners.len() > 1 || helper.is_some() {
            let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
            for (i, l) in listeners.iter().enumerate() {
                let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE;
                ep.add(l.as_fd(), EpollEvent::new(flags, i as u64))?;
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
            episode: None,
        })
    }

    /// Waits for the next connection, marked idle on the board meanwhile.
    pub(crate) fn accept(&mut self) -> Accepted {
        self.board.set_state(self.id, State::Idle);
        let accepted = self.wait();
        if let (Accepted::Connection(..), Some(slot)) = (&accepted, self.board.slot(self.id)) {
            // Not at a keep-alive boundary (the guard marks it again after a response),
            // before the slot shows it reading: the master wakes no worker whose new
            // connection still waits for its first request.
            slot.new_connection();
        }
        let next = match accepted {
            Accepted::Connection(..) => State::Reading,
            Accepted::Stop => State::Finishing,
            Accepted::Reopen => State::Starting, // not idle while it reopens; set again on return
        };
        self.board.set_state(self.id, next);
        accepted
    }

    fn wait(&mut self) -> Accepted {
        loop {
            if sys::stop_requested() {
                return Accepted::Stop;
            }
            if sys::take_reopen_request() {
                return Accepted::Reopen;
            }
            let index = match &self.epoll {
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
                        Ok(_) if events[0].events().contains(EpollFlags::EPOLLHUP) => return Accepted::Stop,
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
                    if let Some(e) = self.episode.take() {
                        tracing::info!("accepting again after {}", e.desc());
                    }
                    if let Err(e) = listener.prepare(&socket) {
                        tracing::warn!(
                            "setting up a connection on {}: {e}; closing it",
                            listener.local_addr()
                        );
                        continue;
                    }
                    return Accepted::Connection(socket, peer, index);
                }
                Err(e) => {
                    let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
                    match errno {
                        Errno::EINTR | Errno::EAGAIN => {}
                        e if connection_error(e) => {}
                        // shutdown(2) on the listener by the master: we are stopping.
                        Errno::EINVAL => return Accepted::Stop,
                        other => self.trouble(other, "accepting connections"),
                    }
                }
            }
        }
    }

    /// Logs an error once per episode and pauses, so that a persistent error (out of
    /// descriptors) costs a few wake-ups per second, not a busy loop.
    fn trouble(&mut self, errno: Errno, doing: &str) {
        if self.episode.is_none() {
            tracing::error!(
                "{doing}: {} ({errno}); pausing {} ms between attempts until it clears",
                errno.desc(),
                RESOURCE_BACKOFF.as_millis()
            );
        }
        self.episode = Some(errno);
        // A signal ends the pause early, so a stop is not delayed.
        let _ = nix::poll::poll(
            &mut [],
            nix::poll::PollTimeout::from(RESOURCE_BACKOFF.as_millis() as u16),
        );
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

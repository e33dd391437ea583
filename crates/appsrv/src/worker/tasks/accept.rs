//! The listeners, in an epoll instance of the worker's own registered with
//! `EPOLLEXCLUSIVE`, that the runtime watches as one descriptor; accepting from them.

use crate::worker::accept::Requeue;
use std::cell::Cell;
use std::io;
use std::task::Poll;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags, EpollTimeout};
use socket2::Socket;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::net::listener::{Addr, Listener};
use crate::sys::{self, EpollFd};

/// The worker's stream listeners, for `accept`.
///
/// They are registered level-triggered with `EPOLLEXCLUSIVE` in an epoll instance of the
/// worker's own, which the runtime watches as one descriptor (tokio's reactor has no
/// exclusive registration): a new connection wakes one waiting worker (or a few), not
/// all of them, as in the event loop. Linux wakes the exclusive waiters in the order they
/// registered, so a worker puts itself at the back of the queue (delete and add) every
/// [`REQUEUE_EVERY`](crate::worker::accept::REQUEUE_EVERY) accepts, as the event loop does, and the
/// connections spread over the workers.
pub(super) fn listeners_epoll(listeners: &[Listener]) -> Result<EpollFd, String> {
    let epoll = EpollFd::new().map_err(|e| format!("making the listeners' epoll instance: {e}"))?;
    for (i, l) in listeners.iter().enumerate().filter(|(_, l)| !l.is_datagram()) {
        watch_listener(epoll.epoll(), l, i).map_err(|e| format!("watching {}: {e}", l.label()))?;
    }
    Ok(epoll)
}

pub(super) fn watch_listener(epoll: &Epoll, l: &Listener, i: usize) -> nix::Result<()> {
    let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE;
    epoll.add(l.socket(), EpollEvent::new(flags, i as u64))
}

/// The listeners' epoll instance, watched by the runtime.
pub(super) struct Accept<'l> {
    epoll: AsyncFd<EpollFd>,
    listeners: &'l [Listener],
    /// The `EPOLLEXCLUSIVE` requeue's count (`worker/accept.rs`, as the event loop keeps it).
    requeue: Cell<Requeue>,
}

impl<'l> Accept<'l> {
    pub(super) fn new(epoll: EpollFd, listeners: &'l [Listener]) -> io::Result<Self> {
        let epoll = sys::watch_async(epoll, Interest::READABLE)?;
        Ok(Accept {
            epoll,
            listeners,
            requeue: Cell::new(Requeue::default()),
        })
    }

    /// Accepts one connection on one of the listeners (the first ready).
    pub(super) async fn accept(&self) -> io::Result<(Socket, Addr, usize)> {
        std::future::poll_fn(|cx| {
            loop {
                let mut guard = match self.epoll.poll_read_ready(cx) {
                    Poll::Ready(Ok(g)) => g,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                };
                let mut events = [EpollEvent::empty(); 8];
                let n = match self.epoll.get_ref().epoll().wait(&mut events, EpollTimeout::ZERO) {
                    Ok(n) => n,
                    Err(Errno::EINTR) => continue,
                    Err(e) => return Poll::Ready(Err(e.into())),
                };
                if n == 0 {
                    // Nothing left: the next connection is a new edge.
                    guard.clear_ready();
                    continue;
                }
                for ev in &events[..n] {
                    let index = ev.data() as usize;
                    let Some(l) = self.listeners.get(index) else {
                        continue;
                    };
                    match accept(l.socket()) {
                        Ok((socket, peer)) => {
                            self.accepted();
                            return Poll::Ready(Ok((socket, peer, index)));
                        }
                        // Another worker took it.
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
            }
        })
        .await
    }

    /// One accept more: every `REQUEUE_EVERY` ([`Requeue`]), the worker
    /// goes to the back of the listeners' queues of waiters.
    pub(super) fn accepted(&self) {
        let mut requeue = self.requeue.get();
        let now = requeue.accepted();
        self.requeue.set(requeue);
        if !now {
            return;
        }
        let epoll = self.epoll.get_ref().epoll();
        for (i, l) in self
            .listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_datagram())
        {
            let _ = epoll.delete(l.socket());
            if let Err(e) = watch_listener(epoll, l, i) {
                tracing::error!("watching {} again: {e}", l.label());
            }
        }
    }
}

/// `accept4` on a listener, the new socket non-blocking and close-on-exec (socket2's, as
/// the event loop accepts), and its client's address.
pub(super) fn accept(listener: &Socket) -> io::Result<(Socket, Addr)> {
    let (socket, _) = listener.accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)?;
    let peer = socket
        .peer_addr()
        .map_or(Addr::Unix(None), |a| Addr::from_sockaddr(&a));
    Ok((socket, peer))
}

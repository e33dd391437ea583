//! Accepting: one accept per listener per turn, the limit of `--worker-connections` (the
//! listeners out of the epoll set at the limit, back below 7/8 of it), the back-off on
//! resource errors, and the `EPOLLEXCLUSIVE` requeue (see the module's notes in `mod.rs`).
//! The classification of accept errors and the requeue's count are `worker/accept.rs`'s,
//! shared with the other drivers.

use std::time::Instant;

use socket2::Socket;

use crate::handler::RequestHandler;
use crate::net::listener::{Addr, Listener};

use super::super::accept::{AcceptError, Requeue};
use super::super::ledger::{RESOURCE_BACKOFF, Trouble};
use super::{Completion, Loop, register_listener};

/// The accepting state of a loop.
#[derive(Debug)]
pub(super) struct Accepting {
    /// The listeners are in the epoll set.
    pub(super) on: bool,
    /// Accepting paused for resources (`EMFILE`...) until then.
    pub(super) resume_at: Option<Instant>,
    /// The `EPOLLEXCLUSIVE` requeue's count.
    requeue: Requeue,
    /// An accept error episode (logged once).
    trouble: Trouble,
    /// Connections accepted so far (each one's number, [`Conn::id`](crate::Conn::id)).
    pub(super) accepted: u64,
}

impl Accepting {
    /// Accepting, nothing accepted yet.
    pub(super) fn new() -> Self {
        Accepting {
            on: true,
            resume_at: None,
            requeue: Requeue::default(),
            trouble: Trouble::default(),
            accepted: 0,
        }
    }
}

impl<'a, H: RequestHandler, C: Completion<'a>> Loop<'a, H, C> {
    /// Takes the listeners out of the epoll set (an exclusive registration cannot be
    /// modified), shown on the slot.
    pub(super) fn pause_accepting(&mut self) {
        if self.accepting.on {
            self.unregister_listeners();
            self.accepting.on = false;
            self.cfg.slot.set_accepts_paused(true);
        }
    }

    /// The stream listeners only: datagram listeners stay registered until the stop
    /// (`--worker-connections` limits connections, not datagrams).
    fn unregister_listeners(&self) {
        for (_, l) in self.stream_listeners() {
            let _ = self.reactor.epoll.delete(l.socket());
        }
    }

    /// The stream listeners this loop accepts on: all of them, but a hybrid front leaves
    /// the TLS ones to the workers.
    fn stream_listeners(&self) -> impl Iterator<Item = (usize, &'a Listener)> + '_ {
        let tls = self.cfg.tls;
        self.cfg
            .listeners
            .iter()
            .enumerate()
            .filter(move |(i, l)| !(l.is_datagram() || C::leaves_to_workers(tls, *i)))
    }

    fn register_listeners(&self) {
        for (i, l) in self.stream_listeners() {
            if let Err(e) = register_listener(&self.reactor.epoll, l, i) {
                tracing::error!("watching {} again: {e}", l.local_addr());
            }
        }
    }

    /// What counts against `--worker-connections`: the open connections, and those a
    /// front holds with a whole request for want of room in the channel (workers
    /// saturated: the listen queue pushes back on new clients then).
    fn load(&self) -> usize {
        self.reactor.conns.len() + self.completion.held()
    }

    /// Puts the listeners back when below the limit again and not paused for resources.
    pub(super) fn resume_accepting(&mut self) {
        if self.accepting.on || self.stopping {
            return;
        }
        if self.accepting.resume_at.is_some_and(|t| self.reactor.now < t) {
            return;
        }
        self.accepting.resume_at = None;
        let max = self.cfg.max_connections;
        if self.load() > max - max / 8 {
            return;
        }
        self.register_listeners();
        self.accepting.on = true;
        self.accepting.requeue.registered();
        self.cfg.slot.set_accepts_paused(false);
    }

    /// Accepts a connection from listener `index` (one per turn: see the module's notes).
    pub(super) fn accept(&mut self, index: usize, handler: &mut H) {
        if !self.accepting.on {
            return;
        }
        if self.load() >= self.cfg.max_connections {
            tracing::debug!(
                "{} connections open (--worker-connections): not accepting until some close",
                self.load()
            );
            self.pause_accepting();
            return;
        }
        let listener = &self.cfg.listeners[index];
        let requeue = match listener
            .socket()
            .accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
        {
            Ok((socket, peer)) => {
                self.accepting.trouble.cleared();
                self.add(socket, Addr::from_sockaddr(&peer), index, handler);
                self.accepting.requeue.accepted()
            }
            Err(e) => {
                match AcceptError::of(&e) {
                    AcceptError::Retry | AcceptError::Next => {}
                    AcceptError::Stop => {
                        if !self.stopping {
                            self.begin_stop();
                        }
                    }
                    AcceptError::BackOff(other) => {
                        self.accepting.trouble.began(other, "accepting connections");
                        self.pause_accepting();
                        self.accepting.resume_at = Some(self.reactor.now + RESOURCE_BACKOFF);
                    }
                }
                false
            }
        };
        if requeue && self.accepting.on {
            // To the back of the listeners' queues of waiters: the next connection wakes
            // another worker first.
            self.unregister_listeners();
            self.register_listeners();
        }
    }

    /// A new connection: registered once, then admitted and served.
    fn add(&mut self, socket: Socket, peer: Addr, listener: usize, handler: &mut H) {
        self.insert(socket, peer, listener, handler, None);
    }
}

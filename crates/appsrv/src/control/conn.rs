//! Short connections served by the master without ever blocking it: accept until
//! `EAGAIN`, read a bounded request, write the reply as the socket takes it, close; each
//! connection within a deadline counted from its accept.
//!
//! Used by the control socket (one request line) and the `/metrics` listener (one HTTP
//! request); the protocol is the `decide` callback of [`Acceptor::service`].

use std::io::{self, Read};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};
use socket2::Socket;

/// How long a connection may take, from its accept to the last byte of the reply.
pub(crate) const DEADLINE: Duration = Duration::from_secs(2);

/// Connections served at once; more are answered with a one-line refusal and closed.
pub(crate) const MAX_CONNECTIONS: usize = 16;

/// Connections accepted in one call of `service`, so that a flood of connections cannot
/// hold the master's loop (the listener stays readable: the next `poll` returns at once).
const ACCEPTS_PER_SERVICE: usize = 64;

/// How long the listener is left alone after `accept` failed for lack of descriptors or
/// memory (it stays readable: polling it meanwhile would spin).
const ACCEPT_PAUSE: Duration = Duration::from_secs(1);

/// How many bytes a client may still send after its reply before it is cut off.
const MAX_DRAIN: usize = 64 * 1024;

/// What to do with the request bytes received so far.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Incomplete: wait for more (closed at end of file or at the deadline).
    Wait,
    /// Send these bytes, then close.
    Reply(Vec<u8>),
    /// Close without a word.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Receiving the request.
    Reading,
    /// Sending the reply.
    Writing,
    /// The reply is sent and our side shut: reading (and dropping) what the client still
    /// sends until its end of file, so that closing does not reset the connection (a TCP
    /// close with unread data sends RST, which may destroy the reply in flight).
    Draining,
}

#[derive(Debug)]
struct Conn {
    socket: Socket,
    deadline: Instant,
    phase: Phase,
    input: Vec<u8>,
    output: Vec<u8>,
    written: usize,
    drained: usize,
}

enum Fill {
    /// Read what was there; more may come.
    Pending,
    /// The client shut its side.
    Eof,
    /// The connection failed.
    Failed,
}

impl Conn {
    fn events(&self) -> PollFlags {
        match self.phase {
            Phase::Reading | Phase::Draining => PollFlags::POLLIN,
            Phase::Writing => PollFlags::POLLOUT,
        }
    }

    /// Reads what the socket has, keeping at most about `limit` bytes.
    fn fill(&mut self, limit: usize) -> Fill {
        let mut chunk = [0u8; 1024];
        while self.input.len() <= limit {
            match (&self.socket).read(&mut chunk) {
                Ok(0) => return Fill::Eof,
                Ok(n) => self.input.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Fill::Pending,
                Err(_) => return Fill::Failed,
            }
        }
        Fill::Pending
    }

    /// Makes progress; returns false when the connection is over.
    fn step(&mut self, limit: usize, decide: &mut dyn FnMut(&Socket, &[u8], bool) -> Decision) -> bool {
        if self.phase == Phase::Reading {
            let eof = match self.fill(limit) {
                Fill::Pending => false,
                Fill::Eof => true,
                Fill::Failed => return false,
            };
            match decide(&self.socket, &self.input, eof) {
                Decision::Wait if eof => return false,
                Decision::Wait => return true,
                Decision::Close => return false,
                Decision::Reply(bytes) => {
                    self.output = bytes;
                    self.phase = Phase::Writing;
                }
            }
        }
        if self.phase == Phase::Writing {
            while self.written < self.output.len() {
                match send(&self.socket, &self.output[self.written..]) {
                    Ok(0) => return false,
                    Ok(n) => self.written += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    Err(_) => return false,
                }
            }
            // End of reply. Shutting down (rather than only closing) also ends it for a
            // copy of the descriptor that a worker forked meanwhile may hold.
            if self.socket.shutdown(Shutdown::Write).is_err() {
                return false;
            }
            self.phase = Phase::Draining;
            self.output = Vec::new();
        }
        let mut chunk = [0u8; 1024];
        loop {
            match (&self.socket).read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => {
                    self.drained += n;
                    if self.drained > MAX_DRAIN {
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            }
        }
    }
}

/// Writes what the socket takes, without SIGPIPE: a client that went away must never
/// kill the master, whatever its signal dispositions.
fn send(socket: &Socket, bytes: &[u8]) -> io::Result<usize> {
    socket.send_with_flags(bytes, libc::MSG_NOSIGNAL)
}

/// Sends `message` on a connection that is not served (refused, or one too many) and
/// closes it, without waiting: one non-blocking write, which a fresh connection's empty
/// buffer always takes whole.
pub(crate) fn turn_away(socket: Socket, message: &[u8]) {
    let _ = socket.set_nonblocking(true);
    let _ = send(&socket, message);
    // Read what the client already sent: closing a Unix socket with unread data makes the
    // client's next read fail with ECONNRESET instead of returning end of file.
    let mut chunk = [0u8; 1024];
    for _ in 0..4 {
        if !matches!((&socket).read(&mut chunk), Ok(n) if n > 0) {
            break;
        }
    }
    let _ = socket.shutdown(Shutdown::Both);
}

/// A non-blocking listening socket and the connections it is serving.
#[derive(Debug)]
pub(crate) struct Acceptor {
    listener: Socket,
    conns: Vec<Conn>,
    /// Largest request accepted (bytes).
    limit: usize,
    /// What a connection beyond [`MAX_CONNECTIONS`] is told.
    busy: &'static [u8],
    /// For log lines: "control socket /run/x/ctl.sock", "metrics listener 127.0.0.1:9100".
    what: String,
    /// Accepting is paused until then after running out of descriptors.
    paused_until: Option<Instant>,
}

impl Acceptor {
    /// `listener` must be listening and non-blocking.
    pub(crate) fn new(listener: Socket, limit: usize, busy: &'static [u8], what: String) -> Acceptor {
        Acceptor {
            listener,
            conns: Vec::new(),
            limit,
            busy,
            what,
            paused_until: None,
        }
    }

    /// The descriptors to poll, with the events awaited on each.
    pub(crate) fn poll_fds(&self) -> Vec<PollFd<'_>> {
        let listening = self
            .paused_until
            .is_none()
            .then(|| PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
        listening
            .into_iter()
            .chain(
                self.conns
                    .iter()
                    .map(|c| PollFd::new(c.socket.as_fd(), c.events())),
            )
            .collect()
    }

    /// When `service` must run next even if no descriptor is ready.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.conns
            .iter()
            .map(|c| c.deadline)
            .chain(self.paused_until)
            .min()
    }

    /// Every descriptor held (the listener and the connections).
    /// The listening socket (handed to a new master on upgrade).
    pub(crate) fn listener(&self) -> &Socket {
        &self.listener
    }

    pub(crate) fn raw_fds(&self) -> Vec<RawFd> {
        std::iter::once(self.listener.as_raw_fd())
            .chain(self.conns.iter().map(|c| c.socket.as_raw_fd()))
            .collect()
    }

    /// How many connections are being served.
    #[cfg(test)]
    pub(crate) fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Accepts, reads, replies and closes, as far as possible without blocking.
    ///
    /// `admit` vets a new connection (`Err(message)`: send that and close it); `decide`
    /// looks at the request bytes received so far (and whether the client has shut its
    /// side) and says whether to wait, reply or close.
    pub(crate) fn service(
        &mut self,
        admit: &mut dyn FnMut(&Socket) -> Result<(), Vec<u8>>,
        decide: &mut dyn FnMut(&[u8], bool) -> Decision,
    ) {
        self.service_sockets(admit, &mut |_, input, eof| decide(input, eof));
    }

    /// As [`Acceptor::service`], with each connection's socket given to `decide` as well
    /// (the control socket reads who asked from it).
    pub(crate) fn service_sockets(
        &mut self,
        admit: &mut dyn FnMut(&Socket) -> Result<(), Vec<u8>>,
        decide: &mut dyn FnMut(&Socket, &[u8], bool) -> Decision,
    ) {
        let now = Instant::now();
        let before = self.conns.len();
        self.conns.retain(|c| c.deadline > now);
        if self.conns.len() < before {
            tracing::debug!(
                "{}: closed {} connection(s) not done within {DEADLINE:?}",
                self.what,
                before - self.conns.len()
            );
        }
        if self.paused_until.is_some_and(|t| now >= t) {
            self.paused_until = None;
        }
        if self.paused_until.is_none() {
            self.accept(now, admit);
        }
        let limit = self.limit;
        self.conns.retain_mut(|c| c.step(limit, decide));
    }

    fn accept(&mut self, now: Instant, admit: &mut dyn FnMut(&Socket) -> Result<(), Vec<u8>>) {
        for _ in 0..ACCEPTS_PER_SERVICE {
            // socket2 accepts with SOCK_CLOEXEC.
            let socket = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    // EMFILE, ENFILE, ENOBUFS, ENOMEM: the pending connection stays queued
                    // and the listener readable; wait a little rather than spin.
                    tracing::warn!(
                        "{}: cannot accept a connection: {e}; not accepting for {ACCEPT_PAUSE:?}",
                        self.what
                    );
                    self.paused_until = Some(now + ACCEPT_PAUSE);
                    return;
                }
            };
            if socket.set_nonblocking(true).is_err() {
                continue;
            }
            if let Err(message) = admit(&socket) {
                turn_away(socket, &message);
                continue;
            }
            if self.conns.len() >= MAX_CONNECTIONS {
                tracing::debug!(
                    "{}: {MAX_CONNECTIONS} connections already: one turned away",
                    self.what
                );
                turn_away(socket, self.busy);
                continue;
            }
            self.conns.push(Conn {
                socket,
                deadline: now + DEADLINE,
                phase: Phase::Reading,
                input: Vec::new(),
                output: Vec::new(),
                written: 0,
                drained: 0,
            });
        }
    }
}

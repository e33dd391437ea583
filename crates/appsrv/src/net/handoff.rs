//! The hand-off channel of hybrid mode (`--io hybrid`): how a connection travels between
//! the front processes, whose event loops hold it while it has no whole request, and the
//! blocking workers, which serve its requests.
//!
//! One `socketpair(AF_UNIX, SOCK_SEQPACKET)` per master, made before the first fork and
//! kept for the master's life (so that a reload's new generation shares it with the old
//! one, which drains into it). Every front holds one end, every worker the other:
//! - a front **hands off** a connection by sending its descriptor (`SCM_RIGHTS`) with a
//!   small header and the bytes it read (the whole request, and anything pipelined behind
//!   it) in one message; the workers waiting on their end sleep in `recvmsg`, and the kernel
//!   gives each message to exactly one of them (a datagram wait is exclusive: one message
//!   wakes one worker, no thundering herd), so the idle workers are the queue's consumers
//!   and the messages in flight are the requests waiting for a worker;
//! - a worker **hands back** a connection that stayed quiet after a response the same way,
//!   without bytes, and whichever front reads it next takes it into its loop.
//!
//! Sequenced packets keep each message whole, and a message's descriptor arrives with it.
//! A message holds at most [`INLINE_MAX`] bytes of the request: a larger request is handed
//! off once that much has arrived, and the worker reads the rest itself. Nothing here knows about loops or handlers.

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{self, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType};

/// The most bytes of a request a hand-off carries (see the module's notes).
pub(crate) const INLINE_MAX: usize = 64 * 1024;

/// The header's size on the wire.
const HEADER: usize = 36;
/// The header's first word, which tells a hand-off from anything else.
const MAGIC: u32 = u32::from_le_bytes(*b"APHO");
/// The send buffer asked for on each end: a few whole-size hand-offs, and many small ones,
/// may wait for a worker (the kernel caps it at `net.core.wmem_max`).
const SEND_BUFFER: usize = 1024 * 1024;

/// What travels with a connection besides its descriptor and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta {
    /// Requests answered on the connection so far (`--keepalive-requests` counts across
    /// hand-offs).
    pub(crate) served: u32,
    /// The client, when the front learnt it from a PROXY header (otherwise the receiver
    /// asks the socket: a Unix client's path is not carried).
    pub(crate) peer: Option<SocketAddr>,
    /// The index of the listener that accepted it (for its per-connection settings).
    pub(crate) listener: u32,
}

impl Meta {
    fn encode(&self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4..8].copy_from_slice(&self.served.to_le_bytes());
        if let Some(peer) = self.peer {
            let (family, ip) = match peer.ip() {
                IpAddr::V4(a) => (4u8, a.to_ipv6_mapped()),
                IpAddr::V6(a) => (6u8, a),
            };
            h[12] = family;
            h[14..16].copy_from_slice(&peer.port().to_le_bytes());
            h[16..32].copy_from_slice(&ip.octets());
        }
        h[32..36].copy_from_slice(&self.listener.to_le_bytes());
        h
    }

    fn decode(h: &[u8; HEADER]) -> Option<Meta> {
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        if word(0) != MAGIC {
            return None;
        }
        let port = u16::from_le_bytes([h[14], h[15]]);
        let mut octets = [0u8; 16];
        octets.copy_from_slice(&h[16..32]);
        let ip = Ipv6Addr::from(octets);
        let peer = match h[12] {
            4 => Some(SocketAddr::new(IpAddr::V4(ip.to_ipv4_mapped()?), port)),
            6 => Some(SocketAddr::new(IpAddr::V6(ip), port)),
            _ => None,
        };
        Some(Meta {
            served: word(4),
            peer,
            listener: word(32),
        })
    }
}

/// The master's socket pair. The fronts' end is non-blocking (their loops never wait on
/// it); the workers' end blocks (an idle worker sleeps in `recvmsg`) and is sent to with
/// `MSG_DONTWAIT`.
#[derive(Debug)]
pub(crate) struct Channel {
    fronts: OwnedFd,
    workers: OwnedFd,
}

impl Channel {
    /// Makes the pair (both ends close-on-exec).
    pub(crate) fn new() -> io::Result<Channel> {
        let (fronts, workers) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let fronts_side = socket2::SockRef::from(&fronts);
        fronts_side.set_nonblocking(true)?;
        for end in [&fronts, &workers] {
            // Best effort: the kernel's cap applies, and a smaller buffer only means that
            // fewer hand-offs wait in the channel (the fronts queue the rest).
            let _ = socket2::SockRef::from(end).set_send_buffer_size(SEND_BUFFER);
        }
        Ok(Channel { fronts, workers })
    }

    /// The fronts' end.
    pub(crate) fn fronts(&self) -> BorrowedFd<'_> {
        self.fronts.as_fd()
    }

    /// The workers' end.
    pub(crate) fn workers(&self) -> BorrowedFd<'_> {
        self.workers.as_fd()
    }

    /// The end a front does not use (it closes it after the fork).
    pub(crate) fn not_for_fronts(&self) -> RawFd {
        self.workers.as_raw_fd()
    }

    /// The end a worker does not use.
    pub(crate) fn not_for_workers(&self) -> RawFd {
        self.fronts.as_raw_fd()
    }

    /// A stop, once every front is gone (the master holds both ends): the connections a
    /// worker handed back just as the last fronts stopped taking them go to the workers
    /// again, without bytes (each waits for its next request there, or drains), rather
    /// than stay unread until the master exits. Returns how many.
    pub(crate) fn bounce_to_workers(&self) -> usize {
        let mut inbox = Inbox::default();
        let mut n = 0;
        loop {
            match inbox.receive(self.fronts(), false) {
                Ok(Some(r)) => {
                    if send(self.fronts(), r.socket.as_fd(), &r.meta, &[]).is_ok() {
                        n += 1;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {}
                Ok(None) | Err(_) => return n,
            }
        }
    }

    /// A stop, once the workers were told: shuts the fronts' end for writing, so that a
    /// worker waiting on the channel sees its end of file once the messages still there are
    /// taken (a stop signal that landed just before its `recvmsg` would otherwise leave it
    /// asleep until the grace period ends).
    pub(crate) fn shut_for_workers(&self) {
        let _ = socket::shutdown(self.fronts.as_raw_fd(), socket::Shutdown::Write);
    }

    /// The master's last look, once every front and worker has gone: closes the
    /// connections still in the channel, in either direction, and returns how many. None is
    /// left there in a stop or an upgrade's drain (the workers leave only once the channel
    /// is empty), except those of workers killed at the end of the grace period, and a
    /// worker's hand-back sent in the instant between its look at the fronts still taking
    /// them and the last one's exit. They would close with the master anyway: this is so
    /// that the log says how many, rather than nothing.
    pub(crate) fn close_left(&self) -> usize {
        let mut inbox = Inbox::default();
        let mut n = 0;
        for end in [self.workers(), self.fronts()] {
            loop {
                match inbox.receive(end, false) {
                    Ok(Some(_)) => n += 1,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }
        n
    }

    /// Whether no hand-off waits for a worker (`SIOCINQ` on the workers' end, which the
    /// master holds too: the bytes queued for its readers).
    pub(crate) fn empty(&self) -> bool {
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD (SIOCINQ) writes one int through the pointer, which is valid.
        let r = unsafe { libc::ioctl(self.workers.as_raw_fd(), libc::FIONREAD, &mut queued) };
        r != 0 || queued == 0
    }
}

/// Sends `conn` over `channel` with `meta` and `bytes` (at most [`INLINE_MAX`]), without
/// waiting: `WouldBlock` when the channel is full. The sender keeps its own copy of the
/// descriptor, to close once this returns `Ok`.
pub(crate) fn send(
    channel: BorrowedFd<'_>,
    conn: BorrowedFd<'_>,
    meta: &Meta,
    bytes: &[u8],
) -> io::Result<()> {
    debug_assert!(bytes.len() <= INLINE_MAX);
    let header = meta.encode();
    crate::sys::send_with_fds(channel, &[&header, bytes], &[conn.as_raw_fd()], true)
}

/// Sets the connection's blocking mode in one system call (`FIONBIO`): the descriptor's
/// open file is shared by every process that held it, so the receiver sets the mode its
/// loop needs (a worker blocks, a front does not).
pub(crate) fn set_nonblocking(conn: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let mut value: libc::c_int = on.into();
    // SAFETY: FIONBIO reads one int through the pointer, which is valid.
    match unsafe { libc::ioctl(conn.as_raw_fd(), libc::FIONBIO, &mut value) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// A connection received from the channel.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) socket: socket2::Socket,
    pub(crate) meta: Meta,
    /// How many bytes of the request were received into the caller's buffer.
    pub(crate) len: usize,
}

/// The receiving side's reusable space.
#[derive(Debug)]
pub(crate) struct Inbox {
    header: [u8; HEADER],
    bytes: Vec<u8>,
    control: Vec<u8>,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            header: [0; HEADER],
            bytes: vec![0; INLINE_MAX],
            control: nix::cmsg_space!([RawFd; 2]),
        }
    }
}

impl Inbox {
    /// The bytes of the last connection received.
    pub(crate) fn bytes(&self, r: &Received) -> &[u8] {
        &self.bytes[..r.len]
    }

    /// Receives one connection. `wait`: block until one comes (a signal interrupts the
    /// wait: `Interrupted`); otherwise `WouldBlock` when none is there. A message that is not
    /// a hand-off (cannot happen: only appsrv's processes hold the channel) is dropped with
    /// its descriptors, as an `InvalidData` error. `Ok(None)`: the other side closed.
    pub(crate) fn receive(&mut self, channel: BorrowedFd<'_>, wait: bool) -> io::Result<Option<Received>> {
        let mut flags = MsgFlags::MSG_CMSG_CLOEXEC;
        if !wait {
            flags |= MsgFlags::MSG_DONTWAIT;
        }
        let mut iov = [
            IoSliceMut::new(&mut self.header),
            IoSliceMut::new(&mut self.bytes),
        ];
        let msg = socket::recvmsg::<()>(channel.as_raw_fd(), &mut iov, Some(&mut self.control), flags)
            .map_err(io::Error::from)?;
        let mut fds: Vec<OwnedFd> = Vec::new();
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    // SAFETY: the kernel just installed these descriptors in this process
                    // for this message (SCM_RIGHTS); nothing else knows their numbers.
                    fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
        }
        let (bytes, truncated) = (msg.bytes, msg.flags.contains(MsgFlags::MSG_TRUNC));
        if bytes == 0 && fds.is_empty() {
            return Ok(None);
        }
        let meta = (bytes >= HEADER && !truncated)
            .then(|| Meta::decode(&self.header))
            .flatten();
        match (meta, fds.len()) {
            (Some(meta), 1) => Ok(Some(Received {
                socket: socket2::Socket::from(fds.remove(0)),
                meta,
                len: bytes - HEADER,
            })),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a message on the hand-off channel that is not a hand-off",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_connection_travels_with_its_bytes_and_client() {
        let ch = Channel::new().unwrap();
        let (conn, mut client) = UnixStream::pair().unwrap();
        let meta = Meta {
            served: 7,
            peer: Some("203.0.113.9:5555".parse().unwrap()),
            listener: 2,
        };
        send(ch.fronts(), conn.as_fd(), &meta, b"GET / HTTP/1.1\r\n\r\n").unwrap();
        drop(conn);
        assert!(!ch.empty());
        let mut inbox = Inbox::default();
        let got = inbox.receive(ch.workers(), false).unwrap().unwrap();
        assert!(ch.empty());
        assert_eq!(got.meta, meta);
        assert_eq!(inbox.bytes(&got), b"GET / HTTP/1.1\r\n\r\n");
        // The descriptor is the connection, close-on-exec.
        let flags = nix::fcntl::fcntl(got.socket.as_fd(), nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        let mut s = UnixStream::from(OwnedFd::from(got.socket));
        s.write_all(b"hi").unwrap();
        let mut two = [0; 2];
        client.read_exact(&mut two).unwrap();
        assert_eq!(&two, b"hi");
        // Nothing more: the fronts' end never blocks.
        let e = inbox.receive(ch.fronts(), false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn the_masters_last_look_closes_what_is_left_in_either_direction() {
        let ch = Channel::new().unwrap();
        let meta = Meta {
            served: 0,
            peer: None,
            listener: 0,
        };
        let mut clients = Vec::new();
        // Two hand-offs for the workers, one hand-back for the fronts; the fronts' end
        // shut for writing, as at a stop.
        for from in [ch.fronts(), ch.fronts(), ch.workers()] {
            let (conn, client) = UnixStream::pair().unwrap();
            send(from, conn.as_fd(), &meta, b"GET / HTTP/1.1\r\n\r\n").unwrap();
            clients.push(client);
        }
        ch.shut_for_workers();
        assert_eq!(ch.close_left(), 3);
        assert!(ch.empty());
        for mut c in clients {
            let mut buf = [0; 1];
            assert_eq!(
                c.read(&mut buf).unwrap(),
                0,
                "closed: the client sees end of file"
            );
        }
        assert_eq!(ch.close_left(), 0);
    }

    #[test]
    fn the_header_round_trips_ipv6_and_no_client() {
        for meta in [
            Meta {
                served: 0,
                peer: None,
                listener: 0,
            },
            Meta {
                served: u32::MAX,
                peer: Some("[2001:db8::1]:443".parse().unwrap()),
                listener: 7,
            },
        ] {
            assert_eq!(Meta::decode(&meta.encode()), Some(meta));
        }
        assert_eq!(Meta::decode(&[0; HEADER]), None);
    }
}

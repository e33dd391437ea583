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
//! Sequenced packets keep each message whole, and a message's descriptors arrive with it.
//! A front hands off only whole requests, so that no worker ever waits on a client for the
//! rest of one: a message carries up to [`INLINE_MAX`] bytes in itself; more (a large
//! body, gathered by the front) are **spooled** into a memfd (`memfd_create`,
//! `MFD_CLOEXEC`) passed beside the connection in the same `SCM_RIGHTS` message, which the
//! receiver reads and closes. Why not larger messages: a `SOCK_SEQPACKET` message must fit
//! the sender's buffer, which the kernel caps at `net.core.wmem_max` (208 KiB on most
//! systems), below the HTTP codec's default limit of 1 MiB of body; and the channel's
//! buffer is shared by every hand-off waiting for a worker, so one large message would
//! leave room for few others. A spooled hand-off takes a few hundred bytes of it, whatever
//! the request's size; the spool costs one `memfd_create`, one write and one read, against
//! a request of more than 64 KiB. The header says which kind a message is. Nothing here
//! knows about loops or handlers.

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::sys::socket::{self, AddressFamily, SockFlag, SockType};

/// The most bytes of a request a hand-off message carries in itself; more are spooled
/// (see the module's notes).
pub(crate) const INLINE_MAX: usize = 64 * 1024;

/// The header's size on the wire.
const HEADER: usize = 36;
/// The header's first word, which tells a hand-off from anything else.
const MAGIC: u32 = u32::from_le_bytes(*b"APHO");
/// The header's flags (its byte 8): the bytes are spooled (a second descriptor)...
const SPOOLED: u8 = 1;
/// ... and the interim reply of the request in progress went out ([`Meta::interim_sent`]).
const INTERIM_SENT: u8 = 2;
/// The name of a spool (shown in `/proc/PID/fd`).
const SPOOL_NAME: &std::ffi::CStr = c"appsrv-handoff";
/// The send buffer asked for on each end: a few whole-size hand-offs, and many small ones,
/// may wait for a worker (the kernel caps it at `net.core.wmem_max`).
const SEND_BUFFER: usize = 1024 * 1024;

/// What travels with a connection besides its descriptor and bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    /// Requests answered on the connection so far (`--keepalive-requests` counts across
    /// hand-offs).
    pub(crate) served: u32,
    /// The client, when the front learnt it from a PROXY header (otherwise the receiver
    /// asks the socket: a Unix client's path is not carried).
    pub(crate) peer: Option<SocketAddr>,
    /// The index of the listener that accepted it (for its per-connection settings).
    pub(crate) listener: u32,
    /// The interim reply (HTTP's `100 Continue`) of the request in progress was sent
    /// already: the receiver's codec, which is new, must not send it again. Only a worker
    /// that hands a connection back with the beginning of a request sets it (a front hands
    /// off whole requests, to which no interim reply is due).
    pub(crate) interim_sent: bool,
}

impl Meta {
    fn encode(&self, spooled: bool) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4..8].copy_from_slice(&self.served.to_le_bytes());
        h[8] = if spooled { SPOOLED } else { 0 } | if self.interim_sent { INTERIM_SENT } else { 0 };
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

    /// The metadata, and whether the bytes are spooled.
    fn decode(h: &[u8; HEADER]) -> Option<(Meta, bool)> {
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
        let meta = Meta {
            served: word(4),
            peer,
            listener: word(32),
            interim_sent: h[8] & INTERIM_SENT != 0,
        };
        Some((meta, h[8] & SPOOLED != 0))
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
    /// again, with the beginning of a request if one came with them (each waits for its
    /// next request, or the rest of this one, there, or drains), rather than stay unread
    /// until the master exits. Returns how many.
    pub(crate) fn bounce_to_workers(&self) -> usize {
        let mut inbox = Inbox::default();
        let mut n = 0;
        loop {
            match inbox.receive(self.fronts(), false) {
                Ok(Some(r)) => {
                    if send(self.fronts(), r.socket.as_fd(), &r.meta, inbox.bytes(&r)).is_ok() {
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
        !matches!(crate::sys::queued_bytes(self.workers()), Ok(n) if n > 0)
    }
}

/// Sends `conn` over `channel` with `meta` and `bytes` (of any size: more than
/// [`INLINE_MAX`] are spooled), without waiting: `WouldBlock` when the channel is full. The
/// sender keeps its own copy of the descriptor, to close once this returns `Ok`.
pub(crate) fn send(
    channel: BorrowedFd<'_>,
    conn: BorrowedFd<'_>,
    meta: &Meta,
    bytes: &[u8],
) -> io::Result<()> {
    if bytes.len() <= INLINE_MAX {
        let header = meta.encode(false);
        return crate::sys::send_with_fds(channel, &[&header, bytes], &[conn.as_raw_fd()], true);
    }
    // The spool is closed here once sent: the receiver holds the open file then.
    let spool = crate::sys::memfd_with(SPOOL_NAME, bytes).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("spooling a request of {} bytes: {e}", bytes.len()),
        )
    })?;
    let header = meta.encode(true);
    crate::sys::send_with_fds(channel, &[&header], &[conn.as_raw_fd(), spool.as_raw_fd()], true)
}

/// Reads a spool: the whole file, from offset 0 (the sender's writes left the shared file
/// offset at its end).
fn read_spool(spool: OwnedFd) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::from(spool);
    let len = usize::try_from(file.metadata()?.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a spooled hand-off too large"))?;
    let mut bytes = vec![0; len];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes)
}

/// A connection received from the channel.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) socket: socket2::Socket,
    pub(crate) meta: Meta,
    /// How many bytes of the request were received into the inbox (inline).
    len: usize,
    /// The bytes of a spooled hand-off, read from its memfd (which is closed).
    spooled: Option<Vec<u8>>,
}

impl Received {
    /// The connection, its metadata and the bytes that came with it (borrowed from
    /// `inbox` when inline, moved out when spooled).
    pub(crate) fn split(self, inbox: &Inbox) -> (socket2::Socket, Meta, std::borrow::Cow<'_, [u8]>) {
        let bytes = match self.spooled {
            Some(bytes) => std::borrow::Cow::Owned(bytes),
            None => std::borrow::Cow::Borrowed(&inbox.bytes[..self.len]),
        };
        (self.socket, self.meta, bytes)
    }
}

/// The receiving side's reusable space.
#[derive(Debug)]
pub(crate) struct Inbox {
    header: [u8; HEADER],
    bytes: Vec<u8>,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            header: [0; HEADER],
            bytes: vec![0; INLINE_MAX],
        }
    }
}

impl Inbox {
    /// The bytes that came with `r`, the last connection received (inline in the inbox,
    /// or spooled).
    pub(crate) fn bytes<'s>(&'s self, r: &'s Received) -> &'s [u8] {
        match &r.spooled {
            Some(bytes) => bytes,
            None => &self.bytes[..r.len],
        }
    }

    /// Receives one connection (descriptors close-on-exec: `MSG_CMSG_CLOEXEC`), and reads
    /// its spool if it has one. `wait`: block until one comes (a signal interrupts the
    /// wait: `Interrupted`); otherwise `WouldBlock` when none is there. A message that is not
    /// a hand-off (cannot happen: only appsrv's processes hold the channel) is dropped with
    /// its descriptors, as an `InvalidData` error, and so is a hand-off whose spool cannot
    /// be read (its connection closed). `Ok(None)`: the other side closed.
    pub(crate) fn receive(&mut self, channel: BorrowedFd<'_>, wait: bool) -> io::Result<Option<Received>> {
        let mut iov = [
            IoSliceMut::new(&mut self.header),
            IoSliceMut::new(&mut self.bytes),
        ];
        let (bytes, mut fds) = match crate::sys::recv_with_fds(channel, &mut iov, !wait) {
            Ok(received) => received,
            Err(crate::sys::RecvError::Io(e)) => return Err(e),
            // Cut short: not a hand-off (its descriptors are closed).
            Err(_) => return Err(not_a_handoff()),
        };
        if bytes == 0 && fds.is_empty() {
            return Ok(None);
        }
        let meta = (bytes >= HEADER).then(|| Meta::decode(&self.header)).flatten();
        match (meta, fds.len()) {
            (Some((meta, false)), 1) => Ok(Some(Received {
                socket: socket2::Socket::from(fds.remove(0)),
                meta,
                len: bytes - HEADER,
                spooled: None,
            })),
            (Some((meta, true)), 2) if bytes == HEADER => {
                let spool = fds.pop().expect("two descriptors");
                let spooled = read_spool(spool).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("a spooled hand-off that cannot be read ({e})"),
                    )
                })?;
                Ok(Some(Received {
                    socket: socket2::Socket::from(fds.remove(0)),
                    meta,
                    len: 0,
                    spooled: Some(spooled),
                }))
            }
            _ => Err(not_a_handoff()),
        }
    }
}

/// A message on the channel that is not a hand-off (see [`Inbox::receive`]).
fn not_a_handoff() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "a message on the hand-off channel that is not a hand-off",
    )
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
            interim_sent: false,
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
        let meta = Meta::default();
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

    /// Issue 32: a message that is not a hand-off is dropped with every descriptor it
    /// carried, however many: a hand-off's header with three (room was made for the two of
    /// a spooled hand-off only, and the kernel's extra ones stayed open, unlisted), and a
    /// message too long for the inbox.
    #[test]
    fn issue_32_a_stray_message_is_dropped_with_all_its_descriptors() {
        let ch = Channel::new().unwrap();
        let meta = Meta::default();
        let mut inbox = Inbox::default();
        let too_long = vec![0u8; HEADER + INLINE_MAX + 1];
        for (header, bytes, n) in [
            (meta.encode(false), &[][..], 3),
            (meta.encode(false), &too_long[..], 1),
        ] {
            let (probe, copies) = crate::sys::Probe::new(n);
            let raw: Vec<RawFd> = copies.iter().map(AsRawFd::as_raw_fd).collect();
            crate::sys::send_with_fds(ch.fronts(), &[&header, bytes], &raw, true).unwrap();
            drop(copies);
            let e = inbox.receive(ch.workers(), false).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert!(
                probe.all_closed(),
                "a descriptor of the stray message was left open"
            );
        }
        // The channel still works.
        let (conn, _client) = UnixStream::pair().unwrap();
        send(ch.fronts(), conn.as_fd(), &meta, b"x").unwrap();
        assert!(inbox.receive(ch.workers(), false).unwrap().is_some());
    }

    #[test]
    fn the_header_round_trips_ipv6_and_no_client() {
        for meta in [
            Meta::default(),
            Meta {
                served: u32::MAX,
                peer: Some("[2001:db8::1]:443".parse().unwrap()),
                listener: 7,
                interim_sent: true,
            },
        ] {
            for spooled in [false, true] {
                assert_eq!(Meta::decode(&meta.encode(spooled)), Some((meta.clone(), spooled)));
            }
        }
        assert_eq!(Meta::decode(&[0; HEADER]), None);
    }

    /// The memfds named as spools that this process holds.
    fn spools_open() -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().contains("appsrv-handoff"))
            .count()
    }

    /// Issue 31: a request larger than a message can hold travels whole, spooled, with its
    /// connection: byte for byte, the spool closed on both sides once received; and large
    /// hand-offs take little of the channel's buffer (twenty of 300 KB wait in it at once,
    /// where a message holds at most 64 KiB and the buffer about 1 MiB).
    #[test]
    fn issue_31_a_large_request_travels_whole_in_a_spool() {
        let ch = Channel::new().unwrap();
        let request: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut clients = Vec::new();
        for served in 0..20 {
            let (conn, client) = UnixStream::pair().unwrap();
            let meta = Meta {
                served,
                peer: None,
                listener: 1,
                interim_sent: served % 2 == 1,
            };
            send(ch.fronts(), conn.as_fd(), &meta, &request).unwrap();
            clients.push(client);
        }
        assert_eq!(spools_open(), 0, "the sender closed its spools");
        let mut inbox = Inbox::default();
        for served in 0..20 {
            let got = inbox.receive(ch.workers(), false).unwrap().unwrap();
            assert_eq!(got.meta.served, served);
            assert_eq!(got.meta.interim_sent, served % 2 == 1);
            assert!(inbox.bytes(&got) == request.as_slice(), "the bytes as sent");
            // The descriptor is the connection.
            let mut s = UnixStream::from(OwnedFd::from(got.socket));
            s.write_all(b"hi").unwrap();
            let mut two = [0; 2];
            clients[served as usize].read_exact(&mut two).unwrap();
            assert_eq!(&two, b"hi");
        }
        assert!(ch.empty());
        assert_eq!(spools_open(), 0, "the receiver closed the spools it read");
        // At the limit, still inline: no spool.
        let (conn, _client) = UnixStream::pair().unwrap();
        let meta = Meta::default();
        send(ch.fronts(), conn.as_fd(), &meta, &request[..INLINE_MAX]).unwrap();
        let got = inbox.receive(ch.workers(), false).unwrap().unwrap();
        assert!(got.spooled.is_none());
        assert_eq!(inbox.bytes(&got), &request[..INLINE_MAX]);
    }
}

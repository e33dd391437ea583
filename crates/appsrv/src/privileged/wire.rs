//! The channel between a worker and its privileged helper: one `SOCK_SEQPACKET` socket
//! pair, so that each message keeps its boundaries (a message cut short or one too long
//! for the receiver is seen as such, and never desynchronises the next one).
//!
//! A message is a 16-byte header, then `len` bytes of postcard (serde) payload:
//!
//! ```text
//! magic "APv1" | kind u8 | 0 0 0 | seq u32 (little endian) | len u32
//! ```
//!
//! with the descriptors it carries (an [`Fd`] in the payload is an index into them) as
//! `SCM_RIGHTS`. The receiver checks the magic, that the datagram is exactly `16 + len`
//! bytes, that `len` is at most [`MAX_MESSAGE`], that it was not truncated (`MSG_TRUNC`),
//! and that its descriptors fit (`MSG_CTRUNC`); anything else is a [`WireError`], and the
//! descriptors that came with it are closed.

use std::cell::RefCell;
use std::fmt;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::{self, SockFlag, SockType};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::sys::RecvError;

/// The largest payload of one message, request or response: 1 MiB.
pub const MAX_MESSAGE: usize = 1 << 20;
/// The most descriptors one message carries.
pub(crate) const MAX_FDS: usize = 16;
const HEADER: usize = 16;
const MAGIC: &[u8; 4] = b"APv1";

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// Worker → helper: a request.
    Request = 1,
    /// Helper → worker: the response to the request with the same sequence number.
    Response = 2,
    /// Helper → worker: the request with this sequence number was refused (the payload is
    /// the reason, a string).
    Refused = 3,
    /// Helper → worker, once: the helper is ready (its factory succeeded).
    Ready = 4,
    /// Helper → worker, once: the helper could not start (the payload is the reason).
    Failed = 5,
    /// Worker → helper: the log file the master reopened on USR1 (one descriptor, for the
    /// helper's stderr); no answer.
    Log = 6,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Request,
            2 => Kind::Response,
            3 => Kind::Refused,
            4 => Kind::Ready,
            5 => Kind::Failed,
            6 => Kind::Log,
            _ => return None,
        })
    }
}

/// A message as received: its header, its payload and its descriptors.
#[derive(Debug)]
pub(crate) struct Message {
    pub(crate) kind: Kind,
    pub(crate) seq: u32,
    pub(crate) payload: Vec<u8>,
    pub(crate) fds: Vec<OwnedFd>,
}

/// Why a message was not received.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The other end closed the channel.
    Closed,
    /// Nothing arrived in time (non-blocking: nothing waiting).
    WouldBlock,
    /// A message was received but is not one: the reason, for the log, and its sequence
    /// number when its header was readable (to refuse that request by number).
    Malformed {
        /// The header's sequence number, if the header was readable.
        seq: Option<u32>,
        /// What is wrong.
        why: String,
    },
    /// The system call failed.
    Io(io::Error),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Closed => f.write_str("the channel is closed"),
            WireError::WouldBlock => f.write_str("no message"),
            WireError::Malformed { why, .. } => write!(f, "malformed message: {why}"),
            WireError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// A new channel: `(the worker's end, the helper's end)`, both close-on-exec. Their send
/// buffers are raised so that a message of [`MAX_MESSAGE`] fits (a datagram must fit the
/// sender's buffer whole); as root the limit `net.core.wmem_max` does not apply.
pub(crate) fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (a, b) = socket::socketpair(
        socket::AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    for end in [&a, &b] {
        let s = socket2::SockRef::from(end);
        let want = 2 * (MAX_MESSAGE + HEADER);
        // SO_SNDBUFFORCE needs CAP_NET_ADMIN (the worker is root here); without it, the
        // plain option, capped by wmem_max.
        let forced = nix::sys::socket::setsockopt(end, nix::sys::socket::sockopt::SndBufForce, &want);
        if forced.is_err() {
            let _ = s.set_send_buffer_size(want);
        }
        let _ = nix::sys::socket::setsockopt(end, nix::sys::socket::sockopt::RcvBufForce, &want);
    }
    Ok((a, b))
}

thread_local! {
    /// The descriptors of the [`Fd`]s serialized into the message being encoded.
    static OUTGOING: RefCell<Vec<RawFd>> = const { RefCell::new(Vec::new()) };
    /// The descriptors of the message being decoded, taken by its [`Fd`]s.
    static INCOMING: RefCell<Vec<Option<OwnedFd>>> = const { RefCell::new(Vec::new()) };
}

/// A descriptor in a request or a response (an opened file, a socket bound to a low port):
/// it travels as `SCM_RIGHTS`, and the receiver gets its own descriptor for the same open
/// file, close-on-exec. At most 16 per message.
///
/// ```no_run
/// #[derive(serde::Serialize, serde::Deserialize)]
/// enum Response {
///     Opened(appsrv::privileged::Fd),
///     Denied(String),
/// }
///
/// // In the helper: a file the worker could not open, handed over.
/// fn open_log() -> Response {
///     match std::fs::File::open("/var/log/app/today.log") {
///         Ok(file) => Response::Opened(std::os::fd::OwnedFd::from(file).into()),
///         Err(e) => Response::Denied(e.to_string()),
///     }
/// }
/// # let _ = open_log();
/// ```
#[derive(Debug)]
pub struct Fd(pub OwnedFd);

impl Fd {
    /// The descriptor.
    pub fn into_inner(self) -> OwnedFd {
        self.0
    }
}

impl From<OwnedFd> for Fd {
    fn from(fd: OwnedFd) -> Fd {
        Fd(fd)
    }
}

impl AsFd for Fd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Serialize for Fd {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let index = OUTGOING.with(|out| {
            let mut out = out.borrow_mut();
            out.push(self.0.as_raw_fd());
            out.len() - 1
        });
        if index >= MAX_FDS {
            return Err(serde::ser::Error::custom(format!(
                "more than {MAX_FDS} descriptors in one message"
            )));
        }
        s.serialize_u32(index as u32)
    }
}

impl<'de> Deserialize<'de> for Fd {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Fd, D::Error> {
        let index = u32::deserialize(d)? as usize;
        INCOMING
            .with(|fds| fds.borrow_mut().get_mut(index).and_then(Option::take))
            .map(Fd)
            .ok_or_else(|| {
                serde::de::Error::custom(format!("no descriptor {index} in the message (or named twice)"))
            })
    }
}

/// Encodes `value` and sends it as one message of `kind` on `to`. Blocks while the
/// receiver's queue is full (a busy helper: the worker waits for it, as for any call).
pub(crate) fn send<T: Serialize>(to: BorrowedFd<'_>, kind: Kind, seq: u32, value: &T) -> io::Result<()> {
    send_with(to, kind, seq, value, false)
}

/// [`send`], or with `dontwait` without blocking: a full queue is `WouldBlock` (an async
/// worker's call, which waits for the socket on its runtime instead).
pub(crate) fn send_with<T: Serialize>(
    to: BorrowedFd<'_>,
    kind: Kind,
    seq: u32,
    value: &T,
    dontwait: bool,
) -> io::Result<()> {
    OUTGOING.with(|out| out.borrow_mut().clear());
    let encoded = postcard::to_stdvec(value);
    let fds = OUTGOING.with(|out| std::mem::take(&mut *out.borrow_mut()));
    let payload =
        encoded.map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("encoding: {e}")))?;
    if payload.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a message of {} bytes is over the limit of {MAX_MESSAGE}",
                payload.len()
            ),
        ));
    }
    send_raw_with(to, kind, seq, &payload, &fds, dontwait)
}

/// Sends one message as it is (the header is built here): for [`send`], and for tests that
/// forge messages.
pub(crate) fn send_raw(
    to: BorrowedFd<'_>,
    kind: Kind,
    seq: u32,
    payload: &[u8],
    fds: &[RawFd],
) -> io::Result<()> {
    send_raw_with(to, kind, seq, payload, fds, false)
}

/// [`send_raw`], with `MSG_DONTWAIT` when `dontwait`.
fn send_raw_with(
    to: BorrowedFd<'_>,
    kind: Kind,
    seq: u32,
    payload: &[u8],
    fds: &[RawFd],
    dontwait: bool,
) -> io::Result<()> {
    let mut header = [0u8; HEADER];
    header[..4].copy_from_slice(MAGIC);
    header[4] = kind as u8;
    header[8..12].copy_from_slice(&seq.to_le_bytes());
    header[12..16].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    if dontwait {
        crate::sys::send_with_fds(to, &[&header, payload], fds, true)
    } else {
        send_bytes(to, &[&header, payload], fds)
    }
}

/// Sends the concatenation of `parts` as one datagram with `fds`.
pub(crate) fn send_bytes(to: BorrowedFd<'_>, parts: &[&[u8]], fds: &[RawFd]) -> io::Result<()> {
    crate::sys::send_with_fds(to, parts, fds, false)
}

/// Receives one message from `from` (blocking, unless the socket is non-blocking). `buf`
/// is reused between calls. A signal's interruption is retried.
pub(crate) fn recv(from: BorrowedFd<'_>, buf: &mut Vec<u8>) -> Result<Message, WireError> {
    recv_with(from, buf, false)
}

/// [`recv`], or with `dontwait` without blocking (no message is `WouldBlock`).
pub(crate) fn recv_with(
    from: BorrowedFd<'_>,
    buf: &mut Vec<u8>,
    dontwait: bool,
) -> Result<Message, WireError> {
    buf.resize(HEADER + MAX_MESSAGE + 1, 0);
    // `sys::recv_with_fds` has room for as many descriptors as the kernel passes in one
    // message (SCM_MAX_FD, 253), not only MAX_FDS: all are owned there, and closed with a
    // message that has too many.
    let received = loop {
        let mut iov = [IoSliceMut::new(buf)];
        match crate::sys::recv_with_fds(from, &mut iov, dontwait) {
            Err(RecvError::Io(e)) => match Errno::from_raw(e.raw_os_error().unwrap_or(0)) {
                Errno::EINTR => {}
                Errno::EAGAIN => return Err(WireError::WouldBlock),
                Errno::ECONNRESET => return Err(WireError::Closed),
                _ => return Err(WireError::Io(e)),
            },
            other => break other,
        }
    };
    let seq_in = |len: usize| header_seq(&buf[..len.min(buf.len())]);
    let (bytes, fds) = match received {
        Ok(message) => message,
        Err(RecvError::Truncated { len }) => {
            return Err(WireError::Malformed {
                seq: seq_in(len),
                why: format!("over the limit of {MAX_MESSAGE} bytes"),
            });
        }
        Err(RecvError::FdsTruncated { len }) => {
            return Err(WireError::Malformed {
                seq: seq_in(len),
                why: format!("more than {MAX_FDS} descriptors"),
            });
        }
        Err(RecvError::Io(e)) => return Err(WireError::Io(e)),
    };
    if bytes == 0 && fds.is_empty() {
        // End of file, or an empty datagram (SEQPACKET has them): only a closed peer
        // leaves the socket hung up.
        let mut poll = [nix::poll::PollFd::new(from, nix::poll::PollFlags::POLLIN)];
        let hung_up = nix::poll::poll(&mut poll, nix::poll::PollTimeout::ZERO).is_ok()
            && poll[0]
                .revents()
                .is_some_and(|r| r.contains(nix::poll::PollFlags::POLLHUP));
        if hung_up {
            return Err(WireError::Closed);
        }
        return Err(WireError::Malformed {
            seq: None,
            why: "an empty message".into(),
        });
    }
    let seq = seq_in(bytes);
    let bad = |why: String| Err(WireError::Malformed { seq, why });
    if bytes > HEADER + MAX_MESSAGE {
        return bad(format!("over the limit of {MAX_MESSAGE} bytes"));
    }
    if fds.len() > MAX_FDS {
        return bad(format!("more than {MAX_FDS} descriptors"));
    }
    parse(&buf[..bytes], fds)
}

/// The sequence number of a datagram whose header starts well.
fn header_seq(datagram: &[u8]) -> Option<u32> {
    (datagram.len() >= 12 && &datagram[..4] == MAGIC)
        .then(|| u32::from_le_bytes(datagram[8..12].try_into().expect("4 bytes")))
}

/// Checks and splits one received datagram.
pub(crate) fn parse(datagram: &[u8], fds: Vec<OwnedFd>) -> Result<Message, WireError> {
    let seq = header_seq(datagram);
    let bad = |why: String| Err(WireError::Malformed { seq, why });
    if datagram.len() < HEADER {
        return bad(format!(
            "{} bytes, shorter than the {HEADER}-byte header",
            datagram.len()
        ));
    }
    if &datagram[..4] != MAGIC {
        return bad("no APv1 header".into());
    }
    let Some(kind) = Kind::from_u8(datagram[4]) else {
        return bad(format!("unknown kind {}", datagram[4]));
    };
    let seq = u32::from_le_bytes(datagram[8..12].try_into().expect("4 bytes"));
    let len = u32::from_le_bytes(datagram[12..16].try_into().expect("4 bytes")) as usize;
    if len > MAX_MESSAGE {
        return bad(format!(
            "a length of {len} bytes, over the limit of {MAX_MESSAGE}"
        ));
    }
    let got = datagram.len() - HEADER;
    if got != len {
        return bad(format!(
            "truncated: {got} bytes of the {len} its header announces"
        ));
    }
    Ok(Message {
        kind,
        seq,
        payload: datagram[HEADER..].to_vec(),
        fds,
    })
}

/// Decodes a payload, handing its [`Fd`]s the message's descriptors (those it does not
/// name are closed). The payload must be exactly one `T`: bytes left over after it are an
/// error (`postcard::from_bytes` would ignore them), as the header's length announced the
/// whole payload.
pub(crate) fn decode<T: DeserializeOwned>(payload: &[u8], fds: Vec<OwnedFd>) -> Result<T, String> {
    INCOMING.with(|incoming| *incoming.borrow_mut() = fds.into_iter().map(Some).collect());
    let decoded = match postcard::take_from_bytes(payload) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(format!("{} bytes left over after the value", rest.len())),
        Err(e) => Err(e.to_string()),
    };
    INCOMING.with(|incoming| incoming.borrow_mut().clear());
    decoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips_with_its_descriptors() {
        let (a, b) = pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let value = (String::from("open"), Fd(OwnedFd::from(file)), 7u64);
        send(a.as_fd(), Kind::Request, 9, &value).unwrap();
        let mut buf = Vec::new();
        let msg = recv(b.as_fd(), &mut buf).unwrap();
        assert_eq!((msg.kind, msg.seq, msg.fds.len()), (Kind::Request, 9, 1));
        let (op, fd, n): (String, Fd, u64) = decode(&msg.payload, msg.fds).unwrap();
        assert_eq!((op.as_str(), n), ("open", 7));
        // The descriptor received is close-on-exec, and names /dev/null.
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert!(flags & libc::FD_CLOEXEC != 0);
        let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd())).unwrap();
        assert_eq!(target, std::path::Path::new("/dev/null"));
    }

    #[test]
    fn bad_datagrams_are_refused_with_the_reason() {
        let (a, b) = pair().unwrap();
        let mut buf = Vec::new();
        let expect = |sent: &[&[u8]], needle: &str, buf: &mut Vec<u8>| {
            send_bytes(a.as_fd(), sent, &[]).unwrap();
            match recv(b.as_fd(), buf) {
                Err(WireError::Malformed { why, .. }) => assert!(why.contains(needle), "{why}"),
                other => panic!("{other:?}"),
            }
        };
        expect(&[b"APv1"], "shorter than", &mut buf);
        expect(&[b"XXXX\x01\0\0\0\0\0\0\0\0\0\0\0"], "no APv1 header", &mut buf);
        expect(&[b"APv1\x09\0\0\0\0\0\0\0\0\0\0\0"], "unknown kind 9", &mut buf);
        expect(
            &[b"APv1\x01\0\0\0\0\0\0\0\x10\0\0\0", b"abc"],
            "truncated: 3 bytes of the 16",
            &mut buf,
        );
        expect(
            &[b"APv1\x01\0\0\0\0\0\0\0\xff\xff\xff\x7f"],
            "over the limit",
            &mut buf,
        );
        let big = vec![0u8; MAX_MESSAGE + 100];
        expect(
            &[b"APv1\x01\0\0\0\0\0\0\0\0\0\0\0", &big],
            "over the limit",
            &mut buf,
        );
        // A good message still goes through after all of them.
        send(a.as_fd(), Kind::Request, 1, &5u8).unwrap();
        let msg = recv(b.as_fd(), &mut buf).unwrap();
        assert_eq!(decode::<u8>(&msg.payload, msg.fds).unwrap(), 5);
        // A payload that does not decode as the type is the decoder's error.
        assert!(decode::<(String, u64)>(&[0xff, 0xff, 0xff], Vec::new()).is_err());
        // An empty datagram is not the end of the channel.
        expect(&[], "an empty message", &mut buf);
        // Too many descriptors: refused, and every one the kernel installed is closed.
        let before = std::fs::read_dir("/proc/self/fd").unwrap().count();
        let null = std::fs::File::open("/dev/null").unwrap();
        let many = vec![null.as_raw_fd(); 20];
        send_raw(a.as_fd(), Kind::Request, 8, b"", &many).unwrap();
        match recv(b.as_fd(), &mut buf) {
            Err(WireError::Malformed { why, .. }) => assert!(why.contains("more than 16"), "{why}"),
            other => panic!("{other:?}"),
        }
        drop(null);
        assert_eq!(std::fs::read_dir("/proc/self/fd").unwrap().count(), before);
        drop(a);
        assert!(matches!(recv(b.as_fd(), &mut buf), Err(WireError::Closed)));
    }

    /// The request type of the property test below and of the fuzz target
    /// `privileged_message`: strings, a sequence, a varint and an optional descriptor.
    type Request = (String, Vec<String>, u64, Option<Fd>);

    /// A [`Request`] as read, its descriptor reduced to whether it had one.
    type Read = (String, Vec<String>, u64, bool);

    /// A datagram with a well-formed header of `kind` and `seq` announcing `payload`.
    fn framed(kind: u8, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut d = Vec::with_capacity(HEADER + payload.len());
        d.extend_from_slice(MAGIC);
        d.extend_from_slice(&[kind, 0, 0, 0]);
        d.extend_from_slice(&seq.to_le_bytes());
        d.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        d.extend_from_slice(payload);
        d
    }

    /// Runs the helper's reading of one datagram (`helper::read_request`, as the fuzz target
    /// does) with `fds` descriptors, each a copy of one pipe's write end: once the result is
    /// dropped, the pipe's read end sees its end only if every descriptor was closed (those
    /// the request did not name, and the one it did). Returns what the reading returned,
    /// the descriptor aside.
    fn read_one(datagram: &[u8], fds: usize) -> Result<(u32, Read), (u32, String)> {
        let (rd, wr) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        let copies = (0..fds).map(|_| wr.try_clone().unwrap()).collect();
        drop(wr);
        let read = super::super::read_request::<Request>(datagram, copies);
        let seq = header_seq(datagram);
        let read = match read {
            Ok((s, (a, b, c, fd))) => {
                // Only a request whose header is right, and whose payload is the rest.
                assert_eq!(&datagram[..4], MAGIC);
                assert_eq!(datagram[4], Kind::Request as u8);
                assert_eq!(Some(s), seq);
                assert_eq!(
                    datagram.len() - HEADER,
                    u32::from_le_bytes(datagram[12..16].try_into().unwrap()) as usize
                );
                Ok((s, (a, b, c, fd.is_some())))
            }
            Err((s, why)) => {
                assert!(!why.is_empty());
                assert_eq!(s, seq.unwrap_or(0));
                Err((s, why))
            }
        };
        // Every copy of the write end closed: end of file. Another test thread that forks
        // (to run a command) can hold a copy between its fork and its exec, which closes
        // it: wait for that, with a deadline, rather than fail for it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut byte = [0u8; 1];
        loop {
            match nix::unistd::read(&rd, &mut byte) {
                Err(nix::errno::Errno::EAGAIN) if std::time::Instant::now() < deadline => {
                    let mut fds = [nix::poll::PollFd::new(rd.as_fd(), nix::poll::PollFlags::POLLIN)];
                    let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10u8));
                }
                r => {
                    assert_eq!(r, Ok(0), "a descriptor of the message was left open");
                    break;
                }
            }
        }
        read
    }

    /// The same descriptor-free request as postcard encodes it (an `Fd` is its index, a u32).
    fn encoded(a: &str, b: &[String], c: u64, fd: Option<u32>) -> Vec<u8> {
        postcard::to_stdvec(&(a, b, c, fd)).unwrap()
    }

    proptest::proptest! {
        /// Issue #18: arbitrary bytes as a received datagram never panic and never leak a
        /// descriptor; what is accepted is a well-framed request.
        #[test]
        fn issue_18_any_datagram_is_read_or_refused(
            datagram in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            fds in 0usize..4,
        ) {
            let _ = read_one(&datagram, fds);
        }

        /// Issue #18: a well-formed header around arbitrary bytes (the payload the decoder
        /// sees), of any kind: no panic, no leak; only a request can be accepted.
        #[test]
        fn issue_18_any_payload_is_decoded_or_refused(
            kind in 0u8..8,
            seq in proptest::prelude::any::<u32>(),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128),
            fds in 0usize..4,
        ) {
            let read = read_one(&framed(kind, seq, &payload), fds);
            if kind != Kind::Request as u8 {
                proptest::prop_assert!(read.is_err());
            }
        }

        /// Issue #18: an encoded request decodes to itself with its descriptor; cut short or
        /// followed by anything, it is refused under its sequence number.
        #[test]
        fn issue_18_requests_decode_and_damaged_ones_are_refused(
            a in ".{0,12}",
            b in proptest::collection::vec(".{0,6}", 0..4),
            c in proptest::prelude::any::<u64>(),
            with_fd in proptest::prelude::any::<bool>(),
            seq in proptest::prelude::any::<u32>(),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
            extra in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..8),
        ) {
            let payload = encoded(&a, &b, c, with_fd.then_some(0));
            let fds = usize::from(with_fd);
            proptest::prop_assert_eq!(
                read_one(&framed(1, seq, &payload), fds),
                Ok((seq, (a, b, c, with_fd)))
            );
            let short = &payload[..cut.index(payload.len())];
            proptest::prop_assert!(read_one(&framed(1, seq, short), fds).is_err());
            let long = [&payload[..], &extra].concat();
            let refused = read_one(&framed(1, seq, &long), fds);
            proptest::prop_assert!(
                matches!(&refused, Err((s, why)) if *s == seq && why.contains("left over")),
                "{:?}", refused
            );
        }
    }
}

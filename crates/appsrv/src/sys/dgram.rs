//! Batched datagram I/O: `recvmmsg(2)` and `sendmmsg(2)` over one batch of buffers, with
//! the destination address of each datagram (`IP_PKTINFO`, `IPV6_PKTINFO`) so that an
//! answer leaves from the address its query came to.
//!
//! Why batches: a datagram server's cost is its system calls (some 2 µs each here, against
//! a few hundred nanoseconds to answer a DNS query from memory). One `recvmmsg` takes up to
//! [`Batch::capacity`] datagrams that are already queued, and one `sendmmsg` sends all their
//! answers: under load, fewer than one system call per datagram. When the socket holds a
//! single datagram the batch costs what `recvfrom` + `sendto` would.
//!
//! The buffers are allocated once per worker and reused: each slot has room for the largest
//! accepted datagram (`--max-datagram-size`); a longer one arrives cut, flagged
//! `MSG_TRUNC`, and is reported as such (and dropped by the caller). Pages of a slot that
//! no datagram ever reached are never touched, so a large limit costs address space, not
//! memory.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::PathBuf;

/// Room for the control messages of a wildcard socket (a packet-info message of either
/// kind, `in6_pktinfo`'s being the larger: `CMSG_SPACE(20)` = 40 bytes on 64-bit Linux, with
/// room to spare for another option an inherited socket may have set), in `u64`s for the
/// alignment `cmsghdr` needs. A message cut short for lack of room (`MSG_CTRUNC`) gives no
/// destination.
const CONTROL_WORDS: usize = 16;

/// Where a datagram was sent to, on a wildcard socket: its answer's source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Destination {
    V4(Ipv4Addr),
    /// The address and the interface it came in on (needed to answer from a link-local
    /// address).
    V6(Ipv6Addr, u32),
}

impl Destination {
    pub(crate) fn ip(&self) -> IpAddr {
        match self {
            Destination::V4(a) => IpAddr::V4(*a),
            Destination::V6(a, _) => IpAddr::V6(*a),
        }
    }
}

/// The sender of a datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    Inet(SocketAddr),
    /// A Unix datagram socket's path, if the sender bound one (an unbound sender cannot be
    /// answered).
    Unix(Option<PathBuf>),
}

/// One received datagram, as [`Batch::get`] reports it.
#[derive(Debug)]
pub(crate) struct Received<'a> {
    pub(crate) data: &'a [u8],
    /// Longer than the slot: `data` is its beginning only.
    pub(crate) truncated: bool,
    pub(crate) source: Source,
    pub(crate) destination: Option<Destination>,
}

/// A worker's batch: receive buffers, their senders' addresses and control messages, and
/// one answer buffer per slot.
pub(crate) struct Batch {
    size: usize,
    data: Vec<u8>,
    names: Vec<libc::sockaddr_storage>,
    controls: Vec<[u64; CONTROL_WORDS]>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// How many of the slots the last receive filled.
    filled: usize,
    /// The answers, one per slot: empty means no answer.
    pub(crate) answers: Vec<Vec<u8>>,
    /// The sending side's headers, vectors and control messages.
    out_hdrs: Vec<libc::mmsghdr>,
    out_iovs: Vec<libc::iovec>,
    out_controls: Vec<[u64; CONTROL_WORDS]>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("capacity", &self.hdrs.len())
            .field("size", &self.size)
            .field("filled", &self.filled)
            .finish_non_exhaustive()
    }
}

/// What a send of the answers did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sent {
    pub(crate) datagrams: u64,
    pub(crate) bytes: u64,
    /// Answers the kernel refused (a full send buffer, an unreachable sender).
    pub(crate) failed: u64,
    /// The first refusal's error, for the log.
    pub(crate) error: Option<i32>,
}

impl Batch {
    /// A batch of `capacity` slots of `size` bytes each.
    pub(crate) fn new(capacity: usize, size: usize) -> Batch {
        let capacity = capacity.max(1);
        let size = size.max(1);
        // SAFETY: sockaddr_storage, iovec and mmsghdr are plain C data, valid when zeroed
        // (null pointers and zero lengths until each call points them at the buffers).
        let zeroed_storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let zeroed_hdr: libc::mmsghdr = unsafe { std::mem::zeroed() };
        let zeroed_iov = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let mut batch = Batch {
            size,
            data: vec![0; capacity * size],
            names: vec![zeroed_storage; capacity],
            controls: vec![[0; CONTROL_WORDS]; capacity],
            iovs: vec![zeroed_iov; capacity],
            hdrs: vec![zeroed_hdr; capacity],
            filled: 0,
            answers: (0..capacity).map(|_| Vec::new()).collect(),
            out_hdrs: vec![zeroed_hdr; capacity],
            out_iovs: vec![zeroed_iov; capacity],
            out_controls: vec![[0; CONTROL_WORDS]; capacity],
        };
        // The receive headers point at the slots' buffers once: the vectors are never
        // resized, so their heap storage (which the pointers name) stays where it is when
        // the batch moves. `receive` resets only what the kernel writes back.
        for i in 0..capacity {
            batch.iovs[i] = libc::iovec {
                // SAFETY: slot i lies inside `data` (capacity × size bytes).
                iov_base: unsafe { batch.data.as_mut_ptr().add(i * size) }.cast(),
                iov_len: size,
            };
            let h = &mut batch.hdrs[i].msg_hdr;
            h.msg_name = (&mut batch.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut batch.iovs[i];
            h.msg_iovlen = 1;
        }
        batch
    }

    /// The number of slots.
    pub(crate) fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Receives what the socket holds, up to the capacity, without waiting; returns how many
    /// datagrams arrived (0: none queued). The answers are cleared. `control`: whether to
    /// take control messages (a wildcard UDP socket's packet info). Without, none is taken:
    /// descriptors a Unix datagram sender attaches (`SCM_RIGHTS`) are then closed by the
    /// kernel, never installed in this process (a sender could fill its descriptor table).
    pub(crate) fn receive(&mut self, fd: BorrowedFd<'_>, control: bool) -> io::Result<usize> {
        let n = self.capacity();
        for i in 0..n {
            let h = &mut self.hdrs[i];
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            if control {
                h.msg_hdr.msg_control = self.controls[i].as_mut_ptr().cast();
                h.msg_hdr.msg_controllen = std::mem::size_of::<[u64; CONTROL_WORDS]>() as _;
            } else {
                h.msg_hdr.msg_control = std::ptr::null_mut();
                h.msg_hdr.msg_controllen = 0;
            }
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        for a in &mut self.answers[..self.filled] {
            a.clear();
        }
        self.filled = 0;
        // SAFETY: every header points at buffers of this batch (set in `new`, never
        // reallocated) that outlive the call, with their true lengths; the kernel writes at
        // most those lengths.
        let r = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                // Close-on-exec for any descriptor that still comes (rule 6).
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        self.filled = r as usize;
        Ok(self.filled)
    }

    /// Datagram `i` of the last receive.
    #[cfg(test)]
    fn get(&self, i: usize) -> Received<'_> {
        received(self.size, &self.data, &self.names[i], &self.hdrs[i], i)
    }

    /// Datagram `i` of the last receive, and its answer buffer.
    pub(crate) fn slot(&mut self, i: usize) -> (Received<'_>, &mut Vec<u8>) {
        (
            received(self.size, &self.data, &self.names[i], &self.hdrs[i], i),
            &mut self.answers[i],
        )
    }

    /// Sends the non-empty answers of the last receive's slots, each to the sender of its
    /// slot (and from the address it came to, for a wildcard socket), in as few
    /// `sendmmsg` calls as the kernel allows. An answer the kernel refuses is counted and
    /// skipped: the others still go out.
    pub(crate) fn send_answers(&mut self, fd: BorrowedFd<'_>) -> Sent {
        let mut sent = Sent::default();
        let mut count = 0;
        for i in 0..self.filled {
            if self.answers[i].is_empty() {
                continue;
            }
            let h = &self.hdrs[i].msg_hdr;
            self.out_iovs[count] = libc::iovec {
                iov_base: self.answers[i].as_mut_ptr().cast(),
                iov_len: self.answers[i].len(),
            };
            let (control, controllen) = match destination(h) {
                Some(d) => {
                    let len = write_pktinfo(&mut self.out_controls[count], d);
                    (self.out_controls[count].as_mut_ptr().cast(), len)
                }
                None => (std::ptr::null_mut(), 0),
            };
            let o = &mut self.out_hdrs[count];
            o.msg_hdr.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
            o.msg_hdr.msg_namelen = h.msg_namelen;
            o.msg_hdr.msg_iov = &mut self.out_iovs[count];
            o.msg_hdr.msg_iovlen = 1;
            o.msg_hdr.msg_control = control;
            o.msg_hdr.msg_controllen = controllen as _;
            o.msg_hdr.msg_flags = 0;
            o.msg_len = 0;
            count += 1;
        }
        let mut at = 0;
        while at < count {
            // SAFETY: headers at..count point at this batch's names, answers and control
            // buffers, which outlive the call, with their true lengths.
            let r = unsafe {
                libc::sendmmsg(
                    fd.as_raw_fd(),
                    self.out_hdrs[at..].as_mut_ptr(),
                    (count - at) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                for h in &self.out_hdrs[at..at + r as usize] {
                    sent.bytes += u64::from(h.msg_len);
                }
                sent.datagrams += r as u64;
                at += r as usize;
            } else {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // The message at `at` was refused: skip it, send the rest.
                sent.failed += 1;
                sent.error.get_or_insert(e.raw_os_error().unwrap_or(0));
                at += 1;
            }
        }
        sent
    }
}

/// Slot `i` of a batch whose slots are `size` bytes of `data`, as the kernel filled in its
/// header and sender's address.
fn received<'a>(
    size: usize,
    data: &'a [u8],
    name: &libc::sockaddr_storage,
    hdr: &libc::mmsghdr,
    i: usize,
) -> Received<'a> {
    let len = (hdr.msg_len as usize).min(size);
    Received {
        data: &data[i * size..i * size + len],
        truncated: hdr.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
        source: source(name, hdr.msg_hdr.msg_namelen),
        destination: destination(&hdr.msg_hdr),
    }
}

/// Asks the kernel for each datagram's destination address on a wildcard socket.
pub(crate) fn set_recv_pktinfo(fd: BorrowedFd<'_>, v6: bool) -> io::Result<()> {
    let on: libc::c_int = 1;
    let (level, name) = if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO)
    } else {
        (libc::IPPROTO_IP, libc::IP_PKTINFO)
    };
    // SAFETY: `on` is a c_int that lives through the call, with its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The sender's address from a `sockaddr_storage` the kernel filled in.
fn source(name: &libc::sockaddr_storage, len: libc::socklen_t) -> Source {
    let len = len as usize;
    match i32::from(name.ss_family) {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and it is that long;
            // sockaddr_storage is aligned for every socket address type.
            let sin = unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Source::Inet(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Source::Inet(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                // As std reads it: the field as the kernel stores it.
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        libc::AF_UNIX => {
            // SAFETY: as above, for sockaddr_un (the storage is larger than it).
            let sun = unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_un>() };
            let offset = std::mem::size_of::<libc::sa_family_t>();
            let path_len = len.saturating_sub(offset).min(sun.sun_path.len());
            let bytes: Vec<u8> = sun.sun_path[..path_len]
                .iter()
                .map(|&c| c as u8)
                .take_while(|&b| b != 0)
                .collect();
            // An unbound sender has no path; an abstract one starts with a NUL, which the
            // take_while above reads as empty: neither can be named in a reply here.
            if bytes.is_empty() {
                Source::Unix(None)
            } else {
                use std::os::unix::ffi::OsStringExt;
                Source::Unix(Some(PathBuf::from(std::ffi::OsString::from_vec(bytes))))
            }
        }
        _ => Source::Unix(None),
    }
}

/// The destination address from a received message's control messages, if it has one.
fn destination(h: &libc::msghdr) -> Option<Destination> {
    // Cut short for lack of room: the last message may be partial; take none.
    if h.msg_controllen == 0 || h.msg_control.is_null() || h.msg_flags & libc::MSG_CTRUNC != 0 {
        return None;
    }
    let fits = |hdr: &libc::cmsghdr, len: usize| {
        // SAFETY: CMSG_LEN is arithmetic on its argument.
        hdr.cmsg_len >= unsafe { libc::CMSG_LEN(len as u32) } as usize
    };
    // SAFETY: `h` is a header the kernel filled in, not truncated (checked above): its
    // control buffer holds `msg_controllen` bytes of control messages, which the CMSG
    // macros walk within those bounds; each message's data is read only if its own length
    // covers the type read.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let hdr = &*c;
            if hdr.cmsg_level == libc::IPPROTO_IP
                && hdr.cmsg_type == libc::IP_PKTINFO
                && fits(hdr, std::mem::size_of::<libc::in_pktinfo>())
            {
                let info = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::in_pktinfo>());
                return Some(Destination::V4(Ipv4Addr::from(u32::from_be(
                    info.ipi_addr.s_addr,
                ))));
            }
            if hdr.cmsg_level == libc::IPPROTO_IPV6
                && hdr.cmsg_type == libc::IPV6_PKTINFO
                && fits(hdr, std::mem::size_of::<libc::in6_pktinfo>())
            {
                let info = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::in6_pktinfo>());
                return Some(Destination::V6(
                    Ipv6Addr::from(info.ipi6_addr.s6_addr),
                    info.ipi6_ifindex,
                ));
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

/// Writes the packet-info control message that makes an answer leave from `d`; returns its
/// length for `msg_controllen`.
fn write_pktinfo(buf: &mut [u64; CONTROL_WORDS], d: Destination) -> usize {
    *buf = [0; CONTROL_WORDS];
    // SAFETY: a zeroed msghdr whose control buffer is `buf` (64 bytes, aligned for cmsghdr),
    // so that CMSG_FIRSTHDR returns its start; CMSG_SPACE of either pktinfo fits in it
    // (checked by the assertion), and CMSG_DATA points inside it.
    unsafe {
        let mut h: libc::msghdr = std::mem::zeroed();
        h.msg_control = buf.as_mut_ptr().cast();
        h.msg_controllen = std::mem::size_of::<[u64; CONTROL_WORDS]>() as _;
        let c = libc::CMSG_FIRSTHDR(&h);
        match d {
            Destination::V4(addr) => {
                let len = std::mem::size_of::<libc::in_pktinfo>() as u32;
                assert!(libc::CMSG_SPACE(len) as usize <= std::mem::size_of_val(buf));
                (*c).cmsg_level = libc::IPPROTO_IP;
                (*c).cmsg_type = libc::IP_PKTINFO;
                (*c).cmsg_len = libc::CMSG_LEN(len) as _;
                let info = libc::in_pktinfo {
                    ipi_ifindex: 0,
                    ipi_spec_dst: libc::in_addr {
                        s_addr: u32::from(addr).to_be(),
                    },
                    ipi_addr: libc::in_addr { s_addr: 0 },
                };
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::in_pktinfo>(), info);
                libc::CMSG_SPACE(len) as usize
            }
            Destination::V6(addr, ifindex) => {
                let len = std::mem::size_of::<libc::in6_pktinfo>() as u32;
                assert!(libc::CMSG_SPACE(len) as usize <= std::mem::size_of_val(buf));
                (*c).cmsg_level = libc::IPPROTO_IPV6;
                (*c).cmsg_type = libc::IPV6_PKTINFO;
                (*c).cmsg_len = libc::CMSG_LEN(len) as _;
                let info = libc::in6_pktinfo {
                    ipi6_addr: libc::in6_addr {
                        s6_addr: addr.octets(),
                    },
                    ipi6_ifindex: ifindex,
                };
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::in6_pktinfo>(), info);
                libc::CMSG_SPACE(len) as usize
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    #[test]
    fn a_batch_receives_what_is_queued_and_answers_each_sender() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        server.set_nonblocking(true).unwrap();
        let clients: Vec<UdpSocket> = (0..3).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        for (i, c) in clients.iter().enumerate() {
            c.send_to(format!("q{i}").as_bytes(), server.local_addr().unwrap())
                .unwrap();
        }
        let mut batch = Batch::new(8, 16);
        let mut got = 0;
        // Loopback delivery is synchronous: the three are queued once send_to returns.
        let n = batch.receive(server.as_fd(), true).unwrap();
        assert_eq!(n, 3);
        for i in 0..n {
            let r = batch.get(i);
            assert!(!r.truncated);
            assert_eq!(r.destination, None, "no pktinfo on a bound address");
            let Source::Inet(from) = r.source else {
                panic!("{:?}", r.source)
            };
            let k = clients
                .iter()
                .position(|c| c.local_addr().unwrap() == from)
                .unwrap();
            assert_eq!(r.data, format!("q{k}").as_bytes());
            let answer = format!("a{k}").into_bytes();
            batch.answers[i] = answer;
            got += 1;
        }
        assert_eq!(got, 3);
        let sent = batch.send_answers(server.as_fd());
        assert_eq!(sent.datagrams, 3);
        assert_eq!(sent.bytes, 6);
        for (k, c) in clients.iter().enumerate() {
            let mut buf = [0; 16];
            let (len, from) = c.recv_from(&mut buf).unwrap();
            assert_eq!(from, server.local_addr().unwrap());
            assert_eq!(&buf[..len], format!("a{k}").as_bytes());
        }
        assert_eq!(batch.receive(server.as_fd(), true).unwrap(), 0);
    }

    #[test]
    fn a_longer_datagram_is_flagged_truncated() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client.send_to(&[7; 100], server.local_addr().unwrap()).unwrap();
        let mut batch = Batch::new(2, 10);
        assert_eq!(batch.receive(server.as_fd(), true).unwrap(), 1);
        let r = batch.get(0);
        assert!(r.truncated);
        assert_eq!(r.data, &[7; 10]);
    }

    #[test]
    fn a_wildcard_socket_answers_from_the_address_asked() {
        // 127.0.0.2 is a local address too (all of 127/8 is): without the packet info the
        // answer would leave from 127.0.0.1, the route's preferred source.
        let server = UdpSocket::bind("0.0.0.0:0").unwrap();
        set_recv_pktinfo(server.as_fd(), false).unwrap();
        let port = server.local_addr().unwrap().port();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client.send_to(b"q", ("127.0.0.2", port)).unwrap();
        let mut batch = Batch::new(2, 10);
        assert_eq!(batch.receive(server.as_fd(), true).unwrap(), 1);
        assert_eq!(
            batch.get(0).destination,
            Some(Destination::V4(Ipv4Addr::new(127, 0, 0, 2)))
        );
        batch.answers[0] = b"a".to_vec();
        assert_eq!(batch.send_answers(server.as_fd()).datagrams, 1);
        let mut buf = [0; 4];
        let (_, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!(from, SocketAddr::from(([127, 0, 0, 2], port)));
    }
}

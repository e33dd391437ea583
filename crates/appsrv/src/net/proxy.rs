//! The PROXY protocol: the real client's address, from a load balancer in front of the server.
//!
//! A proxy (HAProxy, a cloud load balancer, stunnel...) that relays a client's connection
//! to the server sends, before the client's first byte, a header that names the client.
//! Both versions of the protocol are understood, parsed with the [`ppp`] crate:
//!
//! ```text
//! v1 (text):   PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\n      (at most 107 bytes)
//! v2 (binary): \r\n\r\n\0\r\nQUIT\n, version/command, family/protocol, length, addresses, TLVs
//! ```
//!
//! Specification: <https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt>.
//!
//! # Use
//!
//! On a listener that expects PROXY headers, before the connection is handed to the
//! handler:
//! 1. the connection's own peer (the proxy) must be trusted, that is inside one of the
//!    configured [`Cidr`] networks ([`Cidr::contains`]); otherwise the connection is closed,
//!    as anyone could claim any address;
//! 2. bytes are read into the connection's read buffer and [`parse`] is called on all the
//!    bytes received so far after each read, until it returns [`Parsed::Header`]; an error
//!    (or the read timeout) closes the connection;
//! 3. the header's `len` bytes are consumed; the bytes after them, if any, are the client's
//!    first bytes and stay in the buffer;
//! 4. the header's `source`, when there is one, becomes the connection's peer address.
//!
//! [`parse`] keeps no state between calls, so a header split across any number of reads is
//! handled by calling it again on the longer buffer. It decides as early as it can: a
//! buffer that cannot start a header is refused as soon as the first wrong byte is there,
//! and it never asks for more than [`MAX_LEN`] bytes, so the read buffer stays small.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use ppp::v2::{AddressFamily, Command};
use ppp::{PartialResult, v1, v2};

/// The longest v1 header, `\r\n` included, as the specification sets it.
pub(crate) const V1_MAX_LEN: usize = 107;

/// The longest v2 header accepted, its 16 fixed bytes included. The protocol allows
/// 16 + 65535 bytes, almost all of them TLVs (optional type-length-value fields this server
/// does not use); a longer header is refused rather than buffered.
pub(crate) const V2_MAX_LEN: usize = 4096;

/// The longest header [`parse`] accepts: a buffer this long never gets
/// [`Parsed::Incomplete`].
pub(crate) const MAX_LEN: usize = if V1_MAX_LEN > V2_MAX_LEN {
    V1_MAX_LEN
} else {
    V2_MAX_LEN
};

/// How a v1 header starts.
const V1_PREFIX: &[u8] = b"PROXY ";

/// How a v2 header starts: 12 bytes that no text protocol begins with.
const V2_SIGNATURE: &[u8] = v2::PROTOCOL_PREFIX;

/// The fixed part of a v2 header: signature, version/command, family/protocol, length.
const V2_FIXED_LEN: usize = 16;

/// What [`parse`] found at the start of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// The bytes so far are the start of a header; read more and call [`parse`] again.
    Incomplete,
    /// A complete, valid header.
    Header {
        /// How many bytes of the buffer the header takes; the bytes after it are the
        /// client's.
        len: usize,
        /// The client's address, or `None` when the header names none: a v1 `UNKNOWN`
        /// connection, a v2 `LOCAL` command (the proxy's own health checks), or a v2
        /// address family other than IPv4 and IPv6 (unspecified, Unix). With `None`, the
        /// connection keeps its own peer address.
        source: Option<SocketAddr>,
    },
}

/// Why the bytes at the start of a connection are not an acceptable PROXY header. Any of
/// these closes the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProxyError {
    /// The connection does not start with `PROXY ` (v1) or the v2 signature.
    NotProxy,
    /// The header is longer than the limit: 107 bytes for v1 (the protocol's limit), or
    /// [`V2_MAX_LEN`] for v2 (this server's).
    TooLong {
        /// The protocol version, 1 or 2.
        version: u8,
        /// The limit in bytes.
        limit: usize,
    },
    /// The header does not follow the protocol.
    Malformed {
        /// The protocol version, 1 or 2.
        version: u8,
        /// What is wrong.
        reason: Cow<'static, str>,
    },
}

impl ProxyError {
    /// A malformed v1 header.
    fn v1(reason: impl Into<Cow<'static, str>>) -> Self {
        ProxyError::Malformed {
            version: 1,
            reason: reason.into(),
        }
    }

    /// A v2 header that `ppp` refuses, with its explanation.
    fn v2(err: &v2::ParseError) -> Self {
        ProxyError::Malformed {
            version: 2,
            reason: ppp_reason(err),
        }
    }
}

/// The text of a `ppp` error, without its final period, to fit in [`ProxyError`]'s message.
fn ppp_reason(err: &dyn fmt::Display) -> Cow<'static, str> {
    let text = err.to_string();
    Cow::Owned(text.strip_suffix('.').map(str::to_owned).unwrap_or(text))
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyError::NotProxy => f.write_str("the connection does not start with a PROXY protocol header"),
            ProxyError::TooLong { version, limit } => {
                write!(f, "PROXY protocol v{version} header longer than {limit} bytes")
            }
            ProxyError::Malformed { version, reason } => {
                write!(f, "malformed PROXY protocol v{version} header: {reason}")
            }
        }
    }
}

impl std::error::Error for ProxyError {}

/// Parses the PROXY header at the start of `buf`, the bytes received so far on a
/// connection (all of them, from the first).
///
/// Returns [`Parsed::Incomplete`] while `buf` is the beginning of a header that could
/// still be valid (the empty buffer included), and [`Parsed::Header`] once it holds a
/// complete one, followed or not by the client's bytes. Anything else is an error, as soon
/// as the bytes show it:
/// - [`ProxyError::NotProxy`] when `buf` does not begin like `PROXY ` or the v2 signature;
/// - [`ProxyError::TooLong`] when no v1 header ends within 107 bytes, or a v2 header
///   announces more than [`V2_MAX_LEN`] bytes (known from its 16th byte);
/// - [`ProxyError::Malformed`] for a wrong v1 protocol or character (at the first wrong
///   byte), a v2 version, command, family or protocol that does not exist, or a v2
///   `PROXY` command for a datagram flow (`DGRAM`: these headers are read on stream
///   connections) (at the byte that holds it), and any other error in a complete header,
///   TLVs included.
///
/// Once `parse` has returned an error or a header for some bytes, it returns the same for
/// those bytes followed by any others: the caller can stop reading at the first answer
/// that is not `Incomplete`.
pub(crate) fn parse(buf: &[u8]) -> Result<Parsed, ProxyError> {
    match buf.first() {
        None => Ok(Parsed::Incomplete),
        Some(&b) if b == V1_PREFIX[0] => parse_v1(buf),
        Some(&b) if b == V2_SIGNATURE[0] => parse_v2(buf),
        Some(_) => Err(ProxyError::NotProxy),
    }
}

/// Whether `buf` is a prefix of `expected`, or starts with all of it.
fn starts_like(buf: &[u8], expected: &[u8]) -> bool {
    let n = buf.len().min(expected.len());
    buf[..n] == expected[..n]
}

/// The protocols a v1 header can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum V1Protocol {
    /// `TCP4`: IPv4 addresses follow.
    Tcp4,
    /// `TCP6`: IPv6 addresses follow.
    Tcp6,
    /// `UNKNOWN`: whatever follows, up to `\r\n`, is ignored.
    Unknown,
}

impl V1Protocol {
    /// The protocols with their names.
    const ALL: [(&'static [u8], V1Protocol); 3] = [
        (b"TCP4", V1Protocol::Tcp4),
        (b"TCP6", V1Protocol::Tcp6),
        (b"UNKNOWN", V1Protocol::Unknown),
    ];

    /// Whether `b` may appear after the protocol's name (the separating spaces included).
    fn allows(self, b: u8) -> bool {
        match self {
            V1Protocol::Tcp4 => b.is_ascii_digit() || b == b'.' || b == b' ',
            // An IPv6 address may end with a dotted IPv4 one (::ffff:192.0.2.1).
            V1Protocol::Tcp6 => b.is_ascii_hexdigit() || b == b'.' || b == b':' || b == b' ',
            V1Protocol::Unknown => b == b' ' || b.is_ascii_graphic(),
        }
    }
}

/// Parses a v1 header; `buf` starts with `P`.
///
/// The header is the line up to the first `\r`, which must be followed by `\n`. The
/// completeness of the line is decided here, and its bytes are checked as they arrive
/// ([`check_v1_line`]), rather than by asking `ppp` whether a prefix is incomplete: `ppp`
/// takes `PROXY TCP4 192.0.2.1 192.0.2.2 80 ` (a prefix of a valid header) for an invalid
/// one, and `PROXY UNKNOWN a b c d e\r\n` (complete, with five words after `UNKNOWN`) for an
/// incomplete one. `ppp` parses the complete `TCP4` and `TCP6` lines.
fn parse_v1(buf: &[u8]) -> Result<Parsed, ProxyError> {
    if !starts_like(buf, V1_PREFIX) {
        return Err(ProxyError::NotProxy);
    }
    // The `\r` of a header of at most 107 bytes is within its first 106.
    let window = &buf[..buf.len().min(V1_MAX_LEN - 1)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        if buf.len() >= V1_MAX_LEN - 1 {
            return Err(ProxyError::TooLong {
                version: 1,
                limit: V1_MAX_LEN,
            });
        }
        check_v1_line(buf, false)?;
        return Ok(Parsed::Incomplete);
    };
    let line = &buf[..cr];
    match buf.get(cr + 1) {
        None => {
            check_v1_line(line, false)?;
            Ok(Parsed::Incomplete)
        }
        Some(b'\n') => {
            let len = cr + 2;
            let source = match check_v1_line(line, true)? {
                V1Protocol::Unknown => None,
                V1Protocol::Tcp4 | V1Protocol::Tcp6 => {
                    let header =
                        v1::Header::try_from(&buf[..len]).map_err(|e| ProxyError::v1(ppp_reason(&e)))?;
                    match header.addresses {
                        v1::Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
                        v1::Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
                        v1::Addresses::Unknown => None,
                    }
                }
            };
            Ok(Parsed::Header { len, source })
        }
        Some(_) => Err(ProxyError::v1("\\r not followed by \\n")),
    }
}

/// Checks the bytes of a v1 line (without its `\r\n`) that starts like `PROXY `: the
/// protocol's name, then only the characters its addresses can be made of. A `complete`
/// line must have a whole protocol name, which is returned; an incomplete line may end in
/// the middle of it (the returned protocol is then meaningless).
///
/// The addresses and ports themselves are left to `ppp`, once the line is complete.
fn check_v1_line(line: &[u8], complete: bool) -> Result<V1Protocol, ProxyError> {
    let Some(rest) = line.get(V1_PREFIX.len()..) else {
        return Ok(V1Protocol::Unknown);
    };
    let (name, tail) = match rest.iter().position(|&b| b == b' ') {
        Some(space) => (&rest[..space], Some(&rest[space..])),
        None => (rest, None),
    };
    if tail.is_none() && !complete {
        return if V1Protocol::ALL.iter().any(|(n, _)| n.starts_with(name)) {
            Ok(V1Protocol::Unknown)
        } else {
            Err(ProxyError::v1("unknown protocol, expected TCP4, TCP6 or UNKNOWN"))
        };
    }
    let Some(&(_, protocol)) = V1Protocol::ALL.iter().find(|(n, _)| *n == name) else {
        return Err(ProxyError::v1("unknown protocol, expected TCP4, TCP6 or UNKNOWN"));
    };
    if let Some(&b) = tail.unwrap_or_default().iter().find(|&&b| !protocol.allows(b)) {
        return Err(ProxyError::v1(format!("unexpected byte 0x{b:02x}")));
    }
    Ok(protocol)
}

/// Parses a v2 header; `buf` starts with `\r`.
///
/// The fixed bytes are checked here as soon as they arrive, and the length is checked
/// against [`V2_MAX_LEN`] before the rest is waited for; `ppp` parses the header (and
/// reports a partial one) from its 16th byte on.
fn parse_v2(buf: &[u8]) -> Result<Parsed, ProxyError> {
    if !starts_like(buf, V2_SIGNATURE) {
        return Err(ProxyError::NotProxy);
    }
    // The errors `ppp` would give for these bytes, before the 16 it needs are there.
    if let Some(&b) = buf.get(V2_SIGNATURE.len()) {
        if b & 0xF0 != 0x20 {
            return Err(ProxyError::v2(&v2::ParseError::Version(b & 0xF0)));
        }
        if b & 0x0F > 1 {
            return Err(ProxyError::v2(&v2::ParseError::Command(b & 0x0F)));
        }
    }
    if let Some(&b) = buf.get(V2_SIGNATURE.len() + 1) {
        if b & 0xF0 > 0x30 {
            return Err(ProxyError::v2(&v2::ParseError::AddressFamily(b & 0xF0)));
        }
        if b & 0x0F > 2 {
            return Err(ProxyError::v2(&v2::ParseError::Protocol(b & 0x0F)));
        }
        // Headers are read on stream connections only: one that relays a datagram flow
        // (UDP) names a client of another transport, not this connection's (issue 41).
        // A LOCAL header's protocol is ignored, as its addresses are.
        if b & 0x0F == 2 && buf[V2_SIGNATURE.len()] & 0x0F == 1 {
            return Err(ProxyError::Malformed {
                version: 2,
                reason: "DGRAM (a datagram flow) on a stream connection".into(),
            });
        }
    }
    let Some(fixed) = buf.get(..V2_FIXED_LEN) else {
        return Ok(Parsed::Incomplete);
    };
    let len = V2_FIXED_LEN + usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    if len > V2_MAX_LEN {
        return Err(ProxyError::TooLong {
            version: 2,
            limit: V2_MAX_LEN,
        });
    }
    let header = match v2::Header::try_from(buf) {
        Ok(header) => header,
        Err(e) if e.is_incomplete() => return Ok(Parsed::Incomplete),
        Err(e) => return Err(ProxyError::v2(&e)),
    };
    debug_assert_eq!(header.len(), len);
    // A LOCAL header's address block is to be ignored, and so is an unspecified family's;
    // otherwise the TLVs after the addresses must fit in the header.
    if header.command == Command::Local || header.address_family() == AddressFamily::Unspecified {
        return Ok(Parsed::Header { len, source: None });
    }
    if let Some(Err(e)) = header.tlvs().find(Result::is_err) {
        return Err(ProxyError::v2(&e));
    }
    let source = match header.addresses {
        v2::Addresses::IPv4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v2::Addresses::IPv6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v2::Addresses::Unix(_) | v2::Addresses::Unspecified => None,
    };
    Ok(Parsed::Header { len, source })
}

/// An IPv4 or IPv6 network: an address and a prefix length, as `10.0.0.0/8` or
/// `2001:db8::/32`.
///
/// Parsed from `ADDR/LEN` or a bare `ADDR` (a single address: `/32` for IPv4, `/128` for
/// IPv6). The address must be the network's first one: `10.0.0.1/8` is refused (it names a
/// host, not a network; the error says which network was probably meant).
///
/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, what an IPv6 socket or a `TCP6` PROXY
/// header shows for an IPv4 client) are IPv4 addresses here, so a client is matched the
/// same whichever way its address arrives:
/// - [`contains`](Cidr::contains) checks a mapped address against IPv4 networks:
///   `10.0.0.0/8` contains `::ffff:10.1.2.3`;
/// - a network inside `::ffff:0:0/96` is the IPv4 network it maps: `::ffff:10.0.0.0/104` is
///   `10.0.0.0/8` (and is displayed so);
/// - an IPv6 network never contains IPv4 or mapped addresses, not even `::/0`: to match
///   every client, list both `0.0.0.0/0` and `::/0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Cidr {
    /// The network's first address; an IPv4 network is always `IpAddr::V4`.
    network: IpAddr,
    /// How many leading bits of an address must be equal to the network's.
    prefix_len: u8,
}

impl Cidr {
    /// The network of `prefix_len` leading bits at `addr`, which must be the network's
    /// first address; errors as for parsing.
    pub(crate) fn new(addr: IpAddr, prefix_len: u8) -> Result<Cidr, CidrError> {
        let error = |kind| CidrError {
            input: format!("{addr}/{prefix_len}"),
            kind,
        };
        let max = max_prefix_len(addr);
        if prefix_len > max {
            return Err(error(CidrErrorKind::PrefixTooLong { max }));
        }
        let network = mask(addr, prefix_len);
        if network != addr {
            return Err(error(CidrErrorKind::HostBits {
                network: Cidr { network, prefix_len }.to_string(),
            }));
        }
        Ok(match network {
            IpAddr::V6(v6) if prefix_len >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => Cidr {
                    network: IpAddr::V4(v4),
                    prefix_len: prefix_len - 96,
                },
                None => Cidr { network, prefix_len },
            },
            _ => Cidr { network, prefix_len },
        })
    }

    /// Whether `ip` is in this network. An IPv4-mapped IPv6 address is taken as the IPv4
    /// address it maps (see the [type's docs](Cidr)).
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.network.is_ipv4() && mask(ip, self.prefix_len) == self.network
    }

    /// The network's first address.
    #[cfg(test)]
    pub(crate) fn network(&self) -> IpAddr {
        self.network
    }

    /// The number of leading bits that define the network.
    #[cfg(test)]
    pub(crate) fn prefix_len(&self) -> u8 {
        self.prefix_len
    }
}

/// The number of bits in an address of `ip`'s family: 32 or 128.
fn max_prefix_len(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// `ip` with all but its first `prefix_len` bits set to zero (`prefix_len` is at most the
/// number of bits of the address).
fn mask(ip: IpAddr, prefix_len: u8) -> IpAddr {
    let host_bits = u32::from(max_prefix_len(ip) - prefix_len);
    match ip {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(host_bits).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    /// Parses `ADDR/LEN` or `ADDR`; see the [type's docs](Cidr).
    fn from_str(text: &str) -> Result<Self, CidrError> {
        let error = |kind| CidrError {
            input: text.to_owned(),
            kind,
        };
        let (addr, prefix_len) = match text.split_once('/') {
            Some((addr, len)) => (addr, Some(len)),
            None => (text, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| error(CidrErrorKind::Address))?;
        let prefix_len = match prefix_len {
            None => max_prefix_len(addr),
            // Digits only: `u8::from_str` also takes a sign ("+8").
            Some(len) if !len.is_empty() && len.bytes().all(|b| b.is_ascii_digit()) => {
                let max = max_prefix_len(addr);
                match len.parse::<u8>() {
                    Ok(len) if len <= max => len,
                    _ => return Err(error(CidrErrorKind::PrefixTooLong { max })),
                }
            }
            Some(_) => return Err(error(CidrErrorKind::Prefix)),
        };
        Cidr::new(addr, prefix_len).map_err(|e| error(e.kind))
    }
}

impl fmt::Display for Cidr {
    /// `10.0.0.0/8`, `2001:db8::/32`: always with the prefix length, and parses back to the
    /// same network.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

/// Why a text or an address and prefix length are not a [`Cidr`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CidrError {
    /// The text that was refused.
    input: String,
    /// What is wrong with it.
    kind: CidrErrorKind,
}

/// What is wrong with a network.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CidrErrorKind {
    /// The part before `/` is not an IP address.
    Address,
    /// The part after `/` is not a number.
    Prefix,
    /// The prefix length is larger than the address's bits.
    PrefixTooLong {
        /// 32 or 128.
        max: u8,
    },
    /// The address has bits set after the prefix.
    HostBits {
        /// The network that the prefix length gives, as text.
        network: String,
    },
}

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid network {:?}: ", self.input)?;
        match &self.kind {
            CidrErrorKind::Address => f.write_str(
                "not an IP address (expected ADDR or ADDR/LEN, as 10.0.0.0/8, 2001:db8::/32 or ::1)",
            ),
            CidrErrorKind::Prefix => f.write_str("the prefix length after '/' must be a number"),
            CidrErrorKind::PrefixTooLong { max } => {
                write!(f, "the prefix length must be at most {max} for this address")
            }
            CidrErrorKind::HostBits { network } => {
                write!(
                    f,
                    "the address has bits set after the prefix length (is {network} meant?)"
                )
            }
        }
    }
}

impl std::error::Error for CidrError {}

#[cfg(test)]
mod tests {
    use ppp::v2::{Builder, Protocol, Type};
    use proptest::prelude::*;

    use super::*;

    /// A `SocketAddr` from its text.
    fn sa(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    /// A network from its text.
    fn cidr(text: &str) -> Cidr {
        text.parse().unwrap()
    }

    /// An IP address from its text.
    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// A v2 PROXY header from `source` to `destination` (of the same family), with TLVs.
    fn v2_proxy(source: &str, destination: &str, tlvs: &[(u8, &[u8])]) -> Vec<u8> {
        let mut builder = Builder::with_addresses(0x21, Protocol::Stream, (sa(source), sa(destination)));
        for (kind, value) in tlvs {
            builder = builder.write_tlv(*kind, value).unwrap();
        }
        builder.build().unwrap()
    }

    /// A v2 LOCAL header (the proxy's health check) with no addresses.
    fn v2_local() -> Vec<u8> {
        Builder::new(0x20, 0x00).build().unwrap()
    }

    /// Feeds `input` to `parse` one byte more at a time, as the smallest reads would
    /// deliver it, and checks that the answer is `Incomplete` until `header_len` bytes are
    /// there, then the header's.
    fn assert_streams(input: &[u8], header_len: usize, source: Option<SocketAddr>) {
        for end in 0..header_len {
            assert_eq!(
                parse(&input[..end]),
                Ok(Parsed::Incomplete),
                "{end} bytes of {input:?}"
            );
        }
        let expected = Ok(Parsed::Header {
            len: header_len,
            source,
        });
        for end in header_len..=input.len() {
            assert_eq!(parse(&input[..end]), expected, "{end} bytes of {input:?}");
        }
    }

    /// The number of bytes after which `parse` gives up on `input`, which must be refused.
    fn refused_after(input: &[u8]) -> (usize, ProxyError) {
        for end in 0..=input.len() {
            match parse(&input[..end]) {
                Ok(Parsed::Incomplete) => continue,
                Ok(header) => panic!("{input:?} accepted: {header:?}"),
                Err(e) => return (end, e),
            }
        }
        panic!("{input:?} still incomplete");
    }

    #[test]
    fn v1_tcp4() {
        let header = b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\n";
        assert_streams(header, header.len(), Some(sa("203.0.113.7:51234")));
    }

    #[test]
    fn v1_tcp6() {
        let header = b"PROXY TCP6 2001:db8::7 2001:db8::1 51234 443\r\n";
        assert_streams(header, header.len(), Some(sa("[2001:db8::7]:51234")));
        let mapped = b"PROXY TCP6 ::ffff:203.0.113.7 ::ffff:192.0.2.1 1 2\r\n";
        assert_streams(mapped, mapped.len(), Some(sa("[::ffff:203.0.113.7]:1")));
    }

    #[test]
    fn v1_longest_header() {
        let header = b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
        assert_eq!(header.len(), 104);
        let source = Some(sa("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"));
        assert_streams(header, header.len(), source);
        let unknown = format!("PROXY UNKNOWN {}\r\n", "x".repeat(V1_MAX_LEN - 16));
        assert_eq!(unknown.len(), V1_MAX_LEN);
        assert_streams(unknown.as_bytes(), V1_MAX_LEN, None);
    }

    #[test]
    fn v1_unknown() {
        assert_streams(b"PROXY UNKNOWN\r\n", 15, None);
        let with_addresses = b"PROXY UNKNOWN ffff::1 ffff::2 65535 65535\r\n";
        assert_streams(with_addresses, with_addresses.len(), None);
        // Whatever follows UNKNOWN is ignored, however many words (ppp would wait forever).
        assert_streams(b"PROXY UNKNOWN a b c d e f\r\n", 27, None);
    }

    #[test]
    fn v1_followed_by_the_first_request() {
        let header = b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 80\r\n";
        let input = [&header[..], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"].concat();
        assert_streams(&input, header.len(), Some(sa("203.0.113.7:51234")));
        let input = b"PROXY UNKNOWN\r\nPROXY TCP4 1.2.3.4 1.2.3.4 1 1\r\n";
        assert_streams(input, 15, None);
    }

    #[test]
    fn v1_without_the_lf_waits_for_it() {
        let header = b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r";
        assert_eq!(parse(header), Ok(Parsed::Incomplete));
    }

    #[test]
    fn v2_tcp4() {
        let header = v2_proxy("203.0.113.7:51234", "192.0.2.1:443", &[]);
        assert_eq!(header.len(), 16 + 12);
        assert_streams(&header, header.len(), Some(sa("203.0.113.7:51234")));
    }

    #[test]
    fn v2_tcp6() {
        let header = v2_proxy("[2001:db8::7]:51234", "[2001:db8::1]:443", &[]);
        assert_eq!(header.len(), 16 + 36);
        assert_streams(&header, header.len(), Some(sa("[2001:db8::7]:51234")));
    }

    #[test]
    fn v2_local_has_no_source() {
        let header = v2_local();
        assert_eq!(header.len(), 16);
        assert_streams(&header, 16, None);
        // A LOCAL header's addresses, if any, are ignored.
        let with_addresses =
            Builder::with_addresses(0x20, Protocol::Stream, (sa("1.2.3.4:1"), sa("5.6.7.8:2")))
                .build()
                .unwrap();
        assert_streams(&with_addresses, with_addresses.len(), None);
    }

    #[test]
    fn v2_with_tlvs() {
        let header = v2_proxy(
            "203.0.113.7:51234",
            "192.0.2.1:443",
            &[
                (Type::ALPN.into(), b"h2"),
                (Type::Authority.into(), b"example.com"),
                (Type::NoOp.into(), &[0; 100]),
                (0xE0, b""),
            ],
        );
        assert_eq!(header.len(), 16 + 12 + (3 + 2) + (3 + 11) + (3 + 100) + 3);
        assert_streams(&header, header.len(), Some(sa("203.0.113.7:51234")));
    }

    #[test]
    fn v2_followed_by_the_first_request() {
        let header = v2_proxy(
            "[2001:db8::7]:51234",
            "[2001:db8::1]:443",
            &[(Type::NoOp.into(), b"x")],
        );
        // The client's first bytes could be anything, even another header.
        let input = [&header[..], &header[..], b"hello\n"].concat();
        assert_streams(&input, header.len(), Some(sa("[2001:db8::7]:51234")));
    }

    #[test]
    fn v2_other_families_have_no_source() {
        let unspec = Builder::new(0x21, 0x00).build().unwrap();
        assert_streams(&unspec, 16, None);
        let unix = Builder::with_addresses(0x21, Protocol::Stream, v2::Unix::new([b'a'; 108], [b'b'; 108]))
            .build()
            .unwrap();
        assert_eq!(unix.len(), 16 + 216);
        assert_streams(&unix, unix.len(), None);
    }

    /// Issue 41: a PROXY header for a datagram flow (`DGRAM`, UDP) was accepted on a
    /// stream connection and its source taken for the TCP client's: it is refused at its
    /// byte, whatever the family; a LOCAL header's protocol is ignored.
    #[test]
    fn issue_41_v2_datagram_is_refused_on_a_stream_connection() {
        for addresses in [
            (sa("1.2.3.4:5"), sa("5.6.7.8:9")),
            (sa("[2001:db8::1]:5"), sa("[2001:db8::2]:9")),
        ] {
            let header = Builder::with_addresses(0x21, Protocol::Datagram, addresses)
                .build()
                .unwrap();
            let (end, e) = refused_after(&header);
            assert_eq!(end, 14, "{e}");
            assert_eq!(
                e.to_string(),
                "malformed PROXY protocol v2 header: DGRAM (a datagram flow) on a stream connection"
            );
        }
        let unspec = Builder::new(0x21, 0x02).build().unwrap();
        assert!(matches!(
            refused_after(&unspec),
            (14, ProxyError::Malformed { version: 2, .. })
        ));
        let local = Builder::new(0x20, 0x02).build().unwrap();
        assert_streams(&local, local.len(), None);
    }

    #[test]
    fn v2_largest_header() {
        let tlv = vec![0; V2_MAX_LEN - 16 - 12 - 3];
        let header = v2_proxy("1.2.3.4:5", "5.6.7.8:9", &[(Type::NoOp.into(), &tlv)]);
        assert_eq!(header.len(), V2_MAX_LEN);
        assert_eq!(
            parse(&header),
            Ok(Parsed::Header {
                len: V2_MAX_LEN,
                source: Some(sa("1.2.3.4:5"))
            })
        );
        assert_eq!(parse(&header[..V2_MAX_LEN - 1]), Ok(Parsed::Incomplete));
    }

    #[test]
    fn not_a_proxy_header_is_refused_at_the_first_byte() {
        for input in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"\x16\x03\x01\x02\x00",
            b"hello",
            b"\0",
            b" PROXY",
        ] {
            assert_eq!(refused_after(input), (1, ProxyError::NotProxy), "{input:?}");
        }
    }

    #[test]
    fn a_wrong_start_is_refused_at_the_first_wrong_byte() {
        assert_eq!(refused_after(b"PROXX TCP4"), (5, ProxyError::NotProxy));
        assert_eq!(refused_after(b"PROXY\r\n"), (6, ProxyError::NotProxy));
        assert_eq!(refused_after(b"proxy TCP4"), (1, ProxyError::NotProxy));
        // The v2 signature, then something else.
        assert_eq!(
            refused_after(b"\r\n\r\n\0\r\nQUIT\r\n"),
            (12, ProxyError::NotProxy)
        );
        assert_eq!(refused_after(b"\r\n\r\nGET"), (5, ProxyError::NotProxy));
        // The signature, then v1 (or a text protocol's empty lines).
        assert_eq!(refused_after(b"\r\nPROXY TCP4"), (3, ProxyError::NotProxy));
    }

    #[test]
    fn a_truncated_then_wrong_v1_header_is_refused_at_the_wrong_byte() {
        let cases: [(&[u8], usize); 9] = [
            (b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", 10),
            (b"PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n", 7),
            (b"PROXY TCP41.2.3.4 5.6.7.8 1 2\r\n", 11),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\nGET", 31),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rGET", 32),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\nGET", 30),
            (b"PROXY TCP4 1.2.3.4\x00", 19),
            (b"PROXY TCP4 1.2.3.4 GET / HTTP/1.1\r\n", 20),
            (b"PROXY TCP6 2001:db8::g", 22),
        ];
        for (input, at) in cases {
            let (end, e) = refused_after(input);
            assert_eq!(end, at, "{:?}: {e}", String::from_utf8_lossy(input));
            assert!(matches!(e, ProxyError::Malformed { version: 1, .. }), "{e:?}");
        }
    }

    #[test]
    fn a_complete_but_invalid_v1_header_is_refused() {
        for input in [
            &b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n"[..],
            b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 65536\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
            b"PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 2001:db8::1 5.6.7.8 1 2\r\n",
            b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4\r\n",
            b"PROXY \r\n",
            b"PROXY UNKNOWN\x01\r\n",
            b"PROXY UNKNOWNX\r\n",
        ] {
            let e = parse(input).unwrap_err();
            assert!(
                matches!(e, ProxyError::Malformed { version: 1, .. }),
                "{input:?}: {e:?}"
            );
        }
    }

    #[test]
    fn a_v1_header_longer_than_107_bytes_is_refused_at_byte_106() {
        let long = format!("PROXY UNKNOWN {}\r\n", "x".repeat(V1_MAX_LEN - 15));
        let too_long = ProxyError::TooLong {
            version: 1,
            limit: V1_MAX_LEN,
        };
        assert_eq!(refused_after(long.as_bytes()), (V1_MAX_LEN - 1, too_long.clone()));
        // Whole, with the first request after it: still too long.
        assert_eq!(parse(long.as_bytes()), Err(too_long.clone()));
        assert_eq!(
            parse(format!("{long}GET / HTTP/1.1\r\n").as_bytes()),
            Err(too_long.clone())
        );
        assert_eq!(parse(&[b'P'; 200]), Err(ProxyError::NotProxy));
        let spaces = [&b"PROXY UNKNOWN"[..], &[b' '; 200]].concat();
        assert_eq!(refused_after(&spaces), (V1_MAX_LEN - 1, too_long));
    }

    #[test]
    fn a_wrong_v2_version_or_command_is_refused_at_its_byte() {
        let good = v2_proxy("1.2.3.4:5", "5.6.7.8:9", &[]);
        for (at, byte) in [
            (12, 0x11),
            (12, 0x31),
            (12, 0x22),
            (12, 0x2F),
            (13, 0x41),
            (13, 0x13),
        ] {
            let mut bad = good.clone();
            bad[at] = byte;
            let (end, e) = refused_after(&bad);
            assert_eq!(end, at + 1, "{byte:#x}: {e}");
            assert!(matches!(e, ProxyError::Malformed { version: 2, .. }), "{e:?}");
        }
    }

    #[test]
    fn v2_error_messages_name_the_problem() {
        let mut bad = v2_local();
        bad[12] = 0x11;
        assert_eq!(
            parse(&bad).unwrap_err().to_string(),
            "malformed PROXY protocol v2 header: Expected version 10 to be equal to 2"
        );
        bad[12] = 0x23;
        assert!(parse(&bad).unwrap_err().to_string().contains("Invalid command 3"));
    }

    #[test]
    fn a_v2_header_too_short_for_its_addresses_is_refused_at_byte_16() {
        let mut bad = v2_proxy("1.2.3.4:5", "5.6.7.8:9", &[]);
        bad[15] = 11;
        let (end, e) = refused_after(&bad);
        assert_eq!(end, 16);
        assert!(matches!(e, ProxyError::Malformed { version: 2, .. }), "{e:?}");
    }

    #[test]
    fn an_oversized_v2_header_is_refused_at_byte_16() {
        let tlv = vec![0; V2_MAX_LEN - 16 - 12 - 3 + 1];
        let header = v2_proxy("1.2.3.4:5", "5.6.7.8:9", &[(Type::NoOp.into(), &tlv)]);
        let too_long = ProxyError::TooLong {
            version: 2,
            limit: V2_MAX_LEN,
        };
        assert_eq!(refused_after(&header), (16, too_long.clone()));
        let mut largest = v2_local();
        largest[14..16].copy_from_slice(&[0xFF, 0xFF]);
        assert_eq!(parse(&largest), Err(too_long));
    }

    #[test]
    fn malformed_v2_tlvs_are_refused() {
        let mut header = v2_proxy("1.2.3.4:5", "5.6.7.8:9", &[(Type::NoOp.into(), b"abc")]);
        // The TLV claims 4 bytes of the 3 the header has.
        header[16 + 12 + 2] = 4;
        assert!(matches!(
            parse(&header),
            Err(ProxyError::Malformed { version: 2, .. })
        ));
        // Two bytes after the addresses, too short for a TLV.
        let mut header = v2_proxy("1.2.3.4:5", "5.6.7.8:9", &[]);
        header.extend([1, 0]);
        header[15] += 2;
        assert!(matches!(
            parse(&header),
            Err(ProxyError::Malformed { version: 2, .. })
        ));
    }

    #[test]
    fn errors_display_what_is_wrong() {
        assert_eq!(
            ProxyError::NotProxy.to_string(),
            "the connection does not start with a PROXY protocol header"
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\r").unwrap_err().to_string(),
            "malformed PROXY protocol v1 header: \\r not followed by \\n"
        );
        assert_eq!(
            parse(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 65536\r\n")
                .unwrap_err()
                .to_string(),
            "malformed PROXY protocol v1 header: Header contains invalid TCP port for the destination"
        );
        assert_eq!(
            parse(b"PROXY TCP4 1.2.3.4 x").unwrap_err().to_string(),
            "malformed PROXY protocol v1 header: unexpected byte 0x78"
        );
        let too_long = ProxyError::TooLong {
            version: 2,
            limit: 4096,
        };
        assert_eq!(
            too_long.to_string(),
            "PROXY protocol v2 header longer than 4096 bytes"
        );
    }

    #[test]
    fn cidr_parses_networks_and_addresses() {
        let cases = [
            ("10.0.0.0/8", "10.0.0.0", 8),
            ("0.0.0.0/0", "0.0.0.0", 0),
            ("192.0.2.7", "192.0.2.7", 32),
            ("192.0.2.7/32", "192.0.2.7", 32),
            ("::1", "::1", 128),
            ("::1/128", "::1", 128),
            ("::/0", "::", 0),
            ("2001:db8::/32", "2001:db8::", 32),
            ("fe80::/10", "fe80::", 10),
            // Mapped networks are the IPv4 networks they map.
            ("::ffff:10.0.0.0/104", "10.0.0.0", 8),
            ("::ffff:0:0/96", "0.0.0.0", 0),
            ("::ffff:192.0.2.7", "192.0.2.7", 32),
        ];
        for (text, network, prefix_len) in cases {
            let c = cidr(text);
            assert_eq!((c.network(), c.prefix_len()), (ip(network), prefix_len), "{text}");
        }
    }

    #[test]
    fn cidr_displays_with_the_prefix_length() {
        assert_eq!(cidr("10.0.0.0/8").to_string(), "10.0.0.0/8");
        assert_eq!(cidr("192.0.2.7").to_string(), "192.0.2.7/32");
        assert_eq!(cidr("2001:db8::/32").to_string(), "2001:db8::/32");
        assert_eq!(cidr("::1").to_string(), "::1/128");
        assert_eq!(cidr("::ffff:10.0.0.0/104").to_string(), "10.0.0.0/8");
    }

    #[test]
    fn cidr_refuses_bad_text_clearly() {
        let cases = [
            ("", "not an IP address"),
            ("/8", "not an IP address"),
            ("10.0.0/8", "not an IP address"),
            ("010.0.0.0/8", "not an IP address"),
            ("[::1]/128", "not an IP address"),
            ("localhost", "not an IP address"),
            (" 10.0.0.0/8", "not an IP address"),
            ("fe80::1%eth0", "not an IP address"),
            ("10.0.0.0/", "must be a number"),
            ("10.0.0.0/+8", "must be a number"),
            ("10.0.0.0/-1", "must be a number"),
            ("10.0.0.0/ 8", "must be a number"),
            ("10.0.0.0/8 ", "must be a number"),
            ("10.0.0.0/8/8", "must be a number"),
            ("10.0.0.0/0x8", "must be a number"),
            ("10.0.0.0/33", "at most 32"),
            ("10.0.0.0/1000", "at most 32"),
            ("10.0.0.0/99999999999999999999", "at most 32"),
            ("::/129", "at most 128"),
            ("10.0.0.1/8", "is 10.0.0.0/8 meant?"),
            ("2001:db8::1/32", "is 2001:db8::/32 meant?"),
            ("::ffff:10.0.0.1/104", "is ::ffff:10.0.0.0/104 meant?"),
        ];
        for (text, reason) in cases {
            let e = text.parse::<Cidr>().unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("invalid network {text:?}: ")),
                "{text}: {e}"
            );
            assert!(e.contains(reason), "{text}: {e}");
        }
        assert_eq!(
            "10.0.0.1/8".parse::<Cidr>().unwrap_err().to_string(),
            "invalid network \"10.0.0.1/8\": the address has bits set after the prefix length \
             (is 10.0.0.0/8 meant?)"
        );
    }

    #[test]
    fn cidr_new_checks_like_parsing() {
        assert_eq!(Cidr::new(ip("10.0.0.0"), 8), Ok(cidr("10.0.0.0/8")));
        assert!(Cidr::new(ip("10.0.0.0"), 33).is_err());
        assert_eq!(
            Cidr::new(ip("10.0.0.1"), 8).unwrap_err().to_string(),
            "invalid network \"10.0.0.1/8\": the address has bits set after the prefix length \
             (is 10.0.0.0/8 meant?)"
        );
    }

    #[test]
    fn cidr_contains_ipv4() {
        let net = cidr("10.0.0.0/8");
        for inside in ["10.0.0.0", "10.1.2.3", "10.255.255.255"] {
            assert!(net.contains(ip(inside)), "{inside}");
        }
        for outside in [
            "9.255.255.255",
            "11.0.0.0",
            "0.0.0.0",
            "::",
            "::a00:1",
            "2001:db8::",
        ] {
            assert!(!net.contains(ip(outside)), "{outside}");
        }
        let net = cidr("192.0.2.128/25");
        assert!(net.contains(ip("192.0.2.128")) && net.contains(ip("192.0.2.255")));
        assert!(!net.contains(ip("192.0.2.127")));
        let host = cidr("192.0.2.7");
        assert!(host.contains(ip("192.0.2.7")) && !host.contains(ip("192.0.2.8")));
        let all = cidr("0.0.0.0/0");
        assert!(all.contains(ip("0.0.0.0")) && all.contains(ip("255.255.255.255")));
        assert!(!all.contains(ip("::1")));
    }

    #[test]
    fn cidr_contains_ipv6() {
        let net = cidr("2001:db8::/32");
        assert!(net.contains(ip("2001:db8::")) && net.contains(ip("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff")));
        assert!(!net.contains(ip("2001:db9::")) && !net.contains(ip("2001:db7:ffff::")));
        assert!(!net.contains(ip("32.1.13.184")));
        let host = cidr("::1");
        assert!(host.contains(ip("::1")) && !host.contains(ip("::2")) && !host.contains(ip("127.0.0.1")));
        let all = cidr("::/0");
        assert!(all.contains(ip("::")) && all.contains(ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")));
        // IPv4 clients are not IPv6 ones, however their address arrives.
        assert!(!all.contains(ip("10.0.0.1")) && !all.contains(ip("::ffff:10.0.0.1")));
        // An IPv4-compatible address (deprecated) is not a mapped one.
        assert!(all.contains(ip("::10.0.0.1")) && !cidr("10.0.0.0/8").contains(ip("::10.0.0.1")));
    }

    #[test]
    fn cidr_matches_ipv4_mapped_addresses_as_ipv4() {
        let net = cidr("10.0.0.0/8");
        assert!(net.contains(ip("::ffff:10.1.2.3")));
        assert!(!net.contains(ip("::ffff:11.1.2.3")));
        // A network written as mapped matches both forms.
        let mapped = cidr("::ffff:10.0.0.0/104");
        assert!(mapped.contains(ip("10.1.2.3")) && mapped.contains(ip("::ffff:10.1.2.3")));
        assert!(!mapped.contains(ip("11.1.2.3")));
        assert!(cidr("::ffff:0:0/96").contains(ip("203.0.113.7")));
    }

    /// Any IPv4 or IPv6 address, IPv4-mapped ones included.
    fn any_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<u32>().prop_map(|a| IpAddr::V4(Ipv4Addr::from(a))),
            any::<u128>().prop_map(|a| IpAddr::V6(Ipv6Addr::from(a))),
            any::<u32>().prop_map(|a| IpAddr::V6(Ipv4Addr::from(a).to_ipv6_mapped())),
        ]
    }

    /// A valid header, the bytes of the first request after it, and what `parse` must
    /// find: (input, header length, source).
    fn any_header() -> impl Strategy<Value = (Vec<u8>, usize, Option<SocketAddr>)> {
        let v1 = (
            any::<bool>(),
            any::<u32>(),
            any::<u32>(),
            any::<u128>(),
            any::<u128>(),
            any::<u16>(),
            any::<u16>(),
        )
            .prop_map(|(v4, s4, d4, s6, d6, sport, dport)| {
                let (source, destination, proto) = if v4 {
                    (IpAddr::V4(s4.into()), IpAddr::V4(d4.into()), "TCP4")
                } else {
                    (IpAddr::V6(s6.into()), IpAddr::V6(d6.into()), "TCP6")
                };
                let text = format!("PROXY {proto} {source} {destination} {sport} {dport}\r\n");
                (text.into_bytes(), Some(SocketAddr::new(source, sport)))
            });
        let v1_unknown =
            "( [!-~]{1,20}){0,4}".prop_map(|rest| (format!("PROXY UNKNOWN{rest}\r\n").into_bytes(), None));
        let tlv = (any::<u8>(), prop::collection::vec(any::<u8>(), 0..40));
        let v2 = (
            any_ip(),
            any::<u16>(),
            any::<u16>(),
            any::<bool>(),
            prop::collection::vec(tlv, 0..4),
        )
            .prop_map(|(source, sport, dport, local, tlvs)| {
                let destination = match source {
                    IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                    IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
                };
                let (source, destination) = (
                    SocketAddr::new(source, sport),
                    SocketAddr::new(destination, dport),
                );
                let command = if local { 0x20 } else { 0x21 };
                let mut builder = Builder::with_addresses(command, Protocol::Stream, (source, destination));
                for (kind, value) in &tlvs {
                    builder = builder.write_tlv(*kind, value).unwrap();
                }
                (builder.build().unwrap(), if local { None } else { Some(source) })
            });
        (
            prop_oneof![v1, v1_unknown, v2],
            prop::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(|((header, source), rest)| {
                let len = header.len();
                ([header, rest].concat(), len, source)
            })
    }

    /// Beginnings of headers, so that random bytes after them reach past the first checks.
    const STARTS: [&[u8]; 9] = [
        b"",
        b"PROXY ",
        b"PROXY TCP4 ",
        b"PROXY TCP6 ",
        b"PROXY UNKNOWN",
        V2_SIGNATURE,
        b"\r\n\r\n\0\r\nQUIT\n\x21",
        b"\r\n\r\n\0\r\nQUIT\n\x21\x11",
        b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x0f",
    ];

    /// Bytes that begin like a header (so as to reach past the first checks) or not, then
    /// anything.
    fn any_input() -> impl Strategy<Value = Vec<u8>> {
        let rest = prop_oneof![
            prop::collection::vec(any::<u8>(), 0..200),
            "[0-9a-f.: \r\n]{0,120}".prop_map(String::into_bytes),
        ];
        (prop::sample::select(STARTS.to_vec()), rest).prop_map(|(start, rest)| [start, &rest[..]].concat())
    }

    proptest! {
        #[test]
        fn any_header_streams((input, len, source) in any_header()) {
            for end in 0..len {
                prop_assert_eq!(parse(&input[..end]), Ok(Parsed::Incomplete), "{} bytes", end);
            }
            prop_assert_eq!(parse(&input), Ok(Parsed::Header { len, source }));
        }

        #[test]
        fn any_header_arrives_in_any_pieces(
            (input, len, source) in any_header(),
            pieces in prop::collection::vec(1usize..20, 1..100),
        ) {
            // The connection's loop: read a piece, parse what has arrived, until an answer.
            let mut received = 0;
            let mut answer = Ok(Parsed::Incomplete);
            for piece in pieces.iter().copied().chain(std::iter::repeat(1)) {
                if received == input.len() || answer != Ok(Parsed::Incomplete) {
                    break;
                }
                received = (received + piece).min(input.len());
                answer = parse(&input[..received]);
            }
            prop_assert_eq!(answer, Ok(Parsed::Header { len, source }));
            prop_assert!(received >= len);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_answers_are_final(input in any_input()) {
            let whole = parse(&input);
            if let Ok(Parsed::Header { len, .. }) = whole {
                prop_assert!(len <= input.len() && len <= MAX_LEN);
            }
            if whole == Ok(Parsed::Incomplete) {
                prop_assert!(input.len() < MAX_LEN);
            }
            // An answer given for a prefix does not change with more bytes.
            for end in 0..input.len() {
                let early = parse(&input[..end]);
                match early {
                    Ok(Parsed::Incomplete) => {}
                    Ok(header) => prop_assert_eq!(&whole, &Ok(header), "{} bytes", end),
                    Err(_) => prop_assert!(whole.is_err(), "{} bytes: {:?}, then {:?}", end, early, whole),
                }
            }
        }

        #[test]
        fn long_inputs_get_an_answer(
            start in prop::sample::select(STARTS.to_vec()),
            rest in prop::collection::vec(any::<u8>(), MAX_LEN..MAX_LEN + 100),
        ) {
            // Never `Incomplete` for MAX_LEN bytes or more: the read buffer need not grow.
            let input = [start, &rest[..]].concat();
            prop_assert_ne!(parse(&input), Ok(Parsed::Incomplete));
        }

        #[test]
        fn cidr_contains_its_network_and_displays_back(addr in any_ip(), prefix_len in 0u8..=128) {
            let prefix_len = prefix_len.min(max_prefix_len(addr));
            let network = mask(addr, prefix_len);
            let net = Cidr::new(network, prefix_len).unwrap();
            // Except that IPv6 networks do not contain IPv4-mapped addresses.
            let mapped_in_v6 = |ip: IpAddr| net.network().is_ipv6() && ip.to_canonical().is_ipv4();
            prop_assert_eq!(net.contains(addr), !mapped_in_v6(addr));
            prop_assert_eq!(net.contains(network), !mapped_in_v6(network));
            prop_assert_eq!(net.to_string().parse::<Cidr>(), Ok(net));
            // A bare address is a network of one.
            let host = network.to_string().parse::<Cidr>().unwrap();
            prop_assert_eq!(host.contains(addr), addr.to_canonical() == network.to_canonical());
        }

        #[test]
        fn cidr_contains_agrees_with_bits(net_addr in any_ip(), prefix_len in 0u8..=128, other in any_ip()) {
            let prefix_len = prefix_len.min(max_prefix_len(net_addr));
            let net = Cidr::new(mask(net_addr, prefix_len), prefix_len).unwrap();
            // Reference: compare the first bits of both addresses in their canonical forms.
            let (a, b) = (net.network(), other.to_canonical());
            let expected = match (a, b) {
                (IpAddr::V4(a), IpAddr::V4(b)) => {
                    let p = net.prefix_len();
                    (0..p).all(|i| (u32::from(a) >> (31 - i)) & 1 == (u32::from(b) >> (31 - i)) & 1)
                }
                (IpAddr::V6(a), IpAddr::V6(b)) => {
                    let p = net.prefix_len();
                    (0..p).all(|i| (u128::from(a) >> (127 - i)) & 1 == (u128::from(b) >> (127 - i)) & 1)
                }
                _ => false,
            };
            prop_assert_eq!(net.contains(other), expected);
        }
    }
}

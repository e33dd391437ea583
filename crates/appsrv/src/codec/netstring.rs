//! D. J. Bernstein's netstrings: `<len>:<payload>,`.

use std::io::{self, Write};

use super::{Codec, Decoded, Outcome, ProtocolError, Respond};

/// The decimal digits of `usize::MAX` on a 64-bit target: room for any length.
const MAX_DIGITS: usize = 20;

/// Writes `n` in decimal at the end of `buf`; returns the digits.
fn decimal(mut n: usize, buf: &mut [u8; MAX_DIGITS]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// Appends the netstring of the concatenation of `parts`.
fn push_netstring(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let len = parts.iter().map(|p| p.len()).sum();
    out.extend_from_slice(decimal(len, &mut [0; MAX_DIGITS]));
    out.push(b':');
    for part in parts {
        out.extend_from_slice(part);
    }
    out.push(b',');
}

/// [Netstrings](https://cr.yp.to/proto/netstrings.txt): each request and each response
/// is `<len>:<payload>,`, where `<len>` is the payload's length in decimal ASCII digits,
/// without leading zeros (`0:,` is the empty payload). The request is the payload; the
/// handler writes the response payload and [`finish`](Respond::finish) frames it.
///
/// Defaults ([`Netstring::default`]): payloads up to 1 MiB.
///
/// Bad input is refused as soon as it is seen, without waiting for the rest:
/// - a length above the maximum is [`ProtocolError::TooLarge`] with `what: "netstring"`
///   (so the length field never has more digits than the maximum needs);
/// - anything else that is not a netstring is [`ProtocolError::Malformed`]: a byte other
///   than a digit before the `:`, an empty length, a leading zero, a payload not followed
///   by `,`, a length that overflows `usize` (possible only with a maximum near
///   `usize::MAX`).
///
/// The maximum applies to requests only; responses may be of any length.
///
/// The error reply is a netstring whose payload is `ERR <reason>` (UTF-8 text, for example
/// `40:ERR netstring too large (limit 16 bytes),`); the connection is closed after it.
#[derive(Debug, Clone)]
pub struct Netstring {
    max: usize,
    /// The number of length digits reserved at the start of the next response: that of
    /// the previous response (see [`NetstringResponse`]).
    width_hint: usize,
}

impl Default for Netstring {
    /// Payloads up to 1 MiB.
    fn default() -> Self {
        Netstring::new(Netstring::DEFAULT_MAX)
    }
}

impl Netstring {
    /// The default maximum payload of a request: 1 MiB.
    pub const DEFAULT_MAX: usize = 1024 * 1024;

    /// Request payloads up to `max` bytes (the length, `:` and `,` not counted).
    pub fn new(max: usize) -> Self {
        Netstring { max, width_hint: 1 }
    }

    /// The largest request payload accepted, in bytes.
    pub fn max_payload(&self) -> usize {
        self.max
    }
}

/// The response to one netstring: `Write` (or [`push`](NetstringResponse::push)) appends
/// to the payload; [`finish`](Respond::finish) writes the length in front of it and the
/// `,` after it.
///
/// The length's digits are known only at the end, and a netstring has no padding: a
/// fixed-width placeholder would have to be filled with leading zeros, which the format
/// forbids (this codec refuses them, as do other implementations). So the response
/// reserves as many digits as the previous response's length had and, if the length
/// turns out to have another number of digits, `finish` moves the payload (one
/// `memmove`) to fit. A server's responses tend to be of similar sizes, so the guess is
/// usually right and nothing moves; when it is wrong, the move costs less than writing
/// the payload did (the bytes were just written and are in cache), and it is still
/// cheaper than always building the payload in a separate buffer and copying it.
#[derive(Debug)]
pub struct NetstringResponse<'a> {
    out: &'a mut Vec<u8>,
    /// Where the netstring starts in `out`.
    start: usize,
    /// The digits reserved after `start`, followed by one byte for the `:`.
    reserved: usize,
    /// The codec's guess for the next response.
    width_hint: &'a mut usize,
    close: bool,
}

impl NetstringResponse<'_> {
    /// Closes the connection after this response.
    pub fn close(&mut self) {
        self.close = true;
    }

    /// Appends bytes to the payload.
    pub fn push(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// Where the payload starts in `out`.
    fn body(&self) -> usize {
        self.start + self.reserved + 1
    }

    /// The payload's length so far.
    pub fn len(&self) -> usize {
        self.out.len() - self.body()
    }

    /// Whether the payload is empty so far.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Write for NetstringResponse<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.out.extend_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Respond for NetstringResponse<'_> {
    fn finish(self) -> Outcome {
        let body = self.body();
        let len = self.len();
        let mut buf = [0; MAX_DIGITS];
        let digits = decimal(len, &mut buf);
        let width = digits.len();
        if width != self.reserved {
            let new_body = self.start + width + 1;
            if new_body > body {
                self.out.resize(new_body + len, 0);
            }
            self.out.copy_within(body..body + len, new_body);
            self.out.truncate(new_body + len);
        }
        self.out[self.start..self.start + width].copy_from_slice(digits);
        self.out[self.start + width] = b':';
        self.out.push(b',');
        *self.width_hint = width;
        Outcome {
            close: self.close,
            file: None,
        }
    }
}

impl Codec for Netstring {
    /// The payload.
    type Request<'a> = &'a [u8];
    type Response<'a> = NetstringResponse<'a>;

    /// The largest payload with its length, `:` and `,`.
    fn max_request_size(&self) -> usize {
        let digits = decimal(self.max, &mut [0; MAX_DIGITS]).len();
        self.max.saturating_add(digits + 2)
    }

    fn decode<'a>(&mut self, buf: &'a mut [u8]) -> Result<Decoded<&'a [u8]>, ProtocolError> {
        let buf: &'a [u8] = buf;
        let mut len: usize = 0;
        let mut colon = 0;
        loop {
            let Some(&b) = buf.get(colon) else {
                return Ok(Decoded::incomplete());
            };
            match b {
                b'0'..=b'9' => {
                    if colon == 1 && buf[0] == b'0' {
                        return Err(ProtocolError::Malformed(
                            "leading zero in a netstring length".into(),
                        ));
                    }
                    len = len
                        .checked_mul(10)
                        .and_then(|l| l.checked_add(usize::from(b - b'0')))
                        .ok_or(ProtocolError::Malformed("netstring length overflows".into()))?;
                    if len > self.max {
                        return Err(ProtocolError::TooLarge {
                            what: "netstring",
                            limit: self.max,
                        });
                    }
                    colon += 1;
                }
                b':' if colon > 0 => break,
                b':' => return Err(ProtocolError::Malformed("empty netstring length".into())),
                _ => {
                    return Err(ProtocolError::Malformed(
                        "netstring length is not a decimal number followed by ':'".into(),
                    ));
                }
            }
        }
        let start = colon + 1;
        // len <= max: the sum overflows only with a maximum near usize::MAX.
        let Some(end) = start.checked_add(len) else {
            return Err(ProtocolError::Malformed("netstring length overflows".into()));
        };
        match buf.get(end) {
            None => Ok(Decoded::incomplete()),
            Some(b',') => Ok(Decoded::Request {
                request: &buf[start..end],
                len: end + 1,
            }),
            Some(_) => Err(ProtocolError::Malformed(
                "netstring payload not followed by ','".into(),
            )),
        }
    }

    fn respond<'a>(&'a mut self, _req: &&[u8], out: &'a mut Vec<u8>, _last: bool) -> NetstringResponse<'a> {
        let start = out.len();
        let reserved = self.width_hint.clamp(1, MAX_DIGITS);
        out.resize(start + reserved + 1, 0);
        NetstringResponse {
            out,
            start,
            reserved,
            width_hint: &mut self.width_hint,
            close: false,
        }
    }

    fn encode_error(&mut self, err: &ProtocolError, out: &mut Vec<u8>) {
        push_netstring(out, &[b"ERR ", err.to_string().as_bytes()]);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::testing::decode_all;
    use super::*;

    fn netstrings(max: usize, input: &[u8], chunk: usize) -> Result<Vec<Vec<u8>>, ProtocolError> {
        decode_all(&mut Netstring::new(max), input, chunk, |p| p.to_vec())
    }

    /// Encodes `payloads` as responses of `codec`, each written in two pieces.
    fn encode(codec: &mut Netstring, payloads: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            let mut res = codec.respond(&&b""[..], &mut out, false);
            let (a, b) = p.split_at(p.len() / 2);
            res.write_all(a).unwrap();
            res.push(b);
            let outcome = res.finish();
            assert!(!outcome.close);
        }
        out
    }

    #[test]
    fn splits_at_every_byte_boundary() {
        let input = b"5:hello,0:,12:hello world!,1:,,";
        for chunk in 1..=input.len() {
            assert_eq!(
                netstrings(100, input, chunk).unwrap(),
                vec![b"hello".to_vec(), vec![], b"hello world!".to_vec(), b",".to_vec()],
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn incomplete_netstrings_wait() {
        let mut codec = Netstring::default();
        for input in [&b""[..], b"1", b"12", b"0", b"0:", b"3:", b"3:ab", b"3:abc"] {
            assert!(
                matches!(
                    codec.decode(&mut input.to_vec()),
                    Ok(Decoded::Incomplete { interim: None })
                ),
                "{input:?}"
            );
        }
        let mut buf = b"3:abc,7:".to_vec();
        match codec.decode(&mut buf) {
            Ok(Decoded::Request { request, len }) => assert_eq!((request, len), (&b"abc"[..], 6)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_netstrings_are_refused_as_soon_as_seen() {
        for input in [
            &b"x"[..],
            b":",
            b":,",
            b" 3:abc,",
            b"-1:",
            b"+1:a,",
            b"3x",
            b"3,abc,",
            b"00:,",
            b"01:a,",
            b"3:abc;",
            b"3:abcd,",
            b"0:x",
            b"1:a,2:bc.",
        ] {
            for chunk in [1, input.len()] {
                let e = netstrings(100, input, chunk).unwrap_err();
                assert!(matches!(e, ProtocolError::Malformed(_)), "{input:?}: {e:?}");
            }
        }
        let e = netstrings(usize::MAX, b"99999999999999999999999:", 1).unwrap_err();
        assert_eq!(e, ProtocolError::Malformed("netstring length overflows".into()));
    }

    #[test]
    fn oversize_netstrings_are_refused_as_soon_as_the_length_exceeds_the_maximum() {
        assert_eq!(Netstring::new(100).max_request_size(), 105);
        assert_eq!(Netstring::default().max_payload(), 1024 * 1024);
        assert_eq!(Netstring::default().max_request_size(), 1024 * 1024 + 9);
        let fits = [b"100:".to_vec(), vec![b'x'; 100], b",".to_vec()].concat();
        assert_eq!(netstrings(100, &fits, 1).unwrap(), vec![vec![b'x'; 100]]);
        let too_large = ProtocolError::TooLarge {
            what: "netstring",
            limit: 100,
        };
        for input in [&b"101"[..], b"1000", b"999999999999999999999999999"] {
            assert_eq!(netstrings(100, input, 1).unwrap_err(), too_large, "{input:?}");
        }
        assert_eq!(
            netstrings(0, b"0:,1", 1).unwrap_err().to_string(),
            "netstring too large (limit 0 bytes)"
        );
    }

    #[test]
    fn responses_reserve_the_previous_width_and_move_when_it_changes() {
        let mut codec = Netstring::default();
        let mut out = b"earlier".to_vec();
        let mut expected = out.clone();
        for len in [0, 5, 9, 10, 1234, 1000, 99, 7, 100_000, 3] {
            let mut res = codec.respond(&&b""[..], &mut out, false);
            res.push(&vec![b'a'; len]);
            assert_eq!(res.len(), len);
            assert!(!res.finish().close);
            expected.extend_from_slice(format!("{len}:").as_bytes());
            expected.extend_from_slice(&vec![b'a'; len]);
            expected.push(b',');
            assert_eq!(out, expected, "len {len}");
        }
        let mut res = codec.respond(&&b""[..], &mut out, false);
        write!(res, "bye").unwrap();
        res.close();
        assert!(res.finish().close);
        assert!(out.ends_with(b"3:bye,"));
    }

    #[test]
    fn errors_are_netstrings() {
        let mut out = Vec::new();
        Netstring::new(16).encode_error(
            &ProtocolError::TooLarge {
                what: "netstring",
                limit: 16,
            },
            &mut out,
        );
        assert_eq!(out, b"40:ERR netstring too large (limit 16 bytes),");
        assert_eq!(
            netstrings(100, &out, 1).unwrap(),
            vec![b"ERR netstring too large (limit 16 bytes)".to_vec()]
        );
    }

    proptest! {
        #[test]
        fn decode_inverts_encode(
            payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..8),
            chunk in 1usize..64,
        ) {
            let mut codec = Netstring::new(300);
            let wire = encode(&mut codec, &payloads);
            prop_assert_eq!(netstrings(300, &wire, chunk)?, payloads);
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            max in 0usize..100,
            input in prop::collection::vec(any::<u8>(), 0..200),
            chunk in 1usize..16,
        ) {
            if let Ok(payloads) = netstrings(max, &input, chunk) {
                prop_assert!(payloads.iter().all(|p| p.len() <= max));
            }
        }

        #[test]
        fn netstring_like_bytes_never_panic(
            max in prop_oneof![0usize..100, Just(usize::MAX)],
            input in prop::collection::vec(prop::sample::select(b"0123456789:,x".to_vec()), 0..200),
            chunk in 1usize..16,
        ) {
            if let Ok(payloads) = netstrings(max, &input, chunk) {
                prop_assert!(payloads.iter().all(|p| p.len() <= max));
            }
        }
    }
}

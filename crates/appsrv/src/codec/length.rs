//! Frames with a big-endian binary length prefix.

use std::io::{self, Write};

use super::{Codec, Decoded, Outcome, ProtocolError, Respond};

/// The width of a frame's length prefix: an unsigned big-endian integer that counts the
/// payload bytes after it (not itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Prefix {
    /// Two bytes: payloads up to 65535 bytes.
    U16,
    /// Four bytes: payloads up to 4 GiB − 1.
    U32,
}

impl Prefix {
    /// The prefix's size in bytes (2 or 4).
    pub const fn width(self) -> usize {
        match self {
            Prefix::U16 => 2,
            Prefix::U32 => 4,
        }
    }

    /// The largest payload the prefix can count (65535 or 4294967295, capped at
    /// `usize::MAX`).
    pub const fn capacity(self) -> usize {
        match self {
            Prefix::U16 => u16::MAX as usize,
            Prefix::U32 => {
                if usize::BITS > 32 {
                    u32::MAX as usize
                } else {
                    usize::MAX
                }
            }
        }
    }

    /// Reads the length at the front of `bytes`, which holds at least `width()` bytes.
    fn read(self, bytes: &[u8]) -> usize {
        match self {
            Prefix::U16 => u16::from_be_bytes([bytes[0], bytes[1]]) as usize,
            // On a 32-bit target a length above usize::MAX cannot occur: capacity() is
            // usize::MAX there. Saturating keeps it "too large" rather than wrapping.
            Prefix::U32 => usize::try_from(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
                .unwrap_or(usize::MAX),
        }
    }

    /// Writes `len` (at most `capacity()`) into the first `width()` bytes of `bytes`.
    fn write(self, len: usize, bytes: &mut [u8]) {
        debug_assert!(len <= self.capacity());
        match self {
            Prefix::U16 => bytes[..2].copy_from_slice(&(len as u16).to_be_bytes()),
            Prefix::U32 => bytes[..4].copy_from_slice(&(len as u32).to_be_bytes()),
        }
    }
}

/// Appends a whole frame holding `payload`, cut to what the prefix can count (only error
/// messages go through here, and they are far shorter than 64 KiB).
fn push_frame(out: &mut Vec<u8>, prefix: Prefix, payload: &[&[u8]]) {
    let start = out.len();
    out.resize(start + prefix.width(), 0);
    let mut room = prefix.capacity();
    for part in payload {
        let part = &part[..part.len().min(room)];
        out.extend_from_slice(part);
        room -= part.len();
    }
    let len = out.len() - start - prefix.width();
    prefix.write(len, &mut out[start..]);
}

/// A binary framing: each request and each response is a length prefix ([`Prefix::U16`]
/// or [`Prefix::U32`], big-endian, counting the payload only) followed by the payload.
/// The request is the payload; the handler writes the response payload and
/// [`finish`](Respond::finish) fills in its length.
///
/// Defaults ([`LengthPrefixed::default`]): a 4-byte prefix and payloads up to 1 MiB.
///
/// A request frame whose prefix announces more than the maximum is refused as soon as
/// the prefix arrives ([`ProtocolError::TooLarge`] with `what: "frame"`), without waiting
/// for (or buffering) its payload. The maximum applies to requests only: a response may
/// be as large as its prefix can count (see [`LengthResponse`] for what happens beyond).
///
/// The error reply is a frame whose payload is `ERR <reason>` (UTF-8 text, for example
/// `ERR frame too large (limit 1048576 bytes)`); the connection is closed after it.
#[derive(Debug, Clone)]
pub struct LengthPrefixed {
    prefix: Prefix,
    max: usize,
}

impl Default for LengthPrefixed {
    /// A 4-byte big-endian prefix ([`Prefix::U32`]), payloads up to 1 MiB.
    fn default() -> Self {
        LengthPrefixed::new(Prefix::U32)
    }
}

impl LengthPrefixed {
    /// The default maximum payload of a request: 1 MiB.
    pub const DEFAULT_MAX_FRAME: usize = 1024 * 1024;

    /// Frames with a `prefix`-sized length, payloads up to 1 MiB (with [`Prefix::U16`],
    /// up to 65535 bytes, all it can count).
    pub fn new(prefix: Prefix) -> Self {
        LengthPrefixed {
            prefix,
            max: Self::DEFAULT_MAX_FRAME.min(prefix.capacity()),
        }
    }

    /// Request payloads up to `max` bytes (default 1 MiB), capped at what the prefix can
    /// count (65535 for [`Prefix::U16`]). The prefix is not counted.
    pub fn max_frame(mut self, max: usize) -> Self {
        self.max = max.min(self.prefix.capacity());
        self
    }

    /// The prefix width.
    pub fn prefix(&self) -> Prefix {
        self.prefix
    }

    /// The largest request payload accepted, in bytes.
    pub fn max_payload(&self) -> usize {
        self.max
    }
}

/// The response to one frame: `Write` (or [`push`](LengthResponse::push)) appends to the
/// payload; [`finish`](Respond::finish) writes its length into the prefix, which was
/// reserved in the output buffer when the response started.
///
/// # A response too large for its prefix
///
/// If the payload exceeds what the prefix can count (65535 bytes with [`Prefix::U16`],
/// 4 GiB − 1 with [`Prefix::U32`]), `finish` discards it and puts in its place an error
/// frame, whose payload is `ERR response too large (<n> bytes, the prefix counts at most
/// <capacity>)`, and the connection is closed after it. The alternatives are worse:
/// a truncated payload would reach the peer as a well-formed but wrong answer, and a
/// length that wrapped around would desynchronise the stream, so that the peer would
/// read the rest of the payload as the next frames. The error frame keeps the stream
/// well-formed and tells the peer that this answer is missing; closing the connection
/// treats the handler's mistake like a protocol error, and it is logged.
#[derive(Debug)]
pub struct LengthResponse<'a> {
    out: &'a mut Vec<u8>,
    /// Where the prefix starts in `out`.
    start: usize,
    prefix: Prefix,
    close: bool,
}

impl LengthResponse<'_> {
    /// Closes the connection after this response.
    pub fn close(&mut self) {
        self.close = true;
    }

    /// Appends bytes to the payload.
    pub fn push(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// The payload's length so far.
    pub fn len(&self) -> usize {
        self.out.len() - self.start - self.prefix.width()
    }

    /// Whether the payload is empty so far.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Write for LengthResponse<'_> {
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

impl Respond for LengthResponse<'_> {
    fn finish(self) -> Outcome {
        let len = self.len();
        let capacity = self.prefix.capacity();
        if len > capacity {
            tracing::error!(
                "response of {len} bytes too large for a {}-byte length prefix; \
                 sending an error frame instead and closing the connection",
                self.prefix.width()
            );
            self.out.truncate(self.start);
            let reason = format!("response too large ({len} bytes, the prefix counts at most {capacity})");
            push_frame(self.out, self.prefix, &[b"ERR ", reason.as_bytes()]);
            return Outcome {
                close: true,
                file: None,
            };
        }
        self.prefix.write(len, &mut self.out[self.start..]);
        Outcome {
            close: self.close,
            file: None,
        }
    }
}

impl Codec for LengthPrefixed {
    /// The frame's payload.
    type Request<'a> = &'a [u8];
    type Response<'a> = LengthResponse<'a>;

    /// The prefix and the largest payload.
    fn max_request_size(&self) -> usize {
        self.prefix.width().saturating_add(self.max)
    }

    fn decode<'a>(&mut self, buf: &'a mut [u8]) -> Result<Decoded<&'a [u8]>, ProtocolError> {
        let buf: &'a [u8] = buf;
        let width = self.prefix.width();
        if buf.len() < width {
            return Ok(Decoded::incomplete());
        }
        let len = self.prefix.read(buf);
        if len > self.max {
            return Err(ProtocolError::TooLarge {
                what: "frame",
                limit: self.max,
            });
        }
        // len <= max <= capacity: the sum cannot overflow on a 64-bit target.
        let Some(end) = width.checked_add(len) else {
            return Err(ProtocolError::TooLarge {
                what: "frame",
                limit: self.max,
            });
        };
        match buf.get(width..end) {
            Some(payload) => Ok(Decoded::Request {
                request: payload,
                len: end,
            }),
            None => Ok(Decoded::incomplete()),
        }
    }

    fn respond<'a>(&'a mut self, _req: &&[u8], out: &'a mut Vec<u8>, _last: bool) -> LengthResponse<'a> {
        let start = out.len();
        out.resize(start + self.prefix.width(), 0);
        LengthResponse {
            out,
            start,
            prefix: self.prefix,
            close: false,
        }
    }

    fn encode_error(&mut self, err: &ProtocolError, out: &mut Vec<u8>) {
        push_frame(out, self.prefix, &[b"ERR ", err.to_string().as_bytes()]);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::testing::decode_all;
    use super::*;

    fn frames(codec: LengthPrefixed, input: &[u8], chunk: usize) -> Result<Vec<Vec<u8>>, ProtocolError> {
        decode_all(&mut codec.clone(), input, chunk, |p| p.to_vec())
    }

    /// Encodes `payloads` as responses of `codec`, each written in two pieces.
    fn encode(codec: &mut LengthPrefixed, payloads: &[Vec<u8>]) -> Vec<u8> {
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
        let input = b"\0\0\0\x03one\0\0\0\0\0\0\0\x05three";
        for chunk in 1..=input.len() {
            assert_eq!(
                frames(LengthPrefixed::default(), input, chunk).unwrap(),
                vec![b"one".to_vec(), vec![], b"three".to_vec()],
                "chunk {chunk}"
            );
        }
        let input = b"\0\x03one\0\0\0\x01x";
        for chunk in 1..=input.len() {
            assert_eq!(
                frames(LengthPrefixed::new(Prefix::U16), input, chunk).unwrap(),
                vec![b"one".to_vec(), vec![], b"x".to_vec()],
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn incomplete_frames_wait() {
        let mut codec = LengthPrefixed::default();
        for input in [&b""[..], b"\0", b"\0\0\0", b"\0\0\0\x02", b"\0\0\0\x02a"] {
            assert!(matches!(
                codec.decode(&mut input.to_vec()),
                Ok(Decoded::Incomplete { interim: None })
            ));
        }
        let mut buf = b"\0\0\0\x02ab\0\0".to_vec();
        match codec.decode(&mut buf) {
            Ok(Decoded::Request { request, len }) => assert_eq!((request, len), (&b"ab"[..], 6)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn oversize_frames_are_refused_as_soon_as_the_prefix_arrives() {
        let codec = LengthPrefixed::new(Prefix::U32).max_frame(8);
        assert_eq!(codec.max_request_size(), 12);
        assert_eq!(
            frames(codec.clone(), b"\0\0\0\x08abcdefgh", 1).unwrap(),
            vec![b"abcdefgh".to_vec()]
        );
        let e = frames(codec.clone(), b"\0\0\0\x09", 1).unwrap_err();
        assert_eq!(
            e,
            ProtocolError::TooLarge {
                what: "frame",
                limit: 8
            }
        );
        let e = frames(codec, b"\xff\xff\xff\xff", 4).unwrap_err();
        assert_eq!(
            e,
            ProtocolError::TooLarge {
                what: "frame",
                limit: 8
            }
        );
    }

    #[test]
    fn limits_are_capped_by_the_prefix() {
        assert_eq!(LengthPrefixed::default().max_payload(), 1024 * 1024);
        assert_eq!(LengthPrefixed::default().prefix(), Prefix::U32);
        assert_eq!(LengthPrefixed::new(Prefix::U16).max_payload(), 65535);
        assert_eq!(
            LengthPrefixed::new(Prefix::U16).max_frame(1 << 20).max_payload(),
            65535
        );
        assert_eq!(LengthPrefixed::new(Prefix::U16).max_request_size(), 65537);
        assert_eq!(LengthPrefixed::new(Prefix::U16).max_frame(10).max_payload(), 10);
        let u16_max = frames(LengthPrefixed::new(Prefix::U16), &[0xff; 65537], 4096).unwrap();
        assert_eq!(u16_max, vec![vec![0xff; 65535]]);
    }

    #[test]
    fn responses_fill_in_their_prefix_after_earlier_output() {
        let mut codec = LengthPrefixed::new(Prefix::U16);
        let mut out = b"earlier".to_vec();
        let mut res = codec.respond(&&b"req"[..], &mut out, false);
        assert!(res.is_empty());
        write!(res, "hello {}", 42).unwrap();
        assert_eq!(res.len(), 8);
        res.close();
        assert!(res.finish().close);
        assert_eq!(out, b"earlier\0\x08hello 42");
    }

    #[test]
    fn a_response_too_large_for_its_prefix_becomes_an_error_frame_and_closes() {
        let mut codec = LengthPrefixed::new(Prefix::U16);
        let mut out = b"\0\x02ok".to_vec();
        let mut res = codec.respond(&&b""[..], &mut out, false);
        res.push(&[b'x'; 65536]);
        assert!(res.finish().close);
        let decoded = frames(LengthPrefixed::new(Prefix::U16), &out, out.len()).unwrap();
        assert_eq!(
            decoded,
            vec![
                b"ok".to_vec(),
                b"ERR response too large (65536 bytes, the prefix counts at most 65535)".to_vec()
            ]
        );

        // Exactly the capacity is fine.
        let mut out = Vec::new();
        let mut res = codec.respond(&&b""[..], &mut out, false);
        res.push(&[b'x'; 65535]);
        assert!(!res.finish().close);
        assert_eq!(&out[..2], b"\xff\xff");
        assert_eq!(out.len(), 65537);
    }

    #[test]
    fn errors_are_frames() {
        let mut out = Vec::new();
        LengthPrefixed::default().encode_error(
            &ProtocolError::TooLarge {
                what: "frame",
                limit: 8,
            },
            &mut out,
        );
        let msg = b"ERR frame too large (limit 8 bytes)";
        assert_eq!(out[..4], (msg.len() as u32).to_be_bytes());
        assert_eq!(&out[4..], msg);
        let mut out = Vec::new();
        LengthPrefixed::new(Prefix::U16).encode_error(&ProtocolError::Timeout, &mut out);
        let decoded = frames(LengthPrefixed::new(Prefix::U16), &out, 1).unwrap();
        assert_eq!(
            decoded,
            vec![b"ERR timed out waiting for the rest of the request".to_vec()]
        );
    }

    fn prefixes() -> impl Strategy<Value = Prefix> {
        prop_oneof![Just(Prefix::U16), Just(Prefix::U32)]
    }

    proptest! {
        #[test]
        fn decode_inverts_encode(
            prefix in prefixes(),
            payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..8),
            chunk in 1usize..64,
        ) {
            let mut codec = LengthPrefixed::new(prefix).max_frame(300);
            let wire = encode(&mut codec, &payloads);
            prop_assert_eq!(frames(codec, &wire, chunk)?, payloads);
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            prefix in prefixes(),
            max in 0usize..100,
            input in prop::collection::vec(any::<u8>(), 0..200),
            chunk in 1usize..16,
        ) {
            let codec = LengthPrefixed::new(prefix).max_frame(max);
            if let Ok(frames) = frames(codec, &input, chunk) {
                prop_assert!(frames.iter().all(|f| f.len() <= max));
            }
        }
    }
}

//! Lines ending in `\n` or `\r\n`.

use std::fmt;
use std::io::{self, Write};
use std::ops::Deref;

use super::{Codec, Decoded, Outcome, ProtocolError, Respond};

/// A line protocol: each request is one [`Line`] ending in `\n` (a `\r` before it is
/// removed); the handler writes the response ([`LinesResponse::line`] adds `\r\n`).
///
/// The error reply is `-ERR <reason>\r\n`, as Redis and many line protocols do; change it
/// with [`Lines::error_prefix`].
#[derive(Debug, Clone)]
pub struct Lines {
    max: usize,
    error_prefix: &'static str,
}

impl Default for Lines {
    /// Lines up to 8 KiB, errors as `-ERR <reason>`.
    fn default() -> Self {
        Lines::new(8 * 1024)
    }
}

impl Lines {
    /// Lines up to `max` bytes (terminator included).
    pub fn new(max: usize) -> Self {
        Lines {
            max: max.max(2),
            error_prefix: "-ERR ",
        }
    }

    /// The text before the reason in an error reply (default `-ERR `).
    pub fn error_prefix(mut self, prefix: &'static str) -> Self {
        self.error_prefix = prefix;
        self
    }
}

/// One request of the [`Lines`] codec: a line's bytes, without its terminator.
///
/// It dereferences to `[u8]` (`line.starts_with(b"GET ")`, `&line[..4]`), and
/// [`to_str`](Line::to_str) gives the text of a protocol that is UTF-8:
///
/// ```
/// # fn main() -> std::io::Result<()> {
/// let line = appsrv::codec::Line::new(b"SET color blue");
/// let words: Vec<&str> = line.to_str()?.split_whitespace().collect();
/// assert_eq!(words, ["SET", "color", "blue"]);
/// assert!(appsrv::codec::Line::new(b"\xff").to_str().is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Line<'a>(&'a [u8]);

impl<'a> Line<'a> {
    /// A line of these bytes (to call a handler in a unit test).
    pub fn new(bytes: &'a [u8]) -> Self {
        Line(bytes)
    }

    /// The line's bytes, without the terminator.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }

    /// The line as text, or an error of kind [`InvalidData`](io::ErrorKind::InvalidData)
    /// if it is not UTF-8: returned from a handler with `?`, it ends the connection with a
    /// log line that names the client.
    pub fn to_str(&self) -> io::Result<&'a str> {
        std::str::from_utf8(self.0).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the line is not UTF-8 (byte {})", e.valid_up_to()),
            )
        })
    }
}

impl Deref for Line<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.0
    }
}

impl AsRef<[u8]> for Line<'_> {
    fn as_ref(&self) -> &[u8] {
        self.0
    }
}

impl PartialEq<[u8]> for Line<'_> {
    fn eq(&self, other: &[u8]) -> bool {
        self.0 == other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for Line<'_> {
    fn eq(&self, other: &[u8; N]) -> bool {
        self.0 == other
    }
}

impl PartialEq<str> for Line<'_> {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl fmt::Display for Line<'_> {
    /// The line as text, with U+FFFD for bytes that are not UTF-8.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&String::from_utf8_lossy(self.0), f)
    }
}

/// The response to one line: `Write` appends to the output buffer.
///
/// Also the natural response type of any codec of your own whose responses are plain
/// bytes: create it with [`LinesResponse::new`] in [`Codec::respond`].
#[derive(Debug)]
pub struct LinesResponse<'a> {
    out: &'a mut Vec<u8>,
    close: bool,
}

impl<'a> LinesResponse<'a> {
    /// A response appended to `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        LinesResponse { out, close: false }
    }
}

impl LinesResponse<'_> {
    /// Closes the connection after this response (a `QUIT` command).
    pub fn close(&mut self) {
        self.close = true;
    }

    /// Appends bytes to the response.
    pub fn push(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// Appends a line of text: `text`, then `\r\n` (`out.line("OK")`, `out.line(count)`).
    pub fn line(&mut self, text: impl fmt::Display) {
        // Writing into a Vec cannot fail.
        let _ = write!(self.out, "{text}\r\n");
    }
}

impl Write for LinesResponse<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Respond for LinesResponse<'_> {
    fn finish(self) -> Outcome {
        Outcome {
            close: self.close,
            file: None,
        }
    }
}

impl Codec for Lines {
    /// The line without its terminator.
    type Request<'a> = Line<'a>;
    type Response<'a> = LinesResponse<'a>;

    fn max_request_size(&self) -> usize {
        self.max
    }

    fn decode<'a>(&mut self, buf: &'a mut [u8]) -> Result<Decoded<Line<'a>>, ProtocolError> {
        let buf: &'a [u8] = buf;
        let Some(nl) = buf.iter().position(|b| *b == b'\n') else {
            if buf.len() >= self.max {
                return Err(ProtocolError::TooLarge {
                    what: "line",
                    limit: self.max,
                });
            }
            return Ok(Decoded::incomplete());
        };
        if nl + 1 > self.max {
            return Err(ProtocolError::TooLarge {
                what: "line",
                limit: self.max,
            });
        }
        let line = &buf[..nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        Ok(Decoded::Request {
            request: Line(line),
            len: nl + 1,
        })
    }

    fn respond<'a>(&'a mut self, _req: &Line<'_>, out: &'a mut Vec<u8>, _last: bool) -> LinesResponse<'a> {
        LinesResponse::new(out)
    }

    fn encode_error(&mut self, err: &ProtocolError, out: &mut Vec<u8>) {
        out.extend_from_slice(self.error_prefix.as_bytes());
        out.extend_from_slice(err.to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::decode_all;
    use super::*;

    fn lines(input: &[u8], chunk: usize) -> Result<Vec<Vec<u8>>, ProtocolError> {
        decode_all(&mut Lines::new(16), input, chunk, |l| l.to_vec())
    }

    #[test]
    fn splits_at_every_byte_boundary() {
        let input = b"one\r\ntwo\n\nthree\r\n";
        for chunk in 1..=input.len() {
            assert_eq!(
                lines(input, chunk).unwrap(),
                vec![b"one".to_vec(), b"two".to_vec(), vec![], b"three".to_vec()],
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn too_long_lines_are_refused_before_the_terminator_arrives() {
        let e = lines(&[b'x'; 40], 1).unwrap_err();
        assert_eq!(
            e,
            ProtocolError::TooLarge {
                what: "line",
                limit: 16
            }
        );
        assert!(lines(b"0123456789abcdefg\n", 100).is_err());
        assert_eq!(
            lines(b"0123456789abcd\r\n", 100).unwrap().len(),
            1,
            "16 bytes with the terminator fit"
        );
    }

    #[test]
    fn a_line_is_its_bytes_and_its_text_when_it_is_utf8() {
        let mut codec = Lines::default();
        let mut buf = b"SET k v\r\nrest".to_vec();
        let Ok(Decoded::Request { request, len }) = codec.decode(&mut buf) else {
            panic!("a whole line")
        };
        assert_eq!(len, 9);
        assert_eq!(request, *b"SET k v");
        assert!(request.starts_with(b"SET"), "derefs to [u8]");
        assert_eq!(request.to_str().unwrap(), "SET k v");
        assert_eq!(request.to_string(), "SET k v");
        let bad = Line::new(b"a\xffb");
        let e = bad.to_str().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(e.to_string(), "the line is not UTF-8 (byte 1)");
        assert_eq!(
            bad.to_string(),
            "a\u{fffd}b",
            "Display replaces what is not UTF-8"
        );
    }

    #[test]
    fn line_appends_text_and_crlf() {
        let mut out = b"x".to_vec();
        let mut res = LinesResponse::new(&mut out);
        res.line("OK");
        res.line(42);
        assert!(!res.finish().close);
        assert_eq!(out, b"xOK\r\n42\r\n");
    }

    #[test]
    fn errors_are_replies() {
        let mut out = Vec::new();
        Lines::default().encode_error(
            &ProtocolError::TooLarge {
                what: "line",
                limit: 8,
            },
            &mut out,
        );
        assert_eq!(out, b"-ERR line too large (limit 8 bytes)\r\n");
    }
}

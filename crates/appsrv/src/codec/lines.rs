//! Lines ending in `\n` or `\r\n`.

use std::io::{self, Write};

use super::{Codec, Decoded, Outcome, ProtocolError, Respond};

/// A line protocol: each request is one line ending in `\n` (a `\r` before it is removed);
/// the handler writes the response bytes (its own line endings included).
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
    type Request<'a> = &'a [u8];
    type Response<'a> = LinesResponse<'a>;

    fn max_request_size(&self) -> usize {
        self.max
    }

    fn decode<'a>(&mut self, buf: &'a mut [u8]) -> Result<Decoded<&'a [u8]>, ProtocolError> {
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
            request: line,
            len: nl + 1,
        })
    }

    fn respond<'a>(&'a mut self, _req: &&[u8], out: &'a mut Vec<u8>, _last: bool) -> LinesResponse<'a> {
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

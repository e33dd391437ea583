//! A small subset of the Redis protocol, with a codec of its own: the example to copy
//! when your protocol is not one of the built-in codecs.
//!
//! `PING` → `+PONG`, `QUIT` → `+OK` and close, anything else → `-ERR unknown command`.
//! Commands come in the inline form (`PING\r\n`) or as RESP arrays
//! (`*1\r\n$4\r\nPING\r\n`), as Redis accepts them.
//!
//! Run it:
//!
//! ```text
//! cargo run --release --example ping          # serves 127.0.0.1:6380
//! redis-cli -p 6380 ping                      # PONG
//! redis-benchmark -p 6380 -t ping_inline,ping_mbulk -n 100000 -c 8
//! ```
//!
//! I/O model: event (`Server::io(Io::Event)` below): its handler never blocks (it answers
//! from memory), so each worker serves all its clients from one epoll loop, as Redis does,
//! and redis-benchmark's 50 keep-alive clients need no more processes than CPUs.
//! `--io blocking` gives the classic model (one connection at a time per worker).
//!
//! What to observe: pipelined commands (`redis-benchmark -P 16`) are answered in order,
//! their replies written together; a malformed request gets one `-ERR` line and the
//! connection is closed; the worker goes on with the next client.

use std::io;

use appsrv::codec::{Codec, Decoded, LinesResponse, ProtocolError, Summary};

/// A decoded command: its name (the first word or array element).
struct Command<'a> {
    name: &'a [u8],
}

/// The framing of Redis requests: inline commands and RESP arrays of bulk strings.
#[derive(Default)]
struct Resp;

const MAX_REQUEST: usize = 64 * 1024;
const MAX_ARGS: usize = 1024;

/// Reads a `\r\n`-terminated line at `at`; returns it and the offset after it.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let nl = buf.get(at..)?.iter().position(|b| *b == b'\n')?;
    let l = &buf[at..at + nl];
    Some((l.strip_suffix(b"\r").unwrap_or(l), at + nl + 1))
}

fn number(bytes: &[u8]) -> Result<usize, ProtocolError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ProtocolError::Malformed("invalid length".into()))
}

impl Codec for Resp {
    type Request<'a> = Command<'a>;
    type Response<'a> = LinesResponse<'a>;

    fn max_request_size(&self) -> usize {
        MAX_REQUEST
    }

    fn decode<'a>(&mut self, buf: &'a mut [u8]) -> Result<Decoded<Command<'a>>, ProtocolError> {
        let buf: &'a [u8] = buf;
        if buf.first() != Some(&b'*') {
            // Inline command: the first word of a line.
            let Some((l, end)) = line(buf, 0) else {
                return Ok(Decoded::incomplete());
            };
            let name = l.split(|b| *b == b' ').next().unwrap_or_default();
            return Ok(Decoded::Request {
                request: Command { name },
                len: end,
            });
        }
        let Some((head, mut at)) = line(buf, 1) else {
            return Ok(Decoded::incomplete());
        };
        let count = number(head)?;
        if count == 0 || count > MAX_ARGS {
            return Err(ProtocolError::Malformed("invalid multibulk length".into()));
        }
        let mut name: &[u8] = &[];
        for i in 0..count {
            let Some((hdr, data)) = line(buf, at) else {
                return Ok(Decoded::incomplete());
            };
            let len = match hdr.split_first() {
                Some((b'$', n)) => number(n)?,
                _ => return Err(ProtocolError::Malformed("expected '$'".into())),
            };
            if len > MAX_REQUEST {
                return Err(ProtocolError::TooLarge {
                    what: "bulk string",
                    limit: MAX_REQUEST,
                });
            }
            if buf.len() < data + len + 2 {
                return Ok(Decoded::incomplete());
            }
            if &buf[data + len..data + len + 2] != b"\r\n" {
                return Err(ProtocolError::Malformed(
                    "bulk string not followed by CRLF".into(),
                ));
            }
            if i == 0 {
                name = &buf[data..data + len];
            }
            at = data + len + 2;
        }
        Ok(Decoded::Request {
            request: Command { name },
            len: at,
        })
    }

    fn respond<'a>(&'a mut self, _: &Command<'_>, out: &'a mut Vec<u8>, _last: bool) -> LinesResponse<'a> {
        LinesResponse::new(out)
    }

    fn encode_error(&mut self, err: &ProtocolError, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("-ERR Protocol error: {err}\r\n").as_bytes());
    }

    /// What the status page, `status` and the slow-request and timeout log lines show of
    /// a request in progress, from its first bytes: the name of a command this server
    /// knows, nothing else (a request's bytes may hold a password). Without this method,
    /// nothing is shown.
    fn summarize(&self, head: &[u8], summary: &mut Summary) {
        let mut words = head.split(|b| b.is_ascii_whitespace()).filter(|w| !w.is_empty());
        // The first word that is not an array's or a bulk string's length.
        let name = words.find(|w| !matches!(w[0], b'*' | b'$')).unwrap_or_default();
        for known in [&b"PING"[..], b"QUIT"] {
            if name.eq_ignore_ascii_case(known) {
                summary.push(known);
            }
        }
    }
}

struct Ping;

impl appsrv::RequestHandler for Ping {
    type Codec = Resp;
    type Session = ();

    fn handle_request(
        &mut self,
        _conn: &mut appsrv::Conn<'_>,
        cmd: &Command<'_>,
        out: &mut LinesResponse<'_>,
    ) -> io::Result<()> {
        if cmd.name.eq_ignore_ascii_case(b"PING") {
            out.push(b"+PONG\r\n");
        } else if cmd.name.eq_ignore_ascii_case(b"QUIT") {
            out.push(b"+OK\r\n");
            out.close();
        } else {
            out.push(b"-ERR unknown command\r\n");
        }
        Ok(())
    }
}

fn main() {
    appsrv::server!("ping")
        .about("Answers PING with +PONG, as a Redis server would")
        .listen("127.0.0.1:6380")
        .io(appsrv::Io::Event)
        .run_requests(|| Ok(Ping))
        .unwrap_or_else(|e| e.exit());
}

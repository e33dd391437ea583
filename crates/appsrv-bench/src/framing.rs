//! Where a response ends: the response parsers.
//!
//! A [`Parser`] is fed the bytes received so far and says how many of them belong to the
//! current response and whether the response is complete. It keeps only the little state
//! it needs (a count, a partial delimiter match), so bodies are never held in memory; the
//! one exception is an HTTP head (status line and headers) or chunk-size line, which it
//! leaves unconsumed until it is complete, so the caller's buffer must be able to hold it.

/// How responses are delimited (chosen on the command line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Framing {
    /// The response ends after this delimiter (`--until`).
    Until(Vec<u8>),
    /// The response is this many bytes (`--response-len`).
    Fixed(u64),
    /// A big-endian length prefix of this many bytes, then that many bytes (`--length-prefix`).
    Prefix(u8),
    /// An HTTP/1.1 response (`--http`).
    Http,
    /// Everything until the server closes the connection.
    Close,
}

/// What a [`Parser::feed`] did with the bytes it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// This many bytes were consumed and the response is not complete: read more. Bytes
    /// past the consumed ones were looked at but must be fed again with what follows them.
    More(usize),
    /// The response is complete after this many bytes; the rest belongs to the next one.
    Done(usize),
}

/// The response is malformed (or the connection closed in the middle of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed;

/// The longest HTTP head (status line and headers) or chunk-size line accepted.
pub(crate) const MAX_HEAD: usize = 32 * 1024;

/// The parser of one connection's responses; [`reset`](Parser::reset) before each response.
#[derive(Debug)]
pub(crate) enum Parser {
    Until {
        delim: Vec<u8>,
        fail: Vec<usize>,
        matched: usize,
    },
    Fixed {
        len: u64,
        left: u64,
    },
    Prefix {
        width: u8,
        have: u8,
        len: u64,
        left: Option<u64>,
    },
    Http(Http),
    Close,
}

impl Parser {
    pub(crate) fn new(framing: &Framing) -> Parser {
        match framing {
            Framing::Until(delim) => Parser::Until {
                fail: failure_table(delim),
                delim: delim.clone(),
                matched: 0,
            },
            Framing::Fixed(len) => Parser::Fixed {
                len: *len,
                left: *len,
            },
            Framing::Prefix(width) => Parser::Prefix {
                width: *width,
                have: 0,
                len: 0,
                left: None,
            },
            Framing::Http => Parser::Http(Http::default()),
            Framing::Close => Parser::Close,
        }
    }

    /// Prepares for a new response.
    pub(crate) fn reset(&mut self) {
        match self {
            Parser::Until { matched, .. } => *matched = 0,
            Parser::Fixed { len, left } => *left = *len,
            Parser::Prefix { have, len, left, .. } => {
                *have = 0;
                *len = 0;
                *left = None;
            }
            Parser::Http(h) => *h = Http::default(),
            Parser::Close => {}
        }
    }

    /// Feeds the bytes received and not yet consumed (never empty).
    pub(crate) fn feed(&mut self, data: &[u8]) -> Result<Step, Malformed> {
        match self {
            Parser::Until { delim, fail, matched } => Ok(feed_until(delim, fail, matched, data)),
            Parser::Fixed { left, .. } => Ok(take(left, data, 0)),
            Parser::Prefix {
                width,
                have,
                len,
                left,
            } => {
                let mut pos = 0;
                let left = match left {
                    Some(l) => l,
                    None => {
                        while *have < *width && pos < data.len() {
                            *len = *len << 8 | u64::from(data[pos]);
                            *have += 1;
                            pos += 1;
                        }
                        if *have < *width {
                            return Ok(Step::More(pos));
                        }
                        left.insert(*len)
                    }
                };
                Ok(take(left, data, pos))
            }
            Parser::Http(h) => h.feed(data),
            Parser::Close => Ok(Step::More(data.len())),
        }
    }

    /// The connection was closed (end of stream): is the response complete?
    pub(crate) fn at_eof(&self) -> Result<(), Malformed> {
        match self {
            Parser::Close => Ok(()),
            Parser::Http(h) if h.state == HttpState::ToClose => Ok(()),
            _ => Err(Malformed),
        }
    }

    /// After a complete response: must the connection be closed (the server said so, or
    /// the response ran until the close)?
    pub(crate) fn must_close(&self) -> bool {
        match self {
            Parser::Http(h) => h.close,
            Parser::Close => true,
            _ => false,
        }
    }

    /// The HTTP status of the last response, if it was HTTP.
    pub(crate) fn http_status(&self) -> Option<u16> {
        match self {
            Parser::Http(h) => Some(h.status),
            _ => None,
        }
    }
}

/// Consumes up to `*left` bytes of `data[pos..]`.
fn take(left: &mut u64, data: &[u8], pos: usize) -> Step {
    let avail = (data.len() - pos) as u64;
    if avail >= *left {
        let end = pos + *left as usize;
        *left = 0;
        Step::Done(end)
    } else {
        *left -= avail;
        Step::More(data.len())
    }
}

/// The Knuth-Morris-Pratt failure function: `fail[i]` is the length of the longest proper
/// prefix of `delim[..=i]` that is also its suffix.
fn failure_table(delim: &[u8]) -> Vec<usize> {
    let mut fail = vec![0; delim.len()];
    let mut k = 0;
    for i in 1..delim.len() {
        while k > 0 && delim[i] != delim[k] {
            k = fail[k - 1];
        }
        if delim[i] == delim[k] {
            k += 1;
        }
        fail[i] = k;
    }
    fail
}

fn feed_until(delim: &[u8], fail: &[usize], matched: &mut usize, data: &[u8]) -> Step {
    let mut i = 0;
    while i < data.len() {
        if *matched == 0 {
            // Skip to the next possible start of the delimiter.
            match data[i..].iter().position(|&b| b == delim[0]) {
                Some(p) => i += p,
                None => return Step::More(data.len()),
            }
        }
        let b = data[i];
        while *matched > 0 && delim[*matched] != b {
            *matched = fail[*matched - 1];
        }
        if delim[*matched] == b {
            *matched += 1;
            if *matched == delim.len() {
                *matched = 0;
                return Step::Done(i + 1);
            }
        }
        i += 1;
    }
    Step::More(data.len())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum HttpState {
    #[default]
    Head,
    Body(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailer,
    ToClose,
}

/// An HTTP/1.x response parser (to a GET: a body unless 1xx, 204 or 304).
#[derive(Debug, Default)]
pub(crate) struct Http {
    state: HttpState,
    status: u16,
    close: bool,
}

impl Http {
    fn feed(&mut self, data: &[u8]) -> Result<Step, Malformed> {
        let mut pos = 0;
        loop {
            match self.state {
                HttpState::Head => {
                    let Some(end) = head_end(&data[pos..]) else {
                        return if data.len() - pos > MAX_HEAD {
                            Err(Malformed)
                        } else {
                            Ok(Step::More(pos))
                        };
                    };
                    let head = parse_head(&data[pos..pos + end])?;
                    pos += end;
                    if (100..200).contains(&head.status) {
                        continue; // 100 Continue and the like: the real response follows
                    }
                    self.status = head.status;
                    self.close = head.close;
                    self.state = match head.body {
                        Body::None => return Ok(Step::Done(pos)),
                        Body::Length(0) => return Ok(Step::Done(pos)),
                        Body::Length(n) => HttpState::Body(n),
                        Body::Chunked => HttpState::ChunkSize,
                        Body::ToClose => {
                            self.close = true;
                            HttpState::ToClose
                        }
                    };
                }
                HttpState::Body(mut left) => {
                    let step = take(&mut left, data, pos);
                    self.state = HttpState::Body(left);
                    return Ok(step);
                }
                HttpState::ChunkSize => {
                    let Some(nl) = find_line(&data[pos..])? else {
                        return Ok(Step::More(pos));
                    };
                    let size = parse_chunk_size(trim_cr(&data[pos..pos + nl]))?;
                    pos += nl + 1;
                    self.state = if size == 0 {
                        HttpState::Trailer
                    } else {
                        HttpState::ChunkData(size)
                    };
                }
                HttpState::ChunkData(mut left) => match take(&mut left, data, pos) {
                    Step::Done(end) => {
                        pos = end;
                        self.state = HttpState::ChunkEnd;
                    }
                    more => {
                        self.state = HttpState::ChunkData(left);
                        return Ok(more);
                    }
                },
                HttpState::ChunkEnd => match data.get(pos..).unwrap_or_default() {
                    [] | [b'\r'] => return Ok(Step::More(pos)),
                    [b'\n', ..] => {
                        pos += 1;
                        self.state = HttpState::ChunkSize;
                    }
                    [b'\r', b'\n', ..] => {
                        pos += 2;
                        self.state = HttpState::ChunkSize;
                    }
                    _ => return Err(Malformed),
                },
                HttpState::Trailer => {
                    let Some(nl) = find_line(&data[pos..])? else {
                        return Ok(Step::More(pos));
                    };
                    let empty = trim_cr(&data[pos..pos + nl]).is_empty();
                    pos += nl + 1;
                    if empty {
                        self.state = HttpState::Head;
                        return Ok(Step::Done(pos));
                    }
                }
                HttpState::ToClose => return Ok(Step::More(data.len())),
            }
            if pos == data.len() {
                return Ok(Step::More(pos));
            }
        }
    }
}

/// The offset of the `\n` ending the first line of `data`, if complete; too long a line is
/// malformed.
fn find_line(data: &[u8]) -> Result<Option<usize>, Malformed> {
    match data.iter().position(|&b| b == b'\n') {
        Some(nl) => Ok(Some(nl)),
        None if data.len() > MAX_HEAD => Err(Malformed),
        None => Ok(None),
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The length of the head at the start of `data` (through the empty line), if complete.
fn head_end(data: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    for (i, &b) in data.iter().enumerate() {
        if b == b'\n' {
            if line_start > 0 && trim_cr(&data[line_start..i]).is_empty() {
                return Some(i + 1);
            }
            line_start = i + 1;
        }
    }
    None
}

#[derive(Debug, PartialEq, Eq)]
enum Body {
    None,
    Length(u64),
    Chunked,
    ToClose,
}

#[derive(Debug)]
struct Head {
    status: u16,
    body: Body,
    close: bool,
}

fn parse_head(head: &[u8]) -> Result<Head, Malformed> {
    let mut lines = head.split(|&b| b == b'\n').map(trim_cr);
    let status_line = lines.next().ok_or(Malformed)?;
    // HTTP/1.x SP DDD [SP reason]
    let rest = status_line.strip_prefix(b"HTTP/1.").ok_or(Malformed)?;
    let (minor, rest) = rest.split_first().ok_or(Malformed)?;
    if !minor.is_ascii_digit() {
        return Err(Malformed);
    }
    let status = match rest {
        [b' ', d @ ..]
            if d.len() >= 3 && d[..3].iter().all(u8::is_ascii_digit) && (d.len() == 3 || d[3] == b' ') =>
        {
            d[..3].iter().fold(0u16, |acc, &c| acc * 10 + u16::from(c - b'0'))
        }
        _ => return Err(Malformed),
    };
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut other_coding = false;
    let mut close = *minor == b'0';
    for line in lines {
        if line.is_empty() {
            break;
        }
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(Malformed); // obsolete line folding
        }
        let colon = line.iter().position(|&b| b == b':').ok_or(Malformed)?;
        let name = &line[..colon];
        if name.is_empty() || name.iter().any(|b| b.is_ascii_whitespace()) {
            return Err(Malformed);
        }
        let value = line[colon + 1..].trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_decimal(value)?;
            if length.is_some_and(|l| l != n) {
                return Err(Malformed);
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let last = value
                .rsplit(|&b| b == b',')
                .next()
                .unwrap_or_default()
                .trim_ascii();
            if last.eq_ignore_ascii_case(b"chunked") {
                chunked = true;
                other_coding = false;
            } else {
                other_coding = true;
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && *minor == b'0' {
                    close = false;
                }
            }
        }
    }
    let body = if (100..200).contains(&status) {
        if status == 101 {
            return Err(Malformed); // a protocol switch cannot be measured as HTTP
        }
        Body::None
    } else if status == 204 || status == 304 {
        Body::None
    } else if other_coding {
        Body::ToClose
    } else if chunked {
        Body::Chunked
    } else if let Some(n) = length {
        Body::Length(n)
    } else {
        Body::ToClose
    };
    Ok(Head { status, body, close })
}

fn parse_decimal(s: &[u8]) -> Result<u64, Malformed> {
    if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
        return Err(Malformed);
    }
    Ok(s.iter().fold(0u64, |acc, &c| acc * 10 + u64::from(c - b'0')))
}

fn parse_chunk_size(line: &[u8]) -> Result<u64, Malformed> {
    let size = line.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
    if size.is_empty() || size.len() > 15 {
        return Err(Malformed);
    }
    size.iter().try_fold(0u64, |acc, &c| {
        let d = (c as char).to_digit(16).ok_or(Malformed)?;
        Ok(acc << 4 | u64::from(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in pieces of `chunk` bytes, as a reader would (keeping unconsumed
    /// bytes), and returns the lengths of the complete responses and the bytes left over.
    fn split(framing: &Framing, input: &[u8], chunk: usize) -> Result<(Vec<usize>, usize), Malformed> {
        let mut p = Parser::new(framing);
        let mut lens = Vec::new();
        let mut buf: Vec<u8> = Vec::new();
        let mut current = 0;
        for piece in input.chunks(chunk) {
            buf.extend_from_slice(piece);
            while !buf.is_empty() {
                match p.feed(&buf)? {
                    Step::Done(n) => {
                        assert!(n <= buf.len());
                        lens.push(current + n);
                        current = 0;
                        buf.drain(..n);
                        p.reset();
                    }
                    Step::More(n) => {
                        assert!(n <= buf.len());
                        current += n;
                        buf.drain(..n);
                        break;
                    }
                }
            }
        }
        Ok((lens, current + buf.len()))
    }

    fn all_splits(framing: &Framing, input: &[u8]) -> (Vec<usize>, usize) {
        let whole = split(framing, input, input.len().max(1)).expect("parses");
        for chunk in 1..input.len() {
            assert_eq!(
                split(framing, input, chunk).expect("parses"),
                whole,
                "chunk size {chunk}"
            );
        }
        whole
    }

    #[test]
    fn until_single_byte() {
        let f = Framing::Until(b"\n".to_vec());
        assert_eq!(all_splits(&f, b"ping\npong\nx"), (vec![5, 5], 1));
    }

    #[test]
    fn until_multi_byte_with_partial_matches() {
        let f = Framing::Until(b"\r\n\r\n".to_vec());
        assert_eq!(all_splits(&f, b"a\r\nb\r\n\r\nc\r\r\n\r\n"), (vec![8, 6], 0));
        let f = Framing::Until(b"abab".to_vec());
        assert_eq!(all_splits(&f, b"aabababx"), (vec![5], 3));
    }

    #[test]
    fn fixed_length() {
        let f = Framing::Fixed(3);
        assert_eq!(all_splits(&f, b"abcdefgh"), (vec![3, 3], 2));
    }

    #[test]
    fn length_prefix() {
        let f = Framing::Prefix(2);
        let mut input = vec![0x01, 0x02];
        input.extend(std::iter::repeat_n(b'x', 0x0102));
        input.extend([0, 0, 0, 3, b'a', b'b', b'c', 0]);
        assert_eq!(split(&f, &input, 1000).unwrap(), (vec![0x0104, 2, 5], 1));
        assert_eq!(split(&f, &input, 1).unwrap(), (vec![0x0104, 2, 5], 1));
        let f = Framing::Prefix(4);
        assert_eq!(
            all_splits(&f, &[0, 0, 0, 2, b'h', b'i', 0, 0, 0, 0]),
            (vec![6, 4], 0)
        );
    }

    #[test]
    fn http_content_length() {
        let a = &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\nhello"[..];
        let b = &b"HTTP/1.1 404 Not Found\r\ncontent-length:0\r\n\r\n"[..];
        assert_eq!(
            all_splits(&Framing::Http, &[a, b].concat()),
            (vec![a.len(), b.len()], 0)
        );
    }

    #[test]
    fn http_chunked_with_extensions_and_trailers() {
        let a = &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\nA\r\n0123456789\r\n0\r\nT: v\r\n\r\n"[..];
        let b = &b"HTTP/1.1 200 OK\nTransfer-Encoding: gzip, chunked\n\n1\nx\n0\n\n"[..];
        assert_eq!(
            all_splits(&Framing::Http, &[a, b].concat()),
            (vec![a.len(), b.len()], 0)
        );
    }

    #[test]
    fn http_informational_responses_are_skipped() {
        let r = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(all_splits(&Framing::Http, r), (vec![r.len()], 0));
    }

    #[test]
    fn http_without_length_runs_to_close() {
        let mut p = Parser::new(&Framing::Http);
        assert_eq!(p.feed(b"HTTP/1.0 200 OK\r\n\r\nbody"), Ok(Step::More(23)));
        assert_eq!(p.at_eof(), Ok(()));
        assert!(p.must_close());
        assert_eq!(p.http_status(), Some(200));
    }

    #[test]
    fn http_connection_header() {
        let mut p = Parser::new(&Framing::Http);
        let r = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(p.feed(r), Ok(Step::Done(r.len())));
        assert!(p.must_close());
        p.reset();
        let r = b"HTTP/1.0 500 E\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(p.feed(r), Ok(Step::Done(r.len())));
        assert!(!p.must_close());
        assert_eq!(p.http_status(), Some(500));
    }

    #[test]
    fn http_eof_inside_a_response_is_malformed() {
        let mut p = Parser::new(&Framing::Http);
        assert_eq!(
            p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc"),
            Ok(Step::More(41))
        );
        assert_eq!(p.at_eof(), Err(Malformed));
        p.reset();
        assert_eq!(p.feed(b"HTTP/1.1 20"), Ok(Step::More(0)));
        assert_eq!(p.at_eof(), Err(Malformed));
    }

    #[test]
    fn http_malformed() {
        for bad in [
            &b"HTTP/2 200 OK\r\n\r\n"[..],
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"SSH-2.0-OpenSSH\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nA: b\r\n folded\r\n\r\n",
            b"HTTP/1.1 101 Switching\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n",
        ] {
            assert_eq!(
                split(&Framing::Http, bad, bad.len()),
                Err(Malformed),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn http_head_too_long() {
        let mut p = Parser::new(&Framing::Http);
        let long = vec![b'a'; MAX_HEAD + 1];
        assert_eq!(p.feed(&long), Err(Malformed));
    }

    #[test]
    fn read_to_close() {
        let mut p = Parser::new(&Framing::Close);
        assert_eq!(p.feed(b"hello"), Ok(Step::More(5)));
        assert_eq!(p.at_eof(), Ok(()));
        assert!(p.must_close());
        let p = Parser::new(&Framing::Until(b"\n".to_vec()));
        assert_eq!(p.at_eof(), Err(Malformed));
    }
}

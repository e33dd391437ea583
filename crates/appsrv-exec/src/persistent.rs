//! Persistent mode (`--mode persistent`): each worker keeps one command running and hands
//! it the requests of its clients, one frame at a time (see the crate's documentation for
//! the frame protocol).
//!
//! A request's frame is written to the command's standard input without blocking while its
//! standard output is read, both with `poll` (with the pidfd that says it exited and the
//! standard error, logged a line at a time), against the worker's own deadline. Whatever
//! goes wrong with one request (the command exits, does not answer in time, answers a
//! malformed or oversized frame, or writes when nobody asked) ends that command and its
//! process group, answers that request with the codec's error reply and closes its
//! connection; the next request starts a new command. Other connections never see it: a
//! worker serves one connection at a time, and a command that wrote more than its answer is
//! replaced before the next request is written.

use std::io;
use std::marker::PhantomData;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use appsrv::codec::{
    Codec, LengthPrefixed, LengthResponse, Line, Lines, LinesResponse, Netstring, NetstringResponse, Prefix,
};
use nix::poll::{PollFd, PollFlags};

use crate::command::{self, Running, Spec, StderrLines};

/// The most digits a length may have in the frame protocol (`u64::MAX` has 20).
const MAX_LEN_DIGITS: usize = 20;

/// The persistent mode's settings.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// `--request-timeout` as appsrv's master enforces it (`None`: off).
    pub(crate) request_timeout: Option<Duration>,
    /// The largest response payload accepted from the command.
    pub(crate) max_output: usize,
}

impl Limits {
    /// The worker's own deadline for an answer: a little before the master's
    /// `--request-timeout` (a quarter of it, at most a second, earlier), so that the
    /// worker answers with the codec's error reply rather than being killed with its
    /// connection.
    pub(crate) fn answer_within(&self) -> Option<Duration> {
        self.request_timeout
            .map(|t| t.saturating_sub((t / 4).min(Duration::from_secs(1))))
    }
}

/// Why a request got no answer from the command. The text is the reason in the error
/// reply and the log line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// It could not be started.
    Start(String),
    /// It exited (or closed its output) before its answer was complete.
    Exited(String),
    /// No answer within the deadline.
    Timeout(Duration),
    /// The answer does not follow the frame protocol.
    Malformed(String),
    /// The answer's length is over `--max-output`.
    TooLarge { len: u64, max: usize },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Start(why) => write!(f, "the command could not start: {why}"),
            Failure::Exited(how) => write!(f, "the command ended before answering ({how})"),
            Failure::Timeout(limit) => write!(
                f,
                "{}",
                appsrv::codec::ProtocolError::HandlerTimeout { limit: *limit }
            ),
            Failure::Malformed(why) => write!(f, "malformed answer from the command: {why}"),
            Failure::TooLarge { len, max } => {
                write!(
                    f,
                    "answer too large: {len} bytes (limit --max-output {max} bytes)"
                )
            }
        }
    }
}

/// What was read of an answer so far: `Ok(None)` incomplete, `Ok(Some(range))` the
/// payload's place in `buf`, which must hold nothing after it.
pub(crate) fn parse_answer(buf: &[u8], max: usize) -> Result<Option<std::ops::Range<usize>>, Failure> {
    let Some(nl) = buf.iter().take(MAX_LEN_DIGITS + 1).position(|b| *b == b'\n') else {
        if buf.len() > MAX_LEN_DIGITS || buf.iter().any(|b| !b.is_ascii_digit()) {
            return Err(Failure::Malformed(format!(
                "expected a length in decimal digits and a newline, got {:?}",
                String::from_utf8_lossy(&buf[..buf.len().min(32)])
            )));
        }
        return Ok(None);
    };
    let digits = &buf[..nl];
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(Failure::Malformed(format!(
            "expected a length in decimal digits and a newline, got {:?}",
            String::from_utf8_lossy(&buf[..(nl + 1).min(32)])
        )));
    }
    let len: u64 = std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| Failure::Malformed("a length out of range".into()))?;
    if len > max as u64 {
        return Err(Failure::TooLarge { len, max });
    }
    let end = nl + 1 + len as usize;
    match buf.len().cmp(&end) {
        std::cmp::Ordering::Less => Ok(None),
        std::cmp::Ordering::Equal => Ok(Some(nl + 1..end)),
        std::cmp::Ordering::Greater => Err(Failure::Malformed(format!(
            "{} byte(s) after the {len}-byte answer",
            buf.len() - end
        ))),
    }
}

/// A worker's command and what it has read of its answer.
#[derive(Debug)]
pub(crate) struct Worker {
    spec: Spec,
    limits: Limits,
    cmd: Option<Running>,
    /// The answer read so far.
    answer: Vec<u8>,
    /// The request's frame being written.
    frame: Vec<u8>,
    errors: StderrLines,
}

impl Worker {
    pub(crate) fn new(spec: Spec, limits: Limits) -> Worker {
        Worker {
            spec,
            limits,
            cmd: None,
            answer: Vec::new(),
            frame: Vec::new(),
            errors: StderrLines::default(),
        }
    }

    /// Starts the command if none runs.
    pub(crate) fn ensure_started(&mut self) -> io::Result<()> {
        if self.cmd.is_none() {
            self.cmd = Some(Running::start(&self.spec, &[])?);
        }
        Ok(())
    }

    /// Ends the command and its group (the next request starts another).
    pub(crate) fn stop(&mut self, grace: Duration) -> Option<String> {
        let mut cmd = self.cmd.take()?;
        let status = cmd.end(grace);
        // No command is running: whatever else is the worker's child and exited (a
        // process that left the command's group) can be reaped.
        command::reap_strays();
        Some(status)
    }

    /// Whether the command exited, or wrote while nobody asked (the rest of an earlier
    /// answer, too long): either way it cannot answer the next request.
    fn unfit(&self) -> Option<&'static str> {
        let cmd = self.cmd.as_ref()?;
        let Some(stdout) = &cmd.stdout else {
            return Some("closed its output");
        };
        let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO) {
            Ok(n) if n > 0 => {
                let r = fds[0].revents().unwrap_or(PollFlags::empty());
                if r.contains(PollFlags::POLLIN) {
                    Some("wrote output no request asked for")
                } else {
                    Some("closed its output")
                }
            }
            _ if cmd.has_exited() => Some("exited"),
            _ => None,
        }
    }

    /// Hands `request` to the command and returns its answer; on a failure the command
    /// has been ended (and logged).
    pub(crate) fn call(&mut self, request: &[u8], who: &appsrv::Addr) -> Result<&[u8], Failure> {
        if let Some(why) = self.unfit() {
            let status = self.stop(Duration::ZERO).unwrap_or_default();
            tracing::warn!("{who}: the command {why} between requests ({status}): starting another");
        }
        if let Err(e) = self.ensure_started() {
            tracing::error!("{who}: cannot start {}: {e}", self.spec.program.display());
            return Err(Failure::Start(e.to_string()));
        }
        let started = Instant::now();
        let deadline = self.limits.answer_within().map(|t| started + t);
        match self.exchange(request, deadline, who) {
            Ok(range) => Ok(&self.answer[range]),
            Err(failure) => {
                let grace = if matches!(failure, Failure::Exited(_)) {
                    command::TERM_GRACE
                } else {
                    Duration::ZERO
                };
                let status = self.stop(grace).unwrap_or_default();
                let status = match failure {
                    Failure::Exited(_) => {
                        let f = Failure::Exited(status.clone());
                        tracing::warn!("{who}: {f}: closing the connection; the next request starts another");
                        return Err(f);
                    }
                    _ => status,
                };
                tracing::warn!(
                    "{who}: {failure}: ended the command ({status}) and closing the connection; the next request starts another"
                );
                Err(failure)
            }
        }
    }

    /// Writes the request's frame and reads the answer's, both without blocking, until the
    /// answer is complete, the command fails, or the deadline.
    fn exchange(
        &mut self,
        request: &[u8],
        deadline: Option<Instant>,
        who: &appsrv::Addr,
    ) -> Result<std::ops::Range<usize>, Failure> {
        self.frame.clear();
        self.frame.extend_from_slice(request.len().to_string().as_bytes());
        self.frame.push(b'\n');
        self.frame.extend_from_slice(request);
        self.answer.clear();
        let mut written = 0;
        let mut buf = [0u8; 16 * 1024];
        let cmd = self.cmd.as_mut().expect("started");
        loop {
            // Write as much as the pipe takes now.
            while written < self.frame.len() {
                let Some(stdin) = &cmd.stdin else { break };
                match command::write_some(stdin, &self.frame[written..]) {
                    Ok(Some(n)) => written += n,
                    Ok(None) => break,
                    Err(e) => return Err(Failure::Exited(format!("its input: {e}"))),
                }
            }
            let now = Instant::now();
            if let Some(d) = deadline {
                if now >= d {
                    return Err(Failure::Timeout(self.limits.request_timeout.unwrap_or_default()));
                }
            }
            let timeout = deadline.map_or(nix::poll::PollTimeout::NONE, |d| command::poll_timeout(d - now));
            let want_stdin = written < self.frame.len();
            let Some(stdout) = &cmd.stdout else {
                return Err(Failure::Exited(String::new()));
            };
            let mut fds = Vec::with_capacity(4);
            fds.push(PollFd::new(stdout.as_fd(), PollFlags::POLLIN));
            let stderr_at = cmd.stderr.as_ref().map(|fd| {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                fds.len() - 1
            });
            let stdin_at = match (&cmd.stdin, want_stdin) {
                (Some(fd), true) => {
                    fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
                    Some(fds.len() - 1)
                }
                _ => None,
            };
            // Without a pidfd, the end of file on stdout says it exited.
            let exit_at = cmd.exit_fd().map(|fd| {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                fds.len() - 1
            });
            match nix::poll::poll(&mut fds, timeout) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(Failure::Exited(format!("poll: {e}"))),
                Ok(_) => {}
            }
            let ready = |i: Option<usize>| i.is_some_and(|i| fds[i].revents().is_some_and(|r| !r.is_empty()));
            let (out_ready, err_ready, exited) = (ready(Some(0)), ready(stderr_at), ready(exit_at));
            let _ = ready(stdin_at);
            drop(fds);
            if err_ready {
                if let Some(fd) = &cmd.stderr {
                    if !self.errors.drain(fd, who) {
                        cmd.stderr = None;
                    }
                }
            }
            if out_ready || exited {
                // Everything the pipe holds now (after an exit, all it will ever hold).
                while let Some(stdout) = &cmd.stdout {
                    match command::read_some(stdout, &mut buf) {
                        Ok(Some(0)) | Err(_) => {
                            cmd.stdout = None;
                            break;
                        }
                        Ok(Some(n)) => {
                            self.answer.extend_from_slice(&buf[..n]);
                            // Checked as it grows, so an oversized answer is not held.
                            if let Some(range) = parse_answer(&self.answer, self.limits.max_output)? {
                                if written < self.frame.len() {
                                    return Err(Failure::Malformed(
                                        "answered before reading the whole request".into(),
                                    ));
                                }
                                return Ok(range);
                            }
                        }
                        Ok(None) => break,
                    }
                }
                if cmd.stdout.is_none() || exited {
                    if let Some(fd) = &cmd.stderr {
                        self.errors.drain(fd, who);
                    }
                    self.errors.finish(who);
                    return Err(Failure::Exited(String::new()));
                }
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop(Duration::ZERO);
    }
}

/// What persistent mode needs of a codec whose requests are byte strings.
pub(crate) trait Framing: Codec + Default + Sized {
    fn make(max_request: usize) -> Self;
    fn payload<'r>(req: &'r Self::Request<'_>) -> &'r [u8];
    /// Sends the command's answer as this codec's response.
    fn answer(res: &mut Self::Response<'_>, payload: &[u8]);
    /// The codec's error reply with `reason`, and the close after it.
    fn fail(res: &mut Self::Response<'_>, reason: &str);
}

impl Framing for Lines {
    fn make(max_request: usize) -> Self {
        Lines::new(max_request)
    }
    fn payload<'r>(req: &'r Line<'_>) -> &'r [u8] {
        req.as_bytes()
    }
    fn answer(res: &mut LinesResponse<'_>, payload: &[u8]) {
        res.push(payload);
        if !payload.ends_with(b"\n") {
            res.push(b"\n");
        }
    }
    fn fail(res: &mut LinesResponse<'_>, reason: &str) {
        // As `Lines::encode_error` writes it.
        res.push(format!("-ERR {reason}\r\n").as_bytes());
        res.close();
    }
}

impl Framing for Netstring {
    fn make(max_request: usize) -> Self {
        Netstring::new(max_request)
    }
    fn payload<'r>(req: &'r &[u8]) -> &'r [u8] {
        req
    }
    fn answer(res: &mut NetstringResponse<'_>, payload: &[u8]) {
        res.push(payload);
    }
    fn fail(res: &mut NetstringResponse<'_>, reason: &str) {
        // As `Netstring::encode_error` frames it.
        res.push(format!("ERR {reason}").as_bytes());
        res.close();
    }
}

impl Framing for LengthPrefixed {
    fn make(max_request: usize) -> Self {
        LengthPrefixed::new(Prefix::U32).max_frame(max_request)
    }
    fn payload<'r>(req: &'r &[u8]) -> &'r [u8] {
        req
    }
    fn answer(res: &mut LengthResponse<'_>, payload: &[u8]) {
        res.push(payload);
    }
    fn fail(res: &mut LengthResponse<'_>, reason: &str) {
        res.push(format!("ERR {reason}").as_bytes());
        res.close();
    }
}

/// The request-level handler over codec `C`.
#[derive(Debug)]
pub(crate) struct Persistent<C> {
    pub(crate) worker: Worker,
    pub(crate) max_request: usize,
    pub(crate) codec: PhantomData<fn() -> C>,
}

impl<C: Framing> appsrv::RequestHandler for Persistent<C> {
    type Codec = C;
    type Session = ();

    fn codec(&self) -> C {
        C::make(self.max_request)
    }

    fn handle_request(
        &mut self,
        conn: &mut appsrv::Conn<'_>,
        req: &C::Request<'_>,
        res: &mut C::Response<'_>,
    ) -> io::Result<()> {
        let who = conn.peer_addr().clone();
        match self.worker.call(C::payload(req), &who) {
            Ok(payload) => C::answer(res, payload),
            Err(failure) => C::fail(res, &failure.to_string()),
        }
        Ok(())
    }

    fn on_worker_exit(&mut self) {
        // Its input closed first: a command that ends at the end of its input can.
        if let Some(cmd) = &mut self.worker.cmd {
            cmd.stdin = None;
        }
        self.worker.stop(command::TERM_GRACE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_parsed_as_they_arrive() {
        let whole = b"5\nhello";
        for cut in 0..whole.len() {
            assert_eq!(parse_answer(&whole[..cut], 100), Ok(None), "cut at {cut}");
        }
        assert_eq!(parse_answer(whole, 100), Ok(Some(2..7)));
        assert_eq!(parse_answer(b"0\n", 100), Ok(Some(2..2)));
    }

    #[test]
    fn malformed_and_oversized_answers_are_refused() {
        assert!(matches!(
            parse_answer(b"hello\n", 100),
            Err(Failure::Malformed(_))
        ));
        assert!(matches!(parse_answer(b"hel", 100), Err(Failure::Malformed(_))));
        assert!(matches!(parse_answer(b"\n", 100), Err(Failure::Malformed(_))));
        assert!(matches!(
            parse_answer(b"+5\nhello", 100),
            Err(Failure::Malformed(_))
        ));
        assert!(matches!(
            parse_answer(b"123456789012345678901234", 100),
            Err(Failure::Malformed(_))
        ));
        assert!(matches!(
            parse_answer(b"18446744073709551615\n", 100),
            Err(Failure::TooLarge { .. })
        ));
        assert!(matches!(
            parse_answer(b"99999999999999999999999\n", 100),
            Err(Failure::Malformed(_))
        ));
        assert_eq!(
            parse_answer(b"101\n", 100),
            Err(Failure::TooLarge { len: 101, max: 100 })
        );
        assert!(matches!(
            parse_answer(b"2\nhi2\nhi", 100),
            Err(Failure::Malformed(_))
        ));
    }

    #[test]
    fn the_worker_answers_before_the_master_kills_it() {
        let limits = |t: Option<u64>| Limits {
            request_timeout: t.map(Duration::from_millis),
            max_output: 0,
        };
        assert_eq!(limits(None).answer_within(), None);
        assert_eq!(
            limits(Some(60_000)).answer_within(),
            Some(Duration::from_secs(59))
        );
        assert_eq!(
            limits(Some(1_000)).answer_within(),
            Some(Duration::from_millis(750))
        );
    }
}

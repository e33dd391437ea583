//! Messages from workers to their master: "ready", or "could not start, because ...".
//!
//! One pipe is shared by all workers. Each message is written with a single `write(2)` of
//! at most [`MAX_MESSAGE`] bytes, below `PIPE_BUF`, so the kernel never interleaves two
//! workers' messages; each carries the sender's pid. The master reads the pipe without
//! blocking from its poll loop. Workers die, and the master learns why from `waitpid`; a
//! message only adds what a status cannot carry (the factory's error text).

use std::cell::RefCell;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::fcntl::OFlag;

/// Largest message on the wire (header included), well below Linux's `PIPE_BUF` (4096).
pub(crate) const MAX_MESSAGE: usize = 1024;
const HEADER: usize = 4 + 1 + 2;

/// What a worker tells its master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    /// The worker dropped privileges, ran its factory and is about to accept.
    Ready,
    /// The worker cannot serve: the reason follows, then it exits.
    StartFailed(String),
    /// The worker reached its request or connection limit: the master starts a
    /// replacement, then asks this worker to stop once the replacement is ready.
    Retire,
}

/// The shared pipe. Both ends are close-on-exec; the read end is non-blocking.
#[derive(Debug)]
pub(crate) struct Channel {
    /// The master's end (`None` in a re-executed worker, which only writes).
    read: Option<std::fs::File>,
    write: OwnedFd,
    /// Bytes of a message not yet complete (reads never split a message in practice,
    /// since each is written atomically, but the parser does not rely on it).
    pending: RefCell<Vec<u8>>,
}

impl Channel {
    pub(crate) fn new() -> io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        nix::fcntl::fcntl(&read, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        Ok(Channel {
            read: Some(read.into()),
            write,
            pending: RefCell::new(Vec::new()),
        })
    }

    /// The worker's end alone, in a re-executed worker (`--exec-workers`).
    pub(crate) fn from_write_end(write: OwnedFd) -> Self {
        Channel {
            read: None,
            write,
            pending: RefCell::new(Vec::new()),
        }
    }

    /// The master's end, for the worker to close right after fork.
    pub(crate) fn read_fd(&self) -> Option<RawFd> {
        self.read.as_ref().map(|r| r.as_raw_fd())
    }

    /// The workers' end, handed to a re-executed worker.
    pub(crate) fn write_fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    /// Sends `msg` from worker `pid` (one atomic write; a long reason is truncated).
    pub(crate) fn send(&self, pid: u32, msg: &Message) -> io::Result<()> {
        let (kind, text) = match msg {
            Message::Ready => (1u8, ""),
            Message::StartFailed(reason) => (2u8, reason.as_str()),
            Message::Retire => (3u8, ""),
        };
        let mut text = text.as_bytes();
        text = &text[..text.len().min(MAX_MESSAGE - HEADER)];
        let mut buf = Vec::with_capacity(HEADER + text.len());
        buf.extend_from_slice(&pid.to_le_bytes());
        buf.push(kind);
        buf.extend_from_slice(&(text.len() as u16).to_le_bytes());
        buf.extend_from_slice(text);
        // Blocking pipe, at most PIPE_BUF bytes: the write is all or nothing.
        loop {
            match nix::unistd::write(&self.write, &buf) {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads every complete message waiting in the pipe, without blocking.
    pub(crate) fn receive(&self) -> Vec<(u32, Message)> {
        let mut pending = self.pending.borrow_mut();
        let mut chunk = [0u8; 8192];
        let Some(mut read) = self.read.as_ref() else {
            return Vec::new();
        };
        loop {
            match read.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => pending.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break, // WouldBlock: drained
            }
        }
        let mut out = Vec::new();
        let mut at = 0;
        while pending.len() - at >= HEADER {
            let h = &pending[at..at + HEADER];
            let pid = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let kind = h[4];
            let len = u16::from_le_bytes([h[5], h[6]]) as usize;
            if pending.len() - at < HEADER + len {
                break;
            }
            let text = String::from_utf8_lossy(&pending[at + HEADER..at + HEADER + len]).into_owned();
            at += HEADER + len;
            out.push((
                pid,
                match kind {
                    1 => Message::Ready,
                    3 => Message::Retire,
                    _ => Message::StartFailed(text),
                },
            ));
        }
        pending.drain(..at);
        out
    }
}

impl AsFd for Channel {
    /// The read end, for the master's poll set.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.read
            .as_ref()
            .expect("the master's channel has its read end")
            .as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_batch() {
        let ch = Channel::new().unwrap();
        assert!(ch.receive().is_empty());
        ch.send(7, &Message::Ready).unwrap();
        ch.send(8, &Message::StartFailed("no database".into())).unwrap();
        assert_eq!(
            ch.receive(),
            vec![
                (7, Message::Ready),
                (8, Message::StartFailed("no database".into()))
            ]
        );
        let long = "x".repeat(10_000);
        ch.send(9, &Message::StartFailed(long)).unwrap();
        match &ch.receive()[..] {
            [(9, Message::StartFailed(t))] => assert_eq!(t.len(), MAX_MESSAGE - HEADER),
            other => panic!("{other:?}"),
        }
    }
}

//! The log channel: how the master hands its workers the log files it reopened on USR1.
//!
//! The log files belong to the master's user and nobody else may write them (see
//! `log::open_log`), so a worker, which runs as another user, cannot reopen them by path.
//! Instead each worker has a channel of its own to the master: a Unix `SOCK_SEQPACKET`
//! socket pair made before the fork, both ends close-on-exec and non-blocking. On USR1 the
//! master reopens the files, sends each worker one message carrying the new descriptors
//! (`SCM_RIGHTS`), then signals it; the worker takes the message when it handles the
//! signal, between connections (blocking) or at the top of a loop turn (event), and puts
//! the new log file over its stderr (`dup2`) and the new access log in place of the old.
//!
//! The master never waits for a worker: a send that the socket does not take at once
//! (`EAGAIN`: the worker has left many earlier messages unread, stuck in one connection)
//! is logged, and that worker keeps its current files until the next USR1. A worker that
//! finds several messages takes the last of each file. A worker forked after a reopen
//! inherits the new stderr; the new access log (which a worker gets from the master's
//! start-up otherwise) waits for it in its channel, sent before the fork, and is taken
//! before it reports ready. A re-executed worker (`--exec-workers`) gets its end of the
//! channel through its hand-over (`exec.rs`).

use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

use nix::sys::socket::{self, SockFlag, SockType};

use crate::sys::RecvError;

/// The payload byte naming the `--log-file` descriptor of a message.
const LOG: u8 = b'L';
/// The payload byte naming the `--access-log` descriptor of a message.
const ACCESS: u8 = b'A';

/// This worker's end of its channel (unset: none, in the master or before the fork). Set
/// once per process and never closed: a worker holds it for its life.
static WORKER_END: OnceLock<OwnedFd> = OnceLock::new();

/// A new channel: `(the master's end, the worker's end)`, both close-on-exec and
/// non-blocking.
pub(crate) fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(socket::socketpair(
        socket::AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
    )?)
}

/// Keeps this worker's end of its channel: in the child right after fork, or in a
/// re-executed worker from its hand-over. The descriptor stays open for the worker's life.
pub(crate) fn set_worker_end(fd: OwnedFd) {
    if let Err(fd) = WORKER_END.set(fd) {
        // Each worker is given one end, once: a second would be a bug, said rather than
        // hidden (it is closed; the first stays this worker's).
        tracing::error!("a second log channel end ({fd:?}) for this worker; closed");
    }
}

/// This worker's end of its channel, if any (handed to a re-executed worker).
pub(crate) fn worker_end() -> Option<BorrowedFd<'static>> {
    WORKER_END.get().map(AsFd::as_fd)
}

/// Sends one message on the master's end `to`: the reopened log file and access log, each
/// if any. Never blocks; `EAGAIN` is returned as an error (the worker keeps its files).
pub(crate) fn send(
    to: BorrowedFd<'_>,
    log: Option<BorrowedFd<'_>>,
    access: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut names = Vec::with_capacity(2);
    let mut fds = Vec::with_capacity(2);
    for (name, fd) in [(LOG, log), (ACCESS, access)] {
        if let Some(fd) = fd {
            names.push(name);
            fds.push(fd.as_raw_fd());
        }
    }
    if fds.is_empty() {
        return Ok(());
    }
    crate::sys::send_with_fds(to, &[&names], &fds, true)
}

/// The files of the messages waiting on this worker's channel (the last of each kind).
#[derive(Debug, Default)]
pub(crate) struct Files {
    /// The new `--log-file`, for stderr.
    pub(crate) log: Option<OwnedFd>,
    /// The new `--access-log`.
    pub(crate) access: Option<OwnedFd>,
}

/// Takes every message waiting on this worker's channel, without blocking (see
/// [`receive_from`]).
pub(crate) fn receive() -> Files {
    worker_end().map(receive_from).unwrap_or_default()
}

/// Takes every message waiting on the worker's end `end`, without blocking. The
/// descriptors received are close-on-exec (`MSG_CMSG_CLOEXEC`); an older one of a kind is
/// closed when a newer one comes. A message longer than the master's (two names, two
/// descriptors) is dropped with its descriptors, and said.
pub(crate) fn receive_from(end: BorrowedFd<'_>) -> Files {
    let mut files = Files::default();
    loop {
        let mut names = [0u8; 2];
        let mut iov = [IoSliceMut::new(&mut names)];
        let (count, received) = match crate::sys::recv_with_fds(end, &mut iov, true) {
            Ok(m) => m,
            Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e @ (RecvError::Truncated { .. } | RecvError::FdsTruncated { .. })) => {
                tracing::warn!("the log channel: {e}; dropped");
                continue;
            }
            // EAGAIN: nothing (more) waiting; any other error: the master is gone.
            Err(RecvError::Io(_)) => return files,
        };
        if count == 0 {
            return files; // the master closed its end
        }
        for (k, owned) in received.into_iter().enumerate() {
            match names.get(k).filter(|_| k < count) {
                Some(&LOG) => files.log = Some(owned),
                Some(&ACCESS) => files.access = Some(owned),
                _ => drop(owned),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn the_last_files_sent_are_received_close_on_exec() {
        let (master, worker) = pair().unwrap();
        let file = |text: &str| {
            let mut f = tempfile();
            f.write_all(text.as_bytes()).unwrap();
            f
        };
        let (a, b, c) = (file("log 1"), file("log 2"), file("access 1"));
        send(master.as_fd(), Some(a.as_fd()), None).unwrap();
        send(master.as_fd(), Some(b.as_fd()), Some(c.as_fd())).unwrap();
        let got = receive_from(worker.as_fd());
        let read = |fd: OwnedFd| {
            let mut f = std::fs::File::from(fd);
            f.rewind().unwrap();
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            s
        };
        let log = got.log.unwrap();
        let flags = nix::fcntl::fcntl(&log, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "received close-on-exec");
        assert_eq!(read(log), "log 2", "the last log file wins");
        assert_eq!(read(got.access.unwrap()), "access 1");
    }

    /// Issue 32: descriptors beyond those a message names are closed, however many came
    /// (the room for two left the kernel's extra ones open, unlisted, with the named ones).
    #[test]
    fn issue_32_descriptors_a_message_does_not_name_are_closed() {
        let (master, worker) = pair().unwrap();
        let (probe, copies) = crate::sys::Probe::new(3);
        let raw: Vec<_> = copies.iter().map(AsRawFd::as_raw_fd).collect();
        crate::sys::send_with_fds(master.as_fd(), &[&[LOG, ACCESS]], &raw, true).unwrap();
        drop(copies);
        let got = receive_from(worker.as_fd());
        assert!(got.log.is_some() && got.access.is_some());
        drop(got);
        assert!(
            probe.all_closed(),
            "a descriptor the message did not name was left open"
        );
    }

    #[test]
    fn a_full_channel_fails_without_blocking() {
        let (master, _worker) = pair().unwrap();
        let f = tempfile();
        let mut sent = 0;
        let err = loop {
            match send(master.as_fd(), Some(f.as_fd()), None) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent < 1_000_000, "the channel never filled");
        };
        assert!(sent > 0);
        assert!(
            matches!(err.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ETOOMANYREFS)),
            "{err}"
        );
    }

    fn tempfile() -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "appsrv-reopen-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        f
    }
}

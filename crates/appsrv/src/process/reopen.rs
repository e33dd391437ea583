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
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::errno::Errno;
use nix::sys::socket::{self, ControlMessageOwned, MsgFlags, SockFlag, SockType};

/// The payload byte naming the `--log-file` descriptor of a message.
const LOG: u8 = b'L';
/// The payload byte naming the `--access-log` descriptor of a message.
const ACCESS: u8 = b'A';

/// This worker's end of its channel (-1: none, in the master or before the fork).
static WORKER_END: AtomicI32 = AtomicI32::new(-1);

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

/// Records this worker's end of its channel: in the child right after fork, or in a
/// re-executed worker from its hand-over. The descriptor stays open for the worker's life.
pub(crate) fn set_worker_end(fd: RawFd) {
    WORKER_END.store(fd, Ordering::SeqCst);
}

/// This worker's end of its channel, if any (handed to a re-executed worker).
pub(crate) fn worker_end() -> Option<RawFd> {
    Some(WORKER_END.load(Ordering::SeqCst)).filter(|fd| *fd >= 0)
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

/// Takes every message waiting on this worker's channel, without blocking. The
/// descriptors received are close-on-exec (`MSG_CMSG_CLOEXEC`); an older one of a kind is
/// closed when a newer one comes.
pub(crate) fn receive() -> Files {
    let mut files = Files::default();
    let Some(fd) = worker_end() else {
        return files;
    };
    loop {
        let mut names = [0u8; 2];
        let mut space = nix::cmsg_space!([RawFd; 2]);
        let mut iov = [IoSliceMut::new(&mut names)];
        let msg = match socket::recvmsg::<()>(
            fd,
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(Errno::EINTR) => continue,
            // EAGAIN: nothing (more) waiting; any other error: the master is gone.
            Err(_) => return files,
        };
        if msg.bytes == 0 {
            return files; // the master closed its end
        }
        let received: Vec<RawFd> = match msg.cmsgs() {
            Ok(cmsgs) => cmsgs
                .filter_map(|c| match c {
                    ControlMessageOwned::ScmRights(fds) => Some(fds),
                    _ => None,
                })
                .flatten()
                .collect(),
            Err(_) => Vec::new(),
        };
        let count = msg.bytes;
        for (k, raw) in received.into_iter().enumerate() {
            // SAFETY: the kernel just installed this descriptor in this process for this
            // message (SCM_RIGHTS); nothing else knows its number.
            let owned = unsafe { OwnedFd::from_raw_fd(raw) };
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
    use std::os::fd::AsFd;

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
        set_worker_end(worker.as_raw_fd());
        let got = receive();
        set_worker_end(-1);
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

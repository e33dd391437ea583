//! A request-level connection's reads and writes as the worker counts them: the read
//! into the connection's buffers at the budget of buffered bytes, the output and files
//! sent under `--write-timeout` or `--min-send-rate`, the reset of a connection cut at a
//! deadline. The readiness rules under them are `conn/async_transport.rs`'s.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::codec::FileBody;
use crate::conn::buffers::{BUFFER_SIZE, Buffers};
use crate::conn::send_watch::Pace;
use crate::conn::transport::Transport;
use crate::sys::{self};

use super::worker::{Worker, Writing};
use crate::conn::async_transport::{self, write_records, write_some};

/// Reads plaintext into `bufs` (at most `room` bytes, less at the budget of buffered bytes:
/// `None` when it leaves none): what the TLS layer holds first, else the socket's, once it
/// is readable. `unread`: the socket may hold bytes whose readiness was taken already (by
/// [`gone`](crate::conn::async_transport::gone)), so it is read before waiting. The budget is asked at the read, when the
/// bytes are there, so that connections waiting to be readable meanwhile are not counted
/// as room.
///
/// The read lands in the worker-wide scratch buffer, borrowed for the system call and the
/// copy only, never across an `.await`, and what it got is copied into the connection's
/// own buffers, of the size they need: a connection that waits holds no read buffer
/// (10,000 waiting connections with a 16 KiB buffer each would be 160 MiB).
pub(super) async fn read_some(
    io: &mut AsyncFd<Transport>,
    bufs: &mut Buffers,
    room: usize,
    w: &Worker<'_>,
    unread: &Cell<bool>,
) -> io::Result<Option<usize>> {
    let room = room.min(BUFFER_SIZE);
    // The bytes read and the room they had, or `None` at the budget.
    let mut into_bufs = |t: &mut Transport| -> io::Result<Option<(usize, usize)>> {
        let Some(room) = w.budget.borrow().read_room(bufs, room) else {
            return Ok(None);
        };
        let mut scratch = w.scratch.borrow_mut();
        let n = t.read(&mut scratch[..room])?;
        bufs.extend_input(&scratch[..n]);
        Ok(Some((n, room)))
    };
    if io.get_mut().input_pending() || unread.take() {
        match into_bufs(io.get_mut()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
            Ok(None) => {
                // Still to be read once the budget has room.
                unread.set(true);
                return Ok(None);
            }
            Ok(Some((n, room))) => {
                // The socket may hold more than one read takes, and its readiness is
                // spent: the next read looks again, until a short read on a plain socket
                // says it is drained (review of issue 33: a large body pipelined behind
                // a request in flight waited for the read timeout).
                if n == room || io.get_ref().is_tls() {
                    unread.set(true);
                }
                return Ok(Some(n));
            }
            Err(e) => return Err(e),
        }
    }
    // Once readable, by the transport's rules (a short plain read clears the readiness;
    // at the budget, the readiness stays for the read once there is room).
    std::future::poll_fn(|cx| async_transport::poll_read(io, cx, &mut into_bufs)).await
}

/// `$op` (a write's future on `$io`, made again after each check), its waits judged by
/// `$pace` (`--write-timeout`, or `--min-send-rate`'s watch): its result, or `TimedOut`.
macro_rules! paced {
    ($pace:expr, $io:expr, $op:expr) => {
        loop {
            let done = match $pace.limit() {
                Some(t) => tokio::time::timeout(t, $op).await.ok(),
                None => Some($op.await),
            };
            match done {
                Some(r) => {
                    if r.is_ok() {
                        $pace.progressed();
                    }
                    break r;
                }
                None => {
                    if let Err(e) = $pace.expired($io.get_ref().socket()) {
                        break Err(e);
                    }
                }
            }
        }
    };
}

/// Writes `bufs`' output (and the TLS records it makes) to the client, each wait bounded
/// by `pace` (`--write-timeout`, or `--min-send-rate`); returns the bytes written, each
/// write's also added to the worker's bytes out (which the slot shows while a long write
/// goes on). While it waits for the client, the connection counts as writing in `w`.
pub(super) async fn write_out(
    w: &Worker<'_>,
    io: &mut AsyncFd<Transport>,
    bufs: &mut Buffers,
    pace: &mut Pace,
) -> io::Result<u64> {
    let moved = &w.moved_out;
    let mut sent = 0;
    // The usual case first: the socket takes the whole output at once, and no timer (a
    // clock read, and the timer's entry if it was polled) is made for the write.
    if !bufs.pending_output().is_empty() && !io.get_ref().is_tls() {
        let data = bufs.pending_output();
        match io.get_mut().write(&[io::IoSlice::new(data)]) {
            (n, _) if n > 0 => {
                bufs.output_written(n);
                sent += n as u64;
                moved.set(moved.get() + n as u64);
            }
            (_, Err(e))
                if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted =>
            {
                return Err(e);
            }
            _ => {}
        }
    }
    let _writing =
        (!bufs.pending_output().is_empty() || io.get_ref().records_pending()).then(|| Writing::new(w));
    while !bufs.pending_output().is_empty() {
        let n = paced!(pace, io, write_some(io, bufs.pending_output()))?;
        bufs.output_written(n);
        sent += n as u64;
        moved.set(moved.get() + n as u64);
    }
    while io.get_ref().records_pending() {
        paced!(pace, io, write_records(io))?;
    }
    pace.done();
    Ok(sent)
}

/// `f`, failing with `TimedOut` past `timeout`.
pub(super) async fn bounded<T>(
    timeout: Option<Duration>,
    f: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match timeout {
        Some(t) => tokio::time::timeout(t, f).await.unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client took nothing for {} s (--write-timeout)",
                    t.as_secs_f64()
                ),
            ))
        }),
        None => f.await,
    }
}

/// Sends `body`'s range: `sendfile(2)` on a plain connection, copied through the TLS
/// layer otherwise, each wait bounded by `pace`; the connection counts as writing in `w`
/// meanwhile, and each write's bytes are added to its bytes out at once (see
/// [`write_out`]).
pub(super) async fn send_file(
    w: &Worker<'_>,
    io: &mut AsyncFd<Transport>,
    body: &FileBody,
    pace: &mut Pace,
) -> io::Result<u64> {
    let _writing = Writing::new(w);
    let moved = &w.moved_out;
    let mut offset = body.range.start as i64;
    let end = body.range.end as i64;
    let mut sent = 0;
    if !io.get_ref().is_tls() {
        while offset < end {
            let len = (end - offset).min(1 << 30) as usize;
            let n = paced!(
                pace,
                io,
                async_transport::send_file(io, &body.file, &mut offset, len)
            )?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file ended before its range",
                ));
            }
            sent += n as u64;
            moved.set(moved.get() + n as u64);
        }
        return Ok(sent);
    }
    let mut chunk = vec![0; BUFFER_SIZE];
    while offset < end {
        let want = ((end - offset) as usize).min(chunk.len());
        let n = std::os::unix::fs::FileExt::read_at(&body.file, &mut chunk[..want], offset as u64)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file ended before its range",
            ));
        }
        let mut at = 0;
        while at < n {
            let wrote = paced!(pace, io, write_some(io, &chunk[at..n]))?;
            at += wrote;
            moved.set(moved.get() + wrote as u64);
        }
        offset += n as i64;
        sent += n as u64;
    }
    while io.get_ref().records_pending() {
        paced!(pace, io, write_records(io))?;
    }
    pace.done();
    Ok(sent)
}

/// A connection cut for a deadline (`--write-timeout`, `--request-timeout`: `e` is
/// `TimedOut`) is reset if the kernel still holds output for it (`SO_LINGER` 0, as the
/// blocking and event drivers cut a slow reader). Closed plainly, its socket would stay in
/// FIN-WAIT-1 trickling the rest to the slow reader, holding the send queue's memory
/// (100 readers of a 16 MiB response cut so: 267 MiB, 45 s later) after the connection
/// has left `--max-conns-per-ip`'s count (issue 42).
pub(super) fn cut_for_deadline(io: &AsyncFd<Transport>, e: &io::Error) {
    use std::os::fd::AsFd;
    if e.kind() != io::ErrorKind::TimedOut {
        return;
    }
    let socket = io.get_ref().socket();
    if sys::unsent_bytes(socket.as_fd()).is_ok_and(|n| n > 0) {
        let _ = socket.set_linger(Some(Duration::ZERO));
    }
}

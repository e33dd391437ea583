//! The async side of a connection's transport: the readiness rules of every read and
//! write over an `AsyncFd<Transport>`, written once for the async driver's request level
//! (`worker/tasks/`) and the client level's `AsyncClient` (`async_client.rs`).
//!
//! The rules, in [`poll_read`], [`poll_write`] and [`poll_write_records`] (and every other
//! wait here is one of them, or [`poll_io`] under them):
//! - an operation waits for the readiness the runtime's reactor reports, then makes one
//!   system call; "would block" clears that readiness and waits again (`try_io`);
//! - `Interrupted` is tried again;
//! - a short read on a plain socket drained it: its readable readiness is cleared at once
//!   (the next bytes are a new edge), so that the next read does not cost a `recv` failing
//!   with `EAGAIN`; a close that came with the bytes stays seen. Not under TLS, where a
//!   read may leave bytes in the socket;
//! - a read that fails with `InvalidData` (a TLS protocol error) sends the alert rustls
//!   prepared, best effort, before it reports the error;
//! - a write reports the bytes taken as soon as some are, whatever the records' outcome
//!   (they go out at the next write or flush).
//!
//! Each returns `Pending` when the socket is not ready: the caller judges its own
//! deadline then (the client level's timeouts, the request level's pace).

use std::cell::Cell;
use std::future::poll_fn;
use std::io::{self, IoSlice, Read};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::step;
use super::transport::Transport;

/// Which readiness an operation waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Readable.
    Read,
    /// Writable.
    Write,
}

/// `op` on the transport once the socket is ready for `wait`: its result; `Interrupted`
/// is tried again, and "would block" clears the readiness and waits for the next.
pub(crate) fn poll_io<R>(
    io: &mut AsyncFd<Transport>,
    cx: &mut Context<'_>,
    wait: Wait,
    mut op: impl FnMut(&mut Transport) -> io::Result<R>,
) -> Poll<io::Result<R>> {
    loop {
        let mut guard = match wait {
            Wait::Read => ready!(io.poll_read_ready_mut(cx))?,
            Wait::Write => ready!(io.poll_write_ready_mut(cx))?,
        };
        match guard.try_io(|t| op(t.get_mut())) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(r) => return Poll::Ready(r),
            Err(_would_block) => {}
        }
    }
}

/// One read once the socket is readable: `read` reads from the transport and says how
/// many bytes it got and the room it had, or `None` when it declines to read now (the
/// budget of buffered bytes), which keeps the readiness for the read once it will. The
/// bytes read, or `None` when declined.
pub(crate) fn poll_read(
    io: &mut AsyncFd<Transport>,
    cx: &mut Context<'_>,
    mut read: impl FnMut(&mut Transport) -> io::Result<Option<(usize, usize)>>,
) -> Poll<io::Result<Option<usize>>> {
    loop {
        let mut guard = ready!(io.poll_read_ready_mut(cx))?;
        match guard.try_io(|t| read(t.get_mut())) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => {
                if e.kind() == io::ErrorKind::InvalidData {
                    // A TLS protocol error: the alert rustls prepared, best effort.
                    let _ = guard.get_inner_mut().write_records();
                }
                return Poll::Ready(Err(e));
            }
            // Declined: the readiness stays, for the read once it is wanted.
            Ok(Ok(None)) => return Poll::Ready(Ok(None)),
            Ok(Ok(Some((n, room)))) => {
                // A short read on a plain socket drained it: the next bytes will be a new
                // edge, so the readiness is cleared now rather than found stale by the next
                // read (one `recv` that fails with EAGAIN per request, otherwise). Not under
                // TLS, where a read may leave bytes in the socket.
                if n < room && !guard.get_inner().is_tls() {
                    // Readable only: a close that came with the bytes stays seen.
                    guard.clear_ready_matching(tokio::io::Ready::READABLE);
                }
                return Poll::Ready(Ok(Some(n)));
            }
            Err(_would_block) => {}
        }
    }
}

/// One write of `data` once the socket is writable: the bytes taken, as soon as some are
/// (under TLS, the records they made may wait: they go out at the next write or flush);
/// 0 when nothing was taken and nothing failed (under TLS, records waiting to go first).
pub(crate) fn poll_write(
    io: &mut AsyncFd<Transport>,
    cx: &mut Context<'_>,
    data: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    poll_io(io, cx, Wait::Write, |t| {
        let (taken, r) = t.write(data);
        match r {
            // Taken bytes are gone, whatever the records' outcome: they are reported.
            _ if taken > 0 => Ok(taken),
            Err(e) => Err(e),
            Ok(()) => Ok(0),
        }
    })
}

/// One write of pending TLS records once the socket is writable: the bytes it took.
pub(crate) fn poll_write_records(
    io: &mut AsyncFd<Transport>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    poll_io(io, cx, Wait::Write, Transport::write_records)
}

/// Reads raw bytes (admission: before TLS) into `buf`.
pub(crate) async fn read_raw(io: &mut AsyncFd<Transport>, buf: &mut [u8]) -> io::Result<usize> {
    poll_fn(|cx| poll_io(io, cx, Wait::Read, |t| t.socket().read(buf))).await
}

/// Sends raw bytes (admission: TLS handshake records).
pub(crate) async fn send_raw(io: &mut AsyncFd<Transport>, data: &[u8]) -> io::Result<usize> {
    poll_fn(|cx| {
        poll_io(io, cx, Wait::Write, |t| {
            t.socket().send_with_flags(data, libc::MSG_NOSIGNAL)
        })
    })
    .await
}

/// One write of plaintext: the bytes taken.
pub(crate) async fn write_some(io: &mut AsyncFd<Transport>, data: &[u8]) -> io::Result<usize> {
    loop {
        // Under TLS, the records of earlier writes go first: with its buffer of records
        // full, rustls takes no plaintext (review of issue 33: a large response to a slow
        // client failed with "write zero" when the socket took part of the records).
        if io.get_ref().records_pending() {
            write_records(io).await?;
            continue;
        }
        match poll_fn(|cx| poll_write(io, cx, &[IoSlice::new(data)])).await? {
            // Nothing taken, records waiting: they go out first (the loop's top).
            0 if io.get_ref().records_pending() => {}
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => return Ok(n),
        }
    }
}

/// Writes pending TLS records once the socket takes them.
pub(crate) async fn write_records(io: &mut AsyncFd<Transport>) -> io::Result<usize> {
    poll_fn(|cx| poll_write_records(io, cx)).await
}

/// Sends up to `len` bytes of `file` from `offset` (moved on) with `sendfile(2)`, once
/// the socket takes them.
pub(crate) async fn send_file(
    io: &mut AsyncFd<Transport>,
    file: &std::fs::File,
    offset: &mut i64,
    len: usize,
) -> io::Result<usize> {
    poll_fn(|cx| poll_io(io, cx, Wait::Write, |t| t.send_file(file, offset, len))).await
}

/// A close after which the client may still send (an error reply, a last response with
/// requests pipelined behind it): shut for writing, then read and discard for at most
/// `wait` (and [`step::LINGER_BYTES`]), so that the close does not reset what the client
/// has not read yet.
pub(crate) async fn linger(io: &mut AsyncFd<Transport>, wait: Duration) {
    io.get_mut().close_notify();
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while io.get_ref().records_pending() {
            if write_records(io).await.is_err() {
                break;
            }
        }
    })
    .await;
    if io.get_ref().shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    // On the heap: an array here would sit in every connection's future, lingering or not.
    let mut scratch = vec![0u8; 4096];
    let mut discarded = 0;
    let _ = tokio::time::timeout(wait, async {
        while discarded < step::LINGER_BYTES {
            match io.get_ref().discard(&mut scratch, false) {
                Ok(0) => break,
                Ok(n) => discarded += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if wait.is_zero() {
                        break;
                    }
                    let Ok(mut guard) = io.readable().await else { break };
                    guard.clear_ready();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    })
    .await;
}

/// Completes when the client closes its side (or resets) while its request is handled.
/// Bytes it sends meanwhile (a pipelined request) are left in the socket, `unread` set,
/// for the next read.
pub(crate) async fn gone(io: &AsyncFd<Transport>, unread: &Cell<bool>) {
    loop {
        let Ok(mut guard) = io.ready(Interest::READABLE).await else {
            return;
        };
        let ready = guard.ready();
        if ready.is_read_closed() || ready.is_error() {
            return;
        }
        // Data, not the end: the next read takes it; this waits for the next edge.
        unread.set(true);
        guard.clear_ready_matching(tokio::io::Ready::READABLE);
    }
}

/// Ends when the client has closed its side (or the socket fails), whatever it sent before:
/// for a connection that does not read (paused at the budget).
pub(crate) async fn hung_up(io: &AsyncFd<Transport>) {
    loop {
        let Ok(mut guard) = io.ready(Interest::READABLE).await else {
            return;
        };
        if guard.ready().is_read_closed() {
            return;
        }
        // Bytes, not a close: wait for the next edge.
        guard.clear_ready_matching(tokio::io::Ready::READABLE);
    }
}

// SAFETY: a `Transport` owns its connection's socket, which it closes only when dropped,
// and `as_raw_fd` always returns that socket's descriptor: no method replaces the socket
// (`set_tls` adds a session over it).
unsafe impl crate::sys::StableFd for Transport {}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::future::Future;
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;
    use std::pin::pin;

    use socket2::Socket;

    use super::*;

    /// A current-thread runtime with a reactor, as an async worker has.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .unwrap()
    }

    /// A plain connection's transport, registered with the current runtime, and its peer.
    fn pair() -> (AsyncFd<Transport>, UnixStream) {
        let (ours, peer) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let transport = Transport::new(Socket::from(OwnedFd::from(ours)));
        let io = crate::sys::watch_async(transport, Interest::READABLE | Interest::WRITABLE).unwrap();
        (io, peer)
    }

    /// `f` polled once, as the runtime would poll it once.
    async fn once<T>(f: impl FnMut(&mut Context<'_>) -> Poll<T>) -> Poll<T> {
        let mut f = f;
        poll_fn(|cx| Poll::Ready(f(cx))).await
    }

    /// A read by the transport into `buf`, counted in `calls`.
    fn reader<'b>(
        buf: &'b mut [u8],
        calls: &'b Cell<u32>,
    ) -> impl FnMut(&mut Transport) -> io::Result<Option<(usize, usize)>> + 'b {
        move |t| {
            calls.set(calls.get() + 1);
            let room = buf.len();
            t.read(buf).map(|n| Some((n, room)))
        }
    }

    /// Issue 43: a short read on a plain socket drained it, so its readiness is cleared
    /// at once: the next read waits for a new edge without a `recv` that would fail with
    /// `EAGAIN`. A read that filled its room keeps the readiness: the socket may hold
    /// more, and the next read looks.
    #[test]
    fn issue_43_a_short_plain_read_clears_the_readiness_a_full_one_keeps_it() {
        runtime().block_on(async {
            let (mut io, mut peer) = pair();
            let calls = Cell::new(0);
            let mut buf = [0u8; 16];
            peer.write_all(b"hello").unwrap();
            let n = poll_fn(|cx| poll_read(&mut io, cx, reader(&mut buf, &calls))).await;
            assert_eq!(n.unwrap(), Some(5));
            calls.set(0);
            let again = once(|cx| poll_read(&mut io, cx, reader(&mut buf, &calls))).await;
            assert!(again.is_pending());
            assert_eq!(
                calls.get(),
                0,
                "a short read cleared the readiness: no read tried"
            );

            peer.write_all(b"12345678").unwrap();
            let mut four = [0u8; 4];
            let n = poll_fn(|cx| poll_read(&mut io, cx, reader(&mut four, &calls))).await;
            assert_eq!(n.unwrap(), Some(4));
            calls.set(0);
            let n = once(|cx| poll_read(&mut io, cx, reader(&mut four, &calls))).await;
            assert!(
                matches!(n, Poll::Ready(Ok(Some(4)))),
                "a full read kept the readiness"
            );
            assert_eq!(calls.get(), 1);
        });
    }

    /// Issue 43: a read declined (the budget of buffered bytes has no room) keeps the
    /// readiness, so that the read once there is room does not wait for a new edge; an
    /// `Interrupted` read is tried again; another error is the read's.
    #[test]
    fn issue_43_a_declined_read_keeps_the_readiness_and_interrupted_is_tried_again() {
        runtime().block_on(async {
            let (mut io, mut peer) = pair();
            peer.write_all(b"hello").unwrap();
            let declined = poll_fn(|cx| poll_read(&mut io, cx, |_| Ok(None))).await;
            assert_eq!(declined.unwrap(), None);
            let calls = Cell::new(0);
            let mut buf = [0u8; 16];
            let n = once(|cx| poll_read(&mut io, cx, reader(&mut buf, &calls))).await;
            assert!(matches!(n, Poll::Ready(Ok(Some(5)))), "read at once, no new edge");

            peer.write_all(b"again").unwrap();
            let tries = Cell::new(0);
            let n = poll_fn(|cx| {
                poll_read(&mut io, cx, |t| {
                    tries.set(tries.get() + 1);
                    if tries.get() == 1 {
                        return Err(io::ErrorKind::Interrupted.into());
                    }
                    t.read(&mut buf).map(|n| Some((n, 16)))
                })
            })
            .await;
            assert_eq!((n.unwrap(), tries.get()), (Some(5), 2));

            peer.write_all(b"x").unwrap();
            let failed =
                poll_fn(|cx| poll_read(&mut io, cx, |_| Err(io::ErrorKind::InvalidData.into()))).await;
            assert_eq!(failed.unwrap_err().kind(), io::ErrorKind::InvalidData);
        });
    }

    /// Issue 43: a write to a full socket waits (the readiness cleared by "would block")
    /// and is woken when the client reads; it reports the bytes taken.
    #[test]
    fn issue_43_a_write_to_a_full_socket_waits_for_the_client() {
        runtime().block_on(async {
            let (mut io, mut peer) = pair();
            let data = [7u8; 65536];
            // The first write waits for the reactor to report the socket writable.
            let mut sent = poll_fn(|cx| poll_write(&mut io, cx, &[IoSlice::new(&data)]))
                .await
                .unwrap();
            loop {
                match once(|cx| poll_write(&mut io, cx, &[IoSlice::new(&data)])).await {
                    Poll::Ready(Ok(n)) => {
                        assert!(n > 0);
                        sent += n;
                    }
                    Poll::Ready(Err(e)) => panic!("{e}"),
                    Poll::Pending => break,
                }
            }
            assert!(sent >= data.len(), "filled: {sent}");
            let write = poll_fn(|cx| poll_write(&mut io, cx, &[IoSlice::new(b"more")]));
            let mut write = pin!(write);
            assert!(once(|cx| write.as_mut().poll(cx)).await.is_pending());
            let mut got = vec![0u8; sent];
            peer.read_exact(&mut got).unwrap();
            assert_eq!(write.await.unwrap(), 4);
            assert_eq!(
                write_some(&mut io, b"").await.unwrap_err().kind(),
                io::ErrorKind::WriteZero
            );
        });
    }

    /// Issue 43: while a request is handled, bytes the client sends (a pipelined request)
    /// do not end the watch on its close: they are left for the next read (`unread`); the
    /// client's close ends it. A connection paused at the budget sees the close the same
    /// way ([`hung_up`]).
    #[test]
    fn issue_43_the_client_gone_is_its_close_not_its_bytes() {
        runtime().block_on(async {
            let (io, mut peer) = pair();
            let unread = Cell::new(false);
            let mut watch = pin!(gone(&io, &unread));
            let mut paused = pin!(hung_up(&io));
            peer.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            poll_fn(|cx| {
                assert!(watch.as_mut().poll(cx).is_pending(), "bytes are not a close");
                if unread.get() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            assert!(once(|cx| paused.as_mut().poll(cx)).await.is_pending());
            peer.shutdown(std::net::Shutdown::Write).unwrap();
            watch.await;
            paused.await;
            let mut left = [0u8; 64];
            assert_eq!(
                io.get_ref().socket().read(&mut left).unwrap(),
                18,
                "the bytes stay"
            );
        });
    }

    /// Issue 43: a lingering close shuts the connection for writing (the client reads its
    /// end) and drops what the client still sent, without waiting when told not to.
    #[test]
    fn issue_43_a_lingering_close_shuts_and_discards() {
        runtime().block_on(async {
            let (mut io, mut peer) = pair();
            peer.write_all(b"unread request").unwrap();
            io.get_mut().write(&[IoSlice::new(b"last reply")]).1.unwrap();
            linger(&mut io, Duration::ZERO).await;
            let mut got = Vec::new();
            peer.read_to_end(&mut got).unwrap();
            assert_eq!(got, b"last reply");
            let mut left = [0u8; 64];
            let n = io.get_ref().socket().read(&mut left);
            assert!(
                matches!(&n, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
                "{n:?}"
            );
        });
    }
}

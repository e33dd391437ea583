//! The async side of a connection's transport: the readiness rules of every read and
//! write over an `AsyncFd<Transport>`, written once for the async driver's request level
//! (`worker/tasks/`) and the client level's [`AsyncClient`](super::async_client::AsyncClient).

use std::cell::Cell;
use std::io::{self, Read};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::step;
use super::transport::Transport;

/// Reads raw bytes (admission: before TLS) into `buf`.
pub(crate) async fn read_raw(io: &mut AsyncFd<Transport>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let mut guard = io.readable_mut().await?;
        match guard.try_io(|t| t.get_ref().socket().read(buf)) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(r) => return r,
            Err(_would_block) => {}
        }
    }
}

/// Sends raw bytes (admission: TLS handshake records).
pub(crate) async fn send_raw(io: &mut AsyncFd<Transport>, data: &[u8]) -> io::Result<usize> {
    loop {
        let mut guard = io.writable_mut().await?;
        match guard.try_io(|t| t.get_ref().socket().send_with_flags(data, libc::MSG_NOSIGNAL)) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(r) => return r,
            Err(_would_block) => {}
        }
    }
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
        let mut guard = io.writable_mut().await?;
        match guard.try_io(|t| {
            let t = t.get_mut();
            let (taken, r) = t.write(&[io::IoSlice::new(data)]);
            match r {
                // Taken bytes are gone (under TLS, records may wait): reported.
                _ if taken > 0 => Ok(taken),
                Err(e) => Err(e),
                // Nothing taken, records waiting: they go out first (the loop's top).
                Ok(()) if t.records_pending() => Ok(0),
                Ok(()) => Err(io::ErrorKind::WriteZero.into()),
            }
        }) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(Ok(0)) => {}
            Ok(r) => return r,
            Err(_would_block) => {}
        }
    }
}

/// Writes pending TLS records once the socket takes them.
pub(crate) async fn write_records(io: &mut AsyncFd<Transport>) -> io::Result<usize> {
    loop {
        let mut guard = io.writable_mut().await?;
        match guard.try_io(|t| t.get_mut().write_records()) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(r) => return r,
            Err(_would_block) => {}
        }
    }
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

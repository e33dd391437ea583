//! The connection an [`AsyncHandler`](crate::AsyncHandler) serves: a tokio stream over
//! appsrv's own transport (plain or TLS, `transport.rs`), registered with the worker's
//! runtime, with the client's address and the deadlines of the blocking
//! [`Client`](super::client::Client).
//!
//! Each operation tries the transport first when it may have something without the
//! socket's readiness (plaintext rustls holds already, records to flush), else waits for
//! the readiness the runtime's reactor reports, then does one system call; "would block"
//! clears the readiness and waits again (`AsyncFd::try_io`). A read or a write that waits
//! longer than its timeout (`--read-timeout`, `--write-timeout` by default, or what the
//! handler sets) fails with [`io::ErrorKind::TimedOut`]: the deadline is armed when the
//! operation first has to wait, and disarmed when it makes progress, so that a timeout
//! bounds a silence, not a session.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::net::listener::Addr;
use crate::net::tls::TlsSession;

use super::transport::Transport;

/// One connection of an [`AsyncHandler`](crate::AsyncHandler): read it and write it with
/// tokio's `AsyncReadExt`, `AsyncBufReadExt` (through `tokio::io::BufReader`) and
/// `AsyncWriteExt`.
///
/// Writes go to the socket (or into TLS records) as they are made: wrap it in a
/// `tokio::io::BufWriter`, or write whole replies, to send one packet per reply. The
/// connection is flushed and closed when the handler's future completes.
pub struct AsyncClient {
    io: AsyncFd<Transport>,
    peer: Addr,
    id: u64,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    /// The deadline of the read (write) that waits, armed when it first waits.
    read_deadline: Option<Pin<Box<Sleep>>>,
    write_deadline: Option<Pin<Box<Sleep>>>,
    pub(crate) received: u64,
    pub(crate) sent: u64,
    shut: bool,
    /// Bytes read before the handler got the connection (after a PROXY header), given
    /// to its first reads.
    early: Vec<u8>,
}

impl std::fmt::Debug for AsyncClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncClient")
            .field("peer", &self.peer)
            .field("id", &self.id)
            .field("tls", &self.io.get_ref().is_tls())
            .finish_non_exhaustive()
    }
}

thread_local! {
    /// Wakes [`AsyncClient::stopped`]'s waiters when the worker stops (the async worker
    /// has one thread).
    static STOPPED: std::rc::Rc<tokio::sync::Notify> = std::rc::Rc::new(tokio::sync::Notify::new());
}

thread_local! {
    /// The worker began to stop (its listeners shut, or a stop signal): set before the
    /// waiters are woken, so that a `stopped()` made after the wake-up sees it.
    static STOPPING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The worker was asked to stop: wakes the handlers waiting in [`AsyncClient::stopped`].
pub(crate) fn worker_stops() {
    STOPPING.with(|s| s.set(true));
    STOPPED.with(|n| n.notify_waiters());
}

/// Whether the worker is stopping: a stop signal came, or the driver began to stop (the
/// master shut the listeners before its signal arrived).
fn worker_stopping() -> bool {
    crate::sys::stop_requested() || STOPPING.with(std::cell::Cell::get)
}

impl AsyncClient {
    /// The connection `io` (registered with the runtime, admitted) of `peer`, number `id`
    /// among the worker's, with the server's read and write timeouts.
    pub(crate) fn new(
        io: AsyncFd<Transport>,
        peer: Addr,
        id: u64,
        read_timeout: Option<Duration>,
        write_timeout: Option<Duration>,
    ) -> Self {
        AsyncClient {
            io,
            peer,
            id,
            read_timeout,
            write_timeout,
            read_deadline: None,
            write_deadline: None,
            received: 0,
            sent: 0,
            shut: false,
            early: Vec::new(),
        }
    }

    /// Bytes admission read past its needs, for the handler's first reads.
    pub(crate) fn prepend(&mut self, bytes: &[u8]) {
        self.early.extend_from_slice(bytes);
    }

    /// The client's address: the one its PROXY protocol header gave, when the listener
    /// takes one, else the connection's peer.
    pub fn peer_addr(&self) -> &Addr {
        &self.peer
    }

    /// The local address of this connection (the address the client connected to).
    pub fn local_addr(&self) -> io::Result<Addr> {
        Ok(Addr::from_sockaddr(&self.io.get_ref().socket().local_addr()?))
    }

    /// The TLS session, on a TLS listener: the protocol agreed by ALPN, the client's
    /// certificate, the server name it asked for.
    pub fn tls(&self) -> Option<&TlsSession> {
        self.io.get_ref().tls()
    }

    /// The connection's number among those this worker served (from 1).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// How long a read may wait for the client (`None`: forever). Default:
    /// `--read-timeout`.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) {
        self.read_timeout = timeout;
        self.read_deadline = None;
    }

    /// How long a write may wait for the client to take it (`None`: forever). Default:
    /// `--write-timeout`.
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) {
        self.write_timeout = timeout;
        self.write_deadline = None;
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> Option<Duration> {
        self.read_timeout
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> Option<Duration> {
        self.write_timeout
    }

    /// Whether the worker was asked to stop (a stop, a reload, an upgrade, recycling):
    /// a conversational protocol ends its session at the next good moment (SMTP says
    /// `421`). A session that goes on is served until it ends or the grace period does.
    pub fn stopping(&self) -> bool {
        worker_stopping()
    }

    /// Completes when the worker is asked to stop (at once if it was): to `select!` on
    /// beside a read that waits for the client's next command. The future does not
    /// borrow the client, so that the read can:
    ///
    /// ```no_run
    /// # #[allow(dead_code)]
    /// # async fn f(client: &mut appsrv::AsyncClient) -> std::io::Result<()> {
    /// use tokio::io::AsyncBufReadExt;
    /// let stopped = client.stopped();
    /// let mut lines = tokio::io::BufReader::new(client);
    /// let mut line = String::new();
    /// tokio::select! {
    ///     n = lines.read_line(&mut line) => { n?; /* a command */ }
    ///     () = stopped => { /* say goodbye */ }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + use<> {
        let notify = STOPPED.with(std::rc::Rc::clone);
        async move {
            let notified = notify.notified();
            if worker_stopping() {
                return;
            }
            notified.await;
        }
    }

    /// The connection, for the driver's close once the handler is done.
    pub(crate) fn into_io(self) -> AsyncFd<Transport> {
        self.io
    }

    /// The connection, for the driver's cut at a deadline.
    pub(crate) fn io(&self) -> &AsyncFd<Transport> {
        &self.io
    }

    /// `Ready(Err(TimedOut))` once the deadline in `slot` (armed now with `timeout` if it
    /// is not) passes; `Pending` until then.
    fn poll_deadline(
        slot: &mut Option<Pin<Box<Sleep>>>,
        timeout: Option<Duration>,
        what: &str,
        cx: &mut Context<'_>,
    ) -> Poll<io::Error> {
        let Some(t) = timeout else { return Poll::Pending };
        let sleep = slot.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + t)));
        ready!(sleep.as_mut().poll(cx));
        *slot = None;
        Poll::Ready(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the client sent nothing for {} s while the handler waited to {what}",
                t.as_secs_f64()
            ),
        ))
    }

    /// Writes pending TLS records, waiting for the socket as needed.
    fn poll_records(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.io.get_ref().records_pending() {
            let mut guard = match self.io.poll_write_ready_mut(cx) {
                Poll::Ready(g) => g?,
                Poll::Pending => {
                    return match Self::poll_deadline(
                        &mut self.write_deadline,
                        self.write_timeout,
                        "write",
                        cx,
                    ) {
                        Poll::Ready(e) => Poll::Ready(Err(e)),
                        Poll::Pending => Poll::Pending,
                    };
                }
            };
            match guard.try_io(|t| t.get_mut().write_records()) {
                Ok(Ok(n)) => {
                    self.sent += n as u64;
                    self.write_deadline = None;
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {}
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for AsyncClient {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Reading after `shutdown` is allowed: the client may still send (a half-closed
        // connection reads what comes until the client's own close).
        if !this.early.is_empty() {
            let n = this.early.len().min(buf.remaining());
            buf.put_slice(&this.early[..n]);
            this.early.drain(..n);
            return Poll::Ready(Ok(()));
        }
        // Alerts or key-update answers the TLS layer wants to send go out, as far as the
        // socket takes them now: a read does not wait for them (a client that reads only
        // once it has sent everything would wait for the read, and the read for it).
        if this.io.get_ref().records_pending() {
            if let Ok(n) = this.io.get_mut().write_records() {
                this.sent += n as u64;
            }
        }
        loop {
            // Plaintext rustls holds already needs no readiness.
            if this.io.get_mut().input_pending() {
                let n = this.io.get_mut().read(buf.initialize_unfilled())?;
                buf.advance(n);
                this.received += n as u64;
                this.read_deadline = None;
                return Poll::Ready(Ok(()));
            }
            let mut guard = match this.io.poll_read_ready_mut(cx) {
                Poll::Ready(g) => g?,
                Poll::Pending => {
                    return match Self::poll_deadline(&mut this.read_deadline, this.read_timeout, "read", cx) {
                        Poll::Ready(e) => Poll::Ready(Err(e)),
                        Poll::Pending => Poll::Pending,
                    };
                }
            };
            let room = buf.remaining();
            match guard.try_io(|t| t.get_mut().read(buf.initialize_unfilled())) {
                Ok(Ok(n)) => {
                    // A short read drained a plain socket: its next bytes are a new edge
                    // (the readiness would otherwise cost a failing `recv` at the next
                    // read). Not under TLS, where bytes may stay in the socket.
                    if n < room && !guard.get_inner().is_tls() {
                        // Readable only: a close that came with the bytes stays seen.
                        guard.clear_ready_matching(tokio::io::Ready::READABLE);
                    }
                    buf.advance(n);
                    this.received += n as u64;
                    this.read_deadline = None;
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => {
                    if e.kind() == io::ErrorKind::InvalidData {
                        // A TLS protocol error: the alert rustls prepared goes out, best
                        // effort.
                        let _ = this.io.get_mut().write_records();
                    }
                    return Poll::Ready(Err(e));
                }
                Err(_would_block) => {}
            }
        }
    }
}

impl AsyncWrite for AsyncClient {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(data)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.shut {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        // Records of earlier writes go first: rustls's buffer would grow without bound
        // for a client that does not read.
        ready!(this.poll_records(cx))?;
        loop {
            let mut guard = match this.io.poll_write_ready_mut(cx) {
                Poll::Ready(g) => g?,
                Poll::Pending => {
                    return match Self::poll_deadline(
                        &mut this.write_deadline,
                        this.write_timeout,
                        "write",
                        cx,
                    ) {
                        Poll::Ready(e) => Poll::Ready(Err(e)),
                        Poll::Pending => Poll::Pending,
                    };
                }
            };
            let tls = guard.get_inner().is_tls();
            match guard.try_io(|t| {
                let (taken, r) = t.get_mut().write(data);
                match r {
                    // Taken bytes are gone, whatever the records' outcome: they are
                    // reported, and the records go out at the next write or flush.
                    _ if taken > 0 => Ok(taken),
                    Err(e) => Err(e),
                    Ok(()) => Ok(0),
                }
            }) {
                Ok(Ok(n)) => {
                    if !tls {
                        this.sent += n as u64;
                    }
                    this.write_deadline = None;
                    return Poll::Ready(Ok(n));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {}
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_records(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.shut {
            ready!(this.poll_records(cx))?;
            this.io.get_mut().close_notify();
            this.shut = true;
        }
        ready!(this.poll_records(cx))?;
        Poll::Ready(this.io.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

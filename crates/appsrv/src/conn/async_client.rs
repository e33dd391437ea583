//! The connection an [`AsyncHandler`](crate::AsyncHandler) serves: a tokio stream over
//! appsrv's own transport (plain or TLS, `transport.rs`), registered with the worker's
//! runtime, with the client's address and the deadlines of the blocking
//! [`Client`](super::client::Client).
//!
//! Each operation tries the transport first when it may have something without the
//! socket's readiness (plaintext rustls holds already, records to flush), else waits for
//! the readiness the runtime's reactor reports, then does one system call; "would block"
//! clears the readiness and waits again (`AsyncFd::try_io`): the rules of
//! `async_transport.rs`, which the async driver's request level reads and writes by too. A read or a write that waits
//! longer than its timeout (`--read-timeout`, `--write-timeout` by default, or what the
//! handler sets) fails with [`io::ErrorKind::TimedOut`]: the deadline is armed when the
//! operation first has to wait, and disarmed when it makes progress, so that a timeout
//! bounds a silence, not a session. With `--min-send-rate`, a write that waits is checked
//! every second by the send watch (`send_watch.rs`), which keeps the write timeout then,
//! as in the blocking and event models: a client that takes less than the rate is cut
//! (`TimedOut`, and the driver resets the connection).

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

use super::async_transport;
use super::send_watch::SendWatch;
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
    /// [`penalize`](AsyncClient::penalize) was called: reads return end of file.
    penalized: bool,
    /// `--min-send-rate` (when on): judges the writes that wait, checked every second; it
    /// keeps the write timeout then.
    watch: Option<SendWatch>,
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

/// The worker was asked to stop: wakes the handlers waiting in [`AsyncClient::stopped`].
/// The stop is recorded before the waiters are woken, so that a `stopped()` made after
/// the wake-up sees it.
pub(crate) fn worker_stops() {
    crate::conn::id::set_stopping();
    STOPPED.with(|n| n.notify_waiters());
}

/// Whether the worker is stopping: a stop signal came, or the driver began to stop (the
/// master shut the listeners before its signal arrived).
fn worker_stopping() -> bool {
    crate::conn::id::worker_stopping()
}

impl AsyncClient {
    /// The connection `io` (registered with the runtime, admitted) of `peer`, number `id`
    /// among the worker's, with the server's read and write timeouts and
    /// `--min-send-rate` (0: none).
    pub(crate) fn new(
        io: AsyncFd<Transport>,
        peer: Addr,
        id: u64,
        read_timeout: Option<Duration>,
        write_timeout: Option<Duration>,
        min_send_rate: u64,
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
            penalized: false,
            watch: (min_send_rate > 0).then(|| SendWatch::new(min_send_rate, write_timeout)),
            early: Vec::new(),
        }
    }

    /// Bytes admission read past its needs, for the handler's first reads.
    pub(crate) fn prepend(&mut self, bytes: &[u8]) {
        self.early.extend_from_slice(bytes);
    }

    /// The client's address: IP and port for TCP (the one a PROXY header named, behind a
    /// balancer), the peer's path (usually none) for Unix sockets.
    pub fn peer_addr(&self) -> &Addr {
        &self.peer
    }

    /// The local address of this connection (the address the client connected to, which
    /// for a listener on `0.0.0.0` or `[::]` is a specific address).
    pub fn local_addr(&self) -> io::Result<Addr> {
        Ok(Addr::from_sockaddr(&self.io.get_ref().socket().local_addr()?))
    }

    /// The TLS session, on a TLS listener: the protocol agreed by ALPN, the client's
    /// certificate, the server name it asked for.
    pub fn tls(&self) -> Option<&TlsSession> {
        self.io.get_ref().tls()
    }

    /// The connection's name across the pool: the worker's slot, generation and process
    /// id, and the connection's number in that worker (see [`ConnId`](crate::ConnId)).
    pub fn id(&self) -> crate::ConnId {
        crate::ConnId::new(self.id)
    }

    /// The worker's privileged helper `P` ([`Server::privileged`](crate::Server::privileged)):
    /// `client.privileged::<MyHelper>().call_async(&request).await`, which never blocks the
    /// worker's thread (its other connections are served while the helper works). See
    /// [`privileged`](crate::privileged) and [`Helper::call_async`](crate::privileged::Helper::call_async).
    pub fn privileged<P: crate::privileged::Privileged>(&self) -> crate::privileged::Helper<P> {
        crate::privileged::helper()
    }

    /// Charges the client's address with a failed authentication (a wrong password, token
    /// or signature), as [`Client::penalize`](crate::Client::penalize) does: the address
    /// is refused by every worker for 2^(n-1) seconds after its n-th failure in a row, at
    /// most `--penalty-max` (600 s by default; `0` turns penalties off). See
    /// [`Conn::penalize`](crate::Conn::penalize) for the whole rule.
    ///
    /// From then on, as on the blocking [`Client`](crate::Client), reads return end of
    /// file (writes go on): answer the failure, and the handler's loop that reads the next
    /// command ends the session, so that the next attempt needs a new connection and goes
    /// through admission.
    ///
    /// Returns how long the address is now refused; `None` when nothing was charged
    /// (penalties off, a Unix-socket client, or a full table, which fails open).
    pub fn penalize(&mut self) -> Option<Duration> {
        self.penalized = true;
        crate::penalty::charge(self.peer.ip()?)
    }

    /// How long a read may wait for the client (`None`: forever). Default:
    /// `--read-timeout` (60 s). Never fails (the timer is the runtime's, not the
    /// socket's); an `io::Result` as on [`Client`](crate::Client), whose kernel timeouts
    /// can.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.read_timeout = timeout;
        self.read_deadline = None;
        Ok(())
    }

    /// How long a write may wait for the client to take it (`None`: forever). Default:
    /// `--write-timeout` (60 s). Never fails, as [`set_read_timeout`](Self::set_read_timeout).
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.write_timeout = timeout;
        self.write_deadline = None;
        if let Some(w) = self.watch.as_mut() {
            w.keep_write_timeout(timeout);
        }
        Ok(())
    }

    /// The read timeout. Never fails.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.read_timeout)
    }

    /// The write timeout. Never fails.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.write_timeout)
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

    /// A write waits for the client: `Ready(Err)` when it must give up, `Pending` until
    /// then. Without `--min-send-rate`, at the write timeout; with it, when the send watch
    /// says so, asked every [`check_interval`](SendWatch::check_interval) of the wait (as
    /// the event loop does): a client below the rate is cut, and the watch keeps the write
    /// timeout.
    fn poll_write_wait(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let Some(watch) = self.watch.as_mut() else {
            return Self::poll_deadline(&mut self.write_deadline, self.write_timeout, "write", cx);
        };
        loop {
            let check = watch.check_interval();
            let sleep = self
                .write_deadline
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + check)));
            ready!(sleep.as_mut().poll(cx));
            self.write_deadline = None;
            if let Err(e) = watch.waited(self.io.get_ref().socket(), false) {
                return Poll::Ready(e);
            }
        }
    }

    /// A write made progress: its wait's deadline is disarmed.
    fn wrote(&mut self) {
        self.write_deadline = None;
        if let Some(w) = self.watch.as_mut() {
            w.progress();
        }
    }

    /// The client sent again: the response before is done, and the next one's waits start
    /// afresh for `--min-send-rate`.
    fn read_again(&mut self) {
        if let Some(w) = self.watch.as_mut() {
            w.reset();
        }
    }

    /// Writes pending TLS records, waiting for the socket as needed.
    fn poll_records(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.io.get_ref().records_pending() {
            match async_transport::poll_write_records(&mut self.io, cx) {
                Poll::Ready(Ok(n)) => {
                    self.sent += n as u64;
                    self.wrote();
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    return match self.poll_write_wait(cx) {
                        Poll::Ready(e) => Poll::Ready(Err(e)),
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for AsyncClient {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.penalized {
            return Poll::Ready(Ok(())); // end of file
        }
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
        // Plaintext rustls holds already needs no readiness.
        if this.io.get_mut().input_pending() {
            let n = this.io.get_mut().read(buf.initialize_unfilled())?;
            buf.advance(n);
            this.received += n as u64;
            this.read_deadline = None;
            this.read_again();
            return Poll::Ready(Ok(()));
        }
        // Once readable, by the transport's rules (a short plain read clears the readiness,
        // a TLS error sends its alert).
        let room = buf.remaining();
        let read = async_transport::poll_read(&mut this.io, cx, |t| {
            t.read(buf.initialize_unfilled()).map(|n| Some((n, room)))
        });
        match read {
            Poll::Ready(Ok(n)) => {
                // The closure never declines: `None` is not returned.
                let n = n.unwrap_or(0);
                buf.advance(n);
                this.received += n as u64;
                this.read_deadline = None;
                this.read_again();
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                match Self::poll_deadline(&mut this.read_deadline, this.read_timeout, "read", cx) {
                    Poll::Ready(e) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                }
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
        let tls = this.io.get_ref().is_tls();
        match async_transport::poll_write(&mut this.io, cx, data) {
            Poll::Ready(Ok(n)) => {
                if !tls {
                    this.sent += n as u64;
                }
                this.wrote();
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match this.poll_write_wait(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
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

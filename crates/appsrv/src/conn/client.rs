//! The accepted connection a handler reads from and writes to: the blocking adaptor over
//! the connection's [`Buffers`], its [`Transport`] and the [`SendWatch`]. The transport
//! does one system call per operation and answers "would block"; here the calls are
//! looped until done, an expired socket timeout becomes `TimedOut`, `--min-send-rate` is
//! applied to the waits, and the scoreboard shows the worker reading while it waits.

use std::fs::File;
use std::io::{self, BufRead, IoSlice, Read, Write};
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use socket2::Socket;

pub(crate) use super::buffers::{BUFFER_SIZE, Buffers};
pub(crate) use super::send_watch::SendWatch;
use super::transport::Transport;
use crate::net::listener::Addr;
use crate::net::tls::TlsSession;

/// An accepted connection: `Read`, `BufRead` and `Write`, with buffered output.
///
/// Output is buffered and written to the socket:
/// - when the buffer (16 KiB) is full (a large write goes out with the buffered bytes in a
///   single `writev`);
/// - before any read that has to wait for the peer, so a request/response dialogue needs
///   no explicit `flush`: the answer is on its way before the next question is awaited;
/// - on [`flush`](Write::flush) and [`close`](Client::close);
/// - when the handler returns.
///
/// So a handler that writes a response in many small pieces costs one `write(2)`, not one
/// per piece.
///
/// Reads are buffered too (16 KiB), so `read_line` and the other [`BufRead`] methods work
/// directly on the client.
///
/// Timeouts: the read and write timeouts (`--read-timeout`, `--write-timeout`, 60 s by
/// default) apply to each blocking read or write. An expired timeout is an error of kind
/// [`io::ErrorKind::TimedOut`]. While a write waits for a client that reads slower than
/// `--min-send-rate` (500 bytes/s by default, measured on what it acknowledged over 10 s),
/// it fails with `TimedOut` too, and the connection is reset when the handler returns.
///
/// A stop request (TERM, INT, QUIT) does not interrupt a connection: reads and writes
/// carry on until the handler returns, within the master's grace period.
///
/// On a TLS listener (`ADDR?tls`) the same methods read and write decrypted data; the
/// handshake is done before the handler is called, and [`tls`](Client::tls) tells what it
/// negotiated. Differences under TLS: [`send_file`](Client::send_file) copies the file
/// through the encryption (no `sendfile(2)`, which would bypass it); byte counts are of
/// decrypted data; a client that closes without TLS's `close_notify` is seen as an end of
/// file, as a plain client would be (a protocol that must detect truncation frames its
/// messages, as the codecs do); [`as_fd`](AsFd::as_fd) gives the encrypted socket.
#[derive(Debug)]
pub struct Client {
    /// The socket, and the TLS session on a TLS listener.
    transport: Transport,
    peer: Addr,
    /// What was received and not consumed yet, and the output not sent yet.
    bufs: Buffers,
    closed: bool,
    /// [`penalize`](Client::penalize) was called: reads return end of file.
    penalized: bool,
    /// Bytes received and sent on this connection, for the scoreboard.
    received: u64,
    sent: u64,
    /// `--min-send-rate`, and the write timeout it keeps.
    watch: SendWatch,
    /// For `handle_client`: the scoreboard slot that shows the worker reading while the
    /// handler waits for the client (so that `status` and the master's slow-client
    /// warning see idle connections), handling otherwise.
    reads_shown: Option<(&'static crate::scoreboard::Board, u32)>,
    /// The connection's number in this worker process ([`Client::id`]).
    number: u64,
}

/// Connections this worker process made a [`Client`] for (the blocking and hybrid
/// workers'), for [`Client::id`].
static CLIENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Client {
    pub(crate) fn new(socket: Socket, peer: Addr, buffers: Buffers) -> Self {
        Client {
            transport: Transport::new(socket),
            peer,
            bufs: buffers,
            closed: false,
            penalized: false,
            received: 0,
            sent: 0,
            watch: SendWatch::default(),
            reads_shown: None,
            number: CLIENTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
        }
    }

    /// Shows the worker `id` reading on `board` while the handler waits for this client.
    pub(crate) fn show_reads(&mut self, board: &'static crate::scoreboard::Board, id: u32) {
        self.reads_shown = Some((board, id));
    }

    /// Enforces `--min-send-rate` on this connection; the socket's send timeout must be
    /// [`SendWatch::socket_timeout`] already (inherited from the listener).
    pub(crate) fn watch_sends(&mut self, watch: SendWatch) {
        self.watch = watch;
    }

    /// Cuts the connection off at once (a reset, no lingering data in the kernel): for a
    /// client too slow to take its response.
    pub(crate) fn abort(&mut self) {
        let _ = self.transport.socket().set_linger(Some(Duration::ZERO));
        self.closed = true;
        self.bufs.write.clear();
    }

    /// Handles a write that returned `r`: `Ok(Some(n))` for `n` bytes written, `Ok(None)`
    /// to try again (interrupted, or a wait that the watch allows to go on), `Err` to give
    /// up.
    fn after_write(&mut self, r: io::Result<usize>, wanted: usize) -> io::Result<Option<usize>> {
        let checked = match r {
            Ok(n) if self.watch.active() && n > 0 && n < wanted => {
                // A short write: it waited and gave up with part of the data.
                self.watch.waited(self.transport.socket(), true).map(|()| Some(n))
            }
            Ok(n) => {
                if self.watch.active() {
                    self.watch.progress();
                }
                Ok(Some(n))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.watch.active() => {
                self.watch.waited(self.transport.socket(), false).map(|()| None)
            }
            Err(e) => Err(timed_out(e)),
        };
        let deadline = matches!(&checked, Err(e) if e.kind() == io::ErrorKind::TimedOut);
        if self.watch.cut() || deadline {
            // Too slow (`--min-send-rate`), or a write past `--write-timeout`: the
            // connection is over, whatever the handler does next, and reset, so that the
            // kernel does not go on trickling what it holds to the client (issue 42: a
            // plain close left the socket in FIN-WAIT-1 with its send queue).
            self.abort();
        }
        checked
    }

    /// Flushes what is left (unless closed), closes the socket and gives the buffers back.
    pub(crate) fn finish(mut self) -> (io::Result<()>, Buffers) {
        let flushed = if self.closed {
            Ok(())
        } else {
            self.flush().and_then(|()| self.close_notify())
        };
        // A reader too slow (cut during this last flush, or earlier) was reset by
        // `after_write` already (`abort`), so the kernel does not trickle the rest to it.
        let mut buffers = std::mem::replace(&mut self.bufs, Buffers::none());
        buffers.reset();
        (flushed, buffers)
    }

    /// The worker's privileged helper `P` ([`Server::privileged`](crate::Server::privileged)):
    /// `client.privileged::<MyHelper>().call(&request)`. See [`privileged`](crate::privileged).
    pub fn privileged<P: crate::privileged::Privileged>(&self) -> crate::privileged::Helper<P> {
        crate::privileged::helper()
    }

    /// Charges the client's address with a failed authentication (a wrong password or
    /// token), so that brute force from it is slowed across every worker; call it when
    /// your check fails, after (or before) writing your answer.
    ///
    /// From then on, reads on this connection return end of file (what it had sent and
    /// was not read yet is dropped): a handler's loop ends as if the client had left, and
    /// writes still go out, so the answer reaches it. The address is refused new
    /// connections for 2^(n-1) seconds after its n-th failure in a row (1 s, 2 s, 4 s ...),
    /// at most `--penalty-max` (600 s by default; `0` turns penalties off), closed at once
    /// before any byte is read; it is forgotten once no failure was charged for
    /// `--penalty-max` after its refusal ended. Returns how long the address is now
    /// refused; `None` when nothing was charged (penalties off, a Unix-socket client, or a
    /// full table, which fails open). See [`Conn::penalize`](crate::Conn::penalize) for
    /// the whole rule, IPv6 `/64`s and the caveat about proxies.
    ///
    /// ```no_run
    /// use std::io::{self, BufRead, Write};
    ///
    /// /// A line protocol whose first line is the password.
    /// fn handle(client: &mut appsrv::Client) -> io::Result<()> {
    ///     let mut line = String::new();
    ///     client.read_line(&mut line)?;
    ///     if line.trim_end() != "open-sesame-0123456789" {
    ///         let wait = client.penalize().map_or(0, |d| d.as_secs().max(1));
    ///         return writeln!(client, "-ERR wrong password; retry in {wait} s");
    ///     }
    ///     writeln!(client, "+OK")
    /// }
    /// # let _ = handle;
    /// ```
    pub fn penalize(&mut self) -> Option<Duration> {
        self.penalized = true;
        self.bufs.discard_input();
        crate::penalty::charge(self.peer.ip()?)
    }

    /// The client's address: IP and port for TCP (the one a PROXY header named, behind a
    /// balancer), the peer's path (usually none) for Unix sockets. Borrowed, as on
    /// [`AsyncClient`](crate::AsyncClient) and [`Conn`](crate::Conn): to write it to the
    /// client, copy it first (`let peer = client.peer_addr().clone();`).
    pub fn peer_addr(&self) -> &Addr {
        &self.peer
    }

    /// The connection's name across the pool: the worker's slot, generation and process
    /// id, and the connection's number in that worker (see [`ConnId`](crate::ConnId)).
    pub fn id(&self) -> crate::ConnId {
        crate::ConnId::new(self.number)
    }

    /// Whether the worker was asked to stop (a stop, a reload, an upgrade, recycling): a
    /// conversational protocol ends its session at the next good moment (SMTP says
    /// `421`). A session that goes on is served until it ends or the grace period does.
    pub fn stopping(&self) -> bool {
        crate::conn::id::worker_stopping()
    }

    /// Replaces the peer's address by the client's real one (from a PROXY header).
    pub(crate) fn set_peer(&mut self, peer: Addr) {
        self.peer = peer;
    }

    /// The TLS session of a connection accepted on a TLS listener (`ADDR?tls`): protocol,
    /// ALPN, the client's verified certificate. `None` on a plain listener.
    pub fn tls(&self) -> Option<&TlsSession> {
        self.transport.tls()
    }

    /// Installs the TLS session of a handshake done before (admission): from now on the
    /// connection reads and writes through it. The handshake's bytes were all the TLS
    /// layer's: none may be left in the read buffer, where they would pass for clear text.
    pub(crate) fn set_tls(&mut self, session: Box<TlsSession>) {
        debug_assert!(
            self.bufs.unconsumed().is_empty(),
            "encrypted bytes left in the read buffer"
        );
        self.transport.set_tls(session);
    }

    /// Whether decrypted input waits inside the TLS layer (so the socket need not be
    /// readable for the next read to return data).
    pub(crate) fn input_pending(&mut self) -> bool {
        self.transport.input_pending()
    }

    /// Sends TLS's `close_notify` (nothing on a plain connection). Best effort.
    fn close_notify(&mut self) -> io::Result<()> {
        self.transport.close_notify();
        self.flush_records(false)
    }

    /// Writes every pending TLS record (none on a plain connection), each write waiting as
    /// long as the socket's send timeout; with `watched`, `--min-send-rate` watches the
    /// waits (the response's records), otherwise an expired timeout is `TimedOut` at once
    /// (alerts, `close_notify`, answers written before a read).
    fn flush_records(&mut self, watched: bool) -> io::Result<()> {
        while self.transport.records_pending() {
            let r = self.transport.write_records();
            let written = if watched {
                // No short-write check (`wanted` 0): the size of the records is rustls's.
                self.after_write(r, 0)?
            } else {
                match r {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
                    r => Some(r.map_err(timed_out)?),
                }
            };
            if written == Some(0) {
                return Err(io::ErrorKind::WriteZero.into());
            }
        }
        Ok(())
    }

    /// The local address of this connection (the address the client connected to, which
    /// for a listener on `0.0.0.0` or `[::]` is a specific address).
    pub fn local_addr(&self) -> io::Result<Addr> {
        Ok(Addr::from_sockaddr(&self.transport.socket().local_addr()?))
    }

    /// Sets the timeout of each blocking read (`None`: wait forever). The default comes
    /// from `--read-timeout` (60 s).
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.transport.socket().set_read_timeout(timeout)
    }

    /// Sets the timeout of each blocking write (`None`: wait forever). The default comes
    /// from `--write-timeout` (60 s).
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if self.watch.active() {
            // The kernel's timeout stays short so that waits come back to be checked
            // against --min-send-rate; the handler's timeout is kept by the watch.
            self.transport
                .socket()
                .set_write_timeout(self.watch.kernel_timeout_for(timeout))?;
            self.watch.keep_write_timeout(timeout);
            return Ok(());
        }
        self.transport.socket().set_write_timeout(timeout)
    }

    /// The current read timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        self.transport.socket().read_timeout()
    }

    /// The current write timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        if self.watch.active() {
            return Ok(self.watch.write_timeout());
        }
        self.transport.socket().write_timeout()
    }

    /// Flushes buffered output and closes the connection in both directions. Later reads
    /// return end of file; later writes fail with [`io::ErrorKind::NotConnected`].
    pub fn close(&mut self) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        let flushed = self.flush().and_then(|()| self.close_notify());
        self.closed = true;
        self.bufs.discard_input();
        self.bufs.write.clear();
        let shut = self.transport.shutdown(std::net::Shutdown::Both);
        flushed.and(shut.or_else(|e| {
            if e.kind() == io::ErrorKind::NotConnected {
                Ok(())
            } else {
                Err(e)
            }
        }))
    }

    /// Whether [`close`](Client::close) was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Bytes already received and buffered, not yet read by the handler.
    pub fn buffered(&self) -> &[u8] {
        self.bufs.unconsumed()
    }

    /// Whether the next read returns without waiting for the socket: bytes are buffered
    /// ([`buffered`](Client::buffered)), decrypted input waits inside the TLS layer, or
    /// the connection is closed (the read returns end of file).
    ///
    /// For a handler that waits on the socket itself, with `poll` on
    /// [`as_fd`](AsFd::as_fd) beside descriptors of its own (a relay to a child process,
    /// say): it asks this before each wait. Under TLS a whole message may have been
    /// decrypted with the record before it, the socket having nothing more to read: a
    /// `poll` on it alone would wait for ever.
    pub fn input_ready(&mut self) -> bool {
        self.closed || self.penalized || self.bufs.has_input() || self.transport.input_pending()
    }

    /// Reads from the socket, after flushing pending output: the one place that waits.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use crate::scoreboard::State;
        let Some((board, id)) = self.reads_shown else {
            return self.recv_from_socket(buf, false);
        };
        board.set_state(id, State::Reading);
        let r = self.recv_from_socket(buf, false);
        board.set_state(id, State::Handling);
        r
    }

    /// As `recv`; when `interruptible`, a signal ends the wait with `Interrupted` (the
    /// request loop then checks for a stop at a request boundary).
    fn recv_from_socket(&mut self, buf: &mut [u8], interruptible: bool) -> io::Result<usize> {
        if self.closed || self.penalized {
            return Ok(0);
        }
        if !self.bufs.write.is_empty() {
            self.flush_buffer()?;
        }
        self.watch.reset();
        loop {
            // Alerts or key-update answers the TLS layer wants to send go out before waiting.
            if self.transport.is_tls() {
                self.flush_records(false)?;
            }
            match self.transport.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted && !interruptible => continue,
                Ok(n) => {
                    self.received += n as u64;
                    return Ok(n);
                }
                Err(e) => {
                    if e.kind() == io::ErrorKind::InvalidData {
                        // A TLS protocol error: the alert rustls prepared goes out, best
                        // effort.
                        let _ = self.flush_records(false);
                    }
                    return Err(timed_out(e));
                }
            }
        }
    }

    /// For the request loop: reads more bytes after those not yet consumed, moving them to
    /// the front and growing the buffer up to `max` bytes as needed. Pending output is
    /// written first. Returns the number of bytes read (0 at end of file, or when the
    /// buffer holds `max` bytes already).
    pub(crate) fn read_more(&mut self, max: usize, interruptible: bool) -> io::Result<usize> {
        if self.bufs.room(max).is_empty() {
            return Ok(0);
        }
        // Only the read buffer is lent to the receive: the output stays, to be flushed
        // before it waits.
        let end = self.bufs.end;
        let mut read = std::mem::take(&mut self.bufs.read);
        let r = self.recv_from_socket(&mut read[end..], interruptible);
        self.bufs.read = read;
        let n = r?;
        self.bufs.filled(n);
        Ok(n)
    }

    /// For the request step: the buffers, with the peer and the TLS session beside them.
    pub(crate) fn parts(&mut self) -> (&mut Buffers, &Addr, Option<&TlsSession>) {
        (&mut self.bufs, &self.peer, self.transport.tls())
    }

    /// [`parts`](Client::parts), and the socket (for the handler's `local_addr`).
    pub(crate) fn parts_with_socket(&mut self) -> (&mut Buffers, &Addr, Option<&TlsSession>, &Socket) {
        (
            &mut self.bufs,
            &self.peer,
            self.transport.tls(),
            self.transport.socket(),
        )
    }

    /// The connection's number in this worker process (from 1).
    pub(crate) fn number(&self) -> u64 {
        self.number
    }

    /// Bytes received and sent on this connection so far (those written directly by
    /// `write_vectored`/`sendfile` included).
    pub(crate) fn traffic(&self) -> (u64, u64) {
        (self.received, self.sent)
    }

    /// [`traffic`](Client::traffic), counted from zero again: for a connection served
    /// more than once by one worker (hybrid mode), each service accounts for its own.
    pub(crate) fn take_traffic(&mut self) -> (u64, u64) {
        let t = self.traffic();
        (self.received, self.sent) = (0, 0);
        t
    }

    /// For the request loop: marks `n` received bytes as consumed.
    pub(crate) fn consume_input(&mut self, n: usize) {
        self.bufs.consume(n);
    }

    /// For the request loop: writes the output buffer.
    pub(crate) fn flush_output(&mut self) -> io::Result<()> {
        self.flush_buffer()
    }

    /// For the request loop: shuts the connection for writing, then reads and discards
    /// input until end of file, `max_wait` or `max_bytes` (with a zero `max_wait`, only
    /// what has arrived already, without waiting), so that closing it does not reset a
    /// reply the client has not read yet. Best effort: errors end it quietly.
    pub(crate) fn linger(&mut self, max_wait: Duration, max_bytes: usize) {
        if self.closed {
            return;
        }
        if self.close_notify().is_err() || self.transport.shutdown(std::net::Shutdown::Write).is_err() {
            // A peer that does not take the close_notify will not take more: give up now
            // rather than wait for it again when the connection is finished.
            self.closed = true;
            return;
        }
        let mut discarded = 0;
        let mut scratch = [0u8; 4096];
        if max_wait.is_zero() {
            // Only what has arrived already: never wait.
            while discarded < max_bytes {
                match self.transport.discard(&mut scratch, false) {
                    Ok(n) if n > 0 => discarded += n,
                    _ => break,
                }
            }
            self.closed = true;
            return;
        }
        let _ = self
            .transport
            .socket()
            .set_read_timeout(Some(max_wait.min(Duration::from_millis(500))));
        let deadline = std::time::Instant::now() + max_wait;
        while discarded < max_bytes && std::time::Instant::now() < deadline {
            match self.transport.discard(&mut scratch, true) {
                Ok(0) => break,
                Ok(n) => discarded += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.closed = true;
    }

    /// For the request loop: the socket, to wait on it together with the listeners.
    pub(crate) fn socket(&self) -> &Socket {
        self.transport.socket()
    }

    /// Sends `range` of `file` after the buffered output.
    ///
    /// A range that fits in the output buffer is copied into it (one `pread`), so it goes
    /// out with the rest of the response in one write. A larger one costs one `send` of
    /// the buffered bytes (with `MSG_MORE`, so that the kernel packs them with the file's
    /// first bytes) and then `sendfile(2)` calls, which copy from the page cache to the
    /// socket without passing through user space. The last segment is pushed at once
    /// (`TCP_NODELAY`): no delayed-ACK stall at the end of a response. With
    /// `--min-send-rate` (the default), the socket is non-blocking during those calls and a
    /// full socket is waited on with `poll`, a second at a time, so that a client that
    /// takes the file too slowly is cut as it would be for any other write; the socket is
    /// blocking again when this returns.
    ///
    /// Returns an error of kind `UnexpectedEof` if the file is shorter than the range.
    pub fn send_file(&mut self, file: &File, range: Range<u64>) -> io::Result<()> {
        self.check_open()?;
        let len = range.end.saturating_sub(range.start);
        let len_usize = usize::try_from(len).unwrap_or(usize::MAX);
        let capacity = self.bufs.write.capacity().max(BUFFER_SIZE);
        if self.transport.is_tls() && self.bufs.write.len() + len_usize > capacity {
            return self.send_file_copy(file, range);
        }
        if self.bufs.write.len() + len_usize <= capacity {
            let at = self.bufs.write.len();
            self.bufs.write.resize(at + len_usize, 0);
            let read = file.read_exact_at(&mut self.bufs.write[at..], range.start);
            if read.is_err() {
                self.bufs.write.truncate(at);
            }
            return read;
        }
        let mut done = 0;
        while done < self.bufs.write.len() {
            let wanted = self.bufs.write.len() - done;
            let (n, r) = self.transport.write_more(&self.bufs.write[done..]);
            match self.after_write(r.map(|()| n), wanted) {
                Ok(Some(n)) => {
                    done += n;
                    self.sent += n as u64;
                }
                Ok(None) => {}
                Err(e) => {
                    self.bufs.write.drain(..done);
                    return Err(e);
                }
            }
        }
        self.bufs.write.clear();
        let mut offset =
            i64::try_from(range.start).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut left = len;
        if self.watch.active() {
            return self.send_file_watched(file, &mut offset, left);
        }
        while left > 0 {
            let chunk = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
            let r = self.transport.send_file(file, &mut offset, chunk);
            match self.after_write(r, chunk)? {
                Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Some(n) => {
                    left -= n as u64;
                    self.sent += n as u64;
                }
                None => {}
            }
        }
        Ok(())
    }

    /// `send_file`'s `sendfile(2)` calls under `--min-send-rate`: the socket is made
    /// non-blocking for them (and blocking again after, whatever the outcome), and when it
    /// is full the wait for room is a `poll` of at most one check interval, after which the
    /// watch hears of it, as it hears of every write that waits.
    ///
    /// Why not a blocking `sendfile`, as without the watch: it does not come back when the
    /// socket's send timeout expires. The kernel copies the file through a pipe and sends
    /// the pipe's pages in a loop of sends, each with a timeout of its own, and goes on as
    /// long as each send takes something. Every call that makes progress lasts at least two
    /// timeouts (the send that took a few bytes waits out its second, and so does the next,
    /// which finds no room), and a client that frees a few bytes every second keeps one
    /// call in the kernel for as long as it likes. The watch took the first for a handler
    /// that had stopped writing and began its window afresh each time (issue 31: a client
    /// with a 4 KiB window reading a static file at a quarter of the minimum was never cut);
    /// the second it would never have seen at all.
    fn send_file_watched(&mut self, file: &File, offset: &mut i64, left: u64) -> io::Result<()> {
        crate::sys::set_nonblocking(self.transport.socket().as_fd(), true)?;
        let sent = self.send_file_polling(file, offset, left);
        let restored = crate::sys::set_nonblocking(self.transport.socket().as_fd(), false);
        sent.and(restored)
    }

    /// The loop of [`send_file_watched`](Client::send_file_watched), on the non-blocking
    /// socket.
    fn send_file_polling(&mut self, file: &File, offset: &mut i64, mut left: u64) -> io::Result<()> {
        use nix::poll::{PollFd, PollFlags};
        let wait = crate::sys::poll_timeout(self.watch.check_interval());
        // Whether bytes went out since the watch last heard of a wait.
        let mut progressed = false;
        // Whether the last poll said there was room.
        let mut room = false;
        while left > 0 {
            let chunk = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
            let took = match self.transport.send_file(file, offset, chunk) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => return Err(e),
            };
            if took > 0 {
                left -= took as u64;
                self.sent += took as u64;
                progressed = true;
                self.watch.progress();
                if took == chunk {
                    continue;
                }
            }
            // The socket is full: wait for the client to make room. When the last poll
            // promised room and the send found none (TCP under memory pressure, where poll
            // and the send disagree), the wait is a plain pause, not a spin.
            let socket = self.transport.socket().as_fd();
            let mut fds = [PollFd::new(socket, PollFlags::POLLOUT)];
            let polled = if room && took == 0 {
                &mut fds[..0]
            } else {
                &mut fds[..]
            };
            room = match nix::poll::poll(polled, wait) {
                Ok(n) => n > 0,
                Err(nix::errno::Errno::EINTR) => false,
                Err(e) => return Err(e.into()),
            };
            let checked = self.watch.waited(self.transport.socket(), progressed);
            progressed = false;
            if self.watch.cut() {
                self.abort();
            }
            checked?;
        }
        Ok(())
    }

    /// `send_file` under TLS: the file is read into the output buffer in pieces, each
    /// encrypted and sent in turn (`sendfile(2)` would bypass the encryption).
    fn send_file_copy(&mut self, file: &File, range: Range<u64>) -> io::Result<()> {
        self.flush_buffer()?;
        let mut at = range.start;
        while at < range.end {
            let chunk = usize::try_from((range.end - at).min(BUFFER_SIZE as u64)).unwrap_or(BUFFER_SIZE);
            self.bufs.write.resize(chunk, 0);
            if let Err(e) = file.read_exact_at(&mut self.bufs.write, at) {
                self.bufs.write.clear();
                return Err(e);
            }
            at += chunk as u64;
            self.flush_buffer()?;
        }
        Ok(())
    }

    fn fill(&mut self) -> io::Result<()> {
        // Empty the buffer first: if the read fails (a timeout the handler may retry), the
        // bytes already consumed must not come back. Only the read buffer is lent.
        self.bufs.refill_space();
        let mut read = std::mem::take(&mut self.bufs.read);
        let r = self.recv(&mut read);
        self.bufs.read = read;
        self.bufs.filled(r?);
        Ok(())
    }

    fn flush_buffer(&mut self) -> io::Result<()> {
        if self.transport.is_tls() {
            return self.flush_tls();
        }
        if self.bufs.write.is_empty() {
            return Ok(());
        }
        let mut done = 0;
        let result = loop {
            if done == self.bufs.write.len() {
                break Ok(());
            }
            let wanted = self.bufs.write.len() - done;
            let (n, r) = self.transport.write(&[IoSlice::new(&self.bufs.write[done..])]);
            match self.after_write(r.map(|()| n), wanted) {
                Ok(Some(0)) => break Err(io::ErrorKind::WriteZero.into()),
                Ok(Some(n)) => {
                    done += n;
                    self.sent += n as u64;
                }
                Ok(None) => {}
                Err(e) => break Err(e),
            }
        };
        self.bufs.write.drain(..done);
        result
    }

    /// `flush_buffer` under TLS: the output is encrypted and its records written, until
    /// rustls has taken all of it and sent every record.
    fn flush_tls(&mut self) -> io::Result<()> {
        // Lent out of `bufs` for the loop, which also borrows `self`.
        let mut out = std::mem::take(&mut self.bufs.write);
        let mut taken = 0;
        let result = loop {
            if taken < out.len() {
                let (n, r) = self.transport.write(&[IoSlice::new(&out[taken..])]);
                taken += n;
                if n == 0 && r.is_ok() && !self.transport.records_pending() {
                    // Nothing taken, nothing to send: it would never end.
                    break Err(io::ErrorKind::WriteZero.into());
                }
                // Only the outcome of the records' write (no short-write check).
                if let Err(e) = self.after_write(r.map(|()| n), 0) {
                    break Err(e);
                }
            }
            if let Err(e) = self.flush_records(self.watch.active()) {
                break Err(e);
            }
            if taken == out.len() {
                break Ok(());
            }
        };
        // What rustls took is encrypted and queued (or sent): it leaves the buffer even
        // when the write fails, or a later flush would send it twice.
        self.sent += taken as u64;
        out.drain(..taken);
        self.bufs.write = out;
        if self.watch.cut() {
            // `after_write` aborted while the output was lent to this loop: what it put
            // back must go too.
            self.abort();
        }
        result
    }

    fn check_open(&self) -> io::Result<()> {
        if self.closed {
            Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the connection was closed",
            ))
        } else {
            Ok(())
        }
    }
}

/// A blocking socket with SO_RCVTIMEO/SO_SNDTIMEO reports an expired timeout as EAGAIN.
fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "timed out waiting for the peer")
    } else {
        e
    }
}

impl Read for Client {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.bufs.start == self.bufs.end && buf.len() >= self.bufs.read.len() {
            // A large read bypasses the buffer.
            return self.recv(buf);
        }
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Client {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.bufs.start == self.bufs.end {
            self.fill()?;
        }
        Ok(self.bufs.unconsumed())
    }

    fn consume(&mut self, amt: usize) {
        self.bufs.start = (self.bufs.start + amt).min(self.bufs.end);
    }
}

impl Write for Client {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.check_open()?;
        let capacity = self.bufs.write.capacity().max(BUFFER_SIZE);
        if self.bufs.write.len() + data.len() <= capacity {
            self.bufs.write.extend_from_slice(data);
            return Ok(data.len());
        }
        if self.transport.is_tls() {
            // Encrypted: the buffer goes out, then `data` in buffer-sized pieces.
            self.flush_buffer()?;
            let n = data.len().min(capacity);
            self.bufs.write.extend_from_slice(&data[..n]);
            return Ok(n);
        }
        // The buffer would overflow: send buffered bytes and as much of `data` as the
        // kernel takes in one writev, so a header and a large body cost one system call.
        while !self.bufs.write.is_empty() {
            let n = loop {
                let iov = [IoSlice::new(&self.bufs.write), IoSlice::new(data)];
                let (n, r) = self.transport.write(&iov);
                if let Some(n) = self.after_write(r.map(|()| n), self.bufs.write.len() + data.len())? {
                    break n;
                }
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.sent += n as u64;
            if n >= self.bufs.write.len() {
                let from_data = n - self.bufs.write.len();
                self.bufs.write.clear();
                if from_data > 0 {
                    return Ok(from_data);
                }
            } else {
                self.bufs.write.drain(..n);
            }
        }
        if data.len() < capacity {
            self.bufs.write.extend_from_slice(data);
            return Ok(data.len());
        }
        loop {
            let (n, r) = self.transport.write(&[IoSlice::new(data)]);
            if let Some(n) = self.after_write(r.map(|()| n), data.len())? {
                self.sent += n as u64;
                return Ok(n);
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.check_open()?;
        self.flush_buffer()
    }
}

impl AsFd for Client {
    /// The connection's socket, for options appsrv does not wrap. Reading or writing it
    /// directly bypasses the buffers: flush first.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.transport.socket().as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::send_watch::SEND_CHECK;

    /// With `--min-send-rate` on, the kernel's send timeout is at most a second (so that
    /// waits come back to be checked), and the handler's write timeout is kept by the
    /// watch: a write that makes no progress for that long still fails with `TimedOut`.
    #[test]
    fn the_write_timeout_holds_when_the_send_watch_shortens_the_kernels() {
        assert_eq!(
            SendWatch::socket_timeout(0, Some(Duration::from_secs(60))),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            SendWatch::socket_timeout(500, Some(Duration::from_secs(60))),
            Some(SEND_CHECK)
        );
        assert_eq!(SendWatch::socket_timeout(500, None), Some(SEND_CHECK));
        assert_eq!(
            SendWatch::socket_timeout(500, Some(Duration::from_millis(300))),
            Some(Duration::from_millis(300))
        );
        let (ours, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let socket = Socket::from(std::os::fd::OwnedFd::from(ours));
        socket
            .set_write_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut c = Client::new(socket, Addr::Unix(None), Buffers::new());
        c.watch_sends(SendWatch::new(500, Some(Duration::from_millis(200))));
        c.set_write_timeout(Some(Duration::from_millis(600))).unwrap();
        assert_eq!(c.write_timeout().unwrap(), Some(Duration::from_millis(600)));
        let started = std::time::Instant::now();
        let big = vec![0u8; 8 << 20];
        let err = loop {
            if let Err(e) = c.write_all(&big) {
                break e;
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(
            started.elapsed() >= Duration::from_millis(600),
            "{:?}",
            started.elapsed()
        );
        assert!(!c.watch.cut(), "the write timeout, not the rate, ended it");
    }

    /// Issue 35: `input_ready` says when a read would not wait: input buffered by an
    /// earlier short read, and a closed connection; not an empty buffer.
    #[test]
    fn issue_35_input_ready_without_waiting_on_the_socket() {
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let socket = Socket::from(std::os::fd::OwnedFd::from(ours));
        let mut c = Client::new(socket, Addr::Unix(None), Buffers::new());
        assert!(!c.input_ready(), "nothing received");
        theirs.write_all(b"hello\n").unwrap();
        let mut two = [0u8; 2];
        c.read_exact(&mut two).unwrap();
        assert!(c.input_ready(), "the rest is buffered");
        let mut rest = [0u8; 4];
        c.read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"llo\n");
        assert!(!c.input_ready(), "all read");
        c.close().unwrap();
        assert!(c.input_ready(), "closed: a read returns end of file at once");
    }

    /// Whether `socket` has `O_NONBLOCK`.
    fn nonblocking(socket: &Socket) -> bool {
        let flags = nix::fcntl::fcntl(socket, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        nix::fcntl::OFlag::from_bits_truncate(flags).contains(nix::fcntl::OFlag::O_NONBLOCK)
    }

    /// Issue 31: under `--min-send-rate`, `send_file` makes the socket non-blocking for its
    /// `sendfile(2)` calls and waits with `poll`. It sends every byte in order through a
    /// send buffer far smaller than the file (so it waits many times), and the socket is
    /// blocking again afterwards, after a success and after a failure (the request loop
    /// and the handler's later reads and writes rely on it).
    #[test]
    fn issue_31_a_watched_send_file_sends_everything_and_leaves_the_socket_blocking() {
        let path = std::env::temp_dir().join(format!("appsrv-send-file-{}", std::process::id()));
        let content: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let watched = |peer_reads: Option<usize>| {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
            let socket = Socket::from(std::os::fd::OwnedFd::from(ours));
            socket.set_send_buffer_size(4096).unwrap();
            socket.set_write_timeout(Some(SEND_CHECK)).unwrap();
            let reader = std::thread::spawn(move || {
                let mut theirs = theirs;
                let mut got = Vec::new();
                match peer_reads {
                    None => theirs.read_to_end(&mut got).map(|_| ()).unwrap(),
                    Some(n) => (&mut theirs)
                        .take(n as u64)
                        .read_to_end(&mut got)
                        .map(|_| ())
                        .unwrap(),
                }
                got
            });
            let mut c = Client::new(socket, Addr::Unix(None), Buffers::new());
            c.watch_sends(SendWatch::new(500, Some(Duration::from_secs(60))));
            c.write_all(b"head:").unwrap();
            let sent = c.send_file(&file, 0..content.len() as u64);
            assert!(!nonblocking(c.transport.socket()), "left non-blocking");
            drop(c);
            (sent, reader.join().unwrap())
        };
        let (sent, got) = watched(None);
        sent.unwrap();
        assert_eq!(&got[..5], b"head:");
        assert!(
            got[5..] == content[..],
            "{} bytes of {}",
            got.len() - 5,
            content.len()
        );
        // A peer that goes away after 100 kB: the send fails, the socket is blocking again.
        let (sent, got) = watched(Some(100_000));
        assert!(sent.is_err(), "sent to a peer that left");
        assert_eq!(got.len(), 100_000);
    }

    /// A server `Client` over a socket pair after a TLS handshake with a rustls client in
    /// a thread; the thread waits for `go`, then reads to the end and returns the bytes.
    fn tls_pair() -> (
        Client,
        std::sync::mpsc::Sender<()>,
        std::thread::JoinHandle<Vec<u8>>,
    ) {
        let (server, client) = crate::net::tls::testing::configs();
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let socket = Socket::from(std::os::fd::OwnedFd::from(ours));
        socket.set_send_buffer_size(4096).unwrap();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let conn = rustls::ClientConnection::new(client, name).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, theirs);
            while tls.conn.is_handshaking() {
                tls.conn.complete_io(&mut tls.sock).unwrap();
            }
            wait.recv().unwrap();
            let mut all = Vec::new();
            tls.read_to_end(&mut all).unwrap();
            all
        });
        let mut session = TlsSession::new(server).unwrap();
        while session.conn.is_handshaking() {
            session.conn.complete_io(&mut &socket).unwrap();
        }
        session.established();
        let mut c = Client::new(socket, Addr::Unix(None), Buffers::new());
        c.set_tls(Box::new(session));
        (c, go, reader)
    }

    /// Regression (review of issue #9): after a write timed out, the next flush encrypted
    /// again the bytes rustls had already taken, and the peer read them twice.
    #[test]
    fn tls_output_is_never_sent_twice_after_a_write_timeout() {
        let (mut c, go, reader) = tls_pair();
        c.set_write_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut accepted = 0u64;
        let timed_out = loop {
            match writeln!(c, "{:08}", accepted + 1) {
                Ok(()) => accepted += 1,
                Err(e) => break e,
            }
            assert!(accepted < 10_000_000, "the peer never stopped us");
        };
        assert_eq!(timed_out.kind(), io::ErrorKind::TimedOut);
        go.send(()).unwrap();
        c.set_write_timeout(None).unwrap();
        c.flush().unwrap(); // what `finish` does after the handler's error
        c.close().unwrap();
        let received = reader.join().unwrap();
        let text = String::from_utf8(received).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        // Every line the client accepted arrives once, in order; the one whose write
        // failed may be there in part (`writeln!` writes the padding and the digits
        // separately), and nothing comes back around.
        assert!(lines.len() as u64 >= accepted, "{} of {accepted}", lines.len());
        assert!(lines.len() as u64 <= accepted + 1);
        for (i, line) in lines.iter().enumerate() {
            let expected = format!("{:08}", i + 1);
            if i as u64 == accepted {
                assert!(expected.starts_with(line), "the failed line: {line:?}");
            } else {
                assert_eq!(*line, expected, "line {}", i + 1);
            }
        }
    }
}

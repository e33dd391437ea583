//! Not part of appsrv's API: this module exists only for the Criterion benchmarks in
//! `crates/appsrv-benches/benches/` and the fuzz targets in `fuzz/`, which are compiled as separate
//! crates and cannot reach the crate-private scoreboard, connection steps and privileged
//! helper channel. It is hidden from the documentation and may change or disappear at any
//! time, in any release; do not use it.
//!
//! Each item is a thin wrapper: every method calls the crate's own function of the same
//! name and adds no behaviour.

use std::io;
use std::net::IpAddr;

use crate::codec::Codec;
use crate::net::listener::Addr;
use crate::scoreboard;

/// The largest pool: worker ids (slots) run from 1 to this.
pub const MAX_WORKERS: usize = scoreboard::MAX_WORKERS;

/// How many of a request's first bytes a slot keeps.
pub const HEAD_BYTES: usize = scoreboard::HEAD_BYTES;

/// Monotonic time in nanoseconds, as the scoreboard reads it (`scoreboard::now_ns`).
pub fn now_ns() -> u64 {
    scoreboard::now_ns()
}

/// A worker's state, as the crate's scoreboard stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Forked, not yet ready.
    Starting,
    /// Waiting in `accept`.
    Idle,
    /// Connected, waiting for a request.
    Reading,
    /// Running the handler.
    Handling,
    /// Writing a response.
    Writing,
    /// Closing a connection.
    Closing,
    /// Finishing its last connection.
    Finishing,
}

impl From<State> for scoreboard::State {
    fn from(s: State) -> Self {
        match s {
            State::Starting => scoreboard::State::Starting,
            State::Idle => scoreboard::State::Idle,
            State::Reading => scoreboard::State::Reading,
            State::Handling => scoreboard::State::Handling,
            State::Writing => scoreboard::State::Writing,
            State::Closing => scoreboard::State::Closing,
            State::Finishing => scoreboard::State::Finishing,
        }
    }
}

/// The scoreboard (shared memory, as the master maps it before forking).
#[derive(Debug, Clone, Copy)]
pub struct Board(&'static scoreboard::Board);

impl Board {
    /// Maps a new board (`Board::new`); the mapping lives as long as the process.
    pub fn new() -> io::Result<Board> {
        scoreboard::Board::new().map(Board)
    }

    /// Slot `id` (1 to [`MAX_WORKERS`]).
    pub fn slot(&self, id: u32) -> Option<Slot> {
        self.0.slot(id).map(Slot)
    }

    /// The master prepares slot `id` for a worker (`Board::claim`).
    pub fn claim(&self, id: u32, generation: u32) {
        self.0.claim(id, generation);
    }

    /// The master records a worker's pid (`Board::set_pid`).
    pub fn set_pid(&self, id: u32, pid: u32) {
        self.0.set_pid(id, pid);
    }

    /// The master frees slot `id` (`Board::release`).
    pub fn release(&self, id: u32) {
        self.0.release(id);
    }

    /// Sets worker `id`'s state (`Board::set_state`).
    pub fn set_state(&self, id: u32, state: State) {
        self.0.set_state(id, state.into());
    }

    /// Busy workers whose client is `ip` (`Board::connections_from`).
    pub fn connections_from(&self, ip: IpAddr) -> usize {
        self.0.connections_from(ip)
    }

    /// Idle workers (`Board::idle`).
    pub fn idle(&self) -> u32 {
        self.0.idle()
    }

    /// Reads slot `id` (`Board::read`).
    pub fn read(&self, id: u32) -> Option<SlotView> {
        self.0.read(id).map(SlotView)
    }
}

/// One worker's slot.
#[derive(Debug, Clone, Copy)]
pub struct Slot(&'static scoreboard::Slot);

impl Slot {
    /// A connection was accepted from `peer` (`Slot::connection`).
    pub fn connection(&self, peer: &Addr) {
        self.0.connection(peer);
    }

    /// A connection whose client is not known yet (`Slot::forget_peer`).
    pub fn forget_peer(&self) {
        self.0.forget_peer();
    }

    /// A request starts (`Slot::request_start`); returns its start time.
    pub fn request_start(&self, head: &[u8]) -> u64 {
        self.0.request_start(head)
    }

    /// The request started at `started` is done (`Slot::request_end`).
    pub fn request_end(&self, started: u64, count: bool) {
        self.0.request_end(started, count);
    }

    /// Bytes read and written (`Slot::add_bytes`).
    pub fn add_bytes(&self, read: u64, written: u64) {
        self.0.add_bytes(read, written);
    }

    /// Connections and requests served (`Slot::served`).
    pub fn served(&self) -> (u64, u64) {
        self.0.served()
    }
}

/// A copy of one slot, as the master reads it.
#[derive(Debug, Clone)]
pub struct SlotView(scoreboard::SlotView);

impl SlotView {
    /// The state's letter in the status line (`State::letter`).
    pub fn letter(&self) -> char {
        self.0.state.letter()
    }

    /// Requests served by the slot's worker.
    pub fn requests(&self) -> u64 {
        self.0.requests
    }
}

// The request step, for the fuzz targets: the crate's own `conn::step::Requests` over
// byte inputs, with a context that is never saturated, stopping or retiring.

/// What the request step asks for next (`conn::step::Next`, without its details).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepNext {
    /// More bytes (or the output sent first).
    Read,
    /// A file range after the output; [`RequestStep::feed`] with no bytes goes on.
    SendFile,
    /// A pass's limit of requests was answered; [`RequestStep::feed`] with no bytes goes on.
    More,
    /// The connection ends after the output.
    Close,
    /// The handler failed; the connection ends.
    Fail,
}

/// A context for the fuzz targets: a pool with idle workers, no stop.
#[derive(Debug)]
struct Quiet;

impl crate::conn::step::Context for Quiet {
    fn stopping(&mut self) -> bool {
        false
    }
}

/// A request handler as a closure: what the fuzz targets give [`RequestStep::feed`].
pub type HandleFn<'f, C> =
    dyn for<'r, 's> FnMut(&<C as Codec>::Request<'r>, &mut <C as Codec>::Response<'s>) -> io::Result<()> + 'f;

/// A closure as the step's handler.
struct Closure<'f, C: Codec + 'static>(&'f mut HandleFn<'f, C>);

impl<C: Codec + 'static> crate::conn::step::Handle<C> for Closure<'_, C> {
    fn handle(&mut self, req: &C::Request<'_>, res: &mut C::Response<'_>) -> io::Result<()> {
        (self.0)(req, res)
    }
}

/// One connection's request level (`conn::step::Requests`) over in-memory bytes.
pub struct RequestStep<C: Codec + 'static> {
    step: crate::conn::step::Requests<C>,
    bufs: crate::conn::buffers::Buffers,
    peer: Addr,
}

impl<C: Codec + 'static> std::fmt::Debug for RequestStep<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestStep").finish_non_exhaustive()
    }
}

impl<C: Codec + 'static> RequestStep<C> {
    /// A new connection with `codec`, at most `keepalive_requests` requests (0: no limit)
    /// and no timeouts.
    pub fn new(codec: C, keepalive_requests: u32) -> Self {
        let limits = crate::conn::step::Limits {
            keepalive_timeout: None,
            read_timeout: None,
            keepalive_requests: if keepalive_requests == 0 {
                u32::MAX
            } else {
                keepalive_requests
            },
            header_timeout: None,
            header_timeout_max: None,
            min_rate: 0,
            request_detail: false,
        };
        RequestStep {
            step: crate::conn::step::Requests::new(codec, limits),
            bufs: crate::conn::buffers::Buffers::new(),
            peer: Addr::Unix(None),
        }
    }

    /// As much of `bytes` as the read buffer takes (a read never brings more than the
    /// codec's limit) arrives; the step answers what it can with `handle`. Returns how
    /// many bytes were taken and what comes next.
    pub fn feed(&mut self, bytes: &[u8], handle: &mut HandleFn<'_, C>) -> (usize, StepNext) {
        let room = self.bufs.room(self.step.max_request_size());
        let n = room.len().min(bytes.len());
        room[..n].copy_from_slice(&bytes[..n]);
        self.bufs.filled(n);
        let mut now = std::time::Instant::now;
        self.step.received(&mut now);
        let next = self.step.advance(
            &mut self.bufs,
            &mut Closure::<C>(handle),
            &mut Quiet,
            &self.peer,
            &mut now,
        );
        let next = match next {
            crate::conn::step::Next::Read { .. } => StepNext::Read,
            crate::conn::step::Next::SendFile(_) => StepNext::SendFile,
            crate::conn::step::Next::More => StepNext::More,
            crate::conn::step::Next::Close { .. } => StepNext::Close,
            crate::conn::step::Next::Fail(_) => StepNext::Fail,
        };
        (n, next)
    }

    /// The output so far (responses, then an error reply if one ended the connection).
    pub fn output(&mut self) -> &[u8] {
        self.bufs.output()
    }

    /// The protocol error that ended the connection, and where its reply begins in
    /// [`output`](RequestStep::output).
    pub fn rejected(&self) -> Option<(crate::codec::ProtocolError, usize)> {
        self.step.rejected().cloned()
    }
}

// ---------------------------------------------------------------------------------------
// Admission (issue 15), for the fuzz target `admission`: the crate's own admission machine
// (`worker::admission`) on a listener that expects a PROXY header, without TLS. Nothing
// here adds behaviour: each method calls the machine's method of the same name.

/// A listener with `--proxy-protocol` and the sources it trusts (`--proxy-from`).
#[derive(Debug, Clone)]
pub struct ProxyListener {
    policy: crate::net::listener::Policy,
    header_timeout: Option<std::time::Duration>,
}

impl ProxyListener {
    /// Trusts the networks `trusted` (as `--proxy-from` takes them: `127.0.0.1`,
    /// `10.0.0.0/8`); the header must be complete within `header_timeout` of the accept.
    pub fn new(trusted: &[&str], header_timeout: Option<std::time::Duration>) -> Result<Self, String> {
        let proxy_from = trusted
            .iter()
            .map(|c| c.parse().map_err(|e| format!("{c}: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(ProxyListener {
            policy: crate::net::listener::Policy {
                proxy: true,
                proxy_from,
                ..Default::default()
            },
            header_timeout,
        })
    }
}

/// What the admission machine needs next (`admission::Next`, without TLS writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionNext {
    /// More bytes, by this deadline (none: no deadline).
    Read(Option<std::time::Instant>),
    /// Close the connection: [`Admission::rejection`] says why.
    Close,
    /// Serve the connection: [`Admission::peer`] is the client.
    Serve,
}

/// A scoreboard where no one else is served (the fuzz target has no cap).
#[derive(Debug, Clone, Copy)]
struct NoBoard;

impl crate::worker::admission::Seat for NoBoard {
    fn permitted(&mut self, _peer: &Addr) {}
    fn connections_from(&self, _ip: IpAddr) -> usize {
        1
    }
}

/// One connection's admission on a [`ProxyListener`] (`admission::Admission`).
#[derive(Debug)]
pub struct Admission<'a>(crate::worker::admission::Admission<'a, NoBoard>);

impl<'a> Admission<'a> {
    /// A connection from `peer` accepted at `now` (`Admission::start`).
    pub fn new(listener: &'a ProxyListener, peer: std::net::SocketAddr, now: std::time::Instant) -> Self {
        let rules = crate::worker::admission::Rules {
            policy: &listener.policy,
            tls: None,
            header_timeout: listener.header_timeout,
            handshake_timeout: None,
            max_per_ip: None,
            penalties: None,
        };
        Admission(crate::worker::admission::Admission::start(
            rules,
            Addr::Inet(peer),
            NoBoard,
            &mut || now,
        ))
    }

    /// What it needs next (`Admission::next`).
    pub fn next(&self) -> AdmissionNext {
        use crate::worker::admission::Next;
        match self.0.next() {
            Next::Read { by } => AdmissionNext::Read(by),
            Next::Serve => AdmissionNext::Serve,
            Next::Close => AdmissionNext::Close,
            Next::Write { .. } => unreachable!("without TLS, admission has nothing to write"),
        }
    }

    /// Bytes arrived at `now`, all those not consumed yet; returns how many it consumed
    /// (`Admission::received`).
    pub fn received(&mut self, bytes: &[u8], now: std::time::Instant) -> usize {
        self.0.received(bytes, now)
    }

    /// The client closed its end (`Admission::closed`).
    pub fn closed(&mut self) {
        self.0.closed();
    }

    /// The clock says `now` (`Admission::deadline_passed`).
    pub fn deadline_passed(&mut self, now: std::time::Instant) {
        self.0.deadline_passed(now);
    }

    /// The client as known so far (`Admission::peer`).
    pub fn peer(&self) -> &Addr {
        self.0.peer()
    }

    /// Why the connection is refused, once it is (`Admission::rejection`).
    pub fn rejection(&self) -> Option<String> {
        self.0.rejection().map(ToString::to_string)
    }
}

// ---------------------------------------------------------------------------------------
// The privileged helper's channel (issue 18), for the fuzz target `privileged_message` and
// the benchmark `privileged`: each function calls the crate's own of the same role.

/// The privileged helper's reading of one received datagram with the descriptors that
/// came with it (`privileged::helper::read_request`: `wire::parse`, then what the helper's
/// loop does with a message: only a request, decoded as one `R`). `Ok((seq, request))`,
/// or the refusal the helper would send back: `Err((seq, reason))`.
pub fn privileged_request<R: serde::de::DeserializeOwned>(
    datagram: &[u8],
    fds: Vec<std::os::fd::OwnedFd>,
) -> Result<(u32, R), (u32, String)> {
    crate::privileged::read_request(datagram, fds)
}

/// A new helper channel, `(the worker's end, the helper's end)` (`privileged::wire::pair`).
pub fn privileged_pair() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    crate::privileged::wire::pair()
}

/// Runs the helper's loop (`privileged::helper::serve`) with `helper` on the helper's end
/// `channel` until the worker's end closes, in the calling thread (no fork, no
/// confinement), for worker number `worker`, this process being the worker.
pub fn privileged_serve<P: crate::privileged::Privileged>(
    helper: &mut P,
    channel: std::os::fd::BorrowedFd<'_>,
    worker: u32,
) {
    let caller = crate::privileged::Caller {
        worker,
        pid: std::process::id(),
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
    };
    crate::privileged::serve(helper, channel, &caller);
}

/// Installs `end` as this process's end of its helper's channel, with a default call
/// timeout (`privileged::set_worker_end`), which `Helper::call` then uses. For benchmarks
/// and tests only: in a server, the worker installs its own once its helper is ready, and
/// this would replace it.
pub fn privileged_set_worker_end(end: std::os::fd::OwnedFd, timeout: std::time::Duration) {
    crate::privileged::set_worker_end(end, timeout);
}

// ---------------------------------------------------------------------------------------
// The datagram side of the event loop (issue 19), for the fuzz target `datagram_dispatch`
// and the benchmark `datagram`: a real UDP socket on loopback served by the crate's own
// `worker::datagram::Side` (batch receive, checks, handler, batch send).

/// Datagram counters (`scoreboard::DatagramCounts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatagramCounts {
    /// Received.
    pub received: u64,
    /// Answers sent.
    pub sent: u64,
    /// Dropped by allow/deny.
    pub denied: u64,
    /// Dropped: over the size limit.
    pub too_large: u64,
    /// Over the answer rate.
    pub rate_limited: u64,
    /// The handler failed.
    pub errors: u64,
    /// Answers the kernel refused.
    pub send_failed: u64,
}

/// A datagram listener on `127.0.0.1:0` served by the crate's datagram side, and a client
/// socket to talk to it.
pub struct DatagramLoop {
    listener: crate::net::listener::Listener,
    side: crate::worker::datagram::Side<'static>,
    client: std::net::UdpSocket,
    ledger: crate::worker::ledger::Ledger<'static>,
}

impl std::fmt::Debug for DatagramLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatagramLoop").finish_non_exhaustive()
    }
}

impl DatagramLoop {
    /// A listener served by `handler` with these limits (`--max-datagram-size`,
    /// `--max-answers-per-ip`, `--answers-slip`; the answer rate counted per IPv4 /24 and
    /// IPv6 /56, the defaults), reading `batch` datagrams per system call.
    pub fn new(
        handler: Box<dyn crate::handler::DatagramHandler>,
        max_size: usize,
        max_answers_per_ip: u32,
        slip: u32,
        batch: usize,
    ) -> io::Result<DatagramLoop> {
        let addr: crate::net::listener::ListenAddr = "udp://127.0.0.1:0".parse().map_err(io::Error::other)?;
        let opts = crate::net::listener::BindOptions {
            backlog: 1,
            read_timeout: None,
            write_timeout: None,
        };
        let listener = crate::net::listener::bind(&addr, &opts)
            .map_err(io::Error::other)?
            .remove(0);
        // One board for the process: a board is mapped for the life of the process (it is
        // the master's), and a fuzz target makes a loop per input. Its answer-rate table is
        // thus shared by the loops of one process, as by the workers of one server.
        static BOARD: std::sync::OnceLock<&'static scoreboard::Board> = std::sync::OnceLock::new();
        let board = match BOARD.get() {
            Some(b) => *b,
            None => *BOARD.get_or_init(|| scoreboard::Board::new().expect("mapping a scoreboard")),
        };
        let slot = board.slot(1).ok_or_else(|| io::Error::other("no slot 1"))?;
        let settings = crate::worker::datagram::Settings {
            max_size,
            max_answers_per_ip,
            answer_prefixes: scoreboard::AnswerPrefixes::DEFAULT,
            slip,
            access_sample: 1,
            request_detail: false,
        };
        let side = crate::worker::datagram::Side::new(handler, settings, 1, slot, board).with_batch(batch);
        let client = std::net::UdpSocket::bind("127.0.0.1:0")?;
        client.set_nonblocking(true)?;
        Ok(DatagramLoop {
            listener,
            side,
            client,
            // No access log, no recycling limit: the side's own work is what is measured.
            ledger: crate::worker::ledger::Ledger::new(
                slot,
                None,
                crate::worker::Recycle::default(),
                Box::new(|| {}),
                Box::new(|| None),
            ),
        })
    }

    /// The listener's address.
    pub fn addr(&self) -> std::net::SocketAddr {
        match self.listener.local_addr() {
            Addr::Inet(a) => *a,
            Addr::Unix(_) => unreachable!("bound on 127.0.0.1"),
        }
    }

    /// The client sends one datagram to the listener.
    pub fn send(&self, data: &[u8]) -> io::Result<()> {
        self.client.send_to(data, self.addr()).map(|_| ())
    }

    /// The worker's turn on the readable listener (`Side::readable`): returns the datagrams
    /// passed to the handler.
    pub fn serve(&mut self) -> u64 {
        self.side.readable(&self.listener, &mut self.ledger)
    }

    /// One answer the client received, if any is waiting.
    pub fn answer(&self, buf: &mut [u8]) -> Option<usize> {
        self.client.recv(buf).ok()
    }

    /// The side's counters.
    pub fn counts(&self) -> DatagramCounts {
        let c = self.side.counts();
        DatagramCounts {
            received: c.received,
            sent: c.sent,
            denied: c.denied,
            too_large: c.too_large,
            rate_limited: c.rate_limited,
            errors: c.errors,
            send_failed: c.send_failed,
        }
    }
}

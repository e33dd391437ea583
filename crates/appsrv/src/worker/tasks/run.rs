//! The run of the async worker: the accept loop over the listeners and the signals'
//! eventfd, and one connection's future from accept to close (admission awaited, then
//! its level's part, [`Level`]).

use std::future::Future;
use std::io;
use std::os::fd::BorrowedFd;
use std::rc::Rc;
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};
use socket2::Socket;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::conn::buffers::{BUFFER_SIZE, Buffers};
use crate::conn::transport::Transport;
use crate::net::listener::Addr;
use crate::sys::{self, EpollFd, exit};

use super::accept::Accept;
use super::turn::Watched;
use super::worker::{Label, Worker};
use crate::conn::async_transport::{read_raw, send_raw};
use crate::worker::accept::AcceptError;
use crate::worker::admission::{self, Admission, EventSeat};
use crate::worker::driver::rules;
use crate::worker::ledger::{RESOURCE_BACKOFF, Trouble};
use crate::worker::life::{Counted, Life, Then, Unit};

/// Accepts in a row after which the run lets the connections it took run.
pub(super) const ACCEPT_BURST: u32 = 32;

/// The level's part of a connection: what the request level and the client level do
/// with an admitted connection, and with one refused over the per-address cap.
pub(super) trait Level {
    /// How its codec refuses a request at the budget of buffered bytes, for the log
    /// ([`budget::refusal_words`](crate::worker::budget::refusal_words)).
    fn refusal(&self) -> String;

    /// What its connections' access-log lines are about.
    fn unit(&self) -> Unit;

    /// Serves the admitted connection `io` of `peer` (number `id`), `bufs` holding what
    /// admission read past its needs, `life` its life in the accounts.
    #[allow(clippy::too_many_arguments)]
    async fn serve(
        &self,
        w: &Worker<'_>,
        io: AsyncFd<Transport>,
        peer: &Addr,
        id: u64,
        bufs: Buffers,
        label: &Label,
        life: Life,
    );

    /// Refuses the connection with the codec's reply for `why` (the request level), or
    /// closes it (the client level has no codec).
    async fn refuse(&self, w: &Worker<'_>, io: AsyncFd<Transport>, why: &'static str);

    /// The handler's `on_worker_exit`.
    fn on_worker_exit(&self);
}

/// What the accept wait found.
pub(super) enum Event {
    Signal,
    Accepted(io::Result<(Socket, Addr, usize)>),
    Closed,
    Resume,
    /// No call was cut for [`CUTS_QUIET`](super::worker::CUTS_QUIET): the episode of cuts is over.
    CutsQuiet,
}

impl<'a> Worker<'a> {
    /// Accepts and serves until a stop and the last connection's end; returns the exit
    /// status.
    pub(super) async fn run<L: Level>(&self, level: &L, wake: BorrowedFd<'_>, accepting: EpollFd) -> i32 {
        // `wake` borrows the driver's eventfd, open for the whole run.
        let wake = match sys::watch_async(wake, Interest::READABLE) {
            Ok(fd) => fd,
            Err(e) => {
                tracing::error!("watching the signals' eventfd: {e}; stopping");
                return exit::OK;
            }
        };
        let listeners = match Accept::new(accepting, self.listeners) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("watching the listeners: {e}; stopping");
                return exit::OK;
            }
        };
        let mut conns = FuturesUnordered::new();
        let mut trouble = Trouble::default();
        let mut resume_at: Option<tokio::time::Instant> = None;
        let mut burst: u32 = 0;
        // A stop that came before the wake-up descriptor was set.
        if sys::stop_requested() {
            self.begin_stop();
        }
        loop {
            if self.stopping.get() && conns.is_empty() {
                tracing::debug!("no connection left");
                self.cuts.borrow_mut().end(self.request_timeout);
                return exit::OK;
            }
            let quiet_at = self.cuts.borrow().quiet_at().map(tokio::time::Instant::from);
            let accepting =
                !self.stopping.get() && resume_at.is_none() && self.open.get() < self.max_connections;
            self.slot.set_accepts_paused(!accepting);
            let event = tokio::select! {
                biased;
                r = wake.readable() => {
                    if let Ok(mut guard) = r {
                        // The counter read (it is non-blocking), then the readiness
                        // cleared: the next signal's write is a new edge.
                        let mut counter = [0u8; 8];
                        let _ = nix::unistd::read(guard.get_inner(), &mut counter);
                        guard.clear_ready();
                    }
                    Event::Signal
                }
                Some(()) = conns.next(), if !conns.is_empty() => Event::Closed,
                r = listeners.accept(), if accepting => Event::Accepted(r),
                () = sleep_until(resume_at), if resume_at.is_some() => Event::Resume,
                () = sleep_until(quiet_at), if quiet_at.is_some() => Event::CutsQuiet,
            };
            match event {
                Event::Signal => self.signalled(),
                Event::Closed => self.open.set(self.open.get() - 1),
                Event::Accepted(Ok((socket, peer, index))) => {
                    trouble.cleared();
                    burst += 1;
                    if burst % ACCEPT_BURST == 0 {
                        // A flood of connections: the ones accepted get their turn (the
                        // run is out of tokio's budget, which would otherwise yield).
                        tokio::task::yield_now().await;
                    }
                    self.open.set(self.open.get() + 1);
                    let label = Rc::new(Label::new(peer.clone()));
                    conns.push(Watched::new(
                        self,
                        label.clone(),
                        self.connection(level, socket, peer, index, label),
                    ));
                }
                Event::Accepted(Err(e)) => {
                    if let Some(at) = self.accept_failed(&e, &mut trouble) {
                        resume_at = Some(at);
                    }
                }
                Event::Resume => resume_at = None,
                Event::CutsQuiet => {
                    // A call cut since the sleep began moved the end.
                    let mut cuts = self.cuts.borrow_mut();
                    if cuts.quiet_at().is_some_and(|at| at <= Instant::now()) {
                        cuts.end(self.request_timeout);
                    }
                }
            }
        }
    }

    /// A signal came (the eventfd was written): the access log reopened, or the stop
    /// begun, as asked.
    fn signalled(&self) {
        if sys::take_reopen_request() {
            self.ledger.borrow_mut().reopen();
        }
        if sys::stop_requested() && !self.stopping.get() {
            self.begin_stop();
        }
    }

    /// An accept failed with `e`: the accept error classification. Returns when to accept
    /// again if accepting pauses (out of a resource: descriptors, memory), the episode
    /// kept in `trouble`.
    fn accept_failed(&self, e: &io::Error, trouble: &mut Trouble) -> Option<tokio::time::Instant> {
        match AcceptError::of(e) {
            AcceptError::Retry | AcceptError::Next => {}
            AcceptError::Stop => {
                // The master shut the listeners down: a stop.
                if !self.stopping.get() {
                    self.begin_stop();
                }
            }
            AcceptError::BackOff(errno) => {
                trouble.began(errno, "accepting connections");
                return Some(tokio::time::Instant::now() + RESOURCE_BACKOFF);
            }
        }
        None
    }

    /// One connection, from accept to close.
    pub(super) async fn connection<L: Level>(
        &self,
        level: &L,
        socket: Socket,
        peer: Addr,
        listener: usize,
        label: Rc<Label>,
    ) {
        let id = self.accepted.get() + 1;
        self.accepted.set(id);
        self.slot.accepted();
        let transport = Transport::new(socket);
        let io = match sys::watch_async(transport, Interest::READABLE | Interest::WRITABLE) {
            Ok(io) => io,
            Err(e) => {
                tracing::warn!("cannot watch the connection from {peer}: {e}; closing it");
                return;
            }
        };
        let mut io = io;
        // Its per-address count, if admission took one, is given back when `life` drops,
        // on every path out of here.
        let mut life = Life::new(level.unit());
        let (peer, then, bufs) = self.admit(&mut io, peer, listener, &mut life).await;
        match then {
            Then::Serve => {}
            Then::Refuse(why) => return level.refuse(self, io, why).await,
            Then::Close => return,
        }
        *label.peer.borrow_mut() = peer.clone();
        level.serve(self, io, &peer, id, bufs, &label, life).await;
    }

    /// Admission (`admission.rs`), its reads and writes awaited, each by its phase's
    /// deadline.
    pub(super) async fn admit(
        &self,
        io: &mut AsyncFd<Transport>,
        peer: Addr,
        listener: usize,
        life: &mut Life,
    ) -> (Addr, Then, Buffers) {
        let rules = rules(self.listeners, self.tls, &self.limits, self.max_per_ip, listener);
        if rules.open_to(&peer) {
            life.serve(&mut self.ledger.borrow_mut(), &peer);
            return (peer, Then::Serve, Buffers::none());
        }
        let seat = EventSeat {
            id: self.id,
            peers: self.peers,
            counted: None,
            workers: None,
        };
        let mut machine = Admission::start(rules, peer, seat, &mut Instant::now);
        let mut bufs = Buffers::none();
        loop {
            match machine.next() {
                admission::Next::Read { by } => {
                    let room = bufs.room(BUFFER_SIZE);
                    match within(by, read_raw(io, room)).await {
                        None => machine.deadline_passed(Instant::now()),
                        Some(Ok(0)) => machine.closed(),
                        Some(Ok(n)) => {
                            bufs.filled(n);
                            let used = machine.received(bufs.unconsumed(), Instant::now());
                            bufs.consume(used);
                        }
                        Some(Err(e)) => machine.failed(&e),
                    }
                }
                admission::Next::Write { by } => match within(by, send_raw(io, machine.pending())).await {
                    None => machine.deadline_passed(Instant::now()),
                    Some(Ok(0)) => machine.failed(&io::ErrorKind::WriteZero.into()),
                    Some(Ok(n)) => machine.sent(n, Instant::now()),
                    Some(Err(e)) => machine.failed(&e),
                },
                admission::Next::Serve | admission::Next::Close => break,
            }
        }
        let counted = (machine.seat().counted)
            .zip(self.peers)
            .map(|(ip, peers)| Counted::new(peers, self.id, ip));
        let verdict = machine.finish();
        let (peer, then) = life.admitted(verdict, counted, io.get_mut(), &mut self.ledger.borrow_mut());
        (peer, then, bufs)
    }
}
/// Waits until `at` (never when `None`).
pub(super) async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `f` by the deadline `by` (`None`: no deadline of its own); `None` when it passed.
pub(super) async fn within<T>(by: Option<Instant>, f: impl Future<Output = T>) -> Option<T> {
    match by {
        Some(by) => tokio::time::timeout_at(by.into(), f).await.ok(),
        None => Some(f.await),
    }
}

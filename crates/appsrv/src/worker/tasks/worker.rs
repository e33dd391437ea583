//! The async worker's state, shared by its connections' futures (one thread: cells): the
//! counts the slot shows, the budget of buffered bytes, `--max-inflight`, the cut and
//! slow-poll episodes.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore, SemaphorePermit};

use crate::net::listener::{Addr, Listener};
use crate::net::tls::ForWorker;
use crate::peer_counts::PeerCounts;
use crate::scoreboard::{Board, ConnCounts, Slot, State};
use crate::sys;

use crate::conn::buffers::BUFFER_SIZE;
use crate::worker::ConnLimits;
use crate::worker::budget::Budget;
use crate::worker::driver::Shared;
use crate::worker::ledger::{Ledger, OncePerMinute};
use crate::worker::serve::Limits;

/// The async driver's own settings, from the command line.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Settings {
    /// `--worker-connections`.
    pub(super) max_connections: usize,
    /// `--max-inflight` (0: no limit).
    pub(super) max_inflight: usize,
    /// `--request-timeout`: a handler call is cancelled past it.
    pub(super) request_timeout: Option<Duration>,
    /// `--read-timeout` and `--write-timeout`, for the client level's reads and writes.
    pub(super) io_timeouts: (Option<Duration>, Option<Duration>),
    /// `--slow-request`.
    pub(super) slow_request: Option<Duration>,
    /// The event workers' connections by client address (`--max-conns-per-ip`).
    pub(super) peers: Option<&'static PeerCounts>,
}

/// The worker's state, shared by its connections' futures (one thread: cells).
pub(super) struct Worker<'a> {
    pub(super) id: u32,
    pub(super) board: &'static Board,
    pub(super) slot: &'static Slot,
    pub(super) listeners: &'a [Listener],
    pub(super) tls: &'a ForWorker,
    pub(super) limits: ConnLimits,
    pub(super) max_per_ip: Option<usize>,
    pub(super) peers: Option<&'static PeerCounts>,
    pub(super) step_limits: Limits,
    pub(super) ledger: RefCell<Ledger<'a>>,
    pub(super) max_connections: usize,
    /// `--max-inflight`'s permits (`None`: no limit).
    pub(super) permits: Option<Semaphore>,
    pub(super) request_timeout: Option<Duration>,
    pub(super) io_timeouts: (Option<Duration>, Option<Duration>),
    pub(super) slow: RefCell<Slow>,
    /// Calls cut by `--request-timeout`, for their log lines.
    pub(super) cuts: RefCell<Cuts>,
    pub(super) stopping: Cell<bool>,
    /// Wakes the connections that wait between requests when the worker stops.
    pub(super) stop: Notify,
    /// Connections open, of which idle keep-alive ones, requests in flight and connections
    /// writing their output ([`Writing`]).
    pub(super) open: Cell<usize>,
    pub(super) idle: Cell<u32>,
    pub(super) in_flight: Cell<u32>,
    pub(super) writing: Cell<u32>,
    /// Bytes read from and written to clients since the slot's counters last moved: they
    /// move once per turn ([`Worker::publish`]), as the bytes do (issue 42: they moved when
    /// a connection closed, so keep-alive traffic showed 0).
    pub(super) moved_in: Cell<u64>,
    pub(super) moved_out: Cell<u64>,
    /// Connections accepted so far (each one's number, [`Conn::id`](crate::Conn::id)).
    pub(super) accepted: Cell<u64>,
    /// The worker-wide read buffer: a read lands here and what it got is copied into the
    /// connection's own buffers, of the size they need (no borrow across an `.await`).
    pub(super) scratch: RefCell<Vec<u8>>,
    /// What the slot last showed (connections, requests in flight).
    pub(super) published: Cell<(ConnCounts, u32)>,
    /// The budget of buffered bytes (`--max-buffered-bytes`), as the event loop keeps it.
    pub(super) budget: RefCell<Budget>,
    /// Connections paused at the budget wait here for room.
    pub(super) budget_room: Notify,
    /// How many are paused.
    pub(super) paused: Cell<usize>,
}

/// Slow polls: the limit, and the episode being logged.
pub(super) struct Slow {
    pub(super) limit: Option<Duration>,
    pub(super) episode: OncePerMinute,
}

/// A connection's name: its client, and what is published of its request in progress
/// (the codec's summary, or its first bytes with `--status-request-detail`: issue 41), for
/// the slow-poll and panic lines; with the request's first bytes as they came, for the
/// access log. The one copy of them: the ledger takes them at the request's end.
#[derive(Debug)]
pub(super) struct Label {
    pub(super) peer: RefCell<Addr>,
    pub(super) shown: RefCell<Vec<u8>>,
    pub(super) raw: RefCell<Vec<u8>>,
}

impl Label {
    /// The name of a connection from `peer`, no request yet.
    pub(super) fn new(peer: Addr) -> Self {
        Label {
            peer: RefCell::new(peer),
            shown: RefCell::new(Vec::new()),
            raw: RefCell::new(Vec::new()),
        }
    }
}

/// How long without a call cut by `--request-timeout` ends an episode of cuts.
pub(super) const CUTS_QUIET: Duration = Duration::from_secs(10);

/// Handler calls cut by `--request-timeout`, logged once per episode (issue 41: one line
/// per cut request, 8,646 lines in 10 s): the first cut of an episode is logged with its
/// client; the others are counted, and told in a line a minute at most while the episode
/// lasts (as the slow-poll lines, [`OncePerMinute`]); the episode ends after
/// [`CUTS_QUIET`] without a cut, or with the worker, in a line that says how many were
/// cut.
#[derive(Debug, Default)]
pub(super) struct Cuts {
    /// When the episode began and when its last cut came; `None` between episodes.
    pub(super) episode: Option<(Instant, Instant)>,
    /// The episode's cuts.
    pub(super) total: u64,
    /// The lines after the first, one a minute at most.
    pub(super) lines: OncePerMinute,
}

impl Cuts {
    /// A call was cut at `now`: `Some(n)` when this one is to be logged (`n` cut since
    /// the last line and not logged).
    pub(super) fn cut(&mut self, now: Instant) -> Option<u64> {
        self.total += 1;
        match &mut self.episode {
            Some((_, last)) => *last = now,
            None => {
                self.episode = Some((now, now));
                // A new episode's first cut is always told.
                self.lines = OncePerMinute::default();
            }
        }
        self.lines.due(now)
    }

    /// When the episode ends if no call is cut before.
    pub(super) fn quiet_at(&self) -> Option<Instant> {
        self.episode.map(|(_, last)| last + CUTS_QUIET)
    }

    /// Ends the episode, if there is one: its line.
    pub(super) fn end(&mut self, limit: Option<Duration>) {
        let Some((since, last)) = self.episode.take() else {
            return;
        };
        let total = std::mem::take(&mut self.total);
        tracing::warn!(
            "{total} handler call(s) cut by --request-timeout ({} s) in {:.1?}, logged once per episode: the episode is over",
            limit.unwrap_or_default().as_secs_f64(),
            last.saturating_duration_since(since)
        );
    }
}

impl<'a> Worker<'a> {
    /// The worker's state at its start: `shared`, the driver's `settings`, the request
    /// step's limits (the request level's) and how its codec refuses a request at the
    /// budget of buffered bytes ([`budget::refusal_words`](crate::worker::budget::refusal_words)).
    pub(super) fn new(shared: Shared<'a>, settings: &Settings, step_limits: Limits, refusal: String) -> Self {
        let Shared {
            id,
            board,
            slot,
            listeners,
            tls,
            limits,
            max_per_ip,
            ledger,
        } = shared;
        let max_inflight = settings.max_inflight;
        Worker {
            id,
            board,
            slot,
            listeners,
            tls,
            limits,
            max_per_ip,
            peers: settings.peers,
            step_limits,
            ledger: RefCell::new(ledger),
            max_connections: settings.max_connections,
            permits: (max_inflight > 0).then(|| Semaphore::new(max_inflight.min(Semaphore::MAX_PERMITS))),
            request_timeout: settings.request_timeout,
            io_timeouts: settings.io_timeouts,
            slow: RefCell::new(Slow {
                limit: settings.slow_request,
                episode: OncePerMinute::default(),
            }),
            cuts: RefCell::new(Cuts::default()),
            stopping: Cell::new(false),
            stop: Notify::new(),
            open: Cell::new(0),
            idle: Cell::new(0),
            in_flight: Cell::new(0),
            writing: Cell::new(0),
            moved_in: Cell::new(0),
            moved_out: Cell::new(0),
            accepted: Cell::new(0),
            scratch: RefCell::new(vec![0; BUFFER_SIZE]),
            published: Cell::new((ConnCounts::default(), 0)),
            budget: RefCell::new(Budget::new(limits.max_buffered, refusal)),
            budget_room: Notify::new(),
            paused: Cell::new(0),
        }
    }

    /// A worker over slot 1 of a board of its own, with no listener, no TLS and no
    /// access log: its `settings`, and `max_buffered` bytes of budget (0: none).
    #[cfg(test)]
    pub(super) fn for_test(settings: Settings, max_buffered: usize) -> Worker<'static> {
        let board = Board::new().unwrap();
        let slot = board.slot(1).unwrap();
        slot.set_event();
        let tls: &'static ForWorker = Box::leak(Box::default());
        let ledger = Ledger::new(
            slot,
            None,
            crate::worker::Recycle::default(),
            Box::new(|| {}),
            Box::new(|| None),
        );
        let shared = Shared {
            id: 1,
            board,
            slot,
            listeners: &[],
            tls,
            limits: ConnLimits {
                max_buffered,
                ..ConnLimits::default()
            },
            max_per_ip: None,
            ledger,
        };
        Worker::new(shared, &settings, Limits::default(), String::new())
    }

    /// The worker is asked to stop: no more accepting; idle connections are woken to end
    /// at their boundary.
    pub(super) fn begin_stop(&self) {
        tracing::debug!(
            "stopping: {} connections, {} requests in flight",
            self.open.get(),
            self.in_flight.get()
        );
        self.stopping.set(true);
        // Shown as finishing, not accepting (`status`, the kill storm's count of serving
        // workers), as the event loop's stop does.
        self.board.set_state(self.id, State::Finishing);
        self.slot.set_accepts_paused(true);
        self.stop.notify_waiters();
        crate::conn::async_client::worker_stops();
    }

    /// The slot shows the connections and the requests in flight (when they changed), and
    /// the bytes moved since the last turn (once per turn, [`Turned`]).
    pub(super) fn publish(&self) {
        let (moved_in, moved_out) = (self.moved_in.take(), self.moved_out.take());
        if (moved_in, moved_out) != (0, 0) {
            self.slot.add_bytes(moved_in, moved_out);
        }
        let idle = self.idle.get();
        let in_flight = self.in_flight.get();
        let writing = self.writing.get();
        let open = self.open.get() as u32;
        let counts = ConnCounts {
            open,
            reading: open
                .saturating_sub(idle)
                .saturating_sub(in_flight)
                .saturating_sub(writing),
            writing,
            idle_keepalive: idle,
        };
        if self.published.get() != (counts, in_flight) {
            self.slot.publish_counts(counts);
            self.slot.set_in_flight(in_flight);
            self.published.set((counts, in_flight));
        }
    }

    /// A connection's buffers went from `was` to `now` bytes: counted against the budget.
    /// When they shrink, the paused connections read again if the budget has room, and the
    /// memory of a flood is given back once its buffers are freed.
    pub(super) fn buffers_moved(&self, was: usize, now: usize) {
        if was == now {
            return;
        }
        let mut budget = self.budget.borrow_mut();
        budget.moved(was, now);
        if now < was {
            if self.paused.get() > 0 && budget.has_room() {
                budget.resumed(Instant::now(), self.paused.get());
                self.budget_room.notify_waiters();
            }
            if budget.freed(Instant::now) {
                sys::release_free_memory();
            }
        }
    }

    /// Waits until the budget of buffered bytes has room for the paused connections.
    pub(super) async fn room(&self) {
        struct Paused<'w>(&'w Cell<usize>);
        impl Drop for Paused<'_> {
            fn drop(&mut self) {
                self.0.set(self.0.get() - 1);
            }
        }
        self.paused.set(self.paused.get() + 1);
        let _paused = Paused(&self.paused);
        loop {
            let notified = self.budget_room.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the look, so that room made after it still wakes this.
            notified.as_mut().enable();
            if self.budget.borrow().has_room() {
                return;
            }
            notified.await;
        }
    }

    /// A `--max-inflight` permit, awaited (none without a limit), and the count of
    /// requests in flight, which drops with the returned guard.
    pub(super) async fn in_flight(&self) -> InFlight<'_, 'a> {
        let permit = match self.permits.as_ref() {
            Some(s) => s.acquire().await.ok(),
            None => None,
        };
        self.in_flight.set(self.in_flight.get() + 1);
        InFlight {
            worker: self,
            _permit: permit,
        }
    }
}

/// A connection of the request level waiting to send its output (a response, a file) to
/// its client, counted among the worker's connections writing until dropped (issue 42: a
/// slow reader showed as reading).
pub(super) struct Writing<'w, 'a> {
    pub(super) worker: &'w Worker<'a>,
}

impl<'w, 'a> Writing<'w, 'a> {
    pub(super) fn new(worker: &'w Worker<'a>) -> Self {
        worker.writing.set(worker.writing.get() + 1);
        Writing { worker }
    }
}

impl Drop for Writing<'_, '_> {
    fn drop(&mut self) {
        self.worker.writing.set(self.worker.writing.get() - 1);
    }
}

/// A request (or a client-level session) in flight, counted until dropped.
pub(super) struct InFlight<'w, 'a> {
    pub(super) worker: &'w Worker<'a>,
    pub(super) _permit: Option<SemaphorePermit<'w>>,
}

impl Drop for InFlight<'_, '_> {
    fn drop(&mut self) {
        self.worker.in_flight.set(self.worker.in_flight.get() - 1);
    }
}

impl Worker<'_> {
    /// A handler call (`what`: "a request", "the connection" of a client-level handler)
    /// from `peer` was cut by `--request-timeout`: logged once per episode ([`Cuts`]).
    pub(super) fn cut_by_timeout(&self, peer: &Addr, what: &str) {
        let Some(more) = self.cuts.borrow_mut().cut(Instant::now()) else {
            return;
        };
        tracing::warn!(
            "{what} from {peer} ran longer than --request-timeout ({} s): its future is cancelled and {}{}",
            self.request_timeout.unwrap_or_default().as_secs_f64(),
            if what == "a request" {
                "the client answered with the codec's error reply"
            } else {
                "the connection closed"
            },
            if more > 0 {
                format!(" ({more} more cut in the last minute)")
            } else {
                " (the others of this episode are counted, and told when it ends)".to_owned()
            }
        );
    }

    /// A poll that held the thread longer than `--slow-request`: counted, and logged once
    /// per episode.
    pub(super) fn slow_poll(&self, label: &Label, took: Duration, now: Instant) {
        self.slot.slow_call();
        let mut slow = self.slow.borrow_mut();
        let Some(more) = slow.episode.due(now) else {
            return;
        };
        tracing::warn!(
            "a poll of the future serving {} took {} ms (--slow-request {} ms), request {:?}: it held up this worker's {} other connections; a handler must not block the thread (use an async client, or tokio::task::spawn_blocking){}",
            label.peer.borrow(),
            took.as_millis(),
            slow.limit.unwrap_or_default().as_millis(),
            String::from_utf8_lossy(&label.shown.borrow()),
            self.open.get().saturating_sub(1),
            if more > 0 {
                format!(" ({more} more slow polls in the last minute)")
            } else {
                String::new()
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 41: calls cut by `--request-timeout` are told once per episode: the first,
    /// then a line a minute at most with the count since, and the episode ends after
    /// [`CUTS_QUIET`] without a cut; the next cut starts a new one, told at once.
    #[test]
    pub(super) fn issue_41_cuts_are_told_once_per_episode() {
        let mut cuts = Cuts::default();
        let t = Instant::now();
        assert_eq!(cuts.cut(t), Some(0), "the first of an episode is told");
        for i in 1..1000 {
            assert_eq!(cuts.cut(t + Duration::from_millis(i)), None);
        }
        assert_eq!(cuts.quiet_at(), Some(t + Duration::from_millis(999) + CUTS_QUIET));
        assert_eq!(
            cuts.cut(t + Duration::from_secs(61)),
            Some(999),
            "a line a minute"
        );
        assert_eq!(cuts.total, 1001);
        cuts.end(Some(Duration::from_secs(1)));
        assert_eq!((cuts.quiet_at(), cuts.total), (None, 0));
        assert_eq!(cuts.cut(t + Duration::from_secs(62)), Some(0), "a new episode");
    }

    /// The counts slot 1 of `w`'s board shows.
    fn shown(w: &Worker<'_>) -> crate::scoreboard::EventView {
        w.board.read(1).unwrap().event.unwrap()
    }

    /// Issue 43: at `--max-inflight` a handler call waits for a permit, which the call
    /// before gives back when it ends; the requests in flight are counted while they run.
    /// Without the limit, any number run at once.
    #[test]
    fn issue_43_at_max_inflight_a_call_waits_for_a_permit() {
        use futures_util::FutureExt;
        let w = Worker::for_test(
            Settings {
                max_inflight: 1,
                ..Settings::default()
            },
            0,
        );
        let first = w.in_flight().now_or_never().expect("a permit is free");
        assert_eq!(w.in_flight.get(), 1);
        let mut second = std::pin::pin!(w.in_flight());
        assert!(second.as_mut().now_or_never().is_none(), "at the limit: waits");
        drop(first);
        assert_eq!(w.in_flight.get(), 0);
        let second = second.now_or_never().expect("the permit given back");
        assert_eq!(w.in_flight.get(), 1);
        drop(second);

        let free = Worker::for_test(Settings::default(), 0);
        let calls: Vec<_> = (0..100)
            .map(|_| free.in_flight().now_or_never().unwrap())
            .collect();
        assert_eq!(free.in_flight.get(), 100);
        drop(calls);
        assert_eq!(free.in_flight.get(), 0);
    }

    /// Issue 43: a connection paused at the budget of buffered bytes waits for room, and
    /// is woken when other connections' buffers shrink below the budget.
    #[test]
    fn issue_43_a_connection_paused_at_the_budget_waits_for_room() {
        use futures_util::FutureExt;
        let w = Worker::for_test(Settings::default(), 100);
        w.buffers_moved(0, 150);
        let mut room = std::pin::pin!(w.room());
        assert!(room.as_mut().now_or_never().is_none(), "over the budget: paused");
        assert_eq!(w.paused.get(), 1);
        w.buffers_moved(150, 40);
        assert!(room.now_or_never().is_some(), "room again: resumed");
        assert_eq!(w.paused.get(), 0);
    }

    /// Issue 43: the slot shows the worker's connections as they are at the end of a
    /// turn: those neither idle, in flight nor writing are reading; and the bytes moved
    /// since the last turn.
    #[test]
    fn issue_43_publish_shows_the_connections_and_the_bytes_moved() {
        let w = Worker::for_test(Settings::default(), 0);
        w.open.set(5);
        w.idle.set(1);
        w.in_flight.set(2);
        let writing = Writing::new(&w);
        w.moved_in.set(100);
        w.moved_out.set(2000);
        w.publish();
        let view = shown(&w);
        assert_eq!(
            (
                view.counts.open,
                view.counts.reading,
                view.counts.writing,
                view.counts.idle_keepalive,
                view.in_flight
            ),
            (5, 1, 1, 1, 2)
        );
        let slot = w.board.read(1).unwrap();
        assert_eq!((slot.bytes_in, slot.bytes_out), (100, 2000));
        drop(writing);
        w.publish();
        assert_eq!((shown(&w).counts.writing, shown(&w).counts.reading), (0, 2));
        let slot = w.board.read(1).unwrap();
        assert_eq!((slot.bytes_in, slot.bytes_out), (100, 2000), "moved once");
    }
}

//! The master's side of the keep-alive guard: it watches the listen queue, and tells the
//! workers, through the board, when clients wait while no worker is idle.
//!
//! One worker per connection means an idle keep-alive connection holds a whole worker. The
//! guard (`worker/guard.rs`) gives such a connection up when clients are queued and no
//! worker is idle; the question "are clients queued?" is answered here, once for the whole
//! pool, so that the workers' request path costs no system call (the guard reads a flag):
//!
//! - **Watching.** The listeners are in the master's `poll` set: a client that connects
//!   wakes the master, which looks (a zero-timeout `poll` of the listeners, and the board's
//!   idle count).
//! - **Queued, no worker idle**, seen twice [`CONFIRM`] apart (once could be a worker about
//!   to finish its connection): the master raises the board's flag (`Board::mark_queued`:
//!   HTTP responses announce the close from now on, after a `poll` of the listeners that
//!   confirms it) and wakes the workers that wait between keep-alive requests
//!   ([`sys::GUARD_SIGNAL`]), which give their connection a short grace and then give it up.
//! - **After every look, a pause.** The listeners leave the `poll` set until the next look,
//!   [`RECHECK`] later, by timer: a listener stays readable until a worker accepts, so
//!   watching it would spin, and a stream of connections that idle workers take at once
//!   wakes the master ten times a second, not once per connection. A timer's look that
//!   finds clients still queued refreshes the flag and, with no worker idle, wakes the
//!   waiting workers again (at most one wake-up per worker per [`RECHECK`]; it also catches
//!   a wake-up that reached a worker just before its `read`); one that finds the queue
//!   empty lowers the flag and goes back to watching.
//! - Outside the running phase (starting, stopping) nothing is watched and the flag is down.
//!
//! Why not watch only while no worker is idle, as the on-demand pool does? The master would
//! have to learn that the last idle worker took a connection: a wake-up `write` by that
//! worker, which under a stream of short connections (a worker still closing the last one
//! while the next arrives) is one system call per connection.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};
use nix::unistd::Pid;

use crate::scoreboard::Board;
use crate::sys;

/// How long the master waits between two looks at the listen queue (except while it watches
/// the listeners, which it does after a look that found the queue empty): the guard's grace
/// for protocols that announce a close (`IDLE_GRACE`, 100 ms), so that a client queued meanwhile
/// waits about one grace more, at most, and the workers' wake-ups stay a few per second.
/// Ten of these make [`QUEUED_FRESH`](crate::scoreboard::QUEUED_FRESH), after which an
/// unrefreshed flag lapses.
pub(crate) const RECHECK: Duration = Duration::from_millis(100);

/// How long after a first sighting of clients queued with no worker idle the master looks
/// again before it raises the flag. Under a stream of short connections the queue is often
/// briefly non-empty while every worker is busy (one still closing the last connection when
/// the next arrives): a flag raised for that would cost the workers a `poll` per request
/// until the master lowers it, for nothing.
pub(crate) const CONFIRM: Duration = Duration::from_millis(10);

/// The watch's state: see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct QueueWatch {
    /// When to look at the queue next; `None`: when a listener wakes the master.
    next_look: Option<Instant>,
    /// The master raised the board's flag.
    flagged: bool,
    /// The last look saw clients queued and no worker idle, for the first time.
    sighted: bool,
    /// The listeners are in the poll set the master sleeps in.
    watching: bool,
}

impl QueueWatch {
    /// Before the master sleeps: decides whether its `poll` watches the listeners (see
    /// [`poll_fds`](QueueWatch::poll_fds)), and returns when it must wake up at the latest.
    pub(crate) fn before_poll(&mut self, running: bool) -> Option<Instant> {
        self.watching = running && self.next_look.is_none();
        self.next_look.filter(|_| running)
    }

    /// Whether the master's next `poll` watches the listeners (set by
    /// [`before_poll`](QueueWatch::before_poll)).
    pub(crate) fn watching(&self) -> bool {
        self.watching
    }

    /// The listeners, for the master's `poll`, while it watches them.
    pub(crate) fn poll_fds<'l, L: AsFd>(&self, listeners: &'l [L]) -> impl Iterator<Item = PollFd<'l>> {
        listeners
            .iter()
            .filter(|_| self.watching)
            .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN))
    }

    /// After the master's `poll` returned, whatever woke it: looks at the queue when a look
    /// is due, raises, refreshes or lowers the board's flag, and wakes the workers
    /// (`(pid, id)`) that wait at a keep-alive boundary when clients are queued and no
    /// worker is idle. Returns how many workers it woke.
    pub(crate) fn on_wake<L: AsFd>(
        &mut self,
        board: &Board,
        listeners: &[L],
        workers: impl Iterator<Item = (Pid, u32)>,
        running: bool,
        now: Instant,
    ) -> usize {
        let watched = std::mem::take(&mut self.watching);
        if !running {
            self.lower(board);
            self.next_look = None;
            return 0;
        }
        let timer = self.next_look.is_some_and(|t| now >= t);
        if !watched && !timer {
            return 0;
        }
        let queued = sys::any_readable(listeners);
        let sighted = std::mem::take(&mut self.sighted);
        if queued && board.idle() == 0 {
            if !self.flagged && !sighted {
                // A first sighting: confirmed by a second look a moment later. A queue
                // that lasts that long is no worker about to finish its connection.
                self.sighted = true;
                self.next_look = Some(now + CONFIRM);
                return 0;
            }
            board.mark_queued();
            self.flagged = true;
            self.next_look = Some(now + RECHECK);
            return workers
                .filter(|(_, id)| board.at_keepalive_boundary(*id))
                .filter(|(pid, _)| sys::wake_worker(*pid))
                .count();
        }
        if queued {
            // A worker is idle and takes a client now; the queue goes on. A raised flag
            // stays (the workers disregard it while a worker is idle) and is refreshed.
            if self.flagged {
                board.mark_queued();
            }
            self.next_look = Some(now + RECHECK);
            return 0;
        }
        self.lower(board);
        self.next_look = watched.then_some(now + RECHECK);
        0
    }

    fn lower(&mut self, board: &Board) {
        if std::mem::take(&mut self.flagged) {
            board.clear_queued();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;
    use crate::scoreboard::State;

    /// A board with workers 1 and 2 busy (no worker idle), 1 at a keep-alive boundary.
    fn saturated_board() -> &'static Board {
        let b = Board::new().unwrap();
        for id in [1, 2] {
            b.claim(id, 0);
            b.set_state(id, State::Idle);
            b.slot(id).unwrap().new_connection();
            b.set_state(id, State::Reading);
        }
        b.slot(1).unwrap().keepalive_wait();
        b
    }

    #[test]
    fn issue_16_an_event_worker_is_never_at_a_keepalive_boundary() {
        // The guard's mark is set only by `keepalive_wait`, which only the blocking
        // driver's guard calls (`worker/guard.rs`); an event worker's slot, whatever it
        // shows, is never woken by the queue watch.
        let b = Board::new().unwrap();
        b.claim(3, 0);
        let s = b.slot(3).unwrap();
        s.set_event();
        b.set_state(3, State::Reading);
        s.publish_counts(crate::scoreboard::ConnCounts {
            open: 50,
            reading: 0,
            writing: 0,
            idle_keepalive: 50,
        });
        s.turn_end();
        assert!(!b.at_keepalive_boundary(3));
        b.set_state(3, State::Idle);
        assert!(!b.at_keepalive_boundary(3));
    }

    /// This process, standing for both workers: SIGURG's default action is to ignore it.
    fn workers() -> impl Iterator<Item = (Pid, u32)> {
        [(Pid::this(), 1), (Pid::this(), 2)].into_iter()
    }

    #[test]
    fn issue_15_a_queued_client_raises_the_flag_and_wakes_the_workers_at_a_boundary() {
        let board = saturated_board();
        let listener = [TcpListener::bind("127.0.0.1:0").unwrap()];
        let mut watch = QueueWatch::default();
        let t0 = Instant::now();
        assert_eq!(watch.before_poll(true), None);
        assert_eq!(watch.poll_fds(&listener).count(), 1, "watched");
        // Woken by something else: a look, then a pause before the next one.
        assert_eq!(watch.on_wake(board, &listener, workers(), true, t0), 0);
        assert!(!board.clients_queued(), "nobody queued: the flag stays down");
        assert_eq!(watch.before_poll(true), Some(t0 + RECHECK));
        assert_eq!(watch.poll_fds(&listener).count(), 0, "paused");
        let t1 = t0 + RECHECK;
        assert_eq!(watch.on_wake(board, &listener, workers(), true, t1), 0);
        assert_eq!(
            watch.before_poll(true),
            None,
            "the queue was empty: watched again"
        );

        let _queued = TcpStream::connect(listener[0].local_addr().unwrap()).unwrap();
        assert_eq!(watch.on_wake(board, &listener, workers(), true, t1), 0);
        assert!(!board.clients_queued(), "a first sighting is confirmed first");
        assert_eq!(watch.before_poll(true), Some(t1 + CONFIRM));
        assert_eq!(watch.poll_fds(&listener).count(), 0, "not watched: it would spin");
        let t2 = t1 + CONFIRM;
        assert_eq!(
            watch.on_wake(board, &listener, workers(), true, t2),
            1,
            "worker 1 waits at a boundary, worker 2 for a first request"
        );
        assert!(board.clients_queued());
        // Flagged: the readable listener is not watched, the queue is looked at again on a
        // timer, and the workers are woken at most once per period.
        assert_eq!(watch.before_poll(true), Some(t2 + RECHECK));
        assert_eq!(watch.poll_fds(&listener).count(), 0);
        assert_eq!(watch.on_wake(board, &listener, workers(), true, t2), 0, "not due");
        let t3 = t2 + RECHECK;
        assert_eq!(
            watch.on_wake(board, &listener, workers(), true, t3),
            1,
            "still queued"
        );
        assert!(board.clients_queued());
        assert_eq!(watch.before_poll(true), Some(t3 + RECHECK));
    }

    #[test]
    fn issue_15_a_queue_seen_once_raises_no_flag() {
        // A stream of short connections: every worker busy (one still closing its last
        // connection) while the next client waits a moment.
        let board = saturated_board();
        let listener = [TcpListener::bind("127.0.0.1:0").unwrap()];
        let mut watch = QueueWatch::default();
        let t0 = Instant::now();
        let _client = TcpStream::connect(listener[0].local_addr().unwrap()).unwrap();
        watch.before_poll(true);
        watch.on_wake(board, &listener, workers(), true, t0);
        let _accepted = listener[0].accept().unwrap();
        assert_eq!(watch.on_wake(board, &listener, workers(), true, t0 + CONFIRM), 0);
        assert!(!board.clients_queued());
        assert_eq!(watch.before_poll(true), None, "watched again");
    }

    #[test]
    fn issue_15_the_flag_falls_when_the_queue_is_served_or_the_pool_stops() {
        let board = saturated_board();
        let listener = [TcpListener::bind("127.0.0.1:0").unwrap()];
        let mut watch = QueueWatch::default();
        let mut t = Instant::now();
        let mut raise = |watch: &mut QueueWatch| {
            t += 2 * RECHECK;
            watch.before_poll(true);
            watch.on_wake(board, &listener, std::iter::empty(), true, t);
            t += CONFIRM;
            watch.on_wake(board, &listener, std::iter::empty(), true, t);
            assert!(board.clients_queued());
            t
        };
        let _client = TcpStream::connect(listener[0].local_addr().unwrap()).unwrap();
        let t0 = raise(&mut watch);
        // A worker idle a moment (it takes a client, the queue goes on): the flag does not
        // count meanwhile, and stays.
        board.set_state(2, State::Idle);
        assert!(
            !board.clients_queued(),
            "a worker is idle: the flag does not count"
        );
        watch.on_wake(board, &listener, workers(), true, t0 + RECHECK);
        board.set_state(2, State::Reading);
        assert!(board.clients_queued(), "still up");
        // Served: the next look lowers the flag, and the listeners are watched again.
        let _accepted = listener[0].accept().unwrap();
        watch.on_wake(board, &listener, workers(), true, t0 + 2 * RECHECK);
        assert!(!board.clients_queued(), "lowered");
        assert_eq!(watch.before_poll(true), None);
        assert_eq!(watch.poll_fds(&listener).count(), 1);

        let _client = TcpStream::connect(listener[0].local_addr().unwrap()).unwrap();
        let t1 = raise(&mut watch);
        assert_eq!(watch.before_poll(false), None, "stopping: no look");
        assert_eq!(watch.poll_fds(&listener).count(), 0);
        watch.on_wake(board, &listener, workers(), false, t1 + RECHECK);
        assert!(!board.clients_queued());
    }
}

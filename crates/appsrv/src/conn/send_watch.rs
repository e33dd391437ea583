//! `--min-send-rate`: watching the writes that wait for a slow reader. No I/O of its own
//! beyond asking the kernel what the peer acknowledged; the blocking [`Client`](crate::Client)
//! consults it after each write that came back without finishing.

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use socket2::Socket;

/// How often a write that waits for a slow reader returns to check its progress, when
/// `--min-send-rate` is on: the socket's send timeout (`SO_SNDTIMEO`), set once on the
/// listener. The write timeout the handler sees is kept by [`SendWatch`], not the kernel.
pub(crate) const SEND_CHECK: Duration = Duration::from_secs(1);

/// The window over which a reader's progress is measured for `--min-send-rate`...
pub(crate) const SEND_WINDOW: Duration = Duration::from_secs(10);
/// ... or longer, up to this, for a reader whose progress shows in steps so large that
/// one at the minimum rate makes fewer than two of them in [`SEND_WINDOW`]. A receiver
/// reopens its window in pieces, and what we see acknowledged moves by as much at once. A
/// step is the largest move seen from one check to the next in the window, and at least two
/// segments: the kernel sends a small window's client segments of half its window at most,
/// and such a client reopens its whole window at once (one with a 4 KiB `SO_RCVBUF` reading
/// 700 bytes/s moved 4 to 6 KiB every 9 s on loopback). Two steps at 500 bytes/s: with
/// loopback's 64 KiB segments, the whole minute; a network's 1448 bytes, about 12 s; a
/// 4 KiB window's 2 KiB segments, 16 s (25 s once 6 KiB steps show).
pub(crate) const MAX_SEND_WINDOW: Duration = Duration::from_secs(60);

/// Watches writes that wait for the client (its receive window and our send buffer are
/// full): the client must take at least `rate` bytes per second, measured on what it has
/// acknowledged (not on what the kernel accepted: a 4 MiB send buffer would hide a reader
/// that takes nothing), over each [`SEND_WINDOW`] of waiting (or more, up to
/// [`MAX_SEND_WINDOW`], for two steps of its progress at the rate). A window starts at the
/// first wait and ends after that long, or when the writes stop waiting (a handler that
/// streams slowly is not the client's fault). The client is credited one step (at most
/// half of what it owes): what it has freed but not yet shown, so that a reader at the rate
/// is never cut for where the window's edges fall between its steps.
///
/// With a rate, the socket's send timeout is [`SEND_CHECK`], so that a waiting write comes
/// back every second; the write timeout (`--write-timeout`,
/// [`Client::set_write_timeout`](crate::Client::set_write_timeout))
/// is then kept here: a write that makes no progress for that long fails with `TimedOut`,
/// as the kernel's timeout would have.
#[derive(Debug, Clone, Default)]
pub(crate) struct SendWatch {
    /// Bytes per second (0: no limit).
    rate: u64,
    /// The handler's write timeout, when the kernel's is [`SEND_CHECK`].
    write_timeout: Option<Duration>,
    /// The current window.
    window: Option<Window>,
    /// The last time a write waited (a gap of two checks ends the window).
    last_wait: Option<std::time::Instant>,
    /// Since when writes have made no progress at all.
    stalled_since: Option<std::time::Instant>,
    /// The client was cut off for being too slow.
    cut: bool,
}

/// A window of [`SendWatch`]: what the peer had taken, in bytes, and when.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// When it began, and what the peer had taken then.
    began: std::time::Instant,
    at_start: u64,
    /// What the peer had taken at the last check.
    last: u64,
    /// The largest move of what it had taken from one check to the next.
    step: u64,
}

impl Window {
    fn new(now: std::time::Instant, taken: u64) -> Self {
        Window {
            began: now,
            at_start: taken,
            last: taken,
            step: 0,
        }
    }
}

impl SendWatch {
    /// A watch for `rate` bytes per second (0: none) and the handler's `write_timeout`.
    pub(crate) fn new(rate: u64, write_timeout: Option<Duration>) -> Self {
        SendWatch {
            rate,
            write_timeout,
            ..SendWatch::default()
        }
    }

    /// The send timeout the socket must have for this watch.
    pub(crate) fn socket_timeout(rate: u64, write_timeout: Option<Duration>) -> Option<Duration> {
        match (rate, write_timeout) {
            (0, t) => t,
            (_, None) => Some(SEND_CHECK),
            (_, Some(t)) => Some(t.min(SEND_CHECK)),
        }
    }

    /// Whether a rate is enforced (otherwise the kernel keeps the write timeout alone).
    pub(crate) fn active(&self) -> bool {
        self.rate > 0
    }

    /// The handler's write timeout, kept here while [`active`](SendWatch::active).
    pub(crate) fn write_timeout(&self) -> Option<Duration> {
        self.write_timeout
    }

    /// How long one wait for the client lasts before the watch hears of it: the socket's
    /// send timeout ([`SEND_CHECK`], or the write timeout if that is shorter). A driver
    /// that waits with `poll` rather than in a blocking write waits this long.
    pub(crate) fn check_interval(&self) -> Duration {
        self.kernel_timeout_for(self.write_timeout).unwrap_or(SEND_CHECK)
    }

    /// The handler sets its write timeout: returns the send timeout the socket must get
    /// (still at most [`SEND_CHECK`]); [`keep_write_timeout`](SendWatch::keep_write_timeout)
    /// records it once the socket has it.
    pub(crate) fn kernel_timeout_for(&self, write_timeout: Option<Duration>) -> Option<Duration> {
        Self::socket_timeout(self.rate, write_timeout)
    }

    /// The socket's send timeout is now [`kernel_timeout_for`](SendWatch::kernel_timeout_for)
    /// of `write_timeout`, which this watch keeps.
    pub(crate) fn keep_write_timeout(&mut self, write_timeout: Option<Duration>) {
        self.write_timeout = write_timeout;
    }

    /// Whether the client was cut off for being too slow: the connection is over.
    pub(crate) fn cut(&self) -> bool {
        self.cut
    }

    /// A write made progress.
    pub(crate) fn progress(&mut self) {
        self.stalled_since = None;
    }

    /// A write waited for the client and came back (its send timeout expired, with or
    /// without progress): `Err` when the client is too slow, and the write must give up.
    ///
    /// Progress, for the write timeout, is bytes written or, on TCP, bytes the client
    /// acknowledged since the last check. Bytes written alone are not enough: the kernel
    /// lets a writer (and `EPOLLOUT`) go on only when a third of the send buffer is free,
    /// so with loopback's 4 MiB buffer a client taking a healthy 16 kB/s lets nothing be
    /// written for over a minute. The event loop, which writes only on that edge, cut such
    /// clients at the write timeout (issue 31); the rate is what judges a slow client.
    pub(crate) fn waited(&mut self, socket: &Socket, progressed: bool) -> io::Result<()> {
        let now = std::time::Instant::now();
        let measured = crate::sys::peer_progress(socket.as_fd());
        let peer_took = match (measured, self.window) {
            (Some((taken, _)), Some(w)) => taken > w.last,
            _ => false,
        };
        if !(progressed || peer_took) {
            // The socket's own send timeout: the first wait began that long ago.
            let check = self.check_interval();
            let since = *self
                .stalled_since
                .get_or_insert_with(|| now.checked_sub(check).unwrap_or(now));
            if let Some(limit) = self.write_timeout {
                if now.duration_since(since) >= limit {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "timed out waiting for the peer",
                    ));
                }
            }
        } else {
            self.progress();
        }
        // Writes that stopped waiting for a while (more than two checks) start afresh.
        if self
            .last_wait
            .is_some_and(|t| now.duration_since(t) > 2 * SEND_CHECK)
        {
            self.window = None;
        }
        self.last_wait = Some(now);
        let Some((taken, mss)) = measured else {
            return Ok(()); // not TCP: only the write timeout applies
        };
        let Some(w) = self.window.as_mut() else {
            self.window = Some(Window::new(now, taken));
            return Ok(());
        };
        w.step = w.step.max(taken.saturating_sub(w.last));
        w.last = taken;
        let (began, at_start) = (w.began, w.at_start);
        // A step is at least two segments: the kernel sends a small window's client
        // segments of half its window at most, and it reopens the whole window at once.
        let step = w.step.max(2 * u64::from(mss));
        let window =
            Duration::from_secs_f64(2.0 * step as f64 / self.rate as f64).clamp(SEND_WINDOW, MAX_SEND_WINDOW);
        let elapsed = now.duration_since(began);
        if elapsed < window {
            return Ok(());
        }
        let got = taken.saturating_sub(at_start);
        let needed = (self.rate as f64 * elapsed.as_secs_f64()) as u64;
        if got + step.min(needed / 2) < needed {
            self.cut = true;
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client took {got} bytes of the response in {:.1} s, below --min-send-rate \
                     {} bytes/s: cut off",
                    elapsed.as_secs_f64(),
                    self.rate
                ),
            ));
        }
        self.window = Some(Window::new(now, taken));
        Ok(())
    }

    /// A response is done (the connection reads again): the next one starts afresh.
    pub(crate) fn reset(&mut self) {
        self.window = None;
        self.last_wait = None;
        self.stalled_since = None;
    }
}

/// How the async driver bounds a write that waits for the client (issue 42): by
/// `--write-timeout` alone, or with `--min-send-rate` by the [`SendWatch`], consulted every
/// [`check_interval`](SendWatch::check_interval) while the write waits, as the event loop
/// does (the watch keeps the write timeout then). The wait is given up at each check and
/// made again: the driver's writes take bytes only in a system call after the wait, so a
/// wait given up loses nothing.
#[derive(Debug, Clone)]
pub(crate) enum Pace {
    /// `--write-timeout` (`None`: none) bounds each wait.
    Timeout(Option<Duration>),
    /// `--min-send-rate` judges the waits.
    Rate(SendWatch),
}

impl Pace {
    /// The pace for `rate` bytes per second (0: none) and the `write_timeout`.
    pub(crate) fn new(rate: u64, write_timeout: Option<Duration>) -> Self {
        if rate == 0 {
            Pace::Timeout(write_timeout)
        } else {
            Pace::Rate(SendWatch::new(rate, write_timeout))
        }
    }

    /// How long one wait may last before [`expired`](Pace::expired) hears of it (`None`:
    /// for ever).
    pub(crate) fn limit(&self) -> Option<Duration> {
        match self {
            Pace::Timeout(t) => *t,
            Pace::Rate(w) => Some(w.check_interval()),
        }
    }

    /// A wait lasted [`limit`](Pace::limit) without progress: `Err(TimedOut)` when the
    /// write must give up (the write timeout, or a client below the rate).
    pub(crate) fn expired(&mut self, socket: &Socket) -> io::Result<()> {
        match self {
            Pace::Timeout(t) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client took nothing for {} s (--write-timeout)",
                    t.unwrap_or_default().as_secs_f64()
                ),
            )),
            Pace::Rate(w) => w.waited(socket, false),
        }
    }

    /// A write made progress.
    pub(crate) fn progressed(&mut self) {
        if let Pace::Rate(w) = self {
            w.progress();
        }
    }

    /// The output is all written: the next output's waits start afresh.
    pub(crate) fn done(&mut self) {
        if let Pace::Rate(w) = self {
            w.reset();
        }
    }
}

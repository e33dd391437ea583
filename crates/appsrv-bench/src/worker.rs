//! One connection's thread: send, read, count.
//!
//! The loop allocates nothing per request: the requests of a pipelined batch are prepared
//! once, the read buffer is reused, and the counters and histogram are the thread's own.
//! The only shared memory it writes is its [`Live`] counters (relaxed stores, read by the
//! progress line), and it takes a lock only when it opens or closes a connection in a `-d`
//! run (to let the end of the run cut a request that is stuck).

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::framing::{Framing, Malformed, Parser, Step};
use crate::net::{Stream, Target};
use crate::stats::{ErrorKind, Stats};

/// The size of each connection's read buffer; more than [`crate::framing::MAX_HEAD`], so
/// that an incomplete HTTP head always leaves room to read the rest of it.
const READ_BUFFER: usize = 64 * 1024;

/// What to run (from the command line).
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) target: Target,
    /// One request; empty to send nothing (the server speaks first).
    pub(crate) request: Vec<u8>,
    pub(crate) framing: Framing,
    pub(crate) pipeline: usize,
    pub(crate) reconnect: bool,
    pub(crate) timeout: Duration,
    pub(crate) limit: Limit,
    pub(crate) warmup: Duration,
    /// Requests per second over all connections.
    pub(crate) rate: Option<f64>,
    pub(crate) connections: usize,
}

/// When the run ends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Limit {
    /// After this many requests (after the warm-up).
    Requests(u64),
    /// After this long (after the warm-up).
    Duration(Duration),
}

/// The counters a connection publishes for the progress line.
#[derive(Debug, Default)]
#[repr(align(64))] // one cache line each: no false sharing between threads
pub(crate) struct Live {
    /// Completed requests, warm-up included.
    pub(crate) done: AtomicU64,
    /// Completed requests after the warm-up.
    pub(crate) counted: AtomicU64,
    /// Failed requests after the warm-up.
    pub(crate) errors: AtomicU64,
}

/// The start signal: every thread starts at the same instant, or none starts.
#[derive(Debug, Default)]
struct Gate {
    state: Mutex<Option<Option<Instant>>>,
    cv: Condvar,
}

/// What the connection threads and the main thread share.
#[derive(Debug)]
pub(crate) struct Shared {
    gate: Gate,
    /// Set when a `-d` run ends: stop, and count what is in progress as unfinished.
    stop: AtomicBool,
    /// A clone of each connection's open stream (`-d` runs only), so that the end of the
    /// run can shut it down and wake a thread blocked on it.
    slots: Vec<Mutex<Option<Stream>>>,
    pub(crate) live: Vec<Live>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn new(threads: usize) -> Shared {
        Shared {
            gate: Gate::default(),
            stop: AtomicBool::new(false),
            slots: (0..threads).map(|_| Mutex::new(None)).collect(),
            live: (0..threads).map(|_| Live::default()).collect(),
        }
    }

    /// Starts the threads, all at `start`; `None` tells them to return at once.
    pub(crate) fn open_gate(&self, start: Option<Instant>) {
        *lock(&self.gate.state) = Some(start);
        self.gate.cv.notify_all();
    }

    fn wait_gate(&self) -> Option<Instant> {
        let mut state = lock(&self.gate.state);
        loop {
            if let Some(start) = *state {
                return start;
            }
            state = self.gate.cv.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Ends a `-d` run: no new requests, and the ones in progress are cut short.
    pub(crate) fn cut(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for slot in &self.slots {
            if let Some(s) = lock(slot).as_ref() {
                s.shutdown();
            }
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Runs connection `idx` of `active`: `quota` requests in a `-n` run, until the end of
/// the run in a `-d` run. Returns its counters.
pub(crate) fn run_connection(plan: &Plan, shared: &Shared, idx: usize, active: usize, quota: u64) -> Stats {
    let mut w = Worker {
        plan,
        shared,
        idx,
        cut_enabled: matches!(plan.limit, Limit::Duration(_)),
        stream: None,
        rbuf: RecvBuf::new(READ_BUFFER),
        parser: Parser::new(&plan.framing),
        requests: plan.request.repeat(plan.pipeline),
        stats: Stats::new(),
    };
    if let Some(start) = shared.wait_gate() {
        w.run(start, active, quota);
        w.close();
    }
    w.stats.end = Some(Instant::now());
    if w.stats.completed + w.stats.warmup_completed == 0 {
        w.stats.silent_connections = 1;
    }
    w.stats
}

struct Worker<'a> {
    plan: &'a Plan,
    shared: &'a Shared,
    idx: usize,
    cut_enabled: bool,
    /// The open connection between requests (keep-alive).
    stream: Option<Stream>,
    rbuf: RecvBuf,
    parser: Parser,
    /// The request repeated `pipeline` times, so a batch is one write.
    requests: Vec<u8>,
    stats: Stats,
}

impl Worker<'_> {
    fn run(&mut self, start: Instant, active: usize, quota: u64) {
        let plan = self.plan;
        let measure_start = start + plan.warmup;
        let deadline = match plan.limit {
            Limit::Duration(d) => Some(measure_start + d),
            Limit::Requests(_) => None,
        };
        // With --rate each connection sends at rate/active, the connections staggered
        // evenly over one interval.
        let interval = plan.rate.map(|r| Duration::from_secs_f64(active as f64 / r));
        let mut due = interval.map(|iv| start + iv.mul_f64(self.idx as f64 / active as f64));
        let mut remaining = quota;
        let live = &self.shared.live[self.idx];
        loop {
            let mut now = Instant::now();
            if deadline.is_some_and(|d| now >= d) || self.shared.stopped() {
                break;
            }
            // The request's start for its latency: when it was due (so that a slow
            // response that delays the next requests is charged for the delay), or now.
            let t0 = match due {
                None => now,
                Some(due) => {
                    if deadline.is_some_and(|d| due >= d) {
                        break;
                    }
                    if due > now {
                        thread::sleep(due - now);
                        now = Instant::now();
                    }
                    due
                }
            };
            let counting = t0 >= measure_start;
            let k = if counting && deadline.is_none() {
                if remaining == 0 {
                    break;
                }
                let k = remaining.min(plan.pipeline as u64);
                remaining -= k;
                k as usize
            } else {
                plan.pipeline
            };
            if let Some(iv) = interval {
                due = Some(t0 + iv * k as u32);
            }
            let go_on = self.batch(k, t0, now, counting);
            live.done.store(
                self.stats.completed + self.stats.warmup_completed,
                Ordering::Relaxed,
            );
            live.counted.store(self.stats.completed, Ordering::Relaxed);
            live.errors.store(self.stats.total_errors(), Ordering::Relaxed);
            if !go_on {
                break;
            }
        }
    }

    /// Sends `k` requests (one write) and reads their `k` responses. Returns false when
    /// the run was stopped meanwhile.
    fn batch(&mut self, k: usize, t0: Instant, now: Instant, counting: bool) -> bool {
        let plan = self.plan;
        let mut stream = match self.stream.take() {
            Some(s) => s,
            None => match self.open() {
                Ok(s) => {
                    if self.shared.stopped() {
                        // The run ended while connecting: this batch was never sent.
                        self.close();
                        return false;
                    }
                    if counting {
                        self.stats.connects += 1;
                    }
                    s
                }
                Err(()) => return self.failed(k, ErrorKind::Connect, counting),
            },
        };
        if !plan.request.is_empty() {
            let len = k * plan.request.len();
            if let Err(e) = stream.write_all(&self.requests[..len]) {
                return self.failed(k, ErrorKind::of_io(&e), counting);
            }
        }
        for i in 0..k {
            let (bytes, result) =
                read_response(&mut stream, &mut self.rbuf, &mut self.parser, now, plan.timeout);
            if counting {
                self.stats.bytes += bytes;
            }
            let eof = match result {
                Ok(eof) => eof,
                Err(kind) => return self.failed(k - i, kind, counting),
            };
            if eof && self.shared.stopped() {
                // The end of the stream may be the cut, not the server's close.
                return self.failed(k - i, ErrorKind::Other, counting);
            }
            if counting {
                self.stats
                    .record_latency(Instant::now().saturating_duration_since(t0));
                self.stats.completed += 1;
                if self
                    .parser
                    .http_status()
                    .is_some_and(|s| !(200..400).contains(&s))
                {
                    self.stats.non_2xx_3xx += 1;
                }
            } else {
                self.stats.warmup_completed += 1;
            }
            if eof || self.parser.must_close() {
                self.close();
                // Pipelined requests after a closing response get no answer.
                return i + 1 == k || self.failed(k - i - 1, ErrorKind::BadResponse, counting);
            }
        }
        if plan.reconnect {
            self.close();
        } else {
            self.stream = Some(stream);
        }
        true
    }

    /// Opens a connection (registered for the cut in a `-d` run).
    fn open(&mut self) -> Result<Stream, ()> {
        let s = self.plan.target.connect(self.plan.timeout).map_err(drop)?;
        if self.cut_enabled {
            let clone = s.try_clone().map_err(drop)?;
            *lock(&self.shared.slots[self.idx]) = Some(clone);
        }
        Ok(s)
    }

    /// Forgets the connection (the caller drops its stream, which closes it).
    fn close(&mut self) {
        self.stream = None;
        self.rbuf.clear();
        if self.cut_enabled {
            lock(&self.shared.slots[self.idx]).take();
        }
    }

    /// Counts `n` failed requests and closes the connection. Returns false (stop) if the
    /// run was stopped: the failure is then the cut and the requests are unfinished.
    fn failed(&mut self, n: usize, kind: ErrorKind, counting: bool) -> bool {
        self.close();
        let stopped = self.shared.stopped();
        if counting {
            if stopped {
                self.stats.unfinished += n as u64;
            } else {
                self.stats.add_errors(kind, n as u64);
            }
        }
        !stopped
    }
}

/// Reads one response. Returns the bytes it took and whether it ended with the end of the
/// stream, or why it failed.
fn read_response(
    stream: &mut Stream,
    rbuf: &mut RecvBuf,
    parser: &mut Parser,
    started: Instant,
    timeout: Duration,
) -> (u64, Result<bool, ErrorKind>) {
    parser.reset();
    let mut bytes = 0u64;
    let mut first_read = true;
    loop {
        if !rbuf.is_empty() {
            match parser.feed(rbuf.data()) {
                Ok(Step::Done(n)) => {
                    rbuf.consume(n);
                    return (bytes + n as u64, Ok(false));
                }
                Ok(Step::More(n)) => {
                    rbuf.consume(n);
                    bytes += n as u64;
                }
                Err(Malformed) => return (bytes + rbuf.len() as u64, Err(ErrorKind::BadResponse)),
            }
        }
        // Each read waits at most `timeout` (the socket's timeout); a response that
        // trickles in must also be complete within `timeout` of the request.
        if !first_read && started.elapsed() > timeout {
            return (bytes + rbuf.len() as u64, Err(ErrorKind::Timeout));
        }
        first_read = false;
        match rbuf.fill(stream) {
            Ok(0) => {
                let result = match parser.at_eof() {
                    Ok(()) => Ok(true),
                    Err(Malformed) => Err(ErrorKind::BadResponse),
                };
                return (bytes + rbuf.len() as u64, result);
            }
            Ok(_) => {}
            Err(e) => return (bytes + rbuf.len() as u64, Err(ErrorKind::of_io(&e))),
        }
    }
}

/// A read buffer: bytes received and not yet consumed are `buf[start..end]`.
#[derive(Debug)]
struct RecvBuf {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl RecvBuf {
    fn new(size: usize) -> RecvBuf {
        RecvBuf {
            buf: vec![0; size].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn len(&self) -> usize {
        self.end - self.start
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.clear();
        }
    }

    fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Reads what is available (at least one byte, or 0 at the end of the stream).
    fn fill(&mut self, stream: &mut Stream) -> io::Result<usize> {
        if self.end == self.buf.len() {
            if self.start == 0 {
                // Cannot happen: the parsers keep less than the buffer unconsumed.
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "response too large to parse",
                ));
            }
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        loop {
            match stream.read(&mut self.buf[self.end..]) {
                Ok(n) => {
                    self.end += n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

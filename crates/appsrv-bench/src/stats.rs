//! What each connection counts, merged at the end.

use std::io;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// The connection could not be opened.
    Connect,
    /// The connection was reset, or broke while sending.
    Reset,
    /// A read or write waited longer than `--timeout`, or the response took longer.
    Timeout,
    /// The response was malformed, or the connection closed before it was complete.
    BadResponse,
    /// Any other I/O error.
    Other,
}

impl ErrorKind {
    pub(crate) const ALL: [ErrorKind; 5] = [
        ErrorKind::Connect,
        ErrorKind::Reset,
        ErrorKind::Timeout,
        ErrorKind::BadResponse,
        ErrorKind::Other,
    ];

    /// The name in the JSON output.
    pub(crate) fn key(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Reset => "reset",
            ErrorKind::Timeout => "timeout",
            ErrorKind::BadResponse => "bad_response",
            ErrorKind::Other => "other",
        }
    }

    /// The name in the text report.
    pub(crate) fn label(self) -> &'static str {
        match self {
            ErrorKind::BadResponse => "bad response",
            k => k.key(),
        }
    }

    /// Classifies an error from a read or write on an open connection.
    pub(crate) fn of_io(e: &io::Error) -> ErrorKind {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ErrorKind::Timeout,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected => ErrorKind::Reset,
            io::ErrorKind::UnexpectedEof => ErrorKind::BadResponse,
            _ => ErrorKind::Other,
        }
    }
}

/// The counters of one connection (or, merged, of the run).
#[derive(Debug)]
pub(crate) struct Stats {
    /// Latencies of completed requests, in microseconds.
    pub(crate) latency: Histogram<u64>,
    /// Requests with a complete response.
    pub(crate) completed: u64,
    /// Bytes of responses (including the part of failed ones that was read).
    pub(crate) bytes: u64,
    /// Failed requests, by [`ErrorKind`] (in the order of [`ErrorKind::ALL`]).
    pub(crate) errors: [u64; 5],
    /// Requests still in progress when a `-d` run ended.
    pub(crate) unfinished: u64,
    /// HTTP responses with a status other than 2xx or 3xx.
    pub(crate) non_2xx_3xx: u64,
    /// Connections opened (for counted requests).
    pub(crate) connects: u64,
    /// Requests completed during the warm-up (not counted elsewhere).
    pub(crate) warmup_completed: u64,
    /// Connections (threads) that got no complete response at all, warm-up included.
    pub(crate) silent_connections: u64,
    /// When the connection's thread stopped.
    pub(crate) end: Option<Instant>,
}

impl Stats {
    pub(crate) fn new() -> Stats {
        Stats {
            // Three significant digits; the range grows as needed.
            latency: Histogram::new(3).expect("3 significant digits are valid"),
            completed: 0,
            bytes: 0,
            errors: [0; 5],
            unfinished: 0,
            non_2xx_3xx: 0,
            connects: 0,
            warmup_completed: 0,
            silent_connections: 0,
            end: None,
        }
    }

    /// Records the latency of a completed request.
    #[inline]
    pub(crate) fn record_latency(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        // `record` grows the histogram's range when needed (rarely: the range doubles).
        // Not `saturating_record`: it never grows the histogram, and clamps a value beyond
        // the counts to the nominal highest value, which is 2 for a histogram made by
        // `Histogram::new`.
        if self.latency.record(us).is_err() {
            self.latency.saturating_record(us);
        }
    }

    pub(crate) fn error_count(&self, kind: ErrorKind) -> u64 {
        self.errors[kind as usize]
    }

    pub(crate) fn add_errors(&mut self, kind: ErrorKind, n: u64) {
        self.errors[kind as usize] += n;
    }

    pub(crate) fn total_errors(&self) -> u64 {
        self.errors.iter().sum()
    }

    /// Adds `other` into `self`.
    pub(crate) fn merge(&mut self, other: &Stats) {
        self.latency
            .add(&other.latency)
            .expect("auto-resizing histograms always merge");
        self.completed += other.completed;
        self.bytes += other.bytes;
        for (a, b) in self.errors.iter_mut().zip(other.errors) {
            *a += b;
        }
        self.unfinished += other.unfinished;
        self.non_2xx_3xx += other.non_2xx_3xx;
        self.connects += other.connects;
        self.warmup_completed += other.warmup_completed;
        self.silent_connections += other.silent_connections;
        self.end = match (self.end, other.end) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_adds_everything() {
        let mut a = Stats::new();
        a.latency.record(10).unwrap();
        a.completed = 1;
        a.bytes = 5;
        a.add_errors(ErrorKind::Timeout, 2);
        let mut b = Stats::new();
        b.latency.record(1_000_000).unwrap();
        b.completed = 1;
        b.bytes = 7;
        b.add_errors(ErrorKind::Timeout, 1);
        b.add_errors(ErrorKind::Connect, 4);
        b.silent_connections = 1;
        a.merge(&b);
        assert_eq!(a.completed, 2);
        assert_eq!(a.bytes, 12);
        assert_eq!(a.error_count(ErrorKind::Timeout), 3);
        assert_eq!(a.error_count(ErrorKind::Connect), 4);
        assert_eq!(a.total_errors(), 7);
        assert_eq!(a.silent_connections, 1);
        assert_eq!(a.latency.len(), 2);
        assert_eq!(a.latency.min(), 10);
        assert!(a.latency.max() >= 1_000_000);
    }

    #[test]
    fn latencies_beyond_the_initial_range_are_kept() {
        let mut s = Stats::new();
        for us in [20, 5_000, 3_000_000, 15] {
            s.record_latency(Duration::from_micros(us));
        }
        s.record_latency(Duration::from_secs(7200));
        let h = &s.latency;
        assert_eq!(h.len(), 5);
        assert_eq!(h.min(), 15);
        assert!(h.max() >= 7_200_000_000 && h.max() < 7_210_000_000, "{}", h.max());
        assert!(h.value_at_quantile(0.5) >= 5_000 && h.value_at_quantile(0.5) < 5_010);
        let mut total = Stats::new();
        total.merge(&s);
        assert_eq!(total.latency.min(), 15);
        assert_eq!(total.latency.max(), h.max());
    }

    #[test]
    fn io_error_kinds() {
        let kind = |k| ErrorKind::of_io(&io::Error::from(k));
        assert_eq!(kind(io::ErrorKind::WouldBlock), ErrorKind::Timeout);
        assert_eq!(kind(io::ErrorKind::ConnectionReset), ErrorKind::Reset);
        assert_eq!(kind(io::ErrorKind::BrokenPipe), ErrorKind::Reset);
        assert_eq!(kind(io::ErrorKind::PermissionDenied), ErrorKind::Other);
    }
}

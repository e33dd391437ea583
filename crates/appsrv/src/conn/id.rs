//! The name of a connection across the pool ([`ConnId`]), and what every connection type
//! asks of its worker: which worker this is, and whether it is stopping.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// A connection's name, unique across the server's pool for the server's life: the
/// worker's slot, the worker's generation (0 at start, one more with each reload) and
/// process id, and the connection's number in that worker process (1 for its first
/// connection, then 2, and so on).
///
/// Two workers never give the same id, nor do a worker and its replacement in the same
/// slot (a new process id), nor two generations. Displayed as
/// `w<slot>.g<generation>.p<pid>.c<number>` (`w2.g0.p4242.c17`): put it in log lines to
/// follow one connection across them, as [`Client::id`](crate::Client::id),
/// [`AsyncClient::id`](crate::AsyncClient::id) and [`Conn::id`](crate::Conn::id) give it.
/// Its parts may grow; compare ids whole, or read the parts with the accessors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub struct ConnId {
    worker: u32,
    generation: u32,
    pid: u32,
    number: u64,
}

impl ConnId {
    /// Connection `number` of this worker process.
    pub(crate) fn new(number: u64) -> Self {
        ConnId {
            worker: WORKER.load(Ordering::Relaxed),
            generation: GENERATION.load(Ordering::Relaxed),
            pid: std::process::id(),
            number,
        }
    }

    /// The worker's slot, from 1 to the pool size ([`WorkerInfo::id`](crate::WorkerInfo));
    /// a replacement reuses the slot of the worker it replaces. 0 outside a worker (a
    /// handler run by a test).
    pub fn worker(&self) -> u32 {
        self.worker
    }

    /// The generation of the worker: 0 for the workers started with the server, one more
    /// with each reload.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The worker's process id ([`WorkerInfo::pid`](crate::WorkerInfo)).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The connection's number in its worker process: 1 for the first, then 2, ...
    pub fn number(&self) -> u64 {
        self.number
    }
}

impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "w{}.g{}.p{}.c{}",
            self.worker, self.generation, self.pid, self.number
        )
    }
}

/// This worker's slot and generation (set once, in the worker, after its fork).
static WORKER: AtomicU32 = AtomicU32::new(0);
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// The worker process learns who it is (its slot, and its generation from the scoreboard).
pub(crate) fn set_worker(slot: u32, generation: u32) {
    WORKER.store(slot, Ordering::Relaxed);
    GENERATION.store(generation, Ordering::Relaxed);
}

/// The worker began to stop without a signal (its listeners shut by the master: an event
/// or async driver noticed): [`worker_stopping`] says so from then.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// The worker began to stop (its driver saw its listeners shut).
pub(crate) fn set_stopping() {
    STOPPING.store(true, Ordering::SeqCst);
}

/// Whether this worker was asked to stop: a stop signal came (a stop, a reload, an
/// upgrade, recycling), or its driver began to stop.
pub(crate) fn worker_stopping() -> bool {
    crate::sys::stop_requested() || STOPPING.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_42_conn_id_names_worker_generation_pid_and_number() {
        let id = ConnId {
            worker: 2,
            generation: 1,
            pid: 4242,
            number: 17,
        };
        assert_eq!(id.to_string(), "w2.g1.p4242.c17");
        assert_eq!(
            (id.worker(), id.generation(), id.pid(), id.number()),
            (2, 1, 4242, 17)
        );
        // Same number, another worker: another id.
        let other = ConnId { worker: 3, ..id };
        assert_ne!(id, other);
        assert_ne!(id.to_string(), other.to_string());
    }
}

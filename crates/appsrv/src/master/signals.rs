//! The master's signals: each handler sets a flag and writes a byte to a wake socket pair,
//! so that no work runs in signal context and a signal that arrives between a check and
//! `poll` still wakes the master.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::Signal;

/// The signals the master listens to.
#[derive(Debug)]
pub(crate) struct Signals {
    pub(super) wake: UnixStream,
    /// Every descriptor of the wake pipe (the read end and the write ends held by the
    /// signal handlers), for workers to close.
    wake_fds: Vec<RawFd>,
    pub(super) term: Arc<AtomicBool>,
    pub(super) int: Arc<AtomicBool>,
    pub(super) quit: Arc<AtomicBool>,
    pub(super) child: Arc<AtomicBool>,
    pub(super) reopen: Arc<AtomicBool>,
    pub(super) grow: Arc<AtomicBool>,
    pub(super) shrink: Arc<AtomicBool>,
    pub(super) reload: Arc<AtomicBool>,
    pub(super) upgrade: Arc<AtomicBool>,
    pub(super) other: Vec<(Signal, Arc<AtomicBool>)>,
}

impl Signals {
    /// Installs the master's handlers. Each sets a flag, then writes a byte to the wake
    /// pipe (signal-hook runs the actions in registration order).
    pub(crate) fn install() -> io::Result<Self> {
        let (wake, wake_write) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wake_write.set_nonblocking(true)?;
        let wake_write: OwnedFd = wake_write.into();
        let mut wake_fds = vec![wake.as_raw_fd()];
        let mut flag = |sig: Signal| -> io::Result<Arc<AtomicBool>> {
            let f = Arc::new(AtomicBool::new(false));
            signal_hook::flag::register(sig as i32, Arc::clone(&f))?;
            let write_end = wake_write.try_clone()?;
            wake_fds.push(write_end.as_raw_fd());
            signal_hook::low_level::pipe::register(sig as i32, write_end)?;
            Ok(f)
        };
        let term = flag(Signal::SIGTERM)?;
        let int = flag(Signal::SIGINT)?;
        let quit = flag(Signal::SIGQUIT)?;
        let child = flag(Signal::SIGCHLD)?;
        let reopen = flag(Signal::SIGUSR1)?;
        let grow = flag(Signal::SIGTTIN)?;
        let shrink = flag(Signal::SIGTTOU)?;
        let reload = flag(Signal::SIGHUP)?;
        let upgrade = flag(Signal::SIGUSR2)?;
        let other = [Signal::SIGWINCH]
            .into_iter()
            .map(|s| flag(s).map(|f| (s, f)))
            .collect::<io::Result<_>>()?;
        Ok(Signals {
            wake,
            wake_fds,
            term,
            int,
            quit,
            child,
            reopen,
            grow,
            shrink,
            reload,
            upgrade,
            other,
        })
    }

    /// Descriptors a worker must close after fork.
    pub(super) fn fds(&self) -> &[RawFd] {
        &self.wake_fds
    }

    pub(super) fn drain(&mut self) {
        let mut buf = [0u8; 64];
        while matches!(self.wake.read(&mut buf), Ok(n) if n > 0) {}
    }

    /// The first stop signal pending, if any.
    pub(super) fn take_stop(&self) -> Option<Signal> {
        [
            (Signal::SIGTERM, &self.term),
            (Signal::SIGINT, &self.int),
            (Signal::SIGQUIT, &self.quit),
        ]
        .into_iter()
        .fold(None, |found, (sig, flag)| {
            let raised = flag.swap(false, Ordering::SeqCst);
            found.or(raised.then_some(sig))
        })
    }
}

//! Forking a worker or a front: its slot, its recycling limits (with jitter), its log
//! channel, the master's descriptors it closes; and USR1's reopened log files, handed to
//! each worker through that channel.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};

use nix::sys::signal::{self, Signal};

use super::{Entry, Master, Worker};
use crate::control::{Control, MetricsListener};
use crate::error::Error;
use crate::peer_counts::PeerCounts;
use crate::scoreboard;
use crate::sys;
use crate::worker::{Recycle, Role};

impl<'a> Master<'a> {
    /// Forks worker (or front, `role`) into the first free slot, with its log channel and
    /// its share of the limits; the child runs `entry` and never returns.
    pub(super) fn spawn(&mut self, entry: &mut Entry<'_>, role: Role) -> Result<(), Error> {
        let Some(id) =
            (1..=scoreboard::MAX_WORKERS as u32).find(|id| !self.workers.values().any(|w| w.id == *id))
        else {
            return Err(Error::Config(format!(
                "more than {} workers",
                scoreboard::MAX_WORKERS
            )));
        };
        // Fronts hand requests over, they serve none: no request or connection limit.
        let recycle = match role {
            Role::Worker => self.draw_limits(),
            Role::Front => Recycle::default(),
        };
        let (logs, child_logs) =
            crate::process::reopen::pair().map_err(|e| Error::sys("creating a worker's log channel", e))?;
        if let Some(access) = &self.access_reopened {
            // Waits in the channel for the worker, which takes it before it is ready.
            if let Err(e) = crate::process::reopen::send(logs.as_fd(), None, Some(access.as_fd())) {
                tracing::warn!(
                    "worker {id} cannot be handed the reopened access log: {e}; it writes to the one \
                     opened at start"
                );
            }
        }
        let master_fds: Vec<RawFd> = self
            .signals
            .fds()
            .iter()
            .copied()
            // Not the wake-up eventfd: workers write to it.
            .chain(self.channel.read_fd())
            // The scoreboard's memfd: a forked worker has the mapping already (and a
            // re-executed one gets the descriptor through its handoff instead).
            .chain(crate::scoreboard::Board::memfd())
            .chain(self.peer_counts.map(PeerCounts::memfd))
            .chain(crate::penalty::memfd())
            .chain(self.settings.master_fds.iter().copied())
            .chain(self.settings.control.iter().flat_map(Control::raw_fds))
            .chain(self.settings.metrics.iter().flat_map(MetricsListener::raw_fds))
            .chain(self.upgrade.fds())
            // The master's ends of every log channel, this worker's too.
            .chain(
                self.workers
                    .values()
                    .filter_map(|w| w.logs.as_ref().map(AsRawFd::as_raw_fd)),
            )
            .chain(Some(logs.as_raw_fd()))
            .collect();
        let _ = io::stdout().flush();
        self.settings.board.claim(id, self.generation);
        // The child keeps its end of the log channel; the master's copy closes with the
        // closure, once `fork_child` returns in the master.
        let child = move || {
            crate::process::reopen::set_worker_end(child_logs);
            entry(id, role, recycle, &master_fds)
        };
        // SAFETY: the master is single-threaded for its whole life (it starts no thread and
        // uses no crate that does; `sys::fork` checks); the log writer is unbuffered and
        // stdout was flushed above; the child runs `entry`, which ends in `_exit`.
        let pid = match unsafe { sys::fork_child(child) } {
            Ok(pid) => pid,
            Err(e) => {
                self.settings.board.release(id);
                return Err(e);
            }
        };
        self.settings.board.set_pid(id, pid.as_raw() as u32);
        tracing::debug!(
            "started {} {id} (pid {pid})",
            if role == Role::Front { "front" } else { "worker" }
        );
        self.workers.insert(
            pid,
            Worker {
                logs: Some(logs),
                front: role == Role::Front,
                ..Worker::new(id, self.generation)
            },
        );
        Ok(())
    }

    /// This worker's limits: the configured ones plus a jitter from 0 to `--max-jitter`,
    /// so that workers started together do not all retire together.
    pub(super) fn draw_limits(&mut self) -> Recycle {
        let base = self.settings.limits.recycle;
        let jitter = self.settings.limits.jitter;
        Recycle {
            max_requests: self.jitter.draw(base.max_requests, jitter),
            max_connections: self.jitter.draw(base.max_connections, jitter),
        }
    }

    /// USR1: reopens the log file and the access log (after logrotate moved them away),
    /// then hands the new files to each worker through its log channel and signals it
    /// (`process/reopen.rs`): the files stay writable by the master's user alone. A file
    /// that cannot be reopened is kept as it was, by the master and the workers.
    pub(super) fn reopen_log(&mut self) {
        use crate::process::log::{open_log, redirect_stderr};
        let access = self
            .settings
            .access_log
            .as_ref()
            .and_then(|path| match open_log(path) {
                Ok(f) => {
                    tracing::info!("SIGUSR1 received: reopened the access log {}", path.display());
                    Some(f)
                }
                Err(e) => {
                    tracing::error!(
                        "SIGUSR1 received: cannot reopen the access log: {e}; still writing to the old one"
                    );
                    None
                }
            });
        let log = match &self.settings.log_file {
            None => {
                tracing::info!("SIGUSR1 received: no log file to reopen (logging to stderr)");
                false
            }
            Some(path) => match open_log(path)
                .and_then(|f| redirect_stderr(&f).map_err(|e| Error::sys("redirecting stderr", e)))
            {
                Ok(()) => {
                    tracing::info!("SIGUSR1 received: reopened the log file {}", path.display());
                    true
                }
                Err(e) => {
                    tracing::error!(
                        "SIGUSR1 received: cannot reopen the log file: {e}; still logging to the old one"
                    );
                    false
                }
            },
        };
        if let Some(f) = access {
            self.access_reopened = Some(f);
        }
        if !log && self.access_reopened.is_none() {
            return;
        }
        let stderr = io::stderr();
        let log_fd = log.then(|| stderr.as_fd());
        // Every access log reopen is handed over, also when only the log file was reopened
        // this time (the same file again: harmless), so that a worker that missed one
        // catches up.
        let access_fd = self.access_reopened.as_ref().map(AsFd::as_fd);
        for (pid, w) in &self.workers {
            let Some(channel) = &w.logs else { continue };
            match crate::process::reopen::send(channel.as_fd(), log_fd, access_fd) {
                Ok(()) => {
                    let _ = signal::kill(*pid, Signal::SIGUSR1);
                }
                Err(e) => tracing::warn!(
                    "worker {} (pid {pid}) cannot be handed the reopened log files: {e}; it keeps \
                     writing to the old ones",
                    w.id
                ),
            }
        }
    }
}

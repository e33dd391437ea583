//! The binary upgrade, as the old master drives it (USR2 or the `upgrade` subcommand): it
//! starts the binary now on disk as a new master with the listening sockets, the control
//! socket and the metrics listener (`process/handover.rs`), follows it until it is ready,
//! then drains its own workers and exits; if the new master fails, its whole process group
//! is killed and this master goes on serving.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use socket2::Socket;

use super::{Master, Phase, exit_reason};
use crate::error::Error;
use crate::net::listener::Listener;
use crate::process::handover::{self, Pending, Progress};

/// The binary and arguments a new master is started with, and how long it may take.
#[derive(Debug, Clone)]
pub(crate) struct UpgradeSettings {
    /// The working directory to start the new master in.
    pub(crate) dir: Option<PathBuf>,
    pub(crate) exe: Option<PathBuf>,
    /// The whole command line, `argv[0]` included: the new master gets the arguments after
    /// it, re-executed workers all of it.
    pub(crate) argv: Vec<std::ffi::OsString>,
    pub(crate) timeout: Duration,
    /// The descriptors the application keeps (`Server::keep_fd`): the new master inherits
    /// them, so the hand-over puts nothing at their numbers.
    pub(crate) keep_fds: Vec<std::os::fd::RawFd>,
}

/// The upgrade driver's state.
#[derive(Debug)]
pub(super) struct Upgrade {
    /// Duplicates of the control and metrics listening sockets, to hand to a new master
    /// (the originals are lent to the control dispatch while it answers, an upgrade
    /// request among others).
    sockets: (Option<Socket>, Option<Socket>),
    /// The upgrade in progress.
    pending: Option<Pending>,
    /// Who asked for the upgrade in progress ("by SIGUSR2", "through the control socket
    /// (…)"), for the log lines of its outcome.
    asked: String,
    /// The last upgrade that failed: the new master's pid and why.
    failed: Option<(i32, String)>,
    /// The sockets were handed to a new master: do not remove their files on exit.
    handed_over: bool,
}

impl Upgrade {
    /// An upgrade driver that will hand over these control and metrics listening sockets
    /// (duplicated now).
    pub(super) fn new(control: Option<&Socket>, metrics: Option<&Socket>) -> Result<Self, Error> {
        let dup = |s: Option<&Socket>| -> Result<Option<Socket>, Error> {
            s.map(|s| {
                s.try_clone()
                    .map_err(|e| Error::sys("duplicating a listening socket", e))
            })
            .transpose()
        };
        Ok(Upgrade {
            sockets: (dup(control)?, dup(metrics)?),
            pending: None,
            asked: String::new(),
            failed: None,
            handed_over: false,
        })
    }

    /// Starts the binary `settings` name as a new master, with `listeners`; returns its pid.
    pub(super) fn start(
        &mut self,
        from: &str,
        settings: &UpgradeSettings,
        listeners: &[Listener],
    ) -> Result<i32, String> {
        if let Some(u) = &self.pending {
            return Err(format!(
                "an upgrade is already in progress (new master pid {})",
                u.child
            ));
        }
        let exe = settings
            .exe
            .as_deref()
            .ok_or("the path of this program's binary is unknown")?;
        let new = handover::NewMaster {
            exe,
            dir: settings.dir.as_deref(),
            args: settings.argv.get(1..).unwrap_or_default(),
            keep: &settings.keep_fds,
            timeout: settings.timeout,
        };
        let pending = handover::launch(&new, listeners, self.sockets.0.as_ref(), self.sockets.1.as_ref())
            .map_err(|e| e.to_string())?;
        let pid = pending.child.as_raw();
        tracing::info!(
            "upgrade asked {from}: started {} as new master pid {pid}",
            exe.display()
        );
        self.pending = Some(pending);
        self.asked = from.to_owned();
        Ok(pid)
    }

    /// Follows the pending upgrade, if any. Returns true when the new master has just
    /// reported ready: the sockets are its own from now on, and this master must drain its
    /// workers. A failure is recorded (the new master's process group is killed) and this
    /// master goes on serving.
    pub(super) fn follow(&mut self) -> bool {
        let Some(u) = self.pending.as_mut() else {
            return false;
        };
        match u.progress() {
            Progress::Waiting => false,
            Progress::Ready => {
                let pid = u.child;
                self.pending = None;
                tracing::info!(
                    "upgrade asked {} done: new master pid {pid} is ready; draining this master's workers",
                    self.asked
                );
                self.handed_over = true;
                self.sockets = (None, None);
                true
            }
            Progress::Failed(why) => {
                let pid = u.child;
                // How it ended, if it has, seen without reaping it: its process group is
                // killed first (everything the new binary started, a wrapper script's
                // children too), while its zombie still holds the group's id.
                let ended = nix::sys::wait::waitid(
                    nix::sys::wait::Id::Pid(pid),
                    WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
                );
                u.kill_group();
                self.pending = None;
                // Reaped now if it has exited; if it is still dying, by `reap` (as a child
                // that is no worker).
                let _ = nix::sys::wait::waitpid(pid, Some(WaitPidFlag::WNOHANG));
                self.fail(pid, failure(why, ended.ok()));
                false
            }
        }
    }

    /// The new master `pid` exited with `reason` ("exited with status 1"): if it is the
    /// pending upgrade's, records the failure and returns true.
    pub(super) fn on_exit(&mut self, pid: Pid, reason: &str) -> bool {
        if self.pending_pid() != Some(pid.as_raw()) {
            return false;
        }
        // Its exit may be seen before the reason it wrote on the readiness pipe.
        let reported = self.pending.take().and_then(|mut u| u.reported_failure());
        let why = reported.unwrap_or_else(|| format!("the new master {reason} before it was ready"));
        self.fail(pid, why);
        true
    }

    fn fail(&mut self, pid: Pid, why: String) {
        tracing::error!(
            "upgrade asked {} failed: {why}; this master keeps serving",
            self.asked
        );
        self.failed = Some((pid.as_raw(), why));
    }

    /// Abandons the pending upgrade, if any (this master stops): kills the new master's
    /// whole process group and returns its pid.
    pub(super) fn abandon(&mut self) -> Option<Pid> {
        let u = self.pending.take()?;
        u.kill_group();
        Some(u.child)
    }

    /// The pending upgrade, if any.
    pub(super) fn pending(&self) -> Option<&Pending> {
        self.pending.as_ref()
    }

    /// The pending upgrade's new master.
    pub(super) fn pending_pid(&self) -> Option<i32> {
        self.pending.as_ref().map(|u| u.child.as_raw())
    }

    /// The last upgrade that failed: the new master's pid and why.
    pub(super) fn failed(&self) -> Option<(i32, &str)> {
        self.failed.as_ref().map(|(pid, why)| (*pid, why.as_str()))
    }

    /// Whether the sockets were handed to a new master.
    pub(super) fn handed_over(&self) -> bool {
        self.handed_over
    }

    /// When the pending upgrade needs a look (its deadline, or the wait for its exit).
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.pending.as_ref().map(Pending::deadline)
    }

    /// The new master's readiness pipe, for the master's `poll`.
    pub(super) fn poll_fd(&self) -> Option<BorrowedFd<'_>> {
        self.pending.as_ref().and_then(Pending::fd)
    }

    /// The driver's descriptors, which workers close after fork.
    pub(super) fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.sockets
            .0
            .iter()
            .chain(self.sockets.1.iter())
            .map(|s| s.as_raw_fd())
            .chain(self.poll_fd().map(|fd| fd.as_raw_fd()))
    }
}

/// Why an upgrade failed, from what `Pending::progress` said and how the new master ended
/// if it has (`ended`, seen with `waitid`): the pipe closes when the new master exits, so
/// its exit status is the better reason, unless it said why itself.
fn failure(why: String, ended: Option<WaitStatus>) -> String {
    match ended {
        _ if handover::is_reported(&why) => why,
        Some(WaitStatus::Exited(_, code)) => {
            format!("the new master {} before it was ready", exit_reason(code))
        }
        Some(WaitStatus::Signaled(_, sig, _)) => {
            format!(
                "the new master was killed by signal {} before it was ready",
                sig.as_str()
            )
        }
        _ => why,
    }
}

impl Master<'_> {
    /// Starts a binary upgrade asked `from` ("by SIGUSR2", "through the control socket
    /// (…)"): the binary now on disk, as a new master, with the sockets. A refusal is logged
    /// here, the start by the driver, the later outcome by `check_upgrade` and `reap`.
    pub(super) fn start_upgrade(&mut self, from: &str) -> Result<i32, String> {
        let result = if self.phase != Phase::Running {
            Err(format!("the server is {}", self.phase.name()))
        } else {
            self.upgrade.start(from, &self.settings.upgrade, self.listeners)
        };
        if let Err(e) = &result {
            tracing::error!("upgrade asked {from} failed: {e}; this master keeps serving");
        }
        result
    }

    /// Follows a pending upgrade: hands over once the new master is ready, gives up (and
    /// goes on serving) if it fails.
    pub(super) fn check_upgrade(&mut self) {
        if !self.upgrade.follow() {
            return;
        }
        // The listening sockets stay open (the new master serves them): no shutdown(2)
        // here, only the old workers leave, after their connections.
        self.settings.control = None;
        self.settings.metrics = None;
        self.stop_children();
        self.phase = Phase::stopping(self.settings.grace_period);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A pid no process can have (above the kernel's `PID_MAX_LIMIT`, 2^22): what the
    /// driver does to the new master (`killpg`, `waitid`, `waitpid`) reaches nothing.
    const NO_PROCESS: i32 = i32::MAX;

    /// A driver with a pending upgrade whose readiness pipe the test writes to.
    fn pending(timeout: Duration) -> (Upgrade, std::fs::File) {
        use nix::fcntl::OFlag;
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).unwrap();
        let control = Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).unwrap();
        let mut up = Upgrade::new(Some(&control), None).unwrap();
        up.pending = Some(Pending::for_tests(
            Pid::from_raw(NO_PROCESS),
            read.into(),
            timeout,
        ));
        (up, write.into())
    }

    fn settings() -> UpgradeSettings {
        UpgradeSettings {
            dir: None,
            exe: None,
            argv: Vec::new(),
            timeout: Duration::from_secs(60),
            keep_fds: Vec::new(),
        }
    }

    #[test]
    fn an_upgrade_needs_the_path_of_the_binary() {
        let mut up = Upgrade::new(None, None).unwrap();
        let e = up.start("SIGUSR2", &settings(), &[]).unwrap_err();
        assert_eq!(e, "the path of this program's binary is unknown");
        assert_eq!(up.pending_pid(), None);
        assert_eq!(up.failed(), None, "a refusal is not a failed upgrade");
    }

    #[test]
    fn a_second_upgrade_is_refused_while_one_is_pending() {
        let (mut up, _pipe) = pending(Duration::from_secs(60));
        let e = up.start("the control socket", &settings(), &[]).unwrap_err();
        assert_eq!(
            e,
            format!("an upgrade is already in progress (new master pid {NO_PROCESS})")
        );
        assert_eq!(up.pending_pid(), Some(NO_PROCESS));
    }

    #[test]
    fn the_new_master_ready_takes_the_sockets_over() {
        let (mut up, mut pipe) = pending(Duration::from_secs(60));
        assert!(!up.follow(), "nothing on the pipe yet: still waiting");
        assert_eq!(up.pending_pid(), Some(NO_PROCESS));
        assert!(up.deadline().is_some() && up.poll_fd().is_some());
        assert_eq!(up.fds().count(), 2, "the control socket's duplicate and the pipe");
        pipe.write_all(b"R").unwrap();
        assert!(up.follow(), "ready: this master must drain");
        assert!(up.handed_over());
        assert_eq!(up.pending_pid(), None);
        assert_eq!(up.fds().count(), 0, "the duplicates are the new master's now");
        assert_eq!(up.deadline(), None);
        assert!(!up.follow(), "the hand-over happens once");
    }

    #[test]
    fn a_failure_the_new_master_reports_is_kept_for_upgrade_status() {
        let (mut up, mut pipe) = pending(Duration::from_secs(60));
        pipe.write_all(b"Ecannot listen on 127.0.0.1:1: in use").unwrap();
        assert!(!up.follow());
        assert!(!up.handed_over(), "this master goes on serving");
        assert_eq!(up.pending_pid(), None);
        assert_eq!(
            up.failed(),
            Some((
                NO_PROCESS,
                "the new master could not start: cannot listen on 127.0.0.1:1: in use"
            ))
        );
        assert_eq!(up.fds().count(), 1, "the duplicates stay for the next attempt");
    }

    #[test]
    fn a_new_master_not_ready_in_time_fails_the_upgrade() {
        let (mut up, _pipe) = pending(Duration::ZERO);
        assert!(!up.follow());
        assert_eq!(up.pending_pid(), None);
        assert_eq!(
            up.failed(),
            Some((NO_PROCESS, "the new master was not ready in time"))
        );
    }

    #[test]
    fn the_new_masters_exit_before_it_is_ready_fails_the_upgrade() {
        let (mut up, _pipe) = pending(Duration::from_secs(60));
        assert!(
            !up.on_exit(Pid::from_raw(NO_PROCESS - 1), "exited"),
            "not the new master"
        );
        assert_eq!(up.pending_pid(), Some(NO_PROCESS));
        assert!(up.on_exit(Pid::from_raw(NO_PROCESS), "exited with status 1"));
        assert_eq!(up.pending_pid(), None);
        assert_eq!(
            up.failed(),
            Some((
                NO_PROCESS,
                "the new master exited with status 1 before it was ready"
            ))
        );
        // Its own reason, written before it exited, is the better message.
        let (mut up, mut pipe) = pending(Duration::from_secs(60));
        pipe.write_all(b"Ebad --user").unwrap();
        assert!(up.on_exit(Pid::from_raw(NO_PROCESS), "exited with status 1"));
        assert_eq!(
            up.failed(),
            Some((NO_PROCESS, "the new master could not start: bad --user"))
        );
    }

    #[test]
    fn an_abandoned_upgrade_is_no_failure() {
        let (mut up, _pipe) = pending(Duration::from_secs(60));
        assert_eq!(up.abandon(), Some(Pid::from_raw(NO_PROCESS)));
        assert_eq!(up.pending_pid(), None);
        assert_eq!(up.failed(), None);
        assert_eq!(up.abandon(), None);
    }

    #[test]
    fn a_failure_is_told_by_the_new_masters_report_then_its_exit() {
        let pid = Pid::from_raw(NO_PROCESS);
        let closed = "the new master closed its readiness pipe without being ready".to_owned();
        assert_eq!(
            failure(closed.clone(), Some(WaitStatus::Exited(pid, 3))),
            "the new master exited with status 3 before it was ready"
        );
        assert_eq!(
            failure(
                closed.clone(),
                Some(WaitStatus::Signaled(
                    pid,
                    nix::sys::signal::Signal::SIGSEGV,
                    false
                ))
            ),
            "the new master was killed by signal SIGSEGV before it was ready"
        );
        assert_eq!(failure(closed.clone(), None), closed, "still running");
        let reported = "the new master could not start: no such user".to_owned();
        assert_eq!(
            failure(reported.clone(), Some(WaitStatus::Exited(pid, 1))),
            reported
        );
    }
}

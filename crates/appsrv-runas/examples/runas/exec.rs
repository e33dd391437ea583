//! The `runas` example's execution of a command, in the helper: the child's set-up between
//! `fork` and `execve` (a session of its own, default signals, resource limits, the
//! user's groups, gid and uid, checked; the parent-death signal, the home directory, the
//! umask, descriptors closed on exec), the environment, the output read from both pipes
//! with `poll` until the command exits or times out, and the kill and reap of its whole
//! process group.
//!
//! It is a module of its own because its order is what makes it safe (the header of
//! `execute` says why the group is killed before the command is reaped), and because the
//! code between `fork` and `execve` has rules of its own (only async-signal-safe system
//! calls on data prepared before the fork; see `ChildSetup`). What each step defends
//! against is in docs/SECURITY.md.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::resource::Resource;
use nix::sys::signal::{self, SigSet, Signal};
use nix::unistd::{Gid, Pid, Uid};

use crate::policy::{Limits, Rule, Target};
use crate::protocol::Ran;

/// What is kept of each of stdout and stderr.
pub(crate) const OUTPUT_CAP: usize = 64 * 1024;

/// The first [`OUTPUT_CAP`] bytes of a stream, and how many there were in all.
pub(crate) struct Capture {
    kept: Vec<u8>,
    pub(crate) total: u64,
}

impl Capture {
    fn push(&mut self, bytes: &[u8]) {
        let room = OUTPUT_CAP - self.kept.len();
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.total += bytes.len() as u64;
    }

    fn truncated(&self) -> bool {
        self.total > self.kept.len() as u64
    }
}

pub(crate) struct Outcome {
    status: std::process::ExitStatus,
    timed_out: bool,
    /// A pipe was still open [`DRAIN_AFTER_KILL`] after the group was killed: a process
    /// that left the group holds it, and survived.
    pub(crate) held_open: bool,
    pub(crate) stdout: Capture,
    pub(crate) stderr: Capture,
    pub(crate) elapsed: Duration,
}

impl Outcome {
    pub(crate) fn describe(&self, timeout: Duration) -> String {
        match (self.timed_out, self.status.code(), self.status.signal()) {
            (true, _, _) => format!("killed after its timeout of {} s", timeout.as_secs_f64()),
            (false, Some(code), _) => format!("exit status {code}"),
            (false, None, Some(sig)) => format!("killed by signal {sig}"),
            _ => "ended".into(),
        }
    }

    pub(crate) fn into_ran(self) -> Ran {
        Ran {
            status: self.status.code().unwrap_or(-1),
            signal: self.status.signal().unwrap_or(0),
            timed_out: self.timed_out,
            stdout_truncated: self.stdout.truncated(),
            stderr_truncated: self.stderr.truncated(),
            stdout: self.stdout.kept,
            stderr: self.stderr.kept,
        }
    }
}

/// What the child does between `fork` and `execve`, prepared before the fork so that the
/// child only makes system calls: no allocation, no lock, nothing that is not
/// async-signal-safe (the helper's other threads, if any, may have held locks at fork).
struct ChildSetup {
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
    home: CString,
    /// The resource limits to set (soft, hard).
    rlimits: [(Resource, u64, u64); 6],
    /// The helper's pid: the child's parent, checked after the parent-death signal is set.
    parent: Pid,
    /// Where to stop marking descriptors close-on-exec if `close_range` is unavailable.
    max_fd: i32,
    /// The last signal number (SIGRTMAX).
    last_signal: i32,
}

impl ChildSetup {
    fn new(target: &Target, limits: Limits) -> ChildSetup {
        let max_fd = nix::sys::resource::getrlimit(Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| soft.min(65_536) as i32)
            .unwrap_or(1024);
        ChildSetup {
            uid: target.uid,
            gid: target.gid,
            groups: target.groups.clone(),
            home: CString::new(target.home.as_os_str().as_encoded_bytes()).unwrap_or_else(|_| c"/".into()),
            rlimits: rlimits(limits),
            parent: nix::unistd::getpid(),
            max_fd,
            last_signal: libc::SIGRTMAX(),
        }
    }

    /// Runs in the child after `fork`, before `execve` (std has already connected stdin,
    /// stdout and stderr, and the environment is passed to `execve` as prepared). Only
    /// async-signal-safe system calls; an error is reported to `spawn` by std, and the
    /// child exits without running the program.
    fn apply(&self) -> io::Result<()> {
        // A session and process group of its own: the timeout kills the whole group, and
        // the command has no controlling terminal and gets no signal meant for appsrv's
        // process group (a Ctrl-C on the master's terminal, say).
        nix::unistd::setsid()?;

        // Default dispositions for every signal, and an empty mask (dispositions set to
        // "ignore" and the mask survive exec). The helper (as its worker) catches TERM, INT, QUIT, USR1 and
        // others and ignores PIPE; and glibc's posix_spawn, which a service manager or a
        // shell may have started this program with, leaves its internal signal 32 ignored,
        // which glibc's sigaction refuses to touch. So this is the raw system call, with
        // an all-zero kernel `struct sigaction`: SIG_DFL, no flags, an empty mask. KILL
        // and STOP cannot change; the kernel refuses them and those past its last signal.
        for sig in 1..=self.last_signal {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let action = [0 as libc::c_ulong; 4];
            // SAFETY: rt_sigaction(2) is async-signal-safe; `action` is larger than the
            // kernel's struct sigaction, and all zeroes is SIG_DFL with no flags and an
            // empty mask, so no handler code is installed. 8 is the size of the kernel's
            // signal set (64 signals).
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    action.as_ptr(),
                    std::ptr::null_mut::<u8>(),
                    8usize,
                );
            }
        }
        signal::sigprocmask(signal::SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;

        // Resource limits, soft and hard, while still root (only root could raise a hard
        // limit again; the command cannot).
        for &(resource, soft, hard) in &self.rlimits {
            nix::sys::resource::setrlimit(resource, soft, hard)?;
        }

        // The identity, in the only order that works: groups, then gid, then uid (after
        // the uid change, the right to change groups is gone). std's `CommandExt::uid`
        // would clear the supplementary groups rather than set the user's.
        nix::unistd::setgroups(&self.groups)?;
        nix::unistd::setresgid(self.gid, self.gid, self.gid)?;
        nix::unistd::setresuid(self.uid, self.uid, self.uid)?;
        // Check it: all three uids and gids are the target's, and root cannot come back.
        let verified = nix::unistd::getresuid()
            .is_ok_and(|r| r.real == self.uid && r.effective == self.uid && r.saved == self.uid)
            && nix::unistd::getresgid()
                .is_ok_and(|r| r.real == self.gid && r.effective == self.gid && r.saved == self.gid)
            && nix::unistd::setuid(Uid::from_raw(0)).is_err()
            && nix::unistd::setgid(Gid::from_raw(0)).is_err();
        if !verified {
            return Err(io::Error::from_raw_os_error(libc::ENOTRECOVERABLE));
        }

        // Killed if the helper dies (set after the uid change, which clears it), and
        // checked: the worker may have died before it took effect.
        // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid are plain system calls.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != self.parent.as_raw() {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }

        // The home directory, as the user (a home the user cannot enter is not used), or
        // the root directory; and a umask that makes no file writable by others.
        // SAFETY: chdir and umask are plain system calls; both strings are NUL-terminated
        // and outlive the calls.
        unsafe {
            if libc::chdir(self.home.as_ptr()) != 0 && libc::chdir(c"/".as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            libc::umask(0o022);
        }

        // Every descriptor above stderr close-on-exec: appsrv's are already, but
        // descriptors a master inherited (from systemd, or its own parent) may not be.
        // Marking rather than closing keeps the pipe std uses to report a failed exec.
        const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
        // SAFETY: close_range(2) and fcntl(2) only change this process's descriptor flags.
        unsafe {
            if libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_CLOEXEC,
            ) != 0
            {
                // Before Linux 5.11: one descriptor at a time.
                for fd in 3..self.max_fd {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
        }
        Ok(())
    }
}

/// The resource limits of a command: the policy's, or the helper's own hard limit where
/// that is lower (a limit is only ever lowered). The CPU time's hard limit is one second
/// above the soft one: SIGXCPU first, then SIGKILL.
fn rlimits(l: Limits) -> [(Resource, u64, u64); 6] {
    let cap = |resource: Resource, soft: u64, hard: u64| {
        let max = nix::sys::resource::getrlimit(resource).map_or(u64::MAX, |(_, hard)| hard);
        (resource, soft.min(max), hard.min(max))
    };
    [
        cap(Resource::RLIMIT_CPU, l.cpu_secs, l.cpu_secs + 1),
        cap(Resource::RLIMIT_AS, l.memory_bytes, l.memory_bytes),
        cap(Resource::RLIMIT_FSIZE, l.file_bytes, l.file_bytes),
        cap(Resource::RLIMIT_NPROC, l.processes, l.processes),
        cap(Resource::RLIMIT_CORE, 0, 0),
        cap(Resource::RLIMIT_NOFILE, 256, 256),
    ]
}

/// How long the output pipes are still read once the command has ended (exited, or been
/// killed at its timeout) and its process group has been killed. The killed processes
/// close their ends as they die, within milliseconds, so this bounds only the case of a
/// process that left the group (`setsid`, `setpgid`) and still holds a pipe: the call
/// then answers this long after the command ended, with what was read, and the log says
/// so. A call takes at most the command's timeout plus this.
pub(crate) const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// Runs `rule`'s program as `target` with `args`, and collects its output.
///
/// The order matters: (1) read the output until the command (the group's leader) exits or
/// the timeout passes, learning of the exit without reaping it; (2) kill the whole process
/// group with SIGKILL, which ends what the command left running (`sh -c "daemon &"`, with
/// TERM and HUP ignored or not); (3) read what is left in the pipes until they close;
/// (4) reap the command. Until (4), the exited leader is a zombie that keeps its pid, which
/// is the group's id, from being reused by another process: so the kill in (2) can only
/// reach the command's own group. Killing after the reap could hit an unrelated group that
/// got the same number.
pub(crate) fn execute(rule: &Rule, target: &Target, args: &[&str]) -> io::Result<Outcome> {
    let mut cmd = Command::new(&rule.program);
    cmd.args(args)
        .env_clear()
        .env("HOME", &target.home)
        .env("USER", &target.name)
        .env("LOGNAME", &target.name)
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let setup = ChildSetup::new(target, rule.limits);
    // SAFETY: `apply` makes only async-signal-safe system calls on data prepared before
    // the fork (no allocation, no lock), as a pre_exec closure must.
    unsafe { cmd.pre_exec(move || setup.apply()) };
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let mut output = Output::take(&mut child);
    let ended = output.until_exit(&child, started + rule.timeout);
    // Exited, timed out or failed: the group goes, before the reap (see above).
    kill_group(&child);
    let drained = match ended {
        Ok(_) => output.drain(Instant::now() + DRAIN_AFTER_KILL),
        Err(_) => Ok(true),
    };
    // Always reaped, so no zombie is left, whatever failed.
    let status = child.wait();
    reap_group(&child);
    let timed_out = ended?;
    let closed = drained?;
    let [stdout, stderr] = output.captures;
    Ok(Outcome {
        status: status?,
        timed_out,
        held_open: !closed,
        stdout,
        stderr,
        elapsed: started.elapsed(),
    })
}

/// Kills the command's process group with SIGKILL: the command and everything it started,
/// unless they left the group. Called before the command is reaped, so its pid, which is
/// the group's id, cannot have been reused (see [`execute`]).
fn kill_group(child: &Child) {
    let pid = Pid::from_raw(child.id() as i32);
    let _ = signal::killpg(pid, Signal::SIGKILL);
    // The command itself, should it have left its group (it cannot: it leads its own
    // session, and a session leader cannot change its group; this is cheap insurance).
    let _ = signal::kill(pid, Signal::SIGKILL);
}

/// Reaps the rest of the command's killed process group: the processes the command started
/// in it were orphaned as it exited and, the helper being a child subreaper, became the
/// helper's children. Each was killed with the group, so the wait is short; once none is
/// left, what the helper still has as children left the group (`kill_leftovers`).
fn reap_group(child: &Child) {
    let group = Pid::from_raw(-(child.id() as i32));
    // Until ECHILD: no child of the helper is left in the group.
    while let Ok(_) | Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(group, None) {}
}

/// The command's stdout and stderr as they are read: the pipes still open, and what is
/// kept of each. One thread, `poll` on both pipes (and on a pidfd for the exit), so
/// neither pipe can fill up and block the command while the other is read.
struct Output {
    pipes: [Option<OwnedFd>; 2],
    captures: [Capture; 2],
    buf: Vec<u8>,
}

impl Output {
    fn take(child: &mut Child) -> Output {
        let empty = || Capture {
            kept: Vec::new(),
            total: 0,
        };
        Output {
            pipes: [
                child.stdout.take().map(OwnedFd::from),
                child.stderr.take().map(OwnedFd::from),
            ],
            captures: [empty(), empty()],
            buf: vec![0u8; 16 * 1024],
        }
    }

    /// Reads the output until the command exits (`false`) or `deadline` passes (`true`:
    /// it timed out), whether or not the pipes are still open: what the command left
    /// running may hold them open for ever. The command is not reaped.
    fn until_exit(&mut self, child: &Child, deadline: Instant) -> io::Result<bool> {
        // A pidfd (Linux 5.3) becomes readable when the child exits, without reaping it;
        // waitid says so for certain (see has_exited).
        // SAFETY: pidfd_open on our own unreaped child; a non-negative result is a new
        // descriptor that we own.
        let pidfd = unsafe {
            let fd = libc::syscall(libc::SYS_pidfd_open, child.id() as libc::pid_t, 0);
            (fd >= 0).then(|| OwnedFd::from_raw_fd(fd as i32))
        };
        let mut look = true;
        loop {
            if look && has_exited(child)? {
                return Ok(false);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(true);
            }
            let mut wait = deadline - now;
            if pidfd.is_none() {
                // No pidfd: look at the child every 50 ms.
                wait = wait.min(Duration::from_millis(50));
            }
            let exit_ready = self.step(pidfd.as_ref().map(|p| p.as_fd()), wait)?;
            look = pidfd.is_none() || exit_ready;
        }
    }

    /// Reads until both pipes are closed (`true`) or `until` passes (`false`: a process
    /// outside the killed group holds one; the rest of its output is not read).
    fn drain(&mut self, until: Instant) -> io::Result<bool> {
        while self.pipes.iter().any(Option::is_some) {
            let now = Instant::now();
            if now >= until {
                return Ok(false);
            }
            self.step(None, until - now)?;
        }
        Ok(true)
    }

    /// Waits at most `wait` for an open pipe or `exit` to be ready, and reads each ready
    /// pipe once (end of file closes it). Returns whether `exit` was ready.
    fn step(&mut self, exit: Option<std::os::fd::BorrowedFd<'_>>, wait: Duration) -> io::Result<bool> {
        let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
        let mut fds = Vec::with_capacity(3);
        let mut which = Vec::with_capacity(3);
        for (i, p) in self.pipes.iter().enumerate() {
            if let Some(p) = p {
                fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
                which.push(i);
            }
        }
        if let Some(fd) = exit {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
            which.push(2);
        }
        match nix::poll::poll(&mut fds, timeout) {
            // A stop signal interrupts poll (the worker's handlers have no SA_RESTART):
            // the command may finish, within its timeout, as the connection may.
            Err(nix::errno::Errno::EINTR) => return Ok(false),
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let ready: Vec<usize> = fds
            .iter()
            .zip(&which)
            .filter(|(fd, _)| fd.revents().is_some_and(|r| !r.is_empty()))
            .map(|(_, &i)| i)
            .collect();
        drop(fds);
        let mut exit_ready = false;
        for i in ready {
            if i == 2 {
                exit_ready = true;
                continue;
            }
            let read = nix::unistd::read(self.pipes[i].as_ref().expect("a polled pipe"), &mut self.buf);
            match read {
                Ok(0) => self.pipes[i] = None,
                Ok(n) => self.captures[i].push(&self.buf[..n]),
                Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(exit_ready)
    }
}

/// Whether the child has exited, from `waitid(P_PID, pid, WEXITED | WNOHANG | WNOWAIT)`:
/// without reaping it (`WNOWAIT`), so that its pid stays ours and its group can still be
/// killed safely.
fn has_exited(child: &Child) -> io::Result<bool> {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(Pid::from_raw(child.id() as i32)), flags) {
        Ok(WaitStatus::StillAlive) => Ok(false),
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

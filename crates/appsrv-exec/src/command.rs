//! Starting COMMAND, and ending it with everything it started.
//!
//! The child's set-up before `execve` follows the `runas` example's
//! (`crates/appsrv-runas/examples/runas/exec.rs`): a session and process group of its own,
//! default signal dispositions and an empty mask, the resource limits, the parent-death
//! signal, every descriptor but 0, 1 and 2 closed on exec. Unlike `runas`, the command keeps
//! the worker's identity (appsrv's `--user` dropped the worker already) and environment,
//! and it is started with `clone(CLONE_VM | CLONE_VFORK)` rather than `fork` (see
//! [`spawn`]): a command per connection makes the start the cost that matters.
//!
//! The end is in the order `runas` found safe: learn that the leader exited without
//! reaping it ([`Running::has_exited`]), kill the whole group while the leader's pid (the
//! group's id) is still ours, then reap the leader and what it left in the group, which the
//! worker, a child subreaper, inherited.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::resource::Resource;
use nix::sys::signal::{self, SigSet, Signal};
use nix::unistd::Pid;

/// How long a command that is still running when its connection ends gets between TERM and
/// KILL.
pub(crate) const TERM_GRACE: Duration = Duration::from_millis(200);

/// What to run and how: the program, its arguments and its limits.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// The program, as resolved at start: an absolute path (issue 41: a daemon changes to
    /// `/`, where `./script.sh` names nothing).
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    /// The command's working directory (`--chdir`, by default the directory the server
    /// was started in), absolute.
    pub(crate) dir: PathBuf,
    /// `RLIMIT_CPU` in seconds (soft; the hard limit is one more: SIGXCPU, then SIGKILL).
    pub(crate) rlimit_cpu: Option<u64>,
    /// `RLIMIT_NPROC`.
    pub(crate) rlimit_nproc: Option<u64>,
}

/// Finds `program` as `execvp` would (a name without `/` in `PATH`) and checks that it is
/// an executable file, so that a typo stops the server at start rather than fail every
/// connection. The path returned is absolute, resolved against the working directory now
/// (`start` runs here; the daemon it becomes runs in `/`).
pub(crate) fn resolve(program: &Path) -> Result<PathBuf, String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let check = |p: &Path| -> Result<PathBuf, String> {
        let meta = std::fs::metadata(p).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => format!("command {}: no such file", p.display()),
            _ => format!("command {}: {e}", p.display()),
        })?;
        if !meta.is_file() {
            return Err(format!("command {}: not a regular file", p.display()));
        }
        if meta.permissions().mode() & 0o111 == 0 {
            return Err(format!(
                "command {}: not executable (no x permission)",
                p.display()
            ));
        }
        std::path::absolute(p).map_err(|e| format!("command {}: {e}", p.display()))
    };
    if program.as_os_str().as_bytes().contains(&b'/') {
        return check(program);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| check(p).is_ok())
        .ok_or_else(|| format!("command {}: not found in PATH", program.display()))
}

/// Checks the command's working directory `dir` (absolute) at start: a directory that the
/// workers' user (`identity`; `None`: the master's own) can enter, every directory above
/// it included, judged by the permission bits (ACLs are not read). A command that cannot
/// change to it could not start, at every connection.
pub(crate) fn check_dir(dir: &Path, identity: Option<&appsrv::WorkerIdentity>) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir).map_err(|e| format!("--chdir {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("--chdir {}: not a directory", dir.display()));
    }
    let Some(id) = identity else {
        return nix::unistd::access(dir, nix::unistd::AccessFlags::X_OK)
            .map_err(|e| format!("--chdir {}: {}", dir.display(), e.desc()));
    };
    for d in dir.ancestors() {
        let m =
            std::fs::metadata(d).map_err(|e| format!("--chdir {}: {}: {e}", dir.display(), d.display()))?;
        let bit = if m.uid() == id.uid {
            0o100
        } else if m.gid() == id.gid || id.groups.contains(&m.gid()) {
            0o010
        } else {
            0o001
        };
        if m.mode() & bit == 0 {
            return Err(format!(
                "the command's working directory {} cannot be entered by the workers' user {} ({} has mode {:o}) (give --chdir DIR, a directory it can enter)",
                dir.display(),
                id.user,
                d.display(),
                m.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// The directories of the system's programs, their libraries and loaders: what a command
/// may execute under `--sandbox`, besides its own program (a shell script runs `cat`,
/// `head`, `rev`...; an ELF program's loader is executed by the kernel too).
const SYSTEM_PROGRAMS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/opt"];

/// The workers' sandbox profile (`--sandbox`), which the commands inherit, as a command
/// needs it: the default profile's system calls (no new network socket, no `ptrace`, no
/// `mount`, no identity change...) plus process creation (starting the command, and the
/// command's own children); Landlock rules that let it read what its user may read (the
/// user's permissions still apply), write only `/dev/null` and the `--sandbox-write`
/// paths, and execute only `program` and the system's programs ([`SYSTEM_PROGRAMS`]).
/// Checked by running `sh`, `php` and `python3` commands under it (`tests/exec.rs`).
pub(crate) fn sandbox_profile(program: &Path) -> appsrv::Sandbox {
    let mut profile = appsrv::Sandbox::new()
        .allow_process_creation()
        .read("/")
        .write("/dev/null");
    // A missing directory would make every worker fail to start; a directory reached
    // through a link (/bin -> usr/bin) is given as the one it names.
    let mut execute: Vec<PathBuf> = SYSTEM_PROGRAMS
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    if let Ok(real) = std::fs::canonicalize(program) {
        execute.push(real);
    }
    execute.sort();
    execute.dedup();
    for path in execute {
        profile = profile.execute(path);
    }
    profile
}

/// What the child does between `clone` and `execve`, prepared by the parent: only system
/// calls, no allocation, no lock (the child runs in the parent's memory).
#[derive(Clone, Copy)]
struct ChildSetup {
    /// The working directory, a NUL-terminated string the parent keeps alive.
    dir: *const libc::c_char,
    rlimit_cpu: Option<u64>,
    rlimit_nproc: Option<u64>,
    /// The worker's pid, checked after the parent-death signal is set.
    parent: libc::pid_t,
    last_signal: i32,
}

impl ChildSetup {
    fn apply(&self) -> io::Result<()> {
        // A session and process group of its own: the whole group is killed at the end,
        // and no signal meant for appsrv's group (a Ctrl-C on the master's terminal)
        // reaches it.
        nix::unistd::setsid()?;
        // Default dispositions and an empty mask: the worker catches TERM, INT, QUIT, HUP
        // and others and ignores PIPE; "ignore" and the mask survive exec. The raw system
        // call with an all-zero kernel sigaction (SIG_DFL, no flags, empty mask), since
        // glibc refuses to touch its internal signals; KILL and STOP cannot change.
        for sig in 1..=self.last_signal {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let action = [0 as libc::c_ulong; 4];
            // SAFETY: rt_sigaction(2) is async-signal-safe; `action` is larger than the
            // kernel's struct sigaction and all zeroes is SIG_DFL with no flags and an
            // empty mask. 8 is the size of the kernel's signal set.
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
        if let Some(cpu) = self.rlimit_cpu {
            nix::sys::resource::setrlimit(Resource::RLIMIT_CPU, cpu, cpu.saturating_add(1))?;
        }
        if let Some(n) = self.rlimit_nproc {
            nix::sys::resource::setrlimit(Resource::RLIMIT_NPROC, n, n)?;
        }
        // Killed if the worker dies (a worker killed at --grace-period or by the master's
        // --request-timeout cannot end the group itself), and checked: the worker may have
        // died before it took effect.
        // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid are plain system calls.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != self.parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        // SAFETY: `dir` is a NUL-terminated string the parent keeps until clone returns.
        if unsafe { libc::chdir(self.dir) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // Every descriptor above stderr close-on-exec: appsrv's are already, but what the
        // master inherited (from a service manager or a shell) may not be. Marking rather
        // than closing keeps the pipe std uses to report a failed exec.
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
                // Before Linux 5.11: one at a time, up to a bound.
                for fd in 3..65_536 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
        }
        Ok(())
    }
}

/// Environment variables the command must not inherit from the master: socket activation
/// and readiness notification are the server's, not the command's.
const NOT_INHERITED: [&str; 5] = [
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
];

/// A started command: the leader of its own process group, its pipes, and the pidfd that
/// says when it exits.
#[derive(Debug)]
pub(crate) struct Running {
    pid: Pid,
    pub(crate) stdin: Option<OwnedFd>,
    pub(crate) stdout: Option<OwnedFd>,
    pub(crate) stderr: Option<OwnedFd>,
    /// Readable once the leader exits (Linux 5.3); without it, exits are seen by polling.
    pidfd: Option<OwnedFd>,
    pub(crate) started: Instant,
    /// The group was killed and everything reaped.
    ended: bool,
}

/// The size of the stack the child runs on until it calls `execve` (see [`spawn`]).
const CHILD_STACK: usize = 256 * 1024;

/// What the child needs between `clone` and `execve`, prepared by the parent: pointers
/// into memory the parent keeps until `clone` returns, which is after the `execve`.
struct ChildArgs {
    setup: ChildSetup,
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// The child's standard input, output and error.
    stdio: [libc::c_int; 3],
    /// The errno of what failed before `execve` succeeded (0: it succeeded).
    error: libc::c_int,
}

/// The child, on its own stack in the parent's memory (`CLONE_VM`), while the parent waits
/// (`CLONE_VFORK`) until it calls `execve` or exits: only system calls, on data the parent
/// prepared. Its signals are all blocked (the parent's mask, inherited) until
/// [`ChildSetup::apply`] has reset every disposition to the default: none of the worker's
/// handlers can run on this stack.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` that `spawn` passed to clone; the parent does not
    // touch it until this child has called execve or exited.
    let args = unsafe { &mut *(arg as *mut ChildArgs) };
    for (target, &fd) in args.stdio.iter().enumerate() {
        let target = target as libc::c_int;
        // SAFETY: dup2 and fcntl on descriptors of this process.
        let r = unsafe {
            if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, target)
            }
        };
        if r < 0 {
            args.error = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
            // SAFETY: _exit ends this child without running anything of the parent's.
            unsafe { libc::_exit(127) };
        }
    }
    if let Err(e) = args.setup.apply() {
        args.error = e.raw_os_error().unwrap_or(libc::EIO);
        // SAFETY: as above.
        unsafe { libc::_exit(127) };
    }
    // SAFETY: the program, argv and envp are NUL-terminated strings and null-terminated
    // arrays that the parent keeps alive until clone returns.
    unsafe { libc::execve(args.program, args.argv, args.envp) };
    args.error = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
    // SAFETY: as above.
    unsafe { libc::_exit(127) }
}

/// A pipe, both ends close-on-exec: (read, write).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

/// Starts `program` with `argv` and `envp` as a child set up by `setup`, its standard
/// input, output and error the given descriptors; returns its pid.
///
/// With `clone(CLONE_VM | CLONE_VFORK)`, as glibc's `posix_spawn` does, rather than
/// `fork`: the worker's page tables are not copied and no page is copied on write, which
/// is most of what a fork costs a command per connection. posix_spawn itself cannot set
/// the parent-death signal, nor resource limits for the child alone.
fn spawn(
    setup: ChildSetup,
    program: &CString,
    argv: &[CString],
    envp: &[CString],
    stdio: [&OwnedFd; 3],
) -> io::Result<Pid> {
    let argv_ptrs: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp_ptrs: Vec<*const libc::c_char> = envp
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let mut args = ChildArgs {
        setup,
        program: program.as_ptr(),
        argv: argv_ptrs.as_ptr(),
        envp: envp_ptrs.as_ptr(),
        stdio: stdio.map(std::os::fd::AsRawFd::as_raw_fd),
        error: 0,
    };
    let mut stack: Vec<u8> = Vec::with_capacity(CHILD_STACK);
    // The stack grows down from its end, aligned to 16 bytes.
    let top = ((stack.as_mut_ptr() as usize + CHILD_STACK) & !15) as *mut libc::c_void;
    // Every signal blocked across the clone, so that the child runs no handler of the
    // worker's before it has reset them (see child_main).
    let all = SigSet::all();
    let mut saved = SigSet::empty();
    signal::pthread_sigmask(signal::SigmaskHow::SIG_SETMASK, Some(&all), Some(&mut saved))?;
    // SAFETY: child_main only makes system calls on `args`, which lives until clone
    // returns, and the parent is suspended until the child calls execve or exits
    // (CLONE_VFORK), so the child has the shared memory (CLONE_VM) and `stack` to itself.
    let pid = unsafe {
        libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &mut args as *mut ChildArgs as *mut libc::c_void,
        )
    };
    let cloned = io::Error::last_os_error();
    let _ = signal::pthread_sigmask(signal::SigmaskHow::SIG_SETMASK, Some(&saved), None);
    drop(stack);
    if pid < 0 {
        return Err(cloned);
    }
    let pid = Pid::from_raw(pid);
    if args.error != 0 {
        // It exited without running the program: reaped here.
        while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(pid, None) {}
        return Err(io::Error::from_raw_os_error(args.error));
    }
    Ok(pid)
}

/// The environment of a command: the worker's, without [`NOT_INHERITED`] and the names
/// `env` sets, then `env`.
fn environment(env: &[(&str, String)]) -> Vec<CString> {
    use std::os::unix::ffi::OsStrExt;
    let mut out: Vec<CString> = std::env::vars_os()
        .filter(|(name, _)| {
            let name = name.as_bytes();
            !NOT_INHERITED.iter().any(|n| n.as_bytes() == name)
                && !env.iter().any(|(n, _)| n.as_bytes() == name)
        })
        .filter_map(|(name, value)| {
            let mut entry = name.as_bytes().to_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            CString::new(entry).ok()
        })
        .collect();
    out.extend(
        env.iter()
            .filter_map(|(n, v)| CString::new(format!("{n}={v}")).ok()),
    );
    out
}

impl Running {
    /// Starts `spec` with `env` added, its standard input, output and error piped (the
    /// worker's ends non-blocking).
    pub(crate) fn start(spec: &Spec, env: &[(&str, String)]) -> io::Result<Running> {
        use std::os::unix::ffi::OsStrExt;
        let cstring = |s: &std::ffi::OsStr| {
            CString::new(s.as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the command"))
        };
        let program = cstring(spec.program.as_os_str())?;
        let mut argv = vec![program.clone()];
        for a in &spec.args {
            argv.push(cstring(a)?);
        }
        let envp = environment(env);
        let (stdin_r, stdin_w) = pipe()?;
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        for fd in [&stdin_w, &stdout_r, &stderr_r] {
            set_nonblocking(fd.as_fd())?;
        }
        let dir = cstring(spec.dir.as_os_str())?;
        let setup = ChildSetup {
            dir: dir.as_ptr(),
            rlimit_cpu: spec.rlimit_cpu,
            rlimit_nproc: spec.rlimit_nproc,
            parent: nix::unistd::getpid().as_raw(),
            last_signal: libc::SIGRTMAX(),
        };
        let pid = spawn(setup, &program, &argv, &envp, [&stdin_r, &stdout_w, &stderr_w])?;
        // The child's ends are the child's alone now.
        drop((stdin_r, stdout_w, stderr_w));
        // SAFETY: pidfd_open on our own unreaped child; a non-negative result is a new
        // descriptor (close-on-exec by definition) that we own.
        let pidfd = unsafe {
            let fd = libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0);
            (fd >= 0).then(|| OwnedFd::from_raw_fd(fd as i32))
        };
        Ok(Running {
            pid,
            stdin: Some(stdin_w),
            stdout: Some(stdout_r),
            stderr: Some(stderr_r),
            pidfd,
            started: Instant::now(),
            ended: false,
        })
    }

    pub(crate) fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    /// The pidfd, to poll beside the pipes (readable once the command exits).
    pub(crate) fn exit_fd(&self) -> Option<BorrowedFd<'_>> {
        self.pidfd.as_ref().map(|p| p.as_fd())
    }

    /// Whether the leader has exited, from `waitid(WNOWAIT)`: without reaping it, so that
    /// its pid, the group's id, stays ours until the group is killed.
    pub(crate) fn has_exited(&self) -> bool {
        use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        !matches!(
            waitid(Id::Pid(self.pid), flags),
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR)
        )
    }

    /// Ends the command and everything it started in its group: TERM and up to `grace`
    /// for the leader to exit if it is still running, then KILL to the whole group (which
    /// ends what it left in the background), then the reap of the leader and of the
    /// group's other processes. Returns the leader's exit status, described for a log line.
    pub(crate) fn end(&mut self, grace: Duration) -> String {
        if self.ended {
            return "ended".into();
        }
        self.ended = true;
        // The pipes first: a command blocked writing to a full pipe gets EPIPE at once.
        self.stdin = None;
        self.stdout = None;
        self.stderr = None;
        let pgid = self.pid;
        if !grace.is_zero() && !self.has_exited() {
            let _ = signal::killpg(pgid, Signal::SIGTERM);
            let deadline = Instant::now() + grace;
            while !self.has_exited() && Instant::now() < deadline {
                self.wait_exit(deadline - Instant::now());
            }
        }
        // Before the reap: the leader, a zombie at worst, keeps the group's id ours.
        let _ = signal::killpg(pgid, Signal::SIGKILL);
        let _ = signal::kill(pgid, Signal::SIGKILL);
        let status = loop {
            match nix::sys::wait::waitpid(self.pid, None) {
                Err(nix::errno::Errno::EINTR) => continue,
                other => break other,
            }
        };
        // What the group left is the worker's now (a child subreaper), and was killed:
        // reap it until none of the worker's children is left in the group.
        while let Ok(_) | Err(nix::errno::Errno::EINTR) =
            nix::sys::wait::waitpid(Pid::from_raw(-pgid.as_raw()), None)
        {}
        match status {
            Ok(s) => describe(s),
            Err(e) => format!("not reaped: {e}"),
        }
    }

    /// Waits up to `wait` for the leader's exit (on the pidfd, or a short sleep without).
    fn wait_exit(&self, wait: Duration) {
        match &self.pidfd {
            Some(fd) => {
                let mut fds = [nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN)];
                let _ = nix::poll::poll(&mut fds, poll_timeout(wait));
            }
            // Polling a condition without a pidfd (Linux before 5.3), not synchronising.
            None => std::thread::sleep(wait.min(Duration::from_millis(10))),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.end(Duration::ZERO);
    }
}

/// An exit status for a log line.
pub(crate) fn describe(status: nix::sys::wait::WaitStatus) -> String {
    use nix::sys::wait::WaitStatus;
    match status {
        WaitStatus::Exited(_, code) => format!("exit status {code}"),
        WaitStatus::Signaled(_, sig, _) => format!("killed by signal {} ({})", sig as i32, sig.as_str()),
        _ => "ended".into(),
    }
}

/// Makes the worker the reaper of what its commands leave when they exit (their orphans
/// come to it rather than to init), so that [`Running::end`] reaps them: nothing is left,
/// not even a zombie, in a container whose init does not reap.
pub(crate) fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) only sets a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reaps any child that has exited: processes that left their command's group (their own
/// `setsid`) and died since, which came to the worker as its subreaper. Only where the
/// worker has no other child to wait for (connection mode, between connections).
pub(crate) fn reap_strays() {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    while let Ok(s) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if s == WaitStatus::StillAlive {
            break;
        }
    }
}

pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// A poll timeout for `wait`, rounded up to a millisecond (so that a deadline a fraction of
/// a millisecond away is not a busy loop).
pub(crate) fn poll_timeout(wait: Duration) -> nix::poll::PollTimeout {
    let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    nix::poll::PollTimeout::try_from(ms).unwrap_or(nix::poll::PollTimeout::MAX)
}

/// Reads once from a non-blocking descriptor: `Ok(None)` when it would block.
pub(crate) fn read_some(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        match nix::unistd::read(fd, buf) {
            Ok(n) => return Ok(Some(n)),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes once to a non-blocking descriptor: `Ok(None)` when it would block.
pub(crate) fn write_some(fd: &OwnedFd, buf: &[u8]) -> io::Result<Option<usize>> {
    loop {
        match nix::unistd::write(fd, buf) {
            Ok(n) => return Ok(Some(n)),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The command's standard error, logged a line at a time with a prefix (the client).
#[derive(Debug, Default)]
pub(crate) struct StderrLines {
    partial: Vec<u8>,
}

/// A line longer than this is logged in pieces.
const MAX_LOG_LINE: usize = 4096;

impl StderrLines {
    /// Logs each complete line of `bytes` (and the rest, past [`MAX_LOG_LINE`]).
    pub(crate) fn push(&mut self, bytes: &[u8], who: &dyn std::fmt::Display) {
        self.partial.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(nl) = self.partial[start..].iter().position(|b| *b == b'\n') {
            log_line(&self.partial[start..start + nl], who);
            start += nl + 1;
        }
        self.partial.drain(..start);
        while self.partial.len() >= MAX_LOG_LINE {
            let rest = self.partial.split_off(MAX_LOG_LINE);
            log_line(&self.partial, who);
            self.partial = rest;
        }
    }

    /// Logs what is left without its newline.
    pub(crate) fn finish(&mut self, who: &dyn std::fmt::Display) {
        if !self.partial.is_empty() {
            log_line(&std::mem::take(&mut self.partial), who);
        }
    }

    /// Reads what `fd` has (non-blocking) and logs it; `false` at end of file.
    pub(crate) fn drain(&mut self, fd: &OwnedFd, who: &dyn std::fmt::Display) -> bool {
        let mut buf = [0u8; 4096];
        loop {
            match read_some(fd, &mut buf) {
                Ok(Some(0)) | Err(_) => return false,
                Ok(Some(n)) => self.push(&buf[..n], who),
                Ok(None) => return true,
            }
        }
    }
}

fn log_line(line: &[u8], who: &dyn std::fmt::Display) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    tracing::warn!("{who}: stderr: {}", String::from_utf8_lossy(line));
}

//! The worker sandbox (`--sandbox`): Landlock for files, seccomp for system calls.
//!
//! Applied in each worker after the privilege drop and `PR_SET_NO_NEW_PRIVS`, and before the
//! `on_worker_start` hook and the handler factory, so the application's code runs confined
//! from its first line. The master stays unconfined: it binds, forks, reads certificates,
//! reopens logs and starts new binaries, none of which a worker needs.
//!
//! **Files (Landlock).** A sandboxed worker may read only beneath the paths given with
//! [`Sandbox::read`] (`--sandbox-read`), write only beneath [`Sandbox::write`]
//! (`--sandbox-write`; not the log directories: a worker never opens the log files, the
//! master hands it the reopened ones after USR1), and execute only the programs given with
//! [`Sandbox::execute`]. Descriptors opened before the sandbox or received later
//! (listeners, the logs, the scoreboard) keep working. Paths are resolved in the worker, after `--chroot`. On a
//! kernel without Landlock (before 5.13, or with Landlock disabled) the file rules are
//! skipped with a warning (best effort); the seccomp filter still applies.
//!
//! **System calls (seccomp).** The default allow-list holds what a worker serving
//! connections uses: reading and writing sockets and files it may open, accepting on its
//! listeners, waiting (`poll`, `epoll`), memory, time, signals, threads (`clone` only with
//! `CLONE_THREAD`; `clone3` answers `ENOSYS` so that the C library falls back to `clone`),
//! random numbers (TLS), `tgkill` (`abort` signals the process itself; Landlock's signal
//! scope, Linux 6.12, keeps it from reaching processes outside the worker). Not allowed by
//! default, among others: creating sockets (`socket`, `socketpair`), `connect`, `bind`,
//! `listen`, `execve`, `fork` (a `clone` without `CLONE_THREAD`), `kill`, `ptrace`,
//! `mount`, `chroot`, `setuid` and its kin, `bpf`, `unshare`, `setns`, `keyctl`,
//! `perf_event_open`. A forbidden call fails with `EPERM` rather than
//! killing the worker, so a profile that lacks a call the application needs shows up as an
//! error in the log, not as a crash loop. Extend the list with
//! [`Sandbox::allow_syscall`] (`appsrv::Sandbox::new().allow_syscall(libc::SYS_connect)`).
//!
//! Commands a sandboxed worker starts inherit its confinement (seccomp filters and Landlock
//! domains are inherited across `fork` and `execve`), so a worker that runs commands needs
//! `execve`, `clone` without `CLONE_THREAD` and the programs themselves in its profile.

use std::collections::BTreeMap;
use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    Scope, path_beneath_rules,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

/// The Landlock ABI whose rights are asked for (Linux 6.12); older kernels get what they
/// support.
const LANDLOCK_ABI: ABI = ABI::V6;

/// Makes the relative paths of `list` absolute, as [`Sandbox::absolute`] does (also for
/// `--sandbox-read` and `--sandbox-write`).
pub(crate) fn absolute_paths(list: &mut [PathBuf], chroot: bool) -> Result<(), String> {
    for path in list.iter_mut().filter(|p| p.is_relative()) {
        if chroot {
            return Err(format!(
                "sandbox path {}: relative, and the workers chroot (--chroot): give it as the workers see it, absolute inside the chroot",
                path.display()
            ));
        }
        *path = std::path::absolute(&*path).map_err(|e| format!("sandbox path {}: {e}", path.display()))?;
    }
    Ok(())
}

/// A worker sandbox profile: the default one extended with paths and system calls. Used
/// with [`Server::sandbox`](crate::Server::sandbox) and `--sandbox`.
///
/// The default profile lets a worker open no file (descriptors it holds keep working:
/// listeners, connections, logs) and make the system calls that serving connections takes;
/// it forbids, among others, `socket`, `connect`, `bind`, `execve`, `fork`, `kill`,
/// `ptrace`, `mount` and identity changes, which fail with `EPERM`. `docs/SECURITY.md`
/// lists it in full. Files are confined with Landlock (best effort: skipped with a warning
/// on kernels without it), system calls with a seccomp filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sandbox {
    read: Vec<PathBuf>,
    write: Vec<PathBuf>,
    execute: Vec<PathBuf>,
    syscalls: Vec<i64>,
}

impl Sandbox {
    /// The default profile: no file may be opened, the default system calls.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets the worker read files and list directories beneath `path`.
    pub fn read(mut self, path: impl Into<PathBuf>) -> Self {
        self.read.push(path.into());
        self
    }

    /// Lets the worker read, write, create and remove files beneath `path`.
    pub fn write(mut self, path: impl Into<PathBuf>) -> Self {
        self.write.push(path.into());
        self
    }

    /// Lets the worker (and the commands it starts) execute the program at `path` (or the
    /// programs beneath a directory). Also allow `execve` and process creation with
    /// [`allow_process_creation`](Sandbox::allow_process_creation).
    pub fn execute(mut self, path: impl Into<PathBuf>) -> Self {
        self.execute.push(path.into());
        self
    }

    /// Allows one more system call, by number (`libc::SYS_connect`).
    pub fn allow_syscall(mut self, number: i64) -> Self {
        self.syscalls.push(number);
        self
    }

    /// Allows what starting a command takes: `fork` (a `clone` without `CLONE_THREAD`,
    /// and the `fork` and `vfork` system calls),
    /// `execve`, waiting for the child, the identity and limit changes a child makes
    /// before `execve` (`setgroups`, `setresgid`, `setresuid`, `setrlimit`, `chdir`), and
    /// `socketpair`, which std's `Command::spawn` uses (with `pre_exec`) to learn that an
    /// `execve` failed; a socket pair reaches nothing outside the process.
    ///
    /// Landlock checks `execve`, not the mapping of executable code: a command that can be
    /// made to run the dynamic loader on a file (`ld-linux.so PROGRAM`) runs any program it
    /// can read. Allow the loader's execution only as a program's interpreter, never as a
    /// command of its own.
    pub fn allow_process_creation(mut self) -> Self {
        self.syscalls.extend(PROCESS_CREATION);
        self.syscalls.push(FORK_MARKER);
        self
    }

    /// Adds the paths of the command line (`--sandbox-read`, `--sandbox-write`).
    pub(crate) fn with_paths(mut self, read: &[PathBuf], write: &[PathBuf]) -> Self {
        self.read.extend(read.iter().cloned());
        self.write.extend(write.iter().cloned());
        self
    }

    /// Makes every relative path absolute against the working directory now (issue 41: a
    /// daemon changes to `/` before its workers apply the profile, where `./data` would
    /// name `/data`). Under `--chroot` (`chroot`), the paths are the workers' view, inside
    /// the chroot: a relative one is refused, since it can name nothing certain there.
    pub(crate) fn absolute(mut self, chroot: bool) -> Result<Self, String> {
        for list in [&mut self.read, &mut self.write, &mut self.execute] {
            absolute_paths(list, chroot)?;
        }
        Ok(self)
    }

    /// Checks that every path exists, as the worker will when it applies the profile: for
    /// `check` and `start`, so that a missing one stops the start rather than every worker.
    pub(crate) fn check_paths(&self) -> Result<(), String> {
        for p in self.read.iter().chain(&self.write).chain(&self.execute) {
            std::fs::symlink_metadata(p).map_err(|e| format!("sandbox path {}: {e}", p.display()))?;
        }
        Ok(())
    }

    /// Compiles the seccomp filter: done in the master, so a mistake is reported before any
    /// worker starts, and forked workers inherit the program rather than each compile it
    /// (a re-executed worker compiles it again, with the rest of its configuration).
    pub(crate) fn compile(&self) -> Result<Compiled, String> {
        Ok(Compiled {
            profile: self.clone(),
            seccomp: self.seccomp_program()?,
        })
    }

    fn apply_landlock(&self) -> Result<Option<String>, String> {
        let all = AccessFs::from_all(LANDLOCK_ABI);
        let read = AccessFs::from_read(LANDLOCK_ABI);
        let err = |e: landlock::RulesetError| format!("Landlock: {e}");
        let check = |paths: &[PathBuf]| -> Result<(), String> {
            for p in paths {
                std::fs::symlink_metadata(p).map_err(|e| format!("sandbox path {}: {e}", p.display()))?;
            }
            Ok(())
        };
        check(&self.read)?;
        check(&self.write)?;
        check(&self.execute)?;
        let status = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(all)
            .map_err(err)?
            // No signals to processes outside the worker's domain (the master, other
            // workers, anything of the same user); no abstract Unix sockets outside it.
            .scope(Scope::from_all(LANDLOCK_ABI))
            .map_err(err)?
            .create()
            .map_err(err)?
            .add_rules(path_beneath_rules(&self.read, read))
            .map_err(err)?
            .add_rules(path_beneath_rules(&self.write, all & !AccessFs::Execute))
            .map_err(err)?
            .add_rules(path_beneath_rules(&self.execute, read | AccessFs::Execute))
            .map_err(err)?
            .restrict_self()
            .map_err(err)?;
        Ok(match status.ruleset {
            RulesetStatus::FullyEnforced => None,
            RulesetStatus::PartiallyEnforced => {
                Some("the kernel enforces only part of the sandbox's file rules (an older Landlock ABI)".into())
            }
            RulesetStatus::NotEnforced => Some(
                "the kernel does not support Landlock: the sandbox's file rules are not enforced (seccomp still is)"
                    .into(),
            ),
        })
    }

    fn seccomp_program(&self) -> Result<BpfProgram, String> {
        let err = |e: seccompiler::BackendError| format!("seccomp: {e}");
        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        for &n in DEFAULT_SYSCALLS.iter().chain(&self.syscalls) {
            if n != FORK_MARKER {
                rules.insert(n, Vec::new());
            }
        }
        let may_fork = self.syscalls.contains(&FORK_MARKER);
        if may_fork {
            rules.insert(libc::SYS_clone, Vec::new());
            rules.insert(libc::SYS_clone3, Vec::new());
        } else {
            // Threads only: the CLONE_THREAD bit of clone's flags must be set.
            let thread = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
                libc::CLONE_THREAD as u64,
            )
            .map_err(err)?;
            rules.insert(
                libc::SYS_clone,
                vec![SeccompRule::new(vec![thread]).map_err(err)?],
            );
        }
        // ioctl, but not to push input into a terminal the worker inherited (TIOCSTI) or
        // drive the console (TIOCLINUX): a worker of a foreground server holds the
        // operator's terminal on its standard descriptors.
        let not_request = |request: u64| {
            SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, request).map_err(err)
        };
        // The constants' type is the C library's ioctl request type (u64 with glibc).
        #[allow(clippy::unnecessary_cast)]
        rules.insert(
            libc::SYS_ioctl,
            vec![
                SeccompRule::new(vec![
                    not_request(libc::TIOCSTI as u64)?,
                    not_request(libc::TIOCLINUX as u64)?,
                ])
                .map_err(err)?,
            ],
        );
        let arch = std::env::consts::ARCH
            .try_into()
            .map_err(|e| format!("seccomp: {e}"))?;
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Errno(libc::EPERM as u32),
            SeccompAction::Allow,
            arch,
        )
        .map_err(err)?;
        let mut program: BpfProgram = filter.try_into().map_err(err)?;
        // clone3 passes its flags in memory, out of the filter's reach: answer ENOSYS
        // (prepended, so it wins), and the C library falls back to clone.
        if !may_fork {
            program.splice(0..0, enosys_for(libc::SYS_clone3));
        }
        Ok(program)
    }
}

/// A sandbox profile with its seccomp program compiled, ready for the workers.
#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    pub(crate) profile: Sandbox,
    seccomp: BpfProgram,
}

impl Compiled {
    /// Confines the calling worker: Landlock, then seccomp. `no_new_privs` must be set
    /// already. Returns a warning when the kernel enforces the file rules only partly or
    /// not at all.
    pub(crate) fn apply(&self) -> Result<Option<String>, String> {
        let warning = self.profile.apply_landlock()?;
        seccompiler::apply_filter(&self.seccomp).map_err(|e| format!("seccomp: {e}"))?;
        Ok(warning)
    }
}

/// Marks a profile that allows `clone` without `CLONE_THREAD` (and `clone3`).
const FORK_MARKER: i64 = -1;

/// BPF instructions that answer `ENOSYS` to system call `nr`, to put in front of a
/// program: they check the architecture themselves, and fall through to the program for
/// any other call.
fn enosys_for(nr: i64) -> Vec<seccompiler::sock_filter> {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    let arch = audit_arch();
    vec![
        // Load the architecture (offset 4 of seccomp_data); not ours: skip the check.
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 4,
        },
        sock_filter {
            code: BPF_JEQ_K,
            jt: 0,
            jf: 3,
            k: arch,
        },
        // Load the system call number (offset 0).
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: BPF_JEQ_K,
            jt: 0,
            jf: 1,
            k: nr as u32,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
    ]
}

/// The AUDIT_ARCH value of this architecture.
fn audit_arch() -> u32 {
    #[cfg(target_arch = "x86_64")]
    return 0xC000_003E;
    #[cfg(target_arch = "aarch64")]
    return 0xC000_00B7;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    compile_error!("the sandbox supports x86_64 and aarch64");
}

/// What starting a command takes, beyond the default list.
const PROCESS_CREATION: &[i64] = &[
    // The old entry points, which libc's vfork() (a shell starting a simple command:
    // dash, busybox) and fork() may still use; clone and clone3 are ruled on below.
    libc::SYS_vfork,
    libc::SYS_fork,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_setgroups,
    libc::SYS_setresgid,
    libc::SYS_setresuid,
    libc::SYS_setgid,
    libc::SYS_setuid,
    libc::SYS_prlimit64,
    libc::SYS_setrlimit,
    libc::SYS_chdir,
    libc::SYS_fchdir,
    libc::SYS_setsid,
    libc::SYS_setpgid,
    libc::SYS_pipe2,
    libc::SYS_kill,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_send_signal,
    libc::SYS_getgroups,
    libc::SYS_umask,
    libc::SYS_socketpair,
];

/// The default allow-list: what serving connections takes.
const DEFAULT_SYSCALLS: &[i64] = &[
    // Connections and files already open or opened beneath the allowed paths.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
    libc::SYS_sendfile,
    libc::SYS_splice,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_shutdown,
    libc::SYS_accept4,
    libc::SYS_accept,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_fcntl,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_lseek,
    libc::SYS_getdents64,
    libc::SYS_readlinkat,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_ftruncate,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_flock,
    libc::SYS_getcwd,
    // Waiting.
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd2,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_sched_yield,
    // Memory.
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_membarrier,
    // Signals to itself, and its own signal state.
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    // How the kernel resumes a sleep or a timed wait interrupted by SIGSTOP and SIGCONT.
    libc::SYS_restart_syscall,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
    libc::SYS_rt_sigtimedwait,
    // Threads (clone is allowed with CLONE_THREAD only, see apply_seccomp).
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_rseq,
    libc::SYS_set_tid_address,
    libc::SYS_sched_getaffinity,
    libc::SYS_exit,
    libc::SYS_exit_group,
    // Identity and limits, read only.
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getppid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getrlimit,
    libc::SYS_getrusage,
    libc::SYS_uname,
    libc::SYS_getrandom,
    libc::SYS_prctl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_poll,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_epoll_wait,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_open,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_stat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_lstat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_access,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_readlink,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_dup2,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_arch_prctl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_time,
];

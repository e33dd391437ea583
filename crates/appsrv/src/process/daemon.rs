//! Daemon mode: the pid file, the log file, and detaching from the terminal with a
//! readiness pipe.
//!
//! `start` (≡ `run --daemon`) does, in the original process: take the pid file's lock (a
//! second instance stops here, naming the running pid), bind the listeners, open the log
//! file; then detaches (fork, `setsid`, fork, `umask`, `chdir /`, stdio to `/dev/null` and
//! the log file) and waits on a pipe until the daemon reports `ready` (exit 0) or a failure
//! (exit 1 with the reason on the terminal), or the start timeout passes.
//!
//! # The pid file
//!
//! The file holds the master's pid and a `flock` lock for the master's whole life. A
//! reader that can take the lock knows the file is stale. The file is written atomically:
//! the new master writes and locks a temporary file, then renames it over the path, so a
//! reader sees either the old complete file or the new one, never an empty one. The rename
//! is also the hand-over a binary upgrade needs: a new master can publish its pid while
//! the old one still holds the lock on the old file, with no moment at which `stop` finds
//! no live pid.

use super::console::{errln, out, outln};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::unistd::Pid;

use crate::error::Error;
use crate::sys::{self, Forked};

/// A stop signal that arrives within this time of the first counts as the same request: a
/// signal sent to a pid and to its process group at once (as `timeout(1)` does, or a
/// supervisor and a terminal together) reaches the master twice. `stop --now` waits this
/// long before its second signal; the master reads a repeat within it as the same stop.
/// Defined here, beside `stop`, so that the master depends on this module and not the
/// other way round.
pub(crate) const REPEAT_WINDOW: Duration = Duration::from_secs(1);

/// The default pid file: `/run/NAME.pid` as root, `$XDG_RUNTIME_DIR/NAME.pid` otherwise.
pub(crate) fn default_pid_file(name: &str) -> Option<PathBuf> {
    if nix::unistd::Uid::effective().is_root() {
        Some(PathBuf::from(format!("/run/{name}.pid")))
    } else {
        std::env::var_os("XDG_RUNTIME_DIR")
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(&d).join(format!("{name}.pid")))
    }
}

/// The default log file of a daemon started without `--log-file`: `/var/log/NAME.log` as
/// root, `$XDG_STATE_HOME/NAME.log` (or `~/.local/state/NAME.log`) otherwise.
pub(crate) fn default_log_file(name: &str) -> Option<PathBuf> {
    if nix::unistd::Uid::effective().is_root() {
        return Some(PathBuf::from(format!("/var/log/{name}.log")));
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/state")))?;
    Some(state.join(format!("{name}.log")))
}

/// Reads the pid written in a pid file.
fn read_pid(file: &mut File) -> Option<i32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok().filter(|p| *p > 0)
}

/// A claim on the pid file's path, taken before the listeners are bound: the lock on the
/// file currently at the path (a stale one, or a new empty one). A claim dropped without
/// [`commit`](PidClaim::commit) (the start failed: a listener could not be bound) removes
/// the file it locked, so that a failed start leaves no empty pid file behind.
#[derive(Debug)]
pub(crate) struct PidClaim {
    path: PathBuf,
    current: File,
    /// Remove the locked file when dropped: false once committed, and for the placeholder
    /// of [`publish`].
    remove: bool,
}

impl Drop for PidClaim {
    fn drop(&mut self) {
        if self.remove {
            // Only if the path still names the file we hold locked (nobody else's).
            remove_if_same(&self.path, &self.current);
        }
    }
}

/// Removes `path` if it names the same file as `file`.
fn remove_if_same(path: &Path, file: &File) {
    if let (Ok(ours), Ok(now)) = (file.metadata(), std::fs::metadata(path)) {
        if (ours.dev(), ours.ino()) == (now.dev(), now.ino()) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The pid file of a running master.
#[derive(Debug)]
pub(crate) struct PidFile {
    path: PathBuf,
    file: File,
}

impl PidClaim {
    /// Claims `path`, or fails with [`Error::AlreadyRunning`] naming the live master.
    pub(crate) fn acquire(path: &Path) -> Result<PidClaim, Error> {
        let err = |source: io::Error| Error::PidFile {
            path: path.to_owned(),
            source,
        };
        loop {
            let mut current = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .custom_flags(libc::O_CLOEXEC)
                .open(path)
                .map_err(err)?;
            if !sys::try_lock(current.as_fd(), true).map_err(err)? {
                let pid = read_pid(&mut current);
                return Err(Error::AlreadyRunning {
                    pid: pid.unwrap_or(0),
                    pid_file: path.to_owned(),
                });
            }
            // The file we locked may have been replaced between open and lock (another
            // master published its own): then our lock protects nothing; try again.
            let ours = current.metadata().map_err(err)?;
            match std::fs::metadata(path) {
                Ok(m) if (m.dev(), m.ino()) == (ours.dev(), ours.ino()) => {
                    // A stale file still names the dead master, whose pid may belong to
                    // another process by now: empty it, so that nobody signals that pid.
                    // (Locked and empty reads as "starting" to `stop`.)
                    current.set_len(0).map_err(err)?;
                    return Ok(PidClaim {
                        path: path.to_owned(),
                        current,
                        remove: true,
                    });
                }
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(err(e)),
            }
        }
    }

    /// Publishes `pid`: writes and locks a new file, renames it over the path, then lets
    /// go of the old one.
    pub(crate) fn commit(mut self, pid: Pid) -> Result<PidFile, Error> {
        let err = |source: io::Error| Error::PidFile {
            path: self.path.clone(),
            source,
        };
        let tmp = self.path.with_extension(format!("pid.{pid}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(err)?;
        let published = (|| {
            // Readable by everyone, whatever the umask (the daemon's is 027): `stop` and
            // monitoring may run as other users.
            file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            if !sys::try_lock(file.as_fd(), true)? {
                return Err(io::Error::other("the new pid file is locked by another process"));
            }
            writeln!(file, "{pid}")?;
            file.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = published {
            let _ = std::fs::remove_file(&tmp);
            return Err(err(e));
        }
        // The path names the new file now; the old one's lock goes with `self`.
        self.remove = false;
        Ok(PidFile {
            path: std::mem::take(&mut self.path),
            file,
        })
    }
}

/// Publishes `pid` at `path` without claiming the path first: for a new master in a binary
/// upgrade, while the old master (its parent) still holds the lock on the current file.
/// The rename makes the switch atomic: `stop` finds either pid, both alive.
pub(crate) fn publish(path: &Path, pid: Pid) -> Result<PidFile, Error> {
    let placeholder = File::open("/dev/null").map_err(|source| Error::PidFile {
        path: path.to_owned(),
        source,
    })?;
    PidClaim {
        path: path.to_owned(),
        current: placeholder,
        remove: false,
    }
    .commit(pid)
}

impl PidFile {
    /// The descriptor holding the lock, for workers to close (they must not keep the lock
    /// alive after their master is gone).
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Removes the file on a clean stop, if the path still names our file (an upgraded
    /// master may have published its own since).
    pub(crate) fn remove(&self) {
        remove_if_same(&self.path, &self.file);
    }
}

/// What `stop` finds at a pid file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Running {
    /// No pid file.
    No,
    /// A pid file nobody holds (its master died without cleaning up).
    Stale(Option<i32>),
    /// A live master.
    Yes(i32),
    /// Locked but empty: a master is starting and has not published its pid yet.
    Starting,
}

/// Looks at a pid file without taking it over.
pub(crate) fn running(path: &Path) -> io::Result<Running> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Running::No),
        Err(e) => return Err(e),
    };
    let pid = read_pid(&mut file);
    // A shared lock conflicts with the master's exclusive one and is dropped with `file`.
    if sys::try_lock(file.as_fd(), false)? {
        return Ok(Running::Stale(pid));
    }
    match pid {
        Some(p) => Ok(Running::Yes(p)),
        None => Ok(Running::Starting),
    }
}

/// The daemon's end of the readiness pipe.
#[derive(Debug)]
pub(crate) struct Readiness {
    pipe: Option<File>,
}

impl Readiness {
    /// No one is waiting (foreground run).
    pub(crate) fn none() -> Self {
        Readiness { pipe: None }
    }

    /// Someone waits on this pipe: the old master of a binary upgrade.
    pub(crate) fn to(pipe: File) -> Self {
        Readiness { pipe: Some(pipe) }
    }

    pub(crate) fn raw_fd(&self) -> Option<RawFd> {
        self.pipe.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Tells the waiting `start` command the server is ready, with the one line it prints
    /// (`summary`: what the server took). The pipe stays open (and its descriptor number
    /// taken) for the master's life: workers forked later close that number, which must
    /// not name another file by then.
    pub(crate) fn ready(&mut self, summary: &str) {
        if let Some(p) = self.pipe.as_mut() {
            // One write below PIPE_BUF (the summary is cut to fit): the reader gets it whole.
            let mut message = format!("R{summary}");
            let mut cut = message.len().min(4000);
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('\n');
            let _ = p.write_all(message.as_bytes());
        }
    }

    /// Tells the waiting `start` command why the server could not start (if it is still
    /// waiting: after `ready`, the message goes nowhere).
    pub(crate) fn failed(&mut self, reason: &str) {
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(format!("E{reason}").as_bytes());
        }
    }
}

/// Detaches from the terminal. Returns in the daemon (the grandchild) only; the original
/// process waits for the daemon's readiness report and exits with 0 or 1, printing the
/// reason of a failure, or a timeout after `timeout`.
///
/// `log` becomes the daemon's stderr; stdin and stdout read and write `/dev/null`.
pub(crate) fn daemonize(log: &File, timeout: Duration) -> Result<Readiness, Error> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;
    let devnull = File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/null")
        .map_err(|e| Error::sys("opening /dev/null", e))?;
    flush_stdio();
    // SAFETY: the master is still single-threaded (sys::fork checks), stdio was flushed,
    // and each side below either carries on as the program (the daemon) or ends with
    // `exit_now` / `process::exit` before returning into the caller.
    match unsafe { sys::fork() }? {
        Forked::Parent(child) => {
            drop(write);
            wait_for_daemon(read, child, timeout)
        }
        Forked::Child => {
            drop(read);
            if let Err(e) = nix::unistd::setsid() {
                report_and_exit(&write, &format!("setsid failed: {}", e.desc()));
            }
            // SAFETY: as above; the intermediate process exits at once.
            match unsafe { sys::fork() } {
                Ok(Forked::Parent(_)) => sys::exit_now(0),
                Err(e) => report_and_exit(&write, &e.to_string()),
                Ok(Forked::Child) => {}
            }
            nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o027));
            let detached = (|| -> io::Result<()> {
                std::env::set_current_dir("/")?;
                nix::unistd::dup2_stdin(&devnull)?;
                nix::unistd::dup2_stdout(&devnull)?;
                crate::process::log::redirect_stderr(log)
            })();
            if let Err(e) = detached {
                report_and_exit(&write, &format!("detaching: {e}"));
            }
            crate::process::log::set_master();
            Ok(Readiness {
                pipe: Some(File::from(write)),
            })
        }
    }
}

fn flush_stdio() {
    let _ = io::stdout().flush();
    let _ = io::stderr().flush();
}

fn report_and_exit(pipe: &OwnedFd, reason: &str) -> ! {
    let _ = nix::unistd::write(pipe, format!("E{reason}").as_bytes());
    sys::exit_now(1)
}

/// The original process: waits for `R<summary>\n` (ready: prints the summary) or
/// `E<reason>` on the pipe, or EOF (the daemon died without a word), or the timeout. Never
/// returns.
fn wait_for_daemon(read: OwnedFd, intermediate: Pid, timeout: Duration) -> ! {
    // The intermediate process exits at once; reap it so it does not linger as a zombie.
    let _ = nix::sys::wait::waitpid(intermediate, None);
    let mut file = File::from(read);
    let deadline = Instant::now() + timeout;
    let mut message = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        let mut fds = [nix::poll::PollFd::new(file.as_fd(), nix::poll::PollFlags::POLLIN)];
        match nix::poll::poll(
            &mut fds,
            nix::poll::PollTimeout::try_from(ms).unwrap_or(nix::poll::PollTimeout::MAX),
        ) {
            Ok(0) => {
                errln!(
                    "error: the server did not report ready within {timeout:?}; it may still be starting \
                     (see its log file)"
                );
                std::process::exit(1);
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                errln!("error: waiting for the server: {}", e.desc());
                std::process::exit(1);
            }
        }
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => message.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                errln!("error: waiting for the server: {e}");
                std::process::exit(1);
            }
        }
        if let Some(summary) = message.strip_prefix(b"R") {
            if summary.ends_with(b"\n") {
                out!("{}", String::from_utf8_lossy(summary));
                std::process::exit(0);
            }
        }
    }
    match message.split_first() {
        Some((b'E', reason)) => errln!("error: {}", String::from_utf8_lossy(reason)),
        _ => errln!("error: the server exited during start-up (see its log file)"),
    }
    std::process::exit(1)
}

/// How long `stop` waits beyond the grace period.
const STOP_MARGIN: Duration = Duration::from_secs(10);

/// What `stop` says and waits by, asked from the server (its control socket) before it
/// is signalled (issue 34).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StopFacts {
    /// The master's pid.
    pub(crate) pid: i32,
    /// `--grace-period` and `--drain-delay` of the running server.
    pub(crate) grace_period: Duration,
    pub(crate) drain_delay: Duration,
    /// Connections open and requests in progress, over every worker (and hybrid front).
    pub(crate) connections: u64,
    pub(crate) requests: u64,
}

/// What the `stop` subcommand is given: the server to stop (its pid file, or only its
/// control socket), what the server said about itself, and how long to wait.
#[derive(Debug)]
pub(crate) struct Stop {
    /// The pid file; `None` when the server is named by its control socket alone (its pid
    /// is then the one it reported in `facts`).
    pub(crate) pid_file: Option<PathBuf>,
    /// The control socket `facts` were asked from (for messages).
    pub(crate) control: PathBuf,
    pub(crate) facts: Option<StopFacts>,
    /// `--now`: cut the connections in progress.
    pub(crate) now: bool,
    /// `--timeout`: how long to wait; by default the server's grace period and drain delay
    /// and [`STOP_MARGIN`].
    pub(crate) timeout: Option<Duration>,
    /// The grace period and drain delay assumed when the server could not be asked
    /// (`stop --grace-period`/`--drain-delay`, or the program's defaults).
    pub(crate) assumed: Duration,
}

/// A duration as `stop` says it: "30 s", "2.5 s".
fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{} s", s as u64)
    } else {
        format!("{:.1} s", s)
    }
}

/// The `stop` subcommand: signals the master named by the pid file (or by its control
/// socket) and waits until it is gone, saying what it waits for. Returns the exit status,
/// as LSB init scripts use them: 0 when stopped or not running, 1 when it did not stop in
/// time or the pid file is unreadable, 4 without the permission to signal it.
pub(crate) fn stop_command(name: &str, stop: Stop) -> i32 {
    let Stop {
        pid_file,
        control,
        mut facts,
        now,
        timeout,
        assumed,
    } = stop;
    let wait_for = |facts: &Option<StopFacts>| {
        timeout.unwrap_or_else(|| {
            facts.as_ref().map_or(assumed, |f| f.grace_period + f.drain_delay) + STOP_MARGIN
        })
    };
    let pid = match &pid_file {
        Some(path) => match pid_from_file(name, path, wait_for(&facts)) {
            Ok(pid) => pid,
            Err(status) => return status,
        },
        None => match facts.as_ref() {
            Some(f) => Pid::from_raw(f.pid),
            None => {
                let elsewhere = running_elsewhere(name, "this control socket");
                outln!(
                    "{name}: not running: no server answers on the control socket {}{elsewhere}",
                    control.display()
                );
                return 0;
            }
        },
    };
    // What the control socket said is about this server only if it is the same master.
    if facts.as_ref().is_some_and(|f| f.pid != pid.as_raw()) {
        facts = None;
    }
    let wait = wait_for(&facts);
    let term = || nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    match term() {
        Ok(()) => {}
        Err(nix::errno::Errno::ESRCH) => {
            outln!("{name}: not running (pid {pid} is gone)");
            return 0;
        }
        Err(nix::errno::Errno::EPERM) => {
            errln!("error: not allowed to signal pid {pid}");
            return 4;
        }
        Err(e) => {
            errln!("error: signalling pid {pid}: {}", e.desc());
            return 1;
        }
    }
    let limit = match timeout {
        Some(_) => "--timeout".to_owned(),
        None => format!("the grace period, the drain delay and {}", secs(STOP_MARGIN)),
    };
    match (&facts, now) {
        (Some(f), false) => outln!(
            "{name}: stopping pid {pid}: {} connection(s) open, {} request(s) in progress; the server gives them its grace period of {}{}; waiting up to {} ({limit})",
            f.connections,
            f.requests,
            secs(f.grace_period),
            match f.drain_delay.is_zero() {
                true => String::new(),
                false => format!(" after a drain delay of {}", secs(f.drain_delay)),
            },
            secs(wait)
        ),
        (Some(f), true) => outln!(
            "{name}: stopping pid {pid} now: cutting {} connection(s) open, {} request(s) in progress; waiting up to {}",
            f.connections,
            f.requests,
            secs(wait)
        ),
        (None, _) => outln!(
            "{name}: stopping pid {pid}{}: its control socket {} did not answer, so its grace period is not known (assumed {}); waiting up to {}",
            if now { " now" } else { "" },
            control.display(),
            secs(assumed),
            secs(wait)
        ),
    }
    wait_until_gone(name, pid, pid_file.as_deref(), wait, now, term)
}

/// Waits until the master `pid` (named by `pid_file`, if any) is gone, up to `wait`,
/// signalling it again with `term` once past the repeat window unless the stop was `now`
/// (a deliberate second signal, not a duplicate). Returns `stop`'s exit status: 0 once it
/// is gone, 1 if it is still running at the end.
fn wait_until_gone(
    name: &str,
    pid: Pid,
    pid_file: Option<&Path>,
    wait: Duration,
    now: bool,
    term: impl Fn() -> nix::Result<()>,
) -> i32 {
    let started = Instant::now();
    let deadline = started + wait;
    let mut second_sent = !now;
    loop {
        // The master removes the file and releases the lock as it exits; it is gone once
        // the process is too (its last steps come after the file's removal; a zombie
        // waiting for its parent to reap it counts as gone). While the lock is held by
        // that pid it is not gone, whatever the pid now names.
        let locked =
            pid_file.is_some_and(|path| matches!(running(path), Ok(Running::Yes(p)) if p == pid.as_raw()));
        if !locked && process_gone(pid) {
            outln!("{name}: stopped (pid {pid})");
            return 0;
        }
        if !second_sent && started.elapsed() > REPEAT_WINDOW {
            // A second stop signal, past the window in which repeats count as one.
            let _ = term();
            second_sent = true;
        }
        if Instant::now() >= deadline {
            errln!(
                "error: {name} (pid {pid}) is still running after {}: connections are still finishing. `{name} stop --now` cuts them (with the same --pid-file or --control), or `{name} stop --timeout SECS` waits longer",
                secs(wait)
            );
            return 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid of the master named by the pid file at `path`, once it has published it
/// (a master that is starting publishes its pid when it is about to serve: a stop that
/// arrives during a start waits for it, up to `wait`, and stops what is being started).
/// `Err` is the exit status when there is nothing to signal, the reason printed.
fn pid_from_file(name: &str, path: &Path, wait: Duration) -> Result<Pid, i32> {
    let shown = path.display();
    let started = Instant::now();
    let mut state = running(path);
    while matches!(state, Ok(Running::Starting)) && started.elapsed() < wait {
        std::thread::sleep(Duration::from_millis(50));
        state = running(path);
    }
    match state {
        Ok(Running::No) => {
            let hint = match default_pid_file(name).as_deref() == Some(path) {
                true => {
                    " (the default path: a server has it when started with `start`; one started with --pid-file PATH is stopped with the same --pid-file PATH; a foreground run without --pid-file has none: stop it with TERM or Ctrl-C)"
                }
                false => " (the path given with --pid-file)",
            };
            let elsewhere = running_elsewhere(name, "this pid file");
            outln!("{name}: not running: no pid file at {shown}{hint}{elsewhere}");
            Err(0)
        }
        Ok(Running::Stale(pid)) => {
            let master = pid.map(|p| format!(", pid {p},")).unwrap_or_default();
            outln!(
                "{name}: not running: stale pid file {shown} (its master{master} is gone without removing it)"
            );
            Err(0)
        }
        Ok(Running::Yes(pid)) => Ok(Pid::from_raw(pid)),
        Ok(Running::Starting) => {
            errln!("error: {name} is still starting (pid file {shown} locked, no pid yet)");
            Err(1)
        }
        Err(e) => {
            errln!("error: reading the pid file {shown}: {e}");
            Err(if e.kind() == io::ErrorKind::PermissionDenied {
                4
            } else {
                1
            })
        }
    }
}

/// The masters of this program that run on this machine, as far as `/proc` shows them
/// (what `status` and `stop` mention when they find no control socket or pid file: a
/// server started in the foreground has neither). A master is a process whose command
/// name (`comm`, the first 15 bytes of the program's name) is this program's and whose
/// parent's is not (workers are the master's children); this process is left out, and so
/// is a master that has exited but not yet been reaped by its parent (a zombie, state `Z`:
/// `status` right after `stop` must not call it running, issue 41).
pub(crate) fn masters_named(name: &str) -> Vec<i32> {
    let comm: String = name.chars().take(15).collect();
    let field = |pid: &str, key: &str| -> Option<String> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_owned())
    };
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|pid| *pid != me && pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| field(pid, "Name:").as_deref() == Some(comm.as_str()))
        .filter(|pid| !field(pid, "State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X')))
        .filter(|pid| {
            field(pid, "PPid:")
                .and_then(|ppid| field(&ppid, "Name:"))
                .as_deref()
                != Some(comm.as_str())
        })
        .filter_map(|pid| pid.parse().ok())
        .collect();
    found.sort_unstable();
    found
}

/// What a "not running" message adds when masters of this program run anyway (found by
/// [`masters_named`]), but not where the command looked (`here`: "this pid file").
pub(crate) fn running_elsewhere(name: &str, here: &str) -> String {
    match masters_named(name).as_slice() {
        [] => String::new(),
        pids => {
            let pids: Vec<String> = pids.iter().map(i32::to_string).collect();
            format!(
                "; {name} runs as pid {} without {here} (a foreground run without --pid-file and --control, or one started with other paths)",
                pids.join(", ")
            )
        }
    }
}

/// Whether `pid` has exited: no such process, or a zombie.
fn process_gone(pid: Pid) -> bool {
    if nix::sys::signal::kill(pid, None) == Err(nix::errno::Errno::ESRCH) {
        return true;
    }
    // The state is the field after the command name, which ends at the last ')'.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (a loaded CI run): `stop` returned while the master was still in its
    /// last steps after removing its pid file. A process is gone when it is reaped or a
    /// zombie, not before. (No child is spawned here: a fork in this test binary would
    /// carry the other tests' pid-file locks into the child for an instant; the zombie case
    /// runs in tests/daemon.rs.)
    #[test]
    fn a_live_process_is_not_gone_and_a_missing_one_is() {
        assert!(!process_gone(Pid::this()));
        // Above any pid_max Linux allows (4194304).
        assert!(process_gone(Pid::from_raw(i32::MAX)));
    }

    fn tmp(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("appsrv-unit-{}-{tag}.pid", std::process::id()))
    }

    #[test]
    fn a_claimed_pid_file_is_seen_as_running_then_stale() {
        let path = tmp("claim");
        let _ = std::fs::remove_file(&path);
        assert_eq!(running(&path).unwrap(), Running::No);
        let pid = Pid::this();
        let file = PidClaim::acquire(&path).unwrap().commit(pid).unwrap();
        assert_eq!(running(&path).unwrap(), Running::Yes(pid.as_raw()));
        match PidClaim::acquire(&path) {
            Err(Error::AlreadyRunning { pid: p, .. }) => assert_eq!(p, pid.as_raw()),
            other => panic!("expected AlreadyRunning, got {other:?}"),
        }
        drop(file); // the lock goes with the last descriptor: now stale
        assert_eq!(running(&path).unwrap(), Running::Stale(Some(pid.as_raw())));
        let again = PidClaim::acquire(&path).unwrap().commit(pid).unwrap();
        again.remove();
        assert!(!path.exists());
    }
}

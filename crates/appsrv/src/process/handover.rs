//! Binary upgrade and socket activation: a master that starts with its listening sockets
//! handed to it instead of binding them.
//!
//! # The hand-over (binary upgrade)
//!
//! The old master starts the binary now on disk (the path it was started from, so a
//! rebuilt binary is picked up) with the same arguments, and gives it an explicit list of
//! descriptors at fixed numbers from 3, named by a small versioned manifest in the
//! `APPSRV_UPGRADE` environment variable of that one command:
//!
//! ```text
//! v1 parent=4242 ready=7 control=6 metrics=- listeners=3,4,5
//! ```
//!
//! `parent` is the old master's pid (the new master checks it is its parent, so a variable
//! that leaked into an unrelated process is ignored); `ready` is the write end of a pipe:
//! the new master writes `R` there once its workers are ready, and only then does the old
//! master drain its workers and exit. The listening sockets stay open throughout (the old
//! workers close only their own copies), so a connection waiting in a backlog during the
//! hand-over is served, never reset. No file is used as a rendezvous: nothing another local
//! user could reach.
//!
//! The new master runs in a process group of its own (its pid is the group's id): its
//! workers, and whatever a wrapper script standing in for the binary starts, are in it. An
//! upgrade that fails (the new master exits, reports a failure, or misses the deadline) or
//! is abandoned (the old master is told to stop meanwhile) kills the whole group
//! ([`Pending::kill_group`]), so nothing of the new binary is left behind; only a process
//! that left the group itself (`setsid`, `setpgid`) escapes. The group is killed before
//! the new master is reaped: until then its zombie holds the group's id, which therefore
//! names no other group. The price is that a terminal's Ctrl-C, which goes to the
//! foreground process group (the old master's), does not reach the new master (see the
//! README's "Signals").
//!
//! # Socket activation
//!
//! Started by systemd with `LISTEN_FDS` (and `LISTEN_PID` naming this process), the master
//! adopts those sockets the same way.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use socket2::Socket;

use crate::error::Error;
use crate::net::listener::Listener;
use crate::sys;

/// How a failure that the new master reported itself begins.
const REPORTED: &str = "the new master could not start: ";

/// Whether a failure of [`Pending::progress`] is the new master's own report (its reason
/// is better than how it exited).
pub(crate) fn is_reported(why: &str) -> bool {
    why.starts_with(REPORTED)
}

/// The environment variable that carries the manifest.
pub(crate) const MANIFEST_ENV: &str = "APPSRV_UPGRADE";
const VERSION: &str = "v1";
/// Sources are duplicated above this number before the fork, so that no source is also a
/// target.
const HIGH_FD: RawFd = 1000;

/// How this master got its sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// From an old master, in a binary upgrade.
    Upgrade { parent: i32 },
    /// From systemd (socket activation).
    Systemd,
}

/// The descriptors a master inherited.
#[derive(Debug)]
pub(crate) struct Inherited {
    pub(crate) source: Source,
    pub(crate) listeners: Vec<Socket>,
    /// For each listener, the index of the `--listen` address it was bound for (from an
    /// upgrading master; systemd does not say).
    pub(crate) origins: Option<Vec<Option<usize>>>,
    pub(crate) control: Option<Socket>,
    pub(crate) metrics: Option<Socket>,
    /// Where to report readiness to the old master.
    pub(crate) ready: Option<File>,
}

impl Inherited {
    /// The numbers of the descriptors handed over, all adopted (owned and close-on-exec).
    pub(crate) fn fds(&self) -> Vec<RawFd> {
        self.listeners
            .iter()
            .chain(&self.control)
            .chain(&self.metrics)
            .map(AsRawFd::as_raw_fd)
            .chain(self.ready.as_ref().map(AsRawFd::as_raw_fd))
            .collect()
    }
}

/// The manifest of a hand-over, as parsed.
#[derive(Debug, Default, PartialEq, Eq)]
struct Manifest {
    parent: i32,
    ready: Option<RawFd>,
    control: Option<RawFd>,
    metrics: Option<RawFd>,
    listeners: Vec<RawFd>,
    /// Per listener, the index of its `--listen` address (`-`: unknown). Optional within
    /// v1: a master that did not write it hands over listeners matched by position.
    origins: Option<Vec<Option<usize>>>,
}

impl Manifest {
    fn render(&self) -> String {
        let fd = |f: Option<RawFd>| f.map_or("-".to_owned(), |f| f.to_string());
        let listeners: Vec<String> = self.listeners.iter().map(|f| f.to_string()).collect();
        let mut text = format!(
            "{VERSION} parent={} ready={} control={} metrics={} listeners={}",
            self.parent,
            fd(self.ready),
            fd(self.control),
            fd(self.metrics),
            listeners.join(",")
        );
        if let Some(origins) = &self.origins {
            let o: Vec<String> = origins
                .iter()
                .map(|i| i.map_or("-".to_owned(), |i| i.to_string()))
                .collect();
            text.push_str(&format!(" origins={}", o.join(",")));
        }
        text
    }

    fn parse(text: &str) -> Result<Manifest, String> {
        let mut words = text.split_ascii_whitespace();
        if words.next() != Some(VERSION) {
            return Err(format!(
                "unsupported manifest {text:?} (this binary reads {VERSION})"
            ));
        }
        let mut m = Manifest::default();
        let fd = |v: &str| -> Result<Option<RawFd>, String> {
            if v == "-" {
                Ok(None)
            } else {
                v.parse().map(Some).map_err(|_| format!("bad descriptor {v:?}"))
            }
        };
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| format!("bad manifest item {w:?}"))?;
            match k {
                "parent" => m.parent = v.parse().map_err(|_| format!("bad parent {v:?}"))?,
                "ready" => m.ready = fd(v)?,
                "control" => m.control = fd(v)?,
                "metrics" => m.metrics = fd(v)?,
                "listeners" => {
                    m.listeners = v
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(|s| fd(s).and_then(|f| f.ok_or_else(|| "a listener cannot be -".to_owned())))
                        .collect::<Result<_, _>>()?
                }
                "origins" => {
                    m.origins = Some(
                        v.split(',')
                            .filter(|s| !s.is_empty())
                            .map(|s| match s {
                                "-" => Ok(None),
                                _ => s.parse().map(Some).map_err(|_| format!("bad origin {s:?}")),
                            })
                            .collect::<Result<_, _>>()?,
                    )
                }
                _ => {} // unknown items of the same version are ignored
            }
        }
        if m.listeners.is_empty() {
            return Err("the manifest names no listener".into());
        }
        if m.origins.as_ref().is_some_and(|o| o.len() != m.listeners.len()) {
            return Err("the manifest's origins do not match its listeners".into());
        }
        Ok(m)
    }
}

fn adopt(fd: RawFd) -> Result<OwnedFd, Error> {
    // SAFETY: the descriptor numbers come from our parent's explicit list (the manifest)
    // or from systemd's LISTEN_FDS; nothing else in this process owns them.
    unsafe { sys::adopt_fd(fd) }.map_err(|e| Error::sys("adopting an inherited descriptor", e))
}

/// What this process inherited, if it was started by an upgrading master or by systemd
/// socket activation.
pub(crate) fn inherited() -> Result<Option<Inherited>, Error> {
    if let Some(text) = std::env::var_os(MANIFEST_ENV) {
        let text = text.to_string_lossy();
        let m = Manifest::parse(&text).map_err(|e| Error::Config(format!("{MANIFEST_ENV}: {e}")))?;
        if nix::unistd::getppid().as_raw() != m.parent {
            // Not our parent's manifest: the variable leaked into this process, or the old
            // master died between fork and now. Close what it names (inheritable, they
            // would leak further) and start afresh.
            tracing::warn!(
                "{MANIFEST_ENV} names master {} which is not this process's parent: ignored",
                m.parent
            );
            for fd in m
                .listeners
                .iter()
                .chain(&m.control)
                .chain(&m.metrics)
                .chain(&m.ready)
            {
                let _ = adopt(*fd);
            }
            return Ok(None);
        }
        let sock = |fd| adopt(fd).map(Socket::from);
        return Ok(Some(Inherited {
            source: Source::Upgrade { parent: m.parent },
            listeners: m.listeners.iter().map(|fd| sock(*fd)).collect::<Result<_, _>>()?,
            origins: m.origins,
            control: m.control.map(sock).transpose()?,
            metrics: m.metrics.map(sock).transpose()?,
            ready: m.ready.map(|fd| adopt(fd).map(File::from)).transpose()?,
        }));
    }
    let fds: Vec<RawFd> = match sd_notify::listen_fds() {
        Ok(fds) => fds.collect(),
        Err(e) if std::env::var_os("LISTEN_FDS").is_some() => {
            return Err(Error::Config(format!("LISTEN_FDS: {e}")));
        }
        Err(_) => Vec::new(),
    };
    if fds.is_empty() {
        return Ok(None);
    }
    Ok(Some(Inherited {
        source: Source::Systemd,
        listeners: fds
            .into_iter()
            .map(|fd| adopt(fd).map(Socket::from))
            .collect::<Result<_, _>>()?,
        origins: None,
        control: None,
        metrics: None,
        ready: None,
    }))
}

/// An upgrade in progress, in the old master.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) child: Pid,
    ready: File,
    deadline: Instant,
    /// When the pipe reached end of file without `R`: the new master is exiting; its exit
    /// status (a better reason than "closed its pipe") comes from the reaper, shortly.
    eof: Option<Instant>,
}

/// How long to wait for the exit status of a new master that closed its pipe.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// What the old master learns from a pending upgrade.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    Waiting,
    Ready,
    Failed(String),
}

impl Pending {
    /// The read end of the readiness pipe, for the master's `poll` (none once it reached
    /// end of file: it would be readable for ever).
    pub(crate) fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.eof.is_none().then(|| self.ready.as_fd())
    }

    pub(crate) fn deadline(&self) -> Instant {
        match self.eof {
            Some(t) => self.deadline.min(t + EXIT_WAIT),
            None => self.deadline,
        }
    }

    /// The reason the new master wrote on the readiness pipe before it exited, if any.
    /// Read when its exit is seen first: the reason is the better message.
    pub(crate) fn reported_failure(&mut self) -> Option<String> {
        if self.eof.is_some() {
            return None;
        }
        match self.progress() {
            Progress::Failed(why) if is_reported(&why) => Some(why),
            _ => None,
        }
    }

    /// Kills the new master's process group with SIGKILL: the new master, its workers, and
    /// what a wrapper script started as a child. Call it before the new master is reaped
    /// (its zombie keeps the group's id from naming another group).
    pub(crate) fn kill_group(&self) {
        match nix::sys::signal::killpg(self.child, Signal::SIGKILL) {
            // Every process of the group has exited already.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => tracing::warn!(
                "upgrade: killing the new master's process group {}: {}",
                self.child,
                e.desc()
            ),
        }
    }

    /// Reads the readiness pipe without blocking.
    pub(crate) fn progress(&mut self) -> Progress {
        if let Some(t) = self.eof {
            return if t.elapsed() >= EXIT_WAIT {
                Progress::Failed("the new master closed its readiness pipe without being ready".into())
            } else {
                Progress::Waiting
            };
        }
        let mut buf = [0u8; 1024];
        match self.ready.read(&mut buf) {
            Ok(n) if n > 0 && buf[0] == b'R' => Progress::Ready,
            // The new master reports why it could not start (one write, below PIPE_BUF).
            Ok(n) if n > 0 && buf[0] == b'E' => {
                Progress::Failed(format!("{REPORTED}{}", String::from_utf8_lossy(&buf[1..n])))
            }
            Ok(0) => {
                self.eof = Some(Instant::now());
                Progress::Waiting
            }
            Ok(_) => Progress::Failed("unexpected bytes on the readiness pipe".into()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= self.deadline {
                    Progress::Failed("the new master was not ready in time".into())
                } else {
                    Progress::Waiting
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Progress::Waiting,
            Err(e) => Progress::Failed(format!("reading the readiness pipe: {e}")),
        }
    }
}

#[cfg(test)]
impl Pending {
    /// A pending upgrade that reads `ready` as its readiness pipe, for the master's unit
    /// tests: no process is started, so `child` must name no process (group) at all.
    pub(crate) fn for_tests(child: Pid, ready: File, timeout: Duration) -> Pending {
        Pending {
            child,
            ready,
            deadline: Instant::now() + timeout,
            eof: None,
        }
    }
}

/// How a new master is started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewMaster<'a> {
    /// The binary, started as a new master.
    pub(crate) exe: &'a Path,
    /// Its working directory (default: this process's).
    pub(crate) dir: Option<&'a Path>,
    /// Its arguments, without `argv[0]`.
    pub(crate) args: &'a [OsString],
    /// Descriptors the application keeps, which the new master inherits as they are: the
    /// hand-over puts nothing at their numbers.
    pub(crate) keep: &'a [RawFd],
    /// How long it may take to be ready.
    pub(crate) timeout: Duration,
}

/// Starts a new master as `new` says, handing it the listeners, the control socket and the
/// metrics listener, at numbers from 3 on that skip `new.keep`. Returns once it is started
/// (not ready).
pub(crate) fn launch(
    new: &NewMaster<'_>,
    listeners: &[Listener],
    control: Option<&Socket>,
    metrics: Option<&Socket>,
) -> Result<Pending, Error> {
    let NewMaster {
        exe,
        dir,
        args,
        keep,
        timeout,
    } = *new;
    if sys::stderr_is_tostop_terminal() {
        // The new master's first log line would stop it (its own process group is not the
        // terminal's foreground group): better a refusal now than a timeout.
        return Err(Error::Config(
            "stderr is a terminal set to tostop, which would stop the new master (in its own \
             process group) at its first log line: use --log-file or `stty -tostop`, or run \
             the server under systemd or with `start`"
                .into(),
        ));
    }
    let err = |op: &'static str| move |e: nix::Error| Error::sys(op, e);
    let (ready_read, ready_write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(err("pipe"))?;
    nix::fcntl::fcntl(&ready_read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(err("fcntl"))?;
    // High, close-on-exec duplicates: sources that cannot collide with the targets.
    let high = |fd: std::os::fd::BorrowedFd<'_>| -> Result<OwnedFd, Error> {
        sys::dup_at_least(fd, HIGH_FD).map_err(|e| Error::sys("duplicating a descriptor", e))
    };
    let mut sources: Vec<OwnedFd> = Vec::new();
    let mut manifest = Manifest {
        parent: std::process::id() as i32,
        ..Manifest::default()
    };
    let mut next: RawFd = 3;
    let mut pairs = Vec::new();
    let mut add = |fd: std::os::fd::BorrowedFd<'_>| -> Result<RawFd, Error> {
        let h = high(fd)?;
        while keep.contains(&next) {
            next += 1;
        }
        let target = next;
        next += 1;
        pairs.push((h.as_raw_fd(), target));
        sources.push(h);
        Ok(target)
    };
    let mut origins = Vec::new();
    for l in listeners {
        manifest.listeners.push(add(l.as_fd())?);
        origins.push(l.origin());
    }
    manifest.origins = Some(origins);
    manifest.control = control.map(|c| add(c.as_fd())).transpose()?;
    manifest.metrics = metrics.map(|m| add(m.as_fd())).transpose()?;
    manifest.ready = Some(add(ready_write.as_fd())?);
    let mut cmd = std::process::Command::new(exe);
    // Its own process group, so that a failure can kill everything it started (see the
    // module's documentation).
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.args(args)
        .env(MANIFEST_ENV, manifest.render())
        .stdin(std::process::Stdio::null());
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    sys::pass_fds(&mut cmd, pairs);
    let child = cmd.spawn().map_err(|e| Error::Sys {
        op: "starting the new binary",
        source: std::io::Error::new(e.kind(), format!("{}: {e}", exe.display())),
    })?;
    drop(sources);
    drop(ready_write);
    Ok(Pending {
        child: Pid::from_raw(child.id() as i32),
        ready: File::from(ready_read),
        deadline: Instant::now() + timeout,
        eof: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_round_trips_and_is_versioned() {
        let m = Manifest {
            parent: 42,
            ready: Some(7),
            control: Some(6),
            metrics: None,
            listeners: vec![3, 4, 5],
            origins: Some(vec![Some(0), Some(0), None]),
        };
        let text = m.render();
        assert_eq!(
            text,
            "v1 parent=42 ready=7 control=6 metrics=- listeners=3,4,5 origins=0,0,-"
        );
        assert_eq!(Manifest::parse(&text).unwrap(), m);
        // A master that wrote no origins (an older appsrv).
        assert_eq!(
            Manifest::parse("v1 parent=42 ready=7 control=6 metrics=- listeners=3,4,5")
                .unwrap()
                .origins,
            None
        );
        assert!(
            Manifest::parse("v1 parent=1 listeners=3,4 origins=0")
                .unwrap_err()
                .contains("origins")
        );
        assert!(
            Manifest::parse("v2 parent=1 listeners=3")
                .unwrap_err()
                .contains("unsupported")
        );
        assert!(
            Manifest::parse("v1 parent=1 listeners=")
                .unwrap_err()
                .contains("no listener")
        );
        assert!(
            Manifest::parse("v1 parent=1 listeners=3 extra=1").is_ok(),
            "unknown items are ignored"
        );
    }
}

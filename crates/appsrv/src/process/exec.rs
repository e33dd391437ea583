//! Re-executed workers (`--exec-workers`): what a worker forked by the master needs to
//! become a fresh process image of the same program, and to find its way back.
//!
//! A forked worker is a copy of the master: the same address-space layout (the binary's
//! base, the heap, the stack, the libraries), so an attacker who learns one worker's layout
//! through a memory leak knows every worker's, and can brute-force a layout-dependent
//! exploit across worker respawns. With `--exec-workers`, each worker is forked and then
//! executes the program again, so the kernel lays it out afresh (ASLR) each time.
//!
//! The program executed is the one the master opened at start (`/proc/self/exe`), through
//! its descriptor (`fexecve`), not its path: a newer binary installed on disk is not picked
//! up by accident (that is what `upgrade` is for). The worker gets the master's command line
//! and working directory, so it parses the same configuration; the descriptors it needs
//! stay open across the exec, and their numbers travel in the `APPSRV_WORKER` variable
//! of the environment given to `fexecve` (the master's own environment is never changed).
//! The re-executed program runs its `main` up to [`Server::run`](crate::Server::run), which
//! sees the variable and becomes that worker instead of a master: it adopts the
//! listeners, maps the scoreboard from its memfd, re-reads the TLS material (it still runs
//! as root at that point, if the master does), and goes on as any worker (confinement,
//! privilege drop, factory, serving).
//!
//! What a re-executed worker does *not* share with the master: any state `main` built
//! before `run` is built again (so it must not depend on running once), and the TLS
//! material is read from the files again (after a reload that failed to re-read them, a
//! replacement worker fails to start, and says why).

use std::ffi::{CString, OsStr};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;

/// The environment variable that makes a program started by the master a worker.
pub(crate) const WORKER_ENV: &str = "APPSRV_WORKER";

/// Variables of the master's environment that a worker must not see: they describe
/// descriptors or sockets meant for the master.
const NOT_FOR_WORKERS: &[&str] = &[
    WORKER_ENV,
    crate::process::handover::MANIFEST_ENV,
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "NOTIFY_SOCKET",
];

/// What the master hands a re-executed worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handoff {
    pub(crate) id: u32,
    pub(crate) master: i32,
    pub(crate) max_requests: u64,
    pub(crate) max_connections: u64,
    /// The scoreboard's memfd.
    pub(crate) board: RawFd,
    /// The notification pipe's write end.
    pub(crate) channel: RawFd,
    /// The master's wake-up eventfd.
    pub(crate) wake: Option<RawFd>,
    /// The access log.
    pub(crate) access: Option<RawFd>,
    /// The worker's end of its log channel (`reopen.rs`).
    pub(crate) logs: Option<RawFd>,
    /// The per-address tables' memfd (`--io event` with `--max-conns-per-ip`).
    pub(crate) peers: Option<RawFd>,
    /// The penalty table's memfd (failed authentication; none with `--penalty-max 0`).
    pub(crate) penalties: Option<RawFd>,
    /// Each listener, with the index of the `--listen` address it serves.
    pub(crate) listeners: Vec<(RawFd, Option<usize>)>,
}

impl Handoff {
    /// The descriptors to keep open across the exec.
    pub(crate) fn fds(&self) -> Vec<RawFd> {
        [self.board, self.channel]
            .into_iter()
            .chain(self.wake)
            .chain(self.access)
            .chain(self.logs)
            .chain(self.peers)
            .chain(self.penalties)
            .chain(self.listeners.iter().map(|(fd, _)| *fd))
            .collect()
    }

    /// `v1 id=3 master=120 recycle=0,0 board=5 channel=7 wake=6 access=- logs=8 peers=- penalties=9 listeners=3:0,4:1`
    fn encode(&self) -> String {
        let opt = |v: Option<RawFd>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let listeners: Vec<String> = self
            .listeners
            .iter()
            .map(|(fd, origin)| {
                format!(
                    "{fd}:{}",
                    origin.map_or_else(|| "-".to_owned(), |o| o.to_string())
                )
            })
            .collect();
        format!(
            "v1 id={} master={} recycle={},{} board={} channel={} wake={} access={} logs={} peers={} penalties={} listeners={}",
            self.id,
            self.master,
            self.max_requests,
            self.max_connections,
            self.board,
            self.channel,
            opt(self.wake),
            opt(self.access),
            opt(self.logs),
            opt(self.peers),
            opt(self.penalties),
            listeners.join(",")
        )
    }

    fn decode(text: &str) -> Result<Handoff, String> {
        let mut words = text.split(' ');
        if words.next() != Some("v1") {
            return Err(format!("{WORKER_ENV}: unknown format {text:?}"));
        }
        let mut h = Handoff {
            id: 0,
            master: 0,
            max_requests: 0,
            max_connections: 0,
            board: -1,
            channel: -1,
            wake: None,
            access: None,
            logs: None,
            peers: None,
            penalties: None,
            listeners: Vec::new(),
        };
        let bad = |what: &str| format!("{WORKER_ENV}: bad {what} in {text:?}");
        let fd = |v: &str, what: &str| {
            v.parse::<RawFd>()
                .ok()
                .filter(|fd| *fd > 2)
                .ok_or_else(|| bad(what))
        };
        let opt_fd = |v: &str, what: &str| if v == "-" { Ok(None) } else { fd(v, what).map(Some) };
        for word in words {
            let (key, value) = word.split_once('=').ok_or_else(|| bad("word"))?;
            match key {
                "id" => h.id = value.parse().map_err(|_| bad("id"))?,
                "master" => h.master = value.parse().map_err(|_| bad("master"))?,
                "recycle" => {
                    let (r, c) = value.split_once(',').ok_or_else(|| bad("recycle"))?;
                    h.max_requests = r.parse().map_err(|_| bad("recycle"))?;
                    h.max_connections = c.parse().map_err(|_| bad("recycle"))?;
                }
                "board" => h.board = fd(value, "board")?,
                "channel" => h.channel = fd(value, "channel")?,
                "wake" => h.wake = opt_fd(value, "wake")?,
                "access" => h.access = opt_fd(value, "access")?,
                "logs" => h.logs = opt_fd(value, "logs")?,
                "peers" => h.peers = opt_fd(value, "peers")?,
                "penalties" => h.penalties = opt_fd(value, "penalties")?,
                "listeners" => {
                    for item in value.split(',').filter(|i| !i.is_empty()) {
                        let (f, origin) = item.split_once(':').ok_or_else(|| bad("listener"))?;
                        let origin = match origin {
                            "-" => None,
                            o => Some(o.parse().map_err(|_| bad("listener origin"))?),
                        };
                        h.listeners.push((fd(f, "listener")?, origin));
                    }
                }
                _ => return Err(bad("key")),
            }
        }
        if h.id == 0 || h.master <= 0 || h.board < 0 || h.channel < 0 || h.listeners.is_empty() {
            return Err(bad("contents"));
        }
        Ok(h)
    }

    /// The environment of the re-executed worker: the master's, without what is meant
    /// for the master only, with this handoff.
    pub(crate) fn environment(&self) -> Vec<CString> {
        std::env::vars_os()
            .filter(|(k, _)| !NOT_FOR_WORKERS.iter().any(|n| OsStr::new(n) == k))
            .filter_map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                CString::new(kv).ok()
            })
            .chain(CString::new(format!("{WORKER_ENV}={}", self.encode())).ok())
            .collect()
    }
}

/// The handoff, if this process is a re-executed worker.
///
/// A program that a worker's handler starts inherits the variable too (nothing removes it
/// from the worker's environment: that would take `set_var` after start-up). Such a program
/// has the master as a grandparent or a more distant ancestor, not as its parent: for it
/// the variable is ignored. A re-executed worker whose master died meanwhile has neither:
/// it takes the worker's path, where the parent check makes it exit at once (rather than
/// start a second server with the master's command line).
pub(crate) fn from_env() -> Option<Result<Handoff, String>> {
    let text = std::env::var(WORKER_ENV).ok()?;
    match Handoff::decode(&text) {
        Ok(h) if is_distant_ancestor(h.master) => None,
        other => Some(other),
    }
}

/// Whether `pid` is an ancestor of this process other than its parent (from `/proc`).
fn is_distant_ancestor(pid: i32) -> bool {
    let parent_of = |p: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        // The fields after the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
    };
    let mut p = nix::unistd::getppid().as_raw();
    for _ in 0..64 {
        match parent_of(p) {
            Some(grand) if grand == pid => return true,
            Some(grand) if grand > 1 => p = grand,
            _ => return false,
        }
    }
    false
}

/// A command line as C strings, for `fexecve`.
pub(crate) fn c_args(args: &[std::ffi::OsString]) -> Result<Vec<CString>, String> {
    args.iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| format!("argument {a:?} contains a NUL byte")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handoff_round_trips() {
        let h = Handoff {
            id: 3,
            master: 120,
            max_requests: 1000,
            max_connections: 0,
            board: 5,
            channel: 7,
            wake: Some(6),
            access: None,
            logs: Some(8),
            peers: Some(9),
            penalties: Some(10),
            listeners: vec![(3, Some(0)), (4, None)],
        };
        assert_eq!(Handoff::decode(&h.encode()), Ok(h.clone()));
        assert_eq!(h.fds(), vec![5, 7, 6, 8, 9, 10, 3, 4]);
        let without = Handoff {
            peers: None,
            penalties: None,
            ..h.clone()
        };
        assert_eq!(Handoff::decode(&without.encode()), Ok(without));
        let env = h.environment();
        assert!(
            env.iter()
                .any(|e| e.to_bytes().starts_with(b"APPSRV_WORKER=v1 id=3 master=120 "))
        );
    }

    #[test]
    fn only_ancestors_beyond_the_parent_count_as_distant() {
        let parent = nix::unistd::getppid().as_raw();
        assert!(
            !is_distant_ancestor(parent),
            "the parent is the master of a worker"
        );
        let stat = std::fs::read_to_string(format!("/proc/{parent}/stat")).unwrap();
        let grandparent: i32 = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        if grandparent > 1 {
            assert!(is_distant_ancestor(grandparent));
        }
        assert!(
            !is_distant_ancestor(i32::MAX),
            "not an ancestor at all (an orphaned worker)"
        );
    }

    #[test]
    fn a_bad_handoff_is_refused_with_the_reason() {
        for text in [
            "v2 id=1",
            "v1 id=1 master=2 board=5 channel=6",
            "v1 id=1 master=2 board=1 channel=6 listeners=3:0",
            "v1 id=x",
        ] {
            let e = Handoff::decode(text).unwrap_err();
            assert!(e.starts_with("APPSRV_WORKER: "), "{e}");
        }
    }
}

//! Re-executed workers (`--exec-workers`): the master's side, a forked child that becomes
//! the program again with its hand-off (`Workers::exec`), and the worker's side, which
//! adopts the descriptors the hand-off lists and reads again what the master read
//! (`adopt_handoff`; `startup::exec_worker` runs it).

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

use super::open::{adopt_all, resolve_users, tls_sources};
use super::setup::Workers;
use crate::cli::Config;
use crate::confine::privilege::{Confinement, Plan};
use crate::error::{Error, Result};
use crate::net::listener::{BindOptions, Listener};
use crate::net::tls::Store;
use crate::peer_counts::PeerCounts;
use crate::process::exec::Handoff;
use crate::process::notify::Message;
use crate::scoreboard::Board;
use crate::worker::Recycle;

impl Workers<'_> {
    /// In the child just forked: becomes the program again (`--exec-workers`), as worker
    /// `id`, in `dir` (the master's working directory at start, so that the command line's
    /// relative paths mean the same to the worker). Reports a failure to the master.
    pub(super) fn exec(
        &self,
        exe: &File,
        argv: &[CString],
        dir: Option<&Path>,
        id: u32,
        recycle: Recycle,
    ) -> ! {
        let handoff = Handoff {
            id,
            master: self.master.as_raw(),
            max_requests: recycle.max_requests,
            max_connections: recycle.max_connections,
            board: Board::memfd().unwrap_or(-1),
            channel: self.channel.write_fd(),
            wake: crate::sys::wake_fd(),
            access: self.access_log.map(AsRawFd::as_raw_fd),
            logs: crate::process::reopen::worker_end().map(|fd| fd.as_raw_fd()),
            peers: self.peers.map(PeerCounts::memfd),
            penalties: crate::penalty::memfd(),
            listeners: self
                .listeners
                .iter()
                .map(|l| (l.socket().as_raw_fd(), l.origin()))
                .collect(),
        };
        if let Some(dir) = dir {
            let _ = nix::unistd::chdir(dir);
        }
        let env = handoff.environment();
        // SAFETY: this runs in the child just forked by the master (single-threaded),
        // which is replaced by the exec; the descriptors are the master's open
        // listeners, scoreboard memfd, notification pipe, wake-up eventfd and access
        // log, which the child owns copies of.
        let e = unsafe { crate::sys::exec_keeping(exe, argv, &env, &handoff.fds()) };
        let _ = self.channel.send(
            std::process::id(),
            &Message::StartFailed(format!("re-executing the program: {e}")),
        );
        crate::sys::exit_now(crate::sys::exit::START_FAILED);
    }
}

/// Takes ownership of descriptor `fd` of a re-executed worker's hand-off (`what` names it
/// in the error). Only for the numbers its `APPSRV_WORKER` variable lists, each once: a
/// number that comes from the environment, which no type can vouch for.
pub(super) fn adopt(fd: RawFd, what: &'static str) -> Result<std::os::fd::OwnedFd> {
    // SAFETY: a descriptor the master kept open across the exec for this process alone
    // (the callers adopt each number of the hand-off once); nothing else here owns it.
    unsafe { crate::sys::adopt_fd(fd) }.map_err(|e| Error::sys(what, e))
}

/// What a re-executed worker adopts from its master's hand-off, and what it reads again as
/// the master did: users, listeners, TLS material, the scoreboard, the access log, the
/// wake-up eventfd, the confinement.
#[allow(clippy::type_complexity)] // the parts, named once, taken apart by the caller
pub(super) fn adopt_handoff(
    config: &Config,
    bind: &BindOptions,
    handoff: &Handoff,
) -> Result<(
    Plan,
    Vec<Listener>,
    Store,
    (&'static Board, Option<&'static PeerCounts>),
    Option<File>,
    Confinement,
)> {
    let (plan, _) = resolve_users(config)?;
    let sockets = handoff
        .listeners
        .iter()
        .map(|(fd, _)| adopt(*fd, "adopting a listener").map(socket2::Socket::from))
        .collect::<Result<Vec<_>>>()?;
    let origins = handoff.listeners.iter().map(|(_, o)| *o).collect();
    let listeners = adopt_all(config, bind, sockets, Some(origins))?;
    // Read again, as the master did at start (this process is still root if it is).
    let tls = Store::load(tls_sources(config, &listeners)?)?;
    let board = Board::adopt(adopt(handoff.board, "adopting the scoreboard")?)
        .map_err(|e| Error::sys("mapping the scoreboard", e))?;
    crate::process::log::count_dropped_in(board.log_dropped());
    let peers = handoff
        .peers
        .map(|fd| adopt(fd, "adopting the per-address tables"))
        .transpose()?
        .map(PeerCounts::adopt)
        .transpose()
        .map_err(|e| Error::sys("mapping the per-address tables", e))?;
    if let Some(fd) = handoff.penalties {
        crate::penalty::adopt(adopt(fd, "adopting the penalty table")?)
            .map_err(|e| Error::sys("mapping the penalty table", e))?;
    }
    let access = handoff
        .access
        .map(|fd| adopt(fd, "adopting the access log").map(File::from))
        .transpose()?;
    if let Some(fd) = handoff.logs {
        crate::process::reopen::set_worker_end(adopt(fd, "adopting the log channel")?);
    }
    if let Some(fd) = handoff.wake {
        crate::sys::set_wake_fd(std::os::fd::IntoRawFd::into_raw_fd(adopt(
            fd,
            "adopting the wake-up eventfd",
        )?));
    }
    Ok((
        plan,
        listeners,
        tls,
        (board, peers),
        access,
        config.confinement()?,
    ))
}

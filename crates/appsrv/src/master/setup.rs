//! What every worker is started with (`Workers`): the `worker::Setup` of worker `id`, made
//! by the master at fork or by a re-executed worker from its master's hand-off.

use std::fs::File;
use std::os::fd::RawFd;

use nix::unistd::Pid;

use crate::cli::Config;
use crate::confine::privilege::{Confinement, Plan};
use crate::net::listener::Listener;
use crate::net::tls::Store;
use crate::peer_counts::PeerCounts;
use crate::process::notify::Channel;
use crate::scoreboard::Board;
use crate::worker::{self, Recycle};

/// What every worker is started with: by the master at fork, or by a re-executed worker
/// from its master's hand-off.
pub(super) struct Workers<'a> {
    pub(super) config: &'a Config,
    pub(super) master: Pid,
    pub(super) listeners: &'a [Listener],
    pub(super) plan: &'a Plan,
    pub(super) channel: &'a Channel,
    pub(super) board: &'static Board,
    pub(super) peers: Option<&'static PeerCounts>,
    pub(super) access_log: Option<&'a File>,
    pub(super) confinement: &'a Confinement,
    pub(super) tls: &'a Store,
    pub(super) handoff: Option<&'a crate::net::handoff::Channel>,
    /// Each driver's own settings, carried to every worker as they are.
    pub(super) drivers: worker::Drivers,
}

impl Workers<'_> {
    /// The set-up of worker `id`.
    pub(super) fn setup<'s>(
        &'s self,
        id: u32,
        role: worker::Role,
        recycle: Recycle,
        master_fds: &'s [RawFd],
    ) -> worker::Setup<'s> {
        let config = self.config;
        worker::Setup {
            id,
            master: self.master,
            listeners: self.listeners,
            plan: self.plan,
            channel: self.channel,
            master_fds,
            log_path: config.files.log_file.as_deref(),
            board: self.board,
            recycle,
            access_log: config.files.access_log.as_deref().zip(self.access_log),
            max_per_ip: (config.access.max_conns_per_ip > 0)
                .then_some(config.access.max_conns_per_ip as usize),
            peers: self.peers,
            confinement: self.confinement,
            tls: crate::net::tls::ForWorker {
                acceptors: self.tls.current(),
                handshake_timeout: config.tls.handshake_timeout,
            },
            conn: worker::ConnLimits {
                header_timeout: config.timeouts.header_timeout,
                min_send_rate: config.timeouts.min_send_rate,
                write_timeout: config.timeouts.write_timeout,
                max_buffered: usize::try_from(config.timeouts.max_buffered_bytes).unwrap_or(usize::MAX),
            },
            io: match config.workers.io {
                crate::Io::Blocking => worker::Model::Blocking,
                crate::Io::Event => worker::Model::Event,
                crate::Io::Hybrid => worker::Model::Hybrid,
                crate::Io::Async => worker::Model::Async,
            },
            role,
            handoff: self.handoff,
            drivers: self.drivers,
        }
    }
}

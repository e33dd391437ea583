//! What the master's start-up, `check`'s rehearsal (`rehearse.rs`) and a re-executed
//! worker (`exec.rs`) open alike: the users resolved, the listeners bound or adopted with
//! their options and their TLS sources, the control socket's path and binding, the log
//! files.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::cli::Config;
use crate::confine::privilege::{self, Plan};
use crate::control::{self, Control};
use crate::error::{Error, Result};
use crate::net::listener::{self, BindOptions, Listener};

/// The workers' users, resolved from `--user` and `--group`, with a warning (started as root
/// without `--user`).
pub(super) fn resolve_users(config: &Config) -> Result<(Plan, Option<String>)> {
    privilege::resolve(
        config.confine.user.as_deref(),
        config.confine.group.as_deref(),
        config.confine.allow_root_workers,
    )
}

/// Binds the control socket at `path`; a socket another server accepts on is refused with
/// the way out (issue 34).
pub(super) fn bind_control(name: &str, path: &Path, owner: u32) -> Result<Control> {
    Control::bind(path, owner).map_err(|e| match &e {
        Error::Bind { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse => Error::Config(format!(
            "{e}: another server has this control socket (another instance of {name}?); give this one its own with --control PATH, or its own --pid-file PATH.pid (its control socket is then PATH.sock)"
        )),
        _ => e,
    })
}

/// The control socket's path: on when asked for, or by default for a server with a pid
/// file (an instance that commands address by name), beside the pid file, so that two
/// instances with pid files of their own do not collide (issue 34).
pub(crate) fn control_path(name: &str, config: &Config) -> Option<PathBuf> {
    config.files.control.clone().or_else(|| {
        config
            .files
            .pid_file
            .as_deref()
            .map(|p| control::path_for_pid_file(name, p))
    })
}

/// Opens the log file at `path`, if any: the master's alone (see `log::open_log`).
pub(super) fn open_log(path: Option<&Path>) -> Result<Option<File>> {
    path.map(crate::process::log::open_log).transpose()
}

/// Takes over inherited listening sockets (upgrade, socket activation), with this
/// configuration's options.
pub(super) fn adopt_all(
    config: &Config,
    opts: &BindOptions,
    sockets: Vec<socket2::Socket>,
    origins: Option<Vec<Option<usize>>>,
) -> Result<Vec<Listener>> {
    let mut all: Vec<Listener> = sockets
        .into_iter()
        .map(|s| listener::adopt(s, opts))
        .collect::<Result<_>>()?;
    // Each listener gets the options of the --listen address it serves: an upgrading
    // master says which one (the same command line, so the same indexes); a socket from
    // systemd (or from an older master) is matched by its address. Matching by position
    // would be wrong as soon as a host name resolves to several addresses, and would give
    // one listener's deny= rules to another.
    let global = global_policy(config);
    for (k, l) in all.iter_mut().enumerate() {
        let origin = match &origins {
            Some(o) => o.get(k).copied().flatten(),
            None => config
                .listeners
                .listen
                .iter()
                .position(|a| a.names(l.kind(), l.local_addr())),
        }
        .filter(|i| *i < config.listeners.listen.len());
        l.set_origin(origin);
        l.set_policy(match origin {
            Some(i) => global.with(&config.listeners.listen[i]),
            None => global.clone(),
        });
    }
    for (i, addr) in config.listeners.listen.iter().enumerate() {
        if addr.has_options() && !all.iter().any(|l| l.origin() == Some(i)) {
            tracing::warn!("no inherited socket is bound at {addr}: its options apply to no listener");
        }
    }
    for l in &all {
        l.socket()
            .set_nonblocking(all.len() > 1 || config.workers.io != crate::Io::Blocking || l.is_datagram())
            .map_err(|e| Error::sys("setting a listener's blocking mode", e))?;
    }
    Ok(all)
}

/// Where each listener's TLS material comes from (by listener index), from the `--listen`
/// address it serves. Every TLS address is checked, even one no socket serves.
pub(super) fn tls_sources(
    config: &Config,
    listeners: &[Listener],
) -> Result<Vec<Option<crate::net::tls::Source>>> {
    let by_address = config
        .listeners
        .listen
        .iter()
        .map(|a| a.tls_source(&config.tls.defaults))
        .collect::<Result<Vec<_>>>()?;
    Ok(listeners
        .iter()
        .map(|l| l.origin().and_then(|i| by_address.get(i).cloned().flatten()))
        .collect())
}

/// The access policy of the command line, for every listener (each adds its own options).
pub(super) fn global_policy(config: &Config) -> listener::Policy {
    listener::Policy {
        allow: config.access.allow.clone(),
        deny: config.access.deny.clone(),
        proxy: config.access.proxy_protocol,
        proxy_from: config.access.proxy_from.clone(),
    }
}
/// The listeners of `--listen`, bound now, each with its options.
pub(super) fn bind_all(config: &Config, opts: &BindOptions) -> Result<Vec<Listener>> {
    if config.listeners.listen.is_empty() {
        return Err(Error::Config(
            "no listen address: give -l/--listen ADDR (or start the server with systemd socket activation)"
                .into(),
        ));
    }
    let mut all = Vec::new();
    let global = global_policy(config);
    for (all_origin, addr) in config.listeners.listen.iter().enumerate() {
        for mut l in listener::bind(addr, opts)? {
            l.set_policy(global.with(addr));
            l.set_origin(Some(all_origin));
            all.push(l);
        }
    }
    if all.len() > 1 || config.workers.io != crate::Io::Blocking {
        // Several listeners are watched with epoll by each worker, and an event worker
        // (or a hybrid front, or a hybrid worker beside its hand-off channel) watches even
        // one: accept must then not block on a listener another process emptied first.
        for l in &all {
            l.socket()
                .set_nonblocking(true)
                .map_err(|e| Error::sys("making a listener non-blocking", e))?;
        }
    }
    Ok(all)
}

//! What `check` does after validating the configuration (issue 34): what the start-up
//! would open, opened and released (`rehearse`), and start's default paths looked at
//! without being taken (`StartDefaults`).

use std::path::{Path, PathBuf};

use super::open::{bind_control, control_path, open_log};
use crate::cli::Config;
use crate::control::{self, MetricsListener};
use crate::error::{Error, Result};
use crate::net::listener::{self, BindOptions, Listener};
use crate::process::daemon::{self, PidClaim};

/// What `check` does after validating the configuration (issue 34): what the start-up
/// would open, opened and released, so that a check that passes means a start will not
/// fail on it: the pid file claimed, every listen address resolved and bound (a port in
/// use, a name that does not resolve, --metrics-listen on a --listen address: the same
/// messages as `run`), the control socket and the metrics listener bound, the log files
/// opened for appending. Nothing is left behind: files that did not exist are removed,
/// and a running server's sockets are never touched (a live Unix socket is refused, not
/// replaced).
///
/// `running` is the server this configuration names (its pid file or control socket), if
/// it runs: what it holds is not an error but a line of `notes` (checking the
/// configuration of a running server before a reload is what `check` is for), and so is
/// the pid file it holds.
///
/// `defaults` are the paths `start` would use where the command line gives none (start's
/// default pid file and control socket): they are looked at, not taken
/// ([`StartDefaults::probe`]).
pub(crate) fn rehearse(
    name: &str,
    config: &Config,
    bind: &BindOptions,
    running: Option<&control::RunningServer>,
    defaults: &StartDefaults,
) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    let in_use =
        |e: &Error| matches!(e, Error::Bind { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse);
    let held_note = |what: &str, r: &control::RunningServer| {
        format!("{what}: held by the running {name} (pid {}), as expected", r.pid)
    };
    defaults.probe(name, running, &mut notes)?;
    if let Some(path) = config.files.pid_file.as_deref() {
        match PidClaim::acquire(path) {
            // Dropped unclaimed: the file is removed, a stale one too (as `start` would
            // take it over).
            Ok(claim) => drop(claim),
            Err(Error::AlreadyRunning { pid, .. }) if running.is_some_and(|r| r.pid == pid) => {
                notes.push(format!(
                    "pid file {}: held by the running {name} (pid {pid}): `start` refuses while it runs; `reload` or `upgrade` replaces it",
                    path.display()
                ));
            }
            Err(e) => return Err(e),
        }
    }
    if config.listeners.listen.is_empty() && std::env::var_os("LISTEN_FDS").is_none() {
        return Err(Error::Config(
            "no listen address: give -l/--listen ADDR (or start the server with systemd socket activation)"
                .into(),
        ));
    }
    // Held until the end: a later address (or the metrics listener) that collides with an
    // earlier one fails as it would in `run`.
    let bound = bind_listeners(config, bind, running, &mut |what, r| {
        notes.push(held_note(what, r))
    })?;
    let owner = nix::unistd::Uid::effective().as_raw();
    let result = (|| {
        if let Some(path) = control_path(name, config) {
            match bind_control(name, &path, owner) {
                Ok(c) => c.remove_file(),
                Err(_) if running.is_some() && path.exists() => {
                    notes.push(held_note(
                        &format!("control socket {}", path.display()),
                        running.expect("some"),
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(addr) = config.listeners.metrics_listen.as_deref() {
            match MetricsListener::bind(addr) {
                Ok(m) => drop(m),
                Err(e)
                    if in_use(&e)
                        && running.is_some()
                        && !config.listeners.listen.iter().any(|l| l.as_str() == addr) =>
                {
                    notes.push(held_note(
                        &format!("metrics listener {addr}"),
                        running.expect("some"),
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        for path in [
            config.files.log_file.as_deref(),
            config.files.access_log.as_deref(),
        ]
        .into_iter()
        .flatten()
        {
            let existed = path.exists();
            open_log(Some(path))?;
            if !existed {
                let _ = std::fs::remove_file(path);
            }
        }
        Ok(())
    })();
    bound.iter().for_each(Listener::remove_file);
    result.map(|()| notes)
}

/// Binds every `--listen` address as `run` would, and returns the sockets (the caller
/// removes their files). An address the running server (`running`) holds is told to
/// `held` instead; any other failure is returned, with no socket file left behind.
fn bind_listeners(
    config: &Config,
    bind: &BindOptions,
    running: Option<&control::RunningServer>,
    held: &mut dyn FnMut(&str, &control::RunningServer),
) -> Result<Vec<Listener>> {
    let in_use =
        |e: &Error| matches!(e, Error::Bind { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse);
    let mut bound = Vec::new();
    for addr in &config.listeners.listen {
        match listener::bind(addr, bind) {
            Ok(ls) => bound.extend(ls),
            Err(e) if in_use(&e) => match running {
                Some(r) if listener::labels_of(addr).iter().any(|l| r.listeners.contains(l)) => {
                    held(addr.as_str(), r);
                }
                _ => {
                    bound.iter().for_each(Listener::remove_file);
                    return Err(e);
                }
            },
            Err(e) => {
                bound.iter().for_each(Listener::remove_file);
                return Err(e);
            }
        }
    }
    Ok(bound)
}

/// The paths `start` takes by default that a command line for `check` did not give
/// (issue 41): start's default pid file (`/run/NAME.pid` as root,
/// `$XDG_RUNTIME_DIR/NAME.pid` otherwise) without `--pid-file`, and the control socket
/// that goes with it without `--control`.
#[derive(Debug, Default)]
pub(crate) struct StartDefaults {
    pub(crate) pid_file: Option<PathBuf>,
    pub(crate) control: Option<PathBuf>,
    /// No `--pid-file` was given and there is no default location (not root, and
    /// `XDG_RUNTIME_DIR` unset): `start` would refuse, `run` needs none.
    no_location: bool,
}

impl StartDefaults {
    /// The defaults `start` would add to `config`.
    pub(crate) fn of(name: &str, config: &Config) -> StartDefaults {
        if config.files.pid_file.is_some() {
            // The control socket is then beside the given pid file, or --control.
            return StartDefaults::default();
        }
        let pid_file = daemon::default_pid_file(name);
        let control = match &config.files.control {
            Some(_) => None,
            None => pid_file
                .as_deref()
                .map(|p| control::path_for_pid_file(name, p))
                .or_else(|| control::default_path(name)),
        };
        StartDefaults {
            no_location: pid_file.is_none(),
            pid_file,
            control,
        }
    }

    /// Looks at the default paths without taking them: a check must not take from a
    /// `start` (or another check) running at the same moment the path that is the same
    /// for every instance started without options. A pid file or control socket held by
    /// the running server (`running`) is a note; one held by another process, a directory
    /// that cannot be written, or a socket path too long, is `start`'s error now.
    fn probe(
        &self,
        name: &str,
        running: Option<&control::RunningServer>,
        notes: &mut Vec<String>,
    ) -> Result<()> {
        if self.no_location {
            notes.push(
                "no default pid file location (XDG_RUNTIME_DIR is not set): `start` needs --pid-file PATH; `run` in the foreground needs none"
                    .into(),
            );
        }
        if let Some(path) = self.pid_file.as_deref() {
            let shown = path.display();
            let err = |source: std::io::Error| Error::PidFile {
                path: path.to_owned(),
                source,
            };
            match daemon::running(path).map_err(err)? {
                daemon::Running::Yes(pid) => notes.push(match running {
                    Some(r) if r.pid == pid => format!(
                        "pid file {shown} (start's default): held by the running {name} (pid {pid}): `start` refuses while it runs; `reload` or `upgrade` replaces it"
                    ),
                    _ => format!(
                        "pid file {shown} (start's default): held by pid {pid}, a running {name} whose control socket did not answer: `start` refuses while it runs"
                    ),
                }),
                daemon::Running::Starting => notes.push(format!(
                    "pid file {shown} (start's default): held by a {name} that is starting"
                )),
                daemon::Running::No | daemon::Running::Stale(_) => writable_dir(path).map_err(err)?,
            }
        }
        if let Some(path) = self.control.as_deref() {
            let err = |source: std::io::Error| Error::Bind {
                addr: format!("control socket {}", path.display()),
                source,
            };
            match running {
                Some(r) if path.exists() => notes.push(format!(
                    "control socket {} (start's default): held by the running {name} (pid {}), as expected",
                    path.display(),
                    r.pid
                )),
                _ => {
                    socket2::SockAddr::unix(path).map_err(err)?;
                    if std::os::unix::net::UnixStream::connect(path).is_ok() {
                        return Err(Error::Config(format!(
                            "{}: another server has this control socket (another instance of {name}?); give this one its own with --control PATH, or its own --pid-file PATH.pid (its control socket is then PATH.sock)",
                            err(std::io::ErrorKind::AddrInUse.into())
                        )));
                    }
                    writable_dir(path).map_err(err)?;
                }
            }
        }
        Ok(())
    }
}

/// Whether a file can be created at `path`: the nearest existing directory above it is
/// a directory this process may write in (`start` creates the missing ones, as for the
/// default control socket's `/run/NAME`).
fn writable_dir(path: &Path) -> std::io::Result<()> {
    let mut dir = path.parent();
    while let Some(d) = dir {
        let d = if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        };
        if d.exists() {
            if !d.is_dir() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    format!("{} is not a directory", d.display()),
                ));
            }
            use nix::unistd::AccessFlags;
            return nix::unistd::access(d, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|e| {
                std::io::Error::new(
                    std::io::Error::from(e).kind(),
                    format!("the directory {} cannot be written: {}", d.display(), e.desc()),
                )
            });
        }
        dir = d.parent();
    }
    Ok(())
}

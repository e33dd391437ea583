//! The master's start-up, from the resolved command line to the supervision loop: take
//! over what systemd or an upgrading master handed over, close the other inherited
//! descriptors, resolve users, claim the pid file, bind, open the control socket, the
//! metrics listener and the log files (all of which report errors on the terminal),
//! detach if asked, publish the pid, install signal handlers, then supervise. Also the
//! start of a re-executed worker (`--exec-workers`), which adopts what its master handed
//! over instead.
//!
//! Everything comes in one [`Startup`]; the worker's code comes as its `entry`, so that the
//! master never names a connection driver.

use std::convert::Infallible;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use nix::unistd::Pid;

use super::pool::Policy;
use super::{Limits, Master, ReloadHook, Settings, Signals, UpgradeSettings};
use crate::cli::Config;
use crate::confine::privilege::{self, Confinement, Plan};
use crate::control::{self, Control, MetricsListener};
use crate::error::{Error, Result};
use crate::net::listener::{self, BindOptions, ListenAddr, Listener};
use crate::net::tls::Store;
use crate::peer_counts::PeerCounts;
use crate::process::daemon::{self, PidClaim, PidFile, Readiness};
use crate::process::exec::Handoff;
use crate::process::handover::{self, Inherited};
use crate::process::notify::{Channel, Message};
use crate::scoreboard::Board;
use crate::worker::{self, Recycle};

/// What the start-up is given: the resolved command line and what the program adds to it.
pub(crate) struct Startup<'a> {
    /// The server's name (log lines, default paths).
    pub(crate) name: &'a str,
    pub(crate) config: Config,
    /// The socket options of the listeners, bound or adopted.
    pub(crate) bind: BindOptions,
    pub(crate) policy: Policy,
    pub(crate) limits: Limits,
    pub(crate) on_reload: Option<ReloadHook>,
    pub(crate) upgrade: UpgradeSettings,
    /// Runs a worker to its end, in the child side of a fork or in a re-executed worker
    /// (the handler and its level are the caller's).
    pub(crate) entry: &'a mut dyn FnMut(worker::Setup<'_>) -> Infallible,
}

/// What the master prepares before it detaches, so that every error in it reaches the
/// terminal: users, the pid file's claim, listeners, the control socket and the metrics
/// listener.
struct Prepared {
    plan: Plan,
    warning: Option<String>,
    claim: Option<PidClaim>,
    listeners: Vec<Listener>,
    control: Option<Control>,
    metrics: Option<MetricsListener>,
    access_log: Option<File>,
    /// Started by an upgrading master: publish the pid file by rename, once serving.
    publish_pid: bool,
    /// Started by systemd socket activation: the listeners are systemd's too.
    from_systemd: bool,
    /// The listeners' TLS material.
    tls: Store,
    /// With --exec-workers: the program (opened at start) and its command line.
    exec: Option<(File, Vec<CString>)>,
}

/// The master's start-up (see the module's documentation). Returns after a clean stop;
/// an error once detached is also reported to whoever waits for the master to be ready.
pub(crate) fn start(mut s: Startup<'_>) -> Result<()> {
    let mut inherited = inherit(&s.upgrade.keep_fds)?;
    let (plan, warning) = resolve_users(&s.config)?;
    s.config.confinement()?.check()?;
    let from_upgrade = matches!(
        inherited.as_ref().map(|i| i.source),
        Some(handover::Source::Upgrade { .. })
    );
    let from_systemd = matches!(
        inherited.as_ref().map(|i| i.source),
        Some(handover::Source::Systemd)
    );
    if from_upgrade {
        // Already detached (the old master's child, in its session); the pid file is
        // taken over by rename, not claimed (the old master still holds its lock).
        s.config.files.daemon = false;
    }
    let config = &s.config;
    let claim = match from_upgrade {
        true => None,
        false => config
            .files
            .pid_file
            .as_deref()
            .map(PidClaim::acquire)
            .transpose()?,
    };
    let listeners = open_listeners(config, &s.bind, inherited.as_mut())?;
    // A start that fails from here on leaves none of the socket files it created (issue
    // 34: a stale socket of a failed start misleads the next one and `status`). Sockets
    // inherited from an upgrading master or from systemd are theirs, and stay.
    let fresh = inherited.is_none();
    let undo = |listeners: &[Listener], control: Option<&Control>| {
        if fresh {
            listeners.iter().for_each(Listener::remove_file);
            control.into_iter().for_each(Control::remove_file);
        }
    };
    let opened = (|| {
        let tls = load_tls(config, &listeners)?;
        let exec = open_program(config, &s.upgrade.argv)?;
        let (control, metrics) = open_control(s.name, config, inherited.as_mut())?;
        Ok((tls, exec, control, metrics))
    })();
    let (tls, exec, control, metrics) = opened.inspect_err(|_| undo(&listeners, None))?;
    let detached = (|| {
        let access_log = open_log(config.files.access_log.as_deref())?;
        let log_file = open_log(config.files.log_file.as_deref())?;
        let ready_pipe = inherited.as_mut().and_then(|i| i.ready.take());
        Ok((access_log, detach(config, log_file, ready_pipe)?))
    })();
    let (access_log, mut readiness) = detached.inspect_err(|_| undo(&listeners, control.as_ref()))?;
    let prepared = Prepared {
        plan,
        warning,
        claim,
        listeners,
        control,
        metrics,
        access_log,
        publish_pid: from_upgrade,
        from_systemd,
        tls,
        exec,
    };
    let result = serve(s, prepared, &mut readiness);
    if let Err(e) = &result {
        readiness.failed(&e.to_string());
    }
    result
}

/// Adopts the sockets handed over by an upgrading master, or by systemd, as the
/// environment names them, then closes every other inherited descriptor but `keep_fds`,
/// before the master opens anything of its own.
fn inherit(keep_fds: &[RawFd]) -> Result<Option<Inherited>> {
    if let Some(fd) = keep_fds.iter().find(|fd| **fd < 0) {
        return Err(Error::Config(format!("keep_fd({fd}): not a descriptor number")));
    }
    let inherited = handover::inherited()?;
    close_strays(keep_fds, inherited.as_ref())?;
    Ok(inherited)
}

fn resolve_users(config: &Config) -> Result<(Plan, Option<String>)> {
    privilege::resolve(
        config.confine.user.as_deref(),
        config.confine.group.as_deref(),
        config.confine.allow_root_workers,
    )
}

/// The listeners: those inherited, or bound now.
fn open_listeners(
    config: &Config,
    bind: &BindOptions,
    inherited: Option<&mut Inherited>,
) -> Result<Vec<Listener>> {
    match inherited {
        Some(i) => {
            if i.source == handover::Source::Systemd && !config.listeners.listen.is_empty() {
                tracing::info!(
                    "using the {} socket(s) systemd passed (LISTEN_FDS); --listen is not bound",
                    i.listeners.len()
                );
            }
            let all = adopt_all(config, bind, std::mem::take(&mut i.listeners), i.origins.take())?;
            // The configuration check saw --listen; the sockets passed are what is served.
            let datagram = all.iter().find(|l| l.is_datagram());
            if let (Some(d), true, true) = (
                datagram,
                all.iter().any(|l| !l.is_datagram()),
                !matches!(config.workers.io, crate::Io::Event | crate::Io::Async),
            ) {
                return Err(listener::mixed_needs_event_loop(
                    &d.label(),
                    config.workers.io.name(),
                ));
            }
            Ok(all)
        }
        None => bind_all(config, bind),
    }
}

/// The listeners' TLS material, read now, as root if started so, and before detaching: a
/// bad file is reported on the terminal.
fn load_tls(config: &Config, listeners: &[Listener]) -> Result<Store> {
    let tls = Store::load(tls_sources(config, listeners)?)?;
    // Said by the master only (a re-executed worker reads the same sources again).
    if !config.listeners.listen.iter().any(ListenAddr::is_tls)
        && (config.tls.defaults.cert.is_some() || config.tls.defaults.key.is_some())
    {
        tracing::warn!(
            "--tls-cert/--tls-key are set but no listener has the tls option (ADDR?tls): they are not used"
        );
    }
    Ok(tls)
}

/// With --exec-workers: this program's binary, opened now so that workers run this
/// program even if the file is replaced or removed later (a new binary is for
/// `upgrade`), and its command line `argv`.
fn open_program(config: &Config, argv: &[std::ffi::OsString]) -> Result<Option<(File, Vec<CString>)>> {
    if !config.workers.exec_workers {
        return Ok(None);
    }
    Ok(Some((
        File::open("/proc/self/exe")
            .map_err(|e| Error::sys("opening this program's binary (/proc/self/exe)", e))?,
        crate::process::exec::c_args(argv).map_err(Error::Config)?,
    )))
}

/// The control socket and the metrics listener: those inherited, or bound now.
fn open_control(
    name: &str,
    config: &Config,
    mut inherited: Option<&mut Inherited>,
) -> Result<(Option<Control>, Option<MetricsListener>)> {
    let control_path = control_path(name, config);
    let owner = nix::unistd::Uid::effective().as_raw();
    let inherited_control = inherited.as_mut().and_then(|i| i.control.take());
    let bound_here = inherited_control.is_none();
    let control = match (control_path.as_deref(), inherited_control) {
        (Some(p), Some(sock)) => Some(Control::adopt(sock, p, owner)?),
        (Some(p), None) => Some(bind_control(name, p, owner)?),
        (None, _) => None,
    };
    let metrics = match (
        config.listeners.metrics_listen.as_deref(),
        inherited.and_then(|i| i.metrics.take()),
    ) {
        (Some(_), Some(sock)) => MetricsListener::adopt(sock).map(Some),
        (Some(addr), None) => MetricsListener::bind(addr).map(Some),
        (None, _) => Ok(None),
    };
    match metrics {
        Ok(metrics) => Ok((control, metrics)),
        Err(e) => {
            // A control socket bound here is not left behind (an adopted one is the
            // upgrading master's).
            if let (Some(c), true) = (&control, bound_here) {
                c.remove_file();
            }
            Err(e)
        }
    }
}

/// Binds the control socket at `path`; a socket another server accepts on is refused with
/// the way out (issue 34).
fn bind_control(name: &str, path: &Path, owner: u32) -> Result<Control> {
    Control::bind(path, owner).map_err(|e| match &e {
        Error::Bind { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse => Error::Config(format!(
            "{e}: another server has this control socket (another instance of {name}?); give this one its own with --control PATH, or its own --pid-file PATH.pid (its control socket is then PATH.sock)"
        )),
        _ => e,
    })
}

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
    let mut bound = Vec::new();
    for addr in &config.listeners.listen {
        match listener::bind(addr, bind) {
            Ok(ls) => bound.extend(ls),
            Err(e) if in_use(&e) => match running {
                Some(r) if listener::labels_of(addr).iter().any(|l| r.listeners.contains(l)) => {
                    notes.push(held_note(addr.as_str(), r));
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

/// The line `start` prints once the server is ready: its pid, addresses and files.
fn summary(name: &str, config: &Config, listeners: &[Listener], metrics: Option<&MetricsListener>) -> String {
    let addrs: Vec<String> = listeners.iter().map(Listener::label).collect();
    let mut line = format!(
        "{name}: started, pid {}, listening on {}",
        std::process::id(),
        addrs.join(", ")
    );
    if let Some(m) = metrics {
        line.push_str(&format!(", metrics on http://{}/metrics", m.local_addr()));
    }
    let path = |p: Option<&PathBuf>| p.map_or_else(|| "none".to_owned(), |p| p.display().to_string());
    line.push_str(&format!(
        "; pid file {}, log file {}, control socket {}",
        path(config.files.pid_file.as_ref()),
        path(config.files.log_file.as_ref()),
        path(control_path(name, config).as_ref())
    ));
    line
}

/// Opens the log file at `path`, if any: the master's alone (see `log::open_log`).
fn open_log(path: Option<&Path>) -> Result<Option<File>> {
    path.map(crate::process::log::open_log).transpose()
}

/// Detaches with `--daemon`, and sends stderr to the log file if there is one. Returns
/// where to report readiness: the `start` command's pipe, an upgrading master's
/// (`ready_pipe`), or nowhere.
fn detach(config: &Config, log_file: Option<File>, ready_pipe: Option<File>) -> Result<Readiness> {
    let mut readiness = match (&log_file, config.files.daemon) {
        (Some(log), true) => daemon::daemonize(log, config.timeouts.start_timeout)?,
        (Some(log), false) => {
            crate::process::log::redirect_stderr(log)
                .map_err(|e| Error::sys("redirecting stderr to the log file", e))?;
            Readiness::none()
        }
        (None, _) => Readiness::none(),
    };
    drop(log_file); // stderr holds it now
    if let Some(pipe) = ready_pipe {
        readiness = Readiness::to(pipe);
    }
    Ok(readiness)
}

/// The master's life once detached: the pid file around the supervision.
fn serve(s: Startup<'_>, mut prepared: Prepared, readiness: &mut Readiness) -> Result<()> {
    // A master started by an upgrade publishes its pid only once it serves: until then the
    // old master's pid stays in the file (it goes on serving if this one fails).
    let late_pid = match (&s.config.files.pid_file, prepared.publish_pid) {
        (Some(path), true) => Some(path.clone()),
        _ => None,
    };
    let pid_file = match prepared.claim.take() {
        Some(c) => Some(c.commit(Pid::this())?),
        None => None,
    };
    let result = supervise(
        s,
        prepared,
        Announce {
            pid_file: pid_file.as_ref(),
            late_pid,
            readiness,
        },
    );
    if let Some(p) = &pid_file {
        p.remove();
    }
    result
}

/// How the master says it serves: the readiness pipe, and the pid file (claimed at start,
/// or published by rename once serving after an upgrade).
struct Announce<'r> {
    pid_file: Option<&'r PidFile>,
    /// The pid file to publish once serving.
    late_pid: Option<PathBuf>,
    readiness: &'r mut Readiness,
}

impl Announce<'_> {
    /// The descriptors workers close: the pid file's and the readiness pipe's.
    fn fds(&self) -> Vec<RawFd> {
        self.pid_file
            .map(PidFile::raw_fd)
            .into_iter()
            .chain(self.readiness.raw_fd())
            .collect()
    }

    /// The first workers are ready: publishes the pid file if it is late, and tells
    /// whoever waits (with `summary`, the line `start` prints). Returns the published pid
    /// file, for the master to remove on exit.
    fn ready(&mut self, summary: &str) -> Option<PidFile> {
        let published = self
            .late_pid
            .as_deref()
            .and_then(|path| match daemon::publish(path, Pid::this()) {
                Ok(f) => Some(f),
                Err(e) => {
                    tracing::error!("{e}");
                    None
                }
            });
        self.readiness.ready(summary);
        published
    }
}

/// What the master and its workers share, made once before the first fork: the workers'
/// notification pipe, the master's signal handlers, and the shared memory and channels
/// the configuration asks for. A failure names the resource and stops the start.
struct Shared {
    channel: Channel,
    signals: Signals,
    board: &'static Board,
    /// Event workers with `--max-conns-per-ip`: the connections per client address.
    peers: Option<&'static PeerCounts>,
    /// Hybrid mode: the hand-off channel from the fronts to the workers.
    handoff: Option<crate::net::handoff::Channel>,
}

impl Shared {
    fn new(config: &Config) -> Result<Shared> {
        let channel = Channel::new().map_err(|e| Error::sys("creating the notification pipe", e))?;
        let signals = Signals::install().map_err(|e| Error::sys("installing signal handlers", e))?;
        let board = Board::new().map_err(|e| Error::sys("mapping shared memory", e))?;
        crate::process::log::count_dropped_in(board.log_dropped());
        // Event workers count their connections per address in shared tables, one per worker
        // id (any id the master may give: pages are allocated only when used).
        let peers = (config.workers.io != crate::cli::Io::Blocking && config.access.max_conns_per_ip > 0)
            .then(|| PeerCounts::new(crate::scoreboard::MAX_WORKERS, config.workers.worker_connections))
            .transpose()
            .map_err(|e| Error::sys("mapping the per-address tables", e))?;
        // Failed authentication: the penalized addresses, shared by every worker and installed
        // for the process (handlers charge it through `Conn::penalize`; issue 31).
        if let Some(max) = config.access.penalty_max {
            crate::penalty::create(max).map_err(|e| Error::sys("mapping the penalty table", e))?;
        }
        // Hybrid mode: the fronts hand connections to the workers over one channel, made now
        // and kept for the master's life (a reload's generations share it).
        let handoff = (config.workers.io == crate::Io::Hybrid)
            .then(crate::net::handoff::Channel::new)
            .transpose()
            .map_err(|e| Error::sys("creating the hand-off channel", e))?;
        Ok(Shared {
            channel,
            signals,
            board,
            peers,
            handoff,
        })
    }
}

/// Logs what the master serves and how, then runs the master until it stops.
fn supervise(s: Startup<'_>, prepared: Prepared, mut announce: Announce<'_>) -> Result<()> {
    let Startup {
        name,
        config,
        policy,
        limits,
        on_reload,
        upgrade,
        entry,
        ..
    } = s;
    let request_timeout = limits.request_timeout;
    let config = &config;
    let adopted = prepared.publish_pid;
    let shared_listeners = prepared.from_systemd;
    let Prepared {
        plan,
        warning,
        listeners,
        control,
        metrics,
        access_log,
        tls,
        exec,
        ..
    } = prepared;
    let tls = std::rc::Rc::new(tls);
    let listeners = &listeners[..];
    // With a privileged helper, unprivileged workers are the design: "started as root
    // without --user" is no warning then (the helpers keep what root is needed for).
    let warning = warning.filter(|_| config.confine.helper_profile.is_none());
    log_start(
        listeners,
        metrics.as_ref(),
        warning,
        &plan,
        config.confine.helper_profile.is_some(),
    );
    let summary = summary(name, config, listeners, metrics.as_ref());
    let Shared {
        channel,
        signals,
        board,
        peers,
        handoff,
    } = Shared::new(config)?;
    let worker_dir = upgrade.dir.clone();
    let settings = Settings {
        name: name.to_owned(),
        policy,
        board,
        grace_period: config.timeouts.grace_period,
        drain_delay: config.timeouts.drain_delay,
        log_file: config.files.log_file.clone(),
        access_log: config.files.access_log.clone(),
        master_fds: announce.fds(),
        limits,
        control,
        metrics,
        on_reload,
        upgrade,
        adopted,
        shared_listeners,
        tls: tls.clone(),
        watch_queue: config.workers.io == crate::Io::Blocking,
        io: config.workers.io.name(),
    };
    let confinement = confinement(config, &plan)?;
    let workers = Workers {
        config,
        master: Pid::this(),
        listeners,
        plan: &plan,
        channel: &channel,
        board,
        peers,
        access_log: access_log.as_ref(),
        confinement: &confinement,
        tls: &tls,
        handoff: handoff.as_ref(),
        request_timeout,
    };
    let mut spawn = |id: u32, role: worker::Role, recycle: Recycle, master_fds: &[RawFd]| -> Infallible {
        if let Some((exe, argv)) = &exec {
            workers.exec(exe, argv, worker_dir.as_deref(), id, recycle);
        }
        entry(workers.setup(id, role, recycle, master_fds))
    };
    let mut published: Option<PidFile> = None;
    let result = Master::new(settings, listeners, &channel, signals)?
        .with_peer_counts(peers)
        .with_fronts(handoff.as_ref().map(|ch| (config.workers.fronts.max(1), ch)))
        .run(&mut spawn, &mut || published = announce.ready(&summary));
    if let Some(p) = &published {
        p.remove();
    }
    result
}

/// The start's log lines: the listeners, the metrics listener, a warning about the users,
/// the workers' user (and that each has a privileged helper, `helper`).
fn log_start(
    listeners: &[Listener],
    metrics: Option<&MetricsListener>,
    warning: Option<String>,
    plan: &Plan,
    helper: bool,
) {
    for l in listeners {
        tracing::info!("listening on {}", l.label());
    }
    if let Some(m) = metrics {
        tracing::info!("serving metrics on http://{}/metrics", m.local_addr());
    }
    if let Some(w) = warning {
        // The documented default (workers as nobody), said, not warned about (issue 34).
        tracing::info!("{w}");
    }
    if let Plan::Drop(c) = plan {
        tracing::info!(
            "workers will run as user {} (uid {}, gid {}{})",
            c.user,
            c.uid,
            c.gid,
            if helper {
                "), each beside its privileged helper (uid 0"
            } else {
                ""
            }
        );
    }
}

/// How workers are confined, with a warning for a chroot that root can leave.
fn confinement(config: &Config, plan: &Plan) -> Result<Confinement> {
    let confinement = config.confinement()?;
    if let Some(dir) = &confinement.chroot {
        tracing::info!("workers chroot to {}", dir.display());
        if matches!(plan, Plan::Keep) && nix::unistd::Uid::effective().is_root() {
            tracing::warn!(
                "--chroot {} with workers that stay root: root can leave a chroot; give --user",
                dir.display()
            );
        }
    }
    Ok(confinement)
}

/// What every worker is started with: by the master at fork, or by a re-executed worker
/// from its master's hand-off.
struct Workers<'a> {
    config: &'a Config,
    master: Pid,
    listeners: &'a [Listener],
    plan: &'a Plan,
    channel: &'a Channel,
    board: &'static Board,
    peers: Option<&'static PeerCounts>,
    access_log: Option<&'a File>,
    confinement: &'a Confinement,
    tls: &'a Store,
    handoff: Option<&'a crate::net::handoff::Channel>,
    /// `--request-timeout` as the master applies it (async workers cancel a call past it).
    request_timeout: Option<std::time::Duration>,
}

impl Workers<'_> {
    /// The set-up of worker `id`.
    fn setup<'s>(
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
            keepalive_timeout: config.timeouts.keepalive_timeout,
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
                // issue 43: Model::Async comes with the pairing
                crate::Io::Async => worker::Model::Event,
            },
            worker_connections: config.workers.worker_connections,
            slow_request: config.timeouts.slow_request,
            datagram: worker::datagram::Settings {
                max_size: config.access.max_datagram_size as usize,
                max_answers_per_ip: u32::try_from(config.access.max_answers_per_ip).unwrap_or(u32::MAX),
                answer_prefixes: config.access.answer_prefixes,
                slip: u32::try_from(config.access.answers_slip).unwrap_or(u32::MAX),
                access_sample: u32::try_from(config.files.access_log_sample).unwrap_or(u32::MAX),
                request_detail: config.listeners.status_request_detail,
            },
            role,
            handoff: self.handoff,
            async_limits: worker::AsyncLimits {
                max_inflight: config.workers.max_inflight,
                request_timeout: self.request_timeout,
                read_timeout: config.timeouts.read_timeout,
            },
        }
    }

    /// In the child just forked: becomes the program again (`--exec-workers`), as worker
    /// `id`, in `dir` (the master's working directory at start, so that the command line's
    /// relative paths mean the same to the worker). Reports a failure to the master.
    fn exec(&self, exe: &File, argv: &[CString], dir: Option<&Path>, id: u32, recycle: Recycle) -> ! {
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

/// A re-executed worker (`--exec-workers`): takes what the master handed over and runs as
/// worker. Never returns once the handoff is read; an error before the worker runs is
/// reported to the master, as a worker's start failure.
pub(crate) fn exec_worker(
    s: Startup<'_>,
    handoff: std::result::Result<Handoff, String>,
) -> Result<Infallible> {
    let handoff = handoff.map_err(Error::Config)?;
    let config = &s.config;
    // The master listed this descriptor as the notification pipe's write end.
    let channel = adopt(handoff.channel, "adopting the notification pipe").map(Channel::from_write_end)?;
    let fail = |reason: String| -> ! {
        tracing::error!("cannot start: {reason}");
        let _ = channel.send(std::process::id(), &Message::StartFailed(reason));
        crate::sys::exit_now(crate::sys::exit::START_FAILED)
    };
    let (plan, listeners, tls, (board, peers), access, confinement) =
        match adopt_handoff(config, &s.bind, &handoff) {
            Ok(p) => p,
            Err(e) => fail(e.to_string()),
        };
    let workers = Workers {
        config,
        master: Pid::from_raw(handoff.master),
        listeners: &listeners,
        plan: &plan,
        channel: &channel,
        board,
        peers,
        access_log: access.as_ref(),
        confinement: &confinement,
        tls: &tls,
        // The configuration check refuses --exec-workers with --io hybrid.
        handoff: None,
        request_timeout: s.limits.request_timeout,
    };
    let recycle = Recycle {
        max_requests: handoff.max_requests,
        max_connections: handoff.max_connections,
    };
    // `entry` never returns (the worker ends in `_exit`); `Ok` only gives it the type.
    #[allow(unreachable_code)]
    Ok((s.entry)(workers.setup(
        handoff.id,
        worker::Role::Worker,
        recycle,
        &[],
    )))
}

/// Takes ownership of descriptor `fd` of a re-executed worker's hand-off (`what` names it
/// in the error). Only for the numbers its `APPSRV_WORKER` variable lists, each once: a
/// number that comes from the environment, which no type can vouch for.
fn adopt(fd: RawFd, what: &'static str) -> Result<std::os::fd::OwnedFd> {
    // SAFETY: a descriptor the master kept open across the exec for this process alone
    // (the callers adopt each number of the hand-off once); nothing else here owns it.
    unsafe { crate::sys::adopt_fd(fd) }.map_err(|e| Error::sys(what, e))
}

/// What a re-executed worker adopts from its master's hand-off, and what it reads again as
/// the master did: users, listeners, TLS material, the scoreboard, the access log, the
/// wake-up eventfd, the confinement.
#[allow(clippy::type_complexity)] // the parts, named once, taken apart by the caller
fn adopt_handoff(
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

/// Closes the descriptors the master inherited from whatever started it, but stdio, the
/// hand-over of systemd or of an upgrading master (`inherited`) and those the application
/// keeps (see `Server::keep_fd`).
fn close_strays(keep: &[RawFd], inherited: Option<&Inherited>) -> Result<()> {
    let mut keep = keep.to_vec();
    keep.extend(inherited.map(Inherited::fds).unwrap_or_default());
    // SAFETY: this runs at the master's start, before it opens anything; what appsrv and
    // Rust's std open is close-on-exec (and so is what `inherited` adopted, which is kept
    // too), so the descriptors without close-on-exec are those the parent left open and
    // those the application opened so, which `keep_fd` documents it must name.
    let closed = unsafe { crate::sys::close_stray_fds(&keep) }
        .map_err(|e| Error::sys("closing inherited descriptors", e))?;
    if !closed.is_empty() {
        // At debug (issue 34): every start from a shell or a supervisor inherits some, and
        // nothing is wrong; the line came before any start-up error on the terminal.
        tracing::debug!(
            "closed {} descriptor(s) inherited from the process that started this one",
            closed.len()
        );
        tracing::debug!("inherited descriptors closed: {closed:?}");
    }
    Ok(())
}

/// Takes over inherited listening sockets (upgrade, socket activation), with this
/// configuration's options.
fn adopt_all(
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
fn tls_sources(config: &Config, listeners: &[Listener]) -> Result<Vec<Option<crate::net::tls::Source>>> {
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
fn global_policy(config: &Config) -> listener::Policy {
    listener::Policy {
        allow: config.access.allow.clone(),
        deny: config.access.deny.clone(),
        proxy: config.access.proxy_protocol,
        proxy_from: config.access.proxy_from.clone(),
    }
}

fn bind_all(config: &Config, opts: &BindOptions) -> Result<Vec<Listener>> {
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

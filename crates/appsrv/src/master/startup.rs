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
use std::os::fd::RawFd;
use std::path::PathBuf;

use nix::unistd::Pid;

use super::exec::{adopt, adopt_handoff};
pub(crate) use super::open::control_path;
use super::open::{adopt_all, bind_all, bind_control, open_log, resolve_users, tls_sources};
use super::pool::Policy;
pub(crate) use super::rehearse::{StartDefaults, rehearse};
use super::setup::Workers;
use super::{Limits, Master, ReloadHook, Settings, Signals, UpgradeSettings};
use crate::cli::Config;
use crate::confine::privilege::{Confinement, Plan};
use crate::control::{Control, MetricsListener};
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
    /// Each driver's own settings, for every worker (the master does not read them).
    pub(crate) drivers: worker::Drivers,
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
        drivers: s.drivers,
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
        drivers: s.drivers,
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

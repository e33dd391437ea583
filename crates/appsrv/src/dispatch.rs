//! The subcommand dispatch: what a program does with its parsed command line. `run` and
//! `start` resolve the configuration and hand it to the master's start-up (or, in a
//! re-executed worker, to the worker's); `check` checks it; `stop`, `reload`, `upgrade`,
//! `status`, `metrics` and `workers` act on a running server and exit the process.
//!
//! The worker's code is chosen here, at the user-API level (a handler for whole
//! connections or for requests), and handed to the master as a plain entry function.

use std::convert::Infallible;
use std::ffi::OsString;
use std::os::fd::RawFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ArgMatches;

use crate::cli::{self, Config};
use crate::confine::privilege;
use crate::confine::sandbox::Sandbox;
use crate::control;
use crate::error::{BoxError, Error, Result};
use crate::master::pool::Policy;
use crate::master::startup::{self, Startup};
use crate::master::{Limits as MasterLimits, ReloadHook, UpgradeSettings};
use crate::net::listener::{BindOptions, ListenAddr};
use crate::process::daemon;
use crate::worker::ServedBy;
use crate::worker::serve::Limits;
use crate::worker::{self, Recycle, StartHook};

/// An application hook run in the master (reload, check).
pub(crate) type Hook = Box<dyn FnMut() -> std::result::Result<(), BoxError>>;

/// What the builder collected for the dispatch: the program's name, hooks and command line.
pub(crate) struct Program {
    pub(crate) name: String,
    /// The program's own sandbox profile (`Server::sandbox`).
    pub(crate) sandbox_profile: Sandbox,
    pub(crate) start_hook: Option<StartHook>,
    /// This program's binary, as found at start (a binary upgrade starts the file now at
    /// that path).
    pub(crate) exe: Option<PathBuf>,
    /// The working directory at start (a new master re-reads the same, maybe relative,
    /// command line from there).
    pub(crate) dir: Option<PathBuf>,
    pub(crate) reload_hook: Option<Hook>,
    pub(crate) check_hook: Option<Hook>,
    /// The command line, the program's name first.
    pub(crate) args: Vec<OsString>,
    /// Inherited descriptors the master keeps open at start (`Server::keep_fd`).
    pub(crate) keep_fds: Vec<RawFd>,
    /// Each worker's privileged helper (`Server::privileged`), and its sandbox profile.
    pub(crate) helper: Option<Box<dyn crate::privileged::Spawn>>,
    pub(crate) helper_profile: Sandbox,
    /// The datagram handler's factory (`Server::datagrams`), and whether the server serves
    /// datagrams only (`Server::run_datagrams`).
    pub(crate) datagrams: Option<worker::datagram::Factory>,
    pub(crate) datagram_only: bool,
    /// The request handler's `Session` holds state (hybrid mode cannot serve it).
    pub(crate) stateful_sessions: bool,
    /// The handler is async (`Server::run_async_requests`, `Server::run_async`): async
    /// workers only (`--io async`).
    pub(crate) asynchronous: bool,
    /// The program's `--grace-period` and `--drain-delay` defaults: what `stop` assumes
    /// when the server cannot be asked.
    pub(crate) grace_period: Duration,
    pub(crate) drain_delay: Duration,
}

/// Sets up logging as `run`, `start` and `check` will (the same level and format; the
/// later set-up in `launch` then finds it done), so that what the application logs between
/// `Server::args` and `run` (its own start-up work, in the master) is not lost. The other
/// subcommands log nothing of the server's.
pub(crate) fn init_logging(name: &str, matches: &ArgMatches) {
    let (m, daemon) = match matches.subcommand() {
        None => (matches, false),
        Some(("run" | "check", m)) => (m, false),
        Some(("start", m)) => (m, true),
        Some(_) => return,
    };
    let mut config = cli::config(m);
    config.files.daemon = daemon;
    crate::process::log::init(name, config.files.log_level, log_format(&config));
}

/// The subcommand `matches` names: `run` when none is given, and `worker` in a worker
/// started again by `--exec-workers` (it runs `main` with the master's command line, but
/// none of the master's start-up work is its to do).
pub(crate) fn subcommand(matches: &ArgMatches) -> &str {
    if crate::process::exec::from_env().is_some() {
        return "worker";
    }
    matches.subcommand().map_or("run", |(name, _)| name)
}

/// The workers' identity for `run`, `start` and `check` (`None`: they keep the master's);
/// `None` for the subcommands that start no worker.
pub(crate) fn worker_identity(matches: &ArgMatches) -> Result<Option<privilege::WorkerIdentity>> {
    let Some(config) = serving_config(matches) else {
        return Ok(None);
    };
    let (plan, _warning) = privilege::resolve(
        config.confine.user.as_deref(),
        config.confine.group.as_deref(),
        config.confine.allow_root_workers,
    )?;
    Ok(match plan {
        privilege::Plan::Keep => None,
        privilege::Plan::Drop(credentials) => Some((&credentials).into()),
    })
}

/// Runs the subcommand of `matches`. `make_factory` makes the workers' handler factory
/// from the request-level limits (`request_level`: the handler gets requests, not whole
/// connections). Returns after a clean stop; the subcommands that act on a running server
/// and `check` exit the process.
pub(crate) fn launch<C, F, M>(
    mut program: Program,
    matches: &ArgMatches,
    request_level: bool,
    make_factory: M,
) -> Result<()>
where
    C: ServedBy,
    F: FnMut() -> std::result::Result<C, BoxError>,
    M: FnOnce(Limits) -> F,
{
    let mut config = serve_config(&mut program, matches, request_level)?;
    crate::process::log::init(&program.name, config.files.log_level, log_format(&config));
    for var in cli::unknown_env_vars() {
        tracing::warn!(
            "{var} is set but names no option of {}: ignored (misspelt?)",
            program.name
        );
    }
    resolve_paths(&program.name, &mut config)?;
    let limits = Limits {
        keepalive_timeout: config.timeouts.keepalive_timeout,
        read_timeout: config.timeouts.read_timeout,
        keepalive_requests: config.timeouts.keepalive_requests,
        header_timeout: config.timeouts.header_timeout,
        header_timeout_max: config.timeouts.header_timeout_max,
        min_rate: config.timeouts.min_rate,
        request_detail: config.listeners.status_request_detail,
    };
    if request_level {
        // Connections inherit the listener's timeout: between requests, that is the
        // keep-alive timeout (the loop switches to the read timeout only when a
        // request arrives in pieces).
        config.timeouts.read_timeout = config.timeouts.keepalive_timeout;
    }
    check_io(&config, accepts(&program, request_level))?;
    let policy = pool_policy(&config)?;
    let master_limits = master_limits(&config, request_level)?;
    let mut factory = make_factory(limits);
    let mut start_hook = program.start_hook.take();
    let mut helper = program.helper.take();
    let mut datagrams = program.datagrams.take();
    let mut entry = |setup: worker::Setup<'_>| -> Infallible {
        worker::run(setup, &mut start_hook, &mut helper, &mut datagrams, &mut factory)
    };
    let upgrade = UpgradeSettings {
        dir: program.dir.clone(),
        exe: program.exe.clone(),
        argv: program.args.clone(),
        timeout: config.timeouts.start_timeout,
        keep_fds: program.keep_fds.clone(),
    };
    let drivers = drivers(&config, request_level);
    let startup = Startup {
        name: &program.name,
        bind: bind_options(&config),
        config,
        policy,
        limits: master_limits,
        on_reload: program.reload_hook.take().map(ReloadHook),
        upgrade,
        drivers,
        entry: &mut entry,
    };
    // Started by a master as a re-executed worker (--exec-workers): be that worker.
    if let Some(handoff) = crate::process::exec::from_env() {
        return startup::exec_worker(startup, handoff).map(|never| match never {});
    }
    startup::start(startup)
}

/// Each driver's own settings, from the command line: the master carries them to every
/// worker without reading them (issue 43).
fn drivers(config: &Config, request_level: bool) -> worker::Drivers {
    worker::Drivers {
        keepalive_timeout: config.timeouts.keepalive_timeout,
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
        tasks: worker::AsyncLimits {
            max_inflight: config.workers.max_inflight,
            request_timeout: effective_request_timeout(config, request_level),
            read_timeout: config.timeouts.read_timeout,
        },
    }
}

/// The configuration of `run`, `start` (as `run --daemon`) and `check`; the other
/// subcommands run here and exit the process.
fn serve_config(program: &mut Program, matches: &ArgMatches, request_level: bool) -> Result<Config> {
    let config = |m: &ArgMatches| {
        let mut c = cli::config(m);
        c.confine.sandbox_profile = program.sandbox_profile.clone();
        c.confine.helper_profile = program.helper.as_ref().map(|_| program.helper_profile.clone());
        let io_given = m.value_source("io") != Some(clap::parser::ValueSource::DefaultValue);
        c.workers.io = accepts(program, request_level).io_model(&c.listeners.listen, c.workers.io, io_given);
        c
    };
    match matches.subcommand() {
        // No subcommand: the top-level command is `run`.
        None => Ok(config(matches)),
        Some(("run", m)) => Ok(config(m)),
        Some(("start", m)) => {
            let mut config = config(m);
            config.files.daemon = true;
            Ok(config)
        }
        Some(("stop", m)) => {
            let target = target(&program.name, m);
            let facts = control::stop_facts(&target.control);
            let assumed = m
                .get_one::<Duration>("grace-period")
                .copied()
                .unwrap_or(program.grace_period)
                + m.get_one::<Duration>("drain-delay")
                    .copied()
                    .unwrap_or(program.drain_delay);
            std::process::exit(daemon::stop_command(
                &program.name,
                daemon::Stop {
                    pid_file: target.pid_file,
                    control: target.control,
                    facts,
                    now: m.get_flag("now"),
                    timeout: m.get_one::<Duration>("timeout").copied(),
                    assumed,
                },
            ))
        }
        Some(("reload", m)) => {
            let path = target(&program.name, m).control;
            let timeout = *m.get_one::<Duration>("timeout").expect("has a default");
            std::process::exit(control::reload_command(&program.name, &path, timeout))
        }
        Some(("upgrade", m)) => {
            let path = target(&program.name, m).control;
            let timeout = *m.get_one::<Duration>("timeout").expect("has a default");
            std::process::exit(control::upgrade_command(&program.name, &path, timeout))
        }
        Some(("check", m)) => {
            let config = config(m);
            check_command(program, config, request_level)
        }
        Some(("metrics", m)) => {
            let format = m.get_one::<String>("format").expect("has a default");
            let format = control::MetricsFormat::from_name(format).expect("one of the possible values");
            let path = target(&program.name, m).control;
            std::process::exit(control::metrics_command(&program.name, &path, format))
        }
        Some(("health", m)) => {
            let path = target(&program.name, m).control;
            std::process::exit(control::health_command(&program.name, &path))
        }
        Some((sub @ ("status" | "workers"), m)) => {
            let request = match sub {
                "status" => control::Request::Status {
                    json: m.get_flag("json"),
                },
                _ => control::Request::Workers(*m.get_one::<i32>("delta").expect("required")),
            };
            let path = target(&program.name, m).control;
            std::process::exit(control::client_command(&program.name, &path, request))
        }
        _ => Err(Error::Config("no subcommand".into())),
    }
}

/// The `check` subcommand: warns of unknown variables, checks the configuration, prints
/// what it found and "configuration OK" (exit 0), or the error (exit 1).
fn check_command(program: &mut Program, mut config: Config, request_level: bool) -> ! {
    for var in cli::unknown_env_vars() {
        crate::process::console::errln!(
            "warning: {var} is set but names no option of {}: ignored (misspelt?)",
            program.name
        );
    }
    let checked = absolute_confinement(&mut config).and_then(|()| check(program, &config, request_level));
    match checked {
        Ok(notes) => {
            for note in notes {
                crate::process::console::outln!("{}: {note}", program.name);
            }
            crate::process::console::outln!("{}: configuration OK", program.name);
            std::process::exit(0)
        }
        Err(e) => {
            crate::process::console::errln!("error: {e}");
            std::process::exit(1)
        }
    }
}

/// The log line format: `--log-format`, or `journal` when the lines go to stderr (no log
/// file, no daemon) and stderr is systemd's journal stream.
fn log_format(config: &Config) -> crate::process::log::Format {
    use crate::process::log::Format;
    match config.files.log_format {
        Some(cli::LogFormat::Text) => Format::Text,
        Some(cli::LogFormat::Journal) => Format::Journal,
        Some(cli::LogFormat::Json) => Format::Json,
        None => Format::detect(config.files.log_file.is_none() && !config.files.daemon),
    }
}

/// The server a client subcommand names (issue 34): its pid file and its control socket,
/// each found from the other when only one is given.
struct Target {
    /// `None` when only `--control` was given: the server's pid is then asked from it.
    pid_file: Option<PathBuf>,
    control: PathBuf,
}

/// The server `m` names: `--pid-file` and `--control`, each found from the other, or
/// start's defaults (without a default location, the process exits with an error).
fn target(name: &str, m: &ArgMatches) -> Target {
    let pid_file = m.get_one::<PathBuf>("pid-file").cloned();
    let control = m.get_one::<PathBuf>("control").cloned();
    let pid_file = match (pid_file, &control) {
        (Some(p), _) => Some(p),
        (None, Some(_)) => None,
        (None, None) => daemon::default_pid_file(name),
    };
    let control = control.or_else(|| match &pid_file {
        Some(p) => Some(control::path_for_pid_file(name, p)),
        None => control::default_path(name),
    });
    match control {
        Some(control) => Target { pid_file, control },
        None => {
            crate::process::console::errln!(
                "error: no default control socket location: set --pid-file, --control or XDG_RUNTIME_DIR"
            );
            std::process::exit(1);
        }
    }
}

/// Makes the configuration's paths absolute, and gives a daemon its default pid file and
/// log file.
fn resolve_paths(name: &str, config: &mut Config) -> Result<()> {
    // Paths are made absolute now: a daemon changes to `/` before it writes its pid
    // file or removes its socket files.
    let abs = |p: &mut Option<PathBuf>| {
        if let Some(path) = p.take() {
            *p = Some(std::path::absolute(&path).unwrap_or(path));
        }
    };
    abs(&mut config.files.pid_file);
    abs(&mut config.files.log_file);
    abs(&mut config.files.access_log);
    abs(&mut config.files.control);
    absolute_confinement(config)?;
    config.listeners.listen = std::mem::take(&mut config.listeners.listen)
        .into_iter()
        .map(ListenAddr::absolute)
        .collect();
    if config.files.daemon {
        config.files.pid_file = config
            .files
            .pid_file
            .take()
            .or_else(|| daemon::default_pid_file(name));
        if config.files.pid_file.is_none() {
            return Err(Error::Config(
                "no default pid file location: set --pid-file or XDG_RUNTIME_DIR".into(),
            ));
        }
        if config.files.log_file.is_none() {
            let Some(default) = daemon::default_log_file(name) else {
                return Err(Error::Config(
                    "no default log file location: set --log-file or HOME".into(),
                ));
            };
            // The default's directory (~/.local/state for a user) may not exist yet on a
            // fresh account: made as XDG says (0700), as a user would expect of a default
            // (issue 34). A directory given with --log-file is the operator's to make.
            if let Some(dir) = default.parent().filter(|d| !d.exists()) {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| {
                        Error::Config(format!(
                            "cannot create {}, the default log file's directory: {e} (set --log-file)",
                            dir.display()
                        ))
                    })?;
            }
            config.files.log_file = Some(default);
        }
    }
    Ok(())
}

/// Makes `--chroot` and the sandbox's paths (`--sandbox-read`, `--sandbox-write`, the
/// program's profiles) absolute against the working directory now (issue 41): the master
/// compiles the workers' confinement again once a daemon has changed to `/`, and workers
/// apply it there. A relative sandbox path under `--chroot` is refused (see
/// [`Sandbox::absolute`]).
fn absolute_confinement(config: &mut Config) -> Result<()> {
    if let Some(dir) = config.confine.chroot.take() {
        config.confine.chroot = Some(std::path::absolute(&dir).unwrap_or(dir));
    }
    let chroot = config.confine.chroot.is_some();
    let err = |e: String| Error::Config(format!("--sandbox: {e}"));
    crate::confine::sandbox::absolute_paths(&mut config.confine.sandbox_read, chroot).map_err(err)?;
    crate::confine::sandbox::absolute_paths(&mut config.confine.sandbox_write, chroot).map_err(err)?;
    config.confine.sandbox_profile = std::mem::take(&mut config.confine.sandbox_profile)
        .absolute(chroot)
        .map_err(err)?;
    if let Some(profile) = config.confine.helper_profile.take() {
        config.confine.helper_profile = Some(profile.absolute(chroot).map_err(err)?);
    }
    Ok(())
}

/// `--request-timeout` as the master enforces it on a server of this level (`None`: off).
fn effective_request_timeout(config: &Config, request_level: bool) -> Option<std::time::Duration> {
    match config.timeouts.request_timeout {
        Some(t) if t.is_zero() => None,
        Some(t) => Some(t),
        None if request_level => Some(cli::DEFAULT_REQUEST_TIMEOUT),
        None => None,
    }
}

/// For `Server::request_timeout`: the `--request-timeout` of `run`, `start` and `check`
/// (`None` for the other subcommands, which start no worker).
pub(crate) fn request_timeout(matches: &ArgMatches, request_level: bool) -> Option<std::time::Duration> {
    effective_request_timeout(&serving_config(matches)?, request_level)
}

/// The `--io` the command line chose (environment and code default included), for `run`,
/// `start` and `check`; `None` for the other subcommands.
pub(crate) fn io_given(matches: &ArgMatches) -> Option<crate::Io> {
    Some(serving_config(matches)?.workers.io)
}

/// The standard options of `run`, `start` and `check` (the top level is `run`); `None` for
/// the other subcommands, which start no worker.
fn serving_config(matches: &ArgMatches) -> Option<Config> {
    match matches.subcommand() {
        None => Some(cli::config(matches)),
        Some(("run" | "start" | "check", m)) => Some(cli::config(m)),
        Some(_) => None,
    }
}

/// The master's recycling and timeout limits, checked against the handler's level.
fn master_limits(config: &Config, request_level: bool) -> Result<MasterLimits> {
    let request_timeout = effective_request_timeout(config, request_level);
    if !request_level && config.recycle.max_requests > 0 {
        return Err(Error::Config(
            "--max-requests counts requests, which a handle_client handler does not have \
             (it owns the whole connection): use --max-connections"
                .into(),
        ));
    }
    Ok(MasterLimits {
        recycle: Recycle {
            max_requests: config.recycle.max_requests,
            max_connections: config.recycle.max_connections,
        },
        jitter: config.recycle.max_jitter,
        max_memory_kib: config.recycle.max_worker_memory_mib.saturating_mul(1024),
        max_age: config.recycle.max_worker_age,
        request_timeout,
    })
}

/// The socket options of every listener, bound or adopted.
fn bind_options(config: &Config) -> BindOptions {
    BindOptions {
        backlog: config.listeners.backlog,
        read_timeout: config.timeouts.read_timeout,
        // With --min-send-rate, a write that waits comes back every second to be checked;
        // the write timeout is then kept by the worker (client::SendWatch).
        write_timeout: crate::conn::client::SendWatch::socket_timeout(
            config.timeouts.min_send_rate,
            config.timeouts.write_timeout,
        ),
    }
}

/// The `check` subcommand: what `run` would refuse, found without binding or serving.
/// `check`: the configuration validated as `run` validates it, then what `run` opens
/// opened and released ([`startup::rehearse`]). Returns the lines to print beside
/// "configuration OK" (what a running instance of this configuration holds).
fn check(program: &mut Program, config: &Config, request_level: bool) -> Result<Vec<String>> {
    privilege::resolve(
        config.confine.user.as_deref(),
        config.confine.group.as_deref(),
        config.confine.allow_root_workers,
    )?;
    pool_policy(config)?;
    check_io(config, accepts(program, request_level))?;
    config.confinement()?.check()?;
    if !request_level && config.recycle.max_requests > 0 {
        return Err(Error::Config(
            "--max-requests needs a request-level handler: use --max-connections".into(),
        ));
    }
    for path in [
        &config.files.pid_file,
        &config.files.log_file,
        &config.files.access_log,
        &config.files.control,
    ]
    .into_iter()
    .flatten()
    {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !dir.is_dir() {
            return Err(Error::Config(format!(
                "{}: the directory {} does not exist",
                path.display(),
                dir.display()
            )));
        }
    }
    for addr in &config.listeners.listen {
        if let Some(source) = addr.tls_source(&config.tls.defaults)? {
            crate::net::tls::load(&source)?;
        }
    }
    if let Some(hook) = program.check_hook.as_mut() {
        hook().map_err(|e| Error::Config(format!("the application's check failed: {e}")))?;
    }
    // `check` is `start`'s rehearsal (issue 41): without --pid-file and --control it looks
    // where `start` would put them, so that an instance started with a plain `start` is
    // found and said, not refused for the addresses it holds.
    let defaults = startup::StartDefaults::of(&program.name, config);
    let control = startup::control_path(&program.name, config).or_else(|| defaults.control.clone());
    let running = control.as_deref().and_then(control::running_server);
    let mut notes = Vec::new();
    if let (Some(r), Some(path)) = (&running, &control) {
        notes.push(format!(
            "{} runs as pid {} (it answers on the control socket {}): what it holds is said below and not bound again; the rest of the configuration was checked",
            program.name,
            r.pid,
            path.display()
        ));
    }
    notes.extend(startup::rehearse(
        &program.name,
        config,
        &bind_options(config),
        running.as_ref(),
        &defaults,
    )?);
    Ok(notes)
}

/// What kind of server `program` is, its handler's level given, as far as its command
/// line goes (the options it takes, its I/O model, the configuration it accepts).
fn accepts(program: &Program, request_level: bool) -> cli::Accepts {
    cli::Accepts {
        request_level,
        asynchronous: program.asynchronous,
        datagrams: program.datagrams.is_some(),
        streams: !program.datagram_only,
        stateful_sessions: program.stateful_sessions,
    }
}

/// `--io` checked against the server and the rest of the configuration
/// ([`cli::Accepts::check_io`]); then, for the models with event loops, the descriptor
/// limit raised to what `--worker-connections` needs.
fn check_io(config: &Config, accepts: cli::Accepts) -> Result<()> {
    accepts.check_io(config)?;
    if matches!(
        config.workers.io,
        crate::Io::Event | crate::Io::Async | crate::Io::Hybrid
    ) {
        raise_nofile(config);
    }
    Ok(())
}

/// Raises the soft `RLIMIT_NOFILE` (inherited by the workers) to what
/// `--worker-connections` needs, up to the hard limit, with a warning when that is too
/// low. With `--rlimit-nofile`, the workers get that limit instead: only a warning when it
/// is too low.
fn raise_nofile(config: &Config) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let need = config.workers.worker_connections as u64 + worker::event::SPARE_FDS;
    if let Some(given) = config.confine.rlimit_nofile {
        if given < need {
            tracing::warn!(
                "--rlimit-nofile {given} is below what --worker-connections {} needs ({need}): a worker runs out of descriptors first, and pauses accepting then",
                config.workers.worker_connections
            );
        }
        return;
    }
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= need {
        return;
    }
    let target = need.min(hard);
    if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
        tracing::warn!("raising the descriptor limit to {target}: {e}");
    } else if target < need {
        tracing::warn!(
            "--worker-connections {} needs {need} descriptors per worker, but the hard RLIMIT_NOFILE is {hard}: raised to {hard} (raise the hard limit: --rlimit-nofile as root, LimitNOFILE= under systemd, ulimit -Hn)",
            config.workers.worker_connections
        );
    }
}

/// The pool policy of the command line, checked.
fn pool_policy(config: &Config) -> Result<Policy> {
    let max_allowed = crate::scoreboard::MAX_WORKERS;
    let bad = |m: String| Err(Error::Config(m));
    match config.pool.policy {
        cli::PoolKind::Static => Ok(Policy::Static(config.pool.workers)),
        cli::PoolKind::Dynamic => {
            let (start, min_spare, max_spare, max) = (
                config.pool.start_workers,
                config.pool.min_spare,
                config.pool.max_spare,
                config.pool.max_workers,
            );
            if max == 0 || max > max_allowed {
                return bad(format!("--max-workers {max}: expected 1 to {max_allowed}"));
            }
            if min_spare > max {
                return bad(format!("--min-spare {min_spare} is above --max-workers {max}"));
            }
            if min_spare > max_spare {
                return bad(format!(
                    "--min-spare {min_spare} is above --max-spare {max_spare}"
                ));
            }
            if start > max {
                return bad(format!("--start-workers {start} is above --max-workers {max}"));
            }
            Ok(Policy::Dynamic {
                start,
                min_spare,
                max_spare,
                max,
            })
        }
        cli::PoolKind::Ondemand => {
            let max = config.pool.max_workers;
            if max == 0 || max > max_allowed {
                return bad(format!("--max-workers {max}: expected 1 to {max_allowed}"));
            }
            Ok(Policy::Ondemand {
                max,
                idle_timeout: config.pool.worker_idle_timeout,
            })
        }
    }
}

//! The builder a program starts from, and the start-up sequence of the master.

use std::convert::Infallible;
use std::ffi::OsString;
use std::os::fd::RawFd;
use std::time::Duration;

use clap::{ArgMatches, FromArgMatches};
use nix::unistd::Pid;
use tracing::Level;

use crate::cli::{self, Config, Defaults};
use crate::error::{BoxError, Error, Result};
use crate::handler::{Handler, WorkerInfo};
use crate::listener::{self, BindOptions, Listener};
use crate::master::{Master, Settings, Signals};
use crate::notify::Channel;
use crate::pool::Policy;
use crate::privilege::{self, Plan};
use crate::worker::{self, StartHook};

/// A server: its name, its defaults, and the command line it parses.
///
/// Settings given here are defaults: the environment (`NAME_OPTION`) and the command line
/// override them. See [`cli`](crate::cli) for the options.
///
/// ```no_run
/// # struct Hello;
/// # impl appsrv::Handler for Hello {
/// #     fn handle_client(&mut self, _: &mut appsrv::Client) -> std::io::Result<()> { Ok(()) }
/// # }
/// appsrv::Server::new("hello")
///     .listen("127.0.0.1:7000")
///     .workers(4)
///     .run(|| Ok(Hello))
/// # .unwrap();
/// ```
pub struct Server {
    name: String,
    about: Option<String>,
    defaults: Defaults,
    start_hook: Option<StartHook>,
    args: Vec<OsString>,
    /// The command line, once parsed by [`Server::args`].
    matches: Option<ArgMatches>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.name)
            .field("defaults", &self.defaults)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A server called `name`: the name appears in log lines and `--help`, and prefixes
    /// environment variables (`hello` → `HELLO_LISTEN`).
    pub fn new(name: impl Into<String>) -> Self {
        Server {
            name: name.into(),
            about: None,
            defaults: Defaults::default(),
            start_hook: None,
            args: std::env::args_os().collect(),
            matches: None,
        }
    }

    /// A one-line description for `--help`.
    pub fn about(mut self, about: impl Into<String>) -> Self {
        self.about = Some(about.into());
        self
    }

    /// Adds a default listen address (see [`listener`](crate::listener) for the grammar).
    /// Without any, `--listen` is required. `-l` on the command line replaces these.
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.defaults.listen.push(addr.into());
        self
    }

    /// The default number of workers (`--workers`); default: the number of CPUs, at least 2.
    pub fn workers(mut self, n: usize) -> Self {
        self.defaults.workers = Some(n);
        self
    }

    /// The default user of the workers (`--user`); default: unchanged, or `nobody` when the
    /// master runs as root.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.defaults.user = Some(user.into());
        self
    }

    /// The default group of the workers (`--group`); default: the user's groups.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.defaults.group = Some(group.into());
        self
    }

    /// Lets workers keep root privileges when the master runs as root and no user is given
    /// (`--allow-root-workers`); default: `false`.
    pub fn allow_root_workers(mut self, allow: bool) -> Self {
        self.defaults.allow_root_workers = allow;
        self
    }

    /// The default listen backlog (`--backlog`); default: 511, clamped to `somaxconn`.
    pub fn backlog(mut self, backlog: u32) -> Self {
        self.defaults.backlog = backlog;
        self
    }

    /// How long connections in progress may take to finish on stop (`--grace-period`);
    /// default: 30 s.
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.defaults.grace_period = grace;
        self
    }

    /// The default timeout of each read from a client (`--read-timeout`); default: 60 s.
    pub fn read_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.defaults.read_timeout = timeout;
        self
    }

    /// The default timeout of each write to a client (`--write-timeout`); default: 60 s.
    pub fn write_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.defaults.write_timeout = timeout;
        self
    }

    /// The default log level (`--log-level`); default: `INFO`.
    pub fn log_level(mut self, level: Level) -> Self {
        self.defaults.log_level = level;
        self
    }

    /// Parses the command line from `args` (the program name first) instead of the
    /// process's own arguments, as tests do.
    pub fn command_line<I, T>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// A hook run in each worker after the privilege drop, before the handler factory.
    pub fn on_worker_start(mut self, hook: impl FnMut(&WorkerInfo) + 'static) -> Self {
        self.start_hook = Some(Box::new(hook));
        self
    }

    /// Parses the command line with the program's own options `A` merged into the standard
    /// ones, and returns them. Call it before [`run`](Server::run) to validate them (a bad
    /// value should stop the program with a clear message before anything is bound).
    ///
    /// As with clap, `--help` prints the help and exits, and a bad command line prints the
    /// error and exits with status 2.
    ///
    /// ```no_run
    /// #[derive(clap::Args, Debug)]
    /// struct Opts {
    ///     /// Directory of the static files.
    ///     #[arg(long, default_value = ".")]
    ///     static_dir: std::path::PathBuf,
    /// }
    /// let mut server = appsrv::Server::new("files").listen("127.0.0.1:8080");
    /// let opts: Opts = server.args();
    /// ```
    pub fn args<A: clap::Args + FromArgMatches>(&mut self) -> A {
        let cmd = self.command(A::augment_args);
        let matches = cmd.get_matches_from(cli::with_default_subcommand(self.args.clone()));
        let run = matches.subcommand_matches("run").cloned().unwrap_or_default();
        let parsed = A::from_arg_matches(&run).unwrap_or_else(|e| e.exit());
        self.matches = Some(matches);
        parsed
    }

    fn command(&self, app: impl FnOnce(clap::Command) -> clap::Command) -> clap::Command {
        let run = app(cli::run_command(&cli::env_prefix(&self.name), &self.defaults));
        cli::command(&self.name, self.about.as_deref(), run)
    }

    /// Runs the server: parses the command line (unless [`args`](Server::args) did),
    /// binds the listeners, forks the workers, each of which calls `factory` once to make
    /// its handler, and supervises them until a stop signal.
    ///
    /// Returns `Ok(())` after a clean stop. Returns an error, with every worker stopped and
    /// nothing left running, when a listener cannot be bound, the users cannot be resolved,
    /// or a first worker cannot start (its factory failed: the error names the reason).
    /// Never returns in a worker.
    pub fn run<H, F>(mut self, mut factory: F) -> Result<()>
    where
        H: Handler,
        F: FnMut() -> std::result::Result<H, BoxError>,
    {
        let matches = match self.matches.take() {
            Some(m) => m,
            None => self
                .command(|c| c)
                .get_matches_from(cli::with_default_subcommand(self.args.clone())),
        };
        let run = matches
            .subcommand_matches("run")
            .ok_or_else(|| Error::Config("no subcommand".into()))?;
        let config = cli::config(run);
        crate::log::init(&self.name, config.log_level);
        let mut start_hook = self.start_hook.take();
        start(&config, &mut |setup| {
            worker::run(setup, &mut start_hook, &mut factory)
        })
    }
}

/// The master's start-up: resolve users, bind, install signal handlers, then supervise.
fn start(config: &Config, entry: &mut dyn FnMut(worker::Setup<'_>) -> Infallible) -> Result<()> {
    let (plan, warning) = privilege::resolve(
        config.user.as_deref(),
        config.group.as_deref(),
        config.allow_root_workers,
    )?;
    let listeners = bind_all(config)?;
    for l in &listeners {
        tracing::info!("listening on {}", l.local_addr());
    }
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
    if let Plan::Drop(c) = &plan {
        tracing::info!(
            "workers will run as user {} (uid {}, gid {})",
            c.user,
            c.uid,
            c.gid
        );
    }
    let channel = Channel::new().map_err(|e| Error::sys("creating the notification pipe", e))?;
    let signals = Signals::install().map_err(|e| Error::sys("installing signal handlers", e))?;
    let settings = Settings {
        policy: Policy::Static(config.workers),
        grace_period: config.grace_period,
    };
    let master_pid = Pid::this();
    let mut spawn = |id: u32, master_fds: &[RawFd]| -> Infallible {
        entry(worker::Setup {
            id,
            master: master_pid,
            listeners: &listeners,
            plan: &plan,
            channel: &channel,
            master_fds,
        })
    };
    Master::new(settings, &listeners, &channel, signals).run(&mut spawn)
}

fn bind_all(config: &Config) -> Result<Vec<Listener>> {
    if config.listen.is_empty() {
        return Err(Error::Config("no listen address".into()));
    }
    let opts = BindOptions {
        backlog: config.backlog,
        read_timeout: config.read_timeout,
        write_timeout: config.write_timeout,
    };
    let mut all = Vec::new();
    for addr in &config.listen {
        all.extend(listener::bind(addr, &opts)?);
    }
    if all.len() > 1 {
        // Several listeners are watched with epoll by each worker; accept must then not
        // block on a listener another worker emptied first.
        for l in &all {
            l.socket()
                .set_nonblocking(true)
                .map_err(|e| Error::sys("making a listener non-blocking", e))?;
        }
    }
    Ok(all)
}

//! The builder a program starts from, and the start-up sequence of the master.

use std::convert::Infallible;
use std::ffi::OsString;
use std::os::fd::RawFd;
use std::time::Duration;

use clap::{ArgMatches, FromArgMatches};
use nix::unistd::Pid;
use tracing::Level;

use std::path::PathBuf;

use crate::cli::{self, Config, Defaults};
use crate::confine::privilege::{self, Plan};
use crate::control::{self, Control, MetricsListener};
use crate::error::{BoxError, Error, Result};
use crate::handler::{Handler, RequestHandler, WorkerInfo};
use crate::master::pool::Policy;
use crate::master::{Limits as MasterLimits, Master, ReloadHook, Settings, Signals, UpgradeSettings};
use crate::net::listener::{self, BindOptions, ListenAddr, Listener};
use crate::process::daemon::{self, PidClaim, PidFile, Readiness};
use crate::process::handover;
use crate::process::notify::Channel;
use crate::scoreboard::Board;
use crate::worker::Recycle;
use crate::worker::serve::{ClientLevel, Connections, Limits, RequestLevel};
use crate::worker::{self, StartHook};

/// An application hook run in the master (reload, check).
type Hook = Box<dyn FnMut() -> std::result::Result<(), BoxError>>;

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
    /// This program's binary, as found at start (a binary upgrade starts the file now at
    /// that path).
    exe: Option<PathBuf>,
    /// The working directory at start (a new master re-reads the same, maybe relative,
    /// command line from there).
    dir: Option<PathBuf>,
    reload_hook: Option<Hook>,
    check_hook: Option<Hook>,
    args: Vec<OsString>,
    /// The command line, once parsed by [`Server::args`].
    matches: Option<ArgMatches>,
    /// Inherited descriptors the master keeps open at start ([`Server::keep_fd`]).
    keep_fds: Vec<RawFd>,
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
            exe: std::env::current_exe().ok(),
            dir: std::env::current_dir().ok(),
            reload_hook: None,
            check_hook: None,
            args: std::env::args_os().collect(),
            matches: None,
            keep_fds: Vec::new(),
        }
    }

    /// A one-line description for `--help`.
    pub fn about(mut self, about: impl Into<String>) -> Self {
        self.about = Some(about.into());
        self
    }

    /// Adds a default listen address (see [`listener`](crate::net::listener) for the grammar).
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

    /// How long a connection may stay idle between requests at the request level
    /// (`--keepalive-timeout`); default: 5 s, as Apache's `KeepAliveTimeout`.
    pub fn keepalive_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.defaults.keepalive_timeout = timeout;
        self
    }

    /// The default number of requests a connection may carry at the request level
    /// (`--keepalive-requests`); default: 1000, as nginx's `keepalive_requests`.
    pub fn keepalive_requests(mut self, n: u32) -> Self {
        self.defaults.keepalive_requests = n;
        self
    }

    /// Adds a network whose clients are served (`--allow`, repeatable): once any is given,
    /// clients outside every allowed network are closed at once. A bare address is a `/32`
    /// or `/128`. Default: none (everyone is served). An invalid value is reported when the
    /// server starts, as the flag's would be. Values from the environment or the command
    /// line replace those set here.
    pub fn allow(mut self, cidr: impl Into<String>) -> Self {
        self.defaults.allow.push(cidr.into());
        self
    }

    /// Adds a network whose clients are closed at once, whatever the allow list says
    /// (`--deny`, repeatable). Default: none.
    pub fn deny(mut self, cidr: impl Into<String>) -> Self {
        self.defaults.deny.push(cidr.into());
        self
    }

    /// Whether connections on every listener start with a PROXY protocol v1/v2 header
    /// (`--proxy-protocol`; per listener: `ADDR?proxy`). Default: `false`.
    pub fn proxy_protocol(mut self, on: bool) -> Self {
        self.defaults.proxy_protocol = on;
        self
    }

    /// Adds a balancer trusted to send PROXY headers (`--proxy-from`, repeatable). Default:
    /// `127.0.0.0/8` and `::1`; the first call replaces that default.
    pub fn proxy_from(mut self, cidr: impl Into<String>) -> Self {
        self.defaults.proxy_from.push(cidr.into());
        self
    }

    /// The most connections one client address may hold at once, across all workers
    /// (`--max-conns-per-ip`). Default: 0, no limit.
    pub fn max_conns_per_ip(mut self, n: usize) -> Self {
        self.defaults.max_conns_per_ip = n;
        self
    }

    /// How long a request that arrives in pieces may take, from its first bytes, at the
    /// request level (`--header-timeout`; `None`: no limit). Default: 20 s, as Apache's
    /// `mod_reqtimeout`.
    pub fn header_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.defaults.header_timeout = timeout;
        self
    }

    /// Bytes per second that earn a slow request one more second beyond the header timeout
    /// (`--min-rate`). Default: 500.
    pub fn min_rate(mut self, bytes_per_second: usize) -> Self {
        self.defaults.min_rate = bytes_per_second;
        self
    }

    /// The slowest acceptable reader of a response, in bytes per second
    /// (`--min-send-rate`). Default: 500, as `--min-rate`; 0 turns the limit off.
    ///
    /// While a worker waits to write (the socket's send buffer is full), the bytes the TCP
    /// client has acknowledged (`tcpi_bytes_acked`) must grow by at least
    /// `bytes_per_second` per second over each 10 s window of waiting (longer, up to 60 s,
    /// when the connection's segments are so large that a reader at that rate frees fewer
    /// than two of them in 10 s: loopback's 64 KiB). A client below that is cut off (reset),
    /// with one log line, and the worker serves the next connection: across a network a
    /// slow reader holds a worker for about 10 s, while a long download at a healthy rate
    /// is never cut. Applies to `handle_client` writes too. Unix-socket clients are not
    /// measured (the kernel does not count what they read): `--write-timeout` bounds them.
    ///
    /// With the rate on, the socket's own send timeout is 1 s, so that a waiting write comes
    /// back to be checked; `--write-timeout` is then kept by appsrv for the writes it makes.
    /// Writes that bypass [`Client`](crate::Client) (through its raw descriptor) see the 1 s.
    pub fn min_send_rate(mut self, bytes_per_second: usize) -> Self {
        self.defaults.min_send_rate = bytes_per_second;
        self
    }

    /// The certificate chain (PEM, leaf first) of TLS listeners, those whose address has the
    /// `tls` option (`--tls-cert`). Default: none.
    pub fn tls_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.defaults.tls_cert = Some(path.into());
        self
    }

    /// The private key (PEM) of TLS listeners (`--tls-key`). Default: none.
    pub fn tls_key(mut self, path: impl Into<PathBuf>) -> Self {
        self.defaults.tls_key = Some(path.into());
        self
    }

    /// Require client certificates signed by the CAs in this file (PEM) on TLS listeners
    /// (`--tls-client-ca`). Default: no client certificate is asked for.
    pub fn tls_client_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.defaults.tls_client_ca = Some(path.into());
        self
    }

    /// Offer this ALPN protocol on TLS listeners, after those already given (`--tls-alpn`).
    /// Default: no ALPN.
    pub fn tls_alpn(mut self, protocol: impl Into<String>) -> Self {
        self.defaults.tls_alpn.push(protocol.into());
        self
    }

    /// How long a client may take to complete its TLS handshake
    /// (`--tls-handshake-timeout`). Default: 10 s.
    pub fn tls_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.defaults.tls_handshake_timeout = timeout;
        self
    }

    /// Workers chroot to `dir` before dropping privileges (`--chroot`). Default: none.
    pub fn chroot(mut self, dir: impl Into<PathBuf>) -> Self {
        self.defaults.chroot = Some(dir.into());
        self
    }

    /// Sets `PR_SET_NO_NEW_PRIVS` in workers (`--no-new-privs`). Default: `false`
    /// (implied by the sandbox).
    pub fn no_new_privs(mut self, on: bool) -> Self {
        self.defaults.no_new_privs = on;
        self
    }

    /// The sandbox profile workers get with `--sandbox`: the default profile extended with
    /// the paths and system calls this program needs (`--sandbox-read` and
    /// `--sandbox-write` add to it). Setting a profile does not turn the sandbox on: see
    /// [`sandboxed`](Server::sandboxed).
    pub fn sandbox(mut self, profile: crate::Sandbox) -> Self {
        self.defaults.sandbox_profile = profile;
        self
    }

    /// Whether workers are sandboxed by default (`--sandbox`). Default: `false`.
    pub fn sandboxed(mut self, on: bool) -> Self {
        self.defaults.sandbox = on;
        self
    }

    /// Whether each worker executes the program again after the fork (`--exec-workers`),
    /// for a fresh address-space layout per worker. Default: `false`.
    pub fn exec_workers(mut self, on: bool) -> Self {
        self.defaults.exec_workers = on;
        self
    }

    /// Keeps the inherited descriptor `fd` open at start (repeatable). Default: none (only
    /// stdio and the hand-overs below are kept).
    ///
    /// At start, the master closes the descriptors it inherited from whatever started it,
    /// as daemon(7) asks: a descriptor a shell, a supervisor or a test runner left open
    /// would otherwise stay open in the master and in every worker, for their whole lives.
    /// Kept are stdio (0–2), the sockets systemd passes (`LISTEN_FDS`), an upgrading
    /// master's hand-over, and the descriptors named here. Inherited means open without
    /// close-on-exec: what this program opens through Rust's std (which sets close-on-exec)
    /// is never closed, even when opened before [`run`](Server::run), and need not be named.
    /// Name a descriptor the parent passes on purpose, or one this program opened itself
    /// without close-on-exec (`libc::open` without `O_CLOEXEC`, `nix::unistd::pipe`).
    ///
    /// appsrv neither adopts nor closes a kept descriptor: it stays open in the master, is
    /// inherited by the workers (forked, or re-executed with `--exec-workers`: it is not
    /// close-on-exec) and by a new master in a binary upgrade (whose hand-over avoids its
    /// number). Numbers 0–2 are always kept; a number that is not open is ignored; a
    /// negative number is an error when the server starts.
    ///
    /// ```no_run
    /// // A supervisor passes this program a status pipe as descriptor 3.
    /// # struct Hello;
    /// # impl appsrv::Handler for Hello {
    /// #     fn handle_client(&mut self, _: &mut appsrv::Client) -> std::io::Result<()> { Ok(()) }
    /// # }
    /// appsrv::Server::new("hello")
    ///     .listen("127.0.0.1:7000")
    ///     .keep_fd(3)
    ///     .run(|| Ok(Hello))
    /// # .unwrap();
    /// ```
    pub fn keep_fd(mut self, fd: RawFd) -> Self {
        self.keep_fds.push(fd);
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

    /// A hook run in the master on reload (HUP, or the `reload` subcommand), before the new
    /// generation of workers is forked: re-read the application's configuration here
    /// (into state the handler factory reads). If it fails, the current workers keep
    /// serving and `reload` exits non-zero with the error.
    pub fn on_reload(mut self, hook: impl FnMut() -> std::result::Result<(), BoxError> + 'static) -> Self {
        self.reload_hook = Some(Box::new(hook));
        self
    }

    /// A hook run by the `check` subcommand (also `-t`), after the command line and the
    /// users are validated: check the application's configuration without serving.
    pub fn on_check(mut self, hook: impl FnMut() -> std::result::Result<(), BoxError> + 'static) -> Self {
        self.check_hook = Some(Box::new(hook));
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
    ///
    /// The options belong to `run`, `start` and `check`; for the other subcommands, `A`'s
    /// defaults are returned.
    pub fn args<A: clap::Args + FromArgMatches>(&mut self) -> A {
        let cmd = self.command(A::augment_args);
        let matches = cmd.get_matches_from(cli::with_default_subcommand(self.args.clone()));
        let parsed = match matches.subcommand() {
            Some(("run" | "start" | "check", m)) => A::from_arg_matches(m),
            _ => A::from_arg_matches(
                &A::augment_args(clap::Command::new("defaults")).get_matches_from(["defaults"]),
            ),
        }
        .unwrap_or_else(|e| e.exit());
        self.matches = Some(matches);
        parsed
    }

    /// The `check` subcommand: what `run` would refuse, found without binding or serving.
    fn check(&mut self, config: &Config, request_level: bool) -> Result<()> {
        privilege::resolve(
            config.user.as_deref(),
            config.group.as_deref(),
            config.allow_root_workers,
        )?;
        pool_policy(config)?;
        config.confinement()?.check()?;
        if !request_level && config.max_requests > 0 {
            return Err(Error::Config(
                "--max-requests needs a request-level handler: use --max-connections".into(),
            ));
        }
        for path in [
            &config.pid_file,
            &config.log_file,
            &config.access_log,
            &config.control,
        ]
        .into_iter()
        .flatten()
        {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            if !dir.is_dir() {
                return Err(Error::Config(format!(
                    "{}: the directory {} does not exist",
                    path.display(),
                    dir.display()
                )));
            }
        }
        for addr in &config.listen {
            if let Some(source) = addr.tls_source(&config.tls)? {
                crate::net::tls::load(&source)?;
            }
        }
        if let Some(hook) = self.check_hook.as_mut() {
            hook().map_err(|e| Error::Config(format!("the application's check failed: {e}")))?;
        }
        Ok(())
    }

    fn command(&self, app: impl Fn(clap::Command) -> clap::Command) -> clap::Command {
        cli::command(&self.name, self.about.as_deref(), &self.defaults, app)
    }

    /// Runs the server: parses the command line (unless [`args`](Server::args) did),
    /// closes the descriptors the master inherited but does not keep (see
    /// [`keep_fd`](Server::keep_fd)), binds the listeners, forks the workers, each of which
    /// calls `factory` once to make its handler, and supervises them until a stop signal.
    ///
    /// Returns `Ok(())` after a clean stop. Returns an error, with every worker stopped and
    /// nothing left running, when a listener cannot be bound, the users cannot be resolved,
    /// or a first worker cannot start (its factory failed: the error names the reason).
    /// Never returns in a worker.
    pub fn run<H, F>(self, mut factory: F) -> Result<()>
    where
        H: Handler,
        F: FnMut() -> std::result::Result<H, BoxError>,
    {
        self.launch(false, |_| move || factory().map(ClientLevel))
    }

    /// Runs the server at the request level: each worker's handler gets decoded requests
    /// from its [`Codec`](crate::codec::Codec) and writes responses; the framework does the
    /// reading, framing, keep-alive, pipelining and writing. Otherwise as [`run`](Server::run).
    ///
    /// Between requests, a connection may stay idle for `--keepalive-timeout` (5 s); a
    /// request split across reads must complete within `--read-timeout`; a connection
    /// serves at most `--keepalive-requests` (1000) requests.
    pub fn run_requests<H, F>(self, mut factory: F) -> Result<()>
    where
        H: RequestHandler,
        F: FnMut() -> std::result::Result<H, BoxError>,
    {
        self.launch(true, |limits: Limits| {
            move || factory().map(|h| RequestLevel::new(h, limits.clone()))
        })
    }

    fn launch<C, F, M>(mut self, request_level: bool, make_factory: M) -> Result<()>
    where
        C: Connections,
        F: FnMut() -> std::result::Result<C, BoxError>,
        M: FnOnce(Limits) -> F,
    {
        let matches = match self.matches.take() {
            Some(m) => m,
            None => self
                .command(|c| c)
                .get_matches_from(cli::with_default_subcommand(self.args.clone())),
        };
        let mut config = match matches.subcommand() {
            Some(("run", m)) => {
                let mut c = cli::config(m);
                c.sandbox_profile = self.defaults.sandbox_profile.clone();
                c
            }
            Some(("start", m)) => {
                let mut c = cli::config(m);
                c.daemon = true;
                c.sandbox_profile = self.defaults.sandbox_profile.clone();
                c
            }
            Some(("stop", m)) => std::process::exit(daemon::stop_command(
                &self.name,
                m.get_one::<PathBuf>("pid-file").cloned(),
                m.get_flag("now"),
                *m.get_one::<Duration>("grace-period").expect("has a default"),
            )),
            Some(("reload", m)) => {
                let Some(path) = m
                    .get_one::<PathBuf>("control")
                    .cloned()
                    .or_else(|| control::default_path(&self.name))
                else {
                    eprintln!("error: no default control socket location: set --control or XDG_RUNTIME_DIR");
                    std::process::exit(1);
                };
                let timeout = *m.get_one::<Duration>("timeout").expect("has a default");
                std::process::exit(control::reload_command(&self.name, &path, timeout))
            }
            Some(("upgrade", m)) => {
                let Some(path) = m
                    .get_one::<PathBuf>("control")
                    .cloned()
                    .or_else(|| control::default_path(&self.name))
                else {
                    eprintln!("error: no default control socket location: set --control or XDG_RUNTIME_DIR");
                    std::process::exit(1);
                };
                let timeout = *m.get_one::<Duration>("timeout").expect("has a default");
                std::process::exit(control::upgrade_command(&self.name, &path, timeout))
            }
            Some(("check", m)) => {
                let mut config = cli::config(m);
                config.sandbox_profile = self.defaults.sandbox_profile.clone();
                match self.check(&config, request_level) {
                    Ok(()) => {
                        println!("{}: configuration OK", self.name);
                        std::process::exit(0)
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        std::process::exit(1)
                    }
                }
            }
            Some((sub @ ("status" | "metrics" | "workers"), m)) => {
                let request = match sub {
                    "status" => control::Request::Status {
                        json: m.get_flag("json"),
                    },
                    "metrics" => control::Request::Metrics,
                    _ => control::Request::Workers(*m.get_one::<i32>("delta").expect("required")),
                };
                let Some(path) = m
                    .get_one::<PathBuf>("control")
                    .cloned()
                    .or_else(|| control::default_path(&self.name))
                else {
                    eprintln!("error: no default control socket location: set --control or XDG_RUNTIME_DIR");
                    std::process::exit(1);
                };
                std::process::exit(control::client_command(&self.name, &path, request))
            }
            _ => return Err(Error::Config("no subcommand".into())),
        };
        crate::process::log::init(&self.name, config.log_level);
        // Paths are made absolute now: a daemon changes to `/` before it writes its pid
        // file or removes its socket files.
        let abs = |p: &mut Option<PathBuf>| {
            if let Some(path) = p.take() {
                *p = Some(std::path::absolute(&path).unwrap_or(path));
            }
        };
        abs(&mut config.pid_file);
        abs(&mut config.log_file);
        abs(&mut config.access_log);
        abs(&mut config.control);
        config.listen = config.listen.into_iter().map(ListenAddr::absolute).collect();
        if config.daemon {
            config.pid_file = config.pid_file.or_else(|| daemon::default_pid_file(&self.name));
            if config.pid_file.is_none() {
                return Err(Error::Config(
                    "no default pid file location: set --pid-file or XDG_RUNTIME_DIR".into(),
                ));
            }
            config.log_file = config.log_file.or_else(|| daemon::default_log_file(&self.name));
            if config.log_file.is_none() {
                return Err(Error::Config(
                    "no default log file location: set --log-file or HOME".into(),
                ));
            }
        }
        let limits = Limits {
            keepalive_timeout: config.keepalive_timeout,
            read_timeout: config.read_timeout,
            keepalive_requests: config.keepalive_requests,
            header_timeout: config.header_timeout,
            min_rate: config.min_rate,
        };
        if request_level {
            // Connections inherit the listener's timeout: between requests, that is the
            // keep-alive timeout (the loop switches to the read timeout only when a
            // request arrives in pieces).
            config.read_timeout = config.keepalive_timeout;
        }
        let policy = pool_policy(&config)?;
        let request_timeout = match config.request_timeout {
            Some(t) if t.is_zero() => None,
            Some(t) => Some(t),
            None if request_level => Some(cli::DEFAULT_REQUEST_TIMEOUT),
            None => None,
        };
        if !request_level && config.max_requests > 0 {
            return Err(Error::Config(
                "--max-requests counts requests, which a handle_client handler does not have \
                 (it owns the whole connection): use --max-connections"
                    .into(),
            ));
        }
        let master_limits = MasterLimits {
            recycle: Recycle {
                max_requests: config.max_requests,
                max_connections: config.max_connections,
            },
            jitter: config.max_jitter,
            max_memory_kib: config.max_worker_memory_mib.saturating_mul(1024),
            max_age: config.max_worker_age,
            request_timeout,
        };
        let mut factory = make_factory(limits);
        let mut start_hook = self.start_hook.take();
        let on_reload = self.reload_hook.take();
        let name = self.name.clone();
        let upgrade = UpgradeSettings {
            dir: self.dir.clone(),
            exe: self.exe.clone(),
            args: self.args.iter().skip(1).cloned().collect(),
            argv: self.args.clone(),
            timeout: config.start_timeout,
            keep_fds: self.keep_fds.clone(),
        };
        let mut entry =
            |setup: worker::Setup<'_>| -> Infallible { worker::run(setup, &mut start_hook, &mut factory) };
        // Started by a master as a re-executed worker (--exec-workers): be that worker.
        if let Some(handoff) = crate::process::exec::from_env() {
            return exec_worker(&config, handoff, &mut entry).map(|never| match never {});
        }
        start(
            &name,
            &config,
            policy,
            master_limits,
            on_reload,
            upgrade,
            &mut entry,
        )
    }
}

/// A re-executed worker (`--exec-workers`): takes what the master handed over and runs as
/// worker. Never returns once the handoff is read; an error before the worker runs is
/// reported to the master, as a worker's start failure.
fn exec_worker(
    config: &Config,
    handoff: std::result::Result<crate::process::exec::Handoff, String>,
    entry: &mut dyn FnMut(worker::Setup<'_>) -> Infallible,
) -> Result<Infallible> {
    let handoff = handoff.map_err(Error::Config)?;
    // SAFETY: the master listed this descriptor as the notification pipe's write end and
    // kept it open across the exec for this process alone; nothing else here owns it.
    let channel = unsafe { crate::sys::adopt_fd(handoff.channel) }
        .map(Channel::from_write_end)
        .map_err(|e| Error::sys("adopting the notification pipe", e))?;
    let fail = |reason: String| -> ! {
        tracing::error!("cannot start: {reason}");
        let _ = channel.send(
            std::process::id(),
            &crate::process::notify::Message::StartFailed(reason),
        );
        crate::sys::exit_now(crate::sys::exit::START_FAILED)
    };
    let adopt = |fd: RawFd, what: &'static str| {
        // SAFETY: as above: a descriptor the master kept open for this process alone.
        unsafe { crate::sys::adopt_fd(fd) }.map_err(|e| Error::sys(what, e))
    };
    let parts = (|| -> Result<_> {
        let (plan, _) = privilege::resolve(
            config.user.as_deref(),
            config.group.as_deref(),
            config.allow_root_workers,
        )?;
        let sockets = handoff
            .listeners
            .iter()
            .map(|(fd, _)| adopt(*fd, "adopting a listener").map(socket2::Socket::from))
            .collect::<Result<Vec<_>>>()?;
        let origins = handoff.listeners.iter().map(|(_, o)| *o).collect();
        let listeners = adopt_all(config, sockets, Some(origins))?;
        // Read again, as the master did at start (this process is still root if it is).
        let tls = crate::net::tls::Store::load(tls_sources(config, &listeners)?)?;
        let board = Board::adopt(adopt(handoff.board, "adopting the scoreboard")?)
            .map_err(|e| Error::sys("mapping the scoreboard", e))?;
        let access = handoff
            .access
            .map(|fd| adopt(fd, "adopting the access log").map(std::fs::File::from))
            .transpose()?;
        if let Some(fd) = handoff.wake {
            crate::sys::set_wake_fd(std::os::fd::IntoRawFd::into_raw_fd(adopt(
                fd,
                "adopting the wake-up eventfd",
            )?));
        }
        Ok((plan, listeners, tls, board, access, config.confinement()?))
    })();
    let (plan, listeners, tls, board, access, confinement) = match parts {
        Ok(p) => p,
        Err(e) => fail(e.to_string()),
    };
    // `entry` never returns (the worker ends in `_exit`); `Ok` only gives it the type.
    #[allow(unreachable_code)]
    Ok(entry(worker::Setup {
        id: handoff.id,
        master: Pid::from_raw(handoff.master),
        listeners: &listeners,
        plan: &plan,
        channel: &channel,
        master_fds: &[],
        log_path: config.log_file.as_deref(),
        board,
        keepalive_timeout: config.keepalive_timeout,
        recycle: Recycle {
            max_requests: handoff.max_requests,
            max_connections: handoff.max_connections,
        },
        access_log: config.access_log.as_deref().zip(access.as_ref()),
        max_per_ip: (config.max_conns_per_ip > 0).then_some(config.max_conns_per_ip as usize),
        confinement: &confinement,
        tls: crate::net::tls::ForWorker {
            acceptors: tls.current(),
            handshake_timeout: config.tls_handshake_timeout,
        },
        conn: worker::ConnLimits {
            header_timeout: config.header_timeout,
            min_send_rate: config.min_send_rate,
            write_timeout: config.write_timeout,
        },
    }))
}

/// The pool policy of the command line, checked.
fn pool_policy(config: &Config) -> Result<Policy> {
    let max_allowed = crate::scoreboard::MAX_WORKERS;
    let bad = |m: String| Err(Error::Config(m));
    match config.pool {
        cli::PoolKind::Static => Ok(Policy::Static(config.workers)),
        cli::PoolKind::Dynamic => {
            let (start, min_spare, max_spare, max) = (
                config.start_workers,
                config.min_spare,
                config.max_spare,
                config.max_workers,
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
            let max = config.max_workers;
            if max == 0 || max > max_allowed {
                return bad(format!("--max-workers {max}: expected 1 to {max_allowed}"));
            }
            Ok(Policy::Ondemand {
                max,
                idle_timeout: config.worker_idle_timeout,
            })
        }
    }
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
    access_log: Option<std::fs::File>,
    on_reload: Option<Hook>,
    /// Started by an upgrading master: publish the pid file by rename, once serving.
    publish_pid: bool,
    /// Started by systemd socket activation: the listeners are systemd's too.
    from_systemd: bool,
    upgrade: UpgradeSettings,
    /// The listeners' TLS material.
    tls: crate::net::tls::Store,
    /// With --exec-workers: the program (opened at start) and its command line.
    exec: Option<(std::fs::File, Vec<std::ffi::CString>)>,
}

/// The master's start-up: take over what systemd or an upgrading master handed over, close
/// the other inherited descriptors, resolve users, claim the pid file, bind, open the
/// control socket, the metrics listener and the log file (all of which report errors on the
/// terminal), detach if asked, publish the pid, install signal handlers, then supervise.
fn start(
    name: &str,
    config: &Config,
    policy: Policy,
    limits: MasterLimits,
    on_reload: Option<Hook>,
    upgrade: UpgradeSettings,
    entry: &mut dyn FnMut(worker::Setup<'_>) -> Infallible,
) -> Result<()> {
    if let Some(fd) = upgrade.keep_fds.iter().find(|fd| **fd < 0) {
        return Err(Error::Config(format!("keep_fd({fd}): not a descriptor number")));
    }
    // Sockets handed over by an upgrading master, or by systemd: adopted first, as the
    // environment names them, then every other inherited descriptor is closed, before the
    // master opens anything of its own.
    let mut inherited = handover::inherited()?;
    close_strays(&upgrade.keep_fds, inherited.as_ref())?;
    let (plan, warning) = privilege::resolve(
        config.user.as_deref(),
        config.group.as_deref(),
        config.allow_root_workers,
    )?;
    config.confinement()?.check()?;
    let from_upgrade = matches!(
        inherited.as_ref().map(|i| i.source),
        Some(handover::Source::Upgrade { .. })
    );
    let from_systemd = matches!(
        inherited.as_ref().map(|i| i.source),
        Some(handover::Source::Systemd)
    );
    let mut config = config.clone();
    if from_upgrade {
        // Already detached (the old master's child, in its session); the pid file is
        // taken over by rename, not claimed (the old master still holds its lock).
        config.daemon = false;
    }
    let config = &config;
    let claim = match from_upgrade {
        true => None,
        false => config.pid_file.as_deref().map(PidClaim::acquire).transpose()?,
    };
    let listeners = match inherited.as_mut() {
        Some(i) => {
            if i.source == handover::Source::Systemd && !config.listen.is_empty() {
                tracing::info!(
                    "using the {} socket(s) systemd passed (LISTEN_FDS); --listen is not bound",
                    i.listeners.len()
                );
            }
            adopt_all(config, std::mem::take(&mut i.listeners), i.origins.take())?
        }
        None => bind_all(config)?,
    };
    // Read now, as root if started so, and before detaching: a bad file is reported on the
    // terminal.
    let tls = crate::net::tls::Store::load(tls_sources(config, &listeners)?)?;
    // Said by the master only (a re-executed worker reads the same sources again).
    if !config.listen.iter().any(ListenAddr::is_tls)
        && (config.tls.cert.is_some() || config.tls.key.is_some())
    {
        tracing::warn!(
            "--tls-cert/--tls-key are set but no listener has the tls option (ADDR?tls): they are not used"
        );
    }
    // The binary is opened now, so that workers run this program even if the file is
    // replaced or removed later (a new binary is for `upgrade`).
    let exec = match config.exec_workers {
        true => Some((
            std::fs::File::open("/proc/self/exe")
                .map_err(|e| Error::sys("opening this program's binary (/proc/self/exe)", e))?,
            crate::process::exec::c_args(&upgrade.argv).map_err(Error::Config)?,
        )),
        false => None,
    };
    // The control socket is on when asked for, or by default for a server with a pid file
    // (an instance that commands address by name).
    let control_path = config
        .control
        .clone()
        .or_else(|| config.pid_file.as_ref().and_then(|_| control::default_path(name)));
    let owner = nix::unistd::Uid::effective().as_raw();
    let control = match (
        control_path.as_deref(),
        inherited.as_mut().and_then(|i| i.control.take()),
    ) {
        (Some(p), Some(sock)) => Some(Control::adopt(sock, p, owner)?),
        (Some(p), None) => Some(Control::bind(p, owner)?),
        (None, _) => None,
    };
    let metrics = match (
        config.metrics_listen.as_deref(),
        inherited.as_mut().and_then(|i| i.metrics.take()),
    ) {
        (Some(_), Some(sock)) => Some(MetricsListener::adopt(sock)?),
        (Some(addr), None) => Some(MetricsListener::bind(addr)?),
        (None, _) => None,
    };
    let access_log = match &config.access_log {
        Some(path) => Some(crate::process::log::open_log(path, plan_gid(&plan))?),
        None => None,
    };
    let log_file = match &config.log_file {
        Some(path) => Some(crate::process::log::open_log(path, plan_gid(&plan))?),
        None => None,
    };
    let ready_pipe = inherited.as_mut().and_then(|i| i.ready.take());
    let mut readiness = match (&log_file, config.daemon) {
        (Some(log), true) => daemon::daemonize(log, config.start_timeout)?,
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
    let prepared = Prepared {
        plan,
        warning,
        claim,
        listeners,
        control,
        metrics,
        access_log,
        on_reload,
        publish_pid: from_upgrade,
        from_systemd,
        upgrade,
        tls,
        exec,
    };
    let result = serve(name, config, policy, limits, prepared, &mut readiness, entry);
    if let Err(e) = &result {
        readiness.failed(&e.to_string());
    }
    result
}

/// The master's life once detached.
fn serve(
    name: &str,
    config: &Config,
    policy: Policy,
    limits: MasterLimits,
    mut prepared: Prepared,
    readiness: &mut Readiness,
    entry: &mut dyn FnMut(worker::Setup<'_>) -> Infallible,
) -> Result<()> {
    // A master started by an upgrade publishes its pid only once it serves: until then the
    // old master's pid stays in the file (it goes on serving if this one fails).
    let late_pid = match (&config.pid_file, prepared.publish_pid) {
        (Some(path), true) => Some(path.clone()),
        _ => None,
    };
    let pid_file = match prepared.claim.take() {
        Some(c) => Some(c.commit(Pid::this())?),
        None => None,
    };
    let result = supervise(
        name,
        config,
        policy,
        limits,
        prepared,
        pid_file.as_ref(),
        late_pid,
        readiness,
        entry,
    );
    if let Some(p) = &pid_file {
        p.remove();
    }
    result
}

#[allow(clippy::too_many_arguments)] // the start-up's parts, passed once
fn supervise(
    name: &str,
    config: &Config,
    policy: Policy,
    limits: MasterLimits,
    prepared: Prepared,
    pid_file: Option<&PidFile>,
    late_pid: Option<PathBuf>,
    readiness: &mut Readiness,
    entry: &mut dyn FnMut(worker::Setup<'_>) -> Infallible,
) -> Result<()> {
    let adopted = prepared.publish_pid;
    let shared_listeners = prepared.from_systemd;
    let Prepared {
        plan,
        warning,
        listeners,
        control,
        metrics,
        access_log,
        on_reload,
        upgrade,
        tls,
        exec,
        ..
    } = prepared;
    let tls = std::rc::Rc::new(tls);
    let plan = &plan;
    let listeners = &listeners[..];
    for l in listeners {
        tracing::info!("listening on {}", l.local_addr());
    }
    if let Some(m) = &metrics {
        tracing::info!("serving metrics on http://{}/metrics", m.local_addr());
    }
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
    if let Plan::Drop(c) = plan {
        tracing::info!(
            "workers will run as user {} (uid {}, gid {})",
            c.user,
            c.uid,
            c.gid
        );
    }
    let channel = Channel::new().map_err(|e| Error::sys("creating the notification pipe", e))?;
    let signals = Signals::install().map_err(|e| Error::sys("installing signal handlers", e))?;
    let board = Board::new().map_err(|e| Error::sys("mapping shared memory", e))?;
    let worker_dir = upgrade.dir.clone();
    let settings = Settings {
        name: name.to_owned(),
        policy,
        board,
        grace_period: config.grace_period,
        log_file: config.log_file.clone().map(|p| (p, plan_gid(plan))),
        access_log: config.access_log.clone().map(|p| (p, plan_gid(plan))),
        master_fds: pid_file
            .map(PidFile::raw_fd)
            .into_iter()
            .chain(readiness.raw_fd())
            .collect(),
        limits,
        control,
        metrics,
        on_reload: on_reload.map(ReloadHook),
        upgrade,
        adopted,
        shared_listeners,
        tls: tls.clone(),
    };
    let master_pid = Pid::this();
    let log_path = config.log_file.as_deref();
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
    let mut spawn = |id: u32, recycle: Recycle, master_fds: &[RawFd]| -> Infallible {
        if let Some((exe, argv)) = &exec {
            // In the child: become the program again, as worker `id`.
            let handoff = crate::process::exec::Handoff {
                id,
                master: master_pid.as_raw(),
                max_requests: recycle.max_requests,
                max_connections: recycle.max_connections,
                board: Board::memfd().unwrap_or(-1),
                channel: channel.write_fd(),
                wake: crate::sys::wake_fd(),
                access: access_log.as_ref().map(std::os::fd::AsRawFd::as_raw_fd),
                listeners: listeners
                    .iter()
                    .map(|l| (std::os::fd::AsRawFd::as_raw_fd(l.socket()), l.origin()))
                    .collect(),
            };
            // The master's working directory at start: the command line's relative paths
            // mean the same to the worker.
            if let Some(dir) = &worker_dir {
                let _ = nix::unistd::chdir(dir.as_path());
            }
            let env = handoff.environment();
            // SAFETY: this runs in the child just forked by the master (single-threaded),
            // which is replaced by the exec; the descriptors are the master's open
            // listeners, scoreboard memfd, notification pipe, wake-up eventfd and access
            // log, which the child owns copies of.
            let e = unsafe { crate::sys::exec_keeping(exe, argv, &env, &handoff.fds()) };
            let _ = channel.send(
                std::process::id(),
                &crate::process::notify::Message::StartFailed(format!("re-executing the program: {e}")),
            );
            crate::sys::exit_now(crate::sys::exit::START_FAILED);
        }
        entry(worker::Setup {
            id,
            master: master_pid,
            listeners,
            plan,
            channel: &channel,
            master_fds,
            log_path,
            board,
            keepalive_timeout: config.keepalive_timeout,
            recycle,
            access_log: config.access_log.as_deref().zip(access_log.as_ref()),
            max_per_ip: (config.max_conns_per_ip > 0).then_some(config.max_conns_per_ip as usize),
            confinement: &confinement,
            tls: crate::net::tls::ForWorker {
                acceptors: tls.current(),
                handshake_timeout: config.tls_handshake_timeout,
            },
            conn: worker::ConnLimits {
                header_timeout: config.header_timeout,
                min_send_rate: config.min_send_rate,
                write_timeout: config.write_timeout,
            },
        })
    };
    let mut published: Option<PidFile> = None;
    let result = Master::new(settings, listeners, &channel, signals)?.run(&mut spawn, &mut || {
        if let Some(path) = &late_pid {
            match daemon::publish(path, Pid::this()) {
                Ok(f) => published = Some(f),
                Err(e) => tracing::error!("{e}"),
            }
        }
        readiness.ready();
    });
    if let Some(p) = &published {
        p.remove();
    }
    result
}

/// Closes the descriptors the master inherited from whatever started it, but stdio, the
/// hand-over of systemd or of an upgrading master (`inherited`) and those the application
/// keeps (see [`Server::keep_fd`]).
fn close_strays(keep: &[RawFd], inherited: Option<&handover::Inherited>) -> Result<()> {
    let mut keep = keep.to_vec();
    keep.extend(inherited.map(handover::Inherited::fds).unwrap_or_default());
    // SAFETY: this runs at the master's start, before it opens anything; what appsrv and
    // Rust's std open is close-on-exec (and so is what `inherited` adopted, which is kept
    // too), so the descriptors without close-on-exec are those the parent left open and
    // those the application opened so, which `keep_fd` documents it must name.
    let closed = unsafe { crate::sys::close_stray_fds(&keep) }
        .map_err(|e| Error::sys("closing inherited descriptors", e))?;
    if !closed.is_empty() {
        tracing::info!(
            "closed {} descriptor(s) inherited from the process that started this one",
            closed.len()
        );
        tracing::debug!("inherited descriptors closed: {closed:?}");
    }
    Ok(())
}

fn plan_gid(plan: &Plan) -> Option<nix::unistd::Gid> {
    match plan {
        Plan::Drop(c) => Some(c.gid),
        Plan::Keep => None,
    }
}

/// Takes over inherited listening sockets (upgrade, socket activation), with this
/// configuration's options.
fn adopt_all(
    config: &Config,
    sockets: Vec<socket2::Socket>,
    origins: Option<Vec<Option<usize>>>,
) -> Result<Vec<Listener>> {
    let opts = BindOptions {
        backlog: config.backlog,
        read_timeout: config.read_timeout,
        // With --min-send-rate, a write that waits comes back every second to be checked;
        // the write timeout is then kept by the worker (client::SendWatch).
        write_timeout: crate::conn::client::SendWatch::socket_timeout(
            config.min_send_rate,
            config.write_timeout,
        ),
    };
    let mut all: Vec<Listener> = sockets
        .into_iter()
        .map(|s| listener::adopt(s, &opts))
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
            None => config.listen.iter().position(|a| a.names(l.local_addr())),
        }
        .filter(|i| *i < config.listen.len());
        l.set_origin(origin);
        l.set_policy(match origin {
            Some(i) => global.with(&config.listen[i]),
            None => global.clone(),
        });
    }
    for (i, addr) in config.listen.iter().enumerate() {
        if addr.has_options() && !all.iter().any(|l| l.origin() == Some(i)) {
            tracing::warn!("no inherited socket is bound at {addr}: its options apply to no listener");
        }
    }
    for l in &all {
        l.socket()
            .set_nonblocking(all.len() > 1)
            .map_err(|e| Error::sys("setting a listener's blocking mode", e))?;
    }
    Ok(all)
}

/// Where each listener's TLS material comes from (by listener index), from the `--listen`
/// address it serves. Every TLS address is checked, even one no socket serves.
fn tls_sources(config: &Config, listeners: &[Listener]) -> Result<Vec<Option<crate::net::tls::Source>>> {
    let by_address = config
        .listen
        .iter()
        .map(|a| a.tls_source(&config.tls))
        .collect::<Result<Vec<_>>>()?;
    Ok(listeners
        .iter()
        .map(|l| l.origin().and_then(|i| by_address.get(i).cloned().flatten()))
        .collect())
}

/// The access policy of the command line, for every listener (each adds its own options).
fn global_policy(config: &Config) -> listener::Policy {
    listener::Policy {
        allow: config.allow.clone(),
        deny: config.deny.clone(),
        proxy: config.proxy_protocol,
        proxy_from: config.proxy_from.clone(),
    }
}

fn bind_all(config: &Config) -> Result<Vec<Listener>> {
    if config.listen.is_empty() {
        return Err(Error::Config(
            "no listen address: give -l/--listen ADDR (or start the server with systemd socket activation)"
                .into(),
        ));
    }
    let opts = BindOptions {
        backlog: config.backlog,
        read_timeout: config.read_timeout,
        // With --min-send-rate, a write that waits comes back every second to be checked;
        // the write timeout is then kept by the worker (client::SendWatch).
        write_timeout: crate::conn::client::SendWatch::socket_timeout(
            config.min_send_rate,
            config.write_timeout,
        ),
    };
    let mut all = Vec::new();
    let global = global_policy(config);
    for (all_origin, addr) in config.listen.iter().enumerate() {
        for mut l in listener::bind(addr, &opts)? {
            l.set_policy(global.with(addr));
            l.set_origin(Some(all_origin));
            all.push(l);
        }
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

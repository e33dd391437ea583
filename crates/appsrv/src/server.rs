//! The builder a program starts from: its defaults, its hooks, and `run`/`run_requests`,
//! which hand the parsed command line to the subcommand dispatch (`dispatch.rs`).

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgMatches, FromArgMatches};
use tracing::Level;

use crate::cli::{self, Defaults};
use crate::dispatch::{self, Hook, Program};
use crate::error::{BoxError, Result};
use crate::handler::{
    AsyncHandler, AsyncRequestHandler, DatagramHandler, Handler, RequestHandler, WorkerInfo,
};
use crate::worker::StartHook;
use crate::worker::serve::{AsyncClientLevel, AsyncRequestLevel, ClientLevel, Limits, RequestLevel};

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
    version: Option<String>,
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
    /// The command line parsed with the standard options alone, for what is asked of it
    /// before `args` ([`Server::subcommand`], [`Server::worker_identity`]...): the clap
    /// error when it has words the standard options do not know (the program's own).
    standard: std::cell::OnceCell<std::result::Result<ArgMatches, String>>,
    /// Inherited descriptors the master keeps open at start ([`Server::keep_fd`]).
    keep_fds: Vec<RawFd>,
    /// The privileged helper ([`Server::privileged`]) and its sandbox profile.
    helper: Option<Box<dyn crate::privileged::Spawn>>,
    helper_profile: crate::Sandbox,
    helper_timeout: Duration,
    /// The datagram handler's factory ([`Server::datagrams`]).
    datagrams: Option<crate::worker::datagram::Factory>,
    datagram_only: bool,
    /// The request handler's sessions hold state (`RequestHandler::Session` is not
    /// zero-sized), which a connection handed between processes cannot take along.
    stateful_sessions: bool,
    /// The handler is async (async workers only: `--io async`).
    asynchronous: bool,
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
            version: None,
            defaults: Defaults::default(),
            start_hook: None,
            exe: std::env::current_exe().ok(),
            dir: std::env::current_dir().ok(),
            reload_hook: None,
            check_hook: None,
            args: std::env::args_os().collect(),
            matches: None,
            standard: std::cell::OnceCell::new(),
            keep_fds: Vec::new(),
            helper: None,
            helper_profile: crate::Sandbox::new(),
            helper_timeout: crate::privileged::DEFAULT_TIMEOUT,
            datagrams: None,
            datagram_only: false,
            stateful_sessions: false,
            asynchronous: false,
        }
    }

    /// A one-line description for `--help`.
    pub fn about(mut self, about: impl Into<String>) -> Self {
        self.about = Some(about.into());
        self
    }

    /// The program's version, which `-V`/`--version` prints beside appsrv's
    /// (`hello 1.2.0 (appsrv 0.1.0)`). Default: none (`hello (appsrv 0.1.0)`), as a
    /// library cannot see its caller's version; [`server!`](crate::server!) sets it to the
    /// calling crate's `CARGO_PKG_VERSION`.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
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

    /// On stop, how long the server leaves the rotation before it stops (`--drain-delay`);
    /// default: 0 (none). `/readyz` answers 503 from the stop signal on while the
    /// listeners stay open and the workers go on serving, so that a load balancer or an
    /// orchestrator polling it stops sending new connections; then the graceful stop of
    /// [`Server::grace_period`] runs. A reload never drains (its capacity never dips).
    pub fn drain_delay(mut self, delay: Duration) -> Self {
        self.defaults.drain_delay = delay;
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

    /// The most datagrams answered per second to one source network, across all workers
    /// (`--max-answers-per-ip`): an IPv4 /24 and an IPv6 /56 by default
    /// (`--answers-ipv4-prefix`, `--answers-ipv6-prefix`), as BIND and NSD group sources.
    /// Over it, a datagram is dropped, or one in `--answers-slip` (default 2) is answered by
    /// the handler's [`slip`](crate::DatagramHandler::slip). Default: 0, no limit; a server
    /// that answers more than it is asked (DNS) should set one, against reflection attacks
    /// (NSD's default is 200).
    pub fn max_answers_per_ip(mut self, n: usize) -> Self {
        self.defaults.max_answers_per_ip = n;
        self
    }

    /// How long a request that arrives in pieces may take, from its first bytes, at the
    /// request level (`--header-timeout`; `None`: no limit). Default: 20 s, as Apache's
    /// `mod_reqtimeout`.
    pub fn header_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.defaults.header_timeout = timeout;
        self
    }

    /// The longest a request may take to arrive from its first bytes, however they are
    /// spread (`--header-timeout-max`; `None`: no bound): the `--min-rate` credit stops
    /// there, as mod_reqtimeout's `header=20-40` does at 40 s. Default: 60 s.
    pub fn header_timeout_max(mut self, timeout: Option<Duration>) -> Self {
        self.defaults.header_timeout_max = timeout;
        self
    }

    /// The default `--max-buffered-bytes` of a process that holds many connections (an
    /// event worker, a hybrid front, an async worker): the bytes of unfinished requests it holds in memory (0: no budget). At the
    /// budget it stops reading from the connections that hold the most and refuses new
    /// requests that need more with the codec's refusal (HTTP 503 with `Retry-After`).
    /// Default: 64 MiB.
    pub fn max_buffered_bytes(mut self, bytes: usize) -> Self {
        self.defaults.max_buffered_bytes = bytes;
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

    /// The longest a TLS session ticket lets a client resume (`--tls-ticket-lifetime`,
    /// whole seconds, 2 s to 7 days). Every worker changes the ticket key at the same
    /// moments, every half of it. Default: 12 h.
    pub fn tls_ticket_lifetime(mut self, lifetime: Duration) -> Self {
        self.defaults.tls_ticket_lifetime = lifetime;
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

    /// The I/O model of a request-level server (`--io`). Default: [`Io::Blocking`](crate::Io::Blocking).
    ///
    /// [`Io::Event`](crate::Io::Event) runs one epoll loop per worker over all its
    /// connections and calls [`RequestHandler::handle_request`](crate::RequestHandler)
    /// inline for each complete request: a worker per CPU (the pool is static, `--workers`)
    /// holds thousands of connections, and the handler must not block, since a call that
    /// does holds up every connection of its worker (`--slow-request` logs such calls). A
    /// handler that must sometimes block (a database query, a command) belongs in the
    /// blocking model, or in [`Io::Hybrid`](crate::Io::Hybrid): event loops in front
    /// processes (`--fronts`, default 1) hold every connection until it has a whole
    /// request, then hand it to an idle blocking worker, which keeps it while its next
    /// request comes within 100 ms and then hands it back; idle and slow clients hold no
    /// worker. Hybrid mode needs a handler without per-connection state
    /// (`type Session = ()`), and serves TLS listeners without hand-off (the workers accept
    /// them, as in blocking mode); each front makes one handler with the factory, for its
    /// codec. [`run`](Server::run) servers (`handle_client`) are blocking only: asking for
    /// `event` or `hybrid` with one is a configuration error. [`Io::Async`](crate::Io::Async)
    /// is the model of async handlers, which set it themselves
    /// ([`run_async_requests`](Server::run_async_requests), [`run_async`](Server::run_async));
    /// asking for it with another handler is a configuration error.
    pub fn io(mut self, io: crate::Io) -> Self {
        self.defaults.io = io;
        self
    }

    /// The default `--worker-connections` (event mode): connections per worker at most.
    /// Default: 10000.
    pub fn worker_connections(mut self, n: usize) -> Self {
        self.defaults.worker_connections = n;
        self
    }

    /// The default `--slow-request` (event mode): a handler call longer than this is
    /// logged and counted (`None`: never). Default: 100 ms.
    pub fn slow_request(mut self, limit: Option<Duration>) -> Self {
        self.defaults.slow_request = limit;
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

    /// Gives each worker a privileged helper `P`, made by `factory` in the helper process
    /// (see [`privileged`](crate::privileged)): forked by the worker before it drops its
    /// privileges, it keeps root with only [`P::CAPABILITIES`](crate::privileged::Privileged::CAPABILITIES)
    /// and answers the worker's calls
    /// ([`Conn::privileged`](crate::Conn::privileged), [`Client::privileged`](crate::Client::privileged)),
    /// while the worker runs as `--user` (or `nobody`). The master must start as root (a
    /// configuration error otherwise). Blocking servers only (`--io event` is then a
    /// configuration error). Default: no helper.
    ///
    /// The helper closes every descriptor it inherited from its worker before `factory`
    /// runs: open what the helper needs in `factory` (or in `handle`), not before, and
    /// capture no `File` or socket in the closure.
    pub fn privileged<P, F>(mut self, factory: F) -> Self
    where
        P: crate::privileged::Privileged,
        F: FnMut() -> std::result::Result<P, BoxError> + 'static,
    {
        self.helper = Some(Box::new(crate::privileged::Spawner::new(
            factory,
            self.helper_timeout,
        )));
        self
    }

    /// Serves the datagram listeners (`-l udp://HOST:PORT`, `-l unixgram:PATH`) with a
    /// [`DatagramHandler`] made by `factory` in each worker (after fork and the privilege
    /// drop, as the stream handler is), beside the stream listeners served by the
    /// terminal [`run_requests`](Server::run_requests) call: DNS over UDP and TCP on one
    /// port, for example. The datagrams are served from the worker's event loop, so a
    /// server with both kinds of listeners runs `--io event` (set it with
    /// [`io`](Server::io)); a datagram-only server calls
    /// [`run_datagrams`](Server::run_datagrams) instead. Default: no datagram handler (a
    /// datagram listener is then a configuration error).
    ///
    /// ```no_run
    /// # use std::io;
    /// # struct Udp;
    /// # impl appsrv::DatagramHandler for Udp {
    /// #     fn handle_datagram(&mut self, _: &appsrv::Datagram<'_>, _: &mut Vec<u8>) -> io::Result<()> { Ok(()) }
    /// # }
    /// # struct Tcp;
    /// # impl appsrv::RequestHandler for Tcp {
    /// #     type Codec = appsrv::codec::Lines;
    /// #     type Session = ();
    /// #     fn handle_request(&mut self, _: &mut appsrv::Conn<'_>, _: &appsrv::codec::Line<'_>, _: &mut appsrv::codec::LinesResponse<'_>) -> io::Result<()> { Ok(()) }
    /// # }
    /// appsrv::Server::new("both")
    ///     .listen("udp://127.0.0.1:5353")
    ///     .listen("127.0.0.1:5353")
    ///     .io(appsrv::Io::Event)
    ///     .datagrams(|| Ok(Udp))
    ///     .run_requests(|| Ok(Tcp))
    /// # .unwrap();
    /// ```
    pub fn datagrams<D, F>(mut self, mut factory: F) -> Self
    where
        D: DatagramHandler + 'static,
        F: FnMut() -> std::result::Result<D, BoxError> + 'static,
    {
        self.datagrams = Some(Box::new(move || {
            factory().map(|h| Box::new(h) as Box<dyn DatagramHandler>)
        }));
        self
    }

    /// The sandbox profile of the privileged helper under `--sandbox` (Landlock and seccomp,
    /// applied after its capabilities are cut, before its factory): what the helper, and
    /// every command it starts, may do. The workers keep their own profile
    /// ([`sandbox`](Server::sandbox)). Default: the default profile, which forbids
    /// identity changes and process creation: a helper that switches users or runs
    /// commands names those calls here.
    pub fn privileged_sandbox(mut self, profile: crate::Sandbox) -> Self {
        self.helper_profile = profile;
        self
    }

    /// How long a worker's call to its privileged helper may take before it fails with
    /// [`CallError::Timeout`](crate::privileged::CallError::Timeout) (per call:
    /// [`Helper::timeout`](crate::privileged::Helper::timeout)). Default: 60 s.
    pub fn privileged_timeout(mut self, timeout: Duration) -> Self {
        // Before or after `privileged`: either way it applies.
        self.helper_timeout = timeout;
        if let Some(h) = self.helper.as_mut() {
            h.set_timeout(timeout);
        }
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
        self.standard = std::cell::OnceCell::new();
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
    /// error and exits with status 2 (a bad value from the environment names its variable).
    ///
    /// appsrv re-exports clap as [`appsrv::clap`](crate::clap): a crate that does not
    /// depend on clap itself brings it into scope with `use appsrv::clap;` where it
    /// derives, since the derive's code names `clap::...` (`#[derive(appsrv::clap::Args)]`
    /// without that `use` fails with unresolved `clap` paths).
    ///
    /// ```no_run
    /// use appsrv::clap;
    ///
    /// #[derive(clap::Args, Debug)]
    /// struct Opts {
    ///     /// Directory of the static files.
    ///     #[arg(long, default_value = ".")]
    ///     static_dir: std::path::PathBuf,
    /// }
    /// let mut server = appsrv::Server::new("files").listen("127.0.0.1:8080");
    /// let opts: Opts = server.args();
    /// println!("serving {}", opts.static_dir.display());
    /// ```
    ///
    /// The options belong to `run`, `start` and `check`; for the other subcommands, `A`'s
    /// defaults are returned.
    ///
    /// For `run`, `start` and `check`, logging is set up here, with `--log-level` and
    /// `--log-format`: what the program logs with `tracing` between `args` and `run` (its
    /// own start-up work, in the master) is written as the server's lines are.
    pub fn args<A: clap::Args + FromArgMatches>(&mut self) -> A {
        let matches = cli::parse(self.command(A::augment_args), self.args.clone());
        let parsed = match matches.subcommand() {
            None => A::from_arg_matches(&matches),
            Some(("run" | "start" | "check", m)) => A::from_arg_matches(m),
            _ => A::from_arg_matches(
                &A::augment_args(clap::Command::new("defaults")).get_matches_from(["defaults"]),
            ),
        }
        .unwrap_or_else(|e| e.exit());
        dispatch::init_logging(&self.name, &matches);
        self.matches = Some(matches);
        parsed
    }

    /// The command line as parsed by [`args`](Server::args), or else parsed now with the
    /// standard options alone, as `run` parses it for a program without options of its own
    /// (nothing printed, no exit: a bad command line is `run`'s to report).
    fn parsed(&self) -> std::result::Result<&ArgMatches, &str> {
        if let Some(m) = &self.matches {
            return Ok(m);
        }
        self.standard
            .get_or_init(|| {
                cli::try_parse(self.command(|c| c), self.args.clone()).map_err(|e| {
                    let first = e.to_string();
                    let first = first.lines().next().unwrap_or_default();
                    first.strip_prefix("error: ").unwrap_or(first).to_owned()
                })
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// The subcommand the command line asks for: `"run"` (also when none is given),
    /// `"start"`, `"check"`, `"stop"`, `"status"`, and so on. An application does its
    /// start-up work (opening or creating its data, reading secrets) only for `run` and
    /// `start`, not when the same binary is called to `stop` or `reload` a running server.
    /// In a worker that `--exec-workers` started again (it runs `main` with the master's
    /// command line, as root until its privilege drop) it is `"worker"`: the master has done
    /// that work.
    ///
    /// Before [`args`](Server::args), the command line is parsed here with the standard
    /// options, as [`run`](Server::run) parses it (issue 41: it used to be `None` until
    /// `args`). `None` only then, when the command line does not parse with the standard
    /// options alone: it is bad (`run` reports it), or it has options of the program's own,
    /// which only `args` knows: call `args` first.
    ///
    /// ```
    /// let server = appsrv::Server::new("hello").command_line(["hello", "stop"]);
    /// assert_eq!(server.subcommand(), Some("stop"));
    /// ```
    pub fn subcommand(&self) -> Option<&str> {
        self.parsed().ok().map(dispatch::subcommand)
    }

    /// The identity the workers will run as, resolved from `--user` and `--group` as the
    /// master resolves it at start: `Ok(None)` when they keep the master's (the master is
    /// not root, or `--allow-root-workers`), and for subcommands other than `run`, `start`
    /// and `check`. Before [`args`](Server::args), the command line is parsed here with the
    /// standard options, as [`subcommand`](Server::subcommand) does.
    ///
    /// For files the workers must write and the master prepares, such as a database: the
    /// master creates them as this identity (switching its effective user for the
    /// purpose, as the `frontpage` example does), rather than as root and chowned after:
    /// root must not follow, by name, a path the workers' user can change.
    ///
    /// # Errors
    ///
    /// [`Error::Privilege`](crate::Error::Privilege) when the user or group does not
    /// exist, or the master is not root and another user is asked for;
    /// [`Error::Config`](crate::Error::Config) when, before `args`, the command line does
    /// not parse with the standard options alone (the message says why: a bad command
    /// line, or an option of the program's own, which needs `args` first).
    pub fn worker_identity(&self) -> Result<Option<crate::WorkerIdentity>> {
        let matches = self.parsed().map_err(|e| {
            crate::Error::Config(format!(
                "Server::worker_identity: the command line does not parse with the standard options alone ({e}); a program with options of its own calls args() first"
            ))
        })?;
        dispatch::worker_identity(matches)
    }

    /// The `--request-timeout` the master will enforce (the command line parsed by
    /// [`args`](Server::args), or before it as [`subcommand`](Server::subcommand) parses
    /// it), for a server run at the request level (`request_level`:
    /// [`run_requests`](Server::run_requests) and the async runs) or with
    /// [`run`](Server::run): the value given, or when none is given the default (60 s
    /// at the request level, none for `run`); `None` when it is off (`0`), when the
    /// command line cannot be parsed before `args`, and for the subcommands that start no
    /// worker.
    ///
    /// For a handler that waits on something of its own (a child process, a backend) and
    /// would rather answer with an error reply before the limit than have its worker
    /// killed at it: it measures the wait itself, against a deadline a little shorter.
    ///
    /// ```
    /// #[derive(clap::Args, Debug)]
    /// struct Opts {}
    ///
    /// let mut server = appsrv::Server::new("relay").command_line(["relay", "--request-timeout", "5"]);
    /// let _opts: Opts = server.args();
    /// assert_eq!(server.request_timeout(true), Some(std::time::Duration::from_secs(5)));
    /// ```
    pub fn request_timeout(&self, request_level: bool) -> Option<Duration> {
        dispatch::request_timeout(self.parsed().ok()?, request_level)
    }

    /// The I/O model the command line asks for (`--io`, its environment variable, or the
    /// default set with [`io`](Server::io)), parsed by [`args`](Server::args) or before it
    /// as [`subcommand`](Server::subcommand) parses it; `None` when it cannot be parsed
    /// then, and for the subcommands that start no worker.
    ///
    /// For a program whose handler may block on something of its own (a child process):
    /// it refuses `--io event` with its reason before anything starts. (The framework
    /// itself runs a datagram-only server in event workers whatever this says, and an async
    /// server in async workers unless it says blocking or hybrid, which it refuses.)
    ///
    /// ```
    /// #[derive(clap::Args, Debug)]
    /// struct Opts {}
    ///
    /// let mut server = appsrv::Server::new("relay").command_line(["relay", "--io", "event"]);
    /// let _opts: Opts = server.args();
    /// assert_eq!(server.io_model(), Some(appsrv::Io::Event));
    /// ```
    pub fn io_model(&self) -> Option<crate::Io> {
        dispatch::io_given(self.parsed().ok()?)
    }

    fn command(&self, app: impl Fn(clap::Command) -> clap::Command) -> clap::Command {
        cli::command(
            &self.name,
            self.about.as_deref(),
            self.version.as_deref(),
            &self.defaults,
            app,
        )
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
    pub fn run_requests<H, F>(mut self, mut factory: F) -> Result<()>
    where
        H: RequestHandler,
        F: FnMut() -> std::result::Result<H, BoxError>,
    {
        self.stateful_sessions = std::mem::size_of::<H::Session>() != 0;
        self.launch(true, |limits: Limits| {
            move || factory().map(|h| RequestLevel::new(h, limits.clone()))
        })
    }

    /// Runs the server at the request level with an async handler (issue 33): as
    /// [`run_requests`](Server::run_requests), in async workers (`--io async`, the
    /// default for such a server and its only model; `--io event` is accepted as its
    /// alias, `blocking` and `hybrid` are refused before start), each
    /// running a current-thread tokio runtime made after the fork, where every connection
    /// is a future: a handler that awaits (a timer, `tokio-postgres`, hyper's client)
    /// holds no process, so two workers hold thousands of requests in flight.
    ///
    /// Limits: `--max-inflight` (requests in the handler at once per worker; default: no
    /// limit but `--worker-connections`, 10000); `--request-timeout` (default 60 s)
    /// cancels a call and answers with the codec's error reply (HTTP 504); a client that
    /// closes its connection cancels its request's future; `--slow-request` (default 100
    /// ms) logs a poll that blocked the thread. A panic in a handler closes its connection
    /// and the worker goes on. See [`AsyncRequestHandler`].
    pub fn run_async_requests<H, F>(mut self, mut factory: F) -> Result<()>
    where
        H: AsyncRequestHandler,
        F: FnMut() -> std::result::Result<H, BoxError>,
    {
        self.stateful_sessions = std::mem::size_of::<H::Session>() != 0;
        self.asynchronous = true;
        self.defaults.io = crate::Io::Async;
        self.launch(true, |limits: Limits| {
            move || factory().map(|h| AsyncRequestLevel::new(h, limits.clone()))
        })
    }

    /// Runs the server at the client level with an async handler (issue 33): each
    /// connection is given whole to [`AsyncHandler::handle_client`] as an
    /// [`AsyncClient`](crate::AsyncClient), in async workers (`--io async`, the default
    /// for such a server; `--io event` is its alias), thousands of connections per worker: for conversational
    /// protocols. `--read-timeout` and `--write-timeout` bound each read and write;
    /// `--request-timeout` (default: off) bounds a whole connection; `--max-inflight`
    /// bounds the connections in the handler at once. A panic closes its connection only.
    pub fn run_async<H, F>(mut self, mut factory: F) -> Result<()>
    where
        H: AsyncHandler,
        F: FnMut() -> std::result::Result<H, BoxError>,
    {
        self.asynchronous = true;
        self.defaults.io = crate::Io::Async;
        self.launch(false, |_| move || factory().map(AsyncClientLevel))
    }

    /// Runs a server that serves datagrams only (`udp://` and `unixgram:` listeners, no
    /// stream listener): each worker's [`DatagramHandler`], made by `factory`, answers the
    /// datagrams from the worker's event loop (whatever `--io` says: there are no stream
    /// connections for it to choose a model for). Otherwise as [`run`](Server::run).
    pub fn run_datagrams<D, F>(self, factory: F) -> Result<()>
    where
        D: DatagramHandler + 'static,
        F: FnMut() -> std::result::Result<D, BoxError> + 'static,
    {
        let mut server = self.datagrams(factory);
        server.datagram_only = true;
        server.launch(true, |limits: Limits| {
            move || {
                Ok(RequestLevel::new(
                    crate::worker::datagram::NoStreams,
                    limits.clone(),
                ))
            }
        })
    }

    /// Parses the command line (unless [`args`](Server::args) did) and runs its subcommand.
    fn launch<C, F, M>(mut self, request_level: bool, make_factory: M) -> Result<()>
    where
        C: crate::worker::ServedBy,
        F: FnMut() -> std::result::Result<C, BoxError>,
        M: FnOnce(Limits) -> F,
    {
        // Parsed here, the handler's kind is known: the help lists only the options it
        // takes. (Parsed by `args`, before `run_*` was called, it lists them all.)
        let accepts = cli::Accepts {
            request_level,
            asynchronous: self.asynchronous,
            datagrams: self.datagrams.is_some(),
            streams: !self.datagram_only,
            stateful_sessions: self.stateful_sessions,
        };
        let matches = match self.matches.take() {
            Some(m) => m,
            None => cli::parse(
                cli::only_accepted(self.command(|c| c), accepts),
                self.args.clone(),
            ),
        };
        let program = Program {
            name: self.name,
            sandbox_profile: self.defaults.sandbox_profile,
            start_hook: self.start_hook,
            exe: self.exe,
            dir: self.dir,
            reload_hook: self.reload_hook,
            check_hook: self.check_hook,
            args: self.args,
            keep_fds: self.keep_fds,
            helper: self.helper,
            helper_profile: self.helper_profile,
            datagrams: self.datagrams,
            datagram_only: self.datagram_only,
            stateful_sessions: self.stateful_sessions,
            asynchronous: self.asynchronous,
            grace_period: self.defaults.grace_period,
            drain_delay: self.defaults.drain_delay,
        };
        dispatch::launch(program, &matches, request_level, make_factory)
    }
}

/// A [`Server`] named `name` (default: the binary's name, `CARGO_BIN_NAME`) whose
/// [`version`](Server::version) is the calling crate's `CARGO_PKG_VERSION`, so that
/// `--version` prints the application's version beside appsrv's.
///
/// ```no_run
/// # struct Hello;
/// # impl appsrv::Handler for Hello {
/// #     fn handle_client(&mut self, _: &mut appsrv::Client) -> std::io::Result<()> { Ok(()) }
/// # }
/// // `hello --version` prints `hello 1.2.0 (appsrv 0.1.0)` for a crate at version 1.2.0.
/// appsrv::server!("hello")
///     .listen("127.0.0.1:7000")
///     .run(|| Ok(Hello))
///     .unwrap_or_else(|e| e.exit());
/// ```
#[macro_export]
macro_rules! server {
    () => {
        $crate::server!(env!("CARGO_BIN_NAME"))
    };
    ($name:expr) => {
        $crate::Server::new($name).version(env!("CARGO_PKG_VERSION"))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Args, Debug)]
    struct NoArgs {}

    /// Issue 41: `subcommand()` and `worker_identity()` answer before `args()` (they were
    /// `None` and an error), parsing the command line as `run` would; with an option of the
    /// program's own, which only `args` knows, the error says so.
    #[test]
    fn issue_41_subcommand_and_worker_identity_work_without_args() {
        let stop = Server::new("t").command_line(["t", "stop"]);
        assert_eq!(stop.subcommand(), Some("stop"));
        assert!(matches!(stop.worker_identity(), Ok(None)), "no workers for stop");
        let run = Server::new("t").command_line(["t", "-l", "127.0.0.1:0"]);
        assert_eq!(run.subcommand(), Some("run"));
        let check = Server::new("t").command_line(["t", "-u", "nobody", "check"]);
        assert_eq!(check.subcommand(), Some("check"));
        match check.worker_identity() {
            Ok(Some(id)) => assert!(nix::unistd::Uid::effective().is_root(), "{id:?}"),
            Err(crate::Error::Privilege { .. }) => assert!(!nix::unistd::Uid::effective().is_root()),
            other => panic!("-u nobody: {other:?}"),
        }
        let own = Server::new("t").command_line(["t", "--own-option", "start"]);
        assert_eq!(own.subcommand(), None);
        let err = own.worker_identity().unwrap_err().to_string();
        assert!(
            err.contains("--own-option") && err.contains("args() first"),
            "{err}"
        );
    }

    fn parsed(args: &[&str]) -> Server {
        let mut server = Server::new("t").command_line(args.iter().copied());
        let _: NoArgs = server.args();
        server
    }

    /// Issue 35: a handler learns the `--request-timeout` the master enforces, its
    /// default included, to answer before it.
    #[test]
    fn issue_35_request_timeout_as_the_master_enforces_it() {
        let secs = Duration::from_secs;
        let own_option = Server::new("t").command_line(["t", "--own-option"]);
        assert_eq!(own_option.request_timeout(true), None, "unparsed before args");
        let given = parsed(&["t", "-l", "127.0.0.1:0", "--request-timeout", "7"]);
        assert_eq!(given.request_timeout(true), Some(secs(7)));
        assert_eq!(given.request_timeout(false), Some(secs(7)));
        let default = parsed(&["t", "-l", "127.0.0.1:0"]);
        assert_eq!(default.request_timeout(true), Some(cli::DEFAULT_REQUEST_TIMEOUT));
        assert_eq!(default.request_timeout(false), None, "off for handle_client");
        let off = parsed(&["t", "check", "-l", "127.0.0.1:0", "--request-timeout", "0"]);
        assert_eq!(off.request_timeout(true), None);
        assert_eq!(parsed(&["t", "status"]).request_timeout(true), None);
    }
}

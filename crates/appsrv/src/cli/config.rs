//! The resolved configuration: the defaults set in code ([`Defaults`]), the settings of a
//! `run` read out of its matches ([`Config`] and its groups, [`config`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::ArgMatches;
use tracing::Level;

use super::{Io, LogFormat, PoolKind};
use crate::net::listener::ListenAddr;

/// The default `--backlog`, as nginx's.
pub(crate) const DEFAULT_BACKLOG: u32 = 511;
/// The default `--grace-period`.
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// The default `--start-timeout`.
pub(crate) const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(60);
/// The default `--read-timeout` and `--write-timeout`, as Apache's `Timeout`.
pub(crate) const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Defaults set in code with the builder.
#[derive(Debug, Clone)]
pub(crate) struct Defaults {
    pub(crate) listen: Vec<String>,
    pub(crate) workers: Option<usize>,
    pub(crate) user: Option<String>,
    pub(crate) group: Option<String>,
    pub(crate) allow_root_workers: bool,
    pub(crate) backlog: u32,
    pub(crate) grace_period: Duration,
    pub(crate) drain_delay: Duration,
    pub(crate) read_timeout: Option<Duration>,
    pub(crate) write_timeout: Option<Duration>,
    pub(crate) log_level: Level,
    pub(crate) keepalive_timeout: Option<Duration>,
    pub(crate) keepalive_requests: u32,
    pub(crate) pool: PoolKind,
    pub(crate) allow: Vec<String>,
    pub(crate) deny: Vec<String>,
    pub(crate) proxy_protocol: bool,
    pub(crate) proxy_from: Vec<String>,
    pub(crate) max_conns_per_ip: usize,
    pub(crate) max_answers_per_ip: usize,
    pub(crate) header_timeout: Option<Duration>,
    pub(crate) header_timeout_max: Option<Duration>,
    pub(crate) min_rate: usize,
    pub(crate) min_send_rate: usize,
    pub(crate) max_buffered_bytes: usize,
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
    pub(crate) tls_client_ca: Option<PathBuf>,
    pub(crate) tls_alpn: Vec<String>,
    pub(crate) tls_handshake_timeout: Duration,
    pub(crate) tls_ticket_lifetime: Duration,
    pub(crate) chroot: Option<PathBuf>,
    pub(crate) no_new_privs: bool,
    pub(crate) sandbox: bool,
    pub(crate) sandbox_profile: crate::confine::sandbox::Sandbox,
    pub(crate) exec_workers: bool,
    pub(crate) io: Io,
    pub(crate) worker_connections: usize,
    pub(crate) slow_request: Option<Duration>,
}

/// The default `--worker-connections` (event mode), as nginx's order of magnitude for a
/// worker that serves small requests.
pub(crate) const DEFAULT_WORKER_CONNECTIONS: usize = 10_000;
/// The default `--fronts` (hybrid mode): one loop does the reading and admission for a
/// pool of blocking workers on a small machine; give more on a large one.
pub(crate) const DEFAULT_FRONTS: usize = 1;
/// The default `--slow-request` (event mode).
pub(crate) const DEFAULT_SLOW_REQUEST: Duration = Duration::from_millis(100);

/// The default `--min-spare` (dynamic pool).
pub(crate) const DEFAULT_MIN_SPARE: usize = 2;
/// The default `--max-spare` (dynamic pool).
pub(crate) const DEFAULT_MAX_SPARE: usize = 8;
/// The default `--start-workers` (dynamic pool).
pub(crate) const DEFAULT_START: usize = 4;
/// The default `--max-workers` (dynamic and ondemand pools).
pub(crate) const DEFAULT_MAX_WORKERS: usize = 128;
/// The default `--worker-idle-timeout` (ondemand pool), as PHP-FPM's.
pub(crate) const DEFAULT_WORKER_IDLE: Duration = Duration::from_secs(10);
/// The default `--request-timeout` of request-level servers.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The default `--header-timeout`, as Apache's `mod_reqtimeout` (`header=20-40,MinRate=500`).
pub(crate) const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// The default `--header-timeout-max`: however its bytes are spread, a request arrives
/// within this of its first bytes (mod_reqtimeout's upper bound, `header=20-40`, is 40 s
/// for the head alone; this covers a body too).
pub(crate) const DEFAULT_HEADER_TIMEOUT_MAX: Duration = Duration::from_secs(60);
/// The default `--max-buffered-bytes` of an event loop (an event worker, a hybrid front):
/// 64 MiB, about 6 KiB for each of `--worker-connections`' 10,000.
pub(crate) const DEFAULT_MAX_BUFFERED_BYTES: usize = 64 << 20;
/// The default `--min-rate`, bytes per second.
pub(crate) const DEFAULT_MIN_RATE: usize = 500;
/// The default `--min-send-rate`, bytes per second (mirrors `--min-rate`).
pub(crate) const DEFAULT_MIN_SEND_RATE: usize = 500;

/// The default `--penalty-max` (failed authentication), as OpenSSH's
/// `PerSourcePenalties max:600s`.
pub(crate) const DEFAULT_PENALTY_MAX: Duration = Duration::from_secs(600);

/// The default `--keepalive-timeout`, as Apache's `KeepAliveTimeout`.
pub(crate) const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The default `--keepalive-requests`, as nginx's `keepalive_requests`.
pub(crate) const DEFAULT_KEEPALIVE_REQUESTS: u32 = 1000;

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            listen: Vec::new(),
            workers: None,
            user: None,
            group: None,
            allow_root_workers: false,
            backlog: DEFAULT_BACKLOG,
            grace_period: DEFAULT_GRACE,
            drain_delay: Duration::ZERO,
            read_timeout: Some(DEFAULT_IO_TIMEOUT),
            write_timeout: Some(DEFAULT_IO_TIMEOUT),
            log_level: Level::INFO,
            keepalive_timeout: Some(DEFAULT_KEEPALIVE_TIMEOUT),
            keepalive_requests: DEFAULT_KEEPALIVE_REQUESTS,
            pool: PoolKind::Static,
            allow: Vec::new(),
            deny: Vec::new(),
            proxy_protocol: false,
            proxy_from: Vec::new(),
            max_conns_per_ip: 0,
            max_answers_per_ip: 0,
            header_timeout: Some(DEFAULT_HEADER_TIMEOUT),
            header_timeout_max: Some(DEFAULT_HEADER_TIMEOUT_MAX),
            min_rate: DEFAULT_MIN_RATE,
            min_send_rate: DEFAULT_MIN_SEND_RATE,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_alpn: Vec::new(),
            tls_handshake_timeout: crate::net::tls::DEFAULT_HANDSHAKE_TIMEOUT,
            tls_ticket_lifetime: Duration::from_secs(u64::from(crate::net::tls::DEFAULT_TICKET_LIFETIME)),
            chroot: None,
            no_new_privs: false,
            sandbox: false,
            sandbox_profile: crate::confine::sandbox::Sandbox::default(),
            exec_workers: false,
            io: Io::Blocking,
            worker_connections: DEFAULT_WORKER_CONNECTIONS,
            slow_request: Some(DEFAULT_SLOW_REQUEST),
        }
    }
}

/// The resolved settings of a `run`, in groups as `--help` groups the options (its
/// "Workers and pool" in three: the pool, the workers' I/O model, recycling).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The listeners (`--help`: "Listeners"): where the server listens, and where it shows its metrics and status.
    pub(crate) listeners: Listeners,
    /// The pool's size and policy (`--help`: "Workers and pool").
    pub(crate) pool: Pool,
    /// How each worker serves (`--help`: "Workers and pool"): the I/O model and its limits, re-executed workers.
    pub(crate) workers: Workers,
    /// When a worker is replaced (`--help`: "Workers and pool"): its requests, connections, memory and age.
    pub(crate) recycle: Recycling,
    /// The timeouts and rates (`--help`: "Timeouts"): of a client's reads and writes, of a request, of a stop and a start, and the budget of buffered bytes.
    pub(crate) timeouts: Timeouts,
    /// Who may connect, and how much (`--help`: "Access"): allow and deny rules, PROXY headers, per-address caps and penalties, datagrams' answer rate.
    pub(crate) access: Access,
    /// TLS listeners' settings (`--help`: "TLS").
    pub(crate) tls: Tls,
    /// How workers are confined (`--help`: "Confinement"): their user, chroot, limits and sandbox.
    pub(crate) confine: Confine,
    /// The daemon, its files and its logs (`--help`: "Logs and files").
    pub(crate) files: Files,
}

/// The listeners (`--help`: "Listeners"): where the server listens, and where it shows its metrics and status.
#[derive(Debug, Clone)]
pub(crate) struct Listeners {
    pub(crate) listen: Vec<ListenAddr>,
    pub(crate) backlog: u32,
    pub(crate) metrics_listen: Option<String>,
    /// `--status-request-detail`: publish requests' first bytes, not their codecs'
    /// summaries (issue 41).
    pub(crate) status_request_detail: bool,
}

/// The pool's size and policy (`--help`: "Workers and pool").
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pub(crate) workers: usize,
    pub(crate) policy: PoolKind,
    pub(crate) start_workers: usize,
    pub(crate) min_spare: usize,
    pub(crate) max_spare: usize,
    pub(crate) max_workers: usize,
    pub(crate) worker_idle_timeout: Duration,
}

/// How each worker serves (`--help`: "Workers and pool"): the I/O model and its limits, re-executed workers.
#[derive(Debug, Clone)]
pub(crate) struct Workers {
    pub(crate) io: Io,
    /// Hybrid mode: the front processes (`--fronts`).
    pub(crate) fronts: usize,
    /// Event mode: connections per worker at most.
    pub(crate) worker_connections: usize,
    /// Async handlers: handler calls in flight per worker at most (`--max-inflight`; 0:
    /// no limit but `--worker-connections`).
    pub(crate) max_inflight: usize,
    pub(crate) exec_workers: bool,
}

/// When a worker is replaced (`--help`: "Workers and pool"): its requests, connections, memory and age.
#[derive(Debug, Clone)]
pub(crate) struct Recycling {
    pub(crate) max_requests: u64,
    pub(crate) max_connections: u64,
    pub(crate) max_jitter: u64,
    pub(crate) max_worker_memory_mib: u64,
    pub(crate) max_worker_age: Option<Duration>,
}

/// The timeouts and rates (`--help`: "Timeouts"): of a client's reads and writes, of a request, of a stop and a start, and the budget of buffered bytes.
#[derive(Debug, Clone)]
pub(crate) struct Timeouts {
    pub(crate) read_timeout: Option<Duration>,
    pub(crate) write_timeout: Option<Duration>,
    pub(crate) keepalive_timeout: Option<Duration>,
    pub(crate) keepalive_requests: u32,
    pub(crate) header_timeout: Option<Duration>,
    /// `--header-timeout-max` (`None`: no upper bound on the --min-rate credit).
    pub(crate) header_timeout_max: Option<Duration>,
    /// `--max-buffered-bytes` (0: no budget).
    pub(crate) max_buffered_bytes: u64,
    pub(crate) min_rate: u64,
    /// `--min-send-rate`, bytes per second (0: no limit).
    pub(crate) min_send_rate: u64,
    /// `None`: the default of the handler's level (60 s for requests, off for clients).
    pub(crate) request_timeout: Option<Duration>,
    /// Event mode: a handler call longer than this is logged (`None`: never).
    pub(crate) slow_request: Option<Duration>,
    pub(crate) grace_period: Duration,
    pub(crate) drain_delay: Duration,
    pub(crate) start_timeout: Duration,
}

/// Who may connect, and how much (`--help`: "Access"): allow and deny rules, PROXY headers, per-address caps and penalties, datagrams' answer rate.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    pub(crate) allow: Vec<crate::net::proxy::Cidr>,
    pub(crate) deny: Vec<crate::net::proxy::Cidr>,
    pub(crate) proxy_protocol: bool,
    pub(crate) proxy_from: Vec<crate::net::proxy::Cidr>,
    pub(crate) max_conns_per_ip: u64,
    /// `--penalty-max`: the longest refusal of an address for failed authentication
    /// (`Conn::penalize`); `None`: penalties off (no table, `penalize` charges nothing).
    pub(crate) penalty_max: Option<Duration>,
    /// `--max-datagram-size`, `--max-answers-per-ip`, `--answers-slip`.
    pub(crate) max_datagram_size: u64,
    pub(crate) max_answers_per_ip: u64,
    pub(crate) answers_slip: u64,
    /// `--answers-ipv4-prefix`, `--answers-ipv6-prefix`: how the answer-rate limit groups
    /// sources.
    pub(crate) answer_prefixes: crate::scoreboard::AnswerPrefixes,
}

/// TLS listeners' settings (`--help`: "TLS").
#[derive(Debug, Clone)]
pub(crate) struct Tls {
    /// TLS material for the listeners with the `tls` option that name none of their own.
    pub(crate) defaults: crate::net::listener::TlsDefaults,
    /// `None`: no limit.
    pub(crate) handshake_timeout: Option<Duration>,
}

/// How workers are confined (`--help`: "Confinement"): their user, chroot, limits and sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Confine {
    pub(crate) user: Option<String>,
    pub(crate) group: Option<String>,
    pub(crate) allow_root_workers: bool,
    pub(crate) chroot: Option<PathBuf>,
    pub(crate) rlimit_nofile: Option<u64>,
    /// MiB.
    pub(crate) rlimit_core: Option<u64>,
    /// MiB.
    pub(crate) rlimit_as: Option<u64>,
    pub(crate) umask: Option<u32>,
    pub(crate) no_new_privs: bool,
    pub(crate) sandbox: bool,
    pub(crate) sandbox_read: Vec<PathBuf>,
    pub(crate) sandbox_write: Vec<PathBuf>,
    /// The program's own profile ([`Server::sandbox`](crate::Server::sandbox)).
    pub(crate) sandbox_profile: crate::confine::sandbox::Sandbox,
    /// With a privileged helper: its profile ([`Server::privileged_sandbox`](crate::Server::privileged_sandbox)).
    pub(crate) helper_profile: Option<crate::confine::sandbox::Sandbox>,
}

/// The daemon, its files and its logs (`--help`: "Logs and files").
#[derive(Debug, Clone)]
pub(crate) struct Files {
    pub(crate) daemon: bool,
    pub(crate) pid_file: Option<PathBuf>,
    pub(crate) log_file: Option<PathBuf>,
    pub(crate) log_level: Level,
    /// `None`: `journal` under systemd's journal, `text` otherwise.
    pub(crate) log_format: Option<LogFormat>,
    pub(crate) access_log: Option<PathBuf>,
    /// `--access-log-sample`: one line per N datagrams.
    pub(crate) access_log_sample: u64,
    pub(crate) control: Option<PathBuf>,
}

impl Config {
    /// How workers are confined, from the options and the program's sandbox profile
    /// (whose seccomp filter is compiled here: an error is a configuration error).
    pub(crate) fn confinement(&self) -> Result<crate::confine::privilege::Confinement, crate::Error> {
        let c = &self.confine;
        use nix::sys::resource::Resource;
        let mib = |v: u64| v.saturating_mul(1 << 20);
        let rlimits = [
            (Resource::RLIMIT_NOFILE, c.rlimit_nofile),
            (Resource::RLIMIT_CORE, c.rlimit_core.map(mib)),
            (Resource::RLIMIT_AS, c.rlimit_as.map(mib)),
        ]
        .into_iter()
        .filter_map(|(r, v)| v.map(|v| (r, v)))
        .collect();
        let sandbox = match c.sandbox {
            true => Some(
                c.sandbox_profile
                    .clone()
                    .with_paths(&c.sandbox_read, &c.sandbox_write)
                    .compile()
                    .map_err(|e| crate::Error::Config(format!("--sandbox: {e}")))?,
            ),
            false => None,
        };
        // The helper's profile gets the operator's paths too (the commands a helper starts
        // inherit its profile, and they are what --sandbox-read is usually for), and its
        // own task directory, where kill_leftovers finds its children (Landlock covers
        // procfs: without it the helper would see none, and kill nothing).
        let helper_sandbox = match (c.sandbox, &c.helper_profile) {
            (true, Some(profile)) => Some(
                profile
                    .clone()
                    .with_paths(&c.sandbox_read, &c.sandbox_write)
                    .read("/proc/self/task")
                    .compile()
                    .map_err(|e| {
                        crate::Error::Config(format!("--sandbox (the privileged helper's profile): {e}"))
                    })?,
            ),
            _ => None,
        };
        Ok(crate::confine::privilege::Confinement {
            chroot: c.chroot.clone(),
            rlimits,
            umask: c.umask,
            no_new_privs: c.no_new_privs,
            sandbox,
            helper_sandbox,
        })
    }
}

/// The default pool size: one worker per CPU, at least two (one busy worker must not
/// make the server unavailable).
pub(crate) fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).max(2)
}

fn timeout(m: &ArgMatches, id: &str) -> Option<Duration> {
    m.get_one::<Duration>(id).copied().filter(|d| !d.is_zero())
}

fn cidr_list(m: &ArgMatches, id: &str) -> Vec<crate::net::proxy::Cidr> {
    m.get_many::<crate::net::proxy::Cidr>(id)
        .map(|v| v.copied().collect())
        .unwrap_or_default()
}

fn n(m: &ArgMatches, id: &str) -> u64 {
    *m.get_one::<u64>(id).expect("has a default")
}

/// `--proxy-from`, or the loopback addresses when none is given (a PROXY header is
/// trusted from a local balancer only, unless told otherwise).
fn proxy_from(m: &ArgMatches) -> Vec<crate::net::proxy::Cidr> {
    let given = cidr_list(m, "proxy-from");
    if given.is_empty() {
        vec![
            "127.0.0.0/8".parse().expect("valid"),
            "::1".parse().expect("valid"),
        ]
    } else {
        given
    }
}

/// The `--tls-*` defaults for the listeners that do not name their own (an empty ALPN
/// protocol name is dropped, never offered).
fn tls_defaults(m: &ArgMatches) -> crate::net::listener::TlsDefaults {
    crate::net::listener::TlsDefaults {
        cert: m.get_one::<PathBuf>("tls-cert").cloned(),
        key: m.get_one::<PathBuf>("tls-key").cloned(),
        client_ca: m.get_one::<PathBuf>("tls-client-ca").cloned(),
        alpn: m
            .get_many::<String>("tls-alpn")
            .map(|v| {
                v.filter(|p| !p.is_empty())
                    .map(|p| p.as_bytes().to_vec())
                    .collect()
            })
            .unwrap_or_default(),
        ticket_lifetime: *m.get_one::<u32>("tls-ticket-lifetime").expect("has a default"),
    }
}

/// A repeatable path option's values (none: empty).
fn paths(m: &ArgMatches, id: &str) -> Vec<PathBuf> {
    m.get_many::<PathBuf>(id)
        .map(|v| v.cloned().collect())
        .unwrap_or_default()
}

/// Reads the standard options out of the `run` subcommand's matches.
pub(crate) fn config(m: &ArgMatches) -> Config {
    Config {
        listeners: Listeners {
            listen: m
                .get_many::<ListenAddr>("listen")
                .map(|v| v.cloned().collect())
                .unwrap_or_default(),
            backlog: *m.get_one::<u32>("backlog").expect("has a default"),
            metrics_listen: m.get_one::<String>("metrics-listen").cloned(),
            status_request_detail: m.get_flag("status-request-detail"),
        },
        pool: Pool {
            workers: m
                .get_one::<u32>("workers")
                .map_or_else(default_workers, |n| *n as usize),
            policy: *m.get_one::<PoolKind>("pool").expect("has a default"),
            start_workers: n(m, "start-workers") as usize,
            min_spare: n(m, "min-spare") as usize,
            max_spare: n(m, "max-spare") as usize,
            max_workers: n(m, "max-workers") as usize,
            worker_idle_timeout: *m
                .get_one::<Duration>("worker-idle-timeout")
                .expect("has a default"),
        },
        workers: Workers {
            io: *m.get_one::<Io>("io").expect("has a default"),
            fronts: n(m, "fronts") as usize,
            worker_connections: n(m, "worker-connections") as usize,
            max_inflight: n(m, "max-inflight") as usize,
            exec_workers: m.get_flag("exec-workers"),
        },
        recycle: Recycling {
            max_requests: n(m, "max-requests"),
            max_connections: n(m, "max-connections"),
            max_jitter: n(m, "max-jitter"),
            max_worker_memory_mib: n(m, "max-worker-memory"),
            max_worker_age: timeout(m, "max-worker-age"),
        },
        timeouts: timeouts(m),
        access: access(m),
        tls: Tls {
            defaults: tls_defaults(m),
            handshake_timeout: timeout(m, "tls-handshake-timeout"),
        },
        confine: confine(m),
        files: Files {
            daemon: m
                .try_get_one::<bool>("daemon")
                .ok()
                .flatten()
                .copied()
                .unwrap_or(false),
            pid_file: m.get_one::<PathBuf>("pid-file").cloned(),
            log_file: m.get_one::<PathBuf>("log-file").cloned(),
            log_level: *m.get_one::<Level>("log-level").expect("has a default"),
            log_format: m.get_one::<LogFormat>("log-format").copied(),
            access_log: m.get_one::<PathBuf>("access-log").cloned(),
            access_log_sample: n(m, "access-log-sample"),
            control: m.get_one::<PathBuf>("control").cloned(),
        },
    }
}

/// The "Timeouts" group out of the matches.
fn timeouts(m: &ArgMatches) -> Timeouts {
    Timeouts {
        read_timeout: timeout(m, "read-timeout"),
        write_timeout: timeout(m, "write-timeout"),
        keepalive_timeout: timeout(m, "keepalive-timeout"),
        keepalive_requests: *m.get_one::<u32>("keepalive-requests").expect("has a default"),
        header_timeout: timeout(m, "header-timeout"),
        header_timeout_max: timeout(m, "header-timeout-max"),
        max_buffered_bytes: n(m, "max-buffered-bytes"),
        min_rate: n(m, "min-rate"),
        min_send_rate: n(m, "min-send-rate"),
        request_timeout: m.get_one::<Duration>("request-timeout").copied(),
        slow_request: timeout(m, "slow-request"),
        grace_period: *m.get_one::<Duration>("grace-period").expect("has a default"),
        drain_delay: *m.get_one::<Duration>("drain-delay").expect("has a default"),
        start_timeout: *m.get_one::<Duration>("start-timeout").expect("has a default"),
    }
}

/// The "Access" group out of the matches.
fn access(m: &ArgMatches) -> Access {
    Access {
        allow: cidr_list(m, "allow"),
        deny: cidr_list(m, "deny"),
        proxy_protocol: m.get_flag("proxy-protocol"),
        proxy_from: proxy_from(m),
        max_conns_per_ip: n(m, "max-conns-per-ip"),
        penalty_max: timeout(m, "penalty-max"),
        max_datagram_size: n(m, "max-datagram-size"),
        max_answers_per_ip: n(m, "max-answers-per-ip"),
        answers_slip: n(m, "answers-slip"),
        answer_prefixes: crate::scoreboard::AnswerPrefixes {
            v4: *m.get_one::<u8>("answers-ipv4-prefix").expect("has a default"),
            v6: *m.get_one::<u8>("answers-ipv6-prefix").expect("has a default"),
        },
    }
}

/// The "Confinement" group out of the matches (the program's profiles are set by the
/// dispatch, which knows them).
fn confine(m: &ArgMatches) -> Confine {
    Confine {
        user: m.get_one::<String>("user").cloned(),
        group: m.get_one::<String>("group").cloned(),
        allow_root_workers: m.get_flag("allow-root-workers"),
        chroot: m.get_one::<PathBuf>("chroot").cloned(),
        rlimit_nofile: m.get_one::<u64>("rlimit-nofile").copied(),
        rlimit_core: m.get_one::<u64>("rlimit-core").copied(),
        rlimit_as: m.get_one::<u64>("rlimit-as").copied(),
        umask: m.get_one::<u32>("umask").copied(),
        no_new_privs: m.get_flag("no-new-privs"),
        sandbox: m.get_flag("sandbox"),
        sandbox_read: paths(m, "sandbox-read"),
        sandbox_write: paths(m, "sandbox-write"),
        sandbox_profile: crate::confine::sandbox::Sandbox::default(),
        helper_profile: None,
    }
}

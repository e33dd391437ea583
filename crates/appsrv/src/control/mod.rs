//! The control socket: the master's Unix socket for `status`, `metrics` and `workers`,
//! and the optional HTTP listener for Prometheus (`/metrics`), health checks
//! (`/healthz`, `/readyz`) and people (`/status`, the status page).
//!
//! INTERFACE (the master calls these):
//! - [`Control::bind`] at start-up, in the master, before the privilege drop of workers;
//! - [`Control::poll_fds`] each loop, into the master's `poll`;
//! - [`Control::service`] after each `poll`: accepts, reads requests, writes replies, all
//!   non-blocking with deadlines, calling `answer` for complete requests;
//! - [`Control::next_deadline`] so the master's `poll` wakes to expire slow clients;
//! - [`Control::raw_fds`] for workers to close after fork; [`Control::remove_file`] on stop.
//!
//! [`MetricsListener`] has the same `poll_fds` / `service` / `next_deadline` / `raw_fds`.
//!
//! # Wire protocol, version 1
//!
//! The client connects to the Unix socket and sends one request line, ASCII, ending with
//! `\n` (a `\r` before it and spaces around words are ignored; end of file also ends the
//! line), at most [`MAX_REQUEST`] bytes:
//!
//! ```text
//! status            the status table (render_text)
//! status json       the status as one JSON object (render_json)
//! metrics           Prometheus text exposition format 0.0.4 (render_metrics); the
//!                   `metrics --format openmetrics` client re-frames it as OpenMetrics
//!                   1.0 itself (to_openmetrics), so the request is the same for both
//! workers +N        grow the pool by N (1 to 1024)
//! workers -N        shrink it by N
//! ```
//!
//! The server answers `OK\n` followed by the body, or one line `ERR <message>\n`, then
//! shuts its side: the reply ends at end of file. A peer that is neither root nor the
//! master's user gets `ERR permission denied`; an unknown request gets `ERR unknown
//! request ...`. The whole exchange must be over within [`DEADLINE`](conn::DEADLINE) of
//! the accept, or the master closes the connection. Later versions may add requests,
//! never change these.
//!
//! # Safety of the master
//!
//! Everything here runs in the master's single-threaded loop, so nothing may block: every
//! socket is non-blocking, requests are bounded, at most
//! [`MAX_CONNECTIONS`](conn::MAX_CONNECTIONS) connections are served at once (more are
//! turned away at once), and a connection that has not finished within
//! [`DEADLINE`](conn::DEADLINE) is closed. A client that connects and sends nothing
//! costs one descriptor for two seconds, never a stall of the pool's management.

mod chart;
mod conn;
pub(crate) mod history;
mod http;
mod page;
mod render;
pub(crate) mod status;

use crate::process::console::{errln, outln};
use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::PollFd;
use nix::sys::socket::{getsockopt, sockopt};
use socket2::{Domain, SockAddr, Socket, Type};

use crate::error::Error;
use conn::{Acceptor, Decision};

pub(crate) use http::MetricsListener;
pub(crate) use render::{MetricsFormat, render_json, render_metrics, render_text};

/// The longest request line, with its `\n`.
pub(crate) const MAX_REQUEST: usize = 1024;

/// How long the client waits to connect, and for each read or write of the reply.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// After a refused connection, further refusals from the same uid are logged only at
/// debug level until this long passes without one.
const REFUSAL_EPISODE: Duration = Duration::from_secs(60);

/// The listen backlog of the control socket (connections beyond
/// [`MAX_CONNECTIONS`](conn::MAX_CONNECTIONS) are accepted and turned away at once, so
/// this needs no size of its own).
const BACKLOG: i32 = 64;

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// The status table, or JSON.
    Status { json: bool },
    /// Prometheus text.
    Metrics,
    /// Grow (positive) or shrink (negative) the pool.
    Workers(i32),
    /// Re-read what can be re-read (the `on_reload` hook) and start a new generation of
    /// workers; the reply names the generation.
    Reload,
    /// Whether the reload to generation N is done (`done`), in progress (`pending`), or
    /// failed (an error).
    ReloadStatus(u32),
    /// Start the binary now on disk as a new master, handing it the sockets; the reply
    /// names the new master's pid.
    Upgrade,
    /// Whether the upgrade to the master with this pid is done (`done`, answered by the
    /// new master), in progress (`pending`), or failed (an error).
    UpgradeStatus(i32),
}

impl Request {
    /// The request line as sent on the wire, without its `\n`.
    pub(crate) fn line(&self) -> String {
        match self {
            Request::Status { json: false } => "status".into(),
            Request::Status { json: true } => "status json".into(),
            Request::Metrics => "metrics".into(),
            Request::Workers(n) => format!("workers {n:+}"),
            Request::Reload => "reload".into(),
            Request::ReloadStatus(g) => format!("reload-status {g}"),
            Request::Upgrade => "upgrade".into(),
            Request::UpgradeStatus(p) => format!("upgrade-status {p}"),
        }
    }

    /// Parses a request line (without or with its `\r\n`).
    pub(crate) fn parse(line: &[u8]) -> Result<Request, String> {
        let text = std::str::from_utf8(line)
            .ok()
            .filter(|t| {
                t.bytes()
                    .all(|b| b.is_ascii() && (b >= 0x20 || b"\t\r\n".contains(&b)))
            })
            .ok_or_else(|| "the request is not a line of printable ASCII".to_owned())?;
        let words: Vec<&str> = text.split_ascii_whitespace().collect();
        match words.as_slice() {
            ["status"] => Ok(Request::Status { json: false }),
            ["status", "json"] => Ok(Request::Status { json: true }),
            ["metrics"] => Ok(Request::Metrics),
            ["workers", n] => {
                // A sign is required: `workers 3` could mean "to 3" as well as "by 3".
                let delta = n
                    .parse::<i32>()
                    .ok()
                    .filter(|d| n.starts_with(['+', '-']) && (-1024..=1024).contains(d))
                    .ok_or_else(|| format!("workers {n:?}: expected +N or -N, with N from 0 to 1024"))?;
                Ok(Request::Workers(delta))
            }
            ["reload"] => Ok(Request::Reload),
            ["upgrade"] => Ok(Request::Upgrade),
            ["upgrade-status", p] => p
                .parse()
                .map(Request::UpgradeStatus)
                .map_err(|_| format!("upgrade-status {p:?}: expected a pid")),
            ["reload-status", g] => g
                .parse()
                .map(Request::ReloadStatus)
                .map_err(|_| format!("reload-status {g:?}: expected a generation number")),
            [] => Err("empty request (expected status, status json, metrics, workers +N|-N)".into()),
            _ => Err(format!(
                "unknown request {:?} (expected status, status json, metrics, workers +N|-N)",
                text.trim()
            )),
        }
    }
}

/// The master's answer: the text to print, or an error message.
pub(crate) type Reply = Result<String, String>;

/// Encodes a reply for the wire.
fn encode(reply: Reply) -> Vec<u8> {
    match reply {
        Ok(body) => {
            let mut out = Vec::with_capacity(body.len() + 3);
            out.extend_from_slice(b"OK\n");
            out.extend_from_slice(body.as_bytes());
            out
        }
        // One line, whatever the message holds.
        Err(msg) => format!("ERR {}\n", msg.replace(['\r', '\n'], " ")).into_bytes(),
    }
}

/// Who sent a control request: the peer's credentials (`SO_PEERCRED`, as the kernel
/// recorded them when the client connected), when they can be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) pid: i32,
    pub(crate) uid: u32,
}

impl Peer {
    /// The credentials of the client at the other end of `socket`.
    fn of(socket: &Socket) -> Option<Peer> {
        getsockopt(socket, sockopt::PeerCredentials).ok().map(|c| Peer {
            pid: c.pid(),
            uid: c.uid(),
        })
    }
}

/// The control protocol's decision on the bytes received so far.
fn decide_line(input: &[u8], eof: bool, answer: &mut dyn FnMut(Request) -> Reply) -> Decision {
    let head = &input[..input.len().min(MAX_REQUEST)];
    let line = match head.iter().position(|&b| b == b'\n') {
        Some(end) => &head[..end],
        None if input.len() >= MAX_REQUEST => {
            return Decision::Reply(encode(Err(format!(
                "request too long (at most {MAX_REQUEST} bytes)"
            ))));
        }
        None if eof && !input.is_empty() => input,
        None if eof => return Decision::Close,
        None => return Decision::Wait,
    };
    let reply = match Request::parse(line) {
        Ok(request) => answer(request),
        Err(e) => Err(e),
    };
    Decision::Reply(encode(reply))
}

/// Refusals of the current episode.
#[derive(Debug)]
struct Refusals {
    uid: u32,
    last: Instant,
    count: u64,
}

/// The control socket, owned by the master.
#[derive(Debug)]
pub(crate) struct Control {
    acceptor: Acceptor,
    path: PathBuf,
    /// The (device, inode) of the socket file we created, so that `remove_file` removes
    /// ours and never one that another instance created since.
    file_id: (u64, u64),
    /// The uids allowed to use the socket: root and the master's.
    allowed: [u32; 2],
    refusals: Option<Refusals>,
}

impl Control {
    /// Binds the control socket at `path` (mode 0600; a stale socket is replaced; a missing
    /// parent directory is created with mode 0700). Only root and `owner_uid` may use it.
    pub(crate) fn bind(path: &Path, owner_uid: u32) -> Result<Control, Error> {
        // Absolute, so that `remove_file` still finds it after a daemon's `chdir /`.
        let path = &std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        let what = format!("control socket {}", path.display());
        let err = |source: io::Error| Error::Bind {
            addr: what.clone(),
            source,
        };
        prepare_dir(path, owner_uid).map_err(err)?;
        crate::net::listener::remove_stale_socket(path).map_err(err)?;
        // socket2 creates sockets with SOCK_CLOEXEC.
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(err)?;
        socket.bind(&SockAddr::unix(path).map_err(err)?).map_err(err)?;
        let listening = (|| {
            // Before listen(): until then every connection attempt is refused, so nobody
            // can connect while the file still has the umask's mode.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            socket.listen(BACKLOG)?;
            socket.set_nonblocking(true)?;
            std::fs::symlink_metadata(path)
        })();
        let meta = match listening {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(err(e));
            }
        };
        Ok(Control {
            acceptor: Acceptor::new(
                socket,
                MAX_REQUEST,
                b"ERR busy: too many control connections\n",
                what,
            ),
            path: path.to_owned(),
            file_id: (meta.dev(), meta.ino()),
            allowed: [0, owner_uid],
            refusals: None,
        })
    }

    /// Takes over a control socket inherited from a previous master (binary upgrade): the
    /// same listening socket and file, so clients never find it missing.
    pub(crate) fn adopt(socket: Socket, path: &Path, owner_uid: u32) -> Result<Control, Error> {
        let what = format!("control socket {}", path.display());
        let err = |source: io::Error| Error::Bind {
            addr: what.clone(),
            source,
        };
        socket.set_nonblocking(true).map_err(err)?;
        let meta = std::fs::symlink_metadata(path).map_err(err)?;
        Ok(Control {
            acceptor: Acceptor::new(
                socket,
                MAX_REQUEST,
                b"ERR busy: too many control connections\n",
                what,
            ),
            path: path.to_owned(),
            file_id: (meta.dev(), meta.ino()),
            allowed: [0, owner_uid],
            refusals: None,
        })
    }

    /// The listening socket, for a new master on upgrade.
    pub(crate) fn listener(&self) -> &Socket {
        self.acceptor.listener()
    }

    /// The listener (POLLIN) and each connection (POLLIN or POLLOUT), for the master's
    /// `poll`.
    pub(crate) fn poll_fds(&self) -> Vec<PollFd<'_>> {
        self.acceptor.poll_fds()
    }

    /// Accepts connections until `EAGAIN`, reads what they sent, answers complete
    /// requests with `answer`, writes what the sockets take, closes finished and expired
    /// connections. Never blocks.
    #[cfg(test)]
    pub(crate) fn service(&mut self, answer: &mut dyn FnMut(Request) -> Reply) {
        self.service_peers(&mut |req, _| answer(req));
    }

    /// As `service`, `answer` being given who sent each request too (none if the
    /// credentials cannot be read).
    pub(crate) fn service_peers(&mut self, answer: &mut dyn FnMut(Request, Option<Peer>) -> Reply) {
        let Control {
            acceptor,
            path,
            allowed,
            refusals,
            ..
        } = self;
        acceptor.service_sockets(
            &mut |socket| admit(socket, *allowed, refusals, path),
            &mut |socket, input, eof| decide_line(input, eof, &mut |req| answer(req, Peer::of(socket))),
        );
    }

    /// The earliest time at which `service` has a connection to expire.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.acceptor.next_deadline()
    }

    /// The descriptors of the socket and its connections, for workers to close after fork
    /// (all are close-on-exec as well).
    pub(crate) fn raw_fds(&self) -> Vec<RawFd> {
        self.acceptor.raw_fds()
    }

    /// Removes the socket file, if the path still names the one this master created.
    pub(crate) fn remove_file(&self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.file_id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Checks a new connection's peer: only the allowed uids may talk to the master (a worker
/// runs as another user, so a compromised worker cannot stop or resize the pool).
fn admit(
    socket: &Socket,
    allowed: [u32; 2],
    refusals: &mut Option<Refusals>,
    path: &Path,
) -> Result<(), Vec<u8>> {
    let (uid, pid) = match getsockopt(socket, sockopt::PeerCredentials) {
        Ok(c) if allowed.contains(&c.uid()) => return Ok(()),
        Ok(c) => (Some(c.uid()), c.pid()),
        Err(_) => (None, 0),
    };
    let now = Instant::now();
    let uid_key = uid.unwrap_or(u32::MAX);
    match refusals {
        Some(r) if r.uid == uid_key && now.duration_since(r.last) < REFUSAL_EPISODE => {
            r.last = now;
            r.count += 1;
            tracing::debug!(
                "control socket {}: refused another connection from uid {uid_key} (pid {pid}), {} in a row",
                path.display(),
                r.count
            );
        }
        _ => {
            let who = match uid {
                Some(u) => format!("uid {u} (pid {pid})"),
                None => "a peer whose credentials cannot be read".to_owned(),
            };
            tracing::warn!(
                "control socket {}: refused a connection from {who}: only root and uid {} may use it \
                 (further refusals from it within {REFUSAL_EPISODE:?} are not logged)",
                path.display(),
                allowed[1]
            );
            *refusals = Some(Refusals {
                uid: uid_key,
                last: now,
                count: 1,
            });
        }
    }
    Err(b"ERR permission denied\n".to_vec())
}

/// Creates the socket's directory if it is missing (mode 0700), and refuses a directory in
/// which another user could replace the socket: world-writable without the sticky bit,
/// or owned by someone other than root and the master's user.
fn prepare_dir(path: &Path, owner_uid: u32) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let meta = std::fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{} is not a directory", dir.display()),
        ));
    }
    let mode = meta.mode();
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the directory {} is writable by every user (mode {:o}): anyone could replace the socket",
                dir.display(),
                mode & 0o7777
            ),
        ));
    }
    if meta.uid() != 0 && meta.uid() != owner_uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the directory {} belongs to uid {}, neither root nor the server's uid {owner_uid}",
                dir.display(),
                meta.uid()
            ),
        ));
    }
    Ok(())
}

/// The default control socket: `/run/NAME/ctl.sock` as root, `$XDG_RUNTIME_DIR/NAME.sock`
/// otherwise (`None` when that variable is unset). [`Control::bind`] creates `/run/NAME`
/// with mode 0700 when it is missing.
pub(crate) fn default_path(name: &str) -> Option<PathBuf> {
    if nix::unistd::Uid::effective().is_root() {
        Some(Path::new("/run").join(name).join("ctl.sock"))
    } else {
        std::env::var_os("XDG_RUNTIME_DIR")
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(&d).join(format!("{name}.sock")))
    }
}

/// The control socket of the server whose pid file is `pid_file`: the default socket for
/// the default pid file (`/run/NAME.pid` → `/run/NAME/ctl.sock`, `$XDG_RUNTIME_DIR/NAME.pid`
/// → `$XDG_RUNTIME_DIR/NAME.sock`), and for any other pid file the file beside it with the
/// extension `.sock` (`/run/hello-b.pid` → `/run/hello-b.sock`). So two instances with
/// pid files of their own have control sockets of their own, and a subcommand given either
/// the pid file or the socket finds the other (issue 34).
pub(crate) fn path_for_pid_file(name: &str, pid_file: &Path) -> PathBuf {
    let default_pid = crate::process::daemon::default_pid_file(name);
    if default_pid.as_deref() == Some(pid_file) {
        if let Some(p) = default_path(name) {
            return p;
        }
    }
    pid_file.with_extension("sock")
}

pub(crate) use crate::process::daemon::StopFacts;

/// What `stop` needs to know, read from a `status --json` document.
fn stop_facts_from_json(doc: &serde_json::Value) -> Option<StopFacts> {
    let secs = |key: &str| doc[key].as_f64().map(Duration::from_secs_f64);
    let (mut connections, mut requests) = (0, 0);
    for w in doc["workers"].as_array()? {
        let e = &w["event"];
        if e.is_object() {
            connections += e["open"].as_u64().unwrap_or(0);
            requests += e["requests_in_flight"]
                .as_u64()
                .unwrap_or(0)
                .max(e["handling"].as_u64().unwrap_or(0))
                + e["writing"].as_u64().unwrap_or(0);
        } else {
            // A blocking worker holds one connection while it is not idle; it serves a
            // request while it handles it or writes its answer.
            let state = w["state"].as_str().unwrap_or("");
            if !matches!(state, "idle" | "starting" | "free") {
                connections += 1;
            }
            if matches!(state, "handling" | "writing") {
                requests += 1;
            }
        }
    }
    // Hybrid fronts hold the connections waiting for a worker.
    connections += doc["hybrid"]["held"].as_u64().unwrap_or(0);
    Some(StopFacts {
        pid: i32::try_from(doc["master_pid"].as_u64()?).ok()?,
        grace_period: secs("grace_period_seconds")?,
        drain_delay: secs("drain_delay_seconds")?,
        connections,
        requests,
    })
}

/// Asks the server at the control socket `path` what `stop` needs to know: `None` when
/// no server answers there (or an older one that does not say its grace period).
pub(crate) fn stop_facts(path: &Path) -> Option<StopFacts> {
    stop_facts_from_json(&status_document(path)?)
}

/// The `status --json` document of the server answering on the control socket `path`, if
/// one does.
fn status_document(path: &Path) -> Option<serde_json::Value> {
    match exchange(path, &Request::Status { json: true }) {
        Outcome::Ok(body) => serde_json::from_slice(&body).ok(),
        _ => None,
    }
}

/// A server that answers on a control socket, as `check` needs to know it: its pid and
/// the labels of its listeners (the addresses it holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunningServer {
    pub(crate) pid: i32,
    pub(crate) listeners: Vec<String>,
}

/// The server answering on the control socket `path`, if one does.
pub(crate) fn running_server(path: &Path) -> Option<RunningServer> {
    let doc = status_document(path)?;
    Some(RunningServer {
        pid: i32::try_from(doc["master_pid"].as_u64()?).ok()?,
        listeners: doc["listeners"]
            .as_array()?
            .iter()
            .filter_map(|l| l["addr"].as_str().map(str::to_owned))
            .collect(),
    })
}

/// What the client got.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// `OK`: the body.
    Ok(Vec<u8>),
    /// `ERR`: the message.
    Err(String),
    /// No server at the path: no socket file (`stale`: false), or a socket file nobody
    /// listens on (true: left by a server that did not stop cleanly).
    NotRunning { stale: bool },
    /// The socket's permissions kept us out.
    NoPermission(String),
    /// Anything else.
    Failed(String),
}

/// Sends `request` to the socket at `path` and reads the whole reply, with timeouts.
fn exchange(path: &Path, request: &Request) -> Outcome {
    let fail = |what: &str, e: io::Error| match e.kind() {
        io::ErrorKind::NotFound => Outcome::NotRunning { stale: false },
        io::ErrorKind::ConnectionRefused => Outcome::NotRunning { stale: true },
        io::ErrorKind::PermissionDenied => Outcome::NoPermission(format!("{what}: {e}")),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            Outcome::Failed(format!("{what}: no answer within {CLIENT_TIMEOUT:?}"))
        }
        _ => Outcome::Failed(format!("{what}: {e}")),
    };
    let shown = path.display();
    let connected = (|| {
        let addr = SockAddr::unix(path)?;
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
        socket.set_read_timeout(Some(CLIENT_TIMEOUT))?;
        // A Unix connect blocks only while the server's backlog is full, for at most the
        // send timeout (then EAGAIN).
        socket.set_write_timeout(Some(CLIENT_TIMEOUT))?;
        socket.connect(&addr)?;
        Ok(socket)
    })();
    let mut socket = match connected {
        Ok(s) => s,
        Err(e) => return fail(&format!("connecting to the control socket {shown}"), e),
    };
    // A write error is not the end: a server that refuses us writes its reason and closes
    // before reading our request, so read what it said.
    let sent = socket.write_all(format!("{}\n", request.line()).as_bytes());
    let mut reply = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let received = loop {
        match socket.read(&mut chunk) {
            Ok(0) => break Ok(()),
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A server that closed with our request unread resets the connection after
            // its reply: the reply is complete.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && !reply.is_empty() => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    if let Some(body) = reply.strip_prefix(b"OK\n") {
        if let Err(e) = received {
            return fail(&format!("reading the reply from {shown}"), e);
        }
        return Outcome::Ok(body.to_vec());
    }
    if let Some(msg) = reply.strip_prefix(b"ERR ") {
        let msg = String::from_utf8_lossy(msg).trim_end().to_owned();
        return Outcome::Err(msg);
    }
    match (sent, received) {
        (Err(e), _) => fail(&format!("sending the request to {shown}"), e),
        (_, Err(e)) => fail(&format!("reading the reply from {shown}"), e),
        _ if reply.is_empty() => Outcome::Failed(format!(
            "{shown}: the server closed the connection without an answer"
        )),
        _ => Outcome::Failed(format!(
            "{shown}: unexpected answer {:?}",
            String::from_utf8_lossy(&reply[..reply.len().min(80)])
        )),
    }
}

/// The client side, for the `status`, `metrics` and `workers` subcommands: sends `request`
/// to the control socket at `path` and prints the reply. Returns the exit status (0, or
/// 3 "not running" as LSB's `status` action, 1 for other errors, 4 without permission).
/// The `reload` subcommand: starts a reload, then waits until the new generation serves
/// alone (every worker of the old one has finished its connection and left), up to
/// `timeout`. Exit status: 0 done; 1 when the reload failed (the old generation keeps
/// serving; the reason is printed) or did not finish in time; 3 not running; 4 no
/// permission.
pub(crate) fn reload_command(name: &str, path: &Path, timeout: std::time::Duration) -> i32 {
    let generation = match exchange(path, &Request::Reload) {
        Outcome::Ok(body) => {
            let text = String::from_utf8_lossy(&body);
            match text.split_whitespace().last().and_then(|g| g.parse::<u32>().ok()) {
                Some(g) => g,
                None => {
                    errln!("error: unexpected reply to reload: {text:?}");
                    return 1;
                }
            }
        }
        other => return client_exit(name, path, other),
    };
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match exchange(path, &Request::ReloadStatus(generation)) {
            Outcome::Ok(body) if body.starts_with(b"done") => {
                outln!("{name}: reloaded (generation {generation})");
                return 0;
            }
            Outcome::Ok(_) => {}
            other => return client_exit(name, path, other),
        }
        if std::time::Instant::now() >= deadline {
            errln!("error: {name}: generation {generation} not serving alone after {timeout:?}");
            return 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The `upgrade` subcommand: starts an upgrade, then waits until the new master serves
/// (its readiness reached the old master, which drains) or the upgrade fails, up to
/// `timeout`. Exit status: 0 done; 1 failed (the old master keeps serving; the reason is
/// printed) or not done in time; 3 not running; 4 no permission.
pub(crate) fn upgrade_command(name: &str, path: &Path, timeout: std::time::Duration) -> i32 {
    let pid = match exchange(path, &Request::Upgrade) {
        Outcome::Ok(body) => {
            let text = String::from_utf8_lossy(&body);
            match text.split_whitespace().last().and_then(|p| p.parse::<i32>().ok()) {
                Some(p) => p,
                None => {
                    errln!("error: unexpected reply to upgrade: {text:?}");
                    return 1;
                }
            }
        }
        other => return client_exit(name, path, other),
    };
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match exchange(path, &Request::UpgradeStatus(pid)) {
            Outcome::Ok(body) if body.starts_with(b"done") => {
                outln!("{name}: upgraded (new master pid {pid})");
                return 0;
            }
            Outcome::Ok(_) => {}
            // Between the old master closing its copy of the control socket and the new
            // one answering, the socket may refuse for a moment, or a connection in
            // progress may be cut: ask again (a failed upgrade is an ERR reply).
            Outcome::NotRunning { .. } | Outcome::Failed(_) => {}
            other => return client_exit(name, path, other),
        }
        if std::time::Instant::now() >= deadline {
            errln!("error: {name}: the new master (pid {pid}) is not serving after {timeout:?}");
            return 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The exit status and message of a failed exchange.
fn client_exit(name: &str, path: &Path, outcome: Outcome) -> i32 {
    match outcome {
        Outcome::Ok(_) => 0,
        other => {
            let code = client_command_outcome(name, path, other);
            if code == 0 { 1 } else { code }
        }
    }
}

/// What a client subcommand says when no server answers at `path`: what it looked for,
/// and where a server would be found.
fn not_running(name: &str, path: &Path, stale: bool) -> String {
    let shown = path.display();
    let found = match stale {
        true => format!(
            "nothing listens on the control socket {shown} (a socket file left by a server that did not stop cleanly)"
        ),
        false => format!("no control socket at {shown}"),
    };
    let hint = match default_path(name).as_deref() == Some(path) {
        true => {
            " (the default path: a server has it when started with `start` or run with --pid-file; one run with --control PATH is asked with the same --control PATH; a foreground run without either has no control socket)"
        }
        false => " (the path given with --control)",
    };
    let elsewhere = crate::process::daemon::running_elsewhere(name, "this control socket");
    format!("{name}: not running: {found}{hint}{elsewhere}")
}

pub(crate) fn client_command(name: &str, path: &Path, request: Request) -> i32 {
    let outcome = exchange(path, &request);
    client_command_outcome(name, path, outcome)
}

/// The `metrics` subcommand: [`client_command`] for `metrics`, its reply printed in
/// `format` (the server always answers 0.0.4; OpenMetrics is re-framed here, so this
/// works against servers that predate the option).
pub(crate) fn metrics_command(name: &str, path: &Path, format: MetricsFormat) -> i32 {
    let outcome = match exchange(path, &Request::Metrics) {
        Outcome::Ok(body) if format == MetricsFormat::OpenMetrics => {
            Outcome::Ok(render::to_openmetrics(&String::from_utf8_lossy(&body)).into_bytes())
        }
        other => other,
    };
    client_command_outcome(name, path, outcome)
}

/// The `health` subcommand, for scripts: what `/readyz` answers, through the control
/// socket. Prints `ready`, or `not ready: WHY`; exits 0 when ready, 1 when the server
/// runs but is not ready (starting, stopping or draining for a drain delay, no live
/// worker), 3 when it is not running, 4 without permission.
pub(crate) fn health_command(name: &str, path: &Path) -> i32 {
    let outcome = match exchange(path, &Request::Status { json: true }) {
        Outcome::Ok(body) => match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(v) if v["ready"] == serde_json::Value::Bool(true) => {
                outln!("{name}: ready");
                return 0;
            }
            Ok(v) if v["ready"] == serde_json::Value::Bool(false) => {
                outln!(
                    "{name}: not ready: {}",
                    v["not_ready"].as_str().unwrap_or("unknown")
                );
                return 1;
            }
            // A server older than the readiness field, or a reply that is not JSON.
            Ok(_) => Outcome::Failed(format!("{name}: the server's status has no readiness")),
            Err(e) => Outcome::Failed(format!("{name}: the server's status is not JSON: {e}")),
        },
        other => other,
    };
    client_command_outcome(name, path, outcome)
}

fn client_command_outcome(name: &str, path: &Path, outcome: Outcome) -> i32 {
    match outcome {
        Outcome::Ok(body) => {
            let mut out = io::stdout().lock();
            let mut printed = out.write_all(&body);
            if !body.is_empty() && !body.ends_with(b"\n") {
                printed = printed.and_then(|()| out.write_all(b"\n"));
            }
            let printed = printed.and_then(|()| out.flush());
            // A closed pipe (`| head`) is not the server's failure.
            match printed {
                Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
                    errln!("error: writing the reply: {e}");
                    1
                }
                _ => 0,
            }
        }
        Outcome::NotRunning { stale } => {
            outln!("{}", not_running(name, path, stale));
            3
        }
        Outcome::Err(msg) if msg == "permission denied" => {
            errln!(
                "error: {name}: permission denied by the server at {} \
                 (only root and the server's user may use it)",
                path.display()
            );
            4
        }
        Outcome::NoPermission(msg) => {
            errln!("error: {msg}");
            4
        }
        Outcome::Err(msg) => {
            errln!("error: {name}: {msg}");
            1
        }
        Outcome::Failed(msg) => {
            errln!("error: {msg}");
            1
        }
    }
}

#[cfg(test)]
mod tests;

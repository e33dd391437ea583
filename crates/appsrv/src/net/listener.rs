//! Listen addresses and the listening sockets the master binds before it forks.
//!
//! Grammar of a listen address (the `-l/--listen` flag, [`Server::listen`](crate::Server::listen)):
//!
//! ```text
//! HOST:PORT          127.0.0.1:7000, localhost:7000 (every address the name resolves to)
//! [V6]:PORT          [::1]:7000, [::]:7000 (IPV6_V6ONLY is set, so [::] and 0.0.0.0 coexist)
//! unix:PATH          unix:/run/hello.sock
//! udp://HOST:PORT    udp://127.0.0.1:5353, udp://[::1]:5353, udp://0.0.0.0:53: a datagram
//!                    listener, served by a DatagramHandler (Server::datagrams)
//! unixgram:PATH      unixgram:/run/hello.dgram: a Unix datagram socket
//! ADDR?OPT=V&OPT=V   per-listener options:
//!                      backlog=N   this listener's backlog (default: --backlog)
//!                      mode=0660   permissions of a Unix socket's file (default: umask)
//!                      allow=CIDR  serve only these clients here (repeatable; adds to --allow)
//!                      deny=CIDR   close connections from these clients (repeatable; adds
//!                                  to --deny; deny wins over allow)
//!                      proxy       connections start with a PROXY protocol v1/v2 header
//!                      tls         TLS listener (certificate from --tls-cert/--tls-key)
//!                      cert=PATH   this listener's certificate chain (PEM; implies tls)
//!                      key=PATH    this listener's private key (PEM; implies tls)
//!                      client-ca=PATH  require client certificates signed by these CAs
//!                                  (PEM; implies tls; default: --tls-client-ca)
//! ```
//!
//! A datagram listener takes `mode=`, `allow=` and `deny=` (a denied datagram is dropped
//! and counted, never answered); `backlog`, `proxy` and the TLS options are for streams.
//! A wildcard datagram listener (`udp://0.0.0.0:53`, `udp://[::]:53`) answers from the
//! address each datagram came to (`IP_PKTINFO`, `IPV6_RECVPKTINFO`), as clients expect.
//!
//! Port 0 asks the kernel for a free port; the bound address (with the real port) is logged
//! as `listening on ADDR` and reported by [`Addr`]'s `Display`.

use std::fmt;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::error::Error;
use crate::net::proxy::Cidr;

/// The address of one end of a connection, or of a listener.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Addr {
    /// An IPv4 or IPv6 address and port.
    Inet(SocketAddr),
    /// A Unix-domain socket, with its path when it has one (clients usually have none).
    Unix(Option<PathBuf>),
}

impl Addr {
    /// The IP address, for TCP connections.
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        match self {
            Addr::Inet(a) => Some(a.ip()),
            Addr::Unix(_) => None,
        }
    }

    pub(crate) fn from_sockaddr(sa: &SockAddr) -> Addr {
        match sa.as_socket() {
            Some(inet) => Addr::Inet(inet),
            None => Addr::Unix(sa.as_pathname().map(Path::to_path_buf)),
        }
    }
}

impl fmt::Display for Addr {
    /// `127.0.0.1:7000`, `[::1]:7000`, `unix:/run/x.sock`, or `unix:` for an unnamed peer.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Inet(a) => write!(f, "{a}"),
            Addr::Unix(Some(p)) => write!(f, "unix:{}", p.display()),
            Addr::Unix(None) => f.write_str("unix:"),
        }
    }
}

/// What a listen address names, before it is bound.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    /// `host:port`, resolved when bound.
    Inet(String),
    /// A filesystem path.
    Unix(PathBuf),
    /// `udp://host:port`, resolved when bound.
    Udp(String),
    /// `unixgram:PATH`.
    UnixDgram(PathBuf),
}

/// Whether a listener takes connections (TCP, Unix stream) or datagrams (UDP, Unix
/// datagram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Stream,
    Datagram,
}

/// A parsed listen address with its per-listener options; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    text: String,
    endpoint: Endpoint,
    backlog: Option<u32>,
    mode: Option<u32>,
    proxy: bool,
    allow: Vec<Cidr>,
    deny: Vec<Cidr>,
    tls: Option<TlsOptions>,
}

/// A listen address's own TLS options (`tls`, `cert=`, `key=`, `client-ca=`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct TlsOptions {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
}

/// The command line's TLS settings, which a TLS listener's own options override.
#[derive(Debug, Clone)]
pub(crate) struct TlsDefaults {
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
    pub(crate) client_ca: Option<PathBuf>,
    pub(crate) alpn: Vec<Vec<u8>>,
    /// `--tls-ticket-lifetime`, seconds.
    pub(crate) ticket_lifetime: u32,
}

impl Default for TlsDefaults {
    fn default() -> Self {
        TlsDefaults {
            cert: None,
            key: None,
            client_ca: None,
            alpn: Vec::new(),
            ticket_lifetime: crate::net::tls::DEFAULT_TICKET_LIFETIME,
        }
    }
}

impl ListenAddr {
    /// Whether this is a TLS listener.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Whether it takes connections or datagrams.
    pub(crate) fn kind(&self) -> Kind {
        if self.is_datagram() {
            Kind::Datagram
        } else {
            Kind::Stream
        }
    }

    /// Where this listener's TLS material comes from (`None` for a plain listener), or why
    /// it has none.
    pub(crate) fn tls_source(
        &self,
        defaults: &TlsDefaults,
    ) -> Result<Option<crate::net::tls::Source>, Error> {
        let Some(own) = &self.tls else { return Ok(None) };
        let cert = own.cert.clone().or_else(|| defaults.cert.clone());
        let key = own.key.clone().or_else(|| defaults.key.clone());
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(crate::net::tls::Source {
                cert: absolute(cert),
                key: absolute(key),
                client_ca: own
                    .client_ca
                    .clone()
                    .or_else(|| defaults.client_ca.clone())
                    .map(absolute),
                alpn: defaults.alpn.clone(),
                ticket_lifetime: defaults.ticket_lifetime,
            })),
            (None, _) => Err(Error::Config(format!(
                "{self} is a TLS listener without a certificate: give --tls-cert PATH (or cert=PATH)"
            ))),
            (_, None) => Err(Error::Config(format!(
                "{self} is a TLS listener without a private key: give --tls-key PATH (or key=PATH)"
            ))),
        }
    }

    /// The same address with a Unix socket's path made absolute (a daemon changes to `/`
    /// after binding, and removes the file at stop).
    pub(crate) fn absolute(mut self) -> Self {
        match &self.endpoint {
            Endpoint::Unix(path) => {
                if let Ok(abs) = std::path::absolute(path) {
                    self.endpoint = Endpoint::Unix(abs);
                }
            }
            Endpoint::UnixDgram(path) => {
                if let Ok(abs) = std::path::absolute(path) {
                    self.endpoint = Endpoint::UnixDgram(abs);
                }
            }
            _ => {}
        }
        self
    }

    /// Whether this is a datagram listener (`udp://`, `unixgram:`).
    pub fn is_datagram(&self) -> bool {
        matches!(self.endpoint, Endpoint::Udp(_) | Endpoint::UnixDgram(_))
    }

    /// The address as it was written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether it has per-listener options that change who is served or how (`proxy`,
    /// `allow=`, `deny=`, `tls`).
    pub(crate) fn has_options(&self) -> bool {
        self.proxy || !self.allow.is_empty() || !self.deny.is_empty() || self.tls.is_some()
    }

    /// Whether a socket bound at `local` is one this address names (for sockets passed by
    /// systemd, which come without the index of the address they serve). A TCP address
    /// is resolved again; port 0 names no socket, since its real port is unknown.
    pub(crate) fn names(&self, kind: Kind, local: &Addr) -> bool {
        if self.kind() != kind {
            return false;
        }
        match (&self.endpoint, local) {
            (Endpoint::Unix(path) | Endpoint::UnixDgram(path), Addr::Unix(Some(p))) => path == p,
            (Endpoint::Inet(hostport) | Endpoint::Udp(hostport), Addr::Inet(a)) => hostport
                .to_socket_addrs()
                .map(|mut all| all.any(|r| r.port() != 0 && r.ip() == a.ip() && r.port() == a.port()))
                .unwrap_or(false),
            _ => false,
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for ListenAddr {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let bad = |reason: String| Error::ListenAddr {
            addr: text.to_owned(),
            reason,
        };
        let (addr, opts) = match text.split_once('?') {
            Some((a, o)) => (a, Some(o)),
            None => (text, None),
        };
        let mut parsed = ListenAddr {
            text: text.to_owned(),
            endpoint: parse_endpoint(addr).map_err(bad)?,
            backlog: None,
            mode: None,
            proxy: false,
            allow: Vec::new(),
            deny: Vec::new(),
            tls: None,
        };
        for opt in opts.into_iter().flat_map(|o| o.split('&')) {
            let (key, value) = opt.split_once('=').unwrap_or((opt, ""));
            parsed.apply_option(key, value).map_err(bad)?;
        }
        parsed.check_datagram_options().map_err(bad)?;
        Ok(parsed)
    }
}

/// The address part of a listen address (before any `?`): a Unix stream or datagram
/// path, a UDP address, or a TCP `HOST:PORT`. Only the syntax is checked here: names are
/// resolved when the listener is bound. The error is the reason, for `Error::ListenAddr`.
fn parse_endpoint(addr: &str) -> Result<Endpoint, String> {
    if let Some(path) = addr.strip_prefix("unix:") {
        if path.is_empty() {
            return Err("a Unix socket needs a path, as unix:/run/NAME.sock".into());
        }
        Ok(Endpoint::Unix(PathBuf::from(path)))
    } else if let Some(path) = addr.strip_prefix("unixgram:") {
        if path.is_empty() {
            return Err("a Unix datagram socket needs a path, as unixgram:/run/NAME.dgram".into());
        }
        Ok(Endpoint::UnixDgram(PathBuf::from(path)))
    } else {
        let (udp, addr) = match addr.strip_prefix("udp://") {
            Some(rest) => (true, rest),
            None => (false, addr),
        };
        if addr.contains("://") {
            return Err("unknown scheme (known: udp://HOST:PORT; TCP is plain HOST:PORT)".into());
        }
        let Some((host, port)) = addr.rsplit_once(':') else {
            return Err(
                "expected HOST:PORT, [IPV6]:PORT, unix:PATH, udp://HOST:PORT or unixgram:PATH".into(),
            );
        };
        if host.is_empty() {
            return Err("missing host (use 0.0.0.0:PORT or [::]:PORT for any)".into());
        }
        if port.parse::<u16>().is_err() {
            return Err(format!("{port:?} is not a port number (0 to 65535)"));
        }
        if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
            return Err("write IPv6 addresses in brackets, as [::1]:7000".into());
        }
        if udp {
            Ok(Endpoint::Udp(addr.to_owned()))
        } else {
            Ok(Endpoint::Inet(addr.to_owned()))
        }
    }
}

impl ListenAddr {
    /// One `KEY=VALUE` (or bare `KEY`) option after the `?`, applied to the address parsed
    /// so far. The error is the reason, for `Error::ListenAddr`.
    fn apply_option(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "proxy" if value.is_empty() => self.proxy = true,
            "tls" if value.is_empty() => {
                self.tls.get_or_insert_with(TlsOptions::default);
            }
            "cert" | "key" | "client-ca" => {
                if value.is_empty() {
                    return Err(format!("{key}= needs a file's path"));
                }
                let tls = self.tls.get_or_insert_with(TlsOptions::default);
                let path = Some(PathBuf::from(value));
                match key {
                    "cert" => tls.cert = path,
                    "key" => tls.key = path,
                    _ => tls.client_ca = path,
                }
            }
            "allow" | "deny" => {
                let cidr: Cidr = value
                    .parse()
                    .map_err(|e: crate::net::proxy::CidrError| e.to_string())?;
                if key == "allow" {
                    self.allow.push(cidr);
                } else {
                    self.deny.push(cidr);
                }
            }
            "backlog" => {
                let n = value.parse::<u32>().ok().filter(|n| *n > 0);
                self.backlog =
                    Some(n.ok_or_else(|| format!("backlog={value:?}: expected a positive number"))?);
            }
            "mode" => {
                if !matches!(self.endpoint, Endpoint::Unix(_) | Endpoint::UnixDgram(_)) {
                    return Err("mode= applies to unix: and unixgram: listeners only".into());
                }
                let m = u32::from_str_radix(value, 8).ok().filter(|m| *m <= 0o777);
                self.mode = Some(
                    m.ok_or_else(|| format!("mode={value:?}: expected octal permissions such as 0660"))?,
                );
            }
            _ => {
                return Err(format!(
                    "unknown option {key:?} (known: backlog, mode, proxy, allow, deny, tls, cert, key, client-ca)"
                ));
            }
        }
        Ok(())
    }

    /// A datagram listener refuses the stream-only options (they would be silently
    /// meaningless on it). The error is the reason, for `Error::ListenAddr`.
    fn check_datagram_options(&self) -> Result<(), String> {
        if self.is_datagram() {
            let stream_only = [
                (self.backlog.is_some(), "backlog"),
                (self.proxy, "proxy"),
                (self.tls.is_some(), "tls"),
            ];
            if let Some((_, opt)) = stream_only.iter().find(|(set, _)| *set) {
                return Err(format!(
                    "{opt} applies to stream listeners only (a datagram listener takes mode, allow and deny)"
                ));
            }
        }
        Ok(())
    }
}

/// A path made absolute (a daemon changes to `/`; reload re-reads by path).
fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

/// The configuration error of a server with both kinds of listeners that does not run the
/// event loop, naming its datagram listener `label` (checked on `--listen` before start, and
/// again on the sockets systemd passes).
pub(crate) fn mixed_needs_event_loop(label: &str, io: &str) -> Error {
    Error::Config(format!(
        "{label}: datagrams are served from the event loop, beside the stream connections only with --io event (this server runs --io {io}): drop --io {io}, or give --io event"
    ))
}

/// Which clients a listener serves: allow/deny rules by network (deny wins; any allow
/// makes the default deny), and whether connections start with a PROXY protocol header.
#[derive(Debug, Clone, Default)]
pub(crate) struct Policy {
    pub(crate) allow: Vec<Cidr>,
    pub(crate) deny: Vec<Cidr>,
    /// Connections start with a PROXY protocol header...
    pub(crate) proxy: bool,
    /// ... accepted only from these sources.
    pub(crate) proxy_from: Vec<Cidr>,
}

impl Policy {
    /// Whether a client at `ip` may be served. A Unix-socket peer has no address: the
    /// rules do not apply to it (file permissions do).
    pub(crate) fn permits(&self, ip: Option<std::net::IpAddr>) -> bool {
        let Some(ip) = ip else { return true };
        if self.deny.iter().any(|c| c.contains(ip)) {
            return false;
        }
        self.allow.is_empty() || self.allow.iter().any(|c| c.contains(ip))
    }

    /// This policy with a listen address's own options added.
    pub(crate) fn with(&self, addr: &ListenAddr) -> Policy {
        let mut p = self.clone();
        p.allow.extend(addr.allow.iter().copied());
        p.deny.extend(addr.deny.iter().copied());
        p.proxy |= addr.proxy;
        p
    }
}

/// Socket options applied to every listener, inherited by the connections it accepts.
#[derive(Debug, Clone)]
pub(crate) struct BindOptions {
    pub(crate) backlog: u32,
    pub(crate) read_timeout: Option<Duration>,
    pub(crate) write_timeout: Option<Duration>,
}

/// A bound, listening socket.
#[derive(Debug)]
pub(crate) struct Listener {
    socket: Socket,
    local: Addr,
    /// Connections or datagrams.
    kind: Kind,
    /// For a Unix socket: the (device, inode) of the file we created, so that a clean stop
    /// removes our socket file and never one that another instance created since.
    unix_file: Option<(u64, u64)>,
    /// Timeouts to set on each accepted connection, for listeners whose connections do not
    /// inherit them (Unix sockets; TCP connections copy them from the listener).
    per_connection: Option<(Option<Duration>, Option<Duration>)>,
    /// Which clients it serves, and whether they come through a PROXY-protocol balancer.
    policy: Policy,
    /// The index of the `--listen` address it was bound for, if known: an upgrade hands
    /// it to the new master with the socket, so that per-listener options follow the
    /// socket even when a host name resolved to several addresses.
    origin: Option<usize>,
}

impl Listener {
    /// The bound address (with the real port when port 0 was asked).
    pub(crate) fn local_addr(&self) -> &Addr {
        &self.local
    }

    /// Whether it takes connections or datagrams.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// Whether it is a datagram listener.
    pub(crate) fn is_datagram(&self) -> bool {
        self.kind == Kind::Datagram
    }

    /// Whether its datagrams must say where they were sent to: a UDP socket bound to a
    /// wildcard address, whose answers must leave from that address.
    pub(crate) fn wants_destination(&self) -> bool {
        self.kind == Kind::Datagram && matches!(&self.local, Addr::Inet(a) if a.ip().is_unspecified())
    }

    /// The bound address as a listen address names it: `127.0.0.1:7000`, `unix:/run/x.sock`,
    /// `udp://127.0.0.1:5353`, `unixgram:/run/x.dgram` (the log's `listening on`, status).
    pub(crate) fn label(&self) -> String {
        match (self.kind, &self.local) {
            (Kind::Stream, local) => local.to_string(),
            (Kind::Datagram, Addr::Inet(a)) => format!("udp://{a}"),
            (Kind::Datagram, Addr::Unix(Some(p))) => format!("unixgram:{}", p.display()),
            (Kind::Datagram, Addr::Unix(None)) => "unixgram:".to_owned(),
        }
    }

    pub(crate) fn socket(&self) -> &Socket {
        &self.socket
    }

    /// The index of the `--listen` address this listener was bound for, if known.
    pub(crate) fn origin(&self) -> Option<usize> {
        self.origin
    }

    /// Records which `--listen` address this listener serves.
    pub(crate) fn set_origin(&mut self, origin: Option<usize>) {
        self.origin = origin;
    }

    /// Which clients this listener serves.
    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Sets which clients this listener serves.
    pub(crate) fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    /// Applies to a freshly accepted connection the options it did not inherit.
    pub(crate) fn prepare(&self, conn: &Socket) -> io::Result<()> {
        if let Some((read, write)) = self.per_connection {
            conn.set_read_timeout(read)?;
            conn.set_write_timeout(write)?;
        }
        Ok(())
    }

    /// Stops the listening socket for every process that shares it (master and workers):
    /// new connection attempts are refused at once and workers blocked in `accept` wake
    /// up with `EINVAL`. Connections still waiting in a TCP backlog are reset by the
    /// kernel; on a Unix socket they stay queued, unserved, until the last copy of the
    /// socket is closed, and are reset then. Closing the master's copy alone would not do that: the socket lives on in
    /// each worker until every copy is closed.
    pub(crate) fn shutdown(&self) {
        // A datagram socket is left alone: the stopping workers read and answer what it
        // holds (their stop signal tells them to stop), and a socket shut for writing
        // would refuse those answers (EPIPE); shut for reading, it would stay readable,
        // with nothing to read, for every worker's level-triggered wait.
        if self.kind == Kind::Datagram {
            return;
        }
        // ENOTCONN and the like only mean there was nothing to shut down.
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }

    /// Removes a Unix socket's file if it is still the one this listener created.
    pub(crate) fn remove_file(&self) {
        if let (Addr::Unix(Some(path)), Some(id)) = (&self.local, self.unix_file) {
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                if (meta.dev(), meta.ino()) == id {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// The backlog to ask for: `requested`, clamped to the kernel's `somaxconn` (the kernel
/// would clamp silently; doing it here makes the logged figure the real one).
pub(crate) fn effective_backlog(requested: u32) -> u32 {
    match crate::sys::somaxconn() {
        Some(max) if max > 0 => requested.min(max),
        _ => requested,
    }
}

/// Takes over a listening socket inherited from an old master or from systemd: the same
/// socket, so connections waiting in its backlog are kept. The options this server sets on
/// its own listeners are set again (they may have changed with the configuration).
pub(crate) fn adopt(socket: Socket, opts: &BindOptions) -> Result<Listener, Error> {
    let what = |source: io::Error| Error::Bind {
        addr: "an inherited listener".into(),
        source,
    };
    // A datagram socket is recognised by its type, and is never listening.
    let kind = if socket.r#type().map_err(what)? == Type::DGRAM {
        Kind::Datagram
    } else if socket.is_listener().map_err(what)? {
        Kind::Stream
    } else {
        return Err(what(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the socket is neither listening nor a datagram socket",
        )));
    };
    let local = Addr::from_sockaddr(&socket.local_addr().map_err(what)?);
    let err = |source: io::Error| Error::Bind {
        addr: local.to_string(),
        source,
    };
    if kind == Kind::Datagram {
        let unix_file = match &local {
            Addr::Inet(a) => {
                set_datagram_options(&socket, a).map_err(err)?;
                None
            }
            Addr::Unix(path) => path
                .as_deref()
                .and_then(|p| std::fs::symlink_metadata(p).ok())
                .map(|m| (m.dev(), m.ino())),
        };
        socket.set_nonblocking(true).map_err(err)?;
        return Ok(Listener {
            socket,
            local,
            kind,
            unix_file,
            per_connection: None,
            policy: Policy::default(),
            origin: None,
        });
    }
    let (unix_file, per_connection) = match &local {
        Addr::Inet(_) => {
            socket.set_tcp_nodelay(true).map_err(err)?;
            set_timeouts(&socket, opts).map_err(err)?;
            (None, None)
        }
        Addr::Unix(path) => {
            let id = path
                .as_deref()
                .and_then(|p| std::fs::symlink_metadata(p).ok())
                .map(|m| (m.dev(), m.ino()));
            let timeouts = (opts.read_timeout.is_some() || opts.write_timeout.is_some())
                .then_some((opts.read_timeout, opts.write_timeout));
            (id, timeouts)
        }
    };
    Ok(Listener {
        socket,
        local,
        kind: Kind::Stream,
        unix_file,
        per_connection,
        policy: Policy::default(),
        origin: None,
    })
}

/// Binds every address `addr` names (a host name may resolve to several).
/// The labels ([`Listener::label`]) the listeners of `addr` get once bound: host names
/// resolved (empty when they do not resolve). `check` compares them with a running
/// server's, to tell an address that server holds from one another program holds.
pub(crate) fn labels_of(addr: &ListenAddr) -> Vec<String> {
    match &addr.endpoint {
        Endpoint::Inet(hostport) => hostport
            .to_socket_addrs()
            .map(|a| a.map(|sa| sa.to_string()).collect())
            .unwrap_or_default(),
        Endpoint::Udp(hostport) => hostport
            .to_socket_addrs()
            .map(|a| a.map(|sa| format!("udp://{sa}")).collect())
            .unwrap_or_default(),
        Endpoint::Unix(path) => vec![format!("unix:{}", path.display())],
        Endpoint::UnixDgram(path) => vec![format!("unixgram:{}", path.display())],
    }
}

pub(crate) fn bind(addr: &ListenAddr, opts: &BindOptions) -> Result<Vec<Listener>, Error> {
    let backlog = effective_backlog(addr.backlog.unwrap_or(opts.backlog));
    let err = |source: io::Error| Error::Bind {
        addr: addr.text.clone(),
        source,
    };
    match &addr.endpoint {
        Endpoint::Inet(hostport) | Endpoint::Udp(hostport) => {
            let udp = matches!(addr.endpoint, Endpoint::Udp(_));
            let resolved: Vec<SocketAddr> = hostport.to_socket_addrs().map_err(err)?.collect();
            if resolved.is_empty() {
                return Err(err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "the host name has no address",
                )));
            }
            resolved
                .into_iter()
                .map(|sa| {
                    let bound = if udp {
                        bind_udp(sa)
                    } else {
                        bind_inet(sa, backlog, opts)
                    };
                    bound.map_err(|source| Error::Bind {
                        addr: if hostport.parse::<SocketAddr>().is_ok() {
                            addr.text.clone()
                        } else {
                            format!("{} ({sa})", addr.text)
                        },
                        source,
                    })
                })
                .collect()
        }
        Endpoint::Unix(path) => Ok(vec![bind_unix(path, addr.mode, backlog, opts).map_err(err)?]),
        Endpoint::UnixDgram(path) => Ok(vec![bind_unixgram(path, addr.mode).map_err(err)?]),
    }
}

/// A UDP socket, non-blocking (the workers' loops read it until `EAGAIN`), with the
/// destination address of each datagram reported when bound to a wildcard address.
fn bind_udp(sa: SocketAddr) -> io::Result<Listener> {
    let socket = Socket::new(Domain::for_address(sa), Type::DGRAM, Some(Protocol::UDP))?;
    if sa.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&sa.into())?;
    let local = socket
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("bound socket has no inet address"))?;
    set_datagram_options(&socket, &local)?;
    socket.set_nonblocking(true)?;
    Ok(Listener {
        socket,
        local: Addr::Inet(local),
        kind: Kind::Datagram,
        unix_file: None,
        per_connection: None,
        policy: Policy::default(),
        origin: None,
    })
}

/// On a wildcard UDP socket, asks for each datagram's destination address, which its
/// answer is sent from (a client drops an answer from another address than it asked).
fn set_datagram_options(socket: &Socket, local: &SocketAddr) -> io::Result<()> {
    if local.ip().is_unspecified() {
        crate::sys::set_recv_pktinfo(socket.as_fd(), local.is_ipv6())?;
    }
    Ok(())
}

fn bind_unixgram(path: &Path, mode: Option<u32>) -> io::Result<Listener> {
    remove_if_stale(path, Kind::Datagram)?;
    let socket = Socket::new(Domain::UNIX, Type::DGRAM, None)?;
    socket.bind(&SockAddr::unix(path)?)?;
    if let Some(mode) = mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    socket.set_nonblocking(true)?;
    let meta = std::fs::symlink_metadata(path)?;
    Ok(Listener {
        socket,
        local: Addr::Unix(Some(path.to_path_buf())),
        kind: Kind::Datagram,
        unix_file: Some((meta.dev(), meta.ino())),
        per_connection: None,
        policy: Policy::default(),
        origin: None,
    })
}

fn bind_inet(sa: SocketAddr, backlog: u32, opts: &BindOptions) -> io::Result<Listener> {
    // socket2 creates every socket with SOCK_CLOEXEC.
    let socket = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if sa.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&sa.into())?;
    socket.listen(backlog_int(backlog))?;
    // Set once here, inherited by every accepted connection (Linux copies these options
    // from the listener; tests/core.rs checks it), so accepting costs no setsockopt.
    // Nagle's algorithm only delays the responses that the client buffer already batches.
    socket.set_tcp_nodelay(true)?;
    set_timeouts(&socket, opts)?;
    let local = socket
        .local_addr()?
        .as_socket()
        .map(Addr::Inet)
        .ok_or_else(|| io::Error::other("bound socket has no inet address"))?;
    Ok(Listener {
        socket,
        local,
        kind: Kind::Stream,
        unix_file: None,
        per_connection: None,
        policy: Policy::default(),
        origin: None,
    })
}

fn bind_unix(path: &Path, mode: Option<u32>, backlog: u32, opts: &BindOptions) -> io::Result<Listener> {
    remove_stale_socket(path)?;
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    socket.bind(&SockAddr::unix(path)?)?;
    // Before listen(), so that no client can connect while the file has the umask's mode.
    if let Some(mode) = mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    socket.listen(backlog_int(backlog))?;
    let meta = std::fs::symlink_metadata(path)?;
    // Unlike TCP, an accepted Unix connection starts with default timeouts: they are set
    // on each connection (tests/core.rs checks both kinds).
    let per_connection = (opts.read_timeout.is_some() || opts.write_timeout.is_some())
        .then_some((opts.read_timeout, opts.write_timeout));
    Ok(Listener {
        socket,
        local: Addr::Unix(Some(path.to_path_buf())),
        kind: Kind::Stream,
        unix_file: Some((meta.dev(), meta.ino())),
        per_connection,
        policy: Policy::default(),
        origin: None,
    })
}

/// A socket file left by a server that died is removed; one that a live server still
/// accepts on is an "address in use" error, as for TCP; anything else is left alone. Used
/// for Unix listeners and for the control socket.
pub(crate) fn remove_stale_socket(path: &Path) -> io::Result<()> {
    remove_if_stale(path, Kind::Stream)
}

/// As [`remove_stale_socket`], for a socket file of `kind`: a live stream socket accepts a
/// connection, a live datagram socket one connected to (a dead one refuses either,
/// `ECONNREFUSED`).
fn remove_if_stale(path: &Path, kind: Kind) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the path exists and is not a socket",
        ));
    }
    let probe = match kind {
        Kind::Stream => std::os::unix::net::UnixStream::connect(path).map(drop),
        Kind::Datagram => std::os::unix::net::UnixDatagram::unbound()?.connect(path),
    };
    match probe {
        Ok(()) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            match kind {
                Kind::Stream => "another process is accepting connections on this socket",
                Kind::Datagram => "another process is bound to this datagram socket",
            },
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path),
        Err(e) => Err(e),
    }
}

fn set_timeouts(socket: &Socket, opts: &BindOptions) -> io::Result<()> {
    socket.set_read_timeout(opts.read_timeout)?;
    socket.set_write_timeout(opts.write_timeout)
}

fn backlog_int(backlog: u32) -> i32 {
    i32::try_from(backlog).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ListenAddr, Error> {
        s.parse()
    }

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(
            parse("127.0.0.1:7000").unwrap().endpoint,
            Endpoint::Inet("127.0.0.1:7000".into())
        );
        assert_eq!(
            parse("[::1]:0").unwrap().endpoint,
            Endpoint::Inet("[::1]:0".into())
        );
        assert_eq!(
            parse("localhost:80").unwrap().endpoint,
            Endpoint::Inet("localhost:80".into())
        );
        let u = parse("unix:/run/x.sock?mode=0660&backlog=64").unwrap();
        assert_eq!(u.endpoint, Endpoint::Unix("/run/x.sock".into()));
        assert_eq!(u.mode, Some(0o660));
        assert_eq!(u.backlog, Some(64));
        assert_eq!(u.to_string(), "unix:/run/x.sock?mode=0660&backlog=64");
    }

    #[test]
    fn rejects_bad_addresses_with_a_reason() {
        for (text, needle) in [
            ("7000", "expected HOST:PORT"),
            (":7000", "missing host"),
            ("127.0.0.1:70000", "not a port"),
            ("::1:7000", "brackets"),
            ("unix:", "needs a path"),
            ("127.0.0.1:1?mode=0600", "unixgram: listeners only"),
            ("unix:/x?mode=999", "octal"),
            ("unix:/x?backlog=0", "positive"),
            ("unix:/x?tsl", "unknown option"),
            ("127.0.0.1:1?tls&cert=", "needs a file's path"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
            assert!(e.contains(text), "error names the address: {e}");
        }
    }

    #[test]
    fn a_tls_listener_takes_its_own_files_before_the_command_line_ones() {
        let defaults = TlsDefaults {
            cert: Some("/etc/a/cert.pem".into()),
            key: Some("/etc/a/key.pem".into()),
            client_ca: None,
            alpn: vec![b"x".to_vec()],
            ticket_lifetime: 600,
        };
        assert_eq!(parse("127.0.0.1:1").unwrap().tls_source(&defaults).unwrap(), None);
        let plain = parse("127.0.0.1:1?tls")
            .unwrap()
            .tls_source(&defaults)
            .unwrap()
            .unwrap();
        assert_eq!(plain.cert, PathBuf::from("/etc/a/cert.pem"));
        assert_eq!(plain.alpn, vec![b"x".to_vec()]);
        assert_eq!(plain.ticket_lifetime, 600);
        let own = parse("127.0.0.1:1?cert=/etc/b/c.pem&client-ca=/etc/b/ca.pem")
            .unwrap()
            .tls_source(&defaults)
            .unwrap()
            .unwrap();
        assert_eq!(
            own.cert,
            PathBuf::from("/etc/b/c.pem"),
            "cert= implies tls and wins"
        );
        assert_eq!(own.key, PathBuf::from("/etc/a/key.pem"));
        assert_eq!(own.client_ca, Some(PathBuf::from("/etc/b/ca.pem")));
        let e = parse("127.0.0.1:1?tls")
            .unwrap()
            .tls_source(&TlsDefaults::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("without a certificate"), "{e}");
    }

    #[test]
    fn backlog_is_clamped_to_somaxconn() {
        if let Some(max) = crate::sys::somaxconn() {
            assert_eq!(effective_backlog(u32::MAX), max);
            assert_eq!(effective_backlog(1), 1);
        }
    }

    #[test]
    fn an_address_names_the_sockets_it_binds() {
        let inet = |s: &str| Addr::Inet(s.parse().unwrap());
        let a = parse("127.0.0.1:7000?deny=10.0.0.0/8").unwrap();
        assert!(a.has_options());
        assert!(a.names(Kind::Stream, &inet("127.0.0.1:7000")));
        assert!(!a.names(Kind::Stream, &inet("127.0.0.1:7001")));
        assert!(!a.names(Kind::Stream, &inet("127.0.0.2:7000")));
        // Port 0 names no socket: its real port is not known from the address.
        assert!(
            !parse("127.0.0.1:0")
                .unwrap()
                .names(Kind::Stream, &inet("127.0.0.1:41234"))
        );
        let u = parse("unix:/run/x.sock").unwrap();
        assert!(!u.has_options());
        assert!(u.names(Kind::Stream, &Addr::Unix(Some("/run/x.sock".into()))));
        assert!(!u.names(Kind::Stream, &Addr::Unix(Some("/run/y.sock".into()))));
        assert!(!u.names(Kind::Stream, &inet("127.0.0.1:7000")));
        // A datagram address names datagram sockets only (systemd may pass a TCP and a
        // UDP socket on the same port).
        let d = parse("udp://127.0.0.1:5353").unwrap();
        assert!(d.names(Kind::Datagram, &inet("127.0.0.1:5353")));
        assert!(!d.names(Kind::Stream, &inet("127.0.0.1:5353")));
        assert!(!a.names(Kind::Datagram, &inet("127.0.0.1:7000")));
    }

    #[test]
    fn issue_19_parses_datagram_addresses() {
        let d = parse("udp://127.0.0.1:5353").unwrap();
        assert!(d.is_datagram());
        assert_eq!(d.endpoint, Endpoint::Udp("127.0.0.1:5353".into()));
        assert_eq!(
            parse("udp://[::1]:53").unwrap().endpoint,
            Endpoint::Udp("[::1]:53".into())
        );
        let g = parse("unixgram:/run/x.dgram?mode=0660&deny=10.0.0.0/8").unwrap();
        assert_eq!(g.endpoint, Endpoint::UnixDgram("/run/x.dgram".into()));
        assert_eq!(g.mode, Some(0o660));
        assert!(!parse("127.0.0.1:53").unwrap().is_datagram());
        for (bad, why) in [
            ("udp://127.0.0.1:5353?backlog=5", "stream listeners only"),
            ("udp://127.0.0.1:5353?proxy", "stream listeners only"),
            ("udp://127.0.0.1:5353?tls", "stream listeners only"),
            ("udp://:53", "missing host"),
            ("udp://[::1]:x", "not a port"),
            ("unixgram:", "needs a path"),
            ("tcp://127.0.0.1:53", "unknown scheme"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn issue_19_binds_udp_and_unixgram_sockets() {
        let opts = BindOptions {
            backlog: 16,
            read_timeout: None,
            write_timeout: None,
        };
        let l = bind(&parse("udp://127.0.0.1:0").unwrap(), &opts)
            .unwrap()
            .remove(0);
        assert!(l.is_datagram());
        assert!(l.label().starts_with("udp://127.0.0.1:"), "{}", l.label());
        assert_eq!(l.socket().r#type().unwrap(), Type::DGRAM);
        // Adopted (a hand-over, systemd) by its type, without listen().
        let copy = l.socket().try_clone().unwrap();
        let adopted = adopt(copy, &opts).unwrap();
        assert!(adopted.is_datagram());
        assert_eq!(adopted.local_addr(), l.local_addr());
        let dir = std::env::temp_dir().join(format!("appsrv-unixgram-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.dgram");
        let spec = format!("unixgram:{}", path.display());
        let g = bind(&parse(&spec).unwrap(), &opts).unwrap().remove(0);
        assert_eq!(g.label(), spec);
        // A second bind while the first is alive is "in use", not a silent takeover.
        let e = bind(&parse(&spec).unwrap(), &opts).unwrap_err().to_string();
        assert!(e.contains("another process"), "{e}");
        drop(g);
        // Once the first is gone its file is stale and is replaced.
        let g = bind(&parse(&spec).unwrap(), &opts).unwrap().remove(0);
        g.remove_file();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

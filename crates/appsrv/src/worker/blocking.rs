//! The blocking connection loop: one connection at a time, from accept to close.
//!
//! Kept apart from the worker's set-up so that other loops (an event loop that multiplexes
//! many connections per process) can share everything else.

use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::time::Duration;

use crate::conn::client::{Buffers, Client, SendWatch};
use crate::net::listener::{Addr, Listener};
use crate::scoreboard::{Board, Slot, State};

use super::access::{AccessLog, Outcome};
use crate::sys::{self, exit};
use crate::worker::serve::Connections;
use std::path::Path;

use super::Recycle;
use super::guard::Guard;

use super::accept::{Accepted, Acceptor};

/// What the blocking loop needs from the system before the worker may say it is ready:
/// its scoreboard slot and its way of waiting for connections (an epoll instance with
/// several listeners). Made before `Ready` is sent, so that a failure here is a start
/// failure (reported with its reason, counted by the back-off), not a ready worker's exit.
#[derive(Debug)]
pub(crate) struct Prepared<'a> {
    slot: &'a Slot,
    acceptor: Acceptor<'a>,
}

/// Prepares worker `id` to serve `listeners` (see [`Prepared`]).
pub(crate) fn prepare<'a>(
    id: u32,
    listeners: &'a [Listener],
    board: &'a Board,
) -> Result<Prepared<'a>, String> {
    let slot = board.slot(id).ok_or_else(|| format!("no scoreboard slot {id}"))?;
    let acceptor =
        Acceptor::new(id, listeners, board).map_err(|e| format!("cannot wait for connections: {e}"))?;
    Ok(Prepared { slot, acceptor })
}

/// Serves connections until a stop; returns the worker's exit status. `reopen_log` runs
/// between connections after a USR1.
#[allow(clippy::too_many_arguments)] // the worker's whole context, passed once
pub(crate) fn serve<C: Connections>(
    id: u32,
    prepared: Prepared<'_>,
    listeners: &[Listener],
    board: &'static Board,
    keepalive_timeout: Option<Duration>,
    recycle: Recycle,
    handler: &mut C,
    access: Option<(&Path, AccessLog)>,
    max_per_ip: Option<usize>,
    tls: &crate::net::tls::ForWorker,
    limits: super::ConnLimits,
    reopen_log: &mut dyn FnMut(),
    retire: &mut dyn FnMut(),
) -> i32 {
    let (access_path, access) = match access {
        Some((p, log)) => (Some(p), Some(log)),
        None => (None, None),
    };
    let Prepared { slot, mut acceptor } = prepared;
    let mut guard = Guard {
        id,
        listeners,
        board,
        slot,
        keepalive_timeout,
        recycle,
        request: None,
        requests: 0,
        access,
        peer: None,
        head: Vec::new(),
    };
    let mut retire_sent = false;
    let mut refusals = Episodes::default();
    let mut denials = Episodes::default();
    let mut proxy_errors = Episodes::default();
    let mut tls_errors = Episodes::default();
    let mut buffers = Some(Buffers::new());
    let mut reopen = |guard: &mut Guard<'_>| {
        reopen_log();
        if let (Some(log), Some(path)) = (guard.access.as_mut(), access_path) {
            log.reopen(path);
        }
    };
    loop {
        // Lines are written before the worker may wait: a quiet server holds none back.
        if let Some(log) = guard.access.as_mut() {
            log.flush();
        }
        let (socket, peer, index) = match acceptor.accept() {
            Accepted::Connection(s, p, i) => (s, p, i),
            Accepted::Stop => return exit::OK,
            Accepted::Reopen => {
                reopen(&mut guard);
                continue;
            }
        };
        slot.forget_peer();
        if sys::take_reopen_request() {
            reopen(&mut guard);
        }
        let peer = Addr::from_sockaddr(&peer);
        let policy = listeners[index].policy();
        let mut client = Client::new(socket, peer, buffers.take().unwrap_or_else(Buffers::new));
        if limits.min_send_rate > 0 {
            client.watch_sends(SendWatch::new(limits.min_send_rate, limits.write_timeout));
        }
        // Behind a balancer, the client is the one its PROXY header names: read it first,
        // so that the rules, the cap, the scoreboard, the logs and the handler all see it.
        if policy.proxy {
            if let Err(why) = read_proxy_header(&mut client, &policy.proxy_from, limits.header_timeout) {
                if proxy_errors.note(
                    client
                        .peer_addr()
                        .ip()
                        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
                ) {
                    tracing::warn!("closing a connection from {}: {why}", client.peer_addr());
                }
                let (_, bufs) = client.finish();
                buffers = Some(bufs);
                continue;
            }
        }
        let peer = client.peer_addr();
        if !policy.permits(peer.ip()) {
            // Closed at once, before any handler code; logged once per episode.
            if let Some(ip) = peer.ip() {
                if denials.note(ip) {
                    tracing::info!("denied connections from {ip} (--allow/--deny)");
                }
            }
            slot.denied();
            let _ = client.close();
            let (_, bufs) = client.finish();
            buffers = Some(bufs);
            continue;
        }
        tracing::debug!("serving {peer}");
        slot.connection(&peer);
        if let Some(config) = tls.acceptor(index) {
            if let Err(e) = client.accept_tls(config.clone(), tls.handshake_timeout) {
                // A plain-text client, a scanner, an expired client certificate: one line
                // per episode, then the next connection.
                if tls_errors.note(peer.ip().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into())) {
                    tracing::warn!("TLS handshake with {peer} failed: {e}");
                }
                slot.tls_failed();
                let _ = client.close();
                let (_, bufs) = client.finish();
                buffers = Some(bufs);
                continue;
            }
        }
        if let (Some(cap), Some(ip)) = (max_per_ip, peer.ip()) {
            if board.connections_from(ip) > cap {
                if refusals.note(ip) {
                    tracing::warn!(
                        "refusing connections from {ip}: more than {cap} at once (--max-conns-per-ip)"
                    );
                }
                slot.refused();
                handler.refuse(&mut client, "too many connections from your address");
                let (_, bufs) = client.finish();
                buffers = Some(bufs);
                continue;
            }
        }
        // The request-level loop times each request; for `handle_client` the connection is
        // the unit (its clock covers the whole connection).
        let connection_clock = (!handler.request_level()).then(|| {
            client.show_reads(board, id);
            board.set_state(id, State::Handling);
            slot.request_start(&[])
        });
        if guard.access.is_some() {
            guard.peer = Some(peer.to_string());
        }
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| handler.serve(&mut client, &mut guard)));
        let peer = client.peer_addr();
        let (received, sent) = client.traffic();
        slot.add_bytes(received, sent);
        if let Some(started) = connection_clock {
            slot.request_end(started, false);
            if let (Some(log), Ok(result)) = (guard.access.as_mut(), outcome.as_ref()) {
                let took =
                    std::time::Duration::from_nanos(crate::scoreboard::now_ns().saturating_sub(started));
                let how = match result {
                    Ok(()) => Outcome::Ok,
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => Outcome::Timeout,
                    Err(_) => Outcome::Closed,
                };
                log.line(
                    guard.peer.as_deref().unwrap_or_default(),
                    how,
                    took,
                    (received, sent),
                    b"",
                );
            }
        }
        // A request still in progress when the connection ended (a bad request, a client
        // that left or timed out half way): close its clock, so that the next connection
        // does not inherit it (the request timeout would kill an innocent worker), and log
        // it with how it ended.
        if let Some(started) = guard.request.take() {
            slot.request_end(started, false);
            if let (Some(log), Some(p)) = (guard.access.as_mut(), guard.peer.as_deref()) {
                let took =
                    std::time::Duration::from_nanos(crate::scoreboard::now_ns().saturating_sub(started));
                let how = match &outcome {
                    Ok(Err(e)) if e.kind() == io::ErrorKind::TimedOut => Outcome::Timeout,
                    Ok(Ok(())) => Outcome::Error, // answered with the codec's error reply
                    _ => Outcome::Closed,
                };
                log.line(p, how, took, (received, sent), &guard.head);
            }
        }
        match outcome {
            Ok(result) => {
                let (flushed, bufs) = client.finish();
                buffers = Some(bufs);
                if let Err(e) = result.and(flushed) {
                    log_connection_error(&peer, &e);
                }
            }
            Err(payload) => {
                tracing::error!(
                    "handler panicked while serving {peer}: {}; connection closed, \
                     this worker exits and is replaced",
                    super::panic_message(&payload)
                );
                // Close the connection now, then leave: the handler's state may be broken.
                drop(client);
                if let Some(log) = guard.access.as_mut() {
                    log.flush();
                }
                return exit::PANIC;
            }
        }
        if sys::stop_requested() {
            if let Some(log) = guard.access.as_mut() {
                log.flush();
            }
            return exit::OK;
        }
        if !retire_sent && guard.limit_reached() {
            // The master starts a replacement first, then asks this worker to stop: the
            // pool's capacity never dips. Meanwhile this worker goes on serving.
            tracing::info!("reached its recycling limit; asking the master for a replacement");
            retire();
            retire_sent = true;
        }
    }
}

/// Reads the PROXY protocol header at the start of a connection (in as many reads as it
/// takes) and makes the client it names the connection's peer. Refused from a source that
/// is not a trusted balancer, and when the header is malformed or does not come.
///
/// The whole header must arrive within `timeout` of the accept (`--header-timeout`): each
/// read waits no longer than what is left, so a header trickled a byte at a time cannot
/// hold the worker longer than that (issue 14). The connection's own read timeout applies
/// again afterwards.
fn read_proxy_header(
    client: &mut Client,
    trusted: &[crate::net::proxy::Cidr],
    timeout: Option<Duration>,
) -> Result<(), String> {
    if let Some(ip) = client.peer_addr().ip() {
        if !trusted.iter().any(|c| c.contains(ip)) {
            return Err(format!(
                "{ip} is not a trusted PROXY protocol source (--proxy-from)"
            ));
        }
    }
    let deadline = timeout.map(|t| (std::time::Instant::now() + t, t));
    // The socket's own timeout, read once if the header does not come in one read.
    let mut saved: Option<Option<Duration>> = None;
    let result = loop {
        match crate::net::proxy::parse(client.unconsumed_mut()) {
            Ok(crate::net::proxy::Parsed::Header { len, source }) => {
                client.consume_input(len);
                if let Some(source) = source {
                    client.set_peer(Addr::Inet(source));
                }
                break Ok(());
            }
            Ok(crate::net::proxy::Parsed::Incomplete) => {
                if let Some((at, limit)) = deadline {
                    let left = at.saturating_duration_since(std::time::Instant::now());
                    // Under a millisecond counts as none (the kernel would read a timeout
                    // under a microsecond as no timeout at all).
                    if left < Duration::from_millis(1) {
                        break Err(too_slow(limit));
                    }
                    let own = match saved {
                        Some(own) => own,
                        None => match client.read_timeout() {
                            Ok(own) => *saved.insert(own),
                            Err(e) => break Err(format!("reading its PROXY header: {e}")),
                        },
                    };
                    if let Err(e) = client.set_read_timeout(Some(own.map_or(left, |t| t.min(left)))) {
                        break Err(format!("reading its PROXY header: {e}"));
                    }
                }
                match client.read_more(crate::net::proxy::MAX_LEN, false) {
                    Ok(0) => break Err("closed before the end of its PROXY header".into()),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => match deadline {
                        Some((at, limit)) if std::time::Instant::now() >= at => break Err(too_slow(limit)),
                        _ => break Err(format!("reading its PROXY header: {e}")),
                    },
                    Err(e) => break Err(format!("reading its PROXY header: {e}")),
                }
            }
            Err(e) => break Err(e.to_string()),
        }
    };
    if let Some(own) = saved {
        if let Err(e) = client.set_read_timeout(own) {
            return Err(format!("restoring the read timeout after its PROXY header: {e}"));
        }
    }
    result
}

fn too_slow(limit: Duration) -> String {
    format!(
        "its PROXY header was not complete within {:?} (--header-timeout)",
        limit
    )
}

/// Logs a kind of event once per episode: again only after a minute without it.
#[derive(Debug, Default)]
struct Episodes {
    last: Option<(std::net::IpAddr, std::time::Instant)>,
}

impl Episodes {
    /// Whether this event for `ip` starts a new episode (and should be logged).
    fn note(&mut self, ip: std::net::IpAddr) -> bool {
        let now = std::time::Instant::now();
        let new = !matches!(self.last, Some((last, t)) if last == ip && now.duration_since(t) < Duration::from_secs(60));
        self.last = Some((ip, now));
        new
    }
}

fn log_connection_error(peer: &Addr, e: &io::Error) {
    match e.kind() {
        io::ErrorKind::TimedOut => tracing::info!("connection from {peer}: {e}"),
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::UnexpectedEof => tracing::debug!("connection from {peer} ended early: {e}"),
        _ => tracing::warn!("connection from {peer} ended with an error: {e}"),
    }
}

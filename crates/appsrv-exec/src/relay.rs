//! Connection mode (`--mode connection`): a command per connection, as inetd's `nowait`
//! services and tcpserver run them, with the worker in the middle.
//!
//! The worker keeps the client's connection and relays bytes between it and the command's
//! pipes, with `poll` over the socket, the three pipes and the command's pidfd. The writes
//! to the command are non-blocking, from a pending buffer of at most [`CHUNK`] bytes (the
//! client is not read while it is full), so a command that does not read cannot block the
//! relay, nor a client that does not read the command; the writes to the client go through
//! appsrv's [`Client`](appsrv::Client), with its write timeout and `--min-send-rate`. Because the worker
//! relays, it also terminates TLS, counts the bytes for the access log, applies
//! `--max-output`, and logs the command's standard error a line at a time.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};

use crate::command::{self, Running, Spec, StderrLines};

/// The largest piece relayed at once, and the most client input held for a command that
/// has not read it yet.
const CHUNK: usize = 64 * 1024;

/// Without a pidfd, how often the relay looks whether the command exited.
const EXIT_LOOK: Duration = Duration::from_millis(50);

/// The connection mode's settings.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// `--command-timeout`: the longest a command may run (`None`: no limit).
    pub(crate) command_timeout: Option<Duration>,
    /// `--max-output`: the most bytes of standard output sent to one client.
    pub(crate) max_output: Option<u64>,
}

/// The handler: one per worker, one command per connection.
#[derive(Debug)]
pub(crate) struct Relay {
    pub(crate) spec: Spec,
    pub(crate) limits: Limits,
}

impl appsrv::Handler for Relay {
    fn handle_client(&mut self, client: &mut appsrv::Client) -> io::Result<()> {
        let who = client.peer_addr().clone();
        let env = ucspi_env(client);
        let mut cmd = match Running::start(&self.spec, &env) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("{who}: cannot start {}: {e}", self.spec.program.display());
                return client.close();
            }
        };
        let relayed = relay(client, &mut cmd, &self.limits, &who);
        // Closed before the command is reaped: the client has its end of file while the
        // command's process is torn down.
        let closed = client.close();
        // Whatever was relayed is out; what is left of the command goes, its group with it.
        let grace = if cmd.has_exited() {
            Duration::ZERO
        } else {
            command::TERM_GRACE
        };
        let status = cmd.end(grace);
        command::reap_strays();
        tracing::debug!("{who}: command (pid {}) {status}", cmd.pid());
        let end = relayed?;
        if matches!(end, End::Cut) {
            return Ok(()); // an error closing a connection that a limit cut is expected
        }
        closed
    }
}

/// The UCSPI-TCP variables of `client`'s connection, as tcpserver sets them: `PROTO`
/// (`TCP`, or `UNIX` on a Unix-domain listener), `TCPLOCALIP`, `TCPLOCALPORT`,
/// `TCPREMOTEIP` and `TCPREMOTEPORT` (the client named by a PROXY header, when there is
/// one). A Unix-domain connection has the remote pair only when a PROXY header gave it.
pub(crate) fn ucspi_env(client: &appsrv::Client) -> Vec<(&'static str, String)> {
    let mut env = Vec::with_capacity(5);
    let local = client.local_addr().ok();
    match &local {
        Some(appsrv::Addr::Inet(a)) => {
            env.push(("PROTO", "TCP".to_owned()));
            env.push(("TCPLOCALIP", a.ip().to_string()));
            env.push(("TCPLOCALPORT", a.port().to_string()));
        }
        _ => env.push(("PROTO", "UNIX".to_owned())),
    }
    if let appsrv::Addr::Inet(a) = client.peer_addr() {
        env.push(("TCPREMOTEIP", a.ip().to_string()));
        env.push(("TCPREMOTEPORT", a.port().to_string()));
    }
    env
}

/// How the relay ended.
enum End {
    /// The command closed its output or exited: the normal end.
    Done,
    /// A limit ended it (logged already).
    Cut,
}

/// Relays until the command closes its standard output or exits (what it wrote is then
/// sent to the client), or a limit ends it. A client's error is returned (appsrv logs it);
/// the connection is left for the caller to close and the command to end.
fn relay(
    client: &mut appsrv::Client,
    cmd: &mut Running,
    limits: &Limits,
    who: &appsrv::Addr,
) -> io::Result<End> {
    let mut state = State {
        pending: Vec::with_capacity(CHUNK),
        client_open: true,
        stdin_gone: false,
        sent: 0,
        errors: StderrLines::default(),
        buf: vec![0u8; CHUNK],
        last_activity: Instant::now(),
    };
    // The read timeout, as an idle limit: the connection ends when neither side sent a
    // byte for this long.
    let idle = client.read_timeout()?;
    let command_deadline = limits.command_timeout.map(|t| cmd.started + t);
    let end = loop {
        // Client input that needs no wait: buffered by the client, or decrypted in TLS.
        if state.client_open && state.pending.len() < CHUNK && client.input_ready() {
            state.read_client(client, cmd)?;
            continue;
        }
        let now = Instant::now();
        if command_deadline.is_some_and(|d| now >= d) {
            tracing::warn!(
                "{who}: the command (pid {}) ran past --command-timeout {} s: ending it and its process group",
                cmd.pid(),
                limits.command_timeout.unwrap_or_default().as_secs_f64()
            );
            break End::Cut;
        }
        let idle_deadline = idle.map(|t| state.last_activity + t);
        if idle_deadline.is_some_and(|d| now >= d) {
            tracing::info!(
                "{who}: nothing from the client or the command for --read-timeout {} s: closing",
                idle.unwrap_or_default().as_secs_f64()
            );
            break End::Cut;
        }
        let mut until = [command_deadline, idle_deadline].into_iter().flatten().min();
        if cmd.exit_fd().is_none() {
            until = Some(until.map_or(now + EXIT_LOOK, |u| u.min(now + EXIT_LOOK)));
        }
        let timeout = until.map_or(nix::poll::PollTimeout::NONE, |u| command::poll_timeout(u - now));

        // What to wait for, in a fixed order: client, stdin, stdout, stderr, exit.
        let want_client = state.client_open && state.pending.len() < CHUNK;
        let want_stdin = !state.pending.is_empty() && cmd.stdin.is_some();
        let candidates = [
            want_client.then(|| (client.as_fd(), PollFlags::POLLIN)),
            cmd.stdin
                .as_ref()
                .filter(|_| want_stdin)
                .map(|fd| (fd.as_fd(), PollFlags::POLLOUT)),
            cmd.stdout.as_ref().map(|fd| (fd.as_fd(), PollFlags::POLLIN)),
            cmd.stderr.as_ref().map(|fd| (fd.as_fd(), PollFlags::POLLIN)),
            cmd.exit_fd().map(|fd| (fd, PollFlags::POLLIN)),
        ];
        let mut fds = Vec::with_capacity(5);
        let mut slots = [None; 5];
        for (slot, candidate) in candidates.into_iter().enumerate() {
            if let Some((fd, flags)) = candidate {
                slots[slot] = Some(fds.len());
                fds.push(PollFd::new(fd, flags));
            }
        }
        match nix::poll::poll(&mut fds, timeout) {
            // A stop signal: the connection goes on, within the grace period.
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let ready: [bool; 5] = std::array::from_fn(|i| {
            slots[i].is_some_and(|k| fds[k].revents().is_some_and(|r| !r.is_empty()))
        });
        drop(fds);

        if ready[3] {
            state.read_stderr(cmd, who);
        }
        if ready[1] {
            state.write_stdin(cmd);
        }
        if ready[2] {
            if let Some(end) = state.read_stdout(client, cmd, limits, who)? {
                break end;
            }
        }
        if ready[0] {
            state.read_client(client, cmd)?;
        }
        let exited = if cmd.exit_fd().is_some() {
            ready[4]
        } else {
            cmd.has_exited()
        };
        if exited {
            // What it wrote before it exited is in the pipe: relay it, without waiting for
            // an end of file that what it left in the background may hold off.
            break state.drain_stdout(client, cmd, limits, who)?;
        }
    };
    if let Some(fd) = cmd.stderr.take() {
        state.errors.drain(&fd, who);
    }
    state.errors.finish(who);
    Ok(end)
}

struct State {
    /// Client input not yet written to the command.
    pending: Vec<u8>,
    /// The client may still send (no end of file yet).
    client_open: bool,
    /// The command closed its standard input: what the client sends is dropped.
    stdin_gone: bool,
    /// Bytes of standard output sent to the client.
    sent: u64,
    errors: StderrLines,
    buf: Vec<u8>,
    last_activity: Instant,
}

impl State {
    fn read_client(&mut self, client: &mut appsrv::Client, cmd: &mut Running) -> io::Result<()> {
        let room = CHUNK - self.pending.len();
        let n = client.read(&mut self.buf[..room])?;
        if n == 0 {
            // Half-close: the command sees the end of its input once it has read the rest.
            self.client_open = false;
            if self.pending.is_empty() {
                cmd.stdin = None;
            }
            return Ok(());
        }
        self.last_activity = Instant::now();
        if !self.stdin_gone {
            self.pending.extend_from_slice(&self.buf[..n]);
            self.write_stdin(cmd);
        }
        Ok(())
    }

    /// Writes what is pending, as far as the pipe takes it without blocking.
    fn write_stdin(&mut self, cmd: &mut Running) {
        let Some(stdin) = &cmd.stdin else {
            self.pending.clear();
            return;
        };
        let mut written = 0;
        while written < self.pending.len() {
            match command::write_some(stdin, &self.pending[written..]) {
                Ok(Some(n)) => written += n,
                Ok(None) => break,
                Err(_) => {
                    // EPIPE: the command closed its input; the rest of the client's is
                    // dropped (the client is still read, to see it leave).
                    self.stdin_gone = true;
                    cmd.stdin = None;
                    self.pending.clear();
                    return;
                }
            }
        }
        self.pending.drain(..written);
        if self.pending.is_empty() && !self.client_open {
            cmd.stdin = None;
        }
    }

    fn read_stderr(&mut self, cmd: &mut Running, who: &appsrv::Addr) {
        if let Some(fd) = &cmd.stderr {
            if !self.errors.drain(fd, who) {
                cmd.stderr = None;
            }
        }
    }

    /// Reads standard output once and sends it on; `Some` when the relay is over (end of
    /// file, or past `--max-output`).
    fn read_stdout(
        &mut self,
        client: &mut appsrv::Client,
        cmd: &mut Running,
        limits: &Limits,
        who: &appsrv::Addr,
    ) -> io::Result<Option<End>> {
        let Some(fd) = &cmd.stdout else {
            return Ok(Some(End::Done));
        };
        let n = match command::read_some(fd, &mut self.buf) {
            Ok(Some(0)) | Err(_) => return Ok(Some(End::Done)),
            Ok(None) => return Ok(None),
            Ok(Some(n)) => n,
        };
        self.last_activity = Instant::now();
        self.send(client, n, limits, who)
    }

    /// Sends the first `n` bytes of the buffer to the client, up to `--max-output`.
    fn send(
        &mut self,
        client: &mut appsrv::Client,
        n: usize,
        limits: &Limits,
        who: &appsrv::Addr,
    ) -> io::Result<Option<End>> {
        if let Some(max) = limits.max_output {
            if self.sent + n as u64 > max {
                let allowed = (max - self.sent) as usize;
                client.write_all(&self.buf[..allowed])?;
                self.sent = max;
                tracing::warn!(
                    "{who}: the command's output passed --max-output {max} bytes: closing the connection"
                );
                return Ok(Some(End::Cut));
            }
        }
        client.write_all(&self.buf[..n])?;
        client.flush()?;
        self.sent += n as u64;
        Ok(None)
    }

    /// Relays what the command's output pipe holds, without waiting for more.
    fn drain_stdout(
        &mut self,
        client: &mut appsrv::Client,
        cmd: &mut Running,
        limits: &Limits,
        who: &appsrv::Addr,
    ) -> io::Result<End> {
        loop {
            let Some(fd) = &cmd.stdout else {
                return Ok(End::Done);
            };
            let n = match command::read_some(fd, &mut self.buf) {
                Ok(Some(0) | None) | Err(_) => return Ok(End::Done),
                Ok(Some(n)) => n,
            };
            if let Some(end) = self.send(client, n, limits, who)? {
                return Ok(end);
            }
        }
    }
}

//! Privilege separation: a small privileged helper beside each worker, so that no byte
//! from a client is parsed by a process that can do more than serve it.
//!
//! The application declares its privileged operations as a typed request and response
//! ([`Privileged`]) and registers the helper with
//! [`Server::privileged`](crate::Server::privileged). Each worker then has a helper of
//! its own: forked by the worker *before* it drops its privileges (as OpenSSH forks its
//! monitor per session), it keeps root, or only the [capabilities](Privileged::CAPABILITIES)
//! it names, and serves that one worker's calls. The worker, which reads the network, runs
//! as `--user` (or `nobody`), confined, and calls the helper through a handle:
//!
//! ```no_run
//! use appsrv::privileged::{Caller, Privileged};
//!
//! /// Opens a file as root, for one allowed path.
//! struct Opener;
//!
//! impl Privileged for Opener {
//!     type Request = String;
//!     type Response = Result<appsrv::privileged::Fd, String>;
//!     const CAPABILITIES: &'static [appsrv::privileged::Capability] =
//!         &[appsrv::privileged::Capability::CAP_DAC_READ_SEARCH];
//!
//!     fn handle(&mut self, path: String, _caller: &Caller) -> Self::Response {
//!         // Check again here: the worker's checks do not count.
//!         if path != "/etc/shadow" {
//!             return Err(format!("{path}: not allowed"));
//!         }
//!         let file = std::fs::File::open(&path).map_err(|e| e.to_string())?;
//!         Ok(std::os::fd::OwnedFd::from(file).into())
//!     }
//! }
//!
//! // In a handler (blocking model): one call.
//! fn read_shadow() -> Result<std::fs::File, appsrv::privileged::CallError> {
//!     let answer = appsrv::privileged::helper::<Opener>().call(&"/etc/shadow".to_owned())?;
//!     answer
//!         .map(|fd| std::fs::File::from(fd.into_inner()))
//!         .map_err(appsrv::privileged::CallError::Refused)
//! }
//!
//! struct Shadow;
//!
//! impl appsrv::Handler for Shadow {
//!     fn handle_client(&mut self, client: &mut appsrv::Client) -> std::io::Result<()> {
//!         let file = read_shadow()?;
//!         let len = file.metadata()?.len();
//!         std::io::Write::write_all(client, format!("{len} bytes\n").as_bytes())
//!     }
//! }
//!
//! fn main() {
//!     appsrv::server!("shadow")
//!         .listen("127.0.0.1:7010")
//!         .privileged(|| Ok(Opener))
//!         .run(|| Ok(Shadow))
//!         .unwrap_or_else(|e| e.exit());
//! }
//! ```
//!
//! # The model, and why
//!
//! One helper per worker, not one shared by all:
//! - a call blocks its worker until the helper answers, which is what a blocking worker
//!   does anyway; a shared helper would serialise every worker's calls (a `runas`
//!   command runs for seconds) or need threads or processes of its own;
//! - the channel identifies its caller: a socket pair made for one worker, before its
//!   privileges are dropped (`SO_PEERCRED` on a socket pair reports its creator's
//!   credentials from then, so it could not tell workers apart anyway), so the helper
//!   knows which worker calls, by construction ([`Caller`]);
//! - a helper's life follows its worker's: it ends when its worker's end of the channel
//!   closes, or at once if its worker dies (`PR_SET_PDEATHSIG`). If the helper dies while
//!   its worker waits for connections, the worker sees its channel hang up and stops at
//!   once; during a connection, the call in progress (or the next) fails with
//!   [`CallError::Gone`] and the worker stops after its connection. Either way the master
//!   replaces it with a new worker and a new helper, as for any worker that exits: the
//!   master's back-off applies.
//!
//! A helper costs a process per worker; forked from the worker before its factory runs,
//! it shares the worker's pages until either writes to them.
//!
//! # What the helper holds
//!
//! In the helper, right after its fork from the worker (still root, not yet chrooted or
//! sandboxed): every descriptor is closed but stdio and its end of the channel (no
//! listener, no client socket, no scoreboard); it becomes a child subreaper (what the
//! commands it starts leave behind becomes its child: see [`kill_leftovers`]); its
//! capability bounding set is cut to [`Privileged::CAPABILITIES`], which are then its only
//! effective and permitted capabilities (no inheritable, no ambient ones); with
//! `--sandbox` it sets `PR_SET_NO_NEW_PRIVS` and applies its own profile
//! ([`Server::privileged_sandbox`](crate::Server::privileged_sandbox)), which every
//! command it starts inherits. Then the helper factory runs, and the worker goes on with
//! its own privilege drop only once the helper reported ready (a factory that fails is a
//! start failure of the worker, with the reason).
//!
//! The helper never sees a client's bytes unless the application puts them in a request.
//!
//! # Calls
//!
//! [`Helper::call`] sends the request and waits for the response, at most the
//! [timeout](Helper::timeout) (default: 60 s, as `--request-timeout`); a response that
//! comes later is dropped. An async handler awaits [`Helper::call_async`] instead, which
//! waits on the worker's runtime (the worker serves its other connections meanwhile; its
//! calls take turns). Messages are at most [`MAX_MESSAGE`] bytes, and carry
//! descriptors ([`Fd`]). A message the helper cannot read (too long, cut short, not its
//! request type) is refused with the reason ([`CallError::Refused`]), logged, and the
//! helper serves on. A panic in [`Privileged::handle`] is logged, refused, and ends the
//! helper (the worker is replaced). Calls from the event loop (`--io event`) would stall
//! every connection of the worker: a server with a helper runs blocking, hybrid, or an
//! async handler (a configuration error otherwise).

mod helper;
pub(crate) mod wire;

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use caps::Capability;
pub use helper::kill_leftovers;
pub(crate) use helper::{HelperSetup, Spawn, Spawner, read_request, serve};
pub use wire::{Fd, MAX_MESSAGE};

/// The default time a call may take: as the default `--request-timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A privileged helper: the operations a worker may ask of a process that keeps
/// privileges, as one typed request and one typed response.
///
/// Keep the request narrow (a closed list of operations with their arguments, never "run
/// this command line" or "open this path") and check every request again in
/// [`handle`](Privileged::handle): the worker that sends it parses the network's bytes
/// and may be compromised; its own checks do not count.
pub trait Privileged: 'static {
    /// What a worker asks for (serialized with postcard; an [`Fd`] travels as a
    /// descriptor).
    type Request: Serialize + DeserializeOwned;
    /// What the helper answers.
    type Response: Serialize + DeserializeOwned;
    /// The capabilities the helper keeps (it stays uid 0); every other one is dropped from
    /// its bounding set, so neither it nor a command it starts can regain it. Default:
    /// none (root's file ownership only).
    const CAPABILITIES: &'static [Capability] = &[];

    /// Answers one request of the worker `caller`.
    fn handle(&mut self, request: Self::Request, caller: &Caller) -> Self::Response;
}

/// The worker that calls a helper: known by construction (each worker has its own
/// channel), not by what the worker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub(crate) worker: u32,
    pub(crate) pid: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

impl Caller {
    /// The worker's number (as in the log lines: `worker 3`).
    pub fn worker(&self) -> u32 {
        self.worker
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The user id the worker runs as, after its privilege drop.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The group id the worker runs as, after its privilege drop.
    pub fn gid(&self) -> u32 {
        self.gid
    }
}

/// Why a call to the privileged helper failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// This server declares no helper ([`Server::privileged`](crate::Server::privileged)),
    /// or this is not a worker.
    #[error("no privileged helper in this process")]
    NoHelper,
    /// The helper is gone (it died or was killed). The worker stops after its connection,
    /// and the master replaces it, with a new helper.
    #[error("the privileged helper is gone")]
    Gone,
    /// The helper did not answer within the timeout.
    #[error("the privileged helper did not answer within {0:?}")]
    Timeout(Duration),
    /// The helper refused the request: it could not read it (too long, not its request
    /// type) or failed answering it (the reason). Also the application's own refusal,
    /// when it maps one to this variant.
    #[error("refused by the privileged helper: {0}")]
    Refused(String),
    /// The request could not be encoded, or the response decoded.
    #[error("the privileged channel: {0}")]
    Encoding(String),
    /// The channel's system calls failed.
    #[error("the privileged channel: {0}")]
    Io(#[from] io::Error),
}

impl From<CallError> for io::Error {
    fn from(e: CallError) -> io::Error {
        let kind = match &e {
            CallError::Timeout(_) => io::ErrorKind::TimedOut,
            CallError::Gone => io::ErrorKind::BrokenPipe,
            CallError::Refused(_) => io::ErrorKind::PermissionDenied,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// A worker's end of its helper's channel.
struct WorkerEnd {
    /// Never closed: the worker holds its end for its life, and the accept loop borrows it
    /// for as long (see [`channel_fd`]).
    fd: &'static OwnedFd,
    /// The sequence number of the last request.
    seq: u32,
    /// The helper is known to be gone.
    gone: bool,
    /// The default timeout of a call.
    timeout: Duration,
    /// The send timeout set on `fd` (`SO_SNDTIMEO`), so that a helper that has stopped
    /// reading (its queue full of requests whose calls timed out) cannot block a send
    /// forever.
    send_timeout: Option<Duration>,
    buf: Vec<u8>,
}

/// This worker's channel (`None` in the master, or without a helper). A std `Mutex` is
/// right here: it is never shared across processes (each worker sets its own after its
/// fork), and it serialises calls from the handler's own threads, if any.
static CHANNEL: Mutex<Option<WorkerEnd>> = Mutex::new(None);

/// Installs this worker's end of its helper's channel (after the helper reported ready).
pub(crate) fn set_worker_end(fd: OwnedFd, timeout: Duration) {
    // Until the first call sets its own: a message without an answer (a log hand-over)
    // must not block for ever either.
    let _ = socket2::SockRef::from(&fd).set_write_timeout(Some(timeout.max(Duration::from_millis(1))));
    let mut end = CHANNEL.lock().unwrap_or_else(|p| p.into_inner());
    *end = Some(WorkerEnd {
        // Leaked: a worker's end lives as long as the worker (it is set once, after the
        // helper's start, and the worker never returns), which is what lets
        // `channel_fd` lend it as `'static`.
        fd: Box::leak(Box::new(fd)),
        seq: 0,
        gone: false,
        timeout,
        send_timeout: Some(timeout),
        buf: Vec::new(),
    });
}

/// This worker's end of its helper's channel, for the accept loop to watch for a hang-up.
/// The descriptor lives as long as the worker.
pub(crate) fn channel_fd() -> Option<std::os::fd::BorrowedFd<'static>> {
    let guard = CHANNEL.lock().unwrap_or_else(|p| p.into_inner());
    guard.as_ref().map(|end| end.fd.as_fd())
}

/// The accept loop saw the helper's end close: the helper is gone. Said once; the worker
/// stops (its caller returns), and the master replaces it with a new helper.
pub(crate) fn helper_hung_up() {
    let mut guard = CHANNEL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(end) = guard.as_mut().filter(|e| !e.gone) {
        end.gone = true;
        tracing::error!("the privileged helper is gone: this worker stops, to be replaced with a new helper");
    }
}

/// Hands the log file the master reopened (USR1) to this worker's helper, if it has one,
/// for its stderr: the helper's log lines follow the rotation too. Never blocks longer than
/// the calls' send timeout; a failure is logged (the helper keeps the old file).
pub(crate) fn forward_log(fd: std::os::fd::BorrowedFd<'_>) {
    let mut guard = CHANNEL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(end) = guard.as_mut().filter(|e| !e.gone) else {
        return;
    };
    if let Err(e) = wire::send_raw(
        end.fd.as_fd(),
        wire::Kind::Log,
        0,
        b"",
        &[std::os::fd::AsRawFd::as_raw_fd(&fd)],
    ) {
        tracing::warn!("cannot hand the reopened log file to the privileged helper: {e}");
    }
}

/// The handle on this worker's privileged helper `P`: `helper::<P>().call(&request)`.
/// Also reached as [`Conn::privileged`](crate::Conn::privileged) and
/// [`Client::privileged`](crate::Client::privileged).
pub fn helper<P: Privileged>() -> Helper<P> {
    Helper {
        timeout: None,
        _helper: PhantomData,
    }
}

/// A handle on the worker's privileged helper `P` (see the [module](self)).
#[derive(Debug)]
pub struct Helper<P> {
    timeout: Option<Duration>,
    _helper: PhantomData<fn() -> P>,
}

impl<P: Privileged> Helper<P> {
    /// How long [`call`](Helper::call) waits for the answer. Default: the server's
    /// ([`Server::privileged_timeout`](crate::Server::privileged_timeout), 60 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sends `request` to the helper and waits for its response. `P` must be the type
    /// registered with [`Server::privileged`](crate::Server::privileged): another type's
    /// request does not decode there and is refused.
    pub fn call(&self, request: &P::Request) -> Result<P::Response, CallError> {
        let mut guard = CHANNEL.lock().unwrap_or_else(|p| p.into_inner());
        let end = guard.as_mut().ok_or(CallError::NoHelper)?;
        if end.gone {
            return Err(CallError::Gone);
        }
        let timeout = self.timeout.unwrap_or(end.timeout);
        if end.send_timeout != Some(timeout) {
            socket2::SockRef::from(end.fd).set_write_timeout(Some(timeout.max(Duration::from_millis(1))))?;
            end.send_timeout = Some(timeout);
        }
        end.seq = end.seq.wrapping_add(1);
        let seq = end.seq;
        match wire::send(end.fd.as_fd(), wire::Kind::Request, seq, request) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(CallError::Timeout(timeout)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) => {
                return Err(gone(end));
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                return Err(CallError::Encoding(e.to_string()));
            }
            Err(e) => return Err(CallError::Io(e)),
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CallError::Timeout(timeout));
            }
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            let mut fds = [nix::poll::PollFd::new(
                end.fd.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(CallError::Io(e.into())),
            }
            let msg = match wire::recv(end.fd.as_fd(), &mut end.buf) {
                Ok(m) => m,
                Err(wire::WireError::Closed) => return Err(gone(end)),
                Err(wire::WireError::WouldBlock) => continue,
                Err(wire::WireError::Malformed { why, .. }) => return Err(CallError::Encoding(why)),
                Err(wire::WireError::Io(e)) => return Err(CallError::Io(e)),
            };
            if msg.seq != seq {
                // The answer to an earlier call that timed out: dropped.
                continue;
            }
            return answer::<P>(msg);
        }
    }

    /// As [`call`](Helper::call), awaited, for async handlers
    /// ([`AsyncClient::privileged`](crate::AsyncClient::privileged), or
    /// [`Conn::privileged`](crate::Conn::privileged) in an
    /// [`AsyncRequestHandler`](crate::AsyncRequestHandler)): the worker's thread is never
    /// blocked. The request goes out without waiting (a helper whose queue is full is
    /// waited for on the runtime), and the answer is awaited on the runtime too, so that
    /// the worker serves its other connections meanwhile. The calls of a worker take
    /// turns (the helper answers one at a time); the [timeout](Helper::timeout) bounds a
    /// call's whole wait, its turn included. A response that comes after the timeout is
    /// dropped, as for `call`.
    pub async fn call_async(&self, request: &P::Request) -> Result<P::Response, CallError> {
        let (fd, timeout) = {
            let guard = CHANNEL.lock().unwrap_or_else(|p| p.into_inner());
            let end = guard.as_ref().ok_or(CallError::NoHelper)?;
            if end.gone {
                return Err(CallError::Gone);
            }
            (end.fd, self.timeout.unwrap_or(end.timeout))
        };
        let turns = ASYNC_TURNS.get_or_init(|| tokio::sync::Mutex::new(()));
        let call = async {
            let _turn = turns.lock().await;
            // A descriptor of its own for the runtime's reactor (close-on-exec, as
            // `try_clone` makes it), registered for this call only.
            let io = crate::sys::watch_async(
                fd.try_clone()?,
                tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
            )?;
            let seq = {
                let mut guard = CHANNEL.lock().unwrap_or_else(|p| p.into_inner());
                let end = guard.as_mut().ok_or(CallError::NoHelper)?;
                end.seq = end.seq.wrapping_add(1);
                end.seq
            };
            loop {
                let mut ready = io.writable().await?;
                match ready.try_io(|_| wire::send_with(fd.as_fd(), wire::Kind::Request, seq, request, true)) {
                    Ok(Ok(())) => break,
                    Ok(Err(e)) if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) => {
                        return Err(gone_now());
                    }
                    Ok(Err(e)) if e.kind() == io::ErrorKind::InvalidInput => {
                        return Err(CallError::Encoding(e.to_string()));
                    }
                    Ok(Err(e)) => return Err(CallError::Io(e)),
                    Err(_would_block) => {}
                }
            }
            let mut buf = Vec::new();
            loop {
                let mut ready = io.readable().await?;
                let received = ready.try_io(|_| match wire::recv_with(fd.as_fd(), &mut buf, true) {
                    Err(wire::WireError::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
                    other => Ok(other),
                });
                let msg = match received {
                    Err(_would_block) => continue,
                    Ok(Err(e)) => return Err(CallError::Io(e)),
                    Ok(Ok(Ok(msg))) => msg,
                    Ok(Ok(Err(wire::WireError::Closed))) => return Err(gone_now()),
                    Ok(Ok(Err(wire::WireError::WouldBlock))) => continue,
                    Ok(Ok(Err(wire::WireError::Malformed { why, .. }))) => {
                        return Err(CallError::Encoding(why));
                    }
                    Ok(Ok(Err(wire::WireError::Io(e)))) => return Err(CallError::Io(e)),
                };
                if msg.seq != seq {
                    // The answer to an earlier call that timed out: dropped.
                    continue;
                }
                return answer::<P>(msg);
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout(timeout)),
        }
    }
}

/// The async calls of this worker take turns: one at a time on the channel, so that each
/// reads its own answer (see [`Helper::call_async`]).
static ASYNC_TURNS: std::sync::OnceLock<tokio::sync::Mutex<()>> = std::sync::OnceLock::new();

/// The helper's answer `msg` to a call: its response, or its refusal.
fn answer<P: Privileged>(msg: wire::Message) -> Result<P::Response, CallError> {
    match msg.kind {
        wire::Kind::Response => wire::decode(&msg.payload, msg.fds).map_err(CallError::Encoding),
        wire::Kind::Refused => Err(CallError::Refused(
            wire::decode::<String>(&msg.payload, msg.fds)
                .unwrap_or_else(|e| format!("(unreadable reason: {e})")),
        )),
        other => Err(CallError::Encoding(format!("unexpected {other:?} message"))),
    }
}

/// [`gone`], for a caller that does not hold the channel.
fn gone_now() -> CallError {
    let mut guard = CHANNEL.lock().unwrap_or_else(|p| p.into_inner());
    match guard.as_mut() {
        Some(end) => gone(end),
        None => CallError::Gone,
    }
}

/// The helper is gone: said once, and the worker stops after its connection (a stop
/// signal to itself), so that the master replaces it with a worker that has a helper.
fn gone(end: &mut WorkerEnd) -> CallError {
    if !end.gone {
        end.gone = true;
        tracing::error!(
            "the privileged helper is gone: this worker stops after its connection, to be replaced with a new helper"
        );
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM);
    }
    CallError::Gone
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Big;

    impl Privileged for Big {
        type Request = String;
        type Response = ();

        fn handle(&mut self, _: String, _: &Caller) {}
    }

    /// Issue #18: a helper that stops reading (stuck in a long call) makes the worker's
    /// calls time out, the sends included once its queue is full: never a hang. (The only
    /// test of this binary that installs a channel in the process-wide slot.)
    #[test]
    fn issue_18_a_helper_that_stops_reading_is_a_timeout_not_a_hang() {
        let (worker, helper_end) = wire::pair().unwrap();
        set_worker_end(worker, Duration::from_millis(50));
        let request = "x".repeat(900 * 1024);
        let started = Instant::now();
        // 900 KiB each: the queue (the sender's buffer, a few MiB) is full after a few.
        for i in 0..12 {
            match helper::<Big>().call(&request) {
                Err(CallError::Timeout(t)) => assert_eq!(t, Duration::from_millis(50)),
                other => panic!("call {i}: {other:?}"),
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        drop(helper_end);
        // The slot is left empty, as in a process without a helper.
        *CHANNEL.lock().unwrap() = None;
    }
}

//! The helper process: its fork from the worker, its confinement, and its loop.

use std::convert::Infallible;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::panic::{self, AssertUnwindSafe};
use std::time::Duration;

use nix::unistd::Pid;

use serde::de::DeserializeOwned;

use super::wire::{self, Kind, Message, WireError};
use super::{Caller, Privileged};
use crate::confine::sandbox::Compiled;
use crate::error::BoxError;
use crate::sys;

/// How long a worker waits for its helper to report ready (its factory included).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What a worker knows when it forks its helper.
#[derive(Debug)]
pub(crate) struct HelperSetup<'a> {
    /// The worker's number and pid.
    pub(crate) worker: u32,
    pub(crate) worker_pid: u32,
    /// The uid and gid the worker is about to run as.
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// With `--sandbox`: the helper's profile, compiled in the master.
    pub(crate) sandbox: Option<&'a Compiled>,
}

/// A helper the worker can start (the application's [`Privileged`] type erased).
pub(crate) trait Spawn {
    /// Forks the helper and waits until it is ready; in the worker, still root. On
    /// success, this worker's calls reach it.
    fn spawn(&mut self, setup: &HelperSetup<'_>) -> Result<(), String>;
    /// The default timeout of a call.
    fn set_timeout(&mut self, timeout: Duration);
}

/// The helper factory `F` of `P`, as registered with `Server::privileged`.
pub(crate) struct Spawner<P, F> {
    factory: F,
    /// The default timeout of the worker's calls.
    timeout: Duration,
    _helper: std::marker::PhantomData<fn() -> P>,
}

impl<P, F> Spawner<P, F> {
    pub(crate) fn new(factory: F, timeout: Duration) -> Self {
        Spawner {
            factory,
            timeout,
            _helper: std::marker::PhantomData,
        }
    }
}

impl<P, F> Spawn for Spawner<P, F>
where
    P: Privileged,
    F: FnMut() -> Result<P, BoxError>,
{
    fn spawn(&mut self, setup: &HelperSetup<'_>) -> Result<(), String> {
        let (worker_end, helper_end) =
            wire::pair().map_err(|e| format!("the privileged helper's channel: {e}"))?;
        let factory = &mut self.factory;
        // SAFETY: the worker is single-threaded (its factory has not run; sys::fork checks
        // it), its logs are unbuffered (one write per line), and the child runs
        // `helper_main`, which never returns (it ends with `_exit`).
        let child = unsafe {
            sys::fork_child(|| -> Infallible {
                // The worker's end is closed there with every other descriptor.
                helper_main::<P, F>(factory, &helper_end, setup)
            })
        }
        .map_err(|e| format!("forking the privileged helper: {e}"))?;
        drop(helper_end);
        wait_ready(&worker_end, child)?;
        super::set_worker_end(worker_end, self.timeout);
        Ok(())
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }
}

/// Waits for the helper's first message: ready, or why it failed.
fn wait_ready(end: &OwnedFd, child: Pid) -> Result<(), String> {
    let mut fds = [nix::poll::PollFd::new(end.as_fd(), nix::poll::PollFlags::POLLIN)];
    let ms = u16::try_from(START_TIMEOUT.as_millis()).unwrap_or(u16::MAX);
    loop {
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)) {
            Ok(0) => {
                return Err(format!(
                    "the privileged helper (pid {child}) did not start within {START_TIMEOUT:?}"
                ));
            }
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(format!("waiting for the privileged helper: {e}")),
        }
    }
    let mut buf = Vec::new();
    match wire::recv(end.as_fd(), &mut buf) {
        Ok(m) if m.kind == Kind::Ready => Ok(()),
        Ok(m) if m.kind == Kind::Failed => Err(format!(
            "the privileged helper failed to start: {}",
            wire::decode::<String>(&m.payload, m.fds).unwrap_or_else(|e| format!("(unreadable: {e})"))
        )),
        Ok(m) => Err(format!(
            "the privileged helper sent {:?} before it was ready",
            m.kind
        )),
        Err(WireError::Closed) => Err(format!(
            "the privileged helper (pid {child}) exited during its start"
        )),
        Err(e) => Err(format!("the privileged helper's first message: {e}")),
    }
}

/// The helper's life, in the child of the worker: confine, make the helper, serve.
fn helper_main<P, F>(factory: &mut F, channel: &OwnedFd, setup: &HelperSetup<'_>) -> Infallible
where
    P: Privileged,
    F: FnMut() -> Result<P, BoxError>,
{
    crate::process::log::set_helper(setup.worker);
    let fail = |reason: String| -> ! {
        tracing::error!("cannot start: {reason}");
        let _ = wire::send(channel.as_fd(), Kind::Failed, 0, &reason);
        sys::exit_now(1)
    };
    // Handlers, not "ignore": a command the helper executes gets default dispositions
    // (handlers are reset by execve, ignored signals would stay ignored). A stop signal
    // (a terminal's Ctrl-C reaches the process group) only interrupts a wait: the helper
    // ends with its worker.
    if let Err(e) = sys::install_worker_signals() {
        fail(format!("installing signal handlers: {e}"));
    }
    match sys::die_with_parent(Pid::from_raw(setup.worker_pid as i32)) {
        Ok(true) => {}
        Ok(false) => sys::exit_now(1),
        Err(e) => fail(format!("setting the parent-death signal: {e}")),
    }
    // SAFETY: the helper never returns into the worker's code, whose objects own these
    // descriptors (listeners, the scoreboard, the log channel): nothing uses them again.
    // The application's factory and handler run after this, in this process: a
    // descriptor they captured from before the fork is closed too, which
    // `Server::privileged` documents (they open what they need in the factory).
    if let Err(e) = unsafe { sys::close_all_but(&[0, 1, 2, channel.as_raw_fd()]) } {
        fail(format!("closing the worker's descriptors: {e}"));
    }
    // A worker that stops reading its answers must not block the helper for ever.
    if let Err(e) = socket2::SockRef::from(channel).set_write_timeout(Some(Duration::from_secs(10))) {
        fail(format!("the channel's send timeout: {e}"));
    }
    if let Err(e) = sys::become_subreaper() {
        fail(format!("becoming a child subreaper: {e}"));
    }
    if let Err(e) = keep_only(P::CAPABILITIES) {
        fail(format!("dropping capabilities: {e}"));
    }
    if let Some(sandbox) = setup.sandbox {
        if let Err(e) = nix::sys::prctl::set_no_new_privs() {
            fail(format!("PR_SET_NO_NEW_PRIVS: {e}"));
        }
        match sandbox.apply() {
            Ok(None) => {}
            Ok(Some(warning)) => tracing::warn!("{warning}"),
            Err(e) => fail(format!("the helper's sandbox: {e}")),
        }
    }
    let mut helper = match panic::catch_unwind(AssertUnwindSafe(&mut *factory)) {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => fail(format!("the helper factory failed: {e}")),
        Err(p) => fail(format!(
            "the helper factory panicked: {}",
            crate::error::panic_text(&*p)
        )),
    };
    if wire::send(channel.as_fd(), Kind::Ready, 0, &()).is_err() {
        sys::exit_now(1);
    }
    let caller = Caller {
        worker: setup.worker,
        pid: setup.worker_pid,
        uid: setup.uid,
        gid: setup.gid,
    };
    serve(&mut helper, channel.as_fd(), &caller);
    sys::exit_now(0)
}

/// Answers the worker's requests until it closes its end. Also run in unit tests, over a
/// socket pair, without a fork.
pub(crate) fn serve<P: Privileged>(helper: &mut P, channel: std::os::fd::BorrowedFd<'_>, caller: &Caller) {
    let mut buf = Vec::new();
    loop {
        let msg = match wire::recv(channel, &mut buf) {
            Ok(m) => m,
            Err(WireError::Closed) => return,
            Err(WireError::WouldBlock) => continue,
            Err(WireError::Malformed { seq, why }) => {
                tracing::warn!("refused a message from worker {}: {why}", caller.worker);
                let _ = wire::send(channel, Kind::Refused, seq.unwrap_or(0), &why);
                continue;
            }
            Err(WireError::Io(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(WireError::Io(e)) => {
                tracing::error!("reading the channel: {e}; the helper exits");
                return;
            }
        };
        if msg.kind == Kind::Log {
            // The log file its worker got from the master after a USR1: no answer.
            match msg.fds.as_slice() {
                [fd] => match crate::process::log::redirect_stderr(fd) {
                    Ok(()) => tracing::info!("reopened the log file (handed over by its worker)"),
                    Err(e) => tracing::error!("cannot switch to the reopened log file: {e}"),
                },
                _ => tracing::warn!(
                    "refused a log message from worker {} without one descriptor",
                    caller.worker
                ),
            }
            continue;
        }
        let (seq, request) = match request::<P::Request>(msg) {
            Ok(r) => r,
            Err((seq, why)) => {
                tracing::warn!("refused a message from worker {}: {why}", caller.worker);
                let _ = wire::send(channel, Kind::Refused, seq, &why);
                continue;
            }
        };
        let response = match panic::catch_unwind(AssertUnwindSafe(|| helper.handle(request, caller))) {
            Ok(r) => r,
            Err(p) => {
                let why = format!("the helper panicked: {}", crate::error::panic_text(&*p));
                tracing::error!("{why}; the helper exits");
                let _ = wire::send(channel, Kind::Refused, seq, &why);
                return;
            }
        };
        if let Err(e) = wire::send(channel, Kind::Response, seq, &response) {
            let why = format!("the response could not be sent: {e}");
            tracing::error!("{why}");
            let _ = wire::send(channel, Kind::Refused, seq, &why);
        }
    }
}

/// What [`serve`] makes of a message it received: a request (with its sequence number),
/// decoded as `R` with the message's descriptors, or the refusal to send back (the
/// sequence number and the reason): a message of another kind, or a payload that is not
/// one `R`.
pub(crate) fn request<R: DeserializeOwned>(msg: Message) -> Result<(u32, R), (u32, String)> {
    if msg.kind != Kind::Request {
        return Err((msg.seq, format!("a {:?} message, not a request", msg.kind)));
    }
    wire::decode(&msg.payload, msg.fds)
        .map(|r| (msg.seq, r))
        .map_err(|e| (msg.seq, format!("not a request this helper takes: {e}")))
}

/// The helper's reading of one received datagram and the descriptors that came with it:
/// [`wire::parse`] (a malformed one is refused under its header's sequence number, or 0,
/// as [`serve`] does), then [`request`]. What the fuzz target `privileged_message` and the
/// channel's property test run on arbitrary bytes; [`serve`] does the same after
/// `wire::recv`, which ends with `wire::parse`.
pub(crate) fn read_request<R: DeserializeOwned>(
    datagram: &[u8],
    fds: Vec<OwnedFd>,
) -> Result<(u32, R), (u32, String)> {
    match wire::parse(datagram, fds) {
        Ok(msg) => request(msg),
        Err(WireError::Malformed { seq, why }) => Err((seq.unwrap_or(0), why)),
        // `parse` reads no socket: only `recv` closes or fails.
        Err(e) => Err((0, e.to_string())),
    }
}

/// Keeps only `keep`: every other capability leaves the bounding set (first, while
/// `CAP_SETPCAP` is still effective), then the effective and permitted sets are `keep`,
/// the inheritable and ambient sets empty.
fn keep_only(keep: &[caps::Capability]) -> Result<(), caps::errors::CapsError> {
    use caps::{CapSet, CapsHashSet};
    let keep: CapsHashSet = keep.iter().copied().collect();
    for cap in caps::runtime::thread_all_supported() {
        if !keep.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap)? {
            caps::drop(None, CapSet::Bounding, cap)?;
        }
    }
    caps::clear(None, CapSet::Ambient)?;
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new())?;
    caps::set(None, CapSet::Effective, &keep)?;
    caps::set(None, CapSet::Permitted, &keep)?;
    Ok(())
}

/// In a helper: kills and reaps what the commands it started left behind, the processes
/// that left their process group (`setsid`, `setpgid`, a daemonizing fork) and, orphaned,
/// became the helper's children (it is a child subreaper). Call it after a command has
/// been waited for; it must not run while another child is meant to live. Returns how
/// many processes it killed (one killed before, with its process group say, and not yet
/// reaped counts too: reap those first to count only the escapees).
///
/// Outside a helper (a process that is not a child subreaper: a worker's handler) it does
/// nothing and returns 0. It never blocks for long: children are killed and reaped
/// without waiting (`WNOHANG`) for at most two seconds, so a child that cannot be reaped
/// (a zombie only its ptracer may collect, a process of a user this helper may not
/// signal) is left, with a warning.
pub fn kill_leftovers() -> usize {
    if !sys::is_subreaper() {
        return 0;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    // Killed and not reaped yet (a pid reaped may name another process later).
    let mut dying: std::collections::HashSet<Pid> = std::collections::HashSet::new();
    let mut killed = 0;
    loop {
        // Reap every child that has ended.
        while let Ok(status) = nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
            match status.pid() {
                Some(pid) => {
                    dying.remove(&pid);
                }
                None => break,
            }
        }
        let children = sys::children();
        if children.is_empty() {
            break;
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!(
                "{} process(es) left by a command could not be killed and reaped within 2 s: {children:?}",
                children.len()
            );
            break;
        }
        // A child not killed yet is killed once (a killed one that has not died yet is a
        // zombie to reap, not another leftover).
        for pid in children {
            if !dying.contains(&pid) && nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).is_ok()
            {
                dying.insert(pid);
                killed += 1;
            }
        }
        // The killed die at once; what they had started becomes this helper's child as they
        // do: the next round.
        std::thread::sleep(Duration::from_millis(1));
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    struct Echo;

    impl Privileged for Echo {
        type Request = (String, u32);
        type Response = String;

        fn handle(&mut self, (text, n): (String, u32), caller: &Caller) -> String {
            if text == "panic" {
                panic!("asked to");
            }
            format!("{} from worker {}", text.repeat(n as usize), caller.worker)
        }
    }

    /// Issue #18 (review): outside a helper, `kill_leftovers` touches nobody.
    #[test]
    fn issue_18_kill_leftovers_does_nothing_outside_a_helper() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        assert_eq!(kill_leftovers(), 0);
        assert!(
            child.try_wait().unwrap().is_none(),
            "the test's own child lives on"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Issue #18: a bad message on the channel is refused, with the reason, and the helper
    /// serves the next one; its panic is refused and ends it.
    #[test]
    fn issue_18_the_helper_refuses_bad_messages_and_serves_on() {
        let (worker, helper_end) = wire::pair().unwrap();
        let serving = std::thread::spawn(move || {
            let caller = Caller {
                worker: 3,
                pid: 1,
                uid: 65534,
                gid: 65534,
            };
            serve(&mut Echo, helper_end.as_fd(), &caller);
        });
        let mut buf = Vec::new();
        let ask = |kind: Kind, seq: u32, payload: &[u8]| {
            wire::send_raw(worker.as_fd(), kind, seq, payload, &[]).unwrap();
            let m = wire::recv(worker.as_fd(), &mut Vec::new()).unwrap();
            (m.kind, m.seq, m.payload, m.fds)
        };
        let good = postcard::to_stdvec(&("ab".to_owned(), 2u32)).unwrap();
        let (kind, seq, payload, fds) = ask(Kind::Request, 1, &good);
        assert_eq!((kind, seq), (Kind::Response, 1));
        assert_eq!(
            wire::decode::<String>(&payload, fds).unwrap(),
            "abab from worker 3"
        );
        // Not the helper's request type.
        let (kind, seq, payload, fds) = ask(Kind::Request, 2, &[0xff, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!((kind, seq), (Kind::Refused, 2));
        let why = wire::decode::<String>(&payload, fds).unwrap();
        assert!(why.starts_with("not a request this helper takes"), "{why}");
        // Not a request at all.
        let (kind, _, _, _) = ask(Kind::Response, 3, &good);
        assert_eq!(kind, Kind::Refused);
        // Cut short: the header announces more than came.
        wire::send_bytes(
            worker.as_fd(),
            &[b"APv1\x01\0\0\0\x04\0\0\0\x40\0\0\0", b"ab"],
            &[],
        )
        .unwrap();
        let m = wire::recv(worker.as_fd(), &mut buf).unwrap();
        assert_eq!((m.kind, m.seq), (Kind::Refused, 4));
        // Too long for the limit.
        let big = vec![1u8; wire::MAX_MESSAGE + 1];
        wire::send_bytes(worker.as_fd(), &[b"APv1\x01\0\0\0\x05\0\0\0\0\0\0\0", &big], &[]).unwrap();
        let m = wire::recv(worker.as_fd(), &mut buf).unwrap();
        assert_eq!((m.kind, m.seq), (Kind::Refused, 5));
        // Still serving.
        let (kind, seq, payload, fds) = ask(Kind::Request, 6, &good);
        assert_eq!((kind, seq), (Kind::Response, 6));
        assert_eq!(
            wire::decode::<String>(&payload, fds).unwrap(),
            "abab from worker 3"
        );
        // A panic is refused, and ends the helper.
        let panics = postcard::to_stdvec(&("panic".to_owned(), 1u32)).unwrap();
        let (kind, seq, payload, fds) = ask(Kind::Request, 7, &panics);
        assert_eq!((kind, seq), (Kind::Refused, 7));
        assert!(
            wire::decode::<String>(&payload, fds)
                .unwrap()
                .contains("asked to")
        );
        serving.join().unwrap();
    }
}

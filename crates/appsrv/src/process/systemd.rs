//! systemd notification (`Type=notify`): the master tells the service manager when it is
//! ready, reloading and stopping. Nothing happens when `NOTIFY_SOCKET` is not set.
//!
//! - `READY=1` and `MAINPID=` once the first workers are ready. After a binary upgrade the
//!   new master sends them itself, so the unit needs `NotifyAccess=all` to accept them
//!   from a process that is not the one systemd started;
//! - `RELOADING=1` with `MONOTONIC_USEC=` when a reload starts, `READY=1` when the new
//!   generation serves alone;
//! - `STOPPING=1` when a stop begins;
//! - `STATUS=` with a short summary each time.

use sd_notify::NotifyState;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("systemd notification failed: {e}");
    }
}

/// The master serves.
pub(crate) fn ready(status: &str) {
    send(&[
        NotifyState::Ready,
        NotifyState::MainPid(std::process::id()),
        NotifyState::Status(status),
    ]);
}

/// A reload begins.
pub(crate) fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now, NotifyState::Status("reloading")]),
        Err(_) => send(&[NotifyState::Reloading, NotifyState::Status("reloading")]),
    }
}

/// A stop begins.
pub(crate) fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

//! The blocking connection loop: one connection at a time, from accept to close.
//!
//! Kept apart from the worker's set-up so that other loops (an event loop that multiplexes
//! many connections per process) can share everything else.

use std::io;
use std::panic::{self, AssertUnwindSafe};

use crate::client::{Buffers, Client};
use crate::handler::Handler;
use crate::listener::{Addr, Listener};
use crate::sys::{self, exit};

use super::accept::{Accepted, Acceptor};

/// Serves connections until a stop; returns the worker's exit status. `reopen_log` runs
/// between connections after a USR1.
pub(crate) fn serve<H: Handler>(
    listeners: &[Listener],
    handler: &mut H,
    reopen_log: &mut dyn FnMut(),
) -> i32 {
    let mut acceptor = match Acceptor::new(listeners) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!("cannot wait for connections: {e}");
            return exit::START_FAILED;
        }
    };
    let mut buffers = Some(Buffers::new());
    loop {
        let (socket, peer) = match acceptor.accept() {
            Accepted::Connection(s, p) => (s, p),
            Accepted::Stop => return exit::OK,
            Accepted::Reopen => {
                reopen_log();
                continue;
            }
        };
        if sys::take_reopen_request() {
            reopen_log();
        }
        let peer = Addr::from_sockaddr(&peer);
        tracing::debug!("serving {peer}");
        let mut client = Client::new(socket, peer, buffers.take().unwrap_or_else(Buffers::new));
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| handler.handle_client(&mut client)));
        let peer = client.peer_addr();
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
                return exit::PANIC;
            }
        }
        if sys::stop_requested() {
            return exit::OK;
        }
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

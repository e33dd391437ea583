//! What a user implements.

use std::io;

use crate::client::Client;

/// Serves connections, one at a time, inside a worker process.
///
/// One handler value exists per worker: the factory given to
/// [`Server::run`](crate::Server::run) creates it after the worker has forked and dropped
/// its privileges, so state that must not be shared between processes (a database
/// connection, a cache, a random number generator) belongs in the handler.
///
/// ```no_run
/// use std::io::{self, Write};
///
/// struct Hello;
///
/// impl appsrv::Handler for Hello {
///     fn handle_client(&mut self, client: &mut appsrv::Client) -> io::Result<()> {
///         writeln!(client, "Hello, Client! You are {}", client.peer_addr())
///     }
/// }
///
/// fn main() -> appsrv::Result<()> {
///     appsrv::Server::new("hello").listen("127.0.0.1:7000").run(|| Ok(Hello))
/// }
/// ```
pub trait Handler {
    /// Serves one connection, from accept to close.
    ///
    /// Buffered output is flushed and the connection closed when this returns. An error
    /// is logged with the peer's address (timeouts and a peer that went away at debug
    /// level, others as warnings) and ends only this connection. A panic is caught: the
    /// connection is closed, the panic logged with the peer's address, and the worker
    /// exits and is replaced, so other clients never notice.
    fn handle_client(&mut self, client: &mut Client) -> io::Result<()>;

    /// Called once when the worker stops in an orderly way (a stop signal, after the
    /// last connection), before the process exits. Not called after a panic or when the
    /// worker is killed. Does nothing by default.
    fn on_worker_exit(&mut self) {}
}

/// Facts about the worker process, given to the
/// [`on_worker_start`](crate::Server::on_worker_start) hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// The worker's slot number, from 1 to the pool size; a replacement reuses the slot
    /// of the worker it replaces.
    pub id: u32,
    /// The worker's process id.
    pub pid: u32,
}

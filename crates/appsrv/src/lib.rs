//! appsrv: write a preforking network server for your own protocol, don't configure one.
//!
//! You implement one method, [`Handler::handle_client`], and get a production daemon: the
//! master process binds the listeners, forks a pool of worker processes that accept and
//! serve connections with plain blocking code, drops the workers' privileges, replaces
//! workers that crash, and stops gracefully on TERM, INT or QUIT.
//!
//! ```no_run
//! use std::io::{self, Write};
//!
//! struct Hello;
//!
//! impl appsrv::Handler for Hello {
//!     fn handle_client(&mut self, client: &mut appsrv::Client) -> io::Result<()> {
//!         writeln!(client, "Hello, Client! You are {}", client.peer_addr())
//!     }
//! }
//!
//! fn main() -> appsrv::Result<()> {
//!     appsrv::Server::new("hello").listen("127.0.0.1:7000").run(|| Ok(Hello))
//! }
//! ```
//!
//! For a request/response protocol, implement [`RequestHandler::handle_request`] instead
//! and run it with [`Server::run_requests`]: a [`codec`] frames the requests, and the
//! framework does keep-alive, pipelining, limits and timeouts. Its per-connection state is
//! its [`Session`](RequestHandler::Session), reached through [`Conn`].
//!
//! The program gets the standard command line (see [`cli`]): `hello --workers 8 -l
//! '[::]:7000' --user nobody`, with `--help` documenting every default, and environment
//! overrides (`HELLO_WORKERS=8`).
//!
//! The process model, the life of a worker and of a connection are described in
//! `docs/ARCHITECTURE.md`.

#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

#[doc(hidden)]
pub mod bench_support;
pub mod cli;
pub mod codec;
mod confine;
mod conn;
mod control;
mod dispatch;
mod error;
mod handler;
mod master;
mod net;
mod peer_counts;
mod process;
mod scoreboard;
mod server;
mod sys;
mod worker;

pub use net::{listener, tls};

pub use clap;
pub use cli::Io;
pub use confine::sandbox::Sandbox;
pub use conn::client::Client;
pub use conn::context::Conn;
pub use error::{BoxError, Error, Result};
pub use handler::{Handler, RequestHandler, WorkerInfo};
pub use listener::{Addr, ListenAddr};
pub use server::Server;

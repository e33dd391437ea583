//! appsrv: write a preforking network server for your own protocol, don't configure one.
//!
//! You write one method, in plain blocking Rust or as an `async fn`, and get a production
//! daemon: the master process binds the listeners, forks a pool of worker processes that
//! accept and serve connections, drops the workers' privileges, replaces workers that
//! crash, and stops gracefully on TERM, INT or QUIT. The method belongs to one of five
//! handler traits, each with its [`Server`] method; pick the level that fits the protocol,
//! then whether the handler blocks or awaits:
//!
//! | | blocking | `async` (tokio, inside each worker) |
//! |---|---|---|
//! | a whole connection | [`Handler`] ([`Server::run`]) | [`AsyncHandler`] ([`Server::run_async`]) |
//! | one request, framed by a [`codec`] | [`RequestHandler`] ([`Server::run_requests`]) | [`AsyncRequestHandler`] ([`Server::run_async_requests`]) |
//! | one datagram (`udp://`, `unixgram:`) | [`DatagramHandler`] ([`Server::run_datagrams`], or [`Server::datagrams`] beside a stream handler) | |
//!
//! # The connection level: [`Handler`]
//!
//! [`Handler::handle_client`] owns the connection from accept to close: read and write the
//! [`Client`] as any stream. Run it with [`Server::run`].
//!
//! ```no_run
//! use std::io::{self, Write};
//!
//! struct Hello;
//!
//! impl appsrv::Handler for Hello {
//!     fn handle_client(&mut self, client: &mut appsrv::Client) -> io::Result<()> {
//!         let peer = client.peer_addr().clone();
//!         writeln!(client, "Hello, Client! You are {peer}")
//!     }
//! }
//!
//! fn main() {
//!     appsrv::server!("hello")
//!         .listen("127.0.0.1:7000")
//!         .run(|| Ok(Hello))
//!         .unwrap_or_else(|e| e.exit());
//! }
//! ```
//!
//! [`server!`] makes a [`Server`] that knows the calling crate's version (for
//! `--version`); [`Error::exit`] prints a start-up error as the command line prints every
//! other (`error: cannot listen on 127.0.0.1:7000: Address already in use`) and exits 1.
//!
//! The closure is the handler *factory*: each worker calls it once, after the fork and the
//! privilege drop, so per-process state (a database connection) belongs in the handler.
//!
//! # The request level: [`RequestHandler`]
//!
//! For a request/response protocol, implement [`RequestHandler::handle_request`] and run it
//! with [`Server::run_requests`]: a [`codec`] frames the requests and responses
//! (lines, length-prefixed frames, netstrings, HTTP/1.1, or your own
//! [`Codec`](codec::Codec)), and the framework reads, writes, keeps connections alive,
//! pipelines, and applies the limits and timeouts. The handler only turns one request into
//! its response. Per-connection state is the handler's
//! [`Session`](RequestHandler::Session), reached through the [`Conn`] given with each
//! request. This one keeps variables for each connection (SET, GET, and COUNT for the
//! commands it sent); the [`Lines`](codec::Lines) codec made with its `Default` (lines up
//! to 8 KiB; [`RequestHandler::codec`] to configure it) hands it each [`Line`](codec::Line):
//!
//! ```no_run
//! use std::collections::HashMap;
//! use std::io;
//!
//! use appsrv::Conn;
//! use appsrv::codec::{Line, Lines, LinesResponse};
//!
//! /// One connection's state.
//! #[derive(Default)]
//! struct Session {
//!     vars: HashMap<String, String>,
//!     commands: u64,
//! }
//!
//! struct Stateful;
//!
//! impl appsrv::RequestHandler for Stateful {
//!     type Codec = Lines;
//!     type Session = Session;
//!
//!     fn handle_request(
//!         &mut self,
//!         conn: &mut Conn<'_, Session>,
//!         line: &Line<'_>,
//!         out: &mut LinesResponse<'_>,
//!     ) -> io::Result<()> {
//!         let session = conn.session();
//!         session.commands += 1;
//!         match line.to_str()?.split_whitespace().collect::<Vec<_>>()[..] {
//!             ["SET", name, value] => {
//!                 session.vars.insert(name.to_owned(), value.to_owned());
//!                 out.line("OK");
//!             }
//!             ["GET", name] => out.line(session.vars.get(name).map_or("(nil)", String::as_str)),
//!             ["COUNT"] => out.line(session.commands),
//!             _ => out.line("-ERR unknown command or wrong number of arguments"),
//!         }
//!         Ok(())
//!     }
//! }
//!
//! fn main() {
//!     appsrv::server!("stateful")
//!         .listen("127.0.0.1:7010")
//!         .run_requests(|| Ok(Stateful))
//!         .unwrap_or_else(|e| e.exit());
//! }
//! ```
//!
//! Request-level handlers that never block can also run in event-loop workers
//! ([`Server::io`] with [`Io::Event`]): one epoll loop per worker over all its
//! connections, the same handler code. Handlers that block can run behind event loops
//! ([`Io::Hybrid`]): front processes hold idle and incomplete connections and hand each
//! whole request to an idle blocking worker. The examples (the workspace's
//! `crates/appsrv-examples`; the heavier ones in `appsrv-frontpage`, `appsrv-dns` and
//! `appsrv-runas`) show a codec of its own (`ping`), sessions (`kv`) and HTTP
//! (`http_hello`).
//!
//! # Async handlers: [`AsyncRequestHandler`], [`AsyncHandler`]
//!
//! A handler that awaits (a timer, a database client, an HTTP client) is written as the
//! async counterpart of either level: [`AsyncRequestHandler::handle_request`] (run with
//! [`Server::run_async_requests`]: the same codecs, sessions, keep-alive and pipelining)
//! or [`AsyncHandler::handle_client`] over an [`AsyncClient`] (run with
//! [`Server::run_async`]: a tokio stream, for conversational protocols). Each worker runs
//! a current-thread tokio runtime made after the fork, where every connection is a
//! future, so a worker holds thousands of connections while their handlers wait; the
//! handler value is shared by them (`&self`). `--max-inflight` bounds the calls in
//! progress, `--request-timeout` cancels one, and a panic closes its connection only
//! (the examples `async_hello`, at the request level, and `smtp_sink`, a whole dialogue).
//!
//! # Datagrams: [`DatagramHandler`]
//!
//! [`DatagramHandler::handle_datagram`] answers one datagram of a `udp://` or
//! `unixgram:` listener, received in batches by the worker's event loop:
//! [`Server::run_datagrams`] serves datagrams only, [`Server::datagrams`] adds them to a
//! server of streams (a DNS server on UDP and TCP, `appsrv-dns`).
//!
//! # The connection types: [`Client`], [`AsyncClient`], [`Conn`]
//!
//! A handler meets one of three: [`Client`] (a blocking [`Handler`]'s whole connection),
//! [`AsyncClient`] (an [`AsyncHandler`]'s) or [`Conn`] (the connection a request came on,
//! for [`RequestHandler`] and [`AsyncRequestHandler`]). They offer the same methods, with
//! the same names and types, wherever these have a meaning:
//!
//! | method | `Client` | `AsyncClient` | `Conn` |
//! |---|---|---|---|
//! | `peer_addr() -> &Addr` | yes | yes | yes |
//! | `local_addr() -> io::Result<Addr>` | yes | yes | yes |
//! | `id() -> `[`ConnId`] (worker slot, generation, pid, number) | yes | yes | yes |
//! | `tls() -> Option<&TlsSession>` | yes | yes | yes |
//! | `penalize() -> Option<Duration>` | yes | yes | yes |
//! | `privileged::<P>() -> privileged::Helper<P>` | yes: `call` | yes: `call_async().await` | yes (1) |
//! | `stopping() -> bool` | yes | yes (and `stopped()`, a future) | yes |
//! | `set_read_timeout`, `set_write_timeout` `-> io::Result<()>`; `read_timeout`, `write_timeout` `-> io::Result<Option<Duration>>` | yes | yes | no (2) |
//!
//! (1) [`Helper::call`](privileged::Helper::call) blocks its caller until the helper
//! answers: a blocking or hybrid worker's request handler calls it;
//! an [`AsyncRequestHandler`] awaits
//! [`Helper::call_async`](privileged::Helper::call_async), which never blocks the
//! worker's thread. A request handler of the event loop (`--io event`, not async) cannot
//! have a helper: such a server is refused before start, with the reason.
//! (2) A request handler neither reads nor writes the socket: the request step does,
//! bounded by `--read-timeout`, `--write-timeout`, `--header-timeout` and
//! `--request-timeout`, the same in every model.
//!
//! `--min-send-rate` holds in every model, on every type: a response read slower than the
//! rate is cut (see `--help`).
//!
//! # The command line
//!
//! The program gets the standard command line (see [`cli`]): `hello --workers 8 -l
//! '[::]:7000' --user nobody`, with `--help` listing the subcommands for a daemon
//! (`start`, `stop`, `status`, `reload`, `upgrade`...) and documenting every option's
//! default, `--version`, shell completions and a man page (`hello completions bash`,
//! `hello man`), and an environment variable for every option (`HELLO_WORKERS=8`,
//! `HELLO_DAEMON=1`).
//!
//! The process model, the life of a worker and of a connection are described in
//! `docs/ARCHITECTURE.md`.

// Doc tests are examples users copy: a warning in one (an unused import) is a bug.
#![doc(test(attr(deny(warnings))))]
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
mod penalty;
pub mod privileged;
mod process;
mod scoreboard;
mod server;
mod sys;
mod worker;

pub use net::{listener, tls};

pub use clap;
pub use cli::Io;
pub use confine::privilege::WorkerIdentity;
pub use confine::sandbox::Sandbox;
pub use conn::async_client::AsyncClient;
pub use conn::client::Client;
pub use conn::context::Conn;
pub use conn::datagram::Datagram;
pub use conn::id::ConnId;
pub use error::{BoxError, Error, Result};
pub use handler::{AsyncHandler, AsyncRequestHandler, DatagramHandler, Handler, RequestHandler, WorkerInfo};
pub use listener::{Addr, ListenAddr};
pub use server::Server;

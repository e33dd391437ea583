//! One connection's data plane: its buffers (`buffers.rs`), its transport, plain or TLS
//! (`transport.rs`; its async readiness rules in `async_transport.rs`, under
//! `AsyncClient` and the async driver), the blocking [`Client`](client::Client) that `handle_client` users
//! see (`client.rs`, with `--min-send-rate`'s watch in `send_watch.rs`) and the
//! [`AsyncClient`](async_client::AsyncClient) of async ones (`async_client.rs`), the
//! I/O-free request step (`step.rs`), the connection context given to request handlers
//! (`context.rs`), a connection's id (`id.rs`), and one received datagram
//! (`datagram.rs`). docs/ARCHITECTURE.md maps which file uses which.

pub(crate) mod async_client;
pub(crate) mod async_transport;
pub(crate) mod buffers;
pub(crate) mod client;
pub(crate) mod context;
pub(crate) mod datagram;
pub(crate) mod id;
pub(crate) mod send_watch;
pub(crate) mod step;
pub(crate) mod transport;

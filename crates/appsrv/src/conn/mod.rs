//! One connection's data plane: its buffers, its transport (plain or TLS; its async
//! readiness rules in `async_transport.rs`, under `AsyncClient` and the async driver) and the
//! blocking [`Client`](client::Client) that `handle_client` users see, the I/O-free
//! request step, and the connection context given to request handlers.

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

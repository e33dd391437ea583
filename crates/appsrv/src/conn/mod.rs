//! One connection's data plane: its buffers, its transport (plain or TLS) and the
//! blocking [`Client`](client::Client) that `handle_client` users see.

pub(crate) mod buffers;
pub(crate) mod client;

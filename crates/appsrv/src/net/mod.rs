//! The network layer: listen addresses and listening sockets, client addresses and the
//! access policy (CIDRs), the PROXY protocol header, and TLS material (certificates, keys,
//! the per-listener rustls configurations). Nothing here knows about workers or handlers.

pub(crate) mod handoff;
pub mod listener;
pub(crate) mod proxy;
pub(crate) mod tickets;
pub mod tls;

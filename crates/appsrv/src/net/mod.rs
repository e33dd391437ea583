//! The network layer: listen addresses and listening sockets, client addresses and the
//! access policy (CIDRs) (`listener.rs`), the PROXY protocol header (`proxy.rs`), TLS
//! material (certificates, keys, the per-listener rustls configurations: `tls.rs`) and
//! its session-ticket keys (`tickets.rs`), and hybrid mode's hand-off channel
//! (`handoff.rs`). Nothing here knows about workers or handlers.

pub(crate) mod handoff;
pub mod listener;
pub(crate) mod proxy;
pub(crate) mod tickets;
pub mod tls;

//! One received datagram, as a [`DatagramHandler`](crate::DatagramHandler) sees it.

use crate::net::listener::Addr;

/// A datagram received on a `udp://` or `unixgram:` listener, with where it came from and
/// where it was sent to.
#[derive(Debug)]
pub struct Datagram<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) peer: &'a Addr,
    pub(crate) local: &'a Addr,
    pub(crate) worker: u32,
}

impl<'a> Datagram<'a> {
    /// The datagram's bytes (at most `--max-datagram-size`: a longer one is dropped before
    /// it reaches the handler).
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Its sender: the address the answer goes to. A Unix datagram sender that did not bind
    /// its socket has no path (`Addr::Unix(None)`), and cannot be answered.
    pub fn peer(&self) -> &'a Addr {
        self.peer
    }

    /// The address it was sent to: the listener's, or on a wildcard listener
    /// (`udp://0.0.0.0:53`) the local address the sender named, which the answer is sent
    /// from.
    pub fn local(&self) -> &'a Addr {
        self.local
    }

    /// The worker's slot number (1 to the pool size), as in [`WorkerInfo::id`](crate::WorkerInfo).
    pub fn worker(&self) -> u32 {
        self.worker
    }
}

//! The smallest datagram server: every datagram is sent back to its sender, from the
//! address it was sent to. The example to copy for a statsd, syslog, RADIUS or game
//! protocol: one method, `handle_datagram`, with per-worker state in `self`.
//!
//! Run it:
//!
//! ```text
//! cargo run --release --example udp_echo                  # serves udp://127.0.0.1:7007
//! cargo run --release --example udp_echo -- -l 'udp://[::]:7007' -l unixgram:/tmp/echo.dgram
//! ```
//!
//! Try it with Python's standard library (the machine may have no `nc`):
//!
//! ```text
//! python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"hi", ("127.0.0.1", 7007)); print(s.recvfrom(100))'
//! ```
//!
//! What to observe: the answer comes from 127.0.0.1:7007. Bound to a wildcard address
//! (`-l udp://0.0.0.0:7007`) and asked at 127.0.0.2, it answers from 127.0.0.2 (the
//! address the datagram came to), which is what a client checks. `udp_echo status` shows
//! the datagrams received and sent by each worker, `udp_echo metrics` the
//! `appsrv_datagrams_*` counters; `--deny 127.0.0.0/8` drops (never answers) what comes
//! from there and counts it; `--max-answers-per-ip 10` answers ten datagrams per second
//! per source network (a /24: 127.0.0.1 and 127.0.0.2 share ten; `--answers-ipv4-prefix
//! 32` gives each address its own) and drops the rest.
//!
//! I/O model: datagrams are always served from each worker's event loop: a datagram-only
//! server (`run_datagrams`) has no stream connections for `--io` to choose a model for.

use std::io;

use appsrv::{Datagram, DatagramHandler};

/// Counts what it echoed, per worker: state made by the factory after fork.
struct Echo {
    echoed: u64,
}

impl DatagramHandler for Echo {
    fn handle_datagram(&mut self, datagram: &Datagram<'_>, answer: &mut Vec<u8>) -> io::Result<()> {
        self.echoed += 1;
        answer.extend_from_slice(datagram.data());
        Ok(())
    }

    fn on_worker_exit(&mut self) {
        tracing::debug!("echoed {} datagrams", self.echoed);
    }
}

fn main() {
    appsrv::server!()
        .about("Sends every datagram back to its sender")
        .listen("udp://127.0.0.1:7007")
        .run_datagrams(|| Ok(Echo { echoed: 0 }))
        .unwrap_or_else(|e| e.exit());
}

//! The greeting server: says hello to each client, with the client's address, and closes.
//!
//! Run it:
//!
//! ```text
//! cargo run --release --example hello            # serves 127.0.0.1:7000
//! cargo run --release --example hello -- --help  # every option, with its default
//! ```
//!
//! Then, from another terminal:
//!
//! ```text
//! $ nc 127.0.0.1 7000
//! Hello, Client! You are 127.0.0.1:50312
//! ```
//!
//! I/O model: blocking only (`handle_client`); `--io event` is refused at start.
//!
//! What to observe: the log names the bound address, the workers and `ready`; `ps -f
//! --forest` shows one master and its workers; Ctrl-C stops everything.

use std::io::{self, Write};

struct Hello;

impl appsrv::Handler for Hello {
    fn handle_client(&mut self, client: &mut appsrv::Client) -> io::Result<()> {
        let peer = client.peer_addr().clone();
        writeln!(client, "Hello, Client! You are {peer}")
    }
}

fn main() {
    appsrv::server!("hello")
        .about("Greets each client with its address, then closes the connection")
        .listen("127.0.0.1:7000")
        .run(|| Ok(Hello))
        .unwrap_or_else(|e| e.exit());
}

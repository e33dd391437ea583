//! The echo server: sends every line back until the client closes the connection.
//!
//! Run it:
//!
//! ```text
//! cargo run --release --example echo             # serves 127.0.0.1:7001
//! ```
//!
//! Then type lines into `nc 127.0.0.1 7001`: each comes back. No `flush` is needed in the
//! handler: the client's output buffer is flushed before it waits for the next line.
//!
//! What to observe: each open `nc` holds one worker (`--workers`, default one per CPU,
//! at least 2); one more client waits in the listen queue until a worker is free. Send
//! TERM to the master while a client is connected: new connections are refused, the
//! connected client keeps being served until it leaves (or `--grace-period` ends), then
//! the master exits 0.

use std::io::{self, BufRead, Write};

struct Echo;

impl appsrv::Handler for Echo {
    fn handle_client(&mut self, client: &mut appsrv::Client) -> io::Result<()> {
        let mut line = Vec::new();
        loop {
            line.clear();
            if client.read_until(b'\n', &mut line)? == 0 {
                return Ok(()); // the client closed the connection
            }
            client.write_all(&line)?;
        }
    }
}

fn main() -> appsrv::Result<()> {
    appsrv::Server::new("echo")
        .about("Echoes lines back until the client closes the connection")
        .listen("127.0.0.1:7001")
        .run(|| Ok(Echo))
}

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
//! A line may be up to 64 KiB long, its `\n` included (`MAX_LINE`): a longer one gets
//! `error: line too long (limit 65536 bytes)` and the connection is closed; the worker goes
//! on serving. (Read without a limit, a client that never sends `\n` makes its worker hold
//! everything it sends.)
//!
//! I/O model: blocking only (`handle_client` servers read and write their connection
//! themselves, blocking); `--io event` is refused at start.
//!
//! What to observe: each open `nc` holds one worker (`--workers`, default one per CPU,
//! at least 2); one more client waits in the listen queue until a worker is free. Send
//! TERM to the master while a client is connected: new connections are refused, the
//! connected client keeps being served until it leaves (or `--grace-period` ends), then
//! the master exits 0.

use std::io::{self, BufRead, Read, Write};

/// The longest line echoed, its `\n` included.
const MAX_LINE: usize = 64 * 1024;

struct Echo;

impl appsrv::Handler for Echo {
    fn handle_client(&mut self, client: &mut appsrv::Client) -> io::Result<()> {
        let mut line = Vec::new();
        loop {
            line.clear();
            // At most MAX_LINE bytes: `take` stops the read there, `\n` or not.
            let n = Read::take(&mut *client, MAX_LINE as u64).read_until(b'\n', &mut line)?;
            if n == 0 {
                return Ok(()); // the client closed the connection
            }
            if n == MAX_LINE && line.last() != Some(&b'\n') {
                writeln!(client, "error: line too long (limit {MAX_LINE} bytes)")?;
                return client.close();
            }
            client.write_all(&line)?;
        }
    }
}

fn main() {
    appsrv::server!("echo")
        .about("Echoes lines back until the client closes the connection")
        .listen("127.0.0.1:7001")
        .run(|| Ok(Echo))
        .unwrap_or_else(|e| e.exit());
}

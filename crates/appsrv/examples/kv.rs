//! A line-protocol key-value server where each worker keeps its own map: an example of
//! per-worker state, made by the factory after fork and never shared between processes.
//!
//! ```text
//! SET key value   → OK
//! GET key         → VALUE value   or   NOT_FOUND
//! DEL key         → DELETED       or   NOT_FOUND
//! QUIT            → BYE, then the connection is closed
//! ```
//!
//! Run it:
//!
//! ```text
//! cargo run --release --example kv            # serves 127.0.0.1:7003
//! ```
//!
//! What to observe: a value set on one connection is there for later requests of the same
//! connection, but another connection may be served by another worker, with its own map:
//! per-worker state is for caches and connections, not for data that must be shared
//! (for that, the workers need an external store). Run with `-w 1` to see one map.

use std::collections::HashMap;
use std::io;

use appsrv::codec::{Lines, LinesResponse};

struct Kv {
    map: HashMap<Vec<u8>, Vec<u8>>,
}

impl appsrv::RequestHandler for Kv {
    type Codec = Lines;

    fn codec(&self) -> Lines {
        Lines::new(64 * 1024)
    }

    fn handle_request(&mut self, line: &&[u8], out: &mut LinesResponse<'_>) -> io::Result<()> {
        let mut words = line.splitn(3, |b| *b == b' ');
        let cmd = words.next().unwrap_or_default().to_ascii_uppercase();
        let key = words.next();
        let value = words.next();
        match (cmd.as_slice(), key, value) {
            (b"SET", Some(k), Some(v)) => {
                self.map.insert(k.to_vec(), v.to_vec());
                out.push(b"OK\r\n");
            }
            (b"GET", Some(k), None) => match self.map.get(k) {
                Some(v) => {
                    out.push(b"VALUE ");
                    out.push(v);
                    out.push(b"\r\n");
                }
                None => out.push(b"NOT_FOUND\r\n"),
            },
            (b"DEL", Some(k), None) => match self.map.remove(k) {
                Some(_) => out.push(b"DELETED\r\n"),
                None => out.push(b"NOT_FOUND\r\n"),
            },
            (b"QUIT", None, None) => {
                out.push(b"BYE\r\n");
                out.close();
            }
            _ => out.push(b"-ERR unknown command or wrong number of arguments\r\n"),
        }
        Ok(())
    }
}

fn main() -> appsrv::Result<()> {
    appsrv::Server::new("kv")
        .about("A key-value server over a line protocol; each worker keeps its own map")
        .listen("127.0.0.1:7003")
        .run_requests(|| Ok(Kv { map: HashMap::new() }))
}

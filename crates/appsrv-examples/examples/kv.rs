//! A line-protocol key-value server where each worker keeps its own map: an example of
//! per-worker state, made by the factory after fork and never shared between processes,
//! and of per-connection state (the session): the database a connection selected.
//!
//! ```text
//! SELECT n        → OK (databases 0 to 15; a new connection starts in 0)
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
//! `SELECT 1` on one connection changes the database of that connection only: it is kept
//! in the connection's session, which the framework makes for each connection.
//!
//! I/O model: event (`Server::io(Io::Event)` below): every command is answered from the
//! worker's memory without blocking, so one epoll loop per worker serves all its clients;
//! sessions are per connection in either model. `--io blocking` gives the classic model.

use std::collections::HashMap;
use std::io;

use appsrv::Conn;
use appsrv::codec::{Lines, LinesResponse};

/// How many databases `SELECT` chooses from.
const DATABASES: u8 = 16;

struct Kv {
    /// Keyed by (database, key).
    map: HashMap<(u8, Vec<u8>), Vec<u8>>,
}

/// What one connection remembers between its requests.
#[derive(Default)]
struct Session {
    /// The database `SELECT` chose (0 until then).
    db: u8,
}

impl appsrv::RequestHandler for Kv {
    type Codec = Lines;
    type Session = Session;

    fn codec(&self) -> Lines {
        Lines::new(64 * 1024)
    }

    fn handle_request(
        &mut self,
        conn: &mut Conn<'_, Session>,
        line: &&[u8],
        out: &mut LinesResponse<'_>,
    ) -> io::Result<()> {
        let mut words = line.splitn(3, |b| *b == b' ');
        let cmd = words.next().unwrap_or_default().to_ascii_uppercase();
        let key = words.next();
        let value = words.next();
        let db = conn.session().db;
        match (cmd.as_slice(), key, value) {
            (b"SELECT", Some(n), None) => match std::str::from_utf8(n).ok().and_then(|n| n.parse().ok()) {
                Some(n) if n < DATABASES => {
                    conn.session().db = n;
                    out.push(b"OK\r\n");
                }
                _ => out.push(b"-ERR no such database (0 to 15)\r\n"),
            },
            (b"SET", Some(k), Some(v)) => {
                self.map.insert((db, k.to_vec()), v.to_vec());
                out.push(b"OK\r\n");
            }
            (b"GET", Some(k), None) => match self.map.get(&(db, k.to_vec())) {
                Some(v) => {
                    out.push(b"VALUE ");
                    out.push(v);
                    out.push(b"\r\n");
                }
                None => out.push(b"NOT_FOUND\r\n"),
            },
            (b"DEL", Some(k), None) => match self.map.remove(&(db, k.to_vec())) {
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

fn main() {
    appsrv::server!("kv")
        .about("A key-value server over a line protocol; each worker keeps its own map")
        .listen("127.0.0.1:7003")
        .io(appsrv::Io::Event)
        .run_requests(|| Ok(Kv { map: HashMap::new() }))
        .unwrap_or_else(|e| e.exit());
}

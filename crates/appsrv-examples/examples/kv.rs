//! A key-value server that speaks the Redis protocol (RESP2, with the built-in
//! [`Resp`](appsrv::codec::Resp) codec), where each worker keeps its own map: an example of
//! per-worker state, made by the factory after fork and never shared between processes,
//! and of per-connection state (the session): the database a connection selected.
//!
//! Commands, with Redis's replies (errors included):
//!
//! ```text
//! GET key                 → the value, or (nil)
//! SET key value           → OK (no options: `SET k v EX 10` is a syntax error)
//! DEL key [key ...]       → (integer) how many were deleted
//! EXISTS key [key ...]    → (integer) how many exist (a key named twice counts twice)
//! INCR key                → (integer) the new value; a missing key counts from 0
//! SELECT index            → OK (databases 0 to 15; a new connection starts in 0)
//! PING [message]          → PONG, or the message
//! QUIT                    → OK, then the connection is closed
//! CONFIG GET parameter    → save "" and appendonly no (kv keeps nothing on disk);
//!                           an empty array for any other parameter
//! ```
//!
//! `CONFIG GET` is there for `redis-benchmark`, which asks for `save` and `appendonly` when
//! it starts: an empty array (what Redis says of a parameter it does not have) makes it
//! print `ERROR: failed to fetch CONFIG` and `WARNING: Could not fetch server CONFIG`
//! before it runs; the truth about kv (no snapshots, no append-only file) lets it run
//! cleanly.
//!
//! Run it:
//!
//! ```text
//! cargo run --release --example kv            # serves 127.0.0.1:7003
//! redis-cli -p 7003
//! 127.0.0.1:7003> SET colour blue
//! OK
//! 127.0.0.1:7003> GET colour
//! "blue"
//! 127.0.0.1:7003> INCR visits
//! (integer) 1
//! 127.0.0.1:7003> INCR colour
//! (error) ERR value is not an integer or out of range
//! 127.0.0.1:7003> SELECT 1
//! OK
//! 127.0.0.1:7003[1]> GET colour
//! (nil)
//! 127.0.0.1:7003[1]> SELECT 16
//! (error) ERR DB index is out of range
//! redis-benchmark -p 7003 -t set,get,incr,ping -q
//! ```
//!
//! What to observe: a value set on one connection is there for later requests of the same
//! connection, but another connection may be served by another worker, with its own map:
//! per-worker state is for caches and connections, not for data that must be shared
//! (for that, the workers need an external store). Run with `-w 1` to see one map.
//! `SELECT 1` on one connection changes the database of that connection only: it is kept
//! in the connection's session, which the framework makes for each connection.
//! Inline commands work too (`printf 'SET a 1\r\nGET a\r\n' | nc 127.0.0.1 7003`), and
//! pipelined commands (`redis-benchmark -P 16`) are answered in order, their replies
//! written together.
//!
//! I/O model: event (`Server::io(Io::Event)` below): every command is answered from the
//! worker's memory without blocking, so one epoll loop per worker serves all its clients;
//! sessions are per connection in either model. `--io blocking` gives the classic model.

use std::collections::HashMap;
use std::io;

use appsrv::Conn;
use appsrv::codec::{Resp, RespRequest, RespResponse};

/// How many databases `SELECT` chooses from.
const DATABASES: usize = 16;

struct Kv {
    /// One map per database.
    dbs: Vec<HashMap<Vec<u8>, Vec<u8>>>,
}

/// What one connection remembers between its requests.
#[derive(Default)]
struct Session {
    /// The database `SELECT` chose (0 until then).
    db: usize,
}

/// Redis 7's reply to an unknown command: its name and the first of its arguments, each cut
/// so that the list stays near 128 bytes.
fn unknown_command(req: &RespRequest<'_>) -> Vec<u8> {
    let mut args = req.args();
    let name = args.next().unwrap_or_default();
    let mut msg = b"ERR unknown command '".to_vec();
    msg.extend_from_slice(&name[..name.len().min(128)]);
    msg.extend_from_slice(b"', with args beginning with: ");
    let mut listed = 0;
    for arg in args {
        if listed >= 128 {
            break;
        }
        let arg = &arg[..arg.len().min(128 - listed)];
        msg.push(b'\'');
        msg.extend_from_slice(arg);
        msg.extend_from_slice(b"' ");
        listed += arg.len() + 3;
    }
    msg
}

/// Redis's reply to a command with too many or too few arguments.
fn wrong_arity(res: &mut RespResponse<'_>, command: &str) {
    res.error(format!("ERR wrong number of arguments for '{command}' command"));
}

/// A signed 64-bit integer as Redis reads one (`string2ll`): no spaces, no `+`, no leading
/// zeros.
fn integer(bytes: &[u8]) -> Option<i64> {
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) || (digits[0] == b'0' && bytes.len() > 1) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// Sets `key` to `value`, reusing the allocations of the key and of its old value.
fn store(db: &mut HashMap<Vec<u8>, Vec<u8>>, key: &[u8], value: &[u8]) {
    match db.get_mut(key) {
        Some(old) => {
            old.clear();
            old.extend_from_slice(value);
        }
        None => {
            db.insert(key.to_vec(), value.to_vec());
        }
    }
}

impl Kv {
    fn command(&mut self, session: &mut Session, req: &RespRequest<'_>, res: &mut RespResponse<'_>) {
        let mut args = req.args();
        let name = args.next().unwrap_or_default();
        let argc = req.len();
        let db = &mut self.dbs[session.db];
        // Matching on the length first keeps the usual commands to one comparison.
        match name.len() {
            3 if name.eq_ignore_ascii_case(b"GET") => match (argc, args.next()) {
                (2, Some(key)) => match db.get(key) {
                    Some(value) => res.bulk(value),
                    None => res.null(),
                },
                _ => wrong_arity(res, "get"),
            },
            3 if name.eq_ignore_ascii_case(b"SET") => match (argc, args.next(), args.next()) {
                (3, Some(key), Some(value)) => {
                    store(db, key, value);
                    res.simple("OK");
                }
                (0..=2, ..) => wrong_arity(res, "set"),
                _ => res.error("ERR syntax error"),
            },
            3 if name.eq_ignore_ascii_case(b"DEL") => {
                if argc < 2 {
                    return wrong_arity(res, "del");
                }
                let deleted = args.filter(|key| db.remove(*key).is_some()).count();
                res.integer(deleted as i64);
            }
            4 if name.eq_ignore_ascii_case(b"INCR") => match (argc, args.next()) {
                (2, Some(key)) => {
                    let value = match db.get(key) {
                        None => Some(0),
                        Some(v) => integer(v),
                    };
                    match value.map(|n| n.checked_add(1)) {
                        None => res.error("ERR value is not an integer or out of range"),
                        Some(None) => res.error("ERR increment or decrement would overflow"),
                        Some(Some(n)) => {
                            store(db, key, n.to_string().as_bytes());
                            res.integer(n);
                        }
                    }
                }
                _ => wrong_arity(res, "incr"),
            },
            4 if name.eq_ignore_ascii_case(b"PING") => match (argc, args.next()) {
                (1, _) => res.simple("PONG"),
                (2, Some(message)) => res.bulk(message),
                _ => wrong_arity(res, "ping"),
            },
            4 if name.eq_ignore_ascii_case(b"QUIT") => {
                res.simple("OK");
                res.close();
            }
            6 if name.eq_ignore_ascii_case(b"EXISTS") => {
                if argc < 2 {
                    return wrong_arity(res, "exists");
                }
                let found = args.filter(|key| db.contains_key(*key)).count();
                res.integer(found as i64);
            }
            6 if name.eq_ignore_ascii_case(b"SELECT") => match (argc, args.next()) {
                (2, Some(index)) => match integer(index) {
                    None => res.error("ERR value is not an integer or out of range"),
                    Some(n) => match usize::try_from(n) {
                        Ok(n) if n < DATABASES => {
                            session.db = n;
                            res.simple("OK");
                        }
                        _ => res.error("ERR DB index is out of range"),
                    },
                },
                _ => wrong_arity(res, "select"),
            },
            6 if name.eq_ignore_ascii_case(b"CONFIG") => Self::config(req, res),
            _ => res.error(unknown_command(req)),
        }
    }

    /// `CONFIG GET parameter`: the two parameters redis-benchmark asks for (see the top of
    /// the file); no other is known, and no other subcommand.
    fn config(req: &RespRequest<'_>, res: &mut RespResponse<'_>) {
        let sub = req.arg(1).unwrap_or_default();
        if !sub.eq_ignore_ascii_case(b"GET") {
            if req.len() < 2 {
                return wrong_arity(res, "config");
            }
            let mut msg = b"ERR unknown subcommand '".to_vec();
            msg.extend_from_slice(&sub[..sub.len().min(128)]);
            msg.extend_from_slice(b"'. Try CONFIG HELP.");
            return res.error(msg);
        }
        if req.len() != 3 {
            return wrong_arity(res, "config|get");
        }
        let param = req.arg(2).unwrap_or_default().to_ascii_lowercase();
        let value: &[u8] = match param.as_slice() {
            b"save" => b"",
            b"appendonly" => b"no",
            _ => return res.array(0),
        };
        res.array(2);
        res.bulk(&param);
        res.bulk(value);
    }
}

impl appsrv::RequestHandler for Kv {
    type Codec = Resp;
    type Session = Session;

    fn handle_request(
        &mut self,
        conn: &mut Conn<'_, Session>,
        req: &RespRequest<'_>,
        res: &mut RespResponse<'_>,
    ) -> io::Result<()> {
        self.command(conn.session(), req, res);
        Ok(())
    }
}

fn main() {
    appsrv::server!("kv")
        .about("A key-value server that speaks the Redis protocol; each worker keeps its own map")
        .listen("127.0.0.1:7003")
        .io(appsrv::Io::Event)
        .run_requests(|| {
            Ok(Kv {
                dbs: (0..DATABASES).map(|_| HashMap::new()).collect(),
            })
        })
        .unwrap_or_else(|e| e.exit());
}

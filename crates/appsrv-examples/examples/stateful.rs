//! A stateful line server: each connection has its own variables.
//!
//! Run it:
//!
//! ```text
//! cargo run --release --example stateful         # serves 127.0.0.1:7010
//! ```
//!
//! Then, in `nc 127.0.0.1 7010`: `SET color blue` answers `OK`, `GET color` answers `blue`
//! (`(nil)` for a name never set), `COUNT` the number of commands this connection sent.
//! A second `nc` starts with no variables: the state is the connection's
//! ([`RequestHandler::Session`](appsrv::RequestHandler::Session), made with `Default` when
//! the connection is accepted, dropped when it closes). A line that is not UTF-8 ends the
//! connection with a log line that names the client; anything else unknown gets `-ERR`.
//!
//! It is the request-level example of the crate's documentation, line for line (a test
//! holds them equal and the code under 40 lines): the [`Lines`] codec frames the requests
//! (up to 8 KiB, its `Default`), so the handler is one method.
//!
//! I/O model: `--io blocking` (the default) or `--io event` (the handler never blocks).
//! `--io hybrid` is refused at start, with the reason: a session cannot follow a connection
//! that fronts hand from process to process.

use std::collections::HashMap;
use std::io;

use appsrv::Conn;
use appsrv::codec::{Line, Lines, LinesResponse};

/// One connection's state.
#[derive(Default)]
struct Session {
    vars: HashMap<String, String>,
    commands: u64,
}

struct Stateful;

impl appsrv::RequestHandler for Stateful {
    type Codec = Lines;
    type Session = Session;

    fn handle_request(
        &mut self,
        conn: &mut Conn<'_, Session>,
        line: &Line<'_>,
        out: &mut LinesResponse<'_>,
    ) -> io::Result<()> {
        let session = conn.session();
        session.commands += 1;
        match line.to_str()?.split_whitespace().collect::<Vec<_>>()[..] {
            ["SET", name, value] => {
                session.vars.insert(name.to_owned(), value.to_owned());
                out.line("OK");
            }
            ["GET", name] => out.line(session.vars.get(name).map_or("(nil)", String::as_str)),
            ["COUNT"] => out.line(session.commands),
            _ => out.line("-ERR unknown command or wrong number of arguments"),
        }
        Ok(())
    }
}

fn main() {
    appsrv::server!("stateful")
        .listen("127.0.0.1:7010")
        .run_requests(|| Ok(Stateful))
        .unwrap_or_else(|e| e.exit());
}

//! A fifth driver, in the unit tests only (issue 43): it serves one connection it was
//! given (one end of a socket pair), at whatever sync level, then stops.
//!
//! It is the proof that a new I/O model is one file: everything a connection's life
//! leaves in the accounts (the admission's verdict, the request clock, the close by the
//! outcome rule, the recycling count) comes from `life.rs` and the ledger, the request
//! step from the level; what is the driver's own is how it waits, which here is not at
//! all. Nothing outside this file names it, but the `mod` line.

use std::io;
use std::time::Instant;

use socket2::Socket;

use crate::codec::ProtocolError;
use crate::conn::client::{Buffers, Client};
use crate::conn::step::{Context, Head};
use crate::net::listener::Addr;
use crate::scoreboard::Slot;
use crate::sys::exit;

use super::Setup;
use super::driver::{Driver, Extras, Serves, Shared};
use super::ledger::{Ledger, contain};
use super::life::{Ended, Life, Unit};
use super::serve::Connections;

/// The driver: the one connection it serves.
struct One {
    client: Client,
}

impl<'a> Driver<'a> for One {
    /// Nothing to prepare from the system: its connection is made by the test.
    fn prepare(_: &Setup<'a>, _: &'static Slot, _: Extras<'a>) -> Result<Self, String> {
        Err("the one-connection driver is given its connection by its test".into())
    }
}

/// Its side of the step: the connection's life, and the ledger it reports to.
struct Side<'l, 'a> {
    life: &'l mut Life,
    peer: &'l Addr,
    ledger: &'l mut Ledger<'a>,
    refusal: Option<ProtocolError>,
}

impl Context for Side<'_, '_> {
    fn request_start(&mut self, head: Head<'_>) {
        self.life.request_start(self.ledger, head, Instant::now());
    }
    fn request_head(&mut self, head: Head<'_>) {
        self.life.request_head(self.ledger, head);
    }
    fn refused(&mut self, why: &ProtocolError) {
        self.ledger.refused();
        self.refusal = Some(why.clone());
    }
    fn request_end(&mut self, bytes: (u64, u64), ok: bool) {
        self.life
            .request_end(self.ledger, self.peer, Instant::now(), bytes, ok);
    }
}

impl<'a, C: Connections> Serves<'a, C> for One {
    fn serve(mut self, shared: Shared<'a>, level: &mut C) -> i32 {
        let mut ledger = shared.ledger;
        let unit = if level.request_level() {
            Unit::Requests
        } else {
            Unit::Connection
        };
        let peer = self.client.peer_addr().clone();
        let mut life: Life = Life::new(unit);
        life.serve(&mut ledger, &peer);
        life.opened(Instant::now());
        let mut side = Side {
            life: &mut life,
            peer: &peer,
            ledger: &mut ledger,
            refusal: None,
        };
        let served = contain(|| level.serve(&mut self.client, &mut side, None));
        let refusal = side.refusal.take();
        let ended = match &served {
            Ok(Ok(_)) => Ended::of(refusal.as_ref(), None),
            Ok(Err(e)) => Ended::of(refusal.as_ref(), Some(e.kind())),
            Err(_) => Ended::Panicked,
        };
        // What the handler left buffered goes out first, so that it is counted.
        let _ = io::Write::flush(&mut self.client);
        let bytes = self.client.take_traffic();
        life.close(&mut ledger, &peer, ended, bytes, Instant::now);
        let _ = self.client.finish();
        ledger.flush();
        exit::OK
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::net::tls::ForWorker;
    use crate::scoreboard::Board;
    use crate::worker::access::AccessLog;
    use crate::worker::serve::tests::{Echo, LIMITS};
    use crate::worker::serve::{ClientLevel, RequestLevel};
    use crate::worker::{ConnLimits, Recycle};

    /// Serves `input` with `level` through the one-connection driver; returns the
    /// client's output, the access log's lines and the requests counted on the slot.
    fn run<C: Connections>(level: &mut C, input: &[u8], name: &str) -> (String, Vec<String>, u64) {
        let board: &'static Board = Box::leak(Box::new(Board::new().unwrap()));
        let slot = board.slot(1).unwrap();
        let path = std::env::temp_dir().join(format!("appsrv-one-{name}-{}", std::process::id()));
        let log = AccessLog::new(std::fs::File::create(&path).unwrap());
        let tls: &'static ForWorker = Box::leak(Box::default());
        let shared = Shared {
            id: 1,
            board,
            slot,
            listeners: &[],
            tls,
            limits: ConnLimits::default(),
            max_per_ip: None,
            ledger: Ledger::new(
                slot,
                Some(log),
                Recycle::default(),
                Box::new(|| {}),
                Box::new(|| None),
            ),
        };
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let peer = Addr::Inet("192.0.2.43:4300".parse().unwrap());
        let client = Client::new(
            Socket::from(std::os::fd::OwnedFd::from(ours)),
            peer,
            Buffers::new(),
        );
        theirs.write_all(input).unwrap();
        theirs.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(One { client }.serve(shared, level), exit::OK);
        let mut out = String::new();
        theirs.read_to_string(&mut out).unwrap();
        let lines = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        (out, lines.lines().map(str::to_owned).collect(), slot.served().1)
    }

    /// A handler that echoes what it reads, whole.
    struct Whole;

    impl crate::Handler for Whole {
        fn handle_client(&mut self, client: &mut Client) -> io::Result<()> {
            let mut all = String::new();
            client.read_to_string(&mut all)?;
            client.write_all(all.as_bytes())
        }
    }

    /// Issue 43's proof of the seam: a fifth driver, this file alone, serves the request
    /// level with the same accounts as every driver: each request answered, counted and
    /// logged `ok`; a request left unanswered when the client closed logged `closed`.
    #[test]
    fn issue_43_a_fifth_driver_in_one_file_serves_the_request_level() {
        let mut level = RequestLevel::new(Echo, LIMITS);
        let (out, lines, served) = run(&mut level, b"one\ntwo\nhal", "requests");
        assert_eq!(out, "one\ntwo\n");
        assert_eq!(served, 2, "two requests counted on the slot");
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[0].contains(" 192.0.2.43:4300 ok ") && lines[0].ends_with("\"one\""),
            "{lines:?}"
        );
        assert!(
            lines[1].contains(" ok ") && lines[1].ends_with("\"two\""),
            "{lines:?}"
        );
        assert!(
            lines[2].contains(" closed ") && lines[2].ends_with("\"hal\""),
            "{lines:?}"
        );
    }

    /// And the client level: one line for the connection, `ok` when the handler returned.
    #[test]
    fn issue_43_a_fifth_driver_in_one_file_serves_the_client_level() {
        let mut level = ClientLevel(Whole);
        let (out, lines, _) = run(&mut level, b"hello", "client");
        assert_eq!(out, "hello");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains(" 192.0.2.43:4300 ok ") && lines[0].contains("in=5 out=5"),
            "{lines:?}"
        );
    }
}

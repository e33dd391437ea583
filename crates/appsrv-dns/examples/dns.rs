//! An authoritative DNS server for zones read from RFC 1035 master files, over UDP and TCP
//! on the same port: the datagram level (`DatagramHandler`) beside the request level with a
//! length-prefixed codec, in one `Server`.
//!
//! ```text
//! dns --zone FILE [--zone FILE…] [-l udp://ADDR:PORT -l ADDR:PORT]
//! ```
//!
//! Run it with the sample zone beside this file (`example.test.`, see its comments):
//!
//! ```text
//! cargo run --release --example dns -- --zone crates/appsrv-dns/examples/dns.zone
//!                                       # serves udp://127.0.0.1:5353 and 127.0.0.1:5353 (TCP)
//! dig @127.0.0.1 -p 5353 www.example.test A          # NOERROR, flags: qr aa rd; an A record
//! dig @127.0.0.1 -p 5353 www.example.test A +tcp     # the same over TCP
//! dig @127.0.0.1 -p 5353 alias.example.test A        # a CNAME chain, then the target's A
//! dig @127.0.0.1 -p 5353 nope.example.test A         # NXDOMAIN, the SOA in AUTHORITY
//! dig @127.0.0.1 -p 5353 www.example.test MX         # NODATA: NOERROR, no answer, the SOA
//! dig @127.0.0.1 -p 5353 www.example.org A           # REFUSED: not a zone of this server
//! dig @127.0.0.1 -p 5353 big.example.test TXT +ignore +noedns  # flags: tc (over 512 bytes)
//! dig @127.0.0.1 -p 5353 big.example.test TXT +noedns # dig retries over TCP: the whole
//! dns reload                                          # re-reads the zones (also SIGHUP)
//! ```
//!
//! `--zone FILE` may be repeated; `--zone NAME=FILE` names the zone of a file that has no
//! `$ORIGIN` (and checks that its SOA is there). Without any `--zone`, `run`, `start` and
//! `check` stop with an error before anything is bound. `-l` replaces both default
//! listeners (`udp://127.0.0.1:5353` and `127.0.0.1:5353`): give one `udp://` and one TCP
//! address, usually the same port. `--max-udp-size` (default 1232, 512 to 4096) is the
//! largest UDP answer: a client's EDNS size is clamped to `[512, --max-udp-size]`, 512 bytes
//! without EDNS; 1232 is what NSD and Knot use, to avoid IP fragmentation.
//!
//! What is served: SOA, NS, A, AAAA, CNAME, MX, TXT, and any other type hickory-proto
//! parses, with `$ORIGIN`, `$TTL`, `@`, relative and absolute names; no wildcards (refused
//! at load), no `$INCLUDE`, no zone transfers (AXFR and IXFR are REFUSED), class IN only.
//! A record without a TTL gets `$TTL`'s (RFC 2308), before any `$TTL` the last one written;
//! the records of an RRset share the lowest of their TTLs.
//! Answers: the header's QR and AA set, the opcode echoed, RD and CD copied, RA clear;
//! NXDOMAIN and NODATA with the zone's SOA in AUTHORITY (its TTL the smaller of the SOA's
//! TTL and its minimum, RFC 2308); a CNAME followed inside its zone (the chain, then the
//! target's records; at most 8 links, a loop stops it), its RCODE the last name's; below a
//! delegation (NS records below the apex), a referral (AA clear, the glue in ADDITIONAL,
//! truncated if the glue does not fit, RFC 9471); the addresses of MX and NS targets in the
//! zone in ADDITIONAL, left out (without TC) when they do not fit; REFUSED for a name no zone holds; TC=1 with only the question when the
//! ANSWER and AUTHORITY sections do not fit. EDNS(0): an OPT in the answer when the query
//! had one (the DO bit copied), the query's options (dig's COOKIE) ignored, BADVERS for a
//! version other than 0. Malformed queries: FORMERR (the header alone, its id echoed) when
//! the header is readable (QDCOUNT other than 1, a name that runs past the end or has a
//! compression pointer, records that run past the end, two OPTs); NOTIMP for an opcode
//! other than QUERY; dropped, never answered: shorter than a header, or QR=1 (an answer:
//! answering it could start a loop between two servers). Over TCP, a query that would be
//! dropped closes the connection.
//!
//! Answers over UDP are rate limited by default, against reflection attacks (a forged
//! source gets answers several times the size of its queries: the sample zone's `big` TXT
//! is about 15 times its query): at most 200 per second to one source network, an IPv4 /24
//! or an IPv6 /56, as NSD's defaults (`--max-answers-per-ip 200`, `--answers-ipv4-prefix`,
//! `--answers-ipv6-prefix`; `--max-answers-per-ip 0` turns it off, for a benchmark from one
//! address). Over the rate, one query in `--answers-slip` (2) "slips": it is answered TC=1
//! with the question alone, so that a real resolver retries over TCP, which is not
//! limited; the others are dropped.
//!
//! Reload (`dns reload` or SIGHUP) re-reads every zone file in the master; a zone that
//! does not load fails the reload with its error, and the workers keep serving the zones
//! they have. The zones are parsed in the master before the workers fork, so the workers
//! share them copy-on-write.
//!
//! # Design: precomputed answers
//!
//! Every answer the zones can give is built at load time (the engine, `dns/engine.rs`,
//! explains how): the query path reads the header and the question by hand (bounds
//! checks, the name's labels walked, copied and lowercased), looks the name up in one hash
//! table, and copies the precomputed sections behind the client's own question, with the
//! id and flags set; no message is decoded or encoded per query, nothing is allocated.
//! Measured with `cargo bench -p appsrv-dns --bench dns` (in memory, the thread's CPU time,
//! on the 2-core machine the benchmarks run on): about 110–125 ns per query for a
//! one-record or an eight-record answer to dig's query (RD, EDNS with a COOKIE), 145 ns
//! for NXDOMAIN (a second lookup, and the pointers moved), 9 ns for a FORMERR; against
//! 2.5–4.3 µs to decode the same query, build and encode the same answer through
//! hickory-proto's `Message` (the bench's `hickory` group), 20 to 35 times as much. The
//! system calls of a datagram cost some 5–10 µs: through `Message`, the server's own work
//! would add a third to a half to the cost of each query; precomputed, a few per cent,
//! which is how NSD and Knot answer too.
//!
//! # Crate
//!
//! hickory-proto 0.25, without default features (`std` and `text-parsing`: no tokio, no
//! async runtime, no threads): the most used DNS library in Rust, well kept. It parses each
//! record's data, the names and the TTL values of the master files, encodes the data of
//! the types the engine does not compress, and decodes answers in the tests, the fuzz
//! target and the benchmark. The entries of the master files (`$ORIGIN`, `$TTL`, owners,
//! parentheses, comments) are read by the engine, not by hickory-proto's zone `Parser`,
//! which in 0.25 gives the SOA record its expire field as TTL and lets an explicit TTL
//! become the default of the records after it despite `$TTL`, so that TTLs would differ
//! from what BIND, NSD and Knot serve. 0.26 no longer has the zone parser and needs Rust
//! 1.88; NLnet Labs' `domain` needs 1.87; the workspace is on 1.85.
//!
//! I/O model: event (`Server::io(Io::Event)`): datagrams are always served from the
//! workers' event loops, and the TCP side answers from memory without blocking, so one
//! loop per worker serves both.

#[path = "dns/engine.rs"]
mod engine;

use std::cell::RefCell;
use std::io;
use std::rc::Rc;

use appsrv::codec::{LengthPrefixed, LengthResponse, Prefix};
use appsrv::{Conn, Datagram, DatagramHandler};

use engine::{Outcome, Transport, ZoneSource, Zones};

#[derive(clap::Args, Debug)]
struct Args {
    /// A zone to serve: its master file, or NAME=FILE for a file without $ORIGIN.
    /// Repeatable; at least one is required by run, start and check.
    #[arg(long, value_name = "[NAME=]FILE")]
    zone: Vec<ZoneSource>,
    /// The largest UDP answer, in bytes (512 to 4096; default 1232, as NSD and Knot): a
    /// client's EDNS size is clamped to [512, this]; without EDNS, 512.
    #[arg(long, value_name = "BYTES", default_value_t = engine::DEFAULT_MAX_UDP,
          value_parser = clap::value_parser!(u16).range(i64::from(engine::MIN_UDP)..=i64::from(engine::MAX_UDP)))]
    max_udp_size: u16,
}

/// The UDP side of a worker.
struct Udp {
    zones: Rc<Zones>,
    max_udp: u16,
}

impl DatagramHandler for Udp {
    fn handle_datagram(&mut self, datagram: &Datagram<'_>, answer: &mut Vec<u8>) -> io::Result<()> {
        match engine::answer(&self.zones, datagram.data(), Transport::Udp, self.max_udp, answer) {
            Outcome::Answered(_) => Ok(()),
            // Counted and logged (at debug level) by appsrv as a datagram not answered.
            Outcome::Dropped(why) => Err(io::Error::new(io::ErrorKind::InvalidData, why)),
        }
    }

    fn slip(&mut self, datagram: &Datagram<'_>, answer: &mut Vec<u8>) {
        let _ = engine::answer(
            &self.zones,
            datagram.data(),
            Transport::Slip,
            self.max_udp,
            answer,
        );
    }
}

/// The TCP side of a worker: each query a 2-byte length-prefixed frame (RFC 1035 §4.2.2).
struct Tcp {
    zones: Rc<Zones>,
    max_udp: u16,
    /// The answer being built, reused between queries.
    scratch: Vec<u8>,
}

impl appsrv::RequestHandler for Tcp {
    type Codec = LengthPrefixed;
    type Session = ();

    fn codec(&self) -> LengthPrefixed {
        LengthPrefixed::new(Prefix::U16)
    }

    fn handle_request(
        &mut self,
        _conn: &mut Conn<'_>,
        query: &&[u8],
        out: &mut LengthResponse<'_>,
    ) -> io::Result<()> {
        match engine::answer(
            &self.zones,
            query,
            Transport::Tcp,
            self.max_udp,
            &mut self.scratch,
        ) {
            Outcome::Answered(_) => {
                out.push(&self.scratch);
                Ok(())
            }
            // An error ends the connection, and nothing is sent for this frame.
            Outcome::Dropped(why) => Err(io::Error::new(io::ErrorKind::InvalidData, why)),
        }
    }
}

/// The subcommand, as appsrv will read it: the zones are loaded for run and start only.
fn subcommand() -> String {
    match std::env::args_os().nth(1).as_deref().and_then(|a| a.to_str()) {
        Some("-t") => "check".into(),
        Some(
            s @ ("start" | "stop" | "check" | "reload" | "upgrade" | "status" | "metrics" | "workers"
            | "help" | "completions" | "man"),
        ) => s.into(),
        _ => "run".into(),
    }
}

fn load(sources: &[ZoneSource]) -> Result<Zones, String> {
    if sources.is_empty() {
        return Err("no zone to serve: give at least one --zone FILE".into());
    }
    Zones::load(sources)
}

fn main() {
    serve().unwrap_or_else(|e| e.exit());
}

fn serve() -> appsrv::Result<()> {
    let mut server = appsrv::server!("dns")
        .about("An authoritative DNS server for zone files, over UDP and TCP")
        .listen("udp://127.0.0.1:5353")
        .listen("127.0.0.1:5353")
        // NSD's default response rate limit (rrl-ratelimit 200, per IPv4 /24 and IPv6 /56).
        .max_answers_per_ip(200)
        .io(appsrv::Io::Event);
    let args: Args = server.args();
    let sub = subcommand();
    // Loaded here, in the master, before anything is bound: a bad zone stops `run` and
    // `start` with the reason on the terminal, and the workers inherit the zones.
    let initial = if sub == "run" || sub == "start" {
        load(&args.zone).map_err(appsrv::Error::Config)?
    } else {
        Zones::from_texts(&[]).map_err(appsrv::Error::Config)?
    };
    let current = Rc::new(RefCell::new(Rc::new(initial)));
    let (reloaded, for_udp, for_tcp) = (Rc::clone(&current), Rc::clone(&current), current);
    let (for_reload, for_check) = (args.zone.clone(), args.zone);
    let max_udp = args.max_udp_size;
    server
        .on_reload(move || {
            // A zone that does not load fails the reload; the workers keep the zones they have.
            let zones = load(&for_reload)?;
            tracing::info!("zones reloaded: {}", zones.summary());
            *reloaded.borrow_mut() = Rc::new(zones);
            Ok(())
        })
        .on_check(move || {
            let zones = load(&for_check)?;
            tracing::info!("zones ok: {}", zones.summary());
            Ok(())
        })
        .datagrams(move || {
            let zones = Rc::clone(&*for_udp.borrow());
            tracing::debug!("serving {}", zones.summary());
            Ok(Udp { zones, max_udp })
        })
        .run_requests(move || {
            Ok(Tcp {
                zones: Rc::clone(&*for_tcp.borrow()),
                max_udp,
                scratch: Vec::with_capacity(4096),
            })
        })
}

//! The `dns` example's query path (`crates/appsrv-dns/examples/dns/engine.rs`, included as it
//! is: the engine has no appsrv dependency) on arbitrary bytes, against the zones of its
//! tests (`crates/appsrv/tests/data/dns/`). The first byte chooses the transport (bits
//! 0–1: UDP, TCP, a rate-limit slip) and `--max-udp-size` (bit 2: 1232 or 4096); the rest is
//! the query.
//!
//! Panics (a finding) if the engine panics, answers what it must drop (shorter than a
//! header, QR=1) or drops anything else, or if an answer does not decode (hickory-proto),
//! does not echo the id and the opcode, lacks QR, or is larger than the transport allows.
#![no_main]

#[path = "../../crates/appsrv-dns/examples/dns/engine.rs"]
#[allow(dead_code)]
mod engine;

use std::str::FromStr;
use std::sync::OnceLock;

use engine::{Outcome, Transport, Zones};
use hickory_proto::op::Message;
use hickory_proto::rr::Name;
use libfuzzer_sys::fuzz_target;

fn zones() -> &'static Zones {
    static ZONES: OnceLock<Zones> = OnceLock::new();
    ZONES.get_or_init(|| {
        let zone = include_str!("../../crates/appsrv/tests/data/dns/zone.test");
        let second = include_str!("../../crates/appsrv/tests/data/dns/second.test");
        Zones::from_texts(&[
            (None, zone.to_owned(), "zone.test".into()),
            (Some(Name::from_str("second.test.").unwrap()), second.to_owned(), "second.test".into()),
        ])
        .expect("the test zones load")
    })
}

fuzz_target!(|data: &[u8]| {
    let [control, query @ ..] = data else {
        return;
    };
    let transport = match control & 3 {
        0 | 3 => Transport::Udp,
        1 => Transport::Tcp,
        _ => Transport::Slip,
    };
    let max_udp = if control & 4 == 0 { engine::DEFAULT_MAX_UDP } else { engine::MAX_UDP };
    let mut out = Vec::new();
    let outcome = engine::answer(zones(), query, transport, max_udp, &mut out);
    let must_drop = query.len() < engine::HEADER || query[2] & 0x80 != 0;
    match outcome {
        Outcome::Dropped(_) => {
            assert!(must_drop, "dropped a query with a readable header");
            assert!(out.is_empty(), "dropped, yet an answer was written");
        }
        Outcome::Answered(rcode) => {
            assert!(!must_drop, "answered what must be dropped");
            let m = Message::from_vec(&out).unwrap_or_else(|e| panic!("an answer that does not decode: {e}: {out:02x?}"));
            assert_eq!(out[..2], query[..2], "the id");
            assert_eq!(out[2] & 0x80, 0x80, "QR");
            assert_eq!(out[2] & 0x78, query[2] & 0x78, "the opcode");
            assert_eq!(out[3] & 0x80, 0, "RA");
            let limit = match transport {
                Transport::Tcp => usize::from(u16::MAX),
                // Without EDNS 512; with it, at most --max-udp-size.
                _ if m.extensions().is_none() => 512,
                _ => usize::from(max_udp),
            };
            assert!(out.len() <= limit, "{} bytes over {transport:?}, limit {limit}", out.len());
            // A slip answers a good query with TC and no records.
            if transport == Transport::Slip && rcode == 0 {
                assert!(m.truncated() && m.answers().is_empty(), "a slip that is not truncated");
            }
        }
    }
});

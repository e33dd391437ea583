//! What one query costs the `dns` example, in memory (no socket, no system call): its
//! precomputed answers (`examples/dns/engine.rs`, included here as it is) against decoding
//! and encoding each message through hickory-proto, the choice the example's header
//! explains.
//!
//! ```text
//! cargo bench -p appsrv-dns --bench dns
//! cargo bench -p appsrv-dns --bench dns -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Times are the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`, through Criterion's
//! `iter_custom`), not the wall clock: on the 2 cores this runs on, shared with builds and
//! other benchmarks, the time the thread waits for a core would otherwise dominate.
//!
//! The zone: 10,000 hosts with one A record each, `eight` with eight A records, the apex's
//! SOA and NS. The queries are what `dig` sends by default: RD, an EDNS OPT of 1232 bytes
//! with a COOKIE option; over UDP (the size check included).
//!
//! - `precomputed/{a_1,a_8,nxdomain,formerr}`: `engine::answer`, the example's hot path: the
//!   header and question parsed by hand, one hash lookup, the answer copied behind the
//!   question (for NXDOMAIN, its pointers moved), into a reused buffer;
//! - `hickory/{a_1,a_8,nxdomain}`: the same answers the way a server built on the crate's
//!   `Message` would make them: `Message::from_vec` of the query, a lookup of the records
//!   in a `HashMap` keyed by lowercase name and type (cloned into the answer), the answer
//!   `Message` built and `to_vec`. It does less than the example (no CNAME chase, no
//!   additional section) and is still what the example would pay per query without
//!   precomputation.

#[path = "../examples/dns/engine.rs"]
#[allow(dead_code)]
mod engine;

use std::collections::HashMap;
use std::hint::black_box;
use std::str::FromStr;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hickory_proto::op::{Edns, Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
use hickory_proto::rr::{LowerName, Name, Record, RecordType};

fn zone_text() -> String {
    let mut z = String::from(
        "$ORIGIN bench.test.\n$TTL 3600\n@ IN SOA ns admin 1 3600 600 86400 300\n  IN NS ns\nns IN A 192.0.2.1\n",
    );
    for i in 0..8 {
        z.push_str(&format!("eight IN A 192.0.2.{}\n", 10 + i));
    }
    for i in 0..10_000 {
        z.push_str(&format!(
            "h{i} IN A 10.{}.{}.{}\n",
            i >> 16,
            (i >> 8) & 0xff,
            i & 0xff
        ));
    }
    z
}

/// A query as dig sends it: RD, EDNS 1232 with an 8-byte client COOKIE.
fn query(name: &str) -> Vec<u8> {
    let mut q = Message::new();
    q.set_id(0x1234).set_recursion_desired(true);
    q.add_query(Query::query(Name::from_str(name).unwrap(), RecordType::A));
    let mut e = Edns::new();
    e.set_max_payload(1232);
    e.options_mut().insert(EdnsOption::Unknown(
        u16::from(EdnsCode::Cookie),
        vec![1, 2, 3, 4, 5, 6, 7, 8],
    ));
    q.set_edns(e);
    q.to_vec().unwrap()
}

/// The records of the zone by (lowercase name, type), and its SOA: what a server answering
/// through hickory-proto's `Message` would keep.
struct Plain {
    records: HashMap<(LowerName, RecordType), Vec<Record>>,
    soa: Record,
}

impl Plain {
    fn new(text: &str) -> Plain {
        let (_, sets) = hickory_proto::serialize::txt::Parser::new(text, None, None)
            .parse()
            .unwrap();
        let mut records = HashMap::new();
        let mut soa = None;
        for (key, set) in sets {
            let rs: Vec<Record> = set.records_without_rrsigs().cloned().collect();
            if key.record_type == RecordType::SOA {
                soa = Some(rs[0].clone());
            }
            records.insert((key.name().clone(), key.record_type), rs);
        }
        Plain {
            records,
            soa: soa.unwrap(),
        }
    }

    fn answer(&self, query: &[u8]) -> Vec<u8> {
        let q = Message::from_vec(query).unwrap();
        let mut a = Message::new();
        a.set_id(q.id())
            .set_message_type(MessageType::Response)
            .set_op_code(q.op_code())
            .set_authoritative(true)
            .set_recursion_desired(q.recursion_desired());
        let question = q.queries()[0].clone();
        let key = (LowerName::new(question.name()), question.query_type());
        match self.records.get(&key) {
            Some(rs) => {
                a.insert_answers(rs.clone());
            }
            None => {
                a.set_response_code(ResponseCode::NXDomain);
                a.add_name_server(self.soa.clone());
            }
        }
        a.add_query(question);
        if q.extensions().is_some() {
            let mut e = Edns::new();
            e.set_max_payload(1232);
            a.set_edns(e);
        }
        a.to_vec().unwrap()
    }
}

/// The calling thread's CPU time.
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, which lives on this stack.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime: {}", std::io::Error::last_os_error());
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `f` `iters` times; returns the CPU time it took.
fn on_cpu(iters: u64, mut f: impl FnMut()) -> Duration {
    let start = cpu_time();
    for _ in 0..iters {
        f();
    }
    cpu_time() - start
}

fn bench(c: &mut Criterion) {
    let text = zone_text();
    let zones = engine::Zones::from_texts(&[(None, text.clone(), "bench".into())]).unwrap();
    let plain = Plain::new(&text);
    let cases = [
        ("a_1", query("h4711.bench.test.")),
        ("a_8", query("eight.bench.test.")),
        ("nxdomain", query("nope.h4711.bench.test.")),
    ];
    let mut g = c.benchmark_group("precomputed");
    let mut out = Vec::with_capacity(4096);
    let udp = |q: &[u8], out: &mut Vec<u8>| {
        engine::answer(&zones, q, engine::Transport::Udp, engine::DEFAULT_MAX_UDP, out);
    };
    for (name, q) in &cases {
        g.bench_function(*name, |b| {
            b.iter_custom(|n| {
                on_cpu(n, || {
                    udp(black_box(q), &mut out);
                    black_box(&out);
                })
            })
        });
    }
    let mut bad = cases[0].1.clone();
    bad[5] = 2; // QDCOUNT 2
    g.bench_function("formerr", |b| {
        b.iter_custom(|n| {
            on_cpu(n, || {
                udp(black_box(&bad), &mut out);
                black_box(&out);
            })
        })
    });
    g.finish();
    let mut g = c.benchmark_group("hickory");
    for (name, q) in &cases {
        // The same answer records as the engine's (the sanity check of the comparison).
        udp(q, &mut out);
        let mine = Message::from_vec(&out).unwrap();
        let theirs = Message::from_vec(&plain.answer(q)).unwrap();
        assert_eq!(mine.answers(), theirs.answers(), "{name}");
        assert_eq!(mine.response_code(), theirs.response_code(), "{name}");
        g.bench_function(*name, |b| {
            b.iter_custom(|n| {
                on_cpu(n, || {
                    black_box(plain.answer(black_box(q)));
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

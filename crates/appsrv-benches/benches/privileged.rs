//! The cost of one call to the privileged helper (issue 18): a request and its response
//! over the real channel, through the worker's own `Helper::call`.
//!
//! ```text
//! cargo bench -p appsrv-benches --bench privileged
//! cargo bench -p appsrv-benches --bench privileged -- call/u64      # only the tiny call
//! cargo bench -p appsrv-benches --bench privileged -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! The channel is the crate's own (`wire::pair`: a `SOCK_SEQPACKET` socket pair with its
//! buffers raised), the helper side the crate's own loop (`helper::serve`: receive, check
//! the header, decode the request, `handle`, encode, send), the worker side
//! `privileged::helper::<P>().call(..)` (encode, send, `poll` with the timeout, receive,
//! check, decode), both reached through `appsrv::bench_support`, which is not part of the
//! API. The helper runs in a thread of this process rather than a forked process with its
//! confinement: the work per call is the same (two datagrams, two wake-ups, a context
//! switch each way), a thread only spares the switch between address spaces. With
//! `--sandbox`, the helper's seccomp filter adds its cost to each of its system calls.
//!
//! What it measures, each a whole round trip (µs per call is Criterion's `time`):
//!
//! - `call/u64`: a tiny request and response (a `u64` each, a few bytes of payload): the
//!   floor of a call;
//! - `call/bytes_64k`: a tiny request answered with 64 KiB of bytes (`Vec<u8>`, the most a
//!   `runas` command's output holds), serialized byte by byte as serde does a `Vec<u8>`;
//! - `call/string_64k`: the same 64 KiB as a `String` (one copy, no per-byte work);
//! - `call/fd`: a response with a descriptor (`Fd`, a `dup` of an open `/dev/null` in the
//!   helper), received as `SCM_RIGHTS` and closed by the worker;
//! - `floor/datagram_echo`: 16 bytes to a thread and back on a plain `UnixDatagram` pair
//!   (std), no framing, no serde: what the channel's system calls and wake-ups cost alone.

use std::hint::black_box;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use appsrv::bench_support::{privileged_pair, privileged_serve, privileged_set_worker_end};
use appsrv::privileged::{self, Caller, Fd, Privileged};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde::{Deserialize, Serialize};

/// The size of the large responses: `runas`'s output limit.
const OUTPUT: usize = 64 * 1024;

#[derive(Serialize, Deserialize)]
enum Request {
    /// Answered with `n + 1`.
    Tiny(u64),
    /// Answered with `OUTPUT` bytes.
    Bytes,
    /// Answered with `OUTPUT` bytes as a string.
    Text,
    /// Answered with a descriptor.
    Open,
}

#[derive(Serialize, Deserialize)]
enum Response {
    Tiny(u64),
    Bytes(Vec<u8>),
    Text(String),
    Opened(Fd),
}

/// A helper with no privilege to use: it answers from memory (and `dup`s a descriptor).
struct Trivial {
    output: Vec<u8>,
    text: String,
    null: std::fs::File,
}

impl Privileged for Trivial {
    type Request = Request;
    type Response = Response;

    fn handle(&mut self, request: Request, _caller: &Caller) -> Response {
        match request {
            Request::Tiny(n) => Response::Tiny(n + 1),
            Request::Bytes => Response::Bytes(self.output.clone()),
            Request::Text => Response::Text(self.text.clone()),
            Request::Open => Response::Opened(OwnedFd::from(self.null.try_clone().expect("dup")).into()),
        }
    }
}

/// Starts the helper's loop in a thread on a new channel, and installs the worker's end
/// for `Helper::call`. The thread ends when the process does (the worker's end stays
/// installed until then).
fn start_helper() {
    let (worker, helper) = privileged_pair().expect("the channel");
    std::thread::spawn(move || {
        let mut trivial = Trivial {
            output: (0..OUTPUT).map(|i| i as u8).collect(),
            text: "x".repeat(OUTPUT),
            null: std::fs::File::open("/dev/null").expect("open /dev/null"),
        };
        privileged_serve(&mut trivial, helper.as_fd(), 1);
    });
    privileged_set_worker_end(worker, Duration::from_secs(10));
}

fn call(c: &mut Criterion) {
    start_helper();
    let helper = privileged::helper::<Trivial>();
    // One call first: the helper thread is running and answers.
    assert!(matches!(helper.call(&Request::Tiny(1)), Ok(Response::Tiny(2))));
    let mut g = c.benchmark_group("call");

    g.bench_function("u64", |b| {
        b.iter(|| match helper.call(black_box(&Request::Tiny(41))) {
            Ok(Response::Tiny(n)) => black_box(n),
            _ => panic!("the tiny call failed"),
        })
    });

    g.throughput(Throughput::Bytes(OUTPUT as u64));
    g.bench_function("bytes_64k", |b| {
        b.iter(|| match helper.call(&Request::Bytes) {
            Ok(Response::Bytes(out)) => {
                assert_eq!(out.len(), OUTPUT);
                black_box(out)
            }
            _ => panic!("the 64 KiB call failed"),
        })
    });
    g.bench_function("string_64k", |b| {
        b.iter(|| match helper.call(&Request::Text) {
            Ok(Response::Text(out)) => {
                assert_eq!(out.len(), OUTPUT);
                black_box(out)
            }
            _ => panic!("the 64 KiB string call failed"),
        })
    });

    g.throughput(Throughput::Elements(1));
    g.bench_function("fd", |b| {
        b.iter(|| match helper.call(&Request::Open) {
            // Dropped: the worker closes its copy, as one that is done with it would.
            Ok(Response::Opened(fd)) => drop(black_box(fd)),
            _ => panic!("the descriptor call failed"),
        })
    });
    g.finish();
}

fn floor(c: &mut Criterion) {
    let (near, far) = UnixDatagram::pair().expect("a datagram pair");
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok(n) = far.recv(&mut buf) {
            if far.send(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let mut g = c.benchmark_group("floor");
    g.bench_function("datagram_echo", |b| {
        let mut buf = [0u8; 64];
        b.iter(|| {
            near.send(black_box(b"0123456789abcdef")).expect("send");
            black_box(near.recv(&mut buf).expect("recv"))
        })
    });
    g.finish();
}

criterion_group!(benches, call, floor);
criterion_main!(benches);

//! Micro-benchmarks of the scoreboard: the shared-memory slots a worker updates on every
//! request and connection, and the master's reading of them.
//!
//! ```text
//! cargo bench -p appsrv-benches --bench scoreboard
//! cargo bench -p appsrv-benches --bench scoreboard -- worker    # only the worker's updates
//! cargo bench -p appsrv-benches --bench scoreboard -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! The scoreboard is crate-private; the benchmark reaches it through
//! `appsrv::bench_support`, a thin wrapper that is not part of the API. The board is a
//! real one (the same `MAP_SHARED` anonymous mapping the master makes before forking), in
//! this one process: no fork, so no other process writes to it, and the figures are those
//! of uncontended cache lines. With workers on other CPUs, the master's reads and the
//! shared idle counter cost cache-line transfers on top of these.
//!
//! What it measures:
//!
//! - `worker/request`: what the request loop does to the board for each request of a
//!   keep-alive connection: the idle-count load (is the pool saturated?),
//!   `request_start` with the request's first 64 bytes, the states `Handling` then
//!   `Reading`, and `request_end` (count, duration histogram); and each of these alone
//!   (`worker/request_start`, `worker/request_end`, `worker/state_pair`, `worker/idle`),
//!   and the monotonic clock read that `request_start`, `request_end`, `connection` and
//!   `read` each make (`worker/clock`: `clock_gettime` through the vDSO);
//! - `worker/connection`: what a worker does for each connection accepted: leave `Idle`
//!   (the shared idle count, the spare check), `connection()` with the client's address,
//!   and back to `Idle` when it ends; `worker/connections_from` is the per-address cap's
//!   count (`--max-conns-per-ip`): a scan of all 1024 slots;
//! - `master/read`: the master's copy of one slot (`read`), and of every worker of a
//!   pool of 32 with the one-letter scoreboard line, as `status` builds it
//!   (`master/status/32`), and the scoreboard line of all 1024 slots
//!   (`master/status/1024`).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use appsrv::Addr;
use appsrv::bench_support::{Board, HEAD_BYTES, MAX_WORKERS, State, now_ns};
use criterion::{Criterion, criterion_group, criterion_main};

/// The first bytes of a request, as the request loop passes them to `request_start`.
const HEAD: &[u8] = b"GET /api/v1/items?page=2&sort=name HTTP/1.1\r\nHost: app.example.com\r\nUser-Agent: x";

/// Workers in the benchmark's pool.
const WORKERS: u32 = 32;

/// A board with `WORKERS` workers: even ids idle, odd ids reading on a connection from a
/// client each; worker 1 is the one whose slot the worker benchmarks update.
fn board() -> Board {
    let board = Board::new().expect("map the scoreboard");
    for id in 1..=WORKERS {
        board.claim(id, 1);
        board.set_pid(id, 10_000 + id);
        if id % 2 == 0 {
            board.set_state(id, State::Idle);
        } else {
            let slot = board.slot(id).unwrap();
            let peer = Addr::Inet((Ipv4Addr::new(192, 0, 2, id as u8), 40_000 + id as u16).into());
            board.set_state(id, State::Reading);
            slot.connection(&peer);
            let t = slot.request_start(HEAD);
            slot.request_end(t, true);
        }
    }
    board
}

fn worker(c: &mut Criterion) {
    let board = board();
    let id = 1;
    let slot = board.slot(id).unwrap();
    let head = &HEAD[..HEAD_BYTES];
    let mut g = c.benchmark_group("worker");

    g.bench_function("request", |b| {
        b.iter(|| {
            black_box(board.idle() == 0);
            let started = slot.request_start(black_box(head));
            board.set_state(id, State::Handling);
            board.set_state(id, State::Reading);
            slot.request_end(started, true);
        })
    });
    g.bench_function("request_start", |b| {
        b.iter(|| slot.request_start(black_box(head)))
    });
    g.bench_function("request_end", |b| {
        let started = slot.request_start(head);
        b.iter(|| slot.request_end(black_box(started), true))
    });
    g.bench_function("state_pair", |b| {
        b.iter(|| {
            board.set_state(black_box(id), State::Handling);
            board.set_state(black_box(id), State::Reading);
        })
    });
    g.bench_function("idle", |b| b.iter(|| black_box(board.idle())));
    // The clock read inside request_start, request_end, connection and read.
    g.bench_function("clock", |b| b.iter(now_ns));

    let peer = Addr::Inet((Ipv4Addr::new(198, 51, 100, 7), 51_234).into());
    g.bench_function("connection", |b| {
        board.set_state(id, State::Idle);
        b.iter(|| {
            board.set_state(id, State::Reading);
            slot.connection(black_box(&peer));
            board.set_state(id, State::Idle);
        });
        board.set_state(id, State::Reading);
    });
    let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 3));
    g.bench_function("connections_from", |b| {
        b.iter(|| board.connections_from(black_box(ip)))
    });
    g.finish();
}

fn master(c: &mut Criterion) {
    let board = board();
    let mut g = c.benchmark_group("master");
    g.bench_function("read", |b| b.iter(|| board.read(black_box(3))));
    g.bench_function("status/32", |b| {
        b.iter(|| {
            let views: Vec<_> = (1..=WORKERS).filter_map(|id| board.read(id)).collect();
            let line: String = (1..=WORKERS)
                .map(|id| board.read(id).map_or('.', |v| v.letter()))
                .collect();
            black_box((views, line))
        })
    });
    g.bench_function("status/1024", |b| {
        b.iter(|| {
            let line: String = (1..=MAX_WORKERS as u32)
                .map(|id| board.read(id).map_or('.', |v| v.letter()))
                .collect();
            black_box(line)
        })
    });
    g.finish();
}

criterion_group!(benches, worker, master);
criterion_main!(benches);

//! The worker's cost per datagram (issue 19): 32 datagrams queued on a real UDP socket on
//! loopback, then read, passed to a handler and answered by the crate's own datagram side
//! (`worker::datagram::Side`, through `appsrv::bench_support`), with batches of 32
//! (`recvmmsg`/`sendmmsg` once each) and of 1 (one receive and one send per datagram, what
//! a `recvfrom`/`sendto` loop does).
//!
//! ```text
//! cargo bench -p appsrv-benches --bench datagram
//! cargo bench -p appsrv-benches --bench datagram -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Only the worker's side is timed: the client's sends (before) and receives (after) are
//! not. Criterion's `time` is per 32 datagrams; its throughput line is datagrams per second
//! for one core. The handler echoes 40-byte datagrams (a DNS query's size): the figure is
//! the framework's floor, what is left for the handler's own work.

use std::io;
use std::time::{Duration, Instant};

use appsrv::bench_support::DatagramLoop;
use appsrv::{Datagram, DatagramHandler};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const QUEUED: usize = 32;

struct Echo;

impl DatagramHandler for Echo {
    fn handle_datagram(&mut self, d: &Datagram<'_>, answer: &mut Vec<u8>) -> io::Result<()> {
        answer.extend_from_slice(d.data());
        Ok(())
    }
}

fn serve_queued(c: &mut Criterion) {
    let mut group = c.benchmark_group("datagrams");
    group.throughput(Throughput::Elements(QUEUED as u64));
    for batch in [32, 1] {
        let mut lp = DatagramLoop::new(Box::new(Echo), 65_507, 0, 0, batch).expect("a loopback listener");
        let query = [0x5a; 40];
        let mut buf = [0; 128];
        group.bench_function(format!("batch_{batch}"), |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    for _ in 0..QUEUED {
                        lp.send(&query).expect("send");
                    }
                    let start = Instant::now();
                    let want = lp.counts().received + QUEUED as u64;
                    while lp.counts().received < want {
                        lp.serve();
                    }
                    spent += start.elapsed();
                    let mut got = 0;
                    while got < QUEUED {
                        if lp.answer(&mut buf).is_some() {
                            got += 1;
                        }
                    }
                }
                spent
            })
        });
    }
    group.finish();
}

criterion_group!(benches, serve_queued);
criterion_main!(benches);

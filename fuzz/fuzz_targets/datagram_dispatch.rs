//! The datagram side of the event loop (issue 19): arbitrary datagrams sent over loopback
//! to a real UDP listener served by the crate's own `worker::datagram::Side` (batch
//! receive with `recvmmsg`, the size limit, the answer rate, the handler, batch send with
//! `sendmmsg`), through `appsrv::bench_support`.
//!
//! The first byte is the driver's: its low 3 bits choose the batch size (1 to 8 slots),
//! bits 3–5 the size limit (16 × (1 + n) bytes), bit 6 an answer-rate limit of 4 per
//! second (with a slip ratio of 2), bit 7 a handler that fails on datagrams starting with
//! `!`. The rest is cut into datagrams, each led by a length byte (a length past the end
//! takes what is left).
//!
//! The handler echoes each datagram; its slip answers `slip`. Panics (a finding) if an
//! answer is neither an echo of a datagram that fits nor `slip`, if more answers come back
//! than datagrams went out, or if the counters do not add up: every datagram received,
//! each one too large, rate-limited, failed or answered.
#![no_main]

use std::io;

use appsrv::bench_support::DatagramLoop;
use appsrv::{Datagram, DatagramHandler};
use libfuzzer_sys::fuzz_target;

struct Echo {
    fail_on_bang: bool,
}

impl DatagramHandler for Echo {
    fn handle_datagram(&mut self, d: &Datagram<'_>, answer: &mut Vec<u8>) -> io::Result<()> {
        if self.fail_on_bang && d.data().first() == Some(&b'!') {
            // Something written before the error must not be sent.
            answer.extend_from_slice(b"partial");
            return Err(io::Error::other("bang"));
        }
        answer.extend_from_slice(d.data());
        Ok(())
    }

    fn slip(&mut self, _: &Datagram<'_>, answer: &mut Vec<u8>) {
        answer.extend_from_slice(b"slip");
    }
}

fuzz_target!(|data: &[u8]| {
    let [control, input @ ..] = data else {
        return;
    };
    let control = *control;
    let mut rest: &[u8] = input;
    let batch = usize::from(control & 0x07) + 1;
    let max_size = 16 * (1 + usize::from((control >> 3) & 0x07));
    let limit = if control & 0x40 != 0 { 4 } else { 0 };
    let fail_on_bang = control & 0x80 != 0;
    let mut lp = DatagramLoop::new(Box::new(Echo { fail_on_bang }), max_size, limit, 2, batch)
        .expect("a loopback listener");
    let mut sent: Vec<&[u8]> = Vec::new();
    // At most 64 datagrams: the socket's buffer holds them all.
    while let [len, tail @ ..] = rest {
        if sent.len() == 64 {
            break;
        }
        let n = usize::from(*len).min(tail.len());
        let (d, more) = tail.split_at(n);
        lp.send(d).expect("send over loopback");
        sent.push(d);
        rest = more;
    }
    // Loopback delivery is done once send_to returns: every turn takes some, none is lost.
    while (lp.counts().received as usize) < sent.len() {
        let before = lp.counts().received;
        lp.serve();
        assert!(lp.counts().received > before, "datagrams lost: {:?} of {}", lp.counts(), sent.len());
    }
    let c = lp.counts();
    assert_eq!(c.received as usize, sent.len());
    let fits: Vec<&[u8]> = sent.iter().copied().filter(|d| d.len() <= max_size).collect();
    assert_eq!(c.too_large as usize, sent.len() - fits.len(), "{c:?}");
    let fails = |d: &[u8]| fail_on_bang && d.first() == Some(&b'!');
    let mut answers = 0u64;
    let mut buf = [0u8; 256];
    while let Some(n) = lp.answer(&mut buf) {
        let a = &buf[..n];
        answers += 1;
        assert_ne!(a, b"partial", "an answer from a handler that failed");
        assert!(
            a == b"slip" || fits.iter().any(|d| *d == a && !fails(d)),
            "an answer that is neither an echo nor a slip: {a:?}"
        );
    }
    assert_eq!(answers, c.sent, "{c:?}");
    if limit == 0 {
        // Every datagram that fits is answered, but the failed and the empty ones (an
        // empty answer is no answer).
        assert_eq!(c.rate_limited, 0);
        let failed = fits.iter().filter(|d| fails(d)).count() as u64;
        assert_eq!(c.errors, failed, "{c:?}");
        let expected = fits.iter().filter(|d| !d.is_empty() && !fails(d)).count() as u64;
        assert_eq!(answers, expected, "{c:?}");
    } else {
        assert!(c.rate_limited + c.errors + answers <= fits.len() as u64 + c.rate_limited, "{c:?}");
        assert!(fits.len() as u64 <= c.rate_limited + c.errors + answers + fits.iter().filter(|d| d.is_empty()).count() as u64, "{c:?}");
    }
});

//! Admission with a PROXY header in front of HTTP: the crate's own admission machine
//! (through `appsrv::bench_support`) on a listener that expects a PROXY header, fed the
//! input in pieces, then what follows the header to the request step with the `Http` codec
//! (the crate's own, as the other targets drive it).
//!
//! The first byte is the driver's: its low 6 bits choose the size of the pieces (1 to 64
//! bytes), bit 6 whether the connection comes from a trusted balancer, bit 7 whether each
//! piece arrives a second after the last (so that the 20 s header timeout can pass).
//!
//! Panics (a finding) if the machine consumes more than it was given, consumes anything
//! before it admits (a PROXY header is consumed whole), admits a client that is not the
//! one a trusted header named, or if the request step or the codec does.
#![no_main]

use std::time::{Duration, Instant};

use appsrv::bench_support::{Admission, AdmissionNext, ProxyListener};
use appsrv::codec::Http;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [control, input @ ..] = data else {
        return;
    };
    run(*control, input);
});

fn run(control: u8, input: &[u8]) {
    let chunk = usize::from(control & 0x3f) + 1;
    let trusted = control & 0x40 == 0;
    let slow = control & 0x80 != 0;
    let listener = ProxyListener::new(&["127.0.0.0/8"], Some(Duration::from_secs(20))).unwrap();
    let peer = if trusted {
        "127.0.0.1:40000"
    } else {
        "192.0.2.1:40000"
    };
    let t0 = Instant::now();
    let mut now = t0;
    let mut admission = Admission::new(&listener, peer.parse().unwrap(), now);
    let mut held: Vec<u8> = Vec::new();
    let mut fed = 0;
    loop {
        match admission.next() {
            AdmissionNext::Read(by) => {
                if by.is_some_and(|by| now >= by) {
                    admission.deadline_passed(now);
                    assert_ne!(
                        admission.next(),
                        AdmissionNext::Serve,
                        "admitted past its deadline"
                    );
                    continue;
                }
                if fed == input.len() {
                    admission.closed();
                    assert_eq!(
                        admission.next(),
                        AdmissionNext::Close,
                        "admitted without a header"
                    );
                    continue;
                }
                let to = (fed + chunk).min(input.len());
                held.extend_from_slice(&input[fed..to]);
                fed = to;
                let n = admission.received(&held, now);
                assert!(n <= held.len(), "consumed {n} of {} bytes", held.len());
                if admission.next() != AdmissionNext::Serve {
                    assert_eq!(n, 0, "consumed part of a header");
                }
                held.drain(..n);
                if slow {
                    now += Duration::from_secs(1);
                }
            }
            AdmissionNext::Close => {
                assert!(admission.rejection().is_some());
                return;
            }
            AdmissionNext::Serve => break,
        }
    }
    assert!(trusted, "a header from an untrusted source was taken");
    assert!(!slow || now - t0 <= Duration::from_secs(21));
    let _ = admission.peer();
    // The client's bytes: what was left after the header, then the rest of the input.
    held.extend_from_slice(&input[fed..]);
    // The same pieces, no request limit: the crate's own request step takes it from here.
    appsrv_fuzz::run(Http::default(), control & 0x3f, &held);
}

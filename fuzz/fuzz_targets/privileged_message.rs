//! The privileged helper's reading of one message from its worker (issue 18): the bytes as
//! one received datagram, through the crate's own `wire::parse` and the helper loop's
//! handling of it (only a request, decoded with postcard as the helper's request type, its
//! descriptors handed to the request's `Fd`s), reached through
//! `appsrv::bench_support::privileged_request`. A compromised worker controls every byte
//! of it, and the descriptors that come with it.
//!
//! The first byte is the driver's: its low 2 bits choose how many descriptors come with
//! the datagram (0 to 3, each a copy of one pipe's write end); bit 2 puts a well-formed
//! header in front of the rest (the kind from the second byte, the length of the rest), so
//! that the decoder sees arbitrary payloads without the fuzzer finding the magic and the
//! length first; otherwise the rest is the datagram as it came.
//!
//! Panics (a finding) if the reading panics, accepts what is not a well-framed request,
//! refuses without a reason or under another sequence number than its header's (0 without
//! a header), or leaves a descriptor of the message open once its result is dropped (the
//! pipe's read end then sees no end of file).
#![no_main]

use appsrv::bench_support::privileged_request;
use appsrv::privileged::Fd;
use libfuzzer_sys::fuzz_target;

/// A representative request: strings, a sequence, a varint and an optional descriptor (as
/// the channel's property test in `wire.rs` decodes).
type Request = (String, Vec<String>, u64, Option<Fd>);

fuzz_target!(|data: &[u8]| {
    let [control, rest @ ..] = data else {
        return;
    };
    let fds = usize::from(control & 0x03);
    let datagram = if control & 0x04 != 0 {
        let [kind, payload @ ..] = rest else {
            return;
        };
        let mut d = Vec::with_capacity(16 + payload.len());
        d.extend_from_slice(b"APv1");
        d.extend_from_slice(&[*kind, 0, 0, 0]);
        d.extend_from_slice(&7u32.to_le_bytes());
        d.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        d.extend_from_slice(payload);
        d
    } else {
        rest.to_vec()
    };
    run(&datagram, fds);
});

fn run(datagram: &[u8], fds: usize) {
    use nix::fcntl::OFlag;
    let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).expect("a pipe");
    let copies = (0..fds).map(|_| wr.try_clone().expect("dup")).collect();
    drop(wr);
    let header_seq = (datagram.len() >= 12 && &datagram[..4] == b"APv1")
        .then(|| u32::from_le_bytes(datagram[8..12].try_into().unwrap()));
    match privileged_request::<Request>(datagram, copies) {
        Ok((seq, request)) => {
            assert!(datagram.len() >= 16, "accepted {} bytes", datagram.len());
            assert_eq!(&datagram[..4], b"APv1");
            assert_eq!(datagram[4], 1, "accepted a message of kind {}", datagram[4]);
            assert_eq!(Some(seq), header_seq);
            let len = u32::from_le_bytes(datagram[12..16].try_into().unwrap()) as usize;
            assert_eq!(
                len,
                datagram.len() - 16,
                "accepted a length that is not the payload's"
            );
            assert!(request.3.is_none() || fds > 0, "a descriptor out of nothing");
            drop(request);
        }
        Err((seq, why)) => {
            assert!(!why.is_empty(), "refused without a reason");
            assert_eq!(
                seq,
                header_seq.unwrap_or(0),
                "refused under another number: {why}"
            );
        }
    }
    let mut byte = [0u8; 1];
    assert_eq!(
        nix::unistd::read(&rd, &mut byte),
        Ok(0),
        "a descriptor of the message was left open"
    );
}

//! The driver shared by the fuzz targets: it runs a codec through appsrv's own request
//! step (`crates/appsrv/src/conn/step.rs`), on input that arrives in pieces, and checks
//! the invariants the server relies on.
//!
//! The targets only choose the codec (and its limits); the driver is generic over
//! [`Codec`], so a new codec gets a target in a few lines.

use appsrv::bench_support::{RequestStep, StepNext};
use appsrv::codec::{Codec, Decoded, ProtocolError};

/// What a run produced.
#[derive(Debug, Default)]
pub struct Report {
    /// The responses, concatenated (without interim replies and error replies).
    pub responses: Vec<u8>,
    /// The number of requests decoded.
    pub requests: usize,
    /// The protocol error that ended the run, if any.
    pub error: Option<ProtocolError>,
}

/// Runs `codec` on `input` without writing any response payload; see [`run_with`].
pub fn run<C: Codec + 'static>(codec: C, control: u8, input: &[u8]) -> Report {
    run_with(codec, control, input, |_, _| {})
}

/// Runs `codec` on `input`, letting `fill` write each response.
///
/// The targets take `control` from the first byte of the fuzzer's data: its low 6 bits
/// choose the size of the pieces `input` arrives in (1 to 64 bytes), its high 2 bits a
/// per-connection request limit (none, 1, 2 or 3: the last request is answered with
/// `last = true`, and the run stops after it as the request loop does).
///
/// The requests go through appsrv's own request step (`conn/step.rs`, reached through the
/// hidden `appsrv::bench_support::RequestStep`), the code the server runs, not a copy of
/// it. The step checks (with debug assertions, on in fuzz builds) that `decode` never
/// claims 0 bytes, more than the buffer holds or more than `max_request_size()`.
///
/// Panics (the fuzzer's finding) if the codec or the step panics, or if an error reply is
/// empty.
pub fn run_with<C, F>(codec: C, control: u8, input: &[u8], mut fill: F) -> Report
where
    C: Codec + 'static,
    F: for<'r, 's> FnMut(&C::Request<'r>, &mut C::Response<'s>),
{
    let mut report = Report::default();
    let chunk = usize::from(control & 0x3f) + 1;
    let limit = u32::from(control >> 6);
    let mut step = RequestStep::new(codec, limit);
    let mut requests = 0;
    let mut handle = |req: &C::Request<'_>, res: &mut C::Response<'_>| {
        requests += 1;
        fill(req, res);
        Ok(())
    };
    let mut fed = 0;
    loop {
        let next = (fed + chunk).min(input.len());
        let (taken, what) = step.feed(&input[fed..next], &mut handle);
        fed += taken;
        match what {
            StepNext::Read if fed < input.len() => continue,
            StepNext::SendFile | StepNext::More => continue,
            StepNext::Fail => unreachable!("the fuzz handlers do not fail"),
            StepNext::Read | StepNext::Close => break,
        }
    }
    report.requests = requests;
    let out = step.output().to_vec();
    match step.rejected() {
        Some((error, at)) => {
            assert!(out.len() > at, "no error reply for {error}");
            report.responses = out[..at].to_vec();
            report.error = Some(error);
        }
        None => report.responses = out,
    }
    report
}

/// Decodes every complete request in `bytes` at once (to check responses that are framed
/// like requests); returns each mapped through `f`, or the first error.
pub fn decode_all<C: Codec, T>(
    codec: &mut C,
    bytes: &[u8],
    mut f: impl FnMut(&C::Request<'_>) -> T,
) -> Result<Vec<T>, ProtocolError> {
    let mut buf = bytes.to_vec();
    let mut at = 0;
    let mut found = Vec::new();
    while let Decoded::Request { request, len } = codec.decode(&mut buf[at..])? {
        assert!(len > 0, "a request of 0 bytes");
        found.push(f(&request));
        at += len;
    }
    if at != buf.len() {
        return Err(ProtocolError::Malformed(
            format!("{} bytes left over", buf.len() - at).into(),
        ));
    }
    Ok(found)
}

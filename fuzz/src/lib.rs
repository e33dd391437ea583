//! The driver shared by the fuzz targets: it runs a codec the way appsrv's request loop
//! does (`crates/appsrv/src/serve.rs`), on input that arrives in pieces, and checks the
//! invariants the loop relies on.
//!
//! The targets only choose the codec (and its limits); the driver is generic over
//! [`Codec`], so a new codec gets a target in a few lines.

use appsrv::codec::{Codec, Decoded, ProtocolError, Respond};

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
/// Panics (the fuzzer's finding) if the codec panics, or if `decode` claims more bytes
/// than the buffer holds, or none (the loop would spin), or more than
/// `max_request_size()` (the request loop would never have buffered them), or if
/// `encode_error` writes nothing.
pub fn run_with<C, F>(mut codec: C, control: u8, input: &[u8], mut fill: F) -> Report
where
    C: Codec + 'static,
    F: for<'r, 's> FnMut(&C::Request<'r>, &mut C::Response<'s>),
{
    let mut report = Report::default();
    let chunk = usize::from(control & 0x3f) + 1;
    let limit = usize::from(control >> 6);
    let max = codec.max_request_size();
    codec.reset();

    let mut buf: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let mut fed = 0;
    loop {
        // Answer every complete request in the buffer, in order.
        while !buf.is_empty() {
            let held = buf.len();
            let last = limit != 0 && report.requests + 1 >= limit;
            let (len, close) = match codec.decode(&mut buf) {
                Ok(Decoded::Request { request, len }) => {
                    assert!(len > 0, "a request of 0 bytes: the request loop would spin");
                    assert!(len <= held, "decode claimed {len} bytes of a buffer of {held}");
                    assert!(
                        len <= max,
                        "a request of {len} bytes, above max_request_size() = {max}"
                    );
                    let mark = out.len();
                    let mut res = codec.respond(&request, &mut out, last);
                    fill(&request, &mut res);
                    let outcome = res.finish();
                    assert!(out.len() >= mark, "finish() removed earlier output");
                    (len, outcome.close)
                }
                Ok(Decoded::Incomplete { .. }) => break,
                Ok(_) => unreachable!("a new kind of Decoded: teach the fuzz driver about it"),
                Err(e) => return fail(codec, e, out, report),
            };
            report.requests += 1;
            buf.drain(..len);
            if close || last {
                report.responses = out;
                return report;
            }
        }
        // The request loop refuses an incomplete request that fills its buffer.
        if buf.len() >= max {
            let e = ProtocolError::TooLarge {
                what: "request",
                limit: max,
            };
            return fail(codec, e, out, report);
        }
        if fed == input.len() {
            report.responses = out;
            return report;
        }
        // Never buffer more than the request loop would.
        let next = (fed + chunk)
            .min(input.len())
            .min(fed.saturating_add(max - buf.len()));
        buf.extend_from_slice(&input[fed..next]);
        fed = next;
    }
}

/// Ends a run on a protocol error, as the request loop does: the codec's error reply.
fn fail<C: Codec>(mut codec: C, e: ProtocolError, out: Vec<u8>, mut report: Report) -> Report {
    let mut reply = Vec::new();
    codec.encode_error(&e, &mut reply);
    assert!(!reply.is_empty(), "no error reply for {e}");
    report.responses = out;
    report.error = Some(e);
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

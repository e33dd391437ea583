//! The `LengthPrefixed` codec, both prefixes, with a small maximum so that oversize frames
//! are reached (the second byte chooses them; the first is the driver's). Responses echo
//! the request, and must decode, with the same codec, back to the requests.
#![no_main]

use appsrv::codec::{LengthPrefixed, Prefix};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [control, config, input @ ..] = data else {
        return;
    };
    let (control, config) = (*control, *config);
    let prefix = if config & 1 == 0 { Prefix::U16 } else { Prefix::U32 };
    let codec = match config >> 1 {
        0x7f => LengthPrefixed::new(prefix),
        n => LengthPrefixed::new(prefix).max_frame(usize::from(n) * 4),
    };
    let mut requests = Vec::new();
    let report = appsrv_fuzz::run_with(codec.clone(), control, input, |req, res| {
        requests.push(req.to_vec());
        res.push(req);
    });
    let echoed = appsrv_fuzz::decode_all(&mut codec.clone(), &report.responses, |p| p.to_vec());
    assert_eq!(echoed, Ok(requests));
});

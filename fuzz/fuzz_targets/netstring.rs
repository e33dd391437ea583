//! The `Netstring` codec, with a small maximum so that oversize netstrings are reached
//! (the second byte chooses it; the first is the driver's). Responses echo the request,
//! and must decode, with the same codec, back to the requests.
#![no_main]

use appsrv::codec::Netstring;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [control, config, input @ ..] = data else {
        return;
    };
    let (control, config) = (*control, *config);
    let codec = match config {
        0xff => Netstring::default(),
        0xfe => Netstring::new(usize::MAX),
        n => Netstring::new(usize::from(n) * 4),
    };
    let mut requests = Vec::new();
    let report = appsrv_fuzz::run_with(codec.clone(), control, input, |req, res| {
        requests.push(req.to_vec());
        res.push(req);
    });
    let echoed = appsrv_fuzz::decode_all(&mut codec.clone(), &report.responses, |p| p.to_vec());
    assert_eq!(echoed, Ok(requests));
});

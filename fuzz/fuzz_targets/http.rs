//! The `Http` codec with its defaults. The driver is generic over `Codec`: responses
//! are finished without a body.
#![no_main]

use appsrv::codec::Http;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let [control, input @ ..] = data {
        appsrv_fuzz::run(Http::default(), *control, input);
    }
});

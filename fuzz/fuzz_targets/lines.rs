//! The `Lines` codec, with a small line limit so that long lines are reached (the second
//! byte chooses it; the first is the driver's). Responses echo the line.
#![no_main]

use std::io::Write;

use appsrv::codec::Lines;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [control, config, input @ ..] = data else {
        return;
    };
    let (control, config) = (*control, *config);
    let codec = if config == 0xff {
        Lines::default()
    } else {
        Lines::new(usize::from(config))
    };
    let report = appsrv_fuzz::run_with(codec, control, input, |line, res| {
        res.write_all(line).unwrap();
        res.push(b"\n");
    });
    // A line holds no '\n': one per response.
    assert_eq!(
        report.responses.iter().filter(|b| **b == b'\n').count(),
        report.requests
    );
});

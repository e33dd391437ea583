//! The `Resp` codec (RESP2), with small limits so that they are reached (the second byte
//! chooses them; the first is the driver's). Responses echo each command as an array of
//! bulk strings, which is also how a client sends it: they must decode back to the
//! commands.
#![no_main]

use appsrv::codec::Resp;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [control, config, input @ ..] = data else {
        return;
    };
    let (control, config) = (*control, *config);
    // 0xff: the defaults; else bits 0-3 the bulk limit (0-60 bytes), bits 4-6 the argument
    // limit (1-8), bit 7 a 24-byte inline limit and a 128-byte request limit.
    let codec = if config == 0xff {
        Resp::default()
    } else {
        let codec = Resp::new()
            .max_bulk_len(usize::from(config & 0x0f) * 4)
            .max_args(usize::from((config >> 4) & 0x07) + 1)
            .max_depth(2);
        if config & 0x80 != 0 {
            codec.max_inline(24).max_request(128)
        } else {
            codec
        }
    };
    let mut commands: Vec<Vec<Vec<u8>>> = Vec::new();
    let report = appsrv_fuzz::run_with(codec, control, input, |req, res| {
        assert!(!req.is_empty(), "empty requests are skipped");
        assert_eq!(req.args().len(), req.len());
        let args: Vec<Vec<u8>> = req.args().map(<[u8]>::to_vec).collect();
        assert_eq!(req.command(), &args[0][..]);
        res.array(args.len());
        for a in &args {
            res.bulk(a);
        }
        commands.push(args);
    });
    assert_eq!(report.requests, commands.len());
    let echoed = appsrv_fuzz::decode_all(&mut Resp::default(), &report.responses, |r| {
        r.args().map(<[u8]>::to_vec).collect::<Vec<_>>()
    });
    assert_eq!(echoed, Ok(commands));
});

//! The tests of the other files that run only where a condition holds (root, an external
//! program, IPv6 loopback...), reported ignored with the reason elsewhere, never as passed
//! (issue 41). The standard harness cannot decide that at run time: each of those files
//! lists such tests in `conditional()`, and is a module here (compiled without its
//! `#[test]` functions, which run in its own test binary). See `tests/util/needs.rs`.
//!
//! `cargo test -p appsrv --test conditional` runs them all; `... -- runas::` those of one
//! file.

// Each file's module has its own `mod util`: the same file, compiled once per module.
#![allow(clippy::duplicate_mod)]

mod util;

#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "access.rs"]
mod access;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "confine.rs"]
mod confine;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "connapi.rs"]
mod connapi;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "core.rs"]
mod core;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "daemon.rs"]
mod daemon;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "frontpage.rs"]
mod frontpage;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "grafana.rs"]
mod grafana;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "hybrid.rs"]
mod hybrid;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "kv.rs"]
mod kv;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "logs.rs"]
mod logs;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "requests.rs"]
mod requests;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "runas.rs"]
mod runas;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "smtp_sink.rs"]
mod smtp_sink;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "status.rs"]
mod status;
#[allow(dead_code, unused_imports)] // its #[test] functions are not here
#[path = "status_page.rs"]
mod status_page;

fn main() -> std::process::ExitCode {
    // Each test is named after its file (`runas::issue_14_...`, tests/util/needs.rs).
    let files: [fn() -> Vec<libtest_mimic::Trial>; 15] = [
        access::conditional,
        connapi::conditional,
        confine::conditional,
        core::conditional,
        daemon::conditional,
        frontpage::conditional,
        grafana::conditional,
        hybrid::conditional,
        kv::conditional,
        logs::conditional,
        requests::conditional,
        runas::conditional,
        smtp_sink::conditional,
        status::conditional,
        status_page::conditional,
    ];
    let trials = files.into_iter().flat_map(|tests| tests()).collect();
    util::needs::main(trials)
}

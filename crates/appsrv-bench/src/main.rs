//! `appsrv-bench`: a load generator for appsrv servers, and for any request/response
//! protocol over TCP or Unix stream sockets.
//!
//! ```text
//! appsrv-bench [OPTIONS] ADDR          ADDR is HOST:PORT or unix:/PATH
//! ```
//!
//! It opens `-c N` connections (default 1), each served by its own thread, and sends
//! requests until `-n N` requests (default 1000) have been made or `-d SECS` have passed,
//! after an optional `--warmup SECS` (default 0) whose requests are not counted. It then
//! reports, like ab and wrk: requests completed, duration, requests/s, bytes read/s, errors
//! by kind (connect, reset, timeout, bad response, other) and latency (min, mean, p50, p90,
//! p99, p99.9, max, from an HDR histogram in microseconds); `--json` prints all of it as one
//! JSON object (the fields are listed in the README and in `--help`).
//!
//! Defaults, each changed by its option:
//!
//! - connections are kept alive: each sends its requests one after another
//!   (`--reconnect` opens a new connection per request, as greeting servers that answer
//!   once and close need);
//! - one request in flight per connection (`--pipeline N` sends N, then reads N responses);
//! - no request: the server speaks first (`--request TEXT` with escapes `\r \n \t \\ \0
//!   \xHH`, `--request-file PATH`, or `--http PATH` for `GET PATH HTTP/1.1`);
//! - no end of response: `--until TEXT`, `--response-len N`, `--length-prefix u16|u32` or
//!   `--http` must say where a response ends, except with `--reconnect`, where it ends when
//!   the server closes the connection;
//! - as fast as the server answers (`--rate N` sends N requests/s in all, and measures
//!   latency from when each request was due, so a slow server is not hidden by the
//!   requests it delayed);
//! - `--timeout 10`: a read or write that waits longer than that (or a response that
//!   takes longer in all) fails with a timeout error, and a connect with a connect error,
//!   so a stalled server never hangs the run;
//! - a progress line on stderr every second of a run longer than 2 s only when stderr is a
//!   terminal (`--progress` forces it).
//!
//! Exit status: 0 when the run completed (even with errors counted), 2 for bad usage, 1 for
//! a fatal problem (ADDR cannot be resolved, the request file cannot be read).
//!
//! Each connection thread uses blocking sockets with timeouts and keeps its own counters
//! and histogram, merged at the end: nothing is locked or allocated per request.

#![forbid(unsafe_code)]

mod cli;
mod escape;
mod framing;
mod net;
mod report;
mod run;
mod stats;
mod worker;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::Context;

use crate::cli::Args;
use crate::framing::Framing;
use crate::net::Target;
use crate::worker::{Limit, Plan};

/// The number of requests of a run given neither `-n` nor `-d`.
const DEFAULT_REQUESTS: u64 = 1000;

fn main() -> ExitCode {
    let args = Args::parse_checked();
    match bench(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("appsrv-bench: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn bench(args: &Args) -> anyhow::Result<()> {
    let request = if let Some(r) = &args.request {
        r.0.clone()
    } else if let Some(path) = &args.request_file {
        std::fs::read(path).with_context(|| format!("cannot read the request file {}", path.display()))?
    } else if let Some(path) = &args.http {
        args.http_request(path)
    } else {
        Vec::new()
    };
    let plan = Plan {
        target: Target::resolve(&args.addr)?,
        request,
        // Checked: without a framing, --reconnect was given.
        framing: args.framing().unwrap_or(Framing::Close),
        pipeline: args.pipeline as usize,
        reconnect: args.reconnect,
        timeout: args.timeout,
        limit: match args.duration {
            Some(d) => Limit::Duration(d),
            None => Limit::Requests(args.requests.unwrap_or(DEFAULT_REQUESTS)),
        },
        warmup: args.warmup,
        rate: args.rate,
        connections: args.connections as usize,
    };
    let progress = args.progress || std::io::stderr().is_terminal();
    let outcome = run::run(&plan, progress)?;
    let out = if args.json {
        report::json(&args.addr, &plan, &outcome).to_string() + "\n"
    } else {
        report::text(&args.addr, &plan, &outcome)
    };
    let mut stdout = std::io::stdout().lock();
    // A closed stdout (`| head`) is not worth a failure status: the run itself completed.
    let _ = stdout.write_all(out.as_bytes()).and_then(|()| stdout.flush());
    Ok(())
}

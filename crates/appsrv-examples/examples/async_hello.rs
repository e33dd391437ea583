//! The HTTP hello with an async handler (issue 33): `Hello, World!` at `/`, and
//! `/sleep?ms=N`, which waits on a tokio timer (no thread, no blocked worker).
//!
//! Run it:
//!
//! ```text
//! cargo run --release --example async_hello                  # 127.0.0.1:8080, a worker per CPU
//! ```
//!
//! Then, from another terminal:
//!
//! ```text
//! $ curl -i http://127.0.0.1:8080/
//! HTTP/1.1 200 OK
//! Content-Type: text/plain
//! Content-Length: 13
//! Date: Tue, 03 Jun 2025 10:00:00 GMT
//!
//! Hello, World!
//! $ curl http://127.0.0.1:8080/sleep?ms=500              # answers `slept` after 500 ms
//! $ ab -n 20000 -c 1000 -k 'http://127.0.0.1:8080/sleep?ms=50'
//! $ cargo run --release --example async_hello -- status   # requests in flight per worker
//! ```
//!
//! What to observe: each worker (`-w`, default the number of CPUs) runs a current-thread
//! tokio runtime made after the fork, and every connection is a future of it. A thousand
//! clients each waiting 50 ms are served by two processes at about 1000 / 50 ms = 20,000
//! requests a second, where `http_hello`'s blocking `/sleep` needs a process per waiting
//! request. `status` shows the requests in flight, and `metrics` has them as
//! `appsrv_requests_in_flight`. `--max-inflight N` caps them per worker; a request that
//! waits longer than `--request-timeout` is cancelled and answered `504 Gateway Timeout`
//! (try `--request-timeout 1` and `/sleep?ms=3000`); a client that disconnects cancels
//! its request.
//!
//! The same routes answer the same bytes as `http_hello` (`/`, `/sleep`), so the two can
//! be measured side by side (`bench/async.sh`), with axum (`bench/axum`) beside them.

use std::io::{self, Write};
use std::time::Duration;

use appsrv::codec::{Http, HttpRequest, HttpResponse};

/// The handler: no state; `&self` is shared by every request in flight in the worker.
struct AsyncHello;

impl appsrv::AsyncRequestHandler for AsyncHello {
    type Codec = Http;
    type Session = ();

    async fn handle_request(
        &self,
        _conn: &mut appsrv::Conn<'_>,
        req: &HttpRequest<'_>,
        res: &mut HttpResponse<'_>,
    ) -> io::Result<()> {
        if req.method() != "GET" && req.method() != "HEAD" {
            res.header("Allow", "GET, HEAD");
            return plain(res, 405, "method not allowed\n");
        }
        match req.path() {
            "/" => {
                res.content_type("text/plain");
                res.write_all(b"Hello, World!")
            }
            "/sleep" => {
                let ms = req
                    .query()
                    .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("ms=")))
                    .and_then(|n| n.parse::<u64>().ok())
                    .filter(|n| *n <= 10_000);
                let Some(ms) = ms else {
                    return plain(res, 400, "expected /sleep?ms=N with N from 0 to 10000\n");
                };
                // A timer of the worker's runtime: the worker serves its other clients
                // meanwhile.
                tokio::time::sleep(Duration::from_millis(ms)).await;
                plain(res, 200, "slept\n")
            }
            _ => plain(res, 404, "not found\n"),
        }
    }
}

/// A short text/plain response.
fn plain(res: &mut HttpResponse<'_>, status: u16, text: &str) -> io::Result<()> {
    res.status(status).content_type("text/plain; charset=utf-8");
    res.write_all(text.as_bytes())
}

fn main() {
    appsrv::server!()
        .about("Hello, World! over HTTP from an async handler, and /sleep?ms=N on a tokio timer")
        .listen("127.0.0.1:8080")
        .run_async_requests(|| Ok(AsyncHello))
        .unwrap_or_else(|e| e.exit());
}

//! A test server for the async driver's integration tests (issue 33; not an example for
//! users).
//!
//! The request level (HTTP, `Server::run_async_requests`), routes:
//! - `/`: `Hello, World!`;
//! - `/sleep?ms=N`: waits N ms on a tokio timer, then answers `slept`;
//! - `/hold?ms=N`: as `/sleep`, counting the calls that were cancelled (their future
//!   dropped before the end) in `/stats`;
//! - `/spin?ms=N`: blocks the thread N ms (a handler that must not: `--slow-request`);
//! - `/panic`: the handler panics;
//! - `/pid`: the worker's pid; `/peer`: the client's address as the handler sees it;
//! - `/count`: a counter shared by the worker's requests (`Cell` in `&self`);
//! - `/session`: a counter of the connection's requests (its session);
//! - `/stats`: `cancelled=N in_flight=M` (this worker's);
//! - `/len` (POST): the body's length; `/big?kb=N`: N KiB of `x`;
//! - `/id`: the connection's id (`Conn::id`: `wSLOT.gGEN.pPID.cN`).
//!
//! `--client`: the client level (`Server::run_async`), a line protocol: `pid PID` on
//! connect, then each line is echoed, except `sleep MS` (waits, answers `slept`), `panic`,
//! `peer` (the client's address), `bye` (closes), `id` (`id ID`, `AsyncClient::id`),
//! `big KB` (KB KiB of `x`, then a newline) and `penalize` (charges the client's address
//! with a failed authentication, `AsyncClient::penalize`, and answers `penalized MS` or
//! `penalized none`; reads then return end of file, so the session ends).
//!
//! `--helper` gives each worker a privileged helper (`Server::privileged`, no
//! capabilities) that sleeps the milliseconds it is asked, then answers its pid: the client
//! level's `helper MS` awaits it (`Helper::call_async`) and answers `helper pid PID`, or
//! `helper error REASON`.

use std::cell::Cell;
use std::io::{self, Write};
use std::time::Duration;

use appsrv::codec::{Http, HttpRequest, HttpResponse};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[derive(clap::Args, Debug)]
struct Opts {
    /// Serve the client level (a line protocol) instead of HTTP requests.
    #[arg(long)]
    client: bool,
    /// Give each worker a privileged helper (see the module's documentation).
    #[arg(long)]
    helper: bool,
}

/// The privileged helper of `--helper`: sleeps, then answers its pid.
struct Sleeper;

impl appsrv::privileged::Privileged for Sleeper {
    type Request = u64;
    type Response = u32;

    fn handle(&mut self, ms: u64, _caller: &appsrv::privileged::Caller) -> u32 {
        std::thread::sleep(Duration::from_millis(ms));
        std::process::id()
    }
}

/// The request level's handler.
#[derive(Default)]
struct Bed {
    count: Cell<u64>,
    cancelled: Cell<u64>,
    in_flight: Cell<u64>,
}

/// Counts a call in flight; a drop before `done` is a cancelled call.
struct Holding<'a> {
    bed: &'a Bed,
    done: bool,
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.bed.in_flight.set(self.bed.in_flight.get() - 1);
        if !self.done {
            self.bed.cancelled.set(self.bed.cancelled.get() + 1);
        }
    }
}

/// The number of the query's first parameter (`ms=N`, `kb=N`); the others are ignored
/// (`ms=N&pw=X`: a request that carries a secret, issue 41).
fn ms(req: &HttpRequest<'_>) -> Option<u64> {
    req.query()
        .and_then(|q| q.split('&').next())
        .and_then(|p| p.split_once('=').map(|(_, v)| v))
        .and_then(|n| n.parse().ok())
}

fn plain(res: &mut HttpResponse<'_>, status: u16, text: &str) -> io::Result<()> {
    res.status(status).content_type("text/plain; charset=utf-8");
    res.write_all(text.as_bytes())
}

impl appsrv::AsyncRequestHandler for Bed {
    type Codec = Http;
    type Session = u64;

    async fn handle_request(
        &self,
        conn: &mut appsrv::Conn<'_, u64>,
        req: &HttpRequest<'_>,
        res: &mut HttpResponse<'_>,
    ) -> io::Result<()> {
        match req.path() {
            "/" => plain(res, 200, "Hello, World!"),
            "/sleep" => {
                tokio::time::sleep(Duration::from_millis(ms(req).unwrap_or(0))).await;
                plain(res, 200, "slept\n")
            }
            "/hold" => {
                self.in_flight.set(self.in_flight.get() + 1);
                let mut holding = Holding {
                    bed: self,
                    done: false,
                };
                tokio::time::sleep(Duration::from_millis(ms(req).unwrap_or(0))).await;
                holding.done = true;
                plain(res, 200, "held\n")
            }
            "/spin" => {
                std::thread::sleep(Duration::from_millis(ms(req).unwrap_or(0)));
                plain(res, 200, "spun\n")
            }
            "/panic" => panic!("asked to panic"),
            "/pid" => plain(res, 200, &format!("{}\n", std::process::id())),
            "/peer" => plain(res, 200, &format!("{}\n", conn.peer_addr())),
            "/count" => {
                self.count.set(self.count.get() + 1);
                plain(res, 200, &format!("{}\n", self.count.get()))
            }
            "/session" => {
                *conn.session() += 1;
                let n = *conn.session();
                plain(res, 200, &format!("{n}\n"))
            }
            "/len" => plain(res, 200, &format!("{}\n", req.body().len())),
            "/id" => plain(res, 200, &format!("{}\n", conn.id())),
            "/big" => {
                res.content_type("application/octet-stream");
                res.write_all(&vec![b'x'; ms(req).unwrap_or(0) as usize * 1024])
            }
            "/stats" => plain(
                res,
                200,
                &format!(
                    "cancelled={} in_flight={}\n",
                    self.cancelled.get(),
                    self.in_flight.get()
                ),
            ),
            _ => plain(res, 404, "not found\n"),
        }
    }
}

/// The client level's handler.
struct Lines;

impl appsrv::AsyncHandler for Lines {
    async fn handle_client(&self, client: &mut appsrv::AsyncClient) -> io::Result<()> {
        let peer = client.peer_addr().to_string();
        let mut client = BufReader::new(client);
        client
            .write_all(format!("pid {}\n", std::process::id()).as_bytes())
            .await?;
        let mut line = String::new();
        loop {
            line.clear();
            if client.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let cmd = line.trim_end();
            let reply = if let Some(ms) = cmd.strip_prefix("sleep ") {
                let ms: u64 = ms.parse().unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                "slept".to_string()
            } else {
                match cmd {
                    "panic" => panic!("asked to panic"),
                    "peer" => peer.clone(),
                    "id" => format!("id {}", client.get_ref().id()),
                    helper if helper.starts_with("helper ") => {
                        let ms: u64 = helper[7..].parse().unwrap_or(0);
                        match client.get_ref().privileged::<Sleeper>().call_async(&ms).await {
                            Ok(pid) => format!("helper pid {pid}"),
                            Err(e) => format!("helper error {e}"),
                        }
                    }
                    "penalize" => match client.get_mut().penalize() {
                        Some(d) => format!("penalized {}", d.as_millis()),
                        None => "penalized none".to_string(),
                    },
                    big if big.starts_with("big ") => {
                        let kb: usize = big[4..].parse().unwrap_or(0);
                        "x".repeat(kb * 1024)
                    }
                    "bye" => return Ok(()),
                    other => other.to_string(),
                }
            };
            client.write_all(format!("{reply}\n").as_bytes()).await?;
        }
    }
}

fn main() {
    let mut server = appsrv::server!("asyncbed");
    let opts: Opts = server.args();
    if opts.helper {
        server = server.privileged(|| Ok(Sleeper));
    }
    let r = if opts.client {
        server.run_async(|| Ok(Lines))
    } else {
        server.run_async_requests(|| Ok(Bed::default()))
    };
    r.unwrap_or_else(|e| e.exit());
}

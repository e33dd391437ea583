//! A test server for appsrv's integration tests (not an example for users).
//!
//! Each connection gets one line `pid PID` (the worker's pid), then every line the client
//! sends is echoed back, except:
//! - `panic`: the handler panics;
//! - `sleep SECS`: the handler waits SECS seconds, then answers `slept`;
//! - `grow MIB`: the worker allocates and touches MIB mebibytes, then answers `grown`;
//! - `tolerate-timeouts`: answers `ok`; from then on a read timeout is answered with a
//!   `timeout` line and the handler reads again, instead of ending the connection.
//! - `open PATH`, `write PATH`, `socket`, `exec`, `thread`, `root`: confinement probes
//!   (read a file, write one, make a UDP socket, run /bin/true, start a thread, setuid(0));
//!   each answers `NAME ok ...` or `NAME error ...`;
//! - `tls`: answers `tls VERSION subject=SUBJECT alpn=PROTOCOL sni=NAME` (`-` for what is
//!   absent) on a TLS connection, `tls none` on a plain one.
//! - `penalize`: charges the client's address with a failed authentication
//!   (`Client::penalize`) and answers `penalized MS` (the refusal in milliseconds) or
//!   `penalized none`; reads then return end of file, so the connection ends.
//! - `id`: answers `id ID` (`Client::id`: `wSLOT.gGEN.pPID.cN`); `stopping`: answers
//!   `stopping true` or `stopping false` (`Client::stopping`).
//!
//! - `helper whoami`, `helper open PATH`, `helper pid`, `helper sleep SECS` (with
//!   `--helper`): ask the worker's privileged helper for its identity (`helper uid=U
//!   gid=G capeff=HEX capbnd=HEX fds=N`), to open PATH and hand the descriptor over (the
//!   worker reads it: `helper opened N bytes`), for its pid, or to sleep (`helper slept`);
//!   a refusal or failure answers `helper error REASON`.
//!
//! `--helper` gives each worker a privileged helper (`Server::privileged`) that keeps
//! `CAP_DAC_OVERRIDE` only, `--helper-fail` makes its factory fail;
//! `--fail-factory` makes every worker's factory fail, `--fail-reload` the reload hook and
//! `--fail-check` the check hook; `--crash-if-exists PATH` makes a
//! starting worker exit with status 3 while PATH exists; `--keep-fd N` keeps the inherited
//! descriptor N open (`Server::keep_fd`).
//!
//! `--datagrams` makes it a datagram-only server (`Server::run_datagrams`, listeners
//! `udp://…`): each datagram is echoed back, except `pid` (answers `pid PID`), `sleep SECS`
//! (waits, then answers `slept`) and `panic` (the handler panics).

use std::io::{self, BufRead, Write};
use std::time::Duration;

#[derive(clap::Args, Debug)]
struct Opts {
    /// Make the handler factory fail in every worker.
    #[arg(long)]
    fail_factory: bool,
    /// Make the reload hook fail (the old generation must keep serving).
    #[arg(long)]
    fail_reload: bool,
    /// Make the check hook fail.
    #[arg(long)]
    fail_check: bool,
    /// Make a worker exit with status 3 right after start while PATH exists.
    #[arg(long, value_name = "PATH")]
    crash_if_exists: Option<std::path::PathBuf>,
    /// Keep this inherited descriptor open (Server::keep_fd).
    #[arg(long, value_name = "N")]
    keep_fd: Vec<i32>,
    /// Give each worker a privileged helper (Server::privileged).
    #[arg(long)]
    helper: bool,
    /// Make the privileged helper's factory fail.
    #[arg(long)]
    helper_fail: bool,
    /// Serve datagrams only (Server::run_datagrams).
    #[arg(long)]
    datagrams: bool,
}

/// The testbed's datagram handler.
struct TestDatagrams;

impl appsrv::DatagramHandler for TestDatagrams {
    fn handle_datagram(&mut self, datagram: &appsrv::Datagram<'_>, answer: &mut Vec<u8>) -> io::Result<()> {
        let text = String::from_utf8_lossy(datagram.data());
        let text = text.trim_end();
        if text == "pid" {
            answer.extend_from_slice(format!("pid {}", std::process::id()).as_bytes());
        } else if text == "panic" {
            panic!("testbed: a datagram asked for a panic");
        } else if let Some(secs) = text.strip_prefix("sleep ") {
            let secs: f64 = secs.parse().map_err(|_| io::Error::other("sleep SECS"))?;
            std::thread::sleep(Duration::from_secs_f64(secs));
            answer.extend_from_slice(b"slept");
        } else {
            answer.extend_from_slice(datagram.data());
        }
        Ok(())
    }
}

/// The testbed's privileged helper: what it is, and one file opened on request.
struct TestHelper;

#[derive(serde::Serialize, serde::Deserialize)]
enum HelperRequest {
    Whoami,
    Open(String),
    Pid,
    Sleep(f64),
}

#[derive(serde::Serialize, serde::Deserialize)]
enum HelperResponse {
    Who(String),
    Opened(Result<appsrv::privileged::Fd, String>),
    Pid(u32),
    Slept,
}

impl appsrv::privileged::Privileged for TestHelper {
    type Request = HelperRequest;
    type Response = HelperResponse;
    const CAPABILITIES: &'static [appsrv::privileged::Capability] =
        &[appsrv::privileged::Capability::CAP_DAC_OVERRIDE];

    fn handle(&mut self, request: HelperRequest, _caller: &appsrv::privileged::Caller) -> HelperResponse {
        match request {
            HelperRequest::Whoami => {
                let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
                let field = |key: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(key))
                        .map_or(String::new(), |v| {
                            v.split_whitespace().next().unwrap_or("").to_owned()
                        })
                };
                let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1));
                HelperResponse::Who(format!(
                    "uid={} gid={} capeff={} capbnd={} fds={fds}",
                    field("Uid:"),
                    field("Gid:"),
                    field("CapEff:"),
                    field("CapBnd:")
                ))
            }
            HelperRequest::Open(path) => HelperResponse::Opened(
                std::fs::File::open(&path)
                    .map(|f| std::os::fd::OwnedFd::from(f).into())
                    .map_err(|e| format!("{:?}", e.kind())),
            ),
            HelperRequest::Pid => HelperResponse::Pid(std::process::id()),
            HelperRequest::Sleep(secs) => {
                std::thread::sleep(Duration::from_secs_f64(secs));
                HelperResponse::Slept
            }
        }
    }
}

/// A `helper ...` line: the call, and the line that answers it.
fn ask_helper(client: &appsrv::Client, cmd: &str) -> String {
    use appsrv::privileged::CallError;
    let request = match cmd.split_once(' ').unwrap_or((cmd, "")) {
        ("whoami", _) => HelperRequest::Whoami,
        ("open", path) => HelperRequest::Open(path.to_owned()),
        ("pid", _) => HelperRequest::Pid,
        ("sleep", secs) => HelperRequest::Sleep(secs.parse().unwrap_or(1.0)),
        _ => return format!("helper error unknown helper command {cmd:?}"),
    };
    let helper = client.privileged::<TestHelper>().timeout(Duration::from_secs(5));
    match helper.call(&request) {
        Ok(HelperResponse::Who(who)) => format!("helper {who}"),
        Ok(HelperResponse::Opened(Ok(fd))) => {
            let mut bytes = Vec::new();
            let read = std::io::Read::read_to_end(&mut std::fs::File::from(fd.into_inner()), &mut bytes);
            match read {
                Ok(n) => format!("helper opened {n} bytes"),
                Err(e) => format!("helper error reading the descriptor: {e}"),
            }
        }
        Ok(HelperResponse::Opened(Err(e))) => format!("helper error {e}"),
        Ok(HelperResponse::Pid(pid)) => format!("helper pid {pid}"),
        Ok(HelperResponse::Slept) => "helper slept".to_owned(),
        Err(CallError::Timeout(t)) => format!("helper error timeout {t:?}"),
        Err(e) => format!("helper error {e}"),
    }
}

struct Testbed {
    /// Memory held on request (`grow MIB`).
    ballast: Vec<Vec<u8>>,
}

impl appsrv::Handler for Testbed {
    fn handle_client(&mut self, client: &mut appsrv::Client) -> io::Result<()> {
        writeln!(client, "pid {}", std::process::id())?;
        let mut line = String::new();
        let mut tolerate_timeouts = false;
        loop {
            line.clear();
            match client.read_line(&mut line) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if tolerate_timeouts && e.kind() == io::ErrorKind::TimedOut => {
                    writeln!(client, "timeout")?;
                    continue;
                }
                Err(e) => return Err(e),
            }
            match line.trim_end() {
                "panic" => panic!("testbed: panic requested by the client"),
                cmd if cmd.starts_with("grow ") => {
                    // Allocate and touch MIB mebibytes, kept for the worker's life.
                    let mib: usize = cmd[5..].parse().unwrap_or(1);
                    self.ballast.push(vec![1u8; mib << 20]);
                    writeln!(client, "grown")?;
                }
                // What the TLS handshake negotiated, as the handler sees it.
                "tls" => match client.tls() {
                    Some(t) => {
                        let line = format!(
                            "tls {} subject={} alpn={} sni={}",
                            t.protocol_version().unwrap_or("?"),
                            t.peer_subject().unwrap_or("-"),
                            t.alpn_protocol().map_or("-".into(), String::from_utf8_lossy),
                            t.server_name().unwrap_or("-"),
                        );
                        writeln!(client, "{line}")?;
                    }
                    None => writeln!(client, "tls none")?,
                },
                // Confinement probes: what the worker may do (`ok ...`) or not (`error ...`).
                cmd if cmd.starts_with("open ") => match std::fs::read(&cmd[5..]) {
                    Ok(bytes) => writeln!(client, "open ok {} bytes", bytes.len())?,
                    Err(e) => writeln!(client, "open error {:?}", e.kind())?,
                },
                cmd if cmd.starts_with("write ") => match std::fs::write(&cmd[6..], b"x") {
                    Ok(()) => writeln!(client, "write ok")?,
                    Err(e) => writeln!(client, "write error {:?}", e.kind())?,
                },
                "socket" => match std::net::UdpSocket::bind("127.0.0.1:0") {
                    Ok(_) => writeln!(client, "socket ok")?,
                    Err(e) => writeln!(client, "socket error {}", e.raw_os_error().unwrap_or(0))?,
                },
                "exec" => match std::process::Command::new("/bin/true").status() {
                    Ok(status) => writeln!(client, "exec ok {status}")?,
                    Err(e) => writeln!(client, "exec error {}", e.raw_os_error().unwrap_or(0))?,
                },
                "thread" => match std::thread::spawn(|| 42).join() {
                    Ok(n) => writeln!(client, "thread ok {n}")?,
                    Err(_) => writeln!(client, "thread error")?,
                },
                "root" => {
                    // SAFETY: setuid has no memory-safety preconditions; the worker is
                    // meant to fail it.
                    let r = unsafe { libc::setuid(0) };
                    writeln!(client, "root {}", if r == 0 { "ok" } else { "error" })?;
                }
                cmd if cmd.starts_with("helper ") => writeln!(client, "{}", ask_helper(client, &cmd[7..]))?,
                "id" => writeln!(client, "id {}", client.id())?,
                "stopping" => writeln!(client, "stopping {}", client.stopping())?,
                "penalize" => match client.penalize() {
                    Some(d) => writeln!(client, "penalized {}", d.as_millis())?,
                    None => writeln!(client, "penalized none")?,
                },
                "tolerate-timeouts" => {
                    tolerate_timeouts = true;
                    writeln!(client, "ok")?;
                }
                cmd if cmd.starts_with("sleep ") => {
                    let secs: f64 = cmd[6..].parse().unwrap_or(1.0);
                    std::thread::sleep(Duration::from_secs_f64(secs));
                    writeln!(client, "slept")?;
                }
                _ => client.write_all(line.as_bytes())?,
            }
        }
    }
}

fn main() {
    serve().unwrap_or_else(|e| e.exit());
}

fn serve() -> appsrv::Result<()> {
    let mut server = appsrv::server!("testbed");
    let opts: Opts = server.args();
    if opts.datagrams {
        return server.run_datagrams(|| Ok(TestDatagrams));
    }
    let (fail_reload, fail_check) = (opts.fail_reload, opts.fail_check);
    for fd in &opts.keep_fd {
        server = server.keep_fd(*fd);
    }
    if opts.helper {
        let fail = opts.helper_fail;
        // Under --sandbox, the helper reads /proc for `helper whoami`, and nothing else.
        server = server.privileged_sandbox(appsrv::Sandbox::new().read("/proc"));
        server = server.privileged(move || {
            if fail {
                return Err("no policy (testbed --helper-fail)".into());
            }
            Ok(TestHelper)
        });
    }
    let server = server
        .on_reload(move || {
            if fail_reload {
                return Err("policy file unreadable (testbed --fail-reload)".into());
            }
            Ok(())
        })
        .on_check(move || {
            if fail_check {
                return Err("policy file unreadable (testbed --fail-check)".into());
            }
            Ok(())
        });
    server.run(move || {
        if opts.crash_if_exists.as_ref().is_some_and(|p| p.exists()) {
            std::process::exit(3);
        }
        if opts.fail_factory {
            return Err("database unavailable (testbed --fail-factory)".into());
        }
        Ok(Testbed { ballast: Vec::new() })
    })
}

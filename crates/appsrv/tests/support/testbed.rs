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
//!
//! `--fail-factory` makes every worker's factory fail, `--fail-reload` the reload hook and
//! `--fail-check` the check hook; `--crash-if-exists PATH` makes a
//! starting worker exit with status 3 while PATH exists; `--keep-fd N` keeps the inherited
//! descriptor N open (`Server::keep_fd`).

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
    let (fail_reload, fail_check) = (opts.fail_reload, opts.fail_check);
    for fd in &opts.keep_fd {
        server = server.keep_fd(*fd);
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

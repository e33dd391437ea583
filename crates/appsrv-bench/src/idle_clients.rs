//! `idle-clients`: opens N keep-alive connections, has each answered once, then holds them
//! all open and idle, for measuring what idle connections cost a server (bench/idle-memory.sh).
//!
//! ```text
//! idle-clients --connect 127.0.0.1:PORT -n 10000 --request 'GET / HTTP/1.1\r\nHost: x\r\n\r\n' --http
//! idle-clients --connect 127.0.0.1:PORT -n 256 --request 'PING\r\n' --until '\n'
//! ```
//!
//! 1. `--threads T` threads (default 4) share the N connections; each thread opens its
//!    share one after another (`--rate R`: at most R a second in all): connect, send the request, read one complete response
//!    (`--http`: status line, headers, `Content-Length` or chunked body; `--until TEXT`: up
//!    to and including TEXT), keep the connection. A connection that fails (connect error,
//!    timeout, reset, close, malformed or non-2xx response) is counted by kind and closed.
//!    Sequential per thread on purpose: every connection is answered before the next one
//!    is opened, so a blocking server's pool grows one worker per client as it would under
//!    clients that arrive one by one, and no connection waits in the listen queue for long.
//! 2. Prints `answered A failed F (...) in S s`, then `holding A`, and holds the answered
//!    connections open and idle (nothing is sent or read) until stdin is closed or gives a
//!    line, or, with `--hold SECS`, for that long (stdin is then not read). A signal that
//!    kills it closes them too (but skips step 3). The caller measures the server then.
//! 3. Checks, with all of them still held: how many are still open (a non-blocking read
//!    that would block; a read of 0 bytes or an error means the server closed it), then that
//!    a new client is served at once: one more connection, the same request, its complete
//!    response timed from before the connect (`new client: answered in X ms`).
//! 4. Closes every connection with an RST (`SO_LINGER` 0), so that a run of 10,000 leaves
//!    no 10,000 `TIME_WAIT` sockets on the client's ephemeral ports for the next run.
//!
//! Every line goes to stdout, flushed at once. Exit status: 0 when the steps completed
//! (failures are counted, not fatal), 1 when the new client was not answered, 2 for bad
//! usage. The caller needs enough descriptors (`ulimit -n` above N) and ephemeral ports
//! (one source address to one port: the default range 32768-60999 gives 28,232).

#![forbid(unsafe_code)]

mod escape;
// Shared with appsrv-bench; this binary uses only the line and HTTP framings.
#[allow(dead_code)]
mod framing;

use std::io::{self, BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser as _;

use crate::escape::unescape;
use crate::framing::{Framing, MAX_HEAD, Parser, Step};

/// Bytes given as text with escapes.
#[derive(Debug, Clone)]
struct Escaped(Vec<u8>);

fn escaped(s: &str) -> Result<Escaped, String> {
    unescape(s).map(Escaped)
}

#[derive(Debug, clap::Parser)]
#[command(
    name = "idle-clients",
    about = "Opens N keep-alive connections, has each answered once, holds them idle, then checks that a new client is served"
)]
struct Args {
    /// The server, HOST:PORT (an IP address: no name resolution).
    #[arg(long)]
    connect: SocketAddr,
    /// The number of connections.
    #[arg(short = 'n', long = "connections", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    n: u32,
    /// The request sent once on each connection, with escapes \r \n \t \\ \0 \xHH.
    #[arg(long, value_parser = escaped)]
    request: Escaped,
    /// Responses are HTTP/1.1 (Content-Length or chunked); only 2xx counts as answered.
    #[arg(long, conflicts_with = "until", required_unless_present = "until")]
    http: bool,
    /// A response ends after this text (escapes as in --request), e.g. '\n'.
    #[arg(long, value_parser = escaped)]
    until: Option<Escaped>,
    /// Threads opening the connections.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    threads: u32,
    /// Seconds a connect, a write or a response may take before it fails.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// Open at most this many connections a second in all [default: as fast as they are
    /// answered]. A blocking server's dynamic pool forks its workers at a bounded pace.
    #[arg(long)]
    rate: Option<f64>,
    /// Release the connections after this many seconds of holding [default: when stdin closes].
    #[arg(long)]
    hold: Option<f64>,
}

/// How one connection's exchange ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Connect,
    Timeout,
    /// Reset, broken pipe, or closed before the response was complete.
    Closed,
    Malformed,
    Non2xx,
    Other,
}

const KINDS: [(Failure, &str); 6] = [
    (Failure::Connect, "connect"),
    (Failure::Timeout, "timeout"),
    (Failure::Closed, "closed"),
    (Failure::Malformed, "malformed"),
    (Failure::Non2xx, "non-2xx"),
    (Failure::Other, "other"),
];

fn classify(e: &io::Error) -> Failure {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Failure::Timeout,
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => Failure::Closed,
        _ => Failure::Other,
    }
}

/// Sends `request` on `s` and reads one complete response; the connection stays usable.
fn exchange(
    s: &mut TcpStream,
    request: &[u8],
    framing: &Framing,
    timeout: Duration,
) -> Result<(), (Failure, String)> {
    let io_err = |e: io::Error| (classify(&e), e.to_string());
    s.set_read_timeout(Some(timeout)).map_err(io_err)?;
    s.set_write_timeout(Some(timeout)).map_err(io_err)?;
    s.write_all(request).map_err(io_err)?;
    let deadline = Instant::now() + timeout;
    let mut parser = Parser::new(framing);
    // Holds at most an unconsumed HTTP head or chunk-size line (MAX_HEAD) plus one read.
    let mut buf = vec![0u8; MAX_HEAD + 16 * 1024];
    let mut have = 0;
    loop {
        if have == buf.len() {
            return Err((Failure::Malformed, "a response head longer than 32 KiB".into()));
        }
        let n = s.read(&mut buf[have..]).map_err(io_err)?;
        if n == 0 {
            return Err((
                Failure::Closed,
                "the server closed the connection before the response was complete".into(),
            ));
        }
        have += n;
        match parser.feed(&buf[..have]) {
            Err(_) => return Err((Failure::Malformed, "a malformed response".into())),
            Ok(Step::Done(used)) => {
                if used < have {
                    return Err((Failure::Malformed, "bytes after the response".into()));
                }
                match parser.http_status() {
                    Some(status) if !(200..300).contains(&status) => {
                        return Err((Failure::Non2xx, format!("HTTP status {status}")));
                    }
                    _ => {}
                }
                if parser.must_close() {
                    return Err((
                        Failure::Closed,
                        "the server announced that it closes the connection".into(),
                    ));
                }
                return Ok(());
            }
            Ok(Step::More(used)) => {
                buf.copy_within(used..have, 0);
                have -= used;
            }
        }
        if Instant::now() >= deadline {
            return Err((Failure::Timeout, "the response took longer than --timeout".into()));
        }
    }
}

/// Connects (within `timeout`) and exchanges one request.
fn open_one(
    addr: SocketAddr,
    request: &[u8],
    framing: &Framing,
    timeout: Duration,
) -> Result<TcpStream, (Failure, String)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| (Failure::Connect, e.to_string()))?;
    let _ = s.set_nodelay(true);
    exchange(&mut s, request, framing, timeout)?;
    Ok(s)
}

/// Closes with an RST rather than a FIN: no `TIME_WAIT` left behind on the client's port.
fn abort(s: TcpStream) {
    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
    drop(s);
}

/// What one opening thread did.
#[derive(Debug, Default)]
struct Opened {
    held: Vec<TcpStream>,
    failures: Vec<(Failure, String)>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !(args.timeout > 0.0 && args.timeout <= 3600.0) {
        eprintln!("idle-clients: --timeout must be between 0 and 3600 seconds");
        return ExitCode::from(2);
    }
    if args.hold.is_some_and(|h| !(0.0..=31_536_000.0).contains(&h)) {
        eprintln!("idle-clients: --hold must be between 0 and a year of seconds");
        return ExitCode::from(2);
    }
    if args.rate.is_some_and(|r| !(r > 0.0 && r <= 1e7)) {
        eprintln!("idle-clients: --rate must be a number of connections a second above 0");
        return ExitCode::from(2);
    }
    let framing = match &args.until {
        Some(Escaped(t)) if t.is_empty() => {
            eprintln!("idle-clients: --until must not be empty");
            return ExitCode::from(2);
        }
        Some(Escaped(t)) => Framing::Until(t.clone()),
        None => Framing::Http,
    };
    run(&args, &framing)
}

fn say(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn run(args: &Args, framing: &Framing) -> ExitCode {
    let timeout = Duration::from_secs_f64(args.timeout);
    let started = Instant::now();
    let threads = args.threads.min(args.n);
    let opened: Vec<Opened> = thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                // Shares as equal as they can be: the first n % threads get one more.
                let share = args.n / threads + u32::from(t < args.n % threads);
                // With --rate, this thread's k-th connection is due at k * threads / rate.
                let interval = args.rate.map(|r| Duration::from_secs_f64(f64::from(threads) / r));
                scope.spawn(move || {
                    let mut o = Opened::default();
                    for k in 0..share {
                        if let Some(i) = interval {
                            let due = started + i * k;
                            let now = Instant::now();
                            if due > now {
                                thread::sleep(due - now);
                            }
                        }
                        match open_one(args.connect, &args.request.0, framing, timeout) {
                            Ok(s) => o.held.push(s),
                            Err(f) => o.failures.push(f),
                        }
                    }
                    o
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("an opening thread panicked"))
            .collect()
    });
    let elapsed = started.elapsed();
    let mut held: Vec<TcpStream> = Vec::with_capacity(args.n as usize);
    let mut failures = Vec::new();
    for o in opened {
        held.extend(o.held);
        failures.extend(o.failures);
    }
    let by_kind: Vec<String> = KINDS
        .iter()
        .map(|(k, name)| format!("{name} {}", failures.iter().filter(|(f, _)| f == k).count()))
        .collect();
    say(&format!(
        "answered {} failed {} ({}) in {:.2} s",
        held.len(),
        failures.len(),
        by_kind.join(", "),
        elapsed.as_secs_f64()
    ));
    if let Some((_, first)) = failures.first() {
        say(&format!("first failure: {first}"));
    }
    say(&format!("holding {}", held.len()));

    wait_for_release(args.hold);

    // Still open? A non-blocking read of an idle connection would block; 0 bytes or an
    // error means the server closed it (a keep-alive timeout shorter than the hold, say).
    let (mut open, mut closed, mut data) = (0, 0, 0);
    let mut probe = [0u8; 256];
    for s in &held {
        let _ = s.set_nonblocking(true);
        match (&*s).read(&mut probe) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => open += 1,
            Ok(0) | Err(_) => closed += 1,
            Ok(_) => data += 1,
        }
    }
    say(&format!(
        "still open {open} of {} (closed by the server {closed}, unexpected data on {data})",
        held.len()
    ));

    // A new client, while all of them are still held.
    let t0 = Instant::now();
    let code = match open_one(args.connect, &args.request.0, framing, timeout) {
        Ok(s) => {
            say(&format!(
                "new client: answered in {:.2} ms",
                t0.elapsed().as_secs_f64() * 1e3
            ));
            abort(s);
            ExitCode::SUCCESS
        }
        Err((_, why)) => {
            say(&format!(
                "new client: failed after {:.2} ms: {why}",
                t0.elapsed().as_secs_f64() * 1e3
            ));
            ExitCode::from(1)
        }
    };
    for s in held {
        abort(s);
    }
    code
}

/// With `hold`, returns after that many seconds (stdin is not read: a background job's
/// stdin may be /dev/null); without, when stdin gives a line or its end.
fn wait_for_release(hold: Option<f64>) {
    match hold {
        Some(h) => thread::sleep(Duration::from_secs_f64(h)),
        None => {
            let mut line = String::new();
            let _ = io::stdin().lock().read_line(&mut line);
        }
    }
}

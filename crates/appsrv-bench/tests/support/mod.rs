//! Scripted servers for the tests, and a way to run appsrv-bench.
//!
//! A [`Server`] listens on 127.0.0.1:0 (or a fresh Unix socket path), counts the
//! connections it accepts, and runs a handler in a thread per connection. Dropping it
//! stops the accept thread (woken by a connection of its own) and joins every connection
//! thread; the handlers end when appsrv-bench, which has exited by then, closed its side.

#![allow(dead_code)] // not every test uses every helper
#![allow(unreachable_pub)]

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a test may wait for anything before it fails. Generous: the tests run on a
/// loaded two-core machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A connection of a scripted server.
pub trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

type Handler = Arc<dyn Fn(&mut dyn Conn) -> io::Result<()> + Send + Sync>;

enum Wake {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// A scripted server running in threads of the test.
pub struct Server {
    addr: String,
    wake: Wake,
    accepts: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves each TCP connection with `handler`, on 127.0.0.1 and a port of the system's
    /// choosing.
    pub fn tcp(handler: impl Fn(&mut dyn Conn) -> io::Result<()> + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let accept = move || -> io::Result<Box<dyn Conn>> {
            let (s, _) = listener.accept()?;
            s.set_nodelay(true)?; // each write of a handler is its own segment
            s.set_read_timeout(Some(PATIENCE))?;
            s.set_write_timeout(Some(PATIENCE))?;
            Ok(Box::new(s))
        };
        Server::start(addr.to_string(), Wake::Tcp(addr), accept, Arc::new(handler))
    }

    /// Serves each connection to a fresh Unix socket path with `handler`.
    pub fn unix(handler: impl Fn(&mut dyn Conn) -> io::Result<()> + Send + Sync + 'static) -> Server {
        let path = unique_path("sock");
        let listener = UnixListener::bind(&path).expect("bind unix socket");
        let accept = move || -> io::Result<Box<dyn Conn>> {
            let (s, _) = listener.accept()?;
            s.set_read_timeout(Some(PATIENCE))?;
            s.set_write_timeout(Some(PATIENCE))?;
            Ok(Box::new(s))
        };
        Server::start(
            format!("unix:{}", path.display()),
            Wake::Unix(path),
            accept,
            Arc::new(handler),
        )
    }

    fn start(
        addr: String,
        wake: Wake,
        mut accept: impl FnMut() -> io::Result<Box<dyn Conn>> + Send + 'static,
        handler: Handler,
    ) -> Server {
        let accepts = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (accepts, stop) = (accepts.clone(), stop.clone());
            thread::spawn(move || {
                let mut conns = Vec::new();
                loop {
                    let conn = accept();
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(mut conn) = conn else { break };
                    accepts.fetch_add(1, Ordering::SeqCst);
                    let handler = handler.clone();
                    conns.push(thread::spawn(move || {
                        let _ = handler(&mut *conn);
                    }));
                }
                for c in conns {
                    c.join().expect("connection handler panicked");
                }
            })
        };
        Server {
            addr,
            wake,
            accepts,
            stop,
            thread: Some(thread),
        }
    }

    /// The address to give appsrv-bench.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Connections accepted so far. Exact once appsrv-bench got a response on each of its
    /// connections; otherwise use [`Server::stop`].
    pub fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }

    /// Stops the server and returns how many connections it accepted in all. Exact: the
    /// accept thread stops at its own wake-up connection, made after every connection of
    /// appsrv-bench, which the listen queue hands out in order.
    pub fn stop(self) -> usize {
        let accepts = self.accepts.clone();
        drop(self);
        accepts.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = match &self.wake {
            Wake::Tcp(a) => TcpStream::connect(a).map(drop),
            Wake::Unix(p) => UnixStream::connect(p).map(drop),
        };
        if let Some(t) = self.thread.take() {
            let joined = t.join();
            if let Wake::Unix(p) = &self.wake {
                let _ = std::fs::remove_file(p);
            }
            if joined.is_err() && !thread::panicking() {
                panic!("server thread panicked");
            }
        }
    }
}

/// A path in the temporary directory that no other test (or test run) uses.
pub fn unique_path(ext: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let path = std::env::temp_dir().join(format!("appsrv-bench-test-{}-{n}.{ext}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// Calls `f` with each message of the connection (the bytes through `delim`) until the
/// client closes the connection.
pub fn for_each_message(
    conn: &mut dyn Conn,
    delim: &[u8],
    mut f: impl FnMut(&[u8], &mut dyn Conn) -> io::Result<()>,
) -> io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(p) = buf.windows(delim.len()).position(|w| w == delim) {
            let msg: Vec<u8> = buf.drain(..p + delim.len()).collect();
            f(&msg, conn)?;
        }
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Reads one message through `delim` (for handlers that answer once and close).
pub fn read_message(conn: &mut dyn Conn, delim: &[u8]) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(delim) {
        if conn.read(&mut byte)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.push(byte[0]);
    }
    Ok(buf)
}

/// Reads until the client closes the connection, answering nothing.
pub fn drain(conn: &mut dyn Conn) -> io::Result<()> {
    let mut chunk = [0u8; 4096];
    while conn.read(&mut chunk)? > 0 {}
    Ok(())
}

/// A finished run of appsrv-bench.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Runs appsrv-bench with `args`; fails the test if it runs longer than [`PATIENCE`].
pub fn bench(args: &[&str]) -> Run {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_appsrv-bench"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start appsrv-bench");
    let pid = child.id();
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out = thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send(());
        status
    });
    if rx.recv_timeout(PATIENCE).is_err() {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        let _ = waiter.join();
        panic!("appsrv-bench {args:?} still running after {PATIENCE:?}: killed");
    }
    let status = waiter.join().expect("waiter").expect("wait for appsrv-bench");
    Run {
        code: status.code(),
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
        elapsed: started.elapsed(),
    }
}

/// Runs appsrv-bench with `args` and `--json`, checks that it succeeded, and returns the
/// report.
pub fn bench_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let run = bench(&all);
    assert_eq!(run.code, Some(0), "appsrv-bench {all:?} failed: {}", run.stderr);
    let report: Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("--json output does not parse ({e}): {:?}", run.stdout));
    assert!(report.is_object(), "{report}");
    report
}

/// `report[key]` as an integer.
pub fn int(report: &Value, key: &str) -> u64 {
    report[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not an integer in {report}"))
}

/// `report.errors[kind]`.
pub fn errors(report: &Value, kind: &str) -> u64 {
    report["errors"][kind]
        .as_u64()
        .unwrap_or_else(|| panic!("errors.{kind} missing in {report}"))
}

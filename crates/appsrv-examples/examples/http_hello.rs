//! A small HTTP/1.1 server on the request level: `Hello, World!` and static files.
//!
//! Run it:
//!
//! ```text
//! cargo run --release --example http_hello                        # serves 127.0.0.1:8080
//! cargo run --release --example http_hello -- --static-dir ./site # and ./site under /static/
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
//! $ curl -I http://127.0.0.1:8080/static/index.html   # HEAD: the same head, no body
//! $ ab -n 100000 -c 8 -k http://127.0.0.1:8080/      # or: wrk -c 8 -d 10 http://127.0.0.1:8080/
//! ```
//!
//! Routes: `GET /` answers `Hello, World!` (text/plain); `GET /static/NAME` sends the file
//! NAME of `--static-dir` with `sendfile(2)`, its `Content-Type` taken from the extension;
//! a missing file is `404`, a name that tries to leave the directory (`..`, an absolute
//! path, a NUL byte, a symbolic link to a file outside) is `400` or `404`; `POST /echo`
//! answers the request's body (up to the codec's 1 MiB, `Content-Length` or chunked):
//! what a handler gets of a body, in each I/O model; other methods than `GET` and `HEAD`
//! get `405` with `Allow: GET, HEAD`. `GET /sleep?ms=N` (N up to 10000) sleeps N ms in the
//! handler, then answers `slept`: a handler that blocks, to see what it does in each I/O
//! model.
//!
//! I/O model: blocking by default (one connection at a time per worker: the handler may
//! block, as `/sleep` does, without delaying other clients). `--io event -w 2` serves every
//! connection from one epoll loop per worker, as nginx does: the way to hold thousands of
//! keep-alive clients with two processes, as long as handlers do not block (a `/sleep`
//! call there holds up every connection of its worker, and is logged by `--slow-request`).
//!
//! What to observe: a keep-alive client (`ab -k`, `wrk`, `curl` with several URLs) keeps
//! its connection and its worker; pipelined requests are answered in order with their
//! responses written together; a malformed request gets `400 Bad Request` with
//! `Connection: close` and the worker goes on with the next client. A `--static-dir` that
//! does not exist stops the server at start with a clear message.
//!
//! With `--sandbox`, workers may read `--static-dir` and nothing else on disk, and make
//! only the default profile's system calls (see `docs/SECURITY.md`); over TLS
//! (`-l '127.0.0.1:8443?tls' --tls-cert cert.pem --tls-key key.pem`) nothing else changes.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use appsrv::codec::{Http, HttpRequest, HttpResponse};

#[derive(clap::Args, Debug)]
struct Args {
    /// Serve the files of DIR under /static/ (without it, /static/ answers 404).
    #[arg(long, value_name = "DIR")]
    static_dir: Option<PathBuf>,
}

struct HttpHello {
    /// The static directory, opened by each worker: files are opened relative to it.
    root: Option<File>,
}

impl appsrv::RequestHandler for HttpHello {
    type Codec = Http;
    type Session = ();

    fn handle_request(
        &mut self,
        _conn: &mut appsrv::Conn<'_>,
        req: &HttpRequest<'_>,
        res: &mut HttpResponse<'_>,
    ) -> io::Result<()> {
        if req.method() == "POST" && req.path() == "/echo" {
            res.content_type("application/octet-stream");
            return res.write_all(req.body());
        }
        if req.method() != "GET" && req.method() != "HEAD" {
            res.header("Allow", "GET, HEAD");
            return plain(res, 405, "method not allowed\n");
        }
        let path = req.path();
        if path == "/" {
            res.content_type("text/plain");
            return res.write_all(b"Hello, World!");
        }
        if path == "/sleep" {
            let ms = req
                .query()
                .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("ms=")))
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|n| *n <= 10_000);
            let Some(ms) = ms else {
                return plain(res, 400, "expected /sleep?ms=N with N from 0 to 10000\n");
            };
            std::thread::sleep(std::time::Duration::from_millis(ms));
            return plain(res, 200, "slept\n");
        }
        match path.strip_prefix("/static/") {
            Some(name) => self.static_file(name, res),
            None => plain(res, 404, "not found\n"),
        }
    }
}

impl HttpHello {
    /// Sends the file `name` (still percent-encoded, as in the request) of the static
    /// directory.
    fn static_file(&self, name: &str, res: &mut HttpResponse<'_>) -> io::Result<()> {
        let Some(root) = &self.root else {
            return plain(res, 404, "not found\n");
        };
        let Some(name) = percent_decode(name) else {
            return plain(res, 400, "bad percent-encoding\n");
        };
        let Some(relative) = safe_relative_path(&name) else {
            return plain(res, 400, "bad file name\n");
        };
        // Symbolic links are followed, but only to files inside the directory: the kernel
        // resolves the whole path beneath the directory's descriptor (RESOLVE_BENEATH) in
        // one system call, where canonicalize() would readlink every component first.
        let file = match open_beneath(root, relative) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => return plain(res, 404, "not found\n"),
            other => other,
        };
        let (file, len) = match file.and_then(|f| f.metadata().map(|m| (f, m))) {
            Ok((f, meta)) if meta.is_file() => (f, meta.len()),
            Ok(_) => return plain(res, 404, "not found\n"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return plain(res, 404, "not found\n"),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return plain(res, 403, "forbidden\n"),
            Err(e) => return Err(e),
        };
        res.content_type(content_type(relative));
        res.send_file(file, 0..len);
        Ok(())
    }
}

/// Opens `relative` for reading beneath the directory `root` (`openat2` with
/// `RESOLVE_BENEATH`, Linux 5.6): an absolute path, `..` or a symbolic link that would
/// leave the directory fails with `EXDEV`.
fn open_beneath(root: &File, relative: &Path) -> io::Result<File> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH);
    nix::fcntl::openat2(root, relative, how)
        .map(File::from)
        .map_err(io::Error::from)
}

/// A short text/plain response.
fn plain(res: &mut HttpResponse<'_>, status: u16, text: &str) -> io::Result<()> {
    res.status(status).content_type("text/plain; charset=utf-8");
    res.write_all(text.as_bytes())
}

/// Decodes `%XX` escapes; `None` for a malformed escape.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hi = (bytes.next()? as char).to_digit(16)?;
            let lo = (bytes.next()? as char).to_digit(16)?;
            out.push((hi * 16 + lo) as u8);
        } else {
            out.push(b);
        }
    }
    Some(out)
}

/// `name` as a path relative to the static directory, or `None` if it could leave it or
/// is not a plain file name: empty, absolute, with a NUL, or with an empty, `.` or `..`
/// component.
fn safe_relative_path(name: &[u8]) -> Option<&Path> {
    if name.is_empty() || name.contains(&0) {
        return None;
    }
    let plain = name
        .split(|b| *b == b'/')
        .all(|part| !part.is_empty() && part != b"." && part != b"..");
    plain.then(|| Path::new(OsStr::from_bytes(name)))
}

/// The `Content-Type` of a file, from its extension.
fn content_type(path: &Path) -> &'static str {
    let ext = path.extension().and_then(OsStr::to_str).unwrap_or("");
    match ext.to_ascii_lowercase().as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "txt" => "text/plain; charset=utf-8",
        "css" => "text/css",
        "js" => "text/javascript",
        "json" => "application/json",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "svg" => "image/svg+xml",
        "xml" => "application/xml",
        _ => "application/octet-stream",
    }
}

/// The canonical form of `--static-dir`, which must be a directory.
fn static_root(dir: &Path) -> appsrv::Result<PathBuf> {
    let root = dir
        .canonicalize()
        .map_err(|e| appsrv::Error::Config(format!("--static-dir {}: {e}", dir.display())))?;
    if !root.is_dir() {
        return Err(appsrv::Error::Config(format!(
            "--static-dir {}: not a directory",
            dir.display()
        )));
    }
    // Files are opened with openat2 (Linux 5.6); say so at start rather than fail each
    // request on an older kernel.
    let dir = File::open(&root)
        .map_err(|e| appsrv::Error::Config(format!("--static-dir {}: {e}", dir.display())))?;
    match open_beneath(&dir, Path::new(".")) {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => Err(appsrv::Error::Config(
            "--static-dir needs Linux 5.6 or newer (openat2 with RESOLVE_BENEATH)".into(),
        )),
        _ => Ok(root),
    }
}

fn main() {
    serve().unwrap_or_else(|e| e.exit());
}

fn serve() -> appsrv::Result<()> {
    let mut server = appsrv::server!("http_hello")
        .about("Answers Hello, World! over HTTP/1.1 and serves the files of --static-dir")
        .listen("127.0.0.1:8080");
    let args: Args = server.args();
    let root = args.static_dir.as_deref().map(static_root).transpose()?;
    // Under --sandbox, the workers may read the static directory and nothing else.
    let mut profile = appsrv::Sandbox::new();
    if let Some(dir) = &root {
        profile = profile.read(dir);
    }
    server.sandbox(profile).run_requests(move || {
        // Opened in each worker, after the privilege drop: a directory the workers' user
        // cannot read stops the server at start with that error.
        let root = root.as_deref().map(File::open).transpose()?;
        Ok(HttpHello { root })
    })
}

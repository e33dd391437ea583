//! TLS listeners (`ADDR?tls`): handshakes with rustls and `openssl s_client` against the
//! echo and http_hello examples, client certificates, ALPN, plain-text and silent clients,
//! bad material refused before start, and reload with new certificates under load.
//!
//! Regression tests for issue #9 ("TLS for any protocol, with rustls").

mod util;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use util::*;

/// A test CA and the files it issues, in a directory removed at the end.
struct Pki {
    dir: PathBuf,
    ca_params: CertificateParams,
    ca_key: KeyPair,
    ca_der: CertificateDer<'static>,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("appsrv-tls-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "appsrv test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki {
            dir,
            ca_params,
            ca_key,
            ca_der: ca.der().clone(),
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// Issues a certificate for `cn` (valid for localhost and 127.0.0.1), written as
    /// `NAME.pem` and `NAME.key`; returns its DER.
    fn issue(&self, name: &str, cn: &str, validity: Option<(i32, i32)>) -> CertificateDer<'static> {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        params.distinguished_name.push(DnType::CommonName, cn);
        if let Some((from, until)) = validity {
            params.not_before = rcgen::date_time_ymd(from, 1, 1);
            params.not_after = rcgen::date_time_ymd(until, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        // Written aside, then renamed: a server re-reading them never sees half a file.
        for (ext, text) in [("pem", cert.pem()), ("key", key.serialize_pem())] {
            let tmp = self.dir.join(format!("{name}.{ext}.tmp"));
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, self.dir.join(format!("{name}.{ext}"))).unwrap();
        }
        cert.der().clone()
    }

    fn client_config(&self, client: Option<&str>, alpn: &[&str]) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        let builder = ClientConfig::builder_with_provider(Arc::new(ring_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match client {
            None => builder.with_no_client_auth(),
            Some(name) => {
                let chain = vec![CertificateDer::from_pem_file(self.path(&format!("{name}.pem"))).unwrap()];
                let key = PrivateKeyDer::from_pem_file(self.path(&format!("{name}.key"))).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
        };
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        Arc::new(config)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

type Tls = StreamOwned<ClientConnection, TcpStream>;

/// Connects and completes the handshake (a failed handshake panics with the reason).
fn connect(addr: SocketAddr, config: &Arc<ClientConfig>) -> Tls {
    try_connect(addr, config).unwrap_or_else(|e| panic!("TLS handshake with {addr}: {e}"))
}

fn try_connect(addr: SocketAddr, config: &Arc<ClientConfig>) -> std::io::Result<Tls> {
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(PATIENCE))?;
    let conn = ClientConnection::new(config.clone(), ServerName::try_from("localhost").unwrap())
        .map_err(std::io::Error::other)?;
    let mut tls = StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

fn read_line(tls: &mut impl BufRead) -> String {
    let mut line = String::new();
    tls.read_line(&mut line).expect("a line from the server");
    line
}

/// The server's leaf certificate on a new connection.
fn served_certificate(addr: SocketAddr, config: &Arc<ClientConfig>) -> CertificateDer<'static> {
    let tls = connect(addr, config);
    tls.conn.peer_certificates().unwrap()[0].clone()
}

/// One HTTP/1.1 GET of `path` on a TLS connection; returns the body.
fn https_get(tls: &mut BufReader<Tls>, path: &str) -> std::io::Result<Vec<u8>> {
    write!(tls.get_mut(), "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
    tls.get_mut().flush()?;
    let mut status = String::new();
    if tls.read_line(&mut status)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if !status.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!("status {status:?}")));
    }
    let mut length = 0;
    loop {
        let mut header = String::new();
        tls.read_line(&mut header)?;
        if header == "\r\n" {
            break;
        }
        if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    tls.read_exact(&mut body)?;
    Ok(body)
}

fn tls_args<'a>(pki: &'a Pki, cert: &'a str, key: &'a str) -> Vec<String> {
    vec![
        "-l".into(),
        "127.0.0.1:0?tls".into(),
        "--tls-cert".into(),
        pki.path(cert),
        "--tls-key".into(),
        pki.path(key),
    ]
}

/// Starts `example_name` on a TLS listener with the PKI's `server` certificate and key,
/// and `extra` options.
fn start_tls(example_name: &str, pki: &Pki, extra: &[&str]) -> Server {
    let mut args = tls_args(pki, "server.pem", "server.key");
    args.extend(extra.iter().map(|a| a.to_string()));
    start(example_name, &args)
}

fn start(example_name: &str, args: &[String]) -> Server {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(example_name, &args)
}

fn run(example_name: &str, args: &[String]) -> std::process::Output {
    Command::new(example(example_name)).args(args).output().unwrap()
}

#[test]
fn echo_over_tls_with_rustls_and_openssl_s_client() {
    let pki = Pki::new("echo");
    pki.issue("server", "localhost", None);
    let server = start_tls("echo", &pki, &[]);
    let addr = server.tcp_addr();

    let mut tls = BufReader::new(connect(addr, &pki.client_config(None, &[])));
    tls.get_mut().write_all(b"hello over rustls\n").unwrap();
    assert_eq!(read_line(&mut tls), "hello over rustls\n");
    tls.get_mut().write_all(b"and again\n").unwrap();
    assert_eq!(read_line(&mut tls), "and again\n");
    drop(tls);

    // openssl s_client verifies the chain against our CA and echoes a line back.
    let mut child = Command::new("openssl")
        .args(["s_client", "-quiet", "-verify_return_error", "-connect"])
        .arg(addr.to_string())
        .args(["-servername", "localhost", "-CAfile"])
        .arg(pki.path("ca.pem"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_client (apt-get install openssl)");
    let mut guard = KillOnDrop(Some(child.id()));
    child
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"hello over openssl\n")
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "hello over openssl\n");
    drop(child.stdin.take());
    guard.kill();
    child.wait().unwrap();
}

/// Kills a helper process (openssl) if the test fails before it ends.
struct KillOnDrop(Option<u32>);

impl KillOnDrop {
    fn kill(&mut self) {
        if let Some(pid) = self.0.take() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill();
    }
}

both_io!(not_async("async_hello has no --static-dir (http_hello's own option)"): http_hello_over_tls_keeps_alive_and_sends_large_files_in_a_sandbox);
fn http_hello_over_tls_keeps_alive_and_sends_large_files_in_a_sandbox(io: Io) {
    let pki = Pki::new(&format!("http-{}", io.name()));
    pki.issue("server", "localhost", None);
    let site = pki.dir.join("site");
    std::fs::create_dir_all(&site).unwrap();
    // 1 MiB that is not all one byte, so a misplaced chunk would show.
    let big: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(site.join("big.bin"), &big).unwrap();
    // Sandboxed too: TLS and the static files need nothing beyond the default profile and
    // the directory http_hello adds to it.
    let server = start_tls(
        "http_hello",
        &pki,
        &io.args(&["--static-dir", &site.to_string_lossy(), "--sandbox"]),
    );
    let addr = server.tcp_addr();

    let mut tls = BufReader::new(connect(addr, &pki.client_config(None, &[])));
    assert_eq!(https_get(&mut tls, "/").unwrap(), b"Hello, World!");
    assert_eq!(
        https_get(&mut tls, "/").unwrap(),
        b"Hello, World!",
        "the same connection"
    );
    assert!(
        https_get(&mut tls, "/static/big.bin").unwrap() == big,
        "the file, intact"
    );
    assert_eq!(https_get(&mut tls, "/").unwrap(), b"Hello, World!");

    let out = Command::new("openssl")
        .args(["s_client", "-quiet", "-verify_return_error", "-connect"])
        .arg(addr.to_string())
        .args(["-servername", "localhost", "-CAfile"])
        .arg(pki.path("ca.pem"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .and_then(|mut child| {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
            child.wait_with_output()
        })
        .expect("openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("Hello, World!"), "{text}");
}

#[test]
fn a_client_certificate_is_required_and_its_subject_reaches_the_handler() {
    let pki = Pki::new("mtls");
    pki.issue("server", "localhost", None);
    pki.issue("alice", "alice", None);
    let server = start_tls(
        "testbed",
        &pki,
        &["--tls-client-ca", &pki.path("ca.pem"), "-w", "1"],
    );
    let addr = server.tcp_addr();
    let worker = server.wait_for_workers(1);

    // Without a certificate: TLS 1.3 lets the client finish first, so the refusal shows
    // on its first read.
    let refused = try_connect(addr, &pki.client_config(None, &[])).and_then(|tls| {
        let mut tls = BufReader::new(tls);
        let mut line = String::new();
        tls.read_line(&mut line).map(|_| line)
    });
    assert!(
        refused.as_ref().is_err() || refused.as_ref().is_ok_and(|l| l.is_empty()),
        "served without a client certificate: {refused:?}"
    );
    server.wait_for_log("TLS handshake with 127.0.0.1");

    let mut tls = BufReader::new(connect(addr, &pki.client_config(Some("alice"), &[])));
    assert!(read_line(&mut tls).starts_with("pid "));
    tls.get_mut().write_all(b"tls\n").unwrap();
    let line = read_line(&mut tls);
    assert!(line.starts_with("tls TLSv1.3 subject=CN=alice "), "{line}");
    assert_eq!(server.worker_pids(), worker, "the same worker served both");
}

#[test]
fn alpn_is_negotiated_and_a_client_without_a_common_protocol_is_refused() {
    let pki = Pki::new("alpn");
    pki.issue("server", "localhost", None);
    let server = start_tls("testbed", &pki, &["--tls-alpn", "appsrv/1,appsrv/2"]);
    let addr = server.tcp_addr();

    let mut tls = BufReader::new(connect(addr, &pki.client_config(None, &["appsrv/2"])));
    read_line(&mut tls);
    tls.get_mut().write_all(b"tls\n").unwrap();
    let line = read_line(&mut tls);
    assert!(line.contains(" alpn=appsrv/2 sni=localhost"), "{line}");

    let e = try_connect(addr, &pki.client_config(None, &["other"])).err();
    assert!(e.is_some(), "a handshake without a common protocol must fail");
}

#[test]
fn a_plain_text_client_on_a_tls_listener_is_closed_at_once_and_the_worker_serves_on() {
    let pki = Pki::new("plain");
    pki.issue("server", "localhost", None);
    // A long handshake limit: the plain client must be closed because of what it sent,
    // not because the limit ran out.
    let ctl = socket_path("tls-plain");
    let server = start_tls(
        "testbed",
        &pki,
        &["-w", "1", "--tls-handshake-timeout", "600", "--control", &ctl],
    );
    let addr = server.tcp_addr();
    let worker = server.wait_for_workers(1);

    let mut plain = TcpStream::connect(addr).unwrap();
    plain.set_read_timeout(Some(PATIENCE)).unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut reply = Vec::new();
    match plain.read_to_end(&mut reply) {
        Ok(_) => {}
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "closed, not left waiting: {e}"
        ),
    }
    assert!(
        !reply.windows(4).any(|w| w == b"pid "),
        "no handler output in clear text"
    );
    let log = server.wait_for_log("TLS handshake with 127.0.0.1");
    assert!(log.contains("failed"), "{log}");
    // Counted, for the operator (the worker counts it before it closes the connection).
    let metrics = run("testbed", &["metrics".into(), "--control".into(), ctl]);
    let text = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        text.lines().any(|l| l == "appsrv_tls_handshake_failures_total 1"),
        "{text}"
    );

    // The single worker is free and serves a TLS client.
    let mut tls = BufReader::new(connect(addr, &pki.client_config(None, &[])));
    assert!(read_line(&mut tls).starts_with("pid "));
    assert_eq!(server.worker_pids(), worker, "the worker survived");
}

#[test]
fn a_client_that_never_completes_its_handshake_is_dropped_at_the_timeout() {
    let pki = Pki::new("silent");
    pki.issue("server", "localhost", None);
    let server = start_tls("testbed", &pki, &["-w", "1", "--tls-handshake-timeout", "1"]);
    let addr = server.tcp_addr();

    let mut silent = TcpStream::connect(addr).unwrap();
    silent.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0u8; 64];
    match silent.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0, "closed without a byte of clear text"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    server.wait_for_log("the TLS handshake took too long");
    let mut tls = BufReader::new(connect(addr, &pki.client_config(None, &[])));
    assert!(
        read_line(&mut tls).starts_with("pid "),
        "the worker serves the next client"
    );
}

/// Issue 14: the handshake's limit is overall, not per read. A ClientHello trickled a
/// byte every 100 ms (each read gets its byte long before any read timeout) is cut at the
/// handshake timeout all the same.
#[test]
fn issue_14_a_trickled_handshake_is_cut_at_the_timeout() {
    let pki = Pki::new("trickle");
    pki.issue("server", "localhost", None);
    let server = start_tls("testbed", &pki, &["-w", "1", "--tls-handshake-timeout", "1"]);
    let addr = server.tcp_addr();
    let mut s = TcpStream::connect(addr).unwrap();
    // A handshake record announcing 512 bytes, then its body, slowly: about 50 s in all.
    let mut hello = vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03];
    hello.resize(5 + 512, 0x2a);
    let (cut, held) = trickle(&mut s, &hello, std::time::Duration::from_millis(100));
    assert!(cut, "the whole trickled record went through ({held:?})");
    assert!(held < std::time::Duration::from_secs(10), "held for {held:?}");
    server.wait_for_log("the TLS handshake took too long");
    let mut tls = BufReader::new(connect(addr, &pki.client_config(None, &[])));
    assert!(read_line(&mut tls).starts_with("pid "), "the worker serves on");
}

/// `GET /` over a new TLS connection to http_hello answers `Hello, World!`.
fn assert_https_hello(addr: SocketAddr, pki: &Pki) {
    let mut tls = BufReader::new(connect(addr, &pki.client_config(None, &[])));
    assert_eq!(https_get(&mut tls, "/").unwrap(), b"Hello, World!");
}

/// Reads what a server sends on `s` until it closes: the bytes, or an error that is not
/// a reset (a reset is a close too).
fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut reply = Vec::new();
    match s.read_to_end(&mut reply) {
        Ok(_) => {}
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "closed, not left waiting: {e}"
        ),
    }
    reply
}

both_io!(a_plain_text_client_of_a_request_level_server_is_closed_and_the_worker_serves_on);
/// The plain-text and silent-client cases of the testbed's tests above, on a request-level
/// server (http_hello) in each I/O model: the handshake is the framework's in both, made
/// without blocking in event mode.
fn a_plain_text_client_of_a_request_level_server_is_closed_and_the_worker_serves_on(io: Io) {
    let pki = Pki::new(&format!("rl-plain-{}", io.name()));
    pki.issue("server", "localhost", None);
    let server = start_tls(
        io.example("http_hello"),
        &pki,
        &io.args(&["-w", "1", "--tls-handshake-timeout", "600"]),
    );
    let addr = server.tcp_addr();
    let mut plain = TcpStream::connect(addr).unwrap();
    plain.set_read_timeout(Some(PATIENCE)).unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let reply = read_until_closed(&mut plain);
    assert!(
        !reply.windows(5).any(|w| w == b"Hello"),
        "no handler output in clear text"
    );
    let log = server.wait_for_log("TLS handshake with 127.0.0.1");
    assert!(log.contains("failed"), "{log}");
    assert_https_hello(addr, &pki);
}

both_io!(a_request_level_servers_handshake_is_cut_at_the_timeout);
/// Issue 14's overall handshake limit, on a request-level server in each I/O model: a
/// ClientHello trickled a byte every 100 ms is cut at `--tls-handshake-timeout`, and so is
/// a client that sends nothing; the worker serves on.
fn a_request_level_servers_handshake_is_cut_at_the_timeout(io: Io) {
    let pki = Pki::new(&format!("rl-trickle-{}", io.name()));
    pki.issue("server", "localhost", None);
    let server = start_tls(
        io.example("http_hello"),
        &pki,
        &io.args(&["-w", "1", "--tls-handshake-timeout", "1"]),
    );
    let addr = server.tcp_addr();
    let mut silent = TcpStream::connect(addr).unwrap();
    silent.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    // A handshake record announcing 512 bytes, then its body, slowly: about 50 s in all.
    let mut hello = vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03];
    hello.resize(5 + 512, 0x2a);
    let (cut, held) = trickle(&mut s, &hello, std::time::Duration::from_millis(100));
    assert!(cut, "the whole trickled record went through ({held:?})");
    assert!(held < std::time::Duration::from_secs(10), "held for {held:?}");
    assert!(
        read_until_closed(&mut silent).is_empty(),
        "the silent client is closed without a byte"
    );
    server.wait_for_log("the TLS handshake took too long");
    assert_https_hello(addr, &pki);
}

#[test]
fn bad_tls_material_is_refused_before_start_with_the_file_named() {
    let pki = Pki::new("bad");
    pki.issue("server", "localhost", None);
    pki.issue("other", "localhost", None);
    pki.issue("expired", "localhost", Some((2020, 2021)));
    pki.issue("future", "localhost", Some((2090, 2091)));
    std::fs::write(pki.dir.join("garbage.pem"), "not PEM at all\n").unwrap();
    let cases: &[(Vec<String>, &str)] = &[
        (
            tls_args(&pki, "missing.pem", "server.key"),
            "missing.pem: cannot read it",
        ),
        (
            tls_args(&pki, "garbage.pem", "server.key"),
            "garbage.pem: no certificate in this file",
        ),
        (
            tls_args(&pki, "server.pem", "other.key"),
            "other.key: this key does not match the certificate",
        ),
        (
            tls_args(&pki, "expired.pem", "expired.key"),
            "expired.pem: the certificate expired on 2021-01-01",
        ),
        (
            tls_args(&pki, "future.pem", "future.key"),
            "future.pem: the certificate is not valid before 2090",
        ),
        (
            vec!["-l".into(), "127.0.0.1:0?tls".into()],
            "TLS listener without a certificate: give --tls-cert",
        ),
    ];
    for (args, expected) in cases {
        for sub in ["check", "run"] {
            let mut full = vec![sub.to_owned()];
            full.extend(args.iter().cloned());
            let out = run("testbed", &full);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{sub} {args:?} must fail");
            assert!(
                err.contains(expected),
                "{sub} {args:?}: expected {expected:?} in {err}"
            );
            assert!(!err.contains(" ready"), "{sub} {args:?} must not serve: {err}");
        }
    }
    // Per-listener files take precedence over the command line's.
    let out = run(
        "testbed",
        &[
            "check".into(),
            "-l".into(),
            format!(
                "127.0.0.1:0?cert={}&key={}",
                pki.path("server.pem"),
                pki.path("server.key")
            ),
            "--tls-cert".into(),
            pki.path("expired.pem"),
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

both_io!(reload_serves_the_new_certificate_without_dropping_a_request);
fn reload_serves_the_new_certificate_without_dropping_a_request(io: Io) {
    let pki = Pki::new(&format!("reload-{}", io.name()));
    let first = pki.issue("server", "localhost", None);
    let ctl = socket_path("tls-reload");
    let server = start_tls(
        io.example("http_hello"),
        &pki,
        &io.args(&["-w", "2", "--control", &ctl]),
    );
    let addr = server.tcp_addr();
    let config = pki.client_config(None, &[]);
    assert_eq!(served_certificate(addr, &config), first);

    // Clients keep requesting over keep-alive TLS connections throughout; a connection
    // the server closes between requests is reopened, as HTTP clients do.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let (stop, done, config) = (stop.clone(), done.clone(), config.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let mut conn: Option<BufReader<Tls>> = None;
                while !stop.load(Ordering::Relaxed) {
                    let tls = match conn.as_mut() {
                        Some(c) => c,
                        None => conn.insert(BufReader::new(
                            try_connect(addr, &config).map_err(|e| format!("connect: {e}"))?,
                        )),
                    };
                    match https_get(tls, "/") {
                        Ok(body) if body == b"Hello, World!" => {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(body) => return Err(format!("body {body:?}")),
                        // Closed by the server between two requests: reconnect once.
                        Err(_) => {
                            let mut fresh = BufReader::new(
                                try_connect(addr, &config).map_err(|e| format!("reconnect: {e}"))?,
                            );
                            https_get(&mut fresh, "/").map_err(|e| format!("on a new connection: {e}"))?;
                            done.fetch_add(1, Ordering::Relaxed);
                            conn = Some(fresh);
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    wait_until(|| (done.load(Ordering::Relaxed) > 10).then_some(())).expect("requests flow");

    let second = pki.issue("server", "localhost", None);
    let out = run("http_hello", &["reload".into(), "--control".into(), ctl.clone()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let at_reload = done.load(Ordering::Relaxed);
    wait_until(|| (done.load(Ordering::Relaxed) > at_reload + 10).then_some(()))
        .expect("requests flow after");
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap().expect("no request failed across the reload");
    }
    assert_eq!(
        served_certificate(addr, &config),
        second,
        "new connections get the new certificate"
    );

    // A re-read that fails makes the reload fail and keeps the current material.
    std::fs::write(pki.dir.join("server.pem"), "truncated\n").unwrap();
    let out = run("http_hello", &["reload".into(), "--control".into(), ctl]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.pem: no certificate in this file"), "{err}");
    assert_eq!(served_certificate(addr, &config), second, "still served");
}

#[test]
fn re_executed_workers_read_the_tls_material_and_serve() {
    let pki = Pki::new("exec");
    pki.issue("server", "localhost", None);
    let server = start_tls("testbed", &pki, &["-w", "1", "--exec-workers", "--sandbox"]);
    let mut tls = BufReader::new(connect(server.tcp_addr(), &pki.client_config(None, &[])));
    assert!(read_line(&mut tls).starts_with("pid "));
    tls.get_mut().write_all(b"tls\n").unwrap();
    assert!(read_line(&mut tls).starts_with("tls TLSv1.3 "));
}

/// Regression (review of issue #9): with --tls-handshake-timeout 0 the handshake removed
/// the connection's own timeouts, and a silent client held its worker for good.
#[test]
fn without_a_handshake_limit_the_read_timeout_still_applies() {
    let pki = Pki::new("nolimit");
    pki.issue("server", "localhost", None);
    let server = start_tls(
        "testbed",
        &pki,
        &["-w", "1", "--tls-handshake-timeout", "0", "--read-timeout", "1"],
    );
    let mut silent = TcpStream::connect(server.tcp_addr()).unwrap();
    silent.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0u8; 64];
    match silent.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0, "closed without a byte"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let mut tls = BufReader::new(connect(server.tcp_addr(), &pki.client_config(None, &[])));
    assert!(
        read_line(&mut tls).starts_with("pid "),
        "the worker serves the next client"
    );
}

/// An `openssl s_client` connected to the testbed, which holds its worker until the client
/// is dropped: a blocking worker serves one connection at a time, so clients held at once
/// are served by as many different workers.
struct SClient {
    child: std::process::Child,
    /// The worker's pid (the testbed's first line).
    pid: i32,
    /// Whether the handshake resumed the session given (`Reused,` rather than `New,`).
    reused: bool,
}

impl SClient {
    /// Connects with `version` (`-tls1_3`, `-tls1_2`) and `session` (`-sess_in PATH` to
    /// offer a saved session's ticket, `-sess_out PATH` to save the one received), and
    /// waits for the worker's first line.
    fn connect(addr: SocketAddr, pki: &Pki, version: &str, session: [&str; 2]) -> SClient {
        let mut child = Command::new("openssl")
            .args([
                "s_client",
                "-verify_return_error",
                "-servername",
                "localhost",
                "-connect",
            ])
            .arg(addr.to_string())
            .arg("-CAfile")
            .arg(pki.path("ca.pem"))
            .arg(version)
            .args(session)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_client (apt-get install openssl)");
        let guard = KillOnDrop(Some(child.id()));
        // Read on a thread, so that a client that never gets its line fails the test
        // after PATIENCE instead of hanging it.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut reused = None;
        let mut seen = Vec::new();
        let pid = loop {
            let line = rx.recv_timeout(PATIENCE).unwrap_or_else(|_| {
                panic!(
                    "no `pid` line from the server; s_client said:\n{}",
                    seen.join("\n")
                )
            });
            if line.starts_with("Reused,") {
                reused = Some(true);
            } else if line.starts_with("New,") {
                reused = Some(false);
            } else if let Some(pid) = line.strip_prefix("pid ") {
                break pid.trim().parse().unwrap();
            }
            seen.push(line);
        };
        std::mem::forget(guard); // Drop kills and reaps it now.
        SClient {
            child,
            pid,
            reused: reused.expect("s_client says New or Reused before the server's first line"),
        }
    }

    /// Closes the connection (s_client leaves at the end of its input) and waits for the
    /// client to exit, so that its session file is complete and its worker free.
    fn close(mut self) {
        drop(self.child.stdin.take());
        let deadline = std::time::Instant::now() + PATIENCE;
        while self.child.try_wait().unwrap().is_none() {
            assert!(std::time::Instant::now() < deadline, "s_client did not leave");
            std::thread::sleep(std::time::Duration::from_millis(20)); // polling its exit
        }
    }
}

impl Drop for SClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A new session with a full handshake, saved to `path`; returns the name of the key that
/// sealed its ticket.
fn new_session(addr: SocketAddr, pki: &Pki, version: &str, path: &str) -> String {
    let _ = std::fs::remove_file(path);
    let client = SClient::connect(addr, pki, version, ["-sess_out", path]);
    assert!(!client.reused);
    client.close();
    ticket_key_name(path)
}

/// The first 16 bytes of the ticket of the session saved in `path`: the ticket key's name
/// (appsrv's tickets, as rustls's, start with it), as `openssl sess_id` prints them.
fn ticket_key_name(path: &str) -> String {
    let out = Command::new("openssl")
        .args(["sess_id", "-noout", "-text", "-in", path])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().skip_while(|l| !l.contains("TLS session ticket:"));
    lines.next();
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no ticket in the session saved in {path}:\n{text}"));
    // "    0000 - 85 b4 2a ... d0   ..*"...": the 16 bytes, without their ASCII rendering.
    first.trim().get(7..54).unwrap_or(first).to_owned()
}

/// Offers the session saved in `path` on as many connections at once as there are
/// `workers`, so that each is served by another worker; returns the workers that did not
/// resume it.
fn refusing_workers(
    addr: SocketAddr,
    pki: &Pki,
    version: &str,
    path: &str,
    workers: &HashSet<i32>,
) -> Vec<i32> {
    let clients: Vec<SClient> = (0..workers.len())
        .map(|_| SClient::connect(addr, pki, version, ["-sess_in", path]))
        .collect();
    let served: HashSet<i32> = clients.iter().map(|c| c.pid).collect();
    assert_eq!(
        &served, workers,
        "each connection held at once is served by another worker"
    );
    let refused = clients.iter().filter(|c| !c.reused).map(|c| c.pid).collect();
    for c in clients {
        c.close();
    }
    refused
}

/// Regression (issue 31): a client resumes its session on whichever worker takes its next
/// connection. Two faults stood in the way, with the rustls ticketer made in the master:
/// a worker refused a ticket sealed by another until it had sealed one itself (rustls
/// refuses a ticket longer than the longest it has made, and that maximum is counted in
/// each process), and at each rotation every worker drew its own new key, so a ticket
/// sealed after the first rotation resumed only on the worker that sealed it. Here four
/// workers, a ticket key that changes every 6 s (`--tls-ticket-lifetime 12`), TLS 1.3
/// and 1.2: a ticket resumes on every worker, fresh ones included; after the key changed,
/// a ticket from before still resumes on every worker, and so does one from after, also
/// on a worker started after the change.
#[test]
fn issue_31_a_ticket_resumes_on_every_worker_after_the_ticket_key_changes() {
    let pki = Pki::new("tickets");
    pki.issue("server", "localhost", None);
    let server = start_tls("testbed", &pki, &["-w", "4", "--tls-ticket-lifetime", "12"]);
    let addr = server.tcp_addr();
    let workers = server.wait_for_workers(4);
    let versions = ["-tls1_3", "-tls1_2"];
    let before: Vec<String> = versions
        .iter()
        .map(|v| pki.path(&format!("before{v}.pem")))
        .collect();
    let after: Vec<String> = versions
        .iter()
        .map(|v| pki.path(&format!("after{v}.pem")))
        .collect();

    // Before any rotation, on workers that have sealed no ticket yet but one.
    let mut first_key = String::new();
    for (version, path) in versions.iter().zip(&before) {
        first_key = new_session(addr, &pki, version, path);
        let refused = refusing_workers(addr, &pki, version, path, &workers);
        assert!(
            refused.is_empty(),
            "{version}: workers {refused:?} refused a ticket sealed by another"
        );
    }

    // New sessions until their ticket is sealed by another key: the key changed.
    let deadline = std::time::Instant::now() + PATIENCE;
    let second_key = loop {
        let key = new_session(addr, &pki, versions[0], &after[0]);
        if key != first_key {
            break key;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the ticket key never changed"
        );
        std::thread::sleep(std::time::Duration::from_millis(200)); // polling the key
    };
    let key = new_session(addr, &pki, versions[1], &after[1]);
    assert_eq!(key, second_key, "TLS 1.2 and 1.3 tickets use the same key");

    // The tickets from before the change first: they are accepted for one period more.
    for (version, path) in versions.iter().zip(&before) {
        let refused = refusing_workers(addr, &pki, version, path, &workers);
        assert!(
            refused.is_empty(),
            "{version}: after the key changed, workers {refused:?} refused a ticket from before"
        );
    }
    for (version, path) in versions.iter().zip(&after) {
        let refused = refusing_workers(addr, &pki, version, path, &workers);
        assert!(
            refused.is_empty(),
            "{version}: after the key changed, workers {refused:?} refused a ticket sealed by another"
        );
    }

    // A worker started now (a replacement) holds the same keys.
    let victim = *workers.iter().next().unwrap();
    // SAFETY: kill(2) on a worker of our server.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let workers = wait_until(|| {
        let w = server.worker_pids();
        (w.len() == 4 && !w.contains(&victim) && w.iter().all(|p| alive(*p))).then_some(w)
    })
    .expect("a replacement worker");
    let refused = refusing_workers(addr, &pki, versions[0], &after[0], &workers);
    assert!(
        refused.is_empty(),
        "workers {refused:?} (one a replacement) refused a ticket"
    );
}

/// Issue 33: async handlers over TLS, at both levels: the handshake is admission's, the
/// requests and the client level's lines go through the TLS layer, a request that waits
/// and keep-alive work as over plain TCP.
#[test]
fn issue_33_async_handlers_serve_over_tls() {
    let pki = Pki::new("async");
    pki.issue("server", "localhost", None);
    let config = pki.client_config(None, &[]);
    let sock = pki.path("ctl.sock");
    {
        let server = start_tls("asyncbed", &pki, &["-w", "1", "--control", &sock]);
        let addr = server.tcp_addr();
        let mut tls = BufReader::new(connect(addr, &config));
        assert_eq!(https_get(&mut tls, "/sleep?ms=200").unwrap(), b"slept\n");
        assert_eq!(https_get(&mut tls, "/").unwrap(), b"Hello, World!");
        assert_eq!(https_get(&mut tls, "/session").unwrap(), b"1\n");
        assert_eq!(https_get(&mut tls, "/session").unwrap(), b"2\n", "one connection");
    }
    let server = start_tls("asyncbed", &pki, &["--client", "-w", "1", "--control", &sock]);
    let mut tls = BufReader::new(connect(server.tcp_addr(), &config));
    assert!(read_line(&mut tls).starts_with("pid "));
    tls.get_mut().write_all(b"hello over TLS\nsleep 100\n").unwrap();
    tls.get_mut().flush().unwrap();
    assert_eq!(read_line(&mut tls), "hello over TLS\n");
    assert_eq!(read_line(&mut tls), "slept\n");
}

/// Issue 33 (review): a large response over TLS to a client that reads slowly goes out
/// whole: rustls's buffer of records fills, the socket takes part of them, and the
/// write goes on (it failed with "write zero").
#[test]
fn issue_33_a_large_tls_response_to_a_slow_reader_goes_out_whole() {
    let pki = Pki::new("async-big");
    pki.issue("server", "localhost", None);
    let sock = pki.path("ctl.sock");
    let server = start_tls("asyncbed", &pki, &["-w", "1", "--control", &sock]);
    let mut tls = BufReader::new(connect(server.tcp_addr(), &pki.client_config(None, &[])));
    write!(
        tls.get_mut(),
        "GET /big?kb=4096 HTTP/1.1\r\nHost: localhost\r\n\r\n"
    )
    .unwrap();
    tls.get_mut().flush().unwrap();
    // Read in small steps with pauses: the server's socket buffer fills again and again.
    let mut head = String::new();
    loop {
        let mut line = String::new();
        tls.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut got = 0;
    let mut chunk = [0u8; 16 * 1024];
    while got < 4096 * 1024 {
        let n = tls.read(&mut chunk).unwrap();
        assert!(n > 0, "the response ended after {got} bytes");
        assert!(chunk[..n].iter().all(|b| *b == b'x'));
        got += n;
        // About 3 MB/s: slower than the server writes, so its socket buffer stays full.
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(got, 4096 * 1024);
}

/// rustls's *ring* provider, as the server uses it; its deprecation in rustls 0.23.48 (no
/// post-quantum key exchange) is allowed, as in the library (`net/tls.rs`, issue 41).
#[allow(deprecated)]
fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

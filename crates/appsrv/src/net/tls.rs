//! TLS on a listener, with rustls (ring provider).
//!
//! A listener becomes a TLS listener with the `tls` option of its address
//! (`-l '0.0.0.0:7443?tls'`); its certificate chain and private key come from
//! `--tls-cert`/`--tls-key`, or from the address's own `cert=` and `key=` options. The handler
//! does not change: [`Client`](crate::Client) stays `Read + BufRead + Write`, and
//! [`Client::tls`](crate::Client::tls) tells what was negotiated (protocol, ALPN, the client's
//! verified certificate).
//!
//! Where each part happens, and why:
//!
//! - **Loading** (certificate chain, key, client CA) happens in the master, before it
//!   detaches and before any privilege drop, so the key file can stay readable by root only
//!   and a bad file is reported on the terminal with a non-zero exit. Unreadable files, a
//!   file without a certificate or key, a key that does not match the certificate, and a
//!   certificate that is expired or not yet valid are refused, naming the file.
//! - **Reload** re-reads the files; if any fails, the reload fails and the current material
//!   stays (the running workers never change theirs; the next generation gets the new one).
//! - **The handshake** happens in the worker, after the PROXY header (if any) and the
//!   allow/deny rules, within `--tls-handshake-timeout` (10 s by default) of its start, so a
//!   client that connects and sends nothing, or a plain-text client, costs one worker at most
//!   that long; a plain-text client that speaks first is refused as soon as its first bytes
//!   arrive.
//! - **Session resumption** uses stateless tickets whose key is made in the master before
//!   the workers are forked, so a client may resume on any worker of the same generation.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::Error;

/// The default `--tls-handshake-timeout`.
pub(crate) const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a TLS listener's material comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Source {
    /// The certificate chain (PEM), leaf first.
    pub(crate) cert: PathBuf,
    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub(crate) key: PathBuf,
    /// CA certificates (PEM) that client certificates must chain to; none: no client
    /// certificate is asked for.
    pub(crate) client_ca: Option<PathBuf>,
    /// ALPN protocols offered, in order of preference (none: no ALPN).
    pub(crate) alpn: Vec<Vec<u8>>,
}

/// A loaded server configuration, shared by the workers of a generation.
pub(crate) type Acceptor = Arc<ServerConfig>;

fn tls_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::Tls {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Reads and checks a listener's material and builds its configuration.
pub(crate) fn load(source: &Source) -> Result<Acceptor, Error> {
    let chain = read_certificates(&source.cert)?;
    check_validity(&source.cert, &chain[0], SystemTime::now())?;
    let key = PrivateKeyDer::from_pem_file(&source.key)
        .map_err(|e| tls_error(&source.key, pem_reason(e, "private key")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(&source.cert, e.to_string()))?;
    let builder = match &source.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certificates(ca)? {
                roots
                    .add(cert)
                    .map_err(|e| tls_error(ca, format!("not a usable CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| tls_error(ca, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => tls_error(
            &source.key,
            format!(
                "this key does not match the certificate in {}",
                source.cert.display()
            ),
        ),
        e => tls_error(&source.key, e.to_string()),
    })?;
    config.alpn_protocols = source.alpn.clone();
    // Made here, in the master, so that every worker forked from it shares the ticket key.
    config.ticketer = rustls::crypto::ring::Ticketer::new()
        .map_err(|e| tls_error(&source.cert, format!("making the ticket key: {e}")))?;
    Ok(Arc::new(config))
}

fn pem_reason(e: rustls_pki_types::pem::Error, what: &str) -> String {
    match e {
        rustls_pki_types::pem::Error::Io(e) => format!("cannot read it: {e}"),
        rustls_pki_types::pem::Error::NoItemsFound => format!("no {what} in this file (expected PEM)"),
        e => format!("not a valid PEM {what}: {e}"),
    }
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_error(path, pem_reason(e, "certificate")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(path, pem_reason(e, "certificate")))?;
    if chain.is_empty() {
        return Err(tls_error(path, "no certificate in this file (expected PEM)"));
    }
    Ok(chain)
}

/// Refuses a certificate that is expired or not yet valid at `now`; warns when it expires
/// within 30 days.
fn check_validity(path: &Path, cert: &CertificateDer<'_>, now: SystemTime) -> Result<(), Error> {
    use x509_cert::der::Decode;
    let parsed = x509_cert::Certificate::from_der(cert.as_ref())
        .map_err(|e| tls_error(path, format!("cannot parse the certificate: {e}")))?;
    let validity = parsed.tbs_certificate().validity();
    let (from, until) = (validity.not_before, validity.not_after);
    if now < from.to_system_time() {
        return Err(tls_error(
            path,
            format!("the certificate is not valid before {from}"),
        ));
    }
    if now > until.to_system_time() {
        return Err(tls_error(path, format!("the certificate expired on {until}")));
    }
    if until
        .to_system_time()
        .duration_since(now)
        .is_ok_and(|left| left < Duration::from_secs(30 * 86_400))
    {
        tracing::warn!("{}: the certificate expires on {until}", path.display());
    }
    Ok(())
}

/// The subject of a certificate, as an RFC 4514 string (`CN=alice,O=Example`).
fn subject(cert: &CertificateDer<'_>) -> Option<String> {
    use x509_cert::der::Decode;
    let parsed = x509_cert::Certificate::from_der(cert.as_ref()).ok()?;
    Some(parsed.tbs_certificate().subject().to_string())
}

/// The TLS material of every listener, by index, and where it comes from: kept by the
/// master, which re-reads it on reload, and read when it forks a worker.
#[derive(Debug, Default)]
pub(crate) struct Store {
    /// For each listener: its source, if it is a TLS listener.
    sources: Vec<Option<Source>>,
    current: std::cell::RefCell<Vec<Option<Acceptor>>>,
}

impl Store {
    /// Loads the material of each listener that has a source.
    pub(crate) fn load(sources: Vec<Option<Source>>) -> Result<Store, Error> {
        let current = Self::load_all(&sources)?;
        Ok(Store {
            sources,
            current: std::cell::RefCell::new(current),
        })
    }

    fn load_all(sources: &[Option<Source>]) -> Result<Vec<Option<Acceptor>>, Error> {
        sources.iter().map(|s| s.as_ref().map(load).transpose()).collect()
    }

    /// Whether any listener is a TLS listener.
    pub(crate) fn any(&self) -> bool {
        self.sources.iter().any(Option::is_some)
    }

    /// Whether listener `index` is a TLS one.
    pub(crate) fn is_tls(&self, index: usize) -> bool {
        self.sources.get(index).is_some_and(Option::is_some)
    }

    /// Re-reads every listener's material; nothing changes until [`apply`](Self::apply).
    pub(crate) fn reread(&self) -> Result<Vec<Option<Acceptor>>, Error> {
        Self::load_all(&self.sources)
    }

    /// Makes re-read material the current one (for workers forked from now on).
    pub(crate) fn apply(&self, fresh: Vec<Option<Acceptor>>) {
        *self.current.borrow_mut() = fresh;
    }

    /// The current material, for a worker about to be forked.
    pub(crate) fn current(&self) -> Vec<Option<Acceptor>> {
        self.current.borrow().clone()
    }
}

/// What a worker needs to serve TLS listeners.
#[derive(Debug, Clone, Default)]
pub(crate) struct ForWorker {
    /// By listener index.
    pub(crate) acceptors: Vec<Option<Acceptor>>,
    /// `None`: no limit.
    pub(crate) handshake_timeout: Option<Duration>,
}

impl ForWorker {
    /// The configuration of listener `index`, if it is a TLS listener.
    pub(crate) fn acceptor(&self, index: usize) -> Option<&Acceptor> {
        self.acceptors.get(index).and_then(Option::as_ref)
    }
}

/// A TLS connection's state, and what it negotiated: see [`Client::tls`](crate::Client::tls).
#[derive(Debug)]
pub struct TlsSession {
    pub(crate) conn: ServerConnection,
    peer_subject: Option<String>,
}

impl TlsSession {
    pub(crate) fn new(config: Acceptor) -> io::Result<TlsSession> {
        Ok(TlsSession {
            conn: ServerConnection::new(config).map_err(io::Error::other)?,
            peer_subject: None,
        })
    }

    /// Called once the handshake is done.
    pub(crate) fn established(&mut self) {
        self.peer_subject = self
            .conn
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(subject);
    }

    /// The protocol version: `"TLSv1.3"` or `"TLSv1.2"`.
    pub fn protocol_version(&self) -> Option<&'static str> {
        match self.conn.protocol_version()? {
            rustls::ProtocolVersion::TLSv1_3 => Some("TLSv1.3"),
            rustls::ProtocolVersion::TLSv1_2 => Some("TLSv1.2"),
            _ => None,
        }
    }

    /// The cipher suite, as IANA names it (`"TLS13_AES_256_GCM_SHA384"`).
    pub fn cipher_suite(&self) -> Option<&'static str> {
        self.conn
            .negotiated_cipher_suite()
            .and_then(|s| s.suite().as_str())
    }

    /// The ALPN protocol both sides agreed on (`--tls-alpn`), if any.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.conn.alpn_protocol()
    }

    /// The host name the client asked for (SNI), if it sent one.
    pub fn server_name(&self) -> Option<&str> {
        self.conn.server_name()
    }

    /// The client's certificate chain (DER, leaf first), verified against
    /// `--tls-client-ca`; `None` when no client certificate is asked for.
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        self.conn.peer_certificates()
    }

    /// The subject of the client's verified certificate, as an RFC 4514 string
    /// (`"CN=alice,O=Example"`): the identity `--tls-client-ca` vouches for.
    pub fn peer_subject(&self) -> Option<&str> {
        self.peer_subject.as_deref()
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! TLS configurations for the unit tests of the layers that use TLS.
    use std::sync::Arc;

    /// A server and a client TLS configuration that trust each other (a self-signed
    /// certificate for `localhost`).
    pub(crate) fn configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (Arc::new(server), Arc::new(client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_named_with_the_reason() {
        let source = Source {
            cert: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
            client_ca: None,
            alpn: Vec::new(),
        };
        let e = load(&source).unwrap_err().to_string();
        assert!(
            e.contains("/nonexistent/cert.pem") && e.contains("cannot read it"),
            "{e}"
        );
    }

    #[test]
    fn a_file_without_pem_is_refused() {
        let dir = std::env::temp_dir().join(format!("appsrv-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("empty.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let e = read_certificates(&path).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.contains("no certificate in this file"), "{e}");
    }
}

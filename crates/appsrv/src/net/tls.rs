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
//! - **Session resumption** uses stateless tickets. Their keys derive from a secret the
//!   master draws when it loads the material, before the workers are forked, and change
//!   every half `--tls-ticket-lifetime` (12 h by default) at the same moments in every
//!   process (`net/tickets.rs`), so a client may resume on any worker of the same
//!   generation, one forked later included. A reload draws a new secret; so does a new
//!   master after an upgrade, and a worker re-executed with `--exec-workers` (each of
//!   those resumes only its own tickets).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::Error;
use crate::net::tickets::TicketKeys;

/// The default `--tls-handshake-timeout`.
pub(crate) const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The default `--tls-ticket-lifetime`, seconds: 12 h, rustls's own.
pub(crate) const DEFAULT_TICKET_LIFETIME: u32 = 12 * 60 * 60;

/// The longest `--tls-ticket-lifetime`, seconds: 7 days, the most RFC 8446 (section 4.6.1)
/// lets a server announce.
pub(crate) const MAX_TICKET_LIFETIME: u32 = 7 * 24 * 60 * 60;

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
    /// `--tls-ticket-lifetime`, seconds.
    pub(crate) ticket_lifetime: u32,
}

/// A loaded server configuration, shared by the workers of a generation.
pub(crate) type Acceptor = Arc<ServerConfig>;

fn tls_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::Tls {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// A listener's configuration, and its ticket keys, which the master advances as time goes
/// (rustls's configuration holds them as a `dyn ProducesTickets`).
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    acceptor: Acceptor,
    keys: Arc<TicketKeys>,
}

/// rustls's *ring* provider: TLS 1.3 and 1.2, X25519, P-256 and P-384 key exchange (as the
/// README says). rustls 0.23.48 deprecates `ring::default_provider` because *ring* has no
/// post-quantum key exchange (only the aws-lc-rs provider has one); appsrv keeps *ring* on
/// purpose (aws-lc-rs would add a C and CMake build to every user's first build), so the
/// deprecation is allowed here, the one place that names the provider, and a user's build
/// that resolves rustls 0.23.48 or newer stays free of warnings (issue 41). `allow`, not
/// `expect`: the lock file's rustls may predate the deprecation.
#[allow(deprecated)]
pub(crate) fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// Reads and checks a listener's material and builds its configuration.
pub(crate) fn load(source: &Source) -> Result<Acceptor, Error> {
    load_with_keys(source).map(|l| l.acceptor)
}

fn load_with_keys(source: &Source) -> Result<Loaded, Error> {
    let chain = read_certificates(&source.cert)?;
    check_validity(&source.cert, &chain[0], SystemTime::now())?;
    let key = PrivateKeyDer::from_pem_file(&source.key)
        .map_err(|e| tls_error(&source.key, pem_reason(e, "private key")))?;
    let provider = Arc::new(ring_provider());
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
    // Drawn here, in the master, so that every worker forked from it derives the same
    // ticket keys, period after period (net/tickets.rs).
    let keys = Arc::new(
        TicketKeys::new(source.ticket_lifetime)
            .map_err(|e| tls_error(&source.cert, format!("making the ticket key: {e}")))?,
    );
    config.ticketer = keys.clone();
    Ok(Loaded {
        acceptor: Arc::new(config),
        keys,
    })
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
///
/// Each load draws new ticket keys, so a generation's workers share theirs and a reload
/// starts a new secret: a ticket sealed before it resumes on the old generation's workers
/// while they drain, never on the new one's. Deliberately: a reload may change the
/// client CA, and a resumed session keeps the client identity it was verified with.
#[derive(Debug, Default)]
pub(crate) struct Store {
    /// For each listener: its source, if it is a TLS listener.
    sources: Vec<Option<Source>>,
    current: std::cell::RefCell<Vec<Option<Loaded>>>,
}

/// Material re-read by [`Store::reread`], not yet current.
#[derive(Debug)]
pub(crate) struct Fresh(Vec<Option<Loaded>>);

impl Store {
    /// Loads the material of each listener that has a source.
    pub(crate) fn load(sources: Vec<Option<Source>>) -> Result<Store, Error> {
        let current = Self::load_all(&sources)?;
        Ok(Store {
            sources,
            current: std::cell::RefCell::new(current),
        })
    }

    fn load_all(sources: &[Option<Source>]) -> Result<Vec<Option<Loaded>>, Error> {
        sources
            .iter()
            .map(|s| s.as_ref().map(load_with_keys).transpose())
            .collect()
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
    pub(crate) fn reread(&self) -> Result<Fresh, Error> {
        Self::load_all(&self.sources).map(Fresh)
    }

    /// Makes re-read material the current one (for workers forked from now on).
    pub(crate) fn apply(&self, fresh: Fresh) {
        *self.current.borrow_mut() = fresh.0;
    }

    /// The current material, for a worker about to be forked: its ticket keys moved on to
    /// the current period first, so that the worker starts there.
    pub(crate) fn current(&self) -> Vec<Option<Acceptor>> {
        let now = std::time::Instant::now();
        self.current
            .borrow()
            .iter()
            .map(|l| {
                l.as_ref().map(|l| {
                    l.keys.advance(now);
                    l.acceptor.clone()
                })
            })
            .collect()
    }

    /// Moves the current ticket keys on to the period of `now`, wiping the secrets passed
    /// (nothing when the period has not changed: a compare per listener): the master calls
    /// it at each round, and wakes for [`next_ticket_key_change`](Self::next_ticket_key_change),
    /// so it never holds a secret older than the current period's (and a worker it forks
    /// has no periods to catch up on).
    pub(crate) fn advance_ticket_keys(&self, now: std::time::Instant) {
        for l in self.current.borrow().iter().flatten() {
            l.keys.advance(now);
        }
    }

    /// When the next period of any listener's ticket keys begins (`None`: no TLS listener).
    pub(crate) fn next_ticket_key_change(&self, now: std::time::Instant) -> Option<std::time::Instant> {
        self.current
            .borrow()
            .iter()
            .flatten()
            .filter_map(|l| l.keys.next_change(now))
            .min()
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
        let provider = Arc::new(super::ring_provider());
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
            ticket_lifetime: DEFAULT_TICKET_LIFETIME,
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

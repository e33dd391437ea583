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
    let tbs = der::Tbs::parse(cert.as_ref())
        .map_err(|e| tls_error(path, format!("cannot parse the certificate: {e}")))?;
    let (from, until) = (tbs.not_before, tbs.not_after);
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
    der::Tbs::parse(cert.as_ref()).ok().map(|tbs| tbs.subject)
}

/// The little of X.509 that appsrv reads itself (rustls does not expose it): a
/// certificate's validity dates and its subject. A DER reader of its own rather than a
/// crate: x509-cert and its der, spki and derive macros were some 7% of the first build of
/// every example (issue 41), for these two fields.
mod der {
    use std::fmt;
    use std::time::{Duration, SystemTime};

    /// One TLV: its tag, its contents, and what follows it.
    fn tlv(bytes: &[u8]) -> Result<(u8, &[u8], &[u8]), &'static str> {
        let (&tag, rest) = bytes.split_first().ok_or("truncated")?;
        if tag & 0x1f == 0x1f {
            return Err("a multi-byte tag");
        }
        let (&first, mut rest) = rest.split_first().ok_or("truncated")?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return Err("a bad length");
            }
            let len = rest[..n].iter().fold(0usize, |l, &b| (l << 8) | usize::from(b));
            rest = &rest[n..];
            len
        };
        if rest.len() < len {
            return Err("truncated");
        }
        Ok((tag, &rest[..len], &rest[len..]))
    }

    /// The contents of a TLV of tag `want`, and what follows it.
    fn expect(bytes: &[u8], want: u8) -> Result<(&[u8], &[u8]), &'static str> {
        let (tag, body, rest) = tlv(bytes)?;
        if tag != want {
            return Err("an unexpected element");
        }
        Ok((body, rest))
    }

    const SEQUENCE: u8 = 0x30;
    const SET: u8 = 0x31;

    /// What appsrv reads of a certificate's `tbsCertificate`.
    #[derive(Debug)]
    pub(super) struct Tbs {
        pub(super) not_before: Time,
        pub(super) not_after: Time,
        /// RFC 4514: the RDNs last first, joined by `,`.
        pub(super) subject: String,
    }

    impl Tbs {
        /// Reads a DER certificate.
        pub(super) fn parse(cert: &[u8]) -> Result<Tbs, &'static str> {
            let (certificate, _) = expect(cert, SEQUENCE)?;
            let (tbs, _) = expect(certificate, SEQUENCE)?;
            let mut rest = tbs;
            // version [0] EXPLICIT, optional
            if rest.first() == Some(&0xa0) {
                rest = tlv(rest)?.2;
            }
            let (_serial, rest) = expect(rest, 0x02)?;
            let (_signature, rest) = expect(rest, SEQUENCE)?;
            let (_issuer, rest) = expect(rest, SEQUENCE)?;
            let (validity, rest) = expect(rest, SEQUENCE)?;
            let (subject, _) = expect(rest, SEQUENCE)?;
            let (not_before, validity) = Time::parse(validity)?;
            let (not_after, _) = Time::parse(validity)?;
            Ok(Tbs {
                not_before,
                not_after,
                subject: rfc4514(subject)?,
            })
        }
    }

    /// A UTCTime or GeneralizedTime, in UTC to the second.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) struct Time {
        year: i64,
        month: u32,
        day: u32,
        hour: u32,
        minute: u32,
        second: u32,
    }

    impl Time {
        fn parse(bytes: &[u8]) -> Result<(Time, &[u8]), &'static str> {
            let (tag, body, rest) = tlv(bytes)?;
            let text = std::str::from_utf8(body).map_err(|_| "a bad time")?;
            let digits = text.strip_suffix('Z').ok_or("a time not in UTC")?;
            if !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err("a bad time");
            }
            let num = |s: &str| s.parse::<u32>().map_err(|_| "a bad time");
            let (year, digits) = match (tag, digits.len()) {
                // UTCTime: YYMMDDHHMMSS, 1950 to 2049 (RFC 5280).
                (0x17, 12) => {
                    let yy = i64::from(num(&digits[..2])?);
                    (if yy < 50 { 2000 + yy } else { 1900 + yy }, &digits[2..])
                }
                // GeneralizedTime: YYYYMMDDHHMMSS.
                (0x18, 14) => (i64::from(num(&digits[..4])?), &digits[4..]),
                _ => return Err("a bad time"),
            };
            let time = Time {
                year,
                month: num(&digits[0..2])?,
                day: num(&digits[2..4])?,
                hour: num(&digits[4..6])?,
                minute: num(&digits[6..8])?,
                second: num(&digits[8..10])?,
            };
            if !(1..=12).contains(&time.month)
                || !(1..=31).contains(&time.day)
                || time.hour > 23
                || time.minute > 59
                || time.second > 60
            {
                return Err("a bad time");
            }
            Ok((time, rest))
        }

        /// Seconds since the Unix epoch (days from the civil date, H. Hinnant's method).
        fn unix_seconds(self) -> i64 {
            let y = if self.month <= 2 { self.year - 1 } else { self.year };
            let era = y.div_euclid(400);
            let yoe = y - era * 400;
            let m = i64::from(self.month);
            let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(self.day) - 1;
            let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
            let days = era * 146_097 + doe - 719_468;
            days * 86_400 + i64::from(self.hour) * 3600 + i64::from(self.minute) * 60 + i64::from(self.second)
        }

        pub(super) fn to_system_time(self) -> SystemTime {
            let s = self.unix_seconds();
            match u64::try_from(s) {
                Ok(after) => SystemTime::UNIX_EPOCH + Duration::from_secs(after),
                Err(_) => SystemTime::UNIX_EPOCH - Duration::from_secs(s.unsigned_abs()),
            }
        }
    }

    impl fmt::Display for Time {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(
                f,
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                self.year, self.month, self.day, self.hour, self.minute, self.second
            )
        }
    }

    /// A Name (an RDNSequence) as RFC 4514 writes it: the last RDN first, RDNs joined by
    /// `,`, the attributes of one by `+`; the short names RFC 4514 lists (and `EMAIL` and
    /// `serialNumber`, as x509-cert named them before, issue 41) with their string values
    /// escaped; other types as dotted OIDs, and values that are not strings, as `#` and
    /// their DER in hex.
    fn rfc4514(name: &[u8]) -> Result<String, &'static str> {
        let mut rdns = Vec::new();
        let mut rest = name;
        while !rest.is_empty() {
            let (set, next) = expect(rest, SET)?;
            rest = next;
            let mut attributes = Vec::new();
            let mut inner = set;
            while !inner.is_empty() {
                let (pair, next) = expect(inner, SEQUENCE)?;
                inner = next;
                let (oid, value) = expect(pair, 0x06)?;
                let (tag, body, _) = tlv(value)?;
                let key = short_name(oid);
                let value = match (key, tag) {
                    // UTF8String, PrintableString, TeletexString, IA5String
                    (Some(_), 0x0c | 0x13 | 0x14 | 0x16) => escape(&String::from_utf8_lossy(body)),
                    _ => {
                        let whole = &value[..value.len() - tlv(value)?.2.len()];
                        let hex: String = whole.iter().map(|b| format!("{b:02x}")).collect();
                        format!("#{hex}")
                    }
                };
                let key = key.map_or_else(|| dotted(oid), str::to_owned);
                attributes.push(format!("{key}={value}"));
            }
            rdns.push(attributes.join("+"));
        }
        rdns.reverse();
        Ok(rdns.join(","))
    }

    /// RFC 4514's short names (section 3), and two that x509-cert used, by OID contents.
    fn short_name(oid: &[u8]) -> Option<&'static str> {
        Some(match oid {
            [0x55, 0x04, 0x03] => "CN",
            [0x55, 0x04, 0x07] => "L",
            [0x55, 0x04, 0x08] => "ST",
            [0x55, 0x04, 0x0a] => "O",
            [0x55, 0x04, 0x0b] => "OU",
            [0x55, 0x04, 0x06] => "C",
            [0x55, 0x04, 0x09] => "STREET",
            [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19] => "DC",
            [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01] => "UID",
            [0x55, 0x04, 0x05] => "serialNumber",
            [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01] => "EMAIL",
            _ => return None,
        })
    }

    /// An OID's dotted decimal form.
    fn dotted(oid: &[u8]) -> String {
        let mut arcs: Vec<u64> = Vec::new();
        let mut value = 0u64;
        for &b in oid {
            value = (value << 7) | u64::from(b & 0x7f);
            if b & 0x80 == 0 {
                if arcs.is_empty() {
                    let first = (value / 40).min(2);
                    arcs.push(first);
                    arcs.push(value - first * 40);
                } else {
                    arcs.push(value);
                }
                value = 0;
            }
        }
        arcs.iter().map(u64::to_string).collect::<Vec<_>>().join(".")
    }

    /// RFC 4514 section 2.4: `"+,;<>\` escaped, and a leading `#` or space and a trailing
    /// space; control characters as `\XX`.
    fn escape(value: &str) -> String {
        let mut out = String::with_capacity(value.len());
        let last = value.chars().count().saturating_sub(1);
        for (i, c) in value.chars().enumerate() {
            match c {
                '"' | '+' | ',' | ';' | '<' | '>' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                '#' if i == 0 => out.push_str("\\#"),
                ' ' if i == 0 || i == last => out.push_str("\\ "),
                c if c.is_control() => {
                    let mut buf = [0; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\{b:02X}"));
                    }
                }
                c => out.push(c),
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn issue_41_a_generated_certificate_reads_as_x509_parsers_read_it() {
            let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
            params.distinguished_name = rcgen::DistinguishedName::new();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "alice, \"the\" +1");
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, "Example");
            let email = rcgen::DnType::CustomDnType(vec![1, 2, 840, 113549, 1, 9, 1]);
            params.distinguished_name.push(email, "a@b.c");
            params
                .distinguished_name
                .push(rcgen::DnType::CustomDnType(vec![2, 5, 4, 12]), "boss");
            params.distinguished_name.push(rcgen::DnType::CountryName, "FR");
            params.not_before = rcgen::date_time_ymd(2021, 1, 1);
            params.not_after = rcgen::date_time_ymd(2090, 12, 31);
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.self_signed(&key).unwrap();
            let tbs = Tbs::parse(cert.der()).unwrap();
            assert_eq!(tbs.not_before.to_string(), "2021-01-01T00:00:00Z");
            assert_eq!(tbs.not_after.to_string(), "2090-12-31T00:00:00Z");
            assert_eq!(
                tbs.not_before.to_system_time(),
                SystemTime::UNIX_EPOCH + Duration::from_secs(1_609_459_200)
            );
            assert_eq!(
                tbs.not_after.to_system_time(),
                SystemTime::UNIX_EPOCH + Duration::from_secs(3_818_361_600)
            );
            // x509-cert 0.3 (which read them before) wrote the same but for the title
            // (2.5.4.12), its own `TITLE`; RFC 4514 writes a type it does not list in
            // dotted form, with the value's DER in hex.
            assert_eq!(
                tbs.subject,
                "C=FR,2.5.4.12=#0c04626f7373,EMAIL=a@b.c,O=Example,CN=alice\\, \\\"the\\\" \\+1"
            );
        }

        #[test]
        fn issue_41_bad_der_is_an_error_not_a_panic() {
            for bytes in [
                &b""[..],
                &[0x30],
                &[0x30, 0x85, 1, 1, 1, 1, 1],
                &[0x30, 0x03, 0x30, 0x01],
            ] {
                assert!(Tbs::parse(bytes).is_err(), "{bytes:?}");
            }
            assert_eq!(
                dotted(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01]),
                "1.2.840.113549.1.9.1"
            );
        }
    }
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

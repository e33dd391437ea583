//! TLS session-ticket keys that every worker of a generation holds in step (issue 31).
//!
//! A ticket is the server's own state of a session, sealed with a key only the server
//! knows and handed to the client, which shows it on its next connection to resume without
//! a full handshake. That next connection may land on any worker, so every worker must be
//! able to open what any other sealed, at any time.
//!
//! rustls's own ticketer (`rustls::crypto::ring::Ticketer`, a `TicketRotator`) does not
//! allow that in a preforking server, even when it is made in the master before the fork:
//! every 6 h it draws a new random key in whichever process rotates, so after the first
//! rotation each worker seals with a key of its own, and a ticket resumes only on the
//! worker that sealed it. It also refuses a ticket longer than the longest it has sealed
//! itself, a maximum counted in each process, so a worker that had sealed no ticket yet (a
//! fresh one: at start, after a reload, a replacement) refused every other worker's
//! tickets.
//!
//! Here the keys are *derived*, not drawn. The master draws one 32-byte secret when it
//! loads a listener's material; time is cut into periods of half the ticket lifetime
//! (`--tls-ticket-lifetime`, 12 h by default), counted on the monotonic clock from that
//! moment, which every process of the machine reads alike. Each period's secret is the
//! previous one's HMAC-SHA256 (a one-way chain), and the period's ticket key and key
//! name are HMACs of it. A worker forked with the secret of period `p` reaches the secret
//! of any later period by itself, and so reaches the same key as every other worker at the
//! same moment, with no message from the master; a replacement worker gets the master's
//! secret, which the master keeps at the current period (its loop wakes when a period
//! ends). A ticket sealed in period `p` opens until period `p + 1` ends: between half and
//! all of the lifetime, which is what the client is told.
//!
//! Forward secrecy is rustls's: a process keeps the current period's secret and the
//! previous period's key, and drops the earlier ones as the chain moves on (the secrets and
//! key bytes are zeroized; ring's AEAD key schedules are freed unwiped, as in rustls), so
//! memory read from a worker (or the master) does not open tickets older than the previous
//! period.
//! What it does give is the keys of the later periods of the same generation: a reload
//! draws a new secret (each load of the material does: `tls.rs`, which uses this file).
//!
//! Tickets are sealed with ChaCha20-Poly1305 (ring), as rustls's are: key name (16 bytes),
//! random nonce (12 bytes), ciphertext, tag (16 bytes); the key name is authenticated as
//! associated data. A random 96-bit nonce is safe for far more tickets than a period
//! seals (about 2^32 before a collision is a concern).

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

/// The labels of the chain's three HMACs: the next period's secret, a period's ticket key,
/// its key name.
const NEXT: &[u8] = b"appsrv tls ticket chain";
const KEY: &[u8] = b"appsrv tls ticket key";
const NAME: &[u8] = b"appsrv tls ticket key name";

const NAME_LEN: usize = 16;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

/// One period's key.
#[derive(Clone)]
struct PeriodKey {
    name: [u8; NAME_LEN],
    key: LessSafeKey,
}

impl PeriodKey {
    fn of(secret: &[u8; 32]) -> PeriodKey {
        let key = derive(secret, KEY);
        let mut name = [0u8; NAME_LEN];
        name.copy_from_slice(&derive(secret, NAME)[..NAME_LEN]);
        PeriodKey {
            name,
            key: LessSafeKey::new(
                UnboundKey::new(&aead::CHACHA20_POLY1305, &key[..])
                    .expect("a 32-byte key is ChaCha20's length"),
            ),
        }
    }
}

/// HMAC-SHA256 of `label` under `secret`.
fn derive(secret: &[u8; 32], label: &[u8]) -> Zeroizing<[u8; 32]> {
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), label);
    let mut out = Zeroizing::new([0u8; 32]);
    out.copy_from_slice(tag.as_ref());
    out
}

/// Where a process is on the chain.
#[cfg_attr(test, derive(Clone))]
struct Chain {
    /// The period `secret` and `current` belong to.
    period: u64,
    /// The secret of `period`; the earlier ones are wiped.
    secret: Zeroizing<[u8; 32]>,
    current: PeriodKey,
    /// The key of `period - 1` (none in period 0).
    previous: Option<PeriodKey>,
}

impl Chain {
    /// Moves on to `target`, if it is later, wiping the secrets passed.
    fn advance(&mut self, target: u64) {
        let Some(steps) = target.checked_sub(self.period).filter(|s| *s > 0) else {
            return;
        };
        // Up to the secret of `target - 1`, whose key stays as the previous one.
        for _ in 1..steps {
            self.secret = derive(&self.secret, NEXT);
        }
        let previous = if steps == 1 {
            None // the current key becomes the previous one below
        } else {
            Some(PeriodKey::of(&self.secret))
        };
        self.secret = derive(&self.secret, NEXT);
        let old = std::mem::replace(&mut self.current, PeriodKey::of(&self.secret));
        self.previous = Some(previous.unwrap_or(old));
        self.period = target;
    }
}

/// The ticket keys of one listener in one generation, made in the master before the fork
/// and advanced in step by every process that holds a copy. See the module's text.
pub(crate) struct TicketKeys {
    /// The lifetime told to clients, in seconds.
    lifetime: u32,
    /// Half of it: how long a key seals tickets.
    period: Duration,
    /// The start of period 0: when the master drew the secret.
    start: Instant,
    chain: Mutex<Chain>,
}

impl fmt::Debug for TicketKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret nor the keys.
        f.debug_struct("TicketKeys")
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl TicketKeys {
    /// Draws a new secret, for tickets valid for at most `lifetime` seconds (at least 2).
    pub(crate) fn new(lifetime: u32) -> Result<TicketKeys, String> {
        if lifetime < 2 {
            return Err(format!(
                "a ticket lifetime of {lifetime} s is too short (2 s at least)"
            ));
        }
        let mut secret = Zeroizing::new([0u8; 32]);
        SystemRandom::new()
            .fill(&mut secret[..])
            .map_err(|_| "the system's random generator failed".to_owned())?;
        Ok(TicketKeys {
            lifetime,
            period: Duration::from_millis(u64::from(lifetime) * 500),
            start: Instant::now(),
            chain: Mutex::new(Chain {
                period: 0,
                current: PeriodKey::of(&secret),
                previous: None,
                secret,
            }),
        })
    }

    /// The period `now` falls in.
    fn period_at(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.start).as_nanos();
        u64::try_from(elapsed / self.period.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Moves on to the period of `now` (the master calls it as each period ends, so that
    /// it holds no secret older than the current one and a worker it forks starts there).
    pub(crate) fn advance(&self, now: Instant) {
        let target = self.period_at(now);
        if let Ok(mut chain) = self.chain.lock() {
            chain.advance(target);
        }
    }

    /// When the current period ends (`None`: beyond the clock's range).
    pub(crate) fn next_change(&self, now: Instant) -> Option<Instant> {
        let next = self.period_at(now).checked_add(1)?;
        let after = self.period.as_nanos().checked_mul(u128::from(next))?;
        self.start
            .checked_add(Duration::from_nanos(u64::try_from(after).ok()?))
    }

    fn seal(&self, now: Instant, plain: &[u8]) -> Option<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).ok()?;
        let target = self.period_at(now);
        let mut chain = self.chain.lock().ok()?;
        chain.advance(target);
        let key = &chain.current;
        let mut out = Vec::with_capacity(NAME_LEN + NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&key.name);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = key
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(key.name),
                &mut out[NAME_LEN + NONCE_LEN..],
            )
            .ok()?;
        out.extend_from_slice(tag.as_ref());
        Some(out)
    }

    fn open(&self, now: Instant, ticket: &[u8]) -> Option<Vec<u8>> {
        if ticket.len() < NAME_LEN + NONCE_LEN + TAG_LEN {
            return None;
        }
        let (name, rest) = ticket.split_at(NAME_LEN);
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let target = self.period_at(now);
        let mut chain = self.chain.lock().ok()?;
        chain.advance(target);
        // The name picks the key (it is no secret: every ticket carries it in clear), so a
        // forged ticket is tried against one key at most. Unlike rustls, no limit on the
        // length by the longest ticket this process sealed: counted in each process, it
        // made a worker refuse the tickets of the others; it hardens against partitioning
        // oracles, which need keys of low entropy, and these are 256 random bits.
        let chain = &*chain;
        let key = std::iter::once(&chain.current)
            .chain(chain.previous.as_ref())
            .find(|k| k.name[..] == *name)?;
        let mut out = sealed.to_vec();
        let len = key
            .key
            .open_in_place(
                Nonce::try_assume_unique_for_key(nonce).ok()?,
                Aad::from(key.name),
                &mut out,
            )
            .ok()?
            .len();
        out.truncate(len);
        Some(out)
    }

    /// A copy of this process's state, as a fork makes.
    #[cfg(test)]
    fn forked(&self) -> TicketKeys {
        TicketKeys {
            lifetime: self.lifetime,
            period: self.period,
            start: self.start,
            chain: Mutex::new(self.chain.lock().unwrap().clone()),
        }
    }
}

impl rustls::server::ProducesTickets for TicketKeys {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        self.lifetime
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.seal(Instant::now(), plain)
    }

    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        self.open(Instant::now(), ticket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10 s: periods of 5 s.
    fn keys() -> TicketKeys {
        TicketKeys::new(10).unwrap()
    }

    fn at(keys: &TicketKeys, period: u64, into_it: Duration) -> Instant {
        keys.start + keys.period * u32::try_from(period).unwrap() + into_it
    }

    #[test]
    fn copies_seal_and_open_each_others_tickets_in_every_period() {
        let master = keys();
        let a = master.forked();
        let b = master.forked();
        for period in [0, 1, 2, 5, 9, 40] {
            let now = at(&master, period, Duration::from_millis(10));
            let ticket = a.seal(now, b"session state").unwrap();
            assert_eq!(
                b.open(now, &ticket).as_deref(),
                Some(&b"session state"[..]),
                "period {period}"
            );
            let ticket = b.seal(now, b"other").unwrap();
            assert_eq!(
                a.open(now, &ticket).as_deref(),
                Some(&b"other"[..]),
                "period {period}"
            );
        }
    }

    #[test]
    fn a_copy_forked_late_and_one_that_jumps_periods_agree() {
        let master = keys();
        let early = master.forked();
        let sealed_in_6 = master.seal(at(&master, 6, Duration::ZERO), b"six").unwrap();
        master.advance(at(&master, 7, Duration::ZERO));
        assert_eq!(master.chain.lock().unwrap().period, 7);
        let late = master.forked();
        let now = at(&master, 7, Duration::from_secs(1));
        // The early copy jumps from period 0 to 7 by itself; the late one stepped through
        // 6: they accept the same two keys.
        for keys in [&early, &late] {
            assert_eq!(keys.open(now, &sealed_in_6).as_deref(), Some(&b"six"[..]));
        }
        let ticket = early.seal(now, b"x").unwrap();
        assert_eq!(late.open(now, &ticket).as_deref(), Some(&b"x"[..]));
        let ticket = late.seal(now, b"y").unwrap();
        assert_eq!(early.open(now, &ticket).as_deref(), Some(&b"y"[..]));
    }

    #[test]
    fn a_ticket_opens_for_the_next_period_and_no_longer() {
        let keys = keys();
        let sealed_at = at(&keys, 3, Duration::from_millis(4_900));
        let ticket = keys.seal(sealed_at, b"s").unwrap();
        assert!(
            keys.open(at(&keys, 4, Duration::from_millis(4_900)), &ticket)
                .is_some()
        );
        assert!(keys.open(at(&keys, 5, Duration::ZERO), &ticket).is_none());
    }

    #[test]
    fn forged_foreign_and_short_tickets_are_refused() {
        let keys = keys();
        let now = at(&keys, 0, Duration::ZERO);
        let ticket = keys.seal(now, b"state").unwrap();
        for i in [0, NAME_LEN, NAME_LEN + NONCE_LEN, ticket.len() - 1] {
            let mut forged = ticket.clone();
            forged[i] ^= 1;
            assert!(keys.open(now, &forged).is_none(), "byte {i} changed");
        }
        assert!(
            keys.open(now, &ticket[..NAME_LEN + NONCE_LEN + TAG_LEN - 1])
                .is_none()
        );
        assert!(keys.open(now, &[]).is_none());
        let other = super::TicketKeys::new(10).unwrap();
        assert!(other.open(now, &ticket).is_none(), "another generation's secret");
    }

    #[test]
    fn the_next_change_is_the_end_of_the_current_period() {
        let keys = keys();
        let now = at(&keys, 2, Duration::from_secs(1));
        assert_eq!(keys.next_change(now), Some(at(&keys, 3, Duration::ZERO)));
    }

    #[test]
    fn a_lifetime_under_two_seconds_is_refused() {
        let e = TicketKeys::new(1).unwrap_err();
        assert!(e.contains("too short"), "{e}");
    }

    #[test]
    fn debug_shows_no_secret() {
        assert_eq!(format!("{:?}", keys()), "TicketKeys { lifetime: 10, .. }");
    }
}

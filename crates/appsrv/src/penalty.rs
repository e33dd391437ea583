//! Penalties for failed authentication (issue 31): a table in shared memory of the client
//! addresses that failed to authenticate, which every worker's admission consults before it
//! reads a byte from a new connection, as OpenSSH's `PerSourcePenalties` does.
//!
//! # Why here, and shared
//!
//! A handler that checks a password or a token knows when it fails; nothing else does. Left
//! alone, the `runas` example answered about 8,000 wrong-token attempts a second from one
//! address. The handler cannot throttle by itself: the attempts spread over every worker
//! (each its own process), and a delay in the handler holds a worker (blocking mode) or the
//! whole event loop. So the handler only *charges* the failure
//! ([`Conn::penalize`](crate::Conn::penalize), [`Client::penalize`](crate::Client::penalize)),
//! into this table that the master maps before it forks, and admission refuses the address's
//! new connections while its penalty lasts: before a PROXY header's client is served, before
//! a TLS handshake, before any request byte is read. A refused connection costs an
//! `accept` and a `close`.
//!
//! # The rule
//!
//! The n-th failure of an address in a row refuses it for `min(2^(n-1) s, --penalty-max)`
//! from that failure (1 s, 2 s, 4 s, ... up to 600 s by default, OpenSSH's maximum): a
//! brute force from one address that retries the moment it may gets answers at about 0, 1,
//! 3, 7, 15, 31 ... s, so `k + 1` attempts in its first `2^k - 1` seconds, then one per
//! `--penalty-max`. An address is *forgotten* (its count goes back to 0) once it has been
//! quiet, no failure charged, for `--penalty-max` after its refusal ended: a user who
//! mistyped a password last week starts again at 1 s, while a brute force that waits out its
//! refusal and tries again stays at the maximum. A success does not forgive: the count
//! goes back to 0 only with time (an attacker could otherwise interleave a valid account's
//! logins with its guesses). Failures on connections that were admitted before the refusal
//! began (a parallel brute force) are charged too, each doubling the penalty.
//!
//! # Addresses
//!
//! An IPv4 address counts alone (a `/32`); an IPv6 address counts by its `/64`. A single
//! IPv6 host usually holds a whole `/64` (SLAAC, privacy addresses: RFC 4941 changes them at
//! will), so per-address entries would give it 2^64 fresh starts and let it fill the table
//! alone; a wider prefix (BIND's `/56` for its rate limit) would put a penalized host's
//! neighbours, possibly other customers of the same provider, in its penalty. A `/64` is the
//! smallest unit an attacker cannot multiply cheaply, as in the answer-rate table of datagram
//! listeners. An IPv4-mapped address (`::ffff:192.0.2.1`, on a dual-stack listener) is its
//! IPv4 address. A Unix-socket client has no address: it is never charged nor refused.
//! Behind a balancer the address is the one its PROXY header names; a balancer that does
//! not send one makes every client its own address, so that one client's failures would
//! refuse them all (the documentation says so, with the fix: `?proxy`, or `--penalty-max 0`).
//!
//! # Layout
//!
//! One memfd of about 1 MiB, mapped `MAP_SHARED` by the master before the first fork (and
//! again from the memfd by a re-executed worker, [`adopt`]), holding only `#[repr(C)]`
//! atomics: a header (the maximum penalty, the hash key, the counters) and [`ENTRIES`]
//! entries of two words, a key (the address, 0 for a free entry) and a state
//! (`until << 24 | failures << 16 | tag`: the end of the refusal in monotonic milliseconds,
//! the failures in a row, and 16 bits of a second hash of the key). Pages are allocated
//! when first touched. The table lives as long as the master: a reload keeps it, a restart
//! or an upgrade (a new master) starts empty.
//!
//! # Concurrency
//!
//! No locks: any worker charges and looks up, the master only reads (for the metrics). An
//! address is looked for in [`PROBES`] entries from its keyed hash (the key, drawn at
//! random by the master, keeps a client from choosing addresses that collide with a
//! victim's). A charge takes its own entry, else claims one with a compare-and-swap of the
//! key, then updates the state with a compare-and-swap loop, so two workers charging one
//! address at once both count. The tag in the state is what makes a claimed entry safe:
//! a state written for another key (an entry that changed hands between a look and a
//! write) has another tag, and counts as empty. So a race may lose a charge, or split one
//! address's failures over two entries (two workers claiming at once), never refuse an
//! address that was not charged.
//!
//! # When the table is full
//!
//! A new address claims, among its probed entries, a free or forgotten one first, else the
//! one whose refusal ended longest ago (its record is lost: it starts again at 1 s). Only
//! when all of them refuse their address right now is the failure not recorded: the table
//! **fails open**. Counted (`appsrv_penalties_unrecorded_total`) and logged once a minute per
//! worker. Failing closed (refusing every address it cannot record) would let whoever
//! controls many addresses refuse everyone, legitimate clients first; failing open gives
//! the unrecorded addresses the rate they would have without the table, while every
//! address already penalized stays so. It takes tens of thousands of addresses, each
//! failing within its refusal, to get there.
//!
//! [`adopt`]: Penalties::adopt

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::sys::{self, SharedZeroed};

/// Addresses the table tracks at once, as OpenSSH's default `max-sources`.
pub(crate) const ENTRIES: usize = 65_536;
/// Entries probed for an address.
pub(crate) const PROBES: usize = 8;
/// The first failure's penalty; each failure in a row doubles it.
pub(crate) const BASE: Duration = Duration::from_secs(1);

/// Failures in a row counted at most (the penalty is at its maximum long before).
const MAX_FAILURES: u64 = 255;
/// The largest `until` a state holds (40 bits of milliseconds: 34 years of uptime).
const UNTIL_MAX: u64 = (1 << 40) - 1;

/// One address's entry.
#[repr(C)]
#[derive(Debug)]
struct Entry {
    /// The address's key ([`Penalties::key_of`]); 0: free.
    key: AtomicU64,
    /// `until << 24 | failures << 16 | tag` (see the module documentation); 0: none.
    state: AtomicU64,
}

/// The shared table (see the module documentation).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Penalties {
    /// `--penalty-max` in milliseconds: the longest refusal, and how long an address stays
    /// remembered after its refusal ends.
    max_ms: AtomicU64,
    /// The hash key, random, drawn by the master with the table.
    seed: AtomicU64,
    /// Failures charged since the start (0: nothing to look up).
    charged: AtomicU64,
    /// Connections refused by admission.
    refused: AtomicU64,
    /// Failures the table could not record (full: failed open).
    unrecorded: AtomicU64,
    entries: [Entry; ENTRIES],
}

// SAFETY: `Penalties` and `Entry` are `#[repr(C)]`, made only of atomics and an array of
// atomics (valid when zero), and hold no pointers.
unsafe impl SharedZeroed for Penalties {}

/// An address's refusal in force, as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// How long it still lasts.
    pub(crate) left: Duration,
    /// The failures in a row that earned it.
    pub(crate) failures: u32,
}

/// The table's counters, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Failures charged since the start.
    pub(crate) charged: u64,
    /// Connections refused by admission since the start.
    pub(crate) refused: u64,
    /// Failures not recorded because the table was full (it failed open).
    pub(crate) unrecorded: u64,
    /// Addresses refused right now.
    pub(crate) addresses: u64,
}

/// The table this process made (the master, before forking: its workers inherit it) or
/// adopted (a re-executed worker).
static INSTALLED: OnceLock<&'static Penalties> = OnceLock::new();
/// Its memfd (kept open for life: re-executed workers inherit it).
static MEMFD: OnceLock<OwnedFd> = OnceLock::new();

/// Makes the table with the maximum penalty `max` and installs it for this process and
/// the workers it forks; called once by the master before the first fork.
pub(crate) fn create(max: Duration) -> io::Result<&'static Penalties> {
    let (table, fd) = Penalties::map(max)?;
    let _ = MEMFD.set(fd);
    Ok(*INSTALLED.get_or_init(|| table))
}

/// A re-executed worker installs the table its master made, from its memfd (closed once
/// mapped: a worker hands it to no one).
pub(crate) fn adopt(fd: OwnedFd) -> io::Result<&'static Penalties> {
    let table = Penalties::adopt(fd)?;
    Ok(*INSTALLED.get_or_init(|| table))
}

/// The table of this process: `None` with `--penalty-max 0`, and in a process that is no
/// server's (a unit test).
pub(crate) fn installed() -> Option<&'static Penalties> {
    INSTALLED.get().copied()
}

/// The memfd of the installed table, for a re-executed worker to map.
pub(crate) fn memfd() -> Option<RawFd> {
    MEMFD.get().map(AsRawFd::as_raw_fd)
}

/// Charges `ip` with a failure in the installed table, now: the refusal it earned, `None`
/// when nothing was charged (no table, or a full one).
pub(crate) fn charge(ip: IpAddr) -> Option<Duration> {
    installed()?.charge_at(ip, now_ms())
}

/// Monotonic milliseconds, comparable between processes (`CLOCK_MONOTONIC`, the vDSO).
pub(crate) fn now_ms() -> u64 {
    sys::monotonic_ns() / 1_000_000
}

fn until_of(state: u64) -> u64 {
    state >> 24
}

fn failures_of(state: u64) -> u64 {
    (state >> 16) & 0xff
}

fn tag_of(state: u64) -> u64 {
    state & 0xffff
}

/// The penalty of the `failures`-th failure in a row (at least 1).
fn penalty_ms(failures: u64, max_ms: u64) -> u64 {
    let base = BASE.as_millis() as u64;
    base.checked_shl(failures.saturating_sub(1).min(40) as u32)
        .unwrap_or(u64::MAX)
        .min(max_ms)
}

/// 64 bits mixed (the finaliser of SplitMix64): every input bit moves every output bit.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Penalties {
    /// Maps a new, empty table with the maximum penalty `max` (at least a millisecond).
    fn map(max: Duration) -> io::Result<(&'static Penalties, OwnedFd)> {
        let (table, fd) = sys::map_shared::<Penalties>()?;
        let max_ms = u64::try_from(max.as_millis())
            .unwrap_or(u64::MAX)
            .clamp(1, UNTIL_MAX);
        table.max_ms.store(max_ms, Ordering::SeqCst);
        table.seed.store(sys::random_u64(), Ordering::SeqCst);
        Ok((table, fd))
    }

    /// A new table of its own, not installed (another module's tests).
    #[cfg(test)]
    pub(crate) fn for_tests(max: Duration) -> &'static Penalties {
        Penalties::map(max).expect("a penalty table").0
    }

    /// Maps, in a re-executed worker, the table its master made, from its memfd.
    fn adopt(fd: OwnedFd) -> io::Result<&'static Penalties> {
        let table = sys::map_shared_fd::<Penalties>(fd)?;
        if table.max_ms.load(Ordering::SeqCst) == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the penalty table does not have the layout expected (a different version of the program?)",
            ));
        }
        Ok(table)
    }

    /// The key of `ip` (an IPv4 address, or an IPv6 `/64`; never 0) and its tag.
    fn key_of(&self, ip: IpAddr) -> (u64, u64) {
        let v4 = match ip {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(a) => a.to_ipv4_mapped(),
        };
        let key = match (v4, ip) {
            // As an IPv6 prefix, ffff:0:a.b.c.d/64: multicast space, never a TCP client.
            (Some(a), _) => 0xffff_0000_0000_0000 | u64::from(u32::from(a)),
            // `::/64` (`::1` lives there) would be 0, a free entry: ffff:ffff:ffff:ffff::/64
            // instead, multicast space too.
            (None, IpAddr::V6(a)) => Some((a.to_bits() >> 64) as u64)
                .filter(|k| *k != 0)
                .unwrap_or(u64::MAX),
            (None, IpAddr::V4(_)) => unreachable!("an IPv4 address has its IPv4 form"),
        };
        let seed = self.seed.load(Ordering::Relaxed);
        (key, mix(key ^ seed.rotate_left(17)) & 0xffff)
    }

    /// The entries probed for `key`, in order.
    fn probes(&self, key: u64) -> impl Iterator<Item = &Entry> + Clone {
        let seed = self.seed.load(Ordering::Relaxed);
        let start = (mix(key ^ seed) >> (64 - ENTRIES.trailing_zeros())) as usize;
        (0..PROBES).map(move |p| &self.entries[(start + p) % ENTRIES])
    }

    /// Whether `state` holds nothing to remember at `now` (none, or quiet for the maximum
    /// penalty after its refusal ended).
    fn forgotten(&self, state: u64, now: u64) -> bool {
        failures_of(state) == 0 || now >= until_of(state).saturating_add(self.max_ms.load(Ordering::Relaxed))
    }

    /// Charges `ip` with a failure at `now` (monotonic milliseconds): the refusal it now
    /// has from `now`, or `None` when the table could not record it (full: see the module
    /// documentation).
    pub(crate) fn charge_at(&self, ip: IpAddr, now: u64) -> Option<Duration> {
        let (key, tag) = self.key_of(ip);
        // Counted before the entry is written: a lookup that finds nothing charged yet
        // comes before the charge (see `refusal_at`).
        self.charged.fetch_add(1, Ordering::SeqCst);
        for _ in 0..3 {
            let probes = self.probes(key);
            if let Some(e) = probes.clone().find(|e| e.key.load(Ordering::Acquire) == key) {
                return Some(self.strike(e, tag, now));
            }
            let Some((e, old)) = self.victim(probes, now) else {
                break;
            };
            match e
                .key
                .compare_exchange(old, key, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if old != 0 {
                        // Taken over from another address: its state is not this one's,
                        // even where the two tags happen to match (one in 65,536), which
                        // would charge this address the other's doubled penalty. (A
                        // charge of this address by another worker in between may be
                        // lost: a race loses a charge, never refuses the uncharged.)
                        e.state.store(0, Ordering::Release);
                    }
                    return Some(self.strike(e, tag, now));
                }
                // Another worker claimed it for this address: the same entry.
                Err(k) if k == key => return Some(self.strike(e, tag, now)),
                // For another address: look again.
                Err(_) => {}
            }
        }
        self.unrecorded.fetch_add(1, Ordering::Relaxed);
        unrecorded_warning(ip);
        None
    }

    /// The entry a new address takes among `probes`, with the key it holds: a free or
    /// forgotten one, else the one whose refusal ended longest ago; `None` when all of them
    /// refuse their address now.
    fn victim<'a>(
        &self,
        probes: impl Iterator<Item = &'a Entry> + Clone,
        now: u64,
    ) -> Option<(&'a Entry, u64)> {
        let look = |e: &'a Entry| (e, e.key.load(Ordering::Acquire), e.state.load(Ordering::Acquire));
        if let Some((e, k, _)) = probes
            .clone()
            .map(look)
            .find(|(_, k, s)| *k == 0 || self.forgotten(*s, now))
        {
            return Some((e, k));
        }
        probes
            .map(look)
            .filter(|(_, _, s)| until_of(*s) <= now)
            .min_by_key(|(_, _, s)| until_of(*s))
            .map(|(e, k, _)| (e, k))
    }

    /// One more failure in a row for the address tagged `tag` in entry `e`, at `now`: the
    /// refusal from `now`.
    fn strike(&self, e: &Entry, tag: u64, now: u64) -> Duration {
        let max_ms = self.max_ms.load(Ordering::Relaxed);
        let mut cur = e.state.load(Ordering::Acquire);
        loop {
            // Another address's state (the entry changed hands), or one forgotten: none.
            let (until, failures) = if tag_of(cur) == tag && !self.forgotten(cur, now) {
                (until_of(cur), failures_of(cur))
            } else {
                (0, 0)
            };
            let failures = (failures + 1).min(MAX_FAILURES);
            let until = until
                .max(now.saturating_add(penalty_ms(failures, max_ms)))
                .min(UNTIL_MAX);
            let next = until << 24 | failures << 16 | tag;
            match e
                .state
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Duration::from_millis(until.saturating_sub(now)),
                Err(seen) => cur = seen,
            }
        }
    }

    /// Whether `ip` is refused now; what admission asks of every new connection.
    pub(crate) fn refusal(&self, ip: IpAddr) -> Option<Refusal> {
        // Nothing ever charged (the usual case): one load, not even the clock.
        if self.charged.load(Ordering::SeqCst) == 0 {
            return None;
        }
        self.refusal_at(ip, now_ms())
    }

    /// Whether `ip` is refused at `now` (monotonic milliseconds), and for how long still.
    pub(crate) fn refusal_at(&self, ip: IpAddr, now: u64) -> Option<Refusal> {
        let (key, tag) = self.key_of(ip);
        // Every entry of the key: two workers claiming at once may have made two.
        self.probes(key)
            .filter(|e| e.key.load(Ordering::Acquire) == key)
            .map(|e| e.state.load(Ordering::Acquire))
            .filter(|s| tag_of(*s) == tag && failures_of(*s) > 0 && until_of(*s) > now)
            .map(|s| Refusal {
                left: Duration::from_millis(until_of(s) - now),
                failures: failures_of(s) as u32,
            })
            .max_by_key(|r| r.left)
    }

    /// Admission refused a connection of a penalized address.
    pub(crate) fn count_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters, and the addresses refused now (a scan of the table: the master's, for
    /// the metrics).
    pub(crate) fn stats(&self) -> Stats {
        self.stats_at(now_ms())
    }

    fn stats_at(&self, now: u64) -> Stats {
        let charged = self.charged.load(Ordering::Relaxed);
        let addresses = if charged == 0 {
            0
        } else {
            self.entries
                .iter()
                .filter(|e| e.key.load(Ordering::Relaxed) != 0)
                .filter(|e| {
                    let s = e.state.load(Ordering::Relaxed);
                    failures_of(s) > 0 && until_of(s) > now
                })
                .count() as u64
        };
        Stats {
            charged,
            refused: self.refused.load(Ordering::Relaxed),
            unrecorded: self.unrecorded.load(Ordering::Relaxed),
            addresses,
        }
    }
}

/// The warning that the table is full, at most once a minute per process.
fn unrecorded_warning(ip: IpAddr) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = now_ms().max(1);
    let last = LAST.load(Ordering::Relaxed);
    if (last == 0 || now.saturating_sub(last) >= 60_000)
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            "the penalty table is full: a failed authentication from {ip} was not recorded, and \
             the address is not refused (the table fails open; see appsrv_penalties_unrecorded_total)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn table(max: Duration) -> &'static Penalties {
        Penalties::map(max).unwrap().0
    }

    const S: u64 = 1_000;
    /// A monotonic time well after boot.
    const T0: u64 = 1_000_000 * S;

    #[test]
    fn issue_31_each_failure_in_a_row_doubles_the_refusal_up_to_the_maximum() {
        let p = table(Duration::from_secs(60));
        let a = ip("192.0.2.1");
        assert_eq!(p.refusal_at(a, T0), None, "nothing charged");
        let mut now = T0;
        let mut got = Vec::new();
        for _ in 0..9 {
            let left = p.charge_at(a, now).unwrap();
            assert_eq!(
                p.refusal_at(a, now),
                Some(Refusal {
                    left,
                    failures: got.len() as u32 + 1
                })
            );
            // Refused until the very end, not after.
            let end = now + left.as_millis() as u64;
            assert!(p.refusal_at(a, end - 1).is_some());
            assert_eq!(p.refusal_at(a, end), None);
            got.push(left.as_secs());
            // The attacker retries the moment it may.
            now = end;
        }
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        // Another address, and the same one in another form, on their own.
        assert_eq!(p.refusal_at(ip("192.0.2.2"), T0), None);
        let later = now - 1;
        assert_eq!(
            p.refusal_at(ip("::ffff:192.0.2.1"), later).map(|r| r.failures),
            Some(9)
        );
    }

    #[test]
    fn issue_31_failures_on_connections_admitted_before_count_at_once() {
        // A parallel brute force: three connections admitted before the first failure
        // each fail within the same millisecond.
        let p = table(Duration::from_secs(600));
        let a = ip("198.51.100.7");
        let lefts: Vec<u64> = (0..3).map(|_| p.charge_at(a, T0).unwrap().as_secs()).collect();
        assert_eq!(lefts, [1, 2, 4]);
    }

    #[test]
    fn issue_31_an_address_quiet_for_the_maximum_after_its_refusal_is_forgotten() {
        let max = Duration::from_secs(60);
        let p = table(max);
        let a = ip("2001:db8::1");
        let mut now = T0;
        for _ in 0..4 {
            now += p.charge_at(a, now).unwrap().as_millis() as u64;
        }
        // Refused 8 s by the 4th failure, which ended at `now`. Within the quiet period
        // after it: the next failure doubles.
        let just_before = now + 60 * S - 1;
        assert_eq!(p.charge_at(a, just_before), Some(Duration::from_secs(16)));
        let end = just_before + 16 * S;
        // Quiet for 60 s after that refusal ended: forgotten, back to 1 s.
        let quiet = end + 60 * S;
        assert_eq!(p.refusal_at(a, quiet), None);
        assert_eq!(p.charge_at(a, quiet), Some(Duration::from_secs(1)));
        assert_eq!(p.refusal_at(a, quiet).unwrap().failures, 1);
    }

    #[test]
    fn issue_31_ipv6_counts_by_its_64_and_ipv4_by_address() {
        let p = table(Duration::from_secs(600));
        p.charge_at(ip("2001:db8:0:1::1"), T0).unwrap();
        // The same /64: another address of the same host.
        assert!(p.refusal_at(ip("2001:db8:0:1:ffff:ffff:ffff:ffff"), T0).is_some());
        assert!(p.refusal_at(ip("2001:db8:0:2::1"), T0).is_none(), "the next /64");
        p.charge_at(ip("203.0.113.9"), T0).unwrap();
        assert!(
            p.refusal_at(ip("203.0.113.10"), T0).is_none(),
            "IPv4: one address"
        );
        assert!(p.refusal_at(ip("::ffff:203.0.113.9"), T0).is_some());
        // `::1`, whose /64 is all zeros, has an entry like any other; `::2` shares it.
        p.charge_at(ip("::1"), T0).unwrap();
        assert!(p.refusal_at(ip("::2"), T0).is_some());
        assert!(p.refusal_at(ip("127.0.0.1"), T0).is_none());
    }

    #[test]
    fn issue_31_a_full_table_evicts_what_no_longer_refuses_then_fails_open() {
        let p = table(Duration::from_secs(600));
        // Fill the probed entries of a target address with others that are refused now:
        // addresses whose first probe is one of the target's probes.
        let target = ip("192.0.2.99");
        let (target_key, _) = p.key_of(target);
        let probed: Vec<&Entry> = p.probes(target_key).collect();
        let mut fillers = Vec::new();
        for i in 0..u32::MAX {
            let other = IpAddr::V4(std::net::Ipv4Addr::from_bits(0x0a00_0000 + i));
            let (k, _) = p.key_of(other);
            let first = p.probes(k).next().unwrap();
            if probed.iter().any(|e| std::ptr::eq(*e, first)) {
                fillers.push(other);
                if fillers.len() == 4 * PROBES {
                    break;
                }
            }
        }
        // Charged at T0: refused for 1 s each. Enough of them to take every probed entry
        // (the last ones may find their own entries full already: not recorded).
        for f in &fillers {
            p.charge_at(*f, T0);
        }
        let held = probed
            .iter()
            .filter(|e| e.key.load(Ordering::Relaxed) != 0)
            .count();
        assert_eq!(held, PROBES, "every probed entry is taken");
        // While they are all refused: the target is not recorded (fails open), and said so.
        let before = p.stats_at(T0).unrecorded;
        assert_eq!(p.charge_at(target, T0 + 10), None);
        assert_eq!(p.refusal_at(target, T0 + 10), None, "not refused: failed open");
        assert_eq!(p.stats_at(T0).unrecorded, before + 1);
        // The addresses already refused stay so.
        let still = fillers
            .iter()
            .filter(|f| p.refusal_at(**f, T0 + 10).is_some())
            .count();
        assert!(still >= PROBES, "{still} of the fillers refused");
        // Once their refusals end (remembered still, not forgotten), the target takes the
        // entry whose refusal ended first.
        let after = T0 + 2 * S;
        assert_eq!(p.charge_at(target, after), Some(Duration::from_secs(1)));
        assert!(p.refusal_at(target, after).is_some());
    }

    #[test]
    fn issue_31_a_state_left_by_another_address_never_refuses() {
        // An entry that changed hands between a look and a write keeps the previous
        // address's state: its tag tells it apart.
        let p = table(Duration::from_secs(600));
        let a = ip("192.0.2.1");
        p.charge_at(a, T0).unwrap();
        let (ka, tag_a) = p.key_of(a);
        let left = p
            .probes(ka)
            .find(|e| e.key.load(Ordering::Relaxed) == ka)
            .unwrap();
        let state = left.state.load(Ordering::Relaxed);
        // Another address (of another tag: 1 in 65,536 share it), in its own first entry,
        // with a's state.
        let b = (2..=255u8)
            .map(|i| IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, i)))
            .find(|b| p.key_of(*b).1 != tag_a)
            .unwrap();
        let (kb, _) = p.key_of(b);
        let taken = p.probes(kb).next().unwrap();
        taken.key.store(kb, Ordering::SeqCst);
        taken.state.store(state, Ordering::SeqCst);
        assert_eq!(p.refusal_at(b, T0), None, "a's state is not b's");
        // And b's first failure starts at 1 s, not after a's count.
        assert_eq!(p.charge_at(b, T0), Some(Duration::from_secs(1)));
        assert_eq!(p.refusal_at(b, T0).unwrap().failures, 1);
    }

    #[test]
    fn issue_31_stats_count_charges_refusals_and_refused_addresses() {
        let p = table(Duration::from_secs(600));
        assert_eq!(p.stats_at(T0), Stats::default());
        p.charge_at(ip("192.0.2.1"), T0);
        p.charge_at(ip("192.0.2.1"), T0);
        p.charge_at(ip("2001:db8::1"), T0);
        p.count_refused();
        let s = p.stats_at(T0);
        assert_eq!((s.charged, s.refused, s.unrecorded, s.addresses), (3, 1, 0, 2));
        // 2001:db8::1 had 1 s; 192.0.2.1 had 2 s.
        assert_eq!(p.stats_at(T0 + 1500).addresses, 1);
        assert_eq!(p.stats_at(T0 + 2000).addresses, 0);
    }

    #[test]
    fn issue_31_workers_charging_at_once_all_count() {
        let p = table(Duration::from_secs(600));
        let a = ip("192.0.2.77");
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..5 {
                        p.charge_at(a, T0).unwrap();
                    }
                });
            }
        });
        assert_eq!(p.refusal_at(a, T0).unwrap().failures, 20);
        assert_eq!(p.refusal_at(a, T0).unwrap().left, Duration::from_secs(600));
    }

    #[test]
    fn issue_31_a_second_mapping_from_the_memfd_sees_the_same_table() {
        // As a re-executed worker would (`--exec-workers`).
        let (p, fd) = Penalties::map(Duration::from_secs(30)).unwrap();
        let q = Penalties::adopt(fd).unwrap();
        assert_eq!(q.max_ms.load(Ordering::Relaxed), 30_000);
        q.charge_at(ip("192.0.2.8"), T0).unwrap();
        assert!(p.refusal_at(ip("192.0.2.8"), T0).is_some());
        let (_, other) = sys::map_shared::<Penalties>().unwrap();
        assert!(Penalties::adopt(other).is_err(), "never set up: not a table");
    }
}

//! The per-source answer-rate table of datagram listeners (`--max-answers-per-ip`):
//! shared by every worker on the board, so that the limit holds however the kernel
//! spreads one source's datagrams over them.

use std::sync::atomic::Ordering;

use super::{Board, RATE_ENTRIES, RateEntry};

/// Entries probed for a source before the table gives up on it.
const RATE_PROBES: usize = 8;

/// How the answer-rate table (`--max-answers-per-ip`) groups sources: by the network of
/// this prefix length around each address (`--answers-ipv4-prefix`,
/// `--answers-ipv6-prefix`). An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, a dual-stack
/// socket's view of an IPv4 client) counts as its IPv4 address.
///
/// Why networks and not addresses: the limit is against reflection, where an attacker
/// forges the victim's address, and a victim network is attacked through many of its
/// addresses at once (a /24's 254 hosts, each with its own allowance, would get 254 times
/// the answers). BIND's and NSD's response rate limiting group sources the same way, by an
/// IPv4 /24 and an IPv6 /56 by default (the usual site allocation; one host has a /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AnswerPrefixes {
    /// The IPv4 prefix length, 1 to 32 (the command line checks it).
    pub(crate) v4: u8,
    /// The IPv6 prefix length, 1 to 128.
    pub(crate) v6: u8,
}

impl AnswerPrefixes {
    /// BIND's and NSD's defaults: an IPv4 /24, an IPv6 /56.
    pub(crate) const DEFAULT: AnswerPrefixes = AnswerPrefixes { v4: 24, v6: 56 };
}

/// The tag of IPv4 keys, in the high half: as an IPv6 /32 it is inside `ff00::/8`
/// (multicast), which is never a source address, so no IPv6 key of a /64 or shorter prefix
/// can equal an IPv4 key.
const V4_KEY_TAG: u64 = 0xFFFF_0000_0000_0000;

/// The answer-rate table's key of a source: its network under `prefixes`, never 0 (a free
/// entry). Exact for IPv4 and for IPv6 prefixes up to 64 bits (the network itself, so two
/// networks never share an entry). A longer IPv6 prefix does not fit the 64-bit key: the
/// bits past the 64th are folded in through a bijection keyed by `seed` (the table's
/// secret), so that the networks inside one /64 all get different keys, and a sender who
/// does not know the secret cannot pick two networks that share one.
fn rate_key(ip: std::net::IpAddr, prefixes: AnswerPrefixes, seed: u64) -> u64 {
    match ip.to_canonical() {
        std::net::IpAddr::V4(a) => {
            let bits = u32::from(prefixes.v4.clamp(1, 32));
            V4_KEY_TAG | u64::from(u32::from(a) & (u32::MAX << (32 - bits)))
        }
        std::net::IpAddr::V6(a) => {
            let bits = u32::from(prefixes.v6.clamp(1, 128));
            let net = u128::from(a) & (u128::MAX << (128 - bits));
            let (high, low) = ((net >> 64) as u64, net as u64);
            // `::/64` (the unspecified and loopback addresses' network) would be 0: it
            // shares 1 with `0:0:0:1::/64`, both reserved, neither a real network.
            let key = if bits <= 64 { high } else { high ^ fold(low, seed) };
            key.max(1)
        }
    }
}

/// A bijection of 64-bit values keyed by `seed`: an xor, a multiplication by an odd
/// constant, an xorshift, each invertible.
fn fold(x: u64, seed: u64) -> u64 {
    let x = (x ^ seed.rotate_left(29)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    x ^ (x >> 32)
}

/// Counts one answer in `e` if its second's count is below `limit`.
fn take_answer(e: &RateEntry, second: u32, limit: u32) -> bool {
    let mut cur = e.state.load(Ordering::Acquire);
    loop {
        let (s, n) = ((cur >> 32) as u32, cur as u32);
        let next = if s != second {
            u64::from(second) << 32 | 1
        } else if n < limit {
            cur + 1
        } else {
            return false;
        };
        match e
            .state
            .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

impl Board {
    /// Whether one more answer to `ip` fits within `limit` answers in the current second
    /// (monotonic `now_ns`), counting it if so. Fixed one-second windows per source network
    /// (`ip`'s network under `prefixes`: see [`AnswerPrefixes`]), in a table shared by the
    /// workers and updated with compare-and-swap only. A source is looked for in
    /// [`RATE_PROBES`] entries from its hash; an entry idle for over a second is taken
    /// over. When all of them hold sources answered within the last second (a flood from
    /// thousands of sources), the new source is not limited: a table that can only track
    /// so many sources must fail open rather than refuse everyone.
    pub(crate) fn answer_allowed(
        &self,
        ip: std::net::IpAddr,
        prefixes: AnswerPrefixes,
        limit: u32,
        now_ns: u64,
    ) -> bool {
        let seed = self.rate_seed.load(Ordering::Relaxed);
        let key = rate_key(ip, prefixes, seed);
        let second = (now_ns / 1_000_000_000) as u32 + 1;
        // Keyed by a secret drawn when the board was made, so that a sender cannot choose
        // addresses that land on a victim's entries.
        let mixed = (key ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let start = (mixed >> (64 - RATE_ENTRIES.trailing_zeros())) as usize;
        let entry = |probe: usize| &self.answers[(start + probe) % RATE_ENTRIES];
        // The source's own entry first, wherever it is among the probes: a free entry
        // before it must not give it a fresh count.
        if let Some(e) = (0..RATE_PROBES)
            .map(entry)
            .find(|e| e.key.load(Ordering::Acquire) == key)
        {
            return take_answer(e, second, limit);
        }
        for probe in 0..RATE_PROBES {
            let e = entry(probe);
            let k = e.key.load(Ordering::Acquire);
            let stale = (e.state.load(Ordering::Acquire) >> 32) as u32 + 1 < second;
            // A free or stale entry's second differs from this one, so take_answer starts
            // its count afresh (no reset here: a worker that took it at the same moment may
            // have counted in it already).
            if (k == 0 || stale)
                && e.key
                    .compare_exchange(k, key, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return take_answer(e, second, limit);
            }
            if e.key.load(Ordering::Acquire) == key {
                return take_answer(e, second, limit);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn issue_19_answer_rate_holds_per_source_and_second() {
        let b = Board::new().unwrap();
        // Each IPv4 address alone, an IPv6 /64 (issue 19's grouping, now flags).
        let each = AnswerPrefixes { v4: 32, v6: 64 };
        let (a, other) = (ip("192.0.2.1"), ip("192.0.2.2"));
        let t = 5_000_000_000;
        assert_eq!((0..10).filter(|_| b.answer_allowed(a, each, 3, t)).count(), 3);
        // Another source has its own allowance; the same one gets a new one next second.
        assert!(b.answer_allowed(other, each, 3, t));
        assert!(b.answer_allowed(a, each, 3, t + 1_000_000_000));
        // An IPv6 /64 is one source; IPv4-mapped is the IPv4 address.
        assert!(b.answer_allowed(ip("2001:db8::1"), each, 1, t));
        assert!(!b.answer_allowed(ip("2001:db8::2"), each, 1, t));
        assert!(b.answer_allowed(ip("2001:db8:0:1::1"), each, 1, t));
        assert!(!b.answer_allowed(ip("::ffff:192.0.2.1"), each, 1, t + 1_000_000_000));
    }

    /// Issue 31: the key is the source's network. With the defaults, an IPv4 /24 (an
    /// IPv4-mapped IPv6 address is its IPv4 address) and an IPv6 /56; any prefix length
    /// the command line takes gives one key per network and distinct keys to distinct
    /// networks, never 0 (a free entry).
    #[test]
    fn issue_31_the_rate_key_is_the_sources_network() {
        let seed = 0x0123_4567_89ab_cdef;
        let key = |s: &str, v4: u8, v6: u8| rate_key(ip(s), AnswerPrefixes { v4, v6 }, seed);
        let d = |s: &str| key(s, 24, 56);
        assert_eq!(AnswerPrefixes::DEFAULT, AnswerPrefixes { v4: 24, v6: 56 });
        // IPv4: a /24.
        assert_eq!(d("192.0.2.1"), d("192.0.2.254"));
        assert_eq!(d("192.0.2.1"), d("192.0.2.0"));
        assert_ne!(d("192.0.2.1"), d("192.0.3.1"));
        assert_ne!(d("192.0.2.1"), d("193.0.2.1"));
        assert_eq!(d("127.0.0.2"), d("127.0.0.200"));
        assert_ne!(d("127.0.0.2"), d("127.0.1.2"));
        // IPv4-mapped IPv6 is the IPv4 address, under the IPv4 prefix.
        assert_eq!(d("::ffff:192.0.2.77"), d("192.0.2.1"));
        assert_ne!(d("::ffff:192.0.3.1"), d("192.0.2.1"));
        assert_eq!(key("::ffff:10.1.2.3", 8, 128), key("10.200.0.1", 8, 128));
        // IPv6: a /56, the 8 bits after it included, the 64 after them not.
        assert_eq!(d("2001:db8:0:1::1"), d("2001:db8:0:ff:ffff::9"));
        assert_eq!(d("2001:db8::1"), d("2001:db8:0:1::1"));
        assert_ne!(d("2001:db8::1"), d("2001:db8:0:100::1"));
        assert_ne!(d("2001:db8::1"), d("2001:db9::1"));
        // IPv4-compatible (deprecated, not mapped) is IPv6, not its IPv4 address.
        assert_ne!(d("::c000:201"), d("192.0.2.1"));
        // Other lengths: each address alone, and longer IPv6 prefixes than the key's 64
        // bits (folded, still one key per network).
        assert_ne!(key("192.0.2.1", 32, 56), key("192.0.2.2", 32, 56));
        assert_eq!(key("192.0.2.1", 31, 56), key("192.0.2.0", 31, 56));
        assert_eq!(key("10.9.8.7", 1, 56), key("127.0.0.1", 1, 56));
        assert_ne!(key("10.9.8.7", 1, 56), key("128.0.0.1", 1, 56));
        assert_eq!(key("2001:db8::1", 1, 1), key("::1", 1, 1));
        assert_ne!(key("2001:db8::1", 1, 1), key("8000::1", 1, 1));
        assert_eq!(key("2001:db8::1:2", 120, 112), key("2001:db8::1:ff", 120, 112));
        assert_ne!(key("2001:db8::1:2", 120, 112), key("2001:db8::2:2", 120, 112));
        assert_ne!(key("2001:db8::1", 32, 128), key("2001:db8::2", 32, 128));
        let mut in_one_64: Vec<u64> = (0..4096u32)
            .map(|i| key(&format!("2001:db8::{:x}:{:x}", i >> 8, i & 0xff), 24, 128))
            .collect();
        in_one_64.sort_unstable();
        in_one_64.dedup();
        assert_eq!(in_one_64.len(), 4096, "a /128 each, inside one /64");
        // Never 0.
        for (s, v6) in [("::", 56), ("::1", 56), ("::", 128), ("::1", 64)] {
            assert_ne!(key(s, 24, v6), 0, "{s} /{v6}");
        }
    }

    /// Issue 31: the sources of one network share one budget, across its addresses.
    #[test]
    fn issue_31_a_networks_addresses_share_one_answer_budget() {
        let b = Board::new().unwrap();
        let d = AnswerPrefixes::DEFAULT;
        let t = 7_000_000_000;
        let answered = (2..=254)
            .filter(|i| b.answer_allowed(ip(&format!("198.51.100.{i}")), d, 10, t))
            .count();
        assert_eq!(answered, 10, "253 addresses of one /24, 10 answers in all");
        assert!(
            b.answer_allowed(ip("198.51.101.2"), d, 10, t),
            "the next /24 has its own"
        );
        assert!(
            !b.answer_allowed(ip("::ffff:198.51.100.9"), d, 10, t),
            "IPv4-mapped: the same /24"
        );
        let v6 = (0..100)
            .filter(|i| b.answer_allowed(ip(&format!("2001:db8:0:{i:x}::1")), d, 10, t))
            .count();
        assert_eq!(v6, 10, "100 /64s of one /56");
        assert!(
            b.answer_allowed(ip("2001:db8:0:100::1"), d, 10, t),
            "the next /56"
        );
        // A second later, a new budget.
        assert!(b.answer_allowed(ip("198.51.100.200"), d, 10, t + 1_000_000_000));
    }
}

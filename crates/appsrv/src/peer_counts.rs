//! Per-address connection counts across event workers (`--io event` with
//! `--max-conns-per-ip`): memory shared by the master and its workers, one table per worker.
//!
//! A blocking worker serves one client at a time, so the per-address cap counts the slots
//! of the scoreboard that name a client (`Board::connections_from`). An event worker holds
//! thousands of connections: here each worker counts its own, per client address, in its
//! own table, and whoever needs the total for an address sums it over every table. So a
//! killed worker's counts are one table, which the master clears when it reaps the worker
//! ([`PeerCounts::clear`]): they vanish with it, and nothing has to be undone.
//!
//! # Layout
//!
//! One memfd, mapped `MAP_SHARED` by the master before the first fork (and again from the
//! memfd by a re-executed worker, [`PeerCounts::adopt`]), holding only `#[repr(C)]` atomics:
//! an array of [`Entry`]s. Entry 0 describes the whole (the number of tables, their
//! capacity, and the highest worker id that has used its table); then come the tables,
//! worker 1's first, each made of a header entry (how many of its entries hold a key; the
//! connections from `::`, whose key would be 0) and `capacity` entries, a power of two at
//! least twice the connections a worker may hold. Pages are allocated by the kernel when
//! first touched, so the tables cost what their workers use, not their size.
//!
//! # Tables
//!
//! Open addressing with linear probing, keyed by the client's address as the 128 bits of
//! its IPv6 form (an IPv4 address is IPv4-mapped, so `192.0.2.1` and `::ffff:192.0.2.1` are
//! one client). An entry is a key (two `AtomicU64`, 0 when never used) and a count
//! (`AtomicU32`). A count of 0 leaves the key in place (a "stale" key) and the entry free
//! for reuse by any key; a lookup probes past entries of count 0 and stops at a never-used
//! one (or a full circle). Entries never go back to never-used except by compaction: when
//! taking a never-used entry would leave less than a quarter of the table never used, the
//! owner first rebuilds its table from its live entries. With at most `capacity / 2` live
//! keys, that happens at most once per `capacity / 4` new keys, and probes stay short.
//!
//! # Concurrency
//!
//! No locks. Each worker writes only its own table (from its one thread: [`add`],
//! [`remove`]); any process reads all of them ([`total`]); the master zeroes a dead
//! worker's table ([`clear`]). All accesses are `SeqCst`, so that two workers admitting
//! the same address at once (each adds, then sums, as the event loop's admission does) cannot both miss the other's
//! count: one of them may refuse for nothing, but the cap is not exceeded.
//!
//! A reader that races with the owner reads each entry's key, then its count, then the key
//! again, and counts the entry only if the key did not change: an entry taken over by
//! another key while it was read (its count 0 meanwhile) counts nothing. A reader therefore
//! never reports more connections than were added and not removed, with one caveat the
//! other way: **while the owner compacts its table** (it zeroes the table, then writes its
//! live entries back: a few microseconds for a few thousand entries, once per
//! `capacity / 4` new keys), a reader may miss that worker's connections and undercount,
//! and an admission racing with it may let one connection more than the cap in.
//!
//! [`add`]: PeerCounts::add
//! [`remove`]: PeerCounts::remove
//! [`total`]: PeerCounts::total
//! [`clear`]: PeerCounts::clear

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

use crate::sys::{self, SharedZeroed};

/// The fewest entries a table has.
const MIN_CAPACITY: usize = 16;

/// One entry of a table (or a header: see the module documentation).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Entry {
    /// The key's high and low 64 bits; both 0: never used. In a table's header: the number
    /// of the table's entries that hold a key, and 0. In entry 0: the number of tables and
    /// their capacity.
    key: [AtomicU64; 2],
    /// Connections. In a table's header: those from `::`. In entry 0: the highest worker
    /// id whose table was used.
    count: AtomicU32,
    _pad: AtomicU32,
}

// SAFETY: `Entry` is `#[repr(C)]`, made only of atomics (valid when zero), and holds no
// pointers.
unsafe impl SharedZeroed for Entry {}

impl Entry {
    fn key(&self) -> u128 {
        (u128::from(self.key[0].load(SeqCst)) << 64) | u128::from(self.key[1].load(SeqCst))
    }

    fn set_key(&self, key: u128) {
        self.key[0].store((key >> 64) as u64, SeqCst);
        self.key[1].store(key as u64, SeqCst);
    }
}

/// What [`PeerCounts::admit`] decided (the tests' model of the worker's admission, which
/// does the same with `add` and `total`: `worker/admission.rs`, `EventSeat`).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Counted: the connection is in.
    Admitted,
    /// The address has its limit of connections already: not counted, refuse it.
    OverLimit,
    /// This worker's table has no room (it holds more addresses than the table was sized
    /// for, or the worker id has no table): not counted, refuse it. Never happens to a
    /// worker that holds at most the connections [`PeerCounts::new`] was given.
    NoRoom,
}

/// The per-worker tables of connections by client address: see the module documentation.
#[derive(Debug)]
pub(crate) struct PeerCounts {
    entries: &'static [Entry],
    /// Tables, for worker ids 1 to `workers`.
    workers: usize,
    /// Entries per table (a power of two), besides its header.
    capacity: usize,
    /// The memfd behind `entries`, kept open for life: the master zeroes tables through it
    /// and hands it to re-executed workers.
    memfd: OwnedFd,
}

/// The 128-bit key of an address: its IPv6 form, an IPv4 address IPv4-mapped.
fn key_of(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().to_bits(),
        IpAddr::V6(v6) => v6.to_bits(),
    }
}

/// Where a key's probe sequence begins in a table of `capacity` (a power of two) entries.
fn home(key: u128, capacity: usize) -> usize {
    // Fold both halves, then a multiplicative hash, taking the product's high bits (an
    // IPv4 client differs from the next in its low bits only).
    let x = (key as u64) ^ ((key >> 64) as u64).rotate_left(29);
    let bits = capacity.trailing_zeros();
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
}

/// Where an insertion of a key would go.
enum Place {
    /// The key's own entry (live or stale).
    Found(usize),
    /// An entry of count 0 that holds another key.
    Free(usize),
    /// A never-used entry.
    Unused(usize),
    /// None: every entry is live with another key.
    Full,
}

impl PeerCounts {
    /// Maps new tables for worker ids 1 to `workers`, each with room for the addresses of
    /// `per_worker_connections` connections; called once by the master before the first
    /// fork. `workers` must cover every id the master may give a worker (a reload's new
    /// generation takes new ids while the old one finishes); a table costs memory only
    /// once it is used.
    pub(crate) fn new(workers: usize, per_worker_connections: usize) -> io::Result<&'static PeerCounts> {
        let too_large = || io::Error::new(io::ErrorKind::InvalidInput, "per-address tables too large");
        let capacity = per_worker_connections
            .checked_mul(2)
            .and_then(usize::checked_next_power_of_two)
            .ok_or_else(too_large)?
            .max(MIN_CAPACITY);
        let len = workers
            .checked_mul(capacity + 1)
            .and_then(|n| n.checked_add(1))
            .filter(|_| u32::try_from(workers).is_ok())
            .ok_or_else(too_large)?;
        let (entries, memfd) = sys::map_shared_slice::<Entry>(len)?;
        entries[0].key[0].store(workers as u64, SeqCst);
        entries[0].key[1].store(capacity as u64, SeqCst);
        Ok(Box::leak(Box::new(PeerCounts {
            entries,
            workers,
            capacity,
            memfd,
        })))
    }

    /// The memfd of the tables, for a re-executed worker to map ([`adopt`](PeerCounts::adopt)).
    pub(crate) fn memfd(&self) -> RawFd {
        self.memfd.as_raw_fd()
    }

    /// Maps, in a re-executed worker, the tables its master made, from their memfd.
    pub(crate) fn adopt(fd: OwnedFd) -> io::Result<&'static PeerCounts> {
        let entries = sys::map_shared_slice_fd::<Entry>(fd.try_clone()?)?;
        let workers = usize::try_from(entries[0].key[0].load(SeqCst)).unwrap_or(0);
        let capacity = usize::try_from(entries[0].key[1].load(SeqCst)).unwrap_or(0);
        let fits = capacity.is_power_of_two()
            && workers
                .checked_mul(capacity + 1)
                .and_then(|n| n.checked_add(1))
                .is_some_and(|n| n == entries.len());
        if !fits {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the per-address tables do not have the layout expected (a different version of the program?)",
            ));
        }
        Ok(Box::leak(Box::new(PeerCounts {
            entries,
            workers,
            capacity,
            memfd: fd,
        })))
    }

    /// Where worker `id`'s table begins in the array (its header's index).
    fn base(&self, id: u32) -> Option<usize> {
        let t = (id as usize).checked_sub(1).filter(|t| *t < self.workers)?;
        Some(1 + t * (self.capacity + 1))
    }

    /// Worker `id`'s table: its header and its entries.
    fn table(&self, id: u32) -> Option<(&Entry, &[Entry])> {
        let base = self.base(id)?;
        Some((
            &self.entries[base],
            &self.entries[base + 1..base + 1 + self.capacity],
        ))
    }

    /// The table's entry for `key`, if any (a probe that stops at a never-used entry).
    fn find(&self, slots: &[Entry], key: u128) -> Option<usize> {
        let mask = self.capacity - 1;
        let start = home(key, self.capacity);
        for step in 0..self.capacity {
            let i = (start + step) & mask;
            match slots[i].key() {
                k if k == key => return Some(i),
                0 => return None,
                _ => {}
            }
        }
        None
    }

    /// Where `key` goes in the table (the owner only).
    fn place(&self, slots: &[Entry], key: u128) -> Place {
        let mask = self.capacity - 1;
        let start = home(key, self.capacity);
        let mut free = None;
        for step in 0..self.capacity {
            let i = (start + step) & mask;
            match slots[i].key() {
                k if k == key => return Place::Found(i),
                0 => return free.map_or(Place::Unused(i), Place::Free),
                _ if free.is_none() && slots[i].count.load(SeqCst) == 0 => free = Some(i),
                _ => {}
            }
        }
        free.map_or(Place::Full, Place::Free)
    }

    /// Worker `id` took a connection from `ip`: counts it in its own table. Only worker
    /// `id` calls this, from one thread. False when it could not: the table holds live
    /// entries for as many addresses as it has entries (more connections than it was sized
    /// for), or `id` has no table.
    pub(crate) fn add(&self, id: u32, ip: IpAddr) -> bool {
        let Some((head, slots)) = self.table(id) else {
            return false;
        };
        // Published before the count, so that a reader that misses the table's use also
        // comes before the count in the order of all `SeqCst` accesses (see the module documentation).
        if self.entries[0].count.load(SeqCst) < id {
            self.entries[0].count.fetch_max(id, SeqCst);
        }
        let key = key_of(ip);
        if key == 0 {
            head.count.fetch_add(1, SeqCst);
            return true;
        }
        let mut compacted = false;
        loop {
            let i = match self.place(slots, key) {
                Place::Found(i) => i,
                Place::Free(i) => {
                    // Count 0: readers count nothing here while the key changes.
                    slots[i].set_key(key);
                    i
                }
                Place::Unused(i) => {
                    let used = head.key[0].load(SeqCst) as usize;
                    if !compacted && (used + 1) * 4 > self.capacity * 3 {
                        self.compact(head, slots);
                        compacted = true;
                        continue;
                    }
                    // Counted as used before the key is written: a reader that skips the
                    // table for having none cannot have missed the key.
                    head.key[0].store(used as u64 + 1, SeqCst);
                    slots[i].set_key(key);
                    i
                }
                Place::Full => return false,
            };
            slots[i].count.fetch_add(1, SeqCst);
            return true;
        }
    }

    /// Worker `id`'s connection from `ip` closed: uncounts it in its own table. Only
    /// worker `id` calls this, from one thread. False when there was no such connection
    /// counted (a caller's bug: nothing changes).
    pub(crate) fn remove(&self, id: u32, ip: IpAddr) -> bool {
        let Some((head, slots)) = self.table(id) else {
            return false;
        };
        let key = key_of(ip);
        let count = if key == 0 {
            &head.count
        } else {
            match self.find(slots, key) {
                Some(i) => &slots[i].count,
                None => return false,
            }
        };
        // The owner is the only writer: a load then a store would do, but the count must
        // be `SeqCst` for the readers either way.
        count.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok()
    }

    /// Connections from `ip`, over every worker's table (any process).
    pub(crate) fn total(&self, ip: IpAddr) -> usize {
        let key = key_of(ip);
        let used = (self.entries[0].count.load(SeqCst) as usize).min(self.workers);
        let mut sum = 0usize;
        for id in 1..=used as u32 {
            let Some((head, slots)) = self.table(id) else {
                continue;
            };
            if key == 0 {
                sum += head.count.load(SeqCst) as usize;
            } else if head.key[0].load(SeqCst) != 0 {
                sum += self.count_in(slots, key);
            }
        }
        sum
    }

    /// `key`'s connections in one table, as a reader racing with its owner sees them.
    fn count_in(&self, slots: &[Entry], key: u128) -> usize {
        let Some(i) = self.find(slots, key) else { return 0 };
        let n = slots[i].count.load(SeqCst);
        // The key read again after its count: if the entry changed hands meanwhile (it was
        // free, count 0, and a torn read of its old and new keys may even have matched),
        // the count read is not this key's.
        if slots[i].key() == key { n as usize } else { 0 }
    }

    /// The master clears the table of worker `id`, which is gone, before the id is given
    /// to another worker: its connections no longer count. Its pages go back to the
    /// kernel; readers racing with this see each entry as it was or as zero.
    pub(crate) fn clear(&self, id: u32) {
        let Some(index) = self.base(id) else { return };
        let entry = std::mem::size_of::<Entry>();
        if let Err(e) = sys::zero_shared(self.memfd.as_fd(), index * entry, (self.capacity + 1) * entry) {
            // Not expected of a memfd; the stores below clear it all the same, only
            // without giving its pages back.
            tracing::debug!("punching the per-address table of worker {id}: {e}");
            for e in &self.entries[index..index + 1 + self.capacity] {
                e.count.store(0, SeqCst);
                e.set_key(0);
            }
        }
    }

    /// The owner rebuilds its table from its live entries (see the module documentation).
    fn compact(&self, head: &Entry, slots: &[Entry]) {
        let live: Vec<(u128, u32)> = slots
            .iter()
            .filter_map(|e| {
                let n = e.count.load(SeqCst);
                (n > 0).then(|| (e.key(), n))
            })
            .collect();
        for e in slots {
            e.count.store(0, SeqCst);
            e.set_key(0);
        }
        head.key[0].store(live.len() as u64, SeqCst);
        for (key, n) in live {
            if let Place::Unused(i) = self.place(slots, key) {
                slots[i].set_key(key);
                slots[i].count.store(n, SeqCst);
            }
        }
    }

    /// How many entries of worker `id`'s table hold a key.
    #[cfg(test)]
    fn used(&self, id: u32) -> usize {
        self.table(id)
            .map_or(0, |(head, _)| head.key[0].load(SeqCst) as usize)
    }
}

#[cfg(test)]
impl PeerCounts {
    /// Worker `id` admits a connection from `ip` under the per-address cap `limit`: counts
    /// it, then sums the address over all workers; over the limit, uncounts it. Two workers
    /// admitting the same address at once each see the other's count (all accesses are
    /// `SeqCst`), so both may refuse, but not both admit past the cap (except during a
    /// compaction: see the module documentation).
    pub(crate) fn admit(&self, id: u32, ip: IpAddr, limit: usize) -> Admission {
        if !self.add(id, ip) {
            return Admission::NoRoom;
        }
        if self.total(ip) > limit {
            self.remove(id, ip);
            return Admission::OverLimit;
        }
        Admission::Admitted
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;
    use std::sync::atomic::AtomicBool;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn counts_from_two_workers_sum() {
        let p = PeerCounts::new(4, 100).unwrap();
        let a = ip("192.0.2.1");
        assert_eq!(p.total(a), 0);
        assert!(p.add(1, a) && p.add(1, a) && p.add(3, a));
        assert!(p.add(3, ip("192.0.2.2")));
        assert_eq!(p.total(a), 3);
        assert_eq!(p.total(ip("192.0.2.2")), 1);
        assert_eq!(p.total(ip("192.0.2.3")), 0);
        assert_eq!(
            p.total(ip("::ffff:192.0.2.1")),
            3,
            "one client, IPv4 or IPv4-mapped"
        );
        assert!(p.remove(1, a));
        assert_eq!(p.total(a), 2);
        assert!(!p.remove(2, a), "worker 2 had none");
        assert!(!p.remove(1, ip("198.51.100.1")));
        assert_eq!(p.total(a), 2);
        // `::`, whose key would be "never used", counts too.
        assert!(p.add(2, ip("::")) && p.add(4, ip("::")));
        assert_eq!(p.total(ip("::")), 2);
        assert!(p.remove(2, ip("::")) && !p.remove(2, ip("::")));
        assert_eq!(p.total(ip("::")), 1);
        assert!(!p.add(0, a) && !p.add(5, a), "no such worker");
    }

    #[test]
    fn clear_drops_one_workers_counts() {
        let p = PeerCounts::new(3, 1000).unwrap();
        let (a, b) = (ip("2001:db8::1"), ip("203.0.113.9"));
        for _ in 0..5 {
            assert!(p.add(2, a));
        }
        assert!(p.add(2, b) && p.add(2, ip("::")));
        assert!(p.add(1, a) && p.add(3, b));
        assert_eq!((p.total(a), p.total(b)), (6, 2));
        p.clear(2);
        assert_eq!((p.total(a), p.total(b), p.total(ip("::"))), (1, 1, 0));
        assert_eq!(p.used(2), 0);
        // The id's next worker starts from an empty table, which works as new.
        assert!(p.add(2, b) && p.remove(2, b) && !p.remove(2, a));
        assert_eq!((p.total(a), p.total(b)), (1, 1));
    }

    #[test]
    fn an_entry_is_reused_after_remove() {
        let p = PeerCounts::new(1, 8).unwrap();
        assert!(p.add(1, ip("192.0.2.1")));
        assert_eq!(p.used(1), 1);
        assert!(p.remove(1, ip("192.0.2.1")));
        assert_eq!(p.total(ip("192.0.2.1")), 0);
        // The same address comes back to its entry; another takes a free entry on its way.
        assert!(p.add(1, ip("192.0.2.1")));
        assert_eq!(p.used(1), 1);
        assert!(p.remove(1, ip("192.0.2.1")));
        let mut added = 0;
        for i in 0..200u32 {
            let other = IpAddr::V6(Ipv6Addr::from_bits(0x2001_0db8 << 96 | u128::from(i)));
            assert!(p.add(1, other));
            assert!(p.remove(1, other));
            added += 1;
        }
        assert_eq!(added, 200);
        assert!(
            p.used(1) <= 2,
            "one address at a time reuses the free entries: {} used",
            p.used(1)
        );
    }

    #[test]
    fn a_full_table_compacts() {
        // 8 connections: 16 entries. Addresses come and go, at most 8 at a time, each one
        // new: stale keys fill the table, which the owner compacts.
        let p = PeerCounts::new(2, 8).unwrap();
        assert_eq!(p.capacity, 16);
        let addr = |i: u32| IpAddr::V4(std::net::Ipv4Addr::from_bits(0xc000_0200 + i));
        let stay = ip("198.51.100.7");
        assert!(p.add(1, stay) && p.add(1, stay) && p.add(2, stay));
        for i in 0..5000u32 {
            assert!(p.add(1, addr(i)), "address {i} counted");
            if i >= 6 {
                assert!(p.remove(1, addr(i - 6)));
            }
            assert!(p.used(1) <= 12, "{} of 16 entries used", p.used(1));
            assert_eq!(p.total(stay), 3, "live counts survive compaction");
        }
        for i in 4994..5000u32 {
            assert_eq!(p.total(addr(i)), 1);
        }
        assert_eq!(p.total(addr(10)), 0);
        // 16 live addresses: full, and says so.
        let q = PeerCounts::new(1, 8).unwrap();
        for i in 0..16u32 {
            assert!(q.add(1, addr(i)));
        }
        assert!(!q.add(1, addr(99)), "no room");
        assert!(q.add(1, addr(3)), "a counted address still has its entry");
        assert_eq!(q.admit(1, addr(100), 10), Admission::NoRoom);
    }

    #[test]
    fn admission_respects_the_cap_across_workers() {
        let p = PeerCounts::new(2, 100).unwrap();
        let a = ip("192.0.2.50");
        assert_eq!(p.admit(1, a, 2), Admission::Admitted);
        assert_eq!(p.admit(2, a, 2), Admission::Admitted);
        assert_eq!(p.admit(1, a, 2), Admission::OverLimit);
        assert_eq!(p.admit(2, a, 2), Admission::OverLimit);
        assert_eq!(p.total(a), 2, "a refusal is not counted");
        assert!(p.remove(2, a));
        assert_eq!(p.admit(1, a, 2), Admission::Admitted);
    }

    #[test]
    fn a_second_mapping_from_the_memfd_sees_the_same_counts() {
        // As a re-executed worker would (`--exec-workers`).
        let p = PeerCounts::new(2, 50).unwrap();
        let fd = nix::unistd::dup(p.memfd.as_fd()).unwrap();
        let q = PeerCounts::adopt(fd).unwrap();
        assert_eq!((q.workers, q.capacity), (2, 128));
        assert!(q.add(2, ip("192.0.2.8")));
        assert!(p.add(1, ip("192.0.2.8")));
        assert_eq!((p.total(ip("192.0.2.8")), q.total(ip("192.0.2.8"))), (2, 2));
        p.clear(2);
        assert_eq!(q.total(ip("192.0.2.8")), 1);
        let (_, other_fd) = sys::map_shared_slice::<Entry>(7).unwrap();
        assert!(PeerCounts::adopt(other_fd).is_err(), "not a table's layout");
    }

    #[test]
    fn a_racing_reader_never_reports_more_than_was_added() {
        // The owner churns IPv6 addresses whose two halves are equal, (i, i), ten live at
        // a time, forcing reuse and compaction; a reader asks for those near the owner's,
        // at most 1 each, and for mixed ones, (i, j), never added, which a torn read of an
        // entry changing hands could match.
        let p = PeerCounts::new(2, 16).unwrap();
        let addr = |hi: u64, lo: u64| IpAddr::V6(Ipv6Addr::from_bits(u128::from(hi) << 64 | u128::from(lo)));
        let steady = ip("192.0.2.200");
        assert!(p.add(2, steady) && p.add(2, steady));
        let current = AtomicU64::new(1);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let owner = s.spawn(|| {
                let start = std::time::Instant::now();
                let mut i = 1u64;
                while start.elapsed() < std::time::Duration::from_millis(500) {
                    assert!(p.add(1, addr(i, i)));
                    if i > 10 {
                        assert!(p.remove(1, addr(i - 10, i - 10)));
                    }
                    i += 1;
                    current.store(i, SeqCst);
                }
                stop.store(true, SeqCst);
                i
            });
            let mut looks = 0u64;
            while !stop.load(SeqCst) {
                let now = current.load(SeqCst);
                for i in now.saturating_sub(20).max(1)..now + 2 {
                    let j = i + 1;
                    assert!(p.total(addr(i, i)) <= 1);
                    assert_eq!(p.total(addr(i, j)), 0, "({i}, {j}) was never added");
                    assert_eq!(p.total(addr(j, i)), 0, "({j}, {i}) was never added");
                    assert!(p.total(steady) <= 2);
                }
                looks += 1;
            }
            let added = owner.join().unwrap();
            assert!(added > 100 && looks > 0, "{added} addresses, {looks} looks");
        });
        assert_eq!(p.total(steady), 2);
    }
}

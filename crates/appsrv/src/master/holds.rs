//! Telling the operator when slow or idle clients hold the pool (issue 14).
//!
//! A blocking worker serves one connection at a time, so a few hundred clients that open a
//! connection and then send slowly (a slowloris) or nothing (an idle flood) take every
//! worker for as long as the timeouts allow: with the defaults, tens of minutes. The
//! per-address cap (`--max-conns-per-ip`) is the defence when they come from a few
//! addresses, but nothing told the operator so. The master now watches the scoreboard:
//! when at least [`HELD_SHARE`] of the ready workers have been held [`HELD_FOR`] or longer
//! in the reading state (waiting for a request, its rest, or the next one on a keep-alive
//! connection; for `handle_client`, blocked reading from the client) *and* at most
//! [`FEW_ADDRESSES`] client addresses hold half of those, it logs one warning for the
//! episode, naming the addresses and their counts, and `status` shows it.
//!
//! "Held" is read from counters, at no cost to the workers: a worker seen reading whose
//! connection and request counters have not moved since a sample at least [`HELD_FOR`]
//! ago has served nothing in that time.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

pub(crate) use crate::control::status::{HELD_FOR, Held};
use crate::scoreboard::{SlotView, State};

/// The share of ready workers that must be held (75 %), as numerator and denominator.
pub(crate) const HELD_SHARE: (usize, usize) = (3, 4);
/// At most this many addresses hold half of the held workers for the warning.
pub(crate) const FEW_ADDRESSES: usize = 3;
/// How often the master looks.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What the master remembers of each worker between samples.
#[derive(Debug, Default)]
pub(crate) struct HoldWatch {
    /// Slot id → (pid, connections, requests, first seen with these counters).
    seen: HashMap<u32, (u32, u64, u64, Instant)>,
    next: Option<Instant>,
    /// The episode in progress.
    episode: Option<Held>,
}

impl HoldWatch {
    /// Whether a look is due at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.next.is_none_or(|t| now >= t)
    }

    /// When the next look is due.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.next
    }

    /// The episode in progress, for `status`.
    pub(crate) fn episode(&self) -> Option<&Held> {
        self.episode.as_ref()
    }

    /// Looks at the ready workers' slots; returns the change of episode to log: `Some(Some)`
    /// when one starts, `Some(None)` when it ends.
    pub(crate) fn observe<'a>(
        &mut self,
        now: Instant,
        ready: impl Iterator<Item = (u32, &'a SlotView)>,
    ) -> Option<Option<Held>> {
        self.next = Some(now + CHECK_INTERVAL);
        let mut workers = 0;
        let mut held = 0;
        let mut by_ip: HashMap<IpAddr, usize> = HashMap::new();
        let mut live = HashMap::new();
        // An event worker (`--io event`) holds thousands of connections, and a slow client
        // holds none of its capacity but one connection: its slot's state and client say
        // nothing of the kind (the client is that of its last handler call). Its slow
        // clients are bounded by the timeouts and the per-address cap.
        for (id, v) in ready.filter(|(_, v)| v.event.is_none()) {
            workers += 1;
            let key = (v.pid, v.connections, v.requests);
            let since = match self.seen.get(&id) {
                Some(&(pid, c, r, since)) if (pid, c, r) == key => since,
                _ => now,
            };
            live.insert(id, (key.0, key.1, key.2, since));
            if v.state == State::Reading && now.duration_since(since) >= HELD_FOR {
                held += 1;
                if let Some(ip) = v.peer.as_ref().and_then(|p| p.ip()) {
                    *by_ip.entry(ip).or_default() += 1;
                }
            }
        }
        self.seen = live;
        let mut addresses: Vec<(IpAddr, usize)> = by_ip.into_iter().collect();
        addresses.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        addresses.truncate(FEW_ADDRESSES);
        let few: usize = addresses.iter().map(|(_, n)| n).sum();
        let now_held = (workers > 0 && held * HELD_SHARE.1 >= workers * HELD_SHARE.0 && few * 2 >= held)
            .then_some(Held {
                workers,
                held,
                addresses,
            });
        let change = match (&self.episode, &now_held) {
            (None, Some(h)) => Some(Some(h.clone())),
            (Some(_), None) => Some(None),
            _ => None,
        };
        self.episode = now_held;
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::listener::Addr;

    fn view(pid: u32, state: State, peer: &str, requests: u64) -> SlotView {
        SlotView {
            pid,
            generation: 0,
            state,
            connections: 1,
            requests,
            bytes_in: 0,
            bytes_out: 0,
            age: Duration::ZERO,
            current: None,
            idle_for: None,
            peer: Some(Addr::Inet(format!("{peer}:1234").parse().unwrap())),
            head: Vec::new(),
            durations: Default::default(),
            duration_sum: Duration::ZERO,
            denied: 0,
            refused: 0,
            tls_failed: 0,
            errors: 0,
            event: None,
            slow_calls: 0,
            datagrams: Default::default(),
        }
    }

    fn each(p: &[SlotView]) -> Vec<(u32, &SlotView)> {
        p.iter().enumerate().map(|(i, v)| (i as u32 + 1, v)).collect()
    }

    #[test]
    fn three_of_four_workers_held_by_one_address_start_one_episode() {
        let t0 = Instant::now();
        let pool = [
            view(1, State::Reading, "192.0.2.7", 0),
            view(2, State::Reading, "192.0.2.7", 0),
            view(3, State::Reading, "192.0.2.8", 0),
            view(4, State::Handling, "198.51.100.1", 5),
        ];
        let mut w = HoldWatch::default();
        assert_eq!(w.observe(t0, each(&pool).into_iter()), None, "not held long yet");
        let later = t0 + HELD_FOR;
        let started = w.observe(later, each(&pool).into_iter());
        let held = started.flatten().expect("an episode starts");
        assert_eq!((held.workers, held.held), (4, 3));
        assert_eq!(
            held.addresses,
            vec![
                ("192.0.2.7".parse().unwrap(), 2),
                ("192.0.2.8".parse().unwrap(), 1)
            ]
        );
        assert!(
            held.to_string().contains("192.0.2.7 (2), 192.0.2.8 (1)"),
            "{held}"
        );
        assert_eq!(
            w.observe(later + CHECK_INTERVAL, each(&pool).into_iter()),
            None,
            "once per episode"
        );
        // One of them is served: 2 of 4 held, under 75 %: the episode ends.
        let mut served = pool.clone();
        served[0].requests = 1;
        assert_eq!(
            w.observe(later + 2 * CHECK_INTERVAL, each(&served).into_iter()),
            Some(None)
        );
        assert!(w.episode().is_none());
    }

    #[test]
    fn issue_16_event_workers_are_not_counted_as_held() {
        let t0 = Instant::now();
        let mut pool: Vec<SlotView> = (1..=4).map(|i| view(i, State::Reading, "192.0.2.7", 0)).collect();
        for v in &mut pool {
            v.event = Some(crate::scoreboard::EventView::default());
        }
        let mut w = HoldWatch::default();
        w.observe(t0, each(&pool).into_iter());
        assert_eq!(
            w.observe(t0 + HELD_FOR, each(&pool).into_iter()),
            None,
            "event workers reading from one address for long are not held"
        );
        let mut w = HoldWatch::default();
        let mut mixed = pool[..1].to_vec();
        mixed.push(view(5, State::Reading, "192.0.2.7", 0));
        mixed.push(view(6, State::Reading, "192.0.2.7", 0));
        mixed.push(view(7, State::Reading, "192.0.2.8", 0));
        mixed.push(view(8, State::Handling, "192.0.2.9", 3));
        w.observe(t0, each(&mixed).into_iter());
        let held = w.observe(t0 + HELD_FOR, each(&mixed).into_iter()).flatten();
        assert_eq!(
            held.map(|h| (h.workers, h.held)),
            Some((4, 3)),
            "only the blocking workers count"
        );
    }

    #[test]
    fn busy_or_widely_spread_pools_do_not_warn() {
        let t0 = Instant::now();
        // Requests served between samples: nobody is held.
        let mut w = HoldWatch::default();
        let a: Vec<SlotView> = (0..4).map(|i| view(i, State::Reading, "192.0.2.7", 0)).collect();
        let b: Vec<SlotView> = (0..4).map(|i| view(i, State::Reading, "192.0.2.7", 1)).collect();
        w.observe(t0, a.iter().enumerate().map(|(i, v)| (i as u32, v)));
        assert_eq!(
            w.observe(t0 + HELD_FOR, b.iter().enumerate().map(|(i, v)| (i as u32, v))),
            None
        );
        // Eight workers held by eight addresses: a crowd of slow clients, no cap would help.
        let mut w = HoldWatch::default();
        let spread: Vec<SlotView> = (0..8)
            .map(|i| view(i, State::Reading, &format!("192.0.2.{}", i + 1), 0))
            .collect();
        let each = || spread.iter().enumerate().map(|(i, v)| (i as u32, v));
        w.observe(t0, each());
        assert_eq!(w.observe(t0 + HELD_FOR, each()), None);
    }
}

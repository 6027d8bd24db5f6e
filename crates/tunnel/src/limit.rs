//! Per-source rate limits in a fixed table, for what unauthenticated or unaccountable
//! senders can ask of us: handshakes under load, frames on unknown keys, the adapter's LAN
//! services. Each slot is a GCRA (a token bucket in one number, its "theoretical arrival
//! time"); a source hashes to a slot under a random key, so sources share a slot only by a
//! collision an attacker cannot aim at a victim, and the table never grows.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A fixed table of per-source token buckets; shareable between threads.
#[derive(Debug)]
pub struct RateTable {
    origin: Instant,
    /// Per slot, the theoretical arrival time, microseconds after `origin`.
    tat: Box<[AtomicU64]>,
    hasher: std::hash::RandomState,
    /// Microseconds between admissions at the sustained rate.
    interval: u64,
    /// How far ahead of now a slot's arrival time may run: the burst.
    tolerance: u64,
}

impl RateTable {
    /// `slots` buckets, each admitting `per_sec` a second after a burst of `burst`.
    pub fn new(slots: usize, per_sec: u32, burst: u32) -> Self {
        Self::starting(slots, per_sec, burst, Instant::now())
    }

    /// `slots` buckets, each admitting one every `interval` after a burst of `burst`: for
    /// rates below one a second.
    pub fn every(slots: usize, interval: Duration, burst: u32) -> Self {
        let mut table = Self::new(slots, 1, burst);
        table.interval = u64::try_from(interval.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        table.tolerance = table.interval * u64::from(burst.max(1) - 1);
        table
    }

    /// As [`RateTable::new`], for times from `origin` on (a time before it counts as it):
    /// for a caller that is handed the time, so that the table keeps that caller's clock.
    pub fn starting(slots: usize, per_sec: u32, burst: u32, origin: Instant) -> Self {
        let interval = 1_000_000 / u64::from(per_sec.max(1));
        Self {
            origin,
            tat: (0..slots.max(1)).map(|_| AtomicU64::new(0)).collect(),
            hasher: std::hash::RandomState::new(),
            interval,
            tolerance: interval * u64::from(burst.max(1) - 1),
        }
    }

    /// Whether `source` may be served at `now` (and, if so, one admission is spent).
    pub fn admit(&self, source: impl Hash, now: Instant) -> bool {
        let len = self.tat.len() as u64;
        let slot = &self.tat[usize::try_from(self.hasher.hash_one(source) % len).unwrap_or(0)];
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let now = us(now.saturating_duration_since(self.origin));
        let mut current = slot.load(Ordering::Relaxed);
        loop {
            let tat = current.max(now);
            if tat - now > self.tolerance {
                return false;
            }
            match slot.compare_exchange_weak(
                current,
                tat + self.interval,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }
}

/// The rate-limit key of an IP address: the address for IPv4, its /64 for IPv6 (what one
/// IPv6 host is usually given).
pub fn source_key(ip: std::net::IpAddr) -> u64 {
    match ip {
        std::net::IpAddr::V4(v4) => u64::from(u32::from(v4)),
        std::net::IpAddr::V6(v6) => {
            let o = v6.octets();
            u64::from_be_bytes([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]]) | 1 << 63
        }
    }
}

/// Slots of the kick gate (`Shared::kick_gate`): frames with random indices from spoofed
/// sources make at most this many requests a second, one per slot.
pub const KICK_SLOTS: usize = 64;

/// The gate on what frames on unknown keys can make the control thread do: one request a
/// second per hashed source slot. A flood from many sources can delay a genuine peer's turn by
/// a second or so (its slot is busy), never starve it for longer.
pub fn kick_gate() -> RateTable {
    RateTable::new(KICK_SLOTS, 1, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn a_rate_below_one_a_second_admits_one_an_interval() {
        let t = RateTable::every(1, Duration::from_secs(3), 1);
        let t0 = Instant::now();
        assert!(t.admit(1, t0));
        assert!(!t.admit(1, t0 + Duration::from_millis(2900)));
        assert!(t.admit(1, t0 + Duration::from_millis(3000)));
        assert!(!t.admit(1, t0 + Duration::from_millis(5000)));
    }

    #[test]
    fn a_source_gets_its_burst_then_its_rate() {
        let l = RateTable::new(4096, 20, 5);
        let t0 = Instant::now() + Duration::from_secs(1);
        let a = source_key("192.0.2.1".parse().unwrap());
        let admitted = (0..20).filter(|_| l.admit(a, t0)).count();
        assert_eq!(admitted, 5);
        // Other sources are not held back by the first (but for the odd collision of slots).
        let others = (2..=201u8)
            .filter(|i| l.admit(source_key(IpAddr::from([198, 51, 100, *i])), t0))
            .count();
        assert!(others >= 190, "{others} of 200 other sources admitted");
        // Over a second, about the rate gets through.
        let got = (0..1000)
            .step_by(5)
            .filter(|ms| l.admit(a, t0 + Duration::from_millis(*ms)))
            .count();
        assert!((19..=21).contains(&got), "{got} in a second");
        // One IPv6 /64 is one source.
        let v6 = RateTable::new(4096, 20, 5);
        let admitted = (0..20u16)
            .filter(|i| v6.admit(source_key(IpAddr::from([0xfd00, 0, 0, 1, 0, 0, 0, *i])), t0))
            .count();
        assert_eq!(admitted, 5);
    }

    /// Threads sharing a table spend its admissions exactly once each.
    #[test]
    fn concurrent_admissions_are_counted_once() {
        let l = RateTable::new(1, 1, 1000);
        let t0 = Instant::now() + Duration::from_secs(1);
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..500).filter(|_| l.admit(7u64, t0)).count()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        assert_eq!(admitted, 1000);
    }
}

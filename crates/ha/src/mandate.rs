//! The mandate (docs/protocol.md §5, *The mandate*): until when a box's data plane may speak
//! for the gateway. The pair's thread renews it while the box serves; the data plane reads it
//! for every batch. A lone adapter's has no end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// No end: a lone adapter's mandate.
const UNBOUNDED: u64 = u64::MAX;

/// Until when a box may speak for the gateway, shared by the pair's thread (which renews it)
/// and the data plane (which reads it). One atomic: reading it costs a load.
#[derive(Debug)]
pub struct Mandate {
    /// What `until` counts from.
    base: Instant,
    /// Nanoseconds after `base` until which the mandate holds; [`UNBOUNDED`]: no end.
    until: AtomicU64,
}

impl Mandate {
    /// A mandate with no end (a lone adapter's, or a pair's box until its thread renews it),
    /// made at `now`.
    pub const fn unbounded(now: Instant) -> Self {
        Self {
            base: now,
            until: AtomicU64::new(UNBOUNDED),
        }
    }

    /// Makes it hold until `until` (and no longer: a renewal may shorten it).
    pub fn renew(&self, until: Instant) {
        let nanos = u64::try_from(until.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(UNBOUNDED - 1);
        self.until
            .store(nanos.min(UNBOUNDED - 1), Ordering::Release);
    }

    /// Whether it holds at `now`.
    pub fn holds(&self, now: Instant) -> bool {
        let until = self.until.load(Ordering::Acquire);
        until == UNBOUNDED || duration_nanos(now.saturating_duration_since(self.base)) < until
    }
}

/// When the pair's thread renews the mandate (docs/protocol.md §5, *The mandate*): at the
/// end of each of its rounds that leaves the box serving, but, after the thread was held up
/// (a round began more than `dead` after the last one ended: a frozen process, a stalled
/// machine), not for `dead`: time enough to read what the other box said meanwhile and to
/// hear its answer to a fresh challenge, and stand down if it serves now. (Reading the
/// pair's socket empty is no sign: frames on the pair's Ethertype from anyone would delay
/// it.)
#[derive(Debug, Clone, Default)]
pub struct Renewal {
    /// When the last round ended.
    last: Option<Instant>,
    /// Since when the thread catches up after being held up.
    catching_up: Option<Instant>,
}

impl Renewal {
    /// A round that began at `began` and ended at `ended`, leaving the box `serving` (active,
    /// not standing down): until when the mandate holds now, if it is renewed.
    pub fn round(&mut self, began: Instant, ended: Instant, serving: bool) -> Option<Instant> {
        let dead = crate::pair::DEAD;
        if self
            .last
            .is_some_and(|l| began.saturating_duration_since(l) > dead)
        {
            self.catching_up = Some(began);
        }
        self.last = Some(ended);
        if self
            .catching_up
            .is_some_and(|since| ended.saturating_duration_since(since) >= dead)
        {
            self.catching_up = None;
        }
        (serving && self.catching_up.is_none()).then(|| ended + dead)
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(UNBOUNDED)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds every 10 ms renew to their end + `dead`; a round that began 2 s after the last
    /// (a freeze) renews nothing, nor do the rounds after it until `dead` has passed since it
    /// began; a box not serving is never renewed.
    #[test]
    fn a_held_up_thread_renews_nothing_for_dead() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut r = Renewal::default();
        for i in 0..10 {
            let began = t0 + ms(10 * i);
            assert_eq!(r.round(began, began + ms(1), true), Some(began + ms(301)));
        }
        assert_eq!(r.round(t0 + ms(100), t0 + ms(101), false), None);
        // Held up for 2 s.
        let back = t0 + ms(2101);
        for i in 0..30 {
            let began = back + ms(10 * i);
            assert_eq!(r.round(began, began + ms(1), true), None, "round {i}");
        }
        let began = back + ms(300);
        assert_eq!(r.round(began, began + ms(1), true), Some(began + ms(301)));
        // A hold-up of exactly `dead` is none.
        let began = began + ms(301);
        assert!(r.round(began, began + ms(1), true).is_some());
    }

    #[test]
    fn a_mandate_holds_until_its_end_and_a_lone_ones_always() {
        let now = Instant::now();
        let lone = Mandate::unbounded(now);
        assert!(lone.holds(now + Duration::from_secs(365 * 24 * 3600)));
        let m = Mandate::unbounded(now);
        m.renew(now + Duration::from_millis(300));
        assert!(m.holds(now));
        assert!(m.holds(now + Duration::from_millis(299)));
        assert!(!m.holds(now + Duration::from_millis(300)));
        // A renewal moves the end either way.
        m.renew(now);
        assert!(!m.holds(now));
        m.renew(now + Duration::from_secs(1));
        assert!(m.holds(now + Duration::from_millis(999)));
        // An end before its base never holds.
        m.renew(now.checked_sub(Duration::from_secs(1)).unwrap_or(now));
        assert!(!m.holds(now + Duration::from_millis(1)));
    }
}

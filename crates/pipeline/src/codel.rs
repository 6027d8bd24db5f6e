//! CoDel (RFC 8289) on the bulk packets entering a pipeline: when the time packets waited
//! before the pipeline read them (the kernel's backlog and socket queue, [`crate::Wait::Socket`])
//! stays above a target for a whole interval, a standing queue has formed; dropping a bulk
//! packet then tells its TCP sender to slow down, and drops come closer together (the
//! interval over the square root of the drops so far) until the wait falls below the target.
//! A tail drop at a full socket, which is what happens without it, tells the sender only once
//! the queue is as long as the buffer, and loses bursts of packets at once.
//!
//! Sans-IO: the caller hands in each bulk packet's wait and the time; packets of sparse flows
//! never reach it (they leave by the express lane, [`crate::Sequencer::push_flow`]).
//!
//! One difference from the RFC: it does not know the queue's length in bytes, so it has no
//! "less than a packet queued" exemption; that exemption matters on links so slow that one
//! packet takes longer than the target to send, not at a gateway's socket.

use std::time::{Duration, Instant};

/// The drop law's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aqm {
    /// The standing wait tolerated (RFC 8289: 5 ms on the Internet).
    pub target: Duration,
    /// How long the wait must stay above `target` before the first drop, and the spacing of
    /// the first drops (RFC 8289: 100 ms, a worst-case round trip).
    pub interval: Duration,
}

impl Default for Aqm {
    fn default() -> Self {
        Self {
            target: Duration::from_millis(5),
            interval: Duration::from_millis(100),
        }
    }
}

/// CoDel's state for one queue.
#[derive(Debug, Clone)]
pub(crate) struct Codel {
    aqm: Aqm,
    /// When the wait, above target since, will have been so for an interval.
    first_above: Option<Instant>,
    /// In the dropping state: when the next drop is due.
    drop_next: Instant,
    dropping: bool,
    /// Drops in this dropping state, and in the last one.
    count: u32,
    last_count: u32,
}

impl Codel {
    pub(crate) fn new(aqm: Aqm, now: Instant) -> Self {
        Self {
            aqm,
            first_above: None,
            drop_next: now,
            dropping: false,
            count: 0,
            last_count: 0,
        }
    }

    /// `interval / sqrt(count)` after `t`.
    fn control_law(&self, t: Instant) -> Instant {
        let count = f64::from(self.count.max(1));
        t + self.aqm.interval.div_f64(count.sqrt())
    }

    /// Whether the wait has been above target for an interval (RFC 8289's `ok_to_drop`).
    fn standing(&mut self, waited: Duration, now: Instant) -> bool {
        if waited < self.aqm.target {
            self.first_above = None;
            return false;
        }
        match self.first_above {
            None => {
                self.first_above = Some(now + self.aqm.interval);
                false
            }
            Some(at) => now >= at,
        }
    }

    /// A bulk packet that waited `waited` leaves the queue at `now`: whether to drop it.
    pub(crate) fn drop(&mut self, waited: Duration, now: Instant) -> bool {
        let standing = self.standing(waited, now);
        if self.dropping {
            if !standing {
                self.dropping = false;
                return false;
            }
            if now >= self.drop_next {
                self.count = self.count.saturating_add(1);
                self.drop_next = self.control_law(self.drop_next);
                return true;
            }
            return false;
        }
        if !standing {
            return false;
        }
        self.dropping = true;
        // Back into dropping soon after leaving it: start near the drop rate that was
        // reached, not from one (RFC 8289 §5.5).
        let delta = self.count.saturating_sub(self.last_count);
        self.count = if delta > 1
            && now.saturating_duration_since(self.drop_next) < 16 * self.aqm.interval
        {
            delta
        } else {
            1
        };
        self.last_count = self.count;
        self.drop_next = self.control_law(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Feeds one packet every `every` for `span`, each having waited `waited`; the times of
    /// the drops, from the start.
    fn run(
        codel: &mut Codel,
        t0: Instant,
        every: Duration,
        span: Duration,
        waited: Duration,
    ) -> Vec<Duration> {
        let mut drops = Vec::new();
        let mut t = t0;
        while t < t0 + span {
            if codel.drop(waited, t) {
                drops.push(t - t0);
            }
            t += every;
        }
        drops
    }

    #[test]
    fn a_wait_below_target_never_drops() {
        let t0 = Instant::now();
        let mut codel = Codel::new(Aqm::default(), t0);
        assert!(run(&mut codel, t0, MS / 10, Duration::from_secs(2), 4 * MS).is_empty());
    }

    #[test]
    fn a_standing_wait_drops_after_an_interval_then_ever_closer() {
        let t0 = Instant::now();
        let mut codel = Codel::new(Aqm::default(), t0);
        let drops = run(&mut codel, t0, MS / 10, Duration::from_secs(1), 6 * MS);
        // The first once the wait stood above target for 100 ms, the next 100 ms later, then
        // 100/sqrt(2), 100/sqrt(3)... apart.
        assert!(drops.len() >= 5, "{drops:?}");
        let first = drops[0];
        assert!(first >= 100 * MS && first <= 101 * MS, "{drops:?}");
        let gaps: Vec<_> = drops.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps[0] >= 99 * MS && gaps[0] <= 101 * MS, "{gaps:?}");
        let second = 100.0 / 2f64.sqrt();
        assert!(
            (gaps[1].as_secs_f64() * 1000.0 - second).abs() < 0.2,
            "{gaps:?}"
        );
        assert!(
            gaps.windows(2).all(|g| g[1] <= g[0]),
            "drops come closer: {gaps:?}"
        );
    }

    #[test]
    fn one_packet_below_target_ends_the_dropping() {
        let t0 = Instant::now();
        let mut codel = Codel::new(Aqm::default(), t0);
        let drops = run(&mut codel, t0, MS, Duration::from_millis(300), 6 * MS);
        assert!(!drops.is_empty());
        let t1 = t0 + Duration::from_millis(300);
        assert!(!codel.drop(MS, t1), "below target");
        // Above again: a fresh interval before the next drop.
        let after = run(&mut codel, t1 + MS, MS, Duration::from_millis(99), 6 * MS);
        assert!(after.is_empty(), "{after:?}");
    }

    #[test]
    fn coming_back_soon_resumes_near_the_rate_reached() {
        let t0 = Instant::now();
        let mut codel = Codel::new(Aqm::default(), t0);
        let first = run(&mut codel, t0, MS, Duration::from_secs(1), 6 * MS);
        let reached = codel.count;
        assert!(reached >= 4, "{first:?}");
        let t1 = t0 + Duration::from_secs(1);
        assert!(!codel.drop(MS, t1));
        // Standing again: after an interval, dropping starts at the drops of the last spell.
        let _ = run(&mut codel, t1 + MS, MS, Duration::from_millis(120), 6 * MS);
        assert!(
            codel.count >= reached - 1,
            "{} against {reached}",
            codel.count
        );
    }
}

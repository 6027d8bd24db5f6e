//! Time as an argument: the monotonic `now` every call takes, and the session timers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Maps the driver's monotonic `now` to wall-clock time, which certificates (validity) and
/// handshake timestamps (replay protection across restarts) need. Built by the driver from
/// `Instant::now()` and `SystemTime::now()`; tests build it from any pair.
///
/// Copies share one mapping. A Raspberry Pi has no real-time clock and may start long before
/// NTP sets the time: the driver calls [`Clock::follow`] now and then with the wall clock it
/// reads, and every copy follows a clock that was set forward. Never backward: handshake
/// timestamps must keep increasing across the change, and certificate checks must not return
/// to a time already left.
#[derive(Debug, Clone)]
pub struct Clock {
    origin: Instant,
    /// Nanoseconds since the unix epoch at `origin`.
    unix_at_origin: Arc<AtomicU64>,
}

/// How far the wall clock must be ahead of the mapping before [`Clock::follow`] moves it:
/// less is NTP's slewing, not a clock being set.
const FOLLOW_TOLERANCE: Duration = Duration::from_secs(1);

impl Clock {
    /// `origin` and `unix_at_origin` name the same moment.
    pub fn new(origin: Instant, unix_at_origin: Duration) -> Self {
        Self {
            origin,
            unix_at_origin: Arc::new(AtomicU64::new(nanos(unix_at_origin))),
        }
    }

    /// The monotonic moment the clock was anchored at: earlier than any `now` the driver passes.
    pub const fn origin(&self) -> Instant {
        self.origin
    }

    /// Wall-clock time at `now`, as a duration since the unix epoch.
    pub fn unix(&self, now: Instant) -> Duration {
        Duration::from_nanos(self.unix_at_origin.load(Ordering::Relaxed))
            + now.saturating_duration_since(self.origin)
    }

    /// The driver read the wall clock `wall` (since the unix epoch) at `now`: if it is more
    /// than a second ahead of this mapping (the clock was set, by NTP say), the mapping moves
    /// forward to it, for every copy. Returns how far it moved; a wall clock behind the
    /// mapping changes nothing.
    pub fn follow(&self, now: Instant, wall: Duration) -> Option<Duration> {
        let at_origin = wall.checked_sub(now.saturating_duration_since(self.origin))?;
        let current = Duration::from_nanos(self.unix_at_origin.load(Ordering::Relaxed));
        if at_origin <= current + FOLLOW_TOLERANCE {
            return None;
        }
        self.unix_at_origin
            .fetch_max(nanos(at_origin), Ordering::Relaxed);
        Some(at_origin - current)
    }

    /// Whole seconds since the unix epoch at `now`, as certificates count them.
    pub fn unix_secs(&self, now: Instant) -> u64 {
        self.unix(now).as_secs()
    }

    /// Nanoseconds since the unix epoch at `now` (saturating in the year 2554).
    pub fn unix_nanos(&self, now: Instant) -> u64 {
        u64::try_from(self.unix(now).as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Nanoseconds of a duration, saturating in the year 2554.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Session timers and limits. The defaults follow WireGuard's, whose reasoning carries over
/// (Donenfeld, NDSS 2017, §6): keys live at most three minutes, are replaced after two. The
/// liveness pair is shorter (2 s and 5 s, not 10 s and 15 s): a path that died under live
/// keys (a NAT on the way rebinding) is noticed in seconds, and a keepalive every 2 s from
/// the receiving side of a one-way flow costs nothing on a gateway's links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The initiator of a session starts a new handshake when sending on keys this old.
    pub rekey_after_time: Duration,
    /// Keys this old are never used again, in either direction.
    pub reject_after_time: Duration,
    /// A new handshake starts once this many counters of the current keys are used.
    pub rekey_after_messages: u64,
    /// The sender refuses to seal with counters at or beyond this; the receiver refuses them.
    pub reject_after_messages: u64,
    /// After receiving data and sending nothing back for this long, send a keepalive, so the
    /// other side learns its packets arrive (passive keepalive).
    pub keepalive_timeout: Duration,
    /// First retry interval of an unanswered handshake; doubles up to `handshake_retry_max`.
    pub handshake_retry_initial: Duration,
    /// Longest interval between handshake retries.
    pub handshake_retry_max: Duration,
    /// Stop retrying after this long without an answer, and report it.
    pub handshake_attempt_time: Duration,
    /// Accept at most one initiation from a peer per this interval (CPU flood guard).
    pub init_min_interval: Duration,
    /// Data sent and nothing authenticated received for this long: the peer may have lost its
    /// keys (restarted), so start a new handshake (WireGuard's `new_handshake` timer). Longer
    /// than `keepalive_timeout`, which is how soon a healthy peer answers data.
    pub reply_timeout: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            rekey_after_time: Duration::from_secs(120),
            reject_after_time: Duration::from_secs(180),
            rekey_after_messages: 1 << 60,
            // WireGuard's REJECT_AFTER_MESSAGES: the replay window's last word is never used.
            reject_after_messages: u64::MAX - (1 << 13),
            keepalive_timeout: Duration::from_secs(2),
            handshake_retry_initial: Duration::from_secs(1),
            handshake_retry_max: Duration::from_secs(8),
            handshake_attempt_time: Duration::from_secs(90),
            init_min_interval: Duration::from_millis(20),
            reply_timeout: Duration::from_secs(5),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_maps_monotonic_to_wall() {
        let t0 = Instant::now();
        let c = Clock::new(t0, Duration::from_secs(1_800_000_000));
        assert_eq!(c.unix_secs(t0 + Duration::from_millis(2500)), 1_800_000_002);
        assert_eq!(
            c.unix_nanos(t0 + Duration::from_nanos(7)),
            1_800_000_000_000_000_007
        );
        // A `now` before the origin does not go back in time.
        assert_eq!(
            c.unix_secs(t0.checked_sub(Duration::from_secs(5)).unwrap_or(t0)),
            1_800_000_000
        );
    }
}

//! The cloud's wall clock, for what the relay and the probe readers stamp.

/// The cloud's clock in milliseconds since the Unix epoch: the time of the cookies it makes.
/// A clock before the epoch reads as 0 (no cookie is then valid: nothing binds).
pub(crate) fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

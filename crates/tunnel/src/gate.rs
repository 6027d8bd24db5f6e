//! What a handshake message must show on the receive thread before it is queued for the
//! handshake thread (docs/protocol.md §2, *MACs and cookies*): the cheap checks in front of
//! the Diffie-Hellman and signature work.
//!
//! ```text
//! handshake message -> mac1 right?            no: drop (drop_handshake_mac)
//!                   -> a response or cookie-reply: queue
//!                   -> an initiation, not under load: queue
//!                   -> under load: mac2 right? no: cookie-reply to its source (cookie_replies_sent)
//!                                  source within its rate? no: drop (drop_handshake_rate)
//!                                  queue
//! ```
//!
//! "Under load" means the initiation queue is at least [`LOAD_THRESHOLD`] deep, and stays
//! meant for [`LOAD_HOLD`] after it last was. Everything here costs a BLAKE2s or two and no
//! state per source beyond a fixed table.

use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use cyphonic_crypto::{CookieSecret, PublicKey};
use cyphonic_session::CookieChecker;
use cyphonic_wire::MessageType;

use crate::counters::{EngineCounters, bump};

/// Initiations waiting before the responder counts as under load: an eighth of the queue.
pub const LOAD_THRESHOLD: usize = crate::handshakes::INITIATIONS / 8;
/// How long load lasts after the queue was last that deep.
pub const LOAD_HOLD: Duration = Duration::from_secs(1);
/// Initiations a second one source may have answered under load (after its burst).
pub const PER_SOURCE_RATE: u32 = 20;
/// Initiations one source may send at once under load.
pub const PER_SOURCE_BURST: u32 = 5;
/// Sources are hashed into this many slots (IPv4 address, IPv6 /64).
pub const SOURCE_SLOTS: usize = 4096;

/// What to do with a handshake message.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Queue it for the handshake thread.
    Queue,
    /// Drop it and send this cookie-reply to its source.
    Reply(Vec<u8>),
    /// Drop it (counted).
    Dropped,
}

/// Per-source rate limits in a fixed table: each slot is a GCRA (a token bucket in one
/// number, its "theoretical arrival time"). Sources share a slot only by a hash collision
/// under a random key, which an attacker cannot aim at a victim.
#[derive(Debug)]
struct SourceLimiter {
    origin: Instant,
    /// Per slot, the theoretical arrival time, in microseconds after `origin`.
    tat: Vec<u64>,
    hasher: std::hash::RandomState,
}

impl SourceLimiter {
    fn new(now: Instant) -> Self {
        Self {
            origin: now,
            tat: vec![0; SOURCE_SLOTS],
            hasher: std::hash::RandomState::new(),
        }
    }

    fn admit(&mut self, ip: IpAddr, now: Instant) -> bool {
        let key: u64 = match ip {
            IpAddr::V4(v4) => u64::from(u32::from(v4)),
            // A /64 is what one IPv6 host is usually given: limit it as one source.
            IpAddr::V6(v6) => {
                let o = v6.octets();
                u64::from_be_bytes([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]]) | 1 << 63
            }
        };
        let slot = usize::try_from(self.hasher.hash_one(key) % SOURCE_SLOTS as u64).unwrap_or(0);
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let interval = 1_000_000 / u64::from(PER_SOURCE_RATE);
        let tolerance = interval * u64::from(PER_SOURCE_BURST - 1);
        let now = us(now.saturating_duration_since(self.origin));
        let tat = self.tat[slot].max(now);
        if tat - now > tolerance {
            return false;
        }
        self.tat[slot] = tat + interval;
        true
    }
}

/// The receive thread's handshake gate. See the module docs.
#[derive(Debug)]
pub struct HandshakeGate {
    checker: CookieChecker,
    limiter: SourceLimiter,
    loaded_until: Option<Instant>,
}

impl HandshakeGate {
    /// A gate for messages to `ours` (our static key), with a fresh cookie secret.
    ///
    /// # Errors
    /// The system's random generator failing.
    pub fn new(ours: &PublicKey, now: Instant) -> std::io::Result<Self> {
        let secret = CookieSecret::random()
            .map_err(|_| std::io::Error::other("the system's random generator failed"))?;
        Ok(Self {
            checker: CookieChecker::new(ours, secret, now),
            limiter: SourceLimiter::new(now),
            loaded_until: None,
        })
    }

    /// Whether initiations must show a cookie now.
    pub fn under_load(&self, now: Instant) -> bool {
        self.loaded_until.is_some_and(|t| now < t)
    }

    /// Judges one handshake message of type `kind` from `from`, with `waiting` initiations
    /// queued ahead of it.
    pub fn admit(
        &mut self,
        counters: &EngineCounters,
        frame: &[u8],
        kind: MessageType,
        from: SocketAddr,
        now: Instant,
        waiting: usize,
    ) -> Admission {
        if matches!(
            kind,
            MessageType::HandshakeInit | MessageType::HandshakeResp
        ) && !self.checker.check_mac1(frame)
        {
            bump(&counters.drop_handshake_mac);
            return Admission::Dropped;
        }
        if kind != MessageType::HandshakeInit {
            return Admission::Queue;
        }
        if waiting >= LOAD_THRESHOLD {
            self.loaded_until = Some(now + LOAD_HOLD);
        }
        if !self.under_load(now) {
            return Admission::Queue;
        }
        if !self.checker.check_mac2(frame, from, now) {
            return match self.checker.reply(frame, from, now) {
                Some(reply) => {
                    bump(&counters.cookie_replies_sent);
                    Admission::Reply(reply)
                }
                None => Admission::Dropped,
            };
        }
        if !self.limiter.admit(from.ip(), now) {
            bump(&counters.drop_handshake_rate);
            return Admission::Dropped;
        }
        Admission::Queue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_gets_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut l = SourceLimiter::new(t0);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let admitted = (0..20).filter(|_| l.admit(a, t0)).count();
        assert_eq!(admitted, PER_SOURCE_BURST as usize);
        // Other sources are not held back by the first (but for the odd collision of slots).
        let others = (2..=201u8)
            .filter(|i| l.admit(IpAddr::from([198, 51, 100, *i]), t0))
            .count();
        assert!(others >= 190, "{others} of 200 other sources admitted");
        // Over a second, about the rate gets through.
        let mut got = 0;
        for ms in (0..1000).step_by(5) {
            if l.admit(a, t0 + Duration::from_millis(ms)) {
                got += 1;
            }
        }
        assert!((19..=21).contains(&got), "{got} in a second");
        // One IPv6 /64 is one source.
        let mut v6 = SourceLimiter::new(t0);
        let admitted = (0..20u16)
            .filter(|i| v6.admit(IpAddr::from([0xfd00, 0, 0, 1, 0, 0, 0, *i]), t0))
            .count();
        assert_eq!(admitted, PER_SOURCE_BURST as usize);
    }
}

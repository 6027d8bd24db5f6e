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
//!                                  a peer's endpoint: queue
//!                                  within the fair share of the budget? no: drop (drop_handshake_budget)
//!                                  queue
//! ```
//!
//! "Under load" means the initiation queue is at least [`LOAD_THRESHOLD`] deep, and stays
//! meant for [`LOAD_HOLD`] after it last was. Under load, initiations from addresses that are
//! none of our peers' endpoints share one budget ([`HANDSHAKE_BUDGET`] a second), each source
//! its fair share of it: a rate per source alone let 60 addresses that answer cookie-replies
//! make a gateway do 1,213 handshakes a second (issue 49, finding 4). A peer that comes back
//! from where we know it (restarted, rekeying) is not held to the budget. Everything here
//! costs a BLAKE2s or two and no state per source beyond fixed tables.

use std::hash::BuildHasher as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cyphonic_crypto::{CookieSecret, PublicKey};
use cyphonic_session::CookieChecker;
use cyphonic_wire::MessageType;

use crate::counters::{EngineCounters, bump};
use crate::limit::{RateTable, source_key};

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
/// Initiations a second answered under load from sources that are none of our peers'
/// endpoints, all of them together (a few percent of a Pi 4 core).
pub const HANDSHAKE_BUDGET: u32 = 100;

/// A budget of admissions a second shared fairly among sources: each source may take at most
/// the budget divided by one more than the number of sources that asked in the second
/// before (at least one: room stays for a source new to it), and all of them together at most
/// the budget. Sources are hashed into a fixed table
/// (two sharing a slot share a share).
#[derive(Debug)]
pub struct FairBudget {
    per_sec: u32,
    window: Option<Instant>,
    taken: u32,
    share: u32,
    /// Sources that asked in this second.
    asking: u32,
    counts: Vec<u16>,
    /// Sources are hashed under a random key, so an attacker cannot aim at a victim's slot.
    hasher: std::hash::RandomState,
}

impl FairBudget {
    /// `per_sec` admissions a second among sources hashed into `slots` slots.
    pub fn new(per_sec: u32, slots: usize) -> Self {
        Self {
            per_sec,
            window: None,
            taken: 0,
            share: per_sec,
            asking: 0,
            counts: vec![0; slots.max(1)],
            hasher: std::hash::RandomState::new(),
        }
    }

    /// Whether the source `key` may have one more at `now`.
    pub fn admit(&mut self, key: u64, now: Instant) -> bool {
        if self
            .window
            .is_none_or(|w| now.saturating_duration_since(w) >= Duration::from_secs(1))
        {
            // One share kept for a source that did not ask in the second before.
            self.share = (self.per_sec / (self.asking + 1)).max(1);
            self.window = Some(now);
            self.taken = 0;
            self.asking = 0;
            self.counts.fill(0);
        }
        let slot = usize::try_from(self.hasher.hash_one(key) % self.counts.len() as u64)
            .unwrap_or_default();
        let count = &mut self.counts[slot];
        if *count == 0 {
            self.asking += 1;
        }
        if self.taken >= self.per_sec || u32::from(*count) >= self.share {
            return false;
        }
        *count = count.saturating_add(1);
        self.taken += 1;
        true
    }
}

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

/// The receive thread's handshake gate. See the module docs.
#[derive(Debug)]
pub struct HandshakeGate {
    checker: CookieChecker,
    limiter: RateTable,
    budget: FairBudget,
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
            limiter: RateTable::new(SOURCE_SLOTS, PER_SOURCE_RATE, PER_SOURCE_BURST),
            budget: FairBudget::new(HANDSHAKE_BUDGET, SOURCE_SLOTS),
            loaded_until: None,
        })
    }

    /// Whether initiations must show a cookie now.
    pub fn under_load(&self, now: Instant) -> bool {
        self.loaded_until.is_some_and(|t| now < t)
    }

    /// Judges one handshake message of type `kind` from `from`, with `waiting` initiations
    /// queued ahead of it; `a_peer` says (asked only under load) whether `from` is one of
    /// our peers' endpoints.
    #[expect(
        clippy::too_many_arguments,
        reason = "one message's facts, passed down once"
    )]
    pub fn admit(
        &mut self,
        counters: &EngineCounters,
        frame: &[u8],
        kind: MessageType,
        from: SocketAddr,
        now: Instant,
        waiting: usize,
        a_peer: impl FnOnce(SocketAddr) -> bool,
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
        let source = source_key(from.ip());
        if !self.limiter.admit(source, now) {
            bump(&counters.drop_handshake_rate);
            return Admission::Dropped;
        }
        if !a_peer(from) && !self.budget.admit(source, now) {
            bump(&counters.drop_handshake_budget);
            return Admission::Dropped;
        }
        Admission::Queue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 49, finding 4: 60 sources each within their own rate cannot take more than the
    /// budget between them, each gets its fair share, and a source that comes in the middle
    /// of them gets its share too.
    #[test]
    fn sixty_sources_share_the_budget_and_a_newcomer_gets_its_share() {
        let mut b = FairBudget::new(HANDSHAKE_BUDGET, SOURCE_SLOTS);
        let t = Instant::now();
        let mut admitted = 0u32;
        // Second 0 learns how many ask; seconds 1 and 2 are judged by it.
        for second in 0..3u64 {
            let at = t + Duration::from_secs(second);
            let mut this_second = 0;
            for round in 0..20u32 {
                for source in 0..60u64 {
                    let now = at + Duration::from_millis(u64::from(round) * 40);
                    if b.admit(source, now) {
                        this_second += 1;
                    }
                }
            }
            assert!(
                this_second <= HANDSHAKE_BUDGET,
                "second {second}: {this_second}"
            );
            admitted += this_second;
        }
        assert!(
            admitted > 2 * HANDSHAKE_BUDGET,
            "{admitted}: the budget was not used"
        );
        // A newcomer, late in a second the 60 have been asking in since its start, as fast
        // as they may.
        let at = t + Duration::from_secs(3);
        for _ in 0..10 {
            for source in 0..60u64 {
                b.admit(source, at);
            }
        }
        let late = at + Duration::from_millis(900);
        assert!(b.admit(999, late), "the newcomer got nothing");
        // With ten sources asking, the same.
        let mut b = FairBudget::new(HANDSHAKE_BUDGET, SOURCE_SLOTS);
        for second in 0..2u64 {
            let at = t + Duration::from_secs(second);
            for _ in 0..50 {
                for source in 0..10u64 {
                    b.admit(source, at);
                }
            }
        }
        assert!(
            b.admit(999, t + Duration::from_millis(1900)),
            "the newcomer got nothing"
        );
    }

    #[test]
    fn a_lone_source_may_take_the_whole_budget_and_no_more() {
        let mut b = FairBudget::new(10, 64);
        let t = Instant::now();
        let taken = (0..100).filter(|_| b.admit(7, t)).count();
        assert_eq!(taken, 10, "nobody asked before: the whole budget");
        // It asked alone in the second before: half, the other half for a newcomer.
        let next = t + Duration::from_secs(1);
        assert_eq!((0..100).filter(|_| b.admit(7, next)).count(), 5);
        assert_eq!((0..100).filter(|_| b.admit(8, next)).count(), 5);
    }
}

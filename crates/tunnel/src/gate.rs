//! What a handshake message must show on the receive thread before it is queued for the
//! handshake thread (docs/protocol.md §2, *MACs and cookies*): the cheap checks in front of
//! the Diffie-Hellman and signature work.
//!
//! ```text
//! handshake message -> mac1 right?            no: drop (drop_handshake_mac)
//!                   -> a response or cookie-reply: queue
//!                   -> an initiation, not under load: queue
//!                   -> under load: mac2 right? no: cookie-reply to its source (cookie_replies_sent)
//!                                  a known peer's hint within its rate: known queue (handshake_known_first)
//!                                  source within its rate? no: drop (drop_handshake_rate)
//!                                  a peer's endpoint: known queue
//!                                  within the fair share of the budget? no: drop (drop_handshake_budget)
//!                                  queue
//! ```
//!
//! "Under load" means the initiation queue is at least [`LOAD_THRESHOLD`] deep, and stays
//! meant for [`LOAD_HOLD`] after it last was. Under load, initiations from addresses that are
//! none of our peers' endpoints share one budget ([`HANDSHAKE_BUDGET`] a second), each source
//! its fair share of it: a rate per source alone let 60 addresses that answer cookie-replies
//! make a gateway do 1,213 handshakes a second (issue 49, finding 4). A peer that comes back
//! from where we know it (restarted, rekeying) is not held to the budget, and neither is one
//! whose initiation carries the hint we expect of it (docs/protocol.md §2, *Known peers
//! first*): a member that comes back from a new address while new addresses flood us is let
//! in first, at most [`KNOWN_RATE`] a second per hint. Everything here costs a BLAKE2s or two
//! and no state per source beyond fixed tables.

use std::collections::HashSet;
use std::hash::BuildHasher as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cyphonic_crypto::{CookieSecret, PublicKey};
use cyphonic_session::{CookieChecker, initiation_hint};
use cyphonic_wire::{HINT_LEN, MessageType, Versions};

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
/// Initiations a second one known peer's hint may have answered under load, past the rest.
pub const KNOWN_RATE: u32 = 5;
/// Initiations one known peer's hint may have answered at once under load.
pub const KNOWN_BURST: u32 = 5;
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
        let slot = self.slot(key);
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

    /// The slot `key` is counted in.
    fn slot(&self, key: u64) -> usize {
        usize::try_from(self.hasher.hash_one(key) % self.counts.len() as u64).unwrap_or_default()
    }
}

/// What to do with a handshake message.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Queue it for the handshake thread.
    Queue,
    /// Queue it ahead of the other initiations: under load, a known peer's (by its hint,
    /// or from where we know it), which the flood must not keep waiting or crowd out.
    Known,
    /// Drop it and send this cookie-reply to its source.
    Reply(Vec<u8>),
    /// Drop it (counted).
    Dropped,
}

/// Where our peers are and the hints of their initiations, as the control thread last
/// looked: what the gate asks, under load only, about the peers we know.
#[derive(Debug, Default)]
pub struct KnownPeers {
    /// Their endpoints and relay channels.
    pub endpoints: HashSet<SocketAddr>,
    /// Their hints, for the epochs before, at and after ours.
    pub hints: HashSet<[u8; HINT_LEN]>,
}

/// The receive thread's handshake gate. See the module docs.
#[derive(Debug)]
pub struct HandshakeGate {
    checker: CookieChecker,
    limiter: RateTable,
    known: RateTable,
    budget: FairBudget,
    loaded_until: Option<Instant>,
}

impl HandshakeGate {
    /// A gate for messages to `ours` (our static key) in frame versions `versions`, with a
    /// fresh cookie secret.
    ///
    /// # Errors
    /// The system's random generator failing.
    pub fn new(ours: (&PublicKey, Versions), now: Instant) -> std::io::Result<Self> {
        let secret = CookieSecret::random()
            .map_err(|_| std::io::Error::other("the system's random generator failed"))?;
        Ok(Self {
            checker: CookieChecker::new(ours, secret, now),
            // On the clock the gate is handed, not the one it was made at.
            limiter: RateTable::starting(SOURCE_SLOTS, PER_SOURCE_RATE, PER_SOURCE_BURST, now),
            known: RateTable::starting(SOURCE_SLOTS, KNOWN_RATE, KNOWN_BURST, now),
            budget: FairBudget::new(HANDSHAKE_BUDGET, SOURCE_SLOTS),
            loaded_until: None,
        })
    }

    /// Whether initiations must show a cookie now.
    pub fn under_load(&self, now: Instant) -> bool {
        self.loaded_until.is_some_and(|t| now < t)
    }

    /// Judges one handshake message of type `kind` from `from`, with `waiting` initiations
    /// queued ahead of it; `known` (asked only under load) says whether `from` is one of our
    /// peers' endpoints and whether the initiation's hint is one of theirs.
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
        known: &KnownPeers,
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
        // A peer that shows itself by its hint comes first (zeros are nobody's hint).
        if let Some(hint) = initiation_hint(frame)
            && hint != [0; HINT_LEN]
            && known.hints.contains(&hint)
            && self.known.admit(hint, now)
        {
            bump(&counters.handshake_known_first);
            return Admission::Known;
        }
        let source = source_key(from.ip());
        if !self.limiter.admit(source, now) {
            bump(&counters.drop_handshake_rate);
            return Admission::Dropped;
        }
        if known.endpoints.contains(&from) {
            return Admission::Known;
        }
        if !self.budget.admit(source, now) {
            bump(&counters.drop_handshake_budget);
            return Admission::Dropped;
        }
        Admission::Queue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first key from `from` on that shares no slot with any of `askers`: a source new to
    /// the budget. Slots are hashed under a random key, so a fixed newcomer would share one
    /// with an asker now and then, and rightly get nothing.
    fn newcomer(b: &FairBudget, askers: &[u64], from: u64) -> u64 {
        (from..)
            .find(|&key| askers.iter().all(|&a| b.slot(a) != b.slot(key)))
            .expect("a free slot")
    }

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
        let late_comer = newcomer(&b, &(0..60).collect::<Vec<_>>(), 999);
        assert!(b.admit(late_comer, late), "the newcomer got nothing");
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
        let late_comer = newcomer(&b, &(0..10).collect::<Vec<_>>(), 999);
        assert!(
            b.admit(late_comer, t + Duration::from_millis(1900)),
            "the newcomer got nothing"
        );
    }

    /// An initiation to `ours` from `from`'s point of view: `hint` before mac1, mac2 under
    /// `cookie` when there is one.
    fn initiation(ours: &PublicKey, hint: [u8; HINT_LEN], cookie: Option<&[u8; 16]>) -> Vec<u8> {
        use cyphonic_wire::{Frame, FrameRepr, HANDSHAKE_INIT_MIN, HEADER_LEN, MAC_LEN};
        let mut f = vec![0x5a; HEADER_LEN + HANDSHAKE_INIT_MIN];
        FrameRepr {
            version: cyphonic_wire::VERSION,
            msg_type: MessageType::HandshakeInit,
            flags: 0,
            receiver_index: 9,
            counter: 0,
            body_len: HANDSHAKE_INIT_MIN,
        }
        .emit(&mut Frame::new_unchecked(&mut f[..]));
        let at2 = f.len() - MAC_LEN;
        let at1 = at2 - MAC_LEN;
        f[at1 - HINT_LEN..at1].copy_from_slice(&hint);
        let mac1 = cyphonic_crypto::MacKeys::new(ours).mac1(&f[..at1]);
        f[at1..at2].copy_from_slice(&mac1);
        let mac2 = cookie.map_or([0; MAC_LEN], |c| cyphonic_crypto::cookie::mac(c, &f[..at2]));
        f[at2..].copy_from_slice(&mac2);
        f
    }

    /// The cookie `gate` gives `from` under load (the round of a cookie-reply).
    fn cookie_of(
        gate: &mut HandshakeGate,
        ours: &PublicKey,
        from: SocketAddr,
        now: Instant,
    ) -> [u8; 16] {
        let c = EngineCounters::default();
        let f = initiation(ours, [0; HINT_LEN], None);
        let Admission::Reply(reply) = gate.admit(
            &c,
            &f,
            MessageType::HandshakeInit,
            from,
            now,
            LOAD_THRESHOLD,
            &KnownPeers::default(),
        ) else {
            panic!("no cookie-reply under load");
        };
        let mac1: [u8; 16] = f[f.len() - 32..f.len() - 16].try_into().unwrap();
        cyphonic_crypto::MacKeys::new(ours)
            .open_cookie(&reply[cyphonic_wire::HEADER_LEN..], &mac1)
            .unwrap()
    }

    /// docs/protocol.md §2, *Known peers first*: with the budget spent by 150 new sources
    /// and a source past its own rate, an initiation with a known peer's hint is queued, up
    /// to its own rate, and then goes the way of the rest; an unknown hint, or zeros, never
    /// comes first.
    #[test]
    fn a_known_hint_comes_before_a_spent_budget_and_rate_up_to_its_own_rate() {
        let ours = PublicKey([3; 32]);
        let t = Instant::now();
        let mut gate = HandshakeGate::new((&ours, Versions::OURS), t).unwrap();
        let c = EngineCounters::default();
        let hint = [0x42; HINT_LEN];
        let known = KnownPeers {
            hints: [hint].into_iter().collect(),
            ..KnownPeers::default()
        };
        let admit = |gate: &mut HandshakeGate, f: &[u8], from, now| {
            gate.admit(
                &c,
                f,
                MessageType::HandshakeInit,
                from,
                now,
                LOAD_THRESHOLD,
                &known,
            )
        };
        let mut queued = 0;
        for i in 1..=150u8 {
            let from = SocketAddr::from(([198, 51, 100, i], 4000));
            let cookie = cookie_of(&mut gate, &ours, from, t);
            let mut theirs = [1; HINT_LEN];
            theirs[0] = i;
            let f = initiation(&ours, theirs, Some(&cookie));
            if admit(&mut gate, &f, from, t) == Admission::Queue {
                queued += 1;
            }
        }
        assert_eq!(queued, HANDSHAKE_BUDGET, "the budget is spent");
        // A fresh source with an unknown hint, or none: held to the spent budget.
        let fresh = SocketAddr::from(([203, 0, 113, 9], 5000));
        let cookie = cookie_of(&mut gate, &ours, fresh, t);
        for other in [[0x43; HINT_LEN], [0; HINT_LEN]] {
            let f = initiation(&ours, other, Some(&cookie));
            assert_eq!(admit(&mut gate, &f, fresh, t), Admission::Dropped);
        }
        // The known hint: first, KNOWN_BURST times at once.
        let f = initiation(&ours, hint, Some(&cookie));
        for n in 0..KNOWN_BURST {
            assert_eq!(
                admit(&mut gate, &f, fresh, t),
                Admission::Known,
                "known {n}"
            );
        }
        assert_eq!(
            c.handshake_known_first
                .load(std::sync::atomic::Ordering::Relaxed),
            5
        );
        // Past its rate it is one of the rest (the budget is spent).
        assert_eq!(admit(&mut gate, &f, fresh, t), Admission::Dropped);
        // Its mac2 still counts: without one it gets a cookie-reply like anyone.
        let bare = initiation(&ours, hint, None);
        let later = t + Duration::from_millis(300);
        assert!(matches!(
            admit(&mut gate, &bare, fresh, later),
            Admission::Reply(_)
        ));
        // A fifth of a second later its rate has one more.
        assert_eq!(admit(&mut gate, &f, fresh, later), Admission::Known);
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
        let other = newcomer(&b, &[7], 8);
        assert_eq!((0..100).filter(|_| b.admit(other, next)).count(), 5);
    }
}

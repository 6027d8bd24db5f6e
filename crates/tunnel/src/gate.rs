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
        if !self.limiter.admit(source_key(from.ip()), now) {
            bump(&counters.drop_handshake_rate);
            return Admission::Dropped;
        }
        Admission::Queue
    }
}

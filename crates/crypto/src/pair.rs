//! The keys of an HA pair's messages (docs/protocol.md §5): both adapters of a pair hold the
//! site's one static key, and only a holder of it can speak for the pair.
//!
//! ```text
//! K_pair = BLAKE2s("ha------" || X25519(s, S))     PairKey::new    s, S: the site's key pair
//! K_boot = BLAKE2s("boot----" || K_pair || boot)  PairKey::boot   boot: random, per start
//! tag    = MAC(K_boot, bytes)                     BootKey::tag
//! ```
//!
//! `MAC` is keyed BLAKE2s-128, as in [`crate::cookie`]. A key per start of a box means that
//! a message counter starting at 1 never repeats under one key.

use core::fmt;

use blake2::{Blake2s256, Digest};
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::StaticKeypair;
use crate::cookie::{MAC_LEN, keyed_mac, random_bytes, shared_key, verify};

/// Length of a box's per-start `boot` value.
pub const BOOT_LEN: usize = 16;

const LABEL_PAIR: &[u8] = b"ha------";
const LABEL_BOOT: &[u8] = b"boot----";

/// The pair's key, from the site's static key pair.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct PairKey([u8; 32]);

impl fmt::Debug for PairKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PairKey([derived])")
    }
}

impl PairKey {
    /// The key of the pair that holds `site`; `None` if the key's Diffie-Hellman with itself
    /// is not contributory (a low-order public key: no real key pair has one).
    pub fn new(site: &StaticKeypair) -> Option<Self> {
        shared_key(LABEL_PAIR, site, &site.public()).map(Self)
    }

    /// The key of the messages a box sends in the start identified by `boot`.
    pub fn boot(&self, boot: &[u8; BOOT_LEN]) -> BootKey {
        let mut h = Blake2s256::new();
        Digest::update(&mut h, LABEL_BOOT);
        Digest::update(&mut h, self.0);
        Digest::update(&mut h, boot);
        BootKey(h.finalize().into())
    }
}

/// One start's message key ([`PairKey::boot`]).
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct BootKey([u8; 32]);

impl fmt::Debug for BootKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BootKey([derived])")
    }
}

impl BootKey {
    /// The tag of a message whose bytes before the tag are `bytes`.
    pub fn tag(&self, bytes: &[u8]) -> [u8; MAC_LEN] {
        keyed_mac(&self.0, &[bytes])
    }

    /// Whether `tag` is [`BootKey::tag`] of `bytes`, compared in constant time.
    pub fn verify(&self, bytes: &[u8], tag: &[u8]) -> bool {
        verify(&self.0, bytes, tag)
    }
}

/// A fresh random `boot` value, or a 16-byte challenge.
///
/// # Errors
/// The system's random number generator failed.
pub fn random_16() -> Result<[u8; BOOT_LEN], ring::error::Unspecified> {
    random_bytes()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Two holders of one site key agree on every start's key; another site's key, another
    /// start or other bytes give other tags, and a changed tag does not verify.
    #[test]
    fn holders_of_one_site_key_agree_and_nothing_else_does() {
        let site = StaticKeypair::generate().unwrap();
        let copy = StaticKeypair::from_secret(zeroize::Zeroizing::new(*site.secret()));
        let other = StaticKeypair::generate().unwrap();
        let (k, k2, o) = (
            PairKey::new(&site).unwrap(),
            PairKey::new(&copy).unwrap(),
            PairKey::new(&other).unwrap(),
        );
        let (b1, b2) = ([1u8; BOOT_LEN], [2u8; BOOT_LEN]);
        let msg = b"cyHA heartbeat";
        let tag = k.boot(&b1).tag(msg);
        assert_eq!(tag, k2.boot(&b1).tag(msg));
        assert!(k2.boot(&b1).verify(msg, &tag));
        assert_ne!(tag, k.boot(&b2).tag(msg));
        assert_ne!(tag, o.boot(&b1).tag(msg));
        assert!(!o.boot(&b1).verify(msg, &tag));
        assert!(!k.boot(&b1).verify(b"cyHA heartbeaT", &tag));
        let mut bad = tag;
        bad[15] ^= 1;
        assert!(!k.boot(&b1).verify(msg, &bad));
        assert!(!k.boot(&b1).verify(msg, &tag[..15]));
        assert_ne!(random_16().unwrap(), random_16().unwrap());
    }

    /// Known answer from an independent implementation: RFC 7748 §6.1's Alice key through
    /// CPython's `hashlib` and `cryptography`:
    /// `shared = X25519(alice_priv).exchange(alice_pub)`, `k = blake2s(b"ha------" + shared)`,
    /// `kb = blake2s(b"boot----" + k + bytes(range(16)))`,
    /// `blake2s(b"cyHA", key=kb, digest_size=16)`.
    #[test]
    fn pair_known_answer() {
        use hex_literal::hex;
        let alice = StaticKeypair::from_secret(zeroize::Zeroizing::new(hex!(
            "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"
        )));
        let boot: [u8; BOOT_LEN] = hex!("000102030405060708090a0b0c0d0e0f");
        let tag = PairKey::new(&alice).unwrap().boot(&boot).tag(b"cyHA");
        assert_eq!(tag, hex!("27aa5d806dd614e62f975ab152fe167d"));
    }
}

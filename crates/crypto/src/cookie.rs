//! The cheap checks in front of a handshake: WireGuard's `mac1`, `mac2` and cookies
//! (docs/protocol.md §2, *MACs and cookies*; WireGuard whitepaper §5.4.4 to §5.4.7), on the
//! RustCrypto `blake2` and `chacha20poly1305` crates.
//!
//! ```text
//! mac1   = MAC(BLAKE2s("mac1----" || S_r), bytes)     MacKeys::mac1
//! mac2   = MAC(cookie, bytes)                         mac
//! cookie = MAC(secret, source ip || port)             CookieSecret::cookie
//! sealed = XChaCha20-Poly1305(BLAKE2s("cookie--" || S_r), nonce, aad = mac1, cookie)
//! K      = BLAKE2s("known---" || X25519(s_i, S_r))    KnownKey::new
//! hint   = MAC(K, S_r || epoch)                       KnownKey::hint
//! ```
//!
//! `MAC` is keyed BLAKE2s with a 16-byte output. Which bytes each MAC covers, when a cookie
//! is asked for and how long it lives are the session crate's business; this module only
//! computes.

use core::fmt;
use std::net::SocketAddr;

use blake2::digest::{FixedOutput, KeyInit, Mac, Update};
use blake2::{Blake2s256, Blake2sMac, Digest};
use chacha20poly1305::{AeadInOut, KeyInit as AeadKeyInit, XChaCha20Poly1305};
use ring::rand::SecureRandom;
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::{PublicKey, StaticKeypair};

/// Length of `mac1`, `mac2` and a cookie.
pub const MAC_LEN: usize = 16;
/// Length of a cookie-reply's nonce.
pub const NONCE_LEN: usize = 24;
/// Length of a sealed cookie: nonce, encrypted cookie, tag.
pub const SEALED_LEN: usize = NONCE_LEN + MAC_LEN + 16;

const LABEL_MAC1: &[u8] = b"mac1----";
const LABEL_COOKIE: &[u8] = b"cookie--";
const LABEL_KNOWN: &[u8] = b"known---";

/// How long one hint lasts: its epoch is the unix time in seconds over this.
pub const HINT_EPOCH_SECS: u64 = 120;

/// A cookie: what a responder under load wants to see as the key of `mac2`.
pub type Cookie = [u8; MAC_LEN];

/// Keyed BLAKE2s with a 16-byte output over `parts`, in order.
pub(crate) fn keyed_mac(key: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    // Every key here is 16 or 32 bytes, within BLAKE2s's 32: this cannot fail.
    let Ok(mut mac) = <Blake2sMac<blake2::digest::consts::U16> as KeyInit>::new_from_slice(key)
    else {
        unreachable!("BLAKE2s keys of at most 32 bytes are valid");
    };
    for part in parts {
        Update::update(&mut mac, part);
    }
    mac.finalize_fixed().into()
}

/// Keyed BLAKE2s-128 of `bytes`: `mac2` under a cookie.
pub fn mac(key: &Cookie, bytes: &[u8]) -> [u8; MAC_LEN] {
    keyed_mac(key, &[bytes])
}

/// Whether `tag` is the keyed BLAKE2s-128 of `bytes` under `key`, compared in constant time.
pub fn verify_mac(key: &Cookie, bytes: &[u8], tag: &[u8]) -> bool {
    verify(key, bytes, tag)
}

pub(crate) fn verify(key: &[u8], bytes: &[u8], tag: &[u8]) -> bool {
    let Ok(mut mac) = <Blake2sMac<blake2::digest::consts::U16> as KeyInit>::new_from_slice(key)
    else {
        return false;
    };
    Update::update(&mut mac, bytes);
    mac.verify_slice(tag).is_ok()
}

fn hash(label: &[u8], key: &PublicKey) -> [u8; 32] {
    let mut h = Blake2s256::new();
    Digest::update(&mut h, label);
    Digest::update(&mut h, key.0);
    h.finalize().into()
}

/// The two keys one static public key implies: the key of `mac1` on messages *to* it, and
/// the key that seals cookies *from* it.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct MacKeys {
    mac1: [u8; 32],
    cookie: [u8; 32],
}

impl fmt::Debug for MacKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MacKeys([derived])")
    }
}

impl MacKeys {
    /// The keys of `receiver`'s static key.
    pub fn new(receiver: &PublicKey) -> Self {
        Self {
            mac1: hash(LABEL_MAC1, receiver),
            cookie: hash(LABEL_COOKIE, receiver),
        }
    }

    /// `mac1` over `bytes`.
    pub fn mac1(&self, bytes: &[u8]) -> [u8; MAC_LEN] {
        keyed_mac(&self.mac1, &[bytes])
    }

    /// Whether `tag` is `mac1` over `bytes`, compared in constant time.
    pub fn verify_mac1(&self, bytes: &[u8], tag: &[u8]) -> bool {
        verify(&self.mac1, bytes, tag)
    }

    /// Seals `cookie` for the initiator whose initiation carried `mac1`, under the fresh
    /// random `nonce`: `nonce || ciphertext || tag`.
    pub fn seal_cookie(
        &self,
        cookie: &Cookie,
        nonce: &[u8; NONCE_LEN],
        mac1: &[u8; MAC_LEN],
    ) -> [u8; SEALED_LEN] {
        let aead = <XChaCha20Poly1305 as AeadKeyInit>::new(&self.cookie.into());
        let mut out = [0u8; SEALED_LEN];
        out[..NONCE_LEN].copy_from_slice(nonce);
        let (text, tag_out) = out[NONCE_LEN..].split_at_mut(MAC_LEN);
        text.copy_from_slice(cookie);
        // A 16-byte message is far within XChaCha20-Poly1305's limits: sealing cannot fail.
        if let Ok(tag) = aead.encrypt_inout_detached(&(*nonce).into(), mac1, text.into()) {
            tag_out.copy_from_slice(&tag);
        }
        out
    }

    /// Opens a sealed cookie from this key's owner, for our initiation that carried `mac1`.
    /// `None` when it is not authentic (forged, or for another initiation).
    pub fn open_cookie(&self, sealed: &[u8], mac1: &[u8; MAC_LEN]) -> Option<Cookie> {
        if sealed.len() != SEALED_LEN {
            return None;
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let (text, tag) = rest.split_at(MAC_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().ok()?;
        let tag: [u8; 16] = tag.try_into().ok()?;
        let mut cookie: Cookie = text.try_into().ok()?;
        let aead = <XChaCha20Poly1305 as AeadKeyInit>::new(&self.cookie.into());
        aead.decrypt_inout_detached(&nonce.into(), mac1, (&mut cookie[..]).into(), &tag.into())
            .ok()?;
        Some(cookie)
    }
}

/// What two static keys share without a handshake: the key of the hints an initiator puts
/// in its initiations so that a responder under load knows it before any Diffie-Hellman work
/// of the handshake (docs/protocol.md §2, *Known peers first*). Both ends compute the same
/// key, each from its own private key and the other's public key.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct KnownKey([u8; 32]);

impl fmt::Debug for KnownKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KnownKey([derived])")
    }
}

impl KnownKey {
    /// The key `ours` shares with `theirs`; `None` when their key is of low order (the
    /// X25519 result is not contributory: anyone could compute it).
    pub fn new(ours: &StaticKeypair, theirs: &PublicKey) -> Option<Self> {
        shared_key(LABEL_KNOWN, ours, theirs).map(Self)
    }

    /// The hint of initiations to `receiver` (one of the two keys) in `epoch`.
    pub fn hint(&self, receiver: &PublicKey, epoch: u64) -> [u8; MAC_LEN] {
        keyed_mac(&self.0, &[&receiver.0, &epoch.to_be_bytes()])
    }
}

/// `BLAKE2s(label || X25519(ours, theirs))`: a key two static keys share without a
/// handshake ([`KnownKey`], and [`crate::PairKey`] with a key's own public half). `None`
/// when the X25519 result is not contributory (a low-order public key: anyone could
/// compute it).
pub(crate) fn shared_key(
    label: &[u8],
    ours: &StaticKeypair,
    theirs: &PublicKey,
) -> Option<[u8; 32]> {
    let secret = x25519_dalek::StaticSecret::from(*ours.secret());
    let shared = secret.diffie_hellman(&x25519_dalek::PublicKey::from(theirs.0));
    if !shared.was_contributory() {
        return None;
    }
    let mut h = Blake2s256::new();
    Digest::update(&mut h, label);
    Digest::update(&mut h, shared.as_bytes());
    Some(h.finalize().into())
}

/// The hint epoch of a unix time in seconds.
pub const fn hint_epoch(unix_secs: u64) -> u64 {
    unix_secs / HINT_EPOCH_SECS
}

/// A responder's cookie secret: 32 random bytes; the caller replaces it every two minutes.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct CookieSecret([u8; 32]);

impl fmt::Debug for CookieSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CookieSecret([redacted])")
    }
}

impl CookieSecret {
    /// A fresh secret from the operating system's generator.
    ///
    /// # Errors
    /// The generator failing.
    pub fn random() -> Result<Self, ring::error::Unspecified> {
        let mut secret = [0u8; 32];
        ring::rand::SystemRandom::new().fill(&mut secret)?;
        Ok(Self(secret))
    }

    /// A secret from known bytes, for tests.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The keyed BLAKE2s-128 under this secret of `parts`, in order: a stateless token
    /// that only the holder of the secret can make or check (the cloud's return-routability
    /// cookies, docs/protocol.md §4).
    pub fn tag(&self, parts: &[&[u8]]) -> Cookie {
        keyed_mac(&self.0, parts)
    }

    /// The cookie of a source address: MAC over its IP (4 or 16 bytes) and port.
    pub fn cookie(&self, source: SocketAddr) -> Cookie {
        let port = source.port().to_be_bytes();
        match source.ip() {
            std::net::IpAddr::V4(ip) => keyed_mac(&self.0, &[&ip.octets(), &port]),
            std::net::IpAddr::V6(ip) => keyed_mac(&self.0, &[&ip.octets(), &port]),
        }
    }
}

/// A fresh random cookie-reply nonce.
///
/// # Errors
/// The generator failing.
pub fn random_nonce() -> Result<[u8; NONCE_LEN], ring::error::Unspecified> {
    random_bytes()
}

/// `N` bytes from the system's random number generator.
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N], ring::error::Unspecified> {
    let mut out = [0u8; N];
    ring::rand::SystemRandom::new().fill(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> PublicKey {
        PublicKey([b; 32])
    }

    #[test]
    fn macs_depend_on_key_message_and_label() {
        let a = MacKeys::new(&key(1));
        let b = MacKeys::new(&key(2));
        assert_ne!(a.mac1(b"x"), b.mac1(b"x"));
        assert_ne!(a.mac1(b"x"), a.mac1(b"y"));
        assert!(a.verify_mac1(b"x", &a.mac1(b"x")));
        assert!(!a.verify_mac1(b"x", &b.mac1(b"x")));
        assert!(!a.verify_mac1(b"x", &a.mac1(b"x")[..15]));
        // mac1 and cookie keys differ (labels), and a 16-byte key works for mac2.
        assert_ne!(a.mac1, a.cookie);
        let cookie = [7u8; MAC_LEN];
        assert!(verify_mac(&cookie, b"frame", &mac(&cookie, b"frame")));
        assert!(!verify_mac(
            &[8u8; MAC_LEN],
            b"frame",
            &mac(&cookie, b"frame")
        ));
    }

    /// Known answers from an independent implementation (CPython's `hashlib.blake2s`, which
    /// wraps the BLAKE2 reference code): `blake2s(msg, key=k, digest_size=16)`.
    #[test]
    fn known_answers_from_an_independent_blake2s() {
        use hex_literal::hex;
        // k = blake2s(b"mac1----" + bytes([9] * 32)).digest(); msg b"hello"
        assert_eq!(
            MacKeys::new(&key(9)).mac1(b"hello"),
            hex!("6378d135d40369182ea2e459e11afeb2")
        );
        // key bytes([5] * 32); msg 192.0.2.1 and port 51820, big-endian
        let source: SocketAddr = "192.0.2.1:51820".parse().unwrap();
        assert_eq!(
            CookieSecret::from_bytes([5; 32]).cookie(source),
            hex!("8a80c158e4cc5fcd6d75cb8b3a02e36b")
        );
        // a 16-byte key: bytes([7] * 16); msg b"frame"
        assert_eq!(
            mac(&[7; 16], b"frame"),
            hex!("81d3d32d7c18e6cdab17ae610fd8a1a5")
        );
    }

    #[test]
    fn sealed_cookies_open_only_for_their_initiation_and_responder() {
        let responder = MacKeys::new(&key(3));
        let cookie = [0x42u8; MAC_LEN];
        let mac1 = [1u8; MAC_LEN];
        let nonce = random_nonce().unwrap();
        let sealed = responder.seal_cookie(&cookie, &nonce, &mac1);
        assert_eq!(responder.open_cookie(&sealed, &mac1), Some(cookie));
        assert_eq!(responder.open_cookie(&sealed, &[2u8; MAC_LEN]), None);
        assert_eq!(MacKeys::new(&key(4)).open_cookie(&sealed, &mac1), None);
        let mut bad = sealed;
        bad[30] ^= 1;
        assert_eq!(responder.open_cookie(&bad, &mac1), None);
        assert_eq!(responder.open_cookie(&sealed[..55], &mac1), None);
    }

    /// Both ends derive one key; hints differ by direction, epoch and pair; a low-order
    /// key has none.
    #[test]
    fn known_keys_agree_and_hints_bind_direction_epoch_and_pair() {
        let (a, b, c) = (
            StaticKeypair::generate().unwrap(),
            StaticKeypair::generate().unwrap(),
            StaticKeypair::generate().unwrap(),
        );
        let ab = KnownKey::new(&a, &b.public()).unwrap();
        let ba = KnownKey::new(&b, &a.public()).unwrap();
        assert_eq!(ab.hint(&b.public(), 7), ba.hint(&b.public(), 7));
        assert_ne!(ab.hint(&b.public(), 7), ab.hint(&a.public(), 7));
        assert_ne!(ab.hint(&b.public(), 7), ab.hint(&b.public(), 8));
        let cb = KnownKey::new(&c, &b.public()).unwrap();
        assert_ne!(ab.hint(&b.public(), 7), cb.hint(&b.public(), 7));
        // The identity point and a point of order 8 (RFC 7748's low-order list).
        assert!(KnownKey::new(&a, &PublicKey([0; 32])).is_none());
        let order8 =
            hex_literal::hex!("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800");
        assert!(KnownKey::new(&a, &PublicKey(order8)).is_none());
        assert_eq!(hint_epoch(239), 1);
        assert_eq!(hint_epoch(240), 2);
    }

    /// Known answer from an independent implementation: the X25519 result of RFC 7748 §6.1
    /// (Alice's private key, Bob's public key) through CPython's `hashlib.blake2s`:
    /// `k = blake2s(b"known---" + shared)`, `blake2s(bob_pub + (5).to_bytes(8, "big"),
    /// key=k, digest_size=16)`.
    #[test]
    fn hint_known_answer() {
        use hex_literal::hex;
        let alice = StaticKeypair::from_secret(zeroize::Zeroizing::new(hex!(
            "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"
        )));
        let bob = PublicKey(hex!(
            "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"
        ));
        let k = KnownKey::new(&alice, &bob).unwrap();
        assert_eq!(k.hint(&bob, 5), hex!("b80cfe2114a03a970977fbc3a32ff70e"));
    }

    #[test]
    fn cookies_bind_address_port_and_secret() {
        let s = CookieSecret::from_bytes([5; 32]);
        let a: SocketAddr = "192.0.2.1:51820".parse().unwrap();
        let b: SocketAddr = "192.0.2.1:51821".parse().unwrap();
        let c: SocketAddr = "[fd00::1]:51820".parse().unwrap();
        assert_eq!(s.cookie(a), s.cookie(a));
        assert_ne!(s.cookie(a), s.cookie(b));
        assert_ne!(s.cookie(a), s.cookie(c));
        assert_ne!(s.cookie(a), CookieSecret::from_bytes([6; 32]).cookie(a));
        assert_ne!(
            CookieSecret::random().unwrap().cookie(a),
            CookieSecret::random().unwrap().cookie(a)
        );
    }
}

//! ChaCha20-Poly1305 (RFC 8439) sealing and opening in place, behind one small trait.
//!
//! Two backends implement [`PacketKey`]: ring's `CHACHA20_POLY1305` and the RustCrypto
//! `chacha20poly1305` crate. [`Backend::default`] names the one the data plane uses; the choice
//! and the measurements behind it are in docs/benchmarks.md. This module is the only place that
//! names a backend type.

use core::fmt;

use chacha20poly1305::{AeadInOut, KeyInit};
use zeroize::{Zeroize, ZeroizeOnDrop};

/// Length of a ChaCha20-Poly1305 key.
pub const KEY_LEN: usize = 32;
/// Length of a ChaCha20-Poly1305 nonce.
pub const NONCE_LEN: usize = 12;
/// Length of a Poly1305 tag.
pub const TAG_LEN: usize = 16;

/// A 256-bit symmetric key, wiped from memory when dropped and never printed.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct Key([u8; KEY_LEN]);

impl Key {
    /// Wraps raw key bytes; the caller should wipe its own copy.
    pub const fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// The raw key bytes, for handing to a backend.
    pub(crate) const fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key([redacted])")
    }
}

/// A 96-bit nonce. Tunnel frames use [`Nonce::from_counter`]: four zero bytes, then the
/// frame's 64-bit counter big-endian (docs/protocol.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nonce([u8; NONCE_LEN]);

impl Nonce {
    /// `0u32 || counter`, big-endian, as in the frame header.
    pub fn from_counter(counter: u64) -> Self {
        let mut n = [0u8; NONCE_LEN];
        n[4..].copy_from_slice(&counter.to_be_bytes());
        Self(n)
    }

    /// An arbitrary nonce, for known-answer tests with foreign vectors.
    pub const fn from_bytes(bytes: [u8; NONCE_LEN]) -> Self {
        Self(bytes)
    }
}

/// Sealing failed. Only possible for inputs far beyond any packet size (RFC 8439 limits one
/// message to 2^38 - 64 bytes) or a buffer without room for the tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The buffer is shorter than the tag it must end with.
    #[error("buffer of {0} bytes has no room for the 16-byte tag")]
    NoRoomForTag(usize),
    /// The backend refused the input (too long).
    #[error("plaintext too long for ChaCha20-Poly1305")]
    TooLong,
}

/// Opening failed: the frame is not authentic under this key and nonce, or is too short.
/// Deliberately carries no detail: which byte was wrong is not the receiver's business.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("authentication failed")]
pub struct OpenError;

/// A key bound to an AEAD implementation: seals and opens in place.
///
/// `Send + Sync` so that all crypto workers share one key by `Arc` without a lock; a key holds
/// no mutable state (the nonce counter lives with the session).
pub trait PacketKey: Send + Sync + fmt::Debug {
    /// Encrypts `in_out` in place and returns the tag.
    ///
    /// # Errors
    /// [`SealError::TooLong`] for inputs beyond the algorithm's limit.
    fn seal_detached(
        &self,
        nonce: Nonce,
        aad: &[u8],
        in_out: &mut [u8],
    ) -> Result<[u8; TAG_LEN], SealError>;

    /// Decrypts `in_out` in place if `tag` authenticates it and `aad`. On failure the buffer
    /// content is unspecified and must not be used.
    ///
    /// # Errors
    /// [`OpenError`] when the tag does not verify.
    fn open_detached(
        &self,
        nonce: Nonce,
        aad: &[u8],
        in_out: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), OpenError>;

    /// Which implementation this key uses.
    fn backend(&self) -> Backend;

    /// Seals `buf[..len - 16]` in place and writes the tag into the last 16 bytes: the layout
    /// of a data frame's body. Nonce from `counter`.
    ///
    /// # Errors
    /// [`SealError::NoRoomForTag`] if `buf` is shorter than the tag.
    fn seal(&self, counter: u64, aad: &[u8], buf: &mut [u8]) -> Result<(), SealError> {
        let split = buf
            .len()
            .checked_sub(TAG_LEN)
            .ok_or(SealError::NoRoomForTag(buf.len()))?;
        let (text, tag_out) = buf.split_at_mut(split);
        let tag = self.seal_detached(Nonce::from_counter(counter), aad, text)?;
        tag_out.copy_from_slice(&tag);
        Ok(())
    }

    /// Opens a body laid out as ciphertext followed by the tag, in place, and returns the
    /// plaintext slice.
    ///
    /// # Errors
    /// [`OpenError`] when the body is shorter than a tag or does not authenticate.
    fn open<'a>(
        &self,
        counter: u64,
        aad: &[u8],
        buf: &'a mut [u8],
    ) -> Result<&'a mut [u8], OpenError> {
        let split = buf.len().checked_sub(TAG_LEN).ok_or(OpenError)?;
        let (text, tag) = buf.split_at_mut(split);
        let tag: &[u8; TAG_LEN] = (&*tag).try_into().map_err(|_| OpenError)?;
        self.open_detached(Nonce::from_counter(counter), aad, text, tag)?;
        Ok(text)
    }
}

/// The AEAD implementations available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// ring's hand-tuned assembly (`ring::aead::CHACHA20_POLY1305`).
    ///
    /// The default: the faster of the two in `benches/` on every packet size (docs/benchmarks.md).
    #[default]
    Ring,
    /// RustCrypto's `chacha20poly1305` (SIMD backends chosen at run time; NEON on aarch64
    /// from chacha20 0.10 on). Its key schedule is zeroized on drop; ring's is not.
    RustCrypto,
}

impl Backend {
    /// Both backends, for tests and benchmarks that compare them.
    pub const ALL: [Self; 2] = [Self::Ring, Self::RustCrypto];

    /// A key for this backend.
    pub fn key(self, key: &Key) -> Box<dyn PacketKey> {
        match self {
            Self::Ring => Box::new(RingKey::new(key)),
            Self::RustCrypto => Box::new(RustCryptoKey::new(key)),
        }
    }

    /// The backend's short name, as used in configuration and reports.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::RustCrypto => "rustcrypto",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl core::str::FromStr for Backend {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| UnknownBackend(s.to_owned()))
    }
}

/// A backend name that is neither `ring` nor `rustcrypto`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown AEAD backend {0:?}: expected \"ring\" or \"rustcrypto\"")]
pub struct UnknownBackend(pub String);

/// ring's ChaCha20-Poly1305.
///
/// ring does not wipe its expanded key on drop; [`Backend::RustCrypto`] does. The raw key we
/// were given is wiped by [`Key`] either way.
pub struct RingKey(ring::aead::LessSafeKey);

impl RingKey {
    /// Binds `key` to ring's implementation.
    pub fn new(key: &Key) -> Self {
        let unbound = ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, key.as_bytes())
            .expect("a 32-byte key is always valid for ChaCha20-Poly1305");
        Self(ring::aead::LessSafeKey::new(unbound))
    }
}

impl fmt::Debug for RingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RingKey([redacted])")
    }
}

impl PacketKey for RingKey {
    fn seal_detached(
        &self,
        nonce: Nonce,
        aad: &[u8],
        in_out: &mut [u8],
    ) -> Result<[u8; TAG_LEN], SealError> {
        let tag = self
            .0
            .seal_in_place_separate_tag(
                ring::aead::Nonce::assume_unique_for_key(nonce.0),
                ring::aead::Aad::from(aad),
                in_out,
            )
            .map_err(|_| SealError::TooLong)?;
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        Ok(out)
    }

    fn open_detached(
        &self,
        nonce: Nonce,
        aad: &[u8],
        in_out: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), OpenError> {
        let tag = ring::aead::Tag::from(*tag);
        self.0
            .open_in_place_separate_tag(
                ring::aead::Nonce::assume_unique_for_key(nonce.0),
                ring::aead::Aad::from(aad),
                tag,
                in_out,
                0..,
            )
            .map(|_| ())
            .map_err(|_| OpenError)
    }

    fn backend(&self) -> Backend {
        Backend::Ring
    }
}

/// RustCrypto's ChaCha20-Poly1305; its key is zeroized on drop.
pub struct RustCryptoKey(chacha20poly1305::ChaCha20Poly1305);

impl RustCryptoKey {
    /// Binds `key` to RustCrypto's implementation.
    pub fn new(key: &Key) -> Self {
        Self(chacha20poly1305::ChaCha20Poly1305::new(
            key.as_bytes().into(),
        ))
    }
}

impl fmt::Debug for RustCryptoKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RustCryptoKey([redacted])")
    }
}

impl PacketKey for RustCryptoKey {
    fn seal_detached(
        &self,
        nonce: Nonce,
        aad: &[u8],
        in_out: &mut [u8],
    ) -> Result<[u8; TAG_LEN], SealError> {
        let tag = self
            .0
            .encrypt_inout_detached(&nonce.0.into(), aad, in_out.into())
            .map_err(|_| SealError::TooLong)?;
        Ok(tag.into())
    }

    fn open_detached(
        &self,
        nonce: Nonce,
        aad: &[u8],
        in_out: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), OpenError> {
        self.0
            .decrypt_inout_detached(&nonce.0.into(), aad, in_out.into(), tag.into())
            .map_err(|_| OpenError)
    }

    fn backend(&self) -> Backend {
        Backend::RustCrypto
    }
}

#[cfg(test)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "test data generators wrap on purpose"
)]
mod tests {
    use super::*;
    use hex_literal::hex;

    const RFC8439_2_8_2_KEY: [u8; 32] =
        hex!("808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f");
    const RFC8439_2_8_2_NONCE: [u8; 12] = hex!("070000004041424344454647");
    const RFC8439_2_8_2_AAD: [u8; 12] = hex!("50515253c0c1c2c3c4c5c6c7");
    const RFC8439_2_8_2_PLAINTEXT: &[u8] = b"Ladies and Gentlemen of the class of '99: \
        If I could offer you only one tip for the future, sunscreen would be it.";
    const RFC8439_2_8_2_CIPHERTEXT: [u8; 114] = hex!(
        "d31a8d34648e60db7b86afbc53ef7ec2a4aded51296e08fea9e2b5a736ee62d6"
        "3dbea45e8ca9671282fafb69da92728b1a71de0a9e060b2905d6a5b67ecd3b36"
        "92ddbd7f2d778b8c9803aee328091b58fab324e4fad675945585808b4831d7bc"
        "3ff4def08e4b7a9de576d26586cec64b6116"
    );
    const RFC8439_2_8_2_TAG: [u8; 16] = hex!("1ae10b594f09e26a7e902ecbd0600691");

    /// RFC 8439 Appendix A.5. Its nonce is `00000000 0102030405060708`, exactly our
    /// `0u32 || counter` layout with counter 0x0102030405060708, so it exercises the
    /// counter-based frame path too.
    const RFC8439_A_5_KEY: [u8; 32] =
        hex!("1c9240a5eb55d38af333888604f6b5f0473917c1402b80099dca5cbc207075c0");
    const RFC8439_A_5_COUNTER: u64 = 0x0102_0304_0506_0708;
    const RFC8439_A_5_AAD: [u8; 12] = hex!("f33388860000000000004e91");
    const RFC8439_A_5_PLAINTEXT: &[u8] = "Internet-Drafts are draft documents valid for a maximum \
        of six months and may be updated, replaced, or obsoleted by other documents at any time. \
        It is inappropriate to use Internet-Drafts as reference material or to cite them other \
        than as /\u{201c}work in progress./\u{201d}"
        .as_bytes();
    const RFC8439_A_5_CIPHERTEXT_AND_TAG: [u8; 281] = hex!(
        "64a0861575861af460f062c79be643bd5e805cfd345cf389f108670ac76c8cb2"
        "4c6cfc18755d43eea09ee94e382d26b0bdb7b73c321b0100d4f03b7f355894cf"
        "332f830e710b97ce98c8a84abd0b948114ad176e008d33bd60f982b1ff37c855"
        "9797a06ef4f0ef61c186324e2b3506383606907b6a7c02b0f9f6157b53c867e4"
        "b9166c767b804d46a59b5216cde7a4e99040c5a40433225ee282a1b0a06c523e"
        "af4534d7f83fa1155b0047718cbc546a0d072b04b3564eea1b422273f548271a"
        "0bb2316053fa76991955ebd63159434ecebb4e466dae5a1073a6727627097a10"
        "49e617d91d361094fa68f0ff77987130305beaba2eda04df997b714d6c6f2c29"
        "a6ad5cb4022b02709b"
        "eead9d67890cbb22392336fea1851f38"
    );

    #[test]
    fn chacha20poly1305_rfc8439_2_8_2() {
        for backend in Backend::ALL {
            let key = backend.key(&Key::from_bytes(RFC8439_2_8_2_KEY));
            let nonce = Nonce::from_bytes(RFC8439_2_8_2_NONCE);
            let mut buf = RFC8439_2_8_2_PLAINTEXT.to_vec();
            let tag = key
                .seal_detached(nonce, &RFC8439_2_8_2_AAD, &mut buf)
                .unwrap();
            assert_eq!(buf, RFC8439_2_8_2_CIPHERTEXT, "{backend} ciphertext");
            assert_eq!(tag, RFC8439_2_8_2_TAG, "{backend} tag");
            key.open_detached(nonce, &RFC8439_2_8_2_AAD, &mut buf, &tag)
                .unwrap();
            assert_eq!(buf, RFC8439_2_8_2_PLAINTEXT, "{backend} plaintext");
        }
    }

    #[test]
    fn chacha20poly1305_rfc8439_a_5_through_the_counter_path() {
        assert_eq!(
            RFC8439_A_5_PLAINTEXT.len() + TAG_LEN,
            RFC8439_A_5_CIPHERTEXT_AND_TAG.len()
        );
        for backend in Backend::ALL {
            let key = backend.key(&Key::from_bytes(RFC8439_A_5_KEY));
            let mut buf = RFC8439_A_5_CIPHERTEXT_AND_TAG.to_vec();
            let plain = key
                .open(RFC8439_A_5_COUNTER, &RFC8439_A_5_AAD, &mut buf)
                .unwrap();
            assert_eq!(plain, RFC8439_A_5_PLAINTEXT, "{backend} open");

            let mut buf = RFC8439_A_5_PLAINTEXT.to_vec();
            buf.extend_from_slice(&[0u8; TAG_LEN]);
            key.seal(RFC8439_A_5_COUNTER, &RFC8439_A_5_AAD, &mut buf)
                .unwrap();
            assert_eq!(buf, RFC8439_A_5_CIPHERTEXT_AND_TAG, "{backend} seal");
        }
    }

    #[test]
    fn tampering_is_refused_by_both_backends() {
        let mut sealed = RFC8439_A_5_CIPHERTEXT_AND_TAG.to_vec();
        for backend in Backend::ALL {
            let key = backend.key(&Key::from_bytes(RFC8439_A_5_KEY));
            // Flip one bit anywhere: ciphertext, tag; or change the AAD or counter.
            for i in [0, 100, sealed.len() - 17, sealed.len() - 1] {
                sealed[i] ^= 0x01;
                let mut buf = sealed.clone();
                assert_eq!(
                    key.open(RFC8439_A_5_COUNTER, &RFC8439_A_5_AAD, &mut buf),
                    Err(OpenError)
                );
                sealed[i] ^= 0x01;
            }
            let mut buf = sealed.clone();
            assert_eq!(
                key.open(RFC8439_A_5_COUNTER + 1, &RFC8439_A_5_AAD, &mut buf),
                Err(OpenError)
            );
            let mut buf = sealed.clone();
            assert_eq!(
                key.open(RFC8439_A_5_COUNTER, &[0u8; 12], &mut buf),
                Err(OpenError)
            );
            assert_eq!(key.open(0, &[], &mut [0u8; 15]), Err(OpenError));
            assert_eq!(
                key.seal(0, &[], &mut [0u8; 15]),
                Err(SealError::NoRoomForTag(15))
            );
        }
    }

    #[test]
    fn backends_agree_on_every_length() {
        let k = Key::from_bytes([7u8; 32]);
        let (ring, rc) = (Backend::Ring.key(&k), Backend::RustCrypto.key(&k));
        for len in 0..600 {
            let mut a: Vec<u8> = (0..len + TAG_LEN).map(|i| i as u8).collect();
            let mut b = a.clone();
            ring.seal(len as u64, b"hdr", &mut a).unwrap();
            rc.seal(len as u64, b"hdr", &mut b).unwrap();
            assert_eq!(a, b, "len {len}");
            assert!(rc.open(len as u64, b"hdr", &mut a).is_ok());
        }
    }

    #[test]
    fn keys_never_print_their_bytes() {
        let k = Key::from_bytes([0xab; 32]);
        for text in [
            format!("{k:?}"),
            format!("{:?}", Backend::Ring.key(&k)),
            format!("{:?}", Backend::RustCrypto.key(&k)),
        ] {
            assert!(!text.contains("ab") && !text.contains("171"), "{text}");
        }
    }

    #[test]
    fn backend_names_parse() {
        for b in Backend::ALL {
            assert_eq!(b.name().parse::<Backend>(), Ok(b));
        }
        assert!("aes".parse::<Backend>().is_err());
    }
}

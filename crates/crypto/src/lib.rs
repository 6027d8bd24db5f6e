//! Cryptography of the cyphonic overlay, on well-kept crates only: nothing here is hand-rolled.
//!
//! - [`aead`]: ChaCha20-Poly1305 seal/open in place behind the [`PacketKey`] trait, with ring
//!   and RustCrypto backends; nonce from the frame counter, AAD the frame header.
//! - [`replay`]: the anti-replay window for received counters ([`ReplayWindow`]).
//! - [`cert`]: the overlay CA (Ed25519 via ring), compact certificates binding an FQDN,
//!   certified vIP blocks, a Noise static key, groups and validity; revocation by fingerprint.
//! - [`cookie`]: the cheap checks in front of a handshake (WireGuard's mac1, mac2, cookies;
//!   the hints by which a responder under load knows its peers).
//! - [`noise`]: Noise static keys and handshake builders (snow, `Noise_IK_25519_ChaChaPoly_BLAKE2s`).
//!
//! Key material is wiped on drop and never appears in `Debug` output. This crate performs no
//! I/O and reads no clock: the time for certificate checks is an argument.
#![forbid(unsafe_code)]

pub mod aead;
pub mod cert;
pub mod cookie;
pub mod noise;
pub mod pair;
mod pem;
pub mod replay;

pub use aead::{Backend, Key, Nonce, OpenError, PacketKey, SealError, TAG_LEN};
pub use cert::{
    CertBody, CertError, CertKind, Certificate, CertificateAuthority, Fingerprint, IssueRequest,
    RevocationList, TrustStore, first_overlap, validate_name,
};
pub use cookie::{Cookie, CookieSecret, KnownKey, MacKeys};
pub use noise::{PublicKey, StaticKeypair};
pub use pair::{BootKey, PairKey};
pub use pem::PemError;
pub use replay::{ReplayError, ReplayWindow};

//! Failure domains of the session layer: handshakes, sending, receiving, local identity.
//! Peer misbehaviour (handshake, receive) is kept apart from local misconfiguration (identity).

use cyphonic_crypto::{CertError, OpenError, ReplayError, SealError};
use cyphonic_wire::MessageType;
use ipnet::IpNet;

/// Why a handshake message was refused. Every variant is counted and logged by the driver;
/// none tears down an established session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// Not a valid frame at all.
    #[error("malformed frame: {0}")]
    Frame(#[from] cyphonic_wire::Error),
    /// A valid frame of another type.
    #[error("expected a {expected} frame, got {got}")]
    WrongType {
        /// The type the call handles.
        expected: MessageType,
        /// The type received.
        got: MessageType,
    },
    /// The Noise message does not decrypt: not addressed to our key, corrupted, or garbage.
    #[error("handshake message does not decrypt (not for our key, corrupted or garbage)")]
    Decrypt,
    /// The decrypted payload is not laid out as docs/protocol.md §2 says.
    #[error("handshake payload malformed: {0}")]
    Payload(&'static str),
    /// The peer's certificate is refused: unknown CA, forged, tampered, expired, revoked.
    #[error("peer certificate refused: {0}")]
    Certificate(#[from] CertError),
    /// The certificate is valid but certifies another Noise key than the one that spoke.
    #[error("peer certificate certifies another key than the one used in the handshake")]
    KeyMismatch,
    /// The certificate names another node than the one expected for this peer.
    #[error("peer certificate names {got:?}, expected {expected:?}")]
    NameMismatch {
        /// The expected FQDN.
        expected: String,
        /// The FQDN in the certificate.
        got: String,
    },
    /// The certificate does not cover a vIP block expected for this peer.
    #[error("peer certificate does not cover vIP block {0}")]
    VipMismatch(IpNet),
    /// An initiation whose timestamp is not newer than the newest accepted: a replay.
    #[error("replayed initiation: timestamp {timestamp} is not after {newest}")]
    Replay {
        /// The initiation's timestamp (unix nanoseconds).
        timestamp: u64,
        /// The newest timestamp accepted from this peer.
        newest: u64,
    },
    /// Initiations arriving faster than [`crate::Timing::init_min_interval`].
    #[error("initiations arrive too fast; this one is ignored")]
    TooFrequent,
    /// An initiation whose payload names another sender index than its header.
    #[error("initiation's header says index {header}, its payload {payload}")]
    IndexMismatch {
        /// The index in the clear header.
        header: u32,
        /// The index in the encrypted payload.
        payload: u32,
    },
    /// A cookie-reply that does not open: forged, or for an initiation we no longer wait on.
    #[error("cookie-reply does not open for our pending initiation")]
    Cookie,
    /// A response for a handshake we have not started (or already finished).
    #[error("no pending handshake has index {0}")]
    UnknownIndex(u32),
    /// We cannot initiate: the peer's static key or endpoint is not known yet.
    #[error("cannot initiate: the peer's {0} is unknown")]
    CannotInitiate(&'static str),
    /// The peer speaks no tunnel version we speak (docs/protocol.md §2, *Versions*): it runs
    /// a release too far from ours.
    #[error("no common tunnel version: it speaks {theirs}, we {ours}")]
    NoCommonVersion {
        /// The versions we speak.
        ours: cyphonic_wire::Versions,
        /// The versions the cloud said the peer speaks.
        theirs: cyphonic_wire::Versions,
    },
    /// snow refused an operation that valid keys never fail; a bug, reported not panicked.
    #[error("noise state error: {0}")]
    Noise(String),
}

impl HandshakeError {
    /// A short, stable name of the reason, for counters and metrics labels: `decrypt`,
    /// `replay`, `cert_expired`, ...
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Frame(_) => "malformed",
            Self::WrongType { .. } => "wrong_type",
            Self::Decrypt => "decrypt",
            Self::Payload(_) => "payload",
            Self::Certificate(e) => match e {
                CertError::UnknownCa => "cert_unknown_ca",
                CertError::BadSignature => "cert_bad_signature",
                CertError::NotYetValid { .. } => "cert_not_yet_valid",
                CertError::Expired { .. } => "cert_expired",
                CertError::Revoked(_) | CertError::CaRevoked(_) => "cert_revoked",
                _ => "cert_invalid",
            },
            Self::KeyMismatch => "key_mismatch",
            Self::NameMismatch { .. } => "name_mismatch",
            Self::VipMismatch(_) => "vip_mismatch",
            Self::Replay { .. } => "replay",
            Self::TooFrequent => "too_frequent",
            Self::UnknownIndex(_) => "unknown_index",
            Self::IndexMismatch { .. } => "index_mismatch",
            Self::Cookie => "cookie",
            Self::CannotInitiate(_) => "cannot_initiate",
            Self::NoCommonVersion { .. } => "no_common_version",
            Self::Noise(_) => "noise",
        }
    }
}

/// Why a packet could not be sealed for a peer now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// No usable keys yet; a handshake has been started (or is pending). Queue and retry on
    /// [`crate::Event::Established`].
    #[error("no session with the peer yet; handshake pending")]
    NoSession,
    /// No usable keys and no way to start a handshake (the peer's key or endpoint is unknown).
    #[error("no session with the peer and no way to start one (unknown key or endpoint)")]
    Unreachable,
    /// The current keys reached their message limit; a new handshake has been started.
    #[error("session message limit reached; rekeying")]
    KeyExhausted,
    /// The caller's buffer cannot hold header, payload and tag.
    #[error("buffer too small: need {needed} bytes")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
    },
    /// The AEAD refused (input too long).
    #[error(transparent)]
    Seal(#[from] SealError),
}

/// Why a received data or keepalive frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// Not a valid frame.
    #[error("malformed frame: {0}")]
    Frame(#[from] cyphonic_wire::Error),
    /// Not a frame of the type expected (data or keepalive; a path frame).
    #[error("unexpected frame type {0}")]
    WrongType(MessageType),
    /// No live session has this index (unknown, expired, or for another peer).
    #[error("no live session has index {0}")]
    UnknownIndex(u32),
    /// The tag does not verify: forged, corrupted, or sealed with other keys.
    #[error(transparent)]
    Auth(#[from] OpenError),
    /// The counter was seen already or lies behind the window.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// A path frame that opened holds no path message the protocol defines.
    #[error("not a path message")]
    PathMessage,
}

/// Our own key, certificate and trust store do not fit together: a local configuration error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The certificate certifies another Noise key than our private key's.
    #[error("our certificate certifies another Noise key than our private key")]
    KeyMismatch,
    /// Our own certificate does not verify under our own trust store.
    #[error("our own certificate does not verify: {0}")]
    Certificate(#[from] CertError),
}

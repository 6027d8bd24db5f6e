//! The tunnel handshake: Noise IK (snow) with certificates in the payloads (docs/protocol.md §2).
//!
//! ```text
//! IK:  <- s                 the initiator knows the responder's static key (its certificate)
//!      ...
//!      -> e, es, s, ss      handshake-init; payload: sender index, timestamp, initiator cert
//!      <- e, ee, se         handshake-resp; payload: sender index, responder cert
//! ```
//! Each frame ends with mac1 and mac2 ([`crate::cookie`]), an init's after its hint; the
//! initiator's index is also in the init's header, in clear, and must equal the one in its
//! payload.
//! After the second message both sides split the chaining key into two transport keys
//! (Noise spec §5.2 `Split()`): the first for initiator-to-responder, the second for the reverse.

use core::fmt;

use cyphonic_crypto::MacKeys;
use cyphonic_crypto::{Certificate, Key, PublicKey, StaticKeypair, TrustStore, noise};
use cyphonic_wire::{
    Frame, FrameRepr, HANDSHAKE_MAX, HEADER_LEN, HINT_LEN, MAC_LEN, MessageType, Versions,
};
use zeroize::Zeroize;

use crate::cookie;
use crate::error::{HandshakeError, IdentityError};

/// Bound into every handshake hash: a message from another protocol or version never verifies.
pub(crate) const PROLOGUE: &[u8] = b"cyphonic tunnel v4";
/// Room for a Noise message's payload: a handshake body but the two MACs, at most.
const NOISE_MAX: usize = HANDSHAKE_MAX - 2 * MAC_LEN;
const INDEX_LEN: usize = 4;
const TIMESTAMP_LEN: usize = 8;

/// Who we are on the overlay: our Noise static key, the certificate binding it to our name and
/// vIP blocks, and the CAs (and revocations) we trust for peers.
pub struct Identity {
    keypair: StaticKeypair,
    cert: Certificate,
    trust: TrustStore,
    /// The tunnel versions we speak ([`Versions::OURS`] but in tests of mixed releases).
    versions: Versions,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.cert.body().name)
            .field("public_key", &self.keypair.public())
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Checks that the parts fit together at unix time `now_secs`: the certificate certifies
    /// this key and verifies under our own trust store (a peer would refuse it otherwise).
    ///
    /// # Errors
    /// [`IdentityError`] naming the mismatch.
    pub fn new(
        keypair: StaticKeypair,
        cert: Certificate,
        trust: TrustStore,
        now_secs: u64,
    ) -> Result<Self, IdentityError> {
        if cert.body().public_key != keypair.public().0 {
            return Err(IdentityError::KeyMismatch);
        }
        trust.verify(&cert, now_secs)?;
        Ok(Self {
            keypair,
            cert,
            trust,
            versions: Versions::OURS,
        })
    }

    /// The same identity speaking the tunnel versions `versions` instead of this release's:
    /// how a test plays a member of another release (docs/protocol.md §2, *Versions*).
    #[must_use]
    pub const fn with_versions(mut self, versions: Versions) -> Self {
        self.versions = versions;
        self
    }

    /// The tunnel versions we speak.
    pub const fn versions(&self) -> Versions {
        self.versions
    }

    /// The same key and certificate, trusting `trust` instead (new revocations, other CAs),
    /// checked as [`Identity::new`] checks.
    ///
    /// # Errors
    /// [`IdentityError`]: our own certificate does not verify under `trust`.
    pub fn with_trust(&self, trust: TrustStore, now_secs: u64) -> Result<Self, IdentityError> {
        let keypair = StaticKeypair::from_secret(zeroize::Zeroizing::new(*self.keypair.secret()));
        Self::new(keypair, self.cert.clone(), trust, now_secs)
            .map(|i| i.with_versions(self.versions))
    }

    /// The same key and trust with `cert` instead (a renewed certificate), checked as
    /// [`Identity::new`] checks.
    ///
    /// # Errors
    /// [`IdentityError`]: `cert` certifies another key or does not verify under our trust.
    pub fn with_certificate(
        &self,
        cert: Certificate,
        now_secs: u64,
    ) -> Result<Self, IdentityError> {
        let keypair = StaticKeypair::from_secret(zeroize::Zeroizing::new(*self.keypair.secret()));
        Self::new(keypair, cert, self.trust.clone(), now_secs)
            .map(|i| i.with_versions(self.versions))
    }

    /// Our certificate.
    pub const fn certificate(&self) -> &Certificate {
        &self.cert
    }

    /// Our Noise static public key.
    pub const fn public_key(&self) -> PublicKey {
        self.keypair.public()
    }

    /// Our Noise static key pair: the control channel to the cloud uses the same identity.
    pub const fn keypair(&self) -> &StaticKeypair {
        &self.keypair
    }

    /// The trust store peers are checked against.
    pub const fn trust(&self) -> &TrustStore {
        &self.trust
    }

    /// The trust store, to apply revocations as they are published.
    pub fn trust_mut(&mut self) -> &mut TrustStore {
        &mut self.trust
    }
}

/// A decrypted, certificate-checked handshake initiation whose peer is not chosen yet.
/// Hand it to that peer's [`crate::Peer::handle_init`].
pub struct IncomingInit {
    pub(crate) state: snow::HandshakeState,
    /// The initiator's Noise static key, proven by the handshake.
    pub remote_static: PublicKey,
    /// The initiator's certificate, verified against our trust store.
    pub cert: Certificate,
    /// The initiator's session index.
    pub sender_index: u32,
    /// The initiator's wall-clock timestamp (unix nanoseconds), for replay protection.
    pub timestamp: u64,
    /// The frame version the initiator chose: the session's, if answered.
    pub version: u8,
}

impl fmt::Debug for IncomingInit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IncomingInit")
            .field("remote_static", &self.remote_static)
            .field("cert", &self.cert)
            .field("sender_index", &self.sender_index)
            .field("timestamp", &self.timestamp)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// The first, device-level step for a handshake-init frame: decrypt it with our static key,
/// learn and verify the initiator's certificate at unix time `now_secs`. The caller then picks
/// the peer by [`IncomingInit::remote_static`] (or creates one) and calls its `handle_init`.
///
/// The frame's MACs are the caller's to check first ([`crate::CookieChecker`]).
///
/// # Errors
/// [`HandshakeError`]: malformed frame, not decryptable, malformed payload, an index in the
/// payload other than the header's, refused certificate, or a certificate for another key
/// than the one that spoke.
pub fn read_init(
    identity: &Identity,
    now_secs: u64,
    frame: &[u8],
) -> Result<IncomingInit, HandshakeError> {
    let (repr, body) = handshake_body(frame, MessageType::HandshakeInit, identity.versions)?;
    let mut state = noise::responder(&identity.keypair, PROLOGUE).map_err(|e| noise_err(&e))?;
    let mut payload = [0u8; NOISE_MAX];
    let len = state
        .read_message(body, &mut payload)
        .map_err(|_| HandshakeError::Decrypt)?;
    let payload = &payload[..len];
    let (index, rest) = split_array::<INDEX_LEN>(payload)?;
    let index = u32::from_be_bytes(index);
    if index != repr.receiver_index {
        return Err(HandshakeError::IndexMismatch {
            header: repr.receiver_index,
            payload: index,
        });
    }
    let (timestamp, cert_bytes) = split_array::<TIMESTAMP_LEN>(rest)?;
    let cert = Certificate::decode(cert_bytes)?;
    identity.trust.verify(&cert, now_secs)?;
    let remote_static: [u8; 32] = state
        .get_remote_static()
        .and_then(|k| k.try_into().ok())
        .ok_or(HandshakeError::Noise(
            "IK message 1 carried no static key".into(),
        ))?;
    if cert.body().public_key != remote_static {
        return Err(HandshakeError::KeyMismatch);
    }
    Ok(IncomingInit {
        state,
        remote_static: PublicKey(remote_static),
        cert,
        sender_index: index,
        timestamp: u64::from_be_bytes(timestamp),
        version: repr.version,
    })
}

/// Starts a handshake towards `remote` in frame version `version`: returns the initiator
/// state and the init frame with `hint` after the Noise message, its MACs still zero (the
/// caller seals them, with a cookie if it has one).
pub(crate) fn write_init(
    identity: &Identity,
    (remote, version): (&PublicKey, u8),
    sender_index: u32,
    timestamp: u64,
    hint: &[u8; HINT_LEN],
) -> Result<(snow::HandshakeState, Vec<u8>), HandshakeError> {
    let mut state =
        noise::initiator(&identity.keypair, remote, PROLOGUE).map_err(|e| noise_err(&e))?;
    let payload = [
        &sender_index.to_be_bytes()[..],
        &timestamp.to_be_bytes(),
        identity.cert.encoded(),
    ]
    .concat();
    let mut frame = write_frame(
        &mut state,
        (MessageType::HandshakeInit, version),
        sender_index,
        &payload,
    )?;
    let at = frame.len() - 2 * MAC_LEN - HINT_LEN;
    frame[at..at + HINT_LEN].copy_from_slice(hint);
    Ok((state, frame))
}

/// Answers an accepted initiation: returns the response frame and (send, receive) keys.
pub(crate) fn write_response(
    identity: &Identity,
    mut init: IncomingInit,
    sender_index: u32,
) -> Result<(Vec<u8>, (Key, Key)), HandshakeError> {
    let payload = [&sender_index.to_be_bytes()[..], identity.cert.encoded()].concat();
    let mut frame = write_frame(
        &mut init.state,
        (MessageType::HandshakeResp, init.version),
        init.sender_index,
        &payload,
    )?;
    cookie::seal_macs(&mut frame, &MacKeys::new(&init.remote_static), None);
    let (i2r, r2i) = split(&mut init.state);
    Ok((frame, (r2i, i2r)))
}

/// What the initiator learns from a valid response.
pub(crate) struct Response {
    pub(crate) sender_index: u32,
    pub(crate) cert: Certificate,
    /// (send, receive).
    pub(crate) keys: (Key, Key),
}

/// Reads the responder's message with the pending initiator state.
/// The response must be in `version`, the initiation's.
pub(crate) fn read_response(
    identity: &Identity,
    state: &mut snow::HandshakeState,
    (remote, version): (&PublicKey, u8),
    now_secs: u64,
    frame: &[u8],
) -> Result<Response, HandshakeError> {
    let (_, body) = handshake_body(
        frame,
        MessageType::HandshakeResp,
        Versions::exactly(version),
    )?;
    let mut payload = [0u8; NOISE_MAX];
    let len = state
        .read_message(body, &mut payload)
        .map_err(|_| HandshakeError::Decrypt)?;
    let (index, cert_bytes) = split_array::<INDEX_LEN>(&payload[..len])?;
    let cert = Certificate::decode(cert_bytes)?;
    identity.trust.verify(&cert, now_secs)?;
    // Noise already proved the responder holds the private key for `remote`; the certificate
    // must be about that key.
    if cert.body().public_key != remote.0 {
        return Err(HandshakeError::KeyMismatch);
    }
    let (i2r, r2i) = split(state);
    Ok(Response {
        sender_index: u32::from_be_bytes(index),
        cert,
        keys: (i2r, r2i),
    })
}

/// The receiver index of a handshake-resp frame of one of `versions`, to find its pending
/// handshake.
pub(crate) fn response_receiver(frame: &[u8], versions: Versions) -> Result<u32, HandshakeError> {
    let view = Frame::new_checked(frame)?;
    let repr = FrameRepr::parse(&view, versions)?;
    if repr.msg_type != MessageType::HandshakeResp {
        return Err(HandshakeError::WrongType {
            expected: MessageType::HandshakeResp,
            got: repr.msg_type,
        });
    }
    Ok(repr.receiver_index)
}

/// The header and the Noise message of a handshake frame (its body without the MACs).
fn handshake_body(
    frame: &[u8],
    expected: MessageType,
    versions: Versions,
) -> Result<(FrameRepr, &[u8]), HandshakeError> {
    let view = Frame::new_checked(frame)?;
    let repr = FrameRepr::parse(&view, versions)?;
    if repr.msg_type != expected {
        return Err(HandshakeError::WrongType {
            expected,
            got: repr.msg_type,
        });
    }
    // The parser checked the body's length: it holds both MACs (and an initiation's hint).
    Ok((repr, &frame[HEADER_LEN..frame.len() - trailer(expected)]))
}

/// What follows the Noise message in a handshake body: an initiation's hint, then the MACs.
const fn trailer(kind: MessageType) -> usize {
    match kind {
        MessageType::HandshakeInit => HINT_LEN + 2 * MAC_LEN,
        _ => 2 * MAC_LEN,
    }
}

pub(crate) fn write_frame(
    state: &mut snow::HandshakeState,
    (msg_type, version): (MessageType, u8),
    receiver_index: u32,
    payload: &[u8],
) -> Result<Vec<u8>, HandshakeError> {
    let mut frame = vec![0u8; HEADER_LEN + HANDSHAKE_MAX];
    let room = HANDSHAKE_MAX - trailer(msg_type);
    let len = state
        .write_message(payload, &mut frame[HEADER_LEN..HEADER_LEN + room])
        .map_err(|e| noise_err(&e))?;
    // The hint and the MACs follow, zero until written and sealed.
    let body_len = len + trailer(msg_type);
    frame.truncate(HEADER_LEN + body_len);
    let repr = FrameRepr {
        version,
        msg_type,
        flags: 0,
        receiver_index,
        counter: 0,
        body_len,
    };
    repr.emit(&mut Frame::new_unchecked(&mut frame[..]));
    Ok(frame)
}

/// Noise `Split()`: (initiator-to-responder, responder-to-initiator) keys.
fn split(state: &mut snow::HandshakeState) -> (Key, Key) {
    let (mut a, mut b) = state.dangerously_get_raw_split();
    let keys = (Key::from_bytes(a), Key::from_bytes(b));
    a.zeroize();
    b.zeroize();
    keys
}

fn split_array<const N: usize>(bytes: &[u8]) -> Result<([u8; N], &[u8]), HandshakeError> {
    let (head, rest) = bytes
        .split_at_checked(N)
        .ok_or(HandshakeError::Payload("truncated payload"))?;
    Ok((
        head.try_into()
            .map_err(|_| HandshakeError::Payload("truncated payload"))?,
        rest,
    ))
}

fn noise_err(e: &snow::Error) -> HandshakeError {
    HandshakeError::Noise(e.to_string())
}

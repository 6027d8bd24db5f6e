//! Endpoint probes and relay binds (docs/protocol.md §4): tunnel frames of type 6 sent from a
//! client's tunnel socket, so that the cloud sees the address a NAT maps that socket to.
//!
//! A probe to NMS names its session by token and carries a counter and a MAC under the
//! session's key (both from the encrypted welcome): it cannot be forged, and a copy replayed
//! from elsewhere is refused. A bind to a relay channel carries the side's token alone.

use cyphonic_crypto::cookie::{MAC_LEN, mac, verify_mac};
use cyphonic_wire::{Frame, FrameRepr, HEADER_LEN, MessageType};

/// Bytes of a probe's (or a bind's) token.
pub const PROBE_TOKEN_LEN: usize = 16;

/// Bytes of the key of a probe's MAC.
pub const PROBE_KEY_LEN: usize = 16;

const COUNTER_LEN: usize = 8;

/// Bytes of a probe's body: token, counter, MAC.
pub const PROBE_BODY_LEN: usize = PROBE_TOKEN_LEN + COUNTER_LEN + MAC_LEN;

/// The bytes a probe's MAC covers: header, token, counter.
const SIGNED_LEN: usize = HEADER_LEN + PROBE_TOKEN_LEN + COUNTER_LEN;

/// A type-6 frame with a body of `body_len` bytes, the body zeroed.
fn endpoint_probe(body_len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; HEADER_LEN + body_len];
    let mut frame = Frame::new_unchecked(&mut buf[..]);
    FrameRepr {
        msg_type: MessageType::EndpointProbe,
        flags: 0,
        receiver_index: 0,
        counter: 0,
        body_len,
    }
    .emit(&mut frame);
    buf
}

/// The body of a well-formed type-6 frame, or `None` for anything else.
fn probe_body(payload: &[u8]) -> Option<&[u8]> {
    let frame = Frame::new_checked(payload).ok()?;
    let repr = FrameRepr::parse(&frame).ok()?;
    if repr.msg_type != MessageType::EndpointProbe {
        return None;
    }
    payload.get(HEADER_LEN..)
}

/// A session's probes, as the client makes them: every frame carries the next counter.
#[derive(Clone)]
pub struct Prober {
    token: [u8; PROBE_TOKEN_LEN],
    key: [u8; PROBE_KEY_LEN],
    counter: u64,
}

impl core::fmt::Debug for Prober {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Prober")
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

impl Prober {
    /// The probes of the session the welcome gave `token` and `key`.
    pub const fn new(token: [u8; PROBE_TOKEN_LEN], key: [u8; PROBE_KEY_LEN]) -> Self {
        Self {
            token,
            key,
            counter: 0,
        }
    }

    /// The next probe (to either port).
    pub fn next_frame(&mut self) -> Vec<u8> {
        self.counter += 1;
        let mut buf = endpoint_probe(PROBE_BODY_LEN);
        buf[HEADER_LEN..HEADER_LEN + PROBE_TOKEN_LEN].copy_from_slice(&self.token);
        buf[HEADER_LEN + PROBE_TOKEN_LEN..SIGNED_LEN].copy_from_slice(&self.counter.to_be_bytes());
        let tag = mac(&self.key, &buf[..SIGNED_LEN]);
        buf[SIGNED_LEN..].copy_from_slice(&tag);
        buf
    }
}

/// A probe as it arrived, its MAC not checked yet.
#[derive(Debug, Clone, Copy)]
pub struct Probe<'a> {
    /// Which session it claims.
    pub token: [u8; PROBE_TOKEN_LEN],
    /// Its counter.
    pub counter: u64,
    signed: &'a [u8],
    tag: &'a [u8],
}

impl<'a> Probe<'a> {
    /// The probe in `payload`, or `None` when it is not one (wrong type, length or header).
    pub fn parse(payload: &'a [u8]) -> Option<Self> {
        let body = probe_body(payload)?;
        if body.len() != PROBE_BODY_LEN {
            return None;
        }
        let token = body[..PROBE_TOKEN_LEN].try_into().ok()?;
        let counter = u64::from_be_bytes(body[PROBE_TOKEN_LEN..][..COUNTER_LEN].try_into().ok()?);
        Some(Self {
            token,
            counter,
            signed: &payload[..SIGNED_LEN],
            tag: &payload[SIGNED_LEN..],
        })
    }

    /// Whether the session's `key` made it (constant time).
    pub fn verify(&self, key: &[u8; PROBE_KEY_LEN]) -> bool {
        verify_mac(key, self.signed, self.tag)
    }
}

/// A hole punch (docs/protocol.md §4, hole punching): a type-6 frame with an empty body, sent
/// with a small TTL so that it opens our NAT towards a peer and dies before the peer's NAT.
pub fn punch_frame() -> Vec<u8> {
    endpoint_probe(0)
}

/// Whether `payload` is a hole punch.
pub fn is_punch(payload: &[u8]) -> bool {
    probe_body(payload).is_some_and(<[u8]>::is_empty)
}

/// A bind to a relay channel: a type-6 frame whose body is the side's token.
pub fn bind_frame(token: &[u8; PROBE_TOKEN_LEN]) -> Vec<u8> {
    let mut buf = endpoint_probe(PROBE_TOKEN_LEN);
    buf[HEADER_LEN..].copy_from_slice(token);
    buf
}

/// The token of a well-formed bind, or `None` for anything else.
pub fn bind_token(payload: &[u8]) -> Option<[u8; PROBE_TOKEN_LEN]> {
    probe_body(payload)?.try_into().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_punch_is_an_empty_probe_and_nothing_else_is() {
        let punch = punch_frame();
        assert_eq!(punch.len(), HEADER_LEN);
        assert!(is_punch(&punch));
        assert!(Probe::parse(&punch).is_none());
        assert_eq!(bind_token(&punch), None);
        assert!(!is_punch(&bind_frame(&[7; PROBE_TOKEN_LEN])));
        let mut other = punch.clone();
        other[1] = 4;
        assert!(!is_punch(&other));
        assert!(!is_punch(&punch[..HEADER_LEN - 1]));
    }

    #[test]
    fn probes_verify_under_their_key_only_and_count_up() {
        let mut p = Prober::new([3; 16], [4; 16]);
        let (a, b) = (p.next_frame(), p.next_frame());
        let (pa, pb) = (Probe::parse(&a).unwrap(), Probe::parse(&b).unwrap());
        assert_eq!((pa.token, pa.counter, pb.counter), ([3; 16], 1, 2));
        assert!(pa.verify(&[4; 16]) && pb.verify(&[4; 16]));
        assert!(!pa.verify(&[5; 16]), "another session's key");
        // Any changed byte (header, token, counter, MAC) fails.
        for i in 0..a.len() {
            let mut bad = a.clone();
            bad[i] ^= 1;
            assert!(
                Probe::parse(&bad).is_none_or(|p| !p.verify(&[4; 16])),
                "byte {i}"
            );
        }
        // A bind is not a probe, and the other way round.
        assert!(Probe::parse(&bind_frame(&[3; 16])).is_none());
        assert!(bind_token(&a).is_none());
        assert_eq!(bind_token(&bind_frame(&[3; 16])), Some([3; 16]));
        assert!(Probe::parse(&a[..a.len() - 1]).is_none());
        assert!(Probe::parse(b"\x02\x06garbage").is_none());
    }
}

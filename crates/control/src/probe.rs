//! Endpoint probes, relay binds and the cloud's challenges (docs/protocol.md §4): tunnel
//! frames of type 6 sent from a client's tunnel socket, so that the cloud sees the address a
//! NAT maps that socket to, and proves that the client receives there.
//!
//! A probe to NMS names its session by token and carries a counter and a MAC under the
//! session's key (both from the encrypted welcome): it cannot be forged. A bind to a relay
//! channel carries a MAC under the side's token, which never travels in clear. Both carry a
//! return-routability cookie: the cloud records an address (or binds a side to it) only for a
//! frame that answers a [challenge](ReturnCookie) the cloud sent to that address, so a copy
//! replayed from elsewhere moves nothing. Version-5 clients' frames, without a cookie, are
//! read too ([`Probe::parse`], [`legacy_bind_token`]): the cloud serves such clients as before.

use std::net::{IpAddr, SocketAddr};

use cyphonic_crypto::cookie::{CookieSecret, MAC_LEN, mac, verify_mac};
use cyphonic_wire::{Frame, FrameRepr, HEADER_LEN, MessageType, Versions};

/// Bytes of a probe's (or a bind's) token.
pub const PROBE_TOKEN_LEN: usize = 16;

/// Bytes of the key of a probe's MAC.
pub const PROBE_KEY_LEN: usize = 16;

const COUNTER_LEN: usize = 8;

/// The first byte of the body of every frame of this module with a cookie: its layout.
const LAYOUT: u8 = 2;
/// The second: what it is.
const KIND_BIND: u8 = 1;
const KIND_CHALLENGE: u8 = 2;
const KIND_PROBE: u8 = 3;
const KIND_STREAM_HELLO: u8 = 4;
const KIND_STREAM_BIND: u8 = 5;
/// Layout and kind, then zeros up to here.
const PREFIX_LEN: usize = 8;
/// A cookie's time and the cookie.
const COOKIE_FIELD_LEN: usize = 8 + MAC_LEN;

/// Bytes of a probe's body: prefix, token, counter, cookie, MAC.
pub const PROBE_BODY_LEN: usize =
    PREFIX_LEN + PROBE_TOKEN_LEN + COUNTER_LEN + COOKIE_FIELD_LEN + MAC_LEN;
/// Bytes of a version-5 client's probe body: token, counter, MAC.
pub const LEGACY_PROBE_BODY_LEN: usize = PROBE_TOKEN_LEN + COUNTER_LEN + MAC_LEN;
/// Bytes of a bind's body: prefix, cookie, MAC.
pub const BIND_BODY_LEN: usize = PREFIX_LEN + COOKIE_FIELD_LEN + MAC_LEN;
/// Bytes of a challenge's body: prefix, cookie.
pub const CHALLENGE_BODY_LEN: usize = PREFIX_LEN + COOKIE_FIELD_LEN;

/// How long a cookie is good for after its time, milliseconds.
pub const COOKIE_LIFETIME_MS: u64 = 10_000;

/// A type-6 frame with a body of `body_len` bytes, the body zeroed, in our oldest frame
/// version: a member and the cloud a release apart both speak it (docs/protocol.md §2,
/// *Versions*).
fn endpoint_probe(body_len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; HEADER_LEN + body_len];
    let mut frame = Frame::new_unchecked(&mut buf[..]);
    FrameRepr {
        version: Versions::OURS.oldest(),
        msg_type: MessageType::EndpointProbe,
        flags: 0,
        receiver_index: 0,
        counter: 0,
        body_len,
    }
    .emit(&mut frame);
    buf
}

/// The body of a well-formed type-6 frame of a version we speak, or `None` for anything
/// else.
fn probe_body(payload: &[u8]) -> Option<&[u8]> {
    let frame = Frame::new_checked(payload).ok()?;
    let repr = FrameRepr::parse(&frame, Versions::OURS).ok()?;
    if repr.msg_type != MessageType::EndpointProbe {
        return None;
    }
    payload.get(HEADER_LEN..)
}

/// The body of a type-6 frame of this module's layout, of `kind` and `len` bytes.
fn body_of(payload: &[u8], kind: u8, len: usize) -> Option<&[u8]> {
    probe_body(payload).filter(|b| b.len() == len && b[0] == LAYOUT && b[1] == kind)
}

/// A type-6 frame of this module's layout, of `kind`, its body `len` bytes.
fn frame_of(kind: u8, len: usize) -> Vec<u8> {
    let mut buf = endpoint_probe(len);
    buf[HEADER_LEN] = LAYOUT;
    buf[HEADER_LEN + 1] = kind;
    buf
}

/// A return-routability cookie: what the cloud's challenge carried, to be sent back from the
/// address it went to. Only the cloud can make or check one ([`Challenger`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReturnCookie {
    /// When the cloud made it, its clock in milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The cookie.
    pub cookie: [u8; MAC_LEN],
}

impl ReturnCookie {
    /// The cookie field's bytes: time, cookie.
    fn to_bytes(self) -> [u8; COOKIE_FIELD_LEN] {
        let mut b = [0u8; COOKIE_FIELD_LEN];
        b[..8].copy_from_slice(&self.time_ms.to_be_bytes());
        b[8..].copy_from_slice(&self.cookie);
        b
    }

    /// The cookie in the field `b`; `None` for the empty one (time 0).
    fn from_bytes(b: &[u8]) -> Option<Self> {
        let time_ms = u64::from_be_bytes(b.get(..8)?.try_into().ok()?);
        let cookie = b.get(8..COOKIE_FIELD_LEN)?.try_into().ok()?;
        (time_ms != 0).then_some(Self { time_ms, cookie })
    }
}

/// What a challenge is for: a probe port's session, or a relay channel's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose<'a> {
    /// The probes to probe port `port` of the session with `token`.
    Probe {
        /// The probe port.
        port: u16,
        /// The session's probe token.
        token: &'a [u8; PROBE_TOKEN_LEN],
    },
    /// The binds of side `side` of the relay channel on `port`.
    Relay {
        /// The channel's port.
        port: u16,
        /// 0 or 1.
        side: u8,
    },
}

/// The cloud's maker and checker of cookies, under a secret of its own.
#[derive(Debug)]
pub struct Challenger {
    secret: CookieSecret,
}

impl Challenger {
    /// A challenger with `secret` (random at start: cookies do not outlive the process).
    pub const fn new(secret: CookieSecret) -> Self {
        Self { secret }
    }

    fn tag(&self, purpose: Purpose<'_>, to: SocketAddr, time_ms: u64) -> [u8; MAC_LEN] {
        let ip = match to.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        let port = to.port().to_be_bytes();
        let time = time_ms.to_be_bytes();
        match purpose {
            Purpose::Probe { port: p, token } => {
                self.secret
                    .tag(&[b"probe", &p.to_be_bytes(), token, &ip, &port, &time])
            }
            Purpose::Relay { port: p, side } => {
                self.secret
                    .tag(&[b"relay", &p.to_be_bytes(), &[side], &ip, &port, &time])
            }
        }
    }

    /// The cookie for `purpose` from the address `to`, made at `now_ms`.
    pub fn issue(&self, purpose: Purpose<'_>, to: SocketAddr, now_ms: u64) -> ReturnCookie {
        ReturnCookie {
            time_ms: now_ms,
            cookie: self.tag(purpose, to, now_ms),
        }
    }

    /// Whether `cookie` is one this challenger made for `purpose` and the address `from`,
    /// and is still good at `now_ms` (at most [`COOKIE_LIFETIME_MS`] old; not from the
    /// future).
    pub fn valid(
        &self,
        purpose: Purpose<'_>,
        from: SocketAddr,
        cookie: &ReturnCookie,
        now_ms: u64,
    ) -> bool {
        let fresh = cookie.time_ms <= now_ms && now_ms - cookie.time_ms <= COOKIE_LIFETIME_MS;
        fresh && same(&self.tag(purpose, from, cookie.time_ms), &cookie.cookie)
    }
}

/// Compares secrets in time independent of where they differ: a sender cannot learn one byte
/// by byte from how fast it is refused.
pub(crate) fn same(a: &[u8; MAC_LEN], b: &[u8; MAC_LEN]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    core::hint::black_box(diff) == 0
}

/// A challenge frame carrying `cookie`.
pub fn challenge_frame(cookie: &ReturnCookie) -> Vec<u8> {
    let mut buf = frame_of(KIND_CHALLENGE, CHALLENGE_BODY_LEN);
    buf[HEADER_LEN + PREFIX_LEN..].copy_from_slice(&cookie.to_bytes());
    buf
}

/// The cookie of a challenge frame, or `None` for anything else.
pub fn parse_challenge(payload: &[u8]) -> Option<ReturnCookie> {
    let body = body_of(payload, KIND_CHALLENGE, CHALLENGE_BODY_LEN)?;
    ReturnCookie::from_bytes(&body[PREFIX_LEN..])
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

    /// The next probe (to either port), answering `cookie` when there is one.
    pub fn next_frame(&mut self, cookie: Option<&ReturnCookie>) -> Vec<u8> {
        self.counter += 1;
        let mut buf = frame_of(KIND_PROBE, PROBE_BODY_LEN);
        let mut at = HEADER_LEN + PREFIX_LEN;
        buf[at..at + PROBE_TOKEN_LEN].copy_from_slice(&self.token);
        at += PROBE_TOKEN_LEN;
        buf[at..at + COUNTER_LEN].copy_from_slice(&self.counter.to_be_bytes());
        at += COUNTER_LEN;
        if let Some(c) = cookie {
            buf[at..at + COOKIE_FIELD_LEN].copy_from_slice(&c.to_bytes());
        }
        at += COOKIE_FIELD_LEN;
        let tag = mac(&self.key, &buf[..at]);
        buf[at..].copy_from_slice(&tag);
        buf
    }

    /// The next probe as a version-5 client sends it (no cookie): for tests of the cloud's
    /// service of older clients.
    pub fn next_legacy_frame(&mut self) -> Vec<u8> {
        self.counter += 1;
        let mut buf = endpoint_probe(LEGACY_PROBE_BODY_LEN);
        let signed = HEADER_LEN + PROBE_TOKEN_LEN + COUNTER_LEN;
        buf[HEADER_LEN..HEADER_LEN + PROBE_TOKEN_LEN].copy_from_slice(&self.token);
        buf[HEADER_LEN + PROBE_TOKEN_LEN..signed].copy_from_slice(&self.counter.to_be_bytes());
        let tag = mac(&self.key, &buf[..signed]);
        buf[signed..].copy_from_slice(&tag);
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
    /// The cookie it answers; `None` without one.
    pub cookie: Option<ReturnCookie>,
    /// A version-5 client's probe: no cookie field at all.
    pub legacy: bool,
    signed: &'a [u8],
    tag: &'a [u8],
}

impl<'a> Probe<'a> {
    /// The probe in `payload`, or `None` when it is not one (wrong type, length or header).
    pub fn parse(payload: &'a [u8]) -> Option<Self> {
        let body = probe_body(payload)?;
        if body.len() == LEGACY_PROBE_BODY_LEN {
            let signed = HEADER_LEN + PROBE_TOKEN_LEN + COUNTER_LEN;
            return Some(Self {
                token: body[..PROBE_TOKEN_LEN].try_into().ok()?,
                counter: u64::from_be_bytes(
                    body[PROBE_TOKEN_LEN..][..COUNTER_LEN].try_into().ok()?,
                ),
                cookie: None,
                legacy: true,
                signed: &payload[..signed],
                tag: &payload[signed..],
            });
        }
        let body = body_of(payload, KIND_PROBE, PROBE_BODY_LEN)?;
        let mut at = PREFIX_LEN;
        let token = body[at..at + PROBE_TOKEN_LEN].try_into().ok()?;
        at += PROBE_TOKEN_LEN;
        let counter = u64::from_be_bytes(body[at..at + COUNTER_LEN].try_into().ok()?);
        at += COUNTER_LEN;
        let cookie = ReturnCookie::from_bytes(&body[at..at + COOKIE_FIELD_LEN]);
        at += COOKIE_FIELD_LEN;
        Some(Self {
            token,
            counter,
            cookie,
            legacy: false,
            signed: &payload[..HEADER_LEN + at],
            tag: &payload[HEADER_LEN + at..],
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

/// A bind to a relay channel under the side's `token`, answering `cookie` when there is one.
pub fn bind_frame(token: &[u8; PROBE_TOKEN_LEN], cookie: Option<&ReturnCookie>) -> Vec<u8> {
    let mut buf = frame_of(KIND_BIND, BIND_BODY_LEN);
    let at = HEADER_LEN + PREFIX_LEN;
    if let Some(c) = cookie {
        buf[at..at + COOKIE_FIELD_LEN].copy_from_slice(&c.to_bytes());
    }
    let signed = at + COOKIE_FIELD_LEN;
    let tag = mac(token, &buf[..signed]);
    buf[signed..].copy_from_slice(&tag);
    buf
}

/// A bind as it arrived, its MAC not checked yet.
#[derive(Debug, Clone, Copy)]
pub struct Bind<'a> {
    /// The cookie it answers; `None` without one.
    pub cookie: Option<ReturnCookie>,
    signed: &'a [u8],
    tag: &'a [u8],
}

impl<'a> Bind<'a> {
    /// The bind in `payload`, or `None` when it is not one.
    pub fn parse(payload: &'a [u8]) -> Option<Self> {
        let body = body_of(payload, KIND_BIND, BIND_BODY_LEN)?;
        let signed = HEADER_LEN + PREFIX_LEN + COOKIE_FIELD_LEN;
        Some(Self {
            cookie: ReturnCookie::from_bytes(&body[PREFIX_LEN..]),
            signed: &payload[..signed],
            tag: &payload[signed..],
        })
    }

    /// Whether the side's `token` made it (constant time).
    pub fn verify(&self, token: &[u8; PROBE_TOKEN_LEN]) -> bool {
        verify_mac(token, self.signed, self.tag)
    }
}

/// Bytes of a relay stream's nonce (docs/protocol.md §4, *Relay over a stream*).
pub const STREAM_NONCE_LEN: usize = 16;

/// The body of a stream's hello: the prefix and the nonce.
const STREAM_HELLO_BODY_LEN: usize = PREFIX_LEN + STREAM_NONCE_LEN;

/// A relay stream's hello: the connection's `nonce`, which its binds must carry.
pub fn stream_hello_frame(nonce: &[u8; STREAM_NONCE_LEN]) -> Vec<u8> {
    let mut buf = frame_of(KIND_STREAM_HELLO, STREAM_HELLO_BODY_LEN);
    buf[HEADER_LEN + PREFIX_LEN..].copy_from_slice(nonce);
    buf
}

/// The nonce of a relay stream's hello, or `None` for anything else.
pub fn parse_stream_hello(payload: &[u8]) -> Option<[u8; STREAM_NONCE_LEN]> {
    body_of(payload, KIND_STREAM_HELLO, STREAM_HELLO_BODY_LEN)?[PREFIX_LEN..]
        .try_into()
        .ok()
}

/// A bind over a relay stream of the side holding `token` to the channel on `port`, on the
/// connection whose hello carried `nonce`.
pub fn stream_bind_frame(
    token: &[u8; PROBE_TOKEN_LEN],
    port: u16,
    nonce: &[u8; STREAM_NONCE_LEN],
) -> Vec<u8> {
    let mut buf = frame_of(KIND_STREAM_BIND, BIND_BODY_LEN);
    let at = HEADER_LEN;
    buf[at + 2..at + 4].copy_from_slice(&port.to_be_bytes());
    buf[at + 16..at + 32].copy_from_slice(nonce);
    let signed = at + 32;
    let tag = mac(token, &buf[..signed]);
    buf[signed..].copy_from_slice(&tag);
    buf
}

/// A bind over a relay stream as it arrived, its MAC not checked yet.
#[derive(Debug, Clone, Copy)]
pub struct StreamBind<'a> {
    /// The channel's port it names.
    pub port: u16,
    /// The connection's nonce it carries.
    pub nonce: [u8; STREAM_NONCE_LEN],
    signed: &'a [u8],
    tag: &'a [u8],
}

impl<'a> StreamBind<'a> {
    /// The stream bind in `payload`, or `None` when it is not one (bytes 4..16 of its body
    /// must be zero).
    pub fn parse(payload: &'a [u8]) -> Option<Self> {
        let body = body_of(payload, KIND_STREAM_BIND, BIND_BODY_LEN)?;
        if body[4..16].iter().any(|b| *b != 0) {
            return None;
        }
        let signed = HEADER_LEN + 32;
        Some(Self {
            port: u16::from_be_bytes([body[2], body[3]]),
            nonce: body[16..32].try_into().ok()?,
            signed: &payload[..signed],
            tag: &payload[signed..],
        })
    }

    /// Whether the side's `token` made it (constant time).
    pub fn verify(&self, token: &[u8; PROBE_TOKEN_LEN]) -> bool {
        verify_mac(token, self.signed, self.tag)
    }
}

/// A version-5 client's bind: a type-6 frame whose body is the side's token.
pub fn legacy_bind_frame(token: &[u8; PROBE_TOKEN_LEN]) -> Vec<u8> {
    let mut buf = endpoint_probe(PROBE_TOKEN_LEN);
    buf[HEADER_LEN..].copy_from_slice(token);
    buf
}

/// The token of a version-5 client's bind, or `None` for anything else.
pub fn legacy_bind_token(payload: &[u8]) -> Option<[u8; PROBE_TOKEN_LEN]> {
    probe_body(payload)?.try_into().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn challenger() -> Challenger {
        Challenger::new(CookieSecret::from_bytes([9; 32]))
    }

    #[test]
    fn a_punch_is_an_empty_probe_and_nothing_else_is() {
        let punch = punch_frame();
        assert_eq!(punch.len(), HEADER_LEN);
        assert!(is_punch(&punch));
        assert!(Probe::parse(&punch).is_none());
        assert_eq!(legacy_bind_token(&punch), None);
        assert!(Bind::parse(&punch).is_none());
        assert!(parse_challenge(&punch).is_none());
        assert!(!is_punch(&bind_frame(&[7; PROBE_TOKEN_LEN], None)));
        let mut other = punch.clone();
        other[1] = 4;
        assert!(!is_punch(&other));
        assert!(!is_punch(&punch[..HEADER_LEN - 1]));
    }

    #[test]
    fn probes_verify_under_their_key_only_and_count_up() {
        let mut p = Prober::new([3; 16], [4; 16]);
        let cookie = ReturnCookie {
            time_ms: 77,
            cookie: [5; 16],
        };
        let (a, b) = (p.next_frame(None), p.next_frame(Some(&cookie)));
        assert_eq!(a.len() - HEADER_LEN, PROBE_BODY_LEN);
        let (pa, pb) = (Probe::parse(&a).unwrap(), Probe::parse(&b).unwrap());
        assert_eq!((pa.token, pa.counter, pb.counter), ([3; 16], 1, 2));
        assert_eq!((pa.cookie, pb.cookie), (None, Some(cookie)));
        assert!(!pa.legacy && !pb.legacy);
        assert!(pa.verify(&[4; 16]) && pb.verify(&[4; 16]));
        assert!(!pa.verify(&[5; 16]), "another session's key");
        // Any changed byte (header, token, counter, cookie, MAC) fails.
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 1;
            assert!(
                Probe::parse(&bad).is_none_or(|p| !p.verify(&[4; 16])),
                "byte {i}"
            );
        }
        // A version-5 client's probe reads as one, without a cookie.
        let old = p.next_legacy_frame();
        let po = Probe::parse(&old).unwrap();
        assert_eq!((po.counter, po.cookie, po.legacy), (3, None, true));
        assert!(po.verify(&[4; 16]));
        // A bind is not a probe, and the other way round.
        assert!(Probe::parse(&bind_frame(&[3; 16], None)).is_none());
        assert!(Bind::parse(&a).is_none());
        assert!(Probe::parse(&a[..a.len() - 1]).is_none());
        assert!(Probe::parse(b"\x02\x06garbage").is_none());
    }

    #[test]
    fn binds_verify_under_their_token_and_carry_their_cookie() {
        let cookie = ReturnCookie {
            time_ms: 1_800_000_000_000,
            cookie: [6; 16],
        };
        let frame = bind_frame(&[1; 16], Some(&cookie));
        assert_eq!(frame.len() - HEADER_LEN, BIND_BODY_LEN);
        let b = Bind::parse(&frame).unwrap();
        assert_eq!(b.cookie, Some(cookie));
        assert!(b.verify(&[1; 16]));
        assert!(!b.verify(&[2; 16]));
        // The token is nowhere in the frame.
        assert!(!frame.windows(16).any(|w| w == [1; 16]));
        for i in 0..frame.len() {
            let mut bad = frame.clone();
            bad[i] ^= 1;
            assert!(
                Bind::parse(&bad).is_none_or(|b| !b.verify(&[1; 16])),
                "byte {i}"
            );
        }
        assert_eq!(
            Bind::parse(&bind_frame(&[1; 16], None)).unwrap().cookie,
            None
        );
        // The old kind: the token in clear, and nothing else of this kind reads as one.
        let old = legacy_bind_frame(&[1; 16]);
        assert_eq!(legacy_bind_token(&old), Some([1; 16]));
        assert!(Bind::parse(&old).is_none());
        assert_eq!(legacy_bind_token(&frame), None);
    }

    #[test]
    fn cookies_are_bound_to_their_purpose_address_and_time() {
        let c = challenger();
        let a: SocketAddr = "198.51.100.2:51820".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:198.51.100.2]:51820".parse().unwrap();
        let token = [3; 16];
        let probe = Purpose::Probe {
            port: 7001,
            token: &token,
        };
        let t = 1_800_000_000_000;
        let cookie = c.issue(probe, a, t);
        assert!(c.valid(probe, a, &cookie, t + 1));
        assert!(c.valid(probe, mapped, &cookie, t + 1), "the same address");
        assert!(c.valid(probe, a, &cookie, t + COOKIE_LIFETIME_MS));
        assert!(
            !c.valid(probe, a, &cookie, t + COOKIE_LIFETIME_MS + 1),
            "stale"
        );
        assert!(!c.valid(probe, a, &cookie, t - 1), "from the future");
        let other: SocketAddr = "198.51.100.2:51821".parse().unwrap();
        assert!(!c.valid(probe, other, &cookie, t), "another port");
        let other_token = [4; 16];
        for purpose in [
            Purpose::Probe {
                port: 7002,
                token: &token,
            },
            Purpose::Probe {
                port: 7001,
                token: &other_token,
            },
            Purpose::Relay {
                port: 7001,
                side: 0,
            },
        ] {
            assert!(!c.valid(purpose, a, &cookie, t), "{purpose:?}");
        }
        let relay = Purpose::Relay {
            port: 40000,
            side: 1,
        };
        let rc = c.issue(relay, a, t);
        assert!(!c.valid(
            Purpose::Relay {
                port: 40000,
                side: 0
            },
            a,
            &rc,
            t
        ));
        assert!(c.valid(relay, a, &rc, t));
        // Another secret's cookie, or a cookie with its time changed.
        let other_secret = Challenger::new(CookieSecret::from_bytes([8; 32]));
        assert!(!other_secret.valid(relay, a, &rc, t));
        let moved = ReturnCookie {
            time_ms: t + 1,
            ..rc
        };
        assert!(!c.valid(relay, a, &moved, t + 1));
        // A challenge carries it, and nothing else reads as one.
        let frame = challenge_frame(&rc);
        assert_eq!(frame.len() - HEADER_LEN, CHALLENGE_BODY_LEN);
        assert_eq!(parse_challenge(&frame), Some(rc));
        assert_eq!(parse_challenge(&bind_frame(&[1; 16], Some(&rc))), None);
        assert_eq!(parse_challenge(&punch_frame()), None);
    }
}

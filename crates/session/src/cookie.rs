//! The handshake's cheap checks at frame level (docs/protocol.md §2, *MACs and cookies*):
//! where mac1 and mac2 sit in a handshake frame, what they cover, how a responder checks them
//! and answers with a cookie-reply, and how an initiator opens one.
//!
//! ```text
//! handshake frame = header || noise || (hint) || mac1 || mac2     hint: initiations only
//!                   \_______ mac1 covers ______/
//!                   \____________ mac2 covers ___________/
//! ```
//!
//! The responder's half, [`CookieChecker`], runs on the driver's receive path before anything
//! is queued or decrypted; the initiator's half lives in [`crate::Peer`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cyphonic_crypto::PublicKey;
use cyphonic_crypto::cookie::{self, Cookie, CookieSecret, MAC_LEN, MacKeys};
use cyphonic_wire::{
    COOKIE_REPLY_LEN, Frame, FrameRepr, HEADER_LEN, HINT_LEN, MessageType, Versions,
};

/// How long a responder keeps its cookie secret, and so how long an initiator uses a cookie.
pub const COOKIE_LIFETIME: Duration = Duration::from_secs(120);

/// Where mac1 and mac2 start in a handshake frame of `len` bytes; `None` for a frame too
/// short to carry them after its header. mac1 covers `..mac1`, mac2 covers `..mac2`.
fn mac_offsets(len: usize) -> Option<(usize, usize)> {
    let mac2 = len.checked_sub(MAC_LEN)?;
    let mac1 = mac2.checked_sub(MAC_LEN)?;
    (mac1 >= HEADER_LEN).then_some((mac1, mac2))
}

/// Writes mac1 (keyed for the frame's `receiver`) and mac2 (under `cookie`, or zeros) into the
/// last 32 bytes of a handshake frame the caller built; returns mac1.
pub(crate) fn seal_macs(
    frame: &mut [u8],
    receiver: &MacKeys,
    cookie: Option<&Cookie>,
) -> [u8; MAC_LEN] {
    let Some((at1, at2)) = mac_offsets(frame.len()) else {
        unreachable!("handshake frames are built with room for their MACs");
    };
    let mac1 = receiver.mac1(&frame[..at1]);
    frame[at1..at2].copy_from_slice(&mac1);
    let mac2 = cookie.map_or([0; MAC_LEN], |c| cookie::mac(c, &frame[..at2]));
    frame[at2..].copy_from_slice(&mac2);
    mac1
}

/// The cookie in a cookie-reply `frame` from the responder whose keys are `responder`, for
/// our initiation that carried `mac1`; `None` when it is not authentic.
pub(crate) fn open_reply(
    frame: &[u8],
    responder: &MacKeys,
    mac1: &[u8; MAC_LEN],
) -> Option<Cookie> {
    responder.open_cookie(frame.get(HEADER_LEN..)?, mac1)
}

/// The hint of a handshake-init `frame` (the 16 bytes before its MACs), whose length the
/// frame parser checked; `None` for a frame too short to hold one.
pub fn initiation_hint(frame: &[u8]) -> Option<[u8; HINT_LEN]> {
    let (at1, _) = mac_offsets(frame.len())?;
    let at = at1.checked_sub(HINT_LEN).filter(|at| *at >= HEADER_LEN)?;
    frame[at..at1].try_into().ok()
}

/// The responder's cheap checks, for whoever reads handshake frames off the socket: mac1 on
/// every handshake message, mac2 and cookie-replies under load. Its secret is replaced every
/// [`COOKIE_LIFETIME`].
#[derive(Debug)]
pub struct CookieChecker {
    ours: MacKeys,
    secret: CookieSecret,
    born: Instant,
    /// The frame versions an initiation may be in: a reply is in the initiation's.
    versions: Versions,
}

impl CookieChecker {
    /// Checks for frames addressed to `ours` (our static key), starting with `secret` at `now`.
    /// Initiations are taken in `versions`, the frame versions we speak.
    pub fn new(
        (ours, versions): (&PublicKey, Versions),
        secret: CookieSecret,
        now: Instant,
    ) -> Self {
        Self {
            ours: MacKeys::new(ours),
            secret,
            born: now,
            versions,
        }
    }

    /// Whether a handshake frame's mac1 is right: its sender knows our static key.
    pub fn check_mac1(&self, frame: &[u8]) -> bool {
        mac_offsets(frame.len())
            .is_some_and(|(at1, at2)| self.ours.verify_mac1(&frame[..at1], &frame[at1..at2]))
    }

    /// Whether a handshake frame's mac2 is the MAC under the current cookie of `from`: its
    /// sender receives at that address.
    pub fn check_mac2(&mut self, frame: &[u8], from: SocketAddr, now: Instant) -> bool {
        let Some((_, at2)) = mac_offsets(frame.len()) else {
            return false;
        };
        let cookie = self.cookie(from, now);
        cookie::verify_mac(&cookie, &frame[..at2], &frame[at2..])
    }

    /// The cookie-reply to the initiation `frame` from `from`, or `None` when `frame` is not a
    /// handshake-init or no random nonce could be had.
    pub fn reply(&mut self, frame: &[u8], from: SocketAddr, now: Instant) -> Option<Vec<u8>> {
        let view = Frame::new_checked(frame).ok()?;
        let repr = FrameRepr::parse(&view, self.versions).ok()?;
        if repr.msg_type != MessageType::HandshakeInit {
            return None;
        }
        let (at1, at2) = mac_offsets(frame.len())?;
        let mac1: [u8; MAC_LEN] = frame[at1..at2].try_into().ok()?;
        let cookie = self.cookie(from, now);
        let nonce = cookie::random_nonce().ok()?;
        let sealed = self.ours.seal_cookie(&cookie, &nonce, &mac1);
        let mut out = vec![0u8; HEADER_LEN + COOKIE_REPLY_LEN];
        // In the initiation's version (docs/protocol.md §2, *Versions*).
        FrameRepr {
            version: repr.version,
            msg_type: MessageType::CookieReply,
            flags: 0,
            receiver_index: repr.receiver_index,
            counter: 0,
            body_len: COOKIE_REPLY_LEN,
        }
        .emit(&mut Frame::new_unchecked(&mut out[..]));
        out[HEADER_LEN..].copy_from_slice(&sealed);
        Some(out)
    }

    /// The current cookie of `from`, replacing the secret first when it is due.
    fn cookie(&mut self, from: SocketAddr, now: Instant) -> Cookie {
        if now.saturating_duration_since(self.born) >= COOKIE_LIFETIME {
            // Should the system's generator fail, the old secret serves on until it does not.
            if let Ok(secret) = CookieSecret::random() {
                self.secret = secret;
                self.born = now;
            }
        }
        self.secret.cookie(from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handshake_frame(kind: MessageType, index: u32, noise: usize) -> Vec<u8> {
        let mut f = vec![0u8; HEADER_LEN + noise + 2 * MAC_LEN];
        FrameRepr {
            version: cyphonic_wire::VERSION,
            msg_type: kind,
            flags: 0,
            receiver_index: index,
            counter: 0,
            body_len: noise + 2 * MAC_LEN,
        }
        .emit(&mut Frame::new_unchecked(&mut f[..]));
        f[HEADER_LEN..HEADER_LEN + noise].fill(0x5a);
        f
    }

    #[test]
    fn mac1_binds_the_receiver_and_every_byte_before_it() {
        let ours = PublicKey([1; 32]);
        let now = Instant::now();
        let checker = CookieChecker::new(
            (&ours, Versions::OURS),
            CookieSecret::from_bytes([2; 32]),
            now,
        );
        let mut f = handshake_frame(MessageType::HandshakeInit, 7, 96);
        seal_macs(&mut f, &MacKeys::new(&ours), None);
        assert!(checker.check_mac1(&f));
        for at in [
            0,
            5,
            HEADER_LEN,
            f.len() - 2 * MAC_LEN - 1,
            f.len() - MAC_LEN - 1,
        ] {
            let mut g = f.clone();
            g[at] ^= 1;
            assert!(!checker.check_mac1(&g), "byte {at} is covered");
        }
        // mac2 is not covered by mac1.
        let mut g = f.clone();
        let last = g.len() - 1;
        g[last] ^= 1;
        assert!(checker.check_mac1(&g));
        let mut other = f.clone();
        seal_macs(&mut other, &MacKeys::new(&PublicKey([3; 32])), None);
        assert!(!checker.check_mac1(&other), "keyed for someone else");
        assert!(!checker.check_mac1(&f[..HEADER_LEN + 2 * MAC_LEN - 1]));
    }

    /// The whole round: no mac2, a cookie-reply, the initiator opens it and its next
    /// initiation passes, from that address only, until the secret is replaced.
    #[test]
    fn a_cookie_reply_gives_the_initiator_a_mac2_for_its_address_only() {
        let responder = PublicKey([1; 32]);
        let keys = MacKeys::new(&responder);
        let t0 = Instant::now();
        let mut checker = CookieChecker::new(
            (&responder, Versions::OURS),
            CookieSecret::from_bytes([2; 32]),
            t0,
        );
        let from: SocketAddr = "192.0.2.7:40000".parse().unwrap();
        let mut init = handshake_frame(MessageType::HandshakeInit, 0x1234, 112);
        let mac1 = seal_macs(&mut init, &keys, None);
        assert!(!checker.check_mac2(&init, from, t0));
        let reply = checker.reply(&init, from, t0).expect("a reply");
        assert_eq!(reply.len(), HEADER_LEN + COOKIE_REPLY_LEN);
        let view = Frame::new_checked(&reply[..]).unwrap();
        let repr = FrameRepr::parse(&view, Versions::OURS).unwrap();
        assert_eq!(repr.msg_type, MessageType::CookieReply);
        assert_eq!(repr.receiver_index, 0x1234);
        // Only the initiation that carried this mac1 opens it.
        assert_eq!(open_reply(&reply, &keys, &[0; MAC_LEN]), None);
        let cookie = open_reply(&reply, &keys, &mac1).expect("authentic");
        let mut again = handshake_frame(MessageType::HandshakeInit, 0x1235, 112);
        seal_macs(&mut again, &keys, Some(&cookie));
        assert!(checker.check_mac1(&again));
        assert!(checker.check_mac2(&again, from, t0 + Duration::from_secs(1)));
        let elsewhere: SocketAddr = "192.0.2.8:40000".parse().unwrap();
        assert!(!checker.check_mac2(&again, elsewhere, t0));
        // A response is never answered with a cookie.
        let resp = handshake_frame(MessageType::HandshakeResp, 9, 48);
        assert_eq!(checker.reply(&resp, from, t0), None);
        // The secret is replaced after its lifetime: the old cookie no longer passes.
        assert!(!checker.check_mac2(&again, from, t0 + COOKIE_LIFETIME));
    }

    /// A reply is in the version of the initiation it answers, one of the checker's.
    #[test]
    fn a_cookie_reply_takes_the_version_of_its_initiation() {
        let responder = PublicKey([1; 32]);
        let newer = cyphonic_wire::VERSION + 1;
        let both = Versions::new(cyphonic_wire::VERSION, newer).unwrap();
        let t0 = Instant::now();
        let from: SocketAddr = "192.0.2.7:40000".parse().unwrap();
        let mut init = handshake_frame(MessageType::HandshakeInit, 0x1234, 112);
        init[0] = newer;
        seal_macs(&mut init, &MacKeys::new(&responder), None);
        let secret = || CookieSecret::from_bytes([2; 32]);
        let mut ours = CookieChecker::new((&responder, Versions::OURS), secret(), t0);
        assert_eq!(ours.reply(&init, from, t0), None, "not a version we speak");
        let mut next = CookieChecker::new((&responder, both), secret(), t0);
        let reply = next.reply(&init, from, t0).expect("a reply");
        assert_eq!(reply[0], newer);
        init[0] = cyphonic_wire::VERSION;
        seal_macs(&mut init, &MacKeys::new(&responder), None);
        let reply = next.reply(&init, from, t0).expect("a reply");
        assert_eq!(reply[0], cyphonic_wire::VERSION);
    }
}

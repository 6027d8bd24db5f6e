//! The relay's rule (`control::relay::Sides`) under any sequence of datagrams from a few
//! addresses (both sides' real addresses, an attacker's, IPv4-mapped forms): binds under
//! either token answering any challenge the relay sent (to any of the addresses) or none,
//! version-5 binds with a token in clear, a wrong token, garbage, data, as time goes by. A
//! datagram is forwarded only from one side's bound address and only to the other side's;
//! a side is bound only to an address the relay challenged for that side (or, for a
//! version-5 side, by its token in clear), and binds move only their own side. Datagrams
//! may also come on one of three relay streams (docs/protocol.md §4, *Relay over a stream*):
//! stream binds with the right or another connection's nonce and port, UDP binds, data;
//! streams close. A side is bound to a stream only by a stream bind under its token with that
//! connection's nonce and the channel's port, and a closed stream holds no side.
#![no_main]

use std::collections::HashSet;
use std::net::SocketAddr;

use arbitrary::Arbitrary;
use cyphonic_control::relay::{At, Sides, Verdict};
use cyphonic_control::{
    ReturnCookie, StreamBind, bind_frame, legacy_bind_frame, parse_challenge, stream_bind_frame,
};
use cyphonic_crypto::cookie::CookieSecret;

const TOKENS: [[u8; 16]; 2] = [[0xa1; 16], [0xb2; 16]];

#[derive(Arbitrary, Debug)]
enum What {
    /// A bind under side `side`'s token, answering the `cookie`th challenge seen so far
    /// (none when there is none).
    Bind { side: u8, cookie: Option<u8> },
    LegacyBind(u8),
    WrongBind([u8; 16]),
    Bytes(Vec<u8>),
    /// A stream bind under side `side`'s token, with connection `nonce`'s nonce, for the
    /// channel's port or the next one.
    StreamBind { side: u8, nonce: u8, other_port: bool },
    /// The stream the datagram came on closes (nothing else happens).
    Close,
}

#[derive(Arbitrary, Debug)]
struct Datagram {
    from: u8,
    /// Over UDP from `from` (`None`), or on relay stream `on % 3`.
    on: Option<u8>,
    advance_ms: u16,
    what: What,
}

#[derive(Arbitrary, Debug)]
struct Input {
    legacy: [bool; 2],
    datagrams: Vec<Datagram>,
}

fn address(n: u8) -> SocketAddr {
    let s = match n % 6 {
        0 => "198.51.100.1:4000",
        1 => "[fd00::2]:5000",
        2 => "[::ffff:198.51.100.1]:4000",
        3 => "192.0.2.66:4000",
        4 => "198.51.100.1:4001",
        _ => "[fd00::3]:5000",
    };
    s.parse().unwrap()
}

/// Relay stream `n`'s nonce.
fn nonce_of(n: u8) -> [u8; 16] {
    [0x40 + n % 3; 16]
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

libfuzzer_sys::fuzz_target!(|input: Input| {
    let challenger = cyphonic_control::Challenger::new(CookieSecret::from_bytes([3; 32]));
    let mut sides = Sides::new(40_000, TOKENS, input.legacy);
    let mut now = 1_800_000_000_000u64;
    // Every challenge the relay sent: its cookie, and to whom.
    let mut cookies: Vec<ReturnCookie> = Vec::new();
    let mut challenged: HashSet<SocketAddr> = HashSet::new();
    for d in input.datagrams.into_iter().take(64) {
        now += u64::from(d.advance_ms);
        let from = address(d.from);
        let bytes = match &d.what {
            What::Bind { side, cookie } => {
                let c = cookie.and_then(|i| cookies.get(usize::from(i) % cookies.len().max(1)));
                bind_frame(&TOKENS[usize::from(side % 2)], c)
            }
            What::LegacyBind(i) => legacy_bind_frame(&TOKENS[usize::from(i % 2)]),
            What::WrongBind(t) => bind_frame(t, None),
            What::Bytes(b) => b.clone(),
            What::StreamBind {
                side,
                nonce,
                other_port,
            } => stream_bind_frame(
                &TOKENS[usize::from(side % 2)],
                40_000 + u16::from(*other_port),
                &nonce_of(*nonce),
            ),
            What::Close => Vec::new(),
        };
        let before = sides.bound();
        if let Some(c) = d.on {
            let conn = u64::from(c % 3);
            if matches!(d.what, What::Close) {
                sides.stream_closed(conn);
                for i in 0..2 {
                    let expect = before[i].filter(|b| *b != At::Stream(conn));
                    assert_eq!(sides.bound()[i], expect, "a close moved what it did not hold");
                }
                continue;
            }
            match sides.stream(&bytes, conn, &nonce_of(c % 3)) {
                Verdict::Bound { side, .. } => {
                    assert_eq!(sides.bound()[side], Some(At::Stream(conn)));
                    assert_eq!(sides.bound()[1 - side], before[1 - side], "a bind moved the other side");
                    assert!(!input.legacy[side], "a version-5 side bound over a stream");
                    let bind = StreamBind::parse(&bytes).expect("bound by a stream bind");
                    assert!(bind.verify(&TOKENS[side]), "bound with another side's token");
                    assert_eq!(bind.nonce, nonce_of(c % 3), "bound with another connection's nonce");
                    assert_eq!(bind.port, 40_000, "bound by another channel's bind");
                }
                Verdict::Forward { to } => {
                    let [a, b] = before;
                    let from = Some(At::Stream(conn));
                    assert!(
                        (from == a && Some(to) == b) || (from == b && Some(to) == a),
                        "forwarded {from:?} -> {to:?} with sides {before:?}"
                    );
                    assert_eq!(sides.bound(), before, "data moved a side");
                }
                Verdict::Challenge { .. } => panic!("a challenge on a stream"),
                Verdict::Refused(_) => assert_eq!(sides.bound(), before, "a refusal moved a side"),
            }
            continue;
        }
        match sides.datagram(&bytes, from, now, &challenger) {
            Verdict::Bound { side, .. } => {
                assert_eq!(sides.bound()[side], Some(At::Udp(canonical(from))));
                assert_eq!(sides.bound()[1 - side], before[1 - side], "a bind moved the other side");
                if input.legacy[side] {
                    assert_eq!(
                        cyphonic_control::legacy_bind_token(&bytes),
                        Some(TOKENS[side]),
                        "a version-5 side bound without its token"
                    );
                } else {
                    let What::Bind { side: s, .. } = d.what else {
                        panic!("a version-6 side bound by {:?}", d.what);
                    };
                    assert_eq!(usize::from(s % 2), side, "bound with another side's token");
                    assert!(
                        challenged.contains(&canonical(from)),
                        "bound to {from}, which was never challenged"
                    );
                }
            }
            Verdict::Challenge { to, frame } => {
                assert_eq!(to, canonical(from), "a challenge to another address than the bind's");
                assert_eq!(sides.bound(), before, "a challenge moved a side");
                cookies.push(parse_challenge(&frame).expect("a challenge frame"));
                challenged.insert(to);
            }
            Verdict::Forward { to } => {
                let from = Some(At::Udp(canonical(from)));
                let [a, b] = before;
                assert!(
                    (from == a && Some(to) == b) || (from == b && Some(to) == a),
                    "forwarded {from:?} -> {to:?} with sides {before:?}"
                );
                assert_eq!(sides.bound(), before, "data moved a side");
            }
            Verdict::Refused(_) => assert_eq!(sides.bound(), before, "a refusal moved a side"),
        }
    }
});

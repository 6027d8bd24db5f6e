//! The relay's rule (`control::relay::Sides`) under any sequence of datagrams from a few
//! addresses (both sides' real addresses, an attacker's, IPv4-mapped forms): binds with either
//! token, a wrong token, garbage, data. A datagram is forwarded only from one side's bound
//! address and only to the other side's; binds move only the side whose token they carry.
#![no_main]

use std::net::SocketAddr;

use arbitrary::Arbitrary;
use cyphonic_control::bind_frame;
use cyphonic_control::relay::{Sides, Verdict};

const TOKENS: [[u8; 16]; 2] = [[0xa1; 16], [0xb2; 16]];

#[derive(Arbitrary, Debug)]
enum What {
    Bind(u8),
    WrongBind([u8; 16]),
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Datagram {
    from: u8,
    what: What,
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

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

libfuzzer_sys::fuzz_target!(|datagrams: Vec<Datagram>| {
    let mut sides = Sides::new(TOKENS);
    for d in datagrams.into_iter().take(64) {
        let from = address(d.from);
        let bytes = match &d.what {
            What::Bind(i) => bind_frame(&TOKENS[usize::from(i % 2)]),
            What::WrongBind(t) => bind_frame(t),
            What::Bytes(b) => b.clone(),
        };
        let before = sides.bound();
        match sides.datagram(&bytes, from) {
            Verdict::Bound { side, .. } => {
                assert_eq!(sides.bound()[side], Some(canonical(from)));
                assert_eq!(sides.bound()[1 - side], before[1 - side], "a bind moved the other side");
                let token = cyphonic_control::bind_token(&bytes).expect("a bind");
                assert_eq!(token, TOKENS[side], "bound with another side's token");
            }
            Verdict::Forward { to } => {
                let from = canonical(from);
                let [a, b] = before;
                assert!(
                    (Some(from) == a && Some(to) == b) || (Some(from) == b && Some(to) == a),
                    "forwarded {from} -> {to} with sides {before:?}"
                );
                assert_eq!(sides.bound(), before, "data moved a side");
            }
            Verdict::Refused(_) => assert_eq!(sides.bound(), before, "a refusal moved a side"),
        }
    }
});

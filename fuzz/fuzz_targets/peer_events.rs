//! The `Peer` state machine over sequences of events: two real peers (the session simulator's
//! driver) that initiate, time out, send, roam and redirect, on a network the fuzzer controls:
//! each frame in flight is delivered, dropped, duplicated, delayed or corrupted, and anyone
//! may inject bytes. No sequence may panic either side.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arbitrary::Arbitrary;
use cyphonic_crypto::RevocationList;
use cyphonic_session::sim::{
    ADDR_A, ADDR_B, Packet, Pair, Setup, Side, identity, node_keys, test_ca,
};
use cyphonic_session::{Identity, PeerConfig, Timing};

fn identities() -> &'static (Arc<Identity>, Arc<Identity>) {
    static F: OnceLock<(Arc<Identity>, Arc<Identity>)> = OnceLock::new();
    F.get_or_init(|| {
        let ca = test_ca();
        (
            identity(node_keys(&ca, "gw1.ovl.example", "100.64.1.0/24"), &ca, RevocationList::default()),
            identity(node_keys(&ca, "gw2.ovl.example", "100.64.2.0/24"), &ca, RevocationList::default()),
        )
    })
}

#[derive(Arbitrary, Debug)]
enum Op {
    Initiate(bool),
    /// Let time pass (milliseconds), running timers and deliveries due.
    Wait(u16),
    /// The next frame in flight: delivered now.
    Deliver,
    Drop,
    Duplicate,
    Corrupt { at: u16, xor: u8 },
    /// Held back and delivered after everything else in flight.
    Delay,
    Send(bool, Vec<u8>),
    /// Bytes from anywhere to one side.
    Inject { to_a: bool, port: u16, bytes: Vec<u8> },
    /// A side's peer is told to send to another port of the other's address.
    Redirect(bool, u16),
    AddressChanged(bool),
}

fn side(a: bool) -> Side {
    if a { Side::A } else { Side::B }
}

/// The next frame in flight, whatever its delivery time.
fn next(pair: &mut Pair) -> Option<Packet> {
    pair.flush();
    let at = pair.net.next_delivery()?;
    pair.net.pop_due(at)
}

libfuzzer_sys::fuzz_target!(|ops: Vec<Op>| {
    let (a, b) = identities();
    let mut pair = Setup {
        seed: 7,
        timing: Timing::default(),
        a_config: PeerConfig::from_certificate(b.certificate(), Some(ADDR_B.parse().unwrap())),
        b_config: PeerConfig::from_certificate(a.certificate(), Some(ADDR_A.parse().unwrap())),
        a_identity: a.clone(),
        b_identity: b.clone(),
    }
    .build(std::time::Instant::now());
    let mut delayed = Vec::new();
    for op in ops.into_iter().take(64) {
        let now = pair.now;
        match op {
            Op::Initiate(a) => {
                let _ = pair.node(side(a)).peer.initiate(now);
            }
            Op::Wait(ms) => pair.drive(Duration::from_millis(u64::from(ms))),
            Op::Deliver => {
                if let Some(p) = next(&mut pair) {
                    pair.deliver(p);
                }
            }
            Op::Drop => {
                let _ = next(&mut pair);
            }
            Op::Duplicate => {
                if let Some(p) = next(&mut pair) {
                    pair.deliver(p.clone());
                    pair.deliver(p);
                }
            }
            Op::Corrupt { at, xor } => {
                if let Some(mut p) = next(&mut pair) {
                    if !p.frame.is_empty() {
                        let i = usize::from(at) % p.frame.len();
                        p.frame[i] ^= xor | 1;
                    }
                    pair.deliver(p);
                }
            }
            Op::Delay => {
                if let Some(p) = next(&mut pair) {
                    delayed.push(p);
                }
            }
            Op::Send(a, payload) => {
                let _ = pair.send(side(a), &payload);
            }
            Op::Inject { to_a, port, bytes } => {
                let to = if to_a { ADDR_A } else { ADDR_B };
                pair.deliver(Packet {
                    from: std::net::SocketAddr::from(([192, 0, 2, 66], port)),
                    to: to.parse().unwrap(),
                    frame: bytes,
                });
            }
            Op::Redirect(a, port) => {
                let other = if a { ADDR_B } else { ADDR_A };
                let mut to: std::net::SocketAddr = other.parse().unwrap();
                to.set_port(port);
                let _ = pair.node(side(a)).peer.redirect(to, now);
            }
            Op::AddressChanged(a) => pair.node(side(a)).peer.local_address_changed(now),
        }
    }
    for p in delayed {
        pair.deliver(p);
    }
    pair.drive(Duration::from_secs(5));
});

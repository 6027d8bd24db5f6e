//! The HA pair's opener and decision (`cyphonic_ha`) under any sequence of messages from the
//! other box's start: heartbeats sealed with the pair's key, whatever their fields, echoing
//! one of our recent challenges or anything else; bytes of any kind; time passing. Nothing
//! panics; bytes not sealed with the key never open; a box stands down from active only on
//! a heartbeat that proved the other alive.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use cyphonic_crypto::{PairKey, StaticKeypair};
use cyphonic_ha::msg::Body;
use cyphonic_ha::{Config, Health, Heartbeat, Opener, Pair, Role, Sealer};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum What {
    /// A genuine heartbeat; `echo` picks one of our last challenges, or none.
    Beat {
        role: u8,
        health: u8,
        priority: u8,
        preempt: bool,
        handing_over: bool,
        term: u8,
        echo: Option<u8>,
    },
    /// The operator asks this box to hand over.
    HandOver,
    /// Our own heartbeat, looped back.
    Own,
    Bytes(Vec<u8>),
    Health(u8),
    Restart,
}

#[derive(Arbitrary, Debug)]
struct Step {
    advance_ms: u16,
    what: What,
}

const OTHER: [u8; 6] = [2, 0, 0, 0, 0, 2];
const US: [u8; 6] = [2, 0, 0, 0, 0, 1];

fuzz_target!(|steps: Vec<Step>| {
    let secret = [0x42u8; 32];
    let key = || {
        PairKey::new(&StaticKeypair::from_secret(zeroize::Zeroizing::new(secret)))
            .expect("a real key pair")
    };
    let mut now = Instant::now();
    let cfg = Config {
        priority: 100,
        preempt: true,
        mac: US,
    };
    let mut pair = Pair::new(cfg, Health::ALL, now);
    let mut opener = Opener::new(key());
    let mut sealer = Sealer::new(&key(), [7; 16]);
    let mut boot = 8u8;
    let mut ours: Vec<Heartbeat> = Vec::new();
    let mut n = 0u64;
    let mut wire = Vec::new();
    for step in steps.into_iter().take(400) {
        now += Duration::from_millis(u64::from(step.advance_ms % 2000));
        pair.handle_timeout(now);
        n += 1;
        let mut challenge = [0u8; 16];
        challenge[..8].copy_from_slice(&n.to_be_bytes());
        if let Some(b) = pair.poll_transmit(now, n, challenge) {
            ours.push(b);
        }
        let before = pair.role();
        let proved = match step.what {
            What::Beat { role, health, priority, preempt, handing_over, term, echo } => {
                let role = match role % 3 {
                    0 => Role::Starting,
                    1 => Role::Standby,
                    _ => Role::Active,
                };
                let echo = echo
                    .and_then(|i| ours.iter().rev().nth(usize::from(i % 6)))
                    .map_or([0; 16], |b| b.challenge);
                let beat = Heartbeat {
                    role,
                    health: Health::none().with(if health & 1 == 1 { Health::LAN } else { Health::none() })
                        .with(if health & 2 == 2 { Health::UPLINK } else { Health::none() }),
                    priority,
                    preempt,
                    handing_over,
                    term: u64::from(term),
                    clock_ns: n,
                    challenge: [health; 16],
                    echo,
                    leases_version: 0,
                    nic: OTHER,
                };
                sealer.seal(&Body::Heartbeat(beat), &mut wire);
                let Ok((b, Body::Heartbeat(opened))) = opener.open(&wire) else {
                    panic!("a genuine heartbeat did not open");
                };
                assert_eq!(opened, beat);
                pair.handle(OTHER, b, &opened, now)
            }
            What::HandOver => {
                let active = pair.role() == Role::Active;
                let asked = pair.hand_over(now);
                assert!(active || asked.is_err(), "a box that does not serve handed over");
                false
            }
            What::Own => match ours.last() {
                Some(b) => {
                    assert!(!pair.handle(US, [1; 16], b, now), "our own heartbeat proved life");
                    false
                }
                None => false,
            },
            What::Bytes(bytes) => {
                assert!(opener.open(&bytes).is_err(), "bytes without the key opened");
                false
            }
            What::Health(h) => {
                pair.set_health(if h & 1 == 1 { Health::ALL } else { Health::none() }, now);
                false
            }
            What::Restart => {
                boot = boot.wrapping_add(1);
                sealer = Sealer::new(&key(), [boot; 16]);
                false
            }
        };
        if before == Role::Active && pair.role() == Role::Standby {
            assert!(proved, "stood down from active without a proof of life");
        }
        while pair.poll_event().is_some() {}
    }
});

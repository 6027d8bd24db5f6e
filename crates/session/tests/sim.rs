//! Deterministic simulations of two peers: handshakes, refusals with typed
//! reasons, rekeying under loss and reordering, limits, keepalives, expiry, roaming.

// Test code: unwrapping and narrowing casts of small test values are fine here.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::needless_pass_by_value
)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cyphonic_crypto::{CertError, Certificate, RevocationList};
use cyphonic_session::sim::*;
use cyphonic_session::{Event, HandshakeError, RecvError, SendError, Timing, read_init};
use cyphonic_wire::{Frame, HINT_LEN, MAC_LEN, MessageType, VERSION};
use rand::{Rng, SeedableRng};

/// Builds a handshake-init by hand, as an attacker could, following docs/protocol.md §2:
/// Noise IK message 1 from `noise_key` to `responder`, payload index | timestamp | `cert`,
/// index 7 in the header, MACs left zero (the driver checks those, not `read_init`).
fn forge_init(
    noise_key: &cyphonic_crypto::StaticKeypair,
    responder: &cyphonic_crypto::PublicKey,
    cert: &[u8],
) -> Vec<u8> {
    let mut hs =
        cyphonic_crypto::noise::initiator(noise_key, responder, b"cyphonic tunnel v4").unwrap();
    let payload = [
        &7u32.to_be_bytes()[..],
        &(T0 * 1_000_000_000).to_be_bytes(),
        cert,
    ]
    .concat();
    let mut frame = vec![0u8; 1300];
    let n = hs.write_message(&payload, &mut frame[16..]).unwrap();
    frame.truncate(16 + n + HINT_LEN + 2 * MAC_LEN);
    frame[..8].copy_from_slice(&[VERSION, 1, 0, 0, 0, 0, 0, 7]);
    frame
}

const SEC: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

#[test]
fn handshake_then_data_both_ways() {
    let mut p = Setup::new(1).build(Instant::now());
    // The first packet finds no keys and starts the handshake (the driver queues it).
    assert_eq!(p.send(Side::A, b"early"), Err(SendError::NoSession));
    p.drive(SEC);
    assert_eq!(
        p.a.events,
        vec![Event::Established {
            initiator: true,
            rekey: false
        }]
    );
    // The responder's keys are confirmed by the initiator's immediate keepalive.
    assert_eq!(
        p.b.events.last(),
        Some(&Event::Established {
            initiator: false,
            rekey: false
        })
    );
    assert_eq!(p.b.keepalives, 1);
    p.send(Side::A, b"ping").unwrap();
    p.send(Side::B, b"pong").unwrap();
    p.drive(SEC);
    assert_eq!(p.b.delivered, vec![b"ping".to_vec()]);
    assert_eq!(p.a.delivered, vec![b"pong".to_vec()]);
    assert!(p.a.handshake_errors.is_empty() && p.b.handshake_errors.is_empty());
    assert_eq!(
        p.a.peer.certificate().unwrap().body().name,
        "gw2.ovl.example"
    );
    assert_eq!(
        p.b.peer.certificate().unwrap().body().name,
        "gw1.ovl.example"
    );
}

/// The responder refuses the initiator with `expect`; the initiator keeps retrying and
/// eventually gives up, and no keys ever exist.
fn refused_by_responder(setup: Setup, expect: HandshakeError) {
    let mut p = setup.build(Instant::now());
    p.connect(Side::A);
    assert_eq!(
        p.b.handshake_errors.first(),
        Some(&expect),
        "all: {:?}",
        p.b.handshake_errors
    );
    p.drive(120 * SEC);
    assert!(
        p.a.events.contains(&Event::HandshakeGaveUp),
        "{:?}",
        p.a.events
    );
    assert!(!p.a.peer.is_established(p.now) && !p.b.peer.is_established(p.now));
    assert!(p.a.delivered.is_empty() && p.b.delivered.is_empty());
}

#[test]
fn wrong_ca_is_refused() {
    let mut s = Setup::new(2);
    let other_ca = test_ca();
    let keys = node_keys(&other_ca, "gw1.ovl.example", "100.64.1.0/24");
    s.b_config = cyphonic_session::PeerConfig {
        remote_static: None,
        ..s.b_config
    };
    s.a_identity = identity(keys, &other_ca, RevocationList::default());
    refused_by_responder(s, HandshakeError::Certificate(CertError::UnknownCa));
}

#[test]
fn expired_certificate_is_refused() {
    let mut s = Setup::new(3);
    let ca = test_ca();
    // Valid when the identity is built, expired by the time the handshake runs.
    let keypair = cyphonic_crypto::StaticKeypair::generate().unwrap();
    let cert = ca
        .issue(&cyphonic_crypto::IssueRequest {
            name: "gw1.ovl.example".into(),
            vip_blocks: vec![net("100.64.1.0/24")],
            public_key: keypair.public().0,
            groups: vec![],
            not_before: T0 - DAY,
            not_after: T0 + 1,
        })
        .unwrap();
    let b_keys = node_keys(&ca, "gw2.ovl.example", "100.64.2.0/24");
    s.a_config =
        cyphonic_session::PeerConfig::from_certificate(&b_keys.cert, Some(ADDR_B.parse().unwrap()));
    s.b_config =
        cyphonic_session::PeerConfig::from_certificate(&cert, Some(ADDR_A.parse().unwrap()));
    s.a_identity = identity(NodeKeys { keypair, cert }, &ca, RevocationList::default());
    s.b_identity = identity(b_keys, &ca, RevocationList::default());
    let mut p = s.build(Instant::now());
    p.drive(5 * SEC);
    p.connect(Side::A);
    assert_eq!(
        p.b.handshake_errors[0],
        HandshakeError::Certificate(CertError::Expired {
            not_after: T0 + 1,
            now: T0 + 5
        })
    );
    assert!(!p.a.peer.is_established(p.now));
}

#[test]
fn revoked_certificate_is_refused() {
    let mut s = Setup::new(4);
    let ca = test_ca();
    let a = node_keys(&ca, "gw1.ovl.example", "100.64.1.0/24");
    let b = node_keys(&ca, "gw2.ovl.example", "100.64.2.0/24");
    let fp = a.cert.fingerprint();
    let mut revoked = RevocationList::default();
    revoked.revoke(fp);
    s.a_config =
        cyphonic_session::PeerConfig::from_certificate(&b.cert, Some(ADDR_B.parse().unwrap()));
    s.b_config =
        cyphonic_session::PeerConfig::from_certificate(&a.cert, Some(ADDR_A.parse().unwrap()));
    s.a_identity = identity(a, &ca, RevocationList::default());
    s.b_identity = identity(b, &ca, revoked);
    refused_by_responder(s, HandshakeError::Certificate(CertError::Revoked(fp)));
}

#[test]
fn tampered_certificate_is_refused() {
    let ca = test_ca();
    let a = node_keys(&ca, "gw1.ovl.example", "100.64.1.0/24");
    let b = node_keys(&ca, "gw2.ovl.example", "100.64.2.0/24");
    let b_public = b.keypair.public();
    let b_id = identity(b, &ca, RevocationList::default());
    // The forging itself is sound: the untouched certificate is accepted.
    let honest = forge_init(&a.keypair, &b_public, a.cert.encoded());
    read_init(&b_id, T0, &honest).unwrap();
    // Validity extended by hand, a vIP block widened, a group added: all decode, none verify.
    let len = a.cert.encoded().len();
    for (what, at) in [
        ("not_after", len - 64 - 1),
        ("block prefix", 4 + 1 + 1 + 15 + 1 + 1 + 4),
        ("signature", len - 1),
    ] {
        let mut bytes = a.cert.encoded().to_vec();
        bytes[at] ^= 0x01;
        let forged = forge_init(&a.keypair, &b_public, &bytes);
        let err = read_init(&b_id, T0, &forged).unwrap_err();
        assert!(
            matches!(
                err,
                HandshakeError::Certificate(CertError::BadSignature | CertError::Malformed(_))
            ),
            "{what}: {err}"
        );
    }
    // Our own side refuses to start with a tampered certificate at all.
    let mut bytes = a.cert.encoded().to_vec();
    bytes[len - 64 - 1] ^= 0x01;
    let tampered = Certificate::decode(&bytes).unwrap();
    let trust =
        cyphonic_crypto::TrustStore::new(vec![ca.certificate().clone()], RevocationList::default())
            .unwrap();
    assert_eq!(
        cyphonic_session::Identity::new(a.keypair, tampered, trust, T0).unwrap_err(),
        cyphonic_session::IdentityError::Certificate(CertError::BadSignature)
    );
}

#[test]
fn certificate_for_another_key_is_refused() {
    // A stolen certificate presented with the thief's own Noise key.
    let ca = test_ca();
    let victim = node_keys(&ca, "gw1.ovl.example", "100.64.1.0/24");
    let thief_key = cyphonic_crypto::StaticKeypair::generate().unwrap();
    let b = node_keys(&ca, "gw2.ovl.example", "100.64.2.0/24");
    let b_public = b.keypair.public();
    let b_id = identity(b, &ca, RevocationList::default());
    let forged = forge_init(&thief_key, &b_public, victim.cert.encoded());
    assert_eq!(
        read_init(&b_id, T0, &forged).unwrap_err(),
        HandshakeError::KeyMismatch
    );
    // Payloads too short to hold index, timestamp and a certificate.
    for cut in [0, 3, 11, 12, 40] {
        let mut hs =
            cyphonic_crypto::noise::initiator(&thief_key, &b_public, b"cyphonic tunnel v4")
                .unwrap();
        let payload = [
            &7u32.to_be_bytes()[..],
            &T0.to_be_bytes(),
            victim.cert.encoded(),
        ]
        .concat();
        let mut frame = vec![0u8; 1300];
        let n = hs.write_message(&payload[..cut], &mut frame[16..]).unwrap();
        frame.truncate(16 + n + HINT_LEN + 2 * MAC_LEN);
        frame[..8].copy_from_slice(&[VERSION, 1, 0, 0, 0, 0, 0, 7]);
        let err = read_init(&b_id, T0, &frame).unwrap_err();
        assert!(
            matches!(
                err,
                HandshakeError::Payload(_) | HandshakeError::Certificate(CertError::Malformed(_))
            ),
            "cut {cut}: {err}"
        );
    }
    // The thief's own identity cannot even be built around the stolen certificate.
    let trust =
        cyphonic_crypto::TrustStore::new(vec![ca.certificate().clone()], RevocationList::default())
            .unwrap();
    assert_eq!(
        cyphonic_session::Identity::new(thief_key, victim.cert, trust, T0).unwrap_err(),
        cyphonic_session::IdentityError::KeyMismatch
    );
}

#[test]
fn name_mismatch_is_refused_on_both_sides() {
    // The responder expects gw9 where gw1 initiates.
    let mut s = Setup::new(5);
    s.b_config.expect_name = Some("gw9.ovl.example".into());
    s.b_config.remote_static = None;
    refused_by_responder(
        s,
        HandshakeError::NameMismatch {
            expected: "gw9.ovl.example".into(),
            got: "gw1.ovl.example".into(),
        },
    );

    // The initiator expects gw9 where gw2 answers.
    let mut s = Setup::new(6);
    s.a_config.expect_name = Some("gw9.ovl.example".into());
    let mut p = s.build(Instant::now());
    p.connect(Side::A);
    assert_eq!(
        p.a.handshake_errors[0],
        HandshakeError::NameMismatch {
            expected: "gw9.ovl.example".into(),
            got: "gw2.ovl.example".into()
        }
    );
    assert!(!p.a.peer.is_established(p.now));
}

#[test]
fn vip_mismatch_is_refused() {
    let mut s = Setup::new(7);
    s.b_config.expect_blocks = vec![net("100.64.9.0/24")];
    refused_by_responder(s, HandshakeError::VipMismatch(net("100.64.9.0/24")));
}

#[test]
fn replayed_initiation_is_refused() {
    let mut p = Setup::new(8).build(Instant::now());
    p.connect(Side::A);
    assert!(p.a.peer.is_established(p.now));
    let init = p
        .net
        .log
        .iter()
        .find(|pk| {
            Frame::new_checked(&pk.frame[..]).unwrap().msg_type() == MessageType::HandshakeInit
        })
        .unwrap()
        .clone();
    let sessions_before = p.b.established_count();
    p.drive(SEC);
    p.deliver(init.clone());
    let Some(HandshakeError::Replay { timestamp, newest }) = p.b.handshake_errors.last().cloned()
    else {
        panic!("{:?}", p.b.handshake_errors)
    };
    assert_eq!(timestamp, newest);
    // Nothing changed: no new keys, the session still works.
    p.drive(SEC);
    assert_eq!(p.b.established_count(), sessions_before);
    p.send(Side::A, b"still fine").unwrap();
    p.drive(SEC);
    assert_eq!(p.b.delivered.last().unwrap(), b"still fine");
}

#[test]
fn truncated_and_garbage_handshakes_are_typed_errors() {
    let mut p = Setup::new(9).build(Instant::now());
    p.a.peer.initiate(p.now).unwrap();
    p.flush();
    let init = p.net.log[0].frame.clone();
    let unix = p.clock.unix_secs(p.now);
    // Truncated at every length: a wire error or a decryption failure, never a panic.
    for len in 0..init.len() {
        let err = read_init(&p.b.identity, unix, &init[..len]).unwrap_err();
        assert!(
            matches!(err, HandshakeError::Frame(_) | HandshakeError::Decrypt),
            "len {len}: {err}"
        );
    }
    // Every single flipped bit in the Noise message makes it undecryptable (the MACs after
    // it are the driver's to check: crates/session/src/cookie.rs tests them).
    for i in 16..init.len() - HINT_LEN - 2 * MAC_LEN {
        let mut bad = init.clone();
        bad[i] ^= 0x40;
        assert_eq!(
            read_init(&p.b.identity, unix, &bad).unwrap_err(),
            HandshakeError::Decrypt,
            "byte {i}"
        );
    }
    // Random garbage of plausible sizes with a valid header.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
    for _ in 0..500 {
        let len = rng.random_range(144..1216);
        let mut g: Vec<u8> = (0..16 + len).map(|_| rng.random()).collect();
        g[..16].copy_from_slice(&init[..16]);
        assert_eq!(
            read_init(&p.b.identity, unix, &g).unwrap_err(),
            HandshakeError::Decrypt
        );
    }
    // Not addressed to B: A's own key cannot open it.
    assert_eq!(
        read_init(&p.a.identity, unix, &init).unwrap_err(),
        HandshakeError::Decrypt
    );
    // Wrong types.
    let mut resp_typed = init.clone();
    resp_typed[1] = 2;
    assert!(matches!(
        read_init(&p.b.identity, unix, &resp_typed),
        Err(HandshakeError::WrongType { .. }) | Err(HandshakeError::Frame(_))
    ));
    // A response nobody asked for, and garbage in place of a real response.
    let now = p.now;
    let from = ADDR_B.parse().unwrap();
    let mut fake = vec![VERSION, 2, 0, 0, 0, 0, 0x01, 0x99, 0, 0, 0, 0, 0, 0, 0, 0];
    fake.extend([0u8; 96]);
    assert_eq!(
        p.a.peer.handle_response(now, from, &fake),
        Err(HandshakeError::UnknownIndex(0x199))
    );
    // Nothing wedged A: the handshake completes.
    p.drive(10 * SEC);
    assert!(p.a.peer.is_established(p.now), "{:?}", p.a.handshake_errors);
}

/// An attacker on the path sees B's response go by (its receiver index is in clear) and races
/// forged responses with that index to A: garbage, and the genuine one with a bit flipped. A
/// refuses them, and the genuine response arriving after them still completes the handshake
/// at once, with no retry.
#[test]
fn forged_responses_do_not_break_a_pending_handshake() {
    let mut p = Setup::new(47).build(Instant::now());
    p.a.peer.initiate(p.now).unwrap();
    // The initiation reaches B (5 ms), whose response is then on its way back.
    p.drive(Duration::from_millis(6));
    let genuine = p.net.log.last().unwrap().clone();
    assert_eq!(
        Frame::new_checked(&genuine.frame[..]).unwrap().msg_type(),
        MessageType::HandshakeResp
    );
    let index = &genuine.frame[4..8];
    let mut garbage = vec![VERSION, 2, 0, 0];
    garbage.extend_from_slice(index);
    garbage.extend([0u8; 8]);
    garbage.extend((0..(genuine.frame.len() - 16)).map(|i| i as u8));
    let mut flipped = genuine.frame.clone();
    // The last byte of the Noise message (the MACs after it are the driver's to check).
    let last = flipped.len() - 2 * MAC_LEN - 1;
    flipped[last] ^= 1;
    for forged in [garbage, flipped] {
        p.deliver(Packet {
            frame: forged,
            ..genuine.clone()
        });
    }
    assert_eq!(
        p.a.handshake_errors,
        vec![HandshakeError::Decrypt, HandshakeError::Decrypt]
    );
    assert!(!p.a.peer.is_established(p.now));
    // The genuine response arrives (10 ms) and completes the handshake.
    p.drive(Duration::from_millis(10));
    assert!(p.a.peer.is_established(p.now), "{:?}", p.a.handshake_errors);
    let inits = p
        .net
        .log
        .iter()
        .filter(|pk| pk.frame[1] == u8::from(MessageType::HandshakeInit))
        .count();
    assert_eq!(inits, 1, "no retry was needed");
}

#[test]
fn garbage_and_forged_data_frames_are_dropped() {
    let mut p = Setup::new(10).build(Instant::now());
    p.connect(Side::A);
    let now = p.now;
    let from = ADDR_A.parse().unwrap();
    let b_index = p
        .net
        .log
        .iter()
        .find_map(|pk| {
            let f = Frame::new_checked(&pk.frame[..]).ok()?;
            (f.msg_type() == MessageType::Keepalive).then(|| f.receiver_index())
        })
        .unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(10);
    for _ in 0..300 {
        let len = rng.random_range(0..200);
        let mut g: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if g.len() >= 16 && rng.random_bool(0.5) {
            g[0] = VERSION;
            g[1] = 3;
            g[4..8].copy_from_slice(&b_index.to_be_bytes());
        }
        assert!(p.b.peer.decapsulate(now, from, &mut g).is_err());
    }
    // Roaming only follows authenticated frames: garbage from elsewhere does not move B.
    let evil: SocketAddr = "192.0.2.66:4444".parse().unwrap();
    let mut forged = vec![VERSION, 3, 0, 0];
    forged.extend(b_index.to_be_bytes());
    forged.extend(7u64.to_be_bytes());
    forged.extend([0u8; 40]);
    assert!(matches!(
        p.b.peer.decapsulate(now, evil, &mut forged),
        Err(RecvError::Auth(_))
    ));
    assert_eq!(p.b.peer.endpoint(), Some(ADDR_A.parse().unwrap()));
    p.send(Side::A, b"ok").unwrap();
    p.drive(SEC);
    assert_eq!(p.b.delivered, vec![b"ok".to_vec()]);
}

#[test]
fn replayed_data_frame_is_dropped() {
    let mut p = Setup::new(11).build(Instant::now());
    p.connect(Side::A);
    p.send(Side::A, b"once").unwrap();
    p.drive(SEC);
    let data = p
        .net
        .log
        .iter()
        .rev()
        .find(|pk| Frame::new_checked(&pk.frame[..]).unwrap().msg_type() == MessageType::Data)
        .unwrap()
        .clone();
    p.deliver(data);
    assert_eq!(p.b.delivered, vec![b"once".to_vec()]);
    assert!(matches!(p.b.recv_errors.last(), Some(RecvError::Replay(_))));
}

#[test]
fn simultaneous_initiation_converges() {
    let mut p = Setup::new(12).build(Instant::now());
    let now = p.now;
    p.a.peer.initiate(now).unwrap();
    p.b.peer.initiate(now).unwrap();
    p.drive(2 * SEC);
    assert!(p.a.peer.is_established(p.now) && p.b.peer.is_established(p.now));
    for i in 0..20u8 {
        p.send(Side::A, &[i]).unwrap();
        p.send(Side::B, &[i]).unwrap();
    }
    p.drive(SEC);
    assert_eq!(p.a.delivered.len(), 20);
    assert_eq!(p.b.delivered.len(), 20);
    assert!(
        p.a.recv_errors.is_empty() && p.b.recv_errors.is_empty(),
        "{:?} {:?}",
        p.a.recv_errors,
        p.b.recv_errors
    );
}

/// Initiations `from` put on the network so far.
fn inits_from(p: &Pair, from: SocketAddr) -> usize {
    p.net
        .log
        .iter()
        .filter(|pk| pk.from == from && pk.frame[1] == 1)
        .count()
}

/// A pending initiation sent again at once (its path was just repaired), not at its next
/// retry; nothing when none is pending.
#[test]
fn retry_now_resends_a_pending_initiation_only() {
    let mut p = Setup::new(15).build(Instant::now());
    p.net.partitioned = true;
    p.a.peer.retry_now(p.now).unwrap();
    p.flush();
    assert_eq!(inits_from(&p, p.a.addr), 0, "nothing pending, nothing sent");
    p.a.peer.initiate(p.now).unwrap();
    p.flush();
    assert_eq!(inits_from(&p, p.a.addr), 1);
    p.net.partitioned = false;
    p.a.peer.retry_now(p.now).unwrap();
    p.flush();
    assert_eq!(inits_from(&p, p.a.addr), 2, "sent again at once");
    p.drive(100 * MS);
    assert!(p.a.peer.is_established(p.now), "well before the 1-s retry");
}

/// A hole punch's lead: an initiation asked for during the hold goes out when it ends, not
/// before, and the timer says when.
#[test]
fn a_held_initiation_goes_out_when_the_hold_ends() {
    let mut p = Setup::new(13).build(Instant::now());
    let now = p.now;
    let lead = Duration::from_millis(100);
    p.a.peer.hold_initiations_until(now + lead);
    p.a.peer.initiate(now).unwrap();
    assert_eq!(p.a.peer.poll_timeout(), Some(now + lead));
    p.drive(lead / 2);
    assert_eq!(inits_from(&p, p.a.addr), 0, "held");
    p.drive(SEC);
    assert_eq!(inits_from(&p, p.a.addr), 1, "sent when the hold ended");
    assert!(p.a.peer.is_established(p.now) && p.b.peer.is_established(p.now));
}

/// The peer's initiation arrives during our hold and is answered at once (answering is never
/// held); when the hold ends, no initiation of ours follows: keys exist.
#[test]
fn a_held_initiation_is_dropped_when_the_peer_got_there_first() {
    let mut p = Setup::new(14).build(Instant::now());
    let now = p.now;
    p.b.peer
        .hold_initiations_until(now + Duration::from_millis(100));
    p.b.peer.initiate(now).unwrap();
    p.a.peer.initiate(now).unwrap();
    p.drive(SEC);
    assert!(p.a.peer.is_established(p.now) && p.b.peer.is_established(p.now));
    assert_eq!(inits_from(&p, p.a.addr), 1);
    assert_eq!(
        inits_from(&p, p.b.addr),
        0,
        "B answered and never initiated"
    );
}

/// Traffic both ways every 10 ms for ten simulated minutes over a network with `loss` and up
/// to `jitter` of reordering. Keys rotate several times; every packet the network delivered is
/// accepted exactly once, none fails authentication or the replay window, and the sender never
/// loses its keys after the first handshake.
fn rekey_under_traffic(seed: u64, loss: f64, jitter: Duration) {
    let mut p = Setup::new(seed).build(Instant::now());
    p.net.loss = loss;
    p.net.jitter = jitter;
    // The first handshake may itself lose messages: retry until established.
    let _ = p.send(Side::A, b"hello");
    while !(p.a.peer.is_established(p.now) && p.b.peer.is_established(p.now)) {
        let limit = p.now + Duration::from_millis(100);
        while p.step(limit) {}
        let _ = p.send(Side::A, b"hello");
        let _ = p.send(Side::B, b"hello");
    }
    p.drive(SEC);
    let (a0, b0) = (p.a.delivered.len(), p.b.delivered.len());
    let start = p.now;
    let mut sent = [0u64; 2];
    let mut seq = 0u64;
    while p.now < start + Duration::from_secs(600) {
        for (i, side) in [Side::A, Side::B].into_iter().enumerate() {
            seq += 1;
            p.send(side, &seq.to_be_bytes())
                .unwrap_or_else(|e| panic!("{side:?} lost its keys at {:?}: {e}", p.now - start));
            sent[i] += 1;
        }
        let limit = p.now + Duration::from_millis(10);
        while p.step(limit) {}
    }
    p.drive(SEC);
    let delivered = [p.b.delivered.len() - b0, p.a.delivered.len() - a0];
    let rekeys =
        p.a.events
            .iter()
            .filter(|e| matches!(e, Event::Established { rekey: true, .. }))
            .count();
    assert!(rekeys >= 4, "only {rekeys} rekeys in 10 minutes");
    let auth_or_replay = |errs: &[RecvError]| {
        errs.iter()
            .filter(|e| {
                matches!(
                    e,
                    RecvError::Auth(_) | RecvError::Replay(_) | RecvError::UnknownIndex(_)
                )
            })
            .count()
    };
    assert_eq!(
        auth_or_replay(&p.a.recv_errors),
        0,
        "A: {:?}",
        p.a.recv_errors
    );
    assert_eq!(
        auth_or_replay(&p.b.recv_errors),
        0,
        "B: {:?}",
        p.b.recv_errors
    );
    // Exactly once: no payload delivered twice.
    for node in [&p.a, &p.b] {
        let unique: HashSet<_> = node.delivered.iter().collect();
        assert_eq!(unique.len(), node.delivered.len());
    }
    // Everything sent minus what the network dropped: only data counts, so compare bounds.
    let lost_allowance = |n: u64| (n as f64 * loss * 2.0 + 20.0) as usize;
    for i in 0..2 {
        assert!(delivered[i] as u64 <= sent[i]);
        assert!(
            sent[i] as usize - delivered[i] <= lost_allowance(sent[i]),
            "side {i}: sent {} delivered {}",
            sent[i],
            delivered[i]
        );
    }
    if loss == 0.0 {
        assert_eq!(delivered, [sent[0] as usize, sent[1] as usize]);
    }
}

#[test]
fn rekey_under_traffic_clean_network() {
    rekey_under_traffic(20, 0.0, Duration::ZERO);
}

#[test]
fn rekey_under_traffic_with_loss_and_reordering() {
    for seed in 21..24 {
        rekey_under_traffic(seed, 0.02, Duration::from_millis(40));
    }
}

#[test]
fn message_limit_rekeys_and_counters_are_never_reused() {
    let mut s = Setup::new(30);
    s.timing = Timing {
        rekey_after_messages: 50,
        reject_after_messages: 80,
        ..Timing::default()
    };
    let mut p = s.build(Instant::now());
    p.connect(Side::A);
    let mut failures = 0;
    for i in 0..2000u32 {
        match p.send(Side::A, &i.to_be_bytes()) {
            Ok(()) => {}
            Err(SendError::NoSession | SendError::KeyExhausted) => failures += 1,
            Err(e) => panic!("{e}"),
        }
        let limit = p.now + Duration::from_millis(1);
        while p.step(limit) {}
    }
    p.drive(SEC);
    // (receiver index, counter) never repeats on the wire, and no counter reaches the limit.
    let mut seen = HashSet::new();
    for pk in &p.net.log {
        let f = Frame::new_checked(&pk.frame[..]).unwrap();
        if matches!(f.msg_type(), MessageType::Data | MessageType::Keepalive) {
            assert!(
                f.counter() < 80,
                "counter {} at or past the limit",
                f.counter()
            );
            assert!(
                seen.insert((f.receiver_index(), f.counter())),
                "reused {:?}",
                (f.receiver_index(), f.counter())
            );
        }
    }
    let rekeys =
        p.a.events
            .iter()
            .filter(|e| matches!(e, Event::Established { rekey: true, .. }))
            .count();
    assert!(
        rekeys >= 2000 / 80,
        "{rekeys} rekeys for 2000 packets at 50 per key"
    );
    assert_eq!(p.b.delivered.len(), 2000 - failures);
    assert!(failures < 100, "{failures} sends found no keys");
}

#[test]
fn passive_keepalive_answers_one_way_traffic() {
    let mut p = Setup::new(40).build(Instant::now());
    p.connect(Side::A);
    let before = p.a.keepalives;
    p.send(Side::A, b"one way").unwrap();
    p.drive(1900 * MS);
    assert_eq!(p.a.keepalives, before, "too early");
    p.drive(200 * MS);
    assert_eq!(
        p.a.keepalives,
        before + 1,
        "B tells A its data arrived after 2 s of silence"
    );
    p.drive(30 * SEC);
    assert_eq!(p.a.keepalives, before + 1, "and only once");
}

#[test]
fn persistent_keepalive_keeps_an_idle_peer_up() {
    let mut s = Setup::new(41);
    s.a_config.persistent_keepalive = Some(Duration::from_secs(25));
    let mut p = s.build(Instant::now());
    // No traffic at all: the persistent keepalive alone brings the tunnel up and keeps it.
    p.drive(2 * SEC);
    assert!(p.a.peer.is_established(p.now));
    p.drive(Duration::from_secs(600));
    assert!(p.a.peer.is_established(p.now) && p.b.peer.is_established(p.now));
    assert!(p.b.keepalives >= 600 / 25, "{} keepalives", p.b.keepalives);
    assert!(!p.a.events.contains(&Event::Expired));
}

#[test]
fn idle_sessions_expire_and_come_back_on_demand() {
    let mut p = Setup::new(42).build(Instant::now());
    p.connect(Side::A);
    p.drive(Duration::from_secs(181));
    assert!(p.a.events.contains(&Event::Expired) && p.b.events.contains(&Event::Expired));
    assert!(!p.a.peer.is_established(p.now));
    assert_eq!(
        p.b.peer
            .session_for_index(0x201, p.now)
            .map(|s| s.local_index()),
        None
    );
    assert_eq!(p.send(Side::B, b"wake"), Err(SendError::NoSession));
    p.drive(SEC);
    p.send(Side::B, b"wake").unwrap();
    p.drive(SEC);
    assert_eq!(p.a.delivered, vec![b"wake".to_vec()]);
}

#[test]
fn unanswered_handshakes_back_off_then_give_up() {
    let mut p = Setup::new(43).build(Instant::now());
    p.net.partitioned = true;
    assert_eq!(p.send(Side::A, b"x"), Err(SendError::NoSession));
    p.drive(Duration::from_secs(100));
    let inits: Vec<_> = p.net.log.iter().filter(|pk| pk.frame[1] == 1).collect();
    // Retries at 1, 2, 4, 8, 8, 8 ... seconds apart, over 90 s: about a dozen, not ninety.
    assert!(
        (10..=16).contains(&inits.len()),
        "{} initiations",
        inits.len()
    );
    assert_eq!(p.a.events, vec![Event::HandshakeGaveUp]);
    // The network heals; new traffic starts a new series and succeeds.
    p.net.partitioned = false;
    assert_eq!(p.send(Side::A, b"x"), Err(SendError::NoSession));
    p.drive(SEC);
    assert!(p.a.peer.is_established(p.now));
}

#[test]
fn roaming_follows_authenticated_frames() {
    let mut p = Setup::new(44).build(Instant::now());
    p.connect(Side::A);
    // A's NAT mapping changes: its frames now come from a new address.
    let new_addr: SocketAddr = "198.51.100.77:40000".parse().unwrap();
    p.a.addr = new_addr;
    p.send(Side::A, b"from elsewhere").unwrap();
    p.drive(SEC);
    assert_eq!(p.b.delivered, vec![b"from elsewhere".to_vec()]);
    assert_eq!(p.b.peer.endpoint(), Some(new_addr));
    assert!(p.b.events.contains(&Event::EndpointChanged {
        old: Some(ADDR_A.parse().unwrap()),
        new: new_addr
    }));
    // B's answer goes to the new address and arrives.
    p.send(Side::B, b"found you").unwrap();
    p.drive(SEC);
    assert_eq!(p.a.delivered, vec![b"found you".to_vec()]);
}

/// A side that only receives moves (a DHCP renewal gave it a new address): the data sent
/// to its old address is lost until it speaks. Telling its peer at once brings the stream
/// back within a round trip instead of after the peer's reply timer.
#[test]
fn a_receiver_that_moves_tells_its_peer_at_once() {
    let mut p = Setup::new(46).build(Instant::now());
    p.connect(Side::A);
    let new_addr: SocketAddr = "198.51.100.78:51820".parse().unwrap();
    p.a.addr = new_addr;
    p.send(Side::B, b"lost").unwrap();
    p.drive(SEC);
    assert!(p.a.delivered.is_empty(), "sent to the old address");
    let (now, before) = (p.now, p.b.keepalives);
    p.a.peer.local_address_changed(now);
    p.drive(SEC);
    assert_eq!(p.b.peer.endpoint(), Some(new_addr));
    assert_eq!(p.b.keepalives, before + 1);
    p.send(Side::B, b"found").unwrap();
    p.drive(SEC);
    assert_eq!(p.a.delivered, vec![b"found".to_vec()]);
    // Without keys there is nothing to say: no frame, no handshake.
    let mut q = Setup::new(47).build(Instant::now());
    let now = q.now;
    q.a.peer.local_address_changed(now);
    q.flush();
    assert!(q.net.log.is_empty());
}

#[test]
fn sending_never_computes_a_handshake_inline() {
    let mut p = Setup::new(45).build(Instant::now());
    let now = p.now;
    assert_eq!(
        p.a.peer.send_session(now).unwrap_err(),
        SendError::NoSession
    );
    // Nothing was built yet: the initiation comes from the timer path, due at once.
    assert_eq!(p.a.peer.poll_transmit(), None);
    assert!(p.a.peer.poll_timeout().is_some_and(|t| t <= now));
    p.a.peer.handle_timeout(now);
    let init =
        p.a.peer
            .poll_transmit()
            .expect("handle_timeout builds the initiation");
    assert_eq!(init.frame[1], 1);
}

/// B restarts and forgets its keys; A's frames now carry an index B does not know. A notices
/// that its data goes unanswered and handshakes again within the reply timeout.
#[test]
fn restarted_peer_is_recovered_by_the_reply_timeout() {
    let mut p = Setup::new(46).build(Instant::now());
    p.connect(Side::A);
    p.send(Side::A, b"before").unwrap();
    p.drive(SEC);
    assert_eq!(p.b.delivered, vec![b"before".to_vec()]);
    // Restart B: a fresh peer object with the same identity and configuration.
    let b_config = cyphonic_session::PeerConfig::from_certificate(
        p.a.identity.certificate(),
        Some(ADDR_A.parse().unwrap()),
    );
    p.b.peer = cyphonic_session::Peer::new(
        2,
        p.b.identity.clone(),
        cyphonic_session::Indices::new(),
        b_config,
        Timing::default(),
        p.clock.clone(),
        cyphonic_crypto::Backend::RustCrypto,
    );
    let restart = p.now;
    let mut first_delivery = None;
    for i in 0..300u32 {
        let _ = p.send(Side::A, &i.to_be_bytes());
        let limit = p.now + Duration::from_millis(100);
        while p.step(limit) {}
        if first_delivery.is_none() && p.b.delivered.len() > 1 {
            first_delivery = Some(p.now - restart);
        }
    }
    let took = first_delivery.expect("traffic never resumed after the restart");
    assert!(
        took <= Duration::from_secs(17),
        "resumed only after {took:?}"
    );
    assert!(
        p.b.recv_errors
            .iter()
            .any(|e| matches!(e, RecvError::UnknownIndex(_)))
    );
}

/// The cloud gives a relay while our initiations go unanswered: `redirect` sends a fresh
/// initiation to the new endpoint at once (not at the next retry, 1 s later), and the peer
/// tells how long it has gone unanswered.
#[test]
fn redirect_restarts_a_pending_handshake_at_the_new_endpoint() {
    let mut setup = Setup::new(9);
    // A knows B at an address where nobody listens.
    setup.a_config.endpoint = Some("192.0.2.99:51820".parse().unwrap());
    let mut p = setup.build(Instant::now());
    let start = p.now;
    p.a.peer.initiate(start).unwrap();
    p.drive(Duration::from_millis(500));
    assert_eq!(p.a.established_count(), 0);
    assert_eq!(p.a.peer.unanswered_since(), Some(start));
    let now = p.now;
    p.a.peer.redirect(ADDR_B.parse().unwrap(), now).unwrap();
    // Well before the first retry would have gone out (1 s after the first initiation).
    p.drive(Duration::from_millis(100));
    assert_eq!(p.a.established_count(), 1, "{:?}", p.a.events);
    assert!(p.a.events.contains(&Event::EndpointChanged {
        old: Some("192.0.2.99:51820".parse().unwrap()),
        new: ADDR_B.parse().unwrap(),
    }));
    assert_eq!(p.a.peer.unanswered_since(), None);
    // Redirecting to where it already sends changes nothing.
    let now = p.now;
    p.a.peer.redirect(ADDR_B.parse().unwrap(), now).unwrap();
    p.flush();
    assert_eq!(p.a.established_count(), 1);
}

/// B is under load and answers A's initiation with a cookie-reply (docs/protocol.md §2, MACs
/// and cookies). A refuses forged ones and ones for another initiation, keeps its handshake
/// pending, sends nothing at once, and its retry carries a mac2 that B's checker accepts for
/// A's address, and for no other.
#[test]
fn a_cookie_reply_puts_mac2_on_the_next_initiation() {
    use cyphonic_crypto::CookieSecret;
    use cyphonic_session::CookieChecker;
    let mut p = Setup::new(48).build(Instant::now());
    let now = p.now;
    let a_addr = p.a.addr;
    let mut checker = CookieChecker::new(
        (&p.b.identity.public_key(), cyphonic_wire::Versions::OURS),
        CookieSecret::random().unwrap(),
        now,
    );
    p.a.peer.initiate(now).unwrap();
    let init = p.a.peer.poll_transmit().unwrap().frame;
    assert!(checker.check_mac1(&init));
    assert!(!checker.check_mac2(&init, a_addr, now), "no cookie yet");
    let reply = checker.reply(&init, a_addr, now).unwrap();
    // Forged (a flipped bit), or for another index: refused, nothing learnt.
    let mut forged = reply.clone();
    forged[40] ^= 1;
    assert_eq!(
        p.a.peer.handle_cookie_reply(now, &forged),
        Err(HandshakeError::Cookie)
    );
    let mut elsewhere = reply.clone();
    elsewhere[7] ^= 1;
    assert!(matches!(
        p.a.peer.handle_cookie_reply(now, &elsewhere),
        Err(HandshakeError::UnknownIndex(_))
    ));
    // Sealed to another initiation's mac1 (the attacker's own, to A's index): refused.
    let mut other = init.clone();
    let mac1_at = other.len() - 2 * MAC_LEN;
    other[mac1_at] ^= 1;
    let reply_to_other = checker.reply(&other, a_addr, now).unwrap();
    assert_eq!(
        p.a.peer.handle_cookie_reply(now, &reply_to_other),
        Err(HandshakeError::Cookie)
    );
    p.a.peer.handle_cookie_reply(now, &reply).unwrap();
    assert!(p.a.peer.poll_transmit().is_none(), "no resend at once");
    let retry = p.a.peer.poll_timeout().unwrap();
    p.a.peer.handle_timeout(retry);
    let again = p.a.peer.poll_transmit().unwrap().frame;
    assert_eq!(again[1], u8::from(MessageType::HandshakeInit));
    assert!(checker.check_mac1(&again));
    assert!(checker.check_mac2(&again, a_addr, retry));
    assert!(!checker.check_mac2(&again, ADDR_B.parse().unwrap(), retry));
}

/// A Raspberry Pi has no real-time clock: A starts believing it is 1970, so B's certificate
/// is "not yet valid" and A's handshakes fail. Once the wall clock is set (NTP) and the
/// driver tells the clock (`Clock::follow`), A's next attempt completes. The clock only moves
/// forward, and A's handshake timestamps keep increasing through the change.
#[test]
fn a_wall_clock_set_after_start_is_followed() {
    let mut p = Setup::new(49).build(Instant::now());
    let early = cyphonic_session::Clock::new(p.now, Duration::from_secs(1_000));
    let a_config = cyphonic_session::PeerConfig::from_certificate(
        p.b.identity.certificate(),
        Some(ADDR_B.parse().unwrap()),
    );
    p.a.peer = cyphonic_session::Peer::new(
        1,
        p.a.identity.clone(),
        cyphonic_session::Indices::new(),
        a_config,
        Timing::default(),
        early.clone(),
        cyphonic_crypto::Backend::Ring,
    );
    p.a.peer.initiate(p.now).unwrap();
    p.drive(SEC / 2);
    assert!(!p.a.peer.is_established(p.now));
    assert!(
        p.a.handshake_errors
            .iter()
            .any(|e| e.kind() == "cert_not_yet_valid"),
        "{:?}",
        p.a.handshake_errors
    );
    // NTP sets the clock. A wall clock behind the mapping, or within a second of it, changes
    // nothing; the real time moves every copy of the clock forward.
    let since = p.now - early.origin();
    assert_eq!(early.follow(p.now, Duration::from_secs(999) + since), None);
    assert_eq!(
        early.follow(p.now, Duration::from_millis(1_500) + since),
        None
    );
    let wall = Duration::from_secs(T0) + since;
    assert!(early.follow(p.now, wall).is_some());
    assert_eq!(early.unix_secs(p.now), wall.as_secs());
    assert_eq!(
        early.follow(p.now, Duration::from_secs(1_000) + since),
        None,
        "never back"
    );
    assert_eq!(early.unix_secs(p.now), wall.as_secs());
    p.drive(10 * SEC);
    assert!(p.a.peer.is_established(p.now), "{:?}", p.a.handshake_errors);
}

/// docs/protocol.md §2, *Known peers first*: the hint of A's initiation is one of those B's
/// peer of A expects, the clock moved by up to an epoch either way still matches, and an
/// initiation from any other key to B (here: anyone's, through `init_frame`) shows none of
/// them.
#[test]
fn an_initiation_carries_the_hint_its_responder_expects_of_that_peer() {
    let mut p = Setup::new(49).build(Instant::now());
    let now = p.now;
    p.a.peer.initiate(now).unwrap();
    let init = p.a.peer.poll_transmit().unwrap().frame;
    let hint = cyphonic_session::initiation_hint(&init).unwrap();
    let expected = p.b.peer.known_hints(now).unwrap();
    assert_eq!(expected[1], hint, "the hint of B's own epoch");
    assert_ne!(expected[0], hint);
    assert_ne!(expected[2], hint);
    // Two minutes later, B still knows the hint A made (the epoch before), and A's next hint
    // is one B already expected now.
    let later = now + Duration::from_secs(cyphonic_crypto::cookie::HINT_EPOCH_SECS);
    assert!(p.b.peer.known_hints(later).unwrap().contains(&hint));
    // What B expects of A is not what A expects of B (the hints are one-way).
    assert!(!p.a.peer.known_hints(now).unwrap().contains(&hint));
    // Another key's initiation to B carries no hint B expects of A.
    let stranger = cyphonic_crypto::StaticKeypair::generate().unwrap();
    let forged = init_frame(&stranger, &p.b.identity.public_key(), 7, &[0; 64]).unwrap();
    let theirs = cyphonic_session::initiation_hint(&forged).unwrap();
    assert!(!expected.contains(&theirs));
}

/// Members of releases a version apart (docs/protocol.md §2, *Versions*): each session runs
/// in the newest version both speak as the initiator was told, or the initiator's oldest;
/// the responder answers in the initiation's; a peer told to be apart gets no initiation.
#[test]
fn mixed_releases_meet_in_a_version_both_speak() {
    use cyphonic_wire::Versions;
    let now = VERSION;
    let next = VERSION + 1;
    let range = |oldest, newest| Versions::new(oldest, newest).unwrap();
    // The setup's two identities, speaking `a` and `b`.
    let speaking = |mut setup: Setup, a: Versions, b: Versions| {
        use std::sync::Arc;
        let speaks = |i: Arc<cyphonic_session::Identity>, v| {
            Arc::new(Arc::into_inner(i).unwrap().with_versions(v))
        };
        setup.a_identity = speaks(setup.a_identity, a);
        setup.b_identity = speaks(setup.b_identity, b);
        setup
    };
    // (A speaks, B speaks, what A is told of B, the session's version).
    let cases = [
        (
            range(now, next),
            range(now, now),
            Some(range(now, now)),
            now,
        ),
        (range(now, next), range(now, now), None, now),
        (
            range(now, next),
            range(now, next),
            Some(range(now, next)),
            next,
        ),
        (range(now, next), range(now, next), None, now),
        (
            range(now, now),
            range(now, next),
            Some(range(now, next)),
            now,
        ),
        (
            range(next, next),
            range(now, next),
            Some(range(now, next)),
            next,
        ),
    ];
    for (a, b, told, version) in cases {
        let mut setup = speaking(Setup::new(7), a, b);
        setup.a_config.versions = told;
        let mut p = setup.build(Instant::now());
        p.connect(Side::A);
        let case = format!("A {a}, B {b}, A told {told:?}");
        assert_eq!(p.a.peer.session_version(p.now), Some(version), "{case}");
        p.send(Side::A, b"ping").unwrap();
        p.send(Side::B, b"pong").unwrap();
        p.drive(SEC);
        assert_eq!(p.b.delivered, vec![b"ping".to_vec()], "{case}");
        assert_eq!(p.a.delivered, vec![b"pong".to_vec()], "{case}");
        assert_eq!(p.b.peer.session_version(p.now), Some(version), "{case}");
    }
    // Told the peer is a release too far: no initiation, and the error says why.
    let mut setup = speaking(Setup::new(7), range(now, now), range(next, next));
    setup.a_config.versions = Some(range(next, next));
    let mut p = setup.build(Instant::now());
    assert_eq!(
        p.a.peer.initiate(p.now),
        Err(HandshakeError::NoCommonVersion {
            ours: range(now, now),
            theirs: range(next, next)
        })
    );
    assert_eq!(p.send(Side::A, b"ping"), Err(SendError::Unreachable));
    p.drive(SEC);
    assert!(p.b.handshake_errors.is_empty() && p.b.events.is_empty());
    // Told wrong (the peer is older than the cloud said): its end drops the initiation as a
    // version it does not speak, and no keys exist.
    let mut setup = speaking(Setup::new(7), range(now, next), range(now, now));
    setup.a_config.versions = Some(range(now, next));
    let mut p = setup.build(Instant::now());
    p.connect(Side::A);
    assert_eq!(p.a.peer.session_version(p.now), None);
    assert!(
        p.b.handshake_errors
            .iter()
            .all(|e| *e == HandshakeError::Frame(cyphonic_wire::Error::Version(next))),
        "{:?}",
        p.b.handshake_errors
    );
    assert!(!p.b.handshake_errors.is_empty());
}

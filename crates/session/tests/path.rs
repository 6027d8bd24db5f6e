//! Path frames and the relay-aware roaming of docs/protocol.md §4, *Back to direct*: a path
//! message moves nothing but the replay window, and relayed frames do not pull a pair off a
//! direct path that just carried a frame.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cyphonic_session::sim::*;
use cyphonic_session::{DIRECT_HOLD, Event, PathMsg, RecvError};

const SEC: Duration = Duration::from_secs(1);

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Two established peers, the network drained.
fn established() -> Pair {
    let mut p = Setup::new(7).build(Instant::now());
    p.connect(Side::A);
    assert!(p.a.peer.is_established(p.now) && p.b.peer.is_established(p.now));
    p.drive(SEC);
    p
}

#[test]
fn a_path_message_opens_once_and_moves_no_endpoint() {
    let mut p = established();
    let now = p.now;
    let elsewhere = addr("192.0.2.77:40000");
    let ping =
        p.a.peer
            .path_transmit(now, &PathMsg::Ping(42), elsewhere)
            .unwrap();
    assert_eq!(ping.destination, elsewhere);
    let before = p.b.peer.endpoint();
    let mut frame = ping.frame.clone();
    assert_eq!(p.b.peer.open_path(now, &mut frame), Ok(PathMsg::Ping(42)));
    // Authenticated, from an address B never saw: still no roaming, no event.
    assert_eq!(p.b.peer.endpoint(), before);
    assert!(p.b.peer.poll_event().is_none());
    // Its counter is spent: the same frame again is a replay.
    let mut again = ping.frame.clone();
    assert!(matches!(
        p.b.peer.open_path(now, &mut again),
        Err(RecvError::Replay(_))
    ));
    // The data path does not take it, nor the path opener a keepalive.
    let mut as_data =
        p.a.peer
            .path_transmit(now, &PathMsg::Pong(1), elsewhere)
            .unwrap()
            .frame;
    assert!(matches!(
        p.b.peer.decapsulate(now, elsewhere, &mut as_data),
        Err(RecvError::WrongType(_))
    ));
    // A flipped bit does not open.
    let mut forged =
        p.a.peer
            .path_transmit(now, &PathMsg::Ping(9), elsewhere)
            .unwrap()
            .frame;
    let last = forged.len() - 1;
    forged[last] ^= 1;
    assert!(matches!(
        p.b.peer.open_path(now, &mut forged),
        Err(RecvError::Auth(_))
    ));
}

#[test]
fn relayed_frames_do_not_pull_a_direct_pair_back_until_the_direct_path_is_quiet() {
    let mut p = established();
    let relay = addr("192.0.2.10:40001");
    let direct = p.b.peer.endpoint().unwrap();
    p.b.peer.set_relay(Some(relay));
    assert!(!p.b.peer.is_relayed());
    let sealed = |p: &mut Pair| {
        let now = p.now;
        let mut buf = vec![0u8; 64];
        let n = p.a.peer.encapsulate(now, b"x", &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    // A direct frame, then one through the relay within the hold: B stays direct.
    let mut f = sealed(&mut p);
    let now = p.now;
    p.b.peer.decapsulate(now, direct, &mut f).unwrap();
    p.now += DIRECT_HOLD - SEC;
    let mut f = sealed(&mut p);
    let now = p.now;
    p.b.peer.decapsulate(now, relay, &mut f).unwrap();
    assert_eq!(p.b.peer.endpoint(), Some(direct));
    // The direct path quiet for the hold: the relay's next frame moves B there.
    p.now += DIRECT_HOLD;
    let mut f = sealed(&mut p);
    let now = p.now;
    p.b.peer.decapsulate(now, relay, &mut f).unwrap();
    assert_eq!(p.b.peer.endpoint(), Some(relay));
    assert!(p.b.peer.is_relayed());
    // A direct frame always moves it (the peer went direct).
    let mut f = sealed(&mut p);
    let now = p.now;
    p.b.peer.decapsulate(now, direct, &mut f).unwrap();
    assert_eq!(p.b.peer.endpoint(), Some(direct));
}

#[test]
fn moving_direct_sends_a_keepalive_there_and_says_so() {
    let mut p = established();
    let relay = addr("192.0.2.10:40001");
    let now = p.now;
    p.a.peer.set_relay(Some(relay));
    p.a.peer.redirect(relay, now).unwrap();
    assert!(p.a.peer.is_relayed());
    while p.a.peer.poll_event().is_some() {}
    while p.a.peer.poll_transmit().is_some() {}
    let direct = addr(ADDR_B);
    p.a.peer.move_direct(direct, now);
    assert!(!p.a.peer.is_relayed());
    assert_eq!(p.a.peer.endpoint(), Some(direct));
    assert_eq!(
        p.a.peer.poll_event(),
        Some(Event::EndpointChanged {
            old: Some(relay),
            new: direct
        })
    );
    let t = p.a.peer.poll_transmit().unwrap();
    assert_eq!(t.destination, direct);
    let mut frame = t.frame;
    let now = p.now;
    // B opens it as a keepalive from A's address.
    assert!(p.b.peer.decapsulate(now, addr(ADDR_A), &mut frame).is_ok());
}

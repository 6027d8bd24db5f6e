//! Two stacks against each other on a virtual clock: what one transmits the other receives,
//! unless the link drops it.

use super::*;

/// Our node, 100.64.3.1, and a far end, 100.64.1.5, in 100.64.0.0/10.
fn addresses(last: [u8; 2]) -> Addresses {
    Addresses {
        vip: Ipv4Addr::new(100, 64, last[0], last[1]),
        overlay: Ipv4Net::new(Ipv4Addr::new(100, 64, 0, 0), 10).unwrap_or_default(),
        ipv6: None,
    }
}

const FAR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(100, 64, 1, 5)), 8080);

/// Two stacks, a clock, and a link that drops every `drop_every`th packet (0: none) or
/// everything (`cut`).
struct Pair {
    near: Stack,
    far: Stack,
    now: Instant,
    sent: u64,
    drop_every: u64,
    cut: bool,
}

impl Pair {
    fn new(limits: Limits) -> Self {
        let now = Instant::now();
        Self {
            near: Stack::new(addresses([3, 1]), 1420, limits, now),
            far: Stack::new(addresses([1, 5]), 1420, limits, now),
            now,
            sent: 0,
            drop_every: 0,
            cut: false,
        }
    }

    /// Polls both, carries what they made across, and moves the clock on by 1 ms.
    fn step(&mut self) {
        self.near.poll(self.now);
        self.far.poll(self.now);
        for near_to_far in [true, false] {
            loop {
                let (src, dst) = if near_to_far {
                    (&mut self.near, &mut self.far)
                } else {
                    (&mut self.far, &mut self.near)
                };
                let Some(p) = src.transmit() else { break };
                self.sent += 1;
                let lost =
                    self.cut || (self.drop_every > 0 && self.sent.is_multiple_of(self.drop_every));
                if !lost {
                    dst.receive(p);
                }
            }
        }
        self.now += Duration::from_millis(1);
    }

    /// Steps until `done` holds, at most `limit` times; whether it did.
    fn until(&mut self, limit: usize, mut done: impl FnMut(&mut Self) -> bool) -> bool {
        for _ in 0..limit {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }
}

/// A connection from the near stack to a listener on the far one, open.
fn opened(p: &mut Pair) -> (Conn, Conn) {
    let server = p.far.listen(FAR.port());
    let client = p.near.connect(FAR, p.now);
    let (Ok(server), Ok(client)) = (server, client) else {
        panic!("{server:?} {client:?}");
    };
    assert_eq!(p.near.phase(client), Some(Phase::Opening));
    assert!(p.until(100, |p| p.near.phase(client) == Some(Phase::Open)
        && p.far.phase(server) == Some(Phase::Open)));
    assert_eq!(
        p.far.remote(server).map(|a| a.ip()),
        Some(IpAddr::V4(Ipv4Addr::new(100, 64, 3, 1)))
    );
    (client, server)
}

/// `len` bytes of a pattern that shifts with `seed`.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from(i % 251).unwrap_or(0) ^ seed)
        .collect()
}

/// Moves `a` from `near` to `far` and `b` the other way at once, both finishing with a FIN,
/// and checks that each side read exactly what the other sent.
fn exchange(p: &mut Pair, (client, server): (Conn, Conn), a: &[u8], b: &[u8]) {
    let (mut sent_a, mut sent_b) = (0, 0);
    let (mut got_at_far, mut got_at_near) = (Vec::new(), Vec::new());
    let mut buf = vec![0; 4096];
    let finished = p.until(200_000, |p| {
        sent_a += p.near.send(client, &a[sent_a..]);
        sent_b += p.far.send(server, &b[sent_b..]);
        if sent_a == a.len() {
            p.near.close(client);
        }
        if sent_b == b.len() {
            p.far.close(server);
        }
        loop {
            let n = p.far.recv(server, &mut buf);
            got_at_far.extend_from_slice(&buf[..n]);
            let m = p.near.recv(client, &mut buf);
            got_at_near.extend_from_slice(&buf[..m]);
            if n == 0 && m == 0 {
                break;
            }
        }
        p.far.finished(server) && p.near.finished(client)
    });
    assert!(
        finished,
        "{} of {} and {} of {}",
        got_at_far.len(),
        a.len(),
        got_at_near.len(),
        b.len()
    );
    assert!(got_at_far == a && got_at_near == b, "the bytes differ");
}

/// Bytes cross both ways at once, intact and in order, and both ends see the other finish;
/// released, the connections leave the table.
#[test]
fn bytes_cross_both_ways_and_the_connection_closes() {
    let mut p = Pair::new(Limits::default());
    let conns = opened(&mut p);
    let (a, b) = (pattern(1 << 20, 1), pattern(300_000, 2));
    exchange(&mut p, conns, &a, &b);
    assert!(
        p.until(1000, |p| p.near.phase(conns.0) == Some(Phase::Closed)
            || p.near.phase(conns.0).is_none())
    );
    p.near.release(conns.0, p.now);
    p.far.release(conns.1, p.now);
    assert!(p.until(6000, |p| p.near.connections() == 0
        && p.far.connections() == 0));
    assert_eq!((p.near.stats().opened, p.far.stats().opened), (1, 1));
}

/// A link that loses one packet in nine still delivers every byte in order: TCP sends
/// again on the stack's own timers, which run on the clock the caller gives.
#[test]
fn a_lossy_link_loses_no_bytes() {
    let mut p = Pair::new(Limits::default());
    p.drop_every = 9;
    let conns = opened(&mut p);
    let (a, b) = (pattern(200_000, 3), pattern(50_000, 4));
    exchange(&mut p, conns, &a, &b);
}

/// Nothing listening: the far end's reset makes the opening `Refused`; no answer at all:
/// `TimedOut` once the connect timeout passed, not before.
#[test]
fn an_opening_is_refused_or_times_out() {
    let limits = Limits::default();
    let mut p = Pair::new(limits);
    let refused = p.near.connect(FAR, p.now).unwrap_or(Conn(u64::MAX));
    assert!(p.until(100, |p| p.near.phase(refused) == Some(Phase::Refused)));

    p.cut = true;
    let start = p.now;
    let silent = p.near.connect(FAR, p.now).unwrap_or(Conn(u64::MAX));
    assert!(p.until(20_000, |p| p.near.phase(silent) != Some(Phase::Opening)));
    assert_eq!(p.near.phase(silent), Some(Phase::TimedOut));
    let waited = p.now - start;
    assert!(
        waited >= limits.connect_timeout
            && waited < limits.connect_timeout + Duration::from_millis(50),
        "{waited:?}"
    );
    // The wake-up the driver is given brings the deadline, not later.
    let mut q = Pair::new(limits);
    let c = q.near.connect(FAR, q.now).unwrap_or(Conn(u64::MAX));
    q.near.poll(q.now);
    assert!(
        q.near
            .poll_delay(q.now)
            .is_some_and(|d| d <= limits.connect_timeout)
    );
    assert_eq!(q.near.phase(c), Some(Phase::Opening));
}

/// Released while carrying bytes, a connection is reset: the far end sees it closed.
#[test]
fn a_released_open_connection_resets_the_far_end() {
    let mut p = Pair::new(Limits::default());
    let (client, server) = opened(&mut p);
    p.near.release(client, p.now);
    assert!(p.until(100, |p| p.far.phase(server) == Some(Phase::Closed)));
    assert_eq!(p.near.phase(client), None);
    assert!(p.far.finished(server));
}

/// Only overlay addresses that are not ours; at most `connections` at once (a full table
/// says so and is counted); no port 0. A released connection frees its place.
#[test]
fn connections_are_bounded_and_only_into_the_overlay() {
    let limits = Limits {
        connections: 3,
        ..Limits::default()
    };
    let mut p = Pair::new(limits);
    let at = |ip: [u8; 4], port| SocketAddr::from((ip, port));
    for (to, why) in [
        (at([192, 0, 2, 1], 80), ConnectError::NotOverlay),
        (at([100, 64, 3, 1], 80), ConnectError::NotOverlay),
        (at([100, 128, 0, 1], 80), ConnectError::NotOverlay),
        (at([100, 64, 1, 5], 0), ConnectError::Unaddressable),
    ] {
        assert_eq!(p.near.connect(to, p.now), Err(why), "{to}");
    }
    let v6: SocketAddr = "[fd7a::5]:80".parse().unwrap_or(FAR);
    assert_eq!(p.near.connect(v6, p.now), Err(ConnectError::NotOverlay));
    let first = p.near.connect(FAR, p.now);
    assert!(first.is_ok());
    assert!(p.near.connect(FAR, p.now).is_ok());
    assert!(p.near.listen(9).is_ok());
    assert_eq!(p.near.connect(FAR, p.now), Err(ConnectError::Full));
    assert_eq!(p.near.listen(10), Err(ConnectError::Full));
    assert_eq!(p.near.stats().refused_full, 2);
    p.near.release(first.unwrap_or(Conn(0)), p.now);
    p.step();
    assert_eq!(p.near.connections(), 2);
    assert!(p.near.connect(FAR, p.now).is_ok());
}

/// The receive queue holds `queued` packets; more are dropped and counted.
#[test]
fn the_receive_queue_is_bounded() {
    let limits = Limits {
        queued: 4,
        ..Limits::default()
    };
    let mut s = Stack::new(addresses([3, 1]), 1420, limits, Instant::now());
    let taken: Vec<bool> = (0..6).map(|_| s.receive(vec![0x45; 20])).collect();
    assert_eq!(taken, [true, true, true, true, false, false]);
    assert_eq!((s.stats().received, s.stats().dropped_queue_full), (4, 2));
}

/// Echo requests to our vIP are answered (a peer's ping), and garbage is ignored.
#[test]
fn pings_are_answered_and_garbage_is_not() {
    let mut s = Stack::new(addresses([3, 1]), 1420, Limits::default(), Instant::now());
    let ping = echo_request(Ipv4Addr::new(100, 64, 1, 5), Ipv4Addr::new(100, 64, 3, 1));
    for junk in [vec![], vec![0x45], vec![0x60; 39], vec![0xff; 100]] {
        s.receive(junk);
    }
    s.receive(ping);
    s.poll(Instant::now());
    let reply = s.transmit().unwrap_or_default();
    assert_eq!(reply.get(16..20), Some(&[100, 64, 1, 5][..]), "{reply:?}");
    assert_eq!(reply.get(20), Some(&0), "an echo reply");
    assert_eq!(s.transmit(), None);
}

/// The far end's end is reported only once everything it sent was read: a driver that
/// closes its client at `finished` loses nothing.
#[test]
fn finished_waits_for_the_last_byte_to_be_read() {
    let mut p = Pair::new(Limits::default());
    let (client, server) = opened(&mut p);
    let sent = p.far.send(server, b"last words");
    assert_eq!(sent, 10);
    p.far.close(server);
    // The bytes and the FIN arrive (and are acknowledged) well within 50 ms.
    for _ in 0..50 {
        p.step();
    }
    assert!(!p.near.finished(client));
    let mut buf = [0; 32];
    assert_eq!(p.near.recv(client, &mut buf), 10);
    assert!(p.near.finished(client));
}

/// An ICMP echo request from `src` to `dst`, built by smoltcp's wire module.
fn echo_request(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{Icmpv4Packet, Icmpv4Repr, IpProtocol, Ipv4Packet, Ipv4Repr};
    let icmp = Icmpv4Repr::EchoRequest {
        ident: 0x1234,
        seq_no: 1,
        data: b"ping",
    };
    let ip = Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Icmp,
        payload_len: icmp.buffer_len(),
        hop_limit: 64,
    };
    let caps = ChecksumCapabilities::default();
    let mut bytes = vec![0; ip.buffer_len() + icmp.buffer_len()];
    let mut packet = Ipv4Packet::new_unchecked(&mut bytes);
    ip.emit(&mut packet, &caps);
    icmp.emit(
        &mut Icmpv4Packet::new_unchecked(packet.payload_mut()),
        &caps,
    );
    bytes
}

/// UDP between the two stacks: datagrams cross both ways with their senders; nothing goes
/// outside the overlay or to ourselves; a port opens once.
#[test]
fn udp_datagrams_cross_with_their_senders() {
    let mut p = Pair::new(Limits::default());
    let (Ok(near), Ok(far)) = (p.near.udp_bind(53), p.far.udp_bind(53)) else {
        panic!("bind");
    };
    assert_eq!(p.near.udp_bind(53), Err(ConnectError::Unaddressable));
    assert_eq!(p.near.udp_bind(0), Err(ConnectError::Unaddressable));
    let at = |ip: [u8; 4], port| SocketAddr::from((ip, port));
    assert!(p.near.udp_send(near, at([100, 64, 1, 5], 53), b"question"));
    assert!(!p.near.udp_send(near, at([192, 0, 2, 1], 53), b"out"));
    assert!(!p.near.udp_send(near, at([100, 64, 3, 1], 53), b"me"));
    let mut got = None;
    assert!(p.until(50, |p| {
        got = got.take().or_else(|| p.far.udp_recv(far));
        got.is_some()
    }));
    assert_eq!(got, Some((b"question".to_vec(), at([100, 64, 3, 1], 53))));
    assert!(p.far.udp_send(far, at([100, 64, 3, 1], 53), b"answer"));
    let mut back = None;
    assert!(p.until(50, |p| {
        back = back.take().or_else(|| p.near.udp_recv(near));
        back.is_some()
    }));
    assert_eq!(back, Some((b"answer".to_vec(), at([100, 64, 1, 5], 53))));
    assert_eq!(p.far.udp_recv(far), None);
}

//! A deterministic two-peer simulator: a fake clock, a seeded network with loss, latency and
//! reordering, and a minimal driver for each side. No sleeps, no sockets, no threads. For the
//! simulation tests (tests/sim.rs) and the fuzz targets; not for production use.

#![allow(
    missing_debug_implementations,
    missing_docs,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::missing_panics_doc,
    clippy::must_use_candidate
)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{
    Clock, Event, HandshakeError, Identity, IncomingInit, Indices, Peer, PeerConfig, Received,
    RecvError, SendError, Timing, read_init,
};
use cyphonic_crypto::{
    Backend, Certificate, CertificateAuthority, IssueRequest, RevocationList, StaticKeypair,
    TrustStore,
};
use cyphonic_wire::{Frame, MessageType};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Unix time at the simulator's origin (2027-01-15).
pub const T0: u64 = 1_800_000_000;
pub const DAY: u64 = 24 * 3600;

pub fn net(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

pub fn test_ca() -> CertificateAuthority {
    CertificateAuthority::generate(
        "ovl.example",
        &[net("100.64.0.0/10")],
        T0 - 365 * DAY,
        T0 + 365 * DAY,
    )
    .unwrap()
}

/// A node identity: key pair, certificate for `name` and `block`, trust in `ca`.
pub struct NodeKeys {
    pub keypair: StaticKeypair,
    pub cert: Certificate,
}

pub fn node_keys(ca: &CertificateAuthority, name: &str, block: &str) -> NodeKeys {
    let keypair = StaticKeypair::generate().unwrap();
    let cert = ca
        .issue(&IssueRequest {
            name: name.into(),
            vip_blocks: vec![net(block)],
            public_key: keypair.public().0,
            groups: vec!["test".into()],
            not_before: T0 - DAY,
            not_after: T0 + 30 * DAY,
        })
        .unwrap();
    NodeKeys { keypair, cert }
}

pub fn identity(
    keys: NodeKeys,
    ca: &CertificateAuthority,
    revoked: RevocationList,
) -> Arc<Identity> {
    let trust = TrustStore::new(vec![ca.certificate().clone()], revoked).unwrap();
    Arc::new(Identity::new(keys.keypair, keys.cert, trust, T0).unwrap())
}

#[derive(Debug, Clone)]
pub struct Packet {
    pub from: SocketAddr,
    pub to: SocketAddr,
    pub frame: Vec<u8>,
}

/// A lossy, reordering network: every packet gets `latency + U(0, jitter)` of delay, so
/// packets overtake each other whenever jitter exceeds their spacing.
pub struct Net {
    rng: SmallRng,
    pub loss: f64,
    pub latency: Duration,
    pub jitter: Duration,
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    packets: std::collections::HashMap<u64, Packet>,
    seq: u64,
    /// Every packet ever handed to the network, in send order (for replay tests).
    pub log: Vec<Packet>,
    pub dropped: u64,
    /// When set, packets are dropped whatever `loss` says (a partition).
    pub partitioned: bool,
}

impl Net {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: SmallRng::seed_from_u64(seed),
            loss: 0.0,
            latency: Duration::from_millis(5),
            jitter: Duration::ZERO,
            queue: BinaryHeap::new(),
            packets: Default::default(),
            seq: 0,
            log: Vec::new(),
            dropped: 0,
            partitioned: false,
        }
    }

    pub fn send(&mut self, now: Instant, p: Packet) -> bool {
        self.log.push(p.clone());
        if self.partitioned || (self.loss > 0.0 && self.rng.random_bool(self.loss)) {
            self.dropped += 1;
            return false;
        }
        let jitter = if self.jitter.is_zero() {
            Duration::ZERO
        } else {
            self.jitter.mul_f64(self.rng.random::<f64>())
        };
        self.seq += 1;
        self.queue
            .push(Reverse((now + self.latency + jitter, self.seq)));
        self.packets.insert(self.seq, p);
        true
    }

    pub fn next_delivery(&self) -> Option<Instant> {
        self.queue.peek().map(|Reverse((t, _))| *t)
    }

    pub fn pop_due(&mut self, now: Instant) -> Option<Packet> {
        match self.queue.peek() {
            Some(Reverse((t, _))) if *t <= now => {
                let Reverse((_, id)) = self.queue.pop().unwrap();
                self.packets.remove(&id)
            }
            _ => None,
        }
    }
}

/// One simulated node: a peer object and what the driver observed.
pub struct Node {
    pub identity: Arc<Identity>,
    pub peer: Peer,
    pub addr: SocketAddr,
    pub delivered: Vec<Vec<u8>>,
    pub keepalives: u64,
    pub events: Vec<Event>,
    pub handshake_errors: Vec<HandshakeError>,
    pub recv_errors: Vec<RecvError>,
}

impl Node {
    pub fn established_count(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::Established { .. }))
            .count()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

pub struct Pair {
    pub now: Instant,
    pub clock: Clock,
    pub a: Node,
    pub b: Node,
    pub net: Net,
}

pub const ADDR_A: &str = "198.51.100.1:51820";
pub const ADDR_B: &str = "203.0.113.2:51820";

/// How to build a pair; the defaults give two mutually expecting static peers.
pub struct Setup {
    pub seed: u64,
    pub timing: Timing,
    pub a_config: PeerConfig,
    pub b_config: PeerConfig,
    pub a_identity: Arc<Identity>,
    pub b_identity: Arc<Identity>,
}

impl Setup {
    pub fn new(seed: u64) -> Self {
        let ca = test_ca();
        let a = node_keys(&ca, "gw1.ovl.example", "100.64.1.0/24");
        let b = node_keys(&ca, "gw2.ovl.example", "100.64.2.0/24");
        let a_config = PeerConfig::from_certificate(&b.cert, Some(ADDR_B.parse().unwrap()));
        let b_config = PeerConfig::from_certificate(&a.cert, Some(ADDR_A.parse().unwrap()));
        Self {
            seed,
            timing: Timing::default(),
            a_config,
            b_config,
            a_identity: identity(a, &ca, RevocationList::default()),
            b_identity: identity(b, &ca, RevocationList::default()),
        }
    }

    /// The pair, its simulated time starting at `origin` (the caller reads the clock: this
    /// crate does not).
    pub fn build(self, origin: Instant) -> Pair {
        let now = origin;
        let clock = Clock::new(now, Duration::from_secs(T0));
        let node =
            |identity: Arc<Identity>, config: PeerConfig, id: u32, addr: &str, backend| Node {
                peer: Peer::new(
                    id,
                    identity.clone(),
                    // Each side is a device of its own, with its own index table.
                    Indices::seeded(self.seed ^ u64::from(id)),
                    config,
                    self.timing,
                    // Each device reads its own clock; all start at the same wall time.
                    Clock::new(now, Duration::from_secs(T0)),
                    backend,
                ),
                identity,
                addr: addr.parse().unwrap(),
                delivered: Vec::new(),
                keepalives: 0,
                events: Vec::new(),
                handshake_errors: Vec::new(),
                recv_errors: Vec::new(),
            };
        Pair {
            now,
            clock,
            // Different backends on the two sides: they must interoperate.
            a: node(self.a_identity, self.a_config, 1, ADDR_A, Backend::Ring),
            b: node(
                self.b_identity,
                self.b_config,
                2,
                ADDR_B,
                Backend::RustCrypto,
            ),
            net: Net::new(self.seed),
        }
    }
}

impl Pair {
    pub fn node(&mut self, side: Side) -> &mut Node {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Seals `payload` on `side` and puts it on the network.
    pub fn send(&mut self, side: Side, payload: &[u8]) -> Result<(), SendError> {
        let now = self.now;
        let node = self.node(side);
        let mut buf = vec![0u8; payload.len() + 32];
        let len = node.peer.encapsulate(now, payload, &mut buf)?;
        buf.truncate(len);
        let (from, to) = (
            node.addr,
            node.peer
                .endpoint()
                .expect("an established peer has an endpoint"),
        );
        self.flush();
        self.net.send(
            now,
            Packet {
                from,
                to,
                frame: buf,
            },
        );
        Ok(())
    }

    /// Moves both peers' transmits and events out.
    pub fn flush(&mut self) {
        let now = self.now;
        for side in [Side::A, Side::B] {
            loop {
                let node = self.node(side);
                let from = node.addr;
                let Some(t) = node.peer.poll_transmit() else {
                    break;
                };
                self.net.send(
                    now,
                    Packet {
                        from,
                        to: t.destination,
                        frame: t.frame,
                    },
                );
            }
            let node = self.node(side);
            while let Some(e) = node.peer.poll_event() {
                node.events.push(e);
            }
        }
    }

    /// Hands a packet to the node it is addressed to, as a driver would.
    pub fn deliver(&mut self, p: Packet) {
        let now = self.now;
        let unix = self.clock.unix_secs(now);
        let side = if p.to == self.a.addr {
            Side::A
        } else if p.to == self.b.addr {
            Side::B
        } else {
            return; // addressed elsewhere (an old endpoint): lost
        };
        let node = self.node(side);
        let mut frame = p.frame;
        let ty = Frame::new_checked(&frame[..]).map(|f| f.msg_type());
        match ty {
            Ok(MessageType::HandshakeInit) => {
                match read_init(&node.identity, unix, &frame)
                    .and_then(|init| node.peer.handle_init(now, p.from, init))
                {
                    Ok(()) => {}
                    Err(e) => node.handshake_errors.push(e),
                }
            }
            Ok(MessageType::HandshakeResp) => {
                if let Err(e) = node.peer.handle_response(now, p.from, &frame) {
                    node.handshake_errors.push(e);
                }
            }
            _ => match node.peer.decapsulate(now, p.from, &mut frame) {
                Ok(Received::Data(d)) => node.delivered.push(d.to_vec()),
                Ok(Received::Keepalive) => node.keepalives += 1,
                Err(e) => node.recv_errors.push(e),
            },
        }
        self.flush();
    }

    /// Advances to the next thing that happens (a delivery or a timer) before `limit`, and
    /// does it. Returns false when nothing is due before `limit`.
    pub fn step(&mut self, limit: Instant) -> bool {
        self.flush();
        let next = [
            self.net.next_delivery(),
            self.a.peer.poll_timeout(),
            self.b.peer.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(t) = next.filter(|t| *t <= limit) else {
            self.now = self.now.max(limit);
            return false;
        };
        self.now = self.now.max(t);
        while let Some(p) = self.net.pop_due(self.now) {
            self.deliver(p);
        }
        for side in [Side::A, Side::B] {
            let now = self.now;
            let node = self.node(side);
            if node.peer.poll_timeout().is_some_and(|t| t <= now) {
                node.peer.handle_timeout(now);
            }
        }
        self.flush();
        true
    }

    /// Runs everything due in the next `d`.
    pub fn drive(&mut self, d: Duration) {
        let limit = self.now + d;
        while self.step(limit) {}
    }

    /// Starts a handshake from `side` and runs until both sides have keys (or 10 s pass).
    pub fn connect(&mut self, side: Side) {
        let now = self.now;
        self.node(side).peer.initiate(now).unwrap();
        self.drive(Duration::from_secs(10));
    }
}

/// A handshake-init as anyone holding `noise_key` can build it: Noise IK message 1 to
/// `responder` around any `payload` (the real one is index, timestamp, certificate), with
/// `header_index` in the clear header and both MACs sealed for `responder` (docs/protocol.md
/// §2). What reaches `read_init` past the MAC check.
pub fn init_frame(
    noise_key: &StaticKeypair,
    responder: &cyphonic_crypto::PublicKey,
    header_index: u32,
    payload: &[u8],
) -> Option<Vec<u8>> {
    let mut state =
        cyphonic_crypto::noise::initiator(noise_key, responder, crate::handshake::PROLOGUE).ok()?;
    let mut frame = crate::handshake::write_frame(
        &mut state,
        (MessageType::HandshakeInit, cyphonic_wire::VERSION),
        header_index,
        payload,
    )
    .ok()?;
    crate::cookie::seal_macs(&mut frame, &cyphonic_crypto::MacKeys::new(responder), None);
    Some(frame)
}

/// A handshake-resp as the responder of `init` can build it: Noise IK message 2 around any
/// `payload` (the real one is index, certificate), to `receiver_index` (the initiator's), MACs
/// sealed for the initiator.
pub fn response_frame(init: IncomingInit, receiver_index: u32, payload: &[u8]) -> Option<Vec<u8>> {
    let (remote, version) = (init.remote_static, init.version);
    let mut state = init.state;
    let mut frame = crate::handshake::write_frame(
        &mut state,
        (MessageType::HandshakeResp, version),
        receiver_index,
        payload,
    )
    .ok()?;
    crate::cookie::seal_macs(&mut frame, &cyphonic_crypto::MacKeys::new(&remote), None);
    Some(frame)
}

/// A handshake-resp as anyone can forge it without the responder's keys: `noise` (a Noise
/// message that will not decrypt) for `receiver_index`, with mac1 right for `initiator`, whose
/// public key is no secret. What passes the MAC check and reaches the pending handshake.
pub fn forged_response(
    initiator: &cyphonic_crypto::PublicKey,
    receiver_index: u32,
    noise: &[u8],
) -> Vec<u8> {
    use cyphonic_wire::{FrameRepr, HEADER_LEN, MAC_LEN};
    let body_len = noise.len() + 2 * MAC_LEN;
    let mut frame = vec![0u8; HEADER_LEN + body_len];
    FrameRepr {
        version: cyphonic_wire::VERSION,
        msg_type: MessageType::HandshakeResp,
        flags: 0,
        receiver_index,
        counter: 0,
        body_len,
    }
    .emit(&mut Frame::new_unchecked(&mut frame[..]));
    frame[HEADER_LEN..HEADER_LEN + noise.len()].copy_from_slice(noise);
    crate::cookie::seal_macs(&mut frame, &cyphonic_crypto::MacKeys::new(initiator), None);
    frame
}

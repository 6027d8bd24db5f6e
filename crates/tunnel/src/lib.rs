//! The tunnel engine that the adapter and the node share: everything between an overlay
//! packet in memory and its encrypted datagram on the underlay, and the control work that
//! keeps tunnels up.
//!
//! ```text
//! edge (AF_PACKET, TUN) -> Submitter -> Sequencer -> SealStage (rayon) -> UdpSink -> UDP
//! UDP -> Receiver -> Sequencer -> OpenStage (rayon) -> edge's sink (Incoming::accept first)
//! control thread: Control (handshakes, peer timers, the cloud, relays) + the edge's services
//! ```
//!
//! The engine owns no interface of its own: the adapter feeds it frames captured on its LAN
//! port, the node packets read from its TUN device, and each delivers what comes out of the
//! tunnel its own way. Packets live in [`pool`] buffers with room for the tunnel header in
//! front of the IP packet ([`HEADROOM`]), so nothing is copied on either path.
//!
//! What it deliberately does not do: parse or judge inner packets (the edges do), read
//! configuration files, or choose threads (the binaries wire them).

#![forbid(unsafe_code)]

pub mod cloud;
pub mod control;
pub mod counters;
pub mod egress;
pub mod engine;
pub mod ingress;
pub mod metrics;
pub mod peers;
pub mod pool;
pub mod status;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

pub use cloud::{Asker, CloudAnswer, CloudLink, CloudSettings, Settled};
pub use control::{Control, Hooks};
pub use counters::{Counters, bump};
pub use egress::{Outgoing, SealStage, Submitter, UdpSink};
pub use engine::{DataPlane, Engine, StartError, StaticPeer, placement, static_peers};
pub use ingress::{Incoming, OpenStage, Receiver};
pub use peers::{PeerSlot, PeerTable, Relay, Route};
pub use pool::{
    BUF_LEN, Buf, ETHERNET_HEADER, FRAME_OFFSET, FRAME_ROOM, PACKET_ROOM, Pool, RECV_BATCH,
    RecvBuffers,
};
pub use upstream::Upstream;

/// Where an outgoing IP packet starts in its buffer: behind room for the tunnel header, which
/// is written in place in front of it.
pub const HEADROOM: usize = cyphonic_wire::HEADER_LEN;

/// Messages from the data threads to the control thread.
#[derive(Debug)]
pub enum ToControl {
    /// A handshake message from the underlay.
    Handshake {
        /// The whole frame.
        frame: Vec<u8>,
        /// Its sender.
        from: SocketAddr,
        /// When it arrived.
        at: Instant,
    },
    /// Traffic for keys we do not have from this peer's address: handshake now.
    Kick(u32),
    /// This host's addresses or routes changed: tell the peers and the cloud where we are.
    NetworkChanged,
}

/// Messages from the control thread to the thread that submits outgoing packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToEgress {
    /// The peer has keys: send what waited for them.
    Established(u32),
    /// The peer cannot be reached: drop what waited for it.
    GaveUp(u32),
}

/// State every thread shares.
#[derive(Debug)]
pub struct Shared {
    /// The peers.
    pub peers: PeerTable,
    /// The engine's counters.
    pub counters: Counters,
    /// Packet buffers.
    pub pool: Pool,
    /// Cleared to stop the data threads.
    pub running: AtomicBool,
    /// To the control thread (bounded; data threads only `try_send`).
    pub control: tokio::sync::mpsc::Sender<ToControl>,
    /// The control plane's part of the status document (null without a cloud).
    pub cloud: Mutex<serde_json::Value>,
    /// Wakes the control thread when a peer's timers changed on a data thread.
    pub notify: tokio::sync::Notify,
    /// Handshake messages refused, by reason (`HandshakeError::kind`, or `not_a_peer`).
    /// Written by the control thread only.
    pub handshake_refusals: Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

impl Shared {
    /// The shared state over `peers`, with at most `buffers` packet buffers; returns the
    /// control thread's end of its channel (`queue` messages deep).
    pub fn new(
        peers: PeerTable,
        buffers: usize,
        queue: usize,
        cloud: serde_json::Value,
    ) -> (Self, tokio::sync::mpsc::Receiver<ToControl>) {
        let (control, rx) = tokio::sync::mpsc::channel(queue);
        (
            Self {
                peers,
                counters: Counters::default(),
                pool: Pool::new(buffers),
                running: AtomicBool::new(true),
                control,
                cloud: Mutex::new(cloud),
                notify: tokio::sync::Notify::new(),
                handshake_refusals: Mutex::new(std::collections::BTreeMap::new()),
            },
            rx,
        )
    }

    /// Wakes the control thread (never blocks).
    pub fn wake_control(&self) {
        self.notify.notify_one();
    }

    /// Whether the data threads should keep running.
    pub fn is_running(&self) -> bool {
        self.running.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every peer as the status document shows it.
    pub fn peers_json(&self, now: Instant) -> Vec<serde_json::Value> {
        use std::sync::atomic::Ordering::Relaxed;
        self.peers
            .all()
            .iter()
            .map(|slot| {
                let relay = slot.route().relay.as_ref().map(|r| {
                    serde_json::json!({
                        "address": r.address.to_string(),
                        "reason": r.reason.describe(),
                    })
                });
                let p = slot.lock();
                serde_json::json!({
                    "name": slot.name,
                    "origin": slot.origin,
                    "route": if relay.is_some() { "relay" } else { "direct" },
                    "relay": relay,
                    "vip_blocks": slot.blocks.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "endpoint": p.endpoint().map(|e| e.to_string()),
                    "established": p.is_established(now),
                    "last_handshake_secs_ago": p.last_handshake().map(|t| now.saturating_duration_since(t).as_secs()),
                    "tx_packets": slot.tx_packets.load(Relaxed),
                    "tx_bytes": slot.tx_bytes.load(Relaxed),
                    "rx_packets": slot.rx_packets.load(Relaxed),
                    "rx_bytes": slot.rx_bytes.load(Relaxed),
                })
            })
            .collect()
    }
}

//! The tunnel engine that the adapter and the node share: the data plane between an overlay
//! packet in memory and its encrypted datagram on the underlay, and the control core that
//! keys it (handshakes, rekeys, keepalives, roaming, relay channels).
//!
//! ```text
//! edge thread (AF_PACKET, TUN) -> Intake -> Submitter -> Sequencer -> SealStage (rayon)
//!                                    -> SocketSink -> TunnelSocket
//! TunnelSocket -> Receiver -> Sequencer -> OpenStage (rayon) -> Incoming::accept -> edge's sink
//! handshake thread: Handshakes (handshake messages from the underlay, answered), behind the
//!                   receive thread's HandshakeGate (mac1, cookies under load, per-source rates)
//! control thread: Control (peer timers, relay channels) -> ControlEvent
//! ```
//!
//! Entry points: [`Engine::start`] (the data threads), [`Control`] (driven by the control
//! thread), [`Intake`] (the way in), [`Accepted`] (what the edge's sink gets: only packets
//! the engine accepted, in order), [`TunnelSocket`] (the seam where the UDP socket, or `testing`'s in-memory link,
//! plugs in).
//!
//! The engine owns no interface of its own: the adapter feeds it frames captured on its LAN
//! port, the node packets read from its TUN device, and each delivers what comes out of the
//! tunnel its own way. Packets live in [`pool`] buffers that return themselves to the pool,
//! with room for the tunnel header in front of the IP packet ([`HEADROOM`]), so nothing is
//! copied on either path.
//!
//! What it deliberately does not do: read inner packets beyond what routing, a flow's name
//! and the policy need (the edges do the rest), talk to the cloud, read configuration
//! files, run an async runtime, or serve status and metrics (`cyphonic-daemon` does all of
//! that around it).

#![forbid(unsafe_code)]

pub mod control;
pub mod counters;
pub mod direct;
pub mod egress;
pub mod engine;
pub mod gate;
pub mod handshakes;
pub mod ingress;
pub mod limit;
pub mod peers;
pub mod policy;
pub mod pool;
pub mod routes;
mod shared;
pub mod socket;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod timers;

use std::net::SocketAddr;
use std::time::Instant;

use cyphonic_crypto::Certificate;

pub use control::{Control, ControlEvent};
pub use counters::{EngineCounters, bump};
pub use cyphonic_pipeline::Aqm;
pub use egress::{Intake, Outgoing, SealStage, SocketSink, SparseSubmitter, Submit, Submitter};
pub use engine::{
    DataPlane, Engine, MAX_SPARSE_THREADS, SparseIntake, SparseWay, StartError, sparse_thread_name,
};
pub use gate::{Admission, HandshakeGate, KnownPeers};
pub use handshakes::{HandshakeMsg, HandshakeQueue, Handshakes};
pub use ingress::{Accepted, Arrival, Incoming, OpenStage, Receiver, arrival};
pub use limit::{RateTable, source_key};
pub use peers::{MAX_CANDIDATES, PeerSlot, PeerTable, Relay, Route, StaticPeer};
pub use policy::{Policy, PolicyReport, PolicySettings};
pub use pool::{
    BUF_LEN, Buf, ETHERNET_HEADER, FRAME_OFFSET, FRAME_ROOM, PACKET_ROOM, Pool, RECV_BATCH,
    RecvBuffers,
};
pub use shared::{Local, MAX_WOKEN, Shared};
pub use socket::TunnelSocket;

/// Where an outgoing IP packet starts in its buffer: behind room for the tunnel header, which
/// is written in place in front of it.
pub const HEADROOM: usize = cyphonic_wire::HEADER_LEN;

/// Messages from the data threads and the handshake thread to the control thread.
#[derive(Debug)]
pub enum ToControl {
    /// A valid node that is not one of our peers sent an initiation
    /// ([`ControlEvent::UnknownPeer`]).
    UnknownPeer {
        /// Its verified certificate.
        certificate: Box<Certificate>,
        /// Where it spoke from.
        from: SocketAddr,
        /// When.
        at: Instant,
    },
    /// Traffic for keys we do not have came from this address: if a peer of ours is there,
    /// handshake with it now (it kept keys we lost). Admitted by `Shared::kick_gate`.
    Kick(SocketAddr),
    /// This host's addresses or routes changed: tell the peers and the cloud where we are.
    NetworkChanged,
    /// A packet for `dst` found no peer while peers evicted for idleness are remembered
    /// ([`Shared::dormant`]): one of them may cover it. Admitted by `Shared::wake_gate`.
    NoRoute(std::net::IpAddr),
    /// A return-routability challenge (docs/protocol.md §4) came from `from`: a relay
    /// channel's, or the cloud's probe port's. Admitted by `Shared::challenge_gate`.
    Challenge {
        /// Its source.
        from: SocketAddr,
        /// Its cookie.
        cookie: cyphonic_control::ReturnCookie,
    },
    /// A path frame (docs/protocol.md §4, *Back to direct*) for a session of peer `peer`,
    /// from `from`, not opened yet. Admitted by `Shared::path_gate`.
    Path {
        /// The peer whose session index it names.
        peer: u32,
        /// Its source.
        from: SocketAddr,
        /// The whole frame.
        frame: Vec<u8>,
    },
}

//! What the adapter's LAN side shares between the threads that run it: the capture thread,
//! the LAN sink at the end of the engine's ingress pipeline, and the LAN services on the
//! control thread. A leaf: it names the messages the data threads hand the services, and
//! imports none of the modules that use it.

use std::net::Ipv4Addr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use cyphonic_gateway::Lan;

use crate::counters::{LanCounters, bump};
use crate::neighbors::LanTable;
use crate::status::Published;

/// Who asked a DNS question, and where its answer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// A device on our LAN.
    Lan {
        /// Its MAC.
        mac: [u8; 6],
        /// Its vIP.
        ip: Ipv4Addr,
        /// Its UDP port.
        port: u16,
    },
    /// A peer adapter (or a device behind it), over the tunnel.
    Peer {
        /// The peer.
        peer: u32,
        /// The asker's address.
        ip: Ipv4Addr,
        /// Its UDP port.
        port: u16,
    },
}

/// Work for the LAN services (DHCP, DNS, the gateway address), on the control thread. A
/// channel of its own, so that a flood from the LAN can never crowd out handshakes.
#[derive(Debug)]
pub enum ToServices {
    /// A DHCP message from the LAN.
    Dhcp {
        /// The Ethernet source.
        mac: [u8; 6],
        /// The UDP payload.
        payload: Vec<u8>,
    },
    /// A DNS message from a device on the LAN to the gateway vIP.
    Dns {
        /// Who asked.
        client: Client,
        /// The UDP payload.
        payload: Vec<u8>,
    },
    /// A packet a peer sent to the gateway vIP (already checked against its blocks).
    FromPeer {
        /// The peer.
        peer: u32,
        /// The decrypted IP packet.
        packet: Vec<u8>,
        /// When it arrived.
        at: Instant,
    },
}

/// DHCP and DNS messages waiting for the control thread at most; more are dropped and counted.
pub const SERVICES_QUEUE: usize = 256;

/// The LAN side's shared state.
#[derive(Debug)]
pub struct LanSide {
    /// The LAN segment: our MAC, the gateway vIP, the block, the router's duties.
    pub lan: Lan,
    /// Who holds which address.
    pub table: LanTable,
    /// The LAN side's counters.
    pub counters: LanCounters,
    /// To the LAN services (bounded; `try_send` only).
    pub to_services: tokio::sync::mpsc::Sender<ToServices>,
    /// Whether the DHCP server runs (otherwise DHCP messages are only counted).
    pub dhcp_on: bool,
    /// Whether the DNS service runs.
    pub dns_on: bool,
    /// What the services publish for the status document and the metrics.
    pub published: Mutex<Published>,
}

impl LanSide {
    /// Hands work to the services, never waiting: a full queue drops it, counted.
    pub fn to_services(&self, msg: ToServices) {
        if self.to_services.try_send(msg).is_err() {
            bump(&self.counters.drop_service_busy);
        }
    }

    /// What the services published.
    pub fn published(&self) -> MutexGuard<'_, Published> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

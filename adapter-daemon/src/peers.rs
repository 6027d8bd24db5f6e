//! The peers this adapter talks to, and how packets find them.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cyphonic_crypto::PublicKey;
use cyphonic_session::Peer;
use ipnet::{IpNet, Ipv4Net};

/// One peer, shared by the data threads and the control thread.
///
/// The data threads hold `peer`'s lock only for the few field reads and writes of
/// `send_session`, `session_for_index` and `handle_authenticated`: no cryptography, no
/// waiting. The control thread holds it while it computes a handshake message (tens of
/// microseconds, once per peer every two minutes).
#[derive(Debug)]
pub struct PeerSlot {
    /// The peer's id (its session indices are `id << 8 | generation`).
    pub id: u32,
    /// Its FQDN.
    pub name: String,
    /// The vIP blocks its certificate certifies: what it may send from, and route to.
    pub blocks: Vec<IpNet>,
    /// The session state machine.
    pub peer: Mutex<Peer>,
    /// Inner packets sent to it.
    pub tx_packets: AtomicU64,
    /// Inner bytes sent to it.
    pub tx_bytes: AtomicU64,
    /// Inner packets received from it.
    pub rx_packets: AtomicU64,
    /// Inner bytes received from it.
    pub rx_bytes: AtomicU64,
}

impl PeerSlot {
    /// Locks the session state (a poisoned lock is recovered: the state machine has no
    /// invariant a panic elsewhere could break mid-way).
    pub fn lock(&self) -> MutexGuard<'_, Peer> {
        self.peer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// All peers, with the lookups the data plane needs.
#[derive(Debug, Default)]
pub struct PeerTable {
    slots: Vec<Arc<PeerSlot>>,
    /// IPv4 routes, most specific first.
    routes: Vec<(Ipv4Net, usize)>,
    by_key: HashMap<PublicKey, usize>,
}

impl PeerTable {
    /// Builds the table from `slots`, whose ids must be 1, 2, 3, ...
    pub fn new(slots: Vec<Arc<PeerSlot>>, keys: &[PublicKey]) -> Self {
        let mut routes: Vec<(Ipv4Net, usize)> = slots
            .iter()
            .enumerate()
            .flat_map(|(i, s)| {
                s.blocks.iter().filter_map(move |b| {
                    if let IpNet::V4(v4) = b {
                        Some((*v4, i))
                    } else {
                        None
                    }
                })
            })
            .collect();
        routes.sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix_len()));
        let by_key = keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        Self {
            slots,
            routes,
            by_key,
        }
    }

    /// The peer whose certified block holds `dst` (longest prefix).
    pub fn route(&self, dst: Ipv4Addr) -> Option<&Arc<PeerSlot>> {
        self.routes
            .iter()
            .find(|(net, _)| net.contains(&dst))
            .map(|(_, i)| &self.slots[*i])
    }

    /// The peer owning session index `index`.
    pub fn by_index(&self, index: u32) -> Option<&Arc<PeerSlot>> {
        self.by_id(index >> 8)
    }

    /// The peer with id `id`.
    pub fn by_id(&self, id: u32) -> Option<&Arc<PeerSlot>> {
        let id = usize::try_from(id).ok()?;
        self.slots.get(id.checked_sub(1)?)
    }

    /// The peer with Noise static key `key`.
    pub fn by_key(&self, key: &PublicKey) -> Option<&Arc<PeerSlot>> {
        self.by_key.get(key).map(|i| &self.slots[*i])
    }

    /// Every peer.
    pub fn all(&self) -> &[Arc<PeerSlot>] {
        &self.slots
    }
}

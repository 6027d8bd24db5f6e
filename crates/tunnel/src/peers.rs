//! The peers a client talks to, how packets find them, and how each is reached (directly
//! or through a relay channel).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Instant;

use cyphonic_control::RelayReason;
use cyphonic_crypto::{Certificate, PublicKey};
use cyphonic_session::{Indices, Peer};
use ipnet::IpNet;

use crate::routes::Routes;

/// One peer, shared by the data threads and the control thread.
///
/// The data threads hold `peer`'s lock only for the few field reads and writes of
/// `send_session`, `session_for_index` and `handle_authenticated`: no cryptography, no
/// waiting. The control thread holds it while it computes a handshake message (tens of
/// microseconds, once per peer every two minutes).
#[derive(Debug)]
pub struct PeerSlot {
    /// The peer's id, what [`PeerTable::by_id`] finds it by (its session indices are random:
    /// [`PeerTable::by_index`]).
    pub id: u32,
    /// Its FQDN.
    pub name: String,
    /// The vIP blocks its certificate certifies: what it may send from, and route to.
    pub blocks: Vec<IpNet>,
    /// How we know it: `"static"` (configuration) or `"cloud"`.
    pub origin: &'static str,
    /// Its certificate's fingerprint (hex): how the cloud knows it.
    pub fingerprint: String,
    /// Its certificate: the one configured (a static peer) or the cloud gave. The one it
    /// presents in handshakes may be newer ([`PeerSlot::current_certificate`]).
    pub certificate: Certificate,
    /// How we reach it: directly, or through a relay channel.
    pub route: Mutex<Route>,
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
    /// Its packets waiting behind its handshake in the submitter: while any do, the sparse
    /// lane sends its packets through the submitter too, behind them.
    pub held: AtomicU64,
}

/// A relay channel towards a peer (from the cloud).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relay {
    /// The channel's address: the peer's endpoint while relayed.
    pub address: SocketAddr,
    /// Our token, which binds our tunnel socket's address to the channel.
    pub token: [u8; 16],
    /// Why the cloud chose the relay.
    pub reason: RelayReason,
    /// When we last sent the bind.
    pub bound_at: Option<Instant>,
    /// The last challenge the channel sent us: what our binds answer.
    pub cookie: Option<cyphonic_control::ReturnCookie>,
}

/// How a peer is reached.
#[derive(Debug, Default)]
pub struct Route {
    /// The relay channel, when the pair is relayed.
    pub relay: Option<Relay>,
    /// When we last asked the cloud for a relay because the direct path failed.
    pub relay_asked: Option<Instant>,
    /// Which way the cloud's rules let flows start with this peer, as the cloud last said
    /// when it paired us (`None`: it enforces nothing per device, or never said).
    pub allowed: Option<cyphonic_control::Allowed>,
    /// The peer's other addresses the cloud gave (another IP version, a private address),
    /// at most [`MAX_CANDIDATES`]: until keys exist, our initiations go there too, and the
    /// first path to answer is the one the peer is reached on.
    pub candidates: Vec<SocketAddr>,
    /// While the pair has a relay channel: the way back to direct (docs/protocol.md §4,
    /// *Back to direct*).
    pub direct: crate::direct::Direct,
}

/// Addresses of a peer tried besides its first.
pub const MAX_CANDIDATES: usize = 3;

impl PeerSlot {
    /// A peer slot with zeroed counters and a direct route.
    pub fn new(id: u32, cert: &Certificate, origin: &'static str, peer: Peer) -> Self {
        let body = cert.body();
        Self {
            id,
            name: body.name.clone(),
            blocks: body.vip_blocks.clone(),
            origin,
            fingerprint: cert.fingerprint().to_string(),
            certificate: cert.clone(),
            route: Mutex::new(Route::default()),
            peer: Mutex::new(peer),
            tx_packets: AtomicU64::new(0),
            tx_bytes: AtomicU64::new(0),
            rx_packets: AtomicU64::new(0),
            rx_bytes: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// The certificate that speaks for the peer now: the one it last presented in a
    /// handshake (a renewed one, say), else the one we know it by.
    pub fn current_certificate(&self) -> Certificate {
        self.lock()
            .certificate()
            .cloned()
            .unwrap_or_else(|| self.certificate.clone())
    }

    /// When the peer's current certificate ends (unix seconds).
    pub fn certificate_expires(&self) -> u64 {
        let presented = self.lock().certificate().map(|c| c.body().not_after);
        presented.unwrap_or(self.certificate.body().not_after)
    }

    /// The relay channel the peer's frames go through now; `None` while direct (a pair
    /// back on a direct path keeps its channel in [`Route::relay`] for a fall back).
    pub fn relay_in_use(&self) -> Option<Relay> {
        let relay = self.route().relay.clone()?;
        self.lock().is_relayed().then_some(relay)
    }

    /// Locks the route (recovering a poisoned lock, as [`PeerSlot::lock`]).
    pub fn route(&self) -> MutexGuard<'_, Route> {
        self.route.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks the session state (a poisoned lock is recovered: the state machine has no
    /// invariant a panic elsewhere could break mid-way).
    pub fn lock(&self) -> MutexGuard<'_, Peer> {
        self.peer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// All peers, with the lookups the data plane needs. Static peers are there from the start;
/// the cloud adds more while running (`insert`); a peer whose certificate no longer verifies,
/// or that configuration no longer names, leaves (`remove`). Ids are never reused, so a
/// session index or a queue that still names a removed peer finds nothing. Readers take a
/// read lock for one lookup and leave with an `Arc`; the control thread takes the write lock
/// only to add or remove a peer. The peers' session indices live in [`PeerTable::indices`],
/// which they allocate from.
#[derive(Debug)]
pub struct PeerTable {
    inner: RwLock<Inner>,
    indices: Arc<Indices>,
}

impl Default for PeerTable {
    fn default() -> Self {
        Self::new(Indices::new())
    }
}

#[derive(Debug, Default)]
struct Inner {
    slots: BTreeMap<u32, Arc<PeerSlot>>,
    /// IPv4 routes, most specific first.
    routes: Routes,
    by_key: HashMap<PublicKey, u32>,
    /// The last id handed out.
    last_id: u32,
}

impl PeerTable {
    /// An empty table whose peers take their session indices from `indices`.
    pub fn new(indices: Arc<Indices>) -> Self {
        Self {
            inner: RwLock::default(),
            indices,
        }
    }

    /// The session indices of every peer in the table ([`PeerTable::insert`] hands them to
    /// each new [`Peer`]).
    pub const fn indices(&self) -> &Arc<Indices> {
        &self.indices
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds the peer `make` builds from its id (a new one) and the table's session indices
    /// (its [`Peer`] must allocate from them, or its frames are never found), with Noise key
    /// `key`; returns it. Its certified blocks become routes.
    pub fn insert(
        &self,
        make: impl FnOnce(u32, Arc<Indices>) -> Arc<PeerSlot>,
        key: PublicKey,
    ) -> Arc<PeerSlot> {
        let mut t = self.write();
        t.last_id = t.last_id.saturating_add(1);
        let id = t.last_id;
        let slot = make(id, self.indices.clone());
        for b in &slot.blocks {
            t.routes.insert(*b, id);
        }
        t.by_key.insert(key, id);
        t.slots.insert(id, slot.clone());
        slot
    }

    /// Takes the peer with id `id` out of the table: its routes, its key and its sessions
    /// (their indices find nothing from now on, and go back when the last handle on the peer
    /// drops). Returns it, if it was there.
    pub fn remove(&self, id: u32) -> Option<Arc<PeerSlot>> {
        let mut t = self.write();
        let slot = t.slots.remove(&id)?;
        for b in &slot.blocks {
            t.routes.remove(*b, id);
        }
        let key = PublicKey(slot.certificate.body().public_key);
        if t.by_key.get(&key) == Some(&id) {
            t.by_key.remove(&key);
        }
        Some(slot)
    }

    /// The peer whose certified block holds `dst` (longest prefix).
    pub fn route(&self, dst: impl Into<IpAddr>) -> Option<Arc<PeerSlot>> {
        let t = self.read();
        t.routes
            .lookup(dst.into())
            .and_then(|id| t.slots.get(&id).cloned())
    }

    /// The peer owning the live session index `index` (one hash lookup: an index nobody
    /// allocated costs nothing more).
    pub fn by_index(&self, index: u32) -> Option<Arc<PeerSlot>> {
        self.by_id(self.indices.peer_of(index)?)
    }

    /// The peer with id `id`.
    pub fn by_id(&self, id: u32) -> Option<Arc<PeerSlot>> {
        self.read().slots.get(&id).cloned()
    }

    /// The peer with Noise static key `key`.
    pub fn by_key(&self, key: &PublicKey) -> Option<Arc<PeerSlot>> {
        let t = self.read();
        t.by_key.get(key).and_then(|id| t.slots.get(id).cloned())
    }

    /// The first answer of `f` over the peers, by id, without copying the table: `f` runs
    /// under its read lock, so it must not add or remove peers (and a peer's own locks are
    /// best left alone).
    pub fn find_map<T>(&self, f: impl FnMut(&Arc<PeerSlot>) -> Option<T>) -> Option<T> {
        self.read().slots.values().find_map(f)
    }

    /// Every peer, by id.
    pub fn all(&self) -> Vec<Arc<PeerSlot>> {
        self.read().slots.values().cloned().collect()
    }

    /// How many peers there are.
    pub fn len(&self) -> usize {
        self.read().slots.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.read().slots.is_empty()
    }
}

/// A peer known from configuration.
#[derive(Debug, Clone)]
pub struct StaticPeer {
    /// Its certificate: name, blocks, key.
    pub certificate: Certificate,
    /// Where to reach it first.
    pub endpoint: Option<SocketAddr>,
    /// Keepalive interval that holds NAT mappings open.
    pub persistent_keepalive: Option<std::time::Duration>,
}

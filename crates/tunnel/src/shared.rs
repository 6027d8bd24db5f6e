//! What every thread of a tunnel end shares: the peers, who we are, the buffers, the
//! counters, the policy, and the ways to the control thread.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use cyphonic_crypto::{Backend, Certificate, PublicKey};
use cyphonic_session::{Clock, Identity, Peer, PeerConfig, Timing};

use crate::ToControl;
use crate::counters::EngineCounters;
use crate::gate::KnownPeers;
use crate::limit::RateTable;
use crate::peers::{PeerSlot, PeerTable, StaticPeer};
use crate::policy::Policy;
use crate::pool::Pool;

/// Who a tunnel end is, and how it makes its peers: the same for static peers and for those
/// the cloud brings.
#[derive(Debug, Clone)]
pub struct Local {
    /// Our key, certificate and trust.
    pub identity: Arc<Identity>,
    /// Unix time for certificate checks and handshake timestamps.
    pub clock: Clock,
    /// The peers' handshake and key timers.
    pub timing: Timing,
    /// The AEAD implementation their keys use.
    pub aead: Backend,
}

/// Peers a data thread woke the control thread for that it holds at most until the control
/// thread takes them; past this, the control thread looks at every peer.
pub const MAX_WOKEN: usize = 4096;

/// See [`Shared::wake_control_for`].
#[derive(Debug, Default)]
struct Woken {
    ids: Vec<u32>,
    overflow: bool,
}

/// State every thread shares.
#[derive(Debug)]
pub struct Shared {
    /// The peers.
    pub(crate) peers: PeerTable,
    /// Who we are and whom we trust: what handshakes are answered as and checked against.
    /// Replaced whole when the trust changes ([`Control::set_identity`](crate::Control::set_identity)).
    identity: RwLock<Arc<Identity>>,
    /// The frame versions we speak, the first identity's (a replaced identity keeps them):
    /// frames of any other are dropped on arrival (docs/protocol.md §2, *Versions*).
    pub(crate) versions: cyphonic_wire::Versions,
    /// Unix time for certificate checks.
    pub(crate) clock: Clock,
    /// The peers' timers.
    timing: Timing,
    /// The AEAD the peers' keys use.
    aead: Backend,
    /// The engine's counters.
    pub(crate) counters: EngineCounters,
    /// Packet buffers.
    pub(crate) pool: Pool,
    /// Cleared to stop the data threads.
    pub(crate) running: AtomicBool,
    /// To the control thread (bounded; data threads only `try_send`).
    pub(crate) control: tokio::sync::mpsc::Sender<ToControl>,
    /// Wakes the control thread when a peer's timers changed on a data thread.
    pub(crate) notify: tokio::sync::Notify,
    /// The peers the data threads woke the control thread for ([`Shared::wake_control_for`]).
    woken: Mutex<Woken>,
    /// Bounds the [`ToControl::Kick`]s frames on unknown keys may send.
    pub(crate) kick_gate: RateTable,
    /// Bounds the [`ToControl::NoRoute`]s packets without a peer may send (per destination).
    pub(crate) wake_gate: RateTable,
    /// Bounds the [`ToControl::Challenge`]s frames may send (per hashed source: the cloud's
    /// few addresses are each answered a few times a second, a flood of forged challenges
    /// costs one slot's).
    pub(crate) challenge_gate: RateTable,
    /// Bounds the [`ToControl::Path`]s path frames may send, per peer (docs/protocol.md §4,
    /// *Back to direct*: 16 a second).
    pub(crate) path_gate: RateTable,
    /// Peers evicted for idleness that the control core remembers: while none are, a packet
    /// without a peer costs nothing more than its drop.
    pub(crate) dormant: std::sync::atomic::AtomicUsize,
    /// Handshake messages refused, by reason (`HandshakeError::kind`, or `not_a_peer`).
    /// Written by the handshake thread only.
    pub(crate) handshake_refusals: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Per-device policy: which new flows may pass, both ways.
    pub(crate) policy: Policy,
    /// Where our peers are (their endpoints, relay channels among them) and the hints of
    /// their initiations, as the control thread last looked (once a second): the handshake
    /// gate lets them in first.
    known: RwLock<KnownPeers>,
    /// The data-plane threads' beats: whether each goes round its loop.
    pulses: cyphonic_pipeline::Pulses,
}

impl Shared {
    /// The shared state of the tunnel end `local`, with no peers yet and at most `buffers`
    /// packet buffers; returns the control thread's end of its channel (`queue` messages
    /// deep).
    pub fn new(
        local: Local,
        buffers: usize,
        queue: usize,
    ) -> (Self, tokio::sync::mpsc::Receiver<ToControl>) {
        let (control, rx) = tokio::sync::mpsc::channel(queue);
        (
            Self {
                peers: PeerTable::default(),
                versions: local.identity.versions(),
                identity: RwLock::new(local.identity),
                clock: local.clock,
                timing: local.timing,
                aead: local.aead,
                counters: EngineCounters::default(),
                pool: Pool::new(buffers),
                running: AtomicBool::new(true),
                control,
                notify: tokio::sync::Notify::new(),
                woken: Mutex::new(Woken::default()),
                kick_gate: crate::limit::kick_gate(),
                wake_gate: RateTable::new(1024, 1, 1),
                challenge_gate: RateTable::new(64, 8, 8),
                path_gate: RateTable::new(1024, 16, 16),
                dormant: std::sync::atomic::AtomicUsize::new(0),
                handshake_refusals: Mutex::new(std::collections::BTreeMap::new()),
                policy: Policy::default(),
                known: RwLock::new(KnownPeers::default()),
                pulses: cyphonic_pipeline::Pulses::new(),
            },
            rx,
        )
    }

    /// The peers.
    pub fn peers(&self) -> &PeerTable {
        &self.peers
    }

    /// Unix time for certificate checks.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The engine's counters.
    pub fn counters(&self) -> &EngineCounters {
        &self.counters
    }

    /// Packet buffers.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The data-plane threads' beats: the engine's and the edge's threads register here, so
    /// that a stuck one shows ([`cyphonic_pipeline::Pulses::stuck`]).
    pub fn pulses(&self) -> &cyphonic_pipeline::Pulses {
        &self.pulses
    }

    /// Per-device policy: which new flows may pass, both ways.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Completes when a data thread wakes the control thread ([`Shared::wake_control`],
    /// [`Shared::wake_control_for`]).
    pub fn control_woken(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Handshake messages refused so far, by reason (`HandshakeError::kind`, or
    /// `not_a_peer`).
    pub fn handshake_refusals(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.handshake_refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Peers evicted for idleness that the control core remembers now.
    pub fn dormant(&self) -> usize {
        self.dormant.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Who we are now, and whom we trust.
    pub fn identity(&self) -> Arc<Identity> {
        self.identity
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces who we are and whom we trust (the control core's
    /// [`Control::set_identity`](crate::Control::set_identity) also re-checks the peers).
    pub(crate) fn replace_identity(&self, identity: Arc<Identity>) {
        *self
            .identity
            .write()
            .unwrap_or_else(PoisonError::into_inner) = identity;
    }

    /// Adds a peer with certificate `cert`, known as `origin` (`"static"`, `"cloud"`) and
    /// expected to be as `config` says, talking to it as who we are now.
    pub fn add_peer(
        &self,
        cert: &Certificate,
        origin: &'static str,
        config: PeerConfig,
    ) -> Arc<PeerSlot> {
        let identity = self.identity();
        self.peers.insert(
            |id, indices| {
                Arc::new(PeerSlot::new(
                    id,
                    cert,
                    origin,
                    Peer::new(
                        id,
                        identity,
                        indices,
                        config,
                        self.timing,
                        self.clock.clone(),
                        self.aead,
                    ),
                ))
            },
            PublicKey(cert.body().public_key),
        )
    }

    /// Adds a peer known from configuration.
    pub fn add_static_peer(&self, p: &StaticPeer) -> Arc<PeerSlot> {
        let mut config = PeerConfig::from_certificate(&p.certificate, p.endpoint);
        config.persistent_keepalive = p.persistent_keepalive;
        self.add_peer(&p.certificate, "static", config)
    }

    /// Wakes the control thread (never blocks).
    pub fn wake_control(&self) {
        self.notify.notify_one();
    }

    /// Wakes the control thread for peer `id`, whose timers are due or whose state machine
    /// has news (keys, a new address): the control core runs that peer at once, and need
    /// not look at every other ([`Control::run_timers`](crate::Control::run_timers)). Never blocks for long: a short
    /// lock, and past [`MAX_WOKEN`] peers the core is told to look at all of them instead.
    pub fn wake_control_for(&self, id: u32) {
        {
            let mut w = self.woken.lock().unwrap_or_else(PoisonError::into_inner);
            if w.ids.len() < MAX_WOKEN {
                w.ids.push(id);
            } else {
                w.overflow = true;
            }
        }
        self.notify.notify_one();
    }

    /// Where our peers are and the hints of their initiations (as of the control thread's
    /// last look), for the handshake gate.
    pub fn known_peers(&self) -> std::sync::RwLockReadGuard<'_, KnownPeers> {
        self.known.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The control thread's look at where the peers are and how they show themselves.
    pub(crate) fn set_known_peers(&self, known: KnownPeers) {
        *self.known.write().unwrap_or_else(PoisonError::into_inner) = known;
    }

    /// The peers woken for since the last call, and whether more were than the list holds.
    pub(crate) fn take_woken(&self) -> (Vec<u32>, bool) {
        let mut w = self.woken.lock().unwrap_or_else(PoisonError::into_inner);
        let overflow = std::mem::take(&mut w.overflow);
        (std::mem::take(&mut w.ids), overflow)
    }

    /// Whether the data threads should keep running.
    pub fn is_running(&self) -> bool {
        self.running.load(std::sync::atomic::Ordering::Relaxed)
    }
}

//! A client's side of the control plane, on the control thread: peers added on demand from
//! what the cloud says, and DNS answers held until the tunnel they point into is up
//! (design.md §6, flow 2). The signal client's events are handled by [`crate::Control`].

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cyphonic_crypto::{Backend, Certificate, PublicKey};
use cyphonic_session::{Clock, Identity, Peer, PeerConfig, Timing};
use cyphonic_signal::{Event, Handle, PeerInfo, RelayInfo, Resolution, SignalError};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::sync::mpsc;

use crate::Shared;
use crate::peers::PeerSlot;

/// Keepalives towards peers found through the cloud: they hold NAT mappings open.
const CLOUD_KEEPALIVE: Duration = Duration::from_secs(25);

/// A DNS question the cloud answered, for the query parked under `key`.
#[derive(Debug)]
pub struct CloudAnswer {
    /// The resolver's key.
    pub key: u16,
    /// The name asked.
    pub name: Name,
    /// The type asked.
    pub record_type: RecordType,
    /// What the cloud said.
    pub result: Result<Resolution, SignalError>,
}

/// How the DNS service asks the cloud.
#[derive(Debug, Clone)]
pub struct Asker {
    /// The signal client.
    pub handle: Handle,
    /// Where answers go (the control thread).
    pub answers: mpsc::Sender<CloudAnswer>,
}

impl Asker {
    /// Resolves `name` in the background; the answer arrives on the control thread.
    pub fn ask(&self, key: u16, name: Name, record_type: RecordType) {
        let (handle, answers) = (self.handle.clone(), self.answers.clone());
        tokio::spawn(async move {
            let result = handle.resolve(&name.to_ascii()).await;
            let _ = answers
                .send(CloudAnswer {
                    key,
                    name,
                    record_type,
                    result,
                })
                .await;
        });
    }
}

/// A peer to handshake with, and the relay channel to reach it through, if any.
pub type ToHandshake = (Arc<PeerSlot>, Option<RelayInfo>);

/// What settles a DNS query: the records to answer with, or the error code.
pub type Settled = (u16, Result<Vec<Record>, ResponseCode>);

/// The control plane as the control thread sees it.
pub struct CloudLink {
    /// The signal client.
    pub handle: Handle,
    /// Its events.
    pub events: mpsc::Receiver<Event>,
    /// Endpoints we register besides the observed one.
    pub endpoints: Vec<SocketAddr>,
    /// The version of the names last registered.
    pub registered: Option<u64>,
    /// DNS answers waiting for a peer's tunnel, by peer id.
    awaiting: HashMap<u32, Vec<(u16, Vec<Record>)>>,
    identity: Arc<Identity>,
    timing: Timing,
    clock: Clock,
    aead: Backend,
    ttl: u32,
}

impl std::fmt::Debug for CloudLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudLink")
            .field("endpoints", &self.endpoints)
            .field("awaiting", &self.awaiting.len())
            .finish_non_exhaustive()
    }
}

/// Where the cloud is and what we tell it (the `[cloud]` settings of the binaries).
#[derive(Debug, Clone)]
pub struct CloudSettings {
    /// NMS's control address.
    pub address: SocketAddr,
    /// The cloud's pinned Noise key.
    pub public_key: PublicKey,
    /// Endpoints to register besides the ones the cloud sees.
    pub endpoints: Vec<SocketAddr>,
    /// Our software and version, for the cloud's logs.
    pub agent: String,
    /// TTL of the DNS answers built from the cloud's.
    pub dns_ttl: u32,
}

impl CloudLink {
    /// Starts the signal client on the current tokio runtime (call inside it) and wraps it;
    /// returns the [`Asker`] DNS services resolve through, and where its answers arrive.
    pub fn connect(
        settings: &CloudSettings,
        identity: Arc<Identity>,
        tunnel_port: u16,
        timing: Timing,
        clock: Clock,
        aead: Backend,
    ) -> (Self, Asker, mpsc::Receiver<CloudAnswer>) {
        let (handle, events) = cyphonic_signal::spawn(
            cyphonic_signal::Config {
                cloud: settings.address,
                cloud_key: settings.public_key,
                agent: settings.agent.clone(),
                tunnel_port: Some(tunnel_port),
            },
            identity.clone(),
        );
        tracing::info!(cloud = %settings.address, key = %settings.public_key, "control plane: connecting");
        let (answers, answers_rx) = mpsc::channel(256);
        let asker = Asker {
            handle: handle.clone(),
            answers,
        };
        let link = Self {
            handle,
            events,
            endpoints: settings.endpoints.clone(),
            registered: None,
            awaiting: HashMap::new(),
            identity,
            timing,
            clock,
            aead,
            ttl: settings.dns_ttl,
        };
        (link, asker, answers_rx)
    }

    /// The peer the cloud described: found in the table (its endpoint refreshed if it has no
    /// keys yet and is not relayed), or added. `None` if its certificate does not verify
    /// here. The relay the description may carry is the caller's to apply.
    pub fn peer(&self, shared: &Shared, info: &PeerInfo, now: Instant) -> Option<Arc<PeerSlot>> {
        let cert = match Certificate::from_pem(&info.certificate) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "the cloud sent an unreadable certificate");
                return None;
            }
        };
        if let Err(e) = self
            .identity
            .trust()
            .verify(&cert, self.clock.unix_secs(now))
        {
            tracing::warn!(name = %cert.body().name, error = %e, "the cloud sent a certificate we do not trust");
            return None;
        }
        let body = cert.body();
        if body.public_key == self.identity.public_key().0 {
            return None;
        }
        let key = PublicKey(body.public_key);
        let endpoint = info.endpoints.first().copied();
        if let Some(slot) = shared.peers.by_key(&key) {
            let relayed = slot.route().relay.is_some();
            let mut p = slot.lock();
            if let Some(e) = endpoint
                && !relayed
                && !p.is_established(now)
                && p.endpoint() != Some(e)
            {
                p.set_endpoint(e);
            }
            drop(p);
            return Some(slot);
        }
        let mut pc = PeerConfig::from_certificate(&cert, endpoint);
        pc.persistent_keepalive = Some(CLOUD_KEEPALIVE);
        let slot = shared.peers.insert(
            |id| {
                Arc::new(PeerSlot::new(
                    id,
                    &cert,
                    "cloud",
                    Peer::new(
                        id,
                        self.identity.clone(),
                        pc,
                        self.timing,
                        self.clock,
                        self.aead,
                    ),
                ))
            },
            key,
        );
        tracing::info!(peer = %slot.name, ?endpoint, blocks = ?slot.blocks, "peer added from the cloud");
        Some(slot)
    }

    /// The cloud answered a DNS question. Returns what settles now; the rest waits for the
    /// peer's tunnel ([`Self::peer_up`]), and the peer to handshake with (with the relay to
    /// reach it through, if the cloud gave one).
    pub fn answered(
        &mut self,
        shared: &Shared,
        a: CloudAnswer,
        now: Instant,
    ) -> (Option<Settled>, Option<ToHandshake>) {
        let (vip, info) = match a.result {
            Ok(Resolution::Found { vip, peer }) => (vip, peer),
            Ok(Resolution::NotFound | Resolution::Denied | Resolution::Own) => {
                return (Some((a.key, Err(ResponseCode::NXDomain))), None);
            }
            Err(_) => return (Some((a.key, Err(ResponseCode::ServFail))), None),
        };
        let Some(slot) = self.peer(shared, &info, now) else {
            return (Some((a.key, Err(ResponseCode::ServFail))), None);
        };
        if !slot
            .blocks
            .iter()
            .any(|b| b.contains(&std::net::IpAddr::V4(vip)))
        {
            tracing::warn!(peer = %slot.name, %vip, "the cloud named an address outside the peer's certificate");
            return (Some((a.key, Err(ResponseCode::ServFail))), None);
        }
        let records = self.records(&a.name, a.record_type, vip);
        if slot.lock().is_established(now) {
            return (Some((a.key, Ok(records))), None);
        }
        self.awaiting
            .entry(slot.id)
            .or_default()
            .push((a.key, records));
        (None, Some((slot, info.relay)))
    }

    fn records(&self, name: &Name, record_type: RecordType, vip: Ipv4Addr) -> Vec<Record> {
        if record_type == RecordType::A {
            vec![Record::from_rdata(
                name.clone(),
                self.ttl,
                RData::A(vip.into()),
            )]
        } else {
            // The name exists, without records of this type (NODATA).
            Vec::new()
        }
    }

    /// A peer's tunnel is up: the DNS answers that waited for it.
    pub fn peer_up(&mut self, peer: u32) -> Vec<Settled> {
        self.awaiting
            .remove(&peer)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, r)| (k, Ok(r)))
            .collect()
    }

    /// A peer cannot be reached: its waiting answers become SERVFAIL.
    pub fn peer_gave_up(&mut self, peer: u32) -> Vec<Settled> {
        self.awaiting
            .remove(&peer)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, _)| (k, Err(ResponseCode::ServFail)))
            .collect()
    }
}

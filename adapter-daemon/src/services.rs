//! The adapter's own services for its LAN: the DHCP server (crates/vip) and the DNS service
//! (crates/resolver), driven on the control thread.
//!
//! ```text
//! capture thread --DHCP/DNS from the LAN--> control: Services --replies--> LAN (own AF_PACKET socket)
//! ingress emitter --packets for the gateway vIP from peers--> Services --sealed--> peers (UDP)
//! Services --names outside the overlay--> upstream resolvers (hickory, external side)
//! ```
//!
//! A DHCP binding is saved (atomically, see `leases.rs`) before the ACK that grants it leaves,
//! as RFC 2131 §4.3.2 asks, then feeds the anti-spoofing table and the device names the DNS
//! service answers with.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use cyphonic_gateway::{GatewayService, Neighbors as _, gateway_service, udp_packet};
use cyphonic_netio::{PacketSocket, UdpSocket};
use cyphonic_resolver::{Action, PeerZone, Resolver, ZoneConfig};
use cyphonic_session::SendError;
use cyphonic_signal::NameRecord;
use cyphonic_tunnel::{Asker, BUF_LEN, PeerSlot, Upstream};
use cyphonic_vip::{Ignore, Lease, LeaseEvent};
use cyphonic_wire::{HEADER_LEN, TAG_LEN};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, Record};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::config::{Config, Mac};
use crate::counters::bump;
use crate::daemon::Shared;
use crate::leases::LeaseStore;

/// What an upstream lookup found, for the query parked under the key.
pub type UpstreamResult = (u16, Result<Vec<Record>, ResponseCode>);

const DNS_PORT: u16 = 53;
const DHCP_SERVER_PORT: u16 = 67;
const DHCP_CLIENT_PORT: u16 = 68;
/// Packets of the gateway's own waiting for a peer's keys (DNS asks, answers, echo replies).
const PEER_QUEUE: usize = 16;
/// Warnings about refused devices or failed saves at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

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

/// What the status socket shows about the services (rebuilt as they change).
#[derive(Debug, Default)]
pub struct ServicesStatus {
    /// Every device with an address: DHCP leases and reservations.
    pub leases: Value,
    /// The DHCP server's counters (null when switched off).
    pub dhcp: Value,
    /// The DNS service's counters (null when switched off).
    pub dns: Value,
}

/// Logs a repeated warning at most once per [`WARN_EVERY`], with how many were held back.
#[derive(Debug, Default)]
struct Throttle {
    last: Option<Instant>,
    held: u64,
}

impl Throttle {
    /// Whether to log now; returns how many were held back since the last one.
    fn due(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < WARN_EVERY)
        {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}

struct Dhcp {
    server: cyphonic_vip::Server,
    store: LeaseStore,
    pool: (Ipv4Addr, Ipv4Addr),
    ignored: BTreeMap<&'static str, u64>,
    unsaved: bool,
    save_failed: Throttle,
    refused: Throttle,
}

struct Dns {
    resolver: Resolver<Client>,
    upstream: Option<Upstream>,
}

/// The LAN services. See the module docs.
pub struct Services {
    shared: Arc<Shared>,
    lan_tx: PacketSocket,
    udp: UdpSocket,
    dhcp: Option<Dhcp>,
    dns: Option<Dns>,
    /// Reserved devices, as leases that never end: their names exist even when they never
    /// ask DHCP (a statically configured device).
    reserved: Vec<Lease>,
    /// The zone every device name lives in (our FQDN).
    zone: String,
    peer_dns: HashMap<u32, Ipv4Addr>,
    waiting: HashMap<u32, VecDeque<Vec<u8>>>,
    frame: Vec<u8>,
    /// Asks the cloud about overlay names outside our zone and our static peers'.
    cloud: Option<Asker>,
    /// The names we host (ours and our devices'), as registered with the cloud.
    hosted: Vec<NameRecord>,
    /// Bumped whenever `hosted` changes.
    hosted_version: u64,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

const fn ignore_name(why: Ignore) -> &'static str {
    match why {
        Ignore::Malformed => "malformed",
        Ignore::NotARequest => "not_a_request",
        Ignore::Relayed => "relayed",
        Ignore::ChaddrMismatch => "chaddr_mismatch",
        Ignore::OtherServer => "other_server",
        Ignore::NoRecord => "no_record",
        Ignore::NoAddress => "no_address",
        Ignore::Unexpected => "unexpected",
        _ => "other",
    }
}

impl Services {
    /// Sets up the services `config` asks for: loads the saved leases, builds the zone. Must
    /// run inside the control runtime (the upstream resolver spawns on it).
    ///
    /// # Errors
    /// The state directory or the lease file cannot be used, or the names do not parse.
    pub fn new(
        config: &Config,
        name: &str,
        shared: Arc<Shared>,
        lan_tx: PacketSocket,
        udp: UdpSocket,
        results: mpsc::Sender<UpstreamResult>,
        cloud: Option<Asker>,
    ) -> anyhow::Result<Self> {
        let reserved = config
            .reservations
            .iter()
            .map(|r| Lease {
                mac: r.mac.0,
                ip: r.vip,
                hostname: r.hostname.clone(),
                client_id: None,
                expires: u64::MAX,
                active: true,
            })
            .collect();
        let dhcp = match &config.dhcp {
            Some(cfg) => {
                let store = LeaseStore::open(&config.state_dir).with_context(|| {
                    format!(
                        "state_dir {}: cannot keep DHCP leases there",
                        config.state_dir.display()
                    )
                })?;
                let now = unix_now();
                let loaded = store
                    .load(now)
                    .with_context(|| format!("reading {}", store.path().display()))?;
                if let Some((aside, reason)) = &loaded.moved_aside {
                    tracing::warn!(file = %aside.display(), %reason, "the lease file was damaged: moved aside, starting without leases (devices will ask again)");
                }
                let count = loaded.leases.iter().filter(|l| l.active).count();
                let server = cyphonic_vip::Server::new(cfg.clone(), loaded.leases, now)
                    .context("the DHCP configuration")?;
                tracing::info!(
                    pool = %format!("{}-{}", cfg.pool.0, cfg.pool.1),
                    lease_secs = cfg.lease_secs,
                    saved = count,
                    file = %store.path().display(),
                    "DHCP server on the LAN"
                );
                Some(Dhcp {
                    server,
                    store,
                    pool: cfg.pool,
                    ignored: BTreeMap::new(),
                    unsaved: false,
                    save_failed: Throttle::default(),
                    refused: Throttle::default(),
                })
            }
            None => None,
        };
        let fqdn = |s: &str| {
            Name::from_str(&format!("{}.", s.trim_end_matches('.')))
                .with_context(|| format!("{s:?} is not a DNS name"))
        };
        let dns = match &config.dns {
            Some(d) => {
                let mut resolver = Resolver::new(ZoneConfig {
                    overlay_domain: fqdn(&config.overlay_domain)?,
                    own_name: fqdn(name)?,
                    own_ip: config.gateway_vip,
                    own_block: config.lan_block,
                    overlay: config.overlay,
                    ttl: d.ttl,
                    upstream: !d.upstream.is_empty(),
                    ask_cloud: cloud.is_some(),
                });
                let mut zones = Vec::new();
                for (i, p) in config.peers.iter().enumerate() {
                    zones.push(PeerZone {
                        peer: u32::try_from(i + 1).context("too many peers")?,
                        name: fqdn(&p.certificate.body().name)?,
                        blocks: p.certificate.body().vip_blocks.clone(),
                    });
                }
                resolver.set_peers(zones);
                let upstream = if d.upstream.is_empty() {
                    None
                } else {
                    Some(
                        Upstream::new(&d.upstream, results)
                            .context("setting up the upstream DNS resolvers")?,
                    )
                };
                tracing::info!(upstream = ?d.upstream, zone = %name, "DNS service on the gateway vIP");
                Some(Dns { resolver, upstream })
            }
            None => None,
        };
        let peer_dns = config
            .peers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((u32::try_from(i + 1).ok()?, p.dns)))
            .collect();
        let mut services = Self {
            shared,
            lan_tx,
            udp,
            dhcp,
            dns,
            reserved,
            zone: name.trim_end_matches('.').to_owned(),
            peer_dns,
            waiting: HashMap::new(),
            frame: vec![0; BUF_LEN],
            cloud,
            hosted: Vec::new(),
            hosted_version: 0,
        };
        // The saved leases come back as grants: into the tables before any frame. Names also
        // for the reservations, which need no lease to have one.
        services.settle(Instant::now());
        services.refresh_names();
        services.publish_stats();
        Ok(services)
    }

    /// A DHCP message from the LAN, from Ethernet source `mac`.
    pub fn dhcp(&mut self, mac: [u8; 6], payload: &[u8]) {
        let now = Instant::now();
        let Some(d) = self.dhcp.as_mut() else {
            return;
        };
        bump(&self.shared.counters.dhcp_received);
        let result = d.server.handle(unix_now(), payload, mac);
        if let Err(why) = result {
            *d.ignored.entry(ignore_name(why)).or_default() += 1;
            tracing::debug!(mac = %Mac(mac), reason = ignore_name(why), "DHCP message not answered");
        }
        // Bindings are on disk before the reply that grants them leaves.
        self.settle(now);
        if let Ok(Some(reply)) = result {
            let ok = self.send_lan(
                reply.dst_mac,
                reply.dst_ip,
                DHCP_SERVER_PORT,
                DHCP_CLIENT_PORT,
                &reply.payload,
            );
            if ok {
                bump(&self.shared.counters.dhcp_sent);
            }
        }
        self.publish_stats();
    }

    /// A DNS message from a device on the LAN.
    pub fn dns(&mut self, now: Instant, client: Client, payload: &[u8]) {
        let Some(dns) = self.dns.as_mut() else {
            return;
        };
        bump(&self.shared.counters.dns_received);
        let action = dns.resolver.handle_query(now, payload, client, None);
        self.act(client, action);
        self.publish_stats();
    }

    /// A packet a peer sent to the gateway vIP (already checked against its blocks).
    pub fn peer_packet(&mut self, now: Instant, peer: u32, packet: &[u8]) {
        bump(&self.shared.counters.gateway_from_peers);
        match gateway_service(&self.shared.lan, packet, &mut self.frame) {
            GatewayService::Echo { len } => {
                let reply = self.frame[..len].to_vec();
                self.send_to_peer(peer, reply);
            }
            GatewayService::Udp {
                src,
                src_port,
                dst_port: DNS_PORT,
                payload,
            } if self.dns.is_some() => {
                bump(&self.shared.counters.dns_received);
                let msg = &packet[payload];
                let is_response = msg.get(2).is_some_and(|b| b & 0x80 != 0);
                let Some(dns) = self.dns.as_mut() else {
                    return;
                };
                if is_response {
                    // The answer to something we asked this peer on a device's behalf.
                    if let Some((client, resp)) = dns.resolver.handle_peer_answer(msg, peer) {
                        self.answer(client, &resp);
                    }
                } else {
                    let client = Client::Peer {
                        peer,
                        ip: src,
                        port: src_port,
                    };
                    let action = dns.resolver.handle_query(now, msg, client, Some(peer));
                    self.act(client, action);
                }
                self.publish_stats();
            }
            _ => bump(&self.shared.counters.drop_gateway_from_peer),
        }
    }

    /// An upstream lookup finished.
    pub fn upstream_done(&mut self, (key, result): UpstreamResult) {
        let Some(dns) = self.dns.as_mut() else {
            return;
        };
        if let Some((client, resp)) = dns.resolver.complete(key, result) {
            self.answer(client, &resp);
        }
        self.publish_stats();
    }

    /// Runs the services' timers: lease expiry, DNS asks nobody answered, retried saves.
    pub fn tick(&mut self, now: Instant) {
        let unix = unix_now();
        let due = self
            .dhcp
            .as_ref()
            .is_some_and(|d| d.unsaved || d.server.poll_timeout().is_some_and(|t| t <= unix));
        if due {
            if let Some(d) = self.dhcp.as_mut() {
                d.server.handle_timeout(unix);
            }
            self.settle(now);
            self.publish_stats();
        }
        let expired = self
            .dns
            .as_mut()
            .map(|d| d.resolver.handle_timeout(now))
            .unwrap_or_default();
        for (client, resp) in &expired {
            self.answer(*client, resp);
        }
        if !expired.is_empty() {
            self.publish_stats();
        }
    }

    /// When [`Services::tick`] has DNS work next (lease expiry is checked on every wake-up).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.dns.as_ref().and_then(|d| d.resolver.poll_timeout())
    }

    /// The names we host, and a version that changes with them.
    pub fn hosted(&self) -> (u64, &[NameRecord]) {
        (self.hosted_version, &self.hosted)
    }

    /// A peer has keys: send what waited for them.
    pub fn peer_up(&mut self, peer: u32) {
        for packet in self.waiting.remove(&peer).unwrap_or_default() {
            self.send_to_peer(peer, packet);
        }
    }

    /// A peer cannot be reached: forget what waited for it.
    pub fn peer_gave_up(&mut self, peer: u32) {
        for _ in self.waiting.remove(&peer).unwrap_or_default() {
            bump(&self.shared.counters.drop_gateway_to_peer);
        }
    }

    fn act(&mut self, client: Client, action: Action) {
        match action {
            Action::Respond(resp) => self.answer(client, &resp),
            Action::AskPeer { peer, query } => {
                let Some(dst) = self.peer_dns.get(&peer).copied() else {
                    return;
                };
                let mut packet = vec![0; 28 + query.len()];
                if let Some(len) = udp_packet(
                    &mut packet,
                    self.shared.lan.gateway_ip,
                    dst,
                    DNS_PORT,
                    DNS_PORT,
                    &query,
                ) {
                    packet.truncate(len);
                    self.send_to_peer(peer, packet);
                }
            }
            Action::AskUpstream {
                name,
                record_type,
                key,
            } => {
                if let Some(upstream) = self.dns.as_ref().and_then(|d| d.upstream.as_ref()) {
                    upstream.ask(key, name, record_type);
                }
            }
            Action::AskCloud {
                name,
                record_type,
                key,
            } => {
                if let Some(cloud) = &self.cloud {
                    cloud.ask(key, name, record_type);
                    return;
                }
                // Not produced without a cloud; answer rather than leave the device waiting.
                let done = self
                    .dns
                    .as_mut()
                    .and_then(|d| d.resolver.complete(key, Err(ResponseCode::ServFail)));
                if let Some((client, resp)) = done {
                    self.answer(client, &resp);
                }
            }
            _ => {}
        }
    }

    fn answer(&mut self, client: Client, resp: &[u8]) {
        match client {
            Client::Lan { mac, ip, port } => {
                if self.send_lan(mac, ip, DNS_PORT, port, resp) {
                    bump(&self.shared.counters.dns_sent);
                }
            }
            Client::Peer { peer, ip, port } => {
                let mut packet = vec![0; 28 + resp.len()];
                if let Some(len) = udp_packet(
                    &mut packet,
                    self.shared.lan.gateway_ip,
                    ip,
                    DNS_PORT,
                    port,
                    resp,
                ) {
                    packet.truncate(len);
                    bump(&self.shared.counters.dns_sent);
                    self.send_to_peer(peer, packet);
                }
            }
        }
    }

    /// Sends a UDP datagram from the gateway to a device on the LAN.
    fn send_lan(
        &mut self,
        mac: [u8; 6],
        ip: Ipv4Addr,
        sport: u16,
        dport: u16,
        payload: &[u8],
    ) -> bool {
        let Some(len) = self
            .shared
            .lan
            .udp_frame(mac, ip, sport, dport, payload, &mut self.frame)
        else {
            return false;
        };
        if self.lan_tx.send(&self.frame[..len]).is_ok() {
            true
        } else {
            bump(&self.shared.counters.lan_send_failed);
            false
        }
    }

    /// Seals an IP packet of the gateway's own to `peer` and sends it, or keeps it until the
    /// peer has keys (the handshake this asks for is built on the control loop's next turn).
    fn send_to_peer(&mut self, peer: u32, packet: Vec<u8>) {
        let Some(slot) = self.shared.tunnel.peers.by_id(peer) else {
            return;
        };
        let now = Instant::now();
        let (session, dest) = {
            let mut p = slot.lock();
            (p.send_session(now), p.endpoint())
        };
        match session {
            Ok(session) => self.seal_and_send(&slot, &session, dest, &packet),
            Err(SendError::NoSession) => {
                let q = self.waiting.entry(peer).or_default();
                if q.len() < PEER_QUEUE {
                    q.push_back(packet);
                } else {
                    bump(&self.shared.counters.drop_gateway_to_peer);
                }
            }
            Err(_) => bump(&self.shared.counters.drop_gateway_to_peer),
        }
    }

    fn seal_and_send(
        &self,
        slot: &PeerSlot,
        session: &cyphonic_session::Session,
        dest: Option<std::net::SocketAddr>,
        packet: &[u8],
    ) {
        let c = &self.shared.counters;
        let (Some(dest), Ok(counter)) = (dest, session.reserve_counter()) else {
            bump(&c.drop_gateway_to_peer);
            return;
        };
        let mut buf = vec![0; HEADER_LEN + packet.len() + TAG_LEN];
        buf[HEADER_LEN..HEADER_LEN + packet.len()].copy_from_slice(packet);
        let Ok(len) = session.seal(counter, &mut buf, packet.len()) else {
            bump(&c.drop_gateway_to_peer);
            return;
        };
        match self.udp.send_to(&buf[..len], dest) {
            Ok(_) => {
                bump(&self.shared.tunnel.counters.udp_sent);
                bump(&slot.tx_packets);
                slot.tx_bytes
                    .fetch_add(packet.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            Err(_) => bump(&self.shared.tunnel.counters.udp_send_failed),
        }
    }

    /// Applies what the DHCP server did: logs its events, saves the bindings, updates the
    /// anti-spoofing table and the names.
    fn settle(&mut self, now: Instant) {
        let Some(d) = self.dhcp.as_mut() else {
            self.refresh_names();
            return;
        };
        let mut changed = false;
        while let Some(event) = d.server.poll_event() {
            changed = true;
            match event {
                LeaseEvent::Granted(l) => {
                    if self.shared.table.leased_mac(l.ip) == Some(l.mac) {
                        tracing::debug!(vip = %l.ip, mac = %Mac(l.mac), "lease renewed");
                    } else {
                        tracing::info!(vip = %l.ip, mac = %Mac(l.mac), hostname = l.hostname.as_deref().unwrap_or(""), "lease granted");
                    }
                }
                LeaseEvent::Released(l) => {
                    tracing::info!(vip = %l.ip, mac = %Mac(l.mac), "lease released");
                }
                LeaseEvent::Expired(l) => {
                    tracing::info!(vip = %l.ip, mac = %Mac(l.mac), "lease expired");
                }
                LeaseEvent::Declined { ip, mac } => {
                    tracing::warn!(vip = %ip, mac = %Mac(mac), "a device declined its address: another host uses it without a lease; kept out of the pool for 10 minutes");
                }
                LeaseEvent::PoolExhausted { mac } => {
                    if let Some(held) = d.refused.due(now) {
                        tracing::warn!(mac = %Mac(mac), also_refused = held, "DHCP pool exhausted: a new device got no address (widen dhcp.pool or shorten dhcp.lease_time)");
                    }
                }
                LeaseEvent::StarvationGuard { mac } => {
                    if let Some(held) = d.refused.due(now) {
                        tracing::warn!(mac = %Mac(mac), also_refused = held, "too many new devices at once (dhcp.new_lease_share): a DHCP starvation attempt? a new device got no address");
                    }
                }
                _ => {}
            }
        }
        if d.server.take_dirty() {
            d.unsaved = true;
        }
        if d.unsaved {
            match d.store.save(&d.server.leases()) {
                Ok(()) => d.unsaved = false,
                Err(e) => {
                    if let Some(held) = d.save_failed.due(now) {
                        tracing::error!(file = %d.store.path().display(), error = %e, also_failed = held, "cannot save the DHCP leases; they are kept in memory and saving is retried");
                    }
                }
            }
        }
        if changed {
            let leases = d.server.active().map(|l| (l.ip, l.mac)).collect();
            self.shared.table.replace_leases(leases);
            self.refresh_names();
        }
    }

    /// Recomputes every device's name and hands them to the DNS service and the status.
    fn refresh_names(&mut self) {
        let mut all: Vec<Lease> = self
            .dhcp
            .as_ref()
            .map(|d| d.server.active().cloned().collect())
            .unwrap_or_default();
        for r in &self.reserved {
            if !all.iter().any(|l| l.ip == r.ip) {
                all.push(r.clone());
            }
        }
        let names = cyphonic_vip::names(&all);
        let mut hosted: Vec<NameRecord> = names
            .iter()
            .map(|(ip, label)| NameRecord {
                name: format!("{label}.{}", self.zone),
                vip: *ip,
            })
            .collect();
        hosted.push(NameRecord {
            name: self.zone.clone(),
            vip: self.shared.lan.gateway_ip,
        });
        hosted.sort();
        if hosted != self.hosted {
            self.hosted = hosted;
            self.hosted_version += 1;
        }
        if let Some(dns) = self.dns.as_mut() {
            dns.resolver
                .set_hosts(names.iter().map(|(ip, label)| (label.as_str(), *ip)));
        }
        all.sort_by_key(|l| u32::from(l.ip));
        let leases: Vec<Value> = all
            .iter()
            .map(|l| {
                let reserved = self.reserved.iter().any(|r| r.ip == l.ip);
                json!({
                    "vip": l.ip.to_string(),
                    "mac": Mac(l.mac).to_string(),
                    "name": names.get(&l.ip).map(|n| format!("{n}.{}", self.zone)),
                    "hostname": l.hostname,
                    "reserved": reserved,
                    "expires": (l.expires != u64::MAX).then_some(l.expires),
                })
            })
            .collect();
        self.shared
            .services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .leases = Value::Array(leases);
    }

    fn publish_stats(&self) {
        let dhcp = self.dhcp.as_ref().map_or(Value::Null, |d| {
            let s = d.server.stats();
            json!({
                "pool": format!("{}-{}", d.pool.0, d.pool.1),
                "lease_file": d.store.path().display().to_string(),
                "unsaved": d.unsaved,
                "discovers": s.discovers,
                "requests": s.requests,
                "offers": s.offers,
                "acks": s.acks,
                "naks": s.naks,
                "releases": s.releases,
                "declines": s.declines,
                "informs": s.informs,
                "ignored": s.ignored,
                "ignored_by_reason": d.ignored,
                "starvation_refused": s.starvation_refused,
                "pool_exhausted": s.pool_exhausted,
            })
        });
        let dns = self.dns.as_ref().map_or(Value::Null, |d| {
            let s = d.resolver.stats();
            json!({
                "upstream": d.upstream.as_ref().map_or(&[][..], Upstream::servers).iter().map(ToString::to_string).collect::<Vec<_>>(),
                "queries": s.queries,
                "authoritative": s.authoritative,
                "nxdomain": s.nxdomain,
                "refused": s.refused,
                "servfail": s.servfail,
                "asked": s.asked,
                "dropped": s.dropped,
            })
        });
        let mut status = self
            .shared
            .services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        status.dhcp = dhcp;
        status.dns = dns;
    }
}

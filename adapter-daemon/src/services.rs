//! The adapter's LAN services on the control thread, as the daemon core runs them: they take
//! their work from their own bounded channel (filled by the capture thread and the LAN sink)
//! and hand it to the [`Dhcp`] server, the [`Dns`] service (the daemon core's, on the
//! gateway vIP) and the [`Gateway`] address;
//! device [`Names`] follow the leases. What they say leaves through the gateway address: on
//! the LAN socket to devices, through the engine to peers.
//!
//! ```text
//! capture thread --DHCP/DNS from the LAN--> AdapterServices --replies--> Gateway --> LAN
//! LAN sink --packets for the gateway vIP--> AdapterServices --> Gateway --> engine --> peers
//! Dns --names outside the overlay--> upstream resolvers / the cloud (the daemon core)
//! ```

use std::sync::Arc;
use std::time::Instant;

use cyphonic_daemon::dns::Said;
use cyphonic_daemon::{Services, Settled, StaticPeers, Upstream};
use cyphonic_signal::NameRecord;

use crate::config::Reservation;
use crate::counters::bump;
use crate::dhcp::{Answer, Dhcp, Replica, Verdict};
use crate::gateway::{FromPeer, Gateway};
use crate::ha::PairLink;
use crate::lan::{Client, LanSide, ServiceQueues, ToServices};
use crate::names::Names;
use crate::status::{Device6Status, LeaseStatus};

const DNS_PORT: u16 = 53;
const DHCP_SERVER_PORT: u16 = 67;
const DHCP_CLIENT_PORT: u16 = 68;
const DHCP6_SERVER_PORT: u16 = 547;
/// ACKs that left before the standby held their leases are logged at most this often.
const UNREPLICATED_SAID: std::time::Duration = std::time::Duration::from_secs(30);

/// The DNS service on the gateway vIP, answering devices on the LAN and peers.
pub type Dns = cyphonic_daemon::dns::Dns<Client>;

/// What wakes the services: work from their queues, the lease writer's report, or the
/// pair's standby.
#[derive(Debug)]
pub enum Work {
    /// From the capture thread or the LAN sink.
    Queued(ToServices),
    /// The lease writer wrote (or failed to), or an HA pair's standby came to hold another
    /// lease file: ACKs waiting for either may leave.
    LeasesKept,
}

/// The LAN services. See the module docs.
#[derive(Debug)]
pub struct AdapterServices {
    lan: Arc<LanSide>,
    work: ServiceQueues,
    gateway: Gateway,
    /// The DHCP servers, every segment's.
    dhcp: Option<Dhcp>,
    dns: Option<Dns>,
    names: Names,
    /// The reservations in force (a reload may replace them).
    reservations: Vec<Reservation>,
    /// One of an HA pair: tells the pair's thread when the tunnels are up, and hears from it
    /// where new addresses come from and what the other box bound.
    ready: Option<crate::ha::ReadyWatch>,
    pool: Option<PairLink>,
    /// One of an HA pair: what to report of it to the cloud.
    report: Option<crate::ha::Report>,
    /// When ACKs leaving before the standby held their leases were last logged.
    unreplicated_said: cyphonic_telemetry::Throttle,
    /// When the site's router's MAC was last asked for.
    router_asked: Option<Instant>,
    /// When the next unsolicited Router Advertisement goes out (None: at the first tick).
    advertise_at: Option<Instant>,
    /// The table's IPv6 changes the names were last made from.
    seen6: u64,
}

/// How often the adapter asks for the site's router's MAC while it is not known.
const ASK_ROUTER_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl AdapterServices {
    /// The services over `lan`, taking their work from `work`. The saved leases come back
    /// as grants: into the anti-spoofing table and the names before any frame is captured.
    pub fn new(
        lan: Arc<LanSide>,
        work: ServiceQueues,
        gateway: Gateway,
        dhcp: Option<Dhcp>,
        dns: Option<Dns>,
        (names, reservations): (Names, Vec<Reservation>),
    ) -> Self {
        let mut services = Self {
            lan,
            work,
            gateway,
            dhcp,
            dns,
            names,
            reservations,
            ready: None,
            pool: None,
            report: None,
            unreplicated_said: cyphonic_telemetry::Throttle::new(UNREPLICATED_SAID),
            router_asked: None,
            advertise_at: None,
            seen6: 0,
        };
        services.settle(Instant::now(), cyphonic_settings::now_secs());
        services.refresh_names();
        services.publish();
        services
    }

    /// One of an HA pair: says when the tunnels are up ([`crate::ha::Ready`]), takes its
    /// share of the pool and the other box's bindings from `pool`, and reports the pair to
    /// the cloud as `report` says.
    pub fn in_pair(
        mut self,
        ready: crate::ha::ReadyWatch,
        pool: PairLink,
        report: crate::ha::Report,
    ) -> Self {
        self.ready = Some(ready);
        self.pool = Some(pool);
        self.report = Some(report);
        self
    }

    /// A DHCP message of either family from Ethernet source `mac`: `ask` hands it to the
    /// servers (told the pair's share first) at unix time `unix`, and says the segment the
    /// reply goes to (its VLAN; None untagged) and the reply, if any.
    fn dhcp(
        &mut self,
        now: Instant,
        mac: [u8; 6],
        ask: impl FnOnce(&mut Dhcp, u64) -> (Option<u16>, Option<Answer>),
    ) {
        let Some(d) = self.dhcp.as_mut() else {
            return;
        };
        bump(&self.lan.counters.dhcp_received);
        let unix = cyphonic_settings::now_secs();
        if let Some(pool) = &self.pool {
            d.set_share(pool.share());
        }
        let (tag, reply) = ask(d, unix);
        self.answer_dhcp(now, unix, tag, mac, reply);
    }

    /// Sends `reply` of either server once the bindings it made are settled: an ACK or
    /// Reply whose binding is not on disk yet (or not at the pair's standby) waits for the
    /// lease writer (and the standby).
    fn answer_dhcp(
        &mut self,
        now: Instant,
        unix: u64,
        tag: Option<u16>,
        mac: [u8; 6],
        reply: Option<Answer>,
    ) {
        self.settle(now, unix);
        let replica = self.replica();
        let Some(d) = self.dhcp.as_mut() else {
            return;
        };
        match reply.map(|r| d.admit((tag, r), mac, unix, now, replica)) {
            Some(Verdict::Send(reply)) => self.send_dhcp(&reply, tag),
            Some(Verdict::Held) => bump(&self.lan.counters.dhcp_ack_waited),
            None => {}
        }
    }

    /// What an HA pair's standby holds of our lease files, if one is to hold each binding.
    fn replica(&self) -> Replica {
        self.pool.as_ref().map_or(Replica::Alone, PairLink::replica)
    }

    /// The lease writer reported, the standby came to hold another file, or time passed:
    /// held ACKs whose binding is on disk (and at the standby) leave; those that waited too
    /// long for the disk are dropped (their clients retry). The file written goes to the
    /// pair's thread, for the standby.
    fn release_dhcp(&mut self, now: Instant) {
        let replica = self.replica();
        let Some(d) = self.dhcp.as_mut() else {
            return;
        };
        if let (Some(link), Some((generation, table))) = (&self.pool, d.written_table()) {
            link.publish_table(generation, table);
        }
        let released = d.release(now, replica);
        for _ in 0..released.dropped {
            bump(&self.lan.counters.dhcp_unsaved_silent);
        }
        for _ in 0..released.unreplicated {
            bump(&self.lan.counters.dhcp_ack_unreplicated);
        }
        if released.unreplicated > 0
            && let Some(also) = self.unreplicated_said.due(now)
        {
            tracing::warn!(
                acks = released.unreplicated,
                also,
                "HA: DHCP ACKs left before the standby said it holds their leases (it did not within 1 s): a failover now could lose them"
            );
        }
        for (tag, reply) in &released.ready {
            self.send_dhcp(reply, *tag);
        }
    }

    fn send_dhcp(&mut self, reply: &Answer, tag: Option<u16>) {
        let sent = match reply {
            Answer::V4(r) => self.gateway.udp_to_lan(
                tag,
                r.dst_mac,
                r.dst_ip.into(),
                DHCP_SERVER_PORT,
                DHCP_CLIENT_PORT,
                &r.payload,
            ),
            Answer::V6 {
                reply,
                mac,
                ip,
                port,
            } => self.gateway.udp_to_lan(
                tag,
                *mac,
                (*ip).into(),
                DHCP6_SERVER_PORT,
                *port,
                &reply.payload,
            ),
        };
        if sent {
            bump(&self.lan.counters.dhcp_sent);
        }
    }

    /// A packet a peer sent to the gateway vIP: DNS goes to the DNS service; the gateway
    /// answers pings itself.
    fn handle_peer_packet(&mut self, now: Instant, peer: u32, packet: &[u8]) {
        let (src, asked, src_port, payload, dns) = match (
            self.gateway.handle_peer_packet(peer, packet),
            self.dns.as_mut(),
        ) {
            (
                FromPeer::Udp {
                    src,
                    dst,
                    src_port,
                    dst_port: DNS_PORT,
                    payload,
                },
                Some(dns),
            ) => (src, dst, src_port, payload, dns),
            (FromPeer::Udp { .. }, _) => {
                bump(&self.lan.counters.drop_gateway_from_peer);
                return;
            }
            _ => return,
        };
        bump(&self.lan.counters.dns_received);
        let msg = &packet[payload];
        let said = if msg.get(2).is_some_and(|b| b & 0x80 != 0) {
            // The answer to something we asked this peer on a device's behalf.
            dns.peer_answer(peer, msg)
        } else {
            let client = Client::Peer {
                peer,
                ip: src,
                port: src_port,
                asked,
            };
            dns.query(now, client, msg, Some(peer))
        };
        self.say(said);
    }

    /// Sends what the DNS service said.
    fn say(&mut self, said: impl IntoIterator<Item = Said<Client>>) {
        for s in said {
            match s {
                Said::Answer(Client::Lan { mac, ip, port }, resp) => {
                    // The asker's segment is its address's (its frames passed that test).
                    let tag = self.lan.segment_of(ip).tag;
                    if self
                        .gateway
                        .udp_to_lan(tag, mac, ip.into(), DNS_PORT, port, &resp)
                    {
                        bump(&self.lan.counters.dns_sent);
                    }
                }
                Said::Answer(Client::Lan6 { mac, ip, port }, resp) => {
                    let tag = self.lan.segment_of6(ip).tag;
                    if self
                        .gateway
                        .udp_to_lan(tag, mac, ip.into(), DNS_PORT, port, &resp)
                    {
                        bump(&self.lan.counters.dns_sent);
                    }
                }
                Said::Answer(
                    Client::Peer {
                        peer,
                        ip,
                        port,
                        asked,
                    },
                    resp,
                ) => {
                    bump(&self.lan.counters.dns_sent);
                    self.gateway
                        .udp_to_peer(peer, (asked, DNS_PORT), ip, port, &resp);
                }
                Said::AskPeer {
                    peer,
                    server,
                    query,
                } => self.gateway.udp_to_peer(
                    peer,
                    (self.gateway.ip(), DNS_PORT),
                    server,
                    DNS_PORT,
                    &query,
                ),
            }
        }
    }

    /// Applies what the DHCP server did; the names follow when the leases changed.
    fn settle(&mut self, now: Instant, unix: u64) {
        let changed = self
            .dhcp
            .as_mut()
            .is_some_and(|d| d.settle(now, unix, &self.lan.table));
        if changed {
            self.refresh_names();
        }
    }

    /// Recomputes every device's name and hands them to the DNS service and the status.
    fn refresh_names(&mut self) {
        self.seen6 = self.lan.table.changes6();
        let v6 = self.lan.table.named6(&self.lan.prefixes6());
        let bound6 = self.dhcp.as_ref().map(Dhcp::bound6).unwrap_or_default();
        let named = self
            .names
            .refresh(self.dhcp.iter().flat_map(|d| d.active()), &v6, &bound6);
        if let Some(dns) = self.dns.as_mut() {
            dns.set_hosts(named.hosts());
        }
        let mut p = self.lan.published();
        p.leases = named.leases;
        p.devices6 = named.devices6;
    }

    /// Publishes the DHCP server's and the DNS service's state.
    fn publish(&self) {
        let dhcp = self.dhcp.as_ref().and_then(|d| d.status(None));
        let vlan_dhcp = self
            .lan
            .vlans
            .iter()
            .filter_map(|v| Some((v.tag, self.dhcp.as_ref()?.status(Some(v.tag))?)))
            .collect();
        let vlan_dhcp6 = self
            .lan
            .vlans
            .iter()
            .filter_map(|v| Some((v.tag, self.dhcp.as_ref()?.status6(Some(v.tag))?)))
            .collect();
        let dns = self.dns.as_ref().map(|d| d.status(None, 0));
        let dhcp6 = self.dhcp.as_ref().and_then(|d| d.status6(None));
        let mut p = self.lan.published();
        p.dhcp = dhcp;
        p.dhcp6 = dhcp6;
        p.vlan_dhcp = vlan_dhcp;
        p.vlan_dhcp6 = vlan_dhcp6;
        p.dns = dns;
    }
}

impl Services for AdapterServices {
    type Work = Work;
    type Reload = Vec<Reservation>;

    /// Kept in the lease file: an HA pair's standby holds them, and whoever serves next
    /// (or this box after a restart) is paired with them again.
    fn cloud_peers(&mut self, fingerprints: &[String]) {
        if let Some(d) = self.dhcp.as_mut() {
            d.set_peers(fingerprints);
            self.settle(Instant::now(), cyphonic_settings::now_secs());
        }
    }

    fn pair(&self) -> Option<cyphonic_control::PairState> {
        let report = self.report.as_ref()?;
        Some(
            report
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
    }

    /// Every device with an address (leases, reservations, learned fixed devices, devices
    /// with IPv6 only), with what the meter counted of it; the meter counts these from now
    /// on.
    fn devices(&self) -> Vec<cyphonic_control::DeviceReport> {
        let mut devices: Vec<_> = {
            let p = self.lan.published();
            p.leases
                .iter()
                .chain(&self.lan.learned())
                .filter_map(LeaseStatus::report)
                .chain(p.devices6.iter().filter_map(Device6Status::report))
                .collect()
        };
        self.lan.meter.track(devices.iter().map(|d| d.mac.0));
        for d in &mut devices {
            if let Some(c) = self.lan.meter.counts(d.mac.0) {
                d.seen = c.seen;
                (d.tx_bytes, d.tx_packets) = (c.tx_bytes, c.tx_packets);
                (d.rx_bytes, d.rx_packets) = (c.rx_bytes, c.rx_packets);
            }
        }
        devices
    }

    fn resumed_peers(&mut self) -> Vec<String> {
        self.dhcp
            .as_mut()
            .map(Dhcp::take_resumed)
            .unwrap_or_default()
    }

    /// The reservations and legacy devices change while running: the anti-spoofing table,
    /// DHCP (a device bound to an address now reserved for another loses it at once) and the
    /// names follow. A legacy device the running map does not put where the file's does (a
    /// changed `[legacy]`, which takes effect at the restart) waits for the restart.
    fn reload(&mut self, reservations: Vec<Reservation>, now: Instant) {
        let (reservations, waiting) =
            crate::config::reloadable(reservations, |vip| self.lan.segment_of(vip).lan.legacy);
        for r in waiting {
            tracing::warn!(device = ?r.hostname, vip = %r.vip, "a legacy device of a changed [legacy] map: it joins at the restart");
        }
        if reservations == self.reservations {
            return;
        }
        tracing::info!(
            reservations = reservations.len(),
            "reservations changed: applied"
        );
        self.lan.table.set_reservations(&reservations);
        self.names.set_reservations(&reservations);
        // Each segment's scope takes the reservations inside its part of the block.
        if let Some(d) = self.dhcp.as_mut() {
            d.set_reservations(
                crate::config::dhcp_reservations(&reservations),
                &crate::config::dhcp6_reservations(&reservations),
            );
        }
        self.reservations = reservations;
        self.settle(now, cyphonic_settings::now_secs());
        self.refresh_names();
        self.publish();
    }

    fn set_peers(&mut self, peers: &StaticPeers) {
        if let Some(dns) = self.dns.as_mut()
            && let Err(e) = dns.set_peers(peers)
        {
            tracing::error!(error = %e, "the static peers' zones stay as they were");
        }
    }

    fn set_upstream(&mut self, upstream: Option<Upstream>) {
        if let Some(dns) = self.dns.as_mut() {
            dns.set_upstream(upstream);
        }
    }

    async fn next(&mut self) -> Work {
        let (work, dhcp, pool) = (&mut self.work, &mut self.dhcp, &self.pool);
        let written = async {
            match dhcp.as_mut() {
                Some(d) => d.written_changed().await,
                None => std::future::pending().await,
            }
        };

        let replicated = async {
            match pool {
                Some(link) => link.replica_changed().await,
                None => std::future::pending().await,
            }
        };
        // DHCP first: a flood of DNS never delays a device getting its address.
        tokio::select! {
            biased;
            Some(w) = work.dhcp.recv() => Work::Queued(w),
            () = written => Work::LeasesKept,
            () = replicated => Work::LeasesKept,
            Some(w) = work.other.recv() => Work::Queued(w),
            // Every sender is gone: the data threads stopped.
            else => std::future::pending().await,
        }
    }

    fn handle(&mut self, work: Work, now: Instant) {
        match work {
            Work::Queued(ToServices::Dhcp { tag, mac, payload }) => {
                self.dhcp(now, mac, |d, unix| {
                    (tag, d.handle(tag, unix, mac, &payload).map(Answer::V4))
                });
            }
            Work::Queued(ToServices::Dhcp6 {
                tag,
                mac,
                from,
                payload,
            }) => {
                self.dhcp(now, mac, |d, unix| {
                    (tag, d.handle6((tag, unix), mac, from, &payload))
                });
            }
            Work::Queued(ToServices::Dns { client, payload }) => {
                if let Some(dns) = self.dns.as_mut() {
                    bump(&self.lan.counters.dns_received);
                    let said = dns.query(now, client, &payload, None);
                    self.say(said);
                }
            }
            Work::Queued(ToServices::FromPeer { peer, packet, at }) => {
                self.handle_peer_packet(at, peer, &packet);
            }
            Work::Queued(ToServices::Expired { peer, packet }) => {
                self.gateway.time_exceeded_to_peer(peer, &packet);
            }
            Work::LeasesKept => self.release_dhcp(now),
        }
        self.publish();
    }

    /// Lease expiry, retried saves, DNS asks nobody answered; beside a site's router, the
    /// question for its MAC, once a second until it is answered.
    fn tick(&mut self, now: Instant) {
        if self
            .router_asked
            .is_none_or(|at| now.duration_since(at) >= ASK_ROUTER_EVERY)
        {
            self.router_asked = Some(now);
            self.gateway.ask_for_routers();
        }
        // Devices heard at new IPv6 addresses, or unheard for a day: their AAAA may have
        // changed.
        self.lan.table.forget6(cyphonic_settings::now_secs());
        if self.lan.table.changes6() != self.seen6 {
            self.refresh_names();
        }
        if self.advertise_at.is_none_or(|at| now >= at) {
            self.gateway.advertise_routers();
            // Every ADVERT_EVERY less up to a quarter of it, drawn anew each time.
            let draw = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), now);
            let less = crate::lan::ADVERT_EVERY / 4 * u32::from(draw.to_be_bytes()[0]) / 255;
            self.advertise_at = Some(now + crate::lan::ADVERT_EVERY - less);
        }
        let unix = cyphonic_settings::now_secs();
        let theirs = self.pool.as_ref().and_then(PairLink::take_merge);
        let merged = match (self.dhcp.as_mut(), theirs) {
            (Some(d), Some(leases)) => d.merge(leases, unix),
            _ => false,
        };
        if self.dhcp.as_mut().is_some_and(|d| d.tick(unix)) || merged {
            self.settle(now, unix);
            self.publish();
        }
        self.release_dhcp(now);
        let expired = self
            .dns
            .as_mut()
            .map(|d| d.timeouts(now))
            .unwrap_or_default();
        if !expired.is_empty() {
            self.say(expired);
            self.publish();
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let ask = self
            .router_asked
            .filter(|_| !self.gateway.routers_to_ask().is_empty())
            .map(|at| at + ASK_ROUTER_EVERY);
        [
            self.dns.as_ref().and_then(Dns::poll_timeout),
            ask,
            self.advertise_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn hosted(&self) -> (u64, &[NameRecord]) {
        self.names.hosted()
    }

    fn peer_up(&mut self, peer: u32) {
        if let Some(r) = self.ready.as_mut() {
            r.peer_up(peer);
        }
    }

    fn settled(&mut self, settled: Settled) {
        let said = self.dns.as_mut().and_then(|d| d.settled(settled));
        self.say(said);
        self.publish();
    }
}

//! The adapter's part of the status document (the shared part is
//! `cyphonic_daemon::status`): the adapter itself, the devices with an address, the DHCP
//! server and the DNS service. The services publish what changes ([`Published`]); the status
//! socket and the metrics read it.

use std::collections::BTreeMap;

use cyphonic_control::{DeviceKind, DeviceReport};
use cyphonic_daemon::status::DnsStatus;
use serde::{Deserialize, Serialize};

use crate::counters::LanCounters;

/// The adapter's status document.
pub type AdapterDocument = cyphonic_daemon::Status<AdapterStatus, LanCounters>;

/// The adapter's part of the document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterStatus {
    /// The adapter.
    pub adapter: AdapterInfo,
    /// Every device with an address: DHCP leases and reservations.
    pub leases: Vec<LeaseStatus>,
    /// Every device with IPv6 only (no IPv4 address), named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices6: Vec<Device6Status>,
    /// The DHCP server, unless switched off.
    pub dhcp: Option<DhcpStatus>,
    /// The DHCPv6 server, when the LAN has IPv6 and it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp6: Option<Dhcp6Status>,
    /// The DNS service, unless switched off.
    pub dns: Option<DnsStatus>,
    /// One of an HA pair (`[ha]`): this box's part and what it last heard of the other.
    #[serde(default)]
    pub ha: Option<HaStatus>,
    /// The VLAN segments of a trunked LAN port (`[[vlan]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vlans: Vec<VlanStatus>,
}

/// A VLAN segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VlanStatus {
    /// Its VLAN identifier.
    pub tag: u16,
    /// Its part of the certified block.
    pub block: String,
    /// Its gateway address.
    pub gateway: String,
    /// Its IPv6 /64, when the certificate holds an IPv6 block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block6: Option<String>,
    /// Its DHCP server, unless switched off.
    pub dhcp: Option<DhcpStatus>,
    /// Its DHCPv6 server, when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp6: Option<Dhcp6Status>,
}

/// One box of an HA pair (docs/protocol.md §5).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaStatus {
    /// `active` (it serves), `standby` or `starting` (its status socket then shows no peers,
    /// pipelines or counters: it runs no engine; its leases are the table it holds).
    pub role: String,
    /// The pair's term as this box knows it (how many times the gateway moved).
    pub term: u64,
    /// `[ha] priority`.
    pub priority: u8,
    /// Its own health as it last judged it: `lan`, `uplink`, `data_plane`, `reached` for
    /// each that is well (docs/protocol.md §5, *Health*).
    #[serde(default)]
    pub health: Vec<String>,
    /// Why it took its role.
    pub reason: String,
    /// The lease table version it holds or sent last.
    pub lease_table_version: u64,
    /// The other box, once heard.
    pub other: Option<HaOther>,
    /// The pair's messages dropped, by why.
    #[serde(default)]
    pub dropped: HaDrops,
    /// Messages that came a second time (the other path's copy, or a replay): no news.
    #[serde(default)]
    pub copies: u64,
    /// Where new DHCP addresses come from: `whole pool`, `lower half first`, `upper half
    /// only`... (docs/protocol.md §5, *Split brain*).
    #[serde(default)]
    pub pool: String,
    /// The other box's lease tables received while serving, to take in its bindings.
    #[serde(default)]
    pub merges: u64,
    /// While this box serves and a standby in contact is to hold each new lease: how far
    /// behind it is (none otherwise).
    #[serde(default)]
    pub replication: Option<HaReplication>,
}

/// How far the standby's copy of the lease table is behind the serving box's
/// (docs/protocol.md §5, *State that moves*).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaReplication {
    /// The generation of the newest lease file written here (one per change of the table;
    /// 0: the file the box started from).
    pub written: u64,
    /// The newest generation the standby says it holds (none: none of this box's files).
    pub standby_holds: Option<u64>,
    /// Changes the standby does not hold yet (`written - standby_holds`; none while it holds
    /// none).
    pub behind: Option<u64>,
    /// Milliseconds since the oldest file it does not hold was sent to it (0: it holds the
    /// newest).
    pub lag_ms: u64,
}

/// The pair's messages dropped (docs/protocol.md §5, in the order the checks run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaDrops {
    /// From a source that cannot be the other box: our own MAC or the gateway's, a
    /// multicast MAC, a frame from a VLAN, a frame not from the NIC its heartbeat names, a
    /// datagram not from `peer_underlay`.
    pub source: u64,
    /// No magic, a length that does not match.
    pub malformed: u64,
    /// Another pair version.
    pub version: u64,
    /// A tag that does not verify: not from a holder of the site key, or changed.
    pub tag: u64,
    /// Authentic, with a kind or field this version does not know.
    pub unknown: u64,
}

/// What one box last heard of the other.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaOther {
    /// Its LAN NIC's MAC.
    pub mac: String,
    /// Its role, as it said.
    pub role: String,
    /// Its term.
    pub term: u64,
    /// Its priority.
    pub priority: u8,
    /// Its health: `lan`, `uplink`, `data_plane`, `reached` for each that is well.
    pub health: Vec<String>,
    /// Milliseconds since its last heartbeat.
    pub heard_ms_ago: u64,
    /// Whether it proved itself alive in the last 300 ms.
    pub in_contact: bool,
}

/// The adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterInfo {
    /// Our FQDN.
    pub name: String,
    /// The LAN interface.
    pub lan_interface: String,
    /// The MAC devices reach the gateway at (not the interface's own: `gateway_mac`).
    #[serde(default)]
    pub gateway_mac: String,
    /// The tunnel socket's address.
    pub listen: String,
    /// The gateway vIP.
    pub gateway_vip: String,
    /// Our block.
    pub lan_block: String,
    /// Seconds since start.
    pub uptime_secs: u64,
    /// Packet buffers allocated so far.
    pub buffers_allocated: usize,
    /// Packet buffers free now.
    pub buffers_free: usize,
}

/// A device with an address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStatus {
    /// Its vIP.
    pub vip: String,
    /// Its MAC.
    pub mac: String,
    /// Its name in our zone.
    pub name: Option<String>,
    /// The host name it gave (DHCP option 12) or was reserved with.
    pub hostname: Option<String>,
    /// A reservation (never expires).
    pub reserved: bool,
    /// Its own address on the legacy subnet (`[[legacy.device]]`), which `vip` maps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy: Option<String>,
    /// A legacy device not declared, learned from its frames (`[legacy] learn`).
    #[serde(default)]
    pub learned: bool,
    /// Its IPv6 address, its AAAA (docs/protocol.md §7: learned from its own packets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip6: Option<String>,
    /// The VLAN of its segment, on a trunked port (none: untagged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// When its lease ends, unix seconds (none for reservations).
    pub expires: Option<u64>,
}

impl LeaseStatus {
    /// The device as the cloud is told of it, its counters at zero (None: an address that
    /// does not read, which the services never write).
    pub fn report(&self) -> Option<DeviceReport> {
        let kind = if self.learned {
            DeviceKind::Learned
        } else if self.reserved {
            DeviceKind::Reserved
        } else {
            DeviceKind::Lease
        };
        Some(DeviceReport {
            mac: self.mac.parse().ok()?,
            vip: Some(self.vip.parse().ok()?),
            vip6: self.vip6.as_deref().and_then(|a| a.parse().ok()),
            legacy: self.legacy.as_deref().and_then(|a| a.parse().ok()),
            name: self.name.clone(),
            hostname: self.hostname.clone(),
            kind,
            expires: self.expires,
            vlan: self.vlan,
            ..unseen()
        })
    }
}

/// A device report of nothing yet, to fill in.
fn unseen() -> DeviceReport {
    DeviceReport {
        mac: cyphonic_control::Mac([0; 6]),
        vip: None,
        vip6: None,
        legacy: None,
        name: None,
        hostname: None,
        kind: DeviceKind::Lease,
        expires: None,
        vlan: None,
        seen: None,
        tx_bytes: 0,
        tx_packets: 0,
        rx_bytes: 0,
        rx_packets: 0,
    }
}

/// A device with IPv6 only (docs/protocol.md §7): named, with no IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device6Status {
    /// Its IPv6 address, its AAAA.
    pub vip6: String,
    /// Its MAC.
    pub mac: String,
    /// Its name in our zone.
    pub name: Option<String>,
    /// The host name it gave (DHCPv6 Client FQDN).
    pub hostname: Option<String>,
}

impl Device6Status {
    /// The device as the cloud is told of it, its counters at zero.
    pub fn report(&self) -> Option<DeviceReport> {
        Some(DeviceReport {
            mac: self.mac.parse().ok()?,
            vip6: Some(self.vip6.parse().ok()?),
            name: self.name.clone(),
            hostname: self.hostname.clone(),
            kind: DeviceKind::V6,
            ..unseen()
        })
    }
}

/// The DHCP server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DhcpStatus {
    /// The dynamic pool, `first-last`.
    pub pool: String,
    /// Where the leases are saved.
    pub lease_file: String,
    /// Leases changed and are not on disk yet (written at most once a second; when this
    /// stays, the writes fail: the log says why, and they are retried).
    pub unsaved: bool,
    /// Lease files written.
    #[serde(default)]
    pub lease_writes: u64,
    /// Lease file writes that failed.
    #[serde(default)]
    pub lease_write_failures: u64,
    /// The server's counters.
    #[serde(flatten)]
    pub stats: cyphonic_vip::Stats,
    /// Messages not answered, by reason.
    pub ignored_by_reason: BTreeMap<String, u64>,
}

/// The DHCPv6 server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dhcp6Status {
    /// The pool, `first-last`.
    pub pool: String,
    /// Bindings in force.
    pub bindings: usize,
    /// The server's counters.
    #[serde(flatten)]
    pub stats: cyphonic_vip::Stats6,
    /// Messages not answered, by reason.
    pub ignored_by_reason: BTreeMap<String, u64>,
}

/// What the services publish as it changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Published {
    /// Every device with an address.
    pub leases: Vec<LeaseStatus>,
    /// Every device with IPv6 only.
    pub devices6: Vec<Device6Status>,
    /// The DHCP server.
    pub dhcp: Option<DhcpStatus>,
    /// The VLAN segments' DHCP servers, by tag.
    pub vlan_dhcp: Vec<(u16, DhcpStatus)>,
    /// The DHCPv6 server.
    pub dhcp6: Option<Dhcp6Status>,
    /// The VLAN segments' DHCPv6 servers, by tag.
    pub vlan_dhcp6: Vec<(u16, Dhcp6Status)>,
    /// The DNS service.
    pub dns: Option<DnsStatus>,
}

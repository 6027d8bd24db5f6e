//! The adapter's configuration file: TOML, every key documented in
//! config/adapter.example.toml, safe defaults in code, and errors that name the file, the line
//! and the key. Certificates and keys are part of the configuration: loading reads and checks
//! them too, so `check-config` catches every mistake `run` would. The keys every tunnel end
//! has (`listen`, `overlay`, `inner_mtu`, `status_socket`, `[identity]`, `[[peer]]`,
//! `[cloud]`, `[metrics]`, `[dataplane]`'s shared keys, `[dns]`) are declared and checked by
//! `cyphonic-settings`; this file adds the adapter's own: the LAN interface and gateway
//! address, DHCP, reservations and the LAN side of `[dataplane]`.

use std::collections::HashSet;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use cyphonic_crypto::Certificate;
use cyphonic_settings::{Common, ConfigError, Identity, Source};
use ipnet::{IpNet, Ipv4Net};
use serde::Deserialize;
use toml::Spanned;

/// A MAC address written `02:00:00:00:01:0a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mac(pub [u8; 6]);

impl FromStr for Mac {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let cyphonic_control::Mac(mac) = s.parse()?;
        if mac[0] & 1 == 1 {
            return Err(format!(
                "{s} is a multicast MAC address; a device has a unicast one"
            ));
        }
        Ok(Self(mac))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        cyphonic_control::Mac(self.0).fmt(f)
    }
}

impl cyphonic_settings::Value for Mac {
    fn kind() -> String {
        "MAC address".to_owned()
    }
    fn show(&self) -> String {
        format!("\"{self}\"")
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

// ---- the file as written ------------------------------------------------------------------

cyphonic_settings::config_file! {
    /// `cyphonic-adapter`'s file. The tables every tunnel end has are the node's too.
    struct Raw {
        /// The adapter.
        adapter: RawAdapter,
        /// The DHCP server.
        dhcp: RawDhcp = RawDhcp::default(),
        /// Devices with fixed addresses.
        reservation: Vec<RawReservation> = Vec::new(),
        /// The other box of a pair.
        ha: Option<RawHa> = None,
        /// A subnet of devices with fixed addresses.
        legacy: Option<RawLegacy> = None,
        /// The VLAN segments of a trunked LAN port.
        vlan: Vec<RawVlan> = Vec::new(),
    }
}

cyphonic_settings::table! {
    /// A VLAN segment on `lan_interface` when the switch port is an 802.1Q trunk: the devices
    /// whose frames carry `tag` get their addresses from `block` (DHCP with `[dhcp]`'s lease
    /// settings, or a reservation inside `block`), `gateway` as router and DNS server, and
    /// the segment's `groups` in the policy. A device stays in its segment: it may send only
    /// from an address of its block, and nothing is routed between segments. Untagged frames
    /// stay the segment of `[adapter]`, `[dhcp]` and `[legacy]`; a tag no table names is
    /// dropped and counted. In an HA pair, both boxes serve every segment. Repeat the table
    /// for each VLAN; changes need a restart.
    struct RawVlan in "vlan" {
        /// The VLAN identifier, 1 to 4094.
        tag: Spanned<u16>,
        /// The segment's part of the certified block: clear of `gateway_vip`, the DHCP pool,
        /// `legacy.onto` and the other segments.
        block: Spanned<Ipv4Net>,
        /// The segment's gateway address, a host address of `block`. Unset: its first one.
        gateway: Option<Spanned<Ipv4Addr>> = None,
        /// The segment's DHCP pool, `first-last` inclusive, inside `block`. Unset: the whole
        /// block but its network, broadcast and gateway addresses.
        pool: Option<Spanned<String>> = None,
        /// The segment's IPv6 /64, inside the certificate's IPv6 block, when it holds one:
        /// Router Advertisements, SLAAC, DHCPv6 (with `dhcp`) and DNS there as on the untagged
        /// segment.
        /// Unset: the block's (n+1)-th /64 for the n-th `[[vlan]]` (the untagged segment has
        /// the first).
        block6: Option<Spanned<ipnet::Ipv6Net>> = None,
        /// The groups `[policy]` rules may name every device of the segment by (`block`, and
        /// `block6`).
        groups: Vec<Spanned<String>> = Vec::new(),
        /// Serve DHCP on this segment (when `[dhcp]` is on). `false` beside a site's router
        /// that serves it (`legacy.router`).
        dhcp: bool = true,
        /// The segment's fixed-address devices: a table as `[legacy]`, with the same keys
        /// and checks, its `onto` inside `block` and clear of the segment's gateway and pool.
        legacy: Option<RawLegacy> = None,
    }
}

cyphonic_settings::table! {
    /// Devices that keep the fixed addresses they were given before the adapter came (a PLC
    /// set to 192.168.0.20 by a vendor tool): their subnet is mapped one to one onto part of
    /// the certified block, so that each has an overlay address, a name and a place in the
    /// policy as a DHCP device has; nothing of the subnet leaves the site, so every site may
    /// use the same one (docs/protocol.md §6). DHCP devices on the same segment keep their
    /// pool. Changes but the devices need a restart.
    struct RawLegacy in "legacy" {
        /// The devices' own subnet, for example `192.168.0.0/24`.
        subnet: Spanned<Ipv4Net>,
        /// The part of the certified block it maps onto: as large as `subnet`, holding
        /// neither `gateway_vip`, a reservation nor the DHCP pool. `subnet`'s n-th address is
        /// `onto`'s n-th.
        onto: Spanned<Ipv4Net>,
        /// The address the devices have as their default gateway (the old router's): the
        /// adapter answers for it (ARP, ping, DNS) as for `gateway_vip`. With `router`, an
        /// address of the adapter's own, which the site's router routes the overlay to.
        gateway: Spanned<Ipv4Addr>,
        /// The site's router, when it stays the devices' gateway (and DHCP server: switch
        /// `[dhcp]` off) and routes the overlay's ranges to `gateway`. The adapter takes
        /// from its MAC any address of the subnet, and sends it every packet for the devices.
        /// Unset: the adapter is the devices' gateway.
        router: Option<Spanned<Ipv4Addr>> = None,
        /// Let a device not declared below hold the address it is first heard at (by ARP or
        /// as a packet's source) from its MAC, without a name, until the adapter restarts: at
        /// most 4 addresses a MAC, 1024 a subnet. `status` lists them, to declare. `false`:
        /// only declared devices pass; the rest are spoofers, dropped and counted.
        learn: bool = true,
        /// The devices.
        device: Vec<RawLegacyDevice> = Vec::new(),
    }
}

cyphonic_settings::table! {
    /// A device with a fixed address in `legacy.subnet`: only its MAC may send from that
    /// address. Repeat the table for each device.
    struct RawLegacyDevice in "legacy.device" {
        /// Its name on the overlay (a DNS label): `<name>.<adapter name>`.
        name: Spanned<String>,
        /// Its MAC address, `02:00:5e:10:00:14`.
        mac: Spanned<Mac>,
        /// Its own address, inside `legacy.subnet`.
        address: Spanned<Ipv4Addr>,
        /// The groups `[policy]` rules may name it by.
        groups: Vec<Spanned<String>> = Vec::new(),
    }
}

cyphonic_settings::table! {
    /// One of two adapters on this LAN serving the site as one gateway (docs/protocol.md §5).
    /// Both have the same file, the site's one certificate and key, and a `state_dir` each;
    /// only the priority differs. The box that is not serving stands by: it answers nothing on
    /// the LAN, opens no tunnel, and keeps the lease table the serving one sends it; it serves
    /// within about 300 ms of the serving one's going silent. Leave the table out on a lone
    /// adapter. Changes need a restart.
    struct RawHa in "ha" {
        /// 1 to 254: the higher serves when both start together and are equally well.
        priority: Spanned<u8>,
        /// Take the gateway back from the other box when this one has the higher priority
        /// (once it holds the other's lease table). `false`: the box serving keeps serving.
        preempt: bool = false,
        /// The other box's underlay address: the pair's messages go there too (UDP, `port`),
        /// so that a cut of the LAN between the two alone does not make both serve. Unset: the
        /// LAN only.
        peer_underlay: Option<std::net::IpAddr> = None,
        /// The pair's UDP port on the underlay, the same on both boxes.
        port: u16 = 51821,
    }
}

cyphonic_settings::end_table! {
    /// The adapter and its LAN.
    struct RawAdapter("adapter", status_socket = "/run/cyphonic/adapter.sock") {
        /// The internal NIC, where the devices are plugged in. The adapter captures it raw and
        /// answers ARP, ICMP, DHCP and DNS itself: give this interface no IP address in the
        /// operating system, only bring it up.
        lan_interface: String,
        /// The adapter's own overlay address on the LAN: the devices' default router (and
        /// their DHCP and DNS server). A host address inside the vIP block of this adapter's
        /// certificate. Unset: the block's first host address.
        gateway_vip: Option<Spanned<Ipv4Addr>> = None,
        /// Rewrite the MSS of TCP SYN and SYN-ACK both ways to fit `inner_mtu`, so that TCP
        /// never depends on path MTU discovery working.
        mss_clamp: bool = true,
        /// Where the adapter keeps state across restarts: the DHCP leases (`leases.json`,
        /// replaced atomically). Created mode 0700.
        state_dir: PathBuf = PathBuf::from(cyphonic_settings::STATE_DIR),
    }
}

cyphonic_settings::dns_table! {
    /// The DNS service on `gateway_vip`, port 53: the names of this adapter's devices
    /// (`<hostname>.<adapter name>`).
    struct RawDns {}
}

cyphonic_settings::table! {
    /// The DHCP server on `lan_interface`: devices get a vIP from the pool, `gateway_vip` as
    /// router and DNS server, the adapter's name as domain, and `inner_mtu` as interface MTU.
    struct RawDhcp in "dhcp" (optional) {
        /// Serve DHCP. Switch it off only when every device is configured by hand
        /// (reservations).
        enabled: bool = true,
        /// The dynamic pool, `first-last` inclusive, inside the certified block (the adapter
        /// refuses to start otherwise). Reserved addresses and `gateway_vip` are never handed
        /// out from it. Unset: the whole block but its network, broadcast and gateway
        /// addresses.
        pool: Option<Spanned<String>> = None,
        /// Lease time, seconds (60 to 31536000); devices renew at half of it.
        lease_time: Spanned<u32> = cyphonic_settings::unwritten(3600),
        /// Starvation guard: devices never seen before may be bound to at most this share of
        /// the pool within `new_lease_window` seconds, and hold at most this share in offers
        /// at once (a newer offer takes the oldest one's place). Known devices are never
        /// limited.
        new_lease_share: Spanned<f64> = cyphonic_settings::unwritten(0.25),
        /// The starvation guard's window, seconds.
        new_lease_window: Spanned<u64> = cyphonic_settings::unwritten(60),
        /// Serve DHCPv6 too (RFC 8415) when the certificate holds an IPv6 block: stateful
        /// addresses from `::1000`-`::1fff` of the untagged segment's /64, the DNS server and
        /// the search list, with `lease_time` and the starvation guard as above. Router
        /// Advertisements then say M and O; SLAAC stays on beside it.
        ipv6: bool = true,
    }
}

cyphonic_settings::dataplane_table! {
    /// The data plane: the keys every tunnel end has, and the LAN side's.
    struct RawDataplane {
        /// Kernel buffer of the LAN capture, bytes. Too small drops bursts.
        lan_buffer: usize = cyphonic_settings::DataPlane::default().udp_buffer,
        /// Take the frames the LAN port's GRO/LRO merged as they are (PACKET_VNET_HDR) and cut
        /// them back into wire-sized segments here: one system call per up to 64 KiB.
        /// `false`: switch GRO and LRO off at start.
        lan_gro: bool = true,
        /// Send runs of segments of one flow to the LAN devices as one large frame that the
        /// kernel (or the NIC) cuts again. Off by itself if the interface refuses.
        lan_gso: bool = true,
        /// Leave the checksums the devices' kernels left to offload, and those of segments cut
        /// from merged frames, to the tunnel's far end (the frame says so). Fragmented packets
        /// are always completed here.
        defer_checksums: bool = true,
        /// Capture sockets sharing the LAN port's frames by flow (1 to 16), each with its own
        /// `lan_buffer`, read in turn: a ping then waits behind at most a batch of a
        /// download's frames. A flow's frames stay on one socket, in order.
        lan_queues: Spanned<usize> = cyphonic_settings::unwritten(1),
        /// Read the LAN's bulk frames from a ring of memory shared with the kernel (each
        /// capture socket's, as large as its queue: twice `lan_buffer`, as the kernel grants
        /// it; TPACKET_V3) instead of the socket's queue: no system call per batch while
        /// frames keep coming, about 40% less CPU where they come one by one (UDP, or
        /// `lan_gro = false`), no gain on frames GRO merged (docs/benchmarks.md). The kernel
        /// hands the ring over in blocks, so a bulk frame that comes alone waits for its
        /// block's timer (about 0.6 ms more per capture on the bed, at most a tick of the
        /// kernel's clock); the sparse class (`sparse_socket`) never does. Where the kernel
        /// refuses the ring, the sockets read as without (one warning).
        lan_ring: bool = false,
    }
}

cyphonic_settings::table! {
    /// A device with a fixed address: its MAC is the only one allowed to send from that vIP.
    /// It gets the address from DHCP, or may be configured by hand (it then still has a
    /// name). Reserved addresses may lie inside or outside the pool. Repeat the table for
    /// each device.
    struct RawReservation in "reservation" {
        /// The device's MAC address, `02:00:00:00:01:0a`.
        mac: Spanned<Mac>,
        /// Its overlay address, inside the certified block.
        vip: Spanned<Ipv4Addr>,
        /// Its fixed IPv6 address, inside the LAN's /64 (the first of the certificate's IPv6
        /// block): DHCPv6 gives it to this MAC, only this MAC may send from it, and it is the
        /// device's AAAA and its IPv6 address to `[policy]`. Unset: whatever the device takes.
        vip6: Option<Spanned<Ipv6Addr>> = None,
        /// Its name (a DNS label); it overrides what the device calls itself. Unset: the name
        /// the device gives in DHCP, if any.
        hostname: Option<Spanned<String>> = None,
        /// The groups `[policy]` rules may name it by.
        groups: Vec<Spanned<String>> = Vec::new(),
    }
}

/// The most capture sockets `dataplane.lan_queues` may ask for.
const LAN_QUEUES_MAX: usize = 16;

// ---- the validated configuration -----------------------------------------------------------

/// A device with a fixed address: it gets it from DHCP, or may configure it by hand; or it
/// keeps an address of a legacy subnet (`[[legacy.device]]`), mapped onto `vip`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The device's MAC: the only one allowed to send from `vip` (or from `legacy`).
    pub mac: Mac,
    /// Its overlay address.
    pub vip: Ipv4Addr,
    /// Its fixed IPv6 address on the untagged segment's /64, if given.
    pub vip6: Option<Ipv6Addr>,
    /// Its own address on the legacy subnet, if it is a legacy device (never served DHCP).
    pub legacy: Option<Ipv4Addr>,
    /// Its name on the overlay, if given.
    pub hostname: Option<String>,
    /// The groups `[policy]` rules may name it by.
    pub groups: Vec<String>,
}

/// The LAN side's data-plane settings (the rest of `[dataplane]` is the engine's
/// [`cyphonic_settings::DataPlane`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanDataplane {
    /// LAN (AF_PACKET) receive buffer, bytes.
    pub buffer: usize,
    /// Take frames the LAN NIC coalesced (GRO/LRO) with their offload header and cut them
    /// back into segments here; without it, switch GRO/LRO off on the LAN interface at start.
    pub gro: bool,
    /// Send runs of TCP segments or UDP datagrams of one flow to the LAN as one frame for the
    /// kernel to cut (GSO or the NIC's TSO/USO).
    pub gso: bool,
    /// Leave checksums left to offload (and those of segments cut here) to the tunnel's far
    /// end (`cyphonic_wire::FLAG_CHECKSUM_DEFERRED`).
    pub defer_checksums: bool,
    /// Capture sockets sharing the LAN port's frames by flow hash (a fanout group), read in
    /// turn: a light flow's frames then wait behind at most a batch of a heavy flow's, not
    /// its whole queue. 1: one socket.
    pub queues: usize,
    /// The bulk capture sockets read through a ring shared with the kernel (TPACKET_V3).
    pub ring: bool,
}

/// Everything the adapter needs to run, checked.
#[derive(Debug, Clone)]
pub struct AdapterConfig {
    /// What every tunnel end has (`lan_block` is its `block`).
    pub common: Common,
    /// The internal NIC.
    pub lan_interface: String,
    /// The gateway's own vIP.
    pub gateway_vip: Ipv4Addr,
    /// MSS clamping.
    pub mss_clamp: bool,
    /// Where the DHCP leases are kept.
    pub state_dir: PathBuf,
    /// The DHCP server, unless switched off.
    pub dhcp: Option<cyphonic_vip::DhcpConfig>,
    /// Whether the DHCP server serves DHCPv6 too, on an untagged segment with IPv6
    /// (`[dhcp] ipv6`).
    pub dhcp6: bool,
    /// The LAN side's part of `[dataplane]`.
    pub lan_dataplane: LanDataplane,
    /// Fixed addresses: the reservations, then the legacy devices.
    pub reservations: Vec<Reservation>,
    /// The legacy subnet's map and old router, if `[legacy]` says so.
    pub legacy: Option<cyphonic_gateway::Legacy>,
    /// Whether devices of the legacy subnet not declared are learned (`[legacy] learn`).
    pub learn_legacy: bool,
    /// One of an HA pair, if `[ha]` says so.
    pub ha: Option<HaSettings>,
    /// The VLAN segments of a trunked LAN port, if `[[vlan]]` names any.
    pub vlans: Vec<VlanSegment>,
}

/// A VLAN segment of the trunked LAN port (`[[vlan]]`), checked.
#[derive(Debug, Clone, PartialEq)]
pub struct VlanSegment {
    /// The VLAN identifier its frames carry.
    pub tag: u16,
    /// Its part of the certified block.
    pub block: Ipv4Net,
    /// Its IPv6 /64, when the certificate holds an IPv6 block.
    pub block6: Option<ipnet::Ipv6Net>,
    /// Its gateway address.
    pub gateway: Ipv4Addr,
    /// Its DHCP server, unless `[dhcp]` is switched off.
    pub dhcp: Option<cyphonic_vip::DhcpConfig>,
    /// The groups its block stands in.
    pub groups: Vec<String>,
    /// Its legacy subnet's map and old router address, if `[vlan.legacy]` says so.
    pub legacy: Option<cyphonic_gateway::Legacy>,
    /// Whether devices of its legacy subnet not declared are learned.
    pub learn_legacy: bool,
}

/// `[ha]`, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HaSettings {
    /// 1-254: the higher serves when both are equally healthy and started together.
    pub priority: u8,
    /// Take the gateway back, once holding the active's leases, when of higher priority.
    pub preempt: bool,
    /// The other box's underlay address: the pair's messages go there too, so that a cut
    /// between the two on the LAN alone is not taken for the other's death.
    pub peer_underlay: Option<std::net::IpAddr>,
    /// The UDP port of the pair's messages on the underlay, the same on both boxes.
    pub port: u16,
}

/// A DHCP configuration but for its reservations (which a reload applies).
fn without_reservations(
    dhcp: &Option<cyphonic_vip::DhcpConfig>,
) -> Option<cyphonic_vip::DhcpConfig> {
    dhcp.clone().map(|d| cyphonic_vip::DhcpConfig {
        reservations: Vec::new(),
        ..d
    })
}

/// The VLAN segments but their DHCP servers' reservations (which a reload applies).
fn vlans_but_reservations(vlans: &[VlanSegment]) -> Vec<VlanSegment> {
    vlans
        .iter()
        .map(|v| VlanSegment {
            dhcp: without_reservations(&v.dhcp),
            ..v.clone()
        })
        .collect()
}

/// The untagged segment's /64: the first of the certificate's IPv6 block, when it holds one
/// of /64 or larger.
fn lan_prefix6(common: &Common) -> Option<ipnet::Ipv6Net> {
    let (block, _) = common.ipv6?;
    ipnet::Ipv6Net::new(block.network(), 64)
        .ok()
        .filter(|_| block.prefix_len() <= 64)
}

/// The reservations' fixed IPv6 addresses as the DHCPv6 server takes them.
pub fn dhcp6_reservations(reservations: &[Reservation]) -> Vec<cyphonic_vip::Reservation6> {
    reservations
        .iter()
        .filter_map(|r| {
            Some(cyphonic_vip::Reservation6 {
                mac: r.mac.0,
                ip: r.vip6?,
            })
        })
        .collect()
}

/// The reservations as the DHCP server takes them (legacy devices are none of its).
pub fn dhcp_reservations(reservations: &[Reservation]) -> Vec<cyphonic_vip::Reservation> {
    reservations
        .iter()
        .filter(|r| r.legacy.is_none())
        .map(|r| cyphonic_vip::Reservation {
            mac: r.mac.0,
            ip: r.vip,
            hostname: r.hostname.clone(),
        })
        .collect()
}

/// What a reload of `reservations` applies to a running adapter, and what waits for the
/// restart: a legacy device is applied where the running map of the segment holding its vIP
/// (`running`: the untagged segment's, or a VLAN's) puts its address at the vIP the file's
/// map does (the same map), and waits otherwise (a changed `[legacy]`).
pub fn reloadable(
    reservations: Vec<Reservation>,
    running: impl Fn(Ipv4Addr) -> Option<cyphonic_gateway::Legacy>,
) -> (Vec<Reservation>, Vec<Reservation>) {
    reservations.into_iter().partition(|r| {
        r.legacy
            .is_none_or(|own| running(r.vip).and_then(|l| l.map.to_overlay(own)) == Some(r.vip))
    })
}

impl AsRef<Common> for AdapterConfig {
    fn as_ref(&self) -> &Common {
        &self.common
    }
}

impl AdapterConfig {
    /// The adapter's own keys that differ in `new`: each takes effect at a restart (the
    /// keys every tunnel end has are compared by the daemon core; `[[reservation]]` changes
    /// while running).
    pub fn needs_restart(&self, new: &Self) -> Vec<&'static str> {
        cyphonic_settings::changed_keys([
            (
                RawAdapter::lan_interface,
                self.lan_interface != new.lan_interface,
            ),
            (RawAdapter::gateway_vip, self.gateway_vip != new.gateway_vip),
            (RawAdapter::mss_clamp, self.mss_clamp != new.mss_clamp),
            (RawAdapter::state_dir, self.state_dir != new.state_dir),
            (
                "[dhcp]",
                without_reservations(&self.dhcp) != without_reservations(&new.dhcp),
            ),
            (
                "[dataplane] (LAN side)",
                self.lan_dataplane != new.lan_dataplane,
            ),
            ("[ha]", self.ha != new.ha),
            (
                "[[vlan]]",
                vlans_but_reservations(&self.vlans) != vlans_but_reservations(&new.vlans),
            ),
            (
                "[legacy]",
                self.legacy != new.legacy || self.learn_legacy != new.learn_legacy,
            ),
        ])
    }

    /// Our certified LAN block.
    pub const fn lan_block(&self) -> Ipv4Net {
        self.common.block
    }

    /// The untagged segment's IPv6 (docs/protocol.md §7): the first /64 of our IPv6 block,
    /// when the certificate holds one of /64 or larger.
    pub fn lan6(&self) -> Option<cyphonic_gateway::Lan6> {
        self.segment6(
            lan_prefix6(&self.common)?,
            self.dhcp6 && self.dhcp.is_some(),
        )
    }

    /// A VLAN segment's IPv6: its `block6`, with DHCPv6 when the segment has DHCP.
    pub fn vlan_lan6(&self, vlan: &VlanSegment) -> Option<cyphonic_gateway::Lan6> {
        self.segment6(vlan.block6?, self.dhcp6 && vlan.dhcp.is_some())
    }

    /// A segment's IPv6 on `prefix`, with DHCPv6 or not.
    fn segment6(&self, prefix: ipnet::Ipv6Net, dhcp: bool) -> Option<cyphonic_gateway::Lan6> {
        let (_, overlay) = self.common.ipv6?;
        Some(cyphonic_gateway::Lan6 {
            prefix,
            overlay,
            dns: self.common.dns.is_some(),
            dhcp,
            search: self
                .dhcp
                .as_ref()
                .and_then(|d| cyphonic_gateway::Lan6::search_list(&d.domain))
                .unwrap_or_default(),
        })
    }

    /// Every segment's DHCPv6 server, the untagged one's first (with its tag).
    pub fn dhcp6_scopes(
        &self,
        gateway_mac: [u8; 6],
    ) -> Vec<(Option<u16>, cyphonic_vip::Dhcp6Config)> {
        std::iter::once((None, self.lan6()))
            .chain(self.vlans.iter().map(|v| (Some(v.tag), self.vlan_lan6(v))))
            .filter_map(|(tag, v6)| Some((tag, self.dhcp6_config_for(&v6?, gateway_mac)?)))
            .collect()
    }

    /// The DHCPv6 server of a segment with IPv6 `v6`, when it runs there: its /64 and
    /// `[dhcp]`'s lease time, guard and domain; its DUID is made from `gateway_mac`.
    fn dhcp6_config_for(
        &self,
        v6: &cyphonic_gateway::Lan6,
        gateway_mac: [u8; 6],
    ) -> Option<cyphonic_vip::Dhcp6Config> {
        let d = self.dhcp.as_ref().filter(|_| v6.dhcp)?;
        Some(cyphonic_vip::Dhcp6Config {
            prefix: v6.prefix,
            pool: cyphonic_vip::Dhcp6Config::default_pool(v6.prefix),
            lease_secs: d.lease_secs,
            server_mac: gateway_mac,
            dns: v6.dns.then(|| v6.address()),
            domain: d.domain.clone(),
            reservations: self
                .dhcp6_reservations()
                .into_iter()
                .filter(|r| v6.prefix.contains(&r.ip))
                .collect(),
            new_lease_share: d.new_lease_share,
            new_lease_window_secs: d.new_lease_window_secs,
        })
    }

    /// The fixed IPv6 addresses of the reservations, as the DHCPv6 server takes them.
    pub fn dhcp6_reservations(&self) -> Vec<cyphonic_vip::Reservation6> {
        dhcp6_reservations(&self.reservations)
    }

    /// Every segment's DHCP scope, the untagged one first (none: `[dhcp]` is off).
    pub fn dhcp_scopes(&self) -> Vec<(Option<u16>, &cyphonic_vip::DhcpConfig)> {
        let Some(untagged) = &self.dhcp else {
            return Vec::new();
        };
        std::iter::once((None, untagged))
            .chain(
                self.vlans
                    .iter()
                    .filter_map(|v| Some((Some(v.tag), v.dhcp.as_ref()?))),
            )
            .collect()
    }
}

/// Reads, parses and checks the configuration at `path` at unix time `now_secs`, with the
/// certificates and keys it names. Returns the configuration and our identity.
///
/// # Errors
/// A [`ConfigError`] naming the file, and where possible the line and key.
pub fn load(path: &Path, now_secs: u64) -> Result<(AdapterConfig, Identity), ConfigError> {
    cyphonic_settings::load(path, now_secs, check)
}

fn check(raw: &Raw, src: &Source<'_>) -> Result<(AdapterConfig, Identity), ConfigError> {
    let (common, identity) = raw.common(src)?;
    let a = &raw.adapter;
    let cert = identity.certificate();
    let lan_block = common.block;
    // Unset: the block's first host address (an enrolled adapter learns its block only
    // from its certificate).
    let first_host = Ipv4Addr::from(u32::from(lan_block.network()).saturating_add(1));
    let gw = a.gateway_vip.as_ref().map_or(first_host, |g| *g.get_ref());
    let gw_span = a.gateway_vip.as_ref().map_or(0..0, Spanned::span);
    if !lan_block.contains(&gw) || gw == lan_block.network() || gw == lan_block.broadcast() {
        return src.err(
            &gw_span,
            RawAdapter::gateway_vip,
            format!(
                "{gw} must be a host address inside the block {lan_block} certified to {}",
                cert.body().name
            ),
        );
    }
    let prefix6 = lan_prefix6(&common);
    let mut reservations = check_reservations(src, &raw.reservation, (lan_block, gw), prefix6)?;
    let dhcp = check_dhcp(
        src,
        &raw.dhcp,
        cert,
        lan_block,
        gw,
        common.inner_mtu,
        &reservations,
    )?;
    let legacy = match &raw.legacy {
        Some(l) => {
            let (legacy, devices) = check_legacy(
                src,
                l,
                "legacy",
                lan_block,
                gw,
                dhcp.as_ref(),
                &reservations,
            )?;
            reservations.extend(devices);
            Some(legacy)
        }
        None => None,
    };
    let vlans = check_vlans(
        src,
        &raw.vlan,
        Segments {
            block: lan_block,
            gateway: gw,
            dhcp: dhcp.as_ref(),
            legacy: legacy.as_ref(),
            ipv6: common.ipv6.map(|(b, _)| b).zip(prefix6),
        },
        &mut reservations,
    )?;
    // The untagged segment's DHCP server hands out none of the VLANs' reservations.
    let dhcp = dhcp.map(|d| cyphonic_vip::DhcpConfig {
        reservations: segment_reservations(&reservations, lan_block, &vlans, None),
        ..d
    });
    // The devices `[policy]` may name: the reservations, by hostname and groups; and each
    // VLAN segment's block, by its groups.
    let devices: Vec<cyphonic_settings::Device> = reservations
        .iter()
        .map(|r| cyphonic_settings::Device {
            name: r.hostname.clone(),
            blocks: std::iter::once(IpNet::from(Ipv4Net::from(r.vip)))
                .chain(r.vip6.map(|v| IpNet::from(ipnet::Ipv6Net::from(v))))
                .collect(),
            groups: r.groups.clone(),
        })
        .chain(vlans.iter().map(|v| {
            cyphonic_settings::Device {
                name: None,
                blocks: std::iter::once(IpNet::from(v.block))
                    .chain(v.block6.map(IpNet::from))
                    .collect(),
                groups: v.groups.clone(),
            }
        }))
        .collect();
    // Peers ask our DNS service at the gateway address, when it runs.
    let dns = common.dns.is_some().then_some(gw);
    let common = raw.with_policy(src, common, &identity, &devices, dns)?;
    let d = &raw.dataplane;
    if !(1..=LAN_QUEUES_MAX).contains(d.lan_queues.get_ref()) {
        return src.err(
            &d.lan_queues.span(),
            RawDataplane::lan_queues,
            format!("{} is outside 1..={LAN_QUEUES_MAX}", d.lan_queues.get_ref()),
        );
    }
    let ha = match &raw.ha {
        Some(h) if !(1..=254).contains(h.priority.get_ref()) => {
            return src.err(
                &h.priority.span(),
                RawHa::priority,
                format!("{} is outside 1..=254", h.priority.get_ref()),
            );
        }
        Some(h) => Some(HaSettings {
            priority: *h.priority.get_ref(),
            preempt: h.preempt,
            peer_underlay: h.peer_underlay,
            port: h.port,
        }),
        None => None,
    };
    let config = AdapterConfig {
        common,
        lan_interface: a.lan_interface.clone(),
        gateway_vip: gw,
        mss_clamp: a.mss_clamp,
        state_dir: src.resolve(&a.state_dir),
        dhcp6: raw.dhcp.enabled && raw.dhcp.ipv6,
        dhcp,
        lan_dataplane: LanDataplane {
            buffer: d.lan_buffer,
            gro: d.lan_gro,
            gso: d.lan_gso,
            defer_checksums: d.defer_checksums,
            queues: *d.lan_queues.get_ref(),
            ring: d.lan_ring,
        },
        reservations,
        legacy,
        learn_legacy: raw.legacy.as_ref().is_some_and(|l| l.learn),
        ha,
        vlans,
    };
    Ok((config, identity))
}

/// Reservations: inside the block, unique MACs and addresses, not the gateway; a fixed IPv6
/// address inside the LAN's /64 (`prefix6`, none without an IPv6 block), not its first two.
fn check_reservations(
    src: &Source<'_>,
    raw: &[RawReservation],
    (lan_block, gw): (Ipv4Net, Ipv4Addr),
    prefix6: Option<ipnet::Ipv6Net>,
) -> Result<Vec<Reservation>, ConfigError> {
    let mut macs = HashSet::new();
    let mut vips = HashSet::new();
    let mut vips6 = HashSet::new();
    let mut reservations = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let vip = *r.vip.get_ref();
        let key = |k: &str| cyphonic_settings::indexed(k, i);
        if !lan_block.contains(&vip)
            || vip == gw
            || vip == lan_block.network()
            || vip == lan_block.broadcast()
        {
            return src.err(
                &r.vip.span(),
                &key(RawReservation::vip),
                format!("{vip} is not a free host address of the block {lan_block}"),
            );
        }
        if !vips.insert(vip) {
            return src.err(
                &r.vip.span(),
                &key(RawReservation::vip),
                format!("{vip} is reserved twice"),
            );
        }
        if !macs.insert(*r.mac.get_ref()) {
            return src.err(
                &r.mac.span(),
                &key(RawReservation::mac),
                format!("{} is reserved twice", r.mac.get_ref()),
            );
        }
        if let Some(v) = &r.vip6 {
            let ip = *v.get_ref();
            let why = match prefix6 {
                None => Some("the certificate holds no IPv6 block of /64 or larger".to_owned()),
                Some(p) if !p.contains(&ip) || ip.to_bits() <= (p.network().to_bits() | 1) => {
                    Some(format!("{ip} is not a free host address of the LAN's {p}"))
                }
                Some(_) if !vips6.insert(ip) => Some(format!("{ip} is reserved twice")),
                Some(_) => None,
            };
            if let Some(why) = why {
                return src.err(&v.span(), &key(RawReservation::vip6), why);
            }
        }
        if let Some(h) = &r.hostname {
            check_label(src, h, &key(RawReservation::hostname))?;
        }
        check_groups(src, &r.groups, &key(RawReservation::groups))?;
        reservations.push(Reservation {
            mac: *r.mac.get_ref(),
            vip,
            vip6: r.vip6.as_ref().map(|v| *v.get_ref()),
            legacy: None,
            hostname: r.hostname.as_ref().map(|h| h.get_ref().clone()),
            groups: r.groups.iter().map(|g| g.get_ref().clone()).collect(),
        });
    }
    Ok(reservations)
}

/// A device's name: a DNS label.
fn check_label(src: &Source<'_>, h: &Spanned<String>, key: &str) -> Result<(), ConfigError> {
    let label = h.get_ref();
    let ok = !label.is_empty()
        && label.len() <= 63
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-');
    if ok {
        return Ok(());
    }
    src.err(
        &h.span(),
        key,
        format!("{label:?} is not a DNS label (a-z, 0-9, inner hyphens, 1 to 63)"),
    )
}

/// A device's groups: words, not addresses.
fn check_groups(
    src: &Source<'_>,
    groups: &[Spanned<String>],
    key: &str,
) -> Result<(), ConfigError> {
    for (j, g) in groups.iter().enumerate() {
        let name = g.get_ref();
        if name.is_empty() || name.parse::<Ipv4Addr>().is_ok() || name.contains('/') {
            return src.err(
                &g.span(),
                &format!("{key}[{j}]"),
                format!("{name:?} is not a group's name (a word, not an address)"),
            );
        }
    }
    Ok(())
}

/// A DHCP pool written `first-last`.
fn parse_pool(
    src: &Source<'_>,
    text: &Spanned<String>,
    key: &str,
) -> Result<(Ipv4Addr, Ipv4Addr), ConfigError> {
    let parsed = text
        .get_ref()
        .split_once('-')
        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
    match parsed {
        Some(pool) => Ok(pool),
        None => src.err(
            &text.span(),
            key,
            format!(
                "{:?} is not a range of addresses like \"100.64.1.100-100.64.1.199\"",
                text.get_ref()
            ),
        ),
    }
}

/// What the VLAN segments must keep clear of: the untagged segment's.
#[derive(Clone, Copy)]
struct Segments<'a> {
    /// The certified block.
    block: Ipv4Net,
    /// The untagged segment's gateway.
    gateway: Ipv4Addr,
    /// Its DHCP server.
    dhcp: Option<&'a cyphonic_vip::DhcpConfig>,
    /// Its legacy map.
    legacy: Option<&'a cyphonic_gateway::Legacy>,
    /// The certificate's IPv6 block and the untagged segment's /64 in it, if it holds one.
    ipv6: Option<(ipnet::Ipv6Net, ipnet::Ipv6Net)>,
}

/// Whether two inclusive ranges of addresses share one.
fn overlap(a: (Ipv4Addr, Ipv4Addr), b: (Ipv4Addr, Ipv4Addr)) -> bool {
    u32::from(a.0) <= u32::from(b.1) && u32::from(b.0) <= u32::from(a.1)
}

/// `[[vlan]]`: distinct tags, blocks inside the certified one and clear of the untagged
/// segment's gateway, pool and legacy map and of each other, a gateway and a pool inside
/// each; each segment's DHCP server (with `[dhcp]`'s lease settings) over its block and the
/// reservations inside it; each segment's legacy map, checked as `[legacy]` is, its devices
/// added to `reservations`.
fn check_vlans(
    src: &Source<'_>,
    raw: &[RawVlan],
    untagged: Segments<'_>,
    reservations: &mut Vec<Reservation>,
) -> Result<Vec<VlanSegment>, ConfigError> {
    let mut vlans: Vec<VlanSegment> = Vec::new();
    let block = untagged.block;
    for (i, v) in raw.iter().enumerate() {
        let key = |k: &str| cyphonic_settings::indexed(k, i);
        let (tag, sub) = (*v.tag.get_ref(), *v.block.get_ref());
        if !(1..=cyphonic_gateway::VID_MAX).contains(&tag) {
            return src.err(
                &v.tag.span(),
                &key(RawVlan::tag),
                format!("{tag} is outside 1..={}", cyphonic_gateway::VID_MAX),
            );
        }
        if vlans.iter().any(|o| o.tag == tag) {
            return src.err(
                &v.tag.span(),
                &key(RawVlan::tag),
                format!("VLAN {tag} is declared twice"),
            );
        }
        let span = v.block.span();
        let clash = |what: String| src.err(&span, &key(RawVlan::block), format!("{sub} {what}"));
        let range = (sub.network(), sub.broadcast());
        if sub.trunc() != sub {
            return clash(format!(
                "is not a block's network address (did you mean {}?)",
                sub.trunc()
            ));
        }
        if !block.contains(&sub) || sub.prefix_len() > 30 {
            return clash(format!(
                "is not a block of at least four addresses inside this adapter's certified block {block}"
            ));
        }
        if sub.contains(&untagged.gateway) {
            return clash(format!(
                "holds the gateway's own address {}",
                untagged.gateway
            ));
        }
        if let Some(d) = untagged.dhcp
            && overlap(range, d.pool)
        {
            return clash(format!(
                "overlaps the DHCP pool {}-{} of the untagged segment: set `dhcp.pool` to a range outside the VLANs' blocks",
                d.pool.0, d.pool.1
            ));
        }
        if let Some(l) = untagged.legacy
            && (sub.contains(&l.map.overlay()) || l.map.overlay().contains(&sub))
        {
            return clash(format!("overlaps `legacy.onto` {}", l.map.overlay()));
        }
        if let Some(o) = vlans
            .iter()
            .find(|o| o.block.contains(&sub) || sub.contains(&o.block))
        {
            return clash(format!("overlaps VLAN {}'s block {}", o.tag, o.block));
        }
        let first_host = Ipv4Addr::from(u32::from(sub.network()).saturating_add(1));
        let gateway = v.gateway.as_ref().map_or(first_host, |g| *g.get_ref());
        if !sub.contains(&gateway) || gateway == sub.network() || gateway == sub.broadcast() {
            let span = v.gateway.as_ref().map(Spanned::span).unwrap_or_default();
            return src.err(
                &span,
                &key(RawVlan::gateway),
                format!("{gateway} is not a host address of the segment's block {sub}"),
            );
        }
        if let Some(r) = reservations.iter().find(|r| r.vip == gateway) {
            let span = v.gateway.as_ref().map(Spanned::span).unwrap_or_default();
            return src.err(
                &span,
                &key(RawVlan::gateway),
                format!("{gateway} is reserved to {}", r.mac),
            );
        }
        let block6 = check_block6(src, v, (i, &key(RawVlan::block6)), untagged.ipv6, &vlans)?;
        check_groups(src, &v.groups, &key(RawVlan::groups))?;
        let dhcp = match untagged.dhcp.filter(|_| v.dhcp) {
            None => None,
            Some(d) => {
                let pool = match &v.pool {
                    None => cyphonic_vip::DhcpConfig::default_pool(sub),
                    Some(text) => parse_pool(src, text, &key(RawVlan::pool))?,
                };
                let cfg = cyphonic_vip::DhcpConfig {
                    server: gateway,
                    block: sub,
                    pool,
                    reservations: dhcp_reservations(reservations.as_slice())
                        .into_iter()
                        .filter(|r| sub.contains(&r.ip))
                        .collect(),
                    ..d.clone()
                };
                if let Err(e) = cyphonic_vip::Server::new(cfg.clone(), Vec::new(), src.now_secs) {
                    let span = v
                        .pool
                        .as_ref()
                        .map_or_else(|| v.block.span(), Spanned::span);
                    return src.err(&span, &key(RawVlan::pool), e.to_string());
                }
                Some(cfg)
            }
        };
        let (legacy, learn_legacy) = match &v.legacy {
            None => (None, false),
            Some(l) => {
                let at = cyphonic_settings::indexed("vlan.legacy", i);
                let (legacy, devices) =
                    check_legacy(src, l, &at, sub, gateway, dhcp.as_ref(), reservations)?;
                reservations.extend(devices);
                (Some(legacy), l.learn)
            }
        };
        vlans.push(VlanSegment {
            tag,
            block: sub,
            block6,
            gateway,
            dhcp,
            groups: v.groups.iter().map(|g| g.get_ref().clone()).collect(),
            legacy,
            learn_legacy,
        });
    }
    Ok(vlans)
}

/// The `i`-th VLAN's /64 (`key` names it): `block6`, or the IPv6 block's (i+1)-th /64;
/// a /64 inside the block, not the untagged segment's nor another VLAN's. None without IPv6.
fn check_block6(
    src: &Source<'_>,
    v: &RawVlan,
    (i, key): (usize, &str),
    ipv6: Option<(ipnet::Ipv6Net, ipnet::Ipv6Net)>,
    vlans: &[VlanSegment],
) -> Result<Option<ipnet::Ipv6Net>, ConfigError> {
    let span = v.block6.as_ref().map(Spanned::span).unwrap_or_default();
    let Some((site, untagged)) = ipv6 else {
        if v.block6.is_some() {
            return src.err(
                &span,
                key,
                "the certificate holds no IPv6 block of /64 or larger",
            );
        }
        return Ok(None);
    };
    let n = u128::try_from(i).unwrap_or(u128::MAX).saturating_add(1);
    let block6 = match &v.block6 {
        Some(b) => *b.get_ref(),
        None => {
            let at = site.network().to_bits().checked_add(n << 64);
            match at.and_then(|a| ipnet::Ipv6Net::new(Ipv6Addr::from_bits(a), 64).ok()) {
                Some(b) if site.contains(&b) => b,
                _ => {
                    return src.err(
                        &v.block.span(),
                        key,
                        format!("{site} has no {n}th /64 beyond the LAN's: set block6"),
                    );
                }
            }
        }
    };
    let why = if block6.prefix_len() != 64 || block6.trunc() != block6 {
        Some(format!("{block6} is not a /64's network"))
    } else if !site.contains(&block6) {
        Some(format!(
            "{block6} is not inside the certified IPv6 block {site}"
        ))
    } else if block6 == untagged {
        Some(format!("{block6} is the untagged segment's"))
    } else {
        vlans
            .iter()
            .find(|o| o.block6 == Some(block6))
            .map(|o| format!("{block6} is VLAN {}'s already", o.tag))
    };
    match why {
        Some(why) => src.err(&span, key, why),
        None => Ok(Some(block6)),
    }
}

/// The reservations the DHCP server of segment `tag` (None: the untagged one) hands out:
/// those inside its block (the untagged segment's: outside every VLAN's).
pub fn segment_reservations(
    reservations: &[Reservation],
    block: Ipv4Net,
    vlans: &[VlanSegment],
    tag: Option<u16>,
) -> Vec<cyphonic_vip::Reservation> {
    let within = |ip: &Ipv4Addr| match tag {
        None => block.contains(ip) && !vlans.iter().any(|v| v.block.contains(ip)),
        Some(t) => vlans.iter().any(|v| v.tag == t && v.block.contains(ip)),
    };
    dhcp_reservations(reservations)
        .into_iter()
        .filter(|r| within(&r.ip))
        .collect()
}

/// `key`, a key of `[legacy]` (`legacy.onto`, `legacy.device[2].mac`), as named in the legacy
/// table at `at` (`legacy`, or a VLAN's: `vlan[1].legacy`).
fn under(at: &str, key: &str) -> String {
    match key.strip_prefix("legacy") {
        Some(rest) => format!("{at}{rest}"),
        None => key.to_owned(),
    }
}

/// `[legacy]` (or a VLAN's, the table at `at`): the map (a part of the block as large as the subnet, clear of the gateway,
/// the reservations and the DHCP pool), the old router inside the subnet, and the devices,
/// each at a free host address of the subnet, with a MAC and a name of its own.
fn check_legacy(
    src: &Source<'_>,
    l: &RawLegacy,
    at: &str,
    block: Ipv4Net,
    gw: Ipv4Addr,
    dhcp: Option<&cyphonic_vip::DhcpConfig>,
    reservations: &[Reservation],
) -> Result<(cyphonic_gateway::Legacy, Vec<Reservation>), ConfigError> {
    // A VLAN's map lies in the VLAN's block, the untagged segment's in the certified one.
    let whose = if at == "legacy" {
        "this adapter's certified block"
    } else {
        "its VLAN's block"
    };
    let (subnet, onto) = (*l.subnet.get_ref(), *l.onto.get_ref());
    let span = l.onto.span();
    let map = match cyphonic_gateway::Netmap::new(subnet, onto) {
        Ok(map) => map,
        Err(e) => {
            return src.err(
                &span,
                &under(at, RawLegacy::onto),
                format!("{onto}: {e} ({subnet})"),
            );
        }
    };
    let onto = map.overlay();
    if !block.contains(&onto) {
        return src.err(
            &span,
            &under(at, RawLegacy::onto),
            format!("{onto} is not inside {whose} {block}"),
        );
    }
    if onto.contains(&gw) {
        return src.err(
            &span,
            &under(at, RawLegacy::onto),
            format!("{onto} holds the gateway's own address {gw}"),
        );
    }
    if let Some(r) = reservations.iter().find(|r| onto.contains(&r.vip)) {
        return src.err(
            &span,
            &under(at, RawLegacy::onto),
            format!("{onto} holds {}, reserved to {}", r.vip, r.mac),
        );
    }
    if let Some(d) = dhcp {
        let (first, last) = d.pool;
        if u32::from(first) <= u32::from(onto.broadcast())
            && u32::from(onto.network()) <= u32::from(last)
        {
            return src.err(
                &span,
                &under(at, RawLegacy::onto),
                format!(
                    "{onto} overlaps the DHCP pool {first}-{last}: set `dhcp.pool` to a range outside it"
                ),
            );
        }
    }
    let subnet = map.legacy();
    let free =
        |a: Ipv4Addr| subnet.contains(&a) && a != subnet.network() && a != subnet.broadcast();
    let gateway = *l.gateway.get_ref();
    if !free(gateway) {
        return src.err(
            &l.gateway.span(),
            &under(at, RawLegacy::gateway),
            format!("{gateway} is not a host address of the subnet {subnet}"),
        );
    }
    let router = match &l.router {
        Some(r) if !free(*r.get_ref()) || *r.get_ref() == gateway => {
            return src.err(
                &r.span(),
                &under(at, RawLegacy::router),
                format!(
                    "{} is not a host address of the subnet {subnet} other than the gateway",
                    r.get_ref()
                ),
            );
        }
        Some(r) if dhcp.is_some() => {
            return src.err(
                &r.span(),
                &under(at, RawLegacy::router),
                if at == "legacy" {
                    "beside the site's router the adapter serves no DHCP (the router, or the site's DHCP server, does): set [dhcp] enabled = false"
                } else {
                    "beside the site's router the adapter serves no DHCP on its VLAN (the router, or the site's DHCP server, does): set the VLAN's dhcp = false"
                },
            );
        }
        r => r.as_ref().map(|r| *r.get_ref()),
    };
    let mut devices: Vec<Reservation> = Vec::new();
    for (i, d) in l.device.iter().enumerate() {
        let key = |k: &str| under(at, &cyphonic_settings::indexed(k, i));
        let address = *d.address.get_ref();
        let mac = *d.mac.get_ref();
        let Some(vip) = map
            .to_overlay(address)
            .filter(|_| free(address) && address != gateway && Some(address) != router)
        else {
            return src.err(
                &d.address.span(),
                &key(RawLegacyDevice::address),
                format!("{address} is not a free host address of the subnet {subnet}"),
            );
        };
        if devices.iter().any(|o| o.legacy == Some(address)) {
            return src.err(
                &d.address.span(),
                &key(RawLegacyDevice::address),
                format!("{address} is declared twice"),
            );
        }
        if reservations.iter().chain(&devices).any(|o| o.mac == mac) {
            return src.err(
                &d.mac.span(),
                &key(RawLegacyDevice::mac),
                format!("{mac} is declared twice (a reservation or a device)"),
            );
        }
        check_label(src, &d.name, &key(RawLegacyDevice::name))?;
        let name = d.name.get_ref();
        if reservations
            .iter()
            .chain(&devices)
            .any(|o| o.hostname.as_ref() == Some(name))
        {
            return src.err(
                &d.name.span(),
                &key(RawLegacyDevice::name),
                format!("{name:?} names another device already"),
            );
        }
        check_groups(src, &d.groups, &key(RawLegacyDevice::groups))?;
        devices.push(Reservation {
            mac,
            vip,
            vip6: None,
            legacy: Some(address),
            hostname: Some(name.clone()),
            groups: d.groups.iter().map(|g| g.get_ref().clone()).collect(),
        });
    }
    Ok((
        cyphonic_gateway::Legacy {
            map,
            gateway,
            router,
        },
        devices,
    ))
}

/// The DHCP server's configuration, checked by building a server with it: the pool must
/// lie inside the certified block.
fn check_dhcp(
    src: &Source<'_>,
    d: &RawDhcp,
    cert: &Certificate,
    block: Ipv4Net,
    gw: Ipv4Addr,
    mtu: u16,
    reservations: &[Reservation],
) -> Result<Option<cyphonic_vip::DhcpConfig>, ConfigError> {
    use cyphonic_vip::ConfigError as E;
    if !d.enabled {
        return Ok(None);
    }
    let pool = match &d.pool {
        None => cyphonic_vip::DhcpConfig::default_pool(block),
        Some(text) => parse_pool(src, text, RawDhcp::pool)?,
    };
    if *d.new_lease_window.get_ref() == 0 {
        return src.err(
            &d.new_lease_window.span(),
            RawDhcp::new_lease_window,
            "must be at least 1 second",
        );
    }
    let name = cert.body().name.clone();
    let cfg = cyphonic_vip::DhcpConfig {
        server: gw,
        block,
        pool,
        lease_secs: *d.lease_time.get_ref(),
        mtu,
        domain: name.clone(),
        reservations: dhcp_reservations(reservations),
        new_lease_share: *d.new_lease_share.get_ref(),
        new_lease_window_secs: *d.new_lease_window.get_ref(),
    };
    match cyphonic_vip::Server::new(cfg.clone(), Vec::new(), src.now_secs) {
        Ok(_) => Ok(Some(cfg)),
        Err(e @ E::PoolOutsideBlock { .. }) => {
            let span = d.pool.as_ref().map(Spanned::span).unwrap_or_default();
            src.err(
                &span,
                RawDhcp::pool,
                format!("{e} (certified to {name}); the adapter refuses to start"),
            )
        }
        Err(e @ E::LeaseTime(_)) => {
            src.err(&d.lease_time.span(), RawDhcp::lease_time, e.to_string())
        }
        Err(e @ E::Share(_)) => src.err(
            &d.new_lease_share.span(),
            RawDhcp::new_lease_share,
            e.to_string(),
        ),
        Err(e) => {
            let span = d.pool.as_ref().map(Spanned::span).unwrap_or_default();
            src.err(&span, RawDhcp::pool, e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use cyphonic_settings::testing::{
        Fixture, Node, SHARED_MISTAKES, assert_documents_every_key, assert_mistakes,
    };

    use super::*;

    const NOW: u64 = 1_800_000_000;

    /// A directory with a CA, gw1's key and certificate, gw2's certificate and the example
    /// configuration, as the example's relative paths expect. Removed on drop.
    fn fixture() -> Fixture {
        let f = Fixture::new(
            "config",
            NOW,
            &[
                Node {
                    name: "gw1.ovl.example",
                    block: "100.64.1.0/24",
                    path: "gw1.ovl.example",
                    with_key: true,
                },
                Node {
                    name: "gw2.ovl.example",
                    block: "100.64.2.0/24",
                    path: "peers/gw2.ovl.example",
                    with_key: false,
                },
            ],
        );
        f.write("adapter.toml", EXAMPLE);
        f
    }

    const EXAMPLE: &str = include_str!("../../config/adapter.example.toml");

    fn load_text(f: &Fixture, text: &str) -> Result<(AdapterConfig, Identity), ConfigError> {
        load(&f.write("test.toml", text), NOW)
    }

    /// Issue 53: a certificate with an IPv6 block of /64 or larger gives the untagged
    /// segment the block's first /64; a longer one, or none, gives it no IPv6; IPv6 needs an
    /// inner MTU of 1280, said at the key.
    #[test]
    fn an_ipv6_block_gives_the_lan_its_first_64() {
        let with = |block: &str| {
            let f = Fixture::new(
                "config-v6",
                NOW,
                &[Node {
                    name: "gw1.ovl.example",
                    block,
                    path: "gw1.ovl.example",
                    with_key: true,
                }],
            );
            let text = EXAMPLE
                .lines()
                .filter(|l| !l.starts_with("certificate = \"peers/"))
                .collect::<Vec<_>>()
                .join("\n");
            let text = text.split("[[peer]]").next().unwrap_or_default().to_owned();
            (f, text)
        };
        let (f, text) = with("100.64.1.0/24 fd7a:0:1:100::/56");
        let (c, _) = load_text(&f, &text).unwrap();
        let lan6 = c.lan6().unwrap();
        assert_eq!(lan6.prefix, "fd7a:0:1:100::/64".parse().unwrap());
        assert_eq!(lan6.overlay, "fd7a:0:1::/48".parse().unwrap());
        assert_eq!(
            lan6.address(),
            "fd7a:0:1:100::1".parse::<Ipv6Addr>().unwrap()
        );
        let (f, text) = with("100.64.1.0/24 fd7a:0:1:100::9/128");
        assert_eq!(load_text(&f, &text).unwrap().0.lan6(), None);
        let (f, text) = with("100.64.1.0/24");
        assert_eq!(load_text(&f, &text).unwrap().0.lan6(), None);
        let (f, text) = with("100.64.1.0/24 fd7a:0:1:100::/56");
        let small = text.replace("inner_mtu = 1420", "inner_mtu = 1200");
        assert_ne!(small, text);
        let e = load_text(&f, &small).unwrap_err().to_string();
        assert!(
            e.contains("key `adapter.inner_mtu`: 1200: the certificate holds an IPv6 block"),
            "{e}"
        );
        // A reservation's fixed IPv6 address: inside the /64, past its first two, once; the
        // DHCPv6 server gives it, and [policy] names the device by both its addresses.
        let fixed =
            |v: &str| text.replace("# vip6 = \"fd7a:0:1:100::10\"", &format!("vip6 = \"{v}\""));
        let (c, _) = load_text(&f, &fixed("fd7a:0:1:100::10")).unwrap();
        let sensor = c.reservations.iter().find(|r| r.vip6.is_some()).unwrap();
        assert_eq!(sensor.vip6, Some("fd7a:0:1:100::10".parse().unwrap()));
        let scopes6 = c.dhcp6_scopes([2, 0, 0, 0, 0, 1]);
        // The untagged segment's and VLAN 20's (it serves DHCP), each on its /64.
        assert_eq!(
            scopes6
                .iter()
                .map(|(tag, d)| (*tag, d.prefix.to_string()))
                .collect::<Vec<_>>(),
            [
                (None, "fd7a:0:1:100::/64".to_owned()),
                (Some(20), "fd7a:0:1:101::/64".to_owned())
            ]
        );
        let d6 = &scopes6[0].1;
        assert!(scopes6[1].1.reservations.is_empty());
        assert_eq!(
            d6.reservations,
            [cyphonic_vip::Reservation6 {
                mac: sensor.mac.0,
                ip: "fd7a:0:1:100::10".parse().unwrap()
            }]
        );
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            c.common.policy_names.matching("sensor1"),
            Some(vec![net("100.64.1.10/32"), net("fd7a:0:1:100::10/128")])
        );
        // A member is named by every certified block, of both families.
        let ours = c.common.policy_names.matching("gw1.ovl.example").unwrap();
        assert!(ours.contains(&net("fd7a:0:1:100::/56")), "{ours:?}");
        for (bad, why) in [
            (
                "fd7a:0:1:101::10",
                "is not a free host address of the LAN's fd7a:0:1:100::/64",
            ),
            ("fd7a:0:1:100::1", "is not a free host address"),
            ("fd7a:0:1:100::", "is not a free host address"),
        ] {
            let e = load_text(&f, &fixed(bad)).unwrap_err().to_string();
            assert!(
                e.contains("reservation[0].vip6") && e.contains(why),
                "{bad}: {e}"
            );
        }
        let twice = fixed("fd7a:0:1:100::10").replace(
            "vip = \"100.64.1.11\"",
            "vip = \"100.64.1.11\"\nvip6 = \"fd7a:0:1:100::10\"",
        );
        let e = load_text(&f, &twice).unwrap_err().to_string();
        assert!(e.contains("reserved twice"), "{e}");
        // A VLAN's /64: by default the block's second; given, a free /64 of the block.
        assert_eq!(
            c.vlans[0].block6,
            Some("fd7a:0:1:101::/64".parse().unwrap())
        );
        assert_eq!(
            c.vlan_lan6(&c.vlans[0]).map(|v| (v.prefix, v.dhcp)),
            Some(("fd7a:0:1:101::/64".parse().unwrap(), true))
        );
        let names = c.common.policy_names.resolve("cameras").unwrap();
        assert!(names.contains(&net("fd7a:0:1:101::/64")), "{names:?}");
        let vlan6 = |b: &str| {
            text.replace(
                "# block6 = \"fd7a:0:1:101::/64\"",
                &format!("block6 = \"{b}\""),
            )
        };
        let (c, _) = load_text(&f, &vlan6("fd7a:0:1:1ff::/64")).unwrap();
        assert_eq!(
            c.vlans[0].block6,
            Some("fd7a:0:1:1ff::/64".parse().unwrap())
        );
        for (bad, why) in [
            ("fd7a:0:1:100::/64", "is the untagged segment's"),
            (
                "fd7a:0:2:100::/64",
                "is not inside the certified IPv6 block",
            ),
            ("fd7a:0:1:101::/80", "is not a /64's network"),
        ] {
            let e = load_text(&f, &vlan6(bad)).unwrap_err().to_string();
            assert!(
                e.contains("vlan[0].block6") && e.contains(why),
                "{bad}: {e}"
            );
        }
        let (f, text) = with("100.64.1.0/24");
        let (c, _) = load_text(&f, &text).unwrap();
        assert_eq!(c.vlans[0].block6, None);
        let e = load_text(&f, &text.replace("# block6 = ", "block6 = "))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("vlan[0].block6") && e.contains("no IPv6 block"),
            "{e}"
        );
        let only4 = text.replace(
            "# vip6 = \"fd7a:0:1:100::10\"",
            "vip6 = \"fd7a:0:1:100::10\"",
        );
        let e = load_text(&f, &only4).unwrap_err().to_string();
        assert!(e.contains("the certificate holds no IPv6 block"), "{e}");
    }

    /// `[ha]`: its priority within 1..=254, preempt off unless said; absent, no pair.
    #[test]
    fn the_ha_table_is_checked() {
        let f = fixture();
        let (c, _) = load(&f.path().join("adapter.toml"), NOW).unwrap();
        assert_eq!(
            c.ha,
            Some(HaSettings {
                priority: 200,
                preempt: false,
                peer_underlay: Some("198.51.100.3".parse().unwrap()),
                port: 51821,
            })
        );
        let without: String = EXAMPLE.split("\n[ha]\n").next().unwrap().to_owned();
        let (c, _) = load_text(&f, &without).unwrap();
        assert_eq!(c.ha, None);
        for bad in ["0", "255"] {
            let text = format!("{without}\n[ha]\npriority = {bad}\n");
            let err = load_text(&f, &text).unwrap_err().to_string();
            assert!(
                err.contains("ha.priority") && err.contains("outside 1..=254"),
                "{err}"
            );
        }
        let text = format!("{without}\n[ha]\npriority = 1\npreempt = true\n");
        let (c, _) = load_text(&f, &text).unwrap();
        assert_eq!(
            c.ha,
            Some(HaSettings {
                priority: 1,
                preempt: true,
                peer_underlay: None,
                port: 51821,
            })
        );
    }

    #[test]
    fn the_example_configuration_is_valid() {
        let f = fixture();
        let (c, id) = load(&f.path().join("adapter.toml"), NOW).unwrap();
        assert_eq!(id.certificate().body().name, "gw1.ovl.example");
        assert_eq!(c.lan_block().to_string(), "100.64.1.0/24");
        assert_eq!(c.gateway_vip, Ipv4Addr::new(100, 64, 1, 1));
        // Two reservations, then the legacy device, then the camera VLAN's: mapped, named,
        // none of DHCP's.
        assert_eq!(c.reservations.len(), 4);
        let fixed = |r: &Reservation| (r.vip, r.legacy, r.hostname.clone());
        let own = Some(Ipv4Addr::new(192, 0, 2, 5));
        assert_eq!(
            [fixed(&c.reservations[2]), fixed(&c.reservations[3])],
            [
                (Ipv4Addr::new(100, 64, 1, 229), own, Some("plc1".to_owned())),
                (Ipv4Addr::new(100, 64, 1, 221), own, Some("cam7".to_owned())),
            ]
        );
        assert_eq!(
            c.vlans
                .iter()
                .map(|v| (v.tag, v.gateway))
                .collect::<Vec<_>>(),
            [(20, Ipv4Addr::new(100, 64, 1, 209))]
        );
        assert_eq!(c.reservations[0].hostname.as_deref(), Some("sensor1"));
        let legacy = c.legacy.unwrap();
        assert_eq!(legacy.gateway, Ipv4Addr::new(192, 0, 2, 1));
        // Beside the site's router, with DHCP off.
        let text = EXAMPLE
            .replace("# router = \"192.0.2.1\"", "router = \"192.0.2.3\"")
            .replacen("enabled = true", "enabled = false", 1);
        let (beside, _) = load_text(&f, &text).unwrap();
        assert_eq!(
            beside.legacy.map(|l| (l.gateway, l.router)),
            Some((
                Ipv4Addr::new(192, 0, 2, 1),
                Some(Ipv4Addr::new(192, 0, 2, 3))
            ))
        );
        // A reload hands DHCP the reservations alone; the legacy device joins while the map
        // is the running one's, and waits for the restart when it is not.
        // Each is judged against the running map of its own segment.
        assert_eq!(dhcp_reservations(&c.reservations).len(), 2);
        let cams = &c.vlans[0];
        let running = |vip: Ipv4Addr| {
            if cams.block.contains(&vip) {
                cams.legacy
            } else {
                Some(legacy)
            }
        };
        let (now, later) = reloadable(c.reservations.clone(), running);
        assert_eq!((now, later.len()), (c.reservations.clone(), 0));
        let (_, later) = reloadable(c.reservations.clone(), |_| Some(legacy));
        assert_eq!(
            later
                .iter()
                .map(|r| r.hostname.as_deref())
                .collect::<Vec<_>>(),
            [Some("cam7")],
            "the camera VLAN's device is not the untagged map's"
        );
        let moved = cyphonic_gateway::Legacy {
            map: cyphonic_gateway::Netmap::new(
                "192.0.2.0/28".parse().unwrap(),
                "100.64.1.240/28".parse().unwrap(),
            )
            .unwrap(),
            ..legacy
        };
        for untagged in [Some(moved), None] {
            let running = |vip: Ipv4Addr| {
                if cams.block.contains(&vip) {
                    cams.legacy
                } else {
                    untagged
                }
            };
            let (now, later) = reloadable(c.reservations.clone(), running);
            assert_eq!((now.len(), later[0].hostname.as_deref()), (3, Some("plc1")));
        }
        assert_eq!(c.common.peers.len(), 1);
        assert_eq!(
            c.common.peers[0].persistent_keepalive,
            Some(Duration::from_secs(25))
        );
        assert_eq!(c.common.dataplane.aead, cyphonic_crypto::Backend::Ring);
        assert!(c.common.status_socket.is_absolute());
        assert_eq!(c.common.overlay_domain, "ovl.example");
        let dhcp = c.dhcp.unwrap();
        assert_eq!(
            dhcp.pool,
            (
                Ipv4Addr::new(100, 64, 1, 100),
                Ipv4Addr::new(100, 64, 1, 199)
            )
        );
        assert_eq!((dhcp.mtu, dhcp.domain.as_str()), (1420, "gw1.ovl.example"));
        assert_eq!(dhcp.reservations.len(), 2);
        assert_eq!(
            c.common.dns,
            Some(cyphonic_settings::Dns {
                upstream: vec![IpAddr::from([192, 0, 2, 53])],
                ttl: 60
            })
        );
        assert_eq!(c.common.peers[0].dns, Ipv4Addr::new(100, 64, 2, 1));
        // [policy]: sensors (sensor1, by its reservation's group) to the nvr; the peer to
        // sensor1 and .11 (icmp and udp: two compiled rules under number 2).
        let policy = c.common.policy.clone().unwrap();
        assert_eq!(policy.flows, 16384);
        let rules = &policy.rules;
        // Three written (rule 2 twice: icmp, udp), then DNS (udp, tcp) as rule 0.
        assert_eq!(rules.rules.len(), 5);

        let (sensor1, other, nvr, peer) = (
            Ipv4Addr::new(100, 64, 1, 10),
            Ipv4Addr::new(100, 64, 1, 11),
            Ipv4Addr::new(100, 64, 2, 20),
            Ipv4Addr::new(100, 64, 2, 9),
        );
        assert_eq!(rules.first_allowing(6, sensor1, nvr, 554), Some(1));
        assert_eq!(rules.first_allowing(6, other, nvr, 554), None);
        assert_eq!(rules.first_allowing(6, nvr, sensor1, 554), None);
        assert_eq!(rules.first_allowing(1, peer, other, 0), Some(2));
        assert_eq!(rules.first_allowing(17, peer, sensor1, 5050), Some(2));
        assert_eq!(rules.first_allowing(17, peer, sensor1, 5101), None);
        // Three written (rule 2 twice: icmp, udp), then DNS to the gateway and the peer's
        // DNS server (udp, tcp) as rule 0.
        let gw2_dns = Ipv4Addr::new(100, 64, 2, 1);
        assert_eq!(rules.first_allowing(17, sensor1, gw2_dns, 53), Some(0));
        assert_eq!(
            rules.first_allowing(6, peer, Ipv4Addr::new(100, 64, 1, 1), 53),
            Some(0)
        );
        assert_eq!(rules.first_allowing(17, peer, sensor1, 53), None);
        // The dry run reads names the way the rules do.
        let ask = |from: &str, to: &str, what: &str| {
            cyphonic_daemon::cli::dry_run(&c.common, from, to, what)
                .map_err(|e| e.to_string())
                .map(|(allowed, answer)| (allowed, answer.contains("by rule 1")))
        };
        assert_eq!(ask("sensor1", "nvr", "tcp/554"), Ok((true, true)));
        assert_eq!(ask("100.64.1.11", "nvr", "tcp/554").map(|a| a.0), Ok(false));
        assert_eq!(ask("sensor1", "nvr", "tcp/22").map(|a| a.0), Ok(false));
        assert!(
            ask("sensors", "nvr", "tcp/554").is_ok(),
            "a group of one device"
        );
        assert_eq!(
            ask("all-sensors", "nvr", "tcp/554"),
            Ok((true, true)),
            "a group by pattern: sensor1"
        );
        assert!(
            ask("gw2.ovl.example", "sensor1", "icmp").is_err_and(|e| e.contains("100.64.2.0/24")),
            "a block is not one address"
        );
        assert!(ask("sensor1", "nvr", "any").is_err());
        assert!(ask("sensor9", "nvr", "icmp").is_err());
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        let f = fixture();
        let minimal = "[adapter]\nlan_interface = \"eth1\"\ngateway_vip = \"100.64.1.1\"\n\n[identity]\ncertificate = \"gw1.ovl.example.crt\"\nkey = \"gw1.ovl.example.key\"\nca = \"ca.crt\"\n";
        let (c, _) = load_text(&f, minimal).unwrap();
        assert_eq!(
            (c.common.inner_mtu, c.mss_clamp, c.common.listen.port()),
            (1420, true, 51820)
        );
        assert_eq!(
            (c.common.dataplane, c.lan_dataplane),
            (
                cyphonic_settings::DataPlane {
                    workers: 0,
                    batch_size: 32,
                    batches_in_flight: 4096,
                    in_flight_bytes: 16 << 20,
                    in_flight_time: Duration::from_millis(100),
                    inline_max: 8,
                    sparse_rate: 1000,
                    aqm: None,
                    socket_timestamps: false,
                    ordering: true,
                    aead: cyphonic_crypto::Backend::Ring,
                    udp_buffer: 4 << 20,
                    udp_gso: true,
                    udp_gro: true,
                    placement: cyphonic_settings::Placement {
                        cpus: Vec::new(),
                        realtime_priority: 0,
                    },
                    busy_poll: Duration::ZERO,
                    sparse_socket: true,
                    sparse_per_cpu: true,
                    sparse_priority: 20,
                    queue_per_peer: 64,
                    buffers: 8192,
                    rekey_after: Duration::from_secs(120),
                    rekey_after_messages: 1 << 60,
                },
                LanDataplane {
                    buffer: 4 << 20,
                    gro: true,
                    gso: true,
                    defer_checksums: true,
                    queues: 1,
                    ring: false,
                }
            )
        );
        assert!(c.reservations.is_empty() && c.common.peers.is_empty());
        assert_eq!(
            c.common.status_socket,
            PathBuf::from("/run/cyphonic/adapter.sock")
        );
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/cyphonic"));
        let dhcp = c.dhcp.unwrap();
        assert_eq!(
            (
                dhcp.pool,
                dhcp.lease_secs,
                dhcp.new_lease_share,
                dhcp.new_lease_window_secs
            ),
            (
                (Ipv4Addr::new(100, 64, 1, 1), Ipv4Addr::new(100, 64, 1, 254)),
                3600,
                0.25,
                60
            )
        );
        assert_eq!(
            c.common.dns,
            Some(cyphonic_settings::Dns {
                upstream: vec![],
                ttl: 60
            })
        );
        let off = format!("{minimal}\n[dhcp]\nenabled = false\n[dns]\nenabled = false\n");
        let (c, _) = load_text(&f, &off).unwrap();
        assert!(c.dhcp.is_none() && c.common.dns.is_none());
        assert_eq!(c.common.dns_ttl(), 60, "answers from the cloud keep a TTL");
        let (c, _) = load_text(&f, &format!("{minimal}\n[dns]\nttl = 300\n")).unwrap();
        assert_eq!(c.common.dns_ttl(), 300);
    }

    /// Each mistake is reported with the file, its line and its key.
    #[test]
    fn mistakes_name_the_line_and_key() {
        let f = fixture();
        // Far down the file: the line is counted, not taken from a table near the top.
        let batch_line = EXAMPLE
            .lines()
            .position(|l| l.starts_with("batch_size = 32"))
            .expect("the example sets batch_size")
            + 1;
        let batch_error =
            format!(":{batch_line}: key `dataplane.batch_size`: 0 is outside 1..=1024");
        let cases: &[(&str, &str, &str)] = &[
            (
                "lan_queues = 1",
                "lan_queues = 17",
                "key `dataplane.lan_queues`: 17 is outside 1..=16",
            ),
            (
                "gateway_vip = \"100.64.1.1\"",
                "gateway_vip = \"100.64.9.1\"",
                ":19: key `adapter.gateway_vip`: 100.64.9.1 must be a host address inside the block 100.64.1.0/24",
            ),
            (
                "gateway_vip = \"100.64.1.1\"",
                "gateway_vip = \"100.64.1.0\"",
                "key `adapter.gateway_vip`",
            ),
            (
                "mac = \"02:00:00:00:01:0b\"",
                "mac = \"02:00:00:00:01:0a\"",
                "key `reservation[1].mac`: 02:00:00:00:01:0a is reserved twice",
            ),
            (
                "mac = \"02:00:00:00:01:0b\"",
                "mac = \"03:00:00:00:01:0b\"",
                "key `reservation[1].mac`: 03:00:00:00:01:0b is a multicast MAC",
            ),
            (
                "mac = \"02:00:00:00:01:0b\"",
                "mac = \"02:00:00:00:01\"",
                "key `reservation[1].mac`: invalid MAC address",
            ),
            (
                "vip = \"100.64.1.11\"",
                "vip = \"100.64.1.10\"",
                "key `reservation[1].vip`: 100.64.1.10 is reserved twice",
            ),
            (
                "vip = \"100.64.1.11\"",
                "vip = \"100.64.2.11\"",
                "key `reservation[1].vip`: 100.64.2.11 is not a free host address of the block 100.64.1.0/24",
            ),
            (
                "vip = \"100.64.1.11\"",
                "vip = \"100.64.1.1\"",
                "key `reservation[1].vip`",
            ),
            (
                "hostname = \"sensor1\"",
                "hostname = \"Sensor_1\"",
                "key `reservation[0].hostname`: \"Sensor_1\" is not a DNS label",
            ),
            ("batch_size = 32", "batch_size = 0", &batch_error),
            (
                "groups = [\"sensors\"]",
                "groups = [\"100.64.1.0\"]",
                "key `reservation[0].groups[0]`: \"100.64.1.0\" is not a group's name",
            ),
            (
                "to = [\"nvr\"]",
                "to = [\"nvrs\"]",
                "key `policy.rule[0].to[0]`: `nvrs` is not a group, a device, a member or an address",
            ),
            (
                "allow = [\"tcp/554\"]",
                "allow = [\"tcp/554\", \"icmp/8\"]",
                "key `policy.rule[0].allow[1]`: `icmp/8`: only tcp and udp have ports",
            ),
            (
                "allow = [\"tcp/554\"]",
                "allow = []",
                "key `policy.rule[0].allow`: allows nothing",
            ),
            (
                "members = [\"100.64.2.20\"]",
                "members = [\"sensors\", \"camera9\"]",
                "key `policy.group[0].members[1]`: `camera9` is not a group above",
            ),
            (
                "members = [\"sensor*\"]",
                "members = [\"printer*\"]",
                "key `policy.group[1].members[0]`: `printer*` matches no device or member",
            ),
            (
                "flows = 16384",
                "flows = 0",
                "key `policy.flows`: must be 1 to 1048576",
            ),
            (
                "inner_mtu = 1420",
                "inner_mtu = 9000",
                "key `adapter.inner_mtu`: 9000 is outside 576..=1480",
            ),
            (
                "inner_mtu = 1420",
                "inner_mtu = \"big\"",
                "key `adapter.inner_mtu`",
            ),
            (
                "key = \"gw1.ovl.example.key\"",
                "key = \"missing.key\"",
                "key `identity.key`: cannot read",
            ),
            (
                "key = \"gw1.ovl.example.key\"",
                "key = \"ca.crt\"",
                "key `identity.key`: not a Noise private key",
            ),
            (
                "ca = \"ca.crt\"",
                "ca = \"gw1.ovl.example.crt\"",
                "key `identity.ca`: not a valid self-signed CA certificate",
            ),
            (
                "certificate = \"gw1.ovl.example.crt\"",
                "certificate = \"peers/gw2.ovl.example.crt\"",
                "key `identity.certificate`: our certificate certifies another Noise key",
            ),
            (
                "certificate = \"peers/gw2.ovl.example.crt\"",
                "certificate = \"gw1.ovl.example.crt\"",
                "key `peer[0].certificate`: this is our own certificate",
            ),
            (
                "overlay = \"100.64.0.0/10\"",
                "overlay = \"100.96.0.0/11\"",
                "key `adapter.overlay`: 100.96.0.0/11 does not contain",
            ),
            (
                "pool = \"100.64.1.100-100.64.1.199\"",
                "pool = \"100.64.1.100-100.64.2.199\"",
                "key `dhcp.pool`: the DHCP pool 100.64.1.100-100.64.2.199 is not inside this adapter's certified block 100.64.1.0/24 (certified to gw1.ovl.example); the adapter refuses to start",
            ),
            (
                "pool = \"100.64.1.100-100.64.1.199\"",
                "pool = \"100.64.1.0/24\"",
                "key `dhcp.pool`: \"100.64.1.0/24\" is not a range of addresses",
            ),
            (
                "pool = \"100.64.1.100-100.64.1.199\"",
                "pool = \"100.64.1.199-100.64.1.100\"",
                "key `dhcp.pool`: the DHCP pool 100.64.1.199-100.64.1.100 is empty",
            ),
            (
                "lease_time = 3600",
                "lease_time = 5",
                "key `dhcp.lease_time`: lease time 5 s is outside",
            ),
            (
                "new_lease_share = 0.25",
                "new_lease_share = 1.5",
                "key `dhcp.new_lease_share`: new_lease_share 1.5 is outside (0, 1]",
            ),
            (
                "new_lease_window = 60",
                "new_lease_window = 0",
                "key `dhcp.new_lease_window`: must be at least 1 second",
            ),
            (
                "upstream = [\"192.0.2.53\"]",
                "upstream = [\"192.0.2.53\", \"100.64.2.1\"]",
                "key `dns.upstream[1]`: 100.64.2.1 cannot be an upstream resolver",
            ),
            (
                "upstream = [\"192.0.2.53\"]",
                "upstream = [\"0.0.0.0\"]",
                "key `dns.upstream[0]`: 0.0.0.0 cannot be an upstream resolver",
            ),
            (
                "upstream = [\"192.0.2.53\"]",
                "upstream = [\"192.0.2.53\", \"ff02::fb\"]",
                "key `dns.upstream[1]`: ff02::fb cannot be an upstream resolver",
            ),
            (
                "upstream = [\"192.0.2.53\"]",
                "upstream = [\"dns.example\"]",
                "key `dns.upstream`",
            ),
            (
                "ttl = 60",
                "ttl = 100000",
                "key `dns.ttl`: 100000 s is over a day",
            ),
            (
                "dns = \"100.64.2.1\"",
                "dns = \"100.64.3.1\"",
                "key `peer[0].dns`: 100.64.3.1 is not inside gw2.ovl.example's certified blocks",
            ),
            (
                "endpoints = [\"198.51.100.2:51820\"]",
                "endpoints = [\"0.0.0.0:51820\"]",
                "key `cloud.endpoints`: 0.0.0.0:51820 cannot be reached by peers",
            ),
            (
                "onto = \"100.64.1.224/28\"",
                "onto = \"100.64.1.224/27\"",
                "key `legacy.onto`: 100.64.1.224/27: the legacy subnet and the block it maps onto differ in size (192.0.2.0/28)",
            ),
            (
                "onto = \"100.64.1.224/28\"",
                "onto = \"100.64.2.224/28\"",
                "key `legacy.onto`: 100.64.2.224/28 is not inside this adapter's certified block 100.64.1.0/24",
            ),
            (
                "onto = \"100.64.1.224/28\"",
                "onto = \"100.64.1.0/28\"",
                "key `legacy.onto`: 100.64.1.0/28 holds the gateway's own address 100.64.1.1",
            ),
            (
                "onto = \"100.64.1.224/28\"",
                "onto = \"100.64.1.192/28\"",
                "key `legacy.onto`: 100.64.1.192/28 overlaps the DHCP pool 100.64.1.100-100.64.1.199: set `dhcp.pool` to a range outside it",
            ),
            (
                "gateway = \"192.0.2.1\"",
                "gateway = \"192.0.2.15\"",
                "key `legacy.gateway`: 192.0.2.15 is not a host address of the subnet 192.0.2.0/28",
            ),
            (
                "address = \"192.0.2.5\"",
                "address = \"192.0.2.1\"",
                "key `legacy.device[0].address`: 192.0.2.1 is not a free host address of the subnet 192.0.2.0/28",
            ),
            (
                "address = \"192.0.2.5\"",
                "address = \"192.0.2.16\"",
                "key `legacy.device[0].address`: 192.0.2.16 is not a free host address",
            ),
            (
                "mac = \"02:00:5e:10:00:14\"",
                "mac = \"02:00:00:00:01:0b\"",
                "key `legacy.device[0].mac`: 02:00:00:00:01:0b is declared twice (a reservation or a device)",
            ),
            (
                "name = \"plc1\"",
                "name = \"sensor1\"",
                "key `legacy.device[0].name`: \"sensor1\" names another device already",
            ),
            (
                "name = \"plc1\"",
                "name = \"PLC 1\"",
                "key `legacy.device[0].name`: \"PLC 1\" is not a DNS label",
            ),
            (
                "groups = [\"ot\"]",
                "groups = [\"192.0.2.0/28\"]",
                "key `legacy.device[0].groups[0]`: \"192.0.2.0/28\" is not a group's name",
            ),
            (
                "# router = \"192.0.2.1\"",
                "router = \"192.0.2.1\"",
                "key `legacy.router`: 192.0.2.1 is not a host address of the subnet 192.0.2.0/28 other than the gateway",
            ),
            (
                "# router = \"192.0.2.1\"",
                "router = \"192.0.2.3\"",
                "key `legacy.router`: beside the site's router the adapter serves no DHCP",
            ),
            ("[adapter]", "[adaptor]", "unknown field `adaptor`"),
            (
                "lan_interface = \"eth1\"",
                "",
                "missing field `lan_interface`",
            ),
        ];
        assert_mistakes(&f, EXAMPLE, cases, load, NOW);
        assert_mistakes(&f, EXAMPLE, SHARED_MISTAKES, load, NOW);
    }

    /// A revoked peer does not make the file wrong (revocation lists go to a whole fleet,
    /// apart from each site's peers): it is loaded, marked, and left out of the peers the
    /// table holds. An expired certificate is still a mistake.
    /// The cloud by name and as several instances, with two pinned keys while its key is
    /// being replaced: all kept, in order.
    #[test]
    fn the_cloud_may_be_several_instances_by_name_with_two_keys() {
        let f = fixture();
        let key = "5b0f5a3e27c1a8f3d2e4b6c8a0f1e2d3c4b5a69788796a5b4c3d2e1f0a1b2c3d";
        let text = EXAMPLE
            .replace(
                "address = \"192.0.2.10:7000\"",
                "address = [\"cloud.ovl-ops.example:7000\", \"192.0.2.11:7000\", \"[fd00::10]:7000\"]",
            )
            .replace(
                &format!("public_key = \"{key}\""),
                &format!("public_key = [\"{key}\", \"{}\"]", "ab".repeat(32)),
            );
        f.write("adapter.toml", &text);
        let (c, _) = load(&f.path().join("adapter.toml"), NOW).unwrap();
        let cloud = c.common.cloud.unwrap();
        assert_eq!(
            cloud.addresses,
            [
                "cloud.ovl-ops.example:7000",
                "192.0.2.11:7000",
                "[fd00::10]:7000"
            ]
        );
        assert_eq!(cloud.public_keys.len(), 2);
        assert_eq!(cloud.public_keys[1].0, [0xab; 32]);
    }

    #[test]
    fn revoked_peers_are_left_out_and_expired_certificates_refused() {
        let f = fixture();
        let peer = Certificate::from_pem(
            &std::fs::read_to_string(f.path().join("peers/gw2.ovl.example.crt")).unwrap(),
        )
        .unwrap();
        std::fs::write(
            f.path().join("revoked.txt"),
            format!("{}\n", peer.fingerprint()),
        )
        .unwrap();
        let (c, _) = load(&f.path().join("adapter.toml"), NOW).unwrap();
        assert_eq!(c.common.peers.len(), 1);
        assert!(c.common.peers[0].revoked);
        assert_eq!(c.common.active_peers().count(), 0);
        let err = load(&f.path().join("adapter.toml"), NOW + 2_000_000)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key `identity.certificate`") && err.contains("expired"),
            "{err}"
        );
    }

    /// docs/configuration/adapter.md is the reference the declarations make.
    #[test]
    fn the_configuration_reference_is_current() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        cyphonic_settings::testing::assert_reference_current::<Raw>(&root, "adapter");
    }

    /// config/adapter.example.toml sets every key the code accepts, so every key is documented
    /// there (a new key without documentation fails here).
    /// `[[vlan]]`: each segment on its own part of the block, with its gateway, its DHCP
    /// server (the reservations inside its block, which the untagged one no longer hands
    /// out) and its groups in the policy's names; every clash named at its key.
    #[test]
    fn vlan_segments_are_checked_and_each_gets_its_own_dhcp() {
        let f = fixture();
        let base = "[adapter]\nlan_interface = \"eth1\"\n\n[identity]\ncertificate = \"gw1.ovl.example.crt\"\nkey = \"gw1.ovl.example.key\"\nca = \"ca.crt\"\n\n[dhcp]\npool = \"100.64.1.100-100.64.1.150\"\n\n[[reservation]]\nmac = \"02:00:00:00:01:0a\"\nvip = \"100.64.1.20\"\n\n[[reservation]]\nmac = \"02:00:00:00:01:0b\"\nvip = \"100.64.1.200\"\nhostname = \"cam9\"\n\n[[vlan]]\ntag = 20\nblock = \"100.64.1.192/27\"\ngroups = [\"cameras\"]\n\n[[vlan]]\ntag = 30\nblock = \"100.64.1.160/28\"\ngateway = \"100.64.1.174\"\npool = \"100.64.1.165-100.64.1.170\"\n\n[policy]\n\n[[policy.rule]]\nfrom = [\"cameras\"]\nto = [\"100.64.2.0/24\"]\nallow = [\"tcp/554\"]\n";
        let (c, _) = load_text(&f, base).unwrap();
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let untagged = c.dhcp.as_ref().unwrap();
        assert_eq!(
            untagged
                .reservations
                .iter()
                .map(|r| r.ip)
                .collect::<Vec<_>>(),
            [ip("100.64.1.20")],
            "the untagged server hands out none of a VLAN's reservations"
        );
        let [cams, ot] = &c.vlans[..] else {
            panic!("{:?}", c.vlans)
        };
        assert_eq!(
            (cams.tag, cams.block, cams.gateway, cams.groups.clone()),
            (
                20,
                "100.64.1.192/27".parse().unwrap(),
                ip("100.64.1.193"),
                vec!["cameras".to_owned()]
            )
        );
        let d = cams.dhcp.as_ref().unwrap();
        assert_eq!(
            (d.server, d.block, d.pool, d.lease_secs),
            (
                ip("100.64.1.193"),
                cams.block,
                (ip("100.64.1.193"), ip("100.64.1.222")),
                untagged.lease_secs
            )
        );
        assert_eq!(
            d.reservations.iter().map(|r| r.ip).collect::<Vec<_>>(),
            [ip("100.64.1.200")]
        );
        let d = ot.dhcp.as_ref().unwrap();
        assert_eq!(
            (ot.gateway, d.pool),
            (ip("100.64.1.174"), (ip("100.64.1.165"), ip("100.64.1.170")))
        );
        assert!(d.reservations.is_empty());
        // The group stands for the camera VLAN's block in the compiled rules.
        let rules = format!("{:?}", c.common.policy);
        assert!(rules.contains("100.64.1.192/27"), "{rules}");
        // One of an HA pair: the VLANs go with it (one lease file, every segment's).
        let (c, _) = load_text(
            &f,
            &base.replace(
                "[[vlan]]\ntag = 20",
                "[ha]\npriority = 100\n\n[[vlan]]\ntag = 20",
            ),
        )
        .unwrap();
        assert_eq!(
            (c.ha.map(|h| h.priority), c.dhcp_scopes().len()),
            (Some(100), 3)
        );
        // Without DHCP, no segment has a server.
        let (c, _) = load_text(&f, &base.replace("[dhcp]\n", "[dhcp]\nenabled = false\n")).unwrap();
        assert!(c.vlans.iter().all(|v| v.dhcp.is_none()));
        let mistakes: &[(&str, &str, &str)] = &[
            (
                "tag = 30",
                "tag = 4095",
                "key `vlan[1].tag`: 4095 is outside 1..=4094",
            ),
            (
                "tag = 30",
                "tag = 0",
                "key `vlan[1].tag`: 0 is outside 1..=4094",
            ),
            (
                "tag = 30",
                "tag = 20",
                "key `vlan[1].tag`: VLAN 20 is declared twice",
            ),
            (
                "block = \"100.64.1.160/28\"",
                "block = \"100.64.1.160/26\"",
                "key `vlan[1].block`: 100.64.1.160/26 is not a block's network address (did you mean 100.64.1.128/26?)",
            ),
            (
                "block = \"100.64.1.160/28\"",
                "block = \"100.64.2.160/28\"",
                "key `vlan[1].block`: 100.64.2.160/28 is not a block of at least four addresses inside this adapter's certified block 100.64.1.0/24",
            ),
            (
                "block = \"100.64.1.160/28\"",
                "block = \"100.64.1.0/28\"",
                "key `vlan[1].block`: 100.64.1.0/28 holds the gateway's own address 100.64.1.1",
            ),
            (
                "block = \"100.64.1.160/28\"",
                "block = \"100.64.1.144/28\"",
                "key `vlan[1].block`: 100.64.1.144/28 overlaps the DHCP pool 100.64.1.100-100.64.1.150 of the untagged segment",
            ),
            (
                "block = \"100.64.1.160/28\"",
                "block = \"100.64.1.208/28\"",
                "key `vlan[1].block`: 100.64.1.208/28 overlaps VLAN 20's block 100.64.1.192/27",
            ),
            (
                "gateway = \"100.64.1.174\"",
                "gateway = \"100.64.1.175\"",
                "key `vlan[1].gateway`: 100.64.1.175 is not a host address of the segment's block 100.64.1.160/28",
            ),
            (
                "gateway = \"100.64.1.174\"",
                "gateway = \"100.64.1.20\"",
                "key `vlan[1].gateway`: 100.64.1.20 is not a host address of the segment's block",
            ),
            (
                "pool = \"100.64.1.165-100.64.1.170\"",
                "pool = \"100.64.1.165-100.64.1.180\"",
                "key `vlan[1].pool`",
            ),
            (
                "pool = \"100.64.1.165-100.64.1.170\"",
                "pool = \"165-170\"",
                "key `vlan[1].pool`: \"165-170\" is not a range of addresses",
            ),
            (
                "groups = [\"cameras\"]",
                "groups = [\"100.64.1.0/24\"]",
                "key `vlan[0].groups[0]`: \"100.64.1.0/24\" is not a group's name",
            ),
        ];
        assert_mistakes(&f, base, mistakes, load, NOW);
        // A reservation at a VLAN's gateway address.
        let err = load_text(
            &f,
            &base.replace("vip = \"100.64.1.200\"", "vip = \"100.64.1.193\""),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("key `vlan[0].gateway`: 100.64.1.193 is reserved to 02:00:00:00:01:0b"),
            "{err}"
        );
    }

    /// `[vlan.legacy]`: a VLAN's own fixed-address devices, checked as `[legacy]` is, named
    /// at the VLAN's keys; the same legacy subnet as the untagged segment's, on purpose.
    #[test]
    fn a_vlan_may_have_a_legacy_map_of_its_own() {
        let f = fixture();
        let base = "[adapter]\nlan_interface = \"eth1\"\n\n[identity]\ncertificate = \"gw1.ovl.example.crt\"\nkey = \"gw1.ovl.example.key\"\nca = \"ca.crt\"\n\n[dhcp]\npool = \"100.64.1.100-100.64.1.127\"\n\n[legacy]\nsubnet = \"192.0.2.16/28\"\nonto = \"100.64.1.224/28\"\ngateway = \"192.0.2.17\"\n\n[[legacy.device]]\nname = \"plc\"\nmac = \"02:00:5e:10:00:14\"\naddress = \"192.0.2.20\"\n\n[[vlan]]\ntag = 30\nblock = \"100.64.1.160/27\"\npool = \"100.64.1.162-100.64.1.175\"\ngroups = [\"ot\"]\n\n[vlan.legacy]\nsubnet = \"192.0.2.16/28\"\nonto = \"100.64.1.176/28\"\ngateway = \"192.0.2.17\"\nlearn = false\n\n[[vlan.legacy.device]]\nname = \"plc2\"\nmac = \"02:00:5e:10:1e:14\"\naddress = \"192.0.2.20\"\n";
        let (c, _) = load_text(&f, base).unwrap();
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let v = &c.vlans[0];
        let legacy = v.legacy.unwrap();
        assert_eq!(
            (legacy.map.overlay(), legacy.gateway, v.learn_legacy),
            ("100.64.1.176/28".parse().unwrap(), ip("192.0.2.17"), false)
        );
        let plc2 = c
            .reservations
            .iter()
            .find(|r| r.hostname.as_deref() == Some("plc2"))
            .unwrap();
        assert_eq!(
            (plc2.vip, plc2.legacy),
            (ip("100.64.1.180"), Some(ip("192.0.2.20")))
        );
        assert!(c.learn_legacy, "the untagged segment's learning is its own");
        // Beside a router on the VLAN: its DHCP off, the untagged segment's still on.
        let beside = base
            .replace("learn = false", "router = \"192.0.2.18\"")
            .replace("groups = [\"ot\"]", "groups = [\"ot\"]\ndhcp = false");
        let (c, _) = load_text(&f, &beside).unwrap();
        assert_eq!(
            c.vlans[0].legacy.and_then(|l| l.router),
            Some(ip("192.0.2.18"))
        );
        assert_eq!(
            c.dhcp_scopes().iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            [None]
        );
        let mistakes: &[(&str, &str, &str)] = &[
            (
                "learn = false",
                "router = \"192.0.2.18\"",
                "key `vlan[0].legacy.router`: beside the site's router the adapter serves no DHCP on its VLAN",
            ),
            (
                "onto = \"100.64.1.176/28\"",
                "onto = \"100.64.1.192/28\"",
                "key `vlan[0].legacy.onto`: 100.64.1.192/28 is not inside its VLAN's block 100.64.1.160/27",
            ),
            (
                "pool = \"100.64.1.162-100.64.1.175\"",
                "pool = \"100.64.1.162-100.64.1.180\"",
                "key `vlan[0].legacy.onto`: 100.64.1.176/28 overlaps the DHCP pool 100.64.1.162-100.64.1.180",
            ),
            (
                "mac = \"02:00:5e:10:1e:14\"",
                "mac = \"02:00:5e:10:00:14\"",
                "key `vlan[0].legacy.device[0].mac`: 02:00:5e:10:00:14 is declared twice",
            ),
            (
                "name = \"plc2\"",
                "name = \"plc\"",
                "key `vlan[0].legacy.device[0].name`: \"plc\" names another device already",
            ),
            (
                "address = \"192.0.2.20\"\n",
                "address = \"192.0.2.17\"\n",
                "key `legacy.device[0].address`",
            ),
        ];
        assert_mistakes(&f, base, mistakes, load, NOW);
    }

    /// config/adapter.toml, the packages' /etc/cyphonic/adapter.toml, takes only keys the file
    /// has, and marks to fill in what has no value that works everywhere.
    #[test]
    fn the_starter_reads_and_marks_what_to_fill_in() {
        cyphonic_settings::testing::assert_starter::<Raw>(
            include_str!("../../config/adapter.toml"),
            "config/adapter.toml",
            &[
                "adapter.lan_interface",
                "identity.token",
                "cloud.address",
                "cloud.public_key",
            ],
        );
    }

    #[test]
    fn the_example_documents_every_key() {
        assert_documents_every_key::<Raw>(
            EXAMPLE,
            "config/adapter.example.toml",
            &[
                "legacy.router",
                "vlan.legacy.router",
                "reservation.vip6",
                "vlan.block6",
            ],
        );
    }
}

//! The messages of the control protocol (docs/protocol.md §3). They travel as JSON inside the
//! Noise channel: readable in a debugger, and versioned by the handshake's [`Hello`].
//!
//! Certificates travel in their text armor and are checked by whoever receives them; nothing
//! here trusts a field it carries.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

use serde::{Deserialize, Serialize};

/// The control protocol version this code speaks.
pub const VERSION: u16 = 15;

/// The first version with [`ClientMsg::HaPair`].
pub const HA_PAIR_VERSION: u16 = 10;

/// The first version with [`ClientMsg::Report`].
pub const REPORT_VERSION: u16 = 11;

/// The first version with flow logs ([`CloudMsg::FlowLog`], [`ClientMsg::Flows`]).
pub const FLOWS_VERSION: u16 = 12;

/// The first version with a relay over a stream ([`RelayInfo::stream`]).
pub const STREAM_VERSION: u16 = 13;

/// The first version with port mappings ([`ClientMsg::Register`]'s `mapping`,
/// [`RelayReason::MappingRefused`]).
pub const MAPPING_VERSION: u16 = 14;

/// The first version with members' tunnel versions ([`ClientMsg::Register`]'s and
/// [`PeerInfo`]'s `tunnel`).
pub const TUNNEL_VERSION: u16 = 15;

/// The oldest version a cloud still serves (as that version: no enrollment, no renewal).
pub const MIN_VERSION: u16 = 2;

/// Why a cloud refuses a `Hello` of a `version` it does not speak, in words that name the
/// versions it speaks (since version 2): a newer client reads them back with
/// [`versions_refused`] and says `Hello` again in one of them (docs/protocol.md §4,
/// *Versions*).
pub fn version_refusal(version: u16) -> String {
    format!(
        "protocol version {version} is not spoken here (this cloud speaks {MIN_VERSION} to {VERSION})"
    )
}

/// The control versions a cloud speaks, read from its refusal of our `Hello`
/// ([`version_refusal`], of this release or an older one); `None` for any other refusal.
pub fn versions_refused(reason: &str) -> Option<std::ops::RangeInclusive<u16>> {
    let (_, speaks) = reason.split_once(" is not spoken here (this cloud speaks ")?;
    let (oldest, newest) = speaks.strip_suffix(')')?.split_once(" to ")?;
    let (oldest, newest) = (oldest.parse().ok()?, newest.parse().ok()?);
    (oldest <= newest).then_some(oldest..=newest)
}

/// The payload of the first handshake message, client to cloud.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The protocol version the client speaks.
    pub version: u16,
    /// The client's wall clock in nanoseconds since the Unix epoch, strictly greater than in
    /// its previous handshake: the cloud refuses a `Hello` it has seen (a replay) by this.
    /// (Absent in version 1: it reads as 0, so that an old client hears which version the
    /// cloud speaks.)
    #[serde(default)]
    pub timestamp: u64,
    /// The client's certificate (text armor). Its Noise key must be the handshake's. Empty
    /// when enrolling.
    pub certificate: String,
    /// An enrollment token (`<id>.<secret>`, version 3): the client has no certificate yet and
    /// asks the cloud's AS for one certifying the handshake's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enroll: Option<String>,
    /// Software and version, for the cloud's logs.
    pub agent: String,
}

/// The payload of the handshake's answer, cloud to client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "result", rename_all = "snake_case")]
pub enum Welcome {
    /// The certificate passed; the session is open.
    Accepted {
        /// The protocol version the cloud will speak (the client's or lower).
        version: u16,
        /// Send this in an endpoint probe from the tunnel socket to each of `probe_ports`, so
        /// that the cloud sees the address the NAT maps that socket to.
        probe_token: [u8; 16],
        /// The key of the probes' MAC: only this session can make probes the cloud accepts.
        probe_key: [u8; 16],
        /// The cloud's UDP ports for endpoint probes (on the address the client connected to).
        /// Two ports show the cloud whether the NAT keeps one mapping for every destination
        /// or makes a new one per destination (a symmetric NAT, which hole punching cannot
        /// pass).
        probe_ports: Vec<u16>,
        /// The client's TCP source address as the cloud sees it.
        observed: SocketAddr,
        /// The cloud's issuing CA certificates (text armor; version 3, when the cloud issues):
        /// clients trust each once it verifies under one of their roots, so that members
        /// the AS enrolled verify, and they know that the cloud renews.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        issuers: Vec<String>,
    },
    /// The token in `Hello.enroll` was good: the certificate the AS issued for the
    /// handshake's key. The cloud closes the connection after this; the client connects
    /// again with the certificate.
    Enrolled {
        /// The new certificate (text armor).
        certificate: String,
        /// The issuing CA's certificate that signed it.
        chain: Vec<String>,
        /// The roots the chain leads to.
        roots: Vec<String>,
    },
    /// The certificate did not pass (unknown CA, expired, revoked, key mismatch) or the
    /// version is not spoken. The cloud closes the connection after this.
    Refused {
        /// Why, in words.
        reason: String,
    },
}

/// One name a client hosts: the adapter's own and each device's, a node's own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameRecord {
    /// The fully qualified name, lower case, without the trailing dot.
    pub name: String,
    /// Its vIP, inside the client's certified blocks: its A record. None for a device with
    /// IPv6 only (version 9, docs/protocol.md §7), which has `vip6`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<Ipv4Addr>,
    /// Its IPv6 address, inside the client's certified blocks (version 8, docs/protocol.md
    /// §7): its AAAA record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip6: Option<Ipv6Addr>,
    /// A fixed-address device's own address on its site's legacy subnet (version 7): for
    /// the fleet view only, never resolved nor routed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy: Option<Ipv4Addr>,
}

/// Client to cloud.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "type", rename_all = "snake_case")]
pub enum ClientMsg {
    /// The client's whole state: replaces what was registered before.
    Register {
        /// Underlay endpoints the client listens on, as it knows them (its own addresses).
        endpoints: Vec<SocketAddr>,
        /// The names it hosts.
        names: Vec<NameRecord>,
        /// What its router said when asked for a mapping of the tunnel port (version 14);
        /// none when no router answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mapping: Option<Mapping>,
        /// The tunnel versions it speaks (version 15).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tunnel: Option<TunnelVersions>,
    },
    /// Where is `name`? Answered by [`CloudMsg::Resolved`] with the same `id`.
    Resolve {
        /// Chosen by the client; echoed.
        id: u64,
        /// The name asked for.
        name: String,
    },
    /// The direct path to this peer fails (handshakes went unanswered): pair us through a
    /// relay. Answered by an [`CloudMsg::Expect`] carrying the relay, pushed to both sides,
    /// or by [`CloudMsg::NotPaired`].
    Relay {
        /// The peer's certificate fingerprint (hex).
        peer: String,
    },
    /// A valid node we do not know (we restarted, say) is handshaking with us: may it? The
    /// cloud checks policy (either direction) and answers with an [`CloudMsg::Expect`]
    /// describing it (with a relay for both sides when the pair needs one), or with
    /// [`CloudMsg::NotPaired`].
    Admit {
        /// The peer's certificate fingerprint (hex).
        peer: String,
    },
    /// Liveness: the cloud answers [`CloudMsg::Pong`].
    Ping {},
    /// (Version 3.) Issue me a certificate like the session's with a new validity:
    /// answered by [`CloudMsg::Renewed`] or [`CloudMsg::NotRenewed`].
    Renew {},
    /// (Version 10.) The HA pair that serves this client's site, as the serving box sees it
    /// (docs/protocol.md §5, *Seen from the cloud*): for the fleet view only. No answer
    /// unless it is malformed ([`CloudMsg::Error`]).
    HaPair {
        /// The pair's term as the sender knows it.
        term: u64,
        /// Why the sender took its role, in words.
        reason: String,
        /// The sender first, then the other box once heard.
        boxes: Vec<PairBox>,
    },
    /// (Version 11.) A part of the client's devices and tunnels, for the fleet view
    /// (docs/protocol.md §8, *Devices and tunnels*; put together by
    /// [`crate::report::Assembler`]). No answer unless it is refused ([`CloudMsg::Error`]).
    Report {
        /// Devices behind the client (an adapter's; a node has none).
        devices: Vec<DeviceReport>,
        /// The client's tunnels.
        tunnels: Vec<TunnelReport>,
        /// More parts of this report follow.
        more: bool,
    },
    /// (Version 12.) Flows that ended and refused summaries (docs/protocol.md §8, *Flow
    /// logs*). No answer unless it is refused ([`CloudMsg::Error`]).
    Flows {
        /// Ended flows, at most 1,000.
        flows: Vec<FlowRecord>,
        /// Summaries of refused new flows, at most 1,024.
        refused: Vec<RefusedRecord>,
        /// Records the client did not send since its last message (beyond its bounds).
        unreported: u64,
    },
}

/// A flow that ended, in [`ClientMsg::Flows`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowRecord {
    /// The IP protocol number (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6).
    pub proto: u8,
    /// The opener's address.
    pub src: std::net::IpAddr,
    /// Its port (ICMP: the echo identifier).
    pub sport: u16,
    /// The answerer's address.
    pub dst: std::net::IpAddr,
    /// Its port (ICMP: 0).
    pub dport: u16,
    /// Which way the opener's packets travelled.
    pub dir: FlowDir,
    /// Its first packet, unix seconds.
    pub start: u64,
    /// Its end, unix seconds.
    pub end: u64,
    /// Bytes of IP packets from the opener.
    pub tx_bytes: u64,
    /// Those packets.
    pub tx_packets: u64,
    /// Bytes of IP packets from the answerer.
    pub rx_bytes: u64,
    /// Those packets.
    pub rx_packets: u64,
    /// The rule that allowed it (0: allowed by default).
    pub rule: u32,
}

/// New flows from one source that no rule allowed, over a minute at most, in
/// [`ClientMsg::Flows`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusedRecord {
    /// Their source.
    pub src: std::net::IpAddr,
    /// Which way they travelled.
    pub dir: FlowDir,
    /// The first, unix seconds.
    pub first: u64,
    /// The last, unix seconds.
    pub last: u64,
    /// Packets refused.
    pub packets: u64,
    /// Distinct destination ports (counted up to 1,024).
    pub ports: u32,
}

/// Which way a flow's opener's packets travelled, seen from the member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowDir {
    /// From its side (the LAN, the host) into the tunnel.
    Out,
    /// From the tunnel to its side.
    In,
}

impl FlowDir {
    /// As the protocol writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Out => "out",
            Self::In => "in",
        }
    }
}

/// One device behind an adapter in [`ClientMsg::Report`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceReport {
    /// Its MAC.
    pub mac: Mac,
    /// Its IPv4 vIP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<Ipv4Addr>,
    /// Its IPv6 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip6: Option<Ipv6Addr>,
    /// A fixed-address device's own address on the site's legacy subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy: Option<Ipv4Addr>,
    /// Its name in the adapter's zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The host name it gave or was reserved with (whatever the device said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// How it holds its address.
    pub kind: DeviceKind,
    /// A lease's end, unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<u64>,
    /// Its VLAN on a trunked port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// The last packet from it the adapter carried, unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<u64>,
    /// Bytes of IP packets carried from it towards the tunnel.
    pub tx_bytes: u64,
    /// Those packets.
    pub tx_packets: u64,
    /// Bytes of IP packets delivered to it from the tunnel.
    pub rx_bytes: u64,
    /// Those packets.
    pub rx_packets: u64,
}

/// How a device holds its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// A DHCP lease.
    Lease,
    /// A reservation of the adapter's file.
    Reserved,
    /// A fixed-address device heard on a legacy subnet (docs/protocol.md §6).
    Learned,
    /// A device with IPv6 only (docs/protocol.md §7).
    V6,
}

impl DeviceKind {
    /// As the protocol writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Lease => "lease",
            Self::Reserved => "reserved",
            Self::Learned => "learned",
            Self::V6 => "v6",
        }
    }
}

/// One tunnel of a client in [`ClientMsg::Report`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TunnelReport {
    /// The peer's certificate fingerprint (hex).
    pub peer: String,
    /// The peer's certificate name.
    pub name: String,
    /// Direct, or through the relay.
    pub path: TunnelPath,
    /// Why relayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<RelayReason>,
    /// Where its packets go now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<SocketAddr>,
    /// Whether it holds keys.
    pub established: bool,
    /// Its last completed handshake, unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handshake: Option<u64>,
    /// Inner bytes sealed to it since it was added.
    pub tx_bytes: u64,
    /// Inner bytes opened from it since it was added.
    pub rx_bytes: u64,
}

/// A tunnel's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TunnelPath {
    /// Straight to the peer's endpoint.
    Direct,
    /// Through the cloud's relay.
    Relay,
}

impl TunnelPath {
    /// As the protocol writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Relay => "relay",
        }
    }
}

/// What [`ClientMsg::HaPair`] says: an HA pair as its serving box sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairState {
    /// The pair's term as the sender knows it.
    pub term: u64,
    /// Why the sender took its role, in words.
    pub reason: String,
    /// The sender first, then the other box once heard.
    pub boxes: Vec<PairBox>,
}

impl From<PairState> for ClientMsg {
    fn from(
        PairState {
            term,
            reason,
            boxes,
        }: PairState,
    ) -> Self {
        Self::HaPair {
            term,
            reason,
            boxes,
        }
    }
}

/// One box of an HA pair in [`ClientMsg::HaPair`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairBox {
    /// Its LAN NIC's MAC.
    pub mac: Mac,
    /// Its role, as the sender last heard it.
    pub role: PairRole,
    /// Its `[ha] priority` (1-254).
    pub priority: u8,
    /// What of its health is well.
    pub health: Vec<PairHealth>,
    /// Whether the sender had a proof of life from it lately (the sender itself: true).
    pub in_contact: bool,
}

/// A MAC address, written `02:00:00:00:01:0a` (or with dashes; read in either case, written
/// in lower case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

impl std::str::FromStr for Mac {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad =
            || format!("invalid MAC address {s:?}: expected six hex pairs like 02:00:00:00:01:0a");
        let mut mac = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for byte in &mut mac {
            let part = parts.next().ok_or_else(bad)?;
            if part.len() != 2 {
                return Err(bad());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self(mac))
    }
}

impl std::fmt::Display for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A box's role in its pair (docs/protocol.md §5, *Deciding who serves*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairRole {
    /// Listening before it decides.
    Starting,
    /// Holding the state, serving nothing.
    Standby,
    /// Serving the site.
    Active,
}

/// A part of a box's health (docs/protocol.md §5, the heartbeat's health bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairHealth {
    /// The LAN link is up.
    Lan,
    /// The uplink routes to the peers and the cloud.
    Uplink,
    /// Every data-plane thread goes round its loop.
    DataPlane,
    /// Something beyond the uplink answered lately.
    Reached,
}

/// A peer as the cloud describes it to a client that is about to handshake with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerInfo {
    /// The peer's certificate (text armor); the client checks it against its own trust store.
    pub certificate: String,
    /// Where to send handshakes: the endpoint the cloud saw probes come from first, then the
    /// peer's own list.
    pub endpoints: Vec<SocketAddr>,
    /// Present when the two sides cannot reach each other directly: talk through this relay
    /// channel instead of `endpoints`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<RelayInfo>,
    /// (Version 5.) Which way the cloud's rules let flows start between the receiver and
    /// this peer; absent when the cloud enforces nothing per device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Allowed>,
    /// (Version 15.) The tunnel versions the peer registered; absent when it registered none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<TunnelVersions>,
}

/// A member's tunnel versions on the control channel: `[oldest, newest]` (docs/protocol.md
/// §2, *Versions*). Anything else (`oldest` above `newest`, a 0) does not parse, and the
/// message carrying it is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "[u8; 2]", into = "[u8; 2]")]
pub struct TunnelVersions(pub cyphonic_wire::Versions);

impl TunnelVersions {
    /// What this release speaks.
    pub const OURS: Self = Self(cyphonic_wire::Versions::OURS);
}

impl TryFrom<[u8; 2]> for TunnelVersions {
    type Error = String;

    fn try_from([oldest, newest]: [u8; 2]) -> Result<Self, Self::Error> {
        cyphonic_wire::Versions::new(oldest, newest)
            .map(Self)
            .ok_or_else(|| format!("tunnel versions {oldest} to {newest}"))
    }
}

impl From<TunnelVersions> for [u8; 2] {
    fn from(v: TunnelVersions) -> Self {
        [v.0.oldest(), v.0.newest()]
    }
}

/// Which way flows may start between a client and a peer, seen from the client
/// (docs/protocol.md §4 *Policy*, Directions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Allowed {
    /// Each side may open flows to the other.
    Both,
    /// We may open flows to the peer; it may only answer.
    Out,
    /// The peer may open flows to us; we may only answer.
    In,
}

impl Allowed {
    /// From whether we may open flows to the peer and it to us; `None` when neither may.
    pub const fn from_sides(out: bool, inward: bool) -> Option<Self> {
        match (out, inward) {
            (true, true) => Some(Self::Both),
            (true, false) => Some(Self::Out),
            (false, true) => Some(Self::In),
            (false, false) => None,
        }
    }

    /// The same directions seen from the peer.
    #[must_use]
    pub const fn mirror(self) -> Self {
        match self {
            Self::Both => Self::Both,
            Self::Out => Self::In,
            Self::In => Self::Out,
        }
    }

    /// Its name on the wire and in status (`both`, `out`, `in`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Both => "both",
            Self::Out => "out",
            Self::In => "in",
        }
    }

    /// In words, for logs and status.
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Both => "both ways",
            Self::Out => "we open, it answers",
            Self::In => "it opens, we answer",
        }
    }
}

impl std::fmt::Display for Allowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// A relay channel (TRS) the cloud allocated for one pair of clients. Frames sent to
/// `address` from the address this side bound go, unchanged, to the other side's bound
/// address, and back; nothing else passes (docs/protocol.md §4, relay).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayInfo {
    /// The channel's address, in this side's IP version.
    pub address: SocketAddr,
    /// Bind this side to the channel: send it in an endpoint probe from the tunnel socket to
    /// `address` (and again now and then: a NAT may move our address).
    pub token: [u8; 16],
    /// Why the cloud chose the relay.
    pub reason: RelayReason,
    /// The relay's stream listener, when it has one (control version 13): this side binds
    /// to the channel over it while its UDP to the cloud fails (docs/protocol.md §4, *Relay
    /// over a stream*).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamInfo>,
}

/// The relay's stream listener, as a client reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamInfo {
    /// Its address, in the side's IP version.
    pub address: SocketAddr,
    /// The SHA-256 of its TLS certificate (DER), 64 hex digits; absent: plain TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<String>,
}

impl StreamInfo {
    /// The pinned certificate's digest, `None` for plain TCP.
    ///
    /// # Errors
    /// A `tls` that is not 64 hex digits.
    pub fn tls_digest(&self) -> Result<Option<[u8; 32]>, String> {
        let Some(hex) = &self.tls else {
            return Ok(None);
        };
        let mut out = [0u8; 32];
        ::hex::decode_to_slice(hex, &mut out)
            .map_err(|e| format!("the relay's TLS digest {hex:?}: {e}"))?;
        Ok(Some(out))
    }
}

/// Why a pair talks through the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RelayReason {
    /// One side has only IPv4 endpoints, the other only IPv6.
    NoCommonIpVersion,
    /// A side behind a symmetric NAT (a new mapping per destination), and the other side
    /// behind a NAT too: hole punching cannot work.
    SymmetricNat,
    /// A client tried the direct path and no handshake came through.
    NoDirectHandshake,
    /// As [`Self::SymmetricNat`], and a side behind the symmetric NAT asked its router for a
    /// port mapping and was refused (version 14).
    MappingRefused,
}

impl RelayReason {
    /// As the protocol writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NoCommonIpVersion => "no_common_ip_version",
            Self::SymmetricNat => "symmetric_nat",
            Self::NoDirectHandshake => "no_direct_handshake",
            Self::MappingRefused => "mapping_refused",
        }
    }

    /// As a client of control `version` knows it: one before [`MAPPING_VERSION`] hears of a
    /// refused mapping as [`Self::SymmetricNat`].
    #[must_use]
    pub const fn for_version(self, version: u16) -> Self {
        match self {
            Self::MappingRefused if version < MAPPING_VERSION => Self::SymmetricNat,
            other => other,
        }
    }

    /// In words, for logs and status.
    pub const fn describe(self) -> &'static str {
        match self {
            Self::NoCommonIpVersion => "no common IP version",
            Self::SymmetricNat => "symmetric NAT",
            Self::NoDirectHandshake => "no handshake on the direct path",
            Self::MappingRefused => "symmetric NAT, port mapping refused",
        }
    }
}

impl std::fmt::Display for RelayReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// Whether peers could send to `endpoint`: an address that is neither unspecified nor
/// multicast, and a port that is not 0. What a client registers is held to it.
pub fn reachable(endpoint: SocketAddr) -> bool {
    endpoint.port() != 0 && !endpoint.ip().is_unspecified() && !endpoint.ip().is_multicast()
}

/// What a client's router said when asked for a mapping of the tunnel port
/// (docs/protocol.md §4, *Port mapping*).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "result", rename_all = "snake_case")]
pub enum Mapping {
    /// The router forwards `endpoint` to the tunnel port.
    Mapped {
        /// The protocol it answered.
        protocol: MapProtocol,
        /// The external address and port.
        endpoint: SocketAddr,
    },
    /// The router refused a mapping.
    Refused {
        /// The protocol it answered.
        protocol: MapProtocol,
        /// Why, in the router's words as the protocol gives them (at most
        /// [`Mapping::MAX_REASON`] characters, printable).
        reason: String,
    },
}

impl Mapping {
    /// The longest refusal reason the cloud accepts.
    pub const MAX_REASON: usize = 64;

    /// Whether a mapping's endpoint can be reached ([`reachable`]), and a refusal's reason
    /// is short and printable.
    pub fn is_well_formed(&self) -> bool {
        match self {
            Self::Mapped { endpoint, .. } => reachable(*endpoint),
            Self::Refused { reason, .. } => {
                reason.chars().count() <= Self::MAX_REASON && !reason.chars().any(char::is_control)
            }
        }
    }

    /// The mapped endpoint, if one is held.
    pub const fn endpoint(&self) -> Option<SocketAddr> {
        match self {
            Self::Mapped { endpoint, .. } => Some(*endpoint),
            Self::Refused { .. } => None,
        }
    }
}

/// A port mapping protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MapProtocol {
    /// The Port Control Protocol (RFC 6887).
    Pcp,
    /// NAT Port Mapping Protocol (RFC 6886).
    NatPmp,
    /// UPnP Internet Gateway Device.
    Upnp,
}

impl std::fmt::Display for MapProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pcp => "PCP",
            Self::NatPmp => "NAT-PMP",
            Self::Upnp => "UPnP-IGD",
        })
    }
}

/// How a resolution ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "result", rename_all = "snake_case")]
pub enum Resolution {
    /// The name exists, and policy lets the asker reach it. The peer has been told to expect
    /// the asker ([`CloudMsg::Expect`]).
    Found {
        /// The name's vIP; None for a name with an IPv6 address only (version 9).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vip: Option<Ipv4Addr>,
        /// Its IPv6 address, when it has one (version 8).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vip6: Option<Ipv6Addr>,
        /// The peer hosting it.
        peer: PeerInfo,
    },
    /// No registered client hosts this name.
    NotFound,
    /// The name exists but policy does not let the asker reach it (answered like `NotFound`
    /// to the device: NXDOMAIN).
    Denied,
    /// The name belongs to the asker itself.
    Own,
}

/// Cloud to client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "type", rename_all = "snake_case")]
pub enum CloudMsg {
    /// The answer to [`ClientMsg::Register`].
    Registered {
        /// How many names were accepted.
        accepted: usize,
        /// Names refused, each with the reason (outside the certificate, taken by another).
        refused: Vec<(String, String)>,
    },
    /// The answer to [`ClientMsg::Resolve`].
    Resolved {
        /// The request's id.
        id: u64,
        /// The name asked for.
        name: String,
        /// What the cloud found.
        resolution: Resolution,
    },
    /// Someone resolved one of our names, or a relay was allocated for us and a peer: start
    /// handshaking with them now (both sides send initiations at once, which opens NAT
    /// mappings in both directions).
    Expect {
        /// The peer that will initiate.
        peer: PeerInfo,
    },
    /// The answer to [`ClientMsg::Relay`] or [`ClientMsg::Admit`] when the cloud will not pair
    /// us with that peer (no relay, unknown peer, policy, limits).
    NotPaired {
        /// The peer asked about (fingerprint).
        peer: String,
        /// Why, in words.
        reason: String,
    },
    /// An endpoint probe with this session's token arrived from `endpoint`.
    Observed {
        /// The tunnel socket's address as the cloud sees it.
        endpoint: SocketAddr,
    },
    /// The answer to [`ClientMsg::Ping`].
    Pong {},
    /// (Version 12.) Record flows and send them ([`ClientMsg::Flows`]), or stop
    /// (docs/protocol.md §8, *Flow logs*).
    FlowLog {
        /// Whether to.
        on: bool,
    },
    /// A message the cloud could not accept; the session stays open.
    Error {
        /// Why, in words.
        reason: String,
    },
    /// (Version 3.) The answer to [`ClientMsg::Renew`]: the new certificate (text armor).
    Renewed {
        /// Same name, blocks, groups and key as the session's; a new validity.
        certificate: String,
    },
    /// (Version 3.) The cloud will not renew the session's certificate, and says why.
    NotRenewed {
        /// Why, in words.
        reason: String,
    },
    /// (Version 3.) Certificates revoked online (fingerprints, hex): believe none of them
    /// from now on; end sessions with peers holding them.
    Revoked {
        /// The fingerprints (at most 500 per message).
        fingerprints: Vec<String>,
    },
    /// (Version 4.) A part of the per-device rules this client enforces
    /// ([`crate::policy`]).
    Policy {
        /// The set's version (every part of a set carries it).
        version: u64,
        /// `false`: the cloud enforces nothing per device (no rules follow).
        enforce: bool,
        /// This part's rules.
        rules: Vec<PolicyRule>,
        /// More parts of this set follow.
        more: bool,
    },
}

impl CloudMsg {
    /// This message as a client speaking control `version` may read it: what its version
    /// lacks taken out (a version-4 client's `peer` has no `allowed`; a version-7 client's
    /// resolution no `vip6`, its policy rules no IPv6 block; a version-8 client finds no
    /// name with IPv6 only). Messages a version lacks
    /// altogether are the sender's to hold back.
    #[must_use]
    pub fn for_version(mut self, version: u16) -> Self {
        if version < TUNNEL_VERSION
            && let Some(peer) = self.peer_mut()
        {
            peer.tunnel = None;
        }
        if version < 9
            && let Self::Resolved {
                resolution: resolution @ Resolution::Found { vip: None, .. },
                ..
            } = &mut self
        {
            // A name with IPv6 only does not exist for a client that cannot hold one.
            *resolution = Resolution::NotFound;
        }
        if version < 8 {
            match &mut self {
                Self::Resolved {
                    resolution: Resolution::Found { vip6, .. },
                    ..
                } => *vip6 = None,
                Self::Policy { rules, .. } => {
                    for r in rules {
                        r.from.retain(|n| matches!(n, IpNet::V4(_)));
                        r.to.retain(|n| matches!(n, IpNet::V4(_)));
                    }
                }
                _ => {}
            }
        }
        if version < 5
            && let Some(peer) = self.peer_mut()
        {
            peer.allowed = None;
        }
        self
    }

    /// The peer it describes: an `expect`'s, a found resolution's.
    const fn peer_mut(&mut self) -> Option<&mut PeerInfo> {
        match self {
            Self::Expect { peer }
            | Self::Resolved {
                resolution: Resolution::Found { peer, .. },
                ..
            } => Some(peer),
            _ => None,
        }
    }
}

/// A rule's protocol on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyProto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// ICMP echo.
    Icmp,
    /// Everything.
    Any,
}

/// (Version 4.) One rule of a client's per-device policy on the wire: addresses only
/// ([`crate::policy`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// The rule's number in the cloud's file.
    pub id: u32,
    /// Who may open (IPv6 blocks from version 8).
    pub from: Vec<IpNet>,
    /// To whom (IPv6 blocks from version 8).
    pub to: Vec<IpNet>,
    /// What.
    pub proto: PolicyProto,
    /// Destination port ranges, inclusive; empty: every port.
    pub ports: Vec<(u16, u16)>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A version-6 client's names (no `legacy`) read as before, and a name without it is
    /// written as version 6 wrote it; one with it carries it.
    #[test]
    fn a_names_legacy_address_is_optional_both_ways() {
        let v6 = r#"{"name":"cam.gw1.ovl.example","vip":"100.64.1.20"}"#;
        let rec: NameRecord = serde_json::from_str(v6).unwrap();
        assert_eq!(rec.legacy, None);
        assert_eq!(serde_json::to_string(&rec).unwrap(), v6);
        let fixed = NameRecord {
            vip6: None,
            legacy: Some(Ipv4Addr::new(192, 0, 2, 20)),
            ..rec
        };
        let text = serde_json::to_string(&fixed).unwrap();
        assert!(text.contains(r#""legacy":"192.0.2.20""#), "{text}");
        assert_eq!(serde_json::from_str::<NameRecord>(&text).unwrap(), fixed);
    }

    /// A report reads as docs/protocol.md §8 writes it, its kinds, paths and reasons as
    /// their `as_str` names them; a field it does not have, or a kind it does not name,
    /// does not read.
    /// A registration's mapping reads as docs/protocol.md §4 writes it; an old client's
    /// registration (no `mapping`) still reads; a refused mapping is told to an old client as a
    /// symmetric NAT.
    /// A refusal for the version names the versions spoken, as this release and the older
    /// ones word it; no other refusal reads as one.
    #[test]
    fn a_refusal_for_the_version_names_the_versions_spoken() {
        assert_eq!(
            versions_refused(&version_refusal(VERSION + 1)),
            Some(MIN_VERSION..=VERSION)
        );
        let older = "protocol version 15 is not spoken here (this cloud speaks 2 to 14)";
        assert_eq!(versions_refused(older), Some(2..=14));
        for other in [
            "certificate: expired",
            "protocol version 15 is not spoken here (this cloud speaks 9 to 4)",
            "protocol version 15 is not spoken here (this cloud speaks 2 to 14",
            "protocol version 15 is not spoken here (this cloud speaks two to 14)",
        ] {
            assert_eq!(versions_refused(other), None, "{other}");
        }
    }

    /// `tunnel` in a `register` and a `peer` (version 15): `[oldest, newest]`, a range or
    /// malformed; a client before version 15 hears of no peer's.
    #[test]
    fn tunnel_versions_have_the_documented_shape() {
        let text = r#"{"type":"register","endpoints":[],"names":[],"tunnel":[4,5]}"#;
        let msg: ClientMsg = serde_json::from_str(text).unwrap();
        let range = cyphonic_wire::Versions::new(4, 5).unwrap();
        assert!(matches!(
            &msg,
            ClientMsg::Register { tunnel: Some(TunnelVersions(r)), .. } if *r == range
        ));
        assert_eq!(serde_json::to_string(&msg).unwrap(), text);
        for bad in ["[5,4]", "[0,4]", "[4]", "[4,5,6]", "[4,256]", r#""4-5""#] {
            let text = format!(r#"{{"type":"register","endpoints":[],"names":[],"tunnel":{bad}}}"#);
            assert!(serde_json::from_str::<ClientMsg>(&text).is_err(), "{bad}");
        }
        let peer = PeerInfo {
            certificate: String::new(),
            endpoints: Vec::new(),
            relay: None,
            allowed: None,
            tunnel: Some(TunnelVersions(range)),
        };
        let found = |peer: PeerInfo| CloudMsg::Resolved {
            id: 1,
            name: "gw2.ovl.example".into(),
            resolution: Resolution::Found {
                vip: None,
                vip6: None,
                peer,
            },
        };
        let expect = CloudMsg::Expect { peer: peer.clone() };
        let bare = PeerInfo {
            tunnel: None,
            ..peer.clone()
        };
        assert_eq!(expect.clone().for_version(TUNNEL_VERSION), expect);
        assert_eq!(
            expect.for_version(TUNNEL_VERSION - 1),
            CloudMsg::Expect { peer: bare.clone() }
        );
        assert_eq!(
            found(peer.clone()).for_version(TUNNEL_VERSION),
            found(peer.clone())
        );
        assert_eq!(
            found(peer).for_version(TUNNEL_VERSION - 1),
            found(bare.clone())
        );
        assert!(
            serde_json::to_string(&found(bare))
                .unwrap()
                .contains(r#""peer":{"certificate":"","endpoints":[]}"#)
        );
    }

    #[test]
    fn a_mapping_has_the_documented_shape() {
        let text = r#"{"type":"register","endpoints":["192.0.2.130:51820"],"names":[],"mapping":{"result":"mapped","protocol":"pcp","endpoint":"203.0.113.2:51820"}}"#;
        let msg: ClientMsg = serde_json::from_str(text).unwrap();
        let ClientMsg::Register { mapping, .. } = &msg else {
            panic!("{msg:?}")
        };
        let endpoint = "203.0.113.2:51820".parse().unwrap();
        assert_eq!(
            mapping,
            &Some(Mapping::Mapped {
                protocol: MapProtocol::Pcp,
                endpoint
            })
        );
        assert_eq!(serde_json::to_string(&msg).unwrap(), text);
        let refused = r#"{"result":"refused","protocol":"nat_pmp","reason":"not authorized"}"#;
        let m: Mapping = serde_json::from_str(refused).unwrap();
        assert!(m.is_well_formed() && m.endpoint().is_none());
        for bad in [
            r#"{"result":"mapped","protocol":"upnp"}"#,
            r#"{"result":"lost","protocol":"upnp"}"#,
            r#"{"result":"refused","protocol":"stun","reason":""}"#,
            r#"{"result":"refused","protocol":"pcp","reason":"","extra":1}"#,
        ] {
            assert!(serde_json::from_str::<Mapping>(bad).is_err(), "{bad}");
        }
        let old = r#"{"type":"register","endpoints":[],"names":[]}"#;
        assert!(matches!(
            serde_json::from_str(old).unwrap(),
            ClientMsg::Register { mapping: None, .. }
        ));
        let mapped = |endpoint: &str| Mapping::Mapped {
            protocol: MapProtocol::Pcp,
            endpoint: endpoint.parse().unwrap(),
        };
        for (m, ok) in [
            (
                Mapping::Refused {
                    protocol: MapProtocol::Upnp,
                    reason: "x".repeat(Mapping::MAX_REASON),
                },
                true,
            ),
            (
                Mapping::Refused {
                    protocol: MapProtocol::Upnp,
                    reason: "x".repeat(Mapping::MAX_REASON + 1),
                },
                false,
            ),
            (
                Mapping::Refused {
                    protocol: MapProtocol::Upnp,
                    reason: "no\nway".into(),
                },
                false,
            ),
            (mapped("203.0.113.2:0"), false),
            (mapped("0.0.0.0:51820"), false),
            (mapped("224.0.0.1:51820"), false),
            (mapped("203.0.113.2:51820"), true),
        ] {
            assert_eq!(m.is_well_formed(), ok, "{m:?}");
        }
        assert_eq!(
            RelayReason::MappingRefused.for_version(MAPPING_VERSION - 1),
            RelayReason::SymmetricNat
        );
        assert_eq!(
            RelayReason::MappingRefused.for_version(MAPPING_VERSION),
            RelayReason::MappingRefused
        );
        assert_eq!(
            RelayReason::NoDirectHandshake.for_version(2),
            RelayReason::NoDirectHandshake
        );
        assert_eq!(
            serde_json::to_string(&RelayReason::MappingRefused).unwrap(),
            format!("\"{}\"", RelayReason::MappingRefused.as_str())
        );
    }

    #[test]
    fn a_report_has_the_documented_shape() {
        let text = r#"{"type":"report","devices":[{"mac":"02:00:00:00:01:0a","vip":"100.64.1.10","vip6":"fd7a:0:1::a","legacy":"192.0.2.10","name":"cam.gw1.ovl.example","hostname":"cam","kind":"reserved","expires":1795000000,"vlan":20,"seen":1795000001,"tx_bytes":1,"tx_packets":2,"rx_bytes":3,"rx_packets":4},{"mac":"02:00:00:00:01:0b","vip6":"fd7a:0:1::b","kind":"v6","tx_bytes":0,"tx_packets":0,"rx_bytes":0,"rx_packets":0}],"tunnels":[{"peer":"ab","name":"gw2.ovl.example","path":"relay","reason":"symmetric_nat","endpoint":"203.0.113.9:7003","established":true,"handshake":1795000002,"tx_bytes":5,"rx_bytes":6}],"more":false}"#;
        let msg: ClientMsg = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::to_string(&msg).unwrap(), text);
        let ClientMsg::Report {
            devices, tunnels, ..
        } = &msg
        else {
            panic!("{msg:?}");
        };
        assert_eq!(devices[1].kind, DeviceKind::V6);
        for kind in [
            DeviceKind::Lease,
            DeviceKind::Reserved,
            DeviceKind::Learned,
            DeviceKind::V6,
        ] {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
        for path in [TunnelPath::Direct, TunnelPath::Relay] {
            assert_eq!(serde_json::to_value(path).unwrap(), path.as_str());
        }
        for reason in [
            RelayReason::NoCommonIpVersion,
            RelayReason::SymmetricNat,
            RelayReason::NoDirectHandshake,
        ] {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        }
        assert_eq!(tunnels[0].reason, Some(RelayReason::SymmetricNat));
        for bad in [
            text.replace(r#""kind":"v6""#, r#""kind":"phone""#),
            text.replace(r#""path":"relay""#, r#""path":"carrier pigeon""#),
            text.replace(r#""rx_bytes":6}"#, r#""rx_bytes":6,"rtt":1}"#),
            text.replace(r#""tx_bytes":1,"#, r#""tx_bytes":-1,"#),
        ] {
            assert!(serde_json::from_str::<ClientMsg>(&bad).is_err(), "{bad}");
        }
    }

    /// Flow records and the switch read as docs/protocol.md §8 writes them; a direction the
    /// protocol does not name, or a field it does not have, does not read.
    #[test]
    fn flow_logs_have_the_documented_shape() {
        let text = r#"{"type":"flows","flows":[{"proto":6,"src":"100.64.1.10","sport":40000,"dst":"fd7a:0:1::a","dport":554,"dir":"out","start":1795000000,"end":1795000060,"tx_bytes":5000,"tx_packets":40,"rx_bytes":2500000,"rx_packets":1800,"rule":1}],"refused":[{"src":"100.64.1.66","dir":"in","first":1795000000,"last":1795000030,"packets":10000,"ports":1024}],"unreported":7}"#;
        let msg: ClientMsg = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::to_string(&msg).unwrap(), text);
        let ClientMsg::Flows { flows, refused, .. } = &msg else {
            panic!("{msg:?}");
        };
        assert_eq!((flows[0].dir, refused[0].dir), (FlowDir::Out, FlowDir::In));
        for d in [FlowDir::Out, FlowDir::In] {
            assert_eq!(serde_json::to_value(d).unwrap(), d.as_str());
        }
        for bad in [
            text.replace(r#""dir":"out""#, r#""dir":"sideways""#),
            text.replace(r#""unreported":7"#, r#""unreported":7,"lost":1"#),
            text.replace(r#""proto":6"#, r#""proto":300"#),
        ] {
            assert!(serde_json::from_str::<ClientMsg>(&bad).is_err(), "{bad}");
        }
        let on: CloudMsg = serde_json::from_str(r#"{"type":"flow_log","on":true}"#).unwrap();
        assert_eq!(on, CloudMsg::FlowLog { on: true });
    }

    /// The pair report reads as docs/protocol.md §5 writes it; a health or role the protocol
    /// does not name, or a field it does not have, does not read.
    #[test]
    fn a_pair_report_has_the_documented_shape() {
        let text = r#"{"type":"ha_pair","term":3,"reason":"handed over","boxes":[{"mac":"02:00:00:00:00:02","role":"active","priority":100,"health":["lan","uplink","data_plane","reached"],"in_contact":true},{"mac":"02:00:00:00:00:01","role":"standby","priority":200,"health":["lan"],"in_contact":false}]}"#;
        let msg: ClientMsg = serde_json::from_str(text).unwrap();
        let ClientMsg::HaPair { term, boxes, .. } = &msg else {
            panic!("{msg:?}");
        };
        assert_eq!(*term, 3);
        assert_eq!(boxes[0].role, PairRole::Active);
        assert_eq!(boxes[1].health, vec![PairHealth::Lan]);
        assert_eq!(serde_json::to_string(&msg).unwrap(), text);
        for bad in [
            text.replace(r#""lan"]"#, r#""fine"]"#),
            text.replace(r#""standby""#, r#""serving""#),
            text.replace(r#","in_contact":false"#, r#","in_contact":false,"lag":1"#),
            text.replace("02:00:00:00:00:01", "02:00:00:00:00"),
            text.replace("02:00:00:00:00:01", "02:00:00:00:00:01:03"),
            text.replace("02:00:00:00:00:01", "02:00:00:00:00:0g"),
        ] {
            assert!(serde_json::from_str::<ClientMsg>(&bad).is_err(), "{bad}");
        }
    }
}

//! The adapter's configuration file: TOML, every key documented in
//! config/adapter.example.toml, safe defaults in code, and errors that name the file, the line
//! and the key. Certificates and keys are part of the configuration: loading reads and checks
//! them too, so `check-config` catches every mistake `run` would.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use cyphonic_crypto::{Backend, Certificate, RevocationList, StaticKeypair, TrustStore};
use cyphonic_session::Identity;
use ipnet::{IpNet, Ipv4Net};
use serde::Deserialize;
use toml::Spanned;

/// A configuration mistake, located.
#[derive(Debug)]
pub struct ConfigError {
    file: PathBuf,
    line: Option<usize>,
    key: Option<String>,
    message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": key `{key}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A MAC address written `02:00:00:00:01:0a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mac(pub [u8; 6]);

impl FromStr for Mac {
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
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// An AEAD backend name (`ring` or `rustcrypto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AeadName(Backend);

impl<'de> Deserialize<'de> for AeadName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map(Self).map_err(serde::de::Error::custom)
    }
}

// ---- the file as written ------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    adapter: RawAdapter,
    identity: RawIdentity,
    #[serde(default)]
    dhcp: RawDhcp,
    #[serde(default)]
    dns: RawDns,
    #[serde(default)]
    dataplane: RawDataplane,
    #[serde(default)]
    reservation: Vec<RawReservation>,
    #[serde(default)]
    peer: Vec<RawPeer>,
    cloud: Option<RawCloud>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCloud {
    address: SocketAddr,
    public_key: Spanned<String>,
    #[serde(default)]
    endpoints: Vec<Spanned<SocketAddr>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdapter {
    lan_interface: String,
    #[serde(default = "default_listen")]
    listen: SocketAddr,
    gateway_vip: Spanned<Ipv4Addr>,
    #[serde(default = "default_overlay")]
    overlay: Spanned<Ipv4Net>,
    #[serde(default = "default_inner_mtu")]
    inner_mtu: Spanned<u16>,
    #[serde(default = "yes")]
    mss_clamp: bool,
    #[serde(default = "default_status_socket")]
    status_socket: PathBuf,
    #[serde(default = "default_state_dir")]
    state_dir: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDhcp {
    #[serde(default = "yes")]
    enabled: bool,
    pool: Option<Spanned<String>>,
    #[serde(default = "default_lease_time")]
    lease_time: Spanned<u32>,
    #[serde(default = "default_new_lease_share")]
    new_lease_share: Spanned<f64>,
    #[serde(default = "default_new_lease_window")]
    new_lease_window: Spanned<u64>,
}

impl Default for RawDhcp {
    fn default() -> Self {
        Self {
            enabled: true,
            pool: None,
            lease_time: default_lease_time(),
            new_lease_share: default_new_lease_share(),
            new_lease_window: default_new_lease_window(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDns {
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default)]
    upstream: Vec<Spanned<IpAddr>>,
    #[serde(default = "default_dns_ttl")]
    ttl: Spanned<u32>,
}

impl Default for RawDns {
    fn default() -> Self {
        Self {
            enabled: true,
            upstream: Vec::new(),
            ttl: default_dns_ttl(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIdentity {
    certificate: Spanned<PathBuf>,
    key: Spanned<PathBuf>,
    ca: Spanned<PathBuf>,
    revocations: Option<Spanned<PathBuf>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDataplane {
    #[serde(default)]
    workers: usize,
    #[serde(default = "default_batch_size")]
    batch_size: Spanned<usize>,
    #[serde(default = "default_batches_in_flight")]
    batches_in_flight: Spanned<usize>,
    #[serde(default = "yes")]
    ordering: bool,
    #[serde(default = "default_aead")]
    aead: AeadName,
    #[serde(default = "default_socket_buffer")]
    udp_buffer: usize,
    #[serde(default = "default_socket_buffer")]
    lan_buffer: usize,
    #[serde(default = "default_queue_per_peer")]
    queue_per_peer: usize,
    #[serde(default = "default_buffers")]
    buffers: Spanned<usize>,
    #[serde(default = "yes")]
    disable_offloads: bool,
}

impl Default for RawDataplane {
    fn default() -> Self {
        Self {
            workers: 0,
            batch_size: default_batch_size(),
            batches_in_flight: default_batches_in_flight(),
            ordering: true,
            aead: default_aead(),
            udp_buffer: default_socket_buffer(),
            lan_buffer: default_socket_buffer(),
            queue_per_peer: default_queue_per_peer(),
            buffers: default_buffers(),
            disable_offloads: true,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReservation {
    mac: Spanned<Mac>,
    vip: Spanned<Ipv4Addr>,
    hostname: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    certificate: Spanned<PathBuf>,
    endpoint: Option<SocketAddr>,
    persistent_keepalive: Option<u64>,
    dns: Option<Spanned<Ipv4Addr>>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 51820))
}
fn default_overlay() -> Spanned<Ipv4Net> {
    Spanned::new(
        0..0,
        Ipv4Net::new(Ipv4Addr::new(100, 64, 0, 0), 10).expect("valid prefix"),
    )
}
fn default_inner_mtu() -> Spanned<u16> {
    Spanned::new(0..0, 1420)
}
const fn yes() -> bool {
    true
}
fn default_status_socket() -> PathBuf {
    PathBuf::from("/run/cyphonic/adapter.sock")
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/cyphonic")
}
fn default_lease_time() -> Spanned<u32> {
    Spanned::new(0..0, 3600)
}
fn default_new_lease_share() -> Spanned<f64> {
    Spanned::new(0..0, 0.25)
}
fn default_new_lease_window() -> Spanned<u64> {
    Spanned::new(0..0, 60)
}
fn default_dns_ttl() -> Spanned<u32> {
    Spanned::new(0..0, 60)
}
fn default_batch_size() -> Spanned<usize> {
    Spanned::new(0..0, 32)
}
fn default_batches_in_flight() -> Spanned<usize> {
    Spanned::new(0..0, 128)
}
fn default_aead() -> AeadName {
    AeadName(Backend::default())
}
const fn default_socket_buffer() -> usize {
    4 << 20
}
const fn default_queue_per_peer() -> usize {
    64
}
fn default_buffers() -> Spanned<usize> {
    Spanned::new(0..0, 8192)
}

// ---- the validated configuration -----------------------------------------------------------

/// A device with a fixed address: it gets it from DHCP, or may configure it by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The device's MAC: the only one allowed to send from `vip`.
    pub mac: Mac,
    /// Its overlay address.
    pub vip: Ipv4Addr,
    /// Its name on the overlay, if given.
    pub hostname: Option<String>,
}

/// A peer known from configuration.
#[derive(Debug, Clone)]
pub struct StaticPeer {
    /// Its certificate (verified against our CA when loading).
    pub certificate: Certificate,
    /// Where to reach it first; without one, we wait for it to call.
    pub endpoint: Option<SocketAddr>,
    /// Keepalive interval to hold NAT mappings open.
    pub persistent_keepalive: Option<Duration>,
    /// The peer's DNS server (its gateway vIP): where names in its zone are asked.
    pub dns: Ipv4Addr,
}

/// The DNS service for the LAN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dns {
    /// Resolvers for names outside the overlay; none means such queries are refused.
    pub upstream: Vec<IpAddr>,
    /// TTL of our answers, seconds.
    pub ttl: u32,
}

/// Data-plane tuning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataplane {
    /// Crypto workers; 0 means one per core.
    pub workers: usize,
    /// Packets per batch handed to a worker.
    pub batch_size: usize,
    /// Batches in flight per direction: the memory bound.
    pub batches_in_flight: usize,
    /// Emit in arrival order (false only for experiments).
    pub ordering: bool,
    /// AEAD implementation.
    pub aead: Backend,
    /// UDP socket buffer, bytes.
    pub udp_buffer: usize,
    /// LAN (AF_PACKET) receive buffer, bytes.
    pub lan_buffer: usize,
    /// Packets queued per peer while its handshake is pending.
    pub queue_per_peer: usize,
    /// Packet buffers in all (2 KiB each): the data plane's memory ceiling.
    pub buffers: usize,
    /// Switch GRO/LRO off on the LAN interface at start.
    pub disable_offloads: bool,
}

/// Everything the adapter needs to run, checked.
#[derive(Debug)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    /// The internal NIC.
    pub lan_interface: String,
    /// The tunnel's UDP address.
    pub listen: SocketAddr,
    /// The gateway's own vIP.
    pub gateway_vip: Ipv4Addr,
    /// Our certified LAN block (from our certificate).
    pub lan_block: Ipv4Net,
    /// The whole overlay.
    pub overlay: Ipv4Net,
    /// Inner MTU.
    pub inner_mtu: u16,
    /// MSS clamping.
    pub mss_clamp: bool,
    /// The status socket.
    pub status_socket: PathBuf,
    /// Where the DHCP leases are kept.
    pub state_dir: PathBuf,
    /// The overlay's domain (the name of the CA that issued our certificate).
    pub overlay_domain: String,
    /// The DHCP server, unless switched off.
    pub dhcp: Option<cyphonic_vip::DhcpConfig>,
    /// The DNS service, unless switched off.
    pub dns: Option<Dns>,
    /// Data-plane tuning.
    pub dataplane: Dataplane,
    /// Fixed addresses.
    pub reservations: Vec<Reservation>,
    /// Static peers.
    pub peers: Vec<StaticPeer>,
    /// The control plane, if this adapter uses one.
    pub cloud: Option<Cloud>,
}

/// Where the cloud is (`[cloud]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cloud {
    /// NMS's control address.
    pub address: SocketAddr,
    /// Its Noise public key, pinned.
    pub public_key: cyphonic_crypto::PublicKey,
    /// Tunnel endpoints to register besides the one the cloud observes.
    pub endpoints: Vec<SocketAddr>,
}

/// Reads, parses and checks the configuration at `path` at unix time `now_secs`, with the
/// certificates and keys it names. Returns the configuration and our identity.
///
/// # Errors
/// A [`ConfigError`] naming the file, and where possible the line and key.
pub fn load(path: &Path, now_secs: u64) -> Result<(Config, Identity), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_owned(),
        line: None,
        key: None,
        message: format!("cannot read the configuration: {e}"),
    })?;
    let raw: Raw = toml::from_str(&text).map_err(|e| {
        let at = e.span().map(|s| s.start);
        ConfigError {
            file: path.to_owned(),
            line: at.map(|o| line_of(&text, o)),
            key: at.and_then(|o| key_at(&text, o)),
            message: e.message().trim().to_owned(),
        }
    })?;
    Checker {
        path,
        text: &text,
        now_secs,
    }
    .check(&raw)
}

struct Checker<'a> {
    path: &'a Path,
    text: &'a str,
    now_secs: u64,
}

impl Checker<'_> {
    fn err<T>(
        &self,
        span: &std::ops::Range<usize>,
        key: &str,
        message: impl Into<String>,
    ) -> Result<T, ConfigError> {
        Err(ConfigError {
            file: self.path.to_owned(),
            line: (span.end > 0).then(|| line_of(self.text, span.start)),
            key: Some(key.to_owned()),
            message: message.into(),
        })
    }

    /// A path from the file, relative to the file's directory.
    fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.path.parent().unwrap_or(Path::new(".")).join(p)
        }
    }

    fn read(&self, p: &Spanned<PathBuf>, key: &str) -> Result<String, ConfigError> {
        let path = self.resolve(p.get_ref());
        std::fs::read_to_string(&path).or_else(|e| {
            self.err(
                &p.span(),
                key,
                format!("cannot read {}: {e}", path.display()),
            )
        })
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one check after the other, in file order"
    )]
    fn check(&self, raw: &Raw) -> Result<(Config, Identity), ConfigError> {
        let a = &raw.adapter;
        let id = &raw.identity;

        // Identity: our key, our certificate, the CA, revocations.
        let key_text = self.read(&id.key, "identity.key")?;
        let keypair = StaticKeypair::from_pem(&key_text).or_else(|e| {
            self.err(
                &id.key.span(),
                "identity.key",
                format!("not a Noise private key: {e}"),
            )
        })?;
        let ca_text = self.read(&id.ca, "identity.ca")?;
        let cas = Certificate::all_from_pem(&ca_text).or_else(|e| {
            self.err(
                &id.ca.span(),
                "identity.ca",
                format!("not a CA certificate: {e}"),
            )
        })?;
        if cas.is_empty() {
            return self.err(
                &id.ca.span(),
                "identity.ca",
                "the file holds no CYPHONIC CERTIFICATE block",
            );
        }
        let revoked = match &id.revocations {
            Some(r) => RevocationList::parse(&self.read(r, "identity.revocations")?)
                .or_else(|e| self.err(&r.span(), "identity.revocations", e.to_string()))?,
            None => RevocationList::default(),
        };
        let trust = TrustStore::new(cas, revoked).or_else(|e| {
            self.err(
                &id.ca.span(),
                "identity.ca",
                format!("not a valid self-signed CA certificate: {e}"),
            )
        })?;
        let cert_text = self.read(&id.certificate, "identity.certificate")?;
        let cert = Certificate::from_pem(&cert_text).or_else(|e| {
            self.err(
                &id.certificate.span(),
                "identity.certificate",
                e.to_string(),
            )
        })?;
        let identity = Identity::new(keypair, cert.clone(), trust, self.now_secs).or_else(|e| {
            self.err(
                &id.certificate.span(),
                "identity.certificate",
                format!("{e} (certificate of {})", cert.body().name),
            )
        })?;

        // Our LAN block is the certified IPv4 block.
        let Some(lan_block) = cert.body().vip_blocks.iter().find_map(|b| match b {
            IpNet::V4(v4) => Some(*v4),
            IpNet::V6(_) => None,
        }) else {
            return self.err(
                &id.certificate.span(),
                "identity.certificate",
                "the certificate names no IPv4 vIP block for the LAN",
            );
        };
        let overlay_domain = identity
            .trust()
            .cas()
            .iter()
            .find(|ca| ca.body().public_key == cert.body().issuer)
            .map(|ca| ca.body().name.clone())
            .unwrap_or_default();
        let overlay = *a.overlay.get_ref();
        if !overlay.contains(&lan_block) {
            return self.err(
                &a.overlay.span(),
                "adapter.overlay",
                format!("{overlay} does not contain this adapter's block {lan_block}"),
            );
        }
        let gw = *a.gateway_vip.get_ref();
        if !lan_block.contains(&gw) || gw == lan_block.network() || gw == lan_block.broadcast() {
            return self.err(
                &a.gateway_vip.span(),
                "adapter.gateway_vip",
                format!(
                    "{gw} must be a host address inside the block {lan_block} certified to {}",
                    cert.body().name
                ),
            );
        }
        let mtu = *a.inner_mtu.get_ref();
        // 576 is the smallest datagram every IPv4 host must accept (RFC 791); 1500 minus the
        // outer IPv6 (40) + UDP (8) + tunnel (32) headers is the most a 1500 underlay carries.
        if !(576..=1420 + 60).contains(&mtu) {
            return self.err(
                &a.inner_mtu.span(),
                "adapter.inner_mtu",
                format!("{mtu} is outside 576..=1480"),
            );
        }

        // Reservations: inside the block, unique MACs and addresses, not the gateway.
        let mut macs = HashSet::new();
        let mut vips = HashSet::new();
        let mut reservations = Vec::new();
        for (i, r) in raw.reservation.iter().enumerate() {
            let vip = *r.vip.get_ref();
            let key = |k: &str| format!("reservation[{i}].{k}");
            if !lan_block.contains(&vip)
                || vip == gw
                || vip == lan_block.network()
                || vip == lan_block.broadcast()
            {
                return self.err(
                    &r.vip.span(),
                    &key("vip"),
                    format!("{vip} is not a free host address of the block {lan_block}"),
                );
            }
            if !vips.insert(vip) {
                return self.err(
                    &r.vip.span(),
                    &key("vip"),
                    format!("{vip} is reserved twice"),
                );
            }
            if !macs.insert(*r.mac.get_ref()) {
                return self.err(
                    &r.mac.span(),
                    &key("mac"),
                    format!("{} is reserved twice", r.mac.get_ref()),
                );
            }
            if let Some(h) = &r.hostname {
                let label = h.get_ref();
                let ok = !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-');
                if !ok {
                    return self.err(
                        &h.span(),
                        &key("hostname"),
                        format!("{label:?} is not a DNS label (a-z, 0-9, inner hyphens, 1 to 63)"),
                    );
                }
            }
            reservations.push(Reservation {
                mac: *r.mac.get_ref(),
                vip,
                hostname: r.hostname.as_ref().map(|h| h.get_ref().clone()),
            });
        }

        // Static peers: valid certificates, blocks apart from ours and from each other.
        let mut peers: Vec<StaticPeer> = Vec::new();
        let mut names = HashMap::new();
        for (i, p) in raw.peer.iter().enumerate() {
            let key = format!("peer[{i}].certificate");
            let pcert = Certificate::from_pem(&self.read(&p.certificate, &key)?)
                .or_else(|e| self.err(&p.certificate.span(), &key, e.to_string()))?;
            identity
                .trust()
                .verify(&pcert, self.now_secs)
                .or_else(|e| {
                    self.err(
                        &p.certificate.span(),
                        &key,
                        format!("{} refused: {e}", pcert.body().name),
                    )
                })?;
            if pcert.body().public_key == cert.body().public_key {
                return self.err(&p.certificate.span(), &key, "this is our own certificate");
            }
            if let Some(prev) = names.insert(pcert.body().name.clone(), i) {
                return self.err(
                    &p.certificate.span(),
                    &key,
                    format!("{} is already peer[{prev}]", pcert.body().name),
                );
            }
            for b in &pcert.body().vip_blocks {
                if let IpNet::V4(b4) = b
                    && (b4.contains(&lan_block) || lan_block.contains(b4))
                {
                    return self.err(
                        &p.certificate.span(),
                        &key,
                        format!(
                            "{}'s block {b} overlaps ours {lan_block}",
                            pcert.body().name
                        ),
                    );
                }
                if let Some(other) = peers.iter().find(|q| {
                    q.certificate
                        .body()
                        .vip_blocks
                        .iter()
                        .any(|qb| qb.contains(b) || b.contains(qb))
                }) {
                    return self.err(
                        &p.certificate.span(),
                        &key,
                        format!("block {b} overlaps {}'s", other.certificate.body().name),
                    );
                }
            }
            let first_v4 = pcert.body().vip_blocks.iter().find_map(|b| match b {
                IpNet::V4(v4) => Some(*v4),
                IpNet::V6(_) => None,
            });
            let dns = match (&p.dns, first_v4) {
                (Some(d), _) => {
                    let ip = *d.get_ref();
                    if !pcert.body().covers(IpAddr::V4(ip)) {
                        return self.err(
                            &d.span(),
                            &format!("peer[{i}].dns"),
                            format!(
                                "{ip} is not inside {}'s certified blocks",
                                pcert.body().name
                            ),
                        );
                    }
                    ip
                }
                // By convention a peer's gateway vIP is the first host of its block.
                (None, Some(b)) => Ipv4Addr::from(u32::from(b.network()).saturating_add(1)),
                (None, None) => Ipv4Addr::UNSPECIFIED,
            };
            if let Some(ep) = p.endpoint
                && (ep.port() == 0
                    || ep.ip().is_unspecified()
                    || matches!(ep.ip(), IpAddr::V4(v4) if v4.is_broadcast()))
            {
                return self.err(
                    &p.certificate.span(),
                    &format!("peer[{i}].endpoint"),
                    format!("{ep} is not a reachable address"),
                );
            }
            peers.push(StaticPeer {
                certificate: pcert,
                endpoint: p.endpoint,
                persistent_keepalive: p
                    .persistent_keepalive
                    .filter(|s| *s > 0)
                    .map(Duration::from_secs),
                dns,
            });
        }

        let dhcp = self.check_dhcp(&raw.dhcp, &cert, lan_block, gw, mtu, &reservations)?;
        let dns = if raw.dns.enabled {
            let ttl = *raw.dns.ttl.get_ref();
            if ttl > 86_400 {
                return self.err(
                    &raw.dns.ttl.span(),
                    "dns.ttl",
                    format!("{ttl} s is over a day; device names change when leases do"),
                );
            }
            let mut upstream = Vec::new();
            for (i, u) in raw.dns.upstream.iter().enumerate() {
                let ip = *u.get_ref();
                let inside = match ip {
                    IpAddr::V4(v4) => overlay.contains(&v4),
                    IpAddr::V6(_) => false,
                };
                if ip.is_unspecified() || ip.is_multicast() || inside {
                    return self.err(
                        &u.span(),
                        &format!("dns.upstream[{i}]"),
                        format!(
                            "{ip} cannot be an upstream resolver (the upstreams are reached on the external side, outside the overlay)"
                        ),
                    );
                }
                upstream.push(ip);
            }
            Some(Dns { upstream, ttl })
        } else {
            None
        };

        let d = &raw.dataplane;
        for (v, k) in [
            (&d.batch_size, "dataplane.batch_size"),
            (&d.batches_in_flight, "dataplane.batches_in_flight"),
        ] {
            if !(1..=1024).contains(v.get_ref()) {
                return self.err(&v.span(), k, format!("{} is outside 1..=1024", v.get_ref()));
            }
        }
        if *d.buffers.get_ref() < 256 {
            return self.err(
                &d.buffers.span(),
                "dataplane.buffers",
                "at least 256 buffers are needed to run",
            );
        }
        let cloud = match &raw.cloud {
            Some(c) => {
                let text = c.public_key.get_ref();
                let mut key = [0u8; 32];
                if hex::decode_to_slice(text.trim(), &mut key).is_err() {
                    return self.err(
                        &c.public_key.span(),
                        "cloud.public_key",
                        "expected the 64 hex digits `cyphonic-cloud keygen` printed",
                    );
                }
                for e in &c.endpoints {
                    let ip = e.get_ref().ip();
                    if ip.is_unspecified() || ip.is_multicast() || e.get_ref().port() == 0 {
                        return self.err(
                            &e.span(),
                            "cloud.endpoints",
                            format!("{} cannot be reached by peers", e.get_ref()),
                        );
                    }
                }
                Some(Cloud {
                    address: c.address,
                    public_key: cyphonic_crypto::PublicKey(key),
                    endpoints: c.endpoints.iter().map(|e| *e.get_ref()).collect(),
                })
            }
            None => None,
        };
        let config = Config {
            path: self.path.to_owned(),
            lan_interface: a.lan_interface.clone(),
            listen: a.listen,
            gateway_vip: gw,
            lan_block,
            overlay,
            inner_mtu: mtu,
            mss_clamp: a.mss_clamp,
            status_socket: self.resolve(&a.status_socket),
            state_dir: self.resolve(&a.state_dir),
            overlay_domain,
            dhcp,
            dns,
            dataplane: Dataplane {
                workers: d.workers,
                batch_size: *d.batch_size.get_ref(),
                batches_in_flight: *d.batches_in_flight.get_ref(),
                ordering: d.ordering,
                aead: d.aead.0,
                udp_buffer: d.udp_buffer,
                lan_buffer: d.lan_buffer,
                queue_per_peer: d.queue_per_peer,
                buffers: *d.buffers.get_ref(),
                disable_offloads: d.disable_offloads,
            },
            reservations,
            peers,
            cloud,
        };
        Ok((config, identity))
    }
}

impl Checker<'_> {
    /// The DHCP server's configuration, checked by building a server with it: the pool must
    /// lie inside the certified block.
    fn check_dhcp(
        &self,
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
            Some(text) => {
                let parsed = text
                    .get_ref()
                    .split_once('-')
                    .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
                let Some(pool) = parsed else {
                    return self.err(
                        &text.span(),
                        "dhcp.pool",
                        format!(
                            "{:?} is not a range of addresses like \"100.64.1.100-100.64.1.199\"",
                            text.get_ref()
                        ),
                    );
                };
                pool
            }
        };
        if *d.new_lease_window.get_ref() == 0 {
            return self.err(
                &d.new_lease_window.span(),
                "dhcp.new_lease_window",
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
            reservations: reservations
                .iter()
                .map(|r| cyphonic_vip::Reservation {
                    mac: r.mac.0,
                    ip: r.vip,
                    hostname: r.hostname.clone(),
                })
                .collect(),
            new_lease_share: *d.new_lease_share.get_ref(),
            new_lease_window_secs: *d.new_lease_window.get_ref(),
        };
        match cyphonic_vip::Server::new(cfg.clone(), Vec::new(), self.now_secs) {
            Ok(_) => Ok(Some(cfg)),
            Err(e @ E::PoolOutsideBlock { .. }) => {
                let span = d.pool.as_ref().map(Spanned::span).unwrap_or_default();
                self.err(
                    &span,
                    "dhcp.pool",
                    format!("{e} (certified to {name}); the adapter refuses to start"),
                )
            }
            Err(e @ E::LeaseTime(_)) => {
                self.err(&d.lease_time.span(), "dhcp.lease_time", e.to_string())
            }
            Err(e @ E::Share(_)) => self.err(
                &d.new_lease_share.span(),
                "dhcp.new_lease_share",
                e.to_string(),
            ),
            Err(e) => {
                let span = d.pool.as_ref().map(Spanned::span).unwrap_or_default();
                self.err(&span, "dhcp.pool", e.to_string())
            }
        }
    }
}

/// 1-based line of byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset.min(text.len()))
        .map_or(1, |t| t.matches('\n').count() + 1)
}

/// The dotted key at byte `offset`: the table header above it and the key on its line,
/// e.g. `reservation[1].mac`.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let line_no = line_of(text, offset);
    let lines: Vec<&str> = text.lines().collect();
    let line = lines.get(line_no - 1)?;
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_owned());
    let mut table = None;
    let mut counts: HashMap<String, usize> = HashMap::new();
    for l in &lines[..line_no.min(lines.len())] {
        let t = l.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|r| r.strip_suffix("]]")) {
            let n = counts.entry(name.trim().to_owned()).or_insert(0);
            table = Some(format!("{}[{}]", name.trim(), *n));
            *n += 1;
        } else if let Some(name) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            table = Some(name.trim().to_owned());
        }
    }
    match (table, key) {
        (Some(t), Some(k)) => Some(format!("{t}.{k}")),
        (None, Some(k)) => Some(k),
        (Some(t), None) => Some(t),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use cyphonic_crypto::{CertificateAuthority, IssueRequest};

    use super::*;

    const NOW: u64 = 1_800_000_000;

    /// A directory with a CA, gw1's key and certificate, gw2's certificate and the example
    /// configuration, as the example's relative paths expect. Removed on drop.
    struct Fixture(PathBuf);

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn fixture() -> Fixture {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cyphonic-config-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(dir.join("peers")).unwrap();
        let ca = CertificateAuthority::generate(
            "ovl.example",
            &["100.64.0.0/10".parse().unwrap()],
            NOW - 100,
            NOW + 10_000_000,
        )
        .unwrap();
        let issue = |name: &str, block: &str, key: &StaticKeypair| {
            ca.issue(&IssueRequest {
                name: name.into(),
                vip_blocks: vec![block.parse().unwrap()],
                public_key: key.public().0,
                groups: vec![],
                not_before: NOW - 100,
                not_after: NOW + 1_000_000,
            })
            .unwrap()
        };
        let k1 = StaticKeypair::generate().unwrap();
        let k2 = StaticKeypair::generate().unwrap();
        std::fs::write(dir.join("ca.crt"), ca.certificate().to_pem()).unwrap();
        std::fs::write(dir.join("revoked.txt"), "# none\n").unwrap();
        std::fs::write(dir.join("gw1.ovl.example.key"), &*k1.to_pem()).unwrap();
        std::fs::write(
            dir.join("gw1.ovl.example.crt"),
            issue("gw1.ovl.example", "100.64.1.0/24", &k1).to_pem(),
        )
        .unwrap();
        std::fs::write(
            dir.join("peers/gw2.ovl.example.crt"),
            issue("gw2.ovl.example", "100.64.2.0/24", &k2).to_pem(),
        )
        .unwrap();
        std::fs::write(dir.join("adapter.toml"), EXAMPLE).unwrap();
        Fixture(dir)
    }

    const EXAMPLE: &str = include_str!("../../config/adapter.example.toml");

    fn load_text(f: &Fixture, text: &str) -> Result<(Config, Identity), ConfigError> {
        let path = f.0.join("test.toml");
        std::fs::write(&path, text).unwrap();
        load(&path, NOW)
    }

    #[test]
    fn the_example_configuration_is_valid() {
        let f = fixture();
        let (c, id) = load(&f.0.join("adapter.toml"), NOW).unwrap();
        assert_eq!(id.certificate().body().name, "gw1.ovl.example");
        assert_eq!(c.lan_block.to_string(), "100.64.1.0/24");
        assert_eq!(c.gateway_vip, Ipv4Addr::new(100, 64, 1, 1));
        assert_eq!(c.reservations.len(), 2);
        assert_eq!(c.reservations[0].hostname.as_deref(), Some("sensor1"));
        assert_eq!(c.peers.len(), 1);
        assert_eq!(
            c.peers[0].persistent_keepalive,
            Some(Duration::from_secs(25))
        );
        assert_eq!(c.dataplane.aead, Backend::Ring);
        assert!(c.status_socket.is_absolute());
        assert_eq!(c.overlay_domain, "ovl.example");
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
            c.dns,
            Some(Dns {
                upstream: vec![IpAddr::from([192, 0, 2, 53])],
                ttl: 60
            })
        );
        assert_eq!(c.peers[0].dns, Ipv4Addr::new(100, 64, 2, 1));
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        let f = fixture();
        let minimal = "[adapter]\nlan_interface = \"eth1\"\ngateway_vip = \"100.64.1.1\"\n\n[identity]\ncertificate = \"gw1.ovl.example.crt\"\nkey = \"gw1.ovl.example.key\"\nca = \"ca.crt\"\n";
        let (c, _) = load_text(&f, minimal).unwrap();
        assert_eq!(
            (c.inner_mtu, c.mss_clamp, c.listen.port()),
            (1420, true, 51820)
        );
        assert_eq!(
            c.dataplane,
            Dataplane {
                workers: 0,
                batch_size: 32,
                batches_in_flight: 128,
                ordering: true,
                aead: Backend::Ring,
                udp_buffer: 4 << 20,
                lan_buffer: 4 << 20,
                queue_per_peer: 64,
                buffers: 8192,
                disable_offloads: true,
            }
        );
        assert!(c.reservations.is_empty() && c.peers.is_empty());
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
            c.dns,
            Some(Dns {
                upstream: vec![],
                ttl: 60
            })
        );
        let off = format!("{minimal}\n[dhcp]\nenabled = false\n[dns]\nenabled = false\n");
        let (c, _) = load_text(&f, &off).unwrap();
        assert!(c.dhcp.is_none() && c.dns.is_none());
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
                "gateway_vip = \"100.64.1.1\"",
                "gateway_vip = \"100.64.9.1\"",
                ":18: key `adapter.gateway_vip`: 100.64.9.1 must be a host address inside the block 100.64.1.0/24",
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
                "aead = \"ring\"",
                "aead = \"aes\"",
                "key `dataplane.aead`: unknown AEAD backend \"aes\"",
            ),
            (
                "\nordering = true",
                "\nordring = true",
                "key `dataplane.ordring`: unknown field `ordring`",
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
                "buffers = 8192",
                "buffers = 10",
                "key `dataplane.buffers`: at least 256",
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
                "public_key = \"5b0f",
                "public_key = \"zz0f",
                "key `cloud.public_key`: expected the 64 hex digits",
            ),
            (
                "endpoints = [\"198.51.100.2:51820\"]",
                "endpoints = [\"0.0.0.0:51820\"]",
                "key `cloud.endpoints`: 0.0.0.0:51820 cannot be reached by peers",
            ),
            ("[adapter]", "[adaptor]", "unknown field `adaptor`"),
            (
                "lan_interface = \"eth1\"",
                "",
                "missing field `lan_interface`",
            ),
        ];
        for (from, to, expect) in cases {
            assert!(EXAMPLE.contains(from), "the example lost {from:?}");
            let err = load_text(&f, &EXAMPLE.replacen(from, to, 1))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(&f.0.join("test.toml").display().to_string()),
                "{err}"
            );
            assert!(
                err.contains(expect),
                "{from:?} -> {to:?}\n  got:  {err}\n  want: {expect}"
            );
        }
    }

    #[test]
    fn revoked_or_foreign_peer_certificates_are_refused() {
        let f = fixture();
        let peer = Certificate::from_pem(
            &std::fs::read_to_string(f.0.join("peers/gw2.ovl.example.crt")).unwrap(),
        )
        .unwrap();
        std::fs::write(f.0.join("revoked.txt"), format!("{}\n", peer.fingerprint())).unwrap();
        let err = load(&f.0.join("adapter.toml"), NOW)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key `peer[0].certificate`: gw2.ovl.example refused: certificate")
                && err.contains("is revoked"),
            "{err}"
        );
        let err = load(&f.0.join("adapter.toml"), NOW + 2_000_000)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key `identity.certificate`") && err.contains("expired"),
            "{err}"
        );
    }

    /// The fields each table accepts, as serde itself lists them for an unknown key.
    fn accepted_keys(table: &str) -> Vec<String> {
        let probe = match table {
            "" => "__probe = 1\n".to_owned(),
            "cloud" => {
                "[cloud]\naddress = \"192.0.2.1:1\"\npublic_key = \"\"\n__probe = 1\n".to_owned()
            }
            "reservation" | "peer" => format!("[[{table}]]\n__probe = 1\n"),
            t => format!("[{t}]\n__probe = 1\n"),
        };
        let err = toml::from_str::<Raw>(&probe)
            .err()
            .map(|e| e.message().to_owned())
            .unwrap_or_default();
        let list = err.split("expected one of").nth(1).unwrap_or_default();
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    /// config/adapter.example.toml sets every key the code accepts, so every key is documented
    /// there (a new key without documentation fails here).
    #[test]
    fn the_example_documents_every_key() {
        let example: toml::Table = toml::from_str(EXAMPLE).unwrap();
        let top = accepted_keys("");
        assert_eq!(
            top,
            [
                "adapter",
                "identity",
                "dhcp",
                "dns",
                "dataplane",
                "reservation",
                "peer",
                "cloud"
            ]
        );
        for table in &top {
            let keys = accepted_keys(table);
            assert!(!keys.is_empty(), "no keys found for {table}");
            let section = &example[table.as_str()];
            let present: HashSet<String> = match section {
                toml::Value::Array(items) => items
                    .iter()
                    .flat_map(|i| i.as_table().unwrap().keys().cloned())
                    .collect(),
                toml::Value::Table(t) => t.keys().cloned().collect(),
                other => panic!("{table}: {other:?}"),
            };
            for k in keys {
                assert!(
                    present.contains(&k),
                    "config/adapter.example.toml does not show `{table}.{k}`"
                );
            }
        }
    }
}

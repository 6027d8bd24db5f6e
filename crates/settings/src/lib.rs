//! Reading the binaries' configuration files. `cyphonic-adapter` and `cyphonic-node` each
//! declare their own file (their tables, as serde structs) and check what is theirs; the
//! tables and checks they share live here: `[identity]` (our key, certificate, CA and
//! revocations, read and verified), `[[peer]]` (static peers), `[cloud]`, and the common
//! `[dataplane]` and `[dns]` limits. Every mistake is a [`ConfigError`] that names the file,
//! and where it can the line and the dotted key (`peer[1].certificate`).
//!
//! Only the binaries and their shared daemon core (`cyphonic-daemon`) use this crate:
//! libraries take typed values, which this crate builds: the engine's
//! [`DataPlane`] and [`StaticPeer`]s directly, the rest in [`Common`] and the binaries' own
//! configuration types.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cyphonic_crypto::{
    Backend, CertError, Certificate, PublicKey, RevocationList, StaticKeypair, TrustStore,
};
use ipnet::{IpNet, Ipv4Net};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use toml::Spanned;

mod dataplane;
mod end;
mod policy;
pub use cyphonic_netio::Placement;
pub use cyphonic_session::Identity;
pub use cyphonic_tunnel::{DataPlane, StaticPeer};
pub use end::{Common, Dns, EndKeys};
pub use policy::{DNS_RULE, Device, RawPolicy, directory, dns_rules};

/// What the declaring macros name in the calling crate's code.
#[doc(hidden)]
pub mod __private {
    pub use ipnet::Ipv4Net;
    pub use toml::Spanned;
}

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

/// A configuration file being checked: where it is, what it says, and the time certificates
/// are checked at.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The file.
    pub path: &'a Path,
    /// Its text.
    pub text: &'a str,
    /// Unix seconds to check validity periods at.
    pub now_secs: u64,
}

/// The wall clock in Unix seconds, for [`Source::now_secs`] (0 if it is before 1970).
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Reads the file at `path` and parses it as `T`; returns it with the text (for [`Source`]).
///
/// # Errors
/// The file cannot be read, or is not valid TOML for `T` (located).
pub fn parse<T: DeserializeOwned>(path: &Path) -> Result<(T, String), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_owned(),
        line: None,
        key: None,
        message: format!("cannot read the configuration: {e}"),
    })?;
    let raw = toml::from_str(&text).map_err(|e| {
        let at = e.span().map(|s| s.start);
        ConfigError {
            file: path.to_owned(),
            line: at.map(|o| line_of(&text, o)),
            key: at.and_then(|o| key_at(&text, o)),
            message: e.message().trim().to_owned(),
        }
    })?;
    Ok((raw, text))
}

/// Reads the file at `path` as a `T` and checks it with `check`, certificates at unix time
/// `now_secs`: what a binary's `load` does.
///
/// # Errors
/// The file cannot be read or parsed, or `check` refuses it.
pub fn load<T: DeserializeOwned, R>(
    path: &Path,
    now_secs: u64,
    check: impl FnOnce(&T, &Source<'_>) -> Result<R, ConfigError>,
) -> Result<R, ConfigError> {
    let (raw, text) = parse(path)?;
    check(
        &raw,
        &Source {
            path,
            text: &text,
            now_secs,
        },
    )
}

impl Source<'_> {
    /// The error `message` about `key`, at `span` (a default span means "not in the file":
    /// no line).
    ///
    /// # Errors
    /// Always: this builds the error.
    pub fn err<T>(
        &self,
        span: &Range<usize>,
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
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.path.parent().unwrap_or(Path::new(".")).join(p)
        }
    }

    /// The contents of the file a key names.
    ///
    /// # Errors
    /// It cannot be read (located at the key).
    pub fn read(&self, p: &Spanned<PathBuf>, key: &str) -> Result<String, ConfigError> {
        let path = self.resolve(p.get_ref());
        std::fs::read_to_string(&path).or_else(|e| {
            self.err(
                &p.span(),
                key,
                format!("cannot read {}: {e}", path.display()),
            )
        })
    }
}

/// The keys of `keys` whose values changed (`(key, changed)` pairs): what a reload names as
/// waiting for a restart.
pub fn changed_keys<const N: usize>(keys: [(&'static str, bool); N]) -> Vec<&'static str> {
    keys.into_iter()
        .filter_map(|(key, changed)| changed.then_some(key))
        .collect()
}

// ---- [identity] ------------------------------------------------------------------------------

/// `[identity]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdentity {
    certificate: Spanned<PathBuf>,
    key: Spanned<PathBuf>,
    ca: Spanned<PathBuf>,
    revocations: Option<Spanned<PathBuf>>,
    token: Option<String>,
}

/// Where our identity's files are (resolved against the configuration's directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityFiles {
    /// Our certificate.
    pub certificate: PathBuf,
    /// Our Noise private key.
    pub key: PathBuf,
    /// The CA bundle (roots, and issuing CAs).
    pub ca: PathBuf,
}

impl RawIdentity {
    /// Where our certificate, key and CA bundle are.
    pub fn files(&self, src: &Source<'_>) -> IdentityFiles {
        IdentityFiles {
            certificate: src.resolve(self.certificate.get_ref()),
            key: src.resolve(self.key.get_ref()),
            ca: src.resolve(self.ca.get_ref()),
        }
    }

    /// The enrollment token (`[identity] token`): used when the certificate file does not
    /// exist yet.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Where the certificate key is written (to locate errors about what it certifies).
    pub fn certificate_span(&self) -> Range<usize> {
        self.certificate.span()
    }

    /// Reads and checks our key, certificate, CA and revocations: our identity.
    ///
    /// # Errors
    /// Unreadable files, malformed keys or certificates, a certificate that does not verify
    /// under the CA or certifies another key.
    pub fn load(&self, src: &Source<'_>) -> Result<Identity, ConfigError> {
        let key_text = src.read(&self.key, "identity.key")?;
        let keypair = StaticKeypair::from_pem(&key_text).or_else(|e| {
            src.err(
                &self.key.span(),
                "identity.key",
                format!("not a Noise private key: {e}"),
            )
        })?;
        let ca_text = src.read(&self.ca, "identity.ca")?;
        let cas = Certificate::all_from_pem(&ca_text).or_else(|e| {
            src.err(
                &self.ca.span(),
                "identity.ca",
                format!("not a CA certificate: {e}"),
            )
        })?;
        if cas.is_empty() {
            return src.err(
                &self.ca.span(),
                "identity.ca",
                "the file holds no CYPHONIC CERTIFICATE block",
            );
        }
        let revoked = match &self.revocations {
            Some(r) => RevocationList::parse(&src.read(r, "identity.revocations")?)
                .or_else(|e| src.err(&r.span(), "identity.revocations", e.to_string()))?,
            None => RevocationList::default(),
        };
        let trust = TrustStore::new(cas, revoked).or_else(|e| {
            src.err(
                &self.ca.span(),
                "identity.ca",
                format!("not a valid self-signed CA certificate: {e}"),
            )
        })?;
        let cert_text = src.read(&self.certificate, "identity.certificate")?;
        let cert = Certificate::from_pem(&cert_text).or_else(|e| {
            src.err(
                &self.certificate.span(),
                "identity.certificate",
                e.to_string(),
            )
        })?;
        Identity::new(keypair, cert.clone(), trust, src.now_secs).or_else(|e| {
            src.err(
                &self.certificate.span(),
                "identity.certificate",
                format!("{e} (certificate of {})", cert.body().name),
            )
        })
    }
}

/// The overlay's domain: the name of the CA that issued our certificate.
pub fn overlay_domain(identity: &Identity) -> String {
    let cert = identity.certificate();
    identity
        .trust()
        .cas()
        .iter()
        .find(|ca| ca.body().public_key == cert.body().issuer)
        .map(|ca| ca.body().name.clone())
        .unwrap_or_default()
}

/// The first IPv4 block a certificate certifies.
pub fn first_v4_block(cert: &Certificate) -> Option<Ipv4Net> {
    cert.body().v4_blocks().first().copied()
}

// ---- [[peer]] --------------------------------------------------------------------------------

/// One `[[peer]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPeer {
    certificate: Spanned<PathBuf>,
    endpoint: Option<SocketAddr>,
    persistent_keepalive: Option<u64>,
    dns: Option<Spanned<Ipv4Addr>>,
}

/// A static peer, checked.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its certificate (verified against our CA when loading).
    pub certificate: Certificate,
    /// Where to reach it first; without one, we wait for it to call.
    pub endpoint: Option<SocketAddr>,
    /// Keepalive interval to hold NAT mappings open.
    pub persistent_keepalive: Option<Duration>,
    /// The peer's DNS server (an adapter's gateway vIP): where names in its zone are asked.
    pub dns: Ipv4Addr,
    /// Its certificate is on our revocation list: it is left out of the peer table (and its
    /// zone out of DNS) until the list no longer names it. Revocation lists are handed out
    /// to a whole fleet, apart from each site's peers, so a revoked peer does not make the
    /// file wrong.
    pub revoked: bool,
}

impl Peer {
    /// The peer as the engine takes it.
    pub fn to_static(&self) -> StaticPeer {
        StaticPeer {
            certificate: self.certificate.clone(),
            endpoint: self.endpoint,
            persistent_keepalive: self.persistent_keepalive,
        }
    }
}

/// Checks the `[[peer]]` tables: certificates that verify under our CA, not ours, distinct,
/// with blocks apart from `own` and from each other; reachable endpoints.
///
/// # Errors
/// The first mistake, located.
pub fn peers(
    src: &Source<'_>,
    raw: &[RawPeer],
    identity: &Identity,
    own: Ipv4Net,
) -> Result<Vec<Peer>, ConfigError> {
    let ours = identity.certificate().body();
    let mut peers: Vec<Peer> = Vec::new();
    let mut names = HashMap::new();
    for (i, p) in raw.iter().enumerate() {
        let key = format!("peer[{i}].certificate");
        let span = p.certificate.span();
        let pcert = Certificate::from_pem(&src.read(&p.certificate, &key)?)
            .or_else(|e| src.err(&span, &key, e.to_string()))?;
        let body = pcert.body().clone();
        let revoked = match identity.trust().verify(&pcert, src.now_secs) {
            Ok(()) => false,
            Err(CertError::Revoked(_)) => true,
            Err(e) => return src.err(&span, &key, format!("{} refused: {e}", body.name)),
        };
        if body.public_key == ours.public_key {
            return src.err(&span, &key, "this is our own certificate");
        }
        if let Some(prev) = names.insert(body.name.clone(), i) {
            return src.err(
                &span,
                &key,
                format!("{} is already peer[{prev}]", body.name),
            );
        }
        for b in &body.vip_blocks {
            if let IpNet::V4(b4) = b
                && (b4.contains(&own) || own.contains(b4))
            {
                return src.err(
                    &span,
                    &key,
                    format!("{}'s block {b} overlaps ours {own}", body.name),
                );
            }
            if let Some(other) = peers.iter().find(|q| {
                q.certificate
                    .body()
                    .vip_blocks
                    .iter()
                    .any(|qb| qb.contains(b) || b.contains(qb))
            }) {
                return src.err(
                    &span,
                    &key,
                    format!("block {b} overlaps {}'s", other.certificate.body().name),
                );
            }
        }
        let dns = match (&p.dns, first_v4_block(&pcert)) {
            (Some(d), _) => {
                let ip = *d.get_ref();
                if !body.covers(IpAddr::V4(ip)) {
                    return src.err(
                        &d.span(),
                        &format!("peer[{i}].dns"),
                        format!("{ip} is not inside {}'s certified blocks", body.name),
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
            return src.err(
                &span,
                &format!("peer[{i}].endpoint"),
                format!("{ep} is not a reachable address"),
            );
        }
        peers.push(Peer {
            certificate: pcert,
            endpoint: p.endpoint,
            persistent_keepalive: p
                .persistent_keepalive
                .filter(|s| *s > 0)
                .map(Duration::from_secs),
            dns,
            revoked,
        });
    }
    Ok(peers)
}

// ---- [cloud] ---------------------------------------------------------------------------------

/// `[cloud]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCloud {
    address: Spanned<OneOrMore>,
    public_key: Spanned<OneOrMore>,
    #[serde(default)]
    endpoints: Vec<Spanned<SocketAddr>>,
    #[serde(default = "default_idle_peer_timeout")]
    idle_peer_timeout: Spanned<u64>,
}

/// A key that takes one string or a list of them (`address = "a"`, `address = ["a", "b"]`).
/// (Errors point at the whole value: toml's spans do not survive serde's untagged enums.)
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMore {
    One(String),
    More(Vec<String>),
}

impl OneOrMore {
    fn items(&self) -> Vec<&String> {
        match self {
            Self::One(one) => vec![one],
            Self::More(more) => more.iter().collect(),
        }
    }
}

/// Checks a cloud address, `host:port` or an IP address and port; returns it as written.
fn cloud_address(text: &str) -> Result<String, String> {
    if text.parse::<SocketAddr>().is_ok() {
        return Ok(text.to_owned());
    }
    let bad = || {
        format!(
            "{text:?} is not host:port or an IP address and port (192.0.2.10:7000, cloud.example.net:7000, [2001:db8::10]:7000)"
        )
    };
    let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if port == 0 || host.is_empty() || host.contains(['[', ']', ':']) {
        return Err(bad());
    }
    cyphonic_crypto::validate_name(&host.to_ascii_lowercase())
        .map_err(|e| format!("{text:?}: {e}"))?;
    Ok(text.to_owned())
}

/// Ten minutes without traffic.
fn default_idle_peer_timeout() -> Spanned<u64> {
    Spanned::new(0..0, 600)
}

/// Where the cloud is (`[cloud]`), checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cloud {
    /// The cloud's instances (NMS's control address): `host:port` or an IP address and
    /// port, tried in turn.
    pub addresses: Vec<String>,
    /// Its Noise public keys, pinned (more than one while the key is being replaced).
    pub public_keys: Vec<PublicKey>,
    /// Tunnel endpoints to register besides the one the cloud observes.
    pub endpoints: Vec<SocketAddr>,
    /// Peers found through the cloud leave the table after this long without traffic.
    pub idle_peer_timeout: Duration,
}

impl RawCloud {
    /// Checks the cloud's key and our extra endpoints.
    ///
    /// # Errors
    /// A key that is not 64 hex digits, an endpoint nobody can reach.
    pub fn check(&self, src: &Source<'_>) -> Result<Cloud, ConfigError> {
        let mut public_keys = Vec::new();
        for text in self.public_key.get_ref().items() {
            let Ok(key) = text.parse::<PublicKey>() else {
                return src.err(
                    &self.public_key.span(),
                    "cloud.public_key",
                    "expected the 64 hex digits `cyphonic-cloud keygen` printed",
                );
            };
            public_keys.push(key);
        }
        let mut addresses = Vec::new();
        for text in self.address.get_ref().items() {
            addresses.push(
                cloud_address(text)
                    .or_else(|e| src.err(&self.address.span(), "cloud.address", e))?,
            );
        }
        for (key, span, count) in [
            ("cloud.address", self.address.span(), addresses.len()),
            (
                "cloud.public_key",
                self.public_key.span(),
                public_keys.len(),
            ),
        ] {
            if count == 0 {
                return src.err(&span, key, "give at least one");
            }
        }
        for e in &self.endpoints {
            let ip = e.get_ref().ip();
            if ip.is_unspecified() || ip.is_multicast() || e.get_ref().port() == 0 {
                return src.err(
                    &e.span(),
                    "cloud.endpoints",
                    format!("{} cannot be reached by peers", e.get_ref()),
                );
            }
        }
        let idle = *self.idle_peer_timeout.get_ref();
        if !(5..=86_400).contains(&idle) {
            return src.err(
                &self.idle_peer_timeout.span(),
                "cloud.idle_peer_timeout",
                format!("{idle} s: give 5 to 86400 seconds"),
            );
        }
        Ok(Cloud {
            addresses,
            public_keys,
            endpoints: self.endpoints.iter().map(|e| *e.get_ref()).collect(),
            idle_peer_timeout: Duration::from_secs(idle),
        })
    }
}

// ---- [metrics] -------------------------------------------------------------------------------

/// `[metrics]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    listen: Option<Spanned<SocketAddr>>,
}

impl RawMetrics {
    /// Where the Prometheus endpoint listens, if anywhere. A port is required; any address is
    /// taken (loopback, or a management network: the metrics name peers and devices).
    ///
    /// # Errors
    /// Port 0.
    pub fn check(&self, src: &Source<'_>) -> Result<Option<SocketAddr>, ConfigError> {
        match &self.listen {
            Some(l) if l.get_ref().port() == 0 => src.err(
                &l.span(),
                "metrics.listen",
                "give the port Prometheus scrapes (9464, say)",
            ),
            Some(l) => Ok(Some(*l.get_ref())),
            None => Ok(None),
        }
    }
}

// ---- [log] -----------------------------------------------------------------------------------

/// `[log]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    level: Option<Spanned<String>>,
}

impl RawLog {
    /// The log filter the file asks for (`RUST_LOG`'s syntax), if any.
    ///
    /// # Errors
    /// Directives that do not parse.
    pub fn check(&self, src: &Source<'_>) -> Result<Option<String>, ConfigError> {
        match &self.level {
            Some(l) => match cyphonic_telemetry::logging::check_filter(l.get_ref()) {
                Ok(()) => Ok(Some(l.get_ref().clone())),
                Err(e) => src.err(
                    &l.span(),
                    "log.level",
                    format!("{e} (examples: \"info\", \"warn,cyphonic_tunnel=debug\")"),
                ),
            },
            None => Ok(None),
        }
    }
}

// ---- [dataplane] and [dns] -------------------------------------------------------------------

/// An AEAD backend name (`ring` or `rustcrypto`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AeadName(pub Backend);

impl<'de> Deserialize<'de> for AeadName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map(Self).map_err(serde::de::Error::custom)
    }
}

/// The defaults both binaries give the keys they share, as serde's `default = "..."` takes
/// them (spanned values carry an empty span: "not in the file"). The `[dataplane]` ones are
/// the engine's own ([`cyphonic_tunnel::DataPlane`]'s `Default`).
pub mod defaults {
    use std::net::{Ipv4Addr, SocketAddr};

    use cyphonic_tunnel::DataPlane;
    use ipnet::Ipv4Net;
    use toml::Spanned;

    /// `listen`: every address, IPv4 and IPv6, port 51820.
    pub fn listen() -> SocketAddr {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 51820))
    }
    /// `overlay`: 100.64.0.0/10.
    pub fn overlay() -> Spanned<Ipv4Net> {
        Spanned::new(
            0..0,
            Ipv4Net::new(Ipv4Addr::new(100, 64, 0, 0), 10).expect("valid prefix"),
        )
    }
    /// `inner_mtu`: 1420.
    pub fn inner_mtu() -> Spanned<u16> {
        Spanned::new(0..0, 1420)
    }
    /// Switches that are on unless switched off.
    pub const fn yes() -> bool {
        true
    }
    /// `dns.ttl`: 60 s.
    pub fn dns_ttl() -> Spanned<u32> {
        Spanned::new(0..0, 60)
    }
    /// Socket buffers: 4 MiB.
    pub fn socket_buffer() -> usize {
        DataPlane::default().udp_buffer
    }
    /// `dataplane.workers`: 0, one per core.
    pub fn workers() -> usize {
        DataPlane::default().workers
    }
    /// `dataplane.batch_size`.
    pub fn batch_size() -> Spanned<usize> {
        Spanned::new(0..0, DataPlane::default().batch_size)
    }
    /// `dataplane.batches_in_flight`.
    pub fn batches_in_flight() -> Spanned<usize> {
        Spanned::new(0..0, DataPlane::default().batches_in_flight)
    }
    /// `dataplane.in_flight_bytes`: 16 MiB.
    pub fn in_flight_bytes() -> Spanned<usize> {
        Spanned::new(0..0, DataPlane::default().in_flight_bytes)
    }
    /// `dataplane.in_flight_ms`: 100.
    pub fn in_flight_ms() -> Spanned<u32> {
        let ms = DataPlane::default().in_flight_time.as_millis();
        Spanned::new(0..0, u32::try_from(ms).unwrap_or(u32::MAX))
    }
    /// `dataplane.inline_max`.
    pub fn inline_max() -> Spanned<usize> {
        Spanned::new(0..0, DataPlane::default().inline_max)
    }
    /// `dataplane.sparse_rate`.
    pub fn sparse_rate() -> u32 {
        DataPlane::default().sparse_rate
    }
    /// `dataplane.aqm_target_us`: 0 (off; CoDel's is 5 ms).
    pub fn aqm_target_us() -> Spanned<u32> {
        let target = DataPlane::default().aqm.map_or(0, |a| a.target.as_micros());
        Spanned::new(0..0, u32::try_from(target).unwrap_or(u32::MAX))
    }
    /// `dataplane.aqm_interval_ms`: CoDel's 100 ms.
    pub fn aqm_interval_ms() -> Spanned<u32> {
        let interval = cyphonic_tunnel::Aqm::default().interval.as_millis();
        Spanned::new(0..0, u32::try_from(interval).unwrap_or(u32::MAX))
    }
    /// `dataplane.ordering`.
    pub fn ordering() -> bool {
        DataPlane::default().ordering
    }
    /// `dataplane.udp_buffer`.
    pub fn udp_buffer() -> usize {
        DataPlane::default().udp_buffer
    }
    /// `dataplane.udp_gso`.
    pub fn udp_gso() -> bool {
        DataPlane::default().udp_gso
    }
    /// `dataplane.udp_gro`.
    pub fn udp_gro() -> bool {
        DataPlane::default().udp_gro
    }
    /// `dataplane.queue_per_peer`.
    pub fn queue_per_peer() -> usize {
        DataPlane::default().queue_per_peer
    }
    /// `dataplane.cpus`: none (wherever the scheduler puts them).
    pub fn cpus() -> Spanned<Vec<usize>> {
        Spanned::new(0..0, DataPlane::default().placement.cpus)
    }
    /// `dataplane.realtime_priority`: 0 (the normal scheduler).
    pub fn realtime_priority() -> Spanned<u8> {
        Spanned::new(0..0, DataPlane::default().placement.realtime_priority)
    }
    /// `dataplane.sparse_priority`: the sparse lanes' threads' SCHED_FIFO priority.
    pub fn sparse_priority() -> Spanned<u8> {
        Spanned::new(0..0, DataPlane::default().sparse_priority)
    }
    /// `dataplane.busy_poll_us`: 0 (receiving threads sleep until a packet wakes them).
    pub fn busy_poll_us() -> Spanned<u32> {
        let us = DataPlane::default().busy_poll.as_micros();
        Spanned::new(0..0, u32::try_from(us).unwrap_or(u32::MAX))
    }
    /// `dataplane.buffers`.
    pub fn buffers() -> Spanned<usize> {
        Spanned::new(0..0, DataPlane::default().buffers)
    }
    /// `dataplane.danger_rekey_after_secs`: the session's 120 s.
    pub fn rekey_after_secs() -> Spanned<u64> {
        Spanned::new(0..0, DataPlane::default().rekey_after.as_secs())
    }
    /// `dataplane.danger_rekey_after_messages`: the session's 2^60.
    pub fn rekey_after_messages() -> Spanned<u64> {
        Spanned::new(0..0, DataPlane::default().rekey_after_messages)
    }
}

/// The fewest seconds `danger_rekey_after_secs` may say: a handshake and its confirmation
/// take a round trip or two, keys must outlive them.
pub const REKEY_AFTER_SECS_MIN: u64 = 2;
/// The fewest messages `danger_rekey_after_messages` may say: at line rate a rekey every few
/// milliseconds, which the handshake rate limits still bear.
pub const REKEY_AFTER_MESSAGES_MIN: u64 = 10_000;

/// Checks the `danger_` rekey keys: only ever shorter than the defaults (they exist so tests
/// can see many rekeys; a longer interval would weaken the keys), never below a floor.
///
/// # Errors
/// A value outside its range, located in `src`.
pub fn check_rekey(
    src: &Source<'_>,
    secs: &Spanned<u64>,
    messages: &Spanned<u64>,
) -> Result<(), ConfigError> {
    let d = DataPlane::default();
    let max_secs = d.rekey_after.as_secs();
    if !(REKEY_AFTER_SECS_MIN..=max_secs).contains(secs.get_ref()) {
        return src.err(
            &secs.span(),
            "dataplane.danger_rekey_after_secs",
            format!(
                "{} is outside {REKEY_AFTER_SECS_MIN} ..= {max_secs} (shorter than the default only)",
                secs.get_ref()
            ),
        );
    }
    let max_messages = d.rekey_after_messages;
    if !(REKEY_AFTER_MESSAGES_MIN..=max_messages).contains(messages.get_ref()) {
        return src.err(
            &messages.span(),
            "dataplane.danger_rekey_after_messages",
            format!(
                "{} is outside {REKEY_AFTER_MESSAGES_MIN} ..= {max_messages} (fewer than the default only)",
                messages.get_ref()
            ),
        );
    }
    Ok(())
}

/// Checks the pipeline sizes of `[dataplane]`: batches of 1 to 1024 packets, 1 to
/// [`BATCHES_IN_FLIGHT_MAX`] in flight, inline batches of at most 1024 packets, at least 256
/// buffers.
///
/// # Errors
/// The first value out of range, located.
pub fn check_pipeline(
    src: &Source<'_>,
    batch_size: &Spanned<usize>,
    batches_in_flight: &Spanned<usize>,
    inline_max: &Spanned<usize>,
    buffers: &Spanned<usize>,
) -> Result<(), ConfigError> {
    if *inline_max.get_ref() > 1024 {
        return src.err(
            &inline_max.span(),
            "dataplane.inline_max",
            format!("{} is outside 0..=1024", inline_max.get_ref()),
        );
    }
    for (v, k, max) in [
        (batch_size, "dataplane.batch_size", 1024),
        (
            batches_in_flight,
            "dataplane.batches_in_flight",
            BATCHES_IN_FLIGHT_MAX,
        ),
    ] {
        if !(1..=max).contains(v.get_ref()) {
            return src.err(
                &v.span(),
                k,
                format!("{} is outside 1..={max}", v.get_ref()),
            );
        }
    }
    if *buffers.get_ref() < 256 {
        return src.err(
            &buffers.span(),
            "dataplane.buffers",
            "at least 256 buffers are needed to run",
        );
    }
    Ok(())
}

/// The most batch buffers per direction (`dataplane.batches_in_flight`).
pub const BATCHES_IN_FLIGHT_MAX: usize = 16_384;

/// The smallest byte budget in flight (`dataplane.in_flight_bytes`) but 0: 64 KiB, some
/// batches of full frames.
pub const IN_FLIGHT_BYTES_MIN: usize = 64 << 10;

/// The longest time budget in flight (`dataplane.in_flight_ms`): ten seconds.
pub const IN_FLIGHT_MS_MAX: u32 = 10_000;

/// Checks `[dataplane]`'s in-flight budget: bytes 0 (no bound) or at least
/// [`IN_FLIGHT_BYTES_MIN`], milliseconds 0 (no bound) to [`IN_FLIGHT_MS_MAX`].
///
/// # Errors
/// The first value out of range, located.
pub fn check_in_flight(
    src: &Source<'_>,
    bytes: &Spanned<usize>,
    ms: &Spanned<u32>,
) -> Result<(), ConfigError> {
    let b = *bytes.get_ref();
    if b != 0 && b < IN_FLIGHT_BYTES_MIN {
        return src.err(
            &bytes.span(),
            "dataplane.in_flight_bytes",
            format!("{b} is below {IN_FLIGHT_BYTES_MIN} (0: no bound)"),
        );
    }
    if *ms.get_ref() > IN_FLIGHT_MS_MAX {
        return src.err(
            &ms.span(),
            "dataplane.in_flight_ms",
            format!("{} is outside 0..={IN_FLIGHT_MS_MAX}", ms.get_ref()),
        );
    }
    Ok(())
}

/// The longest `dataplane.aqm_interval_ms`: ten seconds.
pub const AQM_INTERVAL_MAX_MS: u32 = 10_000;

/// Checks `[dataplane]`'s queue manager: a target of 0 (off) or one below the interval, an
/// interval of 1 ms to [`AQM_INTERVAL_MAX_MS`]; the engine's setting.
///
/// # Errors
/// The first value out of range, located.
pub fn check_aqm(
    src: &Source<'_>,
    target_us: &Spanned<u32>,
    interval_ms: &Spanned<u32>,
) -> Result<Option<cyphonic_tunnel::Aqm>, ConfigError> {
    let (target, interval) = (*target_us.get_ref(), *interval_ms.get_ref());
    if !(1..=AQM_INTERVAL_MAX_MS).contains(&interval) {
        return src.err(
            &interval_ms.span(),
            "dataplane.aqm_interval_ms",
            format!("{interval} is outside 1..={AQM_INTERVAL_MAX_MS}"),
        );
    }
    if u64::from(target) >= u64::from(interval) * 1000 {
        return src.err(
            &target_us.span(),
            "dataplane.aqm_target_us",
            format!("{target} µs is not below the interval ({interval} ms)"),
        );
    }
    Ok((target > 0).then(|| cyphonic_tunnel::Aqm {
        target: Duration::from_micros(u64::from(target)),
        interval: Duration::from_millis(u64::from(interval)),
    }))
}

/// The longest `dataplane.busy_poll_us`: one second.
pub const BUSY_POLL_MAX_US: u32 = 1_000_000;

/// Checks `[dataplane]`'s thread placement: CPU numbers under 1024, each once; a real-time
/// priority of 0 (off) to 99; busy polling of at most [`BUSY_POLL_MAX_US`], and not at a
/// real-time priority on cores the data plane does not have to itself (`cpus` empty). Whether
/// the CPUs exist on this machine is checked at start.
///
/// # Errors
/// The first value out of range, located.
pub fn check_placement(
    src: &Source<'_>,
    cpus: &Spanned<Vec<usize>>,
    realtime_priority: &Spanned<u8>,
    busy_poll_us: &Spanned<u32>,
) -> Result<(), ConfigError> {
    let list = cpus.get_ref();
    if let Some(c) = list.iter().find(|&&c| c >= 1024) {
        return src.err(
            &cpus.span(),
            "dataplane.cpus",
            format!("CPU {c} is over 1023"),
        );
    }
    if let Some((_, c)) = list
        .iter()
        .enumerate()
        .find(|(i, c)| list[..*i].contains(c))
    {
        return src.err(
            &cpus.span(),
            "dataplane.cpus",
            format!("CPU {c} is listed twice"),
        );
    }
    check_priority(src, realtime_priority, "dataplane.realtime_priority")?;
    let busy = *busy_poll_us.get_ref();
    if busy > BUSY_POLL_MAX_US {
        return src.err(
            &busy_poll_us.span(),
            "dataplane.busy_poll_us",
            format!("{busy} is outside 0 (off) ..= {BUSY_POLL_MAX_US} (one second)"),
        );
    }
    if busy > 0 && *realtime_priority.get_ref() > 0 && list.is_empty() {
        return src.err(
            &busy_poll_us.span(),
            "dataplane.busy_poll_us",
            "polling at a real-time priority keeps every other thread off the cores it runs on; \
             give the data plane its own cores with `cpus`, or leave one of the two off",
        );
    }
    Ok(())
}

/// Checks a SCHED_FIFO priority, `key`: 0 (off) to 99.
///
/// # Errors
/// The value out of range, located.
pub fn check_priority(
    src: &Source<'_>,
    priority: &Spanned<u8>,
    key: &str,
) -> Result<(), ConfigError> {
    if *priority.get_ref() > 99 {
        return src.err(
            &priority.span(),
            key,
            format!(
                "{} is outside 0 (off) ..= 99 (SCHED_FIFO priorities)",
                priority.get_ref()
            ),
        );
    }
    Ok(())
}

/// Checks `[dns]`'s upstream resolvers (reached on the external side: not inside the overlay,
/// not unspecified or multicast) and TTL (at most a day).
///
/// # Errors
/// The first mistake, located.
pub fn check_dns(
    src: &Source<'_>,
    upstream: &[Spanned<IpAddr>],
    ttl: &Spanned<u32>,
    overlay: Ipv4Net,
) -> Result<Vec<IpAddr>, ConfigError> {
    if *ttl.get_ref() > 86_400 {
        return src.err(
            &ttl.span(),
            "dns.ttl",
            format!(
                "{} s is over a day; device names change when leases do",
                ttl.get_ref()
            ),
        );
    }
    let mut out = Vec::new();
    for (i, u) in upstream.iter().enumerate() {
        let ip = *u.get_ref();
        let inside = match ip {
            IpAddr::V4(v4) => overlay.contains(&v4),
            IpAddr::V6(_) => false,
        };
        if ip.is_unspecified() || ip.is_multicast() || inside {
            return src.err(
                &u.span(),
                &format!("dns.upstream[{i}]"),
                format!(
                    "{ip} cannot be an upstream resolver (the upstreams are reached on the external side, outside the overlay)"
                ),
            );
        }
        out.push(ip);
    }
    Ok(out)
}

/// Checks an inner MTU: 576 (the smallest datagram every IPv4 host must accept, RFC 791) to
/// 1480 (1500 minus the outer IPv4, UDP and tunnel headers).
///
/// # Errors
/// Out of range, located at `key`.
pub fn check_mtu(src: &Source<'_>, mtu: &Spanned<u16>, key: &str) -> Result<u16, ConfigError> {
    let v = *mtu.get_ref();
    if !(576..=1420 + 60).contains(&v) {
        return src.err(&mtu.span(), key, format!("{v} is outside 576..=1480"));
    }
    Ok(v)
}

// ---- test fixtures ------------------------------------------------------------------------

/// Fixtures for the binaries' configuration tests: certificate files as an operator would
/// have them. Not for production use.
pub mod testing {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    use cyphonic_crypto::{CertificateAuthority, IssueRequest, StaticKeypair};

    /// A directory with a CA and certificates ([`write_pki`]), removed on drop: where a
    /// binary's configuration tests write their files, relative paths and all.
    #[derive(Debug)]
    pub struct Fixture(PathBuf);

    impl Fixture {
        /// A new directory named after `label` with the PKI of `nodes`, valid around `now`.
        ///
        /// # Panics
        /// When the directory or a file cannot be written: test setup errors.
        #[allow(clippy::unwrap_used, clippy::missing_panics_doc)]
        pub fn new(label: &str, now: u64, nodes: &[Node<'_>]) -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "cyphonic-{label}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            write_pki(&dir, now, nodes);
            Self(dir)
        }

        /// The directory.
        pub fn path(&self) -> &Path {
            &self.0
        }

        /// Writes `text` to the file `name` in the directory; returns its path.
        ///
        /// # Panics
        /// When it cannot be written.
        #[allow(clippy::unwrap_used, clippy::missing_panics_doc)]
        pub fn write(&self, name: &str, text: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, text).unwrap();
            path
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Mistakes in the keys every tunnel end has, as [`assert_mistakes`] takes them: each
    /// binary's example file must refuse them all, with these messages.
    pub const SHARED_MISTAKES: &[(&str, &str, &str)] = &[
        (
            "address = \"192.0.2.10:7000\"",
            "address = \"cloud..example:7000\"",
            "key `cloud.address`: \"cloud..example:7000\": invalid name",
        ),
        (
            "address = \"192.0.2.10:7000\"",
            "address = [\"192.0.2.10:7000\", \"cloud.example.net\"]",
            "key `cloud.address`: \"cloud.example.net\" is not host:port",
        ),
        (
            "address = \"192.0.2.10:7000\"",
            "address = []",
            "key `cloud.address`: give at least one",
        ),
        (
            "level = \"info\"",
            "level = \"cyphonic_tunnel=loud\"",
            "key `log.level`: ",
        ),
        (
            "cpus = []",
            "cpus = [2, 2]",
            "key `dataplane.cpus`: CPU 2 is listed twice",
        ),
        (
            "cpus = []",
            "cpus = [1024]",
            "key `dataplane.cpus`: CPU 1024 is over 1023",
        ),
        (
            "realtime_priority = 0",
            "realtime_priority = 100",
            "key `dataplane.realtime_priority`: 100 is outside 0 (off) ..= 99",
        ),
        (
            "aqm_interval_ms = 100",
            "aqm_interval_ms = 0",
            "key `dataplane.aqm_interval_ms`: 0 is outside 1..=10000",
        ),
        (
            "aqm_target_us = 0",
            "aqm_target_us = 100000",
            "key `dataplane.aqm_target_us`: 100000 µs is not below the interval (100 ms)",
        ),
        (
            "busy_poll_us = 0",
            "busy_poll_us = 1000001",
            "key `dataplane.busy_poll_us`: 1000001 is outside 0 (off) ..= 1000000",
        ),
        (
            "batch_size = 32",
            "batch_size = 0",
            "key `dataplane.batch_size`: 0 is outside 1..=1024",
        ),
        (
            "batches_in_flight = 4096",
            "batches_in_flight = 16385",
            "key `dataplane.batches_in_flight`: 16385 is outside 1..=16384",
        ),
        (
            "in_flight_bytes = 16777216",
            "in_flight_bytes = 1000",
            "key `dataplane.in_flight_bytes`: 1000 is below 65536 (0: no bound)",
        ),
        (
            "in_flight_ms = 100",
            "in_flight_ms = 10001",
            "key `dataplane.in_flight_ms`: 10001 is outside 0..=10000",
        ),
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
            "buffers = 8192",
            "buffers = 10",
            "key `dataplane.buffers`: at least 256",
        ),
        (
            "danger_rekey_after_secs = 120",
            "danger_rekey_after_secs = 600",
            "key `dataplane.danger_rekey_after_secs`: 600 is outside 2 ..= 120 (shorter than the default only)",
        ),
        (
            "danger_rekey_after_messages = 1152921504606846976",
            "danger_rekey_after_messages = 100",
            "key `dataplane.danger_rekey_after_messages`: 100 is outside 10000 ..= 1152921504606846976 (fewer than the default only)",
        ),
        (
            "inner_mtu = 1420",
            "inner_mtu = 9000",
            "inner_mtu`: 9000 is outside 576..=1480",
        ),
        (
            "public_key = \"5b0f",
            "public_key = \"zz0f",
            "key `cloud.public_key`: expected the 64 hex digits",
        ),
    ];

    /// For each case `(from, to, expect)`: `example` with its first `from` replaced by `to`,
    /// written into `fixture` and read with `load`, fails; the error names the file and says
    /// `expect` (the line, the key, the message).
    ///
    /// # Panics
    /// When a case does not hold: the test fails, saying which.
    #[allow(clippy::missing_panics_doc)]
    pub fn assert_mistakes<C, I>(
        fixture: &Fixture,
        example: &str,
        cases: &[(&str, &str, &str)],
        load: impl Fn(&Path, u64) -> Result<(C, I), crate::ConfigError>,
        now: u64,
    ) {
        for (from, to, expect) in cases {
            assert!(example.contains(from), "the example lost {from:?}");
            let path = fixture.write("mistake.toml", &example.replacen(from, to, 1));
            let err = match load(&path, now) {
                Ok(_) => panic!("{from:?} -> {to:?} was accepted"),
                Err(e) => e.to_string(),
            };
            assert!(err.starts_with(&path.display().to_string()), "{err}");
            assert!(
                err.contains(expect),
                "{from:?} -> {to:?}\n  got:  {err}\n  want: {expect}"
            );
        }
    }

    /// The file type `T` accepts exactly the top-level `tables` (in order), and `example` sets
    /// every key of every table (`arrays` are written `[[...]]`): a new key without
    /// documentation in the example file `name` fails here.
    ///
    /// # Panics
    /// When it does not hold.
    #[allow(clippy::missing_panics_doc)]
    pub fn assert_documents_every_key<T: serde::de::DeserializeOwned>(
        example: &str,
        name: &str,
        arrays: &[&str],
        tables: &[&str],
    ) {
        let probe = |table: &str| probe(table, arrays);
        assert_eq!(crate::accepted_keys::<T>(&probe("")), tables);
        let missing = crate::undocumented_keys::<T>(example, probe);
        assert!(missing.is_empty(), "{name} does not show {missing:?}");
    }

    /// A file with the unknown key `__probe` in `table` (`""`: at the top), for
    /// [`crate::accepted_keys`] and [`crate::undocumented_keys`]: `arrays` are the tables
    /// written `[[...]]`, and `[cloud]` gets the keys it requires.
    pub fn probe(table: &str, arrays: &[&str]) -> String {
        match table {
            "" => "__probe = 1\n".to_owned(),
            "cloud" => {
                "[cloud]\naddress = \"192.0.2.1:1\"\npublic_key = \"\"\n__probe = 1\n".to_owned()
            }
            t if arrays.contains(&t) => format!("[[{t}]]\n__probe = 1\n"),
            t => format!("[{t}]\n__probe = 1\n"),
        }
    }

    /// One certificate to write: its name, its block, where (relative to the directory,
    /// without extension), and whether to write its private key too.
    #[derive(Debug, Clone, Copy)]
    pub struct Node<'a> {
        /// FQDN.
        pub name: &'a str,
        /// vIP block.
        pub block: &'a str,
        /// `<path>.crt` (and `<path>.key`).
        pub path: &'a str,
        /// Write the key as well.
        pub with_key: bool,
    }

    /// Writes into `dir` an overlay CA for `ovl.example` (`ca.crt`, an empty `revoked.txt`)
    /// and `nodes`' certificates, valid around `now`.
    ///
    /// # Panics
    /// When a file cannot be written or the CA refuses a node: test setup errors.
    #[allow(clippy::unwrap_used, clippy::missing_panics_doc)]
    pub fn write_pki(dir: &Path, now: u64, nodes: &[Node<'_>]) {
        let ca = CertificateAuthority::generate(
            "ovl.example",
            &["100.64.0.0/10".parse().unwrap()],
            now - 100,
            now + 10_000_000,
        )
        .unwrap();
        std::fs::write(dir.join("ca.crt"), ca.certificate().to_pem()).unwrap();
        std::fs::write(dir.join("revoked.txt"), "# none\n").unwrap();
        for n in nodes {
            let key = StaticKeypair::generate().unwrap();
            let cert = ca
                .issue(&IssueRequest {
                    name: n.name.into(),
                    vip_blocks: vec![n.block.parse().unwrap()],
                    public_key: key.public().0,
                    groups: vec![],
                    not_before: now - 100,
                    not_after: now + 1_000_000,
                })
                .unwrap();
            let crt = dir.join(format!("{}.crt", n.path));
            if let Some(parent) = crt.parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            std::fs::write(&crt, cert.to_pem()).unwrap();
            if n.with_key {
                std::fs::write(dir.join(format!("{}.key", n.path)), &*key.to_pem()).unwrap();
            }
        }
    }
}

// ---- documentation ------------------------------------------------------------------------

/// The keys serde accepts where `probe` (a file with one unknown key, `__probe`) puts it, as
/// serde lists them in its "unknown field" message.
pub fn accepted_keys<T: DeserializeOwned>(probe: &str) -> Vec<String> {
    let err = toml::from_str::<T>(probe)
        .err()
        .map(|e| e.message().to_owned())
        .unwrap_or_default();
    // "unknown field `__probe`, expected `x`", "... expected `x` or `y`",
    // "... expected one of `x`, `y`, `z`".
    let list = err.split(", expected ").nth(1).unwrap_or_default();
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// For the tests that keep the example files complete: every `table.key` a file of type `T`
/// accepts that `example` does not set. `probe(table)` writes a minimal file with the unknown
/// key `__probe` in `table` (`""`: at the top).
pub fn undocumented_keys<T: DeserializeOwned>(
    example: &str,
    probe: impl Fn(&str) -> String,
) -> Vec<String> {
    let Ok(example) = toml::from_str::<toml::Table>(example) else {
        return vec!["(the example does not parse)".into()];
    };
    let mut missing = Vec::new();
    for table in accepted_keys::<T>(&probe("")) {
        let present: Vec<String> = match example.get(&table) {
            None => {
                missing.push(table.clone());
                continue;
            }
            Some(toml::Value::Array(items)) => items
                .iter()
                .filter_map(toml::Value::as_table)
                .flat_map(|t| t.keys().cloned())
                .collect(),
            Some(toml::Value::Table(t)) => t.keys().cloned().collect(),
            // A plain top-level key, and it is there.
            Some(_) => continue,
        };
        let keys = accepted_keys::<T>(&probe(&table));
        missing.extend(
            keys.into_iter()
                .filter(|k| !present.contains(k))
                .map(|k| format!("{table}.{k}")),
        );
    }
    missing
}

// ---- locating ----------------------------------------------------------------------------

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
    use super::*;

    #[test]
    fn keys_are_found_under_their_tables() {
        let text = "top = 1\n[a]\nx = 2\n[[p]]\ny = 3\n[[p]]\ny = 4\n";
        for (needle, key) in [
            ("top", "top"),
            ("x = 2", "a.x"),
            ("y = 3", "p[0].y"),
            ("y = 4", "p[1].y"),
        ] {
            let at = text.find(needle).unwrap_or_default();
            assert_eq!(key_at(text, at).as_deref(), Some(key), "{needle}");
        }
        assert_eq!(line_of(text, text.find("y = 4").unwrap_or_default()), 7);
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct File {
        top: Option<u32>,
        table: Option<Table>,
        #[serde(default)]
        item: Vec<Table>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Table {
        x: Option<u32>,
        y: Option<u32>,
    }

    /// Busy polling at a real-time priority needs cores of its own; either alone is fine.
    #[test]
    fn busy_polling_at_a_realtime_priority_needs_cpus() {
        let text = "cpus = []\nrealtime_priority = 10\nbusy_poll_us = 50000\n";
        let src = Source {
            path: Path::new("t.toml"),
            text,
            now_secs: 0,
        };
        let at = |needle: &str| {
            let start = text.find(needle).unwrap_or_default();
            start..start + needle.len()
        };
        let cpus = |list: Vec<usize>| Spanned::new(at("cpus = []"), list);
        let rt = |p: u8| Spanned::new(at("realtime_priority = 10"), p);
        let busy = |us: u32| Spanned::new(at("busy_poll_us = 50000"), us);
        let err = check_placement(&src, &cpus(vec![]), &rt(10), &busy(50_000))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.starts_with("t.toml:3: key `dataplane.busy_poll_us`: polling at a real-time"),
            "{err}"
        );
        assert!(check_placement(&src, &cpus(vec![2, 3]), &rt(10), &busy(50_000)).is_ok());
        assert!(check_placement(&src, &cpus(vec![]), &rt(0), &busy(50_000)).is_ok());
        assert!(check_placement(&src, &cpus(vec![]), &rt(10), &busy(0)).is_ok());
        assert!(check_placement(&src, &cpus(vec![]), &rt(0), &busy(BUSY_POLL_MAX_US)).is_ok());
        assert!(check_placement(&src, &cpus(vec![]), &rt(0), &busy(BUSY_POLL_MAX_US + 1)).is_err());
    }

    #[test]
    fn the_queue_manager_is_off_by_default_and_takes_a_target_below_its_interval() {
        let src = Source {
            path: Path::new("t.toml"),
            text: "",
            now_secs: 0,
        };
        let v = |n: u32| Spanned::new(0..0, n);
        assert_eq!(
            check_aqm(
                &src,
                &defaults::aqm_target_us(),
                &defaults::aqm_interval_ms()
            )
            .ok(),
            Some(None),
            "off by default"
        );
        assert_eq!(
            check_aqm(&src, &v(5000), &v(100)).ok(),
            Some(Some(cyphonic_tunnel::Aqm {
                target: Duration::from_millis(5),
                interval: Duration::from_millis(100),
            }))
        );
        assert!(check_aqm(&src, &v(0), &v(100)).is_ok_and(|a| a.is_none()));
        assert!(check_aqm(&src, &v(99_999), &v(100)).is_ok());
        assert!(check_aqm(&src, &v(100_000), &v(100)).is_err());
        assert!(check_aqm(&src, &v(1000), &v(AQM_INTERVAL_MAX_MS + 1)).is_err());
    }

    #[test]
    fn keys_an_example_leaves_out_are_found() {
        let probe = |t: &str| match t {
            "" => "__probe = 1\n".to_owned(),
            "item" => "[[item]]\n__probe = 1\n".to_owned(),
            t => format!("[{t}]\n__probe = 1\n"),
        };
        let complete = "top = 1\n[table]\nx = 1\ny = 2\n[[item]]\nx = 1\n[[item]]\ny = 2\n";
        assert!(undocumented_keys::<File>(complete, probe).is_empty());
        let partial = "[table]\nx = 1\n[[item]]\ny = 2\n";
        assert_eq!(
            undocumented_keys::<File>(partial, probe),
            ["top", "table.y", "item.x"]
        );
    }
}

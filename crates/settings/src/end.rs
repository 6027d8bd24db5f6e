//! What every tunnel end's file has besides `[dataplane]`: in its own table (`[adapter]`,
//! `[node]`) the keys `listen`, `overlay`, `inner_mtu` and `status_socket`; the tables
//! `[identity]`, `[[peer]]`, `[cloud]` and `[metrics]`; and in `[dns]` the keys `enabled`,
//! `upstream` and `ttl`. Each is declared once, here ([`end_table!`](crate::end_table),
//! [`dns_table!`](crate::dns_table), [`config_file!`](crate::config_file)), and checked once,
//! into [`Common`]; a binary declares and checks only what is its own.
//!
//! Macros rather than serde's `flatten`: flattening loses toml's spans (errors could no longer
//! name the line) and defeats `deny_unknown_fields`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use cyphonic_session::Identity;
use cyphonic_tunnel::DataPlane;
use ipnet::Ipv4Net;
use toml::Spanned;

use crate::{
    Cloud, ConfigError, Peer, RawCloud, RawIdentity, RawLog, RawMetrics, RawPeer, Source,
    first_v4_block, overlay_domain, peers,
};

/// The shared keys of a binary's own table, as written (what [`end_table!`](crate::end_table)
/// declares gives them).
#[derive(Debug, Clone, Copy)]
pub struct EndKeys<'a> {
    /// The table's name (`adapter`, `node`), for error messages.
    pub table: &'static str,
    /// `listen`.
    pub listen: SocketAddr,
    /// `overlay`, and its dotted key.
    pub overlay: crate::Keyed<'a, Ipv4Net>,
    /// `inner_mtu`, and its dotted key.
    pub inner_mtu: crate::Keyed<'a, u16>,
    /// `status_socket`, or the binary's default.
    pub status_socket: &'a Path,
}

/// The shared keys of `[dns]` as written, each with its dotted key (what
/// [`dns_table!`](crate::dns_table) declares gives them).
#[derive(Debug, Clone, Copy)]
pub struct DnsKeys<'a> {
    /// `upstream`.
    pub upstream: (&'a [Spanned<IpAddr>], &'a str),
    /// `ttl`.
    pub ttl: crate::Keyed<'a, u32>,
}

/// The shared part of `[dns]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dns {
    /// Resolvers for names outside the overlay; none means such queries are refused.
    pub upstream: Vec<IpAddr>,
    /// TTL of the answers given, seconds.
    pub ttl: u32,
}

/// The default `listen`: every address, IPv4 and IPv6, port 51820.
pub const LISTEN: SocketAddr = SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 51820);

/// The default `overlay`: 100.64.0.0/10.
pub const OVERLAY: Ipv4Net = Ipv4Net::new_assert(std::net::Ipv4Addr::new(100, 64, 0, 0), 10);

/// The default `dns.ttl`, seconds (also the TTL of the answers built from the cloud's when
/// the DNS service is off).
pub const DNS_TTL: u32 = 60;

/// What every tunnel end is configured with, checked.
#[derive(Debug, Clone)]
pub struct Common {
    /// The file it came from.
    pub path: PathBuf,
    /// The tunnel's UDP address.
    pub listen: SocketAddr,
    /// Our certified IPv4 block (the first one of our certificate).
    pub block: Ipv4Net,
    /// The whole overlay.
    pub overlay: Ipv4Net,
    /// The overlay's domain (the name of the CA that issued our certificate).
    pub overlay_domain: String,
    /// The largest inner IP packet carried.
    pub inner_mtu: u16,
    /// Our IPv6 block and the overlay's IPv6 range ([`crate::ipv6_plan`]); `None`: this
    /// end has no IPv6 in the overlay.
    pub ipv6: Option<(ipnet::Ipv6Net, ipnet::Ipv6Net)>,
    /// The status socket.
    pub status_socket: PathBuf,
    /// The data plane.
    pub dataplane: DataPlane,
    /// Static peers.
    pub peers: Vec<Peer>,
    /// The control plane, if used.
    pub cloud: Option<Cloud>,
    /// Where the Prometheus endpoint listens; off without.
    pub metrics: Option<SocketAddr>,
    /// The DNS service's shared settings, unless switched off.
    pub dns: Option<Dns>,
    /// The log filter (`[log] level`), unless left to `RUST_LOG` or the default.
    pub log_level: Option<String>,
    /// Where our certificate is: a renewed one is written there.
    pub certificate_file: PathBuf,
    /// Where our CA bundle is: the issuing CA of a renewed certificate joins it.
    pub ca_file: PathBuf,
    /// Per-device policy from `[policy]`; without the table none (everything between
    /// certified addresses passes). Set by `with_policy` (declared by
    /// [`config_file!`](crate::config_file)) once the binary checked its devices.
    pub policy: Option<cyphonic_tunnel::PolicySettings>,
    /// The names the policy's rules may use (members, devices, groups), for the dry run.
    pub policy_names: cyphonic_filter::Directory,
    /// Rule 0 of every rule set this end enforces ([`crate::dns_rules`]): DNS to our DNS
    /// service and the static peers'.
    pub dns_rules: Vec<cyphonic_filter::Rule>,
}

impl Common {
    /// Checks the keys every tunnel end has and reads our identity.
    ///
    /// # Errors
    /// The first mistake, located.
    #[expect(
        clippy::too_many_arguments,
        reason = "one per shared table, called by config_file!"
    )]
    pub fn check(
        src: &Source<'_>,
        end: EndKeys<'_>,
        identity: &RawIdentity,
        raw_peers: &[RawPeer],
        cloud: Option<&RawCloud>,
        (metrics, log): (&RawMetrics, &RawLog),
        dataplane: DataPlane,
        dns: Option<DnsKeys<'_>>,
    ) -> Result<(Self, Identity), ConfigError> {
        let table = end.table;
        let files = identity.files(src, table);
        let (certificate_file, ca_file) = (files.certificate, files.ca);
        let identity = identity_and_block(src, identity, table)?;
        let (identity, block) = identity;
        let overlay = *end.overlay.0.get_ref();
        if !overlay.contains(&block) {
            return src.err(
                &end.overlay.0.span(),
                end.overlay.1,
                format!("{overlay} does not contain this {table}'s block {block}"),
            );
        }
        let inner_mtu = check_mtu(src, end.inner_mtu)?;
        let ipv6 = crate::ipv6_plan(&identity);
        // The kernel switches IPv6 off on a link whose MTU is below IPv6's minimum, and
        // IPv6 is never fragmented on the way.
        if ipv6.is_some() && inner_mtu < 1280 {
            return src.err(
                &end.inner_mtu.0.span(),
                end.inner_mtu.1,
                format!(
                    "{inner_mtu}: the certificate holds an IPv6 block, and IPv6 needs an inner MTU of 1280 at least"
                ),
            );
        }
        let peers = peers(src, raw_peers, &identity, block)?;
        let dns = dns
            .map(|keys| {
                check_dns(src, keys, overlay).map(|upstream| Dns {
                    upstream,
                    ttl: *keys.ttl.0.get_ref(),
                })
            })
            .transpose()?;
        let cloud = cloud.map(|c| c.check(src)).transpose()?;
        let metrics = metrics.check(src)?;
        let log_level = log.check(src)?;
        let common = Self {
            path: src.path.to_owned(),
            listen: end.listen,
            block,
            overlay,
            overlay_domain: overlay_domain(&identity),
            inner_mtu,
            ipv6,
            status_socket: src.resolve(end.status_socket),
            dataplane,
            peers,
            cloud,
            metrics,
            dns,
            log_level,
            certificate_file,
            ca_file,
            policy: None,
            policy_names: cyphonic_filter::Directory::new(),
            dns_rules: Vec::new(),
        };
        Ok((common, identity))
    }

    /// TTL of the DNS answers we give, seconds (`dns.ttl`, or its default when the DNS service
    /// is switched off: answers built from the cloud's still carry one).
    pub fn dns_ttl(&self) -> u32 {
        self.dns.as_ref().map_or(DNS_TTL, |d| d.ttl)
    }

    /// The keys that differ in `new` and take effect only at a restart (a reload keeps the
    /// running values): sockets, addresses, the data plane, the cloud, the DNS service's
    /// presence and TTL. What a reload applies is not among them: the trust (CAs and
    /// revocations), static peers, DNS upstreams, the log level, the policy.
    pub fn needs_restart(&self, new: &Self) -> Vec<&'static str> {
        let dns = |c: &Self| c.dns.as_ref().map(|d| d.ttl);
        crate::changed_keys([
            ("listen", self.listen != new.listen),
            ("identity.certificate (its block)", self.block != new.block),
            ("overlay", self.overlay != new.overlay),
            ("inner_mtu", self.inner_mtu != new.inner_mtu),
            ("status_socket", self.status_socket != new.status_socket),
            ("[dataplane]", self.dataplane != new.dataplane),
            ("[cloud]", self.cloud != new.cloud),
            ("[metrics]", self.metrics != new.metrics),
            ("dns.enabled, dns.ttl", dns(self) != dns(new)),
        ])
    }

    /// The static peers that are not revoked: those the peer table holds.
    pub fn active_peers(&self) -> impl Iterator<Item = &Peer> {
        self.peers.iter().filter(|p| !p.revoked)
    }
}

/// Our identity, and the block our certificate certifies.
fn identity_and_block(
    src: &Source<'_>,
    raw: &RawIdentity,
    end: &str,
) -> Result<(Identity, Ipv4Net), ConfigError> {
    let identity = raw.load(src, end)?;
    match first_v4_block(identity.certificate()) {
        Some(block) => Ok((identity, block)),
        None => src.err(
            &raw.certificate_span(),
            RawIdentity::certificate,
            "the certificate names no IPv4 vIP block",
        ),
    }
}

/// Declares a binary's own table (`[adapter]`, `[node]`) with [`table!`](crate::table): the
/// binary's keys, then the keys every tunnel end has in it (`listen`, `overlay`, `inner_mtu`,
/// `status_socket`, whose default the binary gives). `end(&self)` hands the shared keys to
/// [`Common::check`]. The calling crate needs `serde`.
#[macro_export]
macro_rules! end_table {
    (
        $(#[doc = $doc:literal])*
        struct $name:ident ($table:tt, status_socket = $socket:literal) {
            $( $(#[doc = $kdoc:literal])* $field:ident : $ty:ty $(= $default:expr)? ),* $(,)?
        }
    ) => {
        $crate::table! {
            $(#[doc = $doc])*
            struct $name in $table {
                $( $(#[doc = $kdoc])* $field : $ty $(= $default)?, )*
                /// UDP address of the tunnel. `"[::]:PORT"` takes IPv4 and IPv6 peers on one
                /// socket.
                listen: std::net::SocketAddr = $crate::LISTEN,
                /// The whole overlay: the destinations worth carrying into the tunnel. It must
                /// contain this end's certified block.
                overlay: $crate::__private::Spanned<$crate::__private::Ipv4Net> =
                    $crate::unwritten($crate::OVERLAY),
                /// The largest inner IP packet carried, bytes (576 to 1480). 1420 leaves room
                /// for an IPv6 underlay in 1500: 1420 + 32 (tunnel header and tag) + 8 (UDP) +
                /// 40 (IPv6).
                inner_mtu: $crate::__private::Spanned<u16> = $crate::unwritten(1420),
                /// Where the `status` command finds the running daemon (mode 0600).
                status_socket: std::path::PathBuf = std::path::PathBuf::from($socket),
            }
        }

        impl $name {
            /// The keys every tunnel end has in this table.
            fn end(&self) -> $crate::EndKeys<'_> {
                $crate::EndKeys {
                    table: $table,
                    listen: self.listen,
                    overlay: (&self.overlay, Self::overlay),
                    inner_mtu: (&self.inner_mtu, Self::inner_mtu),
                    status_socket: &self.status_socket,
                }
            }
        }
    };
}

/// Declares a binary's `[dns]` table with [`table!`](crate::table): `enabled`, the binary's
/// own keys (`/// doc` `name: Type = default`), `upstream` and `ttl`. `shared(&self)` hands
/// the shared keys to [`Common::check`] (`None` when switched off). The calling crate needs
/// `serde`.
#[macro_export]
macro_rules! dns_table {
    (
        $(#[doc = $doc:literal])*
        struct $name:ident {
            $( $(#[doc = $kdoc:literal])* $field:ident : $ty:ty = $default:expr ),* $(,)?
        }
    ) => {
        $crate::table! {
            $(#[doc = $doc])*
            struct $name in "dns" (optional) {
                /// The DNS service: it answers the names of this end's overlay (its devices'
                /// and its own), asks peers about theirs, and forwards other names to
                /// `upstream`.
                enabled: bool = true,
                $( $(#[doc = $kdoc])* $field: $ty = $default, )*
                /// Resolvers for names outside the overlay, reached from the external side.
                /// Empty: such queries are refused.
                upstream: Vec<$crate::__private::Spanned<std::net::IpAddr>> = Vec::new(),
                /// TTL of the answers given, seconds (at most 86400).
                ttl: $crate::__private::Spanned<u32> = $crate::unwritten($crate::DNS_TTL),
            }
        }

        impl $name {
            /// The shared keys, unless the service is switched off.
            fn shared(&self) -> Option<$crate::DnsKeys<'_>> {
                self.enabled.then_some($crate::DnsKeys {
                    upstream: (&self.upstream[..], Self::upstream),
                    ttl: (&self.ttl, Self::ttl),
                })
            }
        }
    };
}

/// Declares a binary's configuration file with [`table!`](crate::table): its own table
/// first, then `[identity]`, the binary's other tables, and the tables every tunnel end has:
/// `[dns]` and `[dataplane]` (declared by the binary as `RawDns` with
/// [`dns_table!`](crate::dns_table) and `RawDataplane` with
/// [`dataplane_table!`](crate::dataplane_table)), `[[peer]]`, `[cloud]`, `[metrics]`,
/// `[log]`, `[policy]`. `common(&self, src)` checks all the shared keys into a [`Common`] and
/// reads our identity. The calling crate needs `serde`.
#[macro_export]
macro_rules! config_file {
    (
        $(#[doc = $doc:literal])*
        struct $name:ident {
            $(#[doc = $own_doc:literal])* $own:ident : $own_ty:ty,
            $( $(#[doc = $kdoc:literal])* $field:ident : $ty:ty $(= $default:expr)? ),* $(,)?
        }
    ) => {
        $crate::table! {
            $(#[doc = $doc])*
            struct $name in "" {
                $(#[doc = $own_doc])* $own: $own_ty,
                /// Who this end is.
                identity: $crate::RawIdentity,
                $( $(#[doc = $kdoc])* $field : $ty $(= $default)?, )*
                /// The DNS service.
                dns: RawDns = RawDns::default(),
                /// The data plane.
                dataplane: RawDataplane = RawDataplane::default(),
                /// Static peers.
                peer: Vec<$crate::RawPeer> = Vec::new(),
                /// The control plane.
                cloud: Option<$crate::RawCloud> = None,
                /// The metrics endpoint.
                metrics: $crate::RawMetrics = $crate::RawMetrics::default(),
                /// The log.
                log: $crate::RawLog = $crate::RawLog::default(),
                /// Per-device policy.
                policy: Option<$crate::RawPolicy> = None,
            }
        }

        impl $name {
            /// `common` with `[policy]` checked and compiled: its rules may name `devices`
            /// (checked already) besides members and addresses; `dns` is our DNS service's
            /// address, if peers may ask it.
            fn with_policy(
                &self,
                src: &$crate::Source<'_>,
                mut common: $crate::Common,
                identity: &$crate::Identity,
                devices: &[$crate::Device],
                dns: Option<std::net::Ipv4Addr>,
            ) -> Result<$crate::Common, $crate::ConfigError> {
                let names = $crate::directory(identity, &common.peers, devices);
                let servers: Vec<std::net::Ipv4Addr> = dns
                    .into_iter()
                    .chain(common.active_peers().map(|p| p.dns))
                    .collect();
                common.dns_rules = $crate::dns_rules(common.overlay, &servers);
                match &self.policy {
                    Some(p) => {
                        let (policy, names) = p.check(src, names, common.overlay, &servers)?;
                        common.policy = Some(policy);
                        common.policy_names = names;
                    }
                    None => common.policy_names = names,
                }
                Ok(common)
            }

            /// The keys every tunnel end has, checked (but `[policy]`: see `with_policy`),
            /// and our identity.
            fn common(
                &self,
                src: &$crate::Source<'_>,
            ) -> Result<($crate::Common, $crate::Identity), $crate::ConfigError> {
                let dataplane = self.dataplane.shared(src)?;
                $crate::Common::check(
                    src,
                    self.$own.end(),
                    &self.identity,
                    &self.peer,
                    self.cloud.as_ref(),
                    (&self.metrics, &self.log),
                    dataplane,
                    self.dns.shared(),
                )
            }
        }
    };
}

/// Checks `[dns]`'s upstream resolvers (reached on the external side: not inside the overlay,
/// not unspecified or multicast) and TTL (at most a day).
///
/// # Errors
/// The first mistake, located.
pub fn check_dns(
    src: &Source<'_>,
    keys: DnsKeys<'_>,
    overlay: Ipv4Net,
) -> Result<Vec<IpAddr>, ConfigError> {
    let ((upstream, upstream_key), (ttl, ttl_key)) = (keys.upstream, keys.ttl);
    if *ttl.get_ref() > 86_400 {
        return src.err(
            &ttl.span(),
            ttl_key,
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
                &format!("{upstream_key}[{i}]"),
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
pub fn check_mtu(src: &Source<'_>, (mtu, key): crate::Keyed<'_, u16>) -> Result<u16, ConfigError> {
    let v = *mtu.get_ref();
    if !(576..=1420 + 60).contains(&v) {
        return src.err(&mtu.span(), key, format!("{v} is outside 576..=1480"));
    }
    Ok(v)
}

// ---- test fixtures ------------------------------------------------------------------------

//! The fleet as the operator sees it, one shape for the command line's JSON and the HTTP
//! API's (docs/protocol.md §8): a member's certificate with what it hosts, an enrollment
//! token without its secret.

use std::net::{Ipv4Addr, SocketAddr};

use cyphonic_crypto::Certificate;
use serde::Serialize;

use crate::admin::AdminError;
use crate::store::{Member, PairReport, Store, TokenRow};

/// A member's certificate as the fleet view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct MemberView {
    /// The name in its certificate.
    pub name: String,
    /// The certificate's fingerprint (hex).
    pub fingerprint: String,
    /// Whether a control session is open to it, on any instance.
    pub online: bool,
    /// When it last connected, registered, was probed or went offline (unix seconds).
    pub last_seen: u64,
    /// Its certificate's validity (unix seconds; 0 for an unreadable certificate).
    pub not_before: u64,
    /// The end of that validity.
    pub not_after: u64,
    /// Its policy groups.
    pub groups: Vec<String>,
    /// Its certified blocks.
    pub vip_blocks: Vec<String>,
    /// The endpoints it registered.
    #[schema(value_type = Vec<String>)]
    pub endpoints: Vec<SocketAddr>,
    /// The address its endpoint probes came from (its NAT's mapping).
    #[schema(value_type = Option<String>)]
    pub observed: Option<SocketAddr>,
    /// What its router said of a mapping of its tunnel port, as it registered it
    /// (docs/protocol.md §4, *Port mapping*).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub mapping: Option<cyphonic_control::Mapping>,
    /// The software and version it said it runs when it last connected.
    pub agent: Option<String>,
    /// The HA pair serving it, as its serving box last reported (docs/protocol.md §5).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub pair: Option<PairReport>,
    /// The names it hosts: its own and its devices'.
    pub names: Vec<Hosted>,
}

/// A name a member hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Hosted {
    /// The FQDN.
    pub name: String,
    /// None for a device with IPv6 only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub vip: Option<Ipv4Addr>,
    /// A fixed-address device's own address on its site's legacy subnet.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub legacy: Option<Ipv4Addr>,
    /// Its IPv6 address (its AAAA), if it registered one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub vip6: Option<std::net::Ipv6Addr>,
}

impl MemberView {
    /// The view of `m`.
    pub fn of(m: &Member) -> Self {
        let body = Certificate::from_pem(&m.client.certificate)
            .ok()
            .map(|c| c.body().clone());
        Self {
            name: m.client.name.clone(),
            fingerprint: m.client.fingerprint.clone(),
            online: m.client.online,
            last_seen: m.last_seen,
            not_before: body.as_ref().map_or(0, |b| b.not_before),
            not_after: body.as_ref().map_or(0, |b| b.not_after),
            groups: body.as_ref().map_or_else(Vec::new, |b| b.groups.clone()),
            vip_blocks: body.as_ref().map_or_else(Vec::new, |b| {
                b.vip_blocks.iter().map(ToString::to_string).collect()
            }),
            endpoints: m.client.endpoints.clone(),
            observed: m.client.observed,
            mapping: m.client.mapping.clone(),
            agent: m.agent.clone(),
            pair: m.pair.clone(),
            names: {
                let mut names: Vec<Hosted> = m
                    .names
                    .iter()
                    .map(|(name, vip)| (name, Some(*vip)))
                    // Devices with IPv6 only.
                    .chain(
                        m.names6
                            .keys()
                            .filter(|n| !m.names.iter().any(|(v4, _)| v4 == *n))
                            .map(|n| (n, None)),
                    )
                    .map(|(name, vip)| Hosted {
                        name: name.clone(),
                        vip,
                        legacy: m.legacy.get(name).copied(),
                        vip6: m.names6.get(name).copied(),
                    })
                    .collect();
                names.sort_by(|a, b| a.name.cmp(&b.name));
                names
            },
        }
    }
}

/// An enrollment token as lists show it (never its secret or hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct TokenView {
    /// Names the token (16 hex digits).
    pub id: String,
    /// The member's name the certificate will carry.
    pub name: String,
    /// Its vIP blocks.
    pub vip_blocks: Vec<String>,
    /// Its policy groups.
    pub groups: Vec<String>,
    /// The certificates' lifetime, seconds.
    pub lifetime: u64,
    /// `live`, `issued`, `used`, `revoked` or `expired`.
    pub state: &'static str,
    /// When it was made (unix seconds).
    pub created_at: u64,
    /// When it stops being accepted unused.
    pub expires_at: u64,
    /// When it was redeemed.
    pub used_at: Option<u64>,
    /// The fingerprint of the certificate it was redeemed for.
    pub used_by: Option<String>,
    /// When it was revoked.
    pub revoked_at: Option<u64>,
}

impl TokenView {
    /// The view of `t` at unix time `now`.
    pub fn of(t: TokenRow, now: u64) -> Self {
        Self {
            state: t.state(now),
            vip_blocks: t.blocks.iter().map(ToString::to_string).collect(),
            id: t.id,
            name: t.name,
            groups: t.groups,
            lifetime: t.lifetime,
            created_at: t.created_at,
            expires_at: t.expires_at,
            used_at: t.used_at,
            used_by: t.used_by,
            revoked_at: t.revoked_at,
        }
    }
}

/// The two ends of a flow as a dry run names them (`field`s `from` and `to`): each an
/// address, or a registered name (its vIP, or its IPv6 address when it has no vIP or the
/// other end is an IPv6 address), of one family.
///
/// # Errors
/// An end that is neither; ends of two families; the store.
pub async fn flow_ends(
    store: &Store,
    from: &str,
    to: &str,
) -> Result<(std::net::IpAddr, std::net::IpAddr), AdminError> {
    use std::net::IpAddr;
    let given = |t: &str| t.parse::<IpAddr>().ok();
    // A name takes the family of an address at the other end, else IPv4 where it has one.
    let want6 = given(from)
        .or_else(|| given(to))
        .is_some_and(|a| a.is_ipv6());
    let (src, dst) = (
        flow_end(store, from, "from", want6).await?,
        flow_end(store, to, "to", want6).await?,
    );
    if src.is_ipv6() != dst.is_ipv6() {
        return Err(AdminError::Invalid {
            field: "to",
            message: format!("{from} ({src}) and {to} ({dst}) are of two families"),
        });
    }
    Ok((src, dst))
}

/// One end of a flow (`field`): an address, or a registered name's address of the family
/// `want6` asks where it has one.
async fn flow_end(
    store: &Store,
    text: &str,
    field: &'static str,
    want6: bool,
) -> Result<std::net::IpAddr, AdminError> {
    use std::net::IpAddr;
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(ip);
    }
    let name = text.trim_end_matches('.').to_ascii_lowercase();
    let row = store
        .lookup(&name)
        .await?
        .ok_or_else(|| AdminError::Invalid {
            field,
            message: format!("`{text}` is not a registered name or an address"),
        })?;
    let v4 = row.vip.map(IpAddr::V4);
    let v6 = row.vip6.map(IpAddr::V6);
    (if want6 { v6.or(v4) } else { v4.or(v6) }).ok_or_else(|| AdminError::Invalid {
        field,
        message: format!("`{text}` has no address"),
    })
}

//! The protocols, on crab_nat (PCP, NAT-PMP) and igd-next (UPnP-IGD): ask, renew, give back.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU16;
use std::time::Duration;

use crab_nat::{InternetProtocol, PortMapping, PortMappingOptions, PortMappingType, TimeoutConfig};
use cyphonic_control::{MapProtocol, Mapping};
use igd_next::aio::Gateway;
use igd_next::aio::tokio::Tokio;
use igd_next::{AddAnyPortError, AddPortError, PortMappingProtocol, RequestError, SearchOptions};

use crate::plan::{LIFETIME, Outcome, Target};

/// How long PCP and NAT-PMP wait: 1 s, doubling, 3 retries, at most 4 s each (11 s in all).
const UDP_TIMEOUTS: TimeoutConfig = TimeoutConfig {
    initial_timeout: Duration::from_secs(1),
    max_retries: 3,
    max_retry_timeout: Some(Duration::from_secs(4)),
};
/// How long an SSDP search for an IGD waits.
const SEARCH: Duration = Duration::from_secs(3);
/// The description a UPnP mapping carries on the router's page.
const DESCRIPTION: &str = "cyphonic tunnel";

/// A mapping the router holds for us, as its protocol renews and removes it.
pub(crate) enum Held {
    /// PCP or NAT-PMP.
    Pcp(PortMapping),
    /// UPnP-IGD.
    Upnp {
        /// The router's control point.
        gateway: Gateway<Tokio>,
        /// The external port it maps.
        external: SocketAddr,
        /// The tunnel socket it forwards to.
        local: SocketAddr,
    },
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pcp(m) => write!(f, "{} port {}", m.mapping_type(), m.external_port()),
            Self::Upnp { external, .. } => write!(f, "UPnP-IGD {external}"),
        }
    }
}

/// A refusal's reason as registered: the router's words, printable, at most
/// [`Mapping::MAX_REASON`] characters.
pub(crate) fn reason(text: &str) -> String {
    let text = text.trim_start_matches("Server responded with code: ");
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(Mapping::MAX_REASON)
        .collect()
}

/// Asks the router of `target` for a mapping of `port`: PCP (NAT-PMP when the router speaks
/// only that), then UPnP-IGD. A mapping from either wins; otherwise a refusal from either;
/// otherwise no answer.
pub(crate) async fn map(target: &Target, port: NonZeroU16) -> (Outcome, Option<Held>) {
    let first = pcp(target, port).await;
    if first.1.is_some() {
        return first;
    }
    let second = upnp(target, port).await;
    if second.1.is_some() {
        return second;
    }
    match (first.0, second.0) {
        (refused @ Outcome::Refused { .. }, _) | (_, refused @ Outcome::Refused { .. }) => {
            (refused, None)
        }
        _ => (Outcome::NoAnswer, None),
    }
}

/// PCP, falling back to NAT-PMP (crab_nat).
async fn pcp(target: &Target, port: NonZeroU16) -> (Outcome, Option<Held>) {
    let options = PortMappingOptions {
        external_port: Some(port),
        lifetime_seconds: Some(LIFETIME),
        timeout_config: Some(UDP_TIMEOUTS),
    };
    let asked = PortMapping::new(
        target.gateway.into(),
        target.local,
        InternetProtocol::Udp,
        port,
        options,
    )
    .await;
    match asked {
        Ok(m) => match pcp_outcome(&m).await {
            Some(o) => (o, Some(Held::Pcp(m))),
            None => {
                tracing::info!(
                    "the router mapped a port by NAT-PMP but says no external address: given back"
                );
                remove(Held::Pcp(m)).await;
                (Outcome::NoAnswer, None)
            }
        },
        Err(e) => (pcp_failure(&e), None),
    }
}

/// A PCP or NAT-PMP mapping as an [`Outcome`]; NAT-PMP's external address is asked apart.
async fn pcp_outcome(m: &PortMapping) -> Option<Outcome> {
    let (protocol, ip) = match m.mapping_type() {
        PortMappingType::Pcp { external_ip, .. } => (MapProtocol::Pcp, external_ip),
        PortMappingType::NatPmp => (
            MapProtocol::NatPmp,
            IpAddr::V4(
                crab_nat::natpmp::external_address(m.gateway(), Some(UDP_TIMEOUTS))
                    .await
                    .ok()?,
            ),
        ),
    };
    Some(Outcome::Mapped {
        protocol,
        external: SocketAddr::new(ip, m.external_port().get()),
        lifetime: Duration::from_secs(u64::from(m.lifetime())),
    })
}

/// A PCP or NAT-PMP failure: a result code is a refusal; a socket error, a timeout or an
/// answer that is not the protocol, no answer.
fn pcp_failure(e: &crab_nat::MappingFailure) -> Outcome {
    use crab_nat::{MappingFailure, natpmp, pcp};
    let (protocol, answered) = match e {
        MappingFailure::Pcp(f) => (
            MapProtocol::Pcp,
            !matches!(
                f,
                pcp::Failure::Socket(_)
                    | pcp::Failure::Timeout
                    | pcp::Failure::Nonce
                    | pcp::Failure::InvalidResponse(_)
            ),
        ),
        MappingFailure::NatPmp(f) => (
            MapProtocol::NatPmp,
            !matches!(
                f,
                natpmp::Failure::Socket(_)
                    | natpmp::Failure::Timeout
                    | natpmp::Failure::InvalidResponse(_)
            ),
        ),
    };
    if !answered {
        tracing::debug!(error = %e, "no PCP or NAT-PMP answer from the router");
        return Outcome::NoAnswer;
    }
    let why = match e {
        MappingFailure::Pcp(f) => f.to_string(),
        MappingFailure::NatPmp(f) => f.to_string(),
    };
    Outcome::Refused {
        protocol,
        reason: reason(&why),
    }
}

/// UPnP-IGD (igd-next): an SSDP search from our address towards the router, then
/// `AddPortMapping` of the same port, or of any port when that one is taken.
async fn upnp(target: &Target, port: NonZeroU16) -> (Outcome, Option<Held>) {
    let mut options = SearchOptions::default();
    options.bind_addr = SocketAddr::new(target.local, 0);
    options.timeout = Some(SEARCH);
    options.single_search_timeout = Some(SEARCH);
    let gateway = match igd_next::aio::tokio::search_gateway(options).await {
        Ok(g) => g,
        Err(e) => {
            tracing::debug!(error = %e, "no UPnP-IGD answer");
            return (Outcome::NoAnswer, None);
        }
    };
    let local = SocketAddr::new(target.local, port.get());
    let refused = |why: String| Outcome::Refused {
        protocol: MapProtocol::Upnp,
        reason: reason(&why),
    };
    let external_port = match gateway
        .add_port(
            PortMappingProtocol::UDP,
            port.get(),
            local,
            LIFETIME,
            DESCRIPTION,
        )
        .await
    {
        Ok(()) => port.get(),
        Err(AddPortError::PortInUse) => match gateway
            .add_any_port(PortMappingProtocol::UDP, local, LIFETIME, DESCRIPTION)
            .await
        {
            Ok(p) => p,
            Err(AddAnyPortError::RequestError(e)) => return (upnp_failure(&e), None),
            Err(e) => return (refused(e.to_string()), None),
        },
        Err(AddPortError::RequestError(e)) => return (upnp_failure(&e), None),
        Err(e) => return (refused(e.to_string()), None),
    };
    let ip = match gateway.get_external_ip().await {
        Ok(ip) => ip,
        Err(e) => {
            tracing::info!(error = %e, "the router mapped a port by UPnP-IGD but says no external address: given back");
            let _ = gateway
                .remove_port(PortMappingProtocol::UDP, external_port)
                .await;
            return (Outcome::NoAnswer, None);
        }
    };
    let external = SocketAddr::new(ip, external_port);
    (
        Outcome::Mapped {
            protocol: MapProtocol::Upnp,
            external,
            lifetime: Duration::from_secs(u64::from(LIFETIME)),
        },
        Some(Held::Upnp {
            gateway,
            external,
            local,
        }),
    )
}

/// A UPnP request that failed: an error code the router sent is a refusal; the rest (HTTP,
/// a reply that does not parse), no answer.
fn upnp_failure(e: &RequestError) -> Outcome {
    match e {
        RequestError::ErrorCode(..) | RequestError::UnsupportedAction(_) => Outcome::Refused {
            protocol: MapProtocol::Upnp,
            reason: reason(&e.to_string()),
        },
        _ => {
            tracing::debug!(error = %e, "a UPnP-IGD request failed");
            Outcome::NoAnswer
        }
    }
}

/// Renews `held`; the outcome, and the mapping still held if any.
pub(crate) async fn renew(held: Held) -> (Outcome, Option<Held>) {
    match held {
        Held::Pcp(mut m) => match m.renew().await {
            Ok(()) => match pcp_outcome(&m).await {
                Some(o) => (o, Some(Held::Pcp(m))),
                None => (Outcome::NoAnswer, Some(Held::Pcp(m))),
            },
            Err(e) => match pcp_failure(&e) {
                // Unanswered: the mapping may still stand on the router.
                Outcome::NoAnswer => (Outcome::NoAnswer, Some(Held::Pcp(m))),
                refused => (refused, None),
            },
        },
        Held::Upnp {
            gateway,
            external,
            local,
        } => {
            let renewed = gateway
                .add_port(
                    PortMappingProtocol::UDP,
                    external.port(),
                    local,
                    LIFETIME,
                    DESCRIPTION,
                )
                .await;
            let outcome = match renewed {
                Ok(()) => Outcome::Mapped {
                    protocol: MapProtocol::Upnp,
                    external,
                    lifetime: Duration::from_secs(u64::from(LIFETIME)),
                },
                Err(AddPortError::RequestError(e)) => upnp_failure(&e),
                Err(e) => Outcome::Refused {
                    protocol: MapProtocol::Upnp,
                    reason: reason(&e.to_string()),
                },
            };
            let still = matches!(outcome, Outcome::Mapped { .. } | Outcome::NoAnswer);
            (
                outcome,
                still.then_some(Held::Upnp {
                    gateway,
                    external,
                    local,
                }),
            )
        }
    }
}

/// Gives `held` back to the router (best effort: a router that does not answer lets it
/// expire).
pub(crate) async fn remove(held: Held) {
    let what = format!("{held:?}");
    let done = match held {
        Held::Pcp(m) => m.try_drop().await.map_err(|(e, _)| e.to_string()),
        Held::Upnp {
            gateway, external, ..
        } => gateway
            .remove_port(PortMappingProtocol::UDP, external.port())
            .await
            .map_err(|e| e.to_string()),
    };
    match done {
        Ok(()) => tracing::info!(mapping = %what, "port mapping removed from the router"),
        Err(e) => {
            tracing::warn!(mapping = %what, error = %e, "the router did not remove the port mapping: it expires on its own");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal is registered short and printable, without crab_nat's preamble.
    #[test]
    fn a_reason_is_short_and_printable() {
        assert_eq!(
            reason("Server responded with code: Not authorized"),
            "Not authorized"
        );
        assert_eq!(reason("a\nb\u{7}c"), "a b c");
        let long = reason(&"x".repeat(300));
        assert_eq!(long.chars().count(), Mapping::MAX_REASON);
        for r in [reason("a\nb"), long] {
            assert!(
                Mapping::Refused {
                    protocol: MapProtocol::Upnp,
                    reason: r
                }
                .is_well_formed()
            );
        }
    }

    /// Result codes are refusals; silence and garbage are no answer.
    #[test]
    fn pcp_result_codes_are_refusals_and_silence_is_no_answer() {
        use crab_nat::{MappingFailure, natpmp, pcp};
        assert_eq!(
            pcp_failure(&MappingFailure::Pcp(pcp::Failure::Timeout)),
            Outcome::NoAnswer
        );
        assert_eq!(
            pcp_failure(&MappingFailure::NatPmp(natpmp::Failure::Socket(
                std::io::ErrorKind::ConnectionRefused.into()
            ))),
            Outcome::NoAnswer
        );
        assert_eq!(
            pcp_failure(&MappingFailure::Pcp(pcp::Failure::NotAuthorized(60))),
            Outcome::Refused {
                protocol: MapProtocol::Pcp,
                reason: "Not authorized".into()
            }
        );
        assert!(matches!(
            pcp_failure(&MappingFailure::NatPmp(natpmp::Failure::OutOfResources)),
            Outcome::Refused {
                protocol: MapProtocol::NatPmp,
                ..
            }
        ));
        assert!(matches!(
            upnp_failure(&RequestError::ErrorCode(
                718,
                "ConflictInMappingEntry".into()
            )),
            Outcome::Refused {
                protocol: MapProtocol::Upnp,
                ..
            }
        ));
        assert_eq!(
            upnp_failure(&RequestError::InvalidResponse("<html>".into())),
            Outcome::NoAnswer
        );
    }
}

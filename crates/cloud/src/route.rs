//! Route choice: a pair talks directly when it can, through the relay when it
//! cannot. What the cloud knows of each side decides: the IP versions of its endpoints, and
//! how its NAT maps the tunnel socket, which the two endpoint probes show.

use std::net::SocketAddr;

use cyphonic_control::{Mapping, RelayReason};

use crate::store::ClientRow;

/// How a client's tunnel socket reaches the cloud, as its endpoint probes show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nat {
    /// No probe seen yet.
    Unknown,
    /// No NAT: the probes came from an address the client registered as its own.
    Public,
    /// Behind a NAT whose router maps a port to the tunnel socket, at the address the probes
    /// come from: reachable there from anywhere, as without NAT.
    Mapped,
    /// One mapping for every destination (the probes to both ports came from the same
    /// address): hole punching works.
    Cone,
    /// A new mapping per destination: what the peer is told is not what it will see.
    Symmetric,
}

impl Nat {
    /// What the probes recorded in `row` show.
    pub fn of(row: &ClientRow) -> Self {
        let Some(observed) = row.observed else {
            return Self::Unknown;
        };
        if row.endpoints.contains(&observed) {
            return Self::Public;
        }
        if row.mapped().is_some() {
            return Self::Mapped;
        }
        match row.observed_alt {
            Some(alt) if alt != observed => Self::Symmetric,
            _ => Self::Cone,
        }
    }

    /// In words, for logs.
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Public => "no NAT",
            Self::Mapped => "NAT with a port mapping",
            Self::Cone => "cone NAT",
            Self::Symmetric => "symmetric NAT",
        }
    }
}

/// Whether `endpoints` has an address of each IP version: (IPv4, IPv6).
fn versions(endpoints: &[SocketAddr]) -> (bool, bool) {
    (
        endpoints.iter().any(SocketAddr::is_ipv4),
        endpoints.iter().any(SocketAddr::is_ipv6),
    )
}

/// Why the pair `a`, `b` must be relayed, or `None` when the direct path should work.
pub fn choose(a: &ClientRow, b: &ClientRow) -> Option<RelayReason> {
    let (a_reach, b_reach) = (a.reach(), b.reach());
    let (a4, a6) = versions(&a_reach);
    let (b4, b6) = versions(&b_reach);
    let common = (a4 && b4) || (a6 && b6);
    if !a_reach.is_empty() && !b_reach.is_empty() && !common {
        return Some(RelayReason::NoCommonIpVersion);
    }
    // A symmetric NAT passes only packets from where it sent to, on a port the other side
    // cannot know in advance: only a side reachable from anywhere (no NAT, or a port
    // mapping) can answer it.
    let (na, nb) = (Nat::of(a), Nat::of(b));
    let answers = |n: Nat| matches!(n, Nat::Public | Nat::Mapped);
    let stuck = |n: Nat, other: Nat| n == Nat::Symmetric && !answers(other);
    let refused = |row: &ClientRow, n: Nat| {
        n == Nat::Symmetric && matches!(row.mapping, Some(Mapping::Refused { .. }))
    };
    if stuck(na, nb) || stuck(nb, na) {
        return Some(if refused(a, na) || refused(b, nb) {
            RelayReason::MappingRefused
        } else {
            RelayReason::SymmetricNat
        });
    }
    None
}

/// Why the pair must be relayed when one side asks for it (its direct handshakes found no
/// path): what the probes show by now, if they explain it (a side's second probe may have come
/// after the first question), or the failed handshakes.
pub fn why_relay_was_asked(a: &ClientRow, b: &ClientRow) -> RelayReason {
    choose(a, b).unwrap_or(RelayReason::NoDirectHandshake)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn row(endpoints: &[&str], observed: Option<&str>, alt: Option<&str>) -> ClientRow {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        ClientRow {
            fingerprint: "fp".into(),
            name: "n".into(),
            certificate: String::new(),
            endpoints: endpoints.iter().map(|s| a(s)).collect(),
            observed: observed.map(a),
            observed_alt: alt.map(a),
            mapping: None,
            tunnel: None,
            online: true,
        }
    }

    fn with(mut r: ClientRow, mapping: Mapping) -> ClientRow {
        r.mapping = Some(mapping);
        r
    }
    fn mapped_at(endpoint: &str) -> Mapping {
        Mapping::Mapped {
            protocol: cyphonic_control::MapProtocol::Pcp,
            endpoint: endpoint.parse().unwrap(),
        }
    }
    fn refused() -> Mapping {
        Mapping::Refused {
            protocol: cyphonic_control::MapProtocol::Upnp,
            reason: "not authorized".into(),
        }
    }

    fn public4() -> ClientRow {
        row(&["198.51.100.2:51820"], Some("198.51.100.2:51820"), None)
    }
    fn cone() -> ClientRow {
        row(
            &["192.0.2.130:51820"],
            Some("203.0.113.2:51820"),
            Some("203.0.113.2:51820"),
        )
    }
    fn symmetric() -> ClientRow {
        row(
            &["192.0.2.130:51820"],
            Some("203.0.113.2:40001"),
            Some("203.0.113.2:52017"),
        )
    }
    fn v6_only() -> ClientRow {
        row(
            &["[fd00:203::2]:51820"],
            Some("[fd00:203::2]:51820"),
            Some("[fd00:203::2]:51820"),
        )
    }

    #[test]
    fn nat_kinds_from_probes() {
        for (r, kind) in [
            (row(&[], None, None), Nat::Unknown),
            (public4(), Nat::Public),
            (cone(), Nat::Cone),
            (symmetric(), Nat::Symmetric),
            // Only one probe arrived so far: assume the best, the fallback covers the rest.
            (
                row(&["192.0.2.130:51820"], Some("203.0.113.2:4000"), None),
                Nat::Cone,
            ),
        ] {
            assert_eq!(Nat::of(&r), kind, "{r:?}");
        }
    }

    #[test]
    fn relayed_only_where_the_direct_path_cannot_work() {
        use RelayReason::{NoCommonIpVersion, SymmetricNat};
        let dual = row(
            &["198.51.100.2:51820", "[fd00:198::2]:51820"],
            Some("198.51.100.2:51820"),
            None,
        );
        for (a, b, expect) in [
            (public4(), public4(), None),
            (public4(), cone(), None),
            (cone(), cone(), None),
            // A public side answers a symmetric NAT from wherever its packets come.
            (public4(), symmetric(), None),
            (symmetric(), public4(), None),
            (cone(), symmetric(), Some(SymmetricNat)),
            (symmetric(), cone(), Some(SymmetricNat)),
            (symmetric(), symmetric(), Some(SymmetricNat)),
            (public4(), v6_only(), Some(NoCommonIpVersion)),
            (v6_only(), cone(), Some(NoCommonIpVersion)),
            (dual.clone(), v6_only(), None),
            (dual, public4(), None),
            // Nothing known of a side yet: try directly.
            (row(&[], None, None), public4(), None),
        ] {
            assert_eq!(choose(&a, &b), expect, "{a:?}\n{b:?}");
        }
    }

    /// A side whose router maps its tunnel port at the address its probes come from answers a
    /// symmetric NAT as a side without NAT does, and is reached there first; a mapping at
    /// another address counts for nothing; a refusal names itself where the pair is relayed.
    #[test]
    fn a_port_mapping_makes_a_side_reachable_and_a_refusal_names_itself() {
        use RelayReason::{MappingRefused, SymmetricNat};
        let mapped = with(symmetric(), mapped_at("203.0.113.2:51820"));
        assert_eq!(Nat::of(&mapped), Nat::Mapped);
        assert_eq!(
            mapped.reach(),
            [
                "203.0.113.2:51820",
                "203.0.113.2:40001",
                "192.0.2.130:51820"
            ]
            .map(|s| s.parse::<SocketAddr>().unwrap())
        );
        // A mapping the router says is elsewhere (behind another NAT, or a lie).
        let elsewhere = with(symmetric(), mapped_at("198.51.100.77:51820"));
        assert_eq!(Nat::of(&elsewhere), Nat::Symmetric);
        assert_eq!(elsewhere.reach()[0], "203.0.113.2:40001".parse().unwrap());
        let refused_sym = with(symmetric(), refused());
        for (a, b, expect) in [
            (mapped.clone(), symmetric(), None),
            (symmetric(), mapped.clone(), None),
            (mapped.clone(), mapped.clone(), None),
            (mapped.clone(), cone(), None),
            (elsewhere.clone(), symmetric(), Some(SymmetricNat)),
            (refused_sym.clone(), symmetric(), Some(MappingRefused)),
            (symmetric(), refused_sym.clone(), Some(MappingRefused)),
            (cone(), refused_sym.clone(), Some(MappingRefused)),
            // A refusal on a side that is not the trouble: the symmetric side had no router.
            (with(cone(), refused()), symmetric(), Some(SymmetricNat)),
            (refused_sym.clone(), public4(), None),
            (refused_sym, mapped, None),
        ] {
            assert_eq!(choose(&a, &b), expect, "{a:?}\n{b:?}");
        }
    }

    #[test]
    fn a_relay_asked_for_names_what_the_probes_show_by_then() {
        use RelayReason::{NoDirectHandshake, SymmetricNat};
        assert_eq!(why_relay_was_asked(&cone(), &cone()), NoDirectHandshake);
        assert_eq!(
            why_relay_was_asked(&public4(), &symmetric()),
            NoDirectHandshake
        );
        assert_eq!(why_relay_was_asked(&cone(), &symmetric()), SymmetricNat);
    }
}

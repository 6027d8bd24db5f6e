//! The DHCP pool across the pair (docs/protocol.md §5, *Split brain*): which half of it is
//! this box's (told the DHCP server through [`super::PairLink`]), and the bindings a box made
//! while the two were apart, which it offers the serving box once it stands by
//! ([`Offer`]).

use std::path::{Path, PathBuf};

use cyphonic_telemetry::files::{self, Access};
use cyphonic_vip::file::Table;
use cyphonic_vip::{Dhcp6Config, DhcpConfig, Half, Server, Server6, Share};

use crate::config::Mac;

/// The file in the state directory that keeps the other box's NIC MAC across starts.
const OTHER_FILE: &str = "ha-other";

/// This box's share of the pool: none while the other box was never known; its own half
/// first while the two are in contact; its own half only while they are not.
pub(super) const fn share(lower: Option<bool>, in_contact: bool) -> Share {
    let Some(lower) = lower else {
        return Share::Whole;
    };
    let half = if lower { Half::Lower } else { Half::Upper };
    if in_contact {
        Share::Prefer(half)
    } else {
        Share::Only(half)
    }
}

/// For the log and the status document.
pub(super) const fn describe(share: Share) -> &'static str {
    match share {
        Share::Whole => "whole pool",
        Share::Prefer(Half::Lower) => "lower half first",
        Share::Prefer(Half::Upper) => "upper half first",
        Share::Only(Half::Lower) => "lower half only",
        Share::Only(Half::Upper) => "upper half only",
    }
}

/// The other box's NIC MAC as kept in `state_dir`, if a readable one is there.
pub(super) fn load_other(state_dir: &Path) -> Option<[u8; 6]> {
    let text = std::fs::read_to_string(other_file(state_dir)).ok()?;
    match text.trim().parse::<Mac>() {
        Ok(mac) => Some(mac.0),
        Err(e) => {
            tracing::warn!(error = %e, "HA: the other box's MAC kept in the state directory does not read: learned again from its heartbeats");
            None
        }
    }
}

/// Keeps the other box's NIC MAC in `state_dir`, atomically.
pub(super) fn save_other(state_dir: &Path, mac: [u8; 6]) {
    let path = other_file(state_dir);
    if let Err(e) = files::replace(&path, format!("{}\n", Mac(mac)), Access::Secret) {
        tracing::warn!(file = %path.display(), error = %e, "HA: cannot keep the other box's MAC: after a restart, the pool's halves wait until it is heard");
    }
}

fn other_file(state_dir: &Path) -> PathBuf {
    state_dir.join(OTHER_FILE)
}

/// The bindings of this box's lease file, as it starts standing by, that the serving box's
/// table lacks: those it made while serving apart from the other (a split brain), of both
/// families. It offers them with every table it receives until that table holds them, and
/// keeps the union, so that no device's address is lost whichever box serves next.
#[derive(Debug)]
pub(super) struct Offer {
    /// Every segment's DHCP scope, the untagged one first (none without a DHCP server).
    scopes: Vec<DhcpConfig>,
    /// Every segment's DHCPv6 server, the untagged one's first.
    scopes6: Vec<Dhcp6Config>,
    /// Our active bindings.
    ours: Table,
}

impl Offer {
    /// Our active bindings at unix time `now`, out of `saved`, for the DHCP `scopes` and
    /// the DHCPv6 `scopes6` (every segment's, the untagged one first; no DHCP scope: nothing
    /// to offer).
    pub(super) fn new(
        scopes: Vec<DhcpConfig>,
        scopes6: Vec<Dhcp6Config>,
        saved: Table,
        now: u64,
    ) -> Self {
        let ours = if scopes.is_empty() {
            Table::default()
        } else {
            Table {
                peers: Vec::new(),
                leases: saved
                    .leases
                    .into_iter()
                    .filter(|l| l.active && l.expires > now)
                    .collect(),
                leases6: saved
                    .leases6
                    .into_iter()
                    .filter(|l| l.active && l.expires > now)
                    .collect(),
            }
        };
        Self {
            scopes,
            scopes6,
            ours,
        }
    }

    /// The serving box's `table` came: what to keep (the union, or `table` itself once it
    /// holds all ours), and our bindings to send it when it lacks some.
    pub(super) fn against(&mut self, table: Vec<u8>, now: u64) -> (Vec<u8>, Option<Vec<u8>>) {
        if self.scopes.is_empty() || (self.ours.leases.is_empty() && self.ours.leases6.is_empty()) {
            return (table, None);
        }
        let Ok(theirs) = cyphonic_vip::file::decode(&table) else {
            return (table, None);
        };
        let Some((union, taken, clashed)) = self.union(theirs, now) else {
            return (table, None);
        };
        if taken == 0 {
            if clashed > 0 {
                tracing::warn!(
                    clashed,
                    "HA: bindings this box made apart from the other name addresses the serving box gave to other devices: those devices get new addresses at their next renewal"
                );
            }
            tracing::info!("HA: the serving box holds every binding this box made apart from it");
            self.ours = Table::default();
            return (table, None);
        }
        tracing::info!(
            missing = taken,
            "HA: the serving box lacks bindings this box made apart from it: offering them"
        );
        let ours = cyphonic_vip::file::encode(&self.ours, 0).ok();
        let kept = cyphonic_vip::file::encode(&union, 0).unwrap_or(table);
        (kept, ours)
    }

    /// `theirs` with ours merged in, scope by scope as the DHCP servers keep them (by
    /// address), and how many of ours came in and clashed; None when a scope's server does
    /// not start.
    fn union(&self, theirs: Table, now: u64) -> Option<(Table, usize, usize)> {
        let (mut taken, mut clashed) = (0, 0);
        // The serving box's cloud peers are the ones in use.
        let mut union = Table {
            peers: theirs.peers,
            ..Table::default()
        };
        let blocks = || self.scopes.iter().map(|c| c.block);
        let ours = crate::dhcp::split(self.ours.leases.clone(), blocks());
        for ((cfg, theirs), ours) in self
            .scopes
            .iter()
            .zip(crate::dhcp::split(theirs.leases, blocks()))
            .zip(ours)
        {
            let mut server = Server::new(cfg.clone(), theirs, now).ok()?;
            let (t, c) = server.merge(ours, now);
            (taken, clashed) = (taken + t, clashed + c);
            union.leases.extend(server.leases());
        }
        union.leases.sort_by_key(|l| (u32::from(l.ip), l.mac));
        let prefixes = || self.scopes6.iter().map(|c| c.prefix);
        let ours6 = crate::dhcp::split6(self.ours.leases6.clone(), prefixes());
        for ((cfg, theirs), ours) in self
            .scopes6
            .iter()
            .zip(crate::dhcp::split6(theirs.leases6, prefixes()))
            .zip(ours6)
        {
            let mut server = Server6::new(cfg.clone(), theirs, now).ok()?;
            let (t, c) = server.merge(ours, now);
            (taken, clashed) = (taken + t, clashed + c);
            union.leases6.extend(server.leases());
        }
        Some((union, taken, clashed))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::net::Ipv4Addr;

    use cyphonic_vip::{Lease, Lease6};

    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn scope() -> DhcpConfig {
        DhcpConfig {
            server: Ipv4Addr::new(100, 64, 1, 1),
            block: "100.64.1.0/24".parse().unwrap(),
            pool: (Ipv4Addr::new(100, 64, 1, 2), Ipv4Addr::new(100, 64, 1, 254)),
            lease_secs: 3600,
            mtu: 1420,
            domain: "gw1.ovl.example".into(),
            reservations: vec![],
            new_lease_share: 1.0,
            new_lease_window_secs: 60,
        }
    }

    fn scope6() -> Dhcp6Config {
        let prefix = "fd7a:0:1:100::/64".parse().unwrap();
        Dhcp6Config {
            prefix,
            pool: Dhcp6Config::default_pool(prefix),
            lease_secs: 3600,
            server_mac: [2, 0, 0, 0, 0, 1],
            dns: None,
            domain: "gw1.ovl.example".into(),
            reservations: vec![],
            new_lease_share: 1.0,
            new_lease_window_secs: 60,
        }
    }

    fn v4(n: u8) -> Lease {
        Lease {
            mac: [2, 0, 0, 0, 4, n],
            ip: Ipv4Addr::new(100, 64, 1, n),
            hostname: None,
            client_id: None,
            expires: NOW + 600,
            active: true,
        }
    }

    fn v6(n: u8) -> Lease6 {
        Lease6 {
            duid: vec![0, 4, n],
            iaid: 1,
            mac: [2, 0, 0, 0, 6, n],
            ip: format!("fd7a:0:1:100::1{n:03x}").parse().unwrap(),
            hostname: None,
            expires: NOW + 600,
            active: true,
        }
    }

    fn file(leases: Vec<Lease>, leases6: Vec<Lease6>) -> Vec<u8> {
        cyphonic_vip::file::encode(
            &Table {
                leases,
                leases6,
                peers: vec!["ab".repeat(32)],
            },
            0,
        )
        .unwrap()
    }

    /// A box that bound devices of both families apart from the serving box offers them
    /// until the serving box's table holds them, and keeps the union meanwhile; a binding
    /// made apart over IPv6 alone is offered too.
    #[test]
    fn bindings_made_apart_are_offered_until_the_serving_box_holds_them() {
        let saved = Table {
            leases: vec![v4(10)],
            leases6: vec![v6(1), v6(2)],
            peers: Vec::new(),
        };
        let mut offer = Offer::new(vec![scope()], vec![scope6()], saved, NOW);
        // The serving box knows our IPv4 device and one of our IPv6 ones, and a device of
        // its own.
        let theirs = file(vec![v4(10), v4(20)], vec![v6(1), v6(3)]);
        let (kept, sent) = offer.against(theirs, NOW);
        let kept = cyphonic_vip::file::decode(&kept).unwrap();
        let mut ips6: Vec<String> = kept.leases6.iter().map(|l| l.ip.to_string()).collect();
        ips6.sort();
        assert_eq!(
            ips6,
            [
                "fd7a:0:1:100::1001",
                "fd7a:0:1:100::1002",
                "fd7a:0:1:100::1003"
            ]
        );
        assert_eq!(kept.leases.len(), 2);
        assert_eq!(
            kept.peers,
            ["ab".repeat(32)],
            "the serving box's cloud peers kept"
        );
        let sent = cyphonic_vip::file::decode(&sent.expect("an offer")).unwrap();
        assert_eq!(sent.leases6.len(), 2);
        // Once it holds them all, nothing more is offered and its table is kept as sent.
        let whole = file(vec![v4(10), v4(20)], vec![v6(1), v6(2), v6(3)]);
        let (kept, sent) = offer.against(whole.clone(), NOW);
        assert_eq!((kept, sent), (whole.clone(), None));
        let (_, sent) = offer.against(file(vec![], vec![]), NOW);
        assert_eq!(sent, None, "offered until held, then forgotten");
    }
}

//! The DHCP pool across the pair (docs/protocol.md §5, *Split brain*): which half of it is
//! this box's (told the DHCP server through [`super::PairLink`]), and the bindings a box made
//! while the two were apart, which it offers the serving box once it stands by
//! ([`Offer`]).

use std::path::{Path, PathBuf};

use cyphonic_telemetry::files::{self, Access};
use cyphonic_vip::{DhcpConfig, Half, Lease, Server, Share};

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
/// table lacks: those it made while serving apart from the other (a split brain). It offers
/// them with every table it receives until that table holds them, and keeps the union, so
/// that no device's address is lost whichever box serves next.
#[derive(Debug)]
pub(super) struct Offer {
    /// Every segment's DHCP scope, the untagged one first (none without a DHCP server).
    scopes: Vec<DhcpConfig>,
    leases: Vec<Lease>,
}

impl Offer {
    /// Our active bindings at unix time `now`, out of `saved`, for the DHCP `scopes` (every
    /// segment's, the untagged one first; none: nothing to offer).
    pub(super) fn new(scopes: Vec<DhcpConfig>, saved: Vec<Lease>, now: u64) -> Self {
        let leases = if scopes.is_empty() {
            Vec::new()
        } else {
            saved
                .into_iter()
                .filter(|l| l.active && l.expires > now)
                .collect()
        };
        Self { scopes, leases }
    }

    /// The serving box's `table` came: what to keep (the union, or `table` itself once it
    /// holds all ours), and our bindings to send it when it lacks some.
    pub(super) fn against(&mut self, table: Vec<u8>, now: u64) -> (Vec<u8>, Option<Vec<u8>>) {
        if self.scopes.is_empty() || self.leases.is_empty() {
            return (table, None);
        }
        let Ok(cyphonic_vip::file::Table {
            leases: theirs,
            leases6,
        }) = cyphonic_vip::file::decode(&table)
        else {
            return (table, None);
        };
        // Scope by scope, as the DHCP server keeps them (by address).
        let blocks = || self.scopes.iter().map(|c| c.block);
        let ours = crate::dhcp::split(self.leases.clone(), blocks());
        let mut union = Vec::new();
        let (mut taken, mut clashed) = (0, 0);
        for ((cfg, theirs), ours) in self
            .scopes
            .iter()
            .zip(crate::dhcp::split(theirs, blocks()))
            .zip(ours)
        {
            let Ok(mut server) = Server::new(cfg.clone(), theirs, now) else {
                return (table, None);
            };
            let (t, c) = server.merge(ours, now);
            (taken, clashed) = (taken + t, clashed + c);
            union.extend(server.leases());
        }
        union.sort_by_key(|l| (u32::from(l.ip), l.mac));
        if taken == 0 {
            if clashed > 0 {
                tracing::warn!(
                    clashed,
                    "HA: bindings this box made apart from the other name addresses the serving box gave to other devices: those devices get new addresses at their next renewal"
                );
            }
            tracing::info!("HA: the serving box holds every binding this box made apart from it");
            self.leases.clear();
            return (table, None);
        }
        tracing::info!(
            missing = taken,
            "HA: the serving box lacks bindings this box made apart from it: offering them"
        );
        let ours = cyphonic_vip::file::encode(
            &cyphonic_vip::file::Table {
                leases: self.leases.clone(),
                leases6: Vec::new(),
            },
            0,
        )
        .ok();
        // The serving box's DHCPv6 bindings are kept as it sent them.
        let union = cyphonic_vip::file::Table {
            leases: union,
            leases6,
        };
        let kept = cyphonic_vip::file::encode(&union, 0).unwrap_or(table);
        (kept, ours)
    }
}

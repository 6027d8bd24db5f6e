//! Our devices' names: every device with an address (a DHCP lease, or a reservation, which
//! needs no lease to have a name) gets a label in our zone (`camera.gw1.ovl.example`,
//! deterministically: crates/vip `names`). They are what the DNS service answers, what we
//! register with the cloud, and the leases table of the status document.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, Ipv6Addr};

use cyphonic_signal::NameRecord;
use cyphonic_vip::Lease;

use crate::config::{Mac, Reservation};
use crate::status::LeaseStatus;

/// The names we host.
#[derive(Debug)]
pub struct Names {
    /// Reserved devices, as leases that never end.
    reserved: Vec<Lease>,
    /// The legacy devices' own addresses, by vIP.
    legacy: BTreeMap<Ipv4Addr, Ipv4Addr>,
    /// The zone every device name lives in (our FQDN).
    zone: String,
    /// The gateway's own address, which the zone's name points at.
    gateway: Ipv4Addr,
    /// Its IPv6 address on the LAN, the zone name's AAAA (none without IPv6).
    gateway6: Option<Ipv6Addr>,
    /// The names we host (ours and our devices'), as registered with the cloud.
    hosted: Vec<NameRecord>,
    /// Bumped whenever `hosted` changes.
    version: u64,
}

/// The names as [`Names::refresh`] made them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Named {
    /// Each device's label, by address.
    pub labels: BTreeMap<Ipv4Addr, String>,
    /// The IPv6 address of each device that has one (its AAAA), by its IPv4 address.
    pub v6: BTreeMap<Ipv4Addr, Ipv6Addr>,
    /// Every device with an address, for the status document.
    pub leases: Vec<LeaseStatus>,
}

impl Names {
    /// The names of zone `zone` (our FQDN), whose own name is the `gateway` address.
    pub fn new(
        reservations: &[Reservation],
        zone: &str,
        gateway: Ipv4Addr,
        gateway6: Option<Ipv6Addr>,
    ) -> Self {
        let mut names = Self {
            reserved: Vec::new(),
            legacy: BTreeMap::new(),
            zone: zone.trim_end_matches('.').to_owned(),
            gateway,
            gateway6,
            hosted: Vec::new(),
            version: 0,
        };
        names.set_reservations(reservations);
        names
    }

    /// Replaces the reservations (a reload); the next [`Names::refresh`] names them.
    pub fn set_reservations(&mut self, reservations: &[Reservation]) {
        self.reserved = reservations
            .iter()
            .map(|r| Lease {
                mac: r.mac.0,
                ip: r.vip,
                hostname: r.hostname.clone(),
                client_id: None,
                expires: u64::MAX,
                active: true,
            })
            .collect();
        self.legacy = reservations
            .iter()
            .filter_map(|r| Some((r.vip, r.legacy?)))
            .collect();
    }

    /// Recomputes every device's name from the `active` leases and the reservations; a
    /// device's AAAA is the IPv6 address `v6` gives its MAC.
    pub fn refresh<'a>(
        &mut self,
        active: impl Iterator<Item = &'a Lease>,
        v6: &HashMap<[u8; 6], Ipv6Addr>,
    ) -> Named {
        let mut all: Vec<Lease> = active.cloned().collect();
        for r in &self.reserved {
            if !all.iter().any(|l| l.ip == r.ip) {
                all.push(r.clone());
            }
        }
        // A reservation's name is the operator's: no leased device takes it by asking.
        let labels = cyphonic_vip::names(&all, |ip| {
            self.reserved
                .iter()
                .any(|r| r.ip == ip && r.hostname.is_some())
        });
        let v6: BTreeMap<Ipv4Addr, Ipv6Addr> = all
            .iter()
            .filter_map(|l| Some((l.ip, *v6.get(&l.mac)?)))
            .collect();
        let mut hosted: Vec<NameRecord> = labels
            .iter()
            .map(|(ip, label)| NameRecord {
                name: format!("{label}.{}", self.zone),
                vip: *ip,
                vip6: v6.get(ip).copied(),
                legacy: self.legacy.get(ip).copied(),
            })
            .collect();
        hosted.push(NameRecord {
            name: self.zone.clone(),
            vip: self.gateway,
            vip6: self.gateway6,
            legacy: None,
        });
        hosted.sort();
        if hosted != self.hosted {
            self.hosted = hosted;
            self.version += 1;
        }
        all.sort_by_key(|l| u32::from(l.ip));
        let leases = all
            .iter()
            .map(|l| LeaseStatus {
                vip: l.ip.to_string(),
                mac: Mac(l.mac).to_string(),
                name: labels.get(&l.ip).map(|n| format!("{n}.{}", self.zone)),
                hostname: l.hostname.clone(),
                reserved: self.reserved.iter().any(|r| r.ip == l.ip),
                legacy: self.legacy.get(&l.ip).map(ToString::to_string),
                learned: false,
                vip6: v6.get(&l.ip).map(ToString::to_string),
                vlan: None,
                expires: (l.expires != u64::MAX).then_some(l.expires),
            })
            .collect();
        Named {
            labels: labels.into_iter().collect(),
            v6,
            leases,
        }
    }

    /// The names we host, and a version that changes with them.
    pub fn hosted(&self) -> (u64, &[NameRecord]) {
        (self.version, &self.hosted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(n: u8, hostname: &str) -> Lease {
        Lease {
            mac: [2, 0, 0, 0, 0, n],
            ip: Ipv4Addr::new(100, 64, 1, n),
            hostname: Some(hostname.into()),
            client_id: None,
            expires: 1_800_000_000,
            active: true,
        }
    }

    /// Reservations have names without a lease; the version moves only when the names do.
    #[test]
    fn names_follow_leases_and_reservations() {
        let r = Reservation {
            mac: Mac([2, 0, 0, 0, 0, 9]),
            vip: Ipv4Addr::new(100, 64, 1, 9),
            vip6: None,
            legacy: None,
            hostname: Some("printer".into()),
            groups: Vec::new(),
        };
        let mut names = Names::new(&[r], "gw1.ovl.example.", Ipv4Addr::new(100, 64, 1, 1), None);
        let none = HashMap::new();
        let named = names.refresh([].iter(), &none);
        assert_eq!(named.leases.len(), 1);
        assert!(named.leases[0].reserved && named.leases[0].expires.is_none());
        let (v1, hosted) = names.hosted();
        let hosted: Vec<&str> = hosted.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(hosted, ["gw1.ovl.example", "printer.gw1.ovl.example"]);
        let camera = lease(20, "camera");
        let named = names.refresh([camera.clone()].iter(), &none);
        assert_eq!(
            named.labels.get(&camera.ip).map(String::as_str),
            Some("camera")
        );
        assert_eq!(
            named.leases[1].name.as_deref(),
            Some("camera.gw1.ovl.example")
        );
        let (v2, _) = names.hosted();
        names.refresh([camera.clone()].iter(), &none);
        assert_eq!((v2 > v1, names.hosted().0), (true, v2));
        // A device at a lower address that calls itself `printer` does not take the
        // reserved printer's name (nor what DNS and the cloud's rules give it).
        let rogue = lease(5, "Printer");
        let named = names.refresh([rogue.clone(), camera].iter(), &none);
        assert_eq!(
            named
                .labels
                .get(&Ipv4Addr::new(100, 64, 1, 9))
                .map(String::as_str),
            Some("printer")
        );
        assert_eq!(
            named.labels.get(&rogue.ip).map(String::as_str),
            Some("printer-5")
        );
    }

    /// A device's AAAA is the address the table gives its MAC, and the zone's name has the
    /// gateway's; they are what the cloud is told too.
    #[test]
    fn devices_with_ipv6_addresses_have_their_aaaa() {
        let gw6: Ipv6Addr = "fd7a:0:1:100::1".parse().unwrap_or(Ipv6Addr::UNSPECIFIED);
        let cam6: Ipv6Addr = "fd7a:0:1:100::20".parse().unwrap_or(Ipv6Addr::UNSPECIFIED);
        let mut names = Names::new(
            &[],
            "gw1.ovl.example.",
            Ipv4Addr::new(100, 64, 1, 1),
            Some(gw6),
        );
        let camera = lease(20, "camera");
        let printer = lease(21, "printer");
        let v6 = HashMap::from([(camera.mac, cam6)]);
        let named = names.refresh([camera.clone(), printer.clone()].iter(), &v6);
        assert_eq!(named.v6, BTreeMap::from([(camera.ip, cam6)]));
        assert_eq!(named.leases[0].vip6.as_deref(), Some("fd7a:0:1:100::20"));
        assert_eq!(named.leases[1].vip6, None);
        let hosted = names.hosted().1;
        let of = |n: &str| hosted.iter().find(|h| h.name == n).and_then(|h| h.vip6);
        assert_eq!(of("camera.gw1.ovl.example"), Some(cam6));
        assert_eq!(of("printer.gw1.ovl.example"), None);
        assert_eq!(of("gw1.ovl.example"), Some(gw6));
    }
}

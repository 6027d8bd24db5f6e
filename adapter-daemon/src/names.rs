//! Our devices' names: every device with an address (a DHCP lease, or a reservation, which
//! needs no lease to have a name) gets a label in our zone (`camera.gw1.ovl.example`,
//! deterministically: crates/vip `names`). They are what the DNS service answers, what we
//! register with the cloud, and the leases table of the status document.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cyphonic_signal::NameRecord;
use cyphonic_vip::Lease;

use crate::config::{Mac, Reservation};
use crate::status::{Device6Status, LeaseStatus};

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
    /// The devices with IPv6 only named by the last refresh, by MAC.
    named6: HashSet<[u8; 6]>,
}

/// The most devices with IPv6 only that are named (registered with the cloud beside the
/// devices with an IPv4 address, which go first there: docs/protocol.md §7).
pub const ONLY6_MAX: usize = 256;

/// The names as [`Names::refresh`] made them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Named {
    /// Each device's label, by address: its IPv4 one, or for a device with IPv6 only its
    /// IPv6 one.
    pub labels: BTreeMap<IpAddr, String>,
    /// The IPv6 address of each device that has both (its AAAA), by its IPv4 address.
    pub v6: BTreeMap<Ipv4Addr, Ipv6Addr>,
    /// Every device with an IPv4 address, for the status document.
    pub leases: Vec<LeaseStatus>,
    /// Every device with IPv6 only, for the status document.
    pub devices6: Vec<Device6Status>,
}

impl Named {
    /// What the DNS service answers: each label with its A and AAAA addresses.
    pub fn hosts(&self) -> impl Iterator<Item = (&str, Option<Ipv4Addr>, Option<Ipv6Addr>)> {
        self.labels.iter().map(|(ip, label)| match ip {
            IpAddr::V4(v4) => (label.as_str(), Some(*v4), self.v6.get(v4).copied()),
            IpAddr::V6(v6) => (label.as_str(), None, Some(*v6)),
        })
    }
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
            named6: HashSet::new(),
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
    /// device's AAAA is the IPv6 address `v6` gives its MAC. A MAC `v6` gives an address
    /// that has no IPv4 address is a device with IPv6 only: named from the host name
    /// `bound6` gives it (the MACs with a DHCPv6 binding, with the host name each gave),
    /// else its MAC, with an AAAA alone. At most [`ONLY6_MAX`] of those are named: first
    /// those named before (a flood of new addresses takes no device's name), then those
    /// bound by DHCPv6 (which its guard holds to a share), then by address.
    pub fn refresh<'a>(
        &mut self,
        active: impl Iterator<Item = &'a Lease>,
        v6: &HashMap<[u8; 6], Ipv6Addr>,
        bound6: &HashMap<[u8; 6], Option<String>>,
    ) -> Named {
        let mut all: Vec<Lease> = active.cloned().collect();
        for r in &self.reserved {
            if !all.iter().any(|l| l.ip == r.ip) {
                all.push(r.clone());
            }
        }
        let with_v4: HashSet<[u8; 6]> = all.iter().map(|l| l.mac).collect();
        let mut only6: Vec<(Ipv6Addr, [u8; 6])> = v6
            .iter()
            .filter(|(mac, _)| !with_v4.contains(*mac))
            .map(|(mac, ip)| (*ip, *mac))
            .collect();
        only6.sort_unstable_by_key(|(ip, mac)| {
            (!self.named6.contains(mac), !bound6.contains_key(mac), *ip)
        });
        only6.truncate(ONLY6_MAX);
        only6.sort_unstable();
        self.named6 = only6.iter().map(|(_, mac)| *mac).collect();
        let hostname6 = |mac: &[u8; 6]| bound6.get(mac).and_then(Option::as_deref);
        // A reservation's name is the operator's: no leased device takes it by asking.
        let labels = cyphonic_vip::names(
            cyphonic_vip::leased(&all).chain(
                only6
                    .iter()
                    .map(|(ip, mac)| (IpAddr::V6(*ip), hostname6(mac), *mac)),
            ),
            |ip| {
                self.reserved
                    .iter()
                    .any(|r| IpAddr::V4(r.ip) == ip && r.hostname.is_some())
            },
        );
        let v6: BTreeMap<Ipv4Addr, Ipv6Addr> = all
            .iter()
            .filter_map(|l| Some((l.ip, *v6.get(&l.mac)?)))
            .collect();
        let fqdn = |ip: IpAddr| labels.get(&ip).map(|n| format!("{n}.{}", self.zone));
        let mut hosted: Vec<NameRecord> = labels
            .iter()
            .map(|(ip, label)| {
                let name = format!("{label}.{}", self.zone);
                match ip {
                    IpAddr::V4(v4) => NameRecord {
                        name,
                        vip: Some(*v4),
                        vip6: v6.get(v4).copied(),
                        legacy: self.legacy.get(v4).copied(),
                    },
                    IpAddr::V6(only) => NameRecord {
                        name,
                        vip: None,
                        vip6: Some(*only),
                        legacy: None,
                    },
                }
            })
            .collect();
        hosted.push(NameRecord {
            name: self.zone.clone(),
            vip: Some(self.gateway),
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
                name: fqdn(IpAddr::V4(l.ip)),
                hostname: l.hostname.clone(),
                reserved: self.reserved.iter().any(|r| r.ip == l.ip),
                legacy: self.legacy.get(&l.ip).map(ToString::to_string),
                learned: false,
                vip6: v6.get(&l.ip).map(ToString::to_string),
                vlan: None,
                expires: (l.expires != u64::MAX).then_some(l.expires),
            })
            .collect();
        let devices6 = only6
            .iter()
            .map(|(ip, mac)| Device6Status {
                vip6: ip.to_string(),
                mac: Mac(*mac).to_string(),
                name: fqdn(IpAddr::V6(*ip)),
                hostname: hostname6(mac).map(str::to_owned),
            })
            .collect();
        Named {
            labels: labels.into_iter().collect(),
            v6,
            leases,
            devices6,
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
        let none6 = HashMap::new();
        let named = names.refresh([].iter(), &none, &none6);
        assert_eq!(named.leases.len(), 1);
        assert!(named.leases[0].reserved && named.leases[0].expires.is_none());
        let (v1, hosted) = names.hosted();
        let hosted: Vec<&str> = hosted.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(hosted, ["gw1.ovl.example", "printer.gw1.ovl.example"]);
        let camera = lease(20, "camera");
        let named = names.refresh([camera.clone()].iter(), &none, &none6);
        assert_eq!(
            named.labels.get(&IpAddr::V4(camera.ip)).map(String::as_str),
            Some("camera")
        );
        assert_eq!(
            named.leases[1].name.as_deref(),
            Some("camera.gw1.ovl.example")
        );
        let (v2, _) = names.hosted();
        names.refresh([camera.clone()].iter(), &none, &none6);
        assert_eq!((v2 > v1, names.hosted().0), (true, v2));
        // A device at a lower address that calls itself `printer` does not take the
        // reserved printer's name (nor what DNS and the cloud's rules give it).
        let rogue = lease(5, "Printer");
        let named = names.refresh([rogue.clone(), camera].iter(), &none, &none6);
        assert_eq!(
            named
                .labels
                .get(&IpAddr::V4(Ipv4Addr::new(100, 64, 1, 9)))
                .map(String::as_str),
            Some("printer")
        );
        assert_eq!(
            named.labels.get(&IpAddr::V4(rogue.ip)).map(String::as_str),
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
        let named = names.refresh(
            [camera.clone(), printer.clone()].iter(),
            &v6,
            &HashMap::new(),
        );
        assert_eq!(named.v6, BTreeMap::from([(camera.ip, cam6)]));
        assert_eq!(named.leases[0].vip6.as_deref(), Some("fd7a:0:1:100::20"));
        assert_eq!(named.leases[1].vip6, None);
        let hosted = names.hosted().1;
        let of = |n: &str| hosted.iter().find(|h| h.name == n).and_then(|h| h.vip6);
        assert_eq!(of("camera.gw1.ovl.example"), Some(cam6));
        assert_eq!(of("printer.gw1.ovl.example"), None);
        assert_eq!(of("gw1.ovl.example"), Some(gw6));
    }

    /// A device with IPv6 only has a name too: its DHCPv6 host name, else its MAC's, with
    /// an AAAA and no A; a device with both is named once, by its IPv4 lease.
    #[test]
    fn devices_with_ipv6_only_are_named_by_it() {
        let mut names = Names::new(&[], "gw1.ovl.example.", Ipv4Addr::new(100, 64, 1, 1), None);
        let camera = lease(20, "camera");
        let cam6: Ipv6Addr = "fd7a:0:1:100::20".parse().unwrap_or(Ipv6Addr::UNSPECIFIED);
        let thread6: Ipv6Addr = "fd7a:0:1:100::1abc"
            .parse()
            .unwrap_or(Ipv6Addr::UNSPECIFIED);
        let bare6: Ipv6Addr = "fd7a:0:1:100::77".parse().unwrap_or(Ipv6Addr::UNSPECIFIED);
        let (thread, bare) = ([2, 0, 0, 0, 6, 1], [2, 0, 0, 0, 6, 2]);
        let v6 = HashMap::from([(camera.mac, cam6), (thread, thread6), (bare, bare6)]);
        // Its host name is the camera's: the camera keeps it.
        let hostnames = HashMap::from([
            (thread, Some("Camera".to_owned())),
            (camera.mac, Some("x".into())),
        ]);
        let named = names.refresh([camera.clone()].iter(), &v6, &hostnames);
        assert_eq!(
            named.labels.get(&IpAddr::V4(camera.ip)).map(String::as_str),
            Some("camera")
        );
        assert_eq!(
            named.labels.get(&IpAddr::V6(thread6)).map(String::as_str),
            Some("camera-188")
        );
        assert_eq!(
            named.labels.get(&IpAddr::V6(bare6)).map(String::as_str),
            Some("dev-020000000602")
        );
        assert_eq!(named.labels.len(), 3, "{:?}", named.labels);
        assert_eq!(named.leases.len(), 1);
        let listed: Vec<(&str, Option<&str>)> = named
            .devices6
            .iter()
            .map(|d| (d.vip6.as_str(), d.name.as_deref()))
            .collect();
        assert_eq!(
            listed,
            [
                ("fd7a:0:1:100::77", Some("dev-020000000602.gw1.ovl.example")),
                ("fd7a:0:1:100::1abc", Some("camera-188.gw1.ovl.example")),
            ]
        );
        let hosts: Vec<(&str, Option<Ipv4Addr>, Option<Ipv6Addr>)> = named.hosts().collect();
        assert!(
            hosts.contains(&("camera-188", None, Some(thread6))),
            "{hosts:?}"
        );
        assert!(
            hosts.contains(&("camera", Some(camera.ip), Some(cam6))),
            "{hosts:?}"
        );
        let hosted = names.hosted().1;
        let thread_record = hosted
            .iter()
            .find(|h| h.name == "camera-188.gw1.ovl.example")
            .map(|h| (h.vip, h.vip6));
        assert_eq!(thread_record, Some((None, Some(thread6))));
    }

    /// A flood of new MACs, each at an IPv6 address of its own, takes no name from a device
    /// with IPv6 only named before it: at most ONLY6_MAX are named, those named before first,
    /// then those bound by DHCPv6.
    #[test]
    fn a_flood_of_ipv6_only_devices_takes_no_ones_name() {
        let mut names = Names::new(&[], "gw1.ovl.example.", Ipv4Addr::new(100, 64, 1, 1), None);
        let at = |n: u32| -> Ipv6Addr {
            Ipv6Addr::from(0xfd7a_0000_0001_0100_0000_0000_0001_0000_u128 + u128::from(n))
        };
        let mac = |n: u32| -> [u8; 6] {
            let b = n.to_be_bytes();
            [2, 9, b[0], b[1], b[2], b[3]]
        };
        let genuine = (mac(5000), at(5000));
        let mut v6 = HashMap::from([genuine]);
        let named = names.refresh([].iter(), &v6, &HashMap::new());
        assert_eq!(named.devices6.len(), 1);
        // The flood: lower addresses than the genuine device's, one bound by DHCPv6.
        for n in 0..300 {
            v6.insert(mac(n), at(n));
        }
        let bound = HashMap::from([(mac(299), None)]);
        let named = names.refresh([].iter(), &v6, &bound);
        assert_eq!(named.devices6.len(), ONLY6_MAX);
        let has = |ip: Ipv6Addr| named.labels.contains_key(&IpAddr::V6(ip));
        assert!(has(genuine.1), "the device named before keeps its name");
        assert!(has(at(299)), "the DHCPv6-bound one next");
        assert!(has(at(0)) && !has(at(298)), "then by address");
        // Still so at the next refresh: the ones named stay named.
        let again = names.refresh([].iter(), &v6, &HashMap::new());
        assert_eq!(again.labels, named.labels);
    }
}

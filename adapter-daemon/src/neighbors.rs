//! Who is where on the LAN. Reservations (fixed) and DHCP leases (changing) are authoritative
//! for anti-spoofing: a device may only send from an address it holds. ARP teaches the rest,
//! for delivery only.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{PoisonError, RwLock};

use cyphonic_gateway::Neighbors;

use crate::config::Reservation;

/// Most neighbours learned from ARP we keep (a flood of ARP cannot grow memory).
const MAX_LEARNED: usize = 4096;

/// The LAN's address table.
#[derive(Debug)]
pub struct LanTable {
    /// Reservations and leases: what anti-spoofing reads, one lock for both.
    held: RwLock<Held>,
    learned: RwLock<HashMap<Ipv4Addr, [u8; 6]>>,
}

/// Who holds which address: by reservation (fixed until a reload) or by DHCP lease.
#[derive(Debug, Default)]
struct Held {
    reserved: HashMap<Ipv4Addr, [u8; 6]>,
    leases: HashMap<Ipv4Addr, [u8; 6]>,
}

impl LanTable {
    /// A table holding `reservations` and no leases yet.
    pub fn new(reservations: &[Reservation]) -> Self {
        let table = Self {
            held: RwLock::default(),
            learned: RwLock::new(HashMap::new()),
        };
        table.set_reservations(reservations);
        table
    }

    /// Replaces the reservations (a reload).
    pub fn set_reservations(&self, reservations: &[Reservation]) {
        self.held
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .reserved = reservations.iter().map(|r| (r.vip, r.mac.0)).collect();
    }

    /// Replaces the DHCP leases (reservations stay in force whatever their lease does).
    pub fn replace_leases(&self, leases: HashMap<Ipv4Addr, [u8; 6]>) {
        {
            // What ARP said about a leased address is stale once the lease says otherwise.
            let mut learned = self.learned.write().unwrap_or_else(PoisonError::into_inner);
            for (ip, mac) in &leases {
                if learned.get(ip).is_some_and(|m| m != mac) {
                    learned.remove(ip);
                }
            }
        }
        self.held
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .leases = leases;
    }

    /// Records what ARP said about `ip`. Returns whether it was new or changed.
    pub fn learn(&self, ip: Ipv4Addr, mac: [u8; 6]) -> bool {
        let mut learned = self.learned.write().unwrap_or_else(PoisonError::into_inner);
        if learned.get(&ip) == Some(&mac) {
            return false;
        }
        if learned.len() >= MAX_LEARNED && !learned.contains_key(&ip) {
            return false;
        }
        learned.insert(ip, mac);
        true
    }
}

impl Neighbors for LanTable {
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        let held = self.held.read().unwrap_or_else(PoisonError::into_inner);
        held.reserved
            .get(&ip)
            .or_else(|| held.leases.get(&ip))
            .copied()
    }

    fn neighbor_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        self.leased_mac(ip).or_else(|| {
            self.learned
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&ip)
                .copied()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mac;

    #[test]
    fn leases_come_and_go_reservations_stay() {
        let r = Reservation {
            mac: Mac([2, 0, 0, 0, 0, 1]),
            vip: Ipv4Addr::new(100, 64, 1, 10),
            hostname: None,
            groups: Vec::new(),
        };
        let t = LanTable::new(std::slice::from_ref(&r));
        let ip = Ipv4Addr::new(100, 64, 1, 50);
        assert!(t.learn(ip, [2, 0, 0, 0, 0, 9]));
        assert_eq!(t.leased_mac(ip), None, "ARP never authorises a source");
        assert_eq!(t.neighbor_mac(ip), Some([2, 0, 0, 0, 0, 9]));
        t.replace_leases(HashMap::from([(ip, [2, 0, 0, 0, 0, 2])]));
        assert_eq!(t.leased_mac(ip), Some([2, 0, 0, 0, 0, 2]));
        t.replace_leases(HashMap::new());
        assert_eq!(t.neighbor_mac(ip), None, "the stale ARP entry went too");
        assert_eq!(
            t.leased_mac(Ipv4Addr::new(100, 64, 1, 10)),
            Some([2, 0, 0, 0, 0, 1])
        );
        // A reload moves the reservation: the old address is no longer the device's.
        t.set_reservations(&[Reservation {
            vip: Ipv4Addr::new(100, 64, 1, 11),
            ..r
        }]);
        assert_eq!(t.leased_mac(Ipv4Addr::new(100, 64, 1, 10)), None);
        assert_eq!(
            t.leased_mac(Ipv4Addr::new(100, 64, 1, 11)),
            Some([2, 0, 0, 0, 0, 1])
        );
    }
}

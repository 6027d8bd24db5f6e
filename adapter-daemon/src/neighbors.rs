//! Who is where on the LAN. Reservations (fixed) and DHCP leases (changing) are the whole of
//! it: a device may only send from an address it holds, and packets are delivered only to
//! the holder. ARP teaches nothing: an address nobody holds cannot be claimed by announcing
//! it (issue 49, finding 7).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{PoisonError, RwLock};

use cyphonic_gateway::Neighbors;

use crate::config::Reservation;

/// The LAN's address table.
#[derive(Debug)]
pub struct LanTable {
    /// Reservations and leases: what anti-spoofing and delivery read, one lock for both.
    held: RwLock<Held>,
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
        self.held
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .leases = leases;
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
            legacy: None,
            hostname: None,
            groups: Vec::new(),
        };
        let t = LanTable::new(std::slice::from_ref(&r));
        let ip = Ipv4Addr::new(100, 64, 1, 50);
        assert_eq!(t.leased_mac(ip), None);
        t.replace_leases(HashMap::from([(ip, [2, 0, 0, 0, 0, 2])]));
        assert_eq!(t.leased_mac(ip), Some([2, 0, 0, 0, 0, 2]));
        t.replace_leases(HashMap::new());
        assert_eq!(t.leased_mac(ip), None, "the lease ended: nobody holds it");
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

//! Who is where on the LAN: reservations (and later DHCP leases) are authoritative for
//! anti-spoofing; ARP teaches the rest, for delivery only.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::RwLock;

use cyphonic_gateway::Neighbors;

use crate::config::Reservation;

/// Most neighbours learned from ARP we keep (a flood of ARP cannot grow memory).
const MAX_LEARNED: usize = 4096;

/// The LAN's address table.
#[derive(Debug)]
pub struct LanTable {
    leases: RwLock<HashMap<Ipv4Addr, [u8; 6]>>,
    learned: RwLock<HashMap<Ipv4Addr, [u8; 6]>>,
}

impl LanTable {
    /// A table holding `reservations`.
    pub fn new(reservations: &[Reservation]) -> Self {
        Self {
            leases: RwLock::new(reservations.iter().map(|r| (r.vip, r.mac.0)).collect()),
            learned: RwLock::new(HashMap::new()),
        }
    }

    /// Records what ARP said about `ip`. Returns whether it was new or changed.
    pub fn learn(&self, ip: Ipv4Addr, mac: [u8; 6]) -> bool {
        let mut learned = self
            .learned
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if learned.get(&ip) == Some(&mac) {
            return false;
        }
        if learned.len() >= MAX_LEARNED && !learned.contains_key(&ip) {
            return false;
        }
        learned.insert(ip, mac);
        true
    }

    /// The reserved or leased addresses, sorted.
    pub fn leases(&self) -> Vec<(Ipv4Addr, [u8; 6])> {
        let mut v: Vec<_> = self
            .leases
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(i, m)| (*i, *m))
            .collect();
        v.sort();
        v
    }
}

impl Neighbors for LanTable {
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        self.leases
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&ip)
            .copied()
    }

    fn neighbor_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        self.leased_mac(ip).or_else(|| {
            self.learned
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&ip)
                .copied()
        })
    }
}

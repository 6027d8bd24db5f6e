//! Who is where on the LAN. Reservations (fixed, with the declared legacy devices) and DHCP
//! leases (changing) are most of it: a device may only send from an address it holds, and
//! packets are delivered only to the holder. ARP teaches nothing of the block: an address
//! nobody holds cannot be claimed by announcing it (issue 49, finding 7). Of a legacy subnet
//! (`[legacy] learn`), the first MAC heard at an address nobody holds holds it, within
//! bounds ([`LEARNED_MAX`], [`LEARNED_PER_MAC`]), until the adapter restarts or the address
//! is declared.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{PoisonError, RwLock};

use cyphonic_gateway::Neighbors;
use ipnet::Ipv4Net;

use crate::config::{Mac, Reservation};

/// Legacy addresses learned at most in one legacy subnet (the untagged segment's, or a
/// VLAN's: each its own, so that a flood on one cannot stop learning on another), every MAC
/// together: more are refused (their frames are dropped as spoofed) until declared.
pub const LEARNED_MAX: usize = 1024;
/// Legacy addresses one MAC may learn: one box cannot claim a subnet.
pub const LEARNED_PER_MAC: usize = 4;

/// IPv6 addresses one MAC holds at most (a stable SLAAC address, temporary ones): a ninth
/// takes the place of its oldest, so that rotating temporary addresses never lock a device
/// out and one box cannot fill the table.
pub const LEARNED6_PER_MAC: usize = 8;
/// IPv6 addresses the table holds at most, every MAC together: a new MAC's are refused (its
/// packets dropped as spoofed) while it is full.
pub const LEARNED6_MAX: usize = 4096;

/// A learned IPv6 address unheard for this long is forgotten (a device that left, or a
/// temporary address it no longer uses), seconds: a day.
pub const FORGET6_AFTER: u64 = 86_400;
/// How stale a learned address's last-heard time may grow before a packet from it writes it
/// again, seconds: packets from a busy device touch it once a minute, not each one.
const HEARD6_EVERY: u64 = 60;

/// An IPv6 address a MAC was heard at, and when it last was (unix seconds).
#[derive(Debug)]
struct Heard6 {
    mac: [u8; 6],
    heard: std::sync::atomic::AtomicU64,
}

/// The LAN's address table.
#[derive(Debug)]
pub struct LanTable {
    /// Reservations, leases and learned addresses: what anti-spoofing and delivery read, one
    /// lock for all.
    held: RwLock<Held>,
    /// The overlay blocks legacy subnets map onto, where devices may be learned.
    learn: Vec<Ipv4Net>,
    /// The site's routers, beside which the adapter runs: one a segment at most (the
    /// untagged one's, a VLAN's), each MAC the first heard.
    routers: Vec<Router>,
    /// Bumped whenever an IPv6 address is learned or forgotten.
    changes6: std::sync::atomic::AtomicU64,
    /// The time the services last told the table (unix seconds, [`LanTable::forget6`]):
    /// what the data threads stamp learned addresses with.
    clock6: std::sync::atomic::AtomicU64,
}

/// A site's router on one segment.
#[derive(Debug)]
struct Router {
    /// The segment: its VLAN, None untagged.
    tag: Option<u16>,
    /// Its MAC: the first heard.
    mac: std::sync::OnceLock<[u8; 6]>,
    /// Whether another MAC's claim of the router's address was logged (once).
    claimed: std::sync::atomic::AtomicBool,
}

/// Who holds which address: by reservation (fixed until a reload), by DHCP lease, or
/// learned on a legacy subnet.
#[derive(Debug, Default)]
struct Held {
    reserved: HashMap<Ipv4Addr, [u8; 6]>,
    /// The MACs of `reserved`, which learn nothing.
    reserved_macs: HashSet<[u8; 6]>,
    /// Every segment's leases together, which delivery and anti-spoofing read.
    leases: HashMap<Ipv4Addr, [u8; 6]>,
    /// Each segment's DHCP server's leases (by VLAN, None untagged), which make `leases`.
    leases_by_segment: HashMap<Option<u16>, HashMap<Ipv4Addr, [u8; 6]>>,
    learned: HashMap<Ipv4Addr, [u8; 6]>,
    /// How many addresses of `learned` each MAC holds.
    learned_by: HashMap<[u8; 6], usize>,
    /// How many addresses of `learned` each learning block holds.
    learned_in: HashMap<Ipv4Net, usize>,
    /// IPv6 addresses of the untagged segment's /64, each held by the first MAC heard at it
    /// (docs/protocol.md §7).
    learned6: HashMap<Ipv6Addr, Heard6>,
    /// Each MAC's of `learned6`, oldest first.
    learned6_by: HashMap<[u8; 6], VecDeque<Ipv6Addr>>,
    /// The DHCPv6 server's bindings: their MACs hold them, whoever is heard at them.
    leases6: HashMap<Ipv6Addr, [u8; 6]>,
    /// The reservations' fixed IPv6 addresses: held by their MACs before anything else.
    reserved6: HashMap<Ipv6Addr, [u8; 6]>,
}

impl Held {
    /// Lets `mac` hold `ip` if nobody does and the bounds allow (its oldest address makes
    /// room when it holds [`LEARNED6_PER_MAC`]). Returns whether `mac` holds `ip` now, and
    /// whether it did not before.
    fn learn6(&mut self, ip: Ipv6Addr, mac: [u8; 6], now: u64) -> (bool, bool) {
        if let Some(holder) = self.reserved6.get(&ip).or_else(|| self.leases6.get(&ip)) {
            return (*holder == mac, false);
        }
        if let Some(holder) = self.learned6.get(&ip) {
            return (holder.mac == mac, false);
        }
        let mine = self.learned6_by.get(&mac).map_or(0, VecDeque::len);
        if mine == 0 && self.learned6.len() >= LEARNED6_MAX {
            return (false, false);
        }
        let queue = self.learned6_by.entry(mac).or_default();
        if mine >= LEARNED6_PER_MAC
            && let Some(oldest) = queue.pop_front()
        {
            self.learned6.remove(&oldest);
        }
        queue.push_back(ip);
        let heard = std::sync::atomic::AtomicU64::new(now);
        self.learned6.insert(ip, Heard6 { mac, heard });
        (true, true)
    }

    /// Forgets the addresses last heard before `before`; returns how many.
    fn forget6(&mut self, before: u64) -> usize {
        let stale: Vec<Ipv6Addr> = self
            .learned6
            .iter()
            .filter(|(_, h)| h.heard.load(std::sync::atomic::Ordering::Relaxed) < before)
            .map(|(ip, _)| *ip)
            .collect();
        for ip in &stale {
            if let Some(h) = self.learned6.remove(ip)
                && let Some(queue) = self.learned6_by.get_mut(&h.mac)
            {
                queue.retain(|a| a != ip);
                if queue.is_empty() {
                    self.learned6_by.remove(&h.mac);
                }
            }
        }
        stale.len()
    }
}

impl Held {
    /// Whether `mac` may learn `ip` (of the learning block `onto`) now: nobody holds it,
    /// `mac` is not a declared device (which stays at its own address), and the bounds leave
    /// room. A few lookups, never a scan: it runs for every frame from an address nobody
    /// holds.
    fn may_learn(&self, onto: Ipv4Net, ip: Ipv4Addr, mac: [u8; 6]) -> bool {
        !self.reserved.contains_key(&ip)
            && !self.learned.contains_key(&ip)
            && !self.reserved_macs.contains(&mac)
            && self.learned_in.get(&onto).copied().unwrap_or(0) < LEARNED_MAX
            && self.learned_by.get(&mac).copied().unwrap_or(0) < LEARNED_PER_MAC
    }

    /// `mac` holds `ip` (of the learning block `onto`) from now on.
    fn learn(&mut self, onto: Ipv4Net, ip: Ipv4Addr, mac: [u8; 6]) {
        self.learned.insert(ip, mac);
        *self.learned_by.entry(mac).or_default() += 1;
        *self.learned_in.entry(onto).or_default() += 1;
    }
}

impl LanTable {
    /// A table holding `reservations` and no leases yet, learning nothing.
    pub fn new(reservations: &[Reservation]) -> Self {
        let table = Self {
            held: RwLock::default(),
            learn: Vec::new(),
            routers: Vec::new(),
            changes6: std::sync::atomic::AtomicU64::new(0),
            clock6: std::sync::atomic::AtomicU64::new(cyphonic_settings::now_secs()),
        };
        table.set_reservations(reservations);
        table
    }

    /// The table learning the devices of the legacy subnets mapped onto `onto` (none:
    /// nothing).
    #[must_use]
    pub fn learning(mut self, onto: impl IntoIterator<Item = Ipv4Net>) -> Self {
        self.learn = onto.into_iter().collect();
        self
    }

    /// The table beside a site's router on each segment of `tags` (its VLAN, None untagged):
    /// it takes each router's MAC as it is first heard.
    #[must_use]
    pub fn beside_routers(mut self, tags: impl IntoIterator<Item = Option<u16>>) -> Self {
        self.routers = tags
            .into_iter()
            .map(|tag| Router {
                tag,
                mac: std::sync::OnceLock::new(),
                claimed: std::sync::atomic::AtomicBool::new(false),
            })
            .collect();
        self
    }

    /// The MAC of the site's router on the segment of `tag`, once heard.
    pub fn router_mac_of(&self, tag: Option<u16>) -> Option<[u8; 6]> {
        self.routers
            .iter()
            .find(|r| r.tag == tag)
            .and_then(|r| r.mac.get().copied())
    }

    /// The site's router on the segment of `tag` said by its ARP that it is at `mac`: the
    /// first MAC heard is the router's; another is logged once and not believed. A segment
    /// without a router learns nothing.
    pub fn heard_router_of(&self, tag: Option<u16>, mac: [u8; 6]) {
        let Some(r) = self.routers.iter().find(|r| r.tag == tag) else {
            return;
        };
        match r.mac.get() {
            Some(known) if *known == mac => {}
            Some(known) => {
                if !r.claimed.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(vlan = ?tag, router = %Mac(*known), claimant = %Mac(mac), "another MAC claims the site's router's address: not believed (restart the adapter after replacing the router)");
                }
            }
            None => {
                if r.mac.set(mac).is_ok() {
                    tracing::info!(vlan = ?tag, router = %Mac(mac), "the site's router is heard");
                }
            }
        }
    }

    /// Replaces the reservations (a reload). A learned address now declared, or learned by a
    /// MAC now declared, is no longer learned.
    pub fn set_reservations(&self, reservations: &[Reservation]) {
        let mut held = self.held.write().unwrap_or_else(PoisonError::into_inner);
        held.reserved = reservations.iter().map(|r| (r.vip, r.mac.0)).collect();
        held.reserved_macs = reservations.iter().map(|r| r.mac.0).collect();
        let reserved6: HashMap<Ipv6Addr, [u8; 6]> = reservations
            .iter()
            .filter_map(|r| Some((r.vip6?, r.mac.0)))
            .collect();
        if held.reserved6 != reserved6 {
            // Another MAC's learned hold on a fixed address ends.
            let taken: Vec<Ipv6Addr> = held
                .learned6
                .iter()
                .filter(|(ip, h)| reserved6.get(ip).is_some_and(|m| *m != h.mac))
                .map(|(ip, _)| *ip)
                .collect();
            for ip in taken {
                if let Some(h) = held.learned6.remove(&ip)
                    && let Some(queue) = held.learned6_by.get_mut(&h.mac)
                {
                    queue.retain(|a| *a != ip);
                }
            }
            held.learned6_by.retain(|_, q| !q.is_empty());
            held.reserved6 = reserved6;
            self.changes6
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let Held {
            reserved,
            reserved_macs,
            learned,
            learned_by,
            learned_in,
            ..
        } = &mut *held;
        learned.retain(|ip, mac| !reserved.contains_key(ip) && !reserved_macs.contains(mac));
        learned_by.clear();
        learned_in.clear();
        for (ip, mac) in learned.iter() {
            *learned_by.entry(*mac).or_default() += 1;
            if let Some(onto) = self.learn.iter().find(|o| o.contains(ip)) {
                *learned_in.entry(*onto).or_default() += 1;
            }
        }
    }

    /// Each MAC's IPv6 address to name it by (its AAAA): its address in one of `prefixes` made from
    /// its MAC (EUI-64) if it holds it, else the first it was heard at of those it still
    /// holds (a stable address comes before the temporary ones).
    pub fn named6(&self, prefixes: &[ipnet::Ipv6Net]) -> HashMap<[u8; 6], Ipv6Addr> {
        let held = self.held.read().unwrap_or_else(PoisonError::into_inner);
        let mut named: HashMap<[u8; 6], Ipv6Addr> = held
            .learned6_by
            .iter()
            .filter_map(|(mac, ips)| {
                let named = prefixes
                    .iter()
                    .map(|p| cyphonic_gateway::eui64_address(*p, *mac))
                    .find(|ip| ips.contains(ip))
                    .or_else(|| ips.front().copied())?;
                Some((*mac, named))
            })
            .collect();
        // A DHCPv6 binding names its device before that (the lowest, when it has several), a
        // reservation's fixed address before anything.
        let mut leased: Vec<(&Ipv6Addr, &[u8; 6])> = held.leases6.iter().collect();
        leased.sort_unstable_by(|a, b| b.0.cmp(a.0));
        for (ip, mac) in leased.into_iter().chain(&held.reserved6) {
            named.insert(*mac, *ip);
        }
        named
    }

    /// The services' clock, `now` (unix seconds): learned addresses are stamped with it, and
    /// those unheard for [`FORGET6_AFTER`] are forgotten. Returns how many were.
    pub fn forget6(&self, now: u64) -> usize {
        self.clock6.store(now, std::sync::atomic::Ordering::Relaxed);
        let before = now.saturating_sub(FORGET6_AFTER);
        let stale = {
            let held = self.held.read().unwrap_or_else(PoisonError::into_inner);
            held.learned6
                .values()
                .any(|h| h.heard.load(std::sync::atomic::Ordering::Relaxed) < before)
        };
        if !stale {
            return 0;
        }
        let gone = self
            .held
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .forget6(before);
        if gone > 0 {
            self.changes6
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                forgotten = gone,
                "IPv6 addresses unheard for a day forgotten"
            );
        }
        gone
    }

    /// A number that changes whenever an IPv6 address is learned or forgotten.
    pub fn changes6(&self) -> u64 {
        self.changes6.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The IPv6 addresses the devices were heard at, with their MACs, by address.
    #[cfg(test)]
    pub fn learned6(&self) -> Vec<(Ipv6Addr, [u8; 6])> {
        let held = self.held.read().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<_> = held.learned6.iter().map(|(ip, h)| (*ip, h.mac)).collect();
        all.sort_by_key(|(ip, _)| ip.to_bits());
        all
    }

    /// The learned legacy devices: overlay address and MAC, by address.
    pub fn learned(&self) -> Vec<(Ipv4Addr, [u8; 6])> {
        let held = self.held.read().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<_> = held.learned.iter().map(|(ip, mac)| (*ip, *mac)).collect();
        all.sort_by_key(|(ip, _)| u32::from(*ip));
        all
    }

    /// Replaces the DHCPv6 bindings (the untagged segment's): each MAC holds its addresses,
    /// and its name's AAAA follows.
    pub fn replace_leases6(&self, leases: HashMap<Ipv6Addr, [u8; 6]>) {
        let mut held = self.held.write().unwrap_or_else(PoisonError::into_inner);
        if held.leases6 != leases {
            held.leases6 = leases;
            self.changes6
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Replaces the DHCP leases of the segment of VLAN `tag` (None: the untagged one);
    /// the other segments' stay (and reservations stay in force whatever their lease does).
    pub fn replace_leases(&self, tag: Option<u16>, leases: HashMap<Ipv4Addr, [u8; 6]>) {
        let mut held = self.held.write().unwrap_or_else(PoisonError::into_inner);
        held.leases_by_segment.insert(tag, leases);
        let all = held
            .leases_by_segment
            .values()
            .flat_map(|l| l.iter().map(|(ip, mac)| (*ip, *mac)))
            .collect();
        held.leases = all;
    }
}

impl Neighbors for LanTable {
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        let held = self.held.read().unwrap_or_else(PoisonError::into_inner);
        held.reserved
            .get(&ip)
            .or_else(|| held.leases.get(&ip))
            .or_else(|| held.learned.get(&ip))
            .copied()
    }

    /// Read for every IPv6 packet from or to a device: the holder's last-heard time is
    /// written only when a minute stale (a packet from it, or to it, keeps it).
    fn holder6(&self, ip: Ipv6Addr) -> Option<[u8; 6]> {
        use std::sync::atomic::Ordering::Relaxed;
        let held = self.held.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(mac) = held.reserved6.get(&ip).or_else(|| held.leases6.get(&ip)) {
            return Some(*mac);
        }
        let h = held.learned6.get(&ip)?;
        let now = self.clock6.load(Relaxed);
        if now.saturating_sub(h.heard.load(Relaxed)) >= HEARD6_EVERY {
            h.heard.store(now, Relaxed);
        }
        Some(h.mac)
    }

    fn heard6(&self, ip: Ipv6Addr, mac: [u8; 6]) -> bool {
        let now = self.clock6.load(std::sync::atomic::Ordering::Relaxed);
        let (holds, learned) = self
            .held
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .learn6(ip, mac, now);
        if learned {
            self.changes6
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(ip = %ip, mac = %Mac(mac), "a device's IPv6 address heard");
        }
        holds
    }

    /// The untagged segment's router.
    fn router_mac(&self) -> Option<[u8; 6]> {
        self.router_mac_of(None)
    }

    fn heard_router(&self, mac: [u8; 6]) {
        self.heard_router_of(None, mac);
    }

    /// Learns `mac` at `ip` when `ip` is of the learned subnet and the bounds allow; judged
    /// under the read lock first, so that frames that cannot learn never wait for the
    /// write lock.
    fn heard(&self, ip: Ipv4Addr, mac: [u8; 6]) {
        let Some(&onto) = self.learn.iter().find(|o| o.contains(&ip)) else {
            return;
        };
        if !self
            .held
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .may_learn(onto, ip, mac)
        {
            return;
        }
        let mut held = self.held.write().unwrap_or_else(PoisonError::into_inner);
        if held.may_learn(onto, ip, mac) {
            held.learn(onto, ip, mac);
            drop(held);
            tracing::info!(vip = %ip, mac = %Mac(mac), "learned a fixed-address device: declare it in [[legacy.device]] to name it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mac;

    /// The first MAC heard at an IPv6 address holds it; a MAC holds at most
    /// LEARNED6_PER_MAC, its oldest making room for a new one; a full table refuses new
    /// MACs but lets the ones it holds rotate their addresses.
    #[test]
    fn ipv6_addresses_are_learned_within_bounds() {
        let t = LanTable::new(&[]);
        let ip = |n: u128| Ipv6Addr::from(0xfd7a_0000_0001_0100_0000_0000_0000_0000 | n);
        let mac = |n: u32| {
            let b = n.to_be_bytes();
            [2, 0, b[0], b[1], b[2], b[3]]
        };
        assert!(t.heard6(ip(1), mac(1)));
        assert!(!t.heard6(ip(1), mac(2)), "another MAC's claim");
        assert_eq!(t.holder6(ip(1)), Some(mac(1)));
        for n in 2..=9 {
            assert!(t.heard6(ip(n), mac(1)));
        }
        assert_eq!(t.holder6(ip(1)), None, "the oldest made room");
        assert_eq!(t.holder6(ip(9)), Some(mac(1)));
        assert_eq!(t.learned6().len(), LEARNED6_PER_MAC);
        let mut n = 100;
        let mut m = 2;
        while t.learned6().len() < LEARNED6_MAX {
            assert!(t.heard6(ip(n), mac(m)));
            n += 1;
            m += u32::from(n % 8 == 0);
        }
        assert!(
            !t.heard6(ip(1 << 20), mac(1 << 20)),
            "a new MAC in a full table"
        );
        assert!(t.heard6(ip(1 << 21), mac(1)), "a MAC it holds rotates");
        assert_eq!(t.learned6().len(), LEARNED6_MAX);
    }

    /// An address unheard for a day is forgotten (and another MAC may then hold it); one
    /// whose packets keep coming stays.
    #[test]
    fn ipv6_addresses_unheard_for_a_day_are_forgotten() {
        let t = LanTable::new(&[]);
        let start = 1_800_000_000;
        t.forget6(start);
        let (kept, gone) = (
            Ipv6Addr::new(0xfd7a, 0, 1, 0x100, 0, 0, 0, 1),
            Ipv6Addr::new(0xfd7a, 0, 1, 0x100, 0, 0, 0, 2),
        );
        assert!(t.heard6(kept, [2, 0, 0, 0, 0, 1]));
        assert!(t.heard6(gone, [2, 0, 0, 0, 0, 2]));
        let before = t.changes6();
        // Half a day on, a packet from `kept`; a day and a minute after the start, `gone`
        // was not heard for a day.
        t.forget6(start + FORGET6_AFTER / 2);
        assert_eq!(t.holder6(kept), Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(t.forget6(start + FORGET6_AFTER + 60), 1);
        assert_eq!(t.holder6(gone), None);
        assert_eq!(t.holder6(kept), Some([2, 0, 0, 0, 0, 1]));
        assert!(t.changes6() > before, "the names follow");
        assert!(t.heard6(gone, [2, 0, 0, 0, 0, 3]), "free for another MAC");
        assert_eq!(t.named6(&[]).get(&[2, 0, 0, 0, 0, 2]), None);
    }

    /// A reservation's fixed IPv6 address is its MAC's before anything (a DHCPv6 binding
    /// or a learned address of another MAC), and its AAAA; a DHCPv6 binding comes next.
    #[test]
    fn fixed_and_dhcpv6_addresses_are_held_before_learned_ones() {
        let t = LanTable::new(&[]);
        let (fixed, leased) = (
            Ipv6Addr::new(0xfd7a, 0, 1, 0x100, 0, 0, 0, 0x10),
            Ipv6Addr::new(0xfd7a, 0, 1, 0x100, 0, 0, 0, 0x1234),
        );
        let (sensor, other) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let eui64 = cyphonic_gateway::eui64_address("fd7a:0:1:100::/64".parse().unwrap(), sensor);
        assert!(
            t.heard6(fixed, other),
            "learned before the reservation came"
        );
        assert!(t.heard6(eui64, sensor));
        let before = t.changes6();
        t.set_reservations(&[Reservation {
            mac: Mac(sensor),
            vip: Ipv4Addr::new(100, 64, 1, 10),
            vip6: Some(fixed),
            legacy: None,
            hostname: None,
            groups: Vec::new(),
        }]);
        assert!(t.changes6() > before, "the names follow");
        assert_eq!(t.holder6(fixed), Some(sensor));
        assert!(!t.heard6(fixed, other), "no longer the other MAC's");
        assert!(
            !t.learned6().iter().any(|(ip, _)| *ip == fixed),
            "nor learned"
        );
        assert!(t.heard6(fixed, sensor));
        let prefix = &["fd7a:0:1:100::/64".parse().unwrap()];
        assert_eq!(
            t.named6(prefix).get(&sensor),
            Some(&fixed),
            "before its EUI-64 one"
        );
        t.replace_leases6(HashMap::from([(leased, other)]));
        assert_eq!(t.holder6(leased), Some(other));
        assert!(!t.heard6(leased, sensor));
        assert_eq!(t.named6(prefix).get(&other), Some(&leased));
    }

    #[test]
    fn leases_come_and_go_reservations_stay() {
        let r = Reservation {
            mac: Mac([2, 0, 0, 0, 0, 1]),
            vip: Ipv4Addr::new(100, 64, 1, 10),
            vip6: None,
            legacy: None,
            hostname: None,
            groups: Vec::new(),
        };
        let t = LanTable::new(std::slice::from_ref(&r));
        let ip = Ipv4Addr::new(100, 64, 1, 50);
        assert_eq!(t.leased_mac(ip), None);
        t.replace_leases(None, HashMap::from([(ip, [2, 0, 0, 0, 0, 2])]));
        assert_eq!(t.leased_mac(ip), Some([2, 0, 0, 0, 0, 2]));
        t.replace_leases(None, HashMap::new());
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

#[cfg(test)]
mod learning {
    use super::*;

    fn mac(n: u8) -> [u8; 6] {
        [2, 0, 0, 0, 1, n]
    }

    fn onto(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(100, 64, 1, n)
    }

    /// The first MAC heard at a free address of the subnet holds it; a second is refused;
    /// nothing outside the subnet is learned, nor by a table that does not learn.
    #[test]
    fn the_first_mac_heard_holds_an_address_of_the_subnet() {
        let t = LanTable::new(&[]).learning(Some("100.64.1.0/24".parse().unwrap()));
        t.heard(onto(20), mac(1));
        t.heard(onto(20), mac(2));
        assert_eq!(t.leased_mac(onto(20)), Some(mac(1)));
        t.heard(Ipv4Addr::new(100, 64, 2, 20), mac(3));
        assert_eq!(t.leased_mac(Ipv4Addr::new(100, 64, 2, 20)), None);
        let silent = LanTable::new(&[]);
        silent.heard(onto(20), mac(1));
        assert_eq!(silent.leased_mac(onto(20)), None);
        assert_eq!(t.learned(), vec![(onto(20), mac(1))]);
    }

    /// The router's MAC is the first heard; another claiming its address is not believed.
    #[test]
    fn the_routers_mac_is_the_first_heard() {
        let t = LanTable::new(&[]).beside_routers([None, Some(30)]);
        assert_eq!(t.router_mac(), None);
        t.heard_router(mac(1));
        t.heard_router(mac(2));
        assert_eq!(t.router_mac(), Some(mac(1)));
        // Each segment's router its own; a segment without one learns none.
        t.heard_router_of(Some(30), mac(3));
        t.heard_router_of(Some(20), mac(4));
        assert_eq!(
            (t.router_mac_of(Some(30)), t.router_mac_of(Some(20))),
            (Some(mac(3)), None)
        );
        let alone = LanTable::new(&[]);
        alone.heard_router(mac(1));
        assert_eq!(alone.router_mac(), None);
    }

    /// One MAC learns at most LEARNED_PER_MAC addresses, all of them LEARNED_MAX in one
    /// learning block; a declared
    /// device's MAC learns none; declaring an address (or the MAC that learned it) ends the
    /// learned hold.
    #[test]
    fn learning_is_bounded_and_declaring_wins() {
        let t = LanTable::new(&[]).learning(Some("100.64.0.0/20".parse().unwrap()));
        for i in 0..10u8 {
            t.heard(Ipv4Addr::new(100, 64, 0, i), mac(1));
        }
        assert_eq!(t.learned().len(), LEARNED_PER_MAC);
        // A reload keeps the count: still no fifth; one of its addresses declared to another
        // MAC frees a place.
        t.set_reservations(&[]);
        t.heard(Ipv4Addr::new(100, 64, 0, 20), mac(1));
        assert_eq!(t.learned().len(), LEARNED_PER_MAC);
        let held = t.learned()[0].0;
        t.set_reservations(&[Reservation {
            mac: Mac(mac(7)),
            vip: held,
            vip6: None,
            legacy: Some(Ipv4Addr::new(192, 0, 2, 1)),
            hostname: None,
            groups: Vec::new(),
        }]);
        t.heard(Ipv4Addr::new(100, 64, 0, 20), mac(1));
        assert_eq!(t.leased_mac(Ipv4Addr::new(100, 64, 0, 20)), Some(mac(1)));
        assert_eq!(t.learned().len(), LEARNED_PER_MAC);
        t.set_reservations(&[]);
        for i in 0..=u16::try_from(LEARNED_MAX).unwrap() {
            let [hi, lo] = i.to_be_bytes();
            t.heard(Ipv4Addr::new(100, 64, 4 + hi, lo), [2, 1, 0, 0, hi, lo]);
        }
        assert_eq!(t.learned().len(), LEARNED_MAX);
        // Each learning block has its own bound: a full one leaves another's room.
        let t = LanTable::new(&[]).learning([
            "100.64.0.0/20".parse().unwrap(),
            "100.64.16.0/28".parse().unwrap(),
        ]);
        for i in 0..=u16::try_from(LEARNED_MAX).unwrap() {
            let [hi, lo] = i.to_be_bytes();
            t.heard(Ipv4Addr::new(100, 64, 4 + hi, lo), [2, 1, 0, 0, hi, lo]);
        }
        t.heard(Ipv4Addr::new(100, 64, 16, 5), mac(5));
        assert_eq!(t.learned().len(), LEARNED_MAX + 1);
        assert_eq!(t.leased_mac(Ipv4Addr::new(100, 64, 16, 5)), Some(mac(5)));

        let t = LanTable::new(&[]).learning(Some("100.64.1.0/24".parse().unwrap()));
        t.heard(onto(20), mac(1));
        t.heard(onto(21), mac(2));
        let declared = |ip, n| Reservation {
            mac: Mac(mac(n)),
            vip: ip,
            vip6: None,
            legacy: Some(Ipv4Addr::new(192, 0, 2, 1)),
            hostname: None,
            groups: Vec::new(),
        };
        t.set_reservations(&[declared(onto(20), 9), declared(onto(30), 2)]);
        assert_eq!(t.leased_mac(onto(20)), Some(mac(9)), "declared at .20");
        assert_eq!(t.leased_mac(onto(21)), None, "mac 2 is declared at .30");
        t.heard(onto(22), mac(2));
        assert_eq!(
            t.leased_mac(onto(22)),
            None,
            "a declared MAC learns nothing"
        );
        assert!(t.learned().is_empty());
    }
}

//! Which peer's block holds an address: longest-prefix match over the peers' IPv4 and IPv6
//! blocks, looked up for every packet an end sends.
//!
//! One hash map per prefix length, longest first, a table per family: a lookup costs one
//! hash probe per length in use in its family (a handful: /32 nodes and /24 sites; /128 and
//! /56), whatever the number of peers. A list scanned in order cost one comparison per peer,
//! which at 10,000 peers was 10,000 for a packet to a /24 behind all the /32s (issue 24).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::ops::BitAnd;

use ipnet::IpNet;

/// Peers by block, for both families. Of two peers with the same block, the one added first
/// answers (the other answers once it leaves); a longer prefix wins over a shorter one that
/// also holds the address.
#[derive(Debug, Default)]
pub struct Routes {
    v4: Table<u32>,
    v6: Table<u128>,
}

/// An address of one family as a number (u32 for IPv4, u128 for IPv6).
trait Bits: Copy + Eq + Hash + BitAnd<Output = Self> {
    /// The mask of a prefix of length `len`.
    fn mask(len: u8) -> Self;
}

impl Bits for u32 {
    fn mask(len: u8) -> Self {
        Self::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
    }
}

impl Bits for u128 {
    fn mask(len: u8) -> Self {
        Self::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
    }
}

/// One family's blocks: (prefix length, network address -> peers with that block, oldest
/// first), longest prefix first. No empty map is kept.
#[derive(Debug)]
struct Table<K> {
    by_len: Vec<(u8, Blocks<K>)>,
}

impl<K> Default for Table<K> {
    fn default() -> Self {
        Self { by_len: Vec::new() }
    }
}

/// The blocks of one prefix length: network address -> peers, oldest first.
type Blocks<K> = HashMap<K, Vec<u32>, foldhash::fast::RandomState>;

impl<K: Bits> Table<K> {
    fn insert(&mut self, network: K, len: u8, id: u32) {
        let at = match self.by_len.binary_search_by(|(l, _)| len.cmp(l)) {
            Ok(at) => at,
            Err(at) => {
                self.by_len.insert(at, (len, HashMap::default()));
                at
            }
        };
        self.by_len[at].1.entry(network).or_default().push(id);
    }

    fn remove(&mut self, network: K, len: u8, id: u32) {
        let Ok(at) = self.by_len.binary_search_by(|(l, _)| len.cmp(l)) else {
            return;
        };
        let map = &mut self.by_len[at].1;
        if let Some(ids) = map.get_mut(&network) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                map.remove(&network);
            }
        }
        if map.is_empty() {
            self.by_len.remove(at);
        }
    }

    fn lookup(&self, addr: K) -> Option<u32> {
        self.by_len
            .iter()
            .find_map(|(len, map)| map.get(&(addr & K::mask(*len)))?.first().copied())
    }
}

impl Routes {
    /// Routes `net` to peer `id`.
    pub fn insert(&mut self, net: IpNet, id: u32) {
        match net.trunc() {
            IpNet::V4(n) => self.v4.insert(n.network().to_bits(), n.prefix_len(), id),
            IpNet::V6(n) => self.v6.insert(n.network().to_bits(), n.prefix_len(), id),
        }
    }

    /// Stops routing `net` to peer `id`.
    pub fn remove(&mut self, net: IpNet, id: u32) {
        match net.trunc() {
            IpNet::V4(n) => self.v4.remove(n.network().to_bits(), n.prefix_len(), id),
            IpNet::V6(n) => self.v6.remove(n.network().to_bits(), n.prefix_len(), id),
        }
    }

    /// The peer whose block holds `dst` (the longest such block of its family).
    pub fn lookup(&self, dst: IpAddr) -> Option<u32> {
        match dst {
            IpAddr::V4(a) => self.v4.lookup(a.to_bits()),
            IpAddr::V6(a) => self.v6.lookup(a.to_bits()),
        }
    }

    /// Whether no block is routed.
    pub fn is_empty(&self) -> bool {
        self.v4.by_len.is_empty() && self.v6.by_len.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::Ipv4Addr;

    use ipnet::Ipv4Net;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// What the list the table replaces answered: the first of the longest blocks holding
    /// the address, in the order added.
    fn reference(routes: &[(Ipv4Net, u32)], dst: Ipv4Addr) -> Option<u32> {
        let mut sorted = routes.to_vec();
        sorted.sort_by_key(|(n, _)| std::cmp::Reverse(n.prefix_len()));
        sorted
            .iter()
            .find(|(n, _)| n.contains(&dst))
            .map(|(_, i)| *i)
    }

    #[test]
    fn the_longest_block_answers_and_the_first_added_of_equals() {
        let mut r = Routes::default();
        r.insert(net("100.64.0.0/10"), 1);
        r.insert(net("100.64.2.0/24"), 2);
        r.insert(net("100.64.2.7/32"), 3);
        r.insert(net("100.64.2.0/24"), 4);
        r.insert(net("0.0.0.0/0"), 5);
        assert_eq!(at(&r, "100.64.2.7"), Some(3));
        assert_eq!(at(&r, "100.64.2.8"), Some(2));
        assert_eq!(at(&r, "100.70.0.1"), Some(1));
        assert_eq!(at(&r, "192.0.2.1"), Some(5));
        r.remove(net("100.64.2.0/24"), 2);
        r.remove(net("0.0.0.0/0"), 5);
        assert_eq!(
            at(&r, "100.64.2.8"),
            Some(4),
            "the other peer of that block"
        );
        assert_eq!(at(&r, "192.0.2.1"), None);
        r.remove(net("100.64.2.7/32"), 3);
        r.remove(net("100.64.2.0/24"), 4);
        r.remove(net("100.64.0.0/10"), 1);
        assert!(r.is_empty(), "nothing empty is kept: {r:?}");
    }

    /// IPv6 as IPv4 (a site's /56, a node's /128 in it), each family apart: an IPv6 block
    /// whose bits an IPv4 address shares answers nothing for it.
    #[test]
    fn ipv6_blocks_route_as_ipv4_ones_and_apart_from_them() {
        let mut r = Routes::default();
        r.insert(net("fd7a:0:1:100::/56"), 1);
        r.insert(net("fd7a:0:1:100::9/128"), 2);
        r.insert(net("::/96"), 3);
        r.insert(net("100.64.1.0/24"), 4);
        assert_eq!(at(&r, "fd7a:0:1:1ff::1"), Some(1));
        assert_eq!(at(&r, "fd7a:0:1:100::9"), Some(2));
        assert_eq!(at(&r, "fd7a:0:1:200::1"), None);
        assert_eq!(at(&r, "::100.64.1.7"), Some(3));
        assert_eq!(at(&r, "100.64.1.7"), Some(4));
        assert_eq!(
            at(&r, "100.64.2.7"),
            None,
            "not ::/96's, though its bits are"
        );
        r.remove(net("fd7a:0:1:100::9/128"), 2);
        assert_eq!(at(&r, "fd7a:0:1:100::9"), Some(1));
        for (n, id) in [("fd7a:0:1:100::/56", 1), ("::/96", 3), ("100.64.1.0/24", 4)] {
            r.remove(net(n), id);
        }
        assert!(r.is_empty(), "{r:?}");
    }

    fn at(r: &Routes, s: &str) -> Option<u32> {
        r.lookup(s.parse().unwrap_or_else(|e| panic!("{s}: {e}")))
    }

    /// Against the list it replaced, on random tables, additions and removals.
    #[test]
    fn it_answers_as_the_ordered_list_did() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(24);
        for _ in 0..50 {
            let mut r = Routes::default();
            let mut list: Vec<(Ipv4Net, u32)> = Vec::new();
            for id in 0..200u32 {
                // Blocks inside 100.64.0.0/16 so that they overlap often.
                let len = rng.random_range(16..=32u8);
                let addr = Ipv4Addr::from(0x6440_0000 | (rng.random::<u32>() & 0xffff));
                let n = Ipv4Net::new(addr, len)
                    .unwrap_or_else(|_| unreachable!())
                    .trunc();
                r.insert(n.into(), id);
                list.push((n, id));
                if rng.random_bool(0.3) {
                    let (n, gone) = list.remove(rng.random_range(0..list.len()));
                    r.remove(n.into(), gone);
                }
            }
            for _ in 0..2000 {
                let dst = Ipv4Addr::from(0x6440_0000 | (rng.random::<u32>() & 0xffff));
                assert_eq!(r.lookup(dst.into()), reference(&list, dst), "{dst}");
            }
        }
    }
}

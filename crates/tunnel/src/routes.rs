//! Which peer's block holds an address: longest-prefix match over the peers' IPv4 blocks,
//! looked up for every packet the adapter sends.
//!
//! One hash map per prefix length, longest first: a lookup costs one hash probe per length
//! in use (a handful: /32 nodes, /24 sites), whatever the number of peers. A list scanned
//! in order cost one comparison per peer, which at 10,000 peers was 10,000 for a packet to
//! a /24 behind all the /32s (issue 24).

use std::collections::HashMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// Peers by block. Of two peers with the same block, the one added first answers (the other
/// answers once it leaves); a longer prefix wins over a shorter one that also holds the
/// address.
#[derive(Debug, Default)]
pub struct Routes {
    /// (prefix length, network address -> peers with that block, oldest first), longest
    /// prefix first. No empty map is kept.
    by_len: Vec<(u8, Blocks)>,
}

/// The blocks of one prefix length: network address -> peers, oldest first.
type Blocks = HashMap<u32, Vec<u32>, foldhash::fast::RandomState>;

fn mask(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

impl Routes {
    /// Routes `net` to peer `id`.
    pub fn insert(&mut self, net: Ipv4Net, id: u32) {
        let len = net.prefix_len();
        let at = match self.by_len.binary_search_by(|(l, _)| len.cmp(l)) {
            Ok(at) => at,
            Err(at) => {
                self.by_len.insert(at, (len, HashMap::default()));
                at
            }
        };
        self.by_len[at]
            .1
            .entry(u32::from(net.network()))
            .or_default()
            .push(id);
    }

    /// Stops routing `net` to peer `id`.
    pub fn remove(&mut self, net: Ipv4Net, id: u32) {
        let len = net.prefix_len();
        let Ok(at) = self.by_len.binary_search_by(|(l, _)| len.cmp(l)) else {
            return;
        };
        let map = &mut self.by_len[at].1;
        let key = u32::from(net.network());
        if let Some(ids) = map.get_mut(&key) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                map.remove(&key);
            }
        }
        if map.is_empty() {
            self.by_len.remove(at);
        }
    }

    /// The peer whose block holds `dst` (the longest such block).
    pub fn lookup(&self, dst: Ipv4Addr) -> Option<u32> {
        let addr = u32::from(dst);
        self.by_len
            .iter()
            .find_map(|(len, map)| map.get(&(addr & mask(*len)))?.first().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
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
        let at = |s: &str| r.lookup(s.parse().unwrap_or(Ipv4Addr::UNSPECIFIED));
        assert_eq!(at("100.64.2.7"), Some(3));
        assert_eq!(at("100.64.2.8"), Some(2));
        assert_eq!(at("100.70.0.1"), Some(1));
        assert_eq!(at("192.0.2.1"), Some(5));
        r.remove(net("100.64.2.0/24"), 2);
        r.remove(net("0.0.0.0/0"), 5);
        let at = |s: &str| r.lookup(s.parse().unwrap_or(Ipv4Addr::UNSPECIFIED));
        assert_eq!(at("100.64.2.8"), Some(4), "the other peer of that block");
        assert_eq!(at("192.0.2.1"), None);
        r.remove(net("100.64.2.7/32"), 3);
        r.remove(net("100.64.2.0/24"), 4);
        r.remove(net("100.64.0.0/10"), 1);
        assert!(r.by_len.is_empty(), "nothing empty is kept: {r:?}");
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
                r.insert(n, id);
                list.push((n, id));
                if rng.random_bool(0.3) {
                    let (n, gone) = list.remove(rng.random_range(0..list.len()));
                    r.remove(n, gone);
                }
            }
            for _ in 0..2000 {
                let dst = Ipv4Addr::from(0x6440_0000 | (rng.random::<u32>() & 0xffff));
                assert_eq!(r.lookup(dst), reference(&list, dst), "{dst}");
            }
        }
    }
}

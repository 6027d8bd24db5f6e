//! Session indices: the 32-bit numbers a receiver picks in a handshake, which every frame to
//! it carries in clear (docs/protocol.md §1). They are random and unique among one device's
//! live sessions and pending handshakes, so that nobody who has not seen a frame can name a
//! session: a blind sweep over indices finds nothing to forge against, and an index says
//! nothing about which peer it belongs to.
//!
//! [`Indices`] is the device-wide table (index to peer id); a [`LocalIndex`] holds one entry
//! and gives it back when dropped, so an index lives exactly as long as the handshake or the
//! keys that answer to it (keys still in flight on a worker included).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The device-wide table of live session indices. Share it (`Arc`) between the peers that
/// allocate from it and the data path that looks frames up in it.
pub struct Indices {
    peers: RwLock<HashMap<u32, u32>>,
    rng: Mutex<StdRng>,
}

impl fmt::Debug for Indices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Indices")
            .field("live", &self.len())
            .finish_non_exhaustive()
    }
}

impl Indices {
    /// An empty table drawing from a generator seeded by the operating system.
    pub fn new() -> Arc<Self> {
        Self::with_rng(StdRng::from_os_rng())
    }

    /// An empty table with a reproducible sequence, for simulations. Never in a product:
    /// its indices can be predicted.
    pub fn seeded(seed: u64) -> Arc<Self> {
        Self::with_rng(StdRng::seed_from_u64(seed))
    }

    fn with_rng(rng: StdRng) -> Arc<Self> {
        Arc::new(Self {
            peers: RwLock::new(HashMap::new()),
            rng: Mutex::new(rng),
        })
    }

    /// The peer id that owns `index`, if the index is live.
    pub fn peer_of(&self, index: u32) -> Option<u32> {
        self.peers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&index)
            .copied()
    }

    /// Live indices.
    pub fn len(&self) -> usize {
        self.peers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no index is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A fresh random index for `peer`, neither 0 (handshake initiations carry 0) nor live.
    pub(crate) fn allocate(self: &Arc<Self>, peer: u32) -> LocalIndex {
        let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        let mut peers = self.peers.write().unwrap_or_else(PoisonError::into_inner);
        // With at most a few indices per peer the table is almost empty: a draw collides with
        // a live index with probability below 2^-16 even at ten thousand peers.
        let value = loop {
            let candidate: u32 = rng.random();
            if candidate != 0 && !peers.contains_key(&candidate) {
                break candidate;
            }
        };
        peers.insert(value, peer);
        LocalIndex {
            value,
            table: self.clone(),
        }
    }

    fn release(&self, index: u32) {
        self.peers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&index);
    }
}

/// One live index; released when dropped.
pub(crate) struct LocalIndex {
    value: u32,
    table: Arc<Indices>,
}

impl LocalIndex {
    pub(crate) const fn value(&self) -> u32 {
        self.value
    }
}

impl fmt::Debug for LocalIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.value)
    }
}

impl Drop for LocalIndex {
    fn drop(&mut self) {
        self.table.release(self.value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_unique_nonzero_and_released_on_drop() {
        let table = Indices::seeded(7);
        let held: Vec<_> = (0..10_000).map(|i| table.allocate(i % 7)).collect();
        let mut values: Vec<u32> = held.iter().map(LocalIndex::value).collect();
        values.sort_unstable();
        values.dedup();
        assert_eq!(values.len(), 10_000);
        assert!(!values.contains(&0));
        assert_eq!(table.peer_of(held[12].value()), Some(12 % 7));
        let gone = held[3].value();
        drop(held);
        assert!(table.is_empty());
        assert_eq!(table.peer_of(gone), None);
    }

    #[test]
    fn indices_carry_no_peer_structure() {
        // The old scheme was `peer << 8 | generation`: consecutive indices of one peer shared
        // their high 24 bits. Random ones spread over the whole range.
        let table = Indices::new();
        let a: Vec<_> = (0..64).map(|_| table.allocate(1)).collect();
        let high: std::collections::HashSet<u32> = a.iter().map(|i| i.value() >> 8).collect();
        assert!(high.len() > 60, "{high:?}");
        assert!(a.iter().any(|i| i.value() >> 24 != 0));
    }
}

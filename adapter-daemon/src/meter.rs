//! What each device sends and receives through the tunnel, for the members' reports
//! (docs/protocol.md §8, *Devices and tunnels*): counters per device MAC, a slot each.
//!
//! The services give the devices their slots ([`Meter::track`]); the data threads add to
//! them in runs ([`Tally`]): consecutive packets of one device cost one lookup and one add,
//! so that a bulk flow pays per batch, not per packet. A MAC without a slot (not a device the
//! services know, or beyond [`SLOTS`]) is not counted.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{PoisonError, RwLock};

/// Devices counted at most: as many as a report carries.
pub const SLOTS: usize = cyphonic_control::report::MAX_DEVICES;

/// One direction of one device.
#[derive(Debug, Default)]
#[repr(align(32))]
struct Side {
    bytes: AtomicU64,
    packets: AtomicU64,
    /// The last flush with packets in it, unix seconds (0: none).
    seen: AtomicU64,
}

impl Side {
    fn reset(&self) {
        for a in [&self.bytes, &self.packets, &self.seen] {
            a.store(0, Relaxed);
        }
    }
}

/// Which way a packet went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// From the device towards the tunnel (the capture threads).
    FromDevice,
    /// From the tunnel to the device (the ingress emitter).
    ToDevice,
}

/// One device's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Bytes of IP packets from it towards the tunnel.
    pub tx_bytes: u64,
    /// Those packets.
    pub tx_packets: u64,
    /// Bytes of IP packets delivered to it.
    pub rx_bytes: u64,
    /// Those packets.
    pub rx_packets: u64,
    /// The last packet from it, unix seconds.
    pub seen: Option<u64>,
}

/// The devices' counters.
#[derive(Debug)]
pub struct Meter {
    /// Each tracked MAC's slot.
    slots: RwLock<HashMap<[u8; 6], usize>>,
    /// Apart, so that the capture threads and the emitter never write one cache line.
    from_device: Box<[Side]>,
    to_device: Box<[Side]>,
}

impl Default for Meter {
    fn default() -> Self {
        Self::with_slots(SLOTS)
    }
}

impl Meter {
    /// A meter of `n` slots.
    pub fn with_slots(n: usize) -> Self {
        let sides = || (0..n).map(|_| Side::default()).collect();
        Self {
            slots: RwLock::new(HashMap::with_capacity(n)),
            from_device: sides(),
            to_device: sides(),
        }
    }

    /// Counts these devices from now on, and no others: a MAC still tracked keeps its slot
    /// and counts; a MAC no longer in `macs` frees its slot (its counts are gone); a new one
    /// takes a free slot, starting at zero, while there is one.
    pub fn track(&self, macs: impl IntoIterator<Item = [u8; 6]>) {
        let wanted: std::collections::HashSet<[u8; 6]> = macs.into_iter().collect();
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        if slots.len() == wanted.len() && wanted.iter().all(|m| slots.contains_key(m)) {
            return;
        }
        slots.retain(|mac, slot| {
            let keep = wanted.contains(mac);
            if !keep {
                self.from_device[*slot].reset();
                self.to_device[*slot].reset();
            }
            keep
        });
        let mut used = vec![false; self.from_device.len()];
        for slot in slots.values() {
            used[*slot] = true;
        }
        let mut free = used
            .iter()
            .enumerate()
            .filter(|(_, u)| !**u)
            .map(|(i, _)| i);
        let mut new: Vec<_> = wanted
            .into_iter()
            .filter(|m| !slots.contains_key(m))
            .collect();
        new.sort_unstable();
        for mac in new {
            let Some(slot) = free.next() else { break };
            slots.insert(mac, slot);
        }
    }

    /// `mac`'s counts, if it is tracked.
    pub fn counts(&self, mac: [u8; 6]) -> Option<Counts> {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        let slot = *slots.get(&mac)?;
        let (tx, rx) = (&self.from_device[slot], &self.to_device[slot]);
        let seen = tx.seen.load(Relaxed);
        Some(Counts {
            tx_bytes: tx.bytes.load(Relaxed),
            tx_packets: tx.packets.load(Relaxed),
            rx_bytes: rx.bytes.load(Relaxed),
            rx_packets: rx.packets.load(Relaxed),
            seen: (seen > 0).then_some(seen),
        })
    }

    fn add(&self, way: Way, mac: [u8; 6], (bytes, packets): (u64, u64), unix: u64) {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        let Some(&slot) = slots.get(&mac) else {
            return;
        };
        let side = match way {
            Way::FromDevice => &self.from_device[slot],
            Way::ToDevice => &self.to_device[slot],
        };
        side.bytes.fetch_add(bytes, Relaxed);
        side.packets.fetch_add(packets, Relaxed);
        side.seen.store(unix, Relaxed);
    }
}

/// A data thread's run of packets of one device, added to the [`Meter`] when another
/// device's packet comes or the batch ends ([`Tally::flush`]).
#[derive(Debug, Default)]
pub struct Tally {
    run: Cell<([u8; 6], u64, u64)>,
}

impl Tally {
    /// No run yet.
    pub const fn new() -> Self {
        Self {
            run: Cell::new(([0; 6], 0, 0)),
        }
    }

    /// A packet of `bytes` from or to `mac`.
    pub fn count(&self, meter: &Meter, way: Way, mac: [u8; 6], bytes: usize) {
        let (run_mac, _, packets) = self.run.get();
        if packets > 0 && run_mac != mac {
            self.flush(meter, way);
        }
        let (_, b, p) = self.run.get();
        self.run.set((mac, b + bytes as u64, p + 1));
    }

    /// Adds the run so far to `meter`.
    pub fn flush(&self, meter: &Meter, way: Way) {
        let (mac, bytes, packets) = self.run.take();
        if packets > 0 {
            meter.add(way, mac, (bytes, packets), cyphonic_settings::now_secs());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
    const C: [u8; 6] = [2, 0, 0, 0, 0, 0xc];

    /// Runs of one device are counted whole, each direction apart, across device changes
    /// and flushes; an untracked MAC counts nowhere.
    #[test]
    fn runs_are_counted_per_device_and_direction() {
        let meter = Meter::with_slots(4);
        meter.track([A, B]);
        let (tx, rx) = (Tally::default(), Tally::default());
        for (mac, len) in [(A, 100), (A, 200), (B, 50), (C, 999), (A, 1)] {
            tx.count(&meter, Way::FromDevice, mac, len);
        }
        rx.count(&meter, Way::ToDevice, B, 1500);
        // Nothing of the last runs is in before their flush.
        assert_eq!(meter.counts(A).unwrap().tx_packets, 2);
        tx.flush(&meter, Way::FromDevice);
        rx.flush(&meter, Way::ToDevice);
        let a = meter.counts(A).unwrap();
        assert_eq!((a.tx_bytes, a.tx_packets, a.rx_bytes), (301, 3, 0));
        assert!(a.seen.is_some());
        let b = meter.counts(B).unwrap();
        assert_eq!((b.tx_bytes, b.tx_packets), (50, 1));
        assert_eq!((b.rx_bytes, b.rx_packets), (1500, 1));
        assert_eq!(meter.counts(C), None);
    }

    /// A device that goes frees its slot, whose counts start again at zero for the device
    /// that takes it; the slots are bounded, and one that stays keeps its counts.
    #[test]
    fn slots_are_bounded_and_freed_with_their_device() {
        let meter = Meter::with_slots(2);
        meter.track([A, B, C]);
        let tracked = [A, B, C]
            .iter()
            .filter(|m| meter.counts(**m).is_some())
            .count();
        assert_eq!(tracked, 2, "two slots");
        let t = Tally::default();
        t.count(&meter, Way::FromDevice, A, 10);
        t.count(&meter, Way::FromDevice, B, 20);
        t.flush(&meter, Way::FromDevice);
        meter.track([B, C]);
        assert_eq!(meter.counts(A), None);
        assert_eq!(meter.counts(B).unwrap().tx_bytes, 20);
        assert_eq!(meter.counts(C), Some(Counts::default()));
        meter.track([A, C]);
        assert_eq!(meter.counts(A), Some(Counts::default()));
    }
}

//! Packet buffers: a fixed ceiling, allocated on first use and recycled, so the data plane
//! makes no allocation per packet and its memory never grows with load.
//!
//! Layout of a buffer on the way out (egress): the captured Ethernet frame starts at byte 2,
//! so its IP packet starts at byte 16, right behind room for the tunnel header; the tag goes
//! after the packet. On the way in: the datagram starts at byte 0, its inner IP packet at 16,
//! and the Ethernet header is written over bytes 2..16. Neither direction copies the packet.

use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_channel::{Receiver, Sender};

/// Bytes per buffer.
pub const BUF_LEN: usize = 2048;
/// Where a captured frame starts, so that its IP packet lands on the tunnel header's end.
pub const FRAME_OFFSET: usize = 2;

/// One packet buffer.
pub type Buf = Box<[u8; BUF_LEN]>;

/// The buffer pool.
#[derive(Debug)]
pub struct Pool {
    free_tx: Sender<Buf>,
    free_rx: Receiver<Buf>,
    allocated: AtomicUsize,
    ceiling: usize,
}

impl Pool {
    /// A pool that will hold at most `ceiling` buffers.
    pub fn new(ceiling: usize) -> Self {
        let (free_tx, free_rx) = crossbeam_channel::bounded(ceiling);
        Self {
            free_tx,
            free_rx,
            allocated: AtomicUsize::new(0),
            ceiling,
        }
    }

    /// A free buffer, or None when all `ceiling` buffers are in use (drop at the edge).
    pub fn take(&self) -> Option<Buf> {
        if let Ok(b) = self.free_rx.try_recv() {
            return Some(b);
        }
        let grew = self
            .allocated
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.ceiling).then_some(n + 1)
            })
            .is_ok();
        grew.then(|| Box::new([0u8; BUF_LEN]))
    }

    /// Gives a buffer back.
    pub fn put(&self, buf: Buf) {
        // The channel holds `ceiling` buffers and no more than that many exist.
        let _ = self.free_tx.try_send(buf);
    }

    /// Buffers allocated so far (the high-water mark of use).
    pub fn allocated(&self) -> usize {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Buffers currently free.
    pub fn free(&self) -> usize {
        self.free_rx.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_holds_and_buffers_recycle() {
        let pool = Pool::new(3);
        let bufs: Vec<Buf> = (0..3).map(|_| pool.take().unwrap()).collect();
        assert!(
            pool.take().is_none(),
            "a fourth buffer would exceed the ceiling"
        );
        for b in bufs {
            pool.put(b);
        }
        assert_eq!((pool.allocated(), pool.free()), (3, 3));
        assert!(pool.take().is_some());
        assert_eq!(pool.allocated(), 3);
    }
}

//! Packet buffers: a fixed ceiling, allocated on first use and recycled, so the data plane
//! makes no allocation per packet and its memory never grows with load.
//!
//! Layout of a buffer on the way out (egress): the IP packet starts at byte 16
//! ([`crate::HEADROOM`]), right behind room for the tunnel header; the tag goes after the
//! packet. (The adapter captures whole Ethernet frames at byte 2 so that their IP packet lands
//! there; the node reads IP packets from TUN straight to byte 16.) On the way in: the datagram
//! starts at byte 0, its inner IP packet at 16; the adapter writes an Ethernet header over
//! bytes 2..16. Neither direction copies the packet.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_channel::{Receiver, Sender};

/// Bytes per buffer.
pub const BUF_LEN: usize = 2048;
/// Frames or datagrams a receive thread reads per system call.
pub const RECV_BATCH: usize = 32;

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

/// A receive thread's buffers between system calls: topped up from the pool, handed to the
/// socket each sliced to `range`; the filled ones leave, the rest wait for the next call.
#[derive(Debug)]
pub struct RecvBuffers {
    bufs: Vec<Buf>,
    range: Range<usize>,
}

impl RecvBuffers {
    /// Buffers whose `range` the socket writes into.
    pub fn new(range: Range<usize>) -> Self {
        Self {
            bufs: Vec::with_capacity(RECV_BATCH),
            range,
        }
    }

    /// Tops up to [`RECV_BATCH`] buffers from `pool` and lets `recv` fill them. Returns the
    /// filled buffers in order, or None when the pool had no buffer at all.
    pub fn receive(
        &mut self,
        pool: &Pool,
        recv: impl FnOnce(&mut [&mut [u8]]) -> io::Result<usize>,
    ) -> Option<io::Result<std::vec::Drain<'_, Buf>>> {
        while self.bufs.len() < RECV_BATCH {
            match pool.take() {
                Some(b) => self.bufs.push(b),
                None => break,
            }
        }
        if self.bufs.is_empty() {
            return None;
        }
        let mut slices: [&mut [u8]; RECV_BATCH] = Default::default();
        let count = self.bufs.len();
        for (slot, b) in slices.iter_mut().zip(self.bufs.iter_mut()) {
            *slot = &mut b[self.range.clone()];
        }
        Some(recv(&mut slices[..count]).map(|n| self.bufs.drain(..n.min(count))))
    }

    /// Gives every buffer back (at shutdown).
    pub fn release(self, pool: &Pool) {
        for b in self.bufs {
            pool.put(b);
        }
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

    #[test]
    fn receive_keeps_the_unfilled_buffers() {
        let pool = Pool::new(100);
        let mut rx = RecvBuffers::new(2..10);
        let filled: Vec<Buf> = rx
            .receive(&pool, |slices| {
                assert_eq!((slices.len(), slices[0].len()), (RECV_BATCH, 8));
                slices[0][0] = 7;
                Ok(3)
            })
            .unwrap()
            .unwrap()
            .collect();
        assert_eq!(filled.len(), 3);
        assert_eq!(filled[0][2], 7);
        assert_eq!(
            pool.allocated(),
            RECV_BATCH,
            "the unfilled ones wait, no new allocation"
        );
        let again = rx.receive(&pool, |_| Ok(0)).unwrap().unwrap().count();
        assert_eq!((again, pool.allocated()), (0, RECV_BATCH + 3));
        let empty = Pool::new(0);
        assert!(RecvBuffers::new(0..1).receive(&empty, |_| Ok(0)).is_none());
    }
}

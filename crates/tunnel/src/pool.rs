//! Packet buffers: a fixed ceiling, allocated on first use and recycled, so the data plane
//! makes no allocation per packet and its memory never grows with load.
//!
//! A [`Buf`] is an owned value that goes back to its pool when it is dropped: no
//! path hands a buffer back by hand, so an early return or a dropped packet cannot
//! leak pool capacity. Every buffer holds a reference to its pool's free list, so a buffer
//! cannot outlive the pool it came from, whichever is dropped first.
//!
//! Layout of a buffer on the way out (egress): the IP packet starts at byte 16
//! ([`crate::HEADROOM`]), right behind room for the tunnel header; the tag goes after the
//! packet. (The adapter captures whole Ethernet frames at [`FRAME_OFFSET`] so that their IP
//! packet lands there; the node reads IP packets from TUN straight to byte 16.) On the way in:
//! the datagram starts at byte 0, its inner IP packet at 16; the adapter writes an Ethernet
//! header over bytes 2..16. Neither direction copies the packet.

use std::io;
use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_channel::{Receiver, Sender};

/// Bytes per buffer.
pub const BUF_LEN: usize = 2048;
/// Frames or datagrams a receive thread reads per system call.
pub const RECV_BATCH: usize = 32;
/// Bytes of an Ethernet header (destination, source, EtherType).
pub const ETHERNET_HEADER: usize = 14;
/// Where an Ethernet frame starts in a buffer so that its IP packet lands on
/// [`crate::HEADROOM`]: the adapter captures frames here, and writes the Ethernet header of a
/// delivered packet here.
pub const FRAME_OFFSET: usize = crate::HEADROOM - ETHERNET_HEADER;
/// The longest Ethernet frame a buffer holds at [`FRAME_OFFSET`], leaving room for the tag
/// after its IP packet.
pub const FRAME_ROOM: usize = BUF_LEN - cyphonic_wire::TAG_LEN - FRAME_OFFSET;
/// The longest IP packet a buffer holds behind the tunnel header, leaving room for the tag.
pub const PACKET_ROOM: Range<usize> = crate::HEADROOM..BUF_LEN - cyphonic_wire::TAG_LEN;

type Bytes = Box<[u8; BUF_LEN]>;

/// The free list: what a pool and each of its buffers share.
#[derive(Debug)]
struct FreeList {
    tx: Sender<Bytes>,
    rx: Receiver<Bytes>,
    allocated: AtomicUsize,
    ceiling: usize,
}

/// The buffer pool. Cloning gives another handle on the same pool.
#[derive(Debug, Clone)]
pub struct Pool {
    free: Arc<FreeList>,
}

impl Pool {
    /// A pool that will hold at most `ceiling` buffers.
    pub fn new(ceiling: usize) -> Self {
        let (tx, rx) = crossbeam_channel::bounded(ceiling);
        Self {
            free: Arc::new(FreeList {
                tx,
                rx,
                allocated: AtomicUsize::new(0),
                ceiling,
            }),
        }
    }

    /// A free buffer, or None when all `ceiling` buffers are in use (drop at the edge). Its
    /// bytes are whatever the last user left there.
    pub fn take(&self) -> Option<Buf> {
        let bytes = match self.free.rx.try_recv() {
            Ok(b) => b,
            Err(_) => {
                self.free
                    .allocated
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        (n < self.free.ceiling).then_some(n + 1)
                    })
                    .ok()?;
                Box::new([0u8; BUF_LEN])
            }
        };
        Some(Buf {
            bytes: Some(bytes),
            home: self.free.clone(),
        })
    }

    /// Buffers allocated so far (the high-water mark of use).
    pub fn allocated(&self) -> usize {
        self.free.allocated.load(Ordering::Relaxed)
    }

    /// Buffers currently free.
    pub fn free(&self) -> usize {
        self.free.rx.len()
    }

    /// Buffers in use now (allocated and not free).
    pub fn in_use(&self) -> usize {
        self.allocated().saturating_sub(self.free())
    }

    /// The most buffers this pool holds.
    pub fn ceiling(&self) -> usize {
        self.free.ceiling
    }
}

/// One packet buffer of [`BUF_LEN`] bytes; back to its pool when dropped.
pub struct Buf {
    /// `None` only inside `drop`.
    bytes: Option<Bytes>,
    home: Arc<FreeList>,
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Buf")
    }
}

impl Deref for Buf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.bytes {
            Some(b) => &b[..],
            None => &[],
        }
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.bytes {
            Some(b) => &mut b[..],
            None => &mut [],
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Some(bytes) = self.bytes.take() {
            // The free list holds `ceiling` buffers and no more than that many exist.
            let _ = self.home.tx.try_send(bytes);
        }
    }
}

/// A receive thread's buffers between system calls: topped up from the pool, handed to the
/// socket each sliced to `range`; the filled ones leave, the rest wait for the next call (and
/// go back to the pool when this is dropped).
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_holds_and_dropped_buffers_return() {
        let pool = Pool::new(3);
        let bufs: Vec<Buf> = (0..3).map(|_| pool.take().unwrap()).collect();
        assert!(
            pool.take().is_none(),
            "a fourth buffer would exceed the ceiling"
        );
        assert_eq!(pool.in_use(), 3);
        drop(bufs);
        assert_eq!((pool.allocated(), pool.free(), pool.in_use()), (3, 3, 0));
        let mut again = pool.take().unwrap();
        again[0] = 9;
        assert_eq!((again.len(), pool.allocated()), (BUF_LEN, 3));
    }

    /// A buffer keeps its pool's free list alive: dropping the pool first is harmless, and
    /// the buffer still goes back to the list a clone of the pool sees.
    #[test]
    fn a_buffer_cannot_outlive_its_pool() {
        let pool = Pool::new(2);
        let other = pool.clone();
        let buf = pool.take().unwrap();
        drop(pool);
        drop(buf);
        assert_eq!(other.free(), 1);
        let last = other.take().unwrap();
        drop(other);
        drop(last);
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
        drop(filled);
        let again = rx.receive(&pool, |_| Ok(0)).unwrap().unwrap().count();
        assert_eq!((again, pool.allocated()), (0, RECV_BATCH));
        drop(rx);
        assert_eq!(pool.in_use(), 0, "the waiting buffers went back");
        let empty = Pool::new(0);
        assert!(RecvBuffers::new(0..1).receive(&empty, |_| Ok(0)).is_none());
    }
}

//! A packet socket's receive ring (`PACKET_RX_RING`, `TPACKET_V3`): memory the kernel and
//! this process share, in blocks the kernel fills with frames one after another and hands
//! over whole. Reading a frame is no system call and no queueing of the frame's buffer on
//! the socket; a reader that finds a block waiting takes all of it without asking the
//! kernel anything, and hands the block back by writing its status.
//!
//! A block is handed over when it is full or, with frames in it, when its timer ([`RETIRE`])
//! expires: a frame that comes alone waits for the timer, up to a tick of the kernel's clock
//! (4 ms at `HZ=250`). That is the price of the blocks; a frame among many waits only for its
//! block to fill.
//!
//! The kernel-facing layout is `linux/if_packet.h`'s (libc's `tpacket_block_desc` and
//! `tpacket3_hdr`). What the kernel wrote is read with bounds checks all the same: a frame
//! whose offsets leave its block ends the block's reading, its frames and the rest of the
//! block's counted as lost ([`Ring::take_lost`]), never an access outside the mapping.

use std::io;
use std::mem::{offset_of, size_of};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::sys::setsockopt;

/// Bytes per block: a power of two of pages that holds the largest frame
/// ([`crate::LARGE_FRAME`]) with its headers, so that a coalesced frame is never cut.
pub(crate) const BLOCK: usize = 128 << 10;
/// The fewest and most blocks of a ring (the ring's size is a socket's `recv_buffer`, in
/// blocks).
const BLOCKS: std::ops::RangeInclusive<usize> = 4..=1024;
/// The block timer, milliseconds: the shortest the kernel takes (it rounds up to its tick).
const RETIRE: u32 = 1;
/// The frame size the kernel checks the request against; with `TPACKET_V3` frames take the
/// room they need, so it bounds nothing but the request's arithmetic.
const FRAME: usize = 2048;
/// Where the `sockaddr_ll` sits in a frame: after the header, aligned (`TPACKET_ALIGN`).
const ADDRESS_AT: usize = size_of::<libc::tpacket3_hdr>().next_multiple_of(libc::TPACKET_ALIGNMENT);
/// Where a block's status word is.
const STATUS_AT: usize =
    offset_of!(libc::tpacket_block_desc, hdr) + offset_of!(libc::tpacket_hdr_v1, block_status);

/// One frame as the kernel wrote it in a block.
#[derive(Debug)]
pub(crate) struct RingFrame<'a> {
    /// The frame's length on the wire (`tp_len`).
    pub(crate) len: usize,
    /// The bytes the ring holds of it (`tp_snaplen` of them; fewer if the kernel's offsets
    /// were out of the block, which the caller then counts as truncated).
    pub(crate) data: &'a [u8],
    /// `tp_status`: `TP_STATUS_CSUMNOTREADY`, `TP_STATUS_VLAN_VALID`, ...
    pub(crate) status: u32,
    /// The VLAN tag the NIC took off (valid with `TP_STATUS_VLAN_VALID`).
    pub(crate) vlan_tci: u32,
    /// `sll_pkttype` (`PACKET_OUTGOING` for our own frames).
    pub(crate) pkttype: u8,
    /// The receive stamp (`tp_sec`, `tp_nsec`).
    pub(crate) stamp: libc::timespec,
    /// The `head` bytes in front of the frame (its `virtio_net_hdr` with `PACKET_VNET_HDR`),
    /// if the block has them.
    pub(crate) head: Option<&'a [u8]>,
}

/// The mapped ring of one socket, and where its reader is in it.
#[derive(Debug)]
pub(crate) struct Ring {
    base: NonNull<u8>,
    blocks: usize,
    /// The block to read next: the kernel fills them in order, round the ring.
    block: usize,
    /// Within a block the kernel handed over and the reader has not finished: the offset of
    /// its next frame and how many are left.
    open: Option<(usize, u32)>,
    /// Frames given up because their block's offsets could not be followed, since the last
    /// [`Self::take_lost`].
    lost: std::cell::Cell<u64>,
}

// SAFETY: the mapping belongs to this value alone (it is never shared or cloned); moving it
// to another thread moves the only reader.
unsafe impl Send for Ring {}

impl Ring {
    /// Switches `fd` (a bound packet socket with no ring yet) to `TPACKET_V3` and maps a
    /// ring of about `bytes` (whole blocks, [`BLOCKS`] of them at least and at most).
    /// Offload headers (`PACKET_VNET_HDR`) must be asked for before: the kernel refuses them
    /// once a ring exists.
    pub(crate) fn attach(fd: libc::c_int, bytes: usize) -> io::Result<Self> {
        let version = libc::c_int::try_from(libc::tpacket_versions::TPACKET_V3 as u32)
            .expect("a small constant");
        setsockopt(fd, libc::SOL_PACKET, libc::PACKET_VERSION, &version)?;
        let blocks = (bytes / BLOCK).clamp(*BLOCKS.start(), *BLOCKS.end());
        let as_uint = |n: usize| libc::c_uint::try_from(n).expect("the ring's sizes fit");
        let req = libc::tpacket_req3 {
            tp_block_size: as_uint(BLOCK),
            tp_block_nr: as_uint(blocks),
            tp_frame_size: as_uint(FRAME),
            tp_frame_nr: as_uint(blocks * (BLOCK / FRAME)),
            tp_retire_blk_tov: RETIRE,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        setsockopt(fd, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
        // SAFETY: a fresh shared mapping of the ring the kernel just made for `fd`, at an
        // address the kernel picks; nothing else refers to that memory yet.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                blocks * BLOCK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(base.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Self {
            base,
            blocks,
            block: 0,
            open: None,
            lost: std::cell::Cell::new(0),
        })
    }

    /// The ring's size, bytes.
    pub(crate) const fn bytes(&self) -> usize {
        self.blocks * BLOCK
    }

    /// The status word of block `i`, shared with the kernel.
    fn status(&self, i: usize) -> &AtomicU32 {
        debug_assert!(i < self.blocks);
        // SAFETY: block `i` starts inside the mapping (i < blocks) at a page boundary, so its
        // status word is in bounds and 4-byte aligned; the kernel and we access it only as a
        // whole u32 (it writes, then we read with acquire; we write it back with release).
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(i * BLOCK + STATUS_AT).cast()) }
    }

    /// Block `i`'s bytes. Only for a block the kernel handed over and we have not handed back.
    fn block(&self, i: usize) -> &[u8] {
        // SAFETY: block `i` lies inside the mapping; while its status says it is ours the
        // kernel does not write to it, so a shared view of it does not race.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(i * BLOCK), BLOCK) }
    }

    /// Whether a frame is there to read without waiting.
    pub(crate) fn pending(&self) -> bool {
        self.open.is_some() || self.handed_over(self.block)
    }

    fn handed_over(&self, i: usize) -> bool {
        self.status(i).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }

    /// Gives `each` up to `most` frames, in the order they arrived, `head` bytes of offload
    /// header in front of each (0: none); returns how many. Blocks read to their end go back
    /// to the kernel at once.
    pub(crate) fn read(
        &mut self,
        most: usize,
        head: usize,
        mut each: impl FnMut(RingFrame<'_>),
    ) -> usize {
        let mut got = 0;
        while got < most {
            let (at, left) = match self.open {
                Some(open) => open,
                None if self.handed_over(self.block) => {
                    let desc = self.descriptor();
                    (desc.offset_to_first_pkt as usize, desc.num_pkts)
                }
                None => break,
            };
            if left == 0 {
                self.hand_back();
                continue;
            }
            let Some((frame, next)) = frame_at(self.block(self.block), at, head) else {
                // Offsets the block cannot hold: nothing more of it can be trusted.
                self.lost.set(self.lost.get() + u64::from(left));
                self.hand_back();
                continue;
            };
            each(frame);
            got += 1;
            self.open = Some((next, left - 1));
            if left == 1 || next == 0 {
                self.hand_back();
            }
        }
        got
    }

    /// Frames given up since the last call (see the module docs); reading resets the count.
    pub(crate) fn take_lost(&self) -> u64 {
        self.lost.take()
    }

    /// The header of the block being read.
    fn descriptor(&self) -> libc::tpacket_hdr_v1 {
        let at = offset_of!(libc::tpacket_block_desc, hdr);
        // SAFETY: the block is ours (handed over) and starts with a tpacket_block_desc,
        // whose `hdr` is a tpacket_hdr_v1 of plain integers; read unaligned for good measure.
        unsafe {
            std::ptr::read_unaligned(
                self.block(self.block)[at..at + size_of::<libc::tpacket_hdr_v1>()]
                    .as_ptr()
                    .cast(),
            )
        }
    }

    /// Hands the block being read back to the kernel and moves to the next.
    fn hand_back(&mut self) {
        self.status(self.block)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.block = (self.block + 1) % self.blocks;
        self.open = None;
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `attach`, of this size, unmapped once; no view of it
        // outlives `&self`. The socket is closed after (its field comes later).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes()) };
    }
}

/// The frame at offset `at` of `block` and the offset of the next (0: it is the block's
/// last); `None` if its header or offsets leave the block.
fn frame_at(block: &[u8], at: usize, head: usize) -> Option<(RingFrame<'_>, usize)> {
    let hdr_bytes = block.get(at..at.checked_add(size_of::<libc::tpacket3_hdr>())?)?;
    // SAFETY: `hdr_bytes` holds a whole tpacket3_hdr, plain integers: any bytes are a valid
    // one; read unaligned.
    let h: libc::tpacket3_hdr = unsafe { std::ptr::read_unaligned(hdr_bytes.as_ptr().cast()) };
    let mac = at.checked_add(usize::from(h.tp_mac))?;
    let wanted = mac.checked_add(h.tp_snaplen as usize)?;
    let data = block.get(mac..wanted)?;
    let head = if head == 0 {
        None
    } else {
        Some(block.get(mac.checked_sub(head)?..mac)?)
    };
    let address = block.get(at + ADDRESS_AT..at + ADDRESS_AT + size_of::<libc::sockaddr_ll>())?;
    let pkttype = address[offset_of!(libc::sockaddr_ll, sll_pkttype)];
    let next = match h.tp_next_offset as usize {
        0 => 0,
        step => at.checked_add(step).filter(|&n| n < block.len())?,
    };
    Some((
        RingFrame {
            len: h.tp_len as usize,
            data,
            status: h.tp_status,
            vlan_tci: h.hv1.tp_vlan_tci,
            pkttype,
            stamp: libc::timespec {
                tv_sec: libc::time_t::from(h.tp_sec),
                tv_nsec: libc::c_long::from(h.tp_nsec),
            },
            head,
        },
        next,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Ring {
        /// A ring of `blocks` over anonymous memory, for the kernel's part to be played by
        /// the test.
        fn anonymous(blocks: usize) -> Self {
            // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    blocks * BLOCK,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(base, libc::MAP_FAILED);
            Self {
                base: NonNull::new(base.cast()).unwrap(),
                blocks,
                block: 0,
                open: None,
                lost: std::cell::Cell::new(0),
            }
        }

        /// Block `i` as the kernel writes it.
        fn kernel_side(&mut self, i: usize) -> &mut [u8] {
            // SAFETY: block `i` lies inside the mapping; the test is the only other party.
            unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(i * BLOCK), BLOCK) }
        }

        /// Fills block `i` with `frames` (payload, `tp_status`, `sll_pkttype`), `head` bytes
        /// of 0xee in front of each, and hands it over.
        fn fill(&mut self, i: usize, frames: &[(&[u8], u32, u8)], head: usize) {
            let first = 64;
            let block = self.kernel_side(i);
            let mut at = first;
            for (k, (payload, status, pkttype)) in frames.iter().enumerate() {
                let mac = (ADDRESS_AT + size_of::<libc::sockaddr_ll>() + head)
                    .next_multiple_of(libc::TPACKET_ALIGNMENT);
                let size = (mac + payload.len()).next_multiple_of(libc::TPACKET_ALIGNMENT);
                let last = k + 1 == frames.len();
                let put = |block: &mut [u8], off: usize, bytes: &[u8]| {
                    block[at + off..at + off + bytes.len()].copy_from_slice(bytes);
                };
                let next = if last {
                    0
                } else {
                    u32::try_from(size).unwrap()
                };
                put(
                    block,
                    offset_of!(libc::tpacket3_hdr, tp_next_offset),
                    &next.to_ne_bytes(),
                );
                let len = u32::try_from(payload.len()).unwrap();
                put(
                    block,
                    offset_of!(libc::tpacket3_hdr, tp_snaplen),
                    &len.to_ne_bytes(),
                );
                put(
                    block,
                    offset_of!(libc::tpacket3_hdr, tp_len),
                    &(len + 7).to_ne_bytes(),
                );
                put(
                    block,
                    offset_of!(libc::tpacket3_hdr, tp_status),
                    &status.to_ne_bytes(),
                );
                put(
                    block,
                    offset_of!(libc::tpacket3_hdr, tp_mac),
                    &u16::try_from(mac).unwrap().to_ne_bytes(),
                );
                put(
                    block,
                    ADDRESS_AT + offset_of!(libc::sockaddr_ll, sll_pkttype),
                    &[*pkttype],
                );
                put(block, mac - head, &vec![0xee; head]);
                put(block, mac, payload);
                at += size;
            }
            let hdr = offset_of!(libc::tpacket_block_desc, hdr);
            let field = |f| hdr + f;
            block[field(offset_of!(libc::tpacket_hdr_v1, num_pkts))..][..4]
                .copy_from_slice(&u32::try_from(frames.len()).unwrap().to_ne_bytes());
            block[field(offset_of!(libc::tpacket_hdr_v1, offset_to_first_pkt))..][..4]
                .copy_from_slice(&u32::try_from(first).unwrap().to_ne_bytes());
            self.status(i)
                .store(libc::TP_STATUS_USER, Ordering::Release);
        }

        fn owned_by_kernel(&self, i: usize) -> bool {
            self.status(i).load(Ordering::Acquire) == libc::TP_STATUS_KERNEL
        }
    }

    fn read_all(ring: &mut Ring, most: usize, head: usize) -> Vec<(Vec<u8>, usize, u32, u8)> {
        let mut out = Vec::new();
        ring.read(most, head, |f| {
            if let Some(h) = f.head {
                assert!(h.iter().all(|&b| b == 0xee), "the head in front: {h:?}");
                assert_eq!(h.len(), head);
            }
            out.push((f.data.to_vec(), f.len, f.status, f.pkttype));
        });
        out
    }

    #[test]
    fn frames_come_in_order_and_blocks_go_back_once_read() {
        let mut ring = Ring::anonymous(4);
        assert!(!ring.pending());
        ring.fill(0, &[(b"one", 0, 0), (b"two", 8, 4)], 0);
        ring.fill(1, &[(b"three", 0, 0)], 0);
        assert!(ring.pending());
        // Two of three: block 0 read to its end goes back; block 1 is not touched.
        let got = read_all(&mut ring, 2, 0);
        assert_eq!(
            got,
            vec![(b"one".to_vec(), 10, 0, 0), (b"two".to_vec(), 10, 8, 4)]
        );
        assert!(ring.owned_by_kernel(0));
        assert!(!ring.owned_by_kernel(1));
        let got = read_all(&mut ring, 64, 0);
        assert_eq!(got, vec![(b"three".to_vec(), 12, 0, 0)]);
        assert!(ring.owned_by_kernel(1));
        assert!(!ring.pending());
        assert!(read_all(&mut ring, 64, 0).is_empty());
    }

    #[test]
    fn a_block_read_in_parts_resumes_where_it_stopped_and_the_ring_wraps() {
        let mut ring = Ring::anonymous(4);
        for round in 0..3u8 {
            for i in 0..4u8 {
                let a = [round, i, 0];
                let b = [round, i, 1];
                ring.fill(usize::from(i), &[(&a, 0, 0), (&b, 0, 0)], 10);
            }
            let mut seen = Vec::new();
            for _ in 0..8 {
                let got = read_all(&mut ring, 1, 10);
                assert_eq!(got.len(), 1);
                seen.push(got[0].0.clone());
                assert!(ring.pending() || seen.len() == 8);
            }
            let want: Vec<Vec<u8>> = (0..4u8)
                .flat_map(|i| [vec![round, i, 0], vec![round, i, 1]])
                .collect();
            assert_eq!(seen, want);
            assert!((0..4).all(|i| ring.owned_by_kernel(i)));
        }
    }

    #[test]
    fn offsets_outside_the_block_end_its_reading_without_a_frame() {
        let mut ring = Ring::anonymous(4);
        ring.fill(0, &[(b"fine", 0, 0), (b"bad", 0, 0)], 0);
        // The second frame claims more bytes than the block holds.
        let second = {
            let block = ring.kernel_side(0);
            let first = 64;
            let next = u32::from_ne_bytes(block[first..first + 4].try_into().unwrap()) as usize;
            first + next
        };
        let snaplen = second + offset_of!(libc::tpacket3_hdr, tp_snaplen);
        ring.kernel_side(0)[snaplen..snaplen + 4]
            .copy_from_slice(&u32::try_from(BLOCK).unwrap().to_ne_bytes());
        ring.fill(1, &[(b"after", 0, 0)], 0);
        let got = read_all(&mut ring, 64, 0);
        let data: Vec<_> = got.iter().map(|f| f.0.as_slice()).collect();
        assert_eq!(data, [&b"fine"[..], b"after"]);
        assert!(ring.owned_by_kernel(0) && ring.owned_by_kernel(1));
        assert_eq!(ring.take_lost(), 1, "the frame that could not be read");
        assert_eq!(ring.take_lost(), 0);
        // A first frame beyond the block: the block goes back, nothing read from it.
        ring.fill(2, &[(b"lost", 0, 0)], 0);
        let hdr = offset_of!(libc::tpacket_block_desc, hdr)
            + offset_of!(libc::tpacket_hdr_v1, offset_to_first_pkt);
        ring.kernel_side(2)[hdr..hdr + 4]
            .copy_from_slice(&u32::try_from(BLOCK - 8).unwrap().to_ne_bytes());
        assert!(read_all(&mut ring, 64, 0).is_empty());
        assert!(ring.owned_by_kernel(2));
        assert_eq!(ring.take_lost(), 1);
    }

    #[test]
    fn a_frame_s_head_must_lie_inside_its_block() {
        let block = vec![0u8; 256];
        let mut with_mac = block.clone();
        let mac = offset_of!(libc::tpacket3_hdr, tp_mac);
        with_mac[mac..mac + 2].copy_from_slice(&4u16.to_ne_bytes());
        // tp_mac 4 and a 10-byte head: the head would start before the frame's block.
        assert!(frame_at(&with_mac, 0, 10).is_none());
        assert!(frame_at(&with_mac, 0, 0).is_some());
        assert!(frame_at(&block, 250, 0).is_none(), "a header past the end");
    }
}

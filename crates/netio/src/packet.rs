//! The internal NIC: an `AF_PACKET` socket that sees every frame and can inject frames.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::busy::{self, BusyPoll};
use crate::ring::{Ring, RingFrame};
use crate::sys::{self, Control, MAX_BATCH, Received, cvt, setsockopt};
use crate::vnet::{Coalesced, Gso, VNET_HDR_LEN, VNET_HDR_NONE, parse_vnet, vnet_gso};
use crate::{Interface, NetError};

// linux/if_packet.h
const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_STATISTICS: libc::c_int = 6;
// linux/if_packet.h: fanout, spreading frames by flow hash, with an id the kernel picks.
const PACKET_FANOUT: libc::c_int = 18;
const PACKET_FANOUT_HASH: libc::c_int = 0;
const PACKET_FANOUT_CPU: libc::c_int = 2;
const PACKET_FANOUT_FLAG_UNIQUEID: libc::c_int = 0x2000;
/// The group leaves our own outgoing frames alone, as `PACKET_IGNORE_OUTGOING` does a socket
/// (which a group member's own setting no longer does); Linux 6.2 and later
/// ([`group_ignores_outgoing`]).
const PACKET_FANOUT_FLAG_IGNORE_OUTGOING: libc::c_int = 0x4000;

/// Whether this kernel keeps a fanout group off the host's outgoing frames when asked
/// (`PACKET_FANOUT_FLAG_IGNORE_OUTGOING`, Linux 6.2). Asking it cannot tell: before 6.2,
/// `fanout_add` checks the group's mode but not its flags, keeps the ones it does not know
/// and goes on without them, so the group would take a copy of every frame the host sends
/// (Debian bookworm's 6.1, the Pi's, is such a kernel).
fn group_ignores_outgoing() -> bool {
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOWN.get_or_init(|| sys::kernel_release().is_some_and(|r| sys::release_at_least(&r, 6, 2)))
}

/// linux/if_packet.h `struct tpacket_stats`.
#[repr(C)]
#[derive(Default)]
struct TpacketStats {
    tp_packets: u32,
    tp_drops: u32,
}

/// The largest frame a [`LargeFrames`] area takes: the largest IPv4 packet plus an Ethernet
/// header. Coalesced frames are at most this large unless the NIC does BIG TCP (then they are
/// counted as truncated).
pub const LARGE_FRAME: usize = 65_535 + 14;

/// How to open a [`PacketSocket`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketOptions {
    /// See frames addressed to other MACs too (the adapter answers for whole subnets).
    pub promiscuous: bool,
    /// How long [`PacketSocket::recv_batch`] waits for a first frame before returning 0, so
    /// the capture thread can look at its other work. `None` waits forever.
    pub recv_timeout: Option<Duration>,
    /// Kernel receive buffer, bytes. Bursts larger than this are dropped by the kernel.
    pub recv_buffer: usize,
    /// Receive frames the kernel coalesced (GRO, LRO) or that a local sender left unsegmented
    /// (TSO/GSO on a veth) as they are, with their offload metadata (`PACKET_VNET_HDR`):
    /// [`FrameMeta::coalesced`] says how to cut them. Without it the kernel hands them over
    /// just the same, but without saying how they were made.
    pub coalesced: bool,
    /// After a frame, keep asking for the next one without sleeping for this long (see
    /// [`BusyPoll`]); zero: off, the receive blocks.
    pub busy_poll: Duration,
    /// Have the kernel stamp each frame as it comes in, so [`FrameMeta::queued`] says how long
    /// it waited for us (`SO_TIMESTAMPNS`; the kernel then reads its clock for every packet
    /// this host receives, a few tens of nanoseconds).
    pub timestamps: bool,
    /// A classic BPF program the kernel runs on every frame for this socket before queueing
    /// it (`SO_ATTACH_FILTER`): it answers how many bytes to keep, 0 to leave the frame out
    /// (netio's [`crate::cbpf`]). Attached before the socket is bound, so nothing it leaves
    /// out is ever queued. In a fanout group the kernel first picks the socket, then runs its
    /// filter: what one socket's filter leaves out no other socket of the group gets.
    pub filter: Option<Vec<crate::cbpf::Insn>>,
    /// Receive through a ring of memory shared with the kernel (`PACKET_RX_RING`,
    /// `TPACKET_V3`) as large as the receive buffer the kernel grants (twice `recv_buffer`)
    /// instead of the socket's queue: no system call and no queued buffer per frame, and a
    /// busy reader takes a whole block of frames without asking. A frame that comes alone
    /// waits for its block's timer, up to a tick of the kernel's clock (netio's `ring`
    /// module). Where the kernel refuses the ring, the socket receives as without
    /// ([`PacketSocket::ring_bytes`] says which).
    pub ring: bool,
}

impl Default for PacketOptions {
    fn default() -> Self {
        Self {
            promiscuous: true,
            recv_timeout: Some(Duration::from_millis(10)),
            recv_buffer: 4 << 20,
            coalesced: false,
            busy_poll: Duration::ZERO,
            timestamps: false,
            filter: None,
            ring: false,
        }
    }
}

/// What the kernel told us about one received frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameMeta {
    /// The frame's full length on the wire (without FCS), even when it did not fit the buffer.
    pub len: usize,
    /// The frame was longer than the buffer: only its head is there. Count it, never use it as
    /// if it were whole.
    pub truncated: bool,
    /// The kernel left the L4 checksum to offload (`TP_STATUS_CSUMNOTREADY`): the checksum
    /// field holds only the pseudo-header sum and must be completed before the packet leaves
    /// this host. Common on veth and with virtual machines as LAN hosts.
    pub checksum_partial: bool,
    /// The frame was sent by this host (only without `PACKET_IGNORE_OUTGOING`); skip it.
    pub outgoing: bool,
    /// The VLAN tag the NIC stripped, if any.
    pub vlan: Option<u16>,
    /// The frame is several segments the kernel merged (only with
    /// [`PacketOptions::coalesced`]): how they were merged.
    pub coalesced: Option<Coalesced>,
    /// How long it waited between the kernel's first sight of it and the receive that read
    /// it (the host's backlog and this socket's queue), with [`PacketOptions::timestamps`].
    pub queued: Option<Duration>,
}

/// One message of [`PacketSocket::send_gathered`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gathered {
    /// Which parts make the message, in order.
    pub parts: std::ops::Range<usize>,
    /// Cut into segments on the way out, if set.
    pub gso: Option<Gso>,
}

/// Room for the parts of frames that do not fit the caller's buffers, one area per slot of a
/// batch: where coalesced frames (up to [`LARGE_FRAME`] bytes) land. About 4 MiB, allocated
/// once; the kernel only touches the pages large frames reach.
pub struct LargeFrames {
    areas: Vec<Box<[u8]>>,
    head: usize,
}

impl std::fmt::Debug for LargeFrames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LargeFrames")
            .field("slots", &self.areas.len())
            .field("head", &self.head)
            .finish()
    }
}

impl LargeFrames {
    /// Areas for frames whose first `head` bytes (at most) go into the caller's buffers.
    pub fn new(head: usize) -> Self {
        Self::with_slots(head, MAX_BATCH)
    }

    /// Areas for `slots` frames (a reader of one frame at a time needs one), each with room
    /// for a `head` in front.
    pub fn with_slots(head: usize, slots: usize) -> Self {
        Self {
            areas: (0..slots)
                .map(|_| vec![0u8; head + LARGE_FRAME].into_boxed_slice())
                .collect(),
            head,
        }
    }

    /// Where the rest of frame `slot` goes: its area beyond the head.
    pub(crate) fn tail_mut(&mut self, slot: usize) -> Option<&mut [u8]> {
        let head = self.head;
        self.areas.get_mut(slot).map(|a| &mut a[head..])
    }

    /// The head these areas were made for.
    pub(crate) const fn head(&self) -> usize {
        self.head
    }

    /// The whole of frame `slot` of the last [`PacketSocket::recv_batch_large`] (or packet of the
    /// last [`crate::Tun::recv`]), whose first
    /// bytes are in `buf` (the slot's buffer) and the rest in this area: copies `buf` in
    /// front of the rest and returns the frame in one piece. `None` if `len` is not what that
    /// call could have received.
    pub fn join(&mut self, slot: usize, buf: &[u8], len: usize) -> Option<&[u8]> {
        let area = self.areas.get_mut(slot)?;
        if buf.len() > self.head || len < buf.len() || len - buf.len() > LARGE_FRAME {
            return None;
        }
        let start = self.head - buf.len();
        area[start..self.head].copy_from_slice(buf);
        Some(&area[start..self.head + (len - buf.len())])
    }
}

/// An `AF_PACKET` socket bound to one interface.
#[derive(Debug)]
pub struct PacketSocket {
    /// The receive ring, if it has one; declared before `fd` so that it is unmapped before
    /// the socket closes (the kernel keeps a mapped ring's memory past the close otherwise).
    ring: Option<Ring>,
    /// A handle of a socket with a ring ([`Self::try_clone`]): it sends, it cannot receive.
    ringed: bool,
    /// Why the kernel refused the ring asked for.
    ring_refused: Option<String>,
    recv_timeout: Option<Duration>,
    fd: OwnedFd,
    name: String,
    ignores_outgoing: bool,
    promiscuous: bool,
    recv_buffer: usize,
    coalesced: bool,
    timestamps: bool,
    busy: Option<BusyPoll>,
    /// One end of a pair inside the process ([`Self::pair`]), not an interface's.
    paired: bool,
}

impl PacketSocket {
    /// A capture socket over one end of a connected pair of Unix datagram sockets, and the
    /// other end: a LAN port with one device's wire, inside the process, on which tests run
    /// the adapter's production LAN side without root or an interface. Each datagram is one
    /// frame. They come without what the kernel tells of an interface's frames (a VLAN tag
    /// it stripped, a partial checksum, a stamp); none is coalesced, and the drop count is
    /// always 0. A send waits at most 100 ms for room (the other end not reading), then
    /// fails as a full device queue does. `filter`, a classic BPF program, keeps what it
    /// keeps of the frames as on a port (one that reads only the frame's bytes: nothing
    /// the kernel tells of an interface's frames is there).
    ///
    /// # Errors
    /// The pair cannot be made, or the filter attached.
    #[cfg(feature = "testing")]
    pub fn pair(
        name: &str,
        filter: Option<&[crate::cbpf::Insn]>,
    ) -> io::Result<(Self, std::os::unix::net::UnixDatagram)> {
        let (ours, theirs) = std::os::unix::net::UnixDatagram::pair()?;
        if let Some(program) = filter {
            crate::cbpf::attach(ours.as_raw_fd(), libc::SO_ATTACH_FILTER, program)?;
        }
        let recv_timeout = PacketOptions::default().recv_timeout;
        ours.set_read_timeout(recv_timeout)?;
        ours.set_write_timeout(Some(Duration::from_millis(100)))?;
        let sock = Self {
            ring: None,
            ringed: false,
            ring_refused: None,
            recv_timeout,
            fd: OwnedFd::from(ours),
            name: name.to_owned(),
            ignores_outgoing: true,
            promiscuous: true,
            recv_buffer: 0,
            coalesced: false,
            timestamps: false,
            busy: None,
            paired: true,
        };
        Ok((sock, theirs))
    }

    /// Opens a raw socket on `iface` for all protocols (`ETH_P_ALL`): promiscuous if asked,
    /// with per-frame auxiliary data, ignoring our own outgoing frames where the kernel can
    /// (`PACKET_IGNORE_OUTGOING`, Linux 4.20+; older kernels mark them in [`FrameMeta`]).
    ///
    /// # Errors
    /// [`NetError::NotPermitted`] without `CAP_NET_RAW`, [`NetError::InterfaceDown`], or another
    /// failure naming the step.
    pub fn open(iface: &Interface, opts: &PacketOptions) -> Result<Self, NetError> {
        if !iface.up {
            return Err(NetError::InterfaceDown(iface.name.clone()));
        }
        let name = iface.name.as_str();
        let raw_err = |op, e| NetError::from_io(op, name, "CAP_NET_RAW", e);
        // Protocol 0 receives nothing until bind() names the protocol and interface, so no
        // frame from another interface can slip in between.
        // SAFETY: socket(2) with constant arguments; no pointers.
        let fd =
            cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
                .map_err(|e| raw_err("opening an AF_PACKET socket", e))?;
        // SAFETY: `fd` was just returned by socket(2); we are its only owner.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        if let Some(program) = &opts.filter {
            crate::cbpf::attach(raw, libc::SO_ATTACH_FILTER, program)
                .map_err(|e| raw_err("attaching the capture filter", e))?;
        }
        let one: libc::c_int = 1;
        // Before the ring, which the kernel would refuse them after.
        if opts.coalesced {
            setsockopt(raw, libc::SOL_PACKET, PACKET_VNET_HDR, &one)
                .map_err(|e| raw_err("asking for offload headers (PACKET_VNET_HDR)", e))?;
        }
        let recv_buffer =
            sys::set_buffer(raw, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, opts.recv_buffer)
                .map_err(|e| raw_err("sizing the receive buffer", e))?;
        // Before the bind, so that no frame is queued where the ring's reader never looks;
        // as large as the queue the kernel granted (it doubles what is asked, for its
        // bookkeeping): the ring holds at least as many frames as the queue would.
        let (ring, ring_refused) = match opts.ring.then(|| Ring::attach(raw, recv_buffer)) {
            Some(Ok(ring)) => (Some(ring), None),
            Some(Err(e)) => (None, Some(e.to_string())),
            None => (None, None),
        };

        // SAFETY: sockaddr_ll is plain old data; all-zero is valid before we fill it in.
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        addr.sll_family = sys::short(libc::AF_PACKET);
        addr.sll_protocol = sys::short(libc::ETH_P_ALL).to_be();
        addr.sll_ifindex = libc::c_int::try_from(iface.index)
            .map_err(|_| NetError::NoSuchInterface(name.to_owned()))?;
        let addr_len = libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>()).expect("fits");
        // SAFETY: `addr` is a live, initialised sockaddr_ll of `addr_len` bytes.
        cvt(unsafe { libc::bind(raw, std::ptr::from_ref(&addr).cast(), addr_len) })
            .map_err(|e| raw_err("binding the AF_PACKET socket", e))?;

        if opts.promiscuous {
            // SAFETY: packet_mreq is plain old data; all-zero is valid before we fill it in.
            let mut mreq: libc::packet_mreq = unsafe { zeroed() };
            mreq.mr_ifindex = addr.sll_ifindex;
            mreq.mr_type = sys::short(libc::PACKET_MR_PROMISC);
            setsockopt(raw, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq).map_err(|e| {
                NetError::from_io("switching on promiscuous mode", name, "CAP_NET_RAW", e)
            })?;
        }
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_AUXDATA, &one)
            .map_err(|e| raw_err("asking for packet auxiliary data", e))?;
        let ignores_outgoing =
            setsockopt(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one).is_ok();
        // Stamps only measure: a kernel (or an emulator) that refuses them leaves the frames
        // without (`queued` stays `None`; `Self::timestamps` says so).
        let timestamps = opts.timestamps && sys::ask_timestamps(raw).is_ok();
        sys::set_recv_timeout(raw, opts.recv_timeout)
            .map_err(|e| raw_err("setting the receive timeout", e))?;
        Ok(Self {
            ringed: ring.is_some(),
            ring,
            ring_refused,
            recv_timeout: opts.recv_timeout,
            fd,
            name: name.to_owned(),
            ignores_outgoing,
            promiscuous: opts.promiscuous,
            recv_buffer,
            coalesced: opts.coalesced,
            timestamps,
            busy: BusyPoll::new(opts.busy_poll, opts.recv_timeout),
            paired: false,
        })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the kernel drops our own outgoing frames before we read them. When false,
    /// [`FrameMeta::outgoing`] marks them and the caller skips them.
    pub const fn ignores_outgoing(&self) -> bool {
        self.ignores_outgoing
    }

    /// Whether the socket put the interface into promiscuous mode.
    pub const fn promiscuous(&self) -> bool {
        self.promiscuous
    }

    /// Whether frames carry offload headers ([`PacketOptions::coalesced`]): coalesced frames
    /// may arrive, and [`Self::send_gathered`] can ask for segmentation.
    pub const fn coalesced(&self) -> bool {
        self.coalesced
    }

    /// The receive buffer the kernel granted, in bytes.
    pub const fn recv_buffer(&self) -> usize {
        self.recv_buffer
    }

    /// The receive ring's size in bytes, if the socket receives through one
    /// ([`PacketOptions::ring`] asked for and granted).
    pub fn ring_bytes(&self) -> Option<usize> {
        self.ring.as_ref().map(Ring::bytes)
    }

    /// The kernel's answer when it refused the ring [`PacketOptions::ring`] asked for: the
    /// socket receives through its queue instead.
    pub fn ring_refused(&self) -> Option<&str> {
        self.ring_refused.as_deref()
    }

    /// Whether frames carry the kernel's receive stamp ([`PacketOptions::timestamps`] asked
    /// for and granted).
    pub const fn timestamps(&self) -> bool {
        self.timestamps
    }

    /// Opens `queues` sockets on `iface` that share its frames by flow (`PACKET_FANOUT` by
    /// the kernel's flow hash): every frame of one flow (addresses, protocol and ports) goes
    /// to the same socket, in order, and different flows spread over the sockets, each with
    /// its own receive queue, so that a reader taking a batch from each in turn serves a
    /// light flow without waiting for a heavy one's queue. One socket (`queues` <= 1) is
    /// [`PacketSocket::open`]. Read them with [`PacketSocket::try_recv_batch`] and wait with
    /// [`wait_any`].
    ///
    /// # Errors
    /// As [`PacketSocket::open`], or the kernel refusing the group.
    pub fn open_group(
        iface: &Interface,
        opts: &PacketOptions,
        queues: usize,
    ) -> Result<Vec<Self>, NetError> {
        Self::open_fanout(iface, opts, queues, PACKET_FANOUT_HASH)
    }

    /// Opens `queues` sockets on `iface` that share its frames by the CPU that received each
    /// (`PACKET_FANOUT_CPU`): socket `i` gets the frames received on the CPUs whose number is
    /// `i` modulo `queues`. A thread that reads socket `i` on such a CPU is woken on its own
    /// core, not from another (the kernel hands the frame over there). Each frame goes to
    /// one socket of the group, whose filter then judges it (one filter run per frame,
    /// however many sockets). One socket (`queues` <= 1) is [`PacketSocket::open`]; so is
    /// the answer where the sockets ignore our outgoing frames but the kernel cannot keep a
    /// group off them (`PACKET_FANOUT_FLAG_IGNORE_OUTGOING`, not in Linux 6.1): a group would
    /// then take a copy of every frame this host sends on `iface`, a cost per frame of the
    /// bulk traffic for a gain on the sparse.
    ///
    /// # Errors
    /// As [`PacketSocket::open`], or the kernel refusing the group.
    pub fn open_per_cpu(
        iface: &Interface,
        opts: &PacketOptions,
        queues: usize,
    ) -> Result<Vec<Self>, NetError> {
        Self::open_fanout(iface, opts, queues, PACKET_FANOUT_CPU)
    }

    fn open_fanout(
        iface: &Interface,
        opts: &PacketOptions,
        queues: usize,
        mode: libc::c_int,
    ) -> Result<Vec<Self>, NetError> {
        Self::open_fanout_as(iface, opts, queues, mode, group_ignores_outgoing())
    }

    /// [`Self::open_fanout`] on a kernel that does (`group_flag`) or does not know
    /// `PACKET_FANOUT_FLAG_IGNORE_OUTGOING`.
    fn open_fanout_as(
        iface: &Interface,
        opts: &PacketOptions,
        queues: usize,
        mode: libc::c_int,
        group_flag: bool,
    ) -> Result<Vec<Self>, NetError> {
        let mut first = Self::open(iface, opts)?;
        if queues <= 1 {
            return Ok(vec![first]);
        }
        let fanout_err =
            |e| NetError::from_io("joining a fanout group", &iface.name, "CAP_NET_RAW", e);
        let fd = first.fd.as_raw_fd();
        // Id 0 with the unique flag: the kernel picks an id no other group has; read it back.
        // A member's PACKET_IGNORE_OUTGOING no longer applies: the group's flag does, where
        // the kernel knows it.
        let create = |flags: libc::c_int| {
            let kind = mode | PACKET_FANOUT_FLAG_UNIQUEID | flags;
            setsockopt(fd, libc::SOL_PACKET, PACKET_FANOUT, &(kind << 16))
        };
        let mut flags = 0;
        if first.ignores_outgoing && group_flag {
            match create(PACKET_FANOUT_FLAG_IGNORE_OUTGOING) {
                Ok(()) => flags = PACKET_FANOUT_FLAG_IGNORE_OUTGOING,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(fanout_err(e)),
            }
        }
        if flags == 0 {
            // A group that would take the host's outgoing frames, which the socket alone
            // ignores: not worth it for the CPU's, and the hash group's members see them.
            if first.ignores_outgoing && mode == PACKET_FANOUT_CPU {
                return Ok(vec![first]);
            }
            create(0).map_err(fanout_err)?;
            first.ignores_outgoing = false;
        }
        let arg: libc::c_int =
            sys::getsockopt(fd, libc::SOL_PACKET, PACKET_FANOUT).map_err(fanout_err)?;
        // The kernel keeps the group's flags without the unique-id one; joiners match them.
        let join = (arg & 0xffff) | ((mode | flags) << 16);
        let ignores_outgoing = first.ignores_outgoing;
        let mut group = vec![first];
        for _ in 1..queues {
            let mut sock = Self::open(iface, opts)?;
            setsockopt(sock.fd.as_raw_fd(), libc::SOL_PACKET, PACKET_FANOUT, &join)
                .map_err(fanout_err)?;
            sock.ignores_outgoing = ignores_outgoing;
            group.push(sock);
        }
        Ok(group)
    }

    /// Receives up to `bufs.len()` frames (at most 64) in one system call: waits for the first
    /// (up to the receive timeout), then takes what is already queued. Returns how many
    /// arrived; `meta[i]` describes `bufs[i]`. Returns 0 on timeout. A frame longer than its
    /// buffer is truncated ([`FrameMeta::truncated`]).
    ///
    /// # Errors
    /// A failing system call other than timeout or interruption.
    pub fn recv_batch(
        &mut self,
        bufs: &mut [&mut [u8]],
        meta: &mut [FrameMeta],
    ) -> io::Result<usize> {
        self.recv(bufs, meta, None, true)
    }

    /// [`Self::recv_batch`] (or, with `large`, [`Self::recv_batch_large`]) without waiting:
    /// takes what is queued, 0 when nothing is.
    ///
    /// # Errors
    /// A failing system call other than interruption.
    pub fn try_recv_batch(
        &mut self,
        bufs: &mut [&mut [u8]],
        meta: &mut [FrameMeta],
        large: Option<&mut LargeFrames>,
    ) -> io::Result<usize> {
        self.recv(bufs, meta, large, false)
    }

    /// Like [`Self::recv_batch`], but what does not fit `bufs[i]` goes on into `large`'s area
    /// for slot `i`, up to [`LARGE_FRAME`] bytes in all: [`LargeFrames::join`] gives the whole
    /// frame. `bufs[i]` must not be longer than the head `large` was made for.
    ///
    /// # Errors
    /// A failing system call other than timeout or interruption.
    pub fn recv_batch_large(
        &mut self,
        bufs: &mut [&mut [u8]],
        meta: &mut [FrameMeta],
        large: &mut LargeFrames,
    ) -> io::Result<usize> {
        self.recv(bufs, meta, Some(large), true)
    }

    fn recv(
        &mut self,
        bufs: &mut [&mut [u8]],
        meta: &mut [FrameMeta],
        large: Option<&mut LargeFrames>,
        wait: bool,
    ) -> io::Result<usize> {
        if self.ringed {
            return self.recv_ring(bufs, meta, large, wait);
        }
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid; the kernel overwrites it.
        let mut names: [libc::sockaddr_ll; MAX_BATCH] = unsafe { zeroed() };
        let mut controls = [Control::EMPTY; MAX_BATCH];
        let mut out = [Received::default(); MAX_BATCH];
        let mut vnet = [VNET_HDR_NONE; MAX_BATCH];
        let n = bufs.len().min(meta.len());
        let heads: &mut [[u8; VNET_HDR_LEN]] = if self.coalesced { &mut vnet } else { &mut [] };
        let mut tail_slices: [&mut [u8]; MAX_BATCH] =
            std::array::from_fn(|_| <&mut [u8]>::default());
        let (tails, tail_room): (&mut [&mut [u8]], usize) = match large {
            Some(large) => {
                let head = large.head;
                assert!(
                    bufs[..n].iter().all(|b| b.len() <= head),
                    "buffers longer than the LargeFrames head"
                );
                for (slice, area) in tail_slices.iter_mut().zip(large.areas.iter_mut()) {
                    *slice = &mut area[head..];
                }
                (&mut tail_slices, LARGE_FRAME)
            }
            None => (&mut [], 0),
        };
        let fd = self.fd.as_raw_fd();
        let mut call = |wait| {
            sys::recvmmsg_scattered(
                fd,
                &mut *heads,
                &mut bufs[..n],
                &mut *tails,
                &mut names,
                &mut controls,
                &mut out,
                libc::MSG_TRUNC | libc::MSG_WAITFORONE | busy::dont_wait(wait),
            )
        };
        let got = if wait {
            busy::receive(self.busy.as_mut(), call)?
        } else {
            call(false)?
        };
        let head_len = if self.coalesced { VNET_HDR_LEN } else { 0 };
        let now = if self.timestamps && got > 0 {
            Some(sys::realtime())
        } else {
            None
        };
        for i in 0..got {
            let aux = auxdata(&controls[i], out[i].control_len);
            let status = aux.map_or(0, |a| a.tp_status);
            let len = out[i].len.saturating_sub(head_len);
            let (vnet_partial, coalesced) = if self.coalesced {
                parse_vnet(&vnet[i])
            } else {
                (false, None)
            };
            meta[i] = FrameMeta {
                len,
                truncated: out[i].flags & libc::MSG_TRUNC != 0
                    || out[i].len < head_len
                    || len > bufs[i].len() + tail_room,
                checksum_partial: status & TP_STATUS_CSUMNOTREADY != 0 || vnet_partial,
                outgoing: names[i].sll_pkttype == libc::PACKET_OUTGOING,
                vlan: aux
                    .filter(|_| status & TP_STATUS_VLAN_VALID != 0)
                    .map(|a| a.tp_vlan_tci & 0x0fff),
                coalesced,
                queued: now.and_then(|now| sys::queued_for(&controls[i], out[i].control_len, now)),
            };
        }
        Ok(got)
    }

    /// [`Self::recv`] from the ring: each frame copied out of its block into `bufs[i]` (and
    /// on into `large`'s slot `i`), its block handed back once read to its end.
    fn recv_ring(
        &mut self,
        bufs: &mut [&mut [u8]],
        meta: &mut [FrameMeta],
        mut large: Option<&mut LargeFrames>,
        wait: bool,
    ) -> io::Result<usize> {
        let Self {
            ring,
            fd,
            recv_timeout,
            busy,
            coalesced,
            timestamps,
            ..
        } = self;
        let Some(ring) = ring.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a second handle of a socket with a receive ring does not receive",
            ));
        };
        let most = bufs.len().min(meta.len());
        let head = if *coalesced { VNET_HDR_LEN } else { 0 };
        let mut take = |ring: &mut Ring| {
            // Read for each look at the ring: a receive that waited must not date its frames
            // from before they came.
            let now = timestamps.then(sys::realtime);
            let mut i = 0;
            ring.read(most, head, |frame| {
                meta[i] = copy_out(
                    &frame,
                    bufs[i],
                    large.as_mut().and_then(|l| l.tail_mut(i)),
                    now,
                );
                i += 1;
            })
        };
        if !wait {
            return Ok(take(ring));
        }
        let fd = fd.as_raw_fd();
        let within = recv_timeout.unwrap_or(Duration::from_secs(1));
        busy::receive(busy.as_mut(), |wait| {
            loop {
                let got = take(ring);
                if got > 0 || !wait {
                    return Ok(got);
                }
                if !sys::wait_readable(fd, within)? && recv_timeout.is_some() {
                    return Ok(take(ring));
                }
            }
        })
    }

    /// Sends one frame out of the interface.
    ///
    /// # Errors
    /// The system call's error (`ENOBUFS` when the device queue is full).
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        match self.send_batch(&[frame]) {
            (1, _, _) => Ok(()),
            (_, _, Some(e)) => Err(e),
            _ => Err(io::Error::other("the frame was not sent")),
        }
    }

    /// Sends frames in as few system calls as possible. Returns (sent, failed, last error);
    /// a refused frame does not stop the others.
    pub fn send_batch(&self, frames: &[&[u8]]) -> (usize, usize, Option<io::Error>) {
        let ones: [std::ops::Range<usize>; MAX_BATCH] = std::array::from_fn(|i| i..i + 1);
        let heads = [VNET_HDR_NONE; MAX_BATCH];
        let (mut sent, mut failed, mut last_error) = (0, 0, None);
        for chunk in frames.chunks(MAX_BATCH) {
            sent += sys::sendmmsg_gather(
                self.fd.as_raw_fd(),
                self.heads(&heads[..chunk.len()]),
                chunk,
                &ones[..chunk.len()],
                |_, e| {
                    failed += 1;
                    last_error = Some(e);
                },
            );
        }
        (sent, failed, last_error)
    }

    /// The `virtio_net_hdr`s to put in front of the messages, if the socket has them.
    fn heads<'a>(&self, heads: &'a [[u8; VNET_HDR_LEN]]) -> &'a [[u8; VNET_HDR_LEN]] {
        if self.coalesced { heads } else { &[] }
    }

    /// Sends messages gathered from pieces, each one frame on the wire or, with `gso`, one
    /// large TCP or UDP frame that the kernel cuts into segments on the way out (GSO, or the
    /// NIC's TSO/USO): message `m` is `parts[messages[m].parts]`, the first part holding the frame's
    /// headers. Needs a socket opened with [`PacketOptions::coalesced`] for `gso`. Returns how
    /// many messages were sent; each refused one is reported to `refused` with its index.
    pub fn send_gathered(
        &self,
        parts: &[&[u8]],
        messages: &[Gathered],
        refused: impl FnMut(usize, io::Error),
    ) -> usize {
        let mut heads = [VNET_HDR_NONE; MAX_BATCH];
        let mut ranges: [std::ops::Range<usize>; MAX_BATCH] = std::array::from_fn(|_| 0..0);
        let n = messages.len().min(MAX_BATCH);
        for (m, msg) in messages[..n].iter().enumerate() {
            ranges[m] = msg.parts.clone();
            if let Some(gso) = msg.gso {
                heads[m] = vnet_gso(gso);
            }
        }
        sys::sendmmsg_gather(
            self.fd.as_raw_fd(),
            self.heads(&heads[..n]),
            parts,
            &ranges[..n],
            refused,
        )
    }

    /// Frames the kernel dropped for this socket since the last call (or since it opened):
    /// its receive buffer (or ring) was full because the reader fell behind; with a ring,
    /// also frames of a block whose offsets could not be followed. Reading the count resets
    /// it, so only one reader of a socket should ask.
    ///
    /// # Errors
    /// `getsockopt(PACKET_STATISTICS)` failing.
    pub fn take_drops(&self) -> io::Result<u64> {
        if self.paired {
            return Ok(0);
        }
        let stats: TpacketStats =
            sys::getsockopt(self.fd.as_raw_fd(), libc::SOL_PACKET, PACKET_STATISTICS)?;
        let lost = self.ring.as_ref().map_or(0, Ring::take_lost);
        Ok(u64::from(stats.tp_drops) + lost)
    }

    /// Waits up to `within` for a frame to read, to the microsecond (`ppoll(2)`: a
    /// high-resolution timer, where the receive timeout is rounded to the kernel's tick).
    /// True when one is there; false on timeout or interruption.
    ///
    /// # Errors
    /// `ppoll(2)` failing otherwise.
    pub fn wait_readable(&self, within: Duration) -> io::Result<bool> {
        if self.ring.as_ref().is_some_and(Ring::pending) {
            return Ok(true);
        }
        sys::wait_readable(self.fd.as_raw_fd(), within)
    }

    /// A second handle on the same socket, for sending from another thread.
    ///
    /// # Errors
    /// `dup(2)` failing.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            ring: None,
            ringed: self.ringed,
            ring_refused: self.ring_refused.clone(),
            recv_timeout: self.recv_timeout,
            fd: self.fd.try_clone()?,
            name: self.name.clone(),
            ignores_outgoing: self.ignores_outgoing,
            promiscuous: self.promiscuous,
            recv_buffer: self.recv_buffer,
            coalesced: self.coalesced,
            timestamps: self.timestamps,
            busy: self.busy,
            paired: self.paired,
        })
    }
}

/// Waits up to `within` (zero: not at all) until one of `socks` (at most 64) has a frame to
/// read (`ppoll(2)`); returns which have, bit `i` for `socks[i]` (0 on timeout or
/// interruption).
///
/// # Errors
/// `ppoll(2)` failing otherwise.
pub fn wait_any(socks: &[PacketSocket], within: Duration) -> io::Result<u64> {
    // Frames already in a ring's blocks: no need to ask the kernel.
    let pending = socks
        .iter()
        .take(64)
        .enumerate()
        .filter(|(_, s)| s.ring.as_ref().is_some_and(Ring::pending))
        .fold(0, |mask, (i, _)| mask | 1 << i);
    if pending != 0 {
        return Ok(pending);
    }
    let mut fds = [-1; 64];
    for (fd, s) in fds.iter_mut().zip(socks) {
        *fd = s.fd.as_raw_fd();
    }
    sys::readable(&fds[..socks.len().min(64)], within)
}

/// Whether `e`, refusing a message sent with a [`Gso`] request, means the kernel or the
/// interface does not segment that kind at all (kernels before about 6.2 answer `EINVAL` for
/// UDP), a lasting answer, rather than a passing failure such as the link being down or the
/// queue full, after which asking again later is right.
pub fn segmentation_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOPROTOOPT)
    )
}

/// Copies `frame` out of its ring into `buf` and, for what does not fit, `tail`; says what
/// the kernel said of it (its wait up to `now`, if given).
fn copy_out(
    frame: &RingFrame<'_>,
    buf: &mut [u8],
    tail: Option<&mut [u8]>,
    now: Option<libc::timespec>,
) -> FrameMeta {
    let first = frame.data.len().min(buf.len());
    buf[..first].copy_from_slice(&frame.data[..first]);
    let rest = &frame.data[first..];
    let more = tail.map_or(0, |tail| {
        let more = rest.len().min(tail.len());
        tail[..more].copy_from_slice(&rest[..more]);
        more
    });
    let (vnet_partial, coalesced) = frame
        .head
        .and_then(|h| <&[u8; VNET_HDR_LEN]>::try_from(h).ok())
        .map_or((false, None), parse_vnet);
    FrameMeta {
        len: frame.len,
        truncated: first + more < frame.len,
        checksum_partial: frame.status & TP_STATUS_CSUMNOTREADY != 0 || vnet_partial,
        outgoing: frame.pkttype == libc::PACKET_OUTGOING,
        vlan: (frame.status & TP_STATUS_VLAN_VALID != 0)
            .then(|| u16::try_from(frame.vlan_tci & 0x0fff).unwrap_or(0)),
        coalesced,
        queued: now.map(|now| sys::waited(frame.stamp, now)),
    }
}

/// The `tpacket_auxdata` control message among the first `len` bytes of `control`, if any.
fn auxdata(control: &Control, len: usize) -> Option<libc::tpacket_auxdata> {
    // SAFETY: tpacket_auxdata is plain old data: any bytes the kernel wrote are a valid value.
    unsafe { sys::find_control(control, len, libc::SOL_PACKET, libc::PACKET_AUXDATA) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair's frames cross whole both ways, each read as one frame with its length; a
    /// frame longer than its buffer says so; nothing waiting is a timeout (0), not an
    /// error; a wait and a group's wait see a frame there.
    #[test]
    #[cfg(feature = "testing")]
    fn a_pair_carries_frames_both_ways() {
        let (mut port, wire) = PacketSocket::pair("lan-test", None).expect("a pair");
        let mut a = [0u8; 64];
        let mut b = [0u8; 16];
        let mut meta = [FrameMeta::default(); 2];
        let mut recv = |port: &mut PacketSocket, meta: &mut [FrameMeta]| {
            let mut bufs: [&mut [u8]; 2] = [&mut a, &mut b];
            port.recv_batch(&mut bufs, meta).expect("a receive")
        };
        assert_eq!(recv(&mut port, &mut meta), 0, "nothing yet");
        wire.send(&[7; 60]).expect("sent");
        wire.send(&[9; 40]).expect("sent");
        assert!(port.wait_readable(Duration::from_secs(5)).expect("a wait"));
        assert_eq!(recv(&mut port, &mut meta), 2);
        assert_eq!((meta[0].len, meta[0].truncated), (60, false));
        assert!(meta[1].truncated, "40 bytes into 16: {:?}", meta[1]);
        assert_eq!((a[..60].to_vec(), b), (vec![7; 60], [9; 16]));
        assert!(!meta[0].outgoing && meta[0].vlan.is_none() && !meta[0].checksum_partial);

        let tx = port.try_clone().expect("a second handle");
        let (sent, failed, error) = tx.send_batch(&[&[1, 2, 3], &[4; 1500]]);
        assert_eq!((sent, failed), (2, 0), "{error:?}");
        let mut got = [0u8; 2048];
        assert_eq!(wire.recv(&mut got).expect("a frame"), 3);
        assert_eq!(wire.recv(&mut got).expect("a frame"), 1500);
        assert_eq!(port.take_drops().expect("a count"), 0);
        wire.send(&[1; 20]).expect("sent");
        assert_eq!(
            wait_any(std::slice::from_ref(&port), Duration::from_secs(5)).expect("a wait"),
            1
        );

        // A filter keeps only frames of 20 bytes or more.
        let program = [
            crate::cbpf::load_len(),
            crate::cbpf::jump_ge(20, 0, 1),
            crate::cbpf::ret(u32::MAX),
            crate::cbpf::ret(0),
        ];
        let (mut port, wire) = PacketSocket::pair("lan-test", Some(&program)).expect("a pair");
        wire.send(&[1; 10]).expect("sent");
        wire.send(&[2; 30]).expect("sent");
        assert!(port.wait_readable(Duration::from_secs(5)).expect("a wait"));
        let mut c = [0u8; 64];
        let mut bufs: [&mut [u8]; 1] = [&mut c];
        assert_eq!(
            port.recv_batch(&mut bufs, &mut meta[..1])
                .expect("a receive"),
            1
        );
        assert_eq!(meta[0].len, 30, "the short frame was left out");
    }

    #[test]
    fn only_lasting_refusals_say_segmentation_is_unsupported() {
        for errno in [libc::EINVAL, libc::EOPNOTSUPP, libc::EPROTONOSUPPORT] {
            assert!(segmentation_unsupported(&io::Error::from_raw_os_error(
                errno
            )));
        }
        for errno in [libc::ENETDOWN, libc::ENOBUFS, libc::ENXIO, libc::EAGAIN] {
            assert!(!segmentation_unsupported(&io::Error::from_raw_os_error(
                errno
            )));
        }
        assert!(!segmentation_unsupported(&io::Error::other("no errno")));
    }

    #[test]
    fn large_frames_join_head_and_tail() {
        let mut large = LargeFrames::new(100);
        large.areas[3][100..105].copy_from_slice(b"world");
        assert_eq!(large.join(3, b"hello ", 11), Some(&b"hello world"[..]));
        assert_eq!(
            large.join(3, &[0; 101], 200),
            None,
            "head longer than promised"
        );
        assert_eq!(large.join(3, b"abc", 2), None, "shorter than its head");
        assert_eq!(large.join(64, b"abc", 3), None, "no such slot");
        assert_eq!(large.join(0, b"", LARGE_FRAME + 1), None);
        assert_eq!(
            large.join(0, b"", LARGE_FRAME).map(<[u8]>::len),
            Some(LARGE_FRAME)
        );
    }

    /// On a kernel without the group flag, a per-CPU group would take the host's outgoing
    /// frames: one socket instead. A hash group is made without the flag, and its sockets
    /// say they see outgoing frames (their reader skips them). On loopback, where nothing
    /// is sent; skipped without `CAP_NET_RAW`.
    #[test]
    fn without_the_group_flag_no_group_takes_outgoing_frames_unsaid() {
        let lo = Interface::lookup_up("lo").unwrap();
        let opts = PacketOptions {
            promiscuous: false,
            ..PacketOptions::default()
        };
        let alone = match PacketSocket::open(&lo, &opts) {
            Ok(s) => s,
            Err(e) => {
                println!("skipped: no packet socket here ({e})");
                return;
            }
        };
        if !alone.ignores_outgoing() {
            println!("skipped: this kernel has no PACKET_IGNORE_OUTGOING");
            return;
        }
        let cpu = PacketSocket::open_fanout_as(&lo, &opts, 2, PACKET_FANOUT_CPU, false).unwrap();
        assert_eq!(cpu.len(), 1);
        assert!(cpu[0].ignores_outgoing());
        let hash = PacketSocket::open_fanout_as(&lo, &opts, 2, PACKET_FANOUT_HASH, false).unwrap();
        assert_eq!(hash.len(), 2);
        assert!(hash.iter().all(|s| !s.ignores_outgoing()));
        if group_ignores_outgoing() {
            let cpu = PacketSocket::open_fanout_as(&lo, &opts, 2, PACKET_FANOUT_CPU, true).unwrap();
            assert_eq!(cpu.len(), 2);
            assert!(cpu.iter().all(PacketSocket::ignores_outgoing));
        }
    }
}

//! The internal NIC: an `AF_PACKET` socket that sees every frame and can inject frames.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::sys::{self, Control, MAX_BATCH, Received, cvt, setsockopt};
use crate::{Interface, NetError};

// linux/if_packet.h
const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;

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
}

impl Default for PacketOptions {
    fn default() -> Self {
        Self {
            promiscuous: true,
            recv_timeout: Some(Duration::from_millis(10)),
            recv_buffer: 4 << 20,
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
}

/// An `AF_PACKET` socket bound to one interface.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    name: String,
    ignores_outgoing: bool,
    promiscuous: bool,
    recv_buffer: usize,
}

impl PacketSocket {
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
        let one: libc::c_int = 1;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_AUXDATA, &one)
            .map_err(|e| raw_err("asking for packet auxiliary data", e))?;
        let ignores_outgoing =
            setsockopt(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one).is_ok();
        sys::set_recv_timeout(raw, opts.recv_timeout)
            .map_err(|e| raw_err("setting the receive timeout", e))?;
        let recv_buffer =
            sys::set_buffer(raw, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, opts.recv_buffer)
                .map_err(|e| raw_err("sizing the receive buffer", e))?;
        Ok(Self {
            fd,
            name: name.to_owned(),
            ignores_outgoing,
            promiscuous: opts.promiscuous,
            recv_buffer,
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

    /// The receive buffer the kernel granted, in bytes.
    pub const fn recv_buffer(&self) -> usize {
        self.recv_buffer
    }

    /// Receives up to `bufs.len()` frames (at most 64) in one system call: waits for the first
    /// (up to the receive timeout), then takes what is already queued. Returns how many
    /// arrived; `meta[i]` describes `bufs[i]`. Returns 0 on timeout.
    ///
    /// # Errors
    /// A failing system call other than timeout or interruption.
    pub fn recv_batch(
        &mut self,
        bufs: &mut [&mut [u8]],
        meta: &mut [FrameMeta],
    ) -> io::Result<usize> {
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid; the kernel overwrites it.
        let mut names: [libc::sockaddr_ll; MAX_BATCH] = unsafe { zeroed() };
        let mut controls = [Control::EMPTY; MAX_BATCH];
        let mut out = [Received::default(); MAX_BATCH];
        let n = bufs.len().min(meta.len());
        let got = sys::recvmmsg(
            self.fd.as_raw_fd(),
            &mut bufs[..n],
            &mut names,
            &mut controls,
            &mut out,
            libc::MSG_TRUNC | libc::MSG_WAITFORONE,
        )?;
        for i in 0..got {
            let aux = auxdata(&controls[i], out[i].control_len);
            let status = aux.map_or(0, |a| a.tp_status);
            meta[i] = FrameMeta {
                len: out[i].len,
                truncated: out[i].flags & libc::MSG_TRUNC != 0 || out[i].len > bufs[i].len(),
                checksum_partial: status & TP_STATUS_CSUMNOTREADY != 0,
                outgoing: names[i].sll_pkttype == libc::PACKET_OUTGOING,
                vlan: aux
                    .filter(|_| status & TP_STATUS_VLAN_VALID != 0)
                    .map(|a| a.tp_vlan_tci & 0x0fff),
            };
        }
        Ok(got)
    }

    /// Sends one frame out of the interface.
    ///
    /// # Errors
    /// The system call's error (`ENOBUFS` when the device queue is full).
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: `frame` is a live slice of `frame.len()` bytes that the kernel only reads.
        let sent =
            unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if sent < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Sends frames in as few system calls as possible. Returns (sent, failed, last error);
    /// a refused frame does not stop the others.
    pub fn send_batch(&self, frames: &[&[u8]]) -> (usize, usize, Option<io::Error>) {
        sys::sendmmsg(self.fd.as_raw_fd(), frames, &[])
    }

    /// A second handle on the same socket, for sending from another thread.
    ///
    /// # Errors
    /// `dup(2)` failing.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            fd: self.fd.try_clone()?,
            name: self.name.clone(),
            ignores_outgoing: self.ignores_outgoing,
            promiscuous: self.promiscuous,
            recv_buffer: self.recv_buffer,
        })
    }
}

/// The `tpacket_auxdata` control message among the first `len` bytes of `control`, if any.
fn auxdata(control: &Control, len: usize) -> Option<libc::tpacket_auxdata> {
    // SAFETY: tpacket_auxdata is plain old data: any bytes the kernel wrote are a valid value.
    unsafe { sys::find_control(control, len, libc::SOL_PACKET, libc::PACKET_AUXDATA) }
}

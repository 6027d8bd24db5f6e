//! The node's overlay interface: a TUN device (`IFF_TUN | IFF_NO_PI`: one IPv4 or IPv6 packet
//! per read and write), with its address, netmask, MTU and state set through interface ioctls.
//! The device lives as long as this value: closing it removes the interface, its address and
//! the routes through it.
//!
//! With offloads (`IFF_VNET_HDR` and `TUNSETOFFLOAD`), the host's stack treats the device like
//! a NIC with TSO, USO and checksum offload: it hands over TCP and UDP super-packets of up to
//! 64 KiB with a `virtio_net_hdr` saying how to cut them ([`TunPacket::coalesced`]), and
//! leaves transport checksums partial ([`TunPacket::checksum`]). One read then carries what
//! took dozens. Packets written in carry the same header, so a run of one flow can go in as
//! one super-packet whose checksum the host's stack takes as done ([`Tun::send_gathered`]),
//! and a packet whose checksum nobody computed yet can go in as it is ([`Tun::send`] with a
//! partial checksum note; the node's sink does not use that yet: it computes the checksum of
//! a packet that goes in alone).
//!
//! The device is opened here rather than by the tun-tap crate, whose C helper fixes the flags
//! to `IFF_TUN | IFF_NO_PI` and so cannot ask for `IFF_VNET_HDR`.

use std::io;
use std::mem::zeroed;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::time::Duration;

use crate::sys::{self, cvt, ifreq, ifreq_ioctl, ioctl_socket, short};
use crate::vnet::{
    Coalesced, PartialChecksum, VNET_HDR_LEN, VNET_HDR_NONE, parse_vnet, partial_checksum,
    vnet_checksum, vnet_gso,
};
use crate::{Gathered, LargeFrames, NetError};

/// The most pieces (the offload header included) one gathered write takes.
const MAX_IOV: usize = 65;

/// A TUN device.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    name: String,
    offloads: Option<TunOffloads>,
}

/// What the host may hand an offloading device unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunOffloads {
    /// TCP super-packets (TSO, with ECN) and partial checksums: always, with offloads.
    pub tcp: bool,
    /// UDP super-packets (USO, `UDP_SEGMENT` senders): Linux 6.2 and later.
    pub udp: bool,
}

/// One packet read from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunPacket {
    /// Its length: up to the caller's buffer there, the rest in the [`LargeFrames`] area
    /// ([`LargeFrames::join`] gives it whole).
    pub len: usize,
    /// Longer than the buffer and the area together: cut by the kernel.
    pub truncated: bool,
    /// Its transport checksum is left to us (offloads only).
    pub checksum: Option<PartialChecksum>,
    /// A super-packet of several segments (offloads only): how to cut it.
    pub coalesced: Option<Coalesced>,
}

/// `struct sockaddr` holding an IPv4 address, as interface ioctls take it.
fn sockaddr_v4(ip: Ipv4Addr) -> libc::sockaddr {
    // SAFETY: sockaddr_in is plain old data; all-zero is a valid value.
    let mut sin: libc::sockaddr_in = unsafe { zeroed() };
    sin.sin_family = short(libc::AF_INET);
    sin.sin_addr.s_addr = u32::from(ip).to_be();
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes); the kernel reads the
    // former through the latter for AF_INET, which is what this reinterpretation does.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// `TUNSETOFFLOAD`'s argument for TSO over both IP versions (with ECN) and checksum offload,
/// and USO if `udp` (the kernel takes UDP segmentation only for both IP versions at once).
const fn offload_flags(udp: bool) -> libc::c_uint {
    let tcp = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;
    if udp {
        tcp | libc::TUN_F_USO4 | libc::TUN_F_USO6
    } else {
        tcp
    }
}

impl Tun {
    /// Creates the TUN device `name` (`%d` is replaced by a free number), non-blocking; with
    /// `offload`, asks for offload headers and TSO, checksum offload and, with `uso`, USO
    /// (where the kernel has it). The kernel hands over UDP super-packets of both IP versions
    /// once USO is on: whoever reads the device must cut both.
    ///
    /// # Errors
    /// No `/dev/net/tun`, the name taken or invalid, no `CAP_NET_ADMIN`, or a kernel without
    /// offloads on TUN devices when asked for them.
    pub fn create(name: &str, offload: bool, uso: bool) -> Result<Self, NetError> {
        let mut req = ifreq(name)?;
        let err = |op, e| NetError::from_io(op, name, "CAP_NET_ADMIN", e);
        // SAFETY: open(2) of a constant, NUL-terminated path with integer flags.
        let fd = cvt(unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        })
        .map_err(|e| match e.raw_os_error() {
            // The file's mode, not a capability: CAP_NET_ADMIN does not open a 0600 node.
            Some(libc::EACCES) => NetError::Io {
                op: "opening /dev/net/tun (its mode must let this user read and write it: udev makes it 0666)",
                target: name.to_owned(),
                source: e,
            },
            _ => err("opening /dev/net/tun", e),
        })?;
        // SAFETY: `fd` was just returned by open(2); we are its only owner.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut flags = libc::IFF_TUN | libc::IFF_NO_PI;
        if offload {
            flags |= libc::IFF_VNET_HDR;
        }
        req.ifr_ifru.ifru_flags = short(flags).cast_signed();
        ifreq_ioctl(&fd, libc::TUNSETIFF, &mut req)
            .map_err(|e| err("creating the TUN device", e))?;
        let given: Vec<u8> = req
            .ifr_name
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| c.to_ne_bytes()[0])
            .collect();
        let name = String::from_utf8_lossy(&given).into_owned();
        let offloads = if offload {
            let set = |udp| {
                // SAFETY: TUNSETOFFLOAD takes its argument by value.
                cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETOFFLOAD, offload_flags(udp)) })
            };
            let udp = match set(uso) {
                Ok(_) => uso,
                // Before Linux 6.2 the USO flags are unknown and refused.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    set(false).map_err(|e| err("switching on the TUN device's offloads", e))?;
                    false
                }
                Err(e) => return Err(err("switching on the TUN device's offloads", e)),
            };
            Some(TunOffloads { tcp: true, udp })
        } else {
            None
        };
        Ok(Self { fd, name, offloads })
    }

    /// The device's name as the kernel gave it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the host may hand this device unfinished; `None` without offloads.
    pub const fn offloads(&self) -> Option<TunOffloads> {
        self.offloads
    }

    /// Gives the device `addr`/`prefix` (the kernel then routes the whole prefix through
    /// it), with `v6` an IPv6 address and prefix as well, the MTU `mtu`, and brings it up.
    /// Without `v6`, IPv6 is switched off on it. With it, IPv6 runs without link-local
    /// addresses, Router Solicitations, Router Advertisements taken or Duplicate Address
    /// Detection: the device is a point-to-point link into the overlay, with no router and
    /// no neighbour on it, and the host's IPv6 link traffic would have nowhere to go.
    ///
    /// # Errors
    /// The kernel refuses (`CAP_NET_ADMIN`, an address in use, an MTU out of range, IPv6
    /// switched off on the host when `v6` is given).
    pub fn configure(
        &self,
        addr: Ipv4Addr,
        prefix: u8,
        v6: Option<(Ipv6Addr, u8)>,
        mtu: u32,
    ) -> Result<(), NetError> {
        let name = self.name();
        let io_err = |op, e| NetError::from_io(op, name, "CAP_NET_ADMIN", e);
        let fd = ioctl_socket().map_err(|e| io_err("opening an ioctl socket", e))?;

        // Before it comes up, so that no IPv6 link-local traffic starts. A host without IPv6
        // has no such files, which is fine without `v6`.
        let conf = |key: &str, value: &str| {
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/{key}"), value)
        };
        if v6.is_some() {
            for (key, value) in [
                ("addr_gen_mode", "1"),
                ("accept_ra", "0"),
                ("router_solicitations", "0"),
                ("accept_dad", "0"),
                ("disable_ipv6", "0"),
            ] {
                conf(key, value).map_err(|e| io_err("setting up IPv6 on the TUN device", e))?;
            }
        } else {
            let _ = conf("disable_ipv6", "1");
        }

        let mut req = ifreq(name)?;
        req.ifr_ifru.ifru_addr = sockaddr_v4(addr);
        ifreq_ioctl(&fd, libc::SIOCSIFADDR, &mut req)
            .map_err(|e| io_err("setting the TUN address", e))?;

        let mask = u32::MAX
            .checked_shl(32 - u32::from(prefix.min(32)))
            .unwrap_or(0);
        let mut req = ifreq(name)?;
        req.ifr_ifru.ifru_netmask = sockaddr_v4(Ipv4Addr::from(mask));
        ifreq_ioctl(&fd, libc::SIOCSIFNETMASK, &mut req)
            .map_err(|e| io_err("setting the TUN netmask", e))?;

        let mut req = ifreq(name)?;
        req.ifr_ifru.ifru_mtu = libc::c_int::try_from(mtu).unwrap_or(libc::c_int::MAX);
        ifreq_ioctl(&fd, libc::SIOCSIFMTU, &mut req)
            .map_err(|e| io_err("setting the TUN MTU", e))?;

        let mut req = ifreq(name)?;
        ifreq_ioctl(&fd, libc::SIOCGIFFLAGS, &mut req)
            .map_err(|e| io_err("reading the TUN flags", e))?;
        // SAFETY: SIOCGIFFLAGS succeeded, so the kernel wrote the `ifru_flags` member.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        req.ifr_ifru.ifru_flags = flags | short(libc::IFF_UP | libc::IFF_RUNNING).cast_signed();
        ifreq_ioctl(&fd, libc::SIOCSIFFLAGS, &mut req)
            .map_err(|e| io_err("bringing the TUN device up", e))?;

        if let Some((ip, prefix)) = v6 {
            let index = crate::Interface::lookup(name)?.index;
            crate::rtnl::Rtnl::open()
                .and_then(|mut r| r.add_ipv6_address(index, ip, prefix))
                .map_err(|e| io_err("setting the TUN IPv6 address", e))?;
        }
        Ok(())
    }

    /// Waits up to `timeout` for a packet and reads it: its first bytes into `buf`, the rest
    /// (a super-packet's) into slot 0 of `large`, whose head must be at least `buf`'s length.
    /// `None` when none came.
    ///
    /// # Errors
    /// The device failed (it was removed, for instance).
    pub fn recv(
        &self,
        buf: &mut [u8],
        large: &mut LargeFrames,
        timeout: Duration,
    ) -> io::Result<Option<TunPacket>> {
        if let Some(p) = self.try_recv(buf, large)? {
            return Ok(Some(p));
        }
        if !sys::wait_readable(self.fd.as_raw_fd(), timeout)? {
            return Ok(None);
        }
        self.try_recv(buf, large)
    }

    /// [`Tun::recv`] of a packet that is already waiting, without waiting.
    ///
    /// # Errors
    /// The device failed.
    pub fn try_recv(
        &self,
        buf: &mut [u8],
        large: &mut LargeFrames,
    ) -> io::Result<Option<TunPacket>> {
        assert!(
            buf.len() <= large.head(),
            "a buffer longer than the LargeFrames head"
        );
        let mut head = VNET_HDR_NONE;
        let head_len = if self.offloads.is_some() {
            VNET_HDR_LEN
        } else {
            0
        };
        let tail = large.tail_mut(0).unwrap_or_default();
        let room = buf.len() + tail.len();
        let iov = [
            libc::iovec {
                iov_base: head.as_mut_ptr().cast(),
                iov_len: head_len,
            },
            libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            },
            libc::iovec {
                iov_base: tail.as_mut_ptr().cast(),
                iov_len: tail.len(),
            },
        ];
        // SAFETY: every iovec points into a live, exclusively borrowed buffer of its length,
        // and the count is the array's.
        let n = unsafe { libc::readv(self.fd.as_raw_fd(), iov.as_ptr(), 3) };
        let Ok(n) = usize::try_from(n) else {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        };
        let len = n.saturating_sub(head_len);
        let (checksum, coalesced) = if head_len > 0 {
            (partial_checksum(&head), parse_vnet(&head).1)
        } else {
            (None, None)
        };
        Ok(Some(TunPacket {
            len,
            truncated: n < head_len || len > room,
            checksum,
            coalesced,
        }))
    }

    /// Writes one IP packet into the device (the host's stack receives it). On a device with
    /// offloads, `checksum` says where the transport checksum is left for the host to take as
    /// correct (its field must hold the pseudo-header sum); without, it must be `None`.
    ///
    /// # Errors
    /// The kernel refused it (a full queue: `WouldBlock`; not an IP packet or a checksum
    /// left to a device without offloads: `InvalidInput`).
    pub fn send(&self, packet: &[u8], checksum: Option<PartialChecksum>) -> io::Result<usize> {
        let head = vnet_checksum(checksum);
        let head_len = match (self.offloads, checksum) {
            (Some(_), _) => VNET_HDR_LEN,
            (None, None) => 0,
            (None, Some(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a partial checksum for a TUN device without offloads",
                ));
            }
        };
        let iov = [
            libc::iovec {
                iov_base: head.as_ptr().cast_mut().cast(),
                iov_len: head_len,
            },
            libc::iovec {
                iov_base: packet.as_ptr().cast_mut().cast(),
                iov_len: packet.len(),
            },
        ];
        // SAFETY: both iovecs point into live buffers of their lengths, which writev only
        // reads; the count is the array's.
        let n = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), 2) };
        usize::try_from(n)
            .map(|n| n.saturating_sub(head_len))
            .map_err(|_| io::Error::last_os_error())
    }

    /// Writes messages gathered from pieces, one system call each (a TUN device has no
    /// `sendmmsg`): message `m` is `parts[messages[m].parts]`, an IP packet, or with `gso` (a
    /// device with offloads only) a TCP or UDP super-packet the host's stack takes as its
    /// segments (the transport checksum field holding the pseudo-header sum). Returns how
    /// many were written; each refused one is reported to `refused` with its index.
    pub fn send_gathered(
        &self,
        parts: &[&[u8]],
        messages: &[Gathered],
        mut refused: impl FnMut(usize, io::Error),
    ) -> usize {
        let mut sent = 0;
        for (m, msg) in messages.iter().enumerate() {
            let head = match (msg.gso, self.offloads) {
                (None, _) => VNET_HDR_NONE,
                (Some(gso), Some(_)) => vnet_gso(gso),
                (Some(_), None) => {
                    refused(m, io::Error::from_raw_os_error(libc::EINVAL));
                    continue;
                }
            };
            let Some(pieces) = parts.get(msg.parts.clone()).filter(|p| p.len() < MAX_IOV) else {
                refused(m, io::Error::from_raw_os_error(libc::EINVAL));
                continue;
            };
            let head_len = if self.offloads.is_some() {
                VNET_HDR_LEN
            } else {
                0
            };
            let empty = libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            };
            let mut iov = [empty; MAX_IOV];
            iov[0] = libc::iovec {
                iov_base: head.as_ptr().cast_mut().cast(),
                iov_len: head_len,
            };
            for (v, piece) in iov[1..].iter_mut().zip(pieces) {
                *v = libc::iovec {
                    iov_base: piece.as_ptr().cast_mut().cast(),
                    iov_len: piece.len(),
                };
            }
            let count = libc::c_int::try_from(pieces.len() + 1).unwrap_or(0);
            // SAFETY: the first `count` iovecs point into live buffers of their lengths (the
            // header and the caller's parts), which writev only reads.
            let n = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), count) };
            if n < 0 {
                refused(m, io::Error::last_os_error());
            } else {
                sent += 1;
            }
        }
        sent
    }

    /// Writes whole IP packets, one system call each: (written, refused, the last refusal).
    pub fn send_batch(&self, packets: &[&[u8]]) -> (usize, usize, Option<io::Error>) {
        let (mut sent, mut failed, mut last) = (0, 0, None);
        for p in packets {
            match self.send(p, None) {
                Ok(_) => sent += 1,
                Err(e) => {
                    failed += 1;
                    last = Some(e);
                }
            }
        }
        (sent, failed, last)
    }
}

//! The node's overlay interface: a TUN device (tun-tap opens it, `IFF_TUN | IFF_NO_PI`: one
//! IPv4 or IPv6 packet per read and write, no header), with its address, netmask, MTU and
//! state set through interface ioctls. The device lives as long as this value: closing it
//! removes the interface, its address and the routes through it.

use std::io;
use std::mem::zeroed;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd as _;
use std::time::Duration;

use crate::NetError;
use crate::sys::{self, cvt, ifreq, ifreq_ioctl, ioctl_socket, short};

/// A TUN device.
#[derive(Debug)]
pub struct Tun {
    iface: tun_tap::Iface,
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

impl Tun {
    /// Creates the TUN device `name` (`%d` is replaced by a free number), non-blocking.
    ///
    /// # Errors
    /// No `/dev/net/tun`, the name taken or invalid, or no `CAP_NET_ADMIN`.
    pub fn create(name: &str) -> Result<Self, NetError> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
            return Err(NetError::BadInterfaceName(name.to_owned()));
        }
        let iface = tun_tap::Iface::without_packet_info(name, tun_tap::Mode::Tun)
            .map_err(|e| NetError::from_io("creating the TUN device", name, "CAP_NET_ADMIN", e))?;
        let fd = iface.as_raw_fd();
        // SAFETY: fcntl(2) on a descriptor we own, with integer arguments only.
        let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })
            .and_then(|f| cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, f | libc::O_NONBLOCK) }))
            .map_err(|e| NetError::from_io("making the TUN device non-blocking", name, "", e));
        flags?;
        Ok(Self { iface })
    }

    /// The device's name as the kernel gave it.
    pub fn name(&self) -> &str {
        self.iface.name()
    }

    /// Gives the device `addr`/`prefix` (the kernel then routes the whole prefix through
    /// it), the MTU `mtu`, and brings it up. IPv6 is switched off on it (the overlay is IPv4:
    /// the host's router solicitations and the like have nowhere to go).
    ///
    /// # Errors
    /// The kernel refuses (`CAP_NET_ADMIN`, an address in use, an MTU out of range).
    pub fn configure(&self, addr: Ipv4Addr, prefix: u8, mtu: u32) -> Result<(), NetError> {
        let name = self.name();
        let io_err = |op, e| NetError::from_io(op, name, "CAP_NET_ADMIN", e);
        let fd = ioctl_socket().map_err(|e| io_err("opening an ioctl socket", e))?;

        // Before it comes up, so that no IPv6 link-local traffic starts. A host without IPv6
        // has no such file, which is fine.
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");

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
        Ok(())
    }

    /// Waits up to `timeout` for a packet and reads it into `buf`: its length, or `None`
    /// when none came. A packet larger than `buf` is cut by the kernel; give a buffer of the
    /// MTU at least.
    ///
    /// # Errors
    /// The device failed (it was removed, for instance).
    pub fn recv(&self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        match self.iface.recv(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if !sys::wait_readable(self.iface.as_raw_fd(), timeout)? {
            return Ok(None);
        }
        match self.iface.recv(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads a packet that is already waiting, without waiting: `None` when there is none.
    ///
    /// # Errors
    /// The device failed.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self.iface.recv(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes one IP packet into the device (the host's stack receives it).
    ///
    /// # Errors
    /// The kernel refused it (a full queue: `WouldBlock`; not an IP packet: `InvalidInput`).
    pub fn send(&self, packet: &[u8]) -> io::Result<usize> {
        self.iface.send(packet)
    }
}

//! Network interfaces: lookup (index, MAC, MTU, state) and receive-offload control.

use std::io;

use crate::NetError;
use crate::sys::{ifreq, ifreq_ioctl, ioctl_socket};

// linux/ethtool.h: the legacy per-feature commands, available on every kernel we target.
const ETHTOOL_GFLAGS: u32 = 0x25;
const ETHTOOL_SFLAGS: u32 = 0x26;
const ETHTOOL_GGRO: u32 = 0x2b;
const ETHTOOL_SGRO: u32 = 0x2c;
const ETH_FLAG_LRO: u32 = 1 << 15;

/// `struct ethtool_value` from linux/ethtool.h.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// A network interface as the kernel describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Its name.
    pub name: String,
    /// Its index.
    pub index: u32,
    /// Its hardware address.
    pub mac: [u8; 6],
    /// Its MTU.
    pub mtu: u32,
    /// Whether it is administratively up.
    pub up: bool,
}

impl Interface {
    /// Looks `name` up.
    ///
    /// # Errors
    /// [`NetError::NoSuchInterface`], [`NetError::BadInterfaceName`], or an I/O error.
    pub fn lookup(name: &str) -> Result<Self, NetError> {
        let fd = ioctl_socket()
            .map_err(|e| NetError::from_io("opening an ioctl socket", name, "CAP_NET_ADMIN", e))?;
        let io_err = |op, e| NetError::from_io(op, name, "CAP_NET_ADMIN", e);

        let mut req = ifreq(name)?;
        ifreq_ioctl(&fd, libc::SIOCGIFINDEX, &mut req)
            .map_err(|e| io_err("reading the interface index", e))?;
        // SAFETY: SIOCGIFINDEX succeeded, so the kernel wrote the `ifru_ifindex` member.
        let index = u32::try_from(unsafe { req.ifr_ifru.ifru_ifindex })
            .map_err(|_| NetError::NoSuchInterface(name.to_owned()))?;

        let mut req = ifreq(name)?;
        ifreq_ioctl(&fd, libc::SIOCGIFHWADDR, &mut req)
            .map_err(|e| io_err("reading the hardware address", e))?;
        // SAFETY: SIOCGIFHWADDR succeeded, so the kernel wrote the `ifru_hwaddr` member.
        let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
        let mut mac = [0u8; 6];
        for (dst, src) in mac.iter_mut().zip(hw.sa_data.iter()) {
            *dst = *src as u8;
        }

        let mut req = ifreq(name)?;
        ifreq_ioctl(&fd, libc::SIOCGIFMTU, &mut req).map_err(|e| io_err("reading the MTU", e))?;
        // SAFETY: SIOCGIFMTU succeeded, so the kernel wrote the `ifru_mtu` member.
        let mtu = u32::try_from(unsafe { req.ifr_ifru.ifru_mtu }).unwrap_or(0);

        let mut req = ifreq(name)?;
        ifreq_ioctl(&fd, libc::SIOCGIFFLAGS, &mut req)
            .map_err(|e| io_err("reading the interface flags", e))?;
        // SAFETY: SIOCGIFFLAGS succeeded, so the kernel wrote the `ifru_flags` member.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        let up = libc::c_int::from(flags) & libc::IFF_UP != 0;

        Ok(Self {
            name: name.to_owned(),
            index,
            mac,
            mtu,
            up,
        })
    }

    /// Sets the interface up (`IFF_UP`) if it is down; returns whether it was down. Needs
    /// `CAP_NET_ADMIN` for that.
    ///
    /// # Errors
    /// No such interface, or it cannot be set up.
    pub fn bring_up(name: &str) -> Result<bool, NetError> {
        let io_err = |op, e| NetError::from_io(op, name, "CAP_NET_ADMIN", e);
        let fd = ioctl_socket().map_err(|e| io_err("opening an ioctl socket", e))?;
        let mut req = ifreq(name)?;
        ifreq_ioctl(&fd, libc::SIOCGIFFLAGS, &mut req)
            .map_err(|e| io_err("reading the interface flags", e))?;
        // SAFETY: SIOCGIFFLAGS succeeded, so the kernel wrote the `ifru_flags` member.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        if libc::c_int::from(flags) & libc::IFF_UP != 0 {
            return Ok(false);
        }
        // IFF_UP is 1: it fits the 16-bit flags field.
        let up = libc::c_short::try_from(libc::IFF_UP).unwrap_or(1);
        req.ifr_ifru.ifru_flags = flags | up;
        ifreq_ioctl(&fd, libc::SIOCSIFFLAGS, &mut req)
            .map_err(|e| io_err("setting the interface up", e))?;
        Ok(true)
    }

    /// Like [`Interface::lookup`], but an interface that is down is an error.
    ///
    /// # Errors
    /// As [`Interface::lookup`], plus [`NetError::InterfaceDown`].
    pub fn lookup_up(name: &str) -> Result<Self, NetError> {
        let iface = Self::lookup(name)?;
        if !iface.up {
            return Err(NetError::InterfaceDown(name.to_owned()));
        }
        Ok(iface)
    }
}

/// A receive offload that merges frames before we see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    /// Generic receive offload (software merging in the kernel).
    Gro,
    /// Large receive offload (merging in the NIC).
    Lro,
}

/// An offload's state before and after [`disable_receive_offloads`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffloadState {
    /// Which offload.
    pub offload: Offload,
    /// On before; `None` if the driver does not report it.
    pub was_on: Option<bool>,
    /// On after; `None` if the driver does not report it.
    pub now_on: Option<bool>,
}

/// Whether GRO and LRO are on (`None` where the driver does not say).
///
/// # Errors
/// A bad name or a failing ioctl socket.
pub fn receive_offloads(name: &str) -> Result<[OffloadState; 2], NetError> {
    let fd = ioctl_socket()
        .map_err(|e| NetError::from_io("opening an ioctl socket", name, "CAP_NET_ADMIN", e))?;
    let gro = ethtool_get(&fd, name, ETHTOOL_GGRO)?.map(|v| v != 0);
    let lro = ethtool_get(&fd, name, ETHTOOL_GFLAGS)?.map(|v| v & ETH_FLAG_LRO != 0);
    Ok([
        OffloadState {
            offload: Offload::Gro,
            was_on: gro,
            now_on: gro,
        },
        OffloadState {
            offload: Offload::Lro,
            was_on: lro,
            now_on: lro,
        },
    ])
}

/// Switches GRO and LRO off on `name`, so that every frame reaches us as it was on the wire
/// (the adapter paper does the same). Offloads a driver does not support are reported as
/// `None`, not as errors.
///
/// # Errors
/// [`NetError::NotPermitted`] without `CAP_NET_ADMIN`, or another ioctl failure.
pub fn disable_receive_offloads(name: &str) -> Result<[OffloadState; 2], NetError> {
    let fd = ioctl_socket()
        .map_err(|e| NetError::from_io("opening an ioctl socket", name, "CAP_NET_ADMIN", e))?;
    let gro_before = ethtool_get(&fd, name, ETHTOOL_GGRO)?.map(|v| v != 0);
    if gro_before == Some(true) {
        ethtool_set(&fd, name, ETHTOOL_SGRO, 0)?;
    }
    let gro_after = ethtool_get(&fd, name, ETHTOOL_GGRO)?.map(|v| v != 0);
    let flags = ethtool_get(&fd, name, ETHTOOL_GFLAGS)?;
    let lro_before = flags.map(|v| v & ETH_FLAG_LRO != 0);
    if let Some(f) = flags.filter(|f| f & ETH_FLAG_LRO != 0) {
        ethtool_set(&fd, name, ETHTOOL_SFLAGS, f & !ETH_FLAG_LRO)?;
    }
    let lro_after = ethtool_get(&fd, name, ETHTOOL_GFLAGS)?.map(|v| v & ETH_FLAG_LRO != 0);
    Ok([
        OffloadState {
            offload: Offload::Gro,
            was_on: gro_before,
            now_on: gro_after,
        },
        OffloadState {
            offload: Offload::Lro,
            was_on: lro_before,
            now_on: lro_after,
        },
    ])
}

fn ethtool(
    fd: &std::os::fd::OwnedFd,
    name: &str,
    value: &mut EthtoolValue,
) -> Result<bool, NetError> {
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_data = std::ptr::from_mut(value).cast::<libc::c_char>();
    match ifreq_ioctl(fd, libc::SIOCETHTOOL, &mut req) {
        Ok(()) => Ok(true),
        // Not supported by the driver; or (ENOSYS) by the kernel interface we run on, as
        // under qemu-user, which does not translate ethtool requests: the state is unknown.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS)
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(NetError::from_io(
            "changing receive offloads (ethtool)",
            name,
            "CAP_NET_ADMIN",
            e,
        )),
    }
}

fn ethtool_get(fd: &std::os::fd::OwnedFd, name: &str, cmd: u32) -> Result<Option<u32>, NetError> {
    let mut value = EthtoolValue { cmd, data: 0 };
    Ok(ethtool(fd, name, &mut value)?.then_some(value.data))
}

fn ethtool_set(fd: &std::os::fd::OwnedFd, name: &str, cmd: u32, data: u32) -> Result<(), NetError> {
    let mut value = EthtoolValue { cmd, data };
    if ethtool(fd, name, &mut value)? {
        Ok(())
    } else {
        Err(NetError::Io {
            op: "changing receive offloads (ethtool)",
            target: name.to_owned(),
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found_and_unknown_names_are_clear_errors() {
        let lo = Interface::lookup("lo").unwrap();
        assert!(lo.index > 0 && lo.up);
        assert_eq!(lo.mac, [0; 6]);
        let err = Interface::lookup("cyphonic-none0").unwrap_err();
        assert!(
            matches!(err, NetError::NoSuchInterface(ref n) if n == "cyphonic-none0"),
            "{err}"
        );
        assert!(err.to_string().contains("no such network interface"));
    }
}

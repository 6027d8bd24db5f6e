//! Notice when this host's addresses or routes change: a `NETLINK_ROUTE` socket subscribed to
//! the address and route multicast groups. Nothing is parsed beyond the message types: the
//! tunnel only needs to know *that* the underlay moved (a DHCP renewal, a failover to another
//! uplink, a cable moved) to tell its peers and the cloud where it is now, at once instead of
//! at the next keepalive.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::NetError;
use crate::sys::{self, cvt};

/// The multicast groups (bit masks of `sockaddr_nl.nl_groups`) a watch joins.
const GROUPS: u32 = (libc::RTMGRP_IPV4_IFADDR
    | libc::RTMGRP_IPV6_IFADDR
    | libc::RTMGRP_IPV4_ROUTE
    | libc::RTMGRP_IPV6_ROUTE) as u32;

/// The message types that count as a change.
const CHANGES: [u16; 4] = [
    libc::RTM_NEWADDR,
    libc::RTM_DELADDR,
    libc::RTM_NEWROUTE,
    libc::RTM_DELROUTE,
];

/// Length of `struct nlmsghdr`.
const HEADER: usize = 16;

/// A subscription to address and route changes in this network namespace.
#[derive(Debug)]
pub struct AddressWatch {
    fd: OwnedFd,
}

impl AddressWatch {
    /// Opens the subscription; [`AddressWatch::wait`] gives up after `poll` without news.
    ///
    /// # Errors
    /// [`NetError`] when the netlink socket cannot be opened or bound.
    pub fn open(poll: Duration) -> Result<Self, NetError> {
        let err = |op| move |e| NetError::from_io(op, "netlink route socket", "CAP_NET_ADMIN", e);
        // SAFETY: plain socket(2) call with constant arguments.
        let fd = cvt(unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        })
        .map_err(err("socket"))?;
        // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_nl is plain old data; all-zero is valid (pid 0: the kernel picks).
        let mut addr: libc::sockaddr_nl = unsafe { zeroed() };
        addr.nl_family = sys::short(libc::AF_NETLINK);
        addr.nl_groups = GROUPS;
        let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_nl>()).expect("fits");
        // SAFETY: `addr` is a live, initialised sockaddr_nl of `len` bytes; the kernel reads it.
        cvt(unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) })
            .map_err(err("bind"))?;
        sys::set_recv_timeout(fd.as_raw_fd(), Some(poll)).map_err(err("SO_RCVTIMEO"))?;
        Ok(Self { fd })
    }

    /// Waits up to the poll interval for news; `true` when an address or a route was added
    /// or removed since the last call (everything queued is read). A lost notification
    /// (the socket overran) counts as a change.
    ///
    /// # Errors
    /// The socket failed for another reason than a timeout.
    pub fn wait(&self) -> io::Result<bool> {
        let mut buf = vec![0u8; 16 << 10];
        let mut changed = false;
        let mut flags = 0;
        loop {
            // SAFETY: `buf` is a live, exclusively borrowed buffer of `buf.len()` bytes.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    flags,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::ENOBUFS) => {
                        changed = true;
                        continue;
                    }
                    Some(libc::EAGAIN | libc::EINTR) => Ok(changed),
                    _ => Err(e),
                };
            }
            let n = usize::try_from(n).expect("non-negative");
            changed |= has_change(&buf[..n]);
            // Drain what else is queued without waiting.
            flags = libc::MSG_DONTWAIT;
        }
    }
}

/// Whether a datagram of netlink messages holds an address or route change.
fn has_change(mut msgs: &[u8]) -> bool {
    while msgs.len() >= HEADER {
        let len = u32::from_ne_bytes([msgs[0], msgs[1], msgs[2], msgs[3]]) as usize;
        let kind = u16::from_ne_bytes([msgs[4], msgs[5]]);
        if CHANGES.contains(&kind) {
            return true;
        }
        // Messages are 4-byte aligned; a length shorter than the header ends the walk.
        let step = (len + 3) & !3;
        if len < HEADER || step > msgs.len() {
            break;
        }
        msgs = &msgs[step..];
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, payload: usize) -> Vec<u8> {
        let len = HEADER + payload;
        let mut m = Vec::new();
        m.extend_from_slice(&u32::try_from(len).unwrap().to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.resize(len.next_multiple_of(4), 0);
        m
    }

    #[test]
    fn address_and_route_messages_are_changes() {
        for kind in CHANGES {
            assert!(has_change(&message(kind, 8)), "{kind}");
        }
        assert!(!has_change(&message(libc::RTM_NEWLINK, 8)));
        let mut two = message(libc::RTM_NEWLINK, 5);
        two.extend(message(libc::RTM_DELADDR, 3));
        assert!(has_change(&two));
    }

    #[test]
    fn malformed_datagrams_are_not_changes_and_do_not_loop() {
        assert!(!has_change(&[]));
        assert!(!has_change(&[0xff; 7]));
        // A zero length would loop forever if it were trusted.
        let mut zero = message(libc::RTM_NEWLINK, 0);
        zero[..4].copy_from_slice(&0u32.to_ne_bytes());
        zero.extend(message(libc::RTM_NEWADDR, 0));
        assert!(!has_change(&zero));
        // A length past the end.
        let mut long = message(libc::RTM_NEWLINK, 0);
        long[..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(!has_change(&long));
    }
}

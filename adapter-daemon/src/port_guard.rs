//! Keeps the host's kernel off the LAN port, whatever the host's other software does to it
//! (docs/security.md, "no packet leaves in clear" and "the LAN port is the adapter's").
//!
//! Devices address the gateway by `cyphonic_gateway::gateway_mac`, which is not the NIC's
//! own MAC, so the kernel's IP stack would not take their packets in anyway; a device can
//! still address the NIC's own MAC, and an address a DHCP client or a network manager puts on
//! the port would make the kernel answer devices and send its own traffic to them. The guard
//! holds, checked every second and put back (counted, logged) when something changed it:
//!
//! - an ingress filter that drops every frame arriving on the port after the capture socket
//!   has seen it (`cyphonic_netio::Rtnl::install_ingress_drop`): ARP, IPv4 and IPv6 from
//!   devices never reach the kernel's stack, whatever MAC or address they use;
//! - no IPv4 address on the port (removed when one appears);
//! - `net/ipv4/conf/<lan>/forwarding = 0`: IPv4 arriving on the LAN port is never routed on.
//!   Writing `net.ipv4.ip_forward=1`, as Docker does when it starts, resets every interface's
//!   `forwarding` to 1;
//! - `net/ipv6/conf/<lan>/disable_ipv6 = 1`: no IPv6 and no link-local address on the port
//!   (the overlay carries devices' IPv4; capture does not need the kernel's IPv6);
//! - `net/ipv4/conf/<lan>/arp_ignore = 8`: the kernel answers no ARP on it.
//!
//! The last three are redundant with the filter while it holds; they stay for kernels without
//! `cls_bpf` and for the moment between a `tc qdisc del` and the guard's next look.
//! Nothing is undone when the adapter stops: the port stays closed to the host
//! (docs/operations.md says how to give it back).

use std::io;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use cyphonic_netio::Rtnl;

/// One setting the guard holds.
#[derive(Debug, Clone)]
struct Setting {
    path: PathBuf,
    value: &'static str,
}

/// The LAN port's guard.
#[derive(Debug)]
pub struct PortGuard {
    settings: Vec<Setting>,
    /// The port's interface index and the routing-netlink socket for its filter and
    /// addresses; `None` in the tests of the sysctl part.
    kernel: Option<(u32, io::Result<Rtnl>)>,
}

impl PortGuard {
    /// The guard for the LAN interface `iface` (index `index`), under `/proc/sys/net`.
    pub fn new(iface: &str, index: u32) -> Self {
        let mut guard = Self::under(&PathBuf::from("/proc/sys/net"), iface);
        guard.kernel = Some((index, Rtnl::open()));
        guard
    }

    /// The sysctl part of the guard under another root (the tests' temporary directory).
    fn under(root: &std::path::Path, iface: &str) -> Self {
        Self {
            kernel: None,
            settings: vec![
                Setting {
                    path: root.join("ipv4/conf").join(iface).join("forwarding"),
                    value: "0",
                },
                Setting {
                    path: root.join("ipv6/conf").join(iface).join("disable_ipv6"),
                    value: "1",
                },
                Setting {
                    path: root.join("ipv4/conf").join(iface).join("arp_ignore"),
                    value: "8",
                },
            ],
        }
    }

    /// Checks each part of the guard and puts back what differs; returns what it had to put
    /// back (a sysctl's path, "ingress drop filter", "address 192.0.2.7/24 removed"), so the
    /// caller can count and say so. Every part is tried, whatever another part's failure.
    ///
    /// # Errors
    /// The first part that cannot be checked or put back (no privileges, no such interface,
    /// IPv6 compiled out, a kernel without `cls_bpf`), after the others were tried: the caller
    /// says so once; the gateway's own MAC still keeps devices' frames away from the kernel.
    pub fn enforce(&mut self) -> io::Result<Vec<String>> {
        let mut restored = Vec::new();
        let mut first_error = None;
        for s in &self.settings {
            match hold_setting(s) {
                Ok(true) => restored.push(s.path.display().to_string()),
                Ok(false) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some((index, rtnl)) = &mut self.kernel {
            match rtnl {
                Ok(rtnl) => {
                    if let Err(e) = hold_kernel_off(rtnl, *index, &mut restored) {
                        first_error.get_or_insert(e);
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(io::Error::new(
                        e.kind(),
                        format!("opening a routing-netlink socket: {e}"),
                    ));
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(restored),
        }
    }
}

/// Writes `s` back if it differs; whether it did.
fn hold_setting(s: &Setting) -> io::Result<bool> {
    let at = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", s.path.display()));
    let now = std::fs::read_to_string(&s.path).map_err(at)?;
    if now.trim() == s.value {
        return Ok(false);
    }
    std::fs::write(&s.path, s.value).map_err(at)?;
    Ok(true)
}

/// Puts the ingress drop filter back if it is missing and removes the port's IPv4 addresses,
/// naming each in `restored`.
fn hold_kernel_off(rtnl: &mut Rtnl, index: u32, restored: &mut Vec<String>) -> io::Result<()> {
    let filter = |e: io::Error| io::Error::new(e.kind(), format!("the ingress drop filter: {e}"));
    if !rtnl.ingress_drop_present(index).map_err(filter)? {
        rtnl.install_ingress_drop(index).map_err(filter)?;
        restored.push("ingress drop filter".to_owned());
    }
    let addresses: Vec<(Ipv4Addr, u8)> = rtnl
        .ipv4_addresses(index)
        .map_err(|e| io::Error::new(e.kind(), format!("the port's addresses: {e}")))?;
    for (ip, len) in addresses {
        match rtnl.remove_ipv4_address(index, ip, len) {
            Ok(true) => restored.push(format!("address {ip}/{len} removed")),
            Ok(false) => {} // gone between the dump and the removal
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("removing {ip}/{len}: {e}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_drifted_are_put_back_and_named() {
        let root = std::env::temp_dir().join(format!("cy-guard-{}", std::process::id()));
        let v4 = root.join("ipv4/conf/lan0");
        let v6 = root.join("ipv6/conf/lan0");
        std::fs::create_dir_all(&v4).unwrap();
        std::fs::create_dir_all(&v6).unwrap();
        std::fs::write(v4.join("forwarding"), "1\n").unwrap();
        std::fs::write(v6.join("disable_ipv6"), "0\n").unwrap();
        std::fs::write(v4.join("arp_ignore"), "0\n").unwrap();
        let mut guard = PortGuard::under(&root, "lan0");
        assert_eq!(guard.enforce().unwrap().len(), 3);
        assert_eq!(std::fs::read_to_string(v4.join("arp_ignore")).unwrap(), "8");
        assert_eq!(std::fs::read_to_string(v4.join("forwarding")).unwrap(), "0");
        assert_eq!(
            std::fs::read_to_string(v6.join("disable_ipv6")).unwrap(),
            "1"
        );
        assert!(guard.enforce().unwrap().is_empty(), "nothing to put back");
        // Docker turns forwarding on again: put back once more.
        std::fs::write(v4.join("forwarding"), "1\n").unwrap();
        let restored = guard.enforce().unwrap();
        assert_eq!(restored.len(), 1);
        assert!(restored[0].ends_with("ipv4/conf/lan0/forwarding"));
        assert!(PortGuard::under(&root, "missing0").enforce().is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}

//! Keeps the host's kernel from forwarding what devices send it, whatever the host's other
//! software does to its sysctls (docs/security.md, "no packet leaves in clear").
//!
//! Devices address the gateway by `cyphonic_gateway::gateway_mac`, which is not the NIC's
//! own MAC, so the kernel's IP stack never takes their packets in. A device could still send
//! to the NIC's own MAC (it learns it from the kernel's ARP answers for the host's other
//! addresses); for that the LAN port gets two settings of its own, checked every second and
//! put back (counted, logged) when something changed them. Writing
//! `net.ipv4.ip_forward=1`, as Docker does when it starts, resets every interface's
//! `forwarding` to 1.
//!
//! - `net/ipv4/conf/<lan>/forwarding = 0`: IPv4 arriving on the LAN port is never routed on.
//! - `net/ipv6/conf/<lan>/disable_ipv6 = 1`: the kernel drops IPv6 arriving on it (the overlay
//!   carries devices' IPv4; capture does not need the kernel's IPv6).
//! - `net/ipv4/conf/<lan>/arp_ignore = 8`: the kernel answers no ARP on it, for none of the
//!   host's addresses, so devices do not learn the NIC's own MAC (or the host's other
//!   addresses) from the kernel; the gateway answers ARP for its vIP itself.

use std::io;
use std::path::PathBuf;

/// One setting the guard holds.
#[derive(Debug, Clone)]
struct Setting {
    path: PathBuf,
    value: &'static str,
}

/// The LAN port's guard settings.
#[derive(Debug, Clone)]
pub struct ForwardGuard {
    settings: Vec<Setting>,
}

impl ForwardGuard {
    /// The guard for the LAN interface `iface`, under `/proc/sys/net`.
    pub fn new(iface: &str) -> Self {
        Self::under(&PathBuf::from("/proc/sys/net"), iface)
    }

    /// The guard under another root (the tests' temporary directory).
    fn under(root: &std::path::Path, iface: &str) -> Self {
        Self {
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

    /// Reads each setting and writes back the guard's value where it differs; returns the
    /// settings it had to put back (by path), so the caller can count and say so.
    ///
    /// # Errors
    /// A setting cannot be read or written (no privileges, no such interface, IPv6 compiled
    /// out): the caller says so once; the gateway's own MAC still keeps devices' frames out.
    pub fn enforce(&self) -> io::Result<Vec<String>> {
        let mut restored = Vec::new();
        for s in &self.settings {
            let now = std::fs::read_to_string(&s.path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", s.path.display())))?;
            if now.trim() != s.value {
                std::fs::write(&s.path, s.value)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", s.path.display())))?;
                restored.push(s.path.display().to_string());
            }
        }
        Ok(restored)
    }
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
        let guard = ForwardGuard::under(&root, "lan0");
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
        assert!(ForwardGuard::under(&root, "missing0").enforce().is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}

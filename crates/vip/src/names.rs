//! Device names: `<label>.<adapter FQDN>`, one per lease, decided deterministically.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::Lease;

const MAX_LABEL: usize = 63;

/// The DNS label for a device: its DHCP hostname made into a label (RFC 1123: letters, digits,
/// inner hyphens; lower case; at most 63), or, without a usable hostname, one derived from its
/// MAC (`dev-02000000010a`).
pub fn label_for(hostname: Option<&str>, mac: [u8; 6]) -> String {
    let cleaned = hostname.map(sanitize).unwrap_or_default();
    if cleaned.is_empty() {
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        format!("dev-{hex}")
    } else {
        cleaned
    }
}

fn sanitize(hostname: &str) -> String {
    // A hostname may come as an FQDN ("sensor.local"): its first label is the name.
    let first = hostname.split('.').next().unwrap_or_default();
    let mut out = String::with_capacity(first.len());
    for c in first.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let trimmed = out.trim_matches('-');
    trimmed
        .chars()
        .take(MAX_LABEL)
        .collect::<String>()
        .trim_end_matches('-')
        .to_owned()
}

/// The label of every device: each is its address, the host name it gave (or was reserved
/// with) and its MAC. When two devices want the same label, a `pinned` one (a reservation:
/// the operator named it) keeps it over one that only asked for it (a leased device's
/// hostname is whatever the device says), and among equals the one with the lower address
/// (every IPv4 address ranks before every IPv6 one: a device with IPv6 only never moves an
/// IPv4 device's name); the others get their address's last byte appended (`sensor`,
/// `sensor-23`). The result depends only on the set of devices, never on the order in which
/// they came, so names survive restarts; and no device on the LAN can take a reserved
/// device's name (its DNS answers, the rules that name it) by claiming it.
pub fn names<'a>(
    devices: impl IntoIterator<Item = (IpAddr, Option<&'a str>, [u8; 6])>,
    pinned: impl Fn(IpAddr) -> bool,
) -> HashMap<IpAddr, String> {
    let mut wanted: Vec<(bool, IpAddr, String)> = devices
        .into_iter()
        .map(|(ip, hostname, mac)| (!pinned(ip), ip, label_for(hostname, mac)))
        .collect();
    wanted.sort();
    let mut taken: HashMap<String, IpAddr> = HashMap::new();
    let mut out = HashMap::new();
    for (_, ip, label) in wanted {
        let last = match ip {
            IpAddr::V4(v4) => v4.octets()[3],
            IpAddr::V6(v6) => v6.octets()[15],
        };
        let mut unique = label.clone();
        let mut n = 0u32;
        while taken.contains_key(&unique) {
            // `sensor-30`, and in the unlikely case that is a device's own name too, `sensor-30-1`.
            let suffix = if n == 0 {
                format!("-{last}")
            } else {
                format!("-{last}-{n}")
            };
            let base: String = label.chars().take(MAX_LABEL - suffix.len()).collect();
            unique = format!("{}{suffix}", base.trim_end_matches('-'));
            n += 1;
        }
        taken.insert(unique.clone(), ip);
        out.insert(ip, unique);
    }
    out
}

/// [`names`]' devices for `leases`.
pub fn leased(leases: &[Lease]) -> impl Iterator<Item = (IpAddr, Option<&str>, [u8; 6])> {
    leases
        .iter()
        .map(|l| (IpAddr::V4(l.ip), l.hostname.as_deref(), l.mac))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_become_labels() {
        let mac = [2, 0, 0, 0, 1, 10];
        let check = |h: Option<&str>, want: &str| assert_eq!(label_for(h, mac), want, "{h:?}");
        check(Some("sensor1"), "sensor1");
        check(Some("Living Room TV"), "living-room-tv");
        check(Some("printer.local"), "printer");
        check(Some("--x__y--"), "x-y");
        check(Some("ÄÖ-cam"), "cam");
        check(Some(""), "dev-02000000010a");
        check(Some("***"), "dev-02000000010a");
        check(None, "dev-02000000010a");
        assert_eq!(label_for(Some(&"a".repeat(100)), mac).len(), 63);
    }

    #[test]
    fn collisions_resolve_by_address_not_by_order() {
        use std::net::Ipv4Addr;
        let lease = |ip: [u8; 4], host: &str| Lease {
            mac: [2, 0, 0, 0, 0, ip[3]],
            ip: ip.into(),
            hostname: Some(host.into()),
            client_id: None,
            expires: 0,
            active: true,
        };
        let a = [
            lease([100, 64, 1, 30], "sensor"),
            lease([100, 64, 1, 20], "sensor"),
            lease([100, 64, 1, 40], "cam"),
        ];
        let mut b = a.clone();
        b.reverse();
        let v4 = |d: u8| IpAddr::V4(Ipv4Addr::new(100, 64, 1, d));
        let na = names(leased(&a), |_| false);
        assert_eq!(na, names(leased(&b), |_| false));
        assert_eq!(na[&v4(20)], "sensor");
        assert_eq!(na[&v4(30)], "sensor-30");
        assert_eq!(na[&v4(40)], "cam");
        // A reserved device keeps its name against a leased one at a lower address that
        // asks for it (a device may send any hostname).
        let reserved = v4(30);
        let nr = names(leased(&a), |ip| ip == reserved);
        assert_eq!(nr, names(leased(&b), |ip| ip == reserved));
        assert_eq!(nr[&reserved], "sensor");
        assert_eq!(nr[&v4(20)], "sensor-20");
        // A device with IPv6 only that wants a taken label gets the suffix, whatever its
        // address: no IPv4 device's name moves.
        let only6: std::net::Ipv6Addr = "fd7a:0:1:100::1005"
            .parse()
            .unwrap_or(std::net::Ipv6Addr::LOCALHOST);
        let mac6 = [2, 0, 0, 0, 6, 5];
        let n6 = names(
            leased(&a).chain([(IpAddr::V6(only6), Some("cam"), mac6)]),
            |_| false,
        );
        assert_eq!(n6[&v4(40)], "cam");
        assert_eq!(n6[&IpAddr::V6(only6)], "cam-5");
        assert_eq!(n6.len(), 4);
    }
}

//! Device names: `<label>.<adapter FQDN>`, one per lease, decided deterministically.

use std::collections::HashMap;
use std::net::Ipv4Addr;

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

/// The label of every active lease. When two devices want the same label, a `pinned` one
/// (a reservation: the operator named it) keeps it over one that only asked for it (a
/// leased device's hostname is whatever the device says), and among equals the one with
/// the lower address; the others get their address's last byte appended (`sensor`,
/// `sensor-23`). The result depends only on the set of leases, never on the order in which
/// they were granted, so names survive restarts; and no device on the LAN can take a
/// reserved device's name (its DNS answers, the rules that name it) by claiming it.
pub fn names<'a>(
    leases: impl IntoIterator<Item = &'a Lease>,
    pinned: impl Fn(Ipv4Addr) -> bool,
) -> HashMap<Ipv4Addr, String> {
    let mut wanted: Vec<(bool, Ipv4Addr, String)> = leases
        .into_iter()
        .map(|l| (!pinned(l.ip), l.ip, label_for(l.hostname.as_deref(), l.mac)))
        .collect();
    wanted.sort();
    let mut taken: HashMap<String, Ipv4Addr> = HashMap::new();
    let mut out = HashMap::new();
    for (_, ip, label) in wanted {
        let mut unique = label.clone();
        let mut n = 0u32;
        while taken.contains_key(&unique) {
            // `sensor-30`, and in the unlikely case that is a device's own name too, `sensor-30-1`.
            let suffix = if n == 0 {
                format!("-{}", ip.octets()[3])
            } else {
                format!("-{}-{n}", ip.octets()[3])
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
        let na = names(&a, |_| false);
        assert_eq!(na, names(&b, |_| false));
        assert_eq!(na[&Ipv4Addr::new(100, 64, 1, 20)], "sensor");
        assert_eq!(na[&Ipv4Addr::new(100, 64, 1, 30)], "sensor-30");
        assert_eq!(na[&Ipv4Addr::new(100, 64, 1, 40)], "cam");
        // A reserved device keeps its name against a leased one at a lower address that
        // asks for it (a device may send any hostname).
        let reserved = Ipv4Addr::new(100, 64, 1, 30);
        let nr = names(&a, |ip| ip == reserved);
        assert_eq!(nr, names(&b, |ip| ip == reserved));
        assert_eq!(nr[&reserved], "sensor");
        assert_eq!(nr[&Ipv4Addr::new(100, 64, 1, 20)], "sensor-20");
    }
}

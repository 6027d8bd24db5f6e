//! A member's report of its devices and tunnels (docs/protocol.md §8, *Devices and tunnels*):
//! cut into [`ClientMsg::Report`] parts by the client ([`Report::parts`]) and put together
//! again, within bounds, by the cloud ([`Assembler`]).

use crate::msg::{ClientMsg, DeviceReport, TunnelReport};

/// Parts of one report the cloud takes at most.
pub const MAX_PARTS: usize = 64;
/// Devices of one report at most.
pub const MAX_DEVICES: usize = 4096;
/// Tunnels of one report at most.
pub const MAX_TUNNELS: usize = 1024;
/// Characters of a device's host name a report carries at most (the cloud keeps no more).
pub const HOSTNAME_MAX: usize = 64;
/// JSON bytes of devices and tunnels per part at most (a message is at most 65519 bytes).
const PART_BYTES: usize = 48 << 10;

/// A member's whole report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Its devices (an adapter's).
    pub devices: Vec<DeviceReport>,
    /// Its tunnels.
    pub tunnels: Vec<TunnelReport>,
}

impl Report {
    /// A report of `devices` and `tunnels` within the bounds, each host name cut to
    /// [`HOSTNAME_MAX`] characters: beyond [`MAX_DEVICES`], the
    /// devices seen longest ago (or never) are left out; beyond [`MAX_TUNNELS`], the
    /// tunnels without keys, then the last. Returns it and how many of each were left out.
    pub fn bounded(
        mut devices: Vec<DeviceReport>,
        mut tunnels: Vec<TunnelReport>,
    ) -> (Self, (usize, usize)) {
        let left = (
            devices.len().saturating_sub(MAX_DEVICES),
            tunnels.len().saturating_sub(MAX_TUNNELS),
        );
        for d in &mut devices {
            if let Some(h) = d.hostname.as_mut()
                && let Some((cut, _)) = h.char_indices().nth(HOSTNAME_MAX)
            {
                h.truncate(cut);
            }
        }
        if left.0 > 0 {
            devices.sort_by_key(|d| std::cmp::Reverse(d.seen));
            devices.truncate(MAX_DEVICES);
        }
        if left.1 > 0 {
            tunnels.sort_by_key(|t| !t.established);
            tunnels.truncate(MAX_TUNNELS);
        }
        (Self { devices, tunnels }, left)
    }

    /// The report as messages for a session of control `version`, each within 48 KiB of
    /// devices and tunnels as JSON: at least one, the last with `more: false`; relay reasons
    /// as that version knows them.
    pub fn parts(&self, version: u16) -> Vec<ClientMsg> {
        let mut parts = Vec::new();
        let mut part = (Vec::new(), Vec::new(), 0usize);
        let mut flush = |part: &mut (Vec<DeviceReport>, Vec<TunnelReport>, usize)| {
            let (devices, tunnels, _) = std::mem::take(part);
            parts.push(ClientMsg::Report {
                devices,
                tunnels,
                more: true,
            });
        };
        for d in &self.devices {
            let n = json_len(d);
            if part.2 + n > PART_BYTES {
                flush(&mut part);
            }
            part.0.push(d.clone());
            part.2 += n;
        }
        for t in &self.tunnels {
            let n = json_len(t);
            if part.2 + n > PART_BYTES {
                flush(&mut part);
            }
            let mut t = t.clone();
            t.reason = t.reason.map(|r| r.for_version(version));
            part.1.push(t);
            part.2 += n;
        }
        flush(&mut part);
        if let Some(ClientMsg::Report { more, .. }) = parts.last_mut() {
            *more = false;
        }
        parts
    }
}

/// `item`'s length as JSON, with the comma after it.
fn json_len<T: serde::Serialize>(item: &T) -> usize {
    serde_json::to_vec(item).map_or(PART_BYTES, |v| v.len() + 1)
}

/// Why the cloud refuses a report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// Beyond [`MAX_PARTS`], [`MAX_DEVICES`] or [`MAX_TUNNELS`].
    #[error(
        "a report of more than {MAX_PARTS} parts, {MAX_DEVICES} devices or {MAX_TUNNELS} tunnels"
    )]
    TooBig,
    /// A device with no address.
    #[error("a device with neither vip nor vip6")]
    NoAddress,
    /// A tunnel whose peer is not a fingerprint.
    #[error("a tunnel's peer is not a fingerprint (64 hex digits)")]
    BadPeer,
}

/// Gathers the parts of a report, within bounds.
#[derive(Debug, Default)]
pub struct Assembler {
    report: Report,
    parts: usize,
}

impl Assembler {
    /// A part arrived. Returns the whole report once its last part is in, `None` while parts
    /// are missing.
    ///
    /// # Errors
    /// [`ReportError`]: the parts so far are dropped; the next part starts a new report.
    pub fn take(
        &mut self,
        devices: Vec<DeviceReport>,
        tunnels: Vec<TunnelReport>,
        more: bool,
    ) -> Result<Option<Report>, ReportError> {
        let checked = self.check(&devices, &tunnels);
        if let Err(e) = checked {
            *self = Self::default();
            return Err(e);
        }
        self.parts += 1;
        self.report.devices.extend(devices);
        self.report.tunnels.extend(tunnels);
        if more {
            return Ok(None);
        }
        Ok(Some(std::mem::take(self).report))
    }

    fn check(&self, devices: &[DeviceReport], tunnels: &[TunnelReport]) -> Result<(), ReportError> {
        if self.parts >= MAX_PARTS
            || self.report.devices.len() + devices.len() > MAX_DEVICES
            || self.report.tunnels.len() + tunnels.len() > MAX_TUNNELS
        {
            return Err(ReportError::TooBig);
        }
        if devices.iter().any(|d| d.vip.is_none() && d.vip6.is_none()) {
            return Err(ReportError::NoAddress);
        }
        let fingerprint = |p: &str| p.len() == 64 && p.bytes().all(|b| b.is_ascii_hexdigit());
        if !tunnels.iter().all(|t| fingerprint(&t.peer)) {
            return Err(ReportError::BadPeer);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{DeviceKind, Mac, TunnelPath};
    use std::net::Ipv4Addr;

    fn device(i: usize, seen: Option<u64>) -> DeviceReport {
        let i = u32::try_from(i).unwrap();
        let [a, b, c, d] = i.to_be_bytes();
        DeviceReport {
            mac: Mac([2, 0, a, b, c, d]),
            vip: Some(Ipv4Addr::from(0x6440_0000 + i)),
            vip6: None,
            legacy: None,
            // The longest a name may be, and a host name longer than is carried.
            name: Some(format!("{i:0>63}.{}.ovl.example", "g".repeat(63)) + &".x".repeat(57)),
            hostname: Some(format!("{i:é>300}")),
            kind: DeviceKind::Lease,
            expires: Some(1_795_000_000),
            vlan: None,
            seen,
            tx_bytes: u64::MAX,
            tx_packets: u64::MAX,
            rx_bytes: u64::MAX,
            rx_packets: u64::MAX,
        }
    }

    fn tunnel(i: usize, established: bool) -> TunnelReport {
        TunnelReport {
            peer: format!("{i:064x}"),
            name: format!("peer-{i}.ovl.example"),
            path: TunnelPath::Direct,
            reason: None,
            endpoint: Some("198.51.100.7:51820".parse().unwrap()),
            established,
            handshake: Some(1_795_000_000),
            tx_bytes: 1,
            rx_bytes: 2,
        }
    }

    fn assemble(parts: Vec<ClientMsg>) -> Result<Option<Report>, ReportError> {
        let mut a = Assembler::default();
        let mut out = Ok(None);
        for p in parts {
            let ClientMsg::Report {
                devices,
                tunnels,
                more,
            } = p
            else {
                panic!("not a report part");
            };
            out = a.take(devices, tunnels, more);
        }
        out
    }

    /// The largest report goes in parts that each fit a message, and comes back whole.
    #[test]
    fn the_largest_report_fits_its_parts_and_comes_back_whole() {
        let devices = (0..MAX_DEVICES).map(|i| device(i, Some(1))).collect();
        let tunnels = (0..MAX_TUNNELS).map(|i| tunnel(i, true)).collect();
        let (report, left) = Report::bounded(devices, tunnels);
        assert_eq!(left, (0, 0));
        assert_eq!(report.devices[0].name.as_ref().map(String::len), Some(253));
        assert_eq!(
            report.devices[0]
                .hostname
                .as_ref()
                .map(|h| h.chars().count()),
            Some(HOSTNAME_MAX)
        );
        let parts = report.parts(crate::VERSION);
        assert!(parts.len() <= MAX_PARTS, "{} parts", parts.len());
        for p in &parts {
            assert!(crate::channel::fits(p), "a part too large for a message");
        }
        assert_eq!(assemble(parts), Ok(Some(report)));
    }

    /// A tunnel relayed because a mapping was refused is reported to a cloud before control
    /// version 14 as a symmetric NAT, which it knows.
    #[test]
    fn a_reason_is_reported_as_the_session_version_knows_it() {
        use crate::{MAPPING_VERSION, RelayReason};
        let mut t = tunnel(1, true);
        t.path = TunnelPath::Relay;
        t.reason = Some(RelayReason::MappingRefused);
        let (report, _) = Report::bounded(Vec::new(), vec![t]);
        let reason = |version| match &report.parts(version)[..] {
            [ClientMsg::Report { tunnels, .. }] => tunnels[0].reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(reason(MAPPING_VERSION), Some(RelayReason::MappingRefused));
        assert_eq!(reason(MAPPING_VERSION - 1), Some(RelayReason::SymmetricNat));
    }

    /// An empty report is one part, which says so.
    #[test]
    fn an_empty_report_is_one_last_part() {
        let parts = Report::default().parts(crate::VERSION);
        assert_eq!(
            parts,
            vec![ClientMsg::Report {
                devices: vec![],
                tunnels: vec![],
                more: false
            }]
        );
        assert_eq!(assemble(parts), Ok(Some(Report::default())));
    }

    /// Beyond the bounds the client leaves out the devices seen longest ago and the tunnels
    /// without keys, and says how many.
    #[test]
    fn the_client_leaves_out_the_stalest_devices_and_the_idle_tunnels() {
        let mut devices: Vec<_> = (0..MAX_DEVICES)
            .map(|i| device(i, Some(100 + i as u64)))
            .collect();
        devices.push(device(900_000, None));
        devices.push(device(900_001, Some(5)));
        let mut tunnels = vec![tunnel(0, false)];
        tunnels.extend((1..=MAX_TUNNELS).map(|i| tunnel(i, true)));
        let (report, left) = Report::bounded(devices, tunnels);
        assert_eq!(left, (2, 1));
        assert_eq!(report.devices.len(), MAX_DEVICES);
        assert!(report.devices.iter().all(|d| d.seen >= Some(100)));
        assert!(report.tunnels.iter().all(|t| t.established));
    }

    /// The cloud refuses a report beyond a bound, or with a device without an address or a
    /// peer that is not a fingerprint, and starts over at the next part.
    #[test]
    fn the_cloud_refuses_what_breaks_a_bound_and_starts_over() {
        let one = |devices, tunnels, more| ClientMsg::Report {
            devices,
            tunnels,
            more,
        };
        let many = vec![one(vec![], vec![], true); MAX_PARTS + 1];
        assert_eq!(assemble(many), Err(ReportError::TooBig));
        let exactly = {
            let mut v = vec![one(vec![], vec![], true); MAX_PARTS - 1];
            v.push(one(vec![], vec![], false));
            v
        };
        assert_eq!(assemble(exactly), Ok(Some(Report::default())));
        let devices: Vec<_> = (0..=MAX_DEVICES).map(|i| device(i, None)).collect();
        let (first, second) = devices.split_at(MAX_DEVICES / 2);
        assert_eq!(
            assemble(vec![
                one(first.to_vec(), vec![], true),
                one(second.to_vec(), vec![], false)
            ]),
            Err(ReportError::TooBig)
        );
        let tunnels: Vec<_> = (0..=MAX_TUNNELS).map(|i| tunnel(i, true)).collect();
        assert_eq!(
            assemble(vec![one(vec![], tunnels, false)]),
            Err(ReportError::TooBig)
        );
        let mut bare = device(1, None);
        bare.vip = None;
        assert_eq!(
            assemble(vec![one(vec![bare], vec![], false)]),
            Err(ReportError::NoAddress)
        );
        for peer in ["ab".repeat(31), "zz".repeat(32), "ab".repeat(33)] {
            let mut t = tunnel(1, true);
            t.peer = peer;
            assert_eq!(
                assemble(vec![one(vec![], vec![t], false)]),
                Err(ReportError::BadPeer)
            );
        }
        // After a refusal the next part starts a new report.
        let mut a = Assembler::default();
        let mut bare = device(1, None);
        bare.vip = None;
        assert!(a.take(vec![device(2, None)], vec![], true).is_ok());
        assert!(a.take(vec![bare], vec![], true).is_err());
        assert_eq!(
            a.take(vec![device(3, None)], vec![], false),
            Ok(Some(Report {
                devices: vec![device(3, None)],
                tunnels: vec![],
            }))
        );
    }
}

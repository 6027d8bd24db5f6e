//! Warnings ahead of certificate expiry: ours (peers refuse us from then on) and our peers'
//! (they leave the table then). Checked when the daemon starts, after a reload, and once an
//! hour; what it finds goes to the log. The figures themselves are in the status document
//! and the metrics.

use std::time::{Duration, Instant};

use cyphonic_crypto::Certificate;

/// How often certificates are looked at again (and a warning repeated).
pub const CHECK_EVERY: Duration = Duration::from_secs(3600);
/// The longest warning ahead: a year-long certificate is warned about 30 days ahead.
const AHEAD_MAX: u64 = 30 * 24 * 3600;

/// What a certificate's validity says at some time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Ends within the warning window, this many seconds from now.
    Soon(u64),
    /// Ended.
    Ended,
}

/// Whether `cert` is worth a warning at unix time `now`: it ended, or it ends within the
/// shorter of 30 days and a third of its lifetime (a one-day certificate renewed online is
/// warned about 8 hours ahead, when its renewal is overdue).
pub fn check(cert: &Certificate, now: u64) -> Option<Expiry> {
    let body = cert.body();
    let lifetime = body.not_after.saturating_sub(body.not_before);
    let ahead = (lifetime / 3).min(AHEAD_MAX);
    match body.not_after.checked_sub(now) {
        None | Some(0) => Some(Expiry::Ended),
        Some(left) if left <= ahead => Some(Expiry::Soon(left)),
        Some(_) => None,
    }
}

/// When certificates are looked at next.
#[derive(Debug, Default)]
pub struct Watch {
    next: Option<Instant>,
}

impl Watch {
    /// Whether it is time to look at `now` (the first call always is); then the next look is
    /// [`CHECK_EVERY`] later.
    pub fn due(&mut self, now: Instant) -> bool {
        if self.next.is_some_and(|t| now < t) {
            return false;
        }
        self.next = Some(now + CHECK_EVERY);
        true
    }

    /// Looks again at the next call (a reload changed what we hold).
    pub const fn soon(&mut self) {
        self.next = None;
    }
}

/// Logs what `check` says of our certificate and our peers' at unix time `now`.
pub fn log(ours: &Certificate, peers: &[(String, Certificate)], now: u64) {
    let name = &ours.body().name;
    match check(ours, now) {
        Some(Expiry::Ended) => tracing::error!(
            certificate = %name,
            not_after = ours.body().not_after,
            "our certificate has expired: peers and the cloud refuse us; renew it and reload"
        ),
        Some(Expiry::Soon(left)) => tracing::warn!(
            certificate = %name,
            hours_left = left / 3600,
            not_after = ours.body().not_after,
            "our certificate expires soon: renew it and reload"
        ),
        None => {}
    }
    for (peer, cert) in peers {
        if let Some(Expiry::Soon(left)) = check(cert, now) {
            tracing::warn!(
                %peer,
                hours_left = left / 3600,
                not_after = cert.body().not_after,
                "a peer's certificate expires soon: the peer leaves then unless it is renewed"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cyphonic_crypto::{CertificateAuthority, IssueRequest};

    const DAY: u64 = 24 * 3600;
    const T0: u64 = 1_800_000_000;

    fn cert(lifetime: u64) -> Certificate {
        let ca = CertificateAuthority::generate(
            "ovl.example",
            &["100.64.0.0/10".parse().unwrap()],
            T0 - DAY,
            T0 + 800 * DAY,
        )
        .unwrap();
        ca.issue(&IssueRequest {
            name: "gw1.ovl.example".into(),
            vip_blocks: vec!["100.64.1.0/24".parse().unwrap()],
            public_key: [7; 32],
            groups: vec![],
            not_before: T0,
            not_after: T0 + lifetime,
        })
        .unwrap()
    }

    #[test]
    fn a_year_is_warned_about_30_days_ahead_and_a_day_8_hours_ahead() {
        let year = cert(365 * DAY);
        assert_eq!(check(&year, T0), None);
        assert_eq!(check(&year, T0 + 335 * DAY - 1), None);
        assert_eq!(check(&year, T0 + 335 * DAY), Some(Expiry::Soon(30 * DAY)));
        assert_eq!(check(&year, T0 + 365 * DAY), Some(Expiry::Ended));
        assert_eq!(check(&year, T0 + 400 * DAY), Some(Expiry::Ended));
        let day = cert(DAY);
        assert_eq!(check(&day, T0 + 16 * 3600 - 1), None);
        assert_eq!(check(&day, T0 + 16 * 3600), Some(Expiry::Soon(8 * 3600)));
    }

    #[test]
    fn the_watch_looks_first_then_hourly_and_again_when_asked() {
        let mut w = Watch::default();
        let t = Instant::now();
        assert!(w.due(t));
        assert!(!w.due(t + Duration::from_secs(60)));
        assert!(w.due(t + CHECK_EVERY));
        w.soon();
        assert!(w.due(t + CHECK_EVERY + Duration::from_secs(1)));
    }
}

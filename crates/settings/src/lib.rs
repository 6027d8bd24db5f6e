//! Reading the binaries' configuration files. `cyphonic-adapter` and `cyphonic-node` each
//! declare their own file (their tables, as serde structs) and check what is theirs; the
//! tables and checks they share live here: `[identity]` (our key, certificate, CA and
//! revocations, read and verified), `[[peer]]` (static peers), `[cloud]`, and the common
//! `[dataplane]` and `[dns]` limits. Every mistake is a [`ConfigError`] that names the file,
//! and where it can the line and the dotted key (`peer[1].certificate`).
//!
//! Only the binaries and their shared daemon core (`cyphonic-daemon`) use this crate:
//! libraries take typed values, which this crate builds: the engine's
//! [`DataPlane`] and [`StaticPeer`]s directly, the rest in [`Common`] and the binaries' own
//! configuration types.

#![forbid(unsafe_code)]

mod cloud;
mod dataplane;
mod end;
mod identity;
mod observe;
mod peers;
mod policy;
mod source;
pub mod testing;

pub use cloud::{Cloud, RawCloud};
pub use cyphonic_declare::{
    Given, KeyDoc, OneOrMore, Reference, TableDoc, Value, doc_text, ensure_file, indexed, table,
    unwritten,
};
pub use cyphonic_netio::Placement;
pub use cyphonic_session::Identity;
pub use cyphonic_tunnel::{Aqm, DataPlane, StaticPeer};
pub use dataplane::{
    AQM_INTERVAL_MAX_MS, AeadName, BATCHES_IN_FLIGHT_MAX, BUSY_POLL_MAX_US, IN_FLIGHT_BYTES_MIN,
    IN_FLIGHT_MS_MAX, Keyed, REKEY_AFTER_MESSAGES_MIN, REKEY_AFTER_SECS_MIN, check_aqm,
    check_in_flight, check_pipeline, check_placement, check_priority, check_rekey,
};
pub use end::{Common, DNS_TTL, Dns, DnsKeys, EndKeys, LISTEN, OVERLAY, check_dns, check_mtu};
pub use identity::{
    IdentityFiles, RawIdentity, STATE_DIR, first_v4_block, first_v6_block, ipv6_plan,
    overlay_domain, overlay6,
};
pub use observe::{RawLog, RawMetrics};
pub use peers::{Peer, RawPeer, peers};
pub use policy::{DNS_RULE, Device, RawPolicy, directory, dns_rules};
pub use source::{ConfigError, Source, changed_keys, load, now_secs, parse};

/// What the declaring macros name in the calling crate's code.
#[doc(hidden)]
pub mod __private {
    pub use ipnet::Ipv4Net;
    pub use toml::Spanned;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{key_at, line_of};
    use std::path::Path;
    use std::time::Duration;

    use toml::Spanned;

    #[test]
    fn keys_are_found_under_their_tables() {
        let text = "top = 1\n[a]\nx = 2\n[[p]]\ny = 3\n[[p]]\ny = 4\n";
        for (needle, key) in [
            ("top", "top"),
            ("x = 2", "a.x"),
            ("y = 3", "p[0].y"),
            ("y = 4", "p[1].y"),
        ] {
            let at = text.find(needle).unwrap_or_default();
            assert_eq!(key_at(text, at).as_deref(), Some(key), "{needle}");
        }
        assert_eq!(line_of(text, text.find("y = 4").unwrap_or_default()), 7);
    }

    /// Busy polling at a real-time priority needs cores of its own; either alone is fine.
    #[test]
    fn busy_polling_at_a_realtime_priority_needs_cpus() {
        let text = "cpus = []\nrealtime_priority = 10\nbusy_poll_us = 50000\n";
        let src = Source {
            path: Path::new("t.toml"),
            text,
            now_secs: 0,
        };
        let at = |needle: &str| {
            let start = text.find(needle).unwrap_or_default();
            start..start + needle.len()
        };
        let cpus = |list: Vec<usize>| Spanned::new(at("cpus = []"), list);
        let rt = |p: u8| Spanned::new(at("realtime_priority = 10"), p);
        let busy = |us: u32| Spanned::new(at("busy_poll_us = 50000"), us);
        let check = |c: Vec<usize>, r: u8, b: u32| {
            check_placement(
                &src,
                (&cpus(c), "dataplane.cpus"),
                (&rt(r), "dataplane.realtime_priority"),
                (&busy(b), "dataplane.busy_poll_us"),
            )
        };
        let err = check(vec![], 10, 50_000)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.starts_with("t.toml:3: key `dataplane.busy_poll_us`: polling at a real-time"),
            "{err}"
        );
        assert!(check(vec![2, 3], 10, 50_000).is_ok());
        assert!(check(vec![], 0, 50_000).is_ok());
        assert!(check(vec![], 10, 0).is_ok());
        assert!(check(vec![], 0, BUSY_POLL_MAX_US).is_ok());
        assert!(check(vec![], 0, BUSY_POLL_MAX_US + 1).is_err());
    }

    #[test]
    fn the_queue_manager_is_off_by_default_and_takes_a_target_below_its_interval() {
        let src = Source {
            path: Path::new("t.toml"),
            text: "",
            now_secs: 0,
        };
        crate::dataplane_table! {
            /// Nothing of its own.
            struct Dataplane {}
        }
        assert_eq!(
            Dataplane::default().shared(&src).ok().map(|d| d.aqm),
            Some(None),
            "off by default"
        );
        let check = |target: u32, interval: u32| {
            check_aqm(
                &src,
                (&Spanned::new(0..0, target), Dataplane::aqm_target_us),
                (&Spanned::new(0..0, interval), Dataplane::aqm_interval_ms),
            )
        };
        assert_eq!(
            check(5000, 100).ok(),
            Some(Some(Aqm {
                target: Duration::from_millis(5),
                interval: Duration::from_millis(100),
            }))
        );
        assert!(check(0, 100).is_ok_and(|a| a.is_none()));
        assert!(check(99_999, 100).is_ok());
        assert!(check(100_000, 100).is_err());
        assert!(check(1000, AQM_INTERVAL_MAX_MS + 1).is_err());
    }
}

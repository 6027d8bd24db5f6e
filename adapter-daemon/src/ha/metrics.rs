//! The pair's metrics (docs/operations.md, *Two adapters as one gateway*), the same on both
//! boxes: the serving box adds them to its own; a box that stands by serves them alone on
//! the `[metrics]` address, until the daemon's endpoint takes that address when it serves.

use std::sync::{Arc, Mutex, PoisonError};

use cyphonic_telemetry::metrics::{Collector, DescriptorEncoder, Family, counter, gauge};

use crate::status::HaStatus;

/// Reads the pair's part of the status document at each scrape.
#[derive(Debug)]
pub struct HaCollector {
    status: Arc<Mutex<HaStatus>>,
}

impl HaCollector {
    /// A collector of what `status` shows.
    pub fn new(status: Arc<Mutex<HaStatus>>) -> Self {
        Self { status }
    }
}

/// The roles a box reports, each a series of `cyphonic_ha_role` (1 for its role, 0 else).
const ROLES: [&str; 3] = ["active", "standby", "starting"];

#[expect(clippy::cast_precision_loss, reason = "terms, versions and counts")]
impl Collector for HaCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = self
            .status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Family::gauges(
            "cyphonic_ha_role",
            "This box's role in the pair (1 for the one it has).",
        )
        .encode(
            &mut e,
            ROLES.map(|r| {
                (
                    vec![("role", r.to_owned())],
                    f64::from(u8::from(s.role == r)),
                )
            }),
        )?;
        let mut health = Vec::new();
        for (which, bits) in [
            ("this", Some(&s.health)),
            ("other", s.other.as_ref().map(|o| &o.health)),
        ] {
            let Some(bits) = bits else { continue };
            for (_, name, _) in super::HEALTH_BITS {
                health.push((
                    vec![("box", which.to_owned()), ("bit", name.to_owned())],
                    f64::from(u8::from(bits.iter().any(|b| b == name))),
                ));
            }
        }
        Family::gauges(
            "cyphonic_ha_health",
            "Each box's health bits as last judged (this box) or heard (the other): 1 well, 0 not.",
        )
        .encode(&mut e, health)?;
        gauge(
            &mut e,
            "cyphonic_ha_term",
            "The pair's term as this box knows it (how many times the gateway moved).",
            s.term as f64,
        )?;
        gauge(
            &mut e,
            "cyphonic_ha_other_in_contact",
            "Whether the other box proved itself alive in the last 300 ms.",
            f64::from(u8::from(s.other.as_ref().is_some_and(|o| o.in_contact))),
        )?;
        if let Some(o) = &s.other {
            gauge(
                &mut e,
                "cyphonic_ha_other_heard_seconds",
                "Seconds since the other box's last heartbeat.",
                o.heard_ms_ago as f64 / 1000.0,
            )?;
        }
        gauge(
            &mut e,
            "cyphonic_ha_lease_table_version",
            "The lease table version this box holds or sent last.",
            s.lease_table_version as f64,
        )?;
        if let Some(r) = &s.replication {
            gauge(
                &mut e,
                "cyphonic_ha_standby_behind",
                "Lease table changes the standby does not hold yet (serving box only).",
                r.behind.unwrap_or(r.written) as f64,
            )?;
            gauge(
                &mut e,
                "cyphonic_ha_standby_lag_seconds",
                "Since the oldest lease table the standby does not hold was sent to it.",
                r.lag_ms as f64 / 1000.0,
            )?;
        }
        let d = s.dropped;
        Family::counters(
            "cyphonic_ha_dropped",
            "The pair's messages dropped, by reason.",
        )
        .encode(
            &mut e,
            [
                ("source", d.source),
                ("malformed", d.malformed),
                ("version", d.version),
                ("tag", d.tag),
                ("unknown", d.unknown),
            ]
            .map(|(reason, n)| (vec![("reason", reason.to_owned())], n as f64)),
        )?;
        counter(
            &mut e,
            "cyphonic_ha_copies",
            "The pair's messages that came a second time (no news).",
            s.copies,
        )?;
        counter(
            &mut e,
            "cyphonic_ha_merges",
            "The other box's lease tables taken in while serving.",
            s.merges,
        )
    }
}

//! What the cloud tells its operator: the status document (`cyphonic-cloud status`) and the
//! metrics, both read from the same counters; and the registry's sizes, refreshed from the
//! store every few seconds (a scrape must not wait for the database).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cyphonic_telemetry::Family;
use cyphonic_telemetry::metrics::{Collector, DescriptorEncoder, gauge};
use serde::{Deserialize, Serialize};

use crate::nms::Nms;
use crate::store::Store;
use crate::trs::Trs;

/// How often the registry's sizes are read from the store.
const REFRESH: Duration = Duration::from_secs(2);

/// The registry's sizes, as last read.
#[derive(Debug, Default)]
pub struct Registry {
    /// Clients ever registered.
    pub clients: AtomicU64,
    /// Clients with a session (on any instance).
    pub online: AtomicU64,
    /// Names registered.
    pub names: AtomicU64,
}

impl Registry {
    /// Reads the sizes from `store` every few seconds, until the task is dropped.
    pub async fn refresh(self: Arc<Self>, store: Store) {
        loop {
            match (store.counts().await, store.name_count().await) {
                (Ok((clients, online)), Ok(names)) => {
                    let set = |a: &AtomicU64, v: i64| {
                        a.store(v.try_into().unwrap_or(0), Ordering::Relaxed);
                    };
                    set(&self.clients, clients);
                    set(&self.online, online);
                    set(&self.names, names);
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(error = %e, "reading the registry's size");
                }
            }
            tokio::time::sleep(REFRESH).await;
        }
    }
}

/// What does not change while the cloud runs.
#[derive(Debug)]
pub struct Static {
    /// The control address.
    pub control: SocketAddr,
    /// The probe addresses.
    pub probes: [SocketAddr; 2],
    /// The store, its password hidden.
    pub store: String,
    /// The cloud's public key.
    pub public_key: String,
    /// When it started.
    pub started: Instant,
}

/// Everything the status document and the metrics read.
#[derive(Debug, Clone)]
pub struct Observed {
    /// NMS.
    pub nms: Arc<Nms>,
    /// The relay, unless off.
    pub trs: Option<Arc<Trs>>,
    /// The registry's sizes.
    pub registry: Arc<Registry>,
    /// What does not change.
    pub info: Arc<Static>,
}

/// The status document's format. `cyphonic-cloud status` reads this one and says so of
/// another (its `--json` shows any); a field added later reads as its default.
pub const STATUS_VERSION: u32 = 1;

/// The cloud's status document (`cyphonic-cloud status --json`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    /// [`STATUS_VERSION`] of the program that wrote it.
    pub version: u32,
    /// What runs, and where.
    pub cloud: Info,
    /// The registry's sizes, as last read from the store.
    pub registry: Sizes,
    /// This instance's control sessions, by name.
    pub sessions: Vec<Session>,
    /// The per-device policy as compiled against the registry.
    pub policy: PolicyState,
    /// Connections not yet proven.
    pub unproven_connections: usize,
    /// The issuing CA, when this cloud issues (`[enroll]`).
    pub enroll: Option<Enroll>,
    /// The relay, unless off.
    pub relay: Option<Relay>,
    /// NMS's counters.
    pub counters: crate::nms::Stats,
}

/// What runs, and where.
#[derive(Debug, Serialize, Deserialize)]
pub struct Info {
    /// Program, version and commit.
    pub software: String,
    /// The control address.
    pub control: String,
    /// The probe addresses.
    pub probes: Vec<String>,
    /// The store, its password hidden.
    pub store: String,
    /// The cloud's public key.
    pub public_key: String,
    /// Seconds since it started.
    pub uptime_secs: u64,
}

/// The registry's sizes.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Sizes {
    /// Clients ever registered.
    pub clients: u64,
    /// Clients with a session (on any instance).
    pub online: u64,
    /// Names registered.
    pub names: u64,
}

/// A control session.
#[derive(Debug, Serialize, Deserialize)]
pub struct Session {
    /// The member's name.
    pub name: String,
    /// Its address.
    pub from: String,
    /// Seconds since it opened.
    pub secs: u64,
}

/// The per-device policy.
#[derive(Debug, Serialize, Deserialize)]
pub struct PolicyState {
    /// Whether clients enforce rules (`default = "deny"`).
    pub enforce: bool,
    /// The version of the compiled rules.
    pub version: u64,
    /// How many rules.
    pub rules: usize,
    /// Names and groups that stand for nobody now.
    pub unresolved: Vec<String>,
}

/// The issuing CA.
#[derive(Debug, Serialize, Deserialize)]
pub struct Enroll {
    /// Its fingerprint.
    pub issuing_ca: String,
    /// Its end (unix seconds).
    pub not_after: u64,
    /// Seconds left (negative once over).
    pub expires_in_secs: i64,
}

/// The relay.
#[derive(Debug, Serialize, Deserialize)]
pub struct Relay {
    /// Its ports and addresses, in words.
    pub settings: String,
    /// Its open channels, by port.
    pub channels: Vec<crate::trs::ChannelStatus>,
    /// Its counters.
    pub counters: crate::trs::TrsStats,
}

impl Observed {
    /// The issuing CA, when this cloud issues: its fingerprint, its end and the seconds left
    /// (negative once over).
    fn enroll(&self) -> Option<Enroll> {
        self.nms.issuing_ca().map(|ca| {
            let not_after = ca.body().not_after;
            Enroll {
                issuing_ca: ca.fingerprint().to_string(),
                not_after,
                expires_in_secs: seconds_left(not_after),
            }
        })
    }

    /// The status document.
    pub fn snapshot(&self) -> Status {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let policy = self.nms.compiled();
        Status {
            version: STATUS_VERSION,
            cloud: Info {
                software: cyphonic_telemetry::build!(crate::PROGRAM).to_string(),
                control: self.info.control.to_string(),
                probes: self.info.probes.iter().map(ToString::to_string).collect(),
                store: self.info.store.clone(),
                public_key: self.info.public_key.clone(),
                uptime_secs: self.info.started.elapsed().as_secs(),
            },
            registry: Sizes {
                clients: get(&self.registry.clients),
                online: get(&self.registry.online),
                names: get(&self.registry.names),
            },
            sessions: self
                .nms
                .sessions()
                .into_iter()
                .map(|(name, from, secs)| Session {
                    name,
                    from: from.to_string(),
                    secs,
                })
                .collect(),
            policy: PolicyState {
                enforce: policy.enforce,
                version: policy.rules.version,
                rules: policy.rules.rules.len(),
                unresolved: policy.unresolved.clone(),
            },
            unproven_connections: self.nms.unproven_now(),
            enroll: self.enroll(),
            relay: self.trs.as_ref().map(|t| Relay {
                settings: t.describe(),
                channels: t.channels(),
                counters: t.stats.copied(),
            }),
            counters: self.nms.stats.copied(),
        }
    }
}

#[expect(clippy::cast_precision_loss, reason = "counts as metric values")]
fn f(v: u64) -> f64 {
    v as f64
}

/// Seconds from now to unix time `t` (negative once past).
fn seconds_left(t: u64) -> i64 {
    crate::enroll::seconds_left(t, crate::clock::unix_now_ms() / 1000)
}

impl Collector for Observed {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let get = |a: &AtomicU64| f(a.load(Ordering::Relaxed));
        self.nms.stats.encode("cyphonic_nms", &mut e)?;
        gauge(
            &mut e,
            "cyphonic_registry_clients",
            "Clients ever registered.",
            get(&self.registry.clients),
        )?;
        gauge(
            &mut e,
            "cyphonic_registry_online",
            "Clients with a control session, on any instance.",
            get(&self.registry.online),
        )?;
        gauge(
            &mut e,
            "cyphonic_registry_names",
            "Names registered.",
            get(&self.registry.names),
        )?;
        let policy = self.nms.compiled();
        gauge(
            &mut e,
            "cyphonic_policy_rules",
            "Rules of the per-device policy compiled against the registry (0 with default = allow).",
            f(policy.rules.rules.len() as u64),
        )?;
        gauge(
            &mut e,
            "cyphonic_policy_version",
            "The version of the compiled per-device policy (changes with the rules and the registry).",
            f(policy.rules.version),
        )?;
        gauge(
            &mut e,
            "cyphonic_nms_sessions_open",
            "Control sessions open on this instance.",
            f(self.nms.sessions().len() as u64),
        )?;
        if let Some(ca) = self.nms.issuing_ca() {
            #[expect(clippy::cast_precision_loss, reason = "seconds as a metric value")]
            let left = seconds_left(ca.body().not_after) as f64;
            gauge(
                &mut e,
                "cyphonic_enroll_issuing_ca_expiry_seconds",
                "Seconds until the issuing CA ends (negative once over: nobody can enroll or renew).",
                left,
            )?;
        }
        gauge(
            &mut e,
            "cyphonic_nms_unproven_connections",
            "Control connections that have not proven themselves yet (handshaking).",
            f(self.nms.unproven_now() as u64),
        )?;
        let Some(trs) = &self.trs else {
            return Ok(());
        };
        trs.stats.encode("cyphonic_relay", &mut e)?;
        gauge(
            &mut e,
            "cyphonic_relay_channels_open",
            "Relay channels open.",
            f(trs.open_channels() as u64),
        )?;
        let channels = trs.channels();
        let rows =
            |value: fn(&crate::trs::ChannelStatus) -> u64| -> Vec<(Vec<(&'static str, String)>, f64)> {
                channels
                    .iter()
                    .map(|c| {
                        (
                            vec![
                                ("port", c.port.to_string()),
                                ("a", c.a.clone()),
                                ("b", c.b.clone()),
                                ("reason", c.reason.clone()),
                            ],
                            f(value(c)),
                        )
                    })
                    .collect()
            };
        Family::counters(
            "cyphonic_relay_channel_bytes",
            "Bytes each open channel relayed.",
        )
        .encode(&mut e, rows(|c| c.bytes))?;
        Family::counters(
            "cyphonic_relay_channel_packets",
            "Datagrams each open channel relayed.",
        )
        .encode(&mut e, rows(|c| c.packets))?;
        gauge(
            &mut e,
            "cyphonic_relay_ports",
            "Relay ports in the configured range (the most channels at once).",
            f(trs.port_count()),
        )
    }
}

//! The DHCP server on the LAN (crates/vip) with its leases on disk ([`crate::leases`]), on
//! the control thread. A binding is saved (atomically) before the ACK that grants it leaves,
//! as RFC 2131 §4.3.2 asks; every change settles into the anti-spoofing table before any
//! reply goes out.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cyphonic_gateway::Neighbors as _;
use cyphonic_telemetry::Throttle;
use cyphonic_vip::{DhcpConfig, Ignore, Lease, LeaseEvent, Reply};

use crate::config::Mac;
use crate::leases::LeaseStore;
use crate::neighbors::LanTable;
use crate::status::DhcpStatus;

/// Warnings about refused devices or failed saves at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// The DHCP server and its lease file.
pub struct Dhcp {
    server: cyphonic_vip::Server,
    store: LeaseStore,
    pool: (Ipv4Addr, Ipv4Addr),
    ignored: BTreeMap<&'static str, u64>,
    unsaved: bool,
    save_failed: Throttle,
    refused: Throttle,
}

impl std::fmt::Debug for Dhcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dhcp")
            .field("pool", &self.pool)
            .field("unsaved", &self.unsaved)
            .finish_non_exhaustive()
    }
}

const fn ignore_name(why: Ignore) -> &'static str {
    match why {
        Ignore::Malformed => "malformed",
        Ignore::NotARequest => "not_a_request",
        Ignore::Relayed => "relayed",
        Ignore::ChaddrMismatch => "chaddr_mismatch",
        Ignore::OtherServer => "other_server",
        Ignore::NoRecord => "no_record",
        Ignore::NoAddress => "no_address",
        Ignore::Unexpected => "unexpected",
        _ => "other",
    }
}

impl Dhcp {
    /// The server `cfg` describes, with the leases saved in `state_dir` at unix time `unix`.
    ///
    /// # Errors
    /// The state directory or the lease file cannot be used, or the configuration is refused.
    pub fn open(cfg: &DhcpConfig, state_dir: &Path, unix: u64) -> anyhow::Result<Self> {
        let store = LeaseStore::open(state_dir).with_context(|| {
            format!(
                "state_dir {}: cannot keep DHCP leases there",
                state_dir.display()
            )
        })?;
        let loaded = store
            .load(unix)
            .with_context(|| format!("reading {}", store.path().display()))?;
        if let Some((aside, reason)) = &loaded.moved_aside {
            tracing::warn!(file = %aside.display(), %reason, "the lease file was damaged: moved aside, starting without leases (devices will ask again)");
        }
        let count = loaded.leases.iter().filter(|l| l.active).count();
        let server = cyphonic_vip::Server::new(cfg.clone(), loaded.leases, unix)
            .context("the DHCP configuration")?;
        tracing::info!(
            pool = %format!("{}-{}", cfg.pool.0, cfg.pool.1),
            lease_secs = cfg.lease_secs,
            saved = count,
            file = %store.path().display(),
            "DHCP server on the LAN"
        );
        Ok(Self {
            server,
            store,
            pool: cfg.pool,
            ignored: BTreeMap::new(),
            unsaved: false,
            save_failed: Throttle::new(WARN_EVERY),
            refused: Throttle::new(WARN_EVERY),
        })
    }

    /// A DHCP message from Ethernet source `mac`: the reply to send once the bindings it
    /// made are settled ([`Dhcp::settle`]), if any.
    pub fn handle(&mut self, unix: u64, mac: [u8; 6], payload: &[u8]) -> Option<Reply> {
        match self.server.handle(unix, payload, mac) {
            Ok(reply) => reply,
            Err(why) => {
                *self.ignored.entry(ignore_name(why)).or_default() += 1;
                tracing::debug!(mac = %Mac(mac), reason = ignore_name(why), "DHCP message not answered");
                None
            }
        }
    }

    /// Expires leases due at unix time `unix`; returns whether anything is to settle.
    pub fn tick(&mut self, unix: u64) -> bool {
        let due = self.unsaved || self.server.poll_timeout().is_some_and(|t| t <= unix);
        if due {
            self.server.handle_timeout(unix);
        }
        due
    }

    /// Applies what the server did: logs its events, saves the bindings, and puts the
    /// active leases into the anti-spoofing `table`. Returns whether the leases changed.
    pub fn settle(&mut self, now: Instant, table: &LanTable) -> bool {
        let mut changed = false;
        while let Some(event) = self.server.poll_event() {
            changed = true;
            self.log(event, now, table);
        }
        if self.server.take_dirty() {
            self.unsaved = true;
        }
        if self.unsaved {
            match self.store.save(&self.server.leases()) {
                Ok(()) => self.unsaved = false,
                Err(e) => {
                    if let Some(held) = self.save_failed.due(now) {
                        tracing::error!(file = %self.store.path().display(), error = %e, also_failed = held, "cannot save the DHCP leases; they are kept in memory and saving is retried");
                    }
                }
            }
        }
        if changed {
            table.replace_leases(self.server.active().map(|l| (l.ip, l.mac)).collect());
        }
        changed
    }

    fn log(&mut self, event: LeaseEvent, now: Instant, table: &LanTable) {
        match event {
            LeaseEvent::Granted(l) => {
                if table.leased_mac(l.ip) == Some(l.mac) {
                    tracing::debug!(vip = %l.ip, mac = %Mac(l.mac), "lease renewed");
                } else {
                    tracing::info!(vip = %l.ip, mac = %Mac(l.mac), hostname = %cyphonic_telemetry::Untrusted(l.hostname.as_deref().unwrap_or("")), "lease granted");
                }
            }
            LeaseEvent::Released(l) => {
                tracing::info!(vip = %l.ip, mac = %Mac(l.mac), "lease released");
            }
            LeaseEvent::Expired(l) => {
                tracing::info!(vip = %l.ip, mac = %Mac(l.mac), "lease expired");
            }
            LeaseEvent::Declined { ip, mac } => {
                tracing::warn!(vip = %ip, mac = %Mac(mac), "a device declined its address: another host uses it without a lease; kept out of the pool for 10 minutes");
            }
            LeaseEvent::PoolExhausted { mac } => {
                if let Some(held) = self.refused.due(now) {
                    tracing::warn!(mac = %Mac(mac), also_refused = held, "DHCP pool exhausted: a new device got no address (widen dhcp.pool or shorten dhcp.lease_time)");
                }
            }
            LeaseEvent::StarvationGuard { mac } => {
                if let Some(held) = self.refused.due(now) {
                    tracing::warn!(mac = %Mac(mac), also_refused = held, "too many new devices at once (dhcp.new_lease_share): a DHCP starvation attempt? a new device got no address");
                }
            }
            _ => {}
        }
    }

    /// The active leases.
    pub fn active(&self) -> impl Iterator<Item = &Lease> {
        self.server.active()
    }

    /// Its part of the status document.
    pub fn status(&self) -> DhcpStatus {
        DhcpStatus {
            pool: format!("{}-{}", self.pool.0, self.pool.1),
            lease_file: self.store.path().display().to_string(),
            unsaved: self.unsaved,
            stats: self.server.stats(),
            ignored_by_reason: self
                .ignored
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
        }
    }
}

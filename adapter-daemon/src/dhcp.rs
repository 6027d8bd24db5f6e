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

    /// Whether `reply` may leave now: not an ACK granting a lease that is not on disk yet
    /// (the save failed). Staying silent makes the client retry, and its retry finds the
    /// lease saved, or stays unanswered again: a device never holds a lease a restart
    /// would forget.
    pub fn releasable(&self, reply: &Reply) -> bool {
        !(reply.grants && self.unsaved)
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

#[cfg(test)]
mod tests {
    use cyphonic_vip::testing::{DhcpOption, MessageType, client_message};

    use super::*;

    fn config() -> DhcpConfig {
        DhcpConfig {
            server: Ipv4Addr::new(100, 64, 1, 1),
            block: "100.64.1.0/24".parse().unwrap(),
            pool: (
                Ipv4Addr::new(100, 64, 1, 100),
                Ipv4Addr::new(100, 64, 1, 199),
            ),
            lease_secs: 3600,
            mtu: 1420,
            domain: "gw1.ovl.example".into(),
            reservations: vec![],
            new_lease_share: 1.0,
            new_lease_window_secs: 60,
        }
    }

    /// While the lease file cannot be written, the ACK that would grant a lease does not
    /// leave (the client retries); the OFFER before it may. Once saving works again, the
    /// retried REQUEST gets its ACK.
    #[test]
    fn no_ack_leaves_for_a_lease_that_is_not_on_disk() {
        let dir = std::env::temp_dir().join(format!("cy-dhcp-unsaved-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let unix = 1_800_000_000;
        let mut d = Dhcp::open(&config(), &dir, unix).unwrap();
        let table = LanTable::new(&[]);
        let now = Instant::now();
        let mac = [0x02, 0xbb, 0, 0, 0, 7];
        let discover = client_message(
            MessageType::Discover,
            mac,
            1,
            vec![],
            Ipv4Addr::UNSPECIFIED,
            false,
        );
        let offer = d.handle(unix, mac, &discover).unwrap();
        d.settle(now, &table);
        assert!(d.releasable(&offer), "an offer promises nothing");
        let ip = cyphonic_vip::testing::yiaddr(&offer.payload);
        let request = client_message(
            MessageType::Request,
            mac,
            2,
            vec![
                DhcpOption::ServerIdentifier(Ipv4Addr::new(100, 64, 1, 1)),
                DhcpOption::RequestedIpAddress(ip),
            ],
            Ipv4Addr::UNSPECIFIED,
            false,
        );
        // The state directory goes away: saving fails.
        std::fs::remove_dir_all(&dir).unwrap();
        let ack = d.handle(unix, mac, &request).unwrap();
        d.settle(now, &table);
        assert!(ack.grants);
        assert!(!d.releasable(&ack), "an ACK for a lease not on disk left");
        // Back again: the client's retry is answered, the lease saved first.
        std::fs::create_dir_all(&dir).unwrap();
        let ack = d.handle(unix + 4, mac, &request).unwrap();
        d.settle(now, &table);
        assert!(d.releasable(&ack));
        assert!(
            std::fs::read_to_string(dir.join("leases.json"))
                .unwrap()
                .contains(&ip.to_string())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

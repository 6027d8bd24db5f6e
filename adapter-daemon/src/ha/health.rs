//! What a box of the pair judges of itself (docs/protocol.md §5, *Health*): its LAN link;
//! its uplink: whether the kernel routes at least one of the underlay addresses the box must
//! reach (the static peers' endpoints, the cloud's addresses) out of an interface other than
//! the LAN port that carries packets; once it serves, its data plane: whether every
//! data-plane thread goes round its loop ([`cyphonic_pipeline::Pulses`]); and its reach:
//! whether a peer's endpoint or the cloud answered its probes lately ([`super::reach`]).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cyphonic_ha::Health;
use cyphonic_netio::Rtnl;
use cyphonic_pipeline::Pulses;

use super::reach::{Reach, Targets, WINDOW};
use crate::config::AdapterConfig;

/// At most this many underlay addresses are judged (each costs two netlink requests a look).
const TARGETS: usize = 8;
/// How often cloud host names are resolved again.
const RESOLVE_AGAIN: Duration = Duration::from_secs(60);
/// A data-plane thread that has not gone round its loop for this long is stuck: its waits
/// are at most 100 ms.
const STUCK: Duration = Duration::from_secs(1);

/// One box's judge of itself.
pub(super) struct Judge {
    lan: String,
    lan_index: u32,
    /// The addresses given as addresses, then those resolved from host names.
    literal: Vec<IpAddr>,
    resolved: Arc<Mutex<Vec<SocketAddr>>>,
    /// The reach prober (none: nothing to probe), and its last judgement.
    reach: Option<(Reach, Option<bool>)>,
    rtnl: Option<Rtnl>,
    /// The uplink's last judgement, to log its changes.
    uplink: Option<bool>,
    /// The data plane's last judgement, to log its changes.
    data_plane: DataPlane,
}

/// What the data plane was last judged.
#[derive(Debug, Default, PartialEq, Eq)]
struct DataPlane {
    /// The most threads seen beating at once: fewer later means one ended.
    most: usize,
    /// The stuck threads, by name.
    stuck: Vec<String>,
    /// How many threads ended while the box served.
    ended: usize,
}

impl Judge {
    /// The judge of the box `config` describes, whose LAN port is `lan` (`lan_index`). Cloud
    /// host names are resolved on a thread of their own, now and every minute, so that a
    /// slow resolver never delays a heartbeat.
    pub(super) fn new(config: &AdapterConfig, lan: &str, lan_index: u32) -> Self {
        let mut literal = Vec::new();
        let mut names = Vec::new();
        let mut peers: Vec<IpAddr> = config
            .common
            .active_peers()
            .filter_map(|p| p.endpoint)
            .map(|ep| ep.ip())
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers.truncate(TARGETS);
        literal.extend(&peers);
        let mut cloud = Vec::new();
        for address in config.common.cloud.iter().flat_map(|c| &c.addresses) {
            match address.parse::<SocketAddr>() {
                Ok(sa) => {
                    literal.push(sa.ip());
                    cloud.push(sa);
                }
                Err(_) => names.push(address.clone()),
            }
        }
        cloud.truncate(TARGETS);
        literal.sort_unstable();
        literal.dedup();
        literal.truncate(TARGETS);
        if literal.is_empty() && names.is_empty() {
            tracing::info!("HA: no static peer endpoint and no cloud: the uplink is not judged");
        }
        let has_names = !names.is_empty();
        let resolved = Arc::new(Mutex::new(Vec::new()));
        if has_names {
            let into = resolved.clone();
            let spawned = std::thread::Builder::new()
                .name("cy-ha-resolve".into())
                .spawn(move || {
                    loop {
                        let mut addrs: Vec<SocketAddr> = names
                            .iter()
                            .filter_map(|n| n.to_socket_addrs().ok())
                            .flatten()
                            .collect();
                        addrs.sort_unstable();
                        addrs.dedup();
                        addrs.truncate(TARGETS);
                        // A failed resolution keeps the addresses known before.
                        if !addrs.is_empty() {
                            *into.lock().unwrap_or_else(PoisonError::into_inner) = addrs;
                        }
                        std::thread::sleep(RESOLVE_AGAIN);
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "HA: cannot resolve the cloud's names; the uplink is judged by the other addresses");
            }
        }
        let rtnl = match Rtnl::open() {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(error = %e, "HA: no routing netlink socket; the uplink is not judged");
                None
            }
        };
        let reach = Reach::start(
            Targets {
                peers,
                cloud,
                resolved: resolved.clone(),
            },
            has_names,
        );
        Self {
            lan: lan.to_owned(),
            lan_index,
            literal,
            resolved,
            reach: reach.map(|r| (r, None)),
            rtnl,
            uplink: None,
            data_plane: DataPlane::default(),
        }
    }

    /// The box's health at `now`; its data plane judged by `pulses` once it runs.
    pub(super) fn health(&mut self, pulses: Option<&Pulses>, now: Instant) -> Health {
        let mut health = Health::ALL;
        if !lan_up(&self.lan) {
            health = health.without(Health::LAN);
        }
        if self.uplink_up() == Some(false) {
            health = health.without(Health::UPLINK);
        }
        if let Some(pulses) = pulses
            && !self.data_plane_alive(pulses, now)
        {
            health = health.without(Health::DATA_PLANE);
        }
        if let Some((reach, said)) = &mut self.reach {
            let reached = reach.reached(now);
            if *said != Some(reached) {
                if reached {
                    tracing::info!("HA: a peer's endpoint or the cloud answers");
                } else if said.is_some() {
                    tracing::warn!(
                        window_secs = WINDOW.as_secs(),
                        "HA: nothing answers: no peer's endpoint and no cloud address answered within the window"
                    );
                }
                *said = Some(reached);
            }
            if !reached {
                health = health.without(Health::REACHED);
            }
        }
        health
    }

    /// Whether every data-plane thread goes round its loop, and none has ended.
    fn data_plane_alive(&mut self, pulses: &Pulses, now: Instant) -> bool {
        let threads = pulses.threads();
        let judged = DataPlane {
            most: self.data_plane.most.max(threads),
            stuck: pulses.stuck(now, STUCK),
            ended: self.data_plane.most.saturating_sub(threads),
        };
        let alive = judged.stuck.is_empty() && judged.ended == 0;
        if judged.stuck != self.data_plane.stuck || judged.ended != self.data_plane.ended {
            if alive {
                tracing::info!(threads, "HA: the data plane goes round again");
            } else {
                tracing::error!(
                    stuck = ?judged.stuck,
                    ended = judged.ended,
                    after_ms = STUCK.as_millis(),
                    "HA: the data plane is stuck: a thread has not gone round its loop, or one ended"
                );
            }
        }
        self.data_plane = judged;
        alive
    }

    /// Whether the uplink carries: `None` when there is nothing to judge it by.
    fn uplink_up(&mut self) -> Option<bool> {
        let rtnl = self.rtnl.as_mut()?;
        let resolved = self
            .resolved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let targets: Vec<IpAddr> = self
            .literal
            .iter()
            .copied()
            .chain(resolved.iter().map(SocketAddr::ip))
            .take(TARGETS)
            .collect();
        if targets.is_empty() {
            return None;
        }
        let lan = self.lan_index;
        let up = targets.iter().any(|ip| match rtnl.route_out(*ip) {
            Ok(Some(index)) if index != lan => rtnl.link_carries(index).unwrap_or(false),
            Ok(_) => false,
            Err(e) => {
                tracing::debug!(%ip, error = %e, "HA: no route judged");
                false
            }
        });
        if self.uplink != Some(up) {
            if up {
                tracing::info!(addresses = targets.len(), "HA: the uplink carries");
            } else {
                tracing::warn!(
                    addresses = targets.len(),
                    "HA: the uplink is down: no route to any peer or cloud address out of a link that carries"
                );
            }
            self.uplink = Some(up);
        }
        Some(up)
    }
}

/// Whether the LAN port's link is up (`operstate`).
fn lan_up(iface: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/operstate"))
        .is_ok_and(|s| matches!(s.trim(), "up" | "unknown"))
}

//! Port mapping (docs/protocol.md §4, *Port mapping*): a tunnel end behind a NAT asks the
//! router in front of it to forward its tunnel port, with PCP (RFC 6887), NAT-PMP (RFC 6886)
//! or UPnP-IGD, on crab_nat and igd-next; renews the mapping at half its lifetime; gives it
//! back at stop or when the router or our address changes.
//!
//! [`Mapper`] is a task on the owner's tokio runtime: the owner sets a [`Target`] (which
//! router, from which address, where the cloud sees us) and reads what to register. The
//! schedule is [`plan::Plan`] (sans-IO); the protocols are `ask`.

#![forbid(unsafe_code)]

mod ask;
pub mod plan;

use std::num::NonZeroU16;
use std::time::{Duration, Instant};

use cyphonic_control::Mapping;
use tokio::sync::{oneshot, watch};

pub use crate::plan::Target;
use crate::plan::{Plan, Step};

/// How long [`Mapper::stop`] waits for the router to take a mapping back.
pub const STOP_WITHIN: Duration = Duration::from_secs(3);

/// The port mapping task of one tunnel port.
#[derive(Debug)]
pub struct Mapper {
    target: watch::Sender<Option<Target>>,
    mapping: watch::Receiver<Option<Mapping>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Mapper {
    /// Starts the task for the tunnel port `port` on the current tokio runtime (call inside
    /// it). It asks nothing until a target is set.
    pub fn spawn(port: NonZeroU16) -> Self {
        let (target, target_rx) = watch::channel(None);
        let (mapping_tx, mapping) = watch::channel(None);
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(run(port, target_rx, mapping_tx, stop_rx));
        Self {
            target,
            mapping,
            stop: Some(stop),
            task,
        }
    }

    /// Sets whom to ask: a new target gives back what the old one held and asks at once;
    /// `None` (not behind a NAT) gives back and asks nothing.
    pub fn set_target(&self, target: Option<Target>) {
        self.target.send_if_modified(|t| {
            let changed = *t != target;
            *t = target;
            changed
        });
    }

    /// What to register now.
    pub fn mapping(&self) -> Option<Mapping> {
        self.mapping.borrow().clone()
    }

    /// Waits until what to register changes, and returns it (cancel-safe). Pending forever
    /// once the task has ended.
    pub async fn changed(&mut self) -> Option<Mapping> {
        if self.mapping.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        self.mapping.borrow_and_update().clone()
    }

    /// Stops the task, giving the mapping back to the router; waits at most [`STOP_WITHIN`]
    /// (a router that does not answer lets the mapping expire).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(STOP_WITHIN, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!("the port mapping was not given back in time: it expires on its own");
            self.task.abort();
        }
    }
}

/// The task: follows the target, asks and renews as the plan says, publishes what to
/// register, gives back at a new target and at stop.
async fn run(
    port: NonZeroU16,
    mut target_rx: watch::Receiver<Option<Target>>,
    mapping_tx: watch::Sender<Option<Mapping>>,
    mut stop_rx: oneshot::Receiver<()>,
) {
    let mut current: Option<(Target, Plan)> = None;
    let mut held: Option<ask::Held> = None;
    loop {
        let next = current.as_ref().map(|(_, p)| p.next());
        tokio::select! {
            changed = target_rx.changed() => {
                if changed.is_err() {
                    break;
                }
                let target = *target_rx.borrow_and_update();
                if let Some(h) = held.take() {
                    ask::remove(h).await;
                }
                current = target.map(|t| (t, Plan::new(t.seen_at, Instant::now())));
            }
            () = sleep_until(next), if next.is_some() => {
                let Some((target, plan)) = current.as_mut() else { continue };
                let now = Instant::now();
                let (outcome, still) = match (plan.step(now), held.take()) {
                    (Step::Renew, Some(h)) => ask::renew(h).await,
                    (Step::Ask | Step::Renew, h) => {
                        if let Some(h) = h {
                            ask::remove(h).await;
                        }
                        ask::map(target, port).await
                    }
                    (Step::Wait, h) => {
                        held = h;
                        continue;
                    }
                };
                tracing::debug!(?outcome, "port mapping");
                held = still;
                plan.answered(outcome, Instant::now());
                if let Some(at) = plan.elsewhere() {
                    tracing::info!(%at, seen_at = %target.seen_at, "the router maps our port at an address the cloud does not see us at (a NAT beyond it): given back");
                    if let Some(h) = held.take() {
                        ask::remove(h).await;
                    }
                    plan.given_back(Instant::now());
                }
            }
            _ = &mut stop_rx => break,
        }
        let now = current.as_ref().and_then(|(_, p)| p.registered());
        mapping_tx.send_if_modified(|m| {
            if *m == now {
                return false;
            }
            match &now {
                Some(Mapping::Mapped { protocol, endpoint }) => {
                    tracing::info!(%protocol, %endpoint, "the router maps our tunnel port");
                }
                Some(Mapping::Refused { protocol, reason }) => {
                    tracing::warn!(%protocol, %reason, "the router refused to map our tunnel port");
                }
                None => tracing::info!("no port mapping"),
            }
            *m = now;
            true
        });
    }
    if let Some(h) = held.take() {
        ask::remove(h).await;
    }
}

/// Sleeps until `at` (never when `None`: the branch is disabled then).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

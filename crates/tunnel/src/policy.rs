//! Per-device policy in the engine: the one [`Filter`] of a tunnel end. The submitter asks it
//! before a packet is sealed ([`Direction::Out`]: a denied flow never costs the tunnel), the
//! ingress sink once a frame is opened and its replay window moved ([`Direction::In`]: what a
//! peer sends that no rule allows never reaches our side). Without rules (no `[policy]`, no
//! set pushed) nothing is looked at and everything between certified addresses passes, as
//! before policy existed.
//!
//! Drops are counted by the filter (per reason, and per direction); one in a while is logged
//! as a sample, with how many went unlogged since.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cyphonic_filter::Filter;
pub use cyphonic_filter::{
    Count, Direction, Ended, FlowKey, REFUSED_MAX, Reason, RuleSet, Stats, Taken, Timeouts, Verdict,
};

/// At most one drop is logged per this interval.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(10);

/// The flows a filter keeps unless configured otherwise.
pub const DEFAULT_FLOWS: usize = 16_384;

/// The rules a tunnel end enforces and how many flows it keeps (`[policy]`, or the cloud's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySettings {
    /// The rules (default deny).
    pub rules: RuleSet,
    /// Flows kept at most; the oldest goes first when full.
    pub flows: usize,
}

/// The policy's state, for status and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyReport {
    /// The rule set's version.
    pub version: u64,
    /// Rules in force (compiled: one per protocol a written rule allows).
    pub rules: usize,
    /// Flows kept now.
    pub flows: usize,
    /// Flows kept at most.
    pub capacity: usize,
    /// The filter's counters.
    pub stats: Stats,
}

#[derive(Debug, Default)]
struct Inner {
    filter: Option<Filter>,
    capacity: usize,
    /// Flow logs are on (docs/protocol.md §8): every filter set keeps them.
    logs: bool,
    /// What the filters replaced since the last take left in their logs.
    left: Taken,
    last_sample: Option<Instant>,
    unsampled: u64,
    last_expiry: Option<Instant>,
}

/// Timed-out flows are looked for at most this often.
const EXPIRY_INTERVAL: Duration = Duration::from_secs(1);

/// The tunnel end's policy, shared by the data threads and the control thread.
#[derive(Debug, Default)]
pub struct Policy {
    /// Rules are in force: the data path looks at nothing while they are not.
    on: AtomicBool,
    inner: Mutex<Inner>,
}

impl Policy {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether rules are in force (one atomic load).
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Whether `packet` (an IPv4 packet) travelling `dir` may pass; a drop is counted (and
    /// now and then logged).
    pub fn allows(&self, packet: &[u8], dir: Direction, now: Instant) -> bool {
        if !self.on.load(Ordering::Relaxed) {
            return true;
        }
        let mut inner = self.lock();
        let Some(filter) = inner.filter.as_mut() else {
            return true;
        };
        let Verdict::Drop(reason) = filter.check(packet, dir, now) else {
            return true;
        };
        let due = inner
            .last_sample
            .is_none_or(|t| now.saturating_duration_since(t) >= SAMPLE_INTERVAL);
        if due {
            let unlogged = std::mem::take(&mut inner.unsampled);
            inner.last_sample = Some(now);
            drop(inner);
            log_sample(packet, dir, reason, unlogged);
        } else {
            inner.unsampled += 1;
        }
        false
    }

    /// Enforces `settings` from now on (`None`: no policy, everything passes). Flows the new
    /// rules no longer allow are cut; a new capacity starts an empty table. Returns how many
    /// flows were cut.
    pub fn set(&self, settings: Option<&PolicySettings>) -> usize {
        let mut inner = self.lock();
        let capacity = inner.capacity;
        let cut = match (settings, inner.filter.as_mut()) {
            (Some(s), Some(f)) if capacity == s.flows => f.set_rules(s.rules.clone()),
            (settings, _) => {
                let mut old = inner.filter.take();
                let cut = old.as_ref().map_or(0, Filter::flows);
                // The flows of the table that goes are in its log, with what it held.
                if let Some(f) = old.as_mut() {
                    let left = f.finish(Instant::now());
                    keep(&mut inner.left, left);
                }
                if let Some(s) = settings {
                    let mut f = Filter::new(s.rules.clone(), s.flows, Timeouts::default());
                    f.set_log(inner.logs);
                    inner.filter = Some(f);
                    inner.capacity = s.flows;
                }
                if settings.is_some() { cut } else { 0 }
            }
        };
        self.on.store(inner.filter.is_some(), Ordering::Relaxed);
        cut
    }

    /// Turns flow logs on or off (docs/protocol.md §8, *Flow logs*); off, what was not
    /// taken is dropped.
    pub fn set_logs(&self, on: bool) {
        let mut inner = self.lock();
        inner.logs = on;
        if !on {
            inner.left = Taken::default();
        }
        if let Some(f) = inner.filter.as_mut() {
            f.set_log(on);
        }
    }

    /// The flow log since the last take ([`Filter::take_log`]), with what filters replaced
    /// since left; nothing while flow logs are off.
    pub fn take_log(&self, now: Instant) -> Taken {
        let mut inner = self.lock();
        let mut taken = std::mem::take(&mut inner.left);
        if let Some(f) = inner.filter.as_mut() {
            keep(&mut taken, f.take_log(now));
        }
        taken
    }

    /// Forgets flows that timed out by `now` (the control thread calls it at every wake-up;
    /// the table is walked at most once a second).
    pub fn expire(&self, now: Instant) {
        if !self.on.load(Ordering::Relaxed) {
            return;
        }
        let mut inner = self.lock();
        if inner
            .last_expiry
            .is_some_and(|t| now.saturating_duration_since(t) < EXPIRY_INTERVAL)
        {
            return;
        }
        inner.last_expiry = Some(now);
        if let Some(f) = inner.filter.as_mut() {
            f.expire(now);
        }
    }

    /// What is in force, and the counters; `None` without rules.
    pub fn report(&self) -> Option<PolicyReport> {
        let inner = self.lock();
        inner.filter.as_ref().map(|f| PolicyReport {
            version: f.rules().version,
            rules: f.rules().rules.len(),
            flows: f.flows(),
            capacity: inner.capacity,
            stats: f.stats().clone(),
        })
    }

    /// Whether `src` may open a flow of IP protocol `proto` to `dst`:`dport` under the rules
    /// in force, and by which rule: `Some(None)` when no rule allows it, `None` without rules.
    pub fn would_allow(
        &self,
        proto: u8,
        src: std::net::IpAddr,
        dst: std::net::IpAddr,
        dport: u16,
    ) -> Option<Option<u32>> {
        let inner = self.lock();
        inner
            .filter
            .as_ref()
            .map(|f| f.rules().first_allowing(proto, src, dst, dport))
    }
}

/// Adds `more` to `all`, within the filter's bounds (what goes beyond is counted lost).
fn keep(all: &mut Taken, more: Taken) {
    let room = cyphonic_filter::ENDED_MAX.saturating_sub(all.ended.len());
    let lost = more.ended.len().saturating_sub(room)
        + more
            .refused
            .len()
            .saturating_sub(REFUSED_MAX.saturating_sub(all.refused.len()));
    all.ended.extend(more.ended.into_iter().take(room));
    let room = REFUSED_MAX.saturating_sub(all.refused.len());
    all.refused.extend(more.refused.into_iter().take(room));
    all.lost += more.lost + lost as u64;
}

/// Logs one dropped packet: who to whom, what, why.
fn log_sample(packet: &[u8], dir: Direction, reason: Reason, unlogged: u64) {
    let flow = cyphonic_filter::flow_of(packet);
    let (src, dst, proto) = (
        flow.map(|f| f.src),
        flow.map(|f| f.dst),
        flow.map(|f| f.proto),
    );
    let dport = flow.filter(|f| matches!(f.proto, 6 | 17)).map(|f| f.dport);
    let dir = match dir {
        Direction::Out => "out",
        Direction::In => "in",
    };
    tracing::info!(
        dir,
        reason = reason.name(),
        src = ?src,
        dst = ?dst,
        proto = ?proto,
        dport = ?dport,
        unlogged_since_last = unlogged,
        "policy dropped a packet (a sample)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use cyphonic_filter::{Proto, Rule};

    fn icmp_echo(src: [u8; 4], dst: [u8; 4], reply: bool) -> Vec<u8> {
        let mut p = vec![0u8; 28];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&28u16.to_be_bytes());
        p[8] = 64;
        p[9] = 1;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        p[20] = if reply { 0 } else { 8 };
        p[24..26].copy_from_slice(&7u16.to_be_bytes());
        p
    }

    fn ping_rule(version: u64) -> PolicySettings {
        PolicySettings {
            rules: RuleSet {
                version,
                rules: vec![Rule {
                    id: 1,
                    from: vec!["100.64.1.0/24".parse().unwrap_or_default()],
                    to: vec!["100.64.2.0/24".parse().unwrap_or_default()],
                    proto: Proto::Icmp,
                    ports: Vec::new(),
                }],
            },
            flows: 16,
        }
    }

    /// Without rules everything passes; with them, only what they allow and its replies; a
    /// set without the rule cuts the flow; no policy again lets everything through.
    #[test]
    fn policy_follows_what_is_set() {
        let p = Policy::default();
        let now = Instant::now();
        let (ops, iot) = ([100, 64, 1, 9], [100, 64, 2, 7]);
        assert!(p.allows(&icmp_echo(iot, ops, false), Direction::In, now));
        assert!(p.report().is_none());
        assert_eq!(p.set(Some(&ping_rule(1))), 0);
        assert!(p.allows(&icmp_echo(ops, iot, false), Direction::Out, now));
        assert!(p.allows(&icmp_echo(iot, ops, true), Direction::In, now));
        assert!(!p.allows(&icmp_echo(iot, ops, false), Direction::In, now));
        assert_eq!(p.would_allow(1, ops.into(), iot.into(), 0), Some(Some(1)));
        assert_eq!(p.would_allow(1, iot.into(), ops.into(), 0), Some(None));
        let r = p.report();
        assert!(
            r.as_ref().is_some_and(|r| r.flows == 1
                && r.version == 1
                && r.stats.dropped_in(Reason::NoRule) == 1),
            "{r:?}"
        );
        let mut empty = ping_rule(2);
        empty.rules.rules.clear();
        assert_eq!(p.set(Some(&empty)), 1, "the ping flow is cut");
        assert!(!p.allows(&icmp_echo(iot, ops, true), Direction::In, now));
        p.set(None);
        assert!(p.allows(&icmp_echo(iot, ops, false), Direction::In, now));
        assert_eq!(p.would_allow(1, iot.into(), ops.into(), 0), None);
    }
}

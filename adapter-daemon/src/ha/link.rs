//! What the pair's thread and the LAN services (the DHCP server) tell each other
//! (docs/protocol.md §5, *State that moves* and *Split brain*):
//!
//! ```text
//! services --the lease file each time the writer wrote it--> pair's thread --> standby
//! services <--the generation the standby holds, if one is to---- pair's thread <-- heartbeats
//! services <--where new addresses come from; the other's bindings-- pair's thread
//! ```
//!
//! The pair's thread acknowledges a table only by the version the standby's heartbeat names,
//! and maps that version back to the generation of the file it sent ([`Sent`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cyphonic_pipeline::Pulses;
use cyphonic_vip::Share;

use crate::dhcp::Replica;

/// The link; cloned by both sides.
#[derive(Debug, Clone, Default)]
pub struct PairLink(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    /// Wakes the services when what the standby holds changed.
    replica_changed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct State {
    share: Share,
    merge: Option<cyphonic_vip::file::Table>,
    /// The newest lease file written, with its generation.
    table: Option<(u64, Arc<[u8]>)>,
    /// What a standby holds, while one is to hold each new lease.
    replica: Replica,
    /// The data-plane threads' beats, once the engine runs.
    data_plane: Option<Pulses>,
}

impl PairLink {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where new addresses come from now.
    pub fn share(&self) -> Share {
        self.lock().share
    }

    /// The other box's bindings to take in, once.
    pub fn take_merge(&self) -> Option<cyphonic_vip::file::Table> {
        self.lock().merge.take()
    }

    /// The lease writer wrote `table`, the file of snapshot `generation`: for the standby.
    /// An older generation than the one held is ignored.
    pub fn publish_table(&self, generation: u64, table: Arc<[u8]>) {
        let mut s = self.lock();
        if s.table.as_ref().is_none_or(|(g, _)| *g < generation) {
            s.table = Some((generation, table));
        }
    }

    /// Whether a standby is to hold each new lease before its ACK leaves, and what it holds.
    pub fn replica(&self) -> Replica {
        self.lock().replica
    }

    /// Resolves once what [`PairLink::replica`] says may have changed since the last time.
    pub async fn replica_changed(&self) {
        self.0.replica_changed.notified().await;
    }

    /// The engine runs: its data-plane threads, and the edge's, beat in `pulses`; the pair's
    /// thread judges the data plane by them from now on.
    pub fn watch_data_plane(&self, pulses: Pulses) {
        self.lock().data_plane = Some(pulses);
    }

    /// The data-plane threads' beats, once the engine runs.
    pub(super) fn data_plane(&self) -> Option<Pulses> {
        self.lock().data_plane.clone()
    }

    pub(super) fn set_share(&self, share: Share) {
        self.lock().share = share;
    }

    /// Bindings for the DHCP server to take in: the newest table replaces one not taken yet.
    pub(super) fn offer_merge(&self, table: cyphonic_vip::file::Table) {
        self.lock().merge = Some(table);
    }

    /// The newest lease file written, if any.
    pub(super) fn table(&self) -> Option<(u64, Arc<[u8]>)> {
        self.lock().table.clone()
    }

    pub(super) fn set_replica(&self, replica: Replica) {
        let changed = {
            let mut s = self.lock();
            let changed = s.replica != replica;
            s.replica = replica;
            changed
        };
        if changed {
            self.0.replica_changed.notify_one();
        }
    }
}

/// How many tables sent are remembered: a standby's heartbeat names one of the last few.
const REMEMBERED: usize = 16;

/// The tables the active box sent to the standby: each one's version (what a heartbeat
/// names), the generation of the file it was, and when it was first sent.
#[derive(Debug, Default)]
pub(super) struct Sent(VecDeque<(u64, u64, Instant)>);

impl Sent {
    /// Table `version`, the file of `generation`, was sent at `now`.
    pub(super) fn sent(&mut self, version: u64, generation: u64, now: Instant) {
        if self
            .0
            .back()
            .is_some_and(|&(v, g, _)| (v, g) == (version, generation))
        {
            return;
        }
        if self.0.len() == REMEMBERED {
            self.0.pop_front();
        }
        self.0.push_back((version, generation, now));
    }

    /// The generation the standby holds when it names `version`: that of the newest file
    /// sent with it; none when it names none we sent (it holds an older table, or another's).
    pub(super) fn holds(&self, version: u64) -> Option<u64> {
        self.0
            .iter()
            .rev()
            .find(|(v, _, _)| *v == version)
            .map(|&(_, g, _)| g)
    }

    /// How long ago the oldest file newer than generation `held` was first sent (zero when
    /// none is; with `held` none, the oldest remembered).
    pub(super) fn lag(&self, held: Option<u64>, now: Instant) -> Duration {
        self.0
            .iter()
            .find(|&&(_, g, _)| held.is_none_or(|h| g > h))
            .map_or(Duration::ZERO, |&(_, _, at)| {
                now.saturating_duration_since(at)
            })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_version_names_the_newest_file_sent_with_it_and_an_unknown_one_nothing() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut sent = Sent::default();
        assert_eq!(sent.holds(7), None);
        assert_eq!(sent.lag(None, t0), Duration::ZERO);
        sent.sent(7, 0, ms(0));
        sent.sent(9, 3, ms(10));
        sent.sent(7, 5, ms(20)); // the same bytes again (a lease came and went)
        sent.sent(7, 5, ms(30)); // sent again unchanged: one entry, the first time kept
        assert_eq!(sent.0.len(), 3);
        assert_eq!(sent.holds(9), Some(3));
        assert_eq!(sent.holds(7), Some(5));
        assert_eq!(sent.holds(8), None);
        // Behind since the first file it lacks was sent.
        assert_eq!(sent.lag(Some(0), ms(50)), Duration::from_millis(40));
        assert_eq!(sent.lag(Some(3), ms(50)), Duration::from_millis(30));
        assert_eq!(sent.lag(Some(5), ms(50)), Duration::ZERO);
        assert_eq!(sent.lag(None, ms(50)), Duration::from_millis(50));
        for g in 6..6 + REMEMBERED as u64 {
            sent.sent(100 + g, g, ms(100));
        }
        assert_eq!(sent.0.len(), REMEMBERED);
        assert_eq!(sent.holds(9), None, "forgotten");
    }

    #[test]
    fn only_a_newer_table_replaces_the_one_held_and_the_services_are_woken_by_a_change() {
        let link = PairLink::default();
        link.publish_table(2, Arc::from(&b"two"[..]));
        link.publish_table(1, Arc::from(&b"one"[..]));
        assert_eq!(
            link.table().map(|(g, t)| (g, t.to_vec())),
            Some((2, b"two".to_vec()))
        );
        link.set_replica(Replica::Holds(Some(2)));
        assert_eq!(link.replica(), Replica::Holds(Some(2)));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let woken = |link: &PairLink| {
            rt.block_on(async {
                tokio::time::timeout(Duration::from_millis(50), link.replica_changed())
                    .await
                    .is_ok()
            })
        };
        assert!(woken(&link), "the change woke");
        link.set_replica(Replica::Holds(Some(2)));
        assert!(!woken(&link), "no change, no wake");
        link.set_replica(Replica::Alone);
        assert!(woken(&link));
    }
}

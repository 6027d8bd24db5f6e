//! Flow logs (docs/protocol.md §8, *Flow logs*): the flows a filter ended, and a summary per
//! source of the new flows it refused, waiting in bounded queues for the caller to take.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::{Direction, FlowKey};

/// Ended flows a filter holds at most until they are taken; beyond, they are lost (counted).
pub const ENDED_MAX: usize = 4096;
/// Sources of refused flows summarised at most until taken; beyond, new sources are lost
/// (counted).
pub const REFUSED_MAX: usize = 1024;
/// Distinct destination ports a summary counts at most.
pub const PORTS_MAX: usize = 1024;
/// How long a summary gathers before it may be taken.
pub const REFUSED_WINDOW: Duration = Duration::from_secs(60);

/// Bytes and packets one way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    /// Bytes of the IP packets.
    pub bytes: u64,
    /// Packets.
    pub packets: u64,
}

impl Count {
    pub(crate) const fn add(&mut self, len: usize) {
        self.bytes = self.bytes.saturating_add(len as u64);
        self.packets = self.packets.saturating_add(1);
    }
}

/// A flow that ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Its opener's addresses and ports.
    pub key: FlowKey,
    /// The way its opener's packets travelled.
    pub dir: Direction,
    /// The rule that allowed it.
    pub rule: u32,
    /// Its first packet.
    pub start: Instant,
    /// Its end: its last packet, or when it was cut.
    pub end: Instant,
    /// From its opener.
    pub forth: Count,
    /// From its answerer.
    pub back: Count,
}

/// New flows from one source, one way, that no rule allowed, over a minute at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedFlows {
    /// Their source.
    pub src: IpAddr,
    /// The way they travelled.
    pub dir: Direction,
    /// The first.
    pub first: Instant,
    /// The last.
    pub last: Instant,
    /// Packets refused.
    pub packets: u64,
    /// Distinct destination ports, counted up to [`PORTS_MAX`].
    pub ports: usize,
}

/// What [`crate::Filter::take_log`] hands over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taken {
    /// Flows that ended, oldest first.
    pub ended: Vec<Ended>,
    /// Summaries whose minute is over (all of them when the log stops).
    pub refused: Vec<RefusedFlows>,
    /// Records lost since the last take: ended flows beyond [`ENDED_MAX`], sources beyond
    /// [`REFUSED_MAX`].
    pub lost: u64,
}

#[derive(Debug)]
struct Summary {
    first: Instant,
    last: Instant,
    packets: u64,
    ports: HashSet<u16>,
}

/// The log a filter keeps while flow logs are on.
#[derive(Debug, Default)]
pub(crate) struct FlowLog {
    ended: VecDeque<Ended>,
    refused: HashMap<(IpAddr, Direction), Summary>,
    lost: u64,
}

impl FlowLog {
    pub(crate) fn ended(&mut self, e: Ended) {
        if self.ended.len() >= ENDED_MAX {
            self.lost += 1;
            return;
        }
        self.ended.push_back(e);
    }

    pub(crate) fn refused(&mut self, key: &FlowKey, dir: Direction, now: Instant) {
        let len = self.refused.len();
        let s = match self.refused.entry((key.src, dir)) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(_) if len >= REFUSED_MAX => {
                self.lost += 1;
                return;
            }
            std::collections::hash_map::Entry::Vacant(v) => v.insert(Summary {
                first: now,
                last: now,
                packets: 0,
                ports: HashSet::new(),
            }),
        };
        s.last = now;
        s.packets += 1;
        if s.ports.len() < PORTS_MAX {
            s.ports.insert(key.dport);
        }
    }

    /// What ended, the summaries whose minute is over by `now` (every one with `all`), and
    /// the count of what was lost.
    pub(crate) fn take(&mut self, now: Instant, all: bool) -> Taken {
        let over = |s: &Summary| all || now.saturating_duration_since(s.first) >= REFUSED_WINDOW;
        let done: Vec<(IpAddr, Direction)> = self
            .refused
            .iter()
            .filter(|(_, s)| over(s))
            .map(|(k, _)| *k)
            .collect();
        let mut refused: Vec<RefusedFlows> = done
            .into_iter()
            .filter_map(|k| {
                let s = self.refused.remove(&k)?;
                Some(RefusedFlows {
                    src: k.0,
                    dir: k.1,
                    first: s.first,
                    last: s.last,
                    packets: s.packets,
                    ports: s.ports.len(),
                })
            })
            .collect();
        refused.sort_by_key(|r| r.first);
        Taken {
            ended: self.ended.drain(..).collect(),
            refused,
            lost: std::mem::take(&mut self.lost),
        }
    }
}

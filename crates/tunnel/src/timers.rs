//! When each peer's timers are next due, in order: what the control core's loop sleeps
//! until and runs, without asking every peer each time it wakes (issue 24: at 10,000 peers
//! their timers fall due every few milliseconds, and a walk over all of them on every
//! wake-up held the adapter at half a core while idle).

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

/// Peers' next deadlines. A peer's entry is set whenever the control core has touched it
/// (its state machine then says when it is due); the core also looks at every peer now and
/// then, for what other threads changed without saying.
#[derive(Debug, Default)]
pub struct Timers {
    queue: BTreeSet<(Instant, u32)>,
    due: HashMap<u32, Instant>,
}

impl Timers {
    /// Peer `id` is next due at `at` (`None`: nothing to do until something happens).
    pub fn set(&mut self, id: u32, at: Option<Instant>) {
        if let Some(old) = self.due.get(&id).copied() {
            if Some(old) == at {
                return;
            }
            self.queue.remove(&(old, id));
            self.due.remove(&id);
        }
        if let Some(at) = at {
            self.queue.insert((at, id));
            self.due.insert(id, at);
        }
    }

    /// The earliest deadline.
    pub fn first(&self) -> Option<Instant> {
        self.queue.first().map(|(at, _)| *at)
    }

    /// Takes out the peers due by `now`, earliest first (their entries are set again when
    /// they have been run).
    pub fn take_due(&mut self, now: Instant) -> Vec<u32> {
        let mut ids = Vec::new();
        while let Some(&(at, id)) = self.queue.first() {
            if at > now {
                break;
            }
            self.queue.pop_first();
            self.due.remove(&id);
            ids.push(id);
        }
        ids
    }

    /// The peers with a deadline.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.due.keys().copied()
    }

    /// How many peers have a deadline.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    /// Whether no peer has one.
    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn peers_come_due_in_order_once_and_moved_deadlines_move() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut t = Timers::default();
        t.set(1, Some(ms(30)));
        t.set(2, Some(ms(10)));
        t.set(3, Some(ms(20)));
        t.set(3, Some(ms(40)));
        t.set(4, Some(ms(5)));
        t.set(4, None);
        assert_eq!(t.first(), Some(ms(10)));
        assert_eq!(t.len(), 3);
        assert_eq!(t.take_due(ms(30)), [2, 1]);
        assert_eq!(t.take_due(ms(30)), Vec::<u32>::new(), "taken once");
        assert_eq!(t.first(), Some(ms(40)));
        assert_eq!(t.take_due(ms(100)), [3]);
        assert!(t.is_empty());
    }
}

//! Whether the data plane's threads go round their loops: each beats once a turn, and every
//! wait of theirs is bounded, so a thread that has not beaten for a while is stuck (a
//! deadlock, a loop that never ends, a system call that never returns) even when nothing
//! else shows it. An HA pair's box judges its data plane by this (docs/protocol.md §5,
//! *Health*).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What a beat slot holds once its thread has ended.
const ENDED: u64 = u64::MAX;

/// The beats of a process's data-plane threads: a cheap handle, shared by cloning.
#[derive(Debug, Clone)]
pub struct Pulses(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    epoch: Instant,
    threads: Mutex<Vec<(String, Arc<AtomicU64>)>>,
}

/// One thread's beat: [`Pulse::beat`] once a turn of its loop. Dropped when its thread ends,
/// and then no longer judged.
#[derive(Debug)]
pub struct Pulse {
    epoch: Instant,
    last: Arc<AtomicU64>,
}

impl Pulse {
    /// The thread went round its loop at `now`.
    pub fn beat(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.epoch).as_millis();
        self.last
            .store(u64::try_from(ms).unwrap_or(ENDED - 1), Ordering::Relaxed);
    }
}

impl Drop for Pulse {
    fn drop(&mut self) {
        self.last.store(ENDED, Ordering::Relaxed);
    }
}

impl Default for Pulses {
    fn default() -> Self {
        Self::new()
    }
}

impl Pulses {
    /// No thread yet.
    pub fn new() -> Self {
        Self(Arc::new(Inner {
            epoch: Instant::now(),
            threads: Mutex::new(Vec::new()),
        }))
    }

    /// A thread called `name` that beats from now on (its first beat is now).
    pub fn register(&self, name: &str) -> Pulse {
        let pulse = Pulse {
            epoch: self.0.epoch,
            last: Arc::new(AtomicU64::new(0)),
        };
        pulse.beat(Instant::now());
        self.lock().push((name.to_owned(), pulse.last.clone()));
        pulse
    }

    /// The calling thread, by its name, beating from now on.
    pub fn register_here(&self) -> Pulse {
        self.register(std::thread::current().name().unwrap_or("unnamed"))
    }

    /// The threads that have not beaten for `after` or longer at `now`, by name, in the
    /// order they were registered. Threads that ended are forgotten.
    pub fn stuck(&self, now: Instant, after: Duration) -> Vec<String> {
        let now_ms = now.saturating_duration_since(self.0.epoch).as_millis();
        let mut threads = self.lock();
        threads.retain(|(_, last)| last.load(Ordering::Relaxed) != ENDED);
        threads
            .iter()
            .filter(|(_, last)| {
                let last = u128::from(last.load(Ordering::Relaxed));
                now_ms.saturating_sub(last) >= after.as_millis()
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// How many threads beat (those that ended not counted).
    pub fn threads(&self) -> usize {
        let threads = self.lock();
        threads
            .iter()
            .filter(|(_, last)| last.load(Ordering::Relaxed) != ENDED)
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, Arc<AtomicU64>)>> {
        self.0
            .threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl PartialEq for Pulses {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Pulses {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_stops_beating_is_stuck_and_one_that_ended_is_not() {
        let pulses = Pulses::new();
        let t = Instant::now();
        let rx = pulses.register("cy-udp-rx");
        let emit = pulses.register("cy-emit");
        let second = Duration::from_secs(1);
        assert!(pulses.stuck(t, second).is_empty());
        rx.beat(t + Duration::from_millis(1500));
        emit.beat(t + Duration::from_millis(600));
        assert_eq!(
            pulses.stuck(t + Duration::from_millis(1700), second),
            ["cy-emit"]
        );
        // Exactly a second without a beat is stuck already.
        assert_eq!(
            pulses.stuck(t + Duration::from_millis(2500), second),
            ["cy-udp-rx", "cy-emit"]
        );
        assert_eq!(pulses.threads(), 2);
        drop(emit);
        assert_eq!(pulses.threads(), 1);
        assert_eq!(
            pulses.stuck(t + Duration::from_secs(60), second),
            ["cy-udp-rx"]
        );
        drop(rx);
        assert!(pulses.stuck(t + Duration::from_secs(60), second).is_empty());
        assert_eq!(pulses.threads(), 0);
    }
}

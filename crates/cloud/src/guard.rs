//! What any one party can make NMS do (docs/protocol.md §4, "Replays" and "Bounds"): how
//! many connections may sit unproven, which handshake timestamps are replays, and how fast
//! one session's requests are served. Sans-IO: the session code asks, these answer.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cyphonic_control::ClientMsg;
use cyphonic_crypto::PublicKey;
use governor::clock::Clock as _;
use governor::{DefaultDirectRateLimiter, Quota};

/// Connections that have not proven themselves, in all.
pub const MAX_UNPROVEN: usize = 256;
/// ... and from one source (an IPv4 address, an IPv6 /64).
pub const MAX_UNPROVEN_PER_SOURCE: usize = 8;
/// How long an identity's last handshake timestamp is remembered after its last session.
pub const FRESHNESS_MEMORY: Duration = Duration::from_secs(600);
/// Identities whose timestamps are remembered at once.
const MAX_REMEMBERED: usize = 65_536;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Who counts as one source: an IPv4 address, or an IPv6 /64 (one host's share of a
/// network: an attacker holding a /64 has every address in it).
fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

/// The connections that have not proven themselves yet: a cap in all and per source, shared
/// fairly. When every place is taken, a connection from a source that holds fewer places
/// than the source holding the most takes the oldest place of that one (which is told, by
/// its [`Ticket::evicted`], to close): so sources that fill the gate between them (64
/// addresses holding 4 places each) cannot keep out a client that holds none (issue 49,
/// finding 4). Only as many sources as places, one place each, can.
#[derive(Debug)]
pub struct Unproven {
    total: usize,
    per_source: usize,
    held: Mutex<Places>,
}

#[derive(Debug, Default)]
struct Places {
    /// Per source, its places, the oldest first.
    by_source: HashMap<IpAddr, VecDeque<(u64, Arc<Eviction>)>>,
    count: usize,
    serial: u64,
    /// Places taken from a source to make room for another's, since start.
    evicted: u64,
}

/// How a place is taken back.
#[derive(Debug, Default)]
struct Eviction {
    evicted: AtomicBool,
    notify: tokio::sync::Notify,
}

/// One unproven connection's place; dropping it frees the place.
#[derive(Debug)]
pub struct Ticket {
    gate: Arc<Unproven>,
    source: IpAddr,
    id: u64,
    eviction: Arc<Eviction>,
}

impl Ticket {
    /// Completes when this place was taken for a connection of another source: the
    /// connection is to close.
    pub async fn evicted(&self) {
        loop {
            let notified = self.eviction.notify.notified();
            if self.eviction.evicted.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut places = lock(&self.gate.held);
        if let Entry::Occupied(mut e) = places.by_source.entry(self.source) {
            let before = e.get().len();
            e.get_mut().retain(|(id, _)| *id != self.id);
            let gone = before - e.get().len();
            if e.get().is_empty() {
                e.remove();
            }
            places.count -= gone;
        }
    }
}

impl Unproven {
    /// At most `total` unproven connections, `per_source` from one source.
    pub fn new(total: usize, per_source: usize) -> Arc<Self> {
        Arc::new(Self {
            total,
            per_source,
            held: Mutex::new(Places::default()),
        })
    }

    /// A place for a connection from `ip`, or `None` when its source holds its share, or
    /// every place is taken by sources that hold no more than one place more than it.
    pub fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<Ticket> {
        let source = source_of(ip);
        let mut places = lock(&self.held);
        let mine = places.by_source.get(&source).map_or(0, VecDeque::len);
        if mine >= self.per_source {
            return None;
        }
        if places.count >= self.total {
            // The source holding the most; of two, the one whose oldest place is older.
            let (heaviest, most, _) = places
                .by_source
                .iter()
                .map(|(s, p)| (*s, p.len(), p.front().map_or(0, |(id, _)| *id)))
                .max_by_key(|(_, n, oldest)| (*n, std::cmp::Reverse(*oldest)))?;
            if most <= mine + 1 {
                return None;
            }
            let queue = places.by_source.get_mut(&heaviest)?;
            let (_, taken) = queue.pop_front()?;
            if queue.is_empty() {
                places.by_source.remove(&heaviest);
            }
            places.count -= 1;
            places.evicted += 1;
            taken.evicted.store(true, Ordering::Release);
            taken.notify.notify_waiters();
        }
        places.serial += 1;
        let (id, eviction) = (places.serial, Arc::new(Eviction::default()));
        places
            .by_source
            .entry(source)
            .or_default()
            .push_back((id, eviction.clone()));
        places.count += 1;
        Some(Ticket {
            gate: self.clone(),
            source,
            id,
            eviction,
        })
    }

    /// Places held now.
    pub fn held(&self) -> usize {
        lock(&self.held).count
    }

    /// Places taken from one source to make room for another's, since start.
    pub fn evicted(&self) -> u64 {
        lock(&self.held).evicted
    }
}

#[derive(Debug)]
struct Seen {
    /// The largest timestamp admitted.
    timestamp: u64,
    /// Sessions (pending or proven) of this identity now.
    live: usize,
    /// When the last one ended (or the entry was made).
    since: Instant,
}

impl Seen {
    fn remembered(&self, now: Instant) -> bool {
        self.live > 0 || now.saturating_duration_since(self.since) < FRESHNESS_MEMORY
    }
}

/// The handshake timestamps admitted, per client static key: a `Hello` whose timestamp is not
/// greater than the last admitted one for its key is a replay.
#[derive(Debug, Default)]
pub struct Freshness {
    seen: Mutex<HashMap<PublicKey, Seen>>,
}

/// An identity's hold on its freshness record while one of its sessions lives.
#[derive(Debug)]
pub struct Live {
    freshness: Arc<Freshness>,
    key: PublicKey,
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(s) = lock(&self.freshness.seen).get_mut(&self.key) {
            s.live = s.live.saturating_sub(1);
            s.since = Instant::now();
        }
    }
}

impl Freshness {
    /// An empty record.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Whether `timestamp` from `key` is a replay (not greater than the last one admitted,
    /// while that one is remembered).
    pub fn is_replay(&self, key: &PublicKey, timestamp: u64, now: Instant) -> bool {
        lock(&self.seen)
            .get(key)
            .is_some_and(|s| s.remembered(now) && timestamp <= s.timestamp)
    }

    /// Records an admitted handshake (its certificate passed): later ones from `key` must
    /// carry a greater timestamp. The record lives while the returned hold does, and
    /// [`FRESHNESS_MEMORY`] after.
    pub fn admit(self: &Arc<Self>, key: PublicKey, timestamp: u64, now: Instant) -> Live {
        let mut seen = lock(&self.seen);
        if seen.len() >= MAX_REMEMBERED && !seen.contains_key(&key) {
            seen.retain(|_, s| s.remembered(now));
            if seen.len() >= MAX_REMEMBERED {
                // Under pressure the memory after a session shrinks to nothing; live sessions
                // stay. (Proof before replacement still protects everyone.)
                seen.retain(|_, s| s.live > 0);
            }
        }
        let s = seen.entry(key).or_insert(Seen {
            timestamp,
            live: 0,
            since: now,
        });
        s.timestamp = s.timestamp.max(timestamp);
        s.live += 1;
        s.since = now;
        Live {
            freshness: self.clone(),
            key,
        }
    }

    /// Identities remembered now.
    pub fn len(&self) -> usize {
        lock(&self.seen).len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A token bucket of `per_sec` a second, `burst` at once.
pub(crate) fn quota(per_sec: u32, burst: u32) -> DefaultDirectRateLimiter {
    let nz = |n: u32| NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);
    governor::RateLimiter::direct(Quota::per_second(nz(per_sec)).allow_burst(nz(burst)))
}

/// One session's request rates, a token bucket per class: `register` 2/s (burst 10),
/// `resolve` 50/s (burst 100), `relay` and `admit` together 10/s (burst 20). Pings are free.
pub struct Requests {
    register: DefaultDirectRateLimiter,
    resolve: DefaultDirectRateLimiter,
    pair: DefaultDirectRateLimiter,
    flows: DefaultDirectRateLimiter,
}

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requests").finish_non_exhaustive()
    }
}

impl Default for Requests {
    fn default() -> Self {
        Self {
            register: quota(2, 10),
            resolve: quota(50, 100),
            pair: quota(10, 20),
            flows: quota(2, 5),
        }
    }
}

impl Requests {
    /// Takes a token for `msg`: `None` when it may be served now, or how long until it may
    /// (ask again then).
    pub fn wait(&self, msg: &ClientMsg) -> Option<Duration> {
        let bucket = match msg {
            ClientMsg::Register { .. }
            | ClientMsg::Renew {}
            | ClientMsg::HaPair { .. }
            | ClientMsg::Report { .. } => &self.register,
            ClientMsg::Resolve { .. } => &self.resolve,
            ClientMsg::Relay { .. } | ClientMsg::Admit { .. } => &self.pair,
            ClientMsg::Flows { .. } => &self.flows,
            ClientMsg::Ping {} => return None,
        };
        match bucket.check() {
            Ok(()) => None,
            Err(not_until) => Some(
                not_until
                    .wait_time_from(bucket.clock().now())
                    .max(Duration::from_millis(1)),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn unproven_places_are_capped_per_source_and_in_all_and_come_back() {
        let gate = Unproven::new(5, 2);
        let a: IpAddr = "198.51.100.1".parse().unwrap();
        let t1 = gate.enter(a).unwrap();
        let _t2 = gate.enter(a).unwrap();
        assert!(gate.enter(a).is_none(), "third from one source");
        // One IPv6 /64 is one source, whatever the interface identifier; a dual-stack
        // listener's mapped IPv4 is the IPv4 address.
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        let _t3 = gate.enter(v6("fd00:1::1")).unwrap();
        let _t4 = gate.enter(v6("fd00:1::2")).unwrap();
        assert!(gate.enter(v6("fd00:1::ffff:3")).is_none());
        assert!(gate.enter(v6("::ffff:198.51.100.1")).is_none());
        let t5 = gate.enter(v6("fd00:2::1")).unwrap();
        assert_eq!(gate.held(), 5);
        drop(t5);
        assert_eq!(gate.held(), 4);
        let _t5 = gate.enter(v6("fd00:2::1")).unwrap();
        // Full: a source holding one place, one less than the most, gets nothing.
        assert!(gate.enter(v6("fd00:2::2")).is_none(), "full");
        assert_eq!(gate.evicted(), 0);
        // A source holding none takes the oldest place of one that holds two.
        let fresh = gate.enter("198.51.100.9".parse().unwrap());
        assert!(fresh.is_some(), "a fair share");
        assert_eq!((gate.held(), gate.evicted()), (5, 1));
        assert!(
            t1.eviction.evicted.load(Ordering::Acquire),
            "the oldest of a's was taken"
        );
        drop(t1);
        assert_eq!(gate.held(), 5, "a taken place is not freed twice");
        assert!(
            gate.enter(a).is_none(),
            "now a holds one, the most hold two"
        );
    }

    /// Issue 49, finding 4: 64 sources that keep every place between them cannot keep out a
    /// client that holds none: it takes a place of the source holding the most, at once,
    /// and that connection is told to close; then the flood takes places only from itself.
    #[test]
    fn a_flood_from_many_sources_leaves_a_place_for_a_client_that_holds_none() {
        let gate = Unproven::new(MAX_UNPROVEN, MAX_UNPROVEN_PER_SOURCE);
        let attacker = |i: u32| IpAddr::from([203, 0, 113, u8::try_from(i % 64).unwrap()]);
        let mut held: Vec<Ticket> = (0..512).filter_map(|i| gate.enter(attacker(i))).collect();
        assert_eq!(gate.held(), MAX_UNPROVEN);
        assert_eq!(held.len(), MAX_UNPROVEN, "4 places each, the rest refused");
        let client = gate.enter("198.51.100.7".parse().unwrap());
        assert!(client.is_some(), "the client got no place");
        let evicted = held
            .iter()
            .filter(|t| t.eviction.evicted.load(Ordering::Acquire))
            .count();
        assert_eq!(evicted, 1);
        // The flood goes on: new connections of its sources find no source holding two
        // more than they do, and the client's place stays.
        for i in 0..1000 {
            if let Some(t) = gate.enter(attacker(i)) {
                held.push(t);
            }
        }
        let client = client.unwrap();
        assert!(!client.eviction.evicted.load(Ordering::Acquire));
        assert!(gate.held() <= MAX_UNPROVEN);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_evicted_ticket_hears_it() {
        let gate = Unproven::new(2, 2);
        let a = gate.enter("198.51.100.1".parse().unwrap()).unwrap();
        let _b = gate.enter("198.51.100.1".parse().unwrap()).unwrap();
        let waiting = async {
            tokio::time::timeout(Duration::from_secs(2), a.evicted())
                .await
                .is_ok()
        };
        let (heard, c) = tokio::join!(waiting, async {
            tokio::task::yield_now().await;
            gate.enter("198.51.100.2".parse().unwrap())
        });
        assert!(c.is_some());
        assert!(heard, "the evicted ticket was not told");
    }

    #[test]
    fn timestamps_must_grow_per_identity_while_remembered() {
        let f = Freshness::new();
        let (k1, k2) = (PublicKey([1; 32]), PublicKey([2; 32]));
        let now = Instant::now();
        assert!(!f.is_replay(&k1, 5, now), "nothing seen yet");
        let live = f.admit(k1, 5, now);
        assert!(f.is_replay(&k1, 5, now), "the same Hello again");
        assert!(f.is_replay(&k1, 4, now), "an older one");
        assert!(!f.is_replay(&k1, 6, now));
        assert!(
            !f.is_replay(&k2, 5, now),
            "another identity's clock is its own"
        );
        // Remembered while the session lives, however long.
        let later = now + FRESHNESS_MEMORY * 3;
        assert!(f.is_replay(&k1, 5, later));
        drop(live);
        // ... and for FRESHNESS_MEMORY after it ends.
        let ended = Instant::now();
        assert!(f.is_replay(&k1, 5, ended + FRESHNESS_MEMORY / 2));
        assert!(!f.is_replay(&k1, 5, ended + FRESHNESS_MEMORY));
        // An older timestamp admitted later does not lower the bar.
        let _l = f.admit(k1, 3, ended);
        assert!(f.is_replay(&k1, 5, ended));
    }

    #[test]
    fn request_classes_have_their_own_buckets_and_pings_are_free() {
        let r = Requests::default();
        let register = ClientMsg::Register {
            endpoints: vec![],
            names: vec![],
            mapping: None,
            tunnel: None,
        };
        let resolve = ClientMsg::Resolve {
            id: 1,
            name: "x".into(),
        };
        for _ in 0..10 {
            assert_eq!(r.wait(&register), None);
        }
        let wait = r.wait(&register).expect("the burst is spent");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        // The other classes are untouched.
        assert_eq!(r.wait(&resolve), None);
        assert_eq!(r.wait(&ClientMsg::Admit { peer: "p".into() }), None);
        for _ in 0..1000 {
            assert_eq!(r.wait(&ClientMsg::Ping {}), None);
        }
    }
}

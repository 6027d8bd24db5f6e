//! An impaired underlay: a UDP relay on the router that drops, delays and reorders datagrams.
//!
//! design.md §7 names `tc netem` for this, but the kernels of these machines are built without
//! `sch_netem` (and without loadable modules), so the impairment lives here, in userspace,
//! inside the router's namespace. Each adapter is pointed at the relay's address on its side
//! and sees its peer there, as behind a NAT; the relay forwards to the other adapter.
//!
//! ```text
//! adapterA --> 198.51.100.1:51821 [relay: loss, delay, reorder] 203.0.113.1:51821 --> adapterB
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cyphonic_netio::netns;

/// What the relay does to each datagram, independently per direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Impairment {
    /// Probability of dropping a datagram.
    pub loss: f64,
    /// Delay of every datagram.
    pub delay: Duration,
    /// Probability of holding a datagram back by `reorder_extra`, so later ones overtake it.
    pub reorder: f64,
    /// How long a reordered datagram is held back in addition to `delay`.
    pub reorder_extra: Duration,
}

/// Counts of what the relay did.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Datagrams forwarded.
    pub forwarded: AtomicU64,
    /// Datagrams dropped on purpose.
    pub dropped: AtomicU64,
    /// Datagrams held back to reorder them.
    pub reordered: AtomicU64,
}

/// The relay; stops and joins its threads when dropped.
#[derive(Debug)]
pub struct Relay {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// What it did.
    pub stats: Arc<RelayStats>,
}

impl Relay {
    /// Starts the relay inside namespace `ns`: datagrams to `side_a` go to `to_b` (sent from
    /// `side_b`), datagrams to `side_b` go to `to_a` (sent from `side_a`).
    ///
    /// # Errors
    /// The namespace cannot be entered or the sockets bound.
    pub fn start(
        ns: &str,
        side_a: SocketAddr,
        to_a: SocketAddr,
        side_b: SocketAddr,
        to_b: SocketAddr,
        imp: Impairment,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(RelayStats::default());
        let name = ns.to_owned();
        // Bind both sockets inside the namespace, on a thread that enters it.
        let (sa, sb) = std::thread::spawn(move || -> anyhow::Result<(UdpSocket, UdpSocket)> {
            netns::enter(&name).with_context(|| format!("entering {name}"))?;
            let sa = UdpSocket::bind(side_a)?;
            let sb = UdpSocket::bind(side_b)?;
            for s in [&sa, &sb] {
                s.set_read_timeout(Some(Duration::from_millis(1)))?;
            }
            Ok((sa, sb))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("relay setup panicked"))??;
        let mut threads = Vec::new();
        for (rx, tx, to, seed) in [
            (sa.try_clone()?, sb.try_clone()?, to_b, seed),
            (sb, sa, to_a, seed ^ 0x5555),
        ] {
            let (stop, stats) = (stop.clone(), stats.clone());
            threads.push(std::thread::spawn(move || {
                forward(&rx, &tx, to, imp, seed, &stop, &stats);
            }));
        }
        Ok(Self {
            stop,
            threads,
            stats,
        })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn forward(
    rx: &UdpSocket,
    tx: &UdpSocket,
    to: SocketAddr,
    imp: Impairment,
    seed: u64,
    stop: &AtomicBool,
    stats: &RelayStats,
) {
    let mut rng = seed | 1;
    let mut random = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut held: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut bodies = std::collections::HashMap::new();
    let mut seq = 0u64;
    let mut buf = [0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        if let Ok(n) = rx.recv(&mut buf) {
            if random() < imp.loss {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                let mut due = Instant::now() + imp.delay;
                if random() < imp.reorder {
                    due += imp.reorder_extra;
                    stats.reordered.fetch_add(1, Ordering::Relaxed);
                }
                seq += 1;
                held.push(Reverse((due, seq)));
                bodies.insert(seq, buf[..n].to_vec());
            }
        }
        let now = Instant::now();
        while held.peek().is_some_and(|Reverse((t, _))| *t <= now) {
            let Some(Reverse((_, id))) = held.pop() else {
                break;
            };
            if let Some(body) = bodies.remove(&id) {
                let _ = tx.send_to(&body, to);
                stats.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

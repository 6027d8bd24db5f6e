//! An impaired underlay link: what `tc netem` does, done in userspace on a wire of its own.
//!
//! The design named `tc netem` for this, but the kernels of these machines are built without
//! `sch_netem` (and without loadable modules). So the link between two namespaces gets a
//! namespace of its own in the middle, which carries Ethernet frames across in userspace (one
//! `AF_PACKET` socket on each side, a thread per direction) and drops, delays, jitters and
//! reorders them on the way, independently per direction, with netem's meanings:
//!
//! ```text
//! adapter B's wan <-veth-> [a  link namespace: loss, delay ± jitter, reorder  b] <-veth-> router
//! ```
//!
//! The link is transparent: nothing on either side is configured differently, tunnel frames
//! and plainly routed ones (the benchmarks' baseline) cross the same impairment. The ends that
//! send into it have segmentation and checksum offloads off, as a real wire would see the
//! frames: every frame that crosses is whole, at most the MTU, with its checksums done.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cyphonic_netio::{FrameMeta, Interface, PacketOptions, PacketSocket};

use crate::{Netns, inject, veth};

/// What the link does to each frame, independently per direction, as netem's
/// `delay <delay> <jitter> loss <loss> reorder <reorder>` would.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Impairment {
    /// Probability of dropping a frame.
    pub loss: f64,
    /// Delay of every frame (not chosen for reordering).
    pub delay: Duration,
    /// Each frame's delay is drawn uniformly from `delay ± jitter` (at least zero). As in
    /// netem, frames leave in the order of their due times, so jitter reorders by itself.
    pub jitter: Duration,
    /// Probability that a frame is sent at once, without its delay, overtaking the frames
    /// still held (netem's `reorder`).
    pub reorder: f64,
}

impl Impairment {
    /// No impairment at all: the link still crosses userspace (the clean row of a table).
    pub const NONE: Self = Self {
        loss: 0.0,
        delay: Duration::ZERO,
        jitter: Duration::ZERO,
        reorder: 0.0,
    };

    /// The same impairment as netem's arguments, e.g. `delay 2ms 2ms loss 0.25% reorder 0.5%`.
    pub fn netem(&self) -> String {
        let mut parts = Vec::new();
        if !self.delay.is_zero() || !self.jitter.is_zero() {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            parts.push(format!("delay {}ms", ms(self.delay)));
            if !self.jitter.is_zero() {
                parts.push(format!("{}ms", ms(self.jitter)));
            }
        }
        if self.loss > 0.0 {
            parts.push(format!("loss {}%", self.loss * 100.0));
        }
        if self.reorder > 0.0 {
            parts.push(format!("reorder {}%", self.reorder * 100.0));
        }
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(" ")
        }
    }
}

/// Counts of what the link did, both directions together.
#[derive(Debug, Default)]
pub struct LinkStats {
    /// Frames carried across.
    pub forwarded: AtomicU64,
    /// Frames dropped on purpose (`loss`).
    pub dropped: AtomicU64,
    /// Frames sent at once, ahead of those held (`reorder`).
    pub reordered: AtomicU64,
    /// Frames dropped because the link already held [`LIMIT`] in that direction (netem's
    /// `limit`); more than none means the measurement hit the link, not the tunnel.
    pub overflow: AtomicU64,
    /// Frames that could not be carried whole (too long for the buffer, a checksum left to
    /// offload, refused by the kernel): more than none is a fault of the bed.
    pub faults: AtomicU64,
}

/// Frames held per direction at most, as netem's `limit` (its default is 1000; a few
/// milliseconds of a gigabit need more).
pub const LIMIT: usize = 20_000;

/// The link; stops its threads when dropped, then deletes its namespace.
#[derive(Debug)]
pub struct ImpairedLink {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// What it did.
    pub stats: Arc<LinkStats>,
    /// The namespace in the middle, held until the link goes (dropped after the threads
    /// are joined).
    _ns: Netns,
}

impl ImpairedLink {
    /// Wires `near_if` in `near` to `far_if` in `far` (both made here, both up) through a
    /// namespace in the middle that impairs both directions with `imp`; `seed` makes the
    /// random choices repeatable.
    ///
    /// # Errors
    /// A namespace, veth, `ethtool` or socket step failing.
    pub fn wire(
        near: &Netns,
        near_if: &str,
        far: &Netns,
        far_if: &str,
        imp: Impairment,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let (ns, a, b) = middle(near, near_if, far, far_if, "link", 8 << 20)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(LinkStats::default());
        let mut threads = Vec::new();
        for (rx, tx, seed) in [
            (a.try_clone()?, b.try_clone()?, seed),
            (b, a, seed ^ 0x5555_5555),
        ] {
            let (stop, stats) = (stop.clone(), stats.clone());
            threads.push(std::thread::spawn(move || {
                carry(rx, &tx, imp, seed, &stop, &stats);
            }));
        }
        Ok(Self {
            stop,
            threads,
            stats,
            _ns: ns,
        })
    }
}

/// A namespace (named after `label`) in the middle of `near_if` in `near` and `far_if` in
/// `far` (both made here, both up), and a packet socket on each of its two ends (`a` towards
/// `near`, `b` towards `far`; `recv_buffer` bytes each): whole frames with whole checksums
/// both ways, taken as they come (no GRO), for a relay to carry.
///
/// # Errors
/// A namespace, veth, `ethtool` or socket step failing.
pub(crate) fn middle(
    near: &Netns,
    near_if: &str,
    far: &Netns,
    far_if: &str,
    label: &str,
    recv_buffer: usize,
) -> anyhow::Result<(Netns, PacketSocket, PacketSocket)> {
    let ns = Netns::new(label)?;
    veth(near, near_if, &ns, "a")?;
    veth(&ns, "b", far, far_if)?;
    // The ends that send into the middle checksum every frame themselves; the middle's own
    // ends take frames as they come (no GRO).
    for (end, name) in [(near, near_if), (far, far_if)] {
        end.exec(
            "ethtool",
            &["-K", name, "tx", "off", "tso", "off", "gso", "off"],
        )?;
    }
    for end in ["a", "b"] {
        ns.exec("ethtool", &["-K", end, "gro", "off"])?;
    }
    let (a, b) = inject::inside(&ns, move || {
        let open = |name: &str| -> anyhow::Result<PacketSocket> {
            let iface = Interface::lookup_up(name)?;
            let opts = PacketOptions {
                // Only read when ppoll said a frame is there: the timeout never runs.
                recv_timeout: Some(Duration::from_millis(10)),
                recv_buffer,
                ..PacketOptions::default()
            };
            PacketSocket::open(&iface, &opts).with_context(|| format!("opening {name}"))
        };
        Ok((open("a")?, open("b")?))
    })?;
    Ok((ns, a, b))
}

impl Drop for ImpairedLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Uniform random numbers in [0, 1) from a xorshift generator: repeatable from its seed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> f64 {
        let x = &mut self.0;
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        (*x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One direction: frames from `rx` wait in a queue ordered by due time (netem's tfifo), and
/// leave by `tx` when due.
fn carry(
    mut rx: PacketSocket,
    tx: &PacketSocket,
    imp: Impairment,
    seed: u64,
    stop: &AtomicBool,
    stats: &LinkStats,
) {
    const BATCH: usize = 32;
    const IDLE: Duration = Duration::from_millis(10);
    let mut random = Random(seed | 1);
    let mut held: BinaryHeap<Reverse<(Instant, u64, Vec<u8>)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut leaving = Vec::new();
    let mut store = vec![[0u8; 2048]; BATCH];
    let mut meta = [FrameMeta::default(); BATCH];
    let count = |c: &AtomicU64| {
        c.fetch_add(1, Ordering::Relaxed);
    };
    while !stop.load(Ordering::Relaxed) {
        // Wake for the next frame or the next due time, whichever comes first (at most 10
        // ms, to see `stop`): a receive timeout would be rounded to the kernel's tick.
        let next = held.peek().map_or(IDLE, |Reverse((due, _, _))| {
            due.saturating_duration_since(Instant::now()).min(IDLE)
        });
        let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|b| &mut b[..]).collect();
        let n = match rx.wait_readable(next) {
            Ok(true) => rx.recv_batch(&mut bufs, &mut meta).unwrap_or(0),
            _ => 0,
        };
        let now = Instant::now();
        for (buf, m) in bufs.iter().zip(&meta).take(n) {
            if m.outgoing {
                continue;
            }
            if m.truncated || m.checksum_partial {
                count(&stats.faults);
            } else if random.next() < imp.loss {
                count(&stats.dropped);
            } else if held.len() >= LIMIT {
                count(&stats.overflow);
            } else {
                let due = if random.next() < imp.reorder {
                    count(&stats.reordered);
                    now
                } else {
                    let spread = imp.jitter.as_secs_f64() * (2.0 * random.next() - 1.0);
                    now + Duration::from_secs_f64((imp.delay.as_secs_f64() + spread).max(0.0))
                };
                seq += 1;
                held.push(Reverse((due, seq, buf[..m.len].to_vec())));
            }
        }
        let now = Instant::now();
        while held.peek().is_some_and(|Reverse((due, _, _))| *due <= now) {
            let Some(Reverse((_, _, frame))) = held.pop() else {
                break;
            };
            leaving.push(frame);
        }
        if !leaving.is_empty() {
            let frames: Vec<&[u8]> = leaving.iter().map(Vec::as_slice).collect();
            let (sent, failed, _) = tx.send_batch(&frames);
            stats.forwarded.fetch_add(sent as u64, Ordering::Relaxed);
            stats.faults.fetch_add(failed as u64, Ordering::Relaxed);
            leaving.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bed::mac_of;
    use crate::measure::{PingStats, parse_ping};

    #[test]
    fn netem_arguments_name_each_impairment() {
        let imp = Impairment {
            loss: 0.0025,
            delay: Duration::from_millis(2),
            jitter: Duration::from_millis(2),
            reorder: 0.005,
        };
        assert_eq!(imp.netem(), "delay 2ms 2ms loss 0.25% reorder 0.5%");
        assert_eq!(Impairment::NONE.netem(), "none");
        let delay_only = Impairment {
            delay: Duration::from_millis(300),
            ..Impairment::NONE
        };
        assert_eq!(delay_only.netem(), "delay 300ms");
    }

    /// Two hosts on an impaired link (192.0.2.1 and .2), and ping's figures between them:
    /// `count` requests `interval` apart; with the link, for its counts.
    fn ping_across(imp: Impairment, count: usize, interval: &str) -> (PingStats, ImpairedLink) {
        crate::require_root();
        let (near, far) = (Netns::new("ln").unwrap(), Netns::new("lf").unwrap());
        let link = ImpairedLink::wire(&near, "x", &far, "y", imp, 7).unwrap();
        near.ip(&["addr", "add", "192.0.2.1/24", "dev", "x"])
            .unwrap();
        far.ip(&["addr", "add", "192.0.2.2/24", "dev", "y"])
            .unwrap();
        // Each knows the other's MAC: ARP across a lossy link would cost the first second.
        for (ns, dev, ip, other, other_dev) in [
            (&near, "x", "192.0.2.2", &far, "y"),
            (&far, "y", "192.0.2.1", &near, "x"),
        ] {
            let mac = mac_of(other, other_dev).unwrap();
            ns.ip(&[
                "neigh",
                "replace",
                ip,
                "lladdr",
                &mac,
                "dev",
                dev,
                "nud",
                "permanent",
            ])
            .unwrap();
        }
        let out = near
            .exec_output(
                "ping",
                &[
                    "-c",
                    &count.to_string(),
                    "-i",
                    interval,
                    "-W",
                    "1",
                    "192.0.2.2",
                ],
            )
            .unwrap();
        (
            parse_ping(&String::from_utf8_lossy(&out.stdout), count),
            link,
        )
    }

    #[test]
    fn the_link_delays_each_way_within_its_jitter() {
        let imp = Impairment {
            delay: Duration::from_millis(10),
            jitter: Duration::from_millis(5),
            ..Impairment::NONE
        };
        let (ping, link) = ping_across(imp, 40, "0.02");
        // Each way 5 to 15 ms: a round trip 10 to 30 ms, 20 on average (and a few ms of
        // slack for a busy machine).
        assert_eq!(ping.received, 40, "{ping:?}");
        assert!(
            (15.0..25.0).contains(&ping.avg_ms) && ping.p99_ms < 36.0,
            "{ping:?}"
        );
        let s = &link.stats;
        assert_eq!(
            (
                s.dropped.load(Ordering::Relaxed),
                s.faults.load(Ordering::Relaxed)
            ),
            (0, 0)
        );
    }

    #[test]
    fn the_link_drops_its_share_and_sends_its_share_at_once() {
        let imp = Impairment {
            loss: 0.3,
            delay: Duration::from_millis(20),
            reorder: 0.5,
            ..Impairment::NONE
        };
        let (ping, link) = ping_across(imp, 300, "0.005");
        // A round trip survives both ways: 0.7 x 0.7 = 49%, a few points either side.
        let share = ping.received as f64 / 300.0;
        assert!((0.37..0.61).contains(&share), "{ping:?}");
        // Half of what survives goes at once: round trips of 0, 20 or 40 ms.
        assert!(ping.p50_ms < 30.0 && ping.p99_ms > 35.0, "{ping:?}");
        let s = &link.stats;
        let (dropped, reordered, forwarded) = (
            s.dropped.load(Ordering::Relaxed),
            s.reordered.load(Ordering::Relaxed),
            s.forwarded.load(Ordering::Relaxed),
        );
        assert!(
            dropped > 100 && reordered > 100 && forwarded > 2 * reordered - 100,
            "{dropped} dropped, {reordered} reordered, {forwarded} forwarded"
        );
    }

    #[test]
    fn random_numbers_are_uniform_in_the_unit_interval() {
        let mut r = Random(0x00c0_ffee | 1);
        let draws: Vec<f64> = (0..100_000).map(|_| r.next()).collect();
        assert!(draws.iter().all(|x| (0.0..1.0).contains(x)));
        let below = draws.iter().filter(|x| **x < 0.0025).count();
        // 250 expected; a generator stuck high or low would be far off.
        assert!(
            (150..350).contains(&below),
            "{below} of 100,000 below 0.0025"
        );
    }
}

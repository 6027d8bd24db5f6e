//! Measurements on the bed with real tools: ping RTT statistics, iperf3 TCP and UDP.

use std::time::{Duration, Instant};

use anyhow::Context as _;
pub use cyphonic_report::{PingStats, Tcp, Udp, parse_ping, stats};

use crate::bed::{IperfRun, Priority, Side, TwoSites, iperf3};

/// lanA's host pings lanB's three times, 100 ms apart, for what a first packet sets up (ARP,
/// the tunnel's handshake) before anything is measured.
///
/// # Errors
/// ping cannot run.
pub fn warm_up(bed: &TwoSites) -> anyhow::Result<()> {
    ping(bed, Side::A, bed.b.host_ip, 3, Duration::from_millis(100)).map(drop)
}

/// lanA's host pings lanB's `count` times 10 ms apart: the latency commands' idle phase.
///
/// # Errors
/// ping cannot run.
pub fn idle_pings(bed: &TwoSites, count: usize) -> anyhow::Result<PingStats> {
    ping(
        bed,
        Side::A,
        bed.b.host_ip,
        count,
        Duration::from_millis(10),
    )
}

/// Pings `to` from `from`'s LAN host `count` times, `interval` apart.
///
/// # Errors
/// ping cannot run.
pub fn ping(
    bed: &TwoSites,
    from: Side,
    to: std::net::Ipv4Addr,
    count: usize,
    interval: Duration,
) -> anyhow::Result<PingStats> {
    let c = count.to_string();
    let i = format!("{:.3}", interval.as_secs_f64());
    let out = bed.ping(from, to, &["-c", &c, "-i", &i, "-W", "2"])?;
    Ok(parse_ping(&String::from_utf8_lossy(&out.stdout), count))
}

/// The median (by goodput) of `runs` TCP measurements, to tame a shared machine's noise.
///
/// # Errors
/// iperf3 fails.
pub fn tcp_median(
    bed: &TwoSites,
    streams: usize,
    seconds: u64,
    runs: usize,
) -> anyhow::Result<Tcp> {
    let mut all = (0..runs.max(1))
        .map(|_| tcp(bed, streams, seconds))
        .collect::<anyhow::Result<Vec<_>>>()?;
    all.sort_by(|a, b| a.gbps.total_cmp(&b.gbps));
    Ok(all[all.len() / 2])
}

/// iperf3 TCP from A's host to B's host with `streams` parallel streams for `seconds`.
///
/// # Errors
/// iperf3 fails.
pub fn tcp(bed: &TwoSites, streams: usize, seconds: u64) -> anyhow::Result<Tcp> {
    tcp_from(bed, streams, seconds, None)
}

/// [`tcp`] from A's host's address `from` (`-B`), when given.
///
/// # Errors
/// iperf3 fails.
pub fn tcp_from(
    bed: &TwoSites,
    streams: usize,
    seconds: u64,
    from: Option<std::net::Ipv4Addr>,
) -> anyhow::Result<Tcp> {
    let p = streams.to_string();
    let bind = from.map(|a| a.to_string());
    let mut args = vec!["-P", p.as_str()];
    if let Some(b) = &bind {
        args.extend(["-B", b.as_str()]);
    }
    tcp_report(&iperf3(bed, Side::B, &args, seconds)?)
}

/// iperf3 TCP from A's host to B's host at its IPv6 address `to`, with `streams` parallel
/// streams for `seconds`.
///
/// # Errors
/// iperf3 fails.
pub fn tcp6(
    bed: &TwoSites,
    streams: usize,
    seconds: u64,
    to: std::net::Ipv6Addr,
) -> anyhow::Result<Tcp> {
    let p = streams.to_string();
    let target = to.to_string();
    let run = IperfRun::start_to(
        bed,
        (Side::B, &target),
        &["-6", "-P", p.as_str()],
        seconds,
        Priority::Default,
    )?;
    tcp_report(
        &run.finish()
            .map_err(|e| anyhow::anyhow!("{e}\n{}", bed.logs()))?,
    )
}

/// The rate and retransmits of an iperf3 TCP client's JSON report.
fn tcp_report(r: &serde_json::Value) -> anyhow::Result<Tcp> {
    Ok(Tcp {
        gbps: r["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .context("no bits_per_second")?
            / 1e9,
        retransmits: r["end"]["sum_sent"]["retransmits"]
            .as_u64()
            .context("no retransmits")?,
    })
}

/// iperf3 UDP from A to B at `mbps` with `size`-byte datagrams (`0` = as fast as possible).
///
/// # Errors
/// iperf3 fails.
pub fn udp(bed: &TwoSites, mbps: u64, size: usize, seconds: u64) -> anyhow::Result<Udp> {
    udp_at(bed, mbps, size, seconds, Priority::Default)
}

/// [`udp`] with both iperf3 ends at `priority`.
///
/// # Errors
/// iperf3 fails.
pub fn udp_at(
    bed: &TwoSites,
    mbps: u64,
    size: usize,
    seconds: u64,
    priority: Priority,
) -> anyhow::Result<Udp> {
    let rate = if mbps == 0 {
        "0".to_owned()
    } else {
        format!("{mbps}M")
    };
    let len = size.to_string();
    // 2 MiB socket buffers: with the default ~208 KB the iperf3 receiver itself drops bursts,
    // which would measure iperf3, not the path.
    let r = IperfRun::start_at(
        bed,
        Side::B,
        &["-u", "-b", &rate, "-l", &len, "-w", "2M"],
        seconds,
        priority,
    )?
    .finish()
    .map_err(|e| anyhow::anyhow!("{e}\n{}", bed.logs()))?;
    let sent = &r["end"]["sum"];
    let streams = r["end"]["streams"].as_array().context("no streams")?;
    // Per stream only (iperf3's sum has no such field); a stream without it is an error, not
    // a zero.
    let out_of_order = streams
        .iter()
        .map(|s| {
            s["udp"]["out_of_order"]
                .as_u64()
                .context("an iperf3 stream without out_of_order")
        })
        .sum::<anyhow::Result<u64>>()?;
    // Each figure from the report, or an error: a missing one read as 0 (or as 100% lost)
    // would be a measurement nobody made.
    let received = r["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("no sum_received.bits_per_second")?;
    let offered = sent["bits_per_second"]
        .as_f64()
        .context("no sum.bits_per_second")?;
    let loss_pct = streams
        .first()
        .and_then(|s| s["udp"]["lost_percent"].as_f64())
        .context("no lost_percent")?;
    Ok(Udp {
        offered_mbps: offered / 1e6,
        received_mbps: received / 1e6,
        loss_pct,
        out_of_order,
    })
}

/// Among `rates` (Mbit/s, ascending), the run that received the most while losing under 1%,
/// and the results of every rate tried. The search stops at the second rate over 1%, then
/// halves the gap between the highest rate under 1% and the first over it, [`REFINE`] times,
/// so that the answer is not quantised by the ladder's steps (1000 -> 1250 is 25%).
///
/// # Errors
/// iperf3 fails.
pub fn udp_search(
    bed: &TwoSites,
    rates: &[u64],
    size: usize,
    seconds: u64,
) -> anyhow::Result<(Option<Udp>, Vec<Udp>)> {
    let mut best = None;
    let mut tried = Vec::new();
    let mut over = 0;
    // The highest rate (as asked for) under 1% loss and the first over it.
    let (mut below, mut above) = (None, None);
    let mut run = |r: u64, best: &mut Option<Udp>| -> anyhow::Result<bool> {
        let u = udp(bed, r, size, seconds)?;
        tried.push(u);
        let lossless = u.loss_pct < 1.0;
        if lossless && best.is_none_or(|b: Udp| u.received_mbps > b.received_mbps) {
            *best = Some(u);
        }
        Ok(lossless)
    };
    for &r in rates {
        if run(r, &mut best)? {
            below = Some(r);
        } else {
            above = above.or(Some(r));
            over += 1;
            if over == 2 {
                break;
            }
        }
    }
    if let (Some(lo), Some(hi)) = (below, above) {
        bisect(lo, hi, REFINE, |r| run(r, &mut best))?;
    }
    Ok((best, tried))
}

/// Halves the gap between `lo` (passes) and `hi` (fails) up to `steps` times, asking `passes`
/// at each midpoint; nothing when `lo` is not below `hi` (a noisy ladder) or the gap is gone.
fn bisect(
    mut lo: u64,
    mut hi: u64,
    steps: usize,
    mut passes: impl FnMut(u64) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    for _ in 0..steps {
        let mid = u64::midpoint(lo, hi);
        if lo >= hi || mid == lo {
            break;
        }
        if passes(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(())
}

/// How many times [`udp_search`] halves the gap around the loss threshold (3: to within 1/8
/// of a ladder step).
pub const REFINE: usize = 3;

/// What a round trip costs on this machine before any tunnel: answered by the kernel, and
/// answered by a thread that waits in `recv` as the adapter's capture and receive threads do.
#[derive(Debug, Clone, Copy)]
pub struct WakeFloor {
    /// ping over one veth: the kernel answers; one thread (ping) wakes per round trip.
    pub kernel: PingStats,
    /// UDP over the same veth, echoed by a blocked thread: two wake per round trip.
    pub userspace: PingStats,
}

impl WakeFloor {
    /// What one wake-up of a blocked thread adds to a round trip, milliseconds (averages).
    pub fn per_wake_ms(&self) -> f64 {
        self.userspace.avg_ms - self.kernel.avg_ms
    }
}

/// Measures [`WakeFloor`] in two namespaces of its own joined by a veth (198.51.100.1 and .2):
/// `count` pings 10 ms apart, then `count` UDP echoes 10 ms apart (the bed's idle RTT pace).
///
/// # Errors
/// Namespaces, sockets or ping failing.
pub fn wake_floor(count: usize) -> anyhow::Result<WakeFloor> {
    use std::net::UdpSocket;
    use std::time::Instant;

    let near = crate::Netns::new("wfa")?;
    let far = crate::Netns::new("wfb")?;
    crate::veth(&near, "wf0", &far, "wf1")?;
    near.ip(&["addr", "add", "198.51.100.1/24", "dev", "wf0"])?;
    far.ip(&["addr", "add", "198.51.100.2/24", "dev", "wf1"])?;
    let n = count.to_string();
    let out = near.exec_output("ping", &["-c", &n, "-i", "0.01", "-W", "1", "198.51.100.2"])?;
    let kernel = parse_ping(&String::from_utf8_lossy(&out.stdout), count);

    // Bound inside `far` (a socket keeps its namespace), served by a plain thread: bound
    // before the client starts, so its first echo is not lost.
    let sock = crate::inject::inside(&far, || Ok(UdpSocket::bind("198.51.100.2:7000")?))?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    let echo = std::thread::spawn(move || -> anyhow::Result<()> {
        let mut buf = [0u8; 64];
        // Until the client says stop, or 2 s of silence.
        while let Ok((len, from)) = sock.recv_from(&mut buf) {
            sock.send_to(&buf[..len], from)?;
            if &buf[..len] == b"stop" {
                break;
            }
        }
        Ok(())
    });
    let times = crate::inject::inside(&near, move || {
        let sock = UdpSocket::bind("198.51.100.1:0")?;
        sock.connect("198.51.100.2:7000")?;
        sock.set_read_timeout(Some(Duration::from_secs(1)))?;
        let mut buf = [0u8; 64];
        let mut times = Vec::with_capacity(count);
        for _ in 0..count {
            let start = Instant::now();
            sock.send(b"echo")?;
            if sock.recv(&mut buf).is_ok() {
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        sock.send(b"stop")?;
        Ok(times)
    })?;
    echo.join()
        .map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    Ok(WakeFloor {
        kernel,
        userspace: stats(times, count),
    })
}

/// Pings from A to B every 10 ms while one TCP stream runs from A to B.
///
/// # Errors
/// ping or iperf3 fails.
pub fn ping_under_load(bed: &TwoSites, seconds: u64) -> anyhow::Result<PingStats> {
    Ok(ping_under_load_at(bed, seconds, Priority::Default)?.0)
}

/// [`ping_under_load`] with the TCP stream's two ends at `priority`; also what the stream
/// carried meanwhile.
///
/// # Errors
/// ping or iperf3 fails.
pub fn ping_under_load_at(
    bed: &TwoSites,
    seconds: u64,
    priority: Priority,
) -> anyhow::Result<(PingStats, Tcp)> {
    let run = IperfRun::start_at(bed, Side::B, &[], seconds + 2, priority)?;
    std::thread::sleep(Duration::from_secs(1));
    #[expect(clippy::cast_possible_truncation, reason = "a few hundred pings")]
    let count = (seconds * 100) as usize;
    let stats = ping(
        bed,
        Side::A,
        bed.b.host_ip,
        count,
        Duration::from_millis(10),
    )?;
    Ok((stats, tcp_report(&run.finish()?)?))
}

/// Where one pipeline's packets waited, by stage, as the status document reports it:
/// cumulative log2-microsecond histograms and means (`pipelines.<dir>.waits`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Waits {
    /// Stage name, then (packets, total microseconds, histogram).
    stages: std::collections::BTreeMap<String, (u64, f64, Vec<u64>)>,
}

impl Waits {
    /// Reads pipeline `dir` (`egress`, `ingress`) out of a daemon's status document.
    ///
    /// # Errors
    /// The document has no such waits, or a stage lacks one of its figures (read as 0, it
    /// would be a wait nobody measured).
    pub fn read(status: &serde_json::Value, dir: &str) -> anyhow::Result<Self> {
        let mut stages = std::collections::BTreeMap::new();
        let waits = status["pipelines"][dir]["waits"]
            .as_object()
            .with_context(|| format!("no pipelines.{dir}.waits"))?;
        for (name, w) in waits {
            let what = |field: &str| format!("pipelines.{dir}.waits.{name} without {field}");
            let packets = w["packets"].as_u64().with_context(|| what("packets"))?;
            #[expect(clippy::cast_precision_loss, reason = "a mean")]
            let total = w["mean_us"].as_f64().with_context(|| what("mean_us"))? * packets as f64;
            let hist = w["histogram_log2_us"]
                .as_array()
                .with_context(|| what("histogram_log2_us"))?
                .iter()
                .map(|v| v.as_u64().with_context(|| what("a whole-number bucket")))
                .collect::<anyhow::Result<Vec<u64>>>()?;
            stages.insert(name.clone(), (packets, total, hist));
        }
        Ok(Self { stages })
    }

    /// What was counted after `before` was read.
    #[must_use]
    pub fn since(&self, before: &Self) -> Self {
        let stages = self
            .stages
            .iter()
            .map(|(name, (n, total, hist))| {
                let (n0, total0, hist0) = before.stages.get(name).cloned().unwrap_or_default();
                let hist = hist
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v.saturating_sub(hist0.get(i).copied().unwrap_or(0)))
                    .collect();
                (name.clone(), (n.saturating_sub(n0), total - total0, hist))
            })
            .collect();
        Self { stages }
    }

    /// The stages, each with its packets, mean wait and the bound under which `q` of its
    /// waits fall (a power of two, microseconds).
    #[must_use]
    pub fn summary(&self, q: f64) -> Vec<(String, u64, f64, Option<u64>)> {
        self.stages
            .iter()
            .map(|(name, (n, total, hist))| {
                #[expect(clippy::cast_precision_loss, reason = "a mean")]
                let mean = if *n == 0 { 0.0 } else { total / *n as f64 };
                (name.clone(), *n, mean, log2_quantile(hist, q))
            })
            .collect()
    }
}

/// The upper bound (2^i microseconds) of the bucket where quantile `q` of a log2 histogram
/// falls; `None` when it is empty.
#[must_use]
pub fn log2_quantile(hist: &[u64], q: f64) -> Option<u64> {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return None;
    }
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a rank among counted packets"
    )]
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(1u64 << i.min(63));
        }
    }
    None
}

/// UDP from lanA to lanB in trains: `train` datagrams of `size` bytes sent back to back
/// (`sendmmsg`, as fast as lanA's kernel takes them: a line-rate burst), the trains spaced so
/// that the rate holds at `mbps` on average (of payload, as iperf3 counts), for `seconds`.
/// iperf3 cannot send bursts of more than 1,000 datagrams, nor back to back; this can. The
/// receiver counts each datagram's number once, and those that came after a later one.
///
/// # Errors
/// A namespace cannot be entered, or a socket cannot be opened.
pub fn udp_trains(
    bed: &TwoSites,
    mbps: u64,
    size: usize,
    seconds: u64,
    train: usize,
) -> anyhow::Result<Udp> {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use cyphonic_netio::{DatagramMeta, UdpOptions, UdpSocket};

    const PORT: u16 = 5299;
    let (size, train) = (size.max(8), train.max(1));
    let to = SocketAddr::from((bed.b.host_ip, PORT));
    let duration = Duration::from_secs(seconds);
    let sent_all = Arc::new(AtomicBool::new(false));
    // The receiver's buffer is large: what it drops would measure it, not the path.
    let opts = UdpOptions {
        recv_buffer: 64 << 20,
        send_buffer: 4 << 20,
        recv_timeout: Some(Duration::from_millis(50)),
        segmentation: false,
        coalescing: false,
        ..UdpOptions::default()
    };
    let receiver = {
        let (sent_all, opts) = (sent_all.clone(), opts.clone());
        crate::inject::spawn_inside(&bed.b.lan, move || {
            let mut sock = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT)), &opts)?;
            let mut seen = std::collections::HashSet::new();
            let (mut next, mut out_of_order) = (0u64, 0u64);
            let mut store = vec![[0u8; 2048]; 64];
            let mut meta = [DatagramMeta::default(); 64];
            let mut quiet_since: Option<Instant> = None;
            loop {
                let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|b| &mut b[..]).collect();
                let n = sock.recv_batch(&mut bufs, &mut meta)?;
                for (buf, m) in store.iter().zip(&meta).take(n) {
                    let Some(id) = buf.get(..8).filter(|_| m.len >= 8) else {
                        continue;
                    };
                    let id = u64::from_be_bytes(id.try_into().unwrap_or_default());
                    if id < next {
                        out_of_order += 1;
                    }
                    next = next.max(id + 1);
                    seen.insert(id);
                }
                // Done once the sender finished and nothing came for half a second.
                if n == 0 && sent_all.load(Ordering::Relaxed) {
                    let since = *quiet_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_millis(500) {
                        break;
                    }
                } else {
                    quiet_since = None;
                }
            }
            Ok((seen.len() as u64, out_of_order))
        })
    };
    // Let the receiver bind before the first train.
    std::thread::sleep(Duration::from_millis(200));
    let sender = crate::inject::spawn_inside(&bed.a.lan, move || {
        let sock = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), &opts)?;
        let bits = (size * 8 * train) as f64;
        let period = Duration::from_secs_f64(bits / (mbps.max(1) as f64 * 1e6));
        let mut payloads = vec![vec![0u8; size]; train];
        let (start, mut sent, mut refused) = (Instant::now(), 0u64, 0u64);
        let mut due = start;
        while start.elapsed() < duration {
            for p in &mut payloads {
                p[..8].copy_from_slice(&sent.to_be_bytes());
                sent += 1;
            }
            let msgs: Vec<(SocketAddr, &[u8])> =
                payloads.iter().map(|p| (to, p.as_slice())).collect();
            let (_, failed, _) = sock.send_batch(&msgs);
            refused += failed as u64;
            due += period;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        Ok((sent, refused, start.elapsed()))
    });
    let sent = crate::inject::joined(sender);
    sent_all.store(true, Ordering::Relaxed);
    let (received, out_of_order) = crate::inject::joined(receiver)?;
    let (sent, refused, took) = sent?;
    let mbit = |n: u64| (n * size as u64 * 8) as f64 / took.as_secs_f64() / 1e6;
    let offered = sent - refused;
    Ok(Udp {
        offered_mbps: mbit(offered),
        received_mbps: mbit(received),
        loss_pct: if offered == 0 {
            0.0
        } else {
            100.0 * offered.saturating_sub(received) as f64 / offered as f64
        },
        out_of_order,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantile_of_a_log2_histogram_is_its_buckets_upper_bound() {
        assert_eq!(log2_quantile(&[], 0.99), None);
        assert_eq!(log2_quantile(&[0, 0, 0], 0.5), None);
        // 90 waits under 2 us, 9 under 8 us, 1 under 1024 us.
        let mut h = vec![0; 11];
        h[1] = 90;
        h[3] = 9;
        h[10] = 1;
        assert_eq!(log2_quantile(&h, 0.5), Some(2));
        assert_eq!(log2_quantile(&h, 0.9), Some(2));
        assert_eq!(log2_quantile(&h, 0.99), Some(8));
        assert_eq!(log2_quantile(&h, 1.0), Some(1024));
    }

    #[test]
    fn waits_between_two_readings_are_their_difference() {
        let doc = |n: u64, mean: f64, hist: &[u64]| {
            serde_json::json!({"pipelines": {"egress": {"waits": {
                "total": {"packets": n, "mean_us": mean, "histogram_log2_us": hist}
            }}}})
        };
        let before = Waits::read(&doc(10, 2.0, &[0, 10, 0]), "egress").unwrap();
        let after = Waits::read(&doc(20, 11.0, &[0, 10, 10]), "egress").unwrap();
        let s = after.since(&before).summary(0.5);
        assert_eq!(s.len(), 1);
        let (name, n, mean, p50) = &s[0];
        assert_eq!((name.as_str(), *n, *p50), ("total", 10, Some(4)));
        // (20 * 11 - 10 * 2) / 10
        assert!((mean - 20.0).abs() < 1e-9, "{mean}");
        // A pipeline the document does not describe, or a stage without a figure, is an
        // error, never an empty or zero reading.
        assert!(Waits::read(&doc(1, 1.0, &[1]), "ingress").is_err());
        let mut partial = doc(1, 1.0, &[1]);
        partial["pipelines"]["egress"]["waits"]["total"]
            .as_object_mut()
            .unwrap()
            .remove("mean_us");
        assert!(Waits::read(&partial, "egress").is_err());
    }

    #[test]
    fn bisect_closes_in_on_the_threshold_and_stays_inside_the_gap() {
        let mut asked = Vec::new();
        bisect(1250, 1500, 3, |r| {
            asked.push(r);
            Ok(r < 1337)
        })
        .unwrap();
        assert_eq!(asked, [1375, 1312, 1343]);
        // A lossless rate above the first lossy one (noise): nothing to halve.
        let mut asked = Vec::new();
        bisect(1500, 1250, 3, |r| {
            asked.push(r);
            Ok(true)
        })
        .unwrap();
        assert!(asked.is_empty());
        // Adjacent rates: no midpoint left.
        bisect(10, 11, 3, |_| panic!("nothing to ask")).unwrap();
    }
}

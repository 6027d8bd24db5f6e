//! Many peers speaking the real tunnel protocol against one adapter, from one process
//! (issue 24, item 4): `cyphonic-bed swarm`. Each peer is what a node is to the adapter: a
//! member of the overlay with its own certificate from the bed's CA, its own IPv6 address
//! (a /64 of its own, as the adapter's per-source limits count hosts) on one namespace's
//! interface, a control session with the cloud (a real `cyphonic_signal` client) and a
//! tunnel socket driven by the real session state machine (`cyphonic_session::Peer`).
//!
//! ```text
//! [swarm] wan fd00:f::2/64, fd00:e:0:<i>::1/128 ... -- tosw fd00:f::1/64 [wan router]
//!   -- [adapter A] fd00:198:51:100::2 -- [lanA host] 100.64.1.10
//!   -- [cloud] fd00:192:0:2::10
//! peer i: p<i>.ovl.example, 100.80.0.0 + i
//! ```
//!
//! A peer registers, resolves adapter A's name (the cloud then tells the adapter to expect
//! it, and both sides initiate, as a node and an adapter do), and counts as up when its keys
//! are confirmed. With every peer up, pings from the peers (sealed ICMP echoes to the LAN
//! host behind the adapter) measure the RTT through it, and then nothing is sent for a
//! while: the adapter's CPU with every peer kept alive. Every phase is bounded, and the bed
//! is removed on drop.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use cyphonic_control::{NameRecord, Resolution};
use cyphonic_crypto::{Backend, Certificate, CertificateAuthority, PublicKey, RevocationList};
use cyphonic_session::{Clock, Event as PeerEvent, Identity, Indices, Peer, PeerConfig, Timing};
use cyphonic_signal::testing::Pki;
use cyphonic_vip::Lease;
use tokio::net::UdpSocket;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;

use crate::bed::{BedOptions, CloudOptions, Side, SiteOptions, TwoSites};
use crate::hosts::TempDir;
use crate::members::{self, Joining, PATIENCE, percentiles};
use crate::rogue::receive_frame;
use crate::{Netns, fleet, inject, sh, veth};

/// Peers at most: the adapter's peer table holds 16,384, two of them taken by the bed.
pub const MAX_PEERS: usize = 16_000;
/// The name the peers resolve: adapter A's.
const ADAPTER: &str = "gw1.ovl.example";
/// How long one ping may take before it counts as lost.
const PING_PATIENCE: Duration = Duration::from_secs(2);

/// How to run the swarm.
#[derive(Debug, Clone)]
pub struct SwarmOptions {
    /// Registrations, and pairings, in progress at once.
    pub concurrency: usize,
    /// Pings through the adapter with every peer up, one at a time, spread over the peers.
    pub pings: usize,
    /// Seconds with every peer up and nothing sent, for the adapter's idle CPU.
    pub idle_seconds: u64,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct SwarmFigures {
    /// Peers started.
    pub peers: usize,
    /// Peers the cloud registered.
    pub registered: usize,
    /// Peers whose tunnel with the adapter came up.
    pub up: usize,
    /// From the first peer's start to the last tunnel up (each peer connecting to the
    /// cloud, registering, asking for the adapter, handshaking), seconds.
    pub join_secs: f64,
    /// One peer's time from asking for the adapter's name to confirmed keys (the cloud's
    /// answer, its word to the adapter, both initiations): median and 99th percentile, ms.
    pub join_ms: (f64, f64),
    /// Peers that handshook again when all were asked to at once (the storm), and the time
    /// from the ask to the last new keys, seconds.
    pub rekeyed: usize,
    /// See `rekeyed`.
    pub storm_secs: f64,
    /// One peer's time from the ask to its new keys in the storm: median and p99, ms.
    pub storm_ms: (f64, f64),
    /// Pings answered, and lost.
    pub pings: (usize, usize),
    /// Their round trips: mean, median and 99th percentile, ms.
    pub rtt_ms: (f64, f64, f64),
    /// The adapter's resident memory before the peers came and with all of them up, KiB.
    pub adapter_rss_kib: (u64, u64),
    /// The adapter's CPU with every peer up and idle, % of a core.
    pub idle_cpu_percent: f64,
    /// The adapter's handshake counters at the end: initiations received, sessions
    /// established, handshake messages refused, cookie replies sent (it was under load),
    /// handshake messages dropped at a full queue.
    pub handshakes: [u64; 5],
    /// Devices with a lease at adapter A at the end (its status; the reserved LAN host
    /// included).
    pub leases: usize,
    /// Why the adapter refused handshake messages, as its log says (it logs one refusal a
    /// second): each reason once.
    pub refusal_reasons: Vec<String>,
    /// This driver's resident memory with every peer up, KiB.
    pub driver_rss_kib: u64,
}

impl SwarmFigures {
    /// Peers joined (tunnel up) per second.
    pub fn joins_per_second(&self) -> f64 {
        members::rate(self.up, self.join_secs)
    }

    /// Handshakes completed per second in the storm.
    pub fn handshakes_per_second(&self) -> f64 {
        members::rate(self.rekeyed, self.storm_secs)
    }

    /// The adapter's resident memory per peer, bytes.
    pub fn adapter_bytes_per_peer(&self) -> f64 {
        let grown = self
            .adapter_rss_kib
            .1
            .saturating_sub(self.adapter_rss_kib.0);
        members::rate(
            usize::try_from(grown * 1024).unwrap_or(usize::MAX),
            self.peers as f64,
        )
    }
}

/// Peer `i`'s underlay address: `fd00:e:0:<i>::1`, a /64 of its own.
pub fn peer_address(i: usize) -> IpAddr {
    members::numbered_address(0xe, i)
}

/// Peer `i`'s name and vIP: `p<i>.ovl.example` at 100.80.0.0 + `i` (its certificate's
/// block is that /32).
pub fn peer_name(i: usize) -> NameRecord {
    members::numbered_name('p', i)
}

/// The two-site bed with its cloud (adapter A dual-stack) and the swarm's namespace.
#[derive(Debug)]
pub struct SwarmBed {
    /// The bed.
    pub bed: TwoSites,
    /// Where the peers run.
    pub ns: Netns,
    /// The bed's CA, which issues the peers' certificates.
    pki: Pki,
    peers: usize,
    _tmp: TempDir,
}

impl SwarmBed {
    /// Builds and starts it for `peers` peers (their addresses are put on the swarm's
    /// interface), adapter A starting with `leases` devices' leases in its lease file.
    ///
    /// # Errors
    /// A namespace, address, process or certificate failing.
    pub fn new(peers: usize, leases: usize) -> anyhow::Result<Self> {
        if peers > MAX_PEERS {
            bail!("at most {MAX_PEERS} peers");
        }
        let mut bed = TwoSites::new(&BedOptions {
            a: SiteOptions {
                dual_stack: true,
                ..SiteOptions::default()
            },
            cloud: Some(CloudOptions::default()),
            ..BedOptions::default()
        })?;
        write_leases(&bed.a.lease_file(), leases)?;
        bed.start(Side::A)?;
        bed.start(Side::B)?;
        let tmp = TempDir::new("cy-swarm-")?;
        let ns = Netns::new("swarm")?;
        veth(&ns, "wan", &bed.wan, "tosw")?;
        bed.wan
            .ip(&["-6", "addr", "add", "fd00:f::1/64", "dev", "tosw", "nodad"])?;
        bed.wan
            .ip(&["-6", "route", "add", "fd00:e::/32", "via", "fd00:f::2"])?;
        ns.ip(&["-6", "addr", "add", "fd00:f::2/64", "dev", "wan", "nodad"])?;
        ns.ip(&["-6", "route", "add", "default", "via", "fd00:f::1"])?;
        members::add_addresses(&ns, "wan", (0..peers).map(peer_address), tmp.path())?;
        let ca_dir = bed.ca_dir();
        let read = |f: &str| {
            std::fs::read_to_string(ca_dir.join(f)).with_context(|| format!("reading {f}"))
        };
        let ca = CertificateAuthority::from_pem(&read("ca.key")?, &read("ca.crt")?)
            .map_err(|e| anyhow::anyhow!("the bed's CA: {e}"))?;
        Ok(Self {
            bed,
            ns,
            pki: Pki {
                ca,
                revoked: RevocationList::default(),
            },
            peers,
            _tmp: tmp,
        })
    }

    /// Runs the swarm: registrations, pairings with the adapter, pings, idleness.
    ///
    /// # Errors
    /// The bed's cloud or adapter is not running, or the driver's thread failed.
    pub fn run(&self, opts: &SwarmOptions) -> anyhow::Result<SwarmFigures> {
        let cloud = self
            .bed
            .cloud
            .as_ref()
            .context("the swarm needs the cloud")?;
        let key: PublicKey = cloud.public_key.parse().context("the cloud's public key")?;
        let adapter = self
            .bed
            .a
            .adapter
            .as_ref()
            .context("adapter A is not running")?
            .pid();
        // A descriptor a peer (its tunnel socket), and its control session's while it joins.
        raise_nofile(self.peers + 2 * opts.concurrency + 256)?;
        let identities: Vec<Arc<Identity>> = (0..self.peers)
            .map(|i| {
                let r = peer_name(i);
                self.pki
                    .identity(&r.name, &format!("{}/32", members::numbered_vip(i)), &[])
            })
            .collect();
        let drive = Drive {
            clouds: vec![cloud.address6.to_string()],
            key,
            adapter,
            target: self.bed.a.host_ip,
            opts: opts.clone(),
        };
        let before = fleet::rss_kib(adapter);
        let mut figures = inject::joined(inject::spawn_inside(&self.ns, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(drive.run(identities))
        }))?;
        figures.adapter_rss_kib.0 = before;
        let status = self.bed.status(Side::A)?;
        let counter = |name: &str| {
            status
                .pointer(&format!("/counters/{name}"))
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0)
        };
        figures.handshakes = [
            "handshake_inits",
            "sessions_established",
            "handshake_refused",
            "cookie_replies_sent",
            "drop_handshake_queue",
        ]
        .map(counter);
        figures.leases = status["leases"].as_array().map_or(0, Vec::len);
        let log = self.bed.a.log_text();
        let mut reasons: Vec<String> = log
            .lines()
            .filter(|l| l.contains("handshake refused"))
            .filter_map(|l| l.split("reason=").nth(1)?.split_whitespace().next())
            .map(str::to_owned)
            .collect();
        reasons.sort();
        reasons.dedup();
        figures.refusal_reasons = reasons;
        Ok(figures)
    }
}

/// Devices adapter A's LAN may hold leases for here: its /24 less the network, broadcast,
/// gateway (.1) and LAN host (.10) addresses.
pub const MAX_LEASES: usize = 250;

/// Writes a lease file (the one the adapter keeps, and reads when it starts) with `n` active
/// leases, a day long, for devices `dev<i>` at 100.64.1.2 upwards (past the LAN host's .10):
/// what `n` devices that got their addresses by DHCP before a restart leave in it.
fn write_leases(file: &std::path::Path, n: usize) -> anyhow::Result<()> {
    if n > MAX_LEASES {
        bail!("at most {MAX_LEASES} leases");
    }
    let expires = cyphonic_signal::testing::now() + 86_400;
    let leases: Vec<Lease> = (0..n)
        .map(|i| {
            let host = u8::try_from(if i < 8 { i + 2 } else { i + 3 }).unwrap_or(u8::MAX);
            let [hi, lo] = u16::try_from(i).unwrap_or(u16::MAX).to_be_bytes();
            Lease {
                mac: [0x02, 0xde, 0x71, 0xce, hi, lo],
                ip: Ipv4Addr::new(100, 64, 1, host),
                hostname: Some(format!("dev{i}")),
                client_id: None,
                expires,
                active: true,
            }
        })
        .collect();
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let table = cyphonic_vip::file::Table {
        leases,
        ..cyphonic_vip::file::Table::default()
    };
    std::fs::write(file, cyphonic_vip::file::encode(&table, 0)?)?;
    Ok(())
}

/// Raises this process's soft limit on open descriptors to its hard limit, which must be
/// at least `needed`.
fn raise_nofile(needed: usize) -> anyhow::Result<()> {
    let pid = std::process::id().to_string();
    let limits = sh(
        "prlimit",
        &[
            "--pid",
            &pid,
            "--nofile",
            "--raw",
            "--noheadings",
            "--output",
            "HARD",
        ],
    )?;
    let hard = limits.trim();
    if hard != "unlimited" && hard.parse::<usize>().unwrap_or(0) < needed {
        bail!("{needed} open files needed, and the hard limit is {hard}");
    }
    sh("prlimit", &["--pid", &pid, &format!("--nofile={hard}:")])?;
    Ok(())
}

/// The driver's part, moved onto its thread.
struct Drive {
    clouds: Vec<String>,
    key: PublicKey,
    adapter: u32,
    target: Ipv4Addr,
    opts: SwarmOptions,
}

/// What the driver asks of a peer's task; each answer is how long it took.
enum Ask {
    /// Send a ping carrying this marker.
    Ping(Vec<u8>, oneshot::Sender<Duration>),
    /// Handshake again now (new keys on the live session).
    Rekey(oneshot::Sender<Duration>),
}

impl Drive {
    async fn run(self, identities: Vec<Arc<Identity>>) -> anyhow::Result<SwarmFigures> {
        let n = identities.len();
        let mut sockets = Vec::with_capacity(n);
        for i in 0..n {
            let s = UdpSocket::bind(SocketAddr::new(peer_address(i), 0))
                .await
                .with_context(|| format!("peer {i}'s tunnel socket"))?;
            sockets.push(s);
        }
        let clock = Clock::new(
            Instant::now(),
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default(),
        );

        // Joining: each peer connects to the cloud, registers, asks for the adapter's name
        // and handshakes; once its keys are confirmed it leaves the cloud (see `Joined`).
        let gate = Arc::new(Semaphore::new(self.opts.concurrency.max(1)));
        let started = Instant::now();
        let mut tunnels = JoinSet::new();
        let (up_tx, mut up_rx) = mpsc::unbounded_channel::<(usize, Joined)>();
        let mut askers: Vec<mpsc::Sender<Ask>> = Vec::with_capacity(n);
        for (i, (socket, identity)) in sockets.into_iter().zip(identities).enumerate() {
            let permit = gate.clone().acquire_owned().await?;
            let (ask_tx, asks) = mpsc::channel(1);
            askers.push(ask_tx);
            let up = up_tx.clone();
            let joining = Joining {
                identity: identity.clone(),
                source: peer_address(i),
                tunnel: Some(socket.local_addr()?),
                name: peer_name(i),
            };
            let (clouds, key) = (self.clouds.clone(), self.key);
            let tunnel = Tunnel {
                identity,
                socket,
                clock: clock.clone(),
                vip: members::numbered_vip(i),
                target: self.target,
            };
            tunnels.spawn(async move {
                let Some((handle, _events)) = members::join(clouds, i, key, joining).await else {
                    let _ = up.send((i, Joined::NotRegistered));
                    return;
                };
                let t = Instant::now();
                let answer = tokio::time::timeout(PATIENCE, handle.resolve(ADAPTER)).await;
                let Ok(Ok(Resolution::Found { peer, .. })) = answer else {
                    let _ = up.send((i, Joined::NotFound));
                    return;
                };
                // The control session ends with the tunnel up: this process may hold only
                // so many descriptors (the hard limit here is 20,000), and the adapter's
                // load does not depend on it.
                let mut session = Some((permit, handle, _events));
                tunnel
                    .run(&peer, asks, || {
                        session.take();
                        let _ = up.send((i, Joined::Up(t.elapsed())));
                    })
                    .await;
            });
        }
        drop(up_tx);
        // Every peer heard from, or the patience of the slowest gone.
        let (mut registered, mut times) = (0, Vec::with_capacity(n));
        let mut up = vec![false; n];
        let mut heard = 0;
        let deadline = tokio::time::Instant::now() + PATIENCE * 2;
        while heard < n {
            match tokio::time::timeout_at(deadline, up_rx.recv()).await {
                Ok(Some((i, joined))) => {
                    heard += 1;
                    match joined {
                        Joined::NotRegistered => {}
                        Joined::NotFound => registered += 1,
                        Joined::Up(took) => {
                            registered += 1;
                            up[i] = true;
                            times.push(took);
                        }
                    }
                }
                _ => break,
            }
        }
        let join_secs = started.elapsed().as_secs_f64();
        let after = fleet::rss_kib(self.adapter);
        let ups: Vec<usize> = (0..n).filter(|i| up[*i]).collect();

        // Pings, one at a time, spread over the peers that are up.
        let mut rtts = Vec::with_capacity(self.opts.pings);
        let mut lost = 0;
        let pings = if ups.is_empty() { 0 } else { self.opts.pings };
        for k in 0..pings {
            let i = ups[k * ups.len() / pings];
            let (tx, rx) = oneshot::channel();
            let marker = format!("swarm {i} {k}").into_bytes();
            if askers[i].try_send(Ask::Ping(marker, tx)).is_err() {
                lost += 1;
                continue;
            }
            match tokio::time::timeout(PING_PATIENCE, rx).await {
                Ok(Ok(rtt)) => rtts.push(rtt),
                _ => lost += 1,
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        #[allow(clippy::cast_precision_loss)]
        let mean = if rtts.is_empty() {
            0.0
        } else {
            rtts.iter().map(Duration::as_secs_f64).sum::<f64>() / rtts.len() as f64 * 1000.0
        };
        let answered = rtts.len();
        let (p50, p99) = percentiles(&mut rtts);

        // A handshake storm: every peer that is up handshakes again at once.
        let storm = Instant::now();
        let mut rekeys = JoinSet::new();
        for &i in &ups {
            let (tx, rx) = oneshot::channel();
            if askers[i].try_send(Ask::Rekey(tx)).is_ok() {
                rekeys.spawn(async move { tokio::time::timeout(PATIENCE, rx).await });
            }
        }
        let mut rekeyed = Vec::with_capacity(ups.len());
        while let Some(done) = rekeys.join_next().await {
            if let Ok(Ok(Ok(took))) = done {
                rekeyed.push(took);
            }
        }
        let storm_secs = rekeyed
            .iter()
            .max()
            .map_or_else(|| storm.elapsed(), |d| *d)
            .as_secs_f64();

        // Idle: every peer up, nothing sent (keepalives hold the sessions).
        let (t0, c0) = (Instant::now(), fleet::cpu_ticks(self.adapter));
        tokio::time::sleep(Duration::from_secs(self.opts.idle_seconds)).await;
        #[allow(clippy::cast_precision_loss)]
        let idle_cpu_percent = fleet::cpu_ticks(self.adapter).saturating_sub(c0) as f64
            / fleet::ticks_per_second()
            / t0.elapsed().as_secs_f64()
            * 100.0;
        let driver_rss_kib = fleet::rss_kib(std::process::id());
        tunnels.abort_all();
        Ok(SwarmFigures {
            peers: n,
            registered,
            up: times.len(),
            join_secs,
            join_ms: percentiles(&mut times),
            rekeyed: rekeyed.len(),
            storm_secs,
            storm_ms: percentiles(&mut rekeyed),
            pings: (answered, lost),
            rtt_ms: (mean, p50, p99),
            adapter_rss_kib: (0, after),
            idle_cpu_percent,
            handshakes: [0; 5],
            leases: 0,
            refusal_reasons: Vec::new(),
            driver_rss_kib,
        })
    }
}

/// How a peer's joining ended.
enum Joined {
    /// The cloud did not confirm its registration.
    NotRegistered,
    /// The cloud did not answer with the adapter.
    NotFound,
    /// Its tunnel came up this long after it asked for the adapter's name.
    Up(Duration),
}

/// One peer's tunnel: its socket and the session state machine, driven here.
struct Tunnel {
    identity: Arc<Identity>,
    socket: UdpSocket,
    clock: Clock,
    /// Its vIP, the pings' source.
    vip: Ipv4Addr,
    /// The host the pings go to, behind the adapter.
    target: Ipv4Addr,
}

impl Tunnel {
    /// Handshakes with the adapter `info` describes (initiating at once, as a node does
    /// when the cloud answers), calls `up` once keys are confirmed, then keeps the session
    /// (answering the adapter, keepalives, rekeys) and does what `asks` asks until aborted.
    async fn run(
        self,
        info: &cyphonic_control::PeerInfo,
        mut asks: mpsc::Receiver<Ask>,
        mut up: impl FnMut(),
    ) {
        let Ok(cert) = Certificate::from_pem(&info.certificate) else {
            return;
        };
        let Some(endpoint) = info.endpoints.iter().copied().find(SocketAddr::is_ipv6) else {
            return;
        };
        let mut peer = Peer::new(
            0,
            self.identity.clone(),
            Indices::new(),
            PeerConfig::from_certificate(&cert, Some(endpoint)),
            Timing::default(),
            self.clock.clone(),
            Backend::Ring,
        );
        let _ = peer.initiate(Instant::now());
        let mut buf = vec![0u8; 2048];
        // The ping in flight (its marker, when it left, who waits), and the rekey.
        let mut ping: Option<(Vec<u8>, Instant, oneshot::Sender<Duration>)> = None;
        let mut rekey: Option<(Instant, oneshot::Sender<Duration>)> = None;
        let mut is_up = false;
        let mut asking = true;
        loop {
            // A ping unanswered past its patience is lost (its asker stopped waiting).
            if ping
                .as_ref()
                .is_some_and(|(_, sent, _)| sent.elapsed() >= PING_PATIENCE)
            {
                ping = None;
            }
            while let Some(t) = peer.poll_transmit() {
                let _ = self.socket.send_to(&t.frame, t.destination).await;
            }
            while let Some(e) = peer.poll_event() {
                let PeerEvent::Established { rekey: again, .. } = e else {
                    continue;
                };
                if !is_up {
                    is_up = true;
                    up();
                } else if again && let Some((asked, tx)) = rekey.take() {
                    let _ = tx.send(asked.elapsed());
                }
            }
            let timer = peer
                .poll_timeout()
                .into_iter()
                .chain(ping.as_ref().map(|(_, sent, _)| *sent + PING_PATIENCE))
                .min()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                got = self.socket.recv_from(&mut buf) => {
                    let Ok((len, from)) = got else { continue };
                    let now = Instant::now();
                    let inner = receive_frame(&self.identity, &self.clock, &mut peer, &mut buf[..len], from, now);
                    let answered = inner.zip(ping.as_ref()).is_some_and(|(p, (marker, _, _))| {
                        inject::echo_reply_marker(&p, self.target) == Some(marker.as_slice())
                    });
                    if answered && let Some((_, sent, tx)) = ping.take() {
                        let _ = tx.send(now.saturating_duration_since(sent));
                    }
                }
                () = tokio::time::sleep_until(timer.into()) => {
                    let now = Instant::now();
                    if peer.poll_timeout().is_some_and(|t| t <= now) {
                        peer.handle_timeout(now);
                    }
                }
                ask = asks.recv(), if asking && ping.is_none() && rekey.is_none() => {
                    let now = Instant::now();
                    match ask {
                        Some(Ask::Ping(marker, tx)) => {
                            let packet = inject::echo_packet(self.vip, self.target, &marker);
                            let mut frame = vec![0u8; packet.len() + 64];
                            if let (Ok(len), Some(to)) =
                                (peer.encapsulate(now, &packet, &mut frame), peer.endpoint())
                            {
                                let _ = self.socket.send_to(&frame[..len], to).await;
                                ping = Some((marker, now, tx));
                            }
                        }
                        Some(Ask::Rekey(tx)) if peer.initiate(now).is_ok() => {
                            rekey = Some((now, tx));
                        }
                        Some(Ask::Rekey(_)) => {}
                        // The driver is done asking.
                        None => asking = false,
                    }
                }
            }
        }
    }
}

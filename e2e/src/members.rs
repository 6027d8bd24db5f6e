//! Many members of the overlay from one process, against the real cloud (issue 24, item 4):
//! `cyphonic-bed members`. Each member is a real signal client (`cyphonic_signal::spawn`)
//! with its own certificate from a test CA and its own IPv6 source address (each in a /64 of
//! its own, so that the cloud's per-source limits see them as the separate hosts they would
//! be), on one namespace's interface:
//!
//! ```text
//! [members] toc fd00:192:0:2::1/64, fd00:d:0:<i>::1/128 ... -- wan fd00:192:0:2::10/64 [cloud]
//!                                                                   (and ::11: the second
//!                                                                    instance on PostgreSQL)
//! ```
//!
//! The driver runs every member on one thread (a current-thread tokio runtime inside the
//! members' namespace), so that the cloud has the other core. Every load is bounded: each
//! phase has a deadline, and the bed is removed on drop.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use cyphonic_control::{NameRecord, Resolution};
use cyphonic_crypto::PublicKey;
use cyphonic_session::Identity;
use cyphonic_signal::testing::Pki;
use cyphonic_signal::{Event, Handle};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use crate::bed::TempDir;
use crate::hosts::{Bins, CloudHost};
use crate::postgres::Postgres;
use crate::{Netns, Proc, fleet, inject};

/// Members at most (their addresses are `fd00:d:0:<i>::1`, `i` < 65,536).
pub const MAX_MEMBERS: usize = 65_535;
/// How long one member's registration or resolution may take before it counts as failed.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// How to run the bed's members.
#[derive(Debug, Clone)]
pub struct MembersOptions {
    /// Registrations (or resolutions) in progress at once.
    pub concurrency: usize,
    /// Seconds with every member connected and nothing asked, for the cloud's idle CPU.
    pub idle_seconds: u64,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct MembersFigures {
    /// `sqlite, 1 instance` or `postgresql, 2 instances`.
    pub store: String,
    /// Members started.
    pub members: usize,
    /// Members whose registration the cloud confirmed.
    pub registered: usize,
    /// From the first member's start to the last confirmation.
    pub register_secs: f64,
    /// One member's time from start (TCP, Noise handshake, certificate check, the store's
    /// write) to the confirmation: median and 99th percentile, ms.
    pub register_ms: (f64, f64),
    /// Resolutions answered with the name's owner.
    pub resolved: usize,
    /// Resolutions that failed (an error, a timeout or not found).
    pub resolve_failed: usize,
    /// From the first resolution to the last answer.
    pub resolve_secs: f64,
    /// One resolution: median and 99th percentile, ms.
    pub resolve_ms: (f64, f64),
    /// The cloud instances' resident memory before the members came and with all of them
    /// connected, KiB (summed over instances).
    pub cloud_rss_kib: (u64, u64),
    /// The database's size on disk with every member registered, bytes (SQLite only).
    pub database_bytes: Option<u64>,
    /// The cloud instances' CPU with every member connected and idle, % of a core (summed).
    pub idle_cpu_percent: f64,
    /// This driver's resident memory with every member connected, KiB.
    pub driver_rss_kib: u64,
}

impl MembersFigures {
    /// Registrations per second.
    pub fn registrations_per_second(&self) -> f64 {
        rate(self.registered, self.register_secs)
    }

    /// Resolutions per second.
    pub fn resolutions_per_second(&self) -> f64 {
        rate(self.resolved, self.resolve_secs)
    }

    /// The cloud's resident memory per member, KiB.
    pub fn cloud_kib_per_member(&self) -> f64 {
        let grown = self.cloud_rss_kib.1.saturating_sub(self.cloud_rss_kib.0);
        rate(
            usize::try_from(grown).unwrap_or(usize::MAX),
            self.members as f64,
        )
    }
}

#[allow(clippy::cast_precision_loss)]
pub(crate) fn rate(n: usize, per: f64) -> f64 {
    if per > 0.0 { n as f64 / per } else { 0.0 }
}

/// Member `i`'s source address: `fd00:d:0:<i>::1`, a /64 of its own.
pub fn member_address(i: usize) -> IpAddr {
    numbered_address(0xd, i)
}

/// Member `i`'s name and vIP: `m<i>.ovl.example` at 100.80.0.0 + `i` (its certificate's
/// block is that /32).
pub fn member_name(i: usize) -> NameRecord {
    numbered_name('m', i)
}

/// Host `i`'s address in `fd00:<net>::/32`: `fd00:<net>:0:<i>::1`, a /64 of its own.
pub(crate) fn numbered_address(net: u16, i: usize) -> IpAddr {
    let i = u16::try_from(i).unwrap_or(u16::MAX);
    IpAddr::V6(Ipv6Addr::new(0xfd00, net, 0, i, 0, 0, 0, 1))
}

/// Member `i`'s name and vIP: `<letter><i>.ovl.example` at 100.80.0.0 + `i`.
pub(crate) fn numbered_name(letter: char, i: usize) -> NameRecord {
    NameRecord {
        name: format!("{letter}{i}.ovl.example"),
        vip: Some(numbered_vip(i)),
        vip6: None,
        legacy: None,
    }
}

/// Member `i`'s vIP: 100.80.0.0 + `i`.
pub(crate) fn numbered_vip(i: usize) -> Ipv4Addr {
    let i = u32::try_from(i).unwrap_or(u32::MAX);
    Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 80, 0, 0)).saturating_add(i))
}

/// The cloud (one instance on SQLite, or two on one PostgreSQL) and the members' namespace.
#[derive(Debug)]
pub struct MembersBed {
    /// Where the members run.
    pub ns: Netns,
    /// The cloud's host (its first instance).
    pub cloud: CloudHost,
    /// The second instance, on PostgreSQL.
    pub second: Option<Proc>,
    /// The CA that issued the members' certificates, which the cloud trusts.
    pub pki: Pki,
    /// Members (each has its source address on the members' interface).
    members: usize,
    pg: Option<Postgres>,
    _tmp: TempDir,
}

impl MembersBed {
    /// Builds and starts it for `members` members (their source addresses are put on the
    /// members' interface), with two cloud instances on PostgreSQL (members alternate
    /// between them) or one on SQLite.
    ///
    /// # Errors
    /// A namespace, address, process or the database failing to start.
    pub fn new(members: usize, postgres: bool) -> anyhow::Result<Self> {
        Self::with_cloud_config(members, postgres, "")
    }

    /// As [`MembersBed::new`], the cloud's configuration with `extra` lines (a `[relay]`
    /// table, for instance).
    ///
    /// # Errors
    /// As [`MembersBed::new`].
    pub fn with_cloud_config(members: usize, postgres: bool, extra: &str) -> anyhow::Result<Self> {
        if members > MAX_MEMBERS {
            bail!("at most {MAX_MEMBERS} members");
        }
        let bins = Bins::find()?;
        let tmp = TempDir::new("cy-members-")?;
        let pki = Pki::new();
        let ca_dir = tmp.path().join("ca");
        std::fs::create_dir_all(&ca_dir)?;
        std::fs::write(ca_dir.join("ca.crt"), pki.ca.certificate().to_pem())?;
        let ns = Netns::new("members")?;
        let mut cloud = CloudHost::new(&ns, &bins, &ca_dir, tmp.path(), extra)?;
        add_addresses(&ns, "toc", (0..members).map(member_address), tmp.path())?;
        let (pg, second) = if postgres {
            let pg = Postgres::start_in(Some(&cloud.ns))?;
            let second = cloud.two_instances(&bins, &pg.url(), IPV6_INSTANCES)?;
            (Some(pg), Some(second))
        } else {
            cloud.start(&bins)?;
            (None, None)
        };
        Ok(Self {
            ns,
            cloud,
            second,
            pki,
            members,
            pg,
            _tmp: tmp,
        })
    }

    /// Registers every member inside the bed's namespace (at most `concurrency` not yet
    /// confirmed at once) and hands them to `drive` there, each with its identity, on the
    /// same one-thread runtime: a test's own load against the real cloud. `None` is a
    /// member the cloud did not confirm within `PATIENCE`.
    ///
    /// # Errors
    /// The cloud's key is unreadable, the driver's thread failed, or `drive` did.
    pub fn drive<T, F, Fut>(&self, concurrency: usize, drive: F) -> anyhow::Result<T>
    where
        F: FnOnce(Vec<(Arc<Identity>, Option<Member>)>) -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<T>>,
        T: Send + 'static,
    {
        let key = self.cloud_key()?;
        let identities = self.identities();
        let clouds = self.addresses();
        inject::joined(inject::spawn_inside(&self.ns, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let joining = joining(identities.iter().cloned());
                let (members, _, _) = register(&clouds, key, joining, concurrency).await?;
                drive(identities.into_iter().zip(members).collect()).await
            })
        }))
    }

    /// The cloud's public key.
    fn cloud_key(&self) -> anyhow::Result<PublicKey> {
        self.cloud
            .public_key
            .parse()
            .context("the cloud's public key")
    }

    /// The cloud instances' control addresses (IPv6).
    pub fn addresses(&self) -> Vec<String> {
        let mut at = vec![self.cloud.address6.to_string()];
        if self.second.is_some() {
            at.push(SocketAddr::new(IPV6_INSTANCES.1.0, self.cloud.address6.port()).to_string());
        }
        at
    }

    /// The cloud instances' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.cloud
            .proc
            .iter()
            .chain(self.second.iter())
            .map(Proc::pid)
            .collect()
    }

    /// Issues the members' identities (member `i` is [`member_name`]`(i)`).
    pub fn identities(&self) -> Vec<Arc<Identity>> {
        (0..self.members)
            .map(|i| {
                let r = member_name(i);
                self.pki
                    .identity(&r.name, &format!("{}/32", numbered_vip(i)), &[])
            })
            .collect()
    }

    /// Runs the members: registrations, then one resolution each, then idleness.
    ///
    /// # Errors
    /// The cloud's key is unreadable, or the driver's thread failed.
    pub fn run(&self, opts: &MembersOptions) -> anyhow::Result<MembersFigures> {
        let key = self.cloud_key()?;
        let identities = self.identities();
        let database = (self.pg.is_none()).then(|| self.cloud.dir.join("cloud.db"));
        let store = if self.pg.is_some() {
            "postgresql, 2 instances"
        } else {
            "sqlite, 1 instance"
        };
        let drive = Drive {
            clouds: self.addresses(),
            key,
            pids: self.pids(),
            opts: opts.clone(),
            database,
            store: store.to_owned(),
        };
        inject::joined(inject::spawn_inside(&self.ns, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(drive.run(identities))
        }))
    }
}

/// The cloud instances' addresses on PostgreSQL: the first's, and the second's with the
/// prefix length of its network.
const IPV6_INSTANCES: (IpAddr, (IpAddr, u8)) = (
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x192, 0, 2, 0, 0, 0, 0x10)),
    (
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x192, 0, 2, 0, 0, 0, 0x11)),
        64,
    ),
);

/// Puts `addresses` (IPv6) on `ns`'s interface `iface`, in one `ip -batch` (a file in
/// `tmp`): thousands take a second, not minutes.
pub(crate) fn add_addresses(
    ns: &Netns,
    iface: &str,
    addresses: impl Iterator<Item = IpAddr>,
    tmp: &std::path::Path,
) -> anyhow::Result<()> {
    let mut batch = String::new();
    for a in addresses {
        batch.push_str(&format!("addr add {a}/128 dev {iface} nodad\n"));
    }
    let file = tmp.join("addresses.batch");
    std::fs::write(&file, batch)?;
    ns.ip(&["-6", "-batch", file.to_str().context("path")?])?;
    Ok(())
}

/// The driver's part, moved onto its thread.
struct Drive {
    clouds: Vec<String>,
    key: PublicKey,
    pids: Vec<u32>,
    opts: MembersOptions,
    database: Option<std::path::PathBuf>,
    store: String,
}

/// A member that registered: its handle and events (kept, or its session ends).
pub type Member = (Handle, mpsc::Receiver<Event>);

impl Drive {
    async fn run(self, identities: Vec<Arc<Identity>>) -> anyhow::Result<MembersFigures> {
        let n = identities.len();
        let rss_before: u64 = self.pids.iter().map(|p| fleet::rss_kib(*p)).sum();
        let joining = joining(identities);
        let (members, register_ms, register_secs) =
            register(&self.clouds, self.key, joining, self.opts.concurrency).await?;
        let registered = members.iter().filter(|m| m.is_some()).count();
        let rss_after: u64 = self.pids.iter().map(|p| fleet::rss_kib(*p)).sum();
        let database_bytes = self.database.as_ref().map(|db| {
            ["", "-wal"]
                .iter()
                .filter_map(|s| std::fs::metadata(format!("{}{s}", db.display())).ok())
                .map(|m| m.len())
                .sum()
        });
        let (resolved, resolve_failed, resolve_ms, resolve_secs) =
            resolve(&members, &self.opts).await;
        // Idle: every member connected, nothing asked (pings and probes keep sessions).
        let ticks = |pids: &[u32]| pids.iter().map(|p| fleet::cpu_ticks(*p)).sum::<u64>();
        let (t0, c0) = (Instant::now(), ticks(&self.pids));
        tokio::time::sleep(Duration::from_secs(self.opts.idle_seconds)).await;
        #[allow(clippy::cast_precision_loss)]
        let idle_cpu_percent = ticks(&self.pids).saturating_sub(c0) as f64
            / fleet::ticks_per_second()
            / t0.elapsed().as_secs_f64()
            * 100.0;
        let driver_rss_kib = fleet::rss_kib(std::process::id());
        drop(members);
        Ok(MembersFigures {
            store: self.store,
            members: n,
            registered,
            register_secs,
            register_ms,
            resolved,
            resolve_failed,
            resolve_secs,
            resolve_ms,
            cloud_rss_kib: (rss_before, rss_after),
            database_bytes,
            idle_cpu_percent,
            driver_rss_kib,
        })
    }
}

/// One member to start: who it is, where it connects from, the tunnel endpoint it
/// registers (if it has a tunnel socket), and the name it registers.
pub(crate) struct Joining {
    pub identity: Arc<Identity>,
    pub source: IpAddr,
    pub tunnel: Option<SocketAddr>,
    pub name: NameRecord,
}

/// Member `i` of `identities` to start, as [`member_address`] and [`member_name`] say,
/// without a tunnel socket.
fn joining(identities: impl IntoIterator<Item = Arc<Identity>>) -> Vec<Joining> {
    identities
        .into_iter()
        .enumerate()
        .map(|(i, identity)| Joining {
            identity,
            source: member_address(i),
            tunnel: None,
            name: member_name(i),
        })
        .collect()
}

/// Starts every member against `clouds`, at most `concurrency` not yet confirmed at once
/// (see [`join`]). Returns the members (`None`: not confirmed within [`PATIENCE`]), the
/// median and p99 time to confirmation, and the whole phase's seconds.
async fn register(
    clouds: &[String],
    key: PublicKey,
    joining: Vec<Joining>,
    concurrency: usize,
) -> anyhow::Result<(Vec<Option<Member>>, (f64, f64), f64)> {
    let n = joining.len();
    let gate = Arc::new(Semaphore::new(concurrency.max(1)));
    let started = Instant::now();
    let mut set = JoinSet::new();
    for (i, member) in joining.into_iter().enumerate() {
        let permit = gate.clone().acquire_owned().await?;
        let clouds = clouds.to_vec();
        set.spawn(async move {
            let t = Instant::now();
            let joined = join(clouds, i, key, member).await;
            drop(permit);
            (i, joined.map(|m| (m, t.elapsed())))
        });
    }
    let mut members: Vec<Option<Member>> = (0..n).map(|_| None).collect();
    let mut times = Vec::with_capacity(n);
    while let Some(joined) = set.join_next().await {
        let (i, done) = joined?;
        if let Some((m, took)) = done {
            members[i] = Some(m);
            times.push(took);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    Ok((members, percentiles(&mut times), secs))
}

/// Starts member number `i` (a signal client) against `clouds`, trying them in turn from
/// its own position in the list (members alternate between instances); it registers its
/// endpoint and name. Returns it once the cloud confirmed, or `None` after [`PATIENCE`].
pub(crate) async fn join(
    mut clouds: Vec<String>,
    i: usize,
    key: PublicKey,
    member: Joining,
) -> Option<Member> {
    let turn = i % clouds.len().max(1);
    clouds.rotate_left(turn);
    let config = cyphonic_signal::Config {
        clouds,
        cloud_keys: vec![key],
        agent: "cyphonic-bed members".into(),
        tunnel_port: member.tunnel.map(|t| t.port()),
        tunnel: cyphonic_signal::TunnelVersions::OURS,
        source: Some(member.source),
    };
    let (handle, mut events) = cyphonic_signal::spawn(config, member.identity);
    handle.register(member.tunnel.into_iter().collect(), vec![member.name]);
    let confirmed = tokio::time::timeout(PATIENCE, async {
        while let Some(e) = events.recv().await {
            if let Event::Registered { accepted: 1 } = e {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    confirmed.then_some((handle, events))
}

/// Every registered member resolves another's name once (member `i` the name of member
/// `(i + n/2 + 1) mod n`, so that with two instances about half the answers cross between
/// them), at most `concurrency` at once. Returns the answered and failed counts, the median
/// and p99 time, and the phase's seconds.
async fn resolve(
    members: &[Option<Member>],
    opts: &MembersOptions,
) -> (usize, usize, (f64, f64), f64) {
    let n = members.len();
    let gate = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let started = Instant::now();
    let mut set = JoinSet::new();
    for (i, m) in members.iter().enumerate() {
        let Some((handle, _)) = m else { continue };
        let Ok(permit) = gate.clone().acquire_owned().await else {
            break;
        };
        let handle = handle.clone();
        let target = member_name((i + n / 2 + 1) % n);
        set.spawn(async move {
            let t = Instant::now();
            let answer = tokio::time::timeout(PATIENCE, handle.resolve(&target.name)).await;
            drop(permit);
            let found =
                matches!(answer, Ok(Ok(Resolution::Found { vip, .. })) if vip == target.vip);
            found.then(|| t.elapsed())
        });
    }
    let (mut times, mut failed) = (Vec::new(), 0);
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Some(took)) => times.push(took),
            _ => failed += 1,
        }
    }
    let secs = started.elapsed().as_secs_f64();
    (times.len(), failed, percentiles(&mut times), secs)
}

/// The median and 99th percentile of `times`, ms (zeros for none).
pub(crate) fn percentiles(times: &mut [Duration]) -> (f64, f64) {
    if times.is_empty() {
        return (0.0, 0.0);
    }
    times.sort_unstable();
    let at = |q: usize| times[(times.len() - 1) * q / 100].as_secs_f64() * 1000.0;
    (at(50), at(99))
}

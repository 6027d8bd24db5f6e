//! The DHCP server on the LAN (crates/vip) with its leases on disk ([`crate::leases`]), on
//! the control thread; the file is written by the lease writer's thread, at most once a
//! second. A new binding is on disk before the ACK that grants it leaves, as RFC 2131 §4.3.2
//! asks: the ACK waits for the write (and is dropped, the client retrying, when the write
//! does not come in time). A renewal of a binding already on disk leaves at once: the file
//! says how far renewals may have reached ([`RENEWAL_WINDOW`] past its write), and loading
//! honours it. Every change settles into the anti-spoofing table before any reply goes out.
//!
//! A trunked LAN port has a DHCP scope per segment (the untagged one and each VLAN's, each
//! with its own block, pool and reservations: crates/vip's server per scope), and one lease
//! file for all of them: the bindings are told apart by their addresses, and an HA pair's
//! standby keeps the one file whatever the segments.
//!
//! One of an HA pair, while a standby is in contact, an ACK that grants a binding also waits
//! for the standby to hold a lease file with it ([`Replica`]; docs/protocol.md §5, *State
//! that moves*), at most [`STANDBY_WAIT`] after the file was written: then it leaves anyway,
//! counted.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cyphonic_gateway::Neighbors as _;
use cyphonic_telemetry::Throttle;
use cyphonic_vip::{Dhcp6Config, DhcpConfig, Event6, Ignore, Lease, LeaseEvent, Reply, Server6};

use crate::config::Mac;
use crate::leases::{LeaseStore, Snapshot, Writer, Written};
use crate::neighbors::LanTable;
use crate::status::DhcpStatus;

/// Warnings about refused devices or failed saves at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);
/// A renewal leaves before its new expiry is on disk only while the last write is at most
/// this old (seconds); the file says renewals reach this far past it.
pub const RENEWAL_WINDOW: u64 = 10;
/// How long an ACK waits for its binding to reach the disk before it is dropped (the client
/// retries).
const HOLD: Duration = Duration::from_secs(3);
/// ACKs waiting for the disk at most (more: the oldest is dropped).
const MAX_HELD: usize = 256;
/// How long an ACK whose binding is on disk waits for the standby to hold it too before it
/// leaves anyway.
pub const STANDBY_WAIT: Duration = Duration::from_secs(1);

/// Whether a standby is to hold each binding before its ACK leaves (an HA pair's; the pair's
/// thread says which: docs/protocol.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Replica {
    /// No standby to wait for: a lone adapter, or a pair whose other box is out of contact
    /// or not standing by.
    #[default]
    Alone,
    /// A standby in contact holds the lease file of this generation and every binding in
    /// it (`None`: no file of this server's yet).
    Holds(Option<u64>),
}

impl Replica {
    /// Whether a binding first in snapshot `generation` is held where it must be.
    const fn holds(self, generation: u64) -> bool {
        match self {
            Self::Alone => true,
            Self::Holds(Some(held)) => generation <= held,
            Self::Holds(None) => false,
        }
    }
}

/// A reply of either server and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A DHCPv4 reply (it says where it goes).
    V4(Reply),
    /// A DHCPv6 reply, to the client's address and port at its MAC.
    V6 {
        /// The reply.
        reply: cyphonic_vip::Reply6,
        /// The client's MAC.
        mac: [u8; 6],
        /// The client's (link-local) address.
        ip: Ipv6Addr,
        /// The client's port.
        port: u16,
    },
}

impl From<Reply> for Answer {
    fn from(r: Reply) -> Self {
        Self::V4(r)
    }
}

impl Answer {
    /// The addresses it binds or renews.
    fn grants(&self) -> Vec<IpAddr> {
        match self {
            Self::V4(r) => r.grants.into_iter().map(IpAddr::V4).collect(),
            Self::V6 { reply, .. } => reply.grants.iter().copied().map(IpAddr::V6).collect(),
        }
    }
}

/// An ACK waiting for its binding to be on disk (and at the standby).
#[derive(Debug)]
struct Held {
    /// The segment it goes to (its VLAN; None untagged).
    tag: Option<u16>,
    /// The snapshot that must be written first.
    generation: u64,
    /// The snapshot its binding first appeared in: what the standby must hold.
    binding: u64,
    /// Dropped (the client retries) when not on disk by then.
    until: Instant,
    /// When it was seen on disk.
    written: Option<Instant>,
    reply: Answer,
}

/// What [`Dhcp::release`] lets go.
#[derive(Debug, Default)]
pub struct Released {
    /// ACKs that may leave now, with the segment each goes to (its VLAN; None untagged).
    pub ready: Vec<(Option<u16>, Answer)>,
    /// ACKs dropped: their binding did not reach the disk in time (the clients retry).
    pub dropped: u64,
    /// Of `ready`, those that leave without the standby holding their binding: it did not
    /// say so within [`STANDBY_WAIT`].
    pub unreplicated: u64,
}

/// One segment's DHCP: its server over its block.
struct Scope {
    /// The segment: its VLAN, None the untagged one.
    tag: Option<u16>,
    server: cyphonic_vip::Server,
    block: ipnet::Ipv4Net,
    pool: (Ipv4Addr, Ipv4Addr),
    ignored: BTreeMap<&'static str, u64>,
}

/// A segment's DHCPv6 server.
struct Scope6 {
    /// The segment: its VLAN, None the untagged one.
    tag: Option<u16>,
    prefix: ipnet::Ipv6Net,
    server: Server6,
    pool: (Ipv6Addr, Ipv6Addr),
    ignored: BTreeMap<&'static str, u64>,
}

/// The DHCP servers of the LAN's segments and their one lease file.
pub struct Dhcp {
    /// The untagged segment's first, then the VLANs'.
    scopes: Vec<Scope>,
    /// The DHCPv6 servers of the segments with IPv6, when DHCPv6 runs.
    v6: Vec<Scope6>,
    path: PathBuf,
    writer: Writer,
    lease_secs: u32,
    /// The newest snapshot handed to the writer.
    generation: u64,
    /// What the writer reported last.
    written: Written,
    /// Per active binding, the snapshot it first appeared in.
    bound_in: HashMap<(IpAddr, [u8; 6]), u64>,
    held: VecDeque<Held>,
    save_failed: Throttle,
    refused: Throttle,
    /// The cloud peers in use, kept in the file for whoever serves next.
    peers: Vec<String>,
    /// They changed since the last snapshot.
    peers_changed: bool,
    /// The cloud peers the file named at start, until taken.
    resumed: Vec<String>,
}

impl std::fmt::Debug for Dhcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dhcp")
            .field("scopes", &self.scopes.len())
            .field("generation", &self.generation)
            .field("written", &self.written)
            .field("held", &self.held.len())
            .finish_non_exhaustive()
    }
}

/// What becomes of a reply.
#[derive(Debug)]
pub enum Verdict {
    /// It may leave now.
    Send(Answer),
    /// It waits for the disk ([`Dhcp::release`] hands it back).
    Held,
}

const fn ignore_name(why: Ignore) -> &'static str {
    match why {
        Ignore::Malformed => "malformed",
        Ignore::NotARequest => "not_a_request",
        Ignore::Relayed => "relayed",
        Ignore::ChaddrMismatch => "chaddr_mismatch",
        Ignore::OtherServer => "other_server",
        Ignore::NoRecord => "no_record",
        Ignore::NoAddress => "no_address",
        Ignore::Unexpected => "unexpected",
        _ => "other",
    }
}

impl Dhcp {
    /// The servers of `scopes` (the untagged segment's first, then the VLANs', each with
    /// its tag), with the leases saved in `state_dir` at unix time `unix`: each takes the
    /// saved bindings inside its block (a VLAN's before the untagged one, whose block holds
    /// the VLANs'). Every scope has `[dhcp]`'s lease time. Each segment of `v6` (its tag and
    /// configuration) has a DHCPv6 server too, in the same file.
    ///
    /// # Errors
    /// The state directory or the lease file cannot be used, or a configuration is refused.
    pub fn open(
        scopes: &[(Option<u16>, &DhcpConfig)],
        v6: &[(Option<u16>, Dhcp6Config)],
        state_dir: &Path,
        unix: u64,
    ) -> anyhow::Result<Self> {
        let store = LeaseStore::open(state_dir).with_context(|| {
            format!(
                "state_dir {}: cannot keep DHCP leases there",
                state_dir.display()
            )
        })?;
        let loaded = store
            .load(unix)
            .with_context(|| format!("reading {}", store.path().display()))?;
        if let Some((aside, reason)) = &loaded.moved_aside {
            tracing::warn!(file = %aside.display(), %reason, "the lease file was damaged: moved aside, starting without leases (devices will ask again)");
        }
        let count = loaded.leases.iter().filter(|l| l.active).count();
        let mut saved = split(loaded.leases, scopes.iter().map(|(_, c)| c.block));
        let path = store.path();
        let mut built = Vec::new();
        for ((tag, cfg), leases) in scopes.iter().zip(saved.drain(..)) {
            let server = cyphonic_vip::Server::new((*cfg).clone(), leases, unix)
                .context("the DHCP configuration")?;
            tracing::info!(
                vlan = ?tag,
                pool = %format!("{}-{}", cfg.pool.0, cfg.pool.1),
                lease_secs = cfg.lease_secs,
                "DHCP server on the LAN"
            );
            built.push(Scope {
                tag: *tag,
                server,
                block: cfg.block,
                pool: cfg.pool,
                ignored: BTreeMap::new(),
            });
        }
        let mut v6_built = Vec::new();
        // Each segment's bindings are those in its /64.
        let saved6 = split6(loaded.leases6, v6.iter().map(|(_, c)| c.prefix));
        for ((tag, cfg), saved) in v6.iter().zip(saved6) {
            let server =
                Server6::new(cfg.clone(), saved, unix).context("the DHCPv6 configuration")?;
            tracing::info!(
                vlan = ?tag,
                pool = %format!("{}-{}", cfg.pool.0, cfg.pool.1),
                "DHCPv6 server on the LAN"
            );
            v6_built.push(Scope6 {
                tag: *tag,
                prefix: cfg.prefix,
                server,
                pool: cfg.pool,
                ignored: BTreeMap::new(),
            });
        }
        let v6 = v6_built;
        let lease_secs = scopes.first().map_or(0, |(_, c)| c.lease_secs);
        tracing::info!(saved = count, file = %path.display(), "DHCP leases");
        let writer = Writer::spawn(store, unix).context("starting the lease writer")?;
        Ok(Self {
            scopes: built,
            v6,
            path,
            writer,
            lease_secs,
            generation: 0,
            written: Written {
                taken_at: unix,
                ..Written::default()
            },
            bound_in: HashMap::new(),
            held: VecDeque::new(),
            save_failed: Throttle::new(WARN_EVERY),
            refused: Throttle::new(WARN_EVERY),
            peers: loaded.peers.clone(),
            peers_changed: false,
            resumed: loaded.peers,
        })
    }

    /// The cloud peers in use are now `peers` (fingerprints, sorted): the next
    /// [`Dhcp::settle`] writes them into the file, for whoever serves the gateway next.
    pub fn set_peers(&mut self, peers: &[String]) {
        if self.peers != peers {
            self.peers = peers.to_vec();
            self.peers_changed = true;
        }
    }

    /// The cloud peers the file named when the server started (the serving box's last, for
    /// a box taking over), once.
    pub fn take_resumed(&mut self) -> Vec<String> {
        std::mem::take(&mut self.resumed)
    }

    fn scope(&mut self, tag: Option<u16>) -> Option<&mut Scope> {
        self.scopes.iter_mut().find(|s| s.tag == tag)
    }

    /// A DHCP message from Ethernet source `mac` on the segment of `tag` (None: untagged):
    /// the reply to send once the bindings it made are settled ([`Dhcp::settle`]), if any.
    /// A segment without a scope gets none.
    pub fn handle(
        &mut self,
        tag: Option<u16>,
        unix: u64,
        mac: [u8; 6],
        payload: &[u8],
    ) -> Option<Reply> {
        let scope = self.scope(tag)?;
        match scope.server.handle(unix, payload, mac) {
            Ok(reply) => reply,
            Err(why) => {
                *scope.ignored.entry(ignore_name(why)).or_default() += 1;
                tracing::debug!(mac = %Mac(mac), reason = ignore_name(why), "DHCP message not answered");
                None
            }
        }
    }

    /// A DHCPv6 message from `mac` at `ip` (its link-local address) and `port`: the reply
    /// to send once the bindings it made are settled, if any.
    pub fn handle6(
        &mut self,
        (tag, unix): (Option<u16>, u64),
        mac: [u8; 6],
        (ip, port): (Ipv6Addr, u16),
        payload: &[u8],
    ) -> Option<Answer> {
        let scope = self.v6.iter_mut().find(|s| s.tag == tag)?;
        match scope.server.handle(unix, payload, mac) {
            Ok(reply) => Some(Answer::V6 {
                reply,
                mac,
                ip,
                port,
            }),
            Err(why) => {
                *scope.ignored.entry(why.name()).or_default() += 1;
                tracing::debug!(mac = %Mac(mac), reason = why.name(), "DHCPv6 message not answered");
                None
            }
        }
    }

    /// Whether `reply` (to `mac` on the segment of `tag`, made at unix time `unix`) may
    /// leave now. An ACK waits when
    /// its binding is not on disk yet, or when the disk has not been written for
    /// [`RENEWAL_WINDOW`] (the writer is failing) and something is pending, or when the
    /// `replica` does not hold its binding yet.
    pub fn admit(
        &mut self,
        (tag, reply): (Option<u16>, impl Into<Answer>),
        mac: [u8; 6],
        unix: u64,
        now: Instant,
        replica: Replica,
    ) -> Verdict {
        let reply = reply.into();
        let grants = reply.grants();
        let Some(first) = grants
            .iter()
            .map(|ip| {
                self.bound_in
                    .get(&(*ip, mac))
                    .copied()
                    .unwrap_or(self.generation)
            })
            .max()
        else {
            return Verdict::Send(reply);
        };
        let current = self.written.generation >= self.generation
            || unix <= self.written.taken_at + RENEWAL_WINDOW;
        let on_disk = first <= self.written.generation && current;
        if on_disk && replica.holds(first) {
            return Verdict::Send(reply);
        }
        if self.held.len() >= MAX_HELD {
            self.held.pop_front();
        }
        self.held.push_back(Held {
            tag,
            generation: if on_disk { first } else { self.generation },
            binding: first,
            until: now + HOLD,
            written: on_disk.then_some(now),
            reply,
        });
        Verdict::Held
    }

    /// Takes in what the writer reported and what the `replica` holds: the held ACKs whose
    /// binding is now on disk (and at the standby, or waited [`STANDBY_WAIT`] for it), and
    /// how many waited too long for the disk and are dropped (their clients retry).
    pub fn release(&mut self, now: Instant, replica: Replica) -> Released {
        let written = self.writer.written();
        if let Some(e) = &written.error
            && written.failures > self.written.failures
            && let Some(held) = self.save_failed.due(now)
        {
            tracing::error!(file = %self.path.display(), error = %e, also_failed = held, "cannot save the DHCP leases; they are kept in memory, saving is retried, and new leases wait for it");
        }
        self.written = written;
        let mut out = Released::default();
        for mut h in std::mem::take(&mut self.held) {
            if h.generation <= self.written.generation {
                let written = *h.written.get_or_insert(now);
                if replica.holds(h.binding) {
                    out.ready.push((h.tag, h.reply));
                } else if now.saturating_duration_since(written) >= STANDBY_WAIT {
                    out.unreplicated += 1;
                    out.ready.push((h.tag, h.reply));
                } else {
                    self.held.push_back(h);
                }
            } else if h.until <= now {
                out.dropped += 1;
            } else {
                self.held.push_back(h);
            }
        }
        out
    }

    /// The newest lease file written, with its generation, as the writer last reported it
    /// (none before its first write): for an HA pair's standby.
    pub fn written_table(&self) -> Option<(u64, std::sync::Arc<[u8]>)> {
        let w = &self.written;
        w.table.clone().map(|t| (w.generation, t))
    }

    /// Resolves when the writer has something new to report.
    pub async fn written_changed(&mut self) {
        self.writer.changed().await;
    }

    /// Expires leases due at unix time `unix`; returns whether anything is to settle.
    pub fn tick(&mut self, unix: u64) -> bool {
        let mut any = false;
        for s in &mut self.v6 {
            if s.server.poll_timeout().is_some_and(|t| t <= unix) {
                s.server.handle_timeout(unix);
                any = true;
            }
        }
        for s in &mut self.scopes {
            let due = s.server.poll_timeout().is_some_and(|t| t <= unix);
            if due {
                s.server.handle_timeout(unix);
            }
            any |= due;
        }
        any
    }

    /// Applies what the servers did at unix time `unix`: logs their events, hands the
    /// bindings (every scope's, in one file) to the writer when they changed, and puts each
    /// segment's active leases into the anti-spoofing `table`. Returns whether the leases
    /// changed.
    pub fn settle(&mut self, now: Instant, unix: u64, table: &LanTable) -> bool {
        let mut changed = false;
        let mut dirty = false;
        for i in 0..self.scopes.len() {
            let mut moved = false;
            while let Some(event) = self.scopes[i].server.poll_event() {
                moved = true;
                self.log(event, now, table);
            }
            let s = &mut self.scopes[i];
            dirty |= s.server.take_dirty();
            if moved {
                table.replace_leases(s.tag, s.server.active().map(|l| (l.ip, l.mac)).collect());
            }
            changed |= moved;
        }
        let mut moved6 = false;
        for s in &mut self.v6 {
            while let Some(event) = s.server.poll_event() {
                moved6 = true;
                log6(&event);
            }
            dirty |= s.server.take_dirty();
        }
        if moved6 {
            table.replace_leases6(
                self.v6
                    .iter()
                    .flat_map(|s| s.server.active().map(|l| (l.ip, l.mac)))
                    .collect(),
            );
        }
        changed |= moved6;
        dirty |= std::mem::take(&mut self.peers_changed);
        if dirty {
            self.generation += 1;
            let mut leases: Vec<Lease> =
                self.scopes.iter().flat_map(|s| s.server.leases()).collect();
            leases.sort_by_key(|l| (u32::from(l.ip), l.mac));
            let leases6: Vec<cyphonic_vip::Lease6> =
                self.v6.iter().flat_map(|s| s.server.leases()).collect();
            let generation = self.generation;
            let active: std::collections::HashSet<(IpAddr, [u8; 6])> = leases
                .iter()
                .filter(|l| l.active)
                .map(|l| (IpAddr::V4(l.ip), l.mac))
                .chain(
                    leases6
                        .iter()
                        .filter(|l| l.active)
                        .map(|l| (IpAddr::V6(l.ip), l.mac)),
                )
                .collect();
            self.bound_in.retain(|k, _| active.contains(k));
            for k in active {
                self.bound_in.entry(k).or_insert(generation);
            }
            self.writer.submit(Snapshot {
                generation,
                taken_at: unix,
                renewals_until: unix + RENEWAL_WINDOW + u64::from(self.lease_secs),
                table: cyphonic_vip::file::Table {
                    leases,
                    leases6,
                    peers: self.peers.clone(),
                },
            });
        }
        changed
    }

    fn log(&mut self, event: LeaseEvent, now: Instant, table: &LanTable) {
        match event {
            LeaseEvent::Granted(l) => {
                if table.leased_mac(l.ip) == Some(l.mac) {
                    tracing::debug!(vip = %l.ip, mac = %Mac(l.mac), "lease renewed");
                } else {
                    tracing::info!(vip = %l.ip, mac = %Mac(l.mac), hostname = %cyphonic_telemetry::Untrusted(l.hostname.as_deref().unwrap_or("")), "lease granted");
                }
            }
            LeaseEvent::Released(l) => {
                tracing::info!(vip = %l.ip, mac = %Mac(l.mac), "lease released");
            }
            LeaseEvent::Expired(l) => {
                tracing::info!(vip = %l.ip, mac = %Mac(l.mac), "lease expired");
            }
            LeaseEvent::Declined { ip, mac } => {
                tracing::warn!(vip = %ip, mac = %Mac(mac), "a device declined its address: another host uses it without a lease; kept out of the pool for 10 minutes");
            }
            LeaseEvent::PoolExhausted { mac } => {
                if let Some(held) = self.refused.due(now) {
                    tracing::warn!(mac = %Mac(mac), also_refused = held, "DHCP pool exhausted: a new device got no address (widen dhcp.pool or shorten dhcp.lease_time)");
                }
            }
            LeaseEvent::StarvationGuard { mac } => {
                if let Some(held) = self.refused.due(now) {
                    tracing::warn!(mac = %Mac(mac), also_refused = held, "too many new devices at once (dhcp.new_lease_share): a DHCP starvation attempt? a new device got no address");
                }
            }
            _ => {}
        }
    }

    /// Where new addresses come from (an HA pair's box, told by the pair's thread).
    pub fn set_share(&mut self, share: cyphonic_vip::Share) {
        for s in &mut self.v6 {
            s.server.set_share(share);
        }
        for s in &mut self.scopes {
            if s.server.share() != share {
                s.server.set_share(share);
            }
        }
    }

    /// Takes in the other box's bindings of both families (an HA pair after a split
    /// brain); returns whether any came in ([`Dhcp::settle`] applies them).
    pub fn merge(&mut self, theirs: cyphonic_vip::file::Table, unix: u64) -> bool {
        let leases = split(theirs.leases, self.scopes.iter().map(|s| s.block));
        let (mut taken, mut clashed) = (0, 0);
        for (s, leases) in self.scopes.iter_mut().zip(leases) {
            let (t, c) = s.server.merge(leases, unix);
            (taken, clashed) = (taken + t, clashed + c);
        }
        let leases6 = split6(theirs.leases6, self.v6.iter().map(|s| s.prefix));
        for (s, leases) in self.v6.iter_mut().zip(leases6) {
            let (t, c) = s.server.merge(leases, unix);
            (taken, clashed) = (taken + t, clashed + c);
        }
        if taken > 0 {
            tracing::warn!(
                taken,
                "HA: bindings the other box made while the two were apart taken in"
            );
        }
        if clashed > 0 {
            tracing::warn!(
                clashed,
                "HA: the other box bound addresses this box gave to other devices: ours stand, its devices get new addresses at their next renewal"
            );
        }
        taken > 0
    }

    /// Replaces the reservations (a reload): each scope takes those inside its block (the
    /// untagged one those in no VLAN's), the DHCPv6 server the fixed IPv6 addresses `v6`;
    /// [`Dhcp::settle`] applies what it changed.
    pub fn set_reservations(
        &mut self,
        reservations: Vec<cyphonic_vip::Reservation>,
        v6: &[cyphonic_vip::Reservation6],
    ) {
        let each6 = deal(v6.to_vec(), self.v6.iter().map(|s| s.prefix), |p, r| {
            p.contains(&r.ip)
        });
        for (s, r) in self.v6.iter_mut().zip(each6) {
            s.server.set_reservations(r);
        }
        let each = deal(reservations, self.scopes.iter().map(|s| s.block), |b, r| {
            b.contains(&r.ip)
        });
        for (s, r) in self.scopes.iter_mut().zip(each) {
            s.server.set_reservations(r);
        }
    }

    /// The active leases, every segment's.
    pub fn active(&self) -> impl Iterator<Item = &Lease> {
        self.scopes.iter().flat_map(|s| s.server.active())
    }

    /// The MACs with a DHCPv6 binding (every segment's), with the host name each gave.
    pub fn bound6(&self) -> HashMap<[u8; 6], Option<String>> {
        let mut bound: HashMap<[u8; 6], Option<String>> = HashMap::new();
        for l in self.v6.iter().flat_map(|s| s.server.active()) {
            let name = bound.entry(l.mac).or_default();
            if name.is_none() {
                name.clone_from(&l.hostname);
            }
        }
        bound
    }

    /// The part of the status document of the DHCPv6 server of the segment of `tag` (None:
    /// untagged), if it runs.
    pub fn status6(&self, tag: Option<u16>) -> Option<crate::status::Dhcp6Status> {
        let s = self.v6.iter().find(|s| s.tag == tag)?;
        Some(crate::status::Dhcp6Status {
            pool: format!("{}-{}", s.pool.0, s.pool.1),
            bindings: s.server.active().count(),
            stats: s.server.stats(),
            ignored_by_reason: by_reason(&s.ignored),
        })
    }

    /// The part of the status document of the segment of `tag` (None: untagged), if it has
    /// a scope.
    pub fn status(&self, tag: Option<u16>) -> Option<DhcpStatus> {
        let s = self.scopes.iter().find(|s| s.tag == tag)?;
        Some(DhcpStatus {
            pool: format!("{}-{}", s.pool.0, s.pool.1),
            lease_file: self.path.display().to_string(),
            unsaved: self.generation > self.written.generation,
            lease_writes: self.written.writes,
            lease_write_failures: self.written.failures,
            stats: s.server.stats(),
            ignored_by_reason: by_reason(&s.ignored),
        })
    }
}

/// Logs what the DHCPv6 server did.
fn log6(event: &Event6) {
    match event {
        Event6::Granted(l) => {
            tracing::debug!(vip6 = %l.ip, mac = %Mac(l.mac), "DHCPv6 binding made or renewed");
        }
        Event6::Released(l) => {
            tracing::info!(vip6 = %l.ip, mac = %Mac(l.mac), "DHCPv6 binding released");
        }
        Event6::Expired(l) => {
            tracing::info!(vip6 = %l.ip, mac = %Mac(l.mac), "DHCPv6 binding expired");
        }
        Event6::Declined { ip, mac } => {
            tracing::warn!(vip6 = %ip, mac = %Mac(*mac), "a device declined its IPv6 address: another host uses it; kept out of the pool for 10 minutes");
        }
        Event6::PoolExhausted { mac } => {
            tracing::debug!(mac = %Mac(*mac), "DHCPv6 pool exhausted");
        }
        Event6::StarvationGuard { mac } => {
            tracing::debug!(mac = %Mac(*mac), "DHCPv6: too many new clients at once (dhcp.new_lease_share)");
        }
        _ => {}
    }
}

/// Messages not answered, by reason, as the status document has them.
fn by_reason(ignored: &BTreeMap<&'static str, u64>) -> BTreeMap<String, u64> {
    ignored.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

/// `leases` dealt to the scopes of `blocks` by address (in no block: dropped).
pub fn split(leases: Vec<Lease>, blocks: impl Iterator<Item = ipnet::Ipv4Net>) -> Vec<Vec<Lease>> {
    deal(leases, blocks, |b, l| b.contains(&l.ip))
}

/// `leases6` dealt to the segments of `prefixes` by address (in none: dropped).
pub fn split6(
    leases6: Vec<cyphonic_vip::Lease6>,
    prefixes: impl Iterator<Item = ipnet::Ipv6Net>,
) -> Vec<Vec<cyphonic_vip::Lease6>> {
    deal(leases6, prefixes, |p, l| p.contains(&l.ip))
}

/// `items` dealt to `blocks`: each to the last block that `holds` it (the untagged
/// segment's comes first and holds the VLANs', which are more specific); one that no block
/// holds is dropped.
fn deal<T, B>(
    items: Vec<T>,
    blocks: impl Iterator<Item = B>,
    holds: impl Fn(&B, &T) -> bool,
) -> Vec<Vec<T>> {
    let blocks: Vec<B> = blocks.collect();
    let mut each: Vec<Vec<T>> = blocks.iter().map(|_| Vec::new()).collect();
    for item in items {
        if let Some(i) = blocks.iter().rposition(|b| holds(b, &item)) {
            each[i].push(item);
        }
    }
    each
}

#[cfg(test)]
mod tests {
    use cyphonic_vip::testing::{DhcpOption, MessageType, client_message};

    use super::*;

    fn config() -> DhcpConfig {
        DhcpConfig {
            server: Ipv4Addr::new(100, 64, 1, 1),
            block: "100.64.1.0/24".parse().unwrap(),
            pool: (
                Ipv4Addr::new(100, 64, 1, 100),
                Ipv4Addr::new(100, 64, 1, 199),
            ),
            lease_secs: 3600,
            mtu: 1420,
            domain: "gw1.ovl.example".into(),
            reservations: vec![],
            new_lease_share: 1.0,
            new_lease_window_secs: 60,
        }
    }

    fn request(mac: [u8; 6], xid: u32, ip: Ipv4Addr) -> Vec<u8> {
        client_message(
            MessageType::Request,
            mac,
            xid,
            vec![
                DhcpOption::ServerIdentifier(Ipv4Addr::new(100, 64, 1, 1)),
                DhcpOption::RequestedIpAddress(ip),
            ],
            Ipv4Addr::UNSPECIFIED,
            false,
        )
    }

    /// A DISCOVER from `mac`.
    fn discover(mac: [u8; 6]) -> Vec<u8> {
        client_message(
            MessageType::Discover,
            mac,
            1,
            vec![],
            Ipv4Addr::UNSPECIFIED,
            false,
        )
    }

    /// The offer `mac` gets (it promises nothing: it leaves at once).
    fn offered(d: &mut Dhcp, unix: u64, mac: [u8; 6], table: &LanTable) -> Ipv4Addr {
        let offer = d.handle(None, unix, mac, &discover(mac)).unwrap();
        d.settle(Instant::now(), unix, table);
        let ip = cyphonic_vip::testing::yiaddr(&offer.payload);
        assert!(matches!(
            d.admit((None, offer), mac, unix, Instant::now(), Replica::Alone),
            Verdict::Send(_)
        ));
        ip
    }

    /// The held ACKs released, with `replica`, once the writer has reported `what`, within
    /// five seconds.
    fn released_when(d: &mut Dhcp, replica: Replica, what: impl Fn(&Written) -> bool) -> Released {
        for _ in 0..100 {
            if what(&d.writer.written()) {
                return d.release(Instant::now(), replica);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the writer never got there: {:?}", d.writer.written());
    }

    fn dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cy-dhcp-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A trunk: the untagged segment's scope and VLAN 20's, one lease file. Each segment's
    /// device is bound in its own pool, both bindings go into the one file, and a restart
    /// gives each scope its own back: the camera is offered its address again on its VLAN.
    /// A segment without a scope gets no answer.
    #[test]
    fn every_segments_leases_go_into_the_one_file_and_come_back_to_it() {
        let dir = dir("scopes");
        let cams = DhcpConfig {
            server: Ipv4Addr::new(100, 64, 1, 193),
            block: "100.64.1.192/27".parse().unwrap(),
            pool: (
                Ipv4Addr::new(100, 64, 1, 194),
                Ipv4Addr::new(100, 64, 1, 222),
            ),
            ..config()
        };
        let untagged = DhcpConfig {
            pool: (
                Ipv4Addr::new(100, 64, 1, 100),
                Ipv4Addr::new(100, 64, 1, 150),
            ),
            ..config()
        };
        let scopes = [(None, &untagged), (Some(20), &cams)];
        let unix = 1_000_000;
        let table = LanTable::new(&[]);
        let mut d = Dhcp::open(&scopes, &[], &dir, unix).unwrap();
        let (laptop, cam) = ([2, 0, 0, 0, 0, 0x1a], [2, 0, 0, 0, 0, 0xca]);
        assert!(d.handle(Some(30), unix, cam, &discover(cam)).is_none());
        let laptop_ip = offered(&mut d, unix, laptop, &table);
        assert!((100..=150).contains(&laptop_ip.octets()[3]), "{laptop_ip}");
        let offer = d.handle(Some(20), unix, cam, &discover(cam)).unwrap();
        let cam_ip = cyphonic_vip::testing::yiaddr(&offer.payload);
        assert!((194..=222).contains(&cam_ip.octets()[3]), "{cam_ip}");
        let to_cams = client_message(
            MessageType::Request,
            cam,
            2,
            vec![
                DhcpOption::ServerIdentifier(cams.server),
                DhcpOption::RequestedIpAddress(cam_ip),
            ],
            Ipv4Addr::UNSPECIFIED,
            false,
        );
        let ack = d.handle(Some(20), unix, cam, &to_cams).unwrap();
        d.settle(Instant::now(), unix, &table);
        assert!(matches!(
            d.admit((Some(20), ack), cam, unix, Instant::now(), Replica::Alone),
            Verdict::Held
        ));
        let released = released_when(&mut d, Replica::Alone, |w| w.generation >= 1);
        assert_eq!(released.ready.len(), 1);
        assert_eq!(
            released.ready[0].0,
            Some(20),
            "the ACK goes to the camera's VLAN"
        );
        assert_eq!(table.leased_mac(cam_ip), Some(cam));
        drop(d);
        let file = std::fs::read(dir.join("leases.json")).unwrap();
        let kept = cyphonic_vip::file::decode(&file).unwrap();
        assert!(
            kept.leases
                .iter()
                .any(|l| l.ip == cam_ip && l.mac == cam && l.active)
        );
        // Back after a restart: the camera's binding is its VLAN's scope's.
        let mut d = Dhcp::open(&scopes, &[], &dir, unix + 5).unwrap();
        let other = [2, 0, 0, 0, 0, 0xcb];
        let offer = d
            .handle(Some(20), unix + 5, other, &discover(other))
            .unwrap();
        assert_ne!(
            cyphonic_vip::testing::yiaddr(&offer.payload),
            cam_ip,
            "the VLAN's scope knows the address is the camera's"
        );
        let offer = d.handle(Some(20), unix + 5, cam, &discover(cam)).unwrap();
        assert_eq!(cyphonic_vip::testing::yiaddr(&offer.payload), cam_ip);
        assert_eq!(d.active().filter(|l| l.ip == cam_ip).count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A DHCPv6 Reply that binds waits for the lease file like an ACK; the binding is in the
    /// one file beside the IPv4 ones, comes back when the server starts again, and its MAC
    /// holds the address in the anti-spoofing table.
    #[test]
    fn a_dhcpv6_binding_is_on_disk_before_its_reply_and_comes_back() {
        use cyphonic_gateway::Neighbors as _;
        use cyphonic_vip::testing::{MessageType6, client_message6, read_reply6};
        let dir = dir("dhcp6");
        let unix = 1_800_000_000;
        let gw = [0x02, 0, 0, 0, 0, 1];
        let prefix: ipnet::Ipv6Net = "fd7a:0:1:100::/64".parse().unwrap();
        let cfg6 = Dhcp6Config {
            prefix,
            pool: Dhcp6Config::default_pool(prefix),
            lease_secs: 3600,
            server_mac: gw,
            dns: None,
            domain: "gw1.ovl.example".into(),
            reservations: vec![],
            new_lease_share: 1.0,
            new_lease_window_secs: 60,
        };
        let mut d = Dhcp::open(&[(None, &config())], &[(None, cfg6.clone())], &dir, unix).unwrap();
        let table = LanTable::new(&[]);
        let mac = [0x02, 0xbb, 0, 0, 0, 7];
        let from = ("fe80::bb:ff:fe00:7".parse().unwrap(), 546);
        let sid = [&[0u8, 3, 0, 1][..], &gw].concat();
        let request = client_message6(
            MessageType6::Request,
            &[0, 4, 1, 2],
            &[(5, None)],
            Some(&sid),
        );
        let reply = d.handle6((None, unix), mac, from, &request).unwrap();
        let Answer::V6 { reply: r, .. } = &reply else {
            panic!("not a DHCPv6 answer")
        };
        let ip = r.grants[0];
        assert_eq!(read_reply6(&r.payload).unwrap().ias[0].1, Some(ip));
        d.settle(Instant::now(), unix, &table);
        assert_eq!(table.holder6(ip), Some(mac), "its MAC holds it");
        assert!(
            !table.heard6(ip, [0x02, 0xcc, 0, 0, 0, 9]),
            "nobody else may"
        );
        assert!(matches!(
            d.admit((None, reply), mac, unix, Instant::now(), Replica::Alone),
            Verdict::Held
        ));
        let generation = d.generation;
        let released = released_when(&mut d, Replica::Alone, |w| w.generation >= generation);
        assert_eq!(released.ready.len(), 1, "it leaves once written");
        drop(d);
        let d = Dhcp::open(
            &[(None, &config())],
            &[(None, cfg6.clone())],
            &dir,
            unix + 5,
        )
        .unwrap();
        let s = d.status6(None).unwrap();
        assert_eq!((s.bindings, s.stats.requests), (1, 0));
        let table = LanTable::new(&[]);
        let mut d = d;
        d.settle(Instant::now(), unix + 5, &table);
        assert_eq!(table.holder6(ip), Some(mac), "held again after the restart");
        // The other box of a pair bound a device while the two were apart: its binding
        // comes in, and its MAC holds the address; one of our address does not.
        let theirs = |duid: u8, ip: &str| cyphonic_vip::Lease6 {
            duid: vec![0, 4, duid],
            iaid: 1,
            mac: [0x02, 0xdd, 0, 0, 0, duid],
            ip: ip.parse().unwrap(),
            hostname: None,
            expires: unix + 600,
            active: true,
        };
        let apart = theirs(9, "fd7a:0:1:100::1f09");
        let table6 = cyphonic_vip::file::Table {
            peers: Vec::new(),
            leases: Vec::new(),
            leases6: vec![apart.clone(), theirs(8, &ip.to_string())],
        };
        assert!(d.merge(table6, unix + 5));
        d.settle(Instant::now(), unix + 5, &table);
        assert_eq!(table.holder6(apart.ip), Some(apart.mac));
        assert_eq!(table.holder6(ip), Some(mac), "ours stands");
        assert_eq!(d.status6(None).unwrap().bindings, 2);
        drop(d);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A new lease's ACK waits for the lease file; while the file cannot be written it never
    /// leaves (the client retries), and once the disk is back the retry's ACK leaves after
    /// the write.
    #[test]
    fn no_ack_leaves_for_a_lease_that_is_not_on_disk() {
        let dir = dir("unsaved");
        let unix = 1_800_000_000;
        let mut d = Dhcp::open(&[(None, &config())], &[], &dir, unix).unwrap();
        let table = LanTable::new(&[]);
        let mac = [0x02, 0xbb, 0, 0, 0, 7];
        let ip = offered(&mut d, unix, mac, &table);
        // The state directory goes away: writing fails.
        std::fs::remove_dir_all(&dir).unwrap();
        let ack = d.handle(None, unix, mac, &request(mac, 2, ip)).unwrap();
        assert_eq!(ack.grants, Some(ip));
        d.settle(Instant::now(), unix, &table);
        assert!(matches!(
            d.admit((None, ack), mac, unix, Instant::now(), Replica::Alone),
            Verdict::Held
        ));
        let released = released_when(&mut d, Replica::Alone, |w| w.failures >= 1);
        assert!(
            released.ready.is_empty(),
            "an ACK for a lease not on disk left"
        );
        assert!(d.status(None).unwrap().unsaved);
        // It waited long enough: dropped.
        let released = d.release(Instant::now() + HOLD, Replica::Alone);
        assert_eq!((released.ready.len(), released.dropped), (0, 1));
        // Back again: the client's retry waits for the write, then leaves.
        std::fs::create_dir_all(&dir).unwrap();
        let ack = d.handle(None, unix + 4, mac, &request(mac, 3, ip)).unwrap();
        d.settle(Instant::now(), unix + 4, &table);
        assert!(matches!(
            d.admit((None, ack), mac, unix + 4, Instant::now(), Replica::Alone),
            Verdict::Held
        ));
        let generation = d.generation;
        let released = released_when(&mut d, Replica::Alone, |w| w.generation >= generation);
        assert_eq!(released.ready.len(), 1);
        assert!(
            std::fs::read_to_string(dir.join("leases.json"))
                .unwrap()
                .contains(&ip.to_string())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Renewals of a lease on disk leave at once, and a burst of them is one or two writes,
    /// not one each; the file then says renewals may reach a lease time past it.
    #[test]
    fn renewals_leave_at_once_and_their_writes_are_coalesced() {
        let dir = dir("renewals");
        let unix = 1_800_000_000;
        let mut d = Dhcp::open(&[(None, &config())], &[], &dir, unix).unwrap();
        let table = LanTable::new(&[]);
        let mac = [0x02, 0xbb, 0, 0, 0, 8];
        let ip = offered(&mut d, unix, mac, &table);
        let ack = d.handle(None, unix, mac, &request(mac, 2, ip)).unwrap();
        d.settle(Instant::now(), unix, &table);
        assert!(matches!(
            d.admit((None, ack), mac, unix, Instant::now(), Replica::Alone),
            Verdict::Held
        ));
        let generation = d.generation;
        let released = released_when(&mut d, Replica::Alone, |w| w.generation >= generation);
        assert_eq!(released.ready.len(), 1);
        let writes = d.writer.written().writes;
        for n in 0..100 {
            let t = unix + 1;
            let ack = d.handle(None, t, mac, &request(mac, 10 + n, ip)).unwrap();
            d.settle(Instant::now(), t, &table);
            assert!(
                matches!(
                    d.admit((None, ack), mac, t, Instant::now(), Replica::Alone),
                    Verdict::Send(_)
                ),
                "renewal {n} waited"
            );
        }
        let generation = d.generation;
        released_when(&mut d, Replica::Alone, |w| w.generation >= generation);
        let burst = d.writer.written().writes - writes;
        assert!((1..=2).contains(&burst), "{burst} writes for 100 renewals");
        let text = std::fs::read_to_string(dir.join("leases.json")).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            doc["renewals_until"],
            unix + 1 + RENEWAL_WINDOW + 3600,
            "{text}"
        );
        drop(d);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// One of an HA pair with a standby in contact: a new lease's ACK waits, once on disk,
    /// until the standby holds a file with the binding; a renewal of a binding it holds
    /// leaves at once, one of a binding it lacks (it restarted) waits; an ACK the standby
    /// never acknowledges leaves [`STANDBY_WAIT`] after its write, counted; with no standby,
    /// nothing waits for one.
    #[test]
    fn a_new_leases_ack_waits_for_the_standby_to_hold_it_at_most_a_second() {
        let dir = dir("standby");
        let unix = 1_800_000_000;
        let mut d = Dhcp::open(&[(None, &config())], &[], &dir, unix).unwrap();
        let table = LanTable::new(&[]);
        let grant = |d: &mut Dhcp, mac: [u8; 6], xid: u32, replica: Replica| {
            let ip = offered(d, unix, mac, &table);
            let ack = d.handle(None, unix, mac, &request(mac, xid, ip)).unwrap();
            d.settle(Instant::now(), unix, &table);
            (ip, d.admit((None, ack), mac, unix, Instant::now(), replica))
        };
        let first = [0x02, 0xbb, 0, 0, 0, 9];
        let (ip, verdict) = grant(&mut d, first, 2, Replica::Holds(None));
        assert!(matches!(verdict, Verdict::Held));
        let generation = d.generation;
        // On disk, the standby holding an older file: it still waits.
        let released = released_when(&mut d, Replica::Holds(None), |w| w.generation >= generation);
        assert!(released.ready.is_empty(), "left before the standby held it");
        let held = d.release(Instant::now(), Replica::Holds(Some(generation - 1)));
        assert!(held.ready.is_empty());
        // The file the writer wrote is there for the pair's thread to send.
        let (g, file) = d.written_table().unwrap();
        assert_eq!(g, generation);
        assert!(String::from_utf8_lossy(&file).contains(&ip.to_string()));
        let released = d.release(Instant::now(), Replica::Holds(Some(generation)));
        assert_eq!((released.ready.len(), released.unreplicated), (1, 0));
        // Renewals: at once while the standby holds the binding, held while it does not.
        let renew = |d: &mut Dhcp, xid: u32, replica: Replica| {
            let ack = d
                .handle(None, unix + 1, first, &request(first, xid, ip))
                .unwrap();
            d.settle(Instant::now(), unix + 1, &table);
            d.admit((None, ack), first, unix + 1, Instant::now(), replica)
        };
        assert!(matches!(
            renew(&mut d, 3, Replica::Holds(Some(generation))),
            Verdict::Send(_)
        ));
        assert!(matches!(
            renew(&mut d, 4, Replica::Holds(None)),
            Verdict::Held
        ));
        let released = d.release(Instant::now(), Replica::Holds(Some(generation)));
        assert_eq!(released.ready.len(), 1, "the standby came to hold it");
        // A standby that never says it holds the binding: the ACK leaves a second after its
        // write, counted.
        let second = [0x02, 0xbb, 0, 0, 0, 10];
        let (_, verdict) = grant(&mut d, second, 5, Replica::Holds(None));
        assert!(matches!(verdict, Verdict::Held));
        let generation = d.generation;
        released_when(&mut d, Replica::Holds(None), |w| w.generation >= generation);
        let at = Instant::now();
        let waiting = d.release(at, Replica::Holds(None));
        assert!(waiting.ready.is_empty());
        let late = d.release(at + STANDBY_WAIT, Replica::Holds(None));
        assert_eq!((late.ready.len(), late.unreplicated), (1, 1));
        // Alone: a new lease waits for the disk only.
        let third = [0x02, 0xbb, 0, 0, 0, 11];
        let (_, verdict) = grant(&mut d, third, 6, Replica::Alone);
        assert!(matches!(verdict, Verdict::Held));
        let generation = d.generation;
        let released = released_when(&mut d, Replica::Alone, |w| w.generation >= generation);
        assert_eq!((released.ready.len(), released.unreplicated), (1, 0));
        drop(d);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

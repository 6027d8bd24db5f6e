//! The HA pair's edge (docs/protocol.md §5, `[ha]`): heartbeats and lease tables on the LAN
//! port, in a packet socket of its own that the kernel gives only the pair's Ethertype.
//!
//! A box of a pair first stands by ([`stand_by`]): it serves nothing, answers the other
//! box's challenges and keeps the lease file the active box sends, until the pair's decision
//! ([`cyphonic_ha::Pair`]) makes it active. Then the adapter starts as a lone one would, from
//! that lease file, and [`serve`] goes on with the heartbeats beside it, sending the lease
//! file whenever it changes. An active box that must stand down ends the process
//! ([`EXIT_STOOD_DOWN`]): every thread stops serving at once, and the service manager starts
//! it again, as a standby.
//!
//! A planned handover (`cyphonic-adapter handover`) comes in on the pair's control socket
//! ([`control_socket`]), beside the status socket; the box that takes the gateway so stays
//! quiet until its tunnels are up ([`Ready`]), while the old one goes on serving.

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::net::Ipv4Addr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use cyphonic_control::{PairBox, PairHealth, PairRole, PairState};
use cyphonic_crypto::PairKey;
use cyphonic_crypto::pair::random_16;
use cyphonic_ha::msg::{self, Body, ETHERTYPE, GROUP_MAC};
use cyphonic_ha::{Assembler, Config, Event, Health, Pair, Reason, Refused, Role};
use cyphonic_netio::cbpf::{jump_eq, load_half, ret};
use cyphonic_netio::{FrameMeta, Interface, PacketOptions, PacketSocket};

use crate::config::{AdapterConfig, HaSettings, Mac};
use crate::dhcp::Replica;
use crate::leases::LeaseStore;
use crate::status::{HaDrops, HaOther, HaReplication, HaStatus};

mod health;
mod link;
mod metrics;
mod pool;
mod reach;
mod standby;

pub use link::PairLink;
pub use metrics::HaCollector;

/// The health bits, their names in the status document and the metrics, and in the report
/// to the cloud, in the order of the heartbeat's bits.
const HEALTH_BITS: [(Health, &str, PairHealth); 4] = [
    (Health::LAN, "lan", PairHealth::Lan),
    (Health::UPLINK, "uplink", PairHealth::Uplink),
    (Health::DATA_PLANE, "data_plane", PairHealth::DataPlane),
    (Health::REACHED, "reached", PairHealth::Reached),
];

/// The names of the bits of `h` that are set.
fn health_names(h: Health) -> Vec<String> {
    HEALTH_BITS
        .iter()
        .filter(|(bit, ..)| h.has(*bit))
        .map(|(_, name, _)| (*name).to_owned())
        .collect()
}

/// The bits of `h` that are set, as the report to the cloud names them.
fn health_reported(h: Health) -> Vec<PairHealth> {
    HEALTH_BITS
        .iter()
        .filter(|(bit, ..)| h.has(*bit))
        .map(|(.., named)| *named)
        .collect()
}

/// A role as the status document names it, and as the report to the cloud does.
fn role_names(r: Role) -> (&'static str, PairRole) {
    match r {
        Role::Starting => ("starting", PairRole::Starting),
        Role::Standby => ("standby", PairRole::Standby),
        Role::Active => ("active", PairRole::Active),
    }
}

/// What the serving box reports of the pair to the cloud (docs/protocol.md §5, *Seen from
/// the cloud*), renewed by the pair's thread every round.
pub type Report = Arc<Mutex<PairState>>;

/// The exit status of an active box that stood down: not a failure of its own, but the
/// service manager restarts it (as a standby) as it would after one.
pub const EXIT_STOOD_DOWN: i32 = 75;

/// How often the active box sends its lease file unchanged anyway.
const LEASES_AGAIN: Duration = Duration::from_secs(10);
/// How soon again when the other box says it holds another version.
const LEASES_BEHIND: Duration = Duration::from_millis(500);
/// How often a box judges itself ([`health::Judge`]).
const HEALTH_LOOK: Duration = Duration::from_millis(100);
/// How long a box handed the gateway waits for its tunnels before it says it serves.
const READY_WAIT: Duration = Duration::from_secs(2);
/// When the gateway is announced again after the first time: the old active box may send a
/// last frame from the gateway MAC before it stands down.
const ANNOUNCE_AGAIN: Duration = Duration::from_millis(200);
/// How long a command on the control socket may take to arrive, and how many may wait.
const COMMAND_WAIT: Duration = Duration::from_secs(1);
const COMMANDS: usize = 4;
/// The control socket's one command.
pub const HANDOVER: &str = "handover";

/// The pair's control socket beside the status socket: `adapter.sock` -> `adapter.ha.sock`.
pub fn control_socket(status_socket: &Path) -> PathBuf {
    status_socket.with_extension("ha.sock")
}

/// `cyphonic-adapter handover`: asks the running box on the control socket beside
/// `status_socket` to hand the gateway over, and prints its answer once the handover ended.
///
/// # Errors
/// No box answers there, or it did not hand over (the answer says why).
#[expect(clippy::print_stdout, reason = "the handover command's answer")]
pub fn ask_handover(status_socket: &Path) -> anyhow::Result<()> {
    let path = control_socket(status_socket);
    let mut stream = UnixStream::connect(&path).with_context(|| {
        format!(
            "connecting to the pair's control socket {} (is this box one of an HA pair, running? are you root or its user?)",
            path.display()
        )
    })?;
    stream.set_read_timeout(Some(cyphonic_ha::pair::HANDOVER + Duration::from_secs(5)))?;
    stream.write_all(format!("{HANDOVER}\n").as_bytes())?;
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .context("reading the answer")?;
    let answer = answer.trim();
    if answer.starts_with("handed over") {
        println!("{answer}");
        Ok(())
    } else if answer.is_empty() {
        anyhow::bail!("the box closed the control socket without an answer (see its log)")
    } else {
        anyhow::bail!("{answer}")
    }
}

/// Whether the box handed the gateway has its tunnels up: a session with every static peer
/// (with none, with any peer). The services set it ([`ReadyWatch`]); the pair's thread reads it.
#[derive(Debug, Clone, Default)]
pub struct Ready(Arc<AtomicBool>);

impl Ready {
    fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The services' side of [`Ready`]: the static peers not up yet.
#[derive(Debug)]
pub struct ReadyWatch {
    ready: Ready,
    waiting: BTreeSet<u32>,
}

impl ReadyWatch {
    /// Waits for each of `peers` (static peer ids).
    pub fn new(ready: Ready, peers: impl IntoIterator<Item = u32>) -> Self {
        Self {
            ready,
            waiting: peers.into_iter().collect(),
        }
    }

    /// Peer `id` has keys.
    pub fn peer_up(&mut self, id: u32) {
        self.waiting.remove(&id);
        if self.waiting.is_empty() && !self.ready.is_set() {
            self.ready.0.store(true, Ordering::Release);
            tracing::info!("HA: the tunnels are up");
        }
    }
}

/// The pair's MAC for the gateway: the same on both boxes, from the gateway vIP (`02:63:79`
/// and its last three bytes), so that no device re-ARPs when the gateway moves.
pub const fn gateway_mac(gateway: Ipv4Addr) -> [u8; 6] {
    let o = gateway.octets();
    [0x02, 0x63, 0x79, o[1], o[2], o[3]]
}

/// One box's part of the pair.
pub struct HaBox {
    socket: PacketSocket,
    /// The underlay path: our UDP socket and the other box's address.
    underlay: Option<(std::net::UdpSocket, std::net::SocketAddr)>,
    iface: String,
    nic: [u8; 6],
    gateway: [u8; 6],
    pair: Pair,
    /// Our messages sealed and the other box's opened, in the version the two share.
    messages: msg::Link,
    assembler: Assembler,
    /// The state directory's lease file: what the standby keeps, and the active box sends
    /// first (the DHCP server's writer reports each file it writes after that: [`PairLink`]).
    leases: LeaseStore,
    /// The generation of the lease file last sent, and when.
    sent: Option<(u64, Instant)>,
    /// The tables sent, by version: what the standby's heartbeats acknowledge.
    tables: link::Sent,
    /// Its judge of itself, and when it last judged.
    judge: health::Judge,
    health_at: Instant,
    /// What the DHCP server is told: its share of the pool, the other's bindings, what the
    /// standby holds; and what it tells: each lease file written.
    link: PairLink,
    /// Our bindings the serving box lacks (offered while standing by), and whether to send
    /// them: the table to send.
    offer: pool::Offer,
    offer_due: Option<Vec<u8>>,
    /// How many of the other box's tables were handed to the DHCP server to take in.
    merges: u64,
    /// The state directory, where the other box's MAC is kept, and the MAC kept there.
    state_dir: PathBuf,
    other_kept: Option<[u8; 6]>,
    /// Whether a message of another pair version was logged (once).
    version_warned: bool,
    /// Messages dropped, and copies.
    dropped: HaDrops,
    copies: u64,
    /// When the other box's last heartbeat came.
    heard: Option<Instant>,
    /// Why the role is what it is.
    reason: &'static str,
    /// The control socket, and the commands that came but were not read whole yet.
    control: Control,
    /// Handed the gateway: quiet until the tunnels are up, or until this instant.
    quiet_until: Option<Instant>,
    ready: Ready,
    /// When to announce the gateway next, and whether once more after that.
    announce_at: Option<(Instant, bool)>,
    /// The gateway vIP.
    gateway_vip: Ipv4Addr,
    /// Each VLAN segment's gateway address, with its tag.
    vlan_gateways: Vec<(u16, Ipv4Addr)>,
    /// What the status document shows, renewed every round.
    status: Arc<Mutex<HaStatus>>,
    /// What the serving box reports to the cloud, renewed every round.
    report: Report,
    /// Once serving: until when the data plane may speak for the gateway, renewed at the
    /// end of each round that leaves this box active ([`HaBox::renew`]).
    mandate: Option<Arc<cyphonic_ha::Mandate>>,
    /// When the mandate is renewed.
    renewal: cyphonic_ha::Renewal,
    /// While standing by, the status socket (the daemon serves it once the box serves).
    standby_status: Option<standby::StandbyStatus>,
    /// While standing by, the pair's metrics on the `[metrics]` address (the daemon's
    /// endpoint takes the address once the box serves).
    standby_metrics: Option<cyphonic_telemetry::metrics::Endpoint>,
    frame: Vec<u8>,
    body: Vec<u8>,
}

impl std::fmt::Debug for HaBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaBox")
            .field("iface", &self.iface)
            .field("role", &self.pair.role())
            .field("term", &self.pair.term())
            .finish_non_exhaustive()
    }
}

/// Stands by until this box is to serve: returns it then, active.
///
/// # Errors
/// The LAN port is missing, the socket cannot be opened (privileges), the site key has no
/// pair key, or sending fails.
pub fn stand_by(
    config: &AdapterConfig,
    ha: &HaSettings,
    identity: &cyphonic_settings::Identity,
) -> anyhow::Result<HaBox> {
    if Interface::bring_up(&config.lan_interface)? {
        tracing::info!(interface = %config.lan_interface, "the LAN port was down: brought up");
    }
    let iface = Interface::lookup_up(&config.lan_interface)?;
    // Closed to this host's kernel while standing by too (the edge checks again).
    if let Err(e) = crate::port_guard::PortGuard::new(&iface.name, iface.index).enforce() {
        tracing::warn!(error = %e, "cannot close the LAN port to this host's kernel entirely");
    }
    // The kernel gives this socket the pair's frames and nothing else.
    let filter = vec![
        load_half(12),
        jump_eq(u32::from(ETHERTYPE), 0, 1),
        ret(u32::MAX),
        ret(0),
    ];
    let socket = PacketSocket::open(
        &iface,
        &PacketOptions {
            recv_buffer: 1 << 20,
            filter: Some(filter),
            ..PacketOptions::default()
        },
    )?;
    let underlay = match ha.peer_underlay {
        Some(peer) => {
            let sock = std::net::UdpSocket::bind((std::net::Ipv6Addr::UNSPECIFIED, ha.port))
                .with_context(|| format!("binding the pair's UDP port {}", ha.port))?;
            sock.set_nonblocking(true)?;
            Some((sock, std::net::SocketAddr::new(peer, ha.port)))
        }
        None => None,
    };
    // Fails here, not at the first lease table, when the state directory is not writable.
    let leases = LeaseStore::open(&config.state_dir).with_context(|| {
        format!(
            "the state directory {} (adapter.state_dir)",
            config.state_dir.display()
        )
    })?;
    let control = Control::bind(&control_socket(&config.common.status_socket))?;
    let standby_status = standby::StandbyStatus::bind(config, identity)?;
    let key = PairKey::new(identity.keypair()).context("the site key has no pair key")?;
    let boot = random_16().map_err(|_| anyhow::anyhow!("the random number generator failed"))?;
    let mut judge = health::Judge::new(config, &iface.name, iface.index);
    let unix = cyphonic_settings::now_secs();
    let saved = leases
        .load(unix)
        .map(|l| cyphonic_vip::file::Table {
            leases: l.leases,
            leases6: l.leases6,
            peers: Vec::new(),
        })
        .unwrap_or_default();
    let scopes = config
        .dhcp_scopes()
        .into_iter()
        .map(|(_, c)| c.clone())
        .collect();
    let scopes6 = config
        .dhcp6_scopes(iface.mac)
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    let offer = pool::Offer::new(scopes, scopes6, saved, unix);
    let other_kept = pool::load_other(&config.state_dir);
    let now = Instant::now();
    let mut pair = Pair::new(
        Config {
            priority: ha.priority,
            preempt: ha.preempt,
            mac: iface.mac,
        },
        judge.health(None, now),
        now,
    );
    if let Some(mac) = other_kept {
        pair.know_other(mac);
    }
    let mut b = HaBox {
        socket,
        underlay,
        iface: iface.name.clone(),
        nic: iface.mac,
        gateway: gateway_mac(config.gateway_vip),
        pair,
        messages: msg::Link::new(key, boot),
        assembler: Assembler::default(),
        leases,
        sent: None,
        tables: link::Sent::default(),
        judge,
        health_at: now,
        link: PairLink::default(),
        offer,
        offer_due: None,
        merges: 0,
        state_dir: config.state_dir.clone(),
        other_kept,
        version_warned: false,
        dropped: HaDrops::default(),
        copies: 0,
        heard: None,
        reason: "starting",
        control,
        quiet_until: None,
        ready: Ready::default(),
        announce_at: None,
        gateway_vip: config.gateway_vip,
        vlan_gateways: config.vlans.iter().map(|v| (v.tag, v.gateway)).collect(),
        status: Arc::new(Mutex::new(HaStatus::default())),
        mandate: None,
        renewal: cyphonic_ha::Renewal::default(),
        report: Arc::new(Mutex::new(PairState {
            term: 0,
            reason: String::new(),
            boxes: Vec::new(),
        })),
        standby_status: Some(standby_status),
        standby_metrics: None,
        frame: Vec::with_capacity(1600),
        body: Vec::with_capacity(1600),
    };
    if let Some(addr) = config.common.metrics {
        let collector = HaCollector::new(b.status.clone());
        b.standby_metrics = Some(
            cyphonic_telemetry::metrics::start(
                addr,
                cyphonic_telemetry::build!(crate::PROGRAM),
                vec![Box::new(collector)],
            )
            .with_context(|| format!("opening the metrics endpoint {addr} ([metrics] listen)"))?,
        );
    }
    tracing::info!(interface = %b.iface, mac = %Mac(b.nic), priority = ha.priority, preempt = ha.preempt, "HA: standing by until the pair decides");
    loop {
        for e in b.step()? {
            match e {
                Event::Active { term, reason } => {
                    tracing::warn!(
                        term,
                        reason = reason.describe(),
                        "HA: this box serves the gateway"
                    );
                    // Handed the gateway: the old active serves until our tunnels are up.
                    // Else at once, once the edge captures (`serve`).
                    if reason == Reason::HandedOver {
                        b.quiet_until = Some(Instant::now() + READY_WAIT);
                    }
                    // The daemon's status socket and metrics endpoint take the standby's
                    // places.
                    b.standby_status = None;
                    b.standby_metrics = None;
                    return Ok(b);
                }
                Event::Standby { reason } => {
                    tracing::info!(reason = reason.describe(), "HA: standing by");
                }
            }
        }
    }
}

/// Goes on as the active box, on a thread of its own, once the edge captures the LAN:
/// announces the gateway (at once, or, when handed the gateway, once the tunnels are up:
/// [`HaBox::ready`]), and ends the process if it must stand down.
///
/// # Errors
/// The thread cannot be started.
pub fn serve(
    mut b: HaBox,
    mandate: Arc<cyphonic_ha::Mandate>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    // The pair just made this box the active one: its data plane may speak for `dead`, and
    // for as long after as each round renews it.
    mandate.renew(Instant::now() + cyphonic_ha::pair::DEAD);
    b.mandate = Some(mandate);
    if b.quiet_until.is_none() {
        b.announce_at = Some((Instant::now(), true));
    }
    // The lease file the DHCP server started from (generation 0): the standby's first table,
    // unless the server's writer has written a newer one already.
    if let Ok(table) = std::fs::read(b.leases.path()) {
        b.link.publish_table(0, table.into());
    }
    Ok(std::thread::Builder::new()
        .name("ha".into())
        .spawn(move || {
            loop {
                match b.step() {
                    Ok(events) => {
                        for e in events {
                            if let Event::Standby { reason } = e {
                                if reason == Reason::HandedOver {
                                    tracing::warn!("HA: handed over: this box stops serving and starts again as the standby");
                                    let text = b.handed_over_text();
                                    b.control.answer_handover(&text);
                                } else {
                                    tracing::error!(reason = reason.describe(), "HA: standing down: this box stops serving and starts again as the standby");
                                }
                                std::process::exit(EXIT_STOOD_DOWN);
                            }
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "HA: the pair's socket failed; standing down");
                        std::process::exit(EXIT_STOOD_DOWN);
                    }
                }
            }
        })?)
}

impl HaBox {
    /// The newest wall clock (since the unix epoch) the other box's proofs of life carried,
    /// if any: our handshakes are to be newer (docs/protocol.md §5).
    pub fn other_clock(&self) -> Option<Duration> {
        let ns = self.pair.newest_clock_ns();
        (ns > 0).then(|| Duration::from_nanos(ns))
    }

    /// One round: decide, send what is due, read what came (waiting up to the socket's
    /// receive timeout). Returns the role changes.
    fn step(&mut self) -> anyhow::Result<Vec<Event>> {
        let now = Instant::now();
        if now.duration_since(self.health_at) >= HEALTH_LOOK {
            self.health_at = now;
            let pulses = self.link.data_plane();
            let health = self.judge.health(pulses.as_ref(), now);
            self.pair.set_health(health, now);
        }
        self.pair.handle_timeout(now);
        self.share_pool(now);
        self.replicate(now);
        if let Some(until) = self.quiet_until
            && (self.ready.is_set() || now >= until)
        {
            if !self.ready.is_set() {
                tracing::warn!("HA: the tunnels are not all up after 2 s; serving anyway");
            }
            self.quiet_until = None;
            self.announce_at = Some((now, true));
        }
        if self.quiet_until.is_none() {
            let challenge =
                random_16().map_err(|_| anyhow::anyhow!("the random number generator failed"))?;
            if let Some(beat) = self.pair.poll_transmit(now, wall_ns(), challenge) {
                self.send(&Body::Heartbeat(beat))?;
            }
            if self.pair.role() == Role::Active {
                self.send_leases(now)?;
            } else if let Some(table) = self.offer_due.take() {
                for chunk in msg::chunks(version_of(&table), &table) {
                    self.send(&Body::Leases(chunk))?;
                }
            }
        }
        // The other box says it serves too (it resumed, or hands over and has not stood
        // down yet): the switches are to keep the gateway MAC on our port.
        if self.pair.role() == Role::Active
            && self.quiet_until.is_none()
            && self.announce_at.is_none()
            && self.claims_active(now)
        {
            self.announce_at = Some((now + cyphonic_ha::pair::INTERVAL, false));
        }
        if let Some((at, again)) = self.announce_at
            && now >= at
        {
            self.announce()?;
            self.announce_at = again.then(|| (now + ANNOUNCE_AGAIN, false));
        }
        self.commands(now);
        self.receive(now)?;
        let mut events = Vec::new();
        while let Some(e) = self.pair.poll_event() {
            self.reason = match e {
                Event::Active { reason, .. } | Event::Standby { reason } => reason.describe(),
            };
            events.push(e);
        }
        self.publish(now);
        let stands_down = events.iter().any(|e| matches!(e, Event::Standby { .. }));
        self.renew(now, stands_down);
        // A box about to serve answers no more: the daemon's document will say it serves.
        if let Some(s) = self
            .standby_status
            .as_mut()
            .filter(|_| self.pair.role() != Role::Active)
        {
            let ha = self
                .status
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            s.answer(&ha, &self.leases);
        }
        Ok(events)
    }

    /// Renews the mandate at the end of a round that began at `now`, as
    /// [`cyphonic_ha::Renewal`] says.
    fn renew(&mut self, now: Instant, stands_down: bool) {
        let serving = !stands_down && self.pair.role() == Role::Active;
        if let Some(until) = self.renewal.round(now, Instant::now(), serving)
            && let Some(m) = &self.mandate
        {
            m.renew(until);
        }
    }

    /// Where the services say the tunnels are up ([`ReadyWatch`]).
    pub fn ready(&self) -> Ready {
        self.ready.clone()
    }

    /// What the pair's thread and the DHCP server tell each other ([`PairLink`]).
    pub fn link(&self) -> PairLink {
        self.link.clone()
    }

    /// Tells the DHCP server whether a standby is to hold each new lease, and what it holds:
    /// the file whose version its last heartbeat names, while it is in contact and stands by
    /// and we serve.
    fn replicate(&mut self, now: Instant) {
        let replica = match self.pair.other() {
            Some((_, beat))
                if self.pair.role() == Role::Active
                    && beat.role == Role::Standby
                    && self.pair.in_contact(now) =>
            {
                Replica::Holds(self.tables.holds(beat.leases_version))
            }
            _ => Replica::Alone,
        };
        self.link.set_replica(replica);
    }

    /// Tells the DHCP server its share of the pool now, and keeps the other box's MAC on
    /// disk once known or changed.
    fn share_pool(&mut self, now: Instant) {
        let share = pool::share(self.pair.lower_half(), self.pair.in_contact(now));
        let before = self.link.share();
        if share != before {
            self.link.set_share(share);
            if self.pair.role() != Role::Active {
                tracing::debug!(pool = pool::describe(share), "HA: new DHCP addresses");
            } else if matches!(share, cyphonic_vip::Share::Only(_)) {
                tracing::warn!(
                    pool = pool::describe(share),
                    "HA: out of contact with the other box: new DHCP addresses come from this box's half of the pool only"
                );
            } else {
                tracing::info!(pool = pool::describe(share), "HA: new DHCP addresses");
            }
        }
        let known = self.pair.known_other();
        if known != self.other_kept
            && let Some(mac) = known
        {
            pool::save_other(&self.state_dir, mac);
            self.other_kept = known;
        }
    }

    /// The status document's part, for the status socket once this box serves; and what
    /// it reports of the pair to the cloud.
    pub fn status(&self) -> (Arc<Mutex<HaStatus>>, Report) {
        (self.status.clone(), self.report.clone())
    }

    fn publish(&self, now: Instant) {
        let role = |r: Role| role_names(r).0;
        let in_contact = self.pair.in_contact(now);
        let other = self.pair.other().map(|(mac, beat)| HaOther {
            mac: Mac(mac).to_string(),
            role: role(beat.role).to_owned(),
            term: beat.term,
            priority: beat.priority,
            health: health_names(beat.health),
            heard_ms_ago: self.heard.map_or(u64::MAX, |t| {
                u64::try_from(now.duration_since(t).as_millis()).unwrap_or(u64::MAX)
            }),
            in_contact,
        });
        let status = HaStatus {
            role: role(self.pair.role()).to_owned(),
            term: self.pair.term(),
            priority: self.pair.config().priority,
            health: health_names(self.pair.health()),
            reason: self.reason.to_owned(),
            lease_table_version: self.pair.leases_version(),
            other,
            dropped: self.dropped,
            copies: self.copies,
            pool: pool::describe(self.link.share()).to_owned(),
            merges: self.merges,
            replication: self.replication(now),
        };
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = status;
        let config = self.pair.config();
        let mut boxes = vec![PairBox {
            mac: cyphonic_control::Mac(config.mac),
            role: role_names(self.pair.role()).1,
            priority: config.priority,
            health: health_reported(self.pair.health()),
            in_contact: true,
        }];
        boxes.extend(self.pair.other().map(|(mac, beat)| PairBox {
            mac: cyphonic_control::Mac(mac),
            role: role_names(beat.role).1,
            priority: beat.priority,
            health: health_reported(beat.health),
            in_contact,
        }));
        *self.report.lock().unwrap_or_else(PoisonError::into_inner) = PairState {
            term: self.pair.term(),
            reason: self.reason.to_owned(),
            boxes,
        };
    }

    /// How far behind the standby is, while it is to hold each new lease.
    fn replication(&self, now: Instant) -> Option<HaReplication> {
        let Replica::Holds(held) = self.link.replica() else {
            return None;
        };
        let written = self.link.table().map_or(0, |(g, _)| g);
        Some(HaReplication {
            written,
            standby_holds: held,
            behind: held.map(|h| written.saturating_sub(h)),
            lag_ms: u64::try_from(self.tables.lag(held, now).as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// Commands on the control socket: a handover is asked of the pair (and answered now
    /// when refused); one asked and not taken in time is answered so.
    fn commands(&mut self, now: Instant) {
        for command in self.control.take(now) {
            match command {
                Command::Handover(stream) => match self.pair.hand_over(now) {
                    Ok(()) => {
                        tracing::warn!(
                            "HA: handing the gateway over to the other box (asked on the control socket)"
                        );
                        self.control.handover = Some((stream, now));
                    }
                    Err(why) => {
                        tracing::info!(why = why.describe(), "HA: handover refused");
                        Control::answer(stream, &format!("refused: {}\n", why.describe()));
                    }
                },
                Command::Unknown(stream, what) => {
                    Control::answer(stream, &format!("refused: unknown command {what:?}\n"));
                }
            }
        }
        if self
            .control
            .handover
            .as_ref()
            .is_some_and(|_| !self.pair.is_handing_over(now))
        {
            tracing::warn!("HA: the other box did not take the gateway; this box goes on serving");
            self.control.answer_handover(
                "not handed over: the other box did not take the gateway in 3 s; this box goes on serving\n",
            );
        }
    }

    /// Whether the other box's last heartbeat, of the last two intervals, says it serves.
    fn claims_active(&self, now: Instant) -> bool {
        self.heard
            .is_some_and(|t| now.duration_since(t) <= 2 * cyphonic_ha::pair::INTERVAL)
            && self
                .pair
                .other()
                .is_some_and(|(_, beat)| beat.role == Role::Active)
    }

    fn handed_over_text(&self) -> String {
        let took = self
            .control
            .handover
            .as_ref()
            .map_or(0, |(_, at)| at.elapsed().as_millis());
        let to = self.pair.other().map_or_else(
            || "the other box".to_owned(),
            |(mac, _)| Mac(mac).to_string(),
        );
        format!("handed over to {to} in {took} ms\n")
    }

    /// The gateway's announcement from the pair's gateway MAC (a gratuitous ARP), on the
    /// untagged segment and, tagged, on each VLAN's for its gateway address: switches learn
    /// its new port (on every VLAN), devices keep their entries.
    fn announce(&self) -> anyhow::Result<()> {
        let segments = std::iter::once((None, self.gateway_vip))
            .chain(self.vlan_gateways.iter().map(|(t, g)| (Some(*t), *g)));
        for (tag, gateway) in segments {
            let mut frame = [0u8; 64 + cyphonic_gateway::VLAN_TAG_LEN];
            let n = cyphonic_gateway::announcement(self.gateway, gateway, &mut frame[..64])
                .context("the announcement does not fit")?;
            let frame = match tag {
                None => Some(0..n),
                Some(vid) => cyphonic_gateway::tag_frame(&mut frame, 0..n, vid),
            }
            .and_then(|f| frame.get(f))
            .context("the announcement does not fit")?;
            self.socket
                .send(frame)
                .context("sending the gateway's announcement")?;
        }
        Ok(())
    }

    fn send(&mut self, body: &Body<'_>) -> anyhow::Result<()> {
        self.messages.seal(body, &mut self.body);
        self.frame.clear();
        self.frame.extend_from_slice(&GROUP_MAC);
        self.frame.extend_from_slice(&self.nic);
        self.frame.extend_from_slice(&ETHERTYPE.to_be_bytes());
        self.frame.extend_from_slice(&self.body);
        // Best effort on each path: a LAN link down is for the pair to judge, not an error.
        if let Err(e) = self.socket.send(&self.frame) {
            tracing::debug!(error = %e, "HA: sending on the LAN failed");
        }
        if let Some((sock, peer)) = &self.underlay
            && let Err(e) = sock.send_to(&self.body, peer)
        {
            tracing::debug!(error = %e, %peer, "HA: sending on the underlay failed");
        }
        Ok(())
    }

    /// The lease file to the standby each time the DHCP server's writer wrote it, and again
    /// every [`LEASES_AGAIN`] (every [`LEASES_BEHIND`] while the standby says it holds
    /// another).
    fn send_leases(&mut self, now: Instant) -> anyhow::Result<()> {
        let Some((generation, table)) = self.link.table() else {
            return Ok(());
        };
        // The other box says it holds another version (it just started, or lost chunks):
        // again soon, not only at the next change or in 10 s.
        let behind = self.pair.other().is_some_and(|(_, beat)| {
            beat.role != Role::Active && beat.leases_version != self.pair.leases_version()
        });
        let again = if behind { LEASES_BEHIND } else { LEASES_AGAIN };
        let unchanged = self
            .sent
            .is_some_and(|(g, at)| g == generation && now.duration_since(at) < again);
        if unchanged {
            return Ok(());
        }
        let version = version_of(&table);
        for chunk in msg::chunks(version, &table) {
            self.send(&Body::Leases(chunk))?;
        }
        self.pair.set_leases_version(version, now);
        self.tables.sent(version, generation, now);
        self.sent = Some((generation, now));
        Ok(())
    }

    /// What came on both paths: up to a batch of frames from the LAN (waiting up to the
    /// socket's receive timeout for the first), then every datagram queued on the underlay.
    fn receive(&mut self, now: Instant) -> anyhow::Result<()> {
        const BATCH: usize = 16;
        let mut bufs = [[0u8; 1600]; BATCH];
        let mut meta = [FrameMeta::default(); BATCH];
        let n = {
            let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            self.socket
                .recv_batch(&mut views, &mut meta)
                .context("reading the pair's socket")?
        };
        for (buf, meta) in bufs.iter().zip(&meta).take(n) {
            if meta.truncated || meta.outgoing || meta.len < 14 {
                continue;
            }
            let frame = &buf[..meta.len];
            let mut src = [0u8; 6];
            src.copy_from_slice(&frame[6..12]);
            // Judged by its own addresses first: ours or the gateway's is never the other box;
            // and the pair speaks untagged: a frame from a VLAN is a device's.
            if src == self.nic || src == self.gateway || src[0] & 1 == 1 || meta.vlan.is_some() {
                self.dropped.source += 1;
                continue;
            }
            self.take(&frame[14..], Some(src), now);
        }
        let mut datagram = [0u8; 1600];
        while let Some((sock, peer)) = &self.underlay {
            let (len, from) = match sock.recv_from(&mut datagram) {
                Ok(got) => got,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e).context("reading the pair's UDP socket"),
            };
            // Only from the other box's address, whatever the message says.
            if from.ip().to_canonical() != peer.ip().to_canonical() {
                tracing::debug!(%from, "HA: datagram from another address dropped");
                self.dropped.source += 1;
                continue;
            }
            let msg = datagram[..len].to_vec();
            self.take(&msg, None, now);
        }
        Ok(())
    }

    /// One message of the other box's, from the LAN MAC `src` (`None`: the underlay).
    fn take(&mut self, msg: &[u8], src: Option<[u8; 6]>, now: Instant) {
        match self.messages.open(msg) {
            Ok((boot, Body::Heartbeat(beat))) => {
                // On the LAN, the frame comes from the NIC the heartbeat names.
                if src.is_some_and(|s| s != beat.nic) || beat.nic == self.nic {
                    self.dropped.source += 1;
                    return;
                }
                self.heard = Some(now);
                self.pair.handle(beat.nic, boot, &beat, now);
            }
            Ok((_, Body::Leases(chunk))) => {
                let Some((version, table)) = self.assembler.take(&chunk) else {
                    return;
                };
                if self.pair.role() == Role::Active {
                    self.take_in(&table);
                } else {
                    self.keep_leases(version, table);
                }
            }
            Err(e) => {
                let d = &mut self.dropped;
                *match e {
                    // The same message on the other path is a copy: that is no news.
                    Refused::Replay => &mut self.copies,
                    Refused::Malformed => &mut d.malformed,
                    Refused::Version(_) => &mut d.version,
                    Refused::Tag => &mut d.tag,
                    Refused::Unknown => &mut d.unknown,
                } += 1;
                if matches!(e, Refused::Version(_)) && !self.version_warned {
                    self.version_warned = true;
                    tracing::warn!(error = %e, ours = ?msg::OURS, "HA: the other box speaks no pair version of ours: the two cannot pair (upgrade the older one)");
                } else if e != Refused::Replay {
                    tracing::debug!(error = %e, "HA: message dropped");
                }
            }
        }
    }

    /// The other box's lease table came while we serve: its bindings are for the DHCP
    /// server to take in (those it made apart from us; the rest are ours already).
    fn take_in(&mut self, table: &[u8]) {
        match cyphonic_vip::file::decode(table) {
            Ok(table) => {
                self.merges += 1;
                self.link.offer_merge(table);
            }
            Err(e) => {
                self.dropped.malformed += 1;
                tracing::debug!(error = %e, "HA: the other box's lease table does not read");
            }
        }
    }

    /// Writes the active box's lease table, if it reads as one, in place of ours (with the
    /// bindings we made apart from it that it lacks, which are offered to it).
    fn keep_leases(&mut self, version: u64, table: Vec<u8>) {
        let (table, offer) = self.offer.against(table, cyphonic_settings::now_secs());
        if offer.is_some() {
            self.offer_due = offer;
        }
        match self.leases.save_file(&table) {
            Ok(()) => {
                self.pair.set_leases_version(version, Instant::now());
                tracing::debug!(version, "HA: the active box's lease table kept");
            }
            Err(e) => tracing::warn!(error = %e, "HA: the active box's lease table not kept"),
        }
    }
}

/// A command that came on the control socket.
enum Command {
    Handover(UnixStream),
    Unknown(UnixStream, String),
}

/// The pair's control socket (mode 0600, like the status socket): a client sends one line,
/// the command, and reads the answer. Read without blocking the pair's thread.
struct Control {
    listener: UnixListener,
    path: PathBuf,
    /// Connections whose line has not come whole yet, with what came and since when.
    pending: Vec<(UnixStream, Vec<u8>, Instant)>,
    /// The handover asked, to answer when it ends.
    handover: Option<(UnixStream, Instant)>,
}

impl Control {
    fn bind(path: &Path) -> anyhow::Result<Self> {
        let open = || -> std::io::Result<UnixListener> {
            let listener = cyphonic_telemetry::status::bind_private(path)?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        };
        let listener = open()
            .with_context(|| format!("opening the pair's control socket {}", path.display()))?;
        Ok(Self {
            listener,
            path: path.to_owned(),
            pending: Vec::new(),
            handover: None,
        })
    }

    /// The commands that came whole; connections that sent nothing in [`COMMAND_WAIT`] are
    /// closed, and no more than [`COMMANDS`] wait.
    fn take(&mut self, now: Instant) -> Vec<Command> {
        while let Ok((stream, _)) = self.listener.accept() {
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            if self.pending.len() == COMMANDS {
                self.pending.remove(0);
            }
            self.pending.push((stream, Vec::new(), now));
        }
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            let (stream, got, since) = &mut self.pending[i];
            let mut buf = [0u8; 64];
            let complete = loop {
                match stream.read(&mut buf) {
                    Ok(0) => break true,
                    Ok(n) => {
                        got.extend_from_slice(&buf[..n]);
                        if got.contains(&b'\n') || got.len() > 64 {
                            break true;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                    Err(_) => break true,
                }
            };
            if complete || now.duration_since(*since) >= COMMAND_WAIT {
                let (stream, got, _) = self.pending.remove(i);
                let line = String::from_utf8_lossy(&got);
                let what = line.lines().next().unwrap_or("").trim().to_owned();
                done.push(if what == HANDOVER {
                    Command::Handover(stream)
                } else {
                    Command::Unknown(stream, what)
                });
            } else {
                i += 1;
            }
        }
        done
    }

    /// Answers the handover asked, if any.
    fn answer_handover(&mut self, text: &str) {
        if let Some((stream, _)) = self.handover.take() {
            Self::answer(stream, text);
        }
    }

    fn answer(mut stream: UnixStream, text: &str) {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
        let _ = stream.write_all(text.as_bytes());
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A table's version: its hash (the standby says which it holds; equal tables, equal
/// versions).
fn version_of(table: &[u8]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    table.hash(&mut h);
    h.finish()
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// The control socket reads a command however it comes (whole, in pieces, without its
    /// newline before the client closes), calls anything else unknown, closes a silent
    /// connection after [`COMMAND_WAIT`], and keeps no more than [`COMMANDS`] waiting.
    #[test]
    fn the_control_socket_reads_each_command_without_blocking() {
        let dir = std::env::temp_dir().join(format!("cy-ha-control-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = control_socket(&dir.join("adapter.sock"));
        assert_eq!(path, dir.join("adapter.ha.sock"));
        let mut control = Control::bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let t0 = Instant::now();
        let kinds = |cs: Vec<Command>| -> Vec<String> {
            cs.into_iter()
                .map(|c| match c {
                    Command::Handover(_) => "handover".to_owned(),
                    Command::Unknown(_, what) => format!("unknown {what}"),
                })
                .collect()
        };
        let mut whole = UnixStream::connect(&path).unwrap();
        whole.write_all(b"handover\n").unwrap();
        let mut pieces = UnixStream::connect(&path).unwrap();
        pieces.write_all(b"hand").unwrap();
        let mut closed = UnixStream::connect(&path).unwrap();
        closed.write_all(b"handover").unwrap();
        closed.shutdown(std::net::Shutdown::Write).unwrap();
        let mut other = UnixStream::connect(&path).unwrap();
        other.write_all(b"reboot\n").unwrap();
        assert_eq!(
            kinds(control.take(t0)),
            ["handover", "handover", "unknown reboot"]
        );
        pieces.write_all(b"over\n").unwrap();
        assert_eq!(kinds(control.take(t0)), ["handover"]);
        // Silent ones: at most COMMANDS wait, and each goes after COMMAND_WAIT.
        let silent: Vec<UnixStream> = (0..COMMANDS + 2)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        assert!(control.take(t0).is_empty());
        assert_eq!(control.pending.len(), COMMANDS);
        assert_eq!(
            kinds(control.take(t0 + COMMAND_WAIT)),
            vec!["unknown ".to_owned(); COMMANDS]
        );
        drop(silent);
        drop(control);
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The pair's gateway MAC is unicast, locally administered, the same for one gateway
    /// vIP and different for another.
    #[test]
    fn the_pairs_gateway_mac_follows_the_gateway_vip() {
        let a = gateway_mac(Ipv4Addr::new(100, 64, 1, 1));
        assert_eq!(a, [0x02, 0x63, 0x79, 64, 1, 1]);
        assert_eq!(a[0] & 1, 0);
        assert_eq!(a[0] & 2, 2);
        assert_ne!(a, gateway_mac(Ipv4Addr::new(100, 64, 2, 1)));
    }
}

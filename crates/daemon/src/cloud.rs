//! A tunnel end's side of the control plane, on the control thread: the signal client's
//! events (peers to expect, probes to send, our observed address), peers added on demand from
//! what the cloud says, DNS answers held until the tunnel they point into is up,
//! relays asked for when the direct path stays silent, and nodes we do not know
//! that handshake with us asked about.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cyphonic_crypto::{Certificate, PublicKey};
use cyphonic_session::{Identity, PeerConfig};
use cyphonic_signal::{
    Allowed, Event, Handle, NameRecord, PeerInfo, RelayInfo, Resolution, SignalError,
};
use cyphonic_telemetry::files::{self, Access};
use cyphonic_tunnel::{Control, MAX_CANDIDATES, PeerSlot, Shared};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::sync::mpsc;

use crate::status::CloudStatus;
use cyphonic_signal::Report;
use cyphonic_tunnel::policy::{Direction, REFUSED_MAX, Taken};

/// Keepalives towards peers found through the cloud: they hold NAT mappings open.
const CLOUD_KEEPALIVE: Duration = Duration::from_secs(25);
/// Initiations to a peer from the cloud unanswered this long: the direct path does not work,
/// ask the cloud for a relay. (Both sides initiate at once, so an answer normally comes
/// within a round trip; the first retry goes out after 1 s.)
const DIRECT_PATIENCE: Duration = Duration::from_secs(2);
/// A peer with keys whose handshakes (a rekey, or one started because our data went
/// unanswered) go unanswered this long: the path died under the keys (a NAT on the way
/// rebinding, a firewall's state lost). Two attempts (at 0 and 1 s) go unanswered first, so
/// that one lost packet on a working path does not move it.
const ESTABLISHED_PATIENCE: Duration = Duration::from_secs(3);
/// The cloud peers' paths are looked at this often (a walk over every peer: at 10,000 on
/// every wake-up of the control loop it cost the adapter a good part of a core; the
/// patience above is seconds).
const KEEP_ROUTES_EVERY: Duration = Duration::from_millis(250);
/// At most one relay request per peer per this interval.
const RELAY_ASK_EVERY: Duration = Duration::from_secs(10);
/// At most one question to the cloud about a node we do not know, per node, per this
/// interval.
const ADMIT_EVERY: Duration = Duration::from_secs(1);
/// Nodes asked about that are remembered at most (a flood of valid strangers cannot grow
/// memory).
const ADMISSIONS: usize = 4096;
/// DNS answers held for tunnels at most, all peers together.
const AWAITING: usize = 4096;
/// Revoked peers whose names are looked up again at most, per push from the cloud.
const RELOOKUPS: usize = 64;
/// A channel that leaves the stream for UDP stays carried this long: what the relay still
/// sends there until our UDP bind moves us arrives meanwhile.
const STREAM_LINGER: Duration = Duration::from_secs(10);
/// Relays remembered per peer at most before those of peers gone are forgotten.
const RELAYS_KEPT: usize = 4096;

/// What settles a DNS query parked under a key: the records to answer with, or the error.
pub type Settled = (u16, Result<Vec<Record>, ResponseCode>);

/// A DNS question the cloud answered, for the query parked under `key`.
#[derive(Debug)]
pub struct CloudAnswer {
    /// The resolver's key; none for a name looked up again without a query (a revoked
    /// peer's: [`CloudLink::handle`]).
    pub key: Option<u16>,
    /// The name asked.
    pub name: Name,
    /// The type asked.
    pub record_type: RecordType,
    /// What the cloud said.
    pub result: Result<Resolution, SignalError>,
}

/// How a DNS service asks the cloud.
#[derive(Debug, Clone)]
pub struct Asker {
    handle: Handle,
    answers: mpsc::Sender<CloudAnswer>,
}

impl Asker {
    /// Resolves `name` in the background; the answer settles the question on the control
    /// thread (`Services::settled`).
    pub fn ask(&self, key: u16, name: Name, record_type: RecordType) {
        self.lookup(Some(key), name, record_type);
    }

    fn lookup(&self, key: Option<u16>, name: Name, record_type: RecordType) {
        let (handle, answers) = (self.handle.clone(), self.answers.clone());
        tokio::spawn(async move {
            let result = handle.resolve(&name.to_ascii()).await;
            let _ = answers
                .send(CloudAnswer {
                    key,
                    name,
                    record_type,
                    result,
                })
                .await;
        });
    }
}

/// Where the cloud is and what we tell it.
#[derive(Debug, Clone)]
pub struct CloudSettings {
    /// The cloud's instances (NMS's control address), tried in turn.
    pub addresses: Vec<String>,
    /// The cloud's pinned Noise keys.
    pub public_keys: Vec<PublicKey>,
    /// Endpoints to register besides the ones the cloud sees.
    pub endpoints: Vec<SocketAddr>,
    /// Our software and version, for the cloud's logs.
    pub agent: String,
    /// TTL of the DNS answers built from the cloud's.
    pub dns_ttl: u32,
    /// Where our certificate is: a renewed one replaces it.
    pub certificate_file: std::path::PathBuf,
    /// Where our CA bundle is: the issuing CA of a renewed certificate joins it.
    pub ca_file: std::path::PathBuf,
    /// Whether to ask the router for a mapping of the tunnel port while behind a NAT.
    pub port_mapping: bool,
}

/// What the cloud did that the control loop hands to [`CloudLink::handle`].
#[derive(Debug)]
pub enum CloudWork {
    /// An event of the signal client.
    Event(Event),
    /// An answer to a DNS question.
    Answer(CloudAnswer),
    /// What our router says of a mapping of the tunnel port changed.
    Mapping(Option<cyphonic_control::Mapping>),
}

/// Adds the issuing CA of `cert` (one of `issuers`, learned from the cloud) to the CA file
/// `ca_file` unless the file holds it.
///
/// # Errors
/// The file cannot be read or replaced.
fn keep_issuer(
    ca_file: &std::path::Path,
    issuers: &[Certificate],
    cert: &Certificate,
) -> std::io::Result<()> {
    let text = std::fs::read_to_string(ca_file)?;
    let held = Certificate::all_from_pem(&text).unwrap_or_default();
    let issuer = cert.body().issuer;
    if held.iter().any(|c| c.body().public_key == issuer) {
        return Ok(());
    }
    let Some(ca) = issuers.iter().find(|c| c.body().public_key == issuer) else {
        return Ok(());
    };
    let mut bundle = text;
    if !bundle.ends_with('\n') && !bundle.is_empty() {
        bundle.push('\n');
    }
    bundle.push_str(&ca.to_pem());
    files::replace(ca_file, &bundle, Access::Public)?;
    tracing::info!(file = %ca_file.display(), issuer = %ca.fingerprint(), "the cloud's issuing CA added to our CA file");
    Ok(())
}

/// Changes our trust store with `change` and takes it on at once (peers it no longer trusts
/// leave); returns those that left.
///
/// # Errors
/// Our own certificate does not verify under the changed trust: nothing changes.
fn change_trust(
    control: &mut Control,
    change: impl FnOnce(&mut cyphonic_crypto::TrustStore),
) -> Result<Vec<(String, cyphonic_tunnel::control::Removal)>, cyphonic_session::IdentityError> {
    let now = Instant::now();
    let id = control.shared().identity();
    let mut trust = id.trust().clone();
    change(&mut trust);
    let new = id.with_trust(trust, control.shared().clock().unix_secs(now))?;
    Ok(control.set_identity(&Arc::new(new), now))
}

/// Takes the tunnel versions the cloud described a peer with (`None`: it said none, a cloud
/// before control version 15 or a peer that registered none) for its next initiations, and
/// says so each time they leave no version in common (docs/protocol.md §2, *Versions*).
fn versions_said(slot: &PeerSlot, versions: Option<cyphonic_session::Versions>) {
    let mut peer = slot.lock();
    peer.set_versions(versions);
    if let Err(e) = peer.version_to_speak() {
        tracing::warn!(peer = %slot.name, error = %e, "no tunnel with this peer: it runs a release more than one apart from ours");
    }
}

/// The addresses of a peer to try besides its first (the cloud's list, in its order): at
/// most [`MAX_CANDIDATES`], each once, none of them our own socket (a peer behind another NAT
/// may have the same private address as we do).
fn candidates(endpoints: &[SocketAddr], tunnel_port: u16) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for e in endpoints.iter().skip(1) {
        if out.len() < MAX_CANDIDATES
            && Some(e) != endpoints.first()
            && !out.contains(e)
            && !is_ours(*e, tunnel_port)
        {
            out.push(*e);
        }
    }
    out
}

/// Whether `addr` (where the cloud sees our tunnel socket) is the socket itself: one of our
/// own addresses, at our port. Otherwise a NAT stands between.
fn is_ours(addr: SocketAddr, tunnel_port: u16) -> bool {
    addr.port() == tunnel_port && std::net::UdpSocket::bind(SocketAddr::new(addr.ip(), 0)).is_ok()
}

/// DNS answers held until the tunnel they point into is up, by peer id: [`AWAITING`] at
/// most, all peers together.
#[derive(Debug, Default)]
struct Awaiting {
    by_peer: HashMap<u32, Vec<(u16, Vec<Record>)>>,
    held: usize,
}

impl Awaiting {
    /// Holds the answer `records` to the query parked under `key` for `peer`'s tunnel;
    /// false (and nothing held) when [`AWAITING`] answers wait already.
    fn hold(&mut self, peer: u32, key: u16, records: Vec<Record>) -> bool {
        if self.held >= AWAITING {
            return false;
        }
        self.by_peer.entry(peer).or_default().push((key, records));
        self.held += 1;
        true
    }

    /// What waited for `peer`, in the order it came.
    fn release(&mut self, peer: u32) -> Vec<(u16, Vec<Record>)> {
        let released = self.by_peer.remove(&peer).unwrap_or_default();
        self.held -= released.len();
        released
    }
}

/// The control plane as the control thread sees it.
pub struct CloudLink {
    handle: Handle,
    events: mpsc::Receiver<Event>,
    answers: mpsc::Receiver<CloudAnswer>,
    endpoints: Vec<SocketAddr>,
    registered: Option<u64>,
    awaiting: Awaiting,
    admissions: HashMap<String, Instant>,
    /// When the cloud peers' paths were last looked at ([`CloudLink::keep_routes`]).
    routes_kept: Option<Instant>,
    ttl: u32,
    status: Arc<Mutex<CloudStatus>>,
    certificate_file: std::path::PathBuf,
    ca_file: std::path::PathBuf,
    /// The cloud's issuing CAs we trust (learned from its welcome; kept across reloads).
    issuers: Vec<Certificate>,
    /// What the cloud revoked online (kept across reloads).
    revoked: std::collections::HashSet<cyphonic_crypto::Fingerprint>,
    /// Our tunnel socket's port.
    tunnel_port: u16,
    /// Looks names up again, for no DNS query (a revoked peer's).
    again: Asker,
    /// Whether our tunnel socket is behind a NAT, as the cloud's probes show (assumed until
    /// they do): new direct peers are hole-punched for first.
    behind_nat: bool,
    /// Whether UDP to the cloud works, as the probes show (assumed until they say not).
    udp_works: bool,
    /// Relay channels carried over the relay's stream while UDP to the cloud fails
    /// (docs/protocol.md §4, *Relay over a stream*); `None` if its thread did not start.
    streams: Option<cyphonic_stream::Streams>,
    /// The relay the cloud last gave for each peer, by fingerprint: what moves between UDP
    /// and the stream.
    relays: HashMap<String, RelayInfo>,
    /// Cloud peers to be paired with again once the cloud is reached (those this tunnel
    /// end's previous holder had), by fingerprint.
    resume: Vec<String>,
    /// The cloud peers in use when last looked at, and when that was.
    in_use: (Vec<String>, Option<Instant>),
    /// When what we report of our HA pair was last looked at.
    pair_at: Option<Instant>,
    /// When our devices and tunnels were last looked at, and when they go to the cloud.
    report_at: Option<Instant>,
    report_pace: ReportPace,
    /// The flow log's bounds.
    flows: FlowPace,
    /// Asks the router in front of us for a mapping of the tunnel port while the cloud sees
    /// us behind a NAT (`cloud.port_mapping`); `None` when off.
    mapper: Option<cyphonic_portmap::Mapper>,
    /// The cloud instance of the session: our route to it says which router to ask.
    cloud_at: Option<SocketAddr>,
}

/// How often the cloud peers in use are looked at for [`CloudLink::peers_in_use`], and what
/// we report of our HA pair for [`CloudLink::report_pair`].
const IN_USE_EVERY: Duration = Duration::from_secs(1);

/// A changed list of devices or tunnels goes to the cloud at most this often.
const REPORT_CHANGED_EVERY: Duration = Duration::from_secs(5);
/// Counters that moved, in an unchanged list, go to the cloud this often.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// When a report of our devices and tunnels goes to the cloud (docs/protocol.md §8,
/// *Devices and tunnels*): the first at once; then one whose list changed (a device or
/// tunnel came or went, a tunnel changed path or got or lost its keys) after
/// [`REPORT_CHANGED_EVERY`] since the last; one whose counters alone moved after
/// [`REPORT_EVERY`]; an unchanged one never.
#[derive(Debug, Default)]
struct ReportPace {
    sent: Option<(Instant, Report)>,
}

impl ReportPace {
    /// Whether `report` goes now; if so, it is the last sent from now on.
    fn due(&mut self, report: &Report, now: Instant) -> bool {
        let due = match &self.sent {
            None => true,
            Some((_, last)) if last == report => false,
            Some((at, last)) => {
                let wait = if Self::same_list(last, report) {
                    REPORT_EVERY
                } else {
                    REPORT_CHANGED_EVERY
                };
                now.saturating_duration_since(*at) >= wait
            }
        };
        if due {
            self.sent = Some((now, report.clone()));
        }
        due
    }

    /// Whether `a` and `b` list the same devices and tunnels, whatever their counters and
    /// times.
    fn same_list(a: &Report, b: &Report) -> bool {
        let device = |d: &cyphonic_control::DeviceReport| {
            (
                d.mac,
                d.vip,
                d.vip6,
                d.legacy,
                d.name.clone(),
                d.hostname.clone(),
                d.kind,
                d.vlan,
            )
        };
        let tunnel =
            |t: &cyphonic_control::TunnelReport| (t.peer.clone(), t.path, t.reason, t.established);
        a.devices
            .iter()
            .map(device)
            .eq(b.devices.iter().map(device))
            && a.tunnels
                .iter()
                .map(tunnel)
                .eq(b.tunnels.iter().map(tunnel))
    }
}

/// Flows a message carries at most.
const FLOWS_PER_MESSAGE: usize = 1000;
/// `v`'s length as JSON, with the comma after it.
fn json_len<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map_or(usize::MAX, |b| b.len() + 1)
}

/// JSON bytes of records a message carries at most (a message is at most 65519 bytes): some
/// 200 flows.
const MESSAGE_BYTES: usize = 48 << 10;
/// Flows sent in a minute at most (a bucket this deep, filling at this a minute).
const FLOWS_PER_MINUTE: u64 = 3_000;

/// The flow log's bounds on its way to the cloud (docs/protocol.md §8, *Flow logs*): a
/// message at most every second, of at most [`FLOWS_PER_MESSAGE`] flows and
/// [`MESSAGE_BYTES`] of records (summaries first), at most
/// [`FLOWS_PER_MINUTE`] flows a minute; what goes beyond is dropped and counted, and each
/// message says how many since the last.
#[derive(Debug)]
struct FlowPace {
    last: Option<Instant>,
    /// Flows that may go now, in thousandths.
    tokens: u64,
    filled: Option<Instant>,
    /// Records not sent since the last message.
    unreported: u64,
}

impl Default for FlowPace {
    fn default() -> Self {
        Self {
            last: None,
            tokens: FLOWS_PER_MINUTE * 1000,
            filled: None,
            unreported: 0,
        }
    }
}

impl FlowPace {
    fn due(&mut self, now: Instant) -> bool {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1))
        {
            return false;
        }
        self.last = Some(now);
        true
    }

    fn unsent(&mut self, n: u64) {
        self.unreported = self.unreported.saturating_add(n);
    }

    /// `taken` as a message's parts within the bounds, its times on the wall clock (`unix`
    /// is `now`); None when there is nothing to say.
    fn batch(
        &mut self,
        taken: Taken,
        now: Instant,
        unix: u64,
    ) -> Option<(
        Vec<cyphonic_control::FlowRecord>,
        Vec<cyphonic_control::RefusedRecord>,
        u64,
    )> {
        let since_ms = self.filled.map_or(0, |t| {
            u64::try_from(now.saturating_duration_since(t).as_millis()).unwrap_or(u64::MAX)
        });
        self.filled = Some(now);
        // FLOWS_PER_MINUTE a minute is FLOWS_PER_MINUTE / 60 thousandths a millisecond.
        self.tokens = self
            .tokens
            .saturating_add(since_ms.saturating_mul(FLOWS_PER_MINUTE) / 60)
            .min(FLOWS_PER_MINUTE * 1000);
        let room = FLOWS_PER_MESSAGE.min(usize::try_from(self.tokens / 1000).unwrap_or(usize::MAX));
        let wall = |t: Instant| unix.saturating_sub(now.saturating_duration_since(t).as_secs());
        let dir = |d: Direction| match d {
            Direction::Out => cyphonic_control::FlowDir::Out,
            Direction::In => cyphonic_control::FlowDir::In,
        };
        let (ended, summaries) = (taken.ended.len(), taken.refused.len());
        // What fits the message's bytes, in order: the first that does not ends the list.
        let mut budget = MESSAGE_BYTES;
        let mut fits = move |len: usize| {
            let fit = len <= budget;
            budget = budget.saturating_sub(if fit { len } else { budget });
            fit
        };
        let refused: Vec<_> = taken
            .refused
            .into_iter()
            .take(REFUSED_MAX)
            .map(|r| cyphonic_control::RefusedRecord {
                src: r.src,
                dir: dir(r.dir),
                first: wall(r.first),
                last: wall(r.last),
                packets: r.packets,
                ports: u32::try_from(r.ports).unwrap_or(u32::MAX),
            })
            .take_while(|r| fits(json_len(r)))
            .collect();
        let flows: Vec<_> = taken
            .ended
            .into_iter()
            .take(room)
            .map(|e| cyphonic_control::FlowRecord {
                proto: e.key.proto,
                src: e.key.src,
                sport: e.key.sport,
                dst: e.key.dst,
                dport: e.key.dport,
                dir: dir(e.dir),
                start: wall(e.start),
                end: wall(e.end),
                tx_bytes: e.forth.bytes,
                tx_packets: e.forth.packets,
                rx_bytes: e.back.bytes,
                rx_packets: e.back.packets,
                rule: e.rule,
            })
            .take_while(|f| fits(json_len(f)))
            .collect();
        self.tokens = self.tokens.saturating_sub(flows.len() as u64 * 1000);
        let lost = taken.lost + (ended - flows.len()) as u64 + (summaries - refused.len()) as u64;
        let unreported = std::mem::take(&mut self.unreported).saturating_add(lost);
        if flows.is_empty() && refused.is_empty() && unreported == 0 {
            return None;
        }
        Some((flows, refused, unreported))
    }
}

/// The most peers [`CloudLink::resume`] asks for.
const RESUMED_MAX: usize = 256;

impl std::fmt::Debug for CloudLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudLink")
            .field("endpoints", &self.endpoints)
            .field("awaiting", &self.awaiting.held)
            .finish_non_exhaustive()
    }
}

impl CloudLink {
    /// Starts the signal client on the current tokio runtime (call inside it), as the
    /// identity of the tunnel end `shared`, and wraps it; returns the [`Asker`] DNS services
    /// resolve through.
    pub fn connect(settings: &CloudSettings, shared: &Shared, listen: SocketAddr) -> (Self, Asker) {
        let tunnel_port = listen.port();
        let mapper = std::num::NonZeroU16::new(tunnel_port)
            .filter(|_| settings.port_mapping)
            .map(cyphonic_portmap::Mapper::spawn);
        let streams = cyphonic_stream::Streams::start(listen)
            .inspect_err(|e| tracing::error!(error = %e, "the relay stream's thread did not start: no relay over TCP"))
            .ok();
        let (handle, events) = cyphonic_signal::spawn(
            cyphonic_signal::Config {
                clouds: settings.addresses.clone(),
                cloud_keys: settings.public_keys.clone(),
                agent: settings.agent.clone(),
                tunnel_port: Some(tunnel_port),
                source: None,
                tunnel: cyphonic_signal::TunnelVersions(shared.identity().versions()),
            },
            shared.identity(),
        );
        tracing::info!(cloud = ?settings.addresses, keys = ?settings.public_keys, "control plane: connecting");
        let (answers_tx, answers) = mpsc::channel(256);
        let asker = Asker {
            handle: handle.clone(),
            answers: answers_tx,
        };
        let link = Self {
            handle,
            events,
            answers,
            endpoints: settings.endpoints.clone(),
            registered: None,
            awaiting: Awaiting::default(),
            admissions: HashMap::new(),
            routes_kept: None,
            ttl: settings.dns_ttl,
            status: Arc::new(Mutex::new(CloudStatus {
                address: settings.addresses.join(" "),
                ..CloudStatus::default()
            })),
            certificate_file: settings.certificate_file.clone(),
            ca_file: settings.ca_file.clone(),
            issuers: Vec::new(),
            revoked: std::collections::HashSet::new(),
            tunnel_port,
            again: asker.clone(),
            behind_nat: true,
            udp_works: true,
            streams,
            relays: HashMap::new(),
            resume: Vec::new(),
            in_use: (Vec::new(), None),
            pair_at: None,
            report_at: None,
            report_pace: ReportPace::default(),
            flows: FlowPace::default(),
            mapper,
            cloud_at: None,
        };
        (link, asker)
    }

    /// The cloud peers this tunnel end's previous holder had (an HA pair's serving box, or
    /// this end before a restart), by fingerprint: once the cloud is reached, it is asked to
    /// pair us with each that is not a peer by then (policy decides, as for any pairing), so
    /// that traffic to them goes on without a new name lookup.
    pub fn resume(&mut self, fingerprints: Vec<String>) {
        self.resume = fingerprints;
        self.resume.truncate(RESUMED_MAX);
    }

    /// The cloud peers in use (their fingerprints, sorted) when they changed since the last
    /// look; looks at most every second.
    pub fn peers_in_use(&mut self, shared: &Shared, now: Instant) -> Option<Vec<String>> {
        if self
            .in_use
            .1
            .is_some_and(|t| now.saturating_duration_since(t) < IN_USE_EVERY)
        {
            return None;
        }
        self.in_use.1 = Some(now);
        let mut fps: Vec<String> = shared
            .peers()
            .all()
            .iter()
            .filter(|s| s.origin == "cloud")
            .map(|s| s.fingerprint.clone())
            .collect();
        fps.sort_unstable();
        (fps != self.in_use.0).then(|| {
            self.in_use.0.clone_from(&fps);
            fps
        })
    }

    /// Hands the session what `pair` says of our HA pair (sent when it changed, see
    /// `cyphonic_signal::Handle::report_pair`); asks at most every second.
    pub fn report_pair(
        &mut self,
        now: Instant,
        pair: impl FnOnce() -> Option<cyphonic_control::PairState>,
    ) {
        if self
            .pair_at
            .is_some_and(|t| now.saturating_duration_since(t) < IN_USE_EVERY)
        {
            return;
        }
        self.pair_at = Some(now);
        self.handle.report_pair(pair());
    }

    /// Hands the session our devices (`devices` says them) and our tunnels (`shared`'s
    /// peers; `unix` is `now` on the wall clock) when it is time (docs/protocol.md §8: a
    /// changed list after 5 s, counters alone after 60 s); looks at most every second.
    pub fn report(
        &mut self,
        now: Instant,
        unix: u64,
        shared: &Shared,
        devices: impl FnOnce() -> Vec<cyphonic_control::DeviceReport>,
    ) {
        if self
            .report_at
            .is_some_and(|t| now.saturating_duration_since(t) < IN_USE_EVERY)
        {
            return;
        }
        self.report_at = Some(now);
        let tunnels = crate::status::tunnels(shared, now, unix);
        let (report, left) = Report::bounded(devices(), tunnels);
        if !self.report_pace.due(&report, now) {
            return;
        }
        if left != (0, 0) {
            tracing::debug!(
                devices = left.0,
                tunnels = left.1,
                "left out of the report to the cloud: beyond its bounds"
            );
        }
        self.handle.report(report);
    }

    /// Sends the cloud what the flow log holds (docs/protocol.md §8, *Flow logs*), at most
    /// once a second, within the bounds of docs/protocol.md §8 (a message's bytes, 3,000
    /// flows a minute); `unix` is `now` on the wall clock.
    pub fn send_flows(&mut self, now: Instant, unix: u64, shared: &Shared) {
        if !self.flows.due(now) {
            return;
        }
        let taken = shared.policy().take_log(now);
        let Some((flows, refused, unreported)) = self.flows.batch(taken, now, unix) else {
            return;
        };
        let sent = flows.len();
        if self.handle.send_flows(flows, refused, unreported).is_err() {
            // Counted as unreported in the next one.
            self.flows.unsent(sent as u64 + unreported);
        }
    }

    /// Asks the cloud to pair us again with the resumed peers that are not peers yet.
    fn resume_pairings(&mut self, control: &Control) {
        let resume = std::mem::take(&mut self.resume);
        if resume.is_empty() {
            return;
        }
        let peers = control.shared().peers().all();
        let mut asked = 0;
        for fp in resume {
            if peers.iter().any(|s| s.fingerprint == fp) {
                continue;
            }
            if self.handle.admit(&fp).is_ok() {
                asked += 1;
            }
        }
        tracing::info!(
            asked,
            "asking the cloud to pair us again with the peers this gateway had"
        );
    }

    /// Which relay channels are carried over a stream, when the streams' thread runs.
    pub fn carried(&self) -> Option<cyphonic_stream::Carried> {
        self.streams.as_ref().map(cyphonic_stream::Streams::carried)
    }

    /// The relay streams' counters, when their thread runs.
    pub fn stream_stats(&self) -> Option<Arc<cyphonic_stream::StreamStats>> {
        self.streams.as_ref().map(|s| s.stats.clone())
    }

    /// The control plane's part of the status document, as it changes.
    pub fn status(&self) -> Arc<Mutex<CloudStatus>> {
        self.status.clone()
    }

    /// The cloud's next event or answer (cancel-safe: nothing is lost when another wake-up
    /// comes first). `None` when the signal client is gone.
    pub async fn next(&mut self) -> Option<CloudWork> {
        let mapping = async {
            match self.mapper.as_mut() {
                Some(m) => m.changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            e = self.events.recv() => e.map(CloudWork::Event),
            a = self.answers.recv() => a.map(CloudWork::Answer),
            m = mapping => Some(CloudWork::Mapping(m)),
        }
    }

    /// Gives our port mapping back to the router, if we hold one (at stop).
    pub async fn stop(&mut self) {
        if let Some(m) = self.mapper.take() {
            m.stop().await;
        }
    }

    /// The router to ask for a port mapping now that the cloud sees our tunnel socket at
    /// `seen`: the next hop of our route to the cloud, asked from our address on that route;
    /// none when not behind a NAT, or without a router on the way.
    fn map_port(&self, seen: SocketAddr) {
        let Some(mapper) = self.mapper.as_ref() else {
            return;
        };
        let target = self
            .cloud_at
            .filter(|_| self.behind_nat)
            .and_then(|cloud| match cyphonic_netio::Rtnl::open().and_then(|mut r| r.route_to(cloud.ip())) {
                Ok(route) => route,
                Err(e) => {
                    tracing::warn!(error = %e, "our route to the cloud could not be read: no port mapping");
                    None
                }
            })
            .and_then(|route| {
                Some(cyphonic_portmap::Target {
                    gateway: route.gateway?,
                    local: route.source?,
                    seen_at: seen.ip(),
                })
            });
        mapper.set_target(target);
    }

    /// Keeps what we register with the cloud current: `names`, changed when `version` is.
    pub fn register(&mut self, version: u64, names: &[NameRecord]) {
        if self.registered != Some(version) {
            self.handle.register(self.endpoints.clone(), names.to_vec());
            self.registered = Some(version);
        }
    }

    /// Our addresses changed: the signal client probes again, or reconnects.
    pub fn network_changed(&self) {
        self.handle.network_changed();
    }

    /// A challenge that is none of our relay channels' came from `from`: the signal client
    /// answers it if it is one of its probe ports.
    pub fn challenged(&self, from: SocketAddr, cookie: cyphonic_signal::ReturnCookie) {
        self.handle.challenged(from, cookie);
    }

    /// Acts on what the cloud did; returns the DNS questions that settle now.
    pub fn handle(&mut self, work: CloudWork, control: &mut Control) -> Vec<Settled> {
        match work {
            CloudWork::Event(e) => {
                self.event(e, control);
                Vec::new()
            }
            CloudWork::Answer(a) => self.answered(a, control).into_iter().collect(),
            CloudWork::Mapping(m) => {
                self.status
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .mapping
                    .clone_from(&m);
                self.handle.set_mapping(m);
                Vec::new()
            }
        }
    }

    fn event(&mut self, event: Event, control: &mut Control) {
        {
            let mut st = self.status.lock().unwrap_or_else(PoisonError::into_inner);
            match &event {
                Event::Connected { cloud, .. } => {
                    self.cloud_at = Some(*cloud);
                    st.connected = true;
                    st.last_error = None;
                    st.address = cloud.to_string();
                }
                Event::Disconnected { reason } | Event::Refused { reason } => {
                    st.connected = false;
                    st.last_error = Some(reason.clone());
                }
                Event::Observed(addr) => st.observed = Some(addr.to_string()),
                Event::UdpToCloud(works) => st.udp = Some(*works),
                _ => {}
            }
        }
        match event {
            Event::Probe { to, frame } => control.send_probe(&frame, to),
            Event::Expect(info) => {
                let now = Instant::now();
                let Some(slot) = self.peer(control, &info, now) else {
                    return;
                };
                // Both sides initiate at once: each side's initiation opens its NAT for the
                // other's (hole punching).
                tracing::info!(peer = %slot.name, endpoints = ?info.endpoints, relay = ?info.relay.as_ref().map(|r| r.address), "the cloud asks us to expect a peer: handshaking");
                self.initiate(control, &slot, info.relay.as_ref(), now);
            }
            Event::Observed(addr) => {
                self.behind_nat = !is_ours(addr, self.tunnel_port);
                // Where a try of the direct path says we may be reached.
                let mut reachable = vec![addr];
                reachable.extend(self.endpoints.iter().filter(|e| **e != addr));
                control.set_reachable(reachable, self.behind_nat);
                tracing::info!(%addr, behind_nat = self.behind_nat, "the cloud sees our tunnel socket at this address");
                self.map_port(addr);
            }
            Event::UdpToCloud(works) => {
                self.udp_works = works;
                self.move_relays(control);
            }
            Event::Connected { observed, cloud } => {
                tracing::info!(%cloud, %observed, "control plane: connected");
                self.resume_pairings(control);
                // A relay asked for on a session that died may never have arrived, nor its
                // answer: paths still unanswered are asked about again on this one at once.
                for slot in control.shared().peers().all() {
                    slot.route().relay_asked = None;
                }
            }
            Event::Disconnected { reason } => {
                tracing::warn!(%reason, "control plane: disconnected; existing tunnels carry on");
            }
            Event::Refused { reason } => {
                tracing::error!(%reason, "control plane: the cloud refused our certificate");
            }
            Event::NotPaired { peer, reason } => {
                tracing::warn!(%peer, %reason, "the cloud will not pair us with a peer");
            }
            Event::NamesRefused(names) => {
                for (name, reason) in names {
                    tracing::warn!(%name, %reason, "the cloud refused a name");
                }
            }
            Event::Issuers(cas) => self.learn_issuers(cas, control),
            Event::Renewed(cert) => self.renewed(&cert, control),
            Event::Revoked(fps) => self.revoked(fps, control),
            Event::FlowLog(on) => {
                tracing::info!(
                    on,
                    "the cloud turns flow logs {}",
                    if on { "on" } else { "off" }
                );
                control.shared().policy().set_logs(on);
            }
            _ => {}
        }
    }

    /// Trusts the cloud's issuing CAs that verify under our roots (members the AS enrolled
    /// then verify here), now and after reloads.
    fn learn_issuers(&mut self, cas: Vec<Certificate>, control: &mut Control) {
        let fresh: Vec<Certificate> = cas
            .into_iter()
            .filter(|c| !self.issuers.contains(c))
            .collect();
        if fresh.is_empty() {
            return;
        }
        let issuers = &mut self.issuers;
        let changed = change_trust(control, |trust| {
            for ca in fresh {
                match trust.add_issuer(ca.clone()) {
                    Ok(_) => {
                        tracing::info!(issuer = %ca.fingerprint(), blocks = ?ca.body().vip_blocks, "trusting the cloud's issuing CA");
                        issuers.push(ca);
                    }
                    Err(e) => {
                        tracing::warn!(issuer = %ca.fingerprint(), error = %e, "the cloud's issuing CA does not verify under our roots: not trusted");
                    }
                }
            }
        });
        if let Err(e) = changed {
            tracing::warn!(error = %e, "the issuing CAs left our trust unusable: not taken on");
        }
    }

    /// The cloud revoked certificates online: none of them is believed from now on, and
    /// every peer holding one leaves the table at once (its sessions end, its handshakes are
    /// refused).
    fn revoked(&mut self, fps: Vec<cyphonic_crypto::Fingerprint>, control: &mut Control) {
        let fresh: Vec<_> = fps
            .into_iter()
            .filter(|f| self.revoked.insert(*f))
            .collect();
        if fresh.is_empty() {
            return;
        }
        // Answers the cloud gave before may name a revoked peer.
        self.handle.cache().clear();
        let changed = change_trust(control, |trust| {
            for fp in &fresh {
                trust.revocations_mut().revoke(*fp);
            }
        });
        match changed {
            Ok(removed) => {
                for (peer, why) in &removed {
                    tracing::warn!(%peer, reason = %why, "peer removed: revoked by the cloud");
                }
                // A member the cloud re-keyed (its newer certificate retires the old one:
                // issue 49, finding 6) is to be reached at once, not when a device asks
                // for its name again: its name is looked up again. At most
                // [`RELOOKUPS`] per push (the table may be large; traffic finds the rest).
                for (peer, _) in removed.iter().take(RELOOKUPS) {
                    if let Ok(name) = Name::from_ascii(peer) {
                        self.again.lookup(None, name, RecordType::A);
                    }
                }
                tracing::info!(
                    revoked = fresh.len(),
                    peers_removed = removed.len(),
                    "revocations from the cloud applied"
                );
            }
            Err(e) => {
                tracing::error!(error = %e, "the cloud revoked our own certificate");
            }
        }
    }

    /// `identity` (read from the file again) with the issuing CAs learned from the cloud and
    /// the revocations it pushed: what a reload takes on.
    pub fn with_learned(&self, identity: Identity, unix: u64) -> Identity {
        if self.issuers.is_empty() && self.revoked.is_empty() {
            return identity;
        }
        let mut trust = identity.trust().clone();
        for ca in &self.issuers {
            let _ = trust.add_issuer(ca.clone());
        }
        for fp in &self.revoked {
            trust.revocations_mut().revoke(*fp);
        }
        identity.with_trust(trust, unix).unwrap_or(identity)
    }

    /// Our identity changed (a reload with a renewed certificate): the control session is
    /// opened again with it.
    pub fn set_identity(&self, identity: Arc<Identity>) {
        self.handle.set_identity(identity);
    }

    /// The cloud renewed our certificate: written over the old file (atomically), taken on
    /// for new handshakes, every peer with a tunnel rekeyed at once (so that it learns the
    /// new certificate long before the old one ends; traffic keeps flowing on the old keys
    /// meanwhile), and the control session opened again with it.
    fn renewed(&mut self, cert: &Certificate, control: &mut Control) {
        let now = Instant::now();
        let shared = control.shared().clone();
        let unix = shared.clock().unix_secs(now);
        let id = match shared.identity().with_certificate(cert.clone(), unix) {
            Ok(id) => Arc::new(id),
            Err(e) => {
                tracing::error!(error = %e, "the renewed certificate does not verify here: the old one stays");
                return;
            }
        };
        // Signed by an issuing CA our CA file lacks (a certificate issued offline, renewed
        // online): the CA joins the file first, so that the certificate loads after a restart.
        if let Err(e) = keep_issuer(&self.ca_file, &self.issuers, cert) {
            tracing::error!(file = %self.ca_file.display(), error = %e, "the renewed certificate's issuing CA could not be added: the old certificate stays");
            return;
        }
        if let Err(e) = files::replace(&self.certificate_file, cert.to_pem(), Access::Public) {
            tracing::error!(file = %self.certificate_file.display(), error = %e, "the renewed certificate could not be written: it is used until the next restart");
        }
        control.set_identity(&id, now);
        let mut rekeyed = 0;
        for slot in shared.peers().all() {
            if slot.lock().is_established(now) {
                control.initiate(&slot, now);
                rekeyed += 1;
            }
        }
        tracing::info!(fingerprint = %cert.fingerprint(), not_after = cert.body().not_after, rekeyed, "certificate renewed");
        self.handle.set_identity(id);
    }

    /// The peer the cloud described: found in the table (its endpoint refreshed if it has no
    /// keys yet and is not relayed), or added. `None` if its certificate does not verify
    /// here. The relay the description may carry is the caller's to apply.
    fn peer(&self, control: &mut Control, info: &PeerInfo, now: Instant) -> Option<Arc<PeerSlot>> {
        let shared = control.shared().clone();
        let cert = match Certificate::from_pem(&info.certificate) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "the cloud sent an unreadable certificate");
                return None;
            }
        };
        let identity = shared.identity();
        if let Err(e) = identity
            .trust()
            .verify(&cert, shared.clock().unix_secs(now))
        {
            tracing::warn!(name = %cert.body().name, error = %e, "the cloud sent a certificate we do not trust");
            return None;
        }
        let body = cert.body();
        if body.public_key == identity.public_key().0 {
            return None;
        }
        let key = PublicKey(body.public_key);
        let endpoint = info.endpoints.first().copied();
        let versions = info.tunnel.map(|t| t.0);
        if let Some(slot) = shared.peers().by_key(&key) {
            versions_said(&slot, versions);
            let relayed = {
                let mut route = slot.route();
                route.direct.set_candidates(info.endpoints.iter().copied());
                if route.allowed != info.allowed {
                    tracing::info!(peer = %slot.name, allowed = info.allowed.map_or("not said", Allowed::describe), "the cloud says which way flows may start with this peer");
                    route.allowed = info.allowed;
                }
                drop(route);
                slot.lock().is_relayed()
            };
            let refreshed = {
                let mut p = slot.lock();
                let refresh = endpoint.filter(|_| !relayed && !p.is_established(now));
                if let Some(e) = refresh
                    && p.endpoint() != Some(e)
                {
                    p.set_endpoint(e);
                }
                refresh.is_some()
            };
            if refreshed {
                slot.route().candidates = candidates(&info.endpoints, self.tunnel_port);
            }
            return Some(slot);
        }
        let mut pc = PeerConfig::from_certificate(&cert, endpoint);
        pc.persistent_keepalive = Some(CLOUD_KEEPALIVE);
        let slot = control.add_cloud_peer(&cert, pc).ok()?;
        versions_said(&slot, versions);
        {
            let mut route = slot.route();
            route.allowed = info.allowed;
            route.candidates = candidates(&info.endpoints, self.tunnel_port);
            route.direct.set_candidates(info.endpoints.iter().copied());
        }
        tracing::info!(peer = %slot.name, ?endpoint, blocks = ?slot.blocks, allowed = info.allowed.map_or("not said", Allowed::describe), "peer added from the cloud");
        Some(slot)
    }

    /// The cloud answered a DNS question: settled now, or once its tunnel is up (and the
    /// handshake towards it starts, through the relay the cloud gave, if any).
    fn answered(&mut self, a: CloudAnswer, control: &mut Control) -> Option<Settled> {
        let now = Instant::now();
        let (vip, vip6, info) = match a.result {
            Ok(Resolution::Found { vip, vip6, peer }) => (vip, vip6, peer),
            Ok(Resolution::NotFound | Resolution::Denied | Resolution::Own) => {
                return a.key.map(|k| (k, Err(ResponseCode::NXDomain)));
            }
            Err(_) => return a.key.map(|k| (k, Err(ResponseCode::ServFail))),
        };
        let Some(slot) = self.peer(control, &info, now) else {
            return a.key.map(|k| (k, Err(ResponseCode::ServFail)));
        };
        let certified = |ip: std::net::IpAddr| slot.blocks.iter().any(|b| b.contains(&ip));
        if (vip.is_none() && vip6.is_none())
            || vip.is_some_and(|v4| !certified(v4.into()))
            || vip6.is_some_and(|v6| !certified(v6.into()))
        {
            tracing::warn!(peer = %slot.name, ?vip, ?vip6, "the cloud named no address, or one outside the peer's certificate");
            return a.key.map(|k| (k, Err(ResponseCode::ServFail)));
        }
        let records = self.records(&a.name, a.record_type, vip, vip6);
        if slot.lock().is_established(now) {
            return a.key.map(|k| (k, Ok(records)));
        }
        if let Some(key) = a.key
            && !self.awaiting.hold(slot.id, key, records)
        {
            return Some((key, Err(ResponseCode::ServFail)));
        }
        self.initiate(control, &slot, info.relay.as_ref(), now);
        None
    }

    /// Reaches a peer the cloud described: through `relay` if it gave one (a peer with keys
    /// moves there too: the cloud gives one when a side's path died); and without keys, a
    /// handshake, after a hole punch when the path is direct and we are behind a NAT.
    fn initiate(
        &mut self,
        control: &mut Control,
        slot: &Arc<PeerSlot>,
        relay: Option<&RelayInfo>,
        now: Instant,
    ) {
        if let Some(relay) = relay {
            if self.relays.len() >= RELAYS_KEPT {
                let live: std::collections::HashSet<String> = control
                    .shared()
                    .peers()
                    .all()
                    .iter()
                    .map(|s| s.fingerprint.clone())
                    .collect();
                self.relays.retain(|fp, _| live.contains(fp));
            }
            self.relays.insert(slot.fingerprint.clone(), relay.clone());
            control.apply_relay(slot, &self.by_transport(relay), now);
        }
        if slot.lock().is_established(now) {
            return;
        }
        if relay.is_none() && self.behind_nat && slot.route().relay.is_none() {
            control.punch(slot, now);
        }
        control.initiate(slot, now);
    }

    /// The relay channel `relay` as the engine reaches it: carried over the relay's stream
    /// (its local address) while UDP to the cloud fails and the relay offers one, else over
    /// UDP (a channel that was carried stays so for [`STREAM_LINGER`]).
    fn by_transport(&self, relay: &RelayInfo) -> RelayInfo {
        let Some(streams) = &self.streams else {
            return relay.clone();
        };
        if !self.udp_works && relay.stream.is_some() {
            match streams.open(relay) {
                Ok(local) => {
                    return RelayInfo {
                        address: local,
                        ..relay.clone()
                    };
                }
                Err(e) => {
                    tracing::warn!(relay = %relay.address, error = %e, "relay channel not carried over the stream");
                }
            }
        }
        streams.close(relay.address, STREAM_LINGER);
        relay.clone()
    }

    /// UDP to the cloud started or stopped working: every relayed peer moves to its channel
    /// as it is reached now (over the stream, or back to UDP).
    fn move_relays(&mut self, control: &mut Control) {
        let now = Instant::now();
        for slot in control.shared().peers().all() {
            let Some(info) = self.relays.get(&slot.fingerprint).cloned() else {
                continue;
            };
            let Some(current) = slot.route().relay.as_ref().map(|r| r.address) else {
                continue;
            };
            let carried = self.streams.as_ref().and_then(|s| s.local_of(info.address));
            if current != info.address && Some(current) != carried {
                // The engine holds another channel than the one remembered.
                continue;
            }
            // A pair on a direct path that works needs no stream (the cloud's UDP ports may
            // be all this network blocks); if that path dies, the relay asked for then
            // comes over the stream.
            if !self.udp_works && !slot.lock().is_relayed() {
                continue;
            }
            let want = self.by_transport(&info);
            if want.address != current {
                tracing::info!(peer = %slot.name, from = %current, to = %want.address, udp = self.udp_works, "relay channel moves");
                control.apply_relay(&slot, &want, now);
            }
        }
    }

    fn records(
        &self,
        name: &Name,
        record_type: RecordType,
        vip: Option<Ipv4Addr>,
        vip6: Option<std::net::Ipv6Addr>,
    ) -> Vec<Record> {
        match (record_type, vip, vip6) {
            (RecordType::A, Some(v4), _) => vec![Record::from_rdata(
                name.clone(),
                self.ttl,
                RData::A(v4.into()),
            )],
            (RecordType::AAAA, _, Some(v6)) => {
                vec![Record::from_rdata(
                    name.clone(),
                    self.ttl,
                    RData::AAAA(v6.into()),
                )]
            }
            // The name exists, without records of this type (NODATA).
            _ => Vec::new(),
        }
    }

    /// A peer's tunnel is up: the DNS answers that waited for it.
    pub fn peer_up(&mut self, peer: u32) -> Vec<Settled> {
        self.awaiting
            .release(peer)
            .into_iter()
            .map(|(k, r)| (k, Ok(r)))
            .collect()
    }

    /// A peer cannot be reached: its waiting answers become SERVFAIL.
    pub fn peer_gave_up(&mut self, peer: u32) -> Vec<Settled> {
        self.awaiting
            .release(peer)
            .into_iter()
            .map(|(k, _)| (k, Err(ResponseCode::ServFail)))
            .collect()
    }

    /// A valid node we do not know is handshaking with us (we restarted, and it still has us
    /// as a peer): ask the cloud whether it may, at most once per `ADMIT_EVERY` per node.
    /// If so, the cloud's answer adds it, and its next initiation (or ours) succeeds.
    pub fn admit(&mut self, cert: &Certificate, from: SocketAddr, at: Instant) {
        self.ask_pairing(
            cert,
            at,
            ("handshake from a node we do not know", Some(from)),
        );
    }

    /// Traffic wants a peer evicted for idleness: ask the cloud to pair us with it again
    /// (the same request as [`CloudLink::admit`]; policy is checked again).
    pub fn wake(&mut self, cert: &Certificate, at: Instant) {
        self.ask_pairing(cert, at, ("traffic for an idle peer's block", None));
    }

    /// Asks the cloud to pair us with the holder of `cert` (`Admit`), at most once per
    /// `ADMIT_EVERY` per certificate.
    fn ask_pairing(
        &mut self,
        cert: &Certificate,
        at: Instant,
        (why, from): (&str, Option<SocketAddr>),
    ) {
        let name = &cert.body().name;
        let fingerprint = cert.fingerprint().to_string();
        if self
            .admissions
            .get(&fingerprint)
            .is_some_and(|t| at.saturating_duration_since(*t) < ADMIT_EVERY)
        {
            return;
        }
        if self.admissions.len() >= ADMISSIONS {
            self.admissions.clear();
        }
        self.admissions.insert(fingerprint.clone(), at);
        match self.handle.admit(&fingerprint) {
            Ok(()) => tracing::info!(?from, %name, "{why}: asking the cloud"),
            Err(e) => {
                tracing::warn!(?from, %name, error = %e, "{why}, and the cloud cannot be asked");
            }
        }
    }

    /// Keeps the cloud peers' paths working: asks the cloud for a relay for each whose
    /// initiations have gone unanswered for `DIRECT_PATIENCE`, or `ESTABLISHED_PATIENCE`
    /// while it still has keys (at most once per `RELAY_ASK_EVERY`). Looks every
    /// `KEEP_ROUTES_EVERY`.
    pub fn keep_routes(&mut self, control: &mut Control, now: Instant) {
        let shared = control.shared().clone();
        if self
            .routes_kept
            .is_some_and(|t| now.saturating_duration_since(t) < KEEP_ROUTES_EVERY)
        {
            return;
        }
        self.routes_kept = Some(now);
        for slot in shared.peers().all() {
            if slot.origin != "cloud" {
                continue;
            }
            let (since, patience) = {
                let p = slot.lock();
                let patience = if p.is_established(now) {
                    ESTABLISHED_PATIENCE
                } else {
                    DIRECT_PATIENCE
                };
                (p.unanswered_since(), patience)
            };
            let Some(since) = since else {
                continue;
            };
            let mut route = slot.route();
            if now.saturating_duration_since(since) < patience
                || route
                    .relay_asked
                    .is_some_and(|t| now.saturating_duration_since(t) < RELAY_ASK_EVERY)
            {
                continue;
            }
            route.relay_asked = Some(now);
            drop(route);
            // A pair that had left its relay channel for a direct path goes back to it at
            // once (docs/protocol.md §4, *Back to direct*); the cloud is asked all the same,
            // in case the channel closed meanwhile.
            let fell_back = control.fall_back(&slot, now);
            let relayed = slot.lock().is_relayed();
            match self.handle.request_relay(&slot.fingerprint) {
                Ok(()) => tracing::info!(
                    peer = %slot.name,
                    relayed,
                    fell_back,
                    "no answer to handshakes on this path: asking the cloud for a relay"
                ),
                Err(e) => {
                    tracing::debug!(peer = %slot.name, error = %e, "relay not requested");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flow records go at most once a second, in a message that fits a frame, at most 3,000
    /// a minute (and 50 a second after); what goes beyond is dropped and counted in the next
    /// message, with what the filter lost and what a send could not take.
    #[test]
    fn flow_records_are_bounded_and_what_is_dropped_is_counted() {
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let ended = |n: usize| Taken {
            ended: (0..n).map(|i| ended_flow(i, t0, Direction::Out)).collect(),
            refused: Vec::new(),
            lost: 3,
        };
        let mut pace = FlowPace::default();
        assert!(pace.due(t0));
        assert!(!pace.due(at(0) + Duration::from_millis(999)));
        assert!(pace.due(at(1)));
        let unix = 1_795_000_000;
        let (flows, refused, unreported) = pace.batch(ended(2500), at(1), unix).unwrap();
        let n = flows.len();
        assert!((100..1000).contains(&n), "{n} flows in a message");
        assert_eq!(flows[0].end, unix - 1, "its end on the wall clock");
        assert_eq!(unreported, (2500 - n + 3) as u64);
        assert!(cyphonic_control::channel::fits(
            &cyphonic_control::ClientMsg::Flows {
                flows,
                refused,
                unreported,
            }
        ));
        // A minute's 3,000, then 50 a second.
        let mut sent = n;
        for s in 2..=40 {
            let (flows, _, unreported) = pace.batch(ended(1000), at(s), unix).unwrap();
            assert_eq!(unreported, (1000 - flows.len() + 3) as u64);
            sent += flows.len();
        }
        assert!(
            (3_000..=3_000 + 50 * 40).contains(&sent),
            "{sent} flows sent in 40 s"
        );
        let (flows, _, _) = pace.batch(ended(1000), at(41), unix).unwrap();
        assert_eq!(flows.len(), 50, "the bucket is empty: a second's refill");
        pace.unsent(150);
        let (flows, _, unreported) = pace.batch(ended(0), at(42), unix).unwrap();
        assert_eq!((flows.len(), unreported), (0, 150 + 3));
        assert!(
            pace.batch(Taken::default(), at(43), unix).is_none(),
            "nothing to say"
        );
    }

    /// A flow of the filter's, for [`FlowPace`]'s test.
    fn ended_flow(i: usize, t0: Instant, dir: Direction) -> cyphonic_tunnel::policy::Ended {
        cyphonic_tunnel::policy::Ended {
            key: cyphonic_tunnel::policy::FlowKey {
                proto: 17,
                src: Ipv4Addr::new(100, 64, 1, 10).into(),
                dst: Ipv4Addr::new(100, 64, 2, 10).into(),
                sport: u16::try_from(i % 60_000).unwrap_or_default(),
                dport: 53,
            },
            dir,
            rule: 1,
            start: t0,
            end: t0,
            forth: cyphonic_tunnel::policy::Count::default(),
            back: cyphonic_tunnel::policy::Count::default(),
        }
    }

    /// The first report goes at once; one with a changed list after 5 s since the last, one
    /// whose counters alone moved after 60 s, an unchanged one never.
    #[test]
    fn reports_go_at_once_on_a_change_and_rarely_for_counters() {
        use cyphonic_control::{TunnelPath, TunnelReport};
        let tunnel = |peer: &str, established: bool, tx_bytes: u64| TunnelReport {
            peer: peer.repeat(64),
            name: "gw2.ovl.example".into(),
            path: TunnelPath::Direct,
            reason: None,
            endpoint: None,
            established,
            handshake: Some(tx_bytes),
            tx_bytes,
            rx_bytes: 0,
        };
        let report = |tunnels| Report {
            devices: vec![],
            tunnels,
        };
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let mut pace = ReportPace::default();
        let one = report(vec![tunnel("a", true, 1)]);
        assert!(pace.due(&one, t0), "the first at once");
        assert!(!pace.due(&one, at(600)), "the same never again");
        let counted = report(vec![tunnel("a", true, 2)]);
        assert!(!pace.due(&counted, at(59)), "counters wait a minute");
        let changed = report(vec![tunnel("a", true, 2), tunnel("b", false, 0)]);
        assert!(!pace.due(&changed, at(4)), "a change waits 5 s");
        assert!(pace.due(&changed, at(5)));
        let keys = report(vec![tunnel("a", true, 2), tunnel("b", true, 0)]);
        assert!(!pace.due(&keys, at(9)));
        assert!(
            pace.due(&keys, at(10)),
            "a tunnel that got its keys is a change"
        );
        let counted = report(vec![tunnel("a", true, 9), tunnel("b", true, 3)]);
        assert!(!pace.due(&counted, at(69)));
        assert!(pace.due(&counted, at(70)));
    }

    #[test]
    fn candidates_are_the_other_addresses_once_and_bounded() {
        let a = |s: &str| {
            s.parse::<SocketAddr>()
                .unwrap_or_else(|e| panic!("{s}: {e}"))
        };
        let first = a("203.0.113.2:51820");
        assert_eq!(candidates(&[], 51820), Vec::<SocketAddr>::new());
        assert_eq!(candidates(&[first], 51820), Vec::<SocketAddr>::new());
        let list = [
            first,
            a("[fd00:203:0:113::2]:51820"),
            first,
            // Our own socket (loopback is ours everywhere): not a candidate; the same
            // address at another port is someone else.
            a("127.0.0.1:51820"),
            a("127.0.0.1:51821"),
            a("[fd00:203:0:113::2]:51820"),
            a("192.0.2.131:51820"),
            a("192.0.2.132:51820"),
        ];
        assert_eq!(
            candidates(&list, 51820),
            [list[1], list[4], list[6]],
            "not the first, not ours, no repeats, at most {MAX_CANDIDATES}"
        );
    }

    /// Answers wait per peer and leave in order, and no more than [`AWAITING`] wait in all:
    /// a flood of questions for peers that never come up cannot grow memory.
    #[test]
    fn held_answers_are_bounded_and_leave_in_order() {
        let mut a = Awaiting::default();
        for key in 0..3 {
            assert!(a.hold(7, key, Vec::new()));
        }
        let first_key = 3;
        for i in first_key..AWAITING {
            let key = u16::try_from(i).unwrap_or(u16::MAX);
            assert!(a.hold(8, key, Vec::new()), "answer {i} held");
        }
        assert!(!a.hold(9, 1, Vec::new()), "the bound holds");
        let keys: Vec<u16> = a.release(7).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, [0, 1, 2]);
        assert!(a.release(7).is_empty());
        for key in 1..=3 {
            assert!(a.hold(9, key, Vec::new()), "released answers make room");
        }
        assert!(!a.hold(9, 4, Vec::new()), "and no more than they held");
        assert_eq!(a.release(8).len(), AWAITING - 3);
        assert_eq!(a.release(9).len(), 3);
        assert_eq!(a.held, 0);
    }

    /// A certificate issued offline and renewed online is signed by the cloud's issuing CA:
    /// that CA joins the CA file (once), so that the file and the certificate still load
    /// together after a restart.
    #[test]
    fn a_renewed_certificates_issuing_ca_joins_the_ca_file_once() {
        use cyphonic_crypto::{CertificateAuthority, IssueRequest, RevocationList, TrustStore};
        let t0 = 1_800_000_000;
        let net = |s: &str| s.parse::<ipnet::IpNet>().unwrap_or_else(|_| unreachable!());
        let root =
            CertificateAuthority::generate("ovl.example", &[net("100.64.0.0/10")], t0, t0 + 1000)
                .unwrap_or_else(|_| unreachable!());
        let issuing = root
            .delegate("ovl.example", &[net("100.64.128.0/17")], t0, t0 + 900)
            .unwrap_or_else(|_| unreachable!());
        let renewed = issuing
            .issue(&IssueRequest {
                name: "gw.ovl.example".into(),
                vip_blocks: vec![net("100.64.130.0/24")],
                public_key: [5; 32],
                groups: Vec::new(),
                not_before: t0,
                not_after: t0 + 100,
            })
            .unwrap_or_else(|_| unreachable!());
        let dir = tempfile::tempdir().unwrap_or_else(|_| unreachable!());
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, root.certificate().to_pem()).unwrap_or_else(|_| unreachable!());
        let issuers = vec![issuing.certificate().clone()];
        for _ in 0..2 {
            keep_issuer(&ca_file, &issuers, &renewed).unwrap_or_else(|_| unreachable!());
        }
        let text = std::fs::read_to_string(&ca_file).unwrap_or_default();
        let cas = Certificate::all_from_pem(&text).unwrap_or_default();
        assert_eq!(cas.len(), 2, "{text}");
        let trust = TrustStore::new(cas, RevocationList::default());
        assert!(trust.is_ok_and(|t| t.verify(&renewed, t0 + 10).is_ok()));
    }
}

//! The session task and its handle.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cyphonic_control::channel::{LEN_PREFIX, frame_len};
use cyphonic_control::report::Report;
use cyphonic_control::{
    Channel, ClientHandshake, ClientMsg, CloudMsg, Hello, Mapping, NameRecord, PairState, PeerInfo,
    Prober, Resolution, TunnelVersions, VERSION, Welcome,
};
use cyphonic_crypto::{Certificate, Fingerprint, PublicKey, StaticKeypair};
use cyphonic_session::Identity;
use rand::{Rng as _, SeedableRng as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, watch};

use crate::cache::Cache;

/// Where the cloud is and how to know it.
#[derive(Debug, Clone)]
pub struct Config {
    /// The cloud's instances (NMS's control address, TCP), tried in turn until one answers:
    /// `host:port`, or an address. A host name is looked up at each attempt, so DNS may move
    /// the cloud.
    pub clouds: Vec<String>,
    /// The cloud's Noise public keys, pinned: nothing else is believed. More than one while
    /// the cloud's key is being replaced; each is tried until one answers.
    pub cloud_keys: Vec<PublicKey>,
    /// Our software and version, for the cloud's logs.
    pub agent: String,
    /// The tunnel socket's port. With it, the address we reach the cloud from, at this port,
    /// is registered as an endpoint too: when it is also where our probes come from, the
    /// cloud knows we are not behind a NAT.
    pub tunnel_port: Option<u16>,
    /// The address to connect from, on a host with several (`None`: the kernel's choice for
    /// the route to the cloud).
    pub source: Option<std::net::IpAddr>,
    /// The tunnel versions we speak, registered to a cloud of control version 15 on
    /// ([`TunnelVersions::OURS`] but in tests of mixed releases).
    pub tunnel: TunnelVersions,
}

/// What the session tells its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A session is open (again): the registration has been sent.
    Connected {
        /// Our TCP source address as the cloud sees it.
        observed: SocketAddr,
        /// The cloud instance the session is with.
        cloud: SocketAddr,
    },
    /// The cloud refused our certificate; we try again later (it may be renewed or the
    /// revocation lifted), slowly.
    Refused {
        /// The cloud's reason.
        reason: String,
    },
    /// The session ended; reconnecting.
    Disconnected {
        /// Why.
        reason: String,
    },
    /// Someone resolved one of our names: handshake with this peer now.
    Expect(PeerInfo),
    /// The cloud saw our probe come from this address.
    Observed(SocketAddr),
    /// Send `frame` from the tunnel socket to `to` (an endpoint probe).
    Probe {
        /// The cloud's probe address.
        to: SocketAddr,
        /// The UDP payload.
        frame: Vec<u8>,
    },
    /// The cloud took our registration (sent on connecting and on every change): it
    /// accepted this many names (those it refused come as [`Event::NamesRefused`]).
    Registered {
        /// Names accepted.
        accepted: usize,
    },
    /// The cloud refused some of our names.
    NamesRefused(Vec<(String, String)>),
    /// The cloud will not pair us with this peer (fingerprint: a relay or an admission we
    /// asked for), and says why.
    NotPaired {
        /// The peer's certificate fingerprint.
        peer: String,
        /// The cloud's reason.
        reason: String,
    },
    /// The cloud's issuing CAs (from its welcome): trust each that verifies under one of our
    /// roots, so that members it enrolled verify.
    Issuers(Vec<Certificate>),
    /// The cloud renewed our certificate (it certifies our key and name): take it on, write
    /// it, and hand the new identity to [`Handle::set_identity`], which reconnects with it.
    Renewed(Certificate),
    /// Certificates revoked online: believe none of them, end tunnels with their holders.
    Revoked(Vec<Fingerprint>),
    /// (Version 4.) The per-device rules the cloud compiled for us, whole: enforce them (and
    /// keep them across outages and restarts); `None`: the cloud enforces nothing per device.
    Policy(Option<cyphonic_filter::RuleSet>),
    /// (Version 6.) Whether UDP to the cloud works: a round of endpoint probes that no
    /// challenge answered within 5 s says it does not, the first challenge since says it does
    /// (docs/protocol.md §4, *Relay over a stream*). Said on each change, and first in each
    /// session once known.
    UdpToCloud(bool),
    /// (Version 12.) Record flows and send them ([`Handle::send_flows`]), or stop
    /// (docs/protocol.md §8, *Flow logs*). A new session says it again; without a session
    /// nothing changes.
    FlowLog(bool),
}

/// Why a request to the cloud did not get an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignalError {
    /// No session with the cloud right now.
    #[error("not connected to the cloud")]
    NotConnected,
    /// The cloud did not answer in time.
    #[error("the cloud did not answer in time")]
    Timeout,
    /// The session task has ended.
    #[error("the signal client has stopped")]
    Stopped,
    /// The cloud answered with an error.
    #[error("the cloud says: {0}")]
    Cloud(String),
}

/// How long a resolution may take.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const PING_EVERY: Duration = Duration::from_secs(15);
/// Without any message from the cloud for this long, the session is dead.
const SILENCE: Duration = Duration::from_secs(40);
/// Probes keep the NAT mapping towards the cloud and show a changed address.
const PROBE_EVERY: Duration = Duration::from_secs(20);
/// ... and this often while no challenge answers them.
const PROBE_EVERY_BLOCKED: Duration = Duration::from_secs(5);
/// A round of probes no challenge answered within this says UDP to the cloud fails.
const PROBE_ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// The first control version whose cloud answers every probe without a cookie with a
/// challenge: the one whose probes can tell whether UDP works.
const PROBES_CHALLENGED: u16 = 6;
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const EVENTS: usize = 256;
/// How often whether a renewal is due is checked.
const RENEW_CHECK: Duration = Duration::from_secs(5);
/// A renewal asked for and not taken on within this is asked for again.
const RENEW_RETRY: Duration = Duration::from_secs(15);
/// After the cloud refused a renewal.
const RENEW_REFUSED: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Registration {
    endpoints: Vec<SocketAddr>,
    names: Vec<NameRecord>,
    mapping: Option<Mapping>,
    tunnel: Option<TunnelVersions>,
}

impl Registration {
    /// The `register` message for a session welcomed as `version`, with `host` (our
    /// address towards the cloud, at the tunnel port) among the endpoints. A cloud before
    /// control version 14 reads no `mapping`: a mapped endpoint goes among the endpoints.
    /// One before version 15 reads no `tunnel`.
    fn message(&self, host: Option<SocketAddr>, version: u16) -> ClientMsg {
        let mut endpoints = self.endpoints.clone();
        let mut mapping = self.mapping.clone();
        let tunnel = self
            .tunnel
            .filter(|_| version >= cyphonic_control::TUNNEL_VERSION);
        if version < cyphonic_control::MAPPING_VERSION {
            let held = mapping.take().and_then(|m| m.endpoint());
            endpoints.extend(held.filter(|e| !endpoints.contains(e)));
        }
        if let Some(h) = host
            && !endpoints.contains(&h)
        {
            endpoints.push(h);
        }
        fitted(ClientMsg::Register {
            endpoints,
            names: self.names.clone(),
            mapping,
            tunnel,
        })
    }
}

type Reply = oneshot::Sender<Result<Resolution, SignalError>>;

/// Resolutions sent and not answered yet, by id.
type Pending = HashMap<u64, (String, Reply)>;

#[derive(Debug)]
enum Cmd {
    Resolve {
        name: String,
        reply: Reply,
    },
    Relay {
        peer: String,
    },
    Admit {
        peer: String,
    },
    NetworkChanged,
    Flows(ClientMsg),
    Challenged {
        from: SocketAddr,
        cookie: cyphonic_control::ReturnCookie,
    },
}

/// The owner's side: keep the registration current, resolve names.
#[derive(Debug, Clone)]
pub struct Handle {
    cmds: mpsc::Sender<Cmd>,
    identity: Arc<watch::Sender<Arc<Identity>>>,
    registration: Arc<watch::Sender<Registration>>,
    pair: Arc<watch::Sender<Option<PairState>>>,
    report: Arc<watch::Sender<Option<Report>>>,
    connected: watch::Receiver<bool>,
    cache: Arc<Cache>,
}

impl Handle {
    /// Sets what we register: our endpoints and the names we host. Sent now if connected,
    /// and on every reconnection; unchanged sets are not sent again.
    pub fn register(&self, endpoints: Vec<SocketAddr>, mut names: Vec<NameRecord>) {
        names.sort();
        names.dedup();
        self.registration.send_if_modified(|r| {
            if r.endpoints == endpoints && r.names == names {
                false
            } else {
                r.endpoints = endpoints;
                r.names = names;
                true
            }
        });
    }

    /// Sets what our router said of a mapping of the tunnel port (docs/protocol.md §4, *Port
    /// mapping*), registered with the rest; `None`: no mapping asked for or held.
    pub fn set_mapping(&self, mapping: Option<Mapping>) {
        self.registration.send_if_modified(|r| {
            if r.mapping == mapping {
                false
            } else {
                r.mapping = mapping;
                true
            }
        });
    }

    /// Sets what we report of our HA pair (docs/protocol.md §5, *Seen from the cloud*):
    /// sent after the registration in each session whose cloud reads it (control version
    /// 10), and again when it changes. None: we are not one of a pair.
    pub fn report_pair(&self, state: Option<PairState>) {
        self.pair.send_if_modified(|p| {
            if *p == state {
                false
            } else {
                *p = state;
                true
            }
        });
    }

    /// Sets what we report of our devices and tunnels (docs/protocol.md §8, *Devices and
    /// tunnels*): sent, in parts, after the registration in each session whose cloud reads
    /// it (control version 11), and again whenever it is set to something else. How often
    /// it changes is the caller's to bound.
    pub fn report(&self, report: Report) {
        self.report.send_if_modified(|r| {
            if r.as_ref() == Some(&report) {
                false
            } else {
                *r = Some(report);
                true
            }
        });
    }

    /// Our identity changed (a renewed certificate, a reload): the session is opened again
    /// with it at once. The same certificate changes nothing.
    pub fn set_identity(&self, identity: Arc<Identity>) {
        self.identity.send_if_modified(|id| {
            if id.certificate() == identity.certificate() {
                false
            } else {
                *id = identity;
                true
            }
        });
    }

    /// Resolves `name` through the cloud (or the cache).
    ///
    /// # Errors
    /// [`SignalError`]: not connected, no answer in time, or the cloud's error.
    pub async fn resolve(&self, name: &str) -> Result<Resolution, SignalError> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(hit) = self.cache.get(&name, Instant::now()) {
            return Ok(hit);
        }
        let (reply, answer) = oneshot::channel();
        self.cmds
            .send(Cmd::Resolve { name, reply })
            .await
            .map_err(|_| SignalError::Stopped)?;
        match tokio::time::timeout(RESOLVE_TIMEOUT, answer).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(SignalError::NotConnected),
            Err(_) => Err(SignalError::Timeout),
        }
    }

    /// Asks the cloud to pair us with the peer whose certificate has `fingerprint` through
    /// its relay: handshakes on the direct path went unanswered. The answer comes as an
    /// [`Event::Expect`] carrying the relay (or [`Event::NotPaired`]).
    ///
    /// # Errors
    /// [`SignalError::NotConnected`] without a session.
    pub fn request_relay(&self, fingerprint: &str) -> Result<(), SignalError> {
        if !self.is_connected() {
            return Err(SignalError::NotConnected);
        }
        self.cmds
            .try_send(Cmd::Relay {
                peer: fingerprint.to_owned(),
            })
            .map_err(|_| SignalError::Stopped)
    }

    /// Asks the cloud whether the peer whose certificate has `fingerprint`, which is
    /// handshaking with us without our knowing it, may: the answer comes as an
    /// [`Event::Expect`] describing it (or [`Event::NotPaired`]).
    ///
    /// # Errors
    /// [`SignalError::NotConnected`] without a session.
    pub fn admit(&self, fingerprint: &str) -> Result<(), SignalError> {
        if !self.is_connected() {
            return Err(SignalError::NotConnected);
        }
        self.cmds
            .try_send(Cmd::Admit {
                peer: fingerprint.to_owned(),
            })
            .map_err(|_| SignalError::Stopped)
    }

    /// Sends ended flows and refused summaries, with how many records went unreported
    /// (docs/protocol.md §8, *Flow logs*), in a session whose cloud reads them (version 12).
    ///
    /// # Errors
    /// [`SignalError::NotConnected`] without a session; [`SignalError::Stopped`] when the
    /// session's queue is full (the caller counts them as unreported).
    pub fn send_flows(
        &self,
        flows: Vec<cyphonic_control::FlowRecord>,
        refused: Vec<cyphonic_control::RefusedRecord>,
        unreported: u64,
    ) -> Result<(), SignalError> {
        if !self.is_connected() {
            return Err(SignalError::NotConnected);
        }
        self.cmds
            .try_send(Cmd::Flows(ClientMsg::Flows {
                flows,
                refused,
                unreported,
            }))
            .map_err(|_| SignalError::Stopped)
    }

    /// Our addresses or routes changed: probe the cloud again at once, so that it sees
    /// where our tunnel socket is now, and reconnect if the address this session runs from
    /// is no longer ours.
    pub fn network_changed(&self) {
        let _ = self.cmds.try_send(Cmd::NetworkChanged);
    }

    /// A return-routability challenge with `cookie` reached our tunnel socket from `from`
    /// (docs/protocol.md §4, endpoint probe): when `from` is one of the addresses this
    /// session probes, a probe answering it goes there at once ([`Event::Probe`]); anything
    /// else is ignored.
    pub fn challenged(&self, from: SocketAddr, cookie: cyphonic_control::ReturnCookie) {
        let _ = self.cmds.try_send(Cmd::Challenged { from, cookie });
    }

    /// Whether a session is open now.
    pub fn is_connected(&self) -> bool {
        *self.connected.borrow()
    }

    /// The resolution cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }
}

/// A session's endpoint probes (docs/protocol.md §4, endpoint probe): every probe carries
/// the next counter (the cloud refuses a copy of an old one); a round carries no cookie, so
/// that the cloud challenges each probe (it records where a probe came from only when it
/// answers a challenge sent there), and the probe answering a challenge carries its cookie.
/// Whether challenges come back tells whether UDP to the cloud works.
struct Probing {
    prober: Prober,
    /// The probe ports' addresses.
    to: Vec<SocketAddr>,
    /// Since when a round waits for its first challenge.
    waiting: Option<Instant>,
    /// Whether UDP to the cloud works, once judged.
    udp: Option<bool>,
}

impl Probing {
    fn new(prober: Prober, to: Vec<SocketAddr>) -> Self {
        Self {
            prober,
            to,
            waiting: None,
            udp: None,
        }
    }

    /// A round: a probe to every probe port, at `now`.
    fn round(&mut self, now: Instant) -> Vec<Event> {
        let prober = &mut self.prober;
        if !self.to.is_empty() {
            self.waiting.get_or_insert(now);
        }
        self.to
            .iter()
            .map(|to| Event::Probe {
                to: *to,
                frame: prober.next_frame(None),
            })
            .collect()
    }

    /// The probe that answers a challenge from `from`, when `from` is a probe port of ours,
    /// and whether that says UDP works where it was not known to.
    fn answer(
        &mut self,
        from: SocketAddr,
        cookie: cyphonic_control::ReturnCookie,
    ) -> Option<(Event, Option<bool>)> {
        let from = SocketAddr::new(from.ip().to_canonical(), from.port());
        let to = *self.to.iter().find(|to| **to == from)?;
        let probe = Event::Probe {
            to,
            frame: self.prober.next_frame(Some(&cookie)),
        };
        Some((probe, self.judged(true)))
    }

    /// When the round under way has waited long enough.
    fn deadline(&self) -> Option<Instant> {
        self.waiting.map(|w| w + PROBE_ANSWER_WITHIN)
    }

    /// The round under way got no challenge by `now`: `Some(false)` when that is news.
    fn unanswered(&mut self, now: Instant) -> Option<bool> {
        if self.deadline().is_none_or(|d| now < d) {
            return None;
        }
        self.judged(false)
    }

    /// The round under way is judged: UDP `works` or not; `Some(works)` when that is news.
    fn judged(&mut self, works: bool) -> Option<bool> {
        self.waiting = None;
        let news = self.udp != Some(works);
        self.udp = Some(works);
        news.then_some(works)
    }

    /// How often rounds go: faster while no challenge answers them.
    fn every(&self) -> Duration {
        if self.udp == Some(false) {
            PROBE_EVERY_BLOCKED
        } else {
            PROBE_EVERY
        }
    }
}

/// Probe rounds every `every`, the first one `every` from now.
fn rounds(every: Duration) -> tokio::time::Interval {
    tokio::time::interval_at(tokio::time::Instant::now() + every, every)
}

/// Starts the session task on the current tokio runtime. It runs until every [`Handle`] is
/// dropped.
pub fn spawn(config: Config, identity: Arc<Identity>) -> (Handle, mpsc::Receiver<Event>) {
    let (cmds, cmd_rx) = mpsc::channel(64);
    let (registration, reg_rx) = watch::channel(Registration {
        tunnel: Some(config.tunnel),
        ..Registration::default()
    });
    let (pair, pair_rx) = watch::channel(None);
    let (report, report_rx) = watch::channel(None);
    let (connected_tx, connected) = watch::channel(false);
    let (events, event_rx) = mpsc::channel(EVENTS);
    let cache = Arc::new(Cache::default());
    let (identity_tx, identity) = watch::channel(identity);
    let task = Task {
        config,
        identity,
        renew_after: None,
        policy: cyphonic_control::Assembler::default(),
        cmds: cmd_rx,
        registration: reg_rx,
        pair: pair_rx,
        report: report_rx,
        connected: connected_tx,
        events,
        cache: cache.clone(),
        timestamp: 0,
        first: 0,
        key: 0,
        at: None,
    };
    tokio::spawn(task.run());
    (
        Handle {
            cmds,
            identity: Arc::new(identity_tx),
            registration: Arc::new(registration),
            pair: Arc::new(pair),
            report: Arc::new(report),
            connected,
            cache,
        },
        event_rx,
    )
}

struct Task {
    config: Config,
    identity: watch::Receiver<Arc<Identity>>,
    /// No renewal is asked for before this (one is pending, or the cloud said no).
    renew_after: Option<Instant>,
    /// The parts of a policy set that arrived so far.
    policy: cyphonic_control::Assembler,
    cmds: mpsc::Receiver<Cmd>,
    registration: watch::Receiver<Registration>,
    /// What we report of our HA pair (none: we are not one of a pair).
    pair: watch::Receiver<Option<PairState>>,
    /// What we report of our devices and tunnels (none: nothing yet).
    report: watch::Receiver<Option<Report>>,
    connected: watch::Sender<bool>,
    events: mpsc::Sender<Event>,
    cache: Arc<Cache>,
    /// The timestamp of our last `Hello`: the next one is greater (the cloud refuses one it
    /// has seen as a replay).
    timestamp: u64,
    /// Which of `config.clouds` is tried first: the one that answered last, or, once its
    /// session ended, the next one.
    first: usize,
    /// Which of `config.cloud_keys` answered last.
    key: usize,
    /// The instance of the session open now (or last open).
    at: Option<SocketAddr>,
}

/// The wall clock in nanoseconds since the Unix epoch, or one more than `last` when the clock
/// has not moved past it (it stood still, or was set back).
fn next_timestamp(last: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    now.max(last.saturating_add(1))
}

/// The addresses of a cloud instance, `host:port` or an address, looked up now; why not, in
/// words.
async fn addresses(target: &str) -> Result<Vec<SocketAddr>, String> {
    match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host(target)).await {
        Ok(Ok(addrs)) => Ok(addrs.collect()),
        Ok(Err(e)) => Err(format!("looking up {target}: {e}")),
        Err(e) => Err(format!("looking up {target}: {e}")),
    }
}

/// What connecting and the control handshake give: the channel, the stream's halves, the
/// cloud's answer and our local address.
type Opened = (Channel, OwnedReadHalf, OwnedWriteHalf, Welcome, SocketAddr);

/// A TCP connection to `cloud`, from `source` when given.
async fn connect(
    cloud: SocketAddr,
    source: Option<std::net::IpAddr>,
) -> std::io::Result<TcpStream> {
    let Some(ip) = source else {
        return TcpStream::connect(cloud).await;
    };
    let socket = if cloud.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(ip, 0))?;
    socket.connect(cloud).await
}

/// Connects to the instance at `cloud` (from `source` when given), pinned to `key`, as
/// `keypair`, with `hello`; errors in words, naming the instance.
async fn handshake(
    (cloud, source): (SocketAddr, Option<std::net::IpAddr>),
    key: PublicKey,
    keypair: &StaticKeypair,
    hello: &Hello,
) -> Result<Opened, String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("{cloud}: {what}: {e}");
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect(cloud, source))
        .await
        .map_err(|e| fail("connect", &e))?
        .map_err(|e| fail("connect", &e))?;
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().map_err(|e| fail("connect", &e))?;
    let (mut rd, mut wr) = stream.into_split();
    let (hs, first) =
        ClientHandshake::start(keypair, &key, hello).map_err(|e| fail("handshake", &e))?;
    wr.write_all(&first)
        .await
        .map_err(|e| fail("handshake", &e))?;
    let answer = tokio::time::timeout(CONNECT_TIMEOUT, read_frame(&mut rd))
        .await
        .map_err(|e| fail("handshake", &e))?
        .map_err(|e| fail("handshake", &e))?;
    let (ch, welcome) = hs.finish(&answer).map_err(|e| fail("handshake", &e))?;
    Ok((ch, rd, wr, welcome, local))
}

/// What the cloud's AS issued for an enrollment.
#[derive(Debug, Clone)]
pub struct Enrolled {
    /// Our certificate.
    pub certificate: Certificate,
    /// The issuing CA that signed it.
    pub chain: Vec<Certificate>,
    /// The roots above it.
    pub roots: Vec<Certificate>,
}

/// Why an enrollment failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnrollError {
    /// The cloud refused the token, and says why.
    #[error("the cloud refused the enrollment: {0}")]
    Refused(String),
    /// No instance answered.
    #[error("no cloud instance answered: {0}")]
    Unreachable(String),
    /// The answer makes no sense (not an enrollment, unreadable certificates).
    #[error("the cloud's answer is not an enrollment: {0}")]
    Invalid(String),
}

/// Enrolls `keypair` with the cloud of `config` using `token` (docs/protocol.md §4,
/// Enrollment): each instance and pinned key in turn until one answers. The certificates are
/// returned as the cloud sent them; checking them against our trust is the caller's.
///
/// # Errors
/// [`EnrollError`]: refused (the reason is the cloud's), unreachable, or a strange answer.
pub async fn enroll(
    config: &Config,
    keypair: &StaticKeypair,
    token: &str,
) -> Result<Enrolled, EnrollError> {
    let hello = Hello {
        version: VERSION,
        timestamp: next_timestamp(0),
        certificate: String::new(),
        enroll: Some(token.trim().to_owned()),
        agent: config.agent.clone(),
    };
    let mut last = "no cloud address or key configured".to_owned();
    for target in &config.clouds {
        let addrs = match addresses(target).await {
            Ok(a) => a,
            Err(e) => {
                last = e;
                continue;
            }
        };
        for addr in addrs {
            for key in &config.cloud_keys {
                match handshake((addr, config.source), *key, keypair, &hello).await {
                    Ok((_, _, _, Welcome::Refused { reason }, _)) => {
                        return Err(EnrollError::Refused(reason));
                    }
                    Ok((
                        _,
                        _,
                        _,
                        Welcome::Enrolled {
                            certificate,
                            chain,
                            roots,
                        },
                        _,
                    )) => {
                        let all = |pems: &[String]| {
                            pems.iter()
                                .map(|p| Certificate::from_pem(p))
                                .collect::<Result<Vec<_>, _>>()
                                .map_err(|e| EnrollError::Invalid(e.to_string()))
                        };
                        return Ok(Enrolled {
                            certificate: Certificate::from_pem(&certificate)
                                .map_err(|e| EnrollError::Invalid(e.to_string()))?,
                            chain: all(&chain)?,
                            roots: all(&roots)?,
                        });
                    }
                    Ok(_) => {
                        return Err(EnrollError::Invalid(
                            "a session was opened instead (this cloud does not speak enrollment)"
                                .into(),
                        ));
                    }
                    Err(e) => last = e,
                }
            }
        }
    }
    Err(EnrollError::Unreachable(last))
}

/// How a session ended.
enum End {
    /// The owner is gone: stop.
    Stopped,
    /// Try again after the backoff.
    Retry(String),
    /// The cloud refused us: try again, slowly.
    Refused(String),
    /// Our certificate changed: open a new session with it at once, at the same instance.
    Renewed,
}

/// Whether `ip` is still one of this host's addresses (binding to it succeeds).
fn is_local(ip: std::net::IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

async fn read_frame(rd: &mut OwnedReadHalf) -> std::io::Result<Vec<u8>> {
    let mut prefix = [0u8; LEN_PREFIX];
    rd.read_exact(&mut prefix).await?;
    let mut buf = vec![0; frame_len(prefix)];
    rd.read_exact(&mut buf).await?;
    Ok(buf)
}

impl Task {
    fn emit(&self, e: Event) {
        if self.events.try_send(e).is_err() {
            tracing::warn!("signal events not drained: one dropped");
        }
    }

    async fn run(mut self) {
        let mut rng = rand::rngs::SmallRng::from_os_rng();
        let mut backoff = BACKOFF_MIN;
        loop {
            let started = Instant::now();
            let end = self.session().await;
            self.connected.send_replace(false);
            let refused = matches!(end, End::Refused(_));
            let wait = match end {
                End::Stopped => return,
                End::Renewed => {
                    tracing::info!(cloud = ?self.at, "our certificate changed: reconnecting with it");
                    backoff = BACKOFF_MIN;
                    continue;
                }
                End::Retry(reason) => {
                    tracing::info!(cloud = ?self.at, %reason, "control session ended; reconnecting");
                    // The instance we had may be gone: the next one is tried first.
                    if self.at.take().is_some() {
                        self.first = (self.first + 1) % self.config.clouds.len().max(1);
                    }
                    self.emit(Event::Disconnected { reason });
                    if started.elapsed() > BACKOFF_MAX {
                        backoff = BACKOFF_MIN;
                    }
                    let w = backoff;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    w
                }
                End::Refused(reason) => {
                    tracing::warn!(cloud = ?self.at, %reason, "the cloud refused us");
                    self.emit(Event::Refused { reason });
                    BACKOFF_MAX
                }
            };
            // Jitter: +-25 %, so that a fleet does not reconnect in step after an outage.
            let wait = wait.mul_f64(rng.random_range(0.75..1.25));
            // Requests made while disconnected fail at once instead of waiting.
            let sleep = tokio::time::sleep(wait);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    () = &mut sleep => break,
                    cmd = self.cmds.recv() => match cmd {
                        None => return,
                        Some(Cmd::Resolve { reply, .. }) => {
                            let _ = reply.send(Err(SignalError::NotConnected));
                        }
                        Some(
                            Cmd::Relay { .. }
                            | Cmd::Admit { .. }
                            | Cmd::Challenged { .. }
                            | Cmd::Flows(_),
                        ) => {}
                        // A new address or route may be what we were missing: try now
                        // (a refusal is not about the network, and waits).
                        Some(Cmd::NetworkChanged) if !refused => break,
                        Some(Cmd::NetworkChanged) => {}
                    },
                }
            }
        }
    }

    /// Opens a session with the first instance that answers, trying `config.clouds` in turn
    /// from [`Task::first`] (each name looked up now, each of its addresses) and, at each,
    /// the pinned keys from the one that answered last. A refusal ends the search: every
    /// instance shares the same registry and rules.
    async fn open(&mut self) -> Result<Opened, End> {
        let targets = self.config.clouds.len();
        let keys = self.config.cloud_keys.len();
        let mut last = End::Retry("no cloud address or key configured".into());
        for t in 0..targets {
            let which = (self.first + t) % targets;
            let target = self.config.clouds[which].clone();
            let addrs = match addresses(&target).await {
                Ok(a) => a,
                Err(e) => {
                    last = End::Retry(e);
                    continue;
                }
            };
            for addr in addrs {
                for k in 0..keys {
                    let key_at = (self.key + k) % keys;
                    match self.open_at(addr, self.config.cloud_keys[key_at]).await {
                        Ok(open) => {
                            (self.first, self.key, self.at) = (which, key_at, Some(addr));
                            return Ok(open);
                        }
                        Err(End::Refused(reason)) => return Err(End::Refused(reason)),
                        Err(e) => last = e,
                    }
                }
            }
        }
        Err(last)
    }

    /// One attempt: the instance at `cloud`, pinned to `key`. A cloud of an older release
    /// refuses our version, naming its own: we say `Hello` again at once in the newest of
    /// them (docs/protocol.md §4, *Versions*), and it welcomes us as that version.
    async fn open_at(&mut self, cloud: SocketAddr, key: PublicKey) -> Result<Opened, End> {
        let mut version = VERSION;
        loop {
            match self.open_as(cloud, key, version).await {
                Err(End::Refused(reason)) => match older_cloud(&reason, version) {
                    Some(theirs) => {
                        tracing::info!(%cloud, ours = VERSION, theirs, "the cloud runs an older release: speaking its control version (what later versions add is off)");
                        version = theirs;
                    }
                    None => return Err(End::Refused(reason)),
                },
                other => return other,
            }
        }
    }

    /// [`Task::open_at`] saying `Hello` as control `version`.
    async fn open_as(
        &mut self,
        cloud: SocketAddr,
        key: PublicKey,
        version: u16,
    ) -> Result<Opened, End> {
        self.timestamp = next_timestamp(self.timestamp);
        let identity = self.identity.borrow_and_update().clone();
        let hello = Hello {
            version,
            timestamp: self.timestamp,
            certificate: identity.certificate().to_pem(),
            enroll: None,
            agent: self.config.agent.clone(),
        };
        let (ch, rd, wr, welcome, local) =
            handshake((cloud, self.config.source), key, identity.keypair(), &hello)
                .await
                .map_err(End::Retry)?;
        match welcome {
            Welcome::Refused { reason } => Err(End::Refused(reason)),
            Welcome::Enrolled { .. } => Err(End::Retry(format!(
                "{cloud}: answered a session with an enrollment"
            ))),
            accepted @ Welcome::Accepted { .. } => Ok((ch, rd, wr, accepted, local)),
        }
    }

    async fn session(&mut self) -> End {
        let (mut ch, mut rd, mut wr, welcome, local) = match self.open().await {
            Ok(ok) => ok,
            Err(end) => return end,
        };
        let Welcome::Accepted {
            version,
            probe_token,
            probe_key,
            probe_ports,
            observed,
            issuers,
        } = welcome
        else {
            return End::Retry("unexpected welcome".into());
        };
        let issuers: Vec<Certificate> = issuers
            .iter()
            .filter_map(|pem| Certificate::from_pem(pem).ok())
            .collect();
        if !issuers.is_empty() {
            self.emit(Event::Issuers(issuers));
        }
        // Version 3 renews; asked for when due, checked every few seconds.
        let renews = version >= 3;
        // A policy set half received in an earlier session is not finished in this one.
        self.policy = cyphonic_control::Assembler::default();
        let mut renewal = tokio::time::interval(RENEW_CHECK);
        // Our own address, as a candidate: the one the cloud saw us come from is ours when
        // no NAT stands between.
        let host = self
            .config
            .tunnel_port
            .map(|p| SocketAddr::new(local.ip().to_canonical(), p));
        let probe_to: Vec<SocketAddr> = probe_ports
            .iter()
            .take(2)
            .filter_map(|p| Some(SocketAddr::new(self.at?.ip().to_canonical(), *p)))
            .collect();
        let mut probes = Probing::new(Prober::new(probe_token, probe_key), probe_to);
        tracing::info!(cloud = ?self.at, %observed, "control session open");
        // What the cloud told us before may be stale.
        self.cache.clear();
        self.connected.send_replace(true);
        if let Some(cloud) = self.at {
            self.emit(Event::Connected { observed, cloud });
        }
        let judges_udp = version >= PROBES_CHALLENGED;
        for p in probes.round(Instant::now()) {
            self.emit(p);
        }

        let (frames_tx, mut frames) = mpsc::channel::<Vec<u8>>(16);
        let reader = tokio::spawn(async move {
            while let Ok(f) = read_frame(&mut rd).await {
                if frames_tx.send(f).await.is_err() {
                    break;
                }
            }
        });
        let mut pending = Pending::new();
        let mut next_id = 0u64;
        let mut ping = tokio::time::interval(PING_EVERY);
        let mut probing = rounds(PROBE_EVERY);
        let mut heard = Instant::now();
        // The registration goes first.
        self.registration.mark_changed();
        // Then the pair's report, if we are one of a pair and the cloud reads it.
        let reports_pair = version >= cyphonic_control::HA_PAIR_VERSION;
        self.pair.mark_changed();
        // Then our devices and tunnels, if the cloud reads them.
        let reports = version >= cyphonic_control::REPORT_VERSION;
        self.report.mark_changed();
        // A report's parts after its first, written right after it.
        let mut parts = Vec::new();
        let end = 'session: loop {
            let out: Option<ClientMsg> = tokio::select! {
                // In this order: a registration goes out before any command issued after it (a
                // resolve right after `register` must find us registered on the cloud's side).
                // Only the registration is ever preferred: it is ready once per change.
                biased;
                changed = self.registration.changed() => {
                    if changed.is_err() {
                        break End::Stopped;
                    }
                    Some(self.registration.borrow_and_update().message(host, version))
                }
                changed = self.pair.changed(), if reports_pair => {
                    if changed.is_err() {
                        break End::Stopped;
                    }
                    self.pair.borrow_and_update().clone().map(ClientMsg::from)
                }
                changed = self.report.changed(), if reports => {
                    if changed.is_err() {
                        break End::Stopped;
                    }
                    parts = self.report.borrow_and_update().as_ref().map(|r| r.parts(version)).unwrap_or_default();
                    parts.reverse();
                    parts.pop()
                }
                f = frames.recv() => {
                    let Some(f) = f else { break End::Retry("the cloud closed the connection".into()) };
                    heard = Instant::now();
                    match ch.open::<CloudMsg>(&f).map_err(|e| e.to_string()).and_then(|msg| self.handle(msg, &mut pending)) {
                        Ok(()) => {}
                        Err(e) => break End::Retry(format!("bad message from the cloud: {e}")),
                    }
                    None
                }
                cmd = self.cmds.recv() => match cmd {
                    None => break End::Stopped,
                    Some(Cmd::Resolve { name, reply }) => {
                        next_id += 1;
                        pending.insert(next_id, (name.clone(), reply));
                        Some(ClientMsg::Resolve { id: next_id, name })
                    }
                    Some(Cmd::Relay { peer }) => Some(ClientMsg::Relay { peer }),
                    // A cloud before flow logs would close the session on it.
                    Some(Cmd::Flows(m)) => (version >= cyphonic_control::FLOWS_VERSION).then_some(m),
                    Some(Cmd::Admit { peer }) => Some(ClientMsg::Admit { peer }),
                    Some(Cmd::NetworkChanged) => {
                        if !is_local(local.ip()) {
                            break End::Retry(format!("our address {} is gone", local.ip()));
                        }
                        for p in probes.round(Instant::now()) {
                            self.emit(p);
                        }
                        None
                    }
                    Some(Cmd::Challenged { from, cookie }) => {
                        if let Some((p, udp)) = probes.answer(from, cookie) {
                            self.emit(p);
                            if let Some(works) = udp.filter(|_| judges_udp) {
                                tracing::info!(works, "UDP to the cloud");
                                self.emit(Event::UdpToCloud(works));
                                probing = rounds(probes.every());
                            }
                        }
                        None
                    }
                },
                _ = ping.tick() => {
                    if heard.elapsed() > SILENCE {
                        break End::Retry("the cloud went silent".into());
                    }
                    self.cache.sweep(Instant::now());
                    // Requests the cloud never answered (their askers timed out long ago).
                    pending.retain(|_, (_, r)| !r.is_closed());
                    Some(ClientMsg::Ping {})
                }
                _ = probing.tick() => {
                    for p in probes.round(Instant::now()) {
                        self.emit(p);
                    }
                    None
                }
                () = tokio::time::sleep_until(probes.deadline().unwrap_or_else(Instant::now).into()), if judges_udp && probes.deadline().is_some() => {
                    if let Some(works) = probes.unanswered(Instant::now()) {
                        tracing::warn!(works, "UDP to the cloud: no probe answered");
                        self.emit(Event::UdpToCloud(works));
                        probing = rounds(probes.every());
                    }
                    None
                }
                _ = renewal.tick(), if renews => self.renewal_due().then_some(ClientMsg::Renew {}),
                changed = self.identity.changed() => {
                    if changed.is_err() {
                        break End::Stopped;
                    }
                    self.renew_after = None;
                    break End::Renewed;
                }
            };
            let rest = std::iter::from_fn(|| parts.pop());
            for out in out.into_iter().chain(rest) {
                let frame = match ch.seal(&out) {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::warn!(error = %e, "control message not sent");
                        continue;
                    }
                };
                if let Err(e) = wr.write_all(&frame).await {
                    break 'session End::Retry(format!("write: {e}"));
                }
            }
        };
        reader.abort();
        for (_, (_, reply)) in pending {
            let _ = reply.send(Err(SignalError::NotConnected));
        }
        end
    }

    /// Whether to ask for a renewal now: two thirds of our certificate's validity have passed,
    /// and no renewal is pending (asked less than [`RENEW_RETRY`] ago) or was refused lately.
    fn renewal_due(&mut self) -> bool {
        let now = Instant::now();
        if self.renew_after.is_some_and(|t| now < t) {
            return false;
        }
        let body = self.identity.borrow().certificate().body().clone();
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let due = body.not_before + (body.not_after.saturating_sub(body.not_before)) / 3 * 2;
        if unix < due {
            return false;
        }
        tracing::info!(
            not_after = body.not_after,
            "asking the cloud to renew our certificate"
        );
        self.renew_after = Some(now + RENEW_RETRY);
        true
    }

    /// Acts on a message from the cloud; an error ends the session.
    fn handle(&mut self, msg: CloudMsg, pending: &mut Pending) -> Result<(), String> {
        match msg {
            CloudMsg::Policy {
                version,
                enforce,
                rules,
                more,
            } => {
                if let Some(set) = self
                    .policy
                    .take(version, enforce, &rules, more)
                    .map_err(|e| e.to_string())?
                {
                    self.emit(Event::Policy(set));
                }
            }
            CloudMsg::Renewed { certificate } => {
                let ours = self.identity.borrow().certificate().body().clone();
                match Certificate::from_pem(&certificate) {
                    Ok(c)
                        if c.body().public_key == ours.public_key
                            && c.body().name == ours.name
                            && c.body().vip_blocks == ours.vip_blocks =>
                    {
                        self.emit(Event::Renewed(c));
                    }
                    Ok(_) => tracing::warn!(
                        "the cloud renewed our certificate into one for another key, name or blocks: ignored"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "the cloud sent an unreadable renewed certificate");
                    }
                }
            }
            CloudMsg::Revoked { fingerprints } => {
                let fps: Vec<Fingerprint> =
                    fingerprints.iter().filter_map(|f| f.parse().ok()).collect();
                if fps.len() < fingerprints.len() {
                    tracing::warn!("the cloud sent revocations that are not fingerprints: skipped");
                }
                if !fps.is_empty() {
                    self.emit(Event::Revoked(fps));
                }
            }
            CloudMsg::NotRenewed { reason } => {
                tracing::warn!(%reason, "the cloud will not renew our certificate: asking again in an hour");
                self.renew_after = Some(Instant::now() + RENEW_REFUSED);
            }
            CloudMsg::Resolved { id, resolution, .. } => {
                if let Some((name, reply)) = pending.remove(&id) {
                    self.cache.put(&name, resolution.clone(), Instant::now());
                    let _ = reply.send(Ok(resolution));
                }
            }
            CloudMsg::Expect { peer } => self.emit(Event::Expect(peer)),
            CloudMsg::Observed { endpoint } => self.emit(Event::Observed(endpoint)),
            CloudMsg::Registered { accepted, refused } => {
                tracing::debug!(accepted, refused = refused.len(), "registered");
                self.emit(Event::Registered { accepted });
                if !refused.is_empty() {
                    self.emit(Event::NamesRefused(refused));
                }
            }
            CloudMsg::NotPaired { peer, reason } => self.emit(Event::NotPaired { peer, reason }),
            CloudMsg::Pong {} => {}
            CloudMsg::FlowLog { on } => self.emit(Event::FlowLog(on)),
            CloudMsg::Error { reason } => {
                tracing::warn!(%reason, "the cloud reports an error");
                // The request it concerns cannot be told apart: fail them all, they retry.
                for (_, (_, reply)) in pending.drain() {
                    let _ = reply.send(Err(SignalError::Cloud(reason.clone())));
                }
            }
        }
        Ok(())
    }
}

/// `msg` as it fits a control frame: a registration too large for one leaves out names of
/// The control version to say `Hello` in again after the refusal `reason` of a `Hello` in
/// `version`: the newest the cloud names, when it is older than `version` and one we speak
/// (a cloud of an older release); `None` for any other refusal.
fn older_cloud(reason: &str, version: u16) -> Option<u16> {
    let theirs = *cyphonic_control::versions_refused(reason)?.end();
    (cyphonic_control::MIN_VERSION..version)
        .contains(&theirs)
        .then_some(theirs)
}

/// devices with IPv6 only (those without a vIP, which any MAC on a LAN can make many of),
/// the last first, until it fits; what still does not fit is the sender's to report.
fn fitted(msg: ClientMsg) -> ClientMsg {
    let ClientMsg::Register {
        endpoints,
        mut names,
        mapping,
        tunnel,
    } = msg
    else {
        return msg;
    };
    let fits = |names: &[NameRecord]| {
        cyphonic_control::channel::fits(&ClientMsg::Register {
            endpoints: endpoints.clone(),
            names: names.to_vec(),
            mapping: mapping.clone(),
            tunnel,
        })
    };
    let mut dropped = 0usize;
    while !fits(&names) {
        let Some(last) = names.iter().rposition(|n| n.vip.is_none()) else {
            break;
        };
        // Halves the surplus at a time: a few encodings for any size.
        let surplus = names.iter().filter(|n| n.vip.is_none()).count().div_ceil(8);
        let mut gone = 0;
        let mut i = last + 1;
        while gone < surplus.max(1) && i > 0 {
            i -= 1;
            if names[i].vip.is_none() {
                names.remove(i);
                gone += 1;
            }
        }
        dropped += gone;
    }
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "the registration would not fit a control message: names of devices with IPv6 only left out"
        );
    }
    ClientMsg::Register {
        endpoints,
        names,
        mapping,
        tunnel,
    }
}

#[cfg(test)]
mod tests {
    use cyphonic_control::{ClientMsg, NameRecord};

    /// A registration that would not fit a control message leaves out names of devices with
    /// IPv6 only, the last first, and keeps every name with a vIP; one that fits is sent
    /// whole.
    #[test]
    fn a_registration_too_large_for_a_frame_leaves_out_ipv6_only_names() {
        let record = |i: u16, v4: bool| NameRecord {
            name: format!("device-with-a-long-name-{i}.gw1.ovl.example"),
            vip: v4.then(|| std::net::Ipv4Addr::from(0x6440_0000 + u32::from(i))),
            vip6: Some(std::net::Ipv6Addr::new(0xfd7a, 0, 1, 0x100, 0, 0, 1, i)),
            legacy: None,
        };
        let names: Vec<NameRecord> = (0..400)
            .map(|i| record(i, true))
            .chain((400..1400).map(|i| record(i, false)))
            .collect();
        let whole = ClientMsg::Register {
            endpoints: Vec::new(),
            names: names.clone(),
            mapping: None,
            tunnel: None,
        };
        assert!(!cyphonic_control::channel::fits(&whole));
        let fitted = super::fitted(whole);
        assert!(cyphonic_control::channel::fits(&fitted));
        let ClientMsg::Register { names: kept, .. } = fitted else {
            unreachable!()
        };
        assert_eq!(kept.iter().filter(|n| n.vip.is_some()).count(), 400);
        let only6 = kept.iter().filter(|n| n.vip.is_none()).count();
        assert!((1..1000).contains(&only6), "{only6}");
        assert_eq!(kept[..], names[..kept.len()], "the last left out");
        let small = ClientMsg::Register {
            endpoints: Vec::new(),
            names: names[..10].to_vec(),
            mapping: None,
            tunnel: Some(cyphonic_control::TunnelVersions::OURS),
        };
        assert_eq!(super::fitted(small.clone()), small);
    }

    /// A mapped endpoint is registered as `mapping` where the cloud reads it, among the
    /// endpoints where it does not; a refusal only where it is read.
    #[test]
    fn a_mapping_is_registered_as_the_session_version_reads_it() {
        use cyphonic_control::{MAPPING_VERSION, MapProtocol, Mapping};
        let a = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        let host = a("192.0.2.130:51820");
        let mapped = Mapping::Mapped {
            protocol: MapProtocol::Pcp,
            endpoint: a("203.0.113.2:51820"),
        };
        let refused = Mapping::Refused {
            protocol: MapProtocol::Upnp,
            reason: "not authorized".into(),
        };
        let msg = |mapping: Option<Mapping>, version: u16| {
            let r = super::Registration {
                endpoints: vec![a("198.51.100.9:51820")],
                names: Vec::new(),
                mapping,
                tunnel: None,
            };
            let ClientMsg::Register {
                endpoints, mapping, ..
            } = r.message(Some(host), version)
            else {
                unreachable!()
            };
            (endpoints, mapping)
        };
        let plain = vec![a("198.51.100.9:51820"), host];
        assert_eq!(
            msg(Some(mapped.clone()), MAPPING_VERSION),
            (plain.clone(), Some(mapped.clone()))
        );
        assert_eq!(
            msg(Some(mapped), MAPPING_VERSION - 1),
            (
                vec![a("198.51.100.9:51820"), a("203.0.113.2:51820"), host],
                None
            )
        );
        assert_eq!(
            msg(Some(refused.clone()), MAPPING_VERSION),
            (plain.clone(), Some(refused.clone()))
        );
        assert_eq!(
            msg(Some(refused), MAPPING_VERSION - 1),
            (plain.clone(), None)
        );
        assert_eq!(msg(None, MAPPING_VERSION), (plain, None));
    }

    /// A cloud of an older release is spoken to in its newest version; a refusal of anything
    /// else, or one naming no version below ours, ends the attempt.
    #[test]
    fn an_older_cloud_is_spoken_to_in_its_newest_version() {
        use super::older_cloud;
        use cyphonic_control::{MIN_VERSION, VERSION};
        let older = format!(
            "protocol version {VERSION} is not spoken here (this cloud speaks 2 to {})",
            VERSION - 1
        );
        assert_eq!(older_cloud(&older, VERSION), Some(VERSION - 1));
        // Already at its newest and still refused: nothing more to try.
        assert_eq!(older_cloud(&older, VERSION - 1), None);
        let newer = format!(
            "protocol version {VERSION} is not spoken here (this cloud speaks {} to {})",
            VERSION + 1,
            VERSION + 2
        );
        assert_eq!(older_cloud(&newer, VERSION), None);
        let ancient = format!(
            "protocol version {VERSION} is not spoken here (this cloud speaks 0 to {})",
            MIN_VERSION - 1
        );
        assert_eq!(older_cloud(&ancient, VERSION), None);
        assert_eq!(older_cloud("certificate: expired", VERSION), None);
    }

    /// Our tunnel versions are registered where the cloud reads them (control version 15).
    #[test]
    fn tunnel_versions_are_registered_as_the_session_version_reads_them() {
        use cyphonic_control::{TUNNEL_VERSION, TunnelVersions};
        let r = super::Registration {
            tunnel: Some(TunnelVersions::OURS),
            ..super::Registration::default()
        };
        let tunnel = |version| match r.message(None, version) {
            ClientMsg::Register { tunnel, .. } => tunnel,
            other => unreachable!("{other:?}"),
        };
        assert_eq!(tunnel(TUNNEL_VERSION), Some(TunnelVersions::OURS));
        assert_eq!(tunnel(TUNNEL_VERSION - 1), None);
    }

    #[test]
    fn handshake_timestamps_only_grow_even_when_the_clock_does_not() {
        let a = super::next_timestamp(0);
        assert!(
            a > 1_600_000_000_000_000_000,
            "the wall clock, in nanoseconds"
        );
        let b = super::next_timestamp(a);
        assert!(b > a);
        // A clock behind the last Hello (set back, or a restart before NTP): one more.
        assert_eq!(super::next_timestamp(u64::MAX - 5), u64::MAX - 4);
    }

    /// docs/protocol.md §4, *Relay over a stream*: a round of probes no challenge answers
    /// within 5 s says UDP to the cloud fails (once, and rounds go every 5 s); a challenge
    /// from a probe port says it works again (once), one from elsewhere says nothing; every
    /// round's probes carry no cookie (each earns a challenge), the answer carries its own.
    #[test]
    fn probes_tell_whether_udp_to_the_cloud_works() {
        use std::time::{Duration, Instant};

        use cyphonic_control::{Probe, Prober, ReturnCookie};

        use super::{Event, PROBE_EVERY, PROBE_EVERY_BLOCKED, Probing};
        let port = "198.51.100.1:7001".parse().unwrap();
        let mut p = Probing::new(Prober::new([1; 16], [2; 16]), vec![port]);
        let t = Instant::now();
        let cookie = |e: &Event| match e {
            Event::Probe { frame, .. } => Probe::parse(frame).unwrap().cookie,
            _ => panic!("not a probe"),
        };
        let round = p.round(t);
        assert_eq!(round.len(), 1);
        assert_eq!(cookie(&round[0]), None);
        assert_eq!(p.unanswered(t + Duration::from_millis(4900)), None);
        // A second round does not push the wait back.
        p.round(t + Duration::from_secs(1));
        assert_eq!(p.unanswered(t + Duration::from_secs(5)), Some(false));
        assert_eq!(p.every(), PROBE_EVERY_BLOCKED);
        p.round(t + Duration::from_secs(10));
        assert_eq!(p.unanswered(t + Duration::from_secs(15)), None, "no news");
        let c = ReturnCookie {
            time_ms: 1_800_000_000_000,
            cookie: [3; 16],
        };
        assert!(p.answer("192.0.2.9:7001".parse().unwrap(), c).is_none());
        let (probe, news) = p.answer(port, c).unwrap();
        assert_eq!(news, Some(true));
        assert_eq!(cookie(&probe), Some(c));
        assert_eq!(p.every(), PROBE_EVERY);
        assert_eq!(p.deadline(), None);
        assert_eq!(p.answer(port, c).unwrap().1, None, "no news");
        let round = p.round(t + Duration::from_secs(20));
        assert_eq!(
            cookie(&round[0]),
            None,
            "a round's probes earn a challenge each"
        );
    }
}

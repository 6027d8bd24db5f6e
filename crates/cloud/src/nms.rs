//! AS and NMS: control sessions with adapters and nodes (Noise over TCP), certificate checks,
//! registration, resolution with policy, signalling pushed to both sides, and the UDP endpoint
//! probe that shows the cloud each client's NAT-mapped tunnel address.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cyphonic_control::channel::{LEN_PREFIX, MAX_HELLO_FRAME, frame_len};
use cyphonic_control::probe::PROBE_KEY_LEN;
use cyphonic_control::{
    Allowed, ClientMsg, CloudMsg, MIN_VERSION, NameRecord, PROBE_TOKEN_LEN, PeerInfo, Probe,
    RelayInfo, RelayReason, Resolution, ServerHandshake, VERSION, Welcome, check_name,
};
use cyphonic_crypto::{CertBody, CertKind, Certificate, Fingerprint, StaticKeypair, TrustStore};
use dashmap::DashMap;
use sqlx::postgres::PgListener;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{mpsc, watch};

use crate::guard::{Freshness, MAX_UNPROVEN, MAX_UNPROVEN_PER_SOURCE, Requests, Ticket, Unproven};
use crate::policy::{Compiled, Policy};
use crate::route;
use crate::store::{ClientRow, Store};
use crate::trs::{Channel, Trs};

/// A client that says nothing for this long is gone (clients ping every 15 s).
const IDLE: Duration = Duration::from_secs(60);
/// A connection must send its first message within this, and, once welcomed, prove itself
/// (its first transport message) within this again.
const HANDSHAKE_TIME: Duration = Duration::from_secs(5);
/// Endpoints one client may register.
const MAX_ENDPOINTS: usize = 16;
/// Names one client may register.
const MAX_NAMES: usize = 1024;
/// Messages waiting to be pushed to one client. An adapter is told to expect each node that
/// resolves one of its names: 64 nodes resolving at once filled a queue of 64 while the
/// adapter took each (a handshake to start), and the `expect`s past it were lost, each
/// peer then joining seconds later through its own retries and the adapter's `admit`s
/// (issue 24, the swarm). Slots are allocated as they fill, not up front.
const PUSH_QUEUE: usize = 1024;
/// Relay channels one client may hold at once.
const MAX_CHANNELS_PER_CLIENT: usize = 64;
/// Fingerprints in one `revoked` message (65 bytes of JSON each: a message stays far below a
/// frame).
const REVOKED_PER_MESSAGE: usize = 500;
/// How often the registry's online revocations are read, and the policy recompiled when
/// the registry changed.
const REVOCATIONS_EVERY: Duration = Duration::from_secs(2);

cyphonic_telemetry::counters! {
    /// NMS's counters.
    pub struct Stats {
        /// Control sessions opened (proven: the client's first message decrypted).
        sessions,
        /// Handshakes refused (bad certificate, wrong version) or failed (not Noise to our key, a first frame over the limit, nothing in time).
        refused,
        /// First messages whose timestamp was not fresh for their identity that never proved themselves (replays), and stale enrollments.
        replays,
        /// First messages whose timestamp was not fresh for their identity that proved themselves: a client whose clock went back (a restart before NTP), admitted.
        clock_went_back,
        /// Sessions closed because a newer certificate of their name for another key is known (a re-keyed or replaced member: the old key may be stolen).
        superseded,
        /// Sessions closed because their certificate's blocks overlap those of a member of another name with a valid certificate (no two names hold one address).
        overlapping,
        /// Unproven connections closed to give their place to a source that held fewer (every place was taken).
        unproven_evicted,
        /// Connections closed at once: too many unproven ones, in all or from their source.
        connections_refused,
        /// Welcomed sessions that never proved themselves (no first message in time).
        unproven,
        /// Requests that waited for their class's rate.
        throttled,
        /// Messages that did not authenticate or parse; each closes its session.
        malformed,
        /// Names refused at registration (outside the certificate, taken).
        names_refused,
        /// Resolutions asked.
        resolves,
        /// Resolutions denied by policy.
        denied,
        /// Endpoint probes accepted.
        probes,
        /// Endpoint probes refused (malformed, unknown token, bad MAC, an old counter, the other version's kind, over the session's rate of challenges).
        probes_refused,
        /// Challenges sent to the sources of probes that did not answer one.
        probe_challenges,
        /// Observed addresses written to the store (only when they changed).
        endpoint_writes,
        /// Pairs sent through the relay.
        relayed_pairs,
        /// Messages for a client dropped because its push queue was full (it reads too slowly, or is swamped).
        pushes_dropped,
        /// Relay channels asked for by clients whose direct handshakes found no path.
        relay_requests,
        /// Relay requests refused (no relay, unknown peer, policy, limits).
        relays_refused,
        /// Enrollment tokens redeemed: certificates issued to new members.
        enrolled,
        /// Enrollments refused (unknown, used, expired or revoked token; no issuing here).
        enroll_refused,
        /// Certificates renewed.
        renewed,
        /// Renewals refused (too early, expired, outside the issuing CA, no issuing here).
        renew_refused,
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// IPv4 clients of a dual-stack socket appear as `::ffff:a.b.c.d`: the address they have.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// A message for a client connected to another instance, through the shared store.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Signal {
    /// The client's certificate fingerprint.
    to: String,
    /// What to push to it.
    msg: CloudMsg,
}

/// One client connected to this instance.
#[derive(Debug)]
struct Connected {
    /// Distinguishes a reconnected client's new session from its old one.
    serial: u64,
    /// Pushes to the client.
    tx: mpsc::Sender<CloudMsg>,
    /// The address the client reached us on (the relay's address for it, unless configured).
    local: IpAddr,
    /// Its certificate's name.
    name: String,
    /// Where its session comes from.
    from: SocketAddr,
    /// When the session opened.
    since: std::time::Instant,
    /// The control version it speaks: what may be pushed to it.
    version: u16,
}

/// Where a session's probes come from, per probe port: written by the probe readers, acted on
/// by the session.
type Seen = [Option<SocketAddr>; 2];

/// The first control version whose probes and relay binds answer challenges.
const BINDS_WITH_COOKIES: u16 = 6;

/// What the probe readers know of one session.
#[derive(Debug)]
struct ProbeSession {
    /// The key of its probes' MAC.
    key: [u8; PROBE_KEY_LEN],
    /// The last counter accepted, per port.
    counters: [u64; 2],
    /// A version-5 client: its probes carry no cookie, and are taken as they come.
    legacy: bool,
    /// Per port, the time of the cookie of the last probe an address was recorded from.
    cookies: [u64; 2],
    /// Challenges sent in the second that began at `window` (milliseconds).
    window: u64,
    challenged: u8,
    /// Tells the session where its probes come from.
    seen: watch::Sender<Seen>,
}

/// What a probe makes the probe reader do.
enum ProbeVerdict {
    /// Nothing: refused (counted).
    Refused,
    /// Taken: its source is recorded (or, for a version-5 client, taken as it came).
    Recorded,
    /// Taken, but its source has not proved it receives there: send it this challenge.
    Challenge(Vec<u8>),
}

/// The NMS state shared by every connection.
#[derive(Debug)]
pub struct Nms {
    key: StaticKeypair,
    /// The CAs and revocations clients are checked against; replaced by a reload.
    trust: std::sync::RwLock<Arc<TrustStore>>,
    store: Store,
    /// Who may reach whom, as configured; replaced by a reload.
    policy: std::sync::RwLock<Arc<Policy>>,
    /// The policy compiled against the registry: what clients enforce and pairing follows.
    compiled: watch::Sender<Arc<Compiled>>,
    /// Changes with every reload and every revocation: the policy is compiled again.
    policy_generation: AtomicU64,
    probe_ports: Vec<u16>,
    trs: Option<Arc<Trs>>,
    connected: DashMap<String, Connected>,
    tokens: DashMap<[u8; PROBE_TOKEN_LEN], ProbeSession>,
    /// Makes and checks the cookies of the probes' challenges.
    challenger: cyphonic_control::Challenger,
    serial: AtomicU64,
    unproven: Arc<Unproven>,
    freshness: Arc<Freshness>,
    /// Online issuing: enrollment and renewal (`[enroll]`).
    issuer: Option<crate::enroll::Issuer>,
    /// The registry's online revocations taken on so far (kept across reloads of the file).
    revoked_online: std::sync::Mutex<std::collections::HashSet<Fingerprint>>,
    /// Counters.
    pub stats: Stats,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn random16() -> Option<[u8; 16]> {
    use ring::rand::SecureRandom as _;
    let mut t = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut t).ok()?;
    Some(t)
}

/// `fps` as `revoked` messages of at most [`REVOKED_PER_MESSAGE`] fingerprints.
fn revoked_messages(fps: &[Fingerprint]) -> Vec<CloudMsg> {
    fps.chunks(REVOKED_PER_MESSAGE)
        .map(|chunk| CloudMsg::Revoked {
            fingerprints: chunk.iter().map(ToString::to_string).collect(),
        })
        .collect()
}

/// A handshake verdict: the certificate, or why it was refused.
fn admit(
    trust: &TrustStore,
    hs: &ServerHandshake,
    now: u64,
) -> Result<(Certificate, String), String> {
    let hello = hs.hello();
    if !(MIN_VERSION..=VERSION).contains(&hello.version) {
        return Err(format!(
            "protocol version {} is not spoken here (this cloud speaks {MIN_VERSION} to {VERSION})",
            hello.version
        ));
    }
    let cert =
        Certificate::from_pem(&hello.certificate).map_err(|e| format!("certificate: {e}"))?;
    trust
        .verify(&cert, now)
        .map_err(|e| format!("certificate: {e}"))?;
    if cert.body().kind != CertKind::Node {
        return Err("a CA certificate cannot open a session".into());
    }
    if cert.body().public_key != hs.remote_static().0 {
        return Err("the certificate certifies another Noise key than the one used".into());
    }
    let pem = cert.to_pem();
    Ok((cert, pem))
}

/// The next frame, refused (as `InvalidData`) when its prefix announces more than `max` bytes:
/// nothing is allocated or read for it.
async fn read_frame(rd: &mut OwnedReadHalf, max: usize) -> std::io::Result<Vec<u8>> {
    let mut prefix = [0u8; LEN_PREFIX];
    rd.read_exact(&mut prefix).await?;
    let len = frame_len(prefix);
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes where at most {max} may come"),
        ));
    }
    let mut buf = vec![0; len];
    rd.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Seals and writes `msg` as a client speaking `version` reads it; why the session must end
/// when that fails.
async fn send(
    ch: &mut cyphonic_control::Channel,
    wr: &mut OwnedWriteHalf,
    version: u16,
    msg: &CloudMsg,
) -> Result<(), &'static str> {
    let sealed = if version < VERSION {
        ch.seal(&msg.clone().for_version(version))
    } else {
        ch.seal(msg)
    };
    let frame = sealed.map_err(|_| "oversize message")?;
    wr.write_all(&frame).await.map_err(|_| "write failed")
}

/// A session that passed the handshake and proved itself.
struct Open {
    ch: cyphonic_control::Channel,
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    fp: String,
    body: CertBody,
    /// Its first message: the proof.
    first: ClientMsg,
    /// Where its probes come from.
    seen: watch::Receiver<Seen>,
    /// Holds the identity's handshake timestamp in memory while the session lives.
    _live: crate::guard::Live,
    /// The control version it speaks.
    version: u16,
}

impl Nms {
    /// The NMS over `store`, telling clients to probe `probe_ports`, pairing them through
    /// `trs` when they cannot talk directly.
    pub fn new(
        key: StaticKeypair,
        trust: TrustStore,
        store: Store,
        policy: Policy,
        probe_ports: Vec<u16>,
        trs: Option<Arc<Trs>>,
    ) -> Self {
        Self {
            key,
            trust: std::sync::RwLock::new(Arc::new(trust)),
            store,
            policy: std::sync::RwLock::new(Arc::new(policy)),
            compiled: watch::Sender::new(Arc::new(Compiled::default())),
            policy_generation: AtomicU64::new(0),
            probe_ports,
            trs,
            connected: DashMap::new(),
            tokens: DashMap::new(),
            challenger: cyphonic_control::Challenger::new(
                cyphonic_crypto::cookie::CookieSecret::random()
                    .expect("the system's random number generator failed"),
            ),
            serial: AtomicU64::new(0),
            unproven: Unproven::new(MAX_UNPROVEN, MAX_UNPROVEN_PER_SOURCE),
            freshness: Freshness::new(),
            issuer: None,
            revoked_online: std::sync::Mutex::new(std::collections::HashSet::new()),
            stats: Stats::default(),
        }
    }

    /// Issues online with `issuer`: enrolls members that bring a token, renews certificates.
    #[must_use]
    pub fn with_issuer(mut self, issuer: Option<crate::enroll::Issuer>) -> Self {
        self.issuer = issuer;
        self
    }

    /// Accepts control sessions on `listener` until the task is dropped; its sessions end
    /// with it. A connection beyond the unproven caps is closed at once.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let mut sessions = tokio::task::JoinSet::new();
        loop {
            match listener.accept().await {
                Ok((stream, from)) => {
                    while sessions.try_join_next().is_some() {}
                    let Some(ticket) = self.unproven.enter(from.ip()) else {
                        bump(&self.stats.connections_refused);
                        tracing::debug!(%from, "too many unproven control connections: closed");
                        continue;
                    };
                    let me = self.clone();
                    sessions.spawn(async move { me.session(stream, from, ticket).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a control connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Connections that have not proven themselves, now.
    pub fn unproven_now(&self) -> usize {
        self.unproven.held()
    }

    async fn session(self: Arc<Self>, stream: TcpStream, from: SocketAddr, ticket: Ticket) {
        let _ = stream.set_nodelay(true);
        // A dual-stack listener shows IPv4 clients as ::ffff:a.b.c.d.
        let from = canonical(from);
        let local = stream
            .local_addr()
            .map_or(IpAddr::from([0, 0, 0, 0]), |l| l.ip().to_canonical());
        let (rd, wr) = stream.into_split();
        let Some(token) = random16() else {
            return;
        };
        // Until it proves itself, the connection holds an unproven place, which a source
        // holding fewer may take (guard::Unproven): then it closes.
        let opened = tokio::select! {
            o = self.open(rd, wr, from, token) => o,
            () = ticket.evicted() => {
                bump(&self.stats.unproven_evicted);
                tracing::debug!(%from, "an unproven control connection gave its place to another source's: closed");
                None
            }
        };
        let Some(open) = opened else {
            self.tokens.remove(&token);
            return;
        };
        // Proven: from here on it is the client's session and may replace an older one.
        drop(ticket);
        self.run(open, from, local, token).await;
        self.tokens.remove(&token);
    }

    /// The handshake, up to the client's proof: its first transport message, which only the
    /// holder of the handshake's ephemeral key can make. A replayed first message gets no
    /// further than the freshness check; a fresh one that never proves itself replaces
    /// nothing and ends here.
    async fn open(
        &self,
        mut rd: OwnedReadHalf,
        mut wr: OwnedWriteHalf,
        from: SocketAddr,
        token: [u8; PROBE_TOKEN_LEN],
    ) -> Option<Open> {
        let opened = tokio::time::timeout(HANDSHAKE_TIME, async {
            let first = match read_frame(&mut rd, MAX_HELLO_FRAME).await {
                Ok(f) => f,
                Err(e) => {
                    tracing::debug!(%from, error = %e, "no first control message");
                    return None;
                }
            };
            match ServerHandshake::accept(&self.key, &first) {
                Ok(hs) => Some(hs),
                Err(e) => {
                    tracing::debug!(%from, error = %e, "not a control handshake for this cloud");
                    None
                }
            }
        })
        .await;
        let Ok(Some(hs)) = opened else {
            bump(&self.stats.refused);
            return None;
        };
        let (key, timestamp) = (hs.remote_static(), hs.hello().timestamp);
        // A timestamp not greater than the last admitted one is a replay, or a client whose
        // clock went back across a restart (a Pi before NTP). Either may go on as far as its
        // proof (the first transport message, which only the holder of the handshake's
        // ephemeral key can make): a replay never gets there and replaces nothing, a client
        // does and is admitted (issue 49, finding 5). An enrollment is redeemed before any
        // proof: a stale one is closed here.
        let stale = self
            .freshness
            .is_replay(&key, timestamp, std::time::Instant::now());
        if stale && hs.hello().enroll.is_some() {
            bump(&self.stats.replays);
            tracing::debug!(%from, client = %key, "an enrollment handshake seen before: closed");
            return None;
        }
        if hs.hello().enroll.is_some() {
            let welcome = match self.redeem(&hs).await {
                Ok(w) => {
                    bump(&self.stats.enrolled);
                    w
                }
                Err(reason) => {
                    bump(&self.stats.enroll_refused);
                    tracing::info!(%from, %reason, "enrollment refused");
                    Welcome::Refused { reason }
                }
            };
            if let Ok((_, frame)) = hs.answer(&welcome) {
                let _ = wr.write_all(&frame).await;
            }
            return None;
        }
        let (cert, pem) = match admit(&self.trust(), &hs, unix_now()) {
            Ok(ok) => ok,
            Err(reason) => {
                bump(&self.stats.refused);
                tracing::info!(%from, %reason, "control session refused");
                if let Ok((_, frame)) = hs.answer(&Welcome::Refused { reason }) {
                    let _ = wr.write_all(&frame).await;
                }
                return None;
            }
        };
        let live = self
            .freshness
            .admit(key, timestamp, std::time::Instant::now());
        let probe_key = random16()?;
        let version = hs.hello().version;
        let issuers = match &self.issuer {
            Some(i) if version >= 3 && !i.certificate().is_root() => {
                vec![i.certificate().to_pem()]
            }
            _ => Vec::new(),
        };
        let (mut ch, frame) = hs
            .answer(&Welcome::Accepted {
                version,
                probe_token: token,
                probe_key,
                probe_ports: self.probe_ports.clone(),
                observed: from,
                issuers,
            })
            .ok()?;
        // Known before the client hears the welcome: its first probe may arrive at once.
        let (seen_tx, seen) = watch::channel(Seen::default());
        self.tokens.insert(
            token,
            ProbeSession {
                key: probe_key,
                counters: [0; 2],
                legacy: version < BINDS_WITH_COOKIES,
                cookies: [0; 2],
                window: 0,
                challenged: 0,
                seen: seen_tx,
            },
        );
        wr.write_all(&frame).await.ok()?;
        let body = cert.body().clone();
        let Ok(Ok(first)) = tokio::time::timeout(
            HANDSHAKE_TIME,
            read_frame(&mut rd, cyphonic_control::channel::MAX_FRAME),
        )
        .await
        else {
            if stale {
                bump(&self.stats.replays);
                tracing::debug!(%from, client = %key, "a control handshake seen before never proved itself: a replay, closed");
            } else {
                bump(&self.stats.unproven);
                tracing::info!(name = %body.name, %from, "a welcomed control session sent nothing in time: closed, replacing nothing");
            }
            return None;
        };
        let first = match ch.open::<ClientMsg>(&first) {
            Ok(m) => m,
            Err(e) => {
                bump(&self.stats.malformed);
                tracing::info!(name = %body.name, %from, error = %e, "a welcomed control session's first message does not open: closed, replacing nothing");
                return None;
            }
        };
        if stale {
            bump(&self.stats.clock_went_back);
            tracing::info!(name = %body.name, %from, "a client whose clock went back (its handshake's time is not after its last one's) proved itself: admitted");
        }
        let fp = cert.fingerprint().to_string();
        let issuer = hex::encode(body.issuer);
        // Identity (issue 49, finding 6), once the session proved itself (these read the
        // registry): the newest certificate of a name wins, and no two names hold one
        // address. The client hears why before the session closes.
        let refusal = match self.supersede(&fp, &body, &issuer).await {
            Ok(Some(by)) => {
                bump(&self.stats.superseded);
                tracing::warn!(name = %body.name, %from, fingerprint = %fp, newer = %by, "a certificate superseded by a newer one of its name for another key (a re-keyed or replaced member): closed");
                Some(format!(
                    "this certificate is superseded by a newer one of {} for another key ({by})",
                    body.name
                ))
            }
            Ok(None) => match self
                .overlapping_member(&body.name, &body.vip_blocks, unix_now())
                .await
            {
                Ok(Some(member)) => {
                    bump(&self.stats.overlapping);
                    tracing::error!(name = %body.name, %from, fingerprint = %fp, %member, "a certificate whose blocks overlap another member's (a CA issued overlapping certificates; revoke one): closed");
                    Some(format!(
                        "this certificate's blocks overlap those of the member {member}"
                    ))
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::error!(error = %e, "store");
                    return None;
                }
            },
            Err(e) => {
                tracing::error!(error = %e, "store");
                return None;
            }
        };
        if let Some(reason) = refusal {
            let _ = send(&mut ch, &mut wr, version, &CloudMsg::Error { reason }).await;
            return None;
        }
        if let Err(e) = self
            .store
            .client_online(&fp, (&body.name, &issuer), (&pem, &body.vip_blocks))
            .await
        {
            tracing::error!(error = %e, "store");
            return None;
        }
        // The certificate is in use: the token it was enrolled with is spent for good.
        let key_hex = hex::encode(key.0);
        if let Err(e) = self
            .store
            .confirm_token(&fp, &body.name, &key_hex, unix_now())
            .await
        {
            tracing::error!(error = %e, "store");
            return None;
        }
        Some(Open {
            ch,
            rd,
            wr,
            fp,
            body,
            first,
            seen,
            _live: live,
            version,
        })
    }

    /// A proven session, until it ends.
    async fn run(&self, open: Open, from: SocketAddr, local: IpAddr, token: [u8; 16]) {
        let Open {
            mut ch,
            mut rd,
            mut wr,
            fp,
            body,
            first,
            mut seen,
            _live,
            version,
        } = open;
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let (tx, mut pushes) = mpsc::channel(PUSH_QUEUE);
        // Replaces the identity's older session, if any: its push queue closes and it ends.
        self.connected.insert(
            fp.clone(),
            Connected {
                serial,
                tx,
                local,
                name: body.name.clone(),
                from,
                since: std::time::Instant::now(),
                version,
            },
        );
        bump(&self.stats.sessions);
        tracing::info!(name = %body.name, %from, "control session open");
        // What was revoked online, so that a client that was away learns it.
        if version >= 3 {
            for msg in revoked_messages(&self.online_revocations()) {
                if let Err(why) = send(&mut ch, &mut wr, version, &msg).await {
                    tracing::info!(name = %body.name, reason = why, "control session closed");
                    self.connected.remove_if(&fp, |_, c| c.serial == serial);
                    return;
                }
            }
        }

        // Version 4 enforces the per-device policy: its rules now, and whenever they change.
        let mut policy_rx = self.compiled.subscribe();
        let mut policy_sent: Option<Option<u64>> = None;
        if version >= 4 {
            let (v, msgs) = self.policy_for(&body);
            for msg in &msgs {
                if let Err(why) = send(&mut ch, &mut wr, version, msg).await {
                    tracing::info!(name = %body.name, reason = why, "control session closed");
                    self.connected.remove_if(&fp, |_, c| c.serial == serial);
                    return;
                }
            }
            policy_sent = Some(v);
        }

        // The reader runs apart, so that waiting for a frame is never cut half-way.
        let (frames_tx, mut frames) = mpsc::channel::<Vec<u8>>(16);
        let reader = tokio::spawn(async move {
            while let Ok(f) = read_frame(&mut rd, cyphonic_control::channel::MAX_FRAME).await {
                if frames_tx.send(f).await.is_err() {
                    break;
                }
            }
        });
        let requests = Requests::default();
        let mut written = Seen::default();
        let mut next = Some(first);
        let why = 'session: loop {
            let msg = match next.take() {
                Some(m) => m,
                None => {
                    let out = tokio::select! {
                        f = tokio::time::timeout(IDLE, frames.recv()) => match f {
                            Err(_) => break 'session "idle",
                            Ok(None) => break 'session "closed",
                            Ok(Some(f)) => match ch.open::<ClientMsg>(&f) {
                                Ok(msg) => msg,
                                Err(e) => {
                                    bump(&self.stats.malformed);
                                    tracing::info!(name = %body.name, error = %e, "malformed control message");
                                    break 'session "malformed message";
                                }
                            },
                        },
                        p = pushes.recv() => match p {
                            Some(p) => {
                                if let Err(why) = send(&mut ch, &mut wr, version, &p).await {
                                    break 'session why;
                                }
                                continue 'session;
                            }
                            None => break 'session "replaced by a newer session, or cut off",
                        },
                        changed = policy_rx.changed(), if version >= 4 => {
                            if changed.is_err() {
                                break 'session "policy state lost";
                            }
                            policy_rx.borrow_and_update();
                            let (v, msgs) = self.policy_for(&body);
                            if policy_sent != Some(v) {
                                for msg in &msgs {
                                    if let Err(why) = send(&mut ch, &mut wr, version, msg).await {
                                        break 'session why;
                                    }
                                }
                                tracing::debug!(name = %body.name, version = ?v, parts = msgs.len(), "policy sent");
                                policy_sent = Some(v);
                            }
                            continue 'session;
                        }
                        changed = seen.changed() => {
                            if changed.is_err() {
                                break 'session "probe state lost";
                            }
                            let now = *seen.borrow_and_update();
                            if let Some(o) = self.observed(&fp, now, &mut written).await
                                && let Err(why) = send(&mut ch, &mut wr, version, &o).await
                            {
                                break 'session why;
                            }
                            continue 'session;
                        }
                    };
                    out
                }
            };
            // Each class of request at its own rate: over it, this session waits (its
            // pushes still go out) and the client's own writes back up.
            let mut counted = false;
            while let Some(wait) = requests.wait(&msg) {
                if !counted {
                    bump(&self.stats.throttled);
                    counted = true;
                }
                let sleep = tokio::time::sleep(wait);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        () = &mut sleep => break,
                        p = pushes.recv() => match p {
                            Some(p) => {
                                if let Err(why) = send(&mut ch, &mut wr, version, &p).await {
                                    break 'session why;
                                }
                            }
                            None => break 'session "replaced by a newer session, or cut off",
                        },
                    }
                }
            }
            if let Some(out) = self.handle(&fp, &body, msg).await
                && let Err(why) = send(&mut ch, &mut wr, version, &out).await
            {
                break 'session why;
            }
        };
        reader.abort();
        self.tokens.remove(&token);
        let still_ours = self
            .connected
            .remove_if(&fp, |_, c| c.serial == serial)
            .is_some();
        if still_ours && let Err(e) = self.store.client_offline(&fp).await {
            tracing::error!(error = %e, "store");
        }
        tracing::info!(name = %body.name, %from, reason = why, "control session closed");
    }

    /// Writes to the store the probe sources that changed since `written`; the answer for the
    /// client when the first port's did.
    async fn observed(&self, fp: &str, now: Seen, written: &mut Seen) -> Option<CloudMsg> {
        let mut out = None;
        for (alt, (now, written)) in now.iter().zip(written.iter_mut()).enumerate() {
            let Some(addr) = *now else { continue };
            if *written == Some(addr) {
                continue;
            }
            if let Err(e) = self.store.observed(fp, addr, alt == 1).await {
                tracing::error!(error = %e, "store");
                continue;
            }
            bump(&self.stats.endpoint_writes);
            *written = Some(addr);
            if alt == 0 {
                out = Some(CloudMsg::Observed { endpoint: addr });
            }
        }
        out
    }

    /// Serves one message of the client holding `cert` as its session would, without a
    /// session: for the fuzz targets and tests that drive NMS directly.
    #[doc(hidden)]
    pub async fn serve_message(&self, cert: &Certificate, msg: ClientMsg) -> Option<CloudMsg> {
        let fp = cert.fingerprint().to_string();
        self.handle(&fp, cert.body(), msg).await
    }

    /// An enrollment: the token checked and redeemed, the certificate issued for the
    /// handshake's key (docs/protocol.md §4, Enrollment); or why not, in words for the client.
    async fn redeem(&self, hs: &ServerHandshake) -> Result<Welcome, String> {
        use crate::enroll::{Token, TokenError};
        let hello = hs.hello();
        if hello.version < 3 {
            return Err("enrollment needs control version 3".into());
        }
        let issuer = self
            .issuer
            .as_ref()
            .ok_or("this cloud does not enroll (no [enroll] in its configuration)")?;
        let token =
            Token::parse(hello.enroll.as_deref().unwrap_or_default()).map_err(|e| e.to_string())?;
        let unavailable = |e: crate::store::StoreError| {
            tracing::error!(error = %e, "store");
            "the registry is unavailable; try again".to_owned()
        };
        let row = self
            .store
            .token(&token.id)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| TokenError::Unknown.to_string())?;
        let now = unix_now();
        let key = hex::encode(hs.remote_static().0);
        token.check(&row, now, &key).map_err(|e| e.to_string())?;
        // The blocks were free when the token was made; a member may hold one of them
        // since (a certificate from the offline CA): no two names hold one address (issue
        // 49, finding 6).
        if let Some(member) = self
            .overlapping_member(&row.name, &row.blocks, now)
            .await
            .map_err(unavailable)?
        {
            tracing::warn!(name = %row.name, %member, "an enrollment's blocks overlap a member's: refused");
            return Err(format!(
                "the token's blocks overlap those of the member {member}: ask the operator for another token"
            ));
        }
        let cert = issuer.enroll(&row, hs.remote_static().0, now)?;
        let fp = cert.fingerprint().to_string();
        // Redeemed, but spent only once this certificate connects (store::confirm_token): a
        // device that refuses it (its clock behind, a Pi before NTP) enrolls again with the
        // same key, and the certificate it refused is revoked (issue 49, finding 5).
        if !self
            .store
            .redeem_token(&token.id, now, &fp, &key)
            .await
            .map_err(unavailable)?
        {
            return Err(TokenError::Used.to_string());
        }
        let again = if row.used_at.is_some() {
            " again (it never used the certificate it was given)"
        } else {
            ""
        };
        tracing::info!(name = %row.name, token = %token.id, fingerprint = %fp, "enrolled{again}");
        // The certificate it was given before (and refused) is retired: no longer named by
        // the token, it would otherwise escape a revocation of the name.
        if let Some(refused) = row.used_by.filter(|prev| *prev != fp) {
            let added = self
                .store
                .revoke(std::slice::from_ref(&refused), &row.name, now)
                .await
                .map_err(unavailable)?;
            tracing::info!(name = %row.name, fingerprint = %refused, added, "the certificate it refused is revoked");
        }
        let pems = |certs: &[Certificate]| certs.iter().map(Certificate::to_pem).collect();
        Ok(Welcome::Enrolled {
            certificate: cert.to_pem(),
            chain: pems(&issuer.chain()),
            roots: pems(issuer.roots()),
        })
    }

    /// The name of a member other than `name` whose certificate, valid and unrevoked at
    /// `now`, holds a block overlapping one of `blocks`: that member owns those addresses
    /// (issue 49, finding 6).
    async fn overlapping_member(
        &self,
        name: &str,
        blocks: &[ipnet::IpNet],
        now: u64,
    ) -> Result<Option<String>, crate::store::StoreError> {
        let trust = self.trust();
        for (other, pem) in self.store.certificates_overlapping(name, blocks).await? {
            let Ok(cert) = Certificate::from_pem(&pem) else {
                continue;
            };
            let overlaps = cyphonic_crypto::first_overlap(blocks, &cert.body().vip_blocks);
            if overlaps.is_some() && trust.verify(&cert, now).is_ok() {
                return Ok(Some(other));
            }
        }
        Ok(None)
    }

    /// The newest certificate of a name wins (issue 49, finding 6): of the certificates the
    /// registry knows of `body`'s name and issuing CA for another key (a re-keyed or replaced
    /// member), one that starts later supersedes `fp` (returned: this session is not to
    /// go on), and those that start no later are retired, revoked online, so that every
    /// instance and every client drops them within seconds. Renewals (the same key) are
    /// left alone.
    async fn supersede(
        &self,
        fp: &str,
        body: &CertBody,
        issuer: &str,
    ) -> Result<Option<String>, crate::store::StoreError> {
        let now = unix_now();
        let trust = self.trust();
        let mut retire = Vec::new();
        for (other_fp, pem) in self.store.certificates_named(&body.name, issuer).await? {
            if other_fp == fp {
                continue;
            }
            let Ok(other) = Certificate::from_pem(&pem) else {
                continue;
            };
            let o = other.body();
            if o.public_key == body.public_key || trust.verify(&other, now).is_err() {
                continue;
            }
            // The later start wins; of two that start together (issued within one second),
            // the larger fingerprint: the same answer whichever connects first.
            if (o.not_before, other_fp.as_str()) > (body.not_before, fp) {
                return Ok(Some(other_fp));
            }
            retire.push(other_fp);
        }
        if !retire.is_empty() {
            let added = self.store.revoke(&retire, &body.name, now).await?;
            tracing::warn!(name = %body.name, fingerprint = %fp, retired = ?retire, added, "a newer certificate of this name for another key is in use: the older ones are revoked online");
        }
        Ok(None)
    }

    /// A renewal of the session's certificate `body` (docs/protocol.md §4, Renewal).
    async fn renew(&self, body: &CertBody) -> CloudMsg {
        let now = unix_now();
        let verdict = (|| {
            let issuer = self
                .issuer
                .as_ref()
                .ok_or("this cloud does not issue certificates")?;
            if now >= body.not_after {
                return Err("the certificate has expired".to_owned());
            }
            let half = body.not_before + (body.not_after - body.not_before) / 2;
            if now < half {
                return Err("too early: ask once half of the validity has passed".into());
            }
            issuer.renew(body, now)
        })();
        // The registry knows the new certificate before its holder uses it: a revocation of
        // the name finds it.
        let verdict = match verdict {
            Ok(cert) => {
                let issuer = hex::encode(cert.body().issuer);
                match self
                    .store
                    .issued(
                        &cert.fingerprint().to_string(),
                        (&body.name, &issuer),
                        (&cert.to_pem(), &cert.body().vip_blocks),
                    )
                    .await
                {
                    Ok(()) => Ok(cert),
                    Err(e) => {
                        tracing::error!(error = %e, "store");
                        Err("the registry is unavailable; try again".to_owned())
                    }
                }
            }
            Err(e) => Err(e),
        };
        match verdict {
            Ok(cert) => {
                bump(&self.stats.renewed);
                tracing::info!(name = %body.name, fingerprint = %cert.fingerprint(), not_after = cert.body().not_after, "certificate renewed");
                CloudMsg::Renewed {
                    certificate: cert.to_pem(),
                }
            }
            Err(reason) => {
                bump(&self.stats.renew_refused);
                tracing::info!(name = %body.name, %reason, "renewal refused");
                CloudMsg::NotRenewed { reason }
            }
        }
    }

    async fn handle(&self, fp: &str, body: &CertBody, msg: ClientMsg) -> Option<CloudMsg> {
        match msg {
            ClientMsg::Ping {} => Some(CloudMsg::Pong {}),
            ClientMsg::Renew {} => Some(self.renew(body).await),
            ClientMsg::Register { endpoints, names } => {
                Some(self.register(fp, body, endpoints, names).await)
            }
            ClientMsg::Relay { peer } => Some(self.pair(fp, body, &peer, true).await),
            ClientMsg::Admit { peer } => Some(self.pair(fp, body, &peer, false).await),
            ClientMsg::Resolve { id, name } => {
                bump(&self.stats.resolves);
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                let resolution = match self.resolve(fp, body, &name).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(error = %e, "store");
                        return Some(CloudMsg::Error {
                            reason: "the registry is unavailable".into(),
                        });
                    }
                };
                Some(CloudMsg::Resolved {
                    id,
                    name,
                    resolution,
                })
            }
        }
    }

    async fn register(
        &self,
        fp: &str,
        body: &CertBody,
        mut endpoints: Vec<SocketAddr>,
        names: Vec<NameRecord>,
    ) -> CloudMsg {
        endpoints.retain(|e| !e.ip().is_unspecified() && !e.ip().is_multicast() && e.port() != 0);
        endpoints.truncate(MAX_ENDPOINTS);
        let mut refused = Vec::new();
        let mut ok = Vec::new();
        for (i, n) in names.into_iter().enumerate() {
            if i >= MAX_NAMES {
                refused.push((n.name, format!("more than {MAX_NAMES} names")));
            } else if let Err(e) = check_name(body, &n) {
                refused.push((n.name, e.to_string()));
            } else {
                ok.push(n);
            }
        }
        match self.store.register(fp, &endpoints, &ok).await {
            Ok(taken) => {
                for (t, why) in taken {
                    ok.retain(|n| n.name != t);
                    refused.push((t, why));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "store");
                return CloudMsg::Error {
                    reason: "the registry is unavailable".into(),
                };
            }
        }
        for (name, reason) in &refused {
            bump(&self.stats.names_refused);
            tracing::info!(client = %body.name, name = %cyphonic_telemetry::Untrusted(name), %reason, "name refused");
        }
        tracing::debug!(client = %body.name, names = ok.len(), ?endpoints, "registered");
        CloudMsg::Registered {
            accepted: ok.len(),
            refused,
        }
    }

    async fn resolve(
        &self,
        fp: &str,
        asker: &CertBody,
        name: &str,
    ) -> Result<Resolution, crate::store::StoreError> {
        let Some(found) = self.store.lookup(name).await? else {
            return Ok(Resolution::NotFound);
        };
        if found.owner.fingerprint == fp {
            return Ok(Resolution::Own);
        }
        let Ok(target) = Certificate::from_pem(&found.owner.certificate) else {
            return Ok(Resolution::NotFound);
        };
        // The target's certificate may have been revoked or expired since it registered.
        if self.trust().verify(&target, unix_now()).is_err() {
            return Ok(Resolution::NotFound);
        }
        // The asker must be allowed to open something to the target.
        let between = self
            .policy_between((fp, asker), (&found.owner.fingerprint, target.body()))
            .await?;
        let blocks = (asker.v4_blocks(), target.body().v4_blocks());
        if !between.opens(&blocks.0, &blocks.1) {
            bump(&self.stats.denied);
            tracing::info!(asker = %asker.name, name = %cyphonic_telemetry::Untrusted(name), "resolution denied by policy");
            return Ok(Resolution::Denied);
        }
        // Tell the target to expect the asker; both start handshaking at once. Through the
        // relay when the pair cannot talk directly.
        let Some(me) = self.store.client(fp).await? else {
            return Ok(Resolution::NotFound);
        };
        let target_row = &found.owner;
        let relays = match (route::choose(&me, target_row), &self.trs) {
            (Some(reason), Some(trs)) => self.relays(trs, &me, target_row, reason).await,
            (Some(reason), None) => {
                tracing::warn!(asker = %asker.name, target = %target_row.name, %reason, "the pair needs the relay, and this cloud runs none: trying directly");
                None
            }
            (None, _) => None,
        };
        let (mine, theirs) = relays.map_or((None, None), |(m, t)| (Some(m), Some(t)));
        let allowed = between.allowed(&blocks.0, &blocks.1);
        self.signal(
            &target_row.fingerprint,
            CloudMsg::Expect {
                peer: PeerInfo {
                    certificate: me.certificate.clone(),
                    endpoints: me.reach(),
                    relay: theirs,
                    allowed: allowed.map(Allowed::mirror),
                },
            },
        )
        .await;
        Ok(Resolution::Found {
            vip: found.vip,
            peer: PeerInfo {
                certificate: target_row.certificate.clone(),
                endpoints: target_row.reach(),
                relay: mine,
                allowed,
            },
        })
    }

    /// A relay channel for the pair `a`, `b` and what each side is told of it, or `None`
    /// (logged) when the relay cannot serve them.
    async fn relays<'a>(
        &self,
        trs: &Arc<Trs>,
        a: &'a ClientRow,
        b: &'a ClientRow,
        reason: RelayReason,
    ) -> Option<(RelayInfo, RelayInfo)> {
        let held = |fp: &str| trs.channels_of(fp);
        if held(&a.fingerprint) >= MAX_CHANNELS_PER_CLIENT
            || held(&b.fingerprint) >= MAX_CHANNELS_PER_CLIENT
        {
            tracing::warn!(a = %a.name, b = %b.name, "a client holds {MAX_CHANNELS_PER_CLIENT} relay channels already");
            return None;
        }
        // A side connected here speaks its session's version; one connected elsewhere (another
        // instance on the shared registry) is taken to speak ours: the cloud is upgraded
        // before the fleet (docs/protocol.md §4, versions).
        let legacy = |row: &ClientRow| {
            self.connected
                .get(&row.fingerprint)
                .is_some_and(|c| c.version < BINDS_WITH_COOKIES)
        };
        let party = |row: &'a ClientRow| crate::trs::Party {
            fingerprint: &row.fingerprint,
            name: &row.name,
            legacy: legacy(row),
        };
        let channel = match trs.channel(party(a), party(b), reason).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(a = %a.name, b = %b.name, error = %e, "no relay channel");
                return None;
            }
        };
        let (Some(ia), Some(ib)) = (
            self.relay_side(trs, &channel, a),
            self.relay_side(trs, &channel, b),
        ) else {
            tracing::warn!(a = %a.name, b = %b.name, "the relay has no address in a side's IP version (set relay.addresses)");
            return None;
        };
        bump(&self.stats.relayed_pairs);
        tracing::info!(a = %a.name, b = %b.name, reason = %channel.reason, a_relay = %ia.address, b_relay = %ib.address, "pair relayed");
        Some((ia, ib))
    }

    /// What the side `row` is told of `channel`: the relay's address in its IP version, its
    /// token.
    fn relay_side(&self, trs: &Trs, channel: &Channel, row: &ClientRow) -> Option<RelayInfo> {
        let token = channel.token_for(&row.fingerprint)?;
        let local = self.connected.get(&row.fingerprint).map(|c| c.local);
        let mut versions: Vec<bool> = row.reach().iter().map(SocketAddr::is_ipv6).collect();
        versions.extend(local.map(|l| l.is_ipv6()));
        if versions.is_empty() {
            // Nothing known of the side's addresses (it never probed): whatever the relay has.
            versions = vec![false, true];
        }
        let address = versions
            .into_iter()
            .find_map(|v6| trs.address(v6, local, channel.port))?;
        Some(RelayInfo {
            address,
            token,
            reason: channel.reason,
        })
    }

    /// Pairs the client `fp` with `peer` at its request: through the relay (`relay`: its
    /// handshakes found no direct path), or as the route choice says (an admission: `peer` is
    /// handshaking with a client that does not know it). Both need policy to let one of the two
    /// reach the other. Whoever gets a relay channel is told about it.
    async fn pair(&self, fp: &str, asker: &CertBody, peer: &str, relay: bool) -> CloudMsg {
        if relay {
            bump(&self.stats.relay_requests);
        }
        let refuse = |reason: &str| {
            bump(&self.stats.relays_refused);
            tracing::info!(asker = %asker.name, %reason, relay, "pairing refused");
            CloudMsg::NotPaired {
                peer: peer.to_owned(),
                reason: reason.to_owned(),
            }
        };
        let (me, target) = match (self.store.client(fp).await, self.store.client(peer).await) {
            (Ok(Some(me)), Ok(Some(target))) => (me, target),
            (Ok(_), Ok(None)) => return refuse("unknown peer"),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "store");
                return refuse("the registry is unavailable");
            }
            (Ok(None), _) => return refuse("not registered"),
        };
        if target.fingerprint == me.fingerprint {
            return refuse("that is yourself");
        }
        let Ok(cert) = Certificate::from_pem(&target.certificate) else {
            return refuse("unknown peer");
        };
        if self.trust().verify(&cert, unix_now()).is_err() {
            return refuse("unknown peer");
        }
        // The tunnel exists because one of the two may reach the other.
        let between = match self
            .policy_between((fp, asker), (&target.fingerprint, cert.body()))
            .await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "store");
                return refuse("the registry is unavailable");
            }
        };
        let blocks = (asker.v4_blocks(), cert.body().v4_blocks());
        if !between.pairs(&blocks.0, &blocks.1) {
            bump(&self.stats.denied);
            return refuse("denied by policy");
        }
        let allowed = between.allowed(&blocks.0, &blocks.1);
        let reason = if relay {
            Some(route::why_relay_was_asked(&me, &target))
        } else {
            route::choose(&me, &target)
        };
        let relays = match (reason, &self.trs) {
            (Some(reason), Some(trs)) => match self.relays(trs, &me, &target, reason).await {
                Some(r) => Some(r),
                None if relay => return refuse("the relay cannot serve this pair"),
                None => None,
            },
            (Some(_), None) if relay => return refuse("this cloud runs no relay"),
            _ => None,
        };
        let mine = match relays {
            Some((mine, theirs)) => {
                self.signal(
                    &target.fingerprint,
                    CloudMsg::Expect {
                        peer: PeerInfo {
                            certificate: me.certificate.clone(),
                            endpoints: me.reach(),
                            relay: Some(theirs),
                            allowed: allowed.map(Allowed::mirror),
                        },
                    },
                )
                .await;
                Some(mine)
            }
            None => None,
        };
        if !relay {
            tracing::info!(asker = %asker.name, peer = %target.name, "admitted");
        }
        CloudMsg::Expect {
            peer: PeerInfo {
                certificate: target.certificate.clone(),
                endpoints: target.reach(),
                relay: mine,
                allowed,
            },
        }
    }

    /// Pushes `msg` to the client `to`: directly when it is connected here, through the
    /// shared store's notifications when it may be connected to another instance.
    async fn signal(&self, to: &str, msg: CloudMsg) {
        if self.push(to, msg.clone()) || !self.store.is_shared() {
            return;
        }
        let signal = Signal {
            to: to.to_owned(),
            msg,
        };
        if let Ok(payload) = serde_json::to_string(&signal)
            && let Err(e) = self.store.notify(&payload).await
        {
            tracing::warn!(error = %e, "signal to the other instances not sent");
        }
    }

    /// The CAs and revocations clients are checked against now.
    fn trust(&self) -> Arc<TrustStore> {
        self.trust
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Who may reach whom, as configured now.
    fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The policy compiled against the registry, now.
    pub fn compiled(&self) -> Arc<Compiled> {
        self.compiled.borrow().clone()
    }

    /// Compiles the policy against the registry's members whose certificates are trusted,
    /// with the names they registered; sessions hear of a change. Returns whether it
    /// changed.
    ///
    /// # Errors
    /// The registry cannot be read.
    pub async fn compile_policy(&self) -> Result<bool, crate::store::StoreError> {
        let members = self.store.members().await?;
        Ok(self.compile_from(&members))
    }

    fn compile_from(&self, members: &[crate::store::Member]) -> bool {
        let entries = crate::policy::entries(members, &self.trust(), unix_now());
        let compiled = match self.policy().compile(&entries) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "the policy does not compile: the last one stays");
                return false;
            }
        };
        let changed = self.compiled.send_if_modified(|old| {
            if **old == compiled {
                return false;
            }
            *old = Arc::new(compiled.clone());
            true
        });
        if changed {
            tracing::info!(
                enforce = compiled.enforce,
                rules = compiled.rules.rules.len(),
                version = %format_args!("{:x}", compiled.rules.version),
                members = entries.len(),
                "policy compiled against the registry: clients get their rules"
            );
            if !compiled.unresolved.is_empty() {
                tracing::info!(names = ?compiled.unresolved, "policy rules name what stands for nobody now (not registered, nobody in the group, or a typo): they match nothing through these");
            }
        }
        changed
    }

    /// The policy compiled for two clients alone, each with the names it registered: what
    /// decides whether they may be paired, at once, without waiting for the compilation
    /// over the whole registry (a rule between the two can only name their own devices,
    /// which lie in their own blocks).
    async fn policy_between(
        &self,
        a: (&str, &CertBody),
        b: (&str, &CertBody),
    ) -> Result<Compiled, crate::store::StoreError> {
        let policy = self.policy();
        if policy.allow_by_default {
            return Ok(Compiled::default());
        }
        let mut entries = Vec::with_capacity(2);
        for (fp, body) in [a, b] {
            entries.push(crate::policy::Entry {
                name: body.name.clone(),
                blocks: body.v4_blocks(),
                groups: body.groups.clone(),
                devices: self.store.names_of(fp).await?,
            });
        }
        Ok(policy.compile(&entries).unwrap_or_else(|e| {
            tracing::error!(error = %e, "the policy does not compile: nobody is paired");
            Compiled {
                enforce: true,
                ..Compiled::default()
            }
        }))
    }

    /// Compiles the policy again every `REVOCATIONS_EVERY` when the registry's members or
    /// names changed, or a reload or a revocation happened, until the task is dropped.
    pub async fn policies(self: Arc<Self>) {
        let mut tick = tokio::time::interval(REVOCATIONS_EVERY);
        let mut last: Option<u64> = None;
        loop {
            tick.tick().await;
            // Nothing to compile with `default = "allow"`: the registry is not read.
            if self.policy().allow_by_default {
                if self.compiled.borrow().enforce {
                    self.compile_from(&[]);
                }
                last = None;
                continue;
            }
            let members = match self.store.members().await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the registry for the policy");
                    continue;
                }
            };
            let signature = {
                use std::hash::{Hash, Hasher};
                let mut h = std::hash::DefaultHasher::new();
                self.policy_generation.load(Ordering::Relaxed).hash(&mut h);
                for m in &members {
                    (&m.client.fingerprint, &m.names).hash(&mut h);
                }
                h.finish()
            };
            if last == Some(signature) {
                continue;
            }
            last = Some(signature);
            self.compile_from(&members);
        }
    }

    /// The `policy` messages for a client with `body`'s blocks: its part of the compiled
    /// policy, and that part's version (`None` when nothing is enforced).
    fn policy_for(&self, body: &CertBody) -> (Option<u64>, Vec<CloudMsg>) {
        let set = self.compiled.borrow().for_client(&body.v4_blocks());
        (
            set.as_ref().map(|s| s.version),
            cyphonic_control::policy::messages(set.as_ref()),
        )
    }

    /// Takes on `trust` and `policy` (a reload): every client in the registry whose
    /// certificate no longer verifies loses its names, and its session here ends at once (it
    /// is refused when it comes back). Returns the names of the clients cut off.
    ///
    /// # Errors
    /// The registry cannot be read.
    pub async fn reload(
        &self,
        mut trust: TrustStore,
        policy: Policy,
    ) -> Result<Vec<String>, crate::store::StoreError> {
        for fp in self.online_revocations() {
            trust.revocations_mut().revoke(fp);
        }
        *self
            .trust
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(trust);
        *self
            .policy
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(policy);
        self.policy_generation.fetch_add(1, Ordering::Relaxed);
        self.cut_untrusted().await
    }

    /// What was revoked online and taken on so far.
    fn online_revocations(&self) -> Vec<Fingerprint> {
        let mut all: Vec<Fingerprint> = self
            .revoked_online
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .copied()
            .collect();
        all.sort();
        all
    }

    /// How many revocations were taken on so far.
    fn online_revocation_count(&self) -> usize {
        self.revoked_online
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Takes on the registry's online revocations (`cyphonic-cloud revoke`), every
    /// `REVOCATIONS_EVERY`, until the task is dropped: each new one joins the trust, its
    /// holder is cut off (`Nms::cut_untrusted`) and every version-3 session is told.
    pub async fn revocations(self: Arc<Self>) {
        let mut tick = tokio::time::interval(REVOCATIONS_EVERY);
        loop {
            tick.tick().await;
            // Revocations are never deleted: an unchanged count means nothing new, and the
            // list is read only when it grew.
            match self.store.revocation_count().await {
                Ok(n) if n == self.online_revocation_count() => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "counting the registry's revocations");
                    continue;
                }
            }
            let listed = match self.store.revocations().await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the registry's revocations");
                    continue;
                }
            };
            let fresh: Vec<Fingerprint> = {
                let mut known = self
                    .revoked_online
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                listed
                    .iter()
                    .filter_map(|fp| fp.parse().ok())
                    .filter(|fp| known.insert(*fp))
                    .collect()
            };
            if fresh.is_empty() {
                continue;
            }
            let mut trust = (*self.trust()).clone();
            for fp in &fresh {
                trust.revocations_mut().revoke(*fp);
            }
            *self
                .trust
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(trust);
            self.policy_generation.fetch_add(1, Ordering::Relaxed);
            match self.cut_untrusted().await {
                Ok(cut) => {
                    tracing::warn!(revoked = fresh.len(), cut_off = ?cut, "certificates revoked online");
                }
                Err(e) => {
                    tracing::error!(error = %e, "revoked online, but the registry could not be checked");
                }
            }
            for msg in revoked_messages(&fresh) {
                for c in &self.connected {
                    if c.version >= 3 && c.tx.try_send(msg.clone()).is_err() {
                        tracing::warn!(client = %c.name, "push queue full: a revocation was not pushed (it learns it when it reconnects)");
                    }
                }
            }
        }
    }

    /// Every client in the registry whose certificate no longer verifies under the trust
    /// loses its names, and its session here ends at once. Returns their names.
    async fn cut_untrusted(&self) -> Result<Vec<String>, crate::store::StoreError> {
        let trust = self.trust();
        let now = unix_now();
        let mut cut = Vec::new();
        for m in self.store.members().await? {
            let verdict = Certificate::from_pem(&m.client.certificate)
                .map_err(|e| e.to_string())
                .and_then(|c| trust.verify(&c, now).map_err(|e| e.to_string()));
            let Err(why) = verdict else {
                continue;
            };
            let fp = &m.client.fingerprint;
            self.store.release_names(fp).await?;
            if self.connected.remove(fp).is_some() {
                tracing::warn!(client = %m.client.name, reason = %why, "control session closed: the certificate is no longer trusted");
                self.store.client_offline(fp).await?;
            }
            if !m.names.is_empty() || m.client.online {
                tracing::info!(client = %m.client.name, names = m.names.len(), reason = %why, "names released: the certificate is no longer trusted");
            }
            cut.push(m.client.name.clone());
        }
        Ok(cut)
    }

    /// The clients with a session on this instance: name, where from, for how long (s).
    pub fn sessions(&self) -> Vec<(String, SocketAddr, u64)> {
        let mut out: Vec<_> = self
            .connected
            .iter()
            .map(|c| (c.name.clone(), c.from, c.since.elapsed().as_secs()))
            .collect();
        out.sort();
        out
    }

    /// Pushes `msg` to the client `fp` if it is connected to this instance.
    fn push(&self, fp: &str, msg: CloudMsg) -> bool {
        let Some(c) = self.connected.get(fp) else {
            return false;
        };
        if c.tx.try_send(msg).is_err() {
            bump(&self.stats.pushes_dropped);
            tracing::warn!(to = %c.name, "push queue full: a message to a client was dropped");
        }
        true
    }

    /// Starts listening for the signals other instances send through the shared store
    /// (PostgreSQL LISTEN/NOTIFY); `None` for a store that is not shared. The cloud does this
    /// before it serves: a signal sent to a client here before the LISTEN is in place would
    /// be lost (PostgreSQL keeps no notification for a session that was not listening).
    ///
    /// # Errors
    /// The store cannot be reached.
    pub async fn listen_for_signals(&self) -> Result<Option<PgListener>, sqlx::Error> {
        if !self.store.is_shared() {
            return Ok(None);
        }
        let mut l = PgListener::connect(self.store.url()).await?;
        l.listen(crate::store::SIGNAL_CHANNEL).await?;
        tracing::info!("listening for signals from other cloud instances");
        Ok(Some(l))
    }

    /// Delivers the signals `listener` ([`Nms::listen_for_signals`]) hears to clients
    /// connected here, until the task is dropped, listening again when the connection is
    /// lost. Returns at once without a listener (a store that is not shared).
    pub async fn signals(self: Arc<Self>, listener: Option<PgListener>) {
        let Some(mut listener) = listener else {
            return;
        };
        loop {
            loop {
                match listener.recv().await {
                    Ok(n) => match serde_json::from_str::<Signal>(n.payload()) {
                        Ok(s) => {
                            self.push(&s.to, s.msg);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "unreadable signal from another instance");
                        }
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "signal listener lost; reconnecting");
                        break;
                    }
                }
            }
            listener = loop {
                match self.listen_for_signals().await {
                    Ok(Some(l)) => break l,
                    Ok(None) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "listening for other instances' signals; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            };
        }
    }

    /// Reads endpoint probes on `sock` until the task is dropped; `alt` for the second probe
    /// port, whose observations only serve to recognise symmetric NATs. Cheap per probe: a
    /// map lookup and two MACs; the session it names does any store work. An address is
    /// recorded only from a probe that answers a challenge sent there (docs/protocol.md §4,
    /// endpoint probe).
    pub async fn probes(self: Arc<Self>, sock: UdpSocket, alt: bool) {
        let mut buf = vec![0u8; 2048];
        let port = usize::from(alt);
        let probe_port = sock.local_addr().map_or(0, |a| a.port());
        loop {
            let Ok((n, from)) = sock.recv_from(&mut buf).await else {
                continue;
            };
            let from = canonical(from);
            let verdict = Probe::parse(&buf[..n]).map_or(ProbeVerdict::Refused, |probe| {
                self.probe(&probe, from, port, probe_port, crate::clock::unix_now_ms())
            });
            match verdict {
                ProbeVerdict::Refused => bump(&self.stats.probes_refused),
                ProbeVerdict::Recorded => bump(&self.stats.probes),
                ProbeVerdict::Challenge(frame) => {
                    bump(&self.stats.probes);
                    if sock.send_to(&frame, from).await.is_ok() {
                        bump(&self.stats.probe_challenges);
                    }
                }
            }
        }
    }

    /// What `probe`, from `from` to probe port `probe_port` (the session's `port`th), makes
    /// the reader do at `now_ms`.
    fn probe(
        &self,
        probe: &Probe<'_>,
        from: SocketAddr,
        port: usize,
        probe_port: u16,
        now_ms: u64,
    ) -> ProbeVerdict {
        let Some(mut s) = self.tokens.get_mut(&probe.token) else {
            return ProbeVerdict::Refused;
        };
        // A session takes the probes of its own kind only: a version-6 client's are never
        // taken without a cookie.
        if probe.counter <= s.counters[port] || probe.legacy != s.legacy || !probe.verify(&s.key) {
            return ProbeVerdict::Refused;
        }
        let purpose = cyphonic_control::Purpose::Probe {
            port: probe_port,
            token: &probe.token,
        };
        let proved = s.legacy
            || probe.cookie.is_some_and(|c| {
                c.time_ms > s.cookies[port] && self.challenger.valid(purpose, from, &c, now_ms)
            });
        if !proved {
            if now_ms.saturating_sub(s.window) >= 1000 {
                s.window = now_ms;
                s.challenged = 0;
            }
            if s.challenged >= cyphonic_control::relay::CHALLENGES_PER_SEC {
                return ProbeVerdict::Refused;
            }
            s.challenged += 1;
            let cookie = self.challenger.issue(purpose, from, now_ms);
            return ProbeVerdict::Challenge(cyphonic_control::challenge_frame(&cookie));
        }
        // Only a probe that proved its source spends its counter: a copy raced from
        // elsewhere earns a challenge there and leaves the original its turn.
        s.counters[port] = probe.counter;
        if let Some(c) = probe.cookie {
            s.cookies[port] = c.time_ms;
        }
        s.seen.send_if_modified(|seen| {
            let changed = seen[port] != Some(from);
            seen[port] = Some(from);
            changed
        });
        ProbeVerdict::Recorded
    }
}

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
    Allowed, ClientMsg, CloudMsg, MIN_VERSION, Mapping, NameRecord, PROBE_TOKEN_LEN, PeerInfo,
    Probe, RelayInfo, RelayReason, Resolution, ServerHandshake, TunnelVersions, VERSION, Welcome,
    check_name,
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

mod issue;
mod members;
mod probes;
mod revoke;
mod rules;
mod session;
mod signals;

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
/// The most characters of a client's agent the registry keeps: a program's name and version
/// fit many times over.
const AGENT_MAX: usize = 64;
/// The most characters of an HA pair's reason the registry keeps.
const PAIR_REASON_MAX: usize = 128;
/// The most characters of a DNS name (a device's, a peer's certificate's) the registry keeps.
const NAME_MAX: usize = 253;

/// What the registry keeps of the agent a client's `Hello` names (its software and version,
/// which anyone with a certificate may set to anything): printable ASCII, any other
/// character a `?` so that no control sequence reaches an operator's terminal through
/// `members`, at most [`AGENT_MAX`] characters.
fn agent(said: &str) -> String {
    printable(said, AGENT_MAX)
}

/// `said`'s first `max` characters, each that is not printable ASCII a `?`.
fn printable(said: &str, max: usize) -> String {
    said.chars()
        .take(max)
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect()
}

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
        /// Registrations' port mappings left out: a refusal's reason too long or not printable, an endpoint that is no address.
        mappings_refused,
        /// Flow records kept (ended flows and refused summaries; docs/protocol.md §8, Flow logs).
        flows,
        /// Flow records members said they did not send (beyond their bounds).
        flows_unreported,
        /// Flow messages refused: beyond a bound, from a member that does not log, or from a client of a version without them.
        flows_refused,
        /// HA pair reports kept (docs/protocol.md §5, Seen from the cloud).
        pair_reports,
        /// HA pair reports refused: malformed (a MAC that is not one, too many boxes...), or from a client of a version without them.
        pair_reports_refused,
        /// Members' reports of their devices and tunnels kept (docs/protocol.md §8, Devices and tunnels).
        reports,
        /// Members' reports refused: beyond a bound, a device without an address, a peer that is not a fingerprint, or from a client of a version without them.
        reports_refused,
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
        /// HTTP API connections closed on arrival: over the listener's limits, in all or from one address.
        api_refused,
        /// People signed in to the console.
        signins,
        /// Sign-ins refused: no sign-in under way in that browser, a state not its own, the provider's refusal, a code or ID token it does not prove, no role, over a source's rate.
        signins_refused,
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
    /// Who records flow logs (`[flows]`).
    flows: crate::config::FlowLogs,
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
        return Err(cyphonic_control::version_refusal(hello.version));
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
    /// Its mark in the store ([`crate::Store::session_ended`]).
    session: String,
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
            flows: crate::config::FlowLogs::default(),
            revoked_online: std::sync::Mutex::new(std::collections::HashSet::new()),
            stats: Stats::default(),
        }
    }

    /// Its online issuer, if it has one.
    pub const fn issuer(&self) -> Option<&crate::enroll::Issuer> {
        self.issuer.as_ref()
    }

    /// Issues online with `issuer`: enrolls members that bring a token, renews certificates.
    #[must_use]
    pub fn with_issuer(mut self, issuer: Option<crate::enroll::Issuer>) -> Self {
        self.issuer = issuer;
        self
    }

    /// Has the members `flows` names record their flows (`[flows]`).
    #[must_use]
    pub fn with_flows(mut self, flows: crate::config::FlowLogs) -> Self {
        self.flows = flows;
        self
    }

    /// The issuing CA's certificate, when this cloud issues (`[enroll]`).
    pub fn issuing_ca(&self) -> Option<&Certificate> {
        self.issuer.as_ref().map(crate::enroll::Issuer::certificate)
    }

    /// Says in the log, at start and then once a day while it lasts, how long the issuing CA
    /// has left when that is less than [`crate::enroll::EXPIRY_WARNING`], and that it has
    /// expired once it has (no member can enroll or renew then). Runs until dropped.
    pub async fn watch_issuer(self: Arc<Self>) {
        const LOOK: Duration = Duration::from_secs(3600);
        const SAY_AGAIN: u64 = 86_400;
        let Some((not_after, fingerprint)) = self
            .issuing_ca()
            .map(|c| (c.body().not_after, c.fingerprint().to_string()))
        else {
            return;
        };
        let mut said: Option<u64> = None;
        loop {
            let now = crate::clock::unix_now_ms() / 1000;
            match crate::enroll::expiry(crate::enroll::seconds_left(not_after, now)) {
                crate::enroll::Expiry::Fine(left) if said.is_none() => {
                    tracing::info!(%fingerprint, days_left = left / 86_400, "the issuing CA");
                    said = Some(now);
                }
                crate::enroll::Expiry::Soon(left)
                    if said.is_none_or(|t| now.saturating_sub(t) >= SAY_AGAIN) =>
                {
                    tracing::warn!(%fingerprint, days_left = left / 86_400, "the issuing CA expires soon: renew it (`ca delegate`) and reload, or no member can enroll or renew after it");
                    said = Some(now);
                }
                crate::enroll::Expiry::Expired
                    if said.is_none_or(|t| now.saturating_sub(t) >= SAY_AGAIN) =>
                {
                    tracing::error!(%fingerprint, "the issuing CA has expired: no member can enroll or renew; renew it (`ca delegate`) and reload");
                    said = Some(now);
                }
                _ => {}
            }
            tokio::time::sleep(LOOK).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent is kept as said when it is a program and its version; control characters
    /// (a terminal's escape), other scripts and anything past 64 characters are not.
    #[test]
    fn agents_are_kept_printable_and_short() {
        assert_eq!(agent("cyphonic-adapter 0.1.0"), "cyphonic-adapter 0.1.0");
        assert_eq!(agent("x\u{1b}[2J\r\ny\u{e9}"), "x?[2J??y?");
        assert_eq!(agent(&"a".repeat(10_000)).len(), AGENT_MAX);
        assert_eq!(agent(""), "");
    }
}

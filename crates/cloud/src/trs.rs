//! TRS, the relay: channels that carry tunnel frames between two
//! clients that cannot reach each other directly.
//!
//! A channel is one UDP port, allocated by NMS for one pair of clients. Each side binds its
//! tunnel socket's address to the channel with a bind under its own token (which NMS gave it
//! over its control session), answering a challenge the relay sent to that address: only an
//! address that receives there is ever bound (docs/protocol.md §4, relay). From then on a
//! datagram arriving on the channel's port from one side's bound address leaves, byte for
//! byte, to the other side's bound address. Nothing else passes: not from an unbound address,
//! not to anyone but the pair. The relay reads no frame beyond telling a bind from the rest, and holds no key, so it
//! cannot read or alter what it carries without the receiver noticing.
//!
//! Because the channel is an address of its own, frames need no relay header: a relayed path
//! has the same MTU as a direct one, and to each side the channel's address simply is where
//! its peer lives. The port listens on the relay's IPv4 and IPv6 addresses alike, so a side
//! that has only IPv4 and one that has only IPv6 meet here.
//!
//! A side may also bind over a stream (docs/protocol.md §4, *Relay over a stream*): one TCP
//! connection per client, in TLS when the relay has a certificate, carrying the datagrams of
//! every channel it bound, each after its length and its channel's port. The channel's rule
//! is the same ([`Sides`]); only where a side is bound changes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cyphonic_control::relay::{At, Sides, Verdict};
use cyphonic_control::{Challenger, PROBE_TOKEN_LEN, RelayReason, StreamInfo};
use dashmap::DashMap;
use tokio::net::UdpSocket;

use crate::config::RelayConfig;
use crate::guard::Unproven;

mod stream;

/// Largest datagram relayed (a jumbo-frame underlay's; tunnel frames are smaller).
const MAX_DATAGRAM: usize = 9216;

/// A channel's sockets, each with whether it is the IPv6 one.
type Socks = Arc<Vec<(UdpSocket, bool)>>;

/// An open relay channel.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ChannelStatus {
    /// Its port.
    pub port: u16,
    /// One side's name.
    pub a: String,
    /// The other's.
    pub b: String,
    /// Why the pair is relayed.
    pub reason: String,
    /// Seconds since it opened.
    pub age_secs: u64,
    /// Datagrams relayed.
    pub packets: u64,
    /// Bytes relayed.
    pub bytes: u64,
}

cyphonic_telemetry::counters! {
    /// The relay's counters.
    pub struct TrsStats {
        /// Channels opened since start.
        channels_opened,
        /// Channels NMS asked for and the relay could not open (no free port, and no client holding more than the pair to take one from).
        channels_refused,
        /// Channels closed to make room for a pair whose sides held fewer (every port was taken): the least recently used of the client holding the most.
        channels_reclaimed,
        /// Datagrams relayed.
        relayed_packets,
        /// Bytes relayed (UDP payload).
        relayed_bytes,
        /// Binds accepted.
        binds,
        /// Challenges sent, each to the source of a bind that did not answer one.
        challenges,
        /// Datagrams refused: an unbound source, a wrong token, the other side not bound, a replayed bind, binds over a side's rate of challenges, a bind of the other kind, a channel that is not open.
        refused,
        /// Stream connections accepted (docs/protocol.md §4, *Relay over a stream*).
        streams,
        /// Stream connections closed before binding: over the caps of connections that bound nothing, evicted for a source holding fewer, TLS failed or too slow, nothing bound within 10 s, a malformed length.
        streams_refused,
        /// Datagrams for a stream side dropped because its connection's queue was full (a slow reader).
        stream_queue_drops,
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Why no channel could be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrsError {
    /// Every port of the range is taken.
    #[error("no free port in the relay's range {first}-{last}")]
    NoPort {
        /// The range's first port.
        first: u16,
        /// Its last port.
        last: u16,
    },
}

/// One side of a channel: the client and the token it binds with.
#[derive(Debug, Clone)]
pub struct ChannelSide {
    /// The client's certificate fingerprint.
    pub fingerprint: String,
    /// Its name, for status and logs.
    pub name: String,
    /// Its token.
    pub token: [u8; PROBE_TOKEN_LEN],
    /// It speaks control version 5 or older: it binds with its token in clear.
    pub legacy: bool,
}

/// A side of a pair NMS asks a channel for: the client's fingerprint and name, and whether
/// it speaks control version 5 or older.
#[derive(Debug, Clone, Copy)]
pub struct Party<'a> {
    /// Its certificate's fingerprint.
    pub fingerprint: &'a str,
    /// Its name.
    pub name: &'a str,
    /// It binds the old way.
    pub legacy: bool,
}

/// A channel as NMS sees it.
#[derive(Debug)]
pub struct Channel {
    /// Its port.
    pub port: u16,
    /// The two sides, in the order NMS named them.
    pub sides: [ChannelSide; 2],
    /// Why it was opened.
    pub reason: RelayReason,
    /// When.
    pub opened: Instant,
    packets: AtomicU64,
    bytes: AtomicU64,
    /// When it last relayed, milliseconds after `opened`.
    last_used: AtomicU64,
    /// Told when the channel is to close for another pair.
    reclaim: tokio::sync::Notify,
    /// Set once its task has ended and its port is free again.
    closed: tokio::sync::watch::Sender<bool>,
    /// Its sockets, one per IP version the relay serves, each with whether it is the IPv6
    /// one; taken when it closes, so that the port is free though the channel is still held.
    socks: std::sync::Mutex<Option<Socks>>,
    /// Where each side is bound.
    binding: std::sync::Mutex<Sides>,
}

impl Channel {
    /// What the channel's rule says of a datagram (`f` asks [`Sides`]).
    fn judge(&self, f: impl FnOnce(&mut Sides) -> Verdict) -> Verdict {
        f(&mut self
            .binding
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Its sockets, while it is open.
    fn socks(&self) -> Option<Socks> {
        self.socks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The token of the side `fingerprint`.
    pub fn token_for(&self, fingerprint: &str) -> Option<[u8; PROBE_TOKEN_LEN]> {
        self.sides
            .iter()
            .find(|s| s.fingerprint == fingerprint)
            .map(|s| s.token)
    }
}

/// The relay service.
#[derive(Debug)]
pub struct Trs {
    config: RelayConfig,
    /// Channels by the pair's fingerprints, in sorted order.
    pairs: DashMap<(String, String), Arc<Channel>>,
    /// Where the next port search starts.
    cursor: std::sync::Mutex<u16>,
    /// Set to close every channel.
    closing: tokio::sync::watch::Sender<bool>,
    /// Makes and checks the cookies of the channels' challenges.
    challenger: Challenger,
    /// Open channels by port, for the streams.
    by_port: DashMap<u16, Arc<Channel>>,
    /// Each stream connection's queue of messages out, by its number.
    streams: DashMap<u64, tokio::sync::mpsc::Sender<Vec<u8>>>,
    /// The next stream connection's number.
    next_stream: AtomicU64,
    /// Stream connections that have bound nothing yet.
    unbound: Arc<Unproven>,
    /// Counters.
    pub stats: TrsStats,
}

/// Milliseconds from `since` to now.
fn ms_since(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn pair_key(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}

fn random_token() -> [u8; PROBE_TOKEN_LEN] {
    use ring::rand::SecureRandom as _;
    let mut t = [0u8; PROBE_TOKEN_LEN];
    // An all-zero token would still be unguessable to nobody: refuse to run without entropy.
    ring::rand::SystemRandom::new()
        .fill(&mut t)
        .expect("the system's random number generator failed");
    t
}

/// The sockets of one channel port: one per IP version the relay serves.
fn bind_port(addresses: &[IpAddr], port: u16) -> std::io::Result<Vec<UdpSocket>> {
    let any: [IpAddr; 2] = [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    ];
    let wanted = if addresses.is_empty() {
        &any[..]
    } else {
        addresses
    };
    let mut out = Vec::new();
    for ip in wanted {
        let addr = SocketAddr::new(*ip, port);
        let domain = socket2::Domain::for_address(addr);
        let s = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
        if ip.is_ipv6() {
            // Each version on its own socket: IPv4 frames must leave from the IPv4 one.
            s.set_only_v6(true)?;
        }
        s.set_nonblocking(true)?;
        if let Err(e) = s.bind(&addr.into()) {
            // An unspecified IPv6 address on a host without IPv6 is not an error: IPv4 only.
            if addresses.is_empty() && ip.is_ipv6() && !out.is_empty() {
                tracing::debug!(error = %e, "relay: no IPv6 on this host");
                continue;
            }
            return Err(e);
        }
        out.push(UdpSocket::from_std(s.into())?);
    }
    Ok(out)
}

impl Trs {
    /// The relay with `config`; channels open on demand.
    pub fn new(config: RelayConfig) -> Self {
        let first = *config.ports.start();
        Self {
            config,
            pairs: DashMap::new(),
            cursor: std::sync::Mutex::new(first),
            closing: tokio::sync::watch::Sender::new(false),
            challenger: Challenger::new(
                cyphonic_crypto::cookie::CookieSecret::random()
                    .expect("the system's random number generator failed"),
            ),
            by_port: DashMap::new(),
            streams: DashMap::new(),
            next_stream: AtomicU64::new(1),
            unbound: Unproven::new(stream::MAX_UNBOUND, stream::MAX_UNBOUND_PER_SOURCE),
            stats: TrsStats::default(),
        }
    }

    /// The address a client of IP version `v6` is given for the channel on `port`: the
    /// configured address of that version, or (with none configured) `local`, the address
    /// the client reached the cloud on. `None` when the relay has no address of that version.
    pub fn address(&self, v6: bool, local: Option<IpAddr>, port: u16) -> Option<SocketAddr> {
        let ip = if self.config.addresses.is_empty() {
            local.filter(|l| l.is_ipv6() == v6)?
        } else {
            *self.config.addresses.iter().find(|a| a.is_ipv6() == v6)?
        };
        Some(SocketAddr::new(ip, port))
    }

    /// The stream listener as a client of IP version `v6` reaches it (see [`Trs::address`];
    /// a listener on one address is given as it is, to clients of its version), and the
    /// digest of its certificate. `None` without a stream listener, or with none for `v6`.
    pub fn stream_info(&self, v6: bool, local: Option<IpAddr>) -> Option<StreamInfo> {
        let s = self.config.stream.as_ref()?;
        let port = s.listen.port();
        let address = if self.config.addresses.is_empty() && !s.listen.ip().is_unspecified() {
            (s.listen.is_ipv6() == v6).then_some(s.listen)?
        } else {
            self.address(v6, local, port)?
        };
        Some(StreamInfo {
            address,
            tls: s.tls.as_ref().map(|t| hex::encode(t.digest)),
        })
    }

    /// Which IP versions the relay serves, given the client reached the cloud on `local`.
    pub fn serves(&self, v6: bool, local: Option<IpAddr>) -> bool {
        self.address(v6, local, 0).is_some()
    }

    /// The channel for the pair `a`, `b` (fingerprint and name each): the open one, or a new
    /// one on a free port. When every port is taken, the pair may take the least recently
    /// used channel of the client holding the most, if that client holds at least two more
    /// than either side of the pair (issue 49, finding 4: a few members holding many channels
    /// each must not shut everyone else out of the relay).
    ///
    /// # Errors
    /// [`TrsError::NoPort`] when the whole port range is taken by clients holding no more
    /// than one channel more than the pair's sides.
    pub async fn channel(
        self: &Arc<Self>,
        a: Party<'_>,
        b: Party<'_>,
        reason: RelayReason,
    ) -> Result<Arc<Channel>, TrsError> {
        let key = pair_key(a.fingerprint, b.fingerprint);
        if let Some(c) = self.pairs.get(&key) {
            return Ok(c.clone());
        }
        let (first, last) = (*self.config.ports.start(), *self.config.ports.end());
        let span = u32::from(last - first) + 1;
        // Every port taken: make room fairly, or refuse at once rather than try to bind each
        // of them.
        if self.pairs.len() >= span as usize {
            let most = self
                .channels_of(a.fingerprint)
                .max(self.channels_of(b.fingerprint));
            let Some(victim) = self.reclaimable(most) else {
                bump(&self.stats.channels_refused);
                return Err(TrsError::NoPort { first, last });
            };
            let mut closed = victim.closed.subscribe();
            victim.reclaim.notify_one();
            // Its task ends and frees the port within a scheduling round.
            let _ = tokio::time::timeout(Duration::from_secs(2), closed.wait_for(|c| *c)).await;
            bump(&self.stats.channels_reclaimed);
        }
        let mut cursor = self
            .cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for _ in 0..span {
            let port = *cursor;
            *cursor = if port >= last { first } else { port + 1 };
            let socks = match bind_port(&self.config.addresses, port) {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(port, error = %e, "relay: port not free");
                    continue;
                }
            };
            let sides = [a, b].map(|p| ChannelSide {
                fingerprint: p.fingerprint.to_owned(),
                name: p.name.to_owned(),
                token: random_token(),
                legacy: p.legacy,
            });
            let binding = Sides::new(
                port,
                [sides[0].token, sides[1].token],
                [sides[0].legacy, sides[1].legacy],
            );
            let socks = socks
                .into_iter()
                .map(|s| {
                    let v6 = s.local_addr().is_ok_and(|l| l.is_ipv6());
                    (s, v6)
                })
                .collect();
            let channel = Arc::new(Channel {
                port,
                sides,
                reason,
                opened: Instant::now(),
                packets: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                last_used: AtomicU64::new(0),
                reclaim: tokio::sync::Notify::new(),
                closed: tokio::sync::watch::Sender::new(false),
                socks: std::sync::Mutex::new(Some(Arc::new(socks))),
                binding: std::sync::Mutex::new(binding),
            });
            self.pairs.insert(key.clone(), channel.clone());
            self.by_port.insert(port, channel.clone());
            bump(&self.stats.channels_opened);
            tracing::info!(port, %reason, a = a.name, b = b.name, "relay channel opened");
            tokio::spawn(self.clone().serve(key, channel.clone()));
            return Ok(channel);
        }
        bump(&self.stats.channels_refused);
        Err(TrsError::NoPort { first, last })
    }

    /// Relays on one channel until it has been idle for the configured time.
    async fn serve(self: Arc<Self>, key: (String, String), channel: Arc<Channel>) {
        let idle = self.config.idle;
        let mut check = tokio::time::interval(idle / 4);
        check.reset();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut buf2 = vec![0u8; MAX_DATAGRAM];
        let mut closing = self.closing.subscribe();
        let Some(socks) = channel.socks() else {
            return;
        };
        let why = loop {
            tokio::select! {
                // The value only ever turns true.
                _ = closing.changed() => break "the relay is stopping",
                () = channel.reclaim.notified() => break "reclaimed for a pair whose sides held fewer channels",
                r = socks[0].0.recv_from(&mut buf) => match r {
                    Ok((n, from)) => self.udp_datagram(&channel, &buf[..n], from).await,
                    Err(e) => tracing::debug!(error = %e, "relay: receive"),
                },
                r = recv_second(&socks, &mut buf2) => match r {
                    Ok((n, from)) => self.udp_datagram(&channel, &buf2[..n], from).await,
                    Err(e) => tracing::debug!(error = %e, "relay: receive"),
                },
                _ = check.tick() => {
                    let last = channel.opened
                        + Duration::from_millis(channel.last_used.load(Ordering::Relaxed));
                    if last.elapsed() >= idle {
                        break "idle";
                    }
                }
            }
        };
        self.pairs.remove_if(&key, |_, c| Arc::ptr_eq(c, &channel));
        self.by_port
            .remove_if(&channel.port, |_, c| Arc::ptr_eq(c, &channel));
        // The sockets go here, before the port is said to be free.
        drop(socks);
        *channel
            .socks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        channel.closed.send_replace(true);
        tracing::info!(
            port = channel.port,
            reason = why,
            packets = channel.packets.load(Ordering::Relaxed),
            bytes = channel.bytes.load(Ordering::Relaxed),
            "relay channel closed"
        );
    }

    /// A datagram that came to `channel`'s port from `from`.
    async fn udp_datagram(&self, channel: &Channel, datagram: &[u8], from: SocketAddr) {
        let now_ms = crate::clock::unix_now_ms();
        let verdict = channel.judge(|s| s.datagram(datagram, from, now_ms, &self.challenger));
        self.act(channel, verdict, datagram, from).await;
    }

    /// Does what the channel's rule said of `datagram` (from `from`, for the log: the source
    /// address, or a stream's peer).
    async fn act(&self, channel: &Channel, verdict: Verdict, datagram: &[u8], from: SocketAddr) {
        let stats = &self.stats;
        let (to, frame) = match verdict {
            Verdict::Bound { side, changed } => {
                if changed {
                    tracing::info!(port = channel.port, side, %from, "relay: side bound");
                }
                bump(&stats.binds);
                return;
            }
            Verdict::Refused(_) => {
                bump(&stats.refused);
                return;
            }
            Verdict::Forward { to } => (to, datagram),
            Verdict::Challenge { to, frame } => {
                if self.send_udp(channel, to, &frame).await {
                    bump(&stats.challenges);
                }
                return;
            }
        };
        let sent = match to {
            At::Udp(to) => self.send_udp(channel, to, frame).await,
            At::Stream(conn) => self.send_stream(conn, channel.port, frame),
        };
        if sent {
            channel
                .last_used
                .store(ms_since(channel.opened), Ordering::Relaxed);
            bump(&stats.relayed_packets);
            let n = frame.len() as u64;
            stats.relayed_bytes.fetch_add(n, Ordering::Relaxed);
            channel.packets.fetch_add(1, Ordering::Relaxed);
            channel.bytes.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Sends `datagram` from `channel`'s port to `to`, from the socket of its IP version.
    async fn send_udp(&self, channel: &Channel, to: SocketAddr, datagram: &[u8]) -> bool {
        let to = SocketAddr::new(to.ip().to_canonical(), to.port());
        let socks = channel.socks();
        let Some((sock, _)) = socks
            .iter()
            .flat_map(|s| s.iter())
            .find(|(_, v6)| *v6 == to.is_ipv6())
        else {
            bump(&self.stats.refused);
            return false;
        };
        match sock.send_to(datagram, to).await {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(%to, error = %e, "relay: send");
                false
            }
        }
    }

    /// Queues `datagram` of the channel on `port` to the stream connection `conn`; a full
    /// queue drops it, counted.
    fn send_stream(&self, conn: u64, port: u16, datagram: &[u8]) -> bool {
        let (Some(tx), Some(message)) = (
            self.streams.get(&conn),
            cyphonic_control::relay::stream_message(port, datagram),
        ) else {
            bump(&self.stats.refused);
            return false;
        };
        if tx.try_send(message).is_err() {
            bump(&self.stats.stream_queue_drops);
            return false;
        }
        true
    }

    /// Closes every channel (the relay is stopping).
    pub fn close_all(&self) {
        self.closing.send_replace(true);
    }

    /// The relay's settings in words, for the log.
    pub fn describe(&self) -> String {
        let (first, last) = (self.config.ports.start(), self.config.ports.end());
        let stream = self.config.stream.as_ref().map_or(String::new(), |s| {
            let tls = if s.tls.is_some() { "TLS" } else { "TCP" };
            format!(", stream ({tls}) on {}", s.listen)
        });
        if self.config.addresses.is_empty() {
            format!("ports {first}-{last} on every address{stream}")
        } else {
            let a: Vec<String> = self
                .config
                .addresses
                .iter()
                .map(ToString::to_string)
                .collect();
            format!("ports {first}-{last} on {}{stream}", a.join(", "))
        }
    }

    /// How many ports the configured range holds: the most channels open at once.
    pub fn port_count(&self) -> u64 {
        u64::from(*self.config.ports.end() - *self.config.ports.start()) + 1
    }

    /// How many channels are open.
    pub fn open_channels(&self) -> usize {
        self.pairs.len()
    }

    /// The open channels, for the status document.
    pub fn channels(&self) -> Vec<ChannelStatus> {
        let mut out: Vec<ChannelStatus> = self
            .pairs
            .iter()
            .map(|c| ChannelStatus {
                port: c.port,
                a: c.sides[0].name.clone(),
                b: c.sides[1].name.clone(),
                reason: c.reason.describe().to_owned(),
                age_secs: c.opened.elapsed().as_secs(),
                packets: c.packets.load(Ordering::Relaxed),
                bytes: c.bytes.load(Ordering::Relaxed),
            })
            .collect();
        out.sort_by_key(|c| c.port);
        out
    }

    /// How many open channels have `fingerprint` as a side.
    pub fn channels_of(&self, fingerprint: &str) -> usize {
        self.pairs
            .iter()
            .filter(|e| e.key().0 == fingerprint || e.key().1 == fingerprint)
            .count()
    }

    /// The least recently used channel of the client holding the most, when it holds at
    /// least two more than `most` (the larger holding of a pair's sides).
    fn reclaimable(&self, most: usize) -> Option<Arc<Channel>> {
        let mut held: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let entries: Vec<_> = self.pairs.iter().map(|e| e.value().clone()).collect();
        for c in &entries {
            for s in &c.sides {
                *held.entry(&s.fingerprint).or_default() += 1;
            }
        }
        let (heaviest, count) = held.into_iter().max_by_key(|(_, n)| *n)?;
        if count < most + 2 {
            return None;
        }
        entries
            .iter()
            .filter(|c| c.sides.iter().any(|s| s.fingerprint == heaviest))
            .min_by_key(|c| c.opened + Duration::from_millis(c.last_used.load(Ordering::Relaxed)))
            .cloned()
    }
}

/// The second socket's next datagram, or never with one socket.
async fn recv_second(
    socks: &[(UdpSocket, bool)],
    buf: &mut [u8],
) -> std::io::Result<(usize, SocketAddr)> {
    match socks.get(1) {
        Some((s, _)) => s.recv_from(buf).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relay(ports: std::ops::RangeInclusive<u16>) -> Arc<Trs> {
        Arc::new(Trs::new(RelayConfig {
            addresses: vec!["127.0.0.1".parse().unwrap_or_else(|_| unreachable!())],
            ports,
            idle: Duration::from_secs(120),
            stream: None,
        }))
    }

    fn party(fp: &str) -> Party<'_> {
        Party {
            fingerprint: fp,
            name: fp,
            legacy: false,
        }
    }

    /// Issue 49, finding 4 (the relay): two members holding every port between them cannot
    /// keep a fresh pair out: it takes the least recently used channel of the member holding
    /// the most; a pair whose sides hold as many as anyone is refused instead, and so is one
    /// when nobody holds two more than it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_relay_gives_a_fresh_pair_a_channel_of_the_member_holding_the_most() {
        let trs = relay(42_300..=42_305);
        let peers: Vec<String> = (0..6).map(|i| format!("peer{i}")).collect();
        // "hog" holds 4 channels, "other" 2: every port taken.
        let mut held = Vec::new();
        for p in &peers[..4] {
            held.push(
                trs.channel(party("hog"), party(p), RelayReason::SymmetricNat)
                    .await
                    .unwrap(),
            );
        }
        for p in &peers[4..] {
            held.push(
                trs.channel(party("other"), party(p), RelayReason::SymmetricNat)
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(trs.open_channels(), 6);
        // The hog's oldest channel is the least recently used one: relayed nothing since.
        held[1]
            .last_used
            .store(ms_since(held[1].opened), Ordering::Relaxed);
        let fresh = trs
            .channel(
                party("fresh-a"),
                party("fresh-b"),
                RelayReason::SymmetricNat,
            )
            .await
            .unwrap_or_else(|e| panic!("the fresh pair was refused: {e}"));
        assert_eq!(trs.open_channels(), 6);
        assert_eq!(trs.channels_of("hog"), 3);
        assert_eq!(
            fresh.port, held[0].port,
            "it got the hog's least recently used port"
        );
        assert_eq!(trs.stats.channels_reclaimed.load(Ordering::Relaxed), 1);
        // A pair one of whose sides is the hog gets nothing from it (3 is not 2 more than 3).
        let refused = trs
            .channel(party("hog"), party("peer9"), RelayReason::SymmetricNat)
            .await;
        assert!(refused.is_err(), "the hog took a channel from itself");
        // Fresh pairs go on taking channels of whoever holds two more than them, until
        // nobody does: then every member holds at most one, and the next is refused.
        let mut n = 0;
        let refused_at = loop {
            n += 1;
            let (x, y) = (format!("new{n}-a"), format!("new{n}-b"));
            if trs
                .channel(party(&x), party(&y), RelayReason::SymmetricNat)
                .await
                .is_err()
            {
                break n;
            }
            assert!(n < 20, "the relay never became fair");
        };
        assert!(refused_at > 1);
        for member in ["hog", "other", "fresh-a", "new1-a"] {
            assert!(
                trs.channels_of(member) <= 1,
                "{member}: {}",
                trs.channels_of(member)
            );
        }
        assert_eq!(trs.open_channels(), 6);
        assert_eq!(trs.stats.channels_refused.load(Ordering::Relaxed), 2);
        trs.close_all();
    }
}

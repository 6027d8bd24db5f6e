//! The resolver state machine.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, PTR, SOA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use ipnet::{IpNet, Ipv4Net};

/// How long an asked query may wait for its answer before the client gets SERVFAIL.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);
/// Queries waiting at once; more are refused with SERVFAIL (bounded memory under a flood).
const MAX_PENDING: usize = 1024;
/// Queries of one client waiting at once: one device cannot take every place. (A browser
/// opening a page asks a few dozen names at most.)
pub const MAX_PENDING_PER_CLIENT: u16 = 32;
/// How long the key of a question given up on (SERVFAIL) stays out of use while its lookup
/// may still answer: longer than any upstream or cloud lookup lives.
const KEY_QUARANTINE: Duration = Duration::from_secs(60);
/// The UDP payload we advertise and send at most with EDNS: fits one unfragmented datagram on
/// any path (the DNS flag day 2020 value), and the LAN's frames.
const EDNS_PAYLOAD: u16 = 1232;

/// The zone this adapter answers for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneConfig {
    /// The overlay's domain (`ovl.example`).
    pub overlay_domain: Name,
    /// The adapter's FQDN (`gw1.ovl.example`): the zone it is authoritative for.
    pub own_name: Name,
    /// The adapter's gateway vIP: what its own name resolves to.
    pub own_ip: Ipv4Addr,
    /// Its own name's IPv6 address (its AAAA), if it has one.
    pub own_ip6: Option<std::net::Ipv6Addr>,
    /// The adapter's block: the reverse zone it is authoritative for.
    pub own_block: Ipv4Net,
    /// The overlay's address range.
    pub overlay: Ipv4Net,
    /// TTL of the answers we give (and the SOA minimum for negative answers), seconds.
    pub ttl: u32,
    /// Whether upstream resolvers are configured for names outside the overlay.
    pub upstream: bool,
    /// Whether the cloud is asked about overlay names nobody here knows.
    pub ask_cloud: bool,
}

/// A peer adapter and the names and addresses behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerZone {
    /// The driver's id of the peer.
    pub peer: u32,
    /// Its FQDN: its zone.
    pub name: Name,
    /// Its certified blocks (reverse lookups).
    pub blocks: Vec<IpNet>,
}

/// Why a message got nothing back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Drop {
    /// Not a DNS message.
    Malformed,
    /// A response where a query belongs (or the reverse), or an answer nobody asked for.
    Unexpected,
}

/// What the driver does with a query.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Send this DNS message back to the client.
    Respond(Vec<u8>),
    /// Send `query` to peer `peer`'s DNS over the tunnel; its answer goes to
    /// [`Resolver::handle_peer_answer`].
    AskPeer {
        /// The peer.
        peer: u32,
        /// The DNS query to send.
        query: Vec<u8>,
    },
    /// Resolve `name`/`record_type` with the upstream resolvers and report with
    /// [`Resolver::complete`] under `key`.
    AskUpstream {
        /// What to look up.
        name: Name,
        /// Which type.
        record_type: RecordType,
        /// Pass back to `complete`.
        key: u16,
    },
    /// Ask the cloud about the overlay name `name` and report with [`Resolver::complete`]
    /// under `key` (the control-plane issue wires this).
    AskCloud {
        /// What to look up.
        name: Name,
        /// Which type.
        record_type: RecordType,
        /// Pass back to `complete`.
        key: u16,
    },
    /// Nothing to send.
    Drop(Drop),
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Queries received.
    pub queries: u64,
    /// Answered from our own zone.
    pub authoritative: u64,
    /// NXDOMAIN given.
    pub nxdomain: u64,
    /// Refused.
    pub refused: u64,
    /// SERVFAIL given (timeouts, failures, overload).
    pub servfail: u64,
    /// Asked of peers, upstream or the cloud.
    pub asked: u64,
    /// Malformed or unexpected messages dropped.
    pub dropped: u64,
    /// Upstream answer records dropped for pointing into the overlay, private, loopback or
    /// link-local ranges (DNS rebinding).
    pub rebinding: u64,
    /// Queries answered SERVFAIL because their client had [`MAX_PENDING_PER_CLIENT`] waiting.
    pub client_busy: u64,
}

impl Stats {
    /// Every counter with its name, in declaration order (for metrics).
    pub const fn named(&self) -> [(&'static str, u64); 9] {
        [
            ("queries", self.queries),
            ("authoritative", self.authoritative),
            ("nxdomain", self.nxdomain),
            ("refused", self.refused),
            ("servfail", self.servfail),
            ("asked", self.asked),
            ("dropped", self.dropped),
            ("rebinding", self.rebinding),
            ("client_busy", self.client_busy),
        ]
    }
}

/// Whether an address lies where an answer from outside must not point (DNS rebinding): the
/// overlay and shared address space (100.64.0.0/10), private ranges (RFC 1918, IPv6 ULA),
/// loopback, link-local, unspecified; IPv4-mapped IPv6 addresses are judged as IPv4.
fn inward(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || (o[0] == 100 && o[1] & 0xc0 == 64)
        }
        std::net::IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return inward(std::net::IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || s[0] & 0xfe00 == 0xfc00
                || s[0] & 0xffc0 == 0xfe80
        }
    }
}

/// Who asked, and how the answer must be shaped for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Asker {
    /// The query's id.
    id: u16,
    /// Its RD bit, echoed.
    rd: bool,
    /// The UDP payload size it advertised with EDNS (RFC 6891), if it sent an OPT record.
    edns: Option<u16>,
}

impl Asker {
    /// Largest response this asker takes over UDP: 512 bytes without EDNS (RFC 1035 §4.2.1),
    /// otherwise what it advertised, capped at [`EDNS_PAYLOAD`].
    fn udp_limit(&self) -> usize {
        usize::from(self.edns.map_or(512, |p| p.clamp(512, EDNS_PAYLOAD)))
    }
}

#[derive(Debug)]
struct Pending<C> {
    client: C,
    asker: Asker,
    query: Query,
    deadline: Instant,
    /// Which peer was asked (answers from anyone else are not believed).
    peer: Option<u32>,
    /// Asked of the upstream resolvers: their addresses must lie outside the overlay and
    /// private ranges.
    upstream: bool,
}

/// Whoever asked a question, as the driver knows it (where the answer goes), and who that is
/// for the cap on questions waiting per client.
pub trait Client: Copy {
    /// Who the client is: questions waiting are counted per source (a device's address, not
    /// its port: a flood from many ports of one device is one client).
    type Source: std::hash::Hash + Eq + Copy + std::fmt::Debug;

    /// This client's source.
    fn source(&self) -> Self::Source;
}

/// Clients named by their address and port: counted by address.
impl Client for std::net::SocketAddr {
    type Source = std::net::IpAddr;

    fn source(&self) -> std::net::IpAddr {
        self.ip()
    }
}

/// Clients numbered by the driver: each number is a source.
impl Client for u32 {
    type Source = Self;

    fn source(&self) -> Self {
        *self
    }
}

/// Clients named by a label (tests and tools): each label is a source.
impl Client for &'static str {
    type Source = Self;

    fn source(&self) -> Self {
        self
    }
}

/// The resolver; `C` is whatever the driver needs to answer the client later.
#[derive(Debug)]
pub struct Resolver<C: Client> {
    cfg: ZoneConfig,
    /// Each device's addresses: IPv4, and IPv6 when it has one (its AAAA).
    hosts: HashMap<Name, (Option<Ipv4Addr>, Option<std::net::Ipv6Addr>)>,
    reverse: HashMap<Ipv4Addr, Name>,
    peers: Vec<PeerZone>,
    pending: HashMap<u16, Pending<C>>,
    /// Keys of questions given up on whose upstream or cloud lookup may still answer: not
    /// handed out again until that answer came or [`KEY_QUARANTINE`] passed, so a late
    /// answer can never settle another question parked under the same key.
    quarantined: HashMap<u16, Instant>,
    /// Questions waiting, per client source (no entry at zero).
    per_client: HashMap<C::Source, u16>,
    next_id: u16,
    stats: Stats,
}

impl<C: Client> Resolver<C> {
    /// A resolver for `cfg`'s zone, with no device names yet.
    pub fn new(cfg: ZoneConfig) -> Self {
        Self {
            cfg,
            hosts: HashMap::new(),
            reverse: HashMap::new(),
            peers: Vec::new(),
            pending: HashMap::new(),
            quarantined: HashMap::new(),
            per_client: HashMap::new(),
            next_id: 1,
            stats: Stats::default(),
        }
    }

    /// Replaces the device names: `(label, address, IPv6 address)`, each answering as
    /// `<label>.<own name>` (A when it has an IPv4 address, AAAA when it has an IPv6 one;
    /// a device with IPv6 only has no A: NODATA).
    pub fn set_hosts<'a>(
        &mut self,
        hosts: impl IntoIterator<Item = (&'a str, Option<Ipv4Addr>, Option<std::net::Ipv6Addr>)>,
    ) {
        self.hosts.clear();
        self.reverse.clear();
        self.reverse
            .insert(self.cfg.own_ip, self.cfg.own_name.clone());
        for (label, ip, ip6) in hosts {
            let Ok(name) =
                Name::from_ascii(label).and_then(|l| l.append_domain(&self.cfg.own_name))
            else {
                continue;
            };
            if ip.is_none() && ip6.is_none() {
                continue;
            }
            let name = name.to_lowercase();
            if let Some(ip) = ip {
                self.reverse.insert(ip, name.clone());
            }
            self.hosts.insert(name, (ip, ip6));
        }
    }

    /// Sets the peers whose zones are asked of them.
    pub fn set_peers(&mut self, peers: Vec<PeerZone>) {
        self.peers = peers;
    }

    /// Whether names outside the overlay are asked of upstream resolvers (else REFUSED).
    pub const fn set_upstream(&mut self, upstream: bool) {
        self.cfg.upstream = upstream;
    }

    /// Counters.
    pub const fn stats(&self) -> Stats {
        self.stats
    }

    /// Handles a DNS message addressed to our DNS service. `from_peer` says whether it came
    /// over the tunnel from that peer (which only gets our own zone's data).
    pub fn handle_query(
        &mut self,
        now: Instant,
        msg: &[u8],
        client: C,
        from_peer: Option<u32>,
    ) -> Action {
        let Ok(q) = Message::from_vec(msg) else {
            self.stats.dropped += 1;
            return Action::Drop(Drop::Malformed);
        };
        if q.metadata.message_type != MessageType::Query {
            self.stats.dropped += 1;
            return Action::Drop(Drop::Unexpected);
        }
        self.stats.queries += 1;
        let to = Asker {
            id: q.metadata.id,
            rd: q.metadata.recursion_desired,
            edns: q.edns.as_ref().map(Edns::max_payload),
        };
        if q.metadata.op_code != OpCode::Query {
            return Action::Respond(self.error(&to, None, ResponseCode::NotImp));
        }
        let [question] = q.queries.as_slice() else {
            return Action::Respond(self.error(&to, None, ResponseCode::FormErr));
        };
        if question.query_class() != DNSClass::IN {
            return self.refuse(&to, question);
        }
        let name = question.name().to_lowercase();
        let qtype = question.query_type();

        // Our own zone: the adapter's name and its devices'.
        if self.cfg.own_name.zone_of(&name) {
            return Action::Respond(self.own_zone_answer(&to, question, &name));
        }
        // Reverse lookups.
        if let Ok(IpNet::V4(net)) = name.parse_arpa_name()
            && net.prefix_len() == 32
        {
            let ip = std::net::IpAddr::V4(net.addr());
            if self.cfg.own_block.contains(&net.addr()) {
                return Action::Respond(self.own_reverse_answer(&to, question, net.addr()));
            }
            let owner = self
                .peers
                .iter()
                .find(|p| p.blocks.iter().any(|b| b.contains(&ip)))
                .map(|p| p.peer);
            if let (None, Some(peer)) = (from_peer, owner) {
                return self.ask_peer(now, &to, question, client, peer);
            }
        }
        if from_peer.is_some() {
            // Peers get our own zone only.
            return self.refuse(&to, question);
        }
        // A peer adapter's zone.
        if let Some(peer) = self
            .peers
            .iter()
            .find(|p| p.name.zone_of(&name))
            .map(|p| p.peer)
        {
            return self.ask_peer(now, &to, question, client, peer);
        }
        // The rest of the overlay (AAAA as A: the cloud knows names' IPv6 addresses too).
        if self.cfg.overlay_domain.zone_of(&name) {
            if self.cfg.ask_cloud {
                let Some(key) = self.park(now, &to, question, client, None, false) else {
                    return Action::Respond(self.error(
                        &to,
                        Some(question),
                        ResponseCode::ServFail,
                    ));
                };
                return Action::AskCloud {
                    name,
                    record_type: qtype,
                    key,
                };
            }
            self.stats.nxdomain += 1;
            return Action::Respond(self.response(
                &to,
                question,
                ResponseCode::NXDomain,
                vec![],
                false,
            ));
        }
        // Outside the overlay.
        if self.cfg.upstream {
            let Some(key) = self.park(now, &to, question, client, None, true) else {
                return Action::Respond(self.error(&to, Some(question), ResponseCode::ServFail));
            };
            return Action::AskUpstream {
                name,
                record_type: qtype,
                key,
            };
        }
        self.refuse(&to, question)
    }

    /// Takes a peer's answer to a query we forwarded; returns the client and the response for
    /// it. Answers nobody asked for (or from another peer, or for another question) are
    /// dropped.
    pub fn handle_peer_answer(&mut self, msg: &[u8], from_peer: u32) -> Option<(C, Vec<u8>)> {
        let Ok(a) = Message::from_vec(msg) else {
            self.stats.dropped += 1;
            return None;
        };
        let key = a.metadata.id;
        let matches = self.pending.get(&key).is_some_and(|p| {
            p.peer == Some(from_peer)
                && a.metadata.message_type == MessageType::Response
                && a.queries.first().is_some_and(|q| {
                    q.name().to_lowercase() == p.query.name().to_lowercase()
                        && q.query_type() == p.query.query_type()
                })
        });
        if !matches {
            self.stats.dropped += 1;
            return None;
        }
        let p = self.unpark(key)?;
        let rcode = a.metadata.response_code;
        // Only records about the asked name, from the peer's zone, pass through; and an
        // address only inside the blocks the peer's certificate names (a peer cannot point
        // our devices at another site, or outside the overlay).
        let peer = self.peers.iter().find(|z| z.peer == from_peer);
        let zone = peer.map(|z| z.name.clone());
        let certified =
            |ip: std::net::IpAddr| peer.is_some_and(|z| z.blocks.iter().any(|b| b.contains(&ip)));
        let answers: Vec<Record> = a
            .answers
            .into_iter()
            .filter(|r| {
                r.name.to_lowercase() == p.query.name().to_lowercase()
                    || zone
                        .as_ref()
                        .is_some_and(|z| z.zone_of(&r.name.to_lowercase()))
            })
            .filter(|r| match &r.data {
                RData::A(a) => certified(std::net::IpAddr::V4(a.0)),
                RData::AAAA(a) => certified(std::net::IpAddr::V6(a.0)),
                _ => true,
            })
            .collect();
        if rcode == ResponseCode::NXDomain {
            self.stats.nxdomain += 1;
        }
        let resp = self.response(&p.asker, &p.query, rcode, answers, false);
        Some((p.client, resp))
    }

    /// Reports the result of an [`Action::AskUpstream`] or [`Action::AskCloud`]: the records
    /// found (empty for "no such data"), or the response code of the failure (`NXDomain`,
    /// `ServFail`).
    pub fn complete(
        &mut self,
        key: u16,
        result: Result<Vec<Record>, ResponseCode>,
    ) -> Option<(C, Vec<u8>)> {
        if self.quarantined.remove(&key).is_some() {
            // The answer to a question given up on: its asker had SERVFAIL already.
            self.stats.dropped += 1;
            return None;
        }
        let p = self.unpark(key)?;
        let (rcode, mut answers) = match result {
            Ok(records) => (ResponseCode::NoError, records),
            Err(code) => (code, Vec::new()),
        };
        if p.upstream {
            // DNS rebinding: a name outside the overlay must not lead devices into it, or to
            // private, loopback or link-local addresses.
            let before = answers.len();
            answers.retain(|r| match &r.data {
                RData::A(a) => !inward(std::net::IpAddr::V4(a.0)),
                RData::AAAA(a) => !inward(std::net::IpAddr::V6(a.0)),
                _ => true,
            });
            self.stats.rebinding += (before - answers.len()) as u64;
        }
        match rcode {
            ResponseCode::NXDomain => self.stats.nxdomain += 1,
            ResponseCode::ServFail => self.stats.servfail += 1,
            _ => {}
        }
        let resp = self.response(&p.asker, &p.query, rcode, answers, false);
        Some((p.client, resp))
    }

    /// Answers SERVFAIL to every query asked more than three seconds ago.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<(C, Vec<u8>)> {
        let expired: Vec<u16> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        self.quarantined
            .retain(|_, since| now.saturating_duration_since(*since) < KEY_QUARANTINE);
        let mut out = Vec::new();
        for key in expired {
            if let Some(p) = self.unpark(key) {
                if p.peer.is_none() {
                    // An upstream or cloud lookup is still out under this key.
                    self.quarantined.insert(key, now);
                }
                self.stats.servfail += 1;
                out.push((
                    p.client,
                    self.response(&p.asker, &p.query, ResponseCode::ServFail, vec![], false),
                ));
            }
        }
        out
    }

    /// When the next query times out.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pending.values().map(|p| p.deadline).min()
    }

    fn ask_peer(
        &mut self,
        now: Instant,
        to: &Asker,
        question: &Query,
        client: C,
        peer: u32,
    ) -> Action {
        let Some(key) = self.park(now, to, question, client, Some(peer), false) else {
            return Action::Respond(self.error(to, Some(question), ResponseCode::ServFail));
        };
        let mut q = Message::new(key, MessageType::Query, OpCode::Query);
        q.add_query(question.clone());
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        q.set_edns(edns);
        match q.to_vec() {
            Ok(query) => Action::AskPeer { peer, query },
            Err(_) => {
                self.unpark(key);
                Action::Respond(self.error(to, Some(question), ResponseCode::ServFail))
            }
        }
    }

    /// Forgets the query waiting under `key`, and that its client has it waiting.
    fn unpark(&mut self, key: u16) -> Option<Pending<C>> {
        let p = self.pending.remove(&key)?;
        let source = p.client.source();
        if let Some(n) = self.per_client.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&source);
            }
        }
        Some(p)
    }

    /// Remembers a query we are asking someone about; returns its new id, or None when too
    /// many are waiting already, in all or for its client.
    fn park(
        &mut self,
        now: Instant,
        to: &Asker,
        question: &Query,
        client: C,
        peer: Option<u32>,
        upstream: bool,
    ) -> Option<u16> {
        if self.pending.len() >= MAX_PENDING {
            self.stats.servfail += 1;
            return None;
        }
        let source = client.source();
        if self
            .per_client
            .get(&source)
            .is_some_and(|n| *n >= MAX_PENDING_PER_CLIENT)
        {
            self.stats.client_busy += 1;
            self.stats.servfail += 1;
            return None;
        }
        // Sequential ids are fine here: answers are matched on id, peer and question, and
        // come over authenticated tunnels or from the resolver library; keys in use or in
        // quarantine are skipped.
        let mut key = self.next_id;
        let mut tried = 0u32;
        while self.pending.contains_key(&key) || self.quarantined.contains_key(&key) {
            key = key.wrapping_add(1);
            tried += 1;
            if tried > u32::from(u16::MAX) {
                self.stats.servfail += 1;
                return None;
            }
        }
        self.next_id = key.wrapping_add(1);
        self.stats.asked += 1;
        *self.per_client.entry(source).or_insert(0) += 1;
        self.pending.insert(
            key,
            Pending {
                client,
                asker: *to,
                query: question.clone(),
                deadline: now + ASK_TIMEOUT,
                peer,
                upstream,
            },
        );
        Some(key)
    }

    fn own_zone_answer(&mut self, to: &Asker, question: &Query, name: &Name) -> Vec<u8> {
        self.stats.authoritative += 1;
        let own = *name == self.cfg.own_name.to_lowercase();
        let ip = if own {
            Some((Some(self.cfg.own_ip), self.cfg.own_ip6))
        } else {
            self.hosts.get(name).copied()
        };
        let Some((ip, ip6)) = ip else {
            self.stats.nxdomain += 1;
            return self.response(to, question, ResponseCode::NXDomain, vec![], true);
        };
        let aaaa = ip6.map(|ip6| {
            Record::from_rdata(
                question.name().clone(),
                self.cfg.ttl,
                RData::AAAA(ip6.into()),
            )
        });
        let a =
            ip.map(|ip| Record::from_rdata(question.name().clone(), self.cfg.ttl, RData::A(A(ip))));
        let answers = match question.query_type() {
            RecordType::A => a.into_iter().collect(),
            RecordType::AAAA => aaaa.into_iter().collect(),
            RecordType::ANY => a.into_iter().chain(aaaa).collect(),
            // The name exists; it has no data of this type (RFC 2308 NODATA).
            _ => vec![],
        };
        self.response(to, question, ResponseCode::NoError, answers, true)
    }

    fn own_reverse_answer(&mut self, to: &Asker, question: &Query, ip: Ipv4Addr) -> Vec<u8> {
        self.stats.authoritative += 1;
        match (self.reverse.get(&ip).cloned(), question.query_type()) {
            (Some(target), RecordType::PTR | RecordType::ANY) => {
                let record = Record::from_rdata(
                    question.name().clone(),
                    self.cfg.ttl,
                    RData::PTR(PTR(target)),
                );
                self.response(to, question, ResponseCode::NoError, vec![record], true)
            }
            (Some(_), _) => self.response(to, question, ResponseCode::NoError, vec![], true),
            (None, _) => {
                self.stats.nxdomain += 1;
                self.response(to, question, ResponseCode::NXDomain, vec![], true)
            }
        }
    }

    fn refuse(&mut self, to: &Asker, question: &Query) -> Action {
        self.stats.refused += 1;
        Action::Respond(self.error(to, Some(question), ResponseCode::Refused))
    }

    fn error(&self, to: &Asker, question: Option<&Query>, code: ResponseCode) -> Vec<u8> {
        let mut m = self.header(to, code);
        if let Some(q) = question {
            m.add_query(q.clone());
        }
        encode(&m, to)
    }

    fn response(
        &self,
        to: &Asker,
        question: &Query,
        code: ResponseCode,
        answers: Vec<Record>,
        authoritative: bool,
    ) -> Vec<u8> {
        let mut m = self.header(to, code);
        m.metadata.authoritative = authoritative;
        m.add_query(question.clone());
        let empty = answers.is_empty();
        m.add_answers(answers);
        if authoritative && empty {
            // RFC 2308 §3: negative answers carry the zone's SOA, whose minimum bounds caching.
            m.add_authority(self.soa());
        }
        encode(&m, to)
    }

    /// A response to `to` with `code`, before any section is filled in.
    fn header(&self, to: &Asker, code: ResponseCode) -> Message {
        let mut m = Message::response(to.id, OpCode::Query);
        m.metadata.response_code = code;
        m.metadata.recursion_desired = to.rd;
        m.metadata.recursion_available = self.cfg.upstream;
        if to.edns.is_some() {
            // RFC 6891 §6.1.1: a query with an OPT record gets one back.
            let mut edns = Edns::new();
            edns.set_max_payload(EDNS_PAYLOAD);
            m.set_edns(edns);
        }
        m
    }

    fn soa(&self) -> Record {
        let zone = self.cfg.own_name.clone();
        let rname = Name::from_ascii("hostmaster")
            .and_then(|h| h.append_domain(&zone))
            .unwrap_or_else(|_| zone.clone());
        let ttl = i32::try_from(self.cfg.ttl).unwrap_or(i32::MAX);
        Record::from_rdata(
            zone.clone(),
            self.cfg.ttl,
            RData::SOA(SOA::new(
                zone,
                rname,
                1,
                3600,
                600,
                86400.max(ttl),
                self.cfg.ttl,
            )),
        )
    }
}

/// Encodes `m` for `to`; when it is larger than `to` takes over UDP, the truncated form (TC
/// set, question and OPT only: RFC 2181 §9, the client may retry over TCP).
fn encode(m: &Message, to: &Asker) -> Vec<u8> {
    match m.to_vec() {
        Ok(bytes) if bytes.len() <= to.udp_limit() => bytes,
        _ => m.truncate().to_vec().unwrap_or_default(),
    }
}

//! The DHCPv6 server (RFC 8415), sans-IO: stateful addresses (IA_NA) from a pool of the
//! segment's /64, the DNS server and the search list; Information-request answered. No
//! temporary addresses (IA_TA), no prefix delegation, no relays, no Rapid Commit (an Advertise
//! answers every Solicit: two servers of an HA pair never both commit).
//!
//! A binding is a client's DUID and IAID; the MAC that sent the message holds the address.
//! An address new to a binding is drawn from the pool by a hash of its DUID and IAID, so a
//! device that lost its lease file gets the same address back while it is free. Bounded: at
//! most [`PER_MAC`] bindings a MAC (a device with more, or a flood of DUIDs from one MAC, ends
//! its oldest), at most the pool's share for new clients within a window (as for DHCPv4), and
//! at most twice the pool of bindings kept, ended ones forgotten oldest first.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash as _, Hasher as _};
use std::net::Ipv6Addr;

use dhcproto::v6::{
    DhcpOption, IAAddr, IANA, Message, MessageType, OptionCode, Status, StatusCode,
};
use dhcproto::{Decodable as _, Decoder, Encodable as _, Name};
use ipnet::Ipv6Net;
use serde::{Deserialize, Serialize};

use crate::share::{Newcomers, Share, share_of};

/// Bindings one MAC may hold at once; a new one beyond this ends its oldest.
pub const PER_MAC: usize = 4;
/// IA_NAs answered in one message, and addresses read in one IA_NA.
const MAX_IAS: usize = 4;
/// How long a declined address stays out of the pool, seconds.
const DECLINE_HOLD: u64 = 600;
/// The most addresses a pool may hold: drawing one is a walk of the pool at worst.
pub const MAX_POOL: u128 = 65_536;

/// A configuration the DHCPv6 server cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Config6Error {
    /// The pool is not inside the segment's /64, empty, or larger than [`MAX_POOL`].
    #[error(
        "the DHCPv6 pool {first}-{last} must be inside {prefix}, first before last, at most 65536 addresses"
    )]
    Pool {
        /// First pool address.
        first: Ipv6Addr,
        /// Last pool address.
        last: Ipv6Addr,
        /// The segment's prefix.
        prefix: Ipv6Net,
    },
    /// The lease time is out of range.
    #[error("lease time {0} s is outside 60..=31536000 (one minute to one year)")]
    LeaseTime(u32),
    /// The starvation share is not a fraction.
    #[error("new_lease_share {0} is outside (0, 1]")]
    Share(String),
}

/// A device with a fixed IPv6 address (its `vip6`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation6 {
    /// Its MAC: the first binding it asks for gets the address.
    pub mac: [u8; 6],
    /// Its address, inside the segment's /64.
    pub ip: Ipv6Addr,
}

/// How the DHCPv6 server hands out addresses.
#[derive(Debug, Clone, PartialEq)]
pub struct Dhcp6Config {
    /// The segment's /64.
    pub prefix: Ipv6Net,
    /// First and last address of the pool (inclusive).
    pub pool: (Ipv6Addr, Ipv6Addr),
    /// Valid and preferred lifetime, seconds (T1 is half of it, T2 four fifths).
    pub lease_secs: u32,
    /// The gateway's MAC: the server's DUID is the DUID-LL made from it, so the two boxes of
    /// an HA pair (one MAC) are one server to the devices.
    pub server_mac: [u8; 6],
    /// The DNS server to name (option 23), if the DNS service runs.
    pub dns: Option<Ipv6Addr>,
    /// The search list's one domain (option 24): the adapter's zone.
    pub domain: String,
    /// Fixed addresses.
    pub reservations: Vec<Reservation6>,
    /// The share of the pool new clients may be bound to within a window.
    pub new_lease_share: f64,
    /// That window, seconds.
    pub new_lease_window_secs: u64,
}

impl Dhcp6Config {
    /// The default pool of `prefix`: `::1000` to `::1fff`.
    pub fn default_pool(prefix: Ipv6Net) -> (Ipv6Addr, Ipv6Addr) {
        let base = prefix.network().to_bits();
        (
            Ipv6Addr::from_bits(base | 0x1000),
            Ipv6Addr::from_bits(base | 0x1fff),
        )
    }
}

/// One binding of an address to a client's identity association.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease6 {
    /// The client's DUID.
    pub duid: Vec<u8>,
    /// The identity association's ID.
    pub iaid: u32,
    /// The MAC that asked for it: the one that holds the address.
    pub mac: [u8; 6],
    /// The address.
    pub ip: Ipv6Addr,
    /// The host name the client gave (Client FQDN option, its first label).
    pub hostname: Option<String>,
    /// End of the valid lifetime, unix seconds.
    pub expires: u64,
    /// Whether the binding is in force.
    pub active: bool,
}

/// What changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event6 {
    /// A binding was made or renewed.
    Granted(Lease6),
    /// A client gave its address back, or its MAC's newer binding took its place.
    Released(Lease6),
    /// A binding ran out.
    Expired(Lease6),
    /// A client said its address is used by another host.
    Declined {
        /// The address.
        ip: Ipv6Addr,
        /// The client's MAC.
        mac: [u8; 6],
    },
    /// No address left for a new client.
    PoolExhausted {
        /// The client's MAC.
        mac: [u8; 6],
    },
    /// A new client was refused by the starvation guard.
    StarvationGuard {
        /// The client's MAC.
        mac: [u8; 6],
    },
}

/// Why a message gets no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Ignore6 {
    /// Not a DHCPv6 message (truncated, garbage).
    Malformed,
    /// A server's message, a relay's, or a type a server does not answer.
    Unexpected,
    /// No Client Identifier, or one where RFC 8415 §16 forbids it.
    NoClientId,
    /// For another server, or a Server Identifier where §16 forbids one.
    OtherServer,
}

impl Ignore6 {
    /// The reason's name, for metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Unexpected => "unexpected",
            Self::NoClientId => "no_client_id",
            Self::OtherServer => "other_server",
        }
    }
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats6 {
    /// Solicits.
    pub solicits: u64,
    /// Requests, Renews and Rebinds.
    pub requests: u64,
    /// Releases.
    pub releases: u64,
    /// Declines.
    pub declines: u64,
    /// Confirms and Information-requests.
    pub informs: u64,
    /// Advertises sent.
    pub advertises: u64,
    /// Replies sent.
    pub replies: u64,
    /// Messages ignored (any reason).
    pub ignored: u64,
    /// New clients refused by the starvation guard.
    pub starvation_refused: u64,
    /// New clients refused because the pool was full.
    pub pool_exhausted: u64,
    /// Bindings ended because their MAC took more than [`PER_MAC`].
    pub per_mac_replaced: u64,
}

impl Stats6 {
    /// Every counter with its name, in declaration order (for metrics).
    pub const fn named(&self) -> [(&'static str, u64); 11] {
        [
            ("solicits", self.solicits),
            ("requests", self.requests),
            ("releases", self.releases),
            ("declines", self.declines),
            ("informs", self.informs),
            ("advertises", self.advertises),
            ("replies", self.replies),
            ("ignored", self.ignored),
            ("starvation_refused", self.starvation_refused),
            ("pool_exhausted", self.pool_exhausted),
            ("per_mac_replaced", self.per_mac_replaced),
        ]
    }
}

/// A reply: the UDP payload, from port 547 to the client's port and address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply6 {
    /// The encoded message.
    pub payload: Vec<u8>,
    /// The addresses a Reply binds or renews: they must not leave before they are stored.
    pub grants: Vec<Ipv6Addr>,
}

type Key = (Vec<u8>, u32);

/// The DHCPv6 server. See the module docs.
#[derive(Debug, Clone)]
pub struct Server6 {
    cfg: Dhcp6Config,
    duid: Vec<u8>,
    bindings: HashMap<Key, Lease6>,
    /// The active bindings by address.
    by_ip: HashMap<Ipv6Addr, Key>,
    /// The binding each address was last given to (active or ended).
    last_holder: HashMap<Ipv6Addr, Key>,
    declined: HashMap<Ipv6Addr, u64>,
    recent_new: Newcomers,
    share: Share,
    events: VecDeque<Event6>,
    dirty: bool,
    stats: Stats6,
}

impl Server6 {
    /// A server with `cfg`, resuming `saved` at unix time `now`.
    ///
    /// # Errors
    /// [`Config6Error`] when the pool or the numbers make no sense.
    pub fn new(cfg: Dhcp6Config, saved: Vec<Lease6>, now: u64) -> Result<Self, Config6Error> {
        let (first, last) = cfg.pool;
        if !cfg.prefix.contains(&first)
            || !cfg.prefix.contains(&last)
            || first > last
            || last.to_bits() - first.to_bits() >= MAX_POOL
        {
            return Err(Config6Error::Pool {
                first,
                last,
                prefix: cfg.prefix,
            });
        }
        if !(60..=31_536_000).contains(&cfg.lease_secs) {
            return Err(Config6Error::LeaseTime(cfg.lease_secs));
        }
        if !(cfg.new_lease_share > 0.0 && cfg.new_lease_share <= 1.0) {
            return Err(Config6Error::Share(cfg.new_lease_share.to_string()));
        }
        // DUID-LL (RFC 8415 §11.4): type 3, hardware type 1 (Ethernet), the MAC.
        let mut duid = vec![0, 3, 0, 1];
        duid.extend_from_slice(&cfg.server_mac);
        let mut server = Self {
            cfg,
            duid,
            bindings: HashMap::new(),
            by_ip: HashMap::new(),
            last_holder: HashMap::new(),
            declined: HashMap::new(),
            recent_new: Newcomers::default(),
            share: Share::Whole,
            events: VecDeque::new(),
            dirty: false,
            stats: Stats6::default(),
        };
        let mut saved = saved;
        saved.sort_by_key(|l| std::cmp::Reverse(l.expires));
        for mut lease in saved {
            let key = (lease.duid.clone(), lease.iaid);
            if !server.cfg.prefix.contains(&lease.ip)
                || server.bindings.contains_key(&key)
                || server.reserved_for_other(lease.ip, lease.mac)
            {
                server.dirty = true;
                continue;
            }
            if lease.active && (lease.expires <= now || server.by_ip.contains_key(&lease.ip)) {
                lease.active = false;
                server.dirty = true;
            }
            server.last_holder.entry(lease.ip).or_insert(key.clone());
            if lease.active {
                server.by_ip.insert(lease.ip, key.clone());
                server.events.push_back(Event6::Granted(lease.clone()));
            }
            server.bindings.insert(key, lease);
        }
        server.trim();
        Ok(server)
    }

    /// Handles one message from Ethernet source `mac` at unix time `now`.
    ///
    /// # Errors
    /// [`Ignore6`] saying why no reply goes out.
    pub fn handle(&mut self, now: u64, msg: &[u8], mac: [u8; 6]) -> Result<Reply6, Ignore6> {
        let r = self.handle_inner(now, msg, mac);
        match &r {
            Ok(reply) if reply.payload.first() == Some(&2) => self.stats.advertises += 1,
            Ok(_) => self.stats.replies += 1,
            Err(_) => self.stats.ignored += 1,
        }
        r
    }

    fn handle_inner(&mut self, now: u64, msg: &[u8], mac: [u8; 6]) -> Result<Reply6, Ignore6> {
        let clean = sanitize(msg).ok_or(Ignore6::Malformed)?;
        let req = Message::decode(&mut Decoder::new(&clean)).map_err(|_| Ignore6::Malformed)?;
        let client = match req.opts().get(OptionCode::ClientId) {
            Some(DhcpOption::ClientId(id)) => Some(id.clone()),
            _ => None,
        };
        let server = match req.opts().get(OptionCode::ServerId) {
            Some(DhcpOption::ServerId(id)) => Some(id.as_slice()),
            _ => None,
        };
        let kind = req.msg_type();
        // RFC 8415 §16: which messages carry a Server Identifier, and whose.
        let to_us = match kind {
            MessageType::Solicit | MessageType::Rebind | MessageType::Confirm => server.is_none(),
            MessageType::Request
            | MessageType::Renew
            | MessageType::Release
            | MessageType::Decline => server == Some(self.duid.as_slice()),
            MessageType::InformationRequest => server.is_none_or(|s| s == self.duid),
            _ => return Err(Ignore6::Unexpected),
        };
        if !to_us {
            return Err(Ignore6::OtherServer);
        }
        let Some(client) = client.filter(|c| c.len() >= 2) else {
            if kind == MessageType::InformationRequest {
                return Ok(self.reply(&req, MessageType::Reply, None, Vec::new()));
            }
            return Err(Ignore6::NoClientId);
        };
        self.expire(now);
        let ias = ia_nas(&req);
        let hostname = fqdn_label(&req);
        match kind {
            MessageType::Solicit => {
                self.stats.solicits += 1;
                let answers = ias
                    .iter()
                    .map(|ia| {
                        let key = (client.clone(), ia.id);
                        (ia.id, self.choose(now, &key, mac, hint(ia), false).ok())
                    })
                    .collect();
                Ok(self.answer(&req, MessageType::Advertise, &client, answers, false))
            }
            MessageType::Request | MessageType::Renew | MessageType::Rebind => {
                self.stats.requests += 1;
                let renewing = kind != MessageType::Request;
                let mut answers = Vec::new();
                for ia in &ias {
                    let key = (client.clone(), ia.id);
                    let ip = self.choose(now, &key, mac, hint(ia), renewing).ok();
                    let bound = match ip {
                        Some(ip) if self.admit(now, &key, mac) => {
                            self.bind(now, key, mac, ip, hostname.clone());
                            Some(ip)
                        }
                        _ => None,
                    };
                    answers.push((ia.id, bound));
                }
                Ok(self.answer(&req, MessageType::Reply, &client, answers, true))
            }
            MessageType::Release | MessageType::Decline => {
                let decline = kind == MessageType::Decline;
                if decline {
                    self.stats.declines += 1;
                } else {
                    self.stats.releases += 1;
                }
                for ia in &ias {
                    let key = (client.clone(), ia.id);
                    for ip in ia_addrs(ia) {
                        self.end(&key, ip, now, decline);
                    }
                }
                Ok(self.reply(&req, MessageType::Reply, Some(&client), Vec::new()))
            }
            MessageType::Confirm => {
                self.stats.informs += 1;
                let on_link = ias
                    .iter()
                    .flat_map(ia_addrs)
                    .all(|ip| self.cfg.prefix.contains(&ip));
                let mut msg = self.message(&req, MessageType::Reply, Some(&client));
                let status = if on_link {
                    Status::Success
                } else {
                    Status::NotOnLink
                };
                msg.opts_mut().insert(status_code(status));
                Ok(encode(&msg, Vec::new()))
            }
            _ => {
                self.stats.informs += 1;
                Ok(self.reply(&req, MessageType::Reply, Some(&client), Vec::new()))
            }
        }
    }

    /// The reply to `req` with one IA_NA per `(iaid, address)` (an IA with no address says
    /// NoAddrsAvail, or NoBinding to a Renew or Rebind).
    fn answer(
        &self,
        req: &Message,
        kind: MessageType,
        client: &[u8],
        answers: Vec<(u32, Option<Ipv6Addr>)>,
        commit: bool,
    ) -> Reply6 {
        let mut msg = self.message(req, kind, Some(client));
        let life = self.cfg.lease_secs;
        let renewing = req.msg_type() != MessageType::Request && commit;
        let mut grants = Vec::new();
        for (id, ip) in answers {
            let mut opts = dhcproto::v6::DhcpOptions::new();
            let (t1, t2) = match ip {
                Some(addr) => {
                    opts.insert(DhcpOption::IAAddr(IAAddr {
                        addr,
                        preferred_life: life,
                        valid_life: life,
                        opts: dhcproto::v6::DhcpOptions::new(),
                    }));
                    if commit {
                        grants.push(addr);
                    }
                    (life / 2, life / 5 * 4)
                }
                None => {
                    let status = if renewing {
                        Status::NoBinding
                    } else {
                        Status::NoAddrsAvail
                    };
                    opts.insert(status_code(status));
                    (0, 0)
                }
            };
            msg.opts_mut()
                .insert(DhcpOption::IANA(IANA { id, t1, t2, opts }));
        }
        if kind == MessageType::Advertise {
            msg.opts_mut().insert(DhcpOption::Preference(255));
        }
        encode(&msg, grants)
    }

    /// A reply of `kind` to `req`, with the configuration options.
    fn reply(
        &self,
        req: &Message,
        kind: MessageType,
        client: Option<&[u8]>,
        grants: Vec<Ipv6Addr>,
    ) -> Reply6 {
        encode(&self.message(req, kind, client), grants)
    }

    fn message(&self, req: &Message, kind: MessageType, client: Option<&[u8]>) -> Message {
        let mut msg = Message::new_with_id(kind, req.xid());
        let opts = msg.opts_mut();
        opts.insert(DhcpOption::ServerId(self.duid.clone()));
        if let Some(c) = client {
            opts.insert(DhcpOption::ClientId(c.to_vec()));
        }
        if let Some(dns) = self.cfg.dns {
            opts.insert(DhcpOption::DomainNameServers(vec![dns]));
        }
        if let Ok(name) = Name::from_ascii(&self.cfg.domain)
            && !self.cfg.domain.is_empty()
        {
            opts.insert(DhcpOption::DomainSearchList(vec![name]));
        }
        msg
    }

    /// The address for binding `key` of `mac`: its reservation, its binding's, the one it
    /// asks for, or one drawn from the pool by its hash (an ended binding's, oldest first,
    /// when none was ever given). `renewing`: a Renew or Rebind, which keeps what the client
    /// holds when it is still free for it (a lease file lost), and gets nothing new.
    fn choose(
        &mut self,
        now: u64,
        key: &Key,
        mac: [u8; 6],
        asked: Option<Ipv6Addr>,
        renewing: bool,
    ) -> Result<Ipv6Addr, ()> {
        if let Some(r) = self.cfg.reservations.iter().find(|r| r.mac == mac)
            && self.by_ip.get(&r.ip).is_none_or(|k| k == key)
        {
            return Ok(r.ip);
        }
        if let Some(l) = self.bindings.get(key)
            && self.free_for(l.ip, key, mac, now)
        {
            return Ok(l.ip);
        }
        let usable = |s: &Self, ip: Ipv6Addr| {
            s.in_pool(ip)
                && s.shared(ip)
                && s.free_for(ip, key, mac, now)
                && s.last_holder.get(&ip).is_none_or(|k| k == key)
        };
        if let Some(ip) = asked.filter(|ip| usable(self, *ip)) {
            return Ok(ip);
        }
        if renewing {
            return Err(());
        }
        for (lo, hi) in self.ranges().into_iter().flatten() {
            let span = hi - lo + 1;
            let start = hash_of(key) % span;
            let found = (0..span)
                .map(|i| Ipv6Addr::from_bits(lo + (start + i) % span))
                .find(|ip| usable(self, *ip));
            if let Some(ip) = found {
                return Ok(ip);
            }
        }
        let reclaim = self
            .bindings
            .values()
            .filter(|l| {
                !l.active
                    && self.in_pool(l.ip)
                    && self.shared(l.ip)
                    && self.free_for(l.ip, key, mac, now)
            })
            .min_by_key(|l| (l.expires, l.ip))
            .map(|l| l.ip);
        reclaim.ok_or_else(|| {
            self.stats.pool_exhausted += 1;
            self.events.push_back(Event6::PoolExhausted { mac });
        })
    }

    /// Whether `ip` may go to binding `key` of `mac`: not the gateway's or the /64's first,
    /// not reserved for another MAC, not held by another binding, not declined.
    fn free_for(&self, ip: Ipv6Addr, key: &Key, mac: [u8; 6], now: u64) -> bool {
        let base = self.cfg.prefix.network().to_bits();
        ip.to_bits() > base | 1
            && self.cfg.prefix.contains(&ip)
            && !self.reserved_for_other(ip, mac)
            && self.by_ip.get(&ip).is_none_or(|k| k == key)
            && self.declined.get(&ip).is_none_or(|t| *t <= now)
    }

    fn reserved_for_other(&self, ip: Ipv6Addr, mac: [u8; 6]) -> bool {
        self.cfg
            .reservations
            .iter()
            .any(|r| r.ip == ip && r.mac != mac)
    }

    fn in_pool(&self, ip: Ipv6Addr) -> bool {
        (self.cfg.pool.0..=self.cfg.pool.1).contains(&ip)
    }

    fn ranges(&self) -> [Option<(u128, u128)>; 2] {
        let (first, last) = (self.cfg.pool.0.to_bits(), self.cfg.pool.1.to_bits());
        self.share.ranges(first, last)
    }

    fn shared(&self, ip: Ipv6Addr) -> bool {
        let (first, last) = (self.cfg.pool.0.to_bits(), self.cfg.pool.1.to_bits());
        self.share.allows(first, last, ip.to_bits())
    }

    /// Where addresses new to a client come from (one of an HA pair).
    pub const fn set_share(&mut self, share: Share) {
        self.share = share;
    }

    /// Whether binding `key` of `mac` may be made at `now`: one it had, or a new one within
    /// the share of the pool for new clients in the window (counted when it is).
    fn admit(&mut self, now: u64, key: &Key, mac: [u8; 6]) -> bool {
        if self.bindings.contains_key(key) || self.cfg.reservations.iter().any(|r| r.mac == mac) {
            return true;
        }
        let pool = self.cfg.pool.1.to_bits() - self.cfg.pool.0.to_bits() + 1;
        let share = share_of(pool, self.cfg.new_lease_share);
        if !self
            .recent_new
            .admit(now, self.cfg.new_lease_window_secs, share)
        {
            self.stats.starvation_refused += 1;
            self.events.push_back(Event6::StarvationGuard { mac });
            return false;
        }
        true
    }

    fn bind(&mut self, now: u64, key: Key, mac: [u8; 6], ip: Ipv6Addr, name: Option<String>) {
        let hostname = name.or_else(|| self.bindings.get(&key).and_then(|l| l.hostname.clone()));
        self.install(Lease6 {
            duid: key.0,
            iaid: key.1,
            mac,
            ip,
            hostname,
            expires: now + u64::from(self.cfg.lease_secs),
            active: true,
        });
    }

    /// Puts `lease` in force: its binding's old address, if another, and the MAC's bindings
    /// beyond [`PER_MAC`] end; an ended binding that last held the address is forgotten.
    fn install(&mut self, lease: Lease6) {
        let (key, mac, ip) = ((lease.duid.clone(), lease.iaid), lease.mac, lease.ip);
        if let Some(old) = self.bindings.get(&key).filter(|l| l.ip != ip).map(|l| l.ip)
            && self.by_ip.get(&old) == Some(&key)
        {
            self.by_ip.remove(&old);
        }
        // The MAC's other active bindings beyond the cap end, oldest first.
        let mut mine: Vec<(u64, Key)> = self
            .bindings
            .iter()
            .filter(|(k, l)| l.active && l.mac == mac && **k != key)
            .map(|(k, l)| (l.expires, k.clone()))
            .collect();
        mine.sort();
        while mine.len() >= PER_MAC {
            let (_, k) = mine.remove(0);
            if let Some(l) = self.bindings.get_mut(&k) {
                l.active = false;
                self.by_ip.remove(&l.ip);
                self.events.push_back(Event6::Released(l.clone()));
                self.stats.per_mac_replaced += 1;
            }
        }
        if let Some(prev) = self
            .last_holder
            .insert(ip, key.clone())
            .filter(|k| *k != key)
            && self
                .bindings
                .get(&prev)
                .is_some_and(|l| !l.active && l.ip == ip)
        {
            self.bindings.remove(&prev);
        }
        self.by_ip.insert(ip, key.clone());
        self.bindings.insert(key, lease.clone());
        self.events.push_back(Event6::Granted(lease));
        self.dirty = true;
        self.trim();
    }

    /// Takes in the bindings another server made while the two were out of contact (the
    /// other box of an HA pair, after a split brain healed), as the DHCPv4 server's
    /// [`crate::Server::merge`] does: each active binding newer than ours for its client
    /// (DUID and IAID), of an address of the pool (or reserved for its MAC) that nobody else
    /// holds here, becomes ours (`Granted`) with its own lifetime. A binding of an address
    /// another client holds here, reserved for another MAC or declined, is left out: ours
    /// stands, and the other client is refused at its next renewal and gets a new address.
    /// Returns how many bindings came in, and how many were left out so.
    pub fn merge(&mut self, leases: Vec<Lease6>, now: u64) -> (usize, usize) {
        let (mut taken, mut clashed) = (0, 0);
        for mut lease in leases {
            if !lease.active || lease.expires <= now || !self.cfg.prefix.contains(&lease.ip) {
                continue;
            }
            let key = (lease.duid.clone(), lease.iaid);
            if self
                .bindings
                .get(&key)
                .is_some_and(|ours| ours.active && ours.expires >= lease.expires)
            {
                continue;
            }
            let reserved_here = self
                .cfg
                .reservations
                .iter()
                .any(|r| r.ip == lease.ip && r.mac == lease.mac);
            if !(self.in_pool(lease.ip) || reserved_here)
                || !self.free_for(lease.ip, &key, lease.mac, now)
            {
                clashed += 1;
                continue;
            }
            if lease.hostname.is_none() {
                lease.hostname = self.bindings.get(&key).and_then(|l| l.hostname.clone());
            }
            self.install(lease);
            taken += 1;
        }
        (taken, clashed)
    }

    /// Ends binding `key` of `ip` (a Release, or a Decline, which also keeps the address out
    /// of the pool for a while).
    fn end(&mut self, key: &Key, ip: Ipv6Addr, now: u64, decline: bool) {
        let Some(lease) = self
            .bindings
            .get_mut(key)
            .filter(|l| l.active && l.ip == ip)
        else {
            return;
        };
        lease.active = false;
        let (lease, mac) = (lease.clone(), lease.mac);
        self.by_ip.remove(&ip);
        self.dirty = true;
        if decline {
            self.declined.insert(ip, now + DECLINE_HOLD);
            self.events.push_back(Event6::Declined { ip, mac });
        } else {
            self.events.push_back(Event6::Released(lease));
        }
    }

    /// Forgets the oldest ended bindings beyond twice the pool.
    fn trim(&mut self) {
        let pool = self.cfg.pool.1.to_bits() - self.cfg.pool.0.to_bits() + 1;
        let cap = usize::try_from(pool * 2).unwrap_or(usize::MAX);
        if self.bindings.len() <= cap {
            return;
        }
        let mut ended: Vec<(u64, Key)> = self
            .bindings
            .iter()
            .filter(|(_, l)| !l.active)
            .map(|(k, l)| (l.expires, k.clone()))
            .collect();
        ended.sort();
        let excess = self.bindings.len() - cap;
        for (_, k) in ended.into_iter().take(excess) {
            if let Some(l) = self.bindings.remove(&k)
                && self.last_holder.get(&l.ip) == Some(&k)
            {
                self.last_holder.remove(&l.ip);
            }
        }
        self.dirty = true;
    }

    /// Ends bindings whose time ran out.
    pub fn handle_timeout(&mut self, now: u64) {
        self.expire(now);
    }

    /// The next moment something expires, unix seconds.
    pub fn poll_timeout(&self) -> Option<u64> {
        let leases = self
            .bindings
            .values()
            .filter(|l| l.active)
            .map(|l| l.expires);
        leases.chain(self.declined.values().copied()).min()
    }

    fn expire(&mut self, now: u64) {
        self.declined.retain(|_, t| *t > now);
        for lease in self
            .bindings
            .values_mut()
            .filter(|l| l.active && l.expires <= now)
        {
            lease.active = false;
            self.by_ip.remove(&lease.ip);
            self.events.push_back(Event6::Expired(lease.clone()));
            self.dirty = true;
        }
    }

    /// Replaces the reservations (a reload): a binding of an address now reserved for
    /// another MAC ends at once.
    pub fn set_reservations(&mut self, reservations: Vec<Reservation6>) {
        self.cfg.reservations = reservations;
        let displaced: Vec<Key> = self
            .by_ip
            .iter()
            .filter(|(ip, k)| {
                self.bindings
                    .get(*k)
                    .is_some_and(|l| self.reserved_for_other(**ip, l.mac))
            })
            .map(|(_, k)| k.clone())
            .collect();
        for k in displaced {
            if let Some(l) = self.bindings.get_mut(&k) {
                l.active = false;
                self.by_ip.remove(&l.ip);
                self.events.push_back(Event6::Released(l.clone()));
                self.dirty = true;
            }
        }
    }

    /// The next change.
    pub fn poll_event(&mut self) -> Option<Event6> {
        self.events.pop_front()
    }

    /// Whether the bindings changed since the last call.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// Every binding, sorted by address: what to persist.
    pub fn leases(&self) -> Vec<Lease6> {
        let mut v: Vec<Lease6> = self.bindings.values().cloned().collect();
        v.sort_by(|a, b| (a.ip, a.mac, &a.duid).cmp(&(b.ip, b.mac, &b.duid)));
        v
    }

    /// The active bindings.
    pub fn active(&self) -> impl Iterator<Item = &Lease6> {
        self.bindings.values().filter(|l| l.active)
    }

    /// Counters.
    pub const fn stats(&self) -> Stats6 {
        self.stats
    }
}

fn encode(msg: &Message, grants: Vec<Ipv6Addr>) -> Reply6 {
    Reply6 {
        payload: msg.to_vec().unwrap_or_default(),
        grants,
    }
}

fn status_code(status: Status) -> DhcpOption {
    DhcpOption::StatusCode(StatusCode {
        status,
        msg: String::new(),
    })
}

/// A stable hash of a binding: where its address is first looked for.
fn hash_of(key: &Key) -> u128 {
    // FNV-1a: stable across builds and runs, so an address drawn once is drawn again.
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    key.0.hash(&mut h);
    key.1.hash(&mut h);
    u128::from(h.finish())
}

struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The message's IA_NAs, at most [`MAX_IAS`].
fn ia_nas(req: &Message) -> Vec<IANA> {
    req.opts()
        .iter()
        .filter_map(|o| match o {
            DhcpOption::IANA(ia) => Some(ia.clone()),
            _ => None,
        })
        .take(MAX_IAS)
        .collect()
}

/// The addresses an IA_NA names.
fn ia_addrs(ia: &IANA) -> impl Iterator<Item = Ipv6Addr> + '_ {
    ia.opts
        .iter()
        .filter_map(|o| match o {
            DhcpOption::IAAddr(a) => Some(a.addr),
            _ => None,
        })
        .take(MAX_IAS)
}

/// The address an IA_NA asks for, if any.
fn hint(ia: &IANA) -> Option<Ipv6Addr> {
    ia_addrs(ia).next()
}

/// The first label of the Client FQDN option (RFC 4704: flags, then the name in DNS wire
/// form), if it holds a usable one.
fn fqdn_label(req: &Message) -> Option<String> {
    let data = req.opts().iter().find_map(|o| match o {
        DhcpOption::Unknown(u) if u.code() == OptionCode::ClientFqdn => Some(u.data()),
        _ => None,
    })?;
    let len = usize::from(*data.get(1)?);
    let label = data.get(2..2 + len)?;
    let s = std::str::from_utf8(label).ok()?;
    (!s.is_empty()).then(|| s.to_owned())
}

/// A copy of `msg` keeping only the options this server reads, each checked against its
/// length (RFC 8415 §21), so that the library decodes nothing on assumptions; None when it is
/// not a client message at all.
fn sanitize(msg: &[u8]) -> Option<Vec<u8>> {
    let head = msg.get(..4)?;
    let mut out = head.to_vec();
    walk(msg.get(4..)?, &mut out, |code, value| match code {
        // Client and Server Identifier: a DUID, 2 to 130 bytes.
        1 | 2 => (2..=130).contains(&value.len()).then(|| value.to_vec()),
        // IA_NA: IAID, T1, T2, then options (only IA Addresses kept, without their own).
        3 => {
            let fixed = value.get(..12)?;
            let mut ia = fixed.to_vec();
            walk(&value[12..], &mut ia, |c, v| {
                (c == 5).then(|| v.get(..24).map(<[u8]>::to_vec)).flatten()
            })?;
            Some(ia)
        }
        // Option Request: a list of codes.
        6 => (value.len() % 2 == 0).then(|| value.to_vec()),
        // Elapsed Time.
        8 => (value.len() == 2).then(|| value.to_vec()),
        // Client FQDN: flags and a name.
        39 => (!value.is_empty() && value.len() <= 256).then(|| value.to_vec()),
        _ => None,
    })?;
    Some(out)
}

/// Walks the options in `opts`, appending those `keep` returns a value for (at most 32 of
/// them); None when an option runs past the end.
fn walk(
    mut opts: &[u8],
    out: &mut Vec<u8>,
    keep: impl Fn(u16, &[u8]) -> Option<Vec<u8>>,
) -> Option<()> {
    let mut kept = 0;
    while !opts.is_empty() {
        let code = u16::from_be_bytes([*opts.first()?, *opts.get(1)?]);
        let len = usize::from(u16::from_be_bytes([*opts.get(2)?, *opts.get(3)?]));
        let value = opts.get(4..4 + len)?;
        if kept < 32
            && let Some(v) = keep(code, value)
        {
            out.extend_from_slice(&code.to_be_bytes());
            out.extend_from_slice(&u16::try_from(v.len()).ok()?.to_be_bytes());
            out.extend_from_slice(&v);
            kept += 1;
        }
        opts = &opts[4 + len..];
    }
    Some(())
}

/// Builds a client message, for tests, fuzz corpora and test beds: `kind` from client `duid`
/// with one IA_NA per `(iaid, address asked for)`, to `server` (its DUID) when given.
#[doc(hidden)]
pub fn client_message6(
    kind: MessageType,
    duid: &[u8],
    ias: &[(u32, Option<Ipv6Addr>)],
    server: Option<&[u8]>,
) -> Vec<u8> {
    let mut msg = Message::new_with_id(kind, [1, 2, 3]);
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::ClientId(duid.to_vec()));
    if let Some(s) = server {
        opts.insert(DhcpOption::ServerId(s.to_vec()));
    }
    for (id, ask) in ias {
        let mut ia = dhcproto::v6::DhcpOptions::new();
        if let Some(addr) = ask {
            ia.insert(DhcpOption::IAAddr(IAAddr {
                addr: *addr,
                preferred_life: 0,
                valid_life: 0,
                opts: dhcproto::v6::DhcpOptions::new(),
            }));
        }
        opts.insert(DhcpOption::IANA(IANA {
            id: *id,
            t1: 0,
            t2: 0,
            opts: ia,
        }));
    }
    msg.to_vec().unwrap_or_default()
}

/// What a reply says: its type, its server's DUID, and per IA_NA its ID, address (if any)
/// and status (if any). None when it does not decode.
#[doc(hidden)]
pub fn read_reply6(payload: &[u8]) -> Option<ReadReply6> {
    let m = Message::decode(&mut Decoder::new(payload)).ok()?;
    let server = match m.opts().get(OptionCode::ServerId) {
        Some(DhcpOption::ServerId(s)) => s.clone(),
        _ => Vec::new(),
    };
    let status_of = |opts: &dhcproto::v6::DhcpOptions| match opts.get(OptionCode::StatusCode) {
        Some(DhcpOption::StatusCode(s)) => Some(s.status),
        _ => None,
    };
    let ias = ia_nas(&m)
        .iter()
        .map(|ia| (ia.id, hint(ia), status_of(&ia.opts)))
        .collect();
    let dns = match m.opts().get(OptionCode::DomainNameServers) {
        Some(DhcpOption::DomainNameServers(d)) => d.clone(),
        _ => Vec::new(),
    };
    let domains = match m.opts().get(OptionCode::DomainSearchList) {
        Some(DhcpOption::DomainSearchList(d)) => d.iter().map(ToString::to_string).collect(),
        _ => Vec::new(),
    };
    Some(ReadReply6 {
        kind: m.msg_type(),
        server,
        ias,
        status: status_of(m.opts()),
        dns,
        domains,
    })
}

/// A reply as [`read_reply6`] reads it.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadReply6 {
    /// Its type.
    pub kind: MessageType,
    /// The server's DUID.
    pub server: Vec<u8>,
    /// Per IA_NA: ID, address, status.
    pub ias: Vec<(u32, Option<Ipv6Addr>, Option<Status>)>,
    /// The top-level status, if any.
    pub status: Option<Status>,
    /// The DNS servers named.
    pub dns: Vec<Ipv6Addr>,
    /// The search list.
    pub domains: Vec<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 7];
    const GW: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const DUID: &[u8] = &[0, 3, 0, 1, 2, 0, 0, 0, 0, 7];
    const NOW: u64 = 1_000_000;

    fn prefix() -> Ipv6Net {
        "fd7a:0:1:100::/64".parse().unwrap()
    }

    fn config() -> Dhcp6Config {
        Dhcp6Config {
            prefix: prefix(),
            pool: Dhcp6Config::default_pool(prefix()),
            lease_secs: 3600,
            server_mac: GW,
            dns: Some("fd7a:0:1:100::1".parse().unwrap()),
            domain: "site-a.example.".into(),
            reservations: Vec::new(),
            new_lease_share: 0.25,
            new_lease_window_secs: 60,
        }
    }

    fn server_duid() -> Vec<u8> {
        let mut d = vec![0, 3, 0, 1];
        d.extend_from_slice(&GW);
        d
    }

    fn ask(s: &mut Server6, kind: MessageType, duid: &[u8], mac: [u8; 6]) -> ReadReply6 {
        let sid = server_duid();
        let to = matches!(
            kind,
            MessageType::Request | MessageType::Renew | MessageType::Release
        )
        .then_some(sid.as_slice());
        let msg = client_message6(kind, duid, &[(1, None)], to);
        read_reply6(&s.handle(NOW, &msg, mac).unwrap().payload).unwrap()
    }

    #[test]
    fn solicit_is_advertised_and_request_binds_the_same_address() {
        let mut s = Server6::new(config(), Vec::new(), NOW).unwrap();
        let adv = ask(&mut s, MessageType::Solicit, DUID, MAC);
        assert_eq!(adv.kind, MessageType::Advertise);
        assert_eq!(adv.server, server_duid());
        assert_eq!(
            adv.dns,
            vec!["fd7a:0:1:100::1".parse::<Ipv6Addr>().unwrap()]
        );
        assert_eq!(adv.domains, vec!["site-a.example.".to_owned()]);
        let offered = adv.ias[0].1.unwrap();
        assert!(s.in_pool(offered), "{offered}");
        assert_eq!(s.leases(), Vec::new(), "an Advertise holds nothing");

        let msg = client_message6(
            MessageType::Request,
            DUID,
            &[(1, None)],
            Some(&server_duid()),
        );
        let reply = s.handle(NOW, &msg, MAC).unwrap();
        assert_eq!(reply.grants, vec![offered]);
        let read = read_reply6(&reply.payload).unwrap();
        assert_eq!(
            (read.kind, read.ias[0].1),
            (MessageType::Reply, Some(offered))
        );
        let lease = s.active().next().unwrap();
        assert_eq!((lease.mac, lease.ip, lease.iaid), (MAC, offered, 1));
        assert!(matches!(s.poll_event(), Some(Event6::Granted(_))));
        assert!(s.take_dirty());
    }

    #[test]
    fn the_same_client_draws_the_same_address_from_a_fresh_server() {
        let mut a = Server6::new(config(), Vec::new(), NOW).unwrap();
        let mut b = Server6::new(config(), Vec::new(), NOW).unwrap();
        let first = ask(&mut a, MessageType::Request, DUID, MAC).ias[0].1;
        let again = ask(&mut b, MessageType::Request, DUID, MAC).ias[0].1;
        assert_eq!(first, again);
        let other = ask(
            &mut a,
            MessageType::Request,
            &[0, 4, 9, 9],
            [2, 0, 0, 0, 0, 8],
        );
        assert_ne!(other.ias[0].1, first);
    }

    fn lease6(n: u8, ip: &str, expires: u64) -> Lease6 {
        Lease6 {
            duid: vec![0, 4, n],
            iaid: 1,
            mac: [2, 0, 0, 0, 1, n],
            ip: ip.parse().unwrap(),
            hostname: Some(format!("dev{n}")),
            expires,
            active: true,
        }
    }

    /// After a split brain, the other box's bindings come in where they take nobody's
    /// address: a client of its own, a newer binding of a client both served; not a binding
    /// of an address another client holds here, an ended or an older one, nor one outside
    /// the pool.
    #[test]
    fn the_other_boxs_bindings_merge_where_they_take_no_ones_address() {
        let ours = vec![
            lease6(1, "fd7a:0:1:100::1001", NOW + 100),
            lease6(2, "fd7a:0:1:100::1002", NOW + 100),
            lease6(3, "fd7a:0:1:100::1003", NOW + 500),
        ];
        let mut s = Server6::new(config(), ours, NOW).unwrap();
        while s.poll_event().is_some() {}
        let mut ended = lease6(7, "fd7a:0:1:100::1007", NOW + 900);
        ended.active = false;
        let theirs = vec![
            // Its own client: taken, with its lifetime and name.
            lease6(5, "fd7a:0:1:100::1005", NOW + 300),
            // Client 2 renewed there on another address, later: the newer one stands.
            lease6(2, "fd7a:0:1:100::1802", NOW + 300),
            // Client 3's binding there is older than ours: ours stands.
            lease6(3, "fd7a:0:1:100::1903", NOW + 200),
            // Client 6 on client 1's address: ours stands.
            lease6(6, "fd7a:0:1:100::1001", NOW + 300),
            // Ended, run out, outside the pool: nothing.
            ended,
            lease6(8, "fd7a:0:1:100::1008", NOW),
            lease6(9, "fd7a:0:1:100::9", NOW + 300),
        ];
        assert_eq!(s.merge(theirs, NOW), (2, 2));
        let held: Vec<(u8, String, u64)> = s
            .leases()
            .iter()
            .filter(|l| l.active)
            .map(|l| (l.duid[2], l.ip.to_string(), l.expires))
            .collect();
        assert_eq!(
            held,
            [
                (1, "fd7a:0:1:100::1001".into(), NOW + 100),
                (3, "fd7a:0:1:100::1003".into(), NOW + 500),
                (5, "fd7a:0:1:100::1005".into(), NOW + 300),
                (2, "fd7a:0:1:100::1802".into(), NOW + 300),
            ]
        );
        let granted: Vec<u8> = std::iter::from_fn(|| s.poll_event())
            .filter_map(|e| match e {
                Event6::Granted(l) => Some(l.duid[2]),
                _ => None,
            })
            .collect();
        assert_eq!(granted, [5, 2]);
        assert!(s.take_dirty());
        // Client 2 renews here and keeps what it got there.
        let back = ask(&mut s, MessageType::Renew, &[0, 4, 2], [2, 0, 0, 0, 1, 2]);
        assert_eq!(back.ias[0].1, Some("fd7a:0:1:100::1802".parse().unwrap()));
        // The same bindings again change nothing.
        assert_eq!(
            s.merge(vec![lease6(5, "fd7a:0:1:100::1005", NOW + 300)], NOW),
            (0, 0)
        );
    }

    #[test]
    fn bindings_come_back_from_the_file_and_renew() {
        let mut s = Server6::new(config(), Vec::new(), NOW).unwrap();
        let ip = ask(&mut s, MessageType::Request, DUID, MAC).ias[0]
            .1
            .unwrap();
        let file = crate::file::encode(
            &crate::file::Table {
                leases6: s.leases(),
                ..crate::file::Table::default()
            },
            NOW + 10,
        )
        .unwrap();
        let table = crate::file::decode(&file).unwrap();
        let mut back = Server6::new(config(), table.leases6, NOW + 5).unwrap();
        assert_eq!(back.active().next().map(|l| l.ip), Some(ip));
        let renewed = ask(&mut back, MessageType::Renew, DUID, MAC);
        assert_eq!(renewed.ias[0].1, Some(ip));
        // Another client renewing an address it was never given gets no binding.
        let msg = client_message6(
            MessageType::Renew,
            &[0, 4, 1, 1],
            &[(1, Some(ip))],
            Some(&server_duid()),
        );
        let read = read_reply6(&back.handle(NOW, &msg, [2, 0, 0, 0, 0, 9]).unwrap().payload);
        assert_eq!(read.unwrap().ias[0], (1, None, Some(Status::NoBinding)));
    }

    #[test]
    fn messages_for_other_servers_or_without_a_client_are_ignored() {
        let mut s = Server6::new(config(), Vec::new(), NOW).unwrap();
        let other = client_message6(MessageType::Request, DUID, &[(1, None)], Some(&[0, 3, 9]));
        assert_eq!(s.handle(NOW, &other, MAC), Err(Ignore6::OtherServer));
        let solicit_to = client_message6(MessageType::Solicit, DUID, &[(1, None)], Some(&[0, 3]));
        assert_eq!(s.handle(NOW, &solicit_to, MAC), Err(Ignore6::OtherServer));
        let mut anon = Message::new(MessageType::Solicit);
        anon.opts_mut().insert(DhcpOption::IANA(IANA {
            id: 1,
            t1: 0,
            t2: 0,
            opts: dhcproto::v6::DhcpOptions::new(),
        }));
        assert_eq!(
            s.handle(NOW, &anon.to_vec().unwrap(), MAC),
            Err(Ignore6::NoClientId)
        );
        let advert = Message::new(MessageType::Advertise).to_vec().unwrap();
        assert_eq!(s.handle(NOW, &advert, MAC), Err(Ignore6::Unexpected));
        assert_eq!(s.handle(NOW, &[1, 2], MAC), Err(Ignore6::Malformed));
        assert_eq!(s.stats().ignored, 5);
        assert_eq!(s.leases(), Vec::new());
    }

    #[test]
    fn a_flood_of_new_duids_takes_its_share_and_no_ones_address() {
        let mut s = Server6::new(config(), Vec::new(), NOW).unwrap();
        let ip = ask(&mut s, MessageType::Request, DUID, MAC).ias[0]
            .1
            .unwrap();
        let mut bound = 0;
        for n in 0..5000u32 {
            let duid = [&[0u8, 4][..], &n.to_be_bytes()].concat();
            let b = n.to_be_bytes();
            let mac = [2, 1, 0, b[1], b[2], b[3]];
            let msg = client_message6(
                MessageType::Request,
                &duid,
                &[(1, None)],
                Some(&server_duid()),
            );
            let r = read_reply6(&s.handle(NOW + 1, &msg, mac).unwrap().payload).unwrap();
            bound += usize::from(r.ias[0].1.is_some());
        }
        // A quarter of the 4096-address pool (the genuine client came first, in the window).
        assert_eq!(bound, 1023);
        assert_eq!(s.stats().starvation_refused, 5000 - 1023);
        let renewed = ask(&mut s, MessageType::Renew, DUID, MAC);
        assert_eq!(
            renewed.ias[0].1,
            Some(ip),
            "the genuine client keeps its address"
        );
        assert!(s.bindings.len() <= 2 * 4096);
    }

    #[test]
    fn one_mac_holds_at_most_its_share_of_bindings() {
        let mut s = Server6::new(config(), Vec::new(), NOW).unwrap();
        for n in 0..10u8 {
            ask(&mut s, MessageType::Request, &[0, 4, n, n], MAC);
        }
        assert_eq!(s.active().count(), PER_MAC);
        assert_eq!(s.stats().per_mac_replaced, 10 - PER_MAC as u64);
    }

    #[test]
    fn release_frees_and_decline_quarantines() {
        let mut s = Server6::new(config(), Vec::new(), NOW).unwrap();
        let ip = ask(&mut s, MessageType::Request, DUID, MAC).ias[0]
            .1
            .unwrap();
        let sid = server_duid();
        let rel = client_message6(MessageType::Release, DUID, &[(1, Some(ip))], Some(&sid));
        s.handle(NOW, &rel, MAC).unwrap();
        assert_eq!(s.active().count(), 0);
        let again = ask(&mut s, MessageType::Request, DUID, MAC).ias[0].1;
        assert_eq!(again, Some(ip), "its own address back");
        let dec = client_message6(MessageType::Decline, DUID, &[(1, Some(ip))], Some(&sid));
        s.handle(NOW, &dec, MAC).unwrap();
        let moved = ask(&mut s, MessageType::Request, DUID, MAC).ias[0]
            .1
            .unwrap();
        assert_ne!(moved, ip, "a declined address stays out");
    }

    #[test]
    fn confirm_says_whether_the_addresses_are_on_link() {
        let mut s = Server6::new(config(), Vec::new(), NOW).unwrap();
        let on = client_message6(
            MessageType::Confirm,
            DUID,
            &[(1, Some("fd7a:0:1:100::1234".parse().unwrap()))],
            None,
        );
        let off = client_message6(
            MessageType::Confirm,
            DUID,
            &[(1, Some("fd00:9::1".parse().unwrap()))],
            None,
        );
        let status = |s: &mut Server6, m: &[u8]| {
            read_reply6(&s.handle(NOW, m, MAC).unwrap().payload)
                .unwrap()
                .status
        };
        assert_eq!(status(&mut s, &on), Some(Status::Success));
        assert_eq!(status(&mut s, &off), Some(Status::NotOnLink));
    }

    #[test]
    fn a_reservation_gives_its_mac_its_address() {
        let mut cfg = config();
        let fixed: Ipv6Addr = "fd7a:0:1:100::50".parse().unwrap();
        cfg.reservations = vec![Reservation6 {
            mac: MAC,
            ip: fixed,
        }];
        let mut s = Server6::new(cfg, Vec::new(), NOW).unwrap();
        assert_eq!(
            ask(&mut s, MessageType::Request, DUID, MAC).ias[0].1,
            Some(fixed)
        );
        let msg = client_message6(
            MessageType::Request,
            &[0, 4, 7, 7],
            &[(1, Some(fixed))],
            Some(&server_duid()),
        );
        let r = read_reply6(&s.handle(NOW, &msg, [2, 0, 0, 0, 0, 9]).unwrap().payload).unwrap();
        assert_ne!(r.ias[0].1, Some(fixed), "not to another MAC");
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_answered_or_refused_without_a_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        ) {
            let mut s = Server6::new(config(), Vec::new(), NOW).unwrap();
            let _ = s.handle(NOW, &bytes, MAC);
        }
    }
}

//! The DHCPv4 server state machine (RFC 2131 §4.3), sans-IO.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable as _, Encodable as _};
use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::share::{Newcomers, Share, share_of};

/// A configuration the server cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The pool reaches outside the adapter's certified block.
    #[error("the DHCP pool {first}-{last} is not inside this adapter's certified block {block}")]
    PoolOutsideBlock {
        /// First pool address.
        first: Ipv4Addr,
        /// Last pool address.
        last: Ipv4Addr,
        /// The certified block.
        block: Ipv4Net,
    },
    /// The pool's first address comes after its last.
    #[error("the DHCP pool {first}-{last} is empty (first after last)")]
    EmptyPool {
        /// First pool address.
        first: Ipv4Addr,
        /// Last pool address.
        last: Ipv4Addr,
    },
    /// The lease time is too short to be useful or longer than DHCP can say.
    #[error("lease time {0} s is outside 60..=31536000 (one minute to one year)")]
    LeaseTime(u32),
    /// The starvation share is not a fraction.
    #[error("new_lease_share {0} is outside (0, 1]")]
    Share(String),
}

/// A device with a fixed address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Its MAC.
    pub mac: [u8; 6],
    /// Its address (inside the block; may lie inside the pool).
    pub ip: Ipv4Addr,
    /// Its name, overriding what the device calls itself.
    pub hostname: Option<String>,
}

/// How the server hands out addresses.
#[derive(Debug, Clone, PartialEq)]
pub struct DhcpConfig {
    /// The server's own address: the gateway vIP (router, DNS server, server identifier).
    pub server: Ipv4Addr,
    /// The adapter's certified block: the devices' subnet.
    pub block: Ipv4Net,
    /// First and last address of the dynamic pool (inclusive).
    pub pool: (Ipv4Addr, Ipv4Addr),
    /// Lease time, seconds.
    pub lease_secs: u32,
    /// Interface MTU for the devices (option 26): the tunnel's inner MTU.
    pub mtu: u16,
    /// Domain name for the devices (option 15): the adapter's FQDN, so a bare name resolves
    /// to a device on the same LAN.
    pub domain: String,
    /// Fixed addresses.
    pub reservations: Vec<Reservation>,
    /// At most this share of the pool may be bound to devices never seen before within one
    /// window (a flood of requests from random MACs cannot empty the pool), and at most this
    /// share is offered to such devices at once (an offer beyond it takes the place of the
    /// oldest one: a flood of DISCOVERs holds no more of the pool, and never locks a genuine
    /// newcomer out).
    pub new_lease_share: f64,
    /// The window of that limit, seconds.
    pub new_lease_window_secs: u64,
}

impl DhcpConfig {
    /// The whole block but the network, broadcast and server addresses: the default pool.
    pub fn default_pool(block: Ipv4Net) -> (Ipv4Addr, Ipv4Addr) {
        let first = u32::from(block.network()).saturating_add(1);
        let last = u32::from(block.broadcast()).saturating_sub(1);
        (first.into(), last.max(first).into())
    }
}

/// One binding of an address to a device. Kept after it ends (`active == false`) so that a
/// returning device gets its old address back when it is still free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The device's MAC.
    pub mac: [u8; 6],
    /// Its address.
    pub ip: Ipv4Addr,
    /// What it calls itself (option 12), or its reservation's name.
    pub hostname: Option<String>,
    /// Its client identifier (option 61), if it sent one.
    pub client_id: Option<Vec<u8>>,
    /// End of the lease, unix seconds.
    pub expires: u64,
    /// Whether the lease is in force.
    pub active: bool,
}

/// What changed, for the anti-spoofing table, DNS and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseEvent {
    /// A device got (or renewed, possibly with a new hostname) an address.
    Granted(Lease),
    /// A device gave its address back.
    Released(Lease),
    /// A lease ran out.
    Expired(Lease),
    /// A device reported its offered address in use by someone else; quarantined.
    Declined {
        /// The address.
        ip: Ipv4Addr,
        /// The reporting device.
        mac: [u8; 6],
    },
    /// A new device was refused an address because the pool is full.
    PoolExhausted {
        /// The device.
        mac: [u8; 6],
    },
    /// A new device was refused an address by the starvation guard.
    StarvationGuard {
        /// The device.
        mac: [u8; 6],
    },
}

/// Why a message gets no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Ignore {
    /// Not a DHCP message (truncated, garbage).
    Malformed,
    /// A BOOTREPLY, a non-Ethernet client, or no message type.
    NotARequest,
    /// Relayed (giaddr set): the adapter serves its own segment only.
    Relayed,
    /// `chaddr` is not the Ethernet source: a device asking for another's address.
    ChaddrMismatch,
    /// A REQUEST for another server's offer (or, apart from the other box of an HA pair,
    /// for an address of its half: [`Share::Only`]).
    OtherServer,
    /// INIT-REBOOT or RENEWING by a device we have no record of (RFC 2131 §4.3.2: silent).
    NoRecord,
    /// No address for a new device (pool exhausted or starvation guard).
    NoAddress,
    /// A message type a server does not answer (OFFER, ACK, ... from a device).
    Unexpected,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// DISCOVERs.
    pub discovers: u64,
    /// REQUESTs.
    pub requests: u64,
    /// OFFERs sent.
    pub offers: u64,
    /// ACKs sent.
    pub acks: u64,
    /// NAKs sent.
    pub naks: u64,
    /// RELEASEs.
    pub releases: u64,
    /// DECLINEs.
    pub declines: u64,
    /// INFORMs answered.
    pub informs: u64,
    /// Messages ignored (any reason).
    pub ignored: u64,
    /// New devices refused a binding by the starvation guard (the pool's share for them
    /// was taken within the window).
    pub starvation_refused: u64,
    /// New devices refused because the pool was full.
    pub pool_exhausted: u64,
    /// Offers to new devices taken back to make room for newer ones (more newcomers at once
    /// than the share: a flood of DISCOVERs).
    pub offers_displaced: u64,
}

impl Stats {
    /// Every counter with its name, in declaration order (for metrics).
    pub const fn named(&self) -> [(&'static str, u64); 12] {
        [
            ("discovers", self.discovers),
            ("requests", self.requests),
            ("offers", self.offers),
            ("acks", self.acks),
            ("naks", self.naks),
            ("releases", self.releases),
            ("declines", self.declines),
            ("informs", self.informs),
            ("ignored", self.ignored),
            ("starvation_refused", self.starvation_refused),
            ("pool_exhausted", self.pool_exhausted),
            ("offers_displaced", self.offers_displaced),
        ]
    }
}

/// A reply and where it goes on the LAN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The encoded DHCP message (the UDP payload, from port 67 to port 68).
    pub payload: Vec<u8>,
    /// Destination IP (the client's address, or 255.255.255.255).
    pub dst_ip: Ipv4Addr,
    /// Destination MAC (the client's, or broadcast).
    pub dst_mac: [u8; 6],
    /// The address an ACK grants (or renews): it must not leave before the lease is stored.
    pub grants: Option<Ipv4Addr>,
}

/// How long an offer holds its address for the device it was made to, seconds.
const OFFER_HOLD: u64 = 60;
/// How long a declined address stays out of the pool, seconds.
const DECLINE_HOLD: u64 = 600;
const BROADCAST_MAC: [u8; 6] = [0xff; 6];

/// Whether `ip` lies in the inclusive range `r` (none: nowhere).
fn within(r: Option<(u32, u32)>, ip: Ipv4Addr) -> bool {
    r.is_some_and(|(lo, hi)| (lo..=hi).contains(&u32::from(ip)))
}

/// The DHCP server. See the crate docs.
#[derive(Debug, Clone)]
pub struct Server {
    cfg: DhcpConfig,
    by_mac: HashMap<[u8; 6], Lease>,
    by_ip: HashMap<Ipv4Addr, [u8; 6]>,
    /// The device each address was last bound to (active or ended).
    last_holder: HashMap<Ipv4Addr, [u8; 6]>,
    offers: HashMap<[u8; 6], (Ipv4Addr, u64)>,
    /// The same offers by address (device, until when): whether an address is offered to
    /// someone else is one lookup, whatever the number of offers out.
    offered: HashMap<Ipv4Addr, ([u8; 6], u64)>,
    declined: HashMap<Ipv4Addr, u64>,
    reserved_ips: HashMap<Ipv4Addr, [u8; 6]>,
    /// Pool addresses never bound to any device and not offered now: the first choice for
    /// newcomers (its first element is free, so choosing one is flat in the number of offers
    /// out).
    unused: BTreeSet<u32>,
    /// Addresses the pool can hand out dynamically.
    pool_size: usize,
    /// When devices never seen before were bound, within the guard's window.
    recent_new: Newcomers,
    /// The offers out to devices never seen before, oldest first (entries of offers gone
    /// since are skipped).
    new_offers: VecDeque<([u8; 6], Ipv4Addr)>,
    /// Where the next newcomer's address is looked for among the never-used ones: after the
    /// last one offered, so that an address whose offer was taken back is not at once
    /// offered to someone else while its device may still be asking for it.
    cursor: u32,
    /// Where new addresses come from.
    share: Share,
    events: VecDeque<LeaseEvent>,
    dirty: bool,
    /// The second leases and offers were last expired at: at most one sweep a second, however
    /// many messages come (times are whole seconds).
    swept: Option<u64>,
    stats: Stats,
}

impl Server {
    /// A server with `cfg`, resuming the `saved` bindings at unix time `now`.
    ///
    /// # Errors
    /// [`ConfigError`] when the pool lies outside the certified block or the numbers make no
    /// sense.
    pub fn new(cfg: DhcpConfig, saved: Vec<Lease>, now: u64) -> Result<Self, ConfigError> {
        let (first, last) = cfg.pool;
        if u32::from(first) > u32::from(last) {
            return Err(ConfigError::EmptyPool { first, last });
        }
        if !cfg.block.contains(&first) || !cfg.block.contains(&last) {
            return Err(ConfigError::PoolOutsideBlock {
                first,
                last,
                block: cfg.block,
            });
        }
        if !(60..=31_536_000).contains(&cfg.lease_secs) {
            return Err(ConfigError::LeaseTime(cfg.lease_secs));
        }
        if !(cfg.new_lease_share > 0.0 && cfg.new_lease_share <= 1.0) {
            return Err(ConfigError::Share(cfg.new_lease_share.to_string()));
        }
        let reserved_ips: HashMap<Ipv4Addr, [u8; 6]> =
            cfg.reservations.iter().map(|r| (r.ip, r.mac)).collect();
        let special = [cfg.server, cfg.block.network(), cfg.block.broadcast()];
        let unused: BTreeSet<u32> = (u32::from(first)..=u32::from(last))
            .filter(|n| {
                !special.contains(&Ipv4Addr::from(*n))
                    && !reserved_ips.contains_key(&Ipv4Addr::from(*n))
            })
            .collect();
        let pool_size = unused.len();
        let mut server = Self {
            cfg,
            by_mac: HashMap::new(),
            by_ip: HashMap::new(),
            last_holder: HashMap::new(),
            offers: HashMap::new(),
            offered: HashMap::new(),
            declined: HashMap::new(),
            reserved_ips,
            unused,
            pool_size,
            recent_new: Newcomers::default(),
            new_offers: VecDeque::new(),
            cursor: u32::from(first),
            share: Share::Whole,
            events: VecDeque::new(),
            dirty: false,
            swept: None,
            stats: Stats::default(),
        };
        // Newest first: when a damaged or edited file names a device twice, or gives one
        // address to two devices, the binding that lasts longest wins and the others end.
        let mut saved = saved;
        saved.sort_by_key(|l| (std::cmp::Reverse(l.expires), u32::from(l.ip), l.mac));
        for mut lease in saved {
            // A saved binding that no longer fits (block changed, reservation moved) is dropped,
            // and so is an older one of a device already loaded.
            if !server.cfg.block.contains(&lease.ip)
                || server
                    .reserved_ips
                    .get(&lease.ip)
                    .is_some_and(|m| *m != lease.mac)
                || server.by_mac.contains_key(&lease.mac)
            {
                server.dirty = true;
                continue;
            }
            if lease.active && (lease.expires <= now || server.by_ip.contains_key(&lease.ip)) {
                lease.active = false;
                server.dirty = true;
            }
            server.last_holder.entry(lease.ip).or_insert(lease.mac);
            server.unused.remove(&u32::from(lease.ip));
            if lease.active {
                server.by_ip.insert(lease.ip, lease.mac);
                server.events.push_back(LeaseEvent::Granted(lease.clone()));
            }
            server.by_mac.insert(lease.mac, lease);
        }
        Ok(server)
    }

    /// Handles one DHCP message from Ethernet source `src_mac` at unix time `now`. Returns the
    /// reply, or None for messages that take none (RELEASE, DECLINE).
    ///
    /// # Errors
    /// [`Ignore`] saying why no reply goes out (a DHCP server is often silent on purpose).
    pub fn handle(
        &mut self,
        now: u64,
        msg: &[u8],
        src_mac: [u8; 6],
    ) -> Result<Option<Reply>, Ignore> {
        let result = self.handle_inner(now, msg, src_mac);
        if result.is_err() {
            self.stats.ignored += 1;
        }
        result
    }

    fn handle_inner(
        &mut self,
        now: u64,
        msg: &[u8],
        src_mac: [u8; 6],
    ) -> Result<Option<Reply>, Ignore> {
        let clean = sanitize(msg).ok_or(Ignore::Malformed)?;
        let req = Message::from_bytes(&clean).map_err(|_| Ignore::Malformed)?;
        if req.opcode() != Opcode::BootRequest || req.htype() != HType::Eth || req.hlen() != 6 {
            return Err(Ignore::NotARequest);
        }
        if req.giaddr() != Ipv4Addr::UNSPECIFIED {
            return Err(Ignore::Relayed);
        }
        let mac: [u8; 6] = req
            .chaddr()
            .get(..6)
            .and_then(|c| c.try_into().ok())
            .ok_or(Ignore::NotARequest)?;
        if mac != src_mac {
            return Err(Ignore::ChaddrMismatch);
        }
        let kind = req.opts().msg_type().ok_or(Ignore::NotARequest)?;
        self.expire(now);
        match kind {
            MessageType::Discover => {
                self.stats.discovers += 1;
                self.discover(now, &req, mac).map(Some)
            }
            MessageType::Request => {
                self.stats.requests += 1;
                self.request(now, &req, mac).map(Some)
            }
            MessageType::Release => {
                self.stats.releases += 1;
                self.release(&req, mac);
                Ok(None)
            }
            MessageType::Decline => {
                self.stats.declines += 1;
                self.decline(now, &req, mac);
                Ok(None)
            }
            MessageType::Inform => {
                self.stats.informs += 1;
                let ci = req.ciaddr();
                if !self.cfg.block.contains(&ci) {
                    return Err(Ignore::NoRecord);
                }
                // RFC 2131 §4.3.5: an ACK with configuration but no address and no lease time.
                Ok(Some(self.reply(
                    &req,
                    MessageType::Ack,
                    Ipv4Addr::UNSPECIFIED,
                    false,
                )))
            }
            _ => Err(Ignore::Unexpected),
        }
    }

    fn discover(&mut self, now: u64, req: &Message, mac: [u8; 6]) -> Result<Reply, Ignore> {
        let requested = match req.opts().get(OptionCode::RequestedIpAddress) {
            Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
            _ => None,
        };
        let newcomer = self.is_newcomer(mac);
        let had_offer = self.offers.contains_key(&mac);
        let ip = self.choose(now, mac, requested)?;
        self.offer(mac, ip, now + OFFER_HOLD);
        if newcomer && !had_offer {
            self.note_new_offer(mac, ip);
        }
        self.stats.offers += 1;
        Ok(self.reply(req, MessageType::Offer, ip, true))
    }

    /// Whether `mac` is a device never seen before: no binding (active or ended) and no
    /// reservation. Only such devices are subject to the starvation guard.
    fn is_newcomer(&self, mac: [u8; 6]) -> bool {
        !self.by_mac.contains_key(&mac) && !self.cfg.reservations.iter().any(|r| r.mac == mac)
    }

    /// The share of the pool newcomers may take within a window, and be offered at once.
    fn newcomer_share(&self) -> usize {
        share_of(self.pool_size as u128, self.cfg.new_lease_share)
    }

    /// A newcomer was offered `ip`. Beyond the share, the oldest newcomer offer still out is
    /// taken back (its address is not offered again before the never-used ones came round:
    /// see `cursor`), so that a flood of DISCOVERs holds at most the share of the pool.
    fn note_new_offer(&mut self, mac: [u8; 6], ip: Ipv4Addr) {
        self.new_offers.push_back((mac, ip));
        let share = self.newcomer_share();
        while self.new_offers.len() > share {
            let Some((old, old_ip)) = self.new_offers.pop_front() else {
                break;
            };
            if self.offers.get(&old).is_some_and(|(o, _)| *o == old_ip) && old != mac {
                self.withdraw(old);
                self.stats.offers_displaced += 1;
            }
        }
        // Entries of offers that ended otherwise (taken up, expired): keep the list near the
        // share's size.
        if self.new_offers.len() > 2 * share + 64 {
            let offers = &self.offers;
            self.new_offers
                .retain(|(m, ip)| offers.get(m).is_some_and(|(o, _)| o == ip));
        }
    }

    /// Whether the starvation guard lets a newcomer be bound at `now`: at most the share of
    /// the pool within the window. Counts the binding when it does.
    fn admit_newcomer(&mut self, now: u64, mac: [u8; 6]) -> bool {
        let share = self.newcomer_share();
        if !self
            .recent_new
            .admit(now, self.cfg.new_lease_window_secs, share)
        {
            self.stats.starvation_refused += 1;
            self.events.push_back(LeaseEvent::StarvationGuard { mac });
            return false;
        }
        true
    }

    /// Picks an address for `mac`: its reservation; its current or previous binding if
    /// free; the address it asks for if free; a never-used one (after the last one offered);
    /// the oldest ended binding of another device.
    fn choose(
        &mut self,
        now: u64,
        mac: [u8; 6],
        requested: Option<Ipv4Addr>,
    ) -> Result<Ipv4Addr, Ignore> {
        if let Some(r) = self.cfg.reservations.iter().find(|r| r.mac == mac) {
            return Ok(r.ip);
        }
        if let Some((ip, _)) = self.offers.get(&mac) {
            return Ok(*ip);
        }
        if let Some(l) = self.by_mac.get(&mac)
            && self.free_for(l.ip, mac, now)
        {
            return Ok(l.ip);
        }
        let pick = requested
            .filter(|ip| {
                self.in_pool(*ip)
                    && self.shared(*ip)
                    && self.free_for(*ip, mac, now)
                    && self.last_holder.get(ip).is_none_or(|m| *m == mac)
            })
            .or_else(|| {
                let found = self
                    .ranges()
                    .into_iter()
                    .flatten()
                    .find_map(|(lo, hi)| self.unused_in(lo, hi, mac, now));
                if let Some(ip) = found {
                    self.cursor = u32::from(ip).wrapping_add(1);
                }
                found
            })
            .or_else(|| {
                // Reclaim the binding that ended longest ago (of our own half first).
                let own = self.ranges()[0];
                self.by_mac
                    .values()
                    .filter(|l| {
                        !l.active
                            && l.mac != mac
                            && self.in_pool(l.ip)
                            && self.shared(l.ip)
                            && self.free_for(l.ip, mac, now)
                    })
                    .min_by_key(|l| (!within(own, l.ip), l.expires, l.ip))
                    .map(|l| l.ip)
            });
        let Some(ip) = pick else {
            self.stats.pool_exhausted += 1;
            self.events.push_back(LeaseEvent::PoolExhausted { mac });
            return Err(Ignore::NoAddress);
        };
        Ok(ip)
    }

    fn request(&mut self, now: u64, req: &Message, mac: [u8; 6]) -> Result<Reply, Ignore> {
        let server_id = match req.opts().get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
            _ => None,
        };
        let requested = match req.opts().get(OptionCode::RequestedIpAddress) {
            Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
            _ => None,
        };
        let ciaddr = req.ciaddr();
        let wanted = match (server_id, requested) {
            // SELECTING: the device picked an offer.
            (Some(sid), _) => {
                if sid != self.cfg.server {
                    self.withdraw(mac);
                    return Err(Ignore::OtherServer);
                }
                let Some(ip) = requested else {
                    return Ok(self.nak(req));
                };
                // Its offer, or one that was taken back to make room while it answered
                // (the address free, never anyone else's): a flood of DISCOVERs from
                // others cannot make a genuine device's answer come too late.
                let taken_back = !self.offers.contains_key(&mac)
                    && self.in_pool(ip)
                    && self.shared(ip)
                    && self.last_holder.get(&ip).is_none_or(|m| *m == mac)
                    && self.free_for(ip, mac, now);
                if self.offers.get(&mac).map(|(o, _)| *o) != Some(ip)
                    && !self.is_bound(ip, mac)
                    && !taken_back
                {
                    // Apart from the other box of a pair, which has our server identifier
                    // too: an address of its half that nobody holds here is its offer.
                    if !self.shared(ip) && !self.by_ip.contains_key(&ip) {
                        self.withdraw(mac);
                        return Err(Ignore::OtherServer);
                    }
                    return Ok(self.nak(req));
                }
                ip
            }
            // INIT-REBOOT: a device that remembers an address (after a reboot or a link flap).
            (None, Some(ip)) => {
                if !self.cfg.block.contains(&ip) {
                    return Ok(self.nak(req));
                }
                if self.is_bound(ip, mac)
                    || self
                        .cfg
                        .reservations
                        .iter()
                        .any(|r| r.mac == mac && r.ip == ip)
                {
                    ip
                } else if self.by_mac.contains_key(&mac) || self.by_ip.contains_key(&ip) {
                    // We know this device, or the address, and they do not go together.
                    return Ok(self.nak(req));
                } else {
                    return Err(Ignore::NoRecord);
                }
            }
            // RENEWING (unicast) or REBINDING (broadcast): ciaddr is the device's address.
            (None, None) if ciaddr != Ipv4Addr::UNSPECIFIED => {
                if self.reserved_elsewhere(mac, ciaddr)
                    || self.reserved_ips.get(&ciaddr).is_some_and(|m| *m != mac)
                {
                    // Its reservation moved, or its address is reserved for another device
                    // now (a reload): off to another address.
                    return Ok(self.nak(req));
                }
                if self.is_bound(ciaddr, mac)
                    || self
                        .cfg
                        .reservations
                        .iter()
                        .any(|r| r.mac == mac && r.ip == ciaddr)
                {
                    ciaddr
                } else if self.by_ip.get(&ciaddr).is_some_and(|m| *m != mac)
                    || !self.cfg.block.contains(&ciaddr)
                {
                    return Ok(self.nak(req));
                } else {
                    return Err(Ignore::NoRecord);
                }
            }
            (None, None) => return Ok(self.nak(req)),
        };
        if !self.free_for(wanted, mac, now) {
            return Ok(self.nak(req));
        }
        if self.is_newcomer(mac) && !self.admit_newcomer(now, mac) {
            // Silent: the device tries again later, when the window has moved.
            self.withdraw(mac);
            return Err(Ignore::NoAddress);
        }
        let hostname = self
            .cfg
            .reservations
            .iter()
            .find(|r| r.mac == mac)
            .and_then(|r| r.hostname.clone())
            .or_else(|| match req.opts().get(OptionCode::Hostname) {
                Some(DhcpOption::Hostname(h)) => Some(h.clone()),
                _ => None,
            })
            // A renewal that leaves the option out keeps the name: names are meant to last.
            .or_else(|| self.by_mac.get(&mac).and_then(|l| l.hostname.clone()));
        let client_id = match req.opts().get(OptionCode::ClientIdentifier) {
            Some(DhcpOption::ClientIdentifier(id)) => Some(id.clone()),
            _ => self.by_mac.get(&mac).and_then(|l| l.client_id.clone()),
        };
        self.bind(Lease {
            mac,
            ip: wanted,
            hostname,
            client_id,
            expires: now + u64::from(self.cfg.lease_secs),
            active: true,
        });
        self.stats.acks += 1;
        Ok(self.reply(req, MessageType::Ack, wanted, true))
    }

    /// Binds `lease` (active) and says so (`Granted`): its device's offer ends, and its
    /// binding of another address, if any, gives that address back.
    fn bind(&mut self, lease: Lease) {
        let (mac, ip) = (lease.mac, lease.ip);
        // A device moving to another address gives up its old one: back to the pool (its
        // binding record moves with the device, so nothing else would ever free it).
        if let Some(old) = self.by_mac.get(&mac).filter(|l| l.ip != ip).map(|l| l.ip) {
            if self.by_ip.get(&old) == Some(&mac) {
                self.by_ip.remove(&old);
            }
            if self.last_holder.get(&old) == Some(&mac) {
                self.last_holder.remove(&old);
                if self.in_pool(old) && !self.offered.contains_key(&old) {
                    self.unused.insert(u32::from(old));
                }
            }
        }
        self.withdraw(mac);
        self.by_ip.insert(ip, mac);
        self.unused.remove(&u32::from(ip));
        if let Some(prev) = self.last_holder.insert(ip, mac).filter(|m| *m != mac) {
            // The address is reclaimed from a device whose lease had ended: forget that binding.
            self.by_mac.remove(&prev);
        }
        self.by_mac.insert(mac, lease.clone());
        self.events.push_back(LeaseEvent::Granted(lease));
        self.dirty = true;
    }

    fn release(&mut self, req: &Message, mac: [u8; 6]) {
        let ip = req.ciaddr();
        if let Some(lease) = self.by_mac.get_mut(&mac).filter(|l| l.active && l.ip == ip) {
            lease.active = false;
            let lease = lease.clone();
            self.by_ip.remove(&ip);
            self.events.push_back(LeaseEvent::Released(lease));
            self.dirty = true;
        }
    }

    fn decline(&mut self, now: u64, req: &Message, mac: [u8; 6]) {
        let Some(DhcpOption::RequestedIpAddress(ip)) =
            req.opts().get(OptionCode::RequestedIpAddress).cloned()
        else {
            return;
        };
        let ours = self.offers.get(&mac).is_some_and(|(o, _)| *o == ip) || self.is_bound(ip, mac);
        if !ours {
            return;
        }
        self.withdraw(mac);
        if let Some(lease) = self.by_mac.get_mut(&mac).filter(|l| l.ip == ip) {
            lease.active = false;
            self.by_ip.remove(&ip);
            self.dirty = true;
        }
        self.declined.insert(ip, now + DECLINE_HOLD);
        self.events.push_back(LeaseEvent::Declined { ip, mac });
    }

    /// Where addresses new to a device come from from now on (an HA pair's box; a lone
    /// server keeps [`Share::Whole`]). Offers out stay as they are.
    pub const fn set_share(&mut self, share: Share) {
        self.share = share;
    }

    /// Where addresses new to a device come from.
    pub const fn share(&self) -> Share {
        self.share
    }

    /// Takes in the bindings another server made while the two were out of contact (the
    /// other box of an HA pair, after a split brain healed): each active binding of a device
    /// that is newer than ours for it, of an address in the block that nobody else holds
    /// here, becomes ours (`Granted`). A binding of an address another device holds here is
    /// left out: ours stands, and the other device is refused at its next renewal and gets
    /// a new address. Returns how many bindings came in, and how many were left out so.
    pub fn merge(&mut self, leases: Vec<Lease>, now: u64) -> (usize, usize) {
        let (mut taken, mut clashed) = (0, 0);
        for mut lease in leases {
            if !lease.active || lease.expires <= now || !self.cfg.block.contains(&lease.ip) {
                continue;
            }
            if self
                .by_mac
                .get(&lease.mac)
                .is_some_and(|ours| ours.expires >= lease.expires)
            {
                continue;
            }
            let reserved_other = self
                .reserved_ips
                .get(&lease.ip)
                .is_some_and(|m| *m != lease.mac);
            let held_other = self.by_ip.get(&lease.ip).is_some_and(|m| *m != lease.mac)
                || self
                    .offered
                    .get(&lease.ip)
                    .is_some_and(|(m, t)| *m != lease.mac && *t > now);
            if reserved_other || held_other || !self.assignable_or_reserved(lease.ip, lease.mac) {
                clashed += 1;
                continue;
            }
            // The device's binding here, if any, gives way to the newer one.
            lease.active = true;
            self.bind(lease);
            taken += 1;
        }
        (taken, clashed)
    }

    /// Whether `ip` may be bound to `mac` at all: an assignable address, or `mac`'s own
    /// reservation.
    fn assignable_or_reserved(&self, ip: Ipv4Addr, mac: [u8; 6]) -> bool {
        self.assignable(ip) || self.reserved_ips.get(&ip) == Some(&mac)
    }

    /// Ends leases and offers whose time ran out.
    pub fn handle_timeout(&mut self, now: u64) {
        self.expire(now);
    }

    /// The next moment something expires, unix seconds.
    pub fn poll_timeout(&self) -> Option<u64> {
        let leases = self.by_mac.values().filter(|l| l.active).map(|l| l.expires);
        let offers = self.offers.values().map(|(_, t)| *t);
        let declined = self.declined.values().copied();
        leases.chain(offers).chain(declined).min()
    }

    fn expire(&mut self, now: u64) {
        // Everything due at `now` went in the sweep of this second; what was made since ends
        // later.
        if self.swept == Some(now) {
            return;
        }
        self.swept = Some(now);
        let lapsed: Vec<[u8; 6]> = self
            .offers
            .iter()
            .filter(|(_, (_, t))| *t <= now)
            .map(|(m, _)| *m)
            .collect();
        for mac in lapsed {
            self.withdraw(mac);
        }
        self.declined.retain(|_, t| *t > now);
        for lease in self
            .by_mac
            .values_mut()
            .filter(|l| l.active && l.expires <= now)
        {
            lease.active = false;
            self.by_ip.remove(&lease.ip);
            self.events.push_back(LeaseEvent::Expired(lease.clone()));
            self.dirty = true;
        }
    }

    /// Replaces the reservations (a reload), keeping every binding the new ones allow. A
    /// binding of an address now reserved to another device ends at once (`Released`: that
    /// device's traffic is refused from now on, its next renewal is NAKed, and the reserved
    /// device may take the address); so does an offer of it. A device whose reservation moved
    /// keeps its old binding until it renews, and is then NAKed towards its reserved address.
    /// Addresses no longer reserved join the pool, as never used when nobody ever held them.
    pub fn set_reservations(&mut self, reservations: Vec<Reservation>) {
        let old: Vec<Ipv4Addr> = self.reserved_ips.keys().copied().collect();
        self.reserved_ips = reservations.iter().map(|r| (r.ip, r.mac)).collect();
        self.cfg.reservations = reservations;
        let displaced: Vec<(Ipv4Addr, [u8; 6])> = self
            .by_ip
            .iter()
            .filter(|(ip, mac)| self.reserved_ips.get(ip).is_some_and(|m| m != *mac))
            .map(|(ip, mac)| (*ip, *mac))
            .collect();
        for (ip, mac) in displaced {
            self.by_ip.remove(&ip);
            if let Some(lease) = self.by_mac.get_mut(&mac) {
                lease.active = false;
                self.events.push_back(LeaseEvent::Released(lease.clone()));
            }
            self.dirty = true;
        }
        let offered_away: Vec<[u8; 6]> = self
            .offered
            .iter()
            .filter(|(ip, (mac, _))| self.reserved_ips.get(ip).is_some_and(|m| m != mac))
            .map(|(_, (mac, _))| *mac)
            .collect();
        for mac in offered_away {
            self.withdraw(mac);
        }
        for ip in self.reserved_ips.keys() {
            self.unused.remove(&u32::from(*ip));
        }
        for ip in old {
            if self.in_pool(ip)
                && !self.last_holder.contains_key(&ip)
                && !self.by_ip.contains_key(&ip)
                && !self.offered.contains_key(&ip)
            {
                self.unused.insert(u32::from(ip));
            }
        }
        let (first, last) = (u32::from(self.cfg.pool.0), u32::from(self.cfg.pool.1));
        self.pool_size = (first..=last)
            .filter(|n| self.assignable(Ipv4Addr::from(*n)))
            .count();
    }

    /// The next change.
    pub fn poll_event(&mut self) -> Option<LeaseEvent> {
        self.events.pop_front()
    }

    /// Whether the bindings changed since the last call (time to persist them).
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// Every binding, active or ended, sorted by address: what to persist.
    pub fn leases(&self) -> Vec<Lease> {
        let mut v: Vec<Lease> = self.by_mac.values().cloned().collect();
        v.sort_by_key(|l| (u32::from(l.ip), l.mac));
        v
    }

    /// The active leases.
    pub fn active(&self) -> impl Iterator<Item = &Lease> {
        self.by_mac.values().filter(|l| l.active)
    }

    /// Counters.
    pub const fn stats(&self) -> Stats {
        self.stats
    }

    #[cfg(test)]
    fn pool_size(&self) -> usize {
        self.pool_size
    }

    fn in_pool(&self, ip: Ipv4Addr) -> bool {
        (u32::from(self.cfg.pool.0)..=u32::from(self.cfg.pool.1)).contains(&u32::from(ip))
            && self.assignable(ip)
    }

    /// Where new addresses are looked for, in order (inclusive, as numbers): see
    /// [`Share::ranges`].
    fn ranges(&self) -> [Option<(u32, u32)>; 2] {
        let (first, last) = (u32::from(self.cfg.pool.0), u32::from(self.cfg.pool.1));
        self.share.ranges(first.into(), last.into()).map(|r| {
            r.and_then(|(lo, hi)| Some((u32::try_from(lo).ok()?, u32::try_from(hi).ok()?)))
        })
    }

    /// Whether the share lets `ip` go to a device it is new to.
    fn shared(&self, ip: Ipv4Addr) -> bool {
        let (first, last) = (u32::from(self.cfg.pool.0), u32::from(self.cfg.pool.1));
        self.share
            .allows(first.into(), last.into(), u32::from(ip).into())
    }

    /// The first never-used address free for `mac` in `lo..=hi`, from the cursor round.
    fn unused_in(&self, lo: u32, hi: u32, mac: [u8; 6], now: u64) -> Option<Ipv4Addr> {
        let from = if (lo..=hi).contains(&self.cursor) {
            self.cursor
        } else {
            lo
        };
        self.unused
            .range(from..=hi)
            .chain(self.unused.range(lo..from))
            .map(|n| Ipv4Addr::from(*n))
            .find(|ip| self.free_for(*ip, mac, now))
    }

    /// Addresses that can never go to a device dynamically.
    fn assignable(&self, ip: Ipv4Addr) -> bool {
        ip != self.cfg.server
            && ip != self.cfg.block.network()
            && ip != self.cfg.block.broadcast()
            && !self.reserved_ips.contains_key(&ip)
    }

    /// Whether `ip` may be given to `mac` now: not bound, offered or reserved to another
    /// device, and not quarantined.
    fn free_for(&self, ip: Ipv4Addr, mac: [u8; 6], now: u64) -> bool {
        let reserved_other = self.reserved_ips.get(&ip).is_some_and(|m| *m != mac);
        let bound_other = self.by_ip.get(&ip).is_some_and(|m| *m != mac);
        let offered_other = self
            .offered
            .get(&ip)
            .is_some_and(|(m, t)| *m != mac && *t > now);
        let declined = self.declined.get(&ip).is_some_and(|t| *t > now);
        let special = ip == self.cfg.server
            || ip == self.cfg.block.network()
            || ip == self.cfg.block.broadcast()
            || !self.cfg.block.contains(&ip);
        !(reserved_other || bound_other || offered_other || declined || special)
    }

    /// Offers `ip` to `mac` until `until` (replacing its earlier offer); the address leaves
    /// the never-used set while offered.
    fn offer(&mut self, mac: [u8; 6], ip: Ipv4Addr, until: u64) {
        if self.offers.get(&mac).is_some_and(|(o, _)| *o != ip) {
            self.withdraw(mac);
        }
        self.offers.insert(mac, (ip, until));
        self.offered.insert(ip, (mac, until));
        self.unused.remove(&u32::from(ip));
    }

    /// Takes back `mac`'s offer, if any: an address nobody was ever bound to goes back to the
    /// never-used set.
    fn withdraw(&mut self, mac: [u8; 6]) {
        let Some((ip, _)) = self.offers.remove(&mac) else {
            return;
        };
        if self.offered.get(&ip).is_some_and(|(m, _)| *m == mac) {
            self.offered.remove(&ip);
        }
        if !self.last_holder.contains_key(&ip) && !self.by_ip.contains_key(&ip) && self.in_pool(ip)
        {
            self.unused.insert(u32::from(ip));
        }
    }

    /// Whether `mac` has a reservation, for another address than `ip`.
    fn reserved_elsewhere(&self, mac: [u8; 6], ip: Ipv4Addr) -> bool {
        self.cfg
            .reservations
            .iter()
            .any(|r| r.mac == mac && r.ip != ip)
    }

    fn is_bound(&self, ip: Ipv4Addr, mac: [u8; 6]) -> bool {
        self.by_ip.get(&ip) == Some(&mac)
    }

    fn nak(&mut self, req: &Message) -> Reply {
        self.stats.naks += 1;
        let mut reply = self.reply(req, MessageType::Nak, Ipv4Addr::UNSPECIFIED, false);
        // RFC 2131 §4.1: a NAK is always broadcast.
        reply.dst_ip = Ipv4Addr::BROADCAST;
        reply.dst_mac = BROADCAST_MAC;
        reply
    }

    /// Builds a reply of `kind` giving `yiaddr` (with configuration options when `config`).
    fn reply(&self, req: &Message, kind: MessageType, yiaddr: Ipv4Addr, config: bool) -> Reply {
        let mut msg = Message::new_with_id(
            req.xid(),
            Ipv4Addr::UNSPECIFIED,
            yiaddr,
            self.cfg.server,
            Ipv4Addr::UNSPECIFIED,
            req.chaddr(),
        );
        msg.set_opcode(Opcode::BootReply);
        msg.set_flags(req.flags());
        if kind == MessageType::Ack && yiaddr == Ipv4Addr::UNSPECIFIED {
            // INFORM: ciaddr echoes the client's address.
            msg.set_ciaddr(req.ciaddr());
        }
        let opts = msg.opts_mut();
        opts.insert(DhcpOption::MessageType(kind));
        opts.insert(DhcpOption::ServerIdentifier(self.cfg.server));
        if config && kind != MessageType::Nak {
            let lease = self.cfg.lease_secs;
            opts.insert(DhcpOption::AddressLeaseTime(lease));
            opts.insert(DhcpOption::Renewal(lease / 2));
            opts.insert(DhcpOption::Rebinding(lease / 8 * 7));
        }
        if kind != MessageType::Nak {
            opts.insert(DhcpOption::SubnetMask(self.cfg.block.netmask()));
            opts.insert(DhcpOption::BroadcastAddr(self.cfg.block.broadcast()));
            opts.insert(DhcpOption::Router(vec![self.cfg.server]));
            opts.insert(DhcpOption::DomainNameServer(vec![self.cfg.server]));
            opts.insert(DhcpOption::DomainName(self.cfg.domain.clone()));
            opts.insert(DhcpOption::InterfaceMtu(self.cfg.mtu));
        }
        let payload = msg.to_vec().unwrap_or_default();
        let chaddr: [u8; 6] = req
            .chaddr()
            .get(..6)
            .and_then(|c| c.try_into().ok())
            .unwrap_or(BROADCAST_MAC);
        // RFC 2131 §4.1: to ciaddr if set; broadcast if the client asked; else to yiaddr at
        // the client's MAC (we own layer 2, so no ARP is needed for that).
        let (dst_ip, dst_mac) = if req.ciaddr() != Ipv4Addr::UNSPECIFIED {
            (req.ciaddr(), chaddr)
        } else if req.flags().broadcast() || yiaddr == Ipv4Addr::UNSPECIFIED {
            (Ipv4Addr::BROADCAST, BROADCAST_MAC)
        } else {
            (yiaddr, chaddr)
        };
        Reply {
            payload,
            dst_ip,
            dst_mac,
            grants: (kind == MessageType::Ack && yiaddr != Ipv4Addr::UNSPECIFIED).then_some(yiaddr),
        }
    }
}

/// Where the options start: after the fixed BOOTP fields (236 bytes) and the magic cookie.
const OPTIONS_AT: usize = 240;
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];

/// A copy of `msg` keeping only the options this server reads, each checked against the length
/// RFC 2132 gives it; or None when the message is not a well-formed DHCP message at all.
///
/// The options go through our own bounds-checked walk before the DHCP library sees them, so a
/// malformed option (a 2-byte lease time, a 3-byte address) is dropped here instead of being
/// decoded on assumptions (dhcproto checks some lengths only with debug assertions).
fn sanitize(msg: &[u8]) -> Option<Vec<u8>> {
    if msg.len() < OPTIONS_AT || msg[236..OPTIONS_AT] != MAGIC_COOKIE {
        return None;
    }
    let mut out = Vec::with_capacity(msg.len());
    out.extend_from_slice(&msg[..OPTIONS_AT]);
    let mut i = OPTIONS_AT;
    while i < msg.len() {
        let code = msg[i];
        match code {
            0 => i += 1,
            255 => break,
            _ => {
                let len = usize::from(*msg.get(i + 1)?);
                let value = msg.get(i + 2..i + 2 + len)?;
                let keep = match code {
                    // Message type: one byte.
                    53 => len == 1,
                    // Requested address, server identifier: one IPv4 address.
                    50 | 54 => len == 4,
                    // Host name (RFC 2132 §3.14: at least one byte), client identifier (§9.14:
                    // at least two), parameter request list.
                    12 | 55 => len >= 1,
                    61 => len >= 2,
                    _ => false,
                };
                if keep {
                    out.push(code);
                    out.push(msg[i + 1]);
                    out.extend_from_slice(value);
                }
                i += 2 + len;
            }
        }
    }
    out.push(255);
    Some(out)
}

/// Builds a client message, for tests and the fuzz corpus.
#[doc(hidden)]
pub fn client_message(
    kind: MessageType,
    mac: [u8; 6],
    xid: u32,
    opts: Vec<DhcpOption>,
    ciaddr: Ipv4Addr,
    broadcast: bool,
) -> Vec<u8> {
    let mut msg = Message::new_with_id(
        xid,
        ciaddr,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &mac,
    );
    if broadcast {
        msg.set_flags(Flags::default().set_broadcast());
    }
    msg.opts_mut().insert(DhcpOption::MessageType(kind));
    for o in opts {
        msg.opts_mut().insert(o);
    }
    msg.to_vec().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg_with(options: &[u8]) -> Vec<u8> {
        let mut m = vec![0u8; OPTIONS_AT];
        m[236..240].copy_from_slice(&MAGIC_COOKIE);
        m.extend_from_slice(options);
        m
    }

    #[test]
    fn sanitize_keeps_what_we_read_with_the_right_length() {
        let m = msg_with(&[
            0, 53, 1, 1, 51, 2, 0, 9, 50, 3, 1, 2, 3, 12, 3, b'a', b'b', b'c', 99, 0, 255, 7, 7,
        ]);
        assert_eq!(
            sanitize(&m).unwrap()[OPTIONS_AT..],
            [53, 1, 1, 12, 3, b'a', b'b', b'c', 255]
        );
        assert_eq!(
            sanitize(&msg_with(&[53, 5, 1])),
            None,
            "an option running past the end"
        );
        assert_eq!(sanitize(&msg_with(&[53])), None);
        assert_eq!(sanitize(&[0u8; 239]), None);
        assert_eq!(sanitize(&vec![0u8; 300]), None, "no magic cookie");
    }

    #[test]
    fn pool_size_excludes_server_reservations_and_edges() {
        let cfg = DhcpConfig {
            server: Ipv4Addr::new(100, 64, 1, 1),
            block: "100.64.1.0/24".parse().unwrap(),
            pool: DhcpConfig::default_pool("100.64.1.0/24".parse().unwrap()),
            lease_secs: 3600,
            mtu: 1420,
            domain: "d".into(),
            reservations: vec![Reservation {
                mac: [2, 0, 0, 0, 0, 1],
                ip: Ipv4Addr::new(100, 64, 1, 9),
                hostname: None,
            }],
            new_lease_share: 0.5,
            new_lease_window_secs: 60,
        };
        let s = Server::new(cfg, vec![], 0).unwrap();
        assert_eq!(s.pool_size(), 254 - 2);
    }
}

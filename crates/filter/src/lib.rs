//! Per-device policy where packets arrive and leave, sans-IO (issue "Policy per device"): a
//! stateful filter over the inner IPv4 and IPv6 packets of one tunnel end.
//!
//! A [`RuleSet`] says which new flows may start: from an address set, to an address set (of
//! either family or both), of a protocol, to ports; the control plane compiles it from groups, members and devices, so a
//! rule here is a few prefix checks. Everything else is denied. A flow a rule allowed is kept
//! in a bounded flow table, and its replies pass without a rule: direction matters. A TCP
//! connection this end has no flow of (it restarted, or took the gateway over from its HA
//! pair's other box) is taken up from either side when a rule lets its opener open it; from
//! the answering side only until the opener's side shows it has the connection ([`Filter`]). The table
//! tells a new TCP connection (a SYN without ACK) from the rest of one, keeps UDP and ICMP
//! echo flows, lets an ICMP error through only as conntrack's RELATED (it answers a flow it
//! quotes: sent back to the quoted packet's source by its destination, against the way that
//! packet travelled, of a type that may answer a flow, no longer than 576 bytes, 1280 for
//! ICMPv6), and lets a later fragment through only when its own datagram's first fragment
//! passed (without overlapping another). IPv6 extension headers are walked, bounded, and
//! what the overlay has no use for is refused ([`Reason::Extension`]). Flows time out; when the table is full the oldest flow goes (and
//! is counted). A new rule set applies to new flows at once and cuts existing flows it no
//! longer allows.
//!
//! The same filter runs on both sides of a tunnel: the sending end drops a denied new flow
//! before it is sealed ([`Direction::Out`]), the receiving end drops what a peer sends that
//! no rule allows ([`Direction::In`]). No I/O, no clock of its own: the caller gives `now`.

#![forbid(unsafe_code)]

mod direction;
mod flowlog;
mod fragments;
mod packet;
mod rules;
mod spec;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

pub use direction::Direction;
pub use flowlog::{
    Count, ENDED_MAX, Ended, PORTS_MAX, REFUSED_MAX, REFUSED_WINDOW, RefusedFlows, Taken,
};
pub use packet::{FlowKey, flow_of};
pub use rules::{Proto, Rule, RuleSet};
pub use spec::{
    Allow, Directory, RuleSpec, SpecError, compile, glob, is_pattern, parse_allow, parse_flow,
};

use fragments::{Fragments, Refused};
use packet::{FIN, IcmpError, RST, Seen};
use rules::{Index, TCP};

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// It would open a flow no rule allows.
    NoRule,
    /// It belongs to no flow and cannot open one (a TCP segment other than a SYN, an echo
    /// reply): a flow that was cut, expired or never allowed.
    NoFlow,
    /// An ICMP error about no flow we keep.
    Stray,
    /// The packet of a flow travelling the way only its replies may (a spoofed reply).
    WrongWay,
    /// Not an IP packet the filter can read (short, cut, an ICMP message other than an echo
    /// or an error), or a fragment that cannot be a true one (ending past 65,535 bytes,
    /// empty, or not the last and not a multiple of 8 bytes).
    Malformed,
    /// An ICMP error that does not answer the flow it quotes: sent to another address than
    /// the quoted packet's source or from another than its destination, travelling the way
    /// the quoted packet did, of a type that answers no flow (a redirect, a source quench),
    /// longer than 576 bytes or fragmented.
    ForgedError,
    /// A later fragment whose datagram's first fragment was not let through (dropped, not
    /// seen yet, timed out), or that overlaps another fragment of its datagram (then the
    /// rest of that datagram is dropped too).
    Fragment,
    /// An IPv6 packet whose extension headers are refused (docs/protocol.md §7): a Routing
    /// header, Hop-by-Hop or Destination Options with more than padding, Hop-by-Hop other
    /// than first, two Fragment headers, a header the filter does not walk (Mobility, HIP,
    /// Shim6, experiments), more than 8 headers or 256 bytes of them, or a first fragment
    /// without the whole chain and upper-layer header (RFC 7112).
    Extension,
}

impl Reason {
    /// Every reason, in the order [`Stats::drops`] counts them.
    pub const ALL: [Self; 8] = [
        Self::NoRule,
        Self::NoFlow,
        Self::Stray,
        Self::WrongWay,
        Self::Malformed,
        Self::ForgedError,
        Self::Fragment,
        Self::Extension,
    ];

    /// In a word, for counters and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Self::NoRule => "no_rule",
            Self::NoFlow => "no_flow",
            Self::Stray => "stray",
            Self::WrongWay => "wrong_way",
            Self::Malformed => "malformed",
            Self::ForgedError => "forged_error",
            Self::Fragment => "fragment",
            Self::Extension => "extension_header",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// What to do with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through.
    Pass,
    /// Drop it, for this reason.
    Drop(Reason),
}

/// How long a flow lives without a packet, by what it has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// A TCP connection whose SYN went out and that has not been answered.
    pub tcp_opening: Duration,
    /// A TCP connection both sides have spoken on.
    pub tcp_open: Duration,
    /// A TCP connection after a FIN.
    pub tcp_closing: Duration,
    /// After a RST (not renewed by packets).
    pub tcp_reset: Duration,
    /// A UDP or other flow with no reply yet.
    pub datagram: Duration,
    /// A UDP or other flow that was answered.
    pub datagram_replied: Duration,
    /// An ICMP echo flow.
    pub icmp: Duration,
    /// A datagram's later fragments after its first (Linux's `ipfrag_time`).
    pub fragment: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            tcp_opening: Duration::from_secs(30),
            tcp_open: Duration::from_secs(2 * 3600),
            tcp_closing: Duration::from_secs(60),
            tcp_reset: Duration::from_secs(5),
            datagram: Duration::from_secs(30),
            datagram_replied: Duration::from_secs(180),
            icmp: Duration::from_secs(30),
            fragment: Duration::from_secs(30),
        }
    }
}

/// Where a flow stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    TcpOpening,
    TcpOpen,
    TcpClosing,
    TcpReset,
    Datagram { replied: bool },
    Icmp,
}

/// One flow: which way it was opened, the rule that allowed it, where it stands, what
/// passed each way.
#[derive(Debug, Clone, Copy)]
struct Flow {
    dir: Direction,
    rule: u32,
    state: State,
    expires: Instant,
    /// Its place in the order flows were made (eviction takes the oldest).
    serial: u64,
    /// Its first packet and its last.
    start: Instant,
    last: Instant,
    /// From its opener, and from its answerer.
    forth: Count,
    back: Count,
    /// The sides that sent a TCP FIN: 1 its opener, 2 its answerer.
    fins: u8,
    /// It went into the flow log already (its end was seen; it stays for its last packets).
    logged: bool,
}

impl Flow {
    const fn ended(&self, key: FlowKey) -> Ended {
        Ended {
            key,
            dir: self.dir,
            rule: self.rule,
            start: self.start,
            end: self.last,
            forth: self.forth,
            back: self.back,
        }
    }
}

/// A TCP connection taken up from its answering side, until its opener's side confirms it.
#[derive(Debug, Clone, Copy)]
struct Unconfirmed {
    /// The way the opener's packets travel.
    opener: Direction,
    rule: u32,
    /// Not renewed by the answering side's packets.
    expires: Instant,
    /// Its place in the order such connections were taken up (eviction takes the oldest).
    serial: u64,
}

/// The order the entries of a bounded table were made in, so that the oldest goes first when
/// it is full: each key with the serial its entry was made under (the entries carry theirs),
/// so that one removed, or made again, before its turn is skipped.
#[derive(Debug, Default)]
struct Oldest {
    keys: VecDeque<(FlowKey, u64)>,
    serial: u64,
}

impl Oldest {
    /// Removes the oldest entries of `table` until it holds fewer than `capacity`; returns
    /// how many it removed.
    fn make_room<V>(
        &mut self,
        table: &mut HashMap<FlowKey, V>,
        capacity: usize,
        serial: impl Fn(&V) -> u64,
        mut gone: impl FnMut(FlowKey, V),
    ) -> u64 {
        let mut removed = 0;
        while table.len() >= capacity {
            let Some((old, s)) = self.keys.pop_front() else {
                break;
            };
            if table.get(&old).is_some_and(|v| serial(v) == s)
                && let Some(v) = table.remove(&old)
            {
                gone(old, v);
                removed += 1;
            }
        }
        removed
    }

    /// The serial for `key`'s entry about to be made, noted as the newest. Keys whose entries
    /// went before their turn are dropped from the list first when it holds twice
    /// `capacity`, so it stays within that.
    fn push<V>(
        &mut self,
        key: FlowKey,
        table: &HashMap<FlowKey, V>,
        capacity: usize,
        serial: impl Fn(&V) -> u64,
    ) -> u64 {
        if self.keys.len() >= 2 * capacity {
            self.keys
                .retain(|(k, s)| table.get(k).is_some_and(|v| serial(v) == *s));
        }
        self.serial += 1;
        self.keys.push_back((key, self.serial));
        self.serial
    }
}

/// Connections taken up from their answering side and not confirmed yet, at most: a table of
/// their own, so that a member sending segments from an allowed port evicts only these.
pub const UNCONFIRMED: usize = 256;
/// How long one waits for its opener's side.
pub const UNCONFIRMED_FOR: Duration = Duration::from_secs(5);

/// What the filter did, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets let through.
    pub passed: u64,
    /// Flows opened.
    pub opened: u64,
    /// Packets dropped, by [`Reason`] (in [`Reason::ALL`]'s order).
    pub drops: [u64; Reason::ALL.len()],
    /// Of those, the packets that came from the tunnel ([`Direction::In`]): what peers sent
    /// that no rule lets in.
    pub drops_in: [u64; Reason::ALL.len()],
    /// Flows removed because they timed out.
    pub expired: u64,
    /// Flows removed to make room for new ones (the oldest first).
    pub evicted: u64,
    /// Fragmented datagrams forgotten before they were whole to make room for others (the
    /// oldest first): their later fragments are then dropped.
    pub fragments_evicted: u64,
    /// Flows cut because a new rule set no longer allows them.
    pub cut: u64,
    /// Of the flows opened, TCP connections taken up in the middle (a segment other than a
    /// SYN that a rule lets its sender open, or its answer confirmed by the opener's side:
    /// begun before the rules were enforced, before a restart or failover, or evicted).
    pub picked_up: u64,
    /// Connections taken up from the answering side that the opener's side did not have: it
    /// answered with a RST, which was dropped (a probe learns nothing), or said nothing in
    /// [`UNCONFIRMED_FOR`].
    pub picked_up_refused: u64,
    /// Flows opened, by the rule that allowed them.
    pub opened_by_rule: HashMap<u32, u64>,
}

impl Stats {
    /// Drops for `reason`.
    pub const fn dropped(&self, reason: Reason) -> u64 {
        self.drops[reason.index()]
    }

    /// Drops for `reason` of packets that came from the tunnel.
    pub const fn dropped_in(&self, reason: Reason) -> u64 {
        self.drops_in[reason.index()]
    }
}

/// The filter of one tunnel end.
#[derive(Debug)]
pub struct Filter {
    rules: RuleSet,
    /// `rules` by destination.
    index: Index,
    flows: HashMap<FlowKey, Flow>,
    /// The datagrams whose first fragment passed: later fragments carry no ports.
    fragments: Fragments,
    /// The order flows were made in.
    order: Oldest,
    /// Connections taken up from their answering side, by the opener's key.
    unconfirmed: HashMap<FlowKey, Unconfirmed>,
    /// Ended flows and refused ones, while flow logs are on.
    log: Option<flowlog::FlowLog>,
    /// The order they were taken up in.
    unconfirmed_order: Oldest,
    capacity: usize,
    timeouts: Timeouts,
    stats: Stats,
}

impl Filter {
    /// A filter enforcing `rules`, keeping at most `capacity` flows (at least one), and
    /// fragmented datagrams in reassembly at most a sixteenth of that (64 to 4,096).
    pub fn new(rules: RuleSet, capacity: usize, timeouts: Timeouts) -> Self {
        Self {
            index: Index::new(&rules),
            rules,
            flows: HashMap::new(),
            fragments: Fragments::new(fragment_capacity(capacity)),
            order: Oldest::default(),
            unconfirmed: HashMap::new(),
            unconfirmed_order: Oldest::default(),
            log: None,
            capacity: capacity.max(1),
            timeouts,
            stats: Stats::default(),
        }
    }

    /// The rules in force.
    pub const fn rules(&self) -> &RuleSet {
        &self.rules
    }

    /// Flows kept now.
    pub fn flows(&self) -> usize {
        self.flows.len()
    }

    /// Connections taken up from their answering side, waiting for their opener's.
    pub fn unconfirmed(&self) -> usize {
        self.unconfirmed.len()
    }

    /// Fragmented datagrams whose later fragments may follow now.
    pub fn datagrams(&self) -> usize {
        self.fragments.len()
    }

    /// The counters.
    pub const fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Decides on `packet` (an IPv4 or IPv6 packet) travelling `dir` at `now`.
    pub fn check(&mut self, packet: &[u8], dir: Direction, now: Instant) -> Verdict {
        let verdict = match packet::parse(packet) {
            None => Verdict::Drop(Reason::Malformed),
            Some(Seen::Flow {
                key,
                flags,
                opens,
                first,
            }) => {
                let verdict = self.flow_packet(key, (flags, opens), dir, (now, packet.len()));
                if let (Verdict::Pass, Some((datagram, piece))) = (verdict, first) {
                    let expires = now + self.timeouts.fragment;
                    self.fragments.first(datagram, dir, piece, expires);
                    self.stats.fragments_evicted = self.fragments.evicted;
                }
                verdict
            }
            Some(Seen::IcmpError(error)) => self.icmp_error(&error, dir, now),
            Some(Seen::Refused) => Verdict::Drop(Reason::Extension),
            Some(Seen::Fragment { datagram, piece }) => {
                match self.fragments.later(datagram, dir, piece, now) {
                    Ok(()) => Verdict::Pass,
                    Err(Refused::Unknown | Refused::Overlap) => Verdict::Drop(Reason::Fragment),
                }
            }
        };
        match verdict {
            Verdict::Pass => self.stats.passed += 1,
            Verdict::Drop(r) => {
                self.stats.drops[r.index()] += 1;
                if dir == Direction::In {
                    self.stats.drops_in[r.index()] += 1;
                }
            }
        }
        verdict
    }

    /// An ICMP error passes when it is RELATED to a flow we keep, as conntrack has it
    /// (`nf_conntrack_inet_error`): it reports on a packet of that flow, goes back to that
    /// packet's source, and travels against it. Its own source must be the quoted packet's
    /// destination: no router on the overlay's path reports on a flow (each gateway sends
    /// its ICMP errors to its own LAN, never into the tunnel), so an error from any other
    /// address is forged.
    fn icmp_error(&self, e: &IcmpError, dir: Direction, now: Instant) -> Verdict {
        if !e.answers_flows() || e.oversize {
            return Verdict::Drop(Reason::ForgedError);
        }
        let Some(about) = e.about else {
            return Verdict::Drop(Reason::Stray);
        };
        // The flow, and whether the quoted packet was one of its replies.
        let found = [(about, false), (about.reversed(), true)]
            .into_iter()
            .find_map(|(k, reply)| {
                let f = self.flows.get(&k).filter(|f| f.expires > now)?;
                Some((f.dir, reply))
            });
        let Some((opened, reply)) = found else {
            return Verdict::Drop(Reason::Stray);
        };
        let quoted_went = if reply { opened.reversed() } else { opened };
        if e.dst != about.src || e.src != about.dst || dir == quoted_went {
            return Verdict::Drop(Reason::ForgedError);
        }
        Verdict::Pass
    }

    fn flow_packet(
        &mut self,
        key: FlowKey,
        (flags, opens): (u8, bool),
        dir: Direction,
        (now, len): (Instant, usize),
    ) -> Verdict {
        let t = self.timeouts;
        for (k, reply) in [(key, false), (key.reversed(), true)] {
            // An echo request is never the reply to one (same identifier the other way).
            if reply && opens && key.proto == rules::ICMP {
                continue;
            }
            let Some(flow) = self.flows.get_mut(&k) else {
                continue;
            };
            if flow.expires <= now {
                self.remove(&k);
                self.stats.expired += 1;
                break;
            }
            // Its own packets go the way it was opened; replies the other way.
            if (flow.dir == dir) == reply {
                return Verdict::Drop(Reason::WrongWay);
            }
            flow.state = match flow.state {
                _ if key.proto == TCP && flags & RST != 0 => State::TcpReset,
                State::TcpReset => State::TcpReset,
                _ if key.proto == TCP && flags & FIN != 0 => State::TcpClosing,
                State::TcpOpening if reply => State::TcpOpen,
                State::Datagram { .. } if reply => State::Datagram { replied: true },
                s => s,
            };
            let ttl = match flow.state {
                State::TcpOpening => t.tcp_opening,
                State::TcpOpen => t.tcp_open,
                State::TcpClosing => t.tcp_closing,
                State::TcpReset => t.tcp_reset,
                State::Datagram { replied: false } => t.datagram,
                State::Datagram { replied: true } => t.datagram_replied,
                State::Icmp => t.icmp,
            };
            // A reset flow ends soon whatever follows.
            if flow.state != State::TcpReset || flags & RST != 0 {
                flow.expires = now + ttl;
            }
            if reply {
                flow.back.add(len);
            } else {
                flow.forth.add(len);
            }
            flow.last = now;
            // A TCP connection ends, for the flow log, when both sides said FIN or one RST.
            if key.proto == TCP {
                if flags & FIN != 0 {
                    flow.fins |= if reply { 2 } else { 1 };
                }
                if (flow.fins == 3 || flags & RST != 0)
                    && !flow.logged
                    && let Some(log) = self.log.as_mut()
                {
                    flow.logged = true;
                    log.ended(flow.ended(k));
                }
            }
            return Verdict::Pass;
        }
        if !opens {
            if let Some(verdict) = self.unconfirmed_packet(key, flags, dir, (now, len)) {
                return verdict;
            }
            return self.pick_up(key, flags, dir, (now, len));
        }
        let Some(rule) =
            self.index
                .first_allowing(&self.rules, key.proto, key.src, key.dst, key.dport)
        else {
            if let Some(log) = self.log.as_mut() {
                log.refused(&key, dir, now);
            }
            return Verdict::Drop(Reason::NoRule);
        };
        let state = match key.proto {
            TCP => State::TcpOpening,
            rules::ICMP => State::Icmp,
            _ => State::Datagram { replied: false },
        };
        let ttl = match state {
            State::TcpOpening => t.tcp_opening,
            State::Icmp => t.icmp,
            _ => t.datagram,
        };
        self.insert(key, dir, rule, state, now + ttl, (now, len));
        Verdict::Pass
    }

    /// A TCP segment of no flow we keep, other than a SYN: a connection that began before
    /// these rules were enforced (the filter was just switched on, the tunnel end restarted
    /// or took the gateway over from its HA pair's other box) or whose flow was evicted.
    /// When a rule lets its sender open it, it is taken up as an open connection (as
    /// conntrack's loose pickup does), so that an allowed connection survives.
    ///
    /// When a rule lets its receiver open it instead, it comes from the answering side (the
    /// data of a download the device began, say): it passes and waits, unconfirmed, for the
    /// opener's side ([`Filter::unconfirmed_packet`]). Until then only the answering side's
    /// segments pass, for [`UNCONFIRMED_FOR`] at most. A RST never makes either.
    fn pick_up(
        &mut self,
        key: FlowKey,
        flags: u8,
        dir: Direction,
        (now, len): (Instant, usize),
    ) -> Verdict {
        if key.proto != TCP || flags & RST != 0 {
            return Verdict::Drop(Reason::NoFlow);
        }
        let allowing = |f: &Self, k: FlowKey| {
            f.index
                .first_allowing(&f.rules, k.proto, k.src, k.dst, k.dport)
        };
        if let Some(rule) = allowing(self, key) {
            self.take_up(key, flags, dir, rule, (now, len));
            return Verdict::Pass;
        }
        let opener = key.reversed();
        let Some(rule) = allowing(self, opener) else {
            return Verdict::Drop(Reason::NoFlow);
        };
        let serial = |u: &Unconfirmed| u.serial;
        self.stats.picked_up_refused +=
            self.unconfirmed_order
                .make_room(&mut self.unconfirmed, UNCONFIRMED, serial, |_, _| {});
        let serial = self
            .unconfirmed_order
            .push(opener, &self.unconfirmed, UNCONFIRMED, serial);
        self.unconfirmed.insert(
            opener,
            Unconfirmed {
                opener: dir.reversed(),
                rule,
                expires: now + UNCONFIRMED_FOR,
                serial,
            },
        );
        Verdict::Pass
    }

    /// A TCP segment of a connection taken up from its answering side, if it is one: more
    /// of the answering side's pass (until the wait ends); the opener's side confirms it
    /// (its segment passes and the connection is kept as any other), unless it answers with
    /// a RST: it does not have the connection, and its RST is dropped, so that a segment
    /// sent to probe a device learns nothing.
    fn unconfirmed_packet(
        &mut self,
        key: FlowKey,
        flags: u8,
        dir: Direction,
        (now, len): (Instant, usize),
    ) -> Option<Verdict> {
        if key.proto != TCP {
            return None;
        }
        if let Some(u) = self.unconfirmed.get(&key.reversed()).copied() {
            // The answering side again.
            if u.expires <= now {
                self.unconfirmed.remove(&key.reversed());
                self.stats.picked_up_refused += 1;
                return None;
            }
            return Some(if dir == u.opener {
                Verdict::Drop(Reason::WrongWay)
            } else {
                Verdict::Pass
            });
        }
        let u = self.unconfirmed.get(&key).copied()?;
        if dir != u.opener {
            return Some(Verdict::Drop(Reason::WrongWay));
        }
        self.unconfirmed.remove(&key);
        if u.expires <= now || flags & RST != 0 {
            self.stats.picked_up_refused += 1;
            return Some(Verdict::Drop(Reason::NoFlow));
        }
        self.take_up(key, flags, dir, u.rule, (now, len));
        Some(Verdict::Pass)
    }

    /// Keeps `key`'s connection, opened the way `dir` goes, as open (or closing, after a
    /// FIN), taken up in the middle by `rule`.
    fn take_up(
        &mut self,
        key: FlowKey,
        flags: u8,
        dir: Direction,
        rule: u32,
        (now, len): (Instant, usize),
    ) {
        let (state, ttl) = if flags & FIN == 0 {
            (State::TcpOpen, self.timeouts.tcp_open)
        } else {
            (State::TcpClosing, self.timeouts.tcp_closing)
        };
        self.insert(key, dir, rule, state, now + ttl, (now, len));
        self.stats.picked_up += 1;
    }

    fn insert(
        &mut self,
        key: FlowKey,
        dir: Direction,
        rule: u32,
        state: State,
        expires: Instant,
        (now, len): (Instant, usize),
    ) {
        let serial = |f: &Flow| f.serial;
        let log = &mut self.log;
        self.stats.evicted +=
            self.order
                .make_room(&mut self.flows, self.capacity, serial, |k, f: Flow| {
                    if let Some(log) = log.as_mut()
                        && !f.logged
                    {
                        log.ended(f.ended(k));
                    }
                });
        let serial = self.order.push(key, &self.flows, self.capacity, serial);
        let mut forth = Count::default();
        forth.add(len);
        self.flows.insert(
            key,
            Flow {
                dir,
                rule,
                state,
                expires,
                serial,
                start: now,
                last: now,
                forth,
                back: Count::default(),
                fins: 0,
                logged: false,
            },
        );
        self.stats.opened += 1;
        *self.stats.opened_by_rule.entry(rule).or_default() += 1;
    }

    /// Removes `key`'s flow; into the flow log, if it is on and the flow is not there yet.
    fn remove(&mut self, key: &FlowKey) {
        if let Some(f) = self.flows.remove(key)
            && let Some(log) = self.log.as_mut()
            && !f.logged
        {
            log.ended(f.ended(*key));
        }
    }

    /// Turns flow logs on or off: while on, flows that end and new flows no rule allows are
    /// kept for [`Filter::take_log`] (bounded: docs/protocol.md §8, *Flow logs*). Turned off,
    /// what was not taken is dropped.
    pub fn set_log(&mut self, on: bool) {
        match (on, self.log.is_some()) {
            (true, false) => self.log = Some(flowlog::FlowLog::default()),
            (false, true) => self.log = None,
            _ => {}
        }
    }

    /// Whether flow logs are on.
    pub const fn logs(&self) -> bool {
        self.log.is_some()
    }

    /// The flows that ended since the last take, the refused summaries whose minute is over
    /// by `now`, and how many records were lost; nothing while flow logs are off.
    pub fn take_log(&mut self, now: Instant) -> Taken {
        self.log
            .as_mut()
            .map(|l| l.take(now, false))
            .unwrap_or_default()
    }

    /// Ends every flow kept into the flow log (the rules go, or a new table replaces this
    /// one) and takes all of it, summaries whose minute is not over among it; the table is
    /// left empty.
    pub fn finish(&mut self, now: Instant) -> Taken {
        let keys: Vec<FlowKey> = self.flows.keys().copied().collect();
        for k in &keys {
            self.remove(k);
        }
        self.log
            .as_mut()
            .map(|l| l.take(now, true))
            .unwrap_or_default()
    }

    /// Removes the flows that timed out by `now` (call it now and then, once a second say);
    /// returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let gone: Vec<FlowKey> = self
            .flows
            .iter()
            .filter(|(_, f)| f.expires <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in &gone {
            self.remove(k);
        }
        self.fragments.expire(now);
        self.stats.expired += gone.len() as u64;
        let waited = self.unconfirmed.len();
        self.unconfirmed.retain(|_, u| u.expires > now);
        self.stats.picked_up_refused += (waited - self.unconfirmed.len()) as u64;
        gone.len()
    }

    /// Enforces `rules` from now on: new flows are judged by them, and every kept flow they
    /// no longer allow is cut (its next packet is dropped as [`Reason::NoFlow`], unless it
    /// may open a flow again and a rule allows it). Returns how many were cut.
    pub fn set_rules(&mut self, rules: RuleSet) -> usize {
        let index = Index::new(&rules);
        let mut cut = Vec::new();
        for (k, f) in &mut self.flows {
            match index.first_allowing(&rules, k.proto, k.src, k.dst, k.dport) {
                Some(rule) => f.rule = rule,
                None => cut.push(*k),
            }
        }
        for k in &cut {
            self.remove(k);
        }
        self.unconfirmed.retain(|k, u| {
            index
                .first_allowing(&rules, k.proto, k.src, k.dst, k.dport)
                .map(|rule| u.rule = rule)
                .is_some()
        });
        if !cut.is_empty() {
            // The fragments of datagrams a cut flow began are not let through either.
            let evicted = self.fragments.evicted;
            self.fragments = Fragments::new(fragment_capacity(self.capacity));
            self.fragments.evicted = evicted;
        }
        self.stats.cut += cut.len() as u64;
        self.rules = rules;
        self.index = index;
        cut.len()
    }
}

/// Fragmented datagrams kept in reassembly by a filter of `flows` flows.
fn fragment_capacity(flows: usize) -> usize {
    (flows / 16).clamp(64, 4096)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::packet::testing::*;
    use super::packet::{ACK, FLOW_ERRORS, SYN};
    use super::*;

    const OPS: Ipv4Addr = Ipv4Addr::new(100, 64, 1, 9);
    const IOT: Ipv4Addr = Ipv4Addr::new(100, 64, 2, 7);
    const IOT2: Ipv4Addr = Ipv4Addr::new(100, 64, 2, 8);

    fn net(s: &str) -> ipnet::IpNet {
        s.parse().unwrap_or_default()
    }

    /// ops (100.64.1.0/24) may open tcp/22 and ping to iot (100.64.2.0/24).
    fn ops_to_iot() -> RuleSet {
        RuleSet {
            version: 1,
            rules: vec![
                Rule {
                    id: 1,
                    from: vec![net("100.64.1.0/24")],
                    to: vec![net("100.64.2.0/24")],
                    proto: Proto::Tcp,
                    ports: vec![22..=22],
                },
                Rule {
                    id: 2,
                    from: vec![net("100.64.1.0/24")],
                    to: vec![net("100.64.2.0/24")],
                    proto: Proto::Icmp,
                    ports: Vec::new(),
                },
                Rule {
                    id: 3,
                    from: vec![net("100.64.1.0/24")],
                    to: vec![net("100.64.2.0/24")],
                    proto: Proto::Udp,
                    ports: vec![5000..=5010],
                },
            ],
        }
    }

    fn filter() -> Filter {
        Filter::new(ops_to_iot(), 1000, Timeouts::default())
    }

    /// The iot side's end: ops opens (arriving In), replies go Out; iot cannot open.
    /// With flow logs on, a connection goes into the log once both sides said FIN, with its
    /// bytes and packets each way, its rule and its times; a datagram flow when it times
    /// out; an evicted one when it goes; each once. Off, nothing is kept.
    #[test]
    fn ended_flows_go_into_the_log_once_with_their_counts() {
        let mut f = Filter::new(ops_to_iot(), 2, Timeouts::default());
        let t = Instant::now();
        let later = |s| t + Duration::from_secs(s);
        assert_eq!(f.take_log(t), Taken::default(), "off: nothing");
        f.set_log(true);
        let syn = tcp(OPS, 40000, IOT, 22, SYN);
        for (p, dir, at) in [
            (syn.clone(), Direction::In, 0),
            (tcp(IOT, 22, OPS, 40000, SYN | ACK), Direction::Out, 1),
            (
                tcp_with(OPS, 40000, IOT, 22, ACK, &[0; 100]),
                Direction::In,
                2,
            ),
            (tcp(OPS, 40000, IOT, 22, FIN | ACK), Direction::In, 3),
        ] {
            assert_eq!(f.check(&p, dir, later(at)), Verdict::Pass);
        }
        assert!(f.take_log(later(3)).ended.is_empty(), "one FIN: not yet");
        let fin = tcp(IOT, 22, OPS, 40000, FIN | ACK);
        assert_eq!(f.check(&fin, Direction::Out, later(4)), Verdict::Pass);
        // The last ACK passes, and is not a second record.
        let ack = tcp(OPS, 40000, IOT, 22, ACK);
        assert_eq!(f.check(&ack, Direction::In, later(5)), Verdict::Pass);
        let taken = f.take_log(later(5));
        let [e] = taken.ended[..] else {
            panic!("{taken:?}");
        };
        assert_eq!((e.key.dport, e.dir, e.rule), (22, Direction::In, 1));
        assert_eq!((e.start, e.end), (t, later(4)));
        assert_eq!(e.forth.packets, 3);
        assert_eq!(e.forth.bytes, (2 * syn.len() + syn.len() + 100) as u64);
        assert_eq!(e.back.packets, 2);
        // It times out later without a second record.
        f.expire(later(3600));
        assert!(f.take_log(later(3600)).ended.is_empty());

        // A datagram flow: when it times out, ended at its last packet.
        let u = udp(OPS, 5555, IOT, 5000);
        assert_eq!(f.check(&u, Direction::Out, later(10)), Verdict::Pass);
        assert_eq!(f.check(&u, Direction::Out, later(11)), Verdict::Pass);
        f.expire(later(100));
        let taken = f.take_log(later(100));
        assert_eq!(taken.ended.len(), 1, "{taken:?}");
        assert_eq!(
            (taken.ended[0].end, taken.ended[0].forth.packets),
            (later(11), 2)
        );

        // Evicted for room (two flows kept): into the log as it goes.
        for port in [5001, 5002, 5003] {
            let p = udp(OPS, 6000, IOT, port);
            assert_eq!(f.check(&p, Direction::Out, later(200)), Verdict::Pass);
        }
        let taken = f.take_log(later(200));
        assert_eq!(taken.ended.len(), 1, "{taken:?}");
        assert_eq!(taken.ended[0].key.dport, 5001);
        // The rest when the table finishes.
        let rest = f.finish(later(201));
        assert_eq!(rest.ended.len(), 2, "{rest:?}");
        f.set_log(false);
        assert_eq!(f.check(&u, Direction::Out, later(300)), Verdict::Pass);
        f.expire(later(900));
        assert_eq!(f.take_log(later(900)), Taken::default());
    }

    /// A port scan is a summary per source and direction per minute, not a record per
    /// port; the log's queues are bounded and what they lose is counted.
    #[test]
    fn a_scan_is_one_summary_and_the_log_is_bounded() {
        let mut f = Filter::new(ops_to_iot(), 100_000, Timeouts::default());
        f.set_log(true);
        let t = Instant::now();
        for port in 1..=10_000u16 {
            let p = tcp(IOT, 40000, OPS, port, SYN);
            assert_eq!(
                f.check(&p, Direction::Out, t),
                Verdict::Drop(Reason::NoRule)
            );
        }
        assert!(f.take_log(t).refused.is_empty(), "the minute is not over");
        let taken = f.take_log(t + REFUSED_WINDOW);
        let [r] = &taken.refused[..] else {
            panic!("{taken:?}");
        };
        assert_eq!(
            (r.src, r.dir, r.packets),
            (IOT.into(), Direction::Out, 10_000)
        );
        assert_eq!(r.ports, PORTS_MAX);
        // Sources beyond the bound, and ended flows beyond theirs, are counted lost.
        for i in 0..u32::try_from(REFUSED_MAX + 5).unwrap_or_default() {
            let src = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 3, 0)) + i);
            f.check(&tcp(src, 1, OPS, 1, SYN), Direction::In, t);
        }
        for port in 0..u16::try_from(ENDED_MAX + 7).unwrap_or_default() {
            let p = udp(OPS, port, IOT, 5000);
            assert_eq!(f.check(&p, Direction::Out, t), Verdict::Pass);
        }
        f.expire(t + Duration::from_secs(3600));
        let taken = f.take_log(t + Duration::from_secs(3600));
        assert_eq!(taken.refused.len(), REFUSED_MAX);
        assert_eq!(taken.ended.len(), ENDED_MAX);
        assert_eq!(taken.lost, 5 + 7);
        assert_eq!(f.take_log(t + Duration::from_secs(3601)), Taken::default());
    }

    #[test]
    fn direction_matters_replies_pass_and_nothing_opens_the_other_way() {
        let mut f = filter();
        let t = Instant::now();
        // ops -> iot ssh arrives; the camera answers; the conversation goes on.
        assert_eq!(
            f.check(&tcp(OPS, 40000, IOT, 22, SYN), Direction::In, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&tcp(IOT, 22, OPS, 40000, SYN | ACK), Direction::Out, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&tcp(OPS, 40000, IOT, 22, ACK), Direction::In, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&tcp(IOT, 22, OPS, 40000, ACK), Direction::Out, t),
            Verdict::Pass
        );
        // iot -> ops: no rule, at the sender (Out) and, had it been sent, at a receiver.
        assert_eq!(
            f.check(&tcp(IOT, 41000, OPS, 22, SYN), Direction::Out, t),
            Verdict::Drop(Reason::NoRule)
        );
        // ops -> iot on another port: no rule.
        assert_eq!(
            f.check(&tcp(OPS, 40001, IOT, 23, SYN), Direction::In, t),
            Verdict::Drop(Reason::NoRule)
        );
        // A segment that is not a SYN, from the side a rule lets open: a connection begun
        // before the rules (or evicted), taken up. A RST, or a port no rule names either
        // way: no flow.
        assert_eq!(
            f.check(&tcp(OPS, 40002, IOT, 22, ACK), Direction::In, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&tcp(IOT, 22, OPS, 40002, ACK), Direction::Out, t),
            Verdict::Pass,
            "its replies pass"
        );
        assert_eq!(
            f.check(&tcp(IOT, 23, OPS, 40003, ACK), Direction::Out, t),
            Verdict::Drop(Reason::NoFlow)
        );
        assert_eq!(
            f.check(&tcp(OPS, 40004, IOT, 22, RST), Direction::In, t),
            Verdict::Drop(Reason::NoFlow)
        );
        assert_eq!(
            f.check(&tcp(OPS, 40005, IOT, 23, ACK), Direction::In, t),
            Verdict::Drop(Reason::NoFlow)
        );
        // A packet of the flow travelling the reply's way, with the opener's addresses: spoofed.
        assert_eq!(
            f.check(&tcp(OPS, 40000, IOT, 22, ACK), Direction::Out, t),
            Verdict::Drop(Reason::WrongWay)
        );
        // Ping: request opens, reply passes; an unasked reply does not.
        assert_eq!(
            f.check(&echo(OPS, IOT, 9, false), Direction::In, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&echo(IOT, OPS, 9, true), Direction::Out, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&echo(IOT, OPS, 10, false), Direction::Out, t),
            Verdict::Drop(Reason::NoRule)
        );
        assert_eq!(
            f.check(&echo(OPS, IOT, 11, true), Direction::In, t),
            Verdict::Drop(Reason::NoFlow)
        );
        // An echo request the other way with the flow's identifier is no reply to it.
        assert_eq!(
            f.check(&echo(IOT, OPS, 9, false), Direction::Out, t),
            Verdict::Drop(Reason::NoRule)
        );
        let s = f.stats();
        assert_eq!((s.opened, s.picked_up), (3, 1));
        assert_eq!(s.opened_by_rule.get(&1), Some(&2));
        assert_eq!(s.dropped(Reason::NoRule), 4);
        assert_eq!(s.dropped(Reason::NoFlow), 4);
        assert_eq!(s.dropped(Reason::WrongWay), 1);
        assert_eq!(s.passed, 8);
        // Of the drops, those that came from the tunnel.
        assert_eq!(s.dropped_in(Reason::NoRule), 1);
        assert_eq!(s.dropped_in(Reason::NoFlow), 3);
        assert_eq!(f.unconfirmed(), 0);
        assert_eq!(s.dropped_in(Reason::WrongWay), 0);
    }

    /// A device of ops's site that has no flow of its own.
    const GUEST: Ipv4Addr = Ipv4Addr::new(100, 64, 1, 20);

    /// Whether `packet` passes travelling `dir`, at `t`.
    fn passes(f: &mut Filter, packet: &[u8], dir: Direction, t: Instant) -> Verdict {
        f.check(packet, dir, t)
    }

    /// An ICMP error passes only as conntrack's RELATED: about a flow we keep, sent back to
    /// the quoted packet's source by its destination, against the way that packet went, of
    /// a type that answers a flow, at most 576 bytes. Filter at ops's end (ops opens Out).
    #[test]
    fn icmp_errors_pass_only_when_they_answer_the_flow_they_quote() {
        let mut f = filter();
        let t = Instant::now();
        let sent = udp(OPS, 5555, IOT, 5000);
        assert_eq!(f.check(&sent, Direction::Out, t), Verdict::Pass);
        let reply = udp(IOT, 5000, OPS, 5555);
        assert_eq!(f.check(&reply, Direction::In, t), Verdict::Pass);
        let (out, inn) = (Direction::Out, Direction::In);
        let forged = Verdict::Drop(Reason::ForgedError);
        let cases: Vec<(&str, Vec<u8>, Direction, Verdict)> = vec![
            // The camera's port is closed; a hop ran out of TTL; a parameter problem.
            (
                "unreachable",
                icmp_error(IOT, OPS, 3, &sent),
                inn,
                Verdict::Pass,
            ),
            (
                "time exceeded",
                icmp_error(IOT, OPS, 11, &sent),
                inn,
                Verdict::Pass,
            ),
            (
                "parameter problem",
                icmp_error(IOT, OPS, 12, &sent),
                inn,
                Verdict::Pass,
            ),
            // Ops's host reports on the camera's reply: back Out to the camera.
            (
                "about a reply",
                icmp_error(OPS, IOT, 3, &reply),
                out,
                Verdict::Pass,
            ),
            // To another device of ops's site, which has no flow (the finding).
            (
                "to a bystander",
                icmp_error(IOT, GUEST, 3, &sent),
                inn,
                forged,
            ),
            (
                "to a bystander, ttl",
                icmp_error(IOT, GUEST, 11, &sent),
                inn,
                forged,
            ),
            // From a third device behind the camera's gateway, not an end of the flow.
            (
                "from a third device",
                icmp_error(IOT2, OPS, 3, &sent),
                inn,
                forged,
            ),
            // The way the quoted packet went: a device of ours posing as the camera, or an
            // error about ops's packet arriving from the tunnel towards the camera.
            (
                "the quoted packet's way",
                icmp_error(IOT, OPS, 3, &sent),
                out,
                forged,
            ),
            (
                "about a reply, wrong way",
                icmp_error(OPS, IOT, 3, &reply),
                inn,
                forged,
            ),
            // Types no flow receives.
            ("redirect", icmp_error(IOT, OPS, 5, &sent), inn, forged),
            ("source quench", icmp_error(IOT, OPS, 4, &sent), inn, forged),
            // 1,000 bytes of the sender's own after the quote: no error is that long.
            (
                "oversize",
                icmp_error_with(IOT, OPS, 3, &sent, &[0x41; 1000]),
                inn,
                forged,
            ),
            // An error in fragments (no error needs them).
            (
                "fragmented",
                frag(icmp_error_with(IOT, OPS, 3, &sent, &[0; 4]), 9, 0, true),
                inn,
                forged,
            ),
            // About no flow; about an error (none is sent about one, RFC 1122); about a
            // later fragment (no ports).
            (
                "about no flow",
                icmp_error(IOT2, OPS, 3, &udp(OPS, 1, IOT2, 9)),
                inn,
                Verdict::Drop(Reason::Stray),
            ),
            (
                "about a later fragment",
                icmp_error(IOT, OPS, 3, &frag(sent.clone(), 4, 8, false)),
                inn,
                Verdict::Drop(Reason::Stray),
            ),
        ];
        for (what, packet, dir, verdict) in cases {
            assert_eq!(passes(&mut f, &packet, dir, t), verdict, "{what}");
        }
        // An echo flow: the error about the request comes back; one about the reply goes.
        let ping = echo(OPS, IOT, 44, false);
        assert_eq!(f.check(&ping, out, t), Verdict::Pass);
        assert_eq!(
            f.check(&icmp_error(IOT, OPS, 3, &ping), inn, t),
            Verdict::Pass
        );
        assert_eq!(f.check(&icmp_error(IOT, GUEST, 3, &ping), inn, t), forged);
        // No error is sent about an error (RFC 1122 §3.2.2), even one whose bytes where an
        // echo has its identifier name the echo flow's.
        let mut error = icmp_error(OPS, IOT, 3, &sent);
        error[24..26].copy_from_slice(&44u16.to_be_bytes());
        assert_eq!(
            f.check(&icmp_error(IOT, OPS, 3, &error), inn, t),
            Verdict::Drop(Reason::Stray),
            "about an error"
        );
        // A flow that timed out has no errors either.
        let later = t + Timeouts::default().datagram_replied + Duration::from_secs(1);
        assert_eq!(
            f.check(&icmp_error(IOT, OPS, 3, &sent), inn, later),
            Verdict::Drop(Reason::Stray)
        );
        assert_eq!(f.stats().dropped(Reason::ForgedError), 10);
        assert_eq!(f.stats().dropped_in(Reason::ForgedError), 9);
        assert_eq!(
            f.check(&[0x45, 0], Direction::In, t),
            Verdict::Drop(Reason::Malformed)
        );
    }

    /// Issue 53: one rule names a device's IPv4 and IPv6 blocks, and the filter holds IPv6
    /// as it holds IPv4: ops opens to iot over both families, iot opens to ops over
    /// neither; a rule of one family lets nothing of the other through; ICMPv6 errors
    /// follow their flow; fragments follow their first; refused extension headers are
    /// counted under their own reason.
    #[test]
    fn ipv6_flows_are_judged_as_ipv4_ones_by_the_same_rules() {
        use std::net::Ipv6Addr;
        const OPS6: Ipv6Addr = Ipv6Addr::new(0xfd7a, 0, 1, 0x100, 0, 0, 0, 9);
        const IOT6: Ipv6Addr = Ipv6Addr::new(0xfd7a, 0, 1, 0x200, 0, 0, 0, 7);
        let mut rules = ops_to_iot();
        for r in &mut rules.rules {
            r.from.push(net("fd7a:0:1:100::/56"));
            r.to.push(net("fd7a:0:1:200::/56"));
        }
        let mut f = Filter::new(rules, 1000, Timeouts::default());
        let t = Instant::now();
        let (out, inn) = (Direction::Out, Direction::In);
        // Both families, the same rule.
        assert_eq!(
            f.check(&tcp(OPS, 40000, IOT, 22, SYN), inn, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&tcp6(OPS6, 40000, IOT6, 22, SYN), inn, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&tcp6(IOT6, 22, OPS6, 40000, SYN | ACK), out, t),
            Verdict::Pass
        );
        // Refused over both.
        assert_eq!(
            f.check(&tcp(IOT, 41000, OPS, 22, SYN), out, t),
            Verdict::Drop(Reason::NoRule)
        );
        assert_eq!(
            f.check(&tcp6(IOT6, 41000, OPS6, 22, SYN), out, t),
            Verdict::Drop(Reason::NoRule)
        );
        assert_eq!(
            f.check(&tcp6(OPS6, 40001, IOT6, 23, SYN), inn, t),
            Verdict::Drop(Reason::NoRule)
        );
        // ICMP rules cover ICMPv6 echo; a reply alone opens nothing.
        assert_eq!(f.check(&echo6(OPS6, IOT6, 4, false), inn, t), Verdict::Pass);
        assert_eq!(f.check(&echo6(IOT6, OPS6, 4, true), out, t), Verdict::Pass);
        assert_eq!(
            f.check(&echo6(IOT6, OPS6, 5, true), out, t),
            Verdict::Drop(Reason::NoFlow)
        );
        // An ICMPv6 error about the flow, back from its destination: passes; from anyone
        // else, forged.
        let syn = tcp6(OPS6, 40000, IOT6, 22, SYN);
        assert_eq!(
            f.check(&icmp6_error(IOT6, OPS6, 2, &syn), out, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&icmp6_error(V6A, OPS6, 2, &syn), out, t),
            Verdict::Drop(Reason::ForgedError)
        );
        // A rule of IPv4 blocks only lets no IPv6 through.
        let mut v4_only = Filter::new(ops_to_iot(), 1000, Timeouts::default());
        assert_eq!(
            v4_only.check(&tcp6(OPS6, 40000, IOT6, 22, SYN), inn, t),
            Verdict::Drop(Reason::NoRule)
        );
        // A datagram in two fragments: its later piece follows its first; another
        // identification's does not; an overlap spoils it.
        let first = ext(
            &udp6_with(OPS6, 5555, IOT6, 5000, 16),
            44,
            &fragment6(0, true, 0x1_0001),
        );
        assert_eq!(f.check(&first, out, t), Verdict::Pass);
        let piece = |offset, id| {
            ext(
                &ipv6(17, OPS6, IOT6, &[0; 16]),
                44,
                &fragment6(offset, true, id),
            )
        };
        assert_eq!(f.check(&piece(24, 0x1_0001), out, t), Verdict::Pass);
        assert_eq!(
            f.check(&piece(24, 0x2_0001), out, t),
            Verdict::Drop(Reason::Fragment)
        );
        assert_eq!(
            f.check(&piece(32, 0x1_0001), out, t),
            Verdict::Drop(Reason::Fragment),
            "overlaps the piece at 24"
        );
        // Refused extension headers, counted as such.
        let routed = ext(&udp6(OPS6, 5555, IOT6, 5000), 43, &[0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(f.check(&routed, inn, t), Verdict::Drop(Reason::Extension));
        assert_eq!(f.stats().dropped_in(Reason::Extension), 1);
        assert_eq!(Reason::Extension.name(), "extension_header");
    }

    /// A later fragment passes only when the first fragment of its own datagram (same
    /// protocol, addresses and IP identification) passed the same way, in any order after
    /// it; overlaps spoil the datagram; nothing passes past the timeout.
    #[test]
    fn later_fragments_follow_their_own_first_fragment() {
        let mut f = filter();
        let t = Instant::now();
        let (out, inn) = (Direction::Out, Direction::In);
        let lost = Verdict::Drop(Reason::Fragment);
        // Ops has a flow with the camera: tcp/22.
        assert_eq!(
            f.check(&tcp(OPS, 40000, IOT, 22, SYN), inn, t),
            Verdict::Pass
        );
        // A lone TCP fragment at offset 800 between the two, no first fragment ever sent.
        let lone = fragment(6, OPS, IOT, 100, 800, &[0; 64], false);
        assert_eq!(f.check(&lone, inn, t), lost, "lone");
        // A SYN to port 80 in two fragments: its first is dropped by the rules, and so is
        // the rest.
        let syn80 = frag(tcp_with(OPS, 40001, IOT, 80, SYN, &[0; 4]), 101, 0, true);
        assert_eq!(f.check(&syn80, inn, t), Verdict::Drop(Reason::NoRule));
        let rest80 = fragment(6, OPS, IOT, 101, 24, &[0; 64], false);
        assert_eq!(
            f.check(&rest80, inn, t),
            lost,
            "the rest of a denied datagram"
        );
        // An allowed datagram in three pieces, its last before its middle.
        let first = frag(udp_with(OPS, 5555, IOT, 5000, &[0; 16]), 102, 0, true);
        assert_eq!(f.check(&first, out, t), Verdict::Pass);
        assert_eq!(f.datagrams(), 1);
        let last = fragment(17, OPS, IOT, 102, 48, &[0; 8], false);
        let middle = fragment(17, OPS, IOT, 102, 24, &[0; 24], true);
        assert_eq!(f.check(&last, out, t), Verdict::Pass, "the last");
        assert_eq!(f.check(&middle, out, t), Verdict::Pass, "the middle");
        assert_eq!(f.datagrams(), 0, "whole: forgotten");
        assert_eq!(f.check(&middle, out, t), lost, "a copy after it was whole");
        // A later fragment before its first is lost; after the first, the rest passes.
        let early = fragment(17, OPS, IOT, 103, 24, &[0; 8], false);
        assert_eq!(f.check(&early, out, t), lost, "before its first");
        let first = frag(udp_with(OPS, 5555, IOT, 5000, &[0; 8]), 103, 0, true);
        assert_eq!(f.check(&first, out, t), Verdict::Pass);
        let second = fragment(17, OPS, IOT, 103, 16, &[0; 8], true);
        assert_eq!(f.check(&second, out, t), Verdict::Pass);
        // The other way, the datagram is not known.
        let back = fragment(17, OPS, IOT, 103, 32, &[0; 8], false);
        assert_eq!(f.check(&back, inn, t), lost, "the other way");
        // An overlap (RFC 1858: the TCP header's flags rewritten at offset 8) spoils it.
        let overlap = fragment(17, OPS, IOT, 103, 8, &[0; 16], true);
        assert_eq!(f.check(&overlap, out, t), lost, "overlap");
        assert_eq!(
            f.check(&back, out, t),
            lost,
            "the rest of a spoilt datagram"
        );
        // After the reassembly timeout nothing of a datagram passes.
        let first = frag(udp_with(OPS, 5555, IOT, 5000, &[0; 8]), 104, 0, true);
        assert_eq!(f.check(&first, out, t), Verdict::Pass);
        let tail = fragment(17, OPS, IOT, 104, 16, &[0; 8], false);
        let late = t + Timeouts::default().fragment;
        assert_eq!(f.check(&tail, out, late), lost, "timed out");
        f.expire(late);
        assert_eq!(f.datagrams(), 0);
        // Fragments that cannot be true ones: past 65,535 bytes, not a multiple of 8.
        for (offset, len) in [(8191 * 8, 100), (8180 * 8, 1400), (8100 * 8, 1500)] {
            let p = fragment(17, OPS, IOT, 105, offset, &vec![0; len], true);
            assert_eq!(
                f.check(&p, out, t),
                Verdict::Drop(Reason::Malformed),
                "{offset} {len}"
            );
        }
        let odd = fragment(17, OPS, IOT, 105, 8, &[0; 7], true);
        assert_eq!(f.check(&odd, out, t), Verdict::Drop(Reason::Malformed));
        let s = f.stats();
        assert_eq!(
            (s.dropped(Reason::Fragment), s.dropped(Reason::Malformed)),
            (8, 4)
        );
    }

    /// A rule set that cuts a flow drops what is left of its fragmented datagrams.
    #[test]
    fn a_cut_flow_takes_its_fragments_with_it() {
        let mut f = filter();
        let t = Instant::now();
        let first = frag(udp_with(OPS, 5555, IOT, 5005, &[0; 8]), 7, 0, true);
        assert_eq!(f.check(&first, Direction::Out, t), Verdict::Pass);
        let mut rules = ops_to_iot();
        rules.rules.retain(|r| r.id != 3);
        assert_eq!(f.set_rules(rules), 1);
        let rest = fragment(17, OPS, IOT, 7, 16, &[0; 8], false);
        assert_eq!(
            f.check(&rest, Direction::Out, t),
            Verdict::Drop(Reason::Fragment)
        );
    }

    /// Flows time out by what they have seen; a reset connection goes soon.
    #[test]
    fn flows_time_out() {
        let mut f = filter();
        let t = Instant::now();
        let to = Timeouts::default();
        assert_eq!(
            f.check(&udp(OPS, 5555, IOT, 5000), Direction::Out, t),
            Verdict::Pass
        );
        // Unanswered: gone after `datagram`.
        let later = t + to.datagram + Duration::from_millis(1);
        assert_eq!(
            f.check(&udp(IOT, 5000, OPS, 5555), Direction::In, later),
            Verdict::Drop(Reason::NoRule)
        );
        // Answered, it lives longer.
        assert_eq!(
            f.check(&udp(OPS, 5556, IOT, 5000), Direction::Out, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&udp(IOT, 5000, OPS, 5556), Direction::In, t),
            Verdict::Pass
        );
        let t2 = t + to.datagram * 2;
        assert_eq!(
            f.check(&udp(IOT, 5000, OPS, 5556), Direction::In, t2),
            Verdict::Pass
        );
        // TCP: open for hours, reset for seconds.
        assert_eq!(
            f.check(&tcp(OPS, 40000, IOT, 22, SYN), Direction::Out, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&tcp(IOT, 22, OPS, 40000, SYN | ACK), Direction::In, t),
            Verdict::Pass
        );
        let hour = t + Duration::from_secs(3600);
        assert_eq!(
            f.check(&tcp(OPS, 40000, IOT, 22, ACK), Direction::Out, hour),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&tcp(IOT, 22, OPS, 40000, RST | ACK), Direction::In, hour),
            Verdict::Pass
        );
        let after = hour + to.tcp_reset + Duration::from_millis(1);
        assert_eq!(f.flows(), 2);
        assert_eq!(f.expire(hour), 1, "the UDP flow, idle for an hour");
        assert_eq!(f.expire(after), 1, "the reset connection");
        assert_eq!(f.flows(), 0);
        // Gone: the opener's segments are taken up again (the rule still lets it open the
        // connection).
        assert_eq!(
            f.check(&tcp(OPS, 40000, IOT, 22, ACK), Direction::Out, after),
            Verdict::Pass
        );
        assert_eq!(f.stats().picked_up, 1);
        // Taken up from the answering side, nothing from the opener's: it waits no longer
        // than UNCONFIRMED_FOR.
        assert_eq!(
            f.check(&tcp(IOT, 22, OPS, 40001, ACK), Direction::In, after),
            Verdict::Pass
        );
        assert_eq!(f.unconfirmed(), 1);
        f.expire(after + UNCONFIRMED_FOR);
        assert_eq!((f.unconfirmed(), f.stats().picked_up_refused), (0, 1));
    }

    /// A connection this end has no flow of, seen first from its answering side (the data of
    /// a download ops began, arriving after a failover): its segments pass, unconfirmed,
    /// until ops's side answers; then it is kept as any other. When ops's side answers with
    /// a RST (it has no such connection: iot probing from an allowed port), the RST goes no
    /// further and nothing more of iot's passes. The table of such connections is bounded
    /// apart from the flows.
    #[test]
    fn a_connection_seen_first_from_its_answering_side_waits_for_its_opener() {
        let mut f = filter();
        let t = Instant::now();
        // At ops's end: ops opened tcp/22 to iot before this end knew it.
        let data = tcp(IOT, 22, OPS, 40000, ACK);
        assert_eq!(f.check(&data, Direction::In, t), Verdict::Pass);
        assert_eq!(f.check(&data, Direction::In, t), Verdict::Pass);
        assert_eq!((f.flows(), f.unconfirmed()), (0, 1));
        // The answering side's addresses travelling the opener's way: spoofed.
        assert_eq!(
            f.check(&tcp(IOT, 22, OPS, 40000, ACK), Direction::Out, t),
            Verdict::Drop(Reason::WrongWay)
        );
        // Ops acknowledges: confirmed, kept, both ways.
        assert_eq!(
            f.check(&tcp(OPS, 40000, IOT, 22, ACK), Direction::Out, t),
            Verdict::Pass
        );
        assert_eq!((f.flows(), f.unconfirmed()), (1, 0));
        assert_eq!(f.stats().picked_up, 1);
        // A probe: iot sends from port 22 to a port of ops's where nothing listens; ops's
        // RST is dropped, and iot's next segment is no flow's.
        let probe = tcp(IOT, 22, OPS, 40100, ACK);
        assert_eq!(f.check(&probe, Direction::In, t), Verdict::Pass);
        assert_eq!(
            f.check(&tcp(OPS, 40100, IOT, 22, RST), Direction::Out, t),
            Verdict::Drop(Reason::NoFlow)
        );
        assert_eq!(f.stats().picked_up_refused, 1);
        assert_eq!(f.unconfirmed(), 0);
        // From a port no rule lets ops open: no flow, as before.
        assert_eq!(
            f.check(&tcp(IOT, 23, OPS, 40101, ACK), Direction::In, t),
            Verdict::Drop(Reason::NoFlow)
        );
        // A member sending from an allowed port to every port of ops's: the waiting table
        // stays at its size and the confirmed flow is kept.
        for port in 0..1000u16 {
            let p = tcp(IOT, 22, OPS, 50_000 + port, ACK);
            assert_eq!(f.check(&p, Direction::In, t), Verdict::Pass);
            assert!(f.unconfirmed() <= UNCONFIRMED);
        }
        assert_eq!(f.flows(), 1);
        assert_eq!(
            f.check(&tcp(OPS, 40000, IOT, 22, ACK), Direction::Out, t),
            Verdict::Pass
        );
        assert!(f.unconfirmed_order.keys.len() <= 2 * UNCONFIRMED);
        // The confirmed one lives as long as an open connection does, not UNCONFIRMED_FOR.
        let later = t + UNCONFIRMED_FOR * 2;
        assert_eq!(f.check(&data, Direction::In, later), Verdict::Pass);
        // A rule set that no longer allows tcp/22 cuts the waiting ones too.
        let mut rules = ops_to_iot();
        rules.rules.retain(|r| r.id != 1);
        f.set_rules(rules);
        assert_eq!(f.unconfirmed(), 0);
    }

    /// A rule removed cuts its flows at once; a rule added lets new flows through at once.
    #[test]
    fn a_new_rule_set_cuts_what_it_no_longer_allows() {
        let mut f = filter();
        let t = Instant::now();
        assert_eq!(
            f.check(&tcp(OPS, 40000, IOT, 22, SYN), Direction::Out, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&echo(OPS, IOT, 3, false), Direction::Out, t),
            Verdict::Pass
        );
        // ssh no longer allowed, ping still.
        let mut rules = ops_to_iot();
        rules.rules.retain(|r| r.id != 1);
        rules.version = 2;
        assert_eq!(f.set_rules(rules), 1);
        assert_eq!(f.stats().cut, 1);
        assert_eq!(
            f.check(&tcp(IOT, 22, OPS, 40000, SYN | ACK), Direction::In, t),
            Verdict::Drop(Reason::NoFlow)
        );
        assert_eq!(
            f.check(&echo(IOT, OPS, 3, true), Direction::In, t),
            Verdict::Pass
        );
        // iot may now open ssh to ops.
        let mut rules = ops_to_iot();
        rules.rules.push(Rule {
            id: 9,
            from: vec![net("100.64.2.0/24")],
            to: vec![net("100.64.1.0/24")],
            proto: Proto::Tcp,
            ports: vec![22..=22],
        });
        f.set_rules(rules);
        assert_eq!(
            f.check(&tcp(IOT, 41000, OPS, 22, SYN), Direction::Out, t),
            Verdict::Pass
        );
        assert_eq!(f.rules().version, 1);
    }

    /// Many short flows: the table stays at its size, the oldest go first, counted.
    #[test]
    fn a_full_table_evicts_the_oldest_flows() {
        let mut f = Filter::new(ops_to_iot(), 100, Timeouts::default());
        let t = Instant::now();
        for port in 0..1000u16 {
            let p = udp(OPS, 10_000 + port, IOT, 5000);
            assert_eq!(f.check(&p, Direction::Out, t), Verdict::Pass);
            assert!(f.flows() <= 100);
        }
        assert_eq!(f.flows(), 100);
        assert_eq!(f.stats().evicted, 900);
        // The newest are kept, the oldest are not.
        assert_eq!(
            f.check(&udp(IOT, 5000, OPS, 10_999), Direction::In, t),
            Verdict::Pass
        );
        assert_eq!(
            f.check(&udp(IOT, 5000, OPS, 10_000), Direction::In, t),
            Verdict::Drop(Reason::NoRule)
        );
        assert!(f.order.keys.len() <= 2 * 100 + 64);
    }

    proptest::proptest! {
        /// Whatever arrives, in any order and direction: no panic, the tables within their
        /// bounds, and every ICMP error or later fragment that passes one the rules let
        /// through: an error sent back to its quoted packet's source by that packet's
        /// destination, of a type that answers flows; a later fragment whose own first
        /// fragment passed before it, the same way.
        #[test]
        fn any_traffic_keeps_the_tables_bounded_and_passes_only_related_packets(
            packets in proptest::collection::vec(
                (0u8..7, 0u16..6, 0u16..6, proptest::prelude::any::<bool>(), 0u8..0x20),
                0..400,
            ),
        ) {
            let mut f = Filter::new(ops_to_iot(), 16, Timeouts::default());
            let t = Instant::now();
            let mut firsts = std::collections::HashSet::new();
            for (i, (kind, a, b, inbound, flags)) in packets.into_iter().enumerate() {
                let (src, dst) = if i % 2 == 0 { (OPS, IOT) } else { (IOT, OPS) };
                let (from, to) = match b % 3 {
                    0 => (dst, src),
                    1 => (dst, GUEST),
                    _ => (IOT2, src),
                };
                let error_kind = [3, 5, 11, 4][usize::from(flags % 4)];
                let id = a % 3;
                let p = match kind {
                    0 => tcp(src, 40000 + a, dst, 20 + b, flags),
                    1 => udp(src, 5000 + a, dst, 5000 + b),
                    2 => echo(src, dst, a, b % 2 == 0),
                    3 => icmp_error(from, to, error_kind, &udp(src, 5000 + a, dst, 5000 + b)),
                    4 => icmp_error(from, to, error_kind, &tcp(src, 40000 + a, dst, 20 + b, flags)),
                    5 => frag(udp_with(src, 5000 + a, dst, 5000 + b, &[0; 8]), id, 0, true),
                    _ => fragment(17, src, dst, id, 16 + 8 * u32::from(b), &[0; 8], flags % 2 == 0),
                };
                let dir = if inbound { Direction::In } else { Direction::Out };
                let now = t + Duration::from_secs(u64::from(a));
                let verdict = f.check(&p, dir, now);
                proptest::prop_assert!(f.flows() <= 16);
                proptest::prop_assert!(f.unconfirmed() <= UNCONFIRMED);
                proptest::prop_assert!(f.datagrams() <= fragment_capacity(16));
                if verdict != Verdict::Pass {
                    continue;
                }
                match kind {
                    3 | 4 => {
                        proptest::prop_assert!(FLOW_ERRORS.contains(&error_kind));
                        proptest::prop_assert_eq!((from, to), (dst, src));
                    }
                    5 => {
                        firsts.insert((src, dst, id, dir));
                    }
                    6 => proptest::prop_assert!(firsts.contains(&(src, dst, id, dir))),
                    _ => {}
                }
            }
        }
    }
}

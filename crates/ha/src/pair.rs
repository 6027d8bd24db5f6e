//! Who serves (docs/protocol.md §5, *Deciding who serves*): one box's view of the pair, as a
//! state machine driven by the heartbeats it opens and by time. No clock, no socket, no
//! randomness: the caller passes `now`, the wall clock and fresh challenges in.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::msg::{Boot, Challenge, Health, Heartbeat, Role};

/// How often each box sends a heartbeat.
pub const INTERVAL: Duration = Duration::from_millis(100);
/// How long without a proof of life before the other box counts as gone.
pub const DEAD: Duration = Duration::from_millis(300);
/// How long an active box hands over before it gives up and goes on serving.
pub const HANDOVER: Duration = Duration::from_secs(3);
/// How long an active box must have lacked reach, where we have it and are otherwise no
/// healthier, before we take over: the two boxes probe at their own moments, so when a
/// target stops answering both, one's reach goes up to a few seconds before the other's.
pub const REACH_HOLD: Duration = Duration::from_secs(5);
/// How many of our own challenges an echo may answer.
const CHALLENGES: usize = 4;

/// One box's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// `[ha] priority` (1-254).
    pub priority: u8,
    /// `[ha] preempt`: take the gateway back when healthy and of higher priority.
    pub preempt: bool,
    /// The LAN NIC's own MAC: the last tie-break, and how the other box is told apart.
    pub mac: [u8; 6],
}

/// Why the role changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Nothing else of the pair was heard while starting.
    Alone,
    /// Neither box served, and this one has the precedence (or the other has it).
    Precedence,
    /// An active box proved itself alive.
    ActiveHeard,
    /// The active box gave no proof of life for [`DEAD`].
    ActiveSilent,
    /// The active box's health is worse than ours.
    ActiveUnhealthy,
    /// We have the higher priority, equal health, and preempt.
    Preempted,
    /// Another active box with the precedence over us proved itself alive.
    ActiveWithPrecedence,
    /// A planned handover (`cyphonic-adapter handover`): the active box asked the standby
    /// to take the gateway, and it did.
    HandedOver,
}

/// Why the active box will not hand over now (it goes on serving).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoHandover {
    /// This box does not serve.
    NotActive,
    /// No proof of life from the other box in the last [`DEAD`].
    OtherSilent,
    /// The other box is not a standby.
    OtherNotStandby,
    /// The other box lacks a health bit this one has.
    OtherLessHealthy,
    /// The other box does not hold our lease table yet.
    LeasesBehind,
    /// A handover asked before is still under way.
    UnderWay,
}

impl NoHandover {
    /// For the operator.
    pub const fn describe(self) -> &'static str {
        match self {
            Self::NotActive => "this box does not serve the gateway",
            Self::OtherSilent => "the other box gave no proof of life in the last 300 ms",
            Self::OtherNotStandby => "the other box is not standing by",
            Self::OtherLessHealthy => "the other box is less healthy than this one",
            Self::LeasesBehind => "the other box does not hold this box's lease table yet",
            Self::UnderWay => "a handover is under way",
        }
    }
}

impl Reason {
    /// For logs and status.
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Alone => "nothing else of the pair heard",
            Self::Precedence => "no box served; decided by precedence",
            Self::ActiveHeard => "the active box is alive",
            Self::ActiveSilent => "the active box went silent",
            Self::ActiveUnhealthy => "the active box is less healthy",
            Self::Preempted => "higher priority, preempt on",
            Self::ActiveWithPrecedence => "another active box has the precedence",
            Self::HandedOver => "handed over (planned)",
        }
    }
}

/// A change of role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Serve the gateway from now on, in `term`.
    Active {
        /// The pair's term this box serves in.
        term: u64,
        /// Why.
        reason: Reason,
    },
    /// Stop serving (or do not start).
    Standby {
        /// Why.
        reason: Reason,
    },
}

/// What we last heard of the other box.
#[derive(Debug, Clone, Copy)]
struct Other {
    mac: [u8; 6],
    boot: Boot,
    beat: Heartbeat,
    /// When its last heartbeat that echoed one of our challenges came.
    proof: Option<Instant>,
}

/// One box's view of the pair.
#[derive(Debug)]
pub struct Pair {
    cfg: Config,
    role: Role,
    term: u64,
    health: Health,
    since: Instant,
    sent: VecDeque<(Challenge, Instant)>,
    other: Option<Other>,
    /// When an active other box last proved itself alive.
    active_proof: Option<Instant>,
    next_beat: Instant,
    events: VecDeque<Event>,
    newest_clock_ns: u64,
    leases_version: u64,
    /// While we hand the gateway over: until when.
    handing_over: Option<Instant>,
    /// The other box's NIC MAC, from its heartbeats or an earlier start ([`Pair::know_other`]).
    known: Option<[u8; 6]>,
    /// Since when the active box has lacked reach where we have it, all else equal.
    reach_better: Option<Instant>,
}

impl Pair {
    /// A box starting now with `health`.
    pub fn new(cfg: Config, health: Health, now: Instant) -> Self {
        Self {
            cfg,
            role: Role::Starting,
            term: 0,
            health,
            since: now,
            sent: VecDeque::with_capacity(CHALLENGES),
            other: None,
            active_proof: None,
            next_beat: now,
            events: VecDeque::new(),
            newest_clock_ns: 0,
            leases_version: 0,
            handing_over: None,
            known: None,
            reach_better: None,
        }
    }

    /// The other box's NIC MAC as an earlier start of ours knew it (the driver keeps it on
    /// disk): the halves of the pool are known before the two are in contact again.
    pub fn know_other(&mut self, mac: [u8; 6]) {
        if mac != self.cfg.mac {
            self.known = Some(mac);
        }
    }

    /// The other box's NIC MAC, if it was ever known.
    pub const fn known_other(&self) -> Option<[u8; 6]> {
        self.known
    }

    /// Whether new DHCP addresses are this box's from the pool's lower half (`Some(true)`)
    /// or its upper half (docs/protocol.md §5, *Split brain*): the box with the lower NIC MAC
    /// takes the lower half, so that the two agree without a word. `None` while the other
    /// box was never known.
    pub fn lower_half(&self) -> Option<bool> {
        self.known.map(|other| self.cfg.mac < other)
    }

    /// Our settings.
    pub const fn config(&self) -> &Config {
        &self.cfg
    }

    /// Our role now.
    pub const fn role(&self) -> Role {
        self.role
    }

    /// The pair's term as we know it.
    pub const fn term(&self) -> u64 {
        self.term
    }

    /// The newest wall clock (unix ns) the other box's heartbeats carried: a new active box
    /// stamps no handshake below it (docs/protocol.md §5).
    pub const fn newest_clock_ns(&self) -> u64 {
        self.newest_clock_ns
    }

    /// Whether the other box proved itself alive in the last [`DEAD`].
    pub fn in_contact(&self, now: Instant) -> bool {
        self.alive(now).is_some()
    }

    /// The other box's last heartbeat and its NIC MAC, if any was heard.
    pub fn other(&self) -> Option<([u8; 6], Heartbeat)> {
        self.other.map(|o| (o.mac, o.beat))
    }

    /// Our health, as last judged.
    pub const fn health(&self) -> Health {
        self.health
    }

    /// Our health, judged now: a change is said to the other box at once (the next
    /// heartbeat is due now), not at the next interval.
    pub fn set_health(&mut self, health: Health, now: Instant) {
        if health != self.health {
            self.next_beat = now;
        }
        self.health = health;
        self.decide(now);
    }

    /// The lease table version we hold (said in our heartbeats).
    pub const fn leases_version(&self) -> u64 {
        self.leases_version
    }

    /// We hold lease table `version` now: a change is said at once (the next heartbeat is
    /// due now), so that a standby's heartbeat acknowledges a table as soon as it is kept
    /// (docs/protocol.md §5, *State that moves*).
    pub fn set_leases_version(&mut self, version: u64, now: Instant) {
        if version != self.leases_version {
            self.next_beat = now;
        }
        self.leases_version = version;
    }

    /// Hands the gateway to the other box (docs/protocol.md §5, *Planned handover*): our
    /// heartbeats say so for up to [`HANDOVER`], and we stand down (reason
    /// [`Reason::HandedOver`]) at the first proof of life of the other box as the active one.
    ///
    /// # Errors
    /// Why the other box cannot take the gateway now; nothing changes.
    pub fn hand_over(&mut self, now: Instant) -> Result<(), NoHandover> {
        if self.role != Role::Active {
            return Err(NoHandover::NotActive);
        }
        if self.is_handing_over(now) {
            return Err(NoHandover::UnderWay);
        }
        let o = self.alive(now).ok_or(NoHandover::OtherSilent)?;
        if o.beat.role != Role::Standby {
            return Err(NoHandover::OtherNotStandby);
        }
        if o.beat.health.bits() & self.health.bits() != self.health.bits() {
            return Err(NoHandover::OtherLessHealthy);
        }
        if o.beat.leases_version != self.leases_version {
            return Err(NoHandover::LeasesBehind);
        }
        self.handing_over = Some(now + HANDOVER);
        self.next_beat = now;
        Ok(())
    }

    /// Whether we are handing the gateway over now.
    pub fn is_handing_over(&self, now: Instant) -> bool {
        self.handing_over.is_some_and(|until| now < until)
    }

    /// A heartbeat opened from the box with NIC MAC `from`, in its start `boot`. Returns
    /// whether it was a proof of life (it echoed one of our recent challenges).
    pub fn handle(&mut self, from: [u8; 6], boot: Boot, beat: &Heartbeat, now: Instant) -> bool {
        if from == self.cfg.mac {
            return false;
        }
        let proof = beat.echo != [0; 16]
            && self
                .sent
                .iter()
                .any(|(c, at)| *c == beat.echo && now.saturating_duration_since(*at) <= DEAD);
        let same = self.other.is_some_and(|o| o.mac == from && o.boot == boot);
        let earlier = if same {
            self.other.and_then(|o| o.proof)
        } else {
            None
        };
        self.known = Some(from);
        self.other = Some(Other {
            mac: from,
            boot,
            beat: *beat,
            proof: if proof { Some(now) } else { earlier },
        });
        if proof {
            self.newest_clock_ns = self.newest_clock_ns.max(beat.clock_ns);
            if beat.role == Role::Active {
                self.active_proof = Some(now);
                // A box that does not serve follows the term of the one that does; an
                // active one keeps its own until it stands down (the precedence decides).
                if self.role != Role::Active {
                    self.term = self.term.max(beat.term);
                }
            }
        }
        self.decide(now);
        proof
    }

    /// Time passed: decide again. The driver calls it far more often than [`INTERVAL`] (the
    /// adapter: every round of its socket's 10-ms receive timeout).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.decide(now);
    }

    /// The heartbeat to send now, if one is due: it carries `challenge` (16 fresh random
    /// bytes) and our wall clock `clock_ns`.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        clock_ns: u64,
        challenge: Challenge,
    ) -> Option<Heartbeat> {
        if now < self.next_beat {
            return None;
        }
        self.next_beat = now + INTERVAL;
        if self.sent.len() == CHALLENGES {
            self.sent.pop_front();
        }
        self.sent.push_back((challenge, now));
        Some(Heartbeat {
            role: self.role,
            health: self.health,
            priority: self.cfg.priority,
            preempt: self.cfg.preempt,
            handing_over: self.is_handing_over(now),
            term: self.term,
            clock_ns,
            challenge,
            echo: self.other.map_or([0; 16], |o| o.beat.challenge),
            leases_version: self.leases_version,
            nic: self.cfg.mac,
        })
    }

    /// The next change of role, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The other box, if it proved itself alive in the last [`DEAD`].
    fn alive(&self, now: Instant) -> Option<Other> {
        self.other.filter(|o| {
            o.proof
                .is_some_and(|p| now.saturating_duration_since(p) <= DEAD)
        })
    }

    /// Whether we come before `o` (docs/protocol.md §5: term, health but reach, priority,
    /// MAC).
    fn before(&self, o: &Other) -> bool {
        let rest = |h: Health| h.without(Health::REACHED).score();
        let ours = (
            self.term,
            rest(self.health),
            self.cfg.priority,
            self.cfg.mac,
        );
        let theirs = (o.beat.term, rest(o.beat.health), o.beat.priority, o.mac);
        ours > theirs
    }

    fn decide(&mut self, now: Instant) {
        let alive = self.alive(now);
        let active = alive.filter(|o| o.beat.role == Role::Active);
        match self.role {
            Role::Starting => {
                if active.is_some() {
                    self.standby(Reason::ActiveHeard, now);
                } else if now.saturating_duration_since(self.since) >= DEAD {
                    match alive {
                        Some(o) if self.before(&o) => self.activate(Reason::Precedence, now),
                        Some(_) => self.standby(Reason::Precedence, now),
                        None => self.activate(Reason::Alone, now),
                    }
                }
            }
            Role::Standby => {
                if !self.health.has(Health::LAN) {
                    return;
                }
                let last = self.active_proof.unwrap_or(self.since).max(self.since);
                match active {
                    Some(o)
                        if o.beat.handing_over && o.beat.leases_version == self.leases_version =>
                    {
                        self.activate(Reason::HandedOver, now);
                    }
                    Some(o) if self.healthier_than(o.beat.health, now) => {
                        self.activate(Reason::ActiveUnhealthy, now);
                    }
                    // Only once it holds the active's leases, and not while it has just
                    // started: a box back from a failure takes over nothing half-known.
                    Some(o)
                        if self.cfg.preempt
                            && o.beat.health.score() == self.health.score()
                            && self.cfg.priority > o.beat.priority
                            && o.beat.leases_version == self.leases_version
                            && now.saturating_duration_since(self.since) >= DEAD =>
                    {
                        self.activate(Reason::Preempted, now);
                    }
                    Some(_) => {}
                    None if now.saturating_duration_since(last) >= DEAD => {
                        self.activate(Reason::ActiveSilent, now);
                    }
                    None => {
                        if let Some(o) = alive
                            && self.before(&o)
                        {
                            self.activate(Reason::Precedence, now);
                        }
                    }
                }
            }
            Role::Active => {
                if let Some(o) = active
                    && !self.before(&o)
                {
                    let reason = if self.is_handing_over(now) {
                        Reason::HandedOver
                    } else {
                        Reason::ActiveWithPrecedence
                    };
                    self.standby(reason, now);
                }
            }
        }
    }

    /// Whether we, standing by, are healthier than the active box (`theirs`): at once for
    /// anything but reach; for reach alone once it has lasted [`REACH_HOLD`].
    fn healthier_than(&mut self, theirs: Health, now: Instant) -> bool {
        let ours = self.health;
        let (their_rest, our_rest) = (
            theirs.without(Health::REACHED).score(),
            ours.without(Health::REACHED).score(),
        );
        if their_rest != our_rest {
            self.reach_better = None;
            return their_rest < our_rest;
        }
        if theirs.score() < ours.score() {
            let since = *self.reach_better.get_or_insert(now);
            return now.saturating_duration_since(since) >= REACH_HOLD;
        }
        self.reach_better = None;
        false
    }

    fn activate(&mut self, reason: Reason, now: Instant) {
        let theirs = self.other.map_or(0, |o| o.beat.term);
        self.term = self.term.max(theirs) + 1;
        self.reach_better = None;
        self.role = Role::Active;
        self.since = now;
        self.next_beat = now;
        self.events.push_back(Event::Active {
            term: self.term,
            reason,
        });
    }

    fn standby(&mut self, reason: Reason, now: Instant) {
        if let Some(o) = self.alive(now) {
            self.term = self.term.max(o.beat.term);
        }
        self.reach_better = None;
        self.role = Role::Standby;
        self.handing_over = None;
        self.since = now;
        self.next_beat = now;
        self.events.push_back(Event::Standby { reason });
    }
}

//! Two boxes of a pair over a simulated link with a fake clock: each heartbeat is sealed by
//! its sender and opened by the other box, as on the wire; the link can drop each
//! direction, and a box can be stopped (killed, frozen) and resumed.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cyphonic_crypto::{PairKey, StaticKeypair};
use cyphonic_ha::msg::Body;
use cyphonic_ha::pair::{DEAD, HANDOVER, INTERVAL, REACH_HOLD};
use cyphonic_ha::{
    Config, Event, Health, Heartbeat, NoHandover, Opener, Pair, Reason, Role, Sealer,
};
use proptest::prelude::*;

const STEP: Duration = Duration::from_millis(10);

struct Box_ {
    pair: Pair,
    sealer: Sealer,
    opener: Opener,
    mac: [u8; 6],
    /// Stopped: sends, hears and decides nothing (SIGKILL or SIGSTOP).
    stopped: bool,
    events: Vec<Event>,
}

struct Sim {
    now: Instant,
    boxes: [Box_; 2],
    /// Whether each direction delivers (0 -> 1, 1 -> 0).
    link: [bool; 2],
    challenges: u64,
    /// Every message sealed, with its sender, to replay later.
    recorded: Vec<(usize, Vec<u8>)>,
    site: StaticKeypair,
}

fn pair_key_of(s: &Sim) -> PairKey {
    pair_key(&s.site)
}

fn site() -> StaticKeypair {
    StaticKeypair::generate().unwrap()
}

fn pair_key(site: &StaticKeypair) -> PairKey {
    PairKey::new(&StaticKeypair::from_secret(zeroize::Zeroizing::new(
        *site.secret(),
    )))
    .unwrap()
}

impl Sim {
    fn new(priorities: [u8; 2], preempt: bool) -> Self {
        let site = site();
        let now = Instant::now();
        let make = |i: usize| {
            let mac = [2, 0, 0, 0, 0, 1 + u8::try_from(i).unwrap()];
            Box_ {
                pair: Pair::new(
                    Config {
                        priority: priorities[i],
                        preempt,
                        mac,
                    },
                    Health::ALL,
                    now,
                ),
                sealer: Sealer::new(&pair_key(&site), [u8::try_from(i).unwrap() + 1; 16]),
                opener: Opener::new(pair_key(&site)),
                mac,
                stopped: false,
                events: Vec::new(),
            }
        };
        Self {
            now,
            boxes: [make(0), make(1)],
            link: [true; 2],
            challenges: 0,
            recorded: Vec::new(),
            site,
        }
    }

    fn challenge(&mut self) -> [u8; 16] {
        self.challenges += 1;
        let mut c = [0u8; 16];
        c[..8].copy_from_slice(&self.challenges.to_be_bytes());
        c[8] = 0xc4;
        c
    }

    /// One step of `STEP`: each running box decides, sends what is due over the link.
    fn step(&mut self) {
        self.now += STEP;
        let now = self.now;
        for i in 0..2 {
            if self.boxes[i].stopped {
                continue;
            }
            self.boxes[i].pair.handle_timeout(now);
            let challenge = self.challenge();
            let clock = 1_795_000_000_000_000_000 + self.challenges;
            let Some(beat) = self.boxes[i].pair.poll_transmit(now, clock, challenge) else {
                continue;
            };
            let mut wire = Vec::new();
            self.boxes[i].sealer.seal(&Body::Heartbeat(beat), &mut wire);
            self.recorded.push((i, wire.clone()));
            if self.link[i] {
                self.deliver(1 - i, &wire, self.boxes[i].mac);
            }
        }
        for b in &mut self.boxes {
            while let Some(e) = b.pair.poll_event() {
                b.events.push(e);
            }
        }
    }

    fn deliver(&mut self, to: usize, wire: &[u8], from: [u8; 6]) {
        let now = self.now;
        let b = &mut self.boxes[to];
        if b.stopped {
            return;
        }
        if let Ok((boot, Body::Heartbeat(beat))) = b.opener.open(wire) {
            b.pair.handle(from, boot, &beat, now);
        }
    }

    fn run(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.step();
        }
    }

    fn roles(&self) -> [Role; 2] {
        [self.boxes[0].pair.role(), self.boxes[1].pair.role()]
    }

    /// Runs until `f` holds or `within` passed; returns how long it took.
    fn until(&mut self, within: Duration, f: impl Fn(&Self) -> bool) -> Option<Duration> {
        let start = self.now;
        while self.now - start <= within {
            if f(self) {
                return Some(self.now - start);
            }
            self.step();
        }
        None
    }
}

fn one_active(s: &Sim) -> bool {
    s.roles().iter().filter(|r| **r == Role::Active).count() == 1
}

/// Two boxes starting together: the higher priority serves within the listening interval
/// and a heartbeat, the other stands by, and both agree on the term.
#[test]
fn two_starting_boxes_elect_the_higher_priority() {
    let mut s = Sim::new([100, 200], false);
    let took = s.until(DEAD + 3 * INTERVAL, one_active).unwrap();
    assert!(took <= DEAD + 2 * INTERVAL, "{took:?}");
    s.run(Duration::from_secs(2));
    assert_eq!(s.roles(), [Role::Standby, Role::Active]);
    assert_eq!(s.boxes[0].pair.term(), s.boxes[1].pair.term());
    assert_eq!(
        s.boxes[1].events,
        [Event::Active {
            term: 1,
            reason: Reason::Precedence
        }]
    );
}

/// The active box killed: the standby serves within `DEAD` and a step or two, in the next
/// term; the active box's recorded heartbeats, replayed to the standby all along, prove
/// nothing and do not hold it back.
#[test]
fn a_killed_active_is_replaced_within_dead_and_replays_prove_nothing() {
    let mut s = Sim::new([200, 100], false);
    s.run(Duration::from_secs(1));
    assert_eq!(s.roles(), [Role::Active, Role::Standby]);
    let term = s.boxes[0].pair.term();
    s.boxes[0].stopped = true;
    let old: Vec<Vec<u8>> = s
        .recorded
        .iter()
        .filter(|(i, _)| *i == 0)
        .map(|(_, w)| w.clone())
        .collect();
    let mac = s.boxes[0].mac;
    let start = s.now;
    let mut replays = old.iter().cycle();
    while s.boxes[1].pair.role() != Role::Active {
        assert!(s.now - start < Duration::from_secs(2), "never took over");
        let w = replays.next().unwrap().clone();
        s.deliver(1, &w, mac);
        s.step();
    }
    let took = s.now - start;
    assert!(took <= DEAD + 2 * STEP, "{took:?}");
    assert_eq!(s.boxes[1].pair.term(), term + 1);
    assert_eq!(
        s.boxes[1].events.last(),
        Some(&Event::Active {
            term: term + 1,
            reason: Reason::ActiveSilent
        })
    );
    // Box 1 restarts too, with a fresh opener that accepts box 0's recorded start as new:
    // its heartbeats open, in order, but their echoes answer none of box 1's challenges.
    // (Their term is authentic: box 1 serves in the term after it.)
    let site_box = &mut s.boxes[1];
    site_box.pair = Pair::new(
        Config {
            priority: 100,
            preempt: false,
            mac: site_box.mac,
        },
        Health::ALL,
        s.now,
    );
    site_box.events.clear();
    let mut fresh = Opener::new(pair_key_of(&s));
    let mut replays = old.iter();
    let start = s.now;
    while s.now - start < DEAD + 2 * STEP {
        if let Some(w) = replays.next()
            && let Ok((boot, Body::Heartbeat(beat))) = fresh.open(w)
        {
            let now = s.now;
            assert!(
                !s.boxes[1].pair.handle(mac, boot, &beat, now),
                "a replay proved life"
            );
        }
        s.step();
    }
    assert_eq!(
        s.boxes[1].events,
        [Event::Active {
            term: term + 1,
            reason: Reason::Alone
        }]
    );
}

/// A frozen active box that resumes (SIGCONT) finds the new active of a higher term and
/// stands by within two intervals: never two active boxes longer than that.
#[test]
fn a_frozen_active_that_resumes_stands_by() {
    let mut s = Sim::new([200, 100], false);
    s.run(Duration::from_secs(1));
    s.boxes[0].stopped = true;
    s.run(Duration::from_secs(2));
    assert_eq!(s.boxes[1].pair.role(), Role::Active);
    s.boxes[0].stopped = false;
    let took = s.until(Duration::from_secs(1), one_active).unwrap();
    assert!(took <= 2 * INTERVAL + STEP, "{took:?}");
    s.run(Duration::from_secs(2));
    assert_eq!(s.roles(), [Role::Standby, Role::Active]);
    assert_eq!(
        s.boxes[0].events.last(),
        Some(&Event::Standby {
            reason: Reason::ActiveWithPrecedence
        })
    );
}

/// The link cut both ways: both serve (each thinks the other gone); healed, one stands
/// down within two intervals and they agree again.
#[test]
fn a_healed_partition_leaves_one_active() {
    let mut s = Sim::new([200, 100], false);
    s.run(Duration::from_secs(1));
    s.link = [false, false];
    s.run(Duration::from_secs(1));
    assert_eq!(s.roles(), [Role::Active, Role::Active]);
    assert!(!s.boxes[0].pair.in_contact(s.now));
    s.link = [true, true];
    let took = s.until(Duration::from_secs(1), one_active).unwrap();
    assert!(took <= 2 * INTERVAL + STEP, "{took:?}");
    s.run(Duration::from_secs(2));
    assert!(one_active(&s), "{:?}", s.roles());
    assert!(s.boxes[0].pair.in_contact(s.now));
}

/// The halves of the pool: unknown before the boxes hear each other, then the lower NIC MAC
/// takes the lower half on both sides, whatever the priorities, and a box that starts again
/// knowing the other's MAC agrees before hearing it.
#[test]
fn both_boxes_agree_on_their_halves_of_the_pool() {
    let mut s = Sim::new([100, 200], false);
    assert_eq!(s.boxes[0].pair.lower_half(), None);
    s.run(Duration::from_secs(1));
    let halves = [s.boxes[0].pair.lower_half(), s.boxes[1].pair.lower_half()];
    assert_eq!(halves, [Some(true), Some(false)], "box 0 has the lower MAC");
    assert_eq!(s.boxes[0].pair.known_other(), Some(s.boxes[1].mac));
    let mut again = Pair::new(*s.boxes[1].pair.config(), Health::ALL, s.now);
    again.know_other(s.boxes[1].mac);
    assert_eq!(again.lower_half(), None, "our own MAC is not the other box");
    again.know_other(s.boxes[0].mac);
    assert_eq!(again.lower_half(), Some(false));
}

/// The active box loses its uplink: it says so at once, and the standby, healthier, takes
/// over within an interval; the old one stands by. A standby whose own LAN link is down never takes over.
#[test]
fn health_moves_the_gateway_and_a_standby_without_lan_waits() {
    let mut s = Sim::new([200, 100], false);
    s.run(Duration::from_secs(1));
    let now = s.now;
    s.boxes[0]
        .pair
        .set_health(Health::ALL.without(Health::UPLINK), now);
    let took = s
        .until(Duration::from_secs(1), |s| {
            s.roles() == [Role::Standby, Role::Active]
        })
        .unwrap();
    assert!(took < INTERVAL, "{took:?}");
    assert!(s.boxes[1].events.contains(&Event::Active {
        term: 2,
        reason: Reason::ActiveUnhealthy
    }));
    // Box 0 stands by without its LAN link; box 1 dies: box 0 does not take over.
    let now = s.now;
    s.boxes[0].pair.set_health(Health::none(), now);
    s.boxes[1].stopped = true;
    s.run(Duration::from_secs(2));
    assert_eq!(s.boxes[0].pair.role(), Role::Standby);
    let now = s.now;
    s.boxes[0].pair.set_health(Health::LAN, now);
    s.run(INTERVAL);
    assert_eq!(s.boxes[0].pair.role(), Role::Active);
}

/// Reach alone: the active box lacking it moves the gateway only once that has lasted
/// `REACH_HOLD` (the two probe at their own moments); a gap shorter than that, as when a
/// target stops answering both a second apart, moves nothing.
#[test]
fn reach_alone_moves_the_gateway_only_after_its_hold() {
    let mut s = Sim::new([200, 100], false);
    s.run(Duration::from_secs(1));
    let unreached = Health::ALL.without(Health::REACHED);
    let now = s.now;
    s.boxes[0].pair.set_health(unreached, now);
    s.run(REACH_HOLD - Duration::from_secs(1));
    assert_eq!(s.roles(), [Role::Active, Role::Standby]);
    // The standby loses it too: even, nothing moves, and the hold starts again.
    let now = s.now;
    s.boxes[1].pair.set_health(unreached, now);
    s.run(Duration::from_secs(2));
    let now = s.now;
    s.boxes[1].pair.set_health(Health::ALL, now);
    s.run(REACH_HOLD - Duration::from_secs(1));
    assert_eq!(s.roles(), [Role::Active, Role::Standby]);
    let took = s
        .until(Duration::from_secs(3), |s| {
            s.roles() == [Role::Standby, Role::Active]
        })
        .unwrap();
    assert!(took <= Duration::from_secs(1) + INTERVAL, "{took:?}");
    assert!(s.boxes[1].events.contains(&Event::Active {
        term: 2,
        reason: Reason::ActiveUnhealthy
    }));
}

/// Preempt: the higher priority box, back as standby, takes the gateway back only once it
/// holds the active's lease table version.
#[test]
fn preempt_waits_for_the_lease_table() {
    let mut s = Sim::new([200, 100], true);
    s.boxes[0].stopped = true;
    s.run(Duration::from_secs(1));
    assert_eq!(s.boxes[1].pair.role(), Role::Active);
    let now = s.now;
    s.boxes[1].pair.set_leases_version(7, now);
    // Box 0 restarts: a fresh state machine and a fresh start (boot).
    let site_key_of_box0 = &mut s.boxes[0];
    site_key_of_box0.stopped = false;
    site_key_of_box0.pair = Pair::new(
        Config {
            priority: 200,
            preempt: true,
            mac: site_key_of_box0.mac,
        },
        Health::ALL,
        s.now,
    );
    s.run(Duration::from_secs(2));
    assert_eq!(
        s.roles(),
        [Role::Standby, Role::Active],
        "preempted without the leases"
    );
    let now = s.now;
    s.boxes[0].pair.set_leases_version(7, now);
    let took = s
        .until(Duration::from_secs(1), |s| {
            s.roles() == [Role::Active, Role::Standby]
        })
        .unwrap();
    assert!(took <= 3 * INTERVAL, "{took:?}");
    assert!(s.boxes[0].events.iter().any(|e| matches!(
        e,
        Event::Active {
            reason: Reason::Preempted,
            ..
        }
    )));
}

/// A standby that comes to hold another lease table says so at once, not at its next
/// interval: the active box's DHCP ACKs for new leases wait for that heartbeat
/// (docs/protocol.md §5, *State that moves*).
#[test]
fn a_standby_acknowledges_a_new_lease_table_at_once() {
    let mut s = Sim::new([200, 100], false);
    s.run(Duration::from_secs(1));
    assert_eq!(s.roles(), [Role::Active, Role::Standby]);
    let heard = |s: &Sim| s.boxes[0].pair.other().unwrap().1;
    // Just after one of the standby's heartbeats: its next is an interval away.
    let last = heard(&s).challenge;
    s.until(INTERVAL, |s| heard(s).challenge != last).unwrap();
    let now = s.now;
    s.boxes[1].pair.set_leases_version(9, now);
    let took = s.until(INTERVAL, |s| heard(s).leases_version == 9).unwrap();
    assert!(took <= 2 * STEP, "acknowledged after {took:?}");
}

/// A planned handover: refused, with the reason, while the standby could not take the
/// gateway; once it can, the gateway moves within a few intervals, both boxes say why, and
/// the old active stands by. A standby that does not take it leaves the active serving,
/// and after [`HANDOVER`] no longer saying it hands over.
#[test]
fn a_handover_moves_the_gateway_only_to_a_standby_that_can_take_it() {
    let mut s = Sim::new([200, 100], false);
    s.run(Duration::from_secs(1));
    assert_eq!(s.roles(), [Role::Active, Role::Standby]);
    let now = s.now;
    assert_eq!(s.boxes[1].pair.hand_over(now), Err(NoHandover::NotActive));
    let now = s.now;
    s.boxes[0].pair.set_leases_version(7, now);
    s.run(2 * INTERVAL);
    let now = s.now;
    assert_eq!(
        s.boxes[0].pair.hand_over(now),
        Err(NoHandover::LeasesBehind)
    );
    let now = s.now;
    s.boxes[1].pair.set_leases_version(7, now);
    s.boxes[1]
        .pair
        .set_health(Health::ALL.without(Health::REACHED), now);
    s.run(2 * INTERVAL);
    let now = s.now;
    assert_eq!(
        s.boxes[0].pair.hand_over(now),
        Err(NoHandover::OtherLessHealthy)
    );
    s.boxes[1].pair.set_health(Health::ALL, now);
    s.run(2 * INTERVAL);
    assert_eq!(s.roles(), [Role::Active, Role::Standby], "moved unasked");
    let now = s.now;
    s.boxes[0].pair.hand_over(now).unwrap();
    let took = s
        .until(Duration::from_secs(1), |s| {
            s.roles() == [Role::Standby, Role::Active]
        })
        .unwrap();
    assert!(took <= 3 * INTERVAL, "{took:?}");
    assert_eq!(
        s.boxes[1].events.last(),
        Some(&Event::Active {
            term: 2,
            reason: Reason::HandedOver
        })
    );
    assert_eq!(
        s.boxes[0].events.last(),
        Some(&Event::Standby {
            reason: Reason::HandedOver
        })
    );
    s.run(Duration::from_secs(1));
    assert_eq!(s.roles(), [Role::Standby, Role::Active], "came back");

    // Box 0 now stands by, box 1 asks (asked again meanwhile, it says one is under way); box 0 is told a new lease table it does not take in
    // time: box 1 goes on serving, and stops saying it hands over.
    let now = s.now;
    s.boxes[1].pair.hand_over(now).unwrap();
    assert_eq!(s.boxes[1].pair.hand_over(now), Err(NoHandover::UnderWay));
    let now = s.now;
    s.boxes[0].pair.set_leases_version(8, now);
    s.run(HANDOVER - INTERVAL);
    assert!(s.boxes[1].pair.is_handing_over(s.now));
    s.run(2 * INTERVAL);
    assert_eq!(s.roles(), [Role::Standby, Role::Active]);
    assert!(!s.boxes[1].pair.is_handing_over(s.now));
}

/// A heartbeat of our own, looped back by the LAN, is not the other box.
#[test]
fn our_own_heartbeat_is_not_the_other_box() {
    let mut s = Sim::new([200, 100], false);
    let now = s.now;
    let beat: Heartbeat = s.boxes[0].pair.poll_transmit(now, 1, [5; 16]).unwrap();
    let mac = s.boxes[0].mac;
    assert!(!s.boxes[0].pair.handle(mac, [1; 16], &beat, now));
    assert!(s.boxes[0].pair.other().is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any schedule of cuts of either direction, kills and resumptions: once both boxes run
    /// and the link has carried both ways for `DEAD` and two intervals, exactly one serves.
    #[test]
    fn after_any_schedule_one_box_serves_once_the_link_is_back(
        plan in proptest::collection::vec((any::<bool>(), any::<bool>(), 0u8..3, 1u64..80), 1..12),
        priorities in (1u8..=254, 1u8..=254),
        preempt in any::<bool>(),
    ) {
        let mut s = Sim::new([priorities.0, priorities.1], preempt);
        for (up0, up1, stop, steps) in plan {
            s.link = [up0, up1];
            match stop {
                1 => s.boxes[0].stopped = !s.boxes[0].stopped,
                2 => s.boxes[1].stopped = !s.boxes[1].stopped,
                _ => {}
            }
            s.run(STEP * u32::try_from(steps).unwrap());
        }
        s.link = [true, true];
        s.boxes[0].stopped = false;
        s.boxes[1].stopped = false;
        s.run(DEAD + 2 * INTERVAL + STEP);
        for _ in 0..100 {
            prop_assert!(one_active(&s), "{:?}", s.roles());
            s.step();
        }
        prop_assert_eq!(s.boxes[0].pair.term(), s.boxes[1].pair.term());
    }
}

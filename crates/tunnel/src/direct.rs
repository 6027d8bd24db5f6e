//! Back to direct (docs/protocol.md §4, *Back to direct*), sans-IO: when a relayed pair
//! tries the direct path again, what a try sends, and the rule against flapping. [`Direct`]
//! is one peer's; the control thread feeds it the time, the path the peer is on and the
//! pongs, and sends what it asks for.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The first wait, after the pair was relayed, before a try: longer than a NAT keeps an
/// unanswered UDP entry (Linux conntrack: 30 s). The peer's last direct packets (its
/// handshakes before the relay, a try's pings) may have left one at our NAT for our socket's
/// own address and port, and while it lasts our packets to the peer leave from another port,
/// which the peer's NAT drops.
pub const FIRST_WAIT: Duration = Duration::from_secs(35);
/// The longest wait between tries.
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// A direct path that carried the pair this long has settled: the wait starts over at
/// [`FIRST_WAIT`] the next time the pair is relayed.
pub const SETTLED: Duration = Duration::from_secs(600);
/// Pings go this long after the try started (the punches' lead), and again as long after.
pub const PING_EVERY: Duration = Duration::from_secs(1);
/// Pings each candidate gets in one try.
pub const PINGS: u32 = 2;
/// A pong counts if it comes this soon after its ping; a try without one fails this long
/// after its last ping.
pub const PONG_WITHIN: Duration = Duration::from_secs(3);
/// A peer's call-me starts a try at most this often.
pub const CALL_ME_EVERY: Duration = Duration::from_secs(10);
/// Candidates tried at most.
pub const MAX_CANDIDATES: usize = 4;

/// Whether `a` can be a peer's address on the underlay.
fn reachable(a: SocketAddr) -> bool {
    let ip = a.ip().to_canonical();
    let broadcast = match ip {
        std::net::IpAddr::V4(v4) => v4.is_broadcast(),
        std::net::IpAddr::V6(_) => false,
    };
    a.port() != 0 && !ip.is_loopback() && !ip.is_multicast() && !ip.is_unspecified() && !broadcast
}

/// What to send now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A call-me to the peer, through the relay channel, with our addresses.
    CallMe,
    /// A hole punch to this candidate (only when we are behind a NAT).
    Punch(SocketAddr),
    /// A ping with this id to this candidate.
    Ping(u64, SocketAddr),
}

#[derive(Debug, Clone)]
struct Attempt {
    started: Instant,
    pinged: u32,
    last_ping: Option<Instant>,
    /// Pings sent: id, to, when.
    pings: Vec<(u64, SocketAddr, Instant)>,
}

/// One peer's way back to direct.
#[derive(Debug, Clone)]
pub struct Direct {
    wait: Duration,
    relayed: bool,
    next_try: Option<Instant>,
    attempt: Option<Attempt>,
    direct_since: Option<Instant>,
    called_at: Option<Instant>,
    candidates: Vec<SocketAddr>,
    tries: u64,
}

impl Default for Direct {
    fn default() -> Self {
        Self {
            wait: FIRST_WAIT,
            relayed: false,
            next_try: None,
            attempt: None,
            direct_since: None,
            called_at: None,
            candidates: Vec::new(),
            tries: 0,
        }
    }
}

impl Direct {
    /// The peer's direct addresses to try (the cloud's description of it, or its last
    /// call-me), at most [`MAX_CANDIDATES`], duplicates left out, and none a peer could
    /// only mean to aim our pings at this host or a whole link with: loopback, multicast,
    /// broadcast, unspecified, port 0.
    pub fn set_candidates(&mut self, addrs: impl IntoIterator<Item = SocketAddr>) {
        self.candidates.clear();
        for a in addrs.into_iter().filter(|a| reachable(*a)) {
            if self.candidates.len() < MAX_CANDIDATES && !self.candidates.contains(&a) {
                self.candidates.push(a);
            }
        }
    }

    /// The addresses tried.
    pub fn candidates(&self) -> &[SocketAddr] {
        &self.candidates
    }

    /// Tries started so far.
    pub const fn tries(&self) -> u64 {
        self.tries
    }

    /// The wait before the next try, as it stands.
    pub const fn wait(&self) -> Duration {
        self.wait
    }

    /// When the next try starts (`None`: not relayed, or a try is under way).
    pub const fn next_try(&self) -> Option<Instant> {
        self.next_try
    }

    /// Tells which path the peer is on at `now`, whatever moved it (our pong, the peer's
    /// frames, a fall back to the relay): on a move to the relay the next try is scheduled
    /// (the wait doubled, unless the direct path had settled); on a move to direct, tries
    /// stop.
    pub fn observe(&mut self, relayed: bool, now: Instant) {
        if relayed == self.relayed {
            return;
        }
        self.relayed = relayed;
        self.attempt = None;
        if relayed {
            match self.direct_since.take() {
                Some(since) if now.saturating_duration_since(since) >= SETTLED => {
                    self.wait = FIRST_WAIT;
                }
                Some(_) => self.wait = (self.wait * 2).min(MAX_WAIT),
                None => {}
            }
            self.next_try = Some(now + self.wait);
        } else {
            self.direct_since = Some(now);
            self.next_try = None;
        }
    }

    /// The peer tries too and says where it may be reached: its addresses become the
    /// candidates (at most once per [`CALL_ME_EVERY`], only while relayed; `None`: not
    /// taken). Without a try under way, one starts at the next [`Direct::poll`] (the
    /// answer is empty); during one, the answer punches the addresses it had not tried
    /// (behind a NAT), now, before the peer's pings reach our NAT: its pings, sent 1 s
    /// after its call-me, would otherwise find no mapping there, and the entry they leave
    /// would push our own pings to another port.
    pub fn called(
        &mut self,
        addrs: Vec<SocketAddr>,
        now: Instant,
        behind_nat: bool,
    ) -> Option<Vec<Action>> {
        if !self.relayed
            || self
                .called_at
                .is_some_and(|t| now.saturating_duration_since(t) < CALL_ME_EVERY)
        {
            return None;
        }
        self.called_at = Some(now);
        let known = self.candidates.clone();
        if !addrs.is_empty() {
            self.set_candidates(addrs);
        }
        if self.attempt.is_none() {
            self.next_try = Some(now);
            return Some(Vec::new());
        }
        Some(if behind_nat {
            self.candidates
                .iter()
                .filter(|c| !known.contains(c))
                .map(|c| Action::Punch(*c))
                .collect()
        } else {
            Vec::new()
        })
    }

    /// What to send at `now`; `id` draws a ping's id. `behind_nat`: punch first.
    pub fn poll(
        &mut self,
        now: Instant,
        behind_nat: bool,
        mut id: impl FnMut() -> u64,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        if let Some(a) = self.attempt.as_mut() {
            if a.pinged < PINGS && now >= a.started + PING_EVERY * (a.pinged + 1) {
                a.pinged += 1;
                a.last_ping = Some(now);
                for c in &self.candidates {
                    let ping = id();
                    a.pings.push((ping, *c, now));
                    out.push(Action::Ping(ping, *c));
                }
            } else if a.pinged >= PINGS
                && a.last_ping
                    .is_none_or(|t| now.saturating_duration_since(t) >= PONG_WITHIN)
            {
                // No pong: the next try waits twice as long.
                self.attempt = None;
                self.wait = (self.wait * 2).min(MAX_WAIT);
                self.next_try = Some(now + self.wait);
            }
            return out;
        }
        if !self.relayed || self.next_try.is_none_or(|t| now < t) {
            return out;
        }
        self.next_try = None;
        self.tries += 1;
        out.push(Action::CallMe);
        if behind_nat {
            out.extend(self.candidates.iter().map(|c| Action::Punch(*c)));
        }
        self.attempt = Some(Attempt {
            started: now,
            pinged: 0,
            last_ping: None,
            pings: Vec::new(),
        });
        out
    }

    /// A pong with `id` came from `from`: whether it answers one of this try's pings, sent
    /// to `from` less than [`PONG_WITHIN`] before. If so, `from` is a direct path that works
    /// both ways: move there (the caller does, and [`Direct::observe`] follows).
    pub fn pong(&mut self, id: u64, from: SocketAddr, now: Instant) -> bool {
        let Some(a) = self.attempt.as_ref() else {
            return false;
        };
        let ok = a.pings.iter().any(|(i, to, at)| {
            *i == id && *to == from && now.saturating_duration_since(*at) < PONG_WITHIN
        });
        if ok {
            self.attempt = None;
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// A try: a call-me, punches when behind a NAT, two rounds of pings a second apart, then
    /// a failure that doubles the wait.
    #[test]
    fn a_try_calls_punches_pings_twice_and_fails_into_a_longer_wait() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let c = [addr("203.0.113.2:51820"), addr("[fd00:203:0:113::2]:51820")];
        let mut d = Direct::default();
        d.set_candidates(c);
        let mut ids = 0u64;
        let mut next = || {
            ids += 1;
            ids
        };
        assert!(d.poll(at(0), true, &mut next).is_empty(), "not relayed");
        d.observe(true, at(0));
        assert!(d.poll(at(34_999), true, &mut next).is_empty());
        assert_eq!(
            d.poll(at(35_000), true, &mut next),
            [Action::CallMe, Action::Punch(c[0]), Action::Punch(c[1])]
        );
        assert!(d.poll(at(35_500), true, &mut next).is_empty());
        assert_eq!(
            d.poll(at(36_000), true, &mut next),
            [Action::Ping(1, c[0]), Action::Ping(2, c[1])]
        );
        assert_eq!(
            d.poll(at(37_000), true, &mut next),
            [Action::Ping(3, c[0]), Action::Ping(4, c[1])]
        );
        assert!(d.poll(at(39_999), true, &mut next).is_empty());
        assert!(d.poll(at(40_000), true, &mut next).is_empty());
        assert_eq!(d.wait(), FIRST_WAIT * 2);
        assert_eq!(d.next_try(), Some(at(110_000)));
        // Not behind a NAT: no punch.
        assert_eq!(d.poll(at(110_000), false, &mut next), [Action::CallMe]);
        assert_eq!(d.tries(), 2);
    }

    /// Only a pong from where its ping went, in time, with its id, counts.
    #[test]
    fn only_the_answer_to_a_ping_from_where_it_went_counts() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let c = addr("203.0.113.2:51820");
        let mut d = Direct::default();
        d.set_candidates([c]);
        d.observe(true, at(0));
        let mut next = || 77;
        d.poll(at(35_000), false, &mut next);
        d.poll(at(36_000), false, &mut next);
        assert!(!d.pong(78, c, at(36_100)), "another id");
        assert!(
            !d.pong(77, addr("203.0.113.3:51820"), at(36_100)),
            "another source"
        );
        assert!(!d.pong(77, c, at(39_000)), "too late");
        assert!(d.pong(77, c, at(38_999)));
        assert!(!d.pong(77, c, at(38_999)), "the try is over");
        d.observe(false, at(39_000));
        assert_eq!(d.next_try(), None);
    }

    /// A peer cannot aim our pings at this host or a whole link.
    #[test]
    fn candidates_are_underlay_addresses_only() {
        let mut d = Direct::default();
        d.set_candidates(
            [
                "127.0.0.1:51820",
                "[::1]:51820",
                "[::ffff:127.0.0.1]:51820",
                "224.0.0.1:51820",
                "[ff02::1]:51820",
                "255.255.255.255:51820",
                "0.0.0.0:51820",
                "[::]:51820",
                "203.0.113.2:0",
                "203.0.113.2:51820",
                "[fd00:203:0:113::2]:51820",
            ]
            .map(addr),
        );
        assert_eq!(
            d.candidates(),
            [addr("203.0.113.2:51820"), addr("[fd00:203:0:113::2]:51820")]
        );
    }

    /// A call-me starts a try at once, takes the caller's addresses, and counts only once
    /// per CALL_ME_EVERY and only while relayed; during a try, it punches the addresses not
    /// tried yet at once, and the next pings go to them.
    #[test]
    fn a_call_me_starts_a_try_with_the_callers_addresses() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let old = addr("192.0.2.1:1");
        let mut d = Direct::default();
        d.set_candidates([old]);
        let fresh = vec![addr("203.0.113.9:4000")];
        assert_eq!(d.called(fresh.clone(), at(0), true), None, "not relayed");
        d.observe(true, at(0));
        assert_eq!(d.called(fresh.clone(), at(1), true), Some(Vec::new()));
        assert_eq!(d.candidates(), fresh.as_slice());
        assert_eq!(
            d.poll(at(1), true, || 1),
            [Action::CallMe, Action::Punch(fresh[0])]
        );
        assert_eq!(
            d.called(fresh.clone(), at(5), true),
            None,
            "at most once per 10 s"
        );
        // A try of our own under way when the peer's call-me brings a new address.
        let mut d = Direct::default();
        d.set_candidates([old]);
        d.observe(true, at(0));
        assert_eq!(
            d.poll(at(35), true, || 1),
            [Action::CallMe, Action::Punch(old)]
        );
        let both = vec![old, fresh[0]];
        assert_eq!(
            d.called(both.clone(), at(35), true),
            Some(vec![Action::Punch(fresh[0])]),
            "only the address not punched yet"
        );
        assert_eq!(
            d.poll(at(36), true, || 2),
            [Action::Ping(2, old), Action::Ping(2, fresh[0])]
        );
        let mut d = Direct::default();
        d.observe(true, at(0));
        d.poll(at(35), false, || 1);
        assert_eq!(
            d.called(both, at(35), false),
            Some(Vec::new()),
            "no NAT, no punch"
        );
    }

    /// The wait doubles after each fall back, up to MAX_WAIT, and starts over once direct
    /// has held for SETTLED.
    #[test]
    fn falling_back_doubles_the_wait_until_direct_settles() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut d = Direct::default();
        d.observe(true, at(0));
        let mut t = 0;
        for expect in [70, 140, 280, 300, 300, 300] {
            d.observe(false, at(t + 1));
            t += 60;
            d.observe(true, at(t));
            assert_eq!(d.wait(), Duration::from_secs(expect));
        }
        d.observe(false, at(t + 1));
        d.observe(true, at(t + 1 + SETTLED.as_secs()));
        assert_eq!(d.wait(), FIRST_WAIT);
    }

    /// The rule against flapping, in virtual time: for 10 minutes a NAT lets the direct
    /// path through every other minute. The pair moves at most 5 times (docs/protocol.md
    /// §4, *Back to direct*).
    #[test]
    fn a_nat_that_opens_every_other_minute_moves_the_pair_at_most_five_times() {
        for open_first in [false, true] {
            for offset in 0..60u64 {
                let t0 = Instant::now();
                let c = addr("203.0.113.2:51820");
                let mut d = Direct::default();
                d.set_candidates([c]);
                // Relayed from the start (as the NAT blocked the first minute, or not).
                let mut relayed = true;
                d.observe(true, t0);
                let mut moves = 0;
                // A direct path dies when the NAT closes; it is found dead 8 s later
                // (5 s of unanswered data, 3 s of unanswered initiations).
                let mut dies_at: Option<u64> = None;
                for s in 0..600u64 {
                    let now = t0 + Duration::from_secs(s);
                    let open = ((s + offset) / 60 % 2 == 0) == open_first;
                    if !relayed {
                        if !open && dies_at.is_none() {
                            dies_at = Some(s + 8);
                        }
                        if dies_at.is_some_and(|t| s >= t) {
                            relayed = true;
                            moves += 1;
                            dies_at = None;
                            d.observe(true, now);
                        }
                        continue;
                    }
                    for a in d.poll(now, false, || s) {
                        if let Action::Ping(id, to) = a {
                            // The pong returns within the second when the NAT is open.
                            if open && d.pong(id, to, now + Duration::from_millis(50)) {
                                relayed = false;
                                moves += 1;
                                d.observe(false, now);
                                break;
                            }
                        }
                    }
                }
                assert!(
                    moves <= 5,
                    "open first {open_first}, offset {offset}: {moves} moves"
                );
                assert!(
                    moves >= 2,
                    "open first {open_first}, offset {offset}: the pair never went direct"
                );
            }
        }
    }
}

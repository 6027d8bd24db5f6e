//! One relay channel's rule (docs/protocol.md §4, relay), sans-IO: a bind under a side's
//! token, answering a challenge sent to its source address, puts that side at that address;
//! a datagram from one side's bound address goes to the other side's bound address; nothing
//! else passes. The relay's driver owns the sockets, the clock and the [`Challenger`], and
//! does what [`Sides::datagram`] says.

use std::net::SocketAddr;

use crate::probe::{
    Bind, Challenger, PROBE_TOKEN_LEN, Purpose, challenge_frame, legacy_bind_token, same,
};

/// Challenges a side may cause in a second, at most.
pub const CHALLENGES_PER_SEC: u8 = 4;

/// What to do with a datagram that arrived on the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A bind: side `side` is now at the datagram's source.
    Bound {
        /// 0 or 1.
        side: usize,
        /// Whether that address is new for the side (its first bind, or it moved).
        changed: bool,
    },
    /// Send the datagram, byte for byte, to the other side.
    Forward {
        /// The other side's bound address.
        to: SocketAddr,
    },
    /// A bind by a side's token from an address that has not proved it receives there: send
    /// `frame`, a challenge, to `to` (the bind's source). Nothing is bound.
    Challenge {
        /// Where the challenge goes.
        to: SocketAddr,
        /// The challenge frame.
        frame: Vec<u8>,
    },
    /// Drop it, counted.
    Refused(Refusal),
}

/// Why a datagram does not pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A bind under neither side's token (or of the other kind than the side speaks).
    WrongToken,
    /// From an address no side is bound to.
    Unbound,
    /// From a bound side whose partner has not bound yet.
    Alone,
    /// A bind whose cookie is not newer than the side's last bind's: a replay.
    Stale,
    /// A bind that would need a challenge, over the side's rate of challenges.
    ChallengeRate,
}

/// One side's state.
#[derive(Clone, Copy)]
struct Side {
    token: [u8; PROBE_TOKEN_LEN],
    /// A version-5 client: it binds with its token in clear, and only so.
    legacy: bool,
    bound: Option<SocketAddr>,
    /// The time of the cookie of the last bind taken (0: none yet).
    last_cookie: u64,
    /// Challenges sent in the second that began at `window`.
    window: u64,
    challenged: u8,
}

/// The two sides of one channel: their tokens and where each is bound.
#[derive(Clone)]
pub struct Sides {
    port: u16,
    sides: [Side; 2],
}

impl core::fmt::Debug for Sides {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sides")
            .field("port", &self.port)
            .field("bound", &self.bound())
            .finish_non_exhaustive()
    }
}

impl Sides {
    /// The channel on `port` whose sides bind with `tokens` (`legacy`: a side whose client
    /// speaks control version 5 or older, and binds with its token in clear), neither bound
    /// yet.
    pub fn new(port: u16, tokens: [[u8; PROBE_TOKEN_LEN]; 2], legacy: [bool; 2]) -> Self {
        let side = |i: usize| Side {
            token: tokens[i],
            legacy: legacy[i],
            bound: None,
            last_cookie: 0,
            window: 0,
            challenged: 0,
        };
        Self {
            port,
            sides: [side(0), side(1)],
        }
    }

    /// Where each side is bound.
    pub const fn bound(&self) -> [Option<SocketAddr>; 2] {
        [self.sides[0].bound, self.sides[1].bound]
    }

    /// What a datagram `bytes` from `from` means at `now_ms` (the relay's clock, milliseconds
    /// since the Unix epoch), the relay's cookies made and checked by `challenger` (a
    /// dual-stack socket's `::ffff:a.b.c.d` is the IPv4 address it is).
    pub fn datagram(
        &mut self,
        bytes: &[u8],
        from: SocketAddr,
        now_ms: u64,
        challenger: &Challenger,
    ) -> Verdict {
        let from = SocketAddr::new(from.ip().to_canonical(), from.port());
        if let Some(bind) = Bind::parse(bytes) {
            // Both verified, whichever matches: no early exit to time.
            let verifies = [0, 1].map(|i| {
                let ok = bind.verify(&self.sides[i].token);
                ok && !self.sides[i].legacy
            });
            let Some(i) = verifies.iter().position(|v| *v) else {
                return Verdict::Refused(Refusal::WrongToken);
            };
            let purpose = Purpose::Relay {
                port: self.port,
                side: u8::from(i == 1),
            };
            let side = &mut self.sides[i];
            return match bind.cookie {
                Some(c) if challenger.valid(purpose, from, &c, now_ms) => {
                    if c.time_ms <= side.last_cookie {
                        return Verdict::Refused(Refusal::Stale);
                    }
                    side.last_cookie = c.time_ms;
                    let changed = side.bound != Some(from);
                    side.bound = Some(from);
                    Verdict::Bound { side: i, changed }
                }
                _ => {
                    if now_ms.saturating_sub(side.window) >= 1000 {
                        side.window = now_ms;
                        side.challenged = 0;
                    }
                    if side.challenged >= CHALLENGES_PER_SEC {
                        return Verdict::Refused(Refusal::ChallengeRate);
                    }
                    side.challenged += 1;
                    let cookie = challenger.issue(purpose, from, now_ms);
                    Verdict::Challenge {
                        to: from,
                        frame: challenge_frame(&cookie),
                    }
                }
            };
        }
        if let Some(token) = legacy_bind_token(bytes) {
            let matches = [0, 1].map(|i| {
                let ok = same(&self.sides[i].token, &token);
                ok && self.sides[i].legacy
            });
            let Some(i) = matches.iter().position(|m| *m) else {
                return Verdict::Refused(Refusal::WrongToken);
            };
            let side = &mut self.sides[i];
            let changed = side.bound != Some(from);
            side.bound = Some(from);
            return Verdict::Bound { side: i, changed };
        }
        let [a, b] = self.bound();
        let i = if Some(from) == a {
            0
        } else if Some(from) == b {
            1
        } else {
            return Verdict::Refused(Refusal::Unbound);
        };
        match self.sides[1 - i].bound {
            Some(to) => Verdict::Forward { to },
            None => Verdict::Refused(Refusal::Alone),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use cyphonic_crypto::cookie::CookieSecret;

    use super::*;
    use crate::probe::{bind_frame, legacy_bind_frame, parse_challenge};

    const T: u64 = 1_800_000_000_000;

    fn challenger() -> Challenger {
        Challenger::new(CookieSecret::from_bytes([7; 32]))
    }

    /// Binds side `token` from `at`: the first bind is challenged, the answer binds.
    fn bind(c: &mut Sides, ch: &Challenger, token: [u8; 16], at: SocketAddr, now: u64) -> Verdict {
        let Verdict::Challenge { to, frame } = c.datagram(&bind_frame(&token, None), at, now, ch)
        else {
            panic!("no challenge");
        };
        assert_eq!(to, at);
        let cookie = parse_challenge(&frame).unwrap();
        c.datagram(&bind_frame(&token, Some(&cookie)), at, now + 5, ch)
    }

    #[test]
    fn binds_answer_a_challenge_then_forward_between_the_two_bound_addresses_only() {
        let ch = challenger();
        let mut c = Sides::new(40000, [[1; 16], [2; 16]], [false; 2]);
        let a: SocketAddr = "198.51.100.1:4000".parse().unwrap();
        let b: SocketAddr = "[fd00::2]:5000".parse().unwrap();
        let x: SocketAddr = "192.0.2.66:6000".parse().unwrap();
        assert_eq!(
            c.datagram(b"data", a, T, &ch),
            Verdict::Refused(Refusal::Unbound)
        );
        assert_eq!(
            bind(&mut c, &ch, [1; 16], a, T),
            Verdict::Bound {
                side: 0,
                changed: true
            }
        );
        assert_eq!(
            bind(&mut c, &ch, [1; 16], a, T + 20_000),
            Verdict::Bound {
                side: 0,
                changed: false
            },
            "the periodic bind again"
        );
        assert_eq!(
            c.datagram(b"data", a, T, &ch),
            Verdict::Refused(Refusal::Alone)
        );
        assert_eq!(
            c.datagram(&bind_frame(&[3; 16], None), x, T, &ch),
            Verdict::Refused(Refusal::WrongToken),
            "no token, no challenge"
        );
        assert_eq!(
            bind(&mut c, &ch, [2; 16], b, T + 20_010),
            Verdict::Bound {
                side: 1,
                changed: true
            }
        );
        assert_eq!(c.datagram(b"data", a, T, &ch), Verdict::Forward { to: b });
        assert_eq!(c.datagram(b"data", b, T, &ch), Verdict::Forward { to: a });
        assert_eq!(
            c.datagram(b"data", x, T, &ch),
            Verdict::Refused(Refusal::Unbound)
        );
        // A mapped IPv4 source is the IPv4 address.
        let mapped: SocketAddr = "[::ffff:198.51.100.1]:4000".parse().unwrap();
        assert_eq!(
            c.datagram(b"data", mapped, T, &ch),
            Verdict::Forward { to: b }
        );
        // A side that moves binds again from its new address.
        let a2: SocketAddr = "198.51.100.1:4001".parse().unwrap();
        assert_eq!(
            bind(&mut c, &ch, [1; 16], a2, T + 30_000),
            Verdict::Bound {
                side: 0,
                changed: true
            }
        );
        assert_eq!(
            c.datagram(b"data", a, T, &ch),
            Verdict::Refused(Refusal::Unbound)
        );
        assert_eq!(c.bound(), [Some(a2), Some(b)]);
    }

    /// Issue 49, finding 3: whoever has a side's bind (the member itself, or anyone on the
    /// path) cannot point the channel at a third address: from there the bind only earns a
    /// challenge sent there; a cookie made for one address binds no other; a bind replayed
    /// later (from the side's old address) moves nothing; challenges keep to their rate.
    #[test]
    fn a_bind_from_another_address_binds_nothing_and_replays_move_nothing() {
        let ch = challenger();
        let mut c = Sides::new(40000, [[1; 16], [2; 16]], [false; 2]);
        let a: SocketAddr = "198.51.100.1:4000".parse().unwrap();
        let b: SocketAddr = "203.0.113.2:5000".parse().unwrap();
        let victim: SocketAddr = "192.0.2.99:9".parse().unwrap();
        bind(&mut c, &ch, [1; 16], a, T);
        // The answer a side sent from a, seen on the path and replayed from the victim's
        // address, or from a itself.
        let Verdict::Challenge { frame, .. } =
            c.datagram(&bind_frame(&[1; 16], None), a, T + 100, &ch)
        else {
            panic!("no challenge");
        };
        let answer = bind_frame(&[1; 16], Some(&parse_challenge(&frame).unwrap()));
        assert_eq!(
            c.datagram(&answer, a, T + 110, &ch),
            Verdict::Bound {
                side: 0,
                changed: false
            }
        );
        assert!(matches!(
            c.datagram(&answer, victim, T + 120, &ch),
            Verdict::Challenge { to, .. } if to == victim
        ));
        assert_eq!(c.bound()[0], Some(a), "the victim's address is not bound");
        assert_eq!(
            c.datagram(&answer, a, T + 130, &ch),
            Verdict::Refused(Refusal::Stale)
        );
        // The side moves; its old answer, replayed from its old address, moves it back to
        // nowhere? No: stale.
        let a2: SocketAddr = "198.51.100.1:4001".parse().unwrap();
        bind(&mut c, &ch, [1; 16], a2, T + 1000);
        assert_eq!(
            c.datagram(&answer, a, T + 1100, &ch),
            Verdict::Refused(Refusal::Stale)
        );
        assert_eq!(c.bound()[0], Some(a2));
        // The other side's bound address sees none of it.
        bind(&mut c, &ch, [2; 16], b, T + 2000);
        assert_eq!(
            c.datagram(b"data", b, T + 2100, &ch),
            Verdict::Forward { to: a2 }
        );
        // A flood of binds from spoofed sources: 4 challenges a second, the rest refused.
        let mut challenged = 0;
        for i in 0..100u16 {
            let from = SocketAddr::new(victim.ip(), 1000 + i);
            match c.datagram(
                &bind_frame(&[1; 16], None),
                from,
                T + 5000 + u64::from(i),
                &ch,
            ) {
                Verdict::Challenge { .. } => challenged += 1,
                v => assert_eq!(v, Verdict::Refused(Refusal::ChallengeRate)),
            }
        }
        assert_eq!(challenged, usize::from(CHALLENGES_PER_SEC));
        assert_eq!(c.bound(), [Some(a2), Some(b)]);
    }

    /// A version-5 client's side binds with its token in clear, and only that side: a
    /// version-6 side's token is never taken in clear, and a legacy side takes no new bind.
    #[test]
    fn each_side_binds_the_way_its_client_speaks() {
        let ch = challenger();
        let mut c = Sides::new(40000, [[1; 16], [2; 16]], [true, false]);
        let a: SocketAddr = "198.51.100.1:4000".parse().unwrap();
        let b: SocketAddr = "203.0.113.2:5000".parse().unwrap();
        assert_eq!(
            c.datagram(&legacy_bind_frame(&[1; 16]), a, T, &ch),
            Verdict::Bound {
                side: 0,
                changed: true
            }
        );
        assert_eq!(
            c.datagram(&legacy_bind_frame(&[2; 16]), b, T, &ch),
            Verdict::Refused(Refusal::WrongToken)
        );
        assert_eq!(
            c.datagram(&bind_frame(&[1; 16], None), b, T, &ch),
            Verdict::Refused(Refusal::WrongToken)
        );
        assert_eq!(
            bind(&mut c, &ch, [2; 16], b, T),
            Verdict::Bound {
                side: 1,
                changed: true
            }
        );
        assert_eq!(c.datagram(b"data", b, T, &ch), Verdict::Forward { to: a });
    }
}

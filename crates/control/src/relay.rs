//! One relay channel's rule (docs/protocol.md §4, relay), sans-IO: a bind under a side's
//! token, answering a challenge sent to its source address, puts that side at that address;
//! a datagram from one side's bound address goes to the other side's bound address; nothing
//! else passes. A side may instead be bound to a relay stream (docs/protocol.md §4, *Relay
//! over a stream*): a stream bind carrying the connection's nonce puts it on that
//! connection. The relay's driver owns the sockets, the connections, the clock and the
//! [`Challenger`], and does what [`Sides::datagram`] and [`Sides::stream`] say.

use std::net::SocketAddr;

use crate::probe::{
    Bind, Challenger, PROBE_TOKEN_LEN, Purpose, STREAM_NONCE_LEN, StreamBind, challenge_frame,
    legacy_bind_token, same,
};

/// Challenges a side may cause in a second, at most.
pub const CHALLENGES_PER_SEC: u8 = 4;

/// The largest datagram a relay stream carries (docs/protocol.md §4, *Relay over a stream*).
pub const STREAM_MAX_DATAGRAM: usize = 9216;

/// The ALPN of a relay stream in TLS.
pub const STREAM_ALPN: &[u8] = b"cyphonic-relay/1";

/// The channel port of a relay stream's own messages (its hello).
pub const STREAM_OWN_PORT: u16 = 0;

/// A relay stream's message: the length, the channel's `port`, the `datagram`. `None` for a
/// datagram beyond [`STREAM_MAX_DATAGRAM`].
pub fn stream_message(port: u16, datagram: &[u8]) -> Option<Vec<u8>> {
    if datagram.len() > STREAM_MAX_DATAGRAM {
        return None;
    }
    let n = u16::try_from(datagram.len() + 2).ok()?;
    let mut out = Vec::with_capacity(4 + datagram.len());
    out.extend_from_slice(&n.to_be_bytes());
    out.extend_from_slice(&port.to_be_bytes());
    out.extend_from_slice(datagram);
    Some(out)
}

/// The length of the message a relay stream's 2-byte `prefix` announces (port and
/// datagram), or `None` when it is out of bounds (the connection closes).
pub fn stream_length(prefix: [u8; 2]) -> Option<usize> {
    let n = usize::from(u16::from_be_bytes(prefix));
    (2..=2 + STREAM_MAX_DATAGRAM).contains(&n).then_some(n)
}

/// Where a side of a channel is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum At {
    /// A UDP address: the channel's port sends there.
    Udp(SocketAddr),
    /// A relay stream, by the relay's number for the connection.
    Stream(u64),
}

/// What to do with a datagram that arrived on the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A bind: side `side` is now at the datagram's source (its address, or its stream).
    Bound {
        /// 0 or 1.
        side: usize,
        /// Whether that address is new for the side (its first bind, or it moved).
        changed: bool,
    },
    /// Send the datagram, byte for byte, to the other side.
    Forward {
        /// Where the other side is bound.
        to: At,
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
    /// A UDP bind on a stream, or a stream bind naming another channel or connection.
    WrongKind,
}

/// One side's state.
#[derive(Clone, Copy)]
struct Side {
    token: [u8; PROBE_TOKEN_LEN],
    /// A version-5 client: it binds with its token in clear, and only so.
    legacy: bool,
    bound: Option<At>,
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
    pub const fn bound(&self) -> [Option<At>; 2] {
        [self.sides[0].bound, self.sides[1].bound]
    }

    /// What a datagram `bytes` that came on the relay stream `conn` (whose hello carried
    /// `nonce`) for this channel means: a stream bind of a side puts it on `conn`; anything
    /// else passes only from a side bound to `conn`.
    pub fn stream(&mut self, bytes: &[u8], conn: u64, nonce: &[u8; STREAM_NONCE_LEN]) -> Verdict {
        if let Some(bind) = StreamBind::parse(bytes) {
            if bind.port != self.port || !same(&bind.nonce, nonce) {
                return Verdict::Refused(Refusal::WrongKind);
            }
            let Some(i) = self.side_of(false, |t| bind.verify(t)) else {
                return Verdict::Refused(Refusal::WrongToken);
            };
            return self.bind(i, At::Stream(conn));
        }
        if Bind::parse(bytes).is_some() || legacy_bind_token(bytes).is_some() {
            return Verdict::Refused(Refusal::WrongKind);
        }
        self.forward(At::Stream(conn))
    }

    /// The side whose token `made` (a bind's MAC, a legacy token) among the sides that bind
    /// the `legacy` way.
    fn side_of(
        &self,
        legacy: bool,
        made: impl Fn(&[u8; PROBE_TOKEN_LEN]) -> bool,
    ) -> Option<usize> {
        // Both verified, whichever matches: no early exit to time.
        let matches = [0, 1].map(|i| made(&self.sides[i].token) && self.sides[i].legacy == legacy);
        matches.iter().position(|m| *m)
    }

    /// Side `i` is now at `at`.
    fn bind(&mut self, i: usize, at: At) -> Verdict {
        let side = &mut self.sides[i];
        let changed = side.bound != Some(at);
        side.bound = Some(at);
        Verdict::Bound { side: i, changed }
    }

    /// The relay stream `conn` closed: a side bound to it is bound nowhere.
    pub fn stream_closed(&mut self, conn: u64) {
        for side in &mut self.sides {
            if side.bound == Some(At::Stream(conn)) {
                side.bound = None;
            }
        }
    }

    /// A datagram from `from`: to the other side, if `from` is where a side is bound.
    fn forward(&self, from: At) -> Verdict {
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
            let Some(i) = self.side_of(false, |t| bind.verify(t)) else {
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
                    self.bind(i, At::Udp(from))
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
            let Some(i) = self.side_of(true, |t| same(t, &token)) else {
                return Verdict::Refused(Refusal::WrongToken);
            };
            return self.bind(i, At::Udp(from));
        }
        self.forward(At::Udp(from))
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
        assert_eq!(
            c.datagram(b"data", a, T, &ch),
            Verdict::Forward { to: At::Udp(b) }
        );
        assert_eq!(
            c.datagram(b"data", b, T, &ch),
            Verdict::Forward { to: At::Udp(a) }
        );
        assert_eq!(
            c.datagram(b"data", x, T, &ch),
            Verdict::Refused(Refusal::Unbound)
        );
        // A mapped IPv4 source is the IPv4 address.
        let mapped: SocketAddr = "[::ffff:198.51.100.1]:4000".parse().unwrap();
        assert_eq!(
            c.datagram(b"data", mapped, T, &ch),
            Verdict::Forward { to: At::Udp(b) }
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
        assert_eq!(c.bound(), [Some(At::Udp(a2)), Some(At::Udp(b))]);
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
        assert_eq!(
            c.bound()[0],
            Some(At::Udp(a)),
            "the victim's address is not bound"
        );
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
        assert_eq!(c.bound()[0], Some(At::Udp(a2)));
        // The other side's bound address sees none of it.
        bind(&mut c, &ch, [2; 16], b, T + 2000);
        assert_eq!(
            c.datagram(b"data", b, T + 2100, &ch),
            Verdict::Forward { to: At::Udp(a2) }
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
        assert_eq!(c.bound(), [Some(At::Udp(a2)), Some(At::Udp(b))]);
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
        assert_eq!(
            c.datagram(b"data", b, T, &ch),
            Verdict::Forward { to: At::Udp(a) }
        );
    }

    /// docs/protocol.md §4, *Relay over a stream*: a stream bind under a side's token with
    /// its connection's nonce and its channel's port puts the side on that connection; one
    /// replayed on another connection (another nonce), or naming another channel, or a UDP
    /// bind sent on a stream, binds nothing; a side moves between UDP and its stream by
    /// binding; a closed stream leaves its side unbound.
    #[test]
    fn a_stream_bind_puts_a_side_on_its_connection_and_nowhere_else() {
        use crate::probe::stream_bind_frame;
        let ch = challenger();
        let mut c = Sides::new(40000, [[1; 16], [2; 16]], [false; 2]);
        let b: SocketAddr = "[fd00::2]:5000".parse().unwrap();
        let (n1, n2) = ([11u8; 16], [22u8; 16]);
        let bound = |side, changed| Verdict::Bound { side, changed };
        assert_eq!(bind(&mut c, &ch, [2; 16], b, T), bound(1, true));
        let ours = stream_bind_frame(&[1; 16], 40000, &n1);
        // The copy on another connection, another channel's bind, a wrong token.
        assert_eq!(
            c.stream(&ours, 8, &n2),
            Verdict::Refused(Refusal::WrongKind)
        );
        assert_eq!(
            c.stream(&stream_bind_frame(&[1; 16], 40001, &n1), 7, &n1),
            Verdict::Refused(Refusal::WrongKind)
        );
        assert_eq!(
            c.stream(&stream_bind_frame(&[3; 16], 40000, &n1), 7, &n1),
            Verdict::Refused(Refusal::WrongToken)
        );
        assert_eq!(
            c.stream(&bind_frame(&[1; 16], None), 7, &n1),
            Verdict::Refused(Refusal::WrongKind)
        );
        assert_eq!(
            c.stream(b"data", 7, &n1),
            Verdict::Refused(Refusal::Unbound)
        );
        // A stream bind sent over UDP is data from nobody.
        let x: SocketAddr = "192.0.2.66:6000".parse().unwrap();
        assert_eq!(
            c.datagram(&ours, x, T, &ch),
            Verdict::Refused(Refusal::Unbound)
        );
        assert_eq!(c.bound()[0], None);
        assert_eq!(c.stream(&ours, 7, &n1), bound(0, true));
        assert_eq!(c.stream(&ours, 7, &n1), bound(0, false));
        assert_eq!(c.bound(), [Some(At::Stream(7)), Some(At::Udp(b))]);
        assert_eq!(
            c.stream(b"data", 7, &n1),
            Verdict::Forward { to: At::Udp(b) }
        );
        assert_eq!(
            c.stream(b"data", 8, &n2),
            Verdict::Refused(Refusal::Unbound)
        );
        assert_eq!(
            c.datagram(b"data", b, T, &ch),
            Verdict::Forward { to: At::Stream(7) }
        );
        // Back to UDP by a UDP bind; then to a new connection, which then closes.
        let a: SocketAddr = "198.51.100.1:4000".parse().unwrap();
        assert_eq!(bind(&mut c, &ch, [1; 16], a, T + 1000), bound(0, true));
        assert_eq!(
            c.stream(b"data", 7, &n1),
            Verdict::Refused(Refusal::Unbound)
        );
        assert_eq!(
            c.stream(&stream_bind_frame(&[1; 16], 40000, &n2), 8, &n2),
            bound(0, true)
        );
        c.stream_closed(7);
        assert_eq!(c.bound()[0], Some(At::Stream(8)));
        c.stream_closed(8);
        assert_eq!(c.bound()[0], None);
        assert_eq!(
            c.datagram(b"data", b, T, &ch),
            Verdict::Refused(Refusal::Alone)
        );
    }
}

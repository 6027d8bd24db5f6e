//! One relay channel's rule (docs/protocol.md §4, relay), sans-IO: a bind with a side's token
//! puts that side at the address it came from; a datagram from one side's bound address goes
//! to the other side's bound address; nothing else passes. The relay's driver owns the
//! sockets and does what [`Sides::datagram`] says.

use std::net::SocketAddr;

use crate::probe::{PROBE_TOKEN_LEN, bind_token};

/// What to do with a datagram that arrived on the channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Drop it, counted.
    Refused(Refusal),
}

/// Why a datagram does not pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A bind with neither side's token.
    WrongToken,
    /// From an address no side is bound to.
    Unbound,
    /// From a bound side whose partner has not bound yet.
    Alone,
}

/// The two sides of one channel: their tokens and where each is bound.
#[derive(Clone)]
pub struct Sides {
    tokens: [[u8; PROBE_TOKEN_LEN]; 2],
    bound: [Option<SocketAddr>; 2],
}

impl core::fmt::Debug for Sides {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sides")
            .field("bound", &self.bound)
            .finish_non_exhaustive()
    }
}

/// Compares tokens in time independent of where they differ: a sender cannot learn a token
/// byte by byte from how fast binds are refused.
fn same_token(a: &[u8; PROBE_TOKEN_LEN], b: &[u8; PROBE_TOKEN_LEN]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    core::hint::black_box(diff) == 0
}

impl Sides {
    /// A channel whose sides bind with `tokens`, neither bound yet.
    pub const fn new(tokens: [[u8; PROBE_TOKEN_LEN]; 2]) -> Self {
        Self {
            tokens,
            bound: [None, None],
        }
    }

    /// Where each side is bound.
    pub const fn bound(&self) -> [Option<SocketAddr>; 2] {
        self.bound
    }

    /// What a datagram `bytes` from `from` means (a dual-stack socket's `::ffff:a.b.c.d` is
    /// the IPv4 address it is).
    pub fn datagram(&mut self, bytes: &[u8], from: SocketAddr) -> Verdict {
        let from = SocketAddr::new(from.ip().to_canonical(), from.port());
        if let Some(token) = bind_token(bytes) {
            // Both compared, whichever matches: no early exit to time.
            let matches = [
                same_token(&self.tokens[0], &token),
                same_token(&self.tokens[1], &token),
            ];
            let Some(side) = matches.iter().position(|m| *m) else {
                return Verdict::Refused(Refusal::WrongToken);
            };
            let changed = self.bound[side] != Some(from);
            self.bound[side] = Some(from);
            return Verdict::Bound { side, changed };
        }
        let side = if Some(from) == self.bound[0] {
            0
        } else if Some(from) == self.bound[1] {
            1
        } else {
            return Verdict::Refused(Refusal::Unbound);
        };
        match self.bound[1 - side] {
            Some(to) => Verdict::Forward { to },
            None => Verdict::Refused(Refusal::Alone),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::probe::bind_frame;

    #[test]
    fn binds_then_forwards_between_the_two_bound_addresses_only() {
        let mut c = Sides::new([[1; 16], [2; 16]]);
        let a: SocketAddr = "198.51.100.1:4000".parse().unwrap();
        let b: SocketAddr = "[fd00::2]:5000".parse().unwrap();
        let x: SocketAddr = "192.0.2.66:6000".parse().unwrap();
        assert_eq!(c.datagram(b"data", a), Verdict::Refused(Refusal::Unbound));
        assert_eq!(
            c.datagram(&bind_frame(&[1; 16]), a),
            Verdict::Bound {
                side: 0,
                changed: true
            }
        );
        assert_eq!(
            c.datagram(&bind_frame(&[1; 16]), a),
            Verdict::Bound {
                side: 0,
                changed: false
            },
            "the periodic bind again"
        );
        assert_eq!(c.datagram(b"data", a), Verdict::Refused(Refusal::Alone));
        assert_eq!(
            c.datagram(&bind_frame(&[3; 16]), x),
            Verdict::Refused(Refusal::WrongToken)
        );
        assert_eq!(
            c.datagram(&bind_frame(&[2; 16]), b),
            Verdict::Bound {
                side: 1,
                changed: true
            }
        );
        assert_eq!(c.datagram(b"data", a), Verdict::Forward { to: b });
        assert_eq!(c.datagram(b"data", b), Verdict::Forward { to: a });
        assert_eq!(c.datagram(b"data", x), Verdict::Refused(Refusal::Unbound));
        // A mapped IPv4 source is the IPv4 address.
        let mapped: SocketAddr = "[::ffff:198.51.100.1]:4000".parse().unwrap();
        assert_eq!(c.datagram(b"data", mapped), Verdict::Forward { to: b });
        // A side that moves rebinds.
        let a2: SocketAddr = "198.51.100.1:4001".parse().unwrap();
        assert_eq!(
            c.datagram(&bind_frame(&[1; 16]), a2),
            Verdict::Bound {
                side: 0,
                changed: true
            }
        );
        assert_eq!(c.datagram(b"data", a), Verdict::Refused(Refusal::Unbound));
        assert_eq!(c.bound(), [Some(a2), Some(b)]);
    }
}

//! The datagrams whose first fragment the filter let through, so that their later fragments
//! are judged by that verdict and not by their addresses alone (a later fragment carries no
//! ports). Keyed as a receiver reassembles them (RFC 791: protocol, source, destination and
//! IP identification; RFC 8200 §4.5 for IPv6: source, destination and the 32-bit
//! identification, the protocol being the Fragment header's next header), bounded, timed out like a reassembly queue, and strict about overlap:
//! a fragment that overlaps another of its datagram (RFC 1858's attack on the TCP header of
//! the first) is dropped, and so is every later fragment of that datagram.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::Instant;

use crate::Direction;

/// A datagram as a receiver reassembles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct DatagramKey {
    pub(crate) proto: u8,
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
    pub(crate) id: u32,
}

/// One fragment's place in its datagram, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Where its payload starts.
    pub(crate) offset: u32,
    /// Where it ends (exclusive).
    pub(crate) end: u32,
    /// More fragments follow (the MF flag).
    pub(crate) more: bool,
}

/// Why a later fragment does not pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its first fragment was not let through (never seen, dropped, timed out, evicted),
    /// or it travels the other way.
    Unknown,
    /// It overlaps a fragment already let through, or its datagram had one that did.
    Overlap,
}

/// Disjoint byte ranges kept per datagram at most: fragments that arrive in order merge
/// into one, so only a datagram sent far out of order comes near it.
const MAX_RANGES: usize = 16;

#[derive(Debug)]
struct Datagram {
    dir: Direction,
    expires: Instant,
    /// The ranges let through, sorted and merged.
    ranges: Vec<(u32, u32)>,
    /// The datagram's length, once its last fragment passed.
    total: Option<u32>,
    /// A fragment overlapped: nothing more of it passes.
    poisoned: bool,
    serial: u64,
}

/// The datagrams in reassembly, at most `capacity`; the oldest goes when full.
#[derive(Debug)]
pub(crate) struct Fragments {
    datagrams: HashMap<DatagramKey, Datagram>,
    order: VecDeque<(DatagramKey, u64)>,
    serial: u64,
    capacity: usize,
    /// Datagrams forgotten to make room.
    pub(crate) evicted: u64,
}

impl Fragments {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            datagrams: HashMap::new(),
            order: VecDeque::new(),
            serial: 0,
            capacity: capacity.max(1),
            evicted: 0,
        }
    }

    /// Datagrams kept now.
    pub(crate) fn len(&self) -> usize {
        self.datagrams.len()
    }

    /// The first fragment `piece` of datagram `key`, travelling `dir`, was let through: its
    /// later fragments may follow until `expires`. A datagram of the same key already kept
    /// is replaced (the IP identification came round again).
    pub(crate) fn first(
        &mut self,
        key: DatagramKey,
        dir: Direction,
        piece: Piece,
        expires: Instant,
    ) {
        self.datagrams.remove(&key);
        while self.datagrams.len() >= self.capacity {
            let Some((old, serial)) = self.order.pop_front() else {
                break;
            };
            if self.datagrams.get(&old).is_some_and(|d| d.serial == serial) {
                self.datagrams.remove(&old);
                self.evicted += 1;
            }
        }
        self.serial += 1;
        self.datagrams.insert(
            key,
            Datagram {
                dir,
                expires,
                ranges: vec![(0, piece.end)],
                total: None,
                poisoned: false,
                serial: self.serial,
            },
        );
        self.order.push_back((key, self.serial));
        if self.order.len() > 2 * self.capacity + 64 {
            let kept = &self.datagrams;
            self.order
                .retain(|(k, s)| kept.get(k).is_some_and(|d| d.serial == *s));
        }
    }

    /// Whether the later fragment `piece` of datagram `key`, travelling `dir` at `now`, may
    /// pass. A datagram is forgotten once whole.
    pub(crate) fn later(
        &mut self,
        key: DatagramKey,
        dir: Direction,
        piece: Piece,
        now: Instant,
    ) -> Result<(), Refused> {
        let Some(d) = self.datagrams.get_mut(&key) else {
            return Err(Refused::Unknown);
        };
        if d.expires <= now {
            self.datagrams.remove(&key);
            return Err(Refused::Unknown);
        }
        if d.dir != dir {
            return Err(Refused::Unknown);
        }
        if d.poisoned {
            return Err(Refused::Overlap);
        }
        let past_end = d.total.is_some_and(|t| piece.end > t)
            || (!piece.more && d.ranges.last().is_some_and(|&(_, e)| e > piece.end));
        let overlaps = d
            .ranges
            .iter()
            .any(|&(s, e)| piece.offset < e && s < piece.end);
        if past_end || overlaps || (!piece.more && d.total.is_some()) {
            d.poisoned = true;
            return Err(Refused::Overlap);
        }
        let at = d.ranges.partition_point(|&(s, _)| s < piece.offset);
        d.ranges.insert(at, (piece.offset, piece.end));
        // Merge with the neighbours it touches.
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(d.ranges.len());
        for &(s, e) in &d.ranges {
            match merged.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => merged.push((s, e)),
            }
        }
        if merged.len() > MAX_RANGES {
            d.poisoned = true;
            return Err(Refused::Overlap);
        }
        d.ranges = merged;
        if !piece.more {
            d.total = Some(piece.end);
        }
        if d.total.is_some_and(|t| d.ranges == [(0, t)]) {
            self.datagrams.remove(&key);
        }
        Ok(())
    }

    /// Forgets the datagrams that timed out by `now`; returns how many.
    pub(crate) fn expire(&mut self, now: Instant) -> usize {
        let before = self.datagrams.len();
        self.datagrams.retain(|_, d| d.expires > now);
        before - self.datagrams.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const KEY: DatagramKey = DatagramKey {
        proto: 17,
        src: IpAddr::V4(std::net::Ipv4Addr::new(100, 64, 1, 9)),
        dst: IpAddr::V4(std::net::Ipv4Addr::new(100, 64, 2, 7)),
        id: 7,
    };

    fn piece(offset: u32, end: u32, more: bool) -> Piece {
        Piece { offset, end, more }
    }

    #[test]
    fn a_datagram_in_any_order_after_its_first_then_forgotten_when_whole() {
        let t = Instant::now();
        let mut f = Fragments::new(4);
        f.first(
            KEY,
            Direction::Out,
            piece(0, 1480, true),
            t + Duration::from_secs(30),
        );
        // The last one before the middle one.
        assert_eq!(
            f.later(KEY, Direction::Out, piece(2960, 3000, false), t),
            Ok(())
        );
        assert_eq!(f.len(), 1);
        assert_eq!(
            f.later(KEY, Direction::Out, piece(1480, 2960, true), t),
            Ok(())
        );
        assert_eq!(f.len(), 0, "whole: forgotten");
        // Nothing of it passes after that.
        assert_eq!(
            f.later(KEY, Direction::Out, piece(1480, 2960, true), t),
            Err(Refused::Unknown)
        );
    }

    #[test]
    fn overlaps_poison_the_datagram() {
        let t = Instant::now();
        let mut f = Fragments::new(4);
        let end = t + Duration::from_secs(30);
        f.first(KEY, Direction::In, piece(0, 24, true), end);
        // RFC 1858: a fragment at offset 8 rewriting the TCP header's flags.
        assert_eq!(
            f.later(KEY, Direction::In, piece(8, 48, true), t),
            Err(Refused::Overlap)
        );
        // The datagram is spoilt: what would have been fine is dropped too.
        assert_eq!(
            f.later(KEY, Direction::In, piece(24, 48, false), t),
            Err(Refused::Overlap)
        );
        // A duplicate, a fragment past the end, a second last fragment: all overlaps.
        for bad in [
            piece(24, 48, true),
            piece(96, 104, true),
            piece(48, 64, false),
        ] {
            f.first(KEY, Direction::In, piece(0, 24, true), end);
            assert_eq!(f.later(KEY, Direction::In, piece(24, 48, true), t), Ok(()));
            assert_eq!(f.later(KEY, Direction::In, piece(64, 72, false), t), Ok(()));
            assert_eq!(
                f.later(KEY, Direction::In, bad, t),
                Err(Refused::Overlap),
                "{bad:?}"
            );
        }
        // A last fragment that ends before what passed already.
        f.first(KEY, Direction::In, piece(0, 24, true), end);
        assert_eq!(f.later(KEY, Direction::In, piece(40, 48, true), t), Ok(()));
        assert_eq!(
            f.later(KEY, Direction::In, piece(24, 32, false), t),
            Err(Refused::Overlap)
        );
    }

    #[test]
    fn unknown_the_wrong_way_timed_out_or_evicted_datagrams_pass_nothing() {
        let t = Instant::now();
        let mut f = Fragments::new(2);
        let end = t + Duration::from_secs(30);
        assert_eq!(
            f.later(KEY, Direction::In, piece(8, 16, false), t),
            Err(Refused::Unknown)
        );
        f.first(KEY, Direction::In, piece(0, 8, true), end);
        assert_eq!(
            f.later(KEY, Direction::Out, piece(8, 16, false), t),
            Err(Refused::Unknown)
        );
        assert_eq!(
            f.later(KEY, Direction::In, piece(8, 16, true), end),
            Err(Refused::Unknown),
            "timed out"
        );
        f.first(KEY, Direction::In, piece(0, 8, true), end);
        for id in 1..=2 {
            f.first(
                DatagramKey { id, ..KEY },
                Direction::In,
                piece(0, 8, true),
                end,
            );
        }
        assert_eq!((f.len(), f.evicted), (2, 1));
        assert_eq!(
            f.later(KEY, Direction::In, piece(8, 16, true), t),
            Err(Refused::Unknown),
            "the oldest went"
        );
        assert_eq!(f.expire(end), 2);
    }

    #[test]
    fn a_datagram_in_too_many_pieces_is_given_up() {
        let t = Instant::now();
        let mut f = Fragments::new(2);
        f.first(
            KEY,
            Direction::In,
            piece(0, 8, true),
            t + Duration::from_secs(30),
        );
        let mut refused = None;
        for i in 0..u32::try_from(MAX_RANGES).unwrap_or(16) + 1 {
            let at = 16 + 16 * i;
            if let Err(e) = f.later(KEY, Direction::In, piece(at, at + 8, true), t) {
                refused = Some((i, e));
                break;
            }
        }
        // The first and 15 more apart: the 16th apart is one too many.
        assert_eq!(
            refused,
            Some((
                u32::try_from(MAX_RANGES).unwrap_or(16) - 1,
                Refused::Overlap
            ))
        );
    }
}

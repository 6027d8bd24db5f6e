//! What the DHCPv4 and DHCPv6 servers share about their pools: which part of a pool new
//! bindings come from (an HA pair's halves, [`Share`]), and the starvation guard's window
//! for clients never seen before.

use std::collections::VecDeque;

/// One half of the dynamic pool: `Lower` runs from its first address to its middle, `Upper`
/// from there to its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    /// The first half.
    Lower,
    /// The second half.
    Upper,
}

/// Where addresses new to a device come from (`Server::set_share`): the two boxes of an HA
/// pair each own one half of the pool, so that while both serve, out of contact, no address
/// goes to two devices (docs/protocol.md §5, *Split brain*). An address a device holds, or
/// held and nobody took since, stays its own whatever its half.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Share {
    /// The whole pool, in order: a lone server.
    #[default]
    Whole,
    /// This half first, the other only once it is full: the pair in contact.
    Prefer(Half),
    /// This half only: the pair out of contact.
    Only(Half),
}

impl Share {
    /// Where new addresses of the pool `first..=last` (as numbers) are looked for, in order:
    /// the share's first range, then (when the share allows) the second. An empty second
    /// half (a pool of one) is `None`.
    pub(crate) fn ranges(self, first: u128, last: u128) -> [Option<(u128, u128)>; 2] {
        let mid = first + (last - first) / 2;
        let lower = (first, mid);
        let upper = (mid < last).then_some((mid + 1, last));
        match self {
            Self::Whole => [Some((first, last)), None],
            Self::Prefer(Half::Lower) => [Some(lower), upper],
            Self::Prefer(Half::Upper) => [upper, Some(lower)],
            Self::Only(Half::Lower) => [Some(lower), None],
            Self::Only(Half::Upper) => [upper, None],
        }
    }

    /// Whether the share lets address `n` of the pool `first..=last` go to a device it is
    /// new to.
    pub(crate) fn allows(self, first: u128, last: u128, n: u128) -> bool {
        match self {
            Self::Whole | Self::Prefer(_) => true,
            Self::Only(_) => {
                self.ranges(first, last)[0].is_some_and(|(lo, hi)| (lo..=hi).contains(&n))
            }
        }
    }
}

/// The starvation guard's memory: when clients never seen before were bound.
#[derive(Debug, Clone, Default)]
pub(crate) struct Newcomers {
    recent: VecDeque<u64>,
}

impl Newcomers {
    /// Whether one more newcomer may be bound at `now`: fewer than `share` within the last
    /// `window` seconds. Counts it when it may.
    pub(crate) fn admit(&mut self, now: u64, window: u64, share: usize) -> bool {
        while self
            .recent
            .front()
            .is_some_and(|t| now.saturating_sub(*t) >= window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= share {
            return false;
        }
        self.recent.push_back(now);
        true
    }
}

/// `fraction` of a pool of `size` addresses, at least one.
pub(crate) fn share_of(size: u128, fraction: f64) -> usize {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a share of a pool of at most 2^32 addresses"
    )]
    let share = (size as f64 * fraction).floor() as usize;
    share.max(1)
}

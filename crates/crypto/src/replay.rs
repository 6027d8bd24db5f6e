//! Anti-replay sliding window for received counters (RFC 6479).
//!
//! A ring of 64-bit words; moving the window forward clears whole words instead of shifting
//! bits, so the cost per packet is constant. One word of the ring is always being recycled,
//! hence the usable window is [`WINDOW`] = ring bits - 64.

/// Bits in the ring.
const RING_BITS: u64 = 8192;
/// Bits per ring word.
const WORD_BITS: u64 = 64;
/// Words in the ring.
const WORDS: usize = (RING_BITS / WORD_BITS) as usize;
/// How far behind the highest accepted counter a packet may arrive and still be accepted.
/// At least 2048 is required: parallel crypto workers, the underlay and relays
/// all reorder packets, and a packet dropped as "too old" looks like loss to TCP.
pub const WINDOW: u64 = RING_BITS - WORD_BITS;

/// Why a counter is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// This counter was already accepted.
    #[error("counter {0} already received (replay)")]
    Duplicate(u64),
    /// This counter lies behind the window; it can no longer be told apart from a replay.
    #[error("counter {counter} is older than the replay window (newest {newest})")]
    TooOld {
        /// The refused counter.
        counter: u64,
        /// The newest counter accepted so far.
        newest: u64,
    },
    /// At or beyond the session's message limit: a sender never uses such a counter.
    #[error("counter {0} is beyond the session's limit")]
    Exhausted(u64),
}

/// Which counters of one receiving key have been seen.
#[derive(Clone)]
pub struct ReplayWindow {
    /// Highest counter accepted so far (meaningful once `any` is set).
    newest: u64,
    /// Whether anything was accepted yet (so that counter 0 is handled like the others).
    any: bool,
    /// Highest counter value a valid sender may use (exclusive).
    limit: u64,
    ring: [u64; WORDS],
}

impl core::fmt::Debug for ReplayWindow {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReplayWindow")
            .field("newest", &self.newest)
            .field("any", &self.any)
            .finish()
    }
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::new(u64::MAX)
    }
}

impl ReplayWindow {
    /// An empty window for a key whose sender stops before counter `limit`.
    pub const fn new(limit: u64) -> Self {
        Self {
            newest: 0,
            any: false,
            limit,
            ring: [0; WORDS],
        }
    }

    /// The highest counter accepted so far, if any.
    pub const fn newest(&self) -> Option<u64> {
        if self.any { Some(self.newest) } else { None }
    }

    /// Whether `counter` would be accepted, without recording it. Cheap enough to run before
    /// spending a decryption on a frame.
    ///
    /// # Errors
    /// [`ReplayError`] saying why the counter would be refused.
    pub fn check(&self, counter: u64) -> Result<(), ReplayError> {
        if counter >= self.limit {
            return Err(ReplayError::Exhausted(counter));
        }
        if !self.any || counter > self.newest {
            return Ok(());
        }
        if self.newest - counter >= WINDOW {
            return Err(ReplayError::TooOld {
                counter,
                newest: self.newest,
            });
        }
        let (word, bit) = Self::position(counter);
        if self.ring[word] & bit != 0 {
            return Err(ReplayError::Duplicate(counter));
        }
        Ok(())
    }

    /// Records `counter` if it is acceptable. Call it only after the frame authenticated:
    /// an unauthenticated counter must never move the window.
    ///
    /// # Errors
    /// [`ReplayError`] saying why the counter is refused; the window is then unchanged.
    pub fn accept(&mut self, counter: u64) -> Result<(), ReplayError> {
        self.check(counter)?;
        if !self.any || counter > self.newest {
            self.advance_to(counter);
        }
        let (word, bit) = Self::position(counter);
        self.ring[word] |= bit;
        Ok(())
    }

    /// Moves the top of the window to `counter`, clearing the words that slide into view.
    fn advance_to(&mut self, counter: u64) {
        let new_word = counter / WORD_BITS;
        if self.any {
            let old_word = self.newest / WORD_BITS;
            let steps = (new_word - old_word).min(WORDS as u64);
            for i in 1..=steps {
                self.ring[Self::slot(old_word + i)] = 0;
            }
        } else {
            self.ring = [0; WORDS];
        }
        self.newest = counter;
        self.any = true;
    }

    fn position(counter: u64) -> (usize, u64) {
        (
            Self::slot(counter / WORD_BITS),
            1u64 << (counter % WORD_BITS),
        )
    }

    /// The ring slot of word number `word`.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the remainder is below WORDS (128)"
    )]
    const fn slot(word: u64) -> usize {
        (word % WORDS as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds counters in order and checks each verdict: `Ok` or the error kind.
    fn check(window: &mut ReplayWindow, steps: &[(u64, Result<(), ReplayError>)]) {
        for &(counter, expect) in steps {
            assert_eq!(window.accept(counter), expect, "counter {counter}");
        }
    }

    #[test]
    fn in_order_and_duplicates() {
        let mut w = ReplayWindow::default();
        check(
            &mut w,
            &[
                (0, Ok(())),
                (1, Ok(())),
                (1, Err(ReplayError::Duplicate(1))),
                (0, Err(ReplayError::Duplicate(0))),
                (2, Ok(())),
            ],
        );
        assert_eq!(w.newest(), Some(2));
    }

    #[test]
    fn out_of_order_inside_the_window_is_accepted_once() {
        let mut w = ReplayWindow::default();
        check(
            &mut w,
            &[
                (5000, Ok(())),
                (3000, Ok(())),
                (4999, Ok(())),
                (3000, Err(ReplayError::Duplicate(3000))),
            ],
        );
        // 5000 is less than WINDOW ahead of 0: everything from 0 is still inside.
        check(&mut w, &[(0, Ok(()))]);
        // The oldest acceptable counter is newest - WINDOW + 1.
        let mut w = ReplayWindow::default();
        check(
            &mut w,
            &[
                (10_000, Ok(())),
                (10_000 - WINDOW + 1, Ok(())),
                (
                    10_000 - WINDOW,
                    Err(ReplayError::TooOld {
                        counter: 10_000 - WINDOW,
                        newest: 10_000,
                    }),
                ),
            ],
        );
    }

    #[test]
    fn window_is_at_least_2048() {
        const { assert!(WINDOW >= 2048) };
        let mut w = ReplayWindow::default();
        w.accept(2047).unwrap();
        w.accept(0).unwrap();
    }

    #[test]
    fn big_jump_clears_stale_bits() {
        let mut w = ReplayWindow::default();
        for c in 0..200 {
            w.accept(c).unwrap();
        }
        // Jump far ahead: the old bits must not make new counters look like duplicates.
        let top = 1_000_000;
        w.accept(top).unwrap();
        for c in (top - 500)..top {
            w.accept(c).unwrap();
        }
        // Jump by exactly one ring length.
        w.accept(top + RING_BITS).unwrap();
        w.accept(top + RING_BITS - 1).unwrap();
        assert_eq!(
            w.accept(top),
            Err(ReplayError::TooOld {
                counter: top,
                newest: top + RING_BITS
            })
        );
    }

    #[test]
    fn limit_is_refused() {
        let mut w = ReplayWindow::new(10);
        assert_eq!(w.accept(10), Err(ReplayError::Exhausted(10)));
        assert_eq!(w.accept(u64::MAX), Err(ReplayError::Exhausted(u64::MAX)));
        w.accept(9).unwrap();
        let mut w = ReplayWindow::default();
        assert_eq!(w.accept(u64::MAX), Err(ReplayError::Exhausted(u64::MAX)));
        w.accept(u64::MAX - 1).unwrap();
    }

    #[test]
    fn check_does_not_record() {
        let mut w = ReplayWindow::default();
        w.check(3).unwrap();
        w.check(3).unwrap();
        w.accept(3).unwrap();
        assert_eq!(w.check(3), Err(ReplayError::Duplicate(3)));
    }

    proptest::proptest! {
        /// Against a model (the set of accepted counters): a counter is accepted iff it is new,
        /// below the limit and not older than WINDOW behind the newest.
        #[test]
        fn matches_a_set_model(ops in proptest::collection::vec(0u64..20_000, 1..3000)) {
            let mut w = ReplayWindow::default();
            let mut seen = std::collections::HashSet::new();
            let mut newest: Option<u64> = None;
            for c in ops {
                let expect_ok = !seen.contains(&c) && newest.is_none_or(|n| c > n || n - c < WINDOW);
                let got = w.accept(c);
                proptest::prop_assert_eq!(got.is_ok(), expect_ok, "counter {} newest {:?}", c, newest);
                if expect_ok {
                    seen.insert(c);
                    newest = Some(newest.map_or(c, |n| n.max(c)));
                }
            }
        }
    }
}

//! Busy polling: a receiving thread that, for a while after its last packet, keeps asking its
//! socket for the next one instead of going to sleep until the kernel wakes it.
//!
//! A blocked thread costs a wake-up per burst: the interrupt, the scheduler, the context
//! switch (0.01-0.05 ms each on the bench's VM, docs/benchmarks.md, "The fast path"), and an idle
//! ping through the tunnel meets four of them. A polling thread asks without waiting
//! (`MSG_DONTWAIT`) and gives the CPU up between asks (`sched_yield`), so the other runnable
//! threads on its core still run; once its socket has been quiet for the whole window it
//! blocks as before, so an idle appliance does not spin. It costs a core's worth of polling
//! per receiving thread while traffic lasts, which is why it is off by default and meant for
//! cores set aside for the data plane (`[dataplane] cpus`).

use std::io;
use std::time::{Duration, Instant};

/// The busy-polling state of one receiving socket (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct BusyPoll {
    window: Duration,
    most: Option<Duration>,
    last: Option<Instant>,
}

impl BusyPoll {
    /// Polls for up to `window` after each packet; a single [`Self::receive`] polls for at
    /// most `most` (the socket's receive timeout, so that the thread still looks at its other
    /// work that often; `None`: until the window closes). `None` when `window` is zero: off.
    pub fn new(window: Duration, most: Option<Duration>) -> Option<Self> {
        (!window.is_zero()).then_some(Self {
            window,
            most,
            last: None,
        })
    }

    /// One receive: `recv(wait)` is the socket's receive call, waiting (up to the socket's
    /// timeout) or not (`MSG_DONTWAIT`), returning how many packets arrived. While the window
    /// after the last packet is open, polls: returns what arrives, or 0 once `most` has
    /// passed. Otherwise it makes the waiting call.
    ///
    /// # Errors
    /// What `recv` returns.
    pub fn receive(
        &mut self,
        mut recv: impl FnMut(bool) -> io::Result<usize>,
    ) -> io::Result<usize> {
        if let Some(last) = self.last {
            let start = Instant::now();
            let mut now = start;
            while now.duration_since(last) < self.window {
                let got = recv(false)?;
                now = Instant::now();
                if got > 0 {
                    self.last = Some(now);
                    return Ok(got);
                }
                if self
                    .most
                    .is_some_and(|most| now.duration_since(start) >= most)
                {
                    return Ok(0);
                }
                std::thread::yield_now();
            }
        }
        let got = recv(true)?;
        if got > 0 {
            self.last = Some(Instant::now());
        }
        Ok(got)
    }
}

/// [`BusyPoll::receive`] if there is one, else the waiting call alone.
pub fn receive(
    busy: Option<&mut BusyPoll>,
    mut recv: impl FnMut(bool) -> io::Result<usize>,
) -> io::Result<usize> {
    match busy {
        Some(b) => b.receive(recv),
        None => recv(true),
    }
}

/// The receive flag for `wait`: `MSG_DONTWAIT` when not waiting.
pub(crate) const fn dont_wait(wait: bool) -> libc::c_int {
    if wait { 0 } else { libc::MSG_DONTWAIT }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted socket: answers each call with the next count (0 when the script is over)
    /// and records whether each call waited.
    struct Script {
        answers: Vec<usize>,
        waited: Vec<bool>,
    }

    impl Script {
        fn new(answers: &[usize]) -> Self {
            Self {
                answers: answers.iter().rev().copied().collect(),
                waited: Vec::new(),
            }
        }

        fn recv(&mut self, wait: bool) -> io::Result<usize> {
            self.waited.push(wait);
            Ok(self.answers.pop().unwrap_or(0))
        }
    }

    #[test]
    fn zero_window_is_off() {
        assert!(BusyPoll::new(Duration::ZERO, None).is_none());
        let mut s = Script::new(&[2]);
        assert_eq!(receive(None, |w| s.recv(w)).ok(), Some(2));
        assert_eq!(s.waited, [true], "without polling every call waits");
    }

    /// Before any packet there is nothing to keep polling for: the first call waits; after a
    /// packet the next ones poll without waiting until something comes.
    #[test]
    fn polls_after_a_packet_until_the_next() {
        let Some(mut busy) = BusyPoll::new(Duration::from_secs(60), None) else {
            panic!("a window of a minute is on");
        };
        let mut s = Script::new(&[1, 0, 0, 0, 3]);
        assert_eq!(busy.receive(|w| s.recv(w)).ok(), Some(1));
        assert_eq!(s.waited, [true]);
        assert_eq!(busy.receive(|w| s.recv(w)).ok(), Some(3));
        assert_eq!(s.waited[1..], [false; 4]);
    }

    /// A poll gives up after `most`, so the thread can look at its other work, and keeps
    /// polling on the next call while the window is open.
    #[test]
    fn a_poll_returns_after_most() {
        let Some(mut busy) = BusyPoll::new(Duration::from_secs(60), Some(Duration::from_millis(1)))
        else {
            panic!("on");
        };
        let mut s = Script::new(&[1]);
        assert_eq!(busy.receive(|w| s.recv(w)).ok(), Some(1));
        assert_eq!(busy.receive(|w| s.recv(w)).ok(), Some(0));
        assert!(s.waited.len() > 1);
        assert!(s.waited[1..].iter().all(|&w| !w));
        let before = s.waited.len();
        assert_eq!(busy.receive(|w| s.recv(w)).ok(), Some(0));
        assert!(!s.waited[before], "still within the window");
    }

    /// Once the socket has been quiet for the whole window, the thread waits again.
    #[test]
    fn a_quiet_window_ends_in_a_waiting_call() {
        let Some(mut busy) = BusyPoll::new(Duration::from_millis(2), None) else {
            panic!("on");
        };
        let mut s = Script::new(&[1]);
        assert_eq!(busy.receive(|w| s.recv(w)).ok(), Some(1));
        assert_eq!(busy.receive(|w| s.recv(w)).ok(), Some(0));
        assert_eq!(s.waited.last(), Some(&true), "the last call waits");
        assert!(s.waited[1..s.waited.len() - 1].iter().all(|&w| !w));
        // Quiet since: the next call waits at once.
        let before = s.waited.len();
        assert_eq!(busy.receive(|w| s.recv(w)).ok(), Some(0));
        assert_eq!(s.waited[before..], [true]);
    }

    #[test]
    fn errors_pass_through() {
        let Some(mut busy) = BusyPoll::new(Duration::from_secs(1), None) else {
            panic!("on");
        };
        let got = busy.receive(|_| Err(io::Error::from(io::ErrorKind::ConnectionRefused)));
        assert_eq!(
            got.map_err(|e| e.kind()),
            Err(io::ErrorKind::ConnectionRefused)
        );
    }
}

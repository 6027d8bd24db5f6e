//! Where the data-plane threads run: CPU affinity and real-time priority (paper 004's core
//! isolation). Both off unless configured.

use std::io;

/// CPU affinity and scheduling for a data-plane thread. The default changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// CPUs the thread may run on; empty: wherever the process may.
    pub cpus: Vec<usize>,
    /// `SCHED_FIFO` priority, 1 to 99; 0: the normal scheduler. A real-time thread runs as soon
    /// as it is woken instead of waiting for its turn behind other work on the core (needs
    /// `CAP_SYS_NICE`; the kernel still keeps 5% of each second for everything else).
    pub realtime_priority: u8,
}

/// Highest CPU number a `cpu_set_t` can hold, plus one.
pub const MAX_CPUS: usize = libc::CPU_SETSIZE as usize;

impl Placement {
    /// Whether this changes nothing.
    pub fn is_default(&self) -> bool {
        self.cpus.is_empty() && self.realtime_priority == 0
    }

    /// Checks the CPUs against those this process may use.
    ///
    /// # Errors
    /// A CPU out of reach, naming the CPUs that are allowed.
    pub fn check(&self) -> Result<(), String> {
        if self.cpus.is_empty() {
            return Ok(());
        }
        let allowed = allowed_cpus().map_err(|e| format!("reading this process's CPUs: {e}"))?;
        match self.cpus.iter().find(|c| !allowed.contains(c)) {
            Some(c) => Err(format!(
                "CPU {c} is not available to this process (it may use {allowed:?})"
            )),
            None => Ok(()),
        }
    }

    /// Applies to the calling thread.
    ///
    /// # Errors
    /// The kernel's refusal: a CPU out of reach, or `EPERM` without `CAP_SYS_NICE`.
    pub fn apply(&self) -> io::Result<()> {
        if !self.cpus.is_empty() {
            // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            for &c in &self.cpus {
                if c >= MAX_CPUS {
                    return Err(io::Error::from_raw_os_error(libc::EINVAL));
                }
                // SAFETY: `c` < CPU_SETSIZE, so CPU_SET stays inside `set`.
                unsafe { libc::CPU_SET(c, &mut set) };
            }
            // SAFETY: `set` is a live cpu_set_t of the size passed; pid 0 is this thread.
            let r =
                unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if self.realtime_priority > 0 {
            let param = libc::sched_param {
                sched_priority: libc::c_int::from(self.realtime_priority.min(99)),
            };
            // SAFETY: `param` is a live sched_param; pid 0 is this thread.
            let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The CPUs the calling thread may run on.
///
/// # Errors
/// `sched_getaffinity(2)` failing.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain old data; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live, writable cpu_set_t of the size passed; pid 0 is this thread.
    let r = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `c` < CPU_SETSIZE, so CPU_ISSET reads inside `set`.
    Ok((0..MAX_CPUS)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_pinned_where_it_is_told_and_out_of_reach_cpus_are_refused() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        let first = allowed[0];
        let p = Placement {
            cpus: vec![first],
            realtime_priority: 0,
        };
        assert_eq!(p.check(), Ok(()));
        // On a thread of its own: the test harness's threads keep their affinity.
        std::thread::spawn(move || {
            p.apply().unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![first]);
        })
        .join()
        .unwrap();
        let far = Placement {
            cpus: vec![MAX_CPUS - 1],
            realtime_priority: 0,
        };
        let e = far.check().unwrap_err();
        assert!(e.contains(&format!("CPU {}", MAX_CPUS - 1)), "{e}");
        let beyond = Placement {
            cpus: vec![MAX_CPUS],
            realtime_priority: 0,
        };
        assert!(beyond.apply().is_err());
        assert!(Placement::default().is_default());
        assert!(Placement::default().apply().is_ok());
    }
}

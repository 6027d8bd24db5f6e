//! Attacks on the bed and what they cost the adapter under them, shared by the hostile-network
//! tests (e2e/tests/hostile.rs) and the "under attack" benchmark (`cyphonic-bed attack`).
//! Every load is bounded in time and sent inside the bed's own namespaces.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;

use crate::bed::{Ping, TwoSites};
use crate::inject;

/// A's first initiation to B, captured on the router as it crosses it: the bed's adapters
/// must be up and have no tunnel yet (this pings from lanA to lanB to start one).
///
/// # Errors
/// No initiation crossed the router within six seconds.
pub fn capture_initiation(bed: &TwoSites) -> anyhow::Result<Vec<u8>> {
    std::thread::scope(|s| {
        let capture = s.spawn(|| {
            inject::capture_udp(&bed.wan, "toa", 51820, 1, Duration::from_secs(6), |p| {
                p.len() > 16 && p[0] == cyphonic_wire::VERSION && p[1] == 1
            })
        });
        // The capture socket is open well before the first packet asks for a handshake.
        std::thread::sleep(Duration::from_millis(500));
        bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(2).wait(3));
        let frames = capture
            .join()
            .map_err(|_| anyhow::anyhow!("the capture thread panicked"))??;
        frames
            .into_iter()
            .next()
            .context("no initiation crossed the router")
    })
}

/// CPU time (user and system, in clock ticks) each thread of process `pid` has used, by
/// thread name; the main thread (the daemons' control thread) is named `control`. Threads of
/// one name (the crypto workers) are summed.
///
/// # Errors
/// The process is gone.
pub fn thread_ticks(pid: u32) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    let dir = format!("/proc/{pid}/task");
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let entry = entry?;
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        // "tid (comm) state ...": the name may hold spaces and parentheses, so split at the
        // last ')'; utime and stime are fields 14 and 15, the 12th and 13th after it.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map_or("", |(_, n)| n);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let name = if entry.file_name().to_string_lossy() == pid.to_string() {
            "control".to_owned()
        } else {
            name.trim_end_matches(|c: char| c.is_ascii_digit())
                .trim_end_matches('-')
                .to_owned()
        };
        *out.entry(name).or_default() += ticks(11) + ticks(12);
    }
    Ok(out)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`; 100 on every Linux this runs on).
pub const TICKS_PER_SEC: f64 = 100.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_control_thread_with_ticks() {
        let busy = std::thread::Builder::new()
            .name("cy-busy-1".into())
            .spawn(|| {
                let t = std::time::Instant::now();
                let mut x = 0u64;
                while t.elapsed() < Duration::from_millis(300) {
                    x = x.wrapping_add(1);
                }
                std::hint::black_box(x);
                std::thread::sleep(Duration::from_millis(200));
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(350));
        let ticks = thread_ticks(std::process::id()).unwrap();
        busy.join().unwrap();
        assert!(ticks.contains_key("control"), "{ticks:?}");
        assert!(ticks.get("cy-busy").is_some_and(|t| *t >= 10), "{ticks:?}");
    }
}

//! Who holds the CPUs while a thread waits to run: a `perf sched record -a` trace read
//! back (`perf script`), for `cyphonic-bed tune --sched`. A thread waits from the moment it
//! is woken, or preempted while runnable, until it is switched in; every other task's run
//! time on every CPU inside those intervals is summed by task.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context as _;

/// One scheduler event of the trace.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// `sched_switch` on `cpu` at `t` (seconds): `prev` leaves it (still runnable if it was
    /// preempted), `next` takes it.
    Switch {
        cpu: u32,
        t: f64,
        prev: u32,
        prev_runnable: bool,
        next: u32,
        next_comm: String,
    },
    /// `sched_waking` of thread `tid` at `t`.
    Waking { t: f64, tid: u32 },
}

/// The value after `key=` in a tracepoint's text, up to the next ` name=` (a comm may hold
/// spaces) or, for the last key, to the end or to ` ==>`.
fn field<'a>(trace: &'a str, key: &str) -> Option<&'a str> {
    let start = trace.find(&format!("{key}="))? + key.len() + 1;
    let rest = &trace[start..];
    let end = [
        " prev_",
        " next_",
        " pid=",
        " prio=",
        " target_cpu=",
        " ==>",
    ]
    .iter()
    .filter_map(|k| rest.find(k))
    .min()
    .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// One line of `perf script -F cpu,time,event,trace`; `None` for other events.
fn parse(line: &str) -> Option<Event> {
    let cpu = line
        .split_once('[')?
        .1
        .split_once(']')?
        .0
        .trim()
        .parse()
        .ok()?;
    // "[001] 59631.478383:       sched:sched_switch: ..."
    let (head, trace) = line.split_once(" sched:")?;
    let t: f64 = head
        .rsplit_once(']')?
        .1
        .trim()
        .trim_end_matches(':')
        .parse()
        .ok()?;
    if let Some(trace) = trace.strip_prefix("sched_switch: ") {
        Some(Event::Switch {
            cpu,
            t,
            prev: field(trace, "prev_pid")?.parse().ok()?,
            prev_runnable: field(trace, "prev_state")?.starts_with('R'),
            next: field(trace, "next_pid")?.parse().ok()?,
            next_comm: field(trace, "next_comm")?.to_owned(),
        })
    } else if let Some(trace) = trace.strip_prefix("sched_waking: ") {
        Some(Event::Waking {
            t,
            tid: field(trace, "pid")?.parse().ok()?,
        })
    } else {
        None
    }
}

/// Where a thread's time went while a trace lasted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Waited {
    /// Seconds from the first switch to the last.
    pub span: f64,
    /// Seconds it ran.
    pub ran: f64,
    /// Its waits to run, seconds each.
    pub waits: Vec<f64>,
    /// The other tasks' run time on every CPU during those waits, by label, most first.
    pub held_by: Vec<(String, f64)>,
}

/// What `target` did in `events` (in time order); `label` names a task by thread id and
/// command.
fn waited(events: &[Event], target: u32, label: impl Fn(u32, &str) -> String) -> Option<Waited> {
    let mut runs: HashMap<u32, Vec<(f64, f64, String)>> = HashMap::new();
    let mut current: HashMap<u32, (f64, u32, String)> = HashMap::new();
    let (mut waits, mut since) = (Vec::<(f64, f64)>::new(), None);
    let (mut first, mut last, mut ran) = (None, 0.0, 0.0);
    for e in events {
        match e {
            Event::Switch {
                cpu,
                t,
                prev,
                prev_runnable,
                next,
                next_comm,
            } => {
                first.get_or_insert(*t);
                last = *t;
                if let Some((start, tid, name)) =
                    current.insert(*cpu, (*t, *next, label(*next, next_comm)))
                {
                    if tid == target {
                        ran += t - start;
                    }
                    runs.entry(*cpu).or_default().push((start, *t, name));
                }
                if *prev == target && *prev_runnable {
                    since = Some(*t);
                }
                if *next == target
                    && let Some(s) = since.take()
                {
                    waits.push((s, *t));
                }
            }
            Event::Waking { t, tid } => {
                // A thread woken while it still runs (it was about to sleep) does not wait.
                let running = current.values().any(|(_, tid, _)| *tid == target);
                if *tid == target && since.is_none() && !running {
                    since = Some(*t);
                }
            }
        }
    }
    let span = last - first?;
    let mut held: HashMap<String, f64> = HashMap::new();
    for segments in runs.values() {
        // Both lists are in time order and the waits do not overlap: one sweep.
        let mut w = 0;
        for (start, end, name) in segments {
            while w < waits.len() && waits[w].1 <= *start {
                w += 1;
            }
            let mut i = w;
            while i < waits.len() && waits[i].0 < *end {
                let overlap = end.min(waits[i].1) - start.max(waits[i].0);
                if overlap > 0.0 {
                    *held.entry(name.clone()).or_default() += overlap;
                }
                i += 1;
            }
        }
    }
    let mut held_by: Vec<_> = held.into_iter().collect();
    held_by.sort_by(|a, b| b.1.total_cmp(&a.1));
    Some(Waited {
        span,
        ran,
        waits: waits.iter().map(|(a, b)| b - a).collect(),
        held_by,
    })
}

/// Reads `file` (`perf sched record -a`) back: how thread `target` waited and who held the
/// CPUs meanwhile; a task of a process in `processes` is labelled with that process's name
/// and its thread's command, any other with its command (a numbered thread's without its
/// number).
///
/// # Errors
/// `perf script` fails, or the trace never shows `target` or any switch.
pub(crate) fn read(file: &Path, target: u32, processes: &[(u32, &str)]) -> anyhow::Result<Waited> {
    let script = |fields: &str| -> anyhow::Result<String> {
        let out = std::process::Command::new("perf")
            .args(["script", "-F", fields, "-i"])
            .arg(file)
            .output()
            .context("running perf script")?;
        anyhow::ensure!(
            out.status.success(),
            "perf script: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    // Which process each thread that ran belongs to ("pid/tid" per event).
    let owner: HashMap<u32, u32> = script("pid,tid")?
        .split_whitespace()
        .filter_map(|w| {
            let (pid, tid) = w.split_once('/')?;
            Some((tid.parse().ok()?, pid.parse().ok()?))
        })
        .collect();
    let events: Vec<Event> = script("cpu,time,event,trace")?
        .lines()
        .filter_map(parse)
        .collect();
    let label = |tid: u32, comm: &str| {
        // Numbered threads of one kind (`cy-crypto-0`, `cy-sparse-cap1`, `swapper/0`) as one;
        // a program's own name (`iperf3`) as it is.
        let base = if comm.contains(['-', '/']) {
            comm.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-' || c == '/')
        } else {
            comm
        };
        match owner
            .get(&tid)
            .and_then(|p| processes.iter().find(|(pid, _)| pid == p))
        {
            Some((_, name)) => format!("{name} {base}"),
            None if tid == 0 => "idle".to_owned(),
            None => base.to_owned(),
        }
    };
    let w = waited(&events, target, label).context("no scheduler switch in the trace")?;
    anyhow::ensure!(
        w.ran > 0.0 || !w.waits.is_empty(),
        "thread {target} never ran nor waited in the trace"
    );
    Ok(w)
}

impl Waited {
    /// One line: the share of the span it ran and waited, its waits, the CPUs' holders.
    pub(crate) fn summary(&self, who: &str) -> String {
        let waited: f64 = self.waits.iter().sum();
        let longest = self.waits.iter().copied().fold(0.0, f64::max);
        let held: f64 = self.held_by.iter().map(|(_, s)| s).sum();
        let holders: Vec<String> = self
            .held_by
            .iter()
            .take(8)
            .map(|(name, s)| format!("{name} {:.0}%", 100.0 * s / held))
            .collect();
        format!(
            "{who} ran {:.0}% of the {:.2} s traced and waited to run {:.0}% ({} waits, mean {:.2} ms, longest {:.1} ms); the CPUs during its waits: {}",
            100.0 * self.ran / self.span,
            self.span,
            100.0 * waited / self.span,
            self.waits.len(),
            1e3 * waited / self.waits.len().max(1) as f64,
            1e3 * longest,
            holders.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switch(cpu: u32, t: f64, prev: u32, state: &str, next: u32, comm: &str) -> String {
        format!(
            "[{cpu:03}] {t:.6}:       sched:sched_switch: prev_comm=x y prev_pid={prev} prev_prio=120 prev_state={state} ==> next_comm={comm} next_pid={next} next_prio=120"
        )
    }

    #[test]
    fn perf_script_lines_parse_with_spaces_in_commands() {
        assert_eq!(
            parse(&switch(1, 2.5, 7, "R+", 9, "iperf 3")),
            Some(Event::Switch {
                cpu: 1,
                t: 2.5,
                prev: 7,
                prev_runnable: true,
                next: 9,
                next_comm: "iperf 3".to_owned()
            })
        );
        assert_eq!(
            parse(
                "[000] 59631.478383:       sched:sched_waking: comm=migration/0 pid=18 prio=0 target_cpu=000"
            ),
            Some(Event::Waking {
                t: 59631.478383,
                tid: 18
            })
        );
        assert_eq!(
            parse("[000] 1.0: sched:sched_stat_runtime: comm=perf pid=3 runtime=5 [ns]"),
            None
        );
    }

    #[test]
    fn waits_count_from_waking_or_preemption_and_charge_whoever_ran() {
        // Thread 5 on CPU 0 runs 0-1, is preempted by 6 (runs 1-3), runs 3-4 and sleeps;
        // woken at 5 while 7 runs on CPU 0 (4-6) and 8 on CPU 1 (0-7), it runs at 6.
        let lines = [
            switch(0, 0.0, 0, "R", 5, "t"),
            switch(1, 0.0, 0, "R", 8, "other"),
            switch(0, 1.0, 5, "R", 6, "hog"),
            switch(0, 3.0, 6, "R", 5, "t"),
            // Woken once while it still runs (no wait), then while asleep.
            "[001] 3.500000: sched:sched_waking: comm=t pid=5 prio=120 target_cpu=000".to_owned(),
            switch(0, 4.0, 5, "S", 7, "iperf3"),
            "[001] 5.000000: sched:sched_waking: comm=t pid=5 prio=120 target_cpu=000".to_owned(),
            switch(0, 6.0, 7, "S", 5, "t"),
            switch(1, 7.0, 8, "S", 0, "swapper/1"),
            switch(0, 8.0, 5, "S", 0, "swapper/0"),
        ];
        let events: Vec<Event> = lines.iter().filter_map(|l| parse(l)).collect();
        assert_eq!(events.len(), lines.len());
        let w = waited(&events, 5, |_, comm| comm.to_owned()).unwrap();
        assert_eq!(w.span, 8.0);
        assert_eq!(w.ran, 1.0 + 1.0 + 2.0);
        assert_eq!(w.waits, [2.0, 1.0]);
        // Waits 1-3 and 5-6: the hog 2 s and iperf3 1 s on CPU 0, "other" 3 s on CPU 1.
        assert_eq!(
            w.held_by,
            [
                ("other".to_owned(), 3.0),
                ("hog".to_owned(), 2.0),
                ("iperf3".to_owned(), 1.0)
            ]
        );
        // A thread the trace never shows gives nothing to report.
        let none = waited(&events, 99, |_, c| c.to_owned()).unwrap();
        assert!(none.waits.is_empty() && none.ran == 0.0);
    }
}

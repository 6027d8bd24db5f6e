//! The kernel tier's test programs and the short soak, three at a time.
//!
//! One at a time they left the machine idle more than half of the time (40% of two cores
//! over the 13-minute tier: most tests wait on timers, handshakes and renewals), and the
//! soak's five minutes came after them. Two lanes took 13 minutes for 26 minutes of jobs,
//! more than a warm run may take with the rest (15 minutes); three lanes take jobs from one
//! queue, longest first, the soak on a lane of its own for most of its time.
//! Each job is still a single process running its tests one at a time: no two tests of one
//! program overlap, and every test names its namespaces by its process (`cyphonic_e2e::unique`)
//! and sweeps only what dead processes left (`cyphonic_e2e::ledger`), so two programs never
//! meet on the machine.
//!
//! A job's output goes to a log file of its own and is printed whole when the job ends, so
//! that the lanes' lines never interleave. Once a job fails, no further job starts; those
//! running on the other lanes are let finish (a test program killed leaves its namespaces
//! to the next run's sweep), and the run fails naming every failed job.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use anyhow::Context as _;

/// How many jobs run at once.
pub(crate) const LANES: usize = 3;

/// One job: a command, what to call it, and about how long it takes.
#[derive(Debug)]
pub(crate) struct Job {
    /// Its name in the output and in its log file's name.
    pub(crate) name: String,
    /// What runs.
    pub(crate) command: Command,
    /// About how many seconds it took last measured; jobs start longest first (the
    /// figure orders them and nothing else).
    pub(crate) seconds: u32,
}

/// About how long each kernel-tier program and the soak took in `cargo xtask test` on
/// the 2-core CI machine, by test target name (printed for each job at its end: update
/// the figures when they drift). A program not named here counts as short.
const SECONDS: &[(&str, u32)] = &[
    ("soak", 300),
    ("adapter", 235),
    ("cloud", 213),
    ("connectivity", 212),
    ("hostile", 134),
    ("enroll", 82),
    ("policy", 80),
    ("lan", 69),
    ("sites", 72),
    ("node", 61),
    ("console", 52),
    ("trust", 26),
];

/// The figure [`SECONDS`] gives `name`, or 10 s.
pub(crate) fn expected_seconds(name: &str) -> u32 {
    SECONDS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(10, |&(_, s)| s)
}

/// The order jobs start in: longest first; equal ones as given.
fn in_order(mut jobs: Vec<Job>) -> VecDeque<Job> {
    jobs.sort_by_key(|j| std::cmp::Reverse(j.seconds));
    jobs.into()
}

/// What the lanes share.
struct Shared {
    queue: Mutex<VecDeque<Job>>,
    failed: Mutex<Vec<String>>,
    /// Held while a job's output is printed.
    print: Mutex<()>,
}

/// Runs `jobs` on [`LANES`] lanes, each job's output into `logs/<name>.log` and then onto
/// stderr.
///
/// # Errors
/// A job failed or could not start (each one named), or the log directory cannot be made.
pub(crate) fn run(jobs: Vec<Job>, logs: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(logs).with_context(|| format!("creating {}", logs.display()))?;
    let count = jobs.len();
    let shared = Shared {
        queue: Mutex::new(in_order(jobs)),
        failed: Mutex::new(Vec::new()),
        print: Mutex::new(()),
    };
    eprintln!(
        "xtask: {count} jobs on {LANES} lanes, longest first; each one's output when it ends \
         (and in {})",
        logs.display()
    );
    let started = Instant::now();
    std::thread::scope(|s| {
        for lane in 1..=LANES {
            let shared = &shared;
            s.spawn(move || lane_loop(lane, shared, logs));
        }
    });
    let failed = shared
        .failed
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    anyhow::ensure!(
        failed.is_empty(),
        "failed on the lanes: {}",
        failed.join("; ")
    );
    eprintln!(
        "xtask: the {count} jobs passed in {} s",
        started.elapsed().as_secs()
    );
    Ok(())
}

/// One lane: takes the next job until none is left or one has failed.
fn lane_loop(lane: usize, shared: &Shared, logs: &Path) {
    loop {
        let stop = !shared
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty();
        let next = shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        let Some(mut job) = next.filter(|_| !stop) else {
            return;
        };
        let log = logs.join(format!("{}.log", job.name));
        let begun = Instant::now();
        let result = run_logged(&mut job.command, &log);
        let secs = begun.elapsed().as_secs();
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        let verdict = match &result {
            Ok(()) => format!("passed in {secs} s (about {} expected)", job.seconds),
            Err(e) => format!("FAILED in {secs} s: {e:#}"),
        };
        {
            let _printing = shared.print.lock().unwrap_or_else(PoisonError::into_inner);
            eprintln!(
                "xtask: [lane {lane}] {} ({}):\n{said}xtask: [lane {lane}] {} {verdict}",
                job.name,
                log.display(),
                job.name
            );
        }
        if result.is_err() {
            shared
                .failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(format!("{} ({})", job.name, log.display()));
        }
    }
}

/// Runs `command` with its stdout and stderr into the file `log`.
fn run_logged(command: &mut Command, log: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let status = command
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("starting {:?}", command.get_program()))?;
    anyhow::ensure!(status.success(), "exited with {status}");
    Ok(())
}

/// The log directory of a run in `root`.
pub(crate) fn logs_dir(root: &Path) -> PathBuf {
    root.join("target/kernel-tier")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, command: &str, args: &[&str]) -> Job {
        let mut c = Command::new(command);
        c.args(args);
        Job {
            name: name.into(),
            command: c,
            seconds: expected_seconds(name),
        }
    }

    #[test]
    fn the_longest_jobs_start_first_and_equal_ones_keep_their_order() {
        let names = ["node", "x", "soak", "adapter", "y", "connectivity"];
        let jobs = names.iter().map(|n| job(n, "true", &[])).collect();
        let order: Vec<String> = in_order(jobs).into_iter().map(|j| j.name).collect();
        assert_eq!(order, ["soak", "adapter", "connectivity", "node", "x", "y"]);
    }

    #[test]
    fn every_job_runs_and_a_failure_fails_the_run_by_name() {
        let dir = std::env::temp_dir().join(format!("xtask-lanes-{}", std::process::id()));
        let passing: Vec<Job> = (0..5)
            .map(|i| job(&format!("ok{i}"), "sh", &["-c", &format!("echo said {i}")]))
            .collect();
        run(passing, &dir).expect("all pass");
        for i in 0..5 {
            let log = std::fs::read_to_string(dir.join(format!("ok{i}.log"))).unwrap();
            assert_eq!(log, format!("said {i}\n"));
        }
        let mixed = vec![
            job("good", "true", &[]),
            job("bad", "sh", &["-c", "echo why >&2; exit 3"]),
        ];
        let err = run(mixed, &dir).expect_err("one fails").to_string();
        assert!(err.contains("bad (") && !err.contains("good"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.join("bad.log")).unwrap(),
            "why\n"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn after_a_failure_no_further_job_starts() {
        let dir = std::env::temp_dir().join(format!("xtask-lanes-stop-{}", std::process::id()));
        let marker = dir.join("ran");
        // Every lane starts with a failing job; the one after them must not start.
        let mut jobs: Vec<Job> = (0..LANES)
            .map(|i| Job {
                seconds: 10 + u32::try_from(i).unwrap(),
                ..job(&format!("failing{i}"), "false", &[])
            })
            .collect();
        jobs.push(Job {
            seconds: 1,
            ..job(
                "after",
                "sh",
                &["-c", &format!("touch {}", marker.display())],
            )
        });
        assert!(run(jobs, &dir).is_err());
        assert!(!marker.exists(), "a job started after the failures");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

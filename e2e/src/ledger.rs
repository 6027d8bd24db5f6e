//! What this process has set up and not yet taken down: the namespaces and the processes its
//! [`Netns`](crate::Netns) and [`Proc`](crate::Proc) values own, kept in memory and in a
//! record file under [`RECORDS`], so that however the process ends, what it set up goes:
//!
//! - a normal end, or a test's panic (unwinding): the values' `Drop`;
//! - a panic in a release binary (`panic = "abort"`, no `Drop` runs), SIGINT, SIGTERM or
//!   SIGHUP: [`tear_down_on_abnormal_exit`], from the panic hook or a signal handler;
//! - SIGKILL (a CI timeout), or a signal to a test binary (libtest installs no handler):
//!   nothing can run then, so the next process that builds a namespace reads the records of
//!   processes that are gone and takes down what they left ([`sweep_orphans`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, Once, PoisonError};

/// Where each process keeps its record: one file per process, named by its PID.
pub const RECORDS: &str = "/run/cyphonic-e2e";

#[derive(Default)]
struct Live {
    namespaces: Vec<String>,
    /// PIDs with their start times (so that a reused PID is never taken for ours).
    pids: Vec<(u32, u64)>,
}

static LIVE: Mutex<Live> = Mutex::new(Live {
    namespaces: Vec::new(),
    pids: Vec::new(),
});

fn change(f: impl FnOnce(&mut Live)) {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut live);
    write_record(&live);
}

pub(crate) fn add_namespace(name: &str) {
    change(|l| l.namespaces.push(name.to_owned()));
}

pub(crate) fn remove_namespace(name: &str) {
    change(|l| l.namespaces.retain(|n| n != name));
}

pub(crate) fn add_process(pid: u32) {
    let start = start_time(pid).unwrap_or(0);
    change(|l| l.pids.push((pid, start)));
}

pub(crate) fn remove_process(pid: u32) {
    change(|l| l.pids.retain(|&(p, _)| p != pid));
}

/// Makes a panic or SIGINT, SIGTERM or SIGHUP take down what this process set up before it
/// ends: the processes it started (by PID) and its namespaces. A release build aborts on
/// panic (`panic = "abort"`), which runs no `Drop`, so without this a `cyphonic-bed` that
/// panics (writing to a closed pipe, say) or is stopped with Ctrl-C would leave its adapters
/// running in namespaces nobody removes. A signal then ends the process with status 128 +
/// the signal's number. Call it first in a binary; test builds unwind, and their `Drop`s do
/// the same.
///
/// # Panics
/// If a signal handler is already installed (call it once).
pub fn tear_down_on_abnormal_exit() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        // `try_lock`: a panic while the list is held (in this thread) must still end.
        if let Ok(mut live) = LIVE.try_lock() {
            tear_down(&mut live);
        }
    }));
    ctrlc::set_handler(|| {
        let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
        eprintln!("stopped by a signal: taking down the bed");
        tear_down(&mut live);
        // The handler does not say which signal; SIGINT's status is the common case.
        std::process::exit(130);
    })
    .expect("the signal handler is installed once");
}

fn tear_down(live: &mut Live) {
    for &(pid, start) in &live.pids {
        kill_if_same(pid, start);
    }
    for name in &live.namespaces {
        delete_namespace(name);
    }
    live.pids.clear();
    live.namespaces.clear();
    write_record(live);
}

/// Deletes namespace `name` (its interfaces, and the veth peers elsewhere, go with it) and
/// its `/etc/netns` files.
pub(crate) fn delete_namespace(name: &str) {
    let _ = Command::new("ip").args(["netns", "del", name]).output();
    let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(name));
}

/// What [`sweep_orphans`] took down.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Namespaces deleted.
    pub namespaces: usize,
    /// Processes killed.
    pub processes: usize,
}

/// Takes down what processes that are gone left behind, as their records say: kills the
/// processes they started (if the PID still names the same process) and those still running
/// in their namespaces, and deletes the namespaces. Records of live processes are left alone,
/// and so is any namespace a live record also names.
pub fn sweep_orphans() -> Swept {
    sweep_orphans_in(Path::new(RECORDS))
}

/// [`sweep_orphans`] once per process, before its first namespace: saying on stderr what it
/// took down, if anything.
pub(crate) fn sweep_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let swept = sweep_orphans();
        if swept != Swept::default() {
            eprintln!(
                "took down what an earlier run left behind (it was killed): {} namespaces, {} processes",
                swept.namespaces, swept.processes
            );
        }
    });
}

fn sweep_orphans_in(dir: &Path) -> Swept {
    let mut swept = Swept::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return swept;
    };
    let records: Vec<(PathBuf, Record)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_none())
        .filter_map(|p| {
            Some((
                p.clone(),
                Record::parse(&std::fs::read_to_string(&p).ok()?)?,
            ))
        })
        .collect();
    let (alive, dead): (Vec<_>, Vec<_>) = records
        .into_iter()
        .partition(|(_, r)| start_time(r.owner.0) == Some(r.owner.1));
    let claimed: HashSet<&str> = alive
        .iter()
        .flat_map(|(_, r)| r.namespaces.iter().map(String::as_str))
        .collect();
    for (path, record) in &dead {
        // Whoever removes the record first sweeps it; another sweeper skips it.
        if std::fs::remove_file(path).is_err() {
            continue;
        }
        for &(pid, start) in &record.pids {
            swept.processes += usize::from(kill_if_same(pid, start));
        }
        for name in record
            .namespaces
            .iter()
            .filter(|n| !claimed.contains(n.as_str()))
        {
            if !Path::new("/run/netns").join(name).exists() {
                continue;
            }
            for pid in namespace_pids(name) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .output();
                swept.processes += 1;
            }
            delete_namespace(name);
            swept.namespaces += 1;
        }
    }
    swept
}

/// A process's record: its PID and start time, its namespaces and its processes.
#[derive(Debug, PartialEq, Eq)]
struct Record {
    owner: (u32, u64),
    namespaces: Vec<String>,
    pids: Vec<(u32, u64)>,
}

impl Record {
    fn render(owner: (u32, u64), live: &Live) -> String {
        let mut text = format!("owner {} {}\n", owner.0, owner.1);
        for name in &live.namespaces {
            text += &format!("ns {name}\n");
        }
        for (pid, start) in &live.pids {
            text += &format!("proc {pid} {start}\n");
        }
        text
    }

    fn parse(text: &str) -> Option<Self> {
        let mut owner = None;
        let (mut namespaces, mut pids) = (Vec::new(), Vec::new());
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["owner", pid, start] => owner = Some((pid.parse().ok()?, start.parse().ok()?)),
                ["ns", name] => namespaces.push((*name).to_owned()),
                ["proc", pid, start] => pids.push((pid.parse().ok()?, start.parse().ok()?)),
                _ => return None,
            }
        }
        Some(Self {
            owner: owner?,
            namespaces,
            pids,
        })
    }
}

/// Rewrites this process's record (removes it once nothing is left), through a temporary
/// file so that a sweeper never reads half of it. Best effort: without a record only the
/// SIGKILL case loses its clean-up.
fn write_record(live: &Live) {
    let pid = std::process::id();
    let path = Path::new(RECORDS).join(pid.to_string());
    if live.namespaces.is_empty() && live.pids.is_empty() {
        let _ = std::fs::remove_file(path);
        return;
    }
    let Some(start) = start_time(pid) else {
        return;
    };
    let tmp = Path::new(RECORDS).join(format!("{pid}.tmp"));
    let _ = std::fs::create_dir_all(RECORDS)
        .and_then(|()| std::fs::write(&tmp, Record::render((pid, start), live)))
        .and_then(|()| std::fs::rename(&tmp, &path));
}

/// Kills `pid` if it is still the process that started at `start`; whether it did.
fn kill_if_same(pid: u32, start: u64) -> bool {
    start_time(pid) == Some(start)
        && Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .output()
            .is_ok_and(|o| o.status.success())
}

/// When process `pid` started, in clock ticks after boot (`/proc/<pid>/stat`, field 22);
/// `None` if there is no such process.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from its end.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// The processes running in namespace `name`.
fn namespace_pids(name: &str) -> Vec<u32> {
    Command::new("ip")
        .args(["netns", "pids", name])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back() {
        let live = Live {
            namespaces: vec!["cyla12x0".into(), "cyrt12x1".into()],
            pids: vec![(4242, 99), (4243, 100)],
        };
        let text = Record::render((12, 7), &live);
        assert_eq!(
            Record::parse(&text),
            Some(Record {
                owner: (12, 7),
                namespaces: live.namespaces.clone(),
                pids: live.pids.clone(),
            })
        );
        assert_eq!(Record::parse("ns x\n"), None, "no owner");
        assert_eq!(Record::parse("owner 1 2\nns\n"), None, "a line cut short");
        assert_eq!(Record::parse("owner one 2\n"), None);
    }

    /// A bed killed with SIGKILL: its record names a namespace with a process running in it,
    /// and a process it started. The sweep kills both processes and deletes the namespace;
    /// a live process's record, naming a namespace of its own, is left alone.
    #[test]
    fn a_killed_runs_leftovers_are_swept_and_a_live_runs_are_not() {
        crate::require_root();
        let dir = std::env::temp_dir().join(crate::unique("cyphonic-records-"));
        std::fs::create_dir_all(&dir).unwrap();
        let (gone, kept) = (crate::unique("cyswg"), crate::unique("cyswk"));
        for name in [&gone, &kept] {
            crate::sh("ip", &["netns", "add", name]).unwrap();
        }
        let spawn = |args: &[&str]| {
            let child = Command::new(args[0]).args(&args[1..]).spawn().unwrap();
            let start = start_time(child.id()).unwrap();
            (child, start)
        };
        let (mut inside, _) = spawn(&["ip", "netns", "exec", &gone, "sleep", "30"]);
        let (mut started, started_at) = spawn(&["sleep", "30"]);
        crate::wait_until(
            std::time::Duration::from_secs(5),
            "sleep in the namespace",
            || namespace_pids(&gone).contains(&inside.id()),
        )
        .unwrap();
        // Its owner: the PID of a reaped process, with a start time no process can have.
        let mut owner = Command::new("true").spawn().unwrap();
        owner.wait().unwrap();
        let dead = Live {
            namespaces: vec![gone.clone()],
            pids: vec![(started.id(), started_at)],
        };
        std::fs::write(dir.join("1"), Record::render((owner.id(), 1), &dead)).unwrap();
        let me = std::process::id();
        let alive = Live {
            namespaces: vec![kept.clone()],
            pids: Vec::new(),
        };
        let mine = Record::render((me, start_time(me).unwrap()), &alive);
        std::fs::write(dir.join("2"), &mine).unwrap();

        let swept = sweep_orphans_in(&dir);

        let netns_exists = |name: &str| Path::new("/run/netns").join(name).exists();
        let (gone_left, kept_left) = (netns_exists(&gone), netns_exists(&kept));
        let killed = |child: &mut std::process::Child| {
            use std::os::unix::process::ExitStatusExt;
            child.wait().unwrap().signal() == Some(SIGKILL)
        };
        let (inside_killed, started_killed) = (killed(&mut inside), killed(&mut started));
        delete_namespace(&kept);
        delete_namespace(&gone);
        let records_left = std::fs::read_dir(&dir).unwrap().count();
        let mine_left = std::fs::read_to_string(dir.join("2")).ok();
        let _ = std::fs::remove_dir_all(&dir);

        assert!(!gone_left, "the killed run's namespace is deleted");
        assert!(inside_killed && started_killed, "its processes are killed");
        assert_eq!(swept.namespaces, 1);
        assert!(swept.processes >= 2, "{swept:?}");
        assert!(kept_left, "the live run's namespace stays");
        assert_eq!(records_left, 1, "the swept record is gone");
        assert_eq!(mine_left, Some(mine), "the live record stays as it was");
    }

    /// SIGKILL's number (9 on every Linux architecture).
    const SIGKILL: i32 = 9;

    #[test]
    fn this_process_has_a_start_time_and_a_gone_one_has_none() {
        let me = start_time(std::process::id()).expect("our own stat");
        assert!(me > 0);
        let mut child = Command::new("true").spawn().expect("true runs");
        let pid = child.id();
        child.wait().expect("reaped");
        // Reaped: the PID names nothing now, or (reused at once) a process started later.
        assert!(start_time(pid).is_none_or(|t| t >= me));
    }
}

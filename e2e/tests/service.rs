//! What systemd sees of the daemons (issue "The appliance for real", item 3), with a stand-in
//! for its notification socket: READY=1 only once the data plane runs, the watchdog's pings,
//! RELOADING=1 then READY=1 around a reload, STOPPING=1 at the end; log lines led by their
//! syslog priority under journald; exit status 78 for a configuration refused, which the
//! units keep from restarting.

#![allow(clippy::unwrap_used)]

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cyphonic_e2e::Proc;
use cyphonic_e2e::bed::{BedOptions, Ping, Side, TwoSites};
use cyphonic_e2e::hosts::Bins;

/// The service manager's end of `NOTIFY_SOCKET`.
struct Manager {
    sock: UnixDatagram,
    path: PathBuf,
}

impl Manager {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!("cyphonic-notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let sock = UnixDatagram::bind(&path).unwrap();
        Self { sock, path }
    }

    /// The messages that arrive within `within`, until one has the line `line` (included);
    /// `None` if it does not come.
    fn until(&self, line: &str, within: Duration) -> Option<Vec<String>> {
        let end = Instant::now() + within;
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            self.sock
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            let Ok(n) = self.sock.recv(&mut buf) else {
                break;
            };
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = msg.lines().any(|l| l == line);
            seen.push(msg);
            if done {
                return Some(seen);
            }
        }
        None
    }
}

impl Manager {
    /// Drops what arrived so far.
    fn drain(&self) {
        let mut buf = [0u8; 4096];
        self.sock.set_nonblocking(true).unwrap();
        while self.sock.recv(&mut buf).is_ok() {}
        self.sock.set_nonblocking(false).unwrap();
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Site A's adapter run as systemd would run it (`Type=notify`, `WatchdogSec=2`, under
/// journald), against the stand-in: ready, and it carries traffic then; the watchdog pinged every second; a reload and the stop are announced.
#[test]
fn the_adapter_tells_systemd_it_is_ready_reloading_and_stopping_and_pings_the_watchdog() {
    let (bed, manager, proc, log) = restart_a_under(
        "WATCHDOG_USEC=2000000 WATCHDOG_PID=$$ JOURNAL_STREAM=8:1",
        |_| String::new(),
        "under-systemd.log",
    );
    let text = || std::fs::read_to_string(&log).unwrap_or_default();

    // READY=1 once (its order among the binds is the_adapter_sends_ready_only_after_...'s).
    let first = manager
        .until("READY=1", Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no READY=1:\n{}", text()));
    assert_eq!(
        first.iter().filter(|m| m.contains("READY=1")).count(),
        1,
        "{first:?}"
    );
    bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(2).wait(3));

    // The watchdog, pinged at half its period (1 s, give or take the loop's wake-ups): it
    // keeps coming, and does not flood.
    manager.drain();
    let start = Instant::now();
    let mut pings = 0;
    while start.elapsed() < Duration::from_secs(4) {
        if manager
            .until("WATCHDOG=1", Duration::from_millis(2_000))
            .is_some()
        {
            pings += 1;
        }
    }
    assert!((2..=6).contains(&pings), "{pings} pings in 4 s");

    // A reload: RELOADING=1, then READY=1 again.
    let pid = proc.pid().to_string();
    cyphonic_e2e::sh("kill", &["-s", "HUP", &pid]).unwrap();
    let reload = manager
        .until("READY=1", Duration::from_secs(5))
        .unwrap_or_else(|| panic!("no READY=1 after the reload:\n{}", text()));
    assert!(
        reload.iter().any(|m| m.lines().any(|l| l == "RELOADING=1")),
        "{reload:?}"
    );

    // Lines carry their priority for journald.
    let lines = text();
    assert!(
        lines
            .lines()
            .any(|l| l.starts_with("<6>") && l.contains("cyphonic-adapter running")),
        "{lines}"
    );
    assert!(
        !lines
            .lines()
            .any(|l| l.contains("running") && !l.starts_with('<')),
        "{lines}"
    );

    // The stop: STOPPING=1, and a clean exit.
    let out = proc.stop("TERM", Duration::from_secs(10)).unwrap();
    assert!(
        manager
            .until("STOPPING=1", Duration::from_secs(5))
            .is_some(),
        "{}",
        text()
    );
    assert!(out.status.success(), "{:?}", out.status);
}

/// Site A's adapter of a fresh bed, stopped and run again by a shell that exports
/// `NOTIFY_SOCKET` (the stand-in's) and `env`, then `exec`s what `wrap` gives for the site's
/// directory (nothing, or a command that runs the adapter) with the adapter's command line:
/// the bed, the stand-in, the process and its log (`log` in the site's directory).
fn restart_a_under(
    env: &str,
    wrap: impl FnOnce(&Path) -> String,
    log: &str,
) -> (TwoSites, Manager, Proc, PathBuf) {
    let mut bed = TwoSites::up(&BedOptions::default()).unwrap();
    bed.stop(Side::A, "TERM").unwrap();
    let manager = Manager::new();
    let site = bed.site_ref(Side::A);
    let _ = std::fs::remove_file(site.socket());
    let wrap = wrap(&site.dir);
    let script = format!(
        "export NOTIFY_SOCKET={} {env}; exec {wrap} {} run --config {}",
        manager.path.display(),
        bed.bins.adapter.display(),
        site.config().display()
    );
    let log = site.dir.join(log);
    let proc = site
        .adapter_ns
        .daemon(Path::new("/bin/sh"), &["-c", &script], &log, || true)
        .unwrap();
    (bed, manager, proc, log)
}

/// Kills a process by PID when dropped, unless it is gone: the adapter traced by strace,
/// which a killed strace would leave running.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if Path::new(&format!("/proc/{}", self.0)).exists() {
            let _ = cyphonic_e2e::sh("kill", &["-s", "KILL", &self.0.to_string()]);
        }
    }
}

/// The index of the first line of `trace` that has every one of `parts`, or a panic that
/// shows the trace: a bind the daemon never made is a failure, not a pass.
fn first_line(trace: &[&str], what: &str, parts: &[&str]) -> usize {
    trace
        .iter()
        .position(|l| parts.iter().all(|p| l.contains(p)))
        .unwrap_or_else(|| panic!("no {what} in the trace:\n{}", trace.join("\n")))
}

/// READY=1 in its order, not only its presence: under strace, every socket the data plane
/// and the operator need (the LAN port's packet socket, the tunnel's UDP port, the status
/// socket) is bound before the daemon sends READY=1. A check made after READY=1 arrives
/// cannot tell that: the daemon goes on binding while the test reads.
#[test]
fn the_adapter_sends_ready_only_after_binding_its_sockets() {
    let (bed, manager, strace, log) = restart_a_under(
        "",
        |dir| {
            format!(
                "strace -f -qq -s 256 -e trace=bind,write,sendto,sendmsg -o {}",
                dir.join("ready.strace").display()
            )
        },
        "under-strace.log",
    );
    let site = bed.site_ref(Side::A);
    let trace_file = site.dir.join("ready.strace");
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut adapter = None;
    cyphonic_e2e::wait_until(Duration::from_secs(5), "the traced adapter", || {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", strace.pid()))
                .unwrap_or_default();
        adapter = children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok());
        adapter.is_some()
    })
    .unwrap();
    let adapter = KillOnDrop(adapter.unwrap());
    manager
        .until("READY=1", Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no READY=1:\n{}", text()));
    cyphonic_e2e::sh("kill", &["-s", "TERM", &adapter.0.to_string()]).unwrap();
    let out = strace.wait(Duration::from_secs(10)).unwrap();
    assert!(out.status.success(), "{:?}\n{}", out.status, text());

    let trace = std::fs::read_to_string(&trace_file).unwrap();
    let lines: Vec<&str> = trace.lines().collect();
    let ready = first_line(&lines, "READY=1", &["\"READY=1\\n\""]);
    let status = site.socket();
    let binds = [
        (
            "the status socket's bind",
            vec![
                "bind(".to_string(),
                format!("sun_path=\"{}\"", status.display()),
            ],
        ),
        (
            "the LAN port's packet socket bind",
            vec!["bind(".into(), "AF_PACKET".into()],
        ),
        (
            "the tunnel port's bind",
            vec!["bind(".into(), "port=htons(51820)".into()],
        ),
    ];
    for (what, parts) in &binds {
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let at = first_line(&lines, what, &parts);
        assert!(
            at < ready,
            "{what} (line {at}) after READY=1 (line {ready}):\n{trace}"
        );
    }
}

/// A configuration the program refuses ends `run`, `serve` and `check-config` with status 78
/// (EX_CONFIG: the units' `RestartPreventExitStatus=78`), the reason on stderr (led by err's
/// priority for the journal under systemd); another failure keeps status 1.
#[test]
fn a_refused_configuration_exits_78() {
    let bins = Bins::find().unwrap();
    let dir = std::env::temp_dir().join(format!("cyphonic-exit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "[adapter]\nlan_interface = 7\n").unwrap();
    let b = broken.to_str().unwrap();
    let runs: [(&Path, &[&str]); 5] = [
        (&bins.adapter, &["run", "--config", b]),
        (&bins.adapter, &["check-config", "-c", b]),
        (&bins.node, &["run", "--config", b]),
        (&bins.cloud, &["run", "--config", b]),
        (&bins.cloud, &["check-config", "-c", b]),
    ];
    for (program, args) in runs {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(78),
            "{} {args:?}: {stderr}",
            program.display()
        );
        assert!(stderr.contains("error"), "{stderr}");
        // Under systemd (stderr is the journal's) the line is an error for `journalctl -p
        // err`, as the program's logged errors are.
        let out = std::process::Command::new(program)
            .args(args)
            .env("JOURNAL_STREAM", "8:12345")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let name = program.file_name().unwrap().to_string_lossy();
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("<3>{name}: error: "))),
            "{stderr}"
        );
    }
    // Not a configuration matter: a status socket nobody serves.
    let out = std::process::Command::new(&bins.adapter)
        .args(["status", "--socket", dir.join("none").to_str().unwrap()])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(1));
}

/// The LAN port is the adapter's: left down at boot (nothing on the host configures it),
/// the adapter brings it up itself and serves.
#[test]
fn the_adapter_brings_a_lan_port_that_is_down_up() {
    const BROUGHT_UP: &str = "the LAN port was down: brought up";
    let mut bed = TwoSites::up(&BedOptions::default()).unwrap();
    // The log is appended to across the restart: only a line written after it counts.
    let before = bed.a.log_text().matches(BROUGHT_UP).count();
    bed.stop(Side::A, "TERM").unwrap();
    bed.a
        .adapter_ns
        .exec("ip", &["link", "set", "lan", "down"])
        .unwrap();
    bed.start(Side::A)
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert_eq!(
        bed.a.log_text().matches(BROUGHT_UP).count(),
        before + 1,
        "{}",
        bed.a.log_text()
    );
    bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(2).wait(3));
}

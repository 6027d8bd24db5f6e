//! Site A of the two-site bed with two adapters as one gateway (issue 51, `[ha]`; both with
//! the site's certificate and key):
//!
//! ```text
//! [lanA] --+                                  [adapterA] wan 198.51.100.2 -- toa [router]
//!          +-- [swA br0] -- lan [adapterA]    priority 200, serving
//!  [cam] --+            -- lan [adA2]         priority 100, standing by
//!                              [adA2] eth0 192.0.2.200/26 -- tov [router]
//! ```
//!
//! The second box is on the underlay beside the sites and on site A's LAN switch; each
//! box's `peer_underlay` is the other's address. A DHCP device (`cam`) has a lease that the
//! standby holds too. [`PairBed::ping_through`] pings site B's host every 10 ms from the
//! device and the LAN host while something happens to the boxes, and measures the gaps.
//! The bed and its processes go when it is dropped.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::bed::{BedOptions, Side, SiteOptions, TwoSites};
use crate::lan::DhcpHost;
use crate::{Proc, wait_until};

/// Echo requests each [`PairBed::ping_through`] sends (10 ms apart: 8 s or more).
pub const PINGS: u64 = 800;

/// The pair and site A's devices.
#[derive(Debug)]
pub struct PairBed {
    /// The two-site bed; its adapter A is the first box.
    pub bed: TwoSites,
    /// The second box.
    pub second: Proc,
    /// Its namespace.
    ns2: Option<crate::Netns>,
    /// The second box's log.
    pub log2: PathBuf,
    /// The DHCP device.
    pub device: DhcpHost,
    /// Its address.
    pub ip: Ipv4Addr,
}

/// What one pinger saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingRun {
    /// The longest time between two replies.
    pub gap: Duration,
    /// Replies.
    pub replies: usize,
    /// The last `icmp_seq` answered.
    pub last: u64,
}

impl PingRun {
    /// Whether the pinger was answered until (nearly) its last echo request.
    pub const fn to_the_end(&self) -> bool {
        self.last + 50 > PINGS
    }
}

impl PairBed {
    /// Builds it: the bed with adapter A serving, the second box standing by, the device
    /// leased, its lease held by the standby.
    ///
    /// # Errors
    /// A step of the bed fails, or the second box does not stand by or does not get the
    /// lease within 5 s (the logs in the error).
    pub fn up() -> anyhow::Result<Self> {
        Self::up_with(true)
    }

    /// As [`PairBed::up`], the pair's messages on the underlay too when `underlay` (each
    /// box's `peer_underlay`), else on the LAN alone: a cut of the LAN between the two is
    /// then a split brain.
    ///
    /// # Errors
    /// As [`PairBed::up`].
    pub fn up_with(underlay: bool) -> anyhow::Result<Self> {
        Self::up_configured(underlay, "")
    }

    /// As [`PairBed::up_with`], with `extra` (whole tables, such as `[dhcp]`) in both boxes'
    /// configuration.
    ///
    /// # Errors
    /// As [`PairBed::up`].
    pub fn up_configured(underlay: bool, extra: &str) -> anyhow::Result<Self> {
        Self::up_options(underlay, extra, None)
    }

    /// As [`PairBed::up_configured`], with the two sites finding each other through a cloud
    /// of `cloud`'s options instead of static peers (the device looks site B's host up by
    /// name first, `host.gw2.ovl.example`, through its gateway).
    ///
    /// # Errors
    /// As [`PairBed::up`].
    pub fn up_with_cloud(cloud: crate::bed::CloudOptions) -> anyhow::Result<Self> {
        Self::up_options(true, "", Some(cloud))
    }

    fn up_options(
        underlay: bool,
        extra: &str,
        cloud: Option<crate::bed::CloudOptions>,
    ) -> anyhow::Result<Self> {
        let with_cloud = cloud.is_some();
        let peer = if underlay {
            "peer_underlay = \"192.0.2.200\"\n"
        } else {
            ""
        };
        let mut bed = TwoSites::up(&BedOptions {
            lan_switch: true,
            cloud,
            a: SiteOptions {
                extra: format!("{extra}\n[ha]\npriority = 200\n{peer}"),
                ..SiteOptions::default()
            },
            ..BedOptions::default()
        })?;
        let (ns2, _) = bed.add_underlay_host("adA2")?;
        bed.plug_into_lan(Side::A, &ns2, "lan")?;
        let dir = bed.a.dir.clone();
        let config2 = dir.join("adapter2.toml");
        let log2 = dir.join("adapter2.log");
        let text = std::fs::read_to_string(bed.a.config())?
            .replace("priority = 200", "priority = 100")
            .replace("192.0.2.200", &bed.a.underlay.to_string())
            .replace("state_dir = \"state\"", "state_dir = \"state2\"")
            .replace(
                "status_socket = \"adapter.sock\"",
                "status_socket = \"adapter2.sock\"",
            );
        if !(text.contains("priority = 100")
            && text.contains("state2")
            && text.contains("peer_underlay = \"198.51.100.2\"") == underlay)
        {
            bail!("the second box's configuration is not what it should be:\n{text}");
        }
        std::fs::write(&config2, text)?;
        let standing = || {
            std::fs::read_to_string(&log2)
                .unwrap_or_default()
                .contains("the active box is alive")
        };
        let second = ns2
            .daemon(
                &bed.bins.adapter,
                &["run", "--config", config2.to_str().context("path")?],
                &log2,
                standing,
            )
            .map_err(|e| anyhow::anyhow!("{e}\n{}", bed.logs()))?;
        let ns2 = Some(ns2);
        let (device, ip) = bed.dhcp_device(Side::A, "cam")?;
        let mut pair = Self {
            bed,
            second,
            ns2,
            log2,
            device,
            ip,
        };
        let b_host = pair.bed.b.host_ip.to_string();
        if with_cloud {
            // No peer without a lookup: the name brings site B's adapter in.
            let gateway = Ipv4Addr::new(100, 64, 1, 1);
            let dig = crate::lan::dig(&pair.device.ns, gateway, "host.gw2.ovl.example", "A")?;
            if dig.answers != [b_host.clone()] {
                bail!("site B's host does not resolve: {dig:?}\n{}", pair.logs());
            }
        }
        let out = pair
            .device
            .ns
            .exec_output("ping", &["-c", "2", "-i", "0.2", "-W", "5", &b_host])?;
        if !out.status.success() {
            bail!("the device does not reach site B\n{}", pair.logs());
        }
        let state2 = dir.join("state2/leases.json");
        wait_until(
            Duration::from_secs(5),
            "the standby holds the lease",
            || std::fs::read_to_string(&state2).is_ok_and(|t| t.contains(&ip.to_string())),
        )
        .map_err(|e| anyhow::anyhow!("{e}\n{}", pair.logs()))?;
        if !pair.second.running() || pair.second_log().contains("serves the gateway") {
            bail!("the second box does not stand by\n{}", pair.logs());
        }
        Ok(pair)
    }

    /// The second box's namespace.
    ///
    /// # Errors
    /// It is gone (the bed is being taken down).
    pub fn second_ns(&self) -> anyhow::Result<&crate::Netns> {
        self.ns2.as_ref().context("the second box's namespace")
    }

    /// The second box's status document (standing by or serving).
    ///
    /// # Errors
    /// `cyphonic-adapter status` fails (the box does not run).
    pub fn second_status(&self) -> anyhow::Result<serde_json::Value> {
        crate::bed::adapter_status(&self.bed.bins, &self.bed.a.dir.join("adapter2.sock"))
    }

    /// The second box's `cyphonic-adapter status`, as text.
    ///
    /// # Errors
    /// The command fails (the box does not run).
    pub fn second_status_text(&self) -> anyhow::Result<String> {
        let socket = self.bed.a.dir.join("adapter2.sock");
        let out = std::process::Command::new(&self.bed.bins.adapter)
            .args(["status", "--socket", socket.to_str().context("path")?])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `cyphonic-adapter handover` asked of the first box, or of the second: whether it
    /// succeeded, and what it printed (its answer or its error).
    ///
    /// # Errors
    /// The command cannot be started.
    pub fn handover(&self, first: bool) -> anyhow::Result<(bool, String)> {
        let socket = self.bed.a.dir.join(if first {
            "adapter.sock"
        } else {
            "adapter2.sock"
        });
        let out = std::process::Command::new(&self.bed.bins.adapter)
            .args(["handover", "--socket", socket.to_str().context("path")?])
            .output()?;
        Ok((
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    }

    /// Cuts the first box's uplink alone (its `wan` link set down).
    ///
    /// # Errors
    /// `ip` fails.
    pub fn cut_uplink(&self) -> anyhow::Result<()> {
        self.bed
            .a
            .adapter_ns
            .ip(&["link", "set", "wan", "down"])
            .map(drop)
    }

    /// Holds the first box's threads whose names start with one of `threads` (`cy-udp-rx`)
    /// stopped, the others going on, as threads stuck in a system call or a lock would be:
    /// ptrace stops those threads alone. They go on when the returned holds are dropped.
    ///
    /// # Errors
    /// The first box is not running, has no such thread, or one cannot be stopped.
    pub fn hold_threads(&self, threads: &[&str]) -> anyhow::Result<Vec<ThreadHold>> {
        let pid = self
            .bed
            .a
            .adapter
            .as_ref()
            .map(Proc::pid)
            .context("the first box is not running")?;
        let tids =
            crate::attack::thread_ids(pid, |name| threads.iter().any(|n| name.starts_with(n)))?;
        anyhow::ensure!(!tids.is_empty(), "the first box has no thread {threads:?}");
        tids.into_iter()
            .map(|tid| ThreadHold::new(i32::try_from(tid)?))
            .collect()
    }

    /// Starts the first box again after it stood down (as systemd would), and waits until
    /// it stands by: it has heard the serving box once more.
    ///
    /// # Errors
    /// It is still running, or does not stand by within 10 s (the logs in the error).
    pub fn restart_first(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.bed.a.adapter.as_mut().is_none_or(|p| !p.running()),
            "the first box still runs"
        );
        self.bed.a.adapter = None;
        let alive = "the active box is alive";
        let (config, log) = (self.bed.a.config(), self.bed.a.log());
        let proc = start_box(&self.bed.bins, &self.bed.a.adapter_ns, &config, &log, alive)
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))?;
        self.bed.a.adapter = Some(proc);
        Ok(())
    }

    /// Drops the pair's lease tables between the two boxes (`on`), on the LAN switch and at
    /// the underlay's router, and lets them through again (`!on`): every message of the pair
    /// longer than 300 bytes (a lease chunk; a heartbeat is 136 bytes on the LAN and 120 on
    /// the underlay), so that the heartbeats go on and the standby stays in contact without
    /// the newest table.
    ///
    /// # Errors
    /// No LAN switch, or `nft` fails.
    pub fn hold_back_lease_tables(&self, on: bool) -> anyhow::Result<()> {
        let switch = self.bed.a.switch.as_ref().context("no LAN switch")?;
        let rules = [
            (switch, "bridge", "ether type 0x88b5 meta length > 300 drop"),
            (
                &self.bed.wan,
                "inet",
                "udp dport 51821 meta length > 300 drop",
            ),
        ];
        for (ns, family, rule) in rules {
            if on {
                ns.exec("nft", &["add", "table", family, "pairtables"])?;
                ns.exec(
                    "nft",
                    &[&format!(
                        "add chain {family} pairtables hold {{ type filter hook forward priority 0 ; }}"
                    )],
                )?;
                ns.exec(
                    "nft",
                    &[&format!("add rule {family} pairtables hold {rule}")],
                )?;
            } else {
                ns.exec("nft", &["delete", "table", family, "pairtables"])?;
            }
        }
        Ok(())
    }

    /// Stops the second box with `signal` and waits (10 s at most) until it exited.
    ///
    /// # Errors
    /// It was not running, or did not exit in time (it is then killed).
    pub fn stop_second(&mut self, signal: &str) -> anyhow::Result<()> {
        self.second.end(signal, Duration::from_secs(10)).map(drop)
    }

    /// Starts the second box again after it stopped (as systemd would), and waits until it
    /// has heard the serving box (it stands by) or serves (`serving`).
    ///
    /// # Errors
    /// It is still running, or does not get there within 10 s (the logs in the error).
    pub fn restart_second(&mut self, serving: bool) -> anyhow::Result<()> {
        anyhow::ensure!(!self.second.running(), "the second box still runs");
        let mark = if serving {
            "HA: this box serves the gateway"
        } else {
            "the active box is alive"
        };
        let config = self.bed.a.dir.join("adapter2.toml");
        let ns = self.ns2.as_ref().context("the second box's namespace")?;
        self.second = start_box(&self.bed.bins, ns, &config, &self.log2, mark)
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))?;
        Ok(())
    }

    /// The leases a box's status shows (the first box's, or the second's): each device's
    /// MAC and vIP.
    ///
    /// # Errors
    /// The box does not serve (no status), or its status has no lease list.
    pub fn leases(&self, first: bool) -> anyhow::Result<Vec<(String, Ipv4Addr)>> {
        let status = if first {
            self.bed.status(Side::A)?
        } else {
            self.second_status()?
        };
        status["leases"]
            .as_array()
            .with_context(|| format!("no leases in the status: {status}"))?
            .iter()
            .map(|l| {
                let mac = l["mac"].as_str().context("a lease without its MAC")?;
                let vip = l["vip"].as_str().context("a lease without its vIP")?;
                Ok((mac.to_owned(), vip.parse()?))
            })
            .collect()
    }

    /// The second box's log so far.
    pub fn second_log(&self) -> String {
        std::fs::read_to_string(&self.log2).unwrap_or_default()
    }

    /// Both boxes' logs and the bed's.
    pub fn logs(&self) -> String {
        format!(
            "{}\n--- second box ---\n{}",
            self.bed.logs(),
            self.second_log()
        )
    }

    /// What a broken round leaves to read beside the logs: where site A's switch sends the
    /// gateway MAC, the second box's and site B's status documents.
    pub fn state(&self) -> String {
        let fdb = self.bed.a.switch.as_ref().map_or_else(
            || "no switch".to_owned(),
            |sw| {
                sw.exec("bridge", &["fdb", "show", "br", "br0"])
                    .unwrap_or_else(|e| e.to_string())
            },
        );
        let show = |doc: anyhow::Result<serde_json::Value>| match doc {
            Ok(d) => serde_json::to_string_pretty(&d).unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        format!(
            "--- site A's switch: bridge fdb ---\n{fdb}\n--- second box's status ---\n{}\n--- site B's status ---\n{}",
            show(self.second_status()),
            show(self.bed.status(Side::B)),
        )
    }

    /// Pings site B's host every 10 ms, [`PINGS`] of them, from the device and the LAN host,
    /// doing `meanwhile` 2 s in. Returns what each saw (the device's first) and the outputs.
    ///
    /// # Errors
    /// A ping cannot be started, or `meanwhile` fails.
    pub fn ping_through(
        &mut self,
        meanwhile: impl FnOnce(&mut Self) -> anyhow::Result<()>,
    ) -> anyhow::Result<([PingRun; 2], [String; 2])> {
        let b_host = self.bed.b.host_ip.to_string();
        let count = PINGS.to_string();
        let pinger = |ns: &crate::Netns| {
            ns.command(
                "ping",
                &["-n", "-D", "-i", "0.01", "-W", "1", "-c", &count, &b_host],
            )
            .stdout(std::process::Stdio::piped())
            .spawn()
        };
        let pings = [pinger(&self.device.ns)?, pinger(&self.bed.a.lan)?];
        std::thread::sleep(Duration::from_secs(2));
        let done = meanwhile(self);
        let mut runs = Vec::new();
        let mut outs = Vec::new();
        for p in pings {
            let out = String::from_utf8_lossy(&p.wait_with_output()?.stdout).into_owned();
            runs.push(gaps(&out));
            outs.push(out);
        }
        done?;
        let runs: [PingRun; 2] = runs.try_into().map_err(|_| anyhow::anyhow!("two runs"))?;
        let outs: [String; 2] = outs
            .try_into()
            .map_err(|_| anyhow::anyhow!("two outputs"))?;
        Ok((runs, outs))
    }
}

/// Starts a box of the pair in `ns` from `config`, its log appended to `log`, and waits
/// until the log says `mark` once more than it did before.
fn start_box(
    bins: &crate::bed::Bins,
    ns: &crate::Netns,
    config: &std::path::Path,
    log: &std::path::Path,
    mark: &str,
) -> anyhow::Result<Proc> {
    let said = || std::fs::read_to_string(log).map_or(0, |t| t.matches(mark).count());
    let before = said();
    ns.daemon(
        &bins.adapter,
        &["run", "--config", config.to_str().context("path")?],
        log,
        || said() > before,
    )
}

/// From `ping -D`'s output: the longest time between two replies, how many came, and the
/// last `icmp_seq` answered.
pub fn gaps(output: &str) -> PingRun {
    let replies: Vec<(f64, u64)> = output
        .lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| {
            let at = l.strip_prefix('[')?.split(']').next()?.parse().ok()?;
            let seq = l
                .split("icmp_seq=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some((at, seq))
        })
        .collect();
    let gap = replies
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .fold(0.0f64, f64::max);
    PingRun {
        gap: Duration::from_secs_f64(gap.max(0.0)),
        replies: replies.len(),
        last: replies.iter().map(|r| r.1).max().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest time between replies, whatever the order the lines come in; requests
    /// without a reply count in the gap, lines that are not replies do not.
    #[test]
    fn gaps_are_read_from_ping_timestamps() {
        let out = "PING 100.64.2.10 (100.64.2.10) 56(84) bytes of data.\n\
            [1000.000] 64 bytes from 100.64.2.10: icmp_seq=1 ttl=62 time=0.2 ms\n\
            [1000.010] 64 bytes from 100.64.2.10: icmp_seq=2 ttl=62 time=0.2 ms\n\
            [1000.420] From 100.64.1.1 icmp_seq=3 Destination Host Unreachable\n\
            [1000.330] 64 bytes from 100.64.2.10: icmp_seq=5 ttl=62 time=0.2 ms\n\
            [1000.340] 64 bytes from 100.64.2.10: icmp_seq=6 ttl=62 time=0.2 ms\n";
        let r = gaps(out);
        assert_eq!(r.replies, 4);
        assert_eq!(r.last, 6);
        assert!((r.gap.as_secs_f64() - 0.32).abs() < 1e-6, "{:?}", r.gap);
        assert_eq!(gaps("").replies, 0);
    }
}

/// What happens to the serving box in a failover round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL.
    Kill,
    /// Its LAN and uplink cut at once (power lost; the process lives on, unreachable).
    Power,
    /// Its uplink alone cut (the LAN and the process live on; its health says so).
    Uplink,
    /// SIGSTOP, and SIGCONT 2 s later (it must stand down).
    Freeze,
    /// `cyphonic-adapter handover`: the planned move to the standby.
    Handover,
    /// Nothing: what the stream and the pings do without a failover (the baseline).
    Nothing,
}

impl Fault {
    /// Every kind, the baseline last.
    pub const ALL: [Self; 6] = [
        Self::Kill,
        Self::Power,
        Self::Uplink,
        Self::Freeze,
        Self::Handover,
        Self::Nothing,
    ];

    /// Its name on the command line (`cyphonic-bed ha --fault`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Power => "power",
            Self::Uplink => "uplink",
            Self::Freeze => "freeze",
            Self::Handover => "handover",
            Self::Nothing => "nothing",
        }
    }

    /// For the table.
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Kill => "SIGKILL",
            Self::Power => "LAN and uplink cut (power)",
            Self::Uplink => "uplink alone cut",
            Self::Freeze => "SIGSTOP, SIGCONT 2 s later",
            Self::Handover => "`cyphonic-adapter handover` (planned)",
            Self::Nothing => "nothing (baseline)",
        }
    }
}

/// One failover round's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// The device's and the LAN host's pings.
    pub pings: [PingRun; 2],
    /// Whether a TCP stream (iperf3, site A's LAN host to site B's, 8 s) lived through it.
    pub tcp_survived: bool,
    /// The stream's retransmissions, as its sender counted them (when it lived).
    pub retransmits: Option<u64>,
    /// Both boxes' logs and the bed's, when the stream died or a pinger was not answered
    /// to the end: what to read.
    pub logs: Option<String>,
}

/// A fresh pair, a TCP stream and pings through it, and `fault` to the serving box 2 s in.
///
/// # Errors
/// The bed fails to come up, or a step of the fault does.
pub fn failover_round(fault: Fault) -> anyhow::Result<Round> {
    let mut pair = PairBed::up()?;
    let tcp = crate::bed::IperfRun::start(&pair.bed, Side::B, &[], 8)?;
    let (pings, _) = pair.ping_through(|p| match fault {
        Fault::Kill => p.bed.stop(Side::A, "KILL").map(drop),
        Fault::Power => {
            for link in ["lan", "wan"] {
                p.bed.a.adapter_ns.ip(&["link", "set", link, "down"])?;
            }
            Ok(())
        }
        Fault::Uplink => p.cut_uplink(),
        Fault::Freeze => {
            p.bed.signal(Side::A, "STOP")?;
            std::thread::sleep(Duration::from_secs(2));
            p.bed.signal(Side::A, "CONT")
        }
        Fault::Handover => match p.handover(true)? {
            (true, _) => Ok(()),
            (false, said) => bail!("handover: {said}"),
        },
        Fault::Nothing => Ok(()),
    })?;
    let report = tcp.finish().ok();
    let whole = report.is_some() && pings.iter().all(PingRun::to_the_end);
    Ok(Round {
        pings,
        tcp_survived: report.is_some(),
        retransmits: report.and_then(|r| r["end"]["sum_sent"]["retransmits"].as_u64()),
        logs: (!whole).then(|| format!("{}\n{}", pair.logs(), pair.state())),
    })
}

/// A thread of another process held stopped by ptrace ([`PairBed::hold_threads`]): the
/// tracer is a thread of ours, which lets it go (detaches) when the hold is dropped. A
/// thread that exits while held is reaped then, so its process's exit is reported.
#[derive(Debug)]
pub struct ThreadHold {
    release: Option<std::sync::mpsc::Sender<()>>,
    tracer: Option<std::thread::JoinHandle<()>>,
}

impl ThreadHold {
    fn new(tid: i32) -> anyhow::Result<Self> {
        use nix::sys::ptrace;
        use nix::sys::wait::{WaitPidFlag, waitpid};
        use nix::unistd::Pid;
        let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        // ptrace's requests must all come from the thread that attached.
        let tracer = std::thread::spawn(move || {
            let tid = Pid::from_raw(tid);
            let stop = ptrace::seize(tid, ptrace::Options::empty())
                .and_then(|()| ptrace::interrupt(tid))
                .and_then(|()| waitpid(tid, Some(WaitPidFlag::__WALL)).map(drop));
            let held = stop.is_ok();
            let _ = stopped_tx.send(stop);
            if held {
                let _ = released.recv();
                // Fails when it exited meanwhile; this thread's end reaps it then.
                let _ = ptrace::detach(tid, None);
            }
        });
        match stopped_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                release: Some(release),
                tracer: Some(tracer),
            }),
            Ok(Err(e)) => bail!("cannot stop thread {tid}: {e}"),
            Err(_) => bail!("the tracer of thread {tid} ended"),
        }
    }
}

impl Drop for ThreadHold {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(t) = self.tracer.take() {
            let _ = t.join();
        }
    }
}

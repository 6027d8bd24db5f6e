//! The real-kernel test tier: helpers that build hosts out of network namespaces and veth
//! pairs, run the real binaries and real tools in them, and tear everything down again, on
//! success and on failure alike (every resource is owned by a value whose `Drop` removes it).
//!
//! Rules these helpers enforce for every test (DEVELOPERS.md, the traffic rule): packets stay
//! inside namespaces a test created; addresses come from 198.51.100.0/24, 203.0.113.0/24,
//! 192.0.2.0/24, fd00::/8 (underlay) and 100.64.0.0/10 (overlay); every process a test starts
//! is ended by the PID the test holds; every load is bounded in time.
//!
//! The tests need root (`CAP_NET_ADMIN`, `CAP_SYS_ADMIN`). Without it they fail with a message
//! saying so; they never skip. `cargo xtask test` runs this tier after the unit tier.
#![forbid(unsafe_code)]

pub mod apiload;
pub mod attack;
pub mod bed;
pub mod fleet;
pub mod hosts;
pub mod http;
pub mod image;
pub mod impair;
pub mod inject;
pub mod lan;
mod ledger;
pub mod measure;
pub mod members;
pub mod node;
pub mod pair;
pub mod postgres;
pub mod rivals;
pub mod rogue;
pub mod shipped;
pub mod soak;
pub mod swarm;
pub mod vlan;
pub mod vm;

/// What the bed measured, as data (a crate of its own: xtask reads it).
pub use cyphonic_report as report;

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

pub use http::{
    Answer, HA_METRICS, NODE_METRICS, POLICY_METRICS, dashboard_lacks, dashboard_metrics,
    dashboard_queries_parse, http_get, http_request, metric, promtool_check, sample_names,
};
pub use ledger::{RECORDS, Swept, sweep_orphans, tear_down_on_abnormal_exit};

/// Fails clearly unless we run as root.
///
/// # Panics
/// When not root: this tier cannot run otherwise, and must not pretend to pass.
pub fn require_root() {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned));
    assert_eq!(
        uid.as_deref(),
        Some("0"),
        "the real-kernel tests need root (network namespaces, AF_PACKET); run `cargo xtask test` as root"
    );
}

/// A name unique to this process and call, `{prefix}{pid}x{n}`, among every process alive:
/// the kernel tier runs two test programs at once (and the soak beside them), each making
/// namespaces and files named by this. For namespaces and paths, not interfaces (the
/// kernel's 15 bytes): those are named inside their namespace.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}x{n}", std::process::id())
}

/// Runs a command to completion; fails with its stderr if it fails.
///
/// # Errors
/// The command cannot start or exits non-zero.
pub fn sh(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("starting {program} (is it installed?)"))?;
    check(&out, &format!("{program} {}", args.join(" ")))
}

/// `cyphonic-cloud ca issue` (the program `cloud`) from the CA directory `ca`: a
/// certificate and key of `name` holding `block` (one, or several separated by spaces: an
/// IPv4 block and an IPv6 one), written into `out`.
///
/// # Errors
/// A path is not UTF-8, or the CA tool refuses (its error and output in the message).
pub fn ca_issue(
    cloud: &std::path::Path,
    ca: &std::path::Path,
    name: &str,
    block: &str,
    out: &std::path::Path,
) -> anyhow::Result<String> {
    let path = |p: &std::path::Path| p.to_str().context("path").map(str::to_owned);
    let (ca, out) = (path(ca)?, path(out)?);
    let mut args = vec!["ca", "issue", "--dir", &ca, "--name", name];
    for b in block.split_whitespace() {
        args.extend(["--vip-block", b]);
    }
    args.extend(["--out", &out]);
    sh(&path(cloud)?, &args)
}

fn check(out: &Output, what: &str) -> anyhow::Result<String> {
    if !out.status.success() {
        bail!(
            "`{what}` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `len` pseudo-random bytes (xorshift; incompressible enough for a transfer test), the
/// same on every call.
#[must_use]
pub fn pseudo_random(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[3]
        })
        .collect()
}

/// Sends `len` [`pseudo_random`] bytes over one TCP connection with netcat, from `from` to
/// `to_ip`:5555, where `to` listens (each end bounded by `timeout`; the listener's end
/// waited for 30 s after the sender's), the bytes staged in `work`. Returns the file sent
/// and the file received, for the caller to compare.
///
/// # Errors
/// The sender fails (its output in the message), or the listener does not end.
pub fn netcat(
    work: &std::path::Path,
    (from, to, to_ip): (&Netns, &Netns, std::net::Ipv4Addr),
    len: usize,
    timeout: Duration,
) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
    let input = work.join("in.bin");
    let output = work.join("out.bin");
    std::fs::write(&input, pseudo_random(len))?;
    let secs = timeout.as_secs().to_string();
    let receive = format!("exec nc -l 5555 > {}", output.display());
    let server = to.spawn("timeout", &[&secs, "sh", "-c", &receive])?;
    std::thread::sleep(Duration::from_millis(300));
    let send = format!("exec nc -N -q 1 {to_ip} 5555 < {}", input.display());
    let out = from.exec_output("timeout", &[&secs, "sh", "-c", &send])?;
    ensure!(
        out.status.success(),
        "the sender: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    server.wait(Duration::from_secs(30))?;
    Ok((input, output))
}

/// The unsigned integer `v` of a status document, which must be there: a check that read a
/// missing field as 0 (or as `u64::MAX`) could not fail once the field is renamed.
///
/// # Panics
/// `v` is missing or not an unsigned integer (at the caller's line).
#[track_caller]
#[must_use]
pub fn uint(v: &serde_json::Value) -> u64 {
    // Not in a closure: the panic names the caller's line.
    let Some(n) = v.as_u64() else {
        panic!("not an unsigned integer (a field gone?): {v}");
    };
    n
}

/// A network namespace, deleted (with everything in it) when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a namespace with a unique name starting with `prefix`, loopback up, and IPv6
    /// duplicate address detection off (its interfaces are ours alone; detection would hold
    /// every new IPv6 address back for a second or two).
    ///
    /// # Errors
    /// `ip netns add` failing.
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        ledger::sweep_once();
        let name = unique(&format!("cy{prefix}"));
        sh("ip", &["netns", "add", &name])?;
        ledger::add_namespace(&name);
        let ns = Self { name };
        ns.ip(&["link", "set", "dev", "lo", "up"])?;
        ns.exec(
            "sysctl",
            &[
                "-qw",
                "net.ipv6.conf.default.accept_dad=0",
                "net.ipv6.conf.all.accept_dad=0",
            ],
        )?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip <args>` inside the namespace.
    ///
    /// # Errors
    /// The command failing.
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        sh("ip", &all)
    }

    /// The IPv4 address on `iface` and its prefix length, as the kernel has it.
    pub fn ipv4_address(&self, iface: &str) -> Option<(std::net::Ipv4Addr, u8)> {
        let out = self.ip(&["-4", "-o", "addr", "show", "dev", iface]).ok()?;
        let cidr = out.split_whitespace().skip_while(|w| *w != "inet").nth(1)?;
        let (ip, len) = cidr.split_once('/')?;
        Some((ip.parse().ok()?, len.parse().ok()?))
    }

    /// The IPv4 default route's gateway.
    pub fn default_route(&self) -> Option<std::net::Ipv4Addr> {
        let out = self.ip(&["-4", "route", "show", "default"]).ok()?;
        out.split_whitespace()
            .skip_while(|w| *w != "via")
            .nth(1)?
            .parse()
            .ok()
    }

    /// Runs a program inside the namespace to completion.
    ///
    /// # Errors
    /// The program failing.
    pub fn exec(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .command(program, args)
            .output()
            .with_context(|| format!("starting {program}"))?;
        check(
            &out,
            &format!("{program} {} (in {})", args.join(" "), self.name),
        )
    }

    /// Runs a program inside the namespace and returns its output whatever its exit status.
    ///
    /// # Errors
    /// The program cannot start.
    pub fn exec_output(&self, program: &str, args: &[&str]) -> anyhow::Result<Output> {
        self.command(program, args)
            .output()
            .with_context(|| format!("starting {program}"))
    }

    /// A command that will run inside the namespace.
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]).args(args);
        cmd
    }

    /// Gives programs run in this namespace (through `ip netns exec`) their own
    /// `/etc/resolv.conf`: `ip netns exec` bind-mounts `/etc/netns/<name>/resolv.conf` over
    /// it. Removed with the namespace.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn set_resolv_conf(&self, text: &str) -> anyhow::Result<()> {
        let dir = std::path::Path::new("/etc/netns").join(&self.name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("resolv.conf"), text)?;
        Ok(())
    }

    /// Starts a program inside the namespace; it is killed when the returned value drops.
    ///
    /// # Errors
    /// The program cannot start.
    pub fn spawn(&self, program: &str, args: &[&str]) -> anyhow::Result<Proc> {
        let child = self
            .command(program, args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {program} in {}", self.name))?;
        Ok(Proc::from_child(
            child,
            &format!("{program} in {}", self.name),
        ))
    }
}

impl Netns {
    /// Starts one of our daemons in the namespace, its output appended to `log`, and waits
    /// up to 10 s for `ready` (it is stopped, and the log shown, if it exits or is not ready).
    ///
    /// # Errors
    /// It cannot start, exits, or is not ready in time (its log is in the error).
    pub fn daemon(
        &self,
        program: &std::path::Path,
        args: &[&str],
        log: &std::path::Path,
        mut ready: impl FnMut() -> bool,
    ) -> anyhow::Result<Proc> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let name = program
            .file_name()
            .map_or_else(|| "daemon".into(), |n| n.to_string_lossy().into_owned());
        let child = self
            .command(program.to_str().context("program path")?, args)
            // Their own default (info) or their file's `[log] level`, never the runner's.
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let mut proc = Proc::from_child(child, &name);
        let up = wait_until(Duration::from_secs(10), &format!("{name} ready"), || {
            proc.running() && ready()
        });
        if let Err(e) = up {
            bail!(
                "{e}; {name} log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        Ok(proc)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        ledger::remove_namespace(&self.name);
        ledger::delete_namespace(&self.name);
    }
}

/// A process a test started; killed by its PID (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct Proc {
    child: Option<Child>,
    what: String,
}

impl Proc {
    /// Takes ownership of a started child (killed on drop).
    pub fn from_child(child: Child, what: &str) -> Self {
        ledger::add_process(child.id());
        Self {
            child: Some(child),
            what: what.to_owned(),
        }
    }

    /// The child, no longer on the list [`tear_down_on_abnormal_exit`] kills (before it is reaped
    /// and its PID can be reused).
    fn take(&mut self) -> anyhow::Result<Child> {
        let child = self.child.take().context("already stopped")?;
        ledger::remove_process(child.id());
        Ok(child)
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Stops it with `signal` (by PID) and waits up to `within` for it to exit; returns its
    /// output.
    ///
    /// # Errors
    /// It does not exit in time (it is then killed).
    pub fn stop(mut self, signal: &str, within: Duration) -> anyhow::Result<Output> {
        self.end(signal, within)
    }

    /// [`Proc::stop`] in place: the value stays, with nothing running (a daemon a test starts
    /// again in its place).
    ///
    /// # Errors
    /// It does not exit in time (it is then killed), or it was stopped already.
    pub fn end(&mut self, signal: &str, within: Duration) -> anyhow::Result<Output> {
        let child = self.take()?;
        let _ = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .output();
        match exit_within(child, within)? {
            Ok(out) => Ok(out),
            Err(out) => bail!(
                "{} did not exit within {within:?} of SIG{signal}; stderr: {}",
                self.what,
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

    /// Waits up to `within` for it to exit on its own; returns its output.
    ///
    /// # Errors
    /// It is still running at the deadline (it is then killed).
    pub fn wait(mut self, within: Duration) -> anyhow::Result<Output> {
        let child = self.take()?;
        match exit_within(child, within)? {
            Ok(out) => Ok(out),
            Err(out) => bail!(
                "{} still ran after {within:?}; stderr: {}",
                self.what,
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

/// Waits up to `within` for `child` to exit: `Ok(output)` if it did, `Err(output)` if it had
/// to be killed at the deadline.
fn exit_within(mut child: Child, within: Duration) -> anyhow::Result<Result<Output, Output>> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(Ok(child.wait_with_output()?));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    Ok(Err(child.wait_with_output()?))
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(mut child) = self.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A veth pair between two namespaces: `a` in `ns_a`, `b` in `ns_b`, both up, and ready to
/// carry frames.
///
/// Ready means the kernel's link watcher has seen the carrier (operational state `UP`): until
/// it runs, the device's queue discipline is `noop`, which drops every frame sent, and it
/// runs up to a second later, more on a loaded machine. A test that sent at once lost its
/// frames so (the netio segmentation test, with three test programs running at once).
///
/// # Errors
/// `ip link` failing, or an end not ready within 10 s.
pub fn veth(ns_a: &Netns, a: &str, ns_b: &Netns, b: &str) -> anyhow::Result<()> {
    ensure!(
        a.len() < 16 && b.len() < 16,
        "interface names must be shorter than 16 bytes"
    );
    // Always with keywords: a bare short name such as `a` or `b` would be read as one
    // (`address`, `broadcast`).
    ns_a.ip(&[
        "link",
        "add",
        "name",
        a,
        "type",
        "veth",
        "peer",
        "name",
        b,
        "netns",
        ns_b.name(),
    ])?;
    ns_a.ip(&["link", "set", "dev", a, "up"])?;
    ns_b.ip(&["link", "set", "dev", b, "up"])?;
    for (ns, name) in [(ns_a, a), (ns_b, b)] {
        wait_until(
            Duration::from_secs(10),
            &format!("{name} to carry frames"),
            || link_carries(ns, name),
        )?;
    }
    Ok(())
}

/// Whether the link watcher has brought `name` in `ns` to operational state `UP` (and so
/// given it its queue discipline).
fn link_carries(ns: &Netns, name: &str) -> bool {
    ns.ip(&["-o", "link", "show", "dev", name])
        .is_ok_and(|line| line.contains(" state UP "))
}

/// Polls `f` every 50 ms until it returns true or `within` passes.
///
/// # Errors
/// The condition still fails at the deadline.
pub fn wait_until(within: Duration, what: &str, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("timed out after {within:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

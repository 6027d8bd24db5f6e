//! The packages as shipped (issue 56): the cloud, an adapter and a node, each installed from
//! its .deb into a scratch root of its own (one machine each, `cargo xtask test` installs
//! them) and run from the files the packages put in /etc/cyphonic, filled in only where they
//! say "fill in", as the service user under its unit's restrictions.
//!
//! No systemd runs here, so each unit is reproduced from its own file ([`Unit`]): its user
//! and group (with their groups), capabilities (ambient and bounding), `NoNewPrivileges`,
//! `UMask`, `ExecStart`, and its file system: the machine's root read-only
//! (`ProtectSystem=strict`; /usr too) but for `StateDirectory`, `RuntimeDirectory` and
//! `ReadWritePaths`, a private /tmp (`PrivateTmp`), no /root or /home (`ProtectHome`), and a
//! /dev of the few devices every service has, as udev makes them, and what `DeviceAllow`
//! adds (the TUN clone device). The directives that restrict system calls and kernel
//! tunables are not reproduced:
//! `systemd-analyze verify` and `security` read those (xtask/src/deb.rs). A directive this
//! module does not know fails the run, so that no new one goes unread.
//!
//! The run: the CA is made and delegated and the cloud's key made as root, as
//! docs/operations.md says; the adapter's token is made as root before the cloud's first
//! start (the command writes the registry itself, and the service must still start); the
//! cloud serves; the node's token is made through the running cloud. Each `check-config`,
//! run as the service user, passes; the adapter and the node enroll with certificates of a
//! minute, renew them, and everything survives a restart: after it, a device on the
//! adapter's LAN takes a lease, and the node resolves its name and pings it through the
//! tunnel.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use crate::lan::{DhcpClient, DhcpHost};
use crate::{Netns, Proc, veth, wait_until};

/// One machine: a scratch root with the common package and one program's installed
/// (xtask/src/deb.rs, `Scratch`: `<base>/root`, its /usr's upper layer `<base>/upper`).
#[derive(Debug)]
pub struct Machine {
    /// The program (`cyphonic-adapter`).
    program: &'static str,
    /// The root.
    root: PathBuf,
    /// What the packages put in /usr (this machine's /usr below it).
    upper: PathBuf,
    /// The program's unit, read.
    unit: Unit,
}

impl Machine {
    /// The machine of `program` installed at `base`.
    ///
    /// # Errors
    /// Its unit is missing or holds a directive [`Unit`] does not know.
    pub fn at(base: &Path, program: &'static str) -> anyhow::Result<Self> {
        let upper = base.join("upper");
        let unit_file = upper.join(format!("lib/systemd/system/{program}.service"));
        let text = std::fs::read_to_string(&unit_file)
            .with_context(|| format!("reading {}", unit_file.display()))?;
        let unit = Unit::parse(&text).with_context(|| unit_file.display().to_string())?;
        let root = base.join("root");
        for dir in ["proc", "sys", "dev", "tmp", "root", "home"] {
            std::fs::create_dir_all(root.join(dir))?;
        }
        Ok(Self {
            program,
            root,
            upper,
            unit,
        })
    }

    /// A file of the machine (`etc/cyphonic/adapter.toml`).
    pub fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// `argv` run in `ns`, chrooted into the machine as root (an operator's command), or
    /// (`service`) as its unit runs the service.
    fn command(&self, ns: &Netns, argv: &[&str], service: bool) -> anyhow::Result<Command> {
        let root = self.root.to_str().context("root path")?;
        let upper = self.upper.to_str().context("upper path")?;
        // Positional: $1 the root, $2 the upper layer, then what to run; writable places
        // are made mount points before the root is remounted read-only, and keep their
        // own flags below it.
        let mut script = String::from("set -e\nr=$1; up=$2; shift 2\n");
        if service {
            self.prepare_runtime()?;
            for dir in self.unit.writable() {
                script.push_str(&format!("mount --bind \"$r{dir}\" \"$r{dir}\"\n"));
            }
            script.push_str("mount --rbind \"$r\" \"$r\"\nmount -o remount,bind,ro \"$r\"\n");
        }
        script.push_str(
            "mount -t overlay overlay -o ro,lowerdir=\"$up\":/usr \"$r/usr\"\n\
             mount --rbind /proc \"$r/proc\"\nmount --rbind /sys \"$r/sys\"\n",
        );
        if service {
            // The devices of PrivateDevices= and DevicePolicy=closed, as udev makes them,
            // and what DeviceAllow= adds.
            script.push_str("mount -t tmpfs -o mode=0755,nosuid tmpfs \"$r/dev\"\n");
            for (node, major, minor) in self.unit.devices() {
                script.push_str(&format!(
                    "mkdir -p \"$(dirname \"$r{node}\")\"\nmknod -m 0666 \"$r{node}\" c {major} {minor}\n"
                ));
            }
        } else {
            script.push_str("mount --rbind /dev \"$r/dev\"\n");
        }
        if service && self.unit.private_tmp {
            script.push_str("mount -t tmpfs -o mode=1777 tmpfs \"$r/tmp\"\n");
        }
        if service && self.unit.protect_home {
            script.push_str(
                "mount -t tmpfs -o ro,mode=0755 tmpfs \"$r/root\"\n\
                 mount -t tmpfs -o ro,mode=0755 tmpfs \"$r/home\"\n",
            );
        }
        script.push_str("exec chroot \"$r\" \"$@\"\n");
        let mut args: Vec<String> = vec![
            "--mount".into(),
            "--propagation".into(),
            "private".into(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            script,
            "sh".into(),
            root.into(),
            upper.into(),
        ];
        if service {
            args.extend(self.unit.setpriv());
            args.extend(
                [
                    "/bin/sh",
                    "-c",
                    "umask \"$0\"; exec \"$@\"",
                    &self.unit.umask,
                ]
                .map(str::to_owned),
            );
        }
        args.extend(argv.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = ns.command("unshare", &args);
        cmd.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        Ok(cmd)
    }

    /// An operator's command, as root on the machine: what it printed, or its error.
    fn run(&self, ns: &Netns, argv: &[&str]) -> anyhow::Result<String> {
        let out = self.command(ns, argv, false)?.output()?;
        said(&out, &argv.join(" "))
    }

    /// `argv` as the service user, under the unit's restrictions, to its end.
    fn run_as_service(&self, ns: &Netns, argv: &[&str]) -> anyhow::Result<Output> {
        Ok(self.command(ns, argv, true)?.output()?)
    }

    /// The unit's `ExecStart`, as the unit runs it, in `ns`; its output appended to the
    /// machine's `daemon.log`.
    fn start(&self, ns: &Netns) -> anyhow::Result<Proc> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())?;
        let argv: Vec<&str> = self.unit.exec_start.iter().map(String::as_str).collect();
        let child = self
            .command(ns, &argv, true)?
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.program))?;
        Ok(Proc::from_child(child, self.program))
    }

    /// What systemd does before a start: the runtime directory, the service's own.
    fn prepare_runtime(&self) -> anyhow::Result<()> {
        let (uid, gid) = self.ids()?;
        for (dir, mode) in &self.unit.runtime {
            let path = self.path(&format!("run/{dir}"));
            std::fs::create_dir_all(&path)?;
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))?;
        }
        Ok(())
    }

    /// The service user's and group's ids on this machine.
    fn ids(&self) -> anyhow::Result<(u32, u32)> {
        let id = |file: &str, name: &str| -> anyhow::Result<u32> {
            let text = std::fs::read_to_string(self.path(file))?;
            text.lines()
                .find_map(|l| {
                    let mut f = l.split(':');
                    (f.next() == Some(name)).then(|| f.nth(1)?.parse().ok())?
                })
                .with_context(|| format!("no {name} in /{file}"))
        };
        Ok((
            id("etc/passwd", &self.unit.user)?,
            id("etc/group", &self.unit.group)?,
        ))
    }

    /// The daemon's log.
    pub fn log(&self) -> PathBuf {
        self.root.with_file_name("daemon.log")
    }

    /// The running program's status document, asked as root.
    fn status(&self, ns: &Netns) -> anyhow::Result<Value> {
        let text = self.run(
            ns,
            &[&format!("/usr/bin/{}", self.program), "status", "--json"],
        )?;
        Ok(serde_json::from_str(&text)?)
    }

    /// The packaged configuration with each line marked `# fill in` given its value from
    /// `values` (`(dotted key, TOML value)`); every such line must be given one, and every
    /// value must have such a line.
    fn fill_in(&self, values: &[(&str, String)]) -> anyhow::Result<()> {
        let config = self.config();
        let text = std::fs::read_to_string(&config)?;
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let mut used = vec![false; values.len()];
        for (i, key) in cyphonic_settings::testing::to_fill_in(&text) {
            let Some(at) = values.iter().position(|(k, _)| *k == key) else {
                bail!("{}: nothing to fill in {key} with", config.display());
            };
            used[at] = true;
            let name = key.rsplit('.').next().unwrap_or(&key);
            lines[i] = format!("{name} = {}", values[at].1);
        }
        if let Some(at) = used.iter().position(|u| !u) {
            bail!(
                "{} does not say to fill in {}",
                config.display(),
                values[at].0
            );
        }
        std::fs::write(&config, lines.join("\n") + "\n")?;
        Ok(())
    }

    /// The program's configuration file, where the package put it.
    fn config(&self) -> PathBuf {
        self.path(&format!(
            "etc/cyphonic/{}.toml",
            self.program.trim_start_matches("cyphonic-")
        ))
    }

    /// `check-config` as the service user, under the unit's restrictions: it must pass.
    fn check_config(&self, ns: &Netns) -> anyhow::Result<String> {
        let out =
            self.run_as_service(ns, &[&format!("/usr/bin/{}", self.program), "check-config"])?;
        said(
            &out,
            &format!("{} check-config as the service user", self.program),
        )
    }
}

/// What a command printed, or why it failed.
fn said(out: &Output, what: &str) -> anyhow::Result<String> {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "{what}: {}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text)
}

/// A unit's `[Service]`, as far as it is reproduced here (see the module's documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unit {
    user: String,
    group: String,
    /// Capability names (`CAP_NET_RAW`).
    ambient: Vec<String>,
    bounding: Vec<String>,
    no_new_privileges: bool,
    umask: String,
    /// Below /var/lib.
    state: Vec<String>,
    /// Below /run, with its mode.
    runtime: Vec<(String, u32)>,
    read_write: Vec<String>,
    private_tmp: bool,
    protect_home: bool,
    /// `DeviceAllow=` paths.
    device_allow: Vec<String>,
    exec_start: Vec<String>,
}

/// Directives with no bearing on the file system, the user or the capabilities, or that
/// this module does not reproduce (module documentation).
const NOT_REPRODUCED: &[&str] = &[
    "Type",
    "NotifyAccess",
    "WatchdogSec",
    "ExecReload",
    "Restart",
    "RestartSec",
    "RestartPreventExitStatus",
    "RuntimeDirectoryPreserve",
    "StateDirectoryMode",
    "ConfigurationDirectory",
    "PrivateDevices",
    "DevicePolicy",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectClock",
    "ProtectHostname",
    "RestrictAddressFamilies",
    "RestrictNamespaces",
    "RestrictRealtime",
    "LimitRTPRIO",
    "RestrictSUIDSGID",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "SystemCallArchitectures",
    "SystemCallFilter",
    "LimitNOFILE",
];

impl Unit {
    /// Reads a unit file's `[Service]`.
    ///
    /// # Errors
    /// A directive not known here, a `ProtectSystem` other than `strict`, no `ExecStart`,
    /// `User` or `Group`.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut unit = Self {
            umask: "0022".to_owned(),
            ..Self::default()
        };
        let mut runtime_mode = 0o755;
        let mut section = "";
        let mut strict = false;
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line.starts_with('[') {
                section = line;
                continue;
            }
            if section != "[Service]" {
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .with_context(|| format!("not key=value: {line}"))?;
            let words = || {
                value
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            };
            let yes = value == "yes" || value == "true";
            match key {
                "User" => value.clone_into(&mut unit.user),
                "Group" => value.clone_into(&mut unit.group),
                "AmbientCapabilities" => unit.ambient = words(),
                "CapabilityBoundingSet" => unit.bounding = words(),
                "NoNewPrivileges" => unit.no_new_privileges = yes,
                "UMask" => value.clone_into(&mut unit.umask),
                "StateDirectory" => unit.state = words(),
                "RuntimeDirectory" => {
                    unit.runtime = words().into_iter().map(|d| (d, 0)).collect();
                }
                "RuntimeDirectoryMode" => {
                    runtime_mode = u32::from_str_radix(value, 8)
                        .with_context(|| format!("RuntimeDirectoryMode={value}"))?;
                }
                "ReadWritePaths" => unit.read_write = words(),
                "PrivateTmp" => unit.private_tmp = yes,
                "ProtectHome" => unit.protect_home = yes,
                "ProtectSystem" => {
                    ensure!(
                        value == "strict",
                        "ProtectSystem={value}: only strict is reproduced"
                    );
                    strict = true;
                }
                "ExecStart" => unit.exec_start = words(),
                "DeviceAllow" => {
                    let path = words().into_iter().next().unwrap_or_default();
                    ensure!(
                        path == "/dev/net/tun",
                        "DeviceAllow={value}: only /dev/net/tun is reproduced"
                    );
                    unit.device_allow.push(path);
                }
                other if NOT_REPRODUCED.contains(&other) => {}
                other => bail!(
                    "{other}= is a directive this test does not know: reproduce it, or say why not"
                ),
            }
        }
        for r in &mut unit.runtime {
            r.1 = runtime_mode;
        }
        ensure!(strict, "no ProtectSystem=strict");
        ensure!(
            !unit.user.is_empty() && !unit.group.is_empty() && !unit.exec_start.is_empty(),
            "no User, Group or ExecStart"
        );
        Ok(unit)
    }

    /// The places the service may write: its state and runtime directories, its
    /// `ReadWritePaths` (those below /proc are writable anyway here).
    fn writable(&self) -> Vec<String> {
        self.state
            .iter()
            .map(|d| format!("/var/lib/{d}"))
            .chain(self.runtime.iter().map(|(d, _)| format!("/run/{d}")))
            .chain(
                self.read_write
                    .iter()
                    .filter(|p| !p.starts_with("/proc/"))
                    .cloned(),
            )
            .collect()
    }

    /// The device nodes a service sees: those every service has under `PrivateDevices=`
    /// or `DevicePolicy=closed`, and the TUN clone device when `DeviceAllow=` names it.
    fn devices(&self) -> Vec<(&str, u32, u32)> {
        let mut nodes = vec![
            ("/dev/null", 1, 3),
            ("/dev/zero", 1, 5),
            ("/dev/full", 1, 7),
            ("/dev/random", 1, 8),
            ("/dev/urandom", 1, 9),
        ];
        if self.device_allow.iter().any(|d| d == "/dev/net/tun") {
            nodes.push(("/dev/net/tun", 10, 200));
        }
        nodes
    }

    /// `setpriv` becoming the unit's user with its capabilities and nothing more.
    fn setpriv(&self) -> Vec<String> {
        let caps = |names: &[String]| {
            std::iter::once("-all".to_owned())
                .chain(
                    names
                        .iter()
                        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_ascii_lowercase())),
                )
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut args = vec![
            "setpriv".to_owned(),
            format!("--reuid={}", self.user),
            format!("--regid={}", self.group),
            "--init-groups".to_owned(),
            format!("--inh-caps={}", caps(&self.ambient)),
            format!("--ambient-caps={}", caps(&self.ambient)),
            format!("--bounding-set={}", caps(&self.bounding)),
        ];
        if self.no_new_privileges {
            args.push("--no-new-privs".to_owned());
        }
        args.push("--".to_owned());
        args
    }
}

/// The three machines' network: an underlay switch (198.51.100.0/24: the cloud .10, the
/// adapter .2, the node .3) and the adapter's LAN (`lan`, one device namespace behind it).
struct Network {
    cloud: Netns,
    gw: Netns,
    node: Netns,
    _switch: Netns,
    /// On the adapter's LAN, not yet a DHCP host.
    device: Option<Netns>,
}

impl Network {
    fn new() -> anyhow::Result<Self> {
        let switch = Netns::new("shsw")?;
        switch.ip(&["link", "add", "name", "br0", "type", "bridge"])?;
        switch.ip(&["link", "set", "dev", "br0", "up"])?;
        let (cloud, gw, node) = (Netns::new("shc")?, Netns::new("shg")?, Netns::new("shn")?);
        for (ns, iface, port, addr) in [
            (&cloud, "eth0", "c0", "198.51.100.10/24"),
            (&gw, "wan", "g0", "198.51.100.2/24"),
            (&node, "eth0", "n0", "198.51.100.3/24"),
        ] {
            veth(ns, iface, &switch, port)?;
            switch.ip(&["link", "set", "dev", port, "master", "br0"])?;
            ns.ip(&["addr", "add", addr, "dev", iface])?;
        }
        let device = Netns::new("shd")?;
        veth(&gw, "lan", &device, "eth0")?;
        Ok(Self {
            cloud,
            gw,
            node,
            _switch: switch,
            device: Some(device),
        })
    }
}

/// The certificate lifetime the tokens give: a renewal within the run.
const LIFETIME: &str = "60";

/// The certificate's fingerprint in a status document.
fn fingerprint(status: &Value) -> anyhow::Result<String> {
    status["certificate"]["fingerprint"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no certificate fingerprint in {status}"))
}

/// A token that `token create ... --json` printed, and the blocks it binds.
fn token(json: &str) -> anyhow::Result<(String, Vec<String>)> {
    let v: Value = serde_json::from_str(json.trim()).with_context(|| json.to_owned())?;
    let token = v["token"].as_str().context("no token")?.to_owned();
    let blocks = v["blocks"]
        .as_array()
        .context("no blocks")?
        .iter()
        .filter_map(|b| b.as_str().map(str::to_owned))
        .collect();
    Ok((token, blocks))
}

/// Runs the whole check on the three machines; each step's failure says what and shows
/// the daemon's log.
///
/// # Errors
/// A step fails.
pub fn run(cloud: &Machine, adapter: &Machine, node: &Machine) -> anyhow::Result<()> {
    let mut net = Network::new()?;
    let with_log = |m: &Machine, e: anyhow::Error| {
        e.context(format!(
            "{} log:\n{}",
            m.program,
            std::fs::read_to_string(m.log()).unwrap_or_default()
        ))
    };

    // The cloud's files, made as docs/operations.md says (the CA on this machine, as root).
    let cli = "/usr/bin/cyphonic-cloud";
    cloud.run(
        &net.cloud,
        &[
            cli,
            "ca",
            "init",
            "--dir",
            "/root/ca",
            "--domain",
            "ovl.example",
        ],
    )?;
    cloud.run(
        &net.cloud,
        &[
            cli,
            "ca",
            "delegate",
            "--dir",
            "/root/ca",
            "--out",
            "/root/issuing",
        ],
    )?;
    let public_key = cloud
        .run(
            &net.cloud,
            &[cli, "keygen", "--out", "/etc/cyphonic/cloud.key"],
        )?
        .trim()
        .to_owned();
    let (_, gid) = cloud.ids()?;
    for (from, to, mode) in [
        ("root/ca/ca.crt", "etc/cyphonic/ca.crt", 0o644),
        (
            "root/issuing/issuing.crt",
            "etc/cyphonic/issuing.crt",
            0o644,
        ),
        (
            "root/issuing/issuing.key",
            "etc/cyphonic/issuing.key",
            0o640,
        ),
    ] {
        std::fs::copy(cloud.path(from), cloud.path(to))?;
        std::os::unix::fs::chown(cloud.path(to), Some(0), Some(gid))?;
        std::fs::set_permissions(cloud.path(to), std::fs::Permissions::from_mode(mode))?;
    }
    let made = |name: &str, prefix: &str| -> anyhow::Result<(String, Vec<String>)> {
        token(&cloud.run(
            &net.cloud,
            &[
                cli,
                "token",
                "create",
                "--name",
                name,
                "--prefix",
                prefix,
                "--lifetime",
                LIFETIME,
                "--json",
            ],
        )?)
    };
    // Before the first start, as root: the command makes the registry itself, and it must
    // be the service's.
    let (adapter_token, _) = made("gw1.ovl.example", "24")?;
    let db = cloud.path("var/lib/cyphonic/cloud.db");
    let (uid, _) = cloud.ids()?;
    ensure!(
        std::fs::metadata(&db)?.uid() == uid,
        "token create as root left {} owned by uid {}",
        db.display(),
        std::fs::metadata(&db)?.uid()
    );
    cloud.check_config(&net.cloud)?;
    let mut cloud_proc = cloud.start(&net.cloud)?;
    wait_until(Duration::from_secs(15), "the cloud serving", || {
        cloud.status(&net.cloud).is_ok()
    })
    .map_err(|e| with_log(cloud, e))?;
    // Through the running cloud, as root.
    let (node_token, node_blocks) = made("laptop.ovl.example", "32")?;

    let cloud_values = |token: &str| {
        vec![
            ("identity.token", format!("\"{token}\"")),
            ("cloud.address", "\"198.51.100.10:7000\"".to_owned()),
            ("cloud.public_key", format!("\"{public_key}\"")),
        ]
    };
    let mut values = vec![("adapter.lan_interface", "\"lan\"".to_owned())];
    values.extend(cloud_values(&adapter_token));
    adapter.fill_in(&values)?;
    node.fill_in(&cloud_values(&node_token))?;
    let ends = [(adapter, &net.gw), (node, &net.node)];
    let mut procs = Vec::new();
    let mut first = Vec::new();
    for (m, ns) in ends {
        let said = m.check_config(ns)?;
        ensure!(said.contains("not enrolled yet"), "{}: {said}", m.program);
        procs.push(m.start(ns)?);
        let mut status = Value::Null;
        wait_until(
            Duration::from_secs(30),
            &format!("{} enrolled", m.program),
            || {
                m.status(ns).is_ok_and(|s| {
                    status = s;
                    status["certificate"]["fingerprint"].is_string()
                })
            },
        )
        .map_err(|e| with_log(m, e))?;
        first.push(fingerprint(&status)?);
        let noun = m.program.trim_start_matches("cyphonic-");
        for file in [
            format!("{noun}.crt"),
            format!("{noun}.key"),
            format!("{noun}-ca.crt"),
        ] {
            let meta = std::fs::metadata(m.path(&format!("var/lib/cyphonic/{file}")))
                .with_context(|| format!("{}: enrollment wrote no {file}", m.program))?;
            ensure!(
                meta.uid() == uid,
                "{file} is not the service's: uid {}",
                meta.uid()
            );
        }
    }
    // Certificates of a minute are renewed at two thirds of it.
    for ((m, ns), old) in ends.iter().zip(&first) {
        wait_until(
            Duration::from_secs(90),
            &format!("{} renewed", m.program),
            || {
                m.status(ns)
                    .ok()
                    .and_then(|s| fingerprint(&s).ok())
                    .is_some_and(|f| f != *old)
            },
        )
        .map_err(|e| with_log(m, e))?;
    }

    // A restart of everything: the cloud first, then each end, which starts from what it
    // wrote (its token is spent).
    cloud_proc.end("TERM", Duration::from_secs(10))?;
    cloud_proc = cloud.start(&net.cloud)?;
    wait_until(Duration::from_secs(15), "the cloud serving again", || {
        cloud.status(&net.cloud).is_ok()
    })
    .map_err(|e| with_log(cloud, e))?;
    for (p, (m, ns)) in procs.iter_mut().zip(ends) {
        p.end("TERM", Duration::from_secs(10))?;
        *p = m.start(ns)?;
        wait_until(
            Duration::from_secs(30),
            &format!("{} up again", m.program),
            || {
                m.status(ns)
                    .is_ok_and(|s| s["certificate"]["fingerprint"].is_string())
            },
        )
        .map_err(|e| with_log(m, e))?;
    }
    // The tunnel: a device on the adapter's LAN takes a lease (and a name); the node
    // resolves that name with its own DNS service (on its vIP), which sets the pair up, and
    // pings it.
    let device = net.device.take().context("the device")?;
    let mac = crate::hosts::mac_of(&device, "eth0")?;
    let mut camera = DhcpHost::new(device, mac, DhcpClient::Udhcpc, "camera")?;
    camera.start()?;
    camera
        .wait_for(&["bound"], 1, Duration::from_secs(20))
        .map_err(|e| with_log(adapter, e))?;
    let vip: ipnet::Ipv4Net = node_blocks
        .iter()
        .find_map(|b| b.parse().ok())
        .context("the node's token binds no IPv4 block")?;
    net.node
        .set_resolv_conf(&format!("nameserver {}\n", vip.addr()))?;
    let name = "camera.gw1.ovl.example";
    wait_until(
        Duration::from_secs(30),
        "a ping from the node to the camera by name",
        || {
            net.node
                .exec_output("ping", &["-c", "1", "-W", "1", name])
                .is_ok_and(|o| o.status.success())
        },
    )
    .map_err(|e| with_log(node, with_log(adapter, e)))?;
    drop(procs);
    drop(cloud_proc);
    eprintln!(
        "as shipped: the cloud served, the adapter and the node enrolled, renewed and came back after a restart, as the service user under their units"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The shipped units read; what they grant becomes setpriv's arguments; a directive
    /// this module does not know is refused.
    #[test]
    fn the_units_read_and_an_unknown_directive_is_refused() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let adapter =
            std::fs::read_to_string(root.join("config/cyphonic-adapter.service")).unwrap();
        let unit = Unit::parse(&adapter).unwrap();
        assert_eq!(unit.user, "cyphonic");
        assert_eq!(
            unit.setpriv()[4..7],
            [
                "--inh-caps=-all,+net_raw,+net_admin",
                "--ambient-caps=-all,+net_raw,+net_admin",
                "--bounding-set=-all,+net_raw,+net_admin"
            ]
        );
        assert_eq!(unit.writable(), ["/var/lib/cyphonic", "/run/cyphonic"]);
        assert_eq!(unit.runtime, [("cyphonic".to_owned(), 0o750)]);
        assert_eq!(unit.umask, "0077");
        for program in ["cloud", "node"] {
            let text =
                std::fs::read_to_string(root.join(format!("config/cyphonic-{program}.service")))
                    .unwrap();
            Unit::parse(&text).unwrap();
        }
        let e = Unit::parse(&adapter.replace("PrivateTmp=yes", "PrivateTmp=yes\nBindPaths=/x"))
            .unwrap_err();
        assert!(e.to_string().contains("BindPaths="), "{e}");
    }
}

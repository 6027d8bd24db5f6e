//! Devices on a LAN that configure themselves as real ones do: busybox `udhcpc` (small
//! embedded devices), ISC `dhclient` (Debian servers; DHCPv4 or DHCPv6) and dhcpcd (Raspberry
//! Pi OS), each with a hook script that applies what the server said (address, default route,
//! MTU; dhcpcd applies it itself) and records every event in a file the test reads. And `dig`,
//! for DNS questions.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::hosts::TempDir;
use crate::{Netns, Proc, wait_until};

/// Which DHCP client a host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DhcpClient {
    /// busybox udhcpc.
    Udhcpc,
    /// ISC dhclient.
    Dhclient,
    /// ISC dhclient for DHCPv6 (`dhclient -6`): stateful addresses. Its events' `ip` is the
    /// IPv6 address, `dns` and `domain` the DHCPv6 name servers and search list.
    Dhclient6,
    /// dhcpcd, dual stack, as Raspberry Pi OS runs it: DHCPv4, and for IPv6 it follows the
    /// Router Advertisement (SLAAC, and DHCPv6 when M is set); it configures the interface
    /// itself. Its events' `ip` is the lease's address (`bound`) or the DHCPv6 one
    /// (`bound6`), `dns` and `domain` what came with it. It runs with its own run and state
    /// directories (bind mounts in its own mount namespace) and our hook script only, so it
    /// touches nothing of the host's.
    Dhcpcd,
    /// systemd-networkd, as Debian and many appliances configure their ports: DHCPv4, and
    /// the Router Advertisement with DHCPv6 when it says M. It runs with its own `/run/systemd`
    /// and configuration (bind mounts, a read-only `/sys` so it waits for no udev) in PID and
    /// mount namespaces of its own. It has no hook: it writes no events;
    /// [`DhcpHost::networkd_state`] reads its link state file.
    Networkd,
}

/// One event the client's hook script saw: the reason (lower case: `bound`, `renew`,
/// `reboot`, `release`, `nak`, ...) and what the server gave, under the same keys for both
/// clients: `ip`, `mask`, `router`, `dns`, `domain`, `mtu`, `lease`, `server`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Why the script ran.
    pub reason: String,
    /// The values.
    pub vars: HashMap<String, String>,
}

impl Event {
    /// A value, or "" when the server gave none.
    pub fn get(&self, key: &str) -> &str {
        self.vars.get(key).map_or("", String::as_str)
    }
}

/// Both scripts apply the lease to the interface the way a distribution's default script does,
/// then write one line per event (to the file put in place of `@EVENTS@`): `reason=... ip=...
/// router=...`. The line comes last, so a test that saw an event sees its effect too.
const UDHCPC_SCRIPT: &str = r#"#!/bin/sh
case "$1" in
  deconfig) ip -4 addr flush dev "$interface"; ip link set dev "$interface" up ;;
  bound|renew)
    ip -4 addr flush dev "$interface"
    ip addr add "$ip/$mask" dev "$interface"
    [ -n "$mtu" ] && ip link set dev "$interface" mtu "$mtu"
    [ -n "$router" ] && ip route replace default via "$router" dev "$interface"
    ;;
esac
# Written last, so that an event means the lease is on the interface.
echo "reason=$1 ip=$ip mask=$mask router=$router dns=$dns domain=$domain mtu=$mtu lease=$lease server=$serverid" >> "@EVENTS@"
exit 0
"#;

const DHCLIENT_SCRIPT: &str = r#"#!/bin/sh
r=$(echo "$reason" | tr 'A-Z' 'a-z')
case "$reason" in
  PREINIT) ip link set dev "$interface" up ;;
  BOUND|RENEW|REBIND|REBOOT)
    ip -4 addr flush dev "$interface"
    ip addr add "$new_ip_address/$new_subnet_mask" dev "$interface"
    [ -n "$new_interface_mtu" ] && ip link set dev "$interface" mtu "$new_interface_mtu"
    [ -n "$new_routers" ] && ip route replace default via "$new_routers" dev "$interface"
    ;;
  EXPIRE|FAIL|RELEASE|STOP) ip -4 addr flush dev "$interface" ;;
esac
echo "reason=$r ip=$new_ip_address mask=$new_subnet_mask router=$new_routers dns=$new_domain_name_servers domain=$new_domain_name mtu=$new_interface_mtu lease=$new_dhcp_lease_time server=$new_dhcp_server_identifier" >> "@EVENTS@"
exit 0
"#;

const DHCLIENT6_SCRIPT: &str = r#"#!/bin/sh
r=$(echo "$reason" | tr 'A-Z' 'a-z')
case "$reason" in
  PREINIT6) ip link set dev "$interface" up ;;
  BOUND6|RENEW6|REBIND6|REBOOT6)
    if [ -n "$old_ip6_address" ] && [ "$old_ip6_address" != "$new_ip6_address" ]; then
      ip -6 addr del "$old_ip6_address/$old_ip6_prefixlen" dev "$interface"
    fi
    ip -6 addr replace "$new_ip6_address/$new_ip6_prefixlen" dev "$interface" valid_lft "$new_max_life" preferred_lft "$new_preferred_life"
    ;;
  EXPIRE6|RELEASE6|STOP6) ip -6 addr del "$old_ip6_address/$old_ip6_prefixlen" dev "$interface" ;;
esac
echo "reason=$r ip=$new_ip6_address mask=$new_ip6_prefixlen dns=$new_dhcp6_name_servers domain=$new_dhcp6_domain_search lease=$new_max_life server=$new_dhcp6_server_id" >> "@EVENTS@"
exit 0
"#;

const DHCPCD_SCRIPT: &str = r#"#!/bin/sh
r=$(echo "$reason" | tr 'A-Z' 'a-z')
echo "reason=$r ip=${new_dhcp6_ia_na1_ia_addr1:-$new_ip_address} dns=${new_dhcp6_name_servers:-$new_domain_name_servers} domain=${new_dhcp6_domain_search:-$new_domain_name} router=$new_routers" >> "@EVENTS@"
exit 0
"#;

/// A host on a LAN that gets its address by DHCP.
#[derive(Debug)]
pub struct DhcpHost {
    /// Its namespace (interface `eth0`).
    pub ns: Netns,
    /// Its MAC.
    pub mac: String,
    /// Which client it runs.
    pub kind: DhcpClient,
    /// The hostname it sends (option 12).
    pub hostname: String,
    dir: TempDir,
    client: Option<Proc>,
}

impl DhcpHost {
    /// A host in `ns` (with `eth0` plugged into a LAN) that will run `kind`, calling itself
    /// `hostname`. Nothing runs until [`DhcpHost::start`].
    ///
    /// # Errors
    /// The scratch directory or the scripts cannot be written.
    pub fn new(ns: Netns, mac: String, kind: DhcpClient, hostname: &str) -> anyhow::Result<Self> {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = TempDir::new("dhcp")?;
        let (script, text) = match kind {
            DhcpClient::Udhcpc => ("udhcpc.sh", UDHCPC_SCRIPT),
            DhcpClient::Dhclient => ("dhclient.sh", DHCLIENT_SCRIPT),
            DhcpClient::Dhclient6 => ("dhclient.sh", DHCLIENT6_SCRIPT),
            DhcpClient::Dhcpcd => ("dhcpcd.sh", DHCPCD_SCRIPT),
            DhcpClient::Networkd => ("unused.sh", "#!/bin/sh\n"),
        };
        let path = dir.path().join(script);
        // dhclient hands its script a clean environment: the events file is written in.
        let events = dir.path().join("events").display().to_string();
        std::fs::write(&path, text.replace("@EVENTS@", &events))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        let conf = if kind == DhcpClient::Dhclient6 {
            format!(
                "send fqdn.fqdn \"{hostname}\";\nrequest dhcp6.name-servers, dhcp6.domain-search;\ntimeout 30;\nretry 2;\n"
            )
        } else {
            format!(
                "send host-name \"{hostname}\";\nrequest subnet-mask, broadcast-address, routers, domain-name, domain-name-servers, interface-mtu;\ntimeout 30;\nretry 2;\n"
            )
        };
        std::fs::write(dir.path().join("dhclient.conf"), conf)?;
        std::fs::write(
            dir.path().join("dhcpcd.conf"),
            format!(
                "hostname {hostname}\noption domain_name_servers, domain_name, routers, interface_mtu\noption dhcp6_name_servers, dhcp6_domain_search\n"
            ),
        )?;
        for sub in ["run", "db", "network"] {
            std::fs::create_dir_all(dir.path().join(sub))?;
        }
        std::fs::write(
            dir.path().join("network").join("eth0.network"),
            format!(
                "[Match]\nName=eth0\n\n[Network]\nDHCP=yes\nIPv6AcceptRA=yes\n\n[DHCPv4]\nHostname={hostname}\n\n[DHCPv6]\nUseDomains=yes\n\n[IPv6AcceptRA]\nUseDomains=yes\n"
            ),
        )?;
        Ok(Self {
            ns,
            mac,
            kind,
            hostname: hostname.to_owned(),
            dir,
            client: None,
        })
    }

    /// dhclient's family flag.
    const fn family(&self) -> &'static str {
        match self.kind {
            DhcpClient::Dhclient6 => "-6",
            _ => "-4",
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn events_file(&self) -> PathBuf {
        self.dir.path().join("events")
    }

    /// Starts the client in the foreground (it keeps running, renewing its lease, until
    /// stopped). After a stop, starting again is a client restart: dhclient then reboots
    /// with its saved lease (INIT-REBOOT), udhcpc asks for its previous address.
    ///
    /// # Errors
    /// It is running already, or cannot start.
    pub fn start(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.client.is_none(), "the DHCP client is running");
        let (program, args): (&str, Vec<String>) = match self.kind {
            DhcpClient::Udhcpc => {
                let mut args: Vec<String> = [
                    "udhcpc", "-f", "-i", "eth0", "-t", "20", "-T", "1", "-A", "1", "-O", "mtu",
                    "-x",
                ]
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
                args.push(format!("hostname:{}", self.hostname));
                args.push("-s".into());
                args.push(self.path("udhcpc.sh"));
                if let Some(ip) = self.last_address() {
                    args.push("-r".into());
                    args.push(ip.to_string());
                }
                ("busybox", args)
            }
            // Their commands are made below.
            DhcpClient::Dhcpcd => ("dhcpcd", Vec::new()),
            DhcpClient::Networkd => ("systemd-networkd", Vec::new()),
            DhcpClient::Dhclient | DhcpClient::Dhclient6 => (
                "dhclient",
                vec![
                    "-d".into(),
                    self.family().into(),
                    "-cf".into(),
                    self.path("dhclient.conf"),
                    "-sf".into(),
                    self.path("dhclient.sh"),
                    "-lf".into(),
                    self.path("dhclient.leases"),
                    "-pf".into(),
                    self.path("dhclient.pid"),
                    "eth0".into(),
                ],
            ),
        };
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = self.ns.command(program, &refs);
        if self.kind == DhcpClient::Dhcpcd {
            // `ip netns exec` runs it in a mount namespace of its own (no propagation back):
            // dhcpcd's run and state directories are this host's scratch ones.
            let script = format!(
                "mkdir -p /run/dhcpcd /var/lib/dhcpcd && mount --bind {} /run/dhcpcd && mount --bind {} /var/lib/dhcpcd && exec dhcpcd -B -d -f {} -c {} eth0",
                self.path("run"),
                self.path("db"),
                self.path("dhcpcd.conf"),
                self.path("dhcpcd.sh"),
            );
            // And in a PID namespace of its own, so that its privilege-separated helpers end
            // with it, whatever ends it (`--kill-child`: with `unshare` too).
            let args = ["--pid", "--fork", "--kill-child", "sh", "-c", &script];
            cmd = self.ns.command("unshare", &args);
        }
        if self.kind == DhcpClient::Networkd {
            // networkd drops its privileges, which clears its parent-death signal: a shell is
            // the namespace's first process, whose end (by `--kill-child`, or by SIGTERM,
            // passed on) ends every process in it. A read-only /sys tells networkd there is
            // no udev to wait for.
            let script = format!(
                "mount -o remount,ro /sys && mount -t tmpfs none /run/systemd && mkdir -p /run/systemd/netif/links /run/systemd/netif/leases /run/systemd/netif/lldp && chown -R systemd-network /run/systemd/netif && mount --bind {} /etc/systemd/network && {{ /lib/systemd/systemd-networkd & }} && trap 'kill $!; wait; exit 0' TERM && wait",
                self.path("network"),
            );
            let args = ["--pid", "--fork", "--kill-child", "sh", "-c", &script];
            cmd = self.ns.command("unshare", &args);
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {program} in {}", self.ns.name()))?;
        self.client = Some(Proc::from_child(child, program));
        Ok(())
    }

    /// Every event so far, oldest first.
    pub fn events(&self) -> Vec<Event> {
        std::fs::read_to_string(self.events_file())
            .unwrap_or_default()
            .lines()
            .map(|line| {
                let mut vars: HashMap<String, String> = line
                    .split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                let reason = vars.remove("reason").unwrap_or_default();
                Event { reason, vars }
            })
            .collect()
    }

    /// Waits until there are `n` events with one of `reasons`; returns the last of them.
    ///
    /// # Errors
    /// They do not come within `within`.
    pub fn wait_for(&self, reasons: &[&str], n: usize, within: Duration) -> anyhow::Result<Event> {
        let matching = || -> Vec<Event> {
            self.events()
                .into_iter()
                .filter(|e| reasons.contains(&e.reason.as_str()))
                .collect()
        };
        wait_until(within, &format!("{n} {reasons:?} event(s)"), || {
            matching().len() >= n
        })
        .map_err(|e| anyhow::anyhow!("{e}; events so far: {:?}", self.events()))?;
        matching().pop().context("no event")
    }

    /// Asks for a renewal now ([`DhcpHost::renew`]) and waits up to `within` for the lease
    /// it brings; returns its address.
    ///
    /// # Errors
    /// The client cannot be asked, or no lease comes in time (the events so far are in the
    /// error).
    pub fn renewed(&self, within: Duration) -> anyhow::Result<String> {
        let leased = ["renew", "bound"];
        let before = self
            .events()
            .iter()
            .filter(|e| leased.contains(&e.reason.as_str()))
            .count();
        self.renew()?;
        let ev = self.wait_for(&leased, before + 1, within)?;
        Ok(ev.get("ip").to_owned())
    }

    /// The address of the last lease the client got, from its events.
    pub fn last_address(&self) -> Option<Ipv4Addr> {
        self.events()
            .iter()
            .rev()
            .find(|e| !e.get("ip").is_empty())
            .and_then(|e| e.get("ip").parse().ok())
    }

    fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.client_pid()?;
        crate::sh("kill", &[&format!("-{signal}"), &pid.to_string()])?;
        Ok(())
    }

    /// The client's own process: for dhcpcd, the one `unshare` started (which itself
    /// ignores SIGTERM and SIGINT, and ends with it).
    fn client_pid(&self) -> anyhow::Result<u32> {
        let pid = self.client.as_ref().context("not running")?.pid();
        if !matches!(self.kind, DhcpClient::Dhcpcd | DhcpClient::Networkd) {
            return Ok(pid);
        }
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
        children
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
            .context("dhcpcd has not started")
    }

    /// Asks the client to renew now (udhcpc only: SIGUSR1; dhclient renews at T1 by itself).
    ///
    /// # Errors
    /// It is not udhcpc, or not running.
    pub fn renew(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.kind == DhcpClient::Udhcpc,
            "only udhcpc renews on demand"
        );
        self.signal("USR1")
    }

    /// Gives the lease back (DHCPRELEASE) and stops the client.
    ///
    /// # Errors
    /// The release command fails.
    pub fn release(&mut self) -> anyhow::Result<()> {
        match self.kind {
            DhcpClient::Udhcpc => {
                let before = self.count("deconfig");
                self.signal("USR2")?;
                self.wait_for(&["deconfig"], before + 1, Duration::from_secs(5))?;
                self.stop()
            }
            DhcpClient::Networkd => bail!("networkd releases nothing on demand"),
            DhcpClient::Dhcpcd => {
                // SIGHUP: dhcpcd releases its leases and exits.
                self.signal("HUP")?;
                if let Some(p) = self.client.take() {
                    let _ = p.wait(Duration::from_secs(5));
                }
                Ok(())
            }
            DhcpClient::Dhclient | DhcpClient::Dhclient6 => {
                // `dhclient -r` signals the running one through the pid file and releases.
                let args = [
                    "-r",
                    self.family(),
                    "-cf",
                    &self.path("dhclient.conf"),
                    "-sf",
                    &self.path("dhclient.sh"),
                    "-lf",
                    &self.path("dhclient.leases"),
                    "-pf",
                    &self.path("dhclient.pid"),
                    "eth0",
                ]
                .map(str::to_owned);
                let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                let out = self.ns.command("dhclient", &refs).output()?;
                if !out.status.success() {
                    bail!("dhclient -r: {}", String::from_utf8_lossy(&out.stderr));
                }
                if let Some(p) = self.client.take() {
                    // Already ended by `dhclient -r`; reaped here.
                    let _ = p.wait(Duration::from_secs(5));
                }
                Ok(())
            }
        }
    }

    fn count(&self, reason: &str) -> usize {
        self.events().iter().filter(|e| e.reason == reason).count()
    }

    /// Stops the client without releasing its lease (SIGTERM), as a reboot would.
    ///
    /// # Errors
    /// It does not exit.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if matches!(self.kind, DhcpClient::Dhcpcd | DhcpClient::Networkd) && self.client.is_some() {
            // Ends `unshare`, which waits for it.
            self.signal("TERM")?;
        }
        if let Some(p) = self.client.take() {
            p.stop("TERM", Duration::from_secs(5))?;
        }
        Ok(())
    }

    /// systemd-networkd's state of `eth0` (its `/run/systemd/netif/links` file: `DNS=`,
    /// `DOMAINS=`, ...), empty while it has none.
    pub fn networkd_state(&self) -> String {
        let (Ok(pid), Ok(index)) = (
            self.client_pid(),
            self.ns.exec_output("cat", &["/sys/class/net/eth0/ifindex"]),
        ) else {
            return String::new();
        };
        let index = String::from_utf8_lossy(&index.stdout).trim().to_owned();
        let file = format!("/run/systemd/netif/links/{index}");
        std::process::Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-m", "cat", &file])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The IPv4 address on `eth0`, as the kernel has it.
    pub fn address(&self) -> Option<(Ipv4Addr, u8)> {
        self.ns.ipv4_address("eth0")
    }

    /// The default route's gateway.
    pub fn default_route(&self) -> Option<Ipv4Addr> {
        self.ns.default_route()
    }

    /// `eth0`'s MTU.
    pub fn mtu(&self) -> Option<u32> {
        let out = self.ns.ip(&["-o", "link", "show", "dev", "eth0"]).ok()?;
        out.split_whitespace()
            .skip_while(|w| *w != "mtu")
            .nth(1)?
            .parse()
            .ok()
    }
}

/// The crowd's hook script: records the address of each `bound`, nothing else (the devices
/// are counted, not used: the address is never put on the interface).
const CROWD_SCRIPT: &str =
    "#!/bin/sh\n[ \"$1\" = bound ] && echo \"$ip\" > \"$EVENTS_DIR/$interface\"\nexit 0\n";

/// Many DHCP devices behind one port of a LAN: one namespace whose `eth0` is plugged into
/// the LAN, and on it a macvlan interface per device (`d0`, `d1`, ...: its own MAC,
/// `02:cd:00:00:<i>`), each asking with a one-shot busybox udhcpc (`-q`: it quits once
/// bound).
#[derive(Debug)]
pub struct Crowd {
    /// Its namespace.
    pub ns: Netns,
    /// Each device's MAC.
    pub macs: Vec<String>,
    dir: TempDir,
}

impl Crowd {
    /// `n` devices (at most 65,536) on `ns`'s `eth0` (plugged into a LAN already).
    ///
    /// # Errors
    /// `ip` failing, or the scratch directory.
    pub fn new(ns: Netns, n: u16) -> anyhow::Result<Self> {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = TempDir::new("crowd")?;
        let script = dir.path().join("udhcpc.sh");
        std::fs::write(&script, CROWD_SCRIPT)?;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
        std::fs::create_dir_all(dir.path().join("events"))?;
        let mut macs = Vec::new();
        for i in 0..n {
            let [hi, lo] = i.to_be_bytes();
            let mac = format!("02:cd:00:00:{hi:02x}:{lo:02x}");
            let name = format!("d{i}");
            ns.ip(&[
                "link", "add", "link", "eth0", "name", &name, "address", &mac, "type", "macvlan",
                "mode", "bridge",
            ])?;
            ns.ip(&["link", "set", "dev", &name, "up"])?;
            macs.push(mac);
        }
        Ok(Self { ns, macs, dir })
    }

    /// Each device asks for an address (`previous[i]`, if given, as a device back after a
    /// restart asks for its own), `at_once` of them at a time, each for up to 15 s; returns
    /// what each got (none: no lease).
    ///
    /// # Errors
    /// A client cannot be started.
    pub fn lease(
        &self,
        previous: Option<&[Option<Ipv4Addr>]>,
        at_once: usize,
    ) -> anyhow::Result<Vec<Option<Ipv4Addr>>> {
        let events = self.dir.path().join("events");
        let script = self.dir.path().join("udhcpc.sh").display().to_string();
        for entry in std::fs::read_dir(&events)? {
            std::fs::remove_file(entry?.path())?;
        }
        let indices: Vec<usize> = (0..self.macs.len()).collect();
        for batch in indices.chunks(at_once.max(1)) {
            let mut clients = Vec::new();
            for &i in batch {
                let name = format!("d{i}");
                let host = format!("hostname:crowd{i}");
                let mut args = vec![
                    "udhcpc", "-f", "-q", "-n", "-i", &name, "-t", "10", "-T", "1", "-A", "1",
                    "-x", &host, "-s", &script,
                ];
                let asked = previous.and_then(|p| p.get(i).copied().flatten());
                let asked = asked.map(|ip| ip.to_string());
                if let Some(ip) = &asked {
                    args.extend(["-r", ip.as_str()]);
                }
                let child = self
                    .ns
                    .command("busybox", &args)
                    .env("EVENTS_DIR", &events)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .with_context(|| format!("starting udhcpc on {name}"))?;
                clients.push(Proc::from_child(child, "udhcpc"));
            }
            for c in clients {
                // A client that got nothing in its time is ended; it counts as no lease.
                let _ = c.wait(Duration::from_secs(15));
            }
        }
        Ok((0..self.macs.len())
            .map(|i| {
                std::fs::read_to_string(events.join(format!("d{i}")))
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
            })
            .collect())
    }
}

/// A DNS answer as `dig` printed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dig {
    /// The response code (`NOERROR`, `NXDOMAIN`, `REFUSED`, ...).
    pub status: String,
    /// The header flags (`qr`, `aa`, `rd`, `ra`, `tc`).
    pub flags: Vec<String>,
    /// The answer section's data, in order (addresses, names).
    pub answers: Vec<String>,
}

/// Asks `server` about `name`/`qtype` with `dig` from `ns` (one try, three seconds).
///
/// # Errors
/// dig cannot run or got no answer at all.
pub fn dig(ns: &Netns, server: Ipv4Addr, name: &str, qtype: &str) -> anyhow::Result<Dig> {
    let at = format!("@{server}");
    let out = ns.exec_output("dig", &["+tries=1", "+time=3", &at, name, qtype])?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = text
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .with_context(|| format!("dig {name} {qtype} got no answer:\n{text}"))?
        .to_owned();
    let flags = text
        .split("flags: ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let answers = text
        .split(";; ANSWER SECTION:\n")
        .nth(1)
        .map(|s| {
            s.lines()
                .take_while(|l| !l.trim().is_empty())
                .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    Ok(Dig {
        status,
        flags,
        answers,
    })
}

/// The address `ns`'s `eth0` made for itself by SLAAC in the /64 whose text starts with
/// `prefix` (say `fd7a:0:1:100:`), once its duplicate address detection is done; waited for
/// up to `within`.
///
/// # Errors
/// None came within `within` (the error shows the interface's addresses).
pub fn slaac_address(
    ns: &Netns,
    prefix: &str,
    within: Duration,
) -> anyhow::Result<std::net::Ipv6Addr> {
    let show = || {
        ns.exec_output(
            "ip",
            &["-6", "-o", "addr", "show", "dev", "eth0", "scope", "global"],
        )
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
    };
    let found = |text: &str| {
        text.lines()
            .filter(|l| !l.contains("tentative"))
            .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet6").nth(1))
            .filter_map(|a| a.split('/').next())
            .find(|a| a.starts_with(prefix))
            .and_then(|a| a.parse().ok())
    };
    let mut text = String::new();
    let got = wait_until(within, "a SLAAC address", || {
        text = show();
        found(&text).is_some()
    });
    got.with_context(|| format!("eth0's addresses: {text}"))?;
    found(&text).context("gone")
}

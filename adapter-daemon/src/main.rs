//! `cyphonic-adapter`: the gateway appliance. Puts the devices on its LAN port onto the
//! encrypted overlay: the engine with a LAN edge, run by the daemon core it shares with the
//! node. This file only wires things: the command line, the configuration, the edge.
#![forbid(unsafe_code)]
// A command-line program: printing to stdout is its job; and a binary exports nothing, so
// `pub` inside it marks what the modules share, not an API.
#![allow(clippy::print_stdout, unreachable_pub)]

mod capture;
mod config;
mod counters;
mod dhcp;
mod edge;
mod gateway;
mod ha;
#[cfg(test)]
mod inprocess;
mod lan;
mod lan_sink;
mod leases;
mod meter;
mod names;
mod neighbors;
mod port_guard;
mod services;
mod status;
mod steer;

use std::fmt::Write as _;
use std::process::ExitCode;

use cyphonic_daemon::cli::{EdgeText, Extra, Names, Reread};
use cyphonic_settings::Identity;

use crate::config::AdapterConfig;
use crate::edge::AdapterEdge;
use crate::status::AdapterDocument;

fn main() -> ExitCode {
    cyphonic_daemon::cli::main(&NAMES, config::load, describe, run, status_text)
}

fn describe(c: &AdapterConfig, id: &Identity) -> String {
    let ha = c.ha.map_or_else(String::new, |h| {
        format!(
            ", one of an HA pair (priority {}{})",
            h.priority,
            if h.preempt { ", preempt" } else { "" }
        )
    });
    format!(
        "{}: OK: adapter {} on {}, LAN block {} (gateway {}), {} reservation(s), {} static peer(s){ha}",
        c.common.path.display(),
        id.certificate().body().name,
        c.lan_interface,
        c.lan_block(),
        c.gateway_vip,
        c.reservations.len(),
        c.common.peers.len()
    )
}

fn run(c: &AdapterConfig, identity: Identity, reread: Reread<AdapterConfig>) -> anyhow::Result<()> {
    let reload =
        cyphonic_daemon::cli::reloader(c.clone(), reread, AdapterConfig::needs_restart, |c| {
            (c.common, c.reservations)
        });
    // One of a pair: nothing is served until the pair makes this box the active one; the
    // pair's thread goes on once the edge captures (it announces the gateway then).
    let (edge, _ha) = match &c.ha {
        Some(settings) => {
            let active = ha::stand_by(c, settings, &identity)?;
            let (floor, status) = (active.other_clock(), active.status());
            let edge =
                AdapterEdge::open(c)?.in_pair(floor, status, (active.ready(), active.link()));
            let mandate = edge.mandate();
            (edge, Some(ha::serve(active, mandate)?))
        }
        None => (AdapterEdge::open(c)?, None),
    };
    cyphonic_daemon::run(&c.common, identity, edge, reload)
}

/// The adapter's lines of the status table: its head line, and its devices, DHCP and DNS.
fn status_text(doc: &AdapterDocument) -> EdgeText {
    let a = &doc.edge.adapter;
    let mut head = format!(
        "adapter {}  lan {} ({}, gateway {} at {})  listen {}  up {} s",
        a.name, a.lan_interface, a.lan_block, a.gateway_vip, a.gateway_mac, a.listen, a.uptime_secs
    );
    if let Some(h) = &doc.edge.ha {
        let other = h.other.as_ref().map_or_else(
            || "the other box never heard".to_owned(),
            |o| {
                format!(
                    "the other box {} {} ({} ms ago{})",
                    o.mac,
                    o.role,
                    o.heard_ms_ago,
                    if o.in_contact { "" } else { ", out of contact" }
                )
            },
        );
        let _ = write!(
            head,
            "\nha: {} in term {} ({}), well: {}; {other}",
            h.role,
            h.term,
            h.reason,
            h.health.join(" ")
        );
        if let Some(r) = &h.replication {
            let _ = match r.behind {
                Some(0) => write!(head, "; it holds every lease"),
                Some(n) => write!(head, "; it lacks {n} lease changes ({} ms)", r.lag_ms),
                None => write!(
                    head,
                    "; it holds none of this box's leases yet ({} ms)",
                    r.lag_ms
                ),
            };
        }
    }
    let mut t = String::from("\n");
    let now = cyphonic_settings::now_secs();
    let _ = writeln!(t, "{:<16} {:<18} {:<21} NAME", "DEVICE VIP", "MAC", "LEASE");
    for l in &doc.edge.leases {
        let lease = if let (Some(own), true) = (&l.legacy, l.learned) {
            format!("learned {own}")
        } else if let Some(own) = &l.legacy {
            format!("fixed {own}")
        } else if l.reserved {
            "reserved".to_owned()
        } else if let Some(t) = l.expires {
            format!("{} s left", t.saturating_sub(now))
        } else {
            "-".to_owned()
        };
        let name = l.name.as_deref().unwrap_or("-");
        let name = match l.vlan {
            Some(tag) => format!("{name} (vlan {tag})"),
            None => name.to_owned(),
        };
        let _ = writeln!(t, "{:<16} {:<18} {lease:<21} {name}", l.vip, l.mac);
    }
    // Devices with IPv6 only: their address where the others' lease is.
    for d in &doc.edge.devices6 {
        let name = d.name.as_deref().unwrap_or("-");
        let _ = writeln!(t, "{:<16} {:<18} {:<21} {name}", "-", d.mac, d.vip6);
    }
    let vlans = doc.edge.vlans.iter().map(|v| {
        (
            format!("vlan {}: {} gateway {}, dhcp", v.tag, v.block, v.gateway),
            v.dhcp.as_ref(),
        )
    });
    for (what, dhcp) in std::iter::once(("dhcp:".to_owned(), doc.edge.dhcp.as_ref())).chain(vlans) {
        let Some(d) = dhcp else {
            continue;
        };
        let s = &d.stats;
        let _ = writeln!(
            t,
            "{what} pool {}  discovers {}  offers {}  acks {}  naks {}  ignored {}  starvation_refused {}  pool_exhausted {}{}",
            d.pool,
            s.discovers,
            s.offers,
            s.acks,
            s.naks,
            s.ignored,
            s.starvation_refused,
            s.pool_exhausted,
            if d.unsaved {
                "  LEASES NOT SAVED (see the log)"
            } else {
                ""
            }
        );
    }
    let vlans6 = doc.edge.vlans.iter().map(|v| {
        (
            format!(
                "vlan {}: {} dhcp6",
                v.tag,
                v.block6.as_deref().unwrap_or("")
            ),
            v.dhcp6.as_ref(),
        )
    });
    for (what, dhcp6) in
        std::iter::once(("dhcp6:".to_owned(), doc.edge.dhcp6.as_ref())).chain(vlans6)
    {
        let Some(d) = dhcp6 else {
            continue;
        };
        let s = &d.stats;
        let _ = writeln!(
            t,
            "{what} pool {}  bindings {}  solicits {}  requests {}  replies {}  ignored {}  starvation_refused {}  pool_exhausted {}",
            d.pool,
            d.bindings,
            s.solicits,
            s.requests,
            s.replies,
            s.ignored,
            s.starvation_refused,
            s.pool_exhausted,
        );
    }
    if let Some(d) = &doc.edge.dns {
        let _ = writeln!(t, "dns: {}", d.text());
    }
    EdgeText { head, sections: t }
}

/// The program's name, as its command line, logs and metrics give it.
const PROGRAM: &str = "cyphonic-adapter";

/// What the command line says.
const NAMES: Names = Names {
    name: PROGRAM,
    about: "Puts the devices on this gateway's LAN port onto the cyphonic overlay",
    shows: "peers, leases and counters",
    socket: "/run/cyphonic/adapter.sock",
    config: "/etc/cyphonic/adapter.toml",
    extra: &[Extra {
        name: ha::HANDOVER,
        about: "Hand the gateway to the other box of the HA pair ([ha]) once its tunnels are up: for an upgrade, hand over, upgrade, hand back",
        run: ha::ask_handover,
    }],
};

#[cfg(test)]
mod tests {
    /// docs/cli/adapter.md is the command line clap parses.
    #[test]
    fn the_command_line_reference_is_current() {
        let command = cyphonic_daemon::cli::command(&super::NAMES);
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli/adapter.md");
        assert_eq!(
            cyphonic_settings::ensure_file(&path, &clap_markdown::help_markdown_command(&command)),
            Ok(())
        );
    }

    /// The scripts that ship beside the adapter (the image's first-boot step, the package's
    /// prerm) call it with command lines it parses: the first-boot step once passed the
    /// file where `check-config -c FILE` was asked, and every card's configuration was
    /// refused.
    #[test]
    fn the_shipped_scripts_call_command_lines_it_parses() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut calls = Vec::new();
        for script in ["config/image/firstboot", "config/debian/program.prerm"] {
            let text = std::fs::read_to_string(root.join(script)).unwrap();
            for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
                let Some(at) = line.find("/usr/bin/cyphonic-adapter ") else {
                    continue;
                };
                // The words up to a redirection or the shell's next word.
                let call: Vec<String> = line[at..]
                    .split_whitespace()
                    .take_while(|w| !w.contains('>') && !["||", "&&", ";", "then"].contains(w))
                    .map(|w| {
                        w.trim_matches('"')
                            .replace("$new", "/etc/cyphonic/adapter.toml")
                    })
                    .collect();
                calls.push((script, call));
            }
        }
        assert_eq!(calls.len(), 2, "{calls:?}");
        for (script, call) in calls {
            let parsed = cyphonic_daemon::cli::command(&super::NAMES).try_get_matches_from(&call);
            assert!(
                parsed.is_ok(),
                "{script}: {call:?}: {}",
                parsed.unwrap_err()
            );
        }
    }
}

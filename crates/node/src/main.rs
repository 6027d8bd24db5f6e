//! `cyphonic-node`: the overlay client for a host that can run it (the papers'
//! CYPHONIC node). A TUN interface (or, with `[userspace]`, a TCP/IP stack in the process
//! behind a SOCKS5 proxy and forwards) carries the host's overlay traffic through the same
//! engine the adapter uses, run by the same daemon core. This file only wires things: the
//! command line, the configuration, the edge.
#![forbid(unsafe_code)]
// A command-line program: printing to stdout is its job; and a binary exports nothing, so
// `pub` inside it marks what the modules share, not an API.
#![allow(clippy::print_stdout, unreachable_pub)]

mod config;
mod dns;
mod edge;
#[cfg(test)]
mod inprocess;
mod overlay;
mod tun;
mod userspace;

use std::process::ExitCode;

use cyphonic_daemon::cli::{EdgeText, Names, Reread};

use crate::config::NodeConfig;
use crate::edge::{NodeDocument, NodeEdge};

fn main() -> ExitCode {
    cyphonic_daemon::cli::main(&NAMES, config::load, describe, run, status_text)
}

fn describe(c: &NodeConfig, id: &cyphonic_settings::Identity) -> String {
    let on = match &c.userspace {
        Some(u) => format!(
            "userspace (SOCKS5 {}, {} forward(s))",
            u.socks5.map_or_else(|| "off".to_owned(), |a| a.to_string()),
            u.forwards.len()
        ),
        None => c.interface.clone(),
    };
    format!(
        "{}: OK: node {} at {} on {on}, {} static peer(s){}",
        c.common.path.display(),
        id.certificate().body().name,
        c.vip,
        c.common.peers.len(),
        if c.common.cloud.is_some() {
            ", cloud"
        } else {
            ""
        }
    )
}

fn run(
    c: &NodeConfig,
    identity: cyphonic_settings::Identity,
    reread: Reread<NodeConfig>,
) -> anyhow::Result<()> {
    let reload =
        cyphonic_daemon::cli::reloader(c.clone(), reread, NodeConfig::needs_restart, |c| {
            (c.common, ())
        });
    cyphonic_daemon::run(&c.common, identity, NodeEdge::open(c)?, reload)
}

/// The node's lines of the status table: its head line, and its DNS stub.
fn status_text(doc: &NodeDocument) -> EdgeText {
    let n = &doc.edge.node;
    EdgeText {
        head: format!(
            "node {}  {} on {}  listen {}  up {} s",
            n.name, n.vip, n.interface, n.listen, n.uptime_secs
        ),
        sections: doc.edge.dns.as_ref().map_or_else(String::new, |d| {
            format!(
                "\ndns {}: {}\n",
                d.listen.as_deref().unwrap_or("?"),
                d.text()
            )
        }),
    }
}

/// The program's name, as its command line, logs and metrics give it.
const PROGRAM: &str = "cyphonic-node";

/// What the command line says.
const NAMES: Names = Names {
    name: PROGRAM,
    about: "Puts this host onto the cyphonic overlay: a TUN interface, or a SOCKS5 proxy and forwards without privileges",
    shows: "peers and counters",
    socket: "/run/cyphonic/node.sock",
    config: "/etc/cyphonic/node.toml",
    extra: &[],
};

#[cfg(test)]
mod tests {
    /// docs/cli/node.md is the command line clap parses.
    #[test]
    fn the_command_line_reference_is_current() {
        let command = cyphonic_daemon::cli::command(&super::NAMES);
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli/node.md");
        assert_eq!(
            cyphonic_settings::ensure_file(&path, &clap_markdown::help_markdown_command(&command)),
            Ok(())
        );
    }
}

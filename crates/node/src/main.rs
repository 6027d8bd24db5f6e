//! `cyphonic-node`: the overlay client for a host that can run it (design.md §1; the papers'
//! CYPHONIC node). A TUN interface carries the host's overlay traffic through the same
//! engine the adapter uses. This file only wires things: command line, configuration,
//! logging.
#![forbid(unsafe_code)]
// A command-line program: printing to stdout is its job; and a binary exports nothing, so
// `pub` inside it marks what the modules share, not an API.
#![allow(clippy::print_stdout, unreachable_pub)]

mod config;
mod daemon;
mod dns;
mod edge;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cyphonic_telemetry::logging::Format as LogFormat;

#[derive(Parser)]
#[command(
    name = "cyphonic-node",
    version,
    about = "Puts this host onto the cyphonic overlay through a TUN interface"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node.
    Run {
        /// The configuration file (see config/node.example.toml).
        #[arg(long, short)]
        config: PathBuf,
        /// Log format.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// Check a configuration file (and the certificates and keys it names) and exit.
    CheckConfig {
        /// The configuration file.
        config: PathBuf,
    },
    /// Show the running node's peers and counters.
    Status {
        /// The status socket of the running node.
        #[arg(long, default_value = "/run/cyphonic/node.sock")]
        socket: PathBuf,
        /// Print the raw JSON document.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Run { config, log_format } => {
            cyphonic_telemetry::logging::init(log_format);
            config::load(&config, cyphonic_settings::now_secs())
                .map_err(anyhow::Error::from)
                .and_then(|(c, id)| daemon::run(&c, id))
        }
        Command::CheckConfig { config } => config::load(&config, cyphonic_settings::now_secs())
            .map(|(c, id)| {
                println!(
                    "{}: OK: node {} at {} on {}, {} static peer(s){}",
                    c.path.display(),
                    id.certificate().body().name,
                    c.vip,
                    c.interface,
                    c.peers.len(),
                    if c.cloud.is_some() { ", cloud" } else { "" }
                );
            })
            .map_err(anyhow::Error::from),
        Command::Status { socket, json } => {
            cyphonic_telemetry::status::show(&socket, "cyphonic-node", json, print_status)
                .map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cyphonic-node: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn print_status(doc: &serde_json::Value) {
    let n = &doc["node"];
    println!(
        "node {}  {} on {}  listen {}  up {} s",
        n["name"].as_str().unwrap_or("?"),
        n["vip"].as_str().unwrap_or("?"),
        n["interface"].as_str().unwrap_or("?"),
        n["listen"].as_str().unwrap_or("?"),
        n["uptime_secs"]
    );
    print!("{}", cyphonic_tunnel::status::peers_text(doc));
    let d = &doc["dns"];
    if d.is_object() {
        println!();
        println!(
            "dns {}: queries {}  authoritative {}  asked {}  nxdomain {}  refused {}  servfail {}  dropped {}",
            d["listen"].as_str().unwrap_or("?"),
            d["queries"],
            d["authoritative"],
            d["asked"],
            d["nxdomain"],
            d["refused"],
            d["servfail"],
            d["dropped"]
        );
    }
    println!();
    print!("{}", cyphonic_tunnel::status::counters_text(doc));
}

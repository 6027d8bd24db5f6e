//! `cyphonic-adapter`: the gateway appliance. Puts the devices on its LAN port onto the
//! encrypted overlay. This file only wires things: command line, configuration, logging.
#![forbid(unsafe_code)]
// A command-line program: printing to stdout is its job; and a binary exports nothing, so
// `pub` inside it marks what the modules share, not an API.
#![allow(clippy::print_stdout, unreachable_pub)]

mod config;
mod control;
mod counters;
mod daemon;
mod egress;
mod ingress;
mod lan_send;
mod leases;
mod metrics;
mod neighbors;
mod services;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cyphonic_telemetry::logging::Format as LogFormat;

#[derive(Parser)]
#[command(
    name = "cyphonic-adapter",
    version,
    about = "Puts the devices on this gateway's LAN port onto the cyphonic overlay"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the adapter.
    Run {
        /// The configuration file (see config/adapter.example.toml).
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
    /// Show the running adapter's peers, leases and counters.
    Status {
        /// The status socket of the running adapter.
        #[arg(long, default_value = "/run/cyphonic/adapter.sock")]
        socket: PathBuf,
        /// Print the raw JSON document.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { config, log_format } => {
            cyphonic_telemetry::logging::init(log_format);
            config::load(&config, cyphonic_settings::now_secs()).map_err(anyhow::Error::from).and_then(|(c, id)| daemon::run(&c, id))
        }
        Command::CheckConfig { config } => config::load(&config, cyphonic_settings::now_secs()).map(|(c, id)| {
            let body = id.certificate().body();
            println!(
                "{}: OK: adapter {} on {}, LAN block {} (gateway {}), {} reservation(s), {} static peer(s)",
                c.path.display(),
                body.name,
                c.lan_interface,
                c.lan_block,
                c.gateway_vip,
                c.reservations.len(),
                c.peers.len()
            );
        }).map_err(anyhow::Error::from),
        Command::Status { socket, json } => {
            cyphonic_telemetry::status::show(&socket, "cyphonic-adapter", json, print_status)
                .map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cyphonic-adapter: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn print_status(doc: &serde_json::Value) {
    let a = &doc["adapter"];
    println!(
        "adapter {}  lan {} ({}, gateway {})  listen {}  up {} s",
        a["name"].as_str().unwrap_or("?"),
        a["lan_interface"].as_str().unwrap_or("?"),
        a["lan_block"].as_str().unwrap_or("?"),
        a["gateway_vip"].as_str().unwrap_or("?"),
        a["listen"].as_str().unwrap_or("?"),
        a["uptime_secs"]
    );
    print!("{}", cyphonic_tunnel::status::peers_text(doc));
    println!();
    let now = cyphonic_settings::now_secs();
    println!("{:<16} {:<18} {:<12} NAME", "DEVICE VIP", "MAC", "LEASE");
    for l in doc["leases"].as_array().into_iter().flatten() {
        let lease = if l["reserved"].as_bool() == Some(true) {
            "reserved".to_owned()
        } else if let Some(t) = l["expires"].as_u64() {
            format!("{} s left", t.saturating_sub(now))
        } else {
            "-".to_owned()
        };
        println!(
            "{:<16} {:<18} {:<12} {}",
            l["vip"].as_str().unwrap_or("?"),
            l["mac"].as_str().unwrap_or("?"),
            lease,
            l["name"].as_str().unwrap_or("-")
        );
    }
    let d = &doc["dhcp"];
    if d.is_object() {
        println!(
            "dhcp: pool {}  discovers {}  offers {}  acks {}  naks {}  ignored {}  starvation_refused {}  pool_exhausted {}{}",
            d["pool"].as_str().unwrap_or("?"),
            d["discovers"],
            d["offers"],
            d["acks"],
            d["naks"],
            d["ignored"],
            d["starvation_refused"],
            d["pool_exhausted"],
            if d["unsaved"].as_bool() == Some(true) {
                "  LEASES NOT SAVED (see the log)"
            } else {
                ""
            }
        );
    }
    let d = &doc["dns"];
    if d.is_object() {
        println!(
            "dns: queries {}  authoritative {}  asked {}  nxdomain {}  refused {}  servfail {}  dropped {}",
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

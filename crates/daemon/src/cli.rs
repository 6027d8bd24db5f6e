//! The command line both tunnel ends share: `run --config FILE [--log-format FORMAT]`,
//! `check-config FILE`, `status [--socket PATH] [--json]`. Each binary describes itself in a
//! [`Program`] and hands it to [`main`]; its `main.rs` only wires.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use cyphonic_settings::{ConfigError, Identity};
use cyphonic_telemetry::logging::Format as LogFormat;
use serde::de::DeserializeOwned;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    Run {
        /// The configuration file.
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
    /// Show the running daemon's state.
    Status {
        /// The status socket of the running daemon.
        #[arg(long)]
        socket: PathBuf,
        /// Print the raw JSON document.
        #[arg(long)]
        json: bool,
    },
}

/// Reads and checks a configuration file at a unix time: the configuration and our identity.
pub type Load<C> = fn(&Path, u64) -> Result<(C, Identity), ConfigError>;

/// A tunnel end's program: what its command line says, and what each command does.
#[derive(Debug)]
pub struct Program<C, D> {
    /// The binary (`cyphonic-adapter`).
    pub name: &'static str,
    /// The daemon in a word, for help texts (`adapter`).
    pub noun: &'static str,
    /// What it does, one line.
    pub about: &'static str,
    /// What `status` shows (`peers, leases and counters`).
    pub shows: &'static str,
    /// The example configuration, named in `run --config`'s help.
    pub example: &'static str,
    /// The status socket's default path.
    pub socket: &'static str,
    /// Reads and checks a configuration at a unix time.
    pub load: Load<C>,
    /// `check-config`'s report of a good configuration.
    pub describe: fn(&C, &Identity) -> String,
    /// Runs the daemon.
    pub run: fn(&C, Identity) -> anyhow::Result<()>,
    /// Prints the status document as a table.
    pub print_status: fn(&D),
}

/// Parses the command line and runs the command; prints errors as `<name>: error: ...`.
#[expect(clippy::print_stdout, reason = "check-config's report")]
pub fn main<C, D: DeserializeOwned>(p: &Program<C, D>) -> ExitCode {
    let command = Cli::command()
        .name(p.name)
        .bin_name(p.name)
        .version(env!("CARGO_PKG_VERSION"))
        .about(p.about)
        .mut_subcommand("run", |s| {
            s.about(format!("Run the {}.", p.noun))
                .mut_arg("config", |a| {
                    a.help(format!("The configuration file (see {}).", p.example))
                })
        })
        .mut_subcommand("status", |s| {
            s.about(format!("Show the running {}'s {}.", p.noun, p.shows))
                .mut_arg("socket", |a| {
                    a.required(false)
                        .default_value(p.socket)
                        .help(format!("The status socket of the running {}.", p.noun))
                })
        });
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let now = cyphonic_settings::now_secs();
    let result = match cli.command {
        Command::Run { config, log_format } => {
            cyphonic_telemetry::logging::init(log_format);
            (p.load)(&config, now)
                .map_err(anyhow::Error::from)
                .and_then(|(c, id)| (p.run)(&c, id))
        }
        Command::CheckConfig { config } => (p.load)(&config, now)
            .map(|(c, id)| println!("{}", (p.describe)(&c, &id)))
            .map_err(anyhow::Error::from),
        Command::Status { socket, json } => {
            cyphonic_telemetry::status::show(&socket, p.name, json, p.print_status)
                .map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}: error: {e:#}", p.name);
            ExitCode::FAILURE
        }
    }
}

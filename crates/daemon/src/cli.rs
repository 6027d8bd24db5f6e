//! The command line both tunnel ends share: `run --config FILE [--log-format FORMAT]`,
//! `check-config FILE`, `status [--socket PATH] [--json]`. Each binary describes itself in a
//! [`Program`] and hands it to [`main`]; its `main.rs` only wires.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use cyphonic_settings::{ConfigError, Identity};
use cyphonic_telemetry::logging::Format as LogFormat;
use serde::Deserialize as _;
use serde::de::DeserializeOwned;

use crate::status::{Status, VERSION};

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

/// A tunnel end's program: what its command line says, and what each command does. `C` is its
/// configuration, `E` and `K` the edge's part of its status document and its counters.
#[derive(Debug)]
pub struct Program<C, E, K> {
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
    pub print_status: fn(&Status<E, K>),
}

/// Parses the command line and runs the command; prints errors as `<name>: error: ...`.
#[expect(clippy::print_stdout, reason = "check-config's report")]
pub fn main<C, E: DeserializeOwned, K: DeserializeOwned>(p: &Program<C, E, K>) -> ExitCode {
    let command = Cli::command()
        .name(p.name)
        .bin_name(p.name)
        .version(env!("CARGO_PKG_VERSION"))
        .about(p.about)
        .mut_subcommand("run", |s| {
            s.about(format!("Run the {}", p.noun))
                .mut_arg("config", |a| {
                    a.help(format!("The configuration file (see {})", p.example))
                })
        })
        .mut_subcommand("status", |s| {
            s.about(format!("Show the running {}'s {}", p.noun, p.shows))
                .mut_arg("socket", |a| {
                    a.required(false)
                        .default_value(p.socket)
                        .help(format!("The status socket of the running {}", p.noun))
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
        Command::Status { socket, json } => show_status(p, &socket, json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}: error: {e:#}", p.name);
            ExitCode::FAILURE
        }
    }
}

/// `status`: the running daemon's document as it came with `json`, else as a table, when it
/// is of the format this program reads.
#[expect(clippy::print_stdout, reason = "the status command's output")]
fn show_status<C, E: DeserializeOwned, K: DeserializeOwned>(
    p: &Program<C, E, K>,
    socket: &Path,
    json: bool,
) -> anyhow::Result<()> {
    let doc = cyphonic_telemetry::status::fetch(socket, p.name)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let version = doc.get("version").and_then(serde_json::Value::as_u64);
    if version != Some(u64::from(VERSION)) {
        anyhow::bail!(
            "the running {} writes status format {}, this command reads format {VERSION}: use `--json`, or the command of the running version",
            p.noun,
            version.map_or_else(|| "without a version".to_owned(), |v| v.to_string())
        );
    }
    let typed = Status::<E, K>::deserialize(&doc)
        .map_err(|e| anyhow::anyhow!("the {}'s status document does not read: {e}", p.noun))?;
    (p.print_status)(&typed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use serde::Deserialize;

    use super::*;
    use crate::status::{Buffers, CounterTable, Pipelines};

    cyphonic_telemetry::counters! {
        /// Test counters.
        pub struct TestCounters {
            /// Things.
            things,
        }
    }

    #[derive(Debug, serde::Serialize, Deserialize)]
    struct Edge {
        thing: String,
    }

    static PRINTED: AtomicU32 = AtomicU32::new(0);

    fn program() -> Program<(), Edge, TestCounters> {
        Program {
            name: "cyphonic-test",
            noun: "test",
            about: "",
            shows: "",
            example: "",
            socket: "",
            load: |path, now| {
                cyphonic_settings::load(path, now, |_: &serde::de::IgnoredAny, _| {
                    unreachable!("this test loads no configuration")
                })
            },
            describe: |(), _| String::new(),
            run: |(), _| Ok(()),
            print_status: |doc| {
                assert_eq!(doc.edge.thing, "x");
                PRINTED.fetch_add(1, Ordering::Relaxed);
            },
        }
    }

    /// The table is printed from a document of this format; another format is refused with a
    /// message that says which, and `--json` still shows it.
    #[test]
    fn status_reads_its_own_format_only() {
        let dir = std::env::temp_dir().join(format!("cyphonic-cli-{}", std::process::id()));
        let doc = |version: u32| {
            serde_json::to_value(Status {
                version,
                edge: Edge { thing: "x".into() },
                peers: Vec::new(),
                cloud: None,
                counters: CounterTable {
                    edge: TestCounters::default(),
                    engine: cyphonic_tunnel::EngineCounters::default(),
                },
                pipelines: Pipelines::default(),
                buffers: Buffers::default(),
            })
            .unwrap_or_default()
        };
        let (ours, newer) = (dir.join("ours.sock"), dir.join("newer.sock"));
        let _a = cyphonic_telemetry::status::serve(&ours, move || doc(VERSION)).unwrap();
        let _b = cyphonic_telemetry::status::serve(&newer, move || doc(VERSION + 1)).unwrap();
        let p = program();
        show_status(&p, &ours, false).unwrap();
        assert_eq!(PRINTED.load(Ordering::Relaxed), 1);
        let err = show_status(&p, &newer, false).unwrap_err().to_string();
        assert!(
            err.contains(&format!("writes status format {}", VERSION + 1)),
            "{err}"
        );
        show_status(&p, &newer, true).unwrap();
        assert_eq!(
            PRINTED.load(Ordering::Relaxed),
            1,
            "no table for another format"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

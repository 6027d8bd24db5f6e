//! The command line both tunnel ends share: `run [-c FILE] [--log-format FORMAT]`,
//! `enroll [-c FILE]`, `check-config [-c FILE] [--json]`, `policy [-c FILE] [--json] FROM TO
//! WHAT`, `status [--socket PATH] [--json]`, `completions SHELL`; the configuration file is
//! `/etc/cyphonic/<noun>.toml` unless `-c` names another. Each binary names itself in
//! [`Names`] and hands them, with its four functions, to [`main`]; its `main.rs` only wires.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use cyphonic_settings::{ConfigError, Identity};
use cyphonic_telemetry::CounterSet;
use cyphonic_telemetry::logging::Format as LogFormat;
use serde::Deserialize as _;
use serde::de::DeserializeOwned;

use crate::status::{Status, VERSION, counters_text, peers_text};

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
    /// Join the overlay with an enrollment token (`cyphonic-cloud token create`): make our
    /// Noise key (unless `[identity] key` exists), get our certificate from the cloud named
    /// in `[cloud]`, and write it and the CA bundle where `[identity]` says. Then `run`.
    Enroll {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// The token (default: `[identity] token`).
        #[arg(long)]
        token: Option<String>,
    },
    /// Check a configuration file (and the certificates and keys it names) as `run` would,
    /// and exit (exit status 0: good, 78: refused, with the file, line and key).
    CheckConfig {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Say it as JSON: `{"ok", "config", "summary"}` or `{"ok": false, "config",
        /// "error"}`.
        #[arg(long)]
        json: bool,
    },
    /// Answer from a configuration file's `[policy]` whether FROM may open WHAT to TO, and
    /// by which rule (exit status 0: allowed, 1: denied, 2: no answer, 78: the file is
    /// refused).
    Policy {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Say it as JSON: `{"allowed", "answer"}`.
        #[arg(long)]
        json: bool,
        /// Who opens: a device, a member or an address (one address).
        from: String,
        /// To whom: the same.
        to: String,
        /// What: tcp/PORT, udp/PORT or icmp.
        what: String,
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
    #[command(flatten)]
    Documentation(cyphonic_telemetry::manual::Commands),
}

/// Reads and checks a configuration file at a unix time: the configuration and our identity.
pub type Load<C> = fn(&Path, u64) -> Result<(C, Identity), ConfigError>;
/// `check-config`'s report of a good configuration.
pub type Describe<C> = fn(&C, &Identity) -> String;
/// Reads the configuration file `run` was started with again (SIGHUP), at the time of the call.
pub type Reread<C> = Box<dyn FnMut() -> Result<(C, Identity), ConfigError>>;
/// Runs the daemon.
pub type Run<C> = fn(&C, Identity, Reread<C>) -> anyhow::Result<()>;

/// The daemon core's [`crate::Reloader`] from a binary's `reread`: each of the binary's own
/// keys that differs from the configuration it `started` with (as `changed` lists them) is
/// named in the log as waiting for a restart; `split` parts the shared keys from what the
/// edge's services take.
pub fn reloader<C: 'static, R: 'static>(
    started: C,
    mut reread: Reread<C>,
    changed: fn(&C, &C) -> Vec<&'static str>,
    split: fn(C) -> (cyphonic_settings::Common, R),
) -> crate::Reloader<R> {
    Box::new(move || {
        let (new, identity) = reread()?;
        for key in changed(&started, &new) {
            tracing::warn!(key, "changed in the file: takes effect at the next restart");
        }
        let (common, edge) = split(new);
        Ok((common, identity, edge))
    })
}

/// The edge's lines of the `status` table: its head line, and its sections (each starting
/// with a blank line), printed after the peers and before the counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeText {
    /// The first line: what the daemon is and where.
    pub head: String,
    /// Its own tables.
    pub sections: String,
}

/// What a tunnel end's command line says. The rest follows from the binary's name
/// (`cyphonic-<noun>`): the help texts and the example configuration
/// (`config/<noun>.example.toml`).
#[derive(Debug, Clone, Copy)]
pub struct Names {
    /// The binary (`cyphonic-adapter`).
    pub name: &'static str,
    /// What it does, one line.
    pub about: &'static str,
    /// What `status` shows (`peers, leases and counters`).
    pub shows: &'static str,
    /// The status socket's default path.
    pub socket: &'static str,
    /// The configuration file's default path (`/etc/cyphonic/adapter.toml`), where the
    /// package puts it.
    pub config: &'static str,
    /// The binary's own commands to the running daemon, beside `status`.
    pub extra: &'static [Extra],
}

/// A binary's own command to its running daemon (`cyphonic-adapter handover`): it takes the
/// `--socket` that `status` takes (the status socket's path) and prints its own answer.
#[derive(Debug, Clone, Copy)]
pub struct Extra {
    /// The subcommand.
    pub name: &'static str,
    /// What it does, one line.
    pub about: &'static str,
    /// Runs it with the status socket's path.
    pub run: fn(&Path) -> anyhow::Result<()>,
}

impl Names {
    /// The daemon in a word (`adapter`).
    pub fn noun(&self) -> &'static str {
        self.name.strip_prefix("cyphonic-").unwrap_or(self.name)
    }
}

/// The command line of the program `names` describes, as clap parses it (and as
/// docs/cli/ shows it).
pub fn command(names: &Names) -> clap::Command {
    let noun = names.noun();
    let config = |s: clap::Command| {
        s.mut_arg("config", |a| {
            a.required(false).default_value(names.config).help(format!(
                "The configuration file (see config/{noun}.example.toml)"
            ))
        })
    };
    let mut command = Cli::command()
        .name(names.name)
        .bin_name(names.name)
        .version(env!("CARGO_PKG_VERSION"))
        .about(names.about)
        .mut_subcommand("run", |s| config(s.about(format!("Run the {noun}"))))
        .mut_subcommand("enroll", config)
        .mut_subcommand("check-config", config)
        .mut_subcommand("policy", config)
        .mut_subcommand("status", |s| {
            s.about(format!("Show the running {noun}'s {}", names.shows))
                .mut_arg("socket", |a| {
                    a.required(false)
                        .default_value(names.socket)
                        .help(format!("The status socket of the running {noun}"))
                })
        });
    for extra in names.extra {
        command = command.subcommand(
            clap::Command::new(extra.name).about(extra.about).arg(
                clap::Arg::new("socket")
                    .long("socket")
                    .value_parser(clap::value_parser!(PathBuf))
                    .default_value(names.socket)
                    .help(format!("The status socket of the running {noun}")),
            ),
        );
    }
    command
}

/// Parses the command line of the program `names` describes and runs the command: `load` reads
/// a configuration, `describe` reports a good one (`check-config`), `run` runs the daemon,
/// `status_text` gives the edge's lines of the status table. Errors print as
/// `<name>: error: ...`.
#[expect(clippy::print_stdout, reason = "check-config's report")]
pub fn main<
    C: AsRef<cyphonic_settings::Common> + 'static,
    E: DeserializeOwned,
    K: CounterSet + DeserializeOwned,
>(
    names: &Names,
    load: Load<C>,
    describe: Describe<C>,
    run: Run<C>,
    status_text: fn(&Status<E, K>) -> EdgeText,
) -> ExitCode {
    let matches = command(names).get_matches();
    if let Some((sub, args)) = matches.subcommand()
        && let Some(extra) = names.extra.iter().find(|e| e.name == sub)
    {
        let socket = args
            .get_one::<PathBuf>("socket")
            .cloned()
            .unwrap_or_else(|| PathBuf::from(names.socket));
        return match (extra.run)(&socket) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                cyphonic_telemetry::service::fatal(names.name, &e);
                ExitCode::FAILURE
            }
        };
    }
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let now = cyphonic_settings::now_secs();
    let agent = cyphonic_telemetry::build!(names.name).to_string();
    let result = match cli.command {
        Command::Run { config, log_format } => {
            cyphonic_telemetry::logging::init(log_format);
            let path = config.clone();
            let reread: Reread<C> = Box::new(move || load(&path, cyphonic_settings::now_secs()));
            // With `[identity] token` and no certificate yet: enroll first.
            let enrolled = crate::enroll::enroll(
                &config,
                names.noun(),
                None,
                crate::enroll::Existing::Keep,
                &agent,
                now,
            );
            match enrolled {
                // The file does not read: a configuration matter, as below.
                Err(e) if e.downcast_ref::<ConfigError>().is_some() => {
                    return cyphonic_telemetry::service::config_refused(
                        names.name,
                        &format!("{e:#}"),
                    );
                }
                Err(e) => Err(e),
                Ok(_) => match load(&config, cyphonic_settings::now_secs()) {
                    Ok((c, id)) => run(&c, id, reread),
                    Err(e) => return cyphonic_telemetry::service::config_refused(names.name, &e),
                },
            }
        }
        Command::Enroll { config, token } => {
            cyphonic_telemetry::logging::init(LogFormat::Text);
            crate::enroll::enroll(
                &config,
                names.noun(),
                token.as_deref(),
                crate::enroll::Existing::Refuse,
                &agent,
                now,
            )
            .map(|_| {
                println!(
                    "enrolled: start it with `{} run -c {}`",
                    names.name,
                    config.display()
                );
            })
        }
        Command::CheckConfig { config, json } => {
            let checked = match crate::enroll::pending(&config, names.noun(), now) {
                Ok(Some(waiting)) => Ok(waiting),
                Ok(None) => load(&config, now).map(|(c, id)| describe(&c, &id)),
                Err(e) => Err(e),
            };
            return cyphonic_telemetry::service::checked_config(
                names.name,
                &config,
                json,
                checked.map_err(|e| e.to_string()),
            );
        }
        Command::Status { socket, json } => show_status(names, status_text, &socket, json),
        Command::Policy {
            config,
            json,
            from,
            to,
            what,
        } => {
            let c = match load(&config, now) {
                Ok((c, _)) => c,
                Err(e) => return cyphonic_telemetry::service::config_refused(names.name, &e),
            };
            return cyphonic_telemetry::service::policy_answer(
                names.name,
                json,
                dry_run(c.as_ref(), &from, &to, &what).map_err(|e| format!("{e:#}")),
            );
        }
        Command::Documentation(d) => d.run(&mut command(names)).map_err(anyhow::Error::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            cyphonic_telemetry::service::fatal(names.name, &e);
            ExitCode::FAILURE
        }
    }
}

/// The policy's dry run: whether `from` may open `what` (`tcp/554`) to `to` under the
/// rules of `common`, and the answer in words.
///
/// # Errors
/// A name that is not one address, `what` that does not read.
pub fn dry_run(
    common: &cyphonic_settings::Common,
    from: &str,
    to: &str,
    what: &str,
) -> anyhow::Result<(bool, String)> {
    let one = |name: &str| -> anyhow::Result<std::net::IpAddr> {
        match common.policy_names.resolve(name).as_deref() {
            Some([net]) if net.prefix_len() == net.max_prefix_len() => Ok(net.addr()),
            Some(nets) if !nets.is_empty() => anyhow::bail!(
                "`{name}` stands for {}: give one device or address",
                nets.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some(_) => anyhow::bail!("`{name}` stands for no address (a revoked peer?)"),
            None => anyhow::bail!("`{name}` is not a device, a member or an address"),
        }
    };
    let (src, dst) = (one(from)?, one(to)?);
    let (number, port) = cyphonic_filter::parse_flow(what).map_err(anyhow::Error::msg)?;
    let flow = format!("{from} ({src}) opening {what} to {to} ({dst})");
    let Some(policy) = &common.policy else {
        return Ok((
            true,
            format!(
                "allowed: {flow}: no [policy] in this file, every flow between certified addresses passes"
            ),
        ));
    };
    Ok(match policy.rules.first_allowing(number, src, dst, port) {
        Some(rule) => (
            true,
            format!("allowed: {flow}, by rule {rule} ([[policy.rule]] number {rule} in the file)"),
        ),
        None => (
            false,
            format!(
                "denied: {flow}: no rule allows it (replies to flows {to} opens are another matter)"
            ),
        ),
    })
}

/// `status`: the running daemon's document as it came with `json`, else as a table, when it
/// is of the format this program reads.
#[expect(clippy::print_stdout, reason = "the status command's output")]
fn show_status<E: DeserializeOwned, K: CounterSet + DeserializeOwned>(
    names: &Names,
    status_text: fn(&Status<E, K>) -> EdgeText,
    socket: &Path,
    json: bool,
) -> anyhow::Result<()> {
    let doc = cyphonic_telemetry::status::fetch(socket, names.name)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let version = doc.get("version").and_then(serde_json::Value::as_u64);
    if version != Some(u64::from(VERSION)) {
        anyhow::bail!(
            "the running {} writes status format {}, this command reads format {VERSION}: use `--json`, or the command of the running version",
            names.noun(),
            version.map_or_else(|| "without a version".to_owned(), |v| v.to_string())
        );
    }
    let typed = Status::<E, K>::deserialize(&doc).map_err(|e| {
        anyhow::anyhow!("the {}'s status document does not read: {e}", names.noun())
    })?;
    print!("{}", table(&typed, &status_text(&typed)));
    Ok(())
}

/// The status table: the edge's head line, the peers, the edge's sections, the counters.
fn table<E, K: CounterSet>(doc: &Status<E, K>, edge: &EdgeText) -> String {
    let software = if doc.software.is_empty() {
        String::new()
    } else {
        format!("{}\n", doc.software)
    };
    format!(
        "{software}{}\n{}{}\n{}",
        edge.head,
        peers_text(doc),
        edge.sections,
        counters_text(doc)
    )
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

    const NAMES: Names = Names {
        name: "cyphonic-test",
        about: "",
        shows: "",
        socket: "",
        config: "/etc/cyphonic/test.toml",
        extra: &[],
    };

    fn status_text(doc: &Status<Edge, TestCounters>) -> EdgeText {
        PRINTED.fetch_add(1, Ordering::Relaxed);
        EdgeText {
            head: format!("test {}", doc.edge.thing),
            sections: "\nour section\n".into(),
        }
    }

    /// An empty status document of format `version`.
    fn status(version: u32) -> Status<Edge, TestCounters> {
        Status {
            version,
            edge: Edge { thing: "x".into() },
            at: 0,
            software: "test 9.9.9".into(),
            certificate: None,
            peers: Vec::new(),
            cloud: None,
            counters: CounterTable {
                edge: TestCounters::default(),
                engine: cyphonic_tunnel::EngineCounters::default(),
            },
            pipelines: Pipelines::default(),
            buffers: Buffers::default(),
            policy: None,
        }
    }

    /// The table is printed from a document of this format; another format is refused with a
    /// message that says which, and `--json` still shows it.
    #[test]
    fn status_reads_its_own_format_only() {
        let dir = std::env::temp_dir().join(format!("cyphonic-cli-{}", std::process::id()));
        let doc = |version: u32| serde_json::to_value(status(version)).unwrap_or_default();
        let (ours, newer) = (dir.join("ours.sock"), dir.join("newer.sock"));
        let _a = cyphonic_telemetry::status::serve(&ours, move || doc(VERSION)).unwrap();
        let _b = cyphonic_telemetry::status::serve(&newer, move || doc(VERSION + 1)).unwrap();
        show_status(&NAMES, status_text, &ours, false).unwrap();
        assert_eq!(PRINTED.load(Ordering::Relaxed), 1);
        let err = show_status(&NAMES, status_text, &newer, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("test writes status format {}", VERSION + 1)),
            "{err}"
        );
        show_status(&NAMES, status_text, &newer, true).unwrap();
        assert_eq!(
            PRINTED.load(Ordering::Relaxed),
            1,
            "no table for another format"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The table: what runs, the edge's head line, the peers, the edge's sections, the
    /// counters.
    #[test]
    fn the_table_puts_the_edge_around_the_peers() {
        let doc = status(VERSION);
        doc.counters.edge.things.store(2, Ordering::Relaxed);
        let text = table(
            &doc,
            &EdgeText {
                head: "HEAD".into(),
                sections: "\nSECTION\n".into(),
            },
        );
        let (head, peers, section, counters) = (
            text.find("HEAD"),
            text.find("PEER"),
            text.find("SECTION"),
            text.find("things"),
        );
        assert!(
            head < peers && peers < section && section < counters,
            "{text}"
        );
        assert!(text.contains("SECTION\n\ncounters (non-zero):"), "{text}");
        assert!(text.starts_with("test 9.9.9\nHEAD"), "{text}");
    }

    /// Every command that reads the configuration takes `-c FILE`, and without it the path
    /// the package installs; a bare FILE is refused (`check-config FILE` was the old form).
    #[test]
    fn the_configuration_is_dash_c_or_the_packaged_path() {
        let config = |args: &[&str]| -> Option<PathBuf> {
            let m = command(&NAMES)
                .try_get_matches_from(std::iter::once("cyphonic-test").chain(args.iter().copied()))
                .ok()?;
            m.subcommand()?.1.get_one::<PathBuf>("config").cloned()
        };
        for (sub, rest) in [
            ("run", &[][..]),
            ("enroll", &[]),
            ("check-config", &[]),
            ("policy", &["a", "b", "icmp"]),
        ] {
            let mut args = vec![sub];
            args.extend_from_slice(rest);
            assert_eq!(
                config(&args),
                Some(PathBuf::from("/etc/cyphonic/test.toml")),
                "{sub}"
            );
            args.splice(1..1, ["-c", "/srv/x.toml"]);
            assert_eq!(config(&args), Some(PathBuf::from("/srv/x.toml")), "{sub}");
        }
        assert_eq!(config(&["check-config", "/srv/x.toml"]), None);
    }

    /// The completions and the man pages come from the same command line.
    #[test]
    fn completions_and_man_pages_name_every_command() {
        let mut out = Vec::new();
        cyphonic_telemetry::manual::completions(
            &mut command(&NAMES),
            cyphonic_telemetry::manual::Shell::Bash,
            &mut out,
        );
        let text = String::from_utf8_lossy(&out);
        for sub in [
            "run",
            "enroll",
            "check-config",
            "policy",
            "status",
            "completions",
        ] {
            assert!(text.contains(sub), "{sub} in {text}");
        }
        let dir = std::env::temp_dir().join(format!("cyphonic-cli-man-{}", std::process::id()));
        let pages =
            cyphonic_telemetry::manual::man_pages(&command(&NAMES), &dir).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        let names: Vec<String> = pages
            .iter()
            .filter_map(|p| Some(p.file_name()?.to_str()?.to_owned()))
            .collect();
        assert!(names.contains(&"cyphonic-test.1".to_owned()), "{names:?}");
        assert!(
            names.contains(&"cyphonic-test-check-config.1".to_owned()),
            "{names:?}"
        );
    }
}

//! Logs through tracing. Text for a terminal (with colours when it is one), one JSON object
//! per line on request, and under systemd (`JOURNAL_STREAM` set) text without timestamps and
//! colours: journald stamps each line itself. `RUST_LOG` filters (default `info`).
//!
//! What is logged is each crate's business; their rule is one line per state change (a peer
//! up or down, a lease granted or expired, a relay chosen and why), never key material, and
//! floods held back with a [`crate::Throttle`].

use std::io::IsTerminal as _;

/// How log lines look; also the daemons' `--log-format` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Whether stderr goes to journald (systemd sets `JOURNAL_STREAM` for a service whose output
/// it takes).
fn under_journald() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some()
}

/// Installs the subscriber for the process. Call once, first thing.
pub fn init(format: Format) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match (format, under_journald()) {
        (Format::Json, _) => builder.json().init(),
        (Format::Text, true) => builder.with_ansi(false).without_time().init(),
        (Format::Text, false) => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

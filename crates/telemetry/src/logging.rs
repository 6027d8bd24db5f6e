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

/// A string a peer or a device chose (a DHCP hostname, a name asked for), for log fields:
/// printed with control characters, quotes and backslashes escaped and cut at 256
/// characters, so it can neither forge log lines nor fill them.
#[derive(Debug, Clone, Copy)]
pub struct Untrusted<'a>(pub &'a str);

/// How much of an untrusted string a log line shows.
const UNTRUSTED_MAX: usize = 256;

impl std::fmt::Display for Untrusted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut chars = self.0.chars();
        for c in chars.by_ref().take(UNTRUSTED_MAX) {
            if c.is_alphanumeric() && c.is_ascii() || "-_.:/@+".contains(c) {
                f.write_str(c.encode_utf8(&mut [0; 4]))?;
            } else {
                for e in c.escape_default() {
                    f.write_str(e.encode_utf8(&mut [0; 4]))?;
                }
            }
        }
        if chars.next().is_some() {
            f.write_str("...")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Untrusted;

    #[test]
    fn untrusted_strings_cannot_forge_or_flood_log_lines() {
        assert_eq!(Untrusted("sensor-1.gw1").to_string(), "sensor-1.gw1");
        let forged = "cam\n2026-11-24T00:00:00Z  INFO lease granted vip=100.64.1.9";
        let shown = Untrusted(forged).to_string();
        assert!(!shown.contains('\n'), "{shown}");
        assert!(shown.starts_with("cam\\n"), "{shown}");
        assert_eq!(
            Untrusted("a\"b\\c\u{1b}[31m").to_string(),
            "a\\\"b\\\\c\\u{1b}[31m"
        );
        assert_eq!(Untrusted("héllo").to_string(), "h\\u{e9}llo");
        let long = "x".repeat(1000);
        assert_eq!(Untrusted(&long).to_string().len(), 256 + 3);
    }
}

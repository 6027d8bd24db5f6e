//! Logs through tracing. Text for a terminal (with colours when it is one), one JSON object
//! per line on request, and under systemd (`JOURNAL_STREAM` set) text without timestamps and
//! colours, each line led by its syslog priority (`<4>` for a warning: sd-daemon(3)), so
//! that journald stamps it itself and `journalctl -p warning` shows the warnings.
//! `RUST_LOG` filters (default `info`).
//!
//! What is logged is each crate's business; their rule is one line per state change (a peer
//! up or down, a lease granted or expired, a relay chosen and why), never key material, and
//! floods held back with a [`crate::Throttle`].

use std::io::IsTerminal as _;
use std::sync::OnceLock;

/// Replaces the running filter (set by [`init`]); the subscriber's type differs per format,
/// so a closure holds its reload handle.
type SetFilter = Box<dyn Fn(tracing_subscriber::EnvFilter) -> Result<(), String> + Send + Sync>;
static SET_FILTER: OnceLock<SetFilter> = OnceLock::new();

/// The filter when neither `RUST_LOG` nor a configuration names one.
pub const DEFAULT_FILTER: &str = "info";

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
pub(crate) fn under_journald() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some()
}

/// Installs the subscriber for the process. Call once, first thing. Its filter is
/// `RUST_LOG`'s, else `info`, until [`set_filter`] replaces it.
pub fn init(format: Format) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    macro_rules! install {
        ($builder:expr) => {{
            // Last: the reload handle is typed by the format chosen before it.
            let b = $builder.with_filter_reloading();
            let handle = b.reload_handle();
            let _ = SET_FILTER.set(Box::new(move |f| {
                handle.reload(f).map_err(|e| e.to_string())
            }));
            b.init();
        }};
    }
    match (format, under_journald()) {
        (Format::Json, _) => install!(builder.json()),
        (Format::Text, true) => install!(
            builder.with_ansi(false).event_format(Journald(
                tracing_subscriber::fmt::format()
                    .with_ansi(false)
                    .without_time()
            ))
        ),
        (Format::Text, false) => install!(builder.with_ansi(std::io::stderr().is_terminal())),
    }
}

/// An event format that leads each line with the syslog priority of its level, as journald
/// reads lines on a service's stderr: error 3, warning 4, info 6, debug and trace 7.
#[derive(Debug)]
pub struct Journald<F>(pub F);

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for Journald<F>
where
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let priority = match *event.metadata().level() {
            tracing::Level::ERROR => 3,
            tracing::Level::WARN => 4,
            tracing::Level::INFO => 6,
            _ => 7,
        };
        write!(writer, "<{priority}>")?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Checks filter directives as `RUST_LOG` takes them (`info`, `warn,cyphonic_tunnel=debug`).
///
/// # Errors
/// What is wrong with them.
pub fn check_filter(directives: &str) -> Result<(), String> {
    tracing_subscriber::EnvFilter::try_new(directives)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Whether `RUST_LOG` is set: it then wins over a configuration's filter.
pub fn env_filter_set() -> bool {
    std::env::var_os(tracing_subscriber::EnvFilter::DEFAULT_ENV).is_some()
}

/// Replaces the filter of the subscriber [`init`] installed (nothing without one).
///
/// # Errors
/// The directives do not parse, or the subscriber is gone.
pub fn set_filter(directives: &str) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(directives).map_err(|e| e.to_string())?;
    SET_FILTER.get().map_or(Ok(()), |set| set(filter))
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
    use super::{Journald, Untrusted};

    /// Lines for journald lead with their priority: what `journalctl -p` filters on.
    #[test]
    fn journald_lines_carry_their_priority() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .event_format(Journald(
                tracing_subscriber::fmt::format()
                    .with_ansi(false)
                    .without_time(),
            ))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!("e");
            tracing::warn!(peer = "gw2", "w");
            tracing::info!("i");
            tracing::debug!("d");
        });
        let text = String::from_utf8(
            buf.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
        .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        for (line, p) in lines.iter().zip(["<3>", "<4>", "<6>", "<7>"]) {
            assert!(line.starts_with(p), "{line}");
        }
        assert!(lines[1].contains("peer=\"gw2\""), "{text}");
    }

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

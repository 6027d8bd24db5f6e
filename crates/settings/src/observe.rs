//! `[metrics]` and `[log]`: what an operator watches.

use std::net::SocketAddr;

use serde::Deserialize;
use toml::Spanned;

use crate::{ConfigError, Source};

/// `[metrics]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    listen: Option<Spanned<SocketAddr>>,
}

impl RawMetrics {
    /// Where the Prometheus endpoint listens, if anywhere. A port is required; any address is
    /// taken (loopback, or a management network: the metrics name peers and devices).
    ///
    /// # Errors
    /// Port 0.
    pub fn check(&self, src: &Source<'_>) -> Result<Option<SocketAddr>, ConfigError> {
        match &self.listen {
            Some(l) if l.get_ref().port() == 0 => src.err(
                &l.span(),
                "metrics.listen",
                "give the port Prometheus scrapes (9464, say)",
            ),
            Some(l) => Ok(Some(*l.get_ref())),
            None => Ok(None),
        }
    }
}

// ---- [log] -----------------------------------------------------------------------------------

/// `[log]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    level: Option<Spanned<String>>,
}

impl RawLog {
    /// The log filter the file asks for (`RUST_LOG`'s syntax), if any.
    ///
    /// # Errors
    /// Directives that do not parse.
    pub fn check(&self, src: &Source<'_>) -> Result<Option<String>, ConfigError> {
        match &self.level {
            Some(l) => match cyphonic_telemetry::logging::check_filter(l.get_ref()) {
                Ok(()) => Ok(Some(l.get_ref().clone())),
                Err(e) => src.err(
                    &l.span(),
                    "log.level",
                    format!("{e} (examples: \"info\", \"warn,cyphonic_tunnel=debug\")"),
                ),
            },
            None => Ok(None),
        }
    }
}

// ---- [dataplane] and [dns] -------------------------------------------------------------------

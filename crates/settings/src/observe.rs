//! `[metrics]` and `[log]`: what an operator watches.

use std::net::SocketAddr;

use toml::Spanned;

use crate::{ConfigError, Source};

crate::table! {
    /// The Prometheus endpoint (`http://<listen>/metrics`): counters of every stage, drops by
    /// reason, each peer's traffic and route, handshake refusals by reason. Keep it on
    /// loopback or a management network: it names peers and devices.
    pub struct RawMetrics in "metrics" (optional) {
        /// Where it listens, with a port. Unset: no endpoint.
        listen: Option<Spanned<SocketAddr>> = None,
    }
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
                RawMetrics::listen,
                "give the port Prometheus scrapes (9464, say)",
            ),
            Some(l) => Ok(Some(*l.get_ref())),
            None => Ok(None),
        }
    }
}

// ---- [log] -----------------------------------------------------------------------------------

crate::table! {
    /// What is logged.
    pub struct RawLog in "log" (optional) {
        /// The filter, as `RUST_LOG` takes it (`"info"`, `"warn,cyphonic_tunnel=debug"`).
        /// Changes with a reload (SIGHUP); `RUST_LOG`, when set, wins. Unset: `info`.
        level: Option<Spanned<String>> = None,
    }
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
                    RawLog::level,
                    format!("{e} (examples: \"info\", \"warn,cyphonic_tunnel=debug\")"),
                ),
            },
            None => Ok(None),
        }
    }
}

// ---- [dataplane] and [dns] -------------------------------------------------------------------

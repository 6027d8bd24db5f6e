//! Forwarding DNS questions outside the overlay to upstream resolvers on the external side
//! (hickory-resolver, with the cache it keeps), for the adapter's and the node's DNS.

use std::net::IpAddr;
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, RecordType};
use hickory_resolver::TokioResolver;
use tokio::sync::mpsc;

use crate::cloud::Settled;

/// How long an upstream lookup may take (the client gets SERVFAIL after 3 s anyway).
const TIMEOUT: Duration = Duration::from_secs(2);

/// The upstream resolvers.
#[derive(Debug, Clone)]
pub struct Upstream {
    resolver: TokioResolver,
    servers: Vec<IpAddr>,
    results: mpsc::Sender<Settled>,
}

impl Upstream {
    /// Asks `servers` over UDP (TCP for truncated answers); results go to `results`.
    ///
    /// # Errors
    /// hickory refuses the configuration.
    pub fn new(
        servers: &[IpAddr],
        results: mpsc::Sender<Settled>,
    ) -> Result<Self, hickory_resolver::net::NetError> {
        use hickory_resolver::config::{NameServerConfig, ResolverConfig};
        let config = ResolverConfig::from_name_servers(
            servers
                .iter()
                .map(|ip| NameServerConfig::udp_and_tcp(*ip))
                .collect(),
        );
        let mut builder = hickory_resolver::Resolver::builder_with_config(
            config,
            hickory_resolver::net::runtime::TokioRuntimeProvider::default(),
        );
        builder.options_mut().timeout = TIMEOUT;
        builder.options_mut().attempts = 1;
        Ok(Self {
            resolver: builder.build()?,
            servers: servers.to_vec(),
            results,
        })
    }

    /// The resolvers asked.
    pub fn servers(&self) -> &[IpAddr] {
        &self.servers
    }

    /// Looks `name`/`record_type` up in the background (on the current tokio runtime); the
    /// result arrives under `key`.
    pub fn ask(&self, key: u16, name: Name, record_type: RecordType) {
        let (resolver, tx) = (self.resolver.clone(), self.results.clone());
        tokio::spawn(async move {
            let result = match resolver.lookup(name, record_type).await {
                Ok(found) => Ok(found.answers().to_vec()),
                Err(e) if e.is_nx_domain() => Err(ResponseCode::NXDomain),
                // The name exists without records of this type (NODATA).
                Err(e) if e.is_no_records_found() => Ok(Vec::new()),
                Err(e) => {
                    tracing::debug!(error = %e, "upstream lookup failed");
                    Err(ResponseCode::ServFail)
                }
            };
            let _ = tx.send((key, result)).await;
        });
    }
}

//! The cyphonic control plane: AS (certificate checks against the overlay CA
//! and its revocation list), NMS (control sessions, registration, resolution with policy,
//! route choice, signalling) and TRS (relay channels for pairs that cannot talk directly).
//! `cyphonic-cloud serve` runs them in one process.
//! The registry lives in a SQL store ([`store`]): a SQLite file by default, PostgreSQL by URL.

#![forbid(unsafe_code)]

pub mod admin;
pub mod api;
mod clock;
pub mod config;
pub mod enroll;
pub mod fleet;
pub mod guard;
pub mod nms;
pub mod observe;
pub mod policy;
pub mod route;
pub mod signin;
pub mod store;
pub mod tls;
pub mod trs;

/// The program's name, as its command line, logs and metrics give it.
pub const PROGRAM: &str = "cyphonic-cloud";

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;

pub use config::CloudConfig;
pub use nms::Nms;
pub use policy::{Compiled, Policy, Rule};
pub use store::{Store, redact};
pub use trs::Trs;

/// The services, running on the current tokio runtime.
#[derive(Debug)]
pub struct Running {
    /// The NMS, with its counters.
    pub nms: Arc<Nms>,
    /// The control address bound.
    pub control: SocketAddr,
    /// The probe address bound.
    pub probe: SocketAddr,
    /// The second probe address bound.
    pub probe_alt: SocketAddr,
    /// The relay, unless switched off.
    pub trs: Option<Arc<Trs>>,
    /// The relay's stream address bound, when it has one.
    pub relay_stream: Option<SocketAddr>,
    /// What the status document and the metrics read.
    pub observed: observe::Observed,
    /// The metrics endpoint's address, when it runs.
    pub metrics: Option<SocketAddr>,
    /// The HTTP API's address, when it runs.
    pub api: Option<SocketAddr>,
    /// The API's TLS configuration, replaced when a reload reads its files again.
    api_tls: Option<tokio::sync::watch::Sender<Arc<rustls::ServerConfig>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _status: Option<cyphonic_telemetry::status::StatusSocket>,
    _admin: cyphonic_telemetry::status::StatusSocket,
}

impl Running {
    /// Stops the services: every session drops, as if the process ended.
    pub fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        let s = &self.nms.stats;
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            sessions = get(&s.sessions),
            refused = get(&s.refused),
            malformed = get(&s.malformed),
            resolves = get(&s.resolves),
            denied = get(&s.denied),
            probes = get(&s.probes),
            probes_refused = get(&s.probes_refused),
            relayed_pairs = get(&s.relayed_pairs),
            relays_refused = get(&s.relays_refused),
            "cyphonic-cloud stopping"
        );
        if let Some(t) = &self.trs {
            t.close_all();
            let r = &t.stats;
            tracing::info!(
                channels_opened = get(&r.channels_opened),
                relayed_packets = get(&r.relayed_packets),
                relayed_bytes = get(&r.relayed_bytes),
                binds = get(&r.binds),
                refused = get(&r.refused),
                "relay stopping"
            );
        }
    }
}

/// Opens the store, binds the sockets and starts the services of `config`.
///
/// # Errors
/// A socket cannot be bound or the store cannot be opened.
pub async fn start(config: CloudConfig) -> anyhow::Result<Running> {
    let store = Store::open(&config.database)
        .await
        .with_context(|| format!("opening the store {}", redact(&config.database)))?;
    if !store.is_shared() {
        // A crash may have left clients marked online. (A shared store's other instances
        // still hold theirs.)
        store.all_offline().await?;
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding the control port {}", config.listen))?;
    let probe = tokio::net::UdpSocket::bind(config.probe_listen)
        .await
        .with_context(|| format!("binding the probe port {}", config.probe_listen))?;
    let probe_alt = tokio::net::UdpSocket::bind(config.probe_listen_alt)
        .await
        .with_context(|| {
            format!(
                "binding the second probe port {} (probe_listen_alt)",
                config.probe_listen_alt
            )
        })?;
    let (control, probe_addr, probe_alt_addr) = (
        listener.local_addr()?,
        probe.local_addr()?,
        probe_alt.local_addr()?,
    );
    let public = config.key.public();
    let stream = match config.relay.as_ref().and_then(|r| r.stream.as_ref()) {
        Some(s) => Some(
            tokio::net::TcpListener::bind(s.listen)
                .await
                .with_context(|| {
                    format!(
                        "binding the relay's stream port {} ([relay] stream_listen)",
                        s.listen
                    )
                })?,
        ),
        None => None,
    };
    let relay_stream = stream
        .as_ref()
        .map(tokio::net::TcpListener::local_addr)
        .transpose()?;
    let trs = config.relay.map(|r| Arc::new(Trs::new(r)));
    let nms = Arc::new(
        Nms::new(
            config.key,
            config.trust,
            store.clone(),
            config.policy,
            vec![probe_addr.port(), probe_alt_addr.port()],
            trs.clone(),
        )
        .with_issuer(config.enroll)
        .with_flows(config.flows.clone()),
    );
    // Sessions open with the policy compiled, not with an empty one.
    nms.compile_policy().await?;
    let (clients, online) = store.counts().await?;
    tracing::info!(
        %control,
        probe = %probe_addr,
        probe_alt = %probe_alt_addr,
        relay = %trs.as_ref().map_or_else(|| "off".to_owned(), |t| t.describe()),
        relay_stream = ?relay_stream,
        store = %redact(&config.database),
        %public,
        clients,
        online,
        "cyphonic-cloud serving"
    );
    let registry = Arc::new(observe::Registry::default());
    let observed = observe::Observed {
        nms: nms.clone(),
        trs: trs.clone(),
        registry: registry.clone(),
        info: Arc::new(observe::Static {
            control,
            probes: [probe_addr, probe_alt_addr],
            store: redact(&config.database),
            public_key: public.to_string(),
            started: std::time::Instant::now(),
        }),
    };
    let status = {
        let observed = observed.clone();
        cyphonic_telemetry::status::serve(&config.status_socket, move || observed.snapshot())
            .with_context(|| {
                format!(
                    "opening the status socket {} (status_socket)",
                    config.status_socket.display()
                )
            })?
    };
    let metrics = match config.metrics {
        Some(addr) => Some(
            cyphonic_telemetry::metrics::serve(
                addr,
                cyphonic_telemetry::build!(PROGRAM),
                vec![Box::new(observed.clone())],
            )
            .with_context(|| format!("opening the metrics endpoint {addr} ([metrics] listen)"))?,
        ),
        None => None,
    };
    let mut tasks = Vec::new();
    let api_tls = config
        .api_tls
        .as_ref()
        .map(|t| tokio::sync::watch::Sender::new(t.config.clone()));
    let signin = match config.api {
        Some(_) => config
            .api_oidc
            .clone()
            .map(signin::Provider::new)
            .transpose()?,
        None => None,
    };
    let state = api::ApiState::with_signin(nms.clone(), signin).await?;
    // The command line's changes reach the running cloud here (docs/protocol.md §8).
    let admin = {
        let listener = cyphonic_telemetry::status::bind_private(&config.admin_socket)
            .and_then(|l| {
                l.set_nonblocking(true)?;
                tokio::net::UnixListener::from_std(l)
            })
            .with_context(|| {
                format!(
                    "opening the admin socket {} (admin_socket)",
                    config.admin_socket.display()
                )
            })?;
        tasks.push(tokio::spawn(api::serve_local(
            listener,
            api::local_router(state.clone()),
            api::Limits::default(),
        )));
        cyphonic_telemetry::status::StatusSocket::at(&config.admin_socket)
    };
    let api = match config.api {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the API's address {addr} ([api] listen)"))?;
            let bound = listener.local_addr()?;
            tasks.push(tokio::spawn(state.clone().keep_fresh()));
            tasks.push(tokio::spawn(api::serve(
                listener,
                api::router(state),
                api_tls.as_ref().map(tokio::sync::watch::Sender::subscribe),
                config.api_proxies.clone().into(),
                api::Limits::default(),
                {
                    let nms = nms.clone();
                    move || {
                        nms.stats
                            .api_refused
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                },
            )));
            tracing::info!(api = %bound, tls = config.api_tls.is_some(), "the HTTP API is serving");
            Some(bound)
        }
        None => None,
    };
    tasks.push(tokio::spawn(sweep_audit(
        store.clone(),
        (config.audit_days, config.flows.keep_days),
        config.api_oidc.as_ref().map_or(0, |o| o.idle.as_secs()),
    )));
    let signals = nms
        .listen_for_signals()
        .await
        .context("listening for other instances' signals in the shared store")?;
    tasks.extend([
        tokio::spawn(registry.refresh(store.clone())),
        tokio::spawn(nms.clone().serve(listener)),
        tokio::spawn(nms.clone().probes(probe, false)),
        tokio::spawn(nms.clone().probes(probe_alt, true)),
        tokio::spawn(nms.clone().signals(signals)),
        tokio::spawn(nms.clone().revocations()),
        tokio::spawn(nms.clone().policies()),
        tokio::spawn(nms.clone().watch_issuer()),
    ]);
    if let (Some(listener), Some(trs)) = (stream, &trs) {
        tasks.push(tokio::spawn(trs.clone().serve_streams(listener)));
    }
    Ok(Running {
        nms,
        control,
        probe: probe_addr,
        probe_alt: probe_alt_addr,
        trs,
        relay_stream,
        observed,
        metrics,
        api,
        api_tls,
        tasks,
        _status: Some(status),
        _admin: admin,
    })
}

/// How often the audit log's old rows are forgotten.
const AUDIT_SWEEP: std::time::Duration = std::time::Duration::from_secs(3600);

/// Forgets the audit log's rows older than `days`, flow records older than `flow_days`,
/// and sessions ended (or idle for `idle` seconds), at once and every [`AUDIT_SWEEP`].
async fn sweep_audit(store: Store, (days, flow_days): (u64, u64), idle: u64) {
    loop {
        match store
            .sessions_sweep(clock::unix_now_ms() / 1000, idle)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(sessions = n, "ended sessions forgotten"),
            Err(e) => tracing::warn!(error = %e, "the sessions could not be swept"),
        }
        let before = clock::unix_now_ms().saturating_sub(days.saturating_mul(86_400_000));
        match store.audit_sweep(before).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, days, "old audit rows forgotten"),
            Err(e) => tracing::warn!(error = %e, "the audit log could not be swept"),
        }
        let before = (clock::unix_now_ms() / 1000).saturating_sub(flow_days.saturating_mul(86_400));
        match store.flows_sweep(before).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(records = n, days = flow_days, "old flow records forgotten"),
            Err(e) => tracing::warn!(error = %e, "the flow records could not be swept"),
        }
        tokio::time::sleep(AUDIT_SWEEP).await;
    }
}

/// Runs the services of `config` until SIGINT or SIGTERM. On SIGHUP, `reread` reads the
/// configuration again: a file with any mistake is refused whole (the running configuration
/// stays); otherwise the CAs, the revocations and the policy apply at once (clients no longer
/// trusted lose their session and their names, [`Nms::reload`]), and what needs a restart
/// is named in the log.
///
/// # Errors
/// A socket cannot be bound or the store cannot be opened.
pub async fn serve(
    config: CloudConfig,
    mut reread: impl FnMut() -> anyhow::Result<CloudConfig>,
) -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    let started = config::Restart::of(&config);
    let running = start(config).await?;
    // Every socket is open: systemd may call the unit active, and watch it from here.
    cyphonic_telemetry::service::ready();
    let mut watchdog = cyphonic_telemetry::service::Watchdog::from_env(std::time::Instant::now());
    loop {
        let ping = watchdog
            .as_ref()
            .map(cyphonic_telemetry::service::Watchdog::due);
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            () = async {
                match ping {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => {
                if let Some(w) = watchdog.as_mut() {
                    w.kick(std::time::Instant::now());
                }
            }
            _ = hup.recv() => {
                cyphonic_telemetry::service::reloading();
                tracing::info!("SIGHUP: reading the configuration again");
                let new = match reread() {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!("the configuration is refused, the running one stays: {e:#}");
                        let refused = admin::AdminError::Invalid { field: "configuration", message: format!("{e:#}") };
                        let details = serde_json::json!({ "error": refused.to_string() });
                        let _ = admin::record(running.nms.store(), &admin::Who::cloud(), "policy.reload", "", details, Err::<(), _>(refused)).await;
                        cyphonic_telemetry::service::ready();
                        continue;
                    }
                };
                for key in started.changed(&config::Restart::of(&new)) {
                    tracing::warn!(key, "changed in the file: takes effect at the next restart");
                }
                // The same certificate files, read again (a renewed certificate): new
                // connections take it, open ones keep theirs.
                if let (Some(live), Some(tls)) = (&running.api_tls, &new.api_tls)
                    && config::Restart::of(&new).api_tls() == started.api_tls()
                {
                    live.send_replace(tls.config.clone());
                    tracing::info!(files = ?tls.files, "the API's TLS certificate and key read again");
                }
                let outcome = match running.nms.reload(new.trust, new.policy).await {
                    Ok(cut) => {
                        tracing::info!(cut_off = cut.len(), "configuration reloaded");
                        Ok(serde_json::json!({ "cut_off": cut.len() }))
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "reloaded, but the registry could not be checked against the new trust");
                        Err(admin::AdminError::Store(e))
                    }
                };
                let details = outcome.as_ref().map_or_else(|e| serde_json::json!({ "error": e.to_string() }), Clone::clone);
                let _ = admin::record(running.nms.store(), &admin::Who::cloud(), "policy.reload", "", details, outcome).await;
                cyphonic_telemetry::service::ready();
            }
        }
    }
    cyphonic_telemetry::service::stopping();
    running.stop();
    Ok(())
}

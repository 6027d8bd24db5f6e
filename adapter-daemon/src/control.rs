//! The control thread: a small tokio runtime for everything that is not per-packet work.
//! The engine's control core (`cyphonic_tunnel::Control`: handshakes, peer timers, the
//! cloud, relays) and the adapter's LAN services (DHCP, DNS, the gateway vIP) share it, with
//! the status socket and signals. Data threads reach it through bounded channels and a
//! `Notify`; nothing here ever makes a data thread wait.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cyphonic_tunnel::{Hooks, Settled};
use tokio::sync::mpsc;

use crate::daemon::{Shared, ToServices};
use crate::services::{Services, UpstreamResult};
use crate::status::{self, Static};

/// Wake at least this often even with no timer due (cheap; bounds any missed wake-up).
const MAX_SLEEP: Duration = Duration::from_millis(500);

/// The control thread's state.
pub struct Control {
    pub(crate) shared: Arc<Shared>,
    pub(crate) core: cyphonic_tunnel::Control,
    pub(crate) status: Arc<Static>,
    pub(crate) status_socket: PathBuf,
    pub(crate) services: Services,
    pub(crate) services_rx: mpsc::Receiver<ToServices>,
    pub(crate) upstream_rx: mpsc::Receiver<UpstreamResult>,
}

/// The LAN services hear about peers and settled DNS questions from the engine.
impl Hooks for Services {
    fn peer_up(&mut self, peer: u32) {
        Self::peer_up(self, peer);
    }

    fn peer_gave_up(&mut self, peer: u32) {
        Self::peer_gave_up(self, peer);
    }

    fn settled(&mut self, settled: Settled) {
        self.upstream_done(settled);
    }
}

impl Control {
    /// Runs until SIGINT or SIGTERM.
    ///
    /// # Errors
    /// The status socket or signal handlers cannot be set up.
    pub async fn run(mut self) -> anyhow::Result<()> {
        use anyhow::Context as _;
        let (shared, info) = (self.shared.clone(), self.status.clone());
        let _status = cyphonic_telemetry::status::serve(&self.status_socket, move || {
            status::snapshot(&shared, &info)
        })
        .with_context(|| format!("opening the status socket {}", self.status_socket.display()))?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .context("installing the SIGINT handler")?;
        // Static peers with an endpoint start their handshakes right away (and persistent
        // keepalive peers keep them up).
        self.run_timers(Instant::now());
        loop {
            let deadline = self
                .core
                .next_deadline()
                .into_iter()
                .chain(self.services.poll_timeout())
                .min()
                .unwrap_or_else(|| Instant::now() + MAX_SLEEP)
                .min(Instant::now() + MAX_SLEEP);
            let services = &mut self.services;
            tokio::select! {
                msg = self.core.rx.recv() => match msg {
                    Some(msg) => self.core.handle(msg, services),
                    None => break,
                },
                Some(msg) = self.services_rx.recv() => serve(services, msg),
                Some(done) = self.upstream_rx.recv() => services.upstream_done(done),
                Some(answer) = self.core.cloud_answers.recv() => self.core.cloud_answered(answer, services),
                Some(event) = cyphonic_tunnel::control::cloud_event(&mut self.core.cloud) => self.core.handle_cloud_event(event, services),
                () = self.shared.tunnel.notify.notified() => {}
                () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {}
                _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
                _ = int.recv() => { tracing::info!("SIGINT: shutting down"); break; }
            }
            self.run_timers(Instant::now());
        }
        Ok(())
    }

    fn run_timers(&mut self, now: Instant) {
        self.services.tick(now);
        let (version, names) = self.services.hosted();
        self.core.register(version, names);
        self.core.run_timers(now, &mut self.services);
    }
}

fn serve(services: &mut Services, msg: ToServices) {
    match msg {
        ToServices::Dhcp { mac, payload } => services.dhcp(mac, &payload),
        ToServices::Dns { client, payload } => services.dns(Instant::now(), client, &payload),
        ToServices::FromPeer { peer, packet, at } => services.peer_packet(at, peer, &packet),
    }
}

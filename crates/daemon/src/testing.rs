//! Tunnel ends run in the test's own process by the production driver ([`run_on`]), each on
//! a thread of its own, over an in-memory underlay (`cyphonic_tunnel::testing::Link`) and
//! with its signals on a channel: what the adapter's and the node's in-process tests build
//! their ends from (gotatun's `device_pair()` is the model). Feature `testing`; not for
//! production use.
//!
//! [`run_on`]: crate::run_on

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cyphonic_pipeline::{DropReason, Sink};
use cyphonic_settings::Common;
use cyphonic_signal::NameRecord;
use cyphonic_telemetry::CounterSet;
use cyphonic_telemetry::metrics::{Collector, DescriptorEncoder};
use cyphonic_tunnel::{Accepted, DataPlane, HEADROOM, Submit as _};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::{
    Core, Edge, Reporter, ServiceContext, Services, Settled, Signal, Signals, StaticPeers,
};

/// How long a stop may take: the pipelines drain, the data threads see the stop.
pub const STOP_WITHIN: Duration = Duration::from_secs(30);

/// A tunnel end running on its thread. Dropping it stops it.
#[derive(Debug)]
pub struct RunningEnd {
    program: &'static str,
    status_socket: PathBuf,
    signals: Option<mpsc::Sender<Signal>>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
}

impl RunningEnd {
    /// Runs `body` on a thread of its own (`name`): it builds the end (an edge may borrow
    /// its configuration, so it is made there) and runs it with [`crate::run_on`] and the
    /// [`Signals`] it is given. `status_socket` is where the end answers (its
    /// `Common::status_socket`); `program` names it in errors.
    ///
    /// # Panics
    /// When the thread cannot start.
    pub fn start(
        name: &str,
        program: &'static str,
        status_socket: &Path,
        body: impl FnOnce(Signals) -> anyhow::Result<()> + Send + 'static,
    ) -> Self {
        let (tx, signals) = Signals::channel();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(signals))
            .expect("a thread for the end");
        Self {
            program,
            status_socket: status_socket.to_owned(),
            signals: Some(tx),
            thread: Some(thread),
        }
    }

    /// Its status document now.
    ///
    /// # Errors
    /// It does not answer (not yet started, or stopped).
    pub fn status(&self) -> anyhow::Result<serde_json::Value> {
        cyphonic_telemetry::status::fetch(&self.status_socket, self.program)
            .map_err(anyhow::Error::msg)
    }

    /// Waits up to `within` for a status document `what` holds of; returns it.
    ///
    /// # Errors
    /// None held within the time (the last document, or why there was none, says what it
    /// was), or the end stopped (with its error).
    pub fn wait_status(
        &mut self,
        within: Duration,
        what: impl Fn(&serde_json::Value) -> bool,
    ) -> anyhow::Result<serde_json::Value> {
        let deadline = Instant::now() + within;
        loop {
            if self.thread.as_ref().is_none_or(JoinHandle::is_finished) {
                let ended = self.join();
                anyhow::bail!("{} stopped: {ended:?}", self.program);
            }
            let last = match self.status() {
                Ok(doc) if what(&doc) => return Ok(doc),
                Ok(doc) => doc.to_string(),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                anyhow::bail!("{}: not within {within:?}; last: {last}", self.program);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Has it read its configuration again (a SIGHUP).
    ///
    /// # Errors
    /// It stopped.
    pub fn reload(&self) -> anyhow::Result<()> {
        self.signals
            .as_ref()
            .context("stopped")?
            .try_send(Signal::Reload)
            .context("the end no longer listens")
    }

    /// Stops it (a SIGTERM) and waits for it to end; returns how it ended.
    ///
    /// # Errors
    /// What it ended with, or that it did not end within [`STOP_WITHIN`] (its thread is
    /// left running).
    pub fn stop(mut self) -> anyhow::Result<()> {
        if let Some(s) = self.signals.take() {
            let _ = s.try_send(Signal::Stop);
        }
        self.join()
    }

    /// Waits up to [`STOP_WITHIN`] for its thread to end (its signals' channel closed: a
    /// stop), and returns how it ended.
    fn join(&mut self) -> anyhow::Result<()> {
        self.signals = None;
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let deadline = Instant::now() + STOP_WITHIN;
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                anyhow::bail!("{} did not stop within {STOP_WITHIN:?}", self.program);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        thread
            .join()
            .map_err(|_| anyhow::anyhow!("{} panicked", self.program))?
    }
}

impl Drop for RunningEnd {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

/// A data plane fit for ends in one process beside others: two workers, no sparse lanes or
/// busy polling, no bound by time on what is in flight (a loaded machine reaches it with
/// no overload at all), no placement.
pub fn dataplane() -> DataPlane {
    DataPlane {
        workers: 2,
        buffers: 1024,
        in_flight_time: Duration::ZERO,
        sparse_socket: false,
        ..DataPlane::default()
    }
}

/// The keys every tunnel end has, for an end in a test: listening at `listen` (an address
/// on the link), block `block`, the status socket and the files in `dir`, no peers, cloud,
/// metrics, DNS or policy.
///
/// # Panics
/// When `block` is not a block.
pub fn common(dir: &Path, listen: std::net::SocketAddr, block: &str) -> Common {
    Common {
        path: dir.join("end.toml"),
        listen,
        block: block.parse().expect("a block"),
        overlay: cyphonic_settings::OVERLAY,
        overlay_domain: "ovl.example".into(),
        inner_mtu: 1280,
        ipv6: None,
        status_socket: dir.join("status.sock"),
        dataplane: dataplane(),
        peers: Vec::new(),
        cloud: None,
        metrics: None,
        dns: None,
        log_level: None,
        certificate_file: dir.join("end.crt"),
        ca_file: dir.join("ca.crt"),
        policy: None,
        policy_names: cyphonic_filter::Directory::default(),
        dns_rules: Vec::new(),
    }
}

/// What a test sees of a [`BareEdge`]'s end, and how it sends: the host behind a bare tunnel
/// end is the test itself.
#[derive(Debug, Default)]
pub struct BareHost {
    delivered: Mutex<Vec<Vec<u8>>>,
    core: Mutex<Option<Core>>,
    peers: Mutex<Vec<u32>>,
}

impl BareHost {
    /// The packets the end delivered so far, in order.
    pub fn delivered(&self) -> Vec<Vec<u8>> {
        lock(&self.delivered).clone()
    }

    /// Waits up to `within` until `count` packets were delivered; returns all that were.
    pub fn wait_delivered(&self, count: usize, within: Duration) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + within;
        while lock(&self.delivered).len() < count && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.delivered()
    }

    /// The static peers' ids the end's services were last told of.
    pub fn peers(&self) -> Vec<u32> {
        lock(&self.peers).clone()
    }

    /// Waits up to `within` until the end runs (its edge started); false if it did not.
    pub fn wait_running(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while lock(&self.core).is_none() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Sends the IP packet `packet` into the end's tunnel, as an edge's thread does: to the
    /// peer whose block holds its destination. False when the end does not run or has no
    /// buffer free.
    pub fn send(&self, packet: &[u8]) -> bool {
        let core = lock(&self.core);
        let Some(core) = core.as_ref() else {
            return false;
        };
        let Some(dst) = destination(packet) else {
            return false;
        };
        let Some(mut buf) = core.shared.pool().take() else {
            return false;
        };
        let Some(room) = buf.get_mut(HEADROOM..HEADROOM + packet.len()) else {
            return false;
        };
        room.copy_from_slice(packet);
        let mut intake = core.intake.lock();
        let Some(sub) = intake.as_mut() else {
            return false;
        };
        sub.route(buf, packet.len(), dst, 0, (Instant::now(), None));
        sub.flush();
        true
    }
}

/// The destination of an IP packet, either version.
fn destination(packet: &[u8]) -> Option<std::net::IpAddr> {
    match packet.first()? >> 4 {
        4 => Some(<[u8; 4]>::try_from(packet.get(16..20)?).ok()?.into()),
        6 => Some(<[u8; 16]>::try_from(packet.get(24..40)?).ok()?.into()),
        _ => None,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A tunnel end's edge with nothing behind it but the test ([`BareHost`]): what the end
/// delivers is kept, what the test sends goes in; no services, no threads, no counters.
/// The far end of a test of another edge (the node's, the adapter's).
#[derive(Debug)]
pub struct BareEdge(pub Arc<BareHost>);

/// The sink of a [`BareEdge`].
#[derive(Debug, Clone)]
pub struct BareSink(Arc<BareHost>);

impl Sink for BareSink {
    type Item = Accepted;

    fn emit(&mut self, item: Accepted) -> Result<(), DropReason> {
        lock(&self.0.delivered).push(item.buf()[item.packet()].to_vec());
        Ok(())
    }
}

/// A [`BareEdge`]'s part of the status document.
#[derive(Debug, Serialize)]
pub struct BareStatus {
    /// Always true: the document is a bare end's.
    pub bare_edge: bool,
}

/// A [`BareEdge`]'s counters: none.
#[derive(Debug, Serialize)]
pub struct NoCounters {}

impl CounterSet for NoCounters {
    fn snapshot(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    fn helps(&self) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }
}

#[derive(Debug)]
struct NoCollector;

impl Collector for NoCollector {
    fn encode(&self, _: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        Ok(())
    }
}

/// A [`BareEdge`]'s services: none, but they keep the static peers they are told of.
#[derive(Debug)]
pub struct BareServices(Arc<BareHost>);

impl Services for BareServices {
    type Work = ();
    type Reload = ();

    fn next(&mut self) -> impl Future<Output = ()> {
        std::future::pending()
    }

    fn handle(&mut self, (): (), _: Instant) {}

    fn tick(&mut self, _: Instant) {}

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn hosted(&self) -> (u64, &[NameRecord]) {
        (0, &[])
    }

    fn settled(&mut self, _: Settled) {}

    fn reload(&mut self, (): (), _: Instant) {}

    fn set_peers(&mut self, peers: &StaticPeers) {
        *lock(&self.0.peers) = peers.iter().map(|(id, _)| *id).collect();
    }

    fn set_upstream(&mut self, _: Option<crate::Upstream>) {}
}

impl Edge for BareEdge {
    const PROGRAM: &'static str = "cyphonic-bare";
    type Sink = BareSink;
    type Services = BareServices;
    type Status = BareStatus;
    type Counters = NoCounters;

    fn sink(&mut self) -> anyhow::Result<BareSink> {
        Ok(BareSink(self.0.clone()))
    }

    fn services(&mut self, ctx: ServiceContext) -> anyhow::Result<BareServices> {
        let mut services = BareServices(self.0.clone());
        services.set_peers(&ctx.peers);
        Ok(services)
    }

    fn start(&mut self, core: &Core) -> anyhow::Result<Vec<JoinHandle<()>>> {
        *lock(&self.0.core) = Some(core.clone());
        Ok(Vec::new())
    }

    fn reporter(&self, _: &Core) -> Reporter<BareStatus, NoCounters> {
        Box::new(|| (BareStatus { bare_edge: true }, NoCounters {}))
    }

    fn counters(&self) -> Arc<dyn CounterSet + Send + Sync> {
        Arc::new(NoCounters {})
    }

    fn collector(&self, _: &Core) -> Box<dyn Collector> {
        Box::new(NoCollector)
    }
}

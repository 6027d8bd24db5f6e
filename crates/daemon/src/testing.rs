//! Tunnel ends run in the test's own process by the production driver ([`run_on`]), each on
//! a thread of its own, over an in-memory underlay (`cyphonic_tunnel::testing::Link`) and
//! with its signals on a channel: what the adapter's and the node's in-process tests build
//! their ends from (gotatun's `device_pair()` is the model). Feature `testing`; not for
//! production use.
//!
//! [`run_on`]: crate::run_on

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cyphonic_settings::Common;
use cyphonic_tunnel::DataPlane;
use tokio::sync::mpsc;

use crate::{Signal, Signals};

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

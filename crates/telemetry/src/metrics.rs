//! The Prometheus endpoint. Each daemon registers collectors with a `prometheus-client`
//! registry; they read the daemon's own counters at every scrape (nothing on the packet path
//! changes for metrics), and the crate encodes them (OpenMetrics text). The `endpoint` module
//! serves the encoding over HTTP on a thread of its own; this module offers shorthands for
//! collectors, and writes every set of counters one way ([`counter_sets`]): a drop is a row
//! of one `dropped` family by `reason`, a refusal a row of one `refusals` family by `what`.

mod endpoint;
mod process;
mod text;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use endpoint::MAX_CONNECTIONS;
pub use process::Process;
pub use prometheus_client::collector::Collector;
pub use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::{EncodeMetric as _, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
pub use prometheus_client::registry::Registry;

use crate::CounterSet;

/// A request must be whole this long after its connection was accepted.
const REQUEST_DEADLINE: Duration = Duration::from_secs(2);

/// Writes a counter `name` (the encoder adds `_total`).
///
/// # Errors
/// The encoder's.
pub fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(value);
    let m = encoder.encode_descriptor(name, help, None, c.metric_type())?;
    c.encode(m)
}

/// Writes a gauge `name`.
///
/// # Errors
/// The encoder's.
pub fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(value);
    let m = encoder.encode_descriptor(name, help, None, g.metric_type())?;
    g.encode(m)
}

/// Writes a histogram `name` from `buckets`: each its upper bound and the observations in it
/// alone (the encoder accumulates them); the last bound should be `f64::MAX`, written as `+Inf`. With the
/// sum and count of all observations.
///
/// # Errors
/// The encoder's.
pub fn histogram(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    sum: f64,
    count: u64,
    buckets: &[(f64, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    m.encode_histogram::<NoLabelSet>(sum, count, buckets, None)
}

/// Writes each `(name, value)` of `table` under `prefix` as [`counter_sets`] does, each
/// helped as "`what`: name" (a sans-IO crate's statistics, which know nothing of metrics).
///
/// # Errors
/// The encoder's.
pub fn named_counters(
    encoder: &mut DescriptorEncoder<'_>,
    prefix: &str,
    what: &str,
    table: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    let helps: Vec<String> = table
        .iter()
        .map(|(k, _)| format!("{what}: {}.", k.replace('_', " ")))
        .collect();
    write_counters(
        encoder,
        prefix,
        table
            .iter()
            .zip(&helps)
            .map(|((k, v), help)| (*k, help.as_str(), *v)),
    )
}

/// Writes the counters of `sets` under `prefix`: a drop (`drop_<reason>`) as a row of
/// `<prefix>_dropped{reason}`, a refusal (`<what>_refused`) as a row of
/// `<prefix>_refusals{what}`, every other counter `<name>` alone as `<prefix>_<name>`. Sets
/// written together share the two families (a metric family is declared once per scrape).
///
/// # Errors
/// The encoder's.
pub fn counter_sets(
    encoder: &mut DescriptorEncoder<'_>,
    prefix: &str,
    sets: &[&dyn CounterSet],
) -> Result<(), std::fmt::Error> {
    write_counters(
        encoder,
        prefix,
        sets.iter().flat_map(|set| {
            set.snapshot()
                .into_iter()
                .zip(set.helps())
                .map(|((name, value), (_, help))| (name, help, value))
        }),
    )
}

/// [`counter_sets`] over `(name, help, value)`.
fn write_counters<'a>(
    encoder: &mut DescriptorEncoder<'_>,
    prefix: &str,
    counters: impl Iterator<Item = (&'a str, &'a str, u64)>,
) -> Result<(), std::fmt::Error> {
    #[expect(clippy::cast_precision_loss, reason = "counters as metric values")]
    let row =
        |label: &'static str, key: &str, value: u64| ([(label, key.to_owned())], value as f64);
    let (mut drops, mut refusals) = (Vec::new(), Vec::new());
    for (name, help, value) in counters {
        if let Some(reason) = name.strip_prefix("drop_") {
            drops.push(row("reason", reason, value));
        } else if let Some(what) = name.strip_suffix("_refused") {
            refusals.push(row("what", what, value));
        } else {
            counter(encoder, &format!("{prefix}_{name}"), help, value)?;
        }
    }
    if !drops.is_empty() {
        Family::counters(
            &format!("{prefix}_dropped"),
            "Packets or messages dropped, by reason (docs/operations.md lists them; status shows each as drop_<reason>).",
        )
        .encode(encoder, drops)?;
    }
    if !refusals.is_empty() {
        Family::counters(
            &format!("{prefix}_refusals"),
            "Requests refused, by what was asked for (status shows each as <what>_refused).",
        )
        .encode(encoder, refusals)?;
    }
    Ok(())
}

/// A metric with labels: one value per label set.
#[derive(Debug, Clone, Copy)]
pub struct Family<'a> {
    name: &'a str,
    help: &'a str,
    kind: MetricType,
}

impl<'a> Family<'a> {
    /// A family of counters (the encoder adds `_total` to `name`).
    pub const fn counters(name: &'a str, help: &'a str) -> Self {
        Self {
            name,
            help,
            kind: MetricType::Counter,
        }
    }

    /// A family of gauges.
    pub const fn gauges(name: &'a str, help: &'a str) -> Self {
        Self {
            name,
            help,
            kind: MetricType::Gauge,
        }
    }

    /// Writes the family: each row a set of `(label, value)` pairs and the metric's value.
    /// A family without rows is still declared (its HELP and TYPE lines), so that dashboards
    /// and alerts find it before its first event.
    ///
    /// # Errors
    /// The encoder's.
    pub fn encode<'r, L>(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
        rows: impl IntoIterator<Item = (L, f64)>,
    ) -> Result<(), std::fmt::Error>
    where
        L: AsRef<[(&'r str, String)]>,
    {
        let mut m = encoder.encode_descriptor(self.name, self.help, None, self.kind)?;
        for (labels, value) in rows {
            let labels = borrowed(labels.as_ref());
            let mut e = m.encode_family(&labels)?;
            match self.kind {
                MetricType::Counter => {
                    #[expect(
                        clippy::cast_possible_truncation,
                        clippy::cast_sign_loss,
                        reason = "counters are whole and not negative"
                    )]
                    let v = value as u64;
                    e.encode_counter::<NoLabelSet, _, u64>(&v, None)?;
                }
                _ => e.encode_gauge(&value)?,
            }
        }
        Ok(())
    }
}

/// One histogram of a [`histograms`] family: the sum and count of its observations, and its
/// buckets as [`histogram`] takes them.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'b> {
    /// The sum of the observations.
    pub sum: f64,
    /// How many there were.
    pub count: u64,
    /// Each bucket's upper bound and the observations in it alone.
    pub buckets: &'b [(f64, u64)],
}

/// Writes a family of histograms `name`: each row a set of `(label, value)` pairs and its
/// histogram (`direction`, say, for the two pipelines').
///
/// # Errors
/// The encoder's.
pub fn histograms<'r, 'b, L>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, Observed<'b>)>,
) -> Result<(), std::fmt::Error>
where
    L: AsRef<[(&'r str, String)]>,
{
    let mut m = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, o) in rows {
        let labels = borrowed(labels.as_ref());
        let mut e = m.encode_family(&labels)?;
        e.encode_histogram::<NoLabelSet>(o.sum, o.count, o.buckets, None)?;
    }
    Ok(())
}

/// A row's labels as the encoder takes them.
fn borrowed<'r, 'v>(labels: &'v [(&'r str, String)]) -> Vec<(&'r str, &'v str)> {
    labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// What `cyphonic_build_info` says of the program serving the endpoint: take it with
/// [`crate::build!`], which reads the version and commit where the program is compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Build {
    /// The program's name (`cyphonic-adapter`).
    pub program: &'static str,
    /// Its version (the workspace's, `CARGO_PKG_VERSION`).
    pub version: &'static str,
    /// The commit it was built from (`CYPHONIC_COMMIT` at build time, which `cargo xtask
    /// dist` sets); the metric says `unknown` without one.
    pub commit: Option<&'static str>,
}

/// The [`Build`] of `program` as the calling crate is compiled.
#[macro_export]
macro_rules! build {
    ($program:expr) => {
        $crate::metrics::Build {
            program: $program,
            version: env!("CARGO_PKG_VERSION"),
            commit: option_env!("CYPHONIC_COMMIT"),
        }
    };
}

/// The program and its version, and the commit when it is known: `cyphonic-adapter 0.1.0
/// (3f2a9c81d0e4)`, as status documents and the cloud's fleet view show it.
impl std::fmt::Display for Build {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.program, self.version)?;
        if let Some(commit) = self.commit {
            write!(f, " ({commit})")?;
        }
        Ok(())
    }
}

impl Collector for Build {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        Family::gauges(
            "cyphonic_build_info",
            "The program, version and commit serving these metrics (always 1).",
        )
        .encode(
            &mut encoder,
            [(
                [
                    ("program", self.program.to_owned()),
                    ("version", self.version.to_owned()),
                    ("commit", self.commit.unwrap_or("unknown").to_owned()),
                ],
                1.0,
            )],
        )
    }
}

/// The registry's encoding now, as the endpoint serves it.
///
/// # Errors
/// A collector failed to encode.
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

/// Serves what `collectors` collect, after `build`'s `cyphonic_build_info` and the
/// process's own metrics, at `http://<addr>/metrics` from a thread of its own
/// (`cy-metrics`), until the process ends, and logs where. Returns the address bound (for
/// port 0).
///
/// # Errors
/// The address cannot be bound or the thread started.
pub fn serve(
    addr: SocketAddr,
    build: Build,
    collectors: Vec<Box<dyn Collector>>,
) -> std::io::Result<SocketAddr> {
    start(addr, build, collectors).map(Endpoint::keep)
}

/// An endpoint from [`start`]: it serves until dropped, and then stops accepting and frees its
/// address (an HA standby's, which the daemon's own endpoint takes once the box serves).
#[derive(Debug)]
pub struct Endpoint {
    local: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endpoint {
    /// The address it is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Lets it serve until the process ends; returns its address.
    pub fn keep(mut self) -> SocketAddr {
        self.thread = None;
        // The sender dropped unsent: the endpoint never hears "stop".
        self.stop = None;
        self.local
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // Its runtime ends with the thread, and with it the listener and every
            // connection: the address is free once this returns.
            let _ = thread.join();
        }
    }
}

/// As [`serve`], until the [`Endpoint`] returned is dropped.
///
/// # Errors
/// The address cannot be bound or the thread started.
pub fn start(
    addr: SocketAddr,
    build: Build,
    collectors: Vec<Box<dyn Collector>>,
) -> std::io::Result<Endpoint> {
    listen(addr, build, collectors, REQUEST_DEADLINE)
}

/// As [`start`], with requests whole within `deadline` (tests take a long one, so that what
/// they check cannot hinge on how fast a loaded machine runs).
fn listen(
    addr: SocketAddr,
    build: Build,
    collectors: Vec<Box<dyn Collector>>,
    deadline: Duration,
) -> std::io::Result<Endpoint> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(build));
    registry.register_collector(Box::new(Process));
    for c in collectors {
        registry.register_collector(c);
    }
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let registry = Arc::new(registry);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("cy-metrics".into())
        .spawn(move || {
            runtime.block_on(endpoint::accept(listener, registry, deadline, stopped));
        })?;
    tracing::info!(%local, "metrics at http://{}/metrics", endpoint::reachable(local));
    Ok(Endpoint {
        local,
        stop: Some(stop),
        thread: Some(thread),
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::net::TcpStream;
    use std::time::Instant;

    use super::*;

    #[derive(Debug)]
    struct Fixed;

    const BUILD: Build = crate::build!("cyphonic-test");

    impl Collector for Fixed {
        fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
            counter(&mut e, "cyphonic_things", "Things seen.", 7)?;
            gauge(&mut e, "cyphonic_level", "A level.", 2.5)?;
            Family::counters("cyphonic_peer_bytes", "Bytes per peer.").encode(
                &mut e,
                [
                    (vec![("peer", "gw1.ovl.example".to_owned())], 10.0),
                    (vec![("peer", "gw2.ovl.example".to_owned())], 20.0),
                ],
            )?;
            Family::counters("cyphonic_refusals", "Refusals by reason.")
                .encode::<Vec<_>>(&mut e, [])?;
            histogram(
                &mut e,
                "cyphonic_hold_seconds",
                "Hold times.",
                0.5,
                3,
                &[(0.001, 1), (0.01, 2), (f64::MAX, 0)],
            )
        }
    }

    fn registry() -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(Fixed));
        r
    }

    #[test]
    fn collectors_render_as_openmetrics() {
        let text = render(&registry()).unwrap_or_default();
        for line in [
            "# HELP cyphonic_things Things seen.",
            "# TYPE cyphonic_things counter",
            "cyphonic_things_total 7",
            "cyphonic_level 2.5",
            "cyphonic_peer_bytes_total{peer=\"gw2.ovl.example\"} 20",
            // Declared before anything was counted.
            "# TYPE cyphonic_refusals counter",
            "cyphonic_hold_seconds_bucket{le=\"0.01\"} 3",
            "cyphonic_hold_seconds_bucket{le=\"+Inf\"} 3",
            "cyphonic_hold_seconds_count 3",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
    }

    /// A build reads as its program and version, with its commit when one was stamped.
    #[test]
    fn a_build_says_its_commit_only_when_known() {
        let mut b = Build {
            program: "cyphonic-node",
            version: "1.2.3",
            commit: None,
        };
        assert_eq!(b.to_string(), "cyphonic-node 1.2.3");
        b.commit = Some("3f2a9c81d0e4+dirty");
        assert_eq!(b.to_string(), "cyphonic-node 1.2.3 (3f2a9c81d0e4+dirty)");
    }

    /// One request over real HTTP on loopback; the whole answer.
    fn ask(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        s.write_all(request.as_bytes()).unwrap_or_default();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap_or_default();
        out
    }

    /// Over real HTTP on loopback: the metrics in either format, their head alone, a 404
    /// elsewhere and a 405 for other methods, at once beside a connection that sends nothing.
    #[test]
    fn the_endpoint_answers_over_http() {
        let addr = serve(
            "127.0.0.1:0".parse().unwrap_or_else(|_| unreachable!()),
            BUILD,
            vec![Box::new(Fixed)],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let get = |path: &str| ask(addr, &format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"));
        let slow = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let ok = get("/metrics");
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        let header = |answer: &str, name: &str| {
            answer
                .lines()
                .take_while(|l| !l.is_empty())
                .find_map(|l| {
                    l.split_once(": ")
                        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                })
                .map(|(_, v)| v.to_owned())
        };
        assert_eq!(
            header(&ok, "content-type").as_deref(),
            Some(endpoint::OPENMETRICS)
        );
        assert!(
            ok.contains("cyphonic_things_total 7") && ok.ends_with("# EOF\n"),
            "{ok}"
        );
        // Every endpoint says what serves it, once, and how the process fares.
        let info = format!(
            "cyphonic_build_info{{program=\"cyphonic-test\",version=\"{}\",commit=\"{}\"}} 1.0",
            env!("CARGO_PKG_VERSION"),
            option_env!("CYPHONIC_COMMIT").unwrap_or("unknown"),
        );
        assert_eq!(
            ok.lines().filter(|l| *l == info).count(),
            1,
            "{info} in {ok}"
        );
        for family in [
            "process_cpu_seconds",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                ok.contains(&format!("# TYPE {family} ")),
                "{family} in {ok}"
            );
        }
        // Prometheus' text format for a client that asks for it.
        let text = ask(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n",
        );
        assert_eq!(
            header(&text, "content-type").as_deref(),
            Some(endpoint::TEXT)
        );
        assert!(
            text.contains("# TYPE cyphonic_things_total counter\ncyphonic_things_total 7\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
        // HEAD: the same head, no body.
        let head = ask(addr, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert_eq!(
            header(&head, "content-type").as_deref(),
            Some(endpoint::OPENMETRICS)
        );
        assert!(head.ends_with("\r\n\r\n"), "a body after the head: {head}");
        assert!(get("/").starts_with("HTTP/1.1 404"));
        let post = ask(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        );
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        assert_eq!(header(&post, "allow").as_deref(), Some("GET, HEAD"));
        drop(slow);
    }

    /// Drops and refusals of sets written together are rows of one family each; other
    /// counters stand alone.
    #[test]
    #[allow(dead_code, unreachable_pub)]
    fn drops_and_refusals_are_rows_of_one_family() {
        crate::counters! {
            /// One side's.
            pub struct Left {
                /// Frames read.
                read,
                /// Frames too short.
                drop_short,
                /// Peers refused.
                peers_refused,
            }
        }
        crate::counters! {
            /// The other side's.
            pub struct Right {
                /// Frames of no peer.
                drop_no_peer,
            }
        }
        #[derive(Debug)]
        struct Both(Left, Right);
        impl Collector for Both {
            fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
                counter_sets(&mut e, "cyphonic", &[&self.0, &self.1])
            }
        }
        let (left, right) = (Left::default(), Right::default());
        left.drop_short
            .store(3, std::sync::atomic::Ordering::Relaxed);
        right
            .drop_no_peer
            .store(5, std::sync::atomic::Ordering::Relaxed);
        let mut r = Registry::default();
        r.register_collector(Box::new(Both(left, right)));
        let text = render(&r).unwrap_or_default();
        for line in [
            "cyphonic_read_total 0",
            "cyphonic_dropped_total{reason=\"short\"} 3",
            "cyphonic_dropped_total{reason=\"no_peer\"} 5",
            "cyphonic_refusals_total{what=\"peers\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
        assert_eq!(
            text.matches("# TYPE cyphonic_dropped counter").count(),
            1,
            "{text}"
        );
        assert!(!text.contains("cyphonic_drop_"), "{text}");
    }

    /// A histogram family holds one histogram per label set.
    #[test]
    fn histograms_are_labelled() {
        #[derive(Debug)]
        struct Holds;
        impl Collector for Holds {
            fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
                let buckets = [(0.001, 1), (f64::MAX, 1)];
                histograms(
                    &mut e,
                    "cyphonic_hold_seconds",
                    "Hold times.",
                    ["egress", "ingress"].map(|d| {
                        (
                            [("direction", d.to_owned())],
                            Observed {
                                sum: 0.5,
                                count: 2,
                                buckets: &buckets,
                            },
                        )
                    }),
                )
            }
        }
        let mut r = Registry::default();
        r.register_collector(Box::new(Holds));
        let text = render(&r).unwrap_or_default();
        for line in [
            "cyphonic_hold_seconds_bucket{le=\"0.001\",direction=\"egress\"} 1",
            "cyphonic_hold_seconds_count{direction=\"ingress\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
    }

    /// An endpoint from `start` answers until dropped; then its address is free at once, as
    /// the daemon's endpoint needs when an HA standby starts to serve. One that was kept
    /// still holds it.
    #[test]
    fn a_dropped_endpoint_frees_its_address() {
        let any = "127.0.0.1:0".parse().unwrap_or_else(|_| unreachable!());
        let endpoint = start(any, BUILD, vec![Box::new(Fixed)]).unwrap_or_else(|e| panic!("{e}"));
        let addr = endpoint.local_addr();
        let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap_or_default();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap_or_default();
        assert!(out.contains("cyphonic_things_total 7"), "{out}");
        drop(endpoint);
        let again = start(addr, BUILD, vec![Box::new(Fixed)]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again.local_addr(), addr);
        let kept = again.keep();
        assert!(
            start(kept, BUILD, vec![Box::new(Fixed)]).is_err(),
            "a kept endpoint stays bound"
        );
    }

    /// Issue 49, finding 9: 100 connections that each hold half a request line do not keep
    /// a scrape waiting: it is answered before any of them reaches its deadline, and again with more idle
    /// connections opened since. The deadline is long (60 s) and the scrape waits at most
    /// 30 s, so a scrape that waited for an idle connection fails however loaded the machine,
    /// and a quick one passes however slow.
    #[test]
    fn idle_and_slow_connections_do_not_keep_a_scrape_waiting() {
        const DEADLINE: Duration = Duration::from_secs(60);
        let addr = listen(
            "127.0.0.1:0".parse().unwrap_or_else(|_| unreachable!()),
            BUILD,
            vec![Box::new(Fixed)],
            DEADLINE,
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .keep();
        let idle = |n: usize| -> Vec<TcpStream> {
            (0..n)
                .map(|_| {
                    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
                    s.write_all(b"GET /metr").unwrap_or_else(|e| panic!("{e}"));
                    s
                })
                .collect()
        };
        let mut held = idle(100);
        let scrape = || {
            let start = Instant::now();
            let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
            s.set_read_timeout(Some(DEADLINE / 2)).unwrap_or_default();
            write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap_or_default();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap_or_default();
            (out, start.elapsed())
        };
        for _ in 0..3 {
            let (out, took) = scrape();
            assert!(out.contains("cyphonic_things_total 7"), "{out:?}");
            assert!(took < DEADLINE / 2, "{took:?}");
            held.extend(idle(20));
        }
        // The idle ones were closed to make room: at most the cap are still served. The
        // server takes the last ones in and closes the oldest at its own pace (an emulator
        // at the lowest priority is slow): looked at again until it has, 30 s at most.
        let total = held.len();
        let mut open = held;
        let deadline = Instant::now() + DEADLINE / 2;
        while open.len() > MAX_CONNECTIONS && Instant::now() < deadline {
            open.retain_mut(|s| {
                s.set_read_timeout(Some(Duration::from_millis(10)))
                    .unwrap_or_default();
                matches!(
                    s.read(&mut [0u8; 16]),
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
                )
            });
        }
        assert!(
            open.len() <= MAX_CONNECTIONS,
            "{} of {total} still open",
            open.len()
        );
    }
}

//! The Prometheus endpoint. Each daemon registers collectors with a `prometheus-client`
//! registry; they read the daemon's own counters at every scrape (nothing on the packet path
//! changes for metrics), and the crate encodes them (OpenMetrics text). This module serves
//! the encoding over HTTP on a thread of its own, and offers shorthands for collectors.
//!
//! The HTTP side is deliberately small: `GET /metrics` (anything else is 404), one request
//! per connection, requests larger than 8 KiB or slower than 2 s are dropped.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

pub use prometheus_client::collector::Collector;
pub use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::{EncodeMetric as _, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
pub use prometheus_client::registry::Registry;

/// The content type of the OpenMetrics text format.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Largest request read.
const MAX_REQUEST: usize = 8192;

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

/// Writes each `(name, value)` of `table` as a counter `<prefix>_<name>`, helped as
/// "`what`: name" (a sans-IO crate's statistics, which know nothing of metrics).
///
/// # Errors
/// The encoder's.
pub fn named_counters(
    encoder: &mut DescriptorEncoder<'_>,
    prefix: &str,
    what: &str,
    table: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    for (k, v) in table {
        let help = format!("{what}: {}.", k.replace('_', " "));
        counter(encoder, &format!("{prefix}_{k}"), &help, *v)?;
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
            let labels: Vec<(&str, &str)> = labels
                .as_ref()
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect();
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

/// The registry's encoding now, as the endpoint serves it.
///
/// # Errors
/// A collector failed to encode.
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

/// Serves what `collectors` collect at `http://<addr>/metrics` from a thread of its own
/// (`cy-metrics`), until the process ends, and logs where. Returns the address bound (for
/// port 0).
///
/// # Errors
/// The address cannot be bound or the thread started.
pub fn serve(addr: SocketAddr, collectors: Vec<Box<dyn Collector>>) -> std::io::Result<SocketAddr> {
    let mut registry = Registry::default();
    for c in collectors {
        registry.register_collector(c);
    }
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    std::thread::Builder::new()
        .name("cy-metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(stream) => {
                        if let Err(e) = answer(stream, &registry) {
                            tracing::debug!(error = %e, "metrics request");
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "accepting a metrics connection");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })?;
    tracing::info!(%local, "metrics at http://{local}/metrics");
    Ok(local)
}

/// Reads one request and answers it.
fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut request = Vec::new();
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk)?;
        if n == 0 || request.len() + n > MAX_REQUEST {
            return Ok(());
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let line = request
        .split(|b| *b == b'\r')
        .next()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, kind, body) = if method == "GET" && path == "/metrics" {
        match render(registry) {
            Ok(text) => ("200 OK", CONTENT_TYPE, text),
            Err(_) => (
                "500 Internal Server Error",
                "text/plain",
                "encoding failed\n".to_owned(),
            ),
        }
    } else {
        (
            "404 Not Found",
            "text/plain",
            "the metrics are at /metrics\n".to_owned(),
        )
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fixed;

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

    /// Over real HTTP on loopback: the metrics, a 404 elsewhere; a connection that sends
    /// nothing is given up after 2 s and the next one is answered.
    #[test]
    fn the_endpoint_answers_over_http() {
        let addr = serve(
            "127.0.0.1:0".parse().unwrap_or_else(|_| unreachable!()),
            vec![Box::new(Fixed)],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let get = |path: &str| {
            let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
            write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap_or_default();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap_or_default();
            out
        };
        let slow = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let ok = get("/metrics");
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(
            ok.contains(CONTENT_TYPE) && ok.contains("cyphonic_things_total 7"),
            "{ok}"
        );
        assert!(get("/").starts_with("HTTP/1.1 404"));
        drop(slow);
    }
}

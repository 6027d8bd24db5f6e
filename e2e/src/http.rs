//! HTTP from inside a namespace, for the daemons' metrics endpoints: one `GET`, and a
//! sample read from the OpenMetrics text it returns.

use std::time::Duration;

use crate::{Netns, inject};

/// `GET http://<addr><path>` from inside `ns` (a thread enters it): the response's status line
/// and body.
///
/// # Errors
/// The namespace cannot be entered, or the request fails.
pub fn http_get(
    ns: &Netns,
    addr: std::net::SocketAddr,
    path: &str,
) -> anyhow::Result<(String, String)> {
    use std::io::{Read as _, Write as _};
    let path = path.to_owned();
    inject::inside(ns, move || {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        Ok((
            head.lines().next().unwrap_or_default().to_owned(),
            body.to_owned(),
        ))
    })
}

/// The value of the metric sample `line` (`name{labels}`) in an OpenMetrics text, if present.
pub fn metric(text: &str, sample: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(sample)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The prefix of the HA pair's metrics: the single-adapter beds export none of them.
pub const HA_METRICS: &str = "cyphonic_ha_";

/// The metric names the expressions of docs/grafana-dashboard.json query.
///
/// # Panics
/// The dashboard cannot be read, or names fewer than 20 metrics.
pub fn dashboard_metrics() -> std::collections::BTreeSet<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/grafana-dashboard.json"
    );
    let text = std::fs::read_to_string(path).expect("docs/grafana-dashboard.json reads");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut names = std::collections::BTreeSet::new();
    let targets = doc["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|panel| panel["targets"].as_array().into_iter().flatten());
    for target in targets {
        let mut expr = target["expr"].as_str().unwrap_or_default();
        while let Some(at) = expr.find("cyphonic_") {
            let rest = &expr[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            names.insert(rest[..end].to_owned());
            expr = &rest[end..];
        }
    }
    assert!(names.len() > 20, "{names:?}");
    names
}

/// The names of the samples in a Prometheus text exposition (without labels), including those
/// of declared families that have no sample yet (a labelled family with nothing counted).
pub fn sample_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut words = declared.split(' ');
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            names.extend(line.split(['{', ' ']).next().map(str::to_owned));
        }
    }
    names
}

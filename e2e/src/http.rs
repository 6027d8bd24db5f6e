//! HTTP from inside a namespace, for the daemons' metrics endpoints: one request, a sample
//! read from the OpenMetrics text it returns, and promtool's judgement of the text format.

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
    http_request(ns, addr, "GET", path, &[]).map(|r| (r.status, r.body))
}

/// An HTTP response as read: its status line, its header fields (names in lower case) and
/// its body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// `HTTP/1.1 200 OK`.
    pub status: String,
    /// Each field's name and value.
    pub headers: Vec<(String, String)>,
    /// Everything after the head.
    pub body: String,
}

impl Answer {
    /// The value of the header field `name` (lower case), if it came.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `<method> http://<addr><path>` with `headers` from inside `ns` (a thread enters it).
///
/// # Errors
/// The namespace cannot be entered, or the request fails.
pub fn http_request(
    ns: &Netns,
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<Answer> {
    use std::io::{Read as _, Write as _};
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    inject::inside(ns, move || {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(request.as_bytes())?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = head.lines();
        let status = lines.next().unwrap_or_default().to_owned();
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Ok(Answer {
            status,
            headers,
            body: body.to_owned(),
        })
    })
}

/// Checks the metrics endpoint at `addr` in `ns` as Prometheus' own tool does: a scrape in
/// Prometheus' text format (asked for with `Accept: text/plain`) passes `promtool check
/// metrics` without a complaint, and `HEAD` answers with the same type and no body. Returns
/// the text.
///
/// # Errors
/// The scrape fails, or promtool or the HEAD find anything to say.
pub fn promtool_check(ns: &Netns, addr: std::net::SocketAddr) -> anyhow::Result<String> {
    use std::io::Write as _;
    const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
    let got = http_request(ns, addr, "GET", "/metrics", &[("Accept", "text/plain")])?;
    anyhow::ensure!(got.status == "HTTP/1.1 200 OK", "{got:?}");
    anyhow::ensure!(
        got.header("content-type") == Some(TEXT),
        "{:?}",
        got.headers
    );
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("promtool (apt: prometheus): {e}"))?;
    promtool
        .stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("promtool's stdin"))?
        .write_all(got.body.as_bytes())?;
    let out = promtool.wait_with_output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    anyhow::ensure!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}"
    );
    let head = http_request(ns, addr, "HEAD", "/metrics", &[("Accept", "text/plain")])?;
    anyhow::ensure!(
        head.status == "HTTP/1.1 200 OK"
            && head.header("content-type") == Some(TEXT)
            && head.body.is_empty(),
        "HEAD: {head:?}"
    );
    Ok(got.body)
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

/// The prefixes of metrics only some tunnel ends export, each checked against the dashboard
/// where one does: a per-device policy's (a site with rules) and a node's TUN side's.
pub const POLICY_METRICS: &str = "cyphonic_policy_";
/// See [`POLICY_METRICS`].
pub const NODE_METRICS: &str = "cyphonic_tun_";

/// The dashboard's metrics named with `prefix` that `exported` (a scrape, or several) lacks.
pub fn dashboard_lacks(exported: &str, prefix: &str) -> Vec<String> {
    let exported = sample_names(exported);
    dashboard_metrics()
        .into_iter()
        .filter(|name| name.starts_with(prefix) && !exported.contains(name))
        .collect()
}

/// Every query of docs/grafana-dashboard.json parses as PromQL: each is made a recording
/// rule of a scratch file that `promtool check rules` reads. Returns how many there are.
///
/// # Errors
/// promtool cannot run, or refuses a query.
pub fn dashboard_queries_parse() -> anyhow::Result<usize> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/grafana-dashboard.json"
    );
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut rules = String::from("groups:\n- name: dashboard\n  rules:\n");
    let mut n = 0;
    for panel in doc["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            n += 1;
            let expr = serde_json::to_string(target["expr"].as_str().unwrap_or_default())?;
            rules.push_str(&format!(
                "  - record: cyphonic:query{n}\n    expr: {expr}\n"
            ));
        }
    }
    let file = std::env::temp_dir().join(format!("cyphonic-dashboard-{}.yml", std::process::id()));
    std::fs::write(&file, rules)?;
    let out = std::process::Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&file)
        .output();
    let _ = std::fs::remove_file(&file);
    let out = out.map_err(|e| anyhow::anyhow!("promtool (apt: prometheus): {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(n)
}

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

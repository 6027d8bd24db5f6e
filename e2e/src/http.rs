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

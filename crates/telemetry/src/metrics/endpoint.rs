//! The HTTP side of the metrics endpoint, on hyper: `GET` and `HEAD` of `/metrics` (anything
//! else is 404, another method 405), one request per connection, OpenMetrics or, for a
//! client that prefers it (`Accept: text/plain`), Prometheus' text format 0.0.4.
//!
//! A request must be whole within a deadline (2 s in service) and not larger than 8 KiB. At
//! most [`MAX_CONNECTIONS`] are served at once; a connection beyond them takes the place of
//! the oldest one still sending its request, so that connections that hold half a request
//! (issue 49, finding 9) cannot keep a scrape waiting. Everything runs on one thread
//! (`cy-metrics`) with a runtime of its own, away from the packet path.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{ACCEPT, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;

use super::text;

/// The content type of the OpenMetrics text format.
pub(super) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of Prometheus' text format.
pub(super) const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Largest request read (hyper's smallest buffer limit).
const MAX_REQUEST: usize = 8192;
/// Connections served at once at most.
pub const MAX_CONNECTIONS: usize = 32;
/// How long an answer may take to write, after its request's deadline.
const WRITE_TIME: Duration = Duration::from_secs(5);

/// A connection being served: how to end it, and whether its request is whole (it is being
/// answered: it is not taken back).
#[derive(Debug)]
struct Open {
    task: tokio::task::AbortHandle,
    answering: Arc<AtomicBool>,
}

/// Accepts on `listener` and serves `registry` until `stop` says so (a sender dropped
/// unsent lets it serve for good); connections still open then are closed.
pub(super) async fn accept(
    listener: std::net::TcpListener,
    registry: Arc<Registry>,
    deadline: Duration,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "the metrics endpoint cannot serve its socket");
            return;
        }
    };
    // A sender dropped unsent: never stop.
    let stop = async move {
        if stop.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(stop);
    let mut open: VecDeque<Open> = VecDeque::new();
    loop {
        let stream = tokio::select! {
            () = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin.
                    tracing::debug!(error = %e, "accepting a metrics connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        open.retain(|c| !c.task.is_finished());
        if open.len() >= MAX_CONNECTIONS {
            let Some(at) = open
                .iter()
                .position(|c| !c.answering.load(Ordering::Acquire))
            else {
                drop(stream);
                continue;
            };
            if let Some(old) = open.remove(at) {
                old.task.abort();
            }
        }
        let answering = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(serve(stream, registry.clone(), answering.clone(), deadline));
        open.push_back(Open {
            task: task.abort_handle(),
            answering,
        });
    }
}

/// Serves one connection: one request, whole within `deadline`; `answering` is set once it
/// is.
async fn serve(
    stream: tokio::net::TcpStream,
    registry: Arc<Registry>,
    answering: Arc<AtomicBool>,
    deadline: Duration,
) {
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        answering.store(true, Ordering::Release);
        let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
        let response = respond(&registry, req.method(), req.uri().path(), accept);
        async move { Ok::<_, Infallible>(response) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(deadline)
        .keep_alive(false)
        .max_buf_size(MAX_REQUEST);
    let conn = http.serve_connection(TokioIo::new(stream), service);
    // hyper's header timeout bounds the request; this bounds the whole exchange.
    if let Ok(Err(e)) = tokio::time::timeout(deadline + WRITE_TIME, conn).await {
        tracing::debug!(error = %e, "metrics request");
    }
}

/// The answer to `method path` from a client that accepts `accept`.
fn respond(
    registry: &Registry,
    method: &Method,
    path: &str,
    accept: Option<&str>,
) -> Response<Full<Bytes>> {
    if path != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "the metrics are at /metrics\n");
    }
    if method != Method::GET && method != Method::HEAD {
        let mut r = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "the metrics are read with GET or HEAD\n",
        );
        r.headers_mut()
            .insert(ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let Ok(openmetrics) = super::render(registry) else {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n");
    };
    let (kind, body) = match Format::negotiate(accept) {
        Format::OpenMetrics => (OPENMETRICS, openmetrics),
        Format::Text => (TEXT, text::from_openmetrics(&openmetrics)),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut()
        .insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(kind));
    r
}

/// A short text answer with `status`.
fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The two encodings served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    OpenMetrics,
    Text,
}

impl Format {
    /// The one `accept` (an `Accept` header) prefers by its weights (RFC 9110 §12.5.1):
    /// Prometheus' text format only when it weighs more than OpenMetrics; OpenMetrics
    /// without a header, for `*/*`, and for types we do not serve.
    fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Self::OpenMetrics;
        };
        let (mut openmetrics, mut text, mut any) = (None::<f32>, None::<f32>, None::<f32>);
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
            let weight = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            let slot = match media.as_str() {
                "application/openmetrics-text" => &mut openmetrics,
                "text/plain" | "text/*" => &mut text,
                "*/*" => &mut any,
                _ => continue,
            };
            *slot = Some(slot.map_or(weight, |w| w.max(weight)));
        }
        let openmetrics = openmetrics.or(any).unwrap_or(0.0);
        let text = text.or(any).unwrap_or(0.0);
        if text > openmetrics {
            Self::Text
        } else {
            Self::OpenMetrics
        }
    }
}

/// The address the endpoint is bound to, as a client reaches it (an unspecified address as
/// loopback).
pub(super) fn reachable(local: SocketAddr) -> SocketAddr {
    let ip = match local.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    SocketAddr::new(ip, local.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Prometheus 2.x sends, curl's default, and a client that asks for text alone.
    #[test]
    fn the_accept_header_chooses_the_encoding() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(None), Format::OpenMetrics);
        assert_eq!(Format::negotiate(Some("*/*")), Format::OpenMetrics);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Text);
        assert_eq!(
            Format::negotiate(Some("text/plain;version=0.0.4")),
            Format::Text
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0.2, text/plain;q=0.9")),
            Format::Text
        );
        assert_eq!(Format::negotiate(Some("TEXT/*")), Format::Text);
        assert_eq!(
            Format::negotiate(Some("text/plain;q=0.1, */*")),
            Format::OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some("application/json")),
            Format::OpenMetrics
        );
    }
}

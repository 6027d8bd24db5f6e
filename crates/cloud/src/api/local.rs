//! The local admin socket (docs/protocol.md §8): the `/api/v1` endpoints, and nothing else,
//! on a Unix socket of mode 0600, for the cloud's own command line. The caller is the
//! socket's peer (`SO_PEERCRED`): root or the cloud's own user is `cli:<user>` with the
//! admin scope; anyone else is refused.

use std::sync::Arc;

use hyper_util::rt::{TokioIo, TokioTimer};

use super::Limits;
use crate::admin::Who;

/// Connections open at once on the admin socket.
pub const LOCAL_CONNECTIONS: usize = 16;

/// Who is at the other end of a local connection: `None` for a user who may not use the
/// socket. Only [`serve_local`] puts it on a request.
#[derive(Debug, Clone)]
pub(super) struct Peer {
    pub(super) who: Option<Who>,
}

impl Peer {
    /// The peer whose user is `uid` (none known: refused), seen by a cloud running as `own`.
    fn of(uid: Option<u32>, own: u32) -> Self {
        Self {
            who: uid.filter(|&u| u == 0 || u == own).map(Who::local),
        }
    }
}

/// Serves `router` ([`super::local_router`]) on `listener`: HTTP/1.1, at most
/// [`LOCAL_CONNECTIONS`] at once (more are closed at once), each held to `limits`' header
/// and lifetime times; every request carries its connection's peer.
pub async fn serve_local(listener: tokio::net::UnixListener, router: axum::Router, limits: Limits) {
    let own = nix::unistd::geteuid().as_raw();
    let open = Arc::new(tokio::sync::Semaphore::new(LOCAL_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "the admin socket could not accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let peer = Peer::of(stream.peer_cred().ok().map(|c| c.uid()), own);
        let router = router.clone();
        let service =
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(peer.clone());
                tower::ServiceExt::oneshot(router.clone(), req)
            });
        tokio::spawn(async move {
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(limits.lifetime, served).await;
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root and the cloud's own user are admitted, as `cli:<user>`; anyone else, or a peer
    /// whose user is unknown, is not.
    #[test]
    fn only_root_and_the_clouds_user_are_admitted() {
        let own = 4242;
        assert_eq!(Peer::of(Some(0), own).who, Some(Who::local(0)));
        assert_eq!(Peer::of(Some(own), own).who, Some(Who::local(own)));
        assert_eq!(Peer::of(Some(1000), own).who, None);
        assert_eq!(Peer::of(None, own).who, None);
        assert_eq!(Who::local(0).actor, "cli:root");
    }
}

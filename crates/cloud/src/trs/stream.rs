//! The relay's stream side (docs/protocol.md §4, *Relay over a stream*): a TCP listener, in
//! TLS when the relay has a certificate, whose connections carry the datagrams of the
//! channels their client bound over them, each after its length and its channel's port.
//!
//! A connection is read by one task and written by another from a bounded queue (a slow
//! reader loses its own datagrams, counted, and holds up nobody). Until it binds a side, it
//! holds a place among the relay's unbound connections, shared fairly between sources as the
//! control port's ([`Unproven`]); it must bind within 10 s, and it closes once no side has
//! been bound to it for 10 s.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cyphonic_control::relay::{At, STREAM_MAX_DATAGRAM, STREAM_OWN_PORT, Verdict};
use cyphonic_control::{STREAM_NONCE_LEN, StreamBind, stream_hello_frame};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::{Trs, bump};
use crate::guard::Ticket;

/// Connections that have bound nothing yet, in all...
pub(super) const MAX_UNBOUND: usize = 256;
/// ... and from one source (an IPv4 address, an IPv6 /64).
pub(super) const MAX_UNBOUND_PER_SOURCE: usize = 8;
/// A connection's TLS handshake must be done within this.
const TLS_WITHIN: Duration = Duration::from_secs(5);
/// A connection must bind within this, and closes once no side was bound to it this long.
const BOUND_WITHIN: Duration = Duration::from_secs(10);
/// Channels one connection binds at most.
const MAX_CHANNELS: usize = 64;
/// Messages waiting to go out on one connection.
const QUEUE: usize = 256;

/// What a connection reads and writes: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One connection, as its reader and its watchdog share it.
struct Conn {
    id: u64,
    nonce: [u8; STREAM_NONCE_LEN],
    from: SocketAddr,
    /// The ports of the channels it bound.
    bound: Mutex<HashSet<u16>>,
    /// Told at its first bind.
    first_bind: tokio::sync::Notify,
}

impl Conn {
    fn bound(&self) -> std::sync::MutexGuard<'_, HashSet<u16>> {
        self.bound.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Trs {
    /// Serves the stream listener until the relay stops.
    pub async fn serve_streams(self: Arc<Self>, listener: TcpListener) {
        let tls = self
            .config
            .stream
            .as_ref()
            .and_then(|s| s.tls.as_ref())
            .map(|t| tokio_rustls::TlsAcceptor::from(t.config.clone()));
        let mut closing = self.closing.subscribe();
        loop {
            let accepted = tokio::select! {
                _ = closing.changed() => return,
                r = listener.accept() => r,
            };
            let (tcp, from) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, most likely: let some close.
                    tracing::warn!(error = %e, "relay stream: accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(ticket) = self.unbound.enter(from.ip()) else {
                bump(&self.stats.streams_refused);
                continue;
            };
            bump(&self.stats.streams);
            tokio::spawn(self.clone().connection(tcp, from, ticket, tls.clone()));
        }
    }

    /// One connection, from its TLS handshake to its close.
    async fn connection(
        self: Arc<Self>,
        tcp: TcpStream,
        from: SocketAddr,
        ticket: Ticket,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) {
        // Datagrams, not a byte stream: each goes out as soon as it is written.
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn Io> = match tls {
            Some(acceptor) => {
                let done = tokio::select! {
                    r = tokio::time::timeout(TLS_WITHIN, acceptor.accept(tcp)) => r.ok().and_then(Result::ok),
                    () = ticket.evicted() => None,
                };
                let Some(s) = done else {
                    bump(&self.stats.streams_refused);
                    return;
                };
                Box::new(s)
            }
            None => Box::new(tcp),
        };
        let conn = Conn {
            id: self.next_stream.fetch_add(1, Ordering::Relaxed),
            nonce: super::random_token(),
            from,
            bound: Mutex::new(HashSet::new()),
            first_bind: tokio::sync::Notify::new(),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
        let hello = cyphonic_control::relay::stream_message(
            STREAM_OWN_PORT,
            &stream_hello_frame(&conn.nonce),
        );
        if let Some(h) = hello {
            let _ = tx.try_send(h);
        }
        self.streams.insert(conn.id, tx);
        let (mut rd, wr) = tokio::io::split(io);
        let mut closing = self.closing.subscribe();
        let why = tokio::select! {
            why = self.read(&mut rd, &conn) => why,
            why = write(wr, rx) => why,
            why = self.watch(&conn, ticket) => why,
            _ = closing.changed() => "the relay is stopping",
        };
        self.streams.remove(&conn.id);
        for port in conn.bound().iter() {
            if let Some(c) = self.by_port.get(port) {
                c.binding
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .stream_closed(conn.id);
            }
        }
        tracing::debug!(%from, conn = conn.id, reason = why, "relay stream closed");
    }

    /// Reads the connection's messages and does what each channel's rule says of them.
    async fn read(&self, rd: &mut (impl AsyncRead + Unpin), conn: &Conn) -> &'static str {
        let mut buf = vec![0u8; 2 + STREAM_MAX_DATAGRAM];
        loop {
            let mut prefix = [0u8; 2];
            if rd.read_exact(&mut prefix).await.is_err() {
                return "closed by the client";
            }
            let Some(n) = cyphonic_control::relay::stream_length(prefix) else {
                bump(&self.stats.streams_refused);
                return "a message beyond the bound";
            };
            if rd.read_exact(&mut buf[..n]).await.is_err() {
                return "closed by the client";
            }
            let port = u16::from_be_bytes([buf[0], buf[1]]);
            let datagram = &buf[2..n];
            let channel = self.by_port.get(&port).map(|c| c.clone());
            let Some(channel) = channel else {
                bump(&self.stats.refused);
                continue;
            };
            let new_bind = StreamBind::parse(datagram).is_some() && !conn.bound().contains(&port);
            if new_bind && conn.bound().len() >= MAX_CHANNELS {
                bump(&self.stats.refused);
                continue;
            }
            let verdict = channel.judge(|s| s.stream(datagram, conn.id, &conn.nonce));
            if matches!(verdict, Verdict::Bound { .. }) {
                conn.bound().insert(port);
                conn.first_bind.notify_one();
            }
            self.act(&channel, verdict, datagram, conn.from).await;
        }
    }

    /// Ends a connection that is evicted or binds nothing within [`BOUND_WITHIN`] (its
    /// `ticket` is its place among the unbound ones until it binds), or that has had no
    /// side bound to it for as long.
    async fn watch(&self, conn: &Conn, ticket: Ticket) -> &'static str {
        tokio::select! {
            () = ticket.evicted() => {
                bump(&self.stats.streams_refused);
                return "evicted for a source holding fewer unbound connections";
            }
            () = tokio::time::sleep(BOUND_WITHIN) => {
                bump(&self.stats.streams_refused);
                return "nothing bound in time";
            }
            () = conn.first_bind.notified() => {}
        }
        drop(ticket);
        let mut tick = tokio::time::interval(BOUND_WITHIN / 5);
        let mut alone_since: Option<Instant> = None;
        loop {
            tick.tick().await;
            let ports: Vec<u16> = conn.bound().iter().copied().collect();
            let holds = ports.iter().any(|p| {
                self.by_port.get(p).is_some_and(|c| {
                    c.binding
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .bound()
                        .contains(&Some(At::Stream(conn.id)))
                })
            });
            if holds {
                alone_since = None;
            } else if alone_since.get_or_insert_with(Instant::now).elapsed() >= BOUND_WITHIN {
                return "no side bound to it any more";
            }
        }
    }
}

/// Writes the connection's queue out, flushing once the queue is empty.
async fn write(
    mut wr: impl AsyncWrite + Unpin,
    mut rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
) -> &'static str {
    while let Some(m) = rx.recv().await {
        if wr.write_all(&m).await.is_err() {
            return "closed by the client";
        }
        while let Ok(m) = rx.try_recv() {
            if wr.write_all(&m).await.is_err() {
                return "closed by the client";
            }
        }
        if wr.flush().await.is_err() {
            return "closed by the client";
        }
    }
    "its queue closed"
}

//! The relay over a stream, client side (docs/protocol.md §4, *Relay over a stream*): relay
//! channels carried over one TCP connection per relay, in TLS when the cloud gave the
//! digest of the relay's certificate, for an end whose UDP to the cloud fails.
//!
//! To the engine each channel carried so is a UDP address of this host's own (a socket on
//! loopback, or on the tunnel socket's address when it has one): what the tunnel socket
//! sends there goes on the stream after the channel's port, and what the stream brings for
//! the channel leaves from there to the tunnel socket. So the data plane is unchanged. The
//! channel's UDP binds the engine sends there are not passed on: the stream binds each
//! channel itself, with the connection's nonce, at every (re)connection.
//!
//! [`Streams`] runs its own thread with its own runtime: nothing here blocks the caller, and
//! the datagrams it carries never wait on the control loop.

#![forbid(unsafe_code)]

mod pin;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cyphonic_control::relay::{STREAM_OWN_PORT, stream_length, stream_message};
use cyphonic_control::{Bind, RelayInfo, parse_stream_hello, stream_bind_frame};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::mpsc;

cyphonic_telemetry::counters! {
    /// The relay streams' counters.
    pub struct StreamStats {
        /// Connections to a relay's stream listener made (TLS done and hello read).
        connects,
        /// Connection attempts that failed (refused, timed out, TLS or the pinned certificate refused, no hello).
        connect_failures,
        /// Channels bound over a stream (a bind sent on a connection).
        binds,
        /// Datagrams the tunnel socket sent through a stream.
        sent,
        /// Datagrams a stream brought to the tunnel socket.
        received,
        /// Datagrams dropped: the queue to the stream full (the connection slow or down).
        queue_drops,
        /// Datagrams dropped on a channel's local socket from anyone but the tunnel socket.
        foreign,
        /// Datagrams a stream brought for a channel not carried here.
        unknown_channel,
    }
}

/// How long a connection may take to be made, TLS and hello included.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);
/// The longest wait before connecting again.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Datagrams waiting to go on one relay's stream.
const QUEUE: usize = 512;
/// Largest datagram read from the tunnel socket.
const MAX_DATAGRAM: usize = cyphonic_control::relay::STREAM_MAX_DATAGRAM;

/// Why a channel cannot be carried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The relay description has no stream listener.
    #[error("the relay offers no stream")]
    NoStream,
    /// The certificate digest the cloud gave does not read.
    #[error("{0}")]
    Digest(String),
    /// The channel's local socket could not be opened.
    #[error("opening the channel's local socket: {0}")]
    Io(#[from] std::io::Error),
}

/// One channel carried over a stream.
#[derive(Debug)]
struct Chan {
    /// Its side's token.
    token: [u8; 16],
    /// Its local socket: the channel's address to the engine.
    sock: Arc<UdpSocket>,
    /// The tunnel socket, as that socket reaches it.
    tunnel: SocketAddr,
    /// The task reading that socket.
    task: tokio::task::AbortHandle,
}

/// The channels carried over one relay's stream, by channel port.
type Table = Arc<Mutex<HashMap<u16, Chan>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One relay's stream: its channels and its task's inputs.
#[derive(Debug)]
struct Link {
    table: Table,
    /// Channel ports to bind on the current connection.
    binds: mpsc::Sender<u16>,
    /// Datagrams to send, each already a stream message.
    out: mpsc::Sender<Vec<u8>>,
}

/// Which relay channels are carried over a stream, and where: readable from any thread
/// (the status document's).
#[derive(Debug, Clone, Default)]
pub struct Carried(Arc<Mutex<HashMap<SocketAddr, SocketAddr>>>);

impl Carried {
    /// The channel (its address at the relay) that the local address `local` stands for.
    pub fn channel_of(&self, local: SocketAddr) -> Option<SocketAddr> {
        lock(&self.0)
            .iter()
            .find_map(|(relay, l)| (*l == local).then_some(*relay))
    }
}

/// The relay streams of one end: channels carried, by relay.
#[derive(Debug)]
pub struct Streams {
    runtime: tokio::runtime::Handle,
    /// Where the channels' local sockets send: the tunnel socket, as this host reaches it.
    tunnel: SocketAddr,
    links: Mutex<HashMap<SocketAddr, Link>>,
    /// The channels carried: the channel's UDP address to its local address.
    carried: Carried,
    /// Counters.
    pub stats: Arc<StreamStats>,
    /// Ends the thread when dropped.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Where this host reaches a socket bound to `listen`: itself, or loopback of its version
/// when it is bound to every address.
pub fn reach_of(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

impl Streams {
    /// Starts the streams' thread for an end whose tunnel socket is bound to `listen`.
    ///
    /// # Errors
    /// The thread or its runtime cannot start.
    pub fn start(listen: SocketAddr) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("relay-stream".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Self {
            runtime: handle,
            tunnel: reach_of(listen),
            links: Mutex::new(HashMap::new()),
            carried: Carried::default(),
            stats: Arc::new(StreamStats::default()),
            _stop: stop,
        })
    }

    /// Carries the channel `relay` over its relay's stream: the address that stands for the
    /// channel to the engine (the same while it is carried).
    ///
    /// # Errors
    /// No stream in `relay`, a digest that does not read, no local socket.
    pub fn open(&self, relay: &RelayInfo) -> Result<SocketAddr, StreamError> {
        let stream = relay.stream.as_ref().ok_or(StreamError::NoStream)?;
        let digest = stream.tls_digest().map_err(StreamError::Digest)?;
        let port = relay.address.port();
        let mut links = lock(&self.links);
        let link = links.entry(stream.address).or_insert_with(|| {
            let (binds, binds_rx) = mpsc::channel(64);
            let (out, out_rx) = mpsc::channel(QUEUE);
            let table = Table::default();
            self.runtime.spawn(run_link(
                stream.address,
                digest,
                table.clone(),
                (binds_rx, out_rx),
                self.stats.clone(),
            ));
            Link { table, binds, out }
        });
        let mut table = lock(&link.table);
        if let Some(c) = table.get(&port)
            && c.token == relay.token
        {
            return Ok(c.sock.local_addr()?);
        }
        let (std, tunnel) = match std::net::UdpSocket::bind(SocketAddr::new(self.tunnel.ip(), 0)) {
            Ok(s) => (s, self.tunnel),
            // A tunnel socket on every address of a host whose loopback has no IPv6: its
            // IPv4 side.
            Err(e) if self.tunnel.ip() == IpAddr::V6(Ipv6Addr::LOCALHOST) => {
                let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), self.tunnel.port());
                let s = std::net::UdpSocket::bind(SocketAddr::new(v4.ip(), 0)).map_err(|_| e)?;
                (s, v4)
            }
            Err(e) => return Err(e.into()),
        };
        std.set_nonblocking(true)?;
        let sock = {
            let _in = self.runtime.enter();
            Arc::new(UdpSocket::from_std(std)?)
        };
        let local = sock.local_addr()?;
        let task = self
            .runtime
            .spawn(carry_out(
                sock.clone(),
                port,
                tunnel,
                link.out.clone(),
                self.stats.clone(),
            ))
            .abort_handle();
        if let Some(old) = table.insert(
            port,
            Chan {
                token: relay.token,
                sock,
                tunnel,
                task,
            },
        ) {
            old.task.abort();
        }
        drop(table);
        // A full queue means binds are pending anyway: the next connection binds them all.
        let _ = link.binds.try_send(port);
        lock(&self.carried.0).insert(relay.address, local);
        tracing::info!(relay = %relay.address, stream = %stream.address, %local, tls = digest.is_some(), "relay channel carried over a stream");
        Ok(local)
    }

    /// The local address standing for the channel at `relay`, while it is carried.
    pub fn local_of(&self, relay: SocketAddr) -> Option<SocketAddr> {
        lock(&self.carried.0).get(&relay).copied()
    }

    /// Which channels are carried, as it changes.
    pub fn carried(&self) -> Carried {
        self.carried.clone()
    }

    /// Stops carrying the channel at `relay` once `after` has passed (its datagrams still on
    /// the way arrive meanwhile).
    pub fn close(&self, relay: SocketAddr, after: Duration) {
        let Some(local) = lock(&self.carried.0).remove(&relay) else {
            return;
        };
        let tables: Vec<Table> = lock(&self.links)
            .values()
            .map(|l| l.table.clone())
            .collect();
        let port = relay.port();
        let carried = self.carried.clone();
        self.runtime.spawn(async move {
            tokio::time::sleep(after).await;
            // Carried again meanwhile (UDP failed again): it stays.
            if lock(&carried.0).contains_key(&relay) {
                return;
            }
            for t in tables {
                let mut t = lock(&t);
                let ours = t
                    .get(&port)
                    .is_some_and(|c| c.sock.local_addr().ok() == Some(local));
                if ours && let Some(c) = t.remove(&port) {
                    c.task.abort();
                }
            }
            tracing::info!(%relay, %local, "relay channel no longer carried over a stream");
        });
    }
}

/// Reads what the tunnel socket sends to a channel's local socket and queues it for the
/// stream, after the channel's `port`.
async fn carry_out(
    sock: Arc<UdpSocket>,
    port: u16,
    tunnel: SocketAddr,
    out: mpsc::Sender<Vec<u8>>,
    stats: Arc<StreamStats>,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        if from != tunnel {
            bump(&stats.foreign);
            continue;
        }
        let datagram = &buf[..n];
        // The engine's UDP binds to the channel: the stream binds itself.
        if Bind::parse(datagram).is_some() {
            continue;
        }
        match stream_message(port, datagram).map(|m| out.try_send(m)) {
            Some(Ok(())) => bump(&stats.sent),
            _ => bump(&stats.queue_drops),
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What a connection reads and writes: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One relay's stream: connects, binds every channel, carries datagrams both ways, and
/// connects again after 1, 2, 4 … 30 s when the connection ends.
async fn run_link(
    relay: SocketAddr,
    digest: Option<[u8; 32]>,
    table: Table,
    (mut binds, mut out): (mpsc::Receiver<u16>, mpsc::Receiver<Vec<u8>>),
    stats: Arc<StreamStats>,
) {
    let mut backoff = Duration::from_secs(1);
    loop {
        // Nothing to carry: wait for a channel rather than hold a connection.
        if lock(&table).is_empty() && binds.recv().await.is_none() {
            return;
        }
        let connected = tokio::time::timeout(CONNECT_WITHIN, connect(relay, digest)).await;
        let (io, nonce) = match connected {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                bump(&stats.connect_failures);
                tracing::warn!(%relay, error = %e, retry_in = ?backoff, "relay stream: no connection");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
            Err(_) => {
                bump(&stats.connect_failures);
                tracing::warn!(%relay, retry_in = ?backoff, "relay stream: no connection in time");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        bump(&stats.connects);
        backoff = Duration::from_secs(1);
        tracing::info!(%relay, "relay stream connected");
        let (mut rd, mut wr) = tokio::io::split(io);
        // What was queued while no connection was up is stale or bound elsewhere.
        while out.try_recv().is_ok() {}
        while binds.try_recv().is_ok() {}
        let why = tokio::select! {
            why = read(&mut rd, &table, &stats) => why,
            why = write(&mut wr, &table, &nonce, &mut binds, &mut out, &stats) => why,
        };
        tracing::warn!(%relay, reason = why, "relay stream closed");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// A connection to `relay`, in TLS pinned to `digest` if any, and the nonce of its hello.
async fn connect(
    relay: SocketAddr,
    digest: Option<[u8; 32]>,
) -> std::io::Result<(Box<dyn Io>, [u8; 16])> {
    let tcp = TcpStream::connect(relay).await?;
    // Datagrams, not a byte stream: each goes out as soon as it is written.
    tcp.set_nodelay(true)?;
    let mut io: Box<dyn Io> = match digest {
        Some(d) => {
            let name = rustls::pki_types::ServerName::IpAddress(relay.ip().into());
            let tls = tokio_rustls::TlsConnector::from(pin::client_config(d))
                .connect(name, tcp)
                .await?;
            Box::new(tls)
        }
        None => Box::new(tcp),
    };
    let mut buf = [0u8; 64];
    let (port, hello) = read_message(&mut io, &mut buf).await?;
    let nonce = (port == STREAM_OWN_PORT)
        .then(|| parse_stream_hello(hello))
        .flatten()
        .ok_or_else(|| std::io::Error::other("the relay's first message is no hello"))?;
    Ok((io, nonce))
}

/// One message, read into `buf`: its channel port and its datagram. A length beyond the
/// bound, or beyond `buf`, is `InvalidData`.
async fn read_message<'b>(
    rd: &mut (impl AsyncRead + Unpin),
    buf: &'b mut [u8],
) -> std::io::Result<(u16, &'b [u8])> {
    let mut prefix = [0u8; 2];
    rd.read_exact(&mut prefix).await?;
    let message = stream_length(prefix)
        .and_then(|n| buf.get_mut(..n))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a message beyond the bound",
            )
        })?;
    rd.read_exact(message).await?;
    let (port, datagram) = message.split_at(2);
    Ok((u16::from_be_bytes([port[0], port[1]]), datagram))
}

/// Hands what the stream brings to the tunnel socket, from each channel's local socket.
async fn read(
    rd: &mut (impl AsyncRead + Unpin),
    table: &Table,
    stats: &StreamStats,
) -> &'static str {
    let mut buf = vec![0u8; 2 + MAX_DATAGRAM];
    loop {
        let (port, datagram) = match read_message(rd, &mut buf).await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return "a message beyond the bound";
            }
            Err(_) => return "closed by the relay",
        };
        let sock = lock(table).get(&port).map(|c| (c.sock.clone(), c.tunnel));
        let Some((sock, tunnel)) = sock else {
            bump(&stats.unknown_channel);
            continue;
        };
        // A full socket buffer at the tunnel socket drops it, as the network would.
        if sock.try_send_to(datagram, tunnel).is_ok() {
            bump(&stats.received);
        }
    }
}

/// Binds every channel on the connection whose hello carried `nonce`, then each new one,
/// and writes the queued datagrams, flushing once the queue is empty.
async fn write(
    wr: &mut (impl AsyncWrite + Unpin),
    table: &Table,
    nonce: &[u8; 16],
    binds: &mut mpsc::Receiver<u16>,
    out: &mut mpsc::Receiver<Vec<u8>>,
    stats: &StreamStats,
) -> &'static str {
    let bind = |port: u16| {
        let token = lock(table).get(&port).map(|c| c.token)?;
        stream_message(port, &stream_bind_frame(&token, port, nonce))
    };
    let all: Vec<u16> = lock(table).keys().copied().collect();
    for port in all {
        if let Some(m) = bind(port) {
            if wr.write_all(&m).await.is_err() {
                return "closed by the relay";
            }
            bump(&stats.binds);
        }
    }
    loop {
        let first = tokio::select! {
            p = binds.recv() => match p.and_then(bind) {
                Some(m) => {
                    bump(&stats.binds);
                    m
                }
                None => continue,
            },
            m = out.recv() => match m {
                Some(m) => m,
                None => return "stopped",
            },
        };
        if wr.write_all(&first).await.is_err() {
            return "closed by the relay";
        }
        while let Ok(m) = out.try_recv() {
            if wr.write_all(&m).await.is_err() {
                return "closed by the relay";
            }
        }
        if wr.flush().await.is_err() {
            return "closed by the relay";
        }
    }
}

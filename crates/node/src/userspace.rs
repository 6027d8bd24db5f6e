//! The node without a TUN device (issue 55, `[userspace]`): the overlay's TCP runs in the
//! process ([`cyphonic_netstack::Stack`]), reached through a SOCKS5 proxy and static forwards
//! on loopback. No device, no privileges, nothing Linux-only here: the engine below is the
//! same as the TUN node's, with the same identity, enrollment, policy and renewal.
//!
//! ```text
//! cy-ingress-emit  StackSink (after the engine's Incoming::accept): overlay::inbound (from the
//!                  peer's certified blocks, to our vIP) -> a bounded channel
//! cy-stack         one thread, tokio on it: the Stack polled when packets come, when a
//!                  connection's bytes move and on its timers; what it makes ->
//!                  overlay::outbound -> tunnel::Intake. Local clients: SOCKS5 (CONNECT,
//!                  no authentication) or a forward's fixed target -> a name asked of the
//!                  DNS stub -> a connection of the Stack -> bytes both ways. The stub's
//!                  messages to the overlay, and peers' questions to our vIP's port 53,
//!                  cross the Stack's UDP port 53 (dns_link)
//! ```
//!
//! Each connection's bytes cross between its local socket (its own task) and the stack in
//! chunks over two bounded channels: a full channel leaves the bytes in the stack's buffer,
//! so the far end's window closes instead of memory growing.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cyphonic_gateway::complete_deferred_checksum;
use cyphonic_netstack::{Conn, ConnectError, Limits, Phase, Stack, Udp};
use cyphonic_pipeline::{DropReason, Sink};
use cyphonic_tunnel::{Accepted, HEADROOM, Intake, PACKET_ROOM, Shared, Submit, bump};
use cyphonic_wire::FLAG_CHECKSUM_DEFERRED;
use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use socks5_proto::handshake::{self, Method};
use socks5_proto::{Address, Command, Reply, Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc::error::{TryRecvError, TrySendError};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::config::Userspace;
use crate::dns::OverlayDns;
use crate::overlay::{NodeCounters, Ours, admit, destination};

/// Packets waiting between the ingress emitter and the stack's thread.
const INBOUND_QUEUE: usize = 1024;
/// Bytes moved at a time between a local socket and the stack.
const CHUNK: usize = 16 * 1024;
/// Chunks waiting each way per connection.
const CHUNKS: usize = 8;
/// How long a SOCKS5 client has to say where it goes.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);
/// How long a name is looked up.
const RESOLVE_WAIT: Duration = Duration::from_secs(5);
/// The longest the thread sleeps without a reason (it looks whether the engine stopped).
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// Rounds of poll and pump per wake-up, before the thread looks at its channels again.
const ROUNDS: usize = 8;

/// What the sink and the stack's thread share.
#[derive(Debug)]
pub struct StackSide {
    /// Our addresses and the overlay's.
    pub ours: Ours,
    /// The node's counters.
    pub counters: NodeCounters,
    to_stack: mpsc::Sender<Vec<u8>>,
}

impl StackSide {
    /// The side, and the channel's end the stack's thread reads.
    pub fn new(ours: Ours) -> (Arc<Self>, mpsc::Receiver<Vec<u8>>) {
        let (to_stack, from_sink) = mpsc::channel(INBOUND_QUEUE);
        let side = Self {
            ours,
            counters: NodeCounters::default(),
            to_stack,
        };
        (Arc::new(side), from_sink)
    }
}

/// The ingress emitter's end: packets for us go to the stack's thread, in arrival order.
#[derive(Debug)]
pub struct StackSink {
    side: Arc<StackSide>,
}

impl StackSink {
    /// The sink feeding `side`'s stack.
    pub fn new(side: Arc<StackSide>) -> Self {
        Self { side }
    }
}

impl Sink for StackSink {
    type Item = Accepted;

    fn emit(&mut self, mut item: Accepted) -> Result<(), DropReason> {
        let c = &self.side.counters;
        admit(&item, &self.side.ours, c)?;
        let packet = item.packet();
        if item.flags() & FLAG_CHECKSUM_DEFERRED != 0 {
            // The far end left the checksum to us (docs/protocol.md §1): the stack checks it.
            complete_deferred_checksum(&mut item.buf_mut()[packet.clone()]);
        }
        match self.side.to_stack.try_send(item.buf()[packet].to_vec()) {
            Ok(()) => {
                bump(&c.stack_received);
                Ok(())
            }
            Err(_) => {
                bump(&c.drop_stack_full);
                Err(DropReason::Unroutable)
            }
        }
    }
}

/// DNS messages waiting each way between the stub and the stack.
const DNS_QUEUE: usize = 64;
/// The DNS port: the stub's messages to the overlay leave from it, peers ask us on it.
const DNS_PORT: u16 = 53;

/// The stack's side of the stub's way to the overlay ([`OverlayDns`] is the stub's).
#[derive(Debug)]
pub struct StackDns {
    /// The stub's messages for the overlay.
    out: mpsc::Receiver<(Vec<u8>, SocketAddr)>,
    /// What came to our vIP's DNS port, for the stub.
    inbound: mpsc::Sender<(Vec<u8>, SocketAddr)>,
}

/// The two sides of the stub's way to the overlay through the stack.
pub fn dns_link() -> (OverlayDns, StackDns) {
    let (out, from_stub) = mpsc::channel(DNS_QUEUE);
    let (to_stub, inbound) = mpsc::channel(DNS_QUEUE);
    (
        OverlayDns { out, inbound },
        StackDns {
            out: from_stub,
            inbound: to_stub,
        },
    )
}

/// Where a local listener's connections go.
#[derive(Debug, Clone)]
enum Target {
    /// Where the client says, in SOCKS5.
    Socks,
    /// A forward's fixed name or address and port.
    Fixed(String, u16),
}

/// The local listeners, bound when the node starts (a port in use stops it there).
#[derive(Debug)]
pub struct Listeners(Vec<(std::net::TcpListener, Target)>);

impl Listeners {
    /// Binds the proxy and the forwards `u` names.
    ///
    /// # Errors
    /// An address cannot be bound (in use, not local).
    pub fn bind(u: &Userspace) -> anyhow::Result<Self> {
        let bind = |a: SocketAddr| -> anyhow::Result<std::net::TcpListener> {
            let l = std::net::TcpListener::bind(a).with_context(|| format!("listening on {a}"))?;
            l.set_nonblocking(true)
                .with_context(|| format!("listening on {a}"))?;
            Ok(l)
        };
        let mut all = Vec::new();
        if let Some(a) = u.socks5 {
            all.push((bind(a)?, Target::Socks));
            tracing::info!(listen = %a, "SOCKS5 proxy into the overlay");
        }
        for f in &u.forwards {
            all.push((bind(f.listen)?, Target::Fixed(f.host.clone(), f.port)));
            tracing::info!(listen = %f.listen, to = %format!("{}:{}", f.host, f.port), "forward into the overlay");
        }
        Ok(Self(all))
    }
}

/// The stack's thread: the stack, its packets both ways and its local clients.
pub struct StackThread {
    side: Arc<StackSide>,
    shared: Arc<Shared>,
    intake: Intake,
    from_sink: mpsc::Receiver<Vec<u8>>,
    stack: Stack,
    listeners: Listeners,
    /// The DNS stub that resolves names for the clients.
    resolver: Option<SocketAddr>,
    /// The stub's way to the overlay.
    dns: StackDns,
    /// Connections at once (the stack's bound; local clients are bounded by it too).
    connections: usize,
    /// Built before the thread starts (a failure stops the node there); taken by
    /// [`StackThread::run`].
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for StackThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackThread")
            .field("stack", &self.stack)
            .finish_non_exhaustive()
    }
}

/// A request to the stack's loop: a connection to `to`, answered with its link once open.
struct Open {
    to: SocketAddr,
    reply: oneshot::Sender<Result<Link, Unreachable>>,
}

/// A local client's ends of its connection's two channels.
struct Link {
    to_local: mpsc::Receiver<Vec<u8>>,
    from_local: mpsc::Sender<Vec<u8>>,
}

/// Why a connection was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unreachable {
    /// The stack would not open it.
    Stack(ConnectError),
    /// The far end refused, or did not answer.
    Far(Phase),
}

/// One connection of the stack and its local client's channels.
struct Bridge {
    conn: Conn,
    /// Until the connection opens: where to answer.
    reply: Option<oneshot::Sender<Result<Link, Unreachable>>>,
    /// Bytes to the client; dropped once the far end finished (the client sees the end).
    to_local: Option<mpsc::Sender<Vec<u8>>>,
    /// Bytes from the client.
    from_local: Option<mpsc::Receiver<Vec<u8>>>,
    /// A chunk from the client the stack took in part.
    pending: Option<(Vec<u8>, usize)>,
    /// The client finished sending (our FIN is queued).
    local_done: bool,
}

/// What the local clients' tasks share.
struct Clients {
    open: mpsc::Sender<Open>,
    wake: Arc<Notify>,
    resolver: Option<SocketAddr>,
    side: Arc<StackSide>,
    /// One permit per local client at once.
    permits: Arc<Semaphore>,
}

impl StackThread {
    /// The thread for `side`, its stack at our addresses with packets of at most `mtu`
    /// bytes, feeding `intake`, its clients asking names of `resolver`, the stub's messages
    /// for the overlay going out (and peers' coming in) on our DNS port through `dns`.
    ///
    /// # Errors
    /// Its runtime cannot be built.
    pub fn new(
        (side, from_sink): (Arc<StackSide>, mpsc::Receiver<Vec<u8>>),
        (shared, intake): (Arc<Shared>, Intake),
        (listeners, connections): (Listeners, usize),
        mtu: usize,
        (resolver, dns): (Option<SocketAddr>, StackDns),
    ) -> anyhow::Result<Self> {
        let limits = Limits {
            connections,
            ..Limits::default()
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .context("the userspace stack's runtime")?;
        let stack = Stack::new(side.ours, mtu, limits, Instant::now());
        Ok(Self {
            side,
            shared,
            intake,
            from_sink,
            stack,
            listeners,
            resolver,
            dns,
            connections,
            runtime: Some(runtime),
        })
    }

    /// The thread's body: runs until the engine stops.
    pub fn run(mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        runtime.block_on(self.serve());
        tracing::debug!("userspace stack stopped");
    }

    async fn serve(mut self) {
        let (open, mut opens) = mpsc::channel::<Open>(64);
        let wake = Arc::new(Notify::new());
        let clients = Arc::new(Clients {
            open,
            wake: wake.clone(),
            resolver: self.resolver,
            side: self.side.clone(),
            permits: Arc::new(Semaphore::new(self.connections)),
        });
        for (listener, target) in std::mem::take(&mut self.listeners.0) {
            match TcpListener::from_std(listener) {
                Ok(l) => {
                    tokio::spawn(accept(l, target, clients.clone()));
                }
                Err(e) => tracing::error!(error = %e, "a local listener cannot run"),
            }
        }
        let mut bridges: Vec<Bridge> = Vec::new();
        let mut buf = vec![0; CHUNK];
        let udp = self
            .stack
            .udp_bind(DNS_PORT)
            .inspect_err(|e| tracing::error!(error = %e, "the stub's port in the stack"))
            .ok();
        while self.shared.is_running() {
            let now = Instant::now();
            for _ in 0..ROUNDS {
                self.stack.poll(now);
                let moved = pump(&mut self.stack, &mut bridges, &mut buf, now);
                let answered = udp.is_some_and(|u| self.dns_in(u));
                let sent = self.send_out(now);
                if !moved && !answered && sent == 0 {
                    break;
                }
            }
            let wait = self
                .stack
                .poll_delay(now)
                .map_or(IDLE_WAIT, |d| d.min(IDLE_WAIT));
            tokio::select! {
                p = self.from_sink.recv() => {
                    let Some(p) = p else { break };
                    self.take_in(p);
                    while let Ok(p) = self.from_sink.try_recv() {
                        self.take_in(p);
                    }
                }
                o = opens.recv() => {
                    if let Some(o) = o {
                        self.open(o, &mut bridges);
                    }
                }
                m = self.dns.out.recv(), if udp.is_some() => {
                    if let (Some(u), Some((msg, to))) = (udp, m) {
                        self.dns_out(u, &msg, to);
                    }
                }
                () = wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// A DNS message of the stub's into the overlay from our DNS port.
    fn dns_out(&mut self, u: Udp, msg: &[u8], to: SocketAddr) {
        let c = &self.side.counters;
        bump(if self.stack.udp_send(u, to, msg) {
            &c.stack_dns
        } else {
            &c.drop_stack_dns
        });
    }

    /// What came to our DNS port, to the stub; whether there was any.
    fn dns_in(&mut self, u: Udp) -> bool {
        let c = &self.side.counters;
        let mut any = false;
        while let Some(got) = self.stack.udp_recv(u) {
            any = true;
            bump(if self.dns.inbound.try_send(got).is_ok() {
                &c.stack_dns
            } else {
                &c.drop_stack_dns
            });
        }
        any
    }

    /// A packet from the sink into the stack (dropped and counted if it holds too many).
    fn take_in(&mut self, p: Vec<u8>) {
        if !self.stack.receive(p) {
            bump(&self.side.counters.drop_stack_full);
        }
    }

    /// Starts the connection `o` asks for.
    fn open(&mut self, o: Open, bridges: &mut Vec<Bridge>) {
        match self.stack.connect(o.to, Instant::now()) {
            Ok(conn) => bridges.push(Bridge {
                conn,
                reply: Some(o.reply),
                to_local: None,
                from_local: None,
                pending: None,
                local_done: false,
            }),
            Err(e) => {
                let _ = o.reply.send(Err(Unreachable::Stack(e)));
            }
        }
    }

    /// Sends what the stack made into the tunnel; returns how many.
    fn send_out(&mut self, now: Instant) -> usize {
        let mut sent = 0;
        let mut guard = None;
        let pool = self.shared.pool();
        let c = &self.side.counters;
        while let Some(p) = self.stack.transmit() {
            // The stack keeps to the inner MTU, which a buffer holds: both checks before a
            // buffer is taken.
            let Some(dst) = destination(&p, &self.side.ours)
                .ok()
                .filter(|_| p.len() <= PACKET_ROOM.len())
            else {
                bump(&c.drop_stack_not_overlay);
                continue;
            };
            let Some(mut buf) = pool.take() else {
                bump(&self.shared.counters().drop_no_buffer);
                continue;
            };
            buf[HEADROOM..HEADROOM + p.len()].copy_from_slice(&p);
            let guard = guard.get_or_insert_with(|| self.intake.lock());
            let Some(sub) = guard.as_mut() else {
                // The engine is stopping.
                return sent;
            };
            sub.route(buf, p.len(), dst, 0, (now, None));
            bump(&c.stack_sent);
            sent += 1;
        }
        if let Some(sub) = guard.as_mut().and_then(|g| g.as_mut()) {
            sub.flush();
        }
        sent
    }
}

/// Moves each connection's bytes between the stack and its client, answers openings, and
/// lets go of connections that are done. Returns whether anything moved.
fn pump(stack: &mut Stack, bridges: &mut Vec<Bridge>, buf: &mut [u8], now: Instant) -> bool {
    let mut moved = false;
    bridges.retain_mut(|b| {
        let (still, m) = pump_one(stack, b, buf);
        moved |= m;
        if !still {
            stack.release(b.conn, now);
        }
        still
    });
    moved
}

/// [`pump`] for one connection: whether it stays, whether anything moved.
fn pump_one(stack: &mut Stack, b: &mut Bridge, buf: &mut [u8]) -> (bool, bool) {
    let mut moved = false;
    match stack.phase(b.conn) {
        None => return (false, true),
        Some(Phase::Opening) => {
            // A client that gave up waiting takes its connection with it.
            let gone = b.reply.as_ref().is_none_or(oneshot::Sender::is_closed);
            return (!gone, false);
        }
        Some(p @ (Phase::Refused | Phase::TimedOut)) => {
            if let Some(reply) = b.reply.take() {
                let _ = reply.send(Err(Unreachable::Far(p)));
            }
            return (false, true);
        }
        Some(Phase::Open | Phase::Closed) => {
            if let Some(reply) = b.reply.take() {
                let (to_local, to_local_rx) = mpsc::channel(CHUNKS);
                let (from_local_tx, from_local) = mpsc::channel(CHUNKS);
                let link = Link {
                    to_local: to_local_rx,
                    from_local: from_local_tx,
                };
                if reply.send(Ok(link)).is_err() {
                    return (false, true);
                }
                (b.to_local, b.from_local) = (Some(to_local), Some(from_local));
                moved = true;
            }
        }
    }
    // The far end's bytes to the client, while its channel has room.
    if let Some(tx) = &b.to_local {
        loop {
            match tx.try_reserve() {
                Ok(permit) => {
                    let n = stack.recv(b.conn, buf);
                    if n == 0 {
                        break;
                    }
                    permit.send(buf[..n].to_vec());
                    moved = true;
                }
                Err(TrySendError::Full(())) => break,
                // The client is gone: the connection is reset.
                Err(TrySendError::Closed(())) => return (false, true),
            }
        }
        if stack.finished(b.conn) {
            b.to_local = None;
            moved = true;
        }
    }
    // The client's bytes to the far end, while the stack has room.
    loop {
        if let Some((chunk, at)) = &mut b.pending {
            let n = stack.send(b.conn, &chunk[*at..]);
            *at += n;
            moved |= n > 0;
            if *at < chunk.len() {
                break;
            }
            b.pending = None;
        }
        if b.local_done {
            break;
        }
        let Some(rx) = b.from_local.as_mut() else {
            break;
        };
        match rx.try_recv() {
            Ok(chunk) => b.pending = Some((chunk, 0)),
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) => {
                b.local_done = true;
                stack.close(b.conn);
                moved = true;
            }
        }
    }
    let reset = stack.phase(b.conn) == Some(Phase::Closed) && !b.local_done;
    let both_done = b.local_done && b.pending.is_none() && b.to_local.is_none();
    if reset {
        // Whatever the client still sends has nowhere to go; what it was sent stays.
        b.from_local = None;
    }
    let over = both_done || (reset && b.to_local.is_none());
    (!over, moved)
}

/// Takes the connections of one listener.
async fn accept(listener: TcpListener, target: Target, clients: Arc<Clients>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "a local connection was not taken");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let c = &clients.side.counters;
        bump(&c.proxy_accepted);
        let Ok(permit) = clients.permits.clone().try_acquire_owned() else {
            bump(&c.proxy_refused);
            tracing::debug!("a local connection refused: too many at once");
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(client(stream, target.clone(), clients.clone(), permit));
    }
}

/// One local client: where it goes, the connection there, then its bytes both ways.
async fn client(
    mut stream: TcpStream,
    target: Target,
    clients: Arc<Clients>,
    _permit: OwnedSemaphorePermit,
) {
    let c = &clients.side.counters;
    let socks = matches!(target, Target::Socks);
    let to = match target {
        Target::Socks => {
            match tokio::time::timeout(HANDSHAKE_WAIT, socks_request(&mut stream)).await {
                Ok(Ok(to)) => to,
                Ok(Err(reply)) => {
                    bump(&c.proxy_refused);
                    if let Some(reply) = reply {
                        answer(&mut stream, reply).await;
                    }
                    return;
                }
                Err(_) => {
                    bump(&c.proxy_refused);
                    return;
                }
            }
        }
        Target::Fixed(host, port) => Address::DomainAddress(host.into_bytes(), port),
    };
    let Some(dst) = resolve(clients.resolver, &to, clients.side.ours.ipv6.is_some()).await else {
        bump(&c.proxy_refused);
        tracing::debug!(to = %to, "a local connection's name is not known");
        if socks {
            answer(&mut stream, Reply::HostUnreachable).await;
        }
        return;
    };
    let (reply, answered) = oneshot::channel();
    if clients.open.send(Open { to: dst, reply }).await.is_err() {
        return;
    }
    let link = match answered.await {
        Ok(Ok(link)) => link,
        Ok(Err(why)) => {
            let reply = match why {
                Unreachable::Stack(ConnectError::NotOverlay) => {
                    bump(&c.proxy_refused);
                    Reply::ConnectionNotAllowed
                }
                Unreachable::Stack(_) => {
                    bump(&c.proxy_refused);
                    Reply::GeneralFailure
                }
                Unreachable::Far(Phase::Refused) => {
                    bump(&c.proxy_unreachable);
                    Reply::ConnectionRefused
                }
                Unreachable::Far(_) => {
                    bump(&c.proxy_unreachable);
                    Reply::HostUnreachable
                }
            };
            tracing::debug!(to = %dst, ?why, "a local connection's overlay end is not reached");
            if socks {
                answer(&mut stream, reply).await;
            }
            return;
        }
        Err(_) => return,
    };
    if socks
        && Response::new(Reply::Succeeded, Address::unspecified())
            .write_to(&mut stream)
            .await
            .is_err()
    {
        return;
    }
    carry(stream, link, &clients.wake).await;
}

/// Reads a SOCKS5 greeting and request (RFC 1928): where the client goes. The error is the
/// reply to give, if the client is owed one.
async fn socks_request(s: &mut TcpStream) -> Result<Address, Option<Reply>> {
    let hello = handshake::Request::read_from(s).await.map_err(|_| None)?;
    if !hello.methods.contains(&Method::NONE) {
        let _ = handshake::Response::new(Method::UNACCEPTABLE)
            .write_to(s)
            .await;
        return Err(None);
    }
    handshake::Response::new(Method::NONE)
        .write_to(s)
        .await
        .map_err(|_| None)?;
    match Request::read_from(s).await {
        Ok(r) if r.command == Command::Connect => Ok(r.address),
        Ok(_) => Err(Some(Reply::CommandNotSupported)),
        Err(socks5_proto::Error::Protocol(socks5_proto::ProtocolError::InvalidCommand {
            ..
        })) => Err(Some(Reply::CommandNotSupported)),
        Err(socks5_proto::Error::Protocol(_)) => Err(Some(Reply::AddressTypeNotSupported)),
        Err(_) => Err(None),
    }
}

/// Tells a SOCKS5 client its request failed.
async fn answer(s: &mut TcpStream, reply: Reply) {
    let _ = Response::new(reply, Address::unspecified())
        .write_to(s)
        .await;
}

/// The address `to` names: as given, or its name asked of the DNS stub at `resolver` (an
/// IPv4 address first, then IPv6 where we carry it).
async fn resolve(resolver: Option<SocketAddr>, to: &Address, v6: bool) -> Option<SocketAddr> {
    match to {
        Address::SocketAddress(a) => Some(*a),
        Address::DomainAddress(name, port) => {
            let name = std::str::from_utf8(name).ok()?;
            if let Ok(ip) = name.parse::<IpAddr>() {
                return Some(SocketAddr::new(ip, *port));
            }
            let stub = resolver?;
            let kinds: &[RecordType] = if v6 {
                &[RecordType::A, RecordType::AAAA]
            } else {
                &[RecordType::A]
            };
            for &kind in kinds {
                if let Some(ip) = lookup(stub, name, kind).await {
                    return Some(SocketAddr::new(ip, *port));
                }
            }
            None
        }
    }
}

/// Ids of our questions to the stub.
static QUERY_ID: AtomicU16 = AtomicU16::new(1);

/// Asks the stub at `stub` for `name`'s address of `kind`.
async fn lookup(stub: SocketAddr, name: &str, kind: RecordType) -> Option<IpAddr> {
    let mut qname = Name::from_ascii(name).ok()?;
    qname.set_fqdn(true);
    let id = QUERY_ID.fetch_add(1, Ordering::Relaxed);
    let mut q = Message::new(id, MessageType::Query, OpCode::Query);
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(qname, kind));
    let query = q.to_vec().ok()?;
    let local: SocketAddr = if stub.is_ipv4() {
        (std::net::Ipv4Addr::LOCALHOST, 0).into()
    } else {
        (std::net::Ipv6Addr::LOCALHOST, 0).into()
    };
    let sock = UdpSocket::bind(local).await.ok()?;
    sock.connect(stub).await.ok()?;
    sock.send(&query).await.ok()?;
    let mut buf = vec![0; 4096];
    let answer = tokio::time::timeout(RESOLVE_WAIT, async {
        loop {
            let n = sock.recv(&mut buf).await.ok()?;
            match Message::from_vec(&buf[..n]) {
                Ok(a) if a.metadata.id == id => return Some(a),
                _ => {}
            }
        }
    })
    .await
    .ok()??;
    answer.answers.iter().find_map(|r| match &r.data {
        RData::A(a) if kind == RecordType::A => Some(IpAddr::V4(a.0)),
        RData::AAAA(a) if kind == RecordType::AAAA => Some(IpAddr::V6(a.0)),
        _ => None,
    })
}

/// Carries a client's bytes both ways over its link until both directions finished.
async fn carry(stream: TcpStream, link: Link, wake: &Arc<Notify>) {
    let (mut rd, mut wr) = stream.into_split();
    let Link {
        mut to_local,
        from_local,
    } = link;
    let up = async move {
        let mut buf = vec![0; CHUNK];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if from_local.send(buf[..n].to_vec()).await.is_err() {
                        break;
                    }
                    wake.notify_one();
                }
            }
        }
        // The end of the client's bytes: the stack sends its FIN.
        drop(from_local);
        wake.notify_one();
    };
    let down = async move {
        while let Some(chunk) = to_local.recv().await {
            if wr.write_all(&chunk).await.is_err() {
                // Dropping our end tells the stack: it resets the connection.
                return;
            }
            // Room in the channel: the stack may take more of the far end's bytes.
            wake.notify_one();
        }
        let _ = wr.shutdown().await;
    };
    tokio::join!(up, down);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A runtime for a test, on loopback only.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// What `socks_request` makes of `sent` from a client: its result, and every byte the
    /// client was answered before the proxy side let go.
    async fn socks_of(sent: &[u8]) -> (Result<Address, Option<Reply>>, Vec<u8>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(at).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        client.write_all(sent).await.unwrap();
        client.shutdown().await.unwrap();
        let got = socks_request(&mut server).await;
        if let Err(Some(reply)) = got {
            answer(&mut server, reply).await;
        }
        // What the proxy left unread, read: a close with bytes unread would be a reset,
        // which may take the answer with it.
        let mut unread = Vec::new();
        server.read_to_end(&mut unread).await.unwrap();
        drop(server);
        let mut answered = Vec::new();
        client.read_to_end(&mut answered).await.unwrap();
        (got, answered)
    }

    /// RFC 1928 as we speak it: CONNECT without authentication to a name or an address;
    /// anything else gets the reply the RFC gives it, or nothing when the client is owed
    /// none (not SOCKS5, no method we take, cut short). Nothing panics.
    #[test]
    fn socks_requests_are_read_strictly() {
        runtime().block_on(async {
            let greeting = [5, 1, 0];
            let connect_name = [&greeting[..], &[5, 1, 0, 3, 3], b"a.b", &[0, 80]].concat();
            let (got, answered) = socks_of(&connect_name).await;
            assert_eq!(got.unwrap(), Address::DomainAddress(b"a.b".to_vec(), 80));
            assert_eq!(answered, [5, 0]);
            let connect_ip = [&greeting[..], &[5, 1, 0, 1, 100, 64, 1, 5, 0, 22]].concat();
            let (got, _) = socks_of(&connect_ip).await;
            assert_eq!(
                got.unwrap(),
                Address::SocketAddress("100.64.1.5:22".parse().unwrap())
            );
            // The reply to a refused request: version, code, reserved, then an address.
            let refused = |code: u8| vec![5, 0, 5, code, 0];
            for (sent, want, answer) in [
                // SOCKS4.
                (vec![4, 1, 0, 80, 100, 64, 1, 5, 0], None, vec![]),
                // Only username and password offered.
                (vec![5, 1, 2], None, vec![5, 0xff]),
                // BIND, and UDP ASSOCIATE.
                (
                    [&greeting[..], &[5, 2, 0, 1, 100, 64, 1, 5, 0, 22]].concat(),
                    Some(Reply::CommandNotSupported),
                    refused(7),
                ),
                (
                    [&greeting[..], &[5, 3, 0, 1, 100, 64, 1, 5, 0, 22]].concat(),
                    Some(Reply::CommandNotSupported),
                    refused(7),
                ),
                // An unknown command, an unknown address type.
                (
                    [&greeting[..], &[5, 9, 0, 1, 100, 64, 1, 5, 0, 22]].concat(),
                    Some(Reply::CommandNotSupported),
                    refused(7),
                ),
                (
                    [&greeting[..], &[5, 1, 0, 7, 1, 2, 3, 4]].concat(),
                    Some(Reply::AddressTypeNotSupported),
                    refused(8),
                ),
                // Cut short: in the greeting, in the request.
                (vec![5, 3, 0], None, vec![]),
                (
                    [&greeting[..], &[5, 1, 0, 3, 200, b'a']].concat(),
                    None,
                    vec![5, 0],
                ),
            ] {
                let (got, answered) = socks_of(&sent).await;
                assert_eq!(got.err(), Some(want), "{sent:?}");
                assert!(answered.starts_with(&answer), "{sent:?}: {answered:?}");
                assert_eq!(
                    answered.len() > answer.len(),
                    want.is_some(),
                    "{sent:?}: {answered:?}"
                );
            }
        });
    }

    /// Local clients are bounded: with every permit held (a client that has not finished
    /// its greeting), the next connection is closed at once and counted as refused.
    #[test]
    fn local_clients_beyond_the_bound_are_refused() {
        runtime().block_on(async {
            let ours = Ours {
                vip: std::net::Ipv4Addr::new(100, 64, 3, 1),
                overlay: "100.64.0.0/10".parse().unwrap(),
                ipv6: None,
            };
            let (side, _from_sink) = StackSide::new(ours);
            let (open, _opens) = mpsc::channel(1);
            let clients = Arc::new(Clients {
                open,
                wake: Arc::new(Notify::new()),
                resolver: None,
                side: side.clone(),
                permits: Arc::new(Semaphore::new(1)),
            });
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let at = listener.local_addr().unwrap();
            tokio::spawn(accept(listener, Target::Socks, clients));
            let _first = TcpStream::connect(at).await.unwrap();
            let c = &side.counters;
            while c.proxy_accepted.load(Ordering::Relaxed) < 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let mut second = TcpStream::connect(at).await.unwrap();
            let mut rest = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), second.read_to_end(&mut rest));
            assert!(matches!(read.await, Ok(Ok(0)) | Ok(Err(_))), "{rest:?}");
            assert_eq!(c.proxy_accepted.load(Ordering::Relaxed), 2);
            assert_eq!(c.proxy_refused.load(Ordering::Relaxed), 1);
        });
    }
}

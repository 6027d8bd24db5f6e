//! The overlay's TCP/IP inside a process, sans-IO (issue 55): a node that runs without a TUN
//! device (and without privileges) opens TCP connections to overlay addresses through a
//! [`Stack`] instead of the host's kernel.
//!
//! smoltcp does IP and TCP; this crate is its device (two packet queues), the table of
//! connections and its bounds. The driver hands the stack the packets the tunnel delivered
//! for our vIP ([`Stack::receive`]), runs it at `now` ([`Stack::poll`]), sends what it made
//! into the tunnel ([`Stack::transmit`]), and moves each connection's bytes
//! ([`Stack::send`], [`Stack::recv`]). No sockets, threads or clock of its own: time is an
//! argument, so the tests run two stacks against each other on a virtual clock.
//!
//! Bounds: at most [`Limits::connections`] connections at once (each holds two buffers of
//! [`Limits::buffer`] bytes), at most [`Limits::queued`] packets waiting each way; an opening
//! connection is given up after [`Limits::connect_timeout`], a released one lingers at most
//! [`Limits::linger`] to say goodbye. Echo requests to our addresses are answered.

#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use ipnet::{Ipv4Net, Ipv6Net};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint};

/// Where the stack sits in the overlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    /// Our vIP.
    pub vip: Ipv4Addr,
    /// The overlay: the only destinations the stack connects to.
    pub overlay: Ipv4Net,
    /// Our IPv6 vIP and the overlay's IPv6 range, when we carry IPv6.
    pub ipv6: Option<(Ipv6Addr, Ipv6Net)>,
}

impl Addresses {
    /// Whether `ip` is in the overlay and not one of ours: where a connection may go.
    #[must_use]
    pub fn reaches(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(ip) => ip != self.vip && self.overlay.contains(&ip),
            IpAddr::V6(ip) => self
                .ipv6
                .is_some_and(|(vip, overlay)| ip != vip && overlay.contains(&ip)),
        }
    }
}

/// The stack's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections at once: opening, open and closing.
    pub connections: usize,
    /// Each connection's receive buffer and send buffer, bytes (the receive buffer is the
    /// window the far end sees).
    pub buffer: usize,
    /// Packets waiting each way: received and not yet polled, made and not yet transmitted.
    pub queued: usize,
    /// How long an opening connection waits for its answer.
    pub connect_timeout: Duration,
    /// How long a released connection stays to finish its goodbye (a FIN's answer).
    pub linger: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 256,
            buffer: 128 * 1024,
            queued: 1024,
            connect_timeout: Duration::from_secs(10),
            linger: Duration::from_secs(5),
        }
    }
}

/// A connection of the stack. Ids are not reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conn(u64);

/// What a connection is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the handshake: our SYN's answer, or a listener's first SYN.
    Opening,
    /// Carrying bytes (either direction may have finished already).
    Open,
    /// The far end answered the opening with a reset: nothing listens there.
    Refused,
    /// No answer to the opening within [`Limits::connect_timeout`].
    TimedOut,
    /// Over: both directions finished, or reset after it was open.
    Closed,
}

/// Why a connection cannot be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectError {
    /// The address is not in the overlay, or it is our own.
    NotOverlay,
    /// [`Limits::connections`] are in use.
    Full,
    /// The port is 0, or already listened on.
    Unaddressable,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NotOverlay => "not an address of the overlay",
            Self::Full => "too many connections",
            Self::Unaddressable => "not an address and port to connect to",
        })
    }
}

impl std::error::Error for ConnectError {}

/// What the stack counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets taken in.
    pub received: u64,
    /// Packets refused because [`Limits::queued`] were waiting.
    pub dropped_queue_full: u64,
    /// Packets the stack made.
    pub transmitted: u64,
    /// Packets the stack held back because [`Limits::queued`] were waiting to be
    /// transmitted (it makes them again later).
    pub transmit_deferred: u64,
    /// Connections opened (ours and accepted ones).
    pub opened: u64,
    /// Connections refused because [`Limits::connections`] were in use.
    pub refused_full: u64,
}

/// A UDP port of ours, open for the stack's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Udp(SocketHandle);

/// Datagrams a UDP port holds each way.
const UDP_DATAGRAMS: usize = 32;
/// And bytes.
const UDP_BYTES: usize = 32 * 1024;

/// One connection's state beside smoltcp's socket.
#[derive(Debug)]
struct Entry {
    handle: SocketHandle,
    /// Our local port.
    port: u16,
    /// Until when an opening connection waits.
    deadline: Option<Instant>,
    /// It reached the open phase once.
    opened: bool,
    /// The opening timed out.
    timed_out: bool,
    /// Released by the driver: removed once closed, or at this time.
    released: Option<Instant>,
}

/// The overlay's TCP/IP: one interface with our addresses, its connections.
pub struct Stack {
    iface: Interface,
    sockets: SocketSet<'static>,
    device: Queues,
    entries: HashMap<Conn, Entry>,
    next_id: u64,
    next_port: u16,
    addresses: Addresses,
    limits: Limits,
    /// Our UDP ports.
    udp_ports: Vec<u16>,
    /// The instant smoltcp's clock counts from.
    base: Instant,
    stats: Stats,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("addresses", &self.addresses)
            .field("connections", &self.entries.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The ports our connections come from (IANA's dynamic range).
const EPHEMERAL: std::ops::RangeInclusive<u16> = 49152..=65535;
/// How often an idle open connection is probed, so that a far end gone is noticed.
const KEEP_ALIVE: smoltcp::time::Duration = smoltcp::time::Duration::from_secs(30);

impl Stack {
    /// A stack at `addresses` whose packets are at most `mtu` bytes, its clock starting at
    /// `now`.
    #[must_use]
    pub fn new(addresses: Addresses, mtu: usize, limits: Limits, now: Instant) -> Self {
        let mut device = Queues {
            rx: VecDeque::new(),
            tx: VecDeque::new(),
            mtu,
            cap: limits.queued.max(1),
            deferred: 0,
        };
        let config = Config::new(HardwareAddress::Ip);
        let mut iface = Interface::new(config, &mut device, smoltcp::time::Instant::ZERO);
        iface.update_ip_addrs(|ips| {
            // Our address with the overlay's prefix: every overlay address is on the link,
            // which for an IP medium means "hand it to the device".
            let v4 = IpCidr::new(
                IpAddress::Ipv4(addresses.vip),
                addresses.overlay.prefix_len(),
            );
            let _ = ips.push(v4);
            if let Some((vip, overlay)) = addresses.ipv6 {
                let _ = ips.push(IpCidr::new(IpAddress::Ipv6(vip), overlay.prefix_len()));
            }
        });
        Self {
            iface,
            sockets: SocketSet::new(Vec::new()),
            device,
            entries: HashMap::new(),
            next_id: 0,
            next_port: *EPHEMERAL.start(),
            addresses,
            limits,
            udp_ports: Vec::new(),
            base: now,
            stats: Stats::default(),
        }
    }

    /// smoltcp's time for `now`.
    fn at(&self, now: Instant) -> smoltcp::time::Instant {
        let micros = now.saturating_duration_since(self.base).as_micros();
        smoltcp::time::Instant::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
    }

    /// What the stack counted.
    #[must_use]
    pub fn stats(&self) -> Stats {
        Stats {
            transmit_deferred: self.device.deferred,
            ..self.stats
        }
    }

    /// Connections in the table, released ones still closing included.
    #[must_use]
    pub fn connections(&self) -> usize {
        self.entries.len()
    }

    /// Takes in a packet the tunnel delivered for us (checked by the caller: IPv4 or IPv6,
    /// from a peer's certified blocks, to our vIP). False when [`Limits::queued`] packets
    /// are waiting already: it is dropped and counted, and TCP sends it again.
    pub fn receive(&mut self, packet: Vec<u8>) -> bool {
        if self.device.rx.len() >= self.limits.queued {
            self.stats.dropped_queue_full += 1;
            return false;
        }
        self.stats.received += 1;
        self.device.rx.push_back(packet);
        true
    }

    /// The next packet the stack made, for the tunnel.
    pub fn transmit(&mut self) -> Option<Vec<u8>> {
        let p = self.device.tx.pop_front()?;
        self.stats.transmitted += 1;
        Some(p)
    }

    /// Runs the stack at `now`: takes in what was received, runs the timers, makes what is
    /// to be sent; gives up openings past their deadline and removes released connections
    /// that are done.
    pub fn poll(&mut self, now: Instant) {
        let t = self.at(now);
        self.iface.poll(t, &mut self.device, &mut self.sockets);
        let mut expired = false;
        let mut gone = Vec::new();
        for (id, e) in &mut self.entries {
            let s = self.sockets.get_mut::<tcp::Socket<'_>>(e.handle);
            let state = s.state();
            if matches!(state, tcp::State::SynSent | tcp::State::SynReceived)
                && e.deadline.is_some_and(|d| now >= d)
            {
                s.abort();
                e.timed_out = true;
                expired = true;
            } else if !e.opened && is_open(state) {
                e.opened = true;
                self.stats.opened += 1;
            }
            if let Some(until) = e.released
                && (matches!(state, tcp::State::Closed | tcp::State::TimeWait) || now >= until)
            {
                gone.push(*id);
            }
        }
        for id in gone {
            if let Some(e) = self.entries.remove(&id) {
                self.sockets.remove(e.handle);
            }
        }
        if expired {
            // The resets of the openings given up go now, not at the next wake-up.
            self.iface.poll(t, &mut self.device, &mut self.sockets);
        }
    }

    /// How long until [`Stack::poll`] has work that no packet brings (a retransmission, a
    /// deadline); `None`: none.
    pub fn poll_delay(&mut self, now: Instant) -> Option<Duration> {
        let t = self.at(now);
        let smol = self
            .iface
            .poll_delay(t, &self.sockets)
            .map(|d| Duration::from_micros(d.total_micros()));
        let ours = self
            .entries
            .values()
            .filter_map(|e| {
                let opening = e.deadline.filter(|_| !e.opened && !e.timed_out);
                opening.into_iter().chain(e.released).min()
            })
            .min()
            .map(|at| at.saturating_duration_since(now));
        smol.into_iter().chain(ours).min()
    }

    /// Opens a connection to `to`, an overlay address; [`Stack::phase`] says when it is
    /// open.
    ///
    /// # Errors
    /// `to` is not in the overlay (or is ours), the table is full, `to`'s port is 0.
    pub fn connect(&mut self, to: SocketAddr, now: Instant) -> Result<Conn, ConnectError> {
        if !self.addresses.reaches(to.ip()) {
            return Err(ConnectError::NotOverlay);
        }
        if to.port() == 0 {
            return Err(ConnectError::Unaddressable);
        }
        let port = self.free_port()?;
        let mut socket = self.socket();
        socket
            .connect(self.iface.context(), endpoint(to), port)
            .map_err(|_| ConnectError::Unaddressable)?;
        Ok(self.add(socket, port, Some(now + self.limits.connect_timeout)))
    }

    /// Waits for one connection to `port` on our addresses (the far end opens it).
    ///
    /// # Errors
    /// The table is full, the port is 0 or listened on already.
    pub fn listen(&mut self, port: u16) -> Result<Conn, ConnectError> {
        if port == 0 || self.entries.values().any(|e| e.port == port) {
            return Err(ConnectError::Unaddressable);
        }
        self.room()?;
        let mut socket = self.socket();
        socket
            .listen(port)
            .map_err(|_| ConnectError::Unaddressable)?;
        Ok(self.add(socket, port, None))
    }

    /// Opens UDP `port` on our addresses (a few datagrams each way, kept for the stack's
    /// life).
    ///
    /// # Errors
    /// The port is 0 or open already.
    pub fn udp_bind(&mut self, port: u16) -> Result<Udp, ConnectError> {
        if port == 0 || self.udp_ports.contains(&port) {
            return Err(ConnectError::Unaddressable);
        }
        let buffer = || {
            udp::PacketBuffer::new(
                vec![udp::PacketMetadata::EMPTY; UDP_DATAGRAMS],
                vec![0; UDP_BYTES],
            )
        };
        let mut socket = udp::Socket::new(buffer(), buffer());
        socket.bind(port).map_err(|_| ConnectError::Unaddressable)?;
        self.udp_ports.push(port);
        Ok(Udp(self.sockets.add(socket)))
    }

    /// Queues `data` from `u` to `to`, an overlay address not ours; false: not one, or no
    /// room (the datagram is not sent).
    pub fn udp_send(&mut self, u: Udp, to: SocketAddr, data: &[u8]) -> bool {
        self.addresses.reaches(to.ip())
            && self
                .sockets
                .get_mut::<udp::Socket<'_>>(u.0)
                .send_slice(data, endpoint(to))
                .is_ok()
    }

    /// The next datagram `u` received, and who sent it.
    pub fn udp_recv(&mut self, u: Udp) -> Option<(Vec<u8>, SocketAddr)> {
        let socket = self.sockets.get_mut::<udp::Socket<'_>>(u.0);
        let (data, meta) = socket.recv().ok()?;
        let from = SocketAddr::new(meta.endpoint.addr.into(), meta.endpoint.port);
        Some((data.to_vec(), from))
    }

    /// Whether another connection fits.
    fn room(&mut self) -> Result<(), ConnectError> {
        if self.entries.len() >= self.limits.connections {
            self.stats.refused_full += 1;
            return Err(ConnectError::Full);
        }
        Ok(())
    }

    /// A port no connection of ours uses, after the last one given.
    fn free_port(&mut self) -> Result<u16, ConnectError> {
        self.room()?;
        let span = usize::from(EPHEMERAL.end() - EPHEMERAL.start()) + 1;
        for _ in 0..span {
            let port = self.next_port;
            self.next_port = if port == *EPHEMERAL.end() {
                *EPHEMERAL.start()
            } else {
                port + 1
            };
            if !self.entries.values().any(|e| e.port == port) {
                return Ok(port);
            }
        }
        Err(ConnectError::Full)
    }

    /// A TCP socket with our buffers and settings.
    fn socket(&self) -> tcp::Socket<'static> {
        let buffer = || tcp::SocketBuffer::new(vec![0; self.limits.buffer]);
        let mut socket = tcp::Socket::new(buffer(), buffer());
        // A proxy's writes are whatever its client wrote: no waiting to fill segments.
        socket.set_nagle_enabled(false);
        socket.set_keep_alive(Some(KEEP_ALIVE));
        socket
    }

    fn add(&mut self, socket: tcp::Socket<'static>, port: u16, deadline: Option<Instant>) -> Conn {
        let handle = self.sockets.add(socket);
        let id = Conn(self.next_id);
        self.next_id += 1;
        self.entries.insert(
            id,
            Entry {
                handle,
                port,
                deadline,
                opened: false,
                timed_out: false,
                released: None,
            },
        );
        id
    }

    fn socket_of(&mut self, id: Conn) -> Option<&mut tcp::Socket<'static>> {
        let handle = self.entries.get(&id)?.handle;
        Some(self.sockets.get_mut::<tcp::Socket<'_>>(handle))
    }

    /// What `id` is doing; `None`: no such connection (released and removed).
    #[must_use]
    pub fn phase(&self, id: Conn) -> Option<Phase> {
        let e = self.entries.get(&id)?;
        let state = self.sockets.get::<tcp::Socket<'_>>(e.handle).state();
        Some(match state {
            _ if e.timed_out => Phase::TimedOut,
            tcp::State::Listen | tcp::State::SynSent | tcp::State::SynReceived => Phase::Opening,
            s if is_open(s) => Phase::Open,
            _ if e.opened => Phase::Closed,
            _ => Phase::Refused,
        })
    }

    /// The far end's address of `id`, once known.
    #[must_use]
    pub fn remote(&self, id: Conn) -> Option<SocketAddr> {
        let e = self.entries.get(&id)?;
        let ep = self
            .sockets
            .get::<tcp::Socket<'_>>(e.handle)
            .remote_endpoint()?;
        Some(SocketAddr::new(ep.addr.into(), ep.port))
    }

    /// Reads what the far end sent on `id` into `out`; 0: nothing now.
    pub fn recv(&mut self, id: Conn, out: &mut [u8]) -> usize {
        self.socket_of(id)
            .and_then(|s| s.recv_slice(out).ok())
            .unwrap_or(0)
    }

    /// Whether the far end of `id` finished sending and everything it sent was read (or
    /// the connection is gone).
    #[must_use]
    pub fn finished(&self, id: Conn) -> bool {
        self.entries.get(&id).is_none_or(|e| {
            let s = self.sockets.get::<tcp::Socket<'_>>(e.handle);
            !s.can_recv()
                && matches!(
                    s.state(),
                    tcp::State::CloseWait
                        | tcp::State::LastAck
                        | tcp::State::Closing
                        | tcp::State::TimeWait
                        | tcp::State::Closed
                )
        })
    }

    /// How many bytes [`Stack::send`] takes on `id` now.
    #[must_use]
    pub fn send_room(&self, id: Conn) -> usize {
        self.entries.get(&id).map_or(0, |e| {
            let s = self.sockets.get::<tcp::Socket<'_>>(e.handle);
            if s.may_send() {
                s.send_capacity() - s.send_queue()
            } else {
                0
            }
        })
    }

    /// Queues `data` for the far end of `id`; returns how much it took.
    pub fn send(&mut self, id: Conn, data: &[u8]) -> usize {
        self.socket_of(id)
            .and_then(|s| s.send_slice(data).ok())
            .unwrap_or(0)
    }

    /// Finishes our direction of `id` (a FIN after what is queued).
    pub fn close(&mut self, id: Conn) {
        if let Some(s) = self.socket_of(id) {
            s.close();
        }
    }

    /// The driver is done with `id`: a connection still carrying bytes both ways is reset;
    /// one closing finishes its goodbye for at most [`Limits::linger`]; it is removed once
    /// closed.
    pub fn release(&mut self, id: Conn, now: Instant) {
        let linger = now + self.limits.linger;
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let s = self.sockets.get_mut::<tcp::Socket<'_>>(e.handle);
        if matches!(
            s.state(),
            tcp::State::Listen
                | tcp::State::SynSent
                | tcp::State::SynReceived
                | tcp::State::Established
                | tcp::State::CloseWait
        ) {
            s.abort();
        }
        e.released = Some(linger);
    }
}

/// Whether `state` carries bytes (one way at least).
fn is_open(state: tcp::State) -> bool {
    matches!(
        state,
        tcp::State::Established
            | tcp::State::FinWait1
            | tcp::State::FinWait2
            | tcp::State::CloseWait
            | tcp::State::Closing
            | tcp::State::LastAck
    )
}

fn endpoint(a: SocketAddr) -> IpEndpoint {
    IpEndpoint::new(a.ip().into(), a.port())
}

/// smoltcp's device: packets received wait in `rx` for a poll, packets made wait in `tx` for
/// the driver.
#[derive(Debug)]
struct Queues {
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
    mtu: usize,
    /// At most this many in `tx`: beyond, the stack waits (it makes them again later).
    cap: usize,
    /// Times the stack had to wait.
    deferred: u64,
}

impl phy::Device for Queues {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _now: smoltcp::time::Instant) -> Option<(Rx, Tx<'_>)> {
        let packet = self.rx.pop_front()?;
        // An answer (an ACK, a reset) may be made while taking it in: always room for one.
        Some((Rx(packet), Tx(&mut self.tx)))
    }

    fn transmit(&mut self, _now: smoltcp::time::Instant) -> Option<Tx<'_>> {
        if self.tx.len() >= self.cap {
            self.deferred += 1;
            return None;
        }
        Some(Tx(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = self.mtu;
        caps
    }
}

/// A received packet, for smoltcp to read.
struct Rx(Vec<u8>);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

/// Room for one packet smoltcp makes.
struct Tx<'a>(&'a mut VecDeque<Vec<u8>>);

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut packet = vec![0; len];
        let r = f(&mut packet);
        self.0.push_back(packet);
        r
    }
}

#[cfg(test)]
mod tests;

//! Two engines in one process, for tests and benchmarks.
//!
//! - A [`Link`] carries datagrams between [`LinkSocket`]s inside the process, with faults
//!   injected as smoltcp's `FaultInjector` does (loss, duplication, corruption, reordering,
//!   delay), seeded so that the faults a test meets are the same in every run. Addresses are
//!   labels only: a socket is reached by the address it was bound to, and [`Link::rebind`]
//!   moves it to another one (a node that roams). [`Link::inject`] lets a test play an
//!   attacker on the underlay; [`Link::record`] keeps copies of what passed, to replay.
//! - A [`Pair`] (quinn-proto's `Pair` is the model) is two engines on one link, each with a
//!   sink that collects what it delivers and a control core that the test's own thread turns
//!   whenever it waits: the whole data plane, handshakes and all, without root, namespaces,
//!   a real socket or a thread of the harness's own. Nothing leaves the process.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use std::net::Ipv4Addr;

use cyphonic_crypto::{
    Backend, Certificate, CertificateAuthority, IssueRequest, RevocationList, StaticKeypair,
    TrustStore,
};
use cyphonic_netio::DatagramMeta;
use cyphonic_pipeline::{DropReason, Sink};
use cyphonic_session::{Clock, Identity, Timing, Versions};
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};

use crate::egress::Submit;
use crate::socket::TunnelSocket;
use crate::{
    Accepted, Control, ControlEvent, DataPlane, Engine, HEADROOM, Intake, PACKET_ROOM, PeerSlot,
    Shared, StaticPeer, ToControl,
};

/// How long a receive waits for a first datagram (as the UDP socket's receive timeout does).
const RECV_WAIT: Duration = Duration::from_millis(10);
/// How far a reordered datagram falls behind: later ones overtake it.
const REORDER_BY: Duration = Duration::from_millis(2);
/// Datagrams a socket's inbox holds at most (a full inbox drops, as a socket buffer does).
const INBOX: usize = 65_536;
/// Copies [`Link::record`] keeps at most.
const RECORDED: usize = 65_536;

/// What the link does to the datagrams it carries. Shares are probabilities (0.0 to 1.0),
/// drawn for each datagram.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Datagrams lost.
    pub drop: f64,
    /// Datagrams delivered twice.
    pub duplicate: f64,
    /// Datagrams with one bit flipped.
    pub corrupt: f64,
    /// Datagrams held back so that later ones overtake them.
    pub reorder: f64,
    /// Added to every datagram's trip.
    pub delay: Duration,
    /// Up to this much more, at random, per datagram.
    pub jitter: Duration,
}

/// What the link did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Datagrams sent into the link (injected ones included).
    pub sent: u64,
    /// Datagrams handed to a receiving socket.
    pub delivered: u64,
    /// Lost on purpose.
    pub dropped: u64,
    /// Delivered twice on purpose.
    pub duplicated: u64,
    /// Corrupted on purpose.
    pub corrupted: u64,
    /// Held back on purpose.
    pub reordered: u64,
    /// Sent to an address no socket is bound to, or into a full inbox.
    pub undeliverable: u64,
}

/// A datagram as the link carried it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Its sender.
    pub from: SocketAddr,
    /// Its destination.
    pub to: SocketAddr,
    /// Its bytes, as sent (before any corruption).
    pub bytes: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Pending {
    at: Instant,
    seq: u64,
    from: SocketAddr,
    bytes: Vec<u8>,
}

#[derive(Debug)]
struct State {
    inboxes: HashMap<SocketAddr, BinaryHeap<Reverse<Pending>>>,
    faults: Faults,
    rng: SmallRng,
    seq: u64,
    stats: LinkStats,
    recording: Option<Vec<Datagram>>,
}

/// The link. Cloning gives another handle on the same link.
#[derive(Debug, Clone)]
pub struct Link {
    inner: Arc<(Mutex<State>, Condvar)>,
}

impl Link {
    /// A link without faults; `seed` fixes the faults set later.
    pub fn new(seed: u64) -> Self {
        Self {
            inner: Arc::new((
                Mutex::new(State {
                    inboxes: HashMap::new(),
                    faults: Faults::default(),
                    rng: SmallRng::seed_from_u64(seed),
                    seq: 0,
                    stats: LinkStats::default(),
                    recording: None,
                }),
                Condvar::new(),
            )),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A socket bound to `addr` on this link.
    pub fn socket(&self, addr: SocketAddr) -> LinkSocket {
        self.state().inboxes.entry(addr).or_default();
        LinkSocket {
            link: self.clone(),
            addr: Arc::new(Mutex::new(addr)),
        }
    }

    /// From now on, what the link does to datagrams.
    pub fn set_faults(&self, faults: Faults) {
        self.state().faults = faults;
    }

    /// What the link did so far.
    pub fn stats(&self) -> LinkStats {
        self.state().stats
    }

    /// Starts (or stops) keeping a copy of every datagram sent from now on.
    pub fn record(&self, on: bool) {
        self.state().recording = on.then(Vec::new);
    }

    /// The datagrams recorded so far (recording goes on).
    pub fn recorded(&self) -> Vec<Datagram> {
        self.state().recording.clone().unwrap_or_default()
    }

    /// Moves `socket` (and its clones) to `addr`: what it sends comes from there, and what
    /// was sent to its old address no longer reaches it.
    pub fn rebind(&self, socket: &LinkSocket, addr: SocketAddr) {
        let mut st = self.state();
        let mut own = socket.addr.lock().unwrap_or_else(PoisonError::into_inner);
        let inbox = st.inboxes.remove(&own).unwrap_or_default();
        st.inboxes.insert(addr, inbox);
        *own = addr;
    }

    /// Sends `bytes` from `from` to `to` as an attacker on the underlay would: no socket of
    /// the link needed, and the faults apply as to any datagram.
    pub fn inject(&self, from: SocketAddr, to: SocketAddr, bytes: &[u8]) {
        self.send(from, to, bytes);
    }

    /// Datagrams waiting for `to` to receive them: a flood that keeps this bounded stays
    /// within what a socket holds however slowly `to` reads (under an emulator, say).
    pub fn queued(&self, to: SocketAddr) -> usize {
        self.state().inboxes.get(&to).map_or(0, BinaryHeap::len)
    }

    /// How long the oldest datagram due for `to` has waited for it to receive it (zero when
    /// none is due): a flood that keeps this short delays what comes behind it no longer than
    /// a socket read at a real machine's pace would, however slowly `to` reads here.
    pub fn waited(&self, to: SocketAddr) -> Duration {
        let now = Instant::now();
        self.state()
            .inboxes
            .get(&to)
            .and_then(|inbox| inbox.peek())
            .map_or(Duration::ZERO, |Reverse(p)| {
                now.saturating_duration_since(p.at)
            })
    }

    fn send(&self, from: SocketAddr, to: SocketAddr, bytes: &[u8]) {
        let now = Instant::now();
        let mut st = self.state();
        st.stats.sent += 1;
        if let Some(r) = st.recording.as_mut()
            && r.len() < RECORDED
        {
            r.push(Datagram {
                from,
                to,
                bytes: bytes.to_vec(),
            });
        }
        let f = st.faults;
        if st.rng.random_bool(f.drop.clamp(0.0, 1.0)) {
            st.stats.dropped += 1;
            return;
        }
        let copies = if st.rng.random_bool(f.duplicate.clamp(0.0, 1.0)) {
            st.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut bytes = bytes.to_vec();
            if !bytes.is_empty() && st.rng.random_bool(f.corrupt.clamp(0.0, 1.0)) {
                st.stats.corrupted += 1;
                let i = st.rng.random_range(0..bytes.len());
                bytes[i] ^= 1 << st.rng.random_range(0..8u32);
            }
            let mut at = now + f.delay;
            if !f.jitter.is_zero() {
                at += f.jitter.mul_f64(st.rng.random::<f64>());
            }
            if st.rng.random_bool(f.reorder.clamp(0.0, 1.0)) {
                st.stats.reordered += 1;
                at += REORDER_BY;
            }
            st.seq += 1;
            let seq = st.seq;
            match st.inboxes.get_mut(&to) {
                Some(inbox) if inbox.len() < INBOX => inbox.push(Reverse(Pending {
                    at,
                    seq,
                    from,
                    bytes,
                })),
                _ => st.stats.undeliverable += 1,
            }
        }
        drop(st);
        self.inner.1.notify_all();
    }
}

/// One end of a [`Link`]: a [`TunnelSocket`] bound to an address on it. Clones share the
/// address (a rebind moves them all).
#[derive(Debug, Clone)]
pub struct LinkSocket {
    link: Link,
    addr: Arc<Mutex<SocketAddr>>,
}

impl LinkSocket {
    /// The address it is bound to now.
    pub fn addr(&self) -> SocketAddr {
        *self.addr.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl TunnelSocket for LinkSocket {
    fn recv_batch(
        &mut self,
        bufs: &mut [&mut [u8]],
        meta: &mut [DatagramMeta],
    ) -> io::Result<usize> {
        let deadline = Instant::now() + RECV_WAIT;
        let n = bufs.len().min(meta.len());
        let (lock, ready) = &*self.link.inner;
        let mut st = lock.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let now = Instant::now();
            let addr = self.addr();
            let mut got = 0;
            let mut next = None;
            if let Some(inbox) = st.inboxes.get_mut(&addr) {
                while got < n {
                    match inbox.peek() {
                        Some(Reverse(p)) if p.at <= now => {}
                        Some(Reverse(p)) => {
                            next = Some(p.at);
                            break;
                        }
                        None => break,
                    }
                    let Some(Reverse(p)) = inbox.pop() else {
                        break;
                    };
                    let len = p.bytes.len().min(bufs[got].len());
                    bufs[got][..len].copy_from_slice(&p.bytes[..len]);
                    meta[got] = DatagramMeta {
                        len: p.bytes.len(),
                        truncated: len < p.bytes.len(),
                        from: p.from,
                        // Due at `p.at`: waiting since is this link's socket queue.
                        queued: Some(now.saturating_duration_since(p.at)),
                    };
                    got += 1;
                }
            }
            st.stats.delivered += got as u64;
            if got > 0 || now >= deadline {
                return Ok(got);
            }
            let until = next.map_or(deadline, |t| t.min(deadline));
            st = ready
                .wait_timeout(st, until.saturating_duration_since(now))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn send_batch(&self, msgs: &[(SocketAddr, &[u8])]) -> (usize, usize, Option<io::Error>) {
        let from = self.addr();
        for (to, bytes) in msgs {
            self.link.send(from, *to, bytes);
        }
        (msgs.len(), 0, None)
    }

    fn send_to(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.link.send(self.addr(), to, buf);
        Ok(buf.len())
    }

    fn send_to_hops(&self, buf: &[u8], _to: SocketAddr, _hops: u8) -> io::Result<usize> {
        // The link is one hop with nothing between: a datagram that must die on the way (a
        // hole punch) never arrives.
        Ok(buf.len())
    }

    fn try_clone_box(&self) -> io::Result<Box<dyn TunnelSocket>> {
        Ok(Box::new(self.clone()))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr())
    }
}

/// A UDP packet over IPv4 from `src` to `dst`:`port`, with 12 bytes of zeros as payload.
pub fn udp4(src: Ipv4Addr, dst: Ipv4Addr, port: u16) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&40u16.to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    p[20..22].copy_from_slice(&5000u16.to_be_bytes());
    p[22..24].copy_from_slice(&port.to_be_bytes());
    p[24..26].copy_from_slice(&20u16.to_be_bytes());
    p
}

/// Unix time at which the test PKI is valid (2027-01-15); the [`Pair`]'s clocks start there.
pub const T0: u64 = 1_800_000_000;
const DAY: u64 = 24 * 3600;

/// A CA for the overlay `ovl.example` (100.64.0.0/10 and fd7a:0:1::/48), valid around
/// [`T0`].
///
/// # Panics
/// When key generation fails: a broken test environment.
pub fn test_ca() -> CertificateAuthority {
    test_ca_at(T0)
}

/// [`test_ca`], valid around unix time `at` (a year either side): for ends that read the
/// system clock.
///
/// # Panics
/// When key generation fails: a broken test environment.
pub fn test_ca_at(at: u64) -> CertificateAuthority {
    let overlay = [
        "100.64.0.0/10".parse().expect("a valid block"),
        "fd7a:0:1::/48".parse().expect("a valid block"),
    ];
    CertificateAuthority::generate("ovl.example", &overlay, at - 365 * DAY, at + 365 * DAY)
        .expect("a test CA")
}

/// An identity for `name` with the vIP blocks `block` (one, or several separated by spaces),
/// issued by `ca`, and its certificate.
///
/// # Panics
/// When the CA refuses: a broken test setup.
pub fn test_identity(
    ca: &CertificateAuthority,
    name: &str,
    block: &str,
) -> (Arc<Identity>, Certificate) {
    let (identity, cert) = test_identity_at(ca, name, block, T0);
    (Arc::new(identity), cert)
}

/// [`test_identity`], valid from a day before unix time `at` to 30 days after.
///
/// # Panics
/// When the CA refuses: a broken test setup.
pub fn test_identity_at(
    ca: &CertificateAuthority,
    name: &str,
    block: &str,
    at: u64,
) -> (Identity, Certificate) {
    let keypair = StaticKeypair::generate().expect("a key pair");
    let cert = ca
        .issue(&IssueRequest {
            name: name.into(),
            vip_blocks: block
                .split(' ')
                .map(|b| b.parse().expect("a valid block"))
                .collect(),
            public_key: keypair.public().0,
            groups: vec!["test".into()],
            not_before: at - DAY,
            not_after: at + 30 * DAY,
        })
        .expect("a certificate");
    let trust = TrustStore::new(vec![ca.certificate().clone()], RevocationList::default())
        .expect("a trust store");
    let identity = Identity::new(keypair, cert.clone(), trust, at).expect("an identity");
    (identity, cert)
}

/// Two engines' shared state keyed to each other by a handshake run in this process, without
/// threads or sockets: `a` holds sending keys for its peer 1 (`b`), `b` receiving keys for
/// its peer 1 (`a`). For measuring the production seal and open stages on their own.
///
/// # Panics
/// When the handshake fails: a broken test setup.
pub fn keyed(aead: Backend, buffers: usize) -> (Arc<Shared>, Arc<Shared>) {
    let ca = test_ca();
    let (id_a, cert_a) = test_identity(&ca, "gw1.ovl.example", "100.64.1.0/24");
    let (id_b, cert_b) = test_identity(&ca, "gw2.ovl.example", "100.64.2.0/24");
    let addr_a = SocketAddr::from(([192, 0, 2, 1], 51820));
    let addr_b = SocketAddr::from(([192, 0, 2, 2], 51820));
    let now = Instant::now();
    let clock = Clock::new(now, Duration::from_secs(T0));
    let side = |identity: &Arc<Identity>, certificate: Certificate, endpoint| {
        let peer = StaticPeer {
            certificate,
            endpoint: Some(endpoint),
            persistent_keepalive: None,
        };
        let local = crate::Local {
            identity: identity.clone(),
            clock: clock.clone(),
            timing: Timing::default(),
            aead,
        };
        let shared = Shared::new(local, buffers, 16).0;
        shared.add_static_peer(&peer);
        Arc::new(shared)
    };
    let (a, b) = (side(&id_a, cert_b, addr_b), side(&id_b, cert_a, addr_a));
    let (to_b, to_a) = (
        a.peers.by_id(1).expect("a's peer"),
        b.peers.by_id(1).expect("b's peer"),
    );
    to_b.lock().initiate(now).expect("an initiation");
    let init = to_b.lock().poll_transmit().expect("the initiation to send");
    let incoming = cyphonic_session::read_init(&id_b, T0, &init.frame).expect("a valid initiation");
    to_a.lock()
        .handle_init(now, addr_a, incoming)
        .expect("the responder takes it");
    let response = to_a.lock().poll_transmit().expect("the response to send");
    to_b.lock()
        .handle_response(now, addr_b, &response.frame)
        .expect("the initiator takes it");
    assert!(to_b.lock().is_established(now), "a has keys");
    (a, b)
}

/// The ingress sink of a [`Pair`]'s engines: every packet delivered, in order, as bytes.
#[derive(Debug, Clone)]
pub struct Collect {
    delivered: crossbeam_channel::Sender<Vec<u8>>,
}

impl Sink for Collect {
    type Item = Accepted;

    fn emit(&mut self, item: Accepted) -> Result<(), DropReason> {
        let _ = self.delivered.try_send(item.buf()[item.packet()].to_vec());
        Ok(())
    }
}

/// An end's control core and what reaches it: the messages of its data threads and the
/// events it reported, turned by the test's thread (see [`Drive`]).
struct Core {
    control: Control,
    rx: tokio::sync::mpsc::Receiver<ToControl>,
    events: Vec<ControlEvent>,
}

impl Core {
    /// One turn at `now`, in the order the daemons' loop takes it (`daemon::Loop::step`):
    /// the data threads' messages, then the timers, then the events they made.
    fn turn(&mut self, now: Instant) {
        while let Ok(msg) = self.rx.try_recv() {
            self.control.handle(msg);
        }
        self.control.run_timers(now);
        self.collect();
    }

    fn collect(&mut self) {
        while let Some(e) = self.control.poll_event() {
            self.events.push(e);
        }
    }
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

/// One end's core: `None` once it stopped.
type CoreSlot = Arc<Mutex<Option<Core>>>;

/// What turns a [`Pair`]'s control cores: no thread of its own, but the test's, whenever it
/// waits on an end (quinn-proto's `Pair::drive` is the model). Every wait turns both cores
/// (a handshake needs both), so what the test waits for is what it made happen. The cores'
/// clock is the wall's plus what [`Pair::advance`] added: timers run early by that much,
/// while the data threads keep the wall clock.
#[derive(Clone, Default)]
struct Drive(Arc<Mutex<DriveState>>);

#[derive(Default)]
struct DriveState {
    cores: Vec<CoreSlot>,
    ahead: Duration,
}

impl Drive {
    fn state(&self) -> MutexGuard<'_, DriveState> {
        lock(&self.0)
    }

    /// The cores' clock.
    fn now(&self) -> Instant {
        Instant::now() + self.state().ahead
    }

    /// Turns every running core once.
    fn turn(&self) {
        let (cores, now) = {
            let s = self.state();
            (s.cores.clone(), Instant::now() + s.ahead)
        };
        for core in cores {
            if let Some(c) = lock(&core).as_mut() {
                c.turn(now);
            }
        }
    }

    /// Turns the cores about every millisecond for `d`.
    fn idle(&self, d: Duration) {
        let until = Instant::now() + d;
        loop {
            self.turn();
            if Instant::now() >= until {
                return;
            }
            std::thread::sleep(TURN_EVERY);
        }
    }

    /// Turns the cores until `done` holds (true) or `within` passed (false).
    fn until(&self, within: Duration, mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + within;
        loop {
            self.turn();
            if done() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(TURN_EVERY);
        }
    }
}

impl std::fmt::Debug for Drive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state();
        f.debug_struct("Drive")
            .field("cores", &s.cores.len())
            .field("ahead", &s.ahead)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long a waiting test sleeps between turns of the cores.
const TURN_EVERY: Duration = Duration::from_millis(1);
/// Delivered packets an [`End`] keeps for the test to read.
const DELIVERED: usize = 1 << 20;

/// One engine of a [`Pair`]: its socket on the link, its engine and its control core, which
/// turns while the test waits on either end ([`End::wait_delivered`], [`End::idle`],
/// [`End::wait_for`], [`Pair::wait_established`]) and at no other time.
#[derive(Debug)]
pub struct End {
    /// Its address on the link.
    pub socket: LinkSocket,
    /// Its overlay address (the first host of its block).
    pub vip: Ipv4Addr,
    /// The engine's shared state.
    pub shared: Arc<Shared>,
    /// The way into its tunnel.
    pub intake: Intake,
    engine: Option<Engine<Collect>>,
    core: CoreSlot,
    drive: Drive,
    delivered: crossbeam_channel::Receiver<Vec<u8>>,
}

impl End {
    #[expect(
        clippy::too_many_arguments,
        reason = "test setup, called twice by Pair::new"
    )]
    fn start(
        link: &Link,
        drive: &Drive,
        addr: SocketAddr,
        vip: Ipv4Addr,
        identity: &Arc<Identity>,
        (peer, told): (&StaticPeer, Option<Versions>),
        dp: &DataPlane,
        timing: Timing,
        clock: Clock,
        initiate: bool,
    ) -> Self {
        let socket = link.socket(addr);
        let local = crate::Local {
            identity: identity.clone(),
            clock,
            timing,
            aead: dp.aead,
        };
        let (shared, rx) = Shared::new(local, dp.buffers, 1024);
        shared.add_static_peer(peer);
        if let Some(slot) = shared.peers.by_id(1) {
            slot.lock().set_versions(told);
        }
        let shared = Arc::new(shared);
        let (tx, delivered) = crossbeam_channel::bounded(DELIVERED);
        let sink = Collect { delivered: tx };
        let engine = Engine::start(
            dp,
            &shared,
            &socket,
            sink.clone(),
            Some(sink.clone()),
            dp.sparse_threads().iter().map(|_| sink.clone()).collect(),
            false,
        )
        .expect("the engine starts");
        let intake = engine.intake();
        let mut core = Core {
            control: Control::new(shared.clone(), Box::new(socket.clone()), intake.clone()),
            rx,
            events: Vec::new(),
        };
        if initiate && let Some(slot) = shared.peers.by_id(1) {
            core.control.initiate(&slot, drive.now());
        }
        let core = Arc::new(Mutex::new(Some(core)));
        drive.state().cores.push(core.clone());
        Self {
            socket,
            vip,
            shared,
            intake,
            engine: Some(engine),
            core,
            drive: drive.clone(),
            delivered,
        }
    }

    /// Runs `command` on the end's control core and returns what it returned; the events it
    /// made the core report are in [`End::events`].
    ///
    /// # Panics
    /// When the end stopped.
    pub fn control<T>(&self, command: impl FnOnce(&mut Control) -> T) -> T {
        let mut core = lock(&self.core);
        let core = core.as_mut().expect("the end runs");
        let result = command(&mut core.control);
        core.collect();
        result
    }

    /// Sends `payload` as the inner packet to `dst` (an address in the other end's block).
    /// Returns false when no packet buffer was free or the engine stopped.
    pub fn send(&self, dst: impl Into<std::net::IpAddr>, payload: &[u8]) -> bool {
        let Some(mut buf) = self.shared.pool.take() else {
            return false;
        };
        let len = payload.len().min(PACKET_ROOM.len());
        buf[HEADROOM..HEADROOM + len].copy_from_slice(&payload[..len]);
        let mut guard = self.intake.lock();
        let Some(sub) = guard.as_mut() else {
            return false;
        };
        sub.route(buf, len, dst.into(), 0, (Instant::now(), None));
        sub.flush();
        true
    }

    /// What waits for this end to take it: datagrams the link holds for it and packet
    /// buffers its engine holds (in its pipelines, either way). A sender that waits for this
    /// to fall paces itself by the receiver, however slowly an emulator runs it.
    pub fn backlog(&self) -> usize {
        self.socket.link.queued(self.socket.addr()) + self.shared.pool().in_use()
    }

    /// What was delivered so far (and not read before).
    pub fn delivered(&self) -> Vec<Vec<u8>> {
        self.delivered.try_iter().collect()
    }

    /// Waits up to `within` until `count` packets were delivered, turning the pair's cores;
    /// returns all that were.
    pub fn wait_delivered(&self, count: usize, within: Duration) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        self.drive.until(within, || {
            got.extend(self.delivered.try_iter());
            got.len() >= count
        });
        got
    }

    /// Turns the pair's cores for `d`: what a test does where it would sleep while the
    /// engines work.
    pub fn idle(&self, d: Duration) {
        self.drive.idle(d);
    }

    /// Turns the pair's cores until `done` holds or `within` passed; returns whether it held.
    pub fn wait_for(&self, within: Duration, done: impl FnMut() -> bool) -> bool {
        self.drive.until(within, done)
    }

    /// What its control core reported so far, after one more turn of the pair's cores.
    pub fn settled_events(&self) -> Vec<ControlEvent> {
        self.drive.turn();
        self.events()
    }

    /// What its control core reported so far.
    pub fn events(&self) -> Vec<ControlEvent> {
        lock(&self.core)
            .as_ref()
            .map(|c| c.events.clone())
            .unwrap_or_default()
    }

    /// Its one peer: the other end.
    ///
    /// # Panics
    /// Never: the pair gives each end its peer at start.
    pub fn peer(&self) -> Arc<PeerSlot> {
        self.shared.peers.by_id(1).expect("each end has its peer")
    }

    /// The ingress and egress pipelines' counters.
    ///
    /// # Panics
    /// When called after [`End::stop`].
    pub fn pipelines(&self) -> (cyphonic_pipeline::Stats, cyphonic_pipeline::Stats) {
        let e = self.engine.as_ref().expect("running");
        (e.ingress_counters.snapshot(), e.egress_counters.snapshot())
    }

    /// Stops the control core (it turns no more) and the engine (the pipelines drain).
    pub fn stop(&mut self) {
        self.drive
            .state()
            .cores
            .retain(|c| !Arc::ptr_eq(c, &self.core));
        drop(lock(&self.core).take());
        if let Some(e) = self.engine.take() {
            let _ = e.stop();
        }
    }
}

impl Drop for End {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Two engines, `a` (100.64.1.0/24 and fd7a:0:1:100::/56, at 192.0.2.1:51820) and `b`
/// (100.64.2.0/24 and fd7a:0:1:200::/56, at 192.0.2.2:51820), peers of each other with each
/// other's address as endpoint, on one [`Link`]; their control cores turn while the test
/// waits (see [`End`]).
#[derive(Debug)]
pub struct Pair {
    /// The link between them.
    pub link: Link,
    /// The first engine.
    pub a: End,
    /// The second engine.
    pub b: End,
    drive: Drive,
    /// What `b` is started from: its identity, its peer `a` and what it was told of `a`'s
    /// versions.
    b_setup: (Arc<Identity>, (StaticPeer, Option<Versions>), Clock),
}

impl Pair {
    /// The two engines, sized by `dp`, with the session `timing`, on a link seeded with
    /// `seed`. Both know the other's endpoint; `a` initiates a handshake at once.
    pub fn new(seed: u64, dp: &DataPlane, timing: Timing) -> Self {
        let ours = (Versions::OURS, None);
        Self::speaking(seed, (dp, timing), ours, ours)
    }

    /// [`Pair::new`] with ends of other releases: each speaks the tunnel versions of its
    /// `.0` and is told (as the cloud would tell it) that the other speaks its `.1`
    /// (docs/protocol.md §2, *Versions*).
    pub fn speaking(
        seed: u64,
        (dp, timing): (&DataPlane, Timing),
        a: (Versions, Option<Versions>),
        b: (Versions, Option<Versions>),
    ) -> Self {
        let link = Link::new(seed);
        let drive = Drive::default();
        let ca = test_ca();
        let speaks = |(id, cert): (Arc<Identity>, Certificate), versions| {
            let id = Arc::into_inner(id)
                .expect("a new identity")
                .with_versions(versions);
            (Arc::new(id), cert)
        };
        let (id_a, cert_a) = speaks(
            test_identity(&ca, "gw1.ovl.example", "100.64.1.0/24 fd7a:0:1:100::/56"),
            a.0,
        );
        let (id_b, cert_b) = speaks(
            test_identity(&ca, "gw2.ovl.example", "100.64.2.0/24 fd7a:0:1:200::/56"),
            b.0,
        );
        let addr_a = SocketAddr::from(([192, 0, 2, 1], 51820));
        let addr_b = SocketAddr::from(([192, 0, 2, 2], 51820));
        let clock = Clock::new(Instant::now(), Duration::from_secs(T0));
        let peer = |certificate: Certificate, endpoint| StaticPeer {
            certificate,
            endpoint: Some(endpoint),
            persistent_keepalive: None,
        };
        let a = End::start(
            &link,
            &drive,
            addr_a,
            Ipv4Addr::new(100, 64, 1, 1),
            &id_a,
            (&peer(cert_b, addr_b), a.1),
            dp,
            timing,
            clock.clone(),
            true,
        );
        let b_peer = (peer(cert_a, addr_a), b.1);
        let b = End::start(
            &link,
            &drive,
            addr_b,
            Ipv4Addr::new(100, 64, 2, 1),
            &id_b,
            (&b_peer.0, b_peer.1),
            dp,
            timing,
            clock.clone(),
            false,
        );
        Self {
            link,
            a,
            b,
            drive,
            b_setup: (id_b, b_peer, clock),
        }
    }

    /// Restarts `b`: its engine stops and a new one starts at the same address with the same
    /// identity and peer, and no memory of keys or session indices. It does not initiate.
    pub fn restart_b(&mut self, dp: &DataPlane, timing: Timing) {
        self.b.stop();
        let (identity, peer, clock) = &self.b_setup;
        self.b = End::start(
            &self.link,
            &self.drive,
            self.b.socket.addr(),
            self.b.vip,
            identity,
            (&peer.0, peer.1),
            dp,
            timing,
            clock.clone(),
            false,
        );
    }

    /// Moves the control cores' clock `by` further ahead of the wall's: their timers (idle
    /// peers, handshake retries, scans) run that much early from the next turn on. The data
    /// threads keep the wall clock, which is why only the cores' time moves, and only forward.
    pub fn advance(&self, by: Duration) {
        self.drive.state().ahead += by;
    }

    /// Turns the cores up to `within` until both ends have keys for each other.
    pub fn wait_established(&self, within: Duration) -> bool {
        self.drive.until(within, || {
            let now = Instant::now();
            self.a.peer().lock().is_established(now) && self.b.peer().lock().is_established(now)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(n: u8) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, n], 51820))
    }

    fn recv_all(s: &mut LinkSocket) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let mut a = [0u8; 64];
            let mut b = [0u8; 64];
            let mut meta = [DatagramMeta::default(); 2];
            let n = {
                let mut bufs: [&mut [u8]; 2] = [&mut a, &mut b];
                s.recv_batch(&mut bufs, &mut meta).unwrap()
            };
            if n == 0 {
                return out;
            }
            for (m, buf) in meta.iter().zip([&a, &b]).take(n) {
                out.push((m.from, buf[..m.len.min(64)].to_vec()));
            }
        }
    }

    #[test]
    fn datagrams_arrive_in_order_from_their_sender() {
        let link = Link::new(1);
        let a = link.socket(addr(1));
        let mut b = link.socket(addr(2));
        for i in 0..5u8 {
            a.send_to(&[i], addr(2)).unwrap();
        }
        a.send_to(&[9], addr(3)).unwrap();
        let got = recv_all(&mut b);
        assert_eq!(
            got,
            (0..5u8).map(|i| (addr(1), vec![i])).collect::<Vec<_>>()
        );
        assert_eq!(link.stats().undeliverable, 1, "nobody at .3");
    }

    #[test]
    fn faults_are_injected_and_counted() {
        let link = Link::new(7);
        let a = link.socket(addr(1));
        let mut b = link.socket(addr(2));
        link.set_faults(Faults {
            drop: 0.2,
            duplicate: 0.1,
            corrupt: 0.1,
            reorder: 0.2,
            ..Faults::default()
        });
        for i in 0..200u8 {
            a.send_to(&[i, 0, 0, 0], addr(2)).unwrap();
        }
        std::thread::sleep(REORDER_BY * 2);
        let got = recv_all(&mut b);
        let s = link.stats();
        assert!(s.dropped > 10 && s.duplicated > 5 && s.corrupted > 5 && s.reordered > 10);
        assert_eq!(got.len() as u64, 200 - s.dropped + s.duplicated);
        assert_eq!(s.delivered, got.len() as u64);
        let firsts: Vec<u8> = got.iter().map(|(_, b)| b[0]).collect();
        assert!(
            firsts.windows(2).any(|w| w[0] > w[1]),
            "some overtook others"
        );
    }

    #[test]
    fn a_rebound_socket_sends_and_receives_at_its_new_address() {
        let link = Link::new(1);
        let a = link.socket(addr(1));
        let mut b = link.socket(addr(2));
        link.rebind(&a, addr(5));
        a.send_to(b"x", addr(2)).unwrap();
        assert_eq!(recv_all(&mut b), vec![(addr(5), b"x".to_vec())]);
        b.send_to(b"old", addr(1)).unwrap();
        assert_eq!(link.stats().undeliverable, 1);
        link.record(true);
        link.inject(addr(9), addr(2), b"forged");
        assert_eq!(recv_all(&mut b), vec![(addr(9), b"forged".to_vec())]);
        assert_eq!(link.recorded().len(), 1);
    }
}

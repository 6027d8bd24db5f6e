//! A member of the overlay that the test drives: a real identity (a site's key and
//! certificate) over the real protocol (`cyphonic_session::Peer` on a UDP socket), which
//! seals whatever inner packets the test hands it. The real binaries hold to the rules on
//! their own; this is how a test sends what a misbehaving member would.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use cyphonic_crypto::{Backend, Certificate, RevocationList, StaticKeypair, TrustStore};
use cyphonic_session::{
    Clock, Event, Identity, Indices, Peer, PeerConfig, Received, Timing, read_init,
};
use cyphonic_wire::{Frame, MessageType};

/// Hands one frame to `peer`, as the daemons' drivers do; returns the inner packet of a
/// data frame.
pub fn receive_frame(
    identity: &Identity,
    clock: &Clock,
    peer: &mut Peer,
    frame: &mut [u8],
    from: SocketAddr,
    now: Instant,
) -> Option<Vec<u8>> {
    let kind = Frame::new_checked(&*frame).ok()?.msg_type();
    match kind {
        MessageType::HandshakeInit => {
            let unix = clock.unix_secs(now);
            let _ =
                read_init(identity, unix, frame).and_then(|init| peer.handle_init(now, from, init));
            None
        }
        MessageType::HandshakeResp => {
            let _ = peer.handle_response(now, from, frame);
            None
        }
        MessageType::CookieReply => {
            let _ = peer.handle_cookie_reply(now, frame);
            None
        }
        _ => match peer.decapsulate(now, from, frame) {
            Ok(Received::Data(d)) => Some(d.to_vec()),
            _ => None,
        },
    }
}

/// The identity a bed's site directory holds (`<name>.key`, `<name>.crt`, `ca.crt`).
///
/// # Errors
/// A file is missing or does not parse, or the parts do not fit together.
pub fn site_identity(dir: &Path, name: &str) -> anyhow::Result<Identity> {
    let read =
        |f: String| std::fs::read_to_string(dir.join(&f)).with_context(|| format!("reading {f}"));
    let keypair = StaticKeypair::from_pem(&read(format!("{name}.key"))?)
        .map_err(|e| anyhow::anyhow!("{name}.key: {e}"))?;
    let cert = Certificate::from_pem(&read(format!("{name}.crt"))?)
        .map_err(|e| anyhow::anyhow!("{name}.crt: {e}"))?;
    let cas = Certificate::all_from_pem(&read("ca.crt".into())?)
        .map_err(|e| anyhow::anyhow!("ca.crt: {e}"))?;
    let trust = TrustStore::new(cas, RevocationList::default())
        .map_err(|e| anyhow::anyhow!("ca.crt: {e}"))?;
    Identity::new(keypair, cert, trust, unix_now().as_secs())
        .map_err(|e| anyhow::anyhow!("{name}: {e}"))
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// One tunnel to one peer, driven on the calling thread (run it inside a namespace).
pub struct Rogue {
    identity: Arc<Identity>,
    clock: Clock,
    peer: Peer,
    socket: UdpSocket,
}

impl std::fmt::Debug for Rogue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rogue")
            .field("to", &self.peer.endpoint())
            .finish_non_exhaustive()
    }
}

impl Rogue {
    /// Binds `local` and handshakes with the holder of `theirs` at `endpoint`, for up to
    /// `within`.
    ///
    /// # Errors
    /// The socket cannot be bound, or no keys are confirmed in time.
    pub fn connect(
        identity: Identity,
        local: SocketAddr,
        theirs: &Certificate,
        endpoint: SocketAddr,
        within: Duration,
    ) -> anyhow::Result<Self> {
        let socket = UdpSocket::bind(local).with_context(|| format!("binding {local}"))?;
        let clock = Clock::new(Instant::now(), unix_now());
        let identity = Arc::new(identity);
        let peer = Peer::new(
            0,
            identity.clone(),
            Indices::new(),
            PeerConfig::from_certificate(theirs, Some(endpoint)),
            Timing::default(),
            clock.clone(),
            Backend::Ring,
        );
        let mut rogue = Self {
            identity,
            clock,
            peer,
            socket,
        };
        let _ = rogue.peer.initiate(Instant::now());
        let deadline = Instant::now() + within;
        let mut up = false;
        while !up && Instant::now() < deadline {
            rogue.step(Duration::from_millis(50))?;
            while let Some(e) = rogue.peer.poll_event() {
                up |= matches!(e, Event::Established { .. });
            }
        }
        if !up {
            bail!("no keys with {endpoint} within {within:?}");
        }
        Ok(rogue)
    }

    /// Seals `packet` (an inner IPv4 packet, whatever its addresses) and sends it.
    ///
    /// # Errors
    /// No session, or the send fails.
    pub fn send(&mut self, packet: &[u8]) -> anyhow::Result<()> {
        let mut frame = vec![0u8; packet.len() + 64];
        let len = self
            .peer
            .encapsulate(Instant::now(), packet, &mut frame)
            .map_err(|e| anyhow::anyhow!("sealing: {e:?}"))?;
        let to = self.peer.endpoint().context("no endpoint")?;
        self.socket.send_to(&frame[..len], to)?;
        Ok(())
    }

    /// The inner packets that arrive for `within` (keeping the session up meanwhile).
    ///
    /// # Errors
    /// The socket fails.
    pub fn receive_for(&mut self, within: Duration) -> anyhow::Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            got.extend(self.step(left.min(Duration::from_millis(50)))?);
        }
        Ok(got)
    }

    /// Sends what the state machine has to send, waits up to `wait` for one datagram,
    /// hands it over and runs due timers; returns the inner packet it carried.
    fn step(&mut self, wait: Duration) -> anyhow::Result<Option<Vec<u8>>> {
        while let Some(t) = self.peer.poll_transmit() {
            self.socket.send_to(&t.frame, t.destination)?;
        }
        self.socket
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
        let mut buf = [0u8; 2048];
        let inner = match self.socket.recv_from(&mut buf) {
            Ok((len, from)) => receive_frame(
                &self.identity,
                &self.clock,
                &mut self.peer,
                &mut buf[..len],
                from,
                Instant::now(),
            ),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => return Err(e.into()),
        };
        let now = Instant::now();
        if self.peer.poll_timeout().is_some_and(|t| t <= now) {
            self.peer.handle_timeout(now);
        }
        Ok(inner)
    }
}

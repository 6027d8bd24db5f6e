//! Fixtures for the production seal and open stages (`cyphonic_tunnel::SealStage` and
//! `OpenStage`), fed as the engine feeds them: pool buffers, a peer with real session keys
//! from a handshake run in process ([`cyphonic_tunnel::testing::keyed`]), frames classified by
//! the receive path's own [`cyphonic_tunnel::arrival`]. The "bare" loops make the same seal and
//! open calls the stages' workers make, on one thread, without the pipeline around them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use cyphonic_crypto::Backend;
use cyphonic_netio::DatagramMeta;
use cyphonic_pipeline::{DropReason, Emitter, Sequencer, Sink, Stage};
use cyphonic_session::Session;
use cyphonic_tunnel::{
    Arrival, BUF_LEN, HEADROOM, Incoming, Outgoing, PeerSlot, SealStage, Shared, arrival,
};

use crate::BURST;

/// Pool buffers per side: a burst in flight and its successor being prepared.
const BUFFERS: usize = 3 * BURST;

fn session(slot: &PeerSlot) -> Arc<Session> {
    slot.lock()
        .send_session(Instant::now())
        .expect("the fixture's handshake gave keys")
}

/// The packet size of the per-packet counts (benches/benches/instructions.rs,
/// src/bin/count-packets.rs): a full packet at the default inner MTU.
pub const PACKET: usize = 1420;

/// Sealing packets of `size` bytes to a keyed peer.
#[derive(Debug)]
pub struct Sealing {
    shared: Arc<Shared>,
    peer: Arc<PeerSlot>,
    size: usize,
}

impl Sealing {
    /// With `backend`'s AEAD.
    pub fn new(backend: Backend, size: usize) -> Self {
        let (a, _) = cyphonic_tunnel::testing::keyed(backend, BUFFERS);
        let peer = a.peers().by_id(1).expect("the fixture's peer");
        Self {
            shared: a,
            peer,
            size,
        }
    }

    /// The production seal stage.
    pub fn stage(&self) -> SealStage {
        SealStage::new(self.shared.clone())
    }

    /// A burst of [`BURST`] packets in pool buffers, as the edge submits them.
    pub fn burst(&self) -> Vec<Outgoing> {
        let now = Instant::now();
        (0..BURST)
            .map(|_| {
                let mut buf = self
                    .shared
                    .pool()
                    .take()
                    .expect("the fixture's pool holds a burst");
                buf[HEADROOM..HEADROOM + self.size].fill(0x5a);
                Outgoing::new(buf, self.size, self.peer.clone(), now)
            })
            .collect()
    }

    /// [`BURST`] buffers with a packet of `size` bytes each, for [`Sealing::seal_bare`].
    pub fn bare_burst(&self) -> Vec<Vec<u8>> {
        vec![vec![0x5a; BUF_LEN]; BURST]
    }

    /// Seals each buffer as the seal stage's worker does: a counter, then the AEAD in place.
    pub fn seal_bare(&self, bufs: &mut [Vec<u8>]) {
        let session = session(&self.peer);
        for buf in bufs {
            let counter = session.reserve_counter().expect("counters left");
            session
                .seal_flagged(counter, buf, self.size, 0)
                .expect("the buffer holds the frame");
        }
    }
}

/// Opening frames of `size` bytes from a keyed peer.
#[derive(Debug)]
pub struct Opening {
    shared: Arc<Shared>,
    session: Arc<Session>,
    from: SocketAddr,
    /// [`BURST`] frames sealed by the peer, distinct counters.
    frames: Vec<Vec<u8>>,
}

impl Opening {
    /// With `backend`'s AEAD.
    pub fn new(backend: Backend, size: usize) -> Self {
        let (a, b) = cyphonic_tunnel::testing::keyed(backend, BUFFERS);
        let sender = session(&a.peers().by_id(1).expect("a's peer"));
        let frames: Vec<Vec<u8>> = (0..BURST)
            .map(|_| {
                let mut f = vec![0x5a; BUF_LEN];
                let counter = sender.reserve_counter().expect("counters left");
                let len = sender
                    .seal_flagged(counter, &mut f, size, 0)
                    .expect("the buffer holds the frame");
                f.truncate(len);
                f
            })
            .collect();
        let receiver = b.peers().by_id(1).expect("b's peer");
        let index = cyphonic_wire::Frame::new_checked(&frames[0][..])
            .expect("a frame")
            .receiver_index();
        let session = receiver
            .lock()
            .session_for_index(index, Instant::now())
            .expect("b has the receiving keys");
        Self {
            shared: b,
            session,
            from: SocketAddr::from(([192, 0, 2, 1], 51820)),
            frames,
        }
    }

    /// The burst as the receive thread classifies it: [`BURST`] sealed frames in pool
    /// buffers, each found its session.
    pub fn burst(&self) -> Vec<Incoming> {
        let now = Instant::now();
        self.frames
            .iter()
            .map(|f| {
                let mut buf = self
                    .shared
                    .pool()
                    .take()
                    .expect("the fixture's pool holds a burst");
                buf[..f.len()].copy_from_slice(f);
                let meta = DatagramMeta {
                    len: f.len(),
                    truncated: false,
                    from: self.from,
                    queued: None,
                };
                match arrival(&self.shared, buf, meta, now) {
                    Arrival::Sealed(item) => item,
                    other => panic!("the fixture's frame was not taken: {other:?}"),
                }
            })
            .collect()
    }

    /// The burst's frames as plain buffers, for [`Opening::open_bare`].
    pub fn bare_burst(&self) -> Vec<Vec<u8>> {
        self.frames.clone()
    }

    /// Opens each frame as the open stage's worker does (replay pre-check, then the AEAD in
    /// place); returns how many did not open.
    pub fn open_bare(&self, frames: &mut [Vec<u8>]) -> usize {
        let mut failed = 0;
        for f in frames {
            let counter = match cyphonic_wire::Frame::new_checked(&f[..]) {
                Ok(frame) => frame.counter(),
                Err(_) => {
                    failed += 1;
                    continue;
                }
            };
            if self.session.check_replay(counter).is_err() || self.session.open(f).is_err() {
                failed += 1;
            }
        }
        failed
    }
}

/// Counts what a pipeline emits and drops, and says when a burst is through.
#[derive(Debug)]
pub struct Count<T> {
    burst: usize,
    seen: usize,
    failed: u64,
    done: Sender<u64>,
    _item: std::marker::PhantomData<fn(T)>,
}

impl<T: Send + 'static> Sink for Count<T> {
    type Item = T;

    fn emit(&mut self, _item: T) -> Result<(), DropReason> {
        self.tick(false);
        Ok(())
    }

    fn dropped(&mut self, _item: T, _reason: DropReason) {
        self.tick(true);
    }
}

impl<T> Count<T> {
    fn tick(&mut self, failed: bool) {
        self.seen += 1;
        self.failed += u64::from(failed);
        if self.seen == self.burst {
            let _ = self.done.send(std::mem::take(&mut self.failed));
            self.seen = 0;
        }
    }
}

/// A long-lived pipeline of a production stage that a benchmark feeds burst after burst.
#[derive(Debug)]
pub struct StageBench<S: Stage> {
    seq: Option<Sequencer<S>>,
    emitter: Option<Emitter<Count<S::Item>>>,
    done: Receiver<u64>,
}

impl<S: Stage> StageBench<S> {
    /// `stage` on `workers` rayon threads, at the engine's default pipeline configuration.
    pub fn new(stage: S, workers: usize) -> Self {
        let (tx, done) = crossbeam_channel::bounded(1);
        let sink = Count {
            burst: BURST,
            seen: 0,
            failed: 0,
            done: tx,
            _item: std::marker::PhantomData,
        };
        let (seq, emitter) = crate::start(stage, workers, sink);
        Self {
            seq: Some(seq),
            emitter: Some(emitter),
            done,
        }
    }

    /// Pushes a burst through and waits until all of it left; returns how many packets the
    /// stage dropped.
    pub fn run_burst(&mut self, burst: Vec<S::Item>) -> u64 {
        crate::push_burst(self.seq.as_mut().expect("running"), burst);
        self.done.recv().expect("the emitter reports every burst")
    }
}

impl<S: Stage> Drop for StageBench<S> {
    fn drop(&mut self) {
        drop(self.seq.take());
        if let Some(e) = self.emitter.take() {
            e.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixtures seal and open for real: every packet of a burst goes through the
    /// production stages, the bare loops agree, and a tampered frame does not open.
    #[test]
    fn production_stages_seal_and_open_a_burst() {
        for backend in Backend::ALL {
            let sealing = Sealing::new(backend, 100);
            let mut seal = StageBench::new(sealing.stage(), 2);
            assert_eq!(seal.run_burst(sealing.burst()), 0, "{backend}");
            assert_eq!(seal.run_burst(sealing.burst()), 0, "{backend}");
            let mut bufs = sealing.bare_burst();
            sealing.seal_bare(&mut bufs);

            let opening = Opening::new(backend, 100);
            let mut open = StageBench::new(cyphonic_tunnel::OpenStage, 2);
            assert_eq!(open.run_burst(opening.burst()), 0, "{backend}");
            let mut frames = opening.bare_burst();
            assert_eq!(opening.open_bare(&mut frames), 0, "{backend}");
            let mut tampered = opening.bare_burst();
            tampered[7][40] ^= 1;
            assert_eq!(opening.open_bare(&mut tampered), 1, "{backend}");
        }
    }
}

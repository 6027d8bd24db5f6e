//! The data plane's shape with real crypto: a seal pipeline (counters assigned in order by the
//! sequencer, sealing on workers) feeding an open pipeline (cheap replay pre-check in order,
//! opening on workers, the replay window updated in order by the emitter).

// Test code: unwrapping and narrowing casts of small test values are fine here.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::needless_pass_by_value
)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cyphonic_crypto::{Backend, Key, PacketKey, ReplayWindow, TAG_LEN};
use cyphonic_pipeline::{Config, DropReason, Rejected, Sink, Stage, start};

const HDR: usize = 16;

struct Packet {
    buf: Vec<u8>,
    /// Body length after the header: the payload, plus the tag once sealed.
    len: usize,
    counter: u64,
}

/// Jitters the workers so batches complete out of order.
fn jitter(counter: u64) {
    if counter.is_multiple_of(13) {
        std::thread::sleep(Duration::from_micros(200));
    }
}

struct Seal {
    key: Box<dyn PacketKey>,
    next_counter: AtomicU64,
}

impl Stage for Seal {
    type Item = Packet;

    fn sequence(&self, p: &mut Packet) -> Result<(), DropReason> {
        p.counter = self.next_counter.fetch_add(1, Ordering::Relaxed);
        p.buf[8..16].copy_from_slice(&p.counter.to_be_bytes());
        Ok(())
    }

    fn process(&self, p: &mut Packet) -> Result<(), DropReason> {
        jitter(p.counter);
        let (hdr, body) = p.buf[..HDR + p.len + TAG_LEN].split_at_mut(HDR);
        self.key
            .seal(p.counter, hdr, body)
            .map_err(|_| DropReason::TooBig)?;
        p.len += TAG_LEN;
        Ok(())
    }
}

struct Open {
    key: Box<dyn PacketKey>,
    window: Arc<Mutex<ReplayWindow>>,
}

impl Stage for Open {
    type Item = Packet;

    fn sequence(&self, p: &mut Packet) -> Result<(), DropReason> {
        p.counter = u64::from_be_bytes(p.buf[8..16].try_into().unwrap());
        self.window
            .lock()
            .unwrap()
            .check(p.counter)
            .map_err(|_| DropReason::Replay)
    }

    fn process(&self, p: &mut Packet) -> Result<(), DropReason> {
        jitter(p.counter);
        let (hdr, body) = p.buf[..HDR + p.len].split_at_mut(HDR);
        self.key
            .open(p.counter, hdr, body)
            .map_err(|_| DropReason::Auth)?;
        p.len -= TAG_LEN;
        Ok(())
    }
}

/// Emitter of the seal side: hands frames to the open side's sequencer (the "network").
struct Wire(Vec<Packet>);

impl Sink for Wire {
    type Item = Packet;
    fn emit(&mut self, p: Packet) -> Result<(), DropReason> {
        self.0.push(p);
        Ok(())
    }
}

/// Emitter of the open side: the in-order replay window update, then delivery.
struct Deliver {
    window: Arc<Mutex<ReplayWindow>>,
    out: Vec<Vec<u8>>,
}

impl Sink for Deliver {
    type Item = Packet;
    fn emit(&mut self, p: Packet) -> Result<(), DropReason> {
        self.window
            .lock()
            .unwrap()
            .accept(p.counter)
            .map_err(|_| DropReason::Replay)?;
        self.out.push(p.buf[HDR..HDR + p.len].to_vec());
        Ok(())
    }
}

fn payload(i: usize) -> Vec<u8> {
    let len = 1 + (i * 37) % 1420;
    (0..len).map(|j| (i + j) as u8).collect()
}

#[test]
fn seal_then_open_in_order_with_replays_refused() {
    const N: usize = 20_000;
    for backend in Backend::ALL {
        let pool = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(4)
                .build()
                .unwrap(),
        );
        let key = Key::from_bytes([0x42; 32]);
        let config = Config {
            batch_size: 8,
            batches_in_flight: 32,
            ..Config::default()
        };

        let seal = Seal {
            key: backend.key(&key),
            next_counter: AtomicU64::new(0),
        };
        let (mut tx, tx_emit) = start(&config, pool.clone(), seal, Wire(Vec::new())).unwrap();
        for i in 0..N {
            let p = payload(i);
            let mut buf = vec![0u8; HDR + p.len() + TAG_LEN];
            buf[0] = 1;
            buf[1] = 3;
            buf[HDR..HDR + p.len()].copy_from_slice(&p);
            tx.push_wait(Packet {
                buf,
                len: p.len(),
                counter: 0,
            })
            .map_err(|_| "refused")
            .unwrap();
        }
        let tx_stats = tx.counters().clone();
        drop(tx);
        let wire = tx_emit.join().0;
        let tx_stats = tx_stats.snapshot();
        assert_eq!((tx_stats.out_of_order, tx_stats.dropped_total()), (0, 0));
        // Counters on the wire follow arrival order exactly.
        let first_bad = wire
            .iter()
            .enumerate()
            .find(|(i, p)| p.counter != *i as u64)
            .map(|(i, p)| (i, p.counter, wire.len()));
        assert_eq!(first_bad, None);

        let window = Arc::new(Mutex::new(ReplayWindow::default()));
        let open = Open {
            key: backend.key(&key),
            window: window.clone(),
        };
        let (mut rx, rx_emit) = start(
            &config,
            pool,
            open,
            Deliver {
                window,
                out: Vec::new(),
            },
        )
        .unwrap();
        let replays: Vec<Packet> = wire
            .iter()
            .step_by(1000)
            .map(|p| Packet {
                buf: p.buf.clone(),
                len: p.len,
                counter: 0,
            })
            .collect();
        let mut refused_early = 0;
        for p in wire.into_iter().chain(replays) {
            match rx.push_wait(p) {
                Ok(()) => {}
                Err(Rejected::Dropped(_, DropReason::Replay)) => refused_early += 1,
                Err(_) => panic!("unexpected refusal"),
            }
        }
        let rx_stats = rx.counters().clone();
        drop(rx);
        let delivered = rx_emit.join().out;
        assert_eq!(delivered.len(), N, "{backend}");
        assert!(
            delivered.iter().enumerate().all(|(i, d)| *d == payload(i)),
            "{backend}: payload or order differs"
        );
        let stats = rx_stats.snapshot();
        assert_eq!(stats.out_of_order, 0);
        // Every replay was refused, by the sequencer's pre-check when the original had already
        // been accepted, otherwise by the emitter's in-order window update. Both count.
        assert_eq!(stats.dropped(DropReason::Replay), (N / 1000) as u64);
        assert!(refused_early <= N / 1000);
    }
}

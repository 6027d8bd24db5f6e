//! An 802.1Q access port, in user space: the kernels these tests run on may have no VLAN
//! support (no 8021q, no bridge VLAN filtering), but every kernel strips a received tag and
//! hands it to packet sockets beside the frame. A relay namespace sits between a device and
//! a LAN switch: what the device sends leaves tagged with the port's VLAN, and of what the
//! switch floods or forwards, only that VLAN's frames reach the device, untagged, as a
//! managed switch's access port would do.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use cyphonic_netio::{FrameMeta, PacketSocket};

use crate::Netns;

/// The tag protocol identifier.
const TPID: [u8; 2] = [0x81, 0x00];

/// A device's access port on VLAN `vid` towards a trunk. Stops when dropped.
pub struct AccessPort {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    _ns: Netns,
}

impl AccessPort {
    /// Joins `device`'s new interface `device_if` to `switch`'s new port `switch_if` (which
    /// the caller attaches to its bridge) through VLAN `vid`.
    ///
    /// # Errors
    /// A namespace, veth or socket cannot be made.
    pub fn new(
        device: &Netns,
        device_if: &str,
        switch: &Netns,
        switch_if: &str,
        vid: u16,
    ) -> anyhow::Result<Self> {
        let (ns, a, b) =
            crate::impair::middle(device, device_if, switch, switch_if, "vlan", 1 << 20)?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let up_tx = b.try_clone()?;
        let down_tx = a.try_clone()?;
        let s = stop.clone();
        threads.push(std::thread::spawn(move || {
            relay(a, &s, |frame, _| {
                let mut tagged = Vec::with_capacity(frame.len() + 4);
                tagged.extend_from_slice(&frame[..12]);
                tagged.extend_from_slice(&TPID);
                tagged.extend_from_slice(&vid.to_be_bytes());
                tagged.extend_from_slice(&frame[12..]);
                let _ = up_tx.send(&tagged);
            });
        }));
        let s = stop.clone();
        threads.push(std::thread::spawn(move || {
            relay(b, &s, |frame, m| {
                // The kernel took the tag off and handed it over; a frame still tagged in
                // its bytes (a second tag) is not this port's.
                if m.vlan == Some(vid) && frame[12..14] != TPID {
                    let _ = down_tx.send(frame);
                }
            });
        }));
        Ok(Self {
            stop,
            threads,
            _ns: ns,
        })
    }
}

impl std::fmt::Debug for AccessPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessPort").finish_non_exhaustive()
    }
}

impl Drop for AccessPort {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Hands each frame `rx` receives (but its own sends) to `each` until `stop`.
fn relay(mut rx: PacketSocket, stop: &AtomicBool, mut each: impl FnMut(&[u8], &FrameMeta)) {
    const BATCH: usize = 16;
    let mut store = vec![[0u8; 2048]; BATCH];
    let mut meta = [FrameMeta::default(); BATCH];
    while !stop.load(Ordering::Relaxed) {
        let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|b| &mut b[..]).collect();
        let n = match rx.wait_readable(Duration::from_millis(10)) {
            Ok(true) => rx.recv_batch(&mut bufs, &mut meta).unwrap_or(0),
            _ => 0,
        };
        for (buf, m) in bufs.iter().zip(&meta).take(n) {
            if !m.outgoing && !m.truncated && m.len >= 14 {
                each(&buf[..m.len], m);
            }
        }
    }
}

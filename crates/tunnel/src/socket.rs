//! The seam between the engine and its underlay socket: the engine sends and receives
//! datagrams through [`TunnelSocket`], implemented by the real UDP socket
//! (`cyphonic_netio::UdpSocket`) and by the in-memory link of `testing` (feature
//! `testing`), which lets two engines run against each other in one process, with faults
//! injected (smoltcp's `phy::Device` and its fault injector are the model).
//!
//! The calls are batched (one virtual call per `recvmmsg`/`sendmmsg` batch, not per packet),
//! so the indirection costs nothing measurable.

use std::io;
use std::net::SocketAddr;

use cyphonic_netio::{DatagramMeta, UdpOptions, UdpSocket, cbpf};
use cyphonic_wire::{FLAG_SPARSE, MessageType, Versions, field};

/// A datagram socket on the underlay, as the engine uses it. Each thread owns its own handle
/// ([`TunnelSocket::try_clone_box`]).
pub trait TunnelSocket: Send + std::fmt::Debug {
    /// Receives up to `bufs.len()` datagrams: waits a short while (about 10 ms) for the first,
    /// then takes what is queued. Returns how many arrived, 0 when none came in time; `meta[i]`
    /// describes `bufs[i]`.
    ///
    /// # Errors
    /// The socket failed.
    fn recv_batch(
        &mut self,
        bufs: &mut [&mut [u8]],
        meta: &mut [DatagramMeta],
    ) -> io::Result<usize>;

    /// Sends datagrams in order; returns (sent, failed, the last error). A refused datagram
    /// does not stop the others.
    fn send_batch(&self, msgs: &[(SocketAddr, &[u8])]) -> (usize, usize, Option<io::Error>);

    /// Sends one datagram.
    ///
    /// # Errors
    /// The socket refused it.
    fn send_to(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize>;

    /// Sends one datagram with an IP TTL (IPv6 hop limit) of `hops`, for this one only (a
    /// hole punch).
    ///
    /// # Errors
    /// The socket refused it.
    fn send_to_hops(&self, buf: &[u8], to: SocketAddr, hops: u8) -> io::Result<usize>;

    /// Another handle on the same socket, for another thread.
    ///
    /// # Errors
    /// The handle cannot be made (`dup(2)`).
    fn try_clone_box(&self) -> io::Result<Box<dyn TunnelSocket>>;

    /// The address the socket is bound to.
    ///
    /// # Errors
    /// It cannot be read.
    fn local_addr(&self) -> io::Result<SocketAddr>;

    /// Sockets on this one's port to which the underlay steers the data frames flagged
    /// sparse ([`sparse_program`]), one per entry of `threads` (the CPU its reader runs on,
    /// [`crate::DataPlane::sparse_threads`]), each with a queue of its own, opened with
    /// `opts`; none where the socket has no such thing (the default: the in-memory link).
    ///
    /// # Errors
    /// The kernel refused (the socket was not opened for steering, or the kernel is older
    /// than Linux 4.5).
    fn sparse_companions(
        &self,
        opts: &UdpOptions,
        threads: &[Option<usize>],
    ) -> io::Result<Vec<Box<dyn TunnelSocket>>> {
        let _ = (opts, threads);
        Ok(Vec::new())
    }
}

/// The classic BPF program that steers a datagram to a sparse companion when it is a data
/// frame of this release's versions ([`Versions::OURS`]; an engine playing another release
/// in tests reads on the in-memory link, which steers nothing) flagged `FLAG_SPARSE`
/// (docs/protocol.md §1), and to the tunnel socket (0) otherwise: companion `1 + i` when the
/// program runs on `cpus[i]` (the CPU that received the datagram, where that companion's
/// reader runs), companion 1 elsewhere or without `cpus`. The flag is a hint, unauthenticated until the frame opens: a forged one
/// only moves the datagram to a companion, which together take no more than the express
/// lane's rate and open nothing the tunnel socket would not have opened anyway.
pub fn sparse_program(cpus: &[usize]) -> Vec<cbpf::Insn> {
    let data = u32::from(u8::from(MessageType::Data));
    #[expect(clippy::cast_possible_truncation, reason = "header offsets: 0 to 3")]
    let (version, kind, flags) = (
        field::VERSION as u32,
        field::TYPE as u32,
        field::FLAGS.start as u32,
    );
    let versions = Versions::OURS;
    let mut program = vec![
        cbpf::load_byte(version),
        cbpf::jump_ge(u32::from(versions.oldest()), 0, 5),
        cbpf::jump_ge(u32::from(versions.newest()) + 1, 4, 0),
        cbpf::load_byte(kind),
        cbpf::jump_eq(data, 0, 2),
        cbpf::load_half(flags),
        cbpf::jump_set(u32::from(FLAG_SPARSE), 1, 0),
        cbpf::ret(0), // 7: the tunnel socket; a companion's answer from 8 on
    ];
    if cpus.is_empty() {
        program.push(cbpf::ret(1));
    } else {
        program.extend(cbpf::by_cpu(cpus, |i| u32::try_from(i + 1).unwrap_or(1)));
    }
    program
}

impl TunnelSocket for UdpSocket {
    fn recv_batch(
        &mut self,
        bufs: &mut [&mut [u8]],
        meta: &mut [DatagramMeta],
    ) -> io::Result<usize> {
        Self::recv_batch(self, bufs, meta)
    }

    fn send_batch(&self, msgs: &[(SocketAddr, &[u8])]) -> (usize, usize, Option<io::Error>) {
        Self::send_batch(self, msgs)
    }

    fn send_to(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        Self::send_to(self, buf, to)
    }

    fn send_to_hops(&self, buf: &[u8], to: SocketAddr, hops: u8) -> io::Result<usize> {
        Self::send_to_hops(self, buf, to, hops)
    }

    fn try_clone_box(&self) -> io::Result<Box<dyn TunnelSocket>> {
        Ok(Box::new(self.try_clone()?))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Self::local_addr(self)
    }

    fn sparse_companions(
        &self,
        opts: &UdpOptions,
        threads: &[Option<usize>],
    ) -> io::Result<Vec<Box<dyn TunnelSocket>>> {
        let cpus: Vec<usize> = threads.iter().flatten().copied().collect();
        let program = sparse_program(&cpus);
        // The port's sockets are numbered in the order they were bound: the companions
        // 1, 2, .. as `threads`.
        threads
            .iter()
            .map(|_| {
                let companion = self.steered(&program, opts).map_err(io::Error::other)?;
                Ok(Box::new(companion) as Box<dyn TunnelSocket>)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cyphonic_wire::{FLAG_CHECKSUM_DEFERRED, Frame, FrameRepr, HEADER_LEN, OLDEST, VERSION};

    use super::*;

    /// A frame of `kind` with `flags` and a body of `body` bytes, as a peer would send it
    /// (the body's contents do not matter to the steering).
    fn frame(kind: MessageType, flags: u16, body: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; HEADER_LEN + body];
        let repr = FrameRepr {
            version: VERSION,
            msg_type: kind,
            flags,
            receiver_index: 7,
            counter: 0,
            body_len: body,
        };
        repr.emit(&mut Frame::new_unchecked(&mut bytes[..]));
        bytes
    }

    /// `main`'s sparse companions for `threads`, or `None` (said) where the steering
    /// program is refused: qemu-user (the aarch64 test run) does not translate
    /// `SO_ATTACH_REUSEPORT_CBPF`; a kernel (4.5 and later) takes it, so on x86-64 a refusal
    /// fails the test.
    fn companions_or_skip(
        main: &UdpSocket,
        opts: &UdpOptions,
        threads: &[Option<usize>],
    ) -> Option<Vec<Box<dyn TunnelSocket>>> {
        match main.sparse_companions(opts, threads) {
            Ok(c) => Some(c),
            Err(e) => {
                assert!(std::env::consts::ARCH != "x86_64", "{e}");
                eprintln!("steering refused (emulated?): not checked here: {e}");
                None
            }
        }
    }

    /// What `socket` receives within a short wait: each datagram's version, type and flags
    /// (zeros for one shorter than a header).
    fn received(socket: &mut dyn TunnelSocket) -> Vec<(u8, u8, u16)> {
        let mut got = Vec::new();
        let mut store = vec![[0u8; 2048]; 8];
        loop {
            let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|b| &mut b[..]).collect();
            let mut meta = [DatagramMeta::default(); 8];
            let n = socket.recv_batch(&mut bufs, &mut meta).unwrap();
            if n == 0 {
                return got;
            }
            for (b, m) in bufs[..n].iter().zip(&meta) {
                got.push(if m.len < HEADER_LEN {
                    (0, 0, 0)
                } else {
                    let f = Frame::new_unchecked(&b[..m.len]);
                    (f.version(), u8::from(f.msg_type()), f.flags())
                });
            }
        }
    }

    /// One companion per CPU: a flagged frame goes to the companion of the CPU that received
    /// it (on loopback, the sender's: the test pins itself to each in turn).
    #[test]
    fn each_cpu_s_flagged_frames_go_to_that_cpu_s_companion() {
        let cpus = cyphonic_netio::allowed_cpus().unwrap();
        if cpus.len() < 2 {
            eprintln!("one CPU: nothing to steer between");
            return;
        }
        let cpus = &cpus[..2];
        let opts = UdpOptions {
            steering: true,
            coalescing: false,
            recv_timeout: Some(Duration::from_millis(50)),
            ..UdpOptions::default()
        };
        let mut main = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts).unwrap();
        let threads: Vec<Option<usize>> = cpus.iter().copied().map(Some).collect();
        let Some(mut companions) = companions_or_skip(&main, &opts, &threads) else {
            return;
        };
        assert_eq!(companions.len(), 2);
        let to = TunnelSocket::local_addr(&main).unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // From each CPU: a flagged frame (marked by its length) and an unflagged one.
        let sender = std::thread::spawn(move || {
            for (i, &cpu) in threads.iter().flatten().enumerate() {
                cyphonic_netio::Placement {
                    cpus: vec![cpu],
                    realtime_priority: 0,
                }
                .apply()
                .unwrap();
                tx.send_to(&frame(MessageType::Data, FLAG_SPARSE, 100 + i), to)
                    .unwrap();
                tx.send_to(&frame(MessageType::Data, 0, 1400), to).unwrap();
            }
        });
        sender.join().unwrap();
        let data = u8::from(MessageType::Data);
        for (i, companion) in companions.iter_mut().enumerate() {
            let mut buf = vec![0u8; 2048];
            let mut meta = [DatagramMeta::default()];
            let n = companion
                .recv_batch(&mut [&mut buf[..]], &mut meta)
                .unwrap();
            assert_eq!((n, meta[0].len), (1, HEADER_LEN + 100 + i), "companion {i}");
            assert_eq!(received(companion.as_mut()), [], "companion {i}: one only");
        }
        assert_eq!(
            received(&mut main),
            [(VERSION, data, 0), (VERSION, data, 0)]
        );
    }

    #[test]
    fn the_kernel_steers_flagged_data_frames_to_the_sparse_companion_and_nothing_else() {
        let opts = UdpOptions {
            steering: true,
            recv_timeout: Some(Duration::from_millis(50)),
            ..UdpOptions::default()
        };
        let mut main = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts).unwrap();
        let companion_opts = UdpOptions {
            coalescing: false,
            ..opts.clone()
        };
        let Some(mut companion) = companions_or_skip(&main, &companion_opts, &[None])
            .map(|mut c| c.pop().expect("a real socket has a companion"))
        else {
            return;
        };
        let to = TunnelSocket::local_addr(&main).unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let data = u8::from(MessageType::Data);
        let sent = [
            frame(MessageType::Data, FLAG_SPARSE, 100),
            frame(MessageType::Data, 0, 1400),
            frame(MessageType::Data, FLAG_SPARSE | FLAG_CHECKSUM_DEFERRED, 100),
            frame(MessageType::Data, FLAG_CHECKSUM_DEFERRED, 1400),
            // Only data frames are steered, whatever their flags say.
            frame(MessageType::Keepalive, FLAG_SPARSE, 16),
            frame(MessageType::HandshakeInit, FLAG_SPARSE, 200),
        ];
        for bytes in &sent {
            tx.send_to(bytes, to).unwrap();
        }
        // Flagged data frames of versions just outside ours, and a datagram too short to
        // hold a header.
        let mut newer = frame(MessageType::Data, FLAG_SPARSE, 100);
        newer[field::VERSION] = VERSION + 1;
        tx.send_to(&newer, to).unwrap();
        let mut older = newer.clone();
        older[field::VERSION] = OLDEST - 1;
        tx.send_to(&older, to).unwrap();
        tx.send_to(&[VERSION, data], to).unwrap();
        let (v, keepalive, init) = (
            VERSION,
            u8::from(MessageType::Keepalive),
            u8::from(MessageType::HandshakeInit),
        );
        assert_eq!(
            received(companion.as_mut()),
            [
                (v, data, FLAG_SPARSE),
                (v, data, FLAG_SPARSE | FLAG_CHECKSUM_DEFERRED)
            ]
        );
        assert_eq!(
            received(&mut main),
            [
                (v, data, 0),
                (v, data, FLAG_CHECKSUM_DEFERRED),
                (v, keepalive, FLAG_SPARSE),
                (v, init, FLAG_SPARSE),
                (v + 1, data, FLAG_SPARSE),
                (OLDEST - 1, data, FLAG_SPARSE),
                (0, 0, 0),
            ]
        );
    }
}

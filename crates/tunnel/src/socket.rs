//! The seam between the engine and its underlay socket: the engine sends and receives
//! datagrams through [`TunnelSocket`], implemented by the real UDP socket
//! (`cyphonic_netio::UdpSocket`) and by the in-memory link of [`crate::testing`], which lets
//! two engines run against each other in one process, with faults injected (smoltcp's
//! `phy::Device` and its fault injector are the model).
//!
//! The calls are batched (one virtual call per `recvmmsg`/`sendmmsg` batch, not per packet),
//! so the indirection costs nothing measurable.

use std::io;
use std::net::SocketAddr;

use cyphonic_netio::{DatagramMeta, UdpSocket};

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
}

//! The tunnel's underlay socket: UDP over IPv4 and IPv6, in batches.

use std::io;
use std::mem::zeroed;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::NetError;
use crate::sys::{self, MAX_BATCH, Received};

/// How to open a [`UdpSocket`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpOptions {
    /// Kernel receive buffer, bytes. The default ~208 KB drops bursts at gigabit rates and is
    /// the main source of TCP retransmissions through userspace tunnels.
    pub recv_buffer: usize,
    /// Kernel send buffer, bytes.
    pub send_buffer: usize,
    /// How long [`UdpSocket::recv_batch`] waits for a first datagram. `None` waits forever.
    pub recv_timeout: Option<Duration>,
}

impl Default for UdpOptions {
    fn default() -> Self {
        Self {
            recv_buffer: 4 << 20,
            send_buffer: 4 << 20,
            recv_timeout: Some(Duration::from_millis(10)),
        }
    }
}

/// What the kernel told us about one received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatagramMeta {
    /// The datagram's full length, even when it did not fit the buffer.
    pub len: usize,
    /// Longer than the buffer: only its head is there.
    pub truncated: bool,
    /// The sender (IPv4 senders on a dual-stack socket are reported as IPv4).
    pub from: SocketAddr,
}

impl Default for DatagramMeta {
    fn default() -> Self {
        Self {
            len: 0,
            truncated: false,
            from: SocketAddr::from(([0, 0, 0, 0], 0)),
        }
    }
}

/// A bound UDP socket. Bound to `[::]`, it is dual-stack: IPv4 and IPv6 peers on one socket.
#[derive(Debug)]
pub struct UdpSocket {
    sock: Socket,
    v6: bool,
    recv_buffer: usize,
    send_buffer: usize,
}

impl UdpSocket {
    /// Binds `addr`. An unspecified IPv6 address gives a dual-stack socket; if the host has no
    /// IPv6 at all, binding `[::]` falls back to `0.0.0.0` on the same port.
    ///
    /// # Errors
    /// [`NetError::NotPermitted`] for a privileged port without `CAP_NET_BIND_SERVICE`, or the
    /// bind error (address in use, not available).
    pub fn bind(addr: SocketAddr, opts: &UdpOptions) -> Result<Self, NetError> {
        let target = addr.to_string();
        let io_err = |op, e| NetError::from_io(op, &target, "CAP_NET_BIND_SERVICE", e);
        let (sock, addr) = match Self::open(addr) {
            Err(e)
                if addr.is_ipv6()
                    && addr.ip().is_unspecified()
                    && e.raw_os_error() == Some(libc::EAFNOSUPPORT) =>
            {
                let v4 = SocketAddr::from(([0, 0, 0, 0], addr.port()));
                (
                    Self::open(v4).map_err(|e| io_err("opening a UDP socket", e))?,
                    v4,
                )
            }
            other => (other.map_err(|e| io_err("opening a UDP socket", e))?, addr),
        };
        sock.bind(&addr.into())
            .map_err(|e| io_err("binding the UDP socket", e))?;
        let raw = sock.as_raw_fd();
        let recv_buffer =
            sys::set_buffer(raw, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, opts.recv_buffer)
                .map_err(|e| io_err("sizing the UDP receive buffer", e))?;
        let send_buffer =
            sys::set_buffer(raw, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, opts.send_buffer)
                .map_err(|e| io_err("sizing the UDP send buffer", e))?;
        sys::set_recv_timeout(raw, opts.recv_timeout)
            .map_err(|e| io_err("setting the receive timeout", e))?;
        Ok(Self {
            sock,
            v6: addr.is_ipv6(),
            recv_buffer,
            send_buffer,
        })
    }

    fn open(addr: SocketAddr) -> io::Result<Socket> {
        let sock = Socket::new(
            Domain::for_address(addr),
            Type::DGRAM.cloexec(),
            Some(Protocol::UDP),
        )?;
        if addr.is_ipv6() && addr.ip().is_unspecified() {
            sock.set_only_v6(false)?;
        }
        Ok(sock)
    }

    /// The bound address.
    ///
    /// # Errors
    /// `getsockname(2)` failing.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("not an IP socket"))
    }

    /// Receive and send buffer sizes the kernel granted, in bytes.
    pub const fn buffer_sizes(&self) -> (usize, usize) {
        (self.recv_buffer, self.send_buffer)
    }

    /// Receives up to `bufs.len()` datagrams (at most 64) in one system call: waits for the
    /// first (up to the receive timeout), then takes what is queued. Returns how many arrived;
    /// 0 on timeout.
    ///
    /// # Errors
    /// A failing system call other than timeout or interruption.
    pub fn recv_batch(
        &mut self,
        bufs: &mut [&mut [u8]],
        meta: &mut [DatagramMeta],
    ) -> io::Result<usize> {
        // SAFETY: sockaddr_storage is plain old data; all-zero is valid; the kernel fills it.
        let mut names: [libc::sockaddr_storage; MAX_BATCH] = unsafe { zeroed() };
        let mut out = [Received::default(); MAX_BATCH];
        let n = bufs.len().min(meta.len());
        let got = sys::recvmmsg(
            self.sock.as_raw_fd(),
            &mut bufs[..n],
            &mut names,
            &mut [],
            &mut out,
            libc::MSG_TRUNC | libc::MSG_WAITFORONE,
        )?;
        let mut kept = 0;
        for i in 0..got {
            // A datagram without an IP source cannot be answered; it cannot happen on a UDP
            // socket, but if it did, it is skipped rather than trusted.
            let Some(from) = sys::decode_addr(&names[i]) else {
                continue;
            };
            if kept != i {
                bufs.swap(kept, i);
            }
            meta[kept] = DatagramMeta {
                len: out[i].len,
                truncated: out[i].flags & libc::MSG_TRUNC != 0,
                from,
            };
            kept += 1;
        }
        Ok(kept)
    }

    /// Sends one datagram.
    ///
    /// # Errors
    /// The system call's error.
    pub fn send_to(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        let (storage, len) = sys::encode_addr(to, self.v6);
        // SAFETY: `buf` and `storage` are live for the call; the kernel only reads them.
        let sent = unsafe {
            libc::sendto(
                self.sock.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                0,
                std::ptr::from_ref(&storage).cast(),
                len,
            )
        };
        usize::try_from(sent).map_err(|_| io::Error::last_os_error())
    }

    /// Sends datagrams in as few system calls as possible. Returns (sent, failed, last
    /// error); a refused datagram does not stop the others.
    pub fn send_batch(&self, msgs: &[(SocketAddr, &[u8])]) -> (usize, usize, Option<io::Error>) {
        let (mut sent, mut failed, mut last) = (0, 0, None);
        let mut frames = [&[][..]; MAX_BATCH];
        for chunk in msgs.chunks(MAX_BATCH) {
            let mut names = [(zeroed_storage(), 0); MAX_BATCH];
            for (i, (to, frame)) in chunk.iter().enumerate() {
                names[i] = sys::encode_addr(*to, self.v6);
                frames[i] = frame;
            }
            let (s, f, e) = sys::sendmmsg(
                self.sock.as_raw_fd(),
                &frames[..chunk.len()],
                &names[..chunk.len()],
            );
            sent += s;
            failed += f;
            last = e.or(last);
        }
        (sent, failed, last)
    }

    /// A second handle on the same socket, for another thread.
    ///
    /// # Errors
    /// `dup(2)` failing.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            sock: self.sock.try_clone()?,
            v6: self.v6,
            recv_buffer: self.recv_buffer,
            send_buffer: self.send_buffer,
        })
    }
}

fn zeroed_storage() -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    unsafe { zeroed() }
}

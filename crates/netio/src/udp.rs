//! The tunnel's underlay socket: UDP over IPv4 and IPv6, in batches.

use std::io;
use std::mem::zeroed;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::NetError;
use crate::busy::{self, BusyPoll};
use crate::sys::{self, MAX_BATCH, Received, Run};

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
    /// Send runs of equal-size datagrams to one peer as one `UDP_SEGMENT` (GSO) message. Falls
    /// back to one message per datagram by itself where the kernel refuses.
    pub segmentation: bool,
    /// Let the kernel hand over runs of datagrams from one sender as one buffer (UDP GRO);
    /// [`UdpSocket::recv_batch`] splits them again, so callers still see datagrams. Costs one
    /// copy per datagram and a 1 MiB receive area; saves the kernel's per-datagram queueing.
    pub coalescing: bool,
    /// After a datagram, keep asking for the next one without sleeping for this long (see
    /// [`BusyPoll`]); zero: off, the receive blocks.
    pub busy_poll: Duration,
    /// Have the kernel stamp each datagram as it comes in, so [`DatagramMeta::queued`] says
    /// how long it waited for us (`SO_TIMESTAMPNS`).
    pub timestamps: bool,
    /// Open the port for a steered companion ([`UdpSocket::steered`]): `SO_REUSEPORT`, after
    /// making sure nobody holds the port already (a second daemon on it still fails to
    /// bind, as without).
    pub steering: bool,
}

impl Default for UdpOptions {
    fn default() -> Self {
        Self {
            recv_buffer: 4 << 20,
            send_buffer: 4 << 20,
            recv_timeout: Some(Duration::from_millis(10)),
            segmentation: true,
            coalescing: true,
            busy_poll: Duration::ZERO,
            timestamps: false,
            steering: false,
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
    /// How long it waited between the kernel's first sight of it and the receive that read
    /// it (the host's backlog and this socket's queue), with [`UdpOptions::timestamps`]. The
    /// datagrams of one coalesced receive share the first one's.
    pub queued: Option<Duration>,
}

impl Default for DatagramMeta {
    fn default() -> Self {
        Self {
            len: 0,
            truncated: false,
            from: SocketAddr::from(([0, 0, 0, 0], 0)),
            queued: None,
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
    /// Segmentation offload still in use (shared by clones: one refusal turns it off for all).
    segmentation: Arc<AtomicBool>,
    /// The kernel coalesces received datagrams (`UDP_GRO` was accepted).
    coalescing: bool,
    /// Where coalesced datagrams land before they are split; made on the first receive (the
    /// clones that only send never need one).
    split: Option<Box<Split>>,
    /// Busy polling on receive ([`UdpOptions::busy_poll`]).
    busy: Option<BusyPoll>,
    /// Datagrams carry the kernel's receive stamp ([`UdpOptions::timestamps`]).
    timestamps: bool,
    /// Bound with `SO_REUSEPORT` ([`UdpOptions::steering`]).
    steering: bool,
}

/// `SO_ATTACH_REUSEPORT_CBPF` (`asm-generic/socket.h`; the same on x86-64 and arm64), which
/// the libc crate does not export for glibc targets.
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// Coalesced receives in flight per `recvmmsg`.
const COALESCED_MESSAGES: usize = 16;
/// Room for one coalesced receive: a UDP datagram's largest length.
const COALESCED_BYTES: usize = 1 << 16;

/// One datagram of a coalesced receive, not yet handed out.
#[derive(Debug, Clone, Copy)]
struct Segment {
    offset: usize,
    /// Bytes of it that arrived.
    len: usize,
    /// Its full length (more than `len` when the kernel cut the receive short).
    full: usize,
    from: SocketAddr,
    queued: Option<Duration>,
}

/// Coalesced receives and the datagrams they hold, handed out in arrival order.
#[derive(Debug)]
struct Split {
    area: Box<[u8]>,
    segments: Vec<Segment>,
    next: usize,
}

impl Split {
    fn new() -> Self {
        Self {
            area: vec![0; COALESCED_MESSAGES * COALESCED_BYTES].into_boxed_slice(),
            segments: Vec::with_capacity(COALESCED_MESSAGES * MAX_SEGMENTS),
            next: 0,
        }
    }

    /// One `recvmmsg` into the area (waiting up to the socket's timeout for the first);
    /// records every datagram it holds.
    fn fill(
        &mut self,
        fd: libc::c_int,
        busy: Option<&mut BusyPoll>,
        timestamps: bool,
    ) -> io::Result<()> {
        self.segments.clear();
        self.next = 0;
        // SAFETY: sockaddr_storage is plain old data; all-zero is valid; the kernel fills it.
        let mut names: [libc::sockaddr_storage; COALESCED_MESSAGES] = unsafe { zeroed() };
        let mut controls = [sys::Control::EMPTY; COALESCED_MESSAGES];
        let mut out = [Received::default(); COALESCED_MESSAGES];
        let mut pieces = self.area.chunks_mut(COALESCED_BYTES);
        let mut slices: [&mut [u8]; COALESCED_MESSAGES] =
            std::array::from_fn(|_| pieces.next().expect("the area holds every message"));
        let got = busy::receive(busy, |wait| {
            sys::recvmmsg(
                fd,
                &mut slices,
                &mut names,
                &mut controls,
                &mut out,
                libc::MSG_TRUNC | libc::MSG_WAITFORONE | busy::dont_wait(wait),
            )
        })?;
        let now = (timestamps && got > 0).then(sys::realtime);
        for i in 0..got {
            let Some(from) = sys::decode_addr(&names[i]) else {
                continue;
            };
            let queued = now.and_then(|now| sys::queued_for(&controls[i], out[i].control_len, now));
            // SAFETY: the UDP_GRO control message holds a C int; any value is valid.
            let segment = unsafe {
                sys::find_control::<libc::c_int>(
                    &controls[i],
                    out[i].control_len,
                    libc::SOL_UDP,
                    libc::UDP_GRO,
                )
            };
            cut(
                i * COALESCED_BYTES,
                out[i].len,
                COALESCED_BYTES,
                segment.and_then(|s| usize::try_from(s).ok()),
                (from, queued),
                &mut self.segments,
            );
        }
        Ok(())
    }

    /// Copies out up to `bufs.len()` datagrams; returns how many.
    fn take(&mut self, bufs: &mut [&mut [u8]], meta: &mut [DatagramMeta]) -> usize {
        let mut n = 0;
        while n < bufs.len().min(meta.len()) && self.next < self.segments.len() {
            let s = self.segments[self.next];
            self.next += 1;
            let copy = s.len.min(bufs[n].len());
            bufs[n][..copy].copy_from_slice(&self.area[s.offset..s.offset + copy]);
            meta[n] = DatagramMeta {
                len: s.full,
                truncated: s.full > copy,
                from: s.from,
                queued: s.queued,
            };
            n += 1;
        }
        n
    }
}

/// The datagrams of one receive of `full` bytes at `offset` (of which at most `room` arrived),
/// coalesced in `segment`-byte pieces (the last may be shorter) or, without a segment size, one.
fn cut(
    offset: usize,
    full: usize,
    room: usize,
    segment: Option<usize>,
    (from, queued): (SocketAddr, Option<Duration>),
    out: &mut Vec<Segment>,
) {
    let step = match segment {
        Some(s) if s > 0 && s < full => s,
        _ => full.max(1),
    };
    let mut at = 0;
    loop {
        let whole = step.min(full - at);
        out.push(Segment {
            offset: offset + at,
            len: whole.min(room.saturating_sub(at)),
            full: whole,
            from,
            queued,
        });
        at += whole;
        // A cut-short receive ends with its first incomplete datagram.
        if at >= full || at >= room {
            break;
        }
    }
}

/// Most datagrams in one `UDP_SEGMENT` send (the kernel's `UDP_MAX_SEGMENTS`).
const MAX_SEGMENTS: usize = 64;
/// Most bytes in one `UDP_SEGMENT` send: the IPv4 total length leaves 65,507 for UDP payload.
const MAX_SEGMENTED_BYTES: usize = 65_000;

/// Cuts `msgs` into runs that one segmented send can carry: consecutive datagrams to the same
/// peer, all as long as the first but the last, which may be shorter (it ends the run), at most
/// `max_segments` (1: every datagram alone) and [`MAX_SEGMENTED_BYTES`]. Order is kept: runs
/// are taken front to back. Returns how many runs were written to `out` (which holds at least
/// as many as `msgs`).
fn runs(msgs: &[(SocketAddr, &[u8])], max_segments: usize, out: &mut [Run]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < msgs.len() {
        let (to, first) = msgs[i];
        let segment = first.len();
        let mut count = 1;
        let mut bytes = segment;
        if segment > 0 {
            while let Some((next_to, next)) = msgs.get(i + count) {
                if *next_to != to
                    || next.len() > segment
                    || next.is_empty()
                    || count == max_segments
                    || bytes + next.len() > MAX_SEGMENTED_BYTES
                {
                    break;
                }
                count += 1;
                bytes += next.len();
                if next.len() < segment {
                    break;
                }
            }
        }
        out[n] = Run {
            start: i,
            count,
            segment,
        };
        n += 1;
        i += count;
    }
    n
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
        if opts.steering && addr.port() != 0 {
            // A port someone holds stays refused: bind it once without sharing first (and let
            // it go), so that only our own companion can join the port.
            Self::open(addr)
                .and_then(|probe| probe.bind(&addr.into()))
                .map_err(|e| io_err("binding the UDP socket", e))?;
        }
        // Where sharing is refused (an emulator that does not translate the option), the
        // socket works alone: `steered` then says so.
        let steering = opts.steering && sock.set_reuse_port(true).is_ok();
        sock.bind(&addr.into())
            .map_err(|e| io_err("binding the UDP socket", e))?;
        Self::finish(
            sock,
            addr,
            &UdpOptions {
                steering,
                ..opts.clone()
            },
            &io_err,
        )
    }

    /// The options beyond the bind.
    fn finish(
        sock: Socket,
        addr: SocketAddr,
        opts: &UdpOptions,
        io_err: &dyn Fn(&'static str, io::Error) -> NetError,
    ) -> Result<Self, NetError> {
        let raw = sock.as_raw_fd();
        let recv_buffer =
            sys::set_buffer(raw, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, opts.recv_buffer)
                .map_err(|e| io_err("sizing the UDP receive buffer", e))?;
        let send_buffer =
            sys::set_buffer(raw, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, opts.send_buffer)
                .map_err(|e| io_err("sizing the UDP send buffer", e))?;
        sys::set_recv_timeout(raw, opts.recv_timeout)
            .map_err(|e| io_err("setting the receive timeout", e))?;
        // Stamps only measure: a kernel (or an emulator) that refuses them leaves the
        // datagrams without (`queued` stays `None`; `Self::timestamps` says so).
        let timestamps = opts.timestamps && sys::ask_timestamps(raw).is_ok();
        Ok(Self {
            sock,
            v6: addr.is_ipv6(),
            recv_buffer,
            send_buffer,
            segmentation: Arc::new(AtomicBool::new(opts.segmentation)),
            // A kernel without UDP GRO (before 5.0) refuses the option: datagrams then arrive
            // one by one, which is fine.
            coalescing: opts.coalescing
                && sys::setsockopt(raw, libc::SOL_UDP, libc::UDP_GRO, &1 as &libc::c_int).is_ok(),
            split: None,
            busy: BusyPoll::new(opts.busy_poll, opts.recv_timeout),
            timestamps,
            steering: opts.steering,
        })
    }

    /// A second socket on this one's port (bound with [`UdpOptions::steering`]) to which the
    /// kernel steers the datagrams `program` picks: the program sees each datagram's payload
    /// from offset 0 and answers the socket's number, 0 for this one, 1 for the first
    /// companion, 2 for the next (the port's sockets in the order they were bound; each call
    /// attaches `program` anew and binds the next). Each socket has its own queue, so what the program
    /// picks never waits behind the rest. The companion is opened with `opts` (its own
    /// buffers; coalescing as asked), and ends its share of the port when dropped.
    ///
    /// # Errors
    /// This socket was not opened for steering, the kernel refused the program (before
    /// Linux 4.5 it has no such option), or the bind failed.
    pub fn steered(
        &self,
        program: &[crate::cbpf::Insn],
        opts: &UdpOptions,
    ) -> Result<Self, NetError> {
        let addr = self
            .local_addr()
            .map_err(|e| NetError::from_io("reading the UDP socket's address", "", "", e))?;
        let target = addr.to_string();
        let io_err = |op, e| NetError::from_io(op, &target, "CAP_NET_BIND_SERVICE", e);
        if !self.steering {
            return Err(io_err(
                "steering datagrams to a second socket",
                io::Error::other("the socket was not opened for steering"),
            ));
        }
        // The group's program, attached before the companion joins: until it does, the
        // program's 1 names no socket and the kernel falls back to this one.
        crate::cbpf::attach(self.sock.as_raw_fd(), SO_ATTACH_REUSEPORT_CBPF, program)
            .map_err(|e| io_err("attaching the steering program", e))?;
        let sock = Self::open(addr).map_err(|e| io_err("opening a UDP socket", e))?;
        sock.set_reuse_port(true)
            .map_err(|e| io_err("sharing the UDP port with a steered socket", e))?;
        sock.bind(&addr.into())
            .map_err(|e| io_err("binding the steered UDP socket", e))?;
        Self::finish(
            sock,
            addr,
            &UdpOptions {
                steering: true,
                ..opts.clone()
            },
            &io_err,
        )
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

    /// Whether datagrams carry the kernel's receive stamp ([`UdpOptions::timestamps`] asked
    /// for and granted).
    pub const fn timestamps(&self) -> bool {
        self.timestamps
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
        if self.coalescing {
            let split = self.split.get_or_insert_with(|| Box::new(Split::new()));
            if split.next == split.segments.len() {
                split.fill(self.sock.as_raw_fd(), self.busy.as_mut(), self.timestamps)?;
            }
            return Ok(split.take(bufs, meta));
        }
        // SAFETY: sockaddr_storage is plain old data; all-zero is valid; the kernel fills it.
        let mut names: [libc::sockaddr_storage; MAX_BATCH] = unsafe { zeroed() };
        let mut out = [Received::default(); MAX_BATCH];
        let mut stamps = [sys::Control::EMPTY; MAX_BATCH];
        let controls: &mut [sys::Control] = if self.timestamps {
            &mut stamps
        } else {
            &mut []
        };
        let n = bufs.len().min(meta.len());
        let fd = self.sock.as_raw_fd();
        let got = busy::receive(self.busy.as_mut(), |wait| {
            sys::recvmmsg(
                fd,
                &mut bufs[..n],
                &mut names,
                controls,
                &mut out,
                libc::MSG_TRUNC | libc::MSG_WAITFORONE | busy::dont_wait(wait),
            )
        })?;
        let now = (self.timestamps && got > 0).then(sys::realtime);
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
                queued: now.and_then(|now| sys::queued_for(&stamps[i], out[i].control_len, now)),
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

    /// Sends one datagram with an IP TTL (IPv6 hop limit) of `hops` instead of the socket's,
    /// for this datagram only (a control message: the other threads sending on the socket
    /// keep theirs). A hole punch goes out this way.
    ///
    /// # Errors
    /// The system call's error.
    pub fn send_to_hops(&self, buf: &[u8], to: SocketAddr, hops: u8) -> io::Result<usize> {
        // An IPv4 destination, mapped or not, takes the IPv4 option, even on an IPv6 socket.
        let (level, kind) = if to.ip().to_canonical().is_ipv4() {
            (libc::IPPROTO_IP, libc::IP_TTL)
        } else {
            (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT)
        };
        sys::send_with_int_cmsg(
            self.sock.as_raw_fd(),
            buf,
            sys::encode_addr(to, self.v6),
            (level, kind, libc::c_int::from(hops)),
        )
    }

    /// Sends datagrams in as few system calls as possible, in order: runs of equal-size
    /// datagrams to one peer as single segmented messages when [`UdpOptions::segmentation`] is
    /// on. Returns (sent, failed, last error); a refused datagram does not stop the others.
    pub fn send_batch(&self, msgs: &[(SocketAddr, &[u8])]) -> (usize, usize, Option<io::Error>) {
        let (mut sent, mut failed, mut last) = (0, 0, None);
        let mut segments = if self.segmentation.load(Ordering::Relaxed) {
            MAX_SEGMENTS
        } else {
            1
        };
        let mut frames = [&[][..]; MAX_BATCH];
        let mut cut = [Run::default(); MAX_BATCH];
        let mut names = [(zeroed_storage(), 0); MAX_BATCH];
        let mut rest = msgs;
        while !rest.is_empty() {
            let chunk = &rest[..rest.len().min(MAX_BATCH)];
            let n = runs(chunk, segments, &mut cut);
            for (name, run) in names.iter_mut().zip(&cut[..n]) {
                *name = sys::encode_addr(chunk[run.start].0, self.v6);
            }
            for (i, (_, frame)) in chunk.iter().enumerate() {
                frames[i] = frame;
            }
            let r = sys::send_runs(
                self.sock.as_raw_fd(),
                &frames[..chunk.len()],
                &cut[..n],
                &names[..n],
            );
            sent += r.sent;
            failed += r.failed;
            if let Some(at) = r.segmentation_refused_at {
                // EMSGSIZE and EINVAL are about this run (segments over the route's MTU, which
                // the kernel fragments when they go one by one); the others mean this kernel or
                // route cannot segment at all: stop asking. Either way the rest of this batch
                // goes one message per datagram.
                let errno = r.last_error.as_ref().and_then(io::Error::raw_os_error);
                if !matches!(errno, Some(libc::EMSGSIZE | libc::EINVAL)) {
                    self.segmentation.store(false, Ordering::Relaxed);
                }
                segments = 1;
                rest = &rest[at..];
            } else {
                last = r.last_error.or(last);
                rest = &rest[chunk.len()..];
            }
        }
        (sent, failed, last)
    }

    /// Whether received datagrams may arrive coalesced (on when configured and the kernel can).
    pub const fn coalescing(&self) -> bool {
        self.coalescing
    }

    /// Whether segmented sends are still in use (off when configured off or refused).
    pub fn segmentation(&self) -> bool {
        self.segmentation.load(Ordering::Relaxed)
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
            segmentation: self.segmentation.clone(),
            coalescing: self.coalescing,
            split: None,
            busy: self.busy,
            timestamps: self.timestamps,
            steering: self.steering,
        })
    }
}

fn zeroed_storage() -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    unsafe { zeroed() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The TTL (hop limit) the datagram waiting on `rx` arrived with, read with
    /// IP_RECVTTL / IPV6_RECVHOPLIMIT, and its length.
    fn arrived_hops(rx: &std::net::UdpSocket, v6: bool) -> (usize, libc::c_int) {
        let (level, ask, kind) = if v6 {
            (
                libc::IPPROTO_IPV6,
                libc::IPV6_RECVHOPLIMIT,
                libc::IPV6_HOPLIMIT,
            )
        } else {
            (libc::IPPROTO_IP, libc::IP_RECVTTL, libc::IP_TTL)
        };
        let on: libc::c_int = 1;
        // SAFETY: a valid socket and a live int of the size given.
        let rc = unsafe {
            libc::setsockopt(
                rx.as_raw_fd(),
                level,
                ask,
                std::ptr::from_ref(&on).cast(),
                4,
            )
        };
        assert_eq!(rc, 0);
        let mut buf = [0u8; 64];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut control = sys::Control::EMPTY;
        // SAFETY: plain old data, all-zero valid.
        let mut hdr: libc::msghdr = unsafe { zeroed() };
        hdr.msg_iov = &raw mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.0.as_mut_ptr().cast();
        hdr.msg_controllen = control.0.len() as _;
        // SAFETY: the header points at live buffers for the call.
        let n = unsafe { libc::recvmsg(rx.as_raw_fd(), &raw mut hdr, 0) };
        let n = usize::try_from(n).unwrap();
        // SAFETY: an int is plain old data.
        let hops = unsafe {
            sys::find_control::<libc::c_int>(&control, hdr.msg_controllen as usize, level, kind)
        };
        (n, hops.unwrap())
    }

    #[test]
    fn a_datagram_sent_with_a_hop_limit_carries_it_and_the_socket_keeps_its_own() {
        for (bind, v6) in [("127.0.0.1:0", false), ("[::1]:0", true)] {
            let Ok(rx) = std::net::UdpSocket::bind(bind) else {
                assert!(v6, "no IPv4 loopback");
                continue; // a host without IPv6
            };
            rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let to = rx.local_addr().unwrap();
            // The tunnel's socket: dual-stack, sending to IPv4 as mapped addresses.
            let tx = UdpSocket::bind("[::]:0".parse().unwrap(), &UdpOptions::default()).unwrap();
            assert_eq!(tx.send_to_hops(b"punch", to, 2).unwrap(), 5);
            assert_eq!(arrived_hops(&rx, v6), (5, 2), "{bind}");
            tx.send_to(b"normal", to).unwrap();
            let (n, hops) = arrived_hops(&rx, v6);
            assert_eq!(n, 6);
            assert!(hops > 2, "the socket's own limit is back: {hops}");
        }
    }

    /// What `sock` receives within a short wait, as the first byte of each datagram.
    fn first_bytes(sock: &mut UdpSocket) -> Vec<u8> {
        let mut got = Vec::new();
        let mut store = [[0u8; 64]; 8];
        loop {
            let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|b| &mut b[..]).collect();
            let mut meta = [DatagramMeta::default(); 8];
            let n = sock.recv_batch(&mut bufs, &mut meta).unwrap();
            if n == 0 {
                return got;
            }
            got.extend(bufs[..n].iter().map(|b| b[0]));
        }
    }

    #[test]
    fn a_steered_companion_gets_what_its_program_picks_and_only_that() {
        use crate::cbpf;
        // Datagrams whose first byte is 0xAA go to the companion (1), the rest stay (0).
        let program = [
            cbpf::load_byte(0),
            cbpf::jump_eq(0xAA, 0, 1),
            cbpf::ret(1),
            cbpf::ret(0),
        ];
        let opts = UdpOptions {
            steering: true,
            coalescing: false,
            recv_timeout: Some(Duration::from_millis(50)),
            ..UdpOptions::default()
        };
        for (bind, to_ip) in [
            ("[::]:0", "127.0.0.1"),
            ("[::]:0", "::1"),
            ("127.0.0.1:0", "127.0.0.1"),
        ] {
            let Ok(mut main) = UdpSocket::bind(bind.parse().unwrap(), &opts) else {
                continue; // a host without IPv6
            };
            let mut companion = match main.steered(&program, &opts) {
                Ok(c) => c,
                // qemu-user (the aarch64 test run) does not translate
                // SO_ATTACH_REUSEPORT_CBPF; a kernel (4.5 and later) takes it.
                Err(e) => {
                    assert!(std::env::consts::ARCH != "x86_64", "{e}");
                    eprintln!("steering refused (emulated?): not checked here: {e}");
                    return;
                }
            };
            let port = main.local_addr().unwrap().port();
            let to = SocketAddr::new(to_ip.parse().unwrap(), port);
            let Ok(tx) = std::net::UdpSocket::bind(SocketAddr::new(to.ip(), 0)) else {
                continue;
            };
            for first in [1u8, 0xAA, 2, 0xAA, 3, 4, 0xAA] {
                tx.send_to(&[first, 9, 9, 9], to).unwrap();
            }
            // An empty datagram: the program's load past the end answers 0, this socket.
            tx.send_to(&[], to).unwrap();
            let (mine, its) = (first_bytes(&mut main), first_bytes(&mut companion));
            assert_eq!(its, [0xAA, 0xAA, 0xAA], "{bind} <- {to}");
            assert_eq!(mine, [1, 2, 3, 4, 0], "{bind} <- {to}");
            // The port stays ours: a second daemon on it is refused, steering or not.
            let again = SocketAddr::new(main.local_addr().unwrap().ip(), port);
            assert!(UdpSocket::bind(again, &opts).is_err());
            assert!(UdpSocket::bind(again, &UdpOptions::default()).is_err());
            drop(companion);
            // Without the companion its share comes back here.
            tx.send_to(&[0xAA], to).unwrap();
            assert_eq!(first_bytes(&mut main), [0xAA], "{bind} <- {to}");
        }
        // A socket not opened for steering has no companion.
        let plain =
            UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &UdpOptions::default()).unwrap();
        assert!(plain.steered(&program, &opts).is_err());
    }

    #[test]
    fn with_timestamps_a_datagram_says_how_long_it_waited_in_the_kernel() {
        for (timestamps, coalescing) in [(true, false), (true, true), (false, false)] {
            let opts = UdpOptions {
                timestamps,
                coalescing,
                recv_timeout: Some(Duration::from_secs(2)),
                ..UdpOptions::default()
            };
            let mut rx = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts).unwrap();
            if timestamps && !rx.timestamps() {
                // qemu-user (the aarch64 test run) does not translate SO_TIMESTAMPNS; a
                // kernel grants it.
                assert!(
                    std::env::consts::ARCH != "x86_64",
                    "the kernel refused stamps"
                );
                eprintln!("receive stamps refused (emulated?): not checked here");
                continue;
            }
            assert_eq!(rx.timestamps(), timestamps);
            let to = rx.local_addr().unwrap();
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            // The kernel switches its receive stamps on shortly after the first socket asks
            // (a deferred work item); until then it stamps at the read.
            std::thread::sleep(Duration::from_millis(100));
            tx.send_to(b"waits", to).unwrap();
            std::thread::sleep(Duration::from_millis(30));
            let mut buf = [0u8; 64];
            let mut meta = [DatagramMeta::default()];
            assert_eq!(rx.recv_batch(&mut [&mut buf[..]], &mut meta).unwrap(), 1);
            assert_eq!(meta[0].len, 5);
            let why = format!("timestamps {timestamps}, coalescing {coalescing}");
            match meta[0].queued {
                Some(d) => {
                    assert!(timestamps, "{why}");
                    assert!(
                        d >= Duration::from_millis(29) && d < Duration::from_secs(2),
                        "{d:?}, {why}"
                    );
                }
                None => assert!(!timestamps, "{why}"),
            }
        }
    }

    fn cut(msgs: &[(SocketAddr, &[u8])]) -> Vec<(usize, usize, usize)> {
        let mut out = [Run::default(); MAX_BATCH];
        let n = runs(msgs, MAX_SEGMENTS, &mut out);
        out[..n]
            .iter()
            .map(|r| (r.start, r.count, r.segment))
            .collect()
    }

    #[test]
    fn runs_are_cut_where_a_segmented_send_must_end() {
        let a: SocketAddr = "192.0.2.1:4500".parse().unwrap();
        let b: SocketAddr = "[fd00::2]:4500".parse().unwrap();
        let big = [0u8; 1400];
        let small = [0u8; 100];
        let huge = [0u8; 1500];
        // (messages, runs as (start, count, segment size), why)
        type Case<'a> = (
            Vec<(SocketAddr, &'a [u8])>,
            Vec<(usize, usize, usize)>,
            &'a str,
        );
        let cases: Vec<Case<'_>> = vec![
            (vec![], vec![], "nothing"),
            (vec![(a, &big)], vec![(0, 1, 1400)], "one"),
            (
                vec![(a, &big); 3],
                vec![(0, 3, 1400)],
                "equal sizes, one peer",
            ),
            (
                vec![(a, &big), (a, &big), (a, &small), (a, &big)],
                vec![(0, 3, 1400), (3, 1, 1400)],
                "a shorter datagram ends its run",
            ),
            (
                vec![(a, &big), (a, &huge)],
                vec![(0, 1, 1400), (1, 1, 1500)],
                "a longer one starts a new run",
            ),
            (
                vec![(a, &big), (b, &big), (a, &big)],
                vec![(0, 1, 1400), (1, 1, 1400), (2, 1, 1400)],
                "another peer in between: order first",
            ),
            (
                vec![(a, &[]), (a, &[])],
                vec![(0, 1, 0), (1, 1, 0)],
                "empty datagrams go alone",
            ),
            (vec![(a, &small); 64], vec![(0, 64, 100)], "64 segments fit"),
            (
                vec![(a, &huge); 50],
                vec![(0, 43, 1500), (43, 7, 1500)],
                "cut before 65,000 bytes",
            ),
        ];
        for (msgs, want, why) in cases {
            assert_eq!(cut(&msgs), want, "{why}");
        }
        // Segmentation off: every datagram is a message of its own.
        let mut out = [Run::default(); MAX_BATCH];
        let msgs = vec![(a, &big[..]); 3];
        let n = runs(&msgs, 1, &mut out);
        assert_eq!(
            out[..n]
                .iter()
                .map(|r| (r.start, r.count))
                .collect::<Vec<_>>(),
            vec![(0, 1), (1, 1), (2, 1)]
        );
    }

    #[test]
    fn coalesced_receives_split_into_their_datagrams() {
        let from: SocketAddr = "192.0.2.1:4500".parse().unwrap();
        // (offset, full, room, segment size) -> (offset, len, full) per datagram, why
        type Case = (
            (usize, usize, usize, Option<usize>),
            Vec<(usize, usize, usize)>,
            &'static str,
        );
        let cases: Vec<Case> = vec![
            ((0, 100, 65536, None), vec![(0, 100, 100)], "not coalesced"),
            (
                (0, 100, 65536, Some(100)),
                vec![(0, 100, 100)],
                "one segment",
            ),
            ((0, 0, 65536, None), vec![(0, 0, 0)], "an empty datagram"),
            (
                (65536, 3000, 65536, Some(1000)),
                vec![
                    (65536, 1000, 1000),
                    (66536, 1000, 1000),
                    (67536, 1000, 1000),
                ],
                "equal pieces",
            ),
            (
                (0, 2500, 65536, Some(1000)),
                vec![(0, 1000, 1000), (1000, 1000, 1000), (2000, 500, 500)],
                "a shorter last",
            ),
            (
                (0, 2500, 1500, Some(1000)),
                vec![(0, 1000, 1000), (1000, 500, 1000)],
                "cut short: ends with the first incomplete datagram",
            ),
            (
                (0, 3000, 512, None),
                vec![(0, 512, 3000)],
                "one datagram cut short",
            ),
            (
                (0, 100, 65536, Some(0)),
                vec![(0, 100, 100)],
                "a zero segment size is ignored",
            ),
        ];
        for ((offset, full, room, segment), want, why) in cases {
            let mut out = Vec::new();
            super::cut(offset, full, room, segment, (from, None), &mut out);
            let got: Vec<_> = out.iter().map(|s| (s.offset, s.len, s.full)).collect();
            assert_eq!(got, want, "{why}");
            assert!(out.iter().all(|s| s.from == from));
        }
    }
}

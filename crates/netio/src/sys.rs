//! Thin helpers over libc: return-value checks, `ifreq`, socket addresses.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{FromRawFd, OwnedFd};

use crate::NetError;

/// A libc constant that is a small `c_int` (address families, protocol numbers, option
/// values) as the 16-bit field some structures hold it in.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "small, non-negative constants"
)]
pub(crate) const fn short(constant: libc::c_int) -> u16 {
    constant as u16
}

/// Turns a -1 return into the thread's `errno`.
pub(crate) fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Waits up to `within` for `fd` to be readable, to the microsecond (`ppoll(2)`: a
/// high-resolution timer, where a receive timeout is rounded to the kernel's tick). True
/// when it is; false on timeout or interruption.
pub(crate) fn wait_readable(fd: libc::c_int, within: std::time::Duration) -> io::Result<bool> {
    readable(&[fd], within).map(|ready| ready != 0)
}

/// [`wait_readable`] for several: which of `fds` (at most 64) are readable, bit `i` for
/// `fds[i]`; 0 on timeout or interruption.
pub(crate) fn readable(fds: &[libc::c_int], within: std::time::Duration) -> io::Result<u64> {
    // On the stack: the capture thread asks once per round.
    let mut all = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 64];
    let pfds = &mut all[..fds.len().min(64)];
    for (p, &fd) in pfds.iter_mut().zip(fds) {
        p.fd = fd;
    }
    let timeout = libc::timespec {
        tv_sec: libc::time_t::try_from(within.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(within.subsec_nanos()),
    };
    let count = libc::nfds_t::try_from(pfds.len()).unwrap_or(libc::nfds_t::MAX);
    // SAFETY: `pfds` is a live, exclusively borrowed array of `count` pollfds; `timeout` is a
    // live timespec; a null signal mask leaves the mask as it is.
    let polled = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            count,
            &raw const timeout,
            std::ptr::null(),
        )
    };
    match cvt(polled) {
        Ok(_) => Ok(pfds
            .iter()
            .enumerate()
            .filter(|(_, p)| p.revents != 0)
            .fold(0, |mask, (i, _)| mask | 1 << i)),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// A datagram socket to run interface ioctls on.
pub(crate) fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call with constant arguments; no pointers involved.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An `ifreq` carrying `name`, checked against the kernel's limit.
pub(crate) fn ifreq(name: &str) -> Result<libc::ifreq, NetError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(NetError::BadInterfaceName(name.to_owned()));
    }
    // SAFETY: ifreq is plain old data (arrays and a union of PODs); all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    Ok(req)
}

/// Runs an interface ioctl that reads or writes `req`.
pub(crate) fn ifreq_ioctl(
    fd: &OwnedFd,
    request: libc::Ioctl,
    req: &mut libc::ifreq,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `req` is a valid, exclusively borrowed ifreq for the duration of the call, which
    // is what every SIOCGIF*/SIOCETHTOOL request expects as its argument.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), request, std::ptr::from_mut(req)) }).map(|_| ())
}

/// Encodes `addr` for a socket of family v6 (`v6_socket`, dual-stack: IPv4 peers become
/// v4-mapped) or v4.
/// `sendmsg` of one datagram `buf` to `name` with one control message carrying an `int`:
/// `(level, type, value)`.
pub(crate) fn send_with_int_cmsg(
    fd: libc::c_int,
    buf: &[u8],
    name: (libc::sockaddr_storage, libc::socklen_t),
    (level, kind, value): (libc::c_int, libc::c_int, libc::c_int),
) -> io::Result<usize> {
    const DATA: u32 = 4; // size_of::<c_int>()
    // SAFETY: CMSG_SPACE and CMSG_LEN only compute sizes.
    let (space, cmsg_len) = unsafe {
        (
            libc::CMSG_SPACE(DATA) as usize,
            libc::CMSG_LEN(DATA) as usize,
        )
    };
    assert!(space <= size_of::<Control>());
    let mut control = Control::EMPTY;
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr().cast_mut().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is valid; the fields used are set below.
    let mut hdr: libc::msghdr = unsafe { zeroed() };
    hdr.msg_name = std::ptr::from_ref(&name.0).cast_mut().cast();
    hdr.msg_namelen = name.1;
    hdr.msg_iov = &raw mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = control.0.as_mut_ptr().cast();
    hdr.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` writable, aligned bytes, so CMSG_FIRSTHDR is
    // non-null and its data has room for the int.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&raw const hdr);
        (*c).cmsg_level = level;
        (*c).cmsg_type = kind;
        (*c).cmsg_len = cmsg_len as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), value);
    }
    // SAFETY: the header points at the datagram, the address and the control data, all live
    // for the call; the kernel only reads through them.
    let sent = unsafe { libc::sendmsg(fd, &raw const hdr, 0) };
    usize::try_from(sent).map_err(|_| io::Error::last_os_error())
}

pub(crate) fn encode_addr(
    addr: SocketAddr,
    v6_socket: bool,
) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let addr = match (addr, v6_socket) {
        (SocketAddr::V4(a), true) => {
            SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0))
        }
        (a, _) => a,
    };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            let sin = unsafe { &mut *std::ptr::from_mut(&mut storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = short(libc::AF_INET);
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            let sin6 =
                unsafe { &mut *std::ptr::from_mut(&mut storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = short(libc::AF_INET6);
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (
        storage,
        libc::socklen_t::try_from(len).expect("sockaddr sizes fit socklen_t"),
    )
}

/// Decodes an address the kernel wrote; v4-mapped IPv6 addresses come back as IPv4.
pub(crate) fn decode_addr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which fits and is aligned.
            let sin = unsafe { &*std::ptr::from_ref(storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6, which fits and is aligned.
            let sin6 = unsafe { &*std::ptr::from_ref(storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    port,
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )),
            })
        }
        _ => None,
    }
}

/// Largest batch of one `recvmmsg`/`sendmmsg` call.
pub(crate) const MAX_BATCH: usize = 64;

/// Room for the control messages we ask for (a `tpacket_auxdata` or a `UDP_GRO` int, and a
/// receive timestamp), 8-byte aligned as `cmsghdr` requires.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct Control(pub(crate) [u8; 96]);

impl Control {
    pub(crate) const EMPTY: Self = Self([0; 96]);
}

/// `SO_TIMESTAMPNS` (asm-generic/socket.h's `SO_TIMESTAMPNS_OLD`, which carries the C library's
/// `struct timespec`: 64-bit seconds on our 64-bit targets). Its control message type
/// (`SCM_TIMESTAMPNS`) has the same value.
const SO_TIMESTAMPNS: libc::c_int = 35;

/// Asks the kernel to stamp every message with the time it took it in (`SO_TIMESTAMPNS`):
/// [`queued_for`] then says how long a message waited before it was read. The stamp is
/// taken where the kernel first sees the packet (the device's receive path), so the wait
/// includes the backlog queue and the socket's receive queue. The kernel switches stamping
/// on shortly after the first socket asks (deferred work); a packet that arrived before is
/// stamped when read, and reads as no wait.
pub(crate) fn ask_timestamps(fd: libc::c_int) -> io::Result<()> {
    setsockopt(fd, libc::SOL_SOCKET, SO_TIMESTAMPNS, &1 as &libc::c_int)
}

/// The real-time clock now, to hold against receive stamps (which are on that clock).
pub(crate) fn realtime() -> libc::timespec {
    // SAFETY: timespec is plain old data; clock_gettime fills it.
    let mut now: libc::timespec = unsafe { zeroed() };
    // SAFETY: `now` is a live timespec; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &raw mut now) };
    now
}

/// How long the message whose control data is `control[..len]` waited between the kernel's
/// stamp and `now`; `None` without a stamp (not asked for, or a kernel that gave none). A
/// clock that stepped back between the two reads as zero.
pub(crate) fn queued_for(
    control: &Control,
    len: usize,
    now: libc::timespec,
) -> Option<std::time::Duration> {
    // SAFETY: SCM_TIMESTAMPNS carries a struct timespec; any bit pattern is a valid one.
    let stamp =
        unsafe { find_control::<libc::timespec>(control, len, libc::SOL_SOCKET, SO_TIMESTAMPNS) }?;
    Some(waited(stamp, now))
}

/// The time from `stamp` to `now` (both on the real-time clock); a clock that stepped back
/// between the two reads as zero.
pub(crate) fn waited(stamp: libc::timespec, now: libc::timespec) -> std::time::Duration {
    let nanos = |t: libc::timespec| i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec);
    std::time::Duration::from_nanos(u64::try_from(nanos(now) - nanos(stamp)).unwrap_or(0))
}

/// The first control message of `level` and `kind` among the first `len` bytes of `control`
/// that holds a whole `T`, if any.
///
/// # Safety
/// `T` must be plain old data (every bit pattern valid), as the kernel's control structures are.
pub(crate) unsafe fn find_control<T: Copy>(
    control: &Control,
    len: usize,
    level: libc::c_int,
    kind: libc::c_int,
) -> Option<T> {
    // SAFETY: msghdr is plain old data; we only set the control pointer and length so that the
    // CMSG_* helpers can walk the buffer the kernel filled.
    let mut hdr: libc::msghdr = unsafe { zeroed() };
    hdr.msg_control = control.0.as_ptr().cast_mut().cast();
    hdr.msg_controllen = len.min(control.0.len()) as _;
    // SAFETY: `hdr` describes `control`, which is 8-byte aligned and at least `msg_controllen`
    // long; CMSG_FIRSTHDR/NXTHDR stay within it and return null at the end.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&raw const hdr) };
    while !cmsg.is_null() {
        // SAFETY: a non-null pointer from CMSG_FIRSTHDR/NXTHDR points at a whole cmsghdr
        // inside `control`.
        let c = unsafe { &*cmsg };
        let data_len = (c.cmsg_len as usize).saturating_sub(size_of::<libc::cmsghdr>());
        if c.cmsg_level == level && c.cmsg_type == kind && data_len >= size_of::<T>() {
            // SAFETY: the header says a whole T follows; the data may be unaligned for it,
            // so read it unaligned; the caller vouches that any bytes are a valid T.
            return Some(unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<T>()) });
        }
        // SAFETY: as for CMSG_FIRSTHDR; `cmsg` is a header inside the buffer `hdr` describes.
        cmsg = unsafe { libc::CMSG_NXTHDR(&raw const hdr, cmsg) };
    }
    None
}

/// What the kernel said about one received message.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Received {
    /// Bytes of the message; with `MSG_TRUNC` in the call's flags, its full length even when
    /// the buffer was shorter.
    pub(crate) len: usize,
    /// `msg_flags` (`MSG_TRUNC`, `MSG_CTRUNC`).
    pub(crate) flags: libc::c_int,
    /// Bytes of control data written.
    pub(crate) control_len: usize,
}

/// One `recvmmsg(2)` call: fills `bufs[i]`, `names[i]` (any sockaddr type) and `controls[i]`
/// (if `controls` is not empty), and `out[i]`, for up to [`MAX_BATCH`] messages. Returns the
/// number received; 0 when the call timed out or would block.
pub(crate) fn recvmmsg<N>(
    fd: libc::c_int,
    bufs: &mut [&mut [u8]],
    names: &mut [N],
    controls: &mut [Control],
    out: &mut [Received],
    flags: libc::c_int,
) -> io::Result<usize> {
    recvmmsg_scattered::<N, 0>(fd, &mut [], bufs, &mut [], names, controls, out, flags)
}

/// [`recvmmsg`] where each message may be scattered over up to three areas: `heads[i]` (a
/// fixed-size header the kernel writes first, such as `virtio_net_hdr`; none if `heads` is
/// empty), `bufs[i]`, then `tails[i]` (room for what does not fit `bufs[i]`; none if `tails`
/// is empty). `out[i].len` counts all of it.
#[expect(clippy::too_many_arguments, reason = "the parts of a recvmmsg call")]
pub(crate) fn recvmmsg_scattered<N, const H: usize>(
    fd: libc::c_int,
    heads: &mut [[u8; H]],
    bufs: &mut [&mut [u8]],
    tails: &mut [&mut [u8]],
    names: &mut [N],
    controls: &mut [Control],
    out: &mut [Received],
    flags: libc::c_int,
) -> io::Result<usize> {
    let mut n = bufs.len().min(names.len()).min(out.len()).min(MAX_BATCH);
    if !heads.is_empty() {
        n = n.min(heads.len());
    }
    if !tails.is_empty() {
        n = n.min(tails.len());
    }
    let want_control = !controls.is_empty();
    let n = if want_control {
        n.min(controls.len())
    } else {
        n
    };
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: iovec and mmsghdr are plain old data; all-zero (null pointers, zero lengths) is a
    // valid value, and every entry used below is filled in before the call.
    let mut iov: [[libc::iovec; 3]; MAX_BATCH] = unsafe { zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { zeroed() };
    let name_len = libc::socklen_t::try_from(size_of::<N>()).expect("sockaddr sizes fit socklen_t");
    for i in 0..n {
        let mut parts = 0;
        if let Some(head) = heads.get_mut(i) {
            iov[i][parts] = libc::iovec {
                iov_base: head.as_mut_ptr().cast(),
                iov_len: H,
            };
            parts += 1;
        }
        iov[i][parts] = libc::iovec {
            iov_base: bufs[i].as_mut_ptr().cast(),
            iov_len: bufs[i].len(),
        };
        parts += 1;
        if let Some(tail) = tails.get_mut(i) {
            iov[i][parts] = libc::iovec {
                iov_base: tail.as_mut_ptr().cast(),
                iov_len: tail.len(),
            };
            parts += 1;
        }
        let h = &mut hdrs[i].msg_hdr;
        h.msg_iov = iov[i].as_mut_ptr();
        h.msg_iovlen = parts as _;
        h.msg_name = std::ptr::from_mut(&mut names[i]).cast();
        h.msg_namelen = name_len;
        if want_control {
            h.msg_control = controls[i].0.as_mut_ptr().cast();
            h.msg_controllen = controls[i].0.len();
        }
    }
    let count = libc::c_uint::try_from(n).expect("n <= MAX_BATCH");
    // SAFETY: `hdrs[..n]` point at heads, buffers, tails, names and control areas that are
    // exclusively borrowed for this call and stay alive until it returns; lengths match the allocations.
    // A null timeout means "use the socket's SO_RCVTIMEO".
    let got = unsafe { libc::recvmmsg(fd, hdrs.as_mut_ptr(), count, flags, std::ptr::null_mut()) };
    if got < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted => {
                Ok(0)
            }
            _ => Err(e),
        };
    }
    let got = usize::try_from(got).expect("non-negative");
    for i in 0..got {
        out[i] = Received {
            len: hdrs[i].msg_len as usize,
            flags: hdrs[i].msg_hdr.msg_flags,
            control_len: hdrs[i].msg_hdr.msg_controllen,
        };
    }
    Ok(got)
}

/// `sendmmsg(2)` of messages gathered from pieces: message `m` is `heads[m]` (if `heads` is
/// not empty) followed by `parts[messages[m]]`. At most [`MAX_BATCH`] messages and parts. A
/// message the kernel refuses is reported to `refused` and skipped. Returns how many were sent.
pub(crate) fn sendmmsg_gather<const H: usize>(
    fd: libc::c_int,
    heads: &[[u8; H]],
    parts: &[&[u8]],
    messages: &[std::ops::Range<usize>],
    mut refused: impl FnMut(usize, io::Error),
) -> usize {
    assert!(parts.len() <= MAX_BATCH && messages.len() <= MAX_BATCH);
    assert!(heads.is_empty() || heads.len() >= messages.len());
    // SAFETY: iovec and mmsghdr are plain old data; all-zero is valid; entries used are filled
    // in below.
    let mut iov: [libc::iovec; 2 * MAX_BATCH] = unsafe { zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { zeroed() };
    let mut next = 0;
    for (m, range) in messages.iter().enumerate() {
        let first = next;
        if let Some(head) = heads.get(m) {
            iov[next] = libc::iovec {
                iov_base: head.as_ptr().cast_mut().cast(),
                iov_len: H,
            };
            next += 1;
        }
        for part in &parts[range.clone()] {
            iov[next] = libc::iovec {
                iov_base: part.as_ptr().cast_mut().cast(),
                iov_len: part.len(),
            };
            next += 1;
        }
        let h = &mut hdrs[m].msg_hdr;
        h.msg_iov = &raw mut iov[first];
        h.msg_iovlen = (next - first) as _;
    }
    let mut sent = 0;
    let mut m = 0;
    while m < messages.len() {
        let count = libc::c_uint::try_from(messages.len() - m).expect("at most MAX_BATCH");
        // SAFETY: the headers point at heads and parts borrowed for the whole call; the kernel
        // only reads through them.
        let done = unsafe { libc::sendmmsg(fd, hdrs[m..].as_mut_ptr(), count, 0) };
        if done < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            refused(m, e);
            m += 1;
        } else {
            let done = usize::try_from(done).expect("non-negative");
            sent += done;
            m += done;
            if done == 0 {
                refused(m, io::Error::other("sendmmsg sent nothing"));
                m += 1;
            }
        }
    }
    sent
}

/// The running kernel's release (`uname -r`: `6.1.0-18-arm64`), if it can be read.
pub(crate) fn kernel_release() -> Option<String> {
    // SAFETY: utsname is plain old data; all-zero is valid.
    let mut names: libc::utsname = unsafe { zeroed() };
    // SAFETY: `names` is a live utsname for uname to fill.
    if unsafe { libc::uname(&raw mut names) } != 0 {
        return None;
    }
    // SAFETY: uname leaves `release` NUL-terminated within the array.
    let release = unsafe { std::ffi::CStr::from_ptr(names.release.as_ptr()) };
    release.to_str().ok().map(str::to_owned)
}

/// Whether kernel release `release` is `major.minor` or later (by its leading numbers; a
/// release that does not start `<major>.<minor>` is not).
pub(crate) fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(a)), Some(Ok(b))) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// `setsockopt(2)` with a plain-old-data value.
pub(crate) fn setsockopt<T>(
    fd: libc::c_int,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of::<T>()).expect("option sizes fit socklen_t");
    // SAFETY: `value` points at a live, initialised T of exactly `len` bytes; the kernel only
    // reads it.
    cvt(unsafe { libc::setsockopt(fd, level, name, std::ptr::from_ref(value).cast(), len) })
        .map(|_| ())
}

/// `SO_RCVTIMEO` as the `timeval` the kernel wants; `None` blocks forever.
pub(crate) fn set_recv_timeout(
    fd: libc::c_int,
    timeout: Option<std::time::Duration>,
) -> io::Result<()> {
    let tv = timeout.map_or(
        libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        |t| libc::timeval {
            tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
            // Never 0 for a non-zero timeout: 0 would mean "block forever".
            tv_usec: libc::suseconds_t::from(t.subsec_micros().max(u32::from(t.is_zero()))),
        },
    );
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)
}

/// Sets a socket buffer size, forcing past `net.core.*mem_max` when allowed (as root), else
/// up to that limit. Returns the size the kernel reports afterwards.
pub(crate) fn set_buffer(
    fd: libc::c_int,
    force: libc::c_int,
    plain: libc::c_int,
    bytes: usize,
) -> io::Result<usize> {
    let want = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    if setsockopt(fd, libc::SOL_SOCKET, force, &want).is_err() {
        setsockopt(fd, libc::SOL_SOCKET, plain, &want)?;
    }
    let got: libc::c_int = getsockopt(fd, libc::SOL_SOCKET, plain)?;
    Ok(usize::try_from(got).unwrap_or(0))
}

/// `getsockopt(2)` of a plain-old-data value (one for which all zero bytes are valid).
pub(crate) fn getsockopt<T: Default>(
    fd: libc::c_int,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<T> {
    let mut value = T::default();
    let mut len = libc::socklen_t::try_from(size_of::<T>()).expect("option sizes fit socklen_t");
    // SAFETY: `value` and `len` are live locals of the sizes passed; the kernel writes at most
    // `len` bytes of plain data into `value`.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            std::ptr::from_mut(&mut value).cast(),
            &raw mut len,
        )
    })?;
    Ok(value)
}

/// A run of frames one `UDP_SEGMENT` send carries: `count` frames from `start`, all
/// `segment` bytes but the last, which may be shorter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) start: usize,
    pub(crate) count: usize,
    pub(crate) segment: usize,
}

/// What [`send_runs`] did.
#[derive(Debug, Default)]
pub(crate) struct RunsSent {
    /// Frames the kernel took.
    pub(crate) sent: usize,
    /// Frames refused (a whole run fails together).
    pub(crate) failed: usize,
    pub(crate) last_error: Option<io::Error>,
    /// The kernel refused to segment a run (an old kernel, a route through a device that cannot
    /// checksum, or segments over the route's MTU, which one datagram at a time would be
    /// fragmented instead): the frame where that run starts. Nothing from there on was sent.
    pub(crate) segmentation_refused_at: Option<usize>,
}

/// `sendmmsg(2)` of at most [`MAX_BATCH`] frames grouped in `runs`, each run one message: a
/// run of several frames is one super-datagram with a `UDP_SEGMENT` control message, which the
/// kernel (or the NIC) cuts into the original datagrams, in order. One socket buffer, one
/// route lookup and one trip down the stack per run instead of per frame.
pub(crate) fn send_runs(
    fd: libc::c_int,
    frames: &[&[u8]],
    runs: &[Run],
    names: &[(libc::sockaddr_storage, libc::socklen_t)],
) -> RunsSent {
    // CMSG_SPACE(sizeof(u16)) is 24 on 64-bit targets and 16 on 32-bit ones.
    #[derive(Clone, Copy)]
    #[repr(C, align(8))]
    struct Segment([u8; 32]);
    assert!(frames.len() <= MAX_BATCH && runs.len() == names.len());
    let mut out = RunsSent::default();
    // SAFETY: iovec and mmsghdr are plain old data; all-zero is valid; entries used are filled
    // in below.
    let mut iov: [libc::iovec; MAX_BATCH] = unsafe { zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { zeroed() };
    let mut controls = [Segment([0; 32]); MAX_BATCH];
    const DATA: u32 = 2; // size_of::<u16>()
    // SAFETY: CMSG_SPACE and CMSG_LEN only compute sizes.
    let (space, cmsg_len) = unsafe {
        (
            libc::CMSG_SPACE(DATA) as usize,
            libc::CMSG_LEN(DATA) as usize,
        )
    };
    assert!(space <= size_of::<Segment>());
    for (i, frame) in frames.iter().enumerate() {
        iov[i].iov_base = frame.as_ptr().cast_mut().cast();
        iov[i].iov_len = frame.len();
    }
    for (m, run) in runs.iter().enumerate() {
        let h = &mut hdrs[m].msg_hdr;
        h.msg_iov = &raw mut iov[run.start];
        h.msg_iovlen = run.count as _;
        h.msg_name = std::ptr::from_ref(&names[m].0).cast_mut().cast();
        h.msg_namelen = names[m].1;
        if run.count > 1 {
            let segment = u16::try_from(run.segment).expect("runs are cut at 64 KB");
            h.msg_control = controls[m].0.as_mut_ptr().cast();
            h.msg_controllen = space as _;
            // SAFETY: msg_control points at `space` writable, aligned bytes, so CMSG_FIRSTHDR
            // is non-null and its data has room for the u16.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(h);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = libc::UDP_SEGMENT;
                (*c).cmsg_len = cmsg_len as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), segment);
            }
        }
    }
    let mut m = 0;
    while m < runs.len() {
        let count = libc::c_uint::try_from(runs.len() - m).expect("at most MAX_BATCH");
        // SAFETY: the headers point at frames, addresses and control data borrowed for the
        // whole call; the kernel only reads through them.
        let done = unsafe { libc::sendmmsg(fd, hdrs[m..].as_mut_ptr(), count, 0) };
        if done < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            let run = runs[m];
            if run.count > 1
                && matches!(
                    e.raw_os_error(),
                    Some(
                        libc::EIO
                            | libc::EINVAL
                            | libc::EMSGSIZE
                            | libc::ENOPROTOOPT
                            | libc::EOPNOTSUPP
                    )
                )
            {
                out.segmentation_refused_at = Some(run.start);
                out.last_error = Some(e);
                return out;
            }
            out.failed += run.count;
            out.last_error = Some(e);
            m += 1;
        } else {
            let done = usize::try_from(done).expect("non-negative");
            out.sent += runs[m..m + done].iter().map(|r| r.count).sum::<usize>();
            m += done;
            if done == 0 {
                // Not expected from the kernel, but never spin: count the message as refused.
                out.failed += runs[m].count;
                m += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_unmap() {
        for (text, v6) in [
            ("192.0.2.1:51820", false),
            ("[fd00::1]:7", true),
            ("198.51.100.9:1", true),
        ] {
            let addr: SocketAddr = text.parse().unwrap();
            let (storage, _) = encode_addr(addr, v6);
            assert_eq!(
                decode_addr(&storage),
                Some(addr),
                "{text} via v6 socket: {v6}"
            );
        }
        let (storage, len) = encode_addr("192.0.2.1:5".parse().unwrap(), true);
        assert_eq!(libc::c_int::from(storage.ss_family), libc::AF_INET6);
        assert_eq!(len as usize, size_of::<libc::sockaddr_in6>());
    }

    #[test]
    fn interface_names_are_checked() {
        assert!(ifreq("eth0").is_ok());
        for bad in ["", "sixteen-chars-xx", "a\0b"] {
            assert!(
                matches!(ifreq(bad), Err(NetError::BadInterfaceName(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn kernel_releases_compare_by_their_leading_numbers() {
        for (release, at_least_6_2) in [
            ("6.1.0-18-arm64", false),
            ("6.1.77-v8+", false),
            ("5.15.0-1049-raspi", false),
            ("6.2.0", true),
            ("6.12.20+rpt-rpi-v8", true),
            ("6.18.44-fc-v669", true),
            ("7.0", true),
            ("6", false),
            ("", false),
            ("rolling", false),
        ] {
            assert_eq!(release_at_least(release, 6, 2), at_least_6_2, "{release}");
        }
        let here = kernel_release().unwrap();
        assert!(release_at_least(&here, 2, 6), "{here}");
    }
}

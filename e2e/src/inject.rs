//! Hostile and hand-made traffic for the tests: raw frames on a LAN, captured tunnel frames
//! replayed or corrupted, garbage datagrams. Each function runs on a thread of its own inside
//! the namespace it is given.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::Context;
use cyphonic_netio::{FrameMeta, Interface, PacketOptions, PacketSocket, netns};

use crate::Netns;

/// Runs `f` on a thread inside `ns`.
///
/// # Errors
/// Entering the namespace fails, or `f` does.
pub fn inside<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    joined(spawn_inside(ns, f))
}

/// Starts `f` on a thread inside `ns` and returns at once (join it with [`joined`]).
pub fn spawn_inside<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> std::thread::JoinHandle<anyhow::Result<T>> {
    let name = ns.name().to_owned();
    std::thread::spawn(move || {
        netns::enter(&name).with_context(|| format!("entering {name}"))?;
        f()
    })
}

/// What a thread from [`spawn_inside`] returned.
///
/// # Errors
/// Its own, or that it panicked.
pub fn joined<T>(t: std::thread::JoinHandle<anyhow::Result<T>>) -> anyhow::Result<T> {
    t.join()
        .map_err(|_| anyhow::anyhow!("the thread inside the namespace panicked"))?
}

/// One's-complement checksum (RFC 1071), for hand-made headers.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::try_from(sum).unwrap_or(0)
}

/// An Ethernet frame with an ICMP echo request from `src` to `dst`.
pub fn echo_frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    marker: &[u8],
) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&echo_packet(src, dst, marker));
    f
}

/// An IPv4 packet with an ICMP echo request from `src` to `dst` carrying `marker`
/// (identifier 0x4242, sequence 1).
pub fn echo_packet(src: Ipv4Addr, dst: Ipv4Addr, marker: &[u8]) -> Vec<u8> {
    let total = u16::try_from(20 + 8 + marker.len()).unwrap_or(u16::MAX);
    let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 1, 0, 0];
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let sum = checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let mut icmp = vec![8, 0, 0, 0, 0x42, 0x42, 0, 1];
    icmp.extend_from_slice(marker);
    let sum = checksum(&icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    ip.extend_from_slice(&icmp);
    ip
}

/// The marker of an ICMP echo reply in the IPv4 packet `packet` from `from` (the data after
/// the ICMP header), if it is one.
pub fn echo_reply_marker(packet: &[u8], from: Ipv4Addr) -> Option<&[u8]> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    let is_reply = packet.first()? >> 4 == 4
        && *packet.get(9)? == 1
        && packet.get(12..16)? == from.octets()
        && *packet.get(ihl)? == 0;
    is_reply.then(|| packet.get(ihl + 8..)).flatten()
}

/// An IPv4 packet of protocol `proto` from `src` to `dst` carrying `payload`, with IP
/// identification `id` and the fragment field `fragment` as on the wire (flags 0x2000 for
/// "more fragments", the offset in 8-byte units), TTL 64, its header checksum set.
pub fn ipv4_packet(
    proto: u8,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    id: u16,
    fragment: u16,
    payload: &[u8],
) -> Vec<u8> {
    let total = u16::try_from(20 + payload.len()).unwrap_or(u16::MAX);
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0];
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[4..6].copy_from_slice(&id.to_be_bytes());
    ip[6..8].copy_from_slice(&fragment.to_be_bytes());
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let sum = checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    ip.extend_from_slice(payload);
    ip
}

/// An Ethernet frame carrying the IPv4 packet `ip`.
pub fn ipv4_frame(dst_mac: [u8; 6], src_mac: [u8; 6], ip: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + ip.len());
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(ip);
    f
}

/// An ARP frame for IPv4 over Ethernet, broadcast: operation `op` (1 request, 2 reply) from
/// `sender_mac` saying it holds `sender_ip`, about `target_ip` (a gratuitous announcement
/// when the two addresses are the same).
pub fn arp_frame(
    op: u16,
    sender_mac: [u8; 6],
    sender_ip: Ipv4Addr,
    target_ip: Ipv4Addr,
) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&sender_mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4]);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&sender_mac);
    f.extend_from_slice(&sender_ip.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target_ip.octets());
    f
}

/// A TCP header (20 bytes, no options) from `sport` to `dport` with `flags`; its checksum
/// is left 0 (the tests that send one judge where it arrives, not whether it is taken).
pub fn tcp_header(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..8].copy_from_slice(&0x1000_0000u32.to_be_bytes());
    h[12] = 0x50;
    h[13] = flags;
    h[14..16].copy_from_slice(&64240u16.to_be_bytes());
    h
}

/// An ICMP error message of `kind` and `code` quoting the first 28 bytes of the IPv4 packet
/// `quoted` (its header and 8 bytes of what follows, as RFC 792 asks), then `extra`, its
/// checksum set.
pub fn icmp_error(kind: u8, code: u8, quoted: &[u8], extra: &[u8]) -> Vec<u8> {
    let mut m = vec![kind, code, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&quoted[..quoted.len().min(28)]);
    m.extend_from_slice(extra);
    let sum = checksum(&m);
    m[2..4].copy_from_slice(&sum.to_be_bytes());
    m
}

/// An Ethernet frame with a UDP datagram (checksum left 0: "none", valid for IPv4), such as
/// a DHCP message from a device without an address (`0.0.0.0` to `255.255.255.255`).
pub fn udp_frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let udp_len = u16::try_from(8 + payload.len()).unwrap_or(u16::MAX);
    let total = udp_len.saturating_add(20);
    let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x35, 0, 0, 64, 17, 0, 0];
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let sum = checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&udp_len.to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// A socket that sends raw frames out of `iface` (in the namespace the thread is in).
///
/// # Errors
/// The interface is missing or down, or the socket cannot be opened.
pub fn sender(iface: &str) -> anyhow::Result<PacketSocket> {
    let i = Interface::lookup_up(iface)?;
    Ok(PacketSocket::open(
        &i,
        &PacketOptions {
            promiscuous: false,
            ..PacketOptions::default()
        },
    )?)
}

/// Sends raw frames out of `iface` in `ns`.
///
/// # Errors
/// The socket cannot be opened or a send fails.
pub fn send_frames(ns: &Netns, iface: &str, frames: Vec<Vec<u8>>) -> anyhow::Result<()> {
    let iface = iface.to_owned();
    inside(ns, move || {
        let sock = sender(&iface)?;
        for f in frames {
            sock.send(&f)?;
        }
        Ok(())
    })
}

/// Sends frames made by `make(n)` (n = 0, 1, ...) out of `iface` in `ns`, at most `per_sec`
/// a second, for `duration`. Returns how many were sent.
///
/// # Errors
/// The socket cannot be opened.
pub fn send_frames_for(
    ns: &Netns,
    iface: &str,
    duration: Duration,
    per_sec: u32,
    mut make: impl FnMut(u64) -> Vec<u8> + Send + 'static,
) -> anyhow::Result<u64> {
    let iface = iface.to_owned();
    inside(ns, move || {
        let sock = sender(&iface)?;
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < duration {
            let due = start.elapsed().as_secs_f64() * f64::from(per_sec);
            #[expect(clippy::cast_precision_loss, reason = "a count of frames")]
            if (n as f64) < due {
                // A full socket buffer drops a frame; the flood goes on.
                let _ = sock.send(&make(n));
                n += 1;
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(n)
    })
}

/// Captures, for up to `within`, frames on `iface` in `ns` that contain `needle`; returns
/// how many did.
///
/// # Errors
/// The socket cannot be opened.
pub fn count_frames_containing(
    ns: &Netns,
    iface: &str,
    needle: Vec<u8>,
    within: Duration,
) -> anyhow::Result<usize> {
    Ok(count_frames_containing_each(ns, iface, vec![needle], within)?[0])
}

/// Captures, for `within`, every frame on `iface` in `ns`; returns for each of `needles`
/// how many frames contained it.
///
/// # Errors
/// The socket cannot be opened.
pub fn count_frames_containing_each(
    ns: &Netns,
    iface: &str,
    needles: Vec<Vec<u8>>,
    within: Duration,
) -> anyhow::Result<Vec<usize>> {
    let iface = iface.to_owned();
    inside(ns, move || {
        let i = Interface::lookup_up(&iface)?;
        let mut sock = PacketSocket::open(&i, &PacketOptions::default())?;
        let mut found = vec![0; needles.len()];
        let deadline = Instant::now() + within;
        let mut storage = vec![vec![0u8; 2048]; 16];
        while Instant::now() < deadline {
            let mut bufs: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
            let mut meta = [FrameMeta::default(); 16];
            let n = sock.recv_batch(&mut bufs, &mut meta)?;
            for (b, m) in bufs[..n].iter().zip(&meta) {
                let frame = &b[..m.len.min(b.len())];
                for (needle, count) in needles.iter().zip(found.iter_mut()) {
                    if frame.windows(needle.len()).any(|w| w == needle) {
                        *count += 1;
                    }
                }
            }
        }
        Ok(found)
    })
}

/// Captures up to `count` UDP payloads sent to `port` that arrive on `iface` in `ns`, whose
/// first payload bytes satisfy `keep`, for up to `within`.
///
/// # Errors
/// The socket cannot be opened.
pub fn capture_udp(
    ns: &Netns,
    iface: &str,
    port: u16,
    count: usize,
    within: Duration,
    keep: fn(&[u8]) -> bool,
) -> anyhow::Result<Vec<Vec<u8>>> {
    joined(spawn_capture_udp(ns, iface, port, count, within, keep))
}

/// [`capture_udp`], started on a thread of its own (join it with [`joined`]).
pub fn spawn_capture_udp(
    ns: &Netns,
    iface: &str,
    port: u16,
    count: usize,
    within: Duration,
    keep: fn(&[u8]) -> bool,
) -> std::thread::JoinHandle<anyhow::Result<Vec<Vec<u8>>>> {
    let iface = iface.to_owned();
    spawn_inside(ns, move || {
        let i = Interface::lookup_up(&iface)?;
        let mut sock = PacketSocket::open(&i, &PacketOptions::default())?;
        let mut out = Vec::new();
        let deadline = Instant::now() + within;
        let mut storage = vec![vec![0u8; 2048]; 16];
        while out.len() < count && Instant::now() < deadline {
            let mut bufs: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
            let mut meta = [FrameMeta::default(); 16];
            let n = sock.recv_batch(&mut bufs, &mut meta)?;
            for (b, m) in bufs[..n].iter().zip(&meta) {
                let f = &b[..m.len.min(b.len())];
                // Ethernet, IPv4 without options, UDP to `port`.
                if f.len() < 42 || f[12..14] != [0x08, 0x00] || f[14] != 0x45 || f[23] != 17 {
                    continue;
                }
                if u16::from_be_bytes([f[36], f[37]]) != port {
                    continue;
                }
                let payload = &f[42..];
                if keep(payload) && out.len() < count {
                    out.push(payload.to_vec());
                }
            }
        }
        Ok(out)
    })
}

/// A UDP datagram seen on the wire: its source, destination and payload.
pub type Seen = (SocketAddr, SocketAddr, Vec<u8>);

/// Captures, on a thread inside `ns`, the IPv4 UDP datagrams on `iface` that `keep` takes,
/// until `count` were taken or `within` passed; returns them in order.
pub fn spawn_capture_datagrams(
    ns: &Netns,
    iface: &str,
    count: usize,
    within: Duration,
    keep: impl Fn(&Seen) -> bool + Send + 'static,
) -> std::thread::JoinHandle<anyhow::Result<Vec<Seen>>> {
    let iface = iface.to_owned();
    spawn_inside(ns, move || {
        let i = Interface::lookup_up(&iface)?;
        let mut sock = PacketSocket::open(&i, &PacketOptions::default())?;
        let mut out = Vec::new();
        let deadline = Instant::now() + within;
        let mut storage = vec![vec![0u8; 2048]; 16];
        while out.len() < count && Instant::now() < deadline {
            let mut bufs: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
            let mut meta = [FrameMeta::default(); 16];
            let n = sock.recv_batch(&mut bufs, &mut meta)?;
            for (b, m) in bufs[..n].iter().zip(&meta) {
                let f = &b[..m.len.min(b.len())];
                // Ethernet, IPv4 without options, UDP.
                if f.len() < 42 || f[12..14] != [0x08, 0x00] || f[14] != 0x45 || f[23] != 17 {
                    continue;
                }
                let ip = |at: usize| Ipv4Addr::new(f[at], f[at + 1], f[at + 2], f[at + 3]);
                let port = |at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
                let seen = (
                    SocketAddr::from((ip(26), port(34))),
                    SocketAddr::from((ip(30), port(36))),
                    f[42..].to_vec(),
                );
                if out.len() < count && keep(&seen) {
                    out.push(seen);
                }
            }
        }
        Ok(out)
    })
}

/// Sends datagrams from `bind` to `to`, inside `ns`.
///
/// # Errors
/// The socket cannot be bound.
pub fn send_udp(
    ns: &Netns,
    bind: SocketAddr,
    to: SocketAddr,
    payloads: Vec<Vec<u8>>,
) -> anyhow::Result<()> {
    send_udp_paced(ns, bind, to, payloads, Duration::ZERO)
}

/// Like [`send_udp`], with `gap` between datagrams, so a burst of ours does not itself
/// overflow a receiver that is busy with other traffic.
///
/// # Errors
/// The namespace cannot be entered or the socket cannot be bound.
pub fn send_udp_paced(
    ns: &Netns,
    bind: SocketAddr,
    to: SocketAddr,
    payloads: Vec<Vec<u8>>,
    gap: Duration,
) -> anyhow::Result<()> {
    inside(ns, move || {
        let sock = UdpSocket::bind(bind)?;
        for p in payloads {
            // Datagrams the kernel refuses (none expected) are not the test's subject.
            let _ = sock.send_to(&p, to);
            if !gap.is_zero() {
                std::thread::sleep(gap);
            }
        }
        Ok(())
    })
}

/// Starts sending `payload` from `bind` to `to` inside `ns` at about `rate` datagrams a
/// second for `duration`, on a thread of its own that stops by itself; joining it gives how
/// many were sent, or why it could not start (the namespace, the socket).
pub fn spawn_flood_udp(
    ns: &Netns,
    bind: SocketAddr,
    to: SocketAddr,
    payload: Vec<u8>,
    rate: u32,
    duration: Duration,
) -> std::thread::JoinHandle<anyhow::Result<u64>> {
    let name = ns.name().to_owned();
    std::thread::spawn(move || {
        netns::enter(&name).with_context(|| format!("entering {name}"))?;
        let sock = UdpSocket::bind(bind)?;
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < duration {
            // Catch up to where the rate says we should be, then sleep a millisecond.
            let due = start.elapsed().as_micros() * u128::from(rate) / 1_000_000;
            let due = u64::try_from(due).unwrap_or(u64::MAX);
            while sent < due {
                // A full socket buffer is the flood's own problem, not the test's.
                let _ = sock.send_to(&payload, to);
                sent += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(sent)
    })
}

/// The kernel's count of UDP datagrams dropped in `ns` because a socket's receive buffer
/// was full (`RcvbufErrors` in `/proc/net/snmp`): datagrams no daemon ever saw.
///
/// # Errors
/// The namespace cannot be entered or the file has no such field.
pub fn udp_rcvbuf_errors(ns: &Netns) -> anyhow::Result<u64> {
    let snmp = ns.exec("cat", &["/proc/net/snmp"])?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next(), udp.next());
    let (Some(names), Some(values)) = (names, values) else {
        anyhow::bail!("no Udp lines in /proc/net/snmp");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .map(|(_, v)| v.parse::<u64>())
        .ok_or_else(|| anyhow::anyhow!("no RcvbufErrors in /proc/net/snmp"))?
        .map_err(Into::into)
}

/// An Ethernet frame with the ICMPv6 message `message` (type, code, two bytes for the
/// checksum, then its body) from `src` to `dst` at hop limit `hop`, its checksum filled in.
pub fn icmpv6_frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: std::net::Ipv6Addr,
    dst: std::net::Ipv6Addr,
    hop: u8,
    message: Vec<u8>,
) -> Vec<u8> {
    transport6_frame((dst_mac, src_mac), (src, dst), (58, hop), message, 2)
}

/// An Ethernet frame with an IPv6 UDP datagram from `src:sport` to `dst:dport` (hop limit
/// 64), its checksum right.
pub fn udp6_frame(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    (src, sport): (std::net::Ipv6Addr, u16),
    (dst, dport): (std::net::Ipv6Addr, u16),
    payload: &[u8],
) -> Vec<u8> {
    let len = u16::try_from(8 + payload.len()).unwrap_or(u16::MAX);
    let mut udp = Vec::with_capacity(8 + payload.len());
    udp.extend_from_slice(&sport.to_be_bytes());
    udp.extend_from_slice(&dport.to_be_bytes());
    udp.extend_from_slice(&len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    transport6_frame((dst_mac, src_mac), (src, dst), (17, 64), udp, 6)
}

/// An Ethernet frame with an IPv6 packet carrying `message` of protocol `next`, whose
/// checksum (at `sum_at`) is filled in over the pseudo-header.
fn transport6_frame(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    (src, dst): (std::net::Ipv6Addr, std::net::Ipv6Addr),
    (next, hop): (u8, u8),
    mut message: Vec<u8>,
    sum_at: usize,
) -> Vec<u8> {
    let len = u16::try_from(message.len()).unwrap_or(u16::MAX);
    let mut pseudo = Vec::with_capacity(40 + message.len());
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&u32::from(len).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, next]);
    message[sum_at..sum_at + 2].fill(0);
    pseudo.extend_from_slice(&message);
    let sum = checksum(&pseudo);
    message[sum_at..sum_at + 2].copy_from_slice(&sum.to_be_bytes());
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x86, 0xdd]);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&len.to_be_bytes());
    f.extend_from_slice(&[next, hop]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&message);
    f
}

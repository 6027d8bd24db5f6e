//! Attacks on the bed and what they cost the adapter under them, shared by the hostile-network
//! tests (e2e/tests/hostile.rs) and the "under attack" benchmark (`cyphonic-bed attack`).
//! Every load is bounded in time and sent inside the bed's own namespaces.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::bed::{Ping, TwoSites};
use crate::inject;

/// A's first initiation to B, captured on the router as it crosses it: the bed's adapters
/// must be up and have no tunnel yet (this pings from lanA to lanB to start one).
///
/// # Errors
/// No initiation crossed the router within six seconds.
pub fn capture_initiation(bed: &TwoSites) -> anyhow::Result<Vec<u8>> {
    std::thread::scope(|s| {
        let capture = s.spawn(|| {
            inject::capture_udp(&bed.wan, "toa", 51820, 1, Duration::from_secs(6), |p| {
                p.len() > 16 && p[0] == cyphonic_wire::VERSION && p[1] == 1
            })
        });
        // The capture socket is open well before the first packet asks for a handshake.
        std::thread::sleep(Duration::from_millis(500));
        bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(2).wait(3));
        let frames = capture
            .join()
            .map_err(|_| anyhow::anyhow!("the capture thread panicked"))??;
        frames
            .into_iter()
            .next()
            .context("no initiation crossed the router")
    })
}

/// The Noise static key the certificate at `path` (text armor) certifies.
///
/// # Errors
/// The file cannot be read or is no certificate.
pub fn static_key(path: &std::path::Path) -> anyhow::Result<cyphonic_crypto::PublicKey> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let cert = cyphonic_crypto::Certificate::from_pem(&text)?;
    Ok(cyphonic_crypto::PublicKey(cert.body().public_key))
}

/// A host on `bed`'s underlay with `n` addresses (at most 250) to flood from: its first
/// and then 192.0.2.194 to .254 and 192.0.2.2 to .190 as needed, which the router reaches
/// through the host's link. Only for a bed without a cloud (the cloud and the nodes use the
/// lower half of 192.0.2.0/24). Returns the host (the flood ends with it) and the addresses.
///
/// # Errors
/// The host or an address cannot be set up.
pub fn flooding_host(bed: &TwoSites, n: usize) -> anyhow::Result<(crate::Netns, Vec<IpAddr>)> {
    anyhow::ensure!(bed.cloud.is_none(), "the cloud's addresses would be taken");
    let (host, first) = bed.add_underlay_host("flooder")?;
    for free in ["192.0.2.0/25", "192.0.2.128/26"] {
        bed.wan.ip(&["route", "add", free, "dev", "tov"])?;
    }
    let mut sources = vec![IpAddr::V4(first)];
    let lasts = (194..=254u8).filter(|l| *l != 200).chain(2..=190);
    for last in lasts.take(n.saturating_sub(1)) {
        let ip = std::net::Ipv4Addr::new(192, 0, 2, last);
        host.ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
        sources.push(IpAddr::V4(ip));
    }
    Ok((host, sources))
}

/// `init` (an initiation to `responder`) with its hint replaced by `hint` and mac1 sealed
/// again over it: what an attacker that never saw a member's hint sends
/// (docs/protocol.md §2, *Known peers first*).
///
/// # Errors
/// `init` is too short to be an initiation.
pub fn with_hint(
    init: &[u8],
    responder: &cyphonic_crypto::PublicKey,
    hint: [u8; 16],
) -> anyhow::Result<Vec<u8>> {
    use cyphonic_wire::{HANDSHAKE_INIT_MIN, HEADER_LEN, HINT_LEN, MAC_LEN};
    anyhow::ensure!(
        init.len() >= HEADER_LEN + HANDSHAKE_INIT_MIN,
        "not an initiation"
    );
    let mut frame = init.to_vec();
    let at1 = frame.len() - 2 * MAC_LEN;
    frame[at1 - HINT_LEN..at1].copy_from_slice(&hint);
    let mac1 = cyphonic_crypto::MacKeys::new(responder).mac1(&frame[..at1]);
    frame[at1..at1 + MAC_LEN].copy_from_slice(&mac1);
    frame[at1 + MAC_LEN..].fill(0);
    Ok(frame)
}

/// The first control frame (its length prefix and the Noise message: a `Hello`) of the next
/// TCP connection to `port` that arrives on `iface` of `ns`, put together from its segments
/// (a `Hello` with a certificate is larger than one segment). Run it while a client
/// connects; on a thread of its own (join it with [`inject::joined`]). It fails when no such
/// connection sent a whole first frame within `within`.
pub fn spawn_capture_first_control_frame(
    ns: &crate::Netns,
    iface: &str,
    port: u16,
    within: Duration,
) -> std::thread::JoinHandle<anyhow::Result<Vec<u8>>> {
    use cyphonic_netio::{FrameMeta, Interface, PacketOptions, PacketSocket};
    let iface = iface.to_owned();
    inject::spawn_inside(ns, move || {
        let i = Interface::lookup_up(&iface)?;
        let mut sock = PacketSocket::open(&i, &PacketOptions::default())?;
        let deadline = Instant::now() + within;
        // Offloads may hand the socket segments merged far beyond the MTU.
        let mut storage = vec![vec![0u8; 65_600]; 4];
        // The connection: its source, and the sequence number of its first byte.
        let mut flow: Option<((IpAddr, u16), u32)> = None;
        let mut stream: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        while Instant::now() < deadline {
            let mut bufs: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
            let mut meta = [FrameMeta::default(); 4];
            let n = sock.recv_batch(&mut bufs, &mut meta)?;
            for (b, m) in bufs[..n].iter().zip(&meta) {
                let f = &b[..m.len.min(b.len())];
                // Ethernet, IPv4, TCP to `port`.
                if f.len() < 34 || f[12..14] != [0x08, 0x00] || f[23] != 6 {
                    continue;
                }
                let ihl = usize::from(f[14] & 0x0f) * 4;
                let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
                let tcp = 14 + ihl;
                if f.len() < tcp + 20 || u16::from_be_bytes([f[tcp + 2], f[tcp + 3]]) != port {
                    continue;
                }
                let src = (
                    IpAddr::from([f[26], f[27], f[28], f[29]]),
                    u16::from_be_bytes([f[tcp], f[tcp + 1]]),
                );
                let seq = u32::from_be_bytes(f[tcp + 4..tcp + 8].try_into()?);
                let flags = f[tcp + 13];
                if flags & 0x12 == 0x02 {
                    // A SYN: a new connection; its data starts one after.
                    flow = Some((src, seq.wrapping_add(1)));
                    stream.clear();
                    continue;
                }
                let Some((from, isn)) = flow else { continue };
                if src != from {
                    continue;
                }
                let data = tcp + usize::from(f[tcp + 12] >> 4) * 4;
                let end = (14 + total).min(f.len());
                if data < end {
                    stream.insert(seq.wrapping_sub(isn), f[data..end].to_vec());
                }
                // Contiguous bytes from the start, as far as they go.
                let mut bytes = Vec::new();
                for (&at, seg) in &stream {
                    let at = usize::try_from(at)?;
                    if at > bytes.len() {
                        break;
                    }
                    let skip = bytes.len() - at;
                    if skip < seg.len() {
                        bytes.extend_from_slice(&seg[skip..]);
                    }
                }
                if bytes.len() >= 2 {
                    let want = 2 + usize::from(u16::from_be_bytes([bytes[0], bytes[1]]));
                    if bytes.len() >= want {
                        bytes.truncate(want);
                        return Ok(bytes);
                    }
                }
            }
        }
        anyhow::bail!("no whole first frame to port {port} crossed {iface} within {within:?}")
    })
}

/// Connects from `ns` to `to`, writes `bytes` and returns whatever comes back before the
/// other side closes (or `within` passes).
///
/// # Errors
/// The connection cannot be made.
pub fn tcp_exchange(
    ns: &crate::Netns,
    to: SocketAddr,
    bytes: Vec<u8>,
    within: Duration,
) -> anyhow::Result<Vec<u8>> {
    inject::inside(ns, move || {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
        s.write_all(&bytes)?;
        s.set_read_timeout(Some(within))?;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        Ok(out)
    })
}

/// What a connection flood saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnectionFlood {
    /// Connections made.
    pub opened: u64,
    /// Of those, closed by the other side within 200 ms without a byte.
    pub closed_at_once: u64,
}

/// Opens `per_sec` TCP connections a second from `ns` to `to`, for `duration`, sending
/// nothing on them and keeping each until the other side closes it or the flood ends (a
/// "slowloris"). On a thread of its own.
pub fn spawn_connection_flood(
    ns: &crate::Netns,
    to: SocketAddr,
    per_sec: u32,
    duration: Duration,
) -> std::thread::JoinHandle<anyhow::Result<ConnectionFlood>> {
    spawn_connection_flood_from(ns, Vec::new(), to, per_sec, duration)
}

/// [`spawn_connection_flood`] with each connection from the next of `sources` in turn (the
/// namespace's own addresses; none: whichever the kernel picks).
pub fn spawn_connection_flood_from(
    ns: &crate::Netns,
    sources: Vec<IpAddr>,
    to: SocketAddr,
    per_sec: u32,
    duration: Duration,
) -> std::thread::JoinHandle<anyhow::Result<ConnectionFlood>> {
    inject::spawn_inside(ns, move || {
        let mut held = Vec::new();
        let mut seen = ConnectionFlood::default();
        let gap = Duration::from_secs(1) / per_sec.max(1);
        let end = Instant::now() + duration;
        let mut next = Instant::now();
        let mut turn = 0usize;
        let connect = |source: Option<IpAddr>| -> std::io::Result<TcpStream> {
            let Some(source) = source else {
                return TcpStream::connect_timeout(&to, Duration::from_millis(500));
            };
            let s = socket2::Socket::new(
                socket2::Domain::for_address(to),
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )?;
            s.bind(&SocketAddr::new(source, 0).into())?;
            s.connect_timeout(&to.into(), Duration::from_millis(500))?;
            Ok(s.into())
        };
        while Instant::now() < end {
            let source = (!sources.is_empty()).then(|| sources[turn % sources.len()]);
            turn += 1;
            if let Ok(s) = connect(source) {
                seen.opened += 1;
                // Looked at without waiting, below.
                s.set_nonblocking(true)?;
                held.push((s, Instant::now()));
            }
            // Which ones the other side closed, and how soon.
            held.retain_mut(|(s, opened)| {
                let mut b = [0u8; 1];
                let closed = matches!(s.read(&mut b), Ok(0));
                if closed && opened.elapsed() < Duration::from_millis(200) {
                    seen.closed_at_once += 1;
                }
                !closed
            });
            next += gap;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        Ok(seen)
    })
}

/// What a handshake flood from many addresses did.
#[derive(Debug, Default, Clone, Copy)]
pub struct HandshakeFlood {
    /// Initiations sent.
    pub sent: u64,
    /// Of them, with a valid-looking mac2 (a cookie answered).
    pub with_cookie: u64,
    /// Cookie-replies received.
    pub cookie_replies: u64,
}

/// Floods `to` with the initiation `init` (captured: a replay) from every one of `sources`
/// (the namespace's own addresses), `per_source` a second each, for `duration`, the way a
/// determined attacker with real addresses would: each source answers the responder's
/// cookie-replies (the cookie opened with the responder's public key `responder`, as any
/// initiator can) and sends the initiation again with a valid mac2, so that the flood is
/// past the cookie check and each initiation costs the responder its Diffie-Hellman work.
/// On a thread of its own inside `ns`; join it with [`inject::joined`].
pub fn spawn_cookie_answering_flood(
    ns: &crate::Netns,
    sources: Vec<IpAddr>,
    to: SocketAddr,
    init: Vec<u8>,
    responder: cyphonic_crypto::PublicKey,
    per_source: u32,
    duration: Duration,
) -> std::thread::JoinHandle<anyhow::Result<HandshakeFlood>> {
    inject::spawn_inside(ns, move || {
        let keys = cyphonic_crypto::MacKeys::new(&responder);
        let len = init.len();
        anyhow::ensure!(len > 48, "not an initiation");
        let mac1: [u8; 16] = init[len - 32..len - 16].try_into()?;
        let mut socks = Vec::new();
        for ip in &sources {
            let s = std::net::UdpSocket::bind(SocketAddr::new(*ip, 0))?;
            s.set_nonblocking(true)?;
            socks.push((s, None::<[u8; 16]>, init.clone()));
        }
        let mut seen = HandshakeFlood::default();
        let tick = Duration::from_millis(10);
        // Hundredths of a frame each source may send, carried from tick to tick: rates under
        // 100 a second are kept too.
        let mut credit = 0u32;
        let end = Instant::now() + duration;
        let mut next = Instant::now();
        let mut buf = [0u8; 256];
        while Instant::now() < end {
            credit += per_source;
            let per_tick = credit / 100;
            credit %= 100;
            for (sock, cookie, frame) in &mut socks {
                while let Ok(n) = sock.recv(&mut buf) {
                    // A cookie-reply: header, then the sealed cookie.
                    if n == 72
                        && buf[1] == 7
                        && let Some(c) = keys.open_cookie(&buf[16..72], &mac1)
                    {
                        seen.cookie_replies += 1;
                        *cookie = Some(c);
                        let mac2 = cyphonic_crypto::cookie::mac(&c, &frame[..len - 16]);
                        frame[len - 16..].copy_from_slice(&mac2);
                    }
                }
                for _ in 0..per_tick {
                    if sock.send_to(frame, to).is_ok() {
                        seen.sent += 1;
                        seen.with_cookie += u64::from(cookie.is_some());
                    }
                }
            }
            next += tick;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        Ok(seen)
    })
}

/// Open file descriptors of process `pid` (its sockets among them).
///
/// # Errors
/// The process is gone.
pub fn open_fds(pid: u32) -> anyhow::Result<usize> {
    let dir = format!("/proc/{pid}/fd");
    Ok(std::fs::read_dir(&dir)
        .with_context(|| format!("reading {dir}"))?
        .count())
}

/// What each thread name used between two [`thread_ticks`] readings `seconds` apart, % of
/// a core; a thread that began in between counts from 0.
pub fn thread_percent(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    seconds: f64,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(name, &t)| {
            let was = before.get(name).copied().unwrap_or(0);
            let used = t.saturating_sub(was) as f64 / TICKS_PER_SEC / seconds;
            (name.clone(), 100.0 * used)
        })
        .collect()
}

/// The threads of process `pid` whose name (`comm`) `named` accepts, by thread ID; a thread
/// that ends while they are read is left out.
///
/// # Errors
/// The process is gone.
pub fn thread_ids(pid: u32, named: impl Fn(&str) -> bool) -> anyhow::Result<Vec<u32>> {
    let dir = format!("/proc/{pid}/task");
    Ok(std::fs::read_dir(&dir)
        .with_context(|| format!("reading {dir}"))?
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| named(c.trim_end()))
        })
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
        .collect())
}

/// CPU time (user and system, in clock ticks) each thread of process `pid` has used, by
/// thread name; the main thread (the daemons' control thread) is named `control`. Threads of
/// one name (the crypto workers) are summed.
///
/// # Errors
/// The process is gone.
pub fn thread_ticks(pid: u32) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    let dir = format!("/proc/{pid}/task");
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let entry = entry?;
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        // "tid (comm) state ...": the name may hold spaces and parentheses, so split at the
        // last ')'; utime and stime are fields 14 and 15, the 12th and 13th after it.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map_or("", |(_, n)| n);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let name = if entry.file_name().to_string_lossy() == pid.to_string() {
            "control".to_owned()
        } else {
            name.trim_end_matches(|c: char| c.is_ascii_digit())
                .trim_end_matches('-')
                .to_owned()
        };
        *out.entry(name).or_default() += ticks(11) + ticks(12);
    }
    Ok(out)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`; 100 on every Linux this runs on).
pub const TICKS_PER_SEC: f64 = 100.0;

#[cfg(test)]
mod tests {
    use super::*;

    /// The busy thread spins until it has had its CPU time, however long a loaded machine
    /// takes to give it (at most a minute), and is measured before it ends: the check is of
    /// the counting, not of the machine's speed.
    #[test]
    fn this_process_has_a_control_thread_with_ticks() {
        let pid = std::process::id();
        let busy_ticks = move || {
            thread_ticks(pid)
                .ok()
                .and_then(|t| t.get("cy-busy").copied())
                .unwrap_or(0)
        };
        let (spun, measured) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let (spun_tx, measured_rx) = (spun.0, measured.1);
        let busy = std::thread::Builder::new()
            .name("cy-busy-1".into())
            .spawn(move || {
                let t = Instant::now();
                let mut x = 0u64;
                while busy_ticks() < 12 && t.elapsed() < Duration::from_secs(60) {
                    for _ in 0..1_000_000 {
                        x = x.wrapping_add(1);
                    }
                    std::hint::black_box(x);
                }
                let _ = spun_tx.send(());
                let _ = measured_rx.recv();
            })
            .unwrap();
        let _ = spun.1.recv();
        let ticks = thread_ticks(pid).unwrap();
        drop(measured.0);
        busy.join().unwrap();
        assert!(ticks.contains_key("control"), "{ticks:?}");
        assert!(ticks.get("cy-busy").is_some_and(|t| *t >= 10), "{ticks:?}");
    }
}

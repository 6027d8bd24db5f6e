//! Coalescing for the LAN side (GRO, done here): consecutive TCP segments or UDP datagrams of
//! one flow, out of the tunnel in order, go to the device as one large frame that the kernel
//! segments again (GSO, or the NIC's TSO/USO), so the LAN side pays one trip per run instead
//! of per packet.
//!
//! A TCP run is what Linux's GRO would merge (`tcp_gro_receive`): same Ethernet header, IPv4
//! without options, not a fragment, the same addresses, TOS, TTL and DF (or IPv6 without
//! extension headers, the same addresses, traffic class, flow label and hop limit); TCP with
//! the same
//! ports, acknowledgement number, window, flags and option bytes, sequence numbers that
//! continue each other, and payloads of one size (the last may be shorter; a shorter one or
//! one with PSH ends the run). SYN, FIN, RST, URG and CWR segments travel alone. A UDP run
//! (`udp_gro_receive` with UDP GRO on): the same headers but lengths and checksums, datagrams
//! of one size (the last may be shorter), none without a checksum. Every packet of a run must
//! carry a valid checksum: coalescing replaces the checksums, so it must never turn a damaged
//! packet into a good one.
//!
//! [`find_run`] finds a run at the start of a list of frames; [`merge_headers`] turns the first
//! frame's headers into those of the whole run (IP total length and header checksum, UDP
//! length; the checksum field gets the pseudo-header sum the offload completes) and
//! [`restore_headers`] undoes that, should the kernel refuse the merged frame.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::ipv4::{self, PROTO_TCP, PROTO_UDP};
use crate::segment::GsoKind;
use crate::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, Framing, IPV4_MIN_HEADER, checksum};

/// The fixed IPv6 header: a run's IPv6 packets carry nothing between it and TCP or UDP.
const IPV6_HEADER: usize = 40;

const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_URG: u8 = 0x20;
const TCP_CWR: u8 = 0x80;
/// Flags that keep a segment out of any run.
const ALONE: u8 = TCP_SYN | TCP_FIN | TCP_RST | TCP_URG | TCP_CWR;
const UDP_HEADER_LEN: usize = 8;

/// A run of frames to send as one (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// TCP segments or UDP datagrams.
    pub kind: GsoKind,
    /// What is in front of each IP packet.
    pub framing: Framing,
    /// The IP header's length: 20 (IPv4, no options) or 40 (IPv6, no extension headers).
    pub ip_header: usize,
    /// Frames in the run, the first included (at least 2).
    pub count: usize,
    /// Link (if any), IP and transport headers of each frame: the first frame is sent whole,
    /// the others from this offset on (their payload).
    pub headers: usize,
    /// Payload bytes of every packet but the last (the size the offload cuts at).
    pub segment_size: u16,
    /// Payload bytes of the whole run.
    pub payload: usize,
}

/// The fields of one packet's headers that a run compares.
#[derive(Clone, Copy)]
struct Seg<'a> {
    frame: &'a [u8],
    /// Link header bytes in front of the IP packet.
    link: usize,
    /// IP header bytes: 20, or 40 for IPv6.
    ip_header: usize,
    kind: GsoKind,
    /// Transport header length.
    l4_header: usize,
    payload: usize,
    /// TCP only.
    seq: u32,
    flags: u8,
}

fn parse(framing: Framing, frame: &[u8]) -> Option<Seg<'_>> {
    let link = framing.header_len();
    if frame.len() < link + IPV4_MIN_HEADER + UDP_HEADER_LEN {
        return None;
    }
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let ip = &frame[link..];
    let (ip_header, proto) = match ip[0] >> 4 {
        // Version 4, no options; the whole frame is the packet (no padding); not a fragment.
        4 if (framing == Framing::Ip || ethertype == ETHERTYPE_IPV4)
            && ip[0] == 0x45
            && usize::from(u16::from_be_bytes([ip[2], ip[3]])) == ip.len()
            && u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff == 0 =>
        {
            (IPV4_MIN_HEADER, ip[9])
        }
        // Version 6, TCP or UDP right after the fixed header; the whole frame is the packet.
        6 if (framing == Framing::Ip || ethertype == ETHERTYPE_IPV6)
            && ip.len() >= IPV6_HEADER + UDP_HEADER_LEN
            && IPV6_HEADER + usize::from(u16::from_be_bytes([ip[4], ip[5]])) == ip.len() =>
        {
            (IPV6_HEADER, ip[6])
        }
        _ => return None,
    };
    let l4 = &ip[ip_header..];
    match proto {
        PROTO_TCP if l4.len() >= 20 => {
            let doff = usize::from(l4[12] >> 4) * 4;
            (doff >= 20 && doff <= l4.len()).then(|| Seg {
                frame,
                link,
                ip_header,
                kind: GsoKind::Tcp,
                l4_header: doff,
                payload: l4.len() - doff,
                seq: u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]),
                flags: l4[13],
            })
        }
        // A datagram without a checksum (zero) is left alone: merging would give it one.
        PROTO_UDP
            if usize::from(u16::from_be_bytes([l4[4], l4[5]])) == l4.len()
                && l4[6..8] != [0, 0] =>
        {
            Some(Seg {
                frame,
                link,
                ip_header,
                kind: GsoKind::Udp,
                l4_header: UDP_HEADER_LEN,
                payload: l4.len() - UDP_HEADER_LEN,
                seq: 0,
                flags: 0,
            })
        }
        _ => None,
    }
}

const fn proto(kind: GsoKind) -> u8 {
    match kind {
        GsoKind::Tcp => PROTO_TCP,
        GsoKind::Udp => PROTO_UDP,
    }
}

/// Whether both checksums of `s`, the IP header's and the transport's, are right. (The
/// tunnel's ingress has checked the IP header already; merging rewrites it, so it is checked
/// here too, at the cost of 20 bytes.) A packet whose transport checksum was `deferred` by the
/// tunnel's sender has none to check: the AEAD brought its payload intact.
fn checksum_ok(s: &Seg<'_>, deferred: bool) -> bool {
    let ip = &s.frame[s.link..];
    if s.ip_header == IPV6_HEADER {
        // No deferral over IPv6 (docs/protocol.md §1): always checked.
        let (src, dst) = addresses6(ip);
        return checksum::valid6(&ip[IPV6_HEADER..], src, dst, proto(s.kind));
    }
    let (src, dst) = addresses(ip);
    checksum::internet(&ip[..IPV4_MIN_HEADER]) == 0
        && (deferred || checksum::transport_valid(&ip[IPV4_MIN_HEADER..], src, dst, proto(s.kind)))
}

fn addresses(ip: &[u8]) -> (Ipv4Addr, Ipv4Addr) {
    (
        Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
    )
}

fn addresses6(ip: &[u8]) -> (Ipv6Addr, Ipv6Addr) {
    let at = |from: usize| {
        let mut a = [0u8; 16];
        a.copy_from_slice(&ip[from..from + 16]);
        Ipv6Addr::from(a)
    };
    (at(8), at(24))
}

/// Whether `next` may follow `prev` in a run that `first` starts.
fn continues(first: &Seg<'_>, prev: &Seg<'_>, next: &Seg<'_>) -> bool {
    let link = first.link;
    // The link headers, then the IP packets (offsets from here on are the packets').
    let (f, n) = (&first.frame[link..], &next.frame[link..]);
    let ih = first.ip_header;
    let ip_same = if ih == IPV6_HEADER {
        // Version, traffic class and flow label; next header and hop limit; addresses.
        next.ip_header == IPV6_HEADER
            && f[0..4] == n[0..4]
            && f[6..8] == n[6..8]
            && f[8..40] == n[8..40]
    } else {
        // Version/IHL and TOS; flags (DF), TTL and protocol; addresses.
        next.ip_header == IPV4_MIN_HEADER
            && f[0..2] == n[0..2]
            && f[6..10] == n[6..10]
            && f[12..20] == n[12..20]
    };
    let same = ip_same
        && next.kind == first.kind
        && next.l4_header == first.l4_header
        && next.payload > 0
        && next.payload <= first.payload
        && first.frame[..link] == next.frame[..link]
        // Ports.
        && f[ih..ih + 4] == n[ih..ih + 4];
    match first.kind {
        GsoKind::Udp => same,
        GsoKind::Tcp => {
            let headers = ih + first.l4_header;
            same && next.seq == prev.seq.wrapping_add(u32::try_from(prev.payload).unwrap_or(0))
                && next.flags & !TCP_PSH == first.flags
                // Acknowledgement number; the data offset byte whole (its reserved and NS
                // bits too, as Linux compares the whole flag word); flags (compared above),
                // window; urgent pointer and options.
                && f[ih + 8..ih + 13] == n[ih + 8..ih + 13]
                && f[ih + 14..ih + 16] == n[ih + 14..ih + 16]
                && f[ih + 18..headers] == n[ih + 18..headers]
        }
    }
}

/// The run of packets at the start of `frames` that can go out as one frame, if the first two
/// already make one. Runs stop at `max_count` frames and before the IP packet would pass
/// 65,535 bytes. `deferred[i]` says that frame `i` came through the tunnel with its transport
/// checksum deferred (its field holds nothing to verify; missing entries count as `false`).
/// Every frame has `framing` in front of its IP packet.
pub fn find_run(
    framing: Framing,
    frames: &[&[u8]],
    deferred: &[bool],
    max_count: usize,
) -> Option<Run> {
    let deferred = |i: usize| deferred.get(i).copied().unwrap_or(false);
    let link = framing.header_len();
    let first = parse(framing, frames.first()?)?;
    if first.payload == 0
        || (first.kind == GsoKind::Tcp
            && (first.flags & ALONE != 0
                || first.flags & TCP_ACK == 0
                || first.flags & TCP_PSH != 0))
    {
        return None;
    }
    let headers = link + first.ip_header + first.l4_header;
    let mut first_checked = false;
    let mut count = 1;
    let mut payload = first.payload;
    let mut prev = first;
    for (i, frame) in frames.iter().enumerate().take(max_count).skip(1) {
        let Some(next) = parse(framing, frame) else {
            break;
        };
        if !continues(&first, &prev, &next)
            || headers - link + payload + next.payload > usize::from(u16::MAX)
        {
            break;
        }
        if !first_checked {
            // The first packet is checked only once a second one could join it.
            if !checksum_ok(&first, deferred(0)) {
                return None;
            }
            first_checked = true;
        }
        if !checksum_ok(&next, deferred(i)) {
            break;
        }
        count += 1;
        payload += next.payload;
        let last = next.payload < first.payload || next.flags & TCP_PSH != 0;
        prev = next;
        if last {
            break;
        }
    }
    (count > 1).then(|| Run {
        kind: first.kind,
        framing,
        ip_header: first.ip_header,
        count,
        headers,
        segment_size: u16::try_from(first.payload).unwrap_or(u16::MAX),
        payload,
    })
}

/// Rewrites the first frame of `run` (`frame`, its own bytes only) to head the whole run: IP
/// total length and header checksum, the UDP length, the transport checksum field set to the
/// pseudo-header sum that checksum offload expects (`CHECKSUM_PARTIAL`), and for TCP the PSH
/// flag of the run's last segment (`last_flags`).
pub fn merge_headers(frame: &mut [u8], run: &Run, last_flags: u8) {
    let link = run.framing.header_len();
    let ip = &mut frame[link..];
    let ih = run.ip_header;
    let l4_len = run.headers - link - ih + run.payload;
    let proto = proto(run.kind);
    let pseudo = if ih == IPV6_HEADER {
        let len = u16::try_from(l4_len).unwrap_or(u16::MAX);
        ip[4..6].copy_from_slice(&len.to_be_bytes());
        let (src, dst) = addresses6(ip);
        checksum::pseudo_header6(src, dst, proto, l4_len)
    } else {
        let total = u16::try_from(IPV4_MIN_HEADER + l4_len).unwrap_or(u16::MAX);
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ipv4::fill_header_checksum(ip, IPV4_MIN_HEADER);
        let (src, dst) = addresses(ip);
        checksum::pseudo_header(src, dst, proto, l4_len)
    };
    let l4 = &mut ip[ih..];
    match run.kind {
        GsoKind::Tcp => l4[13] |= last_flags & TCP_PSH,
        GsoKind::Udp => {
            let len = u16::try_from(l4_len).unwrap_or(u16::MAX);
            l4[4..6].copy_from_slice(&len.to_be_bytes());
        }
    }
    if let Some(at) = checksum::field(proto) {
        l4[at..at + 2].copy_from_slice(&pseudo.to_be_bytes());
    }
}

/// Undoes [`merge_headers`] on a frame of kind `kind` whose own bytes are `frame` (with
/// `framing` in front of its IP packet): its own total length, header checksum, UDP length,
/// TCP flags (`flags`, as they were) and full transport checksum.
pub fn restore_headers(framing: Framing, frame: &mut [u8], kind: GsoKind, flags: u8) {
    let ip = &mut frame[framing.header_len()..];
    let own_lengths = |l4: &mut [u8]| match kind {
        GsoKind::Tcp => l4[13] = flags,
        GsoKind::Udp => {
            let len = u16::try_from(l4.len()).unwrap_or(u16::MAX);
            l4[4..6].copy_from_slice(&len.to_be_bytes());
        }
    };
    if ip.first().is_some_and(|b| b >> 4 == 6) {
        let len = u16::try_from(ip.len() - IPV6_HEADER).unwrap_or(u16::MAX);
        ip[4..6].copy_from_slice(&len.to_be_bytes());
        let (src, dst) = addresses6(ip);
        let l4 = &mut ip[IPV6_HEADER..];
        own_lengths(l4);
        checksum::fill_transport6(l4, src, dst, proto(kind));
    } else {
        let total = u16::try_from(ip.len()).unwrap_or(u16::MAX);
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ipv4::fill_header_checksum(ip, IPV4_MIN_HEADER);
        let (src, dst) = addresses(ip);
        let l4 = &mut ip[IPV4_MIN_HEADER..];
        own_lengths(l4);
        checksum::fill_transport(l4, src, dst, proto(kind));
    }
}

/// The TCP flags of a frame with `framing` in front of its IP packet (0 if it is too short to
/// have any).
pub fn tcp_flags(framing: Framing, frame: &[u8]) -> u8 {
    let link = framing.header_len();
    let ih = match frame.get(link).map(|b| b >> 4) {
        Some(6) => IPV6_HEADER,
        _ => IPV4_MIN_HEADER,
    };
    frame.get(link + ih + 13).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ETH_HEADER_LEN;
    use crate::segment::Segmenter;
    use crate::testutil::checksums_ok;

    const ACK: u8 = TCP_ACK;

    /// A wire frame of one TCP segment with valid checksums.
    fn seg(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let opts = [1u8, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]; // NOP NOP timestamps
        let total = 20 + 20 + opts.len() + payload.len();
        let mut f = vec![0u8; ETH_HEADER_LEN + total];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let ip = &mut f[ETH_HEADER_LEN..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&u16::try_from(total).unwrap().to_be_bytes());
        ip[4..6].copy_from_slice(&seq.to_be_bytes()[2..]);
        ip[6] = 0x40;
        ip[8] = 63;
        ip[9] = PROTO_TCP;
        ip[12..16].copy_from_slice(&[100, 64, 1, 10]);
        ip[16..20].copy_from_slice(&[100, 64, 2, 20]);
        ipv4::fill_header_checksum(ip, 20);
        let t = &mut ip[20..];
        t[0..2].copy_from_slice(&5201u16.to_be_bytes());
        t[2..4].copy_from_slice(&40000u16.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&99u32.to_be_bytes());
        t[12] = 8 << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&1000u16.to_be_bytes());
        t[20..32].copy_from_slice(&opts);
        t[32..].copy_from_slice(payload);
        let sum = checksum::transport(
            t,
            Ipv4Addr::new(100, 64, 1, 10),
            Ipv4Addr::new(100, 64, 2, 20),
            PROTO_TCP,
            8,
        );
        t[16..18].copy_from_slice(&sum.to_be_bytes());
        f
    }

    /// Makes both checksums of a frame right again after a test edited it.
    fn refix(f: &mut [u8]) {
        ipv4::fill_header_checksum(&mut f[14..], 20);
        restore_headers(
            Framing::Ethernet,
            f,
            GsoKind::Tcp,
            tcp_flags(Framing::Ethernet, f),
        );
    }

    fn stream(sizes: &[usize], last_flags: u8) -> (Vec<Vec<u8>>, Vec<u8>) {
        let mut seq = 0xffff_fff0u32; // wraps inside the run
        let mut frames = Vec::new();
        let mut data = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let payload: Vec<u8> = (0..n).map(|k| (data.len() + k).to_le_bytes()[0]).collect();
            let flags = if i + 1 == sizes.len() {
                ACK | last_flags
            } else {
                ACK
            };
            frames.push(seg(seq, flags, &payload));
            seq = seq.wrapping_add(u32::try_from(n).unwrap());
            data.extend_from_slice(&payload);
        }
        (frames, data)
    }

    fn run_of(frames: &[Vec<u8>]) -> Option<Run> {
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        find_run(Framing::Ethernet, &refs, &[], 64)
    }

    /// Bare IP packets (a TUN device's) make the same runs as the same packets in Ethernet
    /// frames, merge into the same packet and are restored the same way.
    #[test]
    fn bare_ip_packets_make_the_same_runs() {
        let (frames, _) = stream(&[100, 100, 100, 60], TCP_PSH | ACK);
        let eth: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let bare: Vec<&[u8]> = frames.iter().map(|f| &f[ETH_HEADER_LEN..]).collect();
        let a = find_run(Framing::Ethernet, &eth, &[], 64).unwrap();
        let b = find_run(Framing::Ip, &bare, &[], 64).unwrap();
        assert_eq!(a.count, 4);
        assert_eq!(
            (b.count, b.kind, b.segment_size, b.payload, b.headers),
            (
                a.count,
                a.kind,
                a.segment_size,
                a.payload,
                a.headers - ETH_HEADER_LEN
            )
        );
        let mut merged = frames[0].clone();
        merge_headers(&mut merged, &a, tcp_flags(Framing::Ethernet, eth[3]));
        let mut merged_bare = bare[0].to_vec();
        merge_headers(&mut merged_bare, &b, tcp_flags(Framing::Ip, bare[3]));
        assert_eq!(merged_bare, merged[ETH_HEADER_LEN..]);
        restore_headers(
            Framing::Ip,
            &mut merged_bare,
            b.kind,
            tcp_flags(Framing::Ip, bare[0]),
        );
        assert_eq!(merged_bare, bare[0]);
        // A difference in the IP or TCP headers stops a bare run as it stops a framed one.
        let mut other = frames.clone();
        other[2][ETH_HEADER_LEN + 8] -= 1; // TTL
        ipv4::fill_header_checksum(&mut other[2][ETH_HEADER_LEN..], IPV4_MIN_HEADER);
        let bare: Vec<&[u8]> = other.iter().map(|f| &f[ETH_HEADER_LEN..]).collect();
        assert_eq!(
            find_run(Framing::Ip, &bare, &[true; 4], 64).unwrap().count,
            2
        );
        // Ethernet framing is not read into a bare packet, nor the other way round.
        assert_eq!(find_run(Framing::Ethernet, &bare, &[], 64), None);
        assert_eq!(find_run(Framing::Ip, &eth, &[], 64), None);
    }

    /// Merges like the adapter does and cuts the result like the kernel's GSO would: the
    /// segments must be the original frames, byte for byte, bar the IP ID.
    fn merged_then_cut(frames: &[Vec<u8>], run: &Run) -> Vec<Vec<u8>> {
        let mut first = frames[0].clone();
        let last_flags = tcp_flags(Framing::Ethernet, &frames[run.count - 1]);
        merge_headers(&mut first, run, last_flags);
        let mut big = first;
        for f in &frames[1..run.count] {
            big.extend_from_slice(&f[run.headers..]);
        }
        assert_eq!(big.len(), run.headers + run.payload);
        // Segmenter treats the IP header like GRO output: its checksum must be valid.
        let mut s = Segmenter::new(&big, run.kind, run.segment_size, 4096).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Some(n) = s.next_into(&mut buf) {
            out.push(buf[..n].to_vec());
        }
        out
    }

    #[test]
    fn a_stream_of_full_segments_is_one_run_that_cuts_back_into_itself() {
        let (frames, _) = stream(&[1448; 10], TCP_PSH);
        let run = run_of(&frames).unwrap();
        assert_eq!(
            (run.count, run.segment_size, run.payload),
            (10, 1448, 14480)
        );
        assert_eq!(run.headers, 14 + 20 + 32);
        let cut = merged_then_cut(&frames, &run);
        assert_eq!(cut.len(), 10);
        for (a, b) in cut.iter().zip(&frames) {
            assert!(checksums_ok(&a[14..]));
            // Everything but the IP ID and the header checksum that covers it.
            assert!(a[..18] == b[..18] && a[20..24] == b[20..24] && a[26..] == b[26..]);
        }
    }

    #[test]
    fn a_short_segment_or_psh_ends_the_run() {
        let (frames, _) = stream(&[1000, 1000, 600, 1000], 0);
        assert_eq!(
            run_of(&frames).unwrap().count,
            3,
            "the short one is the last"
        );
        let (mut frames, _) = stream(&[1000, 1000, 1000, 1000], 0);
        frames[1][14 + 33] |= TCP_PSH;
        refix(&mut frames[1]);
        let run = run_of(&frames).unwrap();
        assert_eq!(run.count, 2, "PSH ends it");
        let cut = merged_then_cut(&frames, &run);
        assert_eq!(cut[0][14 + 33], ACK, "PSH only on the last");
        assert_eq!(cut[1][14 + 33], ACK | TCP_PSH);
        let (frames, _) = stream(&[1000, 1200], 0);
        assert_eq!(
            run_of(&frames),
            None,
            "a larger second segment is not a run"
        );
    }

    #[test]
    fn segments_that_differ_or_travel_alone_are_not_merged() {
        let (base, _) = stream(&[500, 500, 500], 0);
        let refs = |v: &[Vec<u8>]| v.to_vec();
        // A gap in the sequence.
        let mut gap = refs(&base);
        gap[1] = seg(0xffff_fff0u32.wrapping_add(501), ACK, &[7; 500]);
        assert_eq!(run_of(&gap), None);
        // Other flags on the first.
        for flags in [
            TCP_SYN | ACK,
            TCP_FIN | ACK,
            TCP_RST | ACK,
            TCP_URG | ACK,
            TCP_CWR | ACK,
            TCP_PSH | ACK,
            0,
        ] {
            let mut v = refs(&base);
            v[0] = seg(0xffff_fff0, flags, &[0; 500]);
            assert_eq!(run_of(&v), None, "flags {flags:#x}");
        }
        // A different header byte anywhere that must match: TTL, destination, port, ack, the
        // data offset byte's reserved/NS bits, window, option.
        for at in [14 + 8, 14 + 19, 14 + 22, 14 + 31, 14 + 32, 14 + 35, 14 + 50] {
            let mut v = refs(&base);
            v[1][at] ^= 1;
            refix(&mut v[1]);
            assert!(run_of(&[v[1].clone()]).is_none() && checksums_ok(&v[1][14..]));
            assert_eq!(run_of(&v), None, "byte {at} differs");
        }
        // A damaged payload (checksum wrong) is never merged, neither first nor later.
        let mut v = refs(&base);
        let last = v[1].len() - 1;
        v[1][last] ^= 0xff;
        assert_eq!(run_of(&v), None);
        let mut v = refs(&base);
        let last = v[0].len() - 1;
        v[0][last] ^= 0xff;
        assert_eq!(run_of(&v), None);
        let mut v = refs(&base);
        let last = v[2].len() - 1;
        v[2][last] ^= 0xff;
        assert_eq!(
            run_of(&v).unwrap().count,
            2,
            "the run stops before the damaged one"
        );
        // Not IPv4, IP options, no payload, garbage: no run, no panic.
        let mut v = refs(&base);
        v[0][14] = 0x46;
        assert_eq!(run_of(&v), None);
        let mut v = refs(&base);
        v[1][12] = 0x86; // an IPv6 ethertype
        assert_eq!(run_of(&v), None);
        let (empty, _) = stream(&[0, 0], 0);
        assert_eq!(run_of(&empty), None);
        for len in 0..80 {
            let junk = vec![0x45u8; len];
            assert_eq!(find_run(Framing::Ethernet, &[&junk, &junk], &[], 64), None);
        }
        assert_eq!(find_run(Framing::Ethernet, &[], &[], 64), None);
    }

    #[test]
    fn deferred_checksums_are_not_verified_but_the_ip_header_still_is() {
        let (mut frames, _) = stream(&[1000; 4], 0);
        // What a tunnel sender that deferred them leaves in the field: anything.
        for f in &mut frames {
            f[14 + 20 + 16..14 + 20 + 18].copy_from_slice(&[0xde, 0xad]);
        }
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        assert_eq!(
            find_run(Framing::Ethernet, &refs, &[], 64),
            None,
            "not deferred: checked, wrong"
        );
        assert_eq!(
            find_run(Framing::Ethernet, &refs, &[true; 4], 64)
                .unwrap()
                .count,
            4
        );
        assert_eq!(
            find_run(Framing::Ethernet, &refs, &[true, true, false, true], 64)
                .unwrap()
                .count,
            2,
            "the run stops before the one that was not deferred"
        );
        // Merged and cut again, every segment has its right checksum back.
        let run = find_run(Framing::Ethernet, &refs, &[true; 4], 64).unwrap();
        for cut in merged_then_cut(&frames, &run) {
            assert!(checksums_ok(&cut[14..]));
        }
        // A damaged IP header is never merged, deferred or not.
        let mut bad = frames.clone();
        bad[1][14 + 4] ^= 1; // the IP ID (runs do not compare it), header checksum as it was
        let refs: Vec<&[u8]> = bad.iter().map(Vec::as_slice).collect();
        assert_eq!(find_run(Framing::Ethernet, &refs, &[true; 4], 64), None);
    }

    #[test]
    fn runs_stop_at_the_count_and_below_64_kib() {
        let (frames, _) = stream(&[1448; 60], 0);
        assert_eq!(
            run_of(&frames).unwrap().count,
            45,
            "45 * 1448 + 52 fits, 46 would not"
        );
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        assert_eq!(find_run(Framing::Ethernet, &refs, &[], 7).unwrap().count, 7);
    }

    /// [`seg`] carried over IPv6 (no extension headers, hop limit 63), checksums right.
    fn seg6(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let v4 = seg(seq, flags, payload);
        let l4 = &v4[14 + 20..];
        let mut f = v4[..14].to_vec();
        f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&u16::try_from(l4.len()).unwrap().to_be_bytes());
        f.extend_from_slice(&[PROTO_TCP, 63]);
        f.extend_from_slice(&"fd7a:0:1:100::10".parse::<Ipv6Addr>().unwrap().octets());
        f.extend_from_slice(&"fd7a:0:1:200::20".parse::<Ipv6Addr>().unwrap().octets());
        f.extend_from_slice(l4);
        restore_headers(Framing::Ethernet, &mut f, GsoKind::Tcp, flags);
        f
    }

    /// IPv6 TCP makes runs as IPv4 does, which cut back into the very frames and restore to
    /// them; a segment behind an extension header, or of the other family, joins none.
    #[test]
    fn ipv6_segments_make_runs_that_cut_back_into_themselves() {
        let frames: Vec<Vec<u8>> = (0..10u32)
            .map(|i| {
                let flags = if i == 9 { ACK | TCP_PSH } else { ACK };
                seg6(i * 1400, flags, &[u8::try_from(i).unwrap(); 1400])
            })
            .collect();
        for f in &frames {
            let t = pnet_packet::tcp::TcpPacket::new(&f[14 + 40..]).unwrap();
            let (src, dst) = addresses6(&f[14..]);
            assert_eq!(
                pnet_packet::tcp::ipv6_checksum(&t, &src, &dst),
                t.get_checksum()
            );
        }
        let run = run_of(&frames).unwrap();
        assert_eq!(
            (run.count, run.ip_header, run.headers, run.payload),
            (10, 40, 14 + 40 + 32, 14_000)
        );
        let cut = merged_then_cut(&frames, &run);
        assert_eq!(cut, frames);
        let mut first = frames[0].clone();
        merge_headers(&mut first, &run, tcp_flags(Framing::Ethernet, &frames[9]));
        assert_eq!(u16::from_be_bytes([first[18], first[19]]), 32 + 14_000);
        restore_headers(Framing::Ethernet, &mut first, GsoKind::Tcp, ACK);
        assert_eq!(first, frames[0]);
        // Another hop limit, an extension header in front of TCP, an IPv4 segment: the run
        // stops before them.
        let mut hop = frames.clone();
        hop[3][14 + 7] = 62;
        assert_eq!(run_of(&hop).unwrap().count, 3);
        let mut ext = frames.clone();
        ext[2][14 + 6] = 60;
        assert_eq!(run_of(&ext).unwrap().count, 2);
        let mut mixed = frames[..2].to_vec();
        mixed.insert(1, seg(1400, ACK, &[1; 1400]));
        assert_eq!(run_of(&mixed), None);
    }

    #[test]
    fn restore_gives_back_the_frame_as_it_was() {
        let (frames, _) = stream(&[800, 800, 800], TCP_PSH);
        let run = run_of(&frames).unwrap();
        let mut first = frames[0].clone();
        let flags = tcp_flags(Framing::Ethernet, &first);
        merge_headers(&mut first, &run, tcp_flags(Framing::Ethernet, &frames[2]));
        assert_ne!(first, frames[0]);
        restore_headers(Framing::Ethernet, &mut first, GsoKind::Tcp, flags);
        assert_eq!(first, frames[0]);
    }

    /// A wire frame of one UDP datagram with a valid checksum.
    fn datagram(sport: u16, payload: &[u8]) -> Vec<u8> {
        let total = 20 + 8 + payload.len();
        let mut f = seg(0, ACK, &[]);
        f.truncate(14 + 20);
        f.resize(14 + total, 0);
        let ip = &mut f[14..];
        ip[2..4].copy_from_slice(&u16::try_from(total).unwrap().to_be_bytes());
        ip[9] = PROTO_UDP;
        ipv4::fill_header_checksum(ip, 20);
        let u = &mut ip[20..];
        u[0..2].copy_from_slice(&sport.to_be_bytes());
        u[2..4].copy_from_slice(&5001u16.to_be_bytes());
        u[4..6].copy_from_slice(&u16::try_from(8 + payload.len()).unwrap().to_be_bytes());
        u[8..].copy_from_slice(payload);
        restore_headers(Framing::Ethernet, &mut f, GsoKind::Udp, 0);
        f
    }

    fn datagrams(sizes: &[usize]) -> Vec<Vec<u8>> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let payload: Vec<u8> = (0..n).map(|k| (i * 31 + k).to_le_bytes()[0]).collect();
                datagram(7000, &payload)
            })
            .collect()
    }

    #[test]
    fn udp_datagrams_of_one_size_are_one_run_that_cuts_back_into_itself() {
        let frames = datagrams(&[1300, 1300, 1300, 1300, 777]);
        let run = run_of(&frames).unwrap();
        assert_eq!(
            (
                run.kind,
                run.count,
                run.segment_size,
                run.payload,
                run.headers
            ),
            (GsoKind::Udp, 5, 1300, 4 * 1300 + 777, 14 + 20 + 8)
        );
        let cut = merged_then_cut(&frames, &run);
        assert_eq!(cut.len(), 5);
        for (a, b) in cut.iter().zip(&frames) {
            assert!(checksums_ok(&a[14..]));
            assert!(a[..18] == b[..18] && a[20..24] == b[20..24] && a[26..] == b[26..]);
        }
        let mut first = frames[0].clone();
        merge_headers(&mut first, &run, 0);
        restore_headers(Framing::Ethernet, &mut first, GsoKind::Udp, 0);
        assert_eq!(first, frames[0]);
    }

    #[test]
    fn udp_datagrams_that_differ_are_not_merged() {
        let base = datagrams(&[500, 500, 500]);
        let mut v = base.clone();
        v[1] = datagram(7001, &[1; 500]);
        assert_eq!(run_of(&v), None, "another flow");
        let v = datagrams(&[500, 600]);
        assert_eq!(run_of(&v), None, "a larger second datagram");
        let mut v = base.clone();
        v[0][14 + 26..14 + 28].fill(0); // no checksum
        assert_eq!(run_of(&v), None);
        let mut v = base.clone();
        let last = v[1].len() - 1;
        v[1][last] ^= 1;
        assert_eq!(run_of(&v), None, "a damaged second datagram");
        let mut v = base.clone();
        v.insert(1, seg(0, ACK, &[0; 500]));
        assert_eq!(run_of(&v), None, "TCP between them");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        /// Whatever a peer sends: damage any bytes of a run (headers mostly), cut frames short,
        /// make the checksums right again or not, defer some of them (any value in the field).
        /// Nothing panics, and whatever run is still found merges and cuts back into exactly
        /// its frames (bar the IP ID), with valid checksums: coalescing never changes what a
        /// device receives, and a deferred checksum arrives computed.
        #[test]
        fn any_run_found_in_damaged_frames_cuts_back_into_them(
            udp in proptest::bool::ANY,
            sizes in proptest::collection::vec(1usize..1500, 1..12),
            edits in proptest::collection::vec(
                (0usize..12, 0usize..80, proptest::num::u8::ANY, proptest::bool::ANY), 0..4),
            cut in proptest::option::of((0usize..12, 0usize..1600)),
            refixed in proptest::bool::ANY,
            deferred in proptest::collection::vec(proptest::bool::ANY, 12),
            spoil in proptest::num::u16::ANY,
        ) {
            let mut frames = if udp { datagrams(&sizes) } else { stream(&sizes, 0).0 };
            let n = frames.len();
            for (i, at, value, deep) in edits {
                let f = &mut frames[i % n];
                // Headers mostly; sometimes anywhere in the frame.
                let at = if deep { at * 19 } else { at } % f.len();
                f[at] = value;
            }
            if let Some((i, len)) = cut {
                frames[i % n].truncate(len);
            }
            if refixed {
                for f in &mut frames {
                    if parse(Framing::Ethernet, f).is_some() {
                        let kind = if f[14 + 9] == PROTO_UDP { GsoKind::Udp } else { GsoKind::Tcp };
                        ipv4::fill_header_checksum(&mut f[14..], 20);
                        let flags = tcp_flags(Framing::Ethernet, f);
                        restore_headers(Framing::Ethernet, f, kind, flags);
                    }
                }
            }
            // What the devices must get: a deferred frame with its checksum computed. What
            // comes out of the tunnel: anything in that field.
            let mut truth = frames.clone();
            for (i, f) in frames.iter_mut().enumerate() {
                if deferred[i] && parse(Framing::Ethernet, f).is_some() {
                    let udp = f[14 + 9] == PROTO_UDP;
                    let kind = if udp { GsoKind::Udp } else { GsoKind::Tcp };
                    let flags = tcp_flags(Framing::Ethernet, f);
                    restore_headers(Framing::Ethernet, &mut truth[i], kind, flags);
                    if let Some(at) = checksum::field(f[14 + 9]) {
                        f[14 + 20 + at..][..2].copy_from_slice(&spoil.to_be_bytes());
                    }
                }
            }
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            for start in 0..n {
                let _ = tcp_flags(Framing::Ethernet, refs[start]);
                let Some(run) = find_run(Framing::Ethernet, &refs[start..], &deferred[start..n], 64) else { continue };
                let cut = merged_then_cut(&frames[start..], &run);
                proptest::prop_assert_eq!(cut.len(), run.count);
                for (a, b) in cut.iter().zip(&truth[start..]) {
                    proptest::prop_assert!(checksums_ok(&a[14..]));
                    proptest::prop_assert!(
                        a.len() == b.len()
                            && a[..18] == b[..18]
                            && a[20..24] == b[20..24]
                            && a[26..] == b[26..]
                    );
                }
                let mut first = frames[start].clone();
                merge_headers(&mut first, &run, tcp_flags(Framing::Ethernet, &frames[start + run.count - 1]));
                restore_headers(Framing::Ethernet, &mut first, run.kind, tcp_flags(Framing::Ethernet, &frames[start]));
                proptest::prop_assert_eq!(&first, &truth[start]);
            }
        }
    }
}

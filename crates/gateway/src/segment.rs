//! Segmentation of coalesced frames (the software half of GRO, undone).
//!
//! With GRO on, the kernel merges consecutive TCP segments (and, where asked, UDP datagrams)
//! of one flow into one large packet before the capture socket sees it, and says how it was
//! built (`PACKET_VNET_HDR`: the segment size). Receiving one 64 KiB frame instead of 45
//! wire-sized ones saves a system call and a copy per segment. But the tunnel carries packets
//! no larger than its inner MTU and the peer must receive exactly what the sender sent, so each
//! coalesced frame is cut back into the segments it came from, as the kernel's own GSO would
//! cut it for a NIC:
//!
//! - TCP, over IPv4 or IPv6: every segment gets the headers (IP options and TCP options
//!   included), its own IP total length and ID (incremented per segment; IPv6: its payload
//!   length), sequence number advanced by the payload
//!   before it; FIN and PSH only on the last segment, CWR only on the first (RFC 3168 §6.1.2,
//!   as Linux's `tcp_gso_segment`); full IP and TCP checksums.
//! - UDP (`UDP_L4`, UDP GSO/GRO): every datagram gets the headers, its own IP total length and
//!   ID, UDP length and checksum.
//!
//! Asked to (`with_partial_checksums`), the segmenter leaves the TCP or UDP checksum partial
//! (the pseudo-header sum, as GSO leaves it for a NIC), for the tunnel's far end to compute:
//! the IP header checksum is always whole.
//!
//! Segments are written as whole Ethernet frames into the caller's buffers, one at a time and
//! in order, so the rest of the LAN path (anti-spoofing, TTL, MSS clamping) treats them exactly
//! like frames that arrived separately.

use crate::ipv4::{self, Header, PROTO_TCP, PROTO_UDP};
use crate::lan6::Header6;
use crate::{ETH_HEADER_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6, checksum};

/// The fixed IPv6 header, the only one a coalesced IPv6 packet may have (GRO merges no
/// packets with extension headers).
const IPV6_HEADER_LEN: usize = 40;

/// The IP header of a coalesced packet, of either version.
#[derive(Debug, Clone, Copy)]
enum Ip {
    V4(Header),
    V6(Header6),
}

impl Ip {
    const fn header_len(&self) -> usize {
        match self {
            Self::V4(h) => h.header_len,
            Self::V6(_) => IPV6_HEADER_LEN,
        }
    }

    const fn total_len(&self) -> usize {
        match self {
            Self::V4(h) => h.total_len,
            Self::V6(h) => h.total_len,
        }
    }

    const fn proto(&self) -> u8 {
        match self {
            Self::V4(h) => h.proto,
            Self::V6(h) => h.next,
        }
    }
}

const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;
const UDP_HEADER_LEN: usize = 8;

/// How the kernel coalesced a frame (from its `virtio_net_hdr`); the packet says which IP
/// version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GsoKind {
    /// TCP (`VIRTIO_NET_HDR_GSO_TCPV4` or `_TCPV6`, with or without the ECN bit).
    Tcp,
    /// UDP datagrams (`VIRTIO_NET_HDR_GSO_UDP_L4`).
    Udp,
}

/// Why a coalesced frame cannot be segmented. The frame is dropped and counted; nothing of it
/// is forwarded half-done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    /// Not an untagged IPv4 or IPv6 frame.
    #[error("not an IP frame")]
    NotIpv4,
    /// Lengths that do not add up, a wrong IP header checksum, a fragment, or a transport
    /// header that does not match the kind the kernel announced.
    #[error("malformed coalesced frame")]
    Malformed,
    /// A segment size of zero.
    #[error("segment size 0")]
    ZeroSize,
    /// One segment would not fit the caller's buffers.
    #[error("segments larger than the buffers")]
    TooLarge,
}

/// Cuts one coalesced Ethernet frame back into its segments, one at a time into the caller's
/// buffers (see the module documentation for what each segment carries).
#[derive(Debug)]
pub struct Segmenter<'a> {
    frame: &'a [u8],
    /// Link header bytes in front of the IP packet (Ethernet's, or none).
    link: usize,
    h: Ip,
    kind: GsoKind,
    /// Link, IP and transport headers: copied in front of every segment.
    headers: usize,
    /// Payload bytes per segment (the last may have fewer).
    size: usize,
    /// Payload bytes in all.
    payload: usize,
    /// Payload bytes already emitted.
    done: usize,
    /// Segments already emitted.
    index: u16,
    /// Leave transport checksums partial (see [`Segmenter::with_partial_checksums`]).
    partial: bool,
}

impl<'a> Segmenter<'a> {
    /// Prepares to cut `frame` (Ethernet header included), coalesced as `kind` with `size`
    /// payload bytes per segment, into frames of at most `max_frame` bytes.
    ///
    /// # Errors
    /// [`SegmentError`] when the frame is not what the kernel said it is, or a segment would
    /// be larger than `max_frame`.
    pub fn new(
        frame: &'a [u8],
        kind: GsoKind,
        size: u16,
        max_frame: usize,
    ) -> Result<Self, SegmentError> {
        let ethertype = frame.get(12..14).map(|t| u16::from_be_bytes([t[0], t[1]]));
        let version = frame.get(ETH_HEADER_LEN).map(|b| b >> 4);
        match (ethertype, version) {
            (Some(ETHERTYPE_IPV4), _) => {}
            (Some(ETHERTYPE_IPV6), Some(6)) => {}
            (Some(ETHERTYPE_IPV6), _) => return Err(SegmentError::Malformed),
            _ => return Err(SegmentError::NotIpv4),
        }
        Self::after(frame, ETH_HEADER_LEN, kind, size, max_frame)
    }

    /// [`Segmenter::new`] for an IP packet without a link header (a TUN device's super-packet):
    /// the segments are IP packets of at most `max_packet` bytes.
    ///
    /// # Errors
    /// As [`Segmenter::new`].
    pub fn ip(
        packet: &'a [u8],
        kind: GsoKind,
        size: u16,
        max_packet: usize,
    ) -> Result<Self, SegmentError> {
        Self::after(packet, 0, kind, size, max_packet)
    }

    /// Prepares to cut `frame`, whose IP packet starts after `link` bytes of link header.
    fn after(
        frame: &'a [u8],
        link: usize,
        kind: GsoKind,
        size: u16,
        max_frame: usize,
    ) -> Result<Self, SegmentError> {
        let ip = &frame[link..];
        let h = match ip.first().map(|b| b >> 4) {
            Some(6) => Ip::V6(Header6::parse(ip, true).ok_or(SegmentError::Malformed)?),
            _ => {
                let h = Header::parse(ip, true).map_err(|e| match e {
                    ipv4::Invalid::NotIpv4 => SegmentError::NotIpv4,
                    ipv4::Invalid::Malformed => SegmentError::Malformed,
                })?;
                if h.is_fragment() {
                    return Err(SegmentError::Malformed);
                }
                Ip::V4(h)
            }
        };
        let l4 = &ip[h.header_len()..h.total_len()];
        let l4_header = match (kind, h.proto()) {
            (GsoKind::Tcp, PROTO_TCP) if l4.len() >= 20 => {
                let offset = usize::from(l4[12] >> 4) * 4;
                if offset < 20 || offset > l4.len() {
                    return Err(SegmentError::Malformed);
                }
                offset
            }
            (GsoKind::Udp, PROTO_UDP)
                if l4.len() >= UDP_HEADER_LEN
                    && usize::from(u16::from_be_bytes([l4[4], l4[5]])) == l4.len() =>
            {
                UDP_HEADER_LEN
            }
            _ => return Err(SegmentError::Malformed),
        };
        if size == 0 {
            return Err(SegmentError::ZeroSize);
        }
        let headers = link + h.header_len() + l4_header;
        let size = usize::from(size);
        if headers + size > max_frame {
            return Err(SegmentError::TooLarge);
        }
        Ok(Self {
            frame: &frame[..link + h.total_len()],
            link,
            h,
            kind,
            headers,
            size,
            payload: l4.len() - l4_header,
            done: 0,
            index: 0,
            partial: false,
        })
    }

    /// With `partial`, leaves each segment's TCP or UDP checksum partial instead of computing
    /// it: the field holds the pseudo-header sum, as the kernel's own GSO leaves it for a device
    /// that offloads checksums (`CHECKSUM_PARTIAL`), and whoever sends the segment on completes
    /// it. Saves a pass over every payload when the checksum is computed later anyway, or not
    /// at all (the tunnel's deferred checksums, docs/protocol.md §1).
    #[must_use]
    pub const fn with_partial_checksums(mut self, partial: bool) -> Self {
        self.partial = partial;
        self
    }

    /// How many segments the frame makes (at least one: a coalesced frame without payload is
    /// passed on as it is).
    pub fn count(&self) -> usize {
        self.payload.div_ceil(self.size).max(1)
    }

    /// Writes the next segment, a whole Ethernet frame, into `out` and returns its length;
    /// `None` when all have been written. `out` must hold `max_frame` bytes.
    pub fn next_into(&mut self, out: &mut [u8]) -> Option<usize> {
        if self.index > 0 && self.done >= self.payload {
            return None;
        }
        let chunk = (self.payload - self.done).min(self.size);
        let len = self.headers + chunk;
        let out = out.get_mut(..len)?;
        let first = self.done == 0;
        let last = self.done + chunk == self.payload;
        out[..self.headers].copy_from_slice(&self.frame[..self.headers]);
        let from = self.headers + self.done;
        out[self.headers..].copy_from_slice(&self.frame[from..from + chunk]);

        let ip_len = len - self.link;
        let ip = &mut out[self.link..];
        // Lengths fit: the segment is shorter than the coalesced packet, whose length was a u16.
        match self.h {
            Ip::V4(h) => {
                let total = u16::try_from(ip_len).unwrap_or(u16::MAX);
                ip[2..4].copy_from_slice(&total.to_be_bytes());
                let id = h.id.wrapping_add(self.index);
                ip[4..6].copy_from_slice(&id.to_be_bytes());
                ipv4::fill_header_checksum(ip, h.header_len);
            }
            Ip::V6(_) => {
                let payload = u16::try_from(ip_len - IPV6_HEADER_LEN).unwrap_or(u16::MAX);
                ip[4..6].copy_from_slice(&payload.to_be_bytes());
            }
        }

        let l4 = &mut ip[self.h.header_len()..];
        match self.kind {
            GsoKind::Tcp => {
                let seq = u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]);
                // Sequence numbers wrap modulo 2^32; `done` is below 64 KiB.
                let advance = u32::try_from(self.done).unwrap_or(0);
                l4[4..8].copy_from_slice(&seq.wrapping_add(advance).to_be_bytes());
                if !last {
                    l4[13] &= !(TCP_FIN | TCP_PSH);
                }
                if !first {
                    l4[13] &= !TCP_CWR;
                }
            }
            GsoKind::Udp => {
                let udp_len = u16::try_from(UDP_HEADER_LEN + chunk).unwrap_or(u16::MAX);
                l4[4..6].copy_from_slice(&udp_len.to_be_bytes());
            }
        }
        match (self.h, self.partial) {
            (Ip::V4(h), true) => checksum::fill_pseudo_header(l4, h.src, h.dst, h.proto),
            (Ip::V4(h), false) => checksum::fill_transport(l4, h.src, h.dst, h.proto),
            (Ip::V6(h), true) => checksum::fill_pseudo_header6(l4, h.src, h.dst, h.next),
            (Ip::V6(h), false) => checksum::fill_transport6(l4, h.src, h.dst, h.next),
        }

        self.done += chunk;
        self.index = self.index.wrapping_add(1);
        Some(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::checksums_ok;
    use proptest::prelude::*;

    const MAX: usize = 2048;
    const ACK: u8 = 0x10;

    /// A coalesced TCP/IPv4 frame as GRO hands it over: `ip_options` and `tcp_options` bytes
    /// (multiples of 4), `flags`, `payload`; checksums of the big packet are left wrong (as
    /// with CHECKSUM_PARTIAL), except the IP header's, which GRO keeps valid.
    fn tcp_frame(ip_options: &[u8], tcp_options: &[u8], flags: u8, payload: &[u8]) -> Vec<u8> {
        let ihl = 20 + ip_options.len();
        let doff = 20 + tcp_options.len();
        let total = ihl + doff + payload.len();
        let mut f = vec![0u8; ETH_HEADER_LEN + total];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let ip = &mut f[ETH_HEADER_LEN..];
        ip[0] = 0x40 | u8::try_from(ihl / 4).unwrap();
        ip[2..4].copy_from_slice(&u16::try_from(total).unwrap().to_be_bytes());
        ip[4..6].copy_from_slice(&0xfffeu16.to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = PROTO_TCP;
        ip[12..16].copy_from_slice(&[100, 64, 1, 10]);
        ip[16..20].copy_from_slice(&[100, 64, 2, 20]);
        ip[20..ihl].copy_from_slice(ip_options);
        ipv4::fill_header_checksum(ip, ihl);
        let t = &mut ip[ihl..];
        t[0..2].copy_from_slice(&40000u16.to_be_bytes());
        t[2..4].copy_from_slice(&5201u16.to_be_bytes());
        t[4..8].copy_from_slice(&0xffff_f000u32.to_be_bytes()); // wraps within the frame
        t[8..12].copy_from_slice(&77u32.to_be_bytes());
        t[12] = u8::try_from(doff / 4).unwrap() << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&501u16.to_be_bytes());
        t[16..18].copy_from_slice(&0xdeadu16.to_be_bytes()); // a partial sum, not the checksum
        t[20..doff].copy_from_slice(tcp_options);
        t[doff..].copy_from_slice(payload);
        f
    }

    fn udp_frame(payload: &[u8]) -> Vec<u8> {
        let total = 20 + UDP_HEADER_LEN + payload.len();
        let mut f = tcp_frame(&[], &[], 0, &[]);
        f.truncate(ETH_HEADER_LEN + 20);
        f.resize(ETH_HEADER_LEN + total, 0);
        let ip = &mut f[ETH_HEADER_LEN..];
        ip[2..4].copy_from_slice(&u16::try_from(total).unwrap().to_be_bytes());
        ip[9] = PROTO_UDP;
        ipv4::fill_header_checksum(ip, 20);
        let u = &mut ip[20..];
        u[0..2].copy_from_slice(&5000u16.to_be_bytes());
        u[2..4].copy_from_slice(&5001u16.to_be_bytes());
        u[4..6].copy_from_slice(&u16::try_from(8 + payload.len()).unwrap().to_be_bytes());
        u[8..].copy_from_slice(payload);
        f
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i * 7 + i / 251).to_le_bytes()[0])
            .collect()
    }

    fn all(frame: &[u8], kind: GsoKind, size: u16) -> Vec<Vec<u8>> {
        let mut s = Segmenter::new(frame, kind, size, MAX).unwrap();
        let expected = s.count();
        let mut out = Vec::new();
        let mut buf = [0u8; MAX];
        while let Some(len) = s.next_into(&mut buf) {
            out.push(buf[..len].to_vec());
        }
        assert_eq!(out.len(), expected, "count() agrees with what came out");
        out
    }

    /// A coalesced TCP/IPv6 frame (GSO_TCPV6) is cut like an IPv4 one: each segment with its
    /// own payload length, sequence number and whole checksum (pnet's count), FIN and PSH on
    /// the last only; or the checksum left partial, as asked.
    #[test]
    fn tcp_over_ipv6_is_cut_into_its_segments() {
        use pnet_packet::ip::IpNextHeaderProtocols;
        let src: std::net::Ipv6Addr = "fd7a:0:1:100::10".parse().unwrap();
        let dst: std::net::Ipv6Addr = "fd7a:0:1:200::20".parse().unwrap();
        let data = pattern(2500);
        let mut f = vec![0u8; ETH_HEADER_LEN + 40 + 20];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        let ip = &mut f[ETH_HEADER_LEN..];
        ip[0] = 0x60;
        ip[4..6].copy_from_slice(&u16::try_from(20 + data.len()).unwrap().to_be_bytes());
        ip[6] = PROTO_TCP;
        ip[7] = 64;
        ip[8..24].copy_from_slice(&src.octets());
        ip[24..40].copy_from_slice(&dst.octets());
        let t = &mut ip[40..];
        t[4..8].copy_from_slice(&0xffff_fc00u32.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = ACK | TCP_PSH | TCP_FIN;
        f.extend_from_slice(&data);
        let segments = all(&f, GsoKind::Tcp, 1000);
        assert_eq!(segments.len(), 3);
        let mut seq = 0xffff_fc00u32;
        let mut got = Vec::new();
        for (i, seg) in segments.iter().enumerate() {
            let ip = &seg[ETH_HEADER_LEN..];
            let payload = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            assert_eq!(payload + 40, ip.len());
            let tcp = &ip[40..];
            assert_eq!(u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]), seq);
            let want = pnet_packet::util::ipv6_checksum(
                tcp,
                8,
                &[],
                &src,
                &dst,
                IpNextHeaderProtocols::Tcp,
            );
            assert_eq!(u16::from_be_bytes([tcp[16], tcp[17]]), want, "segment {i}");
            let last = i == segments.len() - 1;
            assert_eq!(tcp[13] & (TCP_PSH | TCP_FIN) != 0, last);
            got.extend_from_slice(&tcp[20..]);
            seq = seq.wrapping_add(u32::try_from(tcp.len() - 20).unwrap());
        }
        assert_eq!(got, data);
        // Partial: the field holds the pseudo-header sum, which completes to the checksum.
        let mut s = Segmenter::new(&f, GsoKind::Tcp, 1000, MAX)
            .unwrap()
            .with_partial_checksums(true);
        let mut buf = [0u8; MAX];
        let len = s.next_into(&mut buf).unwrap();
        let tcp = &mut buf[ETH_HEADER_LEN + 40..len];
        // As a NIC completes it: the sum over the segment, the field holding the pseudo sum.
        let sum = checksum::internet(tcp);
        tcp[16..18].copy_from_slice(&sum.to_be_bytes());
        let want =
            pnet_packet::util::ipv6_checksum(tcp, 8, &[], &src, &dst, IpNextHeaderProtocols::Tcp);
        assert_eq!(u16::from_be_bytes([tcp[16], tcp[17]]), want);
    }

    /// A TUN device's super-packet (no link header) is cut exactly like the same packet in an
    /// Ethernet frame: the same IP packets, partial checksums or whole.
    #[test]
    fn ip_packets_are_cut_like_frames() {
        for (frame, kind, size) in [
            (
                tcp_frame(
                    &[],
                    &[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2],
                    ACK,
                    &pattern(5000),
                ),
                GsoKind::Tcp,
                1380,
            ),
            (udp_frame(&pattern(3000)), GsoKind::Udp, 1200),
        ] {
            for partial in [false, true] {
                let framed = {
                    let mut s = Segmenter::new(&frame, kind, size, MAX)
                        .unwrap()
                        .with_partial_checksums(partial);
                    let mut out = Vec::new();
                    let mut buf = [0u8; MAX];
                    while let Some(len) = s.next_into(&mut buf) {
                        out.push(buf[ETH_HEADER_LEN..len].to_vec());
                    }
                    out
                };
                let mut s =
                    Segmenter::ip(&frame[ETH_HEADER_LEN..], kind, size, MAX - ETH_HEADER_LEN)
                        .unwrap()
                        .with_partial_checksums(partial);
                assert_eq!(s.count(), framed.len());
                let mut buf = [0u8; MAX];
                let mut bare = Vec::new();
                while let Some(len) = s.next_into(&mut buf) {
                    bare.push(buf[..len].to_vec());
                }
                assert_eq!(bare, framed, "{kind:?}, partial {partial}");
                assert!(framed.len() > 2);
                if !partial {
                    assert!(bare.iter().all(|p| checksums_ok(p)));
                }
            }
        }
        // Too large a segment for the caller's packets, and not IPv4, are refused.
        let frame = udp_frame(&pattern(3000));
        assert_eq!(
            Segmenter::ip(&frame[ETH_HEADER_LEN..], GsoKind::Udp, 1200, 1200).err(),
            Some(SegmentError::TooLarge)
        );
        let mut v6 = frame[ETH_HEADER_LEN..].to_vec();
        v6[0] = 0x60;
        assert_eq!(
            Segmenter::ip(&v6, GsoKind::Udp, 1200, MAX).err(),
            Some(SegmentError::Malformed),
            "an IPv4 packet under an IPv6 version"
        );
        let mut v5 = frame[ETH_HEADER_LEN..].to_vec();
        v5[0] = 0x55;
        assert_eq!(
            Segmenter::ip(&v5, GsoKind::Udp, 1200, MAX).err(),
            Some(SegmentError::NotIpv4)
        );
    }

    /// Checks every segment of a TCP frame and returns their payloads joined.
    fn check_tcp(frame: &[u8], segs: &[Vec<u8>], size: usize) -> Vec<u8> {
        let ihl = usize::from(frame[ETH_HEADER_LEN] & 0x0f) * 4;
        let doff = usize::from(frame[ETH_HEADER_LEN + ihl + 12] >> 4) * 4;
        let headers = ETH_HEADER_LEN + ihl + doff;
        let seq0 = u32::from_be_bytes(
            frame[headers - doff + 4..headers - doff + 8]
                .try_into()
                .unwrap(),
        );
        let flags0 = frame[headers - doff + 13];
        let mut joined = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            let ip = &s[ETH_HEADER_LEN..];
            assert_eq!(
                s[..ETH_HEADER_LEN],
                frame[..ETH_HEADER_LEN],
                "Ethernet header"
            );
            assert_eq!(
                ip[20..ihl],
                frame[ETH_HEADER_LEN + 20..ETH_HEADER_LEN + ihl],
                "IP options"
            );
            assert_eq!(
                usize::from(u16::from_be_bytes([ip[2], ip[3]])),
                ip.len(),
                "total length"
            );
            assert_eq!(
                u16::from_be_bytes([ip[4], ip[5]]),
                0xfffeu16.wrapping_add(u16::try_from(i).unwrap()),
                "IP ID counts up"
            );
            assert!(checksums_ok(ip), "segment {i}: IP and TCP checksums");
            let t = &ip[ihl..];
            assert_eq!(
                t[20..doff],
                frame[headers - doff + 20..headers],
                "TCP options"
            );
            let seq = u32::from_be_bytes(t[4..8].try_into().unwrap());
            assert_eq!(
                seq,
                seq0.wrapping_add(u32::try_from(joined.len()).unwrap()),
                "sequence"
            );
            let payload = &t[doff..];
            let last = i + 1 == segs.len();
            if !last {
                assert_eq!(payload.len(), size, "all but the last are full");
            }
            assert!(payload.len() <= size && (!payload.is_empty() || segs.len() == 1));
            let mut want = flags0;
            if !last {
                want &= !(TCP_FIN | TCP_PSH);
            }
            if i > 0 {
                want &= !TCP_CWR;
            }
            assert_eq!(t[13], want, "segment {i} of {}: flags", segs.len());
            joined.extend_from_slice(payload);
        }
        joined
    }

    #[test]
    fn tcp_with_timestamps_is_cut_at_the_segment_size() {
        let data = pattern(64_000 - 52);
        let frame = tcp_frame(
            &[],
            &[1, 1, 8, 10, 0, 0, 1, 2, 0, 0, 3, 4],
            ACK | TCP_PSH,
            &data,
        );
        let segs = all(&frame, GsoKind::Tcp, 1448);
        assert_eq!(segs.len(), data.len().div_ceil(1448));
        assert_eq!(
            segs[0].len(),
            14 + 20 + 32 + 1448,
            "a wire-sized 1514-byte frame"
        );
        assert_eq!(check_tcp(&frame, &segs, 1448), data);
    }

    #[test]
    fn boundaries_of_the_last_segment() {
        for (len, count) in [
            (1, 1),
            (99, 1),
            (100, 1),
            (101, 2),
            (200, 2),
            (201, 3),
            (1000, 10),
        ] {
            let data = pattern(len);
            let frame = tcp_frame(&[], &[], ACK | TCP_FIN | TCP_PSH | TCP_CWR, &data);
            let segs = all(&frame, GsoKind::Tcp, 100);
            assert_eq!(segs.len(), count, "{len} bytes in 100-byte segments");
            assert_eq!(check_tcp(&frame, &segs, 100), data, "{len}");
        }
    }

    #[test]
    fn odd_segment_sizes_and_odd_lengths_keep_checksums_right() {
        for size in [1u16, 3, 537, 1001, 1459] {
            let data = pattern(5_001);
            let frame = tcp_frame(&[], &[1, 1, 1, 0], ACK, &data);
            let segs = all(&frame, GsoKind::Tcp, size);
            assert_eq!(
                check_tcp(&frame, &segs, usize::from(size)),
                data,
                "size {size}"
            );
        }
    }

    #[test]
    fn partial_checksums_hold_the_pseudo_header_sum_and_complete_to_the_full_ones() {
        for (kind, frame) in [
            (
                GsoKind::Tcp,
                tcp_frame(&[], &[1, 1, 1, 0], ACK | TCP_PSH, &pattern(4_001)),
            ),
            (GsoKind::Udp, udp_frame(&pattern(4_001))),
        ] {
            let full = all(&frame, kind, 1001);
            let mut s = Segmenter::new(&frame, kind, 1001, MAX)
                .unwrap()
                .with_partial_checksums(true);
            let mut buf = [0u8; MAX];
            let mut n = 0;
            while let Some(len) = s.next_into(&mut buf) {
                let ip = &mut buf[ETH_HEADER_LEN..len];
                let h = Header::parse(ip, true).unwrap();
                let at = h.header_len + checksum::field(h.proto).unwrap();
                let pseudo =
                    checksum::pseudo_header(h.src, h.dst, h.proto, h.total_len - h.header_len);
                assert_eq!(
                    u16::from_be_bytes([ip[at], ip[at + 1]]),
                    pseudo,
                    "{kind:?} {n}"
                );
                assert!(crate::complete_deferred_checksum(ip));
                assert_eq!(buf[..len], full[n][..], "{kind:?} segment {n}");
                n += 1;
            }
            assert_eq!(n, full.len());
        }
    }

    #[test]
    fn ip_options_are_copied_into_every_segment() {
        // Router alert (RFC 2113, copied) and a NOP-padded record-route-like option: 12 bytes.
        let options = [0x94, 4, 0, 0, 7, 7, 4, 0, 0, 0, 0, 1];
        let data = pattern(3_000);
        let frame = tcp_frame(&options, &[], ACK, &data);
        let segs = all(&frame, GsoKind::Tcp, 1400);
        assert_eq!(segs.len(), 3);
        assert!(
            segs.iter().all(|s| s[ETH_HEADER_LEN] == 0x48),
            "IHL 8 everywhere"
        );
        assert_eq!(check_tcp(&frame, &segs, 1400), data);
    }

    #[test]
    fn a_frame_without_payload_passes_as_one_segment() {
        let frame = tcp_frame(&[], &[], ACK | TCP_FIN, &[]);
        let segs = all(&frame, GsoKind::Tcp, 1448);
        assert_eq!(segs.len(), 1);
        assert!(checksums_ok(&segs[0][ETH_HEADER_LEN..]));
        assert_eq!(segs[0][ETH_HEADER_LEN + 33], ACK | TCP_FIN);
    }

    #[test]
    fn udp_datagrams_get_their_own_lengths_and_checksums() {
        let data = pattern(10 * 1200 + 7);
        let frame = udp_frame(&data);
        let segs = all(&frame, GsoKind::Udp, 1200);
        assert_eq!(segs.len(), 11);
        let mut joined = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            let ip = &s[ETH_HEADER_LEN..];
            assert!(checksums_ok(ip), "datagram {i}");
            let u = &ip[20..];
            assert_eq!(usize::from(u16::from_be_bytes([u[4], u[5]])), u.len());
            assert_eq!(u.len() - 8, if i < 10 { 1200 } else { 7 });
            joined.extend_from_slice(&u[8..]);
        }
        assert_eq!(joined, data);
    }

    #[test]
    fn frames_that_are_not_what_the_kernel_said_are_refused() {
        let data = pattern(3000);
        let good = tcp_frame(&[], &[], ACK, &data);
        let seg = |f: &[u8], k, s, m| Segmenter::new(f, k, s, m).map(|_| ());
        assert_eq!(seg(&good, GsoKind::Tcp, 1448, MAX), Ok(()));
        assert_eq!(
            seg(&good, GsoKind::Udp, 1448, MAX),
            Err(SegmentError::Malformed)
        );
        assert_eq!(
            seg(&good, GsoKind::Tcp, 0, MAX),
            Err(SegmentError::ZeroSize)
        );
        assert_eq!(
            seg(&good, GsoKind::Tcp, 2000, MAX),
            Err(SegmentError::TooLarge)
        );
        assert_eq!(
            seg(&good[..good.len() - 1], GsoKind::Tcp, 1448, MAX),
            Err(SegmentError::Malformed)
        );
        assert_eq!(
            seg(&good[..20], GsoKind::Tcp, 1448, MAX),
            Err(SegmentError::Malformed)
        );
        assert_eq!(
            seg(&good[..10], GsoKind::Tcp, 1448, MAX),
            Err(SegmentError::NotIpv4)
        );
        let mut v6 = good.clone();
        v6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        assert_eq!(
            seg(&v6, GsoKind::Tcp, 1448, MAX),
            Err(SegmentError::Malformed),
            "an IPv4 packet under IPv6's ethertype"
        );
        let mut arp = good.clone();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(
            seg(&arp, GsoKind::Tcp, 1448, MAX),
            Err(SegmentError::NotIpv4)
        );
        let mut bad_sum = good.clone();
        bad_sum[ETH_HEADER_LEN + 8] = 1;
        assert_eq!(
            seg(&bad_sum, GsoKind::Tcp, 1448, MAX),
            Err(SegmentError::Malformed)
        );
        let mut doff = good.clone();
        doff[ETH_HEADER_LEN + 20 + 12] = 0x40; // data offset 16 bytes
        assert_eq!(
            seg(&doff, GsoKind::Tcp, 1448, MAX),
            Err(SegmentError::Malformed)
        );
        let mut udp_len = udp_frame(&data);
        udp_len[ETH_HEADER_LEN + 25] ^= 1;
        assert_eq!(
            seg(&udp_len, GsoKind::Udp, 1448, MAX),
            Err(SegmentError::Malformed)
        );
        // Trailing Ethernet padding is not payload.
        let mut padded = good.clone();
        padded.extend_from_slice(&[0; 6]);
        let segs = all(&padded, GsoKind::Tcp, 1448);
        assert_eq!(check_tcp(&good, &segs, 1448), data);
    }

    #[test]
    fn a_short_buffer_ends_the_segments_instead_of_panicking() {
        let frame = tcp_frame(&[], &[], ACK, &pattern(3000));
        let mut s = Segmenter::new(&frame, GsoKind::Tcp, 1448, MAX).unwrap();
        assert_eq!(s.next_into(&mut [0u8; 100]), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any payload, segment size and option layout: segments rejoin into the payload with
        /// every header right.
        #[test]
        fn segments_rejoin_into_the_payload(
            len in 0usize..20_000,
            size in 64u16..1500,
            ip_words in 0usize..=10,
            tcp_words in 0usize..=10,
            flags in any::<u8>(),
        ) {
            let data = pattern(len);
            let ip_opts = vec![1u8; ip_words * 4];
            let tcp_opts = vec![1u8; tcp_words * 4];
            let frame = tcp_frame(&ip_opts, &tcp_opts, flags, &data);
            match Segmenter::new(&frame, GsoKind::Tcp, size, MAX) {
                Ok(_) => {
                    let segs = all(&frame, GsoKind::Tcp, size);
                    prop_assert_eq!(check_tcp(&frame, &segs, usize::from(size)), data);
                }
                Err(e) => prop_assert_eq!(e, SegmentError::TooLarge),
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..3000), size in any::<u16>(), udp in any::<bool>()) {
            let kind = if udp { GsoKind::Udp } else { GsoKind::Tcp };
            if let Ok(mut s) = Segmenter::new(&bytes, kind, size, MAX) {
                let mut buf = [0u8; MAX];
                while s.next_into(&mut buf).is_some() {}
            }
        }
    }
}

//! IPv4 header validation and the few in-place edits a router makes.

use std::net::Ipv4Addr;

use crate::IPV4_MIN_HEADER;
use crate::checksum;

/// Protocol numbers we look at (the transport ones are the checksum module's: it knows where
/// their checksums lie).
pub(crate) const PROTO_ICMP: u8 = 1;
pub(crate) use crate::checksum::{PROTO_TCP, PROTO_UDP};

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// A validated IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) header_len: usize,
    /// The total length field: header plus payload.
    pub(crate) total_len: usize,
    pub(crate) src: Ipv4Addr,
    pub(crate) dst: Ipv4Addr,
    pub(crate) proto: u8,
    pub(crate) ttl: u8,
    pub(crate) id: u16,
    pub(crate) df: bool,
    pub(crate) mf: bool,
    /// Fragment offset in 8-byte units.
    pub(crate) frag_offset: u16,
}

/// Why bytes are not an IPv4 packet we can handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Invalid {
    /// Not version 4 (or too short to say).
    NotIpv4,
    /// Inconsistent lengths or a wrong header checksum.
    Malformed,
}

impl Header {
    /// Validates the header at the start of `packet`. With `whole`, the buffer must hold the
    /// packet's full total length; without, only the header (a truncated capture).
    pub(crate) fn parse(packet: &[u8], whole: bool) -> Result<Self, Invalid> {
        if packet.len() < IPV4_MIN_HEADER {
            return Err(if packet.first().is_some_and(|b| b >> 4 != 4) {
                Invalid::NotIpv4
            } else {
                Invalid::Malformed
            });
        }
        if packet[0] >> 4 != 4 {
            return Err(Invalid::NotIpv4);
        }
        let header_len = usize::from(packet[0] & 0x0f) * 4;
        let total_len = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
        if header_len < IPV4_MIN_HEADER || header_len > packet.len() || total_len < header_len {
            return Err(Invalid::Malformed);
        }
        if whole && total_len > packet.len() {
            return Err(Invalid::Malformed);
        }
        // RFC 1812 §5.2.2: a router verifies the header checksum. It is never offloaded.
        if checksum::internet(&packet[..header_len]) != 0 {
            return Err(Invalid::Malformed);
        }
        let flags = u16::from_be_bytes([packet[6], packet[7]]);
        // RFC 791: a datagram is at most 65,535 bytes. A fragment that would end past that
        // belongs to none (the "ping of death" overflows a receiver's reassembly).
        if usize::from(flags & OFFSET_MASK) * 8 + total_len > usize::from(u16::MAX) {
            return Err(Invalid::Malformed);
        }
        Ok(Self {
            header_len,
            total_len,
            src: Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]),
            dst: Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]),
            proto: packet[9],
            ttl: packet[8],
            id: u16::from_be_bytes([packet[4], packet[5]]),
            df: flags & FLAG_DF != 0,
            mf: flags & FLAG_MF != 0,
            frag_offset: flags & OFFSET_MASK,
        })
    }

    /// Whether this is a fragment (not a whole datagram).
    pub(crate) const fn is_fragment(&self) -> bool {
        self.mf || self.frag_offset != 0
    }

    /// The transport payload, when this packet holds it from its first byte.
    pub(crate) fn payload<'a>(&self, packet: &'a [u8]) -> Option<&'a [u8]> {
        (self.frag_offset == 0)
            .then(|| packet.get(self.header_len..self.total_len.min(packet.len())))
            .flatten()
    }
}

/// Decrements the TTL of the header at the start of `packet`, updating its checksum
/// incrementally. The caller has checked that the TTL is above 1.
pub(crate) fn decrement_ttl(packet: &mut [u8]) {
    let old = u16::from_be_bytes([packet[8], packet[9]]);
    packet[8] -= 1;
    let new = u16::from_be_bytes([packet[8], packet[9]]);
    let sum = checksum::update(u16::from_be_bytes([packet[10], packet[11]]), old, new);
    packet[10..12].copy_from_slice(&sum.to_be_bytes());
}

/// Recomputes the header checksum of the header of `header_len` bytes at the start of `packet`.
pub(crate) fn fill_header_checksum(packet: &mut [u8], header_len: usize) {
    packet[10..12].fill(0);
    let sum = checksum::internet(&packet[..header_len]);
    packet[10..12].copy_from_slice(&sum.to_be_bytes());
}

/// Writes a 20-byte header without options.
#[expect(clippy::too_many_arguments, reason = "the fields of an IPv4 header")]
pub(crate) fn write_header(
    buf: &mut [u8],
    total_len: u16,
    id: u16,
    ttl: u8,
    proto: u8,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    df: bool,
) {
    buf[0] = 0x45;
    buf[1] = 0;
    buf[2..4].copy_from_slice(&total_len.to_be_bytes());
    buf[4..6].copy_from_slice(&id.to_be_bytes());
    buf[6..8].copy_from_slice(&(if df { FLAG_DF } else { 0 }).to_be_bytes());
    buf[8] = ttl;
    buf[9] = proto;
    buf[12..16].copy_from_slice(&src.octets());
    buf[16..20].copy_from_slice(&dst.octets());
    fill_header_checksum(buf, IPV4_MIN_HEADER);
}

/// Whether `packet` (with header `h`) carries a TCP or UDP checksum that can be computed
/// here: not a fragment, whole, with a transport header long enough to hold the field.
pub(crate) fn has_transport_checksum(packet: &[u8], h: &Header) -> bool {
    if h.is_fragment() || h.total_len > packet.len() {
        return false;
    }
    match h.proto {
        PROTO_TCP => h.total_len - h.header_len >= 20,
        PROTO_UDP => h.total_len - h.header_len >= 8,
        _ => false,
    }
}

/// Computes the TCP or UDP checksum of an IPv4 packet that came out of the tunnel with its
/// checksum deferred (`FLAG_CHECKSUM_DEFERRED`, docs/protocol.md §1), over the whole segment,
/// whatever its field held. Returns whether there was one to compute; a packet without
/// (malformed, a fragment, another protocol) is left as it is.
pub fn complete_deferred_checksum(packet: &mut [u8]) -> bool {
    Header::parse(packet, true).is_ok_and(|h| complete_transport_checksum(packet, &h))
}

/// Completes the TCP or UDP checksum of a packet whose checksum the sender's kernel left to
/// offload (`CHECKSUM_PARTIAL`): the field holds only the pseudo-header sum, and nobody after
/// us would fill it in. Recomputed from scratch over the whole segment. Returns whether there
/// was one ([`has_transport_checksum`]).
pub(crate) fn complete_transport_checksum(packet: &mut [u8], h: &Header) -> bool {
    if !has_transport_checksum(packet, h) {
        return false;
    }
    checksum::fill_transport(
        &mut packet[h.header_len..h.total_len],
        h.src,
        h.dst,
        h.proto,
    );
    true
}

/// Finishes a transport checksum that a host's stack left to offload, at `start` and
/// `offset` as its offload header said (the field holds the pseudo-header sum). With `defer`,
/// an IPv4 TCP or UDP packet that is not a fragment, summed from its transport header, stays
/// as it is, for the tunnel's far end (`Some(true)`: send it with `FLAG_CHECKSUM_DEFERRED`,
/// docs/protocol.md §1). Otherwise the sum from `start` to the end goes into the field, as
/// the kernel's `skb_checksum_help` does (`Some(false)`). `None` when the field does not lie
/// inside the packet.
pub fn finish_partial_checksum(
    packet: &mut [u8],
    start: usize,
    offset: usize,
    defer: bool,
) -> Option<bool> {
    if defer
        && let Ok(h) = Header::parse(packet, true)
        && h.total_len == packet.len()
        && start == h.header_len
        && checksum::field(h.proto) == Some(offset)
        && has_transport_checksum(packet, &h)
    {
        return Some(true);
    }
    let at = start.checked_add(offset)?;
    if at.checked_add(2)? > packet.len() {
        return None;
    }
    let sum = checksum::internet(&packet[start..]);
    // A zero result is sent as all ones (zero means "no checksum" to UDP).
    let sum = if sum == 0 { 0xffff } else { sum };
    packet[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::ipv4_udp;

    #[test]
    fn parses_and_refuses() {
        let p = ipv4_udp([100, 64, 1, 10], [100, 64, 2, 20], 1234, 53, b"hello");
        let h = Header::parse(&p, true).unwrap();
        assert_eq!(
            (h.header_len, h.total_len, h.proto, h.ttl),
            (20, 33, PROTO_UDP, 64)
        );
        assert_eq!(h.src, Ipv4Addr::new(100, 64, 1, 10));
        assert!(!h.is_fragment());
        let mut bad = p.clone();
        bad[0] = 0x65;
        assert_eq!(Header::parse(&bad, true), Err(Invalid::NotIpv4));
        let mut bad = p.clone();
        bad[0] = 0x44; // IHL 4
        assert_eq!(Header::parse(&bad, true), Err(Invalid::Malformed));
        let mut bad = p.clone();
        bad[3] = 200; // total length beyond the buffer
        assert_eq!(Header::parse(&bad, true), Err(Invalid::Malformed));
        let mut bad = p.clone();
        bad[15] ^= 1; // header checksum now wrong
        assert_eq!(Header::parse(&bad, true), Err(Invalid::Malformed));
        assert_eq!(Header::parse(&p[..19], true), Err(Invalid::Malformed));
        // Fragments that would end past a datagram's 65,535 bytes (issue 49, finding 7);
        // the last one that fits is a fragment like any other.
        for (offset, payload, fits) in [
            (8191u16, 100usize, false),
            (8180, 1400, false),
            (8100, 1500, false),
            (8188, 11, true),
            (8188, 12, false),
        ] {
            let mut f = ipv4_udp(
                [100, 64, 1, 10],
                [100, 64, 2, 20],
                1,
                2,
                &vec![0; payload - 8],
            );
            f[6..8].copy_from_slice(&offset.to_be_bytes());
            fill_header_checksum(&mut f, 20);
            assert_eq!(Header::parse(&f, true).is_ok(), fits, "{offset} {payload}");
        }
        assert_eq!(Header::parse(&[0x60; 40], true), Err(Invalid::NotIpv4));
        assert!(
            Header::parse(&p[..20], false).is_ok(),
            "a truncated capture keeps its header"
        );
    }

    #[test]
    fn ttl_decrement_keeps_the_checksum_valid() {
        let mut p = ipv4_udp([100, 64, 1, 10], [100, 64, 2, 20], 1, 2, b"x");
        for ttl in (2..=64).rev() {
            assert_eq!(p[8], ttl);
            decrement_ttl(&mut p);
            assert!(Header::parse(&p, true).is_ok(), "ttl {ttl}");
        }
    }

    #[test]
    fn completes_a_partial_udp_checksum() {
        let mut p = ipv4_udp(
            [100, 64, 1, 10],
            [100, 64, 2, 20],
            1234,
            9,
            b"partial checksum",
        );
        let good = u16::from_be_bytes([p[26], p[27]]);
        p[26..28].copy_from_slice(&0x1234u16.to_be_bytes()); // what the kernel left: a partial sum
        let h = Header::parse(&p, true).unwrap();
        complete_transport_checksum(&mut p, &h);
        assert_eq!(u16::from_be_bytes([p[26], p[27]]), good);
    }

    /// A checksum a host left partial, finished generically, is the right checksum again;
    /// deferred (TCP and UDP only), it stays; a place outside the packet is refused.
    #[test]
    fn partial_checksums_are_left_to_offload_and_finished() {
        use crate::testutil::{checksums_ok, ipv4_echo, ipv4_tcp};
        for good in [
            ipv4_udp(
                [100, 64, 1, 10],
                [100, 64, 2, 20],
                1234,
                9,
                b"partial checksum",
            ),
            ipv4_tcp(
                [100, 64, 1, 10],
                [100, 64, 2, 20],
                0x18,
                None,
                b"a tcp payload!",
            ),
        ] {
            assert!(checksums_ok(&good));
            // What a host's stack leaves: the pseudo-header sum in the field.
            let mut p = good.clone();
            let h = Header::parse(&p, true).unwrap();
            let (start, offset) = (h.header_len, checksum::field(h.proto).unwrap());
            checksum::fill_pseudo_header(&mut p[start..], h.src, h.dst, h.proto);
            assert_ne!(p, good);
            let partial = p.clone();
            assert_eq!(
                finish_partial_checksum(&mut p, start, offset, true),
                Some(true)
            );
            assert_eq!(p, partial, "deferred: left as it is");
            assert_eq!(
                finish_partial_checksum(&mut p, start, offset, false),
                Some(false)
            );
            assert_eq!(p, good);
            let mut p = partial.clone();
            // A sum that does not start at the transport header is finished here, even
            // when deferring is allowed.
            assert_eq!(
                finish_partial_checksum(&mut p, start, offset, true),
                Some(true)
            );
            assert_eq!(finish_partial_checksum(&mut p, 0, 10, true), Some(false));
            let mut p = partial.clone();
            assert_eq!(
                finish_partial_checksum(&mut p, partial.len() - 1, 0, false),
                None
            );
            assert_eq!(finish_partial_checksum(&mut p, usize::MAX, 2, false), None);
            assert_eq!(p, partial);
        }
        // ICMP has no checksum to defer: finished here, even when deferring is allowed.
        let mut echo = ipv4_echo([100, 64, 1, 10], [100, 64, 2, 20], b"ping");
        let good = echo.clone();
        echo[22..24].fill(0);
        assert_eq!(finish_partial_checksum(&mut echo, 20, 2, true), Some(false));
        assert_eq!(echo, good);
    }
}

//! Internet checksums (RFC 1071) and their incremental update (RFC 1624).

use std::net::{Ipv4Addr, Ipv6Addr};

/// IP protocol number of TCP.
pub(crate) const PROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub(crate) const PROTO_UDP: u8 = 17;

/// One's-complement checksum of `data` (odd lengths padded with a zero byte). ip4sum sums
/// 32-bit words into a 64-bit accumulator, which the compiler vectorises: several times
/// faster than a word at a time, and checksums are on every forwarded segment's path.
pub(crate) fn internet(data: &[u8]) -> u16 {
    ip4sum::checksum(data)
}

/// RFC 1624 eqn. 3: the checksum after one 16-bit word changes from `old` to `new`,
/// `HC' = ~(~HC + ~m + m')`, without summing the whole packet again.
pub(crate) fn update(checksum: u16, old: u16, new: u16) -> u16 {
    let mut sum = u32::from(!checksum) + u32::from(!old) + u32::from(new);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    #[expect(clippy::cast_possible_truncation, reason = "folded to 16 bits above")]
    let folded = sum as u16;
    !folded
}

/// The IPv4 pseudo-header (RFC 793 §3.1, RFC 768) of a transport segment of `len` bytes.
fn pseudo(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, len: usize) -> [u8; 12] {
    let mut pseudo = [0u8; 12];
    pseudo[..4].copy_from_slice(&src.octets());
    pseudo[4..8].copy_from_slice(&dst.octets());
    pseudo[9] = proto;
    // A segment longer than 64 KiB cannot be in an IPv4 packet; its sum would be wrong, not
    // unsafe.
    let len = u16::try_from(len).unwrap_or(u16::MAX);
    pseudo[10..12].copy_from_slice(&len.to_be_bytes());
    pseudo
}

/// The IPv4 pseudo-header sum for a transport segment of `len` bytes, folded but not
/// complemented: what the checksum field holds for checksum offload to complete
/// (`CHECKSUM_PARTIAL`).
pub(crate) fn pseudo_header(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, len: usize) -> u16 {
    !internet(&pseudo(src, dst, proto, len))
}

/// Where the checksum field of a TCP or UDP header is, in bytes from the header's start.
pub(crate) const fn field(proto: u8) -> Option<usize> {
    match proto {
        PROTO_TCP => Some(16),
        PROTO_UDP => Some(6),
        _ => None,
    }
}

/// [`field`], if `segment` is long enough to hold it.
fn field_in(segment: &[u8], proto: u8) -> Option<usize> {
    field(proto).filter(|at| segment.len() >= at + 2)
}

/// The full TCP or UDP checksum of `segment` over IPv4 (pseudo-header included), computed
/// with the checksum field (16-bit word number `checksum_word`) treated as zero. For UDP a
/// result of 0 is sent as 0xffff (RFC 768: zero means "no checksum").
pub(crate) fn transport(
    segment: &[u8],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    checksum_word: usize,
) -> u16 {
    with_pseudo(
        &pseudo(src, dst, proto, segment.len()),
        segment,
        proto,
        checksum_word,
    )
}

/// The checksum of `segment` behind the pseudo-header `pseudo` (either version's), its
/// checksum field (16-bit word `checksum_word`) taken as zero; a UDP checksum of zero is sent
/// as all ones.
fn with_pseudo(pseudo: &[u8], segment: &[u8], proto: u8, checksum_word: usize) -> u16 {
    let mut sum = ip4sum::Checksum::new();
    sum.update(pseudo);
    // Every piece but the last has an even length, so words stay aligned across pieces.
    let field = 2 * checksum_word;
    match (segment.get(..field), segment.get(field + 2..)) {
        (Some(head), Some(tail)) => {
            sum.update(head);
            sum.update(tail);
        }
        _ => sum.update(segment),
    }
    let sum = sum.finalize();
    if proto == PROTO_UDP && sum == 0 {
        0xffff
    } else {
        sum
    }
}

/// Writes `sum(segment, checksum_word)` into the TCP or UDP checksum field of `segment`.
/// Other protocols, and segments too short to hold the field, are left as they are.
fn fill_field(segment: &mut [u8], proto: u8, sum: impl FnOnce(&[u8], usize) -> u16) {
    let Some(at) = field_in(segment, proto) else {
        return;
    };
    let sum = sum(segment, at / 2);
    segment[at..at + 2].copy_from_slice(&sum.to_be_bytes());
}

/// Computes the full TCP or UDP checksum of `segment` and writes it into its field. Other
/// protocols, and segments too short to hold the field, are left as they are.
pub(crate) fn fill_transport(segment: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr, proto: u8) {
    fill_field(segment, proto, |seg, word| {
        transport(seg, src, dst, proto, word)
    });
}

/// Writes the pseudo-header sum of `segment` into its TCP or UDP checksum field: a partial
/// checksum for offload to complete (`CHECKSUM_PARTIAL`). Other protocols, and segments too
/// short to hold the field, are left as they are.
pub(crate) fn fill_pseudo_header(segment: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr, proto: u8) {
    fill_field(segment, proto, |seg, _| {
        pseudo_header(src, dst, proto, seg.len())
    });
}

/// The IPv6 pseudo-header (RFC 8200 §8.1) of an upper-layer message of `len` bytes.
fn pseudo6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, len: usize) -> [u8; 40] {
    let mut pseudo = [0u8; 40];
    pseudo[..16].copy_from_slice(&src.octets());
    pseudo[16..32].copy_from_slice(&dst.octets());
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    pseudo[32..36].copy_from_slice(&len.to_be_bytes());
    pseudo[39] = next;
    pseudo
}

/// [`transport`] over IPv6: the checksum of an upper-layer `message` (TCP, UDP, ICMPv6) with
/// its checksum field (16-bit word `checksum_word`) taken as zero.
pub(crate) fn transport6(
    message: &[u8],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    next: u8,
    checksum_word: usize,
) -> u16 {
    with_pseudo(
        &pseudo6(src, dst, next, message.len()),
        message,
        next,
        checksum_word,
    )
}

/// [`fill_transport`] for a segment over IPv6.
pub(crate) fn fill_transport6(segment: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr, next: u8) {
    fill_field(segment, next, |seg, word| {
        transport6(seg, src, dst, next, word)
    });
}

/// [`pseudo_header`] over IPv6.
pub(crate) fn pseudo_header6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, len: usize) -> u16 {
    !internet(&pseudo6(src, dst, next, len))
}

/// [`fill_pseudo_header`] for a segment over IPv6.
pub(crate) fn fill_pseudo_header6(segment: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr, next: u8) {
    fill_field(segment, next, |seg, _| {
        pseudo_header6(src, dst, next, seg.len())
    });
}

/// Whether `pseudo` and `segment`, its checksum field included, sum to all ones (either zero
/// of one's complement in the field passes).
fn sums_to_zero(pseudo: &[u8], segment: &[u8]) -> bool {
    let mut sum = ip4sum::Checksum::new();
    sum.update(pseudo);
    sum.update(segment);
    sum.finalize() == 0
}

/// Whether the checksum of the upper-layer `message` over IPv6 is right.
pub(crate) fn valid6(message: &[u8], src: Ipv6Addr, dst: Ipv6Addr, next: u8) -> bool {
    sums_to_zero(&pseudo6(src, dst, next, message.len()), message)
}

/// Whether the TCP or UDP checksum of `segment` is right: pseudo-header and segment, the
/// field included, sum to all ones (either zero of one's complement in the field passes).
pub(crate) fn transport_valid(segment: &[u8], src: Ipv4Addr, dst: Ipv4Addr, proto: u8) -> bool {
    sums_to_zero(&pseudo(src, dst, proto, segment.len()), segment)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071 §3 example: the checksum of 00 01 f2 03 f4 f5 f6 f7 is ~0xddf2 = 0x220d.
    #[test]
    fn internet_checksum_rfc1071_3() {
        assert_eq!(
            internet(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0x220d
        );
    }

    /// A segment whose checksum field holds the pseudo-header sum sums, over the segment
    /// alone, to what the full checksum is: the offload's completion.
    #[test]
    fn pseudo_header_sum_is_what_offload_completes() {
        let (src, dst) = (Ipv4Addr::new(100, 64, 1, 10), Ipv4Addr::new(100, 64, 2, 20));
        let mut seg: Vec<u8> = (0..1021u32).map(|i| i.to_le_bytes()[0]).collect();
        seg[16..18].fill(0);
        let full = transport(&seg, src, dst, 6, 8);
        let partial = pseudo_header(src, dst, 6, seg.len());
        seg[16..18].copy_from_slice(&partial.to_be_bytes());
        assert_eq!(internet(&seg), full);
    }

    proptest::proptest! {
        /// Against pnet's word-at-a-time implementation, on any bytes and length.
        #[test]
        fn sums_agree_with_pnet(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000),
            src in proptest::prelude::any::<[u8; 4]>(),
            dst in proptest::prelude::any::<[u8; 4]>(),
            udp in proptest::prelude::any::<bool>(),
        ) {
            // Of nothing, RFC 1071 gives !0 = 0xffff; pnet answers 0 there (we never sum
            // nothing: the shortest thing summed is an 8-byte ICMP header).
            let theirs = if data.is_empty() { 0xffff } else { pnet_packet::util::checksum(&data, usize::MAX) };
            proptest::prop_assert_eq!(internet(&data), theirs);
            let (proto, word) = if udp { (17u8, 3usize) } else { (6, 8) };
            if data.len() >= 2 * word + 2 {
                let (src, dst) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
                let theirs = pnet_packet::util::ipv4_checksum(
                    &data,
                    word,
                    &[],
                    &src,
                    &dst,
                    pnet_packet::ip::IpNextHeaderProtocol(proto),
                );
                let theirs = if udp && theirs == 0 { 0xffff } else { theirs };
                proptest::prop_assert_eq!(transport(&data, src, dst, proto, word), theirs);
                // Filled in, the checksum validates; any changed byte (but a swap of the
                // field's two zeros) makes it fail.
                let mut filled = data.clone();
                fill_transport(&mut filled, src, dst, proto);
                proptest::prop_assert!(transport_valid(&filled, src, dst, proto));
                let last = filled.len() - 1;
                filled[last] ^= 0x01;
                proptest::prop_assert!(!transport_valid(&filled, src, dst, proto));
            }
        }
    }

    #[test]
    fn incremental_update_matches_recomputation() {
        let mut data = [
            0x45u8, 0x00, 0x00, 0x54, 0x12, 0x34, 0x40, 0x00, 0x40, 0x01, 0x00, 0x00,
        ];
        let before = internet(&data);
        for (old, new) in [
            (0x4001u16, 0x3f01u16),
            (0x0000, 0xffff),
            (0xffff, 0x0000),
            (0x1234, 0x1234),
        ] {
            data[8..10].copy_from_slice(&old.to_be_bytes());
            let with_old = internet(&data);
            data[8..10].copy_from_slice(&new.to_be_bytes());
            let with_new = internet(&data);
            let updated = update(with_old, old, new);
            // One's complement has two zeros; both are valid for a receiver.
            assert!(
                updated == with_new
                    || (updated == 0xffff && with_new == 0)
                    || (updated == 0 && with_new == 0xffff),
                "{old:x}->{new:x}: {updated:x} vs {with_new:x}"
            );
        }
        let _ = before;
    }
}

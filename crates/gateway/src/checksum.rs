//! Internet checksums (RFC 1071) and their incremental update (RFC 1624).

use std::net::Ipv4Addr;

/// One's-complement checksum of `data` (odd lengths padded with a zero byte).
pub(crate) fn internet(data: &[u8]) -> u16 {
    pnet_packet::util::checksum(data, usize::MAX)
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

/// The full TCP or UDP checksum of `segment` over IPv4 (pseudo-header included), computed
/// with the checksum field treated as zero. For UDP a result of 0 is sent as 0xffff
/// (RFC 768: zero means "no checksum").
pub(crate) fn transport(
    segment: &[u8],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    checksum_word: usize,
) -> u16 {
    let sum = pnet_packet::util::ipv4_checksum(
        segment,
        checksum_word,
        &[],
        &src,
        &dst,
        pnet_packet::ip::IpNextHeaderProtocol(proto),
    );
    if proto == pnet_packet::ip::IpNextHeaderProtocols::Udp.0 && sum == 0 {
        0xffff
    } else {
        sum
    }
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

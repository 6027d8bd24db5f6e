//! TCP MSS clamping: the fix for "TCP hangs through the tunnel".
//!
//! Devices assume a 1500-byte path and announce an MSS of 1460; the tunnel carries 1420-byte
//! packets. If a device's PMTU discovery is broken (ICMP filtered somewhere), full-size
//! segments vanish and the connection stalls after the handshake. Rewriting the MSS option of
//! SYN and SYN-ACK (in both directions) to fit the tunnel avoids depending on PMTUD at all.

use crate::checksum;
use crate::ipv4::{Header, PROTO_TCP};

const SYN: u8 = 0x02;
const OPT_EOL: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_MSS: u8 = 2;

/// Lowers the MSS option of a TCP SYN (or SYN-ACK) in `packet` to `max_mss` if it is larger,
/// keeping the TCP checksum valid (RFC 1624 incremental update). Returns whether it changed.
/// Anything that is not a well-formed first fragment of a SYN is left alone.
pub(crate) fn clamp_mss(packet: &mut [u8], h: &Header, max_mss: u16) -> bool {
    if h.proto != PROTO_TCP || h.frag_offset != 0 || h.total_len > packet.len() {
        return false;
    }
    let Some(seg) = packet.get_mut(h.header_len..h.total_len) else {
        return false;
    };
    let (src, dst) = (h.src, h.dst);
    clamp_segment(seg, max_mss, |seg| {
        checksum::transport(seg, src, dst, PROTO_TCP, 8)
    })
}

/// [`clamp_mss`] on the TCP segment `seg` of a packet of either IP version; `full` computes
/// the segment's checksum afresh (with its version's pseudo-header), for an MSS value that
/// straddles two checksum words.
pub(crate) fn clamp_segment(seg: &mut [u8], max_mss: u16, full: impl FnOnce(&[u8]) -> u16) -> bool {
    if seg.len() < 20 || seg[13] & SYN == 0 {
        return false;
    }
    let data_offset = usize::from(seg[12] >> 4) * 4;
    if data_offset < 20 || data_offset > seg.len() {
        return false;
    }
    let mut i = 20;
    while i < data_offset {
        match seg[i] {
            OPT_EOL => break,
            OPT_NOP => i += 1,
            kind => {
                let Some(&len) = seg.get(i + 1) else { break };
                let len = usize::from(len);
                if len < 2 || i + len > data_offset {
                    break; // malformed options: leave the segment as it is
                }
                if kind == OPT_MSS && len == 4 {
                    let mss = u16::from_be_bytes([seg[i + 2], seg[i + 3]]);
                    if mss <= max_mss {
                        return false;
                    }
                    seg[i + 2..i + 4].copy_from_slice(&max_mss.to_be_bytes());
                    // The checksum sums 16-bit words from the segment start. An MSS value at
                    // an even offset is one word: update it incrementally. At an odd offset it
                    // straddles two words; that layout is rare, so recompute instead.
                    let sum = if i % 2 == 0 {
                        checksum::update(u16::from_be_bytes([seg[16], seg[17]]), mss, max_mss)
                    } else {
                        full(seg)
                    };
                    seg[16..18].copy_from_slice(&sum.to_be_bytes());
                    return true;
                }
                i += len;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{checksums_ok, ipv4_tcp, syn};

    fn mss_of(p: &[u8]) -> Option<u16> {
        use pnet_packet::Packet as _;
        let t = pnet_packet::tcp::TcpPacket::new(&p[20..]).unwrap();
        t.get_options_iter()
            .find(|o| o.get_number() == pnet_packet::tcp::TcpOptionNumbers::MSS)
            .map(|o| u16::from_be_bytes([o.payload()[0], o.payload()[1]]))
    }

    #[test]
    fn clamps_syn_and_keeps_checksum_valid() {
        let mut p = syn(1460);
        let h = Header::parse(&p, true).unwrap();
        assert!(clamp_mss(&mut p, &h, 1380));
        assert_eq!(mss_of(&p), Some(1380));
        assert!(checksums_ok(&p));
    }

    #[test]
    fn leaves_small_mss_and_non_syn_alone() {
        let mut p = syn(1200);
        let h = Header::parse(&p, true).unwrap();
        assert!(!clamp_mss(&mut p, &h, 1380));
        assert_eq!(mss_of(&p), Some(1200));
        let mut ack = ipv4_tcp(
            [100, 64, 1, 10],
            [100, 64, 2, 20],
            0x10,
            Some(1460),
            b"data",
        );
        let h = Header::parse(&ack, true).unwrap();
        assert!(!clamp_mss(&mut ack, &h, 1380));
        let mut no_opt = ipv4_tcp([100, 64, 1, 10], [100, 64, 2, 20], 0x02, None, &[]);
        let h = Header::parse(&no_opt, true).unwrap();
        assert!(!clamp_mss(&mut no_opt, &h, 1380));
    }

    #[test]
    fn odd_option_offset_is_handled() {
        // A single NOP before the MSS puts it at an odd offset within the segment.
        let mut p = syn(1460);
        // options were NOP NOP MSS NOP NOP; make them NOP MSS NOP NOP NOP.
        let opts = [1u8, 2, 4, 0x05, 0xb4, 1, 1, 1];
        p[40..48].copy_from_slice(&opts);
        let h = Header::parse(&p, true).unwrap();
        // Re-checksum after editing options by hand.
        let sum = checksum::transport(&p[20..], h.src, h.dst, 6, 8);
        p[36..38].copy_from_slice(&sum.to_be_bytes());
        assert!(checksums_ok(&p));
        assert!(clamp_mss(&mut p, &h, 1380));
        assert_eq!(u16::from_be_bytes([p[43], p[44]]), 1380);
        assert!(
            checksums_ok(&p),
            "checksum after clamping an odd-offset MSS"
        );
    }

    #[test]
    fn malformed_options_do_not_panic() {
        let base = syn(1460);
        for len_byte in [0u8, 1, 3, 60, 255] {
            let mut p = base.clone();
            p[43] = len_byte; // length field of the MSS option
            let h = Header::parse(&p, true).unwrap();
            let _ = clamp_mss(&mut p, &h, 1380);
        }
    }
}

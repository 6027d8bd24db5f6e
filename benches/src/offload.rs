//! Fixtures for the LAN-side offload benchmarks: a TCP frame as GRO hands it over (64 KiB of
//! 1448-byte segments merged), and the wire-sized segments it is made of, as the adapter at the
//! tunnel's far end gets them back to merge for its LAN.

use cyphonic_gateway::{GsoKind, Segmenter};

/// Payload bytes per segment: a 1500-byte MTU with TCP timestamps.
pub const SEGMENT: u16 = 1448;
/// Segments in one coalesced frame: as many as fit under 64 KiB.
pub const SEGMENTS: usize = 45;
/// Room for one cut segment.
pub const MAX_FRAME: usize = 2048;
const ETH: usize = 14;
const IP: usize = 20;
const TCP: usize = 32;

/// An Ethernet frame of one TCP/IPv4 packet (ACK, timestamps) from 100.64.1.10 to
/// 100.64.2.20 carrying `SEGMENTS` segments' worth of payload, its IP header checksum right
/// and its TCP checksum partial, as GRO hands it to a packet socket.
pub fn coalesced_tcp() -> Vec<u8> {
    let payload = usize::from(SEGMENT) * SEGMENTS;
    let total = IP + TCP + payload;
    let mut f = vec![0u8; ETH + total];
    f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&[8, 0]);
    let ip = &mut f[ETH..];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&u16::try_from(total).expect("under 64 KiB").to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&[100, 64, 1, 10]);
    ip[16..20].copy_from_slice(&[100, 64, 2, 20]);
    let sum = ip4sum::checksum(&ip[..IP]);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let t = &mut ip[IP..];
    t[0..2].copy_from_slice(&40000u16.to_be_bytes());
    t[2..4].copy_from_slice(&5201u16.to_be_bytes());
    t[4..8].copy_from_slice(&7u32.to_be_bytes());
    t[8..12].copy_from_slice(&99u32.to_be_bytes());
    t[12] = 8 << 4;
    t[13] = 0x10;
    t[14..16].copy_from_slice(&512u16.to_be_bytes());
    t[20..32].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
    for (i, b) in t[TCP..].iter_mut().enumerate() {
        *b = (i * 7 + i / 251).to_le_bytes()[0];
    }
    f
}

/// Cuts `frame` as the capture thread does, every segment into `out` and then to `each`;
/// returns how many.
pub fn cut(
    frame: &[u8],
    partial: bool,
    out: &mut [u8; MAX_FRAME],
    mut each: impl FnMut(&[u8]),
) -> usize {
    let Ok(s) = Segmenter::new(frame, GsoKind::Tcp, SEGMENT, MAX_FRAME) else {
        return 0;
    };
    let mut s = s.with_partial_checksums(partial);
    let mut n = 0;
    while let Some(len) = s.next_into(out) {
        each(&out[..len]);
        n += 1;
    }
    n
}

/// The segments of [`coalesced_tcp`], each a whole frame with right checksums: what comes
/// out of the tunnel at the far end.
pub fn segments() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    cut(&coalesced_tcp(), false, &mut [0u8; MAX_FRAME], |s| {
        out.push(s.to_vec());
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_cuts_into_its_segments_and_they_make_one_run_either_way() {
        let frame = coalesced_tcp();
        let mut buf = [0u8; MAX_FRAME];
        assert_eq!(cut(&frame, false, &mut buf, |_| {}), SEGMENTS);
        assert_eq!(cut(&frame, true, &mut buf, |_| {}), SEGMENTS);
        let segs = segments();
        let refs: Vec<&[u8]> = segs.iter().map(Vec::as_slice).collect();
        for deferred in [[false; SEGMENTS], [true; SEGMENTS]] {
            let run = cyphonic_gateway::find_run(
                cyphonic_gateway::Framing::Ethernet,
                &refs,
                &deferred,
                64,
            )
            .expect("one run");
            assert_eq!(run.count, SEGMENTS);
        }
    }
}

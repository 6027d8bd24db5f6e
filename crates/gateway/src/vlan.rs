//! 802.1Q tags on the frames the adapter sends into a VLAN segment of a trunked LAN port
//! (docs/protocol.md §6, *VLAN trunks*). On the way in the kernel strips the tag and hands
//! it over beside the frame (`PACKET_AUXDATA`); on the way out an AF_PACKET socket sends
//! what it is given, so the tag is written into the frame here, after the MAC addresses.

use std::ops::Range;

/// The tag protocol identifier of an 802.1Q tag.
pub(crate) const TPID_8021Q: u16 = 0x8100;
/// Bytes an 802.1Q tag adds to a frame.
pub const TAG_LEN: usize = 4;
/// The largest VLAN identifier (4095 is reserved; 0 means "priority only").
pub const VID_MAX: u16 = 4094;

/// Tags the Ethernet frame `buf[frame]` with VLAN `vid` (priority 0), in `buf`: the MAC
/// addresses move four bytes towards the start when there is room before the frame, else
/// the rest of the frame moves four bytes on (a copy of the packet, for a frame written at
/// the start of its buffer). Returns where the tagged frame lies; None, the frame untouched,
/// when it is shorter than an Ethernet header, `vid` is not one, or `buf` has no room.
pub fn tag_frame(buf: &mut [u8], frame: Range<usize>, vid: u16) -> Option<Range<usize>> {
    if !(1..=VID_MAX).contains(&vid) || frame.end > buf.len() || frame.len() < crate::ETH_HEADER_LEN
    {
        return None;
    }
    let tagged = if let Some(start) = frame.start.checked_sub(TAG_LEN) {
        buf.copy_within(frame.start..frame.start + 12, start);
        start..frame.end
    } else {
        if frame.end + TAG_LEN > buf.len() {
            return None;
        }
        let start = frame.start;
        // The ethertype and what follows, on by four; the MACs stay where they are.
        buf.copy_within(start + 12..frame.end, start + 12 + TAG_LEN);
        start..frame.end + TAG_LEN
    };
    let at = tagged.start + 12;
    buf[at..at + 2].copy_from_slice(&TPID_8021Q.to_be_bytes());
    buf[at + 2..at + 4].copy_from_slice(&vid.to_be_bytes());
    Some(tagged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame() -> Vec<u8> {
        let mut f = vec![1, 2, 3, 4, 5, 6, 11, 12, 13, 14, 15, 16, 0x08, 0x00];
        f.extend(40..80u8);
        f
    }

    fn expected(vid: u16) -> Vec<u8> {
        let f = frame();
        let mut t = f[..12].to_vec();
        t.extend(TPID_8021Q.to_be_bytes());
        t.extend(vid.to_be_bytes());
        t.extend(&f[12..]);
        t
    }

    /// With headroom the MACs move back; without, the packet moves on: the same frame either
    /// way, the tag after the MAC addresses and the ethertype after the tag.
    #[test]
    fn a_tag_goes_after_the_mac_addresses_with_or_without_headroom() {
        for (head, tail) in [(4, 0), (6, 0), (2, 4), (0, 4), (0, 9)] {
            let f = frame();
            let mut buf = vec![0xee; head + f.len() + tail];
            buf[head..head + f.len()].copy_from_slice(&f);
            let tagged = tag_frame(&mut buf, head..head + f.len(), 10).unwrap();
            assert_eq!(
                buf[tagged.clone()],
                expected(10)[..],
                "head {head} tail {tail}"
            );
            assert_eq!(tagged.len(), f.len() + TAG_LEN);
        }
    }

    #[test]
    fn no_room_a_short_frame_or_no_vlan_leaves_the_frame_alone() {
        let f = frame();
        for (buf_len, frame_len, vid) in [
            (f.len() + 3, f.len(), 10),
            (f.len(), f.len(), 10),
            (f.len() + 4, 13, 10),
            (f.len() + 4, f.len(), 0),
            (f.len() + 4, f.len(), 4095),
        ] {
            let mut buf = vec![0xee; buf_len];
            buf[..f.len()].copy_from_slice(&f);
            let before = buf.clone();
            assert_eq!(tag_frame(&mut buf, 0..frame_len, vid), None);
            assert_eq!(buf, before);
        }
    }
}

//! IPv4 fragmentation of whatever a device sends, at any MTU: every fragment fits the MTU,
//! every fragment but the last carries a multiple of 8 bytes at its offset, and the fragments
//! together carry exactly the packet's payload, in order.
#![no_main]

use cyphonic_gateway::Fragmenter;

libfuzzer_sys::fuzz_target!(|input: (u16, Vec<u8>)| {
    let (mtu, packet) = input;
    let Ok(mut f) = Fragmenter::new(&packet, mtu) else {
        return;
    };
    if !f.needed() {
        return;
    }
    let header_len = usize::from(packet[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
    let payload = &packet[header_len..total];
    let base = usize::from(u16::from_be_bytes([packet[6], packet[7]]) & 0x1fff) * 8;
    let mut out = vec![0u8; usize::from(mtu)];
    let mut joined = Vec::new();
    let mut fragments = 0;
    while let Some(n) = f.next_into(&mut out) {
        fragments += 1;
        assert!(n <= usize::from(mtu), "a fragment of {n} bytes for an MTU of {mtu}");
        let frag = &out[..n];
        let hl = usize::from(frag[0] & 0x0f) * 4;
        let len = usize::from(u16::from_be_bytes([frag[2], frag[3]]));
        assert_eq!(len, n, "the total length field");
        let field = u16::from_be_bytes([frag[6], frag[7]]);
        let offset = usize::from(field & 0x1fff) * 8;
        assert_eq!(offset, base + joined.len(), "fragments in order, without gaps");
        let more = field & 0x2000 != 0;
        if more {
            assert_eq!((n - hl) % 8, 0, "a fragment before the last carries a multiple of 8");
        }
        joined.extend_from_slice(&frag[hl..n]);
        assert!(fragments <= 65_536 / 8 + 1);
    }
    assert_eq!(joined, payload, "the fragments carry the payload");
});

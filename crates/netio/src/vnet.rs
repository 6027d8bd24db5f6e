//! The `virtio_net_hdr` (linux/virtio_net.h) the kernel puts in front of a frame or packet
//! it hands over coalesced or with its checksum left to offload, and that asks it to segment
//! one on the way out: on a packet socket with `PACKET_VNET_HDR` ([`crate::PacketSocket`]) and
//! on a TUN device with `IFF_VNET_HDR` ([`crate::Tun`]). Ten bytes, in host byte order (both
//! devices use the legacy, native-endian layout).

// linux/virtio_net.h: `struct virtio_net_hdr` (10 bytes, host byte order) in front of every
// frame received or sent with offload headers.
pub(crate) const VNET_HDR_LEN: usize = 10;
const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
const VIRTIO_NET_HDR_GSO_TCPV4: u8 = 1;
#[cfg(test)]
const VIRTIO_NET_HDR_GSO_UDP: u8 = 3;
const VIRTIO_NET_HDR_GSO_TCPV6: u8 = 4;
const VIRTIO_NET_HDR_GSO_UDP_L4: u8 = 5;
const VIRTIO_NET_HDR_GSO_ECN: u8 = 0x80;
/// A frame sent as it is: no offload asked of the kernel.
pub(crate) const VNET_HDR_NONE: [u8; VNET_HDR_LEN] = [0; VNET_HDR_LEN];

/// How a coalesced frame was built: cut it into segments of `segment_size` payload bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coalesced {
    /// Which protocol's segments.
    pub kind: GsoKind,
    /// Payload bytes per segment (the last may have fewer).
    pub segment_size: u16,
}

/// The protocol of a coalesced frame (`VIRTIO_NET_HDR_GSO_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GsoKind {
    /// TCP over IPv4.
    TcpV4,
    /// TCP over IPv6.
    TcpV6,
    /// UDP datagrams (UDP GSO/GRO), over IPv4 or IPv6.
    UdpL4,
    /// UDP fragmentation offload (UFO, one datagram to be IP-fragmented) or a type this code
    /// does not know.
    Other(u8),
}

/// How the kernel is to cut a large TCP or UDP frame: its headers (Ethernet, IP, transport)
/// are copied into every segment; the transport checksum field holds the pseudo-header sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gso {
    /// TCP segments ([`GsoKind::TcpV4`], [`GsoKind::TcpV6`]) or UDP datagrams
    /// ([`GsoKind::UdpL4`]); any other kind is sent without segmentation (and refused if it
    /// is too large for the device).
    pub kind: GsoKind,
    /// Bytes of Ethernet, IP and transport headers.
    pub headers: u16,
    /// Where the transport header starts (Ethernet and IP headers).
    pub l4_start: u16,
    /// Payload bytes per segment.
    pub segment_size: u16,
}

/// A transport checksum the kernel left to offload (`VIRTIO_NET_HDR_F_NEEDS_CSUM`,
/// `CHECKSUM_PARTIAL`): the one's-complement sum of the packet's bytes from `start` to its
/// end, complemented, belongs at `start + offset`; meanwhile that field holds the
/// pseudo-header sum (so the sum covers it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialChecksum {
    /// Where the summed bytes start (the transport header), from the packet's start.
    pub start: u16,
    /// Where the checksum field is, from `start` (16 for TCP, 6 for UDP).
    pub offset: u16,
}

/// Where a `virtio_net_hdr` says the checksum left to offload is, if it says one is.
pub(crate) fn partial_checksum(h: &[u8; VNET_HDR_LEN]) -> Option<PartialChecksum> {
    (h[0] & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0).then(|| PartialChecksum {
        start: u16::from_ne_bytes([h[6], h[7]]),
        offset: u16::from_ne_bytes([h[8], h[9]]),
    })
}

/// The `virtio_net_hdr` of a packet sent whole whose transport checksum is left to the
/// kernel (`checksum`), or complete (`None`).
pub(crate) fn vnet_checksum(checksum: Option<PartialChecksum>) -> [u8; VNET_HDR_LEN] {
    let Some(c) = checksum else {
        return VNET_HDR_NONE;
    };
    let mut h = VNET_HDR_NONE;
    h[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    h[6..8].copy_from_slice(&c.start.to_ne_bytes());
    h[8..10].copy_from_slice(&c.offset.to_ne_bytes());
    h
}

/// The `virtio_net_hdr` asking for segmentation and checksum completion.
pub(crate) fn vnet_gso(gso: Gso) -> [u8; VNET_HDR_LEN] {
    let (gso_type, checksum_offset) = match gso.kind {
        GsoKind::TcpV4 => (VIRTIO_NET_HDR_GSO_TCPV4, 16u16),
        GsoKind::TcpV6 => (VIRTIO_NET_HDR_GSO_TCPV6, 16),
        GsoKind::UdpL4 => (VIRTIO_NET_HDR_GSO_UDP_L4, 6),
        GsoKind::Other(_) => return VNET_HDR_NONE,
    };
    let mut h = [0u8; VNET_HDR_LEN];
    h[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    h[1] = gso_type;
    h[2..4].copy_from_slice(&gso.headers.to_ne_bytes());
    h[4..6].copy_from_slice(&gso.segment_size.to_ne_bytes());
    h[6..8].copy_from_slice(&gso.l4_start.to_ne_bytes());
    h[8..10].copy_from_slice(&checksum_offset.to_ne_bytes());
    h
}

/// Whether a `virtio_net_hdr` says the L4 checksum is left to offload, and how the frame was
/// coalesced if it was.
pub(crate) fn parse_vnet(h: &[u8; VNET_HDR_LEN]) -> (bool, Option<Coalesced>) {
    let partial = h[0] & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0;
    let kind = match h[1] & !VIRTIO_NET_HDR_GSO_ECN {
        0 => return (partial, None),
        VIRTIO_NET_HDR_GSO_TCPV4 => GsoKind::TcpV4,
        VIRTIO_NET_HDR_GSO_TCPV6 => GsoKind::TcpV6,
        VIRTIO_NET_HDR_GSO_UDP_L4 => GsoKind::UdpL4,
        // VIRTIO_NET_HDR_GSO_UDP (3, UFO) among them.
        other => GsoKind::Other(other),
    };
    // Host byte order: the legacy header, not a virtio device's little-endian one.
    let segment_size = u16::from_ne_bytes([h[4], h[5]]);
    (partial, Some(Coalesced { kind, segment_size }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP4_1448: Coalesced = Coalesced {
        kind: GsoKind::TcpV4,
        segment_size: 1448,
    };

    #[test]
    fn vnet_headers_are_read_in_host_order() {
        let mut h = [0u8; VNET_HDR_LEN];
        assert_eq!(parse_vnet(&h), (false, None));
        h[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
        assert_eq!(parse_vnet(&h), (true, None));
        h[1] = VIRTIO_NET_HDR_GSO_TCPV4 | VIRTIO_NET_HDR_GSO_ECN;
        h[2..4].copy_from_slice(&66u16.to_ne_bytes());
        h[4..6].copy_from_slice(&1448u16.to_ne_bytes());
        assert_eq!(parse_vnet(&h), (true, Some(TCP4_1448)));
        h[1] = VIRTIO_NET_HDR_GSO_UDP_L4;
        assert_eq!(parse_vnet(&h).1.unwrap().kind, GsoKind::UdpL4);
        h[1] = VIRTIO_NET_HDR_GSO_UDP;
        assert_eq!(parse_vnet(&h).1.unwrap().kind, GsoKind::Other(3));
    }

    #[test]
    fn segmentation_headers_read_back() {
        let gso = |kind| Gso {
            kind,
            headers: 66,
            l4_start: 34,
            segment_size: 1448,
        };
        let h = vnet_gso(gso(GsoKind::TcpV4));
        assert_eq!(parse_vnet(&h), (true, Some(TCP4_1448)));
        assert_eq!(u16::from_ne_bytes([h[2], h[3]]), 66);
        assert_eq!(u16::from_ne_bytes([h[6], h[7]]), 34);
        assert_eq!(u16::from_ne_bytes([h[8], h[9]]), 16);
        let h = vnet_gso(gso(GsoKind::UdpL4));
        assert_eq!(parse_vnet(&h).1.unwrap().kind, GsoKind::UdpL4);
        assert_eq!(u16::from_ne_bytes([h[8], h[9]]), 6);
        assert_eq!(vnet_gso(gso(GsoKind::Other(9))), VNET_HDR_NONE);
    }

    #[test]
    fn partial_checksums_read_back() {
        let c = PartialChecksum {
            start: 20,
            offset: 16,
        };
        let h = vnet_checksum(Some(c));
        assert_eq!(partial_checksum(&h), Some(c));
        assert_eq!(parse_vnet(&h), (true, None));
        assert_eq!(vnet_checksum(None), VNET_HDR_NONE);
        assert_eq!(partial_checksum(&VNET_HDR_NONE), None);
    }
}

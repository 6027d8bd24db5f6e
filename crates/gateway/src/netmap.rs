//! The legacy map (docs/protocol.md §6): a site's fixed-address subnet mapped one to one onto
//! a block of the adapter's overlay block, both ways (a NETMAP). Packets are rewritten in
//! place and every checksum follows: the IPv4 header's, the TCP or UDP one through its
//! pseudo-header (whole or partial), and in an ICMP error the quoted packet's header and
//! segment with the ICMP message's own, all incrementally (RFC 1624), so that a fragment is
//! rewritten as rightly as a whole datagram.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::checksum::{self, PROTO_TCP, PROTO_UDP};
use crate::ipv4::{Header, PROTO_ICMP};

/// Why a legacy map cannot be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NetmapError {
    /// The two blocks are not of one size.
    #[error("the legacy subnet and the block it maps onto differ in size")]
    SizesDiffer,
}

/// Why a packet was not rewritten (the caller drops and counts it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmapped {
    /// Not a whole, valid IPv4 packet.
    Malformed,
    /// The address to rewrite is outside the map.
    Outside,
}

/// What a packet's TCP or UDP checksum field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sums {
    /// The checksum itself.
    Full,
    /// Only the pseudo-header's sum, for offload (or the tunnel's far end) to complete
    /// (`CHECKSUM_PARTIAL`, `FLAG_CHECKSUM_DEFERRED`).
    Partial,
}

/// Which address of a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Source,
    Destination,
}

impl Field {
    /// Its offset in an IPv4 header.
    const fn at(self) -> usize {
        match self {
            Self::Source => 12,
            Self::Destination => 16,
        }
    }

    const fn other(self) -> Self {
        match self {
            Self::Source => Self::Destination,
            Self::Destination => Self::Source,
        }
    }
}

/// A legacy subnet and the overlay block it maps onto, one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Netmap {
    legacy: Ipv4Net,
    overlay: Ipv4Net,
}

impl Netmap {
    /// `legacy` onto `overlay` (both taken as networks: host bits dropped).
    ///
    /// # Errors
    /// The two differ in size.
    pub fn new(legacy: Ipv4Net, overlay: Ipv4Net) -> Result<Self, NetmapError> {
        if legacy.prefix_len() != overlay.prefix_len() {
            return Err(NetmapError::SizesDiffer);
        }
        Ok(Self {
            legacy: legacy.trunc(),
            overlay: overlay.trunc(),
        })
    }

    /// The legacy subnet.
    pub const fn legacy(&self) -> Ipv4Net {
        self.legacy
    }

    /// The overlay block it maps onto.
    pub const fn overlay(&self) -> Ipv4Net {
        self.overlay
    }

    /// The overlay address of legacy address `a`, if it is in the subnet.
    pub fn to_overlay(&self, a: Ipv4Addr) -> Option<Ipv4Addr> {
        shift(a, self.legacy, self.overlay)
    }

    /// The legacy address of overlay address `a`, if it is in the block.
    pub fn to_legacy(&self, a: Ipv4Addr) -> Option<Ipv4Addr> {
        shift(a, self.overlay, self.legacy)
    }

    /// A packet from a legacy device, on its way into the tunnel: its source becomes the
    /// overlay address (and in an ICMP error it sends, the quoted packet's destination).
    ///
    /// # Errors
    /// The packet is not a whole IPv4 packet, or its source is outside the subnet: it is
    /// left as it was.
    pub fn outbound(&self, packet: &mut [u8], sums: Sums) -> Result<(), Unmapped> {
        rewrite(packet, Field::Source, sums, |a| self.to_overlay(a))
    }

    /// A packet from the tunnel to a legacy device: its destination becomes the legacy
    /// address (and in an ICMP error for the device, the quoted packet's source).
    ///
    /// # Errors
    /// The packet is not a whole IPv4 packet, or its destination is outside the block: it
    /// is left as it was.
    pub fn inbound(&self, packet: &mut [u8], sums: Sums) -> Result<(), Unmapped> {
        rewrite(packet, Field::Destination, sums, |a| self.to_legacy(a))
    }
}

/// A site's fixed-address devices on the adapter's LAN (docs/protocol.md §6): their subnet
/// mapped onto part of the block, and the old router's address in it, which the adapter
/// answers for as the gateway vIP's alias. To a legacy device the gateway *is* that address:
/// its ARP, its pings, its DNS answers and the ICMP errors the gateway sends it all carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Legacy {
    /// The subnet and the block it maps onto.
    pub map: Netmap,
    /// The address the adapter answers for on the subnet: the old router's (the devices'
    /// default gateway), or with `router` one of its own beside the site's router.
    pub gateway: Ipv4Addr,
    /// The site's router, when it stays the devices' gateway and routes the overlay to
    /// `gateway` (docs/protocol.md §6, "Beside an existing router").
    pub router: Option<Ipv4Addr>,
}

impl Legacy {
    /// A packet from a legacy device, its header `h` parsed and verified, into the overlay's
    /// terms: its source becomes its overlay address ([`Netmap::outbound`]) and a destination
    /// of the old router's address becomes `gateway_vip`. Returns the header as rewritten.
    ///
    /// # Errors
    /// The source is outside the subnet: the packet is left as it was.
    pub(crate) fn outbound(
        &self,
        packet: &mut [u8],
        h: &Header,
        sums: Sums,
        gateway_vip: Ipv4Addr,
    ) -> Result<Header, Unmapped> {
        let src = self.map.to_overlay(h.src).ok_or(Unmapped::Outside)?;
        rewrite_parsed(packet, h, Field::Source, sums, |a| self.map.to_overlay(a));
        let mut dst = h.dst;
        if dst == self.gateway {
            let alias = |a| (a == self.gateway).then_some(gateway_vip);
            rewrite_parsed(packet, h, Field::Destination, sums, alias);
            dst = gateway_vip;
        }
        Ok(Header { src, dst, ..*h })
    }

    /// A packet for a legacy device into its own terms: its destination becomes the legacy
    /// address ([`Netmap::inbound`]) and a source of `gateway_vip` becomes the old router's
    /// address.
    ///
    /// # Errors
    /// As [`Netmap::inbound`]; the packet may then be half rewritten (the caller drops it).
    pub fn inbound(
        &self,
        packet: &mut [u8],
        sums: Sums,
        gateway_vip: Ipv4Addr,
    ) -> Result<(), Unmapped> {
        self.map.inbound(packet, sums)?;
        if address_at(packet, Field::Source) != Some(gateway_vip) {
            return Ok(());
        }
        let alias = |a| (a == gateway_vip).then_some(self.gateway);
        or_unchanged(rewrite(packet, Field::Source, sums, alias))
    }
}

/// The address `field` of the IPv4 header at the start of `packet`, read raw (the caller
/// rewrote a valid header).
fn address_at(packet: &[u8], field: Field) -> Option<Ipv4Addr> {
    let at = field.at();
    let a: [u8; 4] = packet.get(at..at + 4)?.try_into().ok()?;
    Some(Ipv4Addr::from(a))
}

/// An address outside an alias is one to leave as it is.
const fn or_unchanged(r: Result<(), Unmapped>) -> Result<(), Unmapped> {
    match r {
        Err(Unmapped::Outside) => Ok(()),
        other => other,
    }
}

/// `a` moved from `from` to the same place in `to` (of one size), if it is in `from`.
fn shift(a: Ipv4Addr, from: Ipv4Net, to: Ipv4Net) -> Option<Ipv4Addr> {
    from.contains(&a).then(|| {
        let offset = u32::from(a) - u32::from(from.network());
        Ipv4Addr::from(u32::from(to.network()) + offset)
    })
}

/// The ICMP types whose message quotes the packet it is about (RFC 792).
const fn quotes(icmp_type: u8) -> bool {
    matches!(icmp_type, 3 | 4 | 5 | 11 | 12)
}

/// Rewrites the address `field` of `packet` by `map`, and everything that covers it.
fn rewrite(
    packet: &mut [u8],
    field: Field,
    sums: Sums,
    map: impl Fn(Ipv4Addr) -> Option<Ipv4Addr>,
) -> Result<(), Unmapped> {
    let h = Header::parse(packet, true).map_err(|_| Unmapped::Malformed)?;
    let old = match field {
        Field::Source => h.src,
        Field::Destination => h.dst,
    };
    if map(old).is_none() {
        return Err(Unmapped::Outside);
    }
    rewrite_parsed(packet, &h, field, sums, map);
    Ok(())
}

/// [`rewrite`] of a packet whose header `h` was parsed and verified; an address `map`
/// leaves out is left as it is.
fn rewrite_parsed(
    packet: &mut [u8],
    h: &Header,
    field: Field,
    sums: Sums,
    map: impl Fn(Ipv4Addr) -> Option<Ipv4Addr>,
) {
    let old = match field {
        Field::Source => h.src,
        Field::Destination => h.dst,
    };
    let Some(new) = map(old) else {
        return;
    };
    let words = set_address(packet, field.at(), new);
    for (was, now) in words {
        update_field(packet, 10, was, now, Sums::Full);
    }
    if h.frag_offset != 0 {
        return;
    }
    let segment = &mut packet[h.header_len..h.total_len];
    match h.proto {
        PROTO_TCP | PROTO_UDP => {
            if let Some(at) = checksum::field(h.proto).filter(|at| segment.len() >= at + 2) {
                for (was, now) in words {
                    update_transport(segment, at, h.proto, was, now, sums);
                }
            }
        }
        PROTO_ICMP => rewrite_quote(segment, field.other(), &map),
        _ => {}
    }
}

/// In an ICMP error (`icmp`, the message from its type on), rewrites the quoted packet's
/// address `field` by `map`, with the quoted header's and segment's checksums and the ICMP
/// message's. A message that quotes nothing, or a quote too short or not of an address in
/// the map, is left as it is.
fn rewrite_quote(icmp: &mut [u8], field: Field, map: &impl Fn(Ipv4Addr) -> Option<Ipv4Addr>) {
    const QUOTE: usize = 8;
    let Some(&icmp_type) = icmp.first() else {
        return;
    };
    let Some(quote) = icmp.get(QUOTE..) else {
        return;
    };
    if !quotes(icmp_type) || quote.len() < crate::IPV4_MIN_HEADER || quote[0] >> 4 != 4 {
        return;
    }
    let header_len = usize::from(quote[0] & 0x0f) * 4;
    if header_len < crate::IPV4_MIN_HEADER || quote.len() < header_len {
        return;
    }
    let at = field.at();
    let old = Ipv4Addr::new(quote[at], quote[at + 1], quote[at + 2], quote[at + 3]);
    let Some(new) = map(old) else {
        return;
    };
    let proto = quote[9];
    let first = u16::from_be_bytes([quote[6], quote[7]]) & 0x1fff == 0;
    // Each word changed in the quote changes the ICMP message's checksum (at 2) too.
    let words = set_address(icmp, QUOTE + at, new);
    for (was, now) in words {
        update_field(icmp, 2, was, now, Sums::Full);
        let (sum_was, sum_now) = update_field(icmp, QUOTE + 10, was, now, Sums::Full);
        update_field(icmp, 2, sum_was, sum_now, Sums::Full);
    }
    let segment_at = QUOTE + header_len;
    if first
        && let Some(sum_at) = checksum::field(proto)
        && icmp.len() >= segment_at + sum_at + 2
    {
        for (was, now) in words {
            let segment = &mut icmp[segment_at..];
            if let Some((sum_was, sum_now)) =
                update_transport(segment, sum_at, proto, was, now, Sums::Full)
            {
                update_field(icmp, 2, sum_was, sum_now, Sums::Full);
            }
        }
    }
}

/// Writes `addr` at `at` in `buf`; returns the two 16-bit words it replaced, with the new.
fn set_address(buf: &mut [u8], at: usize, addr: Ipv4Addr) -> [(u16, u16); 2] {
    let o = addr.octets();
    let was = [
        u16::from_be_bytes([buf[at], buf[at + 1]]),
        u16::from_be_bytes([buf[at + 2], buf[at + 3]]),
    ];
    buf[at..at + 4].copy_from_slice(&o);
    [
        (was[0], u16::from_be_bytes([o[0], o[1]])),
        (was[1], u16::from_be_bytes([o[2], o[3]])),
    ]
}

/// Updates the checksum at `at` in `buf` for one covered word going from `was` to `now`;
/// returns the field's old and new value.
fn update_field(buf: &mut [u8], at: usize, was: u16, now: u16, sums: Sums) -> (u16, u16) {
    let old = u16::from_be_bytes([buf[at], buf[at + 1]]);
    let new = match sums {
        Sums::Full => checksum::update(old, was, now),
        // The field holds the sum itself, not its complement.
        Sums::Partial => !checksum::update(!old, was, now),
    };
    buf[at..at + 2].copy_from_slice(&new.to_be_bytes());
    (old, new)
}

/// A TCP or UDP checksum (at `at` in `segment`) after a pseudo-header word went from `was`
/// to `now`; returns the field's old and new value when it changed. A UDP checksum of zero
/// (none) stays zero; one that would become zero is sent as `0xffff` (RFC 768).
fn update_transport(
    segment: &mut [u8],
    at: usize,
    proto: u8,
    was: u16,
    now: u16,
    sums: Sums,
) -> Option<(u16, u16)> {
    let udp = proto == PROTO_UDP && sums == Sums::Full;
    let old = u16::from_be_bytes([segment[at], segment[at + 1]]);
    if udp && old == 0 {
        return None;
    }
    let (_, mut new) = update_field(segment, at, was, now, sums);
    if udp && new == 0 {
        new = 0xffff;
        segment[at..at + 2].copy_from_slice(&new.to_be_bytes());
    }
    Some((old, new))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;
    use crate::testutil::{checksums_ok, ipv4_echo, ipv4_tcp, ipv4_udp};

    /// The site's 192.0.2.0/25 onto the adapter's 100.64.1.128/25.
    fn map() -> Netmap {
        Netmap::new(
            "192.0.2.0/25".parse().unwrap(),
            "100.64.1.128/25".parse().unwrap(),
        )
        .unwrap()
    }

    const DEVICE: [u8; 4] = [192, 0, 2, 20];
    const DEVICE_OVERLAY: [u8; 4] = [100, 64, 1, 148];
    const REMOTE: [u8; 4] = [100, 64, 2, 30];

    fn src(p: &[u8]) -> [u8; 4] {
        p[12..16].try_into().unwrap()
    }

    fn dst(p: &[u8]) -> [u8; 4] {
        p[16..20].try_into().unwrap()
    }

    /// An IPv4 header's checksum verifies.
    fn header_ok(ip: &[u8]) -> bool {
        let hl = usize::from(ip[0] & 0x0f) * 4;
        checksum::internet(&ip[..hl]) == 0
    }

    /// An ICMP error of `icmp_type` from `from` to `to` quoting `quoted` (all of it).
    fn icmp_error(icmp_type: u8, from: [u8; 4], to: [u8; 4], quoted: &[u8]) -> Vec<u8> {
        let mut p = ipv4_echo(from, to, quoted);
        p[20] = icmp_type;
        p[21] = 0;
        p[24..28].fill(0);
        p[22..24].fill(0);
        let sum = checksum::internet(&p[20..]);
        p[22..24].copy_from_slice(&sum.to_be_bytes());
        p
    }

    #[test]
    fn addresses_map_one_to_one_and_blocks_of_two_sizes_do_not() {
        let m = map();
        let device = Ipv4Addr::from(DEVICE);
        assert_eq!(m.to_overlay(device), Some(Ipv4Addr::from(DEVICE_OVERLAY)));
        assert_eq!(m.to_legacy(Ipv4Addr::from(DEVICE_OVERLAY)), Some(device));
        assert_eq!(m.to_overlay(Ipv4Addr::new(192, 0, 2, 200)), None);
        assert_eq!(m.to_legacy(Ipv4Addr::new(100, 64, 1, 20)), None);
        assert_eq!(
            Netmap::new(
                "192.0.2.0/24".parse().unwrap(),
                "100.64.1.0/25".parse().unwrap()
            ),
            Err(NetmapError::SizesDiffer)
        );
    }

    /// TCP and UDP leave with the device's overlay source, the reply comes back to its
    /// legacy address, and every checksum verifies both ways.
    #[test]
    fn a_devices_segments_leave_mapped_and_replies_come_back_with_sums_that_verify() {
        let m = map();
        for mut p in [
            ipv4_tcp(DEVICE, REMOTE, 0x18, None, b"a legacy device's data"),
            ipv4_udp(DEVICE, REMOTE, 5000, 53, b"odd length!"),
        ] {
            let payload = p[20..].to_vec();
            m.outbound(&mut p, Sums::Full).unwrap();
            assert_eq!((src(&p), dst(&p)), (DEVICE_OVERLAY, REMOTE));
            assert!(checksums_ok(&p));
            assert_eq!(p[20..].len(), payload.len());
        }
        for mut p in [
            ipv4_tcp(REMOTE, DEVICE_OVERLAY, 0x12, Some(1360), b""),
            ipv4_udp(REMOTE, DEVICE_OVERLAY, 53, 5000, b"an answer"),
        ] {
            m.inbound(&mut p, Sums::Full).unwrap();
            assert_eq!((src(&p), dst(&p)), (REMOTE, DEVICE));
            assert!(checksums_ok(&p));
        }
    }

    #[test]
    fn a_udp_datagram_without_a_checksum_keeps_none() {
        let mut p = ipv4_udp(DEVICE, REMOTE, 5000, 53, b"no sum");
        p[26..28].fill(0);
        map().outbound(&mut p, Sums::Full).unwrap();
        assert_eq!(&p[26..28], &[0, 0]);
        assert!(header_ok(&p));
    }

    /// A field that holds only the pseudo-header's sum (left to offload) holds the new
    /// pseudo-header's sum.
    #[test]
    fn a_partial_checksum_stays_the_pseudo_headers_sum() {
        for (mut p, proto, at) in [
            (ipv4_tcp(DEVICE, REMOTE, 0x10, None, b"x"), PROTO_TCP, 36),
            (ipv4_udp(DEVICE, REMOTE, 1, 2, b"xyz"), PROTO_UDP, 26),
        ] {
            let len = p.len() - 20;
            let before = checksum::pseudo_header(DEVICE.into(), REMOTE.into(), proto, len);
            p[at..at + 2].copy_from_slice(&before.to_be_bytes());
            map().outbound(&mut p, Sums::Partial).unwrap();
            let after = checksum::pseudo_header(DEVICE_OVERLAY.into(), REMOTE.into(), proto, len);
            assert_eq!(u16::from_be_bytes([p[at], p[at + 1]]), after);
        }
    }

    /// A router's ICMP error about a packet the device sent (quoting its overlay source)
    /// reaches the device quoting its legacy address; the device's own error about a packet
    /// it received leaves quoting its overlay address. Every checksum, the quote's too,
    /// verifies.
    #[test]
    fn icmp_errors_quote_the_address_their_reader_knows() {
        let m = map();
        let sent = ipv4_udp(DEVICE_OVERLAY, REMOTE, 5000, 33434, b"traceroute probe");
        let mut exceeded = icmp_error(11, [203, 0, 113, 1], DEVICE_OVERLAY, &sent);
        assert!(checksums_ok(&exceeded));
        m.inbound(&mut exceeded, Sums::Full).unwrap();
        let quote = &exceeded[28..];
        assert_eq!((dst(&exceeded), src(quote)), (DEVICE, DEVICE));
        assert!(checksums_ok(&exceeded), "the ICMP message's sum");
        assert!(
            checksums_ok(quote),
            "the quoted header's and segment's sums"
        );

        let received = ipv4_udp(REMOTE, DEVICE, 40000, 9, b"to a closed port");
        let mut unreachable = icmp_error(3, DEVICE, REMOTE, &received);
        m.outbound(&mut unreachable, Sums::Full).unwrap();
        let quote = &unreachable[28..];
        assert_eq!(
            (src(&unreachable), dst(quote)),
            (DEVICE_OVERLAY, DEVICE_OVERLAY)
        );
        assert!(checksums_ok(&unreachable));
        assert!(checksums_ok(quote));

        // An echo quotes nothing: only the outer address moves.
        let mut echo = ipv4_echo(DEVICE, REMOTE, b"ping");
        let body = echo[20..].to_vec();
        m.outbound(&mut echo, Sums::Full).unwrap();
        assert_eq!(&echo[20..], &body[..]);
        assert!(checksums_ok(&echo));
    }

    /// Both fragments of a datagram are rewritten, and the reassembled datagram's UDP
    /// checksum verifies with the new source (only the first carries it).
    #[test]
    fn the_fragments_of_a_datagram_reassemble_with_a_sum_that_verifies() {
        let whole = ipv4_udp(DEVICE, REMOTE, 5000, 6000, &[0x5a; 40]);
        let segment = &whole[20..];
        let fragment = |part: &[u8], offset: u16, more: bool| {
            let mut f = whole[..20].to_vec();
            f.extend_from_slice(part);
            let len = u16::try_from(f.len()).unwrap();
            f[2..4].copy_from_slice(&len.to_be_bytes());
            let flags = (offset / 8) | if more { 0x2000 } else { 0 };
            f[6..8].copy_from_slice(&flags.to_be_bytes());
            f[10..12].fill(0);
            let sum = checksum::internet(&f[..20]);
            f[10..12].copy_from_slice(&sum.to_be_bytes());
            f
        };
        let mut first = fragment(&segment[..24], 0, true);
        let mut second = fragment(&segment[24..], 24, false);
        let m = map();
        m.outbound(&mut first, Sums::Full).unwrap();
        m.outbound(&mut second, Sums::Full).unwrap();
        assert!(header_ok(&first) && header_ok(&second));
        assert_eq!(
            (src(&first), src(&second)),
            (DEVICE_OVERLAY, DEVICE_OVERLAY)
        );
        assert_eq!(
            &second[20..],
            &segment[24..],
            "a later fragment's data is untouched"
        );
        let mut reassembled = first[20..].to_vec();
        reassembled.extend_from_slice(&second[20..]);
        assert!(checksum::transport_valid(
            &reassembled,
            DEVICE_OVERLAY.into(),
            REMOTE.into(),
            PROTO_UDP
        ));
    }

    #[test]
    fn a_packet_outside_the_map_or_malformed_is_left_as_it_was() {
        let m = map();
        let mut other = ipv4_udp([192, 0, 2, 200], REMOTE, 1, 2, b"outside");
        let before = other.clone();
        assert_eq!(m.outbound(&mut other, Sums::Full), Err(Unmapped::Outside));
        assert_eq!(other, before);
        let mut cut = ipv4_udp(DEVICE, REMOTE, 1, 2, b"cut short")[..25].to_vec();
        let before = cut.clone();
        assert_eq!(m.outbound(&mut cut, Sums::Full), Err(Unmapped::Malformed));
        assert_eq!(cut, before);
    }

    proptest! {
        /// Any bytes, either way, either kind of sum: never a panic.
        #[test]
        fn any_bytes_are_rewritten_or_refused_never_a_panic(
            mut bytes in proptest::collection::vec(any::<u8>(), 0..200),
            inbound: bool,
            partial: bool,
        ) {
            let sums = if partial { Sums::Partial } else { Sums::Full };
            let _ = if inbound {
                map().inbound(&mut bytes, sums)
            } else {
                map().outbound(&mut bytes, sums)
            };
        }

        /// Any device of the subnet, any payload: its TCP and UDP leave mapped with sums
        /// that verify, the payload untouched, and the way back undoes the way out.
        #[test]
        fn any_devices_segments_verify_after_mapping(
            host in 0u8..128,
            data in proptest::collection::vec(any::<u8>(), 0..300),
            tcp: bool,
        ) {
            let device = [192, 0, 2, host];
            let m = map();
            let mut p = if tcp {
                ipv4_tcp(device, REMOTE, 0x18, None, &data)
            } else {
                ipv4_udp(device, REMOTE, 4000, 4001, &data)
            };
            let body = p[20..].len();
            m.outbound(&mut p, Sums::Full).unwrap();
            let overlay = m.to_overlay(device.into()).unwrap();
            prop_assert_eq!(src(&p), overlay.octets());
            prop_assert!(checksums_ok(&p));
            prop_assert_eq!(p[20..].len(), body);
            prop_assert_eq!(&p[p.len() - data.len()..], &data[..]);
            prop_assert_eq!(m.to_legacy(overlay), Some(device.into()));
        }
    }
}

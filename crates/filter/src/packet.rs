//! What the filter reads of an IPv4 packet: the flow it belongs to (protocol, addresses,
//! ports or ICMP echo identifier, TCP flags), or, for an ICMP error, the flow of the packet
//! it reports on. Parsed with pnet_packet's bounds-checked views; anything short or strange
//! is `None`.

use std::net::Ipv4Addr;

use pnet_packet::Packet as _;
use pnet_packet::ipv4::Ipv4Packet;

use crate::fragments::{DatagramKey, Piece};
use crate::rules::{ICMP, TCP, UDP};

/// A flow as its first packet travelled: protocol, source and destination, and ports (for
/// ICMP echo both are the echo identifier; other protocols have none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    /// IP protocol number.
    pub proto: u8,
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
}

impl FlowKey {
    /// The key of the answers: addresses and ports swapped.
    pub const fn reversed(self) -> Self {
        Self {
            proto: self.proto,
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
        }
    }
}

pub(crate) const SYN: u8 = 0x02;
pub(crate) const ACK: u8 = 0x10;
pub(crate) const FIN: u8 = 0x01;
pub(crate) const RST: u8 = 0x04;

const ECHO_REPLY: u8 = 0;
const ECHO_REQUEST: u8 = 8;
/// Destination unreachable, source quench, redirect, time exceeded, parameter problem: they
/// carry the header of the packet they are about.
const ICMP_ERRORS: [u8; 5] = [3, 4, 5, 11, 12];

/// The ICMP errors that may answer a flow: destination unreachable (fragmentation needed
/// among them), time exceeded, parameter problem. A redirect is never let through (it
/// would reroute a device's traffic; nothing on the overlay's path is a router that may
/// send one), nor a source quench (deprecated, RFC 6633).
pub(crate) const FLOW_ERRORS: [u8; 3] = [3, 11, 12];

/// An ICMP error, as the filter judges it: the ICMP type, its own addresses, and the flow
/// of the packet it quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IcmpError {
    /// The ICMP type (one of [`ICMP_ERRORS`]).
    pub(crate) kind: u8,
    /// Who sent the error.
    pub(crate) src: Ipv4Addr,
    /// To whom.
    pub(crate) dst: Ipv4Addr,
    /// The flow of the packet it reports on (as that packet travelled); `None` when the
    /// quoted packet can belong to no flow (an ICMP message other than an echo: no error is
    /// sent about an error, RFC 1122 §3.2.2; a later fragment, which has no ports).
    pub(crate) about: Option<FlowKey>,
    /// Longer than any error a host or router sends (RFC 1812 §4.3.2.3: at most 576 bytes),
    /// or itself fragmented: what rides after the quote is not a report.
    pub(crate) oversize: bool,
}

/// What a packet is to the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// A packet of a flow.
    Flow {
        /// Its flow, as this packet travels.
        key: FlowKey,
        /// TCP flags (TCP only).
        flags: u8,
        /// Whether it may open a flow: a TCP SYN without ACK, an ICMP echo request, any UDP
        /// datagram or other protocol's packet.
        opens: bool,
        /// The first fragment of a datagram (more fragments follow): its datagram and place.
        first: Option<(DatagramKey, Piece)>,
    },
    /// An ICMP error.
    IcmpError(IcmpError),
    /// A fragment after the first: no transport header; it belongs to its datagram.
    Fragment {
        /// The datagram.
        datagram: DatagramKey,
        /// Its place in it.
        piece: Piece,
    },
}

/// The longest ICMP error let through, in bytes (RFC 1812 §4.3.2.3: an error quotes as
/// much of the packet as fits in 576 bytes; Linux's `icmp_send` stays within it).
pub(crate) const MAX_ICMP_ERROR: usize = 576;

/// The ports (or echo identifier) and flags of the transport header `l4` of protocol
/// `proto`, at least its first 8 bytes (what an ICMP error quotes).
fn transport(proto: u8, l4: &[u8]) -> Option<(u16, u16, u8)> {
    let word = |at: usize| Some(u16::from_be_bytes([*l4.get(at)?, *l4.get(at + 1)?]));
    match proto {
        TCP | UDP => {
            let flags = if proto == TCP {
                l4.get(13).copied().unwrap_or(0)
            } else {
                0
            };
            Some((word(0)?, word(2)?, flags))
        }
        ICMP => {
            let id = word(4)?;
            Some((id, id, 0))
        }
        _ => Some((0, 0, 0)),
    }
}

/// The place of `packet` (of header length `ihl`) in its datagram when it is a fragment;
/// `Err` when the fragment cannot be a true one: shorter than its length field says,
/// empty, a piece other than the last whose length is not a multiple of 8 (RFC 791), or
/// ending past the 65,535 bytes a datagram can have.
fn fragment_piece(ip: &Ipv4Packet<'_>, packet: &[u8], ihl: usize) -> Result<Option<Piece>, ()> {
    let more = ip.get_flags() & 1 != 0;
    let offset = u32::from(ip.get_fragment_offset()) * 8;
    if !more && offset == 0 {
        return Ok(None);
    }
    let total = usize::from(ip.get_total_length());
    if total < ihl || total > packet.len() {
        return Err(());
    }
    let payload = u32::try_from(total - ihl).map_err(|_| ())?;
    let end = offset + payload;
    let ihl = u32::try_from(ihl).map_err(|_| ())?;
    if payload == 0 || (more && payload % 8 != 0) || ihl + end > 65_535 {
        return Err(());
    }
    Ok(Some(Piece { offset, end, more }))
}

/// Reads `packet` (an IPv4 packet, header first).
pub(crate) fn parse(packet: &[u8]) -> Option<Seen> {
    let ip = Ipv4Packet::new(packet)?;
    let ihl = usize::from(ip.get_header_length()) * 4;
    if ip.get_version() != 4 || ihl < 20 || packet.len() < ihl {
        return None;
    }
    let proto = ip.get_next_level_protocol().0;
    let (src, dst) = (ip.get_source(), ip.get_destination());
    let piece = fragment_piece(&ip, packet, ihl).ok()?;
    let datagram = DatagramKey {
        proto,
        src,
        dst,
        id: ip.get_identification(),
    };
    if let Some(piece) = piece.filter(|p| p.offset != 0) {
        return Some(Seen::Fragment { datagram, piece });
    }
    let first = piece.map(|p| (datagram, p));
    let l4 = ip.payload();
    if proto == ICMP {
        let kind = *l4.first()?;
        if ICMP_ERRORS.contains(&kind) {
            let len = usize::from(ip.get_total_length()).max(packet.len());
            return Some(Seen::IcmpError(IcmpError {
                kind,
                src,
                dst,
                about: quoted_flow(l4.get(8..)?)?,
                oversize: len > MAX_ICMP_ERROR || first.is_some(),
            }));
        }
        let (sport, dport, _) = transport(ICMP, l4)?;
        return Some(Seen::Flow {
            key: FlowKey {
                proto,
                src,
                dst,
                sport,
                dport,
            },
            flags: 0,
            opens: kind == ECHO_REQUEST,
            first,
        })
        .filter(|_| kind == ECHO_REQUEST || kind == ECHO_REPLY);
    }
    // A whole transport header (an ICMP error quotes only its first 8 bytes; a packet
    // carries all of it).
    let whole = match proto {
        TCP => 20,
        UDP => 8,
        _ => 0,
    };
    if l4.len() < whole {
        return None;
    }
    let (sport, dport, flags) = transport(proto, l4)?;
    let opens = proto != TCP || flags & (SYN | ACK) == SYN;
    Some(Seen::Flow {
        key: FlowKey {
            proto,
            src,
            dst,
            sport,
            dport,
        },
        flags,
        opens,
        first,
    })
}

/// The flow of the packet an ICMP error quotes (its header and at least 8 bytes of what
/// followed): `Some(None)` when that packet can belong to no flow, `None` when the quote
/// cannot be read.
fn quoted_flow(quoted: &[u8]) -> Option<Option<FlowKey>> {
    let inner = Ipv4Packet::new(quoted)?;
    let inner_ihl = usize::from(inner.get_header_length()) * 4;
    if inner.get_version() != 4 || inner_ihl < 20 {
        return None;
    }
    let inner_proto = inner.get_next_level_protocol().0;
    let l4 = quoted.get(inner_ihl..)?;
    let (sport, dport, _) = transport(inner_proto, l4)?;
    let later_fragment = inner.get_fragment_offset() != 0;
    let not_echo = inner_proto == ICMP && !matches!(l4.first(), Some(&ECHO_REQUEST | &ECHO_REPLY));
    if later_fragment || not_echo {
        return Some(None);
    }
    Some(Some(FlowKey {
        proto: inner_proto,
        src: inner.get_source(),
        dst: inner.get_destination(),
        sport,
        dport,
    }))
}

/// The flow `packet` (an IPv4 packet) belongs to, for scheduling rather than policy: its
/// protocol, addresses and ports (for ICMP echo the identifier; for other protocols and ICMP
/// errors none). Every fragment of a datagram, the first included, gets the key without
/// ports, so that a datagram's fragments stay one flow. `None` for anything but IPv4.
/// Reads fixed offsets only: no options are walked, nothing is verified.
pub fn flow_of(packet: &[u8]) -> Option<FlowKey> {
    let ip = Ipv4Packet::new(packet)?;
    let ihl = usize::from(ip.get_header_length()) * 4;
    if ip.get_version() != 4 || ihl < 20 {
        return None;
    }
    let proto = ip.get_next_level_protocol().0;
    let fragment = ip.get_fragment_offset() != 0 || ip.get_flags() & 1 != 0;
    let (sport, dport) = match (fragment, packet.get(ihl..)) {
        (false, Some(l4)) if proto == TCP || proto == UDP || proto == ICMP => {
            let (s, d, _) = transport(proto, l4).unwrap_or((0, 0, 0));
            if proto == ICMP && ICMP_ERRORS.contains(&l4.first().copied().unwrap_or(0)) {
                (0, 0)
            } else {
                (s, d)
            }
        }
        _ => (0, 0),
    };
    Some(FlowKey {
        proto,
        src: ip.get_source(),
        dst: ip.get_destination(),
        sport,
        dport,
    })
}

#[cfg(test)]
mod flow_tests {
    use super::testing::{ipv4, tcp};
    use super::*;

    #[test]
    fn a_flow_is_its_five_tuple_and_fragments_stay_together() {
        let (a, b) = (Ipv4Addr::new(100, 64, 0, 2), Ipv4Addr::new(100, 64, 1, 2));
        let key = |proto, sport, dport| FlowKey {
            proto,
            src: a,
            dst: b,
            sport,
            dport,
        };
        assert_eq!(flow_of(&tcp(a, 4000, b, 22, ACK)), Some(key(TCP, 4000, 22)));
        let echo = ipv4(ICMP, a, b, &[8, 0, 0, 0, 0x12, 0x34, 0, 1]);
        assert_eq!(flow_of(&echo), Some(key(ICMP, 0x1234, 0x1234)));
        let error = ipv4(ICMP, a, b, &[3, 4, 0, 0, 0, 0, 5, 0x78]);
        assert_eq!(flow_of(&error), Some(key(ICMP, 0, 0)));
        // A first fragment (more fragments set) and a later one: the same flow, no ports.
        let mut first = ipv4(UDP, a, b, &[0x0f, 0xa0, 0, 53, 0, 8, 0, 0]);
        first[6] = 0x20;
        let mut later = ipv4(UDP, a, b, &[1, 2, 3, 4, 5, 6, 7, 8]);
        later[7] = 0xb9;
        assert_eq!(flow_of(&first), Some(key(UDP, 0, 0)));
        assert_eq!(flow_of(&later), Some(key(UDP, 0, 0)));
        assert_eq!(flow_of(&[0x60; 40]), None);
        assert_eq!(flow_of(&[0x45; 3]), None);
        assert_eq!(flow_of(&[0x41; 40]), None);
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! IPv4 packets for the tests.

    use std::net::Ipv4Addr;

    /// An IPv4 packet of `proto` from `src` to `dst` with the transport bytes `l4`.
    pub(crate) fn ipv4(proto: u8, src: Ipv4Addr, dst: Ipv4Addr, l4: &[u8]) -> Vec<u8> {
        let len = u16::try_from(20 + l4.len()).unwrap_or(u16::MAX);
        let mut p = vec![0x45, 0, 0, 0, 0, 1, 0, 0, 64, proto, 0, 0];
        p[2..4].copy_from_slice(&len.to_be_bytes());
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(l4);
        p
    }

    /// A TCP segment with `flags`.
    pub(crate) fn tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, flags: u8) -> Vec<u8> {
        tcp_with(src, sport, dst, dport, flags, &[])
    }

    /// A TCP segment with `flags` carrying `data`.
    pub(crate) fn tcp_with(
        src: Ipv4Addr,
        sport: u16,
        dst: Ipv4Addr,
        dport: u16,
        flags: u8,
        data: &[u8],
    ) -> Vec<u8> {
        let mut l4 = vec![0u8; 20];
        l4[0..2].copy_from_slice(&sport.to_be_bytes());
        l4[2..4].copy_from_slice(&dport.to_be_bytes());
        l4[12] = 0x50;
        l4[13] = flags;
        l4.extend_from_slice(data);
        ipv4(6, src, dst, &l4)
    }

    /// A UDP datagram.
    pub(crate) fn udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
        udp_with(src, sport, dst, dport, &[0; 4])
    }

    /// A UDP datagram carrying `data`.
    pub(crate) fn udp_with(
        src: Ipv4Addr,
        sport: u16,
        dst: Ipv4Addr,
        dport: u16,
        data: &[u8],
    ) -> Vec<u8> {
        let len = u16::try_from(8 + data.len()).unwrap_or(u16::MAX);
        let mut l4 = vec![0u8; 8];
        l4[0..2].copy_from_slice(&sport.to_be_bytes());
        l4[2..4].copy_from_slice(&dport.to_be_bytes());
        l4[4..6].copy_from_slice(&len.to_be_bytes());
        l4.extend_from_slice(data);
        ipv4(17, src, dst, &l4)
    }

    /// `packet` made a fragment: IP identification `id`, its payload at byte `offset` of
    /// its datagram, more fragments following when `more`.
    pub(crate) fn frag(mut packet: Vec<u8>, id: u16, offset: u32, more: bool) -> Vec<u8> {
        let field = u16::try_from(offset / 8).unwrap_or(0x1fff) | if more { 0x2000 } else { 0 };
        packet[4..6].copy_from_slice(&id.to_be_bytes());
        packet[6..8].copy_from_slice(&field.to_be_bytes());
        packet
    }

    /// A later fragment of protocol `proto`: `payload` at byte `offset` of datagram `id`.
    pub(crate) fn fragment(
        proto: u8,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        id: u16,
        offset: u32,
        payload: &[u8],
        more: bool,
    ) -> Vec<u8> {
        frag(ipv4(proto, src, dst, payload), id, offset, more)
    }

    /// An ICMP echo request (`reply`: an echo reply) with identifier `id`.
    pub(crate) fn echo(src: Ipv4Addr, dst: Ipv4Addr, id: u16, reply: bool) -> Vec<u8> {
        let mut l4 = vec![if reply { 0 } else { 8 }, 0, 0, 0, 0, 0, 0, 1];
        l4[4..6].copy_from_slice(&id.to_be_bytes());
        ipv4(1, src, dst, &l4)
    }

    /// An ICMP error of `kind` from `from` to `to` quoting `about` (a packet).
    pub(crate) fn icmp_error(from: Ipv4Addr, to: Ipv4Addr, kind: u8, about: &[u8]) -> Vec<u8> {
        icmp_error_with(from, to, kind, about, &[])
    }

    /// [`icmp_error`] with `extra` bytes after the quote.
    pub(crate) fn icmp_error_with(
        from: Ipv4Addr,
        to: Ipv4Addr,
        kind: u8,
        about: &[u8],
        extra: &[u8],
    ) -> Vec<u8> {
        let mut l4 = vec![kind, 0, 0, 0, 0, 0, 0, 0];
        l4.extend_from_slice(&about[..about.len().min(28)]);
        l4.extend_from_slice(extra);
        ipv4(1, from, to, &l4)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(100, 64, 1, 9);
    const B: Ipv4Addr = Ipv4Addr::new(100, 64, 2, 7);

    #[test]
    fn packets_read_as_flows_errors_and_fragments() {
        let syn = parse(&tcp(A, 40000, B, 22, SYN));
        assert!(
            matches!(syn, Some(Seen::Flow { opens: true, flags: SYN, key, first: None }) if key.dport == 22 && key.sport == 40000)
        );
        let synack = parse(&tcp(B, 22, A, 40000, SYN | ACK));
        assert!(matches!(synack, Some(Seen::Flow { opens: false, .. })));
        let data = parse(&tcp(A, 40000, B, 22, ACK));
        assert!(matches!(data, Some(Seen::Flow { opens: false, .. })));
        assert!(matches!(
            parse(&udp(A, 5000, B, 53)),
            Some(Seen::Flow { opens: true, .. })
        ));
        let Some(Seen::Flow {
            key: req,
            opens: true,
            ..
        }) = parse(&echo(A, B, 77, false))
        else {
            panic!("an echo request opens");
        };
        let Some(Seen::Flow {
            key: rep,
            opens: false,
            ..
        }) = parse(&echo(B, A, 77, true))
        else {
            panic!("an echo reply does not");
        };
        assert_eq!(rep, req.reversed());
        // An ICMP error names the flow of the packet it quotes.
        let quoted = udp(A, 5000, B, 53);
        let err = parse(&icmp_error(B, A, 3, &quoted));
        assert_eq!(
            err,
            Some(Seen::IcmpError(IcmpError {
                kind: 3,
                src: B,
                dst: A,
                about: Some(FlowKey {
                    proto: UDP,
                    src: A,
                    dst: B,
                    sport: 5000,
                    dport: 53
                }),
                oversize: false,
            }))
        );
        // A later fragment: its datagram and its place in it.
        let later = frag(udp(A, 5000, B, 53), 9, 128, false);
        let datagram = DatagramKey {
            proto: UDP,
            src: A,
            dst: B,
            id: 9,
        };
        let piece = |offset, end, more| Piece { offset, end, more };
        assert_eq!(
            parse(&later),
            Some(Seen::Fragment {
                datagram,
                piece: piece(128, 140, false)
            })
        );
        // A first fragment is a flow's packet that names its datagram.
        let first = frag(udp_with(A, 5000, B, 53, &[0; 8]), 9, 0, true);
        assert!(matches!(
            parse(&first),
            Some(Seen::Flow { first: Some((d, p)), .. }) if d == datagram && p == piece(0, 16, true)
        ));
        // Fragments that cannot be: past the 65,535 bytes of a datagram, not a multiple of
        // 8 before the last, empty, longer than their length field says.
        assert_eq!(parse(&frag(udp(A, 1, B, 2), 9, 8191 * 8, false)), None);
        assert_eq!(parse(&frag(ipv4(UDP, A, B, &[0; 7]), 9, 8, true)), None);
        assert_eq!(parse(&frag(ipv4(UDP, A, B, &[]), 9, 8, false)), None);
        let mut short = frag(udp(A, 1, B, 2), 9, 8, false);
        short.truncate(25);
        assert_eq!(parse(&short), None);
        // Short, not IPv4, other ICMP: nothing.
        assert_eq!(parse(&[0x45, 0, 0]), None);
        assert_eq!(parse(&tcp(A, 1, B, 2, SYN)[..24]), None);
        let mut v6 = udp(A, 1, B, 2);
        v6[0] = 0x65;
        assert_eq!(parse(&v6), None);
        assert_eq!(parse(&ipv4(ICMP, A, B, &[13, 0, 0, 0, 0, 0, 0, 0])), None);
    }

    proptest::proptest! {
        /// Any bytes: an answer or `None`, never a panic.
        #[test]
        fn any_bytes_parse_without_panicking(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            let _ = parse(&bytes);
        }
    }
}

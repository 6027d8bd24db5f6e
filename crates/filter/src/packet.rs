//! What the filter reads of an IPv4 packet: the flow it belongs to (protocol, addresses,
//! ports or ICMP echo identifier, TCP flags), or, for an ICMP error, the flow of the packet
//! it reports on. Parsed with pnet_packet's bounds-checked views; anything short or strange
//! is `None`.

use std::net::Ipv4Addr;

use pnet_packet::Packet as _;
use pnet_packet::ipv4::Ipv4Packet;

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
    },
    /// An ICMP error about the packet whose flow is `about` (as that packet travelled).
    IcmpError {
        /// The flow of the packet it reports on.
        about: FlowKey,
    },
    /// A fragment after the first: no transport header; it belongs to a flow between these.
    Fragment {
        /// IP protocol number.
        proto: u8,
        /// Source.
        src: Ipv4Addr,
        /// Destination.
        dst: Ipv4Addr,
    },
}

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

/// Reads `packet` (an IPv4 packet, header first).
pub(crate) fn parse(packet: &[u8]) -> Option<Seen> {
    let ip = Ipv4Packet::new(packet)?;
    let ihl = usize::from(ip.get_header_length()) * 4;
    if ip.get_version() != 4 || ihl < 20 || packet.len() < ihl {
        return None;
    }
    let proto = ip.get_next_level_protocol().0;
    let (src, dst) = (ip.get_source(), ip.get_destination());
    if ip.get_fragment_offset() != 0 {
        return Some(Seen::Fragment { proto, src, dst });
    }
    let l4 = ip.payload();
    if proto == ICMP {
        let kind = *l4.first()?;
        if ICMP_ERRORS.contains(&kind) {
            // The quoted header, and at least 8 bytes of what followed it.
            let quoted = l4.get(8..)?;
            let inner = Ipv4Packet::new(quoted)?;
            let inner_ihl = usize::from(inner.get_header_length()) * 4;
            if inner.get_version() != 4 || inner_ihl < 20 {
                return None;
            }
            let inner_proto = inner.get_next_level_protocol().0;
            let (sport, dport, _) = transport(inner_proto, quoted.get(inner_ihl..)?)?;
            return Some(Seen::IcmpError {
                about: FlowKey {
                    proto: inner_proto,
                    src: inner.get_source(),
                    dst: inner.get_destination(),
                    sport,
                    dport,
                },
            });
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
    })
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
        let mut l4 = vec![0u8; 20];
        l4[0..2].copy_from_slice(&sport.to_be_bytes());
        l4[2..4].copy_from_slice(&dport.to_be_bytes());
        l4[12] = 0x50;
        l4[13] = flags;
        ipv4(6, src, dst, &l4)
    }

    /// A UDP datagram.
    pub(crate) fn udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
        let mut l4 = vec![0u8; 12];
        l4[0..2].copy_from_slice(&sport.to_be_bytes());
        l4[2..4].copy_from_slice(&dport.to_be_bytes());
        l4[4..6].copy_from_slice(&12u16.to_be_bytes());
        ipv4(17, src, dst, &l4)
    }

    /// An ICMP echo request (`reply`: an echo reply) with identifier `id`.
    pub(crate) fn echo(src: Ipv4Addr, dst: Ipv4Addr, id: u16, reply: bool) -> Vec<u8> {
        let mut l4 = vec![if reply { 0 } else { 8 }, 0, 0, 0, 0, 0, 0, 1];
        l4[4..6].copy_from_slice(&id.to_be_bytes());
        ipv4(1, src, dst, &l4)
    }

    /// An ICMP error of `kind` from `from` to `to` quoting `about` (a packet).
    pub(crate) fn icmp_error(from: Ipv4Addr, to: Ipv4Addr, kind: u8, about: &[u8]) -> Vec<u8> {
        let mut l4 = vec![kind, 0, 0, 0, 0, 0, 0, 0];
        l4.extend_from_slice(&about[..about.len().min(28)]);
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
            matches!(syn, Some(Seen::Flow { opens: true, flags: SYN, key }) if key.dport == 22 && key.sport == 40000)
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
            Some(Seen::IcmpError {
                about: FlowKey {
                    proto: UDP,
                    src: A,
                    dst: B,
                    sport: 5000,
                    dport: 53
                }
            })
        );
        // A later fragment.
        let mut frag = udp(A, 5000, B, 53);
        frag[6] = 0x00;
        frag[7] = 0x10;
        assert_eq!(
            parse(&frag),
            Some(Seen::Fragment {
                proto: UDP,
                src: A,
                dst: B
            })
        );
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

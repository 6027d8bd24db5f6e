//! What the filter reads of an IPv4 or IPv6 packet: the flow it belongs to (protocol,
//! addresses, ports or ICMP echo identifier, TCP flags), or, for an ICMP error, the flow of
//! the packet it reports on. IPv4 is parsed with pnet_packet's bounds-checked views, IPv6's
//! fixed header too; IPv6's extension headers are walked here, bounded (docs/protocol.md §7,
//! *The tunnel and the filter*). Anything short or strange is `None`.

use std::net::IpAddr;

use pnet_packet::Packet as _;
use pnet_packet::ipv4::Ipv4Packet;
use pnet_packet::ipv6::Ipv6Packet;

use crate::fragments::{DatagramKey, Piece};
use crate::rules::{ICMP, ICMPV6, TCP, UDP, bits};

/// A flow as its first packet travelled: protocol, source and destination, and ports (for
/// ICMP echo both are the echo identifier; other protocols have none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FlowKey {
    /// IP protocol number.
    pub proto: u8,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
}

/// Hashed as a few whole words (an IPv4 key as two): the flow table hashes two keys a packet
/// with SipHash, whose cost grows with each write, and `IpAddr`'s own hash writes its
/// variant, its length and its bytes apart.
impl core::hash::Hash for FlowKey {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        let ports =
            u64::from(self.proto) << 32 | u64::from(self.sport) << 16 | u64::from(self.dport);
        match (self.src, self.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                state.write_u64(u64::from(src.to_bits()) << 32 | u64::from(dst.to_bits()));
                state.write_u64(ports);
            }
            (src, dst) => {
                state.write_u128(bits(src));
                state.write_u128(bits(dst));
                state.write_u64(ports | 1 << 63);
            }
        }
    }
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

const ECHO_REQUEST_V6: u8 = 128;
const ECHO_REPLY_V6: u8 = 129;
/// The ICMPv6 errors that may answer a flow: destination unreachable, packet too big, time
/// exceeded, parameter problem (RFC 4443 §3). Every type below 128 is an error.
const FLOW_ERRORS_V6: [u8; 4] = [1, 2, 3, 4];

/// What the filter knows of ICMP for one IP version, in one place for both: its protocol
/// number, its echo types, which of its types are errors and which of those may answer a
/// flow, and the longest error let through.
struct Icmp {
    proto: u8,
    request: u8,
    reply: u8,
    flow_errors: &'static [u8],
    longest: usize,
    v6: bool,
}

impl Icmp {
    const V4: Self = Self {
        proto: ICMP,
        request: ECHO_REQUEST,
        reply: ECHO_REPLY,
        flow_errors: &FLOW_ERRORS,
        longest: MAX_ICMP_ERROR,
        v6: false,
    };
    const V6: Self = Self {
        proto: ICMPV6,
        request: ECHO_REQUEST_V6,
        reply: ECHO_REPLY_V6,
        flow_errors: &FLOW_ERRORS_V6,
        longest: MAX_ICMPV6_ERROR,
        v6: true,
    };

    /// The version of `addr`.
    const fn of(addr: IpAddr) -> &'static Self {
        if addr.is_ipv6() { &Self::V6 } else { &Self::V4 }
    }

    /// Whether a message of type `kind` is an error (it quotes the packet it is about).
    fn is_error(&self, kind: u8) -> bool {
        if self.v6 {
            kind < 128
        } else {
            ICMP_ERRORS.contains(&kind)
        }
    }

    /// Whether a message of type `kind` is an echo request or reply.
    const fn is_echo(&self, kind: u8) -> bool {
        kind == self.request || kind == self.reply
    }
}

/// An ICMP error, as the filter judges it: the ICMP type, its own addresses, and the flow
/// of the packet it quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IcmpError {
    /// The ICMP type (one of [`ICMP_ERRORS`]; for ICMPv6, below 128).
    pub(crate) kind: u8,
    /// Who sent the error.
    pub(crate) src: IpAddr,
    /// To whom.
    pub(crate) dst: IpAddr,
    /// The flow of the packet it reports on (as that packet travelled); `None` when the
    /// quoted packet can belong to no flow (an ICMP message other than an echo: no error is
    /// sent about an error, RFC 1122 §3.2.2; a later fragment, which has no ports).
    pub(crate) about: Option<FlowKey>,
    /// Longer than any error a host or router sends (RFC 1812 §4.3.2.3: at most 576 bytes;
    /// RFC 4443 §2.4: ICMPv6 at most 1280), or itself fragmented: what rides after the
    /// quote is not a report.
    pub(crate) oversize: bool,
}

impl IcmpError {
    /// Whether its type may answer a flow ([`FLOW_ERRORS`], for ICMPv6 `FLOW_ERRORS_V6`).
    pub(crate) fn answers_flows(&self) -> bool {
        Icmp::of(self.src).flow_errors.contains(&self.kind)
    }
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
    /// An IPv6 packet whose extension headers the filter refuses (a Routing header, options
    /// other than padding, a chain too long or of a header it does not walk, a first
    /// fragment without the whole chain).
    Refused,
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
/// The longest ICMPv6 error let through: the IPv6 minimum MTU (RFC 4443 §2.4 (c)).
const MAX_ICMPV6_ERROR: usize = 1280;

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
        ICMP | ICMPV6 => {
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

/// Reads `packet` (an IPv4 or IPv6 packet, header first).
pub(crate) fn parse(packet: &[u8]) -> Option<Seen> {
    match packet.first()? >> 4 {
        4 => parse4(packet),
        6 => parse6(packet),
        _ => None,
    }
}

fn parse4(packet: &[u8]) -> Option<Seen> {
    let ip = Ipv4Packet::new(packet)?;
    let ihl = usize::from(ip.get_header_length()) * 4;
    if ip.get_version() != 4 || ihl < 20 || packet.len() < ihl {
        return None;
    }
    let proto = ip.get_next_level_protocol().0;
    let (src, dst) = (ip.get_source().into(), ip.get_destination().into());
    let piece = fragment_piece(&ip, packet, ihl).ok()?;
    let datagram = DatagramKey {
        proto,
        src,
        dst,
        id: u32::from(ip.get_identification()),
    };
    if let Some(piece) = piece.filter(|p| p.offset != 0) {
        return Some(Seen::Fragment { datagram, piece });
    }
    let first = piece.map(|p| (datagram, p));
    let len = usize::from(ip.get_total_length()).max(packet.len());
    upper(proto, src, dst, ip.payload(), first, len)
}

/// What a packet is by its upper-layer header `l4` of protocol `proto`, from `src` to
/// `dst`: `first` when it is a first fragment, `len` its length (for an ICMP error).
fn upper(
    proto: u8,
    src: IpAddr,
    dst: IpAddr,
    l4: &[u8],
    first: Option<(DatagramKey, Piece)>,
    len: usize,
) -> Option<Seen> {
    let icmp = Icmp::of(src);
    if proto == icmp.proto {
        let kind = *l4.first()?;
        if icmp.is_error(kind) {
            return Some(Seen::IcmpError(IcmpError {
                kind,
                src,
                dst,
                about: quoted_flow(l4.get(8..)?)?,
                oversize: len > icmp.longest || first.is_some(),
            }));
        }
        let (sport, dport, _) = transport(proto, l4)?;
        return Some(Seen::Flow {
            key: FlowKey {
                proto,
                src,
                dst,
                sport,
                dport,
            },
            flags: 0,
            opens: kind == icmp.request,
            first,
        })
        .filter(|_| icmp.is_echo(kind));
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

const HOP_BY_HOP: u8 = 0;
const ROUTING: u8 = 43;
const FRAGMENT: u8 = 44;
const DESTINATION_OPTIONS: u8 = 60;
/// Extension headers (IANA's list, RFC 7045) the filter does not walk: Mobility, HIP,
/// Shim6 and the two for experiments. ESP and AH are carried as protocols without ports.
const UNWALKED: [u8; 5] = [135, 139, 140, 253, 254];
/// At most this many extension headers before the upper layer (RFC 9288 §3.5 leaves the
/// limit to the operator; 8 covers every real use, Linux's default limit too).
const MAX_EXTENSIONS: usize = 8;
/// At most this many bytes of extension headers before the upper layer.
const MAX_CHAIN: usize = 256;

/// An IPv6 packet's header chain, walked to its upper layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chain {
    /// The upper-layer protocol (for a later fragment: the Fragment header's next header).
    proto: u8,
    /// Where the upper-layer header starts (for a later fragment: where its piece does).
    at: usize,
    /// Its Fragment header, unless it is not a fragment (an atomic fragment is not).
    fragment: Option<Fragment>,
}

/// A fragment's Fragment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fragment {
    /// Its next header: the same in every fragment of the datagram.
    next: u8,
    /// The datagram's identification.
    id: u32,
    /// The piece's offset in the datagram, bytes.
    offset: u32,
    /// More fragments follow.
    more: bool,
    /// Where the piece starts in the packet (just after the Fragment header).
    start: usize,
}

/// Why a chain is not walked to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broken {
    /// The packet ends inside it.
    Cut,
    /// A header the filter refuses, or a first fragment that ends inside its chain (RFC
    /// 7112: the whole chain must be in the first fragment).
    Refused,
}

/// Walks the extension headers of `packet` (an IPv6 packet of at least 40 bytes) from its
/// fixed header's next header: Hop-by-Hop first only, Hop-by-Hop and Destination Options
/// with padding only (Pad1, PadN), one Fragment header, no Routing header (RFC 5095's
/// reasoning: the overlay has no use for source routing), none of [`UNWALKED`], at most
/// [`MAX_EXTENSIONS`] headers and [`MAX_CHAIN`] bytes. It stops at the upper layer, or
/// after the Fragment header of a later fragment (what follows is not headers).
fn walk(packet: &[u8]) -> Result<Chain, Broken> {
    let mut next = *packet.get(6).ok_or(Broken::Cut)?;
    let mut at = 40;
    let mut fragment = None;
    // What a chain that ends too soon is: cut, or, past a first fragment's header, refused.
    let mut cut = Broken::Cut;
    for count in 0..=MAX_EXTENSIONS {
        match next {
            HOP_BY_HOP | DESTINATION_OPTIONS => {
                if next == HOP_BY_HOP && at != 40 {
                    return Err(Broken::Refused);
                }
                let len = usize::from(*packet.get(at + 1).ok_or(cut)?) * 8 + 8;
                let options = packet.get(at + 2..at + len).ok_or(cut)?;
                padding_only(options)?;
                next = packet[at];
                at += len;
            }
            FRAGMENT => {
                let header = packet.get(at..at + 8).ok_or(cut)?;
                if fragment.is_some() {
                    return Err(Broken::Refused);
                }
                let field = u16::from_be_bytes([header[2], header[3]]);
                let (offset, more) = (u32::from(field & !7), field & 1 != 0);
                let id = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
                next = header[0];
                at += 8;
                // An atomic fragment (offset 0, no more) is the whole packet (RFC 6946).
                if offset != 0 || more {
                    cut = Broken::Refused;
                    fragment = Some(Fragment {
                        next,
                        id,
                        offset,
                        more,
                        start: at,
                    });
                }
                if offset != 0 {
                    return Ok(Chain {
                        proto: next,
                        at,
                        fragment,
                    });
                }
            }
            ROUTING => return Err(Broken::Refused),
            n if UNWALKED.contains(&n) => return Err(Broken::Refused),
            proto => {
                return Ok(Chain {
                    proto,
                    at,
                    fragment,
                });
            }
        }
        if at - 40 > MAX_CHAIN || count == MAX_EXTENSIONS {
            return Err(Broken::Refused);
        }
    }
    Err(Broken::Refused)
}

/// `Ok` when `options` (of a Hop-by-Hop or Destination Options header) are Pad1 and PadN
/// only, exactly filling it.
fn padding_only(options: &[u8]) -> Result<(), Broken> {
    let mut i = 0;
    while i < options.len() {
        match options[i] {
            0 => i += 1,
            1 => i += 2 + usize::from(*options.get(i + 1).ok_or(Broken::Refused)?),
            _ => return Err(Broken::Refused),
        }
    }
    if i == options.len() {
        Ok(())
    } else {
        Err(Broken::Refused)
    }
}

fn parse6(packet: &[u8]) -> Option<Seen> {
    let ip = Ipv6Packet::new(packet)?;
    let total = 40 + usize::from(ip.get_payload_length());
    if ip.get_version() != 6 || total > packet.len() {
        return None;
    }
    let packet = &packet[..total];
    let (src, dst) = (ip.get_source().into(), ip.get_destination().into());
    let chain = match walk(packet) {
        Ok(chain) => chain,
        Err(Broken::Refused) => return Some(Seen::Refused),
        Err(Broken::Cut) => return None,
    };
    let mut first = None;
    if let Some(f) = chain.fragment {
        let datagram = DatagramKey {
            proto: f.next,
            src,
            dst,
            id: f.id,
        };
        // The piece: what follows the Fragment header (in a first fragment, the rest of
        // the chain with it, as a receiver counts it).
        let payload = u32::try_from(total - f.start).ok()?;
        let end = f.offset + payload;
        if payload == 0 || (f.more && payload % 8 != 0) || end > 65_535 {
            return None;
        }
        let piece = Piece {
            offset: f.offset,
            end,
            more: f.more,
        };
        if f.offset != 0 {
            return Some(Seen::Fragment { datagram, piece });
        }
        first = Some((datagram, piece));
    }
    let l4 = &packet[chain.at..];
    // A first fragment must hold the whole chain and the upper-layer header (RFC 7112).
    let whole = match chain.proto {
        TCP => 20,
        UDP | ICMPV6 => 8,
        _ => 0,
    };
    if first.is_some() && l4.len() < whole {
        return Some(Seen::Refused);
    }
    upper(chain.proto, src, dst, l4, first, total)
}

/// The flow of the packet an ICMP error quotes (its header and at least 8 bytes of what
/// followed): `Some(None)` when that packet can belong to no flow, `None` when the quote
/// cannot be read.
fn quoted_flow(quoted: &[u8]) -> Option<Option<FlowKey>> {
    match quoted.first()? >> 4 {
        4 => quoted_flow4(quoted),
        6 => quoted_flow6(quoted),
        _ => None,
    }
}

fn quoted_flow4(quoted: &[u8]) -> Option<Option<FlowKey>> {
    let inner = Ipv4Packet::new(quoted)?;
    let inner_ihl = usize::from(inner.get_header_length()) * 4;
    if inner.get_version() != 4 || inner_ihl < 20 {
        return None;
    }
    let inner_proto = inner.get_next_level_protocol().0;
    let l4 = quoted.get(inner_ihl..)?;
    let (sport, dport, _) = transport(inner_proto, l4)?;
    let later_fragment = inner.get_fragment_offset() != 0;
    let not_echo = inner_proto == ICMP && !l4.first().is_some_and(|k| Icmp::V4.is_echo(*k));
    if later_fragment || not_echo {
        return Some(None);
    }
    Some(Some(FlowKey {
        proto: inner_proto,
        src: inner.get_source().into(),
        dst: inner.get_destination().into(),
        sport,
        dport,
    }))
}

fn quoted_flow6(quoted: &[u8]) -> Option<Option<FlowKey>> {
    let inner = Ipv6Packet::new(quoted)?;
    // The quote is cut where the error ran out of room: its length field says more.
    let chain = walk(quoted).ok()?;
    if chain.fragment.is_some_and(|f| f.offset != 0) {
        return Some(None);
    }
    let l4 = quoted.get(chain.at..)?;
    let (sport, dport, _) = transport(chain.proto, l4)?;
    let not_echo = chain.proto == ICMPV6 && !l4.first().is_some_and(|k| Icmp::V6.is_echo(*k));
    if not_echo {
        return Some(None);
    }
    Some(Some(FlowKey {
        proto: chain.proto,
        src: inner.get_source().into(),
        dst: inner.get_destination().into(),
        sport,
        dport,
    }))
}

/// The flow `packet` (an IPv4 or IPv6 packet) belongs to, for scheduling rather than
/// policy: its protocol, addresses and ports (for ICMP echo the identifier; for other
/// protocols and ICMP errors none). Every fragment of a datagram, the first included, gets
/// the key without ports, so that a datagram's fragments stay one flow. `None` for anything
/// but IPv4 and IPv6. Reads fixed offsets only: no options or extension headers are walked
/// (an IPv6 packet with any is keyed by its addresses and first next header), nothing is
/// verified.
pub fn flow_of(packet: &[u8]) -> Option<FlowKey> {
    let (proto, src, dst, fragment, l4_at): (u8, IpAddr, IpAddr, bool, usize) =
        match packet.first()? >> 4 {
            4 => {
                let ip = Ipv4Packet::new(packet)?;
                let ihl = usize::from(ip.get_header_length()) * 4;
                if ihl < 20 {
                    return None;
                }
                let fragment = ip.get_fragment_offset() != 0 || ip.get_flags() & 1 != 0;
                let (src, dst) = (ip.get_source().into(), ip.get_destination().into());
                (ip.get_next_level_protocol().0, src, dst, fragment, ihl)
            }
            6 => {
                let ip = Ipv6Packet::new(packet)?;
                let (src, dst) = (ip.get_source().into(), ip.get_destination().into());
                (ip.get_next_header().0, src, dst, false, 40)
            }
            _ => return None,
        };
    let icmp = Icmp::of(src);
    let (sport, dport) = match (fragment, packet.get(l4_at..)) {
        (false, Some(l4)) if proto == TCP || proto == UDP || proto == icmp.proto => {
            let (s, d, _) = transport(proto, l4).unwrap_or((0, 0, 0));
            if proto == icmp.proto && icmp.is_error(l4.first().copied().unwrap_or(0)) {
                (0, 0)
            } else {
                (s, d)
            }
        }
        _ => (0, 0),
    };
    Some(FlowKey {
        proto,
        src,
        dst,
        sport,
        dport,
    })
}

#[cfg(test)]
mod flow_tests {
    use std::net::Ipv4Addr;

    use super::testing::{ipv4, tcp};
    use super::*;

    #[test]
    fn a_flow_is_its_five_tuple_and_fragments_stay_together() {
        let (a, b) = (Ipv4Addr::new(100, 64, 0, 2), Ipv4Addr::new(100, 64, 1, 2));
        let key = |proto, sport, dport| FlowKey {
            proto,
            src: a.into(),
            dst: b.into(),
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
        assert_eq!(flow_of(&[0x50; 40]), None);
        assert_eq!(flow_of(&[0x45; 3]), None);
        assert_eq!(flow_of(&[0x41; 40]), None);
        assert_eq!(flow_of(&[0x60; 39]), None);
    }

    #[test]
    fn an_ipv6_flow_is_its_five_tuple_and_fragments_stay_together() {
        use super::testing::{V6A, V6B, ext, fragment6, ipv6, udp6};
        let key = |proto, sport, dport| FlowKey {
            proto,
            src: V6A.into(),
            dst: V6B.into(),
            sport,
            dport,
        };
        assert_eq!(flow_of(&udp6(V6A, 4000, V6B, 53)), Some(key(UDP, 4000, 53)));
        let echo = ipv6(ICMPV6, V6A, V6B, &[128, 0, 0, 0, 0x12, 0x34, 0, 1]);
        assert_eq!(flow_of(&echo), Some(key(ICMPV6, 0x1234, 0x1234)));
        let error = ipv6(ICMPV6, V6A, V6B, &[1, 4, 0, 0, 0, 0, 5, 0x78]);
        assert_eq!(flow_of(&error), Some(key(ICMPV6, 0, 0)));
        // Behind extension headers (a Fragment header among them): no ports.
        let first = ext(&udp6(V6A, 4000, V6B, 53), FRAGMENT, &fragment6(0, true, 7));
        assert_eq!(flow_of(&first), Some(key(FRAGMENT, 0, 0)));
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! IPv4 and IPv6 packets for the tests.

    use std::net::{Ipv4Addr, Ipv6Addr};

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
        ipv4(6, src, dst, &tcp_segment(sport, dport, flags, data))
    }

    /// A TCP header (no options) with `flags`, and `data`.
    fn tcp_segment(sport: u16, dport: u16, flags: u8, data: &[u8]) -> Vec<u8> {
        let mut l4 = vec![0u8; 20];
        l4[0..2].copy_from_slice(&sport.to_be_bytes());
        l4[2..4].copy_from_slice(&dport.to_be_bytes());
        l4[12] = 0x50;
        l4[13] = flags;
        l4.extend_from_slice(data);
        l4
    }

    /// A UDP header (its length set, no checksum), and `data`.
    fn udp_datagram(sport: u16, dport: u16, data: &[u8]) -> Vec<u8> {
        let len = u16::try_from(8 + data.len()).unwrap_or(u16::MAX);
        let mut l4 = vec![0u8; 8];
        l4[0..2].copy_from_slice(&sport.to_be_bytes());
        l4[2..4].copy_from_slice(&dport.to_be_bytes());
        l4[4..6].copy_from_slice(&len.to_be_bytes());
        l4.extend_from_slice(data);
        l4
    }

    /// An ICMP or ICMPv6 echo message of type `kind` with identifier `id`.
    fn echo_message(kind: u8, id: u16) -> Vec<u8> {
        let mut l4 = vec![kind, 0, 0, 0, 0, 0, 0, 1];
        l4[4..6].copy_from_slice(&id.to_be_bytes());
        l4
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
        ipv4(17, src, dst, &udp_datagram(sport, dport, data))
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
        ipv4(1, src, dst, &echo_message(if reply { 0 } else { 8 }, id))
    }

    /// Two IPv6 addresses of the overlay.
    pub(crate) const V6A: Ipv6Addr = Ipv6Addr::new(0xfd7a, 0, 1, 0x100, 0, 0, 0, 9);
    pub(crate) const V6B: Ipv6Addr = Ipv6Addr::new(0xfd7a, 0, 1, 0x200, 0, 0, 0, 7);

    /// An IPv6 packet whose first next header is `next`, from `src` to `dst`, carrying
    /// `payload`.
    pub(crate) fn ipv6(next: u8, src: Ipv6Addr, dst: Ipv6Addr, payload: &[u8]) -> Vec<u8> {
        let len = u16::try_from(payload.len()).unwrap_or(u16::MAX);
        let mut p = vec![0x60, 0, 0, 0];
        p.extend_from_slice(&len.to_be_bytes());
        p.extend_from_slice(&[next, 64]);
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(payload);
        p
    }

    /// `packet` (IPv6) with an extension header of type `kind` put first, its body `body`
    /// (after the next-header byte; a Fragment header's 7 bytes, or an options header's
    /// length byte and options).
    pub(crate) fn ext(packet: &[u8], kind: u8, body: &[u8]) -> Vec<u8> {
        let mut header = vec![packet[6]];
        header.extend_from_slice(body);
        let mut payload = header;
        payload.extend_from_slice(&packet[40..]);
        let src: [u8; 16] = packet[8..24].try_into().unwrap_or_default();
        let dst: [u8; 16] = packet[24..40].try_into().unwrap_or_default();
        ipv6(kind, src.into(), dst.into(), &payload)
    }

    /// A Destination Options (or Hop-by-Hop) body of `len8` eight-byte units past the
    /// first, padding only (one PadN).
    pub(crate) fn padding(len8: u8) -> Vec<u8> {
        let pad = usize::from(len8) * 8 + 4;
        let mut body = vec![len8, 1, u8::try_from(pad).unwrap_or(u8::MAX)];
        body.resize(1 + 2 + pad, 0);
        body
    }

    /// A Fragment header's body: the piece at byte `offset`, more following when `more`,
    /// of datagram `id`.
    pub(crate) fn fragment6(offset: u32, more: bool, id: u32) -> Vec<u8> {
        let field = u16::try_from(offset).unwrap_or(0xfff8) & !7 | u16::from(more);
        let mut body = vec![0];
        body.extend_from_slice(&field.to_be_bytes());
        body.extend_from_slice(&id.to_be_bytes());
        body
    }

    /// A UDP datagram over IPv6.
    pub(crate) fn udp6(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Vec<u8> {
        udp6_with(src, sport, dst, dport, 4)
    }

    /// A UDP datagram over IPv6 with `data` bytes of payload.
    pub(crate) fn udp6_with(
        src: Ipv6Addr,
        sport: u16,
        dst: Ipv6Addr,
        dport: u16,
        data: usize,
    ) -> Vec<u8> {
        ipv6(17, src, dst, &udp_datagram(sport, dport, &vec![0; data]))
    }

    /// A TCP segment over IPv6 with `flags`.
    pub(crate) fn tcp6(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16, flags: u8) -> Vec<u8> {
        ipv6(6, src, dst, &tcp_segment(sport, dport, flags, &[]))
    }

    /// An ICMPv6 echo request (`reply`: an echo reply) with identifier `id`.
    pub(crate) fn echo6(src: Ipv6Addr, dst: Ipv6Addr, id: u16, reply: bool) -> Vec<u8> {
        ipv6(
            58,
            src,
            dst,
            &echo_message(if reply { 129 } else { 128 }, id),
        )
    }

    /// An ICMPv6 error of `kind` from `from` to `to` quoting `about` (a packet) whole.
    pub(crate) fn icmp6_error(from: Ipv6Addr, to: Ipv6Addr, kind: u8, about: &[u8]) -> Vec<u8> {
        let mut l4 = vec![kind, 0, 0, 0, 0, 0, 0, 0];
        l4.extend_from_slice(about);
        ipv6(58, from, to, &l4)
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
    use std::net::Ipv4Addr;

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
                src: B.into(),
                dst: A.into(),
                about: Some(FlowKey {
                    proto: UDP,
                    src: A.into(),
                    dst: B.into(),
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
            src: A.into(),
            dst: B.into(),
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

    /// IPv6 as IPv4: flows, echo, errors and their quotes; what the filter refuses of the
    /// extension headers (docs/protocol.md §7) is `Refused`, what cannot be read `None`.
    #[test]
    fn ipv6_packets_read_as_flows_errors_and_fragments_and_their_headers_are_judged() {
        let (a, b) = (V6A, V6B);
        let syn = parse(&tcp6(a, 40000, b, 22, SYN));
        assert!(
            matches!(syn, Some(Seen::Flow { opens: true, flags: SYN, key, first: None })
                if key.dport == 22 && key.src == IpAddr::from(a))
        );
        let Some(Seen::Flow {
            key: req,
            opens: true,
            ..
        }) = parse(&echo6(a, b, 5, false))
        else {
            panic!("an echo request opens");
        };
        let Some(Seen::Flow {
            key: rep,
            opens: false,
            ..
        }) = parse(&echo6(b, a, 5, true))
        else {
            panic!("an echo reply does not");
        };
        assert_eq!(rep, req.reversed());
        // Other ICMPv6 (a Neighbour Solicitation) is no flow.
        assert_eq!(
            parse(&ipv6(ICMPV6, a, b, &[135, 0, 0, 0, 0, 0, 0, 0])),
            None
        );
        // An error names the flow it quotes; too long, it is oversize.
        let quoted = udp6(a, 5000, b, 53);
        let Some(Seen::IcmpError(e)) = parse(&icmp6_error(b, a, 1, &quoted)) else {
            panic!("an ICMPv6 error");
        };
        assert!(e.answers_flows() && !e.oversize);
        assert_eq!(
            e.about,
            Some(FlowKey {
                proto: UDP,
                src: a.into(),
                dst: b.into(),
                sport: 5000,
                dport: 53
            })
        );
        let long = icmp6_error(b, a, 2, &ipv6(UDP, a, b, &[0; 1240]));
        assert!(matches!(parse(&long), Some(Seen::IcmpError(e)) if e.oversize));
        // ICMPv6's error types, not ICMP's: 4 is a parameter problem (it answers flows), 5 a
        // type that does not.
        let quote = |kind| match parse(&icmp6_error(b, a, kind, &quoted)) {
            Some(Seen::IcmpError(e)) => e.answers_flows(),
            other => panic!("{other:?}"),
        };
        assert!(quote(4) && quote(3) && !quote(5) && !quote(127));

        // Padding-only options pass, Hop-by-Hop first; the chain behind them is walked.
        let udp = udp6(a, 5000, b, 53);
        let padded = ext(
            &ext(&udp, DESTINATION_OPTIONS, &padding(1)),
            HOP_BY_HOP,
            &padding(0),
        );
        assert!(matches!(parse(&padded), Some(Seen::Flow { key, .. }) if key.dport == 53));
        // Refused: a Routing header; an option that is not padding (Router Alert); a
        // Hop-by-Hop header that is not first; two Fragment headers; Mobility; a ninth
        // header; more than 256 bytes of them.
        assert_eq!(
            parse(&ext(&udp, ROUTING, &[0, 0, 1, 0, 0, 0, 0])),
            Some(Seen::Refused)
        );
        assert_eq!(
            parse(&ext(&udp, HOP_BY_HOP, &[0, 5, 2, 0, 0, 1, 0])),
            Some(Seen::Refused)
        );
        let late_hbh = ext(
            &ext(&udp, HOP_BY_HOP, &padding(0)),
            DESTINATION_OPTIONS,
            &padding(0),
        );
        assert_eq!(parse(&late_hbh), Some(Seen::Refused));
        let two = ext(
            &ext(&udp, FRAGMENT, &fragment6(0, true, 1)),
            FRAGMENT,
            &fragment6(0, true, 1),
        );
        assert_eq!(parse(&two), Some(Seen::Refused));
        assert_eq!(
            parse(&ext(&udp, 135, &[0, 0, 0, 0, 0, 0, 0])),
            Some(Seen::Refused)
        );
        let mut eight = udp.clone();
        for _ in 0..8 {
            eight = ext(&eight, DESTINATION_OPTIONS, &padding(0));
        }
        assert!(matches!(parse(&eight), Some(Seen::Flow { .. })));
        assert_eq!(
            parse(&ext(&eight, DESTINATION_OPTIONS, &padding(0))),
            Some(Seen::Refused)
        );
        let wide = ext(&udp, DESTINATION_OPTIONS, &padding(32));
        assert_eq!(parse(&wide), Some(Seen::Refused));
        assert!(matches!(
            parse(&ext(&udp, DESTINATION_OPTIONS, &padding(31))),
            Some(Seen::Flow { .. })
        ));
        // PadN past its header, and a cut chain, cannot be read.
        assert_eq!(
            parse(&ext(&udp, DESTINATION_OPTIONS, &[0, 1, 9, 0, 0, 0, 0])),
            Some(Seen::Refused)
        );
        let cut = ext(&ipv6(UDP, a, b, &[]), DESTINATION_OPTIONS, &[3]);
        assert_eq!(parse(&cut), None);
        // ESP: a protocol without ports.
        assert!(
            matches!(parse(&ipv6(50, a, b, &[0; 16])), Some(Seen::Flow { key, opens: true, .. }) if key.proto == 50 && key.dport == 0)
        );

        // An atomic fragment is the whole packet (RFC 6946).
        let atomic = ext(&udp, FRAGMENT, &fragment6(0, false, 9));
        assert!(
            matches!(parse(&atomic), Some(Seen::Flow { first: None, key, .. }) if key.dport == 53)
        );
        // A first fragment names its datagram (the Fragment header's next header and the
        // 32-bit identification) and its piece: everything after the Fragment header.
        let datagram = DatagramKey {
            proto: UDP,
            src: a.into(),
            dst: b.into(),
            id: 0x1_0000,
        };
        let first = ext(
            &udp6_with(a, 5000, b, 53, 16),
            FRAGMENT,
            &fragment6(0, true, 0x1_0000),
        );
        assert!(
            matches!(parse(&first), Some(Seen::Flow { first: Some((d, p)), .. })
            if d == datagram && p == Piece { offset: 0, end: 24, more: true })
        );
        let later = ext(
            &ipv6(UDP, a, b, &[7; 8]),
            FRAGMENT,
            &fragment6(24, false, 0x1_0000),
        );
        assert_eq!(
            parse(&later),
            Some(Seen::Fragment {
                datagram,
                piece: Piece {
                    offset: 24,
                    end: 32,
                    more: false
                }
            })
        );
        // A first fragment without its whole upper-layer header is refused (RFC 7112); a
        // piece not a multiple of 8 before the last, or empty, cannot be.
        let short = ext(&ipv6(TCP, a, b, &[0; 8]), FRAGMENT, &fragment6(0, true, 3));
        assert_eq!(parse(&short), Some(Seen::Refused));
        // So is one that ends inside an extension header behind its Fragment header.
        let cut_chain = ext(
            &ext(&ipv6(UDP, a, b, &[]), DESTINATION_OPTIONS, &[3]),
            FRAGMENT,
            &fragment6(0, true, 3),
        );
        assert_eq!(parse(&cut_chain), Some(Seen::Refused));
        assert_eq!(
            parse(&ext(
                &ipv6(UDP, a, b, &[0; 7]),
                FRAGMENT,
                &fragment6(8, true, 3)
            )),
            None
        );
        assert_eq!(
            parse(&ext(
                &ipv6(UDP, a, b, &[]),
                FRAGMENT,
                &fragment6(8, false, 3)
            )),
            None
        );
        // An error quoting a later fragment can belong to no flow.
        let about_later = icmp6_error(b, a, 1, &later);
        assert!(matches!(parse(&about_later), Some(Seen::IcmpError(e)) if e.about.is_none()));
        // A length field past the packet.
        let mut long_field = udp.clone();
        long_field[5] += 1;
        assert_eq!(parse(&long_field), None);
    }

    proptest::proptest! {
        /// Any bytes: an answer or `None`, never a panic.
        #[test]
        fn any_bytes_parse_without_panicking(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            let _ = parse(&bytes);
        }

        /// Any chain behind a true IPv6 header (its length field right, its next headers
        /// drawn mostly from the extension headers): an answer, never a panic; an error
        /// quoting it too.
        #[test]
        fn any_ipv6_chain_parses_without_panicking(
            next in proptest::sample::select(vec![0u8, 6, 17, 43, 44, 50, 58, 60, 135, 59]),
            mut body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            nexts in proptest::collection::vec(proptest::sample::select(vec![0u8, 6, 17, 44, 58, 60]), 0..10),
            lens in proptest::collection::vec(0u8..4, 0..10),
        ) {
            // Put plausible next-header and length bytes where a chain would read them.
            let mut at = 0;
            for (n, l) in nexts.iter().zip(&lens) {
                if at + 1 >= body.len() {
                    break;
                }
                body[at] = *n;
                body[at + 1] = *l;
                at += usize::from(*l) * 8 + 8;
            }
            let packet = ipv6(next, V6A, V6B, &body);
            let _ = parse(&packet);
            let _ = flow_of(&packet);
            let _ = parse(&icmp6_error(V6B, V6A, 1, &packet));
        }
    }
}

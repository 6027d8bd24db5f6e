//! ICMP the gateway originates: echo replies, fragmentation-needed, time-exceeded.

use crate::ipv4::{self, Header, PROTO_ICMP};
use crate::{ETH_HEADER_LEN, ETHERTYPE_IPV4, IPV4_MIN_HEADER, Lan, checksum, write_eth};

const ECHO_REPLY: u8 = 0;
const DEST_UNREACHABLE: u8 = 3;
const ECHO_REQUEST: u8 = 8;
const TIME_EXCEEDED: u8 = 11;
const FRAG_NEEDED: u8 = 4;
/// ICMP types that are errors: never answered with another error (RFC 1122 §3.2.2).
const ERROR_TYPES: [u8; 5] = [DEST_UNREACHABLE, 4, 5, TIME_EXCEEDED, 12];
const ICMP_HEADER: usize = 8;
const TTL: u8 = 64;

/// An ICMP error the gateway sends back to a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IcmpError {
    /// Type 3 code 4, with the next-hop MTU (RFC 1191 §4).
    FragNeeded(u16),
    /// Type 11 code 0: TTL reached zero in transit.
    TimeExceeded,
}

/// Whether `packet` is an ICMP echo request (whole, not a fragment).
pub(crate) fn is_echo_request(packet: &[u8], h: &Header) -> bool {
    h.proto == PROTO_ICMP
        && !h.is_fragment()
        && h.payload(packet)
            .is_some_and(|p| p.len() >= ICMP_HEADER && p[0] == ECHO_REQUEST && p[1] == 0)
}

/// Writes into `out` an IPv4 packet from `src` to `dst` carrying an ICMP message of
/// `body_len` bytes: `fill` writes the message, then its checksum is computed. Returns the
/// packet's length, or None when `out` is too small.
fn icmp_packet(
    src: std::net::Ipv4Addr,
    dst: std::net::Ipv4Addr,
    id: u16,
    body_len: usize,
    out: &mut [u8],
    fill: impl FnOnce(&mut [u8]),
) -> Option<usize> {
    let ip_len = IPV4_MIN_HEADER + body_len;
    let ip = out.get_mut(..ip_len)?;
    ipv4::write_header(
        ip,
        u16::try_from(ip_len).ok()?,
        id,
        TTL,
        PROTO_ICMP,
        src,
        dst,
        false,
    );
    let body = &mut ip[IPV4_MIN_HEADER..];
    fill(body);
    body[2..4].fill(0);
    let sum = checksum::internet(body);
    body[2..4].copy_from_slice(&sum.to_be_bytes());
    Some(ip_len)
}

/// [`icmp_packet`] from the gateway, in an Ethernet frame to `dst_mac`.
fn icmp_frame(
    lan: &Lan,
    dst_mac: [u8; 6],
    dst: std::net::Ipv4Addr,
    id: u16,
    body_len: usize,
    out: &mut [u8],
    fill: impl FnOnce(&mut [u8]),
) -> Option<usize> {
    let (head, ip) = out.split_at_mut_checked(ETH_HEADER_LEN)?;
    let len = icmp_packet(lan.gateway_ip, dst, id, body_len, ip, fill)?;
    write_eth(head, dst_mac, lan.mac, ETHERTYPE_IPV4);
    Some(ETH_HEADER_LEN + len)
}

/// Writes into `out` the echo reply to the echo request `packet` (an IP packet that came over
/// the tunnel to the gateway), from the gateway. Returns its length.
pub(crate) fn echo_reply_packet(
    lan: &Lan,
    packet: &[u8],
    h: &Header,
    out: &mut [u8],
) -> Option<usize> {
    let icmp = h.payload(packet)?;
    icmp_packet(
        lan.gateway_ip,
        h.src,
        h.id,
        icmp.len(),
        out,
        echo_reply_body(icmp),
    )
}

/// Writes the echo reply's ICMP message: the request's, with the reply type.
fn echo_reply_body(request: &[u8]) -> impl FnOnce(&mut [u8]) + '_ {
    move |body| {
        body.copy_from_slice(request);
        body[0] = ECHO_REPLY;
    }
}

/// Writes into `out` the Ethernet frame answering the echo request `packet` from `dst_mac`.
/// Returns its length, or None when `out` is too small.
pub(crate) fn echo_reply(
    lan: &Lan,
    dst_mac: [u8; 6],
    packet: &[u8],
    h: &Header,
    out: &mut [u8],
) -> Option<usize> {
    let icmp = h.payload(packet)?;
    icmp_frame(
        lan,
        dst_mac,
        h.src,
        h.id,
        icmp.len(),
        out,
        echo_reply_body(icmp),
    )
}

/// Writes into `out` an ICMP error about `packet` (of which at least the header is present),
/// addressed to its source at `dst_mac`, quoting its header and first 8 payload bytes
/// (RFC 792). Returns None where RFC 1122 §3.2.2 forbids an error: about an ICMP error, a
/// non-first fragment, or a packet from a broadcast, multicast or unspecified source.
pub(crate) fn error(
    lan: &Lan,
    dst_mac: [u8; 6],
    packet: &[u8],
    h: &Header,
    kind: IcmpError,
    out: &mut [u8],
) -> Option<usize> {
    let (head, ip) = out.split_at_mut_checked(ETH_HEADER_LEN)?;
    let len = error_packet(lan, packet, h, kind, ip)?;
    write_eth(head, dst_mac, lan.mac, ETHERTYPE_IPV4);
    Some(ETH_HEADER_LEN + len)
}

/// [`error`]'s IP packet alone, from the gateway vIP: for a sender across the tunnel.
pub(crate) fn error_packet(
    lan: &Lan,
    packet: &[u8],
    h: &Header,
    kind: IcmpError,
    out: &mut [u8],
) -> Option<usize> {
    if h.frag_offset != 0 || h.src.is_broadcast() || h.src.is_multicast() || h.src.is_unspecified()
    {
        return None;
    }
    if h.proto == PROTO_ICMP
        && packet
            .get(h.header_len)
            .is_none_or(|t| ERROR_TYPES.contains(t))
    {
        return None;
    }
    let quote = packet.get(..(h.header_len + 8).min(h.total_len).min(packet.len()))?;
    let (ty, code, rest) = match kind {
        IcmpError::FragNeeded(mtu) => (DEST_UNREACHABLE, FRAG_NEEDED, u32::from(mtu)),
        IcmpError::TimeExceeded => (TIME_EXCEEDED, 0, 0),
    };
    icmp_packet(
        lan.gateway_ip,
        h.src,
        0,
        ICMP_HEADER + quote.len(),
        out,
        |body| {
            body[0] = ty;
            body[1] = code;
            body[4..8].copy_from_slice(&rest.to_be_bytes());
            body[ICMP_HEADER..].copy_from_slice(quote);
        },
    )
}

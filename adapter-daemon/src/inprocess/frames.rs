//! Frames the tests' devices build and read: built by hand or with pnet, never by the
//! code under test.

use super::*;

/// The UDP payload of `frame` (Ethernet, IPv4) to `port`, if it is one.
pub(super) fn udp_payload(frame: &[u8], port: u16) -> Option<&[u8]> {
    let ip = ipv4(frame)?;
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let udp = ip.get(ihl..)?;
    (ip[9] == 17 && udp.get(2..4)? == port.to_be_bytes()).then(|| udp.get(8..))?
}

/// The IPv4 packet in `frame`, if it carries one.
pub(super) fn ipv4(frame: &[u8]) -> Option<&[u8]> {
    (frame.get(12..14)? == ETH_IPV4).then(|| frame.get(IP..))?
}

/// An ICMP echo request in `frame` from `src` to `dst`, whole and with right checksums.
pub(super) fn is_echo(frame: &[u8], src: Ipv4Addr, dst: Ipv4Addr) -> bool {
    is_icmp(frame, src, dst, 8)
}

/// An ICMP message of type `kind` in `frame` from `src` to `dst`, whole and with right
/// checksums.
pub(super) fn is_icmp(frame: &[u8], src: Ipv4Addr, dst: Ipv4Addr, kind: u8) -> bool {
    ipv4(frame).is_some_and(|ip| {
        ip[9] == 1
            && ip[12..16] == src.octets()
            && ip[16..20] == dst.octets()
            && ip[20] == kind
            && checksums_ok(ip)
    })
}

/// A DNS question for `qname`'s A record, with `id`.
pub(super) fn dns_query(id: u16, qname: &str) -> Vec<u8> {
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(
        Name::from_ascii(qname).expect("a name"),
        RecordType::A,
    ));
    m.to_vec().expect("a query")
}

/// The answer with `id` in `payload`: its A records.
pub(super) fn dns_answer(payload: &[u8], id: u16) -> Option<Vec<Ipv4Addr>> {
    use hickory_proto::rr::RData;
    let m = hickory_proto::op::Message::from_vec(payload).ok()?;
    (m.metadata.id == id).then(|| {
        m.answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(a.0),
                _ => None,
            })
            .collect()
    })
}

/// The MSS option of the TCP segment in `ip`, if it has one.
pub(super) fn mss(ip: &[u8]) -> Option<u16> {
    let tcp = ip.get(usize::from(ip[0] & 0x0f) * 4..)?;
    let end = usize::from(tcp.get(12)? >> 4) * 4;
    let mut options = tcp.get(20..end)?;
    while let Some(&kind) = options.first() {
        match kind {
            0 => return None,
            1 => options = &options[1..],
            2 => return Some(u16::from_be_bytes(options.get(2..4)?.try_into().ok()?)),
            _ => options = options.get(usize::from(*options.get(1)?).max(2)..)?,
        }
    }
    None
}

/// A UDP datagram in `frame` from `src` to `dst`:`port`.
pub(super) fn is_udp(frame: &[u8], src: Ipv4Addr, dst: Ipv4Addr, port: u16) -> bool {
    ipv4(frame).is_some_and(|ip| {
        ip[9] == 17
            && ip[12..16] == src.octets()
            && ip[16..20] == dst.octets()
            && ip[22..24] == port.to_be_bytes()
    })
}

/// An ARP request from `mac` at `sender` for `target`, built by hand (not by the code
/// under test).
pub(super) fn arp_request(mac: [u8; 6], sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&BROADCAST);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&sender.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target.octets());
    f
}

/// An ICMPv6 echo request from `src` to `dst` (hop limit 64), its checksum by pnet.
pub(super) fn ipv6_echo(src: std::net::Ipv6Addr, dst: std::net::Ipv6Addr, data: &[u8]) -> Vec<u8> {
    let mut icmp = vec![128, 0, 0, 0, 0x12, 0x34, 0, 1];
    icmp.extend_from_slice(data);
    let sum = pnet_packet::util::ipv6_checksum(
        &icmp,
        1,
        &[],
        &src,
        &dst,
        pnet_packet::ip::IpNextHeaderProtocols::Icmpv6,
    );
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&u16::try_from(icmp.len()).unwrap_or(0).to_be_bytes());
    p.extend_from_slice(&[58, 64]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&icmp);
    p
}

/// An Ethernet frame carrying the IPv6 packet `ip`.
pub(super) fn eth6(dst: [u8; 6], src: [u8; 6], ip: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + ip.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x86, 0xdd]);
    f.extend_from_slice(ip);
    f
}

/// The ICMPv6 message in `frame` from `src` to `dst` of type `kind`, with its checksum
/// right, if it is one.
pub(super) fn icmp6(
    frame: &[u8],
    src: std::net::Ipv6Addr,
    dst: std::net::Ipv6Addr,
    kind: u8,
) -> Option<&[u8]> {
    let ip = (frame.get(12..14)? == [0x86, 0xdd]).then(|| frame.get(IP..))??;
    let icmp = ip.get(40..)?;
    let ok = ip[6] == 58
        && ip[8..24] == src.octets()
        && ip[24..40] == dst.octets()
        && icmp[0] == kind
        && pnet_packet::util::ipv6_checksum(
            icmp,
            1,
            &[],
            &src,
            &dst,
            pnet_packet::ip::IpNextHeaderProtocols::Icmpv6,
        ) == u16::from_be_bytes([icmp[2], icmp[3]]);
    ok.then_some(ip)
}

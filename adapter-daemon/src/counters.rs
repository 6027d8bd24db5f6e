//! The adapter's own data-plane counters (its LAN side): one atomic per event, written by the
//! data threads, read by status. The tunnel engine counts its own (`cyphonic_tunnel::EngineCounters`).

pub use cyphonic_tunnel::bump;

cyphonic_telemetry::counters! {
    /// Counters of the adapter's LAN side.
    pub struct LanCounters {
    /// Frames read from the LAN interface.
    captured,
    /// Captured frames longer than the buffer (reported by the kernel, never cut silently).
    captured_truncated,
    /// Frames the kernel dropped because capture fell behind and `dataplane.lan_buffer` filled.
    drop_capture_overflow,
    /// Of the sparse class (ARP, ICMP, DNS, DHCP: `dataplane.sparse_socket`), frames the kernel dropped at the sparse capture socket: they came faster than the sparse lane's pace (20,000 a second) lets it read.
    drop_sparse_overflow,
    /// What the LAN port's guard put back after something else on the host changed it: a sysctl (forwarding or IPv6 turned on), the ingress drop filter, an IPv4 address removed (port_guard.rs).
    forwarding_guard_restored,
    /// Coalesced frames (GRO/LRO, or a local sender's TSO) cut back into segments.
    coalesced,
    /// Segments cut from coalesced frames (each also counts as captured).
    segments,
    /// Coalesced frames that could not be cut (inconsistent headers, UDP fragmentation offload).
    drop_coalesced,
    /// Packets sent back onto the LAN between a fixed-address device and a device of the block (`[legacy]`).
    lan_hairpinned,
    /// ARP replies sent for the gateway or proxied vIPs.
    arp_replies,
    /// ICMP echo replies from the gateway vIP.
    echo_replies,
    /// ICMP fragmentation-needed sent (packets over the inner MTU with DF).
    icmp_frag_needed,
    /// ICMP time-exceeded sent: to a device whose packet's TTL ran out on its way out, or through the tunnel to a peer's sender whose packet's TTL ran out on its way in.
    icmp_time_exceeded,
    /// ICMPv6 Packet Too Big sent (IPv6 packets over the inner MTU: IPv6 is never fragmented on the way).
    icmp6_packet_too_big,
    /// Router Advertisements sent on the LAN: answering solicitations (one a segment every 3 s at most) and every 200 s.
    router_adverts,
    /// Neighbour Advertisements of the gateway's IPv6 addresses, answering solicitations.
    neighbour_adverts,
    /// Claims of the gateway's IPv6 addresses (a device's advertisement of one, or its duplicate address detection), answered with the gateway's advertisement to every node.
    neighbour_gateway_claims,
    /// ICMP errors not sent because of the rate limit.
    icmp_rate_limited,
    /// DHCP messages handed to the DHCP server.
    dhcp_received,
    /// DHCP replies sent on the LAN.
    dhcp_sent,
    /// DHCP ACKs not sent because the lease they grant could not be saved (the client retries).
    dhcp_unsaved_silent,
    /// DHCP ACKs that waited for their new lease to be written (sent once it was).
    dhcp_ack_waited,
    /// One of an HA pair: DHCP ACKs that left before the standby said it holds their lease (it did not within a second of the write).
    dhcp_ack_unreplicated,
    /// DHCP messages seen while the DHCP server is switched off.
    dhcp_unserved,
    /// DNS messages handed to the DNS service (from the LAN and from peers).
    dns_received,
    /// DNS responses sent (on the LAN and to peers).
    dns_sent,
    /// DNS queries seen while the DNS service is switched off.
    dns_unserved,
    /// DHCP, DNS or gateway messages from a source over its rate (DHCP per MAC, the rest per source address).
    drop_service_rate,
    /// DHCP or DNS messages dropped because the control thread's queue was full (a flood).
    drop_service_busy,
    /// Packets from peers to the gateway vIP (DNS, ping).
    gateway_from_peers,
    /// Packets from peers to the gateway vIP for nothing it offers.
    drop_gateway_from_peer,
    /// Packets of the gateway's own to peers not handed to the engine: no such peer, no packet buffer, too large, or the engine stopping (those it drops behind a pending handshake count as its drop_queue).
    drop_gateway_to_peer,
    /// Claims of the gateway's own address by a device's ARP, answered with the gateway's announcement.
    arp_gateway_claims,
    /// Claims of the gateway's addresses (by ARP or IPv6 Neighbour Discovery) left unanswered: announcements over their rate.
    arp_announce_limited,
    /// Frames not addressed to us (promiscuous capture), multicast, or our own.
    drop_not_for_us,
    /// Frames of no protocol the LAN side serves (LLDP, ...; IPv6 where the certificate holds no IPv6 block).
    drop_not_ipv4,
    /// Frames tagged with a VLAN no `[[vlan]]` segment has, or tagged twice.
    drop_vlan,
    /// Malformed frames or IPv4 headers.
    drop_malformed,
    /// Truncated frames that could not be answered.
    drop_truncated,
    /// Spoofed source (IP and MAC not a lease or reservation).
    drop_spoofed,
    /// Destinations outside the overlay.
    drop_no_route,
    /// Destinations on the LAN itself.
    drop_local_destination,
    /// Packets to the gateway for a service it does not offer.
    drop_gateway_service,
    /// ICMP errors RFC 1122 forbids, or replies that did not fit.
    drop_no_reply,
    /// ARP for nobody we answer for.
    drop_arp_ignored,
    /// Router Advertisements and Redirects from devices (RA guard): only the gateway routes on the LAN.
    drop_router_guard,
    /// Neighbour Discovery that lies: a link-layer address that is not its frame's source, or an address another device holds.
    drop_neighbour_spoofed,
    /// Frames not sent on the LAN, and captured frames not forwarded, while this box of an HA pair had no mandate to serve (its pair thread held up, the process frozen: docs/protocol.md §5, The mandate).
    drop_not_serving,
    /// Neighbour Discovery that needs no answer from the gateway (devices resolving each other, their duplicate address detection).
    drop_neighbour_ignored,
    /// Packets split into fragments to fit the inner MTU.
    fragmented,
    /// Packets sent into the tunnel with their TCP/UDP checksum left to the far end.
    checksum_deferred_sent,
    /// Packets from peers whose TCP/UDP checksum the sender left to us (or our NIC).
    checksum_deferred_received,
    /// Decrypted packets that are not IPv4.
    drop_inner_not_ipv4,
    /// Decrypted packets with a malformed IPv4 header.
    drop_inner_malformed,
    /// Decrypted packets whose source the sending peer is not certified for.
    drop_source_not_certified,
    /// Decrypted packets not for a device on our LAN.
    drop_not_our_lan,
    /// Decrypted packets whose TTL ran out.
    drop_ttl_expired,
    /// Packets for an address of the block that no device holds (no lease, no reservation).
    drop_neighbour_unknown,
    /// Frames sent to devices on the LAN (segments of merged frames counted one by one).
    lan_sent,
    /// Large frames sent to the LAN for the kernel to cut into TCP segments or UDP datagrams.
    lan_merged,
    /// Segments and datagrams carried in those large frames.
    lan_merged_segments,
    /// Frames the LAN interface refused.
    lan_send_failed,
    }
}

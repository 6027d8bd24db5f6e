//! Which LAN frames are sparse traffic: the classic BPF programs that split the port's frames
//! between the capture sockets (`dataplane.sparse_socket`). The kernel runs them on every
//! frame, before queueing it: the sparse capture socket keeps only the sparse class, the bulk
//! sockets everything else, so a ping never waits behind a download's frames in a socket's
//! queue, nor behind the capture thread's work on them.
//!
//! The sparse class is what a device sends rarely and waits on: ARP, IPv4 ICMP (pings and
//! errors), and IPv4 UDP to or from ports 53 (DNS) and 67/68 (DHCP), but for a fragment's
//! tail (no ports to read). It is chosen by protocol and ports only, so every packet of a
//! flow falls on the same side and no flow is split between the two sockets' threads (a
//! datagram's fragments may be: its receiver reassembles them in any order). Everything
//! else, IPv6 included (its Neighbour Discovery too), is bulk. A VLAN's frames are judged as any:
//! the kernel has taken their tag off before the filter runs.

use cyphonic_netio::cbpf::{
    Insn, jump_eq, jump_ge, jump_ge_x, jump_set, load_byte, load_half, load_half_at_x, load_len,
    load_x_ipv4_header_len, ret, sub,
};

/// A socket filter's answer for a frame it keeps: all of it (however large a coalesced frame).
const KEEP: u32 = u32::MAX;

/// The program of the sparse capture socket (`sparse` true: keeps the sparse class) or of the
/// bulk ones (keeps the rest). It never loads past a frame's end (a classic program that does
/// answers 0, which would leave a short frame out of both sides, uncounted): frames too short
/// for the fields it reads are bulk, and the adapter counts them as it reads them.
pub fn lan_filter(sparse: bool) -> Vec<Insn> {
    let (yes, no) = if sparse { (KEEP, 0) } else { (0, KEEP) };
    // Offsets in an untagged Ethernet frame: EtherType 12, IPv4 at 14 (protocol 23, flags
    // and fragment offset 20), the UDP ports at 14 + the header's length (+0 source,
    // +2 destination). Jumps count the instructions skipped: YES is instruction 22, NO 23.
    vec![
        load_half(12),              // 0
        jump_eq(0x0806, 20, 0),     // 1: ARP
        jump_eq(0x0800, 0, 20),     // 2: not IPv4
        load_len(),                 // 3
        jump_ge(34, 0, 18),         // 4: shorter than an IPv4 header
        load_byte(23),              // 5
        jump_eq(1, 15, 0),          // 6: ICMP
        jump_eq(17, 0, 15),         // 7: not UDP
        load_half(20),              // 8
        jump_set(0x1fff, 13, 0),    // 9: a fragment's tail
        load_x_ipv4_header_len(14), // 10
        load_len(),                 // 11
        sub(18),                    // 12: room for both ports past the IPv4 header?
        jump_ge_x(0, 9),            // 13
        load_half_at_x(14),         // 14: source port
        jump_eq(53, 6, 0),          // 15
        jump_eq(67, 5, 0),          // 16
        jump_eq(68, 4, 0),          // 17
        load_half_at_x(16),         // 18: destination port
        jump_eq(53, 2, 0),          // 19
        jump_eq(67, 1, 0),          // 20
        jump_eq(68, 0, 1),          // 21
        ret(yes),                   // 22: YES
        ret(no),                    // 23: NO
    ]
}

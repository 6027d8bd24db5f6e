//! Requests to the kernel's routing netlink (`NETLINK_ROUTE`) that keep the kernel's own IP
//! stack off a port: its IPv4 addresses, listed and removed, and a filter at the very start of
//! its ingress path that drops every frame (tc: a `clsact` qdisc and, at priority 1 on its
//! ingress hook, a `bpf` filter in direct-action mode whose one-instruction classic program
//! returns `TC_ACT_SHOT`).
//!
//! Packet sockets bound to `ETH_P_ALL` (the adapter's capture) are handed each frame before
//! the kernel runs ingress filters (`__netif_receive_skb_core`: taps, then `sch_handle_ingress`,
//! then the protocol handlers), so the capture still sees everything while ARP, IPv4 and IPv6
//! never do. Frames sent through a packet socket leave by the egress path and are untouched.
//!
//! A classic program needs neither the `bpf()` system call nor the `act_gact` module; the
//! classifier is `cls_bpf` (`CONFIG_NET_CLS_BPF`, built into or shipped as a module by every
//! distribution kernel, Debian's for arm64 included).
//!
//! Messages are built and parsed by netlink-packet-route; this module only sends them and
//! reads the answers.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    DefaultNla, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::link::{LinkAttribute, LinkMessage, State};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::tc::{
    TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// How the kernel would send a packet to an address ([`Rtnl::route_to`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The interface it leaves by.
    pub interface: u32,
    /// The router it goes through; `None` on a directly attached network.
    pub gateway: Option<IpAddr>,
    /// The source address the kernel would give it.
    pub source: Option<IpAddr>,
}

/// The priority of the drop filter on the ingress hook: 1, ahead of anything added later
/// without a priority (the kernel numbers those from 49152 down).
pub const INGRESS_DROP_PRIORITY: u16 = 1;

/// `TCA_BPF_OPS_LEN` and `TCA_BPF_OPS` (`linux/pkt_cls.h`): a classic program's length and
/// instructions.
const TCA_BPF_OPS_LEN: u16 = 4;
const TCA_BPF_OPS: u16 = 5;

/// The drop program: one classic instruction, `ret #TC_ACT_SHOT` (`BPF_RET | BPF_K`, k = 2),
/// as `struct sock_filter { u16 code; u8 jt; u8 jf; u32 k; }` in host byte order.
fn drop_program() -> Vec<u8> {
    let code: u16 = 0x06; // BPF_RET | BPF_K
    let tc_act_shot: u32 = 2;
    let mut insn = code.to_ne_bytes().to_vec();
    insn.extend([0, 0]);
    insn.extend(tc_act_shot.to_ne_bytes());
    insn
}

/// The `clsact` qdisc's ingress hook as a filter's parent.
const INGRESS_HOOK: TcHandle = TcHandle {
    major: 0xffff,
    minor: TcHandle::MIN_INGRESS,
};

/// `ETH_P_ALL` in network byte order, as a filter's protocol.
fn all_protocols() -> u16 {
    u16::try_from(libc::ETH_P_ALL).unwrap_or(3).to_be()
}

/// A routing-netlink socket for requests, one at a time.
pub struct Rtnl {
    sock: Socket,
    seq: u32,
}

impl std::fmt::Debug for Rtnl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rtnl").field("seq", &self.seq).finish()
    }
}

impl Rtnl {
    /// Opens the socket.
    ///
    /// # Errors
    /// The socket cannot be opened or bound.
    pub fn open() -> io::Result<Self> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(Self { sock, seq: 0 })
    }

    /// The IPv4 addresses on interface `index`, with their prefix lengths.
    ///
    /// # Errors
    /// The kernel refused the dump or its answer could not be read.
    pub fn ipv4_addresses(&mut self, index: u32) -> io::Result<Vec<(Ipv4Addr, u8)>> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet;
        let answers = self.request(RouteNetlinkMessage::GetAddress(msg), NLM_F_DUMP)?;
        Ok(answers
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) if a.header.index == index => {
                    local_v4(&a).map(|ip| (ip, a.header.prefix_len))
                }
                _ => None,
            })
            .collect())
    }

    /// Removes the IPv4 address `ip/prefix_len` from interface `index`; `false` when it was
    /// not there (someone removed it first).
    ///
    /// # Errors
    /// No `CAP_NET_ADMIN`, or another refusal by the kernel.
    pub fn remove_ipv4_address(
        &mut self,
        index: u32,
        ip: Ipv4Addr,
        prefix_len: u8,
    ) -> io::Result<bool> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.index = index;
        msg.header.prefix_len = prefix_len;
        msg.attributes.push(AddressAttribute::Local(ip.into()));
        match self.request(RouteNetlinkMessage::DelAddress(msg), NLM_F_ACK) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives interface `index` the IPv6 address `ip/prefix_len` (the kernel routes the prefix
    /// through it), without Duplicate Address Detection: on a point-to-point device nobody
    /// else can hold it, and a tentative address could not be a source for a second.
    ///
    /// # Errors
    /// No `CAP_NET_ADMIN`, IPv6 off on the interface, or another refusal by the kernel.
    pub fn add_ipv6_address(&mut self, index: u32, ip: Ipv6Addr, prefix_len: u8) -> io::Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet6;
        msg.header.index = index;
        msg.header.prefix_len = prefix_len;
        msg.header.flags = AddressHeaderFlags::Nodad;
        msg.attributes.push(AddressAttribute::Address(ip.into()));
        msg.attributes.push(AddressAttribute::Local(ip.into()));
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
        self.request(
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        )
        .map(|_| ())
    }

    /// Whether interface `index` has the drop filter on its ingress hook, at
    /// [`INGRESS_DROP_PRIORITY`], with the drop program and nothing else.
    ///
    /// # Errors
    /// The kernel refused the dump (no such interface) or its answer could not be read.
    pub fn ingress_drop_present(&mut self, index: u32) -> io::Result<bool> {
        let mut msg = TcMessage::with_index(index_i32(index)?);
        msg.header.parent = INGRESS_HOOK;
        let answers = self.request(RouteNetlinkMessage::GetTrafficFilter(msg), NLM_F_DUMP)?;
        Ok(answers.iter().any(|m| match m {
            RouteNetlinkMessage::NewTrafficFilter(f) => is_drop_filter(f),
            _ => false,
        }))
    }

    /// Puts the drop filter on interface `index`'s ingress hook: adds the `clsact` qdisc if
    /// it is missing, then replaces whatever filter holds [`INGRESS_DROP_PRIORITY`].
    ///
    /// # Errors
    /// No `CAP_NET_ADMIN`, no such interface, or a kernel without `clsact` or `cls_bpf`.
    pub fn install_ingress_drop(&mut self, index: u32) -> io::Result<()> {
        let ifindex = index_i32(index)?;
        let mut qdisc = TcMessage::with_index(ifindex);
        qdisc.header.handle = TcHandle {
            major: 0xffff,
            minor: 0,
        };
        qdisc.header.parent = TcHandle::CLSACT;
        qdisc
            .attributes
            .push(TcAttribute::Kind("clsact".to_owned()));
        // CREATE | REPLACE without options: adds it, or leaves one that is there.
        self.request(
            RouteNetlinkMessage::NewQueueDiscipline(qdisc),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        )?;
        // Another kind of filter at our priority cannot be replaced by ours: remove it.
        let mut old = TcMessage::with_index(ifindex);
        old.header.parent = INGRESS_HOOK;
        old.header.info = u32::from(INGRESS_DROP_PRIORITY) << 16;
        match self.request(RouteNetlinkMessage::DelTrafficFilter(old), NLM_F_ACK) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        self.request(
            RouteNetlinkMessage::NewTrafficFilter(drop_filter(ifindex)),
            NLM_F_ACK | NLM_F_CREATE,
        )?;
        Ok(())
    }

    /// The interface the kernel would send a packet to `dest` out of (what `ip route get`
    /// says: every table and rule applied), or `None` when it has no route there (none, or an
    /// unreachable, prohibit or blackhole route).
    ///
    /// # Errors
    /// The kernel refused for another reason, or its answer could not be read.
    pub fn route_out(&mut self, dest: IpAddr) -> io::Result<Option<u32>> {
        Ok(self.route_to(dest)?.map(|r| r.interface))
    }

    /// How the kernel would send a packet to `dest` (what `ip route get` says): out of which
    /// interface, through which router, from which source address; `None` when it has no
    /// route there (none, or an unreachable, prohibit or blackhole route).
    ///
    /// # Errors
    /// The kernel refused for another reason, or its answer could not be read.
    pub fn route_to(&mut self, dest: IpAddr) -> io::Result<Option<Route>> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = match dest {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        msg.header.destination_prefix_length = if dest.is_ipv4() { 32 } else { 128 };
        msg.attributes
            .push(RouteAttribute::Destination(dest.into()));
        let answers = match self.request(RouteNetlinkMessage::GetRoute(msg), 0) {
            Ok(a) => a,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::EACCES | libc::EINVAL)
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let ip = |a: &RouteAddress| match a {
            RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
            RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
            _ => None,
        };
        Ok(answers.iter().find_map(|m| {
            let RouteNetlinkMessage::NewRoute(r) = m else {
                return None;
            };
            let mut route = Route {
                interface: 0,
                gateway: None,
                source: None,
            };
            for a in &r.attributes {
                match a {
                    RouteAttribute::Oif(index) => route.interface = *index,
                    RouteAttribute::Gateway(g) => route.gateway = ip(g),
                    RouteAttribute::PrefSource(s) => route.source = ip(s),
                    _ => {}
                }
            }
            (route.interface != 0).then_some(route)
        }))
    }

    /// Whether interface `index` is up and can carry packets: its operational state is up,
    /// or unknown (drivers that do not report one, like a TUN or loopback).
    ///
    /// # Errors
    /// No such interface, or the answer could not be read.
    pub fn link_carries(&mut self, index: u32) -> io::Result<bool> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        let answers = self.request(RouteNetlinkMessage::GetLink(msg), 0)?;
        Ok(answers.iter().any(|m| match m {
            RouteNetlinkMessage::NewLink(l) => l
                .attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::OperState(State::Up | State::Unknown))),
            _ => false,
        }))
    }

    /// Sends `msg` with `NLM_F_REQUEST | flags` and collects the answers until the dump ends
    /// or the kernel acknowledges.
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut answers = Vec::new();
        loop {
            let (datagram, _) = self.sock.recv_from_full()?;
            let mut rest = &datagram[..];
            while !rest.is_empty() {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = usize::try_from(reply.header.length)
                    .unwrap_or(usize::MAX)
                    .max(16);
                rest = rest.get(len..).unwrap_or_default();
                if reply.header.sequence_number != seq {
                    continue; // an answer to an earlier request that gave up
                }
                match reply.payload {
                    NetlinkPayload::Done(_) => return Ok(answers),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(answers),
                            Some(_) => Err(e.to_io()),
                        };
                    }
                    NetlinkPayload::InnerMessage(m) => {
                        answers.push(m);
                        if !dump {
                            return Ok(answers);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// The drop filter for interface `ifindex`: `bpf` at [`INGRESS_DROP_PRIORITY`] for every
/// protocol, direct action, the drop program.
fn drop_filter(ifindex: i32) -> TcMessage {
    let program = drop_program();
    let mut f = TcMessage::with_index(ifindex);
    f.header.parent = INGRESS_HOOK;
    f.header.info = (u32::from(INGRESS_DROP_PRIORITY) << 16) | u32::from(all_protocols());
    f.attributes.push(TcAttribute::Kind("bpf".to_owned()));
    f.attributes.push(TcAttribute::Options(vec![
        TcOption::Bpf(TcFilterBpfOption::Other(DefaultNla::new(
            TCA_BPF_OPS_LEN,
            1u16.to_ne_bytes().to_vec(),
        ))),
        TcOption::Bpf(TcFilterBpfOption::Other(DefaultNla::new(
            TCA_BPF_OPS,
            program,
        ))),
        TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
        TcOption::Bpf(TcFilterBpfOption::ProgName("cyphonic-lan-drop".to_owned())),
    ]));
    f
}

/// Whether a dumped filter is ours: `bpf` at our priority, direct action, the drop program.
fn is_drop_filter(f: &TcMessage) -> bool {
    let header: &TcHeader = &f.header;
    if u16::try_from(header.info >> 16).ok() != Some(INGRESS_DROP_PRIORITY) {
        return false;
    }
    let kind = f
        .attributes
        .iter()
        .any(|a| matches!(a, TcAttribute::Kind(k) if k == "bpf"));
    let options: Vec<&TcOption> = f
        .attributes
        .iter()
        .filter_map(|a| match a {
            TcAttribute::Options(o) => Some(o),
            _ => None,
        })
        .flatten()
        .collect();
    let direct = options.iter().any(|o| {
        matches!(o, TcOption::Bpf(TcFilterBpfOption::Flags(flags)) if flags.contains(TcBpfFlags::DirectAction))
    });
    let program = drop_program();
    let ours = options.iter().any(|o| match o {
        TcOption::Bpf(TcFilterBpfOption::Other(nla)) => {
            use netlink_packet_core::Nla;
            let mut value = vec![0u8; nla.value_len()];
            nla.emit_value(&mut value);
            nla.kind() == TCA_BPF_OPS && value == program
        }
        _ => false,
    });
    kind && direct && ours
}

/// The local IPv4 address of a dumped address message.
fn local_v4(a: &AddressMessage) -> Option<Ipv4Addr> {
    a.attributes.iter().find_map(|attr| match attr {
        AddressAttribute::Local(IpAddr::V4(ip)) => Some(*ip),
        _ => None,
    })
}

fn index_i32(index: u32) -> io::Result<i32> {
    i32::try_from(index).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_program_is_one_return_of_tc_act_shot() {
        let p = drop_program();
        assert_eq!(p.len(), 8, "one struct sock_filter");
        assert_eq!(u16::from_ne_bytes([p[0], p[1]]), 0x06);
        assert_eq!(u32::from_ne_bytes([p[4], p[5], p[6], p[7]]), 2);
    }

    #[test]
    fn the_filter_built_is_recognised_and_others_are_not() {
        let ours = drop_filter(7);
        assert!(is_drop_filter(&ours));
        let mut elsewhere = ours.clone();
        elsewhere.header.info = (5u32 << 16) | u32::from(all_protocols());
        assert!(!is_drop_filter(&elsewhere), "another priority");
        let mut other = ours.clone();
        other
            .attributes
            .retain(|a| !matches!(a, TcAttribute::Options(_)));
        assert!(!is_drop_filter(&other), "no program");
        // Through the wire format and back, as a dump returns it.
        let mut packet = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::from(RouteNetlinkMessage::NewTrafficFilter(ours)),
        );
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        let back = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf).unwrap();
        let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewTrafficFilter(f)) = back.payload
        else {
            panic!("not a filter: {back:?}");
        };
        assert!(is_drop_filter(&f));
    }
}

//! Reach (docs/protocol.md §5, *Health*, bit 3): whether something beyond the uplink answers
//! this box. Both boxes of a pair probe the same targets the same way, every
//! [`PROBE_EVERY`], on a thread of their own: the static peers' endpoints with an ICMP (or
//! ICMPv6) echo request, the cloud's addresses with a TCP connection closed at once. Reached
//! while an answer came within [`WINDOW`]. A target that answers neither box (a peer's NAT
//! that drops pings, a cloud that is down) changes nothing between them.

use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pnet_packet::Packet as _;
use pnet_packet::icmp::{IcmpPacket, IcmpTypes, echo_reply, echo_request};
use pnet_packet::icmpv6::{Icmpv6Types, echo_reply as echo_reply6, echo_request as echo_request6};
use pnet_packet::ipv4::Ipv4Packet;
use socket2::{Domain, Protocol, Socket, Type};

/// How often the targets are probed.
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// How long a round waits for its answers.
const ANSWER_WAIT: Duration = Duration::from_secs(1);
/// Reached while an answer came within this.
pub(super) const WINDOW: Duration = Duration::from_secs(10);
/// What the last answer holds before the first.
const NEVER: u64 = u64::MAX;

/// What the probes reach.
#[derive(Debug)]
pub(super) struct Targets {
    /// The static peers' endpoints: pinged.
    pub(super) peers: Vec<IpAddr>,
    /// The cloud's addresses given as addresses: connected to.
    pub(super) cloud: Vec<SocketAddr>,
    /// The cloud's addresses resolved from its host names (kept up to date elsewhere).
    pub(super) resolved: Arc<Mutex<Vec<SocketAddr>>>,
}

/// The prober's findings, read by the pair's thread.
#[derive(Debug)]
pub(super) struct Reach {
    epoch: Instant,
    /// When the last answer came, in milliseconds since `epoch` ([`NEVER`]: none yet).
    last: Arc<AtomicU64>,
}

impl Reach {
    /// Starts probing `targets` on a thread of its own (`names`: the cloud has host names,
    /// resolved into `targets.resolved`); `None` when there is nothing to probe (reach is
    /// not judged then) or the thread cannot start (said in the log).
    pub(super) fn start(targets: Targets, names: bool) -> Option<Self> {
        if targets.peers.is_empty() && targets.cloud.is_empty() && !names {
            return None;
        }
        let reach = Self {
            epoch: Instant::now(),
            last: Arc::new(AtomicU64::new(NEVER)),
        };
        let (epoch, last) = (reach.epoch, reach.last.clone());
        let spawned = std::thread::Builder::new()
            .name("cy-ha-reach".into())
            .spawn(move || {
                // The identifier of our echo requests: the process's, its low 16 bits.
                let [.., hi, lo] = std::process::id().to_be_bytes();
                let id = u16::from_be_bytes([hi, lo]);
                let mut seq = 0u16;
                let mut warned = false;
                loop {
                    let started = Instant::now();
                    seq = seq.wrapping_add(1);
                    let cloud: Vec<SocketAddr> = targets
                        .cloud
                        .iter()
                        .chain(
                            targets
                                .resolved
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .iter(),
                        )
                        .copied()
                        .collect();
                    let pinged = match ping_any(&targets.peers, id, seq) {
                        Ok(answered) => answered,
                        Err(e) => {
                            if !warned {
                                tracing::warn!(error = %e, "HA: cannot ping the static peers' endpoints; reach is judged by the cloud alone");
                                warned = true;
                            }
                            false
                        }
                    };
                    if pinged || connect_any(&cloud) {
                        let ms = Instant::now().saturating_duration_since(epoch).as_millis();
                        last.store(u64::try_from(ms).unwrap_or(NEVER - 1), Ordering::Relaxed);
                    }
                    std::thread::sleep(PROBE_EVERY.saturating_sub(started.elapsed()));
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "HA: cannot start the reach prober; reach is not judged");
            return None;
        }
        Some(reach)
    }

    /// Whether an answer came within [`WINDOW`] of `now`.
    pub(super) fn reached(&self, now: Instant) -> bool {
        let last = self.last.load(Ordering::Relaxed);
        if last == NEVER {
            return false;
        }
        let now_ms = now.saturating_duration_since(self.epoch).as_millis();
        now_ms.saturating_sub(u128::from(last)) < WINDOW.as_millis()
    }
}

/// Whether any of `addrs` accepts a TCP connection within [`ANSWER_WAIT`] (all tried at once).
fn connect_any(addrs: &[SocketAddr]) -> bool {
    std::thread::scope(|s| {
        let tries: Vec<_> = addrs
            .iter()
            .map(|a| s.spawn(move || TcpStream::connect_timeout(a, ANSWER_WAIT).is_ok()))
            .collect();
        tries.into_iter().any(|t| t.join().unwrap_or(false))
    })
}

/// Sends each of `peers` an echo request (`id`, `seq`) and waits up to [`ANSWER_WAIT`] for
/// any of them to answer. An error when no raw ICMP socket opens (no `CAP_NET_RAW`).
fn ping_any(peers: &[IpAddr], id: u16, seq: u16) -> std::io::Result<bool> {
    if peers.is_empty() {
        return Ok(false);
    }
    let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = peers.iter().partition(|ip| ip.is_ipv4());
    // A raw socket read through std's datagram calls (recvfrom and sendto are the same).
    let open = |domain, protocol| -> std::io::Result<UdpSocket> {
        let s = Socket::new(domain, Type::RAW, Some(protocol))?;
        s.set_read_timeout(Some(Duration::from_millis(100)))?;
        Ok(s.into())
    };
    let mut sockets = Vec::new();
    if !v4.is_empty() {
        let s = open(Domain::IPV4, Protocol::ICMPV4)?;
        for ip in &v4 {
            let _ = s.send_to(&echo(false, id, seq), SocketAddr::new(*ip, 0));
        }
        sockets.push((s, false));
    }
    if !v6.is_empty() {
        let s = open(Domain::IPV6, Protocol::ICMPV6)?;
        for ip in &v6 {
            let _ = s.send_to(&echo(true, id, seq), SocketAddr::new(*ip, 0));
        }
        sockets.push((s, true));
    }
    let until = Instant::now() + ANSWER_WAIT;
    let mut buf = [0u8; 1500];
    while Instant::now() < until {
        for (s, v6) in &sockets {
            let Ok((n, from)) = s.recv_from(&mut buf) else {
                continue;
            };
            if peers.contains(&from.ip()) && is_our_reply(&buf[..n], *v6, id, seq) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// An echo request, ICMPv6 when `v6` (whose checksum the kernel fills in).
fn echo(v6: bool, id: u16, seq: u16) -> Vec<u8> {
    let mut buf = vec![0u8; 16];
    if v6 {
        if let Some(mut p) = echo_request6::MutableEchoRequestPacket::new(&mut buf) {
            p.set_icmpv6_type(Icmpv6Types::EchoRequest);
            p.set_identifier(id);
            p.set_sequence_number(seq);
        }
        return buf;
    }
    if let Some(mut p) = echo_request::MutableEchoRequestPacket::new(&mut buf) {
        p.set_icmp_type(IcmpTypes::EchoRequest);
        p.set_identifier(id);
        p.set_sequence_number(seq);
    }
    let sum = IcmpPacket::new(&buf).map_or(0, |p| pnet_packet::icmp::checksum(&p));
    if let Some(mut p) = echo_request::MutableEchoRequestPacket::new(&mut buf) {
        p.set_checksum(sum);
    }
    buf
}

/// Whether `bytes` (an IPv4 packet from a raw socket, or an ICMPv6 message when `v6`) is the
/// echo reply to our request `id`/`seq`.
fn is_our_reply(bytes: &[u8], v6: bool, id: u16, seq: u16) -> bool {
    if v6 {
        return echo_reply6::EchoReplyPacket::new(bytes).is_some_and(|r| {
            r.get_icmpv6_type() == Icmpv6Types::EchoReply
                && r.get_identifier() == id
                && r.get_sequence_number() == seq
        });
    }
    let Some(ip) = Ipv4Packet::new(bytes) else {
        return false;
    };
    echo_reply::EchoReplyPacket::new(ip.payload()).is_some_and(|r| {
        r.get_icmp_type() == IcmpTypes::EchoReply
            && r.get_identifier() == id
            && r.get_sequence_number() == seq
    })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpListener};

    use pnet_packet::ipv4::MutableIpv4Packet;

    use super::*;

    #[test]
    fn a_listening_address_answers_and_a_closed_one_does_not() {
        let open = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let closed = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let (open_at, closed_at) = (open.local_addr().unwrap(), closed.local_addr().unwrap());
        drop(closed);
        assert!(connect_any(&[closed_at, open_at]));
        assert!(!connect_any(&[closed_at]));
        assert!(!connect_any(&[]));
    }

    /// Our echo request verifies, and only an echo reply to it (in the IPv4 packet a raw
    /// socket hands over) counts.
    #[test]
    fn only_the_reply_to_our_request_counts() {
        let request = echo(false, 7, 9);
        let parsed = IcmpPacket::new(&request).unwrap();
        assert_eq!(parsed.get_icmp_type(), IcmpTypes::EchoRequest);
        assert_eq!(pnet_packet::icmp::checksum(&parsed), parsed.get_checksum());
        let reply = |kind, id, seq| {
            let mut icmp = echo(false, id, seq);
            icmp[0] = kind;
            let mut ip = vec![0u8; 20 + icmp.len()];
            let mut p = MutableIpv4Packet::new(&mut ip).unwrap();
            p.set_version(4);
            p.set_header_length(5);
            p.set_total_length(u16::try_from(20 + icmp.len()).unwrap());
            p.set_payload(&icmp);
            ip
        };
        assert!(is_our_reply(&reply(0, 7, 9), false, 7, 9));
        assert!(!is_our_reply(&reply(0, 8, 9), false, 7, 9), "another's id");
        assert!(
            !is_our_reply(&reply(0, 7, 8), false, 7, 9),
            "an older round"
        );
        assert!(!is_our_reply(&reply(8, 7, 9), false, 7, 9), "a request");
        assert!(!is_our_reply(&[0x45, 0], false, 7, 9), "cut short");
        let mut v6 = echo(true, 7, 9);
        assert!(!is_our_reply(&v6, true, 7, 9), "a request");
        v6[0] = 129;
        assert!(is_our_reply(&v6, true, 7, 9));
    }

    #[test]
    fn reached_only_within_the_window_of_an_answer() {
        let reach = Reach {
            epoch: Instant::now(),
            last: Arc::new(AtomicU64::new(NEVER)),
        };
        assert!(!reach.reached(reach.epoch), "no answer yet");
        reach.last.store(1000, Ordering::Relaxed);
        let at = |ms| reach.epoch + Duration::from_millis(ms);
        assert!(reach.reached(at(1000)));
        assert!(reach.reached(at(10_999)));
        assert!(!reach.reached(at(11_000)));
    }
}

//! netio against the real kernel: AF_PACKET capture and injection, offload control, UDP
//! batches. Each test builds its own namespace; sockets live on threads moved into it.

#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::net::SocketAddr;
use std::time::Duration;

use cyphonic_e2e::{Netns, require_root, sh, veth};
use cyphonic_netio::{
    AddressWatch, DatagramMeta, FrameMeta, Interface, NetError, PacketOptions, PacketSocket, Rtnl,
    UdpOptions, UdpSocket, netns, wait_any,
};

/// Runs `f` on a thread inside `ns` and returns its result.
fn inside<T: Send + 'static>(ns: &Netns, f: impl FnOnce() -> T + Send + 'static) -> T {
    let name = ns.name().to_owned();
    std::thread::spawn(move || {
        netns::enter(&name).unwrap();
        f()
    })
    .join()
    .unwrap()
}

fn frame(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload_len: usize, marker: u8) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload_len);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend((0..payload_len).map(|i| marker.wrapping_add(i as u8)));
    f
}

/// Receives frames until `within` passes without any; returns them with their metadata.
fn drain(sock: &mut PacketSocket, buf_len: usize, within: Duration) -> Vec<(Vec<u8>, FrameMeta)> {
    drain_until(sock, buf_len, within, |_| false)
}

/// [`drain`], ending early once `enough` holds for what was received.
fn drain_until(
    sock: &mut PacketSocket,
    buf_len: usize,
    within: Duration,
    enough: impl Fn(&[(Vec<u8>, FrameMeta)]) -> bool,
) -> Vec<(Vec<u8>, FrameMeta)> {
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + within;
    let mut storage = vec![vec![0u8; buf_len]; 16];
    while std::time::Instant::now() < deadline && !enough(&out) {
        let mut bufs: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
        let mut meta = [FrameMeta::default(); 16];
        let n = sock.recv_batch(&mut bufs, &mut meta).unwrap();
        for i in 0..n {
            let keep = meta[i].len.min(buf_len);
            out.push((bufs[i][..keep].to_vec(), meta[i]));
        }
    }
    out
}

/// A namespace `name` with a veth pair: `cap0` to capture on, `peer0` (192.0.2.2/24) to send
/// from, to 192.0.2.1 at `cap0`'s MAC.
fn capture_link(name: &str) -> Netns {
    let ns = Netns::new(name).unwrap();
    veth(&ns, "cap0", &ns, "peer0").unwrap();
    ns.ip(&["addr", "add", "192.0.2.2/24", "dev", "peer0"])
        .unwrap();
    let cap_mac = mac_in(&ns, "cap0");
    ns.ip(&[
        "neigh",
        "add",
        "192.0.2.1",
        "lladdr",
        &cap_mac,
        "dev",
        "peer0",
    ])
    .unwrap();
    ns
}

const EXPERIMENTAL: u16 = 0x88b5; // IEEE local experimental ethertype

/// A capture group shares an interface's frames by flow: each flow's frames reach one of its
/// sockets, in order; flows spread over them.
#[test]
fn a_capture_group_keeps_each_flow_on_one_socket_in_order() {
    capture_group_keeps_flows(false);
}

/// The same with each socket of the group reading through its ring.
#[test]
fn a_capture_group_of_rings_keeps_each_flow_on_one_socket_in_order() {
    capture_group_keeps_flows(true);
}

fn capture_group_keeps_flows(ring: bool) {
    require_root();
    let ns = capture_link("nfo");
    let per_socket = inside(&ns, move || {
        let cap = Interface::lookup("cap0").unwrap();
        let opts = PacketOptions {
            recv_timeout: None,
            ring,
            ..PacketOptions::default()
        };
        let mut group = PacketSocket::open_group(&cap, &opts, 4).unwrap();
        assert_eq!(group.len(), 4);
        assert!(group.iter().all(|s| s.ring_bytes().is_some() == ring));
        // A second group on the same interface gets an id of its own (no clash).
        assert_eq!(PacketSocket::open_group(&cap, &opts, 2).unwrap().len(), 2);
        // 16 flows (source ports), 5 datagrams each, interleaved.
        let senders: Vec<_> = (0..16)
            .map(|_| std::net::UdpSocket::bind("192.0.2.2:0").unwrap())
            .collect();
        for seq in 0..5u8 {
            for (flow, s) in senders.iter().enumerate() {
                s.send_to(&[0xfa, flow as u8, seq], "192.0.2.1:9").unwrap();
            }
        }
        let mut per_socket = vec![Vec::new(); group.len()];
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while per_socket.iter().map(Vec::len).sum::<usize>() < 80
            && std::time::Instant::now() < deadline
        {
            let ready = wait_any(&group, Duration::from_millis(100)).unwrap();
            for (i, sock) in group.iter_mut().enumerate() {
                if ready & 1 << i == 0 {
                    continue;
                }
                let mut storage = vec![vec![0u8; 256]; 16];
                let mut bufs: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
                let mut meta = [FrameMeta::default(); 16];
                let n = sock.try_recv_batch(&mut bufs, &mut meta, None).unwrap();
                for (buf, m) in bufs.iter().zip(&meta).take(n) {
                    // Ethernet, IPv4 without options, UDP: the payload starts at 42.
                    let f = &buf[..m.len];
                    if f.len() >= 45 && f[23] == 17 && f[42] == 0xfa {
                        per_socket[i].push((f[43], f[44]));
                    }
                }
            }
        }
        per_socket
    });
    assert_eq!(
        per_socket.iter().map(Vec::len).sum::<usize>(),
        80,
        "{per_socket:?}"
    );
    let mut home = [None; 16];
    for (i, got) in per_socket.iter().enumerate() {
        for &(flow, _) in got {
            let at = home[flow as usize].get_or_insert(i);
            assert_eq!(*at, i, "flow {flow} reached two sockets: {per_socket:?}");
        }
        for flow in 0..16u8 {
            let seqs: Vec<u8> = got.iter().filter(|f| f.0 == flow).map(|f| f.1).collect();
            assert!(
                seqs.is_empty() || seqs == [0, 1, 2, 3, 4],
                "flow {flow}: {seqs:?}"
            );
        }
    }
    let used = per_socket.iter().filter(|s| !s.is_empty()).count();
    assert!(used >= 2, "16 flows all on one socket: {per_socket:?}");
}

#[test]
fn packet_socket_captures_injects_and_reports_metadata() {
    captures_injects_and_reports(false);
}

/// The same through the socket's ring: the same frames, the same metadata.
#[test]
fn a_ring_captures_injects_and_reports_metadata() {
    captures_injects_and_reports(true);
}

fn captures_injects_and_reports(ring: bool) {
    require_root();
    let ns = Netns::new("nio").unwrap();
    veth(&ns, "cap0", &ns, "peer0").unwrap();
    for dev in ["cap0", "peer0"] {
        ns.ip(&["link", "set", dev, "mtu", "9000"]).unwrap();
    }
    // peer0 is a LAN host with a kernel stack; cap0 is our capture side, without an address.
    ns.ip(&["addr", "add", "192.0.2.2/24", "dev", "peer0"])
        .unwrap();
    let cap_mac = mac_in(&ns, "cap0");
    ns.ip(&[
        "neigh",
        "add",
        "192.0.2.1",
        "lladdr",
        &cap_mac,
        "dev",
        "peer0",
    ])
    .unwrap();

    let frames = inside(&ns, move || {
        let cap = Interface::lookup("cap0").unwrap();
        let peer = Interface::lookup("peer0").unwrap();
        let mut sock = PacketSocket::open(
            &cap,
            &PacketOptions {
                timestamps: true,
                ring,
                ..PacketOptions::default()
            },
        )
        .unwrap();
        assert_eq!(
            sock.ring_bytes().is_some(),
            ring,
            "{:?}",
            sock.ring_refused()
        );
        // The kernel switches receive stamps on shortly after a socket asks (deferred work).
        std::thread::sleep(Duration::from_millis(100));
        let tx = PacketSocket::open(
            &peer,
            &PacketOptions {
                promiscuous: false,
                ..PacketOptions::default()
            },
        )
        .unwrap();
        assert!(
            sock.ignores_outgoing(),
            "kernels since 4.20 support PACKET_IGNORE_OUTGOING"
        );
        assert!(sock.recv_buffer() >= 1 << 20);

        // 1. Ten frames to a MAC that is not ours: promiscuous capture sees all, in order.
        for i in 0..10u8 {
            tx.send(&frame(
                [0x02, 0, 0, 0, 0, 0x99],
                peer.mac,
                EXPERIMENTAL,
                100,
                i,
            ))
            .unwrap();
        }
        // 2. A frame we inject ourselves must not come back to us.
        sock.send(&frame(
            [0x02, 0, 0, 0, 0, 0x98],
            cap.mac,
            EXPERIMENTAL,
            60,
            0xee,
        ))
        .unwrap();
        // 3. A 3000-byte frame into 2048-byte buffers: reported truncated with its real length.
        tx.send(&frame(
            [0x02, 0, 0, 0, 0, 0x99],
            peer.mac,
            EXPERIMENTAL,
            3000 - 14,
            0x55,
        ))
        .unwrap();
        // 4. UDP from peer0's own stack: veth leaves the checksum to offload.
        let udp = std::net::UdpSocket::bind("192.0.2.2:0").unwrap();
        udp.send_to(b"partial checksum please", "192.0.2.1:9")
            .unwrap();
        let frames = drain(&mut sock, 2048, Duration::from_millis(500));
        assert_eq!(
            sock.take_drops().unwrap(),
            0,
            "a reader that kept up lost nothing"
        );

        // 5. A socket with the smallest buffer (or ring: 512 KiB) that nobody reads: the
        // kernel drops, and says how many once (reading the count resets it).
        let idle = PacketSocket::open(
            &cap,
            &PacketOptions {
                recv_buffer: 0,
                ring,
                ..PacketOptions::default()
            },
        )
        .unwrap();
        let sent = if ring { 1000 } else { 200 };
        for _ in 0..sent {
            tx.send(&frame(
                [0x02, 0, 0, 0, 0, 0x99],
                peer.mac,
                EXPERIMENTAL,
                1000,
                0x77,
            ))
            .unwrap();
        }
        let dropped = idle.take_drops().unwrap();
        assert!(
            dropped > sent / 3 && dropped <= sent,
            "{dropped} of {sent} dropped"
        );
        assert_eq!(idle.take_drops().unwrap(), 0, "the count was reset");
        frames
    });

    let ours: Vec<_> = frames
        .iter()
        .filter(|(f, _)| f.len() >= 14 && f[12..14] == EXPERIMENTAL.to_be_bytes())
        .collect();
    let markers: Vec<u8> = ours
        .iter()
        .filter(|(_, m)| m.len == 114)
        .map(|(f, _)| f[14])
        .collect();
    assert_eq!(
        markers,
        (0..10).collect::<Vec<u8>>(),
        "ten frames, in order"
    );
    // Each carries the kernel's receive stamp: how long it waited before the read.
    assert!(
        ours.iter()
            .all(|(_, m)| m.queued.is_some_and(|d| d < Duration::from_secs(2))),
        "{:?}",
        ours.iter().map(|(_, m)| m.queued).collect::<Vec<_>>()
    );
    assert!(
        !ours.iter().any(|(f, _)| f.len() > 14 && f[14] == 0xee),
        "our own injected frame came back"
    );
    let big = ours
        .iter()
        .find(|(_, m)| m.len == 3000)
        .expect("the 3000-byte frame");
    assert!(big.1.truncated && big.0.len() == 2048, "{:?}", big.1);
    assert!(
        ours.iter()
            .filter(|(_, m)| m.len != 3000)
            .all(|(_, m)| !m.truncated && !m.outgoing)
    );
    let udp = frames
        .iter()
        .find(|(f, _)| {
            f.len() > 34
                && f[12..14] == [0x08, 0x00]
                && f[23] == 17
                && f.ends_with(b"partial checksum please")
        })
        .expect("the UDP datagram from peer0's stack");
    assert!(
        udp.1.checksum_partial,
        "veth hands the frame over with CHECKSUM_PARTIAL: {:?}",
        udp.1
    );
}

/// `wait_readable` says whether a frame is there: false after its timeout on a quiet
/// interface, true at once when one waits, and false again once it was read.
#[test]
fn packet_socket_waits_for_a_frame() {
    waits_for_a_frame(false);
}

/// The same with a ring: the kernel hands the frame's block over on its timer.
#[test]
fn a_ring_waits_for_a_frame() {
    waits_for_a_frame(true);
}

fn waits_for_a_frame(ring: bool) {
    require_root();
    let ns = Netns::new("nio").unwrap();
    // No IPv6 and no addresses: nothing of the kernel's own crosses the veth.
    ns.exec(
        "sysctl",
        &[
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ],
    )
    .unwrap();
    veth(&ns, "cap0", &ns, "peer0").unwrap();
    inside(&ns, move || {
        let cap = Interface::lookup("cap0").unwrap();
        let peer = Interface::lookup("peer0").unwrap();
        let opts = PacketOptions {
            ring,
            timestamps: true,
            recv_timeout: Some(Duration::from_secs(2)),
            ..PacketOptions::default()
        };
        let mut sock = PacketSocket::open(&cap, &opts).unwrap();
        assert_eq!(sock.ring_bytes().is_some(), ring);
        // The kernel switches receive stamps on shortly after a socket asks (deferred work).
        std::thread::sleep(Duration::from_millis(100));
        let tx = PacketSocket::open(&peer, &PacketOptions::default()).unwrap();
        // Whatever came before (nothing, as set up) is read off first.
        let mut buf = vec![0u8; 2048];
        let mut meta = [FrameMeta::default(); 1];
        while sock.wait_readable(Duration::from_millis(200)).unwrap() {
            sock.recv_batch(&mut [&mut buf[..]], &mut meta).unwrap();
        }
        assert!(!sock.wait_readable(Duration::from_millis(5)).unwrap());
        // A frame to a stranger's MAC from the peer's, marked `n`.
        let marked = move |n| frame([0x02, 0, 0, 0, 0, 0x99], peer.mac, EXPERIMENTAL, 46, n);
        tx.send(&marked(7)).unwrap();
        assert!(sock.wait_readable(Duration::from_secs(2)).unwrap());
        assert_eq!(sock.recv_batch(&mut [&mut buf[..]], &mut meta).unwrap(), 1);
        assert_eq!(buf[14], 7, "the marker of the frame sent");
        assert!(!sock.wait_readable(Duration::ZERO).unwrap());
        // A frame that comes while the receive waits: its wait in the kernel is measured
        // from its stamp to when it was read, not to when the receive began.
        let tx = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            tx.send(&marked(8)).unwrap();
        });
        assert_eq!(sock.recv_batch(&mut [&mut buf[..]], &mut meta).unwrap(), 1);
        tx.join().unwrap();
        assert_eq!(buf[14], 8);
        let queued = meta[0].queued.expect("a stamped frame");
        assert!(
            queued > Duration::ZERO && queued < Duration::from_secs(1),
            "{queued:?}"
        );
    });
}

/// The MAC of `name` in `ns`, as `ip` prints it.
fn mac_in(ns: &Netns, name: &str) -> String {
    let name = name.to_owned();
    let mac = inside(ns, move || Interface::lookup(&name).unwrap().mac);
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[test]
fn interface_errors_say_what_is_wrong() {
    require_root();
    let ns = Netns::new("nie").unwrap();
    veth(&ns, "dn0", &ns, "dn1").unwrap();
    ns.ip(&["link", "set", "dn0", "down"]).unwrap();
    let (missing, down) = inside(&ns, || {
        let missing = Interface::lookup("eth9").unwrap_err();
        let dn0 = Interface::lookup("dn0").unwrap();
        assert!(!dn0.up);
        let down = PacketSocket::open(&dn0, &PacketOptions::default()).unwrap_err();
        (missing.to_string(), down.to_string())
    });
    assert!(
        missing.contains("no such network interface \"eth9\""),
        "{missing}"
    );
    assert!(
        down.contains("dn0 is down") && down.contains("ip link set dn0 up"),
        "{down}"
    );
    let perm = NetError::NotPermitted {
        op: "opening an AF_PACKET socket",
        target: "eth1".into(),
        capability: "CAP_NET_RAW",
    };
    assert!(perm.to_string().contains("needs CAP_NET_RAW"));
}

#[test]
fn receive_offloads_are_switched_off() {
    require_root();
    let ns = Netns::new("nio").unwrap();
    veth(&ns, "gro0", &ns, "gro1").unwrap();
    ns.exec("ethtool", &["-K", "gro0", "gro", "on"]).unwrap();
    assert!(
        ns.exec("ethtool", &["-k", "gro0"])
            .unwrap()
            .contains("generic-receive-offload: on")
    );
    let states = inside(&ns, || {
        cyphonic_netio::disable_receive_offloads("gro0").unwrap()
    });
    assert_eq!(states[0].offload, cyphonic_netio::Offload::Gro);
    assert_eq!(
        (states[0].was_on, states[0].now_on),
        (Some(true), Some(false))
    );
    assert_ne!(states[1].now_on, Some(true), "LRO must not be left on");
    assert!(
        ns.exec("ethtool", &["-k", "gro0"])
            .unwrap()
            .contains("generic-receive-offload: off")
    );
}

#[test]
fn udp_batches_over_ipv4_and_ipv6() {
    require_root();
    let ns = Netns::new("nud").unwrap();
    ns.ip(&["addr", "add", "198.51.100.1/32", "dev", "lo"])
        .unwrap();
    ns.ip(&["addr", "add", "fd00::1/128", "dev", "lo", "nodad"])
        .unwrap();
    inside(&ns, || {
        let mut rx = UdpSocket::bind("[::]:0".parse().unwrap(), &UdpOptions::default()).unwrap();
        let port = rx.local_addr().unwrap().port();
        assert!(rx.buffer_sizes().0 >= 1 << 20, "{:?}", rx.buffer_sizes());
        assert!(rx.coalescing(), "this kernel has UDP GRO");
        let plain = UdpOptions {
            coalescing: false,
            ..UdpOptions::default()
        };
        let mut rx_plain = UdpSocket::bind("[::]:0".parse().unwrap(), &plain).unwrap();
        assert!(!rx_plain.coalescing());
        // Sizes that all differ (no runs); then runs of equal sizes broken by shorter,
        // longer and empty datagrams and by 64-segment and 65,000-byte limits: the segmented
        // sends must arrive as the same datagrams, in order, with segmentation on and off.
        let varied: Vec<Vec<u8>> = (0..100u32)
            .map(|i| vec![i as u8; 1 + (i as usize * 13) % 1400])
            .collect();
        let runs: Vec<Vec<u8>> = (0..300u32)
            .map(|i| {
                let len = match i {
                    _ if i % 37 == 36 => 0,
                    _ if i % 11 == 10 => 200 + i as usize,
                    _ if i < 100 => 1400,
                    _ if i < 200 => 1200 + (i as usize / 20),
                    _ => 60,
                };
                vec![i as u8; len]
            })
            .collect();
        for (from, to, plain) in [
            ("198.51.100.1:0", "198.51.100.1", false),
            ("[fd00::1]:0", "fd00::1", false),
            ("198.51.100.1:0", "198.51.100.1", true),
            ("[fd00::1]:0", "fd00::1", true),
        ] {
            let receiver = if plain { &mut rx_plain } else { &mut rx };
            let port = receiver.local_addr().unwrap().port();
            let coalescing = receiver.coalescing();
            let to: SocketAddr = format!(
                "{}:{port}",
                if to.contains(':') {
                    format!("[{to}]")
                } else {
                    to.to_owned()
                }
            )
            .parse()
            .unwrap();
            for segmentation in [true, false] {
                let opts = UdpOptions {
                    segmentation,
                    ..UdpOptions::default()
                };
                let tx = UdpSocket::bind(from.parse().unwrap(), &opts).unwrap();
                for payloads in [&varied, &runs] {
                    let msgs: Vec<(SocketAddr, &[u8])> =
                        payloads.iter().map(|p| (to, p.as_slice())).collect();
                    let (sent, failed, err) = tx.send_batch(&msgs);
                    assert_eq!((sent, failed), (payloads.len(), 0), "{err:?}");
                    assert_eq!(tx.segmentation(), segmentation, "loopback can segment");
                    let mut got = Vec::new();
                    let mut storage = vec![vec![0u8; 2048]; 64];
                    // Every other call offers a few buffers only, fewer than a run holds.
                    let mut offered = [64, 5].into_iter().cycle();
                    while got.len() < payloads.len() {
                        let few = offered.next().unwrap_or(64);
                        let mut bufs: Vec<&mut [u8]> = storage
                            .iter_mut()
                            .take(few)
                            .map(Vec::as_mut_slice)
                            .collect();
                        let mut meta = [DatagramMeta::default(); 64];
                        let n = receiver.recv_batch(&mut bufs, &mut meta).unwrap();
                        assert!(n > 0, "timed out after {} datagrams", got.len());
                        for i in 0..n {
                            assert_eq!(
                                meta[i].from,
                                tx.local_addr().unwrap(),
                                "sender as the peer sees it"
                            );
                            got.push(bufs[i][..meta[i].len].to_vec());
                        }
                    }
                    assert!(
                        &got == payloads,
                        "{from}, segmentation {segmentation}, coalescing {coalescing}"
                    );
                }
            }
        }
        // A datagram larger than the buffer is reported, not silently cut.
        let tx =
            UdpSocket::bind("198.51.100.1:0".parse().unwrap(), &UdpOptions::default()).unwrap();
        tx.send_to(
            &[7u8; 3000],
            format!("198.51.100.1:{port}").parse().unwrap(),
        )
        .unwrap();
        let mut small = [0u8; 512];
        let mut bufs: [&mut [u8]; 1] = [&mut small];
        let mut meta = [DatagramMeta::default(); 1];
        assert_eq!(rx.recv_batch(&mut bufs, &mut meta).unwrap(), 1);
        assert!(meta[0].truncated && meta[0].len == 3000, "{:?}", meta[0]);
    });
}

/// A run the kernel will not segment (its segments are over the route's MTU: EMSGSIZE) is sent
/// one datagram at a time instead (the kernel fragments them); nothing is lost, order holds,
/// and segmentation stays on for the runs that fit.
#[test]
fn udp_runs_the_kernel_refuses_to_segment_go_one_by_one() {
    require_root();
    let ns = Netns::new("nug").unwrap();
    ns.ip(&["link", "set", "lo", "mtu", "1300"]).unwrap();
    ns.ip(&["addr", "add", "198.51.100.1/32", "dev", "lo"])
        .unwrap();
    inside(&ns, || {
        let mut rx =
            UdpSocket::bind("198.51.100.1:0".parse().unwrap(), &UdpOptions::default()).unwrap();
        let to = rx.local_addr().unwrap();
        let tx =
            UdpSocket::bind("198.51.100.1:0".parse().unwrap(), &UdpOptions::default()).unwrap();
        let payloads: Vec<Vec<u8>> = (0..20u8)
            .map(|i| vec![i; if i < 10 { 1400 } else { 1000 }])
            .collect();
        let msgs: Vec<(SocketAddr, &[u8])> = payloads.iter().map(|p| (to, p.as_slice())).collect();
        let (sent, failed, err) = tx.send_batch(&msgs);
        assert_eq!((sent, failed), (20, 0), "{err:?}");
        assert!(
            tx.segmentation(),
            "a too-large segment does not switch segmentation off"
        );
        let mut got = Vec::new();
        let mut storage = vec![vec![0u8; 2048]; 64];
        while got.len() < payloads.len() {
            let mut bufs: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
            let mut meta = [DatagramMeta::default(); 64];
            let n = rx.recv_batch(&mut bufs, &mut meta).unwrap();
            assert!(n > 0, "timed out after {} datagrams", got.len());
            got.extend((0..n).map(|i| bufs[i][..meta[i].len].to_vec()));
        }
        assert!(got == payloads);
    });
}

/// An address watch hears its own namespace's address and route changes (and reads all of a
/// burst in one call), and nothing from another namespace.
#[test]
fn address_watch_hears_address_and_route_changes_in_its_namespace() {
    require_root();
    let ns = Netns::new("nwa").unwrap();
    let other = Netns::new("nwb").unwrap();
    for n in [&ns, &other] {
        veth(n, "wan", n, "wanp").unwrap();
    }
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let (step_tx, step) = std::sync::mpsc::channel::<()>();
    let name = ns.name().to_owned();
    let watcher = std::thread::spawn(move || {
        netns::enter(&name).unwrap();
        let watch = AddressWatch::open(Duration::from_millis(200)).unwrap();
        let mut heard = Vec::new();
        ready_tx.send(()).unwrap();
        // Each step: the test changed something (or not); report what one wait saw, after
        // giving the kernel's notifications a moment to queue.
        while step.recv().is_ok() {
            std::thread::sleep(Duration::from_millis(50));
            heard.push(watch.wait().unwrap());
            ready_tx.send(()).unwrap();
        }
        heard
    });
    let mut expect = Vec::new();
    let mut act = |what: &dyn Fn(), changed: bool| {
        ready.recv().unwrap();
        what();
        expect.push(changed);
        step_tx.send(()).unwrap();
    };
    act(&|| {}, false);
    act(
        &|| {
            ns.ip(&["addr", "add", "203.0.113.2/24", "dev", "wan"])
                .unwrap();
            ns.ip(&["addr", "add", "203.0.113.3/24", "dev", "wan"])
                .unwrap();
        },
        true,
    );
    // The whole burst was read by the previous call.
    act(&|| {}, false);
    act(
        &|| {
            other
                .ip(&["addr", "add", "203.0.113.9/24", "dev", "wan"])
                .unwrap();
        },
        false,
    );
    act(
        &|| {
            ns.ip(&["route", "add", "default", "via", "203.0.113.1"])
                .unwrap();
        },
        true,
    );
    act(
        &|| {
            ns.ip(&["addr", "add", "fd00::2/64", "dev", "wan", "nodad"])
                .unwrap();
        },
        true,
    );
    act(
        &|| {
            ns.ip(&["addr", "del", "203.0.113.2/24", "dev", "wan"])
                .unwrap();
        },
        true,
    );
    ready.recv().unwrap();
    drop(step_tx);
    assert_eq!(watcher.join().unwrap(), expect);
}

/// What the HA pair judges its uplink by: the interface the kernel routes a destination out
/// of, and whether that interface carries packets. A link whose far end is down no longer
/// carries; a link set down loses its routes; unreachable and blackhole routes are no route.
#[test]
fn the_kernel_says_where_a_destination_goes_out_and_whether_that_link_carries() {
    require_root();
    let ns = Netns::new("nrt").unwrap();
    let far = Netns::new("nrtf").unwrap();
    veth(&ns, "wan", &far, "wanp").unwrap();
    ns.ip(&["addr", "add", "198.51.100.2/24", "dev", "wan"])
        .unwrap();
    ns.ip(&["addr", "add", "fd00::2/64", "dev", "wan", "nodad"])
        .unwrap();
    ns.ip(&["route", "add", "203.0.113.0/25", "via", "198.51.100.1"])
        .unwrap();
    ns.ip(&["route", "add", "blackhole", "203.0.113.128/25"])
        .unwrap();
    ns.ip(&["route", "add", "unreachable", "192.0.2.0/24"])
        .unwrap();
    let wan = inside(&ns, || Interface::lookup("wan").unwrap().index);
    let look = move || {
        let mut rtnl = Rtnl::open().unwrap();
        let routes = [
            "203.0.113.7",
            "fd00::9",
            "203.0.113.200",
            "192.0.2.1",
            "100.64.0.1",
        ]
        .map(|ip| rtnl.route_out(ip.parse().unwrap()).unwrap());
        (routes, rtnl.link_carries(wan).unwrap())
    };
    assert_eq!(
        inside(&ns, look),
        ([Some(wan), Some(wan), None, None, None], true)
    );
    // Through which router and from which source (what a port mapping asks and from where).
    let via = inside(&ns, || {
        let mut rtnl = Rtnl::open().unwrap();
        ["203.0.113.7", "fd00::9"].map(|ip| rtnl.route_to(ip.parse().unwrap()).unwrap())
    });
    let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
    assert_eq!(
        via,
        [
            Some(cyphonic_netio::Route {
                interface: wan,
                gateway: ip("198.51.100.1"),
                source: ip("198.51.100.2"),
            }),
            Some(cyphonic_netio::Route {
                interface: wan,
                gateway: None,
                source: ip("fd00::2"),
            }),
        ]
    );
    far.ip(&["link", "set", "dev", "wanp", "down"]).unwrap();
    let (routes, carries) = inside(&ns, look);
    assert_eq!(
        routes[0],
        Some(wan),
        "a link without carrier keeps its routes"
    );
    assert!(!carries, "a link whose far end is down carries nothing");
    far.ip(&["link", "set", "dev", "wanp", "up"]).unwrap();
    ns.ip(&["link", "set", "dev", "wan", "down"]).unwrap();
    let (routes, carries) = inside(&ns, look);
    assert_eq!(routes, [None; 5], "a link set down takes its routes");
    assert!(!carries);
    let err = inside(&ns, || Rtnl::open().unwrap().link_carries(999_999).is_err());
    assert!(
        err,
        "no such interface is an error, not a link that carries"
    );
}

#[test]
fn namespaces_are_removed_when_dropped() {
    require_root();
    let name = {
        let ns = Netns::new("ndr").unwrap();
        ns.name().to_owned()
    };
    assert!(
        !sh("ip", &["netns", "list"])
            .unwrap()
            .lines()
            .any(|l| l.split_whitespace().next() == Some(&name))
    );
}

/// A TUN device: configured with an address, MTU and up; a packet the host routes into it is
/// read whole; a packet written into it reaches a socket; nothing waiting is a timeout, not an
/// error; dropping it removes the interface.
#[test]
fn tun_device_carries_packets_both_ways_and_goes_away_with_its_handle() {
    use std::net::Ipv4Addr;

    use cyphonic_netio::{LargeFrames, PartialChecksum, Tun};
    require_root();
    let ns = Netns::new("tun").unwrap();
    inside(&ns, || {
        let tun = Tun::create("cytest%d", false, false).unwrap();
        assert_eq!(tun.offloads(), None);
        let name = tun.name().to_owned();
        assert!(name.starts_with("cytest"), "{name}");
        tun.configure(Ipv4Addr::new(100, 64, 9, 1), 24, None, 1400)
            .unwrap();
        let iface = Interface::lookup(&name).unwrap();
        assert!(iface.up);
        assert_eq!(iface.mtu, 1400);

        let host = std::net::UdpSocket::bind("100.64.9.1:0").unwrap();
        host.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        host.send_to(b"into the tunnel", "100.64.9.2:9999").unwrap();
        let mut buf = [0u8; 2048];
        let mut large = LargeFrames::with_slots(buf.len(), 1);
        let read = tun
            .recv(&mut buf, &mut large, Duration::from_secs(2))
            .unwrap()
            .expect("the host's packet");
        assert_eq!(
            (read.checksum, read.coalesced, read.truncated),
            (None, None, false)
        );
        let packet = &buf[..read.len];
        assert_eq!(packet[0] >> 4, 4, "IPv4, with no packet-info header");
        assert_eq!(&packet[16..20], &[100, 64, 9, 2]);
        assert!(packet.ends_with(b"into the tunnel"));

        let port = host.local_addr().unwrap().port();
        let frame = cyphonic_e2e::inject::udp_frame(
            [0; 6],
            [0; 6],
            Ipv4Addr::new(100, 64, 9, 2),
            Ipv4Addr::new(100, 64, 9, 1),
            9999,
            port,
            b"out of the tunnel",
        );
        tun.send(&frame[14..], None).unwrap();
        assert!(
            tun.send(
                &frame[14..],
                Some(PartialChecksum {
                    start: 20,
                    offset: 6
                })
            )
            .is_err(),
            "no partial checksum without offloads"
        );
        let (n, from) = host.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"out of the tunnel");
        assert_eq!(from, "100.64.9.2:9999".parse::<SocketAddr>().unwrap());

        assert_eq!(
            tun.recv(&mut buf, &mut large, Duration::from_millis(50))
                .unwrap(),
            None
        );
        drop(tun);
        assert!(matches!(
            Interface::lookup(&name),
            Err(NetError::NoSuchInterface(_))
        ));
        // A name the kernel cannot take is refused before asking it.
        assert!(matches!(
            Tun::create("a-name-far-too-long-for-linux", false, false),
            Err(NetError::BadInterfaceName(_))
        ));
    });
}

/// Issue 53: a TUN device given an IPv6 address carries the host's IPv6 to the overlay's
/// range both ways, and nothing of IPv6's link traffic: no Router Solicitation, no Duplicate
/// Address Detection, no link-local source, before or after the host's packet. Asked for no
/// USO, it reports none.
#[test]
fn a_tun_device_with_ipv6_carries_it_and_no_link_traffic() {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use cyphonic_netio::{LargeFrames, Tun};
    require_root();
    let ns = Netns::new("tun6").unwrap();
    inside(&ns, || {
        let tun = Tun::create("cyt6%d", true, false).unwrap();
        assert_eq!(tun.offloads().map(|o| o.udp), Some(false));
        let ours: Ipv6Addr = "fd7a:0:1:4000::1".parse().unwrap();
        tun.configure(Ipv4Addr::new(100, 64, 9, 1), 24, Some((ours, 48)), 1400)
            .unwrap();
        // At once: the address is not held back for Duplicate Address Detection.
        let host = std::net::UdpSocket::bind((ours, 0)).unwrap();
        host.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        host.send_to(b"into the tunnel", "[fd7a:0:1:4001::1]:9999")
            .unwrap();
        let mut buf = [0u8; 2048];
        let mut large = LargeFrames::with_slots(buf.len(), 1);
        let mut others = Vec::new();
        let packet = loop {
            let read = tun
                .recv(&mut buf, &mut large, Duration::from_secs(2))
                .unwrap()
                .expect("the host's packet");
            let p = buf[..read.len].to_vec();
            if p.ends_with(b"into the tunnel") {
                break p;
            }
            others.push(p);
        };
        assert_eq!(packet[0] >> 4, 6);
        assert_eq!(&packet[8..24], &ours.octets());
        // Anything else it sent in a second: none of it IPv6 link traffic.
        while let Some(read) = tun
            .recv(&mut buf, &mut large, Duration::from_millis(1000))
            .unwrap()
        {
            others.push(buf[..read.len].to_vec());
        }
        assert!(others.is_empty(), "{others:02x?}");

        // Back: a packet from the overlay reaches the host's socket.
        let port = host.local_addr().unwrap().port();
        let mut back = vec![0x60, 0, 0, 0, 0, 0, 17, 64];
        back.extend_from_slice(&"fd7a:0:1:4001::1".parse::<Ipv6Addr>().unwrap().octets());
        back.extend_from_slice(&ours.octets());
        let payload = b"out of the tunnel";
        let len = u16::try_from(8 + payload.len()).unwrap();
        back[4..6].copy_from_slice(&len.to_be_bytes());
        back.extend_from_slice(&9999u16.to_be_bytes());
        back.extend_from_slice(&port.to_be_bytes());
        back.extend_from_slice(&len.to_be_bytes());
        back.extend_from_slice(&[0, 0]);
        back.extend_from_slice(payload);
        // The field holds the pseudo-header's sum, as a host leaves it for offload; finished
        // as the node finishes one (the sum from the UDP header on).
        let mut pseudo = back[8..40].to_vec();
        pseudo.extend_from_slice(&u32::from(len).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 17]);
        back[46..48].copy_from_slice(&(!cyphonic_e2e::inject::checksum(&pseudo)).to_be_bytes());
        let sum = cyphonic_gateway::finish_partial_checksum(&mut back, 40, 6, false);
        assert_eq!(sum, Some(false));
        tun.send(&back, None).unwrap();
        let (n, from) = host.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], payload);
        assert_eq!(
            from,
            "[fd7a:0:1:4001::1]:9999".parse::<SocketAddr>().unwrap()
        );
    });
}

/// A TUN device with offloads: a `UDP_SEGMENT` send from the host arrives as one super-packet
/// that says how to cut it (where the kernel has USO, Linux 6.2+; otherwise as datagrams), its
/// checksum left to us, and the gateway's segmenter cuts it into the datagrams sent, with
/// right checksums. Written in with its checksum left partial, a packet reaches its socket;
/// the same bytes without that note are dropped by the host's stack as damaged.
#[test]
fn an_offloading_tun_device_hands_over_super_packets_and_takes_partial_checksums() {
    use std::net::Ipv4Addr;

    use cyphonic_gateway::{GsoKind, Segmenter};
    use cyphonic_netio::{LargeFrames, PartialChecksum, Tun, UdpOptions, UdpSocket};
    require_root();
    let ns = Netns::new("tuno").unwrap();
    inside(&ns, || {
        let tun = Tun::create("cyoff%d", true, true).unwrap();
        let offloads = tun.offloads().expect("offloads on");
        assert!(offloads.tcp);
        tun.configure(Ipv4Addr::new(100, 64, 9, 1), 24, None, 1400)
            .unwrap();
        let mut host = UdpSocket::bind(
            "100.64.9.1:0".parse().unwrap(),
            &UdpOptions {
                recv_timeout: Some(Duration::from_millis(500)),
                coalescing: false,
                ..UdpOptions::default()
            },
        )
        .unwrap();
        let to: SocketAddr = "100.64.9.2:9999".parse().unwrap();
        let datagrams: Vec<Vec<u8>> = (0..5u8)
            .map(|d| (0..1000u16).map(|i| d ^ (i % 251) as u8).collect())
            .collect();
        let msgs: Vec<(SocketAddr, &[u8])> = datagrams.iter().map(|d| (to, &d[..])).collect();
        assert_eq!(host.send_batch(&msgs).0, 5);

        let mut buf = [0u8; 2048];
        let mut large = LargeFrames::with_slots(buf.len(), 1);
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut super_packets = 0;
        while got.len() < 5 {
            let read = tun
                .recv(&mut buf, &mut large, Duration::from_secs(2))
                .unwrap()
                .expect("the host's datagrams");
            assert!(!read.truncated);
            let sum = read.checksum.expect("the checksum left to us");
            assert_eq!((sum.start, sum.offset), (20, 6));
            let head = read.len.min(buf.len());
            let packet = large.join(0, &buf[..head], read.len).unwrap().to_vec();
            match read.coalesced {
                Some(how) => {
                    assert!(offloads.udp, "a super-packet only with USO");
                    assert_eq!(how.kind, cyphonic_netio::GsoKind::UdpL4);
                    assert_eq!(how.segment_size, 1000);
                    assert_eq!(packet.len(), 20 + 8 + 5000);
                    super_packets += 1;
                    let mut cut =
                        Segmenter::ip(&packet, GsoKind::Udp, how.segment_size, 1500).unwrap();
                    let mut seg = [0u8; 1500];
                    while let Some(n) = cut.next_into(&mut seg) {
                        got.push(seg[..n].to_vec());
                    }
                }
                None => {
                    let mut p = packet;
                    let sum = cyphonic_gateway::finish_partial_checksum(&mut p, 20, 6, false);
                    assert_eq!(sum, Some(false));
                    got.push(p);
                }
            }
        }
        assert_eq!(got.len(), 5);
        assert_eq!(
            super_packets,
            usize::from(offloads.udp),
            "one send, one read with USO"
        );
        for (p, d) in got.iter().zip(&datagrams) {
            assert_eq!(&p[28..], &d[..], "the datagrams as sent, in order");
            assert_eq!(l4_sum(p), 0xffff, "UDP checksum");
        }

        // Into the device: a datagram whose checksum field holds only the pseudo-header sum.
        let port = host.local_addr().unwrap().port();
        let frame = cyphonic_e2e::inject::udp_frame(
            [0; 6],
            [0; 6],
            Ipv4Addr::new(100, 64, 9, 2),
            Ipv4Addr::new(100, 64, 9, 1),
            9999,
            port,
            b"checksum left to the host",
        );
        let mut partial = frame[14..].to_vec();
        // What a partial checksum's field holds: the pseudo-header sum.
        let pseudo = pseudo_sum(&partial);
        partial[26..28].copy_from_slice(&pseudo.to_be_bytes());
        assert_ne!(l4_sum(&partial), 0xffff);
        let note = PartialChecksum {
            start: 20,
            offset: 6,
        };
        let mut bufs = [[0u8; 2048]; 1];
        let mut meta = [DatagramMeta::default(); 1];
        let mut recv = |host: &mut UdpSocket| {
            let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            let n = host.recv_batch(&mut refs, &mut meta).unwrap();
            (n > 0).then(|| bufs[0][..meta[0].len].to_vec())
        };
        tun.send(&partial, None).unwrap();
        assert_eq!(recv(&mut host), None, "a wrong checksum is dropped");
        tun.send(&partial, Some(note)).unwrap();
        assert_eq!(
            recv(&mut host).as_deref(),
            Some(&b"checksum left to the host"[..])
        );
    });
}

/// With GRO on and offload headers asked for, a TCP flow from a wire-like sender arrives as
/// coalesced frames that say how they were made; the gateway's Segmenter cuts them back into
/// segments that carry exactly the bytes the sender wrote, with valid checksums. The socket
/// also still sends (the offload header it needs in front of each frame is added for us).
#[test]
fn coalesced_frames_arrive_with_their_offload_header_and_cut_back_into_the_stream() {
    coalesced_frames_cut_back(false);
}

/// The same through a ring: a coalesced frame fits a block whole, offload header in front.
#[test]
fn coalesced_frames_arrive_whole_through_a_ring() {
    coalesced_frames_cut_back(true);
}

fn coalesced_frames_cut_back(ring: bool) {
    use cyphonic_gateway::{GsoKind, Segmenter};
    use cyphonic_netio::{Coalesced, LargeFrames};
    use std::io::{Read, Write};

    require_root();
    let tx = Netns::new("ngs").unwrap();
    let rx = Netns::new("ngr").unwrap();
    veth(&tx, "gs0", &rx, "gr0").unwrap();
    tx.ip(&["addr", "add", "198.51.100.1/24", "dev", "gs0"])
        .unwrap();
    rx.ip(&["addr", "add", "198.51.100.2/24", "dev", "gr0"])
        .unwrap();
    tx.exec("ethtool", &["-K", "gs0", "tso", "off", "gso", "off"])
        .unwrap();
    rx.exec("ethtool", &["-K", "gr0", "gro", "on"]).unwrap();
    const BYTES: usize = 8 << 20;
    const HEAD: usize = 2048;

    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let rx_name = rx.name().to_owned();
    let capture = std::thread::spawn(move || {
        netns::enter(&rx_name).unwrap();
        let iface = Interface::lookup_up("gr0").unwrap();
        // A buffer that holds the whole stream: the kernel must not drop a frame while this
        // (debug-built, shared-core) thread is late, or the bytes check below would fail for
        // the machine's sake, not the code's.
        let opts = PacketOptions {
            coalesced: true,
            recv_timeout: Some(Duration::from_millis(50)),
            recv_buffer: 64 << 20,
            ring,
            ..PacketOptions::default()
        };
        let mut sock = PacketSocket::open(&iface, &opts).unwrap();
        assert_eq!(
            sock.ring_bytes().is_some(),
            ring,
            "{:?}",
            sock.ring_refused()
        );
        let listener = std::net::TcpListener::bind("198.51.100.2:5001").unwrap();
        ready_tx.send(()).unwrap();
        let reader = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut sink = vec![0u8; 1 << 16];
            let mut total = 0;
            while total < BYTES {
                match conn.read(&mut sink).unwrap() {
                    0 => break,
                    n => total += n,
                }
            }
            total
        });
        let mut large = LargeFrames::new(HEAD);
        let mut storage = vec![vec![0u8; HEAD]; 16];
        // Capture first, cut afterwards, so the loop keeps up with the sender.
        let mut captured: Vec<(Vec<u8>, FrameMeta)> = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut quiet = 0;
        // Until the receiver has the whole stream and the socket has then been quiet a while.
        while std::time::Instant::now() < deadline && !(reader.is_finished() && quiet >= 4) {
            let mut bufs: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
            let mut meta = [FrameMeta::default(); 16];
            let n = sock
                .recv_batch_large(&mut bufs, &mut meta, &mut large)
                .unwrap();
            quiet = if n == 0 { quiet + 1 } else { 0 };
            for i in 0..n {
                let m = meta[i];
                assert!(!m.truncated, "{m:?}");
                // Only the sender's frames towards the listener (not our ACKs going out).
                let head = &bufs[i][..m.len.min(HEAD)];
                if head.len() < 38
                    || head[12..14] != [8, 0]
                    || head[36..38] != 5001u16.to_be_bytes()
                {
                    continue;
                }
                captured.push((large.join(i, head, m.len).unwrap().to_vec(), m));
            }
        }
        assert_eq!(sock.take_drops().unwrap(), 0, "the capture lost no frame");
        // (frame, whether its checksum must be whole: a frame passed on as it came may carry a
        // partial one, which the adapter completes)
        let mut segments: Vec<(Vec<u8>, bool)> = Vec::new();
        let (mut coalesced, mut biggest) = (0usize, 0usize);
        for (frame, m) in captured {
            match m.coalesced {
                Some(Coalesced {
                    kind: cyphonic_netio::GsoKind::TcpV4,
                    segment_size,
                }) => {
                    coalesced += 1;
                    biggest = biggest.max(m.len);
                    let mut s = Segmenter::new(&frame, GsoKind::Tcp, segment_size, HEAD).unwrap();
                    let mut out = [0u8; HEAD];
                    while let Some(len) = s.next_into(&mut out) {
                        segments.push((out[..len].to_vec(), true));
                    }
                }
                None => segments.push((frame, !m.checksum_partial)),
                Some(other) => panic!("unexpected offload {other:?}"),
            }
        }
        // The socket sends too: an experimental frame to the other side.
        let probe = frame([0xff; 6], iface.mac, EXPERIMENTAL, 60, 9);
        sock.send(&probe).unwrap();
        (reader.join().unwrap(), segments, coalesced, biggest)
    });
    ready_rx.recv().unwrap();
    let tx_name = tx.name().to_owned();
    let (probe_seen, written) = std::thread::spawn(move || {
        netns::enter(&tx_name).unwrap();
        let iface = Interface::lookup_up("gs0").unwrap();
        let mut watch = PacketSocket::open(&iface, &PacketOptions::default()).unwrap();
        let mut conn = std::net::TcpStream::connect("198.51.100.2:5001").unwrap();
        let data: Vec<u8> = (0..BYTES).map(|i| (i % 251) as u8).collect();
        conn.write_all(&data).unwrap();
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        let frames = drain(&mut watch, 2048, Duration::from_secs(3));
        let seen = frames
            .iter()
            .any(|(f, _)| f.len() >= 14 && f[12..14] == EXPERIMENTAL.to_be_bytes() && f[14] == 9);
        (seen, data.len())
    })
    .join()
    .unwrap();
    let (read, segments, coalesced, biggest) = capture.join().unwrap();
    assert_eq!(read, written, "the receiver got the whole stream");
    assert!(
        coalesced > 0,
        "GRO coalesced nothing: the test proves nothing"
    );
    assert!(
        biggest > 1514,
        "coalesced frames are larger than the wire's: {biggest}"
    );
    assert!(
        probe_seen,
        "a frame sent on the socket with offload headers arrived"
    );

    // Rebuild the stream from the segments by sequence number and check every byte.
    let mut isn = None;
    let mut got = vec![false; BYTES];
    let mut checked = 0;
    for (s, whole) in &segments {
        let ip = &s[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        assert!(total <= 1500, "every segment fits the wire: {total}");
        let t = &ip[ihl..total];
        let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
        if t[13] & 0x02 != 0 {
            isn = Some(seq.wrapping_add(1));
            continue;
        }
        let doff = usize::from(t[12] >> 4) * 4;
        let payload = &t[doff..];
        let start = seq.wrapping_sub(isn.expect("the SYN came first")) as usize;
        for (k, b) in payload.iter().enumerate() {
            if start + k < BYTES {
                assert_eq!(*b, ((start + k) % 251) as u8, "byte {}", start + k);
                got[start + k] = true;
            }
        }
        if !whole {
            continue;
        }
        checked += 1;
        assert_eq!(l4_sum(ip), 0xffff, "TCP checksum of a segment");
    }
    assert!(checked > 0, "no segment's checksum was checked");
    let missing = got.iter().filter(|g| !**g).count();
    assert_eq!(missing, 0, "every byte of the stream was in a segment");
}

/// The ones'-complement sum of the IPv4 pseudo-header and the TCP segment or UDP datagram in
/// `ip` (a whole IPv4 packet without options): 0xffff when its checksum is right.
fn l4_sum(ip: &[u8]) -> u32 {
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let t = &ip[ihl..total];
    let mut sum: u32 = u32::from(ip[9]) + t.len() as u32;
    for c in ip[12..20].chunks(2).chain(t.chunks(2)) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// The IPv4 pseudo-header sum of the TCP segment or UDP datagram in `ip` (a whole IPv4 packet
/// without options), folded and not complemented: what checksum offload expects in the field.
fn pseudo_sum(ip: &[u8]) -> u16 {
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let mut sum: u32 = u32::from(ip[9]) + (total - 20) as u32;
    for c in ip[12..20].chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Writes the header checksum of the 20-byte IPv4 header at the start of `ip`.
fn fill_ip_checksum(ip: &mut [u8]) {
    ip[10..12].fill(0);
    let mut sum: u32 = ip[..20]
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

/// An Ethernet frame of one TCP/IPv4 segment (ACK, timestamps) with valid checksums.
fn tcp_segment(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let total = 20 + 32 + payload.len();
    let mut f = frame([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1], 0x0800, total, 0);
    let ip = &mut f[14..];
    ip[..20].copy_from_slice(&[
        0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 6, 0, 0, 198, 51, 100, 1, 198, 51, 100, 2,
    ]);
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    fill_ip_checksum(ip);
    let t = &mut ip[20..];
    t[..20].copy_from_slice(&[
        0x9c, 0x40, 0x14, 0x51, 0, 0, 0, 0, 0, 0, 0, 7, 0x80, flags, 0x01, 0xf5, 0, 0, 0, 0,
    ]);
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[20..32].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
    t[32..].copy_from_slice(payload);
    let sum = l4_sum(ip);
    ip[36..38].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    assert_eq!(l4_sum(&f[14..]), 0xffff);
    f
}

/// An Ethernet frame of one UDP/IPv4 datagram with valid checksums.
fn udp_datagram(payload: &[u8]) -> Vec<u8> {
    let mut f = tcp_segment(0, 0x10, &[]);
    f.truncate(14 + 20);
    let total = 20 + 8 + payload.len();
    f.resize(14 + total, 0);
    let ip = &mut f[14..];
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[9] = 17;
    fill_ip_checksum(ip);
    let u = &mut ip[20..];
    u[..4].copy_from_slice(&[0x1b, 0x58, 0x13, 0x89]);
    u[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u[8..].copy_from_slice(payload);
    let sum = !(l4_sum(&f[14..]) as u16);
    f[14 + 26..14 + 28].copy_from_slice(&(if sum == 0 { 0xffff } else { sum }).to_be_bytes());
    assert_eq!(l4_sum(&f[14..]), 0xffff);
    f
}

/// Segments and datagrams merged by the gateway's coalescing go out through a device that
/// cannot segment or checksum (TSO and transmit checksumming off): the kernel cuts them in
/// software, and what reaches the wire is the original packets with checksums it completed
/// from the pseudo-header sum we left. Frames without offload pass as they are.
#[test]
fn merged_tcp_frames_are_cut_by_the_kernel_into_the_original_segments() {
    use cyphonic_netio::{Gathered, Gso};

    require_root();
    let ns = Netns::new("nms").unwrap();
    veth(&ns, "ms0", &ns, "mr0").unwrap();
    ns.exec("ethtool", &["-K", "ms0", "tso", "off", "tx", "off"])
        .unwrap();
    let segments: Vec<Vec<u8>> = (0..20u32)
        .map(|i| {
            let payload: Vec<u8> = (0..1000u32).map(|k| ((i * 1000 + k) % 251) as u8).collect();
            tcp_segment(
                1_000_000 + i * 1000,
                if i == 19 { 0x18 } else { 0x10 },
                &payload,
            )
        })
        .collect();
    let datagrams: Vec<Vec<u8>> = (0..8u32)
        .map(|i| {
            let len = if i == 7 { 333 } else { 1200 };
            udp_datagram(
                &(0..len)
                    .map(|k| ((i * 7 + k) % 253) as u8)
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let to_send = (segments.clone(), datagrams.clone());
    let received = inside(&ns, move || {
        let (segments, datagrams) = to_send;
        let tx_if = Interface::lookup_up("ms0").unwrap();
        let rx_if = Interface::lookup_up("mr0").unwrap();
        let opts = PacketOptions {
            coalesced: true,
            ..PacketOptions::default()
        };
        let tx = PacketSocket::open(&tx_if, &opts).unwrap();
        let mut rx = PacketSocket::open(&rx_if, &PacketOptions::default()).unwrap();
        let refs: Vec<&[u8]> = segments.iter().map(Vec::as_slice).collect();
        let run = cyphonic_gateway::find_run(cyphonic_gateway::Framing::Ethernet, &refs, &[], 64)
            .unwrap();
        assert_eq!(run.count, 20, "one run");
        let mut first = segments[0].clone();
        cyphonic_gateway::merge_headers(&mut first, &run, 0x18);
        let mut parts: Vec<&[u8]> = vec![&first];
        parts.extend(segments[1..].iter().map(|s| &s[run.headers..]));
        // Then one frame alone, without offload.
        let alone = frame([0xff; 6], tx_if.mac, EXPERIMENTAL, 100, 3);
        parts.push(&alone);
        // Then a run of UDP datagrams (the last shorter).
        let udp_refs: Vec<&[u8]> = datagrams.iter().map(Vec::as_slice).collect();
        let udp_run =
            cyphonic_gateway::find_run(cyphonic_gateway::Framing::Ethernet, &udp_refs, &[], 64)
                .unwrap();
        assert_eq!(udp_run.count, 8, "one UDP run");
        let mut udp_first = datagrams[0].clone();
        cyphonic_gateway::merge_headers(&mut udp_first, &udp_run, 0);
        parts.push(&udp_first);
        parts.extend(datagrams[1..].iter().map(|d| &d[udp_run.headers..]));
        let messages = [
            Gathered {
                parts: 0..20,
                gso: Some(Gso {
                    kind: cyphonic_netio::GsoKind::TcpV4,
                    headers: run.headers as u16,
                    l4_start: 34,
                    segment_size: run.segment_size,
                }),
            },
            Gathered {
                parts: 20..21,
                gso: None,
            },
            Gathered {
                parts: 21..29,
                gso: Some(Gso {
                    kind: cyphonic_netio::GsoKind::UdpL4,
                    headers: udp_run.headers as u16,
                    l4_start: 34,
                    segment_size: udp_run.segment_size,
                }),
            },
        ];
        let mut refusals = Vec::new();
        let sent = tx.send_gathered(&parts, &messages, |m, e| refusals.push((m, e.to_string())));
        assert_eq!((sent, refusals), (3, vec![]));
        // Until the last UDP datagram (the 333-byte one: 14 + 20 + 8 + 333 bytes) is in,
        // or 5 s: on a loaded machine the kernel may take longer than half a second.
        drain_until(&mut rx, 2048, Duration::from_secs(5), |got| {
            got.iter()
                .any(|(f, _)| f.len() == 14 + 20 + 8 + 333 && f[23] == 17)
        })
    });
    cut_back_into(&received, 6, &segments, "TCP segments");
    assert!(
        received
            .iter()
            .any(|(f, _)| f[12..14] == EXPERIMENTAL.to_be_bytes() && f[14] == 3),
        "the frame without offload arrived"
    );
    cut_back_into(&received, 17, &datagrams, "UDP datagrams");
}

/// Asserts that the frames of IP protocol `proto` among `received` are exactly `want`, in
/// order, with checksums the kernel completed: everything equal but the IP ID and header
/// checksum, which the kernel numbers itself.
fn cut_back_into(received: &[(Vec<u8>, FrameMeta)], proto: u8, want: &[Vec<u8>], what: &str) {
    let got: Vec<_> = received
        .iter()
        .filter(|(f, _)| f[12..14] == [8, 0] && f[23] == proto)
        .collect();
    assert_eq!(
        got.len(),
        want.len(),
        "the kernel cut the merged frame into {what}"
    );
    for (i, ((f, m), want)) in got.iter().zip(want).enumerate() {
        assert!(
            !m.checksum_partial,
            "transmit checksumming is off: all completed"
        );
        assert_eq!(l4_sum(&f[14..]), 0xffff, "{what} {i}: checksum");
        assert_eq!(f[..18], want[..18], "{what} {i}");
        assert_eq!(f[20..24], want[20..24], "{what} {i}");
        assert_eq!(
            f[26..],
            want[26..],
            "{what} {i}: headers, flags and payload"
        );
    }
}

/// A per-CPU capture group gives socket `i` the frames received on the CPUs whose number is
/// `i` modulo the group's size: on a veth, the sender's CPU (the test pins its sender to each
/// of two CPUs in turn).
#[test]
fn a_per_cpu_capture_group_gives_each_socket_its_cpu_s_frames() {
    require_root();
    let cpus = cyphonic_netio::allowed_cpus().unwrap();
    let Some(pair) = [0, 1]
        .iter()
        .map(|r| cpus.iter().copied().find(|c| c % 2 == *r))
        .collect::<Option<Vec<usize>>>()
    else {
        eprintln!("no odd and even CPU to send from: {cpus:?}");
        return;
    };
    let ns = capture_link("npc");
    let sender_cpus = pair.clone();
    let per_socket = inside(&ns, move || {
        let pair = sender_cpus;
        let cap = Interface::lookup("cap0").unwrap();
        let opts = PacketOptions {
            recv_timeout: Some(Duration::from_millis(200)),
            ..PacketOptions::default()
        };
        let mut group = PacketSocket::open_per_cpu(&cap, &opts, 2).unwrap();
        if group.len() == 1 {
            eprintln!("the kernel cannot keep a fanout group off outgoing frames: one socket");
            return vec![Vec::new(); 2];
        }
        assert_eq!(group.len(), 2);
        assert!(group.iter().all(PacketSocket::ignores_outgoing));
        // A frame this host sends on the port (marked 9): the group must not see it.
        let mut ours = vec![0u8; 45];
        ours[..6].fill(0xff);
        ours[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        ours[14] = 0x45;
        ours[23] = 17;
        ours[42..45].copy_from_slice(&[0xfb, 9, 0]);
        PacketSocket::open(&cap, &opts)
            .unwrap()
            .send(&ours)
            .unwrap();
        // From each CPU in turn, five datagrams naming it.
        let pair = pair.clone();
        std::thread::spawn(move || {
            let s = std::net::UdpSocket::bind("192.0.2.2:0").unwrap();
            for (i, &cpu) in pair.iter().enumerate() {
                cyphonic_netio::Placement {
                    cpus: vec![cpu],
                    realtime_priority: 0,
                }
                .apply()
                .unwrap();
                for seq in 0..5u8 {
                    s.send_to(&[0xfb, i as u8, seq], "192.0.2.1:9").unwrap();
                }
            }
        })
        .join()
        .unwrap();
        group
            .iter_mut()
            .map(|sock| {
                drain(sock, 256, Duration::from_millis(500))
                    .into_iter()
                    .filter(|(f, _)| f.len() >= 45 && f[23] == 17 && f[42] == 0xfb)
                    .map(|(f, _)| (f[43], f[44]))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    });
    if per_socket.iter().all(Vec::is_empty) {
        return;
    }
    let from = |i: u8| (0..5).map(|seq| (i, seq)).collect::<Vec<_>>();
    assert_eq!(per_socket, [from(0), from(1)], "by remainder of {pair:?}");
}

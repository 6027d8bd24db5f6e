//! netio against the real kernel: AF_PACKET capture and injection, offload control, UDP
//! batches. Each test builds its own namespace; sockets live on threads moved into it.

#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::net::SocketAddr;
use std::time::Duration;

use cyphonic_e2e::{Netns, require_root, sh, veth};
use cyphonic_netio::{
    AddressWatch, DatagramMeta, FrameMeta, Interface, NetError, PacketOptions, PacketSocket,
    UdpOptions, UdpSocket, netns,
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
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + within;
    let mut storage = vec![vec![0u8; buf_len]; 16];
    while std::time::Instant::now() < deadline {
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

const EXPERIMENTAL: u16 = 0x88b5; // IEEE local experimental ethertype

#[test]
fn packet_socket_captures_injects_and_reports_metadata() {
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

    let frames = inside(&ns, || {
        let cap = Interface::lookup("cap0").unwrap();
        let peer = Interface::lookup("peer0").unwrap();
        let mut sock = PacketSocket::open(&cap, &PacketOptions::default()).unwrap();
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
        drain(&mut sock, 2048, Duration::from_millis(500))
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
                    while got.len() < payloads.len() {
                        let mut bufs: Vec<&mut [u8]> =
                            storage.iter_mut().map(Vec::as_mut_slice).collect();
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

    use cyphonic_netio::Tun;
    require_root();
    let ns = Netns::new("tun").unwrap();
    inside(&ns, || {
        let tun = Tun::create("cytest%d").unwrap();
        let name = tun.name().to_owned();
        assert!(name.starts_with("cytest"), "{name}");
        tun.configure(Ipv4Addr::new(100, 64, 9, 1), 24, 1400)
            .unwrap();
        let iface = Interface::lookup(&name).unwrap();
        assert!(iface.up);
        assert_eq!(iface.mtu, 1400);

        let host = std::net::UdpSocket::bind("100.64.9.1:0").unwrap();
        host.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        host.send_to(b"into the tunnel", "100.64.9.2:9999").unwrap();
        let mut buf = [0u8; 2048];
        let n = tun
            .recv(&mut buf, Duration::from_secs(2))
            .unwrap()
            .expect("the host's packet");
        let packet = &buf[..n];
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
        tun.send(&frame[14..]).unwrap();
        let (n, from) = host.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"out of the tunnel");
        assert_eq!(from, "100.64.9.2:9999".parse::<SocketAddr>().unwrap());

        assert_eq!(tun.recv(&mut buf, Duration::from_millis(50)).unwrap(), None);
        drop(tun);
        assert!(matches!(
            Interface::lookup(&name),
            Err(NetError::NoSuchInterface(_))
        ));
        // A name the kernel cannot take is refused before asking it.
        assert!(matches!(
            Tun::create("a-name-far-too-long-for-linux"),
            Err(NetError::BadInterfaceName(_))
        ));
    });
}

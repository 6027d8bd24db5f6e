//! TCP between devices' stacks, over a clean underlay and a faulty one.

use super::host::Host;
use super::*;

/// A short TCP transfer between stacks on devices behind the two adapters: 256 KiB from
/// gw1's side to gw2's, whole and in order (the handshake's MSS clamped on the way, the
/// segments through both pipelines).
#[test]
fn a_tcp_transfer_crosses_whole() {
    let link = Link::new(8);
    let _ = tcp_transfer(&link, 256 * 1024);
}

/// 128 KiB over an underlay that loses, duplicates, corrupts and reorders datagrams: the
/// tunnel refuses the duplicates as replays and the corrupted as forgeries (counted), TCP
/// sends again what was lost, and the bytes arrive whole and in order.
#[test]
fn a_tcp_transfer_crosses_a_faulty_underlay_whole() {
    let link = Link::new(9);
    link.set_faults(Faults {
        drop: 0.05,
        duplicate: 0.05,
        corrupt: 0.05,
        reorder: 0.1,
        ..Faults::default()
    });
    let docs = tcp_transfer(&link, 128 * 1024);
    let stats = link.stats();
    assert!(
        stats.dropped > 0 && stats.duplicated > 0 && stats.corrupted > 0 && stats.reordered > 0,
        "{stats:?}"
    );
    // The duplicates were refused as replays and the corrupted as forgeries, by the
    // tunnel, before the LAN: a replayed or forged frame never reaches a device.
    let dropped = |why: &str| -> u64 {
        docs.iter()
            .map(|d| {
                d["pipelines"]["ingress"]["drops"][why]
                    .as_u64()
                    .expect("a drop count")
            })
            .sum()
    };
    let (replays, forged) = (dropped("replay"), dropped("auth"));
    assert!(
        (1..=stats.duplicated).contains(&replays),
        "{replays} replays, {stats:?}"
    );
    assert!(
        (1..=stats.corrupted).contains(&forged),
        "{forged} forged, {stats:?}"
    );
}

/// `size` bytes over TCP from a device behind gw1 to one behind gw2, on `link`; the two
/// adapters' status documents after it.
fn tcp_transfer(link: &Link, size: usize) -> [serde_json::Value; 2] {
    let (_f, one, two) = sites(link);
    let (ip1, gw1_mac) = one.device.lease("client");
    let (ip2, gw2_mac) = two.device.lease("server");
    let mut client = Host::new(one.device, ip1, gw1_mac);
    let mut server = Host::new(two.device, ip2, gw2_mac);
    let (c, s) = (client.tcp(), server.tcp());
    server.socket(s).listen(7000).expect("a listener");
    let cx = client.iface.context();
    client
        .sockets
        .get_mut::<smoltcp::socket::tcp::Socket<'static>>(c)
        .connect(cx, (smoltcp::wire::IpAddress::Ipv4(ip2), 7000), 49_152)
        .expect("a connection");

    let data: Vec<u8> = (0..size)
        .map(|i| u8::try_from(i % 251).unwrap_or(0))
        .collect();
    let (mut sent, mut got) = (0, Vec::with_capacity(size));
    let mut chunk = vec![0u8; 65_536];
    let deadline = Instant::now() + PATIENCE;
    while got.len() < size {
        assert!(
            Instant::now() < deadline,
            "{} of {size} bytes within {PATIENCE:?} ({sent} sent)",
            got.len()
        );
        client.pump();
        server.pump();
        let socket = client.socket(c);
        if socket.can_send() && sent < size {
            sent += socket.send_slice(&data[sent..]).expect("sent");
        }
        let socket = server.socket(s);
        while socket.can_recv() {
            let n = socket.recv_slice(&mut chunk).expect("received");
            got.extend_from_slice(&chunk[..n]);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(got == data, "the bytes arrived whole and in order");
    assert_eq!(
        client.socket(c).remote_endpoint().map(|e| e.port),
        Some(7000)
    );
    [&one.end, &two.end].map(|end| end.status().expect("the adapter answers"))
}

//! The relay over a stream against the cloud's real relay, on loopback: a side carried over
//! TLS (or plain TCP) and a side on UDP exchange datagrams through one channel; a client
//! given another certificate's digest binds nothing; a source holding every unbound place
//! gets no more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cyphonic_cloud::config::{RelayConfig, StreamListen};
use cyphonic_cloud::trs::Party;
use cyphonic_control::{RelayInfo, RelayReason, bind_frame, parse_challenge};
use cyphonic_stream::Streams;
use tokio::io::AsyncReadExt as _;
use tokio::net::UdpSocket;

/// A relay on loopback with a stream listener, in TLS when `tls`.
async fn relay(tls: bool, ports: std::ops::RangeInclusive<u16>) -> Arc<cyphonic_cloud::Trs> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls = tls.then(|| {
        let ck = rcgen::generate_simple_self_signed(vec!["relay.example".to_owned()]).unwrap();
        let (chain, key) = (ck.cert.pem(), ck.signing_key.serialize_pem());
        cyphonic_cloud::tls::Tls {
            files: ["relay.crt".into(), "relay.key".into()],
            config: cyphonic_cloud::tls::tls_config(
                chain.as_bytes(),
                key.as_bytes(),
                cyphonic_cloud::tls::RELAY_ALPN,
            )
            .unwrap(),
            digest: cyphonic_cloud::tls::leaf_digest(chain.as_bytes()).unwrap(),
        }
    });
    let trs = Arc::new(cyphonic_cloud::Trs::new(RelayConfig {
        addresses: vec!["127.0.0.1".parse().unwrap()],
        ports,
        idle: Duration::from_secs(120),
        stream: Some(StreamListen {
            listen: listener.local_addr().unwrap(),
            tls,
        }),
    }));
    tokio::spawn(trs.clone().serve_streams(listener));
    trs
}

fn party(name: &str) -> Party<'_> {
    Party {
        fingerprint: name,
        name,
        legacy: false,
    }
}

/// Waits until `f` holds, for at most 10 s.
async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 10 s");
}

/// Binds a UDP side to the channel at `channel` from `sock`, answering the challenge.
async fn bind_udp(sock: &UdpSocket, channel: SocketAddr, token: &[u8; 16]) {
    sock.send_to(&bind_frame(token, None), channel)
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let (n, from) = tokio::time::timeout(Duration::from_secs(5), sock.recv_from(&mut buf))
        .await
        .expect("no challenge")
        .unwrap();
    assert_eq!(from, channel);
    let cookie = parse_challenge(&buf[..n]).unwrap();
    sock.send_to(&bind_frame(token, Some(&cookie)), channel)
        .await
        .unwrap();
}

async fn recv(sock: &UdpSocket) -> (Vec<u8>, SocketAddr) {
    let mut buf = [0u8; 2048];
    let (n, from) = tokio::time::timeout(Duration::from_secs(5), sock.recv_from(&mut buf))
        .await
        .expect("nothing came")
        .unwrap();
    (buf[..n].to_vec(), from)
}

async fn a_stream_side_and_a_udp_side_talk(tls: bool, ports: std::ops::RangeInclusive<u16>) {
    let trs = relay(tls, ports).await;
    let channel = trs
        .channel(party("a"), party("b"), RelayReason::NoDirectHandshake)
        .await
        .unwrap();
    let address: SocketAddr = format!("127.0.0.1:{}", channel.port).parse().unwrap();
    let stream = trs.stream_info(false, None).unwrap();
    assert_eq!(stream.tls.is_some(), tls);
    let info = RelayInfo {
        address,
        token: channel.token_for("a").unwrap(),
        reason: channel.reason,
        stream: Some(stream),
    };
    // Side a: its tunnel socket, and the channel carried over the stream.
    let tunnel = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let streams = Streams::start(tunnel.local_addr().unwrap()).unwrap();
    let local = streams.open(&info).unwrap();
    assert_eq!(
        streams.open(&info).unwrap(),
        local,
        "the same channel twice"
    );
    assert!(local.ip().is_loopback());
    // Side b on UDP.
    let b = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    bind_udp(&b, address, &channel.token_for("b").unwrap()).await;
    until("both sides bound", || {
        trs.stats.binds.load(Ordering::Relaxed) >= 2
    })
    .await;
    assert_eq!(streams.stats.connects.load(Ordering::Relaxed), 1);
    // The engine's own UDP binds to the channel are not passed on; data is.
    tunnel
        .send_to(&bind_frame(&info.token, None), local)
        .await
        .unwrap();
    tunnel.send_to(b"from a", local).await.unwrap();
    assert_eq!(recv(&b).await, (b"from a".to_vec(), address));
    b.send_to(b"from b", address).await.unwrap();
    assert_eq!(recv(&tunnel).await, (b"from b".to_vec(), local));
    // Anyone else on this host sending to the local address reaches nobody.
    let other = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    other.send_to(b"stranger", local).await.unwrap();
    until("the stranger counted", || {
        streams.stats.foreign.load(Ordering::Relaxed) == 1
    })
    .await;
    tunnel.send_to(b"again", local).await.unwrap();
    assert_eq!(recv(&b).await.0, b"again");
    assert_eq!(trs.stats.relayed_packets.load(Ordering::Relaxed), 3);
    assert_eq!(streams.stats.sent.load(Ordering::Relaxed), 2);
    assert_eq!(streams.stats.received.load(Ordering::Relaxed), 1);
    trs.close_all();
}

/// docs/protocol.md §4, *Relay over a stream*: one channel, side a over TLS pinned to the
/// relay's certificate, side b over UDP: datagrams pass both ways, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_over_tls_and_a_side_over_udp_share_a_channel() {
    a_stream_side_and_a_udp_side_talk(true, 42_400..=42_409).await;
}

/// The same over plain TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_over_tcp_and_a_side_over_udp_share_a_channel() {
    a_stream_side_and_a_udp_side_talk(false, 42_410..=42_419).await;
}

/// A client given another certificate's digest does not finish TLS, and binds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_certificate_is_refused() {
    let trs = relay(true, 42_420..=42_429).await;
    let channel = trs
        .channel(party("a"), party("b"), RelayReason::NoDirectHandshake)
        .await
        .unwrap();
    let mut stream = trs.stream_info(false, None).unwrap();
    stream.tls = Some("00".repeat(32));
    let info = RelayInfo {
        address: format!("127.0.0.1:{}", channel.port).parse().unwrap(),
        token: channel.token_for("a").unwrap(),
        reason: channel.reason,
        stream: Some(stream),
    };
    let tunnel = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let streams = Streams::start(tunnel.local_addr().unwrap()).unwrap();
    streams.open(&info).unwrap();
    until("the connection refused", || {
        streams.stats.connect_failures.load(Ordering::Relaxed) >= 1
    })
    .await;
    assert_eq!(streams.stats.connects.load(Ordering::Relaxed), 0);
    assert_eq!(trs.stats.binds.load(Ordering::Relaxed), 0);
    trs.close_all();
}

/// A source holding 8 connections that bound nothing gets no ninth: it is closed before its
/// hello; another source is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_holds_at_most_eight_unbound_connections() {
    let trs = relay(false, 42_430..=42_439).await;
    let to = trs.stream_info(false, None).unwrap().address;
    let mut held = Vec::new();
    let mut hello = [0u8; 4];
    for _ in 0..8 {
        let mut c = tokio::net::TcpStream::connect(to).await.unwrap();
        c.read_exact(&mut hello).await.unwrap();
        held.push(c);
    }
    let mut ninth = tokio::net::TcpStream::connect(to).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), ninth.read(&mut hello))
        .await
        .expect("the ninth was neither served nor closed")
        .unwrap_or(0);
    assert_eq!(n, 0, "the ninth was served");
    assert_eq!(trs.stats.streams_refused.load(Ordering::Relaxed), 1);
    let local = tokio::net::TcpSocket::new_v4().unwrap();
    local.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = local.connect(to).await.unwrap();
    other.read_exact(&mut hello).await.unwrap();
    trs.close_all();
}

//! `cyphonic-bed attack` and `seeds`: what attacks cost the adapter, and fuzz seeds captured
//! from the bed.

use super::*;

/// The floods of `attack`: initiations a second offered (0: none), from how many addresses
/// that answer B's cookie-replies (0: one forged address that never does), and to which
/// port of B's: its tunnel's, or a closed one (the control of the row before it: the same
/// flood, the same sending, nothing for B to do but drop it).
pub(crate) const ATTACK_FLOODS: [(u32, usize, u16); 5] = [
    (0, 0, 51820),
    (10_000, 0, 51820),
    (50_000, 0, 51820),
    (10_000, 250, 51899),
    (10_000, 250, 51820),
];
/// DHCP DISCOVERs the device on lanB sends a second during each row.
pub(crate) const DHCP_PER_SEC: u64 = 10;

/// Real frames off the bed, as fuzz seeds: each target's directory gets the captures its
/// input is made of.
pub(crate) fn seeds(out: &std::path::Path) -> anyhow::Result<()> {
    use cyphonic_e2e::{attack, inject};
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        ..BedOptions::default()
    })?;
    let control = bed.cloud.as_ref().context("the cloud runs")?.address;
    // A's control handshake and probes, as it reconnects.
    bed.stop(Side::A, "TERM")?;
    let hello = attack::spawn_capture_first_control_frame(
        &bed.wan,
        "toa",
        control.port(),
        Duration::from_secs(10),
    );
    let probes =
        inject::spawn_capture_udp(&bed.wan, "toa", 7001, 2, Duration::from_secs(10), |p| {
            p.get(1) == Some(&6)
        });
    std::thread::sleep(Duration::from_millis(500));
    bed.start(Side::A)?;
    let hello = inject::joined(hello)?;
    let probes = inject::joined(probes)?;
    // The tunnel's frames both ways while a device pings across: initiation, response,
    // keepalives and data.
    let from_a =
        inject::spawn_capture_udp(&bed.wan, "toa", 51820, 8, Duration::from_secs(10), |_| true);
    let from_b =
        inject::spawn_capture_udp(&bed.wan, "tob", 51820, 8, Duration::from_secs(10), |_| true);
    std::thread::sleep(Duration::from_millis(500));
    // A's device asks B's device's name: the cloud pairs the adapters, the tunnel comes up.
    cyphonic_e2e::wait_until(Duration::from_secs(10), "A resolves B's device", || {
        dig(&bed.a.lan, bed.a.gateway, "host.gw2.ovl.example", "A")
            .is_ok_and(|d| !d.answers.is_empty())
    })?;
    bed.ping_ok(
        &bed.a.lan,
        bed.b.host_ip,
        cyphonic_e2e::bed::Ping::count(4).wait(3),
    );
    let mut tunnel = inject::joined(from_a)?;
    tunnel.extend(inject::joined(from_b)?);
    let write = |target: &str, name: &str, bytes: &[u8]| -> anyhow::Result<()> {
        let dir = out.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)?;
        Ok(())
    };
    let kind = |f: &[u8]| {
        f.get(1).map_or_else(
            || "empty".to_owned(),
            |t| {
                cyphonic_wire::MessageType::from(*t)
                    .to_string()
                    .replace(' ', "-")
            },
        )
    };
    for (i, f) in tunnel.iter().enumerate() {
        write("wire_frame", &format!("captured-{i:02}-{}", kind(f)), f)?;
        if f.get(1) == Some(&1) {
            write("handshake_init", &format!("captured-{i:02}"), f)?;
        }
    }
    // `ServerHandshake::accept` takes the frame without its length prefix.
    write(
        "control_message",
        "captured-hello",
        hello.get(2..).unwrap_or_default(),
    )?;
    for (i, p) in probes.iter().enumerate() {
        write("control_message", &format!("captured-probe-{i}"), p)?;
    }
    println!(
        "{} tunnel frames, a control hello of {} bytes and {} probes written under {}",
        tunnel.len(),
        hello.len(),
        probes.len(),
        out.display()
    );
    Ok(())
}

pub(crate) fn attack(seconds: u64) -> anyhow::Result<AttackReport> {
    use cyphonic_e2e::{attack, inject};
    use std::net::SocketAddr;
    use std::time::Instant;
    let mut bed = TwoSites::up(&BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    })?;
    let init = attack::capture_initiation(&bed)?;
    let (asker_ns, asker_mac) = bed.add_host(Side::B, "asker")?;
    let asker_mac = cyphonic_e2e::bed::parse_mac(&asker_mac)?;
    let pid = bed.b.adapter.as_ref().context("adapter B runs")?.pid();
    let forged: SocketAddr = "203.0.113.1:0".parse()?;
    let target = bed.b.host_ip.to_string();
    let mut rows = Vec::new();
    // The cookie-answering addresses' initiations carry a hint of their own: they never saw
    // A's (docs/protocol.md §2, known peers first).
    let b_key = attack::static_key(&bed.b.dir.join("gw2.ovl.example.crt"))?;
    let answering_init = attack::with_hint(&init, &b_key, [0x5a; 16])?;
    let mut flooders = Vec::new();
    for (rate, sources, port) in ATTACK_FLOODS {
        eprintln!(
            "bench: attack, {rate} initiations a second from {sources} sources to port {port} ..."
        );
        let to_b = SocketAddr::new(bed.b.underlay, port);
        // Long enough for the settling second, TCP, the pings, and a margin.
        let flood_for = Duration::from_secs(seconds + 6);
        let flood = match (rate, sources) {
            (0, _) => None,
            (_, 0) => Some(inject::spawn_flood_udp(
                &bed.wan,
                forged,
                to_b,
                init.clone(),
                rate,
                flood_for,
            )),
            (_, n) => {
                // One host for every such row (the addresses are set up once).
                if flooders.is_empty() {
                    flooders.push(attack::flooding_host(&bed, n)?);
                }
                let (host, addresses) = &flooders[0];
                let per_source = rate / u32::try_from(n)?;
                let flood = attack::spawn_cookie_answering_flood(
                    host,
                    addresses.clone(),
                    to_b,
                    answering_init.clone(),
                    b_key,
                    per_source,
                    flood_for,
                );
                Some(std::thread::spawn(move || {
                    flood
                        .join()
                        .map_err(|_| anyhow::anyhow!("the flood thread panicked"))?
                        .map(|f| f.sent)
                }))
            }
        };
        // Two seconds: the cookie-answering sources need their cookies first.
        std::thread::sleep(Duration::from_secs(if sources > 0 { 2 } else { 1 }));
        let counter = |name: &str| bed.counter(Side::B, name);
        let (checked0, cookies0, dhcp0) = (
            counter("handshake_inits")?,
            counter("cookie_replies_sent")?,
            counter("dhcp_sent")?,
        );
        let ticks0 = attack::thread_ticks(pid)?;
        let start = Instant::now();
        let stop_asking = std::sync::atomic::AtomicBool::new(false);
        let (tcp, rtt, asked) = std::thread::scope(|s| -> anyhow::Result<_> {
            let asking = s.spawn(|| -> anyhow::Result<u64> {
                let mut asked = 0u64;
                while !stop_asking.load(std::sync::atomic::Ordering::Relaxed) {
                    let msg = cyphonic_vip::testing::client_message(
                        cyphonic_vip::testing::MessageType::Discover,
                        asker_mac,
                        u32::try_from(asked).unwrap_or(0) + 1,
                        vec![],
                        std::net::Ipv4Addr::UNSPECIFIED,
                        true,
                    );
                    let frame = inject::udp_frame(
                        [0xff; 6],
                        asker_mac,
                        std::net::Ipv4Addr::UNSPECIFIED,
                        std::net::Ipv4Addr::BROADCAST,
                        68,
                        67,
                        &msg,
                    );
                    inject::send_frames(&asker_ns, "eth0", vec![frame])?;
                    asked += 1;
                    std::thread::sleep(Duration::from_millis(1000 / DHCP_PER_SEC));
                }
                Ok(asked)
            });
            let tcp = tcp_by_name(&bed.b.lan, &bed.a.lan, &target, seconds);
            let ping = bed
                .a
                .lan
                .exec_output("ping", &["-c", "20", "-i", "0.1", "-W", "2", &target]);
            stop_asking.store(true, std::sync::atomic::Ordering::Relaxed);
            let asked = asking
                .join()
                .map_err(|_| anyhow::anyhow!("the DHCP asker panicked"))??;
            let rtt = measure::parse_ping(&String::from_utf8_lossy(&ping?.stdout), 20);
            Ok((tcp?, rtt, asked))
        })?;
        let elapsed = start.elapsed().as_secs_f64();
        // The last replies are on their way for a moment.
        std::thread::sleep(Duration::from_millis(300));
        let ticks1 = attack::thread_ticks(pid)?;
        let percent = attack::thread_percent(&ticks0, &ticks1, elapsed);
        // Each of these threads runs for the daemon's whole life: one missing is an error,
        // not 0% of a core.
        let cpu = |name: &str| {
            percent
                .get(name)
                .copied()
                .with_context(|| format!("adapter B has no {name} thread"))
        };
        let sent = match flood {
            Some(f) => f
                .join()
                .map_err(|_| anyhow::anyhow!("the flood thread panicked"))??,
            None => 0,
        };
        rows.push(AttackRow {
            rate,
            sources: u32::try_from(sources)?,
            closed_port: port != 51820,
            sent,
            tcp_gbps: tcp,
            rtt,
            control_cpu_pct: cpu("control")?,
            handshake_cpu_pct: cpu("cy-handshake")?,
            receive_cpu_pct: cpu("cy-udp-rx")?,
            checked: counter("handshake_inits")? - checked0,
            cookie_replies: counter("cookie_replies_sent")? - cookies0,
            dhcp_asked: asked,
            dhcp_answered: counter("dhcp_sent")? - dhcp0,
        });
    }
    Ok(AttackReport {
        measured: measured(seconds),
        dhcp_per_sec: DHCP_PER_SEC,
        rows,
    })
}

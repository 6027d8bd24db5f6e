//! `cyphonic-bed bench` and `peers`: the measurements `cargo xtask bench` renders, and the
//! bed's shapes and rates they share with the other measurements.

use super::*;

/// The adapters' default inner MTU (`adapter.inner_mtu`), which their DHCP hands out.
pub(crate) const INNER_MTU: u16 = 1420;

/// Offered rate of the 1400-byte UDP run, Mbit/s.
pub(crate) const BIG_RATE: u64 = 400;

pub(crate) const UDP_RATES: [u64; 10] = [100, 200, 400, 600, 800, 1000, 1250, 1500, 2000, 3000];
pub(crate) const UDP_SIZE: usize = 1300;
/// TCP runs per figure; the median is reported.
pub(crate) const RUNS: usize = 3;
/// `dataplane.busy_poll_us` of the busy-polling runs: longer than the 10 ms between the
/// bench's pings, so that the receiving threads poll through a whole ping run.
pub(crate) const BUSY_POLL_US: u32 = 20_000;

pub(crate) fn measure_bed(bed: &TwoSites, seconds: u64) -> anyhow::Result<Profile> {
    measure::warm_up(bed)?;
    let idle = measure::ping(bed, Side::A, bed.b.host_ip, 300, Duration::from_millis(10))?;
    let tcp1 = measure::tcp_median(bed, 1, seconds, RUNS)?;
    let tcp4 = measure::tcp_median(bed, 4, seconds, RUNS)?;
    let (udp, udp_tried) = measure::udp_search(bed, &UDP_RATES, UDP_SIZE, 3)?;
    let overload = measure::udp(bed, 0, UDP_SIZE, 3)?;
    // The LAN host takes the MTU the adapter's DHCP hands out (the default inner MTU), as a
    // DHCP client would, so it fragments 1400-byte datagrams itself, in both beds.
    bed.a
        .lan
        .ip(&["link", "set", "eth0", "mtu", &INNER_MTU.to_string()])?;
    let big = measure::udp(bed, BIG_RATE, 1400, 3);
    bed.a.lan.ip(&["link", "set", "eth0", "mtu", "1500"])?;
    let big = big?;
    let loaded = measure::ping_under_load(bed, 5)?;
    Ok(Profile {
        tcp1,
        tcp4,
        udp,
        udp_tried,
        overload,
        big,
        idle,
        loaded,
    })
}

/// TCP with 1 and 4 streams through a tunnel built with `opts`, and adapter A's count of
/// packets emitted out of order.
pub(crate) fn ablation_run(opts: &BedOptions, seconds: u64) -> anyhow::Result<Ablation> {
    let bed = TwoSites::up(opts)?;
    measure::warm_up(&bed)?;
    let tcp1 = measure::tcp_median(&bed, 1, seconds, RUNS)?;
    let tcp4 = measure::tcp_median(&bed, 4, seconds, RUNS)?;
    Ok(Ablation {
        tcp1,
        tcp4,
        out_of_order: egress_out_of_order(&bed)?,
    })
}

/// Packets adapter A's egress pipeline emitted out of order so far.
pub(crate) fn egress_out_of_order(bed: &TwoSites) -> anyhow::Result<u64> {
    bed.status(Side::A)?["pipelines"]["egress"]["out_of_order"]
        .as_u64()
        .context("adapter A's status has no pipelines.egress.out_of_order")
}

pub(crate) fn bench(seconds: u64) -> anyhow::Result<BenchReport> {
    let gro_off = BedOptions {
        lan_gro: false,
        ..BedOptions::default()
    };
    eprintln!("bench: plain kernel routing ...");
    let plain = {
        let bed = TwoSites::new(&gro_off)?;
        bed.route_plainly()?;
        measure_bed(&bed, seconds)?
    };
    eprintln!("bench: the cyphonic tunnel ...");
    let (tunnel, tunnel_out_of_order) = {
        let bed = TwoSites::up(&gro_off)?;
        let r = measure_bed(&bed, seconds)?;
        (r, egress_out_of_order(&bed)?)
    };
    let mut ablation = Vec::new();
    for batch in [32usize, 1] {
        let run = |ordering| {
            eprintln!("bench: ablation, batch_size = {batch}, ordering = {ordering} ...");
            let opts = BedOptions {
                ordering,
                // Every batch through the pool: inline batches never overtake anything, so
                // they would hide what ordering does.
                dataplane_extra: format!("batch_size = {batch}\ninline_max = 0"),
                ..gro_off.clone()
            };
            ablation_run(&opts, seconds)
        };
        ablation.push(AblationRow {
            batch,
            ordered: run(true)?,
            unordered: run(false)?,
        });
    }

    let gro_on = BedOptions {
        lan_gro: true,
        ..BedOptions::default()
    };
    eprintln!("bench: GRO on, plain kernel routing ...");
    let plain_gro = {
        let bed = TwoSites::new(&gro_on)?;
        bed.route_plainly()?;
        measure_gro(&bed, seconds)?
    };
    eprintln!("bench: GRO on, the cyphonic tunnel ...");
    let (tunnel_gro, cut) = {
        let bed = TwoSites::up(&gro_on)?;
        let r = measure_gro(&bed, seconds)?;
        let count = |k: &str| bed.counter(Side::A, k);
        let cut = Cut {
            coalesced: count("coalesced")?,
            segments: count("segments")?,
            refused: count("drop_coalesced")?,
            out_of_order: egress_out_of_order(&bed)?,
        };
        (r, cut)
    };

    let busy = |opts: &BedOptions| -> anyhow::Result<Quick> {
        let bed = TwoSites::up(&BedOptions {
            dataplane_extra: format!("busy_poll_us = {BUSY_POLL_US}"),
            ..opts.clone()
        })?;
        measure_gro(&bed, seconds)
    };
    eprintln!("bench: busy polling, GRO off ...");
    let busy_off = busy(&gro_off)?;
    eprintln!("bench: busy polling, GRO on ...");
    let busy_on = busy(&gro_on)?;
    Ok(BenchReport {
        measured: measured(seconds),
        runs: RUNS,
        udp_size: UDP_SIZE,
        udp_refine: measure::REFINE,
        inner_mtu: INNER_MTU,
        big_rate: BIG_RATE,
        busy_poll_us: BUSY_POLL_US,
        plain,
        tunnel,
        tunnel_out_of_order,
        ablation,
        plain_gro,
        tunnel_gro,
        cut,
        busy_off,
        busy_on,
    })
}

/// TCP over both families through one bed with IPv6 (GRO on, the defaults), `RUNS` runs of
/// each, IPv4 and IPv6 alternating; the medians, and how many frames adapter B sent its LAN
/// merged during each family's runs.
pub(crate) fn ipv6(seconds: u64) -> anyhow::Result<Ipv6Report> {
    let bed = TwoSites::up(&BedOptions {
        ipv6: true,
        ..BedOptions::default()
    })?;
    let within = Duration::from_secs(20);
    cyphonic_e2e::lan::slaac_address(&bed.a.lan, "fd7a:0:1:100:", within)?;
    let to = cyphonic_e2e::lan::slaac_address(&bed.b.lan, "fd7a:0:1:200:", within)?;
    // B's host makes itself heard by its adapter; both families' tunnels are up.
    bed.b
        .lan
        .exec_output("ping", &["-6", "-c", "1", "-W", "2", "fd7a:0:1:200::1"])?;
    measure::warm_up(&bed)?;
    bed.a.lan.exec_output(
        "ping",
        &["-6", "-c", "3", "-i", "0.1", "-W", "2", &to.to_string()],
    )?;
    let merged = |bed: &TwoSites| bed.counter(Side::B, "lan_merged");
    let mut rows = Vec::new();
    let mut merged_by = (0, 0);
    for streams in [1, 4] {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            let before = merged(&bed)?;
            v4.push(measure::tcp(&bed, streams, seconds)?);
            let between = merged(&bed)?;
            v6.push(measure::tcp6(&bed, streams, seconds, to)?);
            let after = merged(&bed)?;
            merged_by.0 += between - before;
            merged_by.1 += after - between;
        }
        let median = |mut all: Vec<report::Tcp>| {
            all.sort_by(|a, b| a.gbps.total_cmp(&b.gbps));
            all[all.len() / 2]
        };
        rows.push(FamilyRow {
            streams,
            v4: median(v4),
            v6: median(v6),
        });
    }
    Ok(Ipv6Report {
        measured: measured(seconds),
        rows,
        merged: merged_by,
    })
}

pub(crate) fn measured(seconds: u64) -> Measured {
    Measured {
        date: report::utc_now(),
        machine: format!("{}, Linux {}", report::cpu(), report::kernel()),
        seconds,
    }
}

/// A quick profile: idle RTT, TCP with 1 and 4 streams, RTT under one stream.
pub(crate) fn measure_gro(bed: &TwoSites, seconds: u64) -> anyhow::Result<Quick> {
    measure::warm_up(bed)?;
    let idle = measure::ping(bed, Side::A, bed.b.host_ip, 300, Duration::from_millis(10))?;
    let tcp1 = measure::tcp_median(bed, 1, seconds, RUNS)?;
    let tcp4 = measure::tcp_median(bed, 4, seconds, RUNS)?;
    let loaded = measure::ping_under_load(bed, 5)?;
    Ok(Quick {
        tcp1,
        tcp4,
        idle,
        loaded,
    })
}

/// Many nodes: a fresh bed per fleet size, the cloud and adapter A running.
pub(crate) fn peers(counts: &[usize], seconds: u64) -> anyhow::Result<PeersReport> {
    let mut rows = Vec::new();
    for &n in counts {
        eprintln!("bench: {n} node(s) ...");
        let mut bed = TwoSites::new(&BedOptions {
            cloud: Some(CloudOptions::default()),
            ..BedOptions::default()
        })?;
        bed.start(Side::A)?;
        rows.push(fleet::measure(&bed, n, seconds)?);
    }
    Ok(PeersReport {
        measured: measured(seconds),
        rows,
    })
}

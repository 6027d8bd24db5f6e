//! The defaults both binaries give the keys they share, as serde's `default = "..."` takes
//! them (spanned values carry an empty span: "not in the file"). The `[dataplane]` ones are
//! the engine's own ([`cyphonic_tunnel::DataPlane`]'s `Default`).

use std::net::{Ipv4Addr, SocketAddr};

use cyphonic_tunnel::DataPlane;
use ipnet::Ipv4Net;
use toml::Spanned;

/// `listen`: every address, IPv4 and IPv6, port 51820.
pub fn listen() -> SocketAddr {
    SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 51820))
}
/// `overlay`: 100.64.0.0/10.
pub fn overlay() -> Spanned<Ipv4Net> {
    Spanned::new(
        0..0,
        Ipv4Net::new(Ipv4Addr::new(100, 64, 0, 0), 10).expect("valid prefix"),
    )
}
/// `inner_mtu`: 1420.
pub fn inner_mtu() -> Spanned<u16> {
    Spanned::new(0..0, 1420)
}
/// Switches that are on unless switched off.
pub const fn yes() -> bool {
    true
}
/// `dns.ttl`: 60 s.
pub fn dns_ttl() -> Spanned<u32> {
    Spanned::new(0..0, 60)
}
/// Socket buffers: 4 MiB.
pub fn socket_buffer() -> usize {
    DataPlane::default().udp_buffer
}
/// `dataplane.workers`: 0, one per core.
pub fn workers() -> usize {
    DataPlane::default().workers
}
/// `dataplane.batch_size`.
pub fn batch_size() -> Spanned<usize> {
    Spanned::new(0..0, DataPlane::default().batch_size)
}
/// `dataplane.batches_in_flight`.
pub fn batches_in_flight() -> Spanned<usize> {
    Spanned::new(0..0, DataPlane::default().batches_in_flight)
}
/// `dataplane.in_flight_bytes`: 16 MiB.
pub fn in_flight_bytes() -> Spanned<usize> {
    Spanned::new(0..0, DataPlane::default().in_flight_bytes)
}
/// `dataplane.in_flight_ms`: 100.
pub fn in_flight_ms() -> Spanned<u32> {
    let ms = DataPlane::default().in_flight_time.as_millis();
    Spanned::new(0..0, u32::try_from(ms).unwrap_or(u32::MAX))
}
/// `dataplane.inline_max`.
pub fn inline_max() -> Spanned<usize> {
    Spanned::new(0..0, DataPlane::default().inline_max)
}
/// `dataplane.sparse_rate`.
pub fn sparse_rate() -> u32 {
    DataPlane::default().sparse_rate
}
/// `dataplane.aqm_target_us`: 0 (off; CoDel's is 5 ms).
pub fn aqm_target_us() -> Spanned<u32> {
    let target = DataPlane::default().aqm.map_or(0, |a| a.target.as_micros());
    Spanned::new(0..0, u32::try_from(target).unwrap_or(u32::MAX))
}
/// `dataplane.aqm_interval_ms`: CoDel's 100 ms.
pub fn aqm_interval_ms() -> Spanned<u32> {
    let interval = cyphonic_tunnel::Aqm::default().interval.as_millis();
    Spanned::new(0..0, u32::try_from(interval).unwrap_or(u32::MAX))
}
/// `dataplane.ordering`.
pub fn ordering() -> bool {
    DataPlane::default().ordering
}
/// `dataplane.udp_buffer`.
pub fn udp_buffer() -> usize {
    DataPlane::default().udp_buffer
}
/// `dataplane.udp_gso`.
pub fn udp_gso() -> bool {
    DataPlane::default().udp_gso
}
/// `dataplane.udp_gro`.
pub fn udp_gro() -> bool {
    DataPlane::default().udp_gro
}
/// `dataplane.queue_per_peer`.
pub fn queue_per_peer() -> usize {
    DataPlane::default().queue_per_peer
}
/// `dataplane.cpus`: none (wherever the scheduler puts them).
pub fn cpus() -> Spanned<Vec<usize>> {
    Spanned::new(0..0, DataPlane::default().placement.cpus)
}
/// `dataplane.realtime_priority`: 0 (the normal scheduler).
pub fn realtime_priority() -> Spanned<u8> {
    Spanned::new(0..0, DataPlane::default().placement.realtime_priority)
}
/// `dataplane.sparse_priority`: the sparse lanes' threads' SCHED_FIFO priority.
pub fn sparse_priority() -> Spanned<u8> {
    Spanned::new(0..0, DataPlane::default().sparse_priority)
}
/// `dataplane.busy_poll_us`: 0 (receiving threads sleep until a packet wakes them).
pub fn busy_poll_us() -> Spanned<u32> {
    let us = DataPlane::default().busy_poll.as_micros();
    Spanned::new(0..0, u32::try_from(us).unwrap_or(u32::MAX))
}
/// `dataplane.buffers`.
pub fn buffers() -> Spanned<usize> {
    Spanned::new(0..0, DataPlane::default().buffers)
}
/// `dataplane.danger_rekey_after_secs`: the session's 120 s.
pub fn rekey_after_secs() -> Spanned<u64> {
    Spanned::new(0..0, DataPlane::default().rekey_after.as_secs())
}
/// `dataplane.danger_rekey_after_messages`: the session's 2^60.
pub fn rekey_after_messages() -> Spanned<u64> {
    Spanned::new(0..0, DataPlane::default().rekey_after_messages)
}

//! The control-plane client of adapters (and, later, nodes): one Noise session with the
//! cloud, kept open with pings and re-opened with backoff and jitter when it
//! drops. Through a [`Handle`] the owner keeps its registration current, resolves names, and
//! receives [`Event`]s: pushed instructions (`Expect`), its observed address, and endpoint
//! probes to send from its tunnel socket (this crate does not own that socket).
//!
//! Resolutions are cached in a `dashmap` with a time to live; expired entries are swept.

#![forbid(unsafe_code)]

mod cache;
mod client;
pub mod testing;

pub use cache::{Cache, FOUND_TTL, NEGATIVE_TTL};
pub use client::{
    Config, EnrollError, Enrolled, Event, Handle, RESOLVE_TIMEOUT, SignalError, enroll, spawn,
};
pub use cyphonic_control::report::Report;
pub use cyphonic_control::{
    Allowed, DeviceKind, DeviceReport, NameRecord, PeerInfo, PolicyRule, RelayInfo, RelayReason,
    Resolution, ReturnCookie, TunnelPath, TunnelReport, TunnelVersions, bind_frame,
};

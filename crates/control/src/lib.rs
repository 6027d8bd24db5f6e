//! The control protocol between the cloud (NMS) and its clients (adapters, nodes), sans-IO:
//! the messages ([`msg`]), the Noise channel that carries them ([`channel`]), the per-device
//! policy cut into messages and put together again ([`policy`]), a member's report of its
//! devices and tunnels likewise ([`report`]), and the rule for
//! which names a certificate lets a client host ([`check_name`]). docs/protocol.md §3 is the
//! specification. The drivers, `cyphonic-signal` (client) and `cyphonic-cloud` (server), own
//! the sockets.

#![forbid(unsafe_code)]

pub mod channel;
pub mod msg;
pub mod policy;
pub mod probe;
pub mod relay;
pub mod report;
pub mod token;

pub use channel::{Channel, ChannelError, ClientHandshake, ServerHandshake};
pub use msg::{
    Allowed, ClientMsg, CloudMsg, DeviceKind, DeviceReport, FLOWS_VERSION, FlowDir, FlowRecord,
    HA_PAIR_VERSION, Hello, MAPPING_VERSION, MIN_VERSION, Mac, MapProtocol, Mapping, NameRecord,
    PairBox, PairHealth, PairRole, PairState, PeerInfo, PolicyProto, PolicyRule, REPORT_VERSION,
    RefusedRecord, RelayInfo, RelayReason, Resolution, STREAM_VERSION, StreamInfo, TUNNEL_VERSION,
    TunnelPath, TunnelReport, TunnelVersions, VERSION, Welcome, reachable, version_refusal,
    versions_refused,
};
pub use policy::{Assembler, PolicyError};
pub use probe::{
    Bind, Challenger, PROBE_TOKEN_LEN, Probe, Prober, Purpose, ReturnCookie, STREAM_NONCE_LEN,
    StreamBind, bind_frame, challenge_frame, legacy_bind_frame, legacy_bind_token, parse_challenge,
    parse_stream_hello, stream_bind_frame, stream_hello_frame,
};
pub use token::{TOKEN_SHAPE, parse_token};

use std::net::IpAddr;

use cyphonic_crypto::CertBody;

/// Why a client may not host a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// Not a lower-case DNS name of labels `a-z0-9-` (1 to 63 bytes each, 253 in all).
    #[error("not a valid lower-case DNS name")]
    Invalid,
    /// Neither the certificate's name nor one label under it.
    #[error("outside the certificate's zone {0}")]
    OutsideZone(String),
    /// The address lies outside every vIP block of the certificate.
    #[error("address outside the certificate's vIP blocks")]
    OutsideBlocks,
    /// Neither an IPv4 nor an IPv6 address.
    #[error("no address")]
    NoAddress,
}

/// Whether the holder of a certificate with `body` may host `record`: the certificate's own
/// name, or one label under it (`sensor.gw1.ovl.example` for `gw1.ovl.example`), at addresses
/// inside its certified blocks (at least one address, of either family).
///
/// # Errors
/// [`NameError`] saying which rule the record breaks.
pub fn check_name(body: &CertBody, record: &NameRecord) -> Result<(), NameError> {
    let name = record.name.as_str();
    let valid_label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.len() > 253 || !name.split('.').all(valid_label) {
        return Err(NameError::Invalid);
    }
    let zone = body.name.as_str();
    let inside = name == zone
        || name
            .strip_suffix(zone)
            .and_then(|head| head.strip_suffix('.'))
            .is_some_and(|label| !label.contains('.'));
    if !inside {
        return Err(NameError::OutsideZone(zone.to_owned()));
    }
    if record.vip.is_none() && record.vip6.is_none() {
        return Err(NameError::NoAddress);
    }
    if record.vip.is_some_and(|v4| !body.covers(IpAddr::V4(v4)))
        || record.vip6.is_some_and(|v6| !body.covers(IpAddr::V6(v6)))
    {
        return Err(NameError::OutsideBlocks);
    }
    Ok(())
}

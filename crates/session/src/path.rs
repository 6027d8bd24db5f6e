//! Path messages: the plaintext of a path frame (docs/protocol.md §4, *Back to direct*). A
//! relayed pair pings the peer's direct addresses under its session's keys; a pong proves a
//! path both ways; a call-me, sent through the relay, asks the peer to try at once.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use cyphonic_wire::{PATH_MSG_MAX, PATH_MSG_MIN};

/// Addresses a call-me carries at most.
pub const CALL_ME_MAX: usize = (PATH_MSG_MAX - PATH_MSG_MIN) / ADDRESS_LEN;

/// One address in a call-me: 16 bytes of IP (IPv4-mapped), 2 of port.
const ADDRESS_LEN: usize = 18;

/// A path message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMsg {
    /// Is this path there? Answered by a pong with the same id, sent to where it came from.
    Ping(u64),
    /// The answer to the ping with this id.
    Pong(u64),
    /// The sender tries the direct path now: here is where it may be reached (at most
    /// [`CALL_ME_MAX`]).
    CallMe(Vec<SocketAddr>),
}

const PING: u8 = 1;
const PONG: u8 = 2;
const CALL_ME: u8 = 3;

impl PathMsg {
    /// The message's bytes (a call-me's addresses beyond [`CALL_ME_MAX`] are left out).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; PATH_MSG_MIN];
        match self {
            Self::Ping(id) | Self::Pong(id) => {
                out[0] = if matches!(self, Self::Ping(_)) {
                    PING
                } else {
                    PONG
                };
                out[8..16].copy_from_slice(&id.to_be_bytes());
            }
            Self::CallMe(addrs) => {
                out[0] = CALL_ME;
                for a in addrs.iter().take(CALL_ME_MAX) {
                    let ip = match a.ip() {
                        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                        IpAddr::V6(v6) => v6,
                    };
                    out.extend_from_slice(&ip.octets());
                    out.extend_from_slice(&a.port().to_be_bytes());
                }
            }
        }
        out
    }

    /// Reads a message; `None` for anything the protocol does not define (another kind, a
    /// length that is not the kind's, a non-zero reserved byte, an address of port 0 or
    /// unspecified).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < PATH_MSG_MIN || bytes.len() > PATH_MSG_MAX {
            return None;
        }
        let (head, rest) = bytes.split_at(PATH_MSG_MIN);
        if head[1..8].iter().any(|b| *b != 0) {
            return None;
        }
        let id = u64::from_be_bytes(head[8..16].try_into().ok()?);
        match head[0] {
            PING if rest.is_empty() => Some(Self::Ping(id)),
            PONG if rest.is_empty() => Some(Self::Pong(id)),
            CALL_ME if id == 0 && rest.len() % ADDRESS_LEN == 0 => rest
                .chunks_exact(ADDRESS_LEN)
                .map(|c| {
                    let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&c[..16]).ok()?);
                    let port = u16::from_be_bytes([c[16], c[17]]);
                    let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
                    (port != 0 && !ip.is_unspecified()).then_some(SocketAddr::new(ip, port))
                })
                .collect::<Option<Vec<_>>>()
                .map(Self::CallMe),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_fit_the_frame() {
        let addrs: Vec<SocketAddr> = vec![
            "198.51.100.2:51820".parse().unwrap(),
            "[fd00:198:51:100::2]:51820".parse().unwrap(),
        ];
        for m in [
            PathMsg::Ping(7),
            PathMsg::Pong(u64::MAX),
            PathMsg::CallMe(Vec::new()),
            PathMsg::CallMe(addrs.clone()),
        ] {
            let bytes = m.encode();
            assert!((PATH_MSG_MIN..=PATH_MSG_MAX).contains(&bytes.len()));
            assert_eq!(PathMsg::decode(&bytes), Some(m));
        }
        let many = PathMsg::CallMe(vec![addrs[0]; 20]).encode();
        assert_eq!(many.len(), PATH_MSG_MAX);
        assert_eq!(
            PathMsg::decode(&many),
            Some(PathMsg::CallMe(vec![addrs[0]; CALL_ME_MAX]))
        );
    }

    #[test]
    fn anything_undefined_is_refused() {
        let ping = PathMsg::Ping(1).encode();
        let mut other_kind = ping.clone();
        other_kind[0] = 4;
        let mut reserved = ping.clone();
        reserved[3] = 1;
        let mut long_ping = ping.clone();
        long_ping.extend_from_slice(&[0; 18]);
        let mut call = PathMsg::CallMe(vec!["192.0.2.1:1".parse().unwrap()]).encode();
        let mut with_id = call.clone();
        with_id[15] = 1;
        let mut ragged = call.clone();
        ragged.push(0);
        let port0 = call.len() - 1;
        call[port0] = 0;
        call[port0 - 1] = 0;
        for bad in [
            &ping[..15],
            &other_kind,
            &reserved,
            &long_ping,
            &with_id,
            &ragged,
            &call,
        ] {
            assert_eq!(PathMsg::decode(bad), None, "{bad:?}");
        }
        assert_eq!(PathMsg::decode(&[0; PATH_MSG_MAX + 1]), None);
    }
}

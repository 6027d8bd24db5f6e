//! The messages of the control protocol (docs/protocol.md §3). They travel as JSON inside the
//! Noise channel: readable in a debugger, and versioned by the handshake's [`Hello`].
//!
//! Certificates travel in their text armor and are checked by whoever receives them; nothing
//! here trusts a field it carries.

use std::net::{Ipv4Addr, SocketAddr};

use serde::{Deserialize, Serialize};

/// The control protocol version this code speaks.
pub const VERSION: u16 = 1;

/// The payload of the first handshake message, client to cloud.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The protocol version the client speaks.
    pub version: u16,
    /// The client's certificate (text armor). Its Noise key must be the handshake's.
    pub certificate: String,
    /// Software and version, for the cloud's logs.
    pub agent: String,
}

/// The payload of the handshake's answer, cloud to client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "result", rename_all = "snake_case")]
pub enum Welcome {
    /// The certificate passed; the session is open.
    Accepted {
        /// The protocol version the cloud will speak (the client's or lower).
        version: u16,
        /// Send this in an endpoint probe from the tunnel socket to `probe_port`, so that the
        /// cloud sees the address the NAT maps that socket to. Single use.
        probe_token: [u8; 16],
        /// The cloud's UDP port for endpoint probes (on the address the client connected to).
        probe_port: u16,
        /// The client's TCP source address as the cloud sees it.
        observed: SocketAddr,
    },
    /// The certificate did not pass (unknown CA, expired, revoked, key mismatch) or the
    /// version is not spoken. The cloud closes the connection after this.
    Refused {
        /// Why, in words.
        reason: String,
    },
}

/// One name a client hosts: the adapter's own and each device's, a node's own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameRecord {
    /// The fully qualified name, lower case, without the trailing dot.
    pub name: String,
    /// Its vIP, inside the client's certified blocks.
    pub vip: Ipv4Addr,
}

/// Client to cloud.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "type", rename_all = "snake_case")]
pub enum ClientMsg {
    /// The client's whole state: replaces what was registered before.
    Register {
        /// Underlay endpoints the client listens on, as it knows them (its own addresses).
        endpoints: Vec<SocketAddr>,
        /// The names it hosts.
        names: Vec<NameRecord>,
    },
    /// Where is `name`? Answered by [`CloudMsg::Resolved`] with the same `id`.
    Resolve {
        /// Chosen by the client; echoed.
        id: u64,
        /// The name asked for.
        name: String,
    },
    /// Liveness: the cloud answers [`CloudMsg::Pong`].
    Ping {},
}

/// A peer as the cloud describes it to a client that is about to handshake with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerInfo {
    /// The peer's certificate (text armor); the client checks it against its own trust store.
    pub certificate: String,
    /// Where to send handshakes: the endpoint the cloud saw probes come from first, then the
    /// peer's own list.
    pub endpoints: Vec<SocketAddr>,
}

/// How a resolution ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "result", rename_all = "snake_case")]
pub enum Resolution {
    /// The name exists, and policy lets the asker reach it. The peer has been told to expect
    /// the asker ([`CloudMsg::Expect`]).
    Found {
        /// The name's vIP.
        vip: Ipv4Addr,
        /// The peer hosting it.
        peer: PeerInfo,
    },
    /// No registered client hosts this name.
    NotFound,
    /// The name exists but policy does not let the asker reach it (answered like `NotFound`
    /// to the device: NXDOMAIN).
    Denied,
    /// The name belongs to the asker itself.
    Own,
}

/// Cloud to client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "type", rename_all = "snake_case")]
pub enum CloudMsg {
    /// The answer to [`ClientMsg::Register`].
    Registered {
        /// How many names were accepted.
        accepted: usize,
        /// Names refused, each with the reason (outside the certificate, taken by another).
        refused: Vec<(String, String)>,
    },
    /// The answer to [`ClientMsg::Resolve`].
    Resolved {
        /// The request's id.
        id: u64,
        /// The name asked for.
        name: String,
        /// What the cloud found.
        resolution: Resolution,
    },
    /// Someone resolved one of our names: start handshaking with them now (both sides send
    /// initiations at once, which opens NAT mappings in both directions).
    Expect {
        /// The peer that will initiate.
        peer: PeerInfo,
    },
    /// An endpoint probe with this session's token arrived from `endpoint`.
    Observed {
        /// The tunnel socket's address as the cloud sees it.
        endpoint: SocketAddr,
    },
    /// The answer to [`ClientMsg::Ping`].
    Pong {},
    /// A message the cloud could not accept; the session stays open.
    Error {
        /// Why, in words.
        reason: String,
    },
}

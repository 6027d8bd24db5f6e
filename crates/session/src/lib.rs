//! The per-peer tunnel session of the cyphonic overlay, sans-IO.
//!
//! A [`Peer`] is a state machine for one remote node: it runs the Noise IK handshake
//! (the initiator's certificate in the first payload, the responder's in the second), derives
//! one key per direction, rekeys after [`Timing::rekey_after_time`] or a message limit while
//! keeping the previous keys for packets still in flight, sends keepalives, expires idle keys
//! and follows a peer that roams to a new underlay address.
//!
//! Nothing here opens a socket, spawns a thread or reads a clock:
//! every input carries `now`, outputs are pulled with [`Peer::poll_transmit`],
//! [`Peer::poll_event`] and [`Peer::poll_timeout`]. The driver (the adapter, the node, the
//! tests' simulator) owns sockets, time and threads.
//!
//! Entry types: [`Identity`] (our key, certificate and trust store), [`Peer`], [`Session`]
//! (the keys of one handshake, shareable with crypto workers), [`read_init`] (the device-level
//! first step for an incoming initiation, before its peer is known).
//!
//! In front of every handshake sit WireGuard's cheap checks ([`CookieChecker`]: mac1 always,
//! mac2 and cookie-replies when the driver is under load); a [`Peer`] seals them on what it
//! sends and keeps the cookie a responder hands it.
//!
//! Session indices are random and unique across a device's peers ([`Indices`], one table the
//! driver shares between its peers and looks frames up in).
//!
//! What it deliberately does not do: queue user packets while a handshake is pending (the
//! driver owns buffers), or decide policy.
#![forbid(unsafe_code)]

mod clock;
mod cookie;
mod error;
mod handshake;
mod index;
mod path;
mod peer;
mod session;
#[doc(hidden)]
pub mod sim;

pub use clock::{Clock, Timing};
pub use cookie::{COOKIE_LIFETIME, CookieChecker, initiation_hint};
/// The tunnel versions a member speaks ([`Identity::versions`], [`PeerConfig::versions`]).
pub use cyphonic_wire::Versions;
pub use error::{HandshakeError, IdentityError, RecvError, SendError};
pub use handshake::{Identity, IncomingInit, read_init};
pub use index::Indices;
pub use path::{CALL_ME_MAX, PathMsg};
pub use peer::{DIRECT_HOLD, Event, Peer, PeerConfig, Received, Transmit};
pub use session::Session;

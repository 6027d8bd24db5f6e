//! Two adapters on one LAN as one gateway (docs/protocol.md §5), sans-IO:
//!
//! - [`msg`]: the pair's messages: [`Sealer`] writes them under this start's key,
//!   [`Opener`] checks the other box's (length, tag, counter) before anything is believed;
//!   lease tables travel as [`msg::LeaseChunk`]s and come back whole from an [`Assembler`].
//! - [`pair`]: [`Pair`], one box's view of who serves: heartbeats in, heartbeats and role
//!   changes out, a heartbeat counting as the other box's proof of life only when it echoes
//!   one of our recent challenges (a recorded one replayed proves nothing).
//! - [`mandate`]: [`Mandate`], until when the box's data plane may speak for the gateway:
//!   renewed by the pair's thread while the box serves, read by the data plane.
//!
//! Nothing here reads a clock, opens a socket or draws a random number: the caller passes
//! `now`, the wall clock and fresh challenges in, and sends what it is given.
#![forbid(unsafe_code)]

pub mod mandate;
pub mod msg;
pub mod pair;

pub use mandate::{Mandate, Renewal};
pub use msg::{Assembler, Body, Health, Heartbeat, Link, Opener, Refused, Role, Sealer};
pub use pair::{Config, Event, NoHandover, Pair, Reason};

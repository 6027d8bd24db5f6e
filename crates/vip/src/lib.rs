//! The adapter's virtual-IP allocator: DHCPv4 and DHCPv6 servers (RFC 2131, RFC 8415, on
//! dhcproto) for the devices on its LAN port, and the names those devices get on the overlay.
//!
//! Every device gets its own overlay address (inside the adapter's certified block) and its own
//! name (`<hostname>.<adapter FQDN>`), by plain DHCP: nothing to install on the device. That is
//! what sets the adapter apart from subnet routers.
//!
//! - [`Server::handle`] takes a DHCP message (with the Ethernet source it arrived from and the
//!   current time) and returns the reply to send and where to, or why it stays silent.
//! - [`Server::handle_timeout`] expires leases and stale offers; [`Server::poll_event`] says
//!   what changed (granted, released, declined, expired), so the driver can update the
//!   anti-spoofing table and DNS, and [`Server::take_dirty`] says when to persist
//!   [`Server::leases`].
//! - [`Server::set_share`] keeps new addresses to one half of the pool and [`Server::merge`]
//!   takes in another server's bindings: the two boxes of an HA pair (docs/protocol.md §5).
//! - [`fn@names`] derives each lease's DNS label, deterministically.
//!
//! - [`Server6`] is the DHCPv6 server (RFC 8415) of the segment's /64: stateful addresses,
//!   the DNS server and the search list.
//! - [`mod@file`] is the lease file's format.
//!
//! Sans-IO: no sockets, no clock (time is unix seconds, passed in), no files. The driver
//! persists leases atomically and frames replies on the LAN.
#![forbid(unsafe_code)]

pub mod file;
mod names;
mod server;
mod share;
mod v6;

pub use names::{label_for, leased, names};
pub use server::{
    ConfigError, DhcpConfig, Ignore, Lease, LeaseEvent, Reply, Reservation, Server, Stats,
};
pub use share::{Half, Share};
pub use v6::{
    Config6Error, Dhcp6Config, Event6, Ignore6, Lease6, MAX_POOL, PER_MAC, Reply6, Reservation6,
    Server6, Stats6,
};

/// Building DHCP client messages, for tests, fuzz corpora and test beds.
#[doc(hidden)]
pub mod testing {
    pub use crate::server::client_message;
    pub use crate::v6::{ReadReply6, client_message6, read_reply6};
    pub use dhcproto::v4::{DhcpOption, MessageType};
    pub use dhcproto::v6::{MessageType as MessageType6, Status as Status6};

    /// The address a server's reply (an encoded DHCP message) offers or grants; unspecified
    /// when it does not decode.
    pub fn yiaddr(reply: &[u8]) -> std::net::Ipv4Addr {
        use dhcproto::Decodable as _;
        dhcproto::v4::Message::decode(&mut dhcproto::Decoder::new(reply))
            .map_or(std::net::Ipv4Addr::UNSPECIFIED, |m| m.yiaddr())
    }
}

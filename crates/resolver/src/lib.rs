//! The adapter's DNS server for its LAN, sans-IO, on hickory-proto.
//!
//! The adapter is authoritative for its own subzone (`<adapter FQDN>`, for instance
//! `gw1.ovl.example`): the adapter's name and every device's name (`sensor1.gw1.ovl.example`,
//! from the DHCP leases) answer with A records, its own name with an AAAA too when it has an
//! IPv6 address (a node's), addresses of its block answer PTR queries. Anything else is
//! decided, not done: a name below a peer adapter's FQDN is asked of that peer (over the
//! tunnel), an overlay name nobody here knows can be asked of the cloud, and a name outside
//! the overlay goes to the upstream resolvers when any are configured (REFUSED otherwise).
//! [`Resolver::handle_query`] returns an [`Action`]; answers to what was asked come back
//! through [`Resolver::handle_peer_answer`] / [`Resolver::complete`], and queries nobody
//! answered in time get SERVFAIL from [`Resolver::handle_timeout`].
//!
//! Queries from peers (over the tunnel) are answered from our own zone only: the adapter is
//! no open resolver for other sites.
//!
//! Sans-IO: no sockets, no clock (time is an argument). The driver frames packets, talks to
//! upstream resolvers and to peers.
#![forbid(unsafe_code)]

mod resolver;

pub use resolver::{
    Action, Client, Drop, MAX_PENDING_PER_CLIENT, PeerZone, Resolver, Stats, ZoneConfig,
};

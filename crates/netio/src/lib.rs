//! The I/O edge of cyphonic: the only crate that makes system calls on sockets and interfaces,
//! and the only one allowed `unsafe`. Every `unsafe` block carries a
//! `// SAFETY:` comment.
//!
//! - [`PacketSocket`]: the adapter's internal NIC, an `AF_PACKET` socket (`ETH_P_ALL`,
//!   promiscuous, `PACKET_IGNORE_OUTGOING`) with batched receive (`recvmmsg`) and send
//!   (`sendmmsg`). Each frame comes with [`FrameMeta`]: its real length (a frame larger than
//!   the buffer is reported as truncated, never silently cut), whether the kernel left its
//!   checksum to offload (`TP_STATUS_CSUMNOTREADY` via `PACKET_AUXDATA`), and its direction.
//!   With [`PacketOptions::coalesced`] (`PACKET_VNET_HDR`), frames the kernel merged (GRO) come
//!   whole, up to 64 KiB, the part beyond the caller's buffer in [`LargeFrames`], with
//!   [`FrameMeta::coalesced`] saying how to cut them (protocol and segment size). With
//!   [`PacketOptions::ring`] it receives through a `TPACKET_V3` ring shared with the kernel
//!   instead (blocks of frames, no system call while they keep coming), with the same
//!   [`FrameMeta`] for each frame.
//!   pnet's datalink channel is not used: it makes two syscalls per packet, truncates frames
//!   over its 4096-byte default buffer without saying so, and drops the packet direction.
//! - [`UdpSocket`]: the tunnel socket, dual-stack, with `recvmmsg`/`sendmmsg` batches,
//!   segmented sends (`UDP_SEGMENT`) and coalesced receives (`UDP_GRO`), and deliberately sized
//!   buffers; [`UdpSocket::steered`] opens a second socket on its port to which the kernel
//!   steers the datagrams a classic BPF program ([`cbpf`]) picks, each socket with its own
//!   queue.
//! - [`Interface`]: index, MAC, MTU, up/down; [`disable_receive_offloads`] switches GRO/LRO
//!   off through the ethtool ioctl.
//! - [`Tun`]: the node's overlay interface, a TUN device with its address, netmask, MTU and
//!   state set through interface ioctls; optionally with offloads (`IFF_VNET_HDR`: TCP and
//!   UDP super-packets and partial checksums both ways).
//! - [`AddressWatch`]: news of this host's address and route changes (`NETLINK_ROUTE`
//!   multicast), so the tunnel can tell its peers at once that it moved.
//! - [`Rtnl`]: routing-netlink requests that keep the kernel's IP stack off the adapter's
//!   LAN port: its IPv4 addresses removed, and an ingress filter (tc `clsact`, a one-instruction
//!   classic `bpf` program in direct-action mode) that drops every frame after the capture
//!   socket has seen it.
//! - [`BusyPoll`]: optional busy polling of a receiving socket for a while after each packet
//!   (`MSG_DONTWAIT` and `sched_yield` instead of a sleep and a wake-up).
//! - [`Placement`]: optional CPU affinity and real-time priority for data-plane threads.
//! - [`netns::enter`]: moves the calling thread into a named network namespace (test beds).
//!
//! Errors say what to do: no such interface, interface down, or which capability is missing.
//! Kernel features are probed once at open, with a fallback (quinn-udp's "degrade gracefully").
//!
//! Packet contents are not this crate's business: it moves bytes and their metadata.

mod busy;
pub mod cbpf;
mod error;
mod iface;
pub mod netns;
mod packet;
mod ring;
mod rtnl;
mod sched;
mod sys;
mod tun;
mod udp;
mod vnet;
mod watch;

pub use busy::{BusyPoll, receive as busy_receive};
pub use error::NetError;
pub use iface::{Interface, Offload, OffloadState, disable_receive_offloads, receive_offloads};
pub use packet::{
    FrameMeta, Gathered, LARGE_FRAME, LargeFrames, PacketOptions, PacketSocket,
    segmentation_unsupported, wait_any,
};
pub use rtnl::{INGRESS_DROP_PRIORITY, Route, Rtnl};
pub use sched::{MAX_CPUS, Placement, allowed_cpus};
pub use tun::{Tun, TunOffloads, TunPacket};
pub use udp::{DatagramMeta, UdpOptions, UdpSocket};
pub use vnet::{Coalesced, Gso, GsoKind, PartialChecksum};
pub use watch::AddressWatch;

//! The engine's counters: one atomic per event, written by the data threads, read by status.
//! The edges (the adapter's LAN, the node's TUN) count their own events apart.

use std::sync::atomic::{AtomicU64, Ordering};

cyphonic_telemetry::counters! {
    /// Counters of the tunnel engine (the pipelines count their own).
    pub struct EngineCounters {
        /// Overlay destinations no peer's certificate covers.
        drop_no_peer,
        /// Packets the per-device policy dropped, both ways (its status says why).
        drop_policy,
        /// Packets queued while a handshake is pending.
        queued_for_handshake,
        /// Queued packets dropped: the queue was full or the handshake failed.
        drop_queue,
        /// Packets refused because the pipeline's buffers were all in flight.
        drop_pipeline_full,
        /// Packets dropped because every buffer was in use.
        drop_no_buffer,
        /// Datagrams sent on the tunnel socket.
        udp_sent,
        /// Datagrams the kernel refused to send.
        udp_send_failed,
        /// Datagrams received on the tunnel socket.
        udp_received,
        /// Datagrams longer than the buffer.
        udp_truncated,
        /// Datagrams that are not a valid tunnel frame.
        drop_frame_malformed,
        /// Tunnel frames of another protocol version (a peer or the cloud not upgraded).
        drop_frame_version,
        /// Handshake messages whose mac1 is wrong: not addressed to our key, or junk.
        drop_handshake_mac,
        /// Initiations under load from a source past its rate.
        drop_handshake_rate,
        /// Initiations under load from addresses that are none of our peers' endpoints, past their fair share of the handshake budget (100 a second in all).
        drop_handshake_budget,
        /// Initiations under load let through ahead of the rates and the budget: their hint was a known peer's (docs/protocol.md §2, known peers first).
        handshake_known_first,
        /// Cookie-replies sent: initiations under load without a valid mac2.
        cookie_replies_sent,
        /// Cookie-replies received and taken (a responder under load asked us for proof).
        cookie_replies_received,
        /// Frames of a type we do not handle here (relay, probe).
        drop_frame_unhandled,
        /// Data frames for a session index no live session has.
        drop_unknown_index,
        /// Handshake messages dropped because their queue to the handshake thread was full.
        drop_handshake_queue,
        /// Keepalives received.
        keepalives_received,
        /// Handshake initiations received.
        handshake_inits,
        /// Handshake responses received.
        handshake_responses,
        /// Handshake messages refused (any reason; the log says which).
        handshake_refused,
        /// Sessions established.
        sessions_established,
        /// Changes of our addresses or routes, each told to the peers and the cloud.
        network_changes,
        /// Keys rotated (handshakes on a live session, either side initiating).
        rekeys,
        /// Hole punches sent (a frame at TTL 2 towards a new peer, from behind our NAT).
        punches_sent,
        /// Hole punches that reached us (dropped: they only open NATs on the way).
        punches_received,
        /// Return-routability challenges taken (from a relay channel or the cloud's probe port; docs/protocol.md §4).
        challenges_received,
        /// Of those, the relay channels': each answered with a bind at once.
        relay_challenges,
        /// Path frames (docs/protocol.md §4, back to direct) handed to the control thread.
        path_frames_received,
        /// Path frames past their rate (16 a second per peer), and pongs past theirs (4 a second per peer).
        drop_path_rate,
        /// Path frames that did not open, were replays, or held no path message.
        drop_path_malformed,
        /// Pings sent to a relayed peer's direct addresses.
        path_pings_sent,
        /// Pongs sent, answering a peer's pings.
        path_pongs_sent,
        /// Tries of the direct path while relayed.
        direct_tries,
        /// Relayed peers moved to a direct path a pong proved.
        moves_to_direct,
        /// Peers moved back to their relay channel: the direct path stopped answering.
        moves_to_relay,
        /// Peers removed: certificate no longer trusted (revoked, expired), unconfigured, or replaced.
        peers_removed,
        /// Peers from the cloud refused: a block overlapping ours or another peer's, a static peer's name, an older certificate, a full table.
        peers_refused,
    }
}

/// Adds one.
pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

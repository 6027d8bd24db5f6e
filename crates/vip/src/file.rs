//! The lease file's format (the adapter's `state_dir/leases.json`): what the driver writes and
//! reads back. Sans-IO: bytes in, bytes out; the driver does the atomic replace.
//!
//! The DHCPv6 bindings sit beside the DHCPv4 ones (`leases6`, absent in files written before
//! them: none). A daemon that predates them reads such a file and leaves `leases6` out when
//! it writes: a downgrade costs the IPv6 bindings, which devices then ask for again.
//!
//! Beside the bindings, the file keeps the cloud peers the gateway was paired with (`peers`,
//! their certificates' fingerprints): whoever serves the gateway next (the other box of an
//! HA pair, or this one after a restart) asks the cloud to pair it with them again.

use serde::{Deserialize, Serialize};

use crate::{Lease, Lease6};

/// The format's version; a file of another version is not read.
pub const VERSION: u32 = 1;

/// Every binding in a lease file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// The DHCPv4 bindings.
    pub leases: Vec<Lease>,
    /// The DHCPv6 bindings.
    pub leases6: Vec<Lease6>,
    /// The cloud peers in use, by fingerprint (at most [`MAX_PEERS`] are read).
    pub peers: Vec<String>,
}

/// The most cloud peers a file names.
pub const MAX_PEERS: usize = 256;

#[derive(Serialize, Deserialize)]
struct OnDisk {
    version: u32,
    /// Active leases hold at least until this unix time: renewals answered before the next
    /// write reach no further. (Absent in older files: 0, nothing to add.)
    #[serde(default)]
    renewals_until: u64,
    leases: Vec<Lease>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    leases6: Vec<Lease6>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    peers: Vec<String>,
}

/// The file for `table`, whose active bindings are to hold at least until `renewals_until`.
///
/// # Errors
/// Serialization failing (it does not for these types).
pub fn encode(table: &Table, renewals_until: u64) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec_pretty(&OnDisk {
        version: VERSION,
        renewals_until,
        leases: table.leases.clone(),
        leases6: table.leases6.clone(),
        peers: table.peers.iter().take(MAX_PEERS).cloned().collect(),
    })
}

/// The bindings in a file, active ones lasting at least until its `renewals_until`.
///
/// # Errors
/// Why the bytes are not a lease file of this version, in words.
pub fn decode(bytes: &[u8]) -> Result<Table, String> {
    let d = serde_json::from_slice::<OnDisk>(bytes).map_err(|e| e.to_string())?;
    if d.version != VERSION {
        return Err(format!("unknown format version {}", d.version));
    }
    let (mut leases, mut leases6) = (d.leases, d.leases6);
    for l in leases.iter_mut().filter(|l| l.active) {
        l.expires = l.expires.max(d.renewals_until);
    }
    for l in leases6.iter_mut().filter(|l| l.active) {
        l.expires = l.expires.max(d.renewals_until);
    }
    let mut peers = d.peers;
    peers.truncate(MAX_PEERS);
    Ok(Table {
        leases,
        leases6,
        peers,
    })
}

//! The lease file's format (the adapter's `state_dir/leases.json`): what the driver writes and
//! reads back. Sans-IO: bytes in, bytes out; the driver does the atomic replace.

use serde::{Deserialize, Serialize};

use crate::Lease;

/// The format's version; a file of another version is not read.
pub const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct OnDisk {
    version: u32,
    /// Active leases hold at least until this unix time: renewals answered before the next
    /// write reach no further. (Absent in older files: 0, nothing to add.)
    #[serde(default)]
    renewals_until: u64,
    leases: Vec<Lease>,
}

/// The file for `leases`, whose active ones are to hold at least until `renewals_until`.
///
/// # Errors
/// Serialization failing (it does not for these types).
pub fn encode(leases: &[Lease], renewals_until: u64) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec_pretty(&OnDisk {
        version: VERSION,
        renewals_until,
        leases: leases.to_vec(),
    })
}

/// The leases in a file, active ones lasting at least until its `renewals_until`.
///
/// # Errors
/// Why the bytes are not a lease file of this version, in words.
pub fn decode(bytes: &[u8]) -> Result<Vec<Lease>, String> {
    let d = serde_json::from_slice::<OnDisk>(bytes).map_err(|e| e.to_string())?;
    if d.version != VERSION {
        return Err(format!("unknown format version {}", d.version));
    }
    let mut leases = d.leases;
    for l in leases.iter_mut().filter(|l| l.active) {
        l.expires = l.expires.max(d.renewals_until);
    }
    Ok(leases)
}

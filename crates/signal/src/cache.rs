//! Resolutions, kept for a while so that a device asking again does not ask the cloud again.

use std::time::{Duration, Instant};

use cyphonic_control::Resolution;
use dashmap::DashMap;

/// How long a name that exists stays cached.
pub const FOUND_TTL: Duration = Duration::from_secs(30);
/// How long a name that does not (or may not be reached) stays cached.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(5);

/// Resolutions by name, each with its expiry.
#[derive(Debug, Default)]
pub struct Cache {
    entries: DashMap<String, (Resolution, Instant)>,
}

impl Cache {
    /// The cached resolution of `name`, if still fresh at `now`.
    pub fn get(&self, name: &str, now: Instant) -> Option<Resolution> {
        let hit = self.entries.get(name).map(|e| e.clone())?;
        if hit.1 <= now {
            self.entries.remove_if(name, |_, (_, exp)| *exp <= now);
            return None;
        }
        Some(hit.0)
    }

    /// Remembers `resolution` of `name` from `now`.
    pub fn put(&self, name: &str, resolution: Resolution, now: Instant) {
        let ttl = match resolution {
            Resolution::Found { .. } => FOUND_TTL,
            _ => NEGATIVE_TTL,
        };
        self.entries
            .insert(name.to_owned(), (resolution, now + ttl));
    }

    /// Drops every entry expired at `now`.
    pub fn sweep(&self, now: Instant) {
        self.entries.retain(|_, (_, exp)| *exp > now);
    }

    /// Forgets everything (the cloud came back: what it says may have changed).
    pub fn clear(&self) {
        self.entries.clear();
    }

    /// Entries held (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_by_kind() {
        let c = Cache::default();
        let t0 = Instant::now();
        c.put("gone.ovl.example", Resolution::NotFound, t0);
        c.put(
            "cam.gw2.ovl.example",
            Resolution::Found {
                vip: Some([100, 64, 2, 100].into()),
                vip6: None,
                peer: cyphonic_control::PeerInfo {
                    relay: None,
                    allowed: None,
                    certificate: String::new(),
                    endpoints: vec![],
                    tunnel: None,
                },
            },
            t0,
        );
        let later = t0 + NEGATIVE_TTL;
        assert_eq!(c.get("gone.ovl.example", later), None);
        assert!(c.get("cam.gw2.ovl.example", later).is_some());
        c.sweep(t0 + FOUND_TTL);
        assert!(c.is_empty());
    }
}

//! The DHCP leases on disk: one JSON file in the state directory, replaced atomically (write a
//! temporary file, fsync it, rename it over the old one, fsync the directory), so a power cut
//! or `kill -9` at any moment leaves either the old file or the new one, never a torn one.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use cyphonic_vip::Lease;
use serde::{Deserialize, Serialize};

const FILE: &str = "leases.json";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct OnDisk {
    version: u32,
    leases: Vec<Lease>,
}

/// Where the leases live.
#[derive(Debug)]
pub struct LeaseStore {
    dir: PathBuf,
}

/// What loading found.
#[derive(Debug)]
pub struct Loaded {
    /// The saved leases (empty when there was no file, or it was unreadable).
    pub leases: Vec<Lease>,
    /// A file that could not be read, moved aside to this path.
    pub moved_aside: Option<(PathBuf, String)>,
}

impl LeaseStore {
    /// Opens (creating, mode 0700) the state directory.
    ///
    /// # Errors
    /// The directory cannot be created or is not writable.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // Fail at start, not at the first lease, when the directory is read-only.
        let probe = dir.join(".write-test");
        File::create(&probe)?;
        fs::remove_file(&probe)?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// The lease file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Reads the saved leases. A file that does not parse is renamed to
    /// `leases.json.corrupt-<unix time>` and reported, and the server starts empty: devices
    /// then ask again and get their addresses back where they are still free.
    ///
    /// # Errors
    /// The file exists but cannot be read at all (permissions, I/O).
    pub fn load(&self, now: u64) -> std::io::Result<Loaded> {
        let path = self.path();
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Loaded {
                    leases: Vec::new(),
                    moved_aside: None,
                });
            }
            Err(e) => return Err(e),
        };
        let reason = match serde_json::from_slice::<OnDisk>(&text) {
            Ok(d) if d.version == VERSION => {
                return Ok(Loaded {
                    leases: d.leases,
                    moved_aside: None,
                });
            }
            Ok(d) => format!("unknown format version {}", d.version),
            Err(e) => e.to_string(),
        };
        let aside = self.dir.join(format!("{FILE}.corrupt-{now}"));
        fs::rename(&path, &aside)?;
        Ok(Loaded {
            leases: Vec::new(),
            moved_aside: Some((aside, reason)),
        })
    }

    /// Replaces the saved leases with `leases`, atomically and durably.
    ///
    /// # Errors
    /// Writing, syncing or renaming fails (disk full, read-only); the old file is intact.
    pub fn save(&self, leases: &[Lease]) -> std::io::Result<()> {
        let doc = OnDisk {
            version: VERSION,
            leases: leases.to_vec(),
        };
        let bytes = serde_json::to_vec_pretty(&doc).map_err(std::io::Error::other)?;
        let tmp = self.dir.join(format!("{FILE}.tmp"));
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, self.path())?;
        File::open(&self.dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn lease(n: u8) -> Lease {
        Lease {
            mac: [2, 0, 0, 0, 0, n],
            ip: Ipv4Addr::new(100, 64, 1, n),
            hostname: Some(format!("dev{n}")),
            client_id: None,
            expires: 1_800_000_000,
            active: true,
        }
    }

    fn dir(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("cyphonic-leases-{tag}-{}", std::process::id()))
    }

    #[test]
    fn saved_leases_load_again() {
        let d = dir("roundtrip");
        let store = LeaseStore::open(&d).unwrap();
        assert!(store.load(0).unwrap().leases.is_empty());
        store.save(&[lease(10), lease(11)]).unwrap();
        store.save(&[lease(10), lease(11), lease(12)]).unwrap();
        let loaded = store.load(0).unwrap();
        assert_eq!(loaded.leases, vec![lease(10), lease(11), lease(12)]);
        assert!(loaded.moved_aside.is_none());
        assert!(!d.join("leases.json.tmp").exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_damaged_file_is_moved_aside_not_trusted() {
        let d = dir("damaged");
        let store = LeaseStore::open(&d).unwrap();
        store.save(&[lease(10)]).unwrap();
        let full = fs::read(store.path()).unwrap();
        fs::write(store.path(), &full[..full.len() / 2]).unwrap();
        let loaded = store.load(42).unwrap();
        assert!(loaded.leases.is_empty());
        let (aside, reason) = loaded.moved_aside.unwrap();
        assert_eq!(aside, d.join("leases.json.corrupt-42"));
        assert!(aside.exists() && !store.path().exists(), "{reason}");
        // A leftover temporary file from a write cut short is simply overwritten.
        fs::write(d.join("leases.json.tmp"), b"{ half").unwrap();
        store.save(&[lease(11)]).unwrap();
        assert_eq!(store.load(0).unwrap().leases, vec![lease(11)]);
        fs::remove_dir_all(&d).unwrap();
    }
}

//! The DHCP leases on disk: one JSON file in the state directory, replaced atomically (write a
//! temporary file, fsync it, rename it over the old one, fsync the directory), so a power cut
//! or `kill -9` at any moment leaves either the old file or the new one, never a torn one.
//!
//! The [`Writer`] does the writing on a thread of its own, at most once a second, always the
//! newest state: the control thread never waits for the disk, and a burst of renewals is one
//! write. The file says until when a renewal answered after it may have extended an active
//! lease (`renewals_until`); loading keeps every active lease at least that long, so a
//! renewal not yet written when the power went is honoured after the restart.

use std::fs::{self, File};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cyphonic_telemetry::files::{self, Access};
use cyphonic_vip::file::Table;
use cyphonic_vip::{Lease, Lease6};

const FILE: &str = "leases.json";

/// At most one write in this long: a burst of changes is one write.
pub const WRITE_EVERY: Duration = Duration::from_secs(1);

/// Where the leases live.
#[derive(Debug)]
pub struct LeaseStore {
    dir: PathBuf,
}

/// What loading found.
#[derive(Debug)]
pub struct Loaded {
    /// The saved leases (empty when there was no file, or it was unreadable); active ones
    /// last at least until the file's `renewals_until`.
    pub leases: Vec<Lease>,
    /// The saved DHCPv6 bindings, likewise.
    pub leases6: Vec<Lease6>,
    /// The cloud peers the gateway was paired with, by fingerprint.
    pub peers: Vec<String>,
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
                    leases6: Vec::new(),
                    peers: Vec::new(),
                    moved_aside: None,
                });
            }
            Err(e) => return Err(e),
        };
        let reason = match cyphonic_vip::file::decode(&text) {
            Ok(table) => {
                return Ok(Loaded {
                    leases: table.leases,
                    leases6: table.leases6,
                    peers: table.peers,
                    moved_aside: None,
                });
            }
            Err(reason) => reason,
        };
        let aside = self.dir.join(format!("{FILE}.corrupt-{now}"));
        fs::rename(&path, &aside)?;
        Ok(Loaded {
            leases: Vec::new(),
            leases6: Vec::new(),
            peers: Vec::new(),
            moved_aside: Some((aside, reason)),
        })
    }

    /// Replaces the saved leases with `table`, atomically and durably; active leases are to
    /// hold at least until `renewals_until` when loaded.
    ///
    /// # Errors
    /// Writing, syncing or renaming fails (disk full, read-only); the old file is intact.
    pub fn save(&self, table: &Table, renewals_until: u64) -> std::io::Result<Arc<[u8]>> {
        let bytes: Arc<[u8]> = cyphonic_vip::file::encode(table, renewals_until)
            .map_err(std::io::Error::other)?
            .into();
        self.replace(&bytes)?;
        Ok(bytes)
    }

    /// Replaces the saved leases with a lease file as another adapter wrote it (an HA
    /// pair's active box sends its own: `ha/mod.rs`), atomically and durably, once it decodes;
    /// the old file stays otherwise.
    ///
    /// # Errors
    /// `file` does not decode (the reason), or writing fails as in [`LeaseStore::save`].
    pub fn save_file(&self, file: &[u8]) -> std::io::Result<()> {
        cyphonic_vip::file::decode(file).map_err(std::io::Error::other)?;
        self.replace(file)
    }

    fn replace(&self, bytes: &[u8]) -> std::io::Result<()> {
        files::replace(&self.path(), bytes, Access::Secret)
    }
}

/// The server's state at one moment, to be written.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Its number: later snapshots have greater ones.
    pub generation: u64,
    /// When it was taken (unix time).
    pub taken_at: u64,
    /// Active leases hold at least until this unix time when loaded.
    pub renewals_until: u64,
    /// Every binding, of both families.
    pub table: Table,
}

/// What the writer has done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// The newest snapshot on disk (0: none yet).
    pub generation: u64,
    /// When that snapshot was taken (unix time); at start, when the file was loaded.
    pub taken_at: u64,
    /// Files written.
    pub writes: u64,
    /// Writes that failed.
    pub failures: u64,
    /// Why the last write failed, while it has not succeeded since.
    pub error: Option<String>,
    /// The file as the newest snapshot on disk was written (an HA pair's active box sends it
    /// to the standby: `ha/mod.rs`); none before the first write.
    pub table: Option<Arc<[u8]>>,
}

#[derive(Debug, Default)]
struct Slot {
    next: Option<Snapshot>,
    stop: bool,
}

#[derive(Debug, Default)]
struct Shared {
    slot: Mutex<Slot>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Writes snapshots of the leases on a thread of its own: the newest one, at most once per
/// [`WRITE_EVERY`]; a failed write is tried again (with the newest state) a period later.
/// Dropping it writes what is pending, then stops the thread.
#[derive(Debug)]
pub struct Writer {
    shared: Arc<Shared>,
    done: tokio::sync::watch::Receiver<Written>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    /// Starts the writer of `store`, whose file was loaded at unix time `loaded_at`.
    ///
    /// # Errors
    /// The thread cannot be started.
    pub fn spawn(store: LeaseStore, loaded_at: u64) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let (tx, done) = tokio::sync::watch::channel(Written {
            taken_at: loaded_at,
            ..Written::default()
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("cy-leases".into())
                .spawn(move || write_loop(&store, &shared, &tx))?
        };
        Ok(Self {
            shared,
            done,
            thread: Some(thread),
        })
    }

    /// Hands over the newest state (replacing any older one not written yet).
    pub fn submit(&self, snapshot: Snapshot) {
        let mut slot = self.shared.lock();
        if slot
            .next
            .as_ref()
            .is_none_or(|s| s.generation < snapshot.generation)
        {
            slot.next = Some(snapshot);
        }
        drop(slot);
        self.shared.wake.notify_one();
    }

    /// What has been written so far.
    pub fn written(&self) -> Written {
        self.done.borrow().clone()
    }

    /// Resolves when the writer has more to report (never, once its thread is gone).
    pub async fn changed(&mut self) {
        if self.done.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn write_loop(store: &LeaseStore, shared: &Shared, done: &tokio::sync::watch::Sender<Written>) {
    let mut last: Option<Instant> = None;
    loop {
        let mut slot = shared.lock();
        // Wait for something to write, and for the period since the last write to pass
        // (a stop cuts the wait short: what is pending is written at once).
        loop {
            let due = last.map_or(Duration::ZERO, |t| {
                (t + WRITE_EVERY).saturating_duration_since(Instant::now())
            });
            if slot.next.is_some() && (due.is_zero() || slot.stop) {
                break;
            }
            if slot.stop {
                return;
            }
            slot = if slot.next.is_some() {
                shared
                    .wake
                    .wait_timeout(slot, due)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            } else {
                shared
                    .wake
                    .wait(slot)
                    .unwrap_or_else(PoisonError::into_inner)
            };
        }
        let Some(snapshot) = slot.next.take() else {
            continue;
        };
        let stopping = slot.stop;
        drop(slot);
        last = Some(Instant::now());
        match store.save(&snapshot.table, snapshot.renewals_until) {
            Ok(table) => done.send_modify(|w| {
                if snapshot.generation > w.generation {
                    w.generation = snapshot.generation;
                    w.taken_at = snapshot.taken_at;
                    w.table = Some(table);
                }
                w.writes += 1;
                w.error = None;
            }),
            Err(e) => {
                done.send_modify(|w| {
                    w.failures += 1;
                    w.error = Some(e.to_string());
                });
                if stopping {
                    return;
                }
                // Try again with it, unless something newer came meanwhile.
                let mut slot = shared.lock();
                if slot.next.is_none() {
                    slot.next = Some(snapshot);
                }
            }
        }
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

    fn v4(leases: &[Lease]) -> Table {
        Table {
            leases: leases.to_vec(),
            ..Table::default()
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
        store.save(&v4(&[lease(10), lease(11)]), 0).unwrap();
        store
            .save(&v4(&[lease(10), lease(11), lease(12)]), 0)
            .unwrap();
        let loaded = store.load(0).unwrap();
        assert_eq!(loaded.leases, vec![lease(10), lease(11), lease(12)]);
        assert!(loaded.moved_aside.is_none());
        let names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["leases.json"], "no temporary left");
        fs::remove_dir_all(&d).unwrap();
    }

    /// Another adapter's lease file (an HA pair's active box's) is kept once it decodes;
    /// bytes that do not decode, or a file cut short, are refused and ours stays.
    #[test]
    fn another_adapters_lease_file_is_kept_only_when_it_reads() {
        let (d, theirs) = (dir("theirs"), dir("theirs-src"));
        let store = LeaseStore::open(&d).unwrap();
        store.save(&v4(&[lease(10)]), 0).unwrap();
        let source = LeaseStore::open(&theirs).unwrap();
        let written = source.save(&v4(&[lease(10), lease(11)]), 0).unwrap();
        let file = fs::read(source.path()).unwrap();
        assert_eq!(*written, file[..], "save says what it wrote");
        for bad in [b"not a lease file".as_slice(), &file[..file.len() / 2]] {
            assert!(store.save_file(bad).is_err());
            assert_eq!(store.load(0).unwrap().leases, vec![lease(10)]);
        }
        store.save_file(&file).unwrap();
        assert_eq!(store.load(0).unwrap().leases, vec![lease(10), lease(11)]);
        fs::remove_dir_all(&d).unwrap();
        fs::remove_dir_all(&theirs).unwrap();
    }

    #[test]
    fn a_damaged_file_is_moved_aside_not_trusted() {
        let d = dir("damaged");
        let store = LeaseStore::open(&d).unwrap();
        store.save(&v4(&[lease(10)]), 0).unwrap();
        let full = fs::read(store.path()).unwrap();
        fs::write(store.path(), &full[..full.len() / 2]).unwrap();
        let loaded = store.load(42).unwrap();
        assert!(loaded.leases.is_empty());
        let (aside, reason) = loaded.moved_aside.unwrap();
        assert_eq!(aside, d.join("leases.json.corrupt-42"));
        assert!(aside.exists() && !store.path().exists(), "{reason}");
        // A leftover temporary file from a write cut short is simply overwritten.
        let tmp = d.join(format!(".leases.json.{}.tmp", std::process::id()));
        fs::write(&tmp, b"{ half").unwrap();
        store.save(&v4(&[lease(11)]), 0).unwrap();
        assert_eq!(store.load(0).unwrap().leases, vec![lease(11)]);
        assert!(!tmp.exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn active_leases_load_at_least_until_renewals_until() {
        let d = dir("renewals");
        let store = LeaseStore::open(&d).unwrap();
        let mut ended = lease(12);
        ended.active = false;
        store
            .save(&v4(&[lease(10), ended.clone()]), 1_800_000_500)
            .unwrap();
        let loaded = store.load(0).unwrap().leases;
        assert_eq!(
            loaded[0].expires, 1_800_000_500,
            "a renewal may have reached there"
        );
        assert_eq!(loaded[1], ended, "an ended lease stays ended");
        // A file from before the field: nothing added.
        fs::write(
            store.path(),
            serde_json::to_vec(&serde_json::json!({"version": 1, "leases": [lease(10)]})).unwrap(),
        )
        .unwrap();
        assert_eq!(store.load(0).unwrap().leases, vec![lease(10)]);
        fs::remove_dir_all(&d).unwrap();
    }

    fn wait_for(w: &Writer, what: impl Fn(&Written) -> bool) -> Written {
        for _ in 0..100 {
            let now = w.written();
            if what(&now) {
                return now;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the writer did not get there: {:?}", w.written());
    }

    #[test]
    fn the_writer_coalesces_bursts_retries_failures_and_flushes_on_drop() {
        let d = dir("writer");
        let w = Writer::spawn(LeaseStore::open(&d).unwrap(), 0).unwrap();
        let snap = |generation: u64, n: u8| Snapshot {
            generation,
            taken_at: generation,
            renewals_until: 0,
            table: v4(&(10..10 + n).map(lease).collect::<Vec<_>>()),
        };
        w.submit(snap(1, 1));
        wait_for(&w, |x| x.generation == 1);
        // A burst within the period: written once, the newest state.
        for g in 2..=50 {
            w.submit(snap(g, 2));
        }
        let after = wait_for(&w, |x| x.generation == 50);
        assert_eq!(after.writes, 2, "{after:?}");
        let store = LeaseStore::open(&d).unwrap();
        assert_eq!(store.load(0).unwrap().leases.len(), 2);
        // The directory goes away: the write fails, is reported, and is tried again.
        fs::remove_dir_all(&d).unwrap();
        w.submit(snap(51, 3));
        let failing = wait_for(&w, |x| x.failures >= 1);
        assert_eq!(failing.generation, 50);
        assert!(failing.error.is_some());
        fs::create_dir_all(&d).unwrap();
        let back = wait_for(&w, |x| x.generation == 51);
        assert_eq!(back.error, None);
        // Dropping it writes what is pending at once.
        w.submit(snap(52, 4));
        drop(w);
        assert_eq!(store.load(0).unwrap().leases.len(), 4);
        fs::remove_dir_all(&d).unwrap();
    }
}

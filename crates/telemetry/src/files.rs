//! Files a program writes for its operator or for itself: keys, certificates, CA bundles,
//! the last policy it was pushed. Each is written whole or not at all, and with a mode that
//! says who may read it, whatever the process's umask (the units run with `UMask=0077`).
//!
//! A [`Access::Secret`] file (a private key) is readable by its owner and by the group of
//! the directory it is in when that directory is closed to others: in the packages'
//! `/etc/cyphonic` (root:cyphonic 0750) a key that root writes with `cyphonic-cloud keygen` or
//! `ca issue` is 0640 root:cyphonic, readable by the service user and nobody else; in
//! `/var/lib/cyphonic` (cyphonic 0700) an enrolled key is 0640 cyphonic:cyphonic. In a
//! directory others may enter (a home directory, /tmp) it is 0600. A public file
//! (certificates, CA bundles) is 0644.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// Who may read a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Everyone (a certificate, a CA bundle, a cached policy).
    Public,
    /// Its owner, and the directory's group where the directory is closed to others (a
    /// private key).
    Secret,
}

/// The mode and group a file of `access` gets in a directory with `dir`'s metadata.
fn placement(dir: Option<&Metadata>, access: Access) -> (u32, Option<u32>) {
    match (access, dir) {
        (Access::Public, _) => (0o644, None),
        (Access::Secret, Some(d)) if d.mode() & 0o007 == 0 => (0o640, Some(d.gid())),
        (Access::Secret, _) => (0o600, None),
    }
}

/// Gives the open file `f` (in `dir`) its mode and group. A group the process may not give
/// (it is not a member) leaves the file to its owner alone.
fn settle(f: &File, dir: &Path, access: Access) -> std::io::Result<()> {
    let meta = std::fs::metadata(dir).ok();
    let (mut mode, group) = placement(meta.as_ref(), access);
    if let Some(gid) = group
        && std::os::unix::fs::fchown(f, None, Some(gid)).is_err()
    {
        mode = 0o600;
    }
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

/// The directory `path` is in (`.` for a bare file name).
pub fn directory(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Writes `contents` to `path` atomically and durably: a temporary file beside it (already
/// with its mode and group), synced, renamed over it, the directory synced. A crash leaves
/// the old file or the new one, never half of one.
///
/// # Errors
/// The directory is not writable, or the disk is full; the old file is intact.
pub fn replace(path: &Path, contents: impl AsRef<[u8]>, access: Access) -> std::io::Result<()> {
    let dir = directory(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        settle(&f, dir, access)?;
        f.write_all(contents.as_ref())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    File::open(dir)?.sync_all()
}

/// Writes `contents` to a new file at `path`; an existing file is never overwritten (a key
/// made twice must not replace the first).
///
/// # Errors
/// The file exists, the directory is not writable, or the disk is full.
pub fn create(path: &Path, contents: impl AsRef<[u8]>, access: Access) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    settle(&f, directory(path), access)?;
    f.write_all(contents.as_ref())?;
    f.sync_all()
}

/// Whether this user can make a file at `path`: a file is made, then removed, in its
/// directory (or in the nearest directory above it that exists, where the missing ones would
/// be made), as the daemon would write there.
///
/// # Errors
/// What creating the file said.
pub fn can_write(path: &Path) -> std::io::Result<()> {
    let mut dir = path.parent();
    while let Some(d) = dir
        && !d.as_os_str().is_empty()
        && !d.exists()
    {
        dir = d.parent();
    }
    let dir = dir
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // One probe per call: two threads checking one directory at once must not meet.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = dir.join(format!(".cyphonic-check-{}-{call}", std::process::id()));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> (u32, u32) {
        let m = std::fs::metadata(p).unwrap();
        (m.permissions().mode() & 0o7777, m.gid())
    }

    fn dir(mode: u32) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        d
    }

    #[test]
    fn a_file_is_replaced_whole_with_its_mode() {
        let d = dir(0o755);
        let path = d.path().join("gw.crt");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        replace(&path, "new", Access::Public).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(mode(&path).0, 0o644);
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }

    #[test]
    fn a_secret_is_shared_with_the_group_of_a_closed_directory_only() {
        let closed = dir(0o750);
        let gid = std::fs::metadata(closed.path()).unwrap().gid();
        let key = closed.path().join("gw.key");
        create(&key, "k", Access::Secret).unwrap();
        assert_eq!(mode(&key), (0o640, gid));
        let enrolled = closed.path().join("enrolled.key");
        replace(&enrolled, "k", Access::Secret).unwrap();
        assert_eq!(mode(&enrolled), (0o640, gid));

        let open = dir(0o755);
        let key = open.path().join("gw.key");
        create(&key, "k", Access::Secret).unwrap();
        assert_eq!(mode(&key).0, 0o600);
        replace(&key, "k2", Access::Secret).unwrap();
        assert_eq!(mode(&key).0, 0o600);
    }

    #[test]
    fn create_never_overwrites() {
        let d = dir(0o700);
        let key = d.path().join("ca.key");
        create(&key, "first", Access::Secret).unwrap();
        assert!(create(&key, "second", Access::Secret).is_err());
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "first");
    }

    #[test]
    fn placement_follows_the_directory() {
        let open = dir(0o755);
        let m = std::fs::metadata(open.path()).unwrap();
        assert_eq!(placement(Some(&m), Access::Secret), (0o600, None));
        assert_eq!(placement(Some(&m), Access::Public), (0o644, None));
        assert_eq!(placement(None, Access::Secret), (0o600, None));
        let closed = dir(0o710);
        let m = std::fs::metadata(closed.path()).unwrap();
        assert_eq!(placement(Some(&m), Access::Secret), (0o640, Some(m.gid())));
    }
}

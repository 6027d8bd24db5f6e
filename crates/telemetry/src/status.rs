//! The local status socket every daemon answers its `status` command on: a Unix socket, mode
//! 0600 (only the daemon's user and root may read it), that answers each connection with one
//! JSON document and closes. It runs on a thread of its own, so a busy control loop never
//! delays it and it never delays the control loop.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The socket, served; removed when this is dropped, and its thread (if [`serve`] started
/// one) ends.
#[derive(Debug)]
pub struct StatusSocket {
    path: PathBuf,
    stop: Option<Arc<AtomicBool>>,
}

impl StatusSocket {
    /// The socket bound at `path` (by [`bind_private`]), removed when this is dropped.
    pub fn at(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            stop: None,
        }
    }
}

impl Drop for StatusSocket {
    fn drop(&mut self) {
        if let Some(stop) = &self.stop {
            stop.store(true, Ordering::Relaxed);
            // Wakes the thread from its accept, to see the flag.
            let _ = UnixStream::connect(&self.path);
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds a daemon's local socket at `path` the way every one is bound: its directory
/// created, a stale socket replaced, mode 0600 (only the daemon's user and root).
///
/// # Errors
/// The directory cannot be created, the socket bound or its mode set.
pub fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Binds the status socket at `path` ([`bind_private`]) and answers every connection with
/// `snapshot()` from a thread (`cy-status`).
///
/// # Errors
/// The directory cannot be created, the socket bound or its mode set.
pub fn serve<T: serde::Serialize>(
    path: &Path,
    snapshot: impl Fn() -> T + Send + 'static,
) -> std::io::Result<StatusSocket> {
    let listener = bind_private(path)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    std::thread::Builder::new()
        .name("cy-status".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut stream) = conn else {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                };
                let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
                let mut text = serde_json::to_vec_pretty(&snapshot()).unwrap_or_default();
                text.push(b'\n');
                let _ = stream.write_all(&text);
            }
        })?;
    Ok(StatusSocket {
        path: path.to_owned(),
        stop: Some(stop),
    })
}

/// Why the status could not be read.
#[derive(Debug)]
#[non_exhaustive]
pub enum FetchError {
    /// No daemon listens there, or we may not connect.
    Connect {
        /// The socket.
        path: PathBuf,
        /// Which daemon.
        program: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// The daemon did not answer in time, or the answer is not JSON.
    Read(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connect {
                path,
                program,
                source,
            } => write!(
                f,
                "connecting to {} (is {program} running? are you root or its user?): {source}",
                path.display()
            ),
            Self::Read(e) => write!(f, "reading the status: {e}"),
        }
    }
}

impl std::error::Error for FetchError {}

/// Reads the status document from the daemon `program` listening at `path`, as it came.
///
/// # Errors
/// [`FetchError`].
pub fn fetch(path: &Path, program: &'static str) -> Result<serde_json::Value, FetchError> {
    let mut stream = UnixStream::connect(path).map_err(|source| FetchError::Connect {
        path: path.to_owned(),
        program,
        source,
    })?;
    let read = |e: &dyn std::fmt::Display| FetchError::Read(e.to_string());
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| read(&e))?;
    let mut text = String::new();
    stream.read_to_string(&mut text).map_err(|e| read(&e))?;
    serde_json::from_str(&text).map_err(|e| read(&e))
}

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

/// How long until `not_after`, seen at unix time `at`, in a word: `29d`, `7h`, `12m`,
/// `expired`; `-` when unknown (0).
pub fn time_left(not_after: u64, at: u64) -> String {
    match not_after.checked_sub(at) {
        _ if not_after == 0 || at == 0 => "-".to_owned(),
        None | Some(0) => "expired".to_owned(),
        Some(left) if left >= 2 * DAY => format!("{}d", left / DAY),
        Some(left) if left >= 2 * HOUR => format!("{}h", left / HOUR),
        Some(left) => format!("{}m", left.div_ceil(60)),
    }
}

/// How long ago `then` was, seen at unix time `at`, in a word: `now`, `40s`, `12m`, `7h`,
/// `29d`; `-` when unknown (0).
pub fn age(then: u64, at: u64) -> String {
    match at.checked_sub(then) {
        _ if then == 0 || at == 0 => "-".to_owned(),
        None | Some(0) => "now".to_owned(),
        Some(s) => ago(s),
    }
}

/// `secs` ago in a word: `now`, `40s`, `12m`, `7h`, `29d`.
pub fn ago(secs: u64) -> String {
    match secs {
        0 => "now".to_owned(),
        s if s < 120 => format!("{s}s"),
        s if s < 2 * HOUR => format!("{}m", s / 60),
        s if s < 2 * DAY => format!("{}h", s / HOUR),
        s => format!("{}d", s / DAY),
    }
}

/// A count of bytes for people: `0 B`, `980 B`, `1.2 kB`, `3.4 GB` (powers of 1000, one
/// decimal), as the status tables and the console show it.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["kB", "MB", "GB", "TB", "PB", "EB"];
    if n < 1000 {
        return format!("{n} B");
    }
    #[expect(clippy::cast_precision_loss, reason = "one decimal is shown")]
    let mut v = n as f64 / 1000.0;
    let mut unit = 0;
    // 999.95 would show as 1000.0 of this unit: the next one says it.
    while v >= 999.95 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_says_it_in_a_word() {
        let at = 1_700_000_000;
        for (left, word) in [
            (0, "expired"),
            (59, "1m"),
            (2 * 3600 - 1, "120m"),
            (2 * 3600, "2h"),
            (2 * 86_400, "2d"),
            (400 * 86_400, "400d"),
        ] {
            assert_eq!(time_left(at + left, at), word, "{left}");
        }
        assert_eq!(time_left(at - 5, at), "expired");
        assert_eq!(time_left(0, at), "-");
        assert_eq!(time_left(at, 0), "-");
    }

    #[test]
    fn age_says_it_in_a_word() {
        let at = 1_700_000_000;
        for (ago, word) in [
            (0, "now"),
            (40, "40s"),
            (720, "12m"),
            (7 * 3600, "7h"),
            (29 * 86_400, "29d"),
        ] {
            assert_eq!(age(at - ago, at), word, "{ago}");
        }
        assert_eq!(age(at + 5, at), "now");
        assert_eq!(age(0, at), "-");
    }

    #[test]
    fn bytes_say_it_in_a_word() {
        for (n, word) in [
            (0, "0 B"),
            (999, "999 B"),
            (1000, "1.0 kB"),
            (1_500_000, "1.5 MB"),
            (999_950, "1.0 MB"),
            (3_400_000_000, "3.4 GB"),
            (u64::MAX, "18.4 EB"),
        ] {
            assert_eq!(bytes(n), word, "{n}");
        }
    }

    #[test]
    fn the_socket_answers_with_the_document_and_goes_away() {
        let dir = std::env::temp_dir().join(format!("cyphonic-status-{}", std::process::id()));
        let path = dir.join("sub/test.sock");
        // What the document is made from: the thread's, until the socket goes.
        let held = Arc::new(());
        let snapshot = {
            let held = held.clone();
            move || serde_json::json!({ "hello": 1, "held": Arc::strong_count(&held) })
        };
        let guard = serve(&path, snapshot).unwrap_or_else(|e| panic!("{e}"));
        let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode.ok(), Some(0o600));
        let doc = fetch(&path, "test").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(doc["hello"], 1);
        assert_eq!(doc["held"], 2);
        drop(guard);
        assert!(!path.exists());
        // Its thread ended (a process that starts and stops ends, as a test harness does,
        // keeps no thread per end).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&held) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            Arc::strong_count(&held),
            1,
            "the thread still holds the snapshot"
        );
        let err = fetch(&path, "test").map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("is test running?"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

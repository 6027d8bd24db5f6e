//! Fixtures for the binaries' configuration tests: certificate files as an operator would
//! have them. Not for production use.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use cyphonic_crypto::{CertificateAuthority, IssueRequest, StaticKeypair};

/// A directory with a CA and certificates ([`write_pki`]), removed on drop: where a
/// binary's configuration tests write their files, relative paths and all.
#[derive(Debug)]
pub struct Fixture(PathBuf);

impl Fixture {
    /// A new directory named after `label` with the PKI of `nodes`, valid around `now`.
    ///
    /// # Panics
    /// When the directory or a file cannot be written: test setup errors.
    #[allow(clippy::unwrap_used, clippy::missing_panics_doc)]
    pub fn new(label: &str, now: u64, nodes: &[Node<'_>]) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cyphonic-{label}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        write_pki(&dir, now, nodes);
        Self(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `text` to the file `name` in the directory; returns its path.
    ///
    /// # Panics
    /// When it cannot be written.
    #[allow(clippy::unwrap_used, clippy::missing_panics_doc)]
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Mistakes in the keys every tunnel end has, as [`assert_mistakes`] takes them: each
/// binary's example file must refuse them all, with these messages.
pub const SHARED_MISTAKES: &[(&str, &str, &str)] = &[
    (
        "address = \"192.0.2.10:7000\"",
        "address = \"cloud..example:7000\"",
        "key `cloud.address`: \"cloud..example:7000\": invalid name",
    ),
    (
        "address = \"192.0.2.10:7000\"",
        "address = [\"192.0.2.10:7000\", \"cloud.example.net\"]",
        "key `cloud.address`: \"cloud.example.net\" is not host:port",
    ),
    (
        "address = \"192.0.2.10:7000\"",
        "address = []",
        "key `cloud.address`: give at least one",
    ),
    (
        "level = \"info\"",
        "level = \"cyphonic_tunnel=loud\"",
        "key `log.level`: ",
    ),
    (
        "cpus = []",
        "cpus = [2, 2]",
        "key `dataplane.cpus`: CPU 2 is listed twice",
    ),
    (
        "cpus = []",
        "cpus = [1024]",
        "key `dataplane.cpus`: CPU 1024 is over 1023",
    ),
    (
        "realtime_priority = 0",
        "realtime_priority = 100",
        "key `dataplane.realtime_priority`: 100 is outside 0 (off) ..= 99",
    ),
    (
        "aqm_interval_ms = 100",
        "aqm_interval_ms = 0",
        "key `dataplane.aqm_interval_ms`: 0 is outside 1..=10000",
    ),
    (
        "aqm_target_us = 0",
        "aqm_target_us = 100000",
        "key `dataplane.aqm_target_us`: 100000 µs is not below the interval (100 ms)",
    ),
    (
        "busy_poll_us = 0",
        "busy_poll_us = 1000001",
        "key `dataplane.busy_poll_us`: 1000001 is outside 0 (off) ..= 1000000",
    ),
    (
        "batch_size = 32",
        "batch_size = 0",
        "key `dataplane.batch_size`: 0 is outside 1..=1024",
    ),
    (
        "batches_in_flight = 4096",
        "batches_in_flight = 16385",
        "key `dataplane.batches_in_flight`: 16385 is outside 1..=16384",
    ),
    (
        "in_flight_bytes = 16777216",
        "in_flight_bytes = 1000",
        "key `dataplane.in_flight_bytes`: 1000 is below 65536 (0: no bound)",
    ),
    (
        "in_flight_ms = 100",
        "in_flight_ms = 10001",
        "key `dataplane.in_flight_ms`: 10001 is outside 0..=10000",
    ),
    (
        "aead = \"ring\"",
        "aead = \"aes\"",
        "key `dataplane.aead`: unknown AEAD backend \"aes\"",
    ),
    (
        "\nordering = true",
        "\nordring = true",
        "key `dataplane.ordring`: unknown field `ordring`",
    ),
    (
        "buffers = 8192",
        "buffers = 10",
        "key `dataplane.buffers`: at least 256",
    ),
    (
        "danger_rekey_after_secs = 120",
        "danger_rekey_after_secs = 600",
        "key `dataplane.danger_rekey_after_secs`: 600 is outside 2 ..= 120 (shorter than the default only)",
    ),
    (
        "danger_rekey_after_messages = 1152921504606846976",
        "danger_rekey_after_messages = 100",
        "key `dataplane.danger_rekey_after_messages`: 100 is outside 10000 ..= 1152921504606846976 (fewer than the default only)",
    ),
    (
        "inner_mtu = 1420",
        "inner_mtu = 9000",
        "inner_mtu`: 9000 is outside 576..=1480",
    ),
    (
        "public_key = \"5b0f",
        "public_key = \"zz0f",
        "key `cloud.public_key`: expected the 64 hex digits",
    ),
];

/// For each case `(from, to, expect)`: `example` with its first `from` replaced by `to`,
/// written into `fixture` and read with `load`, fails; the error names the file and says
/// `expect` (the line, the key, the message).
///
/// # Panics
/// When a case does not hold: the test fails, saying which.
#[allow(clippy::missing_panics_doc)]
pub fn assert_mistakes<C, I>(
    fixture: &Fixture,
    example: &str,
    cases: &[(&str, &str, &str)],
    load: impl Fn(&Path, u64) -> Result<(C, I), crate::ConfigError>,
    now: u64,
) {
    for (from, to, expect) in cases {
        assert!(example.contains(from), "the example lost {from:?}");
        let path = fixture.write("mistake.toml", &example.replacen(from, to, 1));
        let err = match load(&path, now) {
            Ok(_) => panic!("{from:?} -> {to:?} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.starts_with(&path.display().to_string()), "{err}");
        assert!(
            err.contains(expect),
            "{from:?} -> {to:?}\n  got:  {err}\n  want: {expect}"
        );
    }
}

/// `example` (the example file `name`) sets every key the file type `T` declares: a new key
/// without documentation in the example fails here.
///
/// # Panics
/// When it does not hold.
#[allow(clippy::missing_panics_doc)]
pub fn assert_documents_every_key<T: crate::Value>(example: &str, name: &str, commented: &[&str]) {
    let mut missing = crate::Reference::of::<T>().unset_in(example);
    // A key whose presence switches a mode (`legacy.router`) is shown commented out, as
    // `# key = value` on a line of its own.
    for key in commented {
        let at = missing.iter().position(|m| m == key);
        assert!(
            at.is_some(),
            "{name} sets {key}, which it should show commented out"
        );
        let last = key.rsplit('.').next().unwrap_or(key);
        assert!(
            example
                .lines()
                .any(|l| l.starts_with(&format!("# {last} = "))),
            "{name} does not show {key} commented out"
        );
        missing.retain(|m| m != key);
    }
    assert!(missing.is_empty(), "{name} does not show {missing:?}");
}

/// docs/configuration/`binary`.md (under the repository's `root`) is the reference of the
/// file type `T`, the `cyphonic-<binary>` configuration (see [`crate::ensure_file`]).
///
/// # Panics
/// When it was not.
pub fn assert_reference_current<T: crate::Value>(root: &Path, binary: &str) {
    let reference = crate::Reference::of::<T>().markdown(
        &format!("cyphonic-{binary}'s configuration"),
        &format!(
            "Every key of `/etc/cyphonic/{binary}.toml`, by table. `cyphonic-{binary} \
             check-config -c FILE` checks a file as `run` would; config/{binary}.example.toml \
             shows every key. Relative paths are relative to the file's directory."
        ),
    );
    let path = root.join(format!("docs/configuration/{binary}.md"));
    if let Err(e) = crate::ensure_file(&path, &reference) {
        panic!("{e}");
    }
}

/// One certificate to write: its name, its block, where (relative to the directory,
/// without extension), and whether to write its private key too.
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    /// FQDN.
    pub name: &'a str,
    /// vIP block (or several, separated by spaces).
    pub block: &'a str,
    /// `<path>.crt` (and `<path>.key`).
    pub path: &'a str,
    /// Write the key as well.
    pub with_key: bool,
}

impl<'a> Node<'a> {
    /// A node whose files are named after it, key and all: a tunnel end a test runs.
    pub const fn keyed(name: &'a str, block: &'a str) -> Self {
        Self {
            name,
            block,
            path: name,
            with_key: true,
        }
    }
}

/// Writes into `dir` an overlay CA for `ovl.example` (100.64.0.0/10 and fd7a:0:1::/48;
/// `ca.crt`, an empty `revoked.txt`) and `nodes`' certificates, valid around `now`.
///
/// # Panics
/// When a file cannot be written or the CA refuses a node: test setup errors.
#[allow(clippy::unwrap_used, clippy::missing_panics_doc)]
pub fn write_pki(dir: &Path, now: u64, nodes: &[Node<'_>]) {
    let ca = CertificateAuthority::generate(
        "ovl.example",
        &[
            "100.64.0.0/10".parse().unwrap(),
            "fd7a:0:1::/48".parse().unwrap(),
        ],
        now - 100,
        now + 10_000_000,
    )
    .unwrap();
    std::fs::write(dir.join("ca.crt"), ca.certificate().to_pem()).unwrap();
    std::fs::write(dir.join("revoked.txt"), "# none\n").unwrap();
    for n in nodes {
        let key = StaticKeypair::generate().unwrap();
        let cert = ca
            .issue(&IssueRequest {
                name: n.name.into(),
                vip_blocks: n
                    .block
                    .split_whitespace()
                    .map(|b| b.parse().unwrap())
                    .collect(),
                public_key: key.public().0,
                groups: vec![],
                not_before: now - 100,
                not_after: now + 1_000_000,
            })
            .unwrap();
        let crt = dir.join(format!("{}.crt", n.path));
        if let Some(parent) = crt.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&crt, cert.to_pem()).unwrap();
        if n.with_key {
            std::fs::write(dir.join(format!("{}.key", n.path)), &*key.to_pem()).unwrap();
        }
    }
}

/// The lines of a starter configuration (config/`<binary>`.toml) marked to fill in
/// (`key = value  # fill in`): each line's index and its dotted key (`cloud.address`), in
/// order. The one reading of that mark, for the unit tests and the as-shipped run.
pub fn to_fill_in(starter: &str) -> Vec<(usize, String)> {
    let mut table = String::new();
    let mut marked = Vec::new();
    for (i, line) in starter.lines().enumerate() {
        if let Some(t) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            t.clone_into(&mut table);
        } else if line.ends_with("# fill in")
            && let Some((key, _)) = line.split_once('=')
        {
            marked.push((i, format!("{table}.{}", key.trim())));
        }
    }
    marked
}

/// config/`<binary>`.toml, the packages' /etc/cyphonic file (`starter`, called `name`),
/// reads as the configuration `T` and marks exactly the keys `fill_in` (dotted: `cloud.address`)
/// as to fill in ([`to_fill_in`]).
///
/// # Panics
/// When it does not.
pub fn assert_starter<T: serde::de::DeserializeOwned>(starter: &str, name: &str, fill_in: &[&str]) {
    if let Err(e) = toml::from_str::<T>(starter) {
        panic!("{name} does not read: {e}");
    }
    let marked: Vec<String> = to_fill_in(starter).into_iter().map(|(_, k)| k).collect();
    assert_eq!(marked, fill_in, "{name}: the keys marked to fill in");
}

//! Enrollment (docs/protocol.md §4, Enrollment) from a tunnel end's side: with only the
//! cloud's address, its pinned key and a token, make our Noise key here (it never leaves the
//! device), ask the cloud's AS for a certificate, check it, and write the certificate and the
//! CA bundle where `[identity]` names them. `cyphonic-adapter enroll` (and `-node`) does it
//! on demand; `run` does it first when `[identity] token` is set and the certificate file
//! does not exist yet.

use std::path::Path;

use anyhow::{Context as _, bail};
use cyphonic_crypto::{Certificate, RevocationList, StaticKeypair, TrustStore};
use cyphonic_settings::{ConfigError, IdentityFiles, RawCloud, RawIdentity, Source};
use cyphonic_telemetry::files::{self as file_io, Access};
use serde::Deserialize;

/// The two tables enrollment reads; the rest of the file is checked once we have a
/// certificate (it may depend on the block we are given).
#[derive(Deserialize)]
struct Enrolling {
    identity: RawIdentity,
    cloud: Option<RawCloud>,
}

/// What to do when the certificate exists already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Nothing: we are enrolled (`run`).
    Keep,
    /// Refuse, saying so (`enroll`: enrolling again needs the old certificate moved away).
    Refuse,
}

/// Enrolls the tunnel end `end` (`adapter`, `node`: where its identity's files are by
/// default) whose configuration is `path`, with `token` (or `[identity] token`),
/// unless its certificate exists (`existing` says what that means). Returns whether it
/// enrolled. `agent` names us in the cloud's logs.
///
/// # Errors
/// The file's `[identity]` or `[cloud]` is wrong, no token, the cloud refused or could not be
/// reached, the certificate does not verify, or a file cannot be written.
pub fn enroll(
    path: &Path,
    end: &str,
    token: Option<&str>,
    existing: Existing,
    agent: &str,
    now_secs: u64,
) -> anyhow::Result<bool> {
    let (raw, text): (Enrolling, String) = cyphonic_settings::parse(path)?;
    let src = Source {
        path,
        text: &text,
        now_secs,
    };
    let files = raw.identity.files(&src, end);
    if files.certificate.exists() {
        return match existing {
            Existing::Keep => Ok(false),
            Existing::Refuse => bail!(
                "{} exists: this end is enrolled already (move it away to enroll again)",
                files.certificate.display()
            ),
        };
    }
    let token = match token {
        Some(given) => {
            if cyphonic_control::parse_token(given).is_none() {
                bail!(
                    "not an enrollment token: expected {}",
                    cyphonic_control::TOKEN_SHAPE
                );
            }
            Some(given)
        }
        None => raw.identity.checked_token(&src)?,
    };
    let Some(token) = token else {
        if existing == Existing::Keep {
            // Nothing to enroll with: loading reports the missing certificate.
            return Ok(false);
        }
        bail!("no token: give --token, or `token` in [identity]");
    };
    let Some(cloud) = &raw.cloud else {
        bail!(
            "{}: enrollment needs [cloud] (its address and public key)",
            path.display()
        );
    };
    let cloud = cloud.check(&src)?;
    let keypair = own_key(&files.key)?;
    let config = cyphonic_signal::Config {
        clouds: cloud.addresses,
        cloud_keys: cloud.public_keys,
        agent: agent.to_owned(),
        tunnel_port: None,
        tunnel: cyphonic_signal::TunnelVersions::OURS,
        source: None,
    };
    let enrolled = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(cyphonic_signal::enroll(&config, &keypair, token))?;
    let bundle = check(&files, &keypair, &enrolled, now_secs)?;
    let cert = &enrolled.certificate;
    file_io::replace(&files.ca, &bundle, Access::Public)
        .with_context(|| format!("writing {}", files.ca.display()))?;
    file_io::replace(&files.certificate, cert.to_pem(), Access::Public)
        .with_context(|| format!("writing {}", files.certificate.display()))?;
    let b = cert.body();
    tracing::info!(
        name = %b.name,
        blocks = ?b.vip_blocks,
        groups = ?b.groups,
        not_after = b.not_after,
        certificate = %files.certificate.display(),
        "enrolled"
    );
    Ok(true)
}

/// When the certificate file of the configuration at `path` does not exist yet and a token
/// is set, what `check-config` says instead of checking the rest: the rest of the file may
/// depend on the block the cloud will allocate, and `run` enrolls first. What enrolling
/// needs is checked now, as this user sees it: the token's shape, `[cloud]`, and the
/// identity's files (the key readable if there, the places written writable). `Ok(None)`
/// otherwise (checked as usual).
///
/// # Errors
/// What enrolling would fail on, at its key.
pub fn pending(path: &Path, end: &str, now_secs: u64) -> Result<Option<String>, ConfigError> {
    let Ok((raw, text)) = cyphonic_settings::parse::<Enrolling>(path) else {
        // Loading says what is wrong with the file.
        return Ok(None);
    };
    let src = Source {
        path,
        text: &text,
        now_secs,
    };
    let files = raw.identity.files(&src, end);
    let Some(cloud) = &raw.cloud else {
        return Ok(None);
    };
    if files.certificate.exists() || raw.identity.checked_token(&src)?.is_none() {
        return Ok(None);
    }
    cloud.check(&src)?;
    raw.identity.check_enrollable(&src, end)?;
    Ok(Some(format!(
        "{}: not enrolled yet ({} does not exist): its token, [cloud] and where enrolling writes are fine; `run` enrolls with [identity] token first; check again after",
        path.display(),
        files.certificate.display()
    )))
}

/// Our Noise key: the one in the key file, or a new one written there (mode 0600).
fn own_key(path: &Path) -> anyhow::Result<StaticKeypair> {
    if path.exists() {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        return StaticKeypair::from_pem(&text)
            .with_context(|| format!("{} is not a Noise private key", path.display()));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let key = StaticKeypair::generate()?;
    file_io::replace(path, key.to_pem(), Access::Secret)
        .with_context(|| format!("writing {}", path.display()))?;
    tracing::info!(key = %path.display(), public = %key.public(), "made our Noise key");
    Ok(key)
}

/// Checks what the cloud issued: it certifies our key and verifies under our roots (those of
/// the CA file when it exists: the cloud cannot make us trust a root we did not; else the
/// roots the cloud sent, believed because its key is pinned) and the chain. Returns the CA
/// bundle to write: the roots and the chain.
fn check(
    files: &IdentityFiles,
    keypair: &StaticKeypair,
    enrolled: &cyphonic_signal::Enrolled,
    now_secs: u64,
) -> anyhow::Result<String> {
    let cert = &enrolled.certificate;
    if cert.body().public_key != keypair.public().0 {
        bail!("the cloud issued a certificate for another key");
    }
    let roots: Vec<Certificate> = if files.ca.exists() {
        let text = std::fs::read_to_string(&files.ca)
            .with_context(|| format!("reading {}", files.ca.display()))?;
        Certificate::all_from_pem(&text)
            .with_context(|| format!("reading {}", files.ca.display()))?
            .into_iter()
            .filter(Certificate::is_root)
            .collect()
    } else {
        enrolled.roots.clone()
    };
    let mut trust = TrustStore::new(roots.clone(), RevocationList::default())
        .context("the roots do not hold")?;
    for ca in &enrolled.chain {
        trust
            .add_issuer(ca.clone())
            .context("the cloud's issuing CA does not verify under our roots")?;
    }
    trust
        .verify(cert, now_secs)
        .context("the issued certificate does not verify")?;
    Ok(roots
        .iter()
        .chain(&enrolled.chain)
        .map(Certificate::to_pem)
        .collect::<Vec<_>>()
        .join(""))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const KEY: &str = "5b0f5a3e27c1a8f3d2e4b6c8a0f1e2d3c4b5a69788796a5b4c3d2e1f0a1b2c3d";

    /// A configuration waiting to enroll, in a directory of its own, with `changes`
    /// (`(from, to)`) made to its text.
    fn waiting(changes: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let token = format!("0123456789abcdef.{}", "ab".repeat(32));
        let mut text = format!(
            "[identity]\ncertificate = \"gw.crt\"\nkey = \"keys/gw.key\"\nca = \"ca.crt\"\n\
             token = \"{token}\"\n\n[cloud]\naddress = \"192.0.2.10:7000\"\npublic_key = \"{KEY}\"\n"
        );
        for (from, to) in changes {
            assert!(text.contains(from), "{from}");
            text = text.replace(from, to);
        }
        let path = dir.path().join("adapter.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    /// The key `check-config` names in its refusal (`file:line: key `k`: message`).
    fn refused_at(path: &Path) -> String {
        let said = pending(path, "node", 0).unwrap_err().to_string();
        said.split('`').nth(1).unwrap_or(&said).to_owned()
    }

    #[test]
    fn a_configuration_waiting_to_enroll_has_what_enrolling_needs_checked() {
        let (_dir, path) = waiting(&[]);
        let said = pending(&path, "node", 0).unwrap().unwrap();
        assert!(said.contains("not enrolled yet"), "{said}");
        let (_dir, path) = waiting(&[("0123456789abcdef.", "garbage")]);
        assert_eq!(refused_at(&path), "identity.token");
        let (_dir, path) = waiting(&[(KEY, "abc")]);
        assert_eq!(refused_at(&path), "cloud.public_key");
        let (_dir, path) = waiting(&[("\"gw.crt\"", "\"/proc/self/gw.crt\"")]);
        assert_eq!(refused_at(&path), "identity.certificate");
        let (dir, path) = waiting(&[]);
        std::fs::create_dir(dir.path().join("keys")).unwrap();
        std::fs::write(dir.path().join("keys/gw.key"), "not a key").unwrap();
        assert_eq!(refused_at(&path), "identity.key");
        // Enrolled: checked as usual, not here.
        let (dir, path) = waiting(&[]);
        std::fs::write(dir.path().join("gw.crt"), "").unwrap();
        assert_eq!(pending(&path, "node", 0).unwrap(), None);
        // Nothing to enroll with: the same.
        let (_dir, path) = waiting(&[("token = ", "# token = ")]);
        assert_eq!(pending(&path, "node", 0).unwrap(), None);
    }
}

//! The CA's key file (`ca.key`): plain (`CYPHONIC CA PRIVATE KEY`, PKCS#8) or protected by a
//! passphrase (`ENCRYPTED PRIVATE KEY`: PKCS#8 `EncryptedPrivateKeyInfo`, PBES2 with scrypt,
//! N = 2^14, r = 8, p = 1, and AES-256-CBC, as the `pkcs8` crate writes it and OpenSSL reads
//! it: `openssl pkey -in ca.key`). A passphrase comes from a file (its first line) or is
//! asked on the terminal.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use cyphonic_crypto::CertificateAuthority;
use pkcs8::der::pem::LineEnding;
use zeroize::Zeroizing;

/// The armor of a protected key.
const PROTECTED_LABEL: &str = "ENCRYPTED PRIVATE KEY";

/// scrypt's cost: N = 2^14, r = 8, p = 1, 16 MiB a guess. OpenSSL's own choice for
/// `openssl pkcs8 -scrypt`, and the most its readers accept by default (they refuse keys
/// that need more than 32 MiB): the key stays readable with the standard tools.
const SCRYPT_LOG_N: u8 = 14;
const SCRYPT_R: u32 = 8;
const SCRYPT_P: u32 = 1;

/// The fewest characters a passphrase may have.
pub(crate) const MIN_PASSPHRASE: usize = 8;

/// Where the passphrase of a protected CA key comes from.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct KeyPassphrase {
    /// The passphrase of a protected `ca.key`: the first line of this file. Without it, a
    /// protected key's passphrase is asked on the terminal.
    #[arg(long, value_name = "FILE")]
    pub(crate) passphrase_file: Option<PathBuf>,
}

impl KeyPassphrase {
    /// The passphrase of `key` (a file named for the prompt and errors): from the file, or
    /// asked on the terminal.
    ///
    /// # Errors
    /// The file cannot be read; no file and no terminal to ask on.
    pub(crate) fn of(&self, key: &Path) -> anyhow::Result<Zeroizing<String>> {
        match &self.passphrase_file {
            Some(file) => first_line(file),
            None => ask(&format!("passphrase of {}: ", key.display())),
        }
    }
}

/// The first line of `file`, without its line end.
fn first_line(file: &Path) -> anyhow::Result<Zeroizing<String>> {
    let text = Zeroizing::new(
        std::fs::read_to_string(file)
            .with_context(|| format!("reading the passphrase in {}", file.display()))?,
    );
    let line = text.lines().next().unwrap_or_default();
    Ok(Zeroizing::new(line.to_owned()))
}

/// Asks `prompt` on the terminal, without echo.
fn ask(prompt: &str) -> anyhow::Result<Zeroizing<String>> {
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        bail!("{prompt}no terminal to ask on: give --passphrase-file FILE");
    }
    Ok(Zeroizing::new(
        rpassword::prompt_password(prompt).context("reading the passphrase")?,
    ))
}

/// A new passphrase: from `file`, or asked twice on the terminal; at least
/// [`MIN_PASSPHRASE`] characters.
///
/// # Errors
/// The file cannot be read; no terminal; the two differ; too short.
pub(crate) fn new_passphrase(file: Option<&Path>) -> anyhow::Result<Zeroizing<String>> {
    let pass = match file {
        Some(file) => first_line(file)?,
        None => {
            let first = ask("new passphrase: ")?;
            if ask("the same again: ")? != first {
                bail!("the two passphrases differ");
            }
            first
        }
    };
    if pass.chars().count() < MIN_PASSPHRASE {
        bail!("a passphrase needs at least {MIN_PASSPHRASE} characters");
    }
    Ok(pass)
}

/// Whether the key file's text is protected by a passphrase.
pub(crate) fn is_protected(key_text: &str) -> bool {
    key_text.contains(&format!("-----BEGIN {PROTECTED_LABEL}-----"))
}

/// The CA whose key is `key_text` (plain or protected: then `passphrase` is called for the
/// passphrase) and whose certificate is `cert_text`.
///
/// # Errors
/// A wrong passphrase; damaged text; a key that does not match the certificate.
pub(crate) fn open(
    key_text: &str,
    cert_text: &str,
    passphrase: impl FnOnce() -> anyhow::Result<Zeroizing<String>>,
) -> anyhow::Result<CertificateAuthority> {
    if !is_protected(key_text) {
        return Ok(CertificateAuthority::from_pem(key_text, cert_text)?);
    }
    let (label, der) = pkcs8::der::pem::decode_vec(key_text.trim().as_bytes())
        .map_err(|e| anyhow::anyhow!("the key's armor: {e}"))?;
    if label != PROTECTED_LABEL {
        bail!("not a protected key: {label}");
    }
    let info = pkcs8::EncryptedPrivateKeyInfo::try_from(der.as_slice())
        .map_err(|e| anyhow::anyhow!("the protected key does not read: {e}"))?;
    let pass = passphrase()?;
    // A wrong passphrase mostly fails the padding; when it does not, the key it yields is
    // not an Ed25519 key of this certificate.
    let wrong = || anyhow::anyhow!("wrong passphrase (or a damaged key)");
    let plain = info.decrypt(pass.as_bytes()).map_err(|_| wrong())?;
    CertificateAuthority::from_pkcs8(plain.as_bytes(), cert_text).map_err(|e| match e {
        cyphonic_crypto::CertError::InvalidKey | cyphonic_crypto::CertError::KeyMismatch => wrong(),
        other => other.into(),
    })
}

/// `ca`'s key, protected by `passphrase`, in armor.
///
/// # Errors
/// The key does not encode; the system's random numbers fail.
pub(crate) fn protect(
    ca: &CertificateAuthority,
    passphrase: &str,
) -> anyhow::Result<Zeroizing<String>> {
    let mut info = pkcs8::PrivateKeyInfo::try_from(ca.pkcs8())
        .map_err(|e| anyhow::anyhow!("the key does not encode: {e}"))?;
    // Sealed as PKCS#8 v1, without the public key (the certificate holds it): OpenSSL 3.0
    // reads no v2 key (RFC 5958) inside an encrypted one.
    info.public_key = None;
    let (mut salt, mut iv) = ([0u8; 16], [0u8; 16]);
    let rng = ring::rand::SystemRandom::new();
    ring::rand::SecureRandom::fill(&rng, &mut salt)
        .and_then(|()| ring::rand::SecureRandom::fill(&rng, &mut iv))
        .map_err(|_| anyhow::anyhow!("the system's random numbers failed"))?;
    let params = pkcs8::pkcs5::scrypt::Params::new(SCRYPT_LOG_N, SCRYPT_R, SCRYPT_P, 32)
        .map_err(|e| anyhow::anyhow!("scrypt: {e}"))?;
    let scheme = pkcs8::pkcs5::pbes2::Parameters::scrypt_aes256cbc(params, &salt, &iv)
        .map_err(|e| anyhow::anyhow!("scrypt: {e}"))?;
    let sealed = info
        .encrypt_with_params(scheme, passphrase.as_bytes())
        .map_err(|e| anyhow::anyhow!("protecting the key: {e}"))?;
    let text = sealed
        .to_pem(PROTECTED_LABEL, LineEnding::LF)
        .map_err(|e| anyhow::anyhow!("armoring the key: {e}"))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> CertificateAuthority {
        CertificateAuthority::generate("ovl.example", &["100.64.0.0/10".parse().unwrap()], 0, 10)
            .unwrap()
    }

    /// A protected key opens with its passphrase only, into the same CA; a plain key
    /// needs none (the passphrase is not even asked).
    #[test]
    fn a_protected_key_opens_with_its_passphrase_only() {
        let ca = ca();
        let cert = ca.certificate().to_pem();
        let sealed = protect(&ca, "correct horse").unwrap();
        assert!(is_protected(&sealed) && !sealed.contains(&*ca.key_pem()));
        assert!(!sealed.contains("CYPHONIC CA PRIVATE KEY"));
        let opened = open(&sealed, &cert, || {
            Ok(Zeroizing::new("correct horse".into()))
        })
        .unwrap();
        // The same key (the certificate's: loading checks), stored plain again.
        CertificateAuthority::from_pem(&opened.key_pem(), &cert).unwrap();
        let other = self::ca().certificate().to_pem();
        assert!(CertificateAuthority::from_pem(&opened.key_pem(), &other).is_err());
        let e = open(&sealed, &cert, || {
            Ok(Zeroizing::new("correct horsf".into()))
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("wrong passphrase"), "{e}");
        let plain = open(&ca.key_pem(), &cert, || {
            panic!("a plain key asked for a passphrase")
        });
        assert_eq!(plain.unwrap().pkcs8(), ca.pkcs8());
        // A damaged protected key is an error, never a panic, and never a CA: armor cut
        // short, a body that is not DER, the ciphertext flipped.
        let pass = || Ok(Zeroizing::new("correct horse".to_owned()));
        let cut = &sealed[..sealed.len() / 2];
        assert!(open(cut, &cert, pass).is_err());
        let garbage =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        assert!(open(garbage, &cert, pass).is_err());
        let lines: Vec<&str> = sealed.lines().collect();
        let mut flipped = lines[lines.len() - 2].to_owned().into_bytes();
        flipped[0] = if flipped[0] == b'A' { b'B' } else { b'A' };
        let mut damaged = lines.clone();
        let flipped = String::from_utf8(flipped).unwrap();
        let at = damaged.len() - 2;
        damaged[at] = &flipped;
        assert!(open(&damaged.join("\n"), &cert, pass).is_err());
        // Two protections of one key differ (salt and IV are fresh).
        assert_ne!(*protect(&ca, "correct horse").unwrap(), *sealed);
    }
}

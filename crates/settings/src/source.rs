//! The file itself: reading it, where a mistake is (file, line, dotted key), and which keys
//! a table accepts and documents.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

pub(crate) use cyphonic_declare::{key_at, line_of};
use cyphonic_declare::{value_at, with_value};
use serde::de::DeserializeOwned;
use toml::Spanned;

/// A configuration mistake, located.
#[derive(Debug)]
pub struct ConfigError {
    file: PathBuf,
    line: Option<usize>,
    key: Option<String>,
    message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": key `{key}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A configuration file being checked: where it is, what it says, and the time certificates
/// are checked at.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The file.
    pub path: &'a Path,
    /// Its text.
    pub text: &'a str,
    /// Unix seconds to check validity periods at.
    pub now_secs: u64,
}

/// The wall clock in Unix seconds, for [`Source::now_secs`] (0 if it is before 1970).
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Reads the file at `path` and parses it as `T`; returns it with the text (for [`Source`]).
///
/// # Errors
/// The file cannot be read, or is not valid TOML for `T` (located).
pub fn parse<T: DeserializeOwned>(path: &Path) -> Result<(T, String), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_owned(),
        line: None,
        key: None,
        message: format!("cannot read the configuration: {e}"),
    })?;
    let raw = toml::from_str(&text).map_err(|e| {
        let at = e.span().map(|s| s.start);
        ConfigError {
            file: path.to_owned(),
            line: at.map(|o| line_of(&text, o)),
            key: at.and_then(|o| key_at(&text, o)),
            message: with_value(e.message().trim(), at.and_then(|o| value_at(&text, o))),
        }
    })?;
    Ok((raw, text))
}

/// Reads the file at `path` as a `T` and checks it with `check`, certificates at unix time
/// `now_secs`: what a binary's `load` does.
///
/// # Errors
/// The file cannot be read or parsed, or `check` refuses it.
pub fn load<T: DeserializeOwned, R>(
    path: &Path,
    now_secs: u64,
    check: impl FnOnce(&T, &Source<'_>) -> Result<R, ConfigError>,
) -> Result<R, ConfigError> {
    let (raw, text) = parse(path)?;
    check(
        &raw,
        &Source {
            path,
            text: &text,
            now_secs,
        },
    )
}

impl Source<'_> {
    /// The error `message` about `key`, at `span` (a default span means "not in the file":
    /// no line).
    ///
    /// # Errors
    /// Always: this builds the error.
    pub fn err<T>(
        &self,
        span: &Range<usize>,
        key: &str,
        message: impl Into<String>,
    ) -> Result<T, ConfigError> {
        Err(ConfigError {
            file: self.path.to_owned(),
            line: (span.end > 0).then(|| line_of(self.text, span.start)),
            key: Some(key.to_owned()),
            message: message.into(),
        })
    }

    /// A path from the file, relative to the file's directory.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.path.parent().unwrap_or(Path::new(".")).join(p)
        }
    }

    /// The contents of the file a key names.
    ///
    /// # Errors
    /// It cannot be read (located at the key).
    pub fn read(&self, p: &Spanned<PathBuf>, key: &str) -> Result<String, ConfigError> {
        let path = self.resolve(p.get_ref());
        std::fs::read_to_string(&path).or_else(|e| {
            self.err(
                &p.span(),
                key,
                format!("cannot read {}: {e}", path.display()),
            )
        })
    }
}

/// The keys of `keys` whose values changed (`(key, changed)` pairs): what a reload names as
/// waiting for a restart.
pub fn changed_keys<const N: usize>(keys: [(&'static str, bool); N]) -> Vec<&'static str> {
    keys.into_iter()
        .filter_map(|(key, changed)| changed.then_some(key))
        .collect()
}

//! Who may resolve (and so reach) whom, by the groups in certificates.

use cyphonic_crypto::CertBody;
use serde::Deserialize;

/// One rule: clients in group `from` may resolve names hosted by clients in group `to`.
/// `"*"` matches any certificate, with or without groups.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// The asker's group.
    pub from: String,
    /// The target's group.
    pub to: String,
}

/// The rules, and what happens when none matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// With no matching rule: allow (an open overlay) or deny (only what rules allow).
    pub allow_by_default: bool,
    /// The rules.
    pub rules: Vec<Rule>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            allow_by_default: true,
            rules: Vec::new(),
        }
    }
}

impl Policy {
    /// Whether `asker` may resolve names of `target`.
    pub fn allows(&self, asker: &CertBody, target: &CertBody) -> bool {
        let matches = |pattern: &str, body: &CertBody| pattern == "*" || body.in_group(pattern);
        self.allow_by_default
            || self
                .rules
                .iter()
                .any(|r| matches(&r.from, asker) && matches(&r.to, target))
    }
}

//! Which per-device rules a tunnel end enforces: the cloud's set when it sent one (control
//! version 4; docs/protocol.md §4 *Policy*), else the file's `[policy]`, else none. The
//! cloud's set is kept in a file beside our certificate, so that it is enforced across cloud
//! outages and our own restarts until the cloud sends another.

use std::path::{Path, PathBuf};

use cyphonic_filter::RuleSet;
use cyphonic_signal::PolicyRule;
use cyphonic_telemetry::files::{self, Access};
use cyphonic_tunnel::policy::DEFAULT_FLOWS;
use cyphonic_tunnel::{PolicySettings, Shared};
use serde::{Deserialize, Serialize};

/// The file the cloud's set is kept in, in the directory of our certificate.
pub const STORED: &str = "cloud-policy.json";

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    version: u64,
    rules: Vec<PolicyRule>,
}

/// The rules in force and where they came from.
#[derive(Debug)]
pub struct Rules {
    file: Option<PolicySettings>,
    cloud: Option<RuleSet>,
    stored: Option<PathBuf>,
    /// Rule 0, which the cloud's set gets too (the file's has it already).
    dns: Vec<cyphonic_filter::Rule>,
}

impl Rules {
    /// The file's rules alone (no cloud).
    pub const fn from_file(file: Option<PolicySettings>) -> Self {
        Self {
            file,
            cloud: None,
            stored: None,
            dns: Vec::new(),
        }
    }

    /// With a cloud: the set kept at `stored` from an earlier run, if any, wins over the
    /// file's until the cloud says otherwise; the cloud's set ends with `dns` (rule 0).
    pub fn with_cloud(
        file: Option<PolicySettings>,
        stored: PathBuf,
        dns: Vec<cyphonic_filter::Rule>,
    ) -> Self {
        let cloud = match read(&stored) {
            Ok(set) => set,
            Err(e) => {
                tracing::warn!(file = %stored.display(), error = %e, "the cloud's last policy cannot be read: the file's applies until the cloud sends it again");
                None
            }
        };
        if let Some(set) = &cloud {
            tracing::info!(file = %stored.display(), version = %format_args!("{:x}", set.version), rules = set.rules.len(), "enforcing the policy the cloud sent last, until it sends another");
        }
        Self {
            file,
            cloud,
            stored: Some(stored),
            dns,
        }
    }

    /// What is enforced: the cloud's set with rule 0 (flows as the file's `[policy] flows`
    /// says, or the default), else the file's, else nothing.
    pub fn effective(&self) -> Option<PolicySettings> {
        match &self.cloud {
            Some(set) => {
                let mut rules = set.clone();
                rules.rules.extend(self.dns.iter().cloned());
                Some(PolicySettings {
                    rules,
                    flows: self.file.as_ref().map_or(DEFAULT_FLOWS, |f| f.flows),
                })
            }
            None => self.file.clone(),
        }
    }

    /// Puts what is in force into `shared`'s data plane; returns the flows cut.
    pub fn apply(&self, shared: &Shared) -> usize {
        shared.policy().set(self.effective().as_ref())
    }

    /// The file was read again: its `[policy]` is now `file`, rule 0 `dns`. Whether what
    /// is in force changed.
    pub fn set_file(
        &mut self,
        file: Option<PolicySettings>,
        dns: Vec<cyphonic_filter::Rule>,
    ) -> bool {
        let before = self.effective();
        self.file = file;
        self.dns = dns;
        before != self.effective()
    }

    /// The cloud sent its set (`None`: it enforces nothing per device); it is kept on disk.
    /// Whether what is in force changed.
    pub fn set_cloud(&mut self, set: Option<RuleSet>) -> bool {
        if set == self.cloud {
            return false;
        }
        if let Some(path) = &self.stored
            && let Err(e) = write(path, set.as_ref())
        {
            tracing::warn!(file = %path.display(), error = %e, "the cloud's policy could not be kept: it is enforced, but not after a restart without the cloud");
        }
        let before = self.effective();
        self.cloud = set;
        before != self.effective()
    }
}

/// The set kept at `path`; `None` when there is none.
fn read(path: &Path) -> Result<Option<RuleSet>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let stored: Stored = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let rules = stored
        .rules
        .iter()
        .map(PolicyRule::to_rule)
        .collect::<Option<Vec<_>>>()
        .ok_or("a rule with a port range backwards")?;
    Ok(Some(RuleSet {
        version: stored.version,
        rules,
    }))
}

fn write(path: &Path, set: Option<&RuleSet>) -> std::io::Result<()> {
    let Some(set) = set else {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    };
    let stored = Stored {
        version: set.version,
        rules: set.rules.iter().map(PolicyRule::from).collect(),
    };
    let text = serde_json::to_string(&stored).map_err(std::io::Error::other)?;
    files::replace(path, &text, Access::Public)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cyphonic_filter::{Proto, Rule};

    fn set(version: u64) -> RuleSet {
        RuleSet {
            version,
            rules: vec![Rule {
                id: 2,
                from: vec!["100.64.1.0/24".parse().unwrap_or_default()],
                to: vec!["100.64.2.7/32".parse().unwrap_or_default()],
                proto: Proto::Tcp,
                ports: vec![22..=22],
            }],
        }
    }

    /// The cloud's set wins over the file's and outlives a restart; "no policy" from the
    /// cloud gives the file's back and forgets the kept set.
    #[test]
    fn the_clouds_set_wins_and_is_kept() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join(STORED);
        let file = PolicySettings {
            rules: RuleSet::default(),
            flows: 99,
        };
        let mut r = Rules::with_cloud(Some(file.clone()), path.clone(), Vec::new());
        assert_eq!(r.effective(), Some(file.clone()));
        assert!(r.set_cloud(Some(set(5))));
        assert!(!r.set_cloud(Some(set(5))), "the same set changes nothing");
        let e = r.effective();
        assert!(
            e.as_ref()
                .is_some_and(|e| e.rules == set(5) && e.flows == 99),
            "{e:?}"
        );
        // A restart: the kept set applies before the cloud is heard from.
        let again = Rules::with_cloud(None, path.clone(), Vec::new());
        let e = again.effective();
        assert!(
            e.as_ref()
                .is_some_and(|e| e.rules == set(5) && e.flows == DEFAULT_FLOWS),
            "{e:?}"
        );
        assert!(r.set_cloud(None));
        assert_eq!(r.effective(), Some(file));
        assert!(!path.exists());
        // A damaged file: the file's rules apply (and it says so in the log).
        std::fs::write(&path, "{").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Rules::with_cloud(None, path.clone(), Vec::new()).effective(),
            None
        );
        // The cloud's set ends with rule 0 (DNS between the ends).
        let dns = vec![Rule {
            id: 0,
            from: vec!["100.64.0.0/10".parse().unwrap_or_default()],
            to: vec!["100.64.2.1/32".parse().unwrap_or_default()],
            proto: Proto::Udp,
            ports: vec![53..=53],
        }];
        let mut r = Rules::with_cloud(None, path, dns);
        r.set_cloud(Some(set(6)));
        let e = r.effective().map(|e| e.rules).unwrap_or_default();
        assert_eq!((e.version, e.rules.len()), (6, 2));
        assert_eq!(
            e.first_allowing(
                17,
                std::net::Ipv4Addr::new(100, 64, 1, 9),
                std::net::Ipv4Addr::new(100, 64, 2, 1),
                53
            ),
            Some(0)
        );
    }
}

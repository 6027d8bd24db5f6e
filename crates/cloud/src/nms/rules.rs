//! The policy: compiled from the registry, per client and per pair, and taken again on
//! reload.

use super::*;

impl Nms {
    /// The CAs and revocations clients are checked against now.
    pub(super) fn trust(&self) -> Arc<TrustStore> {
        self.trust
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Who may reach whom, as configured now.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The policy compiled against the registry, now.
    pub fn compiled(&self) -> Arc<Compiled> {
        self.compiled.borrow().clone()
    }

    /// Compiles the policy against the registry's members whose certificates are trusted,
    /// with the names they registered; sessions hear of a change. Returns whether it
    /// changed.
    ///
    /// # Errors
    /// The registry cannot be read.
    pub async fn compile_policy(&self) -> Result<bool, crate::store::StoreError> {
        let members = self.store.members().await?;
        Ok(self.compile_from(&members))
    }

    pub(super) fn compile_from(&self, members: &[crate::store::Member]) -> bool {
        let entries = crate::policy::entries(members, &self.trust(), unix_now());
        let compiled = match self.policy().compile(&entries) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "the policy does not compile: the last one stays");
                return false;
            }
        };
        let changed = self.compiled.send_if_modified(|old| {
            if **old == compiled {
                return false;
            }
            *old = Arc::new(compiled.clone());
            true
        });
        if changed {
            tracing::info!(
                enforce = compiled.enforce,
                rules = compiled.rules.rules.len(),
                version = %format_args!("{:x}", compiled.rules.version),
                members = entries.len(),
                "policy compiled against the registry: clients get their rules"
            );
            if !compiled.unresolved.is_empty() {
                tracing::info!(names = ?compiled.unresolved, "policy rules name what stands for nobody now (not registered, nobody in the group, or a typo): they match nothing through these");
            }
        }
        changed
    }

    /// The policy compiled for two clients alone, each with the names it registered: what
    /// decides whether they may be paired, at once, without waiting for the compilation
    /// over the whole registry (a rule between the two can only name their own devices,
    /// which lie in their own blocks).
    pub(super) async fn policy_between(
        &self,
        a: (&str, &CertBody),
        b: (&str, &CertBody),
    ) -> Result<Compiled, crate::store::StoreError> {
        let policy = self.policy();
        if policy.allow_by_default {
            return Ok(Compiled::default());
        }
        let mut entries = Vec::with_capacity(2);
        for (fp, body) in [a, b] {
            let (devices, devices6) = self.store.names_of(fp).await?;
            entries.push(crate::policy::Entry {
                name: body.name.clone(),
                blocks: body.vip_blocks.clone(),
                groups: body.groups.clone(),
                devices,
                devices6,
            });
        }
        Ok(policy.compile(&entries).unwrap_or_else(|e| {
            tracing::error!(error = %e, "the policy does not compile: nobody is paired");
            Compiled {
                enforce: true,
                ..Compiled::default()
            }
        }))
    }

    /// Compiles the policy again every `REVOCATIONS_EVERY` when the registry's members or
    /// names changed, or a reload or a revocation happened, until the task is dropped.
    pub async fn policies(self: Arc<Self>) {
        let mut tick = tokio::time::interval(REVOCATIONS_EVERY);
        let mut last: Option<u64> = None;
        loop {
            tick.tick().await;
            // Nothing to compile with `default = "allow"`: the registry is not read.
            if self.policy().allow_by_default {
                if self.compiled.borrow().enforce {
                    self.compile_from(&[]);
                }
                last = None;
                continue;
            }
            let members = match self.store.members().await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the registry for the policy");
                    continue;
                }
            };
            let signature = {
                use std::hash::{Hash, Hasher};
                let mut h = std::hash::DefaultHasher::new();
                self.policy_generation.load(Ordering::Relaxed).hash(&mut h);
                for m in &members {
                    (&m.client.fingerprint, &m.names, &m.names6).hash(&mut h);
                }
                h.finish()
            };
            if last == Some(signature) {
                continue;
            }
            last = Some(signature);
            self.compile_from(&members);
        }
    }

    /// The `policy` messages for a client with `body`'s blocks speaking control `version`:
    /// its part of the compiled policy, and that part's version (`None` when nothing is
    /// enforced). A member that records flow logs (version 12) and would enforce nothing
    /// gets one rule, number 0, that allows everything, so that its filter keeps flows
    /// (docs/protocol.md §8, *Flow logs*).
    pub(super) fn policy_for(&self, body: &CertBody, version: u16) -> (Option<u64>, Vec<CloudMsg>) {
        let mut set = self.compiled.borrow().for_client(&body.vip_blocks);
        if set.is_none() && version >= cyphonic_control::FLOWS_VERSION && self.logs_flows(body) {
            let any: Vec<ipnet::IpNet> = vec![
                ipnet::IpNet::V4(ipnet::Ipv4Net::default()),
                ipnet::IpNet::V6(ipnet::Ipv6Net::default()),
            ];
            set = Some(cyphonic_filter::RuleSet {
                version: ALLOW_ALL_VERSION,
                rules: vec![cyphonic_filter::Rule {
                    id: 0,
                    from: any.clone(),
                    to: any,
                    proto: cyphonic_filter::Proto::Any,
                    ports: Vec::new(),
                }],
            });
        }
        (
            set.as_ref().map(|s| s.version),
            cyphonic_control::policy::messages(set.as_ref()),
        )
    }

    /// Whether the member of `body` records flow logs (`[flows]`).
    pub(super) fn logs_flows(&self, body: &CertBody) -> bool {
        self.flows.logs(body)
    }

    /// The registry it serves from.
    pub const fn store(&self) -> &Store {
        &self.store
    }

    /// Takes on `trust` and `policy` (a reload): every client in the registry whose
    /// certificate no longer verifies loses its names, and its session here ends at once (it
    /// is refused when it comes back). Returns the names of the clients cut off.
    ///
    /// # Errors
    /// The registry cannot be read.
    pub async fn reload(
        &self,
        mut trust: TrustStore,
        policy: Policy,
    ) -> Result<Vec<String>, crate::store::StoreError> {
        for fp in self.online_revocations() {
            trust.revocations_mut().revoke(fp);
        }
        *self
            .trust
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(trust);
        *self
            .policy
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(policy);
        self.policy_generation.fetch_add(1, Ordering::Relaxed);
        self.cut_untrusted().await
    }
}

/// The version of the rule set that allows everything (flow logs under `default =
/// "allow"`): none the compiler gives.
const ALLOW_ALL_VERSION: u64 = u64::MAX;

//! Online revocation: the list read from the registry, its holders cut off, every session
//! told.

use super::*;

impl Nms {
    /// What was revoked online and taken on so far.
    pub(super) fn online_revocations(&self) -> Vec<Fingerprint> {
        let mut all: Vec<Fingerprint> = self
            .revoked_online
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .copied()
            .collect();
        all.sort();
        all
    }

    /// How many revocations were taken on so far.
    pub(super) fn online_revocation_count(&self) -> usize {
        self.revoked_online
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Takes on the registry's online revocations (`cyphonic-cloud revoke`), every
    /// `REVOCATIONS_EVERY`, until the task is dropped: each new one joins the trust, its
    /// holder is cut off (`Nms::cut_untrusted`) and every version-3 session is told.
    pub async fn revocations(self: Arc<Self>) {
        let mut tick = tokio::time::interval(REVOCATIONS_EVERY);
        loop {
            tick.tick().await;
            // Revocations are never deleted: an unchanged count means nothing new, and the
            // list is read only when it grew.
            match self.store.revocation_count().await {
                Ok(n) if n == self.online_revocation_count() => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "counting the registry's revocations");
                    continue;
                }
            }
            let listed = match self.store.revocations().await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the registry's revocations");
                    continue;
                }
            };
            let fresh: Vec<Fingerprint> = {
                let mut known = self
                    .revoked_online
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                listed
                    .iter()
                    .filter_map(|fp| fp.parse().ok())
                    .filter(|fp| known.insert(*fp))
                    .collect()
            };
            if fresh.is_empty() {
                continue;
            }
            let mut trust = (*self.trust()).clone();
            for fp in &fresh {
                trust.revocations_mut().revoke(*fp);
            }
            *self
                .trust
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(trust);
            self.policy_generation.fetch_add(1, Ordering::Relaxed);
            match self.cut_untrusted().await {
                Ok(cut) => {
                    tracing::warn!(revoked = fresh.len(), cut_off = ?cut, "certificates revoked online");
                }
                Err(e) => {
                    tracing::error!(error = %e, "revoked online, but the registry could not be checked");
                }
            }
            for msg in revoked_messages(&fresh) {
                for c in &self.connected {
                    if c.version >= 3 && c.tx.try_send(msg.clone()).is_err() {
                        tracing::warn!(client = %c.name, "push queue full: a revocation was not pushed (it learns it when it reconnects)");
                    }
                }
            }
        }
    }

    /// Every client in the registry whose certificate no longer verifies under the trust
    /// loses its names, and its session here ends at once. Returns their names.
    pub(super) async fn cut_untrusted(&self) -> Result<Vec<String>, crate::store::StoreError> {
        let trust = self.trust();
        let now = unix_now();
        let mut cut = Vec::new();
        for m in self.store.members().await? {
            let verdict = Certificate::from_pem(&m.client.certificate)
                .map_err(|e| e.to_string())
                .and_then(|c| trust.verify(&c, now).map_err(|e| e.to_string()));
            let Err(why) = verdict else {
                continue;
            };
            let fp = &m.client.fingerprint;
            self.store.release_names(fp).await?;
            if self.connected.remove(fp).is_some() {
                tracing::warn!(client = %m.client.name, reason = %why, "control session closed: the certificate is no longer trusted");
                self.store.client_offline(fp).await?;
            }
            if !m.names.is_empty() || m.client.online {
                tracing::info!(client = %m.client.name, names = m.names.len(), reason = %why, "names released: the certificate is no longer trusted");
            }
            cut.push(m.client.name.clone());
        }
        Ok(cut)
    }
}

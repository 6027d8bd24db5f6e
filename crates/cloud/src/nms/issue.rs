//! Enrollment and renewal: certificates issued online, and the members they replace.

use super::*;

impl Nms {
    /// An enrollment: the token checked and redeemed, the certificate issued for the
    /// handshake's key (docs/protocol.md §4, Enrollment); or why not, in words for the client.
    pub(super) async fn redeem(
        &self,
        hs: &ServerHandshake,
        from: SocketAddr,
    ) -> Result<Welcome, String> {
        use crate::enroll::{Token, TokenError};
        let hello = hs.hello();
        if hello.version < 3 {
            return Err("enrollment needs control version 3".into());
        }
        let issuer = self
            .issuer
            .as_ref()
            .ok_or("this cloud does not enroll (no [enroll] in its configuration)")?;
        let token =
            Token::parse(hello.enroll.as_deref().unwrap_or_default()).map_err(|e| e.to_string())?;
        let unavailable = |e: crate::store::StoreError| {
            tracing::error!(error = %e, "store");
            "the registry is unavailable; try again".to_owned()
        };
        let row = self
            .store
            .token(&token.id)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| TokenError::Unknown.to_string())?;
        let now = unix_now();
        let key = hex::encode(hs.remote_static().0);
        token.check(&row, now, &key).map_err(|e| e.to_string())?;
        // The blocks were free when the token was made; a member may hold one of them
        // since (a certificate from the offline CA): no two names hold one address (issue
        // 49, finding 6).
        if let Some(member) = self
            .overlapping_member(&row.name, &row.blocks, now)
            .await
            .map_err(unavailable)?
        {
            tracing::warn!(name = %row.name, %member, "an enrollment's blocks overlap a member's: refused");
            return Err(format!(
                "the token's blocks overlap those of the member {member}: ask the operator for another token"
            ));
        }
        let cert = issuer.enroll(&row, hs.remote_static().0, now)?;
        let fp = cert.fingerprint().to_string();
        // Redeemed, but spent only once this certificate connects (store::confirm_token): a
        // device that refuses it (its clock behind, a Pi before NTP) enrolls again with the
        // same key, and the certificate it refused is revoked (issue 49, finding 5).
        if !self
            .store
            .redeem_token(&token.id, now, &fp, &key)
            .await
            .map_err(unavailable)?
        {
            return Err(TokenError::Used.to_string());
        }
        let again = if row.used_at.is_some() {
            " again (it never used the certificate it was given)"
        } else {
            ""
        };
        tracing::info!(name = %row.name, token = %token.id, fingerprint = %fp, "enrolled{again}");
        // Recorded once done: refusals are not, or anyone could fill the log with handshakes.
        let who = crate::admin::Who {
            actor: format!("member:{}", row.name),
            source: from.to_string(),
        };
        let details = serde_json::json!({ "token": token.id, "fingerprint": fp });
        let recorded = crate::admin::record(
            &self.store,
            &who,
            "member.enroll",
            &row.name,
            details,
            Ok(()),
        );
        let _ = recorded.await;
        // The certificate it was given before (and refused) is retired: no longer named by
        // the token, it would otherwise escape a revocation of the name.
        if let Some(refused) = row.used_by.filter(|prev| *prev != fp) {
            let added = self
                .store
                .revoke(std::slice::from_ref(&refused), &row.name, now)
                .await
                .map_err(unavailable)?;
            tracing::info!(name = %row.name, fingerprint = %refused, added, "the certificate it refused is revoked");
        }
        let pems = |certs: &[Certificate]| certs.iter().map(Certificate::to_pem).collect();
        Ok(Welcome::Enrolled {
            certificate: cert.to_pem(),
            chain: pems(&issuer.chain()),
            roots: pems(issuer.roots()),
        })
    }

    /// The name of a member other than `name` whose certificate, valid and unrevoked at
    /// `now`, holds a block overlapping one of `blocks`: that member owns those addresses
    /// (issue 49, finding 6).
    pub(super) async fn overlapping_member(
        &self,
        name: &str,
        blocks: &[ipnet::IpNet],
        now: u64,
    ) -> Result<Option<String>, crate::store::StoreError> {
        let trust = self.trust();
        for (other, pem) in self.store.certificates_overlapping(name, blocks).await? {
            let Ok(cert) = Certificate::from_pem(&pem) else {
                continue;
            };
            let overlaps = cyphonic_crypto::first_overlap(blocks, &cert.body().vip_blocks);
            if overlaps.is_some() && trust.verify(&cert, now).is_ok() {
                return Ok(Some(other));
            }
        }
        Ok(None)
    }

    /// The newest certificate of a name wins (issue 49, finding 6): of the certificates the
    /// registry knows of `body`'s name and issuing CA for another key (a re-keyed or replaced
    /// member), one that starts later supersedes `fp` (returned: this session is not to
    /// go on), and those that start no later are retired, revoked online, so that every
    /// instance and every client drops them within seconds. Renewals (the same key) are
    /// left alone.
    pub(super) async fn supersede(
        &self,
        fp: &str,
        body: &CertBody,
        issuer: &str,
    ) -> Result<Option<String>, crate::store::StoreError> {
        let now = unix_now();
        let trust = self.trust();
        let mut retire = Vec::new();
        for (other_fp, pem) in self.store.certificates_named(&body.name, issuer).await? {
            if other_fp == fp {
                continue;
            }
            let Ok(other) = Certificate::from_pem(&pem) else {
                continue;
            };
            let o = other.body();
            if o.public_key == body.public_key || trust.verify(&other, now).is_err() {
                continue;
            }
            // The later start wins; of two that start together (issued within one second),
            // the larger fingerprint: the same answer whichever connects first.
            if (o.not_before, other_fp.as_str()) > (body.not_before, fp) {
                return Ok(Some(other_fp));
            }
            retire.push(other_fp);
        }
        if !retire.is_empty() {
            let added = self.store.revoke(&retire, &body.name, now).await?;
            tracing::warn!(name = %body.name, fingerprint = %fp, retired = ?retire, added, "a newer certificate of this name for another key is in use: the older ones are revoked online");
        }
        Ok(None)
    }

    /// A renewal of the session's certificate `body` (docs/protocol.md §4, Renewal).
    pub(super) async fn renew(&self, body: &CertBody) -> CloudMsg {
        let now = unix_now();
        let verdict = (|| {
            let issuer = self
                .issuer
                .as_ref()
                .ok_or("this cloud does not issue certificates")?;
            if now >= body.not_after {
                return Err("the certificate has expired".to_owned());
            }
            let half = body.not_before + (body.not_after - body.not_before) / 2;
            if now < half {
                return Err("too early: ask once half of the validity has passed".into());
            }
            issuer.renew(body, now)
        })();
        // The registry knows the new certificate before its holder uses it: a revocation of
        // the name finds it.
        let verdict = match verdict {
            Ok(cert) => {
                let issuer = hex::encode(cert.body().issuer);
                match self
                    .store
                    .issued(
                        &cert.fingerprint().to_string(),
                        (&body.name, &issuer),
                        (&cert.to_pem(), &cert.body().vip_blocks),
                    )
                    .await
                {
                    Ok(()) => Ok(cert),
                    Err(e) => {
                        tracing::error!(error = %e, "store");
                        Err("the registry is unavailable; try again".to_owned())
                    }
                }
            }
            Err(e) => Err(e),
        };
        match verdict {
            Ok(cert) => {
                bump(&self.stats.renewed);
                tracing::info!(name = %body.name, fingerprint = %cert.fingerprint(), not_after = cert.body().not_after, "certificate renewed");
                let who = crate::admin::Who {
                    actor: format!("member:{}", body.name),
                    source: "session".to_owned(),
                };
                let details = serde_json::json!({
                    "fingerprint": cert.fingerprint().to_string(),
                    "not_after": cert.body().not_after,
                });
                let recorded = crate::admin::record(
                    &self.store,
                    &who,
                    "member.renew",
                    &body.name,
                    details,
                    Ok(()),
                );
                let _ = recorded.await;
                CloudMsg::Renewed {
                    certificate: cert.to_pem(),
                }
            }
            Err(reason) => {
                bump(&self.stats.renew_refused);
                tracing::info!(name = %body.name, %reason, "renewal refused");
                CloudMsg::NotRenewed { reason }
            }
        }
    }
}

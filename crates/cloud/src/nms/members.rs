//! What a member asks: registration, resolution with policy, pairing, relays, and the
//! signals pushed to the other side.

use super::*;

impl Nms {
    /// Serves one message of the client holding `cert` as its session would, without a
    /// session: for the fuzz targets and tests that drive NMS directly.
    #[doc(hidden)]
    pub async fn serve_message(&self, cert: &Certificate, msg: ClientMsg) -> Option<CloudMsg> {
        self.serve_message_as(cert, VERSION, msg).await
    }

    /// [`Nms::serve_message`] for a client speaking control `version` (before the answer
    /// is shaped for it).
    #[doc(hidden)]
    pub async fn serve_message_as(
        &self,
        cert: &Certificate,
        version: u16,
        msg: ClientMsg,
    ) -> Option<CloudMsg> {
        let fp = cert.fingerprint().to_string();
        let mut parts = cyphonic_control::report::Assembler::default();
        self.handle((&fp, version), cert.body(), msg, &mut parts)
            .await
    }

    /// Answers `msg` of the client `fp`, which speaks control `version`; `parts` holds the
    /// session's report as its parts come.
    pub(super) async fn handle(
        &self,
        (fp, version): (&str, u16),
        body: &CertBody,
        msg: ClientMsg,
        parts: &mut cyphonic_control::report::Assembler,
    ) -> Option<CloudMsg> {
        match msg {
            ClientMsg::Flows {
                flows,
                refused,
                unreported,
            } => {
                self.flows((fp, version), body, (flows, refused, unreported))
                    .await
            }
            ClientMsg::Report {
                devices,
                tunnels,
                more,
            } => {
                self.report((fp, version), body, parts, (devices, tunnels, more))
                    .await
            }
            ClientMsg::Ping {} => Some(CloudMsg::Pong {}),
            ClientMsg::Renew {} => Some(self.renew(body).await),
            ClientMsg::Register {
                endpoints,
                names,
                mapping,
                tunnel,
            } => Some(
                self.register(fp, body, (endpoints, mapping, tunnel), names)
                    .await,
            ),
            ClientMsg::HaPair {
                term,
                reason,
                boxes,
            } => {
                self.ha_pair((fp, version), body, (term, &reason), boxes)
                    .await
            }
            ClientMsg::Relay { peer } => Some(self.pair(fp, body, &peer, true).await),
            ClientMsg::Admit { peer } => Some(self.pair(fp, body, &peer, false).await),
            ClientMsg::Resolve { id, name } => {
                bump(&self.stats.resolves);
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                let resolution = match self.resolve((fp, version), body, &name).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(error = %e, "store");
                        return Some(CloudMsg::Error {
                            reason: "the registry is unavailable".into(),
                        });
                    }
                };
                Some(CloudMsg::Resolved {
                    id,
                    name,
                    resolution,
                })
            }
        }
    }

    /// Keeps an HA pair's report of itself, checked for shape; says what is wrong with it
    /// otherwise (docs/protocol.md §5, *Seen from the cloud*).
    async fn ha_pair(
        &self,
        (fp, version): (&str, u16),
        body: &CertBody,
        (term, reason): (u64, &str),
        boxes: Vec<cyphonic_control::PairBox>,
    ) -> Option<CloudMsg> {
        let checked = if version < cyphonic_control::HA_PAIR_VERSION {
            Err(format!(
                "ha_pair is control version {}",
                cyphonic_control::HA_PAIR_VERSION
            ))
        } else {
            pair_report((term, reason), boxes, unix_now())
        };
        let report = match checked {
            Ok(r) => r,
            Err(reason) => {
                bump(&self.stats.pair_reports_refused);
                tracing::info!(client = %body.name, %reason, "HA pair report refused");
                return Some(CloudMsg::Error { reason });
            }
        };
        match self.store.report_pair(fp, &report).await {
            Ok(()) => {
                bump(&self.stats.pair_reports);
                tracing::debug!(client = %body.name, term, boxes = report.boxes.len(), "HA pair reported");
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "store");
                Some(CloudMsg::Error {
                    reason: "the registry is unavailable".into(),
                })
            }
        }
    }

    /// Takes a part of the member's report of its devices and tunnels, and keeps the
    /// report once its last part is in (docs/protocol.md §8, *Devices and tunnels*); says
    /// what is wrong with it otherwise.
    async fn report(
        &self,
        (fp, version): (&str, u16),
        body: &CertBody,
        parts: &mut cyphonic_control::report::Assembler,
        (devices, tunnels, more): (
            Vec<cyphonic_control::DeviceReport>,
            Vec<cyphonic_control::TunnelReport>,
            bool,
        ),
    ) -> Option<CloudMsg> {
        let taken = if version < cyphonic_control::REPORT_VERSION {
            Err(format!(
                "report is control version {}",
                cyphonic_control::REPORT_VERSION
            ))
        } else {
            parts
                .take(devices, tunnels, more)
                .map_err(|e| e.to_string())
        };
        let mut report = match taken {
            Ok(Some(r)) => r,
            Ok(None) => return None,
            Err(reason) => {
                bump(&self.stats.reports_refused);
                tracing::info!(client = %body.name, %reason, "report refused");
                return Some(CloudMsg::Error { reason });
            }
        };
        // Whatever the member says, shown to operators: printable, and short.
        for d in &mut report.devices {
            if let Some(n) = d.name.as_mut() {
                *n = printable(n, NAME_MAX);
            }
            if let Some(h) = d.hostname.as_mut() {
                *h = printable(h, cyphonic_control::report::HOSTNAME_MAX);
            }
        }
        for t in &mut report.tunnels {
            t.name = printable(&t.name, NAME_MAX);
        }
        match self.store.keep_report(fp, &report, unix_now()).await {
            Ok(()) => {
                bump(&self.stats.reports);
                tracing::debug!(client = %body.name, devices = report.devices.len(), tunnels = report.tunnels.len(), "report kept");
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "store");
                Some(CloudMsg::Error {
                    reason: "the registry is unavailable".into(),
                })
            }
        }
    }

    /// Keeps a member's flow records (docs/protocol.md §8, *Flow logs*); says what is wrong
    /// with them otherwise, and keeps nothing.
    async fn flows(
        &self,
        (fp, version): (&str, u16),
        body: &CertBody,
        (flows, refused, unreported): (
            Vec<cyphonic_control::FlowRecord>,
            Vec<cyphonic_control::RefusedRecord>,
            u64,
        ),
    ) -> Option<CloudMsg> {
        let refusal = if version < cyphonic_control::FLOWS_VERSION {
            Some(format!(
                "flows is control version {}",
                cyphonic_control::FLOWS_VERSION
            ))
        } else if !self.logs_flows(body) {
            Some("flow logs are off for this member".to_owned())
        } else if flows.len() > FLOWS_MAX || refused.len() > REFUSED_MAX {
            Some(format!(
                "more than {FLOWS_MAX} flows or {REFUSED_MAX} refused summaries in a message"
            ))
        } else {
            None
        };
        if let Some(reason) = refusal {
            bump(&self.stats.flows_refused);
            tracing::info!(client = %body.name, %reason, "flow records refused");
            return Some(CloudMsg::Error { reason });
        }
        self.stats
            .flows_unreported
            .fetch_add(unreported, Ordering::Relaxed);
        if unreported > 0 {
            tracing::debug!(client = %body.name, unreported, "flow records the member did not send");
        }
        match self
            .store
            .keep_flows((fp, &body.name), &flows, &refused)
            .await
        {
            Ok(()) => {
                self.stats
                    .flows
                    .fetch_add((flows.len() + refused.len()) as u64, Ordering::Relaxed);
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "store");
                Some(CloudMsg::Error {
                    reason: "the registry is unavailable".into(),
                })
            }
        }
    }

    pub(super) async fn register(
        &self,
        fp: &str,
        body: &CertBody,
        (mut endpoints, mapping, tunnel): (
            Vec<SocketAddr>,
            Option<Mapping>,
            Option<TunnelVersions>,
        ),
        mut names: Vec<NameRecord>,
    ) -> CloudMsg {
        endpoints.retain(|e| cyphonic_control::reachable(*e));
        endpoints.truncate(MAX_ENDPOINTS);
        let mapping = mapping.filter(|m| {
            let ok = m.is_well_formed();
            if !ok {
                bump(&self.stats.mappings_refused);
                tracing::info!(client = %body.name, "a registration's mapping left out: not well formed");
            }
            ok
        });
        // Names with a vIP first: those of devices with IPv6 only (which any MAC on a LAN
        // can make many of) are the ones left out beyond the cap (docs/protocol.md §7).
        names.sort_by_key(|n| n.vip.is_none());
        let mut refused = Vec::new();
        let mut ok = Vec::new();
        for (i, n) in names.into_iter().enumerate() {
            if i >= MAX_NAMES {
                refused.push((n.name, format!("more than {MAX_NAMES} names")));
            } else if let Err(e) = check_name(body, &n) {
                refused.push((n.name, e.to_string()));
            } else {
                ok.push(n);
            }
        }
        match self
            .store
            .register(fp, (&endpoints, mapping.as_ref(), tunnel), &ok)
            .await
        {
            Ok(taken) => {
                for (t, why) in taken {
                    ok.retain(|n| n.name != t);
                    refused.push((t, why));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "store");
                return CloudMsg::Error {
                    reason: "the registry is unavailable".into(),
                };
            }
        }
        for (name, reason) in &refused {
            bump(&self.stats.names_refused);
            tracing::info!(client = %body.name, name = %cyphonic_telemetry::Untrusted(name), %reason, "name refused");
        }
        tracing::debug!(client = %body.name, names = ok.len(), ?endpoints, "registered");
        CloudMsg::Registered {
            accepted: ok.len(),
            refused,
        }
    }

    pub(super) async fn resolve(
        &self,
        (fp, version): (&str, u16),
        asker: &CertBody,
        name: &str,
    ) -> Result<Resolution, crate::store::StoreError> {
        let Some(found) = self.store.lookup(name).await? else {
            return Ok(Resolution::NotFound);
        };
        // A name with IPv6 only does not exist for a client before version 9: nobody is
        // told to expect it.
        if found.vip.is_none() && version < 9 {
            return Ok(Resolution::NotFound);
        }
        if found.owner.fingerprint == fp {
            return Ok(Resolution::Own);
        }
        let Ok(target) = Certificate::from_pem(&found.owner.certificate) else {
            return Ok(Resolution::NotFound);
        };
        // The target's certificate may have been revoked or expired since it registered.
        if self.trust().verify(&target, unix_now()).is_err() {
            return Ok(Resolution::NotFound);
        }
        // The asker must be allowed to open something to the target.
        let between = self
            .policy_between((fp, asker), (&found.owner.fingerprint, target.body()))
            .await?;
        let blocks = (&asker.vip_blocks, &target.body().vip_blocks);
        if !between.opens(blocks.0, blocks.1) {
            bump(&self.stats.denied);
            tracing::info!(asker = %asker.name, name = %cyphonic_telemetry::Untrusted(name), "resolution denied by policy");
            return Ok(Resolution::Denied);
        }
        // Tell the target to expect the asker; both start handshaking at once. Through the
        // relay when the pair cannot talk directly.
        let Some(me) = self.store.client(fp).await? else {
            return Ok(Resolution::NotFound);
        };
        let target_row = &found.owner;
        let relays = match (route::choose(&me, target_row), &self.trs) {
            (Some(reason), Some(trs)) => self.relays(trs, &me, target_row, reason).await,
            (Some(reason), None) => {
                tracing::warn!(asker = %asker.name, target = %target_row.name, %reason, "the pair needs the relay, and this cloud runs none: trying directly");
                None
            }
            (None, _) => None,
        };
        let (mine, theirs) = relays.map_or((None, None), |(m, t)| (Some(m), Some(t)));
        let allowed = between.allowed(blocks.0, blocks.1);
        self.signal(
            &target_row.fingerprint,
            CloudMsg::Expect {
                peer: PeerInfo {
                    certificate: me.certificate.clone(),
                    endpoints: me.reach(),
                    relay: theirs,
                    allowed: allowed.map(Allowed::mirror),
                    tunnel: me.tunnel,
                },
            },
        )
        .await;
        Ok(Resolution::Found {
            vip: found.vip,
            vip6: found.vip6,
            peer: PeerInfo {
                certificate: target_row.certificate.clone(),
                endpoints: target_row.reach(),
                relay: mine,
                allowed,
                tunnel: target_row.tunnel,
            },
        })
    }

    /// A relay channel for the pair `a`, `b` and what each side is told of it, or `None`
    /// (logged) when the relay cannot serve them.
    pub(super) async fn relays<'a>(
        &self,
        trs: &Arc<Trs>,
        a: &'a ClientRow,
        b: &'a ClientRow,
        reason: RelayReason,
    ) -> Option<(RelayInfo, RelayInfo)> {
        let held = |fp: &str| trs.channels_of(fp);
        if held(&a.fingerprint) >= MAX_CHANNELS_PER_CLIENT
            || held(&b.fingerprint) >= MAX_CHANNELS_PER_CLIENT
        {
            tracing::warn!(a = %a.name, b = %b.name, "a client holds {MAX_CHANNELS_PER_CLIENT} relay channels already");
            return None;
        }
        // A side connected here speaks its session's version; one connected elsewhere (another
        // instance on the shared registry) is taken to speak ours: the cloud is upgraded
        // before the fleet (docs/protocol.md §4, versions).
        let legacy = |row: &ClientRow| {
            self.connected
                .get(&row.fingerprint)
                .is_some_and(|c| c.version < BINDS_WITH_COOKIES)
        };
        let party = |row: &'a ClientRow| crate::trs::Party {
            fingerprint: &row.fingerprint,
            name: &row.name,
            legacy: legacy(row),
        };
        let channel = match trs.channel(party(a), party(b), reason).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(a = %a.name, b = %b.name, error = %e, "no relay channel");
                return None;
            }
        };
        let (Some(ia), Some(ib)) = (
            self.relay_side(trs, &channel, a),
            self.relay_side(trs, &channel, b),
        ) else {
            tracing::warn!(a = %a.name, b = %b.name, "the relay has no address in a side's IP version (set relay.addresses)");
            return None;
        };
        bump(&self.stats.relayed_pairs);
        tracing::info!(a = %a.name, b = %b.name, reason = %channel.reason, a_relay = %ia.address, b_relay = %ib.address, "pair relayed");
        Some((ia, ib))
    }

    /// What the side `row` is told of `channel`: the relay's address in its IP version, its
    /// token, the relay's stream listener (to a client that speaks of it).
    pub(super) fn relay_side(
        &self,
        trs: &Trs,
        channel: &Channel,
        row: &ClientRow,
    ) -> Option<RelayInfo> {
        let token = channel.token_for(&row.fingerprint)?;
        // A side connected here speaks its session's version; one connected elsewhere, ours
        // (as in `relays`).
        let (local, version) = self
            .connected
            .get(&row.fingerprint)
            .map(|c| (c.local, c.version))
            .unzip();
        let mut versions: Vec<bool> = row.reach().iter().map(SocketAddr::is_ipv6).collect();
        versions.extend(local.map(|l| l.is_ipv6()));
        if versions.is_empty() {
            // Nothing known of the side's addresses (it never probed): whatever the relay has.
            versions = vec![false, true];
        }
        let address = versions
            .into_iter()
            .find_map(|v6| trs.address(v6, local, channel.port))?;
        // A client before version 13 would refuse the field (and could not use it).
        let stream = version
            .is_some_and(|v| v >= cyphonic_control::STREAM_VERSION)
            .then(|| trs.stream_info(address.is_ipv6(), local))
            .flatten();
        Some(RelayInfo {
            address,
            token,
            reason: channel.reason.for_version(version.unwrap_or(VERSION)),
            stream,
        })
    }

    /// Pairs the client `fp` with `peer` at its request: through the relay (`relay`: its
    /// handshakes found no direct path), or as the route choice says (an admission: `peer` is
    /// handshaking with a client that does not know it). Both need policy to let one of the two
    /// reach the other. Whoever gets a relay channel is told about it.
    pub(super) async fn pair(
        &self,
        fp: &str,
        asker: &CertBody,
        peer: &str,
        relay: bool,
    ) -> CloudMsg {
        if relay {
            bump(&self.stats.relay_requests);
        }
        let refuse = |reason: &str| {
            bump(&self.stats.relays_refused);
            tracing::info!(asker = %asker.name, %reason, relay, "pairing refused");
            CloudMsg::NotPaired {
                peer: peer.to_owned(),
                reason: reason.to_owned(),
            }
        };
        let (me, target) = match (self.store.client(fp).await, self.store.client(peer).await) {
            (Ok(Some(me)), Ok(Some(target))) => (me, target),
            (Ok(_), Ok(None)) => return refuse("unknown peer"),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "store");
                return refuse("the registry is unavailable");
            }
            (Ok(None), _) => return refuse("not registered"),
        };
        if target.fingerprint == me.fingerprint {
            return refuse("that is yourself");
        }
        let Ok(cert) = Certificate::from_pem(&target.certificate) else {
            return refuse("unknown peer");
        };
        if self.trust().verify(&cert, unix_now()).is_err() {
            return refuse("unknown peer");
        }
        // The tunnel exists because one of the two may reach the other.
        let between = match self
            .policy_between((fp, asker), (&target.fingerprint, cert.body()))
            .await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "store");
                return refuse("the registry is unavailable");
            }
        };
        let blocks = (&asker.vip_blocks, &cert.body().vip_blocks);
        if !between.pairs(blocks.0, blocks.1) {
            bump(&self.stats.denied);
            return refuse("denied by policy");
        }
        let allowed = between.allowed(blocks.0, blocks.1);
        let reason = if relay {
            Some(route::why_relay_was_asked(&me, &target))
        } else {
            route::choose(&me, &target)
        };
        let relays = match (reason, &self.trs) {
            (Some(reason), Some(trs)) => match self.relays(trs, &me, &target, reason).await {
                Some(r) => Some(r),
                None if relay => return refuse("the relay cannot serve this pair"),
                None => None,
            },
            (Some(_), None) if relay => return refuse("this cloud runs no relay"),
            _ => None,
        };
        let mine = match relays {
            Some((mine, theirs)) => {
                self.signal(
                    &target.fingerprint,
                    CloudMsg::Expect {
                        peer: PeerInfo {
                            certificate: me.certificate.clone(),
                            endpoints: me.reach(),
                            relay: Some(theirs),
                            allowed: allowed.map(Allowed::mirror),
                            tunnel: me.tunnel,
                        },
                    },
                )
                .await;
                Some(mine)
            }
            None => None,
        };
        if !relay {
            tracing::info!(asker = %asker.name, peer = %target.name, "admitted");
        }
        CloudMsg::Expect {
            peer: PeerInfo {
                certificate: target.certificate.clone(),
                endpoints: target.reach(),
                relay: mine,
                allowed,
                tunnel: target.tunnel,
            },
        }
    }

    /// Pushes `msg` to the client `to`: directly when it is connected here, through the
    /// shared store's notifications when it may be connected to another instance.
    pub(super) async fn signal(&self, to: &str, msg: CloudMsg) {
        if self.push(to, msg.clone()) || !self.store.is_shared() {
            return;
        }
        let signal = Signal {
            to: to.to_owned(),
            msg,
        };
        if let Ok(payload) = serde_json::to_string(&signal)
            && let Err(e) = self.store.notify(&payload).await
        {
            tracing::warn!(error = %e, "signal to the other instances not sent");
        }
    }
}

/// An HA pair's report as the registry keeps it, received at `at` (unix seconds), or why it
/// is malformed: 1 or 2 boxes of distinct MACs, priorities 1-254; each box's health sorted
/// once, the reason printable and short. (A MAC that is not one does not parse.)
fn pair_report(
    (term, reason): (u64, &str),
    mut boxes: Vec<cyphonic_control::PairBox>,
    at: u64,
) -> Result<crate::store::PairReport, String> {
    if boxes.is_empty() || boxes.len() > 2 {
        return Err(format!("{} boxes in an HA pair", boxes.len()));
    }
    for b in &mut boxes {
        if !(1..=254).contains(&b.priority) {
            return Err(format!("priority {} outside 1-254", b.priority));
        }
        b.health.sort_unstable();
        b.health.dedup();
    }
    if boxes.len() == 2 && boxes[0].mac == boxes[1].mac {
        return Err(format!("both boxes are {}", boxes[0].mac));
    }
    Ok(crate::store::PairReport {
        term,
        reason: printable(reason, PAIR_REASON_MAX),
        boxes,
        at,
    })
}

/// Flows one `flows` message carries at most.
const FLOWS_MAX: usize = 1000;
/// Refused summaries one `flows` message carries at most.
const REFUSED_MAX: usize = 1024;

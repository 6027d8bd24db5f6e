//! A client's control session: accepting it, its handshake, and the loop that serves it.

use super::*;

impl Nms {
    /// Accepts control sessions on `listener` until the task is dropped; its sessions end
    /// with it. A connection beyond the unproven caps is closed at once.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let mut sessions = tokio::task::JoinSet::new();
        loop {
            match listener.accept().await {
                Ok((stream, from)) => {
                    while sessions.try_join_next().is_some() {}
                    let Some(ticket) = self.unproven.enter(from.ip()) else {
                        bump(&self.stats.connections_refused);
                        tracing::debug!(%from, "too many unproven control connections: closed");
                        continue;
                    };
                    let me = self.clone();
                    sessions.spawn(async move { me.session(stream, from, ticket).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a control connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Connections that have not proven themselves, now.
    pub fn unproven_now(&self) -> usize {
        self.unproven.held()
    }

    pub(super) async fn session(
        self: Arc<Self>,
        stream: TcpStream,
        from: SocketAddr,
        ticket: Ticket,
    ) {
        let _ = stream.set_nodelay(true);
        // A dual-stack listener shows IPv4 clients as ::ffff:a.b.c.d.
        let from = canonical(from);
        let local = stream
            .local_addr()
            .map_or(IpAddr::from([0, 0, 0, 0]), |l| l.ip().to_canonical());
        let (rd, wr) = stream.into_split();
        let Some(token) = random16() else {
            return;
        };
        // Until it proves itself, the connection holds an unproven place, which a source
        // holding fewer may take (guard::Unproven): then it closes.
        let opened = tokio::select! {
            o = self.open(rd, wr, from, token) => o,
            () = ticket.evicted() => {
                bump(&self.stats.unproven_evicted);
                tracing::debug!(%from, "an unproven control connection gave its place to another source's: closed");
                None
            }
        };
        let Some(open) = opened else {
            self.tokens.remove(&token);
            return;
        };
        // Proven: from here on it is the client's session and may replace an older one.
        drop(ticket);
        self.run(open, from, local, token).await;
        self.tokens.remove(&token);
    }

    /// The handshake, up to the client's proof: its first transport message, which only the
    /// holder of the handshake's ephemeral key can make. A replayed first message gets no
    /// further than the freshness check; a fresh one that never proves itself replaces
    /// nothing and ends here.
    pub(super) async fn open(
        &self,
        mut rd: OwnedReadHalf,
        mut wr: OwnedWriteHalf,
        from: SocketAddr,
        token: [u8; PROBE_TOKEN_LEN],
    ) -> Option<Open> {
        let opened = tokio::time::timeout(HANDSHAKE_TIME, async {
            let first = match read_frame(&mut rd, MAX_HELLO_FRAME).await {
                Ok(f) => f,
                Err(e) => {
                    tracing::debug!(%from, error = %e, "no first control message");
                    return None;
                }
            };
            match ServerHandshake::accept(&self.key, &first) {
                Ok(hs) => Some(hs),
                Err(e) => {
                    tracing::debug!(%from, error = %e, "not a control handshake for this cloud");
                    None
                }
            }
        })
        .await;
        let Ok(Some(hs)) = opened else {
            bump(&self.stats.refused);
            return None;
        };
        let (key, timestamp) = (hs.remote_static(), hs.hello().timestamp);
        // A timestamp not greater than the last admitted one is a replay, or a client whose
        // clock went back across a restart (a Pi before NTP). Either may go on as far as its
        // proof (the first transport message, which only the holder of the handshake's
        // ephemeral key can make): a replay never gets there and replaces nothing, a client
        // does and is admitted (issue 49, finding 5). An enrollment is redeemed before any
        // proof: a stale one is closed here.
        let stale = self
            .freshness
            .is_replay(&key, timestamp, std::time::Instant::now());
        if stale && hs.hello().enroll.is_some() {
            bump(&self.stats.replays);
            tracing::debug!(%from, client = %key, "an enrollment handshake seen before: closed");
            return None;
        }
        if hs.hello().enroll.is_some() {
            let welcome = match self.redeem(&hs, from).await {
                Ok(w) => {
                    bump(&self.stats.enrolled);
                    w
                }
                Err(reason) => {
                    bump(&self.stats.enroll_refused);
                    tracing::info!(%from, %reason, "enrollment refused");
                    Welcome::Refused { reason }
                }
            };
            if let Ok((_, frame)) = hs.answer(&welcome) {
                let _ = wr.write_all(&frame).await;
            }
            return None;
        }
        let (cert, pem) = match admit(&self.trust(), &hs, unix_now()) {
            Ok(ok) => ok,
            Err(reason) => {
                bump(&self.stats.refused);
                tracing::info!(%from, %reason, "control session refused");
                if let Ok((_, frame)) = hs.answer(&Welcome::Refused { reason }) {
                    let _ = wr.write_all(&frame).await;
                }
                return None;
            }
        };
        let live = self
            .freshness
            .admit(key, timestamp, std::time::Instant::now());
        let probe_key = random16()?;
        let version = hs.hello().version;
        let agent = agent(&hs.hello().agent);
        let issuers = match &self.issuer {
            Some(i) if version >= 3 && !i.certificate().is_root() => {
                vec![i.certificate().to_pem()]
            }
            _ => Vec::new(),
        };
        let (mut ch, frame) = hs
            .answer(&Welcome::Accepted {
                version,
                probe_token: token,
                probe_key,
                probe_ports: self.probe_ports.clone(),
                observed: from,
                issuers,
            })
            .ok()?;
        // Known before the client hears the welcome: its first probe may arrive at once.
        let (seen_tx, seen) = watch::channel(Seen::default());
        self.tokens.insert(
            token,
            ProbeSession {
                key: probe_key,
                counters: [0; 2],
                legacy: version < BINDS_WITH_COOKIES,
                cookies: [0; 2],
                window: 0,
                challenged: 0,
                seen: seen_tx,
            },
        );
        wr.write_all(&frame).await.ok()?;
        let body = cert.body().clone();
        let Ok(Ok(first)) = tokio::time::timeout(
            HANDSHAKE_TIME,
            read_frame(&mut rd, cyphonic_control::channel::MAX_FRAME),
        )
        .await
        else {
            if stale {
                bump(&self.stats.replays);
                tracing::debug!(%from, client = %key, "a control handshake seen before never proved itself: a replay, closed");
            } else {
                bump(&self.stats.unproven);
                tracing::info!(name = %body.name, %from, "a welcomed control session sent nothing in time: closed, replacing nothing");
            }
            return None;
        };
        let first = match ch.open::<ClientMsg>(&first) {
            Ok(m) => m,
            Err(e) => {
                bump(&self.stats.malformed);
                tracing::info!(name = %body.name, %from, error = %e, "a welcomed control session's first message does not open: closed, replacing nothing");
                return None;
            }
        };
        if stale {
            bump(&self.stats.clock_went_back);
            tracing::info!(name = %body.name, %from, "a client whose clock went back (its handshake's time is not after its last one's) proved itself: admitted");
        }
        let fp = cert.fingerprint().to_string();
        let issuer = hex::encode(body.issuer);
        // Identity (issue 49, finding 6), once the session proved itself (these read the
        // registry): the newest certificate of a name wins, and no two names hold one
        // address. The client hears why before the session closes.
        let refusal = match self.supersede(&fp, &body, &issuer).await {
            Ok(Some(by)) => {
                bump(&self.stats.superseded);
                tracing::warn!(name = %body.name, %from, fingerprint = %fp, newer = %by, "a certificate superseded by a newer one of its name for another key (a re-keyed or replaced member): closed");
                Some(format!(
                    "this certificate is superseded by a newer one of {} for another key ({by})",
                    body.name
                ))
            }
            Ok(None) => match self
                .overlapping_member(&body.name, &body.vip_blocks, unix_now())
                .await
            {
                Ok(Some(member)) => {
                    bump(&self.stats.overlapping);
                    tracing::error!(name = %body.name, %from, fingerprint = %fp, %member, "a certificate whose blocks overlap another member's (a CA issued overlapping certificates; revoke one): closed");
                    Some(format!(
                        "this certificate's blocks overlap those of the member {member}"
                    ))
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::error!(error = %e, "store");
                    return None;
                }
            },
            Err(e) => {
                tracing::error!(error = %e, "store");
                return None;
            }
        };
        if let Some(reason) = refusal {
            let _ = send(&mut ch, &mut wr, version, &CloudMsg::Error { reason }).await;
            return None;
        }
        let session = match self
            .store
            .client_online(&fp, (&body.name, &issuer), (&pem, &body.vip_blocks), &agent)
            .await
        {
            Ok(session) => session,
            Err(e) => {
                tracing::error!(error = %e, "store");
                return None;
            }
        };
        // The certificate is in use: the token it was enrolled with is spent for good.
        let key_hex = hex::encode(key.0);
        if let Err(e) = self
            .store
            .confirm_token(&fp, &body.name, &key_hex, unix_now())
            .await
        {
            tracing::error!(error = %e, "store");
            return None;
        }
        Some(Open {
            ch,
            rd,
            wr,
            fp,
            body,
            first,
            seen,
            _live: live,
            version,
            session,
        })
    }

    /// A proven session, until it ends.
    pub(super) async fn run(&self, open: Open, from: SocketAddr, local: IpAddr, token: [u8; 16]) {
        let Open {
            mut ch,
            mut rd,
            mut wr,
            fp,
            body,
            first,
            mut seen,
            _live,
            version,
            session,
        } = open;
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let (tx, mut pushes) = mpsc::channel(PUSH_QUEUE);
        // Replaces the identity's older session, if any: its push queue closes and it ends.
        self.connected.insert(
            fp.clone(),
            Connected {
                serial,
                tx,
                local,
                name: body.name.clone(),
                from,
                since: std::time::Instant::now(),
                version,
            },
        );
        bump(&self.stats.sessions);
        tracing::info!(name = %body.name, %from, "control session open");
        // What was revoked online, so that a client that was away learns it.
        if version >= 3 {
            for msg in revoked_messages(&self.online_revocations()) {
                if let Err(why) = send(&mut ch, &mut wr, version, &msg).await {
                    tracing::info!(name = %body.name, reason = why, "control session closed");
                    self.connected.remove_if(&fp, |_, c| c.serial == serial);
                    return;
                }
            }
        }

        // Version 4 enforces the per-device policy: its rules now, and whenever they change.
        let mut policy_rx = self.compiled.subscribe();
        let mut policy_sent: Option<Option<u64>> = None;
        if version >= 4 {
            let (v, msgs) = self.policy_for(&body, version);
            for msg in &msgs {
                if let Err(why) = send(&mut ch, &mut wr, version, msg).await {
                    tracing::info!(name = %body.name, reason = why, "control session closed");
                    self.connected.remove_if(&fp, |_, c| c.serial == serial);
                    return;
                }
            }
            policy_sent = Some(v);
        }
        // Flow logs (version 12): on or off, said in every session (a member that logged
        // under an earlier configuration stops).
        if version >= cyphonic_control::FLOWS_VERSION {
            let on = CloudMsg::FlowLog {
                on: self.logs_flows(&body),
            };
            if let Err(why) = send(&mut ch, &mut wr, version, &on).await {
                tracing::info!(name = %body.name, reason = why, "control session closed");
                self.connected.remove_if(&fp, |_, c| c.serial == serial);
                return;
            }
        }

        // The reader runs apart, so that waiting for a frame is never cut half-way.
        let (frames_tx, mut frames) = mpsc::channel::<Vec<u8>>(16);
        let reader = tokio::spawn(async move {
            while let Ok(f) = read_frame(&mut rd, cyphonic_control::channel::MAX_FRAME).await {
                if frames_tx.send(f).await.is_err() {
                    break;
                }
            }
        });
        let requests = Requests::default();
        let mut parts = cyphonic_control::report::Assembler::default();
        let mut written = Seen::default();
        let mut next = Some(first);
        let why = 'session: loop {
            let msg = match next.take() {
                Some(m) => m,
                None => {
                    let out = tokio::select! {
                        f = tokio::time::timeout(IDLE, frames.recv()) => match f {
                            Err(_) => break 'session "idle",
                            Ok(None) => break 'session "closed",
                            Ok(Some(f)) => match ch.open::<ClientMsg>(&f) {
                                Ok(msg) => msg,
                                Err(e) => {
                                    bump(&self.stats.malformed);
                                    tracing::info!(name = %body.name, error = %e, "malformed control message");
                                    break 'session "malformed message";
                                }
                            },
                        },
                        p = pushes.recv() => match p {
                            Some(p) => {
                                if let Err(why) = send(&mut ch, &mut wr, version, &p).await {
                                    break 'session why;
                                }
                                continue 'session;
                            }
                            None => break 'session "replaced by a newer session, or cut off",
                        },
                        changed = policy_rx.changed(), if version >= 4 => {
                            if changed.is_err() {
                                break 'session "policy state lost";
                            }
                            policy_rx.borrow_and_update();
                            let (v, msgs) = self.policy_for(&body, version);
                            if policy_sent != Some(v) {
                                for msg in &msgs {
                                    if let Err(why) = send(&mut ch, &mut wr, version, msg).await {
                                        break 'session why;
                                    }
                                }
                                tracing::debug!(name = %body.name, version = ?v, parts = msgs.len(), "policy sent");
                                policy_sent = Some(v);
                            }
                            continue 'session;
                        }
                        changed = seen.changed() => {
                            if changed.is_err() {
                                break 'session "probe state lost";
                            }
                            let now = *seen.borrow_and_update();
                            if let Some(o) = self.observed(&fp, now, &mut written).await
                                && let Err(why) = send(&mut ch, &mut wr, version, &o).await
                            {
                                break 'session why;
                            }
                            continue 'session;
                        }
                    };
                    out
                }
            };
            // Each class of request at its own rate: over it, this session waits (its
            // pushes still go out) and the client's own writes back up.
            let mut counted = false;
            while let Some(wait) = requests.wait(&msg) {
                if !counted {
                    bump(&self.stats.throttled);
                    counted = true;
                }
                let sleep = tokio::time::sleep(wait);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        () = &mut sleep => break,
                        p = pushes.recv() => match p {
                            Some(p) => {
                                if let Err(why) = send(&mut ch, &mut wr, version, &p).await {
                                    break 'session why;
                                }
                            }
                            None => break 'session "replaced by a newer session, or cut off",
                        },
                    }
                }
            }
            if let Some(out) = self.handle((&fp, version), &body, msg, &mut parts).await
                && let Err(why) = send(&mut ch, &mut wr, version, &out).await
            {
                break 'session why;
            }
        };
        reader.abort();
        self.tokens.remove(&token);
        let still_ours = self
            .connected
            .remove_if(&fp, |_, c| c.serial == serial)
            .is_some();
        if still_ours && let Err(e) = self.store.session_ended(&fp, &session).await {
            tracing::error!(error = %e, "store");
        }
        tracing::info!(name = %body.name, %from, reason = why, "control session closed");
    }

    /// Writes to the store the probe sources that changed since `written`; the answer for the
    /// client when the first port's did.
    pub(super) async fn observed(
        &self,
        fp: &str,
        now: Seen,
        written: &mut Seen,
    ) -> Option<CloudMsg> {
        let mut out = None;
        for (alt, (now, written)) in now.iter().zip(written.iter_mut()).enumerate() {
            let Some(addr) = *now else { continue };
            if *written == Some(addr) {
                continue;
            }
            if let Err(e) = self.store.observed(fp, addr, alt == 1).await {
                tracing::error!(error = %e, "store");
                continue;
            }
            bump(&self.stats.endpoint_writes);
            *written = Some(addr);
            if alt == 0 {
                out = Some(CloudMsg::Observed { endpoint: addr });
            }
        }
        out
    }

    /// The clients with a session on this instance: name, where from, for how long (s).
    pub fn sessions(&self) -> Vec<(String, SocketAddr, u64)> {
        let mut out: Vec<_> = self
            .connected
            .iter()
            .map(|c| (c.name.clone(), c.from, c.since.elapsed().as_secs()))
            .collect();
        out.sort();
        out
    }

    /// Pushes `msg` to the client `fp` if it is connected to this instance.
    pub(super) fn push(&self, fp: &str, msg: CloudMsg) -> bool {
        let Some(c) = self.connected.get(fp) else {
            return false;
        };
        if c.tx.try_send(msg).is_err() {
            bump(&self.stats.pushes_dropped);
            tracing::warn!(to = %c.name, "push queue full: a message to a client was dropped");
        }
        true
    }
}

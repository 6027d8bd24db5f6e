//! The UDP endpoint probes that show each client's NAT-mapped tunnel address.

use super::*;

impl Nms {
    /// Reads endpoint probes on `sock` until the task is dropped; `alt` for the second probe
    /// port, whose observations only serve to recognise symmetric NATs. Cheap per probe: a
    /// map lookup and two MACs; the session it names does any store work. An address is
    /// recorded only from a probe that answers a challenge sent there (docs/protocol.md §4,
    /// endpoint probe).
    pub async fn probes(self: Arc<Self>, sock: UdpSocket, alt: bool) {
        let mut buf = vec![0u8; 2048];
        let port = usize::from(alt);
        let probe_port = sock.local_addr().map_or(0, |a| a.port());
        loop {
            let Ok((n, from)) = sock.recv_from(&mut buf).await else {
                continue;
            };
            let from = canonical(from);
            let verdict = Probe::parse(&buf[..n]).map_or(ProbeVerdict::Refused, |probe| {
                self.probe(&probe, from, port, probe_port, crate::clock::unix_now_ms())
            });
            match verdict {
                ProbeVerdict::Refused => bump(&self.stats.probes_refused),
                ProbeVerdict::Recorded => bump(&self.stats.probes),
                ProbeVerdict::Challenge(frame) => {
                    bump(&self.stats.probes);
                    if sock.send_to(&frame, from).await.is_ok() {
                        bump(&self.stats.probe_challenges);
                    }
                }
            }
        }
    }

    /// What `probe`, from `from` to probe port `probe_port` (the session's `port`th), makes
    /// the reader do at `now_ms`.
    pub(super) fn probe(
        &self,
        probe: &Probe<'_>,
        from: SocketAddr,
        port: usize,
        probe_port: u16,
        now_ms: u64,
    ) -> ProbeVerdict {
        let Some(mut s) = self.tokens.get_mut(&probe.token) else {
            return ProbeVerdict::Refused;
        };
        // A session takes the probes of its own kind only: a version-6 client's are never
        // taken without a cookie.
        if probe.counter <= s.counters[port] || probe.legacy != s.legacy || !probe.verify(&s.key) {
            return ProbeVerdict::Refused;
        }
        let purpose = cyphonic_control::Purpose::Probe {
            port: probe_port,
            token: &probe.token,
        };
        let proved = s.legacy
            || probe.cookie.is_some_and(|c| {
                c.time_ms > s.cookies[port] && self.challenger.valid(purpose, from, &c, now_ms)
            });
        if !proved {
            if now_ms.saturating_sub(s.window) >= 1000 {
                s.window = now_ms;
                s.challenged = 0;
            }
            if s.challenged >= cyphonic_control::relay::CHALLENGES_PER_SEC {
                return ProbeVerdict::Refused;
            }
            s.challenged += 1;
            let cookie = self.challenger.issue(purpose, from, now_ms);
            return ProbeVerdict::Challenge(cyphonic_control::challenge_frame(&cookie));
        }
        // Only a probe that proved its source spends its counter: a copy raced from
        // elsewhere earns a challenge there and leaves the original its turn.
        s.counters[port] = probe.counter;
        if let Some(c) = probe.cookie {
            s.cookies[port] = c.time_ms;
        }
        s.seen.send_if_modified(|seen| {
            let changed = seen[port] != Some(from);
            seen[port] = Some(from);
            changed
        });
        ProbeVerdict::Recorded
    }
}

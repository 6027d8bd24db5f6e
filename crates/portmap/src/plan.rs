//! When to ask the router, when to renew, what to register: sans-IO, time passed in
//! (docs/protocol.md §4, *Port mapping*).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use cyphonic_control::{MapProtocol, Mapping};

/// The lifetime asked for, seconds.
pub const LIFETIME: u32 = 7200;
/// A router that did not answer is asked again after this.
pub const NO_ANSWER_AGAIN: Duration = Duration::from_secs(600);
/// A router that refused is asked again after this.
pub const REFUSED_AGAIN: Duration = Duration::from_secs(1800);
/// A renewal that got no answer is tried again after this, while the mapping lasts.
pub const RENEW_RETRY: Duration = Duration::from_secs(30);
/// A mapping is never renewed sooner than this after it was granted (a router that grants a
/// lifetime of seconds is not asked in a loop).
pub const MIN_RENEW: Duration = Duration::from_secs(5);

/// Whom to ask, from where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// The router: the next hop of our route to the cloud.
    pub gateway: IpAddr,
    /// Our address towards it (the mapping forwards there).
    pub local: IpAddr,
    /// The address the cloud sees our probes come from: a mapping at another address is not
    /// registered.
    pub seen_at: IpAddr,
}

/// What a router answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A mapping: `external` reaches the tunnel port for `lifetime`.
    Mapped {
        /// The protocol that answered.
        protocol: MapProtocol,
        /// The external address and port.
        external: SocketAddr,
        /// How long the router keeps it.
        lifetime: Duration,
    },
    /// A refusal, in the router's words.
    Refused {
        /// The protocol that answered.
        protocol: MapProtocol,
        /// Why.
        reason: String,
    },
    /// No router answered (none, or none that speaks these protocols).
    NoAnswer,
}

/// What is due now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Ask for a mapping.
    Ask,
    /// Renew the mapping held.
    Renew,
    /// Nothing before [`Plan::next`].
    Wait,
}

/// A mapping the router granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    protocol: MapProtocol,
    external: SocketAddr,
    expires: Instant,
}

/// The schedule of one tunnel port's mapping, and what to register of it.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Where the cloud sees our probes come from: a mapping elsewhere is not registered.
    seen_at: IpAddr,
    held: Option<Held>,
    refused: Option<(MapProtocol, String)>,
    next: Instant,
}

impl Plan {
    /// A plan that asks at once, for a tunnel end the cloud sees at `seen_at`.
    pub const fn new(seen_at: IpAddr, now: Instant) -> Self {
        Self {
            seen_at,
            held: None,
            refused: None,
            next: now,
        }
    }

    /// When something is due next.
    pub const fn next(&self) -> Instant {
        self.next
    }

    /// What is due at `now`.
    pub fn step(&self, now: Instant) -> Step {
        if now < self.next {
            Step::Wait
        } else if self.held.is_some() {
            Step::Renew
        } else {
            Step::Ask
        }
    }

    /// What to register: the mapping held, where the cloud sees us; the last refusal; or
    /// nothing.
    pub fn registered(&self) -> Option<Mapping> {
        if let Some(h) = self.held {
            return (h.external.ip() == self.seen_at).then_some(Mapping::Mapped {
                protocol: h.protocol,
                endpoint: h.external,
            });
        }
        self.refused
            .as_ref()
            .map(|(protocol, reason)| Mapping::Refused {
                protocol: *protocol,
                reason: reason.clone(),
            })
    }

    /// Whether a mapping is held at an address other than where the cloud sees us (a router
    /// behind another NAT): of no use to peers.
    pub fn elsewhere(&self) -> Option<SocketAddr> {
        self.held
            .map(|h| h.external)
            .filter(|e| e.ip() != self.seen_at)
    }

    /// The answer to an ask ([`Step::Ask`]) or a renewal ([`Step::Renew`]) came at `now`.
    pub fn answered(&mut self, outcome: Outcome, now: Instant) {
        match outcome {
            Outcome::Mapped {
                protocol,
                external,
                lifetime,
            } => {
                self.held = Some(Held {
                    protocol,
                    external,
                    expires: now + lifetime,
                });
                self.refused = None;
                self.next = now + (lifetime / 2).max(MIN_RENEW);
            }
            Outcome::Refused { protocol, reason } => {
                self.held = None;
                self.refused = Some((protocol, reason));
                self.next = now + REFUSED_AGAIN;
            }
            Outcome::NoAnswer => match self.held {
                // A renewal unanswered: the mapping stands until it expires.
                Some(h) if now + RENEW_RETRY < h.expires => self.next = now + RENEW_RETRY,
                Some(_) => {
                    self.held = None;
                    self.next = now;
                }
                None => {
                    self.refused = None;
                    self.next = now + NO_ANSWER_AGAIN;
                }
            },
        }
    }

    /// The mapping held elsewhere ([`Plan::elsewhere`]) was given back at `now`: nothing
    /// held, the router asked again as one that did not answer usefully.
    pub fn given_back(&mut self, now: Instant) {
        self.held = None;
        self.next = now + NO_ANSWER_AGAIN;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn mapped(external: &str, lifetime: u64) -> Outcome {
        Outcome::Mapped {
            protocol: MapProtocol::Pcp,
            external: at(external),
            lifetime: Duration::from_secs(lifetime),
        }
    }

    /// Asked at once; a mapping is registered and renewed at half its lifetime; a renewal
    /// unanswered is tried again while the mapping lasts, and once it has expired the router
    /// is asked anew with nothing registered.
    #[test]
    fn a_mapping_is_renewed_at_half_its_life_and_dropped_when_it_expires() {
        let t0 = Instant::now();
        let mut p = Plan::new("203.0.113.2".parse().unwrap(), t0);
        assert_eq!((p.step(t0), p.registered()), (Step::Ask, None));
        p.answered(mapped("203.0.113.2:51820", 120), t0);
        let held = Some(Mapping::Mapped {
            protocol: MapProtocol::Pcp,
            endpoint: at("203.0.113.2:51820"),
        });
        assert_eq!(p.registered(), held);
        assert_eq!(p.next(), t0 + Duration::from_secs(60));
        assert_eq!(p.step(t0 + Duration::from_secs(59)), Step::Wait);
        let t1 = t0 + Duration::from_secs(60);
        assert_eq!(p.step(t1), Step::Renew);
        p.answered(Outcome::NoAnswer, t1);
        assert_eq!((p.next(), p.registered()), (t1 + RENEW_RETRY, held.clone()));
        let t2 = t0 + Duration::from_secs(100);
        p.answered(Outcome::NoAnswer, t2);
        assert_eq!((p.step(t2), p.registered()), (Step::Ask, None));
        // A lifetime of a second is not renewed in a loop.
        p.answered(mapped("203.0.113.2:51820", 1), t2);
        assert_eq!(p.next(), t2 + MIN_RENEW);
    }

    /// A refusal is registered until a mapping comes; no answer registers nothing; each is
    /// asked again after its own pause.
    #[test]
    fn a_refusal_is_registered_and_asked_again_later_no_answer_sooner() {
        let t0 = Instant::now();
        let mut p = Plan::new("203.0.113.2".parse().unwrap(), t0);
        p.answered(
            Outcome::Refused {
                protocol: MapProtocol::Upnp,
                reason: "not authorized".into(),
            },
            t0,
        );
        assert_eq!(
            p.registered(),
            Some(Mapping::Refused {
                protocol: MapProtocol::Upnp,
                reason: "not authorized".into()
            })
        );
        assert_eq!(p.next(), t0 + REFUSED_AGAIN);
        let t1 = p.next();
        assert_eq!(p.step(t1), Step::Ask, "nothing held: asked anew");
        p.answered(Outcome::NoAnswer, t1);
        assert_eq!((p.next(), p.registered()), (t1 + NO_ANSWER_AGAIN, None));
        p.answered(mapped("203.0.113.2:40000", 7200), t1);
        assert!(matches!(p.registered(), Some(Mapping::Mapped { .. })));
    }

    /// A mapping the router holds at an address other than where the cloud sees us is not
    /// registered, and is told apart so that it can be given back.
    #[test]
    fn a_mapping_elsewhere_is_not_registered() {
        let t0 = Instant::now();
        let mut p = Plan::new("203.0.113.2".parse().unwrap(), t0);
        p.answered(mapped("198.51.100.7:51820", 7200), t0);
        assert_eq!(p.registered(), None);
        assert_eq!(p.elsewhere(), Some(at("198.51.100.7:51820")));
        p.given_back(t0);
        assert_eq!(p.elsewhere(), None);
        assert_eq!((p.step(t0), p.next()), (Step::Wait, t0 + NO_ANSWER_AGAIN));
        assert_eq!(p.step(p.next()), Step::Ask, "nothing held: asked anew");
    }
}

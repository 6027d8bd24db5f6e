//! What the daemons tell their operators, the same way in all three:
//!
//! - [`metrics`]: a Prometheus (OpenMetrics) endpoint on a thread of its own, serving what a
//!   `prometheus-client` registry encodes at each scrape; [`counters!`] declares a set of
//!   atomic counters that status documents and scrapes both read, with their help texts;
//!   [`Family`] writes labelled values from inside a collector.
//! - [`logging`]: tracing's subscriber, as text for a terminal, as JSON on request, and
//!   under systemd without timestamps or colours (journald adds its own) and with each
//!   line's syslog priority; an env-filter.
//! - [`files`]: keys, certificates and cached state written whole, with modes that let the
//!   service user (and nobody else) read a key.
//! - [`manual`]: shell completions and man pages from a program's clap tree.
//! - [`service`]: what systemd hears (`Type=notify`: ready, reloading, stopping; the
//!   watchdog's pings) and the exit status of a refused configuration (78).
//! - [`status`]: the local status socket (mode 0600) each daemon's `status` command reads a
//!   JSON document from (any serde type; the daemons define theirs).
//! - [`Throttle`]: at most one log line per interval for a repeated event (a flood of bad
//!   packets must not become a flood of log lines), with how many were held back.
//!
//! What it does not do: decide what to measure (each crate exports its own counters) or keep
//! history (Prometheus does).

#![forbid(unsafe_code)]

// `counters!` names this crate by its name; its tests use the macro inside it.
#[cfg(test)]
extern crate self as cyphonic_telemetry;

pub mod files;
pub mod logging;
pub mod manual;
pub mod metrics;
pub mod service;
pub mod status;

use std::time::{Duration, Instant};

pub use logging::Untrusted;
pub use metrics::Family;

/// What [`counters!`] names in the calling crate's code.
#[doc(hidden)]
pub use serde as __serde;

/// What a set of counters declared with [`counters!`] offers beyond its fields: every value
/// with its name, for status text and metrics.
pub trait CounterSet: std::fmt::Debug {
    /// Every counter with its name, in declaration order.
    fn snapshot(&self) -> Vec<(&'static str, u64)>;

    /// Every counter's name with what it counts, in the same order.
    fn helps(&self) -> Vec<(&'static str, &'static str)>;
}

/// A [`CounterSet`] reached through what holds it: `get` of a shared `owner` (a daemon's
/// LAN side, whose counters the engine's metrics write).
pub struct CountersOf<O> {
    owner: std::sync::Arc<O>,
    get: fn(&O) -> &dyn CounterSet,
}

impl<O> CountersOf<O> {
    /// The set `get` finds in `owner`.
    pub fn new(owner: std::sync::Arc<O>, get: fn(&O) -> &dyn CounterSet) -> Self {
        Self { owner, get }
    }
}

impl<O> std::fmt::Debug for CountersOf<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (self.get)(&self.owner).fmt(f)
    }
}

impl<O> CounterSet for CountersOf<O> {
    fn snapshot(&self) -> Vec<(&'static str, u64)> {
        (self.get)(&self.owner).snapshot()
    }

    fn helps(&self) -> Vec<(&'static str, &'static str)> {
        (self.get)(&self.owner).helps()
    }
}

/// Declares a counters struct: one `AtomicU64` per name, `snapshot()` listing the values with
/// their names in declaration order ([`CounterSet`]), `help()` listing each name with its doc
/// comment (the help text of its metric), `copied()` (the values now, in a struct of its
/// own), and serde (one field per counter; missing ones read as 0), so that the same type
/// goes into a status document and comes back out of it.
#[macro_export]
macro_rules! counters {
    ($(#[$sdoc:meta])* $vis:vis struct $ty:ident { $(#[doc = $doc:literal] $name:ident,)* }) => {
        $(#[$sdoc])*
        #[derive(Debug, Default, $crate::__serde::Serialize, $crate::__serde::Deserialize)]
        #[serde(crate = "cyphonic_telemetry::__serde", default)]
        $vis struct $ty {
            $(#[doc = $doc] pub $name: ::std::sync::atomic::AtomicU64,)*
        }

        impl $crate::CounterSet for $ty {
            fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$((
                    stringify!($name),
                    self.$name.load(::std::sync::atomic::Ordering::Relaxed),
                ),)*]
            }

            fn helps(&self) -> Vec<(&'static str, &'static str)> {
                Self::help()
            }
        }

        impl $ty {
            /// Every counter with its name, in declaration order.
            pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
                <Self as $crate::CounterSet>::snapshot(self)
            }

            /// Every counter's name with what it counts.
            pub fn help() -> Vec<(&'static str, &'static str)> {
                vec![$((stringify!($name), $doc.trim()),)*]
            }

            /// The values now, in a struct of their own.
            pub fn copied(&self) -> Self {
                Self {
                    $($name: ::std::sync::atomic::AtomicU64::new(
                        self.$name.load(::std::sync::atomic::Ordering::Relaxed),
                    ),)*
                }
            }

            /// Writes the counters under `prefix`, as [`metrics::counter_sets`] does.
            ///
            /// [`metrics::counter_sets`]: $crate::metrics::counter_sets
            ///
            /// # Errors
            /// The encoder's.
            pub fn encode(
                &self,
                prefix: &str,
                encoder: &mut $crate::metrics::DescriptorEncoder<'_>,
            ) -> Result<(), ::std::fmt::Error> {
                $crate::metrics::counter_sets(encoder, prefix, &[self])
            }
        }
    };
}

/// Lets a repeated event be logged at most once per interval; says how many were held back.
#[derive(Debug, Clone)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    held: u64,
}

impl Throttle {
    /// At most once per `every`.
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            held: 0,
        }
    }

    /// Whether to log now; if so, how many occurrences were held back since the last line.
    pub fn due(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < self.every)
        {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}

#[cfg(test)]
mod tests {
    #![allow(unreachable_pub)]

    use super::*;

    counters! {
        /// Test counters.
        pub struct Things {
            /// Apples seen.
            apples,
            /// Pears seen.
            pears,
        }
    }

    #[test]
    fn throttle_holds_back_and_counts() {
        let mut t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.due(t0), Some(0));
        assert_eq!(t.due(t0 + Duration::from_secs(1)), None);
        assert_eq!(t.due(t0 + Duration::from_secs(2)), None);
        assert_eq!(t.due(t0 + Duration::from_secs(11)), Some(2));
    }

    #[test]
    fn counters_snapshot_and_help_line_up() {
        let c = Things::default();
        c.pears.fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(c.snapshot(), [("apples", 0), ("pears", 3)]);
        assert_eq!(
            Things::help(),
            [("apples", "Apples seen."), ("pears", "Pears seen.")]
        );
        let mut r = metrics::Registry::default();
        r.register_collector(Box::new(ThingsCollector(c)));
        let text = metrics::render(&r).unwrap_or_default();
        assert!(text.contains("# HELP cyphonic_pears Pears seen."), "{text}");
        assert!(text.contains("cyphonic_pears_total 3"), "{text}");
    }

    /// A copy holds the values of its moment; serde writes one field per counter and reads
    /// missing ones as 0.
    #[test]
    fn counters_copy_and_go_through_serde() {
        let c = Things::default();
        c.apples.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
        let copy = c.copied();
        c.apples.fetch_add(5, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(copy.snapshot(), [("apples", 2), ("pears", 0)]);
        let json = serde_json::to_string(&copy).unwrap_or_default();
        assert_eq!(json, r#"{"apples":2,"pears":0}"#);
        let back: Things = serde_json::from_str(r#"{"pears":4}"#).unwrap_or_default();
        assert_eq!(back.snapshot(), [("apples", 0), ("pears", 4)]);
    }

    #[derive(Debug)]
    struct ThingsCollector(Things);

    impl metrics::Collector for ThingsCollector {
        fn encode(&self, mut e: metrics::DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
            self.0.encode("cyphonic", &mut e)
        }
    }
}

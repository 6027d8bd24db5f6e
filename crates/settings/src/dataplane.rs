//! The `[dataplane]` table: the keys every tunnel end shares (the engine's workers and
//! batching, the AEAD, the tunnel socket, thread placement, buffers), declared once for both
//! binaries by [`dataplane_table!`](crate::dataplane_table), and checked into the engine's
//! own parameter type, [`cyphonic_tunnel::DataPlane`], whose defaults are the defaults of the
//! keys. A binary adds its own keys to its table (the adapter its LAN side's).

use std::time::Duration;

use cyphonic_crypto::Backend;
use cyphonic_tunnel::DataPlane;
use serde::Deserialize;
use toml::Spanned;

use crate::{ConfigError, Source};

/// Declares a binary's `[dataplane]` table as serde reads it: the shared keys (see
/// [`cyphonic_tunnel::DataPlane`]) with their defaults, then the binary's own fields, each
/// with its serde attributes and its default value (`name: Type = value`). The struct refuses
/// unknown keys, its `Default` is an empty table, and `shared(&self, src)` checks the shared
/// keys into a [`cyphonic_tunnel::DataPlane`] (errors located in `src`). The calling crate
/// needs `serde` and `toml`.
///
/// ```
/// cyphonic_settings::dataplane_table! {
///     /// The adapter's `[dataplane]`.
///     struct RawDataplane {
///         #[serde(default = "cyphonic_settings::defaults::yes")]
///         lan_gro: bool = true,
///     }
/// }
///
/// let text = "batch_size = 16\nlan_gro = false\n";
/// let src = cyphonic_settings::Source {
///     path: std::path::Path::new("example.toml"),
///     text,
///     now_secs: 0,
/// };
/// let raw: RawDataplane = toml::from_str(text).unwrap();
/// assert!(!raw.lan_gro);
/// assert_eq!(raw.shared(&src).unwrap().batch_size, 16);
/// assert!(RawDataplane::default().lan_gro);
/// // The shared keys are checked, and unknown keys refused.
/// assert!(toml::from_str::<RawDataplane>("batch_size = 0").unwrap().shared(&src).is_err());
/// assert!(toml::from_str::<RawDataplane>("lan_gso = true").is_err());
/// ```
#[macro_export]
macro_rules! dataplane_table {
    (
        $(#[$meta:meta])*
        struct $name:ident {
            $( $(#[$field_meta:meta])* $field:ident : $ty:ty = $default:expr ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct $name {
            #[serde(default = "cyphonic_settings::defaults::workers")]
            workers: usize,
            #[serde(default = "cyphonic_settings::defaults::batch_size")]
            batch_size: toml::Spanned<usize>,
            #[serde(default = "cyphonic_settings::defaults::batches_in_flight")]
            batches_in_flight: toml::Spanned<usize>,
            #[serde(default = "cyphonic_settings::defaults::in_flight_bytes")]
            in_flight_bytes: toml::Spanned<usize>,
            #[serde(default = "cyphonic_settings::defaults::in_flight_ms")]
            in_flight_ms: toml::Spanned<u32>,
            #[serde(default = "cyphonic_settings::defaults::inline_max")]
            inline_max: toml::Spanned<usize>,
            #[serde(default = "cyphonic_settings::defaults::sparse_rate")]
            sparse_rate: u32,
            #[serde(default = "cyphonic_settings::defaults::aqm_target_us")]
            aqm_target_us: toml::Spanned<u32>,
            #[serde(default = "cyphonic_settings::defaults::aqm_interval_ms")]
            aqm_interval_ms: toml::Spanned<u32>,
            #[serde(default)]
            socket_timestamps: bool,
            #[serde(default = "cyphonic_settings::defaults::ordering")]
            ordering: bool,
            #[serde(default)]
            aead: $crate::AeadName,
            #[serde(default = "cyphonic_settings::defaults::udp_buffer")]
            udp_buffer: usize,
            #[serde(default = "cyphonic_settings::defaults::udp_gso")]
            udp_gso: bool,
            #[serde(default = "cyphonic_settings::defaults::udp_gro")]
            udp_gro: bool,
            #[serde(default = "cyphonic_settings::defaults::cpus")]
            cpus: toml::Spanned<Vec<usize>>,
            #[serde(default = "cyphonic_settings::defaults::realtime_priority")]
            realtime_priority: toml::Spanned<u8>,
            #[serde(default = "cyphonic_settings::defaults::busy_poll_us")]
            busy_poll_us: toml::Spanned<u32>,
            #[serde(default = "cyphonic_settings::defaults::yes")]
            sparse_socket: bool,
            #[serde(default = "cyphonic_settings::defaults::yes")]
            sparse_per_cpu: bool,
            #[serde(default = "cyphonic_settings::defaults::sparse_priority")]
            sparse_priority: toml::Spanned<u8>,
            #[serde(default = "cyphonic_settings::defaults::queue_per_peer")]
            queue_per_peer: usize,
            #[serde(default = "cyphonic_settings::defaults::buffers")]
            buffers: toml::Spanned<usize>,
            #[serde(default = "cyphonic_settings::defaults::rekey_after_secs")]
            danger_rekey_after_secs: toml::Spanned<u64>,
            #[serde(default = "cyphonic_settings::defaults::rekey_after_messages")]
            danger_rekey_after_messages: toml::Spanned<u64>,
            $( $(#[$field_meta])* $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    workers: $crate::defaults::workers(),
                    batch_size: $crate::defaults::batch_size(),
                    batches_in_flight: $crate::defaults::batches_in_flight(),
                    in_flight_bytes: $crate::defaults::in_flight_bytes(),
                    in_flight_ms: $crate::defaults::in_flight_ms(),
                    inline_max: $crate::defaults::inline_max(),
                    sparse_rate: $crate::defaults::sparse_rate(),
                    aqm_target_us: $crate::defaults::aqm_target_us(),
                    aqm_interval_ms: $crate::defaults::aqm_interval_ms(),
                    socket_timestamps: false,
                    ordering: $crate::defaults::ordering(),
                    aead: $crate::AeadName::default(),
                    udp_buffer: $crate::defaults::udp_buffer(),
                    udp_gso: $crate::defaults::udp_gso(),
                    udp_gro: $crate::defaults::udp_gro(),
                    cpus: $crate::defaults::cpus(),
                    realtime_priority: $crate::defaults::realtime_priority(),
                    busy_poll_us: $crate::defaults::busy_poll_us(),
                    sparse_socket: true,
                    sparse_per_cpu: true,
                    sparse_priority: $crate::defaults::sparse_priority(),
                    queue_per_peer: $crate::defaults::queue_per_peer(),
                    buffers: $crate::defaults::buffers(),
                    danger_rekey_after_secs: $crate::defaults::rekey_after_secs(),
                    danger_rekey_after_messages: $crate::defaults::rekey_after_messages(),
                    $( $field: $default, )*
                }
            }
        }

        impl $name {
            /// The shared keys, checked: pipeline sizes and thread placement.
            fn shared(
                &self,
                src: &$crate::Source<'_>,
            ) -> Result<$crate::DataPlane, $crate::ConfigError> {
                $crate::check_pipeline(
                    src,
                    &self.batch_size,
                    &self.batches_in_flight,
                    &self.inline_max,
                    &self.buffers,
                )?;
                $crate::check_in_flight(src, &self.in_flight_bytes, &self.in_flight_ms)?;
                $crate::check_placement(
                    src,
                    &self.cpus,
                    &self.realtime_priority,
                    &self.busy_poll_us,
                )?;
                $crate::check_priority(src, &self.sparse_priority, "dataplane.sparse_priority")?;
                $crate::check_rekey(
                    src,
                    &self.danger_rekey_after_secs,
                    &self.danger_rekey_after_messages,
                )?;
                let aqm = $crate::check_aqm(src, &self.aqm_target_us, &self.aqm_interval_ms)?;
                Ok($crate::DataPlane {
                    workers: self.workers,
                    batch_size: *self.batch_size.get_ref(),
                    batches_in_flight: *self.batches_in_flight.get_ref(),
                    in_flight_bytes: *self.in_flight_bytes.get_ref(),
                    in_flight_time: std::time::Duration::from_millis(u64::from(
                        *self.in_flight_ms.get_ref(),
                    )),
                    inline_max: *self.inline_max.get_ref(),
                    sparse_rate: self.sparse_rate,
                    aqm,
                    socket_timestamps: self.socket_timestamps,
                    ordering: self.ordering,
                    aead: self.aead.0,
                    udp_buffer: self.udp_buffer,
                    udp_gso: self.udp_gso,
                    udp_gro: self.udp_gro,
                    placement: $crate::Placement {
                        cpus: self.cpus.get_ref().clone(),
                        realtime_priority: *self.realtime_priority.get_ref(),
                    },
                    busy_poll: std::time::Duration::from_micros(u64::from(
                        *self.busy_poll_us.get_ref(),
                    )),
                    sparse_socket: self.sparse_socket,
                    sparse_per_cpu: self.sparse_per_cpu,
                    sparse_priority: *self.sparse_priority.get_ref(),
                    queue_per_peer: self.queue_per_peer,
                    buffers: *self.buffers.get_ref(),
                    rekey_after: std::time::Duration::from_secs(
                        *self.danger_rekey_after_secs.get_ref(),
                    ),
                    rekey_after_messages: *self.danger_rekey_after_messages.get_ref(),
                })
            }
        }
    };
}

/// An AEAD backend name (`ring` or `rustcrypto`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AeadName(pub Backend);

impl<'de> Deserialize<'de> for AeadName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map(Self).map_err(serde::de::Error::custom)
    }
}

/// The fewest seconds `danger_rekey_after_secs` may say: a handshake and its confirmation
/// take a round trip or two, keys must outlive them.
pub const REKEY_AFTER_SECS_MIN: u64 = 2;

/// The fewest messages `danger_rekey_after_messages` may say: at line rate a rekey every few
/// milliseconds, which the handshake rate limits still bear.
pub const REKEY_AFTER_MESSAGES_MIN: u64 = 10_000;

/// Checks the `danger_` rekey keys: only ever shorter than the defaults (they exist so tests
/// can see many rekeys; a longer interval would weaken the keys), never below a floor.
///
/// # Errors
/// A value outside its range, located in `src`.
pub fn check_rekey(
    src: &Source<'_>,
    secs: &Spanned<u64>,
    messages: &Spanned<u64>,
) -> Result<(), ConfigError> {
    let d = DataPlane::default();
    let max_secs = d.rekey_after.as_secs();
    if !(REKEY_AFTER_SECS_MIN..=max_secs).contains(secs.get_ref()) {
        return src.err(
            &secs.span(),
            "dataplane.danger_rekey_after_secs",
            format!(
                "{} is outside {REKEY_AFTER_SECS_MIN} ..= {max_secs} (shorter than the default only)",
                secs.get_ref()
            ),
        );
    }
    let max_messages = d.rekey_after_messages;
    if !(REKEY_AFTER_MESSAGES_MIN..=max_messages).contains(messages.get_ref()) {
        return src.err(
            &messages.span(),
            "dataplane.danger_rekey_after_messages",
            format!(
                "{} is outside {REKEY_AFTER_MESSAGES_MIN} ..= {max_messages} (fewer than the default only)",
                messages.get_ref()
            ),
        );
    }
    Ok(())
}

/// Checks the pipeline sizes of `[dataplane]`: batches of 1 to 1024 packets, 1 to
/// [`BATCHES_IN_FLIGHT_MAX`] in flight, inline batches of at most 1024 packets, at least 256
/// buffers.
///
/// # Errors
/// The first value out of range, located.
pub fn check_pipeline(
    src: &Source<'_>,
    batch_size: &Spanned<usize>,
    batches_in_flight: &Spanned<usize>,
    inline_max: &Spanned<usize>,
    buffers: &Spanned<usize>,
) -> Result<(), ConfigError> {
    if *inline_max.get_ref() > 1024 {
        return src.err(
            &inline_max.span(),
            "dataplane.inline_max",
            format!("{} is outside 0..=1024", inline_max.get_ref()),
        );
    }
    for (v, k, max) in [
        (batch_size, "dataplane.batch_size", 1024),
        (
            batches_in_flight,
            "dataplane.batches_in_flight",
            BATCHES_IN_FLIGHT_MAX,
        ),
    ] {
        if !(1..=max).contains(v.get_ref()) {
            return src.err(
                &v.span(),
                k,
                format!("{} is outside 1..={max}", v.get_ref()),
            );
        }
    }
    if *buffers.get_ref() < 256 {
        return src.err(
            &buffers.span(),
            "dataplane.buffers",
            "at least 256 buffers are needed to run",
        );
    }
    Ok(())
}

/// The most batch buffers per direction (`dataplane.batches_in_flight`).
pub const BATCHES_IN_FLIGHT_MAX: usize = 16_384;

/// The smallest byte budget in flight (`dataplane.in_flight_bytes`) but 0: 64 KiB, some
/// batches of full frames.
pub const IN_FLIGHT_BYTES_MIN: usize = 64 << 10;

/// The longest time budget in flight (`dataplane.in_flight_ms`): ten seconds.
pub const IN_FLIGHT_MS_MAX: u32 = 10_000;

/// Checks `[dataplane]`'s in-flight budget: bytes 0 (no bound) or at least
/// [`IN_FLIGHT_BYTES_MIN`], milliseconds 0 (no bound) to [`IN_FLIGHT_MS_MAX`].
///
/// # Errors
/// The first value out of range, located.
pub fn check_in_flight(
    src: &Source<'_>,
    bytes: &Spanned<usize>,
    ms: &Spanned<u32>,
) -> Result<(), ConfigError> {
    let b = *bytes.get_ref();
    if b != 0 && b < IN_FLIGHT_BYTES_MIN {
        return src.err(
            &bytes.span(),
            "dataplane.in_flight_bytes",
            format!("{b} is below {IN_FLIGHT_BYTES_MIN} (0: no bound)"),
        );
    }
    if *ms.get_ref() > IN_FLIGHT_MS_MAX {
        return src.err(
            &ms.span(),
            "dataplane.in_flight_ms",
            format!("{} is outside 0..={IN_FLIGHT_MS_MAX}", ms.get_ref()),
        );
    }
    Ok(())
}

/// The longest `dataplane.aqm_interval_ms`: ten seconds.
pub const AQM_INTERVAL_MAX_MS: u32 = 10_000;

/// Checks `[dataplane]`'s queue manager: a target of 0 (off) or one below the interval, an
/// interval of 1 ms to [`AQM_INTERVAL_MAX_MS`]; the engine's setting.
///
/// # Errors
/// The first value out of range, located.
pub fn check_aqm(
    src: &Source<'_>,
    target_us: &Spanned<u32>,
    interval_ms: &Spanned<u32>,
) -> Result<Option<cyphonic_tunnel::Aqm>, ConfigError> {
    let (target, interval) = (*target_us.get_ref(), *interval_ms.get_ref());
    if !(1..=AQM_INTERVAL_MAX_MS).contains(&interval) {
        return src.err(
            &interval_ms.span(),
            "dataplane.aqm_interval_ms",
            format!("{interval} is outside 1..={AQM_INTERVAL_MAX_MS}"),
        );
    }
    if u64::from(target) >= u64::from(interval) * 1000 {
        return src.err(
            &target_us.span(),
            "dataplane.aqm_target_us",
            format!("{target} µs is not below the interval ({interval} ms)"),
        );
    }
    Ok((target > 0).then(|| cyphonic_tunnel::Aqm {
        target: Duration::from_micros(u64::from(target)),
        interval: Duration::from_millis(u64::from(interval)),
    }))
}

/// The longest `dataplane.busy_poll_us`: one second.
pub const BUSY_POLL_MAX_US: u32 = 1_000_000;

/// Checks `[dataplane]`'s thread placement: CPU numbers under 1024, each once; a real-time
/// priority of 0 (off) to 99; busy polling of at most [`BUSY_POLL_MAX_US`], and not at a
/// real-time priority on cores the data plane does not have to itself (`cpus` empty). Whether
/// the CPUs exist on this machine is checked at start.
///
/// # Errors
/// The first value out of range, located.
pub fn check_placement(
    src: &Source<'_>,
    cpus: &Spanned<Vec<usize>>,
    realtime_priority: &Spanned<u8>,
    busy_poll_us: &Spanned<u32>,
) -> Result<(), ConfigError> {
    let list = cpus.get_ref();
    if let Some(c) = list.iter().find(|&&c| c >= 1024) {
        return src.err(
            &cpus.span(),
            "dataplane.cpus",
            format!("CPU {c} is over 1023"),
        );
    }
    if let Some((_, c)) = list
        .iter()
        .enumerate()
        .find(|(i, c)| list[..*i].contains(c))
    {
        return src.err(
            &cpus.span(),
            "dataplane.cpus",
            format!("CPU {c} is listed twice"),
        );
    }
    check_priority(src, realtime_priority, "dataplane.realtime_priority")?;
    let busy = *busy_poll_us.get_ref();
    if busy > BUSY_POLL_MAX_US {
        return src.err(
            &busy_poll_us.span(),
            "dataplane.busy_poll_us",
            format!("{busy} is outside 0 (off) ..= {BUSY_POLL_MAX_US} (one second)"),
        );
    }
    if busy > 0 && *realtime_priority.get_ref() > 0 && list.is_empty() {
        return src.err(
            &busy_poll_us.span(),
            "dataplane.busy_poll_us",
            "polling at a real-time priority keeps every other thread off the cores it runs on; \
             give the data plane its own cores with `cpus`, or leave one of the two off",
        );
    }
    Ok(())
}

/// Checks a SCHED_FIFO priority, `key`: 0 (off) to 99.
///
/// # Errors
/// The value out of range, located.
pub fn check_priority(
    src: &Source<'_>,
    priority: &Spanned<u8>,
    key: &str,
) -> Result<(), ConfigError> {
    if *priority.get_ref() > 99 {
        return src.err(
            &priority.span(),
            key,
            format!(
                "{} is outside 0 (off) ..= 99 (SCHED_FIFO priorities)",
                priority.get_ref()
            ),
        );
    }
    Ok(())
}

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

/// Declares a binary's `[dataplane]` table (with [`table!`](crate::table)): the shared keys
/// (see [`cyphonic_tunnel::DataPlane`], whose defaults they take), then the binary's own, each
/// `/// doc` `name: Type = default`. `shared(&self, src)` checks the shared keys into a
/// [`cyphonic_tunnel::DataPlane`] (errors located in `src`). The calling crate needs `serde`.
///
/// ```
/// cyphonic_settings::dataplane_table! {
///     /// The adapter's `[dataplane]`.
///     struct RawDataplane {
///         /// Take merged frames as they are.
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
        $(#[doc = $doc:literal])*
        struct $name:ident {
            $( $(#[doc = $kdoc:literal])* $field:ident : $ty:ty = $default:expr ),* $(,)?
        }
    ) => {
        $crate::table! {
            $(#[doc = $doc])*
            struct $name in "dataplane" (optional) {
                /// Crypto worker threads; 0: one per core. More workers than cores only adds
                /// contention.
                workers: usize = $crate::DataPlane::default().workers,
                /// Packets handed to a worker at once (1 to 1024).
                batch_size: $crate::__private::Spanned<usize> =
                    $crate::unwritten($crate::DataPlane::default().batch_size),
                /// Batch buffers per direction at most (1 to 16384; made on first use, so
                /// memory grows only as far as a burst needed): the reorder buffer's size.
                /// Keep it large enough that the two budgets below bind first.
                batches_in_flight: $crate::__private::Spanned<usize> =
                    $crate::unwritten($crate::DataPlane::default().batches_in_flight),
                /// The in-flight budget per direction, bytes: packets are refused
                /// (`drop_pipeline_full`) while those between the receiving thread and the
                /// send hold this many. 0: no bound; else at least 65536.
                in_flight_bytes: $crate::__private::Spanned<usize> =
                    $crate::unwritten($crate::DataPlane::default().in_flight_bytes),
                /// ... or while the oldest batch in flight has waited this long, milliseconds
                /// (0: no bound; at most 10000).
                in_flight_ms: $crate::__private::Spanned<u32> = $crate::unwritten(
                    u32::try_from($crate::DataPlane::default().in_flight_time.as_millis())
                        .unwrap_or(u32::MAX),
                ),
                /// A burst of at most this many packets (0 to 1024) that finds the pipeline
                /// idle is sealed (or opened) and sent on the thread that received it: no
                /// hand-off to a worker, lower latency. 0: never.
                inline_max: $crate::__private::Spanned<usize> =
                    $crate::unwritten($crate::DataPlane::default().inline_max),
                /// A flow that sends at most this many packets a second (a ping, DNS, a
                /// keystroke) and has nothing waiting in the pipeline is sealed and sent at
                /// once, ahead of bulk flows' batches, and travels flagged so that the far end
                /// opens it ahead of its queue too. A flow never overtakes its own packets.
                /// 0: every packet queues in arrival order.
                sparse_rate: u32 = $crate::DataPlane::default().sparse_rate,
                /// The queue manager (CoDel, RFC 8289), microseconds: when received packets
                /// have waited in the kernel longer than this for a whole `aqm_interval_ms`,
                /// a bulk flow's packet is dropped, ever more often until the wait falls
                /// below it, so that the sender's TCP slows down before the buffer overflows.
                /// Sparse flows are never dropped. It turns on `socket_timestamps` for the
                /// capture. CoDel's own setting is 5000. 0: off.
                aqm_target_us: $crate::__private::Spanned<u32> = $crate::unwritten(
                    $crate::DataPlane::default().aqm.map_or(0, |a| {
                        u32::try_from(a.target.as_micros()).unwrap_or(u32::MAX)
                    }),
                ),
                /// The queue manager's interval, milliseconds (1 to 10000).
                aqm_interval_ms: $crate::__private::Spanned<u32> = $crate::unwritten(
                    u32::try_from($crate::Aqm::default().interval.as_millis())
                        .unwrap_or(u32::MAX),
                ),
                /// Have the kernel stamp what the sockets receive, so that `status` and the
                /// metrics show how long packets waited in the kernel. It may cost a few
                /// percent of throughput: for finding where packets wait.
                socket_timestamps: bool = $crate::DataPlane::default().socket_timestamps,
                /// Send packets in arrival order. `false` reproduces the reordering that
                /// makes TCP collapse: for experiments only.
                ordering: bool = $crate::DataPlane::default().ordering,
                /// The AEAD implementation: `"ring"` (faster) or `"rustcrypto"`.
                aead: $crate::AeadName = $crate::AeadName($crate::DataPlane::default().aead),
                /// Kernel buffer of the tunnel socket, bytes. Too small drops bursts.
                udp_buffer: usize = $crate::DataPlane::default().udp_buffer,
                /// Send runs of equal-size datagrams to one peer as one segmented message
                /// (UDP GSO). Off by itself where the kernel refuses.
                udp_gso: bool = $crate::DataPlane::default().udp_gso,
                /// Let the kernel hand over runs of datagrams from one peer at once (UDP
                /// GRO). Off by itself on kernels without it.
                udp_gro: bool = $crate::DataPlane::default().udp_gro,
                /// Pin the data plane's threads to these CPUs (each under 1024, once), e.g.
                /// `[2, 3]` on a Pi 4 whose cores 0-1 keep the rest. Empty: wherever the
                /// scheduler puts them.
                cpus: $crate::__private::Spanned<Vec<usize>> =
                    $crate::unwritten($crate::DataPlane::default().placement.cpus),
                /// SCHED_FIFO priority of those threads, 1 to 99 (0: off): they run as soon as
                /// a packet wakes them, at the cost of anything else sharing their cores.
                /// Needs CAP_SYS_NICE and `RestrictRealtime=no` in the unit.
                realtime_priority: $crate::__private::Spanned<u8> =
                    $crate::unwritten($crate::DataPlane::default().placement.realtime_priority),
                /// Busy polling, microseconds (at most 1000000): after a packet, the receiving
                /// threads keep asking for the next one this long instead of sleeping until
                /// the kernel wakes them. Saves a wake-up per packet, at the cost of a core's
                /// worth of polling per thread while traffic lasts. Meant for cores given to
                /// the data plane with `cpus`; with `realtime_priority` it needs them. 0: off.
                busy_poll_us: $crate::__private::Spanned<u32> = $crate::unwritten(
                    u32::try_from($crate::DataPlane::default().busy_poll.as_micros())
                        .unwrap_or(u32::MAX),
                ),
                /// Sparse traffic on sockets and threads of its own: ARP, ICMP, DNS and DHCP
                /// from the LAN, and the packets peers flagged sparse, never wait behind a
                /// download's packets in a socket's queue or a busy thread.
                sparse_socket: bool = $crate::DataPlane::default().sparse_socket,
                /// With `sparse_socket`: a sparse socket and thread of each kind per CPU (of
                /// `cpus`, or all the process may use; at most 16), so that a sparse packet's
                /// thread wakes on the core that received it. `false`: one of each.
                sparse_per_cpu: bool = $crate::DataPlane::default().sparse_per_cpu,
                /// SCHED_FIFO priority (1 to 99; 0: the normal scheduler) of the threads that
                /// read only sparse traffic. Needs `LimitRTPRIO` (the shipped unit sets it) or
                /// CAP_SYS_NICE; refused, they run at normal priority (one warning).
                sparse_priority: $crate::__private::Spanned<u8> =
                    $crate::unwritten($crate::DataPlane::default().sparse_priority),
                /// Packets held per peer while its handshake completes; all peers together
                /// hold at most a quarter of `buffers`.
                queue_per_peer: usize = $crate::DataPlane::default().queue_per_peer,
                /// Packet buffers in all (2 KiB each, at least 256): the data plane's memory
                /// ceiling.
                buffers: $crate::__private::Spanned<usize> =
                    $crate::unwritten($crate::DataPlane::default().buffers),
                /// For tests that must see many rekeys: rotate keys after this many seconds
                /// (at least 2, never later than the default). The daemon warns at start when
                /// it is set.
                danger_rekey_after_secs: $crate::__private::Spanned<u64> =
                    $crate::unwritten($crate::DataPlane::default().rekey_after.as_secs()),
                /// For tests: rotate keys after this many messages (at least 10000, never more
                /// than the default).
                danger_rekey_after_messages: $crate::__private::Spanned<u64> =
                    $crate::unwritten($crate::DataPlane::default().rekey_after_messages),
                $( $(#[doc = $kdoc])* $field: $ty = $default, )*
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
                    (&self.batch_size, Self::batch_size),
                    (&self.batches_in_flight, Self::batches_in_flight),
                    (&self.inline_max, Self::inline_max),
                    (&self.buffers, Self::buffers),
                )?;
                $crate::check_in_flight(
                    src,
                    (&self.in_flight_bytes, Self::in_flight_bytes),
                    (&self.in_flight_ms, Self::in_flight_ms),
                )?;
                $crate::check_placement(
                    src,
                    (&self.cpus, Self::cpus),
                    (&self.realtime_priority, Self::realtime_priority),
                    (&self.busy_poll_us, Self::busy_poll_us),
                )?;
                $crate::check_priority(src, &self.sparse_priority, Self::sparse_priority)?;
                $crate::check_rekey(
                    src,
                    (&self.danger_rekey_after_secs, Self::danger_rekey_after_secs),
                    (&self.danger_rekey_after_messages, Self::danger_rekey_after_messages),
                )?;
                let aqm = $crate::check_aqm(
                    src,
                    (&self.aqm_target_us, Self::aqm_target_us),
                    (&self.aqm_interval_ms, Self::aqm_interval_ms),
                )?;
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

impl crate::Value for AeadName {
    fn kind() -> String {
        "`\"ring\"` or `\"rustcrypto\"`".to_owned()
    }
    fn show(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

/// A value as written and its dotted key, for a check's error.
pub type Keyed<'a, T> = (&'a Spanned<T>, &'a str);

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
    (secs, secs_key): Keyed<'_, u64>,
    (messages, messages_key): Keyed<'_, u64>,
) -> Result<(), ConfigError> {
    let d = DataPlane::default();
    let max_secs = d.rekey_after.as_secs();
    if !(REKEY_AFTER_SECS_MIN..=max_secs).contains(secs.get_ref()) {
        return src.err(
            &secs.span(),
            secs_key,
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
            messages_key,
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
    batch_size: Keyed<'_, usize>,
    batches_in_flight: Keyed<'_, usize>,
    (inline_max, inline_max_key): Keyed<'_, usize>,
    (buffers, buffers_key): Keyed<'_, usize>,
) -> Result<(), ConfigError> {
    if *inline_max.get_ref() > 1024 {
        return src.err(
            &inline_max.span(),
            inline_max_key,
            format!("{} is outside 0..=1024", inline_max.get_ref()),
        );
    }
    for ((v, k), max) in [
        (batch_size, 1024),
        (batches_in_flight, BATCHES_IN_FLIGHT_MAX),
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
            buffers_key,
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
    (bytes, bytes_key): Keyed<'_, usize>,
    (ms, ms_key): Keyed<'_, u32>,
) -> Result<(), ConfigError> {
    let b = *bytes.get_ref();
    if b != 0 && b < IN_FLIGHT_BYTES_MIN {
        return src.err(
            &bytes.span(),
            bytes_key,
            format!("{b} is below {IN_FLIGHT_BYTES_MIN} (0: no bound)"),
        );
    }
    if *ms.get_ref() > IN_FLIGHT_MS_MAX {
        return src.err(
            &ms.span(),
            ms_key,
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
    (target_us, target_key): Keyed<'_, u32>,
    (interval_ms, interval_key): Keyed<'_, u32>,
) -> Result<Option<cyphonic_tunnel::Aqm>, ConfigError> {
    let (target, interval) = (*target_us.get_ref(), *interval_ms.get_ref());
    if !(1..=AQM_INTERVAL_MAX_MS).contains(&interval) {
        return src.err(
            &interval_ms.span(),
            interval_key,
            format!("{interval} is outside 1..={AQM_INTERVAL_MAX_MS}"),
        );
    }
    if u64::from(target) >= u64::from(interval) * 1000 {
        return src.err(
            &target_us.span(),
            target_key,
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
    (cpus, cpus_key): Keyed<'_, Vec<usize>>,
    (realtime_priority, realtime_key): Keyed<'_, u8>,
    (busy_poll_us, busy_key): Keyed<'_, u32>,
) -> Result<(), ConfigError> {
    let list = cpus.get_ref();
    if let Some(c) = list.iter().find(|&&c| c >= 1024) {
        return src.err(&cpus.span(), cpus_key, format!("CPU {c} is over 1023"));
    }
    if let Some((_, c)) = list
        .iter()
        .enumerate()
        .find(|(i, c)| list[..*i].contains(c))
    {
        return src.err(&cpus.span(), cpus_key, format!("CPU {c} is listed twice"));
    }
    check_priority(src, realtime_priority, realtime_key)?;
    let busy = *busy_poll_us.get_ref();
    if busy > BUSY_POLL_MAX_US {
        return src.err(
            &busy_poll_us.span(),
            busy_key,
            format!("{busy} is outside 0 (off) ..= {BUSY_POLL_MAX_US} (one second)"),
        );
    }
    if busy > 0 && *realtime_priority.get_ref() > 0 && list.is_empty() {
        return src.err(
            &busy_poll_us.span(),
            busy_key,
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

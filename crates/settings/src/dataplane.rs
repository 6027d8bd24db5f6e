//! The `[dataplane]` table: the keys every tunnel end shares (the engine's workers and
//! batching, the AEAD, the tunnel socket, thread placement, buffers), declared once for both
//! binaries by [`dataplane_table!`](crate::dataplane_table), and what they check into
//! ([`Dataplane`]). A binary adds its own keys to its table (the adapter its LAN side's).

use cyphonic_crypto::Backend;

/// The shared `[dataplane]` keys, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataplane {
    /// Crypto workers; 0 means one per core.
    pub workers: usize,
    /// Packets per batch handed to a worker.
    pub batch_size: usize,
    /// Batches in flight per direction: the memory bound.
    pub batches_in_flight: usize,
    /// Batches of at most this many packets are sealed or opened on the receiving thread
    /// when nothing is in flight (0: never).
    pub inline_max: usize,
    /// Emit in arrival order (false only for experiments).
    pub ordering: bool,
    /// AEAD implementation.
    pub aead: Backend,
    /// UDP socket buffer, bytes.
    pub udp_buffer: usize,
    /// Send runs of equal-size datagrams as one segmented (GSO) message.
    pub udp_gso: bool,
    /// Receive runs of datagrams coalesced by the kernel (GRO), split in userspace.
    pub udp_gro: bool,
    /// CPUs of the data-plane threads (empty: any).
    pub cpus: Vec<usize>,
    /// `SCHED_FIFO` priority of the data-plane threads (0: off).
    pub realtime_priority: u8,
    /// How long the receiving threads keep polling their socket after a packet instead of
    /// sleeping (`busy_poll_us`; zero: off).
    pub busy_poll: std::time::Duration,
    /// Packets queued per peer while its handshake is pending.
    pub queue_per_peer: usize,
    /// Packet buffers in all (2 KiB each): the data plane's memory ceiling.
    pub buffers: usize,
}

/// Declares a binary's `[dataplane]` table as serde reads it: the shared keys (see
/// [`Dataplane`]) with their defaults, then the binary's own fields, each with its serde
/// attributes and its default value (`name: Type = value`). The struct refuses unknown keys,
/// its `Default` is an empty table, and `shared(&self, src)` checks the shared keys into a
/// [`Dataplane`] (errors located in `src`). The calling crate needs `serde` and `toml`.
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
            #[serde(default)]
            workers: usize,
            #[serde(default = "cyphonic_settings::defaults::batch_size")]
            batch_size: toml::Spanned<usize>,
            #[serde(default = "cyphonic_settings::defaults::batches_in_flight")]
            batches_in_flight: toml::Spanned<usize>,
            #[serde(default = "cyphonic_settings::defaults::inline_max")]
            inline_max: toml::Spanned<usize>,
            #[serde(default = "cyphonic_settings::defaults::yes")]
            ordering: bool,
            #[serde(default)]
            aead: $crate::AeadName,
            #[serde(default = "cyphonic_settings::defaults::socket_buffer")]
            udp_buffer: usize,
            #[serde(default = "cyphonic_settings::defaults::yes")]
            udp_gso: bool,
            #[serde(default = "cyphonic_settings::defaults::yes")]
            udp_gro: bool,
            #[serde(default = "cyphonic_settings::defaults::cpus")]
            cpus: toml::Spanned<Vec<usize>>,
            #[serde(default = "cyphonic_settings::defaults::realtime_priority")]
            realtime_priority: toml::Spanned<u8>,
            #[serde(default = "cyphonic_settings::defaults::busy_poll_us")]
            busy_poll_us: toml::Spanned<u32>,
            #[serde(default = "cyphonic_settings::defaults::queue_per_peer")]
            queue_per_peer: usize,
            #[serde(default = "cyphonic_settings::defaults::buffers")]
            buffers: toml::Spanned<usize>,
            $( $(#[$field_meta])* $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    workers: 0,
                    batch_size: $crate::defaults::batch_size(),
                    batches_in_flight: $crate::defaults::batches_in_flight(),
                    inline_max: $crate::defaults::inline_max(),
                    ordering: true,
                    aead: $crate::AeadName::default(),
                    udp_buffer: $crate::defaults::socket_buffer(),
                    udp_gso: true,
                    udp_gro: true,
                    cpus: $crate::defaults::cpus(),
                    realtime_priority: $crate::defaults::realtime_priority(),
                    busy_poll_us: $crate::defaults::busy_poll_us(),
                    queue_per_peer: $crate::defaults::queue_per_peer(),
                    buffers: $crate::defaults::buffers(),
                    $( $field: $default, )*
                }
            }
        }

        impl $name {
            /// The shared keys, checked: pipeline sizes and thread placement.
            fn shared(
                &self,
                src: &$crate::Source<'_>,
            ) -> Result<$crate::Dataplane, $crate::ConfigError> {
                $crate::check_pipeline(
                    src,
                    &self.batch_size,
                    &self.batches_in_flight,
                    &self.inline_max,
                    &self.buffers,
                )?;
                $crate::check_placement(
                    src,
                    &self.cpus,
                    &self.realtime_priority,
                    &self.busy_poll_us,
                )?;
                Ok($crate::Dataplane {
                    workers: self.workers,
                    batch_size: *self.batch_size.get_ref(),
                    batches_in_flight: *self.batches_in_flight.get_ref(),
                    inline_max: *self.inline_max.get_ref(),
                    ordering: self.ordering,
                    aead: self.aead.0,
                    udp_buffer: self.udp_buffer,
                    udp_gso: self.udp_gso,
                    udp_gro: self.udp_gro,
                    cpus: self.cpus.get_ref().clone(),
                    realtime_priority: *self.realtime_priority.get_ref(),
                    busy_poll: std::time::Duration::from_micros(u64::from(
                        *self.busy_poll_us.get_ref(),
                    )),
                    queue_per_peer: self.queue_per_peer,
                    buffers: *self.buffers.get_ref(),
                })
            }
        }
    };
}

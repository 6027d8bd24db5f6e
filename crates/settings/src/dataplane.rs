//! The `[dataplane]` table: the keys every tunnel end shares (the engine's workers and
//! batching, the AEAD, the tunnel socket, thread placement, buffers), declared once for both
//! binaries by [`dataplane_table!`](crate::dataplane_table), and checked into the engine's
//! own parameter type, [`cyphonic_tunnel::DataPlane`], whose defaults are the defaults of the
//! keys. A binary adds its own keys to its table (the adapter its LAN side's).

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

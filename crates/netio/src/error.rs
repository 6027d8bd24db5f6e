//! What can go wrong at the I/O edge, phrased so an operator knows what to do.

use std::io;

/// An interface or socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// The named interface does not exist (in this network namespace).
    #[error("no such network interface {0:?} (see `ip link`)")]
    NoSuchInterface(String),
    /// The interface exists but is administratively down.
    #[error("network interface {0} is down (bring it up with `ip link set {0} up`)")]
    InterfaceDown(String),
    /// An interface name the kernel cannot take (empty, too long, or with a NUL byte).
    #[error("invalid interface name {0:?}: 1 to 15 bytes, no NUL")]
    BadInterfaceName(String),
    /// The kernel refused for lack of privilege.
    #[error(
        "{op} on {target}: not permitted; this needs {capability} (run as root, or grant it, \
         e.g. AmbientCapabilities={capability} in the systemd unit)"
    )]
    NotPermitted {
        /// What was attempted.
        op: &'static str,
        /// On what.
        target: String,
        /// The Linux capability that allows it.
        capability: &'static str,
    },
    /// Any other system call failure.
    #[error("{op} on {target}: {source}")]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On what.
        target: String,
        /// The system's error.
        source: io::Error,
    },
}

impl NetError {
    /// Classifies a failed system call: permission errors name `capability`.
    pub(crate) fn from_io(
        op: &'static str,
        target: &str,
        capability: &'static str,
        source: io::Error,
    ) -> Self {
        match source.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => Self::NotPermitted {
                op,
                target: target.to_owned(),
                capability,
            },
            Some(libc::ENODEV) => Self::NoSuchInterface(target.to_owned()),
            Some(libc::ENETDOWN) => Self::InterfaceDown(target.to_owned()),
            _ => Self::Io {
                op,
                target: target.to_owned(),
                source,
            },
        }
    }
}

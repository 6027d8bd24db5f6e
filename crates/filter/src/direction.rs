//! Which way a packet travels: the one word every part of the filter judges by.

/// Which way a packet travels through this tunnel end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From our side (the LAN, the host) into the tunnel.
    Out,
    /// From the tunnel to our side.
    In,
}

impl Direction {
    /// The other way.
    pub(crate) const fn reversed(self) -> Self {
        match self {
            Self::Out => Self::In,
            Self::In => Self::Out,
        }
    }
}

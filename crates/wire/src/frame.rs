//! The tunnel frame: a 16-byte header and a type-dependent body (docs/protocol.md §1).

use core::fmt;

/// The newest frame version this release speaks (docs/protocol.md §2, *Versions*).
pub const VERSION: u8 = 4;
/// The oldest frame version this release speaks: at most the previous release's newest, so
/// that members a release apart share a version (docs/protocol.md §2, *Versions*).
pub const OLDEST: u8 = 4;
const _: () = assert!(0 < OLDEST && OLDEST <= VERSION, "a range of versions");
/// Length of the fixed header; the header is also the AEAD additional data of data frames.
pub const HEADER_LEN: usize = 16;
/// Length of the Poly1305 authentication tag that ends every data and keepalive frame.
pub const TAG_LEN: usize = 16;
/// Length of each of the two MACs (`mac1`, `mac2`) that end every handshake body.
pub const MAC_LEN: usize = 16;
/// Length of the hint an initiation carries before its MACs: whom a responder under load
/// knows it by (docs/protocol.md §2, *Known peers first*).
pub const HINT_LEN: usize = 16;
/// Smallest handshake-init body: the smallest Noise IK first message (ephemeral key 32,
/// encrypted static key 32 + 16, the tag of the possibly empty payload 16), then the hint
/// and two MACs.
pub const HANDSHAKE_INIT_MIN: usize = 32 + 32 + TAG_LEN + TAG_LEN + HINT_LEN + 2 * MAC_LEN;
/// Smallest handshake-resp body: the smallest Noise IK second message (ephemeral key 32 and
/// the payload tag 16), then two MACs.
pub const HANDSHAKE_RESP_MIN: usize = 32 + TAG_LEN + 2 * MAC_LEN;
/// Length of a cookie-reply body: a 24-byte nonce, then a 16-byte cookie sealed with
/// XChaCha20-Poly1305 (16 + 16).
pub const COOKIE_REPLY_LEN: usize = 24 + 16 + TAG_LEN;
/// Largest handshake body. A handshake frame must fit the IPv6 minimum MTU of 1280 bytes
/// (RFC 8200 §5) after the outer IPv6 (40) and UDP (8) headers and our own header (16), so no
/// handshake ever depends on fragmentation or path MTU discovery.
pub const HANDSHAKE_MAX: usize = 1280 - 40 - 8 - HEADER_LEN;

/// The shortest path message (kind, zeros, id: docs/protocol.md §4, *Back to direct*).
pub const PATH_MSG_MIN: usize = 16;
/// The longest path message: a call-me with 8 addresses of 18 bytes.
pub const PATH_MSG_MAX: usize = PATH_MSG_MIN + 8 * 18;
/// Data-frame flag: the inner packet's TCP or UDP checksum is left to the receiver
/// (docs/protocol.md §1). The packet is an IPv4 TCP or UDP packet, not a fragment, whose
/// payload the sender vouches for (the AEAD carries it intact); its checksum field holds no
/// meaningful value. The receiver computes the checksum before the packet leaves it, or hands
/// the packet to a device that does (checksum offload).
pub const FLAG_CHECKSUM_DEFERRED: u16 = 0x0001;
/// Data-frame flag (version 3): the sender took the packet ahead of its own queue, its flow
/// having had nothing waiting there for a while and keeping to a sparse pace; a receiver may
/// open and deliver it ahead of frames that arrived before it (docs/protocol.md §1).
pub const FLAG_SPARSE: u16 = 0x0002;
/// The flags a data frame may carry; every other bit, and any bit of another type, is 0.
pub const DATA_FLAGS: u16 = FLAG_CHECKSUM_DEFERRED | FLAG_SPARSE;

/// Byte offsets of the header fields.
pub mod field {
    use core::ops::{Range, RangeFrom};

    /// `u8` frame version.
    pub const VERSION: usize = 0;
    /// `u8` message type.
    pub const TYPE: usize = 1;
    /// `u16` flags ([`super::DATA_FLAGS`] on data frames; all else 0).
    pub const FLAGS: Range<usize> = 2..4;
    /// `u32` session index chosen by the receiver of this frame.
    pub const RECEIVER: Range<usize> = 4..8;
    /// `u64` per-session, per-direction counter; the AEAD nonce of data frames.
    pub const COUNTER: Range<usize> = 8..16;
    /// The type-dependent body.
    pub const BODY: RangeFrom<usize> = 16..;
}

/// The message type carried in byte 1 of the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageType {
    /// Noise IK first message, initiator to responder.
    HandshakeInit,
    /// Noise IK second message, responder to initiator.
    HandshakeResp,
    /// An encrypted inner IP packet.
    Data,
    /// An encrypted empty payload: keeps NAT mappings and confirms keys.
    Keepalive,
    /// A whole tunnel frame wrapped for the relay (TRS); the receiver index is the channel.
    Relay,
    /// An underlay endpoint probe sent to the cloud so it can see the NAT-mapped address.
    EndpointProbe,
    /// A responder under load asks the initiator to prove its source address (a cookie for
    /// `mac2`); the index is the initiator's.
    CookieReply,
    /// A path message (ping, pong, call-me), sealed as a data frame: docs/protocol.md §4,
    /// *Back to direct*.
    Path,
    /// A type this version does not know; kept so that views round-trip.
    Unknown(u8),
}

impl From<u8> for MessageType {
    fn from(raw: u8) -> Self {
        match raw {
            1 => Self::HandshakeInit,
            2 => Self::HandshakeResp,
            3 => Self::Data,
            4 => Self::Keepalive,
            5 => Self::Relay,
            6 => Self::EndpointProbe,
            7 => Self::CookieReply,
            8 => Self::Path,
            other => Self::Unknown(other),
        }
    }
}

impl From<MessageType> for u8 {
    fn from(ty: MessageType) -> Self {
        match ty {
            MessageType::HandshakeInit => 1,
            MessageType::HandshakeResp => 2,
            MessageType::Data => 3,
            MessageType::Keepalive => 4,
            MessageType::Relay => 5,
            MessageType::EndpointProbe => 6,
            MessageType::CookieReply => 7,
            MessageType::Path => 8,
            MessageType::Unknown(other) => other,
        }
    }
}

impl fmt::Display for MessageType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::HandshakeInit => f.write_str("handshake-init"),
            Self::HandshakeResp => f.write_str("handshake-resp"),
            Self::Data => f.write_str("data"),
            Self::Keepalive => f.write_str("keepalive"),
            Self::Relay => f.write_str("relay"),
            Self::EndpointProbe => f.write_str("endpoint-probe"),
            Self::CookieReply => f.write_str("cookie-reply"),
            Self::Path => f.write_str("path"),
            Self::Unknown(raw) => write!(f, "unknown type {raw}"),
        }
    }
}

/// Why bytes are not a valid version-1 frame. Every variant is peer input, never a local fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Fewer bytes than the fixed header.
    #[error("frame truncated: {len} bytes, the header alone needs {HEADER_LEN}")]
    Truncated {
        /// Bytes received.
        len: usize,
    },
    /// A version this implementation does not speak.
    #[error("unsupported frame version {0}")]
    Version(u8),
    /// A message type this version does not define.
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// The body is too short or too long for its type.
    #[error("{kind} body of {len} bytes is outside {min}..={max}")]
    BodyLength {
        /// The frame's type.
        kind: MessageType,
        /// Body bytes received.
        len: usize,
        /// Smallest valid body.
        min: usize,
        /// Largest valid body.
        max: usize,
    },
    /// A handshake-init without its sender's index (it must not be zero).
    #[error("{kind} frame without a sender index")]
    NoIndex {
        /// The frame's type.
        kind: MessageType,
    },
    /// A header field that must be zero for this type is not.
    #[error("{kind} frame has a non-zero {field} field")]
    Reserved {
        /// The frame's type.
        kind: MessageType,
        /// The offending field.
        field: &'static str,
    },
}

/// A read/write view of a tunnel frame over a byte buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a short buffer.
    /// Use this only on buffers the caller sized itself, such as for [`FrameRepr::emit`].
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer after checking that it holds at least a full header, so that no
    /// accessor can panic afterwards.
    ///
    /// # Errors
    /// [`Error::Truncated`] when the buffer is shorter than [`HEADER_LEN`].
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let len = buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated { len });
        }
        Ok(Self { buffer })
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The frame version (byte 0).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The message type (byte 1).
    pub fn msg_type(&self) -> MessageType {
        MessageType::from(self.buffer.as_ref()[field::TYPE])
    }

    /// The flags (bytes 2..4).
    pub fn flags(&self) -> u16 {
        u16::from_be_bytes(self.array(field::FLAGS.start))
    }

    /// The receiver's session index (bytes 4..8); a handshake-init's sender index.
    pub fn receiver_index(&self) -> u32 {
        u32::from_be_bytes(self.array(field::RECEIVER.start))
    }

    /// The counter (bytes 8..16).
    pub fn counter(&self) -> u64 {
        u64::from_be_bytes(self.array(field::COUNTER.start))
    }

    /// The fixed header: the additional authenticated data of data and keepalive frames.
    pub fn header(&self) -> &[u8] {
        &self.buffer.as_ref()[..HEADER_LEN]
    }

    /// Everything after the header.
    pub fn body(&self) -> &[u8] {
        &self.buffer.as_ref()[field::BODY]
    }

    /// The whole frame.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buffer.as_ref()[at..at + N]);
        out
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Sets the version byte.
    pub fn set_version(&mut self, version: u8) {
        self.buffer.as_mut()[field::VERSION] = version;
    }

    /// Sets the message type.
    pub fn set_msg_type(&mut self, ty: MessageType) {
        self.buffer.as_mut()[field::TYPE] = ty.into();
    }

    /// Sets the flags.
    pub fn set_flags(&mut self, flags: u16) {
        self.buffer.as_mut()[field::FLAGS].copy_from_slice(&flags.to_be_bytes());
    }

    /// Sets the receiver's session index.
    pub fn set_receiver_index(&mut self, index: u32) {
        self.buffer.as_mut()[field::RECEIVER].copy_from_slice(&index.to_be_bytes());
    }

    /// Sets the counter.
    pub fn set_counter(&mut self, counter: u64) {
        self.buffer.as_mut()[field::COUNTER].copy_from_slice(&counter.to_be_bytes());
    }

    /// The body, writable.
    pub fn body_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::BODY]
    }

    /// The header (read-only, as AEAD additional data) and the body (writable, sealed or
    /// opened in place) at once.
    pub fn split_header_body_mut(&mut self) -> (&[u8], &mut [u8]) {
        let (header, body) = self.buffer.as_mut().split_at_mut(HEADER_LEN);
        (header, body)
    }
}

/// A range of frame versions a member speaks, `oldest` to `newest` (docs/protocol.md §2,
/// *Versions*): a receiver accepts frames of each, an initiator chooses one per session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Versions {
    oldest: u8,
    newest: u8,
}

impl Versions {
    /// What this release speaks: [`OLDEST`] to [`VERSION`].
    pub const OURS: Self = Self {
        oldest: OLDEST,
        newest: VERSION,
    };

    /// `oldest` to `newest`; `None` when `oldest > newest` or either is 0 (no version 0 was
    /// ever spoken).
    pub const fn new(oldest: u8, newest: u8) -> Option<Self> {
        if oldest == 0 || oldest > newest {
            None
        } else {
            Some(Self { oldest, newest })
        }
    }

    /// The one version `version`: what a session accepts of its peer.
    pub const fn exactly(version: u8) -> Self {
        Self {
            oldest: version,
            newest: version,
        }
    }

    /// The oldest version of the range.
    pub const fn oldest(self) -> u8 {
        self.oldest
    }

    /// The newest version of the range.
    pub const fn newest(self) -> u8 {
        self.newest
    }

    /// Whether `version` is in the range.
    pub const fn contains(self, version: u8) -> bool {
        self.oldest <= version && version <= self.newest
    }

    /// The version to initiate a session in with a peer that speaks `theirs`: the newest
    /// both speak; our oldest when nobody told us the peer's range. `None` when the two
    /// ranges share no version.
    pub fn to_speak(self, theirs: Option<Self>) -> Option<u8> {
        let Some(theirs) = theirs else {
            return Some(self.oldest);
        };
        let newest = self.newest.min(theirs.newest);
        (newest >= self.oldest.max(theirs.oldest)).then_some(newest)
    }
}

impl fmt::Display for Versions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} to {}", self.oldest, self.newest)
    }
}

/// The parsed header of a valid frame, with its body length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr {
    /// The frame's version: on a parsed frame, one the parser accepted.
    pub version: u8,
    /// The message type; never [`MessageType::Unknown`] after [`FrameRepr::parse`].
    pub msg_type: MessageType,
    /// Flags, carried through unchanged (authenticated as part of the header on data frames).
    pub flags: u16,
    /// The receiver's session index (the relay channel for [`MessageType::Relay`], the
    /// sender's index for [`MessageType::HandshakeInit`]).
    pub receiver_index: u32,
    /// The counter, the AEAD nonce of data and keepalive frames.
    pub counter: u64,
    /// Length of the body that follows the header, including any tag.
    pub body_len: usize,
}

impl FrameRepr {
    /// Parses and validates a frame header against the rules of its type (docs/protocol.md),
    /// when its version is one of `versions`.
    ///
    /// # Errors
    /// Any [`Error`] but `Truncated`, which [`Frame::new_checked`] already excluded;
    /// [`Error::Version`] before anything else is looked at.
    pub fn parse<T: AsRef<[u8]>>(frame: &Frame<T>, versions: Versions) -> Result<Self, Error> {
        let version = frame.version();
        if !versions.contains(version) {
            return Err(Error::Version(version));
        }
        let kind = frame.msg_type();
        let body_len = frame.body().len();
        let (min, max, zero_counter) = match kind {
            MessageType::HandshakeInit => (HANDSHAKE_INIT_MIN, HANDSHAKE_MAX, true),
            MessageType::HandshakeResp => (HANDSHAKE_RESP_MIN, HANDSHAKE_MAX, true),
            // A data frame carries at least one byte of inner packet; an empty one is a keepalive.
            MessageType::Data => (TAG_LEN + 1, usize::MAX, false),
            MessageType::Keepalive => (TAG_LEN, TAG_LEN, false),
            MessageType::Relay => (HEADER_LEN, usize::MAX, true),
            MessageType::EndpointProbe => (0, HANDSHAKE_MAX, false),
            MessageType::CookieReply => (COOKIE_REPLY_LEN, COOKIE_REPLY_LEN, true),
            MessageType::Path => (TAG_LEN + PATH_MSG_MIN, TAG_LEN + PATH_MSG_MAX, false),
            MessageType::Unknown(raw) => return Err(Error::UnknownType(raw)),
        };
        if body_len < min || body_len > max {
            return Err(Error::BodyLength {
                kind,
                len: body_len,
                min,
                max,
            });
        }
        if kind == MessageType::HandshakeInit && frame.receiver_index() == 0 {
            return Err(Error::NoIndex { kind });
        }
        // Only data frames define a flag; an unknown bit is a version this one does not speak.
        let allowed_flags = if kind == MessageType::Data {
            DATA_FLAGS
        } else {
            0
        };
        if frame.flags() & !allowed_flags != 0 {
            return Err(Error::Reserved {
                kind,
                field: "flags",
            });
        }
        if zero_counter && frame.counter() != 0 {
            return Err(Error::Reserved {
                kind,
                field: "counter",
            });
        }
        Ok(Self {
            version,
            msg_type: kind,
            flags: frame.flags(),
            receiver_index: frame.receiver_index(),
            counter: frame.counter(),
            body_len,
        })
    }

    /// Total frame length: header plus body.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN + self.body_len
    }

    /// Writes the header into `frame`; the body is the caller's (it is usually sealed in place).
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`]; size it with [`FrameRepr::buffer_len`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut Frame<T>) {
        frame.set_version(self.version);
        frame.set_msg_type(self.msg_type);
        frame.set_flags(self.flags);
        frame.set_receiver_index(self.receiver_index);
        frame.set_counter(self.counter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hex_literal::hex;

    /// A data frame: version 2, type 3, no flags, receiver 0x0a0b0c0d, counter 7, 17-byte body.
    const DATA: [u8; 33] = hex!(
        "04 03 0000 0a0b0c0d 0000000000000007"
        "ff 00112233445566778899aabbccddeeff"
    );

    #[test]
    fn views_data_frame() {
        let frame = Frame::new_checked(&DATA[..]).unwrap();
        assert_eq!(frame.version(), 4);
        assert_eq!(frame.msg_type(), MessageType::Data);
        assert_eq!(frame.flags(), 0);
        assert_eq!(frame.receiver_index(), 0x0a0b_0c0d);
        assert_eq!(frame.counter(), 7);
        assert_eq!(frame.header(), &DATA[..16]);
        assert_eq!(frame.body(), &DATA[16..]);
        let repr = FrameRepr::parse(&frame, Versions::OURS).unwrap();
        assert_eq!(
            repr,
            FrameRepr {
                version: 4,
                msg_type: MessageType::Data,
                flags: 0,
                receiver_index: 0x0a0b_0c0d,
                counter: 7,
                body_len: 17
            }
        );
        assert_eq!(repr.buffer_len(), DATA.len());
    }

    #[test]
    fn emits_what_it_parses() {
        let repr = FrameRepr {
            version: VERSION,
            msg_type: MessageType::Data,
            flags: FLAG_CHECKSUM_DEFERRED | FLAG_SPARSE,
            receiver_index: 42,
            counter: u64::MAX - 1,
            body_len: TAG_LEN + 1,
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut Frame::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[..16], &hex!("04 03 0003 0000002a fffffffffffffffe"));
        assert_eq!(
            FrameRepr::parse(&Frame::new_checked(&buf[..]).unwrap(), Versions::OURS),
            Ok(repr)
        );
    }

    /// `check(bytes, expected)` runs the whole parse path on one input.
    fn check(bytes: &[u8], expect: Result<MessageType, Error>) {
        let got = Frame::new_checked(bytes)
            .and_then(|f| FrameRepr::parse(&f, Versions::OURS))
            .map(|r| r.msg_type);
        assert_eq!(got, expect, "input {bytes:02x?}");
    }

    fn frame(ty: u8, receiver: u32, counter: u64, body: usize) -> Vec<u8> {
        let mut v = vec![VERSION, ty, 0, 0];
        v.extend_from_slice(&receiver.to_be_bytes());
        v.extend_from_slice(&counter.to_be_bytes());
        v.resize(HEADER_LEN + body, 0xa5);
        v
    }

    #[test]
    fn malformed_frames_are_typed_errors() {
        use MessageType::*;
        check(&[], Err(Error::Truncated { len: 0 }));
        check(&DATA[..15], Err(Error::Truncated { len: 15 }));
        for version in [0, 1, 2, 3, 5, 255] {
            let mut other = DATA;
            other[0] = version;
            check(&other, Err(Error::Version(version)));
        }
        check(&frame(0, 1, 1, 40), Err(Error::UnknownType(0)));
        check(&frame(200, 1, 1, 40), Err(Error::UnknownType(200)));
        let body = |kind, len, min, max| {
            Err(Error::BodyLength {
                kind,
                len,
                min,
                max,
            })
        };
        check(&frame(3, 1, 1, 16), body(Data, 16, 17, usize::MAX));
        check(&frame(3, 1, 1, 0), body(Data, 0, 17, usize::MAX));
        check(&frame(4, 1, 1, 17), body(Keepalive, 17, 16, 16));
        check(
            &frame(1, 1, 0, 143),
            body(HandshakeInit, 143, 144, HANDSHAKE_MAX),
        );
        check(
            &frame(1, 1, 0, HANDSHAKE_MAX + 1),
            body(HandshakeInit, 1217, 144, 1216),
        );
        check(
            &frame(2, 9, 0, 79),
            body(HandshakeResp, 79, 80, HANDSHAKE_MAX),
        );
        check(&frame(7, 9, 0, 55), body(CookieReply, 55, 56, 56));
        check(&frame(7, 9, 0, 57), body(CookieReply, 57, 56, 56));
        check(&frame(5, 9, 0, 15), body(Relay, 15, 16, usize::MAX));
        check(&frame(8, 9, 1, 31), body(Path, 31, 32, 176));
        check(&frame(8, 9, 1, 177), body(Path, 177, 32, 176));
        check(
            &frame(6, 0, 0, HANDSHAKE_MAX + 1),
            body(EndpointProbe, 1217, 0, 1216),
        );
        let reserved = |kind, field| Err(Error::Reserved { kind, field });
        check(
            &frame(1, 0, 0, 144),
            Err(Error::NoIndex {
                kind: HandshakeInit,
            }),
        );
        check(&frame(1, 5, 5, 144), reserved(HandshakeInit, "counter"));
        check(&frame(2, 5, 1, 80), reserved(HandshakeResp, "counter"));
        check(&frame(7, 5, 1, 56), reserved(CookieReply, "counter"));
        check(&frame(5, 5, 1, 16), reserved(Relay, "counter"));
        // Flags: data frames define bits 0 and 1 only; every other type defines none.
        let flagged = |ty, receiver, body, flags: u16| {
            let mut f = frame(ty, receiver, 0, body);
            f[2..4].copy_from_slice(&flags.to_be_bytes());
            f
        };
        check(&flagged(3, 7, 17, 0x0004), reserved(Data, "flags"));
        check(&flagged(3, 7, 17, 0x8001), reserved(Data, "flags"));
        check(&flagged(4, 7, 16, 0x0001), reserved(Keepalive, "flags"));
        check(
            &flagged(1, 7, 144, 0x0100),
            reserved(HandshakeInit, "flags"),
        );
        check(&flagged(2, 7, 80, 0x0001), reserved(HandshakeResp, "flags"));
        check(&flagged(7, 7, 56, 0x0001), reserved(CookieReply, "flags"));
        check(&flagged(6, 0, 16, 0x0001), reserved(EndpointProbe, "flags"));
        check(&flagged(8, 7, 32, FLAG_SPARSE), reserved(Path, "flags"));
        check(
            &flagged(4, 7, 16, FLAG_SPARSE),
            reserved(Keepalive, "flags"),
        );
        check(&flagged(3, 7, 17, FLAG_CHECKSUM_DEFERRED), Ok(Data));
        check(&flagged(3, 7, 17, FLAG_SPARSE), Ok(Data));
        check(&flagged(3, 7, 17, DATA_FLAGS), Ok(Data));
    }

    #[test]
    fn valid_frames_of_each_type() {
        use MessageType::*;
        check(&frame(1, 7, 0, 144), Ok(HandshakeInit));
        check(&frame(1, 7, 0, HANDSHAKE_MAX), Ok(HandshakeInit));
        check(&frame(2, 7, 0, 80), Ok(HandshakeResp));
        check(&frame(7, 7, 0, 56), Ok(CookieReply));
        check(&frame(3, 7, 9, 17), Ok(Data));
        check(&frame(3, 7, 9, 65_000), Ok(Data));
        check(&frame(4, 7, 9, 16), Ok(Keepalive));
        check(&frame(5, 7, 0, 16), Ok(Relay));
        check(&frame(6, 7, 3, 0), Ok(EndpointProbe));
        check(&frame(8, 7, 3, 32), Ok(Path));
        check(&frame(8, 7, 3, 176), Ok(Path));
    }

    /// A range accepts its own versions only, parses each into the frame's version, and
    /// re-emits that version.
    #[test]
    fn a_range_accepts_its_versions_and_keeps_each() {
        let range = Versions::new(3, 5).unwrap();
        for version in [0, 1, 2, 6, 255] {
            let mut other = DATA;
            other[0] = version;
            let parsed = FrameRepr::parse(&Frame::new_checked(&other[..]).unwrap(), range);
            assert_eq!(parsed, Err(Error::Version(version)));
        }
        for version in 3..=5 {
            let mut ours = DATA;
            ours[0] = version;
            let repr = FrameRepr::parse(&Frame::new_checked(&ours[..]).unwrap(), range).unwrap();
            assert_eq!(repr.version, version);
            let mut out = [0u8; HEADER_LEN];
            repr.emit(&mut Frame::new_unchecked(&mut out[..]));
            assert_eq!(out, ours[..HEADER_LEN]);
        }
    }

    #[test]
    fn ranges_and_the_version_to_speak() {
        let r = |o, n| Versions::new(o, n).unwrap();
        assert_eq!(Versions::new(5, 4), None);
        assert_eq!(Versions::new(0, 4), None);
        assert_eq!(Versions::OURS, r(OLDEST, VERSION));
        // Unknown peer: our oldest.
        assert_eq!(r(4, 5).to_speak(None), Some(4));
        // The newest both speak, from either side.
        assert_eq!(r(4, 5).to_speak(Some(r(4, 4))), Some(4));
        assert_eq!(r(4, 4).to_speak(Some(r(4, 5))), Some(4));
        assert_eq!(r(4, 5).to_speak(Some(r(4, 5))), Some(5));
        assert_eq!(r(4, 5).to_speak(Some(r(5, 6))), Some(5));
        assert_eq!(r(5, 6).to_speak(Some(r(4, 5))), Some(5));
        // Apart: nothing.
        assert_eq!(r(4, 4).to_speak(Some(r(5, 6))), None);
        assert_eq!(r(5, 6).to_speak(Some(r(4, 4))), None);
        assert_eq!(r(4, 5).to_string(), "4 to 5");
    }

    #[test]
    fn message_type_codes_round_trip() {
        for raw in 0..=u8::MAX {
            assert_eq!(u8::from(MessageType::from(raw)), raw);
        }
    }

    /// docs/protocol.md §1 must say what this code does: type codes, names, length rules.
    #[test]
    fn protocol_doc_matches_the_code() {
        let doc = include_str!("../../../docs/protocol.md");
        let rows = [
            (
                MessageType::HandshakeInit,
                format!("{HANDSHAKE_INIT_MIN} ..= {HANDSHAKE_MAX}"),
            ),
            (
                MessageType::HandshakeResp,
                format!("{HANDSHAKE_RESP_MIN} ..= {HANDSHAKE_MAX}"),
            ),
            (MessageType::Data, format!(">= {}", TAG_LEN + 1)),
            (MessageType::Keepalive, format!("exactly {TAG_LEN}")),
            (MessageType::Relay, format!(">= {HEADER_LEN}")),
            (MessageType::EndpointProbe, format!("0 ..= {HANDSHAKE_MAX}")),
            (
                MessageType::CookieReply,
                format!("exactly {COOKIE_REPLY_LEN}"),
            ),
            (
                MessageType::Path,
                format!("{} ..= {}", TAG_LEN + PATH_MSG_MIN, TAG_LEN + PATH_MSG_MAX),
            ),
        ];
        for (ty, length_rule) in rows {
            let prefix = format!("| {} | {ty} |", u8::from(ty));
            let row = doc
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("no row {prefix}"));
            assert!(
                row.contains(&length_rule),
                "row {row:?} should state {length_rule:?}"
            );
        }
        assert!(doc.contains(&format!("| {HEADER_LEN} | .. | body |")));
        assert!(doc.starts_with(&format!("# cyphonic wire protocol, version {VERSION}\n")));
        assert!(doc.contains(&format!("|  version = {VERSION}  |")));
        assert!(doc.contains(&format!(
            "40 (IPv6) + 8 (UDP) + {HEADER_LEN} + {HANDSHAKE_MAX} = 1280"
        )));
    }

    #[test]
    fn handshake_fits_ipv6_minimum_mtu() {
        assert_eq!(40 + 8 + HEADER_LEN + HANDSHAKE_MAX, 1280);
    }

    proptest::proptest! {
        #[test]
        fn roundtrip_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            crate::roundtrip_check(&data);
        }

        #[test]
        fn mutated_valid_frames_round_trip(ty in 1u8..=8, counter: u64, receiver: u32, body in 0usize..1300) {
            let mut v = frame(ty, receiver, counter, body);
            // Half the time, make the counter legal for every type so most inputs parse.
            if counter % 2 == 0 { v[8..16].fill(0); }
            crate::roundtrip_check(&v);
        }
    }
}

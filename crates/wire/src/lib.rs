//! Tunnel frame formats of the cyphonic overlay, as zero-copy views and builders.
//!
//! Every UDP payload exchanged between two tunnel endpoints is a [`Frame`]: a fixed 16-byte
//! header (version, message type, flags, receiver session index, counter) followed by a body
//! whose meaning depends on the type. docs/protocol.md describes the format byte by byte.
//!
//! Two layers, after smoltcp: [`Frame`] is a view over any `AsRef<[u8]>` whose length is checked
//! once by [`Frame::new_checked`], after which no accessor can panic; [`FrameRepr`] is the parsed
//! high-level representation with [`FrameRepr::parse`], [`FrameRepr::buffer_len`] and
//! [`FrameRepr::emit`]. Numeric codes keep an `Unknown(raw)` variant so everything round-trips.
//!
//! This crate performs no I/O, holds no keys and never allocates: it does not encrypt (that is
//! `cyphonic-crypto`), and it does not interpret handshake bodies (that is `cyphonic-session`).
#![forbid(unsafe_code)]

mod frame;

pub use frame::{
    COOKIE_REPLY_LEN, DATA_FLAGS, Error, FLAG_CHECKSUM_DEFERRED, FLAG_SPARSE, Frame, FrameRepr,
    HANDSHAKE_INIT_MIN, HANDSHAKE_MAX, HANDSHAKE_RESP_MIN, HEADER_LEN, HINT_LEN, MAC_LEN,
    MessageType, OLDEST, PATH_MSG_MAX, PATH_MSG_MIN, TAG_LEN, VERSION, Versions, field,
};

/// Entry point shared by the fuzz target and the tests: parse arbitrary bytes as a frame and,
/// when that succeeds, check that emitting the representation reproduces the header exactly
/// and that the re-emitted frame parses to the same representation.
///
/// Returns whether the input parsed. Panics only when the round trip breaks, which is the bug
/// the fuzzer looks for.
pub fn roundtrip_check(data: &[u8]) -> bool {
    let Ok(frame) = Frame::new_checked(data) else {
        return false;
    };
    let Ok(repr) = FrameRepr::parse(&frame, Versions::OURS) else {
        return false;
    };
    assert_eq!(
        repr.buffer_len(),
        data.len(),
        "repr length disagrees with the input"
    );
    let mut out = [0u8; HEADER_LEN];
    repr.emit(&mut Frame::new_unchecked(&mut out[..]));
    assert_eq!(
        &out[..],
        frame.header(),
        "emitted header differs from the parsed one"
    );
    let mut whole = data.to_vec();
    whole[..HEADER_LEN].copy_from_slice(&out);
    let again = FrameRepr::parse(
        &Frame::new_checked(&whole[..]).expect("re-emitted frame"),
        Versions::OURS,
    )
    .expect("re-emitted frame parses");
    assert_eq!(again, repr, "round trip changed the representation");
    true
}

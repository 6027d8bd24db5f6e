//! The keys of one completed handshake: one [`PacketKey`] per direction, the send counter and
//! the receive replay window. Shared by `Arc` with crypto workers; nothing here needs `&mut`.

use core::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use cyphonic_crypto::{Backend, Key, PacketKey, ReplayError, ReplayWindow, TAG_LEN};
use cyphonic_wire::{Frame, FrameRepr, HEADER_LEN, MessageType, Versions};

use crate::error::{RecvError, SendError};
use crate::index::LocalIndex;

/// One direction-pair of keys between us and a peer, from one handshake.
pub struct Session {
    /// Held as long as the keys live: packets in flight keep their index registered.
    local_index: LocalIndex,
    remote_index: u32,
    initiator: bool,
    created: Instant,
    /// The frame version of every frame sealed and opened.
    version: u8,
    send_key: Box<dyn PacketKey>,
    recv_key: Box<dyn PacketKey>,
    /// Next counter to hand out. Only ever moves forward, and never past `send_limit`.
    next_counter: AtomicU64,
    send_limit: u64,
    replay: Mutex<ReplayWindow>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("local_index", &self.local_index)
            .field("remote_index", &self.remote_index)
            .field("initiator", &self.initiator)
            .field("counters_used", &self.counters_used())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session on `(ours, theirs)` indices.
    pub(crate) fn new(
        (local_index, remote_index): (LocalIndex, u32),
        initiator: bool,
        created: Instant,
        backend: Backend,
        (send, recv): (Key, Key),
        limit: u64,
        version: u8,
    ) -> Self {
        Self {
            version,
            local_index,
            remote_index,
            initiator,
            created,
            send_key: backend.key(&send),
            recv_key: backend.key(&recv),
            next_counter: AtomicU64::new(0),
            send_limit: limit,
            replay: Mutex::new(ReplayWindow::new(limit)),
        }
    }

    /// The frame version the session runs at, its initiator's choice (docs/protocol.md §2,
    /// *Versions*).
    pub const fn version(&self) -> u8 {
        self.version
    }

    /// Our index: frames to us carry it as receiver index.
    pub const fn local_index(&self) -> u32 {
        self.local_index.value()
    }

    /// The peer's index: our frames carry it as receiver index.
    pub const fn remote_index(&self) -> u32 {
        self.remote_index
    }

    /// Whether we initiated the handshake behind these keys (the initiator rekeys on time).
    pub const fn is_initiator(&self) -> bool {
        self.initiator
    }

    /// When the handshake completed.
    pub const fn created(&self) -> Instant {
        self.created
    }

    /// How many send counters were handed out.
    pub fn counters_used(&self) -> u64 {
        self.next_counter.load(Ordering::Relaxed)
    }

    /// Hands out the next send counter, in order. The sequencer calls this so that counters
    /// follow arrival order; a counter is never handed out twice, and never at or past the
    /// limit (the counter stops there instead of wrapping).
    ///
    /// # Errors
    /// [`SendError::KeyExhausted`] at the limit.
    pub fn reserve_counter(&self) -> Result<u64, SendError> {
        self.next_counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                (c < self.send_limit).then_some(c + 1)
            })
            .map_err(|_| SendError::KeyExhausted)
    }

    /// Seals a frame in place. `buf[HEADER_LEN..HEADER_LEN + payload_len]` holds the
    /// plaintext (empty for a keepalive); the header is written in front and the tag after.
    /// Returns the frame length. Safe to call from any thread, in any order.
    ///
    /// # Errors
    /// [`SendError::BufferTooSmall`] when `buf` cannot hold header, payload and tag.
    pub fn seal(
        &self,
        counter: u64,
        buf: &mut [u8],
        payload_len: usize,
    ) -> Result<usize, SendError> {
        self.seal_flagged(counter, buf, payload_len, 0)
    }

    /// [`Session::seal`] with header `flags` (such as
    /// [`cyphonic_wire::FLAG_CHECKSUM_DEFERRED`]), authenticated with the header.
    ///
    /// # Errors
    /// [`SendError::BufferTooSmall`] when `buf` cannot hold header, payload and tag.
    pub fn seal_flagged(
        &self,
        counter: u64,
        buf: &mut [u8],
        payload_len: usize,
        flags: u16,
    ) -> Result<usize, SendError> {
        let msg_type = if payload_len == 0 {
            MessageType::Keepalive
        } else {
            MessageType::Data
        };
        self.seal_as(msg_type, counter, buf, payload_len, flags)
    }

    /// Seals a path frame (docs/protocol.md §4, *Back to direct*) in place, as
    /// [`Session::seal`] seals a data frame: `buf[HEADER_LEN..HEADER_LEN + payload_len]`
    /// holds the path message.
    ///
    /// # Errors
    /// [`SendError::BufferTooSmall`] when `buf` cannot hold header, payload and tag.
    pub fn seal_path(
        &self,
        counter: u64,
        buf: &mut [u8],
        payload_len: usize,
    ) -> Result<usize, SendError> {
        self.seal_as(MessageType::Path, counter, buf, payload_len, 0)
    }

    fn seal_as(
        &self,
        msg_type: MessageType,
        counter: u64,
        buf: &mut [u8],
        payload_len: usize,
        flags: u16,
    ) -> Result<usize, SendError> {
        let len = HEADER_LEN + payload_len + TAG_LEN;
        let Some(frame_buf) = buf.get_mut(..len) else {
            return Err(SendError::BufferTooSmall { needed: len });
        };
        let repr = FrameRepr {
            version: self.version,
            msg_type,
            flags,
            receiver_index: self.remote_index,
            counter,
            body_len: payload_len + TAG_LEN,
        };
        let mut frame = Frame::new_unchecked(frame_buf);
        repr.emit(&mut frame);
        let (header, body) = frame.split_header_body_mut();
        self.send_key.seal(counter, header, body)?;
        Ok(len)
    }

    /// Opens a data or keepalive frame addressed to this session in place and returns its
    /// counter and plaintext. Does not touch the replay window: run [`Session::check_replay`]
    /// before (cheap) and [`Session::accept_counter`] after, in arrival order.
    ///
    /// # Errors
    /// [`RecvError`]: malformed, wrong type or index, or not authentic.
    pub fn open<'a>(&self, frame: &'a mut [u8]) -> Result<(u64, &'a mut [u8]), RecvError> {
        self.open_as(frame, |t| {
            matches!(t, MessageType::Data | MessageType::Keepalive)
        })
    }

    /// [`Session::open`] for a path frame (docs/protocol.md §4, *Back to direct*): its
    /// counter and its path message. Any other type is [`RecvError::WrongType`].
    ///
    /// # Errors
    /// [`RecvError`]: malformed, wrong type or index, or not authentic.
    pub fn open_path<'a>(&self, frame: &'a mut [u8]) -> Result<(u64, &'a mut [u8]), RecvError> {
        self.open_as(frame, |t| t == MessageType::Path)
    }

    fn open_as<'a>(
        &self,
        frame: &'a mut [u8],
        kind: impl Fn(MessageType) -> bool,
    ) -> Result<(u64, &'a mut [u8]), RecvError> {
        let repr = FrameRepr::parse(
            &Frame::new_checked(&*frame)?,
            Versions::exactly(self.version),
        )?;
        if !kind(repr.msg_type) {
            return Err(RecvError::WrongType(repr.msg_type));
        }
        if repr.receiver_index != self.local_index() {
            return Err(RecvError::UnknownIndex(repr.receiver_index));
        }
        let (header, body) = frame.split_at_mut(HEADER_LEN);
        let plain = self.recv_key.open(repr.counter, header, body)?;
        Ok((repr.counter, plain))
    }

    /// Whether `counter` could be accepted; run before spending a decryption on a frame.
    ///
    /// # Errors
    /// [`ReplayError`] if it is a duplicate, too old, or beyond the limit.
    pub fn check_replay(&self, counter: u64) -> Result<(), ReplayError> {
        self.replay
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .check(counter)
    }

    /// Records `counter` of an authenticated frame. Call in arrival order, after opening.
    ///
    /// # Errors
    /// [`ReplayError`] if it is a duplicate or too old: drop the frame.
    pub fn accept_counter(&self, counter: u64) -> Result<(), ReplayError> {
        self.replay
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .accept(counter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ends of one set of keys.
    fn pair(limit: u64) -> (Session, Session) {
        let now = Instant::now();
        let (k1, k2) = ([1u8; 32], [2u8; 32]);
        let indices = crate::Indices::seeded(1);
        let (ia, ib) = (indices.allocate(1), indices.allocate(2));
        let (a_index, b_index) = (ia.value(), ib.value());
        let a = Session::new(
            (ia, b_index),
            true,
            now,
            Backend::Ring,
            (Key::from_bytes(k1), Key::from_bytes(k2)),
            limit,
            cyphonic_wire::VERSION,
        );
        let b = Session::new(
            (ib, a_index),
            false,
            now,
            Backend::RustCrypto,
            (Key::from_bytes(k2), Key::from_bytes(k1)),
            limit,
            cyphonic_wire::VERSION,
        );
        (a, b)
    }

    /// Every frame of a session carries its version, and a frame of the session in another
    /// version does not open, whatever else the receiver speaks.
    #[test]
    fn a_session_seals_and_opens_its_own_version_only() {
        let (a, b) = pair(u64::MAX);
        assert_eq!(
            (a.version(), b.version()),
            (cyphonic_wire::VERSION, cyphonic_wire::VERSION)
        );
        let mut buf = [0u8; 64];
        let c = a.reserve_counter().unwrap();
        let len = a.seal(c, &mut buf, 5).unwrap();
        assert_eq!(buf[0], cyphonic_wire::VERSION);
        let mut other = buf;
        other[0] = cyphonic_wire::VERSION + 1;
        assert!(matches!(
            b.open(&mut other[..len]),
            Err(RecvError::Frame(cyphonic_wire::Error::Version(v))) if v == cyphonic_wire::VERSION + 1
        ));
        assert!(b.open(&mut buf[..len]).is_ok());
    }

    #[test]
    fn seal_open_across_backends() {
        let (a, b) = pair(u64::MAX);
        let mut buf = [0u8; 64];
        buf[HEADER_LEN..HEADER_LEN + 5].copy_from_slice(b"hello");
        let c = a.reserve_counter().unwrap();
        let len = a.seal(c, &mut buf, 5).unwrap();
        assert_eq!(len, HEADER_LEN + 5 + TAG_LEN);
        b.check_replay(c).unwrap();
        let (counter, plain) = b.open(&mut buf[..len]).unwrap();
        assert_eq!((counter, &*plain), (0, &b"hello"[..]));
        b.accept_counter(counter).unwrap();
        assert!(b.check_replay(counter).is_err());
    }

    #[test]
    fn flags_are_carried_and_authenticated() {
        let (a, b) = pair(u64::MAX);
        let mut buf = [0u8; 64];
        buf[HEADER_LEN..HEADER_LEN + 5].copy_from_slice(b"hello");
        let flag = cyphonic_wire::FLAG_CHECKSUM_DEFERRED;
        let len = a
            .seal_flagged(a.reserve_counter().unwrap(), &mut buf, 5, flag)
            .unwrap();
        assert_eq!(Frame::new_checked(&buf[..len]).unwrap().flags(), flag);
        let mut cleared = buf;
        cleared[3] &= !0x01; // the flag itself: authenticated as AAD
        assert!(matches!(
            b.open(&mut cleared[..len]),
            Err(RecvError::Auth(_))
        ));
        let (_, plain) = b.open(&mut buf[..len]).unwrap();
        assert_eq!(&*plain, b"hello");
    }

    #[test]
    fn wrong_index_type_and_tampering() {
        let (a, b) = pair(u64::MAX);
        let mut buf = [0u8; 64];
        let len = a.seal(a.reserve_counter().unwrap(), &mut buf, 0).unwrap();
        assert_eq!(
            Frame::new_checked(&buf[..len]).unwrap().msg_type(),
            MessageType::Keepalive
        );
        // a cannot open its own frame: the index is b's.
        let b_index = b.local_index();
        assert!(matches!(
            a.open(&mut { buf }[..len]),
            Err(RecvError::UnknownIndex(i)) if i == b_index
        ));
        let mut flipped = buf;
        flipped[9] ^= 1; // counter byte: authenticated as AAD
        assert!(matches!(
            b.open(&mut flipped[..len]),
            Err(RecvError::Auth(_))
        ));
        let mut flipped = buf;
        flipped[len - 1] ^= 1; // tag
        assert!(matches!(
            b.open(&mut flipped[..len]),
            Err(RecvError::Auth(_))
        ));
        assert!(matches!(b.open(&mut [0u8; 10]), Err(RecvError::Frame(_))));
        assert_eq!(
            a.seal(0, &mut [0u8; 40], 10),
            Err(SendError::BufferTooSmall { needed: 42 })
        );
    }

    #[test]
    fn counters_stop_at_the_limit_and_never_wrap() {
        let (a, _) = pair(3);
        assert_eq!(
            (0..3)
                .map(|_| a.reserve_counter().unwrap())
                .collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        for _ in 0..10_000 {
            assert_eq!(a.reserve_counter(), Err(SendError::KeyExhausted));
        }
        assert_eq!(a.counters_used(), 3);
    }

    #[test]
    fn counters_are_unique_across_threads() {
        let (a, _) = pair(u64::MAX);
        let a = std::sync::Arc::new(a);
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let a = a.clone();
                std::thread::spawn(move || {
                    (0..10_000)
                        .map(|_| a.reserve_counter().unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<u64> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 40_000);
    }
}

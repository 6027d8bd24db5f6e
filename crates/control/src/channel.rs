//! The control channel: Noise IK over a byte stream (TCP), sans-IO.
//!
//! The client knows the cloud's static key (pinned in its config) and initiates; its
//! certificate rides, encrypted, in the first message ([`Hello`]), the cloud's verdict in the
//! second ([`Welcome`]). After that both sides exchange transport messages. On the stream every
//! Noise message is preceded by its length as a big-endian `u16` (the Noise specification's
//! framing for TCP): drivers read two bytes, then that many, and hand the bytes here.

use core::fmt;

use cyphonic_crypto::{PublicKey, StaticKeypair, noise};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::msg::{Hello, Welcome};

/// Bound into every control handshake: a tunnel handshake (or another protocol) never passes
/// for one.
pub const PROLOGUE: &[u8] = b"cyphonic control v1";

/// The largest Noise message, and so the largest frame on the stream (after the prefix).
pub const MAX_FRAME: usize = 65_535;

/// The largest first frame (the client's handshake message with its [`Hello`]): a
/// certificate's encoding is at most 1024 bytes, so a real `Hello` is far below this. The
/// cloud reads no more from a connection that announces a longer one.
pub const MAX_HELLO_FRAME: usize = 4096;

/// Bytes of the length prefix.
pub const LEN_PREFIX: usize = 2;

const TAG: usize = 16;

/// The largest message body (JSON) one frame carries.
pub const MAX_MESSAGE: usize = MAX_FRAME - TAG;

/// What can go wrong on the channel. Every variant means the peer (or the path) misbehaved:
/// drivers count it and close the connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// Noise refused the message: not encrypted to our key, tampered with, replayed out of
    /// order, or not a handshake of this protocol.
    #[error("noise: {0}")]
    Noise(#[from] snow::Error),
    /// The decrypted message is not a message of this protocol.
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The message does not fit one frame.
    #[error("message of {0} bytes is larger than a frame ({MAX_MESSAGE})")]
    TooLarge(usize),
    /// The peer's static key is missing after the handshake (cannot happen with IK).
    #[error("the handshake gave no static key")]
    NoStaticKey,
}

/// Prefixes `body` with its length.
fn framed(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(LEN_PREFIX + body.len());
    // The callers keep body under MAX_FRAME.
    out.extend_from_slice(&u16::try_from(body.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// The length a prefix announces.
pub const fn frame_len(prefix: [u8; LEN_PREFIX]) -> usize {
    u16::from_be_bytes(prefix) as usize
}

/// Whether `msg` fits one frame (a sealed message may be up to [`MAX_MESSAGE`] bytes of
/// JSON).
pub fn fits<T: Serialize>(msg: &T) -> bool {
    to_json(msg).is_ok()
}

fn to_json<T: Serialize>(msg: &T) -> Result<Vec<u8>, ChannelError> {
    let json = serde_json::to_vec(msg)?;
    if json.len() > MAX_MESSAGE {
        return Err(ChannelError::TooLarge(json.len()));
    }
    Ok(json)
}

/// The client's half-open handshake.
pub struct ClientHandshake {
    state: snow::HandshakeState,
}

impl fmt::Debug for ClientHandshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientHandshake").finish_non_exhaustive()
    }
}

impl ClientHandshake {
    /// Starts a handshake to the cloud whose static key is `cloud`; returns the frame to
    /// write (length prefix included).
    ///
    /// # Errors
    /// [`ChannelError::TooLarge`] for a `Hello` whose frame would pass [`MAX_HELLO_FRAME`]
    /// (an oversize certificate or agent); Noise errors are not expected.
    pub fn start(
        local: &StaticKeypair,
        cloud: &PublicKey,
        hello: &Hello,
    ) -> Result<(Self, Vec<u8>), ChannelError> {
        let mut state = noise::initiator(local, cloud, PROLOGUE)?;
        let payload = to_json(hello)?;
        let mut buf = vec![0; MAX_FRAME];
        let n = state.write_message(&payload, &mut buf)?;
        if n > MAX_HELLO_FRAME {
            return Err(ChannelError::TooLarge(n));
        }
        Ok((Self { state }, framed(&buf[..n])))
    }

    /// Reads the cloud's answer (a frame without its prefix).
    ///
    /// # Errors
    /// The answer is not from the cloud we pinned, or is not a [`Welcome`].
    pub fn finish(mut self, frame: &[u8]) -> Result<(Channel, Welcome), ChannelError> {
        let mut buf = vec![0; MAX_FRAME];
        let n = self.state.read_message(frame, &mut buf)?;
        let welcome: Welcome = serde_json::from_slice(&buf[..n])?;
        let remote = remote_static(&self.state)?;
        let transport = self.state.into_transport_mode()?;
        Ok((Channel { transport, remote }, welcome))
    }
}

fn remote_static(state: &snow::HandshakeState) -> Result<PublicKey, ChannelError> {
    let key: [u8; 32] = state
        .get_remote_static()
        .and_then(|k| k.try_into().ok())
        .ok_or(ChannelError::NoStaticKey)?;
    Ok(PublicKey(key))
}

/// The cloud's side of a handshake: the client is authenticated as the holder of
/// [`Self::remote_static`]; whether its certificate passes is the caller's decision, given
/// back with [`Self::answer`].
pub struct ServerHandshake {
    state: snow::HandshakeState,
    remote: PublicKey,
    hello: Hello,
}

impl fmt::Debug for ServerHandshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerHandshake")
            .field("remote", &self.remote)
            .finish_non_exhaustive()
    }
}

impl ServerHandshake {
    /// Reads a client's first message (a frame without its prefix).
    ///
    /// # Errors
    /// Not a control handshake to our key, or its payload is not a [`Hello`].
    pub fn accept(local: &StaticKeypair, frame: &[u8]) -> Result<Self, ChannelError> {
        let mut state = noise::responder(local, PROLOGUE)?;
        let mut buf = vec![0; MAX_FRAME];
        let n = state.read_message(frame, &mut buf)?;
        let hello: Hello = serde_json::from_slice(&buf[..n])?;
        let remote = remote_static(&state)?;
        Ok(Self {
            state,
            remote,
            hello,
        })
    }

    /// The client's static key, proven by the handshake.
    pub const fn remote_static(&self) -> PublicKey {
        self.remote
    }

    /// What the client sent.
    pub const fn hello(&self) -> &Hello {
        &self.hello
    }

    /// Answers; returns the channel and the frame to write. After a [`Welcome::Refused`] the
    /// caller writes the frame and closes.
    ///
    /// # Errors
    /// Noise errors are not expected.
    pub fn answer(mut self, welcome: &Welcome) -> Result<(Channel, Vec<u8>), ChannelError> {
        let payload = to_json(welcome)?;
        let mut buf = vec![0; MAX_FRAME];
        let n = self.state.write_message(&payload, &mut buf)?;
        let transport = self.state.into_transport_mode()?;
        Ok((
            Channel {
                transport,
                remote: self.remote,
            },
            framed(&buf[..n]),
        ))
    }
}

/// An open control channel: messages in both directions, in order, each authenticated.
pub struct Channel {
    transport: snow::TransportState,
    remote: PublicKey,
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Channel")
            .field("remote", &self.remote)
            .finish_non_exhaustive()
    }
}

impl Channel {
    /// The other side's static key.
    pub const fn remote_static(&self) -> PublicKey {
        self.remote
    }

    /// Encrypts `msg`; returns the frame to write (length prefix included).
    ///
    /// # Errors
    /// [`ChannelError::TooLarge`] when the message does not fit one frame.
    pub fn seal<T: Serialize>(&mut self, msg: &T) -> Result<Vec<u8>, ChannelError> {
        let json = to_json(msg)?;
        let mut buf = vec![0; json.len() + TAG];
        let n = self.transport.write_message(&json, &mut buf)?;
        Ok(framed(&buf[..n]))
    }

    /// Decrypts one frame (without its prefix) into a message.
    ///
    /// # Errors
    /// Tampered, replayed, reordered or truncated frames ([`ChannelError::Noise`]: the stream
    /// is unusable after this), or a message of another shape ([`ChannelError::Malformed`]).
    pub fn open<T: DeserializeOwned>(&mut self, frame: &[u8]) -> Result<T, ChannelError> {
        let mut buf = vec![0; frame.len()];
        let n = self.transport.read_message(frame, &mut buf)?;
        Ok(serde_json::from_slice(&buf[..n])?)
    }
}

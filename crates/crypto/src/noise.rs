//! Noise static keys and the one place that names the Noise protocol (snow).

use core::fmt;

use zeroize::Zeroizing;

use crate::pem::{self, PemError};

/// The handshake pattern and primitives of the tunnel (docs/protocol.md §2). IK: the initiator knows
/// the responder's static key in advance (from its certificate), and sends its own static key
/// encrypted in the first message, so identities stay hidden from observers.
pub const NOISE_PARAMS: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";

/// Armor label of a Noise static private key.
pub const NOISE_KEY_LABEL: &str = "CYPHONIC NOISE PRIVATE KEY";

/// A Noise static X25519 public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(pub [u8; 32]);

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// 64 hex digits, as `Display` writes them (and `cyphonic-cloud keygen` prints them).
impl core::str::FromStr for PublicKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut key = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut key).map_err(|_| KeyError::Hex)?;
        Ok(Self(key))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// A Noise static key pair. The private half is wiped on drop and never printed.
pub struct StaticKeypair {
    secret: Zeroizing<[u8; 32]>,
    public: PublicKey,
}

impl fmt::Debug for StaticKeypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKeypair")
            .field("public", &self.public)
            .field("secret", &"[redacted]")
            .finish()
    }
}

/// A damaged or absent Noise key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The armor is damaged or absent.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// The armored bytes are not 32 long.
    #[error("a Noise private key is 32 bytes, found {0}")]
    Length(usize),
    /// The system's random number generator failed.
    #[error("random number generator failed")]
    Rng,
    /// A public key's text is not 64 hex digits.
    #[error("a Noise public key is 64 hex digits")]
    Hex,
}

impl StaticKeypair {
    /// A fresh key pair from the operating system's random number generator.
    ///
    /// # Errors
    /// [`KeyError::Rng`] if the generator fails.
    pub fn generate() -> Result<Self, KeyError> {
        use ring::rand::SecureRandom as _;
        let mut secret = Zeroizing::new([0u8; 32]);
        ring::rand::SystemRandom::new()
            .fill(&mut secret[..])
            .map_err(|_| KeyError::Rng)?;
        Ok(Self::from_secret(secret))
    }

    /// The key pair of a known private key.
    pub fn from_secret(secret: Zeroizing<[u8; 32]>) -> Self {
        let s = x25519_dalek::StaticSecret::from(*secret);
        let public = PublicKey(x25519_dalek::PublicKey::from(&s).to_bytes());
        Self { secret, public }
    }

    /// The public half.
    pub const fn public(&self) -> PublicKey {
        self.public
    }

    /// The private half, for building a Noise handshake; wiped when the pair drops.
    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }

    /// The private key in armor, to store with permissions 0600.
    pub fn to_pem(&self) -> Zeroizing<String> {
        Zeroizing::new(pem::encode(NOISE_KEY_LABEL, &self.secret[..]))
    }

    /// Reads a private key from its armor.
    ///
    /// # Errors
    /// [`KeyError`] for damaged text or a wrong length.
    pub fn from_pem(text: &str) -> Result<Self, KeyError> {
        let bytes = Zeroizing::new(pem::decode_one(text, NOISE_KEY_LABEL)?);
        let secret: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::Length(bytes.len()))?;
        Ok(Self::from_secret(Zeroizing::new(secret)))
    }
}

/// Builds the initiator side of an IK handshake towards `remote`.
///
/// # Errors
/// snow's error; none is expected with valid 32-byte keys.
pub fn initiator(
    local: &StaticKeypair,
    remote: &PublicKey,
    prologue: &[u8],
) -> Result<snow::HandshakeState, snow::Error> {
    snow::Builder::new(params())
        .local_private_key(local.secret())?
        .remote_public_key(&remote.0)?
        .prologue(prologue)?
        .build_initiator()
}

/// Builds the responder side of an IK handshake.
///
/// # Errors
/// snow's error; none is expected with a valid 32-byte key.
pub fn responder(
    local: &StaticKeypair,
    prologue: &[u8],
) -> Result<snow::HandshakeState, snow::Error> {
    snow::Builder::new(params())
        .local_private_key(local.secret())?
        .prologue(prologue)?
        .build_responder()
}

fn params() -> snow::params::NoiseParams {
    NOISE_PARAMS
        .parse()
        .expect("NOISE_PARAMS names a pattern snow supports")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_stay_secret() {
        let kp = StaticKeypair::generate().unwrap();
        let again = StaticKeypair::from_pem(&kp.to_pem()).unwrap();
        assert_eq!(again.public(), kp.public());
        let dbg = format!("{kp:?}");
        assert!(!dbg.contains(&hex::encode(kp.secret())), "{dbg}");
        assert!(matches!(
            StaticKeypair::from_pem(&pem::encode(NOISE_KEY_LABEL, &[1; 31])),
            Err(KeyError::Length(31))
        ));
    }

    #[test]
    fn public_keys_parse_as_they_print_and_nothing_else() {
        let public = StaticKeypair::generate().unwrap().public();
        assert_eq!(public.to_string().parse::<PublicKey>(), Ok(public));
        assert_eq!(format!(" {public}\n").parse::<PublicKey>(), Ok(public));
        let text = public.to_string();
        for bad in [
            "",
            &text[..63],
            &format!("{text}0"),
            &format!("{}g", &text[..63]),
            &"é".repeat(32),
        ] {
            assert_eq!(bad.parse::<PublicKey>(), Err(KeyError::Hex), "{bad:?}");
        }
    }

    /// RFC 7748 §6.1: Alice's private key and public key.
    #[test]
    fn x25519_public_key_rfc7748_6_1() {
        let secret =
            hex_literal::hex!("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let kp = StaticKeypair::from_secret(Zeroizing::new(secret));
        assert_eq!(
            kp.public().0,
            hex_literal::hex!("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
        );
    }

    #[test]
    fn ik_handshake_agrees_on_keys() {
        let (i, r) = (
            StaticKeypair::generate().unwrap(),
            StaticKeypair::generate().unwrap(),
        );
        let mut init = initiator(&i, &r.public(), b"p").unwrap();
        let mut resp = responder(&r, b"p").unwrap();
        let (mut m1, mut m2, mut scratch) = ([0u8; 256], [0u8; 256], [0u8; 256]);
        let n = init.write_message(b"hello", &mut m1).unwrap();
        let p = resp.read_message(&m1[..n], &mut scratch).unwrap();
        assert_eq!(&scratch[..p], b"hello");
        assert_eq!(resp.get_remote_static(), Some(&i.public().0[..]));
        let n = resp.write_message(&[], &mut m2).unwrap();
        init.read_message(&m2[..n], &mut scratch).unwrap();
        assert_eq!(
            init.dangerously_get_raw_split(),
            resp.dangerously_get_raw_split()
        );
    }
}

//! Overlay certificates: an Ed25519 CA binds a node's FQDN, certified vIP blocks, Noise static
//! public key, groups and validity. docs/protocol.md §3 gives the encoding.
//!
//! The encoding is a compact, fixed-order binary record read through a bounds-checked cursor;
//! the text form is that record in PEM-style armor (`pem.rs`). The signature covers a
//! domain-separation context followed by every byte before it.

use core::fmt;
use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use zeroize::Zeroizing;

use crate::pem::{self, PemError};

const MAGIC: &[u8; 3] = b"CYC";
const FORMAT_VERSION: u8 = 1;
const SIGNING_CONTEXT: &[u8] = b"cyphonic certificate v1\0";
const SIGNATURE_LEN: usize = 64;
/// Length of a public key field: X25519 for nodes, Ed25519 for CAs.
pub const PUBLIC_KEY_LEN: usize = 32;
/// Largest encoded certificate. It must fit a handshake message next to the other fields
/// (wire::HANDSHAKE_MAX), so that a handshake never needs fragmentation.
pub const MAX_ENCODED_LEN: usize = 1024;
const MAX_NAME_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;
const MAX_BLOCKS: usize = 16;
const MAX_GROUPS: usize = 32;
const MAX_GROUP_LEN: usize = 63;

/// Armor label of a certificate.
pub const CERT_LABEL: &str = "CYPHONIC CERTIFICATE";
/// Armor label of a CA signing key (PKCS#8 v2, as ring writes it).
pub const CA_KEY_LABEL: &str = "CYPHONIC CA PRIVATE KEY";

/// What a certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CertKind {
    /// A CA: a self-signed root, or an issuing CA a root delegated to (its issuer is the
    /// root's key; the AS signs online with it while the root stays offline). Its key signs
    /// node certificates, its domain and blocks bound theirs.
    Ca,
    /// An adapter or node: its key is the Noise static key used in handshakes.
    Node,
}

impl fmt::Display for CertKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ca => "CA",
            Self::Node => "node",
        })
    }
}

/// SHA-256 of a whole encoded certificate: its identity in revocation lists and logs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    fn of(bytes: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
        let mut out = [0u8; 32];
        out.copy_from_slice(digest.as_ref());
        Self(out)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl core::str::FromStr for Fingerprint {
    type Err = CertError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut out)
            .map_err(|_| CertError::BadFingerprint(s.trim().to_owned()))?;
        Ok(Self(out))
    }
}

/// Everything about certificates that can go wrong: decoding, issuing and verifying.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// The bytes are not a certificate of this format.
    #[error("malformed certificate: {0}")]
    Malformed(&'static str),
    /// The text armor is damaged or absent.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// The encoding exceeds [`MAX_ENCODED_LEN`].
    #[error("certificate of {0} bytes exceeds the {MAX_ENCODED_LEN}-byte limit")]
    TooLarge(usize),
    /// No trusted CA has the issuer key.
    #[error("issued by a CA that is not trusted here")]
    UnknownCa,
    /// The signature does not verify under the issuer's key: forged or tampered.
    #[error("signature does not verify (forged or tampered certificate)")]
    BadSignature,
    /// Used before its validity starts.
    #[error("not valid before {not_before} (unix time), now {now}")]
    NotYetValid {
        /// Start of validity.
        not_before: u64,
        /// The time of the check.
        now: u64,
    },
    /// Used after its validity ended.
    #[error("expired at {not_after} (unix time), now {now}")]
    Expired {
        /// End of validity.
        not_after: u64,
        /// The time of the check.
        now: u64,
    },
    /// The certificate's fingerprint is on the revocation list.
    #[error("certificate {0} is revoked")]
    Revoked(Fingerprint),
    /// The issuing CA's own certificate is on the revocation list.
    #[error("issuing CA certificate {0} is revoked")]
    CaRevoked(Fingerprint),
    /// A CA certificate where a node certificate belongs, or the reverse.
    #[error("expected a {expected} certificate, got a {got} certificate")]
    WrongKind {
        /// What the caller needs.
        expected: CertKind,
        /// What it got.
        got: CertKind,
    },
    /// A vIP block the issuing CA may not certify.
    #[error("vIP block {0} lies outside every block of the issuing CA")]
    BlockOutsideCa(IpNet),
    /// A node name that is not below the issuing CA's domain (the domain itself included).
    #[error("name {name:?} is not below the CA's domain {domain:?}")]
    NameOutsideCa {
        /// The certificate's name.
        name: String,
        /// The CA's domain.
        domain: String,
    },
    /// Validity outside the CA's own validity.
    #[error("validity {not_before}..{not_after} is outside the CA's validity")]
    ValidityOutsideCa {
        /// Requested start.
        not_before: u64,
        /// Requested end.
        not_after: u64,
    },
    /// `not_before` is not before `not_after`.
    #[error("validity is empty: not_before {not_before} >= not_after {not_after}")]
    EmptyValidity {
        /// Requested start.
        not_before: u64,
        /// Requested end.
        not_after: u64,
    },
    /// Not a DNS name (RFC 1035 §2.3.1 letters, digits, hyphens; labels of 1 to 63).
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A group name with characters outside `a-z 0-9 . _ -` or of bad length.
    #[error("invalid group {0:?}: use 1 to 63 of a-z 0-9 . _ -")]
    InvalidGroup(String),
    /// No vIP block, or too many blocks or groups.
    #[error("{0}")]
    BadContent(&'static str),
    /// A CA private key that ring cannot load.
    #[error("CA private key is not a valid Ed25519 PKCS#8 document")]
    InvalidKey,
    /// The CA private key does not belong to the CA certificate.
    #[error("CA private key does not match the CA certificate's public key")]
    KeyMismatch,
    /// Not 64 hex digits.
    #[error("invalid fingerprint {0:?}: expected 64 hex digits")]
    BadFingerprint(String),
    /// A revocation list line that is neither a fingerprint nor a comment.
    #[error("revocation list line {line}: {source}")]
    RevocationLine {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        source: Box<CertError>,
    },
    /// The system's random number generator failed.
    #[error("random number generator failed")]
    Rng,
    /// An issuing CA that another issuing CA signed: chains are one level deep.
    #[error("an issuing CA may not delegate further: chains are root -> issuing CA -> node")]
    ChainTooLong,
}

/// The signed content of a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertBody {
    /// CA or node.
    pub kind: CertKind,
    /// The FQDN of the node (`gw1.ovl.example`), or the overlay domain of a CA (`ovl.example`).
    pub name: String,
    /// For a node, the vIP addresses it may use as inner source (an adapter: its whole LAN
    /// block). For a CA, the ranges it may certify.
    pub vip_blocks: Vec<IpNet>,
    /// Node: Noise static X25519 public key. CA: Ed25519 signing key.
    pub public_key: [u8; PUBLIC_KEY_LEN],
    /// Ed25519 public key of the issuing CA (the CA's own key when self-signed).
    pub issuer: [u8; PUBLIC_KEY_LEN],
    /// Policy groups (`iot`, `ops`), checked by the cloud and by receivers.
    pub groups: Vec<String>,
    /// Start of validity, unix seconds.
    pub not_before: u64,
    /// End of validity (exclusive), unix seconds.
    pub not_after: u64,
}

impl CertBody {
    /// Whether `ip` lies inside one of the certified vIP blocks.
    pub fn covers(&self, ip: IpAddr) -> bool {
        self.vip_blocks.iter().any(|b| b.contains(&ip))
    }

    /// Whether every address of `block` lies inside one certified vIP block.
    pub fn covers_block(&self, block: &IpNet) -> bool {
        self.vip_blocks.iter().any(|b| b.contains(block))
    }

    /// The certified IPv4 blocks, in order.
    pub fn v4_blocks(&self) -> Vec<ipnet::Ipv4Net> {
        self.vip_blocks
            .iter()
            .filter_map(|b| match b {
                IpNet::V4(n) => Some(*n),
                IpNet::V6(_) => None,
            })
            .collect()
    }

    /// Whether the certificate names `group`.
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    fn validate(&self) -> Result<(), CertError> {
        validate_name(&self.name)?;
        if self.vip_blocks.is_empty() {
            return Err(CertError::BadContent(
                "a certificate needs at least one vIP block",
            ));
        }
        if self.vip_blocks.len() > MAX_BLOCKS {
            return Err(CertError::BadContent("more than 16 vIP blocks"));
        }
        if self.groups.len() > MAX_GROUPS {
            return Err(CertError::BadContent("more than 32 groups"));
        }
        for g in &self.groups {
            let ok = !g.is_empty()
                && g.len() <= MAX_GROUP_LEN
                && g.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
            if !ok {
                return Err(CertError::InvalidGroup(g.clone()));
            }
        }
        if self.not_before >= self.not_after {
            return Err(CertError::EmptyValidity {
                not_before: self.not_before,
                not_after: self.not_after,
            });
        }
        Ok(())
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        out.push(FORMAT_VERSION);
        out.push(match self.kind {
            CertKind::Ca => 1,
            CertKind::Node => 2,
        });
        push_short(out, self.name.as_bytes());
        out.push(u8::try_from(self.vip_blocks.len()).expect("validated"));
        for block in &self.vip_blocks {
            match block {
                IpNet::V4(n) => {
                    out.push(4);
                    out.extend_from_slice(&n.addr().octets());
                }
                IpNet::V6(n) => {
                    out.push(6);
                    out.extend_from_slice(&n.addr().octets());
                }
            }
            out.push(block.prefix_len());
        }
        out.extend_from_slice(&self.public_key);
        out.extend_from_slice(&self.issuer);
        out.push(u8::try_from(self.groups.len()).expect("validated"));
        for g in &self.groups {
            push_short(out, g.as_bytes());
        }
        out.extend_from_slice(&self.not_before.to_be_bytes());
        out.extend_from_slice(&self.not_after.to_be_bytes());
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, CertError> {
        if r.take(3)? != MAGIC {
            return Err(CertError::Malformed(
                "not a cyphonic certificate (bad magic)",
            ));
        }
        if r.u8()? != FORMAT_VERSION {
            return Err(CertError::Malformed(
                "unsupported certificate format version",
            ));
        }
        let kind = match r.u8()? {
            1 => CertKind::Ca,
            2 => CertKind::Node,
            _ => return Err(CertError::Malformed("unknown certificate kind")),
        };
        let name = r.short_str()?;
        let n_blocks = usize::from(r.u8()?);
        let mut vip_blocks = Vec::with_capacity(n_blocks.min(MAX_BLOCKS));
        for _ in 0..n_blocks {
            let addr: IpAddr = match r.u8()? {
                4 => IpAddr::from(r.array::<4>()?),
                6 => IpAddr::from(r.array::<16>()?),
                _ => return Err(CertError::Malformed("unknown address family in vIP block")),
            };
            let block = IpNet::new(addr, r.u8()?)
                .map_err(|_| CertError::Malformed("vIP block prefix too long"))?;
            if block.trunc() != block {
                return Err(CertError::Malformed("vIP block has host bits set"));
            }
            vip_blocks.push(block);
        }
        let public_key = r.array()?;
        let issuer = r.array()?;
        let n_groups = usize::from(r.u8()?);
        let mut groups = Vec::with_capacity(n_groups.min(MAX_GROUPS));
        for _ in 0..n_groups {
            groups.push(r.short_str()?);
        }
        let not_before = u64::from_be_bytes(r.array()?);
        let not_after = u64::from_be_bytes(r.array()?);
        let body = Self {
            kind,
            name,
            vip_blocks,
            public_key,
            issuer,
            groups,
            not_before,
            not_after,
        };
        body.validate()
            .map_err(|_| CertError::Malformed("certificate content out of range"))?;
        Ok(body)
    }
}

fn push_short(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(u8::try_from(bytes.len()).expect("validated: at most 253 bytes"));
    out.extend_from_slice(bytes);
}

/// A bounds-checked cursor over untrusted bytes: every read checks its length first.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CertError> {
        if self.buf.len() < n {
            return Err(CertError::Malformed("truncated"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, CertError> {
        Ok(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CertError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn short_str(&mut self) -> Result<String, CertError> {
        let len = usize::from(self.u8()?);
        let bytes = self.take(len)?;
        core::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| CertError::Malformed("text field is not UTF-8"))
    }
}

/// The first of `ours` that overlaps (holds, or lies in) one of `theirs`, with it: two
/// certificates whose blocks overlap would both claim those addresses.
#[must_use]
pub fn first_overlap<'a>(ours: &'a [IpNet], theirs: &'a [IpNet]) -> Option<(&'a IpNet, &'a IpNet)> {
    ours.iter().find_map(|o| {
        theirs
            .iter()
            .find(|t| o.contains(*t) || t.contains(o))
            .map(|t| (o, t))
    })
}

/// Checks that `name` is a lower-case DNS name: labels of 1 to 63 letters, digits and inner
/// hyphens (RFC 1035 §2.3.1, RFC 1123 §2.1 allows a leading digit), 253 bytes at most.
///
/// # Errors
/// [`CertError::InvalidName`] saying what is wrong.
pub fn validate_name(name: &str) -> Result<(), CertError> {
    let bad = |reason| {
        Err(CertError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return bad("must be 1 to 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > MAX_LABEL_LEN {
            return bad("every label must be 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return bad("only lower-case letters, digits, hyphens and dots are allowed");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("a label cannot start or end with a hyphen");
        }
    }
    Ok(())
}

/// A signed certificate with its encoding kept, so its fingerprint and bytes are exact.
#[derive(Clone, PartialEq, Eq)]
pub struct Certificate {
    body: CertBody,
    signature: [u8; SIGNATURE_LEN],
    encoded: Vec<u8>,
}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificate")
            .field("kind", &self.body.kind)
            .field("name", &self.body.name)
            .field("vip_blocks", &self.body.vip_blocks)
            .field("groups", &self.body.groups)
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

impl Certificate {
    /// Decodes a binary certificate. Checks the format only; [`TrustStore::verify`] decides
    /// whether to believe it.
    ///
    /// # Errors
    /// [`CertError::TooLarge`] or [`CertError::Malformed`].
    pub fn decode(bytes: &[u8]) -> Result<Self, CertError> {
        if bytes.len() > MAX_ENCODED_LEN {
            return Err(CertError::TooLarge(bytes.len()));
        }
        let mut r = Reader { buf: bytes };
        let body = CertBody::decode(&mut r)?;
        let signature = r.array()?;
        if !r.buf.is_empty() {
            return Err(CertError::Malformed("trailing bytes after the signature"));
        }
        Ok(Self {
            body,
            signature,
            encoded: bytes.to_vec(),
        })
    }

    /// The binary encoding.
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    /// The signed content.
    pub const fn body(&self) -> &CertBody {
        &self.body
    }

    /// SHA-256 of the encoding.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.encoded)
    }

    /// The text form: the encoding in `CYPHONIC CERTIFICATE` armor.
    pub fn to_pem(&self) -> String {
        pem::encode(CERT_LABEL, &self.encoded)
    }

    /// Reads the first certificate in `text`.
    ///
    /// # Errors
    /// [`CertError::Pem`] or any decoding error.
    pub fn from_pem(text: &str) -> Result<Self, CertError> {
        Self::decode(&pem::decode_one(text, CERT_LABEL)?)
    }

    /// Reads every certificate in `text` (a bundle).
    ///
    /// # Errors
    /// [`CertError::Pem`] or any decoding error.
    pub fn all_from_pem(text: &str) -> Result<Vec<Self>, CertError> {
        pem::decode_all(text, CERT_LABEL)?
            .iter()
            .map(|b| Self::decode(b))
            .collect()
    }

    /// Whether this is a root: a CA certificate its own key signs.
    pub fn is_root(&self) -> bool {
        self.body.kind == CertKind::Ca && self.body.issuer == self.body.public_key
    }

    fn signed_message(&self) -> Vec<u8> {
        let tbs = &self.encoded[..self.encoded.len() - SIGNATURE_LEN];
        [SIGNING_CONTEXT, tbs].concat()
    }

    fn signature_verifies_under(&self, key: &[u8; PUBLIC_KEY_LEN]) -> bool {
        UnparsedPublicKey::new(&ED25519, key)
            .verify(&self.signed_message(), &self.signature)
            .is_ok()
    }

    fn sign(body: CertBody, key: &Ed25519KeyPair) -> Result<Self, CertError> {
        body.validate()?;
        let mut encoded = Vec::with_capacity(256);
        body.encode_into(&mut encoded);
        let signature = key.sign(&[SIGNING_CONTEXT, &encoded].concat());
        encoded.extend_from_slice(signature.as_ref());
        if encoded.len() > MAX_ENCODED_LEN {
            return Err(CertError::TooLarge(encoded.len()));
        }
        let mut sig = [0u8; SIGNATURE_LEN];
        sig.copy_from_slice(signature.as_ref());
        Ok(Self {
            body,
            signature: sig,
            encoded,
        })
    }
}

/// What a CA is asked to certify for a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueRequest {
    /// The node's FQDN, inside the CA's domain.
    pub name: String,
    /// vIP blocks, each inside one of the CA's blocks.
    pub vip_blocks: Vec<IpNet>,
    /// The node's Noise static public key.
    pub public_key: [u8; PUBLIC_KEY_LEN],
    /// Policy groups.
    pub groups: Vec<String>,
    /// Start of validity, unix seconds.
    pub not_before: u64,
    /// End of validity, unix seconds.
    pub not_after: u64,
}

/// The overlay CA: an Ed25519 key pair and its self-signed certificate. Offline tooling
/// (`cyphonic-cloud ca`) holds it; nodes only ever see the certificate.
pub struct CertificateAuthority {
    key: Ed25519KeyPair,
    pkcs8: Zeroizing<Vec<u8>>,
    cert: Certificate,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("cert", &self.cert)
            .field("key", &"[redacted]")
            .finish()
    }
}

impl CertificateAuthority {
    /// Creates a CA for overlay domain `domain`, allowed to certify `vip_blocks`.
    ///
    /// # Errors
    /// Invalid content, or a failing random number generator.
    pub fn generate(
        domain: &str,
        vip_blocks: &[IpNet],
        not_before: u64,
        not_after: u64,
    ) -> Result<Self, CertError> {
        let (key, pkcs8, public_key) = new_signing_key()?;
        let body = CertBody {
            kind: CertKind::Ca,
            name: domain.to_owned(),
            vip_blocks: vip_blocks.iter().map(IpNet::trunc).collect(),
            public_key,
            issuer: public_key,
            groups: Vec::new(),
            not_before,
            not_after,
        };
        let cert = Certificate::sign(body, &key)?;
        Ok(Self { key, pkcs8, cert })
    }

    /// Loads a CA from its armored private key and certificate.
    ///
    /// # Errors
    /// Damaged text, a key ring cannot load, or a key that does not match the certificate.
    pub fn from_pem(key_pem: &str, cert_pem: &str) -> Result<Self, CertError> {
        Self::from_pkcs8(&pem::decode_one(key_pem, CA_KEY_LABEL)?, cert_pem)
    }

    /// Loads a CA from its private key (PKCS#8 v1 or v2, DER:
    /// [`CertificateAuthority::pkcs8`]) and its armored certificate.
    ///
    /// # Errors
    /// Not an Ed25519 key, damaged certificate text, or a key that does not match the
    /// certificate.
    pub fn from_pkcs8(pkcs8: &[u8], cert_pem: &str) -> Result<Self, CertError> {
        let pkcs8 = Zeroizing::new(pkcs8.to_vec());
        // v2 (with the public key, checked against the private one) or v1 (without: it is
        // derived); either way it must be the certificate's, below.
        let key = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&pkcs8)
            .map_err(|_| CertError::InvalidKey)?;
        let cert = Certificate::from_pem(cert_pem)?;
        if cert.body.kind != CertKind::Ca {
            return Err(CertError::WrongKind {
                expected: CertKind::Ca,
                got: cert.body.kind,
            });
        }
        if key.public_key().as_ref() != cert.body.public_key {
            return Err(CertError::KeyMismatch);
        }
        // A root signs itself; an issuing CA's signature is checked by whoever trusts it,
        // against its root (TrustStore).
        if cert.is_root() && !cert.signature_verifies_under(&cert.body.public_key) {
            return Err(CertError::BadSignature);
        }
        Ok(Self { key, pkcs8, cert })
    }

    /// Creates an issuing CA under this root: a new key whose certificate, signed here, may
    /// certify names below `domain` (this CA's domain or one below it) and addresses inside
    /// `vip_blocks` (inside this CA's), from `not_before` to `not_after` (inside this CA's
    /// validity). The cloud's AS issues online with it; the root's key can stay offline.
    ///
    /// # Errors
    /// This CA is itself an issuing CA, or the content lies outside it.
    pub fn delegate(
        &self,
        domain: &str,
        vip_blocks: &[IpNet],
        not_before: u64,
        not_after: u64,
    ) -> Result<Self, CertError> {
        let root = &self.cert.body;
        if !self.cert.is_root() {
            return Err(CertError::ChainTooLong);
        }
        if domain != root.name && !is_below_domain(domain, &root.name) {
            return Err(CertError::NameOutsideCa {
                name: domain.to_owned(),
                domain: root.name.clone(),
            });
        }
        let blocks: Vec<IpNet> = vip_blocks.iter().map(IpNet::trunc).collect();
        if let Some(b) = blocks.iter().find(|b| !root.covers_block(b)) {
            return Err(CertError::BlockOutsideCa(*b));
        }
        if not_before < root.not_before || not_after > root.not_after {
            return Err(CertError::ValidityOutsideCa {
                not_before,
                not_after,
            });
        }
        let (key, pkcs8, public_key) = new_signing_key()?;
        let body = CertBody {
            kind: CertKind::Ca,
            name: domain.to_owned(),
            vip_blocks: blocks,
            public_key,
            issuer: root.public_key,
            groups: Vec::new(),
            not_before,
            not_after,
        };
        let cert = Certificate::sign(body, &self.key)?;
        Ok(Self { key, pkcs8, cert })
    }

    /// This root's certificate again, for the same key, name and validity, with `added`
    /// among its blocks (those it does not cover yet): an overlay made before IPv6 gains its
    /// IPv6 /48 (`ca add-block`, docs/protocol.md §7). Whatever the old certificate
    /// certified verifies under the new one, whose key it names; a trust store may hold
    /// both while the new one spreads.
    ///
    /// # Errors
    /// This CA is an issuing CA ([`CertError::ChainTooLong`]), or the certificate does not
    /// sign (too many blocks).
    pub fn with_blocks_added(&self, added: &[IpNet]) -> Result<Self, CertError> {
        if !self.cert.is_root() {
            return Err(CertError::ChainTooLong);
        }
        let mut body = self.cert.body.clone();
        for b in added.iter().map(IpNet::trunc) {
            if !body.covers_block(&b) {
                body.vip_blocks.push(b);
            }
        }
        let cert = Certificate::sign(body, &self.key)?;
        let key = Ed25519KeyPair::from_pkcs8(&self.pkcs8).map_err(|_| CertError::InvalidKey)?;
        Ok(Self {
            key,
            pkcs8: self.pkcs8.clone(),
            cert,
        })
    }

    /// The CA's certificate: a root's is self-signed and every node trusts it; an issuing
    /// CA's travels with what it issues (in the cloud's welcome, and in enrollment).
    pub const fn certificate(&self) -> &Certificate {
        &self.cert
    }

    /// The private key in armor; keep it offline. Wiped from memory when dropped.
    pub fn key_pem(&self) -> Zeroizing<String> {
        Zeroizing::new(pem::encode(CA_KEY_LABEL, &self.pkcs8))
    }

    /// The private key, PKCS#8 (DER), for a tool that stores it otherwise (protected by a
    /// passphrase, say). Wiped from memory when the CA is dropped.
    pub fn pkcs8(&self) -> &[u8] {
        &self.pkcs8
    }

    /// Signs a node certificate. The CA refuses what it could not vouch for: names outside its
    /// domain, blocks outside its blocks, validity outside its own.
    ///
    /// # Errors
    /// Any content error, with the offending value.
    pub fn issue(&self, req: &IssueRequest) -> Result<Certificate, CertError> {
        let ca = &self.cert.body;
        if !is_below_domain(&req.name, &ca.name) {
            return Err(CertError::NameOutsideCa {
                name: req.name.clone(),
                domain: ca.name.clone(),
            });
        }
        let blocks: Vec<IpNet> = req.vip_blocks.iter().map(IpNet::trunc).collect();
        if let Some(b) = blocks.iter().find(|b| !ca.covers_block(b)) {
            return Err(CertError::BlockOutsideCa(*b));
        }
        if req.not_before < ca.not_before || req.not_after > ca.not_after {
            return Err(CertError::ValidityOutsideCa {
                not_before: req.not_before,
                not_after: req.not_after,
            });
        }
        let body = CertBody {
            kind: CertKind::Node,
            name: req.name.clone(),
            vip_blocks: blocks,
            public_key: req.public_key,
            issuer: ca.public_key,
            groups: req.groups.clone(),
            not_before: req.not_before,
            not_after: req.not_after,
        };
        Certificate::sign(body, &self.key)
    }
}

/// A CA's Ed25519 key, its PKCS#8 document (wiped when dropped) and its public half.
type SigningKey = (Ed25519KeyPair, Zeroizing<Vec<u8>>, [u8; PUBLIC_KEY_LEN]);

/// A fresh Ed25519 key for a CA.
fn new_signing_key() -> Result<SigningKey, CertError> {
    let rng = ring::rand::SystemRandom::new();
    let doc = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| CertError::Rng)?;
    let pkcs8 = Zeroizing::new(doc.as_ref().to_vec());
    let key = Ed25519KeyPair::from_pkcs8(&pkcs8).map_err(|_| CertError::InvalidKey)?;
    let mut public_key = [0u8; PUBLIC_KEY_LEN];
    public_key.copy_from_slice(key.public_key().as_ref());
    Ok((key, pkcs8, public_key))
}

/// Whether `name` lies below `domain` (not `domain` itself: a node named after the overlay
/// domain could host every name one label below it, its siblings' among them).
fn is_below_domain(name: &str, domain: &str) -> bool {
    name.strip_suffix(domain)
        .and_then(|rest| rest.strip_suffix('.'))
        .is_some_and(|label| !label.is_empty())
}

/// A set of revoked certificate fingerprints. Text form: one hex fingerprint per line,
/// `#` starts a comment, blank lines are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RevocationList {
    revoked: HashSet<Fingerprint>,
}

impl RevocationList {
    /// Parses the text form.
    ///
    /// # Errors
    /// [`CertError::RevocationLine`] naming the first bad line.
    pub fn parse(text: &str) -> Result<Self, CertError> {
        let mut revoked = HashSet::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let fp = line.parse().map_err(|e| CertError::RevocationLine {
                line: i + 1,
                source: Box::new(e),
            })?;
            revoked.insert(fp);
        }
        Ok(Self { revoked })
    }

    /// Adds a fingerprint; returns whether it was new.
    pub fn revoke(&mut self, fp: Fingerprint) -> bool {
        self.revoked.insert(fp)
    }

    /// Whether `fp` is revoked.
    pub fn contains(&self, fp: &Fingerprint) -> bool {
        self.revoked.contains(fp)
    }

    /// Number of revoked fingerprints.
    pub fn len(&self) -> usize {
        self.revoked.len()
    }

    /// Whether nothing is revoked.
    pub fn is_empty(&self) -> bool {
        self.revoked.is_empty()
    }

    /// The text form, sorted so that it diffs well.
    pub fn to_text(&self) -> String {
        let mut fps: Vec<_> = self.revoked.iter().collect();
        fps.sort();
        fps.iter().map(|fp| format!("{fp}\n")).collect()
    }
}

/// The CAs a node trusts, and what they revoked.
#[derive(Debug, Clone, Default)]
pub struct TrustStore {
    cas: Vec<Certificate>,
    revoked: RevocationList,
}

impl TrustStore {
    /// Trusts these CA certificates: self-signed roots, and issuing CAs each signed by one of
    /// those roots and inside it (domain, blocks, validity). A chain is one level deep.
    ///
    /// # Errors
    /// [`CertError::WrongKind`] or [`CertError::BadSignature`] for a bad root; for an issuing
    /// CA, [`CertError::UnknownCa`] (its root is not among `cas`) or what [`Self::add_issuer`]
    /// says.
    pub fn new(cas: Vec<Certificate>, revoked: RevocationList) -> Result<Self, CertError> {
        let (roots, issuing): (Vec<_>, Vec<_>) = cas.into_iter().partition(Certificate::is_root);
        for ca in &roots {
            if ca.body.kind != CertKind::Ca {
                return Err(CertError::WrongKind {
                    expected: CertKind::Ca,
                    got: ca.body.kind,
                });
            }
            if !ca.signature_verifies_under(&ca.body.public_key) {
                return Err(CertError::BadSignature);
            }
        }
        let mut store = Self {
            cas: roots,
            revoked,
        };
        for ca in issuing {
            store.add_issuer(ca)?;
        }
        Ok(store)
    }

    /// Trusts an issuing CA (one the cloud's AS signs with): a CA certificate signed by one of
    /// our roots, naming the root's domain or one below it, its blocks inside the root's and
    /// its validity inside the root's. Returns whether it was new. (Whether it or its root is
    /// revoked or out of date is checked with every certificate it issued.)
    ///
    /// # Errors
    /// Not a CA certificate, no trusted root signed it, the signature or the constraints do
    /// not hold, or a root's key signed it as an issuing CA's issuing CA.
    pub fn add_issuer(&mut self, ca: Certificate) -> Result<bool, CertError> {
        let body = &ca.body;
        if body.kind != CertKind::Ca {
            return Err(CertError::WrongKind {
                expected: CertKind::Ca,
                got: body.kind,
            });
        }
        if ca.is_root() {
            return Err(CertError::UnknownCa);
        }
        let root = match self.signer(body) {
            Some(r) if r.is_root() => r,
            Some(_) => return Err(CertError::ChainTooLong),
            None => return Err(CertError::UnknownCa),
        };
        if !ca.signature_verifies_under(&root.body.public_key) {
            return Err(CertError::BadSignature);
        }
        if body.name != root.body.name && !is_below_domain(&body.name, &root.body.name) {
            return Err(CertError::NameOutsideCa {
                name: body.name.clone(),
                domain: root.body.name.clone(),
            });
        }
        if let Some(b) = body.vip_blocks.iter().find(|b| !root.body.covers_block(b)) {
            return Err(CertError::BlockOutsideCa(*b));
        }
        if body.not_before < root.body.not_before || body.not_after > root.body.not_after {
            return Err(CertError::ValidityOutsideCa {
                not_before: body.not_before,
                not_after: body.not_after,
            });
        }
        if self.cas.iter().any(|c| c == &ca) {
            return Ok(false);
        }
        self.cas.push(ca);
        Ok(true)
    }

    /// The trusted CA whose key signed `body`: of several with that key (a root re-issued
    /// with more blocks, [`CertificateAuthority::with_blocks_added`], while both are
    /// trusted), the first that covers every block of `body`, else the first.
    fn signer(&self, body: &CertBody) -> Option<&Certificate> {
        let mut same_key = self
            .cas
            .iter()
            .filter(|ca| ca.body.public_key == body.issuer);
        let first = same_key.clone().next();
        same_key
            .find(|ca| body.vip_blocks.iter().all(|b| ca.body.covers_block(b)))
            .or(first)
    }

    /// The revocation list.
    pub const fn revocations(&self) -> &RevocationList {
        &self.revoked
    }

    /// The revocation list, to add to it as the cloud publishes revocations.
    pub fn revocations_mut(&mut self) -> &mut RevocationList {
        &mut self.revoked
    }

    /// The trusted CA certificates: roots and issuing CAs.
    pub fn cas(&self) -> &[Certificate] {
        &self.cas
    }

    /// Decides whether to believe a node certificate at unix time `now`: issued by a trusted CA
    /// (a root, or an issuing CA under one), signature valid, neither it nor any CA above it
    /// revoked, inside its validity and theirs, its name and blocks inside its issuer's.
    ///
    /// # Errors
    /// The first check that fails, as a typed reason.
    pub fn verify(&self, cert: &Certificate, now: u64) -> Result<(), CertError> {
        let body = &cert.body;
        if body.kind != CertKind::Node {
            return Err(CertError::WrongKind {
                expected: CertKind::Node,
                got: body.kind,
            });
        }
        let ca = self.signer(body).ok_or(CertError::UnknownCa)?;
        if !cert.signature_verifies_under(&ca.body.public_key) {
            return Err(CertError::BadSignature);
        }
        // An issuing CA was checked against its root when it was trusted; the root is
        // still there (the list only grows), and must be neither revoked nor out of date.
        let root = if ca.is_root() {
            None
        } else {
            Some(
                self.signer(&ca.body)
                    .filter(|r| r.is_root())
                    .ok_or(CertError::UnknownCa)?,
            )
        };
        for c in [Some(ca), root].into_iter().flatten() {
            let ca_fp = c.fingerprint();
            if self.revoked.contains(&ca_fp) {
                return Err(CertError::CaRevoked(ca_fp));
            }
        }
        let fp = cert.fingerprint();
        if self.revoked.contains(&fp) {
            return Err(CertError::Revoked(fp));
        }
        for validity in [Some(body), Some(&ca.body), root.map(|r| &r.body)]
            .into_iter()
            .flatten()
        {
            if now < validity.not_before {
                return Err(CertError::NotYetValid {
                    not_before: validity.not_before,
                    now,
                });
            }
            if now >= validity.not_after {
                return Err(CertError::Expired {
                    not_after: validity.not_after,
                    now,
                });
            }
        }
        if !is_below_domain(&body.name, &ca.body.name) {
            return Err(CertError::NameOutsideCa {
                name: body.name.clone(),
                domain: ca.body.name.clone(),
            });
        }
        if let Some(b) = body.vip_blocks.iter().find(|b| !ca.body.covers_block(b)) {
            return Err(CertError::BlockOutsideCa(*b));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_overlap_finds_a_block_that_holds_or_lies_in_another() {
        let nets = |v: &[&str]| -> Vec<IpNet> { v.iter().map(|n| n.parse().unwrap()).collect() };
        let ours = nets(&["100.64.1.0/24", "100.64.1.128/25"]);
        let (a, b) = (nets(&["100.64.1.0/25"]), nets(&["100.64.0.0/16"]));
        // Lies in, holds, and neither (next to each other, or another family).
        assert_eq!(first_overlap(&ours, &a), Some((&ours[0], &a[0])));
        assert_eq!(first_overlap(&ours, &b), Some((&ours[0], &b[0])));
        let apart = nets(&["100.64.2.0/24", "fd7a::/48"]);
        assert_eq!(first_overlap(&ours, &apart), None);
        assert_eq!(first_overlap(&[], &ours), None);
    }

    const T0: u64 = 1_800_000_000;
    const YEAR: u64 = 365 * 24 * 3600;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ca() -> CertificateAuthority {
        CertificateAuthority::generate("ovl.example", &[net("100.64.0.0/10")], T0, T0 + 10 * YEAR)
            .unwrap()
    }

    fn request(name: &str, block: &str) -> IssueRequest {
        IssueRequest {
            name: name.into(),
            vip_blocks: vec![net(block)],
            public_key: [9u8; 32],
            groups: vec!["iot".into(), "site-1".into()],
            not_before: T0,
            not_after: T0 + YEAR,
        }
    }

    fn trust(ca: &CertificateAuthority) -> TrustStore {
        TrustStore::new(vec![ca.certificate().clone()], RevocationList::default()).unwrap()
    }

    /// A root made before IPv6 gains an IPv6 /48 by a new certificate for its key: what the
    /// old one issued verifies under the new one, a new IPv6 block verifies only where the
    /// new one is trusted, and a store with both picks the one that covers (an issuing CA
    /// too).
    #[test]
    fn a_root_given_an_ipv6_block_keeps_what_it_issued_and_certifies_the_block() {
        let old = ca();
        let v4 = old
            .issue(&request("gw1.ovl.example", "100.64.1.0/24"))
            .unwrap();
        let new = old.with_blocks_added(&[net("fd7a:1::/48")]).unwrap();
        assert_eq!(
            new.certificate().body().public_key,
            old.certificate().body().public_key
        );
        assert_eq!(new.certificate().body().vip_blocks.len(), 2);
        assert_ne!(
            new.certificate().fingerprint(),
            old.certificate().fingerprint()
        );
        let mut dual = request("gw2.ovl.example", "100.64.2.0/24");
        dual.vip_blocks.push(net("fd7a:1:0:200::/56"));
        let v6 = new.issue(&dual).unwrap();
        let now = T0 + 10;
        assert!(matches!(
            trust(&old).verify(&v6, now),
            Err(CertError::BlockOutsideCa(_))
        ));
        for store in [
            trust(&new),
            TrustStore::new(
                vec![old.certificate().clone(), new.certificate().clone()],
                RevocationList::default(),
            )
            .unwrap(),
        ] {
            store.verify(&v4, now).unwrap();
            store.verify(&v6, now).unwrap();
        }
        // An issuing CA with the IPv6 block, beside the old root first.
        let issuing = new
            .delegate(
                "ovl.example",
                &[net("100.64.0.0/10"), net("fd7a:1::/48")],
                T0,
                T0 + YEAR,
            )
            .unwrap();
        let mut both = TrustStore::new(
            vec![old.certificate().clone(), new.certificate().clone()],
            RevocationList::default(),
        )
        .unwrap();
        assert_eq!(both.add_issuer(issuing.certificate().clone()), Ok(true));
        let mut issued = request("n1.ovl.example", "fd7a:1:0:4000::5/128");
        issued.vip_blocks.push(net("100.64.5.5/32"));
        both.verify(&issuing.issue(&issued).unwrap(), now).unwrap();
        // An issuing CA cannot grow its blocks itself.
        assert_eq!(
            issuing.with_blocks_added(&[net("fd7a:2::/48")]).err(),
            Some(CertError::ChainTooLong)
        );
    }

    #[test]
    fn issue_encode_decode_verify() {
        let ca = ca();
        let cert = ca
            .issue(&request("gw1.ovl.example", "100.64.1.0/24"))
            .unwrap();
        assert!(
            cert.encoded().len() < 300,
            "compact: {} bytes",
            cert.encoded().len()
        );
        let again = Certificate::from_pem(&cert.to_pem()).unwrap();
        assert_eq!(again, cert);
        assert_eq!(again.fingerprint(), cert.fingerprint());
        let store = trust(&ca);
        store.verify(&again, T0 + 10).unwrap();
        let body = again.body();
        assert!(body.covers("100.64.1.77".parse().unwrap()));
        assert!(!body.covers("100.64.2.1".parse().unwrap()));
        assert!(body.in_group("iot") && !body.in_group("ops"));
    }

    #[test]
    fn verification_failures_are_typed() {
        let ca = ca();
        let other =
            CertificateAuthority::generate("ovl.example", &[net("100.64.0.0/10")], T0, T0 + YEAR)
                .unwrap();
        let cert = ca
            .issue(&request("gw1.ovl.example", "100.64.1.0/24"))
            .unwrap();
        let store = trust(&ca);

        assert_eq!(trust(&other).verify(&cert, T0), Err(CertError::UnknownCa));
        assert_eq!(
            store.verify(&cert, T0 - 1),
            Err(CertError::NotYetValid {
                not_before: T0,
                now: T0 - 1
            })
        );
        assert_eq!(
            store.verify(&cert, T0 + YEAR),
            Err(CertError::Expired {
                not_after: T0 + YEAR,
                now: T0 + YEAR
            })
        );
        assert_eq!(
            store.verify(ca.certificate(), T0),
            Err(CertError::WrongKind {
                expected: CertKind::Node,
                got: CertKind::Ca
            })
        );

        let mut revoking = store.clone();
        assert!(revoking.revocations_mut().revoke(cert.fingerprint()));
        assert_eq!(
            revoking.verify(&cert, T0),
            Err(CertError::Revoked(cert.fingerprint()))
        );
        let mut ca_revoked = store.clone();
        ca_revoked
            .revocations_mut()
            .revoke(ca.certificate().fingerprint());
        assert_eq!(
            ca_revoked.verify(&cert, T0),
            Err(CertError::CaRevoked(ca.certificate().fingerprint()))
        );
    }

    #[test]
    fn any_flipped_byte_is_refused() {
        let ca = ca();
        let cert = ca
            .issue(&request("gw1.ovl.example", "100.64.1.0/24"))
            .unwrap();
        let store = trust(&ca);
        for i in 0..cert.encoded().len() {
            for bit in [0x01u8, 0x80] {
                let mut bytes = cert.encoded().to_vec();
                bytes[i] ^= bit;
                match Certificate::decode(&bytes) {
                    Err(CertError::Malformed(_)) => {}
                    Err(e) => panic!("byte {i}: unexpected decode error {e}"),
                    Ok(t) => assert!(
                        store.verify(&t, T0 + 1).is_err(),
                        "tampered byte {i} accepted"
                    ),
                }
            }
        }
    }

    #[test]
    fn truncations_and_garbage_are_malformed() {
        let ca = ca();
        let bytes = ca
            .issue(&request("gw1.ovl.example", "100.64.1.0/24"))
            .unwrap()
            .encoded()
            .to_vec();
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    Certificate::decode(&bytes[..len]),
                    Err(CertError::Malformed(_))
                ),
                "len {len}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            Certificate::decode(&long),
            Err(CertError::Malformed("trailing bytes after the signature"))
        );
        assert_eq!(
            Certificate::decode(&[0u8; 2000]),
            Err(CertError::TooLarge(2000))
        );
    }

    #[test]
    fn the_ca_refuses_what_it_cannot_vouch_for() {
        let ca = ca();
        let check = |req: &IssueRequest, expect: CertError| assert_eq!(ca.issue(req), Err(expect));
        check(
            &request("gw1.other.example", "100.64.1.0/24"),
            CertError::NameOutsideCa {
                name: "gw1.other.example".into(),
                domain: "ovl.example".into(),
            },
        );
        check(
            &request("gw1.xovl.example", "100.64.1.0/24"),
            CertError::NameOutsideCa {
                name: "gw1.xovl.example".into(),
                domain: "ovl.example".into(),
            },
        );
        // The domain itself: such a node could host every sibling's name.
        let squat = CertError::NameOutsideCa {
            name: "ovl.example".into(),
            domain: "ovl.example".into(),
        };
        check(&request("ovl.example", "100.64.1.0/24"), squat.clone());
        // One an older CA signed anyway does not verify either.
        let body = CertBody {
            name: "ovl.example".into(),
            ..ca.issue(&request("gw1.ovl.example", "100.64.1.0/24"))
                .unwrap()
                .body
        };
        let forged = Certificate::sign(body, &ca.key).unwrap();
        let trust =
            TrustStore::new(vec![ca.certificate().clone()], RevocationList::default()).unwrap();
        assert_eq!(trust.verify(&forged, forged.body.not_before), Err(squat));
        check(
            &request("gw1.ovl.example", "10.0.0.0/24"),
            CertError::BlockOutsideCa(net("10.0.0.0/24")),
        );
        check(
            &request("gw1.ovl.example", "100.0.0.0/8"),
            CertError::BlockOutsideCa(net("100.0.0.0/8")),
        );
        check(
            &request("GW1.ovl.example", "100.64.1.0/24"),
            CertError::InvalidName {
                name: "GW1.ovl.example".into(),
                reason: "only lower-case letters, digits, hyphens and dots are allowed",
            },
        );
        check(
            &request("-gw.ovl.example", "100.64.1.0/24"),
            CertError::InvalidName {
                name: "-gw.ovl.example".into(),
                reason: "a label cannot start or end with a hyphen",
            },
        );
        let mut r = request("gw1.ovl.example", "100.64.1.0/24");
        r.not_after = T0 + 11 * YEAR;
        check(
            &r,
            CertError::ValidityOutsideCa {
                not_before: T0,
                not_after: T0 + 11 * YEAR,
            },
        );
        let mut r = request("gw1.ovl.example", "100.64.1.0/24");
        r.groups = vec!["Ops!".into()];
        check(&r, CertError::InvalidGroup("Ops!".into()));
        let mut r = request("gw1.ovl.example", "100.64.1.0/24");
        r.vip_blocks.clear();
        check(
            &r,
            CertError::BadContent("a certificate needs at least one vIP block"),
        );
        let mut r = request("gw1.ovl.example", "100.64.1.0/24");
        r.not_after = r.not_before;
        check(
            &r,
            CertError::EmptyValidity {
                not_before: T0,
                not_after: T0,
            },
        );
    }

    #[test]
    fn host_bits_are_cleared_on_issue() {
        let cert = ca()
            .issue(&request("n.ovl.example", "100.64.1.9/24"))
            .unwrap();
        assert_eq!(cert.body().vip_blocks, vec![net("100.64.1.0/24")]);
    }

    #[test]
    fn ca_reloads_from_its_text_form() {
        let ca = ca();
        let reloaded =
            CertificateAuthority::from_pem(&ca.key_pem(), &ca.certificate().to_pem()).unwrap();
        let cert = reloaded
            .issue(&request("gw2.ovl.example", "100.64.2.0/24"))
            .unwrap();
        trust(&ca).verify(&cert, T0).unwrap();
        let other = self::ca();
        assert_eq!(
            CertificateAuthority::from_pem(&other.key_pem(), &ca.certificate().to_pem())
                .unwrap_err(),
            CertError::KeyMismatch
        );
        assert!(!format!("{ca:?}").contains(&*ca.key_pem()));
    }

    #[test]
    fn revocation_list_text() {
        let fp = Fingerprint([0xab; 32]);
        let text = format!("# revoked 2026-11-01\n\n{fp}  # stolen laptop\n");
        let list = RevocationList::parse(&text).unwrap();
        assert!(list.contains(&fp) && list.len() == 1);
        assert_eq!(RevocationList::parse(&list.to_text()).unwrap(), list);
        let err = RevocationList::parse("# ok\nnot-hex\n").unwrap_err();
        assert!(
            matches!(err, CertError::RevocationLine { line: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn names() {
        for ok in ["a", "ovl.example", "sensor-1.gw1.ovl.example", "1x.example"] {
            validate_name(ok).unwrap();
        }
        let long_label = "a".repeat(64);
        let long_name = [
            "a".repeat(63),
            "a".repeat(63),
            "a".repeat(63),
            "a".repeat(63),
        ]
        .join(".");
        for bad in [
            "",
            "a..b",
            ".a",
            "a.",
            "a_b",
            "a b",
            "é.example",
            &long_label,
            &long_name,
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(!is_below_domain("ovl.example", "ovl.example"));
        assert!(!is_below_domain(".ovl.example", "ovl.example"));
        assert!(is_below_domain("a.ovl.example", "ovl.example"));
        assert!(is_below_domain("b.a.ovl.example", "ovl.example"));
        assert!(!is_below_domain("aovl.example", "ovl.example"));
    }

    /// root -> issuing CA -> node: the node verifies where the issuing CA is trusted, under
    /// the issuing CA's constraints; revoking or expiring either CA above it ends it; the
    /// issuing CA cannot delegate, nor step outside its root.
    #[test]
    fn an_issuing_ca_chains_to_its_root_and_stays_inside_it() {
        let root = ca();
        let issuing = root
            .delegate("ovl.example", &[net("100.64.128.0/17")], T0, T0 + YEAR)
            .unwrap();
        assert!(!issuing.certificate().is_root() && root.certificate().is_root());
        let cert = issuing
            .issue(&request("gw9.ovl.example", "100.64.130.0/24"))
            .unwrap();
        // Only the root: the issuing CA is unknown.
        assert_eq!(
            trust(&root).verify(&cert, T0 + 10),
            Err(CertError::UnknownCa)
        );
        let both = vec![root.certificate().clone(), issuing.certificate().clone()];
        let store = TrustStore::new(both.clone(), RevocationList::default()).unwrap();
        store.verify(&cert, T0 + 10).unwrap();
        // Learned later, as a client learns it from the cloud.
        let mut learned = trust(&root);
        assert_eq!(learned.add_issuer(issuing.certificate().clone()), Ok(true));
        assert_eq!(learned.add_issuer(issuing.certificate().clone()), Ok(false));
        learned.verify(&cert, T0 + 10).unwrap();
        // Outside the issuing CA's blocks, though inside the root's.
        assert!(matches!(
            issuing.issue(&request("gw8.ovl.example", "100.64.1.0/24")),
            Err(CertError::BlockOutsideCa(_))
        ));
        // Its validity ends: so does the node's.
        assert!(matches!(
            store.verify(&cert, T0 + YEAR),
            Err(CertError::Expired { .. })
        ));
        // Revoked, the issuing CA or the root, the node goes with it.
        for revoked in [issuing.certificate(), root.certificate()] {
            let mut list = RevocationList::default();
            list.revoke(revoked.fingerprint());
            let store = TrustStore::new(both.clone(), list).unwrap();
            assert!(matches!(
                store.verify(&cert, T0 + 10),
                Err(CertError::CaRevoked(_))
            ));
        }
        // No further delegation, and nothing outside the root.
        assert_eq!(
            issuing
                .delegate("ovl.example", &[net("100.64.128.0/18")], T0, T0 + YEAR)
                .unwrap_err(),
            CertError::ChainTooLong
        );
        assert!(matches!(
            root.delegate("other.example", &[net("100.64.0.0/16")], T0, T0 + YEAR),
            Err(CertError::NameOutsideCa { .. })
        ));
        assert!(matches!(
            root.delegate("ovl.example", &[net("10.0.0.0/8")], T0, T0 + YEAR),
            Err(CertError::BlockOutsideCa(_))
        ));
        // An issuing CA of another root is not believed.
        let other = CertificateAuthority::generate(
            "ovl.example",
            &[net("100.64.0.0/10")],
            T0,
            T0 + 10 * YEAR,
        )
        .unwrap();
        let stranger = other
            .delegate("ovl.example", &[net("100.64.0.0/16")], T0, T0 + YEAR)
            .unwrap();
        assert_eq!(
            trust(&root).add_issuer(stranger.certificate().clone()),
            Err(CertError::UnknownCa)
        );
        // The issuing CA's key and certificate load back.
        let again =
            CertificateAuthority::from_pem(&issuing.key_pem(), &issuing.certificate().to_pem())
                .unwrap();
        assert_eq!(again.certificate(), issuing.certificate());
    }
}

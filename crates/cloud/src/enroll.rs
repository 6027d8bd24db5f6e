//! The AS's online half (docs/protocol.md §4, Enrollment and Renewal): enrollment tokens,
//! block allocation, and issuing with the issuing CA a root delegated to (the root's key
//! stays offline). Sans-IO: the store and the sessions are the callers'.

use core::fmt;

use cyphonic_crypto::{CertBody, Certificate, CertificateAuthority, IssueRequest};
use ipnet::IpNet;

use crate::store::TokenRow;

/// Certificates start this long before now: a client whose clock is a little behind the
/// cloud's does not refuse the certificate it was just given.
pub const SKEW: u64 = 60;
/// A token lives this long unless told otherwise.
pub const TOKEN_EXPIRY: u64 = 24 * 3600;
/// The longest a token may live.
pub const MAX_TOKEN_EXPIRY: u64 = 30 * 24 * 3600;
/// The shortest certificate lifetime (renewal runs at two thirds of it).
pub const MIN_LIFETIME: u64 = 30;

/// An enrollment token: `<id>.<secret>`, the id 16 hex digits (names the token; not secret),
/// the secret 64 hex digits (32 random bytes; the registry keeps only its SHA-256).
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// Names the token.
    pub id: String,
    secret: [u8; 32],
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.id, hex::encode(self.secret))
    }
}

/// Why a token is not accepted; the words go back to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not `<16 hex>.<64 hex>`.
    #[error("the enrollment token is malformed (expected <16 hex digits>.<64 hex digits>)")]
    Malformed,
    /// No such token, or the secret does not match (the same words for both).
    #[error("the enrollment token is not known here")]
    Unknown,
    /// Redeemed before.
    #[error("the enrollment token has been used already")]
    Used,
    /// Past its expiry.
    #[error("the enrollment token has expired")]
    Expired,
    /// Revoked by an operator.
    #[error("the enrollment token has been revoked")]
    Revoked,
}

impl Token {
    /// A new random token.
    ///
    /// # Errors
    /// The system's random number generator failed.
    pub fn generate() -> anyhow::Result<Self> {
        use ring::rand::SecureRandom as _;
        let rng = ring::rand::SystemRandom::new();
        let (mut id, mut secret) = ([0u8; 8], [0u8; 32]);
        rng.fill(&mut id)
            .and_then(|()| rng.fill(&mut secret))
            .map_err(|_| anyhow::anyhow!("the random number generator failed"))?;
        Ok(Self {
            id: hex::encode(id),
            secret,
        })
    }

    /// Reads a token's text (surrounding white space ignored).
    ///
    /// # Errors
    /// [`TokenError::Malformed`].
    pub fn parse(text: &str) -> Result<Self, TokenError> {
        let (id, secret) = cyphonic_control::parse_token(text).ok_or(TokenError::Malformed)?;
        Ok(Self {
            id: hex::encode(id),
            secret,
        })
    }

    /// SHA-256 of the secret, hex: what the registry keeps.
    pub fn secret_sha256(&self) -> String {
        hex::encode(ring::digest::digest(&ring::digest::SHA256, &self.secret))
    }

    /// Whether `row` is this token and may be redeemed at `now` by the Noise key `key`
    /// (hex): unused, or redeemed by that very key for a certificate that never connected.
    ///
    /// # Errors
    /// Which rule it breaks.
    pub fn check(&self, row: &TokenRow, now: u64, key: &str) -> Result<(), TokenError> {
        // Digests are compared, not secrets: how long the comparison takes tells an attacker
        // about a hash of what they sent, which brings them no closer to the secret.
        if row.id != self.id || row.secret_sha256 != self.secret_sha256() {
            return Err(TokenError::Unknown);
        }
        match row.state(now) {
            "issued" if row.used_key.as_deref() == Some(key) => Ok(()),
            "used" | "issued" => Err(TokenError::Used),
            "revoked" => Err(TokenError::Revoked),
            "expired" => Err(TokenError::Expired),
            _ => Ok(()),
        }
    }
}

/// The first block of prefix length `prefix` inside `pool` (in order, each pool block from
/// its start, aligned) that overlaps none of `taken`. Either family: a pool block gives
/// blocks of its own family, and only `taken` blocks of that family stand in their way. The
/// search jumps past each block in the way, so a /128 is found at once in a /48 whose first
/// /56 is taken (a step per address would take 2^72 of them).
pub fn allocate(pool: &[IpNet], prefix: u8, taken: &[IpNet]) -> Option<IpNet> {
    pool.iter().find_map(|p| {
        let bits = p.max_prefix_len();
        if prefix < p.prefix_len() || prefix > bits {
            return None;
        }
        let (first, end) = span(p);
        // Addresses in a block of the prefix, less one (2^128 - 1 for a /0 of IPv6).
        let mask = u128::MAX
            .checked_shr(128 - u32::from(bits - prefix))
            .unwrap_or(0);
        let mut at = first;
        loop {
            let last = at + mask;
            let blocking = taken
                .iter()
                .filter(|t| t.max_prefix_len() == bits)
                .map(span)
                .filter(|(t_first, t_last)| *t_first <= last && at <= *t_last)
                .map(|(_, t_last)| t_last)
                .max();
            let Some(t_last) = blocking else {
                return IpNet::new(addr(bits, at), prefix).ok();
            };
            // Past the candidate and what blocks it, aligned to the prefix.
            at = last.max(t_last).checked_add(1)?.checked_add(mask)? & !mask;
            if at > end {
                return None;
            }
        }
    })
}

/// A block's first and last address, as numbers.
fn span(block: &IpNet) -> (u128, u128) {
    match block {
        IpNet::V4(b) => (
            u128::from(u32::from(b.network())),
            u128::from(u32::from(b.broadcast())),
        ),
        IpNet::V6(b) => (u128::from(b.network()), u128::from(b.broadcast())),
    }
}

/// The address `n` of the family with `bits`-bit addresses.
fn addr(bits: u8, n: u128) -> std::net::IpAddr {
    if bits == 32 {
        std::net::Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX)).into()
    } else {
        std::net::Ipv6Addr::from(n).into()
    }
}

/// The unique local /48 (RFC 4193 §3.1) with the 40-bit Global ID `global_id`: `fd` and
/// the five bytes. `ca init` draws the ID at random.
pub fn ula48(global_id: [u8; 5]) -> ipnet::Ipv6Net {
    let mut octets = [0u8; 16];
    octets[0] = 0xfd;
    octets[1..6].copy_from_slice(&global_id);
    ipnet::Ipv6Net::new(octets.into(), 48).unwrap_or_default()
}

/// Less time than this left to the issuing CA is warned of (in the log, the status), seconds:
/// 30 days.
pub const EXPIRY_WARNING: u64 = 30 * 86_400;

/// How the issuing CA stands at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// This many seconds left, at least [`EXPIRY_WARNING`].
    Fine(u64),
    /// This many seconds left, less than [`EXPIRY_WARNING`].
    Soon(u64),
    /// Over: nothing can be issued.
    Expired,
}

/// Seconds from unix time `now` to `not_after`, negative once past.
pub fn seconds_left(not_after: u64, now: u64) -> i64 {
    let left = i128::from(not_after) - i128::from(now);
    i64::try_from(left).unwrap_or(if left < 0 { i64::MIN } else { i64::MAX })
}

/// How a CA with `left` seconds to its end ([`seconds_left`]) stands.
pub fn expiry(left: i64) -> Expiry {
    match u64::try_from(left) {
        Ok(0) | Err(_) => Expiry::Expired,
        Ok(s) if s < EXPIRY_WARNING => Expiry::Soon(s),
        Ok(s) => Expiry::Fine(s),
    }
}

/// The issuing CA and what it hands out.
#[derive(Debug)]
pub struct Issuer {
    ca: CertificateAuthority,
    /// The roots above it (itself when the cloud issues with a root).
    roots: Vec<Certificate>,
    /// Blocks tokens are allocated from.
    pub pool: Vec<IpNet>,
    /// A token's certificate lifetime unless it says otherwise, seconds.
    pub lifetime: u64,
}

impl Issuer {
    /// Issues with `ca`, which chains to `roots`; allocates from `pool`.
    pub const fn new(
        ca: CertificateAuthority,
        roots: Vec<Certificate>,
        pool: Vec<IpNet>,
        lifetime: u64,
    ) -> Self {
        Self {
            ca,
            roots,
            pool,
            lifetime,
        }
    }

    /// The issuing CA's certificate.
    pub const fn certificate(&self) -> &Certificate {
        self.ca.certificate()
    }

    /// The chain a client is given with an enrolled certificate: the issuing CA, unless the
    /// cloud issues with a root.
    pub fn chain(&self) -> Vec<Certificate> {
        if self.ca.certificate().is_root() {
            Vec::new()
        } else {
            vec![self.ca.certificate().clone()]
        }
    }

    /// The roots the chain leads to.
    pub fn roots(&self) -> &[Certificate] {
        &self.roots
    }

    /// The certificate a token is redeemed for: its name, blocks and groups, for `public_key`,
    /// from [`SKEW`] before `now` for the token's lifetime (at most to the CA's end).
    ///
    /// # Errors
    /// The token asks for what the issuing CA cannot certify.
    pub fn enroll(
        &self,
        token: &TokenRow,
        public_key: [u8; 32],
        now: u64,
    ) -> Result<Certificate, String> {
        self.issue(
            &token.name,
            &token.blocks,
            &token.groups,
            public_key,
            now,
            token.lifetime,
        )
    }

    /// A certificate like the one `b` is the body of (name, blocks, groups, key) with a new validity of the same
    /// length from now (at most to the CA's end).
    ///
    /// # Errors
    /// `cert` lies outside what the issuing CA can certify.
    pub fn renew(&self, b: &CertBody, now: u64) -> Result<Certificate, String> {
        let lifetime = b
            .not_after
            .saturating_sub(b.not_before)
            .saturating_sub(SKEW)
            .max(MIN_LIFETIME);
        self.issue(
            &b.name,
            &b.vip_blocks,
            &b.groups,
            b.public_key,
            now,
            lifetime,
        )
    }

    fn issue(
        &self,
        name: &str,
        blocks: &[IpNet],
        groups: &[String],
        public_key: [u8; 32],
        now: u64,
        lifetime: u64,
    ) -> Result<Certificate, String> {
        let ca = self.ca.certificate().body();
        let not_before = now.saturating_sub(SKEW).max(ca.not_before);
        let not_after = now.saturating_add(lifetime).min(ca.not_after);
        if not_after <= now {
            return Err("the issuing CA has expired: renew it (`ca delegate`)".into());
        }
        self.ca
            .issue(&IssueRequest {
                name: name.to_owned(),
                vip_blocks: blocks.to_vec(),
                public_key,
                groups: groups.to_vec(),
                not_before,
                not_after,
            })
            .map_err(|e| format!("the issuing CA cannot certify this: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issuing_ca_is_fine_then_soon_to_end_then_over() {
        let end = 1_000 * 86_400;
        let at = |now| expiry(seconds_left(end, now));
        assert_eq!(at(end - 31 * 86_400), Expiry::Fine(31 * 86_400));
        assert_eq!(at(end - EXPIRY_WARNING), Expiry::Fine(EXPIRY_WARNING));
        assert_eq!(
            at(end - EXPIRY_WARNING + 1),
            Expiry::Soon(EXPIRY_WARNING - 1)
        );
        assert_eq!(at(end - 1), Expiry::Soon(1));
        assert_eq!(at(end), Expiry::Expired);
        assert_eq!(at(end + 86_400), Expiry::Expired);
        assert_eq!(seconds_left(end, end + 86_400), -86_400);
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn tokens_read_back_and_check_their_state() {
        let t = Token::generate().unwrap();
        let text = t.to_string();
        assert_eq!(text.len(), 16 + 1 + 64);
        let again = Token::parse(&format!("  {text}\n")).unwrap();
        assert_eq!(again, t);
        for bad in [
            "",
            "abc",
            "0011223344556677",
            &text[..text.len() - 1],
            &text.replace('.', ""),
        ] {
            assert_eq!(Token::parse(bad), Err(TokenError::Malformed), "{bad:?}");
        }
        let mut row = TokenRow {
            id: t.id.clone(),
            secret_sha256: t.secret_sha256(),
            name: "gw.ovl.example".into(),
            blocks: vec![net("100.64.9.0/24")],
            groups: Vec::new(),
            lifetime: 60,
            created_at: 100,
            expires_at: 200,
            used_at: None,
            used_by: None,
            used_key: None,
            confirmed_at: None,
            revoked_at: None,
        };
        assert_eq!(t.check(&row, 150, "aa"), Ok(()));
        assert_eq!(t.check(&row, 200, "aa"), Err(TokenError::Expired));
        let other = Token::generate().unwrap();
        let forged = Token {
            id: t.id.clone(),
            secret: other.secret,
        };
        assert_eq!(forged.check(&row, 150, "aa"), Err(TokenError::Unknown));
        // Redeemed, its certificate not seen yet: the same key may redeem it again, no other;
        // once the certificate connected, nobody may (issue 49, finding 5).
        row.used_at = Some(110);
        row.used_key = Some("aa".into());
        assert_eq!(t.check(&row, 150, "aa"), Ok(()));
        assert_eq!(t.check(&row, 150, "bb"), Err(TokenError::Used));
        assert_eq!(t.check(&row, 200, "aa"), Err(TokenError::Used), "expired");
        row.confirmed_at = Some(130);
        assert_eq!(t.check(&row, 150, "aa"), Err(TokenError::Used));
        row.confirmed_at = None;
        row.revoked_at = Some(120);
        assert_eq!(t.check(&row, 150, "aa"), Err(TokenError::Revoked));
        row.used_at = None;
        assert_eq!(t.check(&row, 150, "aa"), Err(TokenError::Revoked));
    }

    #[test]
    fn allocation_skips_every_overlap_and_stays_aligned_in_the_pool() {
        let pool = [net("100.64.128.0/22")];
        assert_eq!(allocate(&pool, 24, &[]), Some(net("100.64.128.0/24")));
        // A larger block covering the first, a smaller one inside the second.
        let taken = [net("100.64.128.0/23"), net("100.64.130.7/32")];
        assert_eq!(allocate(&pool, 24, &taken), Some(net("100.64.131.0/24")));
        assert_eq!(allocate(&pool, 32, &taken), Some(net("100.64.130.0/32")));
        // Full, or a prefix shorter than the pool's.
        let full = [net("100.64.128.0/22")];
        assert_eq!(allocate(&pool, 24, &full), None);
        assert_eq!(allocate(&pool, 20, &[]), None);
        // The next pool block when the first is full.
        let two = [net("100.64.128.0/24"), net("100.64.200.0/24")];
        assert_eq!(
            allocate(&two, 24, &[net("100.64.128.0/24")]),
            Some(net("100.64.200.0/24"))
        );
    }

    /// IPv6 as IPv4: a /56 for a site and a /128 for a node from the overlay's /48, past
    /// what members hold, found at once however many addresses lie in the way; a pool of
    /// both families gives each prefix from its own family only.
    #[test]
    fn allocation_covers_ipv6_and_jumps_past_what_is_taken() {
        let pool = [net("100.64.128.0/17"), net("fd7a:0:1::/48")];
        assert_eq!(allocate(&pool, 56, &[]), Some(net("fd7a:0:1::/56")));
        let taken = [
            net("fd7a:0:1::/56"),
            net("fd7a:0:1:100::/56"),
            net("fd7a:0:1:200::/128"),
            // Another family's block at the same numbers stands in nobody's way.
            net("100.64.128.0/24"),
        ];
        assert_eq!(allocate(&pool, 56, &taken), Some(net("fd7a:0:1:300::/56")));
        assert_eq!(
            allocate(&pool, 128, &taken),
            Some(net("fd7a:0:1:200::1/128"))
        );
        assert_eq!(allocate(&pool, 24, &taken), Some(net("100.64.129.0/24")));
        // A /128 past a taken /49: one step, not 2^79.
        let half = [net("fd7a:0:1::/49")];
        assert_eq!(
            allocate(&pool, 128, &half),
            Some(net("fd7a:0:1:8000::/128"))
        );
        // An IPv4 block at the same numbers as an IPv6 one stands in its way nowhere.
        assert_eq!(
            allocate(&[net("::/96")], 128, &[net("0.0.0.0/32")]),
            Some(net("::/128"))
        );
        // Full.
        assert_eq!(
            allocate(&[net("fd7a:0:1::/48")], 56, &[net("fd7a::/16")]),
            None
        );
        // The last /128 of the whole space, and nothing past it.
        let all = [net("::/0")];
        let but_last = [net("::/1"), net("8000::/2"), net("c000::/3")];
        assert!(allocate(&all, 128, &but_last).is_some());
        assert_eq!(allocate(&all, 0, &[]), Some(net("::/0")));
        assert_eq!(allocate(&all, 0, &[net("::1/128")]), None);
        let last = [net("::/1"), net("8000::/1")];
        assert_eq!(allocate(&all, 128, &last), None);
    }

    #[test]
    fn a_unique_local_48_is_fd_and_the_global_id() {
        assert_eq!(
            ula48([0x12, 0x34, 0x56, 0x78, 0x9a]),
            "fd12:3456:789a::/48".parse::<ipnet::Ipv6Net>().unwrap()
        );
    }

    #[test]
    fn renewal_keeps_what_is_certified_and_the_lifetime() {
        let t0 = 1_800_000_000;
        let root = CertificateAuthority::generate(
            "ovl.example",
            &[net("100.64.0.0/10")],
            t0,
            t0 + 1_000_000,
        )
        .unwrap();
        let issuing = root
            .delegate("ovl.example", &[net("100.64.128.0/17")], t0, t0 + 500_000)
            .unwrap();
        let issuer = Issuer::new(
            issuing,
            vec![root.certificate().clone()],
            vec![net("100.64.128.0/17")],
            600,
        );
        let row = TokenRow {
            id: "00".into(),
            secret_sha256: String::new(),
            name: "n1.ovl.example".into(),
            blocks: vec![net("100.64.130.0/24")],
            groups: vec!["iot".into()],
            lifetime: 600,
            created_at: t0,
            expires_at: t0 + 10,
            used_at: None,
            used_by: None,
            used_key: None,
            confirmed_at: None,
            revoked_at: None,
        };
        let cert = issuer.enroll(&row, [7; 32], t0 + 100).unwrap();
        assert_eq!(cert.body().not_before, t0 + 100 - SKEW);
        assert_eq!(cert.body().not_after, t0 + 700);
        let renewed = issuer.renew(cert.body(), t0 + 500).unwrap();
        let (a, b) = (cert.body(), renewed.body());
        assert_eq!(
            (&a.name, &a.vip_blocks, &a.groups, a.public_key),
            (&b.name, &b.vip_blocks, &b.groups, b.public_key)
        );
        assert_eq!(b.not_after, t0 + 1100);
        assert_ne!(cert.fingerprint(), renewed.fingerprint());
        // Capped at the issuing CA's end; refused once it is over.
        assert_eq!(
            issuer
                .renew(cert.body(), t0 + 499_900)
                .unwrap()
                .body()
                .not_after,
            t0 + 500_000
        );
        assert!(issuer.renew(cert.body(), t0 + 500_000).is_err());
        // Outside the issuing CA's blocks: refused.
        let outside = TokenRow {
            blocks: vec![net("100.64.1.0/24")],
            ..row
        };
        assert!(issuer.enroll(&outside, [7; 32], t0 + 100).is_err());
    }
}

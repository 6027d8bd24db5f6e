//! The pair's messages on the wire (docs/protocol.md §5, *Messages*): sealing with the
//! sender's per-start key, and opening with every check in order of cost.

use cyphonic_crypto::cookie::MAC_LEN;
use cyphonic_crypto::pair::BOOT_LEN;
use cyphonic_crypto::{BootKey, PairKey};

/// The Ethertype of the pair's frames on the LAN (IEEE 802 local experimental 1).
pub const ETHERTYPE: u16 = 0x88B5;
/// The multicast address the pair's frames are sent to (locally administered).
pub const GROUP_MAC: [u8; 6] = [0x03, 0x63, 0x79, 0x68, 0x61, 0x00];
/// The pair protocol's newest version, which a box speaks to a box of its own release.
pub const VERSION: u8 = 1;
/// The oldest version a box still speaks: the release before's newest (docs/protocol.md §5,
/// *Versions*).
pub const OLDEST: u8 = 1;
/// The versions this release speaks.
pub const OURS: Versions = OLDEST..=VERSION;

/// A range of pair versions, oldest to newest.
pub type Versions = std::ops::RangeInclusive<u8>;
/// Bytes before the body.
pub const HEADER_LEN: usize = 32;
/// Bytes of the tag after the body.
pub const TAG_LEN: usize = MAC_LEN;
/// Bytes of a heartbeat's body.
pub const HEARTBEAT_LEN: usize = 72;
/// Most bytes of the lease file in one chunk.
pub const MAX_CHUNK: usize = 1200;
/// Most chunks of one lease table (about 300 KB: a /20 of leases with long names).
pub const MAX_CHUNKS: u16 = 256;

const MAGIC: &[u8; 4] = b"cyHA";
const KIND_HEARTBEAT: u8 = 1;
const KIND_LEASES: u8 = 2;
const CHUNK_HEADER: usize = 12;

/// A box's per-start identifier.
pub type Boot = [u8; BOOT_LEN];
/// A heartbeat's challenge or echo.
pub type Challenge = [u8; 16];

/// What a box says it is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Listening before it decides.
    Starting,
    /// Ready, serving nothing.
    Standby,
    /// Serving the gateway.
    Active,
}

impl Role {
    const fn byte(self) -> u8 {
        match self {
            Self::Starting => 0,
            Self::Standby => 1,
            Self::Active => 2,
        }
    }

    const fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Self::Starting),
            1 => Some(Self::Standby),
            2 => Some(Self::Active),
            _ => None,
        }
    }
}

/// A box's judgement of itself: what it could serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Health(u8);

impl Health {
    /// The LAN port's link is up.
    pub const LAN: Self = Self(1);
    /// The uplink is up.
    pub const UPLINK: Self = Self(2);
    /// The data-plane threads are alive.
    pub const DATA_PLANE: Self = Self(4);
    /// The cloud or a peer answered in the last 10 s.
    pub const REACHED: Self = Self(8);
    /// Everything well.
    pub const ALL: Self = Self(15);

    /// No bit set.
    pub const fn none() -> Self {
        Self(0)
    }

    /// Whether every bit of `other` is set here.
    pub const fn has(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// These bits and `other`'s.
    #[must_use]
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// These bits without `other`'s.
    #[must_use]
    pub const fn without(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }

    /// How many things are well: the order of health in the precedence.
    pub const fn score(self) -> u32 {
        self.0.count_ones()
    }

    /// The byte on the wire.
    pub const fn bits(self) -> u8 {
        self.0
    }
}

/// A heartbeat's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// The sender's role.
    pub role: Role,
    /// The sender's health.
    pub health: Health,
    /// The sender's configured priority (1-254).
    pub priority: u8,
    /// Whether the sender takes the gateway back when it has the higher priority.
    pub preempt: bool,
    /// An active sender hands the gateway over: the standby is to take it (planned
    /// handover, docs/protocol.md §5).
    pub handing_over: bool,
    /// How many times the gateway has moved, as the sender knows it.
    pub term: u64,
    /// The sender's wall clock, unix nanoseconds.
    pub clock_ns: u64,
    /// A fresh random challenge.
    pub challenge: Challenge,
    /// The newest challenge the sender received from the other box (zeros: none).
    pub echo: Challenge,
    /// The version of the lease table the sender holds.
    pub leases_version: u64,
    /// The sender's LAN NIC MAC: who it is on either path (a LAN frame must come from it).
    pub nic: [u8; 6],
}

/// A piece of the lease table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseChunk<'a> {
    /// The table's version.
    pub version: u64,
    /// This chunk's index, below `count`.
    pub index: u16,
    /// How many chunks the table has.
    pub count: u16,
    /// The bytes of the lease file in this chunk.
    pub data: &'a [u8],
}

impl LeaseChunk<'_> {
    /// Whether its place is one a table can have: `index` below `count`, at most
    /// [`MAX_CHUNKS`].
    pub const fn in_range(&self) -> bool {
        self.count != 0 && self.count <= MAX_CHUNKS && self.index < self.count
    }
}

/// A message's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body<'a> {
    /// A heartbeat.
    Heartbeat(Heartbeat),
    /// A piece of the lease table.
    Leases(LeaseChunk<'a>),
}

/// Why a message was dropped, in the order the checks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Shorter than a header and a tag, no magic, or a length that does not match.
    #[error("not a pair message (magic or length)")]
    Malformed,
    /// A version of the pair protocol this box does not speak.
    #[error("pair protocol version {0}, which this box does not speak")]
    Version(u8),
    /// The tag does not verify: not from a holder of the site's key, or changed.
    #[error("tag does not verify")]
    Tag,
    /// A counter not above the last accepted from that start: a replay.
    #[error("replayed (counter not above the last)")]
    Replay,
    /// Authentic, but a kind or field this version does not know.
    #[error("unknown kind or field")]
    Unknown,
}

/// Seals the messages of one start of a box, in one version of the pair protocol.
#[derive(Debug)]
pub struct Sealer {
    boot: Boot,
    key: BootKey,
    counter: u64,
    version: u8,
}

impl Sealer {
    /// The sealer of the start identified by `boot` (random, new at each start), in our
    /// newest version.
    pub fn new(pair: &PairKey, boot: Boot) -> Self {
        Self {
            boot,
            key: pair.boot(&boot),
            counter: 0,
            version: VERSION,
        }
    }

    /// The version it seals in.
    pub const fn version(&self) -> u8 {
        self.version
    }

    /// This start's identifier.
    pub const fn boot(&self) -> Boot {
        self.boot
    }

    /// Writes `body` as the next message into `out` (cleared first).
    pub fn seal(&mut self, body: &Body<'_>, out: &mut Vec<u8>) {
        self.counter += 1;
        out.clear();
        out.extend_from_slice(MAGIC);
        out.push(self.version);
        let at = out.len();
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&self.boot);
        out.extend_from_slice(&self.counter.to_be_bytes());
        let kind = match body {
            Body::Heartbeat(h) => {
                out.push(h.role.byte());
                out.push(h.health.bits());
                out.push(h.priority);
                out.push(u8::from(h.preempt) | u8::from(h.handing_over) << 1);
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&h.term.to_be_bytes());
                out.extend_from_slice(&h.clock_ns.to_be_bytes());
                out.extend_from_slice(&h.challenge);
                out.extend_from_slice(&h.echo);
                out.extend_from_slice(&h.leases_version.to_be_bytes());
                out.extend_from_slice(&h.nic);
                out.extend_from_slice(&[0; 2]);
                KIND_HEARTBEAT
            }
            Body::Leases(c) => {
                let data = &c.data[..c.data.len().min(MAX_CHUNK)];
                out.extend_from_slice(&c.version.to_be_bytes());
                out.extend_from_slice(&c.index.to_be_bytes());
                out.extend_from_slice(&c.count.to_be_bytes());
                out.extend_from_slice(data);
                KIND_LEASES
            }
        };
        let n = u16::try_from(out.len() - HEADER_LEN).unwrap_or(u16::MAX);
        out[at] = kind;
        out[at + 1..at + 3].copy_from_slice(&n.to_be_bytes());
        let tag = self.key.tag(out);
        out.extend_from_slice(&tag);
    }
}

/// The starts of the other box this one remembers (a restart adds one).
const STARTS: usize = 4;

/// Opens the other box's messages: one per start of it, its key and its last counter.
#[derive(Debug)]
pub struct Opener {
    pair: PairKey,
    starts: Vec<(Boot, BootKey, u64)>,
    versions: Versions,
    heard: Option<u8>,
}

impl Opener {
    /// The opener of messages under `pair`, in the versions we speak.
    pub const fn new(pair: PairKey) -> Self {
        Self::speaking(pair, OURS)
    }

    /// The opener of messages under `pair` in `versions` (another release's, in tests).
    pub const fn speaking(pair: PairKey, versions: Versions) -> Self {
        Self {
            pair,
            starts: Vec::new(),
            versions,
            heard: None,
        }
    }

    /// The version of the last message it accepted.
    pub const fn heard(&self) -> Option<u8> {
        self.heard
    }

    /// Checks `msg` (the frame's payload after the Ethernet header) and returns its sender's
    /// start and its body. The cheap checks run first; the tag before anything is believed;
    /// the counter last (a forged message moves no counter). A start not seen before takes
    /// the place of the least recently heard one.
    ///
    /// # Errors
    /// Why the message is dropped ([`Refused`]).
    pub fn open<'a>(&mut self, msg: &'a [u8]) -> Result<(Boot, Body<'a>), Refused> {
        if msg.len() < HEADER_LEN + TAG_LEN || &msg[..4] != MAGIC {
            return Err(Refused::Malformed);
        }
        if !self.versions.contains(&msg[4]) {
            return Err(Refused::Version(msg[4]));
        }
        let n = usize::from(u16::from_be_bytes([msg[6], msg[7]]));
        if msg.len() != HEADER_LEN + n + TAG_LEN {
            return Err(Refused::Malformed);
        }
        let (signed, tag) = msg.split_at(HEADER_LEN + n);
        let mut boot = [0u8; BOOT_LEN];
        boot.copy_from_slice(&msg[8..24]);
        let mut counter = [0u8; 8];
        counter.copy_from_slice(&msg[24..32]);
        let counter = u64::from_be_bytes(counter);
        // A start not seen before: its key, derived once, is kept only if the tag verifies.
        let known = self.starts.iter().position(|(b, _, _)| *b == boot);
        let fresh = known.is_none().then(|| self.pair.boot(&boot));
        let verified = known
            .map(|i| &self.starts[i].1)
            .or(fresh.as_ref())
            .is_some_and(|key| key.verify(signed, tag));
        if !verified {
            return Err(Refused::Tag);
        }
        let body = parse_body(msg[5], &signed[HEADER_LEN..]).ok_or(Refused::Unknown)?;
        match known {
            Some(i) if counter <= self.starts[i].2 => return Err(Refused::Replay),
            Some(i) => {
                let mut start = self.starts.remove(i);
                start.2 = counter;
                self.starts.push(start);
            }
            None => {
                if self.starts.len() == STARTS {
                    self.starts.remove(0);
                }
                self.starts.extend(fresh.map(|key| (boot, key, counter)));
            }
        }
        self.heard = Some(msg[4]);
        Ok((boot, body))
    }
}

/// One box's side of the pair's messages: it seals ours and opens the other box's, and
/// speaks the other box's version (docs/protocol.md §5, *Versions*): its newest until it
/// accepts a message, then the version of the last message it accepted.
#[derive(Debug)]
pub struct Link {
    sealer: Sealer,
    opener: Opener,
}

impl Link {
    /// The link of the start `boot` under `pair`, in the versions we speak.
    pub fn new(pair: PairKey, boot: Boot) -> Self {
        Self::speaking(pair, boot, OURS)
    }

    /// The link of the start `boot` under `pair` in `versions` (another release's, in
    /// tests).
    pub fn speaking(pair: PairKey, boot: Boot, versions: Versions) -> Self {
        let mut sealer = Sealer::new(&pair, boot);
        sealer.version = *versions.end();
        Self {
            sealer,
            opener: Opener::speaking(pair, versions),
        }
    }

    /// This start's identifier.
    pub const fn boot(&self) -> Boot {
        self.sealer.boot()
    }

    /// The version our messages go in.
    pub const fn version(&self) -> u8 {
        self.sealer.version()
    }

    /// Seals `body` into `out` ([`Sealer::seal`]).
    pub fn seal(&mut self, body: &Body<'_>, out: &mut Vec<u8>) {
        self.sealer.seal(body, out);
    }

    /// Opens `msg` ([`Opener::open`]); once accepted, ours go in its version.
    ///
    /// # Errors
    /// Why the message is dropped ([`Refused`]).
    pub fn open<'a>(&mut self, msg: &'a [u8]) -> Result<(Boot, Body<'a>), Refused> {
        let opened = self.opener.open(msg)?;
        if let Some(heard) = self.opener.heard() {
            self.sealer.version = heard;
        }
        Ok(opened)
    }
}

/// A heartbeat's flags: preempt, handing over; every other bit is refused.
const FLAG_PREEMPT: u8 = 1;
const FLAG_HANDING_OVER: u8 = 2;
const FLAGS: u8 = FLAG_PREEMPT | FLAG_HANDING_OVER;

fn parse_body(kind: u8, b: &[u8]) -> Option<Body<'_>> {
    let u64_at = |at: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[at..at + 8]);
        u64::from_be_bytes(x)
    };
    let challenge_at = |at: usize| {
        let mut x = [0u8; 16];
        x.copy_from_slice(&b[at..at + 16]);
        x
    };
    match kind {
        KIND_HEARTBEAT if b.len() == HEARTBEAT_LEN => {
            if b[3] & !FLAGS != 0
                || b[4..8] != [0; 4]
                || b[70..72] != [0; 2]
                || b[1] & !Health::ALL.0 != 0
            {
                return None;
            }
            Some(Body::Heartbeat(Heartbeat {
                role: Role::from_byte(b[0])?,
                health: Health(b[1]),
                priority: b[2],
                preempt: b[3] & FLAG_PREEMPT != 0,
                handing_over: b[3] & FLAG_HANDING_OVER != 0,
                term: u64_at(8),
                clock_ns: u64_at(16),
                challenge: challenge_at(24),
                echo: challenge_at(40),
                leases_version: u64_at(56),
                nic: {
                    let mut m = [0u8; 6];
                    m.copy_from_slice(&b[64..70]);
                    m
                },
            }))
        }
        KIND_LEASES if b.len() >= CHUNK_HEADER && b.len() <= CHUNK_HEADER + MAX_CHUNK => {
            let chunk = LeaseChunk {
                version: u64_at(0),
                index: u16::from_be_bytes([b[8], b[9]]),
                count: u16::from_be_bytes([b[10], b[11]]),
                data: &b[CHUNK_HEADER..],
            };
            chunk.in_range().then_some(Body::Leases(chunk))
        }
        _ => None,
    }
}

/// Cuts the lease file `table` of `version` into chunks.
pub fn chunks(version: u64, table: &[u8]) -> impl Iterator<Item = LeaseChunk<'_>> {
    let pieces: Vec<&[u8]> = if table.is_empty() {
        vec![&[][..]]
    } else {
        table.chunks(MAX_CHUNK).collect()
    };
    let count = u16::try_from(pieces.len()).unwrap_or(u16::MAX);
    pieces
        .into_iter()
        .enumerate()
        .map(move |(i, data)| LeaseChunk {
            version,
            index: u16::try_from(i).unwrap_or(u16::MAX),
            count,
            data,
        })
}

/// Puts lease tables back together from their chunks: one version at a time, the newest
/// chunk's version wins.
#[derive(Debug, Default)]
pub struct Assembler {
    version: u64,
    pieces: Vec<Option<Vec<u8>>>,
}

impl Assembler {
    /// Takes `chunk`; returns the whole table (its version and bytes) once every chunk of
    /// its version is in. A chunk of another version starts that version over; a table
    /// larger than [`MAX_CHUNKS`] chunks is never started.
    pub fn take(&mut self, chunk: &LeaseChunk<'_>) -> Option<(u64, Vec<u8>)> {
        if !chunk.in_range() {
            return None;
        }
        if chunk.version != self.version || self.pieces.len() != usize::from(chunk.count) {
            self.version = chunk.version;
            self.pieces = vec![None; usize::from(chunk.count)];
        }
        self.pieces[usize::from(chunk.index)] = Some(chunk.data.to_vec());
        if self.pieces.iter().any(Option::is_none) {
            return None;
        }
        let table = self.pieces.iter().flatten().flatten().copied().collect();
        self.pieces.clear();
        Some((self.version, table))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use cyphonic_crypto::StaticKeypair;
    use proptest::prelude::*;

    use super::*;

    fn keys() -> (PairKey, PairKey) {
        let site = StaticKeypair::generate().unwrap();
        let copy = StaticKeypair::from_secret(zeroize::Zeroizing::new(*site.secret()));
        (PairKey::new(&site).unwrap(), PairKey::new(&copy).unwrap())
    }

    fn beat(term: u64) -> Heartbeat {
        Heartbeat {
            role: Role::Active,
            health: Health::ALL,
            priority: 200,
            preempt: true,
            handing_over: true,
            term,
            clock_ns: 1_795_000_000_123_456_789,
            challenge: [7; 16],
            echo: [9; 16],
            leases_version: 42,
            nic: [2, 0, 0, 0, 0, 9],
        }
    }

    /// A box of a later release (pair versions 1 to 2) beside one of ours (1 to 1,
    /// docs/protocol.md §5, *Versions*): the newer box's first message is refused as a
    /// version the older does not speak; once the newer accepts the older's, it speaks 1
    /// and is heard. A message whose version was changed on the way moves nothing (the byte
    /// is under the tag); when the other box comes back newer, it steps up again. A box
    /// sharing no version is heard by no one and moves no one.
    #[test]
    fn a_newer_box_speaks_the_older_ones_version() {
        let site = StaticKeypair::generate().unwrap();
        let key = || {
            PairKey::new(&StaticKeypair::from_secret(zeroize::Zeroizing::new(
                *site.secret(),
            )))
            .unwrap()
        };
        let mut newer = Link::speaking(key(), [1; 16], 1..=2);
        let mut older = Link::speaking(key(), [2; 16], 1..=1);
        let mut m = Vec::new();
        newer.seal(&Body::Heartbeat(beat(1)), &mut m);
        assert_eq!((m[4], newer.version()), (2, 2));
        assert_eq!(older.open(&m), Err(Refused::Version(2)));
        older.seal(&Body::Heartbeat(beat(1)), &mut m);
        assert_eq!(m[4], 1);
        assert_eq!(newer.open(&m).unwrap().1, Body::Heartbeat(beat(1)));
        assert_eq!(newer.version(), 1);
        newer.seal(&Body::Heartbeat(beat(2)), &mut m);
        assert_eq!(m[4], 1);
        assert_eq!(older.open(&m).unwrap().1, Body::Heartbeat(beat(2)));

        // The older box comes back as the later release: a new start, in its newest.
        let mut upgraded = Link::speaking(key(), [3; 16], 1..=2);
        upgraded.seal(&Body::Heartbeat(beat(3)), &mut m);
        assert!(newer.open(&m).is_ok());
        assert_eq!(newer.version(), 2);
        upgraded.seal(&Body::Heartbeat(beat(4)), &mut m);
        m[4] = 1;
        assert_eq!(newer.open(&m), Err(Refused::Tag));
        assert_eq!(newer.version(), 2, "a forged version moved the box");

        // No version in common.
        let mut far = Link::speaking(key(), [4; 16], 3..=3);
        far.seal(&Body::Heartbeat(beat(4)), &mut m);
        assert_eq!(older.open(&m), Err(Refused::Version(3)));
        assert_eq!(older.version(), 1);
        older.seal(&Body::Heartbeat(beat(5)), &mut m);
        assert_eq!(far.open(&m), Err(Refused::Version(1)));
        assert_eq!(far.version(), 3);
        assert_eq!(Link::new(key(), [5; 16]).version(), VERSION);
    }

    /// What one box seals the other opens, field for field; a copy is a replay; a later
    /// message opens; a restart (new boot) opens from counter 1.
    #[test]
    fn sealed_messages_open_once_in_order() {
        let (a, b) = keys();
        let mut sealer = Sealer::new(&a, [1; 16]);
        let mut opener = Opener::new(b);
        let mut m1 = Vec::new();
        sealer.seal(&Body::Heartbeat(beat(3)), &mut m1);
        assert_eq!(m1.len(), HEADER_LEN + HEARTBEAT_LEN + TAG_LEN);
        assert_eq!(
            opener.open(&m1).unwrap(),
            ([1; 16], Body::Heartbeat(beat(3)))
        );
        assert_eq!(opener.open(&m1), Err(Refused::Replay));
        let mut m2 = Vec::new();
        let data = b"100.64.1.100 02:00:00:00:01:0a 3600 cam\n";
        sealer.seal(
            &Body::Leases(LeaseChunk {
                version: 5,
                index: 0,
                count: 1,
                data,
            }),
            &mut m2,
        );
        let (_, body) = opener.open(&m2).unwrap();
        assert_eq!(
            body,
            Body::Leases(LeaseChunk {
                version: 5,
                index: 0,
                count: 1,
                data
            })
        );
        assert_eq!(opener.open(&m1), Err(Refused::Replay));
        let mut restarted = Sealer::new(&a, [2; 16]);
        let mut m3 = Vec::new();
        restarted.seal(&Body::Heartbeat(beat(4)), &mut m3);
        assert_eq!(opener.open(&m3).unwrap().0, [2; 16]);
    }

    /// Another site's key, a changed byte anywhere, a wrong length or version: refused,
    /// and none of them moves the counter (the genuine message still opens after them).
    #[test]
    fn forgeries_are_refused_and_move_nothing() {
        let (a, b) = keys();
        let (other, _) = keys();
        let mut opener = Opener::new(b);
        let mut genuine = Vec::new();
        Sealer::new(&a, [1; 16]).seal(&Body::Heartbeat(beat(1)), &mut genuine);
        let mut forged = Vec::new();
        let mut high = Sealer::new(&other, [1; 16]);
        for _ in 0..5 {
            high.seal(&Body::Heartbeat(beat(9)), &mut forged);
        }
        assert_eq!(opener.open(&forged), Err(Refused::Tag));
        for i in 0..genuine.len() {
            let mut m = genuine.clone();
            m[i] ^= 0x40;
            let r = opener.open(&m);
            assert!(r.is_err(), "byte {i} changed and still opened: {r:?}");
        }
        assert_eq!(opener.open(&genuine[..40]), Err(Refused::Malformed));
        let mut v2 = genuine.clone();
        v2[4] = 2;
        assert_eq!(opener.open(&v2), Err(Refused::Version(2)));
        assert!(opener.open(&genuine).is_ok());
    }

    /// An authentic message with a field this version does not know is refused, not guessed.
    #[test]
    fn unknown_fields_are_refused() {
        let (a, b) = keys();
        let mut opener = Opener::new(b);
        let mut sealer = Sealer::new(&a, [1; 16]);
        let mut m = Vec::new();
        sealer.seal(
            &Body::Leases(LeaseChunk {
                version: 1,
                index: 3,
                count: 3,
                data: b"x",
            }),
            &mut m,
        );
        assert_eq!(opener.open(&m), Err(Refused::Unknown));
    }

    /// Tables come back whole from their chunks in any order; a newer version started in
    /// the middle wins; a chunk out of range is ignored.
    #[test]
    fn tables_come_back_from_chunks_in_any_order() {
        let table: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let mut parts: Vec<LeaseChunk<'_>> = chunks(7, &table).collect();
        assert_eq!(parts.len(), 3);
        parts.reverse();
        let mut asm = Assembler::default();
        assert_eq!(asm.take(&parts[0]), None);
        let newer: Vec<LeaseChunk<'_>> = chunks(8, b"new").collect();
        assert_eq!(asm.take(&newer[0]), Some((8, b"new".to_vec())));
        for p in &parts[..2] {
            assert_eq!(asm.take(p), None);
        }
        assert_eq!(asm.take(&parts[2]), Some((7, table.clone())));
        let bad = LeaseChunk {
            version: 9,
            index: 2,
            count: 2,
            data: b"",
        };
        assert_eq!(asm.take(&bad), None);
        let empty: Vec<LeaseChunk<'_>> = chunks(10, b"").collect();
        assert_eq!(asm.take(&empty[0]), Some((10, Vec::new())));
    }

    proptest! {
        /// Whatever bytes arrive, opening never panics, and nothing opens without the key.
        #[test]
        fn any_bytes_open_nothing(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let (_, b) = keys();
            let mut opener = Opener::new(b);
            prop_assert!(opener.open(&bytes).is_err());
        }
    }
}

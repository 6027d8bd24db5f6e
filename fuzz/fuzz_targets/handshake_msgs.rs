//! Past the crypto wall: real Noise IK messages (the tunnel's prologue, real keys, MACs sealed)
//! around payloads the fuzzer chooses, so that what `read_init`, `Peer::handle_init` and
//! `Peer::handle_response` do with a decrypted payload is reached, not just the decryption.
//! Message 1 comes from a holder of the initiator's key (its own certificate, another one,
//! a mangled one, or bytes); message 2 answers a real pending initiation of a real peer.
#![no_main]

use std::sync::{Arc, OnceLock};

use arbitrary::Arbitrary;
use cyphonic_crypto::{Certificate, RevocationList};
use cyphonic_session::sim::{
    ADDR_A, ADDR_B, Setup, T0, identity, init_frame, node_keys, response_frame, test_ca,
};
use cyphonic_session::{Identity, PeerConfig, Timing, read_init};

struct Fixtures {
    a: Arc<Identity>,
    b: Arc<Identity>,
    /// A certificate of the same CA for another key.
    other: Certificate,
    /// A certificate of another CA for A's name.
    stranger: Certificate,
}

fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let ca = test_ca();
        let a = identity(node_keys(&ca, "gw1.ovl.example", "100.64.1.0/24"), &ca, RevocationList::default());
        let b = identity(node_keys(&ca, "gw2.ovl.example", "100.64.2.0/24"), &ca, RevocationList::default());
        let other = node_keys(&ca, "gw1.ovl.example", "100.64.1.0/24").cert;
        let stranger = node_keys(&test_ca(), "gw1.ovl.example", "100.64.1.0/24").cert;
        Fixtures { a, b, other, stranger }
    })
}

#[derive(Arbitrary, Debug)]
enum Cert {
    Own,
    Peer,
    OtherKey,
    OtherCa,
    /// The sender's own certificate with one byte changed.
    Flipped(u16, u8),
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Message 2 (a response to a real initiation) rather than message 1.
    response: bool,
    /// The index in the payload.
    index: u32,
    /// The header's index equals the payload's (as it must), or this one.
    header_index: Option<u32>,
    /// Message 1's timestamp, as an offset from the clock's.
    timestamp: i64,
    cert: Cert,
    /// Bytes after the certificate.
    trailing: Vec<u8>,
    /// Cut the payload short.
    cut: Option<u16>,
}

fn cert_bytes(choice: &Cert, own: &Certificate, peer: &Certificate) -> Vec<u8> {
    let f = fixtures();
    match choice {
        Cert::Own => own.encoded().to_vec(),
        Cert::Peer => peer.encoded().to_vec(),
        Cert::OtherKey => f.other.encoded().to_vec(),
        Cert::OtherCa => f.stranger.encoded().to_vec(),
        Cert::Flipped(at, xor) => {
            let mut c = own.encoded().to_vec();
            let i = usize::from(*at) % c.len();
            c[i] ^= xor | 1;
            c
        }
        Cert::Bytes(b) => b.clone(),
    }
}

libfuzzer_sys::fuzz_target!(|input: Input| {
    let f = fixtures();
    let mut pair = Setup {
        seed: 1,
        timing: Timing::default(),
        a_config: PeerConfig::from_certificate(f.b.certificate(), Some(ADDR_B.parse().unwrap())),
        b_config: PeerConfig::from_certificate(f.a.certificate(), Some(ADDR_A.parse().unwrap())),
        a_identity: f.a.clone(),
        b_identity: f.b.clone(),
    }
    .build(std::time::Instant::now());
    let now = pair.now;
    if input.response {
        // A starts a real handshake; B reads it for real and answers with our payload.
        let _ = pair.a.peer.initiate(now);
        let Some(t) = pair.a.peer.poll_transmit() else { return };
        let Ok(init) = read_init(&f.b, T0, &t.frame) else { return };
        let receiver = input.header_index.unwrap_or(init.sender_index);
        let mut payload = input.index.to_be_bytes().to_vec();
        payload.extend(cert_bytes(&input.cert, f.b.certificate(), f.a.certificate()));
        payload.extend(&input.trailing);
        if let Some(cut) = input.cut {
            payload.truncate(usize::from(cut));
        }
        let Some(frame) = response_frame(init, receiver, &payload) else { return };
        let _ = pair.a.peer.handle_response(now, ADDR_B.parse().unwrap(), &frame);
        // Whatever happened, the peer still works: data or a new initiation.
        let mut out = vec![0u8; 256];
        let _ = pair.a.peer.encapsulate(now, b"after", &mut out);
    } else {
        let header = input.header_index.unwrap_or(input.index);
        let ts = (T0 as i64 * 1_000_000_000).saturating_add(input.timestamp) as u64;
        let mut payload = input.index.to_be_bytes().to_vec();
        payload.extend(ts.to_be_bytes());
        payload.extend(cert_bytes(&input.cert, f.a.certificate(), f.b.certificate()));
        payload.extend(&input.trailing);
        if let Some(cut) = input.cut {
            payload.truncate(usize::from(cut));
        }
        let Some(frame) = init_frame(f.a.keypair(), &f.b.public_key(), header, &payload) else {
            return;
        };
        if let Ok(init) = read_init(&f.b, T0, &frame) {
            let _ = pair.b.peer.handle_init(now, ADDR_A.parse().unwrap(), init);
        }
    }
    pair.flush();
    pair.drive(std::time::Duration::from_secs(2));
});

//! The responder's first contact with untrusted bytes: `read_init` on anything never panics.
//! The corpus should be seeded with real handshake-init frames (see docs/protocol.md).
#![no_main]

use std::sync::OnceLock;

use cyphonic_crypto::{CertificateAuthority, IssueRequest, RevocationList, StaticKeypair, TrustStore};
use cyphonic_session::{Identity, read_init};

fn identity() -> &'static Identity {
    static ID: OnceLock<Identity> = OnceLock::new();
    ID.get_or_init(|| {
        let ca = CertificateAuthority::generate("ovl.example", &["100.64.0.0/10".parse().unwrap()], 0, u64::MAX)
            .expect("CA");
        let keypair = StaticKeypair::generate().expect("key");
        let cert = ca
            .issue(&IssueRequest {
                name: "gw.ovl.example".into(),
                vip_blocks: vec!["100.64.1.0/24".parse().unwrap()],
                public_key: keypair.public().0,
                groups: vec![],
                not_before: 0,
                not_after: u64::MAX,
            })
            .expect("cert");
        let trust = TrustStore::new(vec![ca.certificate().clone()], RevocationList::default()).expect("trust");
        Identity::new(keypair, cert, trust, 1_800_000_000).expect("identity")
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = read_init(identity(), 1_800_000_000, data);
});

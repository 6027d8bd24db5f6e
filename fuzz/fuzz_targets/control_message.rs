//! What the cloud and its clients do with control-plane bytes from the other side: the first
//! handshake message from anyone (`ServerHandshake::accept`), endpoint probes from anyone,
//! and the JSON an authenticated but hostile peer could send after the handshake (every
//! message type both ways, then the name rules on what a registration carries). None of it
//! may panic.
#![no_main]

use std::sync::OnceLock;

use cyphonic_control::{
    Bind, ClientMsg, CloudMsg, Hello, Probe, ServerHandshake, Welcome, check_name, legacy_bind_token,
    parse_challenge,
};
use cyphonic_crypto::{CertBody, CertificateAuthority, IssueRequest, StaticKeypair};

fn fixtures() -> &'static (StaticKeypair, CertBody) {
    static F: OnceLock<(StaticKeypair, CertBody)> = OnceLock::new();
    F.get_or_init(|| {
        let ca = CertificateAuthority::generate("ovl.example", &["100.64.0.0/10".parse().unwrap()], 0, u64::MAX)
            .expect("CA");
        let cert = ca
            .issue(&IssueRequest {
                name: "gw1.ovl.example".into(),
                vip_blocks: vec!["100.64.1.0/24".parse().unwrap()],
                public_key: [7; 32],
                groups: vec![],
                not_before: 0,
                not_after: u64::MAX,
            })
            .expect("cert");
        (StaticKeypair::generate().expect("key"), cert.body().clone())
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (cloud_key, body) = fixtures();
    let _ = ServerHandshake::accept(cloud_key, data);
    let _ = legacy_bind_token(data);
    let _ = parse_challenge(data);
    if let Some(b) = Bind::parse(data) {
        let _ = b.verify(&[7; 16]);
    }
    if let Some(p) = Probe::parse(data) {
        let _ = p.verify(&[7; 16]);
    }
    let _ = serde_json::from_slice::<Hello>(data);
    let _ = serde_json::from_slice::<Welcome>(data);
    let _ = serde_json::from_slice::<CloudMsg>(data);
    if let Ok(ClientMsg::Register { names, .. }) = serde_json::from_slice::<ClientMsg>(data) {
        for n in &names {
            let _ = check_name(body, n);
        }
    }
});

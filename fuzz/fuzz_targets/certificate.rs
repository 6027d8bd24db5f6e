//! Certificates from untrusted bytes: decode never panics; what decodes survives the text form
//! unchanged; verification of anything decoded never panics.
#![no_main]

use std::sync::OnceLock;

use cyphonic_crypto::{Certificate, CertificateAuthority, RevocationList, TrustStore};

fn trust() -> &'static TrustStore {
    static TRUST: OnceLock<TrustStore> = OnceLock::new();
    TRUST.get_or_init(|| {
        let ca = CertificateAuthority::generate("ovl.example", &["100.64.0.0/10".parse().unwrap()], 0, u64::MAX)
            .expect("CA");
        TrustStore::new(vec![ca.certificate().clone()], RevocationList::default()).expect("trust store")
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(cert) = Certificate::decode(data) {
        let again = Certificate::from_pem(&cert.to_pem()).expect("a decoded certificate re-reads from its text form");
        assert_eq!(again, cert);
        assert_eq!(again.encoded(), data);
        let _ = trust().verify(&cert, 1_800_000_000);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Certificate::all_from_pem(text);
        let _ = RevocationList::parse(text);
    }
});

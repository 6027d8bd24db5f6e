//! Tunnel frames: parse -> emit -> parse must round-trip, and nothing may panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    cyphonic_wire::roundtrip_check(data);
});

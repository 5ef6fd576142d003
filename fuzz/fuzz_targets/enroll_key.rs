//! The `publicKey` of `/v1/enroll` (raw Ed25519 base64 or SPKI PEM), its stored form, and a
//! `pki_response` signature checked against it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use signalling_server::pki::{decode_signature, PublicKey};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (key_text, signature_text) = text.split_once('\n').unwrap_or((text, ""));
    if let Ok(key) = PublicKey::parse_enrollment(key_text) {
        let stored = key.to_stored();
        let back = PublicKey::from_stored(&stored).expect("stored form round-trips");
        assert_eq!(back, key);
        if let Ok(signature) = decode_signature(signature_text) {
            let _ = key.verify(b"challenge", &signature);
        }
    }
    let _ = PublicKey::from_stored(text);
});

//! A certificate chain presented in `register` (payload.metadata.certificate): the
//! pre-checks, webpki path validation against a fixed anchor, and the cheap leaf reader
//! used to compare a chain with a robot's stored credential.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use signalling_server::pki::{leaf_key_of_chain, verify_chain, TrustStore};

/// Inside the seeds' validity (2026–2036), fixed so runs repeat.
const NOW: i64 = 1_893_456_000;

fn anchors() -> &'static TrustStore {
    static STORE: OnceLock<TrustStore> = OnceLock::new();
    STORE.get_or_init(|| {
        TrustStore::from_pem(include_bytes!("../seeds/anchor.pem")).expect("seed anchor")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = leaf_key_of_chain(text);
    let _ = verify_chain(text, anchors(), "robot-1", NOW);
});

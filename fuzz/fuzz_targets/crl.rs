//! A CRL file (PEM with CRLs and intermediates, or DER) as the CRL watcher loads it.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use signalling_server::pki::{load_crls, TrustStore};

fn anchors() -> &'static TrustStore {
    static STORE: OnceLock<TrustStore> = OnceLock::new();
    STORE.get_or_init(|| {
        TrustStore::from_pem(include_bytes!("../seeds/anchor.pem")).expect("seed anchor")
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = load_crls(data, anchors(), None, 1_893_456_000);
});

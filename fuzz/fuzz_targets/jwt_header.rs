//! A bearer token as `/ws` receives it: header decoding, algorithm dispatch and claims
//! validation of the JWT verifier (HS256 configured, with issuer and audience).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use signalling_server::auth::{JwtConfig, JwtVerifier};

struct Setup {
    runtime: tokio::runtime::Runtime,
    verifier: JwtVerifier,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let verifier = runtime
            .block_on(JwtVerifier::new(JwtConfig {
                secret: Some("fuzz-secret".into()),
                issuer: Some("https://idp.example".into()),
                audience: Some("robots".into()),
                ..JwtConfig::default()
            }))
            .expect("verifier");
        Setup { runtime, verifier }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    let setup = setup();
    let _ = setup.runtime.block_on(setup.verifier.verify(token));
});

//! A CSR posted to `/v1/enroll`, signed by a CA made once per run.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use signalling_server::pki::{generate_ca, CertificateAuthority};

fn ca() -> &'static CertificateAuthority {
    static CA: OnceLock<CertificateAuthority> = OnceLock::new();
    CA.get_or_init(|| {
        let (cert, key) = generate_ca("Fuzz Enrollment CA", 30).expect("CA");
        CertificateAuthority::from_pem(&cert, &key).expect("CA loads")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ca().sign_csr(text, "robot-1", Duration::from_secs(3600), 1_893_456_000);
});

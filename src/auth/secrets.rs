use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};

/// Lowercase hex SHA-256: how every bearer secret is stored.
pub fn sha256_hex(data: &[u8]) -> String {
    let hash = digest::digest(&digest::SHA256, data);
    hash.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh secret: `prefix` + 32 CSPRNG bytes in URL-safe base64.
pub fn random_token(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    // SystemRandom only fails if the OS has no entropy source, which we cannot run without.
    SystemRandom::new()
        .fill(&mut bytes)
        .expect("the operating system's random number generator failed");
    format!("{prefix}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// Compares secrets (or their hashes) without an early exit that would leak how much matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_prefixed() {
        let a = random_token("p_");
        let b = random_token("p_");
        assert!(a.starts_with("p_") && a.len() == 2 + 43);
        assert_ne!(a, b);
    }

    #[test]
    fn comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

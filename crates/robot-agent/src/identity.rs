//! The robot's identity: an Ed25519 or ECDSA P-256 key (PKCS#8 PEM, 0600),
//! optionally with an X.509 certificate chain, used to sign the server's
//! PKI challenges.

use std::path::Path;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{
    EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING,
    ECDSA_P256_SHA256_FIXED_SIGNING,
};

use crate::fsutil;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is not a PKCS#8 PEM private key")]
    NotPem(String),
    #[error("{0} holds neither an Ed25519 nor an ECDSA P-256 key")]
    UnsupportedKey(String),
    #[error("key generation failed")]
    Generate,
    #[error("signing failed")]
    Sign,
    #[error("cannot build the CSR: {0}")]
    Csr(String),
    #[error("{0} holds no PEM certificate")]
    NotCertificate(String),
}

/// Which kind of key to create at enrollment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyType {
    Ed25519,
    P256,
}

enum Inner {
    Ed25519(Ed25519KeyPair),
    P256(EcdsaKeyPair),
}

/// A loaded private key.
pub struct RobotKey {
    inner: Inner,
    pkcs8_pem: String,
}

impl std::fmt::Debug for RobotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("RobotKey")
            .field("type", &self.key_type())
            .finish()
    }
}

impl RobotKey {
    /// Makes a new key of `kind`.
    pub fn generate(kind: KeyType) -> Result<RobotKey, IdentityError> {
        let rng = SystemRandom::new();
        let der = match kind {
            KeyType::Ed25519 => Ed25519KeyPair::generate_pkcs8(&rng)
                .map_err(|_| IdentityError::Generate)?
                .as_ref()
                .to_vec(),
            KeyType::P256 => EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
                .map_err(|_| IdentityError::Generate)?
                .as_ref()
                .to_vec(),
        };
        let pem = pem::encode(&pem::Pem::new("PRIVATE KEY", der));
        RobotKey::from_pem(&pem, "generated key")
    }

    /// Parses a PKCS#8 PEM key; `origin` names it in errors.
    pub fn from_pem(text: &str, origin: &str) -> Result<RobotKey, IdentityError> {
        let block = pem::parse(text).map_err(|_| IdentityError::NotPem(origin.to_owned()))?;
        if block.tag() != "PRIVATE KEY" {
            return Err(IdentityError::NotPem(origin.to_owned()));
        }
        let der = block.contents();
        let inner = if let Ok(k) = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der) {
            Inner::Ed25519(k)
        } else if let Ok(k) =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, der, &SystemRandom::new())
        {
            Inner::P256(k)
        } else {
            return Err(IdentityError::UnsupportedKey(origin.to_owned()));
        };
        Ok(RobotKey {
            inner,
            pkcs8_pem: text.to_owned(),
        })
    }

    /// Loads the key at `path`, tightening its mode to 0600 if needed.
    pub fn load(path: &Path) -> Result<RobotKey, IdentityError> {
        let text = std::fs::read_to_string(path).map_err(|source| IdentityError::Read {
            path: path.display().to_string(),
            source,
        })?;
        if let Err(e) = fsutil::make_private(path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot restrict key file to 0600");
        }
        RobotKey::from_pem(&text, &path.display().to_string())
    }

    /// Loads `path`, or creates a key there (0600) if there is none.
    pub fn load_or_create(path: &Path, kind: KeyType) -> Result<(RobotKey, bool), IdentityError> {
        if path.exists() {
            return Ok((RobotKey::load(path)?, false));
        }
        let key = RobotKey::generate(kind)?;
        fsutil::write_new_private(path, key.pkcs8_pem.as_bytes()).map_err(|source| {
            IdentityError::Write {
                path: path.display().to_string(),
                source,
            }
        })?;
        Ok((key, true))
    }

    pub fn key_type(&self) -> KeyType {
        match self.inner {
            Inner::Ed25519(_) => KeyType::Ed25519,
            Inner::P256(_) => KeyType::P256,
        }
    }

    /// Signs `message` (the decoded challenge bytes). P-256 signatures are
    /// ASN.1 DER, which the server accepts alongside the fixed form.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, IdentityError> {
        match &self.inner {
            Inner::Ed25519(k) => Ok(k.sign(message).as_ref().to_vec()),
            Inner::P256(k) => k
                .sign(&SystemRandom::new(), message)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| IdentityError::Sign),
        }
    }

    /// This key as a JWS signer ([`JwsSigner`]), for signed replies.
    pub fn jws_signer(&self) -> Result<JwsSigner, IdentityError> {
        let inner = match &self.inner {
            Inner::Ed25519(_) => RobotKey::from_pem(&self.pkcs8_pem, "robot key")?.inner,
            Inner::P256(_) => {
                let block = pem::parse(&self.pkcs8_pem)
                    .map_err(|_| IdentityError::NotPem("robot key".into()))?;
                Inner::P256(
                    EcdsaKeyPair::from_pkcs8(
                        &ECDSA_P256_SHA256_FIXED_SIGNING,
                        block.contents(),
                        &SystemRandom::new(),
                    )
                    .map_err(|_| IdentityError::UnsupportedKey("robot key".into()))?,
                )
            }
        };
        Ok(JwsSigner { inner })
    }

    /// The public key in the form `POST /v1/enroll` takes: the raw 32 bytes
    /// in base64 for Ed25519, a SubjectPublicKeyInfo PEM for P-256.
    pub fn enrollment_public_key(&self) -> String {
        match &self.inner {
            Inner::Ed25519(k) => STANDARD.encode(k.public_key().as_ref()),
            Inner::P256(k) => {
                // SPKI = SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 },
                // BIT STRING (0 unused bits) uncompressed point }.
                const PREFIX: [u8; 26] = [
                    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01,
                    0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
                ];
                let mut der = PREFIX.to_vec();
                der.extend_from_slice(k.public_key().as_ref());
                pem::encode(&pem::Pem::new("PUBLIC KEY", der))
            }
        }
    }

    /// A PEM certificate signing request naming `robot_id` (subject CN and
    /// DNS SAN), signed by this key.
    pub fn csr(&self, robot_id: &str) -> Result<String, IdentityError> {
        let key = rcgen::KeyPair::from_pem(&self.pkcs8_pem)
            .map_err(|e| IdentityError::Csr(e.to_string()))?;
        let mut params = rcgen::CertificateParams::new(vec![robot_id.to_owned()])
            .map_err(|e| IdentityError::Csr(e.to_string()))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, robot_id);
        let csr = params
            .serialize_request(&key)
            .map_err(|e| IdentityError::Csr(e.to_string()))?;
        csr.pem().map_err(|e| IdentityError::Csr(e.to_string()))
    }
}

/// The robot's key signing as JWS does (RFC 7518 section 3): `EdDSA` (Ed25519), or `ES256`
/// with the fixed 64-byte r||s signature JWS requires rather than the ASN.1 DER of
/// [`RobotKey::sign`].
pub struct JwsSigner {
    inner: Inner,
}

impl JwsSigner {
    /// The JWS `alg`: `EdDSA` or `ES256`.
    pub fn alg(&self) -> &'static str {
        match self.inner {
            Inner::Ed25519(_) => "EdDSA",
            Inner::P256(_) => "ES256",
        }
    }

    /// The raw public key: 32 bytes (Ed25519) or the uncompressed 65-byte point (P-256).
    pub fn public_key(&self) -> &[u8] {
        match &self.inner {
            Inner::Ed25519(k) => k.public_key().as_ref(),
            Inner::P256(k) => k.public_key().as_ref(),
        }
    }

    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, IdentityError> {
        match &self.inner {
            Inner::Ed25519(k) => Ok(k.sign(message).as_ref().to_vec()),
            Inner::P256(k) => k
                .sign(&SystemRandom::new(), message)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| IdentityError::Sign),
        }
    }
}

/// Reads a PEM certificate chain (leaf first), checking it holds at least
/// one certificate.
pub fn load_certificate_chain(path: &Path) -> Result<String, IdentityError> {
    let text = std::fs::read_to_string(path).map_err(|source| IdentityError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let blocks = pem::parse_many(&text).unwrap_or_default();
    if !blocks.iter().any(|b| b.tag() == "CERTIFICATE") {
        return Err(IdentityError::NotCertificate(path.display().to_string()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1, ED25519};
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn keys_are_created_private_and_reloaded() {
        for kind in [KeyType::Ed25519, KeyType::P256] {
            let dir = crate::testutil::temp_dir("identity");
            let path = dir.join("agent.key");
            let (key, created) = RobotKey::load_or_create(&path, kind).expect("create");
            assert!(created);
            assert_eq!(key.key_type(), kind);
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            let (again, created) = RobotKey::load_or_create(&path, KeyType::Ed25519).expect("load");
            assert!(!created);
            assert_eq!(again.key_type(), kind, "an existing key is kept");
            assert_eq!(again.enrollment_public_key(), key.enrollment_public_key());
        }
    }

    #[test]
    fn signatures_verify_with_the_enrolled_public_key() {
        let message = b"challenge bytes";
        let ed = RobotKey::generate(KeyType::Ed25519).expect("key");
        let raw = STANDARD.decode(ed.enrollment_public_key()).expect("base64");
        assert_eq!(raw.len(), 32);
        UnparsedPublicKey::new(&ED25519, &raw)
            .verify(message, &ed.sign(message).expect("sign"))
            .expect("valid Ed25519 signature");

        let p256 = RobotKey::generate(KeyType::P256).expect("key");
        let spki = pem::parse(p256.enrollment_public_key()).expect("PEM");
        assert_eq!(spki.tag(), "PUBLIC KEY");
        let point = &spki.contents()[26..];
        assert_eq!(point.len(), 65);
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, point)
            .verify(message, &p256.sign(message).expect("sign"))
            .expect("valid P-256 signature");
    }

    #[test]
    fn csr_names_the_robot() {
        for kind in [KeyType::Ed25519, KeyType::P256] {
            let key = RobotKey::generate(kind).expect("key");
            let csr = key.csr("robot-001").expect("csr");
            let block = pem::parse(&csr).expect("PEM");
            assert_eq!(block.tag(), "CERTIFICATE REQUEST");
            // The robot id appears in the DER (CN and SAN).
            let der = block.contents();
            assert!(der.windows(9).any(|w| w == b"robot-001"));
        }
    }

    #[test]
    fn garbage_keys_are_refused() {
        assert!(matches!(
            RobotKey::from_pem("nope", "x"),
            Err(IdentityError::NotPem(_))
        ));
        let wrong = pem::encode(&pem::Pem::new("PRIVATE KEY", vec![1, 2, 3]));
        assert!(matches!(
            RobotKey::from_pem(&wrong, "x"),
            Err(IdentityError::UnsupportedKey(_))
        ));
    }
}

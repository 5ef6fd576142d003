//! The deployment's signing key (Ed25519): the server signs session tickets with it and
//! robots check them against the public keys they pinned at enrollment (docs/security.md,
//! "Session tickets"). All nodes of a cluster sign with the same key (one file, or the one
//! generated into the shared database: `server.rs` decides).
//!
//! A key's id is its RFC 7638 JWK thumbprint (SHA-256 of the canonical public JWK,
//! base64url): a hash of the public key that anyone can recompute from `GET
//! /v1/signing-keys`. During a rotation the previous key is published beside the
//! current one, so robots that enroll meanwhile pin both.
//!
//! Signing is the one piece of JOSE done here rather than by `jsonwebtoken`: its
//! `encode` parses the PKCS#8 key again for every signature, which on this hot path (a
//! ticket for every gateway ARP frame) doubled the cost: 69 µs a ticket against 38 µs with
//! the key parsed once (docs/benchmarks.md, "Session tickets: the cost"). The compact form
//! is three base64url parts (RFC 7515, section 7.1), the header is `jsonwebtoken`'s own
//! `Header` serialised once, and every test (here, the server's, robot-agent's) checks
//! the result with `jsonwebtoken::decode`.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, Header};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde::Serialize;
use signalling_protocol::ticket::KeyEndorsement;
use utoipa::ToSchema;

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo; the raw key follows.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

#[derive(Debug, thiserror::Error)]
pub enum SigningKeyError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("cannot generate a signing key")]
    Generate,
    #[error("cannot serialise what is to be signed: {0}")]
    Claims(#[source] serde_json::Error),
}

/// One public key as a JWK (RFC 8037: `OKP`, `Ed25519`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Jwk {
    /// Always `OKP`.
    #[schema(example = "OKP")]
    pub kty: &'static str,
    /// Always `Ed25519`.
    #[schema(example = "Ed25519")]
    pub crv: &'static str,
    /// The key id: its RFC 7638 thumbprint (SHA-256, base64url).
    pub kid: String,
    /// The raw 32-byte public key, base64url without padding.
    pub x: String,
    /// Always `sig`.
    #[serde(rename = "use")]
    #[schema(example = "sig")]
    pub use_: &'static str,
    /// Always `EdDSA`.
    #[schema(example = "EdDSA")]
    pub alg: &'static str,
}

impl Jwk {
    pub fn ed25519(public: &[u8]) -> Jwk {
        let x = URL_SAFE_NO_PAD.encode(public);
        Jwk {
            kty: "OKP",
            crv: "Ed25519",
            kid: key_id(&x),
            x,
            use_: "sig",
            alg: "EdDSA",
        }
    }
}

/// The public keys robots may check tickets against: the current one first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Jwks {
    pub keys: Vec<Jwk>,
}

/// RFC 7638 thumbprint of an Ed25519 key given by its JWK `x`.
pub fn key_id(x: &str) -> String {
    // The members in lexicographic order, no whitespace (RFC 7638, section 3).
    let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
    let digest = ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes());
    URL_SAFE_NO_PAD.encode(digest.as_ref())
}

/// The key the server signs with, and the previous one still published.
pub struct SigningKeys {
    /// The private key, parsed once.
    pair: Ed25519KeyPair,
    /// The JWS header (`alg`, `kid`), base64url, followed by the `.` of the signing input.
    header_part: String,
    current: Jwk,
    previous: Option<Jwk>,
    /// The current key endorsed by the previous one, when the previous key's private half
    /// was given: robots that pinned the old key learn the new one from it.
    endorsement: Option<String>,
}

impl std::fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the private key.
        f.debug_struct("SigningKeys")
            .field("current", &self.current.kid)
            .field("previous", &self.previous.as_ref().map(|k| &k.kid))
            .finish()
    }
}

impl SigningKeys {
    /// From a PKCS#8 (PEM) Ed25519 private key.
    pub fn from_pkcs8_pem(pem_text: &[u8], path: &Path) -> Result<SigningKeys, SigningKeyError> {
        let der = private_der(pem_text, path)?;
        SigningKeys::from_pkcs8_der(&der).map_err(|message| invalid(path, message))
    }

    fn from_pkcs8_der(der: &[u8]) -> Result<SigningKeys, String> {
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
            .map_err(|e| format!("not an Ed25519 PKCS#8 private key ({e})"))?;
        let current = Jwk::ed25519(pair.public_key().as_ref());
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(current.kid.clone());
        let header_json = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
        Ok(SigningKeys {
            pair,
            header_part: format!("{}.", URL_SAFE_NO_PAD.encode(header_json)),
            current,
            previous: None,
            endorsement: None,
        })
    }

    /// Reads the key file.
    pub fn load(path: &Path) -> Result<SigningKeys, SigningKeyError> {
        let text = read(path)?;
        SigningKeys::from_pkcs8_pem(&text, path)
    }

    /// A new key, as PKCS#8 PEM.
    pub fn generate_pem() -> Result<String, SigningKeyError> {
        let rng = ring::rand::SystemRandom::new();
        let der = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| SigningKeyError::Generate)?;
        Ok(pem::encode(&pem::Pem::new(
            "PRIVATE KEY",
            der.as_ref().to_vec(),
        )))
    }

    /// Publishes the previous key (a PEM private or public key) beside the current one;
    /// a private one also endorses the current key ([`SigningKeys::endorsement`]).
    pub fn with_previous(mut self, path: &Path) -> Result<SigningKeys, SigningKeyError> {
        let text = read(path)?;
        let block = pem::parse(&text).map_err(|e| invalid(path, format!("not PEM: {e}")))?;
        if block.tag() == "PRIVATE KEY" {
            let previous = SigningKeys::from_pkcs8_der(block.contents())
                .map_err(|message| invalid(path, message))?;
            if previous.current.kid != self.current.kid {
                let claims = KeyEndorsement {
                    endorses: vec![serde_json::to_value(&self.current)
                        .map_err(|e| invalid(path, e.to_string()))?],
                    iat: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                };
                self.endorsement = Some(previous.sign(&claims)?);
            }
        }
        let public = match block.tag() {
            "PUBLIC KEY" => block
                .contents()
                .strip_prefix(&ED25519_SPKI_PREFIX[..])
                .filter(|raw| raw.len() == 32)
                .ok_or_else(|| invalid(path, "not an Ed25519 public key".into()))?
                .to_vec(),
            "PRIVATE KEY" => Ed25519KeyPair::from_pkcs8_maybe_unchecked(block.contents())
                .map_err(|e| invalid(path, format!("not an Ed25519 PKCS#8 key ({e})")))?
                .public_key()
                .as_ref()
                .to_vec(),
            other => return Err(invalid(path, format!("a PEM {other}, not a key"))),
        };
        let previous = Jwk::ed25519(&public);
        if previous.kid != self.current.kid {
            self.previous = Some(previous);
        }
        Ok(self)
    }

    /// The current key endorsed by the previous one (a JWS by the previous key over
    /// `KeyEndorsement`), during a rotation whose previous private key was given.
    pub fn endorsement(&self) -> Option<&str> {
        self.endorsement.as_deref()
    }

    /// The id of the key tickets are signed with.
    pub fn kid(&self) -> &str {
        &self.current.kid
    }

    /// The public keys: the current one, then the previous one.
    pub fn jwks(&self) -> Jwks {
        Jwks {
            keys: std::iter::once(self.current.clone())
                .chain(self.previous.clone())
                .collect(),
        }
    }

    /// A compact JWS (EdDSA) of `claims`, with the key id in its header.
    pub fn sign<T: Serialize>(&self, claims: &T) -> Result<String, SigningKeyError> {
        let payload = serde_json::to_vec(claims).map_err(SigningKeyError::Claims)?;
        let mut jws = String::with_capacity(self.header_part.len() + payload.len() * 4 / 3 + 90);
        jws.push_str(&self.header_part);
        URL_SAFE_NO_PAD.encode_string(payload, &mut jws);
        let signature = self.pair.sign(jws.as_bytes());
        jws.push('.');
        URL_SAFE_NO_PAD.encode_string(signature.as_ref(), &mut jws);
        Ok(jws)
    }
}

fn private_der(text: &[u8], path: &Path) -> Result<Vec<u8>, SigningKeyError> {
    let block = pem::parse(text).map_err(|e| invalid(path, format!("not PEM: {e}")))?;
    if block.tag() != "PRIVATE KEY" {
        return Err(invalid(
            path,
            format!(
                "a PEM {}, not a PKCS#8 PRIVATE KEY (openssl genpkey -algorithm ed25519)",
                block.tag()
            ),
        ));
    }
    Ok(block.into_contents())
}

fn read(path: &Path) -> Result<Vec<u8>, SigningKeyError> {
    std::fs::read(path).map_err(|source| SigningKeyError::Io {
        path: path.to_owned(),
        source,
    })
}

fn invalid(path: &Path, message: String) -> SigningKeyError {
    SigningKeyError::Invalid {
        path: path.to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("signing-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_generated_key_loads_with_a_stable_id_and_signs() {
        let pem_text = SigningKeys::generate_pem().unwrap();
        let one = SigningKeys::from_pkcs8_pem(pem_text.as_bytes(), Path::new("t")).unwrap();
        let two = SigningKeys::from_pkcs8_pem(pem_text.as_bytes(), Path::new("t")).unwrap();
        assert_eq!(one.kid(), two.kid());
        let jws = one.sign(&serde_json::json!({"exp": 1})).unwrap();
        let header = jsonwebtoken::decode_header(&jws).unwrap();
        assert_eq!(header.alg, Algorithm::EdDSA);
        assert_eq!(header.kid.as_deref(), Some(one.kid()));
    }

    /// The hand-assembled compact form is what `jsonwebtoken` itself makes and checks:
    /// the same header, a signature that verifies against the published key, the claims
    /// back intact, and any change to any part refused.
    #[test]
    fn a_signature_is_a_jws_that_jsonwebtoken_verifies_and_no_altered_copy_does() {
        let keys = SigningKeys::from_pkcs8_pem(
            SigningKeys::generate_pem().unwrap().as_bytes(),
            Path::new("t"),
        )
        .unwrap();
        let claims =
            serde_json::json!({"exp": u64::MAX / 2, "sub": "alice", "n": [1, "é", {"a": null}]});
        let jws = keys.sign(&claims).unwrap();
        let x = &keys.jwks().keys[0].x;
        let decoding = jsonwebtoken::DecodingKey::from_ed_components(x).unwrap();
        let mut validation = jsonwebtoken::Validation::new(Algorithm::EdDSA);
        validation.validate_aud = false;
        let decoded =
            jsonwebtoken::decode::<serde_json::Value>(&jws, &decoding, &validation).unwrap();
        assert_eq!(decoded.claims, claims);
        let mut expected = Header::new(Algorithm::EdDSA);
        expected.kid = Some(keys.kid().to_owned());
        assert_eq!(decoded.header, expected);
        // Flip one character of each part in turn: never accepted.
        for part in 0..3 {
            let mut parts: Vec<String> = jws.split('.').map(str::to_owned).collect();
            let flipped = if parts[part].starts_with('A') {
                "B"
            } else {
                "A"
            };
            parts[part].replace_range(0..1, flipped);
            let altered = parts.join(".");
            assert!(
                jsonwebtoken::decode::<serde_json::Value>(&altered, &decoding, &validation)
                    .is_err(),
                "part {part} altered and still accepted"
            );
        }
    }

    #[test]
    fn the_key_id_is_the_rfc7638_thumbprint() {
        // RFC 8037, appendix A.3: the thumbprint of its example key.
        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        assert_eq!(key_id(x), "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k");
    }

    #[test]
    fn the_previous_key_is_published_after_the_current_one() {
        let dir = temp_dir();
        let old = dir.join("old.pem");
        std::fs::write(&old, SigningKeys::generate_pem().unwrap()).unwrap();
        let old_kid = SigningKeys::load(&old).unwrap().kid().to_owned();
        let current = SigningKeys::generate_pem().unwrap();
        let keys = SigningKeys::from_pkcs8_pem(current.as_bytes(), Path::new("t"))
            .unwrap()
            .with_previous(&old)
            .unwrap();
        let jwks = keys.jwks();
        assert_eq!(jwks.keys.len(), 2);
        assert_eq!(jwks.keys[0].kid, keys.kid());
        assert_eq!(jwks.keys[1].kid, old_kid);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_file_that_is_not_an_ed25519_key_is_refused() {
        let dir = temp_dir();
        let path = dir.join("bad.pem");
        std::fs::write(
            &path,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(matches!(
            SigningKeys::load(&path),
            Err(SigningKeyError::Invalid { .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}

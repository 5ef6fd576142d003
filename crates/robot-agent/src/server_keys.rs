//! The server's signing keys this robot trusts (`server-keys.json` in the config dir):
//! pinned at enrollment from the server's answer, added by hand with `robot-agent
//! trust-key`. Session tickets are checked against them ([`crate::tickets`]).
//!
//! The file is a JWKS: `{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": …, "x": …}]}`.
//! A key's id is recomputed from `x` (RFC 7638 thumbprint), never taken on trust.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fsutil;

/// File name of the pinned keys, in the config dir.
pub const SERVER_KEYS_FILE: &str = "server-keys.json";

#[derive(Debug, thiserror::Error)]
pub enum ServerKeyError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("not an Ed25519 public key: {0}")]
    BadKey(String),
}

/// One pinned public key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedKey {
    pub kty: String,
    pub crv: String,
    pub kid: String,
    pub x: String,
}

impl PinnedKey {
    /// From the raw key in base64url (a JWK's `x`); the id is computed.
    pub fn from_x(x: &str) -> Result<PinnedKey, ServerKeyError> {
        let x = x.trim();
        let raw = URL_SAFE_NO_PAD
            .decode(x)
            .map_err(|e| ServerKeyError::BadKey(format!("x is not base64url: {e}")))?;
        if raw.len() != 32 {
            return Err(ServerKeyError::BadKey(format!(
                "{} bytes, not 32",
                raw.len()
            )));
        }
        Ok(PinnedKey {
            kty: "OKP".into(),
            crv: "Ed25519".into(),
            kid: key_id(x),
            x: x.to_owned(),
        })
    }

    /// From a JWK (an `OKP`/`Ed25519` object) as `GET /v1/signing-keys` lists them; a
    /// `kid` it carries must be the key's own thumbprint.
    pub fn from_jwk(jwk: &Value) -> Result<PinnedKey, ServerKeyError> {
        let field = |name: &str| jwk.get(name).and_then(Value::as_str);
        if field("kty") != Some("OKP") || field("crv") != Some("Ed25519") {
            return Err(ServerKeyError::BadKey(
                "a JWK must have kty OKP and crv Ed25519".into(),
            ));
        }
        let x = field("x").ok_or_else(|| ServerKeyError::BadKey("the JWK has no x".into()))?;
        let key = PinnedKey::from_x(x)?;
        match field("kid") {
            Some(kid) if kid != key.kid => Err(ServerKeyError::BadKey(format!(
                "kid {kid} is not the key's thumbprint {}",
                key.kid
            ))),
            _ => Ok(key),
        }
    }

    /// What `trust-key` takes: a JWK as JSON, or a bare base64url key.
    pub fn parse(text: &str) -> Result<PinnedKey, ServerKeyError> {
        let text = text.trim();
        if text.starts_with('{') {
            let jwk: Value = serde_json::from_str(text)
                .map_err(|e| ServerKeyError::BadKey(format!("not JSON: {e}")))?;
            PinnedKey::from_jwk(&jwk)
        } else {
            PinnedKey::from_x(text)
        }
    }
}

/// The RFC 7638 thumbprint of an Ed25519 key given by its JWK `x`: the server's key id.
pub fn key_id(x: &str) -> String {
    let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
    let digest = ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes());
    URL_SAFE_NO_PAD.encode(digest.as_ref())
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct KeyFile {
    keys: Vec<PinnedKey>,
}

/// The pinned keys; none when the file does not exist (a robot that never pinned any).
pub fn load(path: &Path) -> Result<Vec<PinnedKey>, ServerKeyError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ServerKeyError::Read {
                path: path.to_owned(),
                source,
            })
        }
    };
    let corrupt = |message: String| ServerKeyError::Corrupt {
        path: path.to_owned(),
        message,
    };
    let file: KeyFile = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
    // Each key is checked again: a hand-edited file must not smuggle in a wrong id.
    file.keys
        .iter()
        .map(|k| {
            let jwk = serde_json::to_value(k).map_err(|e| corrupt(e.to_string()))?;
            PinnedKey::from_jwk(&jwk).map_err(|e| corrupt(e.to_string()))
        })
        .collect()
}

/// Replaces the pinned keys (enrollment: the server just enrolled us over its API).
pub fn save(path: &Path, keys: &[PinnedKey]) -> Result<(), ServerKeyError> {
    let file = KeyFile {
        keys: keys.to_vec(),
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| ServerKeyError::Corrupt {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    fsutil::write_atomic(path, format!("{text}\n").as_bytes()).map_err(|source| {
        ServerKeyError::Write {
            path: path.to_owned(),
            source,
        }
    })
}

/// Adds one key to those pinned; whether it was new.
pub fn add(path: &Path, key: PinnedKey) -> Result<bool, ServerKeyError> {
    let mut keys = load(path)?;
    if keys.iter().any(|k| k.kid == key.kid) {
        return Ok(false);
    }
    keys.push(key);
    save(path, &keys)?;
    Ok(true)
}

/// The keys of a JWKS answer (`{"keys": [...]}`); keys that are not Ed25519 are skipped.
pub fn from_jwks(jwks: &Value) -> Vec<PinnedKey> {
    jwks.get("keys")
        .and_then(Value::as_array)
        .map(|keys| {
            keys.iter()
                .filter_map(|k| PinnedKey::from_jwk(k).ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RFC8037_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
    const RFC8037_KID: &str = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k";

    #[test]
    fn a_key_is_read_from_a_jwk_or_a_bare_x_with_its_thumbprint_as_id() {
        let bare = PinnedKey::parse(RFC8037_X).unwrap();
        assert_eq!(bare.kid, RFC8037_KID);
        let jwk = json!({"kty": "OKP", "crv": "Ed25519", "x": RFC8037_X, "kid": RFC8037_KID});
        assert_eq!(PinnedKey::parse(&jwk.to_string()).unwrap(), bare);
    }

    #[test]
    fn a_jwk_whose_kid_lies_or_that_is_not_ed25519_is_refused() {
        let lying = json!({"kty": "OKP", "crv": "Ed25519", "x": RFC8037_X, "kid": "mine"});
        assert!(PinnedKey::from_jwk(&lying).is_err());
        let ec = json!({"kty": "EC", "crv": "P-256", "x": RFC8037_X});
        assert!(PinnedKey::from_jwk(&ec).is_err());
        assert!(PinnedKey::parse("c2hvcnQ").is_err());
    }

    #[test]
    fn keys_are_added_once_and_a_missing_file_pins_none() {
        let dir = std::env::temp_dir().join(format!("server-keys-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(SERVER_KEYS_FILE);
        assert!(load(&path).unwrap().is_empty());
        let key = PinnedKey::from_x(RFC8037_X).unwrap();
        assert!(add(&path, key.clone()).unwrap());
        assert!(!add(&path, key.clone()).unwrap());
        assert_eq!(load(&path).unwrap(), vec![key]);
        let _ = std::fs::remove_dir_all(dir);
    }
}

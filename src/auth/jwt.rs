//! JWT login for browser clients: HS256 with a shared secret, RS256/ES256 with keys from a
//! JWKS file or URL (refreshed periodically and when an unknown `kid` shows up).

use std::path::PathBuf;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, KeyAlgorithm};
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use serde::Deserialize;

#[derive(Debug, Clone, Default)]
pub struct JwtConfig {
    pub secret: Option<String>,
    pub jwks_url: Option<String>,
    pub jwks_file: Option<PathBuf>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
}

impl JwtConfig {
    pub fn enabled(&self) -> bool {
        self.secret.is_some() || self.jwks_url.is_some() || self.jwks_file.is_some()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    #[error("{0}")]
    Invalid(#[from] jsonwebtoken::errors::Error),
    #[error("algorithm {0:?} is not accepted")]
    Algorithm(Algorithm),
    #[error("no key matches the token")]
    NoKey,
    #[error("cannot load JWKS: {0}")]
    Jwks(String),
}

#[derive(Debug, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub exp: i64,
}

struct JwksKey {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

pub struct JwtVerifier {
    config: JwtConfig,
    hs256: Option<DecodingKey>,
    jwks: RwLock<Vec<JwksKey>>,
    /// When an unknown `kid` last triggered a download (the periodic refresh does not count).
    last_kid_refetch: Mutex<Option<Instant>>,
    http: reqwest::Client,
}

/// How often unknown `kid`s may trigger a JWKS download: the first at once (key rotation),
/// then at most one per period, so forged tokens cannot hammer the identity provider.
const REFETCH_THROTTLE: Duration = Duration::from_secs(30);
/// Background refresh period of a JWKS URL.
pub const JWKS_REFRESH: Duration = Duration::from_secs(300);

impl JwtVerifier {
    pub async fn new(config: JwtConfig) -> Result<JwtVerifier, JwtError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| JwtError::Jwks(e.to_string()))?;
        let verifier = JwtVerifier {
            hs256: config
                .secret
                .as_ref()
                .map(|s| DecodingKey::from_secret(s.as_bytes())),
            config,
            jwks: RwLock::new(Vec::new()),
            last_kid_refetch: Mutex::new(None),
            http,
        };
        if let Some(path) = &verifier.config.jwks_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| JwtError::Jwks(format!("{}: {e}", path.display())))?;
            verifier.install_jwks(&text)?;
        }
        if verifier.config.jwks_url.is_some() {
            verifier.fetch_jwks().await?;
        }
        Ok(verifier)
    }

    pub fn has_jwks_url(&self) -> bool {
        self.config.jwks_url.is_some()
    }

    /// Downloads the JWKS URL and replaces the key set.
    pub async fn fetch_jwks(&self) -> Result<(), JwtError> {
        let Some(url) = &self.config.jwks_url else {
            return Ok(());
        };
        let response = self
            .http
            .get(url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| JwtError::Jwks(e.to_string()))?;
        let text = response
            .text()
            .await
            .map_err(|e| JwtError::Jwks(e.to_string()))?;
        self.install_jwks(&text)
    }

    fn install_jwks(&self, text: &str) -> Result<(), JwtError> {
        let set: JwkSet = serde_json::from_str(text).map_err(|e| JwtError::Jwks(e.to_string()))?;
        let mut keys = Vec::new();
        for jwk in &set.keys {
            // Each key is bound to one algorithm, so a token cannot pick a weaker one.
            let algorithm = match (&jwk.algorithm, jwk.common.key_algorithm) {
                (AlgorithmParameters::RSA(_), None) => Algorithm::RS256,
                (AlgorithmParameters::EllipticCurve(_), None) => Algorithm::ES256,
                (_, Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
                (_, Some(KeyAlgorithm::ES256)) => Algorithm::ES256,
                _ => continue,
            };
            if let Ok(key) = DecodingKey::from_jwk(jwk) {
                keys.push(JwksKey {
                    kid: jwk.common.key_id.clone(),
                    algorithm,
                    key,
                });
            }
        }
        if keys.is_empty() {
            return Err(JwtError::Jwks("no RS256 or ES256 key in the set".into()));
        }
        if let Ok(mut slot) = self.jwks.write() {
            *slot = keys;
        }
        Ok(())
    }

    fn validation(&self, algorithm: Algorithm) -> Validation {
        let mut validation = Validation::new(algorithm);
        validation.leeway = 30;
        validation.validate_nbf = true;
        // jsonwebtoken checks iss/aud only when the claim is present; when we are
        // configured to check them, a token without the claim must fail, not pass.
        let mut required = vec!["exp", "sub"];
        match &self.config.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                required.push("aud");
            }
            None => validation.validate_aud = false,
        }
        if let Some(iss) = &self.config.issuer {
            validation.set_issuer(&[iss]);
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        validation
    }

    pub async fn verify(&self, token: &str) -> Result<Claims, JwtError> {
        let header = decode_header(token)?;
        match header.alg {
            Algorithm::HS256 => {
                let key = self.hs256.as_ref().ok_or(JwtError::Algorithm(header.alg))?;
                Ok(decode::<Claims>(token, key, &self.validation(header.alg))?.claims)
            }
            Algorithm::RS256 | Algorithm::ES256 => {
                if let Some(claims) = self.verify_with_jwks(token, &header)? {
                    return Ok(claims);
                }
                if self.refetch_allowed() {
                    self.fetch_jwks().await?;
                    if let Some(claims) = self.verify_with_jwks(token, &header)? {
                        return Ok(claims);
                    }
                }
                Err(JwtError::NoKey)
            }
            other => Err(JwtError::Algorithm(other)),
        }
    }

    /// `Ok(None)` when no key of the set could be tried.
    fn verify_with_jwks(
        &self,
        token: &str,
        header: &jsonwebtoken::Header,
    ) -> Result<Option<Claims>, JwtError> {
        let keys = self.jwks.read().map_err(|_| JwtError::NoKey)?;
        let candidates = keys.iter().filter(|k| {
            k.algorithm == header.alg
                && match (&header.kid, &k.kid) {
                    (Some(want), Some(have)) => want == have,
                    (Some(_), None) => false,
                    (None, _) => true,
                }
        });
        let mut last_error = None;
        for candidate in candidates {
            match decode::<Claims>(token, &candidate.key, &self.validation(header.alg)) {
                Ok(data) => return Ok(Some(data.claims)),
                Err(e) => last_error = Some(e),
            }
        }
        match last_error {
            Some(e) => Err(e.into()),
            None => Ok(None),
        }
    }

    fn refetch_allowed(&self) -> bool {
        if self.config.jwks_url.is_none() {
            return false;
        }
        match self.last_kid_refetch.lock() {
            Ok(mut last) => {
                let allowed = last.is_none_or(|t| t.elapsed() >= REFETCH_THROTTLE);
                if allowed {
                    *last = Some(Instant::now());
                }
                allowed
            }
            Err(_) => false,
        }
    }
}

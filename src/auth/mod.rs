//! Who is calling: the admin bearer token, client tokens (opaque or JWT), token hashing.

pub mod jwt;
mod secrets;

use std::sync::Arc;

pub use jwt::{JwtConfig, JwtError, JwtVerifier};
pub use secrets::{constant_time_eq, random_token, sha256_hex};

use crate::store::{Store, StoreError};

/// An authenticated browser-side caller.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    pub subject: String,
    /// Set for opaque tokens, so revoking the token can close its connections.
    pub token_id: Option<String>,
    /// Unix milliseconds after which the connection is closed.
    pub expires_at: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("unknown token")]
    UnknownToken,
    #[error("token expired")]
    Expired,
    #[error("token revoked")]
    Revoked,
    #[error("invalid JWT: {0}")]
    Jwt(#[from] JwtError),
    #[error("JWT login is not configured on this server")]
    JwtNotConfigured,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Prefix of opaque client tokens; JWTs are told apart by their three dot-separated parts.
pub const CLIENT_TOKEN_PREFIX: &str = "sct_";

#[derive(Clone)]
pub struct ClientAuthenticator {
    store: Store,
    jwt: Option<Arc<JwtVerifier>>,
}

impl ClientAuthenticator {
    pub fn new(store: Store, jwt: Option<Arc<JwtVerifier>>) -> Self {
        ClientAuthenticator { store, jwt }
    }

    pub async fn authenticate(
        &self,
        token: &str,
        now_ms: i64,
    ) -> Result<ClientIdentity, AuthError> {
        if token.starts_with(CLIENT_TOKEN_PREFIX) {
            let record = self
                .store
                .client_token_by_hash(&sha256_hex(token.as_bytes()))
                .await?
                .ok_or(AuthError::UnknownToken)?;
            if record.revoked_at.is_some() {
                return Err(AuthError::Revoked);
            }
            if record.expires_at <= now_ms {
                return Err(AuthError::Expired);
            }
            return Ok(ClientIdentity {
                subject: record.subject,
                token_id: Some(record.token_id),
                expires_at: Some(record.expires_at),
            });
        }
        if token.split('.').count() == 3 {
            let verifier = self.jwt.as_ref().ok_or(AuthError::JwtNotConfigured)?;
            let claims = verifier.verify(token).await?;
            return Ok(ClientIdentity {
                subject: claims.sub,
                token_id: None,
                expires_at: Some(claims.exp.saturating_mul(1000)),
            });
        }
        Err(AuthError::UnknownToken)
    }
}

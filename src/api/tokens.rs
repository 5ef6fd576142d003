use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

use super::extract::{Admin, ApiJson, ApiPath};
use super::views::TokenCreated;
use super::{rfc3339, ApiError};
use crate::auth::{random_token, sha256_hex, CLIENT_TOKEN_PREFIX};
use crate::state::SharedState;
use crate::store::now_ms;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateToken {
    subject: String,
    ttl_seconds: Option<u64>,
}

const DEFAULT_TTL_SECS: u64 = 24 * 3600;
const MAX_TTL_SECS: u64 = 366 * 24 * 3600;

pub async fn create(
    _: Admin,
    State(state): State<SharedState>,
    ApiJson(body): ApiJson<CreateToken>,
) -> Result<(StatusCode, Json<TokenCreated>), ApiError> {
    if body.subject.is_empty() || body.subject.len() > 256 {
        return Err(ApiError::Unprocessable(
            "subject must be 1-256 characters".into(),
        ));
    }
    let ttl = body.ttl_seconds.unwrap_or(DEFAULT_TTL_SECS);
    if ttl == 0 || ttl > MAX_TTL_SECS {
        return Err(ApiError::Unprocessable(format!(
            "ttlSeconds must be between 1 and {MAX_TTL_SECS}"
        )));
    }
    let token_id = uuid::Uuid::new_v4().to_string();
    let token = random_token(CLIENT_TOKEN_PREFIX);
    let expires_at = now_ms() + (ttl as i64) * 1000;
    state
        .store
        .create_client_token(
            &token_id,
            &body.subject,
            &sha256_hex(token.as_bytes()),
            expires_at,
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(TokenCreated {
            token_id,
            token,
            subject: body.subject,
            expires_at: rfc3339(expires_at),
        }),
    ))
}

pub async fn revoke(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(token_id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    if !state.store.revoke_client_token(&token_id).await? {
        return Err(ApiError::NotFound(format!("no token {token_id}")));
    }
    state.hub.kick_token(&token_id);
    Ok(StatusCode::NO_CONTENT)
}

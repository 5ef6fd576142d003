use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;

use super::extract::{Admin, ApiJson, ApiPath};
use super::views::{TokenCreated, TokenView};
use super::{rfc3339, ApiError};
use crate::auth::{random_token, sha256_hex, CLIENT_TOKEN_PREFIX};
use crate::state::SharedState;
use crate::store::now_ms;

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateToken {
    /// 1-256 characters: who the token logs in as.
    #[schema(min_length = 1, max_length = 256)]
    subject: String,
    /// Default 24 h, at most 366 days.
    #[schema(minimum = 1, maximum = 31_622_400)]
    #[serde(default, deserialize_with = "whole_seconds")]
    ttl_seconds: Option<u64>,
}

/// JSON has one number type: `3600.0` is the integer 3600 to JSON Schema (and to the
/// OpenAPI document), so it is accepted; a fraction or a negative number is not.
fn whole_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(v) = n.as_u64() {
        return Ok(Some(v));
    }
    match n.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f <= u64::MAX as f64 => Ok(Some(f as u64)),
        _ => Err(serde::de::Error::custom(
            "ttlSeconds must be a whole number of seconds",
        )),
    }
}

const DEFAULT_TTL_SECS: u64 = 24 * 3600;
const MAX_TTL_SECS: u64 = 366 * 24 * 3600;

/// Creates an opaque client token (shown once, stored hashed).
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", security(("admin" = [])),
    request_body = CreateToken,
    responses((status = 201, body = TokenCreated), super::error::CommonErrors))]
pub async fn create(
    _: Admin,
    State(state): State<SharedState>,
    ApiJson(body): ApiJson<CreateToken>,
) -> Result<(StatusCode, Json<TokenCreated>), ApiError> {
    if body.subject.is_empty() || body.subject.chars().count() > 256 {
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

/// Every client token (id, subject, expiry, revocation; never the secret), newest first,
/// at most 1000.
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", security(("admin" = [])),
    responses((status = 200, body = Vec<TokenView>), super::error::CommonErrors))]
pub async fn list(_: Admin, State(state): State<SharedState>) -> Result<Response, ApiError> {
    let tokens = state.store.client_tokens(1000).await?;
    let views: Vec<TokenView> = tokens.iter().map(TokenView::new).collect();
    Ok(Json(views).into_response())
}

/// Revokes a client token; connections that logged in with it close (code 4003).
#[utoipa::path(delete, path = "/v1/tokens/{token_id}", tag = "tokens", security(("admin" = [])),
    params(("token_id" = String, Path, description = "tokenId")),
    responses((status = 204, description = "revoked"), super::error::CommonErrors))]
pub async fn revoke(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(token_id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    if !state.store.revoke_client_token(&token_id).await? {
        return Err(ApiError::NotFound(format!("no token {token_id}")));
    }
    state.presence.kick_token(&token_id);
    Ok(StatusCode::NO_CONTENT)
}

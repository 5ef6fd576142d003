//! Request extractors whose failures are JSON `ApiError`s, never axum's plain-text ones.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};

use super::ApiError;
use crate::auth::{constant_time_eq, sha256_hex, ClientIdentity};
use crate::state::SharedState;

#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let text = rejection.body_text();
        match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(text),
            StatusCode::UNPROCESSABLE_ENTITY => ApiError::Unprocessable(text),
            _ => ApiError::BadRequest(text),
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}

/// Proof that the request carries the admin bearer token.
pub struct Admin;

impl FromRequestParts<SharedState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &SharedState) -> Result<Self, ApiError> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| ApiError::Unauthorized("admin bearer token required".into()))?;
        let presented = sha256_hex(token.trim().as_bytes());
        if constant_time_eq(presented.as_bytes(), state.admin_token_hash.as_bytes()) {
            Ok(Admin)
        } else {
            Err(ApiError::Unauthorized("invalid admin token".into()))
        }
    }
}

/// A browser-side caller: the bearer is a client token (`sct_…`) or a JWT, checked the same
/// way as at the `/ws` upgrade.
pub struct Client(pub ClientIdentity);

impl FromRequestParts<SharedState> for Client {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &SharedState) -> Result<Self, ApiError> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| ApiError::Unauthorized("client bearer token required".into()))?;
        let identity = state
            .clients
            .authenticate(token.trim(), crate::store::now_ms())
            .await?;
        Ok(Client(identity))
    }
}

/// Who may read a robot's records or stop it from the API: the admin, or a client holding
/// the owner's grant on it.
pub enum OwnerOrAdmin {
    Admin,
    Owner(ClientIdentity),
}

impl OwnerOrAdmin {
    /// The subject to put on record.
    pub fn subject(&self) -> &str {
        match self {
            OwnerOrAdmin::Admin => "admin",
            OwnerOrAdmin::Owner(who) => &who.subject,
        }
    }

    pub async fn check(
        state: &SharedState,
        headers: &axum::http::HeaderMap,
        robot_id: &str,
    ) -> Result<OwnerOrAdmin, ApiError> {
        let Some(identity) = client_unless_admin(state, headers).await? else {
            return Ok(OwnerOrAdmin::Admin);
        };
        match state.store.grant(robot_id, &identity.subject).await? {
            Some(crate::store::Role::Owner) => Ok(OwnerOrAdmin::Owner(identity)),
            _ => Err(ApiError::Forbidden(format!(
                "only robot {robot_id}'s owners and the admin may do this"
            ))),
        }
    }
}

/// Who may read what a robot shows its users (its public key): the admin, or a client
/// holding any grant on it; anyone else is refused (403 whether or not the robot exists).
pub async fn require_grant_or_admin(
    state: &SharedState,
    headers: &axum::http::HeaderMap,
    robot_id: &str,
) -> Result<(), ApiError> {
    let Some(identity) = client_unless_admin(state, headers).await? else {
        return Ok(());
    };
    match state.store.grant(robot_id, &identity.subject).await? {
        Some(_) => Ok(()),
        None => Err(ApiError::Forbidden(format!(
            "only holders of a grant on robot {robot_id} and the admin may do this"
        ))),
    }
}

/// The bearer's client identity, or `None` for the admin token.
async fn client_unless_admin(
    state: &SharedState,
    headers: &axum::http::HeaderMap,
) -> Result<Option<ClientIdentity>, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| ApiError::Unauthorized("bearer token required".into()))?;
    let presented = sha256_hex(token.as_bytes());
    if constant_time_eq(presented.as_bytes(), state.admin_token_hash.as_bytes()) {
        return Ok(None);
    }
    let identity = state
        .clients
        .authenticate(token, crate::store::now_ms())
        .await?;
    Ok(Some(identity))
}

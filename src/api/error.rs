use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::{IntoResponses, ToSchema};

use crate::auth::AuthError;
use crate::identity::{EnrollError, IdentityError};
use crate::store::StoreError;

/// Every HTTP error, mapped once to a status and a JSON body `{error, message}`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    Unprocessable(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "BAD_REQUEST",
            ApiError::Unauthorized(_) => "UNAUTHORIZED",
            ApiError::Forbidden(_) => "FORBIDDEN",
            ApiError::NotFound(_) => "NOT_FOUND",
            ApiError::MethodNotAllowed(_) => "METHOD_NOT_ALLOWED",
            ApiError::Conflict(_) => "CONFLICT",
            ApiError::PayloadTooLarge(_) => "PAYLOAD_TOO_LARGE",
            ApiError::Unprocessable(_) => "UNPROCESSABLE",
            ApiError::Unavailable(_) => "UNAVAILABLE",
            ApiError::Internal(_) => "INTERNAL_ERROR",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(detail) = &self {
            // The detail goes to the log, never to the caller.
            tracing::error!(error = %detail, "request failed");
        }
        crate::http_error::response(self.status(), self.code(), &self.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Internal(e.to_string())
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Store(e) => e.into(),
            other => ApiError::Unauthorized(other.to_string()),
        }
    }
}

impl From<IdentityError> for ApiError {
    fn from(e: IdentityError) -> Self {
        ApiError::Internal(e.to_string())
    }
}

impl From<EnrollError> for ApiError {
    fn from(e: EnrollError) -> Self {
        match e {
            EnrollError::BadToken => ApiError::Unauthorized(e.to_string()),
            EnrollError::Revoked => ApiError::Forbidden(e.to_string()),
            EnrollError::Store(e) => e.into(),
            EnrollError::Shape | EnrollError::Key(_) | EnrollError::NoCa | EnrollError::Csr(_) => {
                ApiError::Unprocessable(e.to_string())
            }
        }
    }
}

/// The one JSON shape of every HTTP error (`crate::http_error`).
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    /// `BAD_REQUEST`, `UNAUTHORIZED`, `FORBIDDEN`, `NOT_FOUND`, `METHOD_NOT_ALLOWED`,
    /// `CONFLICT`, `PAYLOAD_TOO_LARGE`, `UNPROCESSABLE`, `UNAVAILABLE`, `INTERNAL_ERROR`.
    pub error: String,
    pub message: String,
}

/// The error answers any route may give; which ones a route gives in practice is in
/// docs/api.md.
#[derive(IntoResponses)]
#[allow(dead_code)] // only its schema is used
pub enum CommonErrors {
    /// Malformed JSON, path or query.
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// Missing or wrong bearer token (or enrollment token).
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// Refused: a revoked key at enrollment.
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// No such robot, grant or token.
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// The robot exists already.
    #[response(status = 409)]
    Conflict(ErrorBody),
    /// Body over 64 KiB.
    #[response(status = 413)]
    PayloadTooLarge(ErrorBody),
    /// Well-formed JSON of the wrong shape, or values out of range.
    #[response(status = 422)]
    Unprocessable(ErrorBody),
    /// Internal failure (details only in the server's log).
    #[response(status = 500)]
    Internal(ErrorBody),
    /// The database does not answer, or the server is shutting down.
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

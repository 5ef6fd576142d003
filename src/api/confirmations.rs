//! People approve what robots mark as critical (the ARP gateway's confirmations): the
//! console lists the requests of the robots its user may drive and answers them. The first
//! answer wins, on whichever node it is given; `confirmedBy` is that person's subject.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::{ApiJson, ApiPath, Client};
use super::ApiError;
use crate::state::SharedState;
use crate::store::{Confirmation, Decision};

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Answer {
    /// true: approve; false: deny.
    pub confirmed: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Answered {
    pub id: String,
    pub confirmed: bool,
    pub confirmed_by: String,
}

/// Requests for approval waiting on the robots the caller owns, oldest first.
#[utoipa::path(get, path = "/v1/confirmations", tag = "me", security(("client" = [])),
    responses((status = 200, body = Vec<Confirmation>), super::error::CommonErrors))]
pub async fn list(
    Client(who): Client,
    State(state): State<SharedState>,
) -> Result<Json<Vec<Confirmation>>, ApiError> {
    let now = crate::store::now_ms();
    Ok(Json(
        state
            .store
            .open_confirmations_for(&who.subject, now)
            .await?,
    ))
}

/// Approves or denies a request (owners of its robot, never the program that asked). 409 once answered or expired.
#[utoipa::path(post, path = "/v1/confirmations/{id}", tag = "me", security(("client" = [])),
    params(("id" = String, Path, description = "confirmation id")),
    request_body = Answer,
    responses((status = 200, body = Answered), (status = 409, description = "already answered or expired"),
        super::error::CommonErrors))]
pub async fn answer(
    Client(who): Client,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(answer): ApiJson<Answer>,
) -> Result<Json<Answered>, ApiError> {
    let Some(request) = state.store.confirmation(&id).await? else {
        return Err(ApiError::NotFound(format!("no confirmation {id}")));
    };
    let role = state.store.grant(&request.robot_id, &who.subject).await?;
    // A critical call waits for a person who owns the robot: an operator (whose own
    // program may be the one asking) approves nothing (issue 41).
    if !matches!(role, Some(crate::store::Role::Owner)) {
        return Err(ApiError::Forbidden(format!(
            "only owners of robot {} answer its confirmations",
            request.robot_id
        )));
    }
    if who.subject == request.requested_by {
        return Err(ApiError::Forbidden(
            "the program that asked cannot approve its own call".into(),
        ));
    }
    let decision = Decision {
        confirmed: answer.confirmed,
        decided_by: who.subject.clone(),
    };
    if !state
        .store
        .decide_confirmation(&id, &decision, crate::store::now_ms())
        .await?
    {
        return Err(ApiError::Conflict(format!(
            "confirmation {id} was already answered or has expired"
        )));
    }
    tracing::warn!(confirmation = %id, robot = %request.robot_id, confirmed = answer.confirmed, by = %who.subject, "confirmation answered");
    Ok(Json(Answered {
        id,
        confirmed: answer.confirmed,
        confirmed_by: who.subject,
    }))
}

//! The caller's own view, for browser clients (the console's user view, the SDK's login
//! check): who the token names and the robots it holds grants on. Authenticated with the
//! client token or JWT, never the admin token.

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::extract::Client;
use super::views::RoleName;
use super::{rfc3339, ApiError};
use crate::state::SharedState;
use crate::store::Role;

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Me {
    /// The subject the token names (grants are held by subjects).
    pub subject: String,
    /// When the token stops working (RFC 3339), if it expires.
    pub expires_at: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MyRobot {
    pub robot_id: String,
    pub name: Option<String>,
    pub online: bool,
    pub last_seen_at: Option<String>,
    /// The caller's role on this robot.
    #[schema(value_type = RoleName)]
    pub role: Role,
}

/// Who the bearer token names.
#[utoipa::path(get, path = "/v1/me", tag = "me", security(("client" = [])),
    responses((status = 200, body = Me), super::error::CommonErrors))]
pub async fn me(Client(who): Client) -> Json<Me> {
    Json(Me {
        subject: who.subject,
        expires_at: who.expires_at.and_then(rfc3339),
    })
}

/// The robots the caller holds a grant on, with their online state and the caller's role.
#[utoipa::path(get, path = "/v1/me/robots", tag = "me", security(("client" = [])),
    responses((status = 200, body = Vec<MyRobot>), super::error::CommonErrors))]
pub async fn robots(
    Client(who): Client,
    State(state): State<SharedState>,
) -> Result<Json<Vec<MyRobot>>, ApiError> {
    let grants = state.store.grants_of_subject(&who.subject).await?;
    // Online on any node (several nodes share presence through Redis).
    let ids: Vec<&str> = grants.iter().map(|g| g.robot_id.as_str()).collect();
    let online = super::robots::presence(&state, &ids).await;
    let mut out = Vec::with_capacity(grants.len());
    for grant in grants {
        // A grant outlives nothing: deleting a robot deletes its grants, so a miss here is
        // a robot deleted a moment ago, left out.
        let Some(robot) = state.store.robot(&grant.robot_id).await? else {
            continue;
        };
        out.push(MyRobot {
            online: online.contains_key(&robot.robot_id),
            last_seen_at: robot.last_seen_at.and_then(rfc3339),
            robot_id: robot.robot_id,
            name: robot.name,
            role: grant.role,
        });
    }
    Ok(Json(out))
}

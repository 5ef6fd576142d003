//! The ARP gateway: a program reaches the ARP server of any robot it may drive through
//! `GET /v1/robots/{robotId}/arp`, with the same credentials and rules as a person.
//!
//! The connection is a session like a teleop one (relay::Sessions, kind ARP): opened by the
//! program's `arp.initialize`, with its record, the control lock for an operator or owner,
//! the viewer caps, the end on a grant withdrawn or a robot revoked, on any node of a
//! cluster. Its frames travel to the robot as `arp.frame` envelopes on the robot's
//! signalling socket (docs/protocol.md, "ARP sessions"). `rules` holds what the gateway
//! refuses itself; every tool call and e-stop goes on record (store::AuditLog).

mod confirm;
mod connection;
mod rules;

use std::net::SocketAddr;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use signalling_protocol::arp::{valid_signature_nonce, MAX_FRAME_BYTES};

use crate::http_error;
use crate::state::SharedState;
use crate::ws::{find_token, UpgradeError, WsQuery};

/// `?signed=<nonce>`: the program wants every frame of the robot signed by it, binding
/// this nonce (docs/arp.md, "Frames signed by the robot").
#[derive(Debug, Deserialize)]
struct SigningQuery {
    signed: Option<String>,
}

/// The gateway's route, merged into the app at the top.
pub fn router() -> Router<SharedState> {
    Router::new().route("/v1/robots/{id}/arp", get(upgrade))
}

/// Checks everything that can be checked before the upgrade: capacity, the credentials
/// and a grant on the robot (403 without one).
async fn upgrade(
    State(state): State<SharedState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(robot_id): Path<String>,
    Query(query): Query<WsQuery>,
    Query(signing): Query<SigningQuery>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if state.is_shutting_down() {
        return UpgradeError::ShuttingDown.into_response();
    }
    if let Some(nonce) = signing.signed.as_deref() {
        if !valid_signature_nonce(nonce) {
            return http_error::response(
                StatusCode::BAD_REQUEST,
                "BAD_REQUEST",
                "signed: a nonce of 16 to 128 characters of A-Z a-z 0-9 - _",
            );
        }
    }
    let permit = match state.admission.admit(peer.ip()) {
        Ok(permit) => permit,
        Err(e) => return UpgradeError::from(e).into_response(),
    };
    let (token, protocol) = find_token(&query, &headers);
    let Some(token) = token else {
        return http_error::response(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "a client token is required (Authorization: Bearer or ?token=)",
        );
    };
    // Read before the token check: see `Presence::set_client`.
    let cuts_seen = state.presence.access_cuts();
    let identity = match state
        .clients
        .authenticate(&token, crate::store::now_ms())
        .await
    {
        Ok(identity) => identity,
        Err(e) => return UpgradeError::from(e).into_response(),
    };
    match state.store.grant(&robot_id, &identity.subject).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return http_error::response(
                StatusCode::FORBIDDEN,
                "FORBIDDEN",
                &format!("no grant for robot {robot_id}"),
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "grant lookup failed");
            return http_error::response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "INTERNAL_ERROR",
                "internal error",
            );
        }
    }
    // Frames over the ARP cap are read and answered -32600 (as robot-agent does); only
    // past twice the cap is the socket closed unread.
    let mut ws = ws
        .max_message_size(2 * MAX_FRAME_BYTES)
        .max_frame_size(2 * MAX_FRAME_BYTES);
    if let Some(protocol) = protocol {
        ws = ws.protocols([protocol]);
    }
    let nonce = signing.signed;
    ws.on_upgrade(move |socket| {
        connection::start(state, socket, identity, robot_id, cuts_seen, permit, nonce);
        std::future::ready(())
    })
}

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
mod gateway;
mod program;
mod robot;
mod rules;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use signalling_protocol::arp::{valid_signature_nonce, MAX_FRAME_BYTES};

use crate::auth::ClientIdentity;
use crate::http_error;
use crate::relay::ConnId;
use crate::state::SharedState;
use crate::ws::{admit, connection, in_process, WsQuery};

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

/// A grant of `subject` on `robot_id`, or the answer without one: 403 (500 when the store
/// cannot tell). The gateway's upgrade and the MCP endpoint both check it before anything.
pub(crate) async fn check_grant(
    state: &SharedState,
    robot_id: &str,
    subject: &str,
) -> Result<(), Response> {
    match state.store.grant(robot_id, subject).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(http_error::response(
            StatusCode::FORBIDDEN,
            "FORBIDDEN",
            &format!("no grant for robot {robot_id}"),
        )),
        Err(e) => {
            tracing::error!(error = %e, "grant lookup failed");
            Err(http_error::response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "INTERNAL_ERROR",
                "internal error",
            ))
        }
    }
}

/// A gateway session run in this process rather than on a socket (the MCP endpoint,
/// `crate::mcp`): the same [`gateway::Gateway`], so the same lock, takeover, confirmations,
/// audit, tickets, limits and metrics; its ARP frames go through the channels returned.
pub(crate) fn open_in_process(
    state: &SharedState,
    opening: connection::Opening,
    identity: ClientIdentity,
    robot_id: String,
) -> in_process::InProcess {
    let span = tracing::info_span!("arp", conn = %opening.conn, robot = %robot_id);
    in_process::start(state.clone(), opening, span, move |state, conn, _| {
        gateway::Gateway::new(state, conn, identity, robot_id, None)
    })
}

/// Checks everything that can be checked before the upgrade: first a browser's `Origin`
/// (the MCP endpoint's check and `--allow-origin`: browsers let any page open a WebSocket
/// anywhere, so a page of another origin is refused 403 before its token is looked at),
/// the nonce, what every socket passes (`ws::admit`: capacity, a client token) and a grant
/// on the robot (403 without one).
async fn upgrade(
    State(state): State<SharedState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(robot_id): Path<String>,
    Query(query): Query<WsQuery>,
    Query(signing): Query<SigningQuery>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if !crate::origin::allowed(&headers, &state.config.allow_origins) {
        tracing::debug!(robot = %robot_id, "ARP upgrade from a web origin not allowed");
        return crate::origin::refused();
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
    let mut admitted = match admit(&state, peer, &query, &headers, true).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let Some(identity) = admitted.client.clone() else {
        // Unreachable: `admit` refuses a socket without a token here.
        return http_error::response(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "no token");
    };
    if let Err(refused) = check_grant(&state, &robot_id, &identity.subject).await {
        return refused;
    }
    // Frames over the ARP cap are read and answered -32600 (as robot-agent does); only
    // past twice the cap is the socket closed unread.
    let ws = admitted.upgrade(ws, 2 * MAX_FRAME_BYTES);
    let nonce = signing.signed;
    ws.on_upgrade(move |socket| {
        let conn: ConnId = Arc::from(format!("arp-{}", uuid::Uuid::new_v4()));
        let span = tracing::info_span!("arp", conn = %conn, robot = %robot_id);
        let opening = admitted.opening(conn);
        connection::start(state, socket, opening, span, move |state, conn, _| {
            gateway::Gateway::new(state, conn, identity, robot_id, nonce)
        });
        std::future::ready(())
    })
}

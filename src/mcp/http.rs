//! The endpoint's HTTP side, MCP's Streamable HTTP transport (2025-06-18): `POST` one
//! JSON-RPC message (a request is answered in JSON, or a `tools/call` of a client that
//! accepts `text/event-stream` by an SSE stream of its own: its progress and questions,
//! then its answer; anything else 202), `GET` the stream of what the server sends unasked
//! (SSE; with `Last-Event-ID`, the rest of a lost stream), `DELETE` the session. Every request passes the
//! `Origin` check (`super::origin`, a layer, 403) and then what the gateway's upgrade checks
//! (`ws::admit`: capacity, a client token, 401), and `initialize` a grant on the robot
//! (403), before any MCP exchange.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arp_bridge::jsonrpc;
use arp_bridge::mcp::PROTOCOL_VERSIONS;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};

use super::registry::{Answer, Event as Sent, Handle, Input, Registry};
use super::session;
use crate::http_error;
use crate::relay::ConnId;
use crate::state::SharedState;
use crate::ws::{admit, Admitted, WsQuery};

pub const SESSION_HEADER: &str = "mcp-session-id";
pub const VERSION_HEADER: &str = "mcp-protocol-version";
const LAST_EVENT_ID: &str = "last-event-id";
/// Longest a request waits for its answer: the robot bounds its calls (30 s drives, 300 s
/// other tools and confirmations), so this is only a backstop.
const ANSWER_WAIT: Duration = Duration::from_secs(330);
/// Events an SSE stream may have queued; past it the stream ends and the client resumes
/// it (`Last-Event-ID`).
const STREAM_QUEUE: usize = 64;
/// SSE comments on a quiet stream, so proxies keep it and a gone client is noticed.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `POST /v1/robots/{id}/mcp`.
pub async fn post(
    State(state): State<SharedState>,
    Extension(registry): Extension<Arc<Registry>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(robot_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let admitted = match admit(&state, peer, &WsQuery::default(), &headers, true).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    if let Err(refused) = check_version(&headers) {
        return *refused;
    }
    let object = match parse(&body) {
        Ok(object) => object,
        Err(refused) => return *refused,
    };
    let Some(session_id) = session_id(&headers) else {
        return initialize(&state, &registry, admitted, robot_id, object).await;
    };
    let handle = match find(&registry, &admitted, &robot_id, &session_id) {
        Ok(handle) => handle,
        Err(refused) => return *refused,
    };
    // The session's gateway connection holds its place; this request needs none.
    drop(admitted);
    let is_request = object.contains_key("method") && object.contains_key("id");
    if is_request {
        let id = object.get("id").cloned().unwrap_or(Value::Null);
        // Only a tool call has messages of its own before its answer (progress, the
        // question of a confirmation); a client that takes SSE gets them on its stream.
        let calls = object.get("method").and_then(Value::as_str) == Some("tools/call");
        if calls && accepts_sse(&headers) {
            return ask_streamed(&handle, id, object);
        }
        return ask(&handle, id, object).await;
    }
    match handle.inputs.try_send(Input::Message(object)) {
        Ok(()) => StatusCode::ACCEPTED.into_response(),
        Err(e) => input_refused(e),
    }
}

/// A `POST` without a session: only `initialize`, which opens one (a grant needed).
async fn initialize(
    state: &SharedState,
    registry: &Arc<Registry>,
    admitted: Admitted,
    robot_id: String,
    object: Map<String, Value>,
) -> Response {
    if object.get("method").and_then(Value::as_str) != Some("initialize") {
        return http_error::response(
            StatusCode::BAD_REQUEST,
            "BAD_REQUEST",
            "Mcp-Session-Id is required: open a session with initialize first",
        );
    }
    let id = object.get("id").cloned().unwrap_or(Value::Null);
    let Some(identity) = admitted.client.clone() else {
        // Unreachable: `admit` refuses a request without a token here.
        return http_error::response(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "no token");
    };
    if let Err(refused) = crate::arp::check_grant(state, &robot_id, &identity.subject).await {
        return refused;
    }
    if !registry.has_room(&identity.subject) {
        return http_error::response(
            StatusCode::TOO_MANY_REQUESTS,
            "TOO_MANY_REQUESTS",
            "too many MCP sessions for this subject; end one (DELETE) first",
        );
    }
    let elicits = object
        .get("params")
        .and_then(Value::as_object)
        .is_some_and(arp_bridge::mcp::client_elicits);
    let conn: ConnId = Arc::from(format!("mcp-{}", uuid::Uuid::new_v4()));
    let opening = admitted.opening(conn);
    let (session_id, handle) =
        match session::open(state, registry, opening, identity, robot_id, elicits).await {
            Ok(opened) => opened,
            Err(e) => return json(e.to_response(&id).to_string()),
        };
    let mut answer = ask(&handle, id, object).await;
    if let Ok(value) = HeaderValue::from_str(&session_id) {
        answer.headers_mut().insert(SESSION_HEADER, value);
    }
    answer
}

/// `GET /v1/robots/{id}/mcp`: the session's stream of what the server sends unasked.
pub async fn get(
    State(state): State<SharedState>,
    Extension(registry): Extension<Arc<Registry>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(robot_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let admitted = match admit(&state, peer, &WsQuery::default(), &headers, true).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    if !accepts_sse(&headers) {
        return http_error::response(
            StatusCode::NOT_ACCEPTABLE,
            "NOT_ACCEPTABLE",
            "GET serves text/event-stream only",
        );
    }
    let Some(session_id) = session_id(&headers) else {
        return http_error::response(
            StatusCode::BAD_REQUEST,
            "BAD_REQUEST",
            "Mcp-Session-Id is required",
        );
    };
    let handle = match find(&registry, &admitted, &robot_id, &session_id) {
        Ok(handle) => handle,
        Err(refused) => return *refused,
    };
    let last_event_id = headers
        .get(LAST_EVENT_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    let input = Input::Stream {
        events: tx,
        last_event_id,
    };
    if let Err(e) = handle.inputs.try_send(input) {
        return input_refused(e);
    }
    // The stream holds a place as a socket does, for as long as it is open.
    sse(rx, admitted.permit)
}

fn accepts_sse(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

/// An SSE response of the events on `rx`, until the session lets it go; `hold` lives as
/// long as the stream.
fn sse<T: Send + 'static>(rx: mpsc::Receiver<Sent>, hold: T) -> Response {
    let events = futures_util::stream::unfold((rx, hold), |(mut rx, hold)| async move {
        let sent = rx.recv().await?;
        let event = Event::default()
            .event("message")
            .id(sent.id)
            .data(sent.line);
        Some((Ok::<_, Infallible>(event), (rx, hold)))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

/// `DELETE /v1/robots/{id}/mcp`: ends the session (its gateway session too).
pub async fn delete(
    State(state): State<SharedState>,
    Extension(registry): Extension<Arc<Registry>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(robot_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let admitted = match admit(&state, peer, &WsQuery::default(), &headers, true).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let Some(session_id) = session_id(&headers) else {
        return http_error::response(
            StatusCode::BAD_REQUEST,
            "BAD_REQUEST",
            "Mcp-Session-Id is required",
        );
    };
    if let Err(refused) = find(&registry, &admitted, &robot_id, &session_id) {
        return *refused;
    }
    registry.remove(&session_id);
    StatusCode::NO_CONTENT.into_response()
}

fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The session named, if it is the caller's own on this robot: anyone else's is as
/// unknown as one that ended (404, so the client opens a new one).
fn find(
    registry: &Registry,
    admitted: &Admitted,
    robot_id: &str,
    session_id: &str,
) -> Result<Arc<Handle>, Box<Response>> {
    let subject = admitted.client.as_ref().map(|c| c.subject.as_str());
    registry
        .get(session_id)
        .filter(|h| Some(h.subject.as_str()) == subject && h.robot_id == robot_id)
        .ok_or_else(|| {
            Box::new(http_error::response(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                "no such MCP session (it ended, or was never opened): initialize again",
            ))
        })
}

/// A version the client says it speaks must be one this endpoint answers.
fn check_version(headers: &HeaderMap) -> Result<(), Box<Response>> {
    match headers.get(VERSION_HEADER).map(|v| v.to_str()) {
        None => Ok(()),
        Some(Ok(v)) if PROTOCOL_VERSIONS.contains(&v) => Ok(()),
        Some(_) => Err(Box::new(http_error::response(
            StatusCode::BAD_REQUEST,
            "BAD_REQUEST",
            &format!(
                "unsupported MCP-Protocol-Version; supported: {}",
                PROTOCOL_VERSIONS.join(", ")
            ),
        ))),
    }
}

/// The body as one JSON-RPC message; a JSON-RPC error (HTTP 400) otherwise.
fn parse(body: &[u8]) -> Result<Map<String, Value>, Box<Response>> {
    let refusal = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => return Ok(object),
        Ok(Value::Array(_)) => jsonrpc::error(
            &Value::Null,
            jsonrpc::INVALID_REQUEST,
            "batches are not supported: send one message per request",
            None,
        ),
        Ok(_) => jsonrpc::error(
            &Value::Null,
            jsonrpc::INVALID_REQUEST,
            "a JSON-RPC message is an object",
            None,
        ),
        Err(e) => jsonrpc::error(
            &Value::Null,
            jsonrpc::PARSE_ERROR,
            &format!("not JSON: {e}"),
            None,
        ),
    };
    let mut response = json(refusal.to_string());
    *response.status_mut() = StatusCode::BAD_REQUEST;
    Err(Box::new(response))
}

/// A request for the session's task, answered by an SSE stream of its own: the messages
/// related to it, then its answer. The session's task ends the stream (and bounds the
/// wait: the robot bounds its calls, and the session ending answers every request).
fn ask_streamed(handle: &Handle, id: Value, object: Map<String, Value>) -> Response {
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    let input = Input::Request {
        id,
        object,
        answer: Answer::Events(tx),
    };
    if let Err(e) = handle.inputs.try_send(input) {
        return input_refused(e);
    }
    sse(rx, ())
}

/// A request for the session's task; its answer, in JSON.
async fn ask(handle: &Handle, id: Value, object: Map<String, Value>) -> Response {
    let (answer, answered) = oneshot::channel();
    let input = Input::Request {
        id: id.clone(),
        object,
        answer: Answer::Json(answer),
    };
    if let Err(e) = handle.inputs.try_send(input) {
        return input_refused(e);
    }
    let error = |message: &str, reason: &str| {
        let data = json!({ "reason": reason });
        json(jsonrpc::error(&id, jsonrpc::INTERNAL_ERROR, message, Some(data)).to_string())
    };
    match tokio::time::timeout(ANSWER_WAIT, answered).await {
        Ok(Ok(line)) => json(line),
        Ok(Err(_)) => error("the MCP session ended before answering", "session_ended"),
        Err(_) => error("no answer in time", "timeout"),
    }
}

fn input_refused(e: TrySendError<Input>) -> Response {
    match e {
        TrySendError::Full(_) => http_error::response(
            StatusCode::TOO_MANY_REQUESTS,
            "TOO_MANY_REQUESTS",
            "too many messages queued for this MCP session",
        ),
        TrySendError::Closed(_) => http_error::response(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "the MCP session ended: initialize again",
        ),
    }
}

fn json(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

//! Modulr's existing browser clients (issue 11): flat frames in, flat frames out, with
//! every check of the spec path; robots stay on the spec.

use serde_json::{json, Value};

use crate::helpers::*;

fn flat_offer(robot: &str, from: &str) -> Value {
    json!({"type": "offer", "to": robot, "from": from, "sdp": "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"})
}

fn flat_candidate(kind: &str, robot: &str, from: &str) -> Value {
    json!({"type": kind, "to": robot, "from": from, "candidate": {
        "candidate": "candidate:1 1 UDP 2130706431 127.0.0.1 5000 typ host",
        "sdpMid": "0", "sdpMLineIndex": 0}})
}

#[tokio::test]
async fn a_legacy_browser_runs_a_session_both_ways() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut browser = server.client_for("robot-1", "alice", "operator").await;
    let me = browser.connection_id.clone();

    browser.send(&flat_offer("robot-1", &me)).await;
    let offer = robot.recv_type("signalling.offer").await;
    // The spec message, of the socket's own session, with the server's meta.
    assert_eq!(offer["payload"]["connectionId"], me.as_str());
    assert_eq!(offer["payload"]["robotId"], "robot-1");
    assert_eq!(offer["meta"]["session"]["role"], "operator");

    robot
        .send(&envelope(
            "signalling.answer",
            Some(json!({"connectionId": me, "sdpType": "answer", "sdp": "v=0 answer"})),
        ))
        .await;
    assert_eq!(
        browser.recv_flat().await,
        json!({"type": "answer", "sdp": "v=0 answer"})
    );
    robot.send(&ice(&me)).await;
    let candidate = browser.recv_flat().await;
    assert_eq!(candidate["type"], "candidate");
    assert_eq!(candidate["candidate"]["sdpMid"], "0");

    for kind in ["candidate", "ice-candidate"] {
        browser.send(&flat_candidate(kind, "robot-1", &me)).await;
        let relayed = robot.recv_type("signalling.ice_candidate").await;
        assert_eq!(relayed["payload"]["connectionId"], me.as_str());
        assert_eq!(relayed["meta"]["session"]["subject"], "alice");
    }
    // A frame without `from` is the socket's own too.
    let mut no_from = flat_candidate("candidate", "robot-1", &me);
    no_from.as_object_mut().unwrap().remove("from");
    browser.send(&no_from).await;
    robot.recv_type("signalling.ice_candidate").await;

    let records = server.sessions("").await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["connectionId"], me.as_str());

    // The robot ends it: the browser hears it flat.
    robot
        .send(&envelope(
            "signalling.disconnected",
            Some(json!({"connectionId": me, "reason": "closed"})),
        ))
        .await;
    let end = browser.recv_flat().await;
    assert_eq!(end["type"], "disconnected");
}

#[tokio::test]
async fn legacy_refusals_come_back_flat() {
    let server = TestServer::start().await;
    let key = server.enrolled_robot("robot-1").await;
    // Offline.
    let mut alice = server.client_for("robot-1", "alice", "operator").await;
    let me = alice.connection_id.clone();
    alice.send(&flat_offer("robot-1", &me)).await;
    let error = alice.recv_flat().await;
    assert_eq!(error["code"], "CONNECTION_FAILED", "{error}");

    let mut robot = server.robot_login("robot-1", &key).await;
    // No grant.
    let token = server.client_token("mallory").await;
    let mut mallory = WsClient::connect_with_token(&server.ws_url(), &token).await;
    let id = mallory.connection_id.clone();
    mallory.send(&flat_offer("robot-1", &id)).await;
    assert_eq!(mallory.recv_flat().await["code"], "FORBIDDEN");
    // A `from` naming another socket's session: refused. The app reads the code from
    // `error` (issue 29).
    alice.send(&flat_offer("robot-1", &id)).await;
    let error = alice.recv_flat().await;
    assert_eq!(error["error"], "FORBIDDEN");
    assert_eq!(error["code"], "FORBIDDEN");
    assert!(
        error["message"].as_str().unwrap().contains("from"),
        "{error}"
    );
    // Busy: alice holds the robot, bob (operator) and dave (owner) are told as the app's
    // "robot busy" screen wants it; only the owner learns who holds it.
    alice.send(&flat_offer("robot-1", &me)).await;
    robot.recv_type("signalling.offer").await;
    let mut bob = server.client_for("robot-1", "bob", "operator").await;
    let bob_id = bob.connection_id.clone();
    bob.send(&flat_offer("robot-1", &bob_id)).await;
    let locked = bob.recv_flat().await;
    assert_eq!(locked["type"], "session-locked", "{locked}");
    assert_eq!(locked["robotId"], "robot-1");
    assert!(locked["lockedBy"].is_null(), "{locked}");
    let mut dave = server.client_for("robot-1", "dave", "owner").await;
    let dave_id = dave.connection_id.clone();
    dave.send(&flat_offer("robot-1", &dave_id)).await;
    let locked = dave.recv_flat().await;
    assert_eq!(locked["type"], "session-locked", "{locked}");
    assert_eq!(locked["lockedBy"], "alice");
    // A candidate for no session of its own.
    let mut carol = server.client_for("robot-1", "carol", "viewer").await;
    let carol_id = carol.connection_id.clone();
    carol
        .send(&flat_candidate("candidate", "robot-1", &carol_id))
        .await;
    assert_eq!(carol.recv_flat().await["code"], "FORBIDDEN");
    // Nothing of theirs reached the robot.
    robot.expect_nothing_pending().await;
}

/// The oldest app sends its offer the moment the socket opens, before any welcome, with
/// `from: "browser1"` hard-coded: a `from` that names no session is ignored and the
/// socket's own session is used (issue 29).
#[tokio::test]
async fn the_oldest_app_offers_at_once_with_a_made_up_from() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    server.grant("robot-1", "alice", "operator").await;
    let token = server.client_token("alice").await;
    let url = format!("{}?token={token}", server.ws_url());
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("upgrade");
    use futures_util::SinkExt;
    ws.send(tokio_tungstenite::tungstenite::Message::Text(
        flat_offer("robot-1", "browser1").to_string().into(),
    ))
    .await
    .expect("send");
    let offer = robot.recv_type("signalling.offer").await;
    let mut browser = WsClient::over(ws);
    let welcome = browser.recv_type("signalling.welcome").await;
    assert_eq!(
        offer["payload"]["connectionId"], welcome["payload"]["connectionId"],
        "the socket's own session"
    );
    robot
        .send(&envelope(
            "signalling.answer",
            Some(json!({"connectionId": offer["payload"]["connectionId"], "sdpType": "answer", "sdp": "v=0 answer"})),
        ))
        .await;
    assert_eq!(browser.recv_flat().await["type"], "answer");
}

#[tokio::test]
async fn there_is_no_legacy_robot_login() {
    let server = TestServer::start().await;
    server.enrolled_robot("robot-1").await;
    // A token-less socket sending flat frames is not a client: spec errors, no session.
    let mut socket = WsClient::connect(&server.ws_url()).await;
    socket.send(&flat_offer("robot-1", "x")).await;
    socket.expect_error("VALIDATION_FAILED").await;
    socket
        .send(&json!({"type": "register", "agentId": "robot-1"}))
        .await;
    socket.expect_error("VALIDATION_FAILED").await;
    assert!(!server.state.presence.is_online("robot-1"));
}

#[tokio::test]
async fn legacy_clients_flag_adds_the_flat_welcome_at_open() {
    let server = TestServer::start_with(|c| c.legacy_clients = true).await;
    let token = server.client_token("alice").await;
    let mut browser = WsClient::connect_with_token(&server.ws_url(), &token).await;
    let welcome = browser.recv_flat().await;
    assert_eq!(welcome["type"], "welcome");
    assert_eq!(welcome["connectionId"], browser.connection_id.as_str());
}

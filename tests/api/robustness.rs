//! Bad input gets a spec error code and never a panic or a hang; limits and shutdown.

use crate::helpers::*;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn malformed_messages_get_spec_error_codes() {
    let server = TestServer::start().await;
    let token = server.client_token("alice").await;
    let mut socket = WsClient::connect_with_token(&server.ws_url(), &token).await;

    let mut missing_id = envelope("signalling.ping", None);
    missing_id.as_object_mut().unwrap().remove("id");
    let mut other_major = envelope("signalling.ping", None);
    other_major["version"] = json!("1.0");
    let text = |value: Value| Message::Text(value.to_string().into());
    // (what, frame, error code, whether the error names the message's id)
    let cases = [
        (
            "not JSON",
            Message::Text("{not json".into()),
            "INVALID_MESSAGE",
            false,
        ),
        (
            "not an object",
            Message::Text("[1,2,3]".into()),
            "INVALID_MESSAGE",
            false,
        ),
        ("no id", text(missing_id), "VALIDATION_FAILED", false),
        (
            "another major version",
            text(other_major),
            "UNSUPPORTED_VERSION",
            true,
        ),
        (
            "an unknown type",
            text(envelope("signalling.teleport", Some(json!({})))),
            "UNSUPPORTED_MESSAGE_TYPE",
            true,
        ),
        (
            "an agent message",
            text(envelope(
                "agent.movement",
                Some(json!({"forward": 1.0, "turn": 0.0})),
            )),
            "UNSUPPORTED_MESSAGE_TYPE",
            false,
        ),
        (
            "a missing payload field",
            text(envelope(
                "signalling.offer",
                Some(json!({"robotId": "r", "sdp": "x", "sdpType": "offer"})),
            )),
            "INVALID_PAYLOAD",
            false,
        ),
        (
            "an extra payload field",
            text(envelope(
                "signalling.ice_candidate",
                Some(json!({"connectionId": "c", "candidate": "x", "sdpMid": "0",
                            "sdpMLineIndex": 0, "evil": true})),
            )),
            "INVALID_PAYLOAD",
            false,
        ),
        (
            "a response without correlationId",
            text(envelope(
                "signalling.pki_response",
                Some(json!({"signature": "x"})),
            )),
            "VALIDATION_FAILED",
            false,
        ),
        (
            "a binary frame",
            Message::Binary(vec![1, 2, 3].into()),
            "INVALID_MESSAGE",
            false,
        ),
    ];
    for (what, frame, code, correlated) in cases {
        let id = match &frame {
            Message::Text(text) => serde_json::from_str::<Value>(text)
                .ok()
                .map(|v| v["id"].clone()),
            _ => None,
        };
        socket.send_message(frame).await;
        let error = socket.recv_type("signalling.error").await;
        assert_eq!(error["payload"]["code"], code, "{what}: {error}");
        if correlated {
            assert_eq!(Some(error["correlationId"].clone()), id, "{what}: {error}");
        }
    }

    // Still alive and well after all that.
    socket.expect_nothing_pending().await;
}

#[tokio::test]
async fn ping_capabilities_and_legacy_ready() {
    let server = TestServer::start().await;
    let mut socket = WsClient::connect(&server.ws_url()).await;
    let ping = envelope("signalling.ping", None);
    socket.send(&ping).await;
    let pong = socket.recv_type("signalling.pong").await;
    assert_eq!(pong["correlationId"], ping["id"]);

    let caps = envelope(
        "signalling.capabilities",
        Some(json!({"versions": ["0.3"]})),
    );
    socket.send(&caps).await;
    let reply = socket.recv_type("signalling.capabilities").await;
    assert!(reply["payload"]["versions"]
        .as_array()
        .unwrap()
        .contains(&json!("0.3")));

    // A token-less socket gets no welcome until it asks; then the same id each time.
    socket.send_text(r#"{"type":"ready"}"#.into()).await;
    let welcome = socket.recv_type("signalling.welcome").await;
    let id = welcome["payload"]["connectionId"].as_str().unwrap();
    assert!(!id.is_empty());
    socket.send_text(r#"{"type":"ready"}"#.into()).await;
    let again = socket.recv_type("signalling.welcome").await;
    assert_eq!(again["payload"]["connectionId"], id);
}

#[tokio::test]
async fn oversized_frame_gets_an_error_and_a_close() {
    let server = TestServer::start().await;
    let mut socket = WsClient::connect(&server.ws_url()).await;
    let big = envelope(
        "signalling.ping",
        Some(json!({"pad": "x".repeat(70 * 1024)})),
    );
    socket.send(&big).await;
    let error = socket.expect_error("INVALID_MESSAGE").await;
    assert_eq!(error["payload"]["details"]["reason"], "frame_too_large");
    assert_eq!(error["payload"]["details"]["limit"], 65536);
    socket.expect_close_with(1009).await;
    // Far past the limit the frame is not even read: still an error, then the socket ends.
    let mut socket = WsClient::connect(&server.ws_url()).await;
    socket.send_text("x".repeat(1024 * 1024)).await;
    let error = socket.expect_error("INVALID_MESSAGE").await;
    assert_eq!(error["payload"]["details"]["reason"], "frame_too_large");
    socket.expect_close_with(1009).await;
    // The server is unharmed.
    WsClient::connect(&server.ws_url())
        .await
        .expect_nothing_pending()
        .await;
}

#[tokio::test]
async fn flooding_is_rate_limited_then_cut_off() {
    let server = TestServer::start_with(|c| {
        c.rate_limit = 1;
        c.rate_burst = 3;
        c.max_strikes = 3;
    })
    .await;
    let mut socket = WsClient::connect(&server.ws_url()).await;
    for _ in 0..3 {
        socket.send(&envelope("signalling.ping", None)).await;
        socket.recv_type("signalling.pong").await;
    }
    socket.send(&envelope("signalling.ping", None)).await;
    let error = socket.expect_error("FORBIDDEN").await;
    assert_eq!(error["payload"]["details"]["reason"], "rate_limited");
    // Keep going far past the limit: the socket is closed.
    for _ in 0..3 {
        socket.send(&envelope("signalling.ping", None)).await;
    }
    loop {
        match socket.next_frame("errors, then a close frame").await {
            Frame::Text(error) => assert_eq!(error["payload"]["code"], "FORBIDDEN", "{error}"),
            Frame::Close(closed) => {
                assert_eq!(closed.code, 1008, "{closed:?}");
                break;
            }
            other => panic!("expected errors then a close frame, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn dead_connections_are_dropped() {
    let server = TestServer::start_with(|c| {
        c.ping_interval_secs = 1;
        c.idle_timeout_secs = 2;
    })
    .await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut alice = server.client_for("robot-1", "alice", "viewer").await;
    alice
        .send(&offer("robot-1", &alice.connection_id.clone()))
        .await;
    robot.recv_type("signalling.offer").await;
    // The robot stops reading, so it no longer answers the server's pings. The server
    // notices within ping interval + idle timeout and ends the session.
    let notice = alice.recv_type("signalling.disconnected").await;
    assert_eq!(notice["payload"]["reason"], "closed");
    assert!(!server.state.presence.is_online("robot-1"));
    // The server sends a close frame (1008, idle timeout) and closes. This client has
    // pongs pending for the pings it ignored, and tungstenite writes them before reading
    // on: they may hit the closed socket first, so a broken pipe is the other honest end.
    match robot.next_frame("the end of the idle socket").await {
        Frame::Close(closed) => assert_eq!(
            (closed.code, closed.reason.as_str()),
            (1008, "idle timeout")
        ),
        Frame::Ended(why) if why.contains("Broken pipe") || why.contains("reset") => {}
        other => panic!("expected a close frame, got {other:?}"),
    }
}

#[tokio::test]
async fn graceful_shutdown_tells_peers_and_ends_records() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (mut alice, _) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;
    let database_url = server.state.config.database_url().to_string();
    let kept = server.shutdown().await;
    for socket in [&mut robot, &mut alice] {
        let notice = socket.recv_type("signalling.disconnected").await;
        assert_eq!(notice["payload"]["details"]["reason"], "server_shutdown");
        socket.expect_close_with(1001).await;
    }
    let store = signalling_server::store::Store::connect(&database_url)
        .await
        .unwrap();
    let records = store
        .sessions(&signalling_server::store::SessionFilter {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    assert!(records[0].ended_at.is_some());
    assert_eq!(records[0].end_reason.as_deref(), Some("server_shutdown"));
    store.close().await;
    if let Some(path) = kept {
        std::fs::remove_file(path).ok();
    }
}

#[tokio::test]
async fn sessions_left_open_by_a_crash_are_ended_at_start() {
    let (url, _) = test_database().await;
    let store = signalling_server::store::Store::connect(&url)
        .await
        .unwrap();
    store
        .start_session("rec-1", "conn-1", "robot-1", "alice", "operator", "node-a")
        .await
        .unwrap();
    let url2 = url.clone();
    let server = TestServer::start_with(move |c| {
        c.database_url = Some(url2);
        c.node_id = Some("node-a".into());
    })
    .await;
    let records = server.sessions("").await;
    assert_eq!(records[0]["endReason"], "server_restart");
}

#[tokio::test]
async fn sigterm_tells_peers_ends_records_and_exits_cleanly() {
    // The robot, grant and token are prepared in-process on the database the binary then
    // serves: only the signal and the exit need a real process.
    let (database_url, sqlite_file) = test_database().await;
    let url = database_url.clone();
    let setup = TestServer::start_with(move |c| c.database_url = Some(url)).await;
    let key = setup.enrolled_robot("robot-1").await;
    setup.grant("robot-1", "alice", "operator").await;
    let token = setup.client_token("alice").await;
    setup.shutdown().await;

    let process = ServerProcess::start_on(&database_url, &["--node-id", "sigterm-node"], &[]);
    let ws_url = format!("ws://{}/ws", process.addr);
    let mut robot = WsClient::connect(&ws_url).await;
    robot.login_as_robot("robot-1", &key).await;
    let mut alice = WsClient::connect_with_token(&ws_url, &token).await;
    alice
        .send(&offer("robot-1", &alice.connection_id.clone()))
        .await;
    robot.recv_type("signalling.offer").await;

    process.sigterm();
    for socket in [&mut robot, &mut alice] {
        let notice = socket.recv_type("signalling.disconnected").await;
        assert_eq!(notice["payload"]["details"]["reason"], "server_shutdown");
        socket.expect_close_with(1001).await;
    }
    let exit = process.exit_status().await;
    assert!(exit.success(), "exit status {exit}");
    let store = signalling_server::store::Store::connect(&database_url)
        .await
        .unwrap();
    let records = store
        .sessions(&signalling_server::store::SessionFilter {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].end_reason.as_deref(), Some("server_shutdown"));
    store.close().await;
    if let Some(path) = sqlite_file {
        std::fs::remove_file(path).ok();
    }
}

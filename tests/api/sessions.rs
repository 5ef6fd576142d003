//! Sessions: permission checks, the operator lock, and relay strictly between the two ends.

use crate::helpers::*;
use serde_json::json;

#[tokio::test]
async fn full_session_is_relayed_and_recorded() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut client = server.client_for("robot-1", "alice", "operator").await;
    let session = client.connection_id.clone();

    let mut sent = offer("robot-1", &session);
    // A client cannot choose what the robot is told about it.
    sent["meta"] = json!({"session": {"subject": "root", "role": "owner"}});
    client.send(&sent).await;
    let forwarded = robot.recv_type("signalling.offer").await;
    assert_eq!(forwarded["payload"], sent["payload"]);
    assert_eq!(forwarded["id"], sent["id"]);
    assert_eq!(
        session_of(&forwarded),
        json!({"subject": "alice", "role": "operator"})
    );

    let answer = envelope(
        "signalling.answer",
        Some(json!({"connectionId": session, "sdpType": "answer", "sdp": "v=0\r\n"})),
    );
    robot.send(&answer).await;
    let got = client.recv_type("signalling.answer").await;
    assert_eq!(got["payload"], answer["payload"]);
    assert!(got.get("meta").is_none());

    let from_client = ice(&session);
    client.send(&from_client).await;
    let got = robot.recv_type("signalling.ice_candidate").await;
    assert_eq!(got["payload"], from_client["payload"]);
    assert_eq!(got["meta"]["session"]["role"], "operator");
    let from_robot = ice(&session);
    robot.send(&from_robot).await;
    assert_eq!(
        client.recv_type("signalling.ice_candidate").await["payload"],
        from_robot["payload"]
    );

    let connected = envelope(
        "signalling.connected",
        Some(
            json!({"connectionId": session, "iceConnectionState": "connected", "dataChannelState": "open"}),
        ),
    );
    robot.send(&connected).await;
    client.recv_type("signalling.connected").await;
    client.expect_nothing_pending().await;
    let records = server.sessions("?robotId=robot-1&active=true").await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["subject"], "alice");
    assert_eq!(records[0]["role"], "operator");
    assert!(records[0]["connectedAt"].is_string());
    assert!(records[0]["endedAt"].is_null());

    let disconnected = envelope(
        "signalling.disconnected",
        Some(json!({"connectionId": session, "reason": "closed"})),
    );
    client.send(&disconnected).await;
    robot.recv_type("signalling.disconnected").await;
    robot.expect_nothing_pending().await;
    // The robot hears of the end before the record is written (docs/protocol.md).
    let record = server.ended_record(&session).await;
    assert_eq!(record["robotId"], "robot-1");
    assert_eq!(record["endReason"], "closed");
    assert!(record["endedAt"].is_string());
    assert!(server.sessions("?active=true").await.is_empty());
    let metrics = server.metrics().await;
    assert!(metrics.contains("signalling_messages_relayed_total{type=\"signalling.offer\"} 1"));
    assert!(metrics.contains("signalling_sessions_active 0"));
    assert!(
        metrics.contains("signalling_relay_latency_seconds_count{type=\"signalling.answer\"} 1")
    );
}

#[tokio::test]
async fn no_grant_is_forbidden() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let token = server.client_token("mallory").await;
    let mut client = WsClient::connect_with_token(&server.ws_url(), &token).await;
    let sent = offer("robot-1", &client.connection_id);
    client.send(&sent).await;
    let error = client.expect_error("FORBIDDEN").await;
    assert_eq!(error["payload"]["details"]["reason"], "no_grant");
    assert_eq!(error["correlationId"], sent["id"]);
    robot.expect_nothing_pending().await;
}

#[tokio::test]
async fn offline_robot_is_reported() {
    let server = TestServer::start().await;
    server.create_robot("robot-1").await;
    let mut client = server.client_for("robot-1", "alice", "operator").await;
    client
        .send(&offer("robot-1", &client.connection_id.clone()))
        .await;
    let error = client.expect_error("CONNECTION_FAILED").await;
    assert_eq!(error["payload"]["details"]["reason"], "robot_offline");
}

#[tokio::test]
async fn one_operator_at_a_time_viewers_alongside() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut alice = server.client_for("robot-1", "alice", "operator").await;
    let mut bob = server.client_for("robot-1", "bob", "owner").await;
    let mut carol = server.client_for("robot-1", "carol", "viewer").await;
    alice
        .send(&offer("robot-1", &alice.connection_id.clone()))
        .await;
    robot.recv_type("signalling.offer").await;

    bob.send(&offer("robot-1", &bob.connection_id.clone()))
        .await;
    let error = bob.expect_error("FORBIDDEN").await;
    assert_eq!(error["payload"]["details"]["reason"], "robot_busy");
    assert_eq!(error["payload"]["details"]["lockedBy"], "alice");

    carol
        .send(&offer("robot-1", &carol.connection_id.clone()))
        .await;
    let got = robot.recv_type("signalling.offer").await;
    assert_eq!(got["meta"]["session"]["role"], "viewer");

    // When alice leaves, the lock is free again.
    drop(alice);
    let notice = robot.recv_type("signalling.disconnected").await;
    assert_eq!(notice["payload"]["reason"], "closed");
    bob.send(&offer("robot-1", &bob.connection_id.clone()))
        .await;
    let got = robot.recv_type("signalling.offer").await;
    assert_eq!(got["meta"]["session"]["subject"], "bob");
}

#[tokio::test]
async fn stolen_connection_id_is_refused() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut alice = server.client_for("robot-1", "alice", "operator").await;
    let mut mallory = server.client_for("robot-1", "mallory", "viewer").await;
    let session = alice.connection_id.clone();
    alice.send(&offer("robot-1", &session)).await;
    robot.recv_type("signalling.offer").await;

    // Offer under alice's id: refused, nothing reaches the robot.
    mallory.send(&offer("robot-1", &session)).await;
    let error = mallory.expect_error("FORBIDDEN").await;
    assert_eq!(
        error["payload"]["details"]["reason"],
        "connection_id_in_use"
    );
    // Even before alice used her own id, it is hers.
    let mut dave = server.client_for("robot-1", "dave", "viewer").await;
    mallory
        .send(&offer("robot-1", &dave.connection_id.clone()))
        .await;
    mallory.expect_error("FORBIDDEN").await;
    robot.expect_nothing_pending().await;
    dave.expect_nothing_pending().await;
}

#[tokio::test]
async fn injection_into_a_foreign_session_goes_nowhere() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (mut other_robot, _) = server.online_robot("robot-2").await;
    let mut alice = server.client_for("robot-1", "alice", "operator").await;
    let mut mallory = server.client_for("robot-2", "mallory", "operator").await;
    let session = alice.connection_id.clone();
    alice.send(&offer("robot-1", &session)).await;
    robot.recv_type("signalling.offer").await;

    // A client injecting candidates or a disconnect into alice's session.
    for message in [
        ice(&session),
        envelope(
            "signalling.disconnected",
            Some(json!({"connectionId": session, "reason": "closed"})),
        ),
    ] {
        mallory.send(&message).await;
        let error = mallory.expect_error("FORBIDDEN").await;
        assert_eq!(error["payload"]["details"]["reason"], "not_in_session");
    }
    // Another robot answering for alice's session.
    other_robot
        .send(&envelope(
            "signalling.answer",
            Some(json!({"connectionId": session, "sdpType": "answer", "sdp": "v=0\r\n"})),
        ))
        .await;
    other_robot.expect_error("FORBIDDEN").await;
    // A client answering its own session (answers come from robots only).
    alice
        .send(&envelope(
            "signalling.answer",
            Some(json!({"connectionId": session, "sdpType": "answer", "sdp": "v=0\r\n"})),
        ))
        .await;
    let error = alice.expect_error("FORBIDDEN").await;
    assert_eq!(error["payload"]["details"]["reason"], "wrong_direction");
    robot.expect_nothing_pending().await;
    alice.expect_nothing_pending().await;
    // The session is intact.
    assert_eq!(server.sessions("?active=true").await.len(), 1);
}

#[tokio::test]
async fn robot_leaving_tells_its_clients() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (mut alice, session) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;
    drop(robot);
    let notice = alice.recv_type("signalling.disconnected").await;
    assert_eq!(notice["payload"]["connectionId"], session.as_str());
    assert_eq!(notice["payload"]["reason"], "closed");
    let records = server.sessions("?subject=alice").await;
    assert_eq!(records[0]["endReason"], "closed");
}

#[tokio::test]
async fn renegotiation_in_the_same_session_is_forwarded() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (mut alice, session) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;
    let mut restart = offer("robot-1", &session);
    restart["payload"]["iceRestart"] = json!(true);
    alice.send(&restart).await;
    let got = robot.recv_type("signalling.offer").await;
    assert_eq!(got["payload"]["iceRestart"], true);
    assert_eq!(
        server.sessions("").await.len(),
        1,
        "one session record, not two"
    );
    // The same id for another robot is refused.
    alice.send(&offer("robot-2", &session)).await;
    alice.expect_error("FORBIDDEN").await;
}

#[tokio::test]
async fn several_sessions_per_client_socket() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut viewer = server.client_for("robot-1", "carol", "viewer").await;
    for id in ["view-a", "view-b"] {
        viewer.send(&offer("robot-1", id)).await;
        assert_eq!(
            robot.recv_type("signalling.offer").await["payload"]["connectionId"],
            id
        );
    }
    drop(viewer);
    let mut ended = vec![
        robot.recv_type("signalling.disconnected").await["payload"]["connectionId"].clone(),
        robot.recv_type("signalling.disconnected").await["payload"]["connectionId"].clone(),
    ];
    ended.sort_by_key(|v| v.to_string());
    assert_eq!(ended, vec![json!("view-a"), json!("view-b")]);
}

#[tokio::test]
async fn withdrawn_grant_ends_live_sessions() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (mut alice, session) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;
    let (status, _) = server
        .admin(
            reqwest::Method::DELETE,
            "/v1/robots/robot-1/grants/alice",
            None,
        )
        .await;
    assert_eq!(status, 204);
    let notice = alice.recv_type("signalling.disconnected").await;
    assert_eq!(notice["payload"]["details"]["reason"], "grant_revoked");
    robot.recv_type("signalling.disconnected").await;
    // A late candidate from an end of the ended session is dropped: no error (issue 15),
    // and nothing reaches the robot. The pongs prove nothing came before them.
    alice.send(&ice(&session)).await;
    alice.send(&envelope("signalling.ping", None)).await;
    alice.recv_type("signalling.pong").await;
    robot.send(&envelope("signalling.ping", None)).await;
    robot.recv_type("signalling.pong").await;
    assert_eq!(server.sessions("").await[0]["endReason"], "grant_revoked");
}

#[tokio::test]
async fn revoked_robot_is_cut_off_mid_session() {
    let server = TestServer::start().await;
    let (mut robot, key) = server.online_robot("robot-1").await;
    let (mut alice, session) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;

    let (status, body) = server
        .admin(reqwest::Method::POST, "/v1/robots/robot-1/revoke", None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["disconnected"], true);
    let error = robot.expect_error("UNAUTHORIZED").await;
    assert_eq!(error["payload"]["details"]["reason"], "revoked");
    robot.expect_close_with(4003).await;
    let notice = alice.recv_type("signalling.disconnected").await;
    assert_eq!(notice["payload"]["connectionId"], session.as_str());

    // The revoked key cannot log in again, nor be enrolled again.
    // Its holder learns why once it proves the key (issue 29: not before).
    let mut again = WsClient::connect(&server.ws_url()).await;
    let reply = again.try_prove("robot-1", &key).await;
    assert_refused(&reply, "revoked");
    let (_, token) = server
        .admin(
            reqwest::Method::POST,
            "/v1/robots/robot-1/enrollment-token",
            None,
        )
        .await;
    use base64::Engine;
    use ring::signature::KeyPair;
    let (status, _) = server
        .post(
            "/v1/enroll",
            json!({"robotId": "robot-1", "enrollmentToken": token["enrollmentToken"],
                   "publicKey": base64::engine::general_purpose::STANDARD.encode(key.public_key().as_ref())}),
        )
        .await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn a_robots_own_meta_never_reaches_the_client_and_a_clients_never_the_robot() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut client = server.client_for("robot-1", "alice", "viewer").await;
    let session = client.connection_id.clone();
    client.send(&offer("robot-1", &session)).await;
    robot.recv_type("signalling.offer").await;

    // The Modulr agent tags its messages with `meta.source`; it is the robot's to keep.
    let mut answer = envelope(
        "signalling.answer",
        Some(json!({"connectionId": session, "sdpType": "answer", "sdp": "v=0\r\n"})),
    );
    answer["meta"] = json!({"source": "agent-service", "session": {"subject": "x"}});
    robot.send(&answer).await;
    let got = client.recv_type("signalling.answer").await;
    assert_eq!(got["payload"], answer["payload"]);
    assert!(got.get("meta").is_none(), "{got}");

    // A forged session placed last, with an escaped key, is replaced all the same.
    let candidate = ice(&session).to_string();
    let forged = format!(
        r#"{},"\u006deta":{{"session":{{"subject":"root","role":"owner"}}}}}}"#,
        &candidate[..candidate.len() - 1]
    );
    client.send_text(forged).await;
    let got = robot.recv_type("signalling.ice_candidate").await;
    assert_eq!(
        got["meta"]["session"],
        json!({"subject": "alice", "role": "viewer"})
    );
}

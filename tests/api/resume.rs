//! `--session-resume-secs`: a session outlives its client's socket for a while, and the same
//! subject takes it back from a new socket by offering again on the same connectionId.

use crate::helpers::*;
use serde_json::json;

#[tokio::test]
async fn the_same_subject_takes_its_session_back_from_a_new_socket() {
    let server = TestServer::start_with(|c| c.session_resume_secs = 60).await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (client, session) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;
    drop(client);
    until("the closed socket is out of the hub", || {
        server.state.presence.connection_count() == 1
    })
    .await;

    // Someone else cannot take it meanwhile, even with a grant of their own.
    let mut bob = server.client_for("robot-1", "bob", "owner").await;
    bob.send(&offer("robot-1", &session)).await;
    bob.recv_type("signalling.error").await;

    let token = server.client_token("alice").await;
    let mut again = WsClient::connect_with_token(&server.ws_url(), &token).await;
    let mut restart = offer("robot-1", &session);
    restart["payload"]["iceRestart"] = json!(true);
    again.send(&restart).await;
    // The robot heard nothing in between: the next thing it gets is the re-offer.
    let forwarded = robot.recv().await;
    assert_eq!(forwarded["type"], "signalling.offer", "{forwarded}");
    assert_eq!(forwarded["payload"]["connectionId"], session.as_str());
    assert_eq!(
        session_of(&forwarded),
        json!({"subject": "alice", "role": "operator"})
    );
    let answer = envelope(
        "signalling.answer",
        Some(json!({"connectionId": session, "sdpType": "answer", "sdp": "v=0\r\n"})),
    );
    robot.send(&answer).await;
    assert_eq!(
        again.recv_type("signalling.answer").await["payload"],
        answer["payload"]
    );
    // One session, one record, still open.
    let records = server.sessions("?robotId=robot-1").await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(records[0]["endedAt"].is_null(), "{}", records[0]);
}

#[tokio::test]
async fn a_session_not_taken_back_in_time_ends_and_the_robot_is_told() {
    let server = TestServer::start_with(|c| c.session_resume_secs = 1).await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (client, session) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;
    drop(client);
    let notice = robot.recv_type("signalling.disconnected").await;
    assert_eq!(notice["payload"]["connectionId"], session.as_str());
    assert_eq!(notice["payload"]["reason"], "closed");
    // The robot hears of the end at once; its record is written right after.
    let record = server.ended_record(&session).await;
    assert_eq!(record["endReason"], "closed", "{record}");
    // The lock went with it: another operator may drive now.
    let mut carol = server.client_for("robot-1", "carol", "operator").await;
    let id = carol.connection_id.clone();
    carol.send(&offer("robot-1", &id)).await;
    robot.recv_type("signalling.offer").await;
}

#[tokio::test]
async fn without_a_resume_window_the_robot_is_told_at_once() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (client, session) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;
    drop(client);
    let notice = robot.recv_type("signalling.disconnected").await;
    assert_eq!(notice["payload"]["connectionId"], session.as_str());
    let token = server.client_token("alice").await;
    let mut again = WsClient::connect_with_token(&server.ws_url(), &token).await;
    again.send(&offer("robot-1", &session)).await;
    // A new session under the old id (its claim was freed), with its own record.
    robot.recv_type("signalling.offer").await;
    assert_eq!(server.sessions("?robotId=robot-1").await.len(), 2);
}

/// A client for `subject` with `role` on the online `robot`, logged in with a token made
/// with `ttl_seconds`, in a session under its own connection id; returns it, the session
/// and the token's id.
async fn session_with_token(
    server: &TestServer,
    robot: &mut WsClient,
    subject: &str,
    ttl_seconds: u64,
) -> (WsClient, String, String) {
    server.grant("robot-1", subject, "operator").await;
    let (status, body) = server
        .admin(
            reqwest::Method::POST,
            "/v1/tokens",
            Some(json!({ "subject": subject, "ttlSeconds": ttl_seconds })),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let token = body["token"].as_str().expect("token");
    let mut client = WsClient::connect_with_token(&server.ws_url(), token).await;
    let session = client.connection_id.clone();
    client.send(&offer("robot-1", &session)).await;
    robot.recv_type("signalling.offer").await;
    let token_id = body["tokenId"].as_str().expect("tokenId").to_string();
    (client, session, token_id)
}

/// The robot is told at once that `session` ended, its record says so, and the control
/// lock is free again: another operator's offer reaches the robot.
async fn ended_at_once(server: &TestServer, robot: &mut WsClient, session: &str) {
    let notice = robot.recv_type("signalling.disconnected").await;
    assert_eq!(notice["payload"]["connectionId"], session, "{notice}");
    server.ended_record(session).await;
    let mut carol = server.client_for("robot-1", "carol", "operator").await;
    let id = carol.connection_id.clone();
    carol.send(&offer("robot-1", &id)).await;
    let offered = robot.recv_type("signalling.offer").await;
    assert_eq!(offered["payload"]["connectionId"], id.as_str());
}

/// Issue 29: a socket closed for cause (its token revoked) does not leave its session
/// waiting to be resumed: the session ends at once, the robot is told, the lock is freed.
#[tokio::test]
async fn a_revoked_token_ends_its_sessions_despite_a_resume_window() {
    let server = TestServer::start_with(|c| c.session_resume_secs = 600).await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (mut alice, session, token_id) =
        session_with_token(&server, &mut robot, "alice", 3600).await;
    let (status, body) = server
        .admin(
            reqwest::Method::DELETE,
            &format!("/v1/tokens/{token_id}"),
            None,
        )
        .await;
    assert!(status == 200 || status == 204, "{status} {body}");
    alice.expect_close().await;
    ended_at_once(&server, &mut robot, &session).await;
}

/// The same for a token that expires while its socket drives.
#[tokio::test]
async fn an_expired_token_ends_its_sessions_despite_a_resume_window() {
    let server = TestServer::start_with(|c| c.session_resume_secs = 600).await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (mut alice, session, _) = session_with_token(&server, &mut robot, "alice", 1).await;
    let error = alice.expect_error("UNAUTHORIZED").await;
    assert_eq!(error["payload"]["details"]["reason"], "token_expired");
    alice.expect_close().await;
    ended_at_once(&server, &mut robot, &session).await;
}

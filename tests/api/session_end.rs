//! Sessions end cleanly with the real Modulr robot agent (issue 15): late messages from a
//! session's own ends are not errors, no error ping-pong can run forever, and welcomes go
//! to robots only when they ask.

use serde_json::{json, Value};

use crate::helpers::*;

fn answer(session: &str) -> Value {
    envelope(
        "signalling.answer",
        Some(json!({"connectionId": session, "sdpType": "answer", "sdp": "v=0\r\n"})),
    )
}

fn disconnected(session: &str) -> Value {
    envelope(
        "signalling.disconnected",
        Some(json!({"connectionId": session, "reason": "closed"})),
    )
}

/// A robot peer that behaves as ModulrCloud's agent does: it answers every
/// `signalling.error` with `disconnected` for the last session it saw (never cleared), and
/// sends its own `disconnected` once a session's link drops.
struct ModulrLikeRobot {
    socket: WsClient,
    last_session: Option<String>,
    errors_seen: usize,
}

/// How many errors the test peer answers before the test gives up on it: above the
/// server's strike limit, so a loop the server failed to cut shows as a failure.
const LOOP_BOUND: usize = 600;

impl ModulrLikeRobot {
    async fn answer_offer(&mut self) -> String {
        let offer = self.socket.recv_type("signalling.offer").await;
        let session = offer["payload"]["connectionId"]
            .as_str()
            .unwrap()
            .to_string();
        self.last_session = Some(session.clone());
        self.socket.send(&answer(&session)).await;
        session
    }

    /// The server ended the session; the agent's WebRTC link drops and it says so too.
    async fn link_dropped(&mut self, session: &str) {
        let notice = self.socket.recv_type("signalling.disconnected").await;
        assert_eq!(notice["payload"]["connectionId"], session);
        self.socket.send(&disconnected(session)).await;
        self.settle().await;
    }

    /// Plays the agent's error loop until the server is quiet (a ping's pong arrives with
    /// nothing before it) or the socket is closed.
    async fn settle(&mut self) {
        let ping = envelope("signalling.ping", None);
        self.socket.send(&ping).await;
        while self.errors_seen < LOOP_BOUND {
            match self.socket.next_frame("the agent's pong").await {
                Frame::Text(message) if message["type"] == "signalling.pong" => return,
                Frame::Text(message) if message["type"] == "signalling.error" => {
                    self.errors_seen += 1;
                    let last = self.last_session.clone().unwrap_or_default();
                    if !self
                        .socket
                        .try_send_text(disconnected(&last).to_string())
                        .await
                    {
                        return;
                    }
                }
                other => panic!("unexpected frame at the agent: {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn three_sessions_in_a_row_with_the_modulr_agent_end_cleanly() {
    let server = TestServer::start().await;
    let (socket, _) = server.online_robot("robot-1").await;
    let mut robot = ModulrLikeRobot {
        socket,
        last_session: None,
        errors_seen: 0,
    };
    for round in 0..3 {
        let mut client = server.client_for("robot-1", "alice", "operator").await;
        let session = client.connection_id.clone();
        client.send(&offer("robot-1", &session)).await;
        assert_eq!(robot.answer_offer().await, session);
        client.recv_type("signalling.answer").await;
        // The client ends the session by message twice, then by closing its socket.
        if round < 2 {
            client.send(&disconnected(&session)).await;
        } else {
            drop(client);
        }
        robot.link_dropped(&session).await;
        assert_eq!(
            robot.errors_seen, 0,
            "round {round}: the server answered a late disconnect"
        );
    }
    assert!(server.state.presence.is_online("robot-1"));
    let records = server.sessions("?robotId=robot-1").await;
    assert_eq!(records.len(), 3);
    for record in &records {
        assert_eq!(record["endReason"], "closed", "{record}");
    }
    assert!(server
        .metrics()
        .await
        .contains(r#"signalling_late_messages_total{type="signalling.disconnected"} 3"#));
}

#[tokio::test]
async fn late_candidates_and_reports_are_dropped_silently_strangers_still_refused() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (mut alice, session) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;
    alice.send(&disconnected(&session)).await;
    robot.recv_type("signalling.disconnected").await;

    // From either end, within the grace period: no error, nothing relayed.
    robot.send(&ice(&session)).await;
    let connected = envelope(
        "signalling.connected",
        Some(json!({"connectionId": session, "iceConnectionState": "connected"})),
    );
    robot.send(&connected).await;
    robot.send(&disconnected(&session)).await;
    robot.expect_nothing_pending().await;
    alice.send(&ice(&session)).await;
    alice.send(&disconnected(&session)).await;
    alice.expect_nothing_pending().await;

    // A socket that was never part of the session is refused, as before, except for an
    // end report (issue 29: those are never answered with an error once the session is
    // over)...
    let mut bob = server.client_for("robot-1", "bob", "operator").await;
    bob.send(&ice(&session)).await;
    let error = bob.expect_error("FORBIDDEN").await;
    assert_eq!(error["payload"]["details"]["reason"], "not_in_session");
    bob.send(&disconnected(&session)).await;
    bob.expect_nothing_pending().await;
    // ...while naming a live session of someone else's is refused.
    let bob_session = bob.connection_id.clone();
    bob.send(&offer("robot-1", &bob_session)).await;
    robot.recv_type("signalling.offer").await;
    let mut carol = server.client_for("robot-1", "carol", "viewer").await;
    carol.send(&disconnected(&bob_session)).await;
    let error = carol.expect_error("FORBIDDEN").await;
    assert_eq!(error["payload"]["details"]["reason"], "not_in_session");
}

/// Issue 29: Modulr's agent reports a session's end long after it (85 s after its
/// browser's socket dropped, past the grace period) and answers every error with another
/// `disconnected`. Such reports are dropped and counted, never answered: the robot is not
/// cut off for strikes however many it sends.
#[tokio::test]
async fn end_reports_past_the_grace_period_are_never_answered() {
    let server = TestServer::start_with(|c| c.session_grace_secs = 0).await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (alice, session) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;
    drop(alice);
    robot.recv_type("signalling.disconnected").await;
    let connected = envelope(
        "signalling.connected",
        Some(json!({"connectionId": session, "iceConnectionState": "connected"})),
    );
    robot.send(&connected).await;
    // More than the strikes that would cut it off (100 by default).
    for _ in 0..150 {
        robot.send(&disconnected(&session)).await;
    }
    robot.expect_nothing_pending().await;
    assert!(server.state.presence.is_online("robot-1"));
    let metrics = server.metrics().await;
    assert!(
        metrics.contains(r#"signalling_late_messages_total{type="signalling.disconnected"} 150"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"signalling_late_messages_total{type="signalling.connected"} 1"#));
}

#[tokio::test]
async fn errors_from_peers_are_never_answered() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let error = envelope(
        "signalling.error",
        Some(json!({"code": "FORBIDDEN", "message": "no"})),
    );
    robot.send(&error).await;
    // Malformed, but still an error report: answering it is how ping-pong starts.
    robot
        .send_text(r#"{"type":"signalling.error","version":"0.3","payload":{}}"#.into())
        .await;
    robot.expect_nothing_pending().await;
}

#[tokio::test]
async fn a_peer_that_keeps_earning_errors_is_cut_off_within_bounds() {
    let server = TestServer::start().await;
    let token = server.client_token("mallory").await;
    let mut socket = WsClient::connect_with_token(&server.ws_url(), &token).await;
    // Each bad message is followed by a good one: a strike counter reset by good
    // messages would never fire.
    let mut sent = 0;
    let closed = loop {
        assert!(sent <= 500, "still open after {sent} messages");
        socket.send_text("{not json".into()).await;
        socket.send(&envelope("signalling.ping", None)).await;
        sent += 2;
        // Errors, then the pong, unless the close comes first.
        let closed = loop {
            match socket.next_frame("an error, a pong or the close").await {
                Frame::Text(message) if message["type"] == "signalling.pong" => break None,
                Frame::Text(message) => assert_eq!(message["type"], "signalling.error"),
                Frame::Close(close) => break Some(close),
                other => panic!("unexpected frame: {other:?}"),
            }
        };
        if let Some(close) = closed {
            break close;
        }
    };
    assert_eq!(closed.code, 1008, "{closed:?}");
    assert!(server
        .metrics()
        .await
        .contains("signalling_peers_cut_off_total 1"));
}

#[tokio::test]
async fn robots_get_a_welcome_only_when_they_ask() {
    let server = TestServer::start().await;
    let key = server.enrolled_robot("robot-1").await;
    // Nothing at open: the first thing a token-less socket hears is the answer to its ping.
    let mut quiet = WsClient::connect(&server.ws_url()).await;
    quiet.expect_nothing_pending().await;
    // Registering without asking: verified, and still no welcome.
    let challenge = {
        quiet
            .send(&envelope(
                "signalling.register",
                Some(json!({"agentId": "robot-1"})),
            ))
            .await;
        quiet.recv_type("signalling.pki_challenge").await
    };
    quiet.send(&signed_response(&challenge, &key)).await;
    quiet.recv_type("signalling.pki_verified").await;
    quiet.expect_nothing_pending().await;
    drop(quiet);
    // Asking in register (as robot-agent does) brings the welcome with TURN credentials.
    let mut asking = WsClient::connect(&server.ws_url()).await;
    let welcome = asking.prove("robot-1", &key).await;
    assert!(welcome["payload"]["connectionId"].is_string());
    // A client always gets its welcome at open (connect_with_token waits for it).
    let token = server.client_token("alice").await;
    WsClient::connect_with_token(&server.ws_url(), &token).await;
}

/// Issue 42, the single-node ordering path: when a client says `disconnected`, its robot
/// hears of the end before the offer of a session that takes its place, even while the
/// database holds the end's record back. Before, the end was relayed after its record; on
/// one node no control lock orders the next controller, so a new offer (its own record
/// written at once) reached the robot first and our robot-agent refused it as busy. A row
/// lock in PostgreSQL holds the record back; runs when DATABASE_URL points at PostgreSQL.
#[tokio::test]
async fn a_robot_hears_a_clients_end_before_the_next_controllers_offer() {
    if !on_postgres() {
        return;
    }
    let (database, _) = test_database().await;
    let server_database = database.clone();
    let server = TestServer::start_with(move |c| c.database_url = Some(server_database)).await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (mut alice, first) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;
    let mut bob = server.client_for("robot-1", "bob", "operator").await;

    // Alice's record, locked: its end cannot be written yet.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&database)
        .await
        .expect("database");
    let mut hold = pool.begin().await.expect("transaction");
    let locked = sqlx::query("SELECT id FROM sessions WHERE connection_id = $1 FOR UPDATE")
        .bind(&first)
        .execute(&mut *hold)
        .await
        .expect("lock the record");
    assert_eq!(locked.rows_affected(), 1);

    alice.send(&disconnected(&first)).await;
    until("alice's session has left the table", || {
        !server.state.sessions.is_driven("robot-1")
    })
    .await;
    // The robot is free: bob's offer opens a session and its record is written at once.
    let second = bob.connection_id.clone();
    bob.send(&offer("robot-1", &second)).await;
    let heard = robot.recv().await;
    assert_eq!(
        heard["type"], "signalling.disconnected",
        "the robot heard this before alice's session ended: {heard}"
    );
    assert_eq!(heard["payload"]["connectionId"], first.as_str());
    let next = robot.recv().await;
    assert_eq!(next["type"], "signalling.offer", "{next}");
    assert_eq!(next["payload"]["connectionId"], second.as_str());

    hold.rollback().await.expect("release the record");
    let record = server.ended_record(&first).await;
    assert_eq!(record["endReason"], "closed", "{record}");
    robot.expect_nothing_pending().await;
    server.shutdown().await;
}

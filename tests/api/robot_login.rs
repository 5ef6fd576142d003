//! Robot login: register → pki_challenge → pki_response → pki_verified, and the attacks on it.

use crate::helpers::*;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use serde_json::{json, Value};

#[tokio::test]
async fn ed25519_robot_logs_in_and_is_online() {
    let server = TestServer::start().await;
    let (mut robot, _key) = server.online_robot("robot-1").await;
    robot.expect_nothing_pending().await;
    let (status, body) = server
        .admin(reqwest::Method::GET, "/v1/robots/robot-1", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["online"], true);
    assert_eq!(body["credential"], "ed25519");
    assert!(body["lastSeenAt"].is_string());
    assert!(server
        .metrics()
        .await
        .contains("signalling_pki_results_total{result=\"verified\"} 1"));
}

#[tokio::test]
async fn unpadded_signature_and_unpadded_key_are_accepted() {
    // The Modulr agent keeps its keys in unpadded base64.
    let server = TestServer::start().await;
    let token = server.create_robot("robot-np").await;
    let key = new_ed25519();
    let (status, _) = server
        .post(
            "/v1/enroll",
            json!({"robotId": "robot-np", "enrollmentToken": token,
                   "publicKey": STANDARD_NO_PAD.encode(key.public_key().as_ref())}),
        )
        .await;
    assert_eq!(status, 201);
    let mut robot = WsClient::connect(&server.ws_url()).await;
    robot.prove("robot-np", &Unpadded(&key)).await;
}

#[tokio::test]
async fn ecdsa_p256_spki_key_with_der_signature() {
    let server = TestServer::start().await;
    let token = server.create_robot("robot-ec").await;
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let key =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let spki_pem = p256_spki_pem(key.public_key().as_ref());
    let (status, body) = server
        .post(
            "/v1/enroll",
            json!({"robotId": "robot-ec", "enrollmentToken": token, "publicKey": spki_pem}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let mut robot = WsClient::connect(&server.ws_url()).await;
    robot.prove("robot-ec", &key).await;
    let (_, body) = server
        .admin(reqwest::Method::GET, "/v1/robots/robot-ec", None)
        .await;
    assert_eq!(body["credential"], "ecdsa-p256");
}

/// SubjectPublicKeyInfo PEM for an uncompressed P-256 point.
fn p256_spki_pem(point: &[u8]) -> String {
    let mut der = vec![
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
        0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ];
    der.extend_from_slice(point);
    format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        STANDARD.encode(der)
    )
}

#[tokio::test]
async fn wrong_key_is_refused_and_socket_closed() {
    let server = TestServer::start().await;
    server.enrolled_robot("robot-1").await;
    let impostor = new_ed25519();
    // try_prove checks that the refusal answers the signed response.
    let (mut robot, error) = server.robot_attempt("robot-1", &impostor).await;
    assert_refused(&error, "bad_signature");
    robot.expect_close_with(1008).await;
    assert!(!server.state.presence.is_online("robot-1"));
    assert!(server
        .metrics()
        .await
        .contains("signalling_pki_results_total{result=\"bad_signature\"} 1"));
}

#[tokio::test]
async fn garbage_signature_is_refused() {
    let server = TestServer::start().await;
    server.enrolled_robot("robot-1").await;
    let mut robot = WsClient::connect(&server.ws_url()).await;
    let challenge = robot.register("robot-1").await;
    robot
        .send(&pki_response(&challenge, "%%% not base64 %%%"))
        .await;
    let error = robot.expect_error("UNAUTHORIZED").await;
    assert_eq!(error["payload"]["details"]["reason"], "bad_signature");
    robot.expect_close_with(1008).await;
}

#[tokio::test]
async fn replayed_signature_is_refused_on_a_new_connection() {
    let server = TestServer::start().await;
    let key = server.enrolled_robot("robot-1").await;
    // A genuine login, observed by an attacker...
    let mut genuine = WsClient::connect(&server.ws_url()).await;
    let challenge = genuine.register("robot-1").await;
    let observed = signed_response(&challenge, &key);
    genuine.send(&observed).await;
    genuine.recv_type("signalling.pki_verified").await;
    genuine.recv_type("signalling.welcome").await;
    // ...who replays the signature against a fresh challenge.
    let mut attacker = WsClient::connect(&server.ws_url()).await;
    let fresh = attacker.register("robot-1").await;
    assert_ne!(
        fresh["payload"]["challenge"],
        challenge["payload"]["challenge"]
    );
    let signature = observed["payload"]["signature"].as_str().unwrap();
    attacker.send(&pki_response(&fresh, signature)).await;
    let error = attacker.expect_error("UNAUTHORIZED").await;
    assert_eq!(error["payload"]["details"]["reason"], "bad_signature");
    attacker.expect_close_with(1008).await;
    // The genuine robot stays online.
    genuine.expect_nothing_pending().await;
    assert!(server.state.presence.is_online("robot-1"));
}

#[tokio::test]
async fn a_challenge_is_single_use() {
    let server = TestServer::start().await;
    let key = server.enrolled_robot("robot-1").await;
    let mut robot = WsClient::connect(&server.ws_url()).await;
    let challenge = robot.register("robot-1").await;
    let response = signed_response(&challenge, &key);
    robot.send(&response).await;
    robot.recv_type("signalling.pki_verified").await;
    robot.recv_type("signalling.welcome").await;
    robot.send(&response).await;
    let error = robot.expect_error("UNAUTHORIZED").await;
    assert_eq!(error["payload"]["details"]["reason"], "no_challenge");
}

#[tokio::test]
async fn response_must_correlate_with_the_challenge() {
    let server = TestServer::start().await;
    let key = server.enrolled_robot("robot-1").await;
    let mut robot = WsClient::connect(&server.ws_url()).await;
    let challenge = robot.register("robot-1").await;
    let mut response = signed_response(&challenge, &key);
    response["correlationId"] = json!("something-else");
    robot.send(&response).await;
    let error = robot.expect_error("UNAUTHORIZED").await;
    assert_eq!(
        error["payload"]["details"]["reason"],
        "correlation_mismatch"
    );
}

/// Issue 29, item 7: an anonymous `register` tells nothing about which robot ids exist or
/// in which state. Unknown, not enrolled, revoked and enrolled robots all get a challenge;
/// a proof with someone else's key is refused the same way for all of them, after it.
#[tokio::test]
async fn unknown_unenrolled_revoked_and_enrolled_robots_are_answered_alike() {
    let server = TestServer::start().await;
    server.create_robot("robot-new").await;
    server.enrolled_robot("robot-revoked").await;
    let (status, body) = server
        .admin(
            reqwest::Method::POST,
            "/v1/robots/robot-revoked/revoke",
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    server.enrolled_robot("robot-1").await;
    let stranger = new_ed25519();
    for robot_id in ["ghost", "robot-new", "robot-revoked", "robot-1"] {
        let mut robot = WsClient::connect(&server.ws_url()).await;
        let reply = robot.try_prove(robot_id, &stranger).await;
        assert_refused(&reply, "bad_signature");
        robot.expect_close_with(1008).await;
    }
}

/// Issue 29, item 8: one challenge per socket at a time; asking again is refused (a
/// strike), and the pending challenge still counts.
#[tokio::test]
async fn one_challenge_at_a_time() {
    let server = TestServer::start().await;
    let key = server.enrolled_robot("robot-1").await;
    let mut robot = WsClient::connect(&server.ws_url()).await;
    let challenge = robot.register("robot-1").await;
    robot
        .send(&envelope(
            "signalling.register",
            Some(json!({"agentId": "robot-1"})),
        ))
        .await;
    let error = robot.expect_error("FORBIDDEN").await;
    assert_eq!(error["payload"]["details"]["reason"], "challenge_pending");
    robot.send(&signed_response(&challenge, &key)).await;
    robot.recv_type("signalling.pki_verified").await;
}

#[tokio::test]
async fn an_unanswered_challenge_expires() {
    let server = TestServer::start_with(|c| c.challenge_ttl_secs = 1).await;
    server.enrolled_robot("robot-1").await;
    let mut robot = WsClient::connect(&server.ws_url()).await;
    robot.register("robot-1").await;
    // The server closes us when the challenge expires; no sleeping on our side.
    let error = robot.expect_error("UNAUTHORIZED").await;
    assert_eq!(error["payload"]["details"]["reason"], "challenge_expired");
    robot.expect_close_with(1008).await;
}

#[tokio::test]
async fn silent_unauthenticated_sockets_time_out() {
    let server = TestServer::start_with(|c| c.login_timeout_secs = 1).await;
    let mut socket = WsClient::connect(&server.ws_url()).await;
    socket.expect_error("TIMEOUT").await;
    socket.expect_close_with(1008).await;
}

#[tokio::test]
async fn nothing_routes_to_an_unverified_robot() {
    let server = TestServer::start().await;
    server.enrolled_robot("robot-1").await;
    let mut robot = WsClient::connect(&server.ws_url()).await;
    robot.register("robot-1").await;
    // Still unverified: the robot is offline for clients...
    let mut client = server.client_for("robot-1", "alice", "operator").await;
    let offer = offer("robot-1", &client.connection_id);
    client.send(&offer).await;
    let error = client.expect_error("CONNECTION_FAILED").await;
    assert_eq!(error["payload"]["details"]["reason"], "robot_offline");
    assert_eq!(error["correlationId"], offer["id"]);
    // ...and cannot send session messages itself.
    robot.send(&ice("anything")).await;
    let error = robot.expect_error("UNAUTHORIZED").await;
    assert_eq!(error["payload"]["details"]["reason"], "not_verified");
}

#[tokio::test]
async fn a_new_verified_connection_replaces_the_old_one() {
    let server = TestServer::start().await;
    let key = server.enrolled_robot("robot-1").await;
    let mut first = WsClient::connect(&server.ws_url()).await;
    first.login_as_robot("robot-1", &key).await;
    let (mut client, session) = server
        .open_session(&mut first, "robot-1", "alice", "operator")
        .await;

    let mut second = WsClient::connect(&server.ws_url()).await;
    second.login_as_robot("robot-1", &key).await;
    first.expect_close_with(4001).await;
    // The session on the old connection ends and its client is told.
    let notice = client.recv_type("signalling.disconnected").await;
    assert_eq!(notice["payload"]["connectionId"], session.as_str());
    assert!(server.state.presence.is_online("robot-1"));
    // The new connection takes offers.
    client.send(&offer("robot-1", &session)).await;
    second.recv_type("signalling.offer").await;
}

#[tokio::test]
async fn client_connections_cannot_register_as_robots() {
    let server = TestServer::start().await;
    server.enrolled_robot("robot-1").await;
    let token = server.client_token("mallory").await;
    let mut socket = WsClient::connect_with_token(&server.ws_url(), &token).await;
    socket
        .send(&envelope(
            "signalling.register",
            Some(json!({"agentId": "robot-1"})),
        ))
        .await;
    let error = socket.expect_error("FORBIDDEN").await;
    assert_eq!(error["payload"]["details"]["reason"], "client_connection");
}

#[tokio::test]
async fn second_welcome_carries_turn_credentials_only_after_verification() {
    let server = TestServer::start_with(|c| {
        c.stun_urls = vec!["stun:127.0.0.1:3478".into()];
        c.turn_urls = vec!["turn:127.0.0.1:3478?transport=udp".into()];
        c.turn_secret = Some("turn-secret".into());
    })
    .await;
    let key = server.enrolled_robot("robot-1").await;
    let mut robot = WsClient::connect(&server.ws_url()).await;
    // A token-less socket gets a welcome when it asks: the legacy ready.
    robot.send_text(r#"{"type":"ready"}"#.into()).await;
    let first = robot.recv_type("signalling.welcome").await;
    robot.connection_id = first["payload"]["connectionId"].as_str().unwrap().into();
    let servers = first["payload"]["iceServers"].as_array().unwrap();
    assert_eq!(servers.len(), 1, "STUN only before verification: {first}");
    let second = robot.prove("robot-1", &key).await;
    let servers = second["payload"]["iceServers"].as_array().unwrap();
    assert_eq!(servers.len(), 2, "{second}");
    // TURN REST username `expiry:robot:<id>`: the TURN server's logs name the robot.
    assert!(servers[1]["username"]
        .as_str()
        .unwrap()
        .ends_with(":robot:robot-1"));
    assert!(servers[1]["credential"].is_string());
    assert_eq!(
        second["payload"]["connectionId"],
        robot.connection_id.as_str()
    );
}

/// The expiry in a TURN REST username (`expiry:user`), and the user.
fn turn_user(welcome: &Value) -> (u64, String) {
    let servers = welcome["payload"]["iceServers"].as_array().unwrap();
    let turn = servers
        .iter()
        .find(|s| s["username"].is_string())
        .unwrap_or_else(|| panic!("no TURN entry: {welcome}"));
    let (expiry, user) = turn["username"].as_str().unwrap().split_once(':').unwrap();
    (expiry.parse().unwrap(), user.to_string())
}

#[tokio::test]
async fn long_connections_get_fresh_turn_credentials_before_expiry() {
    // A 2 s lifetime: renewed after 1 s, so each side sees a second welcome well in time.
    let server = TestServer::start_with(|c| {
        c.turn_urls = vec!["turn:127.0.0.1:3478".into()];
        c.turn_secret = Some("turn-secret".into());
        c.turn_ttl = 2;
    })
    .await;
    let key = server.enrolled_robot("robot-1").await;
    let mut client = server.client_for("robot-1", "alice", "operator").await;
    let first = client.welcome.clone();
    let (expiry, user) = turn_user(&first);
    assert_eq!(user, "alice");
    let refreshed = client.recv_type("signalling.welcome").await;
    let (later, user) = turn_user(&refreshed);
    assert_eq!(user, "alice");
    assert!(
        later > expiry,
        "fresh credentials expire later: {first} then {refreshed}"
    );
    assert_eq!(
        refreshed["payload"]["connectionId"],
        first["payload"]["connectionId"]
    );

    let mut robot = WsClient::connect(&server.ws_url()).await;
    robot.send_text(r#"{"type":"ready"}"#.into()).await;
    robot.recv_type("signalling.welcome").await;
    let verified = robot.prove("robot-1", &key).await;
    let (expiry, user) = turn_user(&verified);
    assert_eq!(user, "robot:robot-1");
    let refreshed = robot.recv_type("signalling.welcome").await;
    let (later, user) = turn_user(&refreshed);
    assert_eq!(user, "robot:robot-1");
    assert!(later > expiry);
}

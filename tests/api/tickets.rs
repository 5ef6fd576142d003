//! Session tickets, the server's side (issue 33): the public signing keys (`GET
//! /v1/signing-keys`, enrollment's answer) and the signed ticket in `meta.session` of every
//! offer and `arp.frame` forwarded to a robot. The robot's checks are robot-agent's tests
//! (src/tickets_tests.rs) and crates/agent-server-tests/tests/arp_gateway_conformance.rs end to end.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use ring::signature::KeyPair;
use serde_json::{json, Value};
use signalling_protocol::schema::SchemaValidator;
use signalling_protocol::ticket::{params_hash, TicketClaims, MAX_TICKET_LIFETIME_SECS};

use crate::arp_gateway::{arp_robot_at, initialize_result, robot_answers, ArpClient};
use crate::helpers::*;

async fn signing_keys(server: &TestServer) -> Value {
    let response = server
        .http
        .get(server.url("/v1/signing-keys"))
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), 200);
    response.json().await.expect("JSON")
}

/// RFC 7638 thumbprint of an Ed25519 JWK.
fn thumbprint(x: &str) -> String {
    let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
    URL_SAFE_NO_PAD.encode(ring::digest::digest(
        &ring::digest::SHA256,
        canonical.as_bytes(),
    ))
}

/// The claims of `ticket`, checked against the published keys as a robot would.
fn verify(jwks: &Value, ticket: &str) -> TicketClaims {
    let header = jsonwebtoken::decode_header(ticket).expect("a JWS");
    assert_eq!(header.alg, Algorithm::EdDSA);
    let kid = header.kid.expect("kid");
    let key = jwks["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|k| k["kid"] == kid.as_str())
        .unwrap_or_else(|| panic!("{kid} is not published: {jwks}"));
    let decoding = DecodingKey::from_ed_components(key["x"].as_str().expect("x")).expect("key");
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.validate_aud = false;
    let claims = jsonwebtoken::decode::<TicketClaims>(ticket, &decoding, &validation)
        .expect("the ticket checks")
        .claims;
    assert!(claims.exp > claims.iat && claims.exp - claims.iat <= MAX_TICKET_LIFETIME_SECS);
    claims
}

/// An operator's program on robot-arp (an ARP robot) asks `arp.initialize`: the published
/// keys, the robot's socket, the program, the request's id and the frame the robot got.
async fn initialize_forwarded(server: &TestServer) -> (Value, WsClient, ArpClient, Value, Value) {
    let jwks = signing_keys(server).await;
    let key = server.enrolled_robot("robot-arp").await;
    let mut robot = arp_robot_at(&server.ws_url(), "robot-arp", &key).await;
    server.grant("robot-arp", "planner", "operator").await;
    let token = server.client_token("planner").await;
    let mut program = ArpClient::connect(server, "robot-arp", &token).await;
    let init = json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "t", "version": "1"}, "capabilities": {}});
    let init_id = program.request("arp.initialize", init).await;
    let message = robot.recv_type("arp.frame").await;
    (jwks, robot, program, init_id, message)
}

fn ticket_of(forwarded: &Value) -> &str {
    forwarded["meta"]["session"]["ticket"]
        .as_str()
        .unwrap_or_else(|| panic!("no ticket: {forwarded}"))
}

#[tokio::test]
async fn the_signing_keys_are_public_ed25519_jwks_and_enrollment_pins_them() {
    let server = TestServer::start().await;
    let jwks = signing_keys(&server).await;
    let keys = jwks["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 1, "{jwks}");
    let key = &keys[0];
    assert_eq!(key["kty"], "OKP");
    assert_eq!(key["crv"], "Ed25519");
    assert_eq!(key["alg"], "EdDSA");
    assert_eq!(key["use"], "sig");
    let x = key["x"].as_str().expect("x");
    assert_eq!(URL_SAFE_NO_PAD.decode(x).expect("base64url").len(), 32);
    assert_eq!(key["kid"], thumbprint(x));

    let token = server.create_robot("robot-1").await;
    let robot_key = new_ed25519();
    let (status, body) = server
        .post(
            "/v1/enroll",
            json!({
                "robotId": "robot-1",
                "enrollmentToken": token,
                "publicKey": STANDARD.encode(robot_key.public_key().as_ref()),
            }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["signingKeys"], jwks);
}

#[tokio::test]
async fn every_offer_to_a_robot_carries_a_ticket_for_that_session_and_role() {
    let server = TestServer::start().await;
    let jwks = signing_keys(&server).await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut client = server.client_for("robot-1", "alice", "viewer").await;
    let session = client.connection_id.clone();
    let mut sent = offer("robot-1", &session);
    // Whatever the client writes in meta is replaced, a ticket included.
    sent["meta"] = json!({"session": {"subject": "root", "role": "owner", "ticket": "x.y.z"}});
    client.send(&sent).await;
    let forwarded = robot.recv_type("signalling.offer").await;
    // The Modulr-like peer: the message, ticket and all, still passes the spec's schema.
    SchemaValidator::shared()
        .validate(&forwarded)
        .expect("the spec's schema");
    let claims = verify(&jwks, ticket_of(&forwarded));
    assert_eq!(claims.robot, "robot-1");
    assert_eq!(claims.connection_id, session);
    assert_eq!(claims.subject, "alice");
    assert_eq!(claims.role.as_str(), "viewer");
    assert_eq!(claims.node, server.state.node_id);
    assert!(claims.call_id.is_none() && claims.params_hash.is_none());
}

#[tokio::test]
async fn every_gateway_frame_carries_a_ticket_bound_to_its_call_and_params() {
    let server = TestServer::start().await;
    let (jwks, mut robot, mut program, init_id, message) = initialize_forwarded(&server).await;
    let claims = verify(&jwks, ticket_of(&message));
    let connection = message["payload"]["connectionId"].as_str().expect("id");
    assert_eq!(claims.connection_id, connection);
    assert_eq!(claims.robot, "robot-arp");
    assert_eq!(claims.subject, "planner");
    assert_eq!(claims.role.as_str(), "operator");
    assert_eq!(
        claims.call_id,
        Some(message["payload"]["frame"]["id"].clone())
    );
    assert!(claims.params_hash.is_none(), "not a tool call");
    // The session's first ticket offers the key exchange; this robot does not answer it,
    // so every later ticket is signed as well (the verify below insists on EdDSA).
    assert!(claims.kx.is_some(), "{claims:?}");
    robot_answers(
        &mut robot,
        connection,
        json!({"jsonrpc": "2.0", "id": message["payload"]["frame"]["id"], "result": initialize_result()}),
    )
    .await;
    program.answer(&init_id).await;
    let params = json!({"name": "drive", "arguments": {"linear": 0.2, "angular": 0.0}});
    program.request("arp.callTool", params.clone()).await;
    let message = loop {
        let m = robot.recv_type("arp.frame").await;
        if m["payload"]["frame"]["method"] == "arp.callTool" {
            break m;
        }
    };
    let claims = verify(&jwks, ticket_of(&message));
    assert_eq!(
        claims.call_id,
        Some(message["payload"]["frame"]["id"].clone())
    );
    assert_eq!(claims.params_hash, Some(params_hash(Some(&params))));
}

#[tokio::test]
async fn during_a_rotation_both_keys_are_published_and_the_new_one_signs() {
    let (dir, old, new) = two_key_files();
    let before = TestServer::start_with(|c| c.signing_key_file = Some(old.clone())).await;
    let old_keys = signing_keys(&before).await;
    let server = TestServer::start_with(|c| {
        c.signing_key_file = Some(new.clone());
        c.signing_key_previous_file = Some(old.clone());
    })
    .await;
    let jwks = signing_keys(&server).await;
    let keys = jwks["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 2, "{jwks}");
    assert_eq!(
        keys[1], old_keys["keys"][0],
        "the previous key, still published"
    );
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut client = server.client_for("robot-1", "alice", "operator").await;
    let session = client.connection_id.clone();
    client.send(&offer("robot-1", &session)).await;
    let forwarded = robot.recv_type("signalling.offer").await;
    let ticket = ticket_of(&forwarded);
    verify(&jwks, ticket);
    let kid = jsonwebtoken::decode_header(ticket).expect("JWS").kid;
    assert_eq!(kid.as_deref(), keys[0]["kid"].as_str(), "the new key signs");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn the_generated_key_is_kept_in_the_database_across_a_restart() {
    let server = TestServer::start().await;
    let before = signing_keys(&server).await;
    let database_url = server.state.config.database_url().to_owned();
    server.shutdown().await;
    let again = TestServer::start_with(|c| c.database_url = Some(database_url)).await;
    assert_eq!(
        signing_keys(&again).await,
        before,
        "robots keep trusting it"
    );
}

/// A robot that takes ticket renewals (`register.metadata.sessionTickets`), logged in.
async fn renewing_robot(server: &TestServer, robot_id: &str) -> WsClient {
    let key = server.enrolled_robot(robot_id).await;
    let mut robot = WsClient::connect(&server.ws_url()).await;
    let verified = robot
        .try_prove_with(robot_id, &key, json!({ "sessionTickets": true }))
        .await;
    assert_eq!(verified["type"], "signalling.pki_verified", "{verified}");
    robot
}

/// The next message of `robot`'s that is not a welcome.
async fn next_but_welcomes(robot: &mut WsClient) -> Value {
    loop {
        let message = robot.recv().await;
        if message["type"] != "signalling.welcome" {
            return message;
        }
    }
}

/// The value of a metric without labels, from `/metrics`.
async fn metric(server: &TestServer, name: &str) -> f64 {
    let text = server.metrics().await;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// A renewal's session id, or `None` for anything else.
fn renewed_session(message: &Value) -> Option<String> {
    (message["type"] == "session.ticket")
        .then(|| {
            message["payload"]["connectionId"]
                .as_str()
                .map(str::to_owned)
        })
        .flatten()
}

#[tokio::test]
async fn live_sessions_get_fresh_tickets_only_on_robots_that_asked_for_them() {
    let server = TestServer::start_with(|c| c.ticket_renew_secs = 1).await;
    let jwks = signing_keys(&server).await;
    let mut renewing = renewing_robot(&server, "robot-1").await;
    // The Modulr-like robot declares nothing: it must never see the extension type.
    let (mut plain, _) = server.online_robot("robot-2").await;
    let mut alice = server.client_for("robot-1", "alice", "operator").await;
    let mut carol = server.client_for("robot-1", "carol", "viewer").await;
    let mut bob = server.client_for("robot-2", "bob", "viewer").await;
    let (driving, watching) = (alice.connection_id.clone(), carol.connection_id.clone());
    alice.send(&offer("robot-1", &driving)).await;
    let first = verify(&jwks, ticket_of(&next_but_welcomes(&mut renewing).await)).jti;
    carol.send(&offer("robot-1", &watching)).await;
    next_but_welcomes(&mut renewing).await;
    bob.send(&offer("robot-2", &bob.connection_id.clone()))
        .await;
    plain.recv_type("signalling.offer").await;

    // Two renewals of the driving session, each a fresh ticket for it.
    let mut ids = vec![first];
    while ids.len() < 3 {
        let renewal = next_but_welcomes(&mut renewing).await;
        assert!(renewed_session(&renewal).is_some(), "{renewal}");
        if renewed_session(&renewal).as_deref() != Some(driving.as_str()) {
            continue;
        }
        assert_eq!(renewal["meta"]["session"]["subject"], "alice");
        assert_eq!(renewal["meta"]["session"]["role"], "operator");
        let claims = verify(&jwks, ticket_of(&renewal));
        assert_eq!(claims.connection_id, driving);
        assert_eq!(claims.role.as_str(), "operator");
        assert!(claims.jti.as_deref().is_some_and(|id| id.len() >= 22));
        ids.push(claims.jti);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "every ticket has an id of its own: {ids:?}");
    assert!(metric(&server, "signalling_ticket_renewals_total").await >= 2.0);

    // Renewals went out at least twice; the other robot's socket holds none of them: the
    // first thing it has after its offer is the answer to this ping.
    let ping = json!({"type": "signalling.ping", "version": "0.5",
        "id": "p-1", "timestamp": "2026-01-06T12:00:00Z", "payload": {}});
    plain.send(&ping).await;
    let pong = next_but_welcomes(&mut plain).await;
    assert_eq!(pong["type"], "signalling.pong", "{pong}");

    // The driving session ends: once a round has renewed the viewer's after that, no
    // renewal names the ended one.
    drop(alice);
    loop {
        let message = next_but_welcomes(&mut renewing).await;
        if message["type"] == "signalling.disconnected" {
            assert_eq!(message["payload"]["connectionId"], driving.as_str());
            break;
        }
        assert!(renewed_session(&message).is_some(), "{message}");
    }
    let mut rounds = 0;
    while rounds < 2 {
        let message = next_but_welcomes(&mut renewing).await;
        match renewed_session(&message) {
            Some(id) if id == watching => rounds += 1,
            Some(id) => assert!(rounds == 0, "a renewal for ended session {id}"),
            None => panic!("{message}"),
        }
    }
}

#[tokio::test]
async fn what_robots_refuse_or_end_for_a_ticket_is_counted_by_kind() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    for (why, kind) in [("bad_ticket", "offer"), ("ticket_expired", "expired")] {
        let mut client = server.client_for("robot-1", "alice", "viewer").await;
        let session = client.connection_id.clone();
        client.send(&offer("robot-1", &session)).await;
        robot.recv_type("signalling.offer").await;
        robot
            .send(&json!({
                "type": "signalling.disconnected", "version": "0.5", "id": format!("d-{kind}"),
                "timestamp": "2026-01-06T12:00:00Z",
                "payload": {"connectionId": session, "reason": "failed",
                    "details": {"reason": why, "error": "refused"}},
            }))
            .await;
        let told = client.recv_type("signalling.disconnected").await;
        assert_eq!(told["payload"]["details"]["reason"], why, "{told}");
        let name = format!("signalling_robot_ticket_refusals_total{{kind=\"{kind}\"}}");
        assert_eq!(metric(&server, &name).await, 1.0, "{kind}");
    }
}

#[tokio::test]
async fn with_session_tickets_off_nothing_is_minted_and_the_keys_stay_published() {
    let server = TestServer::start_with(|c| c.session_tickets = false).await;
    assert_eq!(
        signing_keys(&server).await["keys"].as_array().map(Vec::len),
        Some(1)
    );
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut client = server.client_for("robot-1", "alice", "operator").await;
    let session = client.connection_id.clone();
    client.send(&offer("robot-1", &session)).await;
    let forwarded = robot.recv_type("signalling.offer").await;
    assert_eq!(
        forwarded["meta"]["session"]["role"], "operator",
        "{forwarded}"
    );
    assert!(
        forwarded["meta"]["session"].get("ticket").is_none(),
        "{forwarded}"
    );
}

#[tokio::test]
async fn an_arp_request_a_robot_refuses_for_its_ticket_is_counted() {
    let server = TestServer::start().await;
    let key = server.enrolled_robot("robot-arp").await;
    let mut robot = arp_robot_at(&server.ws_url(), "robot-arp", &key).await;
    server.grant("robot-arp", "planner", "operator").await;
    let token = server.client_token("planner").await;
    let mut program = ArpClient::connect(&server, "robot-arp", &token).await;
    let init = json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "t", "version": "1"}, "capabilities": {}});
    let init_id = program.request("arp.initialize", init).await;
    let message = robot.recv_type("arp.frame").await;
    let connection = message["payload"]["connectionId"].as_str().expect("id");
    let refused = json!({"jsonrpc": "2.0", "id": message["payload"]["frame"]["id"],
        "error": {"code": -32603, "message": "refused: the ticket was used before",
                  "data": {"reason": "bad_ticket"}}});
    robot_answers(&mut robot, connection, refused).await;
    let answer = program.answer(&init_id).await;
    assert_eq!(answer["error"]["data"]["reason"], "bad_ticket", "{answer}");
    let name = "signalling_robot_ticket_refusals_total{kind=\"arp\"}";
    assert_eq!(metric(&server, name).await, 1.0);
}

/// Two Ed25519 private keys as PEM files in a fresh directory: (dir, old, new).
fn two_key_files() -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("rotation-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (old, new) = (dir.join("old.pem"), dir.join("new.pem"));
    for path in [&old, &new] {
        let rng = ring::rand::SystemRandom::new();
        let der = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("key");
        let text = pem::encode(&pem::Pem::new("PRIVATE KEY", der.as_ref().to_vec()));
        std::fs::write(path, text).expect("write");
    }
    (dir, old, new)
}

#[tokio::test]
async fn during_a_rotation_robots_that_check_tickets_get_the_new_key_endorsed_by_the_old() {
    let (dir, old, new) = two_key_files();
    let server = TestServer::start_with(move |c| {
        c.signing_key_file = Some(new);
        c.signing_key_previous_file = Some(old);
    })
    .await;
    let jwks = signing_keys(&server).await;
    let (current, previous) = (&jwks["keys"][0], &jwks["keys"][1]);
    let mut renewing = renewing_robot(&server, "robot-1").await;
    let message = next_but_welcomes(&mut renewing).await;
    assert_eq!(message["type"], "session.signing_keys", "{message}");
    let endorsement = message["payload"]["endorsement"].as_str().expect("JWS");
    // Signed by the previous key (the one robots pinned), naming the current one.
    let header = jsonwebtoken::decode_header(endorsement).expect("JWS");
    assert_eq!(header.kid.as_deref(), previous["kid"].as_str());
    let key = DecodingKey::from_ed_components(previous["x"].as_str().expect("x")).expect("key");
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.validate_exp = false;
    validation.set_required_spec_claims::<&str>(&[]);
    let claims = jsonwebtoken::decode::<signalling_protocol::ticket::KeyEndorsement>(
        endorsement,
        &key,
        &validation,
    )
    .expect("the endorsement checks against the previous key")
    .claims;
    assert_eq!(claims.endorses, vec![current.clone()]);

    // A robot that declared nothing (the Modulr-like) gets none: the first thing after its
    // login is the answer to its ping.
    let (mut plain, _) = server.online_robot("robot-2").await;
    plain
        .send(
            &json!({"type": "signalling.ping", "version": "0.5", "id": "p-1",
            "timestamp": "2026-01-06T12:00:00Z", "payload": {}}),
        )
        .await;
    let pong = next_but_welcomes(&mut plain).await;
    assert_eq!(pong["type"], "signalling.pong", "{pong}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_previous_key_given_as_a_public_key_endorses_nothing() {
    let (dir, old, new) = two_key_files();
    let public = dir.join("old.pub.pem");
    let der = pem::parse(std::fs::read(&old).expect("read")).expect("PEM");
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8(der.contents()).expect("key");
    let mut spki = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    spki.extend_from_slice(pair.public_key().as_ref());
    std::fs::write(&public, pem::encode(&pem::Pem::new("PUBLIC KEY", spki))).expect("write");
    let server = TestServer::start_with(move |c| {
        c.signing_key_file = Some(new);
        c.signing_key_previous_file = Some(public);
    })
    .await;
    assert_eq!(
        signing_keys(&server).await["keys"].as_array().map(Vec::len),
        Some(2)
    );
    let mut renewing = renewing_robot(&server, "robot-1").await;
    renewing
        .send(
            &json!({"type": "signalling.ping", "version": "0.5", "id": "p-1",
            "timestamp": "2026-01-06T12:00:00Z", "payload": {}}),
        )
        .await;
    let pong = next_but_welcomes(&mut renewing).await;
    assert_eq!(pong["type"], "signalling.pong", "{pong}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn once_the_robot_answers_the_key_exchange_its_tickets_are_macd_with_the_session_key() {
    use ring::agreement::{agree_ephemeral, EphemeralPrivateKey, UnparsedPublicKey, X25519};
    use signalling_protocol::ticket::{session_mac_key, KEY_EXCHANGE_META_KEY, SESSION_KEY_ID};
    let server = TestServer::start().await;
    let (jwks, mut robot, mut program, init_id, message) = initialize_forwarded(&server).await;
    let offer = verify(&jwks, ticket_of(&message));
    let connection = message["payload"]["connectionId"]
        .as_str()
        .expect("id")
        .to_owned();
    // The robot's half, answered as robot-agent does: in meta of its next frame.
    let rng = ring::rand::SystemRandom::new();
    let ours = EphemeralPrivateKey::generate(&X25519, &rng).expect("key");
    let half = URL_SAFE_NO_PAD.encode(ours.compute_public_key().expect("public"));
    let server_half = URL_SAFE_NO_PAD
        .decode(offer.kx.as_deref().expect("kx"))
        .expect("b64");
    let secret = agree_ephemeral(
        ours,
        &UnparsedPublicKey::new(&X25519, server_half),
        |shared| session_mac_key(shared, offer.jti.as_deref().expect("jti"), &connection),
    )
    .expect("an X25519 key");
    let mut answer = envelope(
        "arp.frame",
        Some(json!({"connectionId": connection,
            "frame": {"jsonrpc": "2.0", "id": message["payload"]["frame"]["id"], "result": initialize_result()}})),
    );
    answer["meta"] = json!({ KEY_EXCHANGE_META_KEY: half });
    robot.send(&answer).await;
    program.answer(&init_id).await;

    let params = json!({"name": "drive", "arguments": {"linear": 0.2, "angular": 0.0}});
    program.request("arp.callTool", params.clone()).await;
    let message = loop {
        let m = robot.recv_type("arp.frame").await;
        if m["payload"]["frame"]["method"] == "arp.callTool" {
            break m;
        }
    };
    let ticket = ticket_of(&message);
    let header = jsonwebtoken::decode_header(ticket).expect("a JWS");
    assert_eq!(header.alg, Algorithm::HS256);
    assert_eq!(header.kid.as_deref(), Some(SESSION_KEY_ID));
    let mut validation = Validation::new(Algorithm::HS256);
    validation.validate_aud = false;
    let claims = jsonwebtoken::decode::<TicketClaims>(
        ticket,
        &DecodingKey::from_secret(&secret),
        &validation,
    )
    .expect("MAC'd with the session's key")
    .claims;
    assert_eq!(claims.connection_id, connection);
    assert_eq!(claims.robot, "robot-arp");
    assert_eq!(claims.role.as_str(), "operator");
    assert_eq!(
        claims.call_id,
        Some(message["payload"]["frame"]["id"].clone())
    );
    assert_eq!(claims.params_hash, Some(params_hash(Some(&params))));
    assert!(claims.kx.is_none(), "offered once");
    assert_ne!(claims.jti, offer.jti);
    // Under any other key it does not check.
    assert!(jsonwebtoken::decode::<TicketClaims>(
        ticket,
        &DecodingKey::from_secret(&[0; 32]),
        &validation
    )
    .is_err());
}

//! The HTTP API: admin auth, robots, enrollment, tokens, grants, sessions, health. Every
//! error is JSON with the right status.

use crate::helpers::*;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use reqwest::Method;
use ring::signature::KeyPair;
use serde_json::{json, Value};

/// Every admin route. No body is sent: the token is checked before the body is read.
const ADMIN_ROUTES: [(Method, &str); 12] = [
    (Method::GET, "/v1/robots"),
    (Method::POST, "/v1/robots"),
    (Method::GET, "/v1/robots/robot-1"),
    (Method::DELETE, "/v1/robots/robot-1"),
    (Method::POST, "/v1/robots/robot-1/enrollment-token"),
    (Method::POST, "/v1/robots/robot-1/revoke"),
    (Method::GET, "/v1/robots/robot-1/grants"),
    (Method::PUT, "/v1/robots/robot-1/grants/alice"),
    (Method::DELETE, "/v1/robots/robot-1/grants/alice"),
    (Method::POST, "/v1/tokens"),
    (Method::DELETE, "/v1/tokens/x"),
    (Method::GET, "/v1/sessions"),
];

#[tokio::test]
async fn admin_routes_need_the_admin_token() {
    let server = TestServer::start().await;
    let wrong_credentials: [(&str, Option<String>); 3] = [
        ("no Authorization", None),
        ("a wrong token", Some("Bearer wrong".into())),
        (
            "the token under another scheme",
            Some(format!("Token {ADMIN_TOKEN}")),
        ),
    ];
    for (method, path) in ADMIN_ROUTES {
        for (what, authorization) in &wrong_credentials {
            let mut request = server.http.request(method.clone(), server.url(path));
            if let Some(value) = authorization {
                request = request.header("authorization", value);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 401, "{method} {path} with {what}");
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["error"], "UNAUTHORIZED", "{method} {path} with {what}");
        }
        // The table is not vacuous: with the token, the same request gets past the check.
        let (status, body) = server.admin(method.clone(), path, None).await;
        assert_ne!(status, 401, "{method} {path} with the admin token: {body}");
    }
}

#[tokio::test]
async fn robot_lifecycle() {
    let server = TestServer::start().await;
    let (status, body) = server
        .admin(
            Method::POST,
            "/v1/robots",
            Some(json!({"robotId": "robot-1", "name": "Rover", "metadata": {"site": "lab"}})),
        )
        .await;
    assert_eq!(status, 201);
    assert!(body["enrollmentToken"].as_str().unwrap().len() > 30);
    assert!(body["enrollmentTokenExpiresAt"].is_string());

    let (status, body) = server
        .admin(
            Method::POST,
            "/v1/robots",
            Some(json!({"robotId": "robot-1"})),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(body["error"], "CONFLICT");

    let (status, list) = server.admin(Method::GET, "/v1/robots", None).await;
    assert_eq!(status, 200);
    assert_eq!(list.as_array().unwrap().len(), 1);
    let robot = &list[0];
    assert_eq!(robot["robotId"], "robot-1");
    assert_eq!(robot["name"], "Rover");
    assert_eq!(robot["online"], false);
    assert_eq!(robot["credential"], Value::Null);
    assert_eq!(robot["lastSeenAt"], Value::Null);

    let (status, _) = server
        .admin(Method::DELETE, "/v1/robots/robot-1", None)
        .await;
    assert_eq!(status, 204);
    let (status, _) = server
        .admin(Method::DELETE, "/v1/robots/robot-1", None)
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn enrollment_token_is_single_use_and_replaceable() {
    let server = TestServer::start().await;
    let token = server.create_robot("robot-1").await;
    let key = new_ed25519();
    let public_key = STANDARD.encode(key.public_key().as_ref());
    let enroll = |token: String, key: String| json!({"robotId": "robot-1", "enrollmentToken": token, "publicKey": key});

    let mut both = enroll(token.clone(), public_key.clone());
    both["csr"] = json!("x");
    for (why, body, status, error) in [
        (
            "a wrong token",
            enroll("set_wrong".into(), public_key.clone()),
            401,
            "UNAUTHORIZED",
        ),
        (
            "a malformed key",
            enroll(token.clone(), "AAAA".into()),
            422,
            "UNPROCESSABLE",
        ),
        ("both key and CSR", both, 422, "UNPROCESSABLE"),
    ] {
        let (got, reply) = server.post("/v1/enroll", body).await;
        assert_eq!(
            (got, reply["error"].as_str()),
            (status, Some(error)),
            "{why}: {reply}"
        );
    }
    // None of those used the token up.
    let (status, _) = server
        .post("/v1/enroll", enroll(token.clone(), public_key.clone()))
        .await;
    assert_eq!(status, 201);
    let (status, _) = server
        .post("/v1/enroll", enroll(token.clone(), public_key.clone()))
        .await;
    assert_eq!(status, 401, "a used token");
    let (status, _) = server
        .post(
            "/v1/enroll",
            json!({"robotId": "ghost", "enrollmentToken": token, "publicKey": public_key}),
        )
        .await;
    assert_eq!(status, 401, "unknown robots look like bad tokens");

    // A new token replaces the old one; re-enrollment replaces the key.
    let (status, first) = server
        .admin(Method::POST, "/v1/robots/robot-1/enrollment-token", None)
        .await;
    assert_eq!(status, 200);
    let (_, second) = server
        .admin(Method::POST, "/v1/robots/robot-1/enrollment-token", None)
        .await;
    let new_key = new_ed25519();
    let new_public = STANDARD.encode(new_key.public_key().as_ref());
    let first_token = first["enrollmentToken"].as_str().unwrap().to_string();
    let (status, _) = server
        .post("/v1/enroll", enroll(first_token, new_public.clone()))
        .await;
    assert_eq!(status, 401, "the replaced token stopped working");
    let second_token = second["enrollmentToken"].as_str().unwrap().to_string();
    let (status, _) = server
        .post("/v1/enroll", enroll(second_token, new_public))
        .await;
    assert_eq!(status, 201);
    let mut robot = WsClient::connect(&server.ws_url()).await;
    robot.login_as_robot("robot-1", &new_key).await;
}

#[tokio::test]
async fn expired_enrollment_token_is_refused() {
    let server = TestServer::start_with(|c| c.enrollment_token_ttl_secs = 0).await;
    let token = server.create_robot("robot-1").await;
    let key = new_ed25519();
    let (status, _) = server
        .post(
            "/v1/enroll",
            json!({"robotId": "robot-1", "enrollmentToken": token,
                   "publicKey": STANDARD.encode(key.public_key().as_ref())}),
        )
        .await;
    assert_eq!(status, 401);
}

enum Body {
    Empty,
    Json(Value),
    /// Sent as is, labelled application/json.
    Raw(String),
}

#[tokio::test]
async fn malformed_requests_get_json_errors() {
    let server = TestServer::start().await;
    server.create_robot("robot-1").await;
    let cases = [
        (
            Method::POST,
            "/v1/robots",
            Body::Raw("{oops".into()),
            400,
            "BAD_REQUEST",
        ),
        (
            Method::POST,
            "/v1/enroll",
            Body::Raw(format!("{{\"pad\": \"{}\"}}", "x".repeat(100 * 1024))),
            413,
            "PAYLOAD_TOO_LARGE",
        ),
        (Method::GET, "/nowhere", Body::Empty, 404, "NOT_FOUND"),
        (
            Method::DELETE,
            "/healthz",
            Body::Empty,
            405,
            "METHOD_NOT_ALLOWED",
        ),
        (
            Method::POST,
            "/v1/robots",
            Body::Json(json!({"robotId": "bad id/with slash"})),
            422,
            "UNPROCESSABLE",
        ),
        (
            Method::POST,
            "/v1/robots",
            Body::Json(json!({"robotId": 5})),
            422,
            "UNPROCESSABLE",
        ),
        (
            Method::POST,
            "/v1/robots",
            Body::Json(json!({"robotId": "robot-1"})),
            409,
            "CONFLICT",
        ),
        (
            Method::GET,
            "/v1/robots/nope",
            Body::Empty,
            404,
            "NOT_FOUND",
        ),
        (
            Method::PUT,
            "/v1/robots/none/grants/alice",
            Body::Json(json!({"role": "operator"})),
            404,
            "NOT_FOUND",
        ),
        (
            Method::PUT,
            "/v1/robots/robot-1/grants/alice",
            Body::Json(json!({"role": "god"})),
            422,
            "UNPROCESSABLE",
        ),
        (
            Method::POST,
            "/v1/tokens",
            Body::Json(json!({"subject": "a", "ttlSeconds": 0})),
            422,
            "UNPROCESSABLE",
        ),
        (
            Method::DELETE,
            "/v1/tokens/does-not-exist",
            Body::Empty,
            404,
            "NOT_FOUND",
        ),
        (
            Method::GET,
            "/v1/sessions?active=maybe",
            Body::Empty,
            400,
            "BAD_REQUEST",
        ),
    ];
    for (method, path, body, status, error) in cases {
        let mut request = server
            .http
            .request(method.clone(), server.url(path))
            .bearer_auth(ADMIN_TOKEN);
        request = match body {
            Body::Empty => request,
            Body::Json(value) => request.json(&value),
            Body::Raw(text) => request
                .header("content-type", "application/json")
                .body(text),
        };
        let response = request.send().await.unwrap();
        let got = response.status().as_u16();
        let reply: Value = response.json().await.expect("a JSON error body");
        assert_eq!(
            (got, reply["error"].as_str()),
            (status, Some(error)),
            "{method} {path}: {reply}"
        );
    }
}

#[tokio::test]
async fn grants_and_tokens() {
    let server = TestServer::start().await;
    server.create_robot("robot-1").await;
    server.grant("robot-1", "alice", "operator").await;
    server.grant("robot-1", "auth0|bob", "viewer").await;
    server.grant("robot-1", "alice", "owner").await;
    let (status, grants) = server
        .admin(Method::GET, "/v1/robots/robot-1/grants", None)
        .await;
    assert_eq!(status, 200);
    let grants = grants.as_array().unwrap();
    assert_eq!(grants.len(), 2);
    assert_eq!(grants[0]["subject"], "alice");
    assert_eq!(grants[0]["role"], "owner");
    assert_eq!(grants[1]["subject"], "auth0|bob");
    let (status, _) = server
        .admin(
            Method::DELETE,
            "/v1/robots/robot-1/grants/auth0%7Cbob",
            None,
        )
        .await;
    assert_eq!(status, 204);
    let (status, _) = server
        .admin(
            Method::DELETE,
            "/v1/robots/robot-1/grants/auth0%7Cbob",
            None,
        )
        .await;
    assert_eq!(status, 404);

    let (status, token) = server
        .admin(
            Method::POST,
            "/v1/tokens",
            Some(json!({"subject": "alice", "ttlSeconds": 60})),
        )
        .await;
    assert_eq!(status, 201);
    assert!(token["token"].as_str().unwrap().starts_with("sct_"));
    assert!(token["tokenId"].is_string() && token["expiresAt"].is_string());
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let server = TestServer::start().await;
    let response = server
        .http
        .get(server.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let response = server.http.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let (_robot, _) = server.online_robot("robot-1").await;
    let _client = server.client_for("robot-1", "alice", "viewer").await;
    let metrics = server.metrics().await;
    for line in [
        "signalling_connections{role=\"robot\"} 1",
        "signalling_connections{role=\"client\"} 1",
        "signalling_robots_online 1",
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
}

#[tokio::test]
async fn sessions_can_be_filtered() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut alice = server.client_for("robot-1", "alice", "viewer").await;
    let mut bob = server.client_for("robot-1", "bob", "viewer").await;
    alice.send(&offer("robot-1", "s-alice")).await;
    robot.recv_type("signalling.offer").await;
    bob.send(&offer("robot-1", "s-bob")).await;
    robot.recv_type("signalling.offer").await;
    drop(bob);
    robot.recv_type("signalling.disconnected").await;
    robot.expect_nothing_pending().await;
    server.ended_record("s-bob").await;
    assert_eq!(server.sessions("").await.len(), 2);
    let alice_sessions = server.sessions("?subject=alice").await;
    assert_eq!(alice_sessions.len(), 1);
    assert_eq!(alice_sessions[0]["connectionId"], "s-alice");
    let active = server.sessions("?active=true").await;
    assert_eq!(active.len(), 1);
    assert_eq!(active[0]["subject"], "alice");
    assert_eq!(server.sessions("?active=false").await[0]["subject"], "bob");
    assert!(server.sessions("?robotId=other").await.is_empty());
}

#[tokio::test]
async fn generated_admin_token_is_kept_across_restarts() {
    let (url, _) = test_database().await;
    let first = url.clone();
    let server = TestServer::start_with(move |c| {
        c.admin_token = None;
        c.database_url = Some(first);
    })
    .await;
    // The configured test token is not the admin token now.
    let (status, _) = server.admin(Method::GET, "/v1/robots", None).await;
    assert_eq!(status, 401);
    let hash = server.state.admin_token_hash.clone();
    drop(server);
    let server = TestServer::start_with(move |c| {
        c.admin_token = None;
        c.database_url = Some(url);
    })
    .await;
    assert_eq!(server.state.admin_token_hash, hash);
}

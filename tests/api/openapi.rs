//! The API's own description (`GET /v1/openapi.json`) and the routes the browser side uses:
//! the console and SDK files (ETag, 304), the caller's view (`/v1/me`, `/v1/me/robots`) and
//! the token list. CI also runs schemathesis against the document (see .ci/run).

use crate::helpers::*;
use reqwest::header;
use reqwest::Method;
use serde_json::{json, Value};

/// Every API route (path in OpenAPI form, method) the document must describe.
const DESCRIBED: [(&str, &str); 17] = [
    ("/v1/enroll", "post"),
    ("/v1/robots", "get"),
    ("/v1/robots", "post"),
    ("/v1/robots/{id}", "get"),
    ("/v1/robots/{id}", "delete"),
    ("/v1/robots/{id}/enrollment-token", "post"),
    ("/v1/robots/{id}/revoke", "post"),
    ("/v1/robots/{id}/key", "get"),
    ("/v1/robots/{id}/grants", "get"),
    ("/v1/robots/{id}/grants/{subject}", "put"),
    ("/v1/robots/{id}/grants/{subject}", "delete"),
    ("/v1/tokens", "get"),
    ("/v1/tokens", "post"),
    ("/v1/tokens/{token_id}", "delete"),
    ("/v1/sessions", "get"),
    ("/v1/me", "get"),
    ("/v1/me/robots", "get"),
];

#[tokio::test]
async fn the_openapi_document_describes_every_api_route() {
    let server = TestServer::start().await;
    let response = server
        .http
        .get(server.url("/v1/openapi.json"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    let doc: Value = response.json().await.expect("JSON");
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "OpenAPI 3.1: {}",
        doc["openapi"]
    );
    for (path, method) in DESCRIBED {
        let operation = &doc["paths"][path][method];
        assert!(operation.is_object(), "{method} {path} is described");
        assert!(
            operation["responses"]["401"].is_object() || path == "/v1/enroll",
            "{method} {path} documents 401"
        );
        let secured = operation["security"].is_array();
        assert_eq!(secured, path != "/v1/enroll", "{method} {path} security");
    }
    for schema in [
        "RobotView",
        "RobotKeyView",
        "RobotJwk",
        "RobotCreated",
        "GrantView",
        "SessionView",
        "TokenCreated",
        "TokenView",
        "ErrorBody",
        "RoleName",
        "EnrollBody",
        "EnrollWithKey",
        "MyRobot",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "schema {schema}"
        );
    }
    assert_eq!(
        doc["components"]["schemas"]["RoleName"]["enum"],
        json!(["viewer", "operator", "owner"])
    );
    for scheme in ["admin", "client"] {
        assert_eq!(
            doc["components"]["securitySchemes"][scheme]["scheme"],
            "bearer"
        );
    }
    // The answers carry the fields the document names (camelCase, as served).
    let robot = &doc["components"]["schemas"]["RobotView"]["properties"];
    for field in ["robotId", "online", "lastSeenAt", "credential", "node"] {
        assert!(robot[field].is_object(), "RobotView.{field}");
    }
    server.shutdown().await;
}

async fn get(server: &TestServer, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = server.http.get(server.url(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("request")
}

#[tokio::test]
async fn the_sdk_is_served_with_an_etag_and_revalidates_to_304() {
    let server = TestServer::start().await;
    let first = get(&server, "/sdk/signalling-client.js", &[]).await;
    assert_eq!(first.status(), 200);
    assert_eq!(
        first.headers()[header::CONTENT_TYPE],
        "text/javascript; charset=utf-8"
    );
    assert!(first.headers()[header::CACHE_CONTROL]
        .to_str()
        .expect("ascii")
        .contains("max-age"));
    let etag = first.headers()[header::ETAG]
        .to_str()
        .expect("ascii")
        .to_string();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    let body = first.bytes().await.expect("body");
    let built = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/clients/js/dist/signalling-client.js"
    ))
    .expect("the built SDK");
    assert_eq!(
        body.as_ref(),
        built.as_slice(),
        "serves the committed build"
    );
    assert!(String::from_utf8_lossy(&body).contains("SignallingClient"));

    let again = get(
        &server,
        "/sdk/signalling-client.js",
        &[("if-none-match", &etag)],
    )
    .await;
    assert_eq!(again.status(), 304);
    assert_eq!(again.headers()[header::ETAG].to_str().expect("ascii"), etag);
    assert!(again.bytes().await.expect("body").is_empty());

    let weak = format!("\"other\", W/{etag}");
    let listed = get(
        &server,
        "/sdk/signalling-client.js",
        &[("if-none-match", &weak)],
    )
    .await;
    assert_eq!(listed.status(), 304, "a weak match in a list");

    let stale = get(
        &server,
        "/sdk/signalling-client.js",
        &[("if-none-match", "\"0000\"")],
    )
    .await;
    assert_eq!(stale.status(), 200);

    let types = get(&server, "/sdk/signalling-client.d.ts", &[]).await;
    assert_eq!(types.status(), 200);
    assert!(types.text().await.expect("text").contains("openSession"));
    server.shutdown().await;
}

#[tokio::test]
async fn the_console_is_served_at_the_root_with_a_strict_policy() {
    let server = TestServer::start().await;
    let page = get(&server, "/", &[]).await;
    assert_eq!(page.status(), 200);
    assert_eq!(
        page.headers()[header::CONTENT_TYPE],
        "text/html; charset=utf-8"
    );
    let csp = page.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .expect("ascii")
        .to_string();
    assert!(csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"));
    assert_eq!(page.headers()[header::CACHE_CONTROL], "no-cache");
    let html = page.text().await.expect("text");
    assert!(html.contains("/console/app.js") && html.contains("/console/style.css"));
    // Nothing from another origin: no CDN, no font service.
    assert!(!html.contains("http://") && !html.contains("https://"));
    for asset in [
        "/console/app.js",
        "/console/style.css",
        "/console/favicon.svg",
    ] {
        let response = get(&server, asset, &[]).await;
        assert_eq!(response.status(), 200, "{asset}");
        assert!(response.headers().contains_key(header::ETAG), "{asset}");
    }
    let app = get(&server, "/console/app.js", &[])
        .await
        .text()
        .await
        .expect("text");
    assert!(app.contains("from '/sdk/signalling-client.js'"));
    let missing = get(&server, "/console/nope.js", &[]).await;
    assert_eq!(missing.status(), 404);
    assert_eq!(
        missing.json::<Value>().await.expect("JSON")["error"],
        "NOT_FOUND"
    );
    server.shutdown().await;
}

async fn as_client(server: &TestServer, path: &str, token: &str) -> (u16, Value) {
    let response = server
        .http
        .get(server.url(path))
        .bearer_auth(token)
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

#[tokio::test]
async fn a_client_sees_itself_and_only_the_robots_it_holds_grants_on() {
    let server = TestServer::start().await;
    let (_robot, _key) = server.online_robot("robot-a").await;
    server.create_robot("robot-b").await;
    server.create_robot("robot-c").await;
    server.grant("robot-a", "alice", "operator").await;
    server.grant("robot-b", "alice", "viewer").await;
    server.grant("robot-c", "bob", "owner").await;
    let alice = server.client_token("alice").await;

    let (status, me) = as_client(&server, "/v1/me", &alice).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["subject"], "alice");
    assert!(me["expiresAt"].is_string());

    let (status, robots) = as_client(&server, "/v1/me/robots", &alice).await;
    assert_eq!(status, 200, "{robots}");
    let seen: Vec<(&str, &str, bool)> = robots
        .as_array()
        .expect("array")
        .iter()
        .map(|r| {
            (
                r["robotId"].as_str().expect("id"),
                r["role"].as_str().expect("role"),
                r["online"].as_bool().expect("online"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![("robot-a", "operator", true), ("robot-b", "viewer", false)]
    );

    // The admin token is no client token, and a revoked token stops working.
    let (status, body) = as_client(&server, "/v1/me", ADMIN_TOKEN).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("UNAUTHORIZED"))
    );
    let unauthenticated = get(&server, "/v1/me/robots", &[]).await;
    assert_eq!(unauthenticated.status(), 401);
    let (_, tokens) = server.admin(Method::GET, "/v1/tokens", None).await;
    let id = tokens[0]["tokenId"].as_str().expect("id").to_string();
    let (status, _) = server
        .admin(Method::DELETE, &format!("/v1/tokens/{id}"), None)
        .await;
    assert_eq!(status, 204);
    let (status, _) = as_client(&server, "/v1/me/robots", &alice).await;
    assert_eq!(status, 401);
    server.shutdown().await;
}

#[tokio::test]
async fn the_token_list_shows_ids_subjects_and_revocations_never_secrets() {
    let server = TestServer::start().await;
    let alice = server.client_token("alice").await;
    server.client_token("bob").await;
    let (status, tokens) = server.admin(Method::GET, "/v1/tokens", None).await;
    assert_eq!(status, 200, "{tokens}");
    let list = tokens.as_array().expect("array");
    assert_eq!(list.len(), 2);
    assert!(
        !tokens.to_string().contains(&alice),
        "no secret in the list"
    );
    let alice_entry = list
        .iter()
        .find(|t| t["subject"] == "alice")
        .expect("alice's token");
    assert!(alice_entry["revokedAt"].is_null());
    let id = alice_entry["tokenId"].as_str().expect("id");
    server
        .admin(Method::DELETE, &format!("/v1/tokens/{id}"), None)
        .await;
    let (_, tokens) = server.admin(Method::GET, "/v1/tokens", None).await;
    let alice_entry = tokens
        .as_array()
        .expect("array")
        .iter()
        .find(|t| t["subject"] == "alice")
        .expect("alice's token")
        .clone();
    assert!(alice_entry["revokedAt"].is_string());
    let unauthenticated = get(&server, "/v1/tokens", &[]).await;
    assert_eq!(unauthenticated.status(), 401);
    server.shutdown().await;
}

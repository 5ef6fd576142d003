//! `GET /v1/robots/{id}/key`: the enrolled key as a JWK, for clients checking a robot's
//! signed replies; for the admin and holders of a grant on the robot, nobody else.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use serde_json::{json, Value};

use crate::fleet_ca::{temp_file, Ca};
use crate::helpers::*;

/// GET the key of `robot_id` with `token` (none: no Authorization header).
async fn key(server: &TestServer, robot_id: &str, token: Option<&str>) -> (u16, Value) {
    let mut request = server
        .http
        .get(server.url(&format!("/v1/robots/{robot_id}/key")));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("GET");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

fn b64url(value: &Value) -> Vec<u8> {
    URL_SAFE_NO_PAD
        .decode(value.as_str().expect("a string"))
        .expect("base64url")
}

#[tokio::test]
async fn grant_holders_and_the_admin_get_an_ed25519_robots_key() {
    let server = TestServer::start().await;
    let robot = server.enrolled_robot("robot-1").await;
    let alice = server.client_token("alice").await;
    let mallory = server.client_token("mallory").await;

    let (status, body) = key(&server, "robot-1", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("UNAUTHORIZED"))
    );
    let (status, body) = key(&server, "robot-1", Some("sct_not-a-token")).await;
    assert_eq!(status, 401, "{body}");
    // A valid token without a grant: refused, whether the robot exists or not (no way to
    // probe for robot ids).
    let (status, body) = key(&server, "robot-1", Some(&mallory)).await;
    assert_eq!((status, body["error"].as_str()), (403, Some("FORBIDDEN")));
    let (status, _) = key(&server, "robot-nope", Some(&mallory)).await;
    assert_eq!(status, 403);

    // Any role will do: a viewer checks the replies it reads too.
    server.grant("robot-1", "alice", "viewer").await;
    let (status, body) = key(&server, "robot-1", Some(&alice)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["robotId"], "robot-1");
    assert_eq!(body["credential"], "ed25519");
    let jwk = &body["jwk"];
    assert_eq!(
        (jwk["kty"].as_str(), jwk["crv"].as_str()),
        (Some("OKP"), Some("Ed25519"))
    );
    assert_eq!(jwk["alg"], "EdDSA");
    assert!(jwk.get("y").is_none(), "{jwk}");
    assert_eq!(b64url(&jwk["x"]), robot.public_key().as_ref());

    let (status, admin_view) = key(&server, "robot-1", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200);
    assert_eq!(admin_view, body);
    let (status, body) = key(&server, "robot-nope", Some(ADMIN_TOKEN)).await;
    assert_eq!((status, body["error"].as_str()), (404, Some("NOT_FOUND")));

    // The grant withdrawn, the key is no longer the subject's to read.
    let (status, _) = server
        .admin(
            reqwest::Method::DELETE,
            "/v1/robots/robot-1/grants/alice",
            None,
        )
        .await;
    assert_eq!(status, 204);
    let (status, _) = key(&server, "robot-1", Some(&alice)).await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn a_p256_key_is_an_ec_jwk() {
    let server = TestServer::start().await;
    let token = server.create_robot("robot-ec").await;
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let robot =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = robot.public_key().as_ref();
    let mut spki = vec![
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
        0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ];
    spki.extend_from_slice(point);
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        STANDARD.encode(spki)
    );
    let (status, body) = server
        .post(
            "/v1/enroll",
            json!({"robotId": "robot-ec", "enrollmentToken": token, "publicKey": pem}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let bob = server.client_token("bob").await;
    server.grant("robot-ec", "bob", "operator").await;

    let (status, body) = key(&server, "robot-ec", Some(&bob)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["credential"], "ecdsa-p256");
    let jwk = &body["jwk"];
    assert_eq!(
        (jwk["kty"].as_str(), jwk["crv"].as_str()),
        (Some("EC"), Some("P-256"))
    );
    assert_eq!(jwk["alg"], "ES256");
    let mut from_jwk = vec![0x04];
    from_jwk.extend(b64url(&jwk["x"]));
    from_jwk.extend(b64url(&jwk["y"]));
    assert_eq!(from_jwk, point);
}

#[tokio::test]
async fn not_enrolled_or_revoked_is_404() {
    let server = TestServer::start().await;
    server.create_robot("robot-new").await;
    let carol = server.client_token("carol").await;
    server.grant("robot-new", "carol", "owner").await;
    let (status, body) = key(&server, "robot-new", Some(&carol)).await;
    assert_eq!((status, body["error"].as_str()), (404, Some("NOT_FOUND")));
    assert!(
        body["message"]
            .as_str()
            .expect("message")
            .contains("not enrolled"),
        "{body}"
    );

    server.enrolled_robot("robot-gone").await;
    server.grant("robot-gone", "carol", "owner").await;
    let (status, _) = key(&server, "robot-gone", Some(&carol)).await;
    assert_eq!(status, 200);
    let (status, _) = server
        .admin(reqwest::Method::POST, "/v1/robots/robot-gone/revoke", None)
        .await;
    assert_eq!(status, 200);
    let (status, body) = key(&server, "robot-gone", Some(&carol)).await;
    assert_eq!((status, body["error"].as_str()), (404, Some("NOT_FOUND")));
}

#[tokio::test]
async fn a_certificates_leaf_key_is_served_when_it_can_sign_replies() {
    let ca = Ca::root("Fleet Root");
    let anchors = temp_file("anchors.pem", &ca.pem);
    let server = TestServer::start_with(move |c| {
        c.trust_anchors = Some(anchors);
        c.auto_register = true;
    })
    .await;
    let leaf_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let chain = ca.leaf("robot-x509", &leaf_key, 41);
    let _robot = server
        .robot_login("robot-x509", &Certified::new(&chain, &leaf_key))
        .await;
    let (status, body) = key(&server, "robot-x509", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["credential"], "x509");
    assert_eq!(body["jwk"]["crv"], "Ed25519");
    assert_eq!(b64url(&body["jwk"]["x"]), leaf_key.public_key_raw());

    // A P-384 leaf cannot be one of robot-agent's keys: no JWK, said plainly.
    let p384 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let chain = ca.leaf("robot-p384", &p384, 42);
    let _robot = server
        .robot_login("robot-p384", &Certified::new(&chain, &p384))
        .await;
    let (status, body) = key(&server, "robot-p384", Some(ADMIN_TOKEN)).await;
    assert_eq!((status, body["error"].as_str()), (404, Some("NOT_FOUND")));
    assert!(
        body["message"]
            .as_str()
            .expect("message")
            .contains("ecdsa-p384"),
        "{body}"
    );
}

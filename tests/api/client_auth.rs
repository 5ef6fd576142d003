//! Client login at the upgrade: opaque tokens and JWTs (HS256, ES256 via JWKS file or URL).

use crate::helpers::*;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use x509_parser::prelude::FromDer;

async fn upgrade_status(url: &str) -> u16 {
    match tokio_tungstenite::connect_async(url).await {
        Ok(_) => 101,
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let status = response.status().as_u16();
            let body: Value = serde_json::from_slice(response.body().as_deref().unwrap_or(b"{}"))
                .expect("JSON error body");
            assert!(body["error"].is_string(), "{body}");
            status
        }
        Err(e) => panic!("unexpected error {e}"),
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test]
async fn opaque_token_in_query_header_or_subprotocol() {
    let server = TestServer::start().await;
    let token = server.client_token("alice").await;
    WsClient::connect_with_token(&server.ws_url(), &token).await;

    let mut request = server.ws_url().into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Authorization", format!("Bearer {token}").parse().unwrap());
    WsClient::connect_request(request).await;

    let mut request = server.ws_url().into_client_request().unwrap();
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        format!("bearer.{token}").parse().unwrap(),
    );
    let (_, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade");
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        format!("bearer.{token}").as_str(),
        "the chosen subprotocol is echoed, as browsers require"
    );
}

#[tokio::test]
async fn bad_tokens_get_401_before_the_upgrade() {
    let server = TestServer::start_with(|c| c.jwt_secret = Some("secret".into())).await;
    let url = server.ws_url();
    assert_eq!(
        upgrade_status(&format!("{url}?token=sct_nonsense")).await,
        401
    );
    assert_eq!(upgrade_status(&format!("{url}?token=garbage")).await, 401);
    assert_eq!(upgrade_status(&format!("{url}?token=a.b.c")).await, 401);

    // Expired opaque token.
    let (status, body) = server
        .admin(
            reqwest::Method::POST,
            "/v1/tokens",
            Some(json!({"subject": "bob", "ttlSeconds": 1})),
        )
        .await;
    assert_eq!(status, 201);
    let expired = body["token"].as_str().unwrap().to_string();
    // Wind the clock forward by editing the record rather than waiting.
    expire_token(&server, body["tokenId"].as_str().unwrap()).await;
    assert_eq!(upgrade_status(&format!("{url}?token={expired}")).await, 401);
}

async fn expire_token(server: &TestServer, token_id: &str) {
    let (database_url, _) = (server.state.config.database_url().to_string(), ());
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&database_url).await.expect("db");
    sqlx::query("UPDATE client_tokens SET expires_at = 0 WHERE token_id = $1")
        .bind(token_id)
        .execute(&pool)
        .await
        .expect("update");
    pool.close().await;
}

#[tokio::test]
async fn revoking_a_token_closes_its_connections() {
    let server = TestServer::start().await;
    let (status, body) = server
        .admin(
            reqwest::Method::POST,
            "/v1/tokens",
            Some(json!({"subject": "alice"})),
        )
        .await;
    assert_eq!(status, 201);
    let mut socket =
        WsClient::connect_with_token(&server.ws_url(), body["token"].as_str().unwrap()).await;
    let (status, _) = server
        .admin(
            reqwest::Method::DELETE,
            &format!("/v1/tokens/{}", body["tokenId"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, 204);
    socket.expect_close_with(4003).await;
    assert_eq!(
        upgrade_status(&format!(
            "{}?token={}",
            server.ws_url(),
            body["token"].as_str().unwrap()
        ))
        .await,
        401
    );
}

#[tokio::test]
async fn hs256_jwt_checks_signature_expiry_issuer_and_audience() {
    let server = TestServer::start_with(|c| {
        c.jwt_secret = Some("shared-secret".into());
        c.jwt_issuer = Some("https://idp.example".into());
        c.jwt_audience = Some("robots".into());
    })
    .await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    server.grant("robot-1", "user-42", "operator").await;
    let claims = |exp: i64, iss: &str, aud: &str| json!({"sub": "user-42", "exp": exp, "iss": iss, "aud": aud});
    let sign = |claims: Value, secret: &str| {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    };
    let good = sign(
        claims(now() + 600, "https://idp.example", "robots"),
        "shared-secret",
    );
    let mut client = WsClient::connect_with_token(&server.ws_url(), &good).await;
    client
        .send(&offer("robot-1", &client.connection_id.clone()))
        .await;
    let got = robot.recv_type("signalling.offer").await;
    assert_eq!(got["meta"]["session"]["subject"], "user-42");

    let url = server.ws_url();
    let expired = sign(
        claims(now() - 3600, "https://idp.example", "robots"),
        "shared-secret",
    );
    let forged = sign(
        claims(now() + 600, "https://idp.example", "robots"),
        "guessed-secret",
    );
    let wrong_issuer = sign(
        claims(now() + 600, "https://evil.example", "robots"),
        "shared-secret",
    );
    let wrong_audience = sign(
        claims(now() + 600, "https://idp.example", "other"),
        "shared-secret",
    );
    for token in [expired, forged, wrong_issuer, wrong_audience] {
        assert_eq!(upgrade_status(&format!("{url}?token={token}")).await, 401);
    }
    // "alg: none" is never accepted.
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let body =
        URL_SAFE_NO_PAD.encode(claims(now() + 600, "https://idp.example", "robots").to_string());
    assert_eq!(
        upgrade_status(&format!("{url}?token={header}.{body}.")).await,
        401
    );
}

struct EcKey {
    pkcs8: Vec<u8>,
    jwk: Value,
}

fn ec_key(kid: &str) -> EcKey {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    EcKey {
        pkcs8: pkcs8.as_ref().to_vec(),
        jwk: json!({
            "kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "use": "sig",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        }),
    }
}

fn es256(key: &EcKey, kid: &str, sub: &str) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some(kid.into());
    encode(
        &header,
        &json!({"sub": sub, "exp": now() + 600}),
        &EncodingKey::from_ec_der(&key.pkcs8),
    )
    .unwrap()
}

#[tokio::test]
async fn es256_jwt_from_a_jwks_file() {
    let key = ec_key("k1");
    let path = std::env::temp_dir().join(format!("jwks-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&path, json!({"keys": [key.jwk]}).to_string()).unwrap();
    let jwks = path.clone();
    let server = TestServer::start_with(move |c| c.jwks_file = Some(jwks)).await;
    WsClient::connect_with_token(&server.ws_url(), &es256(&key, "k1", "carol")).await;
    let stranger = ec_key("k1");
    assert_eq!(
        upgrade_status(&format!(
            "{}?token={}",
            server.ws_url(),
            es256(&stranger, "k1", "carol")
        ))
        .await,
        401
    );
    std::fs::remove_file(path).ok();
}

#[tokio::test]
async fn es256_jwt_from_a_jwks_url_picks_up_rotated_keys() {
    let first = ec_key("k1");
    let second = ec_key("k2");
    let keys = std::sync::Arc::new(std::sync::Mutex::new(json!({"keys": [first.jwk]})));
    let served = keys.clone();
    let app = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            let served = served.clone();
            async move { axum::Json(served.lock().unwrap().clone()) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let jwks_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let server =
        TestServer::start_with(move |c| c.jwks_url = Some(format!("http://{jwks_addr}/jwks.json")))
            .await;
    WsClient::connect_with_token(&server.ws_url(), &es256(&first, "k1", "dave")).await;
    // The identity provider rotates to k2; an unknown kid triggers a refetch.
    *keys.lock().unwrap() = json!({"keys": [first.jwk, second.jwk]});
    WsClient::connect_with_token(&server.ws_url(), &es256(&second, "k2", "dave")).await;
}

#[tokio::test]
async fn jwt_without_jwt_configuration_is_refused() {
    let server = TestServer::start().await;
    let token = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "x", "exp": now() + 60}),
        &EncodingKey::from_secret(b"s"),
    )
    .unwrap();
    assert_eq!(
        upgrade_status(&format!("{}?token={token}", server.ws_url())).await,
        401
    );
}

#[tokio::test]
async fn rs256_jwt_from_a_jwks_file() {
    // ring cannot generate RSA keys; openssl (part of every Debian install) can.
    let dir = std::env::temp_dir().join(format!("rsa-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_path = dir.join("key.pem");
    let status = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&key_path)
        .status()
        .expect("openssl");
    assert!(status.success());
    let spki = std::process::Command::new("openssl")
        .args(["pkey", "-pubout", "-outform", "DER", "-in"])
        .arg(&key_path)
        .output()
        .unwrap()
        .stdout;
    let (_, info) = x509_parser::x509::SubjectPublicKeyInfo::from_der(&spki).unwrap();
    let x509_parser::public_key::PublicKey::RSA(rsa) = info.parsed().unwrap() else {
        panic!("not an RSA key")
    };
    let strip = |b: &[u8]| {
        b.iter()
            .skip_while(|&&x| x == 0)
            .copied()
            .collect::<Vec<u8>>()
    };
    let jwk = json!({
        "kty": "RSA", "kid": "rsa-1", "alg": "RS256", "use": "sig",
        "n": URL_SAFE_NO_PAD.encode(strip(rsa.modulus)),
        "e": URL_SAFE_NO_PAD.encode(strip(rsa.exponent)),
    });
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, json!({"keys": [jwk]}).to_string()).unwrap();
    let server = TestServer::start_with(move |c| c.jwks_file = Some(jwks)).await;
    let pem = std::fs::read(&key_path).unwrap();
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("rsa-1".into());
    let token = encode(
        &header,
        &json!({"sub": "erin", "exp": now() + 600}),
        &EncodingKey::from_rsa_pem(&pem).unwrap(),
    )
    .unwrap();
    WsClient::connect_with_token(&server.ws_url(), &token).await;
    // The same claims signed as HS256 with the public key as secret: algorithm confusion.
    let confused = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "erin", "exp": now() + 600}),
        &EncodingKey::from_secret(&spki),
    )
    .unwrap();
    assert_eq!(
        upgrade_status(&format!("{}?token={confused}", server.ws_url())).await,
        401
    );
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_jwt_connection_closes_when_the_jwt_expires() {
    let server = TestServer::start_with(|c| c.jwt_secret = Some("s3cret".into())).await;
    let token = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "frank", "exp": now() + 2}),
        &EncodingKey::from_secret(b"s3cret"),
    )
    .unwrap();
    let mut socket = WsClient::connect_with_token(&server.ws_url(), &token).await;
    let error = socket.expect_error("UNAUTHORIZED").await;
    assert_eq!(error["payload"]["details"]["reason"], "token_expired");
    socket.expect_close_with(1008).await;
}

//! Issue 9, identity half: superseded credentials, revoked keys through CSRs, the old-key
//! socket on re-enrollment, CRLs (issuer + serial, intermediates, persistence, staleness),
//! path validation by webpki, and JWT issuer/audience. Everything over real sockets.

use crate::fleet_ca::{name, temp_file, Ca};
use crate::helpers::*;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use rcgen::PublicKeyData;
use rcgen::{CertificateParams, KeyPair};
use serde_json::{json, Value};
use time::{Duration, OffsetDateTime};

/// A server whose own CA signs enrollment CSRs; `anchors` are extra fleet anchors.
async fn ca_server(anchors: Option<&Ca>, auto_register: bool) -> TestServer {
    let (ca_cert, ca_key) = signalling_server::pki::generate_ca("Test Enrollment CA", 30).unwrap();
    let cert_path = temp_file("ca.pem", &ca_cert);
    let key_path = temp_file("ca.key", &ca_key);
    let anchors = anchors.map(|a| temp_file("anchors.pem", &a.pem));
    TestServer::start_with(move |c| {
        c.ca_cert = Some(cert_path);
        c.ca_key = Some(key_path);
        c.trust_anchors = anchors;
        c.auto_register = auto_register;
    })
    .await
}

async fn fleet_server(root: &Ca, crl: Option<std::path::PathBuf>) -> TestServer {
    let anchors = temp_file("anchors.pem", &root.pem);
    TestServer::start_with(move |c| {
        c.trust_anchors = Some(anchors);
        c.auto_register = true;
        c.crl = crl;
    })
    .await
}

fn csr_for(robot_id: &str, key: &KeyPair) -> String {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(robot_id);
    params.serialize_request(key).unwrap().pem().unwrap()
}

fn spki_pem(key: &KeyPair) -> String {
    pem::encode(&pem::Pem::new("PUBLIC KEY", key.subject_public_key_info()))
}

async fn new_token(server: &TestServer, robot_id: &str) -> String {
    let (status, body) = server
        .admin(
            reqwest::Method::POST,
            &format!("/v1/robots/{robot_id}/enrollment-token"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body["enrollmentToken"].as_str().unwrap().to_string()
}

/// CSR enrollment; returns the issued chain.
async fn enroll_csr(server: &TestServer, robot_id: &str, token: &str, key: &KeyPair) -> String {
    let (status, body) = server
        .post(
            "/v1/enroll",
            json!({"robotId": robot_id, "enrollmentToken": token, "csr": csr_for(robot_id, key)}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    body["certificate"].as_str().unwrap().to_string()
}

async fn enroll_key(server: &TestServer, robot_id: &str, token: &str, public_key: &str) -> u16 {
    let (status, _) = server
        .post(
            "/v1/enroll",
            json!({"robotId": robot_id, "enrollmentToken": token, "publicKey": public_key}),
        )
        .await;
    status
}

/// register (with a chain, or none to use the stored credential), sign the challenge with
/// `key`; returns the socket and the server's answer (pki_verified or an error).
async fn login(
    server: &TestServer,
    robot_id: &str,
    chain: Option<&str>,
    key: &KeyPair,
) -> (WsClient, Value) {
    match chain {
        Some(chain) => {
            server
                .robot_attempt(robot_id, &Certified::new(chain, key))
                .await
        }
        None => server.robot_attempt(robot_id, key).await,
    }
}

#[track_caller]
fn assert_verified(reply: &Value) {
    assert_eq!(reply["type"], "signalling.pki_verified", "{reply}");
}

// ---------------------------------------------------------------------------------------
// Item 1: superseded credentials never log in

#[tokio::test]
async fn an_old_csr_certificate_stops_working_after_re_enrollment_and_revoke() {
    let server = ca_server(None, false).await;
    let token = server.create_robot("robot-1").await;
    let old_key = KeyPair::generate().unwrap();
    let old_chain = enroll_csr(&server, "robot-1", &token, &old_key).await;
    let (_, reply) = login(&server, "robot-1", Some(&old_chain), &old_key).await;
    assert_verified(&reply);

    // The robot re-enrolls with a new key; it is online with it.
    let new_key = KeyPair::generate().unwrap();
    let token = new_token(&server, "robot-1").await;
    let new_chain = enroll_csr(&server, "robot-1", &token, &new_key).await;
    let (mut real, reply) = login(&server, "robot-1", None, &new_key).await;
    assert_verified(&reply);
    real.recv_type("signalling.welcome").await;

    // Whoever kept the old certificate and key is refused, and the real robot stays.
    let (mut thief, reply) = login(&server, "robot-1", Some(&old_chain), &old_key).await;
    assert_refused(&reply, "credential_mismatch");
    thief.expect_close_with(1008).await;
    real.expect_nothing_pending().await;

    // Revoke and re-enroll with a bare key: neither certificate logs in any more.
    let (status, _) = server
        .admin(reqwest::Method::POST, "/v1/robots/robot-1/revoke", None)
        .await;
    assert_eq!(status, 200);
    let token = new_token(&server, "robot-1").await;
    let bare = new_ed25519();
    use ring::signature::KeyPair as _;
    let raw = STANDARD.encode(bare.public_key().as_ref());
    assert_eq!(enroll_key(&server, "robot-1", &token, &raw).await, 201);
    for (chain, key) in [(&old_chain, &old_key), (&new_chain, &new_key)] {
        let (_, reply) = login(&server, "robot-1", Some(chain), key).await;
        assert_eq!(reply["type"], "signalling.error", "{reply}");
        assert_eq!(reply["payload"]["code"], "UNAUTHORIZED", "{reply}");
    }
    let mut robot = WsClient::connect(&server.ws_url()).await;
    robot.login_as_robot("robot-1", &bare).await;
}

#[tokio::test]
async fn an_auto_registered_chain_is_recorded_and_superseded_by_enrollment() {
    let root = Ca::root("Fleet Root");
    let server = ca_server(Some(&root), true).await;
    let fleet_key = KeyPair::generate().unwrap();
    let chain = root.leaf("robot-9", &fleet_key, 9);
    let (_, reply) = login(&server, "robot-9", Some(&chain), &fleet_key).await;
    assert_verified(&reply);
    // Recorded: the robot can now log in without presenting the chain.
    let (_, reply) = login(&server, "robot-9", None, &fleet_key).await;
    assert_verified(&reply);

    // The admin moves the robot to a new key; the fleet certificate is superseded.
    let token = new_token(&server, "robot-9").await;
    let new_key = KeyPair::generate().unwrap();
    assert_eq!(
        enroll_key(&server, "robot-9", &token, &spki_pem(&new_key)).await,
        201
    );
    let (_, reply) = login(&server, "robot-9", Some(&chain), &fleet_key).await;
    assert_refused(&reply, "credential_mismatch");
    // A fleet certificate for the new key is that credential, and logs in.
    let renewed = root.leaf("robot-9", &new_key, 10);
    let (_, reply) = login(&server, "robot-9", Some(&renewed), &new_key).await;
    assert_verified(&reply);
}

// ---------------------------------------------------------------------------------------
// Item 2: a revoked key stays revoked in a CSR or a certificate

#[tokio::test]
async fn a_revoked_key_cannot_come_back_through_a_csr_or_a_fleet_certificate() {
    let root = Ca::root("Fleet Root");
    let server = ca_server(Some(&root), true).await;
    let key = KeyPair::generate().unwrap();
    let token = server.create_robot("robot-1").await;
    assert_eq!(
        enroll_key(&server, "robot-1", &token, &spki_pem(&key)).await,
        201
    );
    let (status, _) = server
        .admin(reqwest::Method::POST, "/v1/robots/robot-1/revoke", None)
        .await;
    assert_eq!(status, 200);

    let token = new_token(&server, "robot-1").await;
    assert_eq!(
        enroll_key(&server, "robot-1", &token, &spki_pem(&key)).await,
        403
    );
    let (status, body) = server
        .post(
            "/v1/enroll",
            json!({"robotId": "robot-1", "enrollmentToken": token, "csr": csr_for("robot-1", &key)}),
        )
        .await;
    assert_eq!(status, 403, "{body}");

    // The same key in a fleet certificate for another robot id is refused too.
    let chain = root.leaf("robot-2", &key, 2);
    let (_, reply) = login(&server, "robot-2", Some(&chain), &key).await;
    assert_refused(&reply, "revoked");
}

#[tokio::test]
async fn revoking_a_key_closes_every_socket_that_proved_it() {
    let root = Ca::root("Fleet Root");
    let server = ca_server(Some(&root), true).await;
    let key = KeyPair::generate().unwrap();
    let token = server.create_robot("robot-1").await;
    assert_eq!(
        enroll_key(&server, "robot-1", &token, &spki_pem(&key)).await,
        201
    );
    // The same key, certified by the fleet CA for another robot id, is online.
    let chain = root.leaf("robot-2", &key, 2);
    let (mut other, reply) = login(&server, "robot-2", Some(&chain), &key).await;
    assert_verified(&reply);
    other.recv_type("signalling.welcome").await;
    let (status, _) = server
        .admin(reqwest::Method::POST, "/v1/robots/robot-1/revoke", None)
        .await;
    assert_eq!(status, 200);
    let error = other.expect_error("UNAUTHORIZED").await;
    assert_eq!(error["payload"]["details"]["reason"], "revoked");
    other.expect_close_with(4003).await;
}

// ---------------------------------------------------------------------------------------
// Item 3: re-enrollment closes the old-key socket at once

#[tokio::test]
async fn a_robot_re_enrolled_while_it_signs_cannot_log_in_with_the_old_key() {
    let server = TestServer::start().await;
    let old_key = server.enrolled_robot("robot-1").await;
    let mut robot = WsClient::connect(&server.ws_url()).await;
    let challenge = robot.register("robot-1").await;
    // Re-enrolled between the challenge and its answer: no socket proved the old key yet,
    // so only the login's own check can refuse it.
    let token = new_token(&server, "robot-1").await;
    let new_key = new_ed25519();
    use ring::signature::KeyPair as _;
    let raw = STANDARD.encode(new_key.public_key().as_ref());
    assert_eq!(enroll_key(&server, "robot-1", &token, &raw).await, 201);
    robot.send(&signed_response(&challenge, &old_key)).await;
    assert_refused(&robot.recv().await, "credential_mismatch");
    robot.expect_close_with(1008).await;
    let (_, reply) = server.robot_attempt("robot-1", &new_key).await;
    assert_verified(&reply);
}

#[tokio::test]
async fn a_robot_revoked_or_deleted_while_it_signs_is_refused() {
    let server = TestServer::start().await;
    for (robot_id, cut, reason) in [
        ("robot-1", "/revoke", "revoked"),
        ("robot-2", "", "unknown_robot"),
    ] {
        let key = server.enrolled_robot(robot_id).await;
        let mut robot = WsClient::connect(&server.ws_url()).await;
        let challenge = robot.register(robot_id).await;
        let method = if cut.is_empty() {
            reqwest::Method::DELETE
        } else {
            reqwest::Method::POST
        };
        let (status, body) = server
            .admin(method, &format!("/v1/robots/{robot_id}{cut}"), None)
            .await;
        assert!(status == 200 || status == 204, "{status} {body}");
        robot.send(&signed_response(&challenge, &key)).await;
        assert_refused(&robot.recv().await, reason);
        robot.expect_close_with(1008).await;
    }
}

#[tokio::test]
async fn a_login_that_a_cut_overlapped_checks_again_and_still_stands() {
    let server = TestServer::start().await;
    let key = server.enrolled_robot("robot-1").await;
    let (mut other, _) = server.online_robot("robot-2").await;
    let mut robot = WsClient::connect(&server.ws_url()).await;
    let challenge = robot.register("robot-1").await;
    // Another robot is revoked while robot-1 signs: robot-1's login cannot know the cut
    // was not about it, so it checks again once registered, and stands.
    let (status, _) = server
        .admin(reqwest::Method::POST, "/v1/robots/robot-2/revoke", None)
        .await;
    assert_eq!(status, 200);
    other.expect_error("UNAUTHORIZED").await;
    robot.send(&signed_response(&challenge, &key)).await;
    assert_verified(&robot.recv().await);
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("signalling_access_rechecks_total{kind=\"robot\",outcome=\"stands\"} 1"),
        "{metrics}"
    );
    // Nothing overlapped this one: no re-check.
    let again = server.robot_login("robot-1", &key).await;
    drop(again);
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("signalling_access_rechecks_total{kind=\"robot\",outcome=\"stands\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_bare_key_revoked_for_another_robot_does_not_log_in() {
    let server = TestServer::start().await;
    let key = KeyPair::generate().unwrap();
    for robot_id in ["robot-1", "robot-2"] {
        let token = server.create_robot(robot_id).await;
        assert_eq!(
            enroll_key(&server, robot_id, &token, &spki_pem(&key)).await,
            201
        );
    }
    let (status, _) = server
        .admin(reqwest::Method::POST, "/v1/robots/robot-1/revoke", None)
        .await;
    assert_eq!(status, 200);
    // robot-2 is not marked revoked, but the key it would prove is on the list.
    let (mut robot, reply) = login(&server, "robot-2", None, &key).await;
    assert_refused(&reply, "revoked");
    robot.expect_close_with(1008).await;
}

#[tokio::test]
async fn re_enrollment_closes_the_old_key_socket_at_once() {
    let server = TestServer::start().await;
    let (mut robot, _old_key) = server.online_robot("robot-1").await;
    let token = new_token(&server, "robot-1").await;
    let new_key = new_ed25519();
    use ring::signature::KeyPair as _;
    let raw = STANDARD.encode(new_key.public_key().as_ref());
    assert_eq!(enroll_key(&server, "robot-1", &token, &raw).await, 201);
    robot.expect_error("UNAUTHORIZED").await;
    robot.expect_close_with(4003).await;
    let mut again = WsClient::connect(&server.ws_url()).await;
    again.login_as_robot("robot-1", &new_key).await;
}

// ---------------------------------------------------------------------------------------
// Item 4: CRLs

#[tokio::test]
async fn crl_entries_name_issuer_and_serial() {
    let root = Ca::root("Fleet Root");
    let factory = root.intermediate("Factory 7");
    // The root revokes its serial 7; the factory's serial 7 is another certificate.
    let crl = temp_file("root.crl", &root.crl(&[7]));
    let server = fleet_server(&root, Some(crl)).await;
    let key = KeyPair::generate().unwrap();
    let from_root = root.leaf("robot-1", &key, 7);
    let (_, reply) = login(&server, "robot-1", Some(&from_root), &key).await;
    assert_refused(&reply, "revoked");
    let other = KeyPair::generate().unwrap();
    let from_factory = format!("{}{}", factory.leaf("robot-2", &other, 7), factory.pem);
    let (_, reply) = login(&server, "robot-2", Some(&from_factory), &other).await;
    assert_verified(&reply);
}

#[tokio::test]
async fn a_crl_signed_by_an_intermediate_is_accepted_and_enforced() {
    let root = Ca::root("Fleet Root");
    let factory = root.intermediate("Factory 7");
    // The factory CA publishes its own CRL; the file carries its certificate.
    let crl = temp_file(
        "factory.crl",
        &format!("{}{}", factory.crl(&[5]), factory.pem),
    );
    let server = fleet_server(&root, Some(crl)).await;
    let key = KeyPair::generate().unwrap();
    let listed = format!("{}{}", factory.leaf("robot-5", &key, 5), factory.pem);
    let (_, reply) = login(&server, "robot-5", Some(&listed), &key).await;
    assert_refused(&reply, "revoked");
    let fine = format!("{}{}", factory.leaf("robot-6", &key, 6), factory.pem);
    let (_, reply) = login(&server, "robot-6", Some(&fine), &key).await;
    assert_verified(&reply);
}

#[tokio::test]
async fn a_newer_crl_that_drops_an_entry_does_not_unrevoke() {
    let root = Ca::root("Fleet Root");
    let crl_path = temp_file("fleet.crl", &root.crl(&[1]));
    let server = fleet_server(&root, Some(crl_path.clone())).await;
    let key1 = KeyPair::generate().unwrap();
    let listed = root.leaf("robot-1", &key1, 1);
    let (_, reply) = login(&server, "robot-1", Some(&listed), &key1).await;
    assert_refused(&reply, "revoked");

    let key2 = KeyPair::generate().unwrap();
    let second = root.leaf("robot-2", &key2, 2);
    let (mut robot2, reply) = login(&server, "robot-2", Some(&second), &key2).await;
    assert_verified(&reply);
    robot2.recv_type("signalling.welcome").await;
    // The next CRL lists serial 2 and (by mistake or malice) no longer lists serial 1.
    let next = temp_file(
        "next.crl",
        &root.crl_at(&[2], Duration::seconds(0), Duration::days(1)),
    );
    std::fs::rename(&next, &crl_path).unwrap();
    // Robot 2 being cut off shows the new file is in force.
    robot2.expect_error("UNAUTHORIZED").await;
    robot2.expect_close_with(4003).await;
    let (_, reply) = login(&server, "robot-1", Some(&listed), &key1).await;
    assert_refused(&reply, "revoked");
    std::fs::remove_file(crl_path).ok();
}

#[tokio::test]
async fn a_stale_crl_is_reported_and_still_enforced() {
    let root = Ca::root("Fleet Root");
    // Issued two days ago, next update was due yesterday.
    let crl = temp_file(
        "stale.crl",
        &root.crl_at(&[3], Duration::days(2), Duration::days(1)),
    );
    let server = fleet_server(&root, Some(crl)).await;
    let response = server.http.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let ready: Value = response.json().await.unwrap();
    assert_eq!(ready["crl"]["status"], "stale", "{ready}");
    assert_eq!(
        ready["crl"]["lists"][0]["issuer"], "CN=Fleet Root",
        "{ready}"
    );
    let metrics = server.metrics().await;
    assert!(metrics.contains("signalling_crl_stale 1"), "{metrics}");
    let key = KeyPair::generate().unwrap();
    let listed = root.leaf("robot-3", &key, 3);
    let (_, reply) = login(&server, "robot-3", Some(&listed), &key).await;
    assert_refused(&reply, "revoked");
}

#[tokio::test]
async fn a_crl_dated_in_the_future_stops_the_server_from_starting() {
    let root = Ca::root("Fleet Root");
    let future = root.crl_at(&[1], Duration::days(-1), Duration::days(2));
    let (database_url, _) = test_database().await;
    let mut config =
        signalling_server::Config::from_args(["s", "--listen", "127.0.0.1:0"]).unwrap();
    config.database_url = Some(database_url);
    config.trust_anchors = Some(temp_file("anchors.pem", &root.pem));
    config.crl = Some(temp_file("future.crl", &future));
    let error = signalling_server::Server::bind(config)
        .await
        .err()
        .expect("refused");
    assert!(error.to_string().contains("future.crl"), "{error}");
}

// ---------------------------------------------------------------------------------------
// Item 5: path validation by webpki

#[tokio::test]
async fn intermediates_may_come_in_any_order() {
    let root = Ca::root("Fleet Root");
    let region = root.intermediate("Region EU");
    let factory = region.intermediate("Factory 7");
    let server = fleet_server(&root, None).await;
    let key = KeyPair::generate().unwrap();
    // Leaf first, then the intermediates root-side first: a valid set, unusual order.
    let chain = format!(
        "{}{}{}",
        factory.leaf("robot-1", &key, 1),
        region.pem,
        factory.pem
    );
    let (_, reply) = login(&server, "robot-1", Some(&chain), &key).await;
    assert_verified(&reply);
}

// ---------------------------------------------------------------------------------------
// Item 10: JWT issuer and audience are required when configured

#[tokio::test]
async fn a_jwt_without_iss_or_aud_is_refused_when_they_are_configured() {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    let server = TestServer::start_with(|c| {
        c.jwt_secret = Some("shared-secret".into());
        c.jwt_issuer = Some("https://idp.example".into());
        c.jwt_audience = Some("robots".into());
    })
    .await;
    let exp = OffsetDateTime::now_utc().unix_timestamp() + 600;
    let sign = |claims: Value| {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(b"shared-secret"),
        )
        .unwrap()
    };
    let status = |token: String| {
        let url = format!("{}?token={token}", server.ws_url());
        async move {
            match tokio_tungstenite::connect_async(url).await {
                Ok(_) => 101,
                Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
                Err(e) => panic!("unexpected error {e}"),
            }
        }
    };
    let both = sign(json!({"sub": "u", "exp": exp, "iss": "https://idp.example", "aud": "robots"}));
    assert_eq!(status(both).await, 101);
    let no_iss = sign(json!({"sub": "u", "exp": exp, "aud": "robots"}));
    assert_eq!(status(no_iss).await, 401);
    let no_aud = sign(json!({"sub": "u", "exp": exp, "iss": "https://idp.example"}));
    assert_eq!(status(no_aud).await, 401);
}

//! The ARP conformance runner through the server's gateway, end to end: the real server on
//! 127.0.0.1:0 (SQLite), the real robot-agent (sim driver) enrolled and connected to it,
//! and the runner on `/v1/robots/{id}/arp` with an operator's and a viewer's client tokens.
//! The same checks as against the robot's own ARP endpoint, every frame validated.

use std::time::Duration;

use agent_server_tests::arp_runner as runner;
use agent_server_tests::server::{self, Running};
use serde_json::{json, Value};

const ADMIN: &str = "gateway-conformance-admin";
const ROBOT: &str = "robot-arp-1";

/// The server with the agent enrolled (pinning the server's signing key), online, and
/// client tokens of an operator and a viewer holding grants on it.
async fn robot_online(sign_replies: bool) -> (Running, Vec<String>, tokio::task::AbortHandle) {
    let running = server::start(ADMIN, |_, _| {}).await;
    let (config_dir, enrolled) = running.enroll(ROBOT).await;
    // The agent pinned the server's signing key, so it requires a good session ticket on
    // every frame: the whole run below goes through the robot's ticket checks.
    assert_eq!(enrolled.server_keys.len(), 1, "{enrolled:?}");
    let tokens = vec![
        running
            .client_token(ROBOT, "program-operator", "operator")
            .await,
        running
            .client_token(ROBOT, "program-viewer", "viewer")
            .await,
    ];
    let agent = running.agent(ROBOT, config_dir, |c| c.sign_replies = sign_replies);
    running.wait_online(ROBOT).await;
    (running, tokens, agent.abort_handle())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_passes_the_arp_conformance_run_end_to_end() {
    let (running, tokens, agent) = robot_online(false).await;
    let url = running.base.replace("http://", "ws://") + &format!("/v1/robots/{ROBOT}/arp");
    let report = runner::run(&runner::Options {
        url,
        operator_token: Some(tokens[0].clone()),
        viewer_token: Some(tokens[1].clone()),
        motion: true,
        estop: true,
    })
    .await;
    report.assert_passed();
    // Every tool call is on record.
    let audit = running
        .admin(
            reqwest::Method::GET,
            &format!("/v1/robots/{ROBOT}/audit?limit=1000"),
            None,
        )
        .await;
    let calls = audit["records"].as_array().map(Vec::len).unwrap_or(0);
    assert!(calls > 0, "no audit records: {audit}");
    // The agent answered each session's key exchange: after its first frame, the run's
    // tickets were MAC'd with the session key (and checked as such by the agent).
    let metrics = running.metrics().await;
    let keyed = metrics
        .lines()
        .find_map(|l| l.strip_prefix("signalling_ticket_session_keys_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        keyed >= 1.0,
        "no ARP session agreed a ticket key:\n{metrics}"
    );
    agent.abort();
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A program on the gateway, with `query` appended to its URL.
async fn program(running: &Running, token: &str, query: &str) -> Ws {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = running.base.replace("http://", "ws://") + &format!("/v1/robots/{ROBOT}/arp{query}");
    let mut request = url.into_client_request().expect("request");
    let bearer = format!("Bearer {token}").parse().expect("header");
    request.headers_mut().insert("authorization", bearer);
    let connected = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async(request),
    );
    connected.await.expect("in time").expect("upgraded").0
}

/// Sends a request and returns its answer (other frames are skipped), checked against the
/// ARP schema without its `signature`.
async fn ask(ws: &mut Ws, id: u64, method: &str, params: Value) -> Value {
    use futures_util::{SinkExt, StreamExt};
    use signalling_protocol::arp_schema::ArpValidator;
    use tokio_tungstenite::tungstenite::Message;
    let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.send(Message::text(request.to_string()))
        .await
        .expect("send");
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("an answer in time")
            .expect("open")
            .expect("frame");
        let Message::Text(text) = message else {
            continue;
        };
        let frame: Value = serde_json::from_str(&text).expect("JSON");
        if frame["id"] != json!(id) || frame.get("method").is_some() {
            continue;
        }
        let mut bare = frame.clone();
        bare.as_object_mut().expect("object").remove("signature");
        ArpValidator::shared()
            .validate(&bare, Some(method))
            .unwrap_or_else(|e| panic!("not ARP: {e}: {frame}"));
        return frame;
    }
}

async fn a_bad_nonce_is_refused_before_the_upgrade(running: &Running, operator: &str) {
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Error};
    let url =
        running.base.replace("http://", "ws://") + &format!("/v1/robots/{ROBOT}/arp?signed=short");
    let mut request = url.into_client_request().expect("request");
    let bearer = format!("Bearer {operator}").parse().expect("header");
    request.headers_mut().insert("authorization", bearer);
    match tokio_tungstenite::connect_async(request).await {
        Err(Error::Http(response)) => {
            assert_eq!(response.status(), 400);
            let body: Value =
                serde_json::from_slice(response.body().as_deref().unwrap_or_default())
                    .expect("a JSON error");
            assert_eq!(body["error"], "BAD_REQUEST", "{body}");
        }
        other => panic!("upgraded with a bad nonce: {:?}", other.map(|_| ())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_asks_gets_frames_the_robot_signed_for_its_connection() {
    use robot_agent::reply_signing::{verify_arp_frame, ReplySigningError};
    let (running, tokens, agent) = robot_online(true).await;
    let (operator, viewer) = (&tokens[0], &tokens[1]);
    // The key the robot enrolled, as any grant holder may read it.
    let jwk = running
        .http
        .get(format!("{}/v1/robots/{ROBOT}/key", running.base))
        .bearer_auth(viewer)
        .send()
        .await
        .expect("HTTP")
        .json::<Value>()
        .await
        .expect("JSON")["jwk"]
        .clone();
    assert_eq!(jwk["crv"], "Ed25519", "{jwk}");
    let initialize = json!({"protocolVersion": "0.1.0",
        "clientInfo": {"name": "signed-frames-test", "version": "1"}});

    // A nonce that is not one is refused before the upgrade, with a JSON error.
    a_bad_nonce_is_refused_before_the_upgrade(&running, operator).await;

    const NONCE: &str = "program-nonce_0123456789";
    let mut signed = program(&running, operator, &format!("?signed={NONCE}")).await;
    let mut answers = vec![
        ask(&mut signed, 1, "arp.initialize", initialize.clone()).await,
        ask(&mut signed, 2, "arp.listTools", json!({})).await,
        ask(&mut signed, 3, "arp.listContext", json!({})).await,
        // The robot's own refusal (no such tool) is signed too.
        ask(
            &mut signed,
            4,
            "arp.callTool",
            json!({"name": "no_such_tool", "arguments": {}}),
        )
        .await,
    ];
    assert!(answers[3].get("error").is_some(), "{}", answers[3]);
    for answer in &answers {
        let header =
            verify_arp_frame(answer, &jwk, NONCE).unwrap_or_else(|e| panic!("{e}: {answer}"));
        assert_eq!(header.kid, ROBOT);
        assert_eq!(header.alg, "EdDSA");
    }
    // Bound to this connection: checked against another nonce, or changed, it fails.
    assert!(matches!(
        verify_arp_frame(&answers[1], &jwk, "another-connections-nonce"),
        Err(ReplySigningError::Nonce)
    ));
    answers[1]["result"]["tools"] = json!([]);
    assert!(matches!(
        verify_arp_frame(&answers[1], &jwk, NONCE),
        Err(ReplySigningError::BadSignature)
    ));

    // A viewer that did not ask gets ARP frames exactly as the spec has them, unsigned; the
    // gateway's own refusals carry no signature either way.
    let mut plain = program(&running, viewer, "").await;
    let answer = ask(&mut plain, 1, "arp.initialize", initialize.clone()).await;
    assert!(answer.get("result").is_some(), "{answer}");
    assert!(answer.get("signature").is_none(), "{answer}");
    let forbidden = ask(
        &mut plain,
        2,
        "arp.callTool",
        json!({"name": "stop", "arguments": {}}),
    )
    .await;
    assert_eq!(
        forbidden["error"]["data"]["reason"], "forbidden",
        "{forbidden}"
    );
    assert!(forbidden.get("signature").is_none(), "{forbidden}");
    agent.abort();
}

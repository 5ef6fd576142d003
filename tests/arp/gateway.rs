//! The ARP conformance runner through the server's gateway, end to end: the real server on
//! 127.0.0.1:0 (SQLite), the real robot-agent (sim driver) enrolled and connected to it,
//! and the runner on `/v1/robots/{id}/arp` with an operator's and a viewer's client tokens.
//! The same checks as against the robot's own ARP endpoint, every frame validated.

#[path = "runner.rs"]
mod runner;

use std::time::Duration;

use robot_agent::config::{RunConfig, RunFlags};
use robot_agent::enroll::{enroll, EnrollRequest};
use robot_agent::identity::KeyType;
use serde_json::{json, Value};
use signalling_server::{Config, Server};

const ADMIN: &str = "gateway-conformance-admin";
const ROBOT: &str = "robot-arp-1";

struct Running {
    base: String,
    http: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: TempDir,
}

/// A folder removed when the test ends.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Running {
    async fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(ADMIN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("HTTP");
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        response.json().await.unwrap_or(Value::Null)
    }
}

async fn server() -> Running {
    let dir = std::env::temp_dir().join(format!("arp-gateway-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut config = Config::from_args([
        "signalling-server",
        "--listen",
        "127.0.0.1:0",
        "--admin-token",
        ADMIN,
    ])
    .expect("config");
    config.database_url = Some(format!("sqlite://{}/db.sqlite", dir.display()));
    config.redis_url = None;
    let server = Server::bind(config).await.expect("server starts");
    let addr = server.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = server
            .run(async move {
                let _ = stopped.await;
            })
            .await;
    });
    Running {
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        stop: Some(stop),
        _dir: TempDir(dir),
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The server with the agent enrolled (pinning the server's signing key), online, and
/// client tokens of an operator and a viewer holding grants on it.
async fn robot_online(sign_replies: bool) -> (Running, Vec<String>, tokio::task::AbortHandle) {
    let running = server().await;
    let created = running
        .admin(
            reqwest::Method::POST,
            "/v1/robots",
            Some(json!({ "robotId": ROBOT })),
        )
        .await;
    let token = created["enrollmentToken"]
        .as_str()
        .expect("enrollment token");
    let config_dir = running._dir.0.join("agent");
    let enrolled = enroll(&EnrollRequest {
        server: running.base.clone(),
        robot_id: ROBOT.into(),
        token: token.into(),
        key_type: KeyType::Ed25519,
        csr: false,
        config_dir: config_dir.clone(),
        ca_file: None,
    })
    .await
    .expect("the agent enrolls");
    // The agent pinned the server's signing key, so it requires a good session ticket on
    // every frame: the whole run below goes through the robot's ticket checks.
    assert_eq!(enrolled.server_keys.len(), 1, "{enrolled:?}");
    let mut tokens = Vec::new();
    for (subject, role) in [
        ("program-operator", "operator"),
        ("program-viewer", "viewer"),
    ] {
        running
            .admin(
                reqwest::Method::PUT,
                &format!("/v1/robots/{ROBOT}/grants/{subject}"),
                Some(json!({ "role": role })),
            )
            .await;
        let made = running
            .admin(
                reqwest::Method::POST,
                "/v1/tokens",
                Some(json!({ "subject": subject })),
            )
            .await;
        tokens.push(made["token"].as_str().expect("token").to_string());
    }
    let mut agent_config = RunConfig::resolve(RunFlags {
        config_dir: Some(config_dir),
        server: Some(running.base.replace("http://", "ws://") + "/ws"),
        robot_id: Some(ROBOT.into()),
        driver: Some("sim".into()),
        ..RunFlags::default()
    })
    .expect("agent config");
    agent_config.sign_replies = sign_replies;
    let agent = tokio::spawn(robot_agent::agent::run(agent_config));
    // Online: the server says so once the agent proved its key.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let robot = running
            .admin(reqwest::Method::GET, &format!("/v1/robots/{ROBOT}"), None)
            .await;
        if robot["online"] == true {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent never came online: {robot}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    for check in &report.checks {
        println!(
            "{:5} {}",
            if check.outcome.is_ok() { "ok" } else { "FAIL" },
            check.name
        );
    }
    let failures = report.failures();
    assert!(failures.is_empty(), "failed checks: {failures:#?}");
    assert!(report.checks.len() >= 14, "{} checks", report.checks.len());
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
    let metrics = running
        .http
        .get(format!("{}/metrics", running.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("HTTP")
        .text()
        .await
        .expect("text");
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
    {
        use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Error};
        let url = running.base.replace("http://", "ws://")
            + &format!("/v1/robots/{ROBOT}/arp?signed=short");
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

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_passes_the_arp_conformance_run_end_to_end() {
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
    let agent_config = RunConfig::resolve(RunFlags {
        config_dir: Some(config_dir),
        server: Some(running.base.replace("http://", "ws://") + "/ws"),
        robot_id: Some(ROBOT.into()),
        driver: Some("sim".into()),
        ..RunFlags::default()
    })
    .expect("agent config");
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
    agent.abort();
}

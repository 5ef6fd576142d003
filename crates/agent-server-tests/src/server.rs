//! The real signalling server on 127.0.0.1:0 (SQLite in a folder of its own unless the
//! test says otherwise), its admin API, and the real robot-agent (sim driver) enrolled
//! with it and connected.

use std::path::{Path, PathBuf};
use std::time::Duration;

use robot_agent::config::{RunConfig, RunFlags};
use robot_agent::enroll::{enroll, EnrollOutcome, EnrollRequest};
use robot_agent::identity::KeyType;
use serde_json::{json, Value};
use signalling_server::{Config, Server};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The longest a robot may take to come online.
const ONLINE_WAIT: Duration = Duration::from_secs(20);

/// A running server; stopped, and its folder removed, when dropped.
pub struct Running {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    pub http: reqwest::Client,
    admin: String,
    dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh folder under the system temp dir, named after `tag`.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{tag}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Starts the server with `admin` as its admin token, SQLite in a fresh folder, no Redis;
/// `adjust` changes the configuration before it binds (it is given that folder).
pub async fn start(admin: &str, adjust: impl FnOnce(&mut Config, &Path)) -> Running {
    let dir = temp_dir("agent-server-tests");
    let mut config = Config::from_args([
        "signalling-server",
        "--listen",
        "127.0.0.1:0",
        "--admin-token",
        admin,
    ])
    .expect("config");
    config.database_url = Some(format!("sqlite://{}/db.sqlite", dir.display()));
    config.redis_url = None;
    adjust(&mut config, &dir);
    let server = Server::bind(config).await.expect("server starts");
    let addr = server.local_addr().expect("address");
    let (stop, stopped) = oneshot::channel::<()>();
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
        admin: admin.to_owned(),
        dir,
        stop: Some(stop),
    }
}

impl Running {
    /// The signalling socket's URL.
    pub fn ws_url(&self) -> String {
        self.base.replace("http://", "ws://") + "/ws"
    }

    /// The folder the test may keep files in (removed with the server).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// An admin API call that must succeed; its JSON answer (null when it has none).
    pub async fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.admin);
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

    /// The server's Prometheus text.
    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .bearer_auth(&self.admin)
            .send()
            .await
            .expect("HTTP")
            .text()
            .await
            .expect("text")
    }

    /// Creates `robot` and enrolls robot-agent for it (an Ed25519 key) in a folder of
    /// the server's; returns that folder and what enrollment did.
    pub async fn enroll(&self, robot: &str) -> (PathBuf, EnrollOutcome) {
        let created = self
            .admin(
                reqwest::Method::POST,
                "/v1/robots",
                Some(json!({ "robotId": robot })),
            )
            .await;
        let token = created["enrollmentToken"]
            .as_str()
            .expect("enrollment token");
        let config_dir = self.dir.join(format!("agent-{robot}"));
        let enrolled = enroll(&EnrollRequest {
            server: self.base.clone(),
            robot_id: robot.into(),
            token: token.into(),
            key_type: KeyType::Ed25519,
            csr: false,
            config_dir: config_dir.clone(),
            ca_file: None,
        })
        .await
        .expect("the agent enrolls");
        (config_dir, enrolled)
    }

    /// A client token of `subject`, granted `role` on `robot`.
    pub async fn client_token(&self, robot: &str, subject: &str, role: &str) -> String {
        self.admin(
            reqwest::Method::PUT,
            &format!("/v1/robots/{robot}/grants/{subject}"),
            Some(json!({ "role": role })),
        )
        .await;
        let made = self
            .admin(
                reqwest::Method::POST,
                "/v1/tokens",
                Some(json!({ "subject": subject })),
            )
            .await;
        made["token"].as_str().expect("token").to_string()
    }

    /// Runs robot-agent (sim driver) as `robot` from its enrolled `config_dir`;
    /// `adjust` changes its configuration first.
    pub fn agent(
        &self,
        robot: &str,
        config_dir: PathBuf,
        adjust: impl FnOnce(&mut RunConfig),
    ) -> JoinHandle<()> {
        let mut config = RunConfig::resolve(RunFlags {
            config_dir: Some(config_dir),
            server: Some(self.ws_url()),
            robot_id: Some(robot.into()),
            driver: Some("sim".into()),
            ..RunFlags::default()
        })
        .expect("agent config");
        adjust(&mut config);
        tokio::spawn(async move {
            if let Err(e) = robot_agent::agent::run(config).await {
                eprintln!("robot-agent stopped: {e}");
            }
        })
    }

    /// Waits (bounded) until the server says `robot` is online.
    pub async fn wait_online(&self, robot: &str) {
        let deadline = tokio::time::Instant::now() + ONLINE_WAIT;
        loop {
            let state = self
                .admin(reqwest::Method::GET, &format!("/v1/robots/{robot}"), None)
                .await;
            if state["online"] == true {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the agent never came online: {state}"
            );
            // Polling the admin API: the server has no "robot online" event to wait on.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

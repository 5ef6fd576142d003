//! Test harness: a real server on 127.0.0.1:0 with its own database, real WebSocket
//! clients, and schema validation of every message the server sends.
// Some helpers serve only some modules, and the shim in tests/common/ uses the harness alone.
#![allow(dead_code)]

use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use serde_json::{json, Value};
use signalling_protocol::arp_schema::ArpValidator;
use signalling_protocol::schema::SchemaValidator;
use signalling_server::{Config, Server};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Upper bound for any single wait in a test; never a synchronisation sleep.
pub const WAIT: Duration = Duration::from_secs(10);

pub const ADMIN_TOKEN: &str = "test-admin-token";

pub struct TestServer {
    pub addr: std::net::SocketAddr,
    pub state: signalling_server::state::SharedState,
    pub http: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    sqlite_file: Option<std::path::PathBuf>,
}

/// `TEST_LOG=1` shows the server's logs (filtered by RUST_LOG, default info) through the
/// test writer, so each test's lines appear with its result; silent otherwise.
pub fn init_tracing() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let wanted = std::env::var("TEST_LOG").is_ok_and(|v| !v.is_empty() && v != "0");
        if wanted {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_test_writer()
                .init();
        }
    });
}

/// A database of its own for each test: a SQLite file, or a fresh PostgreSQL schema when
/// DATABASE_URL points at PostgreSQL.
pub async fn test_database() -> (String, Option<std::path::PathBuf>) {
    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => {
            let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .expect("PostgreSQL from DATABASE_URL");
            sqlx::query(&format!("CREATE SCHEMA {schema}"))
                .execute(&pool)
                .await
                .expect("create schema");
            pool.close().await;
            let sep = if url.contains('?') { '&' } else { '?' };
            (format!("{url}{sep}options=-csearch_path%3D{schema}"), None)
        }
        _ => {
            let path =
                std::env::temp_dir().join(format!("signalling-test-{}.db", uuid::Uuid::new_v4()));
            (format!("sqlite://{}", path.display()), Some(path))
        }
    }
}

/// Whether DATABASE_URL points at PostgreSQL, for the tests that need it (CI's `postgres`
/// step runs them); says why a test is skipped otherwise.
pub fn on_postgres() -> bool {
    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => true,
        Ok(_) => {
            eprintln!("skipped: DATABASE_URL is not PostgreSQL");
            false
        }
        Err(_) => {
            eprintln!("skipped: DATABASE_URL (PostgreSQL) is not set");
            false
        }
    }
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> TestServer {
        init_tracing();
        let (database_url, sqlite_file) = test_database().await;
        let mut config = Config::from_args([
            "signalling-server",
            "--listen",
            "127.0.0.1:0",
            "--admin-token",
            ADMIN_TOKEN,
        ])
        .expect("config");
        config.database_url = Some(database_url);
        config.redis_url = None;
        adjust(&mut config);
        let server = Server::bind(config).await.expect("server starts");
        let addr = server.local_addr().expect("address");
        let state = server.state();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .run(async move {
                    let _ = stopped.await;
                })
                .await
                .expect("server runs");
        });
        TestServer {
            addr,
            state,
            http: reqwest::Client::new(),
            stop: Some(stop),
            task: Some(task),
            sqlite_file,
        }
    }

    /// Graceful shutdown, as on SIGTERM; waits for it to finish. The database is kept for
    /// inspection: a SQLite file's path is returned for the caller to remove.
    pub async fn shutdown(mut self) -> Option<std::path::PathBuf> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task)
                .await
                .expect("shutdown finishes")
                .expect("server task");
        }
        self.sqlite_file.take()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, self.url(path))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("HTTP request");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON body, got {text:?}"))
        };
        (status, value)
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("HTTP request");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Creates a robot record; returns its enrollment token.
    pub async fn create_robot(&self, robot_id: &str) -> String {
        let (status, body) = self
            .admin(
                reqwest::Method::POST,
                "/v1/robots",
                Some(json!({ "robotId": robot_id })),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body["enrollmentToken"].as_str().expect("token").to_string()
    }

    /// Creates and enrolls a robot with a fresh Ed25519 key.
    pub async fn enrolled_robot(&self, robot_id: &str) -> Ed25519KeyPair {
        let token = self.create_robot(robot_id).await;
        let key = new_ed25519();
        let (status, body) = self
            .post(
                "/v1/enroll",
                json!({
                    "robotId": robot_id,
                    "enrollmentToken": token,
                    "publicKey": STANDARD.encode(key.public_key().as_ref()),
                }),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        key
    }

    pub async fn client_token(&self, subject: &str) -> String {
        let (status, body) = self
            .admin(
                reqwest::Method::POST,
                "/v1/tokens",
                Some(json!({ "subject": subject })),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body["token"].as_str().expect("token").to_string()
    }

    pub async fn grant(&self, robot_id: &str, subject: &str, role: &str) {
        let (status, body) = self
            .admin(
                reqwest::Method::PUT,
                &format!("/v1/robots/{robot_id}/grants/{subject}"),
                Some(json!({ "role": role })),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    /// A robot connected, registered and verified.
    pub async fn online_robot(&self, robot_id: &str) -> (WsClient, Ed25519KeyPair) {
        let key = self.enrolled_robot(robot_id).await;
        (self.robot_login(robot_id, &key).await, key)
    }

    /// A fresh socket logged in as `robot_id` with `signer`.
    pub async fn robot_login(&self, robot_id: &str, signer: &dyn Signer) -> WsClient {
        let mut robot = WsClient::connect(&self.ws_url()).await;
        robot.prove(robot_id, signer).await;
        robot
    }

    /// A fresh socket that tries to log in as `robot_id`; returns it with the verdict.
    pub async fn robot_attempt(&self, robot_id: &str, signer: &dyn Signer) -> (WsClient, Value) {
        let mut robot = WsClient::connect(&self.ws_url()).await;
        let verdict = robot.try_prove(robot_id, signer).await;
        (robot, verdict)
    }

    /// A client with a token for `subject` and a grant of `role` on `robot_id`.
    pub async fn client_for(&self, robot_id: &str, subject: &str, role: &str) -> WsClient {
        self.grant(robot_id, subject, role).await;
        let token = self.client_token(subject).await;
        WsClient::connect_with_token(&self.ws_url(), &token).await
    }

    /// A client for `subject` with `role` on `robot_id`, in a session with the online
    /// `robot` under its own connection id (the offer delivered); returns it and the id.
    pub async fn open_session(
        &self,
        robot: &mut WsClient,
        robot_id: &str,
        subject: &str,
        role: &str,
    ) -> (WsClient, String) {
        let mut client = self.client_for(robot_id, subject, role).await;
        let session = client.connection_id.clone();
        client.send(&offer(robot_id, &session)).await;
        robot.recv_type("signalling.offer").await;
        (client, session)
    }

    pub async fn metrics(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics body")
    }

    pub async fn sessions(&self, query: &str) -> Vec<Value> {
        let (status, body) = self
            .admin(reqwest::Method::GET, &format!("/v1/sessions{query}"), None)
            .await;
        assert_eq!(status, 200, "{body}");
        body.as_array().expect("array").clone()
    }

    /// The record of session `connection_id` once it has ended. A robot hears of an end
    /// before the record is written (docs/protocol.md), so a test that heard it through
    /// the robot waits for the record, for 5 s at most.
    pub async fn ended_record(&self, connection_id: &str) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let records = self.sessions("").await;
            let record = records.iter().find(|r| r["connectionId"] == connection_id);
            match record {
                Some(record) if !record["endedAt"].is_null() => return record.clone(),
                _ => assert!(
                    std::time::Instant::now() < deadline,
                    "the record of {connection_id} never ended: {record:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(path) = &self.sqlite_file {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }
}

/// Waits (bounded) until `check` holds: for server-side effects that send no message to
/// wait for, such as a closed socket having been taken out of the hub.
pub async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {WAIT:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn new_ed25519() -> Ed25519KeyPair {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("keygen");
    Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("key")
}

/// A spec envelope with a fresh id and the current time.
pub fn envelope(kind: &str, payload: Option<Value>) -> Value {
    let mut message = json!({
        "type": kind,
        "version": "0.3",
        "id": uuid::Uuid::new_v4().to_string(),
        "timestamp": "2026-01-06T12:00:00Z",
    });
    if let Some(payload) = payload {
        message["payload"] = payload;
    }
    message
}

pub fn offer(robot_id: &str, connection_id: &str) -> Value {
    envelope(
        "signalling.offer",
        Some(json!({
            "robotId": robot_id,
            "connectionId": connection_id,
            "sdpType": "offer",
            "sdp": "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n",
        })),
    )
}

pub fn ice(connection_id: &str) -> Value {
    envelope(
        "signalling.ice_candidate",
        Some(json!({
            "connectionId": connection_id,
            "candidate": "candidate:1 1 UDP 2130706431 127.0.0.1 54321 typ host",
            "sdpMid": "0",
            "sdpMLineIndex": 0,
        })),
    )
}

/// An ICE candidate carrying `size` bytes of candidate text (floods).
pub fn big_candidate(connection_id: &str, size: usize) -> Value {
    envelope(
        "signalling.ice_candidate",
        Some(json!({
            "connectionId": connection_id,
            "candidate": format!("candidate:1 1 UDP 1 127.0.0.1 9 typ host {}", "x".repeat(size)),
            "sdpMid": "0",
            "sdpMLineIndex": 0,
        })),
    )
}

/// Pings `socket` and reads up to the pong: every message before it must be a
/// `relay_throttled` refusal; returns how many there were.
pub async fn throttled_until_pong(socket: &mut WsClient) -> usize {
    socket.send(&envelope("signalling.ping", None)).await;
    let mut throttled = 0;
    loop {
        let message = socket.recv().await;
        match message["type"].as_str() {
            Some("signalling.pong") => return throttled,
            Some("signalling.error") => {
                assert_eq!(message["payload"]["details"]["reason"], "relay_throttled");
                throttled += 1;
            }
            _ => panic!("unexpected message to a flooder: {message}"),
        }
    }
}

pub struct WsClient {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// The connectionId from the first welcome.
    pub connection_id: String,
    /// The welcome a client got at the upgrade (Null for a token-less socket).
    pub welcome: Value,
    /// The bound on each wait: WAIT, shorter only in the harness's own tests.
    pub wait: Duration,
}

impl WsClient {
    /// A token-less socket (a robot, before it proves itself): the server sends nothing
    /// until asked (issue 15: no welcome unless wanted).
    pub async fn connect(url: &str) -> WsClient {
        let request = url.into_client_request().expect("request");
        let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("connect in time")
            .expect("WebSocket upgrade");
        WsClient::over(ws)
    }

    pub async fn connect_with_token(url: &str, token: &str) -> WsClient {
        Self::connect_request(
            format!("{url}?token={token}")
                .into_client_request()
                .expect("request"),
        )
        .await
    }

    /// A socket that logs in at the upgrade (a client): its welcome comes first.
    pub async fn connect_request(
        request: tokio_tungstenite::tungstenite::handshake::client::Request,
    ) -> WsClient {
        let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("connect in time")
            .expect("WebSocket upgrade");
        let mut client = WsClient::over(ws);
        let welcome = client.recv_type("signalling.welcome").await;
        client.connection_id = welcome["payload"]["connectionId"]
            .as_str()
            .expect("connectionId")
            .to_string();
        client.welcome = welcome;
        client
    }

    /// A client over an upgraded socket, before any welcome.
    pub fn over(ws: WebSocketStream<MaybeTlsStream<TcpStream>>) -> WsClient {
        WsClient {
            ws,
            connection_id: String::new(),
            welcome: Value::Null,
            wait: WAIT,
        }
    }

    /// The socket itself, for a load generator that reads without validating.
    pub fn into_stream(self) -> WebSocketStream<MaybeTlsStream<TcpStream>> {
        self.ws
    }

    pub async fn send(&mut self, message: &Value) {
        self.send_text(message.to_string()).await;
    }

    pub async fn send_text(&mut self, text: String) {
        self.send_message(Message::Text(text.into())).await;
    }

    /// Sends and reports whether the socket took it (false once the server closed it).
    pub async fn try_send_text(&mut self, text: String) -> bool {
        self.ws.send(Message::Text(text.into())).await.is_ok()
    }

    pub async fn send_message(&mut self, message: Message) {
        self.ws.send(message).await.expect("send");
    }

    /// What the server sent next, pings and pongs skipped. Every receive path comes
    /// through here, so every text frame is checked against the spec schemas. Panics if
    /// nothing arrives in time, naming what the test was `waiting_for`.
    pub async fn next_frame(&mut self, waiting_for: &str) -> Frame {
        loop {
            let wait = self.wait;
            let next = tokio::time::timeout(wait, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("timed out after {wait:?} waiting for {waiting_for}"));
            let frame = match next {
                None => Frame::Ended("end of stream without a close frame".into()),
                Some(Err(e)) => Frame::Ended(format!("socket error without a close frame: {e}")),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(Message::Text(text))) => Frame::Text(validated(&text)),
                Some(Ok(Message::Close(Some(frame)))) => Frame::Close(Closed {
                    code: u16::from(frame.code),
                    reason: frame.reason.to_string(),
                }),
                Some(Ok(other)) => Frame::Other(other),
            };
            return frame;
        }
    }

    /// The next frame from a socket that spoke Modulr's legacy flat dialect: a JSON object
    /// whose `type` has no dot, with the fields that type carries in the web app's shape.
    pub async fn recv_flat(&mut self) -> Value {
        loop {
            let wait = self.wait;
            let next = tokio::time::timeout(wait, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("timed out after {wait:?} waiting for a flat frame"));
            let text = match next {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                other => panic!("expected a flat text frame, got {other:?}"),
            };
            let value: Value = serde_json::from_str(&text).expect("JSON");
            let fields: &[&str] = match value["type"].as_str() {
                Some("welcome") => &["connectionId"],
                Some("answer") => &["sdp"],
                Some("candidate") => &["candidate"],
                Some("error") => &["error", "code", "message"],
                Some("session-locked") => &["robotId"],
                Some("disconnected") => &["connectionId"],
                _ => panic!("not a legacy frame: {value}"),
            };
            for field in fields {
                assert!(!value[field].is_null(), "{field} missing: {value}");
            }
            if value["type"] == "candidate" {
                for field in ["candidate", "sdpMid", "sdpMLineIndex"] {
                    assert!(!value["candidate"][field].is_null(), "{value}");
                }
            }
            return value;
        }
    }

    /// The next protocol message; panics on timeout, close, or a message that breaks the spec.
    pub async fn recv(&mut self) -> Value {
        match self.next_frame("a message").await {
            Frame::Text(value) => value,
            other => panic!("expected a text message, got {other:?}"),
        }
    }

    pub async fn recv_type(&mut self, kind: &str) -> Value {
        let message = self.recv().await;
        assert_eq!(message["type"], kind, "unexpected message: {message}");
        message
    }

    /// Expects `signalling.error` with `code`; returns it.
    pub async fn expect_error(&mut self, code: &str) -> Value {
        let message = self.recv_type("signalling.error").await;
        assert_eq!(message["payload"]["code"], code, "{message}");
        message
    }

    /// Expects a close frame next and returns it. Anything else fails the test: a message,
    /// a reset or an end of stream without a close frame, or nothing in time.
    pub async fn expect_close(&mut self) -> Closed {
        match self.next_frame("a close frame").await {
            Frame::Close(closed) => closed,
            other => panic!("expected a close frame, got {other:?}"),
        }
    }

    /// Expects a close frame with `code`; returns its reason.
    pub async fn expect_close_with(&mut self, code: u16) -> String {
        let closed = self.expect_close().await;
        assert_eq!(closed.code, code, "close frame {closed:?}");
        closed.reason
    }

    /// Proves nothing else is queued for this socket: a ping's pong must come next.
    pub async fn expect_nothing_pending(&mut self) {
        let ping = envelope("signalling.ping", None);
        self.send(&ping).await;
        let pong = self.recv().await;
        assert_eq!(
            pong["type"], "signalling.pong",
            "unexpected message: {pong}"
        );
        assert_eq!(pong["correlationId"], ping["id"]);
    }

    /// register → pki_challenge → pki_response → pki_verified → second welcome, with any
    /// key type; returns the second welcome.
    pub async fn prove(&mut self, robot_id: &str, signer: &dyn Signer) -> Value {
        let verified = self.try_prove(robot_id, signer).await;
        assert_eq!(verified["type"], "signalling.pki_verified", "{verified}");
        assert_eq!(verified["payload"]["agentId"], robot_id);
        self.recv_type("signalling.welcome").await
    }

    /// The login sequence up to the server's verdict, which is returned unchecked: a
    /// refusal of the register itself, or the answer to the signed challenge.
    pub async fn try_prove(&mut self, robot_id: &str, signer: &dyn Signer) -> Value {
        self.try_prove_with(robot_id, signer, json!({})).await
    }

    /// [`WsClient::try_prove`] with more `register.metadata` (e.g. `{"arp": "0.1.0"}`).
    pub async fn try_prove_with(
        &mut self,
        robot_id: &str,
        signer: &dyn Signer,
        extra: Value,
    ) -> Value {
        // Like robot-agent, ask for the welcome that carries TURN credentials.
        let mut payload = json!({ "agentId": robot_id, "metadata": { "wantsWelcome": true } });
        if let Some(chain) = signer.chain() {
            payload["metadata"] =
                json!({ "certificate": chain, "model": "MR-5000", "wantsWelcome": true });
        }
        if let (Some(metadata), Some(extra)) =
            (payload["metadata"].as_object_mut(), extra.as_object())
        {
            metadata.extend(extra.clone());
        }
        self.send(&envelope("signalling.register", Some(payload)))
            .await;
        let challenge = self.recv().await;
        if challenge["type"] != "signalling.pki_challenge" {
            return challenge;
        }
        let response = signed_response(&challenge, signer);
        self.send(&response).await;
        let answer = self.recv().await;
        assert_eq!(answer["correlationId"], response["id"], "{answer}");
        answer
    }

    /// register → pki_challenge → pki_response → pki_verified (+ second welcome).
    pub async fn login_as_robot(&mut self, robot_id: &str, key: &dyn Signer) {
        self.prove(robot_id, key).await;
    }

    /// Sends register, returns the challenge.
    pub async fn register(&mut self, robot_id: &str) -> Value {
        self.send(&envelope(
            "signalling.register",
            Some(json!({ "agentId": robot_id, "metadata": { "wantsWelcome": true } })),
        ))
        .await;
        self.recv_type("signalling.pki_challenge").await
    }
}

/// A frame from the server, text already parsed and validated against the spec.
#[derive(Debug)]
pub enum Frame {
    Text(Value),
    Close(Closed),
    /// A reset, or the stream ended, without a close frame: why, for the failure message.
    Ended(String),
    /// Binary, or a close frame without a status code.
    Other(Message),
}

#[derive(Debug)]
pub struct Closed {
    pub code: u16,
    pub reason: String,
}

/// Parses a text frame from the server and checks it against the spec schemas.
fn validated(text: &str) -> Value {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("server sent non-JSON ({e}): {text}"));
    if value["type"] == "arp.frame" {
        check_arp_frame(&value);
        return value;
    }
    if value["type"] == "session.ticket" {
        check_ticket_renewal(&value);
        return value;
    }
    if value["type"] == "session.signing_keys" {
        for field in ["version", "id", "timestamp"] {
            assert!(value[field].is_string(), "{value}");
        }
        let payload = value["payload"].as_object().expect("payload object");
        assert!(
            payload.len() == 1 && payload["endorsement"].is_string(),
            "session.signing_keys payload: {value}"
        );
        return value;
    }
    if let Err(e) = SchemaValidator::shared().validate(&value) {
        panic!("server sent a message that breaks the spec: {e}\n{value}");
    }
    value
}

/// `meta.session` of something forwarded to a robot, its signed ticket checked to be there
/// and taken out (tests/api/tickets.rs checks what is in it): `{subject, role}`.
pub fn session_of(forwarded: &Value) -> Value {
    let mut session = forwarded["meta"]["session"].clone();
    let ticket = session
        .as_object_mut()
        .and_then(|s| s.remove("ticket"))
        .unwrap_or_else(|| panic!("no ticket in meta.session: {forwarded}"));
    assert!(ticket.is_string(), "{forwarded}");
    session
}

/// A `session.ticket` envelope, checked against docs/protocol.md ("Session tickets"):
/// the envelope's fields, exactly `{connectionId}` as payload, and `meta.session` with
/// subject, role and ticket.
pub fn check_ticket_renewal(value: &Value) {
    for field in ["version", "id", "timestamp"] {
        assert!(
            value[field].is_string(),
            "session.ticket without {field}: {value}"
        );
    }
    let payload = value["payload"].as_object().expect("payload object");
    assert_eq!(payload.len(), 1, "session.ticket payload: {value}");
    assert!(
        payload["connectionId"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "session.ticket without connectionId: {value}"
    );
    let session = &value["meta"]["session"];
    assert!(session["subject"].is_string(), "{value}");
    assert!(
        matches!(
            session["role"].as_str(),
            Some("viewer" | "operator" | "owner")
        ),
        "{value}"
    );
    assert!(session["ticket"].is_string(), "{value}");
}

/// An `arp.frame` envelope, checked against docs/protocol.md ("ARP sessions") and its frame
/// against the ARP schema.
pub fn check_arp_frame(value: &Value) {
    for field in ["version", "id", "timestamp"] {
        assert!(
            value[field].is_string(),
            "arp.frame without {field}: {value}"
        );
    }
    let connection = value["payload"]["connectionId"].as_str().unwrap_or("");
    assert!(
        !connection.is_empty(),
        "arp.frame without connectionId: {value}"
    );
    let session = &value["meta"]["session"];
    assert!(
        session["subject"].is_string(),
        "arp.frame without meta.session.subject: {value}"
    );
    assert!(
        matches!(
            session["role"].as_str(),
            Some("viewer" | "operator" | "owner")
        ),
        "arp.frame with a bad meta.session.role: {value}"
    );
    if let Err(e) = ArpValidator::shared().validate(&value["payload"]["frame"], None) {
        panic!("arp.frame carries a frame that breaks the ARP schema: {e}\n{value}");
    }
}

/// The bytes of a pki_challenge, checked against the contract: padded standard base64 of
/// at least 32 bytes.
pub fn challenge_bytes(challenge: &Value) -> Vec<u8> {
    let text = challenge["payload"]["challenge"]
        .as_str()
        .expect("challenge");
    let bytes = STANDARD.decode(text).expect("padded standard base64");
    assert!(bytes.len() >= 32, "challenge has {} bytes", bytes.len());
    bytes
}

/// A robot's private key, for any key type the server accepts.
pub trait Signer {
    /// The signature over a challenge, in the key type's wire format.
    fn sign_challenge(&self, challenge: &[u8]) -> Vec<u8>;

    /// How the signature travels in pki_response.
    fn encode(&self, signature: &[u8]) -> String {
        STANDARD.encode(signature)
    }

    /// A certificate chain to present in register (fleet certificates).
    fn chain(&self) -> Option<&str> {
        None
    }
}

impl Signer for Ed25519KeyPair {
    fn sign_challenge(&self, challenge: &[u8]) -> Vec<u8> {
        self.sign(challenge).as_ref().to_vec()
    }
}

/// ECDSA with ring: ASN.1 DER or fixed r‖s, as the key was made.
impl Signer for EcdsaKeyPair {
    fn sign_challenge(&self, challenge: &[u8]) -> Vec<u8> {
        self.sign(&SystemRandom::new(), challenge)
            .expect("ECDSA signature")
            .as_ref()
            .to_vec()
    }
}

/// rcgen's keys (Ed25519 raw, ECDSA ASN.1 DER), as used for certificates.
impl Signer for rcgen::KeyPair {
    fn sign_challenge(&self, challenge: &[u8]) -> Vec<u8> {
        rcgen::SigningKey::sign(self, challenge).expect("rcgen signature")
    }
}

/// A key that presents its certificate chain at register.
pub struct Certified<'a> {
    pub chain: &'a str,
    pub key: &'a dyn Signer,
}

impl<'a> Certified<'a> {
    pub fn new(chain: &'a str, key: &'a dyn Signer) -> Self {
        Certified { chain, key }
    }
}

impl Signer for Certified<'_> {
    fn sign_challenge(&self, challenge: &[u8]) -> Vec<u8> {
        self.key.sign_challenge(challenge)
    }
    fn chain(&self) -> Option<&str> {
        Some(self.chain)
    }
}

/// A key whose signatures travel as unpadded base64, as the Modulr agent sends them.
pub struct Unpadded<'a>(pub &'a dyn Signer);

impl Signer for Unpadded<'_> {
    fn sign_challenge(&self, challenge: &[u8]) -> Vec<u8> {
        self.0.sign_challenge(challenge)
    }
    fn encode(&self, signature: &[u8]) -> String {
        STANDARD_NO_PAD.encode(signature)
    }
}

/// The pki_response to `challenge` signed by `signer`.
pub fn signed_response(challenge: &Value, signer: &dyn Signer) -> Value {
    let signature = signer.sign_challenge(&challenge_bytes(challenge));
    pki_response(challenge, &signer.encode(&signature))
}

/// Expects a login refusal with `reason`.
pub fn assert_refused(reply: &Value, reason: &str) {
    assert_eq!(reply["type"], "signalling.error", "{reply}");
    assert_eq!(reply["payload"]["code"], "UNAUTHORIZED", "{reply}");
    assert_eq!(reply["payload"]["details"]["reason"], reason, "{reply}");
}

pub fn pki_response(challenge: &Value, signature: &str) -> Value {
    let mut response = envelope(
        "signalling.pki_response",
        Some(json!({ "signature": signature })),
    );
    response["correlationId"] = challenge["id"].clone();
    response
}

/// The server binary cargo built for this test crate. `option_env!`: the harness is also
/// compiled into robot-agent's gateway bench, which starts servers in process only.
fn server_binary() -> &'static str {
    match option_env!("CARGO_BIN_EXE_signalling-server") {
        Some(binary) => binary,
        None => panic!("the server binary is built with the server's own tests only"),
    }
}

/// The server binary as a separate process (for what only a real process shows: its log,
/// signals), with JSON logs on stdout collected line by line.
pub struct ServerProcess {
    child: std::process::Child,
    pub addr: String,
    lines: std::sync::mpsc::Receiver<String>,
}

impl ServerProcess {
    /// Starts the binary on 127.0.0.1:0 with its own database, the test admin token and
    /// `args`; returns once it announced its address.
    pub async fn start(args: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        let (database_url, _) = test_database().await;
        Self::start_on(&database_url, args, env)
    }

    /// The same on a database the test prepared (and inspects afterwards).
    pub fn start_on(database_url: &str, args: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        let command = std::process::Command::new(server_binary());
        Self::start_command(command, database_url, args, env)
    }

    /// [`ServerProcess::start_on`] with at most `open_files` open files (prlimit).
    pub fn start_limited(database_url: &str, args: &[&str], open_files: u32) -> ServerProcess {
        let mut command = std::process::Command::new("prlimit");
        command.arg(format!("--nofile={open_files}:{open_files}"));
        command.args(["--", server_binary()]);
        Self::start_command(command, database_url, args, &[])
    }

    fn start_command(
        mut command: std::process::Command,
        database_url: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ServerProcess {
        use std::io::BufRead;
        command
            .args(["--listen", "127.0.0.1:0", "--admin-token", ADMIN_TOKEN])
            .args(["--log-format", "json", "--database-url", database_url])
            .args(args)
            .env_remove("REDIS_URL")
            .stdout(std::process::Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("server binary");
        let stdout = child.stdout.take().expect("stdout");
        let (line_tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if line_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut process = ServerProcess {
            child,
            addr: String::new(),
            lines,
        };
        let deadline = std::time::Instant::now() + WAIT;
        while process.addr.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = process
                .lines
                .recv_timeout(left)
                .expect("server announces its address");
            if let Ok(log) = serde_json::from_str::<Value>(&line) {
                if log["fields"]["message"] == "listening" {
                    process.addr = log["fields"]["addr"].as_str().unwrap_or_default().into();
                }
            }
        }
        process
    }

    /// SIGTERM, as a service manager stops it.
    pub fn sigterm(&self) {
        let signalled = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(signalled.success());
    }

    /// The exit status, once the process has exited (within WAIT).
    pub async fn exit_status(mut self) -> std::process::ExitStatus {
        let exited = tokio::task::spawn_blocking(move || self.child.wait());
        tokio::time::timeout(WAIT, exited)
            .await
            .expect("the server exits in time")
            .expect("wait task")
            .expect("exit status")
    }

    /// Kills the process and returns everything it logged after announcing its address.
    pub fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The reader thread ends at EOF, which closes the channel.
        self.lines.iter().collect::<Vec<_>>().join("\n")
    }
}

//! ARP gateway figures for docs/benchmarks.md, in one run on loopback:
//!
//! 1. Round trip of `arp.listTools` to the same robot-agent (sim driver), sequential: on its
//!    own ARP WebSocket, and through the server's gateway (program → server → the robot's
//!    signalling socket → the agent's ARP server and back). The difference is the gateway's.
//! 2. Calls per second through one node with the robot answering at once: stand-in robots
//!    (test peers that answer every `arp.frame` immediately) and one program each, every
//!    program keeping a window of requests in flight.
//!
//! `cargo run --release -p robot-agent --example arp_gateway_bench [ROUND_TRIPS] [PAIRS] [SECS]`
//!
//! Prints figures; asserts nothing about time.

use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use robot_agent::config::{RunConfig, RunFlags};
use robot_agent::enroll::{enroll, EnrollRequest};
use robot_agent::identity::KeyType;
use serde_json::{json, Value};
use signalling_server::{Config, Server};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const ADMIN: &str = "arp-gateway-bench-admin";
const LOCAL_TOKEN: &str = "bench-local-viewer";

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
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

    async fn robot(&self, id: &str, subject: &str) -> (String, String) {
        let made = self
            .call(
                reqwest::Method::POST,
                "/v1/robots",
                Some(json!({ "robotId": id })),
            )
            .await;
        self.call(
            reqwest::Method::PUT,
            &format!("/v1/robots/{id}/grants/{subject}"),
            // Viewers: listing tools needs no control, so both paths can be open at once.
            Some(json!({ "role": "viewer" })),
        )
        .await;
        let token = self
            .call(
                reqwest::Method::POST,
                "/v1/tokens",
                Some(json!({ "subject": subject })),
            )
            .await;
        (
            made["enrollmentToken"]
                .as_str()
                .expect("enrollment token")
                .into(),
            token["token"].as_str().expect("token").into(),
        )
    }
}

async fn connect(url: &str, token: &str) -> Ws {
    let mut request = url.into_client_request().expect("request");
    request.headers_mut().insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
    );
    tokio_tungstenite::connect_async(request)
        .await
        .expect("connect")
        .0
}

async fn next_text(ws: &mut Ws) -> Value {
    loop {
        match ws.next().await.expect("open").expect("frame") {
            Message::Text(t) => return serde_json::from_str(&t).expect("json"),
            Message::Close(c) => panic!("closed: {c:?}"),
            _ => {}
        }
    }
}

async fn request(ws: &mut Ws, id: u64, method: &str, params: Value) -> Value {
    let text = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
    ws.send(Message::text(text.to_string()))
        .await
        .expect("send");
    loop {
        let frame = next_text(ws).await;
        if frame["id"] == json!(id) {
            return frame;
        }
    }
}

async fn initialize(ws: &mut Ws) {
    let init = request(
        ws,
        0,
        "arp.initialize",
        json!({ "protocolVersion": "0.1.0", "clientInfo": { "name": "bench", "version": "1" } }),
    )
    .await;
    assert!(init.get("result").is_some(), "{init}");
}

/// Sequential round trips of `arp.listTools`, in microseconds, sorted.
async fn round_trips(ws: &mut Ws, count: usize) -> Vec<f64> {
    let mut times = Vec::with_capacity(count);
    for i in 0..count {
        let start = Instant::now();
        let answer = request(ws, 1 + i as u64, "arp.listTools", json!({})).await;
        times.push(start.elapsed().as_secs_f64() * 1e6);
        assert!(answer.get("result").is_some(), "{answer}");
    }
    times.sort_by(|a, b| a.total_cmp(b));
    times
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// A stand-in robot logged in on `ws_url` declaring ARP, answering every request at once.
async fn echo_robot(api: &Api, ws_url: &str, id: &str, enrollment: &str) {
    let dir = std::env::temp_dir().join(format!("arp-bench-{id}-{}", uuid::Uuid::new_v4()));
    enroll(&EnrollRequest {
        server: api.base.clone(),
        robot_id: id.into(),
        token: enrollment.into(),
        key_type: KeyType::Ed25519,
        csr: false,
        config_dir: dir.clone(),
        ca_file: None,
    })
    .await
    .expect("enroll");
    let key = robot_agent::identity::RobotKey::load_or_create(
        &dir.join(robot_agent::config::KEY_FILE),
        KeyType::Ed25519,
    )
    .expect("key")
    .0;
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url)
        .await
        .expect("robot");
    let envelope = |kind: &str, payload: Value| {
        json!({ "type": kind, "version": "0.5", "id": uuid::Uuid::new_v4().to_string(),
                "timestamp": "2026-01-01T00:00:00.000Z", "payload": payload })
    };
    let register = envelope(
        "signalling.register",
        json!({ "agentId": id, "metadata": { "arp": "0.1.0" } }),
    );
    ws.send(Message::text(register.to_string()))
        .await
        .expect("register");
    let challenge = next_text(&mut ws).await;
    let bytes = STANDARD
        .decode(
            challenge["payload"]["challenge"]
                .as_str()
                .expect("challenge"),
        )
        .expect("base64");
    let signature = STANDARD.encode(key.sign(&bytes).expect("sign"));
    let mut response = envelope("signalling.pki_response", json!({ "signature": signature }));
    response["correlationId"] = challenge["id"].clone();
    ws.send(Message::text(response.to_string()))
        .await
        .expect("respond");
    let verified = next_text(&mut ws).await;
    assert_eq!(verified["type"], "signalling.pki_verified", "{verified}");
    let _ = std::fs::remove_dir_all(&dir);
    tokio::spawn(async move {
        while let Some(Ok(message)) = ws.next().await {
            let Message::Text(text) = message else {
                continue;
            };
            let Ok(frame) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            if frame["type"] != "arp.frame" || frame.pointer("/payload/frame/id").is_none() {
                continue;
            }
            let answer = json!({ "type": "arp.frame", "version": "0.5", "id": "a",
                "timestamp": "2026-01-01T00:00:00.000Z",
                "payload": { "connectionId": frame["payload"]["connectionId"],
                    "frame": { "jsonrpc": "2.0", "id": frame["payload"]["frame"]["id"],
                               "result": { "tools": [] } } } });
            if ws.send(Message::text(answer.to_string())).await.is_err() {
                return;
            }
        }
    });
}

/// One program keeping `window` requests in flight for `secs`; returns answers received.
async fn pipelined(mut ws: Ws, window: u64, secs: f64) -> u64 {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut next = 1u64;
    let mut answered = 0u64;
    let send = |id: u64| {
        Message::text(
            json!({ "jsonrpc": "2.0", "id": id, "method": "arp.listTools", "params": {} })
                .to_string(),
        )
    };
    for _ in 0..window {
        ws.send(send(next)).await.expect("send");
        next += 1;
    }
    while Instant::now() < end {
        let frame = next_text(&mut ws).await;
        if frame.get("result").is_some() {
            answered += 1;
            ws.send(send(next)).await.expect("send");
            next += 1;
        }
    }
    answered
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let trips: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let pairs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(50);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5.0);
    let dir = std::env::temp_dir().join(format!("arp-gateway-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut config = Config::from_args([
        "signalling-server",
        "--listen",
        "127.0.0.1:0",
        "--admin-token",
        ADMIN,
        "--rate-limit",
        "1000000",
        "--rate-burst",
        "1000000",
    ])
    .expect("config");
    config.database_url = Some(format!("sqlite://{}/db.sqlite", dir.display()));
    let server = Server::bind(config).await.expect("server");
    let addr = server.local_addr().expect("addr");
    tokio::spawn(async move { server.run(std::future::pending::<()>()).await });
    let api = Api {
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
    };
    let ws_url = format!("ws://{addr}/ws");

    // 1. The same robot-agent, directly and through the gateway.
    let (enrollment, token) = api.robot("bench-robot", "bench-program").await;
    let agent_dir = dir.join("agent");
    enroll(&EnrollRequest {
        server: api.base.clone(),
        robot_id: "bench-robot".into(),
        token: enrollment,
        key_type: KeyType::Ed25519,
        csr: false,
        config_dir: agent_dir.clone(),
        ca_file: None,
    })
    .await
    .expect("enroll");
    let listen = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let local = listen.local_addr().expect("addr");
    drop(listen);
    let agent = RunConfig::resolve(RunFlags {
        config_dir: Some(agent_dir),
        server: Some(ws_url.clone()),
        robot_id: Some("bench-robot".into()),
        driver: Some("sim".into()),
        arp_listen: Some(local.to_string()),
        arp_tokens: vec![format!("viewer:{LOCAL_TOKEN}")],
        ..RunFlags::default()
    })
    .expect("agent config");
    tokio::spawn(robot_agent::agent::run(agent));
    loop {
        let robot = api
            .call(reqwest::Method::GET, "/v1/robots/bench-robot", None)
            .await;
        if robot["online"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut direct = connect(&format!("ws://{local}/"), LOCAL_TOKEN).await;
    initialize(&mut direct).await;
    let mut gateway = connect(&format!("ws://{addr}/v1/robots/bench-robot/arp"), &token).await;
    initialize(&mut gateway).await;
    // Warm both paths, then measure them interleaved in rounds so drift hits both alike.
    round_trips(&mut direct, 200).await;
    round_trips(&mut gateway, 200).await;
    let (mut d, mut g) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        d.extend(round_trips(&mut direct, trips / 4).await);
        g.extend(round_trips(&mut gateway, trips / 4).await);
    }
    d.sort_by(|a, b| a.total_cmp(b));
    g.sort_by(|a, b| a.total_cmp(b));
    println!(
        "arp.listTools round trip to robot-agent (sim), {} each, µs:",
        d.len()
    );
    println!(
        "  direct (its own ARP WebSocket)  p50 {:7.1}  p99 {:7.1}",
        pct(&d, 0.5),
        pct(&d, 0.99)
    );
    println!(
        "  through the gateway             p50 {:7.1}  p99 {:7.1}",
        pct(&g, 0.5),
        pct(&g, 0.99)
    );
    println!(
        "  the gateway adds                p50 {:7.1}  p99 {:7.1}",
        pct(&g, 0.5) - pct(&d, 0.5),
        pct(&g, 0.99) - pct(&d, 0.99)
    );

    // 2. Throughput with robots that answer at once.
    let mut programs = Vec::new();
    for i in 0..pairs {
        let id = format!("echo-{i}");
        let (enrollment, token) = api.robot(&id, &format!("p-{i}")).await;
        echo_robot(&api, &ws_url, &id, &enrollment).await;
        let mut ws = connect(&format!("ws://{addr}/v1/robots/{id}/arp"), &token).await;
        initialize(&mut ws).await;
        programs.push(ws);
    }
    let start = Instant::now();
    let runs: Vec<_> = programs
        .into_iter()
        .map(|ws| tokio::spawn(pipelined(ws, 16, secs)))
        .collect();
    let mut total = 0;
    for run in runs {
        total += run.await.expect("program");
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "calls through one node, {pairs} programs × 16 in flight, robots answering at once: {:.0}/s ({total} in {elapsed:.1} s)",
        total as f64 / elapsed
    );
    let _ = std::fs::remove_dir_all(&dir);
}

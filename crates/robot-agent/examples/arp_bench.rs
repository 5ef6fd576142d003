//! ARP figures for docs/benchmarks.md: tool-call round trip on loopback,
//! e-stop call → driver stop, context update jitter at 10 Hz.
//!
//! `cargo run --release -p robot-agent --example arp_bench [ROUND_TRIPS]`
//!
//! An in-process agent (controller, safety layer, ARP server on the local
//! WebSocket at 127.0.0.1:0) in front of a stand-in driver that notes when
//! each command arrives. Prints figures; asserts nothing about time.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use robot_agent::arp::ws::ArpListener;
use robot_agent::arp::{ArpOptions, ArpServer, ListenConfig, Token};
use robot_agent::driver::{DriverCommand, DriverEvent, DriverHandle, Pose};
use robot_agent::locations::LocationStore;
use robot_agent::safety::{SafetyLimits, StopReason};
use robot_agent::session::{Metrics, Shared};
use robot_agent::settings::Settings;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

struct Client {
    ws: Ws,
    next: u64,
}

impl Client {
    async fn connect(url: &str, secret: &str) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(format!("{url}?token={secret}"))
            .await
            .expect("connect");
        let mut c = Client { ws, next: 1 };
        let init = c
            .call("arp.initialize", json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "bench", "version": "1"}}))
            .await;
        assert!(init.get("result").is_some(), "{init}");
        c
    }

    async fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next;
        self.next += 1;
        let text =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        self.ws.send(Message::text(text)).await.expect("send");
        id
    }

    async fn read(&mut self) -> Value {
        loop {
            match self.ws.next().await.expect("open").expect("frame") {
                Message::Text(t) => return serde_json::from_str(&t).expect("json"),
                _ => continue,
            }
        }
    }

    async fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            let v = self.read().await;
            if pred(&v) {
                return v;
            }
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params).await;
        self.until(|v| v["id"] == id && v.get("method").is_none())
            .await
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(name: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    println!(
        "{name}: n={} p50={:.3} ms p99={:.3} ms max={:.3} ms",
        ms.len(),
        percentile(&ms, 0.50),
        percentile(&ms, 0.99),
        ms[ms.len() - 1]
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let round_trips: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let (url, mut stops) = agent().await;
    let mut op = Client::connect(&url, "op").await;
    let mut viewer = Client::connect(&url, "view").await;
    round_trip(&mut op, round_trips).await;
    estop(&mut op, &mut viewer, &mut stops).await;
    context_jitter(&url).await;
}

/// The ARP server on 127.0.0.1:0 over a stand-in driver (ready, a fixed
/// pose); its URL, and the arrival time of every emergency stop at the driver.
async fn agent() -> (String, mpsc::Receiver<Instant>) {
    let (handle, mut end) = DriverHandle::channel();
    let pose = handle.pose.clone();
    end.pose.send_replace(Some(Pose {
        x: 0.0,
        y: 0.0,
        theta: 0.0,
    }));
    end.events.send(DriverEvent::Ready).await.expect("ready");
    let (stops_tx, stops) = mpsc::channel::<Instant>(16);
    let pose_tx = end.pose;
    tokio::spawn(async move {
        while let Some(command) = end.commands.recv().await {
            if let DriverCommand::Stop {
                reason: StopReason::EmergencyStop,
            } = command
            {
                let _ = stops_tx.send(Instant::now()).await;
            }
        }
        drop(pose_tx);
    });
    let limits = SafetyLimits::default();
    let controller = robot_agent::controller::spawn(limits.clone(), handle);
    while !controller.status().await.expect("status").driver_ready {
        tokio::task::yield_now().await;
    }
    let shared = Shared {
        controller,
        locations: Arc::new(Mutex::new(LocationStore::in_memory(10))),
        settings: Arc::new(Mutex::new(Settings::defaults(&limits))),
        base_limits: limits,
        metrics: Arc::new(Metrics::default()),
        reply_signer: None,
    };
    let server = ArpServer::new(shared, pose, ArpOptions::default());
    let tokens: Vec<Token> = ["operator:op", "viewer:view"]
        .iter()
        .map(|t| t.parse().expect("token"))
        .collect();
    let listener = ArpListener::bind(&ListenConfig::new("127.0.0.1:0", tokens).expect("listen"))
        .await
        .expect("bind");
    let url = format!("ws://{}/", listener.local_addr().expect("addr"));
    tokio::spawn(listener.run(server));
    (url, stops)
}

/// Part 1, the tool-call round trip: callTool list_locations, sequential;
/// the message budget (100/s sustained) paces it, so pause between calls.
async fn round_trip(op: &mut Client, round_trips: usize) {
    let mut rtt = Vec::with_capacity(round_trips);
    for i in 0..round_trips + 50 {
        let start = Instant::now();
        let v = op
            .call(
                "arp.callTool",
                json!({"name": "list_locations", "arguments": {}}),
            )
            .await;
        let elapsed = start.elapsed();
        assert_eq!(v["result"]["state"], "completed", "{v}");
        if i >= 50 {
            rtt.push(elapsed.as_secs_f64() * 1e3);
        }
        tokio::time::sleep(Duration::from_millis(11)).await;
    }
    summary(
        "tool-call round trip (callTool list_locations, loopback WebSocket)",
        rtt,
    );
}

/// Part 2, the e-stop: a viewer's arp.emergencyStop mid-drive → the driver's Stop.
async fn estop(op: &mut Client, viewer: &mut Client, stops: &mut mpsc::Receiver<Instant>) {
    let mut estop = Vec::new();
    for _ in 0..200 {
        let drive = op
            .send("arp.callTool", json!({"name": "drive", "arguments": {"linear": 0.1, "angular": 0.0, "durationSecs": 10.0}}))
            .await;
        op.until(|v| v["method"] == "arp.toolProgress").await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        let sent = Instant::now();
        viewer
            .send("arp.emergencyStop", json!({"reason": "bench"}))
            .await;
        let stopped = stops.recv().await.expect("stop reached the driver");
        estop.push(stopped.duration_since(sent).as_secs_f64() * 1e3);
        let failed = op.until(|v| v["id"] == drive).await;
        assert_eq!(failed["error"]["code"], -40007, "{failed}");
        let reset = op
            .call(
                "arp.callTool",
                json!({"name": "reset_emergency_stop", "arguments": {}}),
            )
            .await;
        assert_eq!(reset["result"]["state"], "completed", "{reset}");
        viewer.until(|v| v.get("result").is_some()).await;
    }
    summary(
        "e-stop call -> driver stop (arp.emergencyStop from a viewer mid-drive)",
        estop,
    );
}

/// Part 3, context jitter: odometry at maxRate 10, inter-arrival times.
async fn context_jitter(url: &str) {
    let mut ctx = Client::connect(url, "view").await;
    ctx.call(
        "arp.subscribeContext",
        json!({"name": "odometry", "maxRate": 10}),
    )
    .await;
    ctx.until(|v| v["method"] == "arp.contextUpdate").await;
    let mut last = Instant::now();
    let mut intervals = Vec::new();
    for _ in 0..300 {
        ctx.until(|v| v["method"] == "arp.contextUpdate").await;
        let now = Instant::now();
        intervals.push(now.duration_since(last).as_secs_f64() * 1e3);
        last = now;
    }
    let mean = intervals.iter().sum::<f64>() / intervals.len() as f64;
    let deviation: Vec<f64> = intervals.iter().map(|i| (i - 100.0).abs()).collect();
    let mut sorted = deviation.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "context odometry at maxRate 10: n={} mean interval={mean:.2} ms ({:.2}/s), |interval-100 ms| p50={:.3} ms p99={:.3} ms max={:.3} ms",
        intervals.len(),
        1e3 / mean,
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.99),
        sorted[sorted.len() - 1]
    );
}

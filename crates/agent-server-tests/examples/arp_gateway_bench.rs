//! ARP through the server's gateway, figures for docs/benchmarks.md:
//!
//! 1. Round trip: robot-agent's own ARP endpoint against the gateway in front of the same
//!    agent (real server, real agent, sim driver), one call at a time, the two paths
//!    interleaved call by call (`arp.listTools`, and `arp.callTool list_locations`).
//! 2. Calls/s through one node: stand-in robots answer every frame at once (and the
//!    session ticket's key exchange, as robot-agent does); each program
//!    sends `arp.callTool` open loop at 40/s (under the gateway's 50/s per connection), one
//!    program per robot, more of them at each step.
//! 3. Cross-node, with `DATABASE_URL` (PostgreSQL) and `REDIS_URL`: two nodes in this
//!    process, a stand-in robot on node B, `arp.listTools` from a program on B and from one
//!    on A, interleaved.
//!
//! `cargo run --release -p agent-server-tests --example arp_gateway_bench -- [CALLS] [STEPS] [SECS]`
//! (defaults 1000, `250,500,750`, 10). Prints figures; asserts nothing about time.
//! `BENCH_TICKETS=off` runs it all with the server minting no session tickets (and the
//! agent checking none), for the cost of tickets: alternate runs with and without it.
//! `BENCH_PIN=1` confines the server's threads (its runtime and SQLite's workers) to CPU 1
//! and everything else (programs, stand-in robots, robot-agent) to CPU 0, so that the
//! server's calls/s are one core's and the generator cannot borrow the server's core.

#[path = "../../../tests/api/helpers.rs"]
mod helpers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use helpers::{envelope, TestServer, WsClient};
use robot_agent::config::{RunConfig, RunFlags};
use robot_agent::enroll::{enroll, EnrollRequest};
use robot_agent::identity::KeyType;
use serde_json::{json, Value};
use signalling_protocol::ticket::KEY_EXCHANGE_META_KEY;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The server binary's allocator (src/main.rs): on glibc's, the server's threads spent
/// 18 % of their time in malloc and free, which the binary does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Calls per second each program sends in the throughput run.
const PER_PROGRAM_RATE: u64 = 40;
/// The bound on any single wait: a stuck run fails loudly instead of hanging.
const WAIT: Duration = Duration::from_secs(20);

fn main() {
    let pinned = pinned();
    if pinned {
        // Before any thread starts: every thread made from here on inherits the CPU.
        pin_to(GENERATOR_CPU);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the generator's runtime")
        .block_on(bench(pinned));
}

/// Where `BENCH_PIN=1` puts the server and the rest (crates/bench's `--pin` uses the same).
const SERVER_CPU: usize = 1;
const GENERATOR_CPU: usize = 0;

fn pinned() -> bool {
    std::env::var("BENCH_PIN").is_ok_and(|v| v == "1")
}

/// Confines the calling thread (and the threads it makes later) to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it, and
    // sched_setaffinity(0, ..) reads it for the calling thread only.
    let status = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(status, 0, "cannot confine a thread to CPU {cpu}");
}

async fn bench(pinned: bool) {
    let mut args = std::env::args().skip(1);
    let calls: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let steps: Vec<usize> = args
        .next()
        .map(|s| s.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![250, 500, 750]);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);

    let tickets = if tickets_on() { "on" } else { "off" };
    let cores = if pinned {
        format!("server on CPU {SERVER_CPU}, the rest on CPU {GENERATOR_CPU}")
    } else {
        "cores shared".to_string()
    };
    println!("# ARP gateway bench: {calls} calls per path, steps {steps:?}, {secs} s each, session tickets {tickets}, {cores}");
    round_trip_against_the_agent(calls).await;
    for programs in steps {
        throughput(programs, secs).await;
    }
    match (std::env::var("DATABASE_URL"), std::env::var("REDIS_URL")) {
        (Ok(db), Ok(redis)) if db.starts_with("postgres") => cross_node(calls, &redis).await,
        _ => println!("cross-node: skipped (set DATABASE_URL to PostgreSQL and REDIS_URL)"),
    }
}

/// A server whose limits let one process drive many programs from 127.0.0.1 (the relay
/// bench raises the same ones); the gateway's own per-connection limits are unchanged.
/// It runs on a runtime of its own (threads named `server`), so its CPU time can be told
/// apart from the load generator's.
async fn bench_server(
    adjust: impl FnOnce(&mut signalling_server::Config) + Send + 'static,
) -> TestServer {
    server_runtime()
        .spawn(TestServer::start_with(|config| {
            config.rate_limit = 1_000_000;
            config.max_connections_per_ip = 0;
            config.max_tcp_connections_per_ip = 0;
            config.session_tickets = tickets_on();
            adjust(config);
        }))
        .await
        .expect("the server starts")
}

/// Whether this run has session tickets (`BENCH_TICKETS=off`: none).
fn tickets_on() -> bool {
    std::env::var("BENCH_TICKETS").map_or(true, |v| v != "off")
}

fn server_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        let pinned = pinned();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(SERVER_THREADS)
            // SQLite's worker threads are made from these, and keep their CPU.
            .on_thread_start(move || {
                if pinned {
                    pin_to(SERVER_CPU);
                }
            })
            .enable_all()
            .build()
            .expect("the server's runtime")
    })
}

const SERVER_THREADS: &str = "server";

// ---------------------------------------------------------------------------------------
// 1. The gateway against robot-agent's own endpoint.

async fn round_trip_against_the_agent(calls: usize) {
    let server = bench_server(|_| {}).await;
    let robot = "bench-agent";
    let enrollment = server.create_robot(robot).await;
    let dir = std::env::temp_dir().join(format!("arp-gw-bench-{}", uuid::Uuid::new_v4()));
    enroll(&EnrollRequest {
        server: server.url(""),
        robot_id: robot.into(),
        token: enrollment,
        key_type: KeyType::Ed25519,
        csr: false,
        config_dir: dir.clone(),
        ca_file: None,
    })
    .await
    .expect("the agent enrolls");
    let port = free_port();
    let mut agent_config = RunConfig::resolve(RunFlags {
        config_dir: Some(dir.clone()),
        server: Some(server.ws_url()),
        robot_id: Some(robot.into()),
        driver: Some("sim".into()),
        arp_listen: Some(format!("127.0.0.1:{port}")),
        arp_tokens: vec!["viewer:bench-viewer".into()],
        ..RunFlags::default()
    })
    .expect("agent config");
    // Without tickets the agent must not require them (it pinned the key at enrollment).
    agent_config.require_tickets = Some(tickets_on());
    let agent = tokio::spawn(robot_agent::agent::run(agent_config));
    wait_online(&server, robot).await;

    server.grant(robot, "bench-program", "operator").await;
    let token = server.client_token("bench-program").await;
    let mut gateway = Program::gateway(&server.ws_url(), robot, &token).await;
    gateway.initialize().await;
    let mut direct = Program::over(
        connect_with_retry(&format!("ws://127.0.0.1:{port}/?token=bench-viewer")).await,
    );
    direct.initialize().await;

    for (what, method, params) in [
        ("arp.listTools", "arp.listTools", json!({})),
        (
            "arp.callTool list_locations",
            "arp.callTool",
            json!({ "name": "list_locations", "arguments": {} }),
        ),
    ] {
        let (mut own, mut through) = (Vec::new(), Vec::new());
        for i in 0..calls + 50 {
            let a = direct.timed_call(method, params.clone()).await;
            let b = gateway.timed_call(method, params.clone()).await;
            if i >= 50 {
                own.push(a);
                through.push(b);
            }
            // Both paths allow 50 tool calls/s per connection: stay under it.
            tokio::time::sleep(Duration::from_millis(21)).await;
        }
        let own = Summary::of(own);
        let through = Summary::of(through);
        println!("round trip, {what}, one call at a time:");
        println!("  robot-agent's endpoint  {own}");
        println!("  through the gateway     {through}");
        println!(
            "  added by the gateway    p50 {:.3} ms, p99 {:.3} ms",
            through.p50 - own.p50,
            through.p99 - own.p99
        );
    }
    agent.abort();
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

async fn wait_online(server: &TestServer, robot: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, body) = server
            .admin(reqwest::Method::GET, &format!("/v1/robots/{robot}"), None)
            .await;
        if body["online"] == true {
            return;
        }
        assert!(Instant::now() < deadline, "the agent never came online");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("address").port()
}

/// The agent binds its ARP port as it starts: retry until it listens.
async fn connect_with_retry(url: &str) -> Ws {
    let deadline = Instant::now() + WAIT;
    loop {
        match tokio_tungstenite::connect_async(url).await {
            Ok((ws, _)) => return ws,
            Err(e) => {
                assert!(Instant::now() < deadline, "{url}: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// A program: one ARP connection, calls one at a time.

struct Program {
    ws: Ws,
    next: u64,
}

impl Program {
    fn over(ws: Ws) -> Program {
        Program { ws, next: 0 }
    }

    async fn gateway(ws_url: &str, robot: &str, token: &str) -> Program {
        Program::over(gateway_socket(ws_url, robot, token).await)
    }

    async fn initialize(&mut self) {
        let answer = self
            .call(
                "arp.initialize",
                json!({ "protocolVersion": "0.1.0",
                        "clientInfo": { "name": "bench", "version": "1" }, "capabilities": {} }),
            )
            .await;
        assert!(answer.get("result").is_some(), "initialize: {answer}");
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let frame = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        self.ws
            .send(Message::text(frame.to_string()))
            .await
            .expect("send");
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("an answer in time")
                .expect("open")
                .expect("frame");
            if let Message::Text(text) = message {
                let value: Value = serde_json::from_str(text.as_str()).expect("JSON");
                if value["id"] == id && value.get("method").is_none() {
                    return value;
                }
            }
        }
    }

    /// One call's round trip in milliseconds; an error answer ends the run.
    async fn timed_call(&mut self, method: &str, params: Value) -> f64 {
        let start = Instant::now();
        let answer = self.call(method, params).await;
        let elapsed = start.elapsed().as_secs_f64() * 1e3;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        elapsed
    }
}

async fn gateway_socket(ws_url: &str, robot: &str, token: &str) -> Ws {
    let url = ws_url.replace("/ws", &format!("/v1/robots/{robot}/arp"));
    let mut request = url.into_client_request().expect("request");
    request.headers_mut().insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
    );
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .expect("upgrade in time")
        .expect("upgrade");
    ws
}

// ---------------------------------------------------------------------------------------
// A stand-in robot: declares ARP and answers every request frame at once.

async fn stand_in_robot(server: &TestServer, robot: &str) -> Ws {
    let key = server.enrolled_robot(robot).await;
    let mut socket = WsClient::connect(&server.ws_url()).await;
    let verified = socket
        .try_prove_with(robot, &key, json!({ "arp": "0.1.0" }))
        .await;
    assert_eq!(verified["type"], "signalling.pki_verified", "{verified}");
    socket.recv_type("signalling.welcome").await;
    socket.into_stream()
}

/// Answers every request in an `arp.frame` until the socket closes.
async fn answer_at_once(mut ws: Ws) {
    while let Some(Ok(message)) = ws.next().await {
        let Message::Text(text) = message else {
            continue;
        };
        let Ok(value) = serde_json::from_str::<Value>(text.as_str()) else {
            continue;
        };
        if value["type"] != "arp.frame" {
            continue;
        }
        let frame = &value["payload"]["frame"];
        let (Some(id), Some(method)) = (frame.get("id"), frame["method"].as_str()) else {
            continue;
        };
        let result = match method {
            "arp.initialize" => json!({
                "protocolVersion": "0.1.0",
                "serverInfo": { "name": "stand-in", "version": "1" },
                "capabilities": { "tools": true, "context": true, "constraints": true,
                                  "planning": false, "confirmation": true },
            }),
            "arp.callTool" => {
                json!({ "callId": format!("c{id}"), "state": "completed", "result": {} })
            }
            "arp.listTools" => json!({ "tools": [] }),
            _ => json!({}),
        };
        let mut answer = envelope(
            "arp.frame",
            Some(json!({
                "connectionId": value["payload"]["connectionId"],
                "frame": { "jsonrpc": "2.0", "id": id, "result": result },
            })),
        );
        if let Some(half) = key_exchange_answer(&value) {
            answer["meta"] = json!({ KEY_EXCHANGE_META_KEY: half });
        }
        if ws.send(Message::text(answer.to_string())).await.is_err() {
            return;
        }
    }
}

/// Answers a ticket's key exchange (`kx`) as robot-agent does, with a fresh X25519 public
/// key, so the server MACs the session's later tickets as it would for a real agent (the
/// stand-in checks no ticket: the robot's side of the cost is `ticket_cost`'s).
fn key_exchange_answer(message: &Value) -> Option<String> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let ticket = message.pointer("/meta/session/ticket")?.as_str()?;
    let claims = URL_SAFE_NO_PAD.decode(ticket.split('.').nth(1)?).ok()?;
    let claims: Value = serde_json::from_slice(&claims).ok()?;
    claims.get("kx")?;
    let rng = ring::rand::SystemRandom::new();
    let ours =
        ring::agreement::EphemeralPrivateKey::generate(&ring::agreement::X25519, &rng).ok()?;
    Some(URL_SAFE_NO_PAD.encode(ours.compute_public_key().ok()?))
}

// ---------------------------------------------------------------------------------------
// 2. Calls/s through one node.

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    refused: std::collections::BTreeMap<String, u64>,
}

async fn throughput(programs: usize, secs: u64) {
    let server = bench_server(|config| {
        // One subject drives every robot: the per-subject viewer cap does not apply to
        // operators, and each robot has one program.
        config.max_viewer_sessions_per_subject = 0;
    })
    .await;
    let token = server.client_token("bench-program").await;
    let mut sockets = Vec::with_capacity(programs);
    for i in 0..programs {
        let robot = format!("stand-in-{i}");
        let ws = stand_in_robot(&server, &robot).await;
        tokio::spawn(answer_at_once(ws));
        server.grant(&robot, "bench-program", "operator").await;
        let mut program = Program::gateway(&server.ws_url(), &robot, &token).await;
        program.initialize().await;
        sockets.push(program.ws);
    }
    let tally = Arc::new(Mutex::new(Tally::default()));
    let sent = Arc::new(AtomicU64::new(0));
    let period = Duration::from_nanos(1_000_000_000 / PER_PROGRAM_RATE);
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let end = start + Duration::from_secs(secs);
    let cpu_before = cpu_split();
    let mut tasks = Vec::new();
    for (i, ws) in sockets.into_iter().enumerate() {
        // Phases spread over the period, like the relay bench's fixed load.
        let first = start + period.mul_f64(i as f64 / programs as f64);
        tasks.push(tokio::spawn(drive(
            ws,
            first,
            end,
            period,
            tally.clone(),
            sent.clone(),
        )));
    }
    for task in tasks {
        let _ = task.await;
    }
    let cpu = cpu_split().since(&cpu_before);
    let tally = std::mem::take(&mut *tally.lock().expect("tally"));
    let answered = tally.latencies_us.len() as u64;
    let mut ms: Vec<f64> = tally
        .latencies_us
        .iter()
        .map(|&us| f64::from(us) / 1e3)
        .collect();
    let summary = if ms.is_empty() {
        "no answers".to_string()
    } else {
        ms.sort_by(f64::total_cmp);
        Summary::sorted(ms).to_string()
    };
    println!(
        "through one node, {programs} programs x {PER_PROGRAM_RATE}/s = {} calls/s offered, {secs} s: \
         {:.0} calls/s answered by the robot, sent {}, refused {:?}; round trip {summary}; \
         CPU per answered call: server {:.0} µs, programs and stand-in robots {:.0} µs, \
         PostgreSQL {:.0} µs",
        programs as u64 * PER_PROGRAM_RATE,
        answered as f64 / secs as f64,
        sent.load(Ordering::Relaxed),
        tally.refused,
        cpu.server.as_secs_f64() * 1e6 / answered.max(1) as f64,
        cpu.generator.as_secs_f64() * 1e6 / answered.max(1) as f64,
        cpu.postgres.as_secs_f64() * 1e6 / answered.max(1) as f64,
    );
    server.shutdown().await;
}

/// One program: a call every `period` from `first` until `end`, answers timed by their id
/// (the send time, in microseconds since `first`'s epoch, travels as the id).
async fn drive(
    ws: Ws,
    first: tokio::time::Instant,
    end: tokio::time::Instant,
    period: Duration,
    tally: Arc<Mutex<Tally>>,
    sent: Arc<AtomicU64>,
) {
    let epoch = Instant::now();
    let (mut sink, mut stream) = ws.split();
    let sender = async move {
        let mut ticks = tokio::time::interval_at(first, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut count = 0u64;
        loop {
            let tick = ticks.tick().await;
            if tick >= end {
                break;
            }
            let id = epoch.elapsed().as_micros() as u64;
            let frame = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"arp.callTool","params":{{"name":"noop","arguments":{{}}}}}}"#
            );
            if sink.send(Message::text(frame)).await.is_err() {
                break;
            }
            count += 1;
        }
        sent.fetch_add(count, Ordering::Relaxed);
        count
    };
    let receiver = async move {
        let mut latencies = Vec::new();
        let mut refused = std::collections::BTreeMap::new();
        let drain_until = end + Duration::from_secs(2);
        while let Ok(Some(Ok(message))) = tokio::time::timeout_at(drain_until, stream.next()).await
        {
            let Message::Text(text) = message else {
                continue;
            };
            let Ok(value) = serde_json::from_str::<Value>(text.as_str()) else {
                continue;
            };
            let Some(id) = value["id"].as_u64() else {
                continue;
            };
            if let Some(error) = value.get("error") {
                let reason = error["data"]["reason"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| error["code"].to_string());
                *refused.entry(reason).or_insert(0u64) += 1;
                continue;
            }
            let now = epoch.elapsed().as_micros() as u64;
            latencies.push(now.saturating_sub(id).min(u64::from(u32::MAX)) as u32);
        }
        (latencies, refused)
    };
    let (_, (latencies, refused)) = tokio::join!(sender, receiver);
    let mut tally = tally.lock().expect("tally");
    tally.latencies_us.extend(latencies);
    for (reason, n) in refused {
        *tally.refused.entry(reason).or_insert(0) += n;
    }
}

/// CPU time so far of the server's threads (its runtime, SQLite's workers), of the rest
/// of this process (the load generator), and of PostgreSQL's processes on this machine.
struct CpuSplit {
    server: Duration,
    generator: Duration,
    postgres: Duration,
}

impl CpuSplit {
    fn since(&self, before: &CpuSplit) -> CpuSplit {
        CpuSplit {
            server: self.server.saturating_sub(before.server),
            generator: self.generator.saturating_sub(before.generator),
            postgres: self.postgres.saturating_sub(before.postgres),
        }
    }
}

fn cpu_split() -> CpuSplit {
    let mut split = CpuSplit {
        server: Duration::ZERO,
        generator: Duration::ZERO,
        postgres: Duration::ZERO,
    };
    for (name, cpu) in cpu_of_entries("/proc/self/task") {
        if name.starts_with(SERVER_THREADS) || name.starts_with("sqlx-sqlite") {
            split.server += cpu;
        } else {
            split.generator += cpu;
        }
    }
    split.postgres = cpu_of_entries("/proc")
        .into_iter()
        .filter(|(name, _)| name == "postgres")
        .map(|(_, cpu)| cpu)
        .sum();
    split
}

/// (command name, user + system CPU) of every `DIR/<n>/stat`.
fn cpu_of_entries(dir: &str) -> Vec<(String, Duration)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter_map(|stat| {
            let (head, rest) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1.to_string();
            // After the name: state is field 3; utime and stime are fields 14 and 15.
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks: u64 =
                fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
            // USER_HZ is 100 on Linux.
            Some((name, Duration::from_millis(ticks * 10)))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// 3. Cross-node.

async fn cross_node(calls: usize, redis: &str) {
    let (database, _) = helpers::test_database().await;
    let prefix = format!("arp-bench-{}:", uuid::Uuid::new_v4().simple());
    let node = |id: &'static str| {
        let (database, redis, prefix) = (database.clone(), redis.to_string(), prefix.clone());
        move |config: &mut signalling_server::Config| {
            config.database_url = Some(database);
            config.redis_url = Some(redis);
            config.redis_prefix = prefix;
            config.node_id = Some(id.into());
        }
    };
    let a = bench_server(node("bench-a")).await;
    let b = bench_server(node("bench-b")).await;
    let robot = "stand-in-remote";
    let ws = stand_in_robot(&b, robot).await;
    tokio::spawn(answer_at_once(ws));
    b.grant(robot, "bench-program", "viewer").await;
    let token = b.client_token("bench-program").await;
    let mut near = Program::gateway(&b.ws_url(), robot, &token).await;
    near.initialize().await;
    let mut far = connect_far(&a, robot, &token).await;
    let (mut local, mut remote) = (Vec::new(), Vec::new());
    for i in 0..calls + 50 {
        let x = near.timed_call("arp.listTools", json!({})).await;
        let y = far.timed_call("arp.listTools", json!({})).await;
        if i >= 50 {
            local.push(x);
            remote.push(y);
        }
        tokio::time::sleep(Duration::from_millis(21)).await;
    }
    let local = Summary::of(local);
    let remote = Summary::of(remote);
    println!("cross-node, arp.listTools to a stand-in robot on node B, one call at a time:");
    println!("  program on node B      {local}");
    println!("  program on node A      {remote}");
    println!(
        "  added by the hop       p50 {:.3} ms, p99 {:.3} ms",
        remote.p50 - local.p50,
        remote.p99 - local.p99
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// Node A learns of the robot through the bus: retry initialize until it does.
async fn connect_far(a: &TestServer, robot: &str, token: &str) -> Program {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut program = Program::gateway(&a.ws_url(), robot, token).await;
        let answer = program
            .call(
                "arp.initialize",
                json!({ "protocolVersion": "0.1.0",
                        "clientInfo": { "name": "bench", "version": "1" }, "capabilities": {} }),
            )
            .await;
        if answer.get("result").is_some() {
            return program;
        }
        assert!(
            Instant::now() < deadline,
            "node A never reached the robot: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------

struct Summary {
    n: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

impl Summary {
    fn of(mut ms: Vec<f64>) -> Summary {
        ms.sort_by(f64::total_cmp);
        Summary::sorted(ms)
    }

    fn sorted(ms: Vec<f64>) -> Summary {
        let at = |p: f64| ms[(((ms.len() - 1) as f64) * p).round() as usize];
        Summary {
            n: ms.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: ms[ms.len() - 1],
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} p50={:.3} ms p99={:.3} ms max={:.3} ms",
            self.n, self.p50, self.p99, self.max
        )
    }
}

//! Runs every benchmark against every target and collects the figures.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::target::{Kind, TargetInfo};
use crate::worker::{deserialize, new_histogram, summarize, Latency, Scenario, Spec};

/// Sizes of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    pub name: &'static str,
    /// Robots held idle; clients are half as many.
    pub capacity_robots: usize,
    pub sockets_per_worker: usize,
    pub idle_secs: f64,
    pub relay_sessions: usize,
    pub relay_secs: f64,
    pub offered_rate: u64,
    pub latency_repeats: usize,
    pub window: usize,
    pub storm_robots: usize,
    pub storm_concurrency: usize,
    pub setup_sessions: usize,
    pub setup_secs: f64,
}

pub const FULL: Profile = Profile {
    name: "full",
    capacity_robots: 12_000,
    sockets_per_worker: 6_000,
    idle_secs: 10.0,
    relay_sessions: 1_000,
    relay_secs: 10.0,
    offered_rate: 20_000,
    latency_repeats: 3,
    window: 8,
    storm_robots: 3_000,
    storm_concurrency: 1_000,
    setup_sessions: 200,
    setup_secs: 10.0,
};

pub const SMOKE: Profile = Profile {
    name: "smoke",
    capacity_robots: 200,
    sockets_per_worker: 200,
    idle_secs: 1.0,
    relay_sessions: 20,
    relay_secs: 1.0,
    offered_rate: 2_000,
    latency_repeats: 1,
    window: 4,
    storm_robots: 100,
    storm_concurrency: 100,
    setup_sessions: 10,
    setup_secs: 1.0,
};

pub struct Options {
    pub profile: Profile,
    pub out: PathBuf,
    pub server_bin: PathBuf,
    pub bench_bin: PathBuf,
    pub bare_bin: PathBuf,
    pub peers: Vec<String>,
    pub postgres_url: Option<String>,
    pub repo: PathBuf,
    pub only: Vec<String>,
}

/// One measured figure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub benchmark: String,
    pub target: String,
    pub metric: String,
    pub value: f64,
    pub unit: String,
    /// Other runs of the same figure, for the spread.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyFigures>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencyFigures {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub count: u64,
}

impl From<&Latency> for LatencyFigures {
    fn from(l: &Latency) -> Self {
        LatencyFigures {
            p50_us: l.p50_us,
            p99_us: l.p99_us,
            p999_us: l.p999_us,
            max_us: l.max_us,
            count: l.count,
        }
    }
}

fn row(benchmark: &str, target: &str, metric: &str, value: f64, unit: &str) -> Row {
    Row {
        benchmark: benchmark.into(),
        target: target.into(),
        metric: metric.into(),
        value,
        unit: unit.into(),
        runs: Vec::new(),
        latency: None,
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn wait_listening(port: u16, child: &mut Child) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("target exited early: {status}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("target did not listen on {port} within 120 s")
}

/// A running system under test.
pub struct Running {
    pub info: TargetInfo,
    pub child: Child,
    _dir: Option<TempDir>,
}

impl Running {
    /// SIGINT (our server shuts down gracefully on it) and a bounded wait; killed if it
    /// does not stop.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status()
                .await;
            if tokio::time::timeout(Duration::from_secs(180), self.child.wait())
                .await
                .is_err()
            {
                let _ = self.child.kill().await;
            }
        }
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Keys {
    ed25519_pkcs8: Vec<u8>,
    ed25519_public: Vec<u8>,
    p256_pkcs8: Vec<u8>,
    p256_spki_pem: String,
}

impl Keys {
    pub fn new() -> anyhow::Result<Keys> {
        let rng = SystemRandom::new();
        let ed = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|e| anyhow::anyhow!("{e}"))?;
        let ed_pair =
            Ed25519KeyPair::from_pkcs8(ed.as_ref()).map_err(|e| anyhow::anyhow!("{e}"))?;
        let p256 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let p256_pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, p256.as_ref(), &rng)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        // SubjectPublicKeyInfo for an uncompressed P-256 point.
        let mut spki = vec![
            0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06,
            0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
        ];
        spki.extend_from_slice(p256_pair.public_key().as_ref());
        Ok(Keys {
            ed25519_pkcs8: ed.as_ref().to_vec(),
            ed25519_public: ed_pair.public_key().as_ref().to_vec(),
            p256_pkcs8: p256.as_ref().to_vec(),
            p256_spki_pem: format!(
                "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
                STANDARD.encode(spki)
            ),
        })
    }
}

const ADMIN: &str = "bench-admin-token";

/// Starts our server with a fresh database and prepares robots, grants and a client token.
pub async fn start_ours(
    opts: &Options,
    keys: &Keys,
    database: Option<&str>,
    robots: usize,
    storm: usize,
) -> anyhow::Result<Running> {
    let port = free_port()?;
    let dir = std::env::temp_dir().join(format!("signalling-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    let database_url = match database {
        Some(url) => fresh_postgres_schema(url).await?,
        None => format!("sqlite://{}/bench.db", dir.display()),
    };
    let mut child = Command::new(&opts.server_bin)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-token",
            ADMIN,
            "--database-url",
            &database_url,
        ])
        // The relay benchmarks measure the relay, not the abuse limiter.
        .args([
            "--rate-limit",
            "100000000",
            "--rate-burst",
            "100000000",
            "--send-queue",
            "4096",
        ])
        .env("RUST_LOG", "warn")
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", opts.server_bin.display()))?;
    wait_listening(port, &mut child).await?;
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let token = prepare(&http, &base, keys, robots, storm).await?;
    Ok(Running {
        info: TargetInfo {
            name: if database.is_some() {
                "ours (PostgreSQL)".into()
            } else {
                "ours".into()
            },
            kind: Kind::Ours,
            ws_url: format!("ws://127.0.0.1:{port}/ws"),
            client_token: Some(token),
            ed25519_pkcs8: Some(STANDARD.encode(&keys.ed25519_pkcs8)),
            p256_pkcs8: Some(STANDARD.encode(&keys.p256_pkcs8)),
        },
        child,
        _dir: Some(TempDir(dir)),
    })
}

async fn fresh_postgres_schema(url: &str) -> anyhow::Result<String> {
    // A schema per run keeps runs apart without needing CREATE DATABASE rights.
    let schema = format!("bench_{}", uuid::Uuid::new_v4().simple());
    let status = Command::new("psql")
        .args([
            url,
            "-v",
            "ON_ERROR_STOP=1",
            "-q",
            "-c",
            &format!("CREATE SCHEMA {schema}"),
        ])
        .status()
        .await
        .context("psql")?;
    if !status.success() {
        bail!("cannot create schema {schema} in {url}");
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    Ok(format!("{url}{sep}options=-csearch_path%3D{schema}"))
}

async fn admin(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Value,
) -> anyhow::Result<Value> {
    let response = http
        .request(method, &url)
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await?;
    let status = response.status();
    let value: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        bail!("{url}: {status} {value}");
    }
    Ok(value)
}

/// Robots `bench-*` (Ed25519, viewer grant for subject `bench`), `storm-ed-*`, `storm-p256-*`.
async fn prepare(
    http: &reqwest::Client,
    base: &str,
    keys: &Keys,
    robots: usize,
    storm: usize,
) -> anyhow::Result<String> {
    let mut jobs: Vec<(String, String, bool)> = Vec::new();
    let ed = STANDARD.encode(&keys.ed25519_public);
    for i in 0..robots {
        jobs.push((format!("bench-{i}"), ed.clone(), true));
    }
    for i in 0..storm {
        jobs.push((format!("storm-ed-{i}"), ed.clone(), false));
        jobs.push((format!("storm-p256-{i}"), keys.p256_spki_pem.clone(), false));
    }
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = Vec::new();
    for (robot_id, key, grant) in jobs {
        let (http, base, gate) = (http.clone(), base.to_string(), gate.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await?;
            let created = admin(&http, reqwest::Method::POST, format!("{base}/v1/robots"), json!({"robotId": robot_id})).await?;
            let response = http
                .post(format!("{base}/v1/enroll"))
                .json(&json!({"robotId": robot_id, "enrollmentToken": created["enrollmentToken"], "publicKey": key}))
                .send()
                .await?;
            if !response.status().is_success() {
                bail!("enroll {robot_id}: {}", response.status());
            }
            if grant {
                admin(&http, reqwest::Method::PUT, format!("{base}/v1/robots/{robot_id}/grants/bench"), json!({"role": "viewer"})).await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let token = admin(
        http,
        reqwest::Method::POST,
        format!("{base}/v1/tokens"),
        json!({"subject": "bench", "ttlSeconds": 86_400}),
    )
    .await?;
    Ok(token["token"].as_str().context("token")?.to_string())
}

/// Starts a peer relay.
pub async fn start_peer(opts: &Options, name: &str) -> anyhow::Result<Running> {
    let port = free_port()?;
    let peers = opts.repo.join("bench/peers");
    let (mut command, kind, path) = match name {
        "bare" => {
            let mut c = Command::new(&opts.bare_bin);
            c.arg(format!("127.0.0.1:{port}"));
            (c, Kind::Relay, "/")
        }
        "node" => {
            let mut c = Command::new("node");
            c.arg(peers.join("node-relay.js"))
                .arg(port.to_string())
                .current_dir(&peers);
            (c, Kind::Relay, "/")
        }
        "python" => {
            let python = opts.repo.join("target/bench-tools/venv/bin/python");
            let mut c = Command::new(if python.exists() {
                python
            } else {
                PathBuf::from("python3")
            });
            c.arg(peers.join("py-relay.py")).arg(port.to_string());
            (c, Kind::Relay, "/")
        }
        "matchbox" => {
            let mut c = Command::new(opts.repo.join("target/bench-tools/bin/matchbox_server"));
            c.env("HOST", format!("127.0.0.1:{port}"))
                .env("RUST_LOG", "warn");
            (c, Kind::Matchbox, "")
        }
        other => bail!("unknown peer {other}"),
    };
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting peer {name}"))?;
    wait_listening(port, &mut child).await?;
    let label = match name {
        "bare" => "bare relay (Rust)",
        "node" => "Node.js ws relay",
        "python" => "Python websockets relay",
        _ => "matchbox_server",
    };
    Ok(Running {
        info: TargetInfo {
            name: label.into(),
            kind,
            ws_url: format!("ws://127.0.0.1:{port}{path}"),
            client_token: None,
            ed25519_pkcs8: None,
            p256_pkcs8: None,
        },
        child,
        _dir: None,
    })
}

/// A spawned worker process and its line-oriented control channel.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Worker {
    async fn spawn(opts: &Options, spec: &Spec) -> anyhow::Result<Worker> {
        let mut child = Command::new(&opts.bench_bin)
            .arg("worker")
            .arg(serde_json::to_string(spec)?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        Ok(Worker {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        })
    }

    async fn event(&mut self, name: &str) -> anyhow::Result<Value> {
        let deadline = Duration::from_secs(600);
        loop {
            let line = tokio::time::timeout(deadline, self.lines.next_line())
                .await
                .context("worker silent for 10 minutes")??
                .with_context(|| format!("worker ended before `{name}`"))?;
            let value: Value = match serde_json::from_str(&line) {
                Ok(v) => v,
                Err(_) => continue,
            };
            if value["event"] == name {
                return Ok(value);
            }
        }
    }

    async fn say(&mut self, word: &str) -> anyhow::Result<()> {
        self.stdin.write_all(format!("{word}\n").as_bytes()).await?;
        self.stdin.flush().await?;
        Ok(())
    }

    async fn finish(mut self) -> anyhow::Result<()> {
        let _ = self.say("exit").await;
        drop(self.stdin);
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await??;
        if !status.success() {
            bail!("worker failed: {status}");
        }
        Ok(())
    }
}

fn spec(info: &TargetInfo, scenario: Scenario, tag: &str) -> Spec {
    Spec {
        target: info.clone(),
        scenario,
        tag: tag.into(),
    }
}

/// Resident memory and CPU ticks of a process, from /proc.
fn proc_stats(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .context("VmRSS")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields
        .get(11)
        .and_then(|v| v.parse().ok())
        .context("utime")?;
    let stime: u64 = fields
        .get(12)
        .and_then(|v| v.parse().ok())
        .context("stime")?;
    Ok((rss_kb, utime + stime))
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

pub async fn capacity(
    opts: &Options,
    running: &Running,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let p = &opts.profile;
    let pid = running.child.id().context("pid")?;
    let (rss_before, _) = proc_stats(pid)?;
    let robots = p.capacity_robots;
    let clients = robots / 2;
    let total = robots + clients;
    let workers_needed = total.div_ceil(p.sockets_per_worker);
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..workers_needed {
        let share_r = robots / workers_needed + usize::from(w < robots % workers_needed);
        let first_r = (0..w)
            .map(|i| robots / workers_needed + usize::from(i < robots % workers_needed))
            .sum();
        let share_c = clients / workers_needed + usize::from(w < clients % workers_needed);
        let scenario = Scenario::Capacity {
            first: first_r,
            robots: share_r,
            clients: share_c,
        };
        workers
            .push(Worker::spawn(opts, &spec(&running.info, scenario, &format!("cap{w}-"))).await?);
    }
    let mut sockets = 0;
    for worker in &mut workers {
        sockets += worker.event("ready").await?["sockets"]
            .as_u64()
            .unwrap_or(0);
    }
    let connect_secs = started.elapsed().as_secs_f64();
    // Let the target settle before reading memory, then watch idle CPU.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss_after, ticks_before) = proc_stats(pid)?;
    tokio::time::sleep(Duration::from_secs_f64(p.idle_secs)).await;
    let (_, ticks_after) = proc_stats(pid)?;
    for worker in workers {
        worker.finish().await?;
    }
    let name = &running.info.name;
    let per_conn = (rss_after.saturating_sub(rss_before) as f64 * 1024.0) / sockets.max(1) as f64;
    let cpu = (ticks_after - ticks_before) as f64 / clock_ticks() / p.idle_secs * 100.0;
    rows.push(row(
        "capacity",
        name,
        "idle sockets",
        sockets as f64,
        "sockets",
    ));
    rows.push(row(
        "capacity",
        name,
        "RSS per idle connection",
        per_conn / 1024.0,
        "KiB",
    ));
    rows.push(row(
        "capacity",
        name,
        "RSS total",
        rss_after as f64 / 1024.0,
        "MiB",
    ));
    rows.push(row("capacity", name, "CPU while idle", cpu, "% of a core"));
    rows.push(row(
        "capacity",
        name,
        "time to connect all",
        connect_secs,
        "s",
    ));
    Ok(())
}

/// With BENCH_PERF_OUT set, samples the target with `perf record -p` during a benchmark
/// (the profiles behind docs/benchmarks.md).
struct Profiler(Option<Child>);

impl Profiler {
    fn start(running: &Running, what: &str) -> Profiler {
        let (Ok(dir), Some(pid)) = (std::env::var("BENCH_PERF_OUT"), running.child.id()) else {
            return Profiler(None);
        };
        let out = format!(
            "{dir}/{}-{what}.perf.data",
            running.info.name.replace([' ', '(', ')', '.'], "_")
        );
        let child = Command::new("perf")
            .args([
                "record",
                "-F",
                "999",
                "-g",
                "-o",
                &out,
                "-p",
                &pid.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        Profiler(child)
    }

    async fn stop(self) {
        if let Some(mut child) = self.0 {
            if let Some(pid) = child.id() {
                let _ = Command::new("kill")
                    .args(["-INT", &pid.to_string()])
                    .status()
                    .await;
            }
            let _ = tokio::time::timeout(Duration::from_secs(120), child.wait()).await;
        }
    }
}

pub async fn relay(opts: &Options, running: &Running, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let profiler = Profiler::start(running, "relay");
    let result = relay_runs(opts, running, rows).await;
    profiler.stop().await;
    result
}

async fn relay_runs(opts: &Options, running: &Running, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let p = &opts.profile;
    let name = &running.info.name;
    // (label, size, robot→client, rate, repeats)
    let runs: [(&str, usize, bool, Option<u64>, usize); 3] = [
        ("relay 250 B, saturated", 250, false, None, 1),
        (
            "relay 250 B, fixed load",
            250,
            false,
            Some(p.offered_rate),
            p.latency_repeats,
        ),
        ("relay 6 KB, saturated", 6_000, true, None, 1),
    ];
    for (label, size, b_to_a, rate, repeats) in runs {
        let mut throughputs = Vec::new();
        let mut p99s = Vec::new();
        let mut merged = new_histogram();
        for r in 0..repeats {
            let scenario = Scenario::Relay {
                sessions: p.relay_sessions,
                size,
                b_to_a,
                rate,
                window: p.window,
                secs: p.relay_secs,
            };
            let mut worker = Worker::spawn(
                opts,
                &spec(&running.info, scenario, &format!("rel{r}{size}-")),
            )
            .await?;
            worker.event("ready").await?;
            worker.say("go").await?;
            let result = worker.event("result").await?;
            worker.finish().await?;
            let latency: Latency = serde_json::from_value(result["latency"].clone())?;
            throughputs.push(result["throughput"].as_f64().unwrap_or(0.0));
            p99s.push(latency.p99_us);
            merged.add(deserialize(&latency)?)?;
        }
        let latency = summarize(&merged);
        let mut t = row(label, name, "throughput", median(&throughputs), "msgs/s");
        t.runs = throughputs;
        rows.push(t);
        let mut l = row(label, name, "p99 latency", median(&p99s), "µs");
        l.runs = p99s;
        l.latency = Some((&latency).into());
        rows.push(l);
    }
    Ok(())
}

pub async fn setup(opts: &Options, running: &Running, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let p = &opts.profile;
    let scenario = Scenario::Setup {
        sessions: p.setup_sessions,
        sdp_size: 2_000,
        secs: p.setup_secs,
    };
    let mut worker = Worker::spawn(opts, &spec(&running.info, scenario, "setup")).await?;
    worker.event("ready").await?;
    worker.say("go").await?;
    let result = worker.event("result").await?;
    worker.finish().await?;
    let latency: Latency = serde_json::from_value(result["latency"].clone())?;
    let mut r = row(
        "session setup (offer → answer)",
        &running.info.name,
        "rate",
        result["per_sec"].as_f64().unwrap_or(0.0),
        "offers/s",
    );
    r.latency = Some((&latency).into());
    rows.push(r);
    Ok(())
}

pub async fn storm(
    opts: &Options,
    running: &Running,
    p256: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let p = &opts.profile;
    let scenario = Scenario::Storm {
        first: 0,
        robots: p.storm_robots,
        p256,
        concurrency: p.storm_concurrency,
    };
    let mut worker = Worker::spawn(opts, &spec(&running.info, scenario, "storm")).await?;
    worker.event("ready").await?;
    worker.say("go").await?;
    let result = worker.event("result").await?;
    worker.finish().await?;
    let latency: Latency = serde_json::from_value(result["latency"].clone())?;
    let label = if p256 {
        "registration storm, ECDSA P-256"
    } else {
        "registration storm, Ed25519"
    };
    let mut r = row(
        label,
        &running.info.name,
        "verified registrations",
        result["per_sec"].as_f64().unwrap_or(0.0),
        "per s",
    );
    r.latency = Some((&latency).into());
    rows.push(r);
    Ok(())
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

pub fn peer_available(opts: &Options, name: &str) -> bool {
    match name {
        "bare" => opts.bare_bin.exists(),
        "node" => opts.repo.join("bench/peers/node_modules/ws").exists(),
        "python" => {
            let python = opts.repo.join("target/bench-tools/venv/bin/python");
            let python = if python.exists() {
                python
            } else {
                PathBuf::from("python3")
            };
            std::process::Command::new(python)
                .args(["-c", "import websockets.asyncio.server"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        }
        "matchbox" => opts
            .repo
            .join("target/bench-tools/bin/matchbox_server")
            .exists(),
        _ => false,
    }
}

pub fn describe_machine(repo: &Path) -> Value {
    let run = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .current_dir(repo)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": run("uname", &["-r"]),
        "rustc": run("rustc", &["--version"]),
        "node": run("node", &["--version"]),
        "python": run("python3", &["--version"]),
        "commit": run("git", &["rev-parse", "--short", "HEAD"]),
        "open_files_limit": run("sh", &["-c", "ulimit -n"]),
    })
}

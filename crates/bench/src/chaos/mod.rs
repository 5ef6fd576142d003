//! The chaos and soak load generator (issue 42): robots, people and programs on a cluster
//! (or one node) behind one URL, every action counted in the books, every effect counted
//! out, and the two reconciled at the end. `tests/chaos/run.sh` and `bench/soak.sh` start
//! the servers and inflict the faults; this process keeps the load and the books.
//!
//! Control on stdin, one word a line: `mark NAME` (the phase recoveries are counted in),
//! `stop` (end the load, then verify and write the books). Every `--sample-secs` it
//! appends one JSON line to `--samples` (window p99s, error counts by code).

mod books;
mod people;
mod programs;
mod robot;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio_tungstenite::tungstenite::{self, Message};

pub use books::Books;

use crate::orchestrator::Keys;
use crate::target::{self, Signer};

#[derive(clap::Args, Debug, Clone)]
pub struct ChaosArgs {
    /// The load balancer's (or the one node's) base URL, `http://host:port`.
    #[arg(long)]
    pub url: String,
    /// The admin token of the servers.
    #[arg(long)]
    pub admin_token: String,
    /// Stand-in robots logged in.
    #[arg(long, default_value_t = 300)]
    pub robots: usize,
    /// Operators, each driving its own robot at 15 Hz.
    #[arg(long, default_value_t = 30)]
    pub operators: usize,
    /// Viewers, watching the driven robots in turn.
    #[arg(long, default_value_t = 30)]
    pub viewers: usize,
    /// ARP programs, each driving a robot of its own through the gateway.
    #[arg(long, default_value_t = 20)]
    pub programs: usize,
    /// ARP tool calls per second over all programs.
    #[arg(long, default_value_t = 200.0)]
    pub arp_rate: f64,
    /// Churn: robots reconnect, sessions and programs end and start again about this often
    /// (seconds, jittered); 0 for none.
    #[arg(long, default_value_t = 0.0)]
    pub churn_secs: f64,
    /// Seconds between sample lines.
    #[arg(long, default_value_t = 10.0)]
    pub sample_secs: f64,
    /// Where sample lines go (JSON lines).
    #[arg(long)]
    pub samples: Option<PathBuf>,
    /// Where the books go (JSON) at the end.
    #[arg(long)]
    pub out: PathBuf,
    /// Robot ids are `{prefix}{i}`.
    #[arg(long, default_value = "chaos-")]
    pub prefix: String,
}

/// What every task of the generator shares.
pub struct Shared {
    pub books: Books,
    pub ws_url: String,
    pub operator_token: String,
    pub operator_subject: String,
    pub viewer_token: String,
    stopping: AtomicBool,
    stop_tx: tokio::sync::watch::Sender<bool>,
    churn: f64,
}

impl Shared {
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    pub fn stop_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.stop_tx.subscribe()
    }

    /// When the next churn is due (None without churn): the period, jittered ±50 %.
    pub fn churn_deadline(&self) -> Option<Instant> {
        (self.churn > 0.0)
            .then(|| Instant::now() + Duration::from_secs_f64(self.churn * (0.5 + jitter())))
    }
}

/// A number in [0, 1) from the OS's randomness (no rand crate in the bench).
pub fn jitter() -> f64 {
    let bits = uuid::Uuid::new_v4().as_u128() as u64;
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// robot-agent's reconnect backoff: doubling from 250 ms to 4 s, each wait jittered
/// (half to the full value), reset once connected.
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    pub fn new() -> Backoff {
        Backoff {
            next: Duration::from_millis(250),
        }
    }

    pub fn reset(&mut self) {
        self.next = Duration::from_millis(250);
    }

    pub async fn wait(&mut self, shared: &Shared) {
        let wait = self.next.mul_f64(0.5 + jitter() / 2.0);
        self.next = (self.next * 2).min(Duration::from_secs(4));
        let mut stop = shared.stop_signal();
        if shared.stopping() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
    }
}

pub fn envelope(kind: &str, payload: Value) -> Value {
    target::envelope(kind, &uuid::Uuid::new_v4().to_string(), payload)
}

/// What one read from a task's socket gave.
pub enum Heard {
    /// A text frame's JSON.
    Json(Value),
    /// Nothing to act on: a frame not text, or text not JSON (a breach, in the books).
    Nothing,
    /// The socket ended, and how.
    Ended(&'static str),
}

/// Reads one frame of a task's socket; text that is not JSON is breach `bad_json`.
pub fn heard(
    books: &Books,
    frame: Option<Result<Message, tungstenite::Error>>,
    bad_json: &str,
) -> Heard {
    let text = match frame {
        Some(Ok(Message::Text(text))) => text,
        Some(Ok(Message::Close(_))) | None => return Heard::Ended("closed"),
        Some(Ok(_)) => return Heard::Nothing,
        Some(Err(_)) => return Heard::Ended("error"),
    };
    match serde_json::from_str::<Value>(&text) {
        Ok(message) => Heard::Json(message),
        Err(_) => {
            books.breach(bad_json, text.chars().take(200).collect());
            Heard::Nothing
        }
    }
}

/// The tag a frame carries in its candidate text: whose session, which frame, and the
/// sender's clock (0: none) so an echo measures the round trip.
pub fn frame_tag(session: &str, seq: u64, stamp: u64) -> String {
    format!("chaos={session}/{seq}/{stamp}")
}

pub fn parse_tag(text: &str) -> Option<(&str, u64, u64)> {
    let tag = text.rsplit_once("chaos=")?.1;
    let mut parts = tag.split('/');
    let session = parts.next()?;
    let seq = parts.next()?.parse().ok()?;
    let stamp = parts.next()?.parse().ok()?;
    Some((session, seq, stamp))
}

async fn admin(
    http: &reqwest::Client,
    args: &ChaosArgs,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let mut tries = 0;
    loop {
        tries += 1;
        let mut request = http
            .request(method.clone(), format!("{}{path}", args.url))
            .bearer_auth(&args.admin_token)
            .timeout(Duration::from_secs(10));
        if let Some(body) = &body {
            request = request.json(body);
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => {
                return Ok(response.json().await.unwrap_or(Value::Null))
            }
            Ok(response) if tries >= 20 || response.status().is_client_error() => {
                let status = response.status();
                bail!(
                    "{path}: {status} {}",
                    response.text().await.unwrap_or_default()
                )
            }
            Err(e) if tries >= 20 => bail!("{path}: {e}"),
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Robots (created and enrolled unless they exist), grants and the two tokens.
async fn prepare(
    http: &reqwest::Client,
    args: &ChaosArgs,
    keys: &Keys,
) -> anyhow::Result<(String, String)> {
    let public = keys.ed25519_public_base64();
    let gate = Arc::new(tokio::sync::Semaphore::new(16));
    let mut tasks = Vec::new();
    for i in 0..args.robots {
        let (http, args, gate, public) = (http.clone(), args.clone(), gate.clone(), public.clone());
        let robot = format!("{}{i}", args.prefix);
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await?;
            let created = admin(&http, &args, reqwest::Method::POST, "/v1/robots", Some(json!({"robotId": robot}))).await?;
            let response = http
                .post(format!("{}/v1/enroll", args.url))
                .json(&json!({"robotId": robot, "enrollmentToken": created["enrollmentToken"], "publicKey": public}))
                .send()
                .await?;
            if !response.status().is_success() {
                bail!("enroll {robot}: {}", response.status());
            }
            for (subject, role) in [("chaos-operator", "operator"), ("chaos-viewer", "viewer")] {
                admin(&http, &args, reqwest::Method::PUT, &format!("/v1/robots/{robot}/grants/{subject}"), Some(json!({"role": role}))).await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let mut tokens = Vec::new();
    for subject in ["chaos-operator", "chaos-viewer"] {
        let token = admin(
            http,
            args,
            reqwest::Method::POST,
            "/v1/tokens",
            Some(json!({"subject": subject, "ttlSeconds": 86_400})),
        )
        .await?;
        tokens.push(token["token"].as_str().context("token")?.to_string());
    }
    Ok((tokens[0].clone(), tokens[1].clone()))
}

pub async fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let keys = Keys::new()?;
    let started = Instant::now();
    eprintln!("[chaos] preparing {} robots", args.robots);
    let (operator_token, viewer_token) = prepare(&http, &args, &keys).await?;
    let (stop_tx, _) = tokio::sync::watch::channel(false);
    let shared = Arc::new(Shared {
        books: Books::default(),
        ws_url: format!("{}/ws", args.url.replacen("http", "ws", 1)),
        operator_token,
        operator_subject: "chaos-operator".into(),
        viewer_token,
        stopping: AtomicBool::new(false),
        stop_tx,
        churn: args.churn_secs,
    });
    let tasks = start_load(&shared, &args, Arc::new(keys.ed25519_signer()?)).await;
    println!("{}", json!({"event": "ready"}));
    let sampler = tokio::spawn(sample(shared.clone(), args.clone(), started));
    follow_marks(&shared, started).await;
    eprintln!("[chaos] stopping the load");
    shared.stopping.store(true, Ordering::Relaxed);
    let _ = shared.stop_tx.send(true);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    }
    sampler.abort();
    shared.books.reconcile();
    verify(&http, &args, &shared).await;
    let mut books = shared.books.to_json();
    books["duration_secs"] = json!(started.elapsed().as_secs_f64().round());
    books["load"] = json!({"robots": args.robots, "operators": args.operators, "viewers": args.viewers,
        "programs": args.programs, "arp_rate": args.arp_rate, "churn_secs": args.churn_secs});
    std::fs::write(&args.out, serde_json::to_string_pretty(&books)?)?;
    println!(
        "{}",
        json!({"event": "books", "breaches": books["breaches"]})
    );
    Ok(())
}

/// Starts the robots, then the people and programs on them.
async fn start_load(
    shared: &Arc<Shared>,
    args: &ChaosArgs,
    signer: Arc<Signer>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for i in 0..args.robots {
        let robot = format!("{}{i}", args.prefix);
        tasks.push(tokio::spawn(robot::run(
            shared.clone(),
            robot,
            signer.clone(),
        )));
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Driven robots: operators on 0..operators, programs on the next ones; viewers watch the
    // operators' robots in turn.
    let driven = args.operators.max(1);
    for i in 0..args.operators {
        let robot = format!("{}{i}", args.prefix);
        tasks.push(tokio::spawn(people::run(shared.clone(), robot, true)));
    }
    for i in 0..args.viewers {
        let robot = format!("{}{}", args.prefix, i % driven);
        tasks.push(tokio::spawn(people::run(shared.clone(), robot, false)));
    }
    let per_program = args.arp_rate / args.programs.max(1) as f64;
    for p in 0..args.programs {
        let robot = format!("{}{}", args.prefix, args.operators + p);
        tasks.push(tokio::spawn(programs::run(
            shared.clone(),
            robot,
            p,
            per_program,
        )));
    }
    eprintln!(
        "[chaos] load running: {} robots, {} operators, {} viewers, {} programs at {} calls/s",
        args.robots, args.operators, args.viewers, args.programs, args.arp_rate
    );
    tasks
}

/// Follows stdin until `stop` (or its end): `mark NAME` starts phase NAME.
async fn follow_marks(shared: &Shared, started: Instant) {
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("mark ") {
            shared.books.phases.set(name);
            eprintln!(
                "[chaos] phase {name} at {:.1} s",
                started.elapsed().as_secs_f64()
            );
            println!("{}", json!({"event": "marked", "phase": name}));
        } else if line == "stop" {
            break;
        }
    }
}

/// Every `sample_secs`: window p99s and the running counts.
async fn sample(shared: Arc<Shared>, args: ChaosArgs, started: Instant) {
    let Some(path) = args.samples else { return };
    let mut tick = tokio::time::interval(Duration::from_secs_f64(args.sample_secs));
    tick.tick().await;
    loop {
        tick.tick().await;
        let books = &shared.books;
        let line = json!({
            "t": started.elapsed().as_secs_f64().round(),
            "phase": books.phases.current(),
            "relay": books.relay_rtt.take_window(),
            "arp": books.arp_rtt.take_window(),
            "errors": books.errors.snapshot(),
            "arp_completed": books.counts.get("arp.calls_completed"),
            "frames_received": books.counts.get("frames.robot_received") + books.counts.get("frames.operator_received") + books.counts.get("frames.viewer_received"),
            "robots_logins": books.counts.get("robots.logins"),
            "breaches": books.breaches().len(),
        });
        use std::io::Write;
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = writeln!(file, "{line}");
        }
    }
}

/// After the load: every session record has an end with a reason, every ARP call that ran
/// has its audit record. Bounded waits; what does not hold is a breach.
async fn verify(http: &reqwest::Client, args: &ChaosArgs, shared: &Shared) {
    let books = &shared.books;
    for record in &still_open(http, args, books).await {
        books.breach("session_record_never_ended", record.to_string());
    }
    check_session_records(http, args, books).await;
    // Audit: every key a robot ran has a record naming it (any outcome but refused).
    let executed: Vec<String> = books
        .executed
        .lock()
        .expect("executed")
        .keys()
        .cloned()
        .collect();
    let mut audited: HashMap<String, Vec<String>> = HashMap::new();
    for p in 0..args.programs {
        let robot = format!("{}{}", args.prefix, args.operators + p);
        read_audit(http, args, books, &robot, &mut audited).await;
    }
    let mut pending = 0u64;
    for key in &executed {
        match audited.get(key) {
            Some(outcomes) if outcomes.iter().any(|o| o != "refused") => {
                if !outcomes.iter().any(|o| o == "completed") {
                    pending += 1;
                }
            }
            _ => books.breach("arp_call_ran_without_an_audit_record", key.clone()),
        }
    }
    books.counts.add(
        "verify.audit_records",
        audited.values().map(|v| v.len() as u64).sum(),
    );
    books
        .counts
        .add("verify.executed_without_completed_record", pending);
}

/// The run's session records still open after a bounded wait: sessions end as their
/// sockets close, so the records are given a moment.
async fn still_open(http: &reqwest::Client, args: &ChaosArgs, books: &Books) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut open: Vec<Value> = Vec::new();
    while Instant::now() < deadline {
        match admin(
            http,
            args,
            reqwest::Method::GET,
            "/v1/sessions?active=true&limit=10000",
            None,
        )
        .await
        {
            Ok(Value::Array(records)) => {
                open = records
                    .into_iter()
                    .filter(|r| {
                        r["robotId"]
                            .as_str()
                            .is_some_and(|id| id.starts_with(&args.prefix))
                    })
                    .collect();
                if open.is_empty() {
                    break;
                }
            }
            Ok(other) => books.breach("sessions_api_bad_answer", other.to_string()),
            Err(e) => books.error(&format!("verify:{e}")),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    open
}

/// Every session record of every robot has ended, with a reason.
async fn check_session_records(http: &reqwest::Client, args: &ChaosArgs, books: &Books) {
    let mut records = 0u64;
    for i in 0..args.robots {
        let robot = format!("{}{i}", args.prefix);
        if let Ok(Value::Array(list)) = admin(
            http,
            args,
            reqwest::Method::GET,
            &format!("/v1/sessions?robotId={robot}&limit=10000"),
            None,
        )
        .await
        {
            for record in list {
                records += 1;
                if record["endedAt"].is_null()
                    || record["endReason"].as_str().unwrap_or("").is_empty()
                {
                    books.breach("session_record_without_an_end_reason", record.to_string());
                }
            }
        }
    }
    books.counts.add("verify.session_records", records);
}

/// Reads `robot`'s audit, page by page, into subject|key → the outcomes recorded.
async fn read_audit(
    http: &reqwest::Client,
    args: &ChaosArgs,
    books: &Books,
    robot: &str,
    audited: &mut HashMap<String, Vec<String>>,
) {
    let mut after: Option<String> = None;
    loop {
        let mut path = format!("/v1/robots/{robot}/audit?format=jsonl&limit=10000");
        if let Some(cursor) = &after {
            path.push_str(&format!("&after={cursor}"));
        }
        let response = http
            .get(format!("{}{path}", args.url))
            .bearer_auth(&args.admin_token)
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        let Ok(response) = response else {
            books.breach("audit_unreadable", robot.to_string());
            break;
        };
        after = response
            .headers()
            .get("x-next-cursor")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = response.text().await.unwrap_or_default();
        for line in text.lines() {
            let Ok(record) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if let (Some(key), Some(subject)) = (
                record["idempotencyKey"].as_str(),
                record["subject"].as_str(),
            ) {
                audited
                    .entry(format!("{subject}|{key}"))
                    .or_default()
                    .push(record["outcome"].as_str().unwrap_or("").to_string());
            }
        }
        if after.is_none() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_tags_round_trip_and_noise_is_none() {
        let tag = frame_tag("chaos-1", 7, 99);
        let text = format!("candidate:1 1 UDP 1 127.0.0.1 9 typ host {tag}");
        assert_eq!(parse_tag(&text), Some(("chaos-1", 7, 99)));
        assert_eq!(parse_tag("candidate:1 1 UDP"), None);
        assert_eq!(parse_tag("chaos=a/b/c"), None);
    }

    #[test]
    fn a_breach_is_counted_and_reconcile_finds_calls_that_never_ran() {
        let books = Books::default();
        assert!(books.executed("s|k1"));
        assert!(!books.executed("s|k1"), "a second run is a breach");
        books.completed_keys.lock().unwrap().insert("s|k2".into());
        books.reconcile();
        let breaches = books.breaches();
        assert_eq!(breaches["arp_call_executed_twice"].0, 1);
        assert_eq!(
            breaches["arp_completed_without_running"].1,
            "[warm-up] s|k2"
        );
    }

    #[test]
    fn jitter_is_in_range() {
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j));
        }
    }
}

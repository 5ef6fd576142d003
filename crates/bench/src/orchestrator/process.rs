//! Starting and stopping what is measured: our server (with its robots and a client token
//! prepared over the admin API), the peer relays, the load-generator worker processes and
//! the optional perf profiler.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use super::Options;
use crate::target::{Kind, TargetInfo};
use crate::worker::{Scenario, Spec};

pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(super) async fn wait_listening(port: u16, child: &mut Child) -> anyhow::Result<()> {
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
/// Server flags for every benchmark run: the relay is measured, not the abuse limits. The
/// load generator sends far more than signalling ever does, all from one address, and
/// session setup opens a new session per offer on each client socket (ended ids stay
/// claimed for the grace period, so the per-socket cap of 16 would stop the loop).
pub(super) const UNLIMITED: [&str; 18] = [
    "--rate-limit",
    "100000000",
    "--rate-burst",
    "100000000",
    "--send-queue",
    "4096",
    "--relay-bytes-per-sec",
    "0",
    "--max-connections-per-ip",
    "0",
    "--max-tcp-connections-per-ip",
    "0",
    "--max-sessions-per-connection",
    "100000000",
    "--max-viewer-sessions-per-subject",
    "0",
    "--max-viewer-sessions-per-robot",
    "0",
];

pub struct Running {
    pub info: TargetInfo,
    pub child: Child,
    _dir: Option<TempDir>,
}

impl Running {
    /// Our server started by `ours_command`, its files in `dir` (removed when it stops).
    pub(super) fn ours(info: TargetInfo, child: Child, dir: TempDir) -> Running {
        Running {
            info,
            child,
            _dir: Some(dir),
        }
    }

    /// A system under test started elsewhere (the cluster benchmark's nodes).
    pub(super) fn adopt(info: TargetInfo, child: Child) -> Running {
        Running {
            info,
            child,
            _dir: None,
        }
    }

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

pub(super) struct TempDir(pub(super) PathBuf);

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
    /// The robots' P-256 key, PKCS#8 DER.
    pub(super) fn p256_pkcs8(&self) -> &[u8] {
        &self.p256_pkcs8
    }

    /// Our server's target description with these keys and a client token.
    pub(super) fn target_info(&self, name: &str, ws_url: &str, token: &str) -> TargetInfo {
        TargetInfo {
            name: name.into(),
            kind: Kind::Ours,
            ws_url: ws_url.into(),
            robot_ws_url: None,
            client_token: Some(token.into()),
            ed25519_pkcs8: Some(STANDARD.encode(&self.ed25519_pkcs8)),
            p256_pkcs8: Some(STANDARD.encode(&self.p256_pkcs8)),
        }
    }

    /// The robots' raw Ed25519 public key, base64 (the chaos generator enrolls with it).
    pub fn ed25519_public_base64(&self) -> String {
        STANDARD.encode(&self.ed25519_public)
    }

    /// The storm robots' P-256 public key, an SPKI PEM.
    pub fn p256_spki_pem(&self) -> &str {
        &self.p256_spki_pem
    }

    /// A signer with the robots' Ed25519 key.
    pub fn ed25519_signer(&self) -> anyhow::Result<crate::target::Signer> {
        Ok(crate::target::Signer::Ed25519(
            Ed25519KeyPair::from_pkcs8(&self.ed25519_pkcs8).map_err(|e| anyhow::anyhow!("{e}"))?,
        ))
    }

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

pub(super) const ADMIN: &str = "bench-admin-token";

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
    let launch = match opts.server_cpu() {
        Some(cpu) => Launch::Pinned(cpu),
        None => Launch::Plain,
    };
    let mut child = ours_command(&opts.server_bin, port, &database_url, launch)
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
            robot_ws_url: None,
            client_token: Some(token),
            ed25519_pkcs8: Some(STANDARD.encode(&keys.ed25519_pkcs8)),
            p256_pkcs8: Some(STANDARD.encode(&keys.p256_pkcs8)),
        },
        child,
        _dir: Some(TempDir(dir)),
    })
}

/// How our server is started: as itself, or under callgrind counting its instructions
/// (`signalling-bench instructions`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Launch<'a> {
    Plain,
    /// Confined to one CPU (`--pin`).
    Pinned(usize),
    /// `valgrind --tool=callgrind`, its counts dumped to this file (and `FILE.N` for the
    /// dumps asked for while it runs).
    Callgrind(&'a std::path::Path),
}

/// The command that starts our server on `port` with the benchmarks' flags.
pub(super) fn ours_command(
    server_bin: &std::path::Path,
    port: u16,
    database_url: &str,
    launch: Launch<'_>,
) -> Command {
    let mut command = match launch {
        Launch::Plain => Command::new(server_bin),
        Launch::Pinned(cpu) => command_on(Some(cpu), server_bin),
        Launch::Callgrind(out) => {
            let mut c = Command::new("valgrind");
            // Names written out in every dump: each dump can be read on its own
            // (callgrind_annotate), not only with the ones before it.
            c.args([
                "--tool=callgrind",
                "--quiet",
                "--compress-strings=no",
                "--compress-pos=no",
            ])
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(server_bin);
            c
        }
    };
    command
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-token",
            ADMIN,
            "--database-url",
            database_url,
        ])
        .args(UNLIMITED)
        .env("RUST_LOG", "warn")
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .stdout(Stdio::null())
        .kill_on_drop(true);
    command
}

pub(super) async fn fresh_postgres_schema(url: &str) -> anyhow::Result<String> {
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
    Ok(with_search_path(url, &schema))
}

/// `url` with its connections' search_path set to `schema`.
fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

pub(super) async fn admin(
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
pub(super) async fn prepare(
    http: &reqwest::Client,
    base: &str,
    keys: &Keys,
    robots: usize,
    storm: usize,
) -> anyhow::Result<String> {
    let ed = STANDARD.encode(&keys.ed25519_public);
    let jobs = enrollments(robots, storm, &ed, &keys.p256_spki_pem);
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

/// Creates robot `robot_id`, enrolls it with `public_key` and, with `grant` (subject,
/// role), grants it.
pub(super) async fn enroll_robot(
    http: &reqwest::Client,
    base: &str,
    robot_id: &str,
    public_key: &str,
    grant: Option<(&str, &str)>,
) -> anyhow::Result<()> {
    let created = admin(
        http,
        reqwest::Method::POST,
        format!("{base}/v1/robots"),
        json!({"robotId": robot_id}),
    )
    .await?;
    let response = http
        .post(format!("{base}/v1/enroll"))
        .json(&json!({"robotId": robot_id, "enrollmentToken": created["enrollmentToken"], "publicKey": public_key}))
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("enroll {robot_id}: {}", response.status());
    }
    if let Some((subject, role)) = grant {
        admin(
            http,
            reqwest::Method::PUT,
            format!("{base}/v1/robots/{robot_id}/grants/{subject}"),
            json!({"role": role}),
        )
        .await?;
    }
    Ok(())
}

/// (robot id, public key, viewer grant for `bench`) for every robot to prepare.
fn enrollments(
    robots: usize,
    storm: usize,
    ed25519: &str,
    p256: &str,
) -> Vec<(String, String, bool)> {
    let mut jobs: Vec<(String, String, bool)> = Vec::new();
    for i in 0..robots {
        jobs.push((format!("bench-{i}"), ed25519.to_string(), true));
    }
    for i in 0..storm {
        jobs.push((format!("storm-ed-{i}"), ed25519.to_string(), false));
        jobs.push((format!("storm-p256-{i}"), p256.to_string(), false));
    }
    jobs
}

/// A command for `program`, confined to `cpu` when given (`taskset`, which then runs the
/// program in its own place: the child's pid is the program's).
pub(super) fn command_on(cpu: Option<usize>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match cpu {
        Some(cpu) => {
            let mut command = Command::new("taskset");
            command.arg("-c").arg(cpu.to_string()).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// Starts a peer relay.
pub async fn start_peer(opts: &Options, name: &str) -> anyhow::Result<Running> {
    let port = free_port()?;
    let peers = opts.repo.join("bench/peers");
    let cpu = opts.server_cpu();
    let (mut command, kind, path) = match name {
        "bare" => {
            let mut c = command_on(cpu, &opts.bare_bin);
            c.arg(format!("127.0.0.1:{port}"));
            (c, Kind::Relay, "/")
        }
        "node" => {
            let mut c = command_on(cpu, "node");
            c.arg(peers.join("node-relay.js"))
                .arg(port.to_string())
                .current_dir(&peers);
            (c, Kind::Relay, "/")
        }
        "python" => {
            let mut c = command_on(cpu, python(opts));
            c.arg(peers.join("py-relay.py")).arg(port.to_string());
            (c, Kind::Relay, "/")
        }
        "matchbox" => {
            let mut c = command_on(
                cpu,
                opts.repo.join("target/bench-tools/bin/matchbox_server"),
            );
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
    Ok(Running {
        info: TargetInfo {
            name: peer_label(name).into(),
            kind,
            ws_url: format!("ws://127.0.0.1:{port}{path}"),
            robot_ws_url: None,
            client_token: None,
            ed25519_pkcs8: None,
            p256_pkcs8: None,
        },
        child,
        _dir: None,
    })
}

/// How a peer is named in the results.
fn peer_label(name: &str) -> &'static str {
    match name {
        "bare" => "bare relay (Rust)",
        "node" => "Node.js ws relay",
        "python" => "Python websockets relay",
        _ => "matchbox_server",
    }
}

/// The Python of bench/run.sh's venv, else the system's.
fn python(opts: &Options) -> PathBuf {
    let venv = opts.repo.join("target/bench-tools/venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// A spawned worker process and its line-oriented control channel.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Worker {
    pub async fn spawn(opts: &Options, spec: &Spec) -> anyhow::Result<Worker> {
        let mut child = command_on(opts.generator_cpu(), &opts.bench_bin)
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

    pub async fn event(&mut self, name: &str) -> anyhow::Result<Value> {
        let deadline = Duration::from_secs(600);
        loop {
            let line = tokio::time::timeout(deadline, self.lines.next_line())
                .await
                .context("worker silent for 10 minutes")??
                .with_context(|| format!("worker ended before `{name}`"))?;
            if let Some(value) = event_named(&line, name) {
                return Ok(value);
            }
        }
    }

    pub async fn say(&mut self, word: &str) -> anyhow::Result<()> {
        self.stdin.write_all(format!("{word}\n").as_bytes()).await?;
        self.stdin.flush().await?;
        Ok(())
    }

    pub async fn finish(mut self) -> anyhow::Result<()> {
        let _ = self.say("exit").await;
        drop(self.stdin);
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await??;
        if !status.success() {
            bail!("worker failed: {status}");
        }
        Ok(())
    }
}

/// The worker's JSON event on `line` if it is `name`; other events and any other output
/// (a stray log line) are skipped.
fn event_named(line: &str, name: &str) -> Option<Value> {
    let value: Value = serde_json::from_str(line).ok()?;
    (value["event"] == name).then_some(value)
}

pub fn spec(info: &TargetInfo, scenario: Scenario, tag: &str) -> Spec {
    Spec {
        target: info.clone(),
        scenario,
        tag: tag.into(),
    }
}

/// With BENCH_PERF_OUT set, samples the target with `perf record -p` during a benchmark
/// (the profiles behind docs/benchmarks.md).
pub struct Profiler(Option<Child>);

impl Profiler {
    pub fn start(running: &Running, what: &str) -> Profiler {
        let (Ok(dir), Some(pid)) = (std::env::var("BENCH_PERF_OUT"), running.child.id()) else {
            return Profiler(None);
        };
        let out = perf_data_path(&dir, &running.info.name, what);
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

    pub async fn stop(self) {
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

/// Where perf writes the profile of `target` during `what`.
fn perf_data_path(dir: &str, target: &str, what: &str) -> String {
    format!(
        "{dir}/{}-{what}.perf.data",
        target.replace([' ', '(', ')', '.'], "_")
    )
}

/// Whether peer `name` is installed (bench/run.sh installs them on first use).
pub fn peer_available(opts: &Options, name: &str) -> bool {
    match name {
        "bare" => opts.bare_bin.exists(),
        "node" => opts.repo.join("bench/peers/node_modules/ws").exists(),
        "python" => std::process::Command::new(python(opts))
            .args(["-c", "import websockets.asyncio.server"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false),
        "matchbox" => opts
            .repo
            .join("target/bench-tools/bin/matchbox_server")
            .exists(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(repo: PathBuf) -> Options {
        Options {
            profile: super::super::SMOKE,
            out: repo.join("out"),
            server_bin: repo.join("no-server"),
            bench_bin: repo.join("no-bench"),
            bare_bin: repo.join("no-bare-relay"),
            peers: Vec::new(),
            postgres_url: None,
            repo,
            only: Vec::new(),
            pin: false,
        }
    }

    #[test]
    fn pinned_commands_run_under_taskset_and_plain_ones_as_themselves() {
        let pinned = command_on(Some(1), "/bin/server");
        let pinned = pinned.as_std();
        assert_eq!(pinned.get_program(), "taskset");
        let args: Vec<_> = pinned.get_args().collect();
        assert_eq!(args, ["-c", "1", "/bin/server"]);
        let plain = command_on(None, "/bin/server");
        assert_eq!(plain.as_std().get_program(), "/bin/server");
        assert_eq!(plain.as_std().get_args().count(), 0);
        let mut opts = options(PathBuf::from("/repo"));
        assert_eq!((opts.server_cpu(), opts.generator_cpu()), (None, None));
        opts.pin = true;
        assert_eq!(
            (opts.server_cpu(), opts.generator_cpu()),
            (Some(1), Some(0))
        );
    }

    #[test]
    fn keys_make_an_ed25519_key_and_a_p256_spki_pem() {
        let keys = Keys::new().unwrap();
        assert_eq!(keys.ed25519_public.len(), 32);
        Ed25519KeyPair::from_pkcs8(&keys.ed25519_pkcs8).unwrap();
        let body: String = keys
            .p256_spki_pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        assert!(keys
            .p256_spki_pem
            .starts_with("-----BEGIN PUBLIC KEY-----\n"));
        assert!(keys.p256_spki_pem.ends_with("-----END PUBLIC KEY-----\n"));
        let der = STANDARD.decode(body).unwrap();
        // 26 bytes of SPKI header for P-256, then the 65-byte uncompressed point.
        assert_eq!(der.len(), 91);
        assert_eq!(der[0..2], [0x30, 0x59]);
        assert_eq!(der[26], 0x04, "uncompressed point");
        let rng = SystemRandom::new();
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &keys.p256_pkcs8, &rng)
                .unwrap();
        assert_eq!(&der[26..], pair.public_key().as_ref());
    }

    #[test]
    fn enrollments_cover_bench_and_both_storm_key_types() {
        let jobs = enrollments(2, 1, "ED", "PEM");
        let expected = [
            ("bench-0", "ED", true),
            ("bench-1", "ED", true),
            ("storm-ed-0", "ED", false),
            ("storm-p256-0", "PEM", false),
        ];
        assert_eq!(jobs.len(), expected.len());
        for ((id, key, grant), (want_id, want_key, want_grant)) in jobs.iter().zip(expected) {
            assert_eq!(
                (id.as_str(), key.as_str(), *grant),
                (want_id, want_key, want_grant)
            );
        }
        assert!(enrollments(0, 0, "ED", "PEM").is_empty());
    }

    #[test]
    fn the_search_path_option_is_appended_to_the_url() {
        assert_eq!(
            with_search_path("postgres://u@h/db", "bench_1"),
            "postgres://u@h/db?options=-csearch_path%3Dbench_1"
        );
        assert_eq!(
            with_search_path("postgres://u@h/db?sslmode=disable", "bench_1"),
            "postgres://u@h/db?sslmode=disable&options=-csearch_path%3Dbench_1"
        );
    }

    #[test]
    fn worker_events_are_picked_by_name_and_noise_is_skipped() {
        let ready = event_named(r#"{"event":"ready","sockets":3}"#, "ready").unwrap();
        assert_eq!(ready["sockets"], 3);
        assert!(event_named(r#"{"event":"result"}"#, "ready").is_none());
        assert!(event_named("WARN something happened", "ready").is_none());
        assert!(event_named("", "ready").is_none());
    }

    #[test]
    fn peers_have_result_labels() {
        assert_eq!(peer_label("bare"), "bare relay (Rust)");
        assert_eq!(peer_label("node"), "Node.js ws relay");
        assert_eq!(peer_label("python"), "Python websockets relay");
        assert_eq!(peer_label("matchbox"), "matchbox_server");
    }

    #[test]
    fn perf_files_are_named_after_the_target_without_odd_characters() {
        assert_eq!(
            perf_data_path("/tmp/p", "ours (PostgreSQL)", "relay"),
            "/tmp/p/ours__PostgreSQL_-relay.perf.data"
        );
        assert_eq!(
            perf_data_path("d", "Node.js ws relay", "relay"),
            "d/Node_js_ws_relay-relay.perf.data"
        );
    }

    #[test]
    fn missing_peers_are_unavailable_and_python_falls_back_to_the_system() {
        let empty = std::env::temp_dir().join(format!("bench-test-{}", uuid::Uuid::new_v4()));
        let opts = options(empty);
        for peer in ["bare", "node", "matchbox", "nonsense"] {
            assert!(!peer_available(&opts, peer), "{peer}");
        }
        assert_eq!(python(&opts), PathBuf::from("python3"));
    }

    #[tokio::test]
    async fn unknown_peers_are_refused_before_anything_starts() {
        let opts = options(std::env::temp_dir());
        let error = start_peer(&opts, "nonsense").await.err().expect("refused");
        assert_eq!(error.to_string(), "unknown peer nonsense");
    }
}

//! The built `robot-agent` binary's local ARP socket (issue 41 #2, #10):
//! `enroll` writes the socket's token, `run --arp-listen` requires one
//! unless told `--arp-no-token` on loopback, refuses browser origins, and
//! takes its secret from a file. Real processes, real sockets, port 0.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

/// Longest wait for any one thing.
const WAIT: Duration = Duration::from_secs(20);

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "robot-agent-cli-{tag}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn agent(config_dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_robot-agent"));
    command
        .arg("--config-dir")
        .arg(config_dir)
        .env_remove("ROBOT_AGENT_ARP_TOKENS")
        .env_remove("ROBOT_AGENT_ARP_TOKEN_FILE")
        .env_remove("ROBOT_AGENT_ARP_NO_TOKEN")
        .env_remove("ROBOT_AGENT_ARP_ALLOW_ORIGINS")
        .env_remove("ROBOT_AGENT_ARP_LISTEN")
        .env_remove("ROBOT_AGENT_CONFIG")
        .env_remove("ROBOT_AGENT_SERVER")
        .env_remove("ROBOT_AGENT_ROBOT_ID")
        .env_remove("ROBOT_AGENT_DRIVER")
        .env("ROBOT_AGENT_DATA_DIR", config_dir.join("data"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Enrolls `dir` against a one-shot HTTP server that accepts anything.
async fn enroll(dir: &Path) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.expect("accept");
        let mut seen = Vec::new();
        let mut chunk = [0u8; 4096];
        // The request is small: read until its body (after the blank line) is in.
        while !String::from_utf8_lossy(&seen).contains("}") {
            let n = tcp.read(&mut chunk).await.expect("read");
            assert!(n > 0, "request ended early");
            seen.extend_from_slice(&chunk[..n]);
        }
        let body = r#"{"robotId":"cli-robot","enrolled":true}"#;
        let response = format!(
            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(response.as_bytes()).await.expect("write");
    });
    let out = tokio::time::timeout(
        WAIT,
        agent(dir)
            .args(["enroll", "--server", &url, "--robot-id", "cli-robot"])
            .env("ROBOT_AGENT_ENROLLMENT_TOKEN", "enrollment-token")
            .output(),
    )
    .await
    .expect("enroll in time")
    .expect("runs");
    server.await.expect("fake server");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "enroll failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs `robot-agent run ARGS` expecting it to refuse to start.
async fn refused(dir: &Path, args: &[&str]) -> String {
    let out = tokio::time::timeout(WAIT, agent(dir).arg("run").args(args).output())
        .await
        .unwrap_or_else(|_| panic!("`run {}` kept running instead of refusing", args.join(" ")))
        .expect("runs");
    assert!(!out.status.success(), "`run {}` succeeded", args.join(" "));
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// A running agent and the address its ARP socket got.
struct Running {
    _child: Child,
    addr: String,
    log: Vec<String>,
}

async fn start(dir: &Path, args: &[&str]) -> Running {
    let mut child = agent(dir)
        .args(["--log-format", "json", "run", "--driver", "sim"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut log = Vec::new();
    let addr = tokio::time::timeout(WAIT, async {
        loop {
            let line = lines
                .next_line()
                .await
                .expect("read stderr")
                .unwrap_or_else(|| panic!("the agent exited: {log:#?}"));
            let value: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            log.push(line);
            if value["fields"]["message"] == "ARP WebSocket listening" {
                break value["fields"]["addr"].as_str().expect("addr").to_owned();
            }
        }
    })
    .await
    .expect("the ARP socket listening in time");
    // Keep the pipe drained so the agent never blocks on its log.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Running {
        _child: child,
        addr,
        log,
    }
}

/// The HTTP status of a WebSocket upgrade (101 when it upgraded).
async fn upgrade(addr: &str, headers: &[(&str, &str)]) -> u16 {
    match robot_agent::testutil::ws_upgrade(addr, headers).await {
        Ok(_) => 101,
        Err(status) => status,
    }
}

fn secret_of(token_file: &Path) -> String {
    let text = std::fs::read_to_string(token_file).expect("token file");
    let (role, secret) = text.trim().split_once(':').expect("ROLE:SECRET");
    assert_eq!(role, "operator");
    secret.to_owned()
}

/// An ARP socket without a token, without one on a network address, with
/// contradicting flags, or with a bad origin: the agent refuses to start.
async fn bad_arp_settings_are_refused(dir: &Path) {
    let bare = temp_dir("no-token");
    let server = [
        "--server",
        "ws://127.0.0.1:9/ws",
        "--robot-id",
        "r",
        "--driver",
        "sim",
    ];
    let listen = |addr: &'static str| [&server[..], &["--arp-listen", addr]].concat();
    let error = refused(&bare, &listen("127.0.0.1:0")).await;
    assert!(
        error.contains("needs a token") && error.contains("robot-agent enroll"),
        "{error}"
    );
    let error = refused(
        &bare,
        &[&listen("0.0.0.0:0")[..], &["--arp-no-token"]].concat(),
    )
    .await;
    assert!(
        error.contains("refused on the non-loopback address"),
        "{error}"
    );
    let error = refused(
        dir,
        &[
            "--arp-listen",
            "127.0.0.1:0",
            "--arp-no-token",
            "--arp-token",
            "operator:x",
        ],
    )
    .await;
    assert!(error.contains("contradict"), "{error}");
    let error = refused(
        dir,
        &[
            "--arp-listen",
            "127.0.0.1:0",
            "--arp-allow-origin",
            "https://ok.example/app",
        ],
    )
    .await;
    assert!(error.contains("invalid --arp-allow-origin"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enroll_writes_the_arp_token_and_run_requires_one() {
    let dir = temp_dir("enrolled");
    let said = enroll(&dir).await;
    let token_file = dir.join("arp-token");
    assert!(token_file.exists(), "enroll wrote no ARP token: {said}");
    let mode = std::fs::metadata(&token_file)
        .expect("meta")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "the ARP token file is private");
    let secret = secret_of(&token_file);
    assert!(
        secret.len() >= 22,
        "at least 128 bits: {} chars",
        secret.len()
    );

    // The enrolled token is the socket's by default; browsers are refused.
    let agent = start(&dir, &["--arp-listen", "127.0.0.1:0"]).await;
    let bearer = format!("Bearer {secret}");
    assert_eq!(
        upgrade(&agent.addr, &[("authorization", &bearer)]).await,
        101
    );
    assert_eq!(upgrade(&agent.addr, &[]).await, 401, "no token");
    assert_eq!(
        upgrade(
            &agent.addr,
            &[
                ("authorization", &bearer),
                ("origin", "https://evil.example")
            ]
        )
        .await,
        403,
        "a web page, even one holding the token"
    );
    drop(agent);

    // No token anywhere: refused with a clear error, unless --arp-no-token on loopback.
    bad_arp_settings_are_refused(&dir).await;
}

/// Issue 41 #10: a secret on the command line is warned about; a token
/// file keeps it out of /proc/PID/cmdline. Listed origins get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_come_from_files_and_a_command_line_secret_is_warned_about() {
    let dir = temp_dir("token-file");
    enroll(&dir).await;
    let file = dir.join("tools.tokens");
    std::fs::write(&file, "# the planner\noperator:from-a-file\n").expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let agent = start(
        &dir,
        &[
            "--arp-listen",
            "127.0.0.1:0",
            "--arp-token-file",
            file.to_str().expect("utf-8 path"),
            "--arp-token",
            "viewer:on-the-command-line",
            "--arp-allow-origin",
            "https://Console.Example:8443/",
        ],
    )
    .await;
    assert!(
        agent
            .log
            .iter()
            .any(|l| l.contains("--arp-token on the command line is visible")),
        "no warning about the command-line secret: {:#?}",
        agent.log
    );
    assert_eq!(
        upgrade(&agent.addr, &[("authorization", "Bearer from-a-file")]).await,
        101
    );
    assert_eq!(
        upgrade(
            &agent.addr,
            &[("authorization", "Bearer on-the-command-line")]
        )
        .await,
        101
    );
    let enrolled = format!("Bearer {}", secret_of(&dir.join("arp-token")));
    assert_eq!(
        upgrade(&agent.addr, &[("authorization", &enrolled)]).await,
        401,
        "an explicit file replaces the default"
    );
    assert_eq!(
        upgrade(
            &agent.addr,
            &[
                ("authorization", "Bearer from-a-file"),
                ("origin", "https://console.example:8443")
            ]
        )
        .await,
        101,
        "a listed origin"
    );
    assert_eq!(
        upgrade(
            &agent.addr,
            &[
                ("authorization", "Bearer from-a-file"),
                ("origin", "https://console.example")
            ]
        )
        .await,
        403,
        "another port is another origin"
    );
}

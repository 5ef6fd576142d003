//! The built `arp-bridge` binary's token sources (issue 41 #10): a token
//! file, robot-agent's own `ROLE:SECRET` one included, and a warning for a
//! secret on the command line. A WebSocket server on 127.0.0.1:0 records
//! the `Authorization` header the bridge sends.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

const WAIT: Duration = Duration::from_secs(15);

/// Accepts one WebSocket and reports its `Authorization` header.
async fn recording_server() -> (String, oneshot::Receiver<Option<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}/", listener.local_addr().expect("addr"));
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut seen = None;
        // The callback's error type is tungstenite's (an HTTP response).
        #[allow(clippy::result_large_err)]
        let callback = |request: &Request, response: Response| {
            seen = request
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            Ok(response)
        };
        let ws = tokio_tungstenite::accept_hdr_async(tcp, callback).await;
        let _ = tx.send(seen);
        // Held open until the bridge goes.
        if let Ok(mut ws) = ws {
            use futures_util::StreamExt;
            while let Some(Ok(_)) = ws.next().await {}
        }
    });
    (url, rx)
}

/// Runs the bridge until it says it is ready; its stderr and the header
/// the server saw.
async fn bridge(args: &[&str]) -> (String, Option<String>) {
    let (url, seen) = recording_server().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_arp-bridge"))
        .args(["--url", &url])
        .args(args)
        .env_remove("ARP_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("ready in time")
        .expect("read")
        .expect("a line");
    let ready: Value = serde_json::from_str(&ready).expect("JSON");
    assert_eq!(ready["params"]["ok"], true, "{ready}");
    let header = tokio::time::timeout(WAIT, seen)
        .await
        .expect("in time")
        .expect("server");
    drop(child.stdin.take());
    let mut stderr = String::new();
    let mut pipe = child.stderr.take().expect("stderr");
    tokio::time::timeout(WAIT, pipe.read_to_string(&mut stderr))
        .await
        .expect("the bridge ends with its stdin")
        .expect("read stderr");
    (stderr, header)
}

#[tokio::test]
async fn a_token_file_is_used_and_robot_agents_role_prefix_is_dropped() {
    let dir = std::env::temp_dir().join(format!("arp-bridge-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("arp-token");
    // What `robot-agent enroll` writes.
    std::fs::write(&file, "operator:Zm9vYmFyYmF6cXV4\n").expect("write");
    let (stderr, header) = bridge(&["--token-file", file.to_str().expect("path")]).await;
    assert_eq!(
        header.as_deref(),
        Some("Bearer Zm9vYmFyYmF6cXV4"),
        "the bridge sent robot-agent's token file as is"
    );
    assert!(!stderr.contains("warning"), "{stderr}");
    std::fs::write(&file, "  plain-secret\n").expect("write");
    let (_, header) = bridge(&["--token-file", file.to_str().expect("path")]).await;
    assert_eq!(header.as_deref(), Some("Bearer plain-secret"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_token_on_the_command_line_is_warned_about() {
    let (stderr, header) = bridge(&["--token", "cmdline-secret"]).await;
    assert_eq!(header.as_deref(), Some("Bearer cmdline-secret"));
    assert!(
        stderr.contains("warning: --token is visible to every user"),
        "no warning about the secret on the command line; stderr: {stderr:?}"
    );
    assert!(
        !stderr.contains("cmdline-secret"),
        "the secret itself is never printed"
    );
}

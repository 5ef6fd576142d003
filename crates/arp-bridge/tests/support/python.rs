//! Python examples run as tests (the MCP hosts on the official SDK, the ARP client): shared
//! by arp-bridge's tests and agent-server-tests' (`#[path]`), which cannot depend on each
//! other.

use std::time::Duration;

use tokio::process::Command;

/// Whether `python3` can import `module`; if not, says that the test is skipped and how to
/// install it.
pub async fn has_module(module: &str, install: &str) -> bool {
    let check = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .await;
    let found = check.is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED: python3 with {module} is not installed ({install})");
    }
    found
}

/// `python3 script args…` with `env` added, for at most `limit`: its stdout (printed too),
/// once it has exited 0.
pub async fn run(script: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> String {
    let run = Command::new("python3")
        .arg(script)
        .args(args)
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(limit, run)
        .await
        .expect("the script finishes in time")
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "{script} failed:\n{stdout}\n{stderr}"
    );
    stdout
}

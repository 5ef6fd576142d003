//! `--driver exec:COMMAND`: a child process speaking the JSON-RPC line
//! protocol (see [`super::lines`]) on its stdin/stdout.
//!
//! The command runs through `/bin/sh -c`, so arguments and environment work
//! as on a shell. Its stderr is passed through to the agent's stderr. If it
//! exits or crashes it is restarted with backoff; meanwhile the controller
//! is told the driver is unavailable and holds the robot stopped.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use super::lines::{self, ConnectionEnd, LINE_CHANNEL};
use super::{DriverEnd, DriverOptions, RestartBackoff};
use crate::safety::StopReason;

/// A child that stayed up this long is considered healthy again, so the
/// next crash restarts it quickly.
const HEALTHY_AFTER: Duration = Duration::from_secs(30);

pub async fn run(command: String, mut end: DriverEnd, options: DriverOptions) {
    let mut backoff = RestartBackoff::new(options.restart_initial, options.restart_max);
    let mut first = true;
    loop {
        let started = tokio::time::Instant::now();
        let outcome = run_once(&command, &mut end, first).await;
        first = false;
        let reason = match outcome {
            Ok(ConnectionEnd::ControllerGone) => return,
            Ok(ConnectionEnd::Lost) => "driver process exited".to_owned(),
            Err(e) => format!("cannot start driver: {e}"),
        };
        tracing::warn!(command = %command, %reason, "driver down; restarting");
        if started.elapsed() >= HEALTHY_AFTER {
            backoff.reset();
        }
        if !lines::wait_out(&mut end, reason, backoff.next_delay()).await {
            return;
        }
    }
}

async fn run_once(
    command: &str,
    end: &mut DriverEnd,
    first: bool,
) -> std::io::Result<ConnectionEnd> {
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        // If the agent dies, the driver must not keep the robot moving.
        .kill_on_drop(true)
        .spawn()?;
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(std::io::Error::other("child has no pipes"));
    };
    let (in_tx, mut lines_in) = mpsc::channel(LINE_CHANNEL);
    let (lines_out, mut out_rx) = mpsc::channel::<String>(LINE_CHANNEL);
    let reader = tokio::spawn(lines::read_lines(BufReader::new(stdout), in_tx));
    let writer = tokio::spawn(async move {
        while let Some(line) = out_rx.recv().await {
            if stdin.write_all(line.as_bytes()).await.is_err()
                || stdin.write_all(b"\n").await.is_err()
                || stdin.flush().await.is_err()
            {
                break;
            }
        }
    });
    let reason = if first {
        StopReason::DriverStarted
    } else {
        StopReason::DriverRestarted
    };
    let outcome = lines::serve(&mut lines_in, &lines_out, end, reason).await;
    drop(lines_out);
    writer.abort();
    reader.abort();
    // The child may still be running (lost pipes, agent shutdown): it must
    // not be left driving the robot unsupervised.
    let _ = child.start_kill();
    let status = child.wait().await;
    tracing::info!(?status, "driver process ended");
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{DriverCommand, DriverEvent, DriverHandle};
    use crate::testutil::WAIT;

    /// A tiny driver in shell: says ready, then echoes each line it gets to
    /// a file, and exits after the first `move` (to exercise the restart).
    fn script(log: &std::path::Path) -> String {
        format!(
            r#"echo '{{"jsonrpc":"2.0","method":"ready"}}'; while read -r line; do echo "$line" >> {log}; case "$line" in *'"move"'*) exit 3;; esac; done"#,
            log = log.display()
        )
    }

    async fn wait_for_lines(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<_> = text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            if lines.len() >= n {
                return lines;
            }
            assert!(tokio::time::Instant::now() < deadline, "driver log: {text}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn child_is_started_fed_and_restarted_after_a_crash() {
        let dir = crate::testutil::temp_dir("exec");
        let log = dir.join("driver.log");
        let (mut handle, end) = DriverHandle::channel();
        let options = DriverOptions {
            restart_initial: Duration::from_millis(50),
            restart_max: Duration::from_millis(200),
            ..DriverOptions::default()
        };
        tokio::spawn(run(script(&log), end, options));

        let ready = tokio::time::timeout(WAIT, handle.events.recv())
            .await
            .expect("ready");
        assert_eq!(ready, Some(DriverEvent::Ready));
        handle
            .commands
            .send(DriverCommand::Move {
                linear: 0.1,
                angular: 0.0,
            })
            .await
            .expect("send");
        // The child exits on the move: unavailable, then ready again.
        let down = tokio::time::timeout(WAIT, handle.events.recv())
            .await
            .expect("down");
        assert!(
            matches!(down, Some(DriverEvent::Unavailable { .. })),
            "{down:?}"
        );
        let again = tokio::time::timeout(WAIT, handle.events.recv())
            .await
            .expect("up");
        assert_eq!(again, Some(DriverEvent::Ready));

        let lines = wait_for_lines(&log, 3).await;
        assert_eq!(lines[0]["method"], "stop");
        assert_eq!(lines[1]["method"], "move");
        assert_eq!(lines[1]["params"]["linear"], 0.1);
        // The restarted child is first told to stop.
        assert_eq!(lines[2]["method"], "stop");
        assert_eq!(lines[2]["params"]["reason"], "driver_restarted");
    }
}

//! `--driver serial:DEVICE[@BAUD]`: the JSON-RPC line protocol of `exec:`
//! over a serial port (a microcontroller driving the motors, say).
//!
//! Serial I/O is blocking, so two threads move bytes between the port and
//! the async protocol code. A vanished port (USB unplugged) is reopened with
//! backoff while the controller holds the robot stopped.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::lines::{self, ConnectionEnd, LINE_CHANNEL, MAX_LINE};
use super::{DriverEnd, DriverError, DriverOptions, RestartBackoff};
use crate::safety::StopReason;

/// Read timeout of the port, i.e. how quickly the reader thread notices it
/// should stop.
const READ_TIMEOUT: Duration = Duration::from_millis(100);

pub async fn run(device: String, baud: u32, mut end: DriverEnd, options: DriverOptions) {
    let mut backoff = RestartBackoff::new(options.restart_initial, options.restart_max);
    let mut first = true;
    loop {
        let outcome = match serialport::new(&device, baud).timeout(READ_TIMEOUT).open() {
            Ok(port) => {
                tracing::info!(%device, baud, "serial port open");
                let outcome = serve_port(port, &mut end, first).await;
                first = false;
                outcome
            }
            Err(e) => Err(DriverError::Serial(e)),
        };
        let reason = match outcome {
            Ok(ConnectionEnd::ControllerGone) => return,
            Ok(ConnectionEnd::Lost) => {
                backoff.reset();
                "serial port closed".to_owned()
            }
            Err(e) => e.to_string(),
        };
        tracing::warn!(%device, %reason, "serial driver down; reopening");
        if !lines::wait_out(&mut end, reason, backoff.next_delay()).await {
            return;
        }
    }
}

async fn serve_port(
    port: Box<dyn serialport::SerialPort>,
    end: &mut DriverEnd,
    first: bool,
) -> Result<ConnectionEnd, DriverError> {
    let mut reader_port = port.try_clone()?;
    let mut writer_port = port;
    let stop = Arc::new(AtomicBool::new(false));
    let (in_tx, mut lines_in) = mpsc::channel(LINE_CHANNEL);
    let (lines_out, mut out_rx) = mpsc::channel::<String>(LINE_CHANNEL);

    let reader_stop = stop.clone();
    let reader = std::thread::Builder::new()
        .name("serial-read".into())
        .spawn(move || {
            let mut splitter = LineSplitter::default();
            let mut buf = [0u8; 1024];
            while !reader_stop.load(Ordering::Relaxed) {
                match reader_port.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        for line in splitter.push(&buf[..n]) {
                            if in_tx.blocking_send(line).is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        })?;
    let writer = std::thread::Builder::new()
        .name("serial-write".into())
        .spawn(move || {
            while let Some(line) = out_rx.blocking_recv() {
                if writer_port.write_all(line.as_bytes()).is_err()
                    || writer_port.write_all(b"\n").is_err()
                    || writer_port.flush().is_err()
                {
                    break;
                }
            }
        })?;

    let reason = if first {
        StopReason::DriverStarted
    } else {
        StopReason::DriverRestarted
    };
    let outcome = lines::serve(&mut lines_in, &lines_out, end, reason).await;
    // Closing the channels ends the writer; the flag ends the reader within
    // one read timeout. Neither is joined on the async runtime.
    stop.store(true, Ordering::Relaxed);
    drop(lines_out);
    drop(lines_in);
    tokio::task::spawn_blocking(move || {
        let _ = reader.join();
        let _ = writer.join();
    });
    Ok(outcome)
}

/// Splits a byte stream into trimmed, non-empty lines, dropping any line
/// longer than [`MAX_LINE`].
#[derive(Default)]
struct LineSplitter {
    buf: Vec<u8>,
    overlong: bool,
}

impl LineSplitter {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' {
                if !self.overlong {
                    let line = String::from_utf8_lossy(&self.buf).trim().to_owned();
                    if !line.is_empty() {
                        out.push(line);
                    }
                } else {
                    tracing::warn!("serial line longer than {MAX_LINE} bytes; dropped");
                }
                self.buf.clear();
                self.overlong = false;
            } else if !self.overlong {
                if self.buf.len() >= MAX_LINE {
                    self.overlong = true;
                    self.buf.clear();
                } else {
                    self.buf.push(b);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{DriverCommand, DriverEvent, DriverHandle};
    use crate::testutil::WAIT;
    use serialport::SerialPort;

    #[test]
    fn splitter_handles_fragments_and_overlong_lines() {
        let mut s = LineSplitter::default();
        assert!(s.push(b"{\"a\"").is_empty());
        assert_eq!(
            s.push(b":1}\r\n\n{\"b\":2}\n"),
            vec!["{\"a\":1}", "{\"b\":2}"]
        );
        let long = vec![b'x'; MAX_LINE + 5];
        assert!(s.push(&long).is_empty());
        assert_eq!(s.push(b"\nok\n"), vec!["ok"]);
    }

    /// Reads from the pty master until a full JSON line arrives or `limit`
    /// passes.
    fn try_read_json_line(
        master: &mut serialport::TTYPort,
        limit: Duration,
    ) -> Option<serde_json::Value> {
        let deadline = std::time::Instant::now() + limit;
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            if std::time::Instant::now() >= deadline {
                return None;
            }
            match master.read(&mut byte) {
                Ok(1) if byte[0] == b'\n' => break,
                Ok(1) => line.push(byte[0]),
                _ => continue,
            }
        }
        Some(serde_json::from_slice(&line).expect("JSON line"))
    }

    fn read_json_line(master: &mut serialport::TTYPort) -> serde_json::Value {
        try_read_json_line(master, WAIT).expect("a line from the agent in time")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn speaks_the_line_protocol_over_a_pty() {
        let (mut master, slave) = serialport::TTYPort::pair().expect("pty pair");
        let path = slave.name().expect("pty name");
        drop(slave);
        master
            .set_timeout(Duration::from_millis(50))
            .expect("timeout");

        let (mut handle, end) = DriverHandle::channel();
        tokio::spawn(run(path, 115_200, end, DriverOptions::default()));

        let master = tokio::task::spawn_blocking(move || {
            // Opening the port flushes it, so "ready" written before the
            // agent opened it is lost: repeat it until the agent's stop
            // (its answer to ready) shows up. Bounded by WAIT.
            let deadline = std::time::Instant::now() + WAIT;
            let stop = loop {
                assert!(
                    std::time::Instant::now() < deadline,
                    "agent never answered ready"
                );
                // With no side of the pty open yet (the agent opens it by path), a write
                // can fail with EIO: that is "not yet", like a lost line.
                let _ = master.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"ready\"}\n");
                if let Some(line) = try_read_json_line(&mut master, Duration::from_millis(300)) {
                    break line;
                }
            };
            assert_eq!(stop["method"], "stop");
            assert_eq!(stop["params"]["reason"], "driver_started");
            master
        })
        .await
        .expect("pty side");
        let ready = tokio::time::timeout(WAIT, handle.events.recv())
            .await
            .expect("ready");
        assert_eq!(ready, Some(DriverEvent::Ready));
        handle
            .commands
            .send(DriverCommand::Move {
                linear: 0.3,
                angular: 0.1,
            })
            .await
            .expect("send");
        let mv = tokio::task::spawn_blocking(move || {
            let mut master = master;
            read_json_line(&mut master)
        })
        .await
        .expect("pty side");
        assert_eq!(mv["method"], "move");
        assert_eq!(mv["params"]["linear"], 0.3);
        assert_eq!(mv["params"]["angular"], 0.1);
    }
}

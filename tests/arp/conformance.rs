//! The ARP conformance runner against the robot agent's own ARP server
//! (in process, sim driver, local WebSocket on 127.0.0.1:0), and the
//! Python example client against the same.

#[path = "runner.rs"]
mod runner;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use robot_agent::arp::ws::ArpListener;
use robot_agent::arp::{ArpOptions, ArpServer, ListenConfig, Token};
use robot_agent::driver::sim::{self, SimConfig, SimProbe};
use robot_agent::driver::DriverHandle;
use robot_agent::locations::LocationStore;
use robot_agent::safety::SafetyLimits;
use robot_agent::session::{Metrics, Shared};
use robot_agent::settings::Settings;

const OPERATOR: &str = "conformance-operator";
const VIEWER: &str = "conformance-viewer";

struct Agent {
    url: String,
    probe: SimProbe,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn agent() -> Agent {
    let (handle, end) = DriverHandle::channel();
    let pose = handle.pose.clone();
    let probe = sim::spawn(end, SimConfig::default());
    let limits = SafetyLimits::default();
    let controller = robot_agent::controller::spawn(limits.clone(), handle);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !controller.status().await.expect("status").driver_ready {
        assert!(tokio::time::Instant::now() < deadline, "sim never ready");
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
    let tokens: Vec<Token> = [format!("operator:{OPERATOR}"), format!("viewer:{VIEWER}")]
        .iter()
        .map(|t| t.parse().expect("token"))
        .collect();
    let listener = ArpListener::bind(&ListenConfig::new("127.0.0.1:0", tokens).expect("listen"))
        .await
        .expect("bind");
    let url = format!("ws://{}/", listener.local_addr().expect("addr"));
    let task = tokio::spawn(listener.run(server));
    Agent { url, probe, task }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_robot_agent_passes_the_arp_conformance_run() {
    let agent = agent().await;
    let report = runner::run(&runner::Options {
        url: agent.url.clone(),
        operator_token: Some(OPERATOR.into()),
        viewer_token: Some(VIEWER.into()),
        motion: true,
        estop: true,
    })
    .await;
    for check in &report.checks {
        println!(
            "{:5} {}",
            if check.outcome.is_ok() { "ok" } else { "FAIL" },
            check.name
        );
    }
    let failures = report.failures();
    assert!(failures.is_empty(), "failed checks: {failures:#?}");
    assert!(report.checks.len() >= 14, "{} checks", report.checks.len());
    assert!(report.frames > 50, "{} frames validated", report.frames);
    assert!(
        agent.probe.state().x > 0.0,
        "the motion checks moved the sim"
    );
}

/// `examples/arp_square.py` (Python, `websockets` only) against the agent.
/// Skipped, saying so, where python3 or its `websockets` package is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_drives_a_square_and_e_stops() {
    let check = tokio::process::Command::new("python3")
        .args(["-c", "import websockets"])
        .output()
        .await;
    if !check.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: python3 with the websockets package is not installed");
        return;
    }
    let agent = agent().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/arp_square.py");
    let run = tokio::process::Command::new("python3")
        .arg(script)
        .arg(&agent.url)
        .args(["--token", OPERATOR, "--side", "0.3", "--speed", "0.3"])
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the example finishes in time")
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "example failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("emergency stop latched"), "{stdout}");
    let s = agent.probe.state();
    // Four sides and four quarter turns: back near the start.
    assert!(
        s.x.abs() < 0.15 && s.y.abs() < 0.15,
        "ended at {s:?}\n{stdout}"
    );
    assert_eq!(s.last_stop.as_deref(), Some("emergency_stop"));
}
